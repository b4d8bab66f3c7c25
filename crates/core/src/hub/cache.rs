//! Cache slots: the last event of each cache channel, replayed to new
//! subscribers for `cache_ttl` seconds.
//!
//! Anyone who may publish can make the server keep one event per channel
//! name, and channel names are free, so the slots of one app share a byte
//! budget (`max_cache_bytes`): past it the least recently used slot (the
//! one nobody published to or replayed longest) is evicted and counted.
//! Expired slots are freed when they are looked up and by a periodic sweep
//! ([`Cache::expire`]), so channels nobody touches again do not stay.
//!
//! One lock per app guards the slots. Only cache channels touch it (a
//! publish to one, a subscribe to one, the sweep), and every operation
//! under it is a hash lookup and a list relink, except the sweep, which
//! walks the slots once per housekeeping tick.

use crate::namespace::{ChannelId, Namespace};
use crate::publication::Publication;
use lru::LruCache;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one slot costs besides its strings: the slot and publication
/// structs, the list node, the map's entry and the allocators' rounding.
const SLOT_OVERHEAD: usize = 256;

/// The bytes a slot holding `p` under `channel` keeps: its strings and
/// payload, and the one frame replaying it builds and keeps (the frame
/// carries the channel, the event name and the payload again).
pub fn weight(channel: &str, p: &Publication) -> usize {
    let opt = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    let fields = p.channel.len()
        + p.event.len()
        + p.data.get().len()
        + opt(&p.exclude)
        + opt(&p.user_id)
        + opt(&p.to_user);
    let frame = p.channel.len() + p.event.len() + p.data.get().len() + opt(&p.user_id) + 64;
    channel.len() + fields + frame + SLOT_OVERHEAD
}

struct Slot {
    publication: Arc<Publication>,
    /// When it was published (on the node that published it).
    at: Instant,
    weight: usize,
}

struct Slots {
    lru: LruCache<ChannelId, Slot>,
    bytes: usize,
}

/// One app's cache slots.
pub struct Cache {
    ttl: Duration,
    budget: usize,
    slots: Mutex<Slots>,
    /// Copies of the figures for scrapes, which should not take the lock.
    bytes: AtomicUsize,
    events: AtomicUsize,
    evictions: AtomicU64,
}

