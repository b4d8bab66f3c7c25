//! Disconnect calls, queued and rate-limited: when many clients leave at
//! once (a deploy, a network blip) the app hears of them at
//! `rpc.disconnect_rate` per second instead of all at once. Each queued call
//! is a task on the node's tracker, sleeping until its slot: when the
//! server shuts down the slots are dropped, the remaining calls go out at
//! once (bounded by the RPC concurrency limit), and the server waits for
//! them before it exits, so none is lost on a graceful shutdown.

use crate::metrics as m;
use crate::proto::DisconnectRequest;
use crate::rpc::Rpc;
use herald_core::metrics;
use herald_core::node::Node;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

pub struct Disconnects {
    rpc: Arc<Rpc>,
    interval: Duration,
    /// The next free slot.
    next: Mutex<Instant>,
}

impl Disconnects {
    pub fn new(rpc: Arc<Rpc>, per_second: u32) -> Disconnects {
        Disconnects {
            rpc,
            interval: Duration::from_secs(1) / per_second.max(1),
            next: Mutex::new(Instant::now()),
        }
    }

    /// Queue the Disconnect call for session `sid`.
    pub fn enqueue(&self, node: &Node, sid: String, req: DisconnectRequest) {
        metrics::count(&m::DISCONNECTS_QUEUED);
        let slot = {
            let mut next = self.next.lock();
            let now = Instant::now();
            let slot = (*next).max(now);
            *next = slot + self.interval;
            slot
        };
        let rpc = self.rpc.clone();
        let shutdown = node.shutdown.clone();
        node.tasks.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(slot) => {}
                _ = shutdown.cancelled() => {}
            }
            let result = rpc.disconnect(&sid, req).await;
            metrics::count(&m::DISCONNECTS_SENT);
            match result {
                Ok(res) if crate::proto::status_of(res.status) == crate::proto::Status::Error => {
                    metrics::count(&m::RPC_APP_ERRORS);
                    tracing::warn!(sid, "RPC Disconnect: the app answered ERROR");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(sid, error = %e, "RPC Disconnect failed"),
            }
        });
    }
}
