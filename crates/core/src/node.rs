//! The node: one running Herald process. It owns the apps' hubs, the
//! broker, the fan-out workers, connection-id allocation and the lifecycle
//! flags (ready, draining) that the server and every session consult.
//!
//! The node routes. Adapters call it, not the hub, for anything the rest of
//! the cluster must hear about: a publication is delivered to this node's
//! subscribers at once and handed to the broker for the others; a channel's
//! first subscriber here registers interest; a member's first socket here
//! is announced as presence. What other nodes send comes back through the
//! node's [`Inbox`] and is applied to the hubs.

use crate::broker::{Broker, Control, Full, Inbox, PresenceChange, Scope};
use crate::config::Config;
use crate::connection::Connection;
use crate::fanout::{Fanout, Job};
use crate::hub::{ChannelStats, Hub, Joined, Left, Refused, StatsFilter, SubscribeOptions};
use crate::metrics;
use crate::namespace::{ChannelId, Namespace};
use crate::observer::{Change, Observer};
use crate::publication::{ConnId, NodeId, Position, Publication, Tag};
use crate::reliable::ReliableStreams;
use futures_util::FutureExt;
use parking_lot::RwLock;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// An observer, of every namespace (`None`) or of one.
type Observing = (Option<Namespace>, Arc<dyn Observer>);

pub struct Node {
    pub id: NodeId,
    pub config: Config,
    pub broker: Arc<dyn Broker>,
    /// The apps served now (see [`crate::apps`]).
    pub apps: crate::apps::Apps,
    /// Started on first use, inside the runtime.
    fanout: OnceLock<Fanout>,
    next_conn: AtomicU64,
    next_message: AtomicU64,
    ready: AtomicBool,
    /// Cancelled when the server starts draining; every session watches it.
    pub shutdown: CancellationToken,
    /// Told about occupancy, members, ... (see [`crate::observer`]): each
    /// of every namespace (`None`) or of one.
    observers: RwLock<Arc<[Observing]>>,
    /// Whether there is an observer of every namespace (read without
    /// touching the lock: most servers register observers at start or
    /// never).
    observed: AtomicBool,
    /// The namespaces with an observer of their own ([`Node::observe_in`]);
    /// `scoped` says whether there are any, so the others never read it.
    scoped: AtomicBool,
    scoped_ns: RwLock<Arc<[Namespace]>>,
    /// Publications go to observers only while this is above 0.
    publication_watchers: AtomicUsize,
    /// Adapters' cluster-wide commands, by namespace ([`Node::command`]).
    commands: crate::commands::Commands,
    /// Work an adapter starts that must finish before the process exits
    /// (calls to a backend after a client left, say). The server waits for
    /// it, bounded, after the clients are gone: [`Node::finish_tasks`].
    pub tasks: TaskTracker,
    /// Where sessions whose clients went away are torn down, in batches
    /// behind new connections (see [`crate::reaper`]).
    pub reaper: crate::reaper::Reaper,
    /// Subscribers waiting for the broker to hold their channel's
    /// interest ([`crate::confirm`]).
    waiting: crate::confirm::Waiting,
}

impl Node {
    pub fn new(config: Config, broker: Arc<dyn Broker>) -> Arc<Node> {
        metrics::init();
        // Never 0: 0 marks "no origin" in a publication.
        Node::with_id(config, broker, rand::random::<u32>() as u64 + 1)
    }

    /// A node with a chosen id (tests that need predictable socket ids).
    pub fn with_id(config: Config, broker: Arc<dyn Broker>, id: NodeId) -> Arc<Node> {
        crate::deflate::set_min_bytes(config.websocket_compression_min_bytes);
        crate::deflate::read_experiment_switch();
        let shutdown = CancellationToken::new();
        let apps = crate::apps::Apps::new(&config.apps, shutdown.clone());
        let node = Arc::new(Node {
            id,
            config,
            broker: broker.clone(),
            apps,
            fanout: OnceLock::new(),
            next_conn: AtomicU64::new(1),
            next_message: AtomicU64::new(1),
            ready: AtomicBool::new(false),
            shutdown,
            observers: RwLock::new(Arc::new([])),
            observed: AtomicBool::new(false),
            scoped: AtomicBool::new(false),
            scoped_ns: RwLock::new(Arc::new([])),
            publication_watchers: AtomicUsize::new(0),
            commands: Default::default(),
            tasks: TaskTracker::new(),
            reaper: Default::default(),
            waiting: Default::default(),
        });
        broker.attach(id, Arc::new(NodeInbox(Arc::downgrade(&node))));
        node
    }

