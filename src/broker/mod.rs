//! The broker: the only way a message reaches another node.
//!
//! A node delivers to its own subscribers at once (see
//! [`crate::hub::Hub::publish`]) and hands the message to the broker for
//! every *other* node, so local latency never waits on the network and each
//! subscriber gets each message exactly once. Engines implement [`Broker`]:
//! today the in-process [`local::LocalBroker`]; Redis pub/sub and NATS slot
//! in behind the same trait.

pub mod local;

use crate::fanout::Publication;
use std::sync::Arc;

/// Identifies a node (one `herald serve` process) on the broker.
pub type NodeId = u64;

/// Where a broker hands messages that came from other nodes.
pub trait Inbox: Send + Sync {
    fn deliver(&self, app_id: &str, publication: Arc<Publication>);
}

/// A pub/sub engine connecting nodes.
pub trait Broker: Send + Sync {
    /// Register the inbox of node `node`; messages it publishes are not
    /// handed back to it.
    fn attach(&self, node: NodeId, inbox: Arc<dyn Inbox>);
    /// Send `publication` (already delivered locally) to every other node.
    fn publish(&self, origin: NodeId, app_id: &str, publication: Arc<Publication>);
    /// Engine name for logs and `/metrics`.
    fn name(&self) -> &'static str;
}
