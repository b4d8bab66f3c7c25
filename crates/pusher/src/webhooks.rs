//! Pusher-compatible webhooks: each app's `webhooks = [{ url, event_types,
//! headers, filter }]` receive `POST {"time_ms", "events": [...]}` signed
//! as Pusher signs them (`X-Pusher-Key`, and `X-Pusher-Signature`: the hex
//! HMAC-SHA256 of the body with the app secret), so the `pusher` SDKs'
//! webhook validation accepts them.
//!
//! The events come from the core's observers (occupied, vacated, members,
//! cache misses, counts) and from this adapter (client events). Per app:
//!
//! - events are batched: a batch goes out `webhook_batch_ms` after its
//!   first event, or at once when it holds `webhook_batch_size`;
//! - `channel_vacated` and `member_removed` wait `webhook_leave_delay_ms`
//!   and are dropped, together with the `channel_occupied` or
//!   `member_added` that cancels them, when the channel or member comes
//!   back meanwhile (a page reload is no leave);
//! - a request answered 5xx, 408 or 429, timed out or not connected is
//!   retried with exponential backoff and jitter for `webhook_retry_for`
//!   seconds; other answers are final;
//! - at most `webhook_queue` events, of at most `webhook_queue_bytes` in
//!   all, wait (batched, delayed or being sent); beyond that events are
//!   dropped, counted, and logged once per episode;
//! - on graceful shutdown what waits is sent at once (delayed leaves too)
//!   and the server waits for it within the grace period.

use crate::config::{redact_url, PusherConfig, WebhookConfig, WebhookFilter, WebhookSettings};
use crate::metrics;
use herald_core::config::AppConfig;
use herald_core::namespace::Namespace;
use herald_core::node::Node;
use herald_core::observer::{Change, Observer};
use parking_lot::Mutex;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;

/// Longest backoff between two tries of one request.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The delivery settings (from the server's `webhook_*` keys).
#[derive(Debug, Clone)]
pub struct Settings {
    pub batch: Duration,
    pub batch_size: usize,
    pub leave_delay: Duration,
    pub timeout: Duration,
    pub retry: Duration,
    pub retry_for: Duration,
    pub queue: usize,
    pub queue_bytes: usize,
}

impl Settings {
    pub fn from_config(c: &WebhookSettings) -> Settings {
        Settings {
            batch: Duration::from_millis(c.webhook_batch_ms),
            batch_size: c.webhook_batch_size,
            leave_delay: Duration::from_millis(c.webhook_leave_delay_ms),
            timeout: Duration::from_millis(c.webhook_timeout_ms),
            retry: Duration::from_millis(c.webhook_retry_ms),
            retry_for: Duration::from_secs(c.webhook_retry_for),
            queue: c.webhook_queue,
            queue_bytes: c.webhook_queue_bytes,
        }
    }
}

/// Start sending webhooks for every app that has some: registers an
/// observer on `node` and one worker task per such app. `None` when no app
/// has webhooks.
pub fn start(node: &Arc<Node>, config: &PusherConfig) -> Option<Arc<Webhooks>> {
    let settings = Arc::new(Settings::from_config(&config.webhook));
    let client = reqwest::Client::builder()
        .timeout(settings.timeout)
        .redirect(reqwest::redirect::Policy::none())
        // `X-Pusher-Key` / `X-Pusher-Signature` as Pusher's docs write
        // them: PHP's `getallheaders()` keeps names as sent, and the PHP
        // SDK's webhook check looks them up with exactly that case.
        .http1_title_case_headers()
        .user_agent(concat!("herald/", env!("CARGO_PKG_VERSION")))
        .build();
    let client = match client {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the webhook HTTP client; webhooks are off");
            return None;
        }
    };
    let apps: HashMap<String, Arc<AppHooks>> = node
        .config
        .apps
        .iter()
        .zip(&config.apps)
        .filter(|(_, p)| !p.webhooks.is_empty())
        .map(|(a, p)| {
            let mut hooks = AppHooks::new(a, &p.webhooks, settings.clone(), client.clone());
            hooks.hub = node.hub_by_id(&a.id);
            let hooks = Arc::new(hooks);
            tokio::spawn(hooks.clone().run());
            (a.id.clone(), hooks)
        })
        .collect();
    if apps.is_empty() {
        return None;
    }
    let webhooks = Arc::new(Webhooks { apps });
    node.observe(webhooks.clone());
    Some(webhooks)
}

