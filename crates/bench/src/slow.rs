//! `slow`: a share of the subscribers stop reading.
//!
//! Two phases in one invocation, each with fresh connections: a clean one
//! (every subscriber reads) and a slow one, where `slow_share` of the
//! subscribers (default 5 %) stop polling their socket right after
//! subscribing, so TCP backs up towards the server. Publishes go out
//! through the HTTP API at `rate` per second, round-robin over the
//! channels, each padded to `payload` bytes and carrying its channel's
//! sequence number. The others ("fast") subscribe to one channel each;
//! the designated slow share subscribes to every channel, in both phases
//! (so the clean phase is the same work for the server, the designated
//! ones reading), so that a bounded queue fills within seconds rather
//! than minutes: each receives `rate` × `payload` bytes per second.
//!
//! Reported per phase: the fast subscribers' publish-to-receive latency
//! and their deliveries (expected, lost, duplicated: they must receive
//! everything), the server's highest resident memory while publishing;
//! for the slow phase, how many slow subscribers the server closed with
//! 4100, and
//! `all_slow_closed_after` (from the server's
//! `herald_slow_clients_closed_total`, where it has one). A slow
//! subscriber reads again once the server's counter says every slow one
//! was closed, or when the publishing is over: it then reads the backlog
//! and expects the `pusher:error` 4100 and the close frame with 4100. (A
//! client that never reads again cannot see them: Herald drops a socket
//! whose write has made no progress for 10 s, `slow_reset` here.) Also
//! `fast_p99_ratio`, the fast subscribers' p99 in the slow phase over the
//! clean one, both over the time the slow share was not reading
//! (`fast_message_latency_stalled`: once the slow ones read their backlog
//! again, the generator itself is busy with it). `slow_share` 0 runs the
//! clean phase alone.
//!
//! A server that bounds each connection's queue (Herald: `outbound_bytes`,
//! 1 MiB, and `outbound_queue`, 1024 frames, per connection) keeps what
//! slow clients pin below slow clients × that bound, whatever the run's
//! length; frames are shared between subscribers, so in practice much
//! less. `slow_queue_bound` in the report is slow clients × `--queue-bytes`
//! (Herald's default `outbound_bytes`), for comparison with the memory
//! figures.
//!
//! `--protocol actioncable`, `appsync-graphql` and `appsync-events` run
//! the same two phases over those protocols ([`Proto`]): a bench channel
//! `slow-N` is a `BenchmarkChannel` subscription with `{"id":"slow-N"}`
//! (Action Cable; publishes through the HTTP broadcast API,
//! `--broadcast-url`) or a subscription to `slow-N` (AppSync; publishes
//! through `POST /graphql` or `POST /event`). The slow share is closed the
//! way Herald closes a slow client in each protocol: Action Cable sends
//! `{"type":"disconnect","reason":"too_slow","reconnect":true}` and closes
//! with 1013, AppSync closes with 1008 ("Client too slow"); the report
//! counts those as `slow_closed_1013` / `slow_closed_1008` (the frame or
//! the close code), besides the server's
//! `herald_slow_clients_closed_total`.

use super::client::{bench_data, Conn};
use super::ledger::{Deliveries, MsgId, Receipt, Seen, SeqSet};
use super::metrics::{Latency, Live, Monitor};
use super::proto::{Broadcast, Proto, Publisher};
use super::worst::Metrics;
use super::{now_us, raise_nofile, BenchError, CpuMeter, Report, Target};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub const EVENT: &str = "bench-slow";

