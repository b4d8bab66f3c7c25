//! Exact delivery accounting: which messages were expected where, and which
//! of them arrived.
//!
//! Every message the bench publishes carries a unique id ([`MsgId`]): its
//! sender and its number in the run. Numbers are dense (0, 1, 2, ...), so
//! each receiver keeps the numbers it has seen as one bitmap ([`SeqSet`],
//! [`Seen`]): one bit per message, no hashing, so the receive path stays
//! cheap. Because receivers count *distinct expected ids*, a duplicate (or
//! an echo of a receiver's own message) can never stand in for a message
//! the server dropped: lost, duplicated and unexpected deliveries are three
//! separate counts ([`Deliveries`]).
//!
//! [`Ledger`] does the accounting for `broadcast`, where receivers come
//! and go: a send is expected at every other receiver subscribed when it
//! was sent. `fanout` (fixed subscribers) uses [`SeqSet`] directly.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A message's id: who sent it and its number, unique in the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MsgId {
    pub sender: u64,
    pub seq: u64,
}

/// Largest span of one [`SeqSet`] in 64-bit words (2^20 words: 64 Mi
/// sequence numbers, 8 MiB). A sequence number further away than that from
/// the ones already seen is not one the bench sent; it is counted as
/// unexpected instead of allocating for it.
const MAX_WORDS: u64 = 1 << 20;

/// What a receiver made of one incoming id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receipt {
    /// First time this id arrived here.
    New,
    /// Already seen here: a duplicate delivery.
    Duplicate,
    /// Not an id the bench could have sent (out of any sane range).
    Unexpected,
}

/// A set of sequence numbers, as a bitmap starting at word `base`.
/// Messages are numbered 0, 1, 2, ..., so the seen numbers are dense and
/// the bitmap costs one bit per message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeqSet {
    /// Index of the first word (sequence number / 64).
    base: u64,
    words: Vec<u64>,
}

impl SeqSet {
    pub fn insert(&mut self, seq: u64) -> Receipt {
        let word = seq / 64;
        if self.words.is_empty() {
            self.base = word;
        }
        if word < self.base {
            // Out of order below the first seen: grow at the front (rare;
            // only reordered HTTP publishes do this, and only by a little).
            let grow = self.base - word;
            if grow + self.words.len() as u64 > MAX_WORDS {
                return Receipt::Unexpected;
            }
            self.words
                .splice(0..0, std::iter::repeat_n(0, grow as usize));
            self.base = word;
        }
        let i = word - self.base;
        if i >= MAX_WORDS {
            return Receipt::Unexpected;
        }
        let i = i as usize;
        if i >= self.words.len() {
            self.words.resize(i + 1, 0);
        }
        let bit = 1u64 << (seq % 64);
        if self.words[i] & bit != 0 {
            return Receipt::Duplicate;
        }
        self.words[i] |= bit;
        Receipt::New
    }

    pub fn contains(&self, seq: u64) -> bool {
        let word = seq / 64;
        word >= self.base
            && self
                .words
                .get((word - self.base) as usize)
                .is_some_and(|w| w & (1u64 << (seq % 64)) != 0)
    }

    pub fn len(&self) -> u64 {
        self.words.iter().map(|w| w.count_ones() as u64).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many numbers are in both sets.
    pub fn intersection_len(&self, other: &SeqSet) -> u64 {
        let lo = self.base.max(other.base);
        let hi = (self.base + self.words.len() as u64).min(other.base + other.words.len() as u64);
        (lo..hi)
            .map(|w| {
                let a = self.words[(w - self.base) as usize];
                let b = other.words[(w - other.base) as usize];
                (a & b).count_ones() as u64
            })
            .sum()
    }
}

/// What one receiver has seen: a [`SeqSet`] of message numbers, and how
/// many receipts were duplicates or not ids at all. Owned by the receiver's
/// task, so recording takes no lock.
///
/// In `broadcast` every send takes the next number of one run-wide counter,
/// so a receiver's set is a single dense bitmap (one bit per message sent
/// while it lived, ~2 KiB for a 45 s life at 400 sends/s). A bitmap per
/// sender, looked up in a hash map on every delivery, cost the generator
/// ~14 % of its CPU at the peak; this is one bit in a cache-hot word.
/// `fanout` records its channel's publish numbers (k / C) the same way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    pub set: SeqSet,
    pub duplicates: u64,
    pub unexpected: u64,
}

