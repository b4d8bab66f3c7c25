//! `idle`: open N connections, subscribe each to K channels, hold them,
//! and report the server's resident memory per connection (read from
//! `/proc/<pid>/status` when the server's pid is given) before and after.

use super::client::Conn;
use super::metrics::{Latency, Live, Monitor};
use super::proto::Proto;
use super::{preflight, raise_nofile, rss_bytes, BenchError, CpuMeter, Report, Target};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The protocols `idle` speaks.
pub const PROTOCOLS: &[Proto] = &[Proto::Pusher, Proto::ActionCable, Proto::ActionCableExt];

#[derive(Debug, Clone)]
pub struct IdleParams {
    pub target: Target,
    /// The protocol the clients speak ([`PROTOCOLS`]).
    pub protocol: Proto,
    pub clients: usize,
    /// Channels each connection subscribes to.
    pub channels_per_client: usize,
    /// Distinct channel names used (`benchmark-idle-0` ...).
    pub channel_pool: usize,
    /// How long to hold the connections once all are open.
    pub hold: Duration,
    /// Connections being opened at once.
    pub concurrency: usize,
    pub timeout: Duration,
    pub progress: bool,
    pub server_pid: Option<u32>,
}

impl IdleParams {
    pub fn new(target: Target) -> IdleParams {
        IdleParams {
            target,
            protocol: Proto::Pusher,
            clients: 1000,
            channels_per_client: 1,
            channel_pool: 100,
            hold: Duration::from_secs(10),
            concurrency: 256,
            timeout: Duration::from_secs(30),
            progress: true,
            server_pid: None,
        }
    }
}

pub async fn run(p: &IdleParams) -> Result<Report, BenchError> {
    p.protocol.check("idle", PROTOCOLS)?;
    let mut report = Report::new("idle");
    report.param("url", &p.target.url);
    report.param("protocol", p.protocol.name());
    report.param("clients", p.clients);
    report.param("channels_per_client", p.channels_per_client);
    report.param("channel_pool", p.channel_pool);
    report.param("hold", format!("{:?}", p.hold));
    if let Some(w) = raise_nofile(p.clients as u64) {
        eprintln!("herald bench: {w}");
        report.notes.push(w);
    }
    match p.protocol {
        Proto::Pusher => preflight(&p.target, None, false).await?,
        _ => super::actioncable::preflight(&p.target, false)
            .await
            .map_err(BenchError)?,
    }
    let cpu = CpuMeter::start(p.server_pid);
    let started = Instant::now();
    // Let the preflight connection's memory settle before the baseline.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let server_before = p.server_pid.and_then(|pid| rss_bytes(Some(pid)));
    let self_before = rss_bytes(None);

    let live = Arc::new(Live::default());
    let monitor = Monitor::start("idle", live.clone(), None, p.progress);
    let connecting = Arc::new(Latency::default());
    let subscribed = Arc::new(AtomicU64::new(0));
    let dropped = Arc::new(AtomicU64::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(p.concurrency.max(1)));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(p.clients.max(1));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..p.clients {
        let channels: Vec<String> = (0..p.channels_per_client)
            .map(|j| {
                format!(
                    "benchmark-idle-{}",
                    (i * p.channels_per_client + j) % p.channel_pool.max(1)
                )
            })
            .collect();
        let (target, timeout, proto) = (p.target.clone(), p.timeout, p.protocol);
        let (live, connecting, subscribed, dropped) = (
            live.clone(),
            connecting.clone(),
            subscribed.clone(),
            dropped.clone(),
        );
        let (gate, mut stop, ready) = (gate.clone(), stop_rx.clone(), ready_tx.clone());
        tasks.spawn(async move {
            let permit = gate.acquire().await;
            let t0 = Instant::now();
            let opened = match proto {
                Proto::Pusher => Conn::open(&target, target.source_for(i), timeout).await,
                _ => proto.open(&target, target.source_for(i), timeout).await,
            };
            let mut conn = match opened {
                Ok(c) => c,
                Err(e) => {
                    live.error(e.kind(), e.explain(&target));
                    let _ = ready.send(()).await;
                    return;
                }
            };
            live.connections.fetch_add(1, Relaxed);
            let names: Vec<&str> = channels.iter().map(String::as_str).collect();
            let subscribed_all = match proto {
                Proto::Pusher => conn.subscribe(&target, &names, timeout).await,
                // One `BenchmarkChannel` subscription per bench channel
                // (its `id` the channel's name).
                _ => {
                    let ids: Vec<String> = names
                        .iter()
                        .map(|n| super::actioncable::identifier_for(n))
                        .collect();
                    super::actioncable::subscribe_identifiers(&mut conn, &ids, timeout).await
                }
            };
            let ok = match subscribed_all {
                Ok(()) => {
                    connecting.record_duration(i, t0.elapsed());
                    subscribed.fetch_add(1, Relaxed);
                    true
                }
                Err(e) => {
                    live.error(e.kind(), e.explain(&target));
                    false
                }
            };
            drop(permit);
            let _ = ready.send(()).await;
            if ok {
                // Hold: answer pings, notice a server that drops us.
                loop {
                    tokio::select! {
                        r = conn.recv() => {
                            if let Err(e) = r {
                                dropped.fetch_add(1, Relaxed);
                                live.error(e.kind(), e.explain(&target));
                                live.connections.fetch_sub(1, Relaxed);
                                return;
                            }
                            live.received.fetch_add(1, Relaxed);
                        }
                        _ = stop.changed() => break,
                    }
                }
            }
            conn.close().await;
            live.connections.fetch_sub(1, Relaxed);
        });
    }
    drop(ready_tx);
    for _ in 0..p.clients {
        if ready_rx.recv().await.is_none() {
            break;
        }
    }
    let opened_after = started.elapsed().as_secs_f64();
    // Let allocations settle, measure, hold, measure again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let server_open = p.server_pid.and_then(|pid| rss_bytes(Some(pid)));
    tokio::time::sleep(p.hold).await;
    let server_after = p.server_pid.and_then(|pid| rss_bytes(Some(pid)));
    let self_after = rss_bytes(None);
    let held = live.connections.load(Relaxed).max(0) as u64;
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    report.timeline = monitor.finish().await;
    report.seconds = started.elapsed().as_secs_f64();

    let n = subscribed.load(Relaxed);
    report.counter("ws_sessions", p.clients as u64);
    report.rate("ws_subscribe_success", n, p.clients as u64);
    report.counter("connections_held", held);
    report.counter("connections_dropped_by_server", dropped.load(Relaxed));
    report.trend("ws_session_setup", connecting.total());
    report.value("all_open_after", Some(opened_after), "s");
    let f = |v: Option<u64>| v.map(|b| b as f64);
    report.value("server_rss_before", f(server_before), "B");
    report.value("server_rss_open", f(server_open), "B");
    report.value("server_rss_after", f(server_after), "B");
    let per = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) if n > 0 => Some((b as f64 - a as f64) / n as f64),
        _ => None,
    };
    report.value(
        "server_memory_per_connection",
        per(server_before, server_after),
        "B",
    );
    report.value(
        "generator_memory_per_connection",
        per(self_before, self_after),
        "B",
    );
    if p.server_pid.is_none() {
        report
            .notes
            .push("give --server-pid to measure the server's memory per connection".into());
    }
    report.errors(&live);
    cpu.finish(&mut report);
    super::server_memory(&mut report, p.server_pid);
    Ok(report)
}
