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
//! Order: while a recovery from a node is open, that node's live
//! publications are held (at most [`HOLD_FOR`] and [`HOLD_MAX`] of them;
//! released by the next one to arrive, or else at this node's next
//! heartbeat tick),
//! and delivered with the recovered ones in the node's order once the
//! answer is complete; so one publisher's order holds also across an
//! outage. Past either bound (an answer that does not come), what is held
//! goes out in order, and what is recovered after that comes after newer
//! ones.
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

/// Longest a live publication waits for a recovery from its node to
/// complete (then delivery goes on without waiting).
pub(super) const HOLD_FOR: Duration = Duration::from_secs(1);

/// Most live publications held per node while a recovery is open.
pub(super) const HOLD_MAX: usize = 4096;

/// A publication to deliver: app, publication, its number.
type Held = (String, Publication, u64);

/// What to deliver after a live publication arrived. Returned and matched
/// at once, never stored: the publication moves in place, unboxed.
#[allow(clippy::large_enum_variant)]
pub(super) enum Deliver {
    /// Nothing (a second copy, or held).
    Nothing,
    One(String, Publication),
    /// Several, in order (a hold released).
    Many(Vec<Held>),
}

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
    /// Live publications held while the recovery is open, and since when
    /// (None: not holding; released, or no recovery open).
    held: Vec<Held>,
    hold_since: Option<Instant>,
}

impl Recv {
    /// A node first heard of at number `seq`: nothing before is asked for.
    fn new(seq: u64) -> Recv {
        Recv {
            seen: Seen::new(seq),
            last_beat: seq,
            resync: false,
            asked: None,
            held: Vec::new(),
            hold_since: None,
        }
    }

    /// A recovery opens: hold live publications until it completes (a
    /// hold that still keeps some goes on as it was: they are released
    /// at its bound).
    fn open(&mut self) {
        self.resync = true;
        self.asked = None;
        if self.held.is_empty() {
            self.hold_since = Some(Instant::now());
        }
    }

    /// Whether live publications are to be held now.
    fn holding(&self) -> bool {
        self.resync
            && self.held.len() < HOLD_MAX
            && self.hold_since.is_some_and(|t| t.elapsed() < HOLD_FOR)
    }

    /// Stop holding: what was held, in order.
    fn release(&mut self) -> Vec<Held> {
        self.hold_since = None;
        let mut out = std::mem::take(&mut self.held);
        out.sort_unstable_by_key(|h| h.2);
        out
    }
}

impl Shared {
    /// A publication numbered `seq` from `from` arrived live: what to
    /// deliver (nothing for a second copy; held while a recovery from
    /// `from` is open).
    pub(super) fn live_pub(
        &self,
        s: &mut State,
        from: NodeId,
        seq: u64,
        a: String,
        p: Publication,
    ) -> Deliver {
        if seq == 0 {
            return Deliver::One(a, p); // a node that does not number them
        }
        let Some(r) = s.recv.get_mut(&from) else {
            // The first we hear of it: nothing before is ours to ask.
            s.recv.insert(from, Recv::new(seq));
            return Deliver::One(a, p);
        };
        if !r.seen.fresh(seq) {
            metrics::count(&metrics::BROKER_DUPLICATES);
            return Deliver::Nothing;
        }
        if r.holding() {
            r.held.push((a, p, seq));
            return Deliver::Nothing;
        }
        if r.hold_since.is_none() {
            return Deliver::One(a, p);
        }
        // A hold past its bounds: what it held, then this one.
        let mut out = r.release();
        out.push((a, p, seq));
        tracing::debug!(
            node = from,
            held = out.len(),
            "a recovery took too long; delivering without waiting for it"
        );
        Deliver::Many(out)
    }

