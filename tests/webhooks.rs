//! Webhooks against a real HTTP receiver in the test: every event type,
//! the Pusher signature, batching, the delayed leave and its cancellation,
//! retries after a 500, the bounded queue, and delivery on shutdown.

mod common;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use common::*;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Hook {
    headers: HeaderMap,
    body: String,
    json: Value,
}

impl Hook {
    fn names(&self) -> Vec<String> {
        self.json["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_owned())
            .collect()
    }
}

#[derive(Default)]
struct Inner {
    got: Mutex<Vec<Hook>>,
    /// Statuses to answer, in order; 200 once empty.
    script: Mutex<VecDeque<u16>>,
    /// Hold every answer this long.
    hold: Mutex<Duration>,
    arrived: Notify,
}

/// A webhook receiver on a loopback port.
#[derive(Clone)]
struct Receiver {
    inner: Arc<Inner>,
    url: String,
}

async fn receive(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let body = String::from_utf8(body.to_vec()).expect("webhook body is UTF-8");
    let json: Value = serde_json::from_str(&body).expect("webhook body is JSON");
    inner.got.lock().unwrap().push(Hook {
        headers,
        body,
        json,
    });
    inner.arrived.notify_waiters();
    let hold = *inner.hold.lock().unwrap();
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    let status = inner.script.lock().unwrap().pop_front().unwrap_or(200);
    StatusCode::from_u16(status).unwrap()
}

impl Receiver {
    async fn start() -> Receiver {
        let inner = Arc::new(Inner::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/hooks?token=s3cr3t-token",
            listener.local_addr().unwrap()
        );
        let app = Router::new()
            .route("/hooks", post(receive))
            .with_state(inner.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { inner, url }
    }

    fn hooks(&self) -> Vec<Hook> {
        self.inner.got.lock().unwrap().clone()
    }

    /// Every event received so far, in order.
    fn events(&self) -> Vec<Value> {
        self.hooks()
            .iter()
            .flat_map(|h| h.json["events"].as_array().unwrap().clone())
            .collect()
    }

    /// Wait until `done(events)` holds; panics after the timeout.
    async fn wait_for(&self, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let notified = self.inner.arrived.notified();
            let events = self.events();
            if done(&events) {
                return events;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "timed out waiting for {what}; got {events:#?}"
            );
            let _ = tokio::time::timeout(left, notified).await;
        }
    }

    /// Wait for an event named `name` (on `channel`).
    async fn event(&self, name: &str, channel: &str) -> Value {
        let events = self
            .wait_for(&format!("{name} on {channel}"), |ev| {
                ev.iter()
                    .any(|e| e["name"] == name && e["channel"] == channel)
            })
            .await;
        events
            .into_iter()
            .find(|e| e["name"] == name && e["channel"] == channel)
            .unwrap()
    }

    fn count(&self, name: &str, channel: &str) -> usize {
        self.events()
            .iter()
            .filter(|e| e["name"] == name && e["channel"] == channel)
            .count()
    }
}

const ALL_TYPES: &str = r#"["channel_occupied", "channel_vacated", "member_added", "member_removed", "client_event", "cache_miss", "subscription_count"]"#;

/// App config with one webhook to `url` for `types`.
fn hook_app(url: &str, types: &str, extra: &str) -> String {
    format!("webhooks = [{{ url = \"{url}\", event_types = {types} }}]\n{extra}")
}

/// Pusher's signature check, done by hand here (conformance/ does it
/// with the `pusher` SDK).
fn assert_signed(h: &Hook) {
    assert_eq!(h.headers["content-type"], "application/json");
    assert_eq!(h.headers["x-pusher-key"], APP_KEY);
    let sig = h.headers["x-pusher-signature"].to_str().unwrap();
    assert!(
        herald::signing::verify_hex(APP_SECRET, &h.body, sig),
        "bad signature on {}",
        h.body
    );
    let time_ms = h.json["time_ms"].as_u64().expect("time_ms");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        time_ms <= now && now - time_ms < 60_000,
        "time_ms {time_ms}"
    );
}