    /// Learn who is signed in on the other nodes (call once, at start).
    pub async fn join_cluster(&self) {
        for hub in self.hubs() {
            for (node, user, _) in self
                .broker
                .members(&hub.app.id, &Scope::Users, self.id)
                .await
            {
                hub.users.remote(node, &user, true);
            }
        }
    }

    /// Leave the cluster (graceful shutdown): the others drop our members.
    pub fn leave_cluster(&self) {
        self.broker.detach(self.id);
    }

    /// The app whose key is `key`, now.
    pub fn hub_by_key(&self, key: &str) -> Option<Arc<Hub>> {
        self.apps.by_key(key)
    }

    /// The app whose id is `id`, now.
    pub fn hub_by_id(&self, id: &str) -> Option<Arc<Hub>> {
        self.apps.by_id(id)
    }

    /// Every app now (a snapshot: apps may change meanwhile).
    pub fn hubs(&self) -> impl Iterator<Item = Arc<Hub>> {
        self.apps.all().into_iter()
    }

    /// A new connection number and its public socket id ("node.counter").
    pub fn next_connection(&self) -> (ConnId, String) {
        let n = self.next_conn.fetch_add(1, Ordering::Relaxed);
        (n, format!("{}.{}", self.id, n))
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.shutdown.is_cancelled()
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Wait, at most `within`, for the work spawned on [`Node::tasks`];
    /// false if some was still running then. Call after the clients left:
    /// nothing new may be spawned afterwards.
    pub async fn finish_tasks(&self, within: std::time::Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(within, self.tasks.wait())
            .await
            .is_ok()
    }

    pub fn connection_count(&self) -> u64 {
        self.hubs().map(|h| h.connection_count() as u64).sum()
    }

    // ----- observers -----------------------------------------------------------

    /// Register an observer for every app's changes.
    pub fn observe(&self, observer: Arc<dyn Observer>) {
        self.add_observer(None, observer);
        self.observed.store(true, Ordering::Release);
    }

    /// Register an observer of namespace `ns` only. The cluster-wide
    /// decisions (occupancy, members) are then made for `ns`'s channels
    /// whether or not anyone observes every namespace, and no other
    /// namespace pays for them: an adapter that acts on a member leaving
    /// the whole cluster (Action Cable's presence `leave`, also for the
    /// members of a node that died) hears it exactly once, from the node
    /// the engine has report it, as Pusher's webhooks do.
    pub fn observe_in(&self, ns: Namespace, observer: Arc<dyn Observer>) {
        self.add_observer(Some(ns), observer);
        let mut all = self.scoped_ns.write();
        if !all.contains(&ns) {
            let mut list: Vec<_> = all.iter().copied().collect();
            list.push(ns);
            *all = list.into();
        }
        self.scoped.store(true, Ordering::Release);
    }

    fn add_observer(&self, ns: Option<Namespace>, observer: Arc<dyn Observer>) {
        let mut all = self.observers.write();
        let mut list: Vec<_> = all.iter().cloned().collect();
        list.push((ns, observer));
        *all = list.into();
    }

    /// Whether some observer hears of changes in `ns`.
    fn observes(&self, ns: Namespace) -> bool {
        self.observed.load(Ordering::Acquire)
            || (self.scoped.load(Ordering::Acquire) && self.scoped_ns.read().contains(&ns))
    }

    /// Tell every observer of `ns` about `change` in `hub`'s app. Adapters
    /// report their own happenings (a client event) this way too.
    pub fn notify(&self, hub: &Hub, ns: Namespace, change: &Change<'_>) {
        self.each_observer(ns, |o| o.changed(&hub.app.id, ns, change));
    }

    /// Tell every observer of `ns` about a cluster-wide change another
    /// node reports ([`Observer::seen`]).
    pub fn notify_seen(&self, hub: &Hub, ns: Namespace, change: &Change<'_>) {
        self.each_observer(ns, |o| o.seen(&hub.app.id, ns, change));
    }

    /// Tell every observer of `ns` about a change the removal of a gone
    /// node made, which the engine has this node report
    /// ([`Observer::gone`]).
    pub fn notify_gone(&self, hub: &Hub, ns: Namespace, change: &Change<'_>) {
        self.each_observer(ns, |o| o.gone(&hub.app.id, ns, change));
    }

    /// Call `tell` with every observer of `ns`, if there is any.
    fn each_observer(&self, ns: Namespace, tell: impl Fn(&dyn Observer)) {
        if !self.observes(ns) {
            return;
        }
        // Observers only queue work: calling them under the read lock
        // holds nobody up.
        for (only, o) in self.observers.read().iter() {
            if only.is_none_or(|n| n == ns) {
                tell(o.as_ref());
            }
        }
    }

    /// Observers hear of every publication while the returned guard lives
    /// (the dashboard's live console); otherwise publishing skips them.
    pub fn watch_publications(self: &Arc<Self>) -> PublicationWatch {
        self.publication_watchers.fetch_add(1, Ordering::AcqRel);
        PublicationWatch(self.clone())
    }

    /// Graceful shutdown: let every observer finish before `deadline`.
    pub async fn flush_observers(&self, deadline: std::time::Instant) {
        let observers = self.observers.read().clone();
        for (_, o) in observers.iter() {
            o.flush(deadline).await;
        }
    }

    /// Start the fan-out workers now rather than at the first publish: the
    /// server opens their io_uring rings (a descriptor each) at start, so
    /// its descriptor count under load is its count at rest.
    pub fn start_fanout(&self) {
        self.fanout();
    }

    fn fanout(&self) -> &Fanout {
        self.fanout.get_or_init(|| {
            let n = std::thread::available_parallelism().map_or(2, |n| n.get());
            Fanout::start(n, self.config.direct_writes)
        })
    }

    // ----- publishing --------------------------------------------------------

    /// Publish: hand the publication to the broker for the other nodes
    /// and queue delivery to this node's subscribers (on a fan-out
    /// worker). `Err(Full)`: the broker's outbox is full (it is away, or
    /// far behind); the publication went nowhere, not even here, so a
    /// publisher told to retry (HTTP 503) causes no second copy.
    pub async fn publish(&self, hub: &Hub, publication: Publication) -> Result<(), Full> {
        self.route(hub, publication, true).await
    }

    /// Deliver to this node's subscribers only, never through the broker:
    /// for publications every node of the cluster receives by itself (an
    /// ingress each node subscribes to), so each subscriber gets one copy.
    pub async fn publish_here(&self, hub: &Hub, publication: Publication) {
        let _ = self.route(hub, publication, false).await;
    }

    /// Publish on a stream clients may resume (see [`crate::reliable`]):
    /// publications of one stream are ordered, each appended to the
    /// stream's history and stamped with its position there
    /// ([`Publication::position`]), then published as
    /// [`Node::publish`] does. On one node that order is the order
    /// subscribers see; in a cluster each connection's gate restores it
    /// ([`crate::connection::gate::Gate`]).
    ///
    /// `Ok(Some(position))`: its place in the history; `Ok(None)`: the
    /// stream is not reliable (nobody follows it, or the engine could not
    /// record it) and it went out without one. `Err(Full)`: the broker's
    /// outbox is full and nobody got it (though a reliable stream's
    /// history has it). The stream is the publication's channel.
    pub async fn publish_reliably(
        &self,
        hub: &Hub,
        streams: &ReliableStreams,
        mut publication: Publication,
    ) -> Result<Option<Position>, Full> {
        if !streams.any() {
            return self.route(hub, publication, true).await.map(|()| None);
        }
        let _order = streams.order(&publication.channel).await;
        let position = streams
            .append(&publication.channel, publication.data.get())
            .await;
        publication.position = position.clone();
        self.route(hub, publication, true).await.map(|()| position)
    }

    /// The one publishing path: number the publication, hand it to the
    /// broker (`cluster`), show it to watching observers, deliver here.
    async fn route(
        &self,
        hub: &Hub,
        mut publication: Publication,
        cluster: bool,
    ) -> Result<(), Full> {
        publication.origin = self.id;
        publication.id = self.next_message.fetch_add(1, Ordering::Relaxed);
        if cluster {
            if let Err(full) = self.broker.publish(&hub.app.id, &publication) {
                metrics::count(&metrics::BROKER_REFUSED);
                return Err(full);
            }
        }
        if self.publication_watchers.load(Ordering::Relaxed) > 0 {
            self.notify(hub, publication.ns, &Change::Published(&publication));
        }
        publication.resolve(self.id);
        self.deliver_local(hub, Arc::new(publication)).await;
        Ok(())
    }

    async fn deliver_local(&self, hub: &Hub, publication: Arc<Publication>) {
        if let Some(job) = local_job(hub, publication) {
            self.fanout().submit(job).await;
        }
    }

    /// Resolves once every publication made before the call has been
    /// queued to this node's subscribers.
    pub async fn settle(&self) {
        self.fanout().settle().await;
    }

    // ----- subscriptions -----------------------------------------------------

    /// Subscribe through the hub and tell the cluster what changed. A
    /// presence channel new to this node first learns its members on other
    /// nodes, so the subscriber's member list is the cluster's.
    pub async fn subscribe(
        &self,
        hub: &Hub,
        conn: &Arc<Connection>,
        ns: Namespace,
        channel: &str,
        opts: SubscribeOptions,
    ) -> Result<Joined, Refused> {
        let app = &hub.app.id;
        let pattern = opts.pattern;
        let mut seeded = false;
        // Another subscriber here is fetching this presence channel's
        // members: wait for them (bounded), so this one's list is whole too.
        if opts.member.is_some() {
            let mut waited = 0;
            while hub.is_syncing(ns, channel) && waited < 400 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                waited += 1;
            }
        }
        let new_here = !hub.has_channel(ns, channel);
        if opts.member.is_some() && new_here {
            hub.begin_sync(ns, channel);
            self.broker.interest(self.id, app, ns, channel, false, true);
            let scope = Scope::Channel(ChannelId(ns, channel.to_owned()));
            let members = self.broker.members(app, &scope, self.id).await;
            hub.seed_members(ns, channel, members);
            seeded = true;
        }
        if opts.cache && new_here {
            if let Some((p, age)) = self.broker.cached(self.id, app, ns, channel).await {
                if p.ns == ns && p.channel == channel {
                    hub.seed_cache(p, age);
                }
            }
        }
        // A channel new to this node registers its interest here.
        let mut registered = false;
        if !seeded && !hub.has_subscribers(ns, channel, pattern) {
            self.broker
                .interest(self.id, app, ns, channel, pattern, true);
            registered = true;
        }
        // A confirmation is true: the subscriber is confirmed (the hub
        // queues it below) only once the broker holds the interest, so it
        // receives everything published anywhere after its confirmation.
        // New interest waits for the engine's subscribe; interest held
        // already waits only while the broker connection is away (an
        // atomic load otherwise: the subscribe storms' path).
        let mut waiter = None;
        if registered || seeded || !self.broker.holding() {
            let mut held = self.broker.held(self.config.broker.confirm_timeout());
            let ok = match (&mut held).now_or_never() {
                Some(ok) => ok,
                None => {
                    metrics::count(&metrics::CONFIRMATIONS_HELD);
                    waiter = Some(self.waiting.enter(app, ns, channel, pattern));
                    held.await
                }
            };
            if !ok {
                drop(waiter);
                metrics::count(&metrics::CONFIRMATIONS_REFUSED);
                self.forget_interest(hub, ns, channel, pattern, seeded);
                return Err(Refused::Unavailable(format!(
                    "The cluster's broker is not reachable from this node; \
                     subscribe again (waited {} s)",
                    self.config.broker.confirm_timeout
                )));
            }
        }
        let joined = match hub.subscribe(conn, ns, channel, opts) {
            Ok(j) => j,
            Err(e) => {
                drop(waiter);
                self.forget_interest(hub, ns, channel, pattern, seeded);
                return Err(e);
            }
        };
        drop(waiter);
        self.joined(hub, ns, channel, pattern, &joined).await;
        Ok(joined)
    }

