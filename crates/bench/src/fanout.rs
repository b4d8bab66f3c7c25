//! `fanout`: S subscribers spread over C public channels, P publishers
//! publishing R requests/s in total through the HTTP API for D seconds.
//! Reports publish-to-receive latency and, per channel, the share of the
//! expected deliveries (accepted publishes × confirmed subscribers) that
//! arrived.
//!
//! Publish k (k = 0, 1, 2, ... over the whole run) goes to channel k mod C
//! and carries the id (publisher, k). A channel's publishes are therefore
//! numbered densely by k / C, and each subscriber keeps a bitmap over those
//! numbers: it counts each expected publish once, however often it arrives,
//! and the publishes the server accepted are compared with it at the end.
//!
//! Publishers are closed loops (each waits for its HTTP response before its
//! next publish), so one that falls behind its schedule sends late. Each
//! message is therefore stamped with its *scheduled* time, not the moment
//! it went out: `message_latency` then includes the backlog instead of
//! hiding it (coordinated omission), `publish_lag` shows how late the
//! publishes went out, and the achieved publish rate is reported beside the
//! asked one, with a note when it fell short.
//!
//! Subscribers and publishers speak Pusher or, with `--protocol
//! appsync-graphql` or `appsync-events`, one of the AppSync APIs
//! ([`PROTOCOLS`]; see [`super::appsync`]).

use super::appsync;
use super::client::bench_data;
use super::ledger::{Deliveries, MsgId, Receipt, Seen, SeqSet};
use super::metrics::{Latency, Live, Monitor};
use super::proto::{Broadcast, Proto, Publisher};
use super::{now_us, preflight, raise_nofile, BenchError, CpuMeter, Report, Target};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const EVENT: &str = "bench-fanout";

/// The achieved publish rate counts as on schedule down to this share of
/// the asked rate (timer jitter on the last publish costs a little).
const RATE_TOLERANCE: f64 = 0.99;

#[derive(Debug, Clone)]
pub struct FanoutParams {
    pub target: Target,
    /// Where subscribers connect, round-robin (several nodes of one
    /// cluster); empty: `target`. Publishers always use `target`.
    pub subscriber_targets: Vec<Target>,
    pub subscribers: usize,
    pub channels: usize,
    pub publishers: usize,
    /// Publishes per second, all publishers together.
    pub rate: f64,
    pub duration: Duration,
    /// Longest wait for outstanding deliveries after the last publish.
    pub drain: Duration,
    /// Subscribers connecting at once.
    pub concurrency: usize,
    pub timeout: Duration,
    pub progress: bool,
    pub server_pid: Option<u32>,
    /// What subscribers and publishers speak: Pusher (WebSocket + HTTP
    /// API) or one of the AppSync APIs: only [`PROTOCOLS`].
    pub protocol: Proto,
}

impl FanoutParams {
    pub fn new(target: Target) -> FanoutParams {
        FanoutParams {
            target,
            subscriber_targets: Vec::new(),
            subscribers: 1000,
            channels: 10,
            publishers: 10,
            rate: 100.0,
            duration: Duration::from_secs(30),
            drain: Duration::from_secs(5),
            concurrency: 256,
            timeout: Duration::from_secs(30),
            progress: true,
            server_pid: None,
            protocol: Proto::Pusher,
        }
    }
}

/// The protocols `fanout` speaks.
pub const PROTOCOLS: &[Proto] = &[Proto::Pusher, Proto::AppsyncGraphql, Proto::AppsyncEvents];

pub fn channel_name(c: usize) -> String {
    format!("benchmark-fanout-{c}")
}

/// The channel index of `benchmark-fanout-{c}`.
fn channel_index(name: &str) -> Option<usize> {
    name.strip_prefix("benchmark-fanout-")?.parse().ok()
}

