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

use crate::msg::{Answer, Entry, Info, Msg, PubRef, Query};
use crate::subject;
use crate::tally::{Flip, Key, Tally};
use bytes::Bytes;
use herald_core::broker::{
    BoxFuture, Cluster, Control, Counts, Inbox, LastEvent, Occupancy, Presence, PresenceChange,
    PubSub, Queries, RemoteMember, Scope,
};
use herald_core::fanout::{NodeId, Publication};
use herald_core::hub::{prefixes, ChannelStats, StatsFilter};
use herald_core::metrics;
use herald_core::namespace::{ChannelId, Namespace};
use herald_core::observer::Change;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot, Notify};

/// Messages waiting for the transport before more are dropped.
pub const QUEUE: usize = 16 * 1024;

/// Longest wait for the other nodes' answers to a request.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(1);

/// After connecting, how long the node listens for the others' answers to
/// its hello before it reports itself connected (and asks them anything).
pub const DISCOVERY: Duration = Duration::from_millis(300);

/// Presence entries per state message.
const STATE_CHUNK: usize = 500;

/// What the transport's task sends.
pub enum Out {
    Send(String, Bytes),
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
}

/// What to tell the inbox once the state lock is released.
enum Act {
    Presence(String, PresenceChange),
    Gone(NodeId),
    Connections(String, u32),
    /// A cluster-wide flip this node reports.
    Observed(Flip),
    /// One another node reports (for displays).
    Seen(Flip),
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
    /// When the node has heard from the others after (re)connecting.
    settled: Mutex<Instant>,
    left: AtomicBool,
    /// When this node started, as the others compare it (ms since the
    /// epoch); later after an outage longer than the TTL.
    born: AtomicU64,
    /// Since when the broker has been away.
    down_since: Mutex<Option<Instant>>,
    out: mpsc::Sender<Out>,
    /// Poked when the wanted set changes.
    pub wake: Notify,
    state: Mutex<State>,
    pending: Mutex<HashMap<u64, Pending>>,
    /// The scope a pending members request is about.
    scopes: Mutex<HashMap<u64, ScopeKey>>,
    next_request: AtomicU64,
}

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

    fn channel_subject(&self, app: &str, ns: Namespace, channel: &str) -> String {
        subject::channel(&self.prefix, app, ns, channel)
    }

    fn want_subject(&self, app: &str, ns: Namespace, channel: &str, pattern: bool) -> String {
        if pattern {
            subject::pattern(&self.prefix, app, ns, channel, self.wildcard)
        } else {
            self.channel_subject(app, ns, channel)
        }
    }

    /// Queue a message for the broker; dropped (and counted) while the
    /// broker is away or the queue is full. Returns whether it was queued.
    fn send(&self, subject: String, bytes: Vec<u8>) -> bool {
        if !self.is_up() {
            metrics::count(&metrics::BROKER_DROPPED);
            return false;
        }
        match self.out.try_send(Out::Send(subject, Bytes::from(bytes))) {
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

    /// The connection is up (subscriptions in place) or down.
    pub fn set_up(self: &Arc<Self>, up: bool, why: &str) {
        let was = self.up.swap(up, Ordering::AcqRel);
        if was == up {
            return;
        }
        if up {
            tracing::info!(engine = self.name, "broker connected; announcing this node");
            if let Some(since) = self.down_since.lock().take() {
                if since.elapsed() > self.ttl {
                    // The others have declared us gone: we come back as a
                    // new node, not as their leader with a stale view.
                    self.born.store(now_ms(), Ordering::Release);
                }
            }
            *self.settled.lock() = Instant::now() + DISCOVERY;
            {
                let mut s = self.state.lock();
                let now = Instant::now();
                for p in s.peers.values_mut() {
                    p.seen = now;
                }
                s.grace_until = Some(now + self.ttl);
                // Not judged while away: no stall to see in that gap.
                s.last_judged = None;
            }
            self.beat(true);
            self.send_state();
            // Once settled this node may lead (alone, or the oldest back
            // from an outage): report what it journaled meanwhile then,
            // not at the next heartbeat.
            let me = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(DISCOVERY + Duration::from_millis(10)).await;
                me.settle_check();
            });
        } else {
            *self.down_since.lock() = Some(Instant::now());
            metrics::count(&metrics::BROKER_OUTAGES);
            tracing::warn!(
                engine = self.name,
                error = why,
                "broker connection lost; serving local clients, reconnecting"
            );
            // Nobody can answer now.
            let mut pending = self.pending.lock();
            for p in pending.values_mut() {
                if let Some(done) = p.done.take() {
                    let _ = done.send(());
                }
            }
        }
    }

    fn beat(&self, hello: bool) {
        let load = self
            .inbox
            .get()
            .map(|i| i.connections())
            .unwrap_or_default();
        let g = {
            let s = self.state.lock();
            if s.tally.leading {
                s.gone.keys().copied().collect()
            } else {
                Vec::new()
            }
        };
        let msg = Msg::Beat {
            n: self.me(),
            l: load,
            h: hello,
            r: hello,
            t: self.born(),
            g,
        };
        self.send_msg(self.all(), &msg);
    }

    /// Send our whole presence state, in order, on `all`.
    fn send_state(&self) {
        // Queued under the lock: a change made meanwhile goes out after
        // the state, never before it (the others would undo it).
        let s = self.state.lock();
        let entries: Vec<Entry> = s
            .own
            .iter()
            .flat_map(|((app, scope), members)| {
                members
                    .iter()
                    .map(move |(u, i)| (app.clone(), scope.clone(), u.clone(), i.clone()))
            })
            .collect();
        let n = self.me();
        let held = s.tally.of(n);
        let all = self.all();
        self.send_msg(all.clone(), &Msg::StateBegin { n });
        for chunk in entries.chunks(STATE_CHUNK) {
            self.send_msg(
                all.clone(),
                &Msg::StatePart {
                    n,
                    e: chunk.to_vec(),
                },
            );
        }
        for chunk in held.chunks(STATE_CHUNK) {
            self.send_msg(
                all.clone(),
                &Msg::StateHeld {
                    n,
                    k: chunk.to_vec(),
                },
            );
        }
        self.send_msg(all, &Msg::StateEnd { n });
        drop(s);
    }

    pub fn born(&self) -> u64 {
        self.born.load(Ordering::Acquire)
    }

    /// The node that reports cluster-wide flips as this node sees it: the
    /// oldest alive (earliest start, then lowest id).
    fn leader(&self, s: &State) -> NodeId {
        let mut best = (self.born(), self.me());
        for (n, p) in &s.peers {
            best = best.min((p.born, *n));
        }
        best.1
    }

    /// Whether this node leads now; on becoming the leader, report what
    /// the journal says the old one may not have.
    fn lead_check(&self, s: &mut State, acts: &mut Vec<Act>) {
        let leads = self.is_settled() && self.leader(s) == self.me();
        if leads && !s.tally.leading {
            acts.extend(s.tally.replay().into_iter().map(Act::Observed));
        }
        s.tally.leading = leads;
    }

    fn settle_check(&self) {
        let mut acts = Vec::new();
        {
            let mut s = self.state.lock();
            self.lead_check(&mut s, &mut acts);
        }
        if let Some(inbox) = self.inbox.get() {
            run(inbox, acts);
        }
    }

    /// Flips of the tally: reported by the leader, journaled by the others
    /// (`buried`: burying that node caused them).
    fn flipped(s: &mut State, flips: Vec<Flip>, acts: &mut Vec<Act>, buried: Option<NodeId>) {
        if flips.is_empty() {
            return;
        }
        if s.tally.leading {
            acts.extend(flips.into_iter().map(Act::Observed));
            return;
        }
        if !buried.is_some_and(|n| s.leader_buried.contains(&n)) {
            s.tally.journal(&flips, buried);
        }
        acts.extend(flips.into_iter().map(Act::Seen));
    }

    /// This node now holds (`on`) or no longer holds `key`: tell the
    /// others. Returns whether the caller reports the flip it made.
    fn hold(&self, key: Key, on: bool) -> bool {
        let mut acts = Vec::new();
        let mine = {
            let mut s = self.state.lock();
            self.lead_check(&mut s, &mut acts);
            let (changed, flip) = s.tally.set(self.me(), key.clone(), on);
            if changed {
                let (a, ch, u) = key;
                let msg = Msg::Held {
                    n: self.me(),
                    a,
                    ch,
                    u,
                    j: on,
                };
                self.send_msg(self.all(), &msg);
            }
            match flip {
                Some(_) if s.tally.leading => true,
                Some(f) => {
                    s.tally.journal(std::slice::from_ref(&f), None);
                    acts.push(Act::Seen(f));
                    false
                }
                None => false,
            }
        };
        if let Some(inbox) = self.inbox.get() {
            run(inbox, acts);
        }
        mine
    }

    /// A message arrived on subscription `via` (a subject or a pattern).
    pub fn on_message(&self, via: &str, payload: &[u8]) {
        let Ok(msg) = serde_json::from_slice::<Msg>(payload) else {
            tracing::debug!(via, "unreadable broker message ignored");
            return;
        };
        let from = msg.from();
        if from == self.me() || from == 0 {
            return;
        }
        let Some(inbox) = self.inbox.get().cloned() else {
            return;
        };
        let mut acts = Vec::new();
        {
            let mut s = self.state.lock();
            let is_beat = matches!(msg, Msg::Beat { .. });
            if s.gone.contains_key(&from) && !is_beat {
                // A node we buried: ignore stragglers until it beats again.
                return;
            }
            if !matches!(msg, Msg::Bye { .. }) {
                let now = Instant::now();
                if s.gone.remove(&from).is_some() {
                    // Back from the dead (it was stalled): ask for its state.
                    tracing::info!(node = from, "node is back; asking for its state");
                    let ask = Msg::Beat {
                        n: self.me(),
                        l: Vec::new(),
                        h: true,
                        r: true,
                        t: self.born(),
                        g: Vec::new(),
                    };
                    self.send_msg(subject::node(&self.prefix, from), &ask);
                }
                s.peers
                    .entry(from)
                    .and_modify(|p| p.seen = now)
                    .or_insert(Peer {
                        seen: now,
                        load: Vec::new(),
                        born: 0,
                    });
            }
            if let Msg::Beat { t, .. } = &msg {
                if let Some(p) = s.peers.get_mut(&from) {
                    if *t != 0 {
                        p.born = *t;
                    }
                }
            }
            if !s.tally.leading && self.leader(&s) == from {
                s.tally.clear_journal();
                if let Msg::Beat { g, .. } = &msg {
                    let gone: HashSet<NodeId> = g.iter().copied().collect();
                    s.tally.clear_buried(&gone);
                    s.leader_buried = gone;
                }
            }
            match msg {
                Msg::Pub { a, p, .. } => {
                    if p.to_user.is_none() && !self.canonical(&s, via, &a, p.ns, &p.channel) {
                        return;
                    }
                    drop(s);
                    inbox.publication(&a, p);
                    return;
                }
                Msg::Member {
                    n,
                    a,
                    s: scope,
                    u,
                    j,
                    i,
                } => {
                    if !wants_scope(&s, self, &a, &scope) {
                        return;
                    }
                    let key = (a.clone(), scope.clone());
                    let m = s.remote.entry(n).or_default().entry(key).or_default();
                    if j {
                        m.insert(u.clone(), i.clone());
                    } else {
                        m.remove(&u);
                    }
                    acts.push(Act::Presence(
                        a,
                        PresenceChange {
                            scope,
                            node: n,
                            user_id: u,
                            joined: j.then_some(i),
                        },
                    ));
                }
                Msg::Beat { n, l, h, r, .. } => {
                    if let Some(p) = s.peers.get_mut(&n) {
                        if !l.is_empty() || !h {
                            p.load = l;
                        }
                    }
                    acts.extend(connection_sums(&s));
                    drop(s);
                    if h {
                        // Let the newcomer know us at once.
                        let reply = Msg::Beat {
                            n: self.me(),
                            l: inbox.connections(),
                            h: false,
                            r: false,
                            t: self.born(),
                            g: Vec::new(),
                        };
                        self.send_msg(subject::node(&self.prefix, n), &reply);
                    }
                    if r {
                        self.send_state();
                    }
                    run(&inbox, acts);
                    return;
                }
                Msg::Bye { n } => {
                    tracing::info!(node = n, "node left the cluster");
                    self.bury(&mut s, n, &mut acts);
                }
                Msg::Control { a, c, .. } => {
                    drop(s);
                    inbox.control(&a, &c);
                    return;
                }
                Msg::Request { n, id, a, q } => {
                    let own = match &q {
                        Query::Members(scope) => s
                            .own
                            .get(&(a.clone(), scope.clone()))
                            .map(|m| m.iter().map(|(u, i)| (u.clone(), i.clone())).collect())
                            .unwrap_or_default(),
                        _ => Vec::new(),
                    };
                    drop(s);
                    let r = match q {
                        Query::Stats(ns, filter) => Answer::Stats(inbox.stats(&a, ns, &filter)),
                        Query::Members(_) => Answer::Members(own),
                        Query::Cached(ChannelId(ns, channel)) => {
                            Answer::Cached(inbox.cached(&a, ns, &channel).map(|(p, age)| {
                                (now_ms().saturating_sub(age.as_millis() as u64), p)
                            }))
                        }
                    };
                    let reply = Msg::Reply {
                        n: self.me(),
                        id,
                        r,
                    };
                    self.send_msg(subject::node(&self.prefix, n), &reply);
                    return;
                }
                Msg::Reply { n, id, r } => {
                    drop(s);
                    self.answered(n, id, r);
                    return;
                }
                Msg::Count { n, a, ns, ch, c } => {
                    if !s.wanted.contains_key(&self.channel_subject(&a, ns, &ch)) {
                        return;
                    }
                    drop(s);
                    inbox.count(&a, ns, &ch, n, c);
                    return;
                }
                Msg::StateBegin { n } => {
                    s.incoming.insert(n, HashMap::new());
                    s.incoming_held.insert(n, HashSet::new());
                }
                Msg::StateHeld { n, k } => {
                    if let Some(inc) = s.incoming_held.get_mut(&n) {
                        inc.extend(k);
                    }
                }
                Msg::Held { n, a, ch, u, j } => {
                    self.lead_check(&mut s, &mut acts);
                    let (_, flip) = s.tally.set(n, (a, ch, u), j);
                    Self::flipped(&mut s, flip.into_iter().collect(), &mut acts, None);
                }
                Msg::StatePart { n, e } => {
                    let mut keep = Vec::new();
                    for (a, scope, u, i) in e {
                        if wants_scope(&s, self, &a, &scope) {
                            keep.push((a, scope, u, i));
                        }
                    }
                    if let Some(inc) = s.incoming.get_mut(&n) {
                        for (a, scope, u, i) in keep {
                            inc.entry((a, scope)).or_default().insert(u, i);
                        }
                    }
                }
                Msg::StateEnd { n } => {
                    if let Some(inc) = s.incoming.remove(&n) {
                        reconcile(&mut s, n, inc, &mut acts);
                    }
                    if let Some(held) = s.incoming_held.remove(&n) {
                        self.lead_check(&mut s, &mut acts);
                        let flips = s.tally.replace(n, held);
                        Self::flipped(&mut s, flips, &mut acts, None);
                    }
                }
            }
        }
        run(&inbox, acts);
    }

    /// Whether a publication that came through `via` is the one this node
    /// delivers: through its exact subscription if it has one, else through
    /// the shortest matching pattern (a node with several matching
    /// subscriptions receives one copy through each).
    fn canonical(&self, s: &State, via: &str, app: &str, ns: Namespace, channel: &str) -> bool {
        let exact = self.channel_subject(app, ns, channel);
        if s.wanted.contains_key(&exact) {
            return via == exact;
        }
        for prefix in prefixes(channel) {
            let p = subject::pattern(&self.prefix, app, ns, prefix, self.wildcard);
            if s.wanted.contains_key(&p) {
                return via == p;
            }
        }
        false
    }

    fn answered(&self, from: NodeId, id: u64, r: Answer) {
        if let Answer::Members(list) = &r {
            // Remember what the node has, to remove it if the node goes.
            let mut s = self.state.lock();
            let key = self.pending_scope(id);
            if let Some((app, scope)) = key {
                if wants_scope(&s, self, &app, &scope) {
                    let m = s
                        .remote
                        .entry(from)
                        .or_default()
                        .entry((app, scope))
                        .or_default();
                    for (u, i) in list {
                        m.insert(u.clone(), i.clone());
                    }
                }
            }
        }
        let mut pending = self.pending.lock();
        if let Some(p) = pending.get_mut(&id) {
            if p.waiting.remove(&from) {
                p.answers.push((from, r));
            }
            if p.waiting.is_empty() {
                if let Some(done) = p.done.take() {
                    let _ = done.send(());
                }
            }
        }
    }

    fn pending_scope(&self, id: u64) -> Option<ScopeKey> {
        self.scopes.lock().get(&id).cloned()
    }

    /// Forget node `n`: its members leave, its counts are dropped.
    fn bury(&self, s: &mut State, n: NodeId, acts: &mut Vec<Act>) {
        s.peers.remove(&n);
        s.incoming.remove(&n);
        s.incoming_held.remove(&n);
        s.gone.insert(n, Instant::now());
        // Whoever leads now (perhaps this node, in place of `n`) reports
        // what `n` held alone.
        self.lead_check(s, acts);
        let flips = s.tally.replace(n, HashSet::new());
        Self::flipped(s, flips, acts, Some(n));
        if let Some(scopes) = s.remote.remove(&n) {
            for ((app, scope), members) in scopes {
                for user in members.into_keys() {
                    acts.push(Act::Presence(
                        app.clone(),
                        PresenceChange {
                            scope: scope.clone(),
                            node: n,
                            user_id: user,
                            joined: None,
                        },
                    ));
                }
            }
        }
        acts.push(Act::Gone(n));
        acts.extend(connection_sums(s));
        let mut pending = self.pending.lock();
        for p in pending.values_mut() {
            p.waiting.remove(&n);
            if p.waiting.is_empty() {
                if let Some(done) = p.done.take() {
                    let _ = done.send(());
                }
            }
        }
    }

    /// Send a request to every node and collect the answers of those
    /// alive, within [`QUERY_TIMEOUT`].
    async fn ask(
        self: Arc<Self>,
        app: String,
        q: Query,
        scope: Option<ScopeKey>,
    ) -> Vec<(NodeId, Answer)> {
        if !self.is_up() {
            return Vec::new();
        }
        let settled = *self.settled.lock();
        if Instant::now() < settled {
            tokio::time::sleep_until(settled.into()).await;
        }
        let waiting: HashSet<NodeId> = self.state.lock().peers.keys().copied().collect();
        if waiting.is_empty() {
            return Vec::new();
        }
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Some(k) = scope {
            self.scopes.lock().insert(id, k);
        }
        self.pending.lock().insert(
            id,
            Pending {
                waiting,
                answers: Vec::new(),
                done: Some(tx),
            },
        );
        let msg = Msg::Request {
            n: self.me(),
            id,
            a: app,
            q,
        };
        if self.send_msg(self.all(), &msg) {
            let _ = tokio::time::timeout(QUERY_TIMEOUT, rx).await;
        }
        self.scopes.lock().remove(&id);
        self.pending
            .lock()
            .remove(&id)
            .map(|p| p.answers)
            .unwrap_or_default()
    }

    /// Judge the peers' heartbeats: bury those silent for a whole TTL.
    fn judge(&self) {
        let Some(inbox) = self.inbox.get().cloned() else {
            return;
        };
        let mut acts = Vec::new();
        let buried;
        {
            let mut s = self.state.lock();
            let now = Instant::now();
            if s.last_judged
                .replace(now)
                .is_some_and(|t| now - t > self.ttl)
            {
                // This process was frozen: the others were not silent, we
                // were (and they have declared us gone). Give them a TTL,
                // and come back as the youngest node.
                tracing::warn!("this node stalled for longer than the TTL");
                for p in s.peers.values_mut() {
                    p.seen = now;
                }
                self.born.store(now_ms(), Ordering::Release);
            }
            // A node alone since it started leads once settled.
            self.lead_check(&mut s, &mut acts);
            if s.grace_until.is_some_and(|g| now < g) {
                drop(s);
                run(&inbox, acts);
                return;
            }
            let silent: Vec<NodeId> = s
                .peers
                .iter()
                .filter(|(_, p)| now.duration_since(p.seen) > self.ttl)
                .map(|(n, _)| *n)
                .collect();
            let any = !silent.is_empty();
            for n in silent {
                tracing::warn!(node = n, "node missed its heartbeats; removing its members");
                self.bury(&mut s, n, &mut acts);
            }
            // (Leading now: perhaps because the leader was among them.)
            buried = any && s.tally.leading;
            // Forget the dead after a while (a node id is never reused).
            let keep = self.ttl * 10;
            s.gone.retain(|_, at| now.duration_since(*at) < keep);
        }
        run(&inbox, acts);
        if buried {
            // Tell the others at once that the leader buried them, so
            // none replays it should the leader die before its next beat.
            self.beat(false);
        }
    }
}

