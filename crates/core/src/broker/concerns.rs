//! The broker's interface, one small trait per concern. An engine
//! implements them all; [`Broker`] names the whole set, which is what a
//! node holds (`Arc<dyn Broker>`).

use super::{Control, Full, Inbox, PresenceChange, RemoteMember, Scope};
use crate::future::BoxFuture;
use crate::history::{History, Limits, MemoryHistory};
use crate::hub::{ChannelStats, StatsFilter};
use crate::namespace::Namespace;
use crate::publication::{NodeId, Publication};
use crate::sessions::{MemorySessions, SessionStore};
use std::sync::Arc;
use std::time::Duration;

/// The engine itself: its nodes, their liveness, and delivery of what was
/// handed to it.
pub trait Cluster: Send + Sync {
    /// Engine name for logs and `/metrics`.
    fn name(&self) -> &'static str;
    /// Register node `node`'s inbox.
    fn attach(&self, node: NodeId, inbox: Arc<dyn Inbox>);
    /// The node leaves (graceful shutdown): its members are removed now.
    fn detach(&self, node: NodeId);
    /// Node `node` is alive. Nodes silent for longer than [`Cluster::ttl`]
    /// are declared gone and their members removed everywhere.
    fn heartbeat(&self, node: NodeId);
    fn ttl(&self) -> Duration;
    /// Whether node `node` is gone from the cluster (left, or declared
    /// gone by its missed heartbeats); a node silent now but not yet
    /// declared gone is waited for, at most `wait`. In process every node
    /// shares the process: none is gone while one asks.
    fn gone(&self, _node: NodeId, _wait: Duration) -> BoxFuture<bool> {
        Box::pin(std::future::ready(false))
    }
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
}

/// Publications, and the interest that decides which nodes receive them.
pub trait PubSub: Send + Sync {
    /// Send `publication` (delivered on its origin node once this returns
    /// `Ok`) to every other node interested in its channel (of its
    /// namespace). `Ok` means the engine took it: sent, or held in its
    /// bounded outbox until the broker is back, never dropped. `Err(Full)`
    /// when that outbox is full: the caller refuses the publication.
    /// Never waits on the network.
    fn publish(&self, app_id: &str, publication: &Publication) -> Result<(), Full>;
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
    /// Whether the interest the engine was handed is in effect at the
    /// broker now: connected, and the connection's subscriptions restored.
    /// Asked by every subscribe to a channel this node already receives,
    /// so it must cost an atomic load at most. An in-process engine always
    /// holds.
    fn holding(&self) -> bool {
        true
    }
    /// Resolves to `true` once every interest handed to the engine before
    /// the call is in effect at the broker (its subscribe answered; on a
    /// cluster of brokers, known to every node's server), or to `false` if
    /// that did not happen within `within` (no connection meanwhile). A
    /// subscription is confirmed only after `true`: a confirmation is true.
    fn held(&self, within: Duration) -> BoxFuture<bool> {
        let _ = within;
        Box::pin(std::future::ready(true))
    }
}

/// Presence: members joining and leaving per node, kept by the engine so a
/// node can ask who is there.
pub trait Presence: Send + Sync {
    /// Record a presence change and tell the other interested nodes.
    fn presence(&self, app_id: &str, change: PresenceChange);
    /// Members of `scope` on nodes other than `except`.
    fn members(&self, app_id: &str, scope: &Scope, except: NodeId) -> BoxFuture<Vec<RemoteMember>>;
}

/// Decisions made once for the whole cluster, so observers (webhooks) hear
/// of a channel occupied or a member added once, from one node.
pub trait Occupancy: Send + Sync {
    /// Node `node`'s first subscriber to `channel` joined (`occupied`) or
    /// its last one left. Resolves to whether that changed whether the
    /// channel has subscribers anywhere in the cluster: the one node that
    /// gets `true` reports the channel occupied or vacated. The engine
    /// must decide atomically (two nodes joining at once: one `true`); it
    /// may instead have another node report the change, through
    /// [`Inbox::observed`]. Nodes call it only while they have observers.
    /// The default suits a single node: its own first and last subscriber
    /// decide.
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
    /// for the cluster, like [`Occupancy::occupancy`]. The default suits a
    /// single node: its own first and last socket decide.
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
}

/// Request/reply across the cluster: channel figures, and control
/// messages for every node.
pub trait Queries: Send + Sync {
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
}

/// Cache channels: the last event another node holds, for a subscriber
/// that joins here first.
pub trait LastEvent: Send + Sync {
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
}

/// Subscription counts: each node's count of a counted channel, for the
/// other nodes with subscribers to it.
pub trait Counts: Send + Sync {
    /// Node `node`'s subscription counts of these channels changed: tell
    /// the other nodes interested in each.
    fn counts(&self, _node: NodeId, _app_id: &str, _ns: Namespace, _counts: Vec<(String, usize)>) {}
}

/// Stream history and resumable sessions: where an adapter
/// that lets clients resume keeps them. The defaults keep both in this
/// process, which is right for one node; a cluster engine keeps them on its
/// server so that every node reads the same history and restores the same
/// sessions.
pub trait Streams: Send + Sync {
    /// A history engine with these bounds (called once per adapter).
    fn history(&self, limits: Limits) -> Arc<dyn History> {
        Arc::new(MemoryHistory::new(limits))
    }
    /// A store of session snapshots kept for `ttl`, at most `max` of them
    /// where the engine counts them (called once per adapter).
    fn sessions(&self, ttl: Duration, max: usize) -> Arc<dyn SessionStore> {
        Arc::new(MemorySessions::new(ttl, max))
    }
}

/// A cluster engine connecting nodes: every concern above. Implemented
/// for anything that implements them all.
pub trait Broker:
    Cluster + PubSub + Presence + Occupancy + Queries + LastEvent + Counts + Streams
{
}

impl<T> Broker for T where
    T: Cluster + PubSub + Presence + Occupancy + Queries + LastEvent + Counts + Streams + ?Sized
{
}
