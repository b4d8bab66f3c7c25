//! `transports`: what a held Pusher client costs the server over each of
//! pusher-js's transports: the WebSocket, or the HTTP fallback
//! (`xhr_streaming`, `xhr_polling`). N clients subscribe to one channel and
//! are held; the server's resident memory per held client is read from
//! `/proc` (with `--server-pid`); then events are published at a steady
//! rate through the HTTP API and the server's CPU per delivery is reported.
//! Run it once per `--transport`, against the same server, to compare.
//!
//! The HTTP clients behave as pusher-js does: a stream (or a poll that is
//! sent again as soon as it is answered), `xhr_send` POSTs for their
//! messages, `[]` for each `h` on a stream, `pusher:pong` for each ping.

use super::client::{Conn, HttpPublisher};
use super::{cpu_seconds, rss_bytes, BenchError, Report, Target};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The transport the clients hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Ws,
    XhrStreaming,
    XhrPolling,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Ws => "ws",
            Transport::XhrStreaming => "xhr_streaming",
            Transport::XhrPolling => "xhr_polling",
        }
    }

    pub fn from_name(s: &str) -> Option<Transport> {
        [
            Transport::Ws,
            Transport::XhrStreaming,
            Transport::XhrPolling,
        ]
        .into_iter()
        .find(|t| t.name() == s)
    }
}

#[derive(Debug, Clone)]
pub struct TransportsParams {
    pub target: Target,
    pub transport: Transport,
    pub clients: usize,
    /// Events published once every client is held.
    pub events: usize,
    /// Events per second.
    pub rate: u32,
    /// How long to hold the clients before memory is read.
    pub hold: Duration,
    pub concurrency: usize,
    pub timeout: Duration,
    pub server_pid: Option<u32>,
}

const CHANNEL: &str = "bench-transports";
const EVENT: &str = "bench-transports-ev";

struct Shared {
    delivered: AtomicU64,
    ready: AtomicU64,
    stop: AtomicBool,
    failed: AtomicU64,
}