fn wants_scope(s: &State, shared: &Shared, app: &str, scope: &Scope) -> bool {
    match scope {
        Scope::Users => true,
        Scope::Channel(ChannelId(ns, c)) => {
            s.wanted.contains_key(&shared.channel_subject(app, *ns, c))
        }
    }
}

/// The other nodes' connections per app, summed.
fn connection_sums(s: &State) -> Vec<Act> {
    let mut sums: HashMap<&str, u32> = HashMap::new();
    for p in s.peers.values() {
        for (app, c) in &p.load {
            *sums.entry(app.as_str()).or_default() += c;
        }
    }
    sums.into_iter()
        .map(|(a, c)| Act::Connections(a.to_owned(), c))
        .collect()
}

/// Bring our mirror of node `n` in line with its full state `new`: members
/// it no longer has leave, members we did not know join.
fn reconcile(s: &mut State, n: NodeId, new: HashMap<ScopeKey, Members>, acts: &mut Vec<Act>) {
    let old = s.remote.remove(&n).unwrap_or_default();
    let change = |app: &str, scope: &Scope, user: &str, joined: Option<Info>| {
        Act::Presence(
            app.to_owned(),
            PresenceChange {
                scope: scope.clone(),
                node: n,
                user_id: user.to_owned(),
                joined,
            },
        )
    };
    for ((app, scope), members) in &old {
        let now = new.get(&(app.clone(), scope.clone()));
        for user in members.keys() {
            if !now.is_some_and(|m| m.contains_key(user)) {
                acts.push(change(app, scope, user, None));
            }
        }
    }
    for ((app, scope), members) in &new {
        let before = old.get(&(app.clone(), scope.clone()));
        for (user, info) in members {
            if !before.is_some_and(|m| m.contains_key(user)) {
                acts.push(change(app, scope, user, Some(info.clone())));
            }
        }
    }
    s.remote.insert(n, new);
}

