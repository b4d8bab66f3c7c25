//! The cluster logic both engines share; a transport (Redis pub/sub or
//! NATS core) only moves bytes between subjects.
//!
//! Each node is the authority for its own state, and the broker carries it:
//!
//! - **Publications** go to the channel's subject; only nodes with
//!   subscribers to the channel (or a matching pattern) subscribe to it.
//! - **Presence**: a node keeps its own members (to answer snapshots and to
//!   re-announce them) and a mirror of what the others told it (to remove a
//!   node's members when it leaves or goes silent). Changes go to the
//!   channel's subject (signed-in users: to every node).
//! - **Heartbeats** on `all` every third of the TTL carry the node's
//!   connections per app. A node silent for a whole TTL is declared gone:
//!   every node removes its members from its own clients' view, once each.
//! - **Requests** (channel figures, members, a cache channel's last event)
//!   go to every node; each answers on the asker's own subject. The asker
//!   waits for every node it knows to be alive, at most [`QUERY_TIMEOUT`].
//! - **Outage**: while the broker is away nothing is queued for it: what
//!   would go out is dropped and counted (`herald_broker_dropped_total`);
//!   local clients are served as before. On reconnect the node subscribes
//!   to its channels again, says hello, and every node sends its whole
//!   presence state, which the others reconcile with their mirror (members
//!   that left meanwhile are removed, new ones added).
//!
//! Callers never wait: the trait's sync methods update local state and put
//! at most one message into a bounded queue; the transport's task does the
//! network I/O. Interest changes do not go through the queue at all: the
//! wanted set is state, and the transport subscribes to what changed.

//!
//! The logic is split by concern: [`pubsub`] (subjects, publications,
//! interest, counts), [`liveness`] (heartbeats, leader and successor, burying
//! silent nodes, the reconnect state exchange), [`presence`] (members per
//! node and their reconciliation), [`queries`] (request/reply: figures,
//! members, a cache channel's last event), [`inbound`] (what arrives
//! from the transport, dispatched by kind), [`canary`] (noticing a
//! broker that silently stopped delivering) and [`reach`] (a new
//! subscription known across a NATS cluster before it is confirmed), and
//! [`interest`] (when the broker holds what the node subscribed to, which
//! confirmations wait for). This file holds the shared
//! state and the engine handle.

mod canary;
mod inbound;
mod interest;
pub mod journal;
mod liveness;
mod presence;
mod pubsub;
mod queries;
mod reach;
mod recover;

use liveness::connection_sums;
use presence::{reconcile, wants_scope};

use crate::msg::{Answer, Entry, Info, Msg, PubRef, Query};
use crate::subject;
use crate::tally::{Flip, Key, Tally};
use bytes::Bytes;
use herald_core::broker::{
    Cluster, Control, Counts, Full, Inbox, LastEvent, Occupancy, Presence, PresenceChange, PubSub,
    Queries, RemoteMember, Scope,
};
use herald_core::future::BoxFuture;
use herald_core::hub::{prefixes, ChannelStats, StatsFilter};
use herald_core::metrics;
use herald_core::namespace::{ChannelId, Namespace};
use herald_core::observer::Change;
use herald_core::publication::{NodeId, Publication};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot, Notify};

/// Messages waiting for the transport before more are dropped (besides
/// publications, which the journal holds and which always find room:
/// [`RESERVED`]).
pub const QUEUE: usize = 16 * 1024;

/// Queue slots only publications take: a whole outbox sent again, and one
/// more outbox of new ones.
const RESERVED: usize = 2 * journal::OUTBOX_MAX;

/// Longest wait for the other nodes' answers to a request.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(1);

/// After connecting, how long the node listens for the others' answers to
/// its hello before it reports itself connected (and asks them anything).
pub const DISCOVERY: Duration = Duration::from_millis(300);

/// Presence entries per state message.
const STATE_CHUNK: usize = 500;

/// What the transport's task sends.
pub enum Out {
    /// A message for a subject; the publication's number in this node's
    /// journal, or 0 (not a publication). Once the broker has taken it the
    /// transport calls [`Shared::taken`].
    Send(String, Bytes, u64),
    /// Answer once everything queued before has been sent.
    Flush(oneshot::Sender<()>),
}

/// A channel or pattern this node receives.
#[derive(Clone)]
pub struct Want {
    pub app: String,
    pub ns: Namespace,
    pub channel: String,
    pub pattern: bool,
}

type Members = HashMap<String, Info>;
type ScopeKey = (String, Scope);

struct Peer {
    seen: Instant,
    load: Vec<(String, u32)>,
    /// When it started (from its heartbeats; 0 until heard).
    born: u64,
}

struct Pending {
    waiting: HashSet<NodeId>,
    answers: Vec<(NodeId, Answer)>,
    done: Option<oneshot::Sender<()>>,
}