    /// A subscribe that did not happen: drop the interest it registered
    /// (`seeded`: a presence channel's, with its seeded members) unless the
    /// channel has subscribers here or another subscriber waits for it.
    fn forget_interest(
        &self,
        hub: &Hub,
        ns: Namespace,
        channel: &str,
        pattern: bool,
        seeded: bool,
    ) {
        let app = &hub.app.id;
        if self.waiting.any(app, ns, channel, pattern) {
            return;
        }
        if seeded && hub.drop_if_unused(ns, channel) {
            self.broker
                .interest(self.id, app, ns, channel, false, false);
        }
        if !hub.has_subscribers(ns, channel, pattern) {
            self.broker
                .interest(self.id, app, ns, channel, pattern, false);
        }
    }

    /// Tell the cluster (and observers) what a subscribe changed.
    async fn joined(
        &self,
        hub: &Hub,
        ns: Namespace,
        channel: &str,
        pattern: bool,
        joined: &Joined,
    ) {
        let app = &hub.app.id;
        let observed = self.observes(ns);
        if joined.first_here {
            self.broker
                .interest(self.id, app, ns, channel, pattern, true);
            if !pattern && observed && self.broker.occupancy(self.id, app, ns, channel, true).await
            {
                self.notify(hub, ns, &Change::Occupied { channel });
            }
        }
        if joined.cache_miss {
            self.notify(hub, ns, &Change::CacheMiss { channel });
        }
        if let (true, Some((user_id, _))) = (observed, &joined.member_joined) {
            // The member's first socket here: the broker decides whether
            // that added it to the cluster, and who says so.
            if self
                .broker
                .member(self.id, app, ns, channel, user_id, true)
                .await
            {
                self.notify(hub, ns, &Change::MemberAdded { channel, user_id });
            }
        }
        if let Some((user_id, info)) = &joined.member_joined {
            self.broker.presence(
                app,
                PresenceChange {
                    scope: Scope::Channel(ChannelId(ns, channel.to_owned())),
                    node: self.id,
                    user_id: user_id.clone(),
                    joined: Some(info.clone()),
                },
            );
        }
    }

