//! `idle`: open N connections, subscribe each to K channels, hold them,
//! and report the server's resident memory per connection (read from
//! `/proc/<pid>/status` when the server's pid is given) before and after.

use super::client::Conn;
use super::metrics::{Latency, Live, Monitor};
use super::proto::Proto;
use super::shard::{self, Shard};
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
    /// Nodes of a cluster the clients spread over, round-robin (several
    /// `--url`s); empty: `target`.
    pub nodes: Vec<Target>,
    /// This process's part of a `--processes` run (None: all of it). A
    /// child opens its share, meets the others at barrier `open`, and
    /// closes when the parent answers: the parent measures the servers'
    /// memory and holds meanwhile.
    pub shard: Option<Shard>,
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
            nodes: Vec::new(),
            shard: None,
        }
    }
}

pub async fn run(p: &IdleParams) -> Result<Report, BenchError> {
    p.protocol.check("idle", PROTOCOLS)?;
    let mut report = Report::new("idle");
    let urls: Vec<&str> = match p.nodes.len() {
        0 => vec![p.target.url.as_str()],
        _ => p.nodes.iter().map(|t| t.url.as_str()).collect(),
    };
    report.param("url", urls.join(","));
    report.param("protocol", p.protocol.name());
    report.param("clients", p.clients);
    report.param("channels_per_client", p.channels_per_client);
    report.param("channel_pool", p.channel_pool);
    report.param("hold", format!("{:?}", p.hold));
    let owned = shard::share(p.shard, p.clients);
    if let Some(w) = raise_nofile(owned as u64) {
        eprintln!("herald bench: {w}");
        report.notes.push(w);
    }
    for target in std::iter::once(&p.target).chain(&p.nodes) {
        match p.protocol {
            Proto::Pusher => preflight(target, None, false).await?,
            _ => super::actioncable::preflight(target, false)
                .await
                .map_err(BenchError)?,
        }
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
    // Subscribed connections per node, for each server's memory per
    // connection (the parent of a `--processes` run divides by them).
    let per_node: Arc<Vec<AtomicU64>> =
        Arc::new((0..p.nodes.len()).map(|_| AtomicU64::new(0)).collect());
    let dropped = Arc::new(AtomicU64::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(p.concurrency.max(1)));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(owned.max(1));
    let mut tasks = tokio::task::JoinSet::new();
    for i in (0..p.clients).filter(|&i| shard::owns(p.shard, i)) {
        let channels: Vec<String> = (0..p.channels_per_client)
            .map(|j| {
                format!(
                    "benchmark-idle-{}",
                    (i * p.channels_per_client + j) % p.channel_pool.max(1)
                )
            })
            .collect();
        let target = super::node(&p.target, &p.nodes, i).clone();
        let (timeout, proto) = (p.timeout, p.protocol);
        let (live, connecting, subscribed, dropped) = (
            live.clone(),
            connecting.clone(),
            subscribed.clone(),
            dropped.clone(),
        );
        let (per_node, node_index) = (per_node.clone(), i % p.nodes.len().max(1));
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
                    if let Some(n) = per_node.get(node_index) {
                        n.fetch_add(1, Relaxed);
                    }
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
    for _ in 0..owned {
        if ready_rx.recv().await.is_none() {
            break;
        }
    }
    let opened_after = started.elapsed().as_secs_f64();
    let (server_open, server_after, self_after);
    if p.shard.is_some() {
        // The parent settles, measures and holds while every process
        // waits here with its connections open.
        shard::sync(p.shard, "open", serde_json::Value::Null).await?;
        self_after = rss_bytes(None);
        (server_open, server_after) = (None, None);
    } else {
        // Let allocations settle, measure, hold, measure again.
        tokio::time::sleep(Duration::from_secs(1)).await;
        server_open = p.server_pid.and_then(|pid| rss_bytes(Some(pid)));
        tokio::time::sleep(p.hold).await;
        server_after = p.server_pid.and_then(|pid| rss_bytes(Some(pid)));
        self_after = rss_bytes(None);
    }
    let held = live.connections.load(Relaxed).max(0) as u64;
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    report.timeline = monitor.finish().await;
    report.seconds = started.elapsed().as_secs_f64();

    let n = subscribed.load(Relaxed);
    report.counter("ws_sessions", owned as u64);
    report.rate("ws_subscribe_success", n, owned as u64);
    if p.nodes.len() > 1 {
        for (k, count) in per_node.iter().enumerate() {
            report.counter(&format!("ws_subscribed{{node:{k}}}"), count.load(Relaxed));
        }
    }
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
    if p.server_pid.is_none() && p.shard.is_none() {
        report
            .notes
            .push("give --server-pid to measure the server's memory per connection".into());
    }
    report.errors(&live);
    cpu.finish(&mut report);
    super::server_memory(&mut report, p.server_pid);
    Ok(report)
}
