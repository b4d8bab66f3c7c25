//! Session snapshots waiting to be written, newest per session only.
//!
//! A session is snapshotted whenever it changes and when its client goes;
//! in a reconnect storm thousands close in the same second. Only the
//! newest snapshot of a sid matters, so a newer one replaces the one still
//! waiting (coalesced), and a sid is never written by two writers at once
//! (each write is a compare-and-set on the revision the one before got):
//! a snapshot of a sid being written waits until that write is done.
//! At most `max` sids and `max_bytes` of snapshots wait; past that a
//! snapshot of a new sid is dropped (the caller counts and logs it).

use std::collections::{HashMap, HashSet, VecDeque};

/// What became of a snapshot handed to [`Pending::push`].
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed {
    Queued,
    /// It replaced an older snapshot of its sid not yet written.
    Coalesced,
    /// `max` sids or `max_bytes` were waiting already.
    Dropped,
}

pub struct Pending {
    max: usize,
    max_bytes: usize,
    /// Bytes of the snapshots in `values`.
    bytes: usize,
    /// sid → its newest snapshot not yet written.
    values: HashMap<String, String>,
    /// Sids ready to be written, oldest first, each once (in `values`,
    /// not being written).
    order: VecDeque<String>,
    /// Sids being written now.
    busy: HashSet<String>,
    /// Sids being written now that have a newer snapshot waiting.
    again: HashSet<String>,
}

impl Pending {
    pub fn new(max: usize, max_bytes: usize) -> Pending {
        Pending {
            max,
            max_bytes,
            bytes: 0,
            values: HashMap::new(),
            order: VecDeque::new(),
            busy: HashSet::new(),
            again: HashSet::new(),
        }
    }

    pub fn push(&mut self, sid: &str, snapshot: String) -> Pushed {
        if let Some(v) = self.values.get_mut(sid) {
            // A replacement is kept whatever its size: the one it replaces
            // was, and only the newest matters.
            self.bytes = self.bytes - v.len() + snapshot.len();
            *v = snapshot;
            return Pushed::Coalesced;
        }
        if self.values.len() >= self.max || self.bytes + snapshot.len() > self.max_bytes {
            return Pushed::Dropped;
        }
        self.bytes += snapshot.len();
        self.values.insert(sid.to_owned(), snapshot);
        if self.busy.contains(sid) {
            self.again.insert(sid.to_owned());
        } else {
            self.order.push_back(sid.to_owned());
        }
        Pushed::Queued
    }

    /// The next snapshot to write; its sid is busy until [`Pending::done`].
    pub fn next(&mut self) -> Option<(String, String)> {
        while let Some(sid) = self.order.pop_front() {
            if let Some(v) = self.values.remove(&sid) {
                self.bytes -= v.len();
                self.busy.insert(sid.clone());
                return Some((sid, v));
            }
        }
        None
    }

    /// `sid`'s write ended: a snapshot that came meanwhile may go now.
    pub fn done(&mut self, sid: &str) {
        self.busy.remove(sid);
        if self.again.remove(sid) {
            self.order.push_back(sid.to_owned());
        }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_newest_snapshot_of_a_sid_is_written() {
        let mut p = Pending::new(10, 1 << 20);
        assert_eq!(p.push("a", "1".into()), Pushed::Queued);
        assert_eq!(p.push("b", "1".into()), Pushed::Queued);
        assert_eq!(p.push("a", "2".into()), Pushed::Coalesced);
        assert_eq!(p.next(), Some(("a".into(), "2".into())));
        assert_eq!(p.next(), Some(("b".into(), "1".into())));
        assert_eq!(p.next(), None);
        assert!(p.is_empty());
    }

    #[test]
    fn a_sid_being_written_waits_for_its_write() {
        let mut p = Pending::new(10, 1 << 20);
        p.push("a", "1".into());
        assert_eq!(p.next(), Some(("a".into(), "1".into())));
        // Written now: newer snapshots wait, coalesced, until it is done.
        assert_eq!(p.push("a", "2".into()), Pushed::Queued);
        assert_eq!(p.push("a", "3".into()), Pushed::Coalesced);
        p.push("b", "1".into());
        assert_eq!(p.next(), Some(("b".into(), "1".into())));
        assert_eq!(p.next(), None, "a is still being written");
        p.done("a");
        assert_eq!(p.next(), Some(("a".into(), "3".into())));
        p.done("a");
        p.done("b");
        assert_eq!(p.next(), None);
    }

    #[test]
    fn past_max_waiting_sids_new_ones_are_dropped_but_coalesced_still() {
        let mut p = Pending::new(2, 1 << 20);
        p.push("a", "1".into());
        p.push("b", "1".into());
        assert_eq!(p.push("c", "1".into()), Pushed::Dropped);
        assert_eq!(p.push("b", "2".into()), Pushed::Coalesced);
        // Being written frees its place.
        p.next();
        assert_eq!(p.push("c", "1".into()), Pushed::Queued);
    }

    #[test]
    fn past_max_bytes_waiting_new_sids_are_dropped() {
        let mut p = Pending::new(100, 10);
        assert_eq!(p.push("a", "12345".into()), Pushed::Queued);
        assert_eq!(p.push("b", "123456".into()), Pushed::Dropped);
        assert_eq!(p.push("b", "12345".into()), Pushed::Queued);
        // A bigger replacement is still kept; the bytes follow it.
        assert_eq!(p.push("a", "1234567".into()), Pushed::Coalesced);
        assert_eq!(p.bytes, 12);
        assert_eq!(p.push("c", "1".into()), Pushed::Dropped);
        p.next();
        assert_eq!(p.bytes, 5);
        assert_eq!(p.push("c", "1".into()), Pushed::Queued);
    }
}
