//! The broker canary: a node whose broker stops delivering without closing
//! the connection (the server SIGSTOPped: sockets open, nothing comes back)
//! notices within its canary's interval and timeout, on Redis and NATS:
//! `/ready` answers 503 `BROKER DOWN`, `herald_broker_canary_failures_total`
//! and `herald_broker_up` say so, one warning names the canary, and the
//! node reconnects by itself: ready again and delivering once the server
//! answers, or, on a NATS cluster, at once on another server. A broker that
//! is only slow (its canaries come back late) makes the node not ready for
//! a while, and is not left: nothing sent meanwhile is lost.

use crate::common;

use common::{wait_ready, Client, Server, TIMEOUT};
use herald_broker::testing::{BrokerServer, Kind, NatsCluster};
use herald_broker::testing_delay::DelayRelay;
use std::time::Duration;

/// Nodes with a 1 s canary and a long TTL (so nothing but the canary can
/// explain a quick 503).
async fn node(url: &str, prefix: &str) -> Server {
    let top = format!(
        "[broker]\nurl = \"{url}\"\nprefix = \"{prefix}\"\nttl = 60\ncanary_interval = 1\ncanary_timeout = 1\n"
    );
    Server::start_with(&top, "").await
}

async fn subscribed(s: &Server) -> Client {
    let mut c = s.client().await;
    c.subscribe("news").await;
    c
}

/// Both nodes' clients hear an event from `from`, and nothing more.
async fn delivers(from: &Server, clients: &mut [&mut Client], tag: &str) {
    from.trigger("news", "e", tag).await;
    for c in clients.iter_mut() {
        assert_eq!(c.expect("e", Some("news")).await["data"], tag);
    }
    from.trigger("news", "marker", tag).await;
    for c in clients.iter_mut() {
        c.expect("marker", Some("news")).await;
    }
}

/// A broker of `kind`, two ready nodes on it, a client of each subscribed
/// to `news`, and an event from the first heard by both.
async fn two_nodes(kind: Kind, prefix: &str) -> (BrokerServer, Server, Server, Client, Client) {
    let broker = BrokerServer::start(kind);
    let a = node(&broker.url(), prefix).await;
    let b = node(&broker.url(), prefix).await;
    wait_ready(&a, 200, TIMEOUT).await;
    wait_ready(&b, 200, TIMEOUT).await;
    let (mut ca, mut cb) = (subscribed(&a).await, subscribed(&b).await);
    delivers(&a, &mut [&mut ca, &mut cb], "before").await;
    (broker, a, b, ca, cb)
}

both!(a_frozen_broker_is_noticed_and_left);
async fn a_frozen_broker_is_noticed_and_left(kind: Kind) {
    let (broker, a, b, mut ca, mut cb) = two_nodes(kind, "canary").await;
    assert_eq!(a.metric("herald_broker_canary_failures_total").await, 0);

    // Frozen: the sockets stay open, nothing is read or delivered. Neither
    // NATS's pings (5 s, two missed) nor Redis (no keep-alive) would tell
    // within 4 s; the canary (1 s + 1 s) does.
    broker.freeze(true);
    let took = wait_ready(&a, 503, Duration::from_secs(4)).await;
    wait_ready(&b, 503, Duration::from_secs(4)).await;
    assert_eq!(a.raw_api("GET", "/ready", "", "").await.1, "BROKER DOWN");
    assert!(a.metric("herald_broker_canary_failures_total").await >= 1);
    assert_eq!(a.metric("herald_broker_up").await, 0);
    let log = a.log();
    assert!(log.contains("broker canary not heard back"), "{log}");
    // Deaf for three rounds in a row (no canary at all, not even late):
    // the node leaves its connection by itself, while the server is still
    // frozen (neither NATS's pings nor Redis would have told it yet).
    until_logged(&a, "no canary heard back in 3 rounds; reconnecting").await;
    until_logged(&a, "broker connection lost; serving local clients").await;
    if kind == Kind::Nats {
        // On NATS it is the canary that leaves (NATS's own pings take
        // longer); Redis's commands time out about as soon.
        until_logged(&a, "error=\"broker canary not heard back\"").await;
    }
    // One warning per interval, not one per failed round: three failed.
    assert!(a.metric("herald_broker_canary_failures_total").await >= 3);
    assert_eq!(
        a.log()
            .matches("broker canary not heard back: this node")
            .count(),
        1,
        "{}",
        a.log()
    );

    // Back: both nodes reconnect by themselves and deliver exactly once.
    broker.freeze(false);
    let back = wait_ready(&a, 200, Duration::from_secs(20)).await;
    wait_ready(&b, 200, Duration::from_secs(20)).await;
    assert_eq!(a.metric("herald_broker_up").await, 1);
    delivers(&b, &mut [&mut ca, &mut cb], "after").await;
    eprintln!(
        "{}: frozen broker noticed after {took:?}; ready {back:?} after it was resumed",
        kind.name()
    );
}

