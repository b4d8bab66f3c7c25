//! What this node last read of each stream's JetStream history, keyed by
//! the stream's tip (the sequence, epoch and offset of its last message).
//!
//! Every read still asks the server for the tip (one direct get), so an
//! answer is never older than the read: when the tip is the one cached,
//! the cached entries are the answer; when the tip moved on in the same
//! epoch, only the messages after the cached tip are read and added; any
//! other change (new epoch, the stream recreated with lower sequences)
//! reads the stream afresh. Without this, every read walked up to
//! `history_limit` messages one round trip each, and a reconnect storm's
//! reads timed out.
//!
//! Bounded: entries beyond `history_limit` or older than `history_ttl`
//! are dropped as the server drops them, streams not read for [`IDLE`]
//! are forgotten on the next sweep, and past [`MAX_BYTES`] the least
//! recently read streams go first.

use herald_core::history::{Entry, Limits};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A stream not read for this long is dropped from the cache.
pub const IDLE: Duration = Duration::from_secs(30);

/// Most bytes of cached messages per node (payloads plus a fixed cost per
/// entry); the least recently read streams are dropped past it.
pub const MAX_BYTES: usize = 64 * 1024 * 1024;

/// Bytes an entry is counted for besides its payload.
const ENTRY_COST: usize = 64;

/// One stream's history as read at its tip.
#[derive(Debug, Clone)]
pub struct Read {
    /// JetStream sequence of the stream's last message.
    pub seq: u64,
    pub epoch: Arc<str>,
    /// Offset of that last message.
    pub offset: u64,
    /// Its retained messages of `epoch`, oldest first.
    pub entries: Arc<Vec<Entry>>,
}

impl Read {
    fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.data.len() + ENTRY_COST).sum()
    }

    /// Whether `tip` (seq, epoch, offset) is this read's own tip.
    pub fn at(&self, seq: u64, epoch: &str, offset: u64) -> bool {
        self.seq == seq && *self.epoch == *epoch && self.offset == offset
    }

    /// Whether messages after this read's tip up to `tip` can be added to
    /// it (same epoch, further on); otherwise the stream is read afresh.
    pub fn extends_to(&self, seq: u64, epoch: &str, offset: u64) -> bool {
        *self.epoch == *epoch && seq > self.seq && offset > self.offset
    }

    /// This read with `more` (messages after its tip, oldest first, all of
    /// its epoch) added, at the new tip, bounded as the server bounds them.
    pub fn extend(&self, seq: u64, offset: u64, more: Vec<Entry>, limits: &Limits) -> Read {
        let mut entries = Vec::with_capacity(self.entries.len() + more.len());
        entries.extend(self.entries.iter().cloned());
        entries.extend(more);
        Read {
            seq,
            epoch: self.epoch.clone(),
            offset,
            entries: Arc::new(entries),
        }
        .bounded(limits, herald_core::history::now_ms())
    }

    /// Only the newest `history_limit` entries younger than `history_ttl`
    /// at `now_ms` (what the server still keeps).
    pub fn bounded(mut self, limits: &Limits, now_ms: u64) -> Read {
        let oldest = now_ms.saturating_sub(limits.ttl_ms);
        let over = self.entries.len().saturating_sub(limits.per_stream);
        let expired = self
            .entries
            .iter()
            .skip(over)
            .take_while(|e| e.at_ms < oldest);
        let drop = over + expired.count();
        if drop > 0 {
            let kept = self.entries[drop..].to_vec();
            self.entries = Arc::new(kept);
        }
        self
    }
}

/// Reads by stream name; see the module's comment.
pub struct Cache {
    streams: HashMap<Arc<str>, (Arc<Read>, Instant)>,
    bytes: usize,
    max_bytes: usize,
}

impl Default for Cache {
    fn default() -> Self {
        Cache::new(MAX_BYTES)
    }
}

impl Cache {
    pub fn new(max_bytes: usize) -> Cache {
        Cache {
            streams: HashMap::new(),
            bytes: 0,
            max_bytes,
        }
    }

    pub fn get(&mut self, name: &str) -> Option<Arc<Read>> {
        let (read, used) = self.streams.get_mut(name)?;
        *used = Instant::now();
        Some(read.clone())
    }

