//! `herald bench` scenarios at tiny scale against a real herald: a few
//! clients for a couple of seconds, asserting deliveries and counts (never
//! speeds), plus a proxy that drops messages to check that losses are
//! reported as lost deliveries.

use crate::common;

use futures_util::{SinkExt, StreamExt};
use herald_bench::broadcast::{self, BroadcastParams, Via};
use herald_bench::connect::{self, ConnectParams, SweepParams};
use herald_bench::fanout::{self, FanoutParams};
use herald_bench::idle::{self, IdleParams};
use herald_bench::Target;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

use common::free_port;
use common::proxy::{drop_and_duplicate, drop_every_third, faulty_proxy, Fault, Faults};

async fn start_server() -> Server {
    start_server_with(None).await
}

/// Herald with the development app's credentials and `app_settings` (TOML
/// lines for its `[[apps]]` entry), e.g. a connection limit.
async fn start_server_with(app_settings: Option<&str>) -> Server {
    let port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    common::die_with_parent(&mut cmd);
    cmd.args(["serve", "--port", &port.to_string(), "--log", "warn"]);
    if let Some(settings) = app_settings {
        let path = std::env::temp_dir().join(format!(
            "herald-bench-test-{}-{port}.toml",
            std::process::id()
        ));
        std::fs::write(
            &path,
            format!(
                "[[apps]]\nid = \"app-id\"\nkey = \"app-key\"\nsecret = \"app-secret\"\n{settings}\n"
            ),
        )
        .unwrap();
        cmd.arg("--config").arg(&path);
    }
    let child = cmd
        .env_remove("HERALD_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start herald");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < deadline, "herald did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Server { child, port }
}

fn target(port: u16) -> Target {
    Target::new(
        &format!("ws://127.0.0.1:{port}"),
        "app-id",
        "app-key",
        "app-secret",
        false,
    )
    .unwrap()
}

fn tiny_broadcast(port: u16) -> BroadcastParams {
    let mut p = BroadcastParams::new(target(port));
    p.peak = 8;
    p.duration = Duration::from_secs(3);
    p.lifetime = Duration::from_millis(1500);
    p.sender_every = 2;
    p.send_probability = 1.0;
    p.grace = Duration::from_millis(500);
    p.progress = false;
    p
}

/// 20 subscribers over 4 channels, 2 publishers, 40 publishes in 2 s:
/// 10 publishes per channel, 5 subscribers per channel.
fn tiny_fanout(port: u16) -> FanoutParams {
    let mut p = FanoutParams::new(target(port));
    p.subscribers = 20;
    p.channels = 4;
    p.publishers = 2;
    p.rate = 20.0;
    p.duration = Duration::from_secs(2);
    p.progress = false;
    p
}

/// The server's peak memory (VmHWM) that a run with `server_pid` reports:
/// more than 1 MiB (a running herald is bigger than that), and not below
/// any resident-memory figure the same report gives.
fn assert_server_memory(r: &herald_bench::Report) {
    let text = r.summary();
    let peak = r.figure("server_rss_peak").expect("server_rss_peak");
    assert!(peak > 1024.0 * 1024.0, "{text}");
    let end = r.figure("server_rss_end").expect("server_rss_end");
    assert!(end > 0.0 && peak >= end, "{text}");
    // Read at other moments than the peak: since Linux 6.2 a process's
    // resident-page counts are per-CPU counters read approximately (up to
    // 32 pages per CPU per counter), so a sample taken earlier may exceed a
    // high-water mark read later by that much. Seen once on a loaded
    // 2-core machine: 34.0 MiB sampled, a peak a few pages lower.
    const SLACK: f64 = 1024.0 * 1024.0;
    for name in ["server_rss_before", "server_rss_open", "server_rss_after"] {
        if let Some(rss) = r.figure(name) {
            assert!(peak + SLACK >= rss, "{name}: {text}");
        }
    }
    assert!(text.contains(" server_rss_peak."), "{text}");
}

