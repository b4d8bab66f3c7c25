//! The occupancy tally in a cluster (crates/broker/src/tally.rs): only the
//! leader and its successor keep the other nodes' channels and members
//! (`herald_cluster_tally_keys`), the successor takes over when the leader
//! is SIGKILLed or stopped with no webhook lost or doubled, and a node
//! that becomes a keeper without a tally rebuilds it from every node's set
//! before it reports. Real `herald serve` processes on a real redis-server or
//! nats-server, webhooks to a receiver in the test.

use crate::common;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use common::*;
use herald_broker::testing::{BrokerServer, Kind};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::Notify;

/// Every webhook event a loopback receiver got.
#[derive(Clone, Default)]
struct Receiver {
    events: Arc<Mutex<Vec<Value>>>,
    arrived: Arc<Notify>,
}

impl Receiver {
    async fn start() -> (Receiver, String) {
        let rx = Receiver::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks", listener.local_addr().unwrap());
        let app = Router::new()
            .route(
                "/hooks",
                post(|State(rx): State<Receiver>, body: String| async move {
                    let v: Value = serde_json::from_str(&body).expect("webhook body is JSON");
                    let events = v["events"].as_array().expect("events").clone();
                    rx.events.lock().unwrap().extend(events);
                    rx.arrived.notify_waiters();
                    StatusCode::OK
                }),
            )
            .with_state(rx.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (rx, url)
    }

    /// One line per event so far (for failure messages).
    fn dump(&self) -> String {
        self.events
            .lock()
            .unwrap()
            .iter()
            .map(|e| format!("{} {} {}\n", e["name"], e["channel"], e["user_id"]))
            .collect()
    }

    /// How many events named `name` on `channel` (for `user`, if given).
    fn count(&self, name: &str, channel: &str, user: Option<&str>) -> usize {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| {
                e["name"] == name
                    && e["channel"] == channel
                    && user.is_none_or(|u| e["user_id"] == u)
            })
            .count()
    }

    /// Wait until at least one such event arrived.
    async fn wait(&self, name: &str, channel: &str, user: Option<&str>) {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let notified = self.arrived.notified();
            if self.count(name, channel, user) > 0 {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "no {name} on {channel} ({user:?}); got\n{}",
                self.dump()
            );
            let _ = tokio::time::timeout(left, notified).await;
        }
    }

    /// Each node left alive sends a client event after whatever it queued
    /// before: once they arrived, so has every earlier webhook of theirs.
    async fn barrier(&self, clients: &mut [Client], round: usize) {
        for (i, c) in clients.iter_mut().enumerate() {
            let event = format!("client-b{round}-{i}");
            c.send(json!({"event": event, "channel": "private-barrier", "data": {}}))
                .await;
        }
        for i in 0..clients.len() {
            let deadline = Instant::now() + TIMEOUT;
            let name = format!("client-b{round}-{i}");
            loop {
                let notified = self.arrived.notified();
                let got = self
                    .events
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|e| e["name"] == "client_event" && e["event"] == name.as_str());
                if got {
                    break;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                assert!(!left.is_zero(), "barrier {name} never came");
                let _ = tokio::time::timeout(left, notified).await;
            }
        }
    }
}

/// `n` nodes on `broker_url`, started one after the other (so node 0 is
/// the oldest: the leader; node 1 its successor), webhooks to `url`.
async fn cluster(broker_url: &str, url: &str, prefix: &str, ttl: u64, n: usize) -> Vec<Server> {
    let top = format!(
        "webhook_batch_ms = 20\nwebhook_leave_delay_ms = 0\n\
         [broker]\nurl = \"{broker_url}\"\nprefix = \"{prefix}\"\nttl = {ttl}\n"
    );
    let app = format!(
        "webhooks = [{{ url = \"{url}\", event_types = [\"channel_occupied\", \"channel_vacated\", \
         \"member_added\", \"member_removed\", \"client_event\"] }}]\n"
    );
    let mut nodes = Vec::new();
    for _ in 0..n {
        nodes.push(Server::start_with(&top, &app).await);
    }
    nodes
}

/// Wait until node `s` keeps exactly `want` of the other nodes' keys.
async fn tally_keys(s: &Server, want: u64) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let got = s.metric("herald_cluster_tally_keys").await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "herald_cluster_tally_keys stayed {got}, want {want}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

