//! `herald bench storm --rate` at small scale against a real herald whose
//! RPC app is a real `herald bench rpc-server` process, publishers going on
//! through the drop: over `actioncable-ext` every returning client restores
//! its session (no new `Connect`) and gets every message once, in order;
//! over plain `actioncable` the same ledger counts what was published
//! during the gap as missed (so the ledger can fail). Counts, never speeds.

use crate::common;

use common::{bench_target, figure, herald_with_bench_app, Server};
use herald_bench::proto::Proto;
use herald_bench::report::Report;
use herald_bench::storm::{self, StormParams};
use std::time::Duration;

const CLIENTS: usize = 40;

fn storm_with_publishers(s: &Server, protocol: Proto) -> StormParams {
    StormParams {
        protocol,
        clients: CLIENTS,
        channels: 4,
        // 5 publishes per second per channel: the gaps (1.5 to 18 s) span
        // several of them.
        rate: 20.0,
        newcomer_rate: 20.0,
        window: Duration::from_secs(1),
        give_up: Duration::from_secs(40),
        settle: Duration::from_secs(10),
        timeout: Duration::from_secs(10),
        progress: false,
        server_pid: Some(s.pid() as u32),
        ..StormParams::new(bench_target(s))
    }
}

/// What both protocols must show: everyone back, messages published
/// while they were away, nothing published in vain.
fn assert_everyone_back_with_gaps(r: &Report) {
    let summary = r.summary();
    // A count that is absent reads as 0: every figure must be there.
    for name in [
        "messages_published",
        "publishes_failed",
        "messages_expected",
        "messages_received",
        "messages_missed",
        "messages_duplicated",
        "messages_out_of_order",
        "messages_unexpected",
        "messages_published_during_gaps",
    ] {
        assert!(r.get(name).is_some(), "no {name}:\n{summary}");
    }
    assert_eq!(r.fraction("back_and_subscribed"), Some(1.0), "{summary}");
    assert_eq!(r.count("publishes_failed"), 0, "{summary}");
    assert!(r.count("messages_published") > 20, "{summary}");
    // Each client was away for at least one publish of its channel.
    assert!(
        r.count("messages_published_during_gaps") >= CLIENTS as u64,
        "{summary}"
    );
    assert!(
        r.count("messages_expected") > r.count("messages_published_during_gaps"),
        "{summary}"
    );
    assert_eq!(r.count("messages_unexpected"), 0, "{summary}");
    assert_eq!(r.count("messages_duplicated"), 0, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_action_cable_misses_nothing_across_a_reconnect() {
    let (s, _app) = herald_with_bench_app("", "").await;
    let r = storm::run(&storm_with_publishers(&s, Proto::ActionCableExt))
        .await
        .unwrap();
    let summary = r.summary();
    assert!(summary.contains("actioncable-ext"), "{summary}");
    assert_everyone_back_with_gaps(&r);
    assert_eq!(r.count("messages_missed"), 0, "{summary}");
    assert_eq!(r.count("messages_out_of_order"), 0, "{summary}");
    assert_eq!(
        r.count("messages_received"),
        r.count("messages_expected"),
        "{summary}"
    );
    assert_eq!(
        r.fraction("returning_clients_missing"),
        Some(0.0),
        "{summary}"
    );
    // Every client restored its session and got its history confirmed,
    // and no reconnect called the app's Connect.
    assert_eq!(r.count("sessions_restored"), CLIENTS as u64, "{summary}");
    assert_eq!(r.count("sessions_fresh"), 0, "{summary}");
    assert_eq!(r.count("history_confirmed"), CLIENTS as u64, "{summary}");
    assert_eq!(r.count("history_rejected"), 0, "{summary}");
    assert_eq!(figure(&r, "connect_calls_during_storm"), 0.0, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_action_cable_loses_what_was_published_during_the_gap() {
    let (s, _app) = herald_with_bench_app("", "").await;
    let r = storm::run(&storm_with_publishers(&s, Proto::ActionCable))
        .await
        .unwrap();
    let summary = r.summary();
    assert_everyone_back_with_gaps(&r);
    // At most once: every client missed what went out while it was away
    // (6 to 18 s at 5/s), and only that much.
    let missed = r.count("messages_missed");
    assert!(missed >= CLIENTS as u64 * 5, "{summary}");
    assert!(
        missed <= r.count("messages_published_during_gaps") + CLIENTS as u64,
        "{summary}"
    );
    assert_eq!(
        r.fraction("returning_clients_missing"),
        Some(1.0),
        "{summary}"
    );
    assert_eq!(
        r.count("messages_received") + missed,
        r.count("messages_expected"),
        "{summary}"
    );
    // No sessions to restore: every reconnect called Connect.
    assert!(r.get("sessions_restored").is_none(), "{summary}");
    assert!(
        figure(&r, "connect_calls_during_storm") >= CLIENTS as f64,
        "{summary}"
    );
}
