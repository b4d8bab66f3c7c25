//! Reliable streams and resumable sessions for `actioncable-v1-ext-json`
//! clients (issue 19): publishing with positions through the broker's
//! history engine (in process on one node, Redis Streams or JetStream in a
//! cluster), and the snapshots a reconnecting client restores without a
//! new `Connect`, kept in the broker's session store.
//!
//! A stream becomes reliable when an extended-protocol client follows it
//! ([`History::retain`]); streams only `actioncable-v1-json` clients follow
//! keep no history and publish exactly as before.

use crate::config::RpcConfig;
use crate::session::MAX_STREAMS;
use herald_core::broker::{Broker, Full};
use herald_core::history::{History, Limits, MemoryHistory};
use herald_core::hub::Hub;
use herald_core::node::Node;
use herald_core::publication::Publication;
use herald_core::sessions::SessionStore;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

/// Publications to one stream are appended and handed to fan-out under
/// one of these locks, so live delivery sees offsets in order (the
/// connection gate drops anything at or below what it already sent).
const ORDER_LOCKS: usize = 64;

pub struct Reliable {
    /// The broker's history engine: in process on one node, the engine's
    /// server in a cluster.
    pub history: Arc<dyn History>,
    order: Vec<tokio::sync::Mutex<()>>,
    /// Snapshots of sessions a client may restore, as JSON.
    pub sessions: Arc<dyn SessionStore>,
    /// History requests per connection per second (and the burst).
    pub history_rate: u32,
    /// Bytes of history answers one connection may have waiting past its
    /// outbound queue's bound (`history_max_bytes`: on one node no answer
    /// can be larger than everything the node keeps).
    pub answer_room: usize,
    /// Streams this node's extended-protocol connections follow, and how
    /// many follow each: retained again every `retain_every` seconds, so a
    /// stream followed for hours but published to rarely stays reliable
    /// (an engine forgets a stream idle past `history_ttl`).
    followed: Mutex<HashMap<Box<str>, usize>>,
    /// Half the `history_ttl`, 1 to 10 s.
    retain_every: u64,
}

impl Reliable {
    pub fn new(config: &RpcConfig, broker: &dyn Broker) -> Reliable {
        let limits = Limits {
            per_stream: config.history_limit,
            ttl_ms: config.history_ttl.saturating_mul(1000),
            max_bytes: config.history_max_bytes,
        };
        // One account for the node's answers, whichever app queues them.
        herald_core::history::budget::ANSWERS.bound(config.history_answers_max_bytes);
        let history: Arc<dyn History> = if limits.enabled() {
            broker.history(limits)
        } else {
            // Off: nothing is ever reliable, whatever the engine.
            Arc::new(MemoryHistory::new(limits))
        };
        Reliable {
            history,
            order: (0..ORDER_LOCKS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            sessions: broker.sessions(
                Duration::from_secs(config.sessions_ttl),
                config.sessions_max,
            ),
            history_rate: config.history_rate,
            answer_room: config.history_max_bytes,
            followed: Mutex::new(HashMap::new()),
            retain_every: (config.history_ttl / 2).clamp(1, 10),
        }
    }

    /// An extended-protocol connection follows `stream`: it is reliable
    /// once the returned future resolves (on a cluster engine, once the
    /// server marked it), which the subscription's confirmation waits for.
    pub fn follow(&self, stream: &str) -> herald_core::future::BoxFuture<()> {
        *self.followed.lock().entry(stream.into()).or_default() += 1;
        self.history.retain_now(stream)
    }

    /// One follower of `stream` left.
    pub fn unfollow(&self, stream: &str) {
        let mut followed = self.followed.lock();
        if let Some(n) = followed.get_mut(stream) {
            *n -= 1;
            if *n == 0 {
                followed.remove(stream);
            }
        }
    }

    /// Retain every followed stream again (see `followed`).
    fn retain_followed(&self) {
        let streams: Vec<Box<str>> = self.followed.lock().keys().cloned().collect();
        for s in &streams {
            self.history.retain(s);
        }
    }

    /// Expire history and sessions once a second (a task on the runtime).
    /// The server builds its routes inside the runtime; a router built
    /// outside one (tests that drive it in-process) has no sweeper, and its
    /// history and sessions stay bounded by their counts and bytes alone.
    pub fn start_sweeper(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let me = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut ticks: u64 = 0;
            loop {
                tick.tick().await;
                let Some(me) = me.upgrade() else { return };
                ticks += 1;
                if ticks.is_multiple_of(me.retain_every) {
                    me.retain_followed();
                }
                me.history.sweep();
                me.sessions.sweep();
            }
        });
    }

    /// Publish `p` on `stream`: with its position when the stream is
    /// reliable; `here` delivers on this node only (see `broadcast`).
    /// Publications of one stream are appended and handed on in order: on
    /// one node that is the order subscribers see; in a cluster each
    /// connection's gate restores it (see `Gate`). `Err(Full)`: the
    /// broker's outbox is full and nobody got it (though a reliable
    /// stream's history has it).
    pub async fn publish(
        &self,
        node: &Node,
        hub: &Hub,
        stream: &str,
        mut p: Publication,
        here: bool,
    ) -> Result<(), Full> {
        if !self.history.any_reliable() {
            return send(node, hub, p, here).await;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        stream.hash(&mut h);
        let _order = self.order[h.finish() as usize % ORDER_LOCKS].lock().await;
        p.position = self.history.append(stream, p.data.get()).await;
        send(node, hub, p, here).await
    }

    /// Keep `snap` for its client to restore under `sid` (marked live, with
    /// its node, while its connection lives: see [`Reliable::restore`]).
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
    /// Issue 32: a session restores only once its connection is gone: a
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

async fn send(node: &Node, hub: &Hub, p: Publication, here: bool) -> Result<(), Full> {
    if here {
        node.publish_here(hub, p).await;
        Ok(())
    } else {
        node.publish(hub, p).await
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
    /// Issue 32: while its connection lives, the node holding it (absent
    /// once the connection closed, and in snapshots of older nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<u64>,
}
