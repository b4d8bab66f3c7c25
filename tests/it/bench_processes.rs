//! `herald bench --processes N` and `--url a,b` against real herald
//! processes: a run split over child generator processes accounts exactly
//! as one process does, a loss in any child's share is counted, a child
//! that dies stops the run instead of under-counting it, and clients spread
//! over two nodes of one cluster (over a real redis-server) get everything,
//! with each node's CPU and memory reported.

use crate::common;

use common::proxy::{drop_every_third, faulty_proxy};
use common::{Server, APP_ID, APP_KEY, APP_SECRET};
use herald_broker::testing::{BrokerServer, Kind};
use serde_json::Value;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// `herald bench ARGS --json FILE` against the test app: exit code,
/// stderr, and the JSON report (Null when none was written).
async fn bench(args: &[&str]) -> (Option<i32>, String, Value) {
    let dir = std::env::temp_dir().join(format!("herald-bench-processes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join(format!("{}.json", common::free_port()));
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald"));
    common::die_with_parent(cmd.as_std_mut());
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        cmd.arg("bench")
            .args(args)
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
        String::from_utf8_lossy(&out.stderr).into_owned(),
        report,
    )
}

fn ws(port: u16) -> String {
    format!("ws://127.0.0.1:{port}")
}

/// 20 subscribers over 4 channels, 2 publishers, 40 publishes in 2 s: each
/// subscriber is owed its channel's 10 publishes, 200 deliveries in all.
const FANOUT: &[&str] = &[
    "fanout",
    "--clients",
    "20",
    "--channels",
    "4",
    "--publishers",
    "2",
    "--rate",
    "20",
    "--duration",
    "2s",
];

fn m(report: &Value, name: &str) -> Value {
    report["metrics"][name].clone()
}

#[tokio::test]
async fn fanout_over_two_processes_accounts_exactly_as_one() {
    let server = Server::start().await;
    let url = ws(server.port);
    let pid = server.child.id().to_string();
    let (code, err, one) = bench(&[FANOUT, &["--url", &url]].concat()).await;
    assert_eq!(code, Some(0), "{err}");
    let (code, err, two) = bench(
        &[
            FANOUT,
            &["--url", &url, "--processes", "2", "--server-pid", &pid],
        ]
        .concat(),
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("2 generator processes started"), "{err}");
    assert_eq!(two["params"]["processes"], "2", "{two}");
    for r in [&one, &two] {
        assert_eq!(m(r, "ws_sessions"), 20, "{r}");
        assert_eq!(m(r, "http_publishes"), 40, "{r}");
        assert_eq!(m(r, "deliveries_expected"), 200, "{r}");
        assert_eq!(m(r, "deliveries_received"), 200, "{r}");
        assert_eq!(m(r, "deliveries_lost"), 0, "{r}");
        assert_eq!(m(r, "deliveries_duplicated"), 0, "{r}");
        assert_eq!(m(r, "deliveries_unexpected"), 0, "{r}");
        // One latency sample per delivery: the children's histograms
        // were merged, not one child's taken.
        assert_eq!(m(r, "message_latency")["count"], 200, "{r}");
        for c in 0..4 {
            let name = format!("delivery_success{{channel:benchmark-fanout-{c}}}");
            assert_eq!(m(r, &name), 1.0, "{r}");
        }
    }
    // The parent measured the server once, for the whole run.
    assert!(m(&two, "server_cpu").as_f64().unwrap() > 0.0, "{two}");
    assert!(
        m(&two, "server_rss_peak").as_f64().unwrap() > 1024.0 * 1024.0,
        "{two}"
    );
    assert!(
        m(&two, "server_cpu_per_delivery").as_f64().unwrap() > 0.0,
        "{two}"
    );
}

#[tokio::test]
async fn connect_idle_and_broadcast_over_processes() {
    let server = Server::start().await;
    let url = ws(server.port);
    let pid = server.child.id().to_string();
    let (code, err, r) = bench(&[
        "connect",
        "--url",
        &url,
        "--clients",
        "60",
        "--hold",
        "--processes",
        "3",
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("at \"settled\""), "{err}");
    assert_eq!(m(&r, "ws_sessions"), 60, "{r}");
    assert_eq!(m(&r, "ws_subscribe_success"), 1.0, "{r}");
    assert_eq!(m(&r, "ws_session_setup")["count"], 60, "{r}");

    let (code, err, r) = bench(&[
        "idle",
        "--url",
        &url,
        "--clients",
        "100",
        "--duration",
        "1s",
        "--processes",
        "2",
        "--server-pid",
        &pid,
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(m(&r, "connections_held"), 100, "{r}");
    assert_eq!(m(&r, "ws_subscribe_success"), 1.0, "{r}");
    let (before, after) = (
        m(&r, "server_rss_before").as_f64().unwrap(),
        m(&r, "server_rss_after").as_f64().unwrap(),
    );
    let per = m(&r, "server_memory_per_connection").as_f64().unwrap();
    assert!(((after - before) / 100.0 - per).abs() < 1.0, "{r}");

    // Users 0, 2, 4, 6 send on every tick; they are split over both
    // processes, so every delivery between them crosses the processes'
    // ledgers one way or the other.
    let (code, err, r) = bench(&[
        "broadcast",
        "--url",
        &url,
        "--clients",
        "8",
        "--duration",
        "3s",
        "--lifetime",
        "1500ms",
        "--sender-every",
        "2",
        "--send-probability",
        "1",
        "--processes",
        "2",
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    let expected = m(&r, "deliveries_expected").as_u64().unwrap();
    assert!(expected > 0, "{r}");
    assert_eq!(m(&r, "deliveries_received"), expected, "{r}");
    assert_eq!(m(&r, "deliveries_unexpected"), 0, "{r}");
    assert_eq!(m(&r, "deliveries_duplicated"), 0, "{r}");
    assert!(m(&r, "ws_msgs_sent").as_u64().unwrap() > 0, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_one_process_misses_are_counted_lost() {
    let server = Server::start().await;
    let (port, faults) = faulty_proxy(server.port, drop_every_third, Duration::ZERO).await;
    let url = ws(port);
    let (code, err, r) = bench(&[FANOUT, &["--url", &url, "--processes", "2"]].concat()).await;
    assert_eq!(code, Some(0), "{err}");
    // Each subscriber's 10 messages lose their 3rd, 6th and 9th: 60 of
    // 200, wherever the subscriber's process is.
    assert_eq!(faults.dropped.load(Ordering::Relaxed), 60);
    assert_eq!(m(&r, "deliveries_expected"), 200, "{r}");
    assert_eq!(m(&r, "deliveries_lost"), 60, "{r}");
    assert_eq!(m(&r, "deliveries_received"), 140, "{r}");
    assert_eq!(m(&r, "delivery_success"), 0.7, "{r}");
}

/// `broadcast` over two processes through a proxy dropping every third
/// bench message: the losses
/// are counted, and split by where their sender was (users 0, 2, 4, 6
/// send, all in process 0: odd receivers lose messages from the other
/// process, even ones from their own) and by how long before their
/// receiver left they were sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_losses_are_split_by_the_senders_process() {
    let server = Server::start().await;
    let (port, faults) = faulty_proxy(server.port, drop_every_third, Duration::ZERO).await;
    let url = ws(port);
    let (code, err, r) = bench(&[
        "broadcast",
        "--url",
        &url,
        "--clients",
        "8",
        "--duration",
        "3s",
        "--lifetime",
        "10m",
        "--sender-every",
        "2",
        "--send-probability",
        "1",
        "--processes",
        "2",
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(faults.dropped.load(Ordering::Relaxed) > 0);
    let lost = m(&r, "deliveries_lost").as_u64().unwrap();
    assert!(lost > 0, "{r}");
    let same = m(&r, "deliveries_lost{sender:same_process}")
        .as_u64()
        .unwrap();
    let other = m(&r, "deliveries_lost{sender:other_process}")
        .as_u64()
        .unwrap();
    assert!(same > 0 && other > 0, "{r}");
    assert_eq!(same + other, lost, "{r}");
    assert_eq!(m(&r, "lost_sent_before_leave")["count"], lost, "{r}");
}

#[tokio::test]
async fn a_child_that_dies_stops_the_run_instead_of_under_counting() {
    let server = Server::start().await;
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald"));
    common::die_with_parent(cmd.as_std_mut());
    let mut bench = cmd
        .args([
            "bench",
            "idle",
            "--url",
            &ws(server.port),
            "--clients",
            "20",
        ])
        .args(["--app-id", APP_ID, "--key", APP_KEY, "--secret", APP_SECRET])
        .args(["--duration", "3s", "--processes", "2", "--no-progress"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(bench.stderr.take().unwrap()).lines();
    let mut log = String::new();
    // Every connection is open and the parent holds: kill one child.
    let wait = async {
        while let Ok(Some(line)) = lines.next_line().await {
            log.push_str(&line);
            log.push('\n');
            if line.contains("at \"open\"") {
                return true;
            }
        }
        false
    };
    let reached = tokio::time::timeout(Duration::from_secs(30), wait).await;
    assert_eq!(reached, Ok(true), "{log}");
    let parent = bench.id().unwrap();
    let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
        .unwrap_or_default();
    let child: i32 = children
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("two children of {parent}: {children:?}"));
    unsafe { libc::kill(child, libc::SIGKILL) };
    let status = tokio::time::timeout(Duration::from_secs(30), bench.wait())
        .await
        .expect("the parent ended within 30 s")
        .unwrap();
    let mut rest = String::new();
    let mut stderr = lines.into_inner();
    let _ = stderr.read_to_string(&mut rest).await;
    log.push_str(&rest);
    assert!(!status.success(), "{log}");
    assert!(log.contains("generator process 1 of 2 ended"), "{log}");
    assert!(log.contains("unaccounted"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_over_redis_share_the_clients() {
    let broker = BrokerServer::start(Kind::Redis);
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"bp-{}\"\n",
        broker.url(),
        std::process::id()
    );
    let a = Server::start_with(&top, "").await;
    let b = Server::start_with(&top, "").await;
    let urls = format!("{},{}", ws(a.port), ws(b.port));
    let pids = format!("{},{}", a.child.id(), b.child.id());
    let (code, err, r) = bench(
        &[
            FANOUT,
            &["--url", &urls, "--server-pid", &pids, "--processes", "2"],
        ]
        .concat(),
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(m(&r, "deliveries_expected"), 200, "{r}");
    assert_eq!(m(&r, "deliveries_received"), 200, "{r}");
    assert_eq!(m(&r, "deliveries_duplicated"), 0, "{r}");
    // Half the subscribers on each node, each node's own CPU and memory.
    assert_eq!(m(&r, "deliveries_received{node:0}"), 100, "{r}");
    assert_eq!(m(&r, "deliveries_received{node:1}"), 100, "{r}");
    for k in 0..2 {
        // A number, not necessarily above zero: 100 deliveries may take
        // less than the kernel's 10 ms CPU tick (seen in a whole-file run).
        // That each node's /proc is read shows in its memory just below.
        assert!(
            m(&r, &format!("server_cpu{{node:{k}}}")).as_f64().unwrap() >= 0.0,
            "{r}"
        );
        assert!(
            m(&r, &format!("server_rss_end{{node:{k}}}"))
                .as_f64()
                .unwrap()
                > 1024.0 * 1024.0,
            "{r}"
        );
    }
    let sum = m(&r, "server_cpu{node:0}").as_f64().unwrap()
        + m(&r, "server_cpu{node:1}").as_f64().unwrap();
    assert!(
        (m(&r, "server_cpu").as_f64().unwrap() - sum).abs() < 1e-9,
        "{r}"
    );

    // idle over both nodes from one process: each node holds its half.
    let (code, err, r) = bench(&[
        "idle",
        "--url",
        &urls,
        "--server-pid",
        &pids,
        "--clients",
        "40",
        "--duration",
        "1s",
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(m(&r, "ws_subscribed{node:0}"), 20, "{r}");
    assert_eq!(m(&r, "ws_subscribed{node:1}"), 20, "{r}");
    assert!(
        m(&r, "server_memory_per_connection{node:1}").is_number(),
        "{r}"
    );
}

#[tokio::test]
async fn scenarios_that_run_in_one_process_refuse_processes() {
    for args in [
        &["soak", "--processes", "2"][..],
        &["storm", "--processes", "2"],
        &["slow", "--server-pid", "1,2"],
        &["connect", "--sweep", "10,20", "--processes", "2"],
    ] {
        let (code, err, _) = bench(args).await;
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains("runs in one process"), "{args:?}: {err}");
    }
    let (code, err, _) = bench(&["soak", "--url", "ws://127.0.0.1:1,ws://127.0.0.1:2"]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("takes one --url"), "{err}");
}
