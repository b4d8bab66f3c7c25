//! Three real `herald serve` processes on a real `redis-server` or
//! `nats-server` (started here on free loopback ports), with WebSocket
//! clients on every node: a node SIGKILLed has its members removed
//! everywhere within the heartbeat TTL, a node stopped gracefully at once,
//! and the broker killed and restarted mid-run stops and resumes delivery
//! without restarting Herald, with `/ready` and `/metrics` showing the
//! outage. Every test runs on both brokers. (conformance/tests/cluster
//! drives the same cluster with pusher-js and the `pusher` SDK.)

use crate::common;

use common::{api_users, users_everywhere, wait_ready, Client, Server, TIMEOUT};
use herald_broker::testing::{BrokerServer, Kind};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

async fn nodes(broker: &BrokerServer, n: usize, ttl: u64, prefix: &str) -> Vec<Server> {
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"{prefix}\"\nttl = {ttl}\n",
        broker.url()
    );
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(Server::start_with(&top, "").await);
    }
    // /ready answers 200 only once a node is connected to the broker and
    // has heard the others; the last to start has heard everyone, and the
    // earlier ones heard it say hello.
    for s in &out {
        wait_ready(s, 200, TIMEOUT).await;
    }
    out
}

async fn ready(s: &Server) -> (u16, String) {
    let (status, body) = s.raw_api("GET", "/ready", "", "").await;
    (status, body.as_str().unwrap_or_default().to_owned())
}

/// Sign a client in as `id` (pusher:signin).
async fn sign_in(c: &mut Client, id: &str) {
    let user_data = json!({ "id": id }).to_string();
    let auth = herald_pusher::signing::token(
        common::APP_KEY,
        common::APP_SECRET,
        &herald_pusher::signing::user_string(&c.socket_id, &user_data),
    );
    c.send(json!({ "event": "pusher:signin", "data": { "auth": auth, "user_data": user_data } }))
        .await;
    c.expect("pusher:signin_success", None).await;
}

async fn member_event(c: &mut Client, event: &str) -> Value {
    let f = c.expect(event, Some("presence-room")).await;
    common::data(&f)
}

both!(sigkilled_node_leaves_within_the_ttl);
async fn sigkilled_node_leaves_within_the_ttl(kind: Kind) {
    let broker = BrokerServer::start(kind);
    let ttl = 2;
    let mut n = nodes(&broker, 3, ttl, "kill").await;
    let mut obs = n[0].client().await;
    obs.subscribe_presence("presence-room", "obs", json!({}))
        .await;
    let mut other = n[1].client().await;
    other
        .subscribe_presence("presence-room", "other", json!({}))
        .await;
    member_event(&mut obs, "pusher_internal:member_added").await;
    let mut doomed = n[2].client().await;
    doomed
        .subscribe_presence("presence-room", "doomed", json!({ "n": 1 }))
        .await;
    assert_eq!(
        member_event(&mut obs, "pusher_internal:member_added").await["user_id"],
        "doomed"
    );
    assert_eq!(
        member_event(&mut other, "pusher_internal:member_added").await["user_id"],
        "doomed"
    );
    users_everywhere(
        &[&n[0], &n[1], &n[2]],
        "presence-room",
        &["doomed", "obs", "other"],
        TIMEOUT,
    )
    .await;

    // SIGKILL: no goodbye, no cleanup. The others notice within the TTL
    // (heartbeats every third of it) and remove its member, once each.
    n[2].child.kill().unwrap();
    let t0 = Instant::now();
    let gone = member_event(&mut obs, "pusher_internal:member_removed").await;
    assert_eq!(gone["user_id"], "doomed");
    let gone = member_event(&mut other, "pusher_internal:member_removed").await;
    assert_eq!(gone["user_id"], "doomed");
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(ttl) + Duration::from_millis(1500),
        "removed after {took:?} (TTL {ttl} s)"
    );
    users_everywhere(&[&n[0], &n[1]], "presence-room", &["obs", "other"], TIMEOUT).await;
    // Once: a marker published afterwards is the next frame.
    n[1].trigger("presence-room", "marker", "m").await;
    obs.expect("marker", Some("presence-room")).await;
    drop(doomed);
    let _ = n.pop();
}