pub struct Webhooks {
    apps: HashMap<String, Arc<AppHooks>>,
}

impl Observer for Webhooks {
    fn changed(&self, app_id: &str, ns: Namespace, change: &Change<'_>) {
        // Pusher webhooks are about Pusher channels only: the app's other
        // protocols' channels live in other namespaces.
        if ns != crate::names::NAMESPACE {
            return;
        }
        if let Some(app) = self.apps.get(app_id) {
            app.changed(change);
        }
    }

    fn flush(&self, deadline: std::time::Instant) -> herald_core::future::BoxFuture<()> {
        let apps: Vec<_> = self.apps.values().cloned().collect();
        Box::pin(async move {
            for app in &apps {
                app.start_flush();
            }
            let deadline = tokio::time::Instant::from_std(deadline);
            for app in &apps {
                let _ = tokio::time::timeout_at(deadline, app.drained()).await;
                let left = app.depth();
                if left > 0 {
                    tracing::warn!(
                        app_id = %app.app_id,
                        events = left,
                        "shutdown grace over: webhook events not delivered"
                    );
                }
            }
        })
    }
}

/// One endpoint of an app.
struct Endpoint {
    url: reqwest::Url,
    /// The URL as logs show it (no query or credentials).
    shown: String,
    types: Vec<String>,
    headers: HeaderMap,
    filter: WebhookFilter,
}

impl Endpoint {
    fn wants(&self, e: &Pending) -> bool {
        self.types.iter().any(|t| t == e.name) && self.filter.matches(&e.channel)
    }
}

/// An event waiting to be sent.
struct Pending {
    name: &'static str,
    channel: String,
    body: Value,
    /// What it holds, about (see [`Pending::new`]).
    bytes: usize,
}

impl Pending {
    /// `extra`: the bytes of the body's strings besides the channel (a
    /// client event's data, event name, socket and user id).
    fn new(name: &'static str, channel: &str, body: Value, extra: usize) -> Pending {
        Pending {
            name,
            channel: channel.to_owned(),
            body,
            // The channel twice (field and body), the strings, and the
            // map and allocations around them.
            bytes: 2 * channel.len() + extra + 256,
        }
    }
}

/// A delayed leave: (channel, user id for `member_removed`).
type LeaveKey = (String, Option<String>);

#[derive(Default)]
struct State {
    ready: Vec<Pending>,
    /// When the oldest ready event arrived (the batch window starts).
    since: Option<Instant>,
    delayed: HashMap<LeaveKey, (Instant, Pending)>,
    /// Bytes of `ready` and `delayed`.
    bytes: usize,
    /// Dropping events (logged once until the queue drains to half).
    dropping: bool,
    /// Shutting down: send everything now.
    flushing: bool,
}

struct AppHooks {
    app_id: String,
    /// The key and secret at start; the app's live ones (its hub) win, so
    /// a rotated secret signs webhooks from then on.
    key: String,
    secret: String,
    hub: Option<Arc<herald_core::hub::Hub>>,
    endpoints: Vec<Endpoint>,
    settings: Arc<Settings>,
    client: reqwest::Client,
    state: Mutex<State>,
    /// Events handed to deliveries that are not finished, and their bytes.
    in_flight: AtomicUsize,
    in_flight_bytes: AtomicUsize,
    /// The worker's wake-up (new events, flush).
    wake: Notify,
    /// Signalled when the queue may have become empty.
    progress: Notify,
}

