//! `soak`: hours of a steady, mixed load, watching the server for growth.
//!
//! The load, all at once for `--duration`:
//! - broadcast: HTTP publishes at `--rate` per second, round-robin over
//!   `--channels` public channels, each with its share of `--clients`
//!   subscribers. Every publish carries a per-channel sequence number, and
//!   each channel has its own [`Ledger`], so a delivery the server lost or
//!   duplicated is counted exactly (a subscriber is owed every publish
//!   stamped while it was subscribed; when it leaves it reads on until
//!   every publish stamped before then has been answered by the server,
//!   and `--grace` more, so a slow HTTP round trip is not counted as a
//!   loss; losses are reported by where they fall in the windows);
//! - connection churn: each subscriber lives `--lifetime` (±50 %, so the
//!   churn is steady) and then reconnects and subscribes again;
//! - presence: `--presence` members join and leave `--presence-channels`
//!   presence channels (stay ~`--presence-stay`; every third leave closes
//!   the connection, the others unsubscribe on it);
//! - HTTP API queries every `--api-interval`: `GET /channels`, one
//!   channel's info, one presence channel's users, in turn.
//!
//! With `--server-pid` it samples the server's resident memory, open
//! descriptors (`/proc/PID/fd`) and threads every `--sample-interval`, and
//! after the warm-up (`--warmup`; default 10 % of the run, at most 5 min)
//! fits a least-squares line to each: the growth per hour, its standard
//! error, and whether it is distinguishable from zero (|slope| > 2
//! standard errors). After the load stops and every client has gone, the
//! server's descriptors (and its `herald_connections` gauge, when it has
//! `/metrics`) must come back to what they were before the load.
//!
//! `--protocol actioncable`, `appsync-graphql` and `appsync-events` run
//! the broadcast and the churn over those protocols ([`Proto`]), with the
//! same ledger: a channel `soak-N` is a `BenchmarkChannel` subscription
//! with `{"id":"soak-N"}` (Action Cable; publishes through the HTTP
//! broadcast API, `--broadcast-url`) or a subscription to `soak-N`
//! (AppSync; publishes through `POST /graphql` or `POST /event`). Neither
//! protocol has presence channels or an HTTP API that lists channels, so
//! the presence members and the API queries are skipped, and the report
//! says so.

use super::client::{bench_data, Conn};
use super::ledger::{Deliveries, Ledger, MsgId, Outstanding, Receipt, Seen, Window};
use super::metrics::{Latency, Live, Monitor};
use super::proto::{Broadcast, Proto, Publisher};
use super::worst::{self, Api, Metrics, Probe};
use super::{now_us, raise_nofile, BenchError, CpuMeter, Report, Rng, Target};
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub const EVENT: &str = "bench-soak";
/// Sender ids of publishes start here, far from any subscriber's id.
const PUBLISHER_ID: u64 = 1 << 40;

#[derive(Debug, Clone)]
pub struct SoakParams {
    pub target: Target,
    /// The protocol subscribers and publishers speak (presence and API
    /// queries only over Pusher).
    pub protocol: Proto,
    /// Where Action Cable publishes go.
    pub broadcast: Broadcast,
    pub duration: Duration,
    /// `None`: 10 % of the duration, at most 5 minutes.
    pub warmup: Option<Duration>,
    pub sample_interval: Duration,
    /// Subscribers (each on one channel), churning.
    pub subscribers: usize,
    pub channels: usize,
    /// HTTP publishes per second, all channels together.
    pub rate: f64,
    /// A subscriber's mean life before it reconnects.
    pub lifetime: Duration,
    /// Presence members joining and leaving.
    pub presence: usize,
    pub presence_channels: usize,
    /// A presence member's mean stay.
    pub presence_stay: Duration,
    pub api_interval: Duration,
    /// How long a leaving subscriber keeps reading after every publish
    /// stamped before it left has been answered by the server.
    pub grace: Duration,
    /// Longest wait for descriptors and gauge to come back after the load.
    pub settle: Duration,
    /// Where the server's Prometheus metrics are (default: /metrics).
    pub metrics_url: Option<String>,
    pub timeout: Duration,
    pub progress: bool,
    pub server_pid: Option<u32>,
}