/// Waits (at most 15 s) until `line` is in the node's log.
async fn until_logged(s: &Server, line: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !s.log().contains(line) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never logged {line:?}:\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (at most 30 s) until the node's canary failed `rounds` times.
async fn until_failed_rounds(s: &Server, rounds: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while s.metric("herald_broker_canary_failures_total").await < rounds {
        assert!(
            tokio::time::Instant::now() < deadline,
            "fewer than {rounds} failed canary rounds:\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A broker every canary of node a comes back from late (its link holds
/// each byte 700 ms each way, past the 1 s deadline): every round fails,
/// but each late canary shows the broker is there, so the node never
/// counts three deaf rounds and never leaves its connection; what is
/// published still reaches it. The rule is the canary's, the same for
/// every engine; on NATS a slow link delays each message by the link
/// alone (Redis's publishes, each waiting for its reply over a 1.4 s
/// round trip, fall further behind than any canary can tell).
#[tokio::test]
async fn a_broker_whose_every_canary_is_late_is_never_left() {
    let broker = BrokerServer::start(Kind::Nats);
    let port: u16 = broker
        .url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("the broker's port");
    let relay = DelayRelay::start(port, Duration::from_millis(700));
    let scheme = broker.url().split("://").next().unwrap().to_string();
    let a = node(&format!("{scheme}://127.0.0.1:{}", relay.port), "late").await;
    let b = node(&broker.url(), "late").await;
    wait_ready(&b, 200, TIMEOUT).await;
    // Twice the deaf limit in failed rounds, each followed by its late
    // canary.
    until_failed_rounds(&a, 6).await;
    assert!(
        !a.log().contains("broker canary silent"),
        "a slow broker was left:\n{}",
        a.log()
    );
    assert_eq!(a.metric("herald_broker_outages_total").await, 0);
    let mut ca = a.client().await;
    ca.subscribe("news").await;
    b.trigger("news", "e", "late").await;
    assert_eq!(ca.expect("e", Some("news")).await["data"], "late");
}

both!(a_slow_broker_is_waited_for_not_left);
async fn a_slow_broker_is_waited_for_not_left(kind: Kind) {
    let (broker, a, b, mut ca, mut cb) = two_nodes(kind, "slow").await;
    let outages = (
        a.metric("herald_broker_outages_total").await,
        b.metric("herald_broker_outages_total").await,
    );

    // Stopped until node a's canary has failed once, then going again: the
    // canary comes back late, as from a starved broker.
    broker.freeze(true);
    wait_ready(&a, 503, Duration::from_secs(4)).await;
    // Sent while the broker is stopped: they wait in its socket.
    for k in 0..5 {
        b.trigger("news", "e", &format!("during-{k}")).await;
    }
    broker.freeze(false);
    wait_ready(&a, 200, TIMEOUT).await;
    wait_ready(&b, 200, TIMEOUT).await;
    // Nothing was lost to a reconnect: every event reaches both clients.
    for c in [&mut ca, &mut cb] {
        for k in 0..5 {
            assert_eq!(
                c.expect("e", Some("news")).await["data"],
                format!("during-{k}")
            );
        }
    }
    delivers(&b, &mut [&mut ca, &mut cb], "after").await;
    // Neither node left its connection.
    assert_eq!(
        (
            a.metric("herald_broker_outages_total").await,
            b.metric("herald_broker_outages_total").await,
        ),
        outages,
        "{}",
        a.log()
    );
    assert!(a.metric("herald_broker_canary_failures_total").await >= 1);
}

/// On a NATS cluster, the node whose server froze moves to another server
/// while that one is still frozen, and hears the others again.
#[tokio::test]
async fn a_node_leaves_a_frozen_nats_server_for_another() {
    let cluster = NatsCluster::start(3, false);
    let n0 = node(&cluster.url(0), "canary-cluster").await;
    let n1 = node(&cluster.url(1), "canary-cluster").await;
    wait_ready(&n0, 200, TIMEOUT).await;
    wait_ready(&n1, 200, TIMEOUT).await;
    let (mut c0, mut c1) = (subscribed(&n0).await, subscribed(&n1).await);
    delivers(&n1, &mut [&mut c0, &mut c1], "before").await;

    cluster.freeze(0, true);
    let took = wait_ready(&n0, 503, Duration::from_secs(4)).await;
    // n1's server is fine: it stays ready throughout.
    assert_eq!(n1.raw_api("GET", "/ready", "", "").await.0, 200);
    // A reconnect may try the frozen server first (5 s connect timeout).
    let moved = wait_ready(&n0, 200, Duration::from_secs(20)).await;
    assert!(n0.metric("herald_broker_canary_failures_total").await >= 1);
    delivers(&n1, &mut [&mut c0, &mut c1], "moved").await;
    delivers(&n0, &mut [&mut c0, &mut c1], "from-moved").await;
    eprintln!("nats cluster: frozen server noticed after {took:?}; node on another server {moved:?} later");
    cluster.freeze(0, false);
}
