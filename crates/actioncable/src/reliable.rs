//! Reliable streams and resumable sessions for `actioncable-v1-ext-json`
//! clients on one node (issue 19, first slice): the in-process history
//! engine, publishing with positions, and the cache of closed sessions a
//! reconnecting client can restore without a new `Connect`.
//!
//! A stream becomes reliable when an extended-protocol client follows it
//! ([`History::retain`]); streams only `actioncable-v1-json` clients follow
//! keep no history and publish exactly as before.

use crate::config::RpcConfig;
use crate::session::MAX_STREAMS;
use herald_core::fanout::Publication;
use herald_core::history::{History, Limits, MemoryHistory};
use herald_core::hub::Hub;
use herald_core::node::Node;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Publications to one stream are appended and handed to fan-out under
/// one of these locks, so live delivery sees offsets in order (the
/// connection gate drops anything at or below what it already sent).
const ORDER_LOCKS: usize = 64;

pub struct Reliable {
    pub history: Arc<MemoryHistory>,
    order: Vec<tokio::sync::Mutex<()>>,
    pub sessions: Sessions,
    /// History requests per connection per second (and the burst).
    pub history_rate: u32,
}

impl Reliable {
    pub fn new(config: &RpcConfig) -> Reliable {
        let history = Arc::new(MemoryHistory::new(Limits {
            per_stream: config.history_limit,
            ttl_ms: config.history_ttl.saturating_mul(1000),
            max_bytes: config.history_max_bytes,
        }));
        Reliable {
            history,
            order: (0..ORDER_LOCKS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            sessions: Sessions::new(
                Duration::from_secs(config.sessions_ttl),
                config.sessions_max,
            ),
            history_rate: config.history_rate,
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
            loop {
                tick.tick().await;
                let Some(me) = me.upgrade() else { return };
                me.history.sweep();
                me.sessions.sweep();
            }
        });
    }

    /// Publish `p` on `stream`: with its position when the stream is
    /// reliable; `here` delivers on this node only (see `broadcast`).
    pub async fn publish(
        &self,
        node: &Node,
        hub: &Hub,
        stream: &str,
        mut p: Publication,
        here: bool,
    ) {
        if !self.history.any_reliable() {
            return send(node, hub, p, here).await;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        stream.hash(&mut h);
        let _order = self.order[h.finish() as usize % ORDER_LOCKS].lock().await;
        p.position = self.history.append(stream, p.data.get());
        send(node, hub, p, here).await;
    }
}

async fn send(node: &Node, hub: &Hub, p: Publication, here: bool) {
    if here {
        node.publish_here(hub, p).await
    } else {
        node.publish(hub, p).await
    }
}

/// What a closed session leaves for its client to restore.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub identifiers: String,
    pub cstate: HashMap<String, String>,
    pub istate: HashMap<String, HashMap<String, String>>,
    /// Subscription identifier → its streams, in subscription order.
    pub subs: Vec<(String, Vec<String>)>,
    /// The app connected it (it hears of the restored one's disconnect).
    pub authenticated: bool,
}

/// Closed sessions by their `sid`, for `sessions_ttl`. A snapshot is taken
/// out when restored: a `sid` restores once.
pub struct Sessions {
    ttl: Duration,
    max: usize,
    map: Mutex<HashMap<String, (Instant, Snapshot)>>,
}

impl Sessions {
    pub fn new(ttl: Duration, max: usize) -> Sessions {
        Sessions {
            ttl,
            max,
            map: Mutex::new(HashMap::new()),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.ttl.is_zero() && self.max > 0
    }

    /// Keep `snap` under `sid`; when `sessions_max` are kept already, the
    /// session is not kept (its client connects anew), logged at debug.
    pub fn store(&self, sid: &str, snap: Snapshot) {
        if !self.enabled() {
            return;
        }
        debug_assert!(snap.subs.iter().map(|s| s.1.len()).sum::<usize>() <= MAX_STREAMS);
        let mut map = self.map.lock();
        if map.len() >= self.max {
            let now = Instant::now();
            map.retain(|_, (at, _)| now.duration_since(*at) < self.ttl);
            if map.len() >= self.max {
                tracing::debug!("sessions cache full (rpc.sessions_max): session not kept");
                return;
            }
        }
        map.insert(sid.to_owned(), (Instant::now(), snap));
    }

    /// The session closed as `sid`, if it is kept and not expired.
    pub fn take(&self, sid: &str) -> Option<Snapshot> {
        let (at, snap) = self.map.lock().remove(sid)?;
        (at.elapsed() < self.ttl).then_some(snap)
    }

    pub fn sweep(&self) {
        let now = Instant::now();
        self.map
            .lock()
            .retain(|_, (at, _)| now.duration_since(*at) < self.ttl);
    }

    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
