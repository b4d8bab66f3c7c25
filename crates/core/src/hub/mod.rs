//! The hub: one per app, holding this node's state for it: which
//! connection is subscribed to what (exact channels and trailing-wildcard
//! patterns), presence members (local and, as the broker reports them, on
//! other nodes), cache slots, signed-in users and their watchers, and the
//! app's connection count.
//!
//! Channels live in namespaces, one per protocol (see
//! [`crate::namespace`]): each namespace's channels are a [`space`] of their
//! own, so protocols never meet in the hub and nothing filters by prefix.
//! The hub finds a publication's space once per publication (a scan of a
//! handful of entries), never per subscriber.
//!
//! The hub is protocol-neutral: it never parses a channel name. An adapter
//! decides what a name means (its kind, its auth) and passes what the hub
//! must know in [`SubscribeOptions`]. The hub does not talk to the broker
//! either; what a change means for the cluster (first subscriber here, a
//! member's first socket here) is returned to the node, which passes it on.
//!
//! Registries are sharded maps (`DashMap`), so connections on different
//! channels never contend on one lock. A lock is held while queueing frames
//! that must stay in order relative to each other (`Subscribed`, a cache
//! replay, `MemberAdded`), never for a publication's whole fan-out: that
//! takes a snapshot of the subscriber list (rebuilt only after a change)
//! and runs on a fan-out worker.

pub mod cache;
mod channel;
mod counts;
pub mod presence;
mod remote;
mod space;
pub mod users;

pub use channel::prefixes;

use crate::config::AppConfig;
use crate::connection::Connection;
use crate::fanout::Target;
use crate::namespace::Namespace;
use crate::publication::{NodeId, Publication, Tag};
use parking_lot::RwLock;
use presence::Member;
use space::Space;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

impl Live {
    fn new(app: AppConfig, closing: CancellationToken) -> Live {
        // Checked at load; a list that does not parse (a hub built in a
        // test from an unchecked config) lets no browser in.
        let origins = crate::origin::AllowedOrigins::parse(&app.allowed_origins)
            .unwrap_or_else(|_| crate::origin::AllowedOrigins::none());
        Live {
            app,
            origins,
            closing,
        }
    }
}

/// Why the core refused something. Each adapter maps these to its codes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    OverLimit(String),
    #[error("{0}")]
    NotFound(String),
    /// Not now, try again: the cluster's broker did not hold the
    /// subscription's interest within `broker.confirm_timeout` (a
    /// confirmation would not be true). Each adapter answers with its
    /// protocol's retryable error.
    #[error("{0}")]
    Unavailable(String),
}

/// What a subscription is, decided by the adapter.
#[derive(Debug, Default)]
pub struct SubscribeOptions {
    /// What makes this subscription's frames differ (empty for Pusher).
    pub tag: Tag,
    /// `channel` is a prefix: the subscription receives every channel that
    /// starts with it at a `/` boundary (`/ns/a/` matches `/ns/a/b/c`).
    pub pattern: bool,
    /// Join the channel's presence as this member.
    pub member: Option<Member>,
    /// Most members the channel may have (for `member`).
    pub max_members: usize,
    /// Replay the channel's last cached publication (or `CacheMiss`).
    pub cache: bool,
    /// Track and push the channel's subscription count.
    pub count: bool,
}

/// What a subscribe changed, for the node to tell the cluster.
#[derive(Debug, Default)]
pub struct Joined {
    /// False when the connection was already subscribed (confirmed again).
    pub new: bool,
    /// The channel had no subscriber on this node before.
    pub first_here: bool,
    /// The member's first socket on this node joined.
    pub member_joined: Option<(String, Option<Box<serde_json::value::RawValue>>)>,
    /// The member was nowhere in the channel (as this node knows the
    /// cluster's members) and now is: this socket added it.
    pub member_added: bool,
    /// The subscriber asked for the channel's last event and there was none.
    pub cache_miss: bool,
}

/// What an unsubscribe changed, for the node to tell the cluster.
#[derive(Debug, Default, PartialEq)]
pub struct Left {
    pub was_subscribed: bool,
    /// The channel has no subscriber on this node any more.
    pub last_here: bool,
    /// The member's last socket on this node left.
    pub member_left: Option<String>,
    /// ... and it has no socket in the channel anywhere now.
    pub member_removed: bool,
}

/// One channel's figures on this node, for queries.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChannelStats {
    /// The namespace the channel is in.
    pub ns: Namespace,
    pub name: String,
    pub subscriptions: usize,
    /// Presence members with a socket on this node.
    pub users: Vec<String>,
}

/// What never changes about an app while it runs: its id (an app whose
/// id changes is another app).
#[derive(Debug)]
pub struct Ident {
    pub id: String,
}