impl Cache {
    /// Slots kept for `ttl`, `budget` bytes in all.
    pub fn new(ttl: Duration, budget: usize) -> Cache {
        Cache {
            ttl,
            budget,
            slots: Mutex::new(Slots {
                lru: LruCache::unbounded(),
                bytes: 0,
            }),
            bytes: AtomicUsize::new(0),
            events: AtomicUsize::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// Keep `p` as `channel`'s last event, published now.
    pub fn put(&self, p: Arc<Publication>) {
        let key = ChannelId(p.ns, p.channel.clone());
        self.keep(key, p, Instant::now(), false);
    }

    /// Keep a publication another node holds (published `age` ago) unless
    /// this node has a newer one.
    pub fn seed(&self, p: Publication, age: Duration) {
        let Some(at) = Instant::now().checked_sub(age) else {
            return;
        };
        if age >= self.ttl {
            return;
        }
        let key = ChannelId(p.ns, p.channel.clone());
        self.keep(key, Arc::new(p), at, true);
    }

    fn keep(&self, key: ChannelId, p: Arc<Publication>, at: Instant, only_if_newer: bool) {
        let weight = weight(&key.1, &p);
        let mut s = self.slots.lock();
        let old = match s.lru.get_mut(&key) {
            Some(slot) if only_if_newer && slot.at >= at => return,
            Some(slot) => {
                let old = slot.weight;
                *slot = Slot {
                    publication: p,
                    at,
                    weight,
                };
                old
            }
            None => {
                s.lru.push(
                    key,
                    Slot {
                        publication: p,
                        at,
                        weight,
                    },
                );
                0
            }
        };
        s.bytes = s.bytes + weight - old;
        let mut evicted = 0;
        while s.bytes > self.budget {
            let Some((_, slot)) = s.lru.pop_lru() else {
                break;
            };
            s.bytes -= slot.weight;
            evicted += 1;
        }
        self.publish_figures(&s);
        drop(s);
        if evicted > 0 {
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
        }
    }

    /// `channel`'s last event within the TTL, and its age; a hit counts as
    /// a use (it moves the slot away from eviction), an expired slot found
    /// here is freed.
    pub fn get(&self, ns: Namespace, channel: &str) -> Option<(Arc<Publication>, Duration)> {
        // A key to look up by (only cache channels come here).
        let key = ChannelId(ns, channel.to_owned());
        let mut s = self.slots.lock();
        let slot = s.lru.get(&key)?;
        let age = slot.at.elapsed();
        if age < self.ttl {
            return Some((slot.publication.clone(), age));
        }
        if let Some(slot) = s.lru.pop(&key) {
            s.bytes -= slot.weight;
            self.publish_figures(&s);
        }
        None
    }

    /// Free every slot older than the TTL; returns how many.
    pub fn expire(&self) -> usize {
        let mut s = self.slots.lock();
        let expired: Vec<ChannelId> = s
            .lru
            .iter()
            .filter(|(_, slot)| slot.at.elapsed() >= self.ttl)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &expired {
            if let Some(slot) = s.lru.pop(k) {
                s.bytes -= slot.weight;
            }
        }
        self.publish_figures(&s);
        expired.len()
    }

    fn publish_figures(&self, s: &Slots) {
        self.bytes.store(s.bytes, Ordering::Relaxed);
        self.events.store(s.lru.len(), Ordering::Relaxed);
    }

    /// Bytes the slots hold (as [`weight`] counts them).
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Slots held.
    pub fn events(&self) -> usize {
        self.events.load(Ordering::Relaxed)
    }

    /// Slots evicted to stay within the budget, since start.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    pub fn budget(&self) -> usize {
        self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publication::json_string;
    use crate::testing::NS;

    fn publication(channel: &str, data: &str) -> Arc<Publication> {
        Arc::new(Publication::new(NS, channel.into(), "e".into(), json_string(data)).cached(true))
    }

    #[test]
    fn the_budget_evicts_the_least_recently_used() {
        let one = weight("cache-0", &publication("cache-0", &"x".repeat(1000)));
        let cache = Cache::new(Duration::from_secs(60), 3 * one);
        for i in 0..3 {
            let c = format!("cache-{i}");
            cache.put(publication(&c, &"x".repeat(1000)));
        }
        assert_eq!(cache.bytes(), 3 * one);
        // A replay of cache-0 is a use: cache-1 is now the least recent.
        assert!(cache.get(NS, "cache-0").is_some());
        cache.put(publication("cache-3", &"x".repeat(1000)));
        assert!(cache.bytes() <= cache.budget());
        assert_eq!(cache.evictions(), 1);
        assert_eq!(cache.events(), 3);
        assert!(cache.get(NS, "cache-1").is_none(), "the least recent went");
        for c in ["cache-0", "cache-2", "cache-3"] {
            assert!(cache.get(NS, c).is_some(), "{c} kept");
        }
    }

    #[test]
    fn a_publish_is_a_use_too() {
        let one = weight("cache-0", &publication("cache-0", &"x".repeat(1000)));
        let cache = Cache::new(Duration::from_secs(60), 3 * one);
        for i in 0..3 {
            let c = format!("cache-{i}");
            cache.put(publication(&c, &"x".repeat(1000)));
        }
        // A fresh event on cache-0 (same size): cache-1 is now the least
        // recently published or replayed, and goes first.
        cache.put(publication("cache-0", &"y".repeat(1000)));
        cache.put(publication("cache-3", &"x".repeat(1000)));
        assert_eq!(cache.evictions(), 1);
        assert!(cache.get(NS, "cache-1").is_none(), "the least recent went");
        let (kept, _) = cache.get(NS, "cache-0").expect("the fresh event kept");
        assert!(kept.data.get().contains('y'));
    }

    #[test]
    fn replacing_a_slot_counts_only_the_new_event() {
        let cache = Cache::new(Duration::from_secs(60), 1 << 20);
        cache.put(publication("cache-a", &"x".repeat(5000)));
        cache.put(publication("cache-a", "small"));
        assert_eq!(
            cache.bytes(),
            weight("cache-a", &publication("cache-a", "small"))
        );
        assert_eq!(cache.events(), 1);
    }

    #[test]
    fn an_event_larger_than_the_budget_is_not_kept() {
        let cache = Cache::new(Duration::from_secs(60), 1000);
        cache.put(publication("cache-a", &"x".repeat(2000)));
        assert_eq!(cache.bytes(), 0);
        assert_eq!(cache.events(), 0);
        assert_eq!(cache.evictions(), 1);
    }

    #[test]
    fn expired_slots_are_freed_by_the_sweep_and_by_lookups() {
        let cache = Cache::new(Duration::from_secs(30), 1 << 20);
        let p = |c: &str| Publication::new(NS, c.into(), "e".into(), json_string("v"));
        cache.seed(p("cache-old"), Duration::from_secs(29));
        cache.seed(p("cache-older"), Duration::from_secs(29));
        cache.put(publication("cache-new", "v"));
        assert_eq!(cache.events(), 3);
        // Seeds older than the TTL are not kept at all.
        cache.seed(p("cache-dead"), Duration::from_secs(31));
        assert_eq!(cache.events(), 3);
        let short = Cache::new(Duration::from_millis(1), 1 << 20);
        short.put(publication("a", "v"));
        short.put(publication("b", "v"));
        std::thread::sleep(Duration::from_millis(5));
        assert!(short.get(NS, "a").is_none());
        assert_eq!(short.events(), 1, "the lookup freed the expired slot");
        assert_eq!(short.expire(), 1);
        assert_eq!((short.events(), short.bytes()), (0, 0));
        assert_eq!(short.evictions(), 0, "expiry is not an eviction");
    }

    #[test]
    fn a_seed_never_replaces_a_newer_event() {
        let cache = Cache::new(Duration::from_secs(60), 1 << 20);
        cache.put(publication("cache-a", "mine"));
        let theirs = Publication::new(NS, "cache-a".into(), "e".into(), json_string("theirs"));
        cache.seed(theirs, Duration::from_secs(5));
        let (p, _) = cache.get(NS, "cache-a").unwrap();
        assert_eq!(p.data.get(), "\"mine\"");
    }
}
