//! `storm --rate`: what each client got across its gap.
//!
//! While the clients are away, publishers keep publishing. One publisher
//! per bench channel publishes one message at a time (each waits for the
//! server's answer before the next), so a channel's messages have one
//! order, numbered 0, 1, 2, ... ([`MsgId`] with the channel's index as
//! sender). Publishing starts once every client is subscribed, so every
//! client should receive every message of its channel: once, in order.
//!
//! Each client keeps a [`Track`]: the numbers it received (a [`SeqSet`]),
//! duplicates, and receipts below the highest number it had already
//! received (out of order). Its gap is the messages its channel got
//! between its drop and its return. After the publishers stop, [`tally`]
//! counts per returning client what it MISSED (published, not received:
//! an at-most-once protocol loses what was sent during the gap),
//! DUPLICATED and OUT OF ORDER. A publish the server did not answer with
//! success is neither expected nor counted against anyone.

use super::client::bench_data;
use super::ledger::{MsgId, Receipt, SeqSet};
use super::metrics::Live;
use super::report::Report;
use super::rolling::Publishers;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The event name of the storm's publishes (Pusher's; the others have
/// none).
pub const EVENT: &str = "storm";

/// What the publishers have done, per channel.
pub struct Publishing {
    /// Publishes finished per channel: the next message's number.
    pub next: Vec<AtomicU64>,
    /// Numbers whose publish failed, per channel.
    pub failed: Vec<Mutex<SeqSet>>,
    pub failures: AtomicU64,
}

impl Publishing {
    pub fn new(channels: usize) -> Publishing {
        Publishing {
            next: (0..channels).map(|_| AtomicU64::new(0)).collect(),
            failed: (0..channels)
                .map(|_| Mutex::new(SeqSet::default()))
                .collect(),
            failures: AtomicU64::new(0),
        }
    }

    pub fn published(&self, channel: usize) -> u64 {
        self.next[channel].load(Relaxed)
    }

    /// The last number of `channel` that was published successfully.
    pub fn last_ok(&self, channel: usize) -> Option<u64> {
        let failed = self.failed[channel].lock().unwrap();
        (0..self.published(channel))
            .rev()
            .find(|&q| !failed.contains(q))
    }
}

/// One channel's publisher: a message every `interval` (late ticks are
/// delayed, not bunched) until `stop` turns true, through a node that is
/// up ([`Publishers::pick`]): after a failed publish it moves on to the
/// next node, as a backend behind a load balancer would be sent to another.
pub async fn publish(
    index: usize,
    name: String,
    nodes: Arc<Publishers>,
    interval: Duration,
    state: Arc<Publishing>,
    live: Arc<Live>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The node this channel's publishes go to first: spread over them.
    let mut prefer = index;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            return;
        }
        let seq = state.next[index].load(Relaxed);
        let id = MsgId {
            sender: index as u64,
            seq,
        };
        let data = bench_data(super::now_us(), id);
        let (node, publisher) = nodes.pick(prefer);
        if let Err(e) = publisher.publish(&name, EVENT, &data).await {
            // Neither expected nor counted: a failed publish may still
            // have been delivered, and is never sent again.
            state.failed[index].lock().unwrap().insert(seq);
            state.failures.fetch_add(1, Relaxed);
            live.error(e.kind(), publisher.explain(&e, nodes.target(node)));
            prefer = node + 1;
        }
        state.next[index].store(seq + 1, Relaxed);
    }
}

/// What one client received of its channel.
#[derive(Debug, Default)]
pub struct Track {
    /// Subscribed before publishing started.
    pub active: bool,
    /// Back after the drop.
    pub returned: bool,
    pub seen: SeqSet,
    pub max: Option<u64>,
    pub duplicated: u64,
    pub out_of_order: u64,
    /// Messages of another channel, or numbers the bench never sent.
    pub unexpected: u64,
    /// The channel's publishes finished at the drop, while it is away.
    pub away_since: Option<u64>,
    /// Messages published on its channel while it was away, over all its
    /// gaps (a rolling restart can move a client more than once).
    pub during_gaps: u64,
}

impl Track {
    /// The client lost its connection; `published`: its channel's count.
    pub fn left(&mut self, published: u64) {
        self.away_since = Some(published);
    }

    /// The client is subscribed again.
    pub fn back(&mut self, published: u64) {
        self.returned = true;
        if let Some(since) = self.away_since.take() {
            self.during_gaps += published.saturating_sub(since);
        }
    }

    /// A message `id` arrived for a client of channel `channel`.
    pub fn record(&mut self, channel: usize, id: MsgId) {
        if id.sender != channel as u64 {
            self.unexpected += 1;
            return;
        }
        match self.seen.insert(id.seq) {
            Receipt::New => {
                if self.max.is_some_and(|m| id.seq < m) {
                    self.out_of_order += 1;
                }
                self.max = Some(self.max.map_or(id.seq, |m| m.max(id.seq)));
            }
            Receipt::Duplicate => self.duplicated += 1,
            Receipt::Unexpected => self.unexpected += 1,
        }
    }
}

/// The ledger's totals, over the clients that came back.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Tally {
    pub returning: u64,
    pub expected: u64,
    pub received: u64,
    pub missed: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    pub unexpected: u64,
    /// Messages published on a client's channel while it was away,
    /// summed over clients: what an at-most-once client loses.
    pub published_during_gaps: u64,
    pub clients_missing: u64,
    pub clients_duplicated: u64,
    pub clients_out_of_order: u64,
    /// Missed messages per returning client, sorted.
    pub missed_per_client: Vec<u64>,
}

