//! The in-process broker, Herald's default. With one node there is nobody
//! else to tell; several nodes created in one process (the multi-node tests)
//! share one instance and form a real cluster through it: publications go
//! as bytes to interested nodes only, presence is kept here with per-node
//! heartbeats, queries and control messages reach every node.
//!
//! Nothing is called while the engine's lock is held: inboxes call back
//! into hubs, which may call the broker again.

use super::{
    Cluster, Control, Counts, Full, Inbox, LastEvent, Occupancy, Presence, PresenceChange, PubSub,
    Queries, RemoteMember, Scope, Streams,
};
use crate::future::BoxFuture;
use crate::hub::{prefixes, ChannelStats, StatsFilter};
use crate::namespace::{ChannelId, Namespace};
use crate::observer::Change;
use crate::publication::{NodeId, Publication};
use parking_lot::Mutex;
use serde_json::value::RawValue;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default time a node may go without a heartbeat.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

type Members = HashMap<String, HashMap<NodeId, Option<Box<RawValue>>>>;

#[derive(Default)]
struct State {
    inboxes: HashMap<NodeId, Arc<dyn Inbox>>,
    /// (app, channel or prefix, is a pattern) → interested nodes.
    interest: HashMap<(String, ChannelId, bool), HashSet<NodeId>>,
    /// (app, scope) → user → node → info.
    presence: HashMap<(String, Scope), Members>,
    /// (app, channel) → nodes with subscribers to it.
    occupied: HashMap<(String, ChannelId), HashSet<NodeId>>,
    /// (app, channel, user) → nodes where the member has a socket, as
    /// [`Broker::member`] reported them.
    joined: HashMap<(String, ChannelId, String), HashSet<NodeId>>,
    heartbeats: HashMap<NodeId, Instant>,
}

pub struct LocalBroker {
    state: Mutex<State>,
    ttl: Duration,
}

impl Default for LocalBroker {
    fn default() -> Self {
        LocalBroker::new()
    }
}

impl LocalBroker {
    pub fn new() -> LocalBroker {
        LocalBroker::with_ttl(DEFAULT_TTL)
    }

    pub fn with_ttl(ttl: Duration) -> LocalBroker {
        LocalBroker {
            state: Mutex::new(State::default()),
            ttl,
        }
    }

    /// Every node's inbox but `from`'s.
    fn others(&self, from: NodeId) -> Vec<Arc<dyn Inbox>> {
        let s = self.state.lock();
        s.inboxes
            .iter()
            .filter(|(n, _)| **n != from)
            .map(|(_, i)| i.clone())
            .collect()
    }

    /// Nodes interested in an exact channel (tests and diagnostics).
    pub fn interested(&self, app_id: &str, ns: Namespace, channel: &str) -> Vec<NodeId> {
        let s = self.state.lock();
        let key = ChannelId(ns, channel.to_owned());
        let mut v: Vec<NodeId> = s
            .interest
            .get(&(app_id.to_owned(), key, false))
            .map(|n| n.iter().copied().collect())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// Inboxes of the nodes (other than `origin`) that should hear about
    /// `scope` in `app`: interested nodes for a channel, everyone for users.
    fn audience(s: &State, app: &str, scope: &Scope, origin: NodeId) -> Vec<Arc<dyn Inbox>> {
        let nodes: Vec<NodeId> = match scope {
            Scope::Users => s.inboxes.keys().copied().collect(),
            Scope::Channel(c) => s
                .interest
                .get(&(app.to_owned(), c.clone(), false))
                .map(|n| n.iter().copied().collect())
                .unwrap_or_default(),
        };
        nodes
            .into_iter()
            .filter(|n| *n != origin)
            .filter_map(|n| s.inboxes.get(&n).cloned())
            .collect()
    }

    /// Remove node `node` and tell the others its members left.
    fn forget(&self, node: NodeId) {
        let mut leaves = Vec::new();
        let mut emptied = Vec::new();
        let reporter;
        {
            let mut s = self.state.lock();
            s.inboxes.remove(&node);
            s.heartbeats.remove(&node);
            for nodes in s.interest.values_mut() {
                nodes.remove(&node);
            }
            s.interest.retain(|_, n| !n.is_empty());
            // What the node's departure empties, reported once, by the
            // remaining node with the lowest id.
            for ((app, channel), nodes) in s.occupied.iter_mut() {
                if nodes.remove(&node) && nodes.is_empty() {
                    emptied.push((app.clone(), channel.clone(), None));
                }
            }
            s.occupied.retain(|_, n| !n.is_empty());
            for ((app, channel, user), nodes) in s.joined.iter_mut() {
                if nodes.remove(&node) && nodes.is_empty() {
                    emptied.push((app.clone(), channel.clone(), Some(user.clone())));
                }
            }
            s.joined.retain(|_, n| !n.is_empty());
            reporter = s
                .inboxes
                .iter()
                .min_by_key(|(n, _)| **n)
                .map(|(_, i)| i.clone());
            let mut gone = Vec::new();
            for ((app, scope), users) in s.presence.iter_mut() {
                for (user, nodes) in users.iter_mut() {
                    if nodes.remove(&node).is_some() {
                        gone.push((app.clone(), scope.clone(), user.clone()));
                    }
                }
                users.retain(|_, n| !n.is_empty());
            }
            s.presence.retain(|_, u| !u.is_empty());
            for (app, scope, user) in gone {
                let to = Self::audience(&s, &app, &scope, node);
                leaves.push((
                    app,
                    PresenceChange {
                        scope,
                        node,
                        user_id: user,
                        joined: None,
                    },
                    to,
                ));
            }
        }
        for (app, change, to) in leaves {
            for inbox in to {
                inbox.presence(&app, &change);
            }
        }
        if let Some(inbox) = reporter {
            for (app, ChannelId(ns, channel), user) in &emptied {
                let change = match user {
                    None => Change::Vacated { channel },
                    Some(user_id) => Change::MemberRemoved { channel, user_id },
                };
                inbox.observed_gone(app, *ns, &change);
            }
        }
        let others: Vec<Arc<dyn Inbox>> = self.state.lock().inboxes.values().cloned().collect();
        for inbox in others {
            inbox.node_gone(node);
        }
    }

    /// Every other node's connections per app, summed, told to each node.
    fn share_connections(&self) {
        let inboxes: Vec<(NodeId, Arc<dyn Inbox>)> = {
            let s = self.state.lock();
            s.inboxes.iter().map(|(n, i)| (*n, i.clone())).collect()
        };
        if inboxes.len() < 2 {
            return;
        }
        let loads: Vec<(NodeId, Vec<(String, u32)>)> =
            inboxes.iter().map(|(n, i)| (*n, i.connections())).collect();
        for (n, inbox) in &inboxes {
            let mut sums: HashMap<&str, u32> = HashMap::new();
            for (m, load) in &loads {
                if m == n {
                    continue;
                }
                for (app, c) in load {
                    *sums.entry(app).or_default() += c;
                }
            }
            for (app, c) in sums {
                inbox.remote_connections(app, c);
            }
        }
    }
}

impl Cluster for LocalBroker {
    fn name(&self) -> &'static str {
        "local"
    }