/// The bench's default credentials are its own copy of the server's
/// development app, so `herald serve` + `herald bench` need no flags.
#[test]
fn bench_defaults_are_the_development_app() {
    assert_eq!(herald_bench::DEV_APP_ID, herald_core::config::DEV_APP_ID);
    assert_eq!(herald_bench::DEV_APP_KEY, herald_core::config::DEV_APP_KEY);
    assert_eq!(
        herald_bench::DEV_APP_SECRET,
        herald_core::config::DEV_APP_SECRET
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_sweep() {
    let server = start_server().await;
    let mut p = ConnectParams::new(target(server.port));
    p.clients = 20;
    p.progress = false;
    p.server_pid = Some(server.child.id());
    let r = connect::run(&p).await.unwrap();
    assert_eq!(r.count("ws_sessions"), 20);
    assert_eq!(
        r.fraction("ws_subscribe_success"),
        Some(1.0),
        "{}",
        r.summary()
    );
    assert_eq!(r.count("connection_errors"), 0);
    assert_eq!(r.latency("ws_connecting").unwrap().count, 20);
    assert!(r.figure("generator_cpu").is_some());
    assert_server_memory(&r);
    // The timeline is kept even for an avalanche shorter than a second:
    // its `received` column counts confirmed subscriptions, every one once.
    let confirmed: u64 = r.timeline.iter().map(|t| t.received).sum();
    assert_eq!(confirmed, 20, "{:?}", r.timeline);
    assert_eq!(
        r.json()["timeline"].as_array().unwrap().len(),
        r.timeline.len()
    );
    let html = r.html();
    assert!(html.contains("<h2>Timeline</h2>") && html.contains("<svg"));
    assert_eq!(r.timeline.iter().map(|t| t.errors).sum::<u64>(), 0);

    let s = connect::sweep(&SweepParams {
        base: p,
        steps: vec![5, 10],
        pause: Duration::from_millis(200),
    })
    .await
    .unwrap();
    assert_eq!(s.fraction("ws_subscribe_success{n:5}"), Some(1.0));
    assert_eq!(s.fraction("ws_subscribe_success{n:10}"), Some(1.0));
    assert_eq!(s.figure("sweep_first_below_100pct"), None);
    assert_server_memory(&s);
    let j = s.json();
    assert_eq!(j["metrics"]["ws_connect_success{n:10}"], 1.0);
    assert!(j["metrics"]["sweep_first_below_99pct"].is_null());
    // The sweep's timeline is the steps' end to end, each tagged with its N.
    for n in [5u64, 10] {
        let confirmed: u64 = s
            .timeline
            .iter()
            .filter(|t| t.step == Some(n))
            .map(|t| t.received)
            .sum();
        assert_eq!(confirmed, n, "{:?}", s.timeline);
    }
    // Seconds count from the sweep's start and keep increasing across steps.
    assert!(
        s.timeline.windows(2).all(|w| w[0].second < w[1].second),
        "{:?}",
        s.timeline
    );
    let steps: Vec<_> = j["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps.first(), Some(&5));
    assert_eq!(steps.last(), Some(&10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_delivers_everything_by_client_events_and_http() {
    let server = start_server().await;
    for via in [Via::Ws, Via::Http] {
        let mut p = tiny_broadcast(server.port);
        p.via = via;
        p.server_pid = Some(server.child.id());
        let r = broadcast::run(&p).await.unwrap();
        let text = r.summary();
        assert!(r.count("ws_msgs_sent") > 0, "{text}");
        assert!(r.count("deliveries_expected") > 0, "{text}");
        assert_eq!(r.count("deliveries_lost"), 0, "{text}");
        assert_eq!(r.count("deliveries_duplicated"), 0, "{text}");
        assert_eq!(r.count("deliveries_unexpected"), 0, "{text}");
        assert_eq!(
            r.count("deliveries_received"),
            r.count("deliveries_expected"),
            "{text}"
        );
        assert_eq!(r.fraction("delivery_success"), Some(1.0), "{text}");
        assert_eq!(r.count("connection_errors"), 0, "{text}");
        assert!(r.latency("message_latency").unwrap().count > 0);
        assert!(!r.timeline.is_empty());
        assert_server_memory(&r);
    }
}

/// Users that would live far longer than the run leave when the ramp no
/// longer wants them (each sleeps until its own moment of the ramp-down,
/// nothing polls): the run ends on time, one session per user, and every
/// message sent while a user was in is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_users_leave_on_the_ramp_down_without_polling() {
    let server = start_server().await;
    let mut p = tiny_broadcast(server.port);
    p.lifetime = Duration::from_secs(600);
    let t0 = std::time::Instant::now();
    let r = broadcast::run(&p).await.unwrap();
    let took = t0.elapsed();
    let text = r.summary();
    // 3 s ramp + 0.5 s grace, and some slack for a busy machine.
    assert!(took < Duration::from_secs(8), "{took:?}\n{text}");
    assert_eq!(r.count("ws_sessions"), 8, "{text}");
    assert!(r.count("deliveries_expected") > 0, "{text}");
    assert_eq!(r.count("deliveries_lost"), 0, "{text}");
    assert_eq!(r.count("connection_errors"), 0, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_counts_every_channel() {
    let server = start_server().await;
    let mut p = tiny_fanout(server.port);
    p.server_pid = Some(server.child.id());
    let r = fanout::run(&p).await.unwrap();
    let text = r.summary();
    assert_server_memory(&r);
    // 40 publishes, 10 per channel, 5 subscribers per channel.
    assert_eq!(r.count("http_publishes"), 40, "{text}");
    assert_eq!(r.count("deliveries_expected"), 200, "{text}");
    assert_eq!(r.count("deliveries_received"), 200, "{text}");
    assert_eq!(r.count("deliveries_lost"), 0, "{text}");
    assert_eq!(r.count("deliveries_duplicated"), 0, "{text}");
    assert_eq!(r.count("deliveries_unexpected"), 0, "{text}");
    for c in 0..4 {
        let name = format!("delivery_success{{channel:benchmark-fanout-{c}}}");
        assert_eq!(r.fraction(&name), Some(1.0), "{text}");
    }
    let j = r.json();
    for key in ["avg", "min", "med", "max", "p90", "p95", "p99"] {
        assert!(j["metrics"]["message_latency"][key].is_number(), "{key}");
    }
}

/// The same fan-out with AppSync clients: graphql-ws subscribers on
/// /graphql and publish mutations on POST /graphql, then Events API
/// subscribers and POST /event (the development app's key is the API key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_speaks_both_appsync_apis() {
    let server = start_server().await;
    for protocol in [
        herald_bench::proto::Proto::AppsyncGraphql,
        herald_bench::proto::Proto::AppsyncEvents,
    ] {
        let mut p = tiny_fanout(server.port);
        p.protocol = protocol;
        let r = fanout::run(&p).await.unwrap();
        let text = r.summary();
        assert!(text.contains(protocol.name()), "{text}");
        assert_eq!(r.count("http_publishes"), 40, "{text}");
        assert_eq!(r.count("deliveries_expected"), 200, "{text}");
        assert_eq!(r.count("deliveries_received"), 200, "{text}");
        assert_eq!(r.count("deliveries_lost"), 0, "{text}");
        assert_eq!(r.count("deliveries_unexpected"), 0, "{text}");
        assert!(
            r.json()["metrics"]["message_latency"]["p95"].is_number(),
            "{text}"
        );
    }
    // A wrong API key is one clear error.
    let mut p = tiny_fanout(server.port);
    p.protocol = herald_bench::proto::Proto::AppsyncEvents;
    p.target = Target::new(
        &format!("ws://127.0.0.1:{}", server.port),
        "app-id",
        "not-a-key",
        "app-secret",
        false,
    )
    .unwrap();
    let e = fanout::run(&p).await.unwrap_err().to_string();
    assert!(e.contains("UnauthorizedException"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_holds_connections_and_reads_server_memory() {
    let server = start_server().await;
    let mut p = IdleParams::new(target(server.port));
    p.clients = 30;
    p.channels_per_client = 2;
    p.hold = Duration::from_millis(500);
    p.progress = false;
    p.server_pid = Some(server.child.id());
    let r = idle::run(&p).await.unwrap();
    let text = r.summary();
    assert_eq!(r.count("connections_held"), 30, "{text}");
    assert_eq!(r.fraction("ws_subscribe_success"), Some(1.0), "{text}");
    assert!(r.figure("server_rss_after").unwrap() > 0.0, "{text}");
    assert!(r.figure("server_memory_per_connection").is_some(), "{text}");
    assert_server_memory(&r);
}

/// `--server-pid` on the command line: the server's peak memory is in the
/// printed summary and in `--json`, under the same name, and plausible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_reports_the_servers_peak_memory() {
    let server = start_server().await;
    let url = format!("ws://127.0.0.1:{}", server.port);
    let pid = server.child.id().to_string();
    let json_path = std::env::temp_dir().join(format!(
        "herald-bench-peak-{}-{}.json",
        std::process::id(),
        server.port
    ));
    let out = bench_cli_output(&[
        "idle",
        "--url",
        &url,
        "--clients",
        "5",
        "--duration",
        "200ms",
        "--server-pid",
        &pid,
        "--json",
        json_path.to_str().unwrap(),
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json_path);
    let metrics = &json["metrics"];
    let peak = metrics["server_rss_peak"]
        .as_f64()
        .expect("server_rss_peak");
    assert!(peak > 1024.0 * 1024.0, "{json}");
    for name in [
        "server_rss_end",
        "server_rss_before",
        "server_rss_open",
        "server_rss_after",
    ] {
        let rss = metrics[name].as_f64().expect(name);
        // `server_rss_end` is read with the peak; the others earlier (see
        // `assert_server_memory` on the kernel's approximate counts).
        let slack = if name == "server_rss_end" {
            0.0
        } else {
            1024.0 * 1024.0
        };
        assert!(rss > 0.0 && peak + slack >= rss, "{name}: {json}");
    }
    // Printed in MiB, like the other memory figures.
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("server_rss_peak."))
        .unwrap_or_else(|| panic!("no server_rss_peak line: {stdout}"));
    assert!(line.ends_with(" MiB"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_named() {
    let server = start_server().await;
    let t = |key: &str, secret: &str| {
        Target::new(
            &format!("ws://127.0.0.1:{}", server.port),
            "app-id",
            key,
            secret,
            false,
        )
        .unwrap()
    };
    let mut p = tiny_broadcast(server.port);
    p.target = t("wrong", "app-secret");
    let e = broadcast::run(&p).await.unwrap_err().to_string();
    assert!(e.contains("--key"), "{e}");
    p.target = t("app-key", "wrong");
    let e = broadcast::run(&p).await.unwrap_err().to_string();
    assert!(e.contains("--secret"), "{e}");
    let mut f = FanoutParams::new(t("app-key", "wrong"));
    f.subscribers = 1;
    let e = fanout::run(&f).await.unwrap_err().to_string();
    assert!(e.contains("--secret"), "{e}");
    let mut c = ConnectParams::new(t("app-key", "app-secret"));
    c.target = Target::new(
        &format!("ws://127.0.0.1:{}", free_port()),
        "a",
        "k",
        "s",
        false,
    )
    .unwrap();
    let e = connect::run(&c).await.unwrap_err().to_string();
    assert!(e.contains("--url"), "{e}");
}

/// `herald` for `tokio::process`, killed if this test process dies first.
fn bench_command() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald"));
    common::die_with_parent(cmd.as_std_mut());
    cmd
}

/// `herald bench ARGS` as a child process: exit code and stderr.
async fn bench_cli(args: &[&str]) -> (Option<i32>, String) {
    let out = bench_cli_output(args).await;
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `herald bench ARGS` as a child process, with its whole output.
async fn bench_cli_output(args: &[&str]) -> std::process::Output {
    tokio::time::timeout(
        Duration::from_secs(60),
        bench_command()
            .arg("bench")
            .args(args)
            .arg("--no-progress")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("herald bench finished")
    .expect("run herald bench")
}

#[tokio::test]
async fn connect_refuses_a_duration_instead_of_ignoring_it() {
    let (code, stderr) = bench_cli(&["connect", "--clients", "1", "--duration", "5s"]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--duration"), "{stderr}");
}

#[tokio::test]
async fn zero_clients_are_refused_instead_of_measuring_nothing() {
    for scenario in ["broadcast", "idle", "fanout", "connect"] {
        let (code, stderr) = bench_cli(&[scenario, "--clients", "0"]).await;
        assert_eq!(code, Some(2), "{scenario}: {stderr}");
        assert!(stderr.contains("--clients"), "{scenario}: {stderr}");
    }
}

/// Deliveries add up: every expected message is either received or lost,
/// and at least one was lost.
fn assert_losses_counted(r: &herald_bench::Report, faults: &Faults) {
    let text = r.summary();
    let expected = r.count("deliveries_expected");
    let lost = r.count("deliveries_lost");
    assert!(expected > 0, "{text}");
    assert!(lost > 0, "{text}");
    assert!(faults.dropped.load(Ordering::Relaxed) >= lost, "{text}");
    assert_eq!(r.count("deliveries_received") + lost, expected, "{text}");
    assert!(r.fraction("delivery_success").unwrap() < 1.0, "{text}");
    let j = r.json();
    assert_eq!(j["metrics"]["deliveries_lost"], lost, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_drops_messages_shows_lost_deliveries() {
    let server = start_server().await;
    // broadcast, by client events and by HTTP API publishes (which the
    // proxy passes through to herald; the drops are on the way out).
    for via in [Via::Ws, Via::Http] {
        let (port, faults) = faulty_proxy(server.port, drop_every_third, Duration::ZERO).await;
        let mut p = tiny_broadcast(server.port);
        p.target = target(port);
        p.via = via;
        let r = broadcast::run(&p).await.unwrap();
        assert_losses_counted(&r, &faults);
        assert_eq!(r.count("deliveries_duplicated"), 0, "{}", r.summary());
        assert_eq!(r.count("deliveries_unexpected"), 0, "{}", r.summary());
    }

    // fanout: each subscriber gets its channel's 10 publishes and loses
    // the 3rd, 6th and 9th; every channel shows it.
    let (port, faults) = faulty_proxy(server.port, drop_every_third, Duration::ZERO).await;
    let mut f = tiny_fanout(port);
    f.drain = Duration::from_secs(1);
    let r = fanout::run(&f).await.unwrap();
    let text = r.summary();
    assert_eq!(r.count("deliveries_expected"), 200, "{text}");
    assert_eq!(r.count("deliveries_lost"), 60, "{text}");
    assert_eq!(faults.dropped.load(Ordering::Relaxed), 60, "{text}");
    assert_losses_counted(&r, &faults);
    for c in 0..4 {
        let name = format!("delivery_success{{channel:benchmark-fanout-{c}}}");
        assert_eq!(r.fraction(&name), Some(0.7), "{text}");
    }
    assert!(
        text.contains("60 of 200 expected deliveries did not arrive"),
        "{text}"
    );
}

/// A server that drops some messages and duplicates others delivers as
/// many frames as it should; the losses must still show, and the
/// duplicates be counted apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_do_not_hide_lost_deliveries() {
    let server = start_server().await;
    let (port, faults) = faulty_proxy(server.port, drop_and_duplicate, Duration::ZERO).await;
    let mut p = tiny_broadcast(server.port);
    p.target = target(port);
    let r = broadcast::run(&p).await.unwrap();
    let text = r.summary();
    assert_losses_counted(&r, &faults);
    let duplicated = r.count("deliveries_duplicated");
    assert!(duplicated > 0, "{text}");
    assert!(
        duplicated <= faults.duplicated.load(Ordering::Relaxed),
        "{text}"
    );
    assert_eq!(r.count("deliveries_unexpected"), 0, "{text}");
    assert!(r.json()["metrics"]["deliveries_duplicated"].is_u64());

    // The same server under fanout: each subscriber counts each publish
    // once, per channel.
    let mut f = tiny_fanout(port);
    f.drain = Duration::from_secs(1);
    let dropped_before = faults.dropped.load(Ordering::Relaxed);
    let before = faults.duplicated.load(Ordering::Relaxed);
    let r = fanout::run(&f).await.unwrap();
    let text = r.summary();
    assert_eq!(r.count("http_publishes"), 40, "{text}");
    assert_eq!(r.count("deliveries_expected"), 200, "{text}");
    // Each subscriber gets its channel's 10 publishes: 3 dropped, 4 doubled.
    assert_eq!(r.count("deliveries_lost"), 60, "{text}");
    assert_eq!(
        faults.dropped.load(Ordering::Relaxed) - dropped_before,
        60,
        "{text}"
    );
    assert_eq!(
        r.count("deliveries_received") + r.count("deliveries_lost"),
        200,
        "{text}"
    );
    let duplicated = r.count("deliveries_duplicated");
    assert!(duplicated > 0, "{text}");
    assert_eq!(
        duplicated,
        faults.duplicated.load(Ordering::Relaxed) - before,
        "{text}"
    );
    assert!(r.count("ws_msgs_received") > r.count("deliveries_received"));
}

/// A publisher that cannot keep its schedule (every HTTP answer held back
/// 100 ms, one closed-loop publisher asked for 40/s) must not hide the
/// backlog: latency counts from the scheduled time, the lag is reported,
/// and the summary says the asked rate was not reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_publishers_behind_schedule_show_in_latency_and_summary() {
    let server = start_server().await;
    let (port, _) = faulty_proxy(server.port, |_| Fault::Pass, Duration::from_millis(100)).await;
    let mut p = tiny_fanout(port);
    p.subscribers = 4;
    p.channels = 2;
    p.publishers = 1;
    p.rate = 40.0;
    p.duration = Duration::from_secs(1);
    let r = fanout::run(&p).await.unwrap();
    let text = r.summary();
    assert_eq!(r.count("http_publishes"), 40, "{text}");
    assert_eq!(r.count("deliveries_lost"), 0, "{text}");
    // At least 100 ms per publish: at most 10/s, against 40/s asked.
    assert_eq!(r.figure("http_publish_rate_asked"), Some(40.0), "{text}");
    assert!(
        r.figure("http_publish_rate_achieved").unwrap() <= 10.5,
        "{text}"
    );
    assert!(text.contains("publishers fell behind"), "{text}");
    // Publish 39 was due at 0.975 s and could not go out before 3.9 s.
    let lag = r.latency("publish_lag").unwrap();
    assert_eq!(lag.count, 40, "{text}");
    assert!(lag.max >= 2900.0, "{text}");
    // Every delivery is at least as late as its publish went out.
    let latency = r.latency("message_latency").unwrap();
    assert!(latency.max >= lag.max * 0.99, "{text}");
    assert!(latency.max >= 2900.0, "{text}");
}

/// A plain TCP relay in front of herald that records the source address of
/// every connection it accepts.
async fn recording_relay(upstream: u16) -> (u16, Arc<Mutex<BTreeSet<IpAddr>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let peers = Arc::new(Mutex::new(BTreeSet::new()));
    let seen = peers.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, peer)) = listener.accept().await {
            seen.lock().unwrap().insert(peer.ip());
            tokio::spawn(async move {
                if let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                    let _ = tokio::io::copy_bidirectional(&mut stream, &mut server).await;
                }
            });
        }
    });
    (port, peers)
}

/// The connections of one run come from several 127.0.0.x addresses, not
/// just 127.0.0.1: that is what lets a run go past one address's ports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_spread_over_loopback_source_addresses() {
    let server = start_server().await;
    let (port, peers) = recording_relay(server.port).await;
    let mut p = ConnectParams::new(target(port));
    p.clients = 20;
    p.progress = false;
    let r = connect::run(&p).await.unwrap();
    assert_eq!(
        r.fraction("ws_subscribe_success"),
        Some(1.0),
        "{}",
        r.summary()
    );
    // Client i connects from 127.0.0.(1 + i); the preflight from the
    // kernel's choice, 127.0.0.1.
    let expected: BTreeSet<IpAddr> = (1..=20u8)
        .map(|x| IpAddr::V4(Ipv4Addr::new(127, 0, 0, x)))
        .collect();
    assert_eq!(*peers.lock().unwrap(), expected);
}

/// A sweep against a server that admits at most 10 connections: with
/// `hold`, every step's clients are open at once, so the step of 40 cannot
/// pass more than 10 of them, and the sweep reports where it dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_reports_where_a_connection_limit_makes_success_drop() {
    let server = start_server_with(Some("max_connections = 10")).await;
    let mut base = ConnectParams::new(target(server.port));
    base.hold = true;
    base.progress = false;
    let s = connect::sweep(&SweepParams {
        base,
        steps: vec![4, 40],
        pause: Duration::from_millis(200),
    })
    .await
    .unwrap();
    let text = s.summary();
    assert_eq!(s.fraction("ws_subscribe_success{n:4}"), Some(1.0), "{text}");
    assert!(
        s.fraction("ws_subscribe_success{n:40}").unwrap() <= 0.25,
        "{text}"
    );
    assert!(s.count("connection_errors{n:40}") >= 30, "{text}");
    assert_eq!(s.figure("sweep_first_below_100pct"), Some(40.0), "{text}");
    assert_eq!(s.figure("sweep_first_below_99pct"), Some(40.0), "{text}");
    // The timeline's errors are per second: they add up to the step's total.
    let errors: u64 = s
        .timeline
        .iter()
        .filter(|t| t.step == Some(40))
        .map(|t| t.errors)
        .sum();
    assert_eq!(
        errors,
        s.count("connection_errors{n:40}"),
        "{:?}",
        s.timeline
    );
    // The server's refusal (4004, over quota) is what the notes show.
    assert!(s.notes.iter().any(|n| n.contains("4004")), "{text}");
    let j = s.json();
    assert_eq!(j["metrics"]["sweep_first_below_100pct"], 40.0);
}

/// A relay that refuses every connection from 127.0.0.64, i.e. client i
/// of a step where i % 64 == 63: exactly one failure in a step of 100 (99 %,
/// below 100 % but not below 99 %) and two in a step of 150 (98.7 %).
async fn relay_refusing_source_64(upstream: u16) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let refused = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 64));
    tokio::spawn(async move {
        while let Ok((mut stream, peer)) = listener.accept().await {
            if peer.ip() == refused {
                continue; // dropped: the client sees the connection close
            }
            tokio::spawn(async move {
                if let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                    let _ = tokio::io::copy_bidirectional(&mut stream, &mut server).await;
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_tells_below_100_from_below_99() {
    let server = start_server().await;
    let port = relay_refusing_source_64(server.port).await;
    let mut base = ConnectParams::new(target(port));
    base.progress = false;
    base.timeout = Duration::from_secs(10);
    let s = connect::sweep(&SweepParams {
        base,
        steps: vec![50, 100, 150],
        pause: Duration::from_millis(100),
    })
    .await
    .unwrap();
    let text = s.summary();
    assert_eq!(s.fraction("ws_connect_success{n:50}"), Some(1.0), "{text}");
    assert_eq!(
        s.fraction("ws_connect_success{n:100}"),
        Some(0.99),
        "{text}"
    );
    assert_eq!(s.count("connection_errors{n:150}"), 2, "{text}");
    assert_eq!(s.figure("sweep_first_below_100pct"), Some(100.0), "{text}");
    assert_eq!(s.figure("sweep_first_below_99pct"), Some(150.0), "{text}");
}

/// A server that answers every connection with a plain HTTP page.
async fn plain_http_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\
                          content-length: 5\r\nconnection: close\r\n\r\nhello",
                    )
                    .await;
            });
        }
    });
    port
}

/// A WebSocket server that greets with "hello" instead of
/// `pusher:connection_established`.
async fn hello_websocket_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                let _ = ws.send(Message::text("hello")).await;
                while let Some(Ok(_)) = ws.next().await {}
            });
        }
    });
    port
}