impl SoakParams {
    pub fn new(target: Target) -> SoakParams {
        SoakParams {
            target,
            protocol: Proto::Pusher,
            broadcast: Broadcast::default(),
            duration: Duration::from_secs(600),
            warmup: None,
            sample_interval: Duration::from_secs(10),
            subscribers: 500,
            channels: 10,
            rate: 50.0,
            lifetime: Duration::from_secs(60),
            presence: 40,
            presence_channels: 4,
            presence_stay: Duration::from_secs(15),
            api_interval: Duration::from_secs(1),
            grace: Duration::from_secs(2),
            settle: Duration::from_secs(30),
            metrics_url: None,
            timeout: Duration::from_secs(30),
            progress: true,
            server_pid: None,
        }
    }

    /// The warm-up actually used.
    pub fn warmup(&self) -> Duration {
        self.warmup
            .unwrap_or_else(|| (self.duration / 10).min(Duration::from_secs(300)))
    }
}

pub fn channel_name(c: usize) -> String {
    format!("soak-{c}")
}

pub fn presence_channel_name(c: usize) -> String {
    format!("presence-soak-{c}")
}

struct Shared {
    p: SoakParams,
    live: Arc<Live>,
    latency: Arc<Latency>,
    api_duration: Latency,
    publish_duration: Latency,
    ledgers: Vec<Ledger>,
    /// Publishes in flight: a leaving subscriber drains until those
    /// stamped before it left are answered.
    outstanding: Outstanding,
    next_conn: AtomicU64,
    sessions: AtomicU64,
    presence_joins: AtomicU64,
    presence_leaves: AtomicU64,
    api_queries: AtomicU64,
    api_errors: AtomicU64,
    publish_errors: AtomicU64,
    server_errors: AtomicU64,
}

