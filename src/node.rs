//! The node: one running Herald process. It owns the apps' hubs, the broker
//! connection, connection-id allocation, and the lifecycle flags (ready,
//! draining) that the server and every session consult.

use crate::broker::{Broker, Inbox, NodeId};
use crate::config::Config;
use crate::connection::ConnId;
use crate::fanout::Publication;
use crate::hub::Hub;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

pub struct Node {
    pub id: NodeId,
    pub config: Config,
    pub broker: Arc<dyn Broker>,
    by_key: HashMap<String, Arc<Hub>>,
    by_id: HashMap<String, Arc<Hub>>,
    next_conn: AtomicU64,
    ready: AtomicBool,
    /// Cancelled when the server starts draining; every session watches it.
    pub shutdown: CancellationToken,
}

impl Node {
    pub fn new(config: Config, broker: Arc<dyn Broker>) -> Arc<Node> {
        let id: NodeId = rand::random::<u32>() as u64;
        let mut by_key = HashMap::new();
        let mut by_id = HashMap::new();
        for app in &config.apps {
            let hub = Arc::new(Hub::new(app.clone(), id, broker.clone()));
            by_key.insert(app.key.clone(), hub.clone());
            by_id.insert(app.id.clone(), hub);
        }
        let node = Arc::new(Node {
            id,
            config,
            broker: broker.clone(),
            by_key,
            by_id,
            next_conn: AtomicU64::new(1),
            ready: AtomicBool::new(false),
            shutdown: CancellationToken::new(),
        });
        broker.attach(id, Arc::new(NodeInbox(Arc::downgrade(&node))));
        node
    }

    pub fn hub_by_key(&self, key: &str) -> Option<&Arc<Hub>> {
        self.by_key.get(key)
    }

    pub fn hub_by_id(&self, id: &str) -> Option<&Arc<Hub>> {
        self.by_id.get(id)
    }

    pub fn hubs(&self) -> impl Iterator<Item = &Arc<Hub>> {
        self.by_id.values()
    }

    /// A new connection number and its Pusher socket id ("node.counter").
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

    pub fn connection_count(&self) -> u64 {
        self.hubs().map(|h| h.connection_count() as u64).sum()
    }
}

/// Routes messages from other nodes to the right hub.
struct NodeInbox(std::sync::Weak<Node>);

impl Inbox for NodeInbox {
    fn deliver(&self, app_id: &str, publication: Arc<Publication>) {
        if let Some(node) = self.0.upgrade() {
            if let Some(hub) = node.hub_by_id(app_id) {
                hub.deliver_local(&publication);
            }
        }
    }
}
