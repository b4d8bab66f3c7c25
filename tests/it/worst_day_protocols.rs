//! The "worst day" bench scenarios (`storm`, `slow`, `soak`) over Action
//! Cable (a real herald whose RPC app is a real `herald bench rpc-server`
//! process) and over both AppSync APIs, at small scale, asserting counts,
//! never speeds: every client back after a storm and the connection gauge
//! at its baseline once everyone has left; slow subscribers closed while
//! the others receive everything; nothing lost or duplicated in a soak.

use crate::common;

use common::{assert_storm_came_back, bench_target, figure, herald_with_bench_app, Server};
use herald_bench::proto::Proto;
use herald_bench::report::Report;
use herald_bench::slow::{self, SlowParams};
use herald_bench::soak::{self, SoakParams};
use herald_bench::storm::{self, StormParams};
use std::time::Duration;

/// The test app's key is also its AppSync API key.
const API_KEY: &str = "api_keys = [\"test-key\"]";

fn tiny_storm(s: &Server, protocol: Proto) -> StormParams {
    StormParams {
        protocol,
        clients: 60,
        channels: 5,
        newcomer_rate: 20.0,
        window: Duration::from_secs(1),
        give_up: Duration::from_secs(40),
        settle: Duration::from_secs(10),
        progress: false,
        server_pid: Some(s.pid() as u32),
        ..StormParams::new(bench_target(s))
    }
}