struct Shared {
    live: Arc<Live>,
    latency: Arc<Latency>,
    connecting: Latency,
    publish_duration: Latency,
    /// How late each publish went out after its scheduled time.
    publish_lag: Latency,
    /// Publishes attempted, and when the last one went out (µs after the
    /// publishing phase started).
    publishes_sent: AtomicU64,
    last_send_us: AtomicU64,
    /// Confirmed subscribers, accepted publishes and first arrivals of a
    /// publish at a subscriber, per channel.
    subscribed: Vec<AtomicU64>,
    accepted: Vec<AtomicU64>,
    received: Vec<AtomicU64>,
    /// Accepted publishes per channel, by k / C.
    accepted_ids: Vec<std::sync::Mutex<SeqSet>>,
    publish_errors: AtomicU64,
    first_publish_error: std::sync::Mutex<Option<String>>,
    dropped: AtomicU64,
}

pub async fn run(p: &FanoutParams) -> Result<Report, BenchError> {
    p.protocol.check("fanout", PROTOCOLS)?;
    if p.channels == 0 || p.publishers == 0 || p.rate <= 0.0 {
        return super::err("fanout needs at least one channel, one publisher and a positive rate");
    }
    let mut report = Report::new("fanout");
    report.param("url", &p.target.url);
    if !p.subscriber_targets.is_empty() {
        let urls: Vec<&str> = p
            .subscriber_targets
            .iter()
            .map(|t| t.url.as_str())
            .collect();
        report.param("subscriber urls", urls.join(","));
    }
    report.param("subscribers", p.subscribers);
    report.param("channels", p.channels);
    report.param("publishers", p.publishers);
    report.param("rate", format!("{}/s", p.rate));
    report.param("duration", format!("{:?}", p.duration));
    report.param("protocol", p.protocol.name());
    if let Some(w) = raise_nofile(p.subscribers as u64 + p.publishers as u64) {
        eprintln!("herald bench: {w}");
        report.notes.push(w);
    }
    match p.protocol {
        Proto::Pusher => preflight(&p.target, None, true).await?,
        other => appsync::preflight(&p.target, other)
            .await
            .map_err(|e| super::BenchError(e.explain(&p.target)))?,
    }
    let cpu = CpuMeter::start(p.server_pid);
    let started = Instant::now();
    let per_channel = || (0..p.channels).map(|_| AtomicU64::new(0)).collect();
    let s = Arc::new(Shared {
        live: Arc::new(Live::default()),
        latency: Arc::new(Latency::default()),
        connecting: Latency::default(),
        publish_duration: Latency::default(),
        publish_lag: Latency::default(),
        publishes_sent: AtomicU64::new(0),
        last_send_us: AtomicU64::new(0),
        subscribed: per_channel(),
        accepted: per_channel(),
        received: per_channel(),
        accepted_ids: (0..p.channels).map(|_| Default::default()).collect(),
        publish_errors: AtomicU64::new(0),
        first_publish_error: Default::default(),
        dropped: AtomicU64::new(0),
    });
    let monitor = Monitor::start(
        "fanout",
        s.live.clone(),
        Some(s.latency.clone()),
        p.progress,
    );

    // Phase 1: every subscriber connected and confirmed.
    let gate = Arc::new(tokio::sync::Semaphore::new(p.concurrency.max(1)));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(p.subscribers.max(1));
    let mut subscribers = tokio::task::JoinSet::new();
    let (channels, publishers) = (p.channels as u64, p.publishers as u64);
    for i in 0..p.subscribers {
        let c = i % p.channels;
        let target = match p.subscriber_targets.len() {
            0 => p.target.clone(),
            n => p.subscriber_targets[i % n].clone(),
        };
        let (s, timeout, protocol) = (s.clone(), p.timeout, p.protocol);
        let (gate, mut stop, ready) = (gate.clone(), stop_rx.clone(), ready_tx.clone());
        subscribers.spawn(async move {
            let permit = gate.acquire().await;
            let t0 = Instant::now();
            let mut conn = match protocol.open(&target, target.source_for(i), timeout).await {
                Ok(c) => c,
                Err(e) => {
                    s.live.error(e.kind(), e.explain(&target));
                    let _ = ready.send(()).await;
                    return None;
                }
            };
            s.live.connections.fetch_add(1, Relaxed);
            let name = channel_name(c);
            if let Err(e) = protocol
                .subscribe_one(&mut conn, &target, &name, timeout)
                .await
            {
                s.live.error(e.kind(), e.explain(&target));
                s.live.connections.fetch_sub(1, Relaxed);
                let _ = ready.send(()).await;
                return None;
            }
            s.connecting.record_duration(i, t0.elapsed());
            s.subscribed[c].fetch_add(1, Relaxed);
            drop(permit);
            let _ = ready.send(()).await;
            // The channel's publish numbers (k / C) this subscriber saw.
            let mut got = Seen::default();
            loop {
                tokio::select! {
                    // Frames first: most wake-ups are a frame, and an unbiased select
                    // would poll the timers before it on most of them (`Sleep::poll`
                    // showed in the profile). Frames arrive far apart compared with
                    // reading one, so the timers are not starved.
                    biased;
                    r = protocol.recv(&mut conn) => match r {
                        Ok(text) => {
                            let f = protocol.scan(&text, EVENT);
                            if f.event != EVENT {
                                continue;
                            }
                            let Some(t) = f.stamp else { continue };
                            // Every stamped frame, duplicates included.
                            s.live.received.fetch_add(1, Relaxed);
                            // Ours only if it is on this subscriber's channel
                            // and its id is one a publisher here would use.
                            let index = f.id.filter(|m| {
                                f.channel.and_then(channel_index) == Some(c)
                                    && m.seq % channels == c as u64
                                    && m.sender == m.seq % publishers
                            });
                            match index.map(|m| got.record(m.seq / channels)) {
                                Some(Receipt::New) => {
                                    s.latency.record(i, now_us().saturating_sub(t));
                                    s.received[c].fetch_add(1, Relaxed);
                                }
                                Some(Receipt::Duplicate | Receipt::Unexpected) => {}
                                None => got.garbled(),
                            }
                        }
                        Err(e) => {
                            s.dropped.fetch_add(1, Relaxed);
                            s.live.error(e.kind(), e.explain(&target));
                            s.live.connections.fetch_sub(1, Relaxed);
                            return Some((c, got));
                        }
                    },
                    _ = stop.changed() => break,
                }
            }
            conn.close().await;
            s.live.connections.fetch_sub(1, Relaxed);
            Some((c, got))
        });
    }
    drop(ready_tx);
    for _ in 0..p.subscribers {
        if ready_rx.recv().await.is_none() {
            break;
        }
    }
    let subscribe_seconds = started.elapsed().as_secs_f64();

    // Phase 2: publishers on a fixed schedule; publish k goes to channel k % C.
    let publisher = Publisher::new(p.protocol, &p.target, &Broadcast::default());
    // The schedule on both clocks: `Instant` to sleep on, the bench clock
    // for the stamps receivers subtract from.
    let publish_start = Instant::now();
    let publish_start_us = now_us();
    let total = (p.rate * p.duration.as_secs_f64()).round() as u64;
    let mut publishers = tokio::task::JoinSet::new();
    for j in 0..p.publishers as u64 {
        let (s, publisher, target) = (s.clone(), publisher.clone(), p.target.clone());
        let (step, rate, channels) = (p.publishers as u64, p.rate, p.channels as u64);
        publishers.spawn(async move {
            let mut k = j;
            while k < total {
                let offset = Duration::from_secs_f64(k as f64 / rate);
                let due = publish_start + offset;
                tokio::time::sleep_until(due.into()).await;
                let c = (k % channels) as usize;
                // The scheduled time, not now: if this publisher is behind,
                // the wait is part of what a subscriber experiences.
                let stamp = publish_start_us + offset.as_micros() as u64;
                let late = Instant::now().saturating_duration_since(due);
                s.publish_lag.record_duration(j as usize, late);
                s.publishes_sent.fetch_add(1, Relaxed);
                s.last_send_us
                    .fetch_max((offset + late).as_micros() as u64, Relaxed);
                let data = bench_data(stamp, MsgId { sender: j, seq: k });
                let t0 = Instant::now();
                match publisher.publish(&channel_name(c), EVENT, &data).await {
                    Ok(()) => {
                        s.publish_duration.record_duration(j as usize, t0.elapsed());
                        s.accepted[c].fetch_add(1, Relaxed);
                        s.accepted_ids[c].lock().unwrap().insert(k / channels);
                        s.live.sent.fetch_add(1, Relaxed);
                    }
                    Err(e) => {
                        if s.publish_errors.fetch_add(1, Relaxed) == 0 {
                            *s.first_publish_error.lock().unwrap() = Some(e.explain(&target));
                        }
                    }
                }
                k += step;
            }
        });
    }
    while publishers.join_next().await.is_some() {}
    let publish_seconds = publish_start.elapsed().as_secs_f64();

    // Phase 3: wait for outstanding deliveries, then disconnect.
    let expected_of = |c: usize| s.accepted[c].load(Relaxed) * s.subscribed[c].load(Relaxed);
    let expected: u64 = (0..p.channels).map(expected_of).sum();
    let drain_until = Instant::now() + p.drain;
    while Instant::now() < drain_until {
        let got: u64 = s.received.iter().map(|r| r.load(Relaxed)).sum();
        if got >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop_tx.send(true);
    // Each subscriber's ids against the publishes the server accepted.
    let mut per_channel = vec![Deliveries::default(); p.channels];
    while let Some(r) = subscribers.join_next().await {
        let Ok(Some((c, got))) = r else { continue };
        let accepted = s.accepted_ids[c].lock().unwrap();
        let expected_here = got.set.intersection_len(&accepted);
        let d = &mut per_channel[c];
        d.received += expected_here;
        d.duplicated += got.duplicates;
        d.unexpected += got.unexpected + (got.set.len() - expected_here);
    }
    for (c, d) in per_channel.iter_mut().enumerate() {
        d.expected = expected_of(c);
    }
    let mut total = Deliveries::default();
    for d in &per_channel {
        total.add(*d);
    }
    report.timeline = monitor.finish().await;
    report.seconds = publish_seconds;

    let accepted: u64 = s.accepted.iter().map(|a| a.load(Relaxed)).sum();
    let confirmed: u64 = s.subscribed.iter().map(|a| a.load(Relaxed)).sum();
    report.counter("ws_sessions", p.subscribers as u64);
    report.rate("ws_subscribe_success", confirmed, p.subscribers as u64);
    report.trend("ws_session_setup", s.connecting.total());
    report.value("all_subscribed_after", Some(subscribe_seconds), "s");
    report.counter("http_publishes", accepted);
    report.counter("http_publish_errors", s.publish_errors.load(Relaxed));
    // Publishes sent per second, over the time from the start to the last
    // send plus one interval: exactly the asked rate when on schedule.
    let sent = s.publishes_sent.load(Relaxed);
    let span = s.last_send_us.load(Relaxed) as f64 / 1e6 + 1.0 / p.rate;
    let achieved = sent as f64 / span;
    report.value("http_publish_rate_asked", Some(p.rate), "/s");
    report.value("http_publish_rate_achieved", Some(achieved), "/s");
    report.trend("http_publish_duration", s.publish_duration.total());
    let lag = s.publish_lag.total();
    if sent > 0 && achieved < p.rate * RATE_TOLERANCE {
        report.notes.push(format!(
            "publishers fell behind: {achieved:.1} publishes/s achieved of {} asked \
             (publish_lag max {:.1} ms); message_latency counts from each publish's \
             scheduled time, so it includes that lag. Use more --publishers or a lower --rate \
             to measure the server rather than the publishers.",
            p.rate,
            lag.max() as f64 / 1000.0,
        ));
    }
    report.trend("publish_lag", lag);
    report.counter("ws_msgs_received", s.live.received.load(Relaxed));
    report.deliveries(&total);
    for (c, d) in per_channel.iter().enumerate() {
        report.rate(
            &format!("delivery_success{{channel:{}}}", channel_name(c)),
            d.received,
            d.expected,
        );
    }
    report.trend("message_latency", s.latency.total());
    report.counter("connections_dropped_by_server", s.dropped.load(Relaxed));
    report.errors(&s.live);
    if let Some(e) = s.first_publish_error.lock().unwrap().take() {
        report.notes.push(format!("first publish error: {e}"));
    }
    if total.lost() > 0 {
        report.notes.push(format!(
            "{} of {} expected deliveries did not arrive within {:?} after the last publish",
            total.lost(),
            total.expected,
            p.drain
        ));
    }
    cpu.finish(&mut report);
    super::server_memory(&mut report, p.server_pid);
    Ok(report)
}
