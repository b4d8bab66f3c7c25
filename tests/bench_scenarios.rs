//! `herald bench` scenarios at tiny scale against a real herald: a few
//! clients for a couple of seconds, asserting deliveries and counts (never
//! speeds), plus a proxy that drops messages to check that losses are
//! reported as lost deliveries.

use futures_util::{SinkExt, StreamExt};
use herald::bench::broadcast::{self, BroadcastParams, Via};
use herald::bench::connect::{self, ConnectParams, SweepParams};
use herald::bench::fanout::{self, FanoutParams};
use herald::bench::idle::{self, IdleParams};
use herald::bench::Target;
use std::net::TcpListener as StdListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
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

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start_server() -> Server {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["serve", "--port", &port.to_string(), "--log", "warn"])
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
    // The avalanche's timeline is kept: its per-second `received` counts
    // (confirmed subscriptions) add up to the run's total.
    assert!(!r.timeline.is_empty(), "{}", r.summary());
    assert_eq!(r.timeline.iter().map(|t| t.received).sum::<u64>(), 20);
    assert_eq!(r.timeline.iter().map(|t| t.errors).sum::<u64>(), 0);
    let j = r.json();
    assert!(!j["timeline"].as_array().unwrap().is_empty(), "{j}");
    assert!(r.html().contains("<h2>Timeline</h2>"));

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
    let j = s.json();
    assert_eq!(j["metrics"]["ws_connect_success{n:10}"], 1.0);
    assert!(j["metrics"]["sweep_first_below_99pct"].is_null());
    // One timeline for the sweep: every tick tagged with its step, seconds
    // strictly increasing across steps, each step's subscriptions complete.
    assert!(
        s.timeline.iter().all(|t| t.step.is_some()),
        "{:?}",
        s.timeline
    );
    assert!(
        s.timeline.windows(2).all(|w| w[0].second < w[1].second),
        "{:?}",
        s.timeline
    );
    for n in [5u64, 10] {
        let got: u64 = s
            .timeline
            .iter()
            .filter(|t| t.step == Some(n))
            .map(|t| t.received)
            .sum();
        assert_eq!(got, n, "{:?}", s.timeline);
    }
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
        let r = broadcast::run(&p).await.unwrap();
        let text = r.summary();
        assert!(r.count("ws_msgs_sent") > 0, "{text}");
        assert!(r.count("deliveries_expected") > 0, "{text}");
        assert_eq!(r.count("deliveries_lost"), 0, "{text}");
        assert_eq!(
            r.count("deliveries_received"),
            r.count("deliveries_expected"),
            "{text}"
        );
        assert_eq!(r.fraction("delivery_success"), Some(1.0), "{text}");
        assert_eq!(r.count("connection_errors"), 0, "{text}");
        assert!(r.latency("message_latency").unwrap().count > 0);
        assert!(!r.timeline.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_counts_every_channel() {
    let server = start_server().await;
    let mut p = FanoutParams::new(target(server.port));
    p.subscribers = 20;
    p.channels = 4;
    p.publishers = 2;
    p.rate = 20.0;
    p.duration = Duration::from_secs(2);
    p.progress = false;
    let r = fanout::run(&p).await.unwrap();
    let text = r.summary();
    // 40 publishes, 10 per channel, 5 subscribers per channel.
    assert_eq!(r.count("http_publishes"), 40, "{text}");
    assert_eq!(r.count("deliveries_expected"), 200, "{text}");
    assert_eq!(r.count("deliveries_received"), 200, "{text}");
    assert_eq!(r.count("deliveries_lost"), 0, "{text}");
    for c in 0..4 {
        let name = format!("delivery_success{{channel:benchmark-fanout-{c}}}");
        assert_eq!(r.fraction(&name), Some(1.0), "{text}");
    }
    let j = r.json();
    for key in ["avg", "min", "med", "max", "p90", "p95", "p99"] {
        assert!(j["metrics"]["message_latency"][key].is_number(), "{key}");
    }
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

/// A WebSocket proxy in front of herald that drops every third
/// `client-broadcast` frame on its way to a client.
#[allow(clippy::result_large_err)] // tungstenite's handshake callback signature
async fn dropping_proxy(upstream: u16) -> (u16, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let dropped = Arc::new(AtomicU64::new(0));
    let counter = dropped.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut path = String::new();
                let Ok(client) = tokio_tungstenite::accept_hdr_async(
                    stream,
                    |req: &tokio_tungstenite::tungstenite::handshake::server::Request, resp| {
                        path = req.uri().to_string();
                        Ok(resp)
                    },
                )
                .await
                else {
                    return;
                };
                let url = format!("ws://127.0.0.1:{upstream}{path}");
                let Ok((server, _)) = tokio_tungstenite::connect_async(url).await else {
                    return;
                };
                let (mut c_tx, mut c_rx) = client.split();
                let (mut s_tx, mut s_rx) = server.split();
                let up = async {
                    while let Some(Ok(m)) = c_rx.next().await {
                        if s_tx.send(m).await.is_err() {
                            break;
                        }
                    }
                };
                let down = async {
                    let mut n = 0u64;
                    while let Some(Ok(m)) = s_rx.next().await {
                        if let Message::Text(t) = &m {
                            if t.contains("client-broadcast") {
                                n += 1;
                                if n.is_multiple_of(3) {
                                    counter.fetch_add(1, Ordering::Relaxed);
                                    continue;
                                }
                            }
                        }
                        if c_tx.send(m).await.is_err() {
                            break;
                        }
                    }
                };
                tokio::select! { _ = up => {}, _ = down => {} }
            });
        }
    });
    (port, dropped)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_drops_messages_shows_lost_deliveries() {
    let server = start_server().await;
    let (port, dropped) = dropping_proxy(server.port).await;
    let mut p = tiny_broadcast(server.port);
    p.target = target(port);
    let r = broadcast::run(&p).await.unwrap();
    let text = r.summary();
    let expected = r.count("deliveries_expected");
    let lost = r.count("deliveries_lost");
    assert!(expected > 0, "{text}");
    assert!(lost > 0, "{text}");
    assert!(dropped.load(Ordering::Relaxed) >= lost, "{text}");
    assert_eq!(r.count("deliveries_received") + lost, expected, "{text}");
    assert!(r.fraction("delivery_success").unwrap() < 1.0, "{text}");
}