    /// Holds past their bounds, released (in order per node).
    pub(super) fn overdue_holds(&self, s: &mut State) -> Vec<Held> {
        let mut out = Vec::new();
        for r in s.recv.values_mut() {
            if r.hold_since.is_some() && !r.holding() {
                out.extend(r.release());
            }
        }
        out
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
                        r.open();
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
            r.open();
        }
    }

    /// Heartbeat tick: ask again where an answer is overdue; deliver what
    /// overdue holds kept.
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
        let out = self.overdue_holds(&mut s);
        drop(s);
        self.deliver(out);
    }

    /// Hand publications to the inbox, in the order given.
    pub(super) fn deliver(&self, list: Vec<Held>) {
        if list.is_empty() {
            return;
        }
        if let Some(inbox) = self.inbox.get() {
            for (a, p, _) in list {
                inbox.publication(&a, p);
            }
        }
    }

    /// Node `n` is buried: a recovery still open cannot complete; what
    /// was held for it is delivered (returned).
    pub(super) fn forget_recv(&self, s: &mut State, n: NodeId) -> Vec<Held> {
        let Some(mut r) = s.recv.remove(&n) else {
            return Vec::new();
        };
        let held = r.release();
        if r.resync {
            metrics::count(&metrics::BROKER_UNRECOVERED);
            tracing::warn!(
                node = n,
                after = r.seen.base,
                "a node went away before sending what it published while this node was \
                 away; its publications since then may be missing here"
            );
        }
        held
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
        let mut recovered = Vec::new();
        // The answer comes in the node's order: held ones numbered up to
        // the last entry of this part go out among them.
        let mut upto = 0;
        for e in entries {
            let Ok(Msg::Pub { a, p, s: seq, .. }) = serde_json::from_str::<Msg>(e.get()) else {
                continue;
            };
            upto = upto.max(seq);
            if seq != 0 && r.seen.fresh(seq) {
                recovered.push((a, p, seq));
            }
        }
        let count = recovered.len();
        let mut deliver = recovered;
        if done {
            r.resync = false;
            r.asked = None;
            deliver.extend(r.release());
        } else if r.hold_since.is_some() {
            let later = r.held.iter().filter(|h| h.2 > upto).count();
            if later < r.held.len() {
                r.held.sort_unstable_by_key(|h| h.2);
                let rest = r.held.split_off(r.held.len() - later);
                deliver.extend(std::mem::replace(&mut r.held, rest));
            }
        }
        drop(s);
        if count > 0 {
            tracing::info!(
                node = n,
                count,
                "recovered publications sent while the broker was away"
            );
            metrics::add(&metrics::BROKER_RECOVERED, count as u64);
        }
        deliver.sort_by_key(|h| h.2);
        for (a, p, _) in deliver {
            inbox.publication(&a, p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Seen;
    use super::*;
    use herald_core::broker::Cluster as _;
    use herald_core::hub::StatsFilter;
    use herald_core::publication::json_string;
    use herald_core::testing::NS;

    /// An inbox that keeps the data of the publications it is given.
    #[derive(Default)]
    struct Got(Mutex<Vec<String>>);

    impl Inbox for Got {
        fn publication(&self, _: &str, p: Publication) {
            self.0
                .lock()
                .push(p.data.get().trim_matches('"').to_owned());
        }
        fn presence(&self, _: &str, _: &PresenceChange) {}
        fn control(&self, _: &str, _: &Control) {}
        fn stats(&self, _: &str, _: Option<Namespace>, _: &StatsFilter) -> Vec<ChannelStats> {
            Vec::new()
        }
        fn cached(&self, _: &str, _: Namespace, _: &str) -> Option<(Publication, Duration)> {
            None
        }
        fn count(&self, _: &str, _: Namespace, _: &str, _: NodeId, _: usize) {}
        fn connections(&self) -> Vec<(String, u32)> {
            Vec::new()
        }
        fn remote_connections(&self, _: &str, _: u32) {}
        fn node_gone(&self, _: NodeId) {}
    }

    /// Node 2's publication numbered `seq` (to a user: no subscription
    /// needed to take it).
    fn publication(seq: u64) -> Vec<u8> {
        let p = Publication::new(NS, "c".into(), "e".into(), json_string(&seq.to_string()))
            .to_user(Some("u".into()));
        Msg::Pub {
            n: 2,
            a: "app".into(),
            p,
            s: seq,
        }
        .to_bytes()
    }

    /// Node 2's (whole) answer to a recovery: its entries `from..=to`.
    fn replay(from: u64, to: u64) -> Vec<u8> {
        let e: Vec<String> = (from..=to)
            .map(|s| String::from_utf8(publication(s)).unwrap())
            .collect();
        format!(
            "{{\"Y\":{{\"n\":2,\"o\":{from},\"d\":true,\"e\":[{}]}}}}",
            e.join(",")
        )
        .into_bytes()
    }

    #[tokio::test]
    async fn recovered_publications_come_in_their_nodes_order() {
        let engine = Engine::new(
            "test",
            "p",
            Duration::from_secs(30),
            ">",
            Box::new(|_, _| {}),
        );
        let got = Arc::new(Got::default());
        engine.attach(1, got.clone());
        let sh = engine.shared().clone();
        let all = sh.all();
        let beat = Msg::Beat {
            n: 2,
            l: Vec::new(),
            h: false,
            r: false,
            t: 1,
            g: Vec::new(),
            s: 0,
        };
        sh.on_message(&all, &beat.to_bytes());
        sh.on_message(&all, &publication(1));
        sh.on_message(&all, &publication(2));
        // This node's broker connection came back: 3 and 4 were missed;
        // 5 arrives live before the answer, and waits for it.
        sh.resync_all();
        sh.on_message(&all, &publication(5));
        assert_eq!(*got.0.lock(), ["1", "2"]);
        sh.on_message(&all, &replay(3, 5));
        assert_eq!(*got.0.lock(), ["1", "2", "3", "4", "5"]);
        // Copies are dropped; after the recovery nothing waits.
        sh.on_message(&all, &publication(4));
        sh.on_message(&all, &publication(6));
        assert_eq!(got.0.lock().len(), 6);
        // An answer that does not come holds live ones at most HOLD_FOR.
        sh.resync_all();
        sh.on_message(&all, &publication(7));
        assert_eq!(got.0.lock().len(), 6);
        std::thread::sleep(HOLD_FOR);
        sh.on_message(&all, &publication(8));
        assert_eq!(got.0.lock()[6..], ["7", "8"]);
    }

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