impl AppHooks {
    fn new(
        app: &AppConfig,
        webhooks: &[WebhookConfig],
        settings: Arc<Settings>,
        client: reqwest::Client,
    ) -> AppHooks {
        let endpoints = webhooks
            .iter()
            .filter_map(|w| {
                // The config was validated: URL and headers are sendable.
                let url = reqwest::Url::parse(&w.url).ok()?;
                let mut headers = HeaderMap::new();
                for (k, v) in &w.headers {
                    if let (Ok(k), Ok(v)) = (
                        HeaderName::from_bytes(k.as_bytes()),
                        HeaderValue::from_str(v),
                    ) {
                        headers.insert(k, v);
                    }
                }
                Some(Endpoint {
                    shown: redact_url(&w.url),
                    url,
                    types: w.event_types.clone(),
                    headers,
                    filter: w.filter.clone(),
                })
            })
            .collect();
        AppHooks {
            app_id: app.id.clone(),
            key: app.key.clone(),
            secret: app.secret.clone(),
            hub: None,
            endpoints,
            settings,
            client,
            state: Mutex::new(State::default()),
            in_flight: AtomicUsize::new(0),
            in_flight_bytes: AtomicUsize::new(0),
            wake: Notify::new(),
            progress: Notify::new(),
        }
    }

    fn wanted(&self, name: &str) -> bool {
        self.endpoints
            .iter()
            .any(|e| e.types.iter().any(|t| t == name))
    }

    /// Events waiting: batched, delayed, or being sent.
    fn depth(&self) -> usize {
        let s = self.state.lock();
        s.ready.len() + s.delayed.len() + self.in_flight.load(Ordering::Acquire)
    }

    /// Bytes waiting: batched, delayed, or being sent.
    fn bytes(&self, s: &State) -> usize {
        s.bytes + self.in_flight_bytes.load(Ordering::Acquire)
    }

    fn report_depth(&self, s: &State) {
        let depth = s.ready.len() + s.delayed.len() + self.in_flight.load(Ordering::Acquire);
        metrics::webhook_queue(&self.app_id, depth, self.bytes(s));
    }

    /// Room for one more event of `bytes`? Counts and logs a drop otherwise.
    fn admit(&self, s: &mut State, bytes: usize) -> bool {
        let depth = s.ready.len() + s.delayed.len() + self.in_flight.load(Ordering::Acquire);
        let held = self.bytes(s);
        let (limit, limit_bytes) = (self.settings.queue, self.settings.queue_bytes);
        if depth < limit && held + bytes <= limit_bytes {
            if s.dropping && depth <= limit / 2 && held <= limit_bytes / 2 {
                s.dropping = false;
            }
            return true;
        }
        metrics::webhook_dropped(&self.app_id, 1);
        if !s.dropping {
            s.dropping = true;
            tracing::warn!(
                app_id = %self.app_id,
                limit,
                limit_bytes,
                "webhook queue full: dropping events until it drains (see webhook_queue, \
                 webhook_queue_bytes, herald_webhook_events_dropped_total)"
            );
        }
        false
    }

