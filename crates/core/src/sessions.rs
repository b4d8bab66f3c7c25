//! Resumable sessions: what a closed session leaves for its client to
//! restore (a protocol's snapshot, opaque here), kept for a while under the
//! session's id. The broker hands adapters a store
//! ([`crate::broker::Streams`]): [`MemorySessions`] on one node; the cluster
//! engines keep theirs in Redis or a JetStream key-value bucket, so a client
//! may restore on any node, even after the node it left was killed.
//!
//! On a cluster engine a snapshot is written while the session lives (each
//! time what it would restore changes), not only when it closes: a node
//! that dies without closing its sessions leaves them restorable. Whether
//! a snapshot may be restored (its connection gone) is its adapter's
//! decision, between a [`SessionStore::read`] and a [`SessionStore::take`]
//! of exactly what it read (a live session is never restored).

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
    /// The snapshot kept under `sid`, if any and not expired, left in
    /// place.
    fn read(&self, sid: &str) -> BoxFuture<Option<Kept>>;
    /// Remove what [`SessionStore::read`] gave, only if the store still
    /// holds that very write of it: true for the one caller that has it (a
    /// snapshot restores once; one rewritten meanwhile is read again).
    fn take(&self, sid: &str, kept: &Kept) -> BoxFuture<bool>;
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

/// A snapshot as read, and which write of it that was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    pub snapshot: String,
    /// The engine's mark of the write (a counter, a token, a revision).
    pub version: String,
}

/// Snapshots in this process, bounded by count (`sessions_max`).
pub struct MemorySessions {
    ttl: Duration,
    max: usize,
    /// sid → (written at, write number, snapshot).
    map: Mutex<HashMap<String, (Instant, u64, String)>>,
    writes: std::sync::atomic::AtomicU64,
}

impl MemorySessions {
    pub fn new(ttl: Duration, max: usize) -> MemorySessions {
        MemorySessions {
            ttl,
            max,
            map: Mutex::new(HashMap::new()),
            writes: Default::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read_now(&self, sid: &str) -> Option<Kept> {
        let map = self.map.lock();
        let (at, n, snap) = map.get(sid)?;
        (at.elapsed() < self.ttl).then(|| Kept {
            snapshot: snap.clone(),
            version: n.to_string(),
        })
    }

    fn take_now(&self, sid: &str, kept: &Kept) -> bool {
        let mut map = self.map.lock();
        match map.get(sid) {
            Some((at, n, _)) if at.elapsed() < self.ttl && n.to_string() == kept.version => {
                map.remove(sid);
                true
            }
            _ => false,
        }
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
            map.retain(|_, (at, _, _)| now.duration_since(*at) < self.ttl);
            if map.len() >= self.max {
                tracing::debug!("sessions cache full (sessions_max): session not kept");
                return;
            }
        }
        let n = self
            .writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        map.insert(sid.to_owned(), (Instant::now(), n, snapshot));
    }

    fn read(&self, sid: &str) -> BoxFuture<Option<Kept>> {
        Box::pin(std::future::ready(self.read_now(sid)))
    }

    fn take(&self, sid: &str, kept: &Kept) -> BoxFuture<bool> {
        Box::pin(std::future::ready(self.take_now(sid, kept)))
    }

    fn sweep(&self) {
        let now = Instant::now();
        self.map
            .lock()
            .retain(|_, (at, _, _)| now.duration_since(*at) < self.ttl);
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
        let a = s.read_now("a").unwrap();
        assert_eq!(a.snapshot, "2");
        // Rewritten after the read: the read one is not taken.
        s.store("a", "5".into());
        assert!(!s.take_now("a", &a));
        let a = s.read_now("a").unwrap();
        assert!(s.take_now("a", &a));
        assert!(!s.take_now("a", &a));
        assert_eq!(s.read_now("a"), None);
        assert_eq!(s.read_now("c"), None);
        let off = MemorySessions::new(Duration::ZERO, 2);
        off.store("a", "1".into());
        assert!(!off.enabled() && off.is_empty());
    }
}