    pub fn put(&mut self, name: &str, read: Arc<Read>) {
        self.remove(name);
        let size = read.bytes();
        if size > self.max_bytes {
            return;
        }
        while self.bytes + size > self.max_bytes {
            let lru = self
                .streams
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            match lru {
                Some(k) => self.remove(&k),
                None => break,
            }
        }
        self.bytes += size;
        self.streams.insert(Arc::from(name), (read, Instant::now()));
    }

    pub fn remove(&mut self, name: &str) {
        if let Some((read, _)) = self.streams.remove(name) {
            self.bytes -= read.bytes();
        }
    }

    /// Forget streams not read for [`IDLE`].
    pub fn sweep(&mut self) {
        let mut gone = 0;
        self.streams.retain(|_, (read, used)| {
            let keep = used.elapsed() < IDLE;
            if !keep {
                gone += read.bytes();
            }
            keep
        });
        self.bytes -= gone;
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.streams.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(offset: u64, at_ms: u64) -> Entry {
        Entry {
            offset,
            at_ms,
            data: "0123456789".into(),
        }
    }

    fn read(seq: u64, offsets: std::ops::RangeInclusive<u64>) -> Read {
        Read {
            seq,
            epoch: Arc::from("e"),
            offset: *offsets.end(),
            entries: Arc::new(offsets.map(|o| entry(o, u64::MAX / 2)).collect()),
        }
    }

    fn limits(per_stream: usize, ttl_ms: u64) -> Limits {
        Limits {
            per_stream,
            ttl_ms,
            max_bytes: 0,
        }
    }

    fn offsets(r: &Read) -> Vec<u64> {
        r.entries.iter().map(|e| e.offset).collect()
    }

    #[test]
    fn a_moved_tip_adds_what_came_after_and_keeps_the_bounds() {
        let r = read(10, 1..=3);
        assert!(r.at(10, "e", 3));
        assert!(!r.at(11, "e", 4));
        assert!(r.extends_to(12, "e", 5));
        assert!(!r.extends_to(12, "other", 5), "a new epoch reads afresh");
        assert!(!r.extends_to(9, "e", 5), "a recreated stream reads afresh");
        assert!(!r.extends_to(10, "e", 3), "the same tip is no extension");
        let now = herald_core::history::now_ms();
        let more = vec![entry(4, now), entry(5, now)];
        let r2 = r.extend(12, 5, more, &limits(4, 300_000));
        assert_eq!((r2.seq, r2.offset), (12, 5));
        assert_eq!(offsets(&r2), vec![2, 3, 4, 5], "at most history_limit");
        assert_eq!(offsets(&r), vec![1, 2, 3], "the cached read is untouched");
    }

    #[test]
    fn entries_older_than_the_ttl_are_dropped() {
        let mut r = read(5, 1..=3);
        r.entries = Arc::new(vec![entry(1, 1_000), entry(2, 5_000), entry(3, 9_000)]);
        let r = r.bounded(&limits(100, 5_000), 10_000);
        assert_eq!(offsets(&r), vec![2, 3]);
        let r = r.bounded(&limits(100, 5_000), 20_000);
        assert!(r.entries.is_empty());
    }

    #[test]
    fn the_cache_is_bounded_by_bytes_least_recently_read_first() {
        // Each read of 3 entries costs 3 * (10 + ENTRY_COST) bytes.
        let one = read(1, 1..=3).bytes();
        let mut c = Cache::new(one * 2);
        c.put("a", Arc::new(read(1, 1..=3)));
        c.put("b", Arc::new(read(2, 1..=3)));
        assert!(c.get("a").is_some(), "a is now the most recently read");
        c.put("c", Arc::new(read(3, 1..=3)));
        assert!(c.get("b").is_none(), "b was the least recently read");
        assert!(c.get("a").is_some() && c.get("c").is_some());
        assert_eq!(c.bytes, one * 2);
        // Replacing a stream's read does not count it twice.
        c.put("c", Arc::new(read(4, 1..=3)));
        assert_eq!((c.len(), c.bytes), (2, one * 2));
        assert_eq!(c.get("c").unwrap().seq, 4);
        // Bigger than the whole cache: not kept.
        c.put("big", Arc::new(read(5, 1..=10)));
        assert!(c.get("big").is_none());
        c.remove("a");
        c.remove("c");
        assert_eq!((c.len(), c.bytes), (0, 0));
    }
}