    fn attach(&self, node: NodeId, inbox: Arc<dyn Inbox>) {
        let mut s = self.state.lock();
        s.inboxes.insert(node, inbox);
        s.heartbeats.insert(node, Instant::now());
    }

    fn detach(&self, node: NodeId) {
        self.forget(node);
    }

    fn heartbeat(&self, node: NodeId) {
        let expired: Vec<NodeId> = {
            let mut s = self.state.lock();
            let now = Instant::now();
            if s.inboxes.contains_key(&node) {
                s.heartbeats.insert(node, now);
            }
            s.heartbeats
                .iter()
                .filter(|(_, at)| now.duration_since(**at) > self.ttl)
                .map(|(n, _)| *n)
                .collect()
        };
        for n in expired {
            tracing::warn!(node = n, "node missed its heartbeats; removing its members");
            self.forget(n);
        }
        self.share_connections();
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }
}

impl PubSub for LocalBroker {
    fn publish(&self, app_id: &str, p: &Publication) -> Result<(), Full> {
        let to: Vec<Arc<dyn Inbox>> = {
            let s = self.state.lock();
            if s.inboxes.len() < 2 {
                return Ok(());
            }
            let nodes: HashSet<NodeId> = if p.to_user.is_some() {
                s.inboxes.keys().copied().collect()
            } else {
                let key = |c: &str| ChannelId(p.ns, c.to_owned());
                let exact = s.interest.get(&(app_id.to_owned(), key(&p.channel), false));
                let mut nodes: HashSet<NodeId> = exact.cloned().unwrap_or_default();
                for prefix in prefixes(&p.channel) {
                    if let Some(n) = s.interest.get(&(app_id.to_owned(), key(prefix), true)) {
                        nodes.extend(n);
                    }
                }
                nodes
            };
            nodes
                .into_iter()
                .filter(|n| *n != p.origin)
                .filter_map(|n| s.inboxes.get(&n).cloned())
                .collect()
        };
        if to.is_empty() {
            return Ok(());
        }
        // Bytes, as a networked engine would carry them.
        let bytes = p.to_bytes();
        for inbox in to {
            if let Ok(copy) = Publication::from_bytes(&bytes) {
                inbox.publication(app_id, copy);
            }
        }
        Ok(())
    }

    fn interest(
        &self,
        node: NodeId,
        app_id: &str,
        ns: Namespace,
        channel: &str,
        pattern: bool,
        on: bool,
    ) {
        let mut s = self.state.lock();
        let key = (
            app_id.to_owned(),
            ChannelId(ns, channel.to_owned()),
            pattern,
        );
        if on {
            s.interest.entry(key).or_default().insert(node);
        } else if let Some(nodes) = s.interest.get_mut(&key) {
            nodes.remove(&node);
            if nodes.is_empty() {
                s.interest.remove(&key);
            }
        }
    }
}