/// Pointed at something that is not a Pusher server, the bench stops with
/// one sentence that says so, and a non-zero exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_does_not_speak_the_protocol_is_a_clear_error() {
    let http = plain_http_server().await;
    let ws = hello_websocket_server().await;
    for (port, says) in [
        (http, "does not look like a Pusher server"),
        (ws, "does not speak the Pusher protocol"),
    ] {
        let url = format!("ws://127.0.0.1:{port}");
        for scenario in ["connect", "fanout", "broadcast"] {
            let out = bench_cli_output(&[scenario, "--url", &url, "--clients", "2"]).await;
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{scenario}: {stderr}");
            assert!(stderr.contains(says), "{scenario}: {stderr}");
            assert!(stderr.contains(&url), "{scenario}: {stderr}");
            // No summary: nothing was measured.
            assert!(out.stdout.is_empty(), "{scenario}: {stderr}");
        }
    }
}

/// The command line end to end: `--json` has every figure under the
/// summary's metric names, `--html` the charts as embedded SVG.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_writes_json_and_html_reports() {
    let server = start_server().await;
    let url = format!("ws://127.0.0.1:{}", server.port);
    let dir = std::env::temp_dir();
    let stem = format!("herald-bench-cli-{}-{}", std::process::id(), server.port);
    for (scenario, extra) in [
        (
            "fanout",
            &[
                "--clients",
                "4",
                "--channels",
                "2",
                "--publishers",
                "1",
                "--rate",
                "10",
                "--duration",
                "1s",
                // The single-threaded generator; connect below runs on the
                // default one, so both runtimes deliver everything.
                "--threads",
                "1",
            ][..],
        ),
        ("connect", &["--clients", "5"][..]),
    ] {
        let json_path = dir.join(format!("{stem}-{scenario}.json"));
        let html_path = dir.join(format!("{stem}-{scenario}.html"));
        let mut args = vec![scenario, "--url", &url];
        args.extend_from_slice(extra);
        let (json_arg, html_arg) = (json_path.to_str().unwrap(), html_path.to_str().unwrap());
        args.extend_from_slice(&["--json", json_arg, "--html", html_arg]);
        let out = bench_cli_output(&args).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
        let html = std::fs::read_to_string(&html_path).unwrap();
        let _ = std::fs::remove_file(&json_path);
        let _ = std::fs::remove_file(&html_path);

        let metrics = json["metrics"].as_object().unwrap();
        // Every JSON metric is a line of the printed summary, by name.
        for name in metrics.keys() {
            assert!(stdout.contains(&format!(" {name}.")), "{name}: {stdout}");
        }
        assert!(!json["timeline"].as_array().unwrap().is_empty(), "{json}");
        assert!(html.contains("<svg") && html.contains("<h2>Timeline</h2>"));
        assert!(html.contains("<h2>Latency histograms</h2>"));
        if scenario == "fanout" {
            // 10 publishes, 5 per channel, 2 subscribers per channel.
            assert_eq!(json["metrics"]["http_publishes"], 10, "{json}");
            assert_eq!(json["metrics"]["deliveries_expected"], 20, "{json}");
            assert_eq!(json["metrics"]["deliveries_received"], 20, "{json}");
            for name in [
                "deliveries_lost",
                "deliveries_duplicated",
                "deliveries_unexpected",
            ] {
                assert_eq!(json["metrics"][name], 0, "{name}: {json}");
            }
            assert_eq!(json["metrics"]["delivery_success"], 1.0, "{json}");
            for name in ["message_latency", "publish_lag", "http_publish_duration"] {
                for key in ["avg", "min", "med", "max", "p90", "p95", "p99"] {
                    assert!(json["metrics"][name][key].is_number(), "{name}.{key}");
                }
            }
            assert_eq!(json["metrics"]["message_latency"]["count"], 20, "{json}");
            assert_eq!(json["metrics"]["http_publish_rate_asked"], 10.0, "{json}");
            assert!(html.contains("message_latency"));
        } else {
            assert_eq!(json["metrics"]["ws_sessions"], 5, "{json}");
            assert_eq!(json["metrics"]["ws_subscribe_success"], 1.0, "{json}");
            let confirmed: u64 = json["timeline"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["received"].as_u64().unwrap())
                .sum();
            assert_eq!(confirmed, 5, "{json}");
        }
    }
}

