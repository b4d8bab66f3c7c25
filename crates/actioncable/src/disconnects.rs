//! Disconnect calls, queued and rate-limited: when many clients leave at
//! once (a deploy, a network blip) the app hears of them at
//! `rpc.disconnect_rate` per second instead of all at once.
//!
//! The queue is a plain list drained by one task, started with the first
//! call: a mass disconnect of N clients adds N small requests to it, not N
//! tasks each holding a sleeping RPC future (which cost the runtime a poll
//! each and tens of kilobytes of memory each while the queue drained). Only
//! the calls in flight are tasks. When the server shuts down the rest go
//! out at once (bounded by the RPC concurrency limit), calls queued after
//! that too, and the server waits for them before it exits, so none is lost
//! on a graceful shutdown.

use crate::metrics as m;
use crate::proto::DisconnectRequest;
use crate::rpc::Rpc;
use herald_core::metrics;
use herald_core::node::Node;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

pub struct Disconnects {
    rpc: Arc<Rpc>,
    interval: Duration,
    queue: Arc<Queue>,
}

#[derive(Default)]
struct Queue {
    state: Mutex<State>,
    /// Something was queued.
    ready: Notify,
}

#[derive(Default)]
struct State {
    calls: VecDeque<(String, DisconnectRequest)>,
    /// The draining task runs.
    started: bool,
    /// Shutting down: calls go out at once instead of queueing.
    closed: bool,
}

impl Disconnects {
    pub fn new(rpc: Arc<Rpc>, per_second: u32) -> Disconnects {
        Disconnects {
            rpc,
            interval: Duration::from_secs(1) / per_second.max(1),
            queue: Arc::default(),
        }
    }

    /// Queue the Disconnect call for session `sid`.
    pub fn enqueue(&self, node: &Arc<Node>, sid: String, req: DisconnectRequest) {
        metrics::count(&m::DISCONNECTS_QUEUED);
        let mut state = self.queue.state.lock();
        if state.closed {
            drop(state);
            node.tasks.spawn(call(self.rpc.clone(), sid, req));
            return;
        }
        state.calls.push_back((sid, req));
        if !std::mem::replace(&mut state.started, true) {
            node.tasks.spawn(drain(
                self.queue.clone(),
                self.rpc.clone(),
                self.interval,
                node.clone(),
            ));
        }
        drop(state);
        self.queue.ready.notify_one();
    }
}

/// Make the queued calls, one per `interval`, until shutdown; then all of
/// the rest at once.
async fn drain(queue: Arc<Queue>, rpc: Arc<Rpc>, interval: Duration, node: Arc<Node>) {
    let mut next = Instant::now();
    loop {
        let call_now = queue.state.lock().calls.pop_front();
        let Some((sid, req)) = call_now else {
            tokio::select! {
                _ = queue.ready.notified() => continue,
                _ = node.shutdown.cancelled() => break,
            }
        };
        next = next.max(Instant::now());
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = node.shutdown.cancelled() => {
                node.tasks.spawn(call(rpc.clone(), sid, req));
                break;
            }
        }
        next += interval;
        node.tasks.spawn(call(rpc.clone(), sid, req));
    }
    let rest = {
        let mut state = queue.state.lock();
        state.closed = true;
        std::mem::take(&mut state.calls)
    };
    for (sid, req) in rest {
        node.tasks.spawn(call(rpc.clone(), sid, req));
    }
}

async fn call(rpc: Arc<Rpc>, sid: String, req: DisconnectRequest) {
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
}