/// One subscriber: connect, subscribe, read for a life, leave; again until
/// the load stops.
async fn subscriber(s: Arc<Shared>, idx: usize, mut stop: watch::Receiver<bool>) {
    let p = &s.p;
    let proto = p.protocol;
    let c = idx % p.channels;
    let channel = channel_name(c);
    let mut rng = Rng::new(idx as u64 + 17);
    // Spread the first lives so the churn is steady from the start.
    let mut first = true;
    while !*stop.borrow() {
        let id = s.next_conn.fetch_add(1, Relaxed);
        let mut conn = match proto
            .open(&p.target, p.target.source_for(id as usize), p.timeout)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                s.live.error(e.kind(), proto.explain(&e, &p.target));
                pause(&mut stop, Duration::from_secs(1)).await;
                continue;
            }
        };
        let subscribed = proto
            .subscribe(&mut conn, &p.target, &[&channel], "", p.timeout)
            .await;
        if let Err(e) = subscribed {
            s.live.error(e.kind(), proto.explain(&e, &p.target));
            conn.close().await;
            pause(&mut stop, Duration::from_secs(1)).await;
            continue;
        }
        s.sessions.fetch_add(1, Relaxed);
        s.live.connections.fetch_add(1, Relaxed);
        let join = now_us();
        let life = if first {
            first = false;
            p.lifetime.mul_f64(rng.next_f64())
        } else {
            p.lifetime.mul_f64(0.5 + rng.next_f64())
        };
        let end = tokio::time::sleep(life);
        tokio::pin!(end);
        let mut seen = Seen::default();
        let on_frame = |text: &str, seen: &mut Seen| {
            let f = proto.scan(text, EVENT);
            if f.event == EVENT {
                s.live.received.fetch_add(1, Relaxed);
                match (f.id, f.stamp) {
                    (Some(m), Some(t)) => {
                        if seen.record(m.seq) == Receipt::New {
                            s.latency.record(id as usize, now_us().saturating_sub(t));
                        }
                    }
                    _ => seen.garbled(),
                }
            } else if proto.is_error(text, f.event) {
                s.server_errors.fetch_add(1, Relaxed);
            }
        };
        let mut gone = false;
        loop {
            tokio::select! {
                biased;
                r = proto.recv(&mut conn) => match r {
                    Ok(text) => on_frame(&text, &mut seen),
                    Err(e) => {
                        s.live.error(e.kind(), proto.explain(&e, &p.target));
                        gone = true;
                        break;
                    }
                },
                _ = &mut end => break,
                _ = stop.changed() => break,
            }
        }
        let leave = now_us();
        if !gone {
            // The subscriber is owed every publish stamped up to `leave`,
            // and an HTTP publish may take seconds to reach the server on a
            // busy machine: read on until each of those is answered, then
            // `grace` more for their deliveries (bounded by --timeout).
            let drain = async {
                let mut poll = tokio::time::interval(Duration::from_millis(20));
                loop {
                    tokio::select! {
                        r = proto.recv(&mut conn) => match r {
                            Ok(text) => on_frame(&text, &mut seen),
                            Err(_) => return,
                        },
                        _ = poll.tick() => if s.outstanding.answered_through(leave) {
                            break;
                        },
                    }
                }
                let _ = tokio::time::timeout(p.grace, async {
                    while let Ok(text) = proto.recv(&mut conn).await {
                        on_frame(&text, &mut seen);
                    }
                })
                .await;
            };
            let _ = tokio::time::timeout(p.timeout + p.grace, drain).await;
            conn.close().await;
        }
        s.live.connections.fetch_sub(1, Relaxed);
        s.ledgers[c].window(Window {
            receiver: id,
            join,
            leave,
            seen: seen.freeze(),
        });
    }
}

/// Sleep, or return early when the load stops.
async fn pause(stop: &mut watch::Receiver<bool>, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stop.changed() => {}
    }
}

/// One presence member: join, stay, leave (unsubscribe, or every third
/// time close the connection), again until the load stops.
async fn presence_member(s: Arc<Shared>, idx: usize, mut stop: watch::Receiver<bool>) {
    let p = &s.p;
    let channel = presence_channel_name(idx % p.presence_channels.max(1));
    let user = format!("soak-user-{idx}");
    let mut rng = Rng::new(idx as u64 + 1_000_003);
    let mut cycle = 0u64;
    'connection: while !*stop.borrow() {
        let id = s.next_conn.fetch_add(1, Relaxed);
        let mut conn =
            match Conn::open(&p.target, p.target.source_for(id as usize), p.timeout).await {
                Ok(c) => c,
                Err(e) => {
                    s.live.error(e.kind(), e.explain(&p.target));
                    pause(&mut stop, Duration::from_secs(1)).await;
                    continue;
                }
            };
        s.sessions.fetch_add(1, Relaxed);
        loop {
            if let Err(e) =
                worst::subscribe(&mut conn, &p.target, &[&channel], &user, p.timeout).await
            {
                s.live.error(e.kind(), e.explain(&p.target));
                conn.close().await;
                pause(&mut stop, Duration::from_secs(1)).await;
                continue 'connection;
            }
            s.presence_joins.fetch_add(1, Relaxed);
            let stay = tokio::time::sleep(p.presence_stay.mul_f64(0.5 + rng.next_f64()));
            tokio::pin!(stay);
            let stopping = loop {
                tokio::select! {
                    r = conn.recv() => if let Err(e) = r {
                        s.live.error(e.kind(), e.explain(&p.target));
                        s.presence_leaves.fetch_add(1, Relaxed);
                        continue 'connection;
                    },
                    _ = &mut stay => break false,
                    _ = stop.changed() => break true,
                }
            };
            s.presence_leaves.fetch_add(1, Relaxed);
            cycle += 1;
            if stopping || cycle.is_multiple_of(3) {
                conn.close().await;
                continue 'connection;
            }
            let frame = json!({"event":"pusher:unsubscribe","data":{"channel":channel}});
            if let Err(e) = conn.send(frame.to_string()).await {
                s.live.error(e.kind(), e.explain(&p.target));
                continue 'connection;
            }
        }
    }
}