    /// Unsubscribe through the hub and tell the cluster what changed.
    /// Returns whether the connection was subscribed.
    pub fn unsubscribe(
        &self,
        hub: &Hub,
        conn: &Connection,
        ns: Namespace,
        channel: &str,
        tag: &Tag,
        pattern: bool,
    ) -> bool {
        self.unsubscribe_left(hub, conn, ns, channel, tag, pattern)
            .was_subscribed
    }

    /// [`Node::unsubscribe`], returning everything the hub said changed
    /// (an adapter that announces a removed member itself needs it).
    pub fn unsubscribe_left(
        &self,
        hub: &Hub,
        conn: &Connection,
        ns: Namespace,
        channel: &str,
        tag: &Tag,
        pattern: bool,
    ) -> Left {
        let left = hub.unsubscribe(conn, ns, channel, tag, pattern);
        let app = &hub.app.id;
        let observed = self.observes(ns);
        if let (true, Some(user_id)) = (observed, &left.member_left) {
            let answer = self
                .broker
                .member(self.id, app, ns, channel, user_id, false);
            self.report_if(hub, answer, ns, channel, Some(user_id));
        }
        if let Some(user_id) = &left.member_left {
            self.broker.presence(
                app,
                PresenceChange {
                    scope: Scope::Channel(ChannelId(ns, channel.to_owned())),
                    node: self.id,
                    user_id: user_id.clone(),
                    joined: None,
                },
            );
        }
        if left.last_here {
            // A subscriber waiting to be confirmed keeps the interest.
            if !self.waiting.any(app, ns, channel, pattern) {
                self.broker
                    .interest(self.id, app, ns, channel, pattern, false);
            }
            if !pattern && observed {
                let answer = self.broker.occupancy(self.id, app, ns, channel, false);
                self.report_if(hub, answer, ns, channel, None);
            }
        }
        left
    }