/// Count every returning client's messages against what its channel
/// (`channel_of(i)`) published.
pub fn tally(
    tracks: &[Mutex<Track>],
    channel_of: impl Fn(usize) -> usize,
    p: &Publishing,
) -> Tally {
    let failed: Vec<SeqSet> = p.failed.iter().map(|f| f.lock().unwrap().clone()).collect();
    let mut t = Tally::default();
    for (i, track) in tracks.iter().enumerate() {
        let track = track.lock().unwrap();
        if !(track.active && track.returned) {
            continue;
        }
        let c = channel_of(i);
        let (mut expected, mut missed) = (0, 0);
        for q in 0..p.published(c) {
            if failed[c].contains(q) {
                continue;
            }
            expected += 1;
            if !track.seen.contains(q) {
                missed += 1;
            }
        }
        t.returning += 1;
        t.expected += expected;
        t.received += expected - missed;
        t.missed += missed;
        t.duplicated += track.duplicated;
        t.out_of_order += track.out_of_order;
        t.unexpected += track.unexpected;
        t.published_during_gaps += track.during_gaps;
        t.clients_missing += u64::from(missed > 0);
        t.clients_duplicated += u64::from(track.duplicated > 0);
        t.clients_out_of_order += u64::from(track.out_of_order > 0);
        t.missed_per_client.push(missed);
    }
    t.missed_per_client.sort_unstable();
    t
}

impl Tally {
    /// The figures, under the names `--json` and `compare` use.
    pub fn report(&self, r: &mut Report) {
        r.counter("messages_expected", self.expected);
        r.counter("messages_received", self.received);
        r.counter("messages_missed", self.missed);
        r.counter("messages_duplicated", self.duplicated);
        r.counter("messages_out_of_order", self.out_of_order);
        r.counter("messages_unexpected", self.unexpected);
        r.counter("messages_published_during_gaps", self.published_during_gaps);
        r.rate(
            "returning_clients_missing",
            self.clients_missing,
            self.returning,
        );
        r.rate(
            "returning_clients_duplicated",
            self.clients_duplicated,
            self.returning,
        );
        r.rate(
            "returning_clients_out_of_order",
            self.clients_out_of_order,
            self.returning,
        );
        let at = |q: f64| {
            let v = &self.missed_per_client;
            (!v.is_empty()).then(|| v[((v.len() - 1) as f64 * q).round() as usize] as f64)
        };
        r.value("missed_per_client_median", at(0.5), "");
        r.value("missed_per_client_p99", at(0.99), "");
        r.value("missed_per_client_max", at(1.0), "");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missed_duplicated_and_out_of_order_are_separate_counts() {
        let p = Publishing::new(2);
        p.next[0].store(10, Relaxed);
        p.next[1].store(4, Relaxed);
        p.failed[0].lock().unwrap().insert(9);
        let id = |sender: u64, seq: u64| MsgId { sender, seq };
        let tracks: Vec<Mutex<Track>> = (0..4).map(|_| Mutex::new(Track::default())).collect();
        // Client 0 (channel 0): 0..=3 live, away while 4..=6 went out,
        // back with 7, then history 4..=6 after it, 7 again, 8.
        {
            let mut t = tracks[0].lock().unwrap();
            t.active = true;
            t.left(4);
            t.back(7);
            for q in [0, 1, 2, 3, 7, 4, 5, 6, 7, 8] {
                t.record(0, id(0, q));
            }
            t.record(0, id(1, 0));
        }
        // Client 1 (channel 1): everything, once, in order.
        {
            let mut t = tracks[1].lock().unwrap();
            t.active = true;
            t.returned = true;
            for q in 0..4 {
                t.record(1, id(1, q));
            }
        }
        // Client 2 (channel 0): at most once, lost 4..=6.
        {
            let mut t = tracks[2].lock().unwrap();
            t.active = true;
            // Two gaps (a rolling restart moved it twice): 4..=5, 6.
            t.left(4);
            t.back(6);
            t.left(6);
            t.back(7);
            for q in [0, 1, 2, 3, 7, 8] {
                t.record(0, id(0, q));
            }
        }
        // Client 3 never came back: not counted.
        tracks[3].lock().unwrap().active = true;
        let t = tally(&tracks, |i| i % 2, &p);
        assert_eq!(t.returning, 3);
        // 9 expected on channel 0 (9 failed), 4 on channel 1.
        assert_eq!(t.expected, 9 + 4 + 9);
        assert_eq!(t.missed, 3);
        assert_eq!(t.received, t.expected - 3);
        assert_eq!(t.duplicated, 1);
        assert_eq!(t.out_of_order, 3);
        assert_eq!(t.unexpected, 1);
        assert_eq!(t.published_during_gaps, 6);
        assert_eq!(
            (
                t.clients_missing,
                t.clients_duplicated,
                t.clients_out_of_order
            ),
            (1, 1, 1)
        );
        assert_eq!(t.missed_per_client, vec![0, 0, 3]);
        assert_eq!(p.last_ok(0), Some(8));
        assert_eq!(p.last_ok(1), Some(3));
        let mut r = Report::new("storm");
        t.report(&mut r);
        assert_eq!(r.count("messages_missed"), 3);
        assert_eq!(r.figure("missed_per_client_max"), Some(3.0));
    }
}
