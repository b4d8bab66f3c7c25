//! `storm`: a reconnect storm and a mass disconnect.
//!
//! N clients connect and subscribe, a third each to public, private and
//! presence channels (presence channels of `presence_size` members each).
//! Then:
//!
//! (a) **storm**: every client drops its connection at the same moment and
//!     reconnects the way pusher-js does: 1 s after a plain close (there is
//!     no random jitter in pusher-js: clients that lost their connection
//!     together come back together; `--jitter` spreads them if wanted),
//!     each attempt given 15 s, doubling to 60 s, 1 s apart. Reported: the
//!     time until every client is back and subscribed, the share that made
//!     it, and, once all are back, each presence channel's member count as
//!     the HTTP API reports it against the members the bench has there.
//!     With `--rate`, publishers keep publishing to the clients' channels
//!     from the moment everyone is subscribed, through the drop, until a
//!     little after everyone is back, and each returning client reports
//!     the messages it missed, got twice or out of order across its gap
//!     ([`super::gap`]).
//! (b) **mass disconnect**: a stream of new clients starts connecting
//!     (`--newcomer-rate` per second); a second later all N clients drop
//!     at once and the stream goes on for `--window`. Reported: the connect
//!     latency (TCP connect to `pusher:connection_established`) and the
//!     setup latency (to a confirmed subscription) of the new clients that
//!     started after the drop: p50, p99, max.
//!
//! Finally everyone has left: the server's open descriptors and its
//! `herald_connections` gauge must be back to their values before the
//! first client connected, exactly.
//!
//! `--protocol actioncable`, `appsync-graphql` and `appsync-events` run
//! the same storm over those protocols ([`Proto`]): the clients subscribe
//! to plain bench channels only (`storm-{i mod channels}`: a
//! `BenchmarkChannel` subscription with that `id` over Action Cable, a
//! subscription to that channel over AppSync), since neither protocol
//! has private or presence channels; the presence check is skipped and
//! the report says so. The reconnects follow each protocol's reference
//! client ([`Reconnect`]): @rails/actioncable's `ConnectionMonitor`
//! reopens at its first poll tick once the connection is stale (no
//! message for 6 s) and the close is 6 s old, so clients come back 6 to
//! 18 s after the drop, spread by their poll timers; Amplify reconnects
//! 5 s after the drop, all together, with a jittered exponential retry
//! (0.2 s, 0.4 s, ... under 5 s, then every minute). `--jitter` adds a
//! uniform spread to the first attempt for every protocol.
//!
//! `--node-url` spreads the clients over a cluster's nodes and
//! `--restart-cmd` replaces the drop with a rolling restart of those
//! nodes, one at a time, each node's clients reconnecting to the others
//! ([`super::rolling`]); the ledger counts across every gap a client had.
//!
//! (About 950 lines: the storm, its rolling variant, the ledger hooks of
//! its clients and the mass disconnect share one `Shared` and one client
//! task; the nodes, the publishers' routing and the restarts themselves
//! are in `rolling.rs`.)
//!
//! `--protocol actioncable-ext` speaks AnyCable's extended protocol
//! (`actioncable-v1-ext-json`) and comes back as `@anycable/core` does
//! ([`super::actioncable_ext`]): 1.5 to 9 s after the drop, restoring its
//! session with its `sid` and asking for history from its last position
//! (or, when the server starts a new session, subscribing with that
//! history). The report counts restored and fresh sessions, history
//! confirmed and rejected, and, when the app is `herald bench
//! rpc-server`, the `Connect` calls the reconnects cost.

use super::actioncable::{self, type_of};
use super::actioncable_ext::{self as ext, Resume};
use super::client::{ClientError, Conn};
use super::gap::{self, Publishing, Track};
use super::metrics::{Latency, Live, Monitor};
use super::proto::{Broadcast, Proto, Publisher, Reconnect};
use super::rolling::{self, Nodes, Publishers, Restart};
use super::worst::{self, Api, Metrics};
use super::{preflight, raise_nofile, BenchError, CpuMeter, Report, Rng, Target};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