both!(graceful_stop_removes_members_at_once);
async fn graceful_stop_removes_members_at_once(kind: Kind) {
    let broker = BrokerServer::start(kind);
    // A long TTL: a removal within a few seconds is the goodbye, not it.
    let mut n = nodes(&broker, 3, 30, "stop").await;
    let mut obs = n[0].client().await;
    obs.subscribe_presence("presence-room", "obs", json!({}))
        .await;
    let mut leaving = n[2].client().await;
    leaving
        .subscribe_presence("presence-room", "leaving", json!({}))
        .await;
    assert_eq!(
        member_event(&mut obs, "pusher_internal:member_added").await["user_id"],
        "leaving"
    );
    unsafe {
        libc::kill(n[2].pid(), libc::SIGTERM);
    }
    let t0 = Instant::now();
    leaving.expect_closed_with(4200).await;
    let gone = member_event(&mut obs, "pusher_internal:member_removed").await;
    assert_eq!(gone["user_id"], "leaving");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(n[2].wait_exit().await.success());
    users_everywhere(&[&n[0], &n[1]], "presence-room", &["obs"], TIMEOUT).await;
    let _ = n.pop();
}

both!(broker_outage_and_recovery);
async fn broker_outage_and_recovery(kind: Kind) {
    let mut broker = BrokerServer::start(kind);
    let n = nodes(&broker, 3, 30, "outage").await;
    let mut clients = Vec::new();
    for s in &n {
        let mut c = s.client().await;
        c.subscribe("news").await;
        clients.push(c);
    }
    n[0].trigger("news", "before", "1").await;
    for c in &mut clients {
        assert_eq!(c.expect("before", Some("news")).await["data"], "1");
    }
    assert_eq!(n[1].metric("herald_broker_up").await, 1);
    let outages = n[1].metric("herald_broker_outages_total").await;

    broker.kill();
    for s in &n {
        wait_ready(s, 503, TIMEOUT).await;
        assert_eq!(ready(s).await.1, "BROKER DOWN");
        assert_eq!(s.metric("herald_broker_up").await, 0);
    }
    assert!(n[1].metric("herald_broker_outages_total").await > outages);
    // Each node keeps serving its own clients; what is for the others is
    // held in its outbox.
    for (i, s) in n.iter().enumerate() {
        s.trigger("news", "during", &i.to_string()).await;
        let f = clients[i].expect("during", Some("news")).await;
        assert_eq!(f["data"], i.to_string());
        assert_eq!(s.metric("herald_broker_outbox").await, 1);
    }

    // Back: every node reconnects by itself, subscribes again, sends its
    // outbox, and delivery resumes everywhere, exactly once.
    broker.restart();
    for s in &n {
        wait_ready(s, 200, TIMEOUT).await;
        assert_eq!(s.metric("herald_broker_up").await, 1);
    }
    for (i, s) in n.iter().enumerate() {
        s.trigger("news", "after", &i.to_string()).await;
    }
    for (k, c) in clients.iter_mut().enumerate() {
        let mut got: Vec<String> = Vec::new();
        for _ in 0..5 {
            let f = c.recv().await;
            assert_eq!(f["channel"], "news", "{f}");
            got.push(format!(
                "{}:{}",
                f["event"].as_str().unwrap(),
                f["data"].as_str().unwrap()
            ));
        }
        got.sort();
        let mut want: Vec<String> = (0..3).map(|i| format!("after:{i}")).collect();
        want.extend((0..3).filter(|i| *i != k).map(|i| format!("during:{i}")));
        want.sort();
        assert_eq!(got, want);
    }
    // And nothing twice: a marker is the next frame.
    n[2].trigger("news", "marker", "m").await;
    for c in &mut clients {
        c.expect("marker", Some("news")).await;
    }
}

