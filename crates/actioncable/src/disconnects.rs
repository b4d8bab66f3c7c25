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
//!
//! Clients that connect and leave faster than the drain rate would grow the
//! list without end, so it holds at most `rpc.disconnect_queue` calls and
//! `rpc.disconnect_queue_bytes` bytes; a call over either is not made,
//! counted (`herald_rpc_disconnects_dropped_total`) and logged once until
//! the queue has drained to half.

use crate::metrics as m;
use crate::proto::DisconnectRequest;
use crate::rpc::Rpc;
use herald_core::metrics;
use herald_core::node::Node;
use parking_lot::Mutex;
use prost::Message;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

pub struct Disconnects {
    rpc: Arc<Rpc>,
    interval: Duration,
    queue: Arc<Queue>,
    /// Most calls, and bytes, waiting.
    max_calls: usize,
    max_bytes: usize,
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
    /// What `calls` hold, about (see [`size`]).
    bytes: usize,
    /// Dropping calls (logged once until the queue drains to half).
    dropping: bool,
    /// The draining task runs.
    started: bool,
    /// Shutting down: calls go out at once instead of queueing.
    closed: bool,
}

impl Disconnects {
    pub fn new(rpc: Arc<Rpc>, config: &crate::config::RpcConfig) -> Disconnects {
        Disconnects {
            rpc,
            interval: Duration::from_secs(1) / config.disconnect_rate.max(1),
            queue: Arc::default(),
            max_calls: config.disconnect_queue,
            max_bytes: config.disconnect_queue_bytes,
        }
    }

    /// Queue the Disconnect call for session `sid`.
    pub fn enqueue(&self, node: &Arc<Node>, sid: String, req: DisconnectRequest) {
        let mut state = self.queue.state.lock();
        if state.closed {
            metrics::count(&m::DISCONNECTS_QUEUED);
            drop(state);
            node.tasks.spawn(call(self.rpc.clone(), sid, req));
            return;
        }
        let bytes = size(&sid, &req);
        if state.calls.len() >= self.max_calls || state.bytes + bytes > self.max_bytes {
            metrics::count(&m::DISCONNECTS_DROPPED);
            if !std::mem::replace(&mut state.dropping, true) {
                tracing::warn!(
                    calls = state.calls.len(),
                    bytes = state.bytes,
                    "Disconnect queue full: dropping calls until it drains (see \
                     rpc.disconnect_queue, rpc.disconnect_queue_bytes, \
                     herald_rpc_disconnects_dropped_total)"
                );
            }
            return;
        }
        if state.dropping
            && state.calls.len() <= self.max_calls / 2
            && state.bytes <= self.max_bytes / 2
        {
            state.dropping = false;
        }
        metrics::count(&m::DISCONNECTS_QUEUED);
        state.bytes += bytes;
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
        let call_now = {
            let mut state = queue.state.lock();
            let call = state.calls.pop_front();
            if let Some((sid, req)) = &call {
                state.bytes -= size(sid, req);
            }
            call
        };
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
        state.bytes = 0;
        std::mem::take(&mut state.calls)
    };
    for (sid, req) in rest {
        node.tasks.spawn(call(rpc.clone(), sid, req));
    }
}

/// The bytes a queued call holds: its encoded request (identifiers,
/// subscriptions, the headers passed on) and the queue's entry around it.
fn size(sid: &str, req: &DisconnectRequest) -> usize {
    sid.len() + req.encoded_len() + 256
}

async fn call(rpc: Arc<Rpc>, sid: String, req: DisconnectRequest) {
    let result = rpc.disconnect(&sid, req).await;
    metrics::count(&m::DISCONNECTS_SENT);
    match result {
        Ok(res) if crate::proto::status_of(res.status) == crate::proto::Status::Error => {
            metrics::count(&m::RPC_APP_ERRORS);
            if let Some(more) = FAILED.report() {
                tracing::warn!(sid, more, "RPC Disconnect: the app answered ERROR");
            }
        }
        Ok(_) => {}
        Err(e) => {
            if let Some(more) = FAILED.report() {
                tracing::warn!(sid, error = %e, more, "RPC Disconnect failed");
            }
        }
    }
}

/// Failed Disconnect calls are logged once per [`REPORT_EVERY`]: when the
/// app is down after a mass disconnect, thousands of queued calls fail
/// within seconds, and one line each would bury everything else.
static FAILED: Reports = Reports::new();

const REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// A log line's allowance: the first failure, then one per interval with
/// the count of those not logged since (`more`).
struct Reports {
    last_ms: std::sync::atomic::AtomicU64,
    skipped: std::sync::atomic::AtomicU64,
}

impl Reports {
    const fn new() -> Reports {
        Reports {
            last_ms: std::sync::atomic::AtomicU64::new(0),
            skipped: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// `Some(failures not logged since the last line)` when this one may
    /// be logged.
    fn report(&self) -> Option<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let now = herald_core::history::now_ms().max(1);
        let last = self.last_ms.load(Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= REPORT_EVERY.as_millis() as u64;
        if due
            && self
                .last_ms
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            Some(self.skipped.swap(0, Relaxed))
        } else {
            self.skipped.fetch_add(1, Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod report_tests {
    use super::Reports;

    #[test]
    fn failures_are_logged_once_per_interval_with_the_count_skipped() {
        let r = Reports::new();
        assert_eq!(r.report(), Some(0), "the first is logged");
        assert_eq!(r.report(), None);
        assert_eq!(r.report(), None);
        // As if the interval had passed.
        r.last_ms.store(1, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(r.report(), Some(2), "the two skipped are counted");
        assert_eq!(r.report(), None);
    }
}