#[derive(Debug, Clone)]
pub struct SlowParams {
    pub target: Target,
    /// The protocol subscribers and publishers speak.
    pub protocol: Proto,
    /// Where Action Cable publishes go.
    pub broadcast: Broadcast,
    pub clients: usize,
    /// Share of the subscribers that stop reading (0: clean phase only).
    pub slow_share: f64,
    pub channels: usize,
    /// HTTP publishes per second, all channels together.
    pub rate: f64,
    /// Bytes of each publish's data.
    pub payload: usize,
    /// Publishing time of each phase.
    pub duration: Duration,
    /// Keep the slow phase publishing past `duration`, up to this long,
    /// until the server says every slow subscriber was closed (`None`:
    /// stop at `duration`). How many bytes fill a slow client's path
    /// depends on the kernels' buffer autotuning, and how fast they come
    /// on the machine's load: a count-based end makes a test independent
    /// of both.
    pub until_closed: Option<Duration>,
    /// Receive buffer of the slow subscribers' sockets, in bytes (0: the
    /// system's, the default). A small one keeps what the kernel holds for
    /// them small, but a window below the segment size makes the server's
    /// kernel fall back on zero-window probes with exponential backoff, so
    /// a slow client that reads again drains at a crawl.
    pub slow_recv_buffer: usize,
    /// How long fast subscribers keep reading after the last publish.
    pub drain: Duration,
    /// The per-connection queue bound the server is expected to enforce,
    /// for `slow_queue_bound` (Herald's default `outbound_bytes`).
    pub queue_bytes: u64,
    pub concurrency: usize,
    pub metrics_url: Option<String>,
    pub timeout: Duration,
    pub progress: bool,
    pub server_pid: Option<u32>,
}

impl SlowParams {
    pub fn new(target: Target) -> SlowParams {
        SlowParams {
            target,
            protocol: Proto::Pusher,
            broadcast: Broadcast::default(),
            clients: 2000,
            slow_share: 0.05,
            channels: 10,
            rate: 100.0,
            payload: 4096,
            duration: Duration::from_secs(30),
            until_closed: None,
            slow_recv_buffer: 0,
            drain: Duration::from_secs(3),
            queue_bytes: 1024 * 1024,
            concurrency: 256,
            metrics_url: None,
            timeout: Duration::from_secs(30),
            progress: true,
            server_pid: None,
        }
    }

    /// How many subscribers are slow in the slow phase.
    pub fn slow_count(&self) -> usize {
        (self.clients as f64 * self.slow_share.clamp(0.0, 1.0)).round() as usize
    }
}

/// Which of `clients` subscribers are slow: `slow` of them, evenly spread.
pub fn slow_set(clients: usize, slow: usize) -> Vec<bool> {
    let mut v = vec![false; clients];
    for j in 0..slow.min(clients) {
        v[j * clients / slow] = true;
    }
    v
}

pub fn channel_name(c: usize) -> String {
    format!("slow-{c}")
}

/// The data of one publish: padding first (so the bench's fields, read
/// from the end, are found at once), then the send time and the id.
pub fn padded_data(stamp: u64, id: MsgId, payload: usize) -> String {
    let fields = bench_data(stamp, id);
    let pad = payload.saturating_sub(fields.len() + 10);
    format!("{{\"pad\":\"{}\",{}", "x".repeat(pad), &fields[1..])
}

/// What a slow subscriber saw once it read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlowEnd {
    /// Closed for being slow: `pusher:error` 4100 or a close frame with
    /// 4100 (the other protocols: [`Proto::is_slow_notice`], or a close
    /// with [`Proto::slow_close_code`]).
    Closed4100,
    /// Closed otherwise (another code, or a reset).
    ClosedOther,
    /// Still open, not closed by the server.
    Open,
}

struct Phase {
    slow: usize,
    live: Arc<Live>,
    latency: Arc<Latency>,
    /// The fast subscribers' latency while the slow share is not reading
    /// (the whole publishing time in the clean phase): once the slow ones
    /// read their backlog again, the generator itself is busy with it.
    stalled: Latency,
    resumed: std::sync::atomic::AtomicBool,
    accepted: Vec<Mutex<SeqSet>>,
    deliveries: Mutex<Deliveries>,
    seen: Mutex<Vec<(usize, Seen)>>,
    ends: Mutex<Vec<SlowEnd>>,
    subscribed: AtomicUsize,
    failed: AtomicUsize,
    publish_errors: AtomicU64,
    rss_max: AtomicU64,
    /// How the first slow subscriber closed otherwise than with 4100.
    slow_other: Mutex<Option<String>>,
    /// Errors of the slow share while it reads (clean phase), and the first.
    designated_errors: AtomicU64,
    designated_error: Mutex<Option<String>>,
}

