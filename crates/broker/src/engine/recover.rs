//! The receiving side of acknowledged publications (an acknowledgement is true): a node
//! that lost its broker for a while gets back what the others published
//! meanwhile, once each.
//!
//! Every publication carries its node's sequence number ([`super::journal`]),
//! and heartbeats carry the sender's last number. Per publishing node this
//! node keeps a floor (everything up to it was delivered, or was not for
//! this node) and which numbers above it arrived. A copy that arrived
//! already (an outbox sent again after a reconnect) is dropped.
//!
//! After a gap may have opened (this node reconnected; a peer says hello
//! after its own reconnect) the node asks the peer, on its node subject,
//! for everything it kept above the floor; the answer comes in chunks on
//! this node's subject, and what did not arrive yet is delivered. If the
//! peer no longer holds some of it (past its window), the count is added to
//! `herald_broker_unrecovered_total` and logged; so is a peer buried while
//! this node still waited for its answer (counted once).
//!
//! The floor follows heartbeats one beat late: a heartbeat tells that
//! everything before it was sent, and one beat period is slack for
//! transports that do not keep one sender's order across subjects (Redis
//! Cluster shards). While a recovery is pending it does not move.

#[allow(unused_imports)]
use super::*;
use serde_json::value::RawValue;
use std::collections::VecDeque;

/// Ask a peer again if its answer did not complete within this.
const ASK_AGAIN: Duration = Duration::from_secs(3);

/// Entries per answer message.
const CHUNK: usize = 256;

/// Bytes per answer message (about).
const CHUNK_BYTES: usize = 512 << 10;

/// Most numbers tracked above the floor (bits); past them the floor moves.
const MAX_BITS: u64 = 1 << 22;

/// Which of one node's publications this node has had.
pub(super) struct Seen {
    /// Every number up to it is done with.
    base: u64,
    /// Bit `i` of word `w`: number `base + 1 + 64 w + i` arrived.
    bits: VecDeque<u64>,
}

impl Seen {
    fn new(base: u64) -> Seen {
        Seen {
            base,
            bits: VecDeque::new(),
        }
    }

    /// Whether `seq` is new (and remember it).
    fn fresh(&mut self, seq: u64) -> bool {
        if seq <= self.base {
            return false;
        }
        if seq - self.base > MAX_BITS {
            self.advance(seq - MAX_BITS);
        }
        let i = seq - self.base - 1;
        let (w, b) = ((i / 64) as usize, i % 64);
        if self.bits.len() <= w {
            self.bits.resize(w + 1, 0);
        }
        let was = self.bits[w] & (1 << b) != 0;
        self.bits[w] |= 1 << b;
        !was
    }

    /// Everything up to `to` is done with.
    fn advance(&mut self, to: u64) {
        while to >= self.base + 64 {
            if self.bits.pop_front().is_none() {
                self.base = to;
                return;
            }
            self.base += 64;
        }
        for s in self.base + 1..=to {
            self.fresh(s);
        }
    }
}

/// Per publishing node: what arrived, and a recovery in progress.
pub(super) struct Recv {
    seen: Seen,
    /// The number its last heartbeat carried (the floor moves to it at
    /// the next one).
    last_beat: u64,
    /// A gap may be open: ask (again) for what it kept.
    resync: bool,
    asked: Option<Instant>,
}

impl Recv {
    /// A node first heard of at number `seq`: nothing before is asked for.
    fn new(seq: u64) -> Recv {
        Recv {
            seen: Seen::new(seq),
            last_beat: seq,
            resync: false,
            asked: None,
        }
    }
}

impl Shared {
    /// A publication numbered `seq` from `from` arrived live: whether to
    /// deliver it (not a second copy).
    pub(super) fn fresh_pub(&self, s: &mut State, from: NodeId, seq: u64) -> bool {
        if seq == 0 {
            return true; // a node that does not number its publications
        }
        match s.recv.get_mut(&from) {
            Some(r) => {
                let fresh = r.seen.fresh(seq);
                if !fresh {
                    metrics::count(&metrics::BROKER_DUPLICATES);
                }
                fresh
            }
            None => {
                // The first we hear of it: nothing before is ours to ask.
                s.recv.insert(from, Recv::new(seq));
                true
            }
        }
    }

    /// Bookkeeping of any message from `from`: a heartbeat's number moves
    /// the floor; a hello (the peer reconnected) opens a recovery; a
    /// recovery open is asked for.
    pub(super) fn track(&self, s: &mut State, from: NodeId, msg: &Msg) {
        // Every heartbeat, also one numbered 0 (nothing published yet):
        // a node known before an outage is asked after it, from 0 if need be.
        if let Msg::Beat { s: seq, h, .. } = msg {
            let seq = *seq;
            match s.recv.get_mut(&from) {
                None => {
                    s.recv.insert(from, Recv::new(seq));
                }
                Some(r) => {
                    if *h {
                        r.resync = true;
                        r.asked = None;
                    } else if !r.resync {
                        r.seen.advance(r.last_beat);
                    }
                    r.last_beat = seq;
                }
            }
        }
        self.ask_if_due(s, from);
    }

