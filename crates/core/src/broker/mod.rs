//! The broker: the cluster's interface, and the only way anything reaches
//! another node.
//!
//! A node delivers to its own subscribers at once and hands a publication to
//! the broker for the others, so local latency never waits on the network
//! and each subscriber gets each message exactly once (a node ignores what
//! it published itself). Beyond publications the broker carries what makes
//! several nodes behave as one server:
//!
//! - **interest**: a node receives a channel's publications only while it
//!   has subscribers to it (exact channels and patterns);
//! - **presence**: members joining and leaving per node, kept by the engine
//!   so a node can ask who is there, and removed when a node stops sending
//!   heartbeats within the engine's TTL;
//! - **queries** by request/reply: channel figures from every node;
//! - **control** messages: terminate a user's connections everywhere.
//!
//! Engines implement [`Broker`]: the in-process [`local::LocalBroker`]
//! (several nodes in one process form a real cluster, which the multi-node
//! tests use); the Redis and NATS engines live in their own crate behind
//! the same trait.
//!
//! Beyond those, a few things the networked engines need and the local one
//! may ignore (each has a default): whether the engine is connected
//! ([`Broker::connected`]), waiting until what was sent has gone out
//! ([`Broker::flush`]), a cache channel's last event held by another node
//! ([`Broker::cached`]), per-channel subscription counts
//! ([`Broker::counts`]) and per-app connection counts (asked of the
//! [`Inbox`] with each heartbeat).

pub mod local;

use crate::fanout::{NodeId, Publication};
use crate::hub::{ChannelStats, StatsFilter};
use crate::namespace::{ChannelId, Namespace};
use crate::observer::Change;
use serde_json::value::RawValue;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What a presence change is about: a channel's members, or the app's
/// signed-in users.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Scope {
    Channel(ChannelId),
    Users,
}

/// A member's first socket on a node joined (`info` is `Some`), or its last
/// one there left.
#[derive(Debug)]
pub struct PresenceChange {
    pub scope: Scope,
    pub node: NodeId,
    pub user_id: String,
    pub joined: Option<Option<Box<RawValue>>>,
}

/// A member on some node, as a presence snapshot lists it.
pub type RemoteMember = (NodeId, String, Option<Box<RawValue>>);

/// Commands for every node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Control {
    /// Close every connection of this signed-in user.
    Terminate { user_id: String },
}