both!(channel_figures_agree_on_every_node);
async fn channel_figures_agree_on_every_node(kind: Kind) {
    let broker = BrokerServer::start(kind);
    let n = nodes(&broker, 3, 30, "figures").await;
    let mut keep = Vec::new();
    for (i, s) in n.iter().enumerate() {
        for _ in 0..=i {
            let mut c = s.client().await;
            c.subscribe("shared").await;
            keep.push(c);
        }
    }
    let mut a = n[0].client().await;
    sign_in(&mut a, "u1").await;
    a.subscribe_presence("presence-room", "u1", json!({})).await;
    let mut b = n[1].client().await;
    sign_in(&mut b, "u1").await;
    b.subscribe_presence("presence-room", "u1", json!({})).await;
    let mut c = n[2].client().await;
    c.subscribe_presence("presence-room", "u2", json!({})).await;
    for s in &n {
        let (_, ch) = s.api("GET", "/apps/test-app/channels/shared", "").await;
        assert_eq!(ch["occupied"], true, "{ch}");
        let (_, p) = s
            .api("GET", "/apps/test-app/channels/presence-room", "")
            .await;
        assert_eq!(p["occupied"], true);
        let (_, list) = s.api("GET", "/apps/test-app/channels", "").await;
        let names: Vec<&String> = list["channels"].as_object().unwrap().keys().collect();
        assert_eq!(names, ["presence-room", "shared"], "{list}");
        assert_eq!(api_users(s, "presence-room").await, ["u1", "u2"]);
    }
    // Terminating u1 from the node where it has no socket closes both.
    let (status, _) = n[2]
        .api(
            "POST",
            "/apps/test-app/users/u1/terminate_connections",
            "{}",
        )
        .await;
    assert_eq!(status, 200);
    for c in [&mut a, &mut b] {
        // Member events may come first; then the error and the close.
        loop {
            let f = c.recv().await;
            if f["event"] == "pusher:error" {
                assert_eq!(f["data"]["code"], 4009, "{f}");
                break;
            }
        }
        c.expect_close(4009).await;
    }
    users_everywhere(&[&n[0], &n[1], &n[2]], "presence-room", &["u2"], TIMEOUT).await;
    drop((a, b, c, keep));
}