/// An app's settings as they are now: replaced whole when the app changes
/// (a SIGHUP, the database), read through [`Hub::config`].
#[derive(Debug)]
pub struct Live {
    pub app: AppConfig,
    /// `app.allowed_origins`, parsed.
    pub origins: crate::origin::AllowedOrigins,
    /// Cancelled when the app is disabled or removed: every session of
    /// it watches this (a child of the node's shutdown signal) and closes
    /// with its protocol's code. A re-enabled app gets a new one.
    pub closing: CancellationToken,
}

impl std::ops::Deref for Live {
    type Target = AppConfig;
    fn deref(&self) -> &AppConfig {
        &self.app
    }
}

pub struct Hub {
    /// The app's identity; its settings are [`Hub::config`].
    pub app: Ident,
    live: RwLock<Arc<Live>>,
    /// One space per namespace used on this node, created on first use and
    /// kept (a handful: one or two per protocol).
    spaces: RwLock<Vec<Arc<Space>>>,
    /// Cache channels' last events, within the app's byte budget (shared
    /// by every namespace of the app).
    pub cache: cache::Cache,
    pub users: users::Users,
    connections: AtomicU32,
    /// Connections on the other nodes (from their heartbeats).
    remote_connections: AtomicU32,
}

impl Hub {
    /// A hub whose sessions close when `shutdown` (the node's) is cancelled.
    pub fn new(app: AppConfig) -> Hub {
        Hub::with_shutdown(app, &CancellationToken::new())
    }

    /// A hub whose sessions also close when `shutdown` (the node's) is
    /// cancelled.
    pub fn with_shutdown(app: AppConfig, shutdown: &CancellationToken) -> Hub {
        let cache = cache::Cache::new(Duration::from_secs(app.cache_ttl), app.max_cache_bytes);
        Hub {
            app: Ident { id: app.id.clone() },
            live: RwLock::new(Arc::new(Live::new(app, shutdown.child_token()))),
            spaces: RwLock::new(Vec::new()),
            cache,
            users: users::Users::default(),
            connections: AtomicU32::new(0),
            remote_connections: AtomicU32::new(0),
        }
    }

    /// The app's settings now (credentials, limits, origins): read them
    /// per use, never keep them: the app may change while it runs.
    pub fn config(&self) -> Arc<Live> {
        self.live.read().clone()
    }

    /// Apply changed settings (same id): new work uses them from now on.
    /// An app disabled by the change closes its sessions (see
    /// [`Live::closing`]); one enabled again takes new ones.
    pub fn set_config(&self, app: AppConfig, shutdown: &CancellationToken) {
        let mut live = self.live.write();
        let closing = match (live.app.enabled, app.enabled) {
            (true, false) => {
                live.closing.cancel();
                live.closing.clone()
            }
            (false, true) => shutdown.child_token(),
            _ => live.closing.clone(),
        };
        *live = Arc::new(Live::new(app, closing));
    }

    /// The app was removed: refuse everything from now on and close its
    /// sessions.
    pub fn close(&self) {
        let mut live = self.live.write();
        live.closing.cancel();
        let mut app = live.app.clone();
        app.enabled = false;
        *live = Arc::new(Live::new(app, live.closing.clone()));
    }

    // ----- connections -----------------------------------------------------