/// HTTP API queries in turn until the load stops.
async fn api_queries(s: Arc<Shared>, api: Api, mut stop: watch::Receiver<bool>) {
    let p = &s.p;
    let mut tick = tokio::time::interval(p.api_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut k = 0usize;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let t0 = Instant::now();
        let r = match k % 3 {
            0 => api
                .get("/channels", &[("filter_by_prefix", "soak-")])
                .await
                .map(|_| ()),
            1 => api
                .get(
                    &format!("/channels/{}", channel_name((k / 3) % p.channels)),
                    &[],
                )
                .await
                .map(|_| ()),
            _ => {
                let c = presence_channel_name((k / 3) % p.presence_channels.max(1));
                api.presence_users(&c).await.map(|_| ())
            }
        };
        k += 1;
        s.api_queries.fetch_add(1, Relaxed);
        match r {
            Ok(()) => s.api_duration.record_duration(k, t0.elapsed()),
            Err(e) => {
                s.api_errors.fetch_add(1, Relaxed);
                s.live.error("api", worst::api_error(&e, &p.target));
            }
        }
    }
}

/// Publishes at the asked rate until told to stop; returns once every
/// publish in flight has been answered.
async fn publishers(s: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let p = &s.p;
    let publisher = Publisher::new(p.protocol, &p.target, &p.broadcast);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / p.rate));
    // Late ticks are made up at once, so the asked rate is kept on
    // average (`Delay` let it drift down by every late wake-up).
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let gate = Arc::new(tokio::sync::Semaphore::new(64));
    let mut inflight = tokio::task::JoinSet::new();
    let mut k = 0usize;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        while inflight.try_join_next().is_some() {}
        let Ok(permit) = gate.clone().acquire_owned().await else {
            break;
        };
        let c = k % p.channels;
        k += 1;
        let (s2, publisher) = (s.clone(), publisher.clone());
        inflight.spawn(async move {
            let _permit = permit;
            let stamp = s2.outstanding.begin(now_us);
            let msg: MsgId = s2.ledgers[c].next_id(PUBLISHER_ID + c as u64);
            let data = bench_data(stamp, msg);
            let t0 = Instant::now();
            match publisher.publish(&channel_name(c), EVENT, &data).await {
                Ok(()) => {
                    s2.publish_duration.record_duration(c, t0.elapsed());
                    s2.ledgers[c].send(stamp, msg);
                    s2.live.sent.fetch_add(1, Relaxed);
                }
                Err(e) => {
                    s2.publish_errors.fetch_add(1, Relaxed);
                    s2.live
                        .error("publish", publisher.explain(&e, &s2.p.target));
                }
            }
            s2.outstanding.end(stamp);
        });
    }
    while inflight.join_next().await.is_some() {}
}

/// Where in the subscribers' windows lost deliveries fall: at a window's
/// edges (a publish racing a join or a leave) or inside, where a server
/// has no excuse.
#[derive(Default)]
struct LossPlaces {
    /// Within a second after the join.
    after_join: u64,
    /// Within a second before the leave.
    before_leave: u64,
    inside: u64,
    /// A few examples: (receiver, ms after join, ms before leave).
    examples: Vec<(u64, f64, f64)>,
}

impl LossPlaces {
    const EDGE_US: u64 = 1_000_000;