pub async fn run(p: &TransportsParams) -> Result<Report, BenchError> {
    let mut report = Report::new("transports");
    report.param("url", &p.target.url);
    report.param("transport", p.transport.name());
    report.param("clients", p.clients);
    report.param("events", p.events);
    report.param("rate", p.rate);
    let shared = Arc::new(Shared {
        delivered: AtomicU64::new(0),
        ready: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        failed: AtomicU64::new(0),
    });
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(p.clients.saturating_mul(2))
        .build()
        .map_err(|e| BenchError(format!("HTTP client: {e}")))?;
    let rss_before = rss_bytes(p.server_pid);
    let opening = Arc::new(tokio::sync::Semaphore::new(p.concurrency.max(1)));
    let mut tasks = Vec::with_capacity(p.clients);
    for i in 0..p.clients {
        let (target, shared, http, opening) = (
            p.target.clone(),
            shared.clone(),
            http.clone(),
            opening.clone(),
        );
        let (transport, timeout) = (p.transport, p.timeout);
        tasks.push(tokio::spawn(async move {
            let permit = opening.acquire_owned().await.ok();
            let r = match transport {
                Transport::Ws => ws_client(&target, &shared, timeout, permit).await,
                t => xhr_client(&target, &http, t, i, &shared, timeout, permit).await,
            };
            if let Err(e) = r {
                if shared.stop.load(Relaxed) {
                    return;
                }
                if shared.failed.fetch_add(1, Relaxed) == 0 {
                    eprintln!("herald bench transports: client {i}: {e}");
                }
            }
        }));
    }
    let started = Instant::now();
    while (shared.ready.load(Relaxed) + shared.failed.load(Relaxed)) < p.clients as u64 {
        if started.elapsed() > p.timeout + Duration::from_secs(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready = shared.ready.load(Relaxed);
    report.counter("clients_held", ready);
    report.counter("clients_failed", shared.failed.load(Relaxed));
    tokio::time::sleep(p.hold).await;
    let rss_held = rss_bytes(p.server_pid);
    if let (Some(a), Some(b)) = (rss_before, rss_held) {
        let per = (b as f64 - a as f64) / (ready.max(1) as f64);
        report.value("server_rss_per_client", Some(per), "B");
    }

    let publisher = HttpPublisher::new(&p.target);
    let cpu0 = cpu_seconds(p.server_pid);
    let gen0 = cpu_seconds(None);
    let t0 = Instant::now();
    let every = Duration::from_secs_f64(1.0 / p.rate.max(1) as f64);
    let mut next = Instant::now();
    let data = format!("{{\"pad\":\"{}\"}}", "x".repeat(200));
    for _ in 0..p.events {
        tokio::time::sleep_until(next.into()).await;
        next += every;
        if let Err(e) = publisher.publish(CHANNEL, EVENT, &data, None).await {
            report.notes.push(format!("publish failed: {e:?}"));
            break;
        }
    }
    let want = ready * p.events as u64;
    let wait = Instant::now();
    while shared.delivered.load(Relaxed) < want && wait.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let wall = t0.elapsed().as_secs_f64();
    let delivered = shared.delivered.load(Relaxed);
    report.counter("deliveries", delivered);
    report.counter("deliveries_expected", want);
    if let (Some(a), Some(b)) = (cpu0, cpu_seconds(p.server_pid)) {
        report.cpu("server_cpu", b - a, wall);
        report.value(
            "server_cpu_per_delivery",
            Some((b - a) * 1e6 / delivered.max(1) as f64),
            "us",
        );
    }
    if let (Some(a), Some(b)) = (gen0, cpu_seconds(None)) {
        report.cpu("generator_cpu", b - a, wall);
    }
    shared.stop.store(true, Relaxed);
    for t in tasks {
        t.abort();
    }
    Ok(report)
}

async fn ws_client(
    target: &Target,
    shared: &Shared,
    timeout: Duration,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Result<(), String> {
    let mut conn = Conn::open(target, None, timeout)
        .await
        .map_err(|e| format!("{e:?}"))?;
    conn.subscribe(target, &[CHANNEL], timeout)
        .await
        .map_err(|e| format!("{e:?}"))?;
    drop(permit);
    shared.ready.fetch_add(1, Relaxed);
    while !shared.stop.load(Relaxed) {
        let text = conn.recv().await.map_err(|e| format!("{e:?}"))?;
        if text.contains(EVENT) {
            shared.delivered.fetch_add(1, Relaxed);
        }
    }
    Ok(())
}

/// One pusher-js-like HTTP client.
async fn xhr_client(
    target: &Target,
    http: &reqwest::Client,
    transport: Transport,
    i: usize,
    shared: &Shared,
    timeout: Duration,
    mut permit: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Result<(), String> {
    let base = format!(
        "{}/pusher/app/{}/{}/bench{i}x{}",
        target.http_base(),
        target.key,
        i % 1000,
        std::process::id()
    );
    let receive = match transport {
        Transport::XhrStreaming => format!("{base}/xhr_streaming?protocol=7"),
        _ => format!("{base}/xhr?protocol=7"),
    };
    let send = format!("{base}/xhr_send");
    let post = |body: String| {
        let (http, send) = (http.clone(), send.clone());
        async move {
            let r = http
                .post(&send)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .map_err(|e| format!("xhr_send: {e}"))?;
            if !r.status().is_success() {
                return Err(format!("xhr_send: {}", r.status()));
            }
            Ok::<_, String>(())
        }
    };
    let message = |text: &str| serde_json::to_string(&[text]).unwrap_or_default();
    let started = Instant::now();
    let mut subscribed = false;
    let mut line = Vec::new();
    while !shared.stop.load(Relaxed) {
        let mut res = http
            .post(&receive)
            .send()
            .await
            .map_err(|e| format!("receive: {e}"))?;
        while let Some(chunk) = res.chunk().await.map_err(|e| format!("receive: {e}"))? {
            for &b in chunk.iter() {
                if b != b'\n' {
                    line.push(b);
                    continue;
                }
                let text = String::from_utf8_lossy(&line).into_owned();
                line.clear();
                match text.as_bytes().first() {
                    Some(b'h') if transport == Transport::XhrStreaming => post("[]".into()).await?,
                    Some(b'c') => return Err(format!("closed: {text}")),
                    Some(b'a') => {
                        let n = text.matches(EVENT).count() as u64;
                        if n > 0 {
                            shared.delivered.fetch_add(n, Relaxed);
                        }
                        if text.contains("pusher:ping") {
                            post(message(r#"{"event":"pusher:pong","data":{}}"#)).await?;
                        }
                        if text.contains("connection_established") && !subscribed {
                            let sub = format!(
                                r#"{{"event":"pusher:subscribe","data":{{"channel":"{CHANNEL}"}}}}"#
                            );
                            post(message(&sub)).await?;
                        }
                        if text.contains("subscription_succeeded") && !subscribed {
                            subscribed = true;
                            permit.take();
                            shared.ready.fetch_add(1, Relaxed);
                        }
                    }
                    _ => {}
                }
            }
        }
        if transport == Transport::XhrStreaming {
            return Err("the stream ended".into());
        }
        if !subscribed && started.elapsed() > timeout {
            return Err("not subscribed in time".into());
        }
    }
    Ok(())
}
