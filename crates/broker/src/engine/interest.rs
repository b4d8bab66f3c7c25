//! When the broker holds this node's interest: what a confirmation waits
//! for ([`PubSub::held`]).
//!
//! A transport numbers each connection it makes and reports it *holding*
//! once the connection's subscriptions are in effect at the broker: on
//! Redis once every `SUBSCRIBE` is answered, on NATS once a round trip
//! shows the server read the restored `SUB`s (and on a NATS cluster once a
//! probe round shows every node's server knows them, see [`super::reach`]).
//! A lost connection holds nothing. [`PubSub::holding`] is one atomic load.
//!
//! A confirmation that waits: until some connection holds, then a flush on
//! it (the transport applies interest changes made before the flush, then
//! answers, after a round trip and a probe round on NATS); the interest is
//! held if that same connection still holds afterwards. A connection lost
//! meanwhile: again on the next one, until the bound
//! (`broker.confirm_timeout`).

#[allow(unused_imports)]
use super::*;

impl Shared {
    /// A new connection's number, for [`Shared::holds_interest`].
    pub fn next_connection(&self) -> u64 {
        self.connections.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Connection `n`'s subscriptions are in effect at the broker; ignored
    /// if a newer connection was made, or this one was lost, meanwhile.
    pub fn holds_interest(&self, n: u64) {
        if self.connections.load(Ordering::Acquire) == n && self.is_up() {
            self.holding.store(n, Ordering::Release);
            self.held_changed.notify_waiters();
        }
    }

    /// The connection is gone: nothing is held (before `up` turns false,
    /// so whoever sees the engine down sees nothing held).
    pub(super) fn release(&self) {
        self.holding.store(0, Ordering::Release);
        self.held_changed.notify_waiters();
    }

    /// Whether a connection holds the interest now.
    pub fn is_holding(&self) -> bool {
        self.holding.load(Ordering::Acquire) != 0
    }

    /// Resolves once interest handed to the engine before the call is in
    /// effect on a connection that still holds; `false` if the engine
    /// stopped.
    async fn until_held(self: Arc<Self>) -> bool {
        loop {
            let n = loop {
                let changed = self.held_changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                let n = self.holding.load(Ordering::Acquire);
                if n != 0 {
                    break n;
                }
                changed.await;
            };
            let (tx, rx) = oneshot::channel();
            if self.out.send(Out::Flush(tx)).await.is_err() {
                return false;
            }
            // A flush dropped unanswered (the session ended) or answered
            // by another connection proves nothing: wait again.
            if rx.await.is_ok() && self.holding.load(Ordering::Acquire) == n {
                return true;
            }
            tokio::task::yield_now().await;
        }
    }
}

/// [`PubSub::held`] for the engines.
pub(super) fn held(shared: &Arc<Shared>, within: Duration) -> BoxFuture<bool> {
    let sh = shared.clone();
    Box::pin(async move {
        tokio::time::timeout(within, sh.until_held())
            .await
            .unwrap_or(false)
    })
}
