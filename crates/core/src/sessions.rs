//! Resumable sessions: what a closed session leaves for its client to
//! restore (a protocol's snapshot, opaque here), kept for a while under the
//! session's id. The broker hands adapters a store
//! ([`crate::broker::Streams`]): [`MemorySessions`] on one node; the cluster
//! engines keep theirs in Redis or a JetStream key-value bucket, so a client
//! may restore on any node, even after the node it left was killed.
//!
//! On a cluster engine a snapshot is written while the session lives (each
//! time what it would restore changes), not only when it closes: a node
//! that dies without closing its sessions leaves them restorable.

use crate::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A store of session snapshots by session id.
pub trait SessionStore: Send + Sync {
    /// Engine name for logs and docs.
    fn name(&self) -> &'static str;
    /// Whether sessions are kept at all (`sessions_ttl` > 0).
    fn enabled(&self) -> bool;
    /// Keep `snapshot` under `sid` for the ttl from now (replacing what
    /// was there). Does not wait: a cluster engine writes in the background.
    fn store(&self, sid: &str, snapshot: String);
    /// Take the snapshot kept under `sid`, if any and not expired: a
    /// snapshot restores once.
    fn take(&self, sid: &str) -> BoxFuture<Option<String>>;
    /// Expire old snapshots (called about once a second).
    fn sweep(&self) {}
    /// Whether snapshots outlive this process (kept on a server): then an
    /// adapter writes one whenever it changes, not only at the close, so a
    /// killed node's sessions restore elsewhere. In process, the close is
    /// enough (and live sessions do not count against `sessions_max`).
    fn durable(&self) -> bool {
        false
    }
}

/// Snapshots in this process, bounded by count (`sessions_max`).
pub struct MemorySessions {
    ttl: Duration,
    max: usize,
    map: Mutex<HashMap<String, (Instant, String)>>,
}

impl MemorySessions {
    pub fn new(ttl: Duration, max: usize) -> MemorySessions {
        MemorySessions {
            ttl,
            max,
            map: Mutex::new(HashMap::new()),
        }
    }

    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn take_now(&self, sid: &str) -> Option<String> {
        let (at, snap) = self.map.lock().remove(sid)?;
        (at.elapsed() < self.ttl).then_some(snap)
    }
}

impl SessionStore for MemorySessions {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn enabled(&self) -> bool {
        !self.ttl.is_zero() && self.max > 0
    }

    /// When `sessions_max` are kept already (after expiring old ones), a
    /// new session is not kept (its client connects anew), logged at debug.
    fn store(&self, sid: &str, snapshot: String) {
        if !self.enabled() {
            return;
        }
        let mut map = self.map.lock();
        if map.len() >= self.max && !map.contains_key(sid) {
            let now = Instant::now();
            map.retain(|_, (at, _)| now.duration_since(*at) < self.ttl);
            if map.len() >= self.max {
                tracing::debug!("sessions cache full (sessions_max): session not kept");
                return;
            }
        }
        map.insert(sid.to_owned(), (Instant::now(), snapshot));
    }

    fn take(&self, sid: &str) -> BoxFuture<Option<String>> {
        Box::pin(std::future::ready(self.take_now(sid)))
    }

    fn sweep(&self) {
        let now = Instant::now();
        self.map
            .lock()
            .retain(|_, (at, _)| now.duration_since(*at) < self.ttl);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_restores_once_and_the_count_is_bounded() {
        let s = MemorySessions::new(Duration::from_secs(60), 2);
        s.store("a", "1".into());
        s.store("a", "2".into());
        s.store("b", "3".into());
        s.store("c", "4".into());
        assert_eq!(s.len(), 2);
        assert_eq!(s.take_now("a").as_deref(), Some("2"));
        assert_eq!(s.take_now("a"), None);
        assert_eq!(s.take_now("c"), None);
        let off = MemorySessions::new(Duration::ZERO, 2);
        off.store("a", "1".into());
        assert!(!off.enabled() && off.is_empty());
    }
}
