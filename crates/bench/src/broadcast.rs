//! `broadcast`: virtual users ramp up in three stages (to peak/4 over T/3,
//! to peak over T/2, down to 0 over T/6). Each connects, subscribes to
//! `private-benchmark` with a locally signed auth and lives 45 s; one user
//! in five is a sender that every 200 ms, with probability 0.4, sends a
//! `client-broadcast` event (or, with `--via http`, publishes through the
//! HTTP API) carrying its send time and a unique id (the sender's connection
//! number and its own sequence number). Every receiver records now − send
//! time for each id it sees first, and keeps the ids it saw; the [`Ledger`]
//! then counts, per receiver, the distinct expected ids that arrived, so
//! drops are counted and duplicates cannot hide them. With `--protocol
//! actioncable` the users speak Action Cable instead ([`PROTOCOLS`]): see
//! [`super::actioncable`].

use super::actioncable;
use super::client::{bench_data, HttpPublisher};
use super::ledger::{Ledger, Receipt, Seen, Window};
use super::metrics::{Latency, Live, Monitor};
use super::proto::Proto;
use super::shard::{self, Shard};
use super::{now_us, preflight, raise_nofile, BenchError, CpuMeter, Report, Rng, Target};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// Senders send `client-broadcast` client events on their socket.
    Ws,
    /// Senders publish through the HTTP API (excluding their own socket).
    Http,
}

#[derive(Debug, Clone)]
pub struct BroadcastParams {
    pub target: Target,
    pub channel: String,
    /// Peak virtual users.
    pub peak: usize,
    /// Total ramp time T.
    pub duration: Duration,
    /// How long each user lives before reconnecting.
    pub lifetime: Duration,
    /// One user in `sender_every` is a sender.
    pub sender_every: usize,
    pub send_interval: Duration,
    pub send_probability: f64,
    pub via: Via,
    /// How long a leaving user keeps reading for messages sent before it left.
    pub grace: Duration,
    pub timeout: Duration,
    pub progress: bool,
    pub server_pid: Option<u32>,
    /// The protocol the users speak. With Action Cable a sender performs
    /// `BenchmarkChannel`'s `broadcast` action (the RPC app broadcasts it
    /// to the stream); `channel` and `Via::Http` do not apply. Only
    /// [`PROTOCOLS`].
    pub protocol: Proto,
    /// Nodes of a cluster the users spread over, round-robin by user
    /// (several `--url`s); a user's HTTP publishes go through its node.
    /// Empty: `target`.
    pub nodes: Vec<Target>,
    /// This process's part of a `--processes` run (None: all of it): user
    /// `idx` is child (idx mod N)'s; every child ramps the same schedule
    /// over its own users, and at the end they exchange their sends so
    /// each child's receivers are held to every send of the run.
    pub shard: Option<Shard>,
}

impl BroadcastParams {
    pub fn new(target: Target) -> BroadcastParams {
        BroadcastParams {
            target,
            channel: "private-benchmark".into(),
            peak: 1000,
            duration: Duration::from_secs(120),
            lifetime: Duration::from_secs(45),
            sender_every: 5,
            send_interval: Duration::from_millis(200),
            send_probability: 0.4,
            via: Via::Ws,
            grace: Duration::from_secs(2),
            timeout: Duration::from_secs(30),
            progress: true,
            server_pid: None,
            protocol: Proto::Pusher,
            nodes: Vec::new(),
            shard: None,
        }
    }
}

/// Virtual users wanted `t` into a run of length `total` (k6 `stages`).
pub fn target_vus(peak: usize, total: Duration, t: Duration) -> usize {
    let (t, total) = (t.as_secs_f64(), total.as_secs_f64().max(1e-9));
    let (s1, s2, s3) = (total / 3.0, total / 2.0, total / 6.0);
    let quarter = peak as f64 / 4.0;
    let v = if t < s1 {
        quarter * t / s1
    } else if t < s1 + s2 {
        quarter + (peak as f64 - quarter) * (t - s1) / s2
    } else if t < total {
        peak as f64 * (1.0 - (t - s1 - s2) / s3)
    } else {
        0.0
    };
    (v.round() as usize).min(peak)
}