both!(the_successor_takes_over_and_bystanders_keep_no_tally);
async fn the_successor_takes_over_and_bystanders_keep_no_tally(kind: Kind) {
    let broker = BrokerServer::start(kind);
    let (rx, url) = Receiver::start().await;
    let mut n = cluster(&broker.url(), &url, "tally-succ", 2, 3).await;

    // Node 0 (leader) holds a channel and a member of its own; node 1
    // (successor) and node 2 (neither) share a channel and have one each.
    let mut c0 = n[0].client().await;
    c0.subscribe("only-0").await;
    c0.subscribe_presence("presence-t", "u0", json!({})).await;
    let mut c1 = n[1].client().await;
    c1.subscribe("only-1").await;
    c1.subscribe("shared").await;
    let mut c2 = n[2].client().await;
    c2.subscribe("only-2").await;
    c2.subscribe("shared").await;
    c2.subscribe_presence("presence-t", "u2", json!({})).await;
    for ch in ["only-0", "only-1", "only-2", "shared", "presence-t"] {
        rx.wait("channel_occupied", ch, None).await;
    }
    rx.wait("member_added", "presence-t", Some("u0")).await;
    rx.wait("member_added", "presence-t", Some("u2")).await;

    // Keys: node 0 has 3 (only-0, presence-t, its member u0), node 1 has
    // 2, node 2 has 4 (only-2, shared, presence-t, u2).
    tally_keys(&n[0], 2 + 4).await;
    tally_keys(&n[1], 3 + 4).await;
    // Node 2 heard the same messages, and keeps none of them.
    assert_eq!(n[2].metric("herald_cluster_tally_keys").await, 0);

    // The successor replays what changed since it last heard from the
    // leader (what the leader may not have lived to report): the leader
    // reported all of the above, so let it speak once more after them,
    // with a change that flips nothing (the successor counting its key is
    // the sign it heard it).
    let mut sync0 = n[0].client().await;
    sync0.subscribe("shared").await;
    tally_keys(&n[1], 4 + 4).await;

    // SIGKILL the leader: the successor reports what it held, once.
    n[0].child.kill().unwrap();
    rx.wait("channel_vacated", "only-0", None).await;
    rx.wait("member_removed", "presence-t", Some("u0")).await;
    // Node 2 is the successor now: it asked every node for its set.
    tally_keys(&n[2], 2).await;
    tally_keys(&n[1], 4).await;
    let mut after = n[2].client().await;
    after.subscribe("after").await;
    rx.wait("channel_occupied", "after", None).await;

    // The same for the new leader, before node 2 takes over from it.
    c1.subscribe("after").await;
    tally_keys(&n[2], 3).await;

    // SIGKILL the new leader: node 2 takes over with its rebuilt tally.
    n[1].child.kill().unwrap();
    rx.wait("channel_vacated", "only-1", None).await;
    // It reports from then on.
    c2.unsubscribe("only-2").await;
    rx.wait("channel_vacated", "only-2", None).await;
    let mut bar = n[2].client().await;
    bar.subscribe_private("private-barrier").await;
    rx.barrier(std::slice::from_mut(&mut bar), 1).await;

    for (name, ch, want) in [
        ("channel_occupied", "only-0", 1),
        ("channel_occupied", "only-1", 1),
        ("channel_occupied", "only-2", 1),
        ("channel_occupied", "shared", 1),
        ("channel_occupied", "presence-t", 1),
        ("channel_occupied", "after", 1),
        ("channel_vacated", "only-0", 1),
        ("channel_vacated", "only-1", 1),
        ("channel_vacated", "only-2", 1),
        ("channel_vacated", "shared", 0),
        ("channel_vacated", "presence-t", 0),
        ("channel_vacated", "after", 0),
    ] {
        assert_eq!(
            rx.count(name, ch, None),
            want,
            "{name} {ch}:\n{}",
            rx.dump()
        );
    }
    assert_eq!(rx.count("member_added", "presence-t", Some("u0")), 1);
    assert_eq!(rx.count("member_added", "presence-t", Some("u2")), 1);
    assert_eq!(rx.count("member_removed", "presence-t", Some("u0")), 1);
    assert_eq!(rx.count("member_removed", "presence-t", Some("u2")), 0);
}

/// Read `c`'s frames until it has seen `member_removed` of every user.
async fn removed(c: &mut Client, users: &[&str]) {
    let mut left: Vec<&str> = users.to_vec();
    while !left.is_empty() {
        let f = c.recv().await;
        if f["event"] == "pusher_internal:member_removed" {
            let d = data(&f);
            left.retain(|u| d["user_id"] != *u);
        }
    }
}