impl Presence for LocalBroker {
    fn presence(&self, app_id: &str, change: PresenceChange) {
        let to = {
            let mut s = self.state.lock();
            let key = (app_id.to_owned(), change.scope.clone());
            match &change.joined {
                Some(info) => {
                    s.presence
                        .entry(key)
                        .or_default()
                        .entry(change.user_id.clone())
                        .or_default()
                        .insert(change.node, info.clone());
                }
                None => {
                    if let Some(users) = s.presence.get_mut(&key) {
                        if let Some(nodes) = users.get_mut(&change.user_id) {
                            nodes.remove(&change.node);
                            if nodes.is_empty() {
                                users.remove(&change.user_id);
                            }
                        }
                        if users.is_empty() {
                            s.presence.remove(&key);
                        }
                    }
                }
            }
            Self::audience(&s, app_id, &change.scope, change.node)
        };
        for inbox in to {
            inbox.presence(app_id, &change);
        }
    }

    fn members(&self, app_id: &str, scope: &Scope, except: NodeId) -> BoxFuture<Vec<RemoteMember>> {
        let s = self.state.lock();
        let list: Vec<RemoteMember> = s
            .presence
            .get(&(app_id.to_owned(), scope.clone()))
            .map(|users| {
                users
                    .iter()
                    .flat_map(|(user, nodes)| {
                        nodes
                            .iter()
                            .filter(|(n, _)| **n != except)
                            .map(move |(n, info)| (*n, user.clone(), info.clone()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Box::pin(std::future::ready(list))
    }
}

impl Occupancy for LocalBroker {
    fn occupancy(
        &self,
        node: NodeId,
        app_id: &str,
        ns: Namespace,
        channel: &str,
        occupied: bool,
    ) -> BoxFuture<bool> {
        let mut s = self.state.lock();
        let key = (app_id.to_owned(), ChannelId(ns, channel.to_owned()));
        let flipped = if occupied {
            let nodes = s.occupied.entry(key).or_default();
            nodes.insert(node) && nodes.len() == 1
        } else {
            match s.occupied.get_mut(&key) {
                Some(nodes) => {
                    let last = nodes.remove(&node) && nodes.is_empty();
                    if nodes.is_empty() {
                        s.occupied.remove(&key);
                    }
                    last
                }
                None => false,
            }
        };
        Box::pin(std::future::ready(flipped))
    }

    fn member(
        &self,
        node: NodeId,
        app_id: &str,
        ns: Namespace,
        channel: &str,
        user_id: &str,
        joined: bool,
    ) -> BoxFuture<bool> {
        let mut s = self.state.lock();
        let channel = ChannelId(ns, channel.to_owned());
        let key = (app_id.to_owned(), channel, user_id.to_owned());
        let flipped = if joined {
            let nodes = s.joined.entry(key).or_default();
            nodes.insert(node) && nodes.len() == 1
        } else {
            match s.joined.get_mut(&key) {
                Some(nodes) => {
                    let last = nodes.remove(&node) && nodes.is_empty();
                    if nodes.is_empty() {
                        s.joined.remove(&key);
                    }
                    last
                }
                None => false,
            }
        };
        Box::pin(std::future::ready(flipped))
    }
}

impl Queries for LocalBroker {
    fn query(
        &self,
        from: NodeId,
        app_id: &str,
        ns: Option<Namespace>,
        filter: StatsFilter,
    ) -> BoxFuture<Vec<ChannelStats>> {
        let others = self.others(from);
        let answers = others
            .iter()
            .flat_map(|i| i.stats(app_id, ns, &filter))
            .collect();
        Box::pin(std::future::ready(answers))
    }

    fn control(&self, from: NodeId, app_id: &str, control: Control) {
        let others = self.others(from);
        for inbox in others {
            inbox.control(app_id, &control);
        }
    }
}

impl LastEvent for LocalBroker {
    fn cached(
        &self,
        from: NodeId,
        app_id: &str,
        ns: Namespace,
        channel: &str,
    ) -> BoxFuture<Option<(Publication, Duration)>> {
        let others = self.others(from);
        let newest = others
            .iter()
            .filter_map(|i| i.cached(app_id, ns, channel))
            .min_by_key(|(_, age)| *age);
        Box::pin(std::future::ready(newest))
    }
}

/// History and sessions in this process: the trait's defaults.
impl Streams for LocalBroker {}

impl Counts for LocalBroker {
    fn counts(&self, node: NodeId, app_id: &str, ns: Namespace, counts: Vec<(String, usize)>) {
        for (channel, count) in counts {
            let to = {
                let s = self.state.lock();
                let scope = Scope::Channel(ChannelId(ns, channel.clone()));
                Self::audience(&s, app_id, &scope, node)
            };
            for inbox in to {
                inbox.count(app_id, ns, &channel, node, count);
            }
        }
    }
}