fn set_recv_buffer(conn: &Conn, bytes: usize) {
    if bytes == 0 {
        return;
    }
    let v = bytes as libc::c_int;
    // SAFETY: a valid socket and a pointer to a c_int of the given size.
    unsafe {
        libc::setsockopt(
            conn.ws.get_ref().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &v as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

async fn subscriber(
    p: Arc<SlowParams>,
    ph: Arc<Phase>,
    i: usize,
    designated: bool,
    slow: bool,
    gate: Arc<tokio::sync::Semaphore>,
    (mut stop, mut resume): (watch::Receiver<bool>, watch::Receiver<bool>),
) {
    let (t, proto) = (&p.target, p.protocol);
    let c = i % p.channels;
    let names: Vec<String> = if designated {
        (0..p.channels).map(channel_name).collect()
    } else {
        vec![channel_name(c)]
    };
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let conn = {
        let _permit = gate.acquire().await;
        match proto.open(t, t.source_for(i), p.timeout).await {
            Ok(mut conn) => {
                if slow {
                    set_recv_buffer(&conn, p.slow_recv_buffer);
                }
                match proto.subscribe(&mut conn, t, &names, "", p.timeout).await {
                    Ok(()) => Some(conn),
                    Err(e) => {
                        ph.live.error(e.kind(), proto.explain(&e, t));
                        None
                    }
                }
            }
            Err(e) => {
                ph.live.error(e.kind(), proto.explain(&e, t));
                None
            }
        }
    };
    let Some(mut conn) = conn else {
        ph.failed.fetch_add(1, Relaxed);
        return;
    };
    ph.subscribed.fetch_add(1, Relaxed);
    ph.live.connections.fetch_add(1, Relaxed);
    if slow {
        // Stop reading: nothing polls this socket until the server has
        // given up on every slow subscriber (its slow-client counter says
        // so), or the publishing is over.
        let _ = resume.changed().await;
        // Read again, with a large buffer: through a 4 KiB window the
        // megabytes the kernel holds for this socket would take minutes
        // (one delayed acknowledgement per window).
        if p.slow_recv_buffer > 0 {
            set_recv_buffer(&conn, 4 << 20);
        }
        let other = &ph.slow_other;
        let end = tokio::time::timeout(p.drain + Duration::from_secs(10), async {
            loop {
                match proto.recv(&mut conn).await {
                    Ok(text) => {
                        if proto.is_slow_notice(&text) {
                            return SlowEnd::Closed4100;
                        }
                    }
                    Err(e) if proto.is_slow_close(&e) => return SlowEnd::Closed4100,
                    Err(e) => {
                        let mut why = other.lock().unwrap();
                        if why.is_none() {
                            *why = Some(format!("{e:?}"));
                        }
                        return SlowEnd::ClosedOther;
                    }
                }
            }
        })
        .await
        .unwrap_or(SlowEnd::Open);
        ph.ends.lock().unwrap().push(end);
        if end == SlowEnd::Open {
            conn.close().await;
        }
        ph.live.connections.fetch_sub(1, Relaxed);
        return;
    }
    let mut seen = Seen::default();
    loop {
        tokio::select! {
            biased;
            r = proto.recv(&mut conn) => match r {
                Ok(text) => {
                    let f = proto.scan(&text, EVENT);
                    if f.event == EVENT {
                        ph.live.received.fetch_add(1, Relaxed);
                        match (f.id, f.stamp) {
                            (Some(m), Some(stamp)) => {
                                if seen.record(m.seq) == Receipt::New && !designated {
                                    let age = now_us().saturating_sub(stamp);
                                    ph.latency.record(i, age);
                                    if !ph.resumed.load(Relaxed) {
                                        ph.stalled.record(i, age);
                                    }
                                }
                            }
                            _ => seen.garbled(),
                        }
                    }
                }
                Err(e) => {
                    if designated {
                        // One of the slow share, reading in the clean
                        // phase: it is sent `rate` × `payload` bytes a
                        // second and may fall behind on a busy machine.
                        ph.designated_errors.fetch_add(1, Relaxed);
                        let mut first = ph.designated_error.lock().unwrap();
                        if first.is_none() {
                            *first = Some(proto.explain(&e, t));
                        }
                    } else {
                        ph.live.error(e.kind(), proto.explain(&e, t));
                    }
                    break;
                }
            },
            _ = stop.changed() => {
                conn.close().await;
                break;
            }
        }
    }
    ph.live.connections.fetch_sub(1, Relaxed);
    if !designated {
        ph.seen.lock().unwrap().push((c, seen.freeze()));
    }
}

/// One phase: `designated` subscribers on every channel, reading unless
/// `slow`.
async fn phase(
    p: &Arc<SlowParams>,
    designated: usize,
    slow: bool,
    metrics: &Metrics,
) -> (Arc<Phase>, Option<f64>, Option<f64>) {
    let slow_n = if slow { designated } else { 0 };
    let ph = Arc::new(Phase {
        slow: slow_n,
        live: Arc::new(Live::default()),
        latency: Arc::new(Latency::default()),
        stalled: Latency::default(),
        resumed: std::sync::atomic::AtomicBool::new(false),
        accepted: (0..p.channels)
            .map(|_| Mutex::new(SeqSet::default()))
            .collect(),
        deliveries: Mutex::new(Deliveries::default()),
        seen: Mutex::new(Vec::new()),
        ends: Mutex::new(Vec::new()),
        subscribed: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
        publish_errors: AtomicU64::new(0),
        rss_max: AtomicU64::new(0),
        slow_other: Mutex::new(None),
        designated_errors: AtomicU64::new(0),
        designated_error: Mutex::new(None),
    });
    let label = if slow { "slow (slow)" } else { "slow (clean)" };
    let monitor = Monitor::start(label, ph.live.clone(), Some(ph.latency.clone()), p.progress);
    let closed_before = metrics.get("herald_slow_clients_closed_total").await;
    let (stop_tx, stop_rx) = watch::channel(false);
    let (resume_tx, resume_rx) = watch::channel(false);
    let gate = Arc::new(tokio::sync::Semaphore::new(p.concurrency.max(1)));
    let which = slow_set(p.clients, designated);
    let mut subs = tokio::task::JoinSet::new();
    for (i, &d) in which.iter().enumerate() {
        subs.spawn(subscriber(
            p.clone(),
            ph.clone(),
            i,
            d,
            d && slow,
            gate.clone(),
            (stop_rx.clone(), resume_rx.clone()),
        ));
    }
    let limit = Instant::now() + p.timeout * 4;
    while ph.subscribed.load(Relaxed) + ph.failed.load(Relaxed) < p.clients
        && Instant::now() < limit
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Publish for the duration, sampling the server's memory meanwhile.
    let publisher = Publisher::new(p.protocol, &p.target, &p.broadcast);
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / p.rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sample = tokio::time::interval(Duration::from_millis(250));
    let inflight_gate = Arc::new(tokio::sync::Semaphore::new(64));
    let mut inflight = tokio::task::JoinSet::new();
    let mut k = 0usize;
    let mut all_closed_after = None;
    let publishing = |all_closed_after: Option<f64>| {
        let t = started.elapsed();
        t < p.duration
            || (slow_n > 0
                && all_closed_after.is_none()
                && p.until_closed.is_some_and(|max| t < max))
    };
    while publishing(all_closed_after) {
        tokio::select! {
            _ = tick.tick() => {
                while inflight.try_join_next().is_some() {}
                let Ok(permit) = inflight_gate.clone().acquire_owned().await else { break };
                let c = k % p.channels;
                let id = MsgId { sender: c as u64, seq: (k / p.channels) as u64 };
                k += 1;
                let (ph2, publisher, payload) = (ph.clone(), publisher.clone(), p.payload);
                inflight.spawn(async move {
                    let _permit = permit;
                    let data = padded_data(now_us(), id, payload);
                    match publisher.publish(&channel_name(c), EVENT, &data).await {
                        Ok(()) => {
                            ph2.accepted[c].lock().unwrap().insert(id.seq);
                            ph2.live.sent.fetch_add(1, Relaxed);
                        }
                        Err(_) => {
                            ph2.publish_errors.fetch_add(1, Relaxed);
                        }
                    }
                });
            }
            _ = sample.tick() => {
                if let Some(rss) = p.server_pid.and_then(|pid| super::rss_bytes(Some(pid))) {
                    ph.rss_max.fetch_max(rss, Relaxed);
                }
                if slow_n > 0 && all_closed_after.is_none() {
                    if let (Some(a), Some(b)) = (
                        closed_before,
                        metrics.get("herald_slow_clients_closed_total").await,
                    ) {
                        if b - a >= slow_n as f64 {
                            all_closed_after = Some(started.elapsed().as_secs_f64());
                            ph.resumed.store(true, Relaxed);
                            let _ = resume_tx.send(true);
                        }
                    }
                }
            }
        }
    }
    while inflight.join_next().await.is_some() {}
    ph.resumed.store(true, Relaxed);
    let _ = resume_tx.send(true);
    drop(publisher);
    if let Some(rss) = p.server_pid.and_then(|pid| super::rss_bytes(Some(pid))) {
        ph.rss_max.fetch_max(rss, Relaxed);
    }
    tokio::time::sleep(p.drain).await;
    let closed_after = metrics.get("herald_slow_clients_closed_total").await;
    let _ = stop_tx.send(true);
    while subs.join_next().await.is_some() {}
    // Fast subscribers: expected every accepted publish of their channel.
    let mut d = Deliveries::default();
    for (c, seen) in ph.seen.lock().unwrap().iter() {
        let accepted = ph.accepted[*c].lock().unwrap();
        d.expected += accepted.len();
        let got = seen.set.intersection_len(&accepted);
        d.received += got;
        d.duplicated += seen.duplicates;
        d.unexpected += seen.unexpected + seen.set.len() - got;
    }
    *ph.deliveries.lock().unwrap() = d;
    monitor.finish().await;
    let closed = match (closed_before, closed_after) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    (ph, closed, all_closed_after)
}

fn report_phase(
    r: &mut Report,
    p: &SlowParams,
    name: &str,
    ph: &Phase,
    closed: Option<f64>,
    all_closed_after: Option<f64>,
) {
    let tag = |m: &str| format!("{m}{{phase:{name}}}");
    r.rate(
        &tag("subscribed"),
        ph.subscribed.load(Relaxed) as u64,
        p.clients as u64,
    );
    r.counter(&tag("http_publishes"), ph.live.sent.load(Relaxed));
    r.counter(&tag("http_publish_errors"), ph.publish_errors.load(Relaxed));
    let d = *ph.deliveries.lock().unwrap();
    r.counter(&tag("fast_deliveries_expected"), d.expected);
    r.counter(&tag("fast_deliveries_lost"), d.lost());
    r.counter(&tag("fast_deliveries_duplicated"), d.duplicated);
    r.counter(&tag("fast_deliveries_unexpected"), d.unexpected);
    r.trend(&tag("fast_message_latency"), ph.latency.total());
    r.trend(&tag("fast_message_latency_stalled"), ph.stalled.total());
    r.value(
        &tag("server_rss_max"),
        (ph.rss_max.load(Relaxed) > 0).then(|| ph.rss_max.load(Relaxed) as f64),
        "B",
    );
    r.counter(&tag("connection_errors"), ph.live.errors.load(Relaxed));
    if ph.slow == 0 {
        r.counter(
            &tag("slow_share_errors"),
            ph.designated_errors.load(Relaxed),
        );
        if let Some(e) = ph.designated_error.lock().unwrap().as_ref() {
            r.notes.push(format!(
                "{name}: {} of the slow share (reading in this phase) failed, the first: {e}",
                ph.designated_errors.load(Relaxed)
            ));
        }
    }
    for e in ph.live.error_examples() {
        r.notes.push(format!("{name}: {e}"));
    }
    if ph.slow > 0 {
        let ends = ph.ends.lock().unwrap();
        let n = |e: SlowEnd| ends.iter().filter(|x| **x == e).count() as u64;
        let code = p.protocol.slow_close_code();
        r.counter("slow_clients", ph.slow as u64);
        r.rate(
            &format!("slow_closed_{code}"),
            n(SlowEnd::Closed4100),
            ph.slow as u64,
        );
        r.counter("slow_reset", n(SlowEnd::ClosedOther));
        r.counter("slow_still_open", n(SlowEnd::Open));
        r.value("server_slow_clients_closed", closed, "");
        r.value("all_slow_closed_after", all_closed_after, "s");
        r.value(
            "slow_queue_bound",
            Some(ph.slow as f64 * p.queue_bytes as f64),
            "B",
        );
        if let Some(why) = ph.slow_other.lock().unwrap().as_ref() {
            r.notes.push(format!(
                "{} slow subscribers were closed without a {code} (reset, or another code), the \
                 first: {why}",
                n(SlowEnd::ClosedOther)
            ));
        }
        if n(SlowEnd::Open) > 0 {
            r.notes.push(format!(
                "{} slow subscribers were still open after {:?} of publishing: the server \
                 neither closed them nor (if its queue is unbounded) stopped buffering for them; \
                 a longer --duration or a larger --payload fills a bounded queue sooner",
                n(SlowEnd::Open),
                p.duration
            ));
        }
    }
    if d.lost() > 0 {
        r.notes.push(format!(
            "{name}: fast subscribers lost {} of {} deliveries",
            d.lost(),
            d.expected
        ));
    }
}

pub async fn run(p: &SlowParams) -> Result<Report, BenchError> {
    if p.clients == 0 || p.channels == 0 || p.rate <= 0.0 || !(0.0..1.0).contains(&p.slow_share) {
        return super::err(
            "slow needs at least one client and one channel, a positive --rate and a \
             --slow-share from 0 up to (not including) 1",
        );
    }
    let slow = p.slow_count();
    let mut report = Report::new("slow");
    report.param("url", &p.target.url);
    if p.protocol != Proto::Pusher {
        report.param("protocol", p.protocol.name());
    }
    report.param("clients", p.clients);
    report.param(
        "slow share",
        format!("{} ({slow} subscribers)", p.slow_share),
    );
    report.param("channels", p.channels);
    report.param("rate", format!("{}/s of {} B", p.rate, p.payload));
    report.param("duration", format!("{:?} per phase", p.duration));
    if let Some(max) = p.until_closed {
        report.param(
            "until closed",
            format!("the slow phase publishes on until every slow one is closed, at most {max:?}"),
        );
    }
    if let Some(w) = raise_nofile(p.clients as u64 + 128) {
        eprintln!("herald bench: {w}");
        report.notes.push(w);
    }
    let publisher = Publisher::new(p.protocol, &p.target, &p.broadcast);
    p.protocol.preflight(&p.target, Some(&publisher)).await?;
    let metrics = Metrics::new(&p.target, p.metrics_url.as_deref());
    let cpu = CpuMeter::start(p.server_pid);
    let started = Instant::now();
    let shared = Arc::new(p.clone());
    let (clean, _, _) = phase(&shared, slow, false, &metrics).await;
    report_phase(&mut report, p, "clean", &clean, None, None);
    let clean_p99 = clean.stalled.total().value_at_quantile(0.99) as f64 / 1000.0;
    report.value("fast_p99_clean", Some(clean_p99), "ms");
    if slow > 0 {
        // A moment for the clean phase's sockets to be gone.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (slowph, closed, after) = phase(&shared, slow, true, &metrics).await;
        report_phase(&mut report, p, "slow", &slowph, closed, after);
        let slow_p99 = slowph.stalled.total().value_at_quantile(0.99) as f64 / 1000.0;
        report.value("fast_p99_slow", Some(slow_p99), "ms");
        report.value(
            "fast_p99_ratio",
            (clean_p99 > 0.0).then(|| slow_p99 / clean_p99),
            "",
        );
    }
    report.seconds = started.elapsed().as_secs_f64();
    cpu.finish(&mut report);
    super::server_memory(&mut report, p.server_pid);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_ones_are_spread_and_counted_exactly() {
        let v = slow_set(2000, 100);
        assert_eq!(v.iter().filter(|x| **x).count(), 100);
        assert!(v[0] && v[20] && !v[1]);
        assert_eq!(slow_set(10, 0).iter().filter(|x| **x).count(), 0);
        assert_eq!(slow_set(3, 3), vec![true, true, true]);
    }

    #[test]
    fn padded_data_has_the_asked_size_and_the_bench_fields() {
        let d = padded_data(123, MsgId { sender: 4, seq: 5 }, 4096);
        assert!((4000..=4096).contains(&d.len()), "{}", d.len());
        let v: serde_json::Value = serde_json::from_str(&d).unwrap();
        assert_eq!(v["bench_t"], 123);
        assert_eq!(v["bench_q"], 5);
    }
}
