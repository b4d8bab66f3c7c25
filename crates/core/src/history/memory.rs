//! The in-process history engine: one node's streams in memory, bounded
//! per stream (count), by age and by total bytes. What the local broker
//! hands out, and what a cluster node uses when its engine keeps none.

use super::{now_ms, Backlog, Entry, History, Limits, Miss};
use crate::future::BoxFuture;
use crate::publication::Position;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Approximate fixed cost of one entry beside its data (the entry, its
/// `Arc` header, the queue slots): counted against `max_bytes`.
pub const ENTRY_OVERHEAD: usize = 96;

struct Stream {
    epoch: Arc<str>,
    /// Offset of the last publication (0: none yet).
    last: u64,
    entries: VecDeque<Entry>,
    /// Last append or retain, Unix ms: a stream idle past the ttl with no
    /// entries is forgotten (and its next life gets a new epoch).
    touched_ms: u64,
}

impl Stream {
    fn first_kept(&self) -> u64 {
        self.entries.front().map_or(self.last + 1, |e| e.offset)
    }
}

struct Inner {
    streams: HashMap<Box<str>, Stream>,
    /// (stream, offset, bytes) in append order over all streams: the
    /// oldest goes first when the node-wide byte bound is reached.
    order: VecDeque<(Arc<str>, u64, usize)>,
    bytes: usize,
}

/// The in-process engine (one node). One lock for all streams: only
/// reliable streams' publications and history reads take it, and a
/// publication holds it for one push; sharding can come when a profile
/// asks for it.
pub struct MemoryHistory {
    limits: Limits,
    inner: Mutex<Inner>,
    /// How many streams are reliable: 0 makes `append` one load.
    reliable: AtomicUsize,
    /// Epoch names: a random prefix per process and a generation counter,
    /// so an evicted stream's next life never reuses an epoch.
    nonce: u32,
    generation: AtomicU64,
}

impl MemoryHistory {
    pub fn new(limits: Limits) -> MemoryHistory {
        MemoryHistory {
            limits,
            inner: Mutex::new(Inner {
                streams: HashMap::new(),
                order: VecDeque::new(),
                bytes: 0,
            }),
            reliable: AtomicUsize::new(0),
            nonce: rand::random(),
            generation: AtomicU64::new(0),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Whether any history is kept at all (`history_limit` > 0).
    pub fn enabled(&self) -> bool {
        self.limits.enabled()
    }

    fn new_epoch(&self) -> Arc<str> {
        let g = self.generation.fetch_add(1, Ordering::Relaxed);
        Arc::from(format!("{:08x}{g:x}", self.nonce))
    }

    /// Bytes of data and overhead held now.
    pub fn bytes(&self) -> usize {
        self.inner.lock().bytes
    }

    /// Streams with a history now.
    pub fn streams(&self) -> usize {
        self.inner.lock().streams.len()
    }

    pub fn retain_at(&self, stream: &str, now: u64) {
        if !self.enabled() {
            return;
        }
        let mut inner = self.inner.lock();
        if let Some(s) = inner.streams.get_mut(stream) {
            s.touched_ms = now;
            return;
        }
        let epoch = self.new_epoch();
        inner.streams.insert(
            stream.into(),
            Stream {
                epoch,
                last: 0,
                entries: VecDeque::new(),
                touched_ms: now,
            },
        );
        self.reliable.fetch_add(1, Ordering::Relaxed);
    }

    pub fn append_at(&self, stream: &str, data: &str, now: u64) -> Option<Position> {
        if self.reliable.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let s = inner.streams.get_mut(stream)?;
        s.last += 1;
        s.touched_ms = now;
        let offset = s.last;
        let epoch = s.epoch.clone();
        let size = data.len() + ENTRY_OVERHEAD;
        s.entries.push_back(Entry {
            offset,
            at_ms: now,
            data: data.into(),
        });
        let mut dropped = 0;
        while s.entries.len() > self.limits.per_stream {
            let e = s.entries.pop_front().expect("longer than the limit");
            dropped += e.data.len() + ENTRY_OVERHEAD;
        }
        inner.bytes = inner.bytes + size - dropped;
        inner.order.push_back((Arc::from(stream), offset, size));
        self.trim(inner, now);
        Some(Position { epoch, offset })
    }

    /// Drop what is past the ttl or over the byte bound, and forget idle
    /// empty streams. Runs on every append and from [`MemoryHistory::sweep`].
    fn trim(&self, inner: &mut Inner, now: u64) {
        let cutoff = now.saturating_sub(self.limits.ttl_ms);
        while let Some((name, offset, size)) = inner.order.front().cloned() {
            let Some(s) = inner.streams.get_mut(&*name) else {
                inner.order.pop_front();
                continue;
            };
            let head = s.entries.front().map(|e| (e.offset, e.at_ms));
            match head {
                // Already gone (per-stream bound): its bytes were counted then.
                Some((o, _)) if o > offset => {
                    inner.order.pop_front();
                }
                None => {
                    inner.order.pop_front();
                }
                Some((o, at))
                    if o == offset && (at < cutoff || inner.bytes > self.limits.max_bytes) =>
                {
                    s.entries.pop_front();
                    inner.bytes -= size;
                    inner.order.pop_front();
                }
                _ => break,
            }
        }
        // `order` is oldest first, but a stream's head may be older than
        // the global head only through the per-stream bound: ttl is settled.
    }

    /// Expire old entries and forget streams idle past the ttl (called
    /// periodically; appends trim on their own).
    pub fn sweep_at(&self, now: u64) {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        self.trim(inner, now);
        let cutoff = now.saturating_sub(self.limits.ttl_ms);
        let before = inner.streams.len();
        inner
            .streams
            .retain(|_, s| !(s.entries.is_empty() && s.touched_ms < cutoff));
        let gone = before - inner.streams.len();
        if gone > 0 {
            self.reliable.fetch_sub(gone, Ordering::Relaxed);
        }
    }

    pub fn sweep(&self) {
        self.sweep_at(now_ms());
    }

    pub fn since_at(&self, stream: &str, unix_ms: u64) -> Result<Backlog, Miss> {
        let inner = self.inner.lock();
        let s = inner.streams.get(stream).ok_or(Miss::UnknownStream)?;
        Ok(Backlog {
            epoch: s.epoch.clone(),
            entries: s
                .entries
                .iter()
                .filter(|e| e.at_ms >= unix_ms)
                .cloned()
                .collect(),
        })
    }

    pub fn after_now(&self, stream: &str, epoch: &str, offset: u64) -> Result<Backlog, Miss> {
        let inner = self.inner.lock();
        let s = inner.streams.get(stream).ok_or(Miss::UnknownStream)?;
        if &*s.epoch != epoch {
            return Err(Miss::UnknownEpoch);
        }
        if offset > s.last {
            return Err(Miss::Ahead);
        }
        // The client has everything up to `offset`: we need offset + 1 on.
        if offset + 1 < s.first_kept() {
            return Err(Miss::Evicted);
        }
        Ok(Backlog {
            epoch: s.epoch.clone(),
            entries: s
                .entries
                .iter()
                .filter(|e| e.offset > offset)
                .cloned()
                .collect(),
        })
    }
}

impl History for MemoryHistory {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn retain(&self, stream: &str) {
        self.retain_at(stream, now_ms())
    }

    fn any_reliable(&self) -> bool {
        self.reliable.load(Ordering::Relaxed) > 0
    }

    fn append(&self, stream: &str, data: &str) -> BoxFuture<Option<Position>> {
        Box::pin(std::future::ready(self.append_at(stream, data, now_ms())))
    }

    fn after(&self, stream: &str, epoch: &str, offset: u64) -> BoxFuture<Result<Backlog, Miss>> {
        Box::pin(std::future::ready(self.after_now(stream, epoch, offset)))
    }

    fn since(&self, stream: &str, unix_secs: u64) -> BoxFuture<Result<Backlog, Miss>> {
        Box::pin(std::future::ready(
            self.since_at(stream, unix_secs.saturating_mul(1000)),
        ))
    }

    fn sweep(&self) {
        MemoryHistory::sweep(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits(per_stream: usize, ttl_ms: u64, max_bytes: usize) -> Limits {
        Limits {
            per_stream,
            ttl_ms,
            max_bytes,
        }
    }

    #[test]
    fn streams_nobody_retained_keep_nothing() {
        let h = MemoryHistory::new(limits(100, 300_000, 1 << 20));
        assert_eq!(h.append_at("a", "1", 0), None);
        h.retain_at("b", 0);
        assert_eq!(h.append_at("a", "1", 0), None);
        assert_eq!(h.after_now("a", "x", 0).unwrap_err(), Miss::UnknownStream);
        assert_eq!(h.bytes(), 0);
    }

    #[test]
    fn offsets_grow_by_one_and_reads_are_exact() {
        let h = MemoryHistory::new(limits(3, 300_000, 1 << 20));
        h.retain_at("s", 0);
        let p: Vec<Position> = (0..5)
            .map(|i| h.append_at("s", &i.to_string(), 10 * i).unwrap())
            .collect();
        assert_eq!(
            p.iter().map(|p| p.offset).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
        let epoch = p[0].epoch.clone();
        assert!(p.iter().all(|x| x.epoch == epoch));
        let got = h.after_now("s", &epoch, 2).unwrap();
        assert_eq!(
            got.entries.iter().map(|e| e.offset).collect::<Vec<_>>(),
            [3, 4, 5]
        );
        assert!(h.after_now("s", &epoch, 5).unwrap().entries.is_empty());
        assert_eq!(h.after_now("s", &epoch, 1).unwrap_err(), Miss::Evicted);
        assert_eq!(h.after_now("s", &epoch, 6).unwrap_err(), Miss::Ahead);
        assert_eq!(
            h.after_now("s", "other", 3).unwrap_err(),
            Miss::UnknownEpoch
        );
        let since = h.since_at("s", 30).unwrap();
        assert_eq!(
            since.entries.iter().map(|e| e.offset).collect::<Vec<_>>(),
            [4, 5]
        );
    }

    #[test]
    fn age_and_bytes_bound_the_history_and_idle_streams_get_a_new_epoch() {
        let h = MemoryHistory::new(limits(100, 1000, 1 << 20));
        h.retain_at("s", 0);
        let p1 = h.append_at("s", "a", 0).unwrap();
        h.append_at("s", "b", 900).unwrap();
        h.sweep_at(1500);
        let b = h.after_now("s", &p1.epoch, 1).unwrap();
        assert_eq!(b.entries.len(), 1);
        assert_eq!(h.after_now("s", &p1.epoch, 0).unwrap_err(), Miss::Evicted);
        h.sweep_at(5000);
        assert_eq!(h.streams(), 0);
        assert_eq!(h.bytes(), 0);
        h.retain_at("s", 5000);
        let p = h.append_at("s", "c", 5000).unwrap();
        assert_ne!(p.epoch, p1.epoch);
        assert_eq!(p.offset, 1);

        let small = MemoryHistory::new(limits(100, 300_000, 3 * (ENTRY_OVERHEAD + 10)));
        small.retain_at("x", 0);
        small.retain_at("y", 0);
        for i in 0..10 {
            small.append_at(if i % 2 == 0 { "x" } else { "y" }, "0123456789", i);
            assert!(small.bytes() <= 3 * (ENTRY_OVERHEAD + 10));
        }
    }

    proptest! {
        /// Offsets are contiguous, bounds hold, and a read from any offset
        /// returns each retained later publication exactly once, in order,
        /// or says it cannot.
        #[test]
        fn reads_are_exact_and_bounds_hold(
            ops in proptest::collection::vec((0usize..3, 1usize..40, 0u64..400), 1..200),
            per_stream in 1usize..20,
            ttl_ms in 1u64..2000,
            budget in 0usize..8,
        ) {
            let max_bytes = budget * (ENTRY_OVERHEAD + 20);
            let h = MemoryHistory::new(limits(per_stream, ttl_ms, max_bytes));
            let names = ["a", "b", "c"];
            for n in names { h.retain_at(n, 0); }
            let mut now = 0;
            let mut last = [0u64; 3];
            let mut epoch: [Option<Arc<str>>; 3] = [None, None, None];
            for (s, len, dt) in ops {
                now += dt;
                let p = h.append_at(names[s], &"x".repeat(len % 20), now).unwrap();
                prop_assert_eq!(p.offset, last[s] + 1);
                if let Some(e) = &epoch[s] { prop_assert_eq!(e, &p.epoch); }
                last[s] = p.offset;
                epoch[s] = Some(p.epoch.clone());
                prop_assert!(h.bytes() <= max_bytes);
                for (i, n) in names.iter().enumerate() {
                    let Some(e) = &epoch[i] else { continue };
                    let all = h.since_at(n, 0).unwrap().entries;
                    prop_assert!(all.len() <= per_stream);
                    prop_assert!(all.iter().all(|x| x.at_ms + ttl_ms >= now));
                    prop_assert!(all.windows(2).all(|w| w[1].offset == w[0].offset + 1));
                    for from in 0..=last[i] {
                        match h.after_now(n, e, from) {
                            Ok(b) => {
                                let got: Vec<u64> = b.entries.iter().map(|x| x.offset).collect();
                                let want: Vec<u64> = (from + 1..=last[i]).collect();
                                prop_assert_eq!(got, want);
                            }
                            Err(m) => {
                                prop_assert_eq!(m, Miss::Evicted);
                                prop_assert!(all.first().is_none_or(|x| x.offset > from + 1));
                            }
                        }
                    }
                }
            }
        }
    }
}
