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
//! tests use); Redis and NATS are a matter of transport behind the same
//! trait.

pub mod local;

use crate::fanout::{NodeId, Publication};
use crate::hub::{ChannelStats, StatsFilter};
use serde_json::value::RawValue;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What a presence change is about: a channel's members, or the app's
/// signed-in users.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    Channel(String),
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
    fn stats(&self, app_id: &str, filter: &StatsFilter) -> Vec<ChannelStats>;
}

/// A cluster engine connecting nodes.
pub trait Broker: Send + Sync {
    /// Engine name for logs and `/metrics`.
    fn name(&self) -> &'static str;
    /// Whether the engine is connected (`herald_broker_up`); an in-process
    /// engine always is.
    fn healthy(&self) -> bool {
        true
    }
    /// Register node `node`'s inbox.
    fn attach(&self, node: NodeId, inbox: Arc<dyn Inbox>);
    /// The node leaves (graceful shutdown): its members are removed now.
    fn detach(&self, node: NodeId);
    /// Send `publication` (already delivered on its origin node) to every
    /// other node interested in its channel.
    fn publish(&self, app_id: &str, publication: &Publication);
    /// Node `node` starts (`on`) or stops receiving `channel`'s
    /// publications; `pattern` marks a prefix subscription.
    fn interest(&self, node: NodeId, app_id: &str, channel: &str, pattern: bool, on: bool);
    /// Node `node`'s first subscriber to `channel` joined (`occupied`) or
    /// its last one left. Resolves to whether that changed whether the
    /// channel has subscribers anywhere in the cluster: the one node that
    /// gets `true` reports the channel occupied or vacated, so observers
    /// (webhooks) hear it once for the cluster. The engine must decide
    /// atomically (two nodes joining at once: one `true`). The default
    /// suits a single node: its own first and last subscriber decide.
    fn occupancy(
        &self,
        node: NodeId,
        app_id: &str,
        channel: &str,
        occupied: bool,
    ) -> BoxFuture<bool> {
        let _ = (node, app_id, channel, occupied);
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
    /// Every other node's figures for `filter`.
    fn query(
        &self,
        from: NodeId,
        app_id: &str,
        filter: StatsFilter,
    ) -> BoxFuture<Vec<ChannelStats>>;
    /// Send a control message to every other node.
    fn control(&self, from: NodeId, app_id: &str, control: Control);
}
