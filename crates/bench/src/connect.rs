//! `connect`: a connection avalanche. N clients connect and subscribe to a
//! public channel all at once; each disconnects after its confirmation (or,
//! with `hold`, once every client has either succeeded or failed).
//! `--sweep` repeats it for growing N and reports where success first drops
//! below 100 % and 99 %. The monitor's per-second timeline (connections,
//! confirmed subscriptions, errors) goes into the report, so `--json` and
//! `--html` show how the avalanche unfolded. The clients speak Pusher or,
//! with `--protocol actioncable`, Action Cable ([`PROTOCOLS`]).

use super::actioncable;
use super::metrics::{Latency, Live, Monitor, Tick};
use super::proto::Proto;
use super::shard::{self, Shard};
use super::{preflight, raise_nofile, BenchError, CpuMeter, Report, Target};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct ConnectParams {
    pub target: Target,
    pub clients: usize,
    pub channel: String,
    /// Per-step timeout for each client (connect, then subscribe).
    pub timeout: Duration,
    /// Keep all connections open until every client has settled.
    pub hold: bool,
    pub progress: bool,
    pub server_pid: Option<u32>,
    /// The protocol the clients speak (Action Cable subscribes to
    /// `BenchmarkChannel`; `channel` does not apply). Only [`PROTOCOLS`].
    pub protocol: Proto,
    /// Nodes of a cluster the clients spread over, round-robin (several
    /// `--url`s); empty: `target`.
    pub nodes: Vec<Target>,
    /// This process's part of a `--processes` run (None: all of it).
    pub shard: Option<Shard>,
}

impl ConnectParams {
    pub fn new(target: Target) -> ConnectParams {
        ConnectParams {
            target,
            clients: 1000,
            channel: "benchmark-connect".into(),
            timeout: Duration::from_secs(30),
            hold: false,
            progress: true,
            server_pid: None,
            protocol: Proto::Pusher,
            nodes: Vec::new(),
            shard: None,
        }
    }
}

/// Figures of one avalanche.
struct Step {
    connected: u64,
    subscribed: u64,
    connecting: Latency,
    subscribe: Latency,
    setup: Latency,
    live: Arc<Live>,
    seconds: f64,
    all_settled_after: f64,
    /// Per second: open connections, confirmed subscriptions (`received`),
    /// errors.
    timeline: Vec<Tick>,
}