    /// A leave the broker decides on: report `Vacated` (`user` is `None`)
    /// or `MemberRemoved` if `answer` says this node reports it for the
    /// cluster. An engine that answers later (over the network) is
    /// awaited on a task.
    fn report_if(
        &self,
        hub: &Hub,
        mut answer: crate::future::BoxFuture<bool>,
        ns: Namespace,
        channel: &str,
        user: Option<&str>,
    ) {
        fn change<'a>(channel: &'a str, user: Option<&'a str>) -> Change<'a> {
            match user {
                None => Change::Vacated { channel },
                Some(user_id) => Change::MemberRemoved { channel, user_id },
            }
        }
        match (&mut answer).now_or_never() {
            Some(true) => self.notify(hub, ns, &change(channel, user)),
            Some(false) => {}
            None => {
                let observers = self.observers.read().clone();
                let app = hub.app.id.clone();
                let (channel, user) = (channel.to_owned(), user.map(str::to_owned));
                tokio::spawn(async move {
                    if answer.await {
                        let c = change(&channel, user.as_deref());
                        for (only, o) in observers.iter() {
                            if only.is_none_or(|n| n == ns) {
                                o.changed(&app, ns, &c);
                            }
                        }
                    }
                });
            }
        }
    }

    // ----- users ---------------------------------------------------------------