fn assert_storm(r: &Report, protocol: Proto) {
    let summary = r.summary();
    assert!(summary.contains(protocol.name()), "{summary}");
    // No presence in these protocols: skipped, and the report says so.
    assert!(
        r.fraction("presence_counts_matching").is_none(),
        "{summary}"
    );
    assert!(
        summary.contains("presence member check is skipped"),
        "{summary}"
    );
    assert_storm_came_back(r, 60.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_over_action_cable_brings_everyone_back_and_leaves_nothing() {
    let (s, _app) = herald_with_bench_app("", "").await;
    let r = storm::run(&tiny_storm(&s, Proto::ActionCable))
        .await
        .unwrap();
    assert_storm(&r, Proto::ActionCable);
    // ConnectionMonitor: nobody is back before the 6 s stale threshold.
    let summary = r.summary();
    assert!(
        r.latency("reconnect_time").unwrap().min >= 5_900.0,
        "{summary}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_over_both_appsync_apis_brings_everyone_back_and_leaves_nothing() {
    for protocol in [Proto::AppsyncGraphql, Proto::AppsyncEvents] {
        let s = Server::start_with("", API_KEY).await;
        let r = storm::run(&tiny_storm(&s, protocol)).await.unwrap();
        assert_storm(&r, protocol);
        // Amplify: everyone reconnects 5 s after the drop, within 0.1 s.
        let t = r.latency("reconnect_time").unwrap();
        assert!(t.min >= 4_900.0, "{}", r.summary());
    }
}

/// The smallest queue Herald accepts, so the slow ones overflow soon.
const SMALL_QUEUE: &str = "outbound_bytes = 65536";

fn tiny_slow(s: &Server, protocol: Proto) -> SlowParams {
    let mut p = SlowParams::new(bench_target(s));
    (p.protocol, p.progress, p.server_pid) = (protocol, false, Some(s.pid() as u32));
    (p.clients, p.slow_share, p.channels) = (60, 0.1, 3);
    // 150 publishes/s of 8 KiB: 1.2 MB/s to each slow subscriber.
    (p.rate, p.payload, p.queue_bytes) = (150.0, 8192, 65536);
    (p.duration, p.drain) = (Duration::from_secs(4), Duration::from_secs(1));
    // Publish on until the server has closed every slow one: how many
    // bytes that takes depends on kernel buffers and the machine's load.
    p.until_closed = Some(Duration::from_secs(60));
    p
}

/// Slow subscribers closed the protocol's way (`code`), counted by the
/// server; the fast ones got everything in both phases.
fn assert_slow(r: &Report, protocol: Proto, code: u16) {
    let summary = r.summary();
    assert!(summary.contains(protocol.name()), "{summary}");
    for phase in ["clean", "slow"] {
        let m = |name: &str| format!("{name}{{phase:{phase}}}");
        assert_eq!(r.fraction(&m("subscribed")), Some(1.0), "{summary}");
        assert!(r.count(&m("fast_deliveries_expected")) > 500, "{summary}");
        for zero in [
            "fast_deliveries_lost",
            "fast_deliveries_duplicated",
            "fast_deliveries_unexpected",
            "http_publish_errors",
            "connection_errors",
        ] {
            assert_eq!(r.count(&m(zero)), 0, "{zero}: {summary}");
        }
    }
    assert_eq!(r.count("slow_clients"), 6, "{summary}");
    let closed = format!("slow_closed_{code}");
    assert_eq!(r.fraction(&closed), Some(1.0), "{summary}");
    assert_eq!(figure(r, "server_slow_clients_closed"), 6.0, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_action_cable_subscribers_are_told_too_slow_while_the_others_get_everything() {
    let (s, _app) = herald_with_bench_app("", SMALL_QUEUE).await;
    let mut p = tiny_slow(&s, Proto::ActionCable);
    let r = slow::run(&p).await.unwrap();
    assert_slow(&r, Proto::ActionCable, 1013);
    // A --broadcast-url where nothing listens: one clear error up front.
    let nowhere = format!("http://127.0.0.1:{}/_broadcast", common::free_port());
    p.broadcast.url = Some(nowhere);
    let e = slow::run(&p).await.unwrap_err().to_string();
    assert!(e.contains("check --broadcast-url"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_appsync_subscribers_are_closed_while_the_others_get_everything() {
    let s = Server::start_with("", &format!("{API_KEY}\n{SMALL_QUEUE}")).await;
    for protocol in [Proto::AppsyncGraphql, Proto::AppsyncEvents] {
        let r = slow::run(&tiny_slow(&s, protocol)).await.unwrap();
        assert_slow(&r, protocol, 1008);
    }
}

/// 6 s of broadcast and churn: 40 subscribers living ~3 s each on 4
/// channels, 20 publishes/s.
fn tiny_soak(s: &Server, protocol: Proto) -> SoakParams {
    let mut p = SoakParams::new(bench_target(s));
    (p.protocol, p.progress, p.server_pid) = (protocol, false, Some(s.pid() as u32));
    (p.subscribers, p.channels, p.rate) = (40, 4, 20.0);
    (p.duration, p.lifetime) = (Duration::from_secs(6), Duration::from_secs(3));
    (p.warmup, p.sample_interval) = (Some(Duration::from_secs(2)), Duration::from_secs(1));
    p.grace = Duration::from_millis(500);
    p
}

/// Nothing lost or duplicated, sessions churned, presence and API queries
/// skipped (and said so), the server's descriptors and gauge back after.
fn assert_soak(r: &Report, protocol: Proto) {
    let summary = r.summary();
    assert!(summary.contains(protocol.name()), "{summary}");
    assert!(r.count("deliveries_expected") > 500, "{summary}");
    for zero in [
        "deliveries_lost",
        "deliveries_duplicated",
        "deliveries_unexpected",
        "http_publish_errors",
        "connection_errors",
        "server_errors",
        "presence_joins",
        "api_queries",
    ] {
        assert_eq!(r.count(zero), 0, "{zero}: {summary}");
    }
    assert!(r.count("ws_sessions") > 60, "{summary}");
    assert!(
        summary.contains("presence members and API queries are skipped"),
        "{summary}"
    );
    assert_eq!(figure(r, "fds_back_to_baseline"), 1.0, "{summary}");
    assert_eq!(figure(r, "connections_gauge_after_load"), 0.0, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_over_action_cable_loses_and_duplicates_nothing() {
    let (s, _app) = herald_with_bench_app("", "").await;
    let r = soak::run(&tiny_soak(&s, Proto::ActionCable)).await.unwrap();
    assert_soak(&r, Proto::ActionCable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_over_both_appsync_apis_loses_and_duplicates_nothing() {
    let s = Server::start_with("", API_KEY).await;
    for protocol in [Proto::AppsyncGraphql, Proto::AppsyncEvents] {
        let r = soak::run(&tiny_soak(&s, protocol)).await.unwrap();
        assert_soak(&r, protocol);
    }
}