/// A user that has left keeps its socket open for the grace period, reading
/// what was sent before it left; until it closes, it is an open connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_users_count_as_connected_until_closed() {
    let server = start_server().await;
    let mut p = tiny_broadcast(server.port);
    p.peak = 4;
    p.duration = Duration::from_secs(1);
    p.lifetime = Duration::from_secs(10);
    p.grace = Duration::from_millis(2500);
    let r = broadcast::run(&p).await.unwrap();
    let text = r.summary();
    assert_eq!(r.count("connection_errors"), 0, "{text}");
    assert_eq!(r.figure("peak_connections"), Some(4.0), "{text}");
    // The ramp ends at 1 s and every user leaves within a check interval
    // (250 ms); their sockets stay open until at least 3.5 s.
    let at_2s = r
        .timeline
        .iter()
        .find(|t| t.second == 2)
        .expect("a tick at 2 s");
    assert_eq!(at_2s.connections, 4, "{:?}", r.timeline);
    assert_eq!(
        r.timeline.last().unwrap().connections,
        0,
        "{:?}",
        r.timeline
    );
}

/// `latency` over Pusher and both AppSync APIs: every round trip of every
/// kind the protocol has is made and timed, none fails (counts, never
/// speeds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_times_each_kind_of_round_trip() {
    use herald_bench::latency::{self, Kind, LatencyParams};
    use herald_bench::proto::Proto;
    let server = start_server().await;
    for protocol in [Proto::Pusher, Proto::AppsyncGraphql, Proto::AppsyncEvents] {
        let mut p = LatencyParams::new(
            Target::new(
                &format!("ws://127.0.0.1:{}", server.port),
                "app-id",
                "app-key",
                "app-secret",
                false,
            )
            .unwrap(),
        );
        p.protocol = protocol;
        p.clients = 2;
        p.rounds = 5;
        p.interval = Duration::from_millis(5);
        p.server_pid = Some(server.child.id());
        let r = latency::run(&p).await.unwrap();
        let text = r.summary();
        let kinds = Kind::of(protocol);
        assert_eq!(r.count("round_trips_failed"), 0, "{text}");
        assert_eq!(r.count("round_trips"), 2 * 5 * kinds.len() as u64, "{text}");
        for kind in kinds {
            let name = format!("latency_{}", kind.name());
            assert_eq!(
                r.latency(&name).map(|t| t.count),
                Some(10),
                "{name}: {text}"
            );
        }
    }
}