    /// Count a new connection, or refuse it (app disabled or over quota).
    /// The quota counts the other nodes' connections as their last
    /// heartbeats reported them.
    pub fn admit(&self) -> Result<(), Refused> {
        let live = self.config();
        if !live.enabled {
            return Err(Refused::Unauthorized("App is disabled".into()));
        }
        let max = live.max_connections;
        let elsewhere = self.remote_connections.load(Ordering::Acquire);
        self.connections
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (max == 0 || n.saturating_add(elsewhere) < max).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|_| Refused::OverLimit(format!("App is over its connection quota ({max})")))
    }

    /// Undo [`Hub::admit`] when a connection ends.
    pub fn release(&self) {
        self.connections.fetch_sub(1, Ordering::AcqRel);
    }

    pub fn connection_count(&self) -> u32 {
        self.connections.load(Ordering::Acquire)
    }

    /// The other nodes hold `count` of this app's connections.
    pub fn set_remote_connections(&self, count: u32) {
        self.remote_connections.store(count, Ordering::Release);
    }

    // ----- namespaces ------------------------------------------------------

    /// `ns`'s space, if anything on this node used it.
    fn space(&self, ns: Namespace) -> Option<Arc<Space>> {
        self.spaces.read().iter().find(|s| s.ns == ns).cloned()
    }

    /// `ns`'s space, created on first use.
    fn space_or_new(&self, ns: Namespace) -> Arc<Space> {
        if let Some(s) = self.space(ns) {
            return s;
        }
        let mut spaces = self.spaces.write();
        if let Some(s) = spaces.iter().find(|s| s.ns == ns) {
            return s.clone();
        }
        let s = Arc::new(Space::new(ns));
        spaces.push(s.clone());
        s
    }

    fn all_spaces(&self) -> Vec<Arc<Space>> {
        self.spaces.read().clone()
    }

    /// The namespaces used on this node.
    pub fn namespaces(&self) -> Vec<Namespace> {
        self.spaces.read().iter().map(|s| s.ns).collect()
    }

    // ----- subscriptions ---------------------------------------------------

    /// Subscribe `conn` to `channel` of namespace `ns`. Queues `Subscribed`
    /// (with the member list on presence channels) and, for cache
    /// channels, the last event or `CacheMiss`, and tells the other
    /// subscribers about a new member.
    pub fn subscribe(
        &self,
        conn: &Arc<Connection>,
        ns: Namespace,
        channel: &str,
        opts: SubscribeOptions,
    ) -> Result<Joined, Refused> {
        self.space_or_new(ns)
            .subscribe(&self.cache, conn, channel, opts)
    }

    /// Remove `conn`'s subscription (with `tag`) from `channel`.
    pub fn unsubscribe(
        &self,
        conn: &Connection,
        ns: Namespace,
        channel: &str,
        tag: &Tag,
        pattern: bool,
    ) -> Left {
        self.space(ns)
            .map(|s| s.unsubscribe(conn, channel, tag, pattern))
            .unwrap_or_default()
    }

    /// `None` if `conn` has no subscription to `channel` with `tag`;
    /// otherwise the presence user it joined as, if any.
    pub fn subscription(
        &self,
        conn: &Connection,
        ns: Namespace,
        channel: &str,
        tag: &Tag,
    ) -> Option<Option<Arc<str>>> {
        self.space(ns)?.subscription(conn, channel, tag)
    }

    /// Whether `channel` (or the pattern) has a subscriber on this node.
    pub fn has_subscribers(&self, ns: Namespace, channel: &str, pattern: bool) -> bool {
        self.space(ns).is_some_and(|s| {
            s.map(pattern)
                .get(channel)
                .is_some_and(|c| !c.subs.is_empty())
        })
    }

    /// Whether this node holds state (subscribers, presence) for `channel`.
    pub fn has_channel(&self, ns: Namespace, channel: &str) -> bool {
        self.space(ns)
            .is_some_and(|s| s.channels.contains_key(channel))
    }

    // ----- presence from other nodes ----------------------------------------

    /// A member joined (`Some(info)`) or left (`None`) on node `node`.
    /// Applied only to channels with subscribers here (the broker sends a
    /// node presence only for channels it is interested in).
    pub fn remote_member(
        &self,
        ns: Namespace,
        channel: &str,
        node: NodeId,
        user_id: &str,
        joined: Option<Option<Box<serde_json::value::RawValue>>>,
    ) {
        if let Some(s) = self.space(ns) {
            s.remote_member(channel, node, user_id, joined);
        }
    }

    /// Start learning a channel's members on other nodes: creates its
    /// entry (before the node registers interest), so that members joining
    /// and leaving elsewhere meanwhile are applied, and a member that left
    /// while the snapshot was on its way is not brought back by it.
    pub fn begin_sync(&self, ns: Namespace, channel: &str) {
        self.space_or_new(ns).begin_sync(channel)
    }

    /// Seed a channel's members on other nodes (the broker's snapshot)
    /// before its first subscriber here is confirmed. Creates the channel's
    /// entry; it is dropped again if nobody subscribes.
    pub fn seed_members(
        &self,
        ns: Namespace,
        channel: &str,
        members: Vec<(NodeId, String, Option<Box<serde_json::value::RawValue>>)>,
    ) {
        self.space_or_new(ns).seed_members(channel, members)
    }

    /// Whether the members of `channel` on other nodes are being fetched
    /// (see [`Hub::begin_sync`]).
    pub fn is_syncing(&self, ns: Namespace, channel: &str) -> bool {
        self.space(ns).is_some_and(|s| s.is_syncing(channel))
    }

    /// The members of presence channel `channel` as this node knows the
    /// cluster's (its own and, while it has a subscriber there, the other
    /// nodes'): how many there are, and at most `max` of them with their
    /// info. `None` when this node holds no state for the channel.
    pub fn members(
        &self,
        ns: Namespace,
        channel: &str,
        max: usize,
    ) -> Option<(usize, Vec<presence::Record>)> {
        let space = self.space(ns)?;
        let ch = space.channels.get(channel)?;
        let visible = ch.members.iter().filter(|(_, m)| m.visible());
        let total = visible.clone().count();
        let records = visible
            .take(max)
            .map(|(id, m)| (id.to_string(), m.info.clone()))
            .collect();
        Some((total, records))
    }

    /// Drop a seeded entry nobody subscribed to.
    pub fn drop_if_unused(&self, ns: Namespace, channel: &str) -> bool {
        self.space(ns).is_some_and(|s| s.drop_if_unused(channel))
    }

    // ----- subscription counts ---------------------------------------------

    /// Send the count (this node's plus the other nodes') of every channel
    /// whose count changed since the last call (run periodically), one
    /// result per namespace. `me` is this node: of the nodes with
    /// subscribers to a channel, the one with the lowest id reports its
    /// count to observers.
    pub fn flush_subscription_counts(&self, me: NodeId) -> Vec<FlushedCounts> {
        self.all_spaces()
            .iter()
            .map(|s| s.flush_counts(me))
            .collect()
    }

    /// Node `node` has `count` subscriptions to `channel`. A node not
    /// heard from before on this channel also gets this node's count.
    pub fn remote_count(&self, ns: Namespace, channel: &str, node: NodeId, count: usize) {
        if let Some(s) = self.space(ns) {
            s.remote_count(channel, node, count);
        }
    }

    /// Forget the subscription counts node `node` reported.
    pub fn forget_node(&self, node: NodeId) {
        self.all_spaces().iter().for_each(|s| s.forget_node(node));
    }

    // ----- publishing --------------------------------------------------------

    /// The subscriber lists `p` goes to on this node: its channel's, and
    /// every pattern's that matches it, in its namespace. Stores `p` as
    /// the channel's last event first when it is cached, under the
    /// channel's lock, so a subscriber joining meanwhile gets it once
    /// (replayed or delivered).
    pub fn targets(&self, p: &Arc<Publication>) -> Vec<Arc<[Target]>> {
        match (p.cache, self.space(p.ns)) {
            (_, Some(s)) => s.targets(&self.cache, p),
            (true, None) => self.space_or_new(p.ns).targets(&self.cache, p),
            (false, None) => Vec::new(),
        }
    }

    /// This node's cached publication of `channel` within the TTL, and
    /// its age.
    pub fn cached(&self, ns: Namespace, channel: &str) -> Option<(Arc<Publication>, Duration)> {
        self.cache.get(ns, channel)
    }

    /// Keep a cached publication another node holds (published `age` ago)
    /// unless this node has a newer one.
    pub fn seed_cache(&self, publication: Publication, age: Duration) {
        self.cache.seed(publication, age);
    }

    /// Free cache slots older than the TTL (run periodically, so slots of
    /// channels nobody touches again do not stay).
    pub fn expire_cache(&self) {
        self.cache.expire();
    }

    // ----- queries -----------------------------------------------------------

    /// Channels (and patterns) with subscribers on this node, and their
    /// subscriptions, per namespace. A scan of every channel: for scrapes,
    /// not hot paths.
    pub fn namespace_figures(&self) -> Vec<(Namespace, usize, usize)> {
        self.all_spaces()
            .iter()
            .map(|s| {
                let (c, n) = s.figures();
                (s.ns, c, n)
            })
            .collect()
    }

    /// [`Hub::namespace_figures`] summed over the namespaces.
    pub fn channel_figures(&self) -> (usize, usize) {
        self.namespace_figures()
            .iter()
            .fold((0, 0), |(c, n), f| (c + f.1, n + f.2))
    }

    /// Figures for occupied channels of namespace `ns` (every namespace for
    /// `None`) whose names start with `prefix` (or for exactly `name`).
    pub fn stats(&self, ns: Option<Namespace>, filter: &StatsFilter) -> Vec<ChannelStats> {
        let mut out = Vec::new();
        for s in self.all_spaces() {
            if ns.is_none_or(|ns| ns == s.ns) {
                s.stats(filter, &mut out);
            }
        }
        out
    }
}

/// What a flush of subscription counts did.
#[derive(Debug)]
pub struct FlushedCounts {
    /// The namespace these channels are in.
    pub ns: Namespace,
    /// (channel, cluster-wide count) sent to this node's subscribers.
    pub sent: Vec<(String, usize)>,
    /// Those of `sent` this node reports to observers: it has the lowest
    /// id among the nodes with subscribers, so one node reports each.
    pub report: Vec<(String, usize)>,
    /// (channel, this node's count) for the other nodes.
    pub announce: Vec<(String, usize)>,
}

/// Which channels a stats query asks about.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum StatsFilter {
    Exact(String),
    Prefix(String),
}

#[cfg(test)]
mod tests;