    /// Sign a socket in as `user_id` watching `watchlist`; returns which
    /// watched users are online and offline in the cluster.
    pub fn sign_in(
        &self,
        hub: &Hub,
        conn: &Arc<Connection>,
        user_id: &str,
        watchlist: &[String],
    ) -> (Vec<String>, Vec<String>) {
        let (online, offline, first_here) = hub.users.sign_in(conn, user_id, watchlist);
        if first_here {
            self.user_presence(hub, user_id, true);
        }
        (online, offline)
    }

    pub fn sign_out(&self, hub: &Hub, conn: &Connection, user_id: &str, watchlist: &[String]) {
        if hub.users.sign_out(conn, user_id, watchlist) {
            self.user_presence(hub, user_id, false);
        }
    }

    fn user_presence(&self, hub: &Hub, user_id: &str, on: bool) {
        self.broker.presence(
            &hub.app.id,
            PresenceChange {
                scope: Scope::Users,
                node: self.id,
                user_id: user_id.to_owned(),
                joined: on.then_some(None),
            },
        );
    }

    /// Close a user's connections on every node.
    pub fn terminate_user(&self, hub: &Hub, user_id: &str) {
        hub.users.terminate(user_id);
        self.broker.control(
            self.id,
            &hub.app.id,
            Control::Terminate {
                user_id: user_id.to_owned(),
            },
        );
    }

    /// Have `handler` run namespace `ns`'s commands ([`crate::commands`]).
    pub fn on_command(&self, ns: Namespace, handler: crate::commands::CommandHandler) {
        self.commands.add(ns, handler);
    }

    /// Run the command `body` of namespace `ns` in `hub`'s app here and on
    /// every other node (through the broker, as [`Node::terminate_user`]).
    pub fn command(&self, hub: &Hub, ns: Namespace, body: &str) {
        self.command_here(&hub.app.id, ns.as_str(), body);
        let (ns, body) = (ns.as_str().to_owned(), body.to_owned());
        self.broker
            .control(self.id, &hub.app.id, Control::Command { ns, body });
    }

    /// Run it on this node only (it reached every node already).
    pub fn command_here(&self, app_id: &str, ns: &str, body: &str) {
        if let Some(hub) = self.hub_by_id(app_id) {
            self.commands.run(&hub, ns, body);
        }
    }

    // ----- queries -------------------------------------------------------------

    /// Channel figures of namespace `ns` (of every namespace for `None`:
    /// the dashboard) for the whole cluster: subscriptions summed, users
    /// counted once however many nodes they are on.
    pub async fn stats(
        &self,
        hub: &Hub,
        ns: Option<Namespace>,
        filter: StatsFilter,
    ) -> Vec<ChannelStats> {
        let mut all = hub.stats(ns, &filter);
        all.extend(self.broker.query(self.id, &hub.app.id, ns, filter).await);
        let mut merged: BTreeMap<ChannelId, (usize, BTreeSet<String>)> = BTreeMap::new();
        for s in all {
            let e = merged.entry(ChannelId(s.ns, s.name)).or_default();
            e.0 += s.subscriptions;
            e.1.extend(s.users);
        }
        merged
            .into_iter()
            .map(
                |(ChannelId(ns, name), (subscriptions, users))| ChannelStats {
                    ns,
                    name,
                    subscriptions,
                    users: users.into_iter().collect(),
                },
            )
            .collect()
    }

    // ----- housekeeping ----------------------------------------------------------

    /// Periodic work: heartbeat, cache expiry. (Subscription counts have
    /// their own, faster tick: [`Node::flush_counts`].)
    pub fn tick(&self) {
        self.broker.heartbeat(self.id);
        self.hubs().for_each(|hub| hub.expire_cache());
    }

    pub fn flush_counts(&self) {
        for hub in self.hubs() {
            for counts in hub.flush_subscription_counts(self.id) {
                for (channel, count) in &counts.report {
                    let count = *count;
                    self.notify(
                        &hub,
                        counts.ns,
                        &Change::SubscriptionCount { channel, count },
                    );
                }
                if !counts.announce.is_empty() {
                    let app = &hub.app.id;
                    self.broker.counts(self.id, app, counts.ns, counts.announce);
                }
            }
        }
    }
}