both!(a_leader_without_a_tally_rebuilds_before_it_reports);
async fn a_leader_without_a_tally_rebuilds_before_it_reports(kind: Kind) {
    let broker = BrokerServer::start(kind);
    let (rx, url) = Receiver::start().await;
    let mut n = cluster(&broker.url(), &url, "tally-both", 2, 4).await;
    // A member of presence-w on each node: nodes 2 and 3 see the others'
    // members removed when they declare them gone.
    let mut p = Vec::new();
    for (i, s) in n.iter().enumerate() {
        let mut c = s.client().await;
        c.subscribe_presence("presence-w", &format!("w{i}"), json!({}))
            .await;
        p.push(c);
    }
    let mut c3 = n[3].client().await;
    c3.subscribe("x3").await;
    c3.subscribe("kept").await;
    let mut c2 = n[2].client().await;
    c2.subscribe("kept").await;
    rx.wait("channel_occupied", "x3", None).await;
    rx.wait("channel_occupied", "kept", None).await;
    rx.wait("member_added", "presence-w", Some("w3")).await;
    assert_eq!(n[2].metric("herald_cluster_tally_keys").await, 0);
    assert_eq!(n[3].metric("herald_cluster_tally_keys").await, 0);

    // Leader and successor die together: once node 2 and node 3 have
    // declared both gone, node 2 leads and node 3 follows; each keeps the
    // other's keys once it has asked for them (node 2: presence-w, w2,
    // kept; node 3: those with w3, and x3).
    n[0].child.kill().unwrap();
    n[1].child.kill().unwrap();
    removed(&mut p[2], &["w0", "w1"]).await;
    removed(&mut p[3], &["w0", "w1"]).await;
    tally_keys(&n[2], 4).await;
    tally_keys(&n[3], 3).await;

    // Node 2 knows node 3 still holds `kept`: node 2 leaving it is no
    // vacating; node 3 leaving `x3` is.
    c2.unsubscribe("kept").await;
    c3.unsubscribe("x3").await;
    rx.wait("channel_vacated", "x3", None).await;
    c3.subscribe("y3").await;
    rx.wait("channel_occupied", "y3", None).await;
    let mut bar = Vec::new();
    for s in &n[2..] {
        let mut c = s.client().await;
        c.subscribe_private("private-barrier").await;
        bar.push(c);
    }
    rx.barrier(&mut bar, 1).await;
    for (name, ch, want) in [
        ("channel_occupied", "x3", 1),
        ("channel_occupied", "kept", 1),
        ("channel_occupied", "y3", 1),
        ("channel_occupied", "presence-w", 1),
        ("channel_vacated", "x3", 1),
        ("channel_vacated", "kept", 0),
        ("channel_vacated", "presence-w", 0),
    ] {
        assert_eq!(
            rx.count(name, ch, None),
            want,
            "{name} {ch}:\n{}",
            rx.dump()
        );
    }
    for u in ["w2", "w3"] {
        assert_eq!(rx.count("member_added", "presence-w", Some(u)), 1);
        assert_eq!(rx.count("member_removed", "presence-w", Some(u)), 0);
    }
}

both!(a_leader_that_stops_hands_over_to_its_successor);
async fn a_leader_that_stops_hands_over_to_its_successor(kind: Kind) {
    let broker = BrokerServer::start(kind);
    let (rx, url) = Receiver::start().await;
    // A long TTL: a graceful stop is seen at once, not after it.
    let mut n = cluster(&broker.url(), &url, "tally-stop", 30, 3).await;
    let mut c = Vec::new();
    for (i, s) in n.iter().enumerate() {
        let mut k = s.client().await;
        k.subscribe(&format!("only-{i}")).await;
        c.push(k);
    }
    for i in 0..3 {
        rx.wait("channel_occupied", &format!("only-{i}"), None)
            .await;
    }
    assert_eq!(n[2].metric("herald_cluster_tally_keys").await, 0);

    // SIGTERM the leader: its clients leave (reported by it), it says
    // goodbye, the successor leads and node 2 asks for the sets.
    assert_eq!(unsafe { libc::kill(n[0].pid(), libc::SIGTERM) }, 0);
    n[0].wait_exit().await;
    rx.wait("channel_vacated", "only-0", None).await;
    tally_keys(&n[2], 1).await;
    tally_keys(&n[1], 1).await;

    // The new leader reports; then it stops too and node 2 takes over.
    let mut k2 = c.pop().unwrap();
    k2.unsubscribe("only-2").await;
    rx.wait("channel_vacated", "only-2", None).await;
    assert_eq!(unsafe { libc::kill(n[1].pid(), libc::SIGTERM) }, 0);
    n[1].wait_exit().await;
    rx.wait("channel_vacated", "only-1", None).await;
    k2.subscribe("after").await;
    rx.wait("channel_occupied", "after", None).await;
    let mut bar = n[2].client().await;
    bar.subscribe_private("private-barrier").await;
    rx.barrier(std::slice::from_mut(&mut bar), 1).await;
    for (name, ch, want) in [
        ("channel_occupied", "only-0", 1),
        ("channel_occupied", "only-1", 1),
        ("channel_occupied", "only-2", 1),
        ("channel_occupied", "after", 1),
        ("channel_vacated", "only-0", 1),
        ("channel_vacated", "only-1", 1),
        ("channel_vacated", "only-2", 1),
    ] {
        assert_eq!(
            rx.count(name, ch, None),
            want,
            "{name} {ch}:\n{}",
            rx.dump()
        );
    }
}