    fn changed(&self, change: &Change<'_>) {
        let event =
            |name: &'static str, channel: &str, body: Value| Pending::new(name, channel, body, 0);
        match *change {
            Change::Occupied { channel } => {
                self.arrive(&(channel.to_owned(), None), || {
                    event(
                        "channel_occupied",
                        channel,
                        json!({ "name": "channel_occupied", "channel": channel }),
                    )
                });
            }
            Change::Vacated { channel } => self.leave(
                (channel.to_owned(), None),
                event(
                    "channel_vacated",
                    channel,
                    json!({ "name": "channel_vacated", "channel": channel }),
                ),
            ),
            Change::MemberAdded { channel, user_id } => {
                self.arrive(&(channel.to_owned(), Some(user_id.to_owned())), || {
                    Pending::new(
                        "member_added",
                        channel,
                        json!({ "name": "member_added", "channel": channel, "user_id": user_id }),
                        user_id.len(),
                    )
                });
            }
            Change::MemberRemoved { channel, user_id } => self.leave(
                (channel.to_owned(), Some(user_id.to_owned())),
                Pending::new(
                    "member_removed",
                    channel,
                    json!({ "name": "member_removed", "channel": channel, "user_id": user_id }),
                    user_id.len(),
                ),
            ),
            Change::CacheMiss { channel } => self.push(event(
                "cache_miss",
                channel,
                json!({ "name": "cache_miss", "channel": channel }),
            )),
            Change::SubscriptionCount { channel, count } => self.push(event(
                "subscription_count",
                channel,
                json!({ "name": "subscription_count", "channel": channel,
                        "subscription_count": count }),
            )),
            Change::ClientEvent(p) => {
                // Pusher sends `data` as a string: the client's string as
                // is, anything else as its JSON text.
                let data = match serde_json::from_str::<Value>(p.data.get()) {
                    Ok(Value::String(s)) => s,
                    _ => p.data.get().to_owned(),
                };
                let mut body = json!({
                    "name": "client_event",
                    "channel": p.channel,
                    "event": p.event,
                    "data": data,
                    "socket_id": p.exclude,
                });
                if crate::names::ChannelKind::of(&p.channel).presence {
                    body["user_id"] = json!(p.user_id);
                }
                let extra = p.data.get().len()
                    + p.event.len()
                    + p.exclude.as_ref().map_or(0, String::len)
                    + p.user_id.as_ref().map_or(0, String::len);
                self.push(Pending::new("client_event", &p.channel, body, extra));
            }
            Change::Published(_) => {}
        }
    }

    /// A channel or member arrived: cancel its pending leave (and send
    /// nothing: the receiver never saw it leave), or send the arrival.
    fn arrive(&self, key: &LeaveKey, event: impl FnOnce() -> Pending) {
        let mut s = self.state.lock();
        if let Some((_, cancelled)) = s.delayed.remove(key) {
            s.bytes -= cancelled.bytes;
            self.report_depth(&s);
            return;
        }
        drop(s);
        self.push(event());
    }

    /// A channel or member left: send it after the leave delay, unless it
    /// comes back meanwhile.
    fn leave(&self, key: LeaveKey, event: Pending) {
        if self.settings.leave_delay.is_zero() {
            return self.push(event);
        }
        // Kept even when no endpoint wants the leave itself: it still
        // cancels the arrival that follows a reload.
        let mut s = self.state.lock();
        if !self.admit(&mut s, event.bytes) {
            return;
        }
        let due = Instant::now() + self.settings.leave_delay;
        s.bytes += event.bytes;
        if let Some((_, replaced)) = s.delayed.insert(key, (due, event)) {
            s.bytes -= replaced.bytes;
        }
        self.report_depth(&s);
        drop(s);
        self.wake.notify_one();
    }

    fn push(&self, event: Pending) {
        if !self.wanted(event.name) {
            return;
        }
        let mut s = self.state.lock();
        if !self.admit(&mut s, event.bytes) {
            return;
        }
        s.bytes += event.bytes;
        s.ready.push(event);
        s.since.get_or_insert_with(Instant::now);
        self.report_depth(&s);
        drop(s);
        // The worker recomputes its deadline (or sends a full batch).
        self.wake.notify_one();
    }

    fn start_flush(&self) {
        self.state.lock().flushing = true;
        self.wake.notify_one();
    }