impl Seen {
    pub fn record(&mut self, seq: u64) -> Receipt {
        let r = self.set.insert(seq);
        match r {
            Receipt::New => {}
            Receipt::Duplicate => self.duplicates += 1,
            Receipt::Unexpected => self.unexpected += 1,
        }
        r
    }

    /// A stamped frame without a usable id.
    pub fn garbled(&mut self) {
        self.unexpected += 1;
    }

    /// Give back spare capacity: a receiver that left keeps its set until
    /// the end of the run.
    pub fn freeze(mut self) -> Seen {
        self.set.words.shrink_to_fit();
        self
    }
}

/// Expected vs received deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Deliveries {
    pub expected: u64,
    /// Distinct expected messages that arrived (never more than expected).
    pub received: u64,
    /// Receipts of a message the receiver already had.
    pub duplicated: u64,
    /// Distinct messages that arrived but were not expected there: a
    /// receiver's own message echoed back, a message whose send failed,
    /// or a frame with a stamp but no valid id.
    pub unexpected: u64,
}

impl Deliveries {
    pub fn lost(&self) -> u64 {
        self.expected.saturating_sub(self.received)
    }

    pub fn add(&mut self, other: Deliveries) {
        self.expected += other.expected;
        self.received += other.received;
        self.duplicated += other.duplicated;
        self.unexpected += other.unexpected;
    }
}

/// The time one receiver was subscribed, on the bench clock, and what it
/// received in that window.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub receiver: u64,
    pub join: u64,
    pub leave: u64,
    pub seen: Seen,
}

/// Expected vs received deliveries when receivers come and go (broadcast).
///
/// A send stamped `t` by sender `s` is expected at every receiver `r != s`
/// whose window satisfies `join <= t <= leave`. `join` is taken after the
/// subscription is confirmed and `leave` before the receiver stops reading
/// (it keeps reading for a grace period after), so a server that delivers
/// everything makes `received == expected` exactly; whatever it drops is
/// counted as lost. A send from just before `join` or after `leave` may or
/// may not arrive; if it does, it is neither expected nor unexpected.
#[derive(Default)]
pub struct Ledger {
    /// (stamp, id) of every send the server accepted.
    sends: Mutex<Vec<(u64, MsgId)>>,
    windows: Mutex<Vec<Window>>,
    /// The next message number of this process.
    next: AtomicU64,
    /// This process's part of a `--processes` run: its numbers are
    /// `local × count + index`, unique across the processes.
    shard: Option<super::shard::Shard>,
}

impl Ledger {
    /// The ledger of one process of a `--processes` run.
    pub fn numbered(shard: Option<super::shard::Shard>) -> Ledger {
        Ledger {
            shard,
            ..Ledger::default()
        }
    }

    /// A fresh id for a message `sender` is about to send.
    pub fn next_id(&self, sender: u64) -> MsgId {
        let local = self.next.fetch_add(1, Ordering::Relaxed);
        MsgId {
            sender,
            seq: super::shard::global(self.shard, local),
        }
    }

    /// Every accepted send so far, as `[stamp, sender, seq]`, for the
    /// other processes of a `--processes` run.
    pub fn sends_json(&self) -> serde_json::Value {
        let sends = self.sends.lock().unwrap();
        serde_json::Value::Array(
            sends
                .iter()
                .map(|(t, id)| serde_json::json!([t, id.sender, id.seq]))
                .collect(),
        )
    }

    /// Add the sends another process's [`Ledger::sends_json`] listed.
    pub fn add_sends(&self, list: &serde_json::Value) {
        let mut sends = self.sends.lock().unwrap();
        for s in list.as_array().into_iter().flatten() {
            if let (Some(t), Some(sender), Some(seq)) =
                (s[0].as_u64(), s[1].as_u64(), s[2].as_u64())
            {
                sends.push((t, MsgId { sender, seq }));
            }
        }
    }

    /// A send accepted for delivery, stamped `stamp`.
    pub fn send(&self, stamp: u64, id: MsgId) {
        self.sends.lock().unwrap().push((stamp, id));
    }

    /// A receiver's finished window.
    pub fn window(&self, w: Window) {
        self.windows.lock().unwrap().push(w);
    }

    pub fn sends(&self) -> usize {
        self.sends.lock().unwrap().len()
    }

    pub fn tally(&self) -> Deliveries {
        self.tally_with(|_, _, _| {})
    }