/// Where a broker hands what came from other nodes.
pub trait Inbox: Send + Sync {
    fn publication(&self, app_id: &str, publication: Publication);
    fn presence(&self, app_id: &str, change: &PresenceChange);
    fn control(&self, app_id: &str, control: &Control);
    /// Answer a query with this node's own figures.
    /// (`ns` `None`: every namespace.)
    fn stats(&self, app_id: &str, ns: Option<Namespace>, filter: &StatsFilter)
        -> Vec<ChannelStats>;
    /// This node's last cached publication of `channel`, and its age.
    fn cached(&self, app_id: &str, ns: Namespace, channel: &str)
        -> Option<(Publication, Duration)>;
    /// Node `node` has `count` subscriptions to `channel` (0: none left).
    fn count(&self, app_id: &str, ns: Namespace, channel: &str, node: NodeId, count: usize);
    /// This node's open connections per app (sent with heartbeats).
    fn connections(&self) -> Vec<(String, u32)>;
    /// The other nodes hold `count` connections of the app in total.
    fn remote_connections(&self, app_id: &str, count: u32);
    /// Node `node` left or was declared gone: forget what it told us
    /// besides presence (which the engine removes member by member).
    fn node_gone(&self, node: NodeId);
    /// The engine decided that this node reports `change` (occupied,
    /// vacated, member added or removed) for the whole cluster, though it
    /// did not come from this node's own call to [`Broker::occupancy`] or
    /// [`Broker::member`]: another node's subscriber, or a node gone.
    fn observed(&self, _app_id: &str, _ns: Namespace, _change: &Change<'_>) {}
    /// A cluster-wide change another node reports (for
    /// [`crate::observer::Observer::seen`]).
    fn seen(&self, _app_id: &str, _ns: Namespace, _change: &Change<'_>) {}
}

/// A cluster engine connecting nodes.
pub trait Broker: Send + Sync {
    /// Engine name for logs and `/metrics`.
    fn name(&self) -> &'static str;
    /// Register node `node`'s inbox.
    fn attach(&self, node: NodeId, inbox: Arc<dyn Inbox>);
    /// The node leaves (graceful shutdown): its members are removed now.
    fn detach(&self, node: NodeId);
    /// Send `publication` (already delivered on its origin node) to every
    /// other node interested in its channel.
    fn publish(&self, app_id: &str, publication: &Publication);
    /// Node `node` starts (`on`) or stops receiving `channel`'s
    /// publications; `pattern` marks a prefix subscription.
    fn interest(
        &self,
        node: NodeId,
        app_id: &str,
        ns: Namespace,
        channel: &str,
        pattern: bool,
        on: bool,
    );
    /// Node `node`'s first subscriber to `channel` joined (`occupied`) or
    /// its last one left. Resolves to whether that changed whether the
    /// channel has subscribers anywhere in the cluster: the one node that
    /// gets `true` reports the channel occupied or vacated, so observers
    /// (webhooks) hear it once for the cluster. The engine must decide
    /// atomically (two nodes joining at once: one `true`); it may instead
    /// have another node report the change, through [`Inbox::observed`].
    /// Nodes call it only while they have observers. The default suits a
    /// single node: its own first and last subscriber decide.
    fn occupancy(
        &self,
        node: NodeId,
        app_id: &str,
        ns: Namespace,
        channel: &str,
        occupied: bool,
    ) -> BoxFuture<bool> {
        let _ = (node, app_id, ns, channel, occupied);
        Box::pin(std::future::ready(true))
    }
    /// Node `node`'s first socket of member `user_id` in presence channel
    /// `channel` joined (`joined`) or its last one there left. Resolves to
    /// whether this node reports the member added or removed: decided once
    /// for the cluster, like [`Broker::occupancy`] (an engine may instead
    /// have another node report it, through [`Inbox::observed`]). The
    /// default suits a single node: its own first and last socket decide.
    fn member(
        &self,
        node: NodeId,
        app_id: &str,
        ns: Namespace,
        channel: &str,
        user_id: &str,
        joined: bool,
    ) -> BoxFuture<bool> {
        let _ = (node, app_id, ns, channel, user_id, joined);
        Box::pin(std::future::ready(true))
    }
    /// Record a presence change and tell the other interested nodes.
    fn presence(&self, app_id: &str, change: PresenceChange);
    /// Members of `scope` on nodes other than `except`.
    fn members(&self, app_id: &str, scope: &Scope, except: NodeId) -> BoxFuture<Vec<RemoteMember>>;
    /// Node `node` is alive. Nodes silent for longer than [`Broker::ttl`]
    /// are declared gone and their members removed everywhere.
    fn heartbeat(&self, node: NodeId);
    fn ttl(&self) -> Duration;
    /// Every other node's figures for `filter` in namespace `ns` (every
    /// namespace for `None`).
    fn query(
        &self,
        from: NodeId,
        app_id: &str,
        ns: Option<Namespace>,
        filter: StatsFilter,
    ) -> BoxFuture<Vec<ChannelStats>>;
    /// Send a control message to every other node.
    fn control(&self, from: NodeId, app_id: &str, control: Control);
    /// Whether the engine reaches the rest of the cluster now
    /// (`herald_broker_up`, `/ready`); an in-process engine always does.
    fn connected(&self) -> bool {
        true
    }
    /// Resolves once what was handed to the engine before the call has
    /// been sent (or dropped). Graceful shutdown waits on it.
    fn flush(&self) -> BoxFuture<()> {
        Box::pin(std::future::ready(()))
    }
    /// The newest cached publication of `channel` held by a node other
    /// than `from`, with its age.
    fn cached(
        &self,
        _from: NodeId,
        _app_id: &str,
        _ns: Namespace,
        _channel: &str,
    ) -> BoxFuture<Option<(Publication, Duration)>> {
        Box::pin(std::future::ready(None))
    }
    /// Node `node`'s subscription counts of these channels changed: tell
    /// the other nodes interested in each.
    fn counts(&self, _node: NodeId, _app_id: &str, _ns: Namespace, _counts: Vec<(String, usize)>) {}
}