#[derive(Debug, Clone)]
pub struct StormParams {
    pub target: Target,
    /// The protocol the clients speak (only Pusher has private and
    /// presence channels).
    pub protocol: Proto,
    pub clients: usize,
    /// Public and private channels the clients are spread over.
    pub channels: usize,
    /// Members per presence channel (at most the server's limit, 100 by
    /// default on Herald and Pusher).
    pub presence_size: usize,
    /// Clients connecting at once in the first, orderly connect.
    pub concurrency: usize,
    /// Spread the reconnects uniformly over this much after pusher-js's
    /// 1 s (0: all at once, as pusher-js does).
    pub jitter: Duration,
    /// A reconnecting client gives up after this long.
    pub give_up: Duration,
    /// New clients per second during the mass disconnect.
    pub newcomer_rate: f64,
    /// How long new clients keep coming after the mass disconnect.
    pub window: Duration,
    /// Longest wait for descriptors and gauge to come back at the end.
    pub settle: Duration,
    /// Publishes per second, all channels together, kept up through the
    /// drop (0: none, no delivery ledger).
    pub rate: f64,
    /// Where Action Cable publishes go.
    pub broadcast: Broadcast,
    pub metrics_url: Option<String>,
    pub timeout: Duration,
    pub progress: bool,
    pub server_pid: Option<u32>,
    /// Every node of a cluster, `target` among them (empty: `target`
    /// alone): clients spread round-robin, reconnecting to another node.
    pub nodes: Vec<Target>,
    /// Restart the nodes in turn instead of dropping every client at once.
    pub restart: Option<Restart>,
}

impl StormParams {
    pub fn new(target: Target) -> StormParams {
        StormParams {
            target,
            protocol: Proto::Pusher,
            clients: 15_000,
            channels: 100,
            presence_size: 50,
            concurrency: 256,
            jitter: Duration::ZERO,
            give_up: Duration::from_secs(120),
            newcomer_rate: 200.0,
            window: Duration::from_secs(5),
            settle: Duration::from_secs(30),
            rate: 0.0,
            broadcast: Broadcast::default(),
            metrics_url: None,
            timeout: Duration::from_secs(30),
            progress: true,
            server_pid: None,
            nodes: Vec::new(),
            restart: None,
        }
    }
}