    fn add(&mut self, w: &Window, stamp: u64) {
        let (after, before) = (stamp - w.join, w.leave - stamp);
        if after < Self::EDGE_US {
            self.after_join += 1;
        } else if before < Self::EDGE_US {
            self.before_leave += 1;
        } else {
            self.inside += 1;
        }
        if self.examples.len() < 10 {
            self.examples
                .push((w.receiver, after as f64 / 1e3, before as f64 / 1e3));
        }
    }

    fn report(&self, report: &mut Report) {
        report.counter("lost_within_1s_after_join", self.after_join);
        report.counter("lost_within_1s_before_leave", self.before_leave);
        report.counter("lost_inside_windows", self.inside);
        for (r, after, before) in &self.examples {
            report.notes.push(format!(
                "lost at subscriber {r}: {after:.1} ms after it joined, {before:.1} ms before it \
                 left"
            ));
        }
    }
}

/// One sample: seconds since the load started, the server, its gauge.
#[derive(Debug, Clone, Copy)]
struct Sample {
    t: f64,
    probe: Probe,
    gauge: Option<f64>,
}

/// Fit a line to one series (values after the warm-up) and report it.
fn growth(report: &mut Report, name: &str, unit: &'static str, points: &[(f64, f64)]) -> bool {
    let fit = worst::slope(points);
    report.value(
        &format!("{name}_slope_per_hour"),
        fit.map(|f| f.slope),
        unit,
    );
    report.value(
        &format!("{name}_slope_stderr_per_hour"),
        fit.map(|f| f.stderr),
        unit,
    );
    let significant = fit.map(|f| f.significant());
    report.value(
        &format!("{name}_growth_distinguishable_from_zero"),
        significant.map(|b| b as u8 as f64),
        "",
    );
    if let Some(f) = fit {
        if f.significant() {
            let how = if f.slope > 0.0 { "grows" } else { "shrinks" };
            report.notes.push(format!(
                "{name} {how} by {:.0} {unit}/h ± {:.0} after the warm-up: more than two standard \
                 errors from flat",
                f.slope.abs(),
                f.stderr
            ));
        }
    }
    // Only growth is a leak: a process that gives memory back is flat.
    fit.is_some_and(|f| f.significant() && f.slope > 0.0)
}