/// Keeps publications flowing to observers while it lives.
pub struct PublicationWatch(Arc<Node>);

impl Drop for PublicationWatch {
    fn drop(&mut self) {
        self.0.publication_watchers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The fan-out work for this node's subscribers of `publication`, if any.
fn local_job(hub: &Hub, publication: Arc<Publication>) -> Option<Job> {
    metrics::count(&metrics::MESSAGES_PUBLISHED);
    let targets = match &publication.to_user {
        Some(user) => hub.users.targets(user).into_iter().collect(),
        None => hub.targets(&publication),
    };
    (!targets.is_empty()).then_some(Job {
        publication,
        targets,
        done: None,
    })
}

/// Applies what other nodes send to the right hub.
struct NodeInbox(std::sync::Weak<Node>);

impl NodeInbox {
    fn with(&self, app_id: &str, f: impl FnOnce(&Arc<Node>, &Arc<Hub>)) {
        if let Some(node) = self.0.upgrade() {
            if let Some(hub) = node.hub_by_id(app_id) {
                f(&node, &hub);
            }
        }
    }
}

impl Inbox for NodeInbox {
    fn publication(&self, app_id: &str, mut publication: Publication) {
        self.with(app_id, |node, hub| {
            publication.resolve(node.id);
            if publication.origin == node.id {
                return;
            }
            metrics::count(&metrics::BROKER_RECEIVED);
            // Queued on the fan-out workers in arrival order, like a local
            // publish, so one publisher's messages stay in order.
            if let Some(job) = local_job(hub, Arc::new(publication)) {
                node.fanout().submit_now(job);
            }
        });
    }

    fn presence(&self, app_id: &str, change: &PresenceChange) {
        self.with(app_id, |_, hub| match &change.scope {
            Scope::Channel(ChannelId(ns, channel)) => {
                let joined = change.joined.clone();
                hub.remote_member(*ns, channel, change.node, &change.user_id, joined)
            }
            Scope::Users => hub
                .users
                .remote(change.node, &change.user_id, change.joined.is_some()),
        });
    }

    fn control(&self, app_id: &str, control: &Control) {
        self.with(app_id, |node, hub| match control {
            Control::Terminate { user_id } => {
                hub.users.terminate(user_id);
            }
            Control::Command { ns, body } => node.command_here(app_id, ns, body),
        });
    }

    fn stats(
        &self,
        app_id: &str,
        ns: Option<Namespace>,
        filter: &StatsFilter,
    ) -> Vec<ChannelStats> {
        self.0
            .upgrade()
            .and_then(|node| node.hub_by_id(app_id).map(|hub| hub.stats(ns, filter)))
            .unwrap_or_default()
    }

    fn cached(
        &self,
        app_id: &str,
        ns: Namespace,
        channel: &str,
    ) -> Option<(Publication, std::time::Duration)> {
        let node = self.0.upgrade()?;
        let (p, age) = node.hub_by_id(app_id)?.cached(ns, channel)?;
        // A copy without the built frames (bytes are what a broker carries).
        Publication::from_bytes(&p.to_bytes())
            .ok()
            .map(|p| (p, age))
    }

    fn count(&self, app_id: &str, ns: Namespace, channel: &str, node: NodeId, count: usize) {
        self.with(app_id, |_, hub| hub.remote_count(ns, channel, node, count));
    }

    fn connections(&self) -> Vec<(String, u32)> {
        self.0
            .upgrade()
            .map(|node| {
                node.hubs()
                    .map(|h| (h.app.id.clone(), h.connection_count()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn remote_connections(&self, app_id: &str, count: u32) {
        self.with(app_id, |_, hub| hub.set_remote_connections(count));
    }

    fn observed(&self, app_id: &str, ns: Namespace, change: &Change<'_>) {
        self.with(app_id, |node, hub| node.notify(hub, ns, change));
    }

    fn seen(&self, app_id: &str, ns: Namespace, change: &Change<'_>) {
        self.with(app_id, |node, hub| node.notify_seen(hub, ns, change));
    }

    fn observed_gone(&self, app_id: &str, ns: Namespace, change: &Change<'_>) {
        self.with(app_id, |node, hub| node.notify_gone(hub, ns, change));
    }

    fn node_gone(&self, gone: NodeId) {
        if let Some(node) = self.0.upgrade() {
            node.hubs().for_each(|hub| hub.forget_node(gone));
        }
    }
}