    /// [`Ledger::tally`], calling `lost(window, stamp, id)` for every
    /// expected send the window's receiver did not get: where in the
    /// windows losses fall tells a server's drop from a receiver that
    /// stopped reading too early.
    pub fn tally_with(&self, mut lost: impl FnMut(&Window, u64, MsgId)) -> Deliveries {
        let mut sends = self.sends.lock().unwrap().clone();
        sends.sort_unstable_by_key(|s| s.0);
        let stamps: Vec<u64> = sends.iter().map(|s| s.0).collect();
        let mut accepted = SeqSet::default();
        let mut own: HashMap<u64, SeqSet> = HashMap::new();
        for (_, id) in &sends {
            accepted.insert(id.seq);
            own.entry(id.sender).or_default().insert(id.seq);
        }
        let no_sends = SeqSet::default();
        let mut d = Deliveries::default();
        for w in self.windows.lock().unwrap().iter() {
            let got = &w.seen.set;
            let mine = own.get(&w.receiver).unwrap_or(&no_sends);
            let lo = stamps.partition_point(|&t| t < w.join);
            let hi = stamps.partition_point(|&t| t <= w.leave).max(lo);
            for &(stamp, id) in &sends[lo..hi] {
                if id.sender != w.receiver {
                    d.expected += 1;
                    if got.contains(id.seq) {
                        d.received += 1;
                    } else {
                        lost(w, stamp, id);
                    }
                }
            }
            d.duplicated += w.seen.duplicates;
            // Not an accepted send at all (a failed one, or made up), or
            // the receiver's own message echoed back.
            d.unexpected += w.seen.unexpected + got.len() - got.intersection_len(&accepted)
                + got.intersection_len(mine);
        }
        d
    }
}

/// The stamps of sends still in flight (made but not yet answered by the
/// server). A receiver about to stop reading asks [`Outstanding::answered_through`]
/// so that it keeps reading until every send stamped before it left has
/// reached the server: on a saturated machine an HTTP publish can take
/// seconds to be accepted, longer than any fixed grace period.
#[derive(Default)]
pub struct Outstanding {
    stamps: Mutex<std::collections::BTreeMap<u64, u32>>,
}

impl Outstanding {
    /// Stamp a send about to be made, with `now`'s value taken under the
    /// lock, so a receiver asking after time t sees every send stamped at
    /// or before t either here or already answered.
    pub fn begin(&self, now: impl FnOnce() -> u64) -> u64 {
        let mut m = self.stamps.lock().unwrap();
        let t = now();
        *m.entry(t).or_default() += 1;
        t
    }

    /// The send stamped `stamp` was answered (accepted or refused).
    pub fn end(&self, stamp: u64) {
        let mut m = self.stamps.lock().unwrap();
        if let Some(n) = m.get_mut(&stamp) {
            *n -= 1;
            if *n == 0 {
                m.remove(&stamp);
            }
        }
    }

