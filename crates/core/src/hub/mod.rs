//! The hub: one per app, holding this node's state for it: which
//! connection is subscribed to what (exact channels and trailing-wildcard
//! patterns), presence members (local and, as the broker reports them, on
//! other nodes), cache slots, signed-in users and their watchers, and the
//! app's connection count.
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
pub mod presence;
pub mod users;

use crate::config::AppConfig;
use crate::connection::{ConnId, Connection};
use crate::fanout::{NodeId, Publication, Tag, Target};
use crate::wire::{EncodeOnce, Event, MemberRef};
use dashmap::{DashMap, DashSet};
use presence::{Member, MemberState};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// One channel's subscribers and members on this node.
#[derive(Default)]
struct Channel {
    subs: HashMap<(ConnId, Tag), Sub>,
    /// The subscriber list fan-out reads, rebuilt after a change.
    snapshot: Option<Arc<[Target]>>,
    /// Presence members by user id (empty for other channels).
    members: HashMap<Arc<str>, MemberState>,
    /// Its subscription count is pushed to subscribers.
    count: bool,
    /// Subscriptions on other nodes, as they reported them.
    remote_counts: HashMap<NodeId, usize>,
    /// While the members on other nodes are being fetched: (node, user)
    /// pairs that left meanwhile, so the fetched list does not bring them
    /// back (see [`Hub::begin_sync`]).
    syncing: Option<Vec<(NodeId, Arc<str>)>>,
}

struct Sub {
    target: Target,
    /// The presence user this subscription joined as.
    user: Option<Arc<str>>,
}

impl Channel {
    fn snapshot(&mut self) -> Arc<[Target]> {
        self.snapshot
            .get_or_insert_with(|| self.subs.values().map(|s| s.target.clone()).collect())
            .clone()
    }

    fn send_to_all(&self, except: Option<ConnId>, event: &mut EncodeOnce<'_>) {
        for ((id, _), sub) in &self.subs {
            if Some(*id) != except {
                let t = &sub.target;
                if let Some(f) = event.frame(t.conn.wire, &t.tag) {
                    t.conn.send(f);
                }
            }
        }
    }

    fn member_list(&self) -> Vec<MemberRef<'_>> {
        self.members
            .iter()
            .filter(|(_, m)| m.visible())
            .map(|(id, m)| MemberRef {
                user_id: id,
                info: m.info.as_deref(),
            })
            .collect()
    }
}

/// One channel's figures on this node, for queries.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChannelStats {
    pub name: String,
    pub subscriptions: usize,
    /// Presence members with a socket on this node.
    pub users: Vec<String>,
}

pub struct Hub {
    pub app: AppConfig,
    channels: DashMap<String, Channel>,
    patterns: DashMap<String, Channel>,
    /// Pattern subscriptions on this hub: publishing skips the pattern
    /// index entirely while there are none.
    pattern_count: AtomicUsize,
    /// Cache channels' last events, within the app's byte budget.
    pub cache: cache::Cache,
    pub users: users::Users,
    /// Channels whose subscription count changed since the last flush.
    counts_changed: DashSet<String>,
    /// Channels whose count on this node the other nodes must hear.
    counts_announce: DashSet<String>,
    connections: AtomicU32,
    /// Connections on the other nodes (from their heartbeats).
    remote_connections: AtomicU32,
}

/// Which map a subscription lives in.
fn map_of(hub: &Hub, pattern: bool) -> &DashMap<String, Channel> {
    if pattern {
        &hub.patterns
    } else {
        &hub.channels
    }
}

impl Hub {
    pub fn new(app: AppConfig) -> Hub {
        let cache = cache::Cache::new(Duration::from_secs(app.cache_ttl), app.max_cache_bytes);
        Hub {
            app,
            channels: DashMap::new(),
            patterns: DashMap::new(),
            pattern_count: AtomicUsize::new(0),
            cache,
            users: users::Users::default(),
            counts_changed: DashSet::new(),
            counts_announce: DashSet::new(),
            connections: AtomicU32::new(0),
            remote_connections: AtomicU32::new(0),
        }
    }

    // ----- connections -----------------------------------------------------

