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
//! With several nodes, each channel's publishes go round the nodes
//! ([`publish_node`]), so every channel is published through every node
//! and a loss between nodes shows whichever node a subscriber is on.
//!
//! With `--fault-cmd` the bench runs an operator's command in the middle
//! of publishing (kill a broker server, a node) and reports what it cost
//! ([`super::fault`]); a subscriber whose connection drops then comes back
//! as pusher-js would (1 s later, to another node), keeping its ledger, so
//! what it missed meanwhile counts as lost and its return ends the window.
//!
//! Subscribers and publishers speak Pusher or, with `--protocol
//! appsync-graphql` or `appsync-events`, one of the AppSync APIs
//! ([`PROTOCOLS`]; see [`super::appsync`]).

use super::appsync;
use super::client::{padded_data, Conn};
use super::fault::{self, Fault};
use super::ledger::{Deliveries, MsgId, Receipt, Seen, SeqSet};
use super::metrics::{Latency, Live, Monitor};
use super::proto::{Broadcast, Proto, Publisher};
use super::shard::{self, Shard};
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
    /// Nodes of a cluster (several `--url`s): publisher j publishes
    /// through node j mod n, and subscribers spread over them round-robin
    /// unless `subscriber_targets` says otherwise. Empty: `target`.
    pub nodes: Vec<Target>,
    /// This process's part of a `--processes` run (None: all of it).
    /// Subscriber i and publisher j are child (i mod N)'s and (j mod N)'s;
    /// after publishing the children exchange the publishes that failed,
    /// so each knows every publish its subscribers were owed.
    pub shard: Option<Shard>,
    /// A fault to run in the middle of publishing, and report on.
    pub fault: Option<Fault>,
    /// Pad each event's data to about this many bytes of JSON
    /// ([`super::client::padded_data`]); 0: the bare ids.
    pub payload_bytes: usize,
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
            nodes: Vec::new(),
            shard: None,
            fault: None,
            payload_bytes: 0,
        }
    }
}

/// The note when publishers could not keep the asked rate (None when they
/// did): the latencies then measure the publishers' backlog too.
pub fn behind(sent: u64, achieved: f64, asked: f64, lag_max_ms: f64) -> Option<String> {
    (sent > 0 && achieved < asked * RATE_TOLERANCE).then(|| {
        format!(
            "publishers fell behind: {achieved:.1} publishes/s achieved of {asked} asked \
             (publish_lag max {lag_max_ms:.1} ms); message_latency counts from each publish's \
             scheduled time, so it includes that lag. Use more --publishers or a lower --rate \
             to measure the server rather than the publishers."
        )
    })
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
    /// Publish numbers k that failed (the others were accepted).
    failed: std::sync::Mutex<Vec<u64>>,
    first_publish_error: std::sync::Mutex<Option<String>>,
    dropped: AtomicU64,
    /// Subscribers that came back after a drop (with a fault only).
    reconnected: AtomicU64,
}

/// The node publish k goes through, over n nodes: k is channel k mod C's
/// (k div C)-th publish, and a channel's publishes go round the nodes from
/// its own first one. Whatever C and n (a rotation by publisher would stay
/// on one node per channel when n divides C / P, and with n dividing C a
/// channel's subscribers may all be on that node: no broker in the way).
pub fn publish_node(k: u64, channels: u64, n: usize) -> usize {
    ((k % channels + k / channels) % n.max(1) as u64) as usize
}

/// A dropped subscriber's return, as pusher-js does it: 1 s after the
/// drop, to another node (spread by subscriber, the next on each failed
/// attempt), subscribing to its channel again; None once `stop` says the
/// run is over. Each failed attempt waits 1 s more.
#[allow(clippy::too_many_arguments)]
async fn rejoin(
    protocol: Proto,
    targets: &[Target],
    i: usize,
    lost: usize,
    name: &str,
    timeout: Duration,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    s: &Shared,
) -> Option<(Conn, usize)> {
    for attempt in 0.. {
        let wait = super::worst::pusher_js_retry_delay(None).unwrap_or(Duration::from_secs(1));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return None,
        }
        let node = super::rolling::next_node(targets.len(), i, lost, attempt);
        let target = &targets[node % targets.len()];
        let tried = async {
            let mut conn = protocol.open(target, target.source_for(i), timeout).await?;
            protocol
                .subscribe_one(&mut conn, target, name, timeout)
                .await?;
            Ok::<_, super::client::ClientError>(conn)
        };
        let tried = tokio::select! {
            r = tried => r,
            _ = stop.changed() => return None,
        };
        match tried {
            Ok(conn) => return Some((conn, node)),
            Err(e) => s.live.error(e.kind(), e.explain(target)),
        }
    }
    None
}

