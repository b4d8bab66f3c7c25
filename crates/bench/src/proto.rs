//! Which protocol the bench's clients speak, behind one client: [`Proto`]
//! is the `--protocol` of every scenario that has one (`broadcast` and
//! `connect`: Pusher or Action Cable; `fanout`: Pusher or the AppSync
//! APIs; `slow`, `soak`: those four; `storm`: also `actioncable-ext`,
//! Action Cable's extended protocol). It opens a connection,
//! subscribes it to bench channels by name, receives and scans frames;
//! [`Publisher`] publishes to a bench channel over the protocol's HTTP
//! endpoint; [`Reconnect`] is the protocol's reference client coming back
//! after its socket dropped. A scenario refuses a protocol it does not
//! speak ([`Proto::check`]).
//!
//! A bench channel `name` is, per protocol:
//! - **Pusher**: the channel `name` (`private-` and `presence-` ones
//!   signed with the app secret); publishes through the HTTP API
//!   (`POST /apps/{id}/events`).
//! - **Action Cable**: a subscription to `herald bench rpc-server`'s
//!   `BenchmarkChannel` with `{"id": name}` in its identifier, which
//!   streams `all<name>`; publishes through the AnyCable HTTP broadcast
//!   API, `POST /_broadcast` `{"stream":"all<name>","data":..}` (on
//!   Herald's own port; AnyCable 1.6 on port 8090 when it has neither a
//!   broadcast key nor a secret, else on its main port, wanting
//!   `Authorization: Bearer <broadcast key>`, its `--broadcast_key` or
//!   the key it derives from `--secret`). `broadcast` and `connect` use
//!   one channel instead, `BenchmarkChannel` itself, whose stream `all`
//!   its `broadcast` action broadcasts to ([`Proto::subscribe_one`]).
//!   `actioncable-ext` is the same over `actioncable-v1-ext-json`
//!   ([`super::actioncable_ext`]).
//! - **AppSync GraphQL / Events**: a subscription whose id is `name`
//!   (see [`super::appsync`]); publishes through `POST /graphql` (the
//!   `publish` mutation) or `POST /event`.
//!
//! Only Pusher has private and presence channels and an HTTP API to
//! query them; the scenarios skip those parts for the others and say so.

use super::actioncable;
use super::actioncable_ext;
use super::appsync;
use super::client::{self, bench_data, next_text, ClientError, Conn, HttpPublisher, Scan};
use super::ledger::MsgId;
use super::{worst, BenchError, Target};
use std::net::IpAddr;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Utf8Bytes;

/// Which protocol a scenario's clients and publishers speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Proto {
    /// Pusher WebSocket clients at /app/{key}, Pusher HTTP API publishes.
    #[default]
    Pusher,
    /// Action Cable at /cable, subscribed to `herald bench rpc-server`'s
    /// BenchmarkChannel; publishes through the AnyCable HTTP broadcast API.
    ActionCable,
    /// Action Cable over AnyCable's `actioncable-v1-ext-json`: clients
    /// keep their `sid` and stream positions and restore them after a drop.
    ActionCableExt,
    /// AppSync generic pub/sub GraphQL: graphql-ws subscribers on /graphql,
    /// publish mutations on POST /graphql (--key is the API key).
    AppsyncGraphql,
    /// AppSync Events: aws-appsync-event-ws subscribers on /event/realtime,
    /// POST /event publishers (--key is the API key).
    AppsyncEvents,
}

impl Proto {
    /// Every protocol, in the order the command line lists them.
    pub const ALL: [Proto; 5] = [
        Proto::Pusher,
        Proto::ActionCable,
        Proto::ActionCableExt,
        Proto::AppsyncGraphql,
        Proto::AppsyncEvents,
    ];

    /// The protocols of `slow` and `soak` (every one but the extended
    /// Action Cable, whose difference only a reconnect shows).
    pub const WORST_DAY: [Proto; 4] = [
        Proto::Pusher,
        Proto::ActionCable,
        Proto::AppsyncGraphql,
        Proto::AppsyncEvents,
    ];

