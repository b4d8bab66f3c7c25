//! `herald bench broadcast --protocol actioncable` and `connect --protocol
//! actioncable` at tiny scale against a real herald whose RPC app is a real
//! `herald bench rpc-server` process: every client connects and subscribes,
//! every broadcast reaches every other subscriber (counts, never speeds).

use crate::common;

use common::{bench_target, herald_with_bench_app, Server};
use herald_bench::broadcast::{self, BroadcastParams, Via};
use herald_bench::connect::{self, ConnectParams};
use herald_bench::idle::{self, IdleParams};
use herald_bench::proto::Proto;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_over_action_cable_delivers_everything() {
    let (server, _app) = herald_with_bench_app("", "").await;
    let mut p = BroadcastParams::new(bench_target(&server));
    p.protocol = Proto::ActionCable;
    p.peak = 8;
    p.duration = Duration::from_secs(3);
    p.lifetime = Duration::from_millis(1500);
    p.sender_every = 2;
    p.send_probability = 1.0;
    p.grace = Duration::from_millis(1000);
    p.progress = false;
    p.server_pid = Some(server.child.id());
    let r = broadcast::run(&p).await.unwrap();
    let text = r.summary();
    assert!(r.count("ws_sessions") >= 8, "{text}");
    let sent = r.count("ws_msgs_sent");
    assert!(sent > 10, "{text}");
    let expected = r.count("deliveries_expected");
    assert!(expected > sent, "{text}");
    assert_eq!(r.count("deliveries_received"), expected, "{text}");
    assert_eq!(r.count("deliveries_lost"), 0, "{text}");
    assert_eq!(r.count("deliveries_duplicated"), 0, "{text}");
    assert_eq!(r.count("deliveries_unexpected"), 0, "{text}");
    assert_eq!(r.count("connection_errors"), 0, "{text}");
    assert_eq!(r.count("server_errors"), 0, "{text}");
    assert!(r.latency("message_latency").unwrap().count > 0, "{text}");
    assert!(text.contains("actioncable"), "{text}");

    // Through HTTP publishes there is nothing to send with: refused.
    p.via = Via::Http;
    let Err(e) = broadcast::run(&p).await else {
        panic!("--via http was not refused")
    };
    assert!(e.0.contains("--via http"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_over_action_cable_connects_everyone() {
    let (server, _app) = herald_with_bench_app("", "").await;
    let mut p = ConnectParams::new(bench_target(&server));
    p.protocol = Proto::ActionCable;
    p.clients = 30;
    p.hold = true;
    p.progress = false;
    let r = connect::run(&p).await.unwrap();
    let text = r.summary();
    assert_eq!(r.count("ws_sessions"), 30, "{text}");
    assert_eq!(r.fraction("ws_connect_success"), Some(1.0), "{text}");
    assert_eq!(r.fraction("ws_subscribe_success"), Some(1.0), "{text}");
    assert_eq!(r.count("connection_errors"), 0, "{text}");
    assert_eq!(r.latency("ws_session_setup").unwrap().count, 30, "{text}");
}

/// A server whose app is not the bench's: one clear error, not thousands
/// of failed clients.
/// `idle --protocol actioncable`: every client identified by the app's
/// `Connect`, subscribed through `Command`, and held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_over_action_cable_holds_everyone() {
    let (server, _app) = herald_with_bench_app("", "").await;
    let mut p = IdleParams::new(bench_target(&server));
    p.protocol = Proto::ActionCable;
    p.clients = 30;
    p.channels_per_client = 2;
    p.hold = Duration::from_millis(200);
    p.progress = false;
    p.server_pid = Some(server.pid() as u32);
    let r = idle::run(&p).await.unwrap();
    let text = r.summary();
    assert_eq!(r.fraction("ws_subscribe_success"), Some(1.0), "{text}");
    assert_eq!(r.count("connections_held"), 30, "{text}");
    assert_eq!(r.count("connections_dropped_by_server"), 0, "{text}");
}

#[tokio::test]
async fn action_cable_preflight_names_the_missing_app() {
    // Herald without RPC welcomes everyone but has no BenchmarkChannel.
    let server = Server::start().await;
    let mut p = ConnectParams::new(bench_target(&server));
    p.protocol = Proto::ActionCable;
    p.clients = 3;
    p.progress = false;
    let Err(e) = connect::run(&p).await else {
        panic!("a server without the bench app was not refused")
    };
    assert!(e.0.contains("rpc-server"), "{e}");
}

/// `latency --protocol actioncable`: echo performs, subscriptions and
/// broadcasts, each timed, through a real `herald bench rpc-server`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_over_action_cable_times_each_kind() {
    use herald_bench::latency::{self, Kind, LatencyParams};
    let (server, _app) = herald_with_bench_app("", "").await;
    let mut p = LatencyParams::new(bench_target(&server));
    p.protocol = Proto::ActionCable;
    p.rounds = 5;
    p.interval = Duration::from_millis(5);
    let r = latency::run(&p).await.unwrap();
    let text = r.summary();
    assert_eq!(r.count("round_trips_failed"), 0, "{text}");
    for kind in Kind::of(Proto::ActionCable) {
        let name = format!("latency_{}", kind.name());
        assert_eq!(r.latency(&name).map(|t| t.count), Some(5), "{name}: {text}");
    }
}
