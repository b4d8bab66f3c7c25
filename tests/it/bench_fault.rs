//! `herald bench fanout --fault-cmd` against three real herald nodes on a
//! real three-server NATS cluster ([`NatsCluster`]): the bench SIGKILLs
//! one NATS server, or one herald node, in the middle of publishing, and
//! reports what it cost. The losses themselves depend on timing, so the
//! tests hold the report to what must be true of any run: nothing
//! duplicated, the window closed (deliveries whole again before the end),
//! every loss after the fault inside the window and split exactly by node,
//! and, for a killed node, its subscribers back on other nodes having
//! missed at least the publishes of their 1 s away.

use crate::common;

use common::{wait_ready, Server, APP_ID, APP_KEY, APP_SECRET, TIMEOUT};
use herald_broker::testing::NatsCluster;
use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;

/// One herald node per NATS server, each given its own server first and
/// the others after it.
async fn nodes(cluster: &NatsCluster, prefix: &str) -> Vec<Server> {
    let mut out = Vec::new();
    for i in 0..cluster.len() {
        let mut urls = vec![cluster.url(i)];
        urls.extend(
            (0..cluster.len())
                .filter(|&k| k != i)
                .map(|k| cluster.url(k)),
        );
        let top = format!(
            "[broker]\nurl = \"{}\"\nprefix = \"{prefix}-{}\"\nttl = 30\n",
            urls.join(","),
            std::process::id()
        );
        out.push(Server::start_with(&top, "").await);
    }
    for s in &out {
        wait_ready(s, 200, TIMEOUT).await;
    }
    out
}

/// `herald bench fanout` over `nodes` with the fault `cmd` 2 s into 6 s
/// of publishing: 30 subscribers on 10 channels (10 per node), 3
/// publishers, 20 publishes/s. Exit code, stderr, the JSON report.
async fn fanout_with_fault(nodes: &[Server], cmd: &str) -> (Option<i32>, String, Value) {
    let urls: Vec<String> = nodes
        .iter()
        .map(|s| format!("ws://127.0.0.1:{}", s.port))
        .collect();
    let json = std::env::temp_dir().join(format!(
        "herald-bench-fault-{}-{}.json",
        std::process::id(),
        common::free_port()
    ));
    let mut cmd_line = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald"));
    common::die_with_parent(cmd_line.as_std_mut());
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        cmd_line
            .args(["bench", "fanout", "--url", &urls.join(",")])
            .args(["--clients", "30", "--channels", "10", "--publishers", "3"])
            .args(["--rate", "20", "--duration", "6s", "--drain", "2s"])
            .args(["--fault-cmd", cmd, "--fault-at", "2s"])
            .args(["--app-id", APP_ID, "--key", APP_KEY, "--secret", APP_SECRET])
            .arg("--no-progress")
            .arg("--json")
            .arg(&json)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("herald bench finished within 90 s")
    .expect("run herald bench");
    let report = std::fs::read_to_string(&json)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let _ = std::fs::remove_file(&json);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        report,
    )
}

fn n(r: &Value, name: &str) -> u64 {
    r["metrics"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} is not a count in {r}"))
}

/// What holds whatever the fault cost: the command ran, nothing was
/// duplicated or unexpected, deliveries were whole again before the end,
/// nothing was lost before the fault, so every loss is the window's, and
/// the window's losses add up by publisher node and by subscriber node.
fn assert_accounted(r: &Value, out: &str) {
    assert!(r["metrics"]["fault_cmd_took"].is_number(), "{out}");
    assert_eq!(n(r, "deliveries_duplicated"), 0, "{out}");
    assert_eq!(n(r, "deliveries_unexpected"), 0, "{out}");
    let window = r["metrics"]["fault_window"]
        .as_f64()
        .unwrap_or_else(|| panic!("deliveries not whole again: {out}"));
    assert!((0.0..4.0).contains(&window), "{out}");
    assert_eq!(n(r, "deliveries_lost_before_fault"), 0, "{out}");
    let lost = n(r, "fault_window_deliveries_lost");
    assert_eq!(n(r, "deliveries_lost"), lost, "{out}");
    let by = |tag: &str| -> u64 {
        (0..3)
            .map(|k| n(r, &format!("fault_window_deliveries_lost{{{tag}:{k}}}")))
            .sum()
    };
    assert_eq!(by("publish_node"), lost, "{out}");
    assert_eq!(by("subscriber_node"), lost, "{out}");
    assert!(n(r, "fault_window_publishes_missed") <= n(r, "fault_window_publishes"));
    // 3 subscribers per channel.
    assert!(
        n(r, "fault_window_most_missed_by") <= 3 && lost <= 3 * n(r, "fault_window_publishes"),
        "{out}"
    );
    println!(
        "fault window {window:.2} s: {} publishes, {} failed, {} missed, {} deliveries lost",
        n(r, "fault_window_publishes"),
        n(r, "fault_window_publish_errors"),
        n(r, "fault_window_publishes_missed"),
        lost
    );
}

/// SIGKILL of the NATS server node 0 is on: node 0 moves to another server
/// of the cluster and deliveries are whole again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nats_server_s_cost_is_reported() {
    let cluster = NatsCluster::start(3, false);
    let n0 = nodes(&cluster, "bf-nats").await;
    let pid = cluster.pid(0).unwrap();
    let (code, out, r) = fanout_with_fault(&n0, &format!("kill -9 {pid}")).await;
    assert_eq!(code, Some(0), "{out}");
    assert_accounted(&r, &out);
    // The server is dead (a zombie until the fixture reaps it).
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty()
            || stat
                .rsplit(')')
                .next()
                .unwrap()
                .trim_start()
                .starts_with('Z'),
        "{stat}"
    );
    assert_eq!(n(&r, "subscribers_reconnected"), 0, "{out}");
    assert!(out.contains("deliveries whole again after"), "{out}");
}

/// SIGKILL of herald node 2: its 10 subscribers come back on the other
/// nodes 1 s later (as pusher-js would) and each misses at least the
/// publish its channel had meanwhile (one every 0.5 s); publishes through
/// the dead node fail and are counted as failed, not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_s_subscribers_return_and_their_losses_are_counted() {
    let cluster = NatsCluster::start(3, false);
    let n0 = nodes(&cluster, "bf-node").await;
    let pid = n0[2].pid();
    let (code, out, r) = fanout_with_fault(&n0, &format!("kill -9 {pid}")).await;
    assert_eq!(code, Some(0), "{out}");
    assert_accounted(&r, &out);
    assert_eq!(n(&r, "subscribers_reconnected"), 10, "{out}");
    assert!(
        n(&r, "fault_window_deliveries_lost{subscriber_node:2}") >= 10,
        "{out}"
    );
    assert!(n(&r, "fault_window_most_missed_by") >= 1, "{out}");
    assert!(n(&r, "http_publish_errors") > 0, "{out}");
    assert!(n(&r, "fault_window_publish_errors") > 0, "{out}");
}

/// A fault needs one generator process and a time within the publishing.
#[tokio::test]
async fn a_fault_outside_the_run_or_over_processes_is_refused() {
    for (extra, says) in [
        (
            &["--fault-at", "9s"][..],
            "--fault-at must be within --duration",
        ),
        (&["--processes", "2"][..], "one generator process"),
    ] {
        let out = common::output_within(
            common::herald_command()
                .args(["bench", "fanout", "--duration", "5s", "--fault-cmd", "true"])
                .args(extra),
            Duration::from_secs(30),
        );
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{err}");
    }
}