fn run(inbox: &Arc<dyn Inbox>, acts: Vec<Act>) {
    for act in acts {
        match act {
            Act::Presence(app, change) => inbox.presence(&app, &change),
            Act::Gone(n) => inbox.node_gone(n),
            Act::Connections(app, c) => inbox.remote_connections(&app, c),
            Act::Observed(f) => inbox.observed(&f.key.0, f.key.1 .0, &change_of(&f)),
            Act::Seen(f) => inbox.seen(&f.key.0, f.key.1 .0, &change_of(&f)),
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
}

impl Engine {
    pub fn new(
        name: &'static str,
        prefix: &str,
        ttl: Duration,
        wildcard: &'static str,
        start: Starter,
    ) -> Engine {
        let (tx, rx) = mpsc::channel(QUEUE);
        Engine {
            shared: Arc::new(Shared {
                name,
                prefix: prefix.to_owned(),
                wildcard,
                ttl,
                me: OnceLock::new(),
                inbox: OnceLock::new(),
                up: AtomicBool::new(false),
                settled: Mutex::new(Instant::now()),
                left: AtomicBool::new(false),
                born: AtomicU64::new(now_ms()),
                down_since: Mutex::new(None),
                out: tx,
                wake: Notify::new(),
                state: Mutex::new(State::default()),
                pending: Mutex::new(HashMap::new()),
                scopes: Mutex::new(HashMap::new()),
                next_request: AtomicU64::new(1),
            }),
            start: Mutex::new(Some((start, rx))),
        }
    }

    /// The engine's state (tests and diagnostics).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl Cluster for Engine {
    fn name(&self) -> &'static str {
        self.shared.name
    }

    fn attach(&self, node: NodeId, inbox: Arc<dyn Inbox>) {
        if self.shared.me.set(node).is_err() {
            tracing::error!(
                "a {} engine serves one node; ignoring another",
                self.shared.name
            );
            return;
        }
        let _ = self.shared.inbox.set(inbox);
        if let Some((start, rx)) = self.start.lock().take() {
            start(self.shared.clone(), rx);
        }
    }

    fn detach(&self, node: NodeId) {
        if node != self.shared.me() || self.shared.left.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared
            .send_msg(self.shared.all(), &Msg::Bye { n: node });
    }

    fn heartbeat(&self, node: NodeId) {
        if node != self.shared.me() {
            return;
        }
        if self.shared.is_up() {
            self.shared.beat(false);
            self.shared.judge();
        }
    }

    fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    fn connected(&self) -> bool {
        self.shared.is_settled()
    }

    fn flush(&self) -> BoxFuture<()> {
        let sh = self.shared.clone();
        Box::pin(async move {
            if !sh.is_up() {
                return;
            }
            let (tx, rx) = oneshot::channel();
            if sh.out.send(Out::Flush(tx)).await.is_ok() {
                let _ = rx.await;
            }
        })
    }
}

impl PubSub for Engine {
    fn publish(&self, app_id: &str, p: &Publication) {
        let sh = &self.shared;
        if !sh.is_up() {
            metrics::count(&metrics::BROKER_DROPPED);
            return;
        }
        let subject = if p.to_user.is_some() {
            sh.all()
        } else {
            sh.channel_subject(app_id, p.ns, &p.channel)
        };
        let bytes = serde_json::to_vec(&PubRef::Pub {
            n: sh.me(),
            a: app_id,
            p,
        })
        .unwrap_or_default();
        sh.send(subject, bytes);
    }

    fn interest(
        &self,
        _node: NodeId,
        app_id: &str,
        ns: Namespace,
        channel: &str,
        pattern: bool,
        on: bool,
    ) {
        let sh = &self.shared;
        let subject = sh.want_subject(app_id, ns, channel, pattern);
        {
            let mut s = sh.state.lock();
            if on {
                if s.wanted.contains_key(&subject) {
                    return;
                }
                s.wanted.insert(
                    subject.clone(),
                    Want {
                        app: app_id.to_owned(),
                        ns,
                        channel: channel.to_owned(),
                        pattern,
                    },
                );
            } else {
                if s.wanted.remove(&subject).is_none() {
                    return;
                }
                if !pattern {
                    let channel = ChannelId(ns, channel.to_owned());
                    let key = (app_id.to_owned(), Scope::Channel(channel));
                    for scopes in s.remote.values_mut() {
                        scopes.remove(&key);
                    }
                }
            }
            s.dirty.insert(subject);
        }
        sh.wake.notify_one();
    }
}

impl Presence for Engine {
    fn presence(&self, app_id: &str, change: PresenceChange) {
        let sh = &self.shared;
        let key = (app_id.to_owned(), change.scope.clone());
        {
            let mut s = sh.state.lock();
            match &change.joined {
                Some(info) => {
                    s.own
                        .entry(key)
                        .or_default()
                        .insert(change.user_id.clone(), info.clone());
                }
                None => {
                    if let Some(m) = s.own.get_mut(&key) {
                        m.remove(&change.user_id);
                        if m.is_empty() {
                            s.own.remove(&key);
                        }
                    }
                }
            }
        }
        let subject = match &change.scope {
            Scope::Users => sh.all(),
            Scope::Channel(ChannelId(ns, c)) => sh.channel_subject(app_id, *ns, c),
        };
        let (j, i) = match change.joined {
            Some(i) => (true, i),
            None => (false, None),
        };
        let msg = Msg::Member {
            n: sh.me(),
            a: app_id.to_owned(),
            s: change.scope,
            u: change.user_id,
            j,
            i,
        };
        // Lost while the broker is away: the state sent on reconnect
        // carries it.
        sh.send_msg(subject, &msg);
    }

    fn members(
        &self,
        app_id: &str,
        scope: &Scope,
        _except: NodeId,
    ) -> BoxFuture<Vec<RemoteMember>> {
        let sh = self.shared.clone();
        let app = app_id.to_owned();
        let scope = scope.clone();
        Box::pin(async move {
            let key = Some((app.clone(), scope.clone()));
            sh.ask(app, Query::Members(scope), key)
                .await
                .into_iter()
                .flat_map(|(n, a)| match a {
                    Answer::Members(list) => {
                        list.into_iter().map(|(u, i)| (n, u, i)).collect::<Vec<_>>()
                    }
                    _ => Vec::new(),
                })
                .collect()
        })
    }
}

impl Occupancy for Engine {
    fn occupancy(
        &self,
        _node: NodeId,
        app_id: &str,
        ns: Namespace,
        channel: &str,
        occupied: bool,
    ) -> BoxFuture<bool> {
        let key = (app_id.to_owned(), ChannelId(ns, channel.to_owned()), None);
        Box::pin(std::future::ready(self.shared.hold(key, occupied)))
    }

    fn member(
        &self,
        _node: NodeId,
        app_id: &str,
        ns: Namespace,
        channel: &str,
        user_id: &str,
        joined: bool,
    ) -> BoxFuture<bool> {
        let key = (
            app_id.to_owned(),
            ChannelId(ns, channel.to_owned()),
            Some(user_id.to_owned()),
        );
        Box::pin(std::future::ready(self.shared.hold(key, joined)))
    }
}

impl Queries for Engine {
    fn query(
        &self,
        _from: NodeId,
        app_id: &str,
        ns: Option<Namespace>,
        filter: StatsFilter,
    ) -> BoxFuture<Vec<ChannelStats>> {
        let sh = self.shared.clone();
        let app = app_id.to_owned();
        Box::pin(async move {
            sh.ask(app, Query::Stats(ns, filter), None)
                .await
                .into_iter()
                .flat_map(|(_, a)| match a {
                    Answer::Stats(s) => s,
                    _ => Vec::new(),
                })
                .collect()
        })
    }

    fn control(&self, from: NodeId, app_id: &str, control: Control) {
        let msg = Msg::Control {
            n: from,
            a: app_id.to_owned(),
            c: control,
        };
        self.shared.send_msg(self.shared.all(), &msg);
    }
}

impl LastEvent for Engine {
    fn cached(
        &self,
        _from: NodeId,
        app_id: &str,
        ns: Namespace,
        channel: &str,
    ) -> BoxFuture<Option<(Publication, Duration)>> {
        let sh = self.shared.clone();
        let app = app_id.to_owned();
        let channel = ChannelId(ns, channel.to_owned());
        Box::pin(async move {
            let now = now_ms();
            sh.ask(app, Query::Cached(channel), None)
                .await
                .into_iter()
                .filter_map(|(_, a)| match a {
                    Answer::Cached(c) => c,
                    _ => None,
                })
                .max_by_key(|(at, _)| *at)
                .map(|(at, p)| (p, Duration::from_millis(now.saturating_sub(at))))
        })
    }
}

impl Counts for Engine {
    fn counts(&self, node: NodeId, app_id: &str, ns: Namespace, counts: Vec<(String, usize)>) {
        let sh = &self.shared;
        for (channel, c) in counts {
            let subject = sh.channel_subject(app_id, ns, &channel);
            let msg = Msg::Count {
                n: node,
                a: app_id.to_owned(),
                ns,
                ch: channel,
                c,
            };
            sh.send_msg(subject, &msg);
        }
    }
}
