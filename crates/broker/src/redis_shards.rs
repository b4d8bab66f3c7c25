//! The broker canary on a Redis Cluster, one copy per master: a node can
//! stop hearing one shard (its master frozen or wedged, its socket open)
//! while the others, the shard of the cluster-wide subjects among them,
//! are fine, and its subscribers to that shard's channels then get nothing
//! unnoticed. So the Redis Cluster transport sends each canary the engine
//! publishes (`{prefix}.canary.{id}`, see [`crate::engine`]'s `canary`) to
//! every master of the slot map it subscribed by, each copy on a shard
//! channel whose hash tag lands in that master's slots, and hands the
//! canary to the engine only once every copy has come back. A shard that
//! does not answer then fails the canary as a silent single server does:
//! the metric, the log line, `/ready` 503 and a reconnect.
//!
//! Every master, not only those the node has channels on: a node's
//! publications may go to any shard (a client publishing to any channel),
//! a new subscription may land on any shard at any moment, and the copy
//! costs one small `SPUBLISH` per master per `canary_interval`.
//!
//! The tags are `{<prefix>~<n>}` with the smallest `n` whose slot the
//! master owns: the same on every node (each node's canary channel also
//! carries its id, so they never share a channel), and found by trying
//! `n` in turn (a master of a third of the slots takes a few tries; one
//! that owns a single slot about 16,384).

use crate::redis_conn::slot;

/// Most tags tried to find one per master (each try is one CRC16 of a few
/// bytes): enough for a master that owns a single slot many times over.
const MAX_TRIES: u32 = 1 << 20;

/// One session's canary copies and what has come back of them.
pub struct ShardCanary {
    /// The engine's canary subject (`{prefix}.canary.{id}`).
    subject: String,
    /// One wire name per master: `{<prefix>~<n>}<subject>`.
    wires: Vec<String>,
    /// The highest sequence number heard back on each wire.
    heard: Vec<u64>,
    /// The highest one handed to the engine.
    passed: u64,
}

impl ShardCanary {
    /// Copies for the masters of `slots` (`CLUSTER SLOTS`' ranges and
    /// their masters' addresses, as the transport reads them).
    pub fn new(prefix: &str, subject: &str, slots: &[(i64, i64, String)]) -> ShardCanary {
        let mut masters: Vec<&str> = slots.iter().map(|(_, _, m)| m.as_str()).collect();
        masters.sort_unstable();
        masters.dedup();
        let owner = |s: u16| {
            let s = i64::from(s);
            slots
                .iter()
                .find(|(first, last, _)| (*first..=*last).contains(&s))
                .map(|(_, _, m)| m.as_str())
        };
        let mut tags: Vec<Option<u32>> = vec![None; masters.len()];
        let mut left = masters.len();
        for n in 0..MAX_TRIES {
            if left == 0 {
                break;
            }
            let Some(m) = owner(slot(format!("{prefix}~{n}").as_bytes())) else {
                continue;
            };
            if let Ok(i) = masters.binary_search(&m) {
                if tags[i].is_none() {
                    tags[i] = Some(n);
                    left -= 1;
                }
            }
        }
        let mut wires: Vec<String> = tags
            .into_iter()
            .flatten()
            .map(|n| format!("{{{prefix}~{n}}}{subject}"))
            .collect();
        if wires.is_empty() {
            // No slot map to go by (a cluster answering CLUSTER SLOTS has
            // masters): one copy on the cluster-wide slot.
            wires.push(format!("{{{prefix}}}{subject}"));
        }
        ShardCanary {
            subject: subject.to_owned(),
            heard: vec![0; wires.len()],
            wires,
            passed: 0,
        }
    }

    /// The engine's canary subject.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The shard channels to subscribe to and send each canary on.
    pub fn wires(&self) -> &[String] {
        &self.wires
    }

    /// A canary copy came back on `wire` carrying `payload`: the sequence
    /// number every copy has now reached, when that is news (to hand to
    /// the engine as the canary heard); `None` otherwise, or if `wire` is
    /// not one of the copies.
    pub fn heard(&mut self, wire: &str, payload: &[u8]) -> Option<u64> {
        let i = self.wires.iter().position(|w| w == wire)?;
        let n = std::str::from_utf8(payload).ok()?.parse::<u64>().ok()?;
        self.heard[i] = self.heard[i].max(n);
        let all = self.heard.iter().copied().min().unwrap_or(0);
        (all > self.passed).then(|| {
            self.passed = all;
            all
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Vec<(i64, i64, String)> {
        vec![
            (0, 5460, "127.0.0.1:7000".into()),
            (5461, 10922, "127.0.0.1:7001".into()),
            (10923, 16383, "127.0.0.1:7002".into()),
        ]
    }

    #[test]
    fn one_copy_lands_on_each_master() {
        let slots = three();
        let c = ShardCanary::new("h", "h.canary.7", &slots);
        assert_eq!(c.wires().len(), 3);
        let mut owners: Vec<usize> = c
            .wires()
            .iter()
            .map(|w| {
                assert!(w.ends_with("}h.canary.7"), "{w}");
                let s = i64::from(slot(w.as_bytes()));
                slots
                    .iter()
                    .position(|(a, b, _)| (*a..=*b).contains(&s))
                    .unwrap()
            })
            .collect();
        owners.sort();
        assert_eq!(owners, [0, 1, 2]);
        // The same tags for another node's canary.
        let other = ShardCanary::new("h", "h.canary.8", &slots);
        for (a, b) in c.wires().iter().zip(other.wires()) {
            assert_eq!(slot(a.as_bytes()), slot(b.as_bytes()));
        }
    }

    #[test]
    fn a_master_of_one_slot_and_split_ranges_are_covered() {
        let slots = vec![
            (0, 99, "a:1".into()),
            (100, 100, "b:1".into()),
            (101, 8000, "c:1".into()),
            (8001, 16383, "a:1".into()),
        ];
        let c = ShardCanary::new("herald", "herald.canary.1", &slots);
        assert_eq!(c.wires().len(), 3);
        assert!(c.wires().iter().any(|w| slot(w.as_bytes()) == 100));
    }

    #[test]
    fn the_canary_is_heard_once_every_copy_is() {
        let mut c = ShardCanary::new("h", "h.canary.7", &three());
        let w: Vec<String> = c.wires().to_vec();
        assert_eq!(c.heard(&w[0], b"1"), None);
        assert_eq!(c.heard(&w[1], b"1"), None);
        assert_eq!(c.heard(&w[2], b"1"), Some(1));
        // A shard that stops answering holds the canary back.
        assert_eq!(c.heard(&w[0], b"2"), None);
        assert_eq!(c.heard(&w[1], b"2"), None);
        assert_eq!(c.heard(&w[0], b"3"), None);
        assert_eq!(c.heard(&w[1], b"3"), None);
        // Until it answers again.
        assert_eq!(c.heard(&w[2], b"3"), Some(3));
        assert_eq!(c.heard(&w[2], b"3"), None);
        assert_eq!(c.heard("{h}h.canary.7", b"9"), None);
        assert_eq!(c.heard(&w[0], b"x"), None);
    }
}