#[tokio::test]
async fn every_event_type_arrives_signed() {
    let rx = Receiver::start().await;
    let top = "webhook_batch_ms = 20\nwebhook_leave_delay_ms = 200";
    let server = Server::start_with(
        top,
        &hook_app(&rx.url, ALL_TYPES, "subscription_count = true"),
    )
    .await;

    let mut a = server.client().await;
    let mut b = server.client().await;
    a.subscribe_presence("presence-room", "u1", json!({"name": "A"}))
        .await;
    let occupied = rx.event("channel_occupied", "presence-room").await;
    assert_eq!(
        occupied,
        json!({"name": "channel_occupied", "channel": "presence-room"})
    );
    let added = rx.event("member_added", "presence-room").await;
    assert_eq!(added["user_id"], "u1");

    b.subscribe_presence("presence-room", "u2", json!({})).await;
    a.expect("pusher_internal:member_added", Some("presence-room"))
        .await;
    a.send(json!({"event": "client-typing", "channel": "presence-room", "data": {"x": 1}}))
        .await;
    b.expect("client-typing", Some("presence-room")).await;
    let ce = rx.event("client_event", "presence-room").await;
    assert_eq!(ce["event"], "client-typing");
    assert_eq!(ce["data"], r#"{"x":1}"#, "data goes as a string");
    assert_eq!(ce["socket_id"], a.socket_id.as_str());
    assert_eq!(ce["user_id"], "u1", "presence client events carry the user");

    b.subscribe_private("private-cache-x").await;
    b.expect("pusher:cache_miss", Some("private-cache-x")).await;
    assert_eq!(
        rx.event("cache_miss", "private-cache-x").await,
        json!({"name": "cache_miss", "channel": "private-cache-x"})
    );
    b.subscribe("counted").await;
    let count = rx.event("subscription_count", "counted").await;
    assert_eq!(count["subscription_count"], 1);

    b.unsubscribe("presence-room").await;
    let removed = rx.event("member_removed", "presence-room").await;
    assert_eq!(removed["user_id"], "u2");
    assert_eq!(rx.count("channel_vacated", "presence-room"), 0);
    a.close().await;
    rx.event("channel_vacated", "presence-room").await;

    for h in rx.hooks() {
        assert_signed(&h);
    }
    assert_eq!(rx.count("member_added", "presence-room"), 2);
    assert!(
        server
            .metric_where("herald_webhook_deliveries_total", &[("app", APP_ID)])
            .await
            >= 1
    );
    let log = server.log();
    assert!(
        !log.contains(APP_SECRET) && !log.contains("s3cr3t-token"),
        "{log}"
    );
}

#[tokio::test]
async fn endpoints_get_only_their_types_and_channels() {
    let rx = Receiver::start().await;
    let rx2 = Receiver::start().await;
    let app = format!(
        "webhooks = [{{ url = \"{}\", event_types = [\"channel_occupied\"] }}, \
         {{ url = \"{}\", event_types = [\"channel_occupied\", \"channel_vacated\"], \
            headers = {{ X-Custom = \"yes\" }}, \
            filter = {{ channel_name_starts_with = \"private-\" }} }}]",
        rx.url, rx2.url
    );
    let server =
        Server::start_with("webhook_batch_ms = 20\nwebhook_leave_delay_ms = 0", &app).await;
    let mut c = server.client().await;
    c.subscribe("news").await;
    c.subscribe_private("private-a").await;
    rx.event("channel_occupied", "private-a").await;
    rx.event("channel_occupied", "news").await;
    let h = rx2.event("channel_occupied", "private-a").await;
    c.unsubscribe("private-a").await;
    rx2.event("channel_vacated", "private-a").await;
    assert_eq!(h["channel"], "private-a");
    assert_eq!(rx2.count("channel_occupied", "news"), 0, "filtered out");
    assert!(rx2.hooks().iter().all(|h| h.headers["x-custom"] == "yes"));
    // The first endpoint does not want vacated events.
    c.subscribe("marker").await;
    rx.event("channel_occupied", "marker").await;
    assert_eq!(rx.count("channel_vacated", "private-a"), 0);
}

#[tokio::test]
async fn batches_hold_at_most_batch_size_events() {
    let rx = Receiver::start().await;
    let top = "webhook_batch_ms = 1500\nwebhook_batch_size = 2";
    let server = Server::start_with(top, &hook_app(&rx.url, r#"["channel_occupied"]"#, "")).await;
    let mut c = server.client().await;
    let t0 = Instant::now();
    for ch in ["b1", "b2", "b3"] {
        c.subscribe(ch).await;
    }
    rx.wait_for("three occupied", |ev| ev.len() == 3).await;
    let sizes: Vec<usize> = rx.hooks().iter().map(|h| h.names().len()).collect();
    assert_eq!(
        sizes,
        [2, 1],
        "a full batch at once, the rest after the window"
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(1400),
        "the last event waited for the batch window"
    );
}

#[tokio::test]
async fn a_leave_and_return_within_the_delay_sends_nothing() {
    let rx = Receiver::start().await;
    let top = "webhook_batch_ms = 20\nwebhook_leave_delay_ms = 1500";
    let types = r#"["channel_occupied", "channel_vacated", "member_added", "member_removed"]"#;
    let server = Server::start_with(top, &hook_app(&rx.url, types, "")).await;
    let mut c = server.client().await;
    c.subscribe("reload").await;
    c.subscribe_presence("presence-p", "u1", json!({})).await;
    rx.event("channel_occupied", "reload").await;
    rx.event("member_added", "presence-p").await;

    // A page reload: the socket goes, a new one comes back at once.
    c.close().await;
    let mut c2 = server.client().await;
    c2.subscribe("reload").await;
    c2.subscribe_presence("presence-p", "u1", json!({})).await;
    // A channel that really empties, after the others left: its vacated
    // comes due after theirs would have.
    c2.subscribe("marker").await;
    rx.event("channel_occupied", "marker").await;
    c2.unsubscribe("marker").await;
    rx.event("channel_vacated", "marker").await;

    assert_eq!(rx.count("channel_vacated", "reload"), 0);
    assert_eq!(rx.count("channel_occupied", "reload"), 1);
    assert_eq!(rx.count("member_removed", "presence-p"), 0);
    assert_eq!(rx.count("member_added", "presence-p"), 1);
    assert_eq!(rx.count("channel_vacated", "presence-p"), 0);
}

#[tokio::test]
async fn a_500_is_retried_with_the_same_body() {
    let rx = Receiver::start().await;
    rx.inner.script.lock().unwrap().extend([500, 503]);
    let top = "webhook_batch_ms = 20\nwebhook_retry_ms = 100";
    let server = Server::start_with(top, &hook_app(&rx.url, r#"["channel_occupied"]"#, "")).await;
    let mut c = server.client().await;
    c.subscribe("flaky").await;
    rx.wait_for("three tries", |ev| ev.len() == 3).await;
    let hooks = rx.hooks();
    assert!(hooks.iter().all(|h| h.body == hooks[0].body));
    for h in &hooks {
        assert_signed(h);
    }
    // Metrics: two failures that were retried, then a delivery.
    let deadline = Instant::now() + TIMEOUT;
    while metric_in(
        &server.scrape().await,
        "herald_webhook_deliveries_total",
        &[],
    )
    .is_none()
    {
        assert!(Instant::now() < deadline, "delivery not counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let scrape = server.scrape().await;
    assert_eq!(
        metric_in(
            &scrape,
            "herald_webhook_failures_total",
            &[("retry", "true")]
        ),
        Some(2)
    );
    assert_eq!(
        metric_in(&scrape, "herald_webhook_queue_depth", &[("app", APP_ID)]),
        Some(0)
    );
}

#[tokio::test]
async fn a_full_queue_drops_counts_and_logs_once() {
    let rx = Receiver::start().await;
    *rx.inner.hold.lock().unwrap() = Duration::from_secs(2);
    let top = "webhook_batch_ms = 10\nwebhook_batch_size = 1\nwebhook_queue = 2";
    let server = Server::start_with(top, &hook_app(&rx.url, r#"["channel_occupied"]"#, "")).await;
    let mut c = server.client().await;
    for i in 0..6 {
        c.subscribe(&format!("q{i}")).await;
    }
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let scrape = server.scrape().await;
        let dropped = metric_in(
            &scrape,
            "herald_webhook_events_dropped_total",
            &[("app", APP_ID)],
        );
        if dropped.unwrap_or(0) >= 4 {
            break;
        }
        assert!(Instant::now() < deadline, "drops not counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        server.log().matches("webhook queue full").count(),
        1,
        "{}",
        server.log()
    );
    rx.wait_for("the two admitted events", |ev| ev.len() == 2)
        .await;
}

#[tokio::test]
async fn shutdown_sends_what_waits() {
    let rx = Receiver::start().await;
    // A leave waits a minute: only the shutdown flush sends it.
    let top = "webhook_batch_ms = 20\nwebhook_leave_delay_ms = 60000";
    let types = r#"["channel_occupied", "channel_vacated"]"#;
    let mut server = Server::start_with(top, &hook_app(&rx.url, types, "")).await;
    let mut c = server.client().await;
    c.subscribe("bye").await;
    rx.event("channel_occupied", "bye").await;
    c.unsubscribe("bye").await;
    // The unsubscribe is processed when the server answers something after it.
    c.send(json!({"event": "pusher:ping"})).await;
    c.expect("pusher:pong", None).await;
    let t0 = Instant::now();
    // SAFETY: kill(2) on the child we spawned and still own.
    assert_eq!(unsafe { libc::kill(server.pid(), libc::SIGTERM) }, 0);
    rx.event("channel_vacated", "bye").await;
    let status = server.wait_exit().await;
    assert!(status.success(), "{status:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "within the grace period"
    );
}