async fn avalanche(p: &ConnectParams) -> Result<Step, BenchError> {
    let live = Arc::new(Live::default());
    let shared = Arc::new((
        Latency::default(),
        Latency::default(),
        Latency::default(),
        AtomicU64::new(0),
        AtomicU64::new(0),
    ));
    let monitor = Monitor::start("connect", live.clone(), None, p.progress);
    // With `hold`: each client, once settled, adds a permit and waits for
    // the release, which comes when every client here has settled and (in
    // a `--processes` run) every other process's clients too.
    let owned = shard::share(p.shard, p.clients);
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let settled = Arc::new(tokio::sync::Semaphore::new(0));
    let coordinator = p.hold.then(|| {
        let (settled, shard) = (settled.clone(), p.shard);
        tokio::spawn(async move {
            let _ = settled.acquire_many(owned as u32).await;
            let r = shard::sync(shard, "settled", serde_json::Value::Null).await;
            let _ = release_tx.send(true);
            r
        })
    });
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in (0..p.clients).filter(|&i| shard::owns(p.shard, i)) {
        let target = super::node(&p.target, &p.nodes, i).clone();
        let (channel, timeout) = (p.channel.clone(), p.timeout);
        let proto = p.protocol;
        let (live, shared) = (live.clone(), shared.clone());
        let hold = p.hold.then(|| (settled.clone(), release_rx.clone()));
        tasks.spawn(async move {
            let (connecting, subscribe, setup, connected, subscribed) = &*shared;
            let t0 = Instant::now();
            let conn = match proto.open(&target, target.source_for(i), timeout).await {
                Ok(mut conn) => {
                    connecting.record_duration(i, t0.elapsed());
                    connected.fetch_add(1, Relaxed);
                    live.connections.fetch_add(1, Relaxed);
                    let t1 = Instant::now();
                    match proto
                        .subscribe_one(&mut conn, &target, &channel, timeout)
                        .await
                    {
                        Ok(()) => {
                            subscribe.record_duration(i, t1.elapsed());
                            setup.record_duration(i, t0.elapsed());
                            subscribed.fetch_add(1, Relaxed);
                            live.received.fetch_add(1, Relaxed);
                        }
                        Err(e) => live.error(e.kind(), proto.explain(&e, &target)),
                    }
                    Some(conn)
                }
                Err(e) => {
                    live.error(e.kind(), proto.explain(&e, &target));
                    None
                }
            };
            let settled = Instant::now();
            if let Some((settled, mut release)) = hold {
                settled.add_permits(1);
                let _ = release.wait_for(|r| *r).await;
            }
            if let Some(conn) = conn {
                conn.close().await;
                live.connections.fetch_sub(1, Relaxed);
            }
            settled
        });
    }
    let mut last_settled = started;
    while let Some(r) = tasks.join_next().await {
        if let Ok(t) = r {
            last_settled = last_settled.max(t);
        }
    }
    if let Some(c) = coordinator {
        c.await
            .map_err(|e| BenchError(format!("the hold's coordinator: {e}")))??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let timeline = monitor.finish().await;
    let (connecting, subscribe, setup, connected, subscribed) =
        Arc::try_unwrap(shared).unwrap_or_else(|_| unreachable!("all tasks joined"));
    Ok(Step {
        connected: connected.into_inner(),
        subscribed: subscribed.into_inner(),
        connecting,
        subscribe,
        setup,
        live,
        seconds,
        all_settled_after: (last_settled - started).as_secs_f64(),
        timeline,
    })
}

/// The protocols `connect` speaks.
pub const PROTOCOLS: &[Proto] = &[Proto::Pusher, Proto::ActionCable, Proto::ActionCableExt];

async fn connect_preflight(p: &ConnectParams) -> Result<(), BenchError> {
    for target in std::iter::once(&p.target).chain(&p.nodes) {
        match p.protocol {
            Proto::ActionCable | Proto::ActionCableExt => actioncable::preflight(target, false)
                .await
                .map_err(BenchError)?,
            // Pusher (`run` and `sweep` refuse the others).
            _ => preflight(target, None, false).await?,
        }
    }
    Ok(())
}

fn check_limits(p: &ConnectParams, most: usize, report: &mut Report) {
    if let Some(w) = raise_nofile(most as u64) {
        eprintln!("herald bench: {w}");
        report.notes.push(w);
    }
    if let Some(limit) = p.server_pid.and_then(super::nofile_of) {
        if limit < most as u64 + 64 {
            report.notes.push(format!(
                "the server's open-file limit is {limit}, below the {most} connections asked for"
            ));
        }
    }
}

/// One avalanche of `p.clients` connections.
pub async fn run(p: &ConnectParams) -> Result<Report, BenchError> {
    p.protocol.check("connect", PROTOCOLS)?;
    let mut report = Report::new("connect");
    report.param("url", urls(p));
    report.param("clients", p.clients);
    report.param("channel", &p.channel);
    report.param("hold", p.hold);
    report.param("protocol", p.protocol.name());
    let n = shard::share(p.shard, p.clients);
    check_limits(p, n, &mut report);
    connect_preflight(p).await?;
    // Every process's avalanche starts at once.
    shard::sync(p.shard, "ready", serde_json::Value::Null).await?;
    let cpu = CpuMeter::start(p.server_pid);
    let s = avalanche(p).await?;
    let n = n as u64;
    report.seconds = s.seconds;
    report.timeline = s.timeline;
    report.counter("ws_sessions", n);
    report.rate("ws_connect_success", s.connected, n);
    report.rate("ws_subscribe_success", s.subscribed, n);
    report.trend("ws_connecting", s.connecting.total());
    report.trend("ws_subscribe", s.subscribe.total());
    report.trend("ws_session_setup", s.setup.total());
    report.value("all_settled_after", Some(s.all_settled_after), "s");
    report.errors(&s.live);
    cpu.finish(&mut report);
    super::server_memory(&mut report, p.server_pid);
    Ok(report)
}

/// The URLs the clients connect to, for the report.
fn urls(p: &ConnectParams) -> String {
    if p.nodes.is_empty() {
        return p.target.url.clone();
    }
    let all: Vec<&str> = p.nodes.iter().map(|t| t.url.as_str()).collect();
    all.join(",")
}

#[derive(Debug, Clone)]
pub struct SweepParams {
    pub base: ConnectParams,
    pub steps: Vec<usize>,
    /// Pause between steps so the previous step's sockets are gone.
    pub pause: Duration,
}

/// Avalanches of increasing size; reports each step's success rates and
/// latencies (tagged `{n:N}`) and where success first drops. The timeline
/// is the steps' timelines end to end, each tick tagged with its step.
pub async fn sweep(p: &SweepParams) -> Result<Report, BenchError> {
    p.base.protocol.check("connect", PROTOCOLS)?;
    let mut report = Report::new("connect --sweep");
    report.param("url", &p.base.target.url);
    let steps: Vec<String> = p.steps.iter().map(|n| n.to_string()).collect();
    report.param("steps", steps.join(","));
    check_limits(
        &p.base,
        p.steps.iter().copied().max().unwrap_or(0),
        &mut report,
    );
    report.param("protocol", p.base.protocol.name());
    connect_preflight(&p.base).await?;
    let cpu = CpuMeter::start(p.base.server_pid);
    let started = Instant::now();
    let (mut below_100, mut below_99) = (None, None);
    for (i, &n) in p.steps.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(p.pause).await;
        }
        let params = ConnectParams {
            clients: n,
            ..p.base.clone()
        };
        // One timeline for the whole sweep: each step's seconds are shifted
        // to count from the sweep's start and tagged with the step's N.
        let offset = started.elapsed().as_secs();
        let s = avalanche(&params).await?;
        let mut previous = report.timeline.last().map_or(0, |t| t.second);
        for tick in &s.timeline {
            // Keep seconds increasing even when a short pause makes a step
            // start within the second the previous one ended in.
            let second = (offset + tick.second).max(previous + 1);
            previous = second;
            report.timeline.push(Tick {
                second,
                step: Some(n as u64),
                ..tick.clone()
            });
        }
        let success = s.subscribed as f64 / n.max(1) as f64;
        if success < 1.0 && below_100.is_none() {
            below_100 = Some(n as f64);
        }
        if success < 0.99 && below_99.is_none() {
            below_99 = Some(n as f64);
        }
        let tag = |name: &str| format!("{name}{{n:{n}}}");
        report.rate(&tag("ws_connect_success"), s.connected, n as u64);
        report.rate(&tag("ws_subscribe_success"), s.subscribed, n as u64);
        report.trend(&tag("ws_connecting"), s.connecting.total());
        report.trend(&tag("ws_session_setup"), s.setup.total());
        report.value(&tag("all_settled_after"), Some(s.all_settled_after), "s");
        report.counter(&tag("connection_errors"), s.live.errors.load(Relaxed));
        for e in s.live.error_examples() {
            report.notes.push(format!("n={n}: {e}"));
        }
    }
    report.seconds = started.elapsed().as_secs_f64();
    report.value("sweep_first_below_100pct", below_100, "");
    report.value("sweep_first_below_99pct", below_99, "");
    cpu.finish(&mut report);
    super::server_memory(&mut report, p.base.server_pid);
    Ok(report)
}