both!(acknowledged_publishes_survive_broker_restarts);
/// An acknowledgement is true: every event the HTTP API answered 2xx for
/// reaches every subscriber on every node exactly once and in order,
/// though the broker is SIGKILLed
/// twice mid-stream (back after 1 s, then after 3 s). Events go to node
/// 0 every 20 ms; subscribers on node 1 hear them only through the broker.
async fn acknowledged_publishes_survive_broker_restarts(kind: Kind) {
    const EVENTS: usize = 300;
    let mut broker = BrokerServer::start(kind);
    let n = nodes(&broker, 2, 30, "acked").await;
    let mut subs = Vec::new();
    for s in &n {
        for _ in 0..2 {
            let mut c = s.client().await;
            c.subscribe("feed").await;
            subs.push(c);
        }
    }
    // (event index at which the broker dies, how long it stays away)
    let outages = [(60, Duration::from_secs(1)), (180, Duration::from_secs(3))];
    let mut down: Option<(Instant, Duration)> = None;
    let mut acked = std::collections::BTreeSet::new();
    let path = format!("/apps/{}/events", common::APP_ID);
    for i in 0..EVENTS {
        if let Some((_, away)) = outages.iter().find(|(at, _)| *at == i) {
            broker.kill();
            down = Some((Instant::now(), *away));
        }
        if let Some((since, away)) = down {
            if since.elapsed() >= away {
                broker.restart();
                down = None;
            }
        }
        let body = json!({ "name": "e", "channel": "feed", "data": i.to_string() }).to_string();
        let (status, _) = n[0].api("POST", &path, &body).await;
        if (200..300).contains(&status) {
            acked.insert(i.to_string());
        } else {
            assert_eq!(status, 503, "a refusal is 503");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if down.is_some() {
        broker.restart();
    }
    // This load fits the outbox: nothing is refused.
    assert_eq!(acked.len(), EVENTS);
    for s in &n {
        wait_ready(s, 200, TIMEOUT).await;
    }
    // Each subscriber reads until it holds every acknowledged event (or
    // hears nothing for 5 s); then an end marker: an event before it is a
    // second copy.
    let mut report = Vec::new();
    for (k, c) in subs.iter_mut().enumerate() {
        let mut got: Vec<String> = Vec::new();
        let mut unique = std::collections::BTreeSet::new();
        while !acked.is_subset(&unique) {
            let Ok(f) = tokio::time::timeout(Duration::from_secs(5), c.recv()).await else {
                break;
            };
            assert_eq!(f["event"], "e", "unexpected frame {f}");
            let d = f["data"].as_str().unwrap().to_owned();
            unique.insert(d.clone());
            got.push(d);
        }
        report.push((k, got, unique));
    }
    n[0].trigger("feed", "end", "m").await;
    for (c, (_, got, unique)) in subs.iter_mut().zip(report.iter_mut()) {
        loop {
            let f = c.recv().await;
            if f["event"] == "end" {
                break;
            }
            let d = f["data"].as_str().unwrap().to_owned();
            unique.insert(d.clone());
            got.push(d);
        }
    }
    let lost: Vec<String> = report
        .iter()
        .map(|(k, got, unique)| {
            format!(
                "subscriber {k} (node {}): {} missing, {} duplicated",
                k / 2,
                acked.difference(unique).count(),
                got.len() - unique.len()
            )
        })
        .collect();
    assert!(
        report
            .iter()
            .all(|(_, got, unique)| acked.is_subset(unique) && got.len() == unique.len()),
        "{lost:#?}"
    );
    // In the order they were published: what a node recovered after the
    // outage came before what the publisher sent after it.
    for (k, got, _) in &report {
        let order: Vec<usize> = got.iter().map(|d| d.parse().unwrap()).collect();
        let late = order.windows(2).filter(|w| w[0] > w[1]).count();
        assert_eq!(late, 0, "subscriber {k}: out of order: {order:?}");
    }
}

/// `[broker]` for a node of `broker` whose confirmations wait at most
/// `confirm` seconds.
fn waiting_top(broker: &BrokerServer, prefix: &str, confirm: u64) -> String {
    format!(
        "[broker]\nurl = \"{}\"\nprefix = \"{prefix}\"\nttl = 30\nconfirm_timeout = {confirm}\n",
        broker.url()
    )
}

/// Wait until `s`'s counter `name` is at least `want`.
async fn until_metric(s: &Server, name: &str, want: u64) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let got = common::metric_in(&s.scrape().await, name, &[]).unwrap_or(0);
        if got >= want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} stayed at {got} (want {want})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Nothing arrives for `c` within a short while.
async fn nothing_yet(c: &mut Client) {
    if let Ok(f) = tokio::time::timeout(Duration::from_millis(300), c.recv()).await {
        panic!("a frame arrived while the broker was away: {f}");
    }
}

/// `n` events triggered through `from` right after a confirmation all
/// reach `c`, in order.
async fn every_event_arrives(from: &Server, c: &mut Client, channel: &str, n: usize) {
    for i in 0..n {
        from.trigger(channel, "e", &i.to_string()).await;
    }
    for i in 0..n {
        let f = c.expect("e", Some(channel)).await;
        assert_eq!(f["data"], i.to_string(), "{f}");
    }
}

// A confirmation is true: a node started before its broker is up confirms a
// subscription only once the broker holds the interest, so events
// published through another node right after the confirmation all arrive.
both!(confirmation_waits_for_a_broker_not_up_yet);
async fn confirmation_waits_for_a_broker_not_up_yet(kind: Kind) {
    let mut broker = BrokerServer::start(kind);
    broker.kill();
    let top = waiting_top(&broker, "late", 30);
    let late = Server::start_serving(&top, "").await;
    assert_eq!(ready(&late).await, (503, "BROKER DOWN".to_owned()));
    let mut c = late.client().await;
    c.subscribe_raw("news", None, None).await;
    // The confirmation waits (counted), and nothing is sent meanwhile.
    until_metric(&late, "herald_confirmations_held_total", 1).await;
    nothing_yet(&mut c).await;

    broker.restart();
    let first = Server::start_with(&top, "").await;
    c.expect("pusher_internal:subscription_succeeded", Some("news"))
        .await;
    every_event_arrives(&first, &mut c, "news", 50).await;
}

// After `broker.confirm_timeout` without a broker the client gets the
// retryable `pusher:subscription_error` (503), never a confirmation; the
// same subscribe once the broker is back is confirmed and true.
both!(confirmation_gives_up_after_the_bound);
async fn confirmation_gives_up_after_the_bound(kind: Kind) {
    let mut broker = BrokerServer::start(kind);
    broker.kill();
    let top = waiting_top(&broker, "bound", 1);
    let late = Server::start_serving(&top, "").await;
    let mut c = late.client().await;
    let t0 = Instant::now();
    c.subscribe_raw("news", None, None).await;
    let f = c.expect("pusher:subscription_error", Some("news")).await;
    let took = t0.elapsed();
    assert_eq!(common::data(&f)["status"], 503, "{f}");
    assert_eq!(common::data(&f)["type"], "ServiceUnavailable", "{f}");
    assert!(took >= Duration::from_millis(900), "gave up after {took:?}");
    until_metric(&late, "herald_confirmations_refused_total", 1).await;
    // A signed-in user's own channel too: events for the user come from
    // other nodes through the broker.
    sign_in(&mut c, "u1").await;
    c.subscribe_raw("#server-to-user-u1", None, None).await;
    let f = c
        .expect("pusher:subscription_error", Some("#server-to-user-u1"))
        .await;
    assert_eq!(common::data(&f)["status"], 503, "{f}");

    broker.restart();
    let first = Server::start_with(&top, "").await;
    wait_ready(&late, 200, TIMEOUT).await;
    c.subscribe("news").await;
    every_event_arrives(&first, &mut c, "news", 20).await;
    c.subscribe("#server-to-user-u1").await;
}

// The broker stops and comes back under running nodes: a subscription
// made meanwhile, to a channel new to the node or to one it already
// receives, is confirmed only once the broker holds it again.
both!(confirmation_waits_while_the_broker_restarts);
async fn confirmation_waits_while_the_broker_restarts(kind: Kind) {
    let mut broker = BrokerServer::start(kind);
    let top = waiting_top(&broker, "restart", 30);
    let a = Server::start_with(&top, "").await;
    let b = Server::start_with(&top, "").await;
    let mut held = b.client().await;
    held.subscribe("held").await;

    broker.kill();
    wait_ready(&b, 503, TIMEOUT).await;
    let mut fresh = b.client().await;
    fresh.subscribe_raw("fresh", None, None).await;
    let mut again = b.client().await;
    again.subscribe_raw("held", None, None).await;
    until_metric(&b, "herald_confirmations_held_total", 2).await;
    nothing_yet(&mut fresh).await;
    nothing_yet(&mut again).await;

    broker.restart();
    fresh
        .expect("pusher_internal:subscription_succeeded", Some("fresh"))
        .await;
    again
        .expect("pusher_internal:subscription_succeeded", Some("held"))
        .await;
    wait_ready(&a, 200, TIMEOUT).await;
    every_event_arrives(&a, &mut fresh, "fresh", 20).await;
    every_event_arrives(&a, &mut again, "held", 20).await;
}