    /// The protocol's `--protocol` value, also the reports' `protocol`.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Pusher => "pusher",
            Proto::ActionCable => "actioncable",
            Proto::ActionCableExt => "actioncable-ext",
            Proto::AppsyncGraphql => "appsync-graphql",
            Proto::AppsyncEvents => "appsync-events",
        }
    }

    /// The protocol whose [`Proto::name`] is `name`.
    pub fn from_name(name: &str) -> Option<Proto> {
        Proto::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Refuse a protocol `scenario` does not speak: unless `self` is one
    /// of `speaks`, an error naming the scenario and the protocols it
    /// does speak.
    pub fn check(self, scenario: &str, speaks: &[Proto]) -> Result<(), BenchError> {
        if speaks.contains(&self) {
            return Ok(());
        }
        let names: Vec<&str> = speaks.iter().map(|p| p.name()).collect();
        let list = match names.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => "no protocol".to_string(),
        };
        Err(BenchError(format!(
            "{scenario} speaks --protocol {list}, not {}",
            self.name()
        )))
    }

    /// Action Cable, plain or extended: `/cable` and `BenchmarkChannel`.
    pub fn is_cable(self) -> bool {
        matches!(self, Proto::ActionCable | Proto::ActionCableExt)
    }

    /// Whether the protocol has private and presence channels and an HTTP
    /// API that lists channels and members (Pusher only).
    pub fn has_presence(self) -> bool {
        self == Proto::Pusher
    }

    /// Connect and wait for the server's greeting.
    pub async fn open(
        self,
        target: &Target,
        source: Option<IpAddr>,
        timeout: Duration,
    ) -> Result<Conn, ClientError> {
        match self {
            Proto::Pusher => Conn::open(target, source, timeout).await,
            Proto::ActionCable => actioncable::open(target, source, timeout).await,
            Proto::ActionCableExt => actioncable_ext::open(target, source, "", timeout)
                .await
                .map(|(conn, _)| conn),
            other => appsync::open(target, source, timeout, other).await,
        }
    }

    /// Subscribe to bench `channels` and wait until each is confirmed.
    /// Pusher presence channels join as `user`; the others ignore it.
    pub async fn subscribe(
        self,
        conn: &mut Conn,
        target: &Target,
        channels: &[&str],
        user: &str,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        match self {
            Proto::Pusher => worst::subscribe(conn, target, channels, user, timeout)
                .await
                .map(drop),
            Proto::ActionCable | Proto::ActionCableExt => {
                let ids: Vec<String> = channels
                    .iter()
                    .map(|c| actioncable::identifier_for(c))
                    .collect();
                actioncable::subscribe_identifiers(conn, &ids, timeout).await
            }
            other => {
                for channel in channels {
                    appsync::subscribe(conn, target, channel, timeout, other).await?;
                }
                Ok(())
            }
        }
    }

    /// Subscribe to the one channel of `broadcast`, `connect` or a
    /// `fanout` subscriber and wait until it is confirmed: Pusher
    /// `channel` ([`Conn::subscribe`], a private channel signed); Action
    /// Cable `BenchmarkChannel` itself, whatever `channel` (it has no
    /// channel names of its own: its stream `all` is where its `broadcast`
    /// action goes); AppSync `channel`, as [`Proto::subscribe`] does.
    pub async fn subscribe_one(
        self,
        conn: &mut Conn,
        target: &Target,
        channel: &str,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        match self {
            Proto::Pusher => conn.subscribe(target, &[channel], timeout).await,
            Proto::ActionCable | Proto::ActionCableExt => {
                actioncable::subscribe(conn, timeout).await
            }
            _ => self.subscribe(conn, target, &[channel], "", timeout).await,
        }
    }

    /// The next text frame (Pusher: answering pings on the way; the
    /// others' keep-alives need no answer and are returned like any frame).
    pub async fn recv(self, conn: &mut Conn) -> Result<Utf8Bytes, ClientError> {
        match self {
            Proto::Pusher => conn.recv().await,
            _ => next_text(&mut conn.ws).await,
        }
    }

    /// The fields of a frame. A publish to a bench channel scans as
    /// `event` (Pusher: the event name it was published with, which the
    /// scenarios pass as `event` too) with its channel's name.
    pub fn scan<'a>(self, text: &'a str, event: &'static str) -> Scan<'a> {
        match self {
            Proto::Pusher => client::scan(text),
            Proto::ActionCable | Proto::ActionCableExt => actioncable::scan_stream(text, event),
            _ => appsync::scan(text, event),
        }
    }

    /// Whether a frame (`event` as [`Proto::scan`] read it) is the server
    /// reporting an error: `pusher:error`, an Action Cable `disconnect`,
    /// an AppSync `error`, `subscribe_error` or `connection_error`.
    pub fn is_error(self, text: &str, event: &str) -> bool {
        match self {
            Proto::Pusher => event == "pusher:error",
            Proto::ActionCable | Proto::ActionCableExt => event == actioncable::DISCONNECT_EVENT,
            _ => {
                event.is_empty()
                    && matches!(
                        client::string_field(text, "type"),
                        Some("error" | "subscribe_error" | "connection_error")
                    )
            }
        }
    }

    pub fn explain(self, e: &ClientError, target: &Target) -> String {
        match self {
            Proto::ActionCable | Proto::ActionCableExt => actioncable::explain(e, target),
            _ => e.explain(target),
        }
    }

    /// What the server is expected to do to a subscriber that stopped
    /// reading, in Herald's adapters: Pusher sends `pusher:error` 4100
    /// and closes with 4100; Action Cable sends a `disconnect` with reason
    /// `too_slow` and closes with 1013; AppSync closes with 1008 ("Client
    /// too slow").
    pub fn slow_close_code(self) -> u16 {
        match self {
            Proto::Pusher => 4100,
            Proto::ActionCable | Proto::ActionCableExt => 1013,
            _ => 1008,
        }
    }

    /// Whether a frame is the server telling a slow subscriber it is being
    /// closed for being slow (the frame before the close, where there is
    /// one).
    pub fn is_slow_notice(self, text: &str) -> bool {
        match self {
            Proto::Pusher => client::scan(text).event == "pusher:error" && text.contains("4100"),
            Proto::ActionCable | Proto::ActionCableExt => {
                text.contains(r#""type":"disconnect""#) && text.contains("too_slow")
            }
            _ => false,
        }
    }

    /// Whether an error is the close of a slow subscriber.
    pub fn is_slow_close(self, e: &ClientError) -> bool {
        matches!(e, ClientError::Closed(why)
            if why.contains(&format!("code {}", self.slow_close_code())))
    }

    /// Check, with one client, that the target speaks the protocol with
    /// these credentials; with `publisher`, also that a publish comes back
    /// to a subscriber (for Action Cable: that --broadcast-url reaches this
    /// server), instead of thousands of clients failing or every message
    /// going missing.
    pub async fn preflight(
        self,
        target: &Target,
        publisher: Option<&Publisher>,
    ) -> Result<(), BenchError> {
        if self == Proto::Pusher {
            return super::preflight(target, None, publisher.is_some()).await;
        }
        let fail = |e: &ClientError| BenchError(self.explain(e, target));
        let timeout = Duration::from_secs(10);
        let name = "benchmark-preflight";
        let mut conn = self.open(target, None, timeout).await.map_err(|e| {
            BenchError(match self {
                // Herald without an RPC app, or another server's app.
                Proto::ActionCable | Proto::ActionCableExt => format!(
                    "{} (the server's app must be `herald bench rpc-server`)",
                    self.explain(&e, target)
                ),
                _ => self.explain(&e, target),
            })
        })?;
        self.subscribe(&mut conn, target, &[name], "", timeout)
            .await
            .map_err(|e| fail(&e))?;
        let Some(publisher) = publisher else {
            conn.close().await;
            return Ok(());
        };
        let id = MsgId { sender: 0, seq: 0 };
        publisher
            .publish(name, "preflight", &bench_data(0, id))
            .await
            .map_err(|e| BenchError(publisher.explain(&e, target)))?;
        let wait = async {
            loop {
                let text = self.recv(&mut conn).await?;
                if self.scan(&text, "preflight").id == Some(id) {
                    return Ok::<_, ClientError>(());
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(fail(&e)),
            Err(_) => {
                return Err(BenchError(format!(
                    "a publish to {name} did not reach its subscriber within {timeout:?}{}",
                    match self {
                        Proto::ActionCable | Proto::ActionCableExt => format!(
                            ": does --broadcast-url ({}) reach this server's broadcast endpoint \
                             (Herald: /_broadcast on its port; AnyCable: its \
                             --http_broadcast_port), with --broadcast-key if it has one?",
                            publisher.url()
                        ),
                        _ => String::new(),
                    }
                )))
            }
        }
        conn.close().await;
        Ok(())
    }
}

/// Where Action Cable publishes go: the AnyCable HTTP broadcast API.
#[derive(Debug, Clone, Default)]
pub struct Broadcast {
    /// `None`: `/_broadcast` on the target's port (Herald).
    pub url: Option<String>,
    /// Sent as `Authorization: Bearer <key>`.
    pub key: Option<String>,
}

/// Publishes to bench channels over the protocol's HTTP endpoint.
#[derive(Clone)]
pub enum Publisher {
    Pusher(HttpPublisher),
    ActionCable {
        client: reqwest::Client,
        url: String,
        key: Option<String>,
    },
    Appsync(appsync::Publisher),
}

impl Publisher {
    pub fn new(proto: Proto, target: &Target, broadcast: &Broadcast) -> Publisher {
        match proto {
            Proto::Pusher => Publisher::Pusher(HttpPublisher::new(target)),
            Proto::ActionCable | Proto::ActionCableExt => Publisher::ActionCable {
                client: client::publish_client(),
                url: broadcast
                    .url
                    .clone()
                    .unwrap_or_else(|| format!("{}/_broadcast", target.http_base())),
                key: broadcast.key.clone(),
            },
            other => Publisher::Appsync(appsync::Publisher::new(target, other)),
        }
    }

    /// Where Action Cable publishes go (empty for the others).
    pub fn url(&self) -> &str {
        match self {
            Publisher::ActionCable { url, .. } => url,
            _ => "",
        }
    }

    /// Publish `data` (a JSON object's text) to bench channel `channel`;
    /// `event` is the Pusher event name (the others have none).
    pub async fn publish(&self, channel: &str, event: &str, data: &str) -> Result<(), ClientError> {
        match self {
            Publisher::Pusher(p) => p.publish(channel, event, data, None).await,
            Publisher::Appsync(p) => p.publish(channel, data).await,
            Publisher::ActionCable { client, url, key } => {
                let body = serde_json::json!({
                    "stream": actioncable::stream_of(channel),
                    "data": data,
                })
                .to_string();
                let mut post = client
                    .post(url)
                    .header("content-type", "application/json")
                    .body(body);
                if let Some(k) = key {
                    post = post.bearer_auth(k);
                }
                let resp = post
                    .send()
                    .await
                    .map_err(|e| client::http_error(e, "waiting for the broadcast endpoint"))?;
                let status = resp.status().as_u16();
                if (200..300).contains(&status) {
                    return Ok(());
                }
                let text = resp.text().await.unwrap_or_default();
                Err(ClientError::Http {
                    status: Some(status),
                    message: format!("POST {url}: {}", text.chars().take(200).collect::<String>()),
                })
            }
        }
    }

    pub fn explain(&self, e: &ClientError, target: &Target) -> String {
        match (self, e) {
            (
                Publisher::ActionCable { url, .. },
                ClientError::Connect(m)
                | ClientError::Http {
                    status: None,
                    message: m,
                },
            ) => format!("cannot reach the broadcast endpoint {url} ({m}): check --broadcast-url"),
            (Publisher::ActionCable { url, .. }, ClientError::Timeout(_)) => {
                format!("the broadcast endpoint {url} did not answer: check --broadcast-url")
            }
            (Publisher::ActionCable { .. }, ClientError::Http { status, message }) => format!(
                "the broadcast endpoint refused a publish: {message}{}",
                match status {
                    Some(401) => " (HTTP 401: check --broadcast-key)".to_string(),
                    Some(s) => format!(" (HTTP {s})"),
                    None => String::new(),
                }
            ),
            (Publisher::Appsync(_), ClientError::Http { status, message }) => format!(
                "the publish endpoint refused a publish: {message}{}",
                status.map_or(String::new(), |s| format!(" (HTTP {s}; check --key)"))
            ),
            _ => e.explain(target),
        }
    }
}

/// How a protocol's reference client times its reconnects after the
/// server dropped its socket, for `storm`:
///
/// - **pusher-js** (8.x): 1 s after a plain close, then attempts of 15 s
///   doubling to 60 s, 1 s apart ([`worst::pusher_js_retry_delay`]); no
///   jitter.
/// - **@rails/actioncable** (8.1, `ConnectionMonitor`): nothing happens on
///   the close itself but recording it; a poll timer that runs from the
///   first open fires every `staleThreshold` (6 s) × 1.15^attempts ×
///   (1 + jitter), jitter uniform in [0, 1) while attempts is 0 and in
///   [0, 0.15) after. At a tick, once no message has come for 6 s the
///   connection is stale: attempts goes up by one, and unless the close
///   was under 6 s ago the socket is reopened. A welcome resets attempts.
///   A reopen that fails before the socket opens does not count as a new
///   close (the client's `disconnected` flag is still set), so later
///   ticks reopen again; a `disconnect` with `reconnect: false` stops the
///   monitor (the client gives up). So clients come back 6 to 18 s after
///   the drop, spread by the poll timers' phases and jitter.
/// - **Amplify** (v6, `AWSWebSocketProvider`, both AppSync APIs): a
///   disrupted connection starts the `ReconnectionMonitor`, which
///   reconnects after 5 s (`RECONNECT_DELAY`) and then every 60 s
///   (`RECONNECT_INTERVAL`) until connected; each reconnect is a
///   `jitteredExponentialRetry`: after the n-th failed attempt it waits
///   2^n × 100 ms + uniform [0, 100) ms and stops once that would exceed
///   5 s (`MAX_DELAY_MS`), i.e. after 6 attempts; errors with code 400,
///   401 or 403 end the retry at once. So every client comes back 5 s
///   after the drop, within 0.1 s of each other.
/// - **@anycable/core** (1.1, `Monitor` with its default
///   `backoffWithJitter(pingInterval = 3 s)`), for `actioncable-ext`: a
///   close schedules a reconnect at once, after interval × 2^attempts ×
///   uniform [1, 2) × (1 + uniform [-0.5, 0.5)), attempts going up by one
///   per scheduled reconnect and back to 0 on a welcome; no upper bound.
///   A `disconnect` with `reconnect: false` closes the cable. So clients
///   come back 1.5 to 9 s after the drop, then 3 to 18 s after a failed
///   attempt.
pub struct Reconnect {
    proto: Proto,
    rng: super::Rng,
    /// Attempts since the drop (pusher-js: failed attempts of this
    /// reconnect; Action Cable: the monitor's `reconnectAttempts`).
    attempts: u32,
    // Action Cable's ConnectionMonitor.
    next_tick: Instant,
    last_message: Instant,
    disconnected_at: Option<Instant>,
    // Amplify: the first reconnect trigger, and the retry's attempt.
    trigger: Option<Instant>,
}

/// `ConnectionMonitor.staleThreshold`.
pub const CABLE_STALE: Duration = Duration::from_secs(6);
/// `ConnectionMonitor.reconnectionBackoffRate`.
const CABLE_BACKOFF_RATE: f64 = 0.15;
/// `@anycable/core`'s default `pingInterval`, the base of its backoff.
const ANYCABLE_PING: Duration = Duration::from_secs(3);
/// Amplify's `RECONNECT_DELAY`, `RECONNECT_INTERVAL` and `MAX_DELAY_MS`.
const AMPLIFY_DELAY: Duration = Duration::from_secs(5);
const AMPLIFY_INTERVAL: Duration = Duration::from_secs(60);
const AMPLIFY_MAX_DELAY_MS: f64 = 5000.0;

impl Reconnect {
    /// A client that first opened (Action Cable: started its monitor) at
    /// `started`.
    pub fn new(proto: Proto, started: Instant, rng: super::Rng) -> Reconnect {
        let mut r = Reconnect {
            proto,
            rng,
            attempts: 0,
            next_tick: started,
            last_message: started,
            disconnected_at: None,
            trigger: None,
        };
        if proto == Proto::ActionCable {
            r.next_tick = started + r.cable_interval();
        }
        r
    }

    /// `backoffWithJitter(3000)(attempts)`, then attempts + 1.
    fn anycable_delay(&mut self) -> Duration {
        let left = 2f64.powi(self.attempts.min(20) as i32);
        let delay = left + left * self.rng.next_f64();
        let deviation = 2.0 * (self.rng.next_f64() - 0.5) * 0.5;
        self.attempts += 1;
        ANYCABLE_PING.mul_f64(delay * (1.0 + deviation))
    }

    fn cable_interval(&mut self) -> Duration {
        let backoff = (1.0 + CABLE_BACKOFF_RATE).powi(self.attempts.min(10) as i32);
        let jitter_max = if self.attempts == 0 {
            1.0
        } else {
            CABLE_BACKOFF_RATE
        };
        CABLE_STALE.mul_f64(backoff * (1.0 + jitter_max * self.rng.next_f64()))
    }

    /// A frame arrived at `at` (Action Cable: `recordMessage`).
    pub fn message(&mut self, at: Instant) {
        self.last_message = at;
    }

    /// Connected and subscribed again at `at` (a welcome: `recordConnect`).
    pub fn connected(&mut self, at: Instant) {
        self.last_message = at;
        self.attempts = 0;
        self.disconnected_at = None;
        self.trigger = None;
    }

    /// The protocol's time limit for the next attempt; `default` where the
    /// client has none of its own (a browser WebSocket has no connect
    /// timeout).
    pub fn attempt_timeout(&self, default: Duration) -> Duration {
        match self.proto {
            Proto::Pusher => worst::attempt_timeout(self.attempts),
            _ => default,
        }
    }

    /// When to make the first attempt after the socket dropped at `at`.
    pub fn dropped(&mut self, at: Instant) -> Instant {
        self.attempts = 0;
        match self.proto {
            Proto::Pusher => at + worst::pusher_js_retry_delay(None).unwrap_or_default(),
            Proto::ActionCable => {
                self.disconnected_at = Some(at);
                self.cable_reopen(at)
            }
            Proto::ActionCableExt => at + self.anycable_delay(),
            _ => {
                self.trigger = Some(at + AMPLIFY_DELAY);
                at + AMPLIFY_DELAY
            }
        }
    }

    /// After attempt failed at `now` with `e`: when to try again, or
    /// `None` when the client gives up.
    pub fn failed(&mut self, now: Instant, e: &ClientError) -> Option<Instant> {
        match self.proto {
            Proto::Pusher => {
                let code = match e {
                    ClientError::Rejected { code, .. } => *code,
                    _ => None,
                };
                let retry = worst::pusher_js_retry_delay(code)?;
                self.attempts += 1;
                Some(now + retry.max(Duration::from_secs(1)))
            }
            Proto::ActionCable => {
                if let ClientError::Rejected { message, .. } = e {
                    if message.contains("reconnect false") {
                        return None;
                    }
                }
                let opened = !matches!(
                    e,
                    ClientError::Connect(_)
                        | ClientError::Handshake(_)
                        | ClientError::Timeout("connecting")
                );
                if opened {
                    self.disconnected_at = Some(now);
                }
                Some(self.cable_reopen(now))
            }
            Proto::ActionCableExt => {
                if let ClientError::Rejected { message, .. } = e {
                    if message.contains("reconnect false") {
                        return None;
                    }
                }
                Some(now + self.anycable_delay())
            }
            _ => {
                let trigger = self.trigger.unwrap_or(now);
                let non_retryable = matches!(
                    e,
                    ClientError::Rejected {
                        code: Some(400 | 401 | 403),
                        ..
                    }
                );
                self.attempts += 1;
                let delay_ms =
                    2f64.powi(self.attempts.min(30) as i32) * 100.0 + 100.0 * self.rng.next_f64();
                if !non_retryable && delay_ms <= AMPLIFY_MAX_DELAY_MS {
                    return Some(now + Duration::from_secs_f64(delay_ms / 1000.0));
                }
                // The retry gave up: the monitor's next 60 s tick.
                self.attempts = 0;
                let mut next = trigger + AMPLIFY_INTERVAL;
                while next <= now {
                    next += AMPLIFY_INTERVAL;
                }
                Some(next)
            }
        }
    }

    /// The first poll tick from `now` on at which the monitor reopens;
    /// ticks before `now` (while an attempt was under way, or while the
    /// connection was held) only count attempts when stale.
    fn cable_reopen(&mut self, now: Instant) -> Instant {
        loop {
            let t = self.next_tick;
            let stale = t.saturating_duration_since(self.last_message) > CABLE_STALE;
            let recent = self
                .disconnected_at
                .is_some_and(|d| t.saturating_duration_since(d) < CABLE_STALE);
            if stale {
                self.attempts += 1;
            }
            self.next_tick = t + self.cable_interval();
            if stale && !recent && t >= now {
                return t;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for proto in Proto::ALL {
            assert_eq!(Proto::from_name(proto.name()), Some(proto));
        }
        assert_eq!(Proto::from_name("Pusher"), None);
        assert_eq!(Proto::default(), Proto::Pusher);
    }

    /// A scenario given a protocol it does not speak says which it speaks,
    /// before any connection (nothing listens on the target).
    #[tokio::test]
    async fn scenarios_refuse_the_protocols_they_do_not_speak() {
        use crate::{broadcast, connect, fanout};
        let target = Target::new("ws://127.0.0.1:9", "app-id", "key", "secret", false).unwrap();
        for proto in [Proto::AppsyncGraphql, Proto::AppsyncEvents] {
            let mut p = broadcast::BroadcastParams::new(target.clone());
            p.protocol = proto;
            p.progress = false;
            let e = broadcast::run(&p).await.unwrap_err().0;
            let want = format!(
                "broadcast speaks --protocol pusher, actioncable or actioncable-ext, not {}",
                proto.name()
            );
            assert_eq!(e, want);
            let mut p = connect::ConnectParams::new(target.clone());
            p.protocol = proto;
            p.progress = false;
            let e = connect::run(&p).await.unwrap_err().0;
            assert!(
                e.starts_with("connect speaks --protocol pusher, actioncable or actioncable-ext"),
                "{e}"
            );
            let sweep = connect::SweepParams {
                base: p,
                steps: vec![1],
                pause: Duration::ZERO,
            };
            let e = connect::sweep(&sweep).await.unwrap_err().0;
            assert!(
                e.starts_with("connect speaks --protocol pusher, actioncable or actioncable-ext"),
                "{e}"
            );
        }
        let mut p = fanout::FanoutParams::new(target);
        p.protocol = Proto::ActionCable;
        p.progress = false;
        let e = fanout::run(&p).await.unwrap_err().0;
        assert_eq!(
            e,
            "fanout speaks --protocol pusher, appsync-graphql or appsync-events, not actioncable"
        );
    }

    #[test]
    fn pusher_js_comes_back_after_a_second() {
        let t0 = Instant::now();
        let mut r = Reconnect::new(Proto::Pusher, t0, super::super::Rng::new(1));
        let drop_at = t0 + Duration::from_secs(100);
        assert_eq!(r.dropped(drop_at), drop_at + Duration::from_secs(1));
        assert_eq!(r.attempt_timeout(Duration::ZERO), Duration::from_secs(15));
        let e = ClientError::Timeout("connecting");
        assert_eq!(
            r.failed(drop_at, &e),
            Some(drop_at + Duration::from_secs(1))
        );
        assert_eq!(r.attempt_timeout(Duration::ZERO), Duration::from_secs(30));
        let quota = ClientError::Rejected {
            code: Some(4004),
            message: "over quota".into(),
        };
        assert_eq!(r.failed(drop_at, &quota), None);
    }

    #[test]
    fn action_cable_reopens_at_a_stale_tick_six_seconds_after_the_close() {
        for seed in 1..200 {
            let t0 = Instant::now();
            let mut r = Reconnect::new(Proto::ActionCable, t0, super::super::Rng::new(seed));
            // Held 100 s, a ping every 3 s; dropped 1 s after the last.
            let mut t = t0;
            while t < t0 + Duration::from_secs(100) {
                t += Duration::from_secs(3);
                r.message(t);
            }
            let drop_at = t + Duration::from_secs(1);
            let at = r.dropped(drop_at);
            let after = at - drop_at;
            assert!(
                after >= CABLE_STALE && after < Duration::from_secs(18),
                "seed {seed}: {after:?}"
            );
            // The socket never opened: the close is not recorded again,
            // the next stale tick reopens, 6.9 s or more later.
            let again = r
                .failed(at, &ClientError::Connect("refused".into()))
                .unwrap();
            assert!(
                again - at >= Duration::from_secs_f64(6.9) && again - at < Duration::from_secs(10),
                "seed {seed}: {:?}",
                again - at
            );
            // Opened, then closed: recorded as a close; the next tick is
            // 6.9 s or more away, past the 6 s of a recent close.
            let third = r
                .failed(again, &ClientError::Closed("reset".into()))
                .unwrap();
            assert!(third - again >= CABLE_STALE, "seed {seed}");
        }
        // A disconnect with reconnect false stops the monitor.
        let mut r = Reconnect::new(
            Proto::ActionCable,
            Instant::now(),
            super::super::Rng::new(3),
        );
        let e = ClientError::Rejected {
            code: None,
            message: "disconnect, reason \"unauthorized\", reconnect false".into(),
        };
        assert_eq!(r.failed(Instant::now(), &e), None);
    }

    #[test]
    fn anycable_core_backs_off_from_three_seconds_with_jitter() {
        let t0 = Instant::now();
        let (mut lo, mut hi) = (Duration::MAX, Duration::ZERO);
        for seed in 1..500 {
            let mut r = Reconnect::new(Proto::ActionCableExt, t0, super::super::Rng::new(seed));
            let first = r.dropped(t0) - t0;
            assert!(
                first >= Duration::from_millis(1500) && first < Duration::from_secs(9),
                "{first:?}"
            );
            (lo, hi) = (lo.min(first), hi.max(first));
            let e = ClientError::Connect("refused".into());
            let second = r.failed(t0, &e).unwrap() - t0;
            assert!(
                second >= Duration::from_secs(3) && second < Duration::from_secs(18),
                "{second:?}"
            );
            // A welcome starts over.
            r.connected(t0);
            assert!(r.dropped(t0) - t0 < Duration::from_secs(9));
        }
        assert!(lo < Duration::from_secs(3) && hi > Duration::from_secs(6));
        let mut r = Reconnect::new(Proto::ActionCableExt, t0, super::super::Rng::new(1));
        let e = ClientError::Rejected {
            code: None,
            message: "disconnect, reason \"unauthorized\", reconnect false".into(),
        };
        assert_eq!(r.failed(t0, &e), None);
    }

    #[test]
    fn amplify_waits_five_seconds_then_retries_with_jittered_backoff() {
        let t0 = Instant::now();
        let mut r = Reconnect::new(Proto::AppsyncEvents, t0, super::super::Rng::new(5));
        let at = r.dropped(t0);
        assert_eq!(at, t0 + AMPLIFY_DELAY);
        let e = ClientError::Connect("refused".into());
        let mut now = at;
        for n in 1..=5u32 {
            let next = r.failed(now, &e).unwrap();
            let ms = (next - now).as_secs_f64() * 1000.0;
            let base = f64::from(1u32 << n) * 100.0;
            assert!(ms >= base && ms < base + 100.0, "attempt {n}: {ms}");
            now = next;
        }
        // The sixth failure ends the retry: the monitor's next minute tick.
        assert_eq!(r.failed(now, &e), Some(at + AMPLIFY_INTERVAL));
        // A 401 ends a retry at once.
        let mut r = Reconnect::new(Proto::AppsyncGraphql, t0, super::super::Rng::new(5));
        let at = r.dropped(t0);
        let denied = ClientError::Rejected {
            code: Some(401),
            message: "UnauthorizedException".into(),
        };
        assert_eq!(r.failed(at, &denied), Some(at + AMPLIFY_INTERVAL));
    }
}