    /// Count a new connection, or refuse it (app disabled or over quota).
    /// The quota counts the other nodes' connections as their last
    /// heartbeats reported them.
    pub fn admit(&self) -> Result<(), Refused> {
        if !self.app.enabled {
            return Err(Refused::Unauthorized("App is disabled".into()));
        }
        let max = self.app.max_connections;
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

    // ----- subscriptions ---------------------------------------------------

    /// Subscribe `conn` to `channel`. Queues `Subscribed` (with the member
    /// list on presence channels) and, for cache channels, the last event or
    /// `CacheMiss`, and tells the other subscribers about a new member.
    pub fn subscribe(
        &self,
        conn: &Arc<Connection>,
        channel: &str,
        opts: SubscribeOptions,
    ) -> Result<Joined, Refused> {
        let map = map_of(self, opts.pattern);
        let mut entry = map.entry(channel.to_owned()).or_default();
        let ch = entry.value_mut();
        let key = (conn.id, opts.tag.clone());
        if ch.subs.contains_key(&key) {
            // Already subscribed: confirm again, as retrying clients expect.
            send_subscribed(conn, &opts.tag, channel, ch, opts.member.is_some());
            return Ok(Joined::default());
        }
        let first_here = ch.subs.is_empty();
        if let Some(m) = &opts.member {
            let present = ch
                .members
                .get(m.user_id.as_str())
                .is_some_and(|s| s.visible());
            let count = ch.members.values().filter(|s| s.visible()).count();
            if !present && count >= opts.max_members {
                drop(entry);
                map.remove_if(channel, |_, c| c.subs.is_empty() && c.members.is_empty());
                return Err(Refused::OverLimit(format!(
                    "presence channel is full ({} members)",
                    opts.max_members
                )));
            }
        }
        let mut joined = Joined {
            new: true,
            first_here,
            ..Joined::default()
        };
        let mut added = false;
        let user = opts.member.map(|m| {
            let id: Arc<str> = Arc::from(m.user_id.as_str());
            let state = ch
                .members
                .entry(id.clone())
                .or_insert_with(|| MemberState::new(m.info.clone()));
            added = !state.visible();
            state.local += 1;
            if state.local == 1 {
                joined.member_joined = Some((m.user_id, m.info));
            }
            id
        });
        ch.subs.insert(
            key,
            Sub {
                target: Target {
                    conn: conn.clone(),
                    tag: opts.tag.clone(),
                },
                user: user.clone(),
            },
        );
        ch.snapshot = None;
        send_subscribed(conn, &opts.tag, channel, ch, user.is_some());
        if let (true, Some(uid)) = (added, &user) {
            let info = ch.members.get(uid).and_then(|m| m.info.as_deref());
            let mut event = EncodeOnce::new(Event::MemberAdded {
                channel,
                member: MemberRef { user_id: uid, info },
            });
            ch.send_to_all(Some(conn.id), &mut event);
        }
        joined.member_added = added;
        if opts.pattern {
            self.pattern_count.fetch_add(1, Ordering::AcqRel);
        }
        if opts.cache {
            joined.cache_miss = !self.replay_cache(conn, &opts.tag, channel);
        }
        if opts.count {
            ch.count = true;
            drop(entry);
            self.count_changed(channel);
        }
        Ok(joined)
    }

    /// Remove `conn`'s subscription (with `tag`) from `channel`.
    pub fn unsubscribe(&self, conn: &Connection, channel: &str, tag: &Tag, pattern: bool) -> Left {
        let map = map_of(self, pattern);
        let Some(mut entry) = map.get_mut(channel) else {
            return Left::default();
        };
        let ch = entry.value_mut();
        let Some(sub) = ch.subs.remove(&(conn.id, tag.clone())) else {
            return Left::default();
        };
        ch.snapshot = None;
        let mut left = Left {
            was_subscribed: true,
            ..Left::default()
        };
        if let Some(uid) = sub.user.as_deref() {
            if let Some(m) = ch.members.get_mut(uid) {
                m.local -= 1;
                if m.local == 0 {
                    left.member_left = Some(uid.to_owned());
                    if !m.visible() {
                        left.member_removed = true;
                        ch.members.remove(uid);
                        let mut event = EncodeOnce::new(Event::MemberRemoved {
                            channel,
                            user_id: uid,
                        });
                        ch.send_to_all(None, &mut event);
                    }
                }
            }
        }
        left.last_here = ch.subs.is_empty();
        let count = ch.count;
        drop(entry);
        if count && left.last_here {
            // The others hear this node has none left (no push: nobody here).
            self.counts_announce.insert(channel.to_owned());
        } else if count {
            self.count_changed(channel);
        }
        if pattern {
            self.pattern_count.fetch_sub(1, Ordering::AcqRel);
        }
        if left.last_here {
            map.remove_if(channel, |_, c| c.subs.is_empty());
        }
        left
    }

    /// `None` if `conn` has no subscription to `channel` with `tag`;
    /// otherwise the presence user it joined as, if any.
    pub fn subscription(
        &self,
        conn: &Connection,
        channel: &str,
        tag: &Tag,
    ) -> Option<Option<Arc<str>>> {
        self.channels
            .get(channel)
            .and_then(|c| c.subs.get(&(conn.id, tag.clone())).map(|s| s.user.clone()))
    }

    // ----- presence from other nodes ----------------------------------------

    /// A member joined (`Some(info)`) or left (`None`) on node `node`.
    /// Applied only to channels with subscribers here (the broker sends a
    /// node presence only for channels it is interested in).
    pub fn remote_member(
        &self,
        channel: &str,
        node: NodeId,
        user_id: &str,
        joined: Option<Option<Box<serde_json::value::RawValue>>>,
    ) {
        let Some(mut entry) = self.channels.get_mut(channel) else {
            return;
        };
        let ch = entry.value_mut();
        if let Some(gone) = &mut ch.syncing {
            gone.retain(|(n, u)| !(*n == node && **u == *user_id));
            if joined.is_none() {
                gone.push((node, Arc::from(user_id)));
            }
        }
        match joined {
            Some(info) => {
                let was = {
                    let state = ch
                        .members
                        .entry(Arc::from(user_id))
                        .or_insert_with(|| MemberState::new(info));
                    let was = state.visible();
                    if !state.remote.contains(&node) {
                        state.remote.push(node);
                    }
                    was
                };
                if !was {
                    let info = ch.members.get(user_id).and_then(|m| m.info.as_deref());
                    let mut event = EncodeOnce::new(Event::MemberAdded {
                        channel,
                        member: MemberRef { user_id, info },
                    });
                    ch.send_to_all(None, &mut event);
                }
            }
            None => {
                let Some(state) = ch.members.get_mut(user_id) else {
                    return;
                };
                state.remote.retain(|n| *n != node);
                if !state.visible() {
                    ch.members.remove(user_id);
                    let mut event = EncodeOnce::new(Event::MemberRemoved { channel, user_id });
                    ch.send_to_all(None, &mut event);
                }
            }
        }
    }

    /// Start learning a channel's members on other nodes: creates its
    /// entry (before the node registers interest), so that members joining
    /// and leaving elsewhere meanwhile are applied, and a member that left
    /// while the snapshot was on its way is not brought back by it.
    pub fn begin_sync(&self, channel: &str) {
        let mut entry = self.channels.entry(channel.to_owned()).or_default();
        if entry.subs.is_empty() && entry.syncing.is_none() {
            entry.syncing = Some(Vec::new());
        }
    }

    /// Seed a channel's members on other nodes (the broker's snapshot)
    /// before its first subscriber here is confirmed. Creates the channel's
    /// entry; it is dropped again if nobody subscribes.
    pub fn seed_members(
        &self,
        channel: &str,
        members: Vec<(NodeId, String, Option<Box<serde_json::value::RawValue>>)>,
    ) {
        let mut entry = self.channels.entry(channel.to_owned()).or_default();
        let gone = entry.syncing.take().unwrap_or_default();
        for (node, user, info) in members {
            if gone.iter().any(|(n, u)| *n == node && **u == *user) {
                continue;
            }
            let state = entry
                .members
                .entry(Arc::from(user.as_str()))
                .or_insert_with(|| MemberState::new(info));
            if !state.remote.contains(&node) {
                state.remote.push(node);
            }
        }
    }

    /// Whether the members of `channel` on other nodes are being fetched
    /// (see [`Hub::begin_sync`]).
    pub fn is_syncing(&self, channel: &str) -> bool {
        self.channels
            .get(channel)
            .is_some_and(|c| c.syncing.is_some())
    }

    /// Whether `channel` (or the pattern) has a subscriber on this node.
    pub fn has_subscribers(&self, channel: &str, pattern: bool) -> bool {
        map_of(self, pattern)
            .get(channel)
            .is_some_and(|c| !c.subs.is_empty())
    }

    /// Whether this node holds presence state for `channel`.
    pub fn has_channel(&self, channel: &str) -> bool {
        self.channels.contains_key(channel)
    }

    /// Drop a seeded entry nobody subscribed to.
    pub fn drop_if_unused(&self, channel: &str) -> bool {
        self.channels
            .remove_if(channel, |_, c| c.subs.is_empty())
            .is_some()
    }

    // ----- subscription counts ---------------------------------------------

    /// Note that `channel`'s count changed. Counts are sent in batches by
    /// [`Hub::flush_subscription_counts`]: sending on every change would make
    /// N clients joining one channel cost N² frames.
    fn count_changed(&self, channel: &str) {
        if !self.counts_changed.contains(channel) {
            self.counts_changed.insert(channel.to_owned());
        }
        if !self.counts_announce.contains(channel) {
            self.counts_announce.insert(channel.to_owned());
        }
    }

    /// Send the count (this node's plus the other nodes') of every channel
    /// whose count changed since the last call (run periodically). `me` is
    /// this node: of the nodes with subscribers to a channel, the one with
    /// the lowest id reports its count to observers.
    pub fn flush_subscription_counts(&self, me: NodeId) -> FlushedCounts {
        let changed: Vec<String> = self.counts_changed.iter().map(|c| c.clone()).collect();
        let announce: Vec<String> = self.counts_announce.iter().map(|c| c.clone()).collect();
        // Unmark before reading the count: a change after this point marks
        // the channel again and goes out with the next flush.
        for channel in &changed {
            self.counts_changed.remove(channel);
        }
        for channel in &announce {
            self.counts_announce.remove(channel);
        }
        let mut sent = Vec::new();
        let mut report = Vec::new();
        for channel in changed {
            if let Some(ch) = self.channels.get(&channel) {
                if ch.subs.is_empty() || !ch.count {
                    continue;
                }
                let count = ch.subs.len() + ch.remote_counts.values().sum::<usize>();
                let mut event = EncodeOnce::new(Event::SubscriptionCount {
                    channel: &channel,
                    count,
                });
                ch.send_to_all(None, &mut event);
                let lowest = ch.remote_counts.keys().all(|n| me < *n);
                drop(ch);
                if lowest {
                    report.push((channel.clone(), count));
                }
                sent.push((channel, count));
            }
        }
        let announce = announce
            .into_iter()
            .map(|c| {
                let n = self.channels.get(&c).map_or(0, |ch| ch.subs.len());
                (c, n)
            })
            .collect();
        FlushedCounts {
            sent,
            report,
            announce,
        }
    }

    /// Node `node` has `count` subscriptions to `channel`. A node not
    /// heard from before on this channel also gets this node's count.
    pub fn remote_count(&self, channel: &str, node: NodeId, count: usize) {
        let Some(mut ch) = self.channels.get_mut(channel) else {
            return;
        };
        if !ch.count || ch.subs.is_empty() {
            return;
        }
        let new = if count == 0 {
            ch.remote_counts.remove(&node);
            false
        } else {
            ch.remote_counts.insert(node, count).is_none()
        };
        drop(ch);
        if !self.counts_changed.contains(channel) {
            self.counts_changed.insert(channel.to_owned());
        }
        if new && !self.counts_announce.contains(channel) {
            self.counts_announce.insert(channel.to_owned());
        }
    }

    /// Forget the subscription counts node `node` reported.
    pub fn forget_node(&self, node: NodeId) {
        let mut changed = Vec::new();
        for mut e in self.channels.iter_mut() {
            if e.remote_counts.remove(&node).is_some() {
                changed.push(e.key().clone());
            }
        }
        for c in changed {
            self.counts_changed.insert(c);
        }
    }

    // ----- publishing --------------------------------------------------------

    /// The subscriber lists `p` goes to on this node: its channel's, and
    /// every pattern's that matches it. Stores `p` as the channel's last
    /// event first when it is cached, under the channel's lock, so a
    /// subscriber joining meanwhile gets it once (replayed or delivered).
    pub fn targets(&self, p: &Arc<Publication>) -> Vec<Arc<[Target]>> {
        let mut out = Vec::with_capacity(1);
        if p.cache {
            let mut entry = self.channels.entry(p.channel.clone()).or_default();
            self.cache.put(&p.channel, p.clone());
            if !entry.subs.is_empty() {
                out.push(entry.snapshot());
            }
            let empty = entry.subs.is_empty();
            drop(entry);
            if empty {
                self.channels
                    .remove_if(&p.channel, |_, c| c.subs.is_empty() && c.members.is_empty());
            }
        } else if let Some(t) = snapshot_of(&self.channels, &p.channel) {
            out.push(t);
        }
        if self.pattern_count.load(Ordering::Acquire) > 0 {
            out.extend(prefixes(&p.channel).filter_map(|pre| snapshot_of(&self.patterns, pre)));
        }
        out
    }

    /// Queue the channel's last event, or `CacheMiss`; returns whether
    /// there was one.
    fn replay_cache(&self, conn: &Connection, tag: &Tag, channel: &str) -> bool {
        let hit = self.cache.get(channel).map(|(p, _)| p);
        let found = hit.is_some();
        let frame = match hit {
            Some(p) => Some(p.frame(conn.wire, tag)),
            None => conn
                .wire
                .event(&Event::CacheMiss { channel }, tag.as_deref().unwrap_or("")),
        };
        if let Some(f) = frame {
            conn.send(f);
        }
        found
    }

    /// This node's cached publication of `channel` within the TTL, and
    /// its age.
    pub fn cached(&self, channel: &str) -> Option<(Arc<Publication>, Duration)> {
        self.cache.get(channel)
    }

    /// Keep a cached publication another node holds (published `age` ago)
    /// unless this node has a newer one.
    pub fn seed_cache(&self, channel: &str, publication: Publication, age: Duration) {
        self.cache.seed(channel, publication, age);
    }

    /// Free cache slots older than the TTL (run periodically, so slots of
    /// channels nobody touches again do not stay).
    pub fn expire_cache(&self) {
        self.cache.expire();
    }

    // ----- queries -----------------------------------------------------------

    /// Channels (and patterns) with subscribers on this node, and their
    /// subscriptions. A scan of every channel: for scrapes, not hot paths.
    pub fn channel_figures(&self) -> (usize, usize) {
        let mut channels = 0;
        let mut subscriptions = 0;
        for map in [&self.channels, &self.patterns] {
            for c in map.iter() {
                if !c.subs.is_empty() {
                    channels += 1;
                    subscriptions += c.subs.len();
                }
            }
        }
        (channels, subscriptions)
    }

    /// Figures for occupied channels whose names start with `prefix` (or
    /// for exactly `name`).
    pub fn stats(&self, filter: &StatsFilter) -> Vec<ChannelStats> {
        let of = |name: &str, c: &Channel| ChannelStats {
            name: name.to_owned(),
            subscriptions: c.subs.len(),
            users: c
                .members
                .iter()
                .filter(|(_, m)| m.local > 0)
                .map(|(id, _)| id.to_string())
                .collect(),
        };
        match filter {
            StatsFilter::Exact(name) => self
                .channels
                .get(name)
                .filter(|c| !c.subs.is_empty())
                .map(|c| vec![of(name, &c)])
                .unwrap_or_default(),
            StatsFilter::Prefix(prefix) => self
                .channels
                .iter()
                .filter(|e| e.key().starts_with(prefix.as_str()) && !e.subs.is_empty())
                .map(|e| of(e.key(), e.value()))
                .collect(),
        }
    }
}

/// What a flush of subscription counts did.
#[derive(Debug, Default)]
pub struct FlushedCounts {
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

/// A channel's subscriber snapshot: under a shared lock when it is built
/// (the common case), rebuilt under the shard's write lock after a change.
fn snapshot_of(map: &DashMap<String, Channel>, name: &str) -> Option<Arc<[Target]>> {
    if let Some(ch) = map.get(name) {
        if ch.subs.is_empty() {
            return None;
        }
        if let Some(s) = &ch.snapshot {
            return Some(s.clone());
        }
    }
    let mut ch = map.get_mut(name)?;
    (!ch.subs.is_empty()).then(|| ch.snapshot())
}

fn send_subscribed(conn: &Connection, tag: &Tag, channel: &str, ch: &Channel, presence: bool) {
    let list;
    let members = if presence {
        list = ch.member_list();
        Some(list.as_slice())
    } else {
        None
    };
    if let Some(f) = conn.wire.event(
        &Event::Subscribed { channel, members },
        tag.as_deref().unwrap_or(""),
    ) {
        conn.send(f);
    }
}

/// The pattern prefixes that match `channel`: each prefix ending at a `/`,
/// shortest first (`/a/b/c` → `/`, `/a/`, `/a/b/`).
pub fn prefixes(channel: &str) -> impl Iterator<Item = &str> {
    channel
        .char_indices()
        .filter(|(_, c)| *c == '/')
        .map(move |(i, _)| &channel[..=i])
}

#[cfg(test)]
mod tests;