/// The channel client `i` subscribes to: over Pusher a third each
/// public, private and presence, over the others plain ones only.
pub fn channel_of(p: &StormParams, i: usize) -> String {
    if !p.protocol.has_presence() {
        return format!("storm-{}", i % p.channels.max(1));
    }
    let k = i / 3;
    match i % 3 {
        0 => format!("storm-{}", k % p.channels.max(1)),
        1 => format!("private-storm-{}", k % p.channels.max(1)),
        _ => format!("presence-storm-{}", k / p.presence_size.max(1)),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Hold,
    Storm,
    /// The nodes are being restarted in turn ([`super::rolling`]).
    Rolling,
    Leave,
}

struct Shared {
    p: StormParams,
    live: Arc<Live>,
    next_conn: AtomicUsize,
    /// Settled after the first connect: connected, failed.
    ready: AtomicUsize,
    first_failed: AtomicUsize,
    /// After the storm: back (subscribed again), gave up.
    back: AtomicUsize,
    gave_up: AtomicUsize,
    /// Connections the server closed while they were held.
    lost_while_held: AtomicU64,
    reconnect_attempts: AtomicU64,
    storm_started: Mutex<Option<Instant>>,
    /// Time from the drop to subscribed again, per client.
    back_after: Latency,
    /// Presence clients subscribed now, per channel.
    presence_members: Mutex<BTreeMap<String, usize>>,
    newcomer_connect: Latency,
    newcomer_setup: Latency,
    newcomers: AtomicU64,
    newcomers_ok: AtomicU64,
    /// The delivery ledger is on (`--rate`).
    ledger: bool,
    /// Each client's channel, as an index into the publishers' channels.
    chan: Vec<usize>,
    tracks: Vec<Mutex<Track>>,
    publishing: Arc<Publishing>,
    /// Extended protocol: reconnects restored, or given a new session.
    restored: AtomicU64,
    fresh: AtomicU64,
    history_confirmed: AtomicU64,
    history_rejected: AtomicU64,
    /// The nodes the clients connect to, and how many each holds.
    nodes: Arc<Nodes>,
    /// A rolling restart instead of the storm's drop.
    rolling: bool,
    /// Clients that lost their connection and are not back (nor gave up).
    away: AtomicUsize,
}

/// The distinct channels of the clients, in order, and each client's
/// index among them.
fn channels(p: &StormParams) -> (Vec<String>, Vec<usize>) {
    let (mut names, mut index, mut of) = (Vec::new(), HashMap::new(), Vec::new());
    for i in 0..p.clients {
        let name = channel_of(p, i);
        let next = names.len();
        let c = *index.entry(name.clone()).or_insert(next);
        if c == next {
            names.push(name);
        }
        of.push(c);
    }
    (names, of)
}

async fn open_and_subscribe(
    s: &Shared,
    node: usize,
    channel: &str,
    user: &str,
    timeout: Duration,
) -> Result<Conn, ClientError> {
    let t = s.nodes.target(node);
    let proto = s.p.protocol;
    let id = s.next_conn.fetch_add(1, Relaxed);
    let mut conn = proto.open(t, t.source_for(id), timeout).await?;
    proto
        .subscribe(&mut conn, t, &[channel], user, timeout)
        .await?;
    Ok(conn)
}

/// The first connect: over the extended protocol, keeping the `sid`.
async fn first_connect(
    s: &Shared,
    node: usize,
    channel: &str,
    user: &str,
    resume: &mut Option<Resume>,
) -> Result<Conn, ClientError> {
    let p = &s.p;
    if p.protocol != Proto::ActionCableExt {
        return open_and_subscribe(s, node, channel, user, p.timeout).await;
    }
    let t = s.nodes.target(node);
    let id = s.next_conn.fetch_add(1, Relaxed);
    let (mut conn, _) = ext::open(t, t.source_for(id), "", p.timeout).await?;
    *resume = Some(Resume::new(conn.socket_id.clone()));
    p.protocol
        .subscribe(&mut conn, t, &[channel], user, p.timeout)
        .await?;
    Ok(conn)
}

/// A reconnect: over the extended protocol, restore the session and ask
/// for what was missed, as `@anycable/core` does; else as the first time.
async fn reopen(
    s: &Shared,
    node: usize,
    channel: &str,
    user: &str,
    timeout: Duration,
    resume: &mut Option<Resume>,
) -> Result<Conn, ClientError> {
    let Some(r) = resume else {
        return open_and_subscribe(s, node, channel, user, timeout).await;
    };
    let t = s.nodes.target(node);
    let id = s.next_conn.fetch_add(1, Relaxed);
    let (mut conn, welcome) = ext::open(t, t.source_for(id), &r.sid, timeout).await?;
    r.sid = conn.socket_id.clone();
    let identifier = actioncable::identifier_for(channel);
    let history = r.history(&[actioncable::stream_of(channel)]);
    let restored = ext::catch_up(&mut conn, welcome, &identifier, &history, timeout).await?;
    let n = if restored { &s.restored } else { &s.fresh };
    n.fetch_add(1, Relaxed);
    Ok(conn)
}

/// A frame for client `i`: its position kept, its message in the ledger.
fn observe(s: &Shared, i: usize, text: &str, resume: &mut Option<Resume>) {
    if let Some(r) = resume {
        r.observe(text);
        match type_of(text) {
            Some("confirm_history") => {
                s.history_confirmed.fetch_add(1, Relaxed);
            }
            Some("reject_history") => {
                s.history_rejected.fetch_add(1, Relaxed);
            }
            _ => {}
        }
    }
    if s.ledger {
        if let Some(id) = s.p.protocol.scan(text, gap::EVENT).id {
            s.tracks[i].lock().unwrap().record(s.chan[i], id);
        }
    }
}

/// Hold a connection (answering pings) until the phase changes; false if
/// the server closed it meanwhile. Every frame is recorded with `reconnect`
/// (Action Cable's monitor counts staleness from the last one) and
/// [`observe`]d.
async fn hold(
    s: &Shared,
    i: usize,
    conn: &mut Conn,
    phase: &mut watch::Receiver<Phase>,
    reconnect: &mut Reconnect,
    resume: &mut Option<Resume>,
) -> bool {
    loop {
        tokio::select! {
            r = s.p.protocol.recv(conn) => match r {
                Ok(text) => {
                    reconnect.message(Instant::now());
                    observe(s, i, &text, resume);
                }
                Err(_) => return false,
            },
            _ = phase.changed() => return true,
        }
    }
}

fn presence_delta(s: &Shared, channel: &str, d: isize) {
    if channel.starts_with("presence-") {
        let mut m = s.presence_members.lock().unwrap();
        let n = m.entry(channel.to_string()).or_default();
        *n = n.saturating_add_signed(d);
    }
}

async fn member(
    s: Arc<Shared>,
    i: usize,
    gate: Arc<tokio::sync::Semaphore>,
    mut phase: watch::Receiver<Phase>,
) {
    let p = &s.p;
    let channel = channel_of(p, i);
    let user = format!("storm-user-{i}");
    let mut reconnect = Reconnect::new(p.protocol, Instant::now(), Rng::new(i as u64 + 1_000_003));
    let mut resume = None;
    let mut node = s.nodes.first_for(i);
    let first = {
        let _permit = gate.acquire().await;
        first_connect(&s, node, &channel, &user, &mut resume).await
    };
    let mut conn = match first {
        Ok(c) => c,
        Err(e) => {
            s.live
                .error(e.kind(), p.protocol.explain(&e, s.nodes.target(node)));
            s.first_failed.fetch_add(1, Relaxed);
            return;
        }
    };
    reconnect.connected(Instant::now());
    s.nodes.joined(node);
    s.live.connections.fetch_add(1, Relaxed);
    presence_delta(&s, &channel, 1);
    s.tracks[i].lock().unwrap().active = true;
    s.ready.fetch_add(1, Relaxed);
    let mut rng = Rng::new(i as u64 + 7);
    let mut returns = 0;
    loop {
        // Hold until the storm, the end, or (rolling restart) the loss of
        // this client's node; the restart beginning is no reason to drop.
        let held = loop {
            let held = hold(&s, i, &mut conn, &mut phase, &mut reconnect, &mut resume).await;
            if !(held && *phase.borrow() == Phase::Rolling) {
                break held;
            }
        };
        let at = *phase.borrow();
        if !held && at != Phase::Rolling {
            s.lost_while_held.fetch_add(1, Relaxed);
        }
        // Only the rolling restart moves a client more than once. Away
        // before it leaves its node, so the restart never sees neither.
        let again = !(at == Phase::Leave || (returns > 0 && !s.rolling));
        if again {
            s.away.fetch_add(1, Relaxed);
        }
        // The storm's drop closes the socket without a WebSocket close, as
        // when a network goes away under the clients.
        drop(conn);
        s.nodes.left(node);
        s.live.connections.fetch_sub(1, Relaxed);
        presence_delta(&s, &channel, -1);
        if !again {
            return;
        }
        s.tracks[i]
            .lock()
            .unwrap()
            .left(s.publishing.published(s.chan[i]));
        let started = match s.rolling {
            true => Instant::now(),
            false => s.storm_started.lock().unwrap().unwrap_or_else(Instant::now),
        };
        let first = reconnect.dropped(Instant::now()) + p.jitter.mul_f64(rng.next_f64());
        tokio::time::sleep_until(first.into()).await;
        let lost = node;
        let mut attempt = 0;
        conn = loop {
            node = s.nodes.next_for(i, lost, attempt);
            attempt += 1;
            s.reconnect_attempts.fetch_add(1, Relaxed);
            let limit = reconnect.attempt_timeout(p.timeout);
            match reopen(&s, node, &channel, &user, limit, &mut resume).await {
                Ok(c) => break c,
                Err(e) => {
                    s.live
                        .error(e.kind(), p.protocol.explain(&e, s.nodes.target(node)));
                    let next = reconnect.failed(Instant::now(), &e);
                    let Some(next) = next.filter(|_| started.elapsed() < p.give_up) else {
                        s.gave_up.fetch_add(1, Relaxed);
                        s.away.fetch_sub(1, Relaxed);
                        return;
                    };
                    tokio::time::sleep_until(next.into()).await;
                }
            }
        };
        reconnect.connected(Instant::now());
        s.back_after.record_duration(i, started.elapsed());
        s.nodes.joined(node);
        s.live.connections.fetch_add(1, Relaxed);
        presence_delta(&s, &channel, 1);
        s.tracks[i]
            .lock()
            .unwrap()
            .back(s.publishing.published(s.chan[i]));
        if returns == 0 {
            s.back.fetch_add(1, Relaxed);
        }
        returns += 1;
        s.away.fetch_sub(1, Relaxed);
    }
}

/// New clients at the asked rate for `length`; those started after
/// `*disconnect_at` is set are the ones measured.
async fn newcomers(s: Arc<Shared>, length: Duration, disconnect_at: Arc<Mutex<Option<Instant>>>) {
    let p = &s.p;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / p.newcomer_rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    while started.elapsed() < length {
        tick.tick().await;
        let during = disconnect_at.lock().unwrap().is_some();
        let s = s.clone();
        tasks.spawn(async move {
            let (t, proto) = (&s.p.target, s.p.protocol);
            let id = s.next_conn.fetch_add(1, Relaxed);
            if during {
                s.newcomers.fetch_add(1, Relaxed);
            }
            let t0 = Instant::now();
            let mut conn = match proto.open(t, t.source_for(id), s.p.timeout).await {
                Ok(c) => c,
                Err(e) => {
                    s.live.error(e.kind(), proto.explain(&e, t));
                    return;
                }
            };
            let connected = t0.elapsed();
            let subscribed = proto
                .subscribe(&mut conn, t, &["storm-newcomers"], "", s.p.timeout)
                .await;
            if let Err(e) = subscribed {
                s.live.error(e.kind(), proto.explain(&e, t));
                return;
            }
            if during {
                s.newcomer_connect.record_duration(id, connected);
                s.newcomer_setup.record_duration(id, t0.elapsed());
                s.newcomers_ok.fetch_add(1, Relaxed);
            }
            conn.close().await;
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// How long publishing goes on once everyone is back: 2 s, or two
/// publishes per channel when they are further apart.
fn tail(interval: Duration) -> Duration {
    (interval * 2).max(Duration::from_secs(2))
}

/// Wait until `done()` or `limit` passes; true when done.
async fn until(limit: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

pub async fn run(p: &StormParams) -> Result<Report, BenchError> {
    if p.clients == 0 || p.channels == 0 || p.presence_size == 0 || p.newcomer_rate <= 0.0 {
        return super::err(
            "storm needs at least one client, one channel, a presence size of at least one and a \
             positive --newcomer-rate",
        );
    }
    if !(p.rate >= 0.0 && p.rate.is_finite()) {
        return super::err("storm's --rate is publishes per second: 0 or more");
    }
    if p.nodes.len() > 1 && p.broadcast.url.is_some() {
        return super::err(
            "with several nodes each node's publishes go to /_broadcast on its own port; \
             --broadcast-url names one endpoint",
        );
    }
    if p.restart.is_some() && p.server_pid.is_some() {
        return super::err(
            "a rolling restart replaces the server processes: --server-pid would name one that \
             is gone",
        );
    }
    let rolling = p.restart.is_some();
    let nodes = Arc::new(Nodes::new(if p.nodes.is_empty() {
        vec![p.target.clone()]
    } else {
        p.nodes.clone()
    }));
    // One node, dropped all at once: the server's gauge and descriptors
    // tell the whole story. Over several, `--url`'s gauge is its share.
    let single = nodes.len() == 1 && !rolling;
    let proto = p.protocol;
    let ledger = p.rate > 0.0;
    let (names, chan) = channels(p);
    // One publisher per channel, one publish at a time: the tick.
    let interval = Duration::from_secs_f64(names.len() as f64 / p.rate.max(1e-9));
    let mut report = Report::new("storm");
    report.param("url", &p.target.url);
    if nodes.len() > 1 {
        report.param(
            "nodes",
            format!(
                "{}: clients round-robin, each reconnecting to another node; publishes \
                 through a node that is up",
                p.nodes
                    .iter()
                    .map(|t| t.url.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    if let Some(r) = &p.restart {
        report.param(
            "rolling_restart",
            format!(
                "SIG{} each node in turn, `{}`, waiting after each until every client is back",
                r.signal.name(),
                r.command
            ),
        );
    }
    if proto != Proto::Pusher {
        report.param("protocol", proto.name());
    }
    report.param("clients", p.clients);
    report.param(
        "channels",
        if proto.has_presence() {
            format!(
                "{} public, {} private, presence of {} members",
                p.channels, p.channels, p.presence_size
            )
        } else {
            format!(
                "{} plain (no private or presence in {})",
                p.channels,
                proto.name()
            )
        },
    );
    report.param(
        "reconnect",
        format!(
            "{}; jitter {:?}",
            match proto {
                Proto::Pusher => "pusher-js: after 1 s, attempts of 15 s doubling to 60 s",
                Proto::ActionCable =>
                    "@rails/actioncable ConnectionMonitor: at a jittered 6 s poll tick once \
                     stale (6 s without a message) and 6 s after the close",
                Proto::ActionCableExt =>
                    "@anycable/core Monitor: backoffWithJitter(3 s), 1.5 to 9 s after the \
                     close; restores its session (?sid=) and asks for history from its last \
                     positions, or subscribes with that history in a new session",
                _ =>
                    "Amplify: after 5 s, retries 2^n x 100 ms + [0, 100) ms up to 5 s, \
                      then every 60 s",
            },
            p.jitter
        ),
    );
    if !rolling {
        report.param(
            "newcomers",
            format!(
                "{}/s, {:?} after the mass disconnect",
                p.newcomer_rate, p.window
            ),
        );
    }
    if ledger {
        report.param(
            "publishing",
            format!(
                "{}/s over {} channels (one publisher each, one publish at a time, every {:?}), \
                 from everyone subscribed until {:?} after everyone is back",
                p.rate,
                names.len(),
                interval,
                tail(interval)
            ),
        );
    }
    let in_flight = (p.newcomer_rate * (p.timeout.as_secs_f64() + 1.0)) as u64;
    if let Some(w) = raise_nofile(p.clients as u64 + in_flight.min(4096) + 64) {
        eprintln!("herald bench: {w}");
        report.notes.push(w);
    }
    if let Some(limit) = p.server_pid.and_then(super::nofile_of) {
        if limit < p.clients as u64 + 64 {
            report.notes.push(format!(
                "the server's open-file limit is {limit}, below the {} connections asked for",
                p.clients
            ));
        }
    }
    // The preflight's publisher is its own, dropped before the baseline
    // is taken: a pooled HTTP connection it left open would count in the
    // server's descriptors (the run's publishers are dropped when they stop).
    match proto {
        Proto::Pusher => preflight(&p.target, None, true).await?,
        other => {
            let check = ledger.then(|| Publisher::new(proto, &p.target, &p.broadcast));
            other.preflight(&p.target, check.as_ref()).await?
        }
    }
    let publishers = Arc::new(Publishers::new(proto, nodes.clone(), &p.broadcast));
    let metrics = Metrics::new(&p.target, p.metrics_url.as_deref());
    let api = Api::new(&p.target);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let base = worst::probe(p.server_pid);
    let gauge_base = metrics.get("herald_connections").await;
    let cpu = CpuMeter::start(p.server_pid);
    let s = Arc::new(Shared {
        p: p.clone(),
        live: Arc::new(Live::default()),
        next_conn: AtomicUsize::new(0),
        ready: AtomicUsize::new(0),
        first_failed: AtomicUsize::new(0),
        back: AtomicUsize::new(0),
        gave_up: AtomicUsize::new(0),
        lost_while_held: AtomicU64::new(0),
        reconnect_attempts: AtomicU64::new(0),
        storm_started: Mutex::new(None),
        back_after: Latency::default(),
        presence_members: Mutex::new(BTreeMap::new()),
        newcomer_connect: Latency::default(),
        newcomer_setup: Latency::default(),
        newcomers: AtomicU64::new(0),
        newcomers_ok: AtomicU64::new(0),
        ledger,
        tracks: (0..p.clients).map(|_| Mutex::default()).collect(),
        chan,
        publishing: Arc::new(Publishing::new(names.len())),
        restored: AtomicU64::new(0),
        fresh: AtomicU64::new(0),
        history_confirmed: AtomicU64::new(0),
        history_rejected: AtomicU64::new(0),
        nodes: nodes.clone(),
        rolling,
        away: AtomicUsize::new(0),
    });
    let monitor = Monitor::start("storm", s.live.clone(), None, p.progress);
    let started = Instant::now();

    // Everyone connected and subscribed.
    let (phase_tx, phase_rx) = watch::channel(Phase::Hold);
    let gate = Arc::new(tokio::sync::Semaphore::new(p.concurrency.max(1)));
    let mut members = tokio::task::JoinSet::new();
    for i in 0..p.clients {
        members.spawn(member(s.clone(), i, gate.clone(), phase_rx.clone()));
    }
    let n = p.clients;
    let ok = until(p.timeout * 4 + Duration::from_secs(n as u64 / 100), || {
        s.ready.load(Relaxed) + s.first_failed.load(Relaxed) >= n
    })
    .await;
    let connected = s.ready.load(Relaxed);
    report.value(
        "connect_all_took",
        Some(started.elapsed().as_secs_f64()),
        "s",
    );
    report.rate("connected_before_storm", connected as u64, n as u64);
    if !ok {
        report
            .notes
            .push("not every client settled in the first connect".into());
    }
    let gauge_held = metrics.get("herald_connections").await;
    report.value("connections_gauge_before_storm", gauge_held, "");

    // With --rate: publishers from now on, until a little after everyone
    // is back; the drop once every client has had a message.
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut publishers_running = tokio::task::JoinSet::new();
    let mut connects_before = None;
    if ledger {
        for (c, name) in names.iter().enumerate() {
            publishers_running.spawn(gap::publish(
                c,
                name.clone(),
                publishers.clone(),
                interval,
                s.publishing.clone(),
                s.live.clone(),
                stop_rx.clone(),
            ));
        }
        let warm = until(Duration::from_secs(10) + interval * 3, || {
            s.tracks.iter().all(|t| {
                let t = t.lock().unwrap();
                !t.active || t.max.is_some()
            })
        })
        .await;
        if !warm {
            report
                .notes
                .push("not every client had received a message before the drop".into());
        }
        if proto.is_cable() {
            connects_before = actioncable::connect_calls(&p.target, Duration::from_secs(5)).await;
        }
    }

    // (a) The storm: all drop at once and come back; or the nodes are
    // restarted in turn, their clients moving to the others.
    *s.storm_started.lock().unwrap() = Some(Instant::now());
    let storm_at = Instant::now();
    let all_back = match &p.restart {
        None => {
            let _ = phase_tx.send(Phase::Storm);
            until(p.give_up + Duration::from_secs(60), || {
                s.back.load(Relaxed) + s.gave_up.load(Relaxed) >= connected
            })
            .await
        }
        Some(restart) => {
            let _ = phase_tx.send(Phase::Rolling);
            let away = || s.away.load(Relaxed);
            let limit = p.give_up + Duration::from_secs(60);
            rolling::roll(restart, &nodes, away, limit, &mut report).await;
            away() == 0
        }
    };
    let back = s.back.load(Relaxed);
    report.rate("back_and_subscribed", back as u64, connected as u64);
    report.value(
        "all_back_after",
        (all_back && back == connected).then(|| s.back_after.total().max() as f64 / 1e6),
        "s",
    );
    report.trend("reconnect_time", s.back_after.total());
    report.counter("reconnect_attempts", s.reconnect_attempts.load(Relaxed));
    report.counter("reconnects_given_up", s.gave_up.load(Relaxed) as u64);
    report.value("storm_took", Some(storm_at.elapsed().as_secs_f64()), "s");
    if ledger {
        tokio::time::sleep(tail(interval)).await;
        let _ = stop_tx.send(true);
        while publishers_running.join_next().await.is_some() {}
        // Their pooled HTTP connections close with them, before the
        // descriptors are compared with the baseline.
        drop(publishers);
        let pubs = &s.publishing;
        let drained = until(p.timeout, || {
            s.tracks.iter().enumerate().all(|(i, t)| {
                let t = t.lock().unwrap();
                let last = pubs.last_ok(s.chan[i]);
                !t.returned || last.is_none() || t.max >= last
            })
        })
        .await;
        if !drained {
            report.notes.push(format!(
                "some returning clients never got their channel's last message within {:?}",
                p.timeout
            ));
        }
        let published: u64 = (0..names.len()).map(|c| pubs.published(c)).sum();
        report.counter("messages_published", published);
        report.counter("publishes_failed", pubs.failures.load(Relaxed));
        gap::tally(&s.tracks, |i| s.chan[i], pubs).report(&mut report);
        if proto == Proto::ActionCableExt {
            report.counter("sessions_restored", s.restored.load(Relaxed));
            report.counter("sessions_fresh", s.fresh.load(Relaxed));
            report.counter("history_confirmed", s.history_confirmed.load(Relaxed));
            report.counter("history_rejected", s.history_rejected.load(Relaxed));
        }
        if proto.is_cable() {
            let after = actioncable::connect_calls(&p.target, Duration::from_secs(5)).await;
            // The second count's own connection made one call.
            let calls = connects_before
                .zip(after)
                .map(|(b, a)| a.saturating_sub(b + 1) as f64);
            if calls.is_none() {
                report.notes.push(
                    "Connect calls not counted: the app did not answer BenchmarkChannel's \
                     `stats` (is it `herald bench rpc-server` of this version?)"
                        .into(),
                );
            }
            report.value("connect_calls_during_storm", calls, "");
        }
    }

    // Right at the end of the storm: presence members as the HTTP API
    // sees them, against the members the bench has there.
    let expected: BTreeMap<String, usize> = s.presence_members.lock().unwrap().clone();
    let (mut matching, mut checked) = (0u64, 0u64);
    if !proto.has_presence() {
        report.notes.push(format!(
            "{} has no presence channels: the presence member check is skipped",
            proto.name()
        ));
    }
    for (channel, want) in &expected {
        checked += 1;
        match api.presence_users(channel).await {
            Ok(got) if got == *want => matching += 1,
            Ok(got) => report.notes.push(format!(
                "{channel}: the HTTP API lists {got} members, the bench has {want} there"
            )),
            Err(e) => report
                .notes
                .push(format!("{channel}: {}", worst::api_error(&e, &p.target))),
        }
    }
    if proto.has_presence() {
        report.rate("presence_counts_matching", matching, checked);
        report.counter(
            "presence_members_expected",
            expected.values().sum::<usize>() as u64,
        );
    }
    let gauge_after_storm = metrics.get("herald_connections").await;
    report.value("connections_gauge_after_storm", gauge_after_storm, "");
    if let (Some(b), Some(g), true) = (gauge_base, gauge_after_storm, single) {
        if g != b + back as f64 {
            report.notes.push(format!(
                "after the storm herald_connections is {g}, but {back} clients are connected \
                 (baseline {b})"
            ));
        }
    }

    // (b) The mass disconnect, with new clients arriving throughout (not
    // after a rolling restart: its clients simply leave).
    if rolling {
        let _ = phase_tx.send(Phase::Leave);
        while members.join_next().await.is_some() {}
        report
            .notes
            .push("rolling restart: no mass disconnect, the clients leave at the end".into());
    } else {
        let disconnect_at = Arc::new(Mutex::new(None));
        let lead = Duration::from_secs(1);
        let stream = tokio::spawn(newcomers(s.clone(), lead + p.window, disconnect_at.clone()));
        tokio::time::sleep(lead).await;
        *disconnect_at.lock().unwrap() = Some(Instant::now());
        let _ = phase_tx.send(Phase::Leave);
        while members.join_next().await.is_some() {}
        let _ = stream.await;
        report.counter("newcomers_during_disconnect", s.newcomers.load(Relaxed));
        report.rate(
            "newcomer_success",
            s.newcomers_ok.load(Relaxed),
            s.newcomers.load(Relaxed),
        );
        report.trend("newcomer_connect", s.newcomer_connect.total());
        report.trend("newcomer_setup", s.newcomer_setup.total());
    }
    report.counter(
        "connections_lost_while_held",
        s.lost_while_held.load(Relaxed),
    );
    drop(api);
    report.timeline = monitor.finish().await;

    // Everyone has left: descriptors and gauge back to the baseline?
    worst::report_return(
        &mut report,
        p.server_pid,
        &base,
        gauge_base,
        &metrics,
        p.settle,
        "after_all_left",
    )
    .await;
    report.seconds = started.elapsed().as_secs_f64();
    report.errors(&s.live);
    cpu.finish(&mut report);
    super::server_memory(&mut report, p.server_pid);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_third_each_and_presence_channels_of_the_asked_size() {
        let t = Target::new("ws://127.0.0.1:1", "a", "b", "c", false).unwrap();
        let mut p = StormParams::new(t);
        p.channels = 10;
        p.presence_size = 50;
        assert_eq!(channel_of(&p, 0), "storm-0");
        assert_eq!(channel_of(&p, 1), "private-storm-0");
        assert_eq!(channel_of(&p, 2), "presence-storm-0");
        assert_eq!(channel_of(&p, 33), "storm-1");
        let mut sizes: BTreeMap<String, usize> = BTreeMap::new();
        for i in 0..15_000 {
            let c = channel_of(&p, i);
            if c.starts_with("presence-") {
                *sizes.entry(c).or_default() += 1;
            }
        }
        assert_eq!(sizes.len(), 100);
        assert!(sizes.values().all(|&n| n == 50));
    }
}