pub async fn run(p: &SoakParams) -> Result<Report, BenchError> {
    if p.channels == 0 || p.rate <= 0.0 || p.subscribers == 0 {
        return super::err("soak needs at least one channel, one subscriber and a positive --rate");
    }
    if p.sample_interval.is_zero() || p.api_interval.is_zero() {
        return super::err("soak needs a non-zero --sample-interval and --api-interval");
    }
    let warmup = p.warmup();
    let proto = p.protocol;
    let mut report = Report::new("soak");
    report.param("url", &p.target.url);
    if proto != Proto::Pusher {
        report.param("protocol", proto.name());
    }
    report.param("duration", format!("{:?}", p.duration));
    report.param("warmup", format!("{warmup:?}"));
    report.param("sample interval", format!("{:?}", p.sample_interval));
    report.param("subscribers", p.subscribers);
    report.param("channels", p.channels);
    report.param("rate", format!("{}/s", p.rate));
    report.param("lifetime", format!("{:?}", p.lifetime));
    if proto.has_presence() {
        report.param(
            "presence",
            format!("{} members on {} channels", p.presence, p.presence_channels),
        );
        report.param("api interval", format!("{:?}", p.api_interval));
    } else {
        report.notes.push(format!(
            "{} has no presence channels and no HTTP API to query: presence members and API \
             queries are skipped; broadcast and churn run",
            proto.name()
        ));
    }
    if let Some(w) = raise_nofile(p.subscribers as u64 + p.presence as u64 + 128) {
        eprintln!("herald bench: {w}");
        report.notes.push(w);
    }
    let publisher = Publisher::new(proto, &p.target, &p.broadcast);
    proto.preflight(&p.target, Some(&publisher)).await?;
    let metrics = Metrics::new(&p.target, p.metrics_url.as_deref());
    // The baseline: the server before any load (the preflight's sockets
    // closed a moment ago; give the server a second to see it).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let base = worst::probe(p.server_pid);
    let gauge_base = metrics.get("herald_connections").await;
    if p.server_pid.is_none() {
        report.notes.push(
            "no --server-pid: no memory, descriptor or thread samples; only deliveries".into(),
        );
    }

    let cpu = CpuMeter::start(p.server_pid);
    let s = Arc::new(Shared {
        p: p.clone(),
        live: Arc::new(Live::default()),
        latency: Arc::new(Latency::default()),
        api_duration: Latency::default(),
        publish_duration: Latency::default(),
        ledgers: (0..p.channels).map(|_| Ledger::default()).collect(),
        outstanding: Outstanding::default(),
        next_conn: AtomicU64::new(0),
        sessions: AtomicU64::new(0),
        presence_joins: AtomicU64::new(0),
        presence_leaves: AtomicU64::new(0),
        api_queries: AtomicU64::new(0),
        api_errors: AtomicU64::new(0),
        publish_errors: AtomicU64::new(0),
        server_errors: AtomicU64::new(0),
    });
    let monitor = Monitor::start("soak", s.live.clone(), Some(s.latency.clone()), p.progress);
    let started = Instant::now();
    let (load_tx, load_rx) = watch::channel(false);
    let (pub_tx, pub_rx) = watch::channel(false);
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..p.subscribers {
        clients.spawn(subscriber(s.clone(), i, load_rx.clone()));
    }
    let api = Api::new(&p.target);
    if proto.has_presence() {
        for i in 0..p.presence {
            clients.spawn(presence_member(s.clone(), i, load_rx.clone()));
        }
        clients.spawn(api_queries(s.clone(), api.clone(), load_rx.clone()));
    }
    let publishing = tokio::spawn(publishers(s.clone(), pub_rx));

    // Sample until the duration is over.
    let mut samples: Vec<Sample> = Vec::new();
    let mut tick = tokio::time::interval(p.sample_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let t = started.elapsed();
        let sample = Sample {
            t: t.as_secs_f64(),
            probe: worst::probe(p.server_pid),
            gauge: metrics.get("herald_connections").await,
        };
        if p.progress && p.server_pid.is_some() {
            let mb =
                |b: Option<u64>| b.map_or("?".into(), |b| format!("{:.1}", b as f64 / 1048576.0));
            let n = |v: Option<u64>| v.map_or("?".into(), |v| v.to_string());
            eprintln!(
                "soak: sample {:>6.0}s  rss {} MiB  fds {}  threads {}  gauge {}",
                sample.t,
                mb(sample.probe.rss),
                n(sample.probe.fds),
                n(sample.probe.threads),
                sample.gauge.map_or("?".into(), |g| g.to_string()),
            );
        }
        samples.push(sample);
        if t >= p.duration {
            break;
        }
    }
    // Stop publishing first, and wait for every publish in flight, so the
    // subscribers still here are owed exactly the accepted publishes.
    let _ = pub_tx.send(true);
    let _ = publishing.await;
    let _ = load_tx.send(true);
    while clients.join_next().await.is_some() {}
    drop(api);
    let load_seconds = started.elapsed().as_secs_f64();
    report.timeline = monitor.finish().await;
    report.seconds = load_seconds;

    // After the load: descriptors and gauge back to the baseline?
    let back = worst::report_return(
        &mut report,
        p.server_pid,
        &base,
        gauge_base,
        &metrics,
        p.settle,
        "after_load",
    )
    .await;

    let mut d = Deliveries::default();
    let mut places = LossPlaces::default();
    for l in &s.ledgers {
        d.add(l.tally_with(|w, stamp, _| places.add(w, stamp)));
    }
    places.report(&mut report);
    report.counter("ws_sessions", s.sessions.load(Relaxed));
    report.counter(
        "http_publishes",
        s.ledgers.iter().map(|l| l.sends() as u64).sum(),
    );
    report.counter("http_publish_errors", s.publish_errors.load(Relaxed));
    let published =
        s.ledgers.iter().map(|l| l.sends() as u64).sum::<u64>() + s.publish_errors.load(Relaxed);
    report.value("http_publish_rate_asked", Some(p.rate), "/s");
    report.value(
        "http_publish_rate_achieved",
        Some(published as f64 / p.duration.as_secs_f64().max(1e-9)),
        "/s",
    );
    report.trend("http_publish_duration", s.publish_duration.total());
    report.counter("ws_msgs_received", s.live.received.load(Relaxed));
    report.deliveries(&d);
    report.trend("message_latency", s.latency.total());
    report.counter("presence_joins", s.presence_joins.load(Relaxed));
    report.counter("presence_leaves", s.presence_leaves.load(Relaxed));
    report.counter("api_queries", s.api_queries.load(Relaxed));
    report.counter("api_errors", s.api_errors.load(Relaxed));
    report.trend("api_duration", s.api_duration.total());
    report.counter("server_errors", s.server_errors.load(Relaxed));
    report.errors(&s.live);

    // Growth after the warm-up, per hour.
    let warm = warmup.as_secs_f64();
    let after: Vec<&Sample> = samples.iter().filter(|x| x.t >= warm).collect();
    report.counter("samples", samples.len() as u64);
    report.counter("samples_after_warmup", after.len() as u64);
    let series = |f: &dyn Fn(&Probe) -> Option<u64>| -> Vec<(f64, f64)> {
        after
            .iter()
            .filter_map(|x| f(&x.probe).map(|v| (x.t / 3600.0, v as f64)))
            .collect()
    };
    let mut grows = false;
    if p.server_pid.is_some() {
        let rss = series(&|p| p.rss);
        report.value("rss_baseline", base.rss.map(|v| v as f64), "B");
        report.value("rss_after_warmup", rss.first().map(|v| v.1), "B");
        report.value("rss_end", rss.last().map(|v| v.1), "B");
        report.value(
            "rss_max",
            samples
                .iter()
                .filter_map(|x| x.probe.rss)
                .max()
                .map(|v| v as f64),
            "B",
        );
        grows |= growth(&mut report, "rss", "B", &rss);
        grows |= growth(&mut report, "fds", "", &series(&|p| p.fds));
        growth(&mut report, "threads", "", &series(&|p| p.threads));
        if after.len() < 3 {
            report.notes.push(format!(
                "only {} samples after the warm-up: too few for a slope (run longer, or lower \
                 --sample-interval or --warmup)",
                after.len()
            ));
        }
    }
    let flat = !grows
        && back.fds != Some(false)
        && back.gauge != Some(false)
        && d.lost() == 0
        && d.duplicated == 0;
    report.value("flat", Some(flat as u8 as f64), "");
    report.samples = samples
        .iter()
        .map(|x| {
            json!({"t": x.t, "rss": x.probe.rss, "fds": x.probe.fds,
                   "threads": x.probe.threads, "connections_gauge": x.gauge})
        })
        .collect();
    cpu.finish(&mut report);
    super::server_memory(&mut report, p.server_pid);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_is_a_tenth_at_most_five_minutes() {
        let t = Target::new("ws://127.0.0.1:1", "a", "b", "c", false).unwrap();
        let mut p = SoakParams::new(t);
        p.duration = Duration::from_secs(600);
        assert_eq!(p.warmup(), Duration::from_secs(60));
        p.duration = Duration::from_secs(7200);
        assert_eq!(p.warmup(), Duration::from_secs(300));
        p.warmup = Some(Duration::from_secs(5));
        assert_eq!(p.warmup(), Duration::from_secs(5));
    }
}
