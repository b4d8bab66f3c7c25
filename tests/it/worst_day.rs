//! The "worst day" bench scenarios (`soak`, `storm`, `slow`) at small
//! scale against a real herald, asserting counts, never speeds: nothing
//! lost or duplicated in a soak, every client back after a storm, the
//! connection gauge and the server's descriptors back to where they were
//! once everyone has left, slow subscribers closed with 4100 while the
//! others receive everything.

use crate::common;

use common::{assert_storm_came_back, bench_target, figure, Server};
use herald_bench::slow::{self, SlowParams};
use herald_bench::soak::{self, SoakParams};
use herald_bench::storm::{self, StormParams};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_loses_and_duplicates_nothing_and_leaves_no_descriptor_behind() {
    let s = Server::start().await;
    let mut p = SoakParams::new(bench_target(&s));
    p.duration = Duration::from_secs(8);
    p.warmup = Some(Duration::from_secs(2));
    p.sample_interval = Duration::from_secs(1);
    p.subscribers = 40;
    p.channels = 4;
    p.rate = 20.0;
    // Short lives: every subscriber reconnects a few times in the run.
    p.lifetime = Duration::from_secs(3);
    p.presence = 8;
    p.presence_channels = 2;
    p.presence_stay = Duration::from_millis(800);
    p.api_interval = Duration::from_millis(300);
    p.grace = Duration::from_millis(500);
    p.progress = false;
    p.server_pid = Some(s.pid() as u32);
    let r = soak::run(&p).await.unwrap();
    let summary = r.summary();
    assert!(r.count("deliveries_expected") > 500, "{summary}");
    assert_eq!(r.count("deliveries_lost"), 0, "{summary}");
    assert_eq!(r.count("deliveries_duplicated"), 0, "{summary}");
    assert_eq!(r.count("deliveries_unexpected"), 0, "{summary}");
    assert_eq!(r.count("http_publish_errors"), 0, "{summary}");
    // Churn happened: more sessions than clients.
    assert!(r.count("ws_sessions") > 60, "{summary}");
    assert!(r.count("presence_joins") >= 16, "{summary}");
    assert!(r.count("api_queries") >= 10, "{summary}");
    assert_eq!(r.count("api_errors"), 0, "{summary}");
    assert_eq!(r.count("connection_errors"), 0, "{summary}");
    assert!(r.count("samples") >= 8, "{summary}");
    assert!(r.figure("rss_slope_per_hour").is_some(), "{summary}");
    // Everything the load opened in the server is closed again.
    assert_eq!(
        figure(&r, "fds_after_load"),
        figure(&r, "fds_baseline"),
        "{summary}"
    );
    assert_eq!(figure(&r, "fds_back_to_baseline"), 1.0, "{summary}");
    assert_eq!(figure(&r, "connections_gauge_baseline"), 0.0, "{summary}");
    assert_eq!(figure(&r, "connections_gauge_after_load"), 0.0, "{summary}");
    assert_eq!(r.samples.len() as u64, r.count("samples"), "{summary}");
    let json = r.json();
    assert!(json["samples"][0]["fds"].as_u64().unwrap() > 0, "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_storm_every_client_is_back_and_after_they_leave_nothing_is_left() {
    let s = Server::start().await;
    let mut p = StormParams::new(bench_target(&s));
    p.clients = 300;
    p.channels = 10;
    p.presence_size = 20;
    p.newcomer_rate = 50.0;
    p.window = Duration::from_secs(2);
    p.give_up = Duration::from_secs(30);
    p.settle = Duration::from_secs(10);
    p.progress = false;
    p.server_pid = Some(s.pid() as u32);
    let r = storm::run(&p).await.unwrap();
    let summary = r.summary();
    // 100 presence clients over 5 channels of 20: the HTTP API agrees.
    assert_eq!(r.count("presence_members_expected"), 100, "{summary}");
    assert_eq!(
        r.fraction("presence_counts_matching"),
        Some(1.0),
        "{summary}"
    );
    assert_storm_came_back(&r, 300.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_subscribers_are_closed_with_4100_while_the_others_get_everything() {
    // The smallest queue Herald accepts, so the slow ones overflow soon.
    let s = Server::start_with("", "outbound_bytes = 65536").await;
    let mut p = SlowParams::new(bench_target(&s));
    p.clients = 60;
    p.slow_share = 0.1;
    p.channels = 3;
    p.rate = 150.0;
    p.payload = 8192;
    p.duration = Duration::from_secs(5);
    // How many bytes fill the slow ones' path depends on kernel buffer
    // autotuning and on how fast this machine publishes: publish on until
    // the server has closed them all.
    p.until_closed = Some(Duration::from_secs(60));
    p.drain = Duration::from_secs(1);
    p.queue_bytes = 65536;
    p.progress = false;
    p.server_pid = Some(s.pid() as u32);
    let r = slow::run(&p).await.unwrap();
    let summary = r.summary();
    for phase in ["clean", "slow"] {
        let m = |name: &str| format!("{name}{{phase:{phase}}}");
        assert_eq!(r.fraction(&m("subscribed")), Some(1.0), "{summary}");
        assert!(r.count(&m("fast_deliveries_expected")) > 1000, "{summary}");
        assert_eq!(r.count(&m("fast_deliveries_lost")), 0, "{summary}");
        assert_eq!(r.count(&m("fast_deliveries_duplicated")), 0, "{summary}");
        assert_eq!(r.count(&m("fast_deliveries_unexpected")), 0, "{summary}");
        assert_eq!(r.count(&m("http_publish_errors")), 0, "{summary}");
        assert_eq!(r.count(&m("connection_errors")), 0, "{summary}");
    }
    assert_eq!(r.count("slow_clients"), 6, "{summary}");
    assert_eq!(r.fraction("slow_closed_4100"), Some(1.0), "{summary}");
    assert_eq!(figure(&r, "server_slow_clients_closed"), 6.0, "{summary}");
    assert!(r.figure("fast_p99_ratio").is_some(), "{summary}");
}