    fn ask_if_due(&self, s: &mut State, from: NodeId) {
        let Some(r) = s.recv.get_mut(&from) else {
            return;
        };
        if !r.resync || r.asked.is_some_and(|t| t.elapsed() < ASK_AGAIN) {
            return;
        }
        r.asked = Some(Instant::now());
        let f = r.seen.base;
        tracing::debug!(
            node = from,
            after = f,
            "asking a node for what it published meanwhile"
        );
        self.send_msg(
            subject::node(&self.prefix, from),
            &Msg::Recover { n: self.me(), f },
        );
    }

    /// This node's broker connection is back: what the others sent while
    /// it was away must be asked for.
    pub(super) fn resync_all(&self) {
        let mut s = self.state.lock();
        for r in s.recv.values_mut() {
            r.resync = true;
            r.asked = None;
        }
    }

    /// Heartbeat tick: ask again where an answer is overdue.
    pub(super) fn recover_tick(&self) {
        let mut s = self.state.lock();
        let due: Vec<NodeId> = s
            .recv
            .iter()
            .filter(|(n, r)| r.resync && s.peers.contains_key(n))
            .map(|(n, _)| *n)
            .collect();
        for n in due {
            self.ask_if_due(&mut s, n);
        }
    }

    /// Node `n` is buried: a recovery still open cannot complete.
    pub(super) fn forget_recv(&self, s: &mut State, n: NodeId) {
        if let Some(r) = s.recv.remove(&n) {
            if r.resync {
                metrics::count(&metrics::BROKER_UNRECOVERED);
                tracing::warn!(
                    node = n,
                    after = r.seen.base,
                    "a node went away before sending what it published while this node was \
                     away; its publications since then may be missing here"
                );
            }
        }
    }

    /// Node `n` asks for what this node kept above `after`.
    pub(super) fn on_recover(&self, n: NodeId, after: u64) {
        let (first, list) = self.journal.since(after);
        let to = subject::node(&self.prefix, n);
        let me = self.me();
        let mut i = 0;
        loop {
            let mut body = Vec::with_capacity(256);
            let mut count = 0;
            while i < list.len() && count < CHUNK && body.len() < CHUNK_BYTES {
                if count > 0 {
                    body.push(b',');
                }
                body.extend_from_slice(&list[i]);
                i += 1;
                count += 1;
            }
            let done = i >= list.len();
            let mut msg =
                format!("{{\"Y\":{{\"n\":{me},\"o\":{first},\"d\":{done},\"e\":[").into_bytes();
            msg.extend_from_slice(&body);
            msg.extend_from_slice(b"]}}");
            self.send(to.clone(), msg);
            if done {
                return;
            }
        }
    }

    /// Part of node `n`'s answer: `first` is the first number it still
    /// held, `entries` its publications as sent, `done` the last part.
    pub(super) fn on_replay(
        &self,
        mut s: parking_lot::MutexGuard<'_, State>,
        n: NodeId,
        first: u64,
        done: bool,
        entries: Vec<Box<RawValue>>,
        inbox: &Arc<dyn Inbox>,
    ) {
        let Some(r) = s.recv.get_mut(&n) else {
            return;
        };
        if first > r.seen.base + 1 {
            let missed = first - 1 - r.seen.base;
            metrics::add(&metrics::BROKER_UNRECOVERED, missed);
            tracing::warn!(
                node = n,
                missed,
                "publications of another node were gone from its window before this node \
                 could ask for them"
            );
            r.seen.advance(first - 1);
        }
        let mut deliver = Vec::new();
        for e in entries {
            let Ok(Msg::Pub { a, p, s: seq, .. }) = serde_json::from_str::<Msg>(e.get()) else {
                continue;
            };
            if seq != 0 && r.seen.fresh(seq) {
                deliver.push((a, p));
            }
        }
        if done {
            r.resync = false;
            r.asked = None;
        }
        drop(s);
        if !deliver.is_empty() {
            tracing::info!(
                node = n,
                count = deliver.len(),
                "recovered publications sent while the broker was away"
            );
        }
        for (a, p) in deliver {
            metrics::count(&metrics::BROKER_RECOVERED);
            inbox.publication(&a, p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Seen;

    #[test]
    fn seen_drops_second_copies_and_follows_the_floor() {
        let mut s = Seen::new(10);
        assert!(!s.fresh(10));
        assert!(s.fresh(12));
        assert!(!s.fresh(12));
        assert!(s.fresh(11));
        assert!(s.fresh(200));
        s.advance(150);
        assert!(!s.fresh(149));
        assert!(s.fresh(151));
        assert!(!s.fresh(200));
        assert!(s.fresh(201));
        s.advance(1000);
        assert!(!s.fresh(999));
        assert!(s.fresh(1001));
    }
}
