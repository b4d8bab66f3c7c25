//! Webhooks against a real HTTP receiver in the test: every event type,
//! the Pusher signature, batching, the delayed leave and its cancellation,
//! retries after a 500, the bounded queue, and delivery on shutdown.

use crate::common;

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
        herald_pusher::signing::verify_hex(APP_SECRET, &h.body, sig),
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

/// A secret rotated on SIGHUP signs the webhooks sent from then on (the
/// app's backend checks them with its new secret).
#[tokio::test]
async fn a_rotated_secret_signs_webhooks_from_then_on() {
    let rx = Receiver::start().await;
    let server = Server::start_with("", &hook_app(&rx.url, r#"["channel_occupied"]"#, "")).await;
    let path = server.config_path();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("secret = \"test-secret\"", "secret = \"rotated\""),
    )
    .unwrap();
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(server.pid(), libc::SIGHUP) }, 0);
    // Applied once the API takes the new secret.
    let body = json!({ "name": "e", "channel": "x", "data": "{}" }).to_string();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let q = herald_pusher::auth::sign_query(
            APP_KEY,
            "rotated",
            "POST",
            "/apps/test-app/events",
            body.as_bytes(),
            &[],
        );
        if server
            .raw_api("POST", "/apps/test-app/events", &q, &body)
            .await
            .0
            == 200
        {
            break;
        }
        assert!(Instant::now() < deadline, "the rotation never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut c = server.client().await;
    c.subscribe("after").await;
    rx.event("channel_occupied", "after").await;
    let hook = rx
        .hooks()
        .into_iter()
        .find(|h| h.body.contains("\"after\""))
        .unwrap();
    let sig = hook.headers["x-pusher-signature"].to_str().unwrap();
    assert!(
        herald_pusher::signing::verify_hex("rotated", &hook.body, sig),
        "{}",
        hook.body
    );
    assert!(!herald_pusher::signing::verify_hex(
        APP_SECRET, &hook.body, sig
    ));
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

/// The header names as they were sent, read off the socket (an HTTP
/// server library would fold their case): PHP's `getallheaders()` keeps
/// them as sent, and the PHP SDK's webhook check reads `X-Pusher-Key` and
/// `X-Pusher-Signature` with exactly that case.
#[tokio::test]
async fn the_signature_headers_are_sent_as_pusher_writes_them() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    let server = Server::start_with(
        "webhook_batch_ms = 10",
        &hook_app(&url, r#"["channel_occupied"]"#, ""),
    )
    .await;
    let mut c = server.client().await;
    c.subscribe("room").await;
    let (mut sock, _) = tokio::time::timeout(TIMEOUT, listener.accept())
        .await
        .expect("no webhook arrived")
        .unwrap();
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(TIMEOUT, sock.read(&mut buf))
            .await
            .expect("the webhook's head did not arrive")
            .unwrap();
        assert!(n > 0, "closed before the head ended");
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let names: Vec<&str> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':').map(|(n, _)| n))
        .collect();
    assert!(names.contains(&"X-Pusher-Key"), "{head}");
    assert!(names.contains(&"X-Pusher-Signature"), "{head}");
    sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
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
async fn a_receiver_that_is_down_holds_at_most_webhook_queue_bytes() {
    // Nothing listens on port 1: every request fails and is retried, so
    // what was admitted stays queued (in flight) for `webhook_retry_for`.
    let top = "webhook_batch_ms = 10\nwebhook_queue_bytes = 65536";
    let app = hook_app(
        "http://127.0.0.1:1/hooks",
        r#"["client_event"]"#,
        "client_event_rate = 100",
    );
    let server = Server::start_with(top, &app).await;
    let mut c = server.client().await;
    c.subscribe_private("private-w").await;
    // 20 client events of 9 KB: 180 KB for a 64 KiB budget.
    let data = "x".repeat(9000);
    for _ in 0..20 {
        c.send(json!({ "event": "client-x", "channel": "private-w", "data": data }))
            .await;
    }
    let app_label = [("app", APP_ID)];
    let deadline = Instant::now() + TIMEOUT;
    let (depth, bytes, dropped) = loop {
        let scrape = server.scrape().await;
        let get = |name| metric_in(&scrape, name, &app_label).unwrap_or(0);
        let figures = (
            get("herald_webhook_queue_depth"),
            get("herald_webhook_queue_bytes"),
            get("herald_webhook_events_dropped_total"),
        );
        if figures.0 + figures.2 == 20 {
            break figures;
        }
        assert!(
            Instant::now() < deadline,
            "20 events not all admitted or dropped: {figures:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(bytes <= 65536, "{bytes} bytes queued");
    // Each event holds its 9 KB: at most 7 fit, and the budget is used.
    assert!(
        (5..=7).contains(&depth),
        "{depth} queued, {dropped} dropped"
    );
    assert!(bytes >= depth * 9000, "{bytes} bytes for {depth} events");
    assert_eq!(server.log().matches("webhook queue full").count(), 1);
    // The connection that sent them is unharmed.
    c.send(json!({ "event": "pusher:ping", "data": {} })).await;
    c.expect("pusher:pong", None).await;
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

// ----- in a cluster ----------------------------------------------------------

use herald_broker::testing::{BrokerServer, Kind, RedisCluster};

const CLUSTER_TYPES: &str = r#"["channel_occupied", "channel_vacated", "member_added", "member_removed", "client_event", "subscription_count"]"#;

/// Three `herald serve` nodes on `broker`, each sending the test app's
/// webhooks to `rx` (leaves at once, so counts are exact); `counts`: the
/// app pushes subscription counts (a client subscribing twice may see a
/// count before its second confirmation).
async fn cluster(
    broker_url: &str,
    rx: &Receiver,
    prefix: &str,
    ttl: u64,
    counts: bool,
) -> Vec<Server> {
    let top = format!(
        "webhook_batch_ms = 20\nwebhook_leave_delay_ms = 0\n\
         [broker]\nurl = \"{broker_url}\"\nprefix = \"{prefix}\"\nttl = {ttl}\n"
    );
    let app = hook_app(
        &rx.url,
        CLUSTER_TYPES,
        &format!("subscription_count = {counts}"),
    );
    let mut nodes = Vec::new();
    for _ in 0..3 {
        // start_with waits for /ready, which waits for the broker and for
        // the other nodes to have answered this one's hello.
        nodes.push(Server::start_with(&top, &app).await);
    }
    nodes
}

/// One client per node on `private-barrier`: [`barrier`] sends through them.
async fn barrier_clients(nodes: &[&Server]) -> Vec<Client> {
    let mut out = Vec::new();
    for n in nodes {
        let mut c = n.client().await;
        c.subscribe_private("private-barrier").await;
        out.push(c);
    }
    out
}

/// Every node reports a client event of its own, after whatever it had
/// queued before: once all arrived, every node's earlier webhooks have.
async fn barrier(rx: &Receiver, clients: &mut [Client], round: usize) {
    for (i, c) in clients.iter_mut().enumerate() {
        let event = format!("client-b{round}-{i}");
        c.send(json!({"event": event, "channel": "private-barrier", "data": {}}))
            .await;
    }
    let n = clients.len();
    rx.wait_for(&format!("barrier {round}"), |ev| {
        (0..n).all(|i| {
            let name = format!("client-b{round}-{i}");
            ev.iter()
                .any(|e| e["name"] == "client_event" && e["event"] == name.as_str())
        })
    })
    .await;
}

fn user_count(rx: &Receiver, name: &str, channel: &str, user: &str) -> usize {
    rx.events()
        .iter()
        .filter(|e| e["name"] == name && e["channel"] == channel && e["user_id"] == user)
        .count()
}

/// The `subscription_count` events of `channel`, in order.
fn counts(rx: &Receiver, channel: &str) -> Vec<u64> {
    rx.events()
        .iter()
        .filter(|e| e["name"] == "subscription_count" && e["channel"] == channel)
        .map(|e| e["subscription_count"].as_u64().unwrap())
        .collect()
}

both!(a_cluster_sends_each_webhook_once);
async fn a_cluster_sends_each_webhook_once(kind: Kind) {
    let broker = BrokerServer::start(kind);
    sends_each_webhook_once(&broker.url()).await;
}

/// The same on a Redis Cluster (three masters, three replicas).
#[tokio::test]
async fn a_redis_cluster_sends_each_webhook_once() {
    let broker = RedisCluster::start();
    sends_each_webhook_once(&broker.url()).await;
}

async fn sends_each_webhook_once(broker_url: &str) {
    let rx = Receiver::start().await;
    let n = cluster(broker_url, &rx, "hooks-once", 30, true).await;
    let mut bar = barrier_clients(&[&n[0], &n[1], &n[2]]).await;

    // The first subscribers of one channel on three nodes at once.
    let mut c: Vec<Client> = Vec::new();
    for s in &n {
        c.push(s.client().await);
    }
    {
        let [a, b, d] = &mut c[..] else {
            unreachable!()
        };
        tokio::join!(
            a.subscribe("room"),
            b.subscribe("room"),
            d.subscribe("room")
        );
    }
    rx.event("channel_occupied", "room").await;

    // The same user joins a presence channel on two nodes at once; another
    // user on the third.
    let mut p: Vec<Client> = Vec::new();
    for s in &n {
        p.push(s.client().await);
    }
    {
        let [a, b, d] = &mut p[..] else {
            unreachable!()
        };
        tokio::join!(
            a.subscribe_presence("presence-room", "u1", json!({})),
            b.subscribe_presence("presence-room", "u1", json!({})),
            d.subscribe_presence("presence-room", "u2", json!({})),
        );
    }
    rx.wait_for("both members added", |ev| {
        ["u1", "u2"].iter().all(|u| {
            ev.iter()
                .any(|e| e["name"] == "member_added" && e["user_id"] == *u)
        })
    })
    .await;

    // Subscription counts: the cluster's total, whichever node reports.
    let mut counted = Vec::new();
    for (i, s) in n.iter().enumerate() {
        let mut k = s.client().await;
        k.subscribe("counted").await;
        counted.push(k);
        rx.wait_for(&format!("count {}", i + 1), |_| {
            counts(&rx, "counted").last() == Some(&(i as u64 + 1))
        })
        .await;
    }

    barrier(&rx, &mut bar, 1).await;
    assert_eq!(
        rx.count("channel_occupied", "room"),
        1,
        "{:#?}",
        rx.events()
    );
    assert_eq!(rx.count("channel_occupied", "presence-room"), 1);
    assert_eq!(user_count(&rx, "member_added", "presence-room", "u1"), 1);
    assert_eq!(user_count(&rx, "member_added", "presence-room", "u2"), 1);

    // Two of three leave: the channel and u1 are still in the cluster.
    let mut c = c.into_iter();
    c.next().unwrap().close().await;
    c.next().unwrap().close().await;
    let mut p = p.into_iter();
    p.next().unwrap().close().await;
    let last_room = c.next().unwrap();
    let u1_last = p.next().unwrap();
    let u2 = p.next().unwrap();
    counted.pop().unwrap().close().await;
    rx.wait_for("count 2", |_| counts(&rx, "counted").last() == Some(&2))
        .await;
    barrier(&rx, &mut bar, 2).await;
    assert_eq!(rx.count("channel_vacated", "room"), 0);
    assert_eq!(user_count(&rx, "member_removed", "presence-room", "u1"), 0);

    // The last ones leave: once each.
    last_room.close().await;
    u1_last.close().await;
    rx.event("channel_vacated", "room").await;
    rx.event("member_removed", "presence-room").await;
    u2.close().await;
    rx.event("channel_vacated", "presence-room").await;
    barrier(&rx, &mut bar, 3).await;
    assert_eq!(rx.count("channel_vacated", "room"), 1, "{:#?}", rx.events());
    assert_eq!(rx.count("channel_vacated", "presence-room"), 1);
    assert_eq!(user_count(&rx, "member_removed", "presence-room", "u1"), 1);
    assert_eq!(user_count(&rx, "member_removed", "presence-room", "u2"), 1);
    assert_eq!(rx.count("channel_occupied", "room"), 1);
    for h in rx.hooks() {
        assert_signed(&h);
    }
}

both!(a_killed_nodes_members_are_removed_once);
async fn a_killed_nodes_members_are_removed_once(kind: Kind) {
    let broker = BrokerServer::start(kind);
    killed_nodes_members_are_removed_once(&broker.url()).await;
}

/// The same on a Redis Cluster.
#[tokio::test]
async fn a_redis_clusters_killed_nodes_members_are_removed_once() {
    let broker = RedisCluster::start();
    killed_nodes_members_are_removed_once(&broker.url()).await;
}

async fn killed_nodes_members_are_removed_once(broker_url: &str) {
    let rx = Receiver::start().await;
    let ttl = 2;
    let mut n = cluster(broker_url, &rx, "hooks-kill", ttl, false).await;
    let mut bar = barrier_clients(&[&n[0], &n[1]]).await;
    let mut watcher = n[1].client().await;
    watcher
        .subscribe_presence("presence-k", "watcher", json!({}))
        .await;
    // Node 0 is the oldest (it reports for the cluster); node 2 the
    // youngest. Each has a member and a channel of its own.
    let mut first = n[0].client().await;
    first
        .subscribe_presence("presence-k", "first", json!({}))
        .await;
    first.subscribe("only-first").await;
    let mut last = n[2].client().await;
    last.subscribe_presence("presence-k", "last", json!({}))
        .await;
    last.subscribe("only-last").await;
    rx.event("channel_occupied", "only-first").await;
    rx.event("channel_occupied", "only-last").await;
    rx.wait_for("three members", |ev| {
        ev.iter().filter(|e| e["name"] == "member_added").count() == 3
    })
    .await;

    // SIGKILL the youngest: the others notice within the TTL; one reports.
    n[2].child.kill().unwrap();
    let t0 = Instant::now();
    rx.event("channel_vacated", "only-last").await;
    rx.wait_for("last removed", |_| {
        user_count(&rx, "member_removed", "presence-k", "last") == 1
    })
    .await;
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(ttl) + Duration::from_millis(1500),
        "reported after {took:?} (TTL {ttl} s)"
    );

    // SIGKILL the oldest, the one that reported: the next takes over and
    // reports what the dead one held.
    n[0].child.kill().unwrap();
    bar.remove(0);
    let t0 = Instant::now();
    rx.event("channel_vacated", "only-first").await;
    rx.wait_for("first removed", |_| {
        user_count(&rx, "member_removed", "presence-k", "first") == 1
    })
    .await;
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(ttl) + Duration::from_millis(1500),
        "reported after {took:?} (TTL {ttl} s)"
    );
    // The survivor still reports: a new channel, then leaving it.
    let mut after = n[1].client().await;
    after.subscribe("after").await;
    rx.event("channel_occupied", "after").await;

    barrier(&rx, &mut bar, 1).await;
    for (name, channel, user) in [
        ("member_removed", "presence-k", "last"),
        ("member_removed", "presence-k", "first"),
        ("member_removed", "presence-k", "watcher"),
    ] {
        let want = usize::from(user != "watcher");
        assert_eq!(
            user_count(&rx, name, channel, user),
            want,
            "{name} {user}: {:#?}",
            rx.events()
        );
    }
    assert_eq!(rx.count("channel_vacated", "only-last"), 1);
    assert_eq!(rx.count("channel_vacated", "only-first"), 1);
    assert_eq!(rx.count("channel_vacated", "presence-k"), 0);
    assert_eq!(rx.count("channel_occupied", "presence-k"), 1);
    drop((first, last));
    let _ = n.pop();
}

/// `/ready`'s status, polled until it is `want`.
async fn ready_is(s: &Server, want: u16) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let (status, _) = s.raw_api("GET", "/ready", "", "").await;
        if status == want {
            return;
        }
        assert!(Instant::now() < deadline, "/ready stayed {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

both!(a_broker_outage_reports_the_net_changes_once);
async fn a_broker_outage_reports_the_net_changes_once(kind: Kind) {
    let mut broker = BrokerServer::start(kind);
    let rx = Receiver::start().await;
    let n = cluster(&broker.url(), &rx, "hooks-outage", 30, false).await;
    let mut c1 = n[1].client().await;
    c1.subscribe("stays").await;
    c1.subscribe("goes").await;
    c1.subscribe("flaps").await;
    rx.event("channel_occupied", "goes").await;
    rx.event("channel_occupied", "flaps").await;

    broker.kill();
    for s in &n {
        ready_is(s, 503).await;
    }
    // While nodes cannot hear each other: one channel empties, one is
    // new, one empties and fills again on another node.
    c1.unsubscribe("goes").await;
    c1.unsubscribe("flaps").await;
    c1.send(json!({"event": "pusher:ping"})).await;
    c1.expect("pusher:pong", None).await;
    // Their confirmations wait until the broker holds the interest again
    // (broker.confirm_timeout), so they are sent now and expected after.
    let mut c2 = n[2].client().await;
    c2.subscribe_raw("new", None, None).await;
    c2.subscribe_raw("flaps", None, None).await;

    broker.restart();
    for s in &n {
        ready_is(s, 200).await;
    }
    for channel in ["new", "flaps"] {
        c2.expect("pusher_internal:subscription_succeeded", Some(channel))
            .await;
    }
    rx.event("channel_vacated", "goes").await;
    rx.event("channel_occupied", "new").await;
    let mut bar = barrier_clients(&[&n[0], &n[1], &n[2]]).await;
    barrier(&rx, &mut bar, 1).await;
    for (name, channel, want) in [
        ("channel_occupied", "stays", 1),
        ("channel_vacated", "stays", 0),
        ("channel_occupied", "goes", 1),
        ("channel_vacated", "goes", 1),
        ("channel_occupied", "new", 1),
        ("channel_occupied", "flaps", 1),
        ("channel_vacated", "flaps", 0),
    ] {
        assert_eq!(
            rx.count(name, channel),
            want,
            "{name} {channel}: {:#?}",
            rx.events()
        );
    }
}
