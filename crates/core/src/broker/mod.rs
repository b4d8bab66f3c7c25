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
//! The interface is several small traits, one per concern (in
//! [`concerns`]): [`Cluster`] (the engine, its nodes and their liveness),
//! [`PubSub`] (publications and interest), [`Presence`] (members per node),
//! [`Occupancy`] (cluster-wide first/last decisions for observers),
//! [`Queries`] (request/reply figures and control), [`LastEvent`] (a cache
//! channel's last event held elsewhere) and [`Counts`] (subscription counts
//! per node). [`Broker`] is all of them: what an engine implements and what
//! the node holds. A new concern (stream history) is one more trait there.
//!
//! Engines: the in-process [`local::LocalBroker`] (several nodes in one
//! process form a real cluster, which the multi-node tests use); the Redis
//! and NATS engines live in their own crate behind the same traits. What
//! only networked engines need has a default the local one keeps: whether
//! the engine is connected ([`Cluster::connected`]), waiting until what was
//! sent has gone out ([`Cluster::flush`]), whether the broker holds the
//! node's interest now and waiting until it does ([`PubSub::holding`],
//! [`PubSub::held`]: a subscription is confirmed only then),
//! [`LastEvent::cached`],
//! [`Counts::counts`], and per-app connection counts (asked of the
//! [`Inbox`] with each heartbeat).

pub mod concerns;
pub mod local;

pub use concerns::{
    Broker, Cluster, Counts, LastEvent, Occupancy, Presence, PubSub, Queries, Streams,
};

use crate::hub::{ChannelStats, StatsFilter};
use crate::namespace::{ChannelId, Namespace};
use crate::observer::Change;
use crate::publication::{NodeId, Publication};
use serde_json::value::RawValue;
use std::time::Duration;

/// A publication for the other nodes was refused: the engine's outbox
/// (what it holds while the broker is away or behind) is full. Nothing
/// was delivered anywhere; an HTTP endpoint answers 503 with
/// `Retry-After` ([`Full::RETRY_AFTER`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl Full {
    /// Seconds a refused publisher is told to wait.
    pub const RETRY_AFTER: u64 = 1;
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the broker is unavailable and this node's outbox is full; retry later")
    }
}

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
    /// An adapter's command for its own connections on every node
    /// ([`crate::node::Node::command`]): the namespace's name and the
    /// command as the adapter wrote it (Action Cable's remote disconnect).
    Command { ns: String, body: String },
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
    /// did not come from this node's own call to [`Occupancy::occupancy`] or
    /// [`Occupancy::member`]: another node's subscriber, or a node gone.
    fn observed(&self, _app_id: &str, _ns: Namespace, _change: &Change<'_>) {}
    /// As [`Inbox::observed`], for a change the removal of a gone node
    /// made (see [`crate::observer::Observer::gone`]).
    fn observed_gone(&self, app_id: &str, ns: Namespace, change: &Change<'_>) {
        self.observed(app_id, ns, change)
    }
    /// A cluster-wide change another node reports (for
    /// [`crate::observer::Observer::seen`]).
    fn seen(&self, _app_id: &str, _ns: Namespace, _change: &Change<'_>) {}
}
