//! Reliable streams and resumable sessions for `actioncable-v1-ext-json`
//! clients: the bounds of the streams' history (the core publishes with
//! positions, [`herald_core::reliable`]), and the snapshots a reconnecting
//! client restores without a new `Connect`, kept in the broker's session
//! store.
//!
//! A stream becomes reliable when an extended-protocol client follows it
//! ([`herald_core::reliable::ReliableStreams::follow`]); streams only
//! `actioncable-v1-json` clients follow keep no history and publish
//! exactly as before.

use crate::config::{RpcConfig, MAX_STREAMS};
use herald_core::broker::Broker;
use herald_core::history::Limits;
use herald_core::node::Node;
use herald_core::sessions::SessionStore;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The bounds of reliable streams' history `[rpc]` sets (AnyCable's
/// `history_limit`, `history_ttl`, `history_max_bytes`), for the core's
/// [`herald_core::reliable::ReliableStreams`].
pub fn history_limits(config: &RpcConfig) -> Limits {
    Limits {
        per_stream: config.history_limit,
        ttl_ms: config.history_ttl.saturating_mul(1000),
        max_bytes: config.history_max_bytes,
    }
}

/// Sessions a reconnecting `actioncable-v1-ext-json` client restores,
/// kept as JSON snapshots in the broker's session store.
pub struct Resumable {
    /// Snapshots of sessions a client may restore, as JSON.
    pub sessions: Arc<dyn SessionStore>,
}

impl Resumable {
    pub fn new(config: &RpcConfig, broker: &dyn Broker) -> Resumable {
        Resumable {
            sessions: broker.sessions(
                Duration::from_secs(config.sessions_ttl),
                config.sessions_max,
            ),
        }
    }

    /// Expire sessions once a second (a task on the runtime). A router
    /// built outside one (tests that drive it in-process) has no sweeper,
    /// and its sessions stay bounded by their count alone.
    pub fn start_sweeper(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let me = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Some(me) = me.upgrade() else { return };
                me.sessions.sweep();
            }
        });
    }

    /// Keep `snap` for its client to restore under `sid` (marked live, with
    /// its node, while its connection lives: see [`Resumable::restore`]).
    pub fn keep(&self, sid: &str, snap: &Snapshot) {
        if self.sessions.enabled() {
            if let Ok(json) = serde_json::to_string(snap) {
                self.sessions.store(sid, json);
            }
        }
    }

    /// The session kept under `sid`, taken (it restores once), for a
    /// client whose token names `claim` (its identifiers; None: no token).
    ///
    /// A live session is never restored: it restores only once its
    /// connection is gone: a
    /// snapshot marked live restores only once its node is gone from the
    /// cluster (killed: it never wrote the close). A live one is read
    /// again for [`CLOSING_WAIT`] (its close may be on its way), then
    /// refused: the client starts a new session. A client whose token
    /// names another identity never gets it, and leaves it in place.
    pub async fn restore(&self, node: &Node, sid: &str, claim: Option<&str>) -> Option<Snapshot> {
        if !self.sessions.enabled() {
            return None;
        }
        let deadline = std::time::Instant::now() + CLOSING_WAIT;
        // How long a silent node is waited for its missed heartbeats'
        // verdict (it is buried within a third of the TTL after it).
        let ttl = node.broker.ttl();
        let verdict = (ttl + ttl / 3 + Duration::from_millis(500)).min(MAX_VERDICT_WAIT);
        let mut alive = None;
        loop {
            let kept = self.sessions.read(sid).await?;
            let snap: Snapshot = serde_json::from_str(&kept.snapshot).ok()?;
            // A snapshot from the engine is checked like client input: a
            // session never holds more streams than a live one may.
            if snap.subs.iter().map(|s| s.1.len()).sum::<usize>() > MAX_STREAMS {
                return None;
            }
            if claim.is_some_and(|c| !same_identity(c, &snap.identifiers)) {
                herald_core::metrics::count(&crate::metrics::CABLE_RESTORES_REFUSED);
                tracing::debug!("restore refused: the token names another identity");
                return None;
            }
            let gone = match snap.live {
                None => true,
                Some(owner) if alive == Some(owner) => false,
                Some(owner) => {
                    let gone = node.broker.gone(owner, verdict).await;
                    if !gone {
                        alive = Some(owner);
                    }
                    gone
                }
            };
            if gone && self.sessions.take(sid, &kept).await {
                let mut snap = snap;
                snap.live = None;
                return Some(snap);
            }
            if std::time::Instant::now() >= deadline {
                herald_core::metrics::count(&crate::metrics::CABLE_RESTORES_REFUSED);
                tracing::debug!("restore refused: the session's connection is live");
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// How long a restore waits for a live session's close to be written.
pub const CLOSING_WAIT: Duration = Duration::from_secs(1);

/// Longest wait for the verdict on a silent node holding a live session.
pub const MAX_VERDICT_WAIT: Duration = Duration::from_secs(10);

/// Whether two identifiers strings name the same identity: equal as JSON
/// (an app's token may order its keys otherwise than its `Connect`), or
/// as text.
fn same_identity(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (
        serde_json::from_str::<serde_json::Value>(a),
        serde_json::from_str::<serde_json::Value>(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// What a session leaves for its client to restore (JSON in the store).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Snapshot {
    pub identifiers: String,
    pub cstate: HashMap<String, String>,
    pub istate: HashMap<String, HashMap<String, String>>,
    /// Subscription identifier → its streams, in subscription order.
    pub subs: Vec<(String, Vec<String>)>,
    /// The app connected it (it hears of the restored one's disconnect).
    pub authenticated: bool,
    /// While its connection lives, the node holding it (absent
    /// once the connection closed, and in snapshots of older nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<u64>,
}