    /// Whether every send stamped at or before `t` has been answered.
    pub fn answered_through(&self, t: u64) -> bool {
        self.stamps
            .lock()
            .unwrap()
            .first_key_value()
            .is_none_or(|(&first, _)| first > t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(sender: u64, seq: u64) -> MsgId {
        MsgId { sender, seq }
    }

    /// A receiver's window that saw `ids`, duplicates included.
    fn w(receiver: u64, join: u64, leave: u64, ids: &[(u64, u64)]) -> Window {
        let mut seen = Seen::default();
        for &(s, q) in ids {
            seen.record(id(s, q).seq);
        }
        Window {
            receiver,
            join,
            leave,
            seen: seen.freeze(),
        }
    }

    #[test]
    fn seq_sets_count_distinct_numbers_in_any_order() {
        let mut s = SeqSet::default();
        assert_eq!(s.insert(200), Receipt::New);
        assert_eq!(s.insert(200), Receipt::Duplicate);
        assert_eq!(s.insert(3), Receipt::New); // below the first word
        assert_eq!(s.insert(1000), Receipt::New);
        assert_eq!(s.insert(3), Receipt::Duplicate);
        assert_eq!(s.len(), 3);
        assert!(s.contains(3) && s.contains(200) && s.contains(1000));
        assert!(!s.contains(4) && !s.contains(5000) && !s.contains(0));
        assert_eq!(s.insert(u64::MAX), Receipt::Unexpected);
        let mut t = SeqSet::default();
        for q in [3, 4, 1000, 70_000] {
            t.insert(q);
        }
        assert_eq!(s.intersection_len(&t), 2);
        assert_eq!(t.intersection_len(&s), 2);
    }

    #[test]
    fn ledger_counts_only_sends_inside_each_window_from_others() {
        let l = Ledger::default();
        // Sender 1 sends at 10, 20, 30; sender 2 at 25.
        let ids: Vec<MsgId> = [(10, 1), (20, 1), (25, 2), (30, 1)]
            .into_iter()
            .map(|(t, s)| {
                let m = l.next_id(s);
                l.send(t, m);
                m
            })
            .collect();
        let seq = |i: usize| (ids[i].sender, ids[i].seq);
        l.window(w(1, 0, 100, &[seq(2)])); // expects only 2's send
        l.window(w(2, 15, 100, &[seq(1), seq(3)])); // expects 20, 30 from 1
        l.window(w(3, 0, 22, &[seq(0), seq(1)])); // expects 10, 20
        let d = l.tally();
        assert_eq!(d.expected, 5);
        assert_eq!(d.received, 5);
        assert_eq!(d.lost(), 0);
        assert_eq!((d.duplicated, d.unexpected), (0, 0));
    }

    #[test]
    fn ids_are_unique_across_senders() {
        let l = Ledger::default();
        let a = l.next_id(1);
        let b = l.next_id(2);
        let c = l.next_id(1);
        assert_eq!((a.seq, b.seq, c.seq), (0, 1, 2));
        assert_eq!((a.sender, b.sender), (1, 2));
    }

    #[test]
    fn ledger_reports_what_a_dropping_server_lost() {
        let l = Ledger::default();
        for t in 0..100 {
            l.send(t, l.next_id(0));
        }
        // Three receivers present throughout; the server dropped every 10th.
        let got: Vec<(u64, u64)> = (0..100).filter(|q| q % 10 != 0).map(|q| (0, q)).collect();
        for r in 1..=3 {
            l.window(w(r, 0, 1000, &got));
        }
        let d = l.tally();
        assert_eq!(d.expected, 300);
        assert_eq!(d.lost(), 30);
        assert_eq!((d.duplicated, d.unexpected), (0, 0));
    }

    #[test]
    fn duplicates_and_echoes_do_not_hide_losses() {
        let l = Ledger::default();
        // Senders 7 and 1 alternate: 7 has the even numbers, 1 the odd.
        for t in 0..10 {
            l.send(t, l.next_id(7));
            l.send(t, l.next_id(1));
        }
        // Receiver 1 lost 7's first two (0 and 2), got 4 and 6 twice (as
        // many frames as expected), and was echoed its own 11.
        let mut ids: Vec<(u64, u64)> = (2..10).map(|k| (7, 2 * k)).collect();
        ids.extend([(7, 4), (7, 6), (1, 11)]);
        // Plus a number that was never an accepted send (a failed one).
        ids.push((7, 25));
        l.window(w(1, 0, 100, &ids));
        let d = l.tally();
        assert_eq!(d.expected, 10);
        assert_eq!(d.received, 8);
        assert_eq!(d.lost(), 2);
        assert_eq!(d.duplicated, 2);
        assert_eq!(d.unexpected, 2);
    }

    #[test]
    fn outstanding_sends_hold_back_only_receivers_that_left_after_them() {
        let o = Outstanding::default();
        let a = o.begin(|| 10);
        let b = o.begin(|| 20);
        assert!(o.answered_through(9));
        assert!(!o.answered_through(10));
        o.end(a);
        assert!(o.answered_through(19));
        assert!(!o.answered_through(25));
        o.end(b);
        assert!(o.answered_through(u64::MAX));
    }

    #[test]
    fn tally_names_each_lost_send() {
        let l = Ledger::default();
        for t in [10, 20, 30] {
            let m = l.next_id(99);
            l.send(t, m);
        }
        l.window(w(1, 5, 35, &[(99, 0), (99, 2)]));
        let mut lost = Vec::new();
        let d = l.tally_with(|win, stamp, id| lost.push((win.receiver, stamp, id.seq)));
        assert_eq!(d.lost(), 1);
        assert_eq!(lost, vec![(1, 20, 1)]);
    }

    #[test]
    fn a_receiver_that_saw_nothing_lost_everything_in_its_window() {
        let l = Ledger::default();
        for t in 0..50 {
            l.send(t, l.next_id(9));
        }
        l.window(w(1, 10, 19, &[]));
        let d = l.tally();
        assert_eq!((d.expected, d.received, d.lost()), (10, 0, 10));
    }
}