#[derive(Default)]
struct State {
    /// Subject → what it carries for us.
    wanted: HashMap<String, Want>,
    /// Subjects whose subscription may have to change.
    dirty: HashSet<String>,
    /// Our own members, per (app, scope).
    own: HashMap<ScopeKey, Members>,
    /// What the other nodes told us: node → (app, scope) → members.
    remote: HashMap<NodeId, HashMap<ScopeKey, Members>>,
    /// A node's state being received after its reconnect.
    incoming: HashMap<NodeId, HashMap<ScopeKey, Members>>,
    peers: HashMap<NodeId, Peer>,
    /// Nodes that left or were declared gone, and when.
    gone: HashMap<NodeId, Instant>,
    /// Heartbeats are not judged before this (after our own reconnect).
    grace_until: Option<Instant>,
    /// Cluster-wide occupancy and members, decided once ([`crate::tally`]).
    tally: Tally,
    /// A node's tally keys being received with its state.
    incoming_held: HashMap<NodeId, HashSet<Key>>,
    /// When heartbeats were last judged (a long gap: we were frozen).
    last_judged: Option<Instant>,
    /// The nodes the leader says it buried, from its last heartbeat.
    leader_buried: HashSet<NodeId>,
    /// Per publishing node, what arrived and what to ask for
    /// ([`recover`]).
    recv: HashMap<NodeId, recover::Recv>,
}

impl State {
    /// Publish how many nodes this one knows alive, itself included
    /// (`herald_cluster_nodes`); called where `peers` gains or loses one.
    fn count_nodes(&self) {
        metrics::CLUSTER_NODES.set(self.peers.len() as u64 + 1);
    }
}

/// What to tell the inbox once the state lock is released.
enum Act {
    Presence(String, PresenceChange),
    Gone(NodeId),
    Connections(String, u32),
    /// A cluster-wide flip this node reports.
    Observed(Flip),
    /// One this node reports that burying a node made.
    ObservedGone(Flip),
    /// One another node reports (for displays).
    Seen(Flip),
    /// Publications held for a recovery that will not complete (app,
    /// publication, number), in order.
    Publications(Vec<(String, Publication, u64)>),
}

/// The engine's state, shared by the broker handle and its tasks.
pub struct Shared {
    pub name: &'static str,
    pub prefix: String,
    /// The transport's multi-token wildcard (`>` or `*`).
    pub wildcard: &'static str,
    ttl: Duration,
    me: OnceLock<NodeId>,
    inbox: OnceLock<Arc<dyn Inbox>>,
    up: AtomicBool,
    /// Interest in effect: the connection's number (counted from 1) once
    /// its subscriptions are in place at the broker, 0 while there is none
    /// ([`interest`]).
    holding: AtomicU64,
    /// Connections made so far (numbers for `holding`).
    connections: AtomicU64,
    /// Poked when `holding` changes.
    held_changed: Notify,
    /// When the node has heard from the others after (re)connecting.
    settled: Mutex<Instant>,
    left: AtomicBool,
    /// When this node started, as the others compare it (ms since the
    /// epoch); later after an outage longer than the TTL.
    born: AtomicU64,
    /// Since when the broker has been away.
    down_since: Mutex<Option<Instant>>,
    out: mpsc::Sender<Out>,
    /// This node's publications: the outbox and the window ([`journal`]).
    pub journal: journal::Journal,
    /// Poked when the wanted set changes.
    pub wake: Notify,
    state: Mutex<State>,
    pending: Mutex<HashMap<u64, Pending>>,
    /// The scope a pending members request is about.
    scopes: Mutex<HashMap<u64, ScopeKey>>,
    next_request: AtomicU64,
    /// The broker canary's settings and state.
    pub canary: canary::Canary,
    /// Probe rounds across the cluster ([`reach`]).
    rounds: reach::Rounds,
}