    /// Resolves when nothing waits any more.
    async fn drained(&self) {
        loop {
            let notified = self.progress.notified();
            if self.depth() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// The worker: moves due leaves to the batch, sends batches when their
    /// window is over or they are full.
    async fn run(self: Arc<Self>) {
        loop {
            let (batch, next) = {
                let mut s = self.state.lock();
                let now = Instant::now();
                let flushing = s.flushing;
                let due: Vec<LeaveKey> = s
                    .delayed
                    .iter()
                    .filter(|(_, (at, _))| flushing || *at <= now)
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in due {
                    if let Some((_, e)) = s.delayed.remove(&k) {
                        if self.wanted(e.name) {
                            s.ready.push(e);
                            s.since.get_or_insert(now);
                        } else {
                            s.bytes -= e.bytes;
                        }
                    }
                }
                let window_over = s.since.is_some_and(|t| now >= t + self.settings.batch);
                let batch = if !s.ready.is_empty()
                    && (flushing || window_over || s.ready.len() >= self.settings.batch_size)
                {
                    let n = s.ready.len().min(self.settings.batch_size);
                    let batch: Vec<Pending> = s.ready.drain(..n).collect();
                    s.since = (!s.ready.is_empty()).then_some(now);
                    let bytes: usize = batch.iter().map(|e| e.bytes).sum();
                    s.bytes -= bytes;
                    self.in_flight.fetch_add(batch.len(), Ordering::AcqRel);
                    self.in_flight_bytes.fetch_add(bytes, Ordering::AcqRel);
                    batch
                } else {
                    Vec::new()
                };
                let next = [
                    s.since.map(|t| t + self.settings.batch),
                    s.delayed.values().map(|(at, _)| *at).min(),
                ]
                .into_iter()
                .flatten()
                .min();
                self.report_depth(&s);
                (batch, next)
            };
            if !batch.is_empty() {
                self.send_batch(batch);
                continue;
            }
            self.progress.notify_waiters();
            match next {
                Some(at) => {
                    let _ = tokio::time::timeout_at(at.into(), self.wake.notified()).await;
                }
                None => self.wake.notified().await,
            }
        }
    }

    /// Send one batch to every endpoint that wants some of it, each on its
    /// own task (retries must not hold up the next batches).
    fn send_batch(self: &Arc<Self>, batch: Vec<Pending>) {
        let n = batch.len();
        let done = Arc::new(BatchDone {
            hooks: self.clone(),
            n,
            bytes: batch.iter().map(|e| e.bytes).sum(),
        });
        let time_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            let events: Vec<&Value> = batch
                .iter()
                .filter(|e| endpoint.wants(e))
                .map(|e| &e.body)
                .collect();
            if events.is_empty() {
                continue;
            }
            let body = json!({ "time_ms": time_ms, "events": events }).to_string();
            let hooks = self.clone();
            let done = done.clone();
            tokio::spawn(async move {
                hooks.deliver(i, body, n).await;
                drop(done);
            });
        }
    }

    /// POST `body` to endpoint `i`, retrying as the module doc says.
    async fn deliver(&self, i: usize, body: String, events: usize) {
        let endpoint = &self.endpoints[i];
        let (key, secret) = match &self.hub {
            Some(hub) => {
                let live = hub.config();
                (live.key.clone(), live.secret.clone())
            }
            None => (self.key.clone(), self.secret.clone()),
        };
        let signature = herald_signing::sign(&secret, &body);
        let mut headers = endpoint.headers.clone();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Ok(v) = HeaderValue::from_str(&key) {
            headers.insert("x-pusher-key", v);
        }
        if let Ok(v) = HeaderValue::from_str(&signature) {
            headers.insert("x-pusher-signature", v);
        }
        let first = Instant::now();
        let mut backoff = self.settings.retry;
        loop {
            let result = self
                .client
                .post(endpoint.url.clone())
                .headers(headers.clone())
                .body(body.clone())
                .send()
                .await;
            let (retryable, what) = match &result {
                Ok(r) if r.status().is_success() => {
                    metrics::webhook_sent(&self.app_id, true, false);
                    return;
                }
                Ok(r) => {
                    let s = r.status().as_u16();
                    (
                        s >= 500 || s == 408 || s == 429,
                        format!("answered {}", r.status()),
                    )
                }
                Err(e) if e.is_timeout() => (true, "timed out".to_owned()),
                Err(e) => (true, format!("failed: {}", causes(e))),
            };
            let flushing = self.state.lock().flushing;
            let jittered = jitter(backoff);
            let give_up = !retryable || first.elapsed() + jittered > self.settings.retry_for;
            metrics::webhook_sent(&self.app_id, false, !give_up);
            if give_up {
                tracing::warn!(
                    app_id = %self.app_id,
                    url = %endpoint.shown,
                    events,
                    "webhook delivery {what}; giving up"
                );
                return;
            }
            tracing::debug!(
                app_id = %self.app_id,
                url = %endpoint.shown,
                retry_in_ms = jittered.as_millis() as u64,
                "webhook delivery {what}; will retry"
            );
            // While shutting down the grace period bounds the wait, not
            // the backoff: retry sooner.
            let wait = if flushing {
                jittered.min(Duration::from_millis(200))
            } else {
                jittered
            };
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

/// Releases a batch's events from the queue count when its last
/// delivery ends.
struct BatchDone {
    hooks: Arc<AppHooks>,
    n: usize,
    bytes: usize,
}

impl Drop for BatchDone {
    fn drop(&mut self) {
        self.hooks.in_flight.fetch_sub(self.n, Ordering::AcqRel);
        self.hooks
            .in_flight_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
        let s = self.hooks.state.lock();
        self.hooks.report_depth(&s);
        drop(s);
        self.hooks.progress.notify_waiters();
        // The worker may be waiting for room.
        self.hooks.wake.notify_one();
    }
}

/// Between half and all of `d` ("equal jitter"): retries of many nodes and
/// apps spread out instead of arriving together.
fn jitter(d: Duration) -> Duration {
    let half = d / 2;
    half + half.mul_f64(rand::random::<f64>())
}

/// An error's causes on one line. Not the error's own message: reqwest's
/// names the whole URL, whose query may hold credentials.
fn causes(e: &reqwest::Error) -> String {
    let mut parts = Vec::new();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        parts.push(c.to_string());
        cause = c.source();
    }
    if parts.is_empty() {
        parts.push(
            if e.is_connect() {
                "cannot connect"
            } else {
                "request error"
            }
            .into(),
        );
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn other_protocols_channels_send_nothing() {
        let app = AppConfig::development();
        let webhooks = [WebhookConfig {
            url: "http://127.0.0.1:9/hooks".into(),
            event_types: vec!["channel_occupied".into()],
            headers: Default::default(),
            filter: Default::default(),
        }];
        let settings = Arc::new(Settings::from_config(&WebhookSettings::default()));
        let hooks = Arc::new(AppHooks::new(
            &app,
            &webhooks,
            settings,
            reqwest::Client::new(),
        ));
        let webhooks = Webhooks {
            apps: HashMap::from([(app.id.clone(), hooks.clone())]),
        };
        // The same name in the other protocols' namespaces: not Pusher's.
        for ns in ["actioncable", "appsync-events", "appsync-graphql"] {
            let ns = Namespace::intern(ns).unwrap();
            webhooks.changed(&app.id, ns, &Change::Occupied { channel: "room" });
        }
        assert_eq!(hooks.depth(), 0);
        let occupied = Change::Occupied { channel: "room" };
        webhooks.changed(&app.id, crate::names::NAMESPACE, &occupied);
        assert_eq!(hooks.depth(), 1);
    }

    #[test]
    fn jitter_stays_within_half_and_whole() {
        for _ in 0..100 {
            let j = jitter(Duration::from_millis(1000));
            assert!(j >= Duration::from_millis(500) && j <= Duration::from_millis(1000));
        }
    }
}