/// When user `idx` stops being wanted in a run of length `total`: the
/// first moment of the ramp-down at which [`target_vus`] is at most `idx`
/// (at the latest `total`, when it is 0). Before the ramp-down the number
/// of users wanted only grows, so a user that was started stays wanted
/// until then. Each user sleeps until this moment instead of asking the
/// ramp a few times a second: at 100,000 users those wake-ups were most of
/// the generator's CPU.
pub fn unwanted_after(peak: usize, total: Duration, idx: usize) -> Duration {
    let total_s = total.as_secs_f64();
    let (mut lo, mut hi) = (total_s / 3.0 + total_s / 2.0, total_s);
    if target_vus(peak, total, Duration::from_secs_f64(lo)) <= idx {
        return Duration::from_secs_f64(lo);
    }
    // target_vus(lo) > idx >= target_vus(hi); it does not grow between.
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if target_vus(peak, total, Duration::from_secs_f64(mid)) <= idx {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Duration::from_secs_f64(hi)
}

pub const CLIENT_EVENT: &str = "client-broadcast";
pub const API_EVENT: &str = "broadcast";

struct Shared {
    p: BroadcastParams,
    live: Arc<Live>,
    latency: Arc<Latency>,
    connecting: Latency,
    subscribe: Latency,
    publish_duration: Latency,
    ledger: Ledger,
    vus: AtomicUsize,
    stop: AtomicBool,
    next_conn: AtomicU64,
    sessions: AtomicU64,
    server_errors: AtomicU64,
    publish_errors: AtomicU64,
    /// One per node (`--via http`).
    publishers: Vec<HttpPublisher>,
    peak_connections: AtomicUsize,
    /// When the ramp started (the schedule's zero).
    started: Instant,
}

impl Shared {
    fn wanted(&self, idx: usize) -> bool {
        !self.stop.load(Relaxed)
            && idx < self.vus.load(Relaxed)
            && self.started.elapsed() < self.unwanted_after(idx)
    }

    fn unwanted_after(&self, idx: usize) -> Duration {
        unwanted_after(self.p.peak, self.p.duration, idx)
    }
}

async fn vu(s: Arc<Shared>, idx: usize) {
    while s.wanted(idx) {
        if !iteration(&s, idx).await {
            // Failed to connect: do not hammer the server in a loop.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// One life of a virtual user. Returns false when it could not connect.
async fn iteration(s: &Arc<Shared>, idx: usize) -> bool {
    let p = &s.p;
    let node = idx % p.nodes.len().max(1);
    let target = super::node(&p.target, &p.nodes, idx);
    let id = shard::global(p.shard, s.next_conn.fetch_add(1, Relaxed));
    let t0 = Instant::now();
    let proto = p.protocol;
    let mut conn = match proto
        .open(target, target.source_for(id as usize), p.timeout)
        .await
    {
        Ok(c) => c,
        Err(e) => {
            s.live.error(e.kind(), proto.explain(&e, target));
            return false;
        }
    };
    s.connecting.record_duration(id as usize, t0.elapsed());
    s.sessions.fetch_add(1, Relaxed);
    let t1 = Instant::now();
    if let Err(e) = proto
        .subscribe_one(&mut conn, target, &p.channel, p.timeout)
        .await
    {
        s.live.error(e.kind(), proto.explain(&e, target));
        conn.close().await;
        return false;
    }
    s.subscribe.record_duration(id as usize, t1.elapsed());
    let open = s.live.connections.fetch_add(1, Relaxed) + 1;
    s.peak_connections.fetch_max(open.max(0) as usize, Relaxed);

    let join = now_us();
    let is_sender = idx.is_multiple_of(p.sender_every.max(1));
    let mut rng = Rng::new(id + 1);
    let mut send_tick = tokio::time::interval(p.send_interval);
    send_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    send_tick.tick().await;
    // The end of this life: its lifetime, or the moment the ramp no longer
    // wants this user (ramping down, or the run's end), whichever is first.
    let unwanted = tokio::time::Instant::from_std(s.started + s.unwanted_after(idx));
    let end = tokio::time::sleep_until(unwanted.min(tokio::time::Instant::now() + p.lifetime));
    tokio::pin!(end);
    // Ids seen by this receiver; which of them were expected is decided
    // by the ledger at the end, once every send's fate is known.
    let mut seen = Seen::default();
    let mut gone = false;
    let on_frame = |text: &str, seen: &mut Seen| {
        let f = proto.scan(text, API_EVENT);
        if f.event == CLIENT_EVENT || f.event == API_EVENT {
            // Action Cable broadcasts reach their sender too: not a
            // delivery the ledger expects, and not an echo to count.
            if proto.is_cable() && f.id.is_some_and(|m| m.sender == id) {
                return;
            }
            if let Some(t) = f.stamp {
                // Every stamped frame, duplicates included (ws_msgs_received).
                s.live.received.fetch_add(1, Relaxed);
                match f.id.map(|m| seen.record(m.seq)) {
                    // Latency of first arrivals only: a duplicate's age says
                    // nothing about how fast messages are delivered.
                    Some(Receipt::New) => s.latency.record(id as usize, now_us().saturating_sub(t)),
                    Some(Receipt::Duplicate | Receipt::Unexpected) => {}
                    None => seen.garbled(),
                }
            }
        } else if proto.is_error(text, f.event) {
            s.server_errors.fetch_add(1, Relaxed);
        }
    };
    loop {
        tokio::select! {
            // Frames first: most wake-ups are a frame, and an unbiased select
            // would poll the timers before it on most of them (`Sleep::poll`
            // showed in the profile). Frames arrive far apart compared with
            // reading one, so the timers are not starved.
            biased;
            r = proto.recv(&mut conn) => match r {
                Ok(text) => on_frame(&text, &mut seen),
                Err(e) => {
                    s.live.error(e.kind(), proto.explain(&e, target));
                    gone = true;
                    break;
                }
            },
            _ = send_tick.tick(), if is_sender => {
                if rng.next_f64() < p.send_probability {
                    let stamp = now_us();
                    let msg = s.ledger.next_id(id);
                    let data = bench_data(stamp, msg);
                    match p.via {
                        Via::Ws => {
                            let frame = match proto {
                                Proto::ActionCable | Proto::ActionCableExt => {
                                    actioncable::broadcast_command(&data)
                                }
                                // Pusher (`run` refuses the others).
                                _ => format!(
                                    "{{\"event\":\"{CLIENT_EVENT}\",\"channel\":\"{}\",\"data\":{data}}}",
                                    p.channel
                                ),
                            };
                            if let Err(e) = conn.send(frame).await {
                                s.live.error(e.kind(), proto.explain(&e, target));
                                gone = true;
                                break;
                            }
                            s.ledger.send(stamp, msg);
                            s.live.sent.fetch_add(1, Relaxed);
                        }
                        Via::Http => {
                            let s2 = s.clone();
                            let socket_id = conn.socket_id.clone();
                            tokio::spawn(async move {
                                let publisher = &s2.publishers[node];
                                let t0 = Instant::now();
                                match publisher.publish(&s2.p.channel, API_EVENT, &data, Some(&socket_id)).await {
                                    Ok(()) => {
                                        s2.publish_duration.record_duration(id as usize, t0.elapsed());
                                        s2.ledger.send(stamp, msg);
                                        s2.live.sent.fetch_add(1, Relaxed);
                                    }
                                    Err(_) => {
                                        s2.publish_errors.fetch_add(1, Relaxed);
                                    }
                                }
                            });
                        }
                    }
                }
            }
            _ = &mut end => break,
        }
    }
    let leave = now_us();
    if !gone {
        // Keep reading what was sent before we left, then go. The socket
        // is still open (and subscribed) meanwhile, so it still counts in
        // the connections gauge until it is closed.
        let _ = tokio::time::timeout(p.grace, async {
            while let Ok(text) = proto.recv(&mut conn).await {
                on_frame(&text, &mut seen);
            }
        })
        .await;
        conn.close().await;
    }
    s.live.connections.fetch_sub(1, Relaxed);
    s.ledger.window(Window {
        receiver: id,
        join,
        leave,
        seen: seen.freeze(),
    });
    true
}

/// The protocols `broadcast` speaks.
pub const PROTOCOLS: &[Proto] = &[Proto::Pusher, Proto::ActionCable, Proto::ActionCableExt];

pub async fn run(p: &BroadcastParams) -> Result<Report, BenchError> {
    p.protocol.check("broadcast", PROTOCOLS)?;
    let mut report = Report::new("broadcast");
    let nodes = match p.nodes.len() {
        0 => std::slice::from_ref(&p.target),
        _ => &p.nodes[..],
    };
    let urls: Vec<&str> = nodes.iter().map(|t| t.url.as_str()).collect();
    report.param("url", urls.join(","));
    report.param("protocol", p.protocol.name());
    report.param("peak", p.peak);
    report.param("duration", format!("{:?}", p.duration));
    report.param("lifetime", format!("{:?}", p.lifetime));
    report.param(
        "via",
        match p.via {
            Via::Ws if p.protocol.is_cable() => "ws (BenchmarkChannel's broadcast action)",
            Via::Ws => "ws (client events)",
            Via::Http => "http (HTTP API publishes)",
        },
    );
    if let Some(w) = raise_nofile(shard::share(p.shard, p.peak) as u64 * 2) {
        eprintln!("herald bench: {w}");
        report.notes.push(w);
    }
    match p.protocol {
        Proto::ActionCable | Proto::ActionCableExt if p.via == Via::Http => {
            return Err(BenchError(
                "--protocol actioncable sends through BenchmarkChannel's broadcast action (the \
                 RPC app broadcasts); --via http does not apply"
                    .into(),
            ))
        }
        _ => {
            for target in nodes {
                match p.protocol {
                    Proto::ActionCable | Proto::ActionCableExt => {
                        actioncable::preflight(target, true)
                            .await
                            .map_err(BenchError)?
                    }
                    // Pusher (the others were refused above).
                    _ => preflight(target, Some(&p.channel), p.via == Via::Http).await?,
                }
            }
        }
    }
    // Every process's ramp starts at once.
    shard::sync(p.shard, "ready", serde_json::Value::Null).await?;
    let cpu = CpuMeter::start(p.server_pid);
    let s = Arc::new(Shared {
        p: p.clone(),
        live: Arc::new(Live::default()),
        latency: Arc::new(Latency::default()),
        connecting: Latency::default(),
        subscribe: Latency::default(),
        publish_duration: Latency::default(),
        ledger: Ledger::numbered(p.shard),
        vus: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        next_conn: AtomicU64::new(0),
        sessions: AtomicU64::new(0),
        server_errors: AtomicU64::new(0),
        publish_errors: AtomicU64::new(0),
        publishers: match p.via {
            Via::Http => nodes.iter().map(HttpPublisher::new).collect(),
            Via::Ws => Vec::new(),
        },
        peak_connections: AtomicUsize::new(0),
        started: Instant::now(),
    });
    let monitor = Monitor::start(
        "broadcast",
        s.live.clone(),
        Some(s.latency.clone()),
        p.progress,
    );
    let started = s.started;
    let mut running: Vec<bool> = vec![false; p.peak];
    let mut tasks = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tick.tick().await;
        let t = started.elapsed();
        if t >= p.duration {
            break;
        }
        let wanted = target_vus(p.peak, p.duration, t);
        s.vus.store(wanted, Relaxed);
        // Reap finished users so they can be started again if wanted.
        while let Some(r) = tasks.try_join_next() {
            if let Ok(idx) = r {
                running[idx] = false;
            }
        }
        for (idx, on) in running.iter_mut().enumerate().take(wanted) {
            if !*on && shard::owns(p.shard, idx) {
                *on = true;
                let s = s.clone();
                tasks.spawn(async move {
                    vu(s, idx).await;
                    idx
                });
            }
        }
    }
    s.stop.store(true, Relaxed);
    s.vus.store(0, Relaxed);
    while tasks.join_next().await.is_some() {}
    // HTTP publishes still in flight.
    tokio::time::sleep(Duration::from_millis(100)).await;
    report.timeline = monitor.finish().await;
    report.seconds = started.elapsed().as_secs_f64();

    let sent_here = s.ledger.sends() as u64;
    if p.shard.is_some() {
        // Each process's receivers were owed the other processes' sends
        // too: take them all before counting.
        let all = shard::sync(p.shard, "sends", s.ledger.sends_json()).await?;
        let me = p.shard.map_or(0, |sh| sh.index);
        for (i, list) in all.iter().enumerate() {
            if i != me {
                s.ledger.add_sends(list);
            }
        }
    }
    // Where the losses fall: how long before its receiver left each lost
    // message was sent (a receiver keeps reading `grace` after it leaves,
    // so a message later than that is counted lost), and whether its
    // sender was in this process or another (with as many processes as
    // nodes, process K's users are node K's: a loss between processes
    // crossed the broker).
    let mut lost_before_leave = super::metrics::histogram();
    let (mut lost_same, mut lost_other) = (0u64, 0u64);
    let d = s.ledger.tally_with(|w, stamp, id| {
        lost_before_leave.saturating_record(w.leave.saturating_sub(stamp).max(1));
        if let Some(sh) = p.shard {
            let n = sh.count as u64;
            if id.sender % n == w.receiver % n {
                lost_same += 1;
            } else {
                lost_other += 1;
            }
        }
    });
    report.counter("ws_sessions", s.sessions.load(Relaxed));
    report.value(
        "peak_connections",
        Some(s.peak_connections.load(Relaxed) as f64),
        "",
    );
    report.trend("ws_connecting", s.connecting.total());
    report.trend("ws_subscribe", s.subscribe.total());
    report.counter("ws_msgs_sent", sent_here);
    report.counter("ws_msgs_received", s.live.received.load(Relaxed));
    if p.via == Via::Http {
        report.counter("http_publish_errors", s.publish_errors.load(Relaxed));
        report.trend("http_publish_duration", s.publish_duration.total());
    }
    report.deliveries(&d);
    report.trend("lost_sent_before_leave", lost_before_leave);
    if p.shard.is_some() {
        report.counter("deliveries_lost{sender:same_process}", lost_same);
        report.counter("deliveries_lost{sender:other_process}", lost_other);
    }
    report.trend("message_latency", s.latency.total());
    report.counter("server_errors", s.server_errors.load(Relaxed));
    report.errors(&s.live);
    if d.lost() > 0 {
        report.notes.push(format!(
            "{} of {} expected deliveries did not arrive (within {:?} of a receiver leaving)",
            d.lost(),
            d.expected,
            p.grace
        ));
    }
    cpu.finish(&mut report);
    super::server_memory(&mut report, p.server_pid);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages() {
        let t = Duration::from_secs(120);
        let at = |s: u64| target_vus(1000, t, Duration::from_secs(s));
        assert_eq!(at(0), 0);
        assert_eq!(at(40), 250);
        assert_eq!(at(100), 1000);
        assert_eq!(at(110), 500);
        assert_eq!(at(120), 0);
    }

    #[test]
    fn each_user_is_unwanted_from_where_the_ramp_drops_below_it() {
        for (peak, secs) in [(1000, 120.0), (100_000, 120.0), (8, 3.0), (16_667, 90.0)] {
            let t = Duration::from_secs_f64(secs);
            for idx in [0, 1, peak / 7, peak / 4, peak / 2, peak - 2, peak - 1] {
                let u = unwanted_after(peak, t, idx);
                // Wanted just before (once it has been started, i.e. once
                // the ramp-up reached it), not wanted from then on.
                assert!(target_vus(peak, t, u) <= idx, "{peak} {idx} {u:?}");
                assert!(u <= t);
                let before = u.saturating_sub(Duration::from_micros(10));
                assert!(target_vus(peak, t, before) > idx, "{peak} {idx} {u:?}");
                assert!(u >= Duration::from_secs_f64(secs * 5.0 / 6.0) - Duration::from_micros(1));
            }
        }
        // The ramp-down's first step: the last user goes as it starts.
        let t = Duration::from_secs(120);
        assert_eq!(unwanted_after(1000, t, 999).as_secs(), 100);
        // The first user goes last, just before the run's end.
        assert!(unwanted_after(1000, t, 0) > Duration::from_millis(119_980));
    }
}