pub async fn run(p: &FanoutParams) -> Result<Report, BenchError> {
    p.protocol.check("fanout", PROTOCOLS)?;
    if p.channels == 0 || p.publishers == 0 || p.rate <= 0.0 {
        return super::err("fanout needs at least one channel, one publisher and a positive rate");
    }
    let mut report = Report::new("fanout");
    report.param("url", &p.target.url);
    if p.nodes.len() > 1 {
        let urls: Vec<&str> = p.nodes.iter().map(|t| t.url.as_str()).collect();
        report.param("publisher urls", urls.join(","));
    }
    let subscriber_targets = match (p.subscriber_targets.is_empty(), p.nodes.len()) {
        (true, 2..) => &p.nodes,
        _ => &p.subscriber_targets,
    };
    if !subscriber_targets.is_empty() {
        let urls: Vec<&str> = subscriber_targets.iter().map(|t| t.url.as_str()).collect();
        report.param("subscriber urls", urls.join(","));
    }
    report.param("subscribers", p.subscribers);
    report.param("channels", p.channels);
    report.param("publishers", p.publishers);
    report.param("rate", format!("{}/s", p.rate));
    report.param("duration", format!("{:?}", p.duration));
    report.param("protocol", p.protocol.name());
    if p.payload_bytes > 0 {
        report.param("payload bytes", p.payload_bytes);
    }
    if super::wire::deflate_offered() {
        report.param("permessage-deflate", "offered");
    }
    if let Some(f) = &p.fault {
        if f.at >= p.duration {
            return super::err(format!(
                "--fault-at {:?} is not within the publishing time (--duration {:?})",
                f.at, p.duration
            ));
        }
        report.param("fault command", &f.command);
        report.param("fault at", format!("{:?}", f.at));
    }
    let owned_subscribers = shard::share(p.shard, p.subscribers);
    let owned_publishers = shard::share(p.shard, p.publishers);
    if let Some(w) = raise_nofile(owned_subscribers as u64 + owned_publishers as u64) {
        eprintln!("herald bench: {w}");
        report.notes.push(w);
    }
    let mut checked: Vec<&str> = Vec::new();
    for target in std::iter::once(&p.target)
        .chain(&p.nodes)
        .chain(subscriber_targets)
    {
        if checked.contains(&target.url.as_str()) {
            continue;
        }
        checked.push(&target.url);
        match p.protocol {
            Proto::Pusher => preflight(target, None, true).await?,
            other => appsync::preflight(target, other)
                .await
                .map_err(|e| super::BenchError(e.explain(target)))?,
        }
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
        failed: Default::default(),
        first_publish_error: Default::default(),
        dropped: AtomicU64::new(0),
        reconnected: AtomicU64::new(0),
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
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(owned_subscribers.max(1));
    let mut subscribers = tokio::task::JoinSet::new();
    let (channels, publishers) = (p.channels as u64, p.publishers as u64);
    // Where a dropped subscriber may return (with a fault only).
    let rejoin_targets: Option<Arc<Vec<Target>>> = p.fault.as_ref().map(|_| {
        Arc::new(match subscriber_targets.len() {
            0 => vec![p.target.clone()],
            _ => subscriber_targets.clone(),
        })
    });
    for i in (0..p.subscribers).filter(|&i| shard::owns(p.shard, i)) {
        let c = i % p.channels;
        let target = super::node(&p.target, subscriber_targets, i).clone();
        let node = i % subscriber_targets.len().max(1);
        let (s, timeout, protocol) = (s.clone(), p.timeout, p.protocol);
        let (gate, mut stop, ready) = (gate.clone(), stop_rx.clone(), ready_tx.clone());
        let rejoin_targets = rejoin_targets.clone();
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
            // The node this subscriber is on now (it started on `node`).
            let mut on = node;
            let mut target = target;
            loop {
                let failed = loop {
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
                            Err(e) => break Some(e),
                        },
                        _ = stop.changed() => break None,
                    }
                };
                let Some(e) = failed else { break };
                s.dropped.fetch_add(1, Relaxed);
                s.live.error(e.kind(), e.explain(&target));
                s.live.connections.fetch_sub(1, Relaxed);
                let Some(targets) = &rejoin_targets else {
                    return Some((c, node, got));
                };
                match rejoin(protocol, targets, i, on, &name, timeout, &mut stop, &s).await {
                    Some((back, now_on)) => {
                        (conn, on, target) = (back, now_on, targets[now_on].clone());
                        s.reconnected.fetch_add(1, Relaxed);
                        s.live.connections.fetch_add(1, Relaxed);
                    }
                    None => return Some((c, node, got)),
                }
            }
            conn.close().await;
            s.live.connections.fetch_sub(1, Relaxed);
            Some((c, node, got))
        });
    }
    drop(ready_tx);
    for _ in 0..owned_subscribers {
        if ready_rx.recv().await.is_none() {
            break;
        }
    }
    let subscribe_seconds = started.elapsed().as_secs_f64();
    // Every process's subscribers are in before anyone publishes.
    shard::sync(p.shard, "subscribed", serde_json::Value::Null).await?;

    // Phase 2: publishers on a fixed schedule; publish k goes to channel k % C.
    let nodes = match p.nodes.len() {
        0 => std::slice::from_ref(&p.target),
        _ => &p.nodes[..],
    };
    let node_publishers: Vec<Publisher> = nodes
        .iter()
        .map(|t| Publisher::new(p.protocol, t, &Broadcast::default()))
        .collect();
    // The schedule on both clocks: `Instant` to sleep on, the bench clock
    // for the stamps receivers subtract from.
    let wire_bytes_before = super::wire::bytes_read();
    let publish_start = Instant::now();
    let publish_start_us = now_us();
    let total = (p.rate * p.duration.as_secs_f64()).round() as u64;
    let mut publishers = tokio::task::JoinSet::new();
    for j in (0..p.publishers as u64).filter(|&j| shard::owns(p.shard, j as usize)) {
        let node_publishers = node_publishers.clone();
        let nodes = nodes.to_vec();
        let s = s.clone();
        let (step, rate, channels) = (p.publishers as u64, p.rate, p.channels as u64);
        let payload_bytes = p.payload_bytes;
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
                let data = padded_data(stamp, MsgId { sender: j, seq: k }, payload_bytes);
                let node = publish_node(k, channels, nodes.len());
                let (publisher, target) = (&node_publishers[node], &nodes[node]);
                let t0 = Instant::now();
                match publisher.publish(&channel_name(c), EVENT, &data).await {
                    Ok(()) => {
                        s.publish_duration.record_duration(j as usize, t0.elapsed());
                        s.accepted[c].fetch_add(1, Relaxed);
                        s.accepted_ids[c].lock().unwrap().insert(k / channels);
                        s.live.sent.fetch_add(1, Relaxed);
                    }
                    Err(e) => {
                        s.failed.lock().unwrap().push(k);
                        if s.publish_errors.fetch_add(1, Relaxed) == 0 {
                            *s.first_publish_error.lock().unwrap() = Some(e.explain(target));
                        }
                    }
                }
                k += step;
            }
        });
    }
    // The fault, at its time after the first scheduled publish.
    let fault_run = p.fault.clone().map(|f| {
        tokio::spawn(async move {
            tokio::time::sleep_until((publish_start + f.at).into()).await;
            fault::shell(&f.command, f.timeout).await
        })
    });
    while publishers.join_next().await.is_some() {}
    let publish_seconds = publish_start.elapsed().as_secs_f64();
    // This process's accepted publishes, for `http_publishes`.
    let accepted_here: u64 = s.accepted.iter().map(|a| a.load(Relaxed)).sum();
    if p.shard.is_some() {
        // Every publish k < total was made by some process; the ones none
        // of them saw fail were accepted, and are owed to every subscriber
        // of their channel here.
        let failed = s.failed.lock().unwrap().clone();
        let all = shard::sync(p.shard, "published", serde_json::json!(failed)).await?;
        let failed: std::collections::HashSet<u64> = all
            .iter()
            .filter_map(|v| v.as_array())
            .flatten()
            .filter_map(|k| k.as_u64())
            .collect();
        for (c, a) in s.accepted.iter().enumerate() {
            let mut ids = s.accepted_ids[c].lock().unwrap();
            *ids = Default::default();
            let mut n = 0;
            for k in (c as u64..total).step_by(p.channels) {
                if !failed.contains(&k) {
                    ids.insert(k / channels);
                    n += 1;
                }
            }
            a.store(n, Relaxed);
        }
    }

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
    // What the subscribers read off the wire while publishes were
    // delivered (compressed, with --deflate).
    let wire_bytes = super::wire::bytes_read() - wire_bytes_before;
    let _ = stop_tx.send(true);
    // Each subscriber's ids against the publishes the server accepted.
    let mut per_channel = vec![Deliveries::default(); p.channels];
    // Deliveries received through each node (several nodes only), for
    // each node's CPU per delivery.
    let mut per_node = vec![0u64; subscriber_targets.len()];
    // With a fault: who missed which publish, for its window.
    let mut outcomes = p.fault.as_ref().map(|_| {
        let mut o = fault::Outcomes::new(p.rate, total as usize, subscriber_targets.len());
        for k in 0..total {
            o.publish_node[k as usize] = publish_node(k, channels, nodes.len());
            let c = (k % channels) as usize;
            o.accepted[k as usize] = s.accepted_ids[c].lock().unwrap().contains(k / channels);
        }
        o
    });
    while let Some(r) = subscribers.join_next().await {
        let Ok(Some((c, node, got))) = r else {
            continue;
        };
        let accepted = s.accepted_ids[c].lock().unwrap();
        if let Some(o) = &mut outcomes {
            let on = node % o.missed.len();
            let missed = &mut o.missed[on];
            for k in (c as u64..total).step_by(p.channels) {
                let m = k / channels;
                if accepted.contains(m) && !got.set.contains(m) {
                    missed[k as usize] += 1;
                }
            }
        }
        let expected_here = got.set.intersection_len(&accepted);
        if let Some(n) = per_node.get_mut(node) {
            *n += expected_here;
        }
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
    let fault_ran = match fault_run {
        Some(run) => Some(
            run.await
                .unwrap_or_else(|e| Err(format!("the fault command's task failed: {e}"))),
        ),
        None => None,
    };

    let confirmed: u64 = s.subscribed.iter().map(|a| a.load(Relaxed)).sum();
    report.counter("ws_sessions", owned_subscribers as u64);
    report.rate("ws_subscribe_success", confirmed, owned_subscribers as u64);
    report.trend("ws_session_setup", s.connecting.total());
    report.value("all_subscribed_after", Some(subscribe_seconds), "s");
    report.counter("http_publishes", accepted_here);
    report.counter("http_publish_errors", s.publish_errors.load(Relaxed));
    // Publishes sent per second, over the time from the start to the last
    // send plus one interval: exactly the asked rate when on schedule.
    let sent = s.publishes_sent.load(Relaxed);
    let span = s.last_send_us.load(Relaxed) as f64 / 1e6 + 1.0 / p.rate;
    let achieved = sent as f64 / span;
    // A process of a `--processes` run is asked for its publishers' share
    // (the merged report sums the shares).
    let asked = p.rate * owned_publishers as f64 / p.publishers as f64;
    report.value("http_publish_rate_asked", Some(asked), "/s");
    report.value("http_publish_rate_achieved", Some(achieved), "/s");
    report.trend("http_publish_duration", s.publish_duration.total());
    let lag = s.publish_lag.total();
    // A process of a `--processes` run leaves the judgement to the merged
    // report (its own share's schedule ends a publish interval early).
    if p.shard.is_none() {
        if let Some(note) = behind(sent, achieved, asked, lag.max() as f64 / 1000.0) {
            report.notes.push(note);
        }
    }
    report.trend("publish_lag", lag);
    report.counter("ws_msgs_received", s.live.received.load(Relaxed));
    report.deliveries(&total);
    report.counter("ws_bytes_received", wire_bytes);
    if total.received > 0 {
        report.value(
            "ws_bytes_per_delivery",
            Some(wire_bytes as f64 / total.received as f64),
            "B",
        );
    }
    if per_node.len() > 1 {
        for (k, n) in per_node.iter().enumerate() {
            report.counter(&format!("deliveries_received{{node:{k}}}"), *n);
        }
    }
    for (c, d) in per_channel.iter().enumerate() {
        report.rate(
            &format!("delivery_success{{channel:{}}}", channel_name(c)),
            d.received,
            d.expected,
        );
    }
    report.trend("message_latency", s.latency.total());
    report.counter("connections_dropped_by_server", s.dropped.load(Relaxed));
    if let (Some(f), Some(ran), Some(o)) = (&p.fault, &fault_ran, &outcomes) {
        let w = fault::analyse(o, f.at, nodes.len());
        fault::write(&mut report, f, ran, &w, s.reconnected.load(Relaxed));
    }
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

#[cfg(test)]
mod tests {
    use super::publish_node;

    #[test]
    fn each_channel_is_published_through_every_node() {
        // Channel c's publishes are k = c, c + C, c + 2C, ...; each goes
        // through all n nodes in turn, whether n divides C or not.
        for (channels, n) in [(10u64, 3usize), (30, 3), (100, 3), (4, 2), (7, 7)] {
            for c in 0..channels {
                let nodes: Vec<usize> = (0..n as u64)
                    .map(|r| publish_node(c + channels * r, channels, n))
                    .collect();
                let mut sorted = nodes.clone();
                sorted.sort();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "C {channels} c {c}");
            }
        }
        assert_eq!(publish_node(7, 3, 1), 0);
    }
}