pub use canary::CANARY_FAILURES;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Shared {
    pub fn me(&self) -> NodeId {
        self.me.get().copied().unwrap_or(0)
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Nodes this one knows to be alive (tests and diagnostics).
    pub fn peers(&self) -> usize {
        self.state.lock().peers.len()
    }

    /// Up, and past the discovery window.
    pub fn is_settled(&self) -> bool {
        self.is_up() && Instant::now() >= *self.settled.lock()
    }

    pub fn all(&self) -> String {
        subject::all(&self.prefix)
    }

    pub fn own_subject(&self) -> String {
        subject::node(&self.prefix, self.me())
    }

    /// Queue a message for the broker; dropped (and counted) while the
    /// broker is away or the queue is full (publications go through the
    /// journal instead). Returns whether it was queued.
    fn send(&self, subject: String, bytes: Vec<u8>) -> bool {
        if !self.is_up() {
            metrics::count(&metrics::BROKER_DROPPED);
            return false;
        }
        if self.out.capacity() <= RESERVED {
            metrics::count(&metrics::BROKER_DROPPED);
            return false;
        }
        match self.out.try_send(Out::Send(subject, Bytes::from(bytes), 0)) {
            Ok(()) => true,
            Err(_) => {
                metrics::count(&metrics::BROKER_DROPPED);
                false
            }
        }
    }

    fn send_msg(&self, subject: String, msg: &Msg) -> bool {
        self.send(subject, msg.to_bytes())
    }

    // ----- for the transports ---------------------------------------------------

    /// The broker answered every message queued up to publication `seq`
    /// (the highest number of what it just took).
    pub fn taken(&self, seq: u64) {
        if seq != 0 {
            self.journal.taken(seq);
        }
    }

    /// Every wanted subject (with whether it is a pattern); clears the
    /// dirty set, as a fresh connection subscribes to all of them.
    pub fn wanted_now(&self) -> Vec<(String, bool)> {
        let mut s = self.state.lock();
        s.dirty.clear();
        s.wanted
            .iter()
            .map(|(k, w)| (k.clone(), w.pattern))
            .collect()
    }

    /// Subjects whose wanted state changed: (subject, wanted now, pattern).
    pub fn take_dirty(&self) -> Vec<(String, bool, bool)> {
        let mut s = self.state.lock();
        let dirty: Vec<String> = s.dirty.drain().collect();
        dirty
            .into_iter()
            .map(|d| {
                let w = s.wanted.get(&d);
                let pattern = w.map_or(d.ends_with(self.wildcard), |w| w.pattern);
                (d.clone(), w.is_some(), pattern)
            })
            .collect()
    }
}

fn run(inbox: &Arc<dyn Inbox>, acts: Vec<Act>) {
    for act in acts {
        match act {
            Act::Presence(app, change) => inbox.presence(&app, &change),
            Act::Gone(n) => inbox.node_gone(n),
            Act::Connections(app, c) => inbox.remote_connections(&app, c),
            Act::Observed(f) => inbox.observed(&f.key.0, f.key.1 .0, &change_of(&f)),
            Act::ObservedGone(f) => inbox.observed_gone(&f.key.0, f.key.1 .0, &change_of(&f)),
            Act::Seen(f) => inbox.seen(&f.key.0, f.key.1 .0, &change_of(&f)),
            Act::Publications(list) => {
                for (app, p, _) in list {
                    inbox.publication(&app, p);
                }
            }
        }
    }
}

/// What a flip of the tally means for observers.
fn change_of(f: &Flip) -> Change<'_> {
    let (_, ChannelId(_, channel), user) = &f.key;
    match (user, f.on) {
        (None, true) => Change::Occupied { channel },
        (None, false) => Change::Vacated { channel },
        (Some(user_id), true) => Change::MemberAdded { channel, user_id },
        (Some(user_id), false) => Change::MemberRemoved { channel, user_id },
    }
}

/// Starts the transport once the node is known.
pub type Starter = Box<dyn FnOnce(Arc<Shared>, mpsc::Receiver<Out>) + Send>;

/// A networked engine: the cluster logic over a transport.
pub struct Engine {
    shared: Arc<Shared>,
    start: Mutex<Option<(Starter, mpsc::Receiver<Out>)>>,
    /// Where the transport keeps history and sessions (None: per node).
    streams: Option<Arc<dyn herald_core::broker::Streams>>,
}

impl Engine {
    pub fn new(
        name: &'static str,
        prefix: &str,
        ttl: Duration,
        wildcard: &'static str,
        start: Starter,
    ) -> Engine {
        let (tx, rx) = mpsc::channel(QUEUE + RESERVED);
        Engine {
            shared: Arc::new(Shared {
                name,
                prefix: prefix.to_owned(),
                wildcard,
                ttl,
                me: OnceLock::new(),
                inbox: OnceLock::new(),
                up: AtomicBool::new(false),
                holding: AtomicU64::new(0),
                connections: AtomicU64::new(0),
                held_changed: Notify::new(),
                settled: Mutex::new(Instant::now()),
                left: AtomicBool::new(false),
                born: AtomicU64::new(now_ms()),
                down_since: Mutex::new(None),
                out: tx,
                journal: journal::Journal::default(),
                wake: Notify::new(),
                state: Mutex::new(State::default()),
                pending: Mutex::new(HashMap::new()),
                scopes: Mutex::new(HashMap::new()),
                next_request: AtomicU64::new(1),
                canary: canary::Canary::default(),
                rounds: reach::Rounds::default(),
            }),
            start: Mutex::new(Some((start, rx))),
            streams: None,
        }
    }

    /// Keep history and sessions in `streams` (the transport's server)
    /// instead of in each node.
    pub fn with_streams(mut self, streams: Arc<dyn herald_core::broker::Streams>) -> Engine {
        self.streams = Some(streams);
        self
    }

    /// Publish a canary every `every` and expect it back within
    /// `deadline` (see [`canary`]); never called: no canary.
    pub fn with_canary(self, every: Duration, deadline: Duration) -> Engine {
        self.shared.canary.configure(every, deadline);
        self
    }

    /// Bound the journal's outbox and window (`broker.outbox`,
    /// `broker.recovery_*`, `broker.journal_max_bytes`).
    pub fn with_journal(self, limits: journal::Limits) -> Engine {
        self.shared.journal.configure(limits);
        self
    }

    /// The engine's state (tests and diagnostics).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}
