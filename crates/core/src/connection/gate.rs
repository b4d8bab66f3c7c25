//! The per-connection gate of reliable streams: each publication once, in
//! order, whether it comes live, in a history answer, or both.

use crate::connection::Connection;
use crate::frame::Frame;
use crate::history::{Backlog, Entry};
use crate::publication::{Position, Tag};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// A hole in one stream's live offsets: the publications after `after`
/// (in `epoch`) up to the one that revealed it must be read from the
/// history. The stream is held until [`Gate::release`].
#[derive(Debug, Clone)]
pub struct Gap {
    pub channel: Box<str>,
    /// The subscription tag the revealing publication came with.
    pub tag: Tag,
    pub epoch: Arc<str>,
    pub after: u64,
}

/// What the connection's owner does with a gap: read the history (off the
/// fan-out worker: it spawns) and [`Gate::release`] the stream.
pub type Healer = Box<dyn Fn(Gap) + Send + Sync>;

/// One connection's view of its reliable streams: what it was last given
/// on each, and what waits while a history answer is being prepared.
///
/// Why: a client that reconnects subscribes (live publications start to
/// flow) and asks for what it missed; without a gate a publication can
/// arrive both live and in the answer, or live before older ones from the
/// answer. While a stream is held, live publications wait here; the answer
/// goes out, then the held ones after it, skipping offsets already sent.
/// Afterwards, a live publication at or below the last offset sent is a
/// duplicate and dropped. Fan-out consults the gate only for publications
/// that carry a position, on connections that have one.
///
/// Gaps: on one node, offsets reach a connection in order (the publisher
/// appends and hands to fan-out under one lock). In a cluster two nodes may
/// publish on one stream at once, and their publications may cross on the
/// way; the broker may also lose one while it reconnects. A gate with a
/// [`Healer`] treats an offset past `last + 1` as a gap: it holds the
/// stream and has the healer read what is missing from the shared history.
///
/// Everything the gate sends at once (a history answer, what was held)
/// goes out as a burst ([`Connection::send_burst`]), past the queue's
/// bound up to [`Gate::allow_burst`] bytes: it is bounded already (at most
/// the history limit per stream, at most [`MAX_HELD`] held), and it comes
/// all at once, not at the pace of publishing, so the normal bound (sized
/// for live traffic) would cut a client that reads perfectly well.
#[derive(Default)]
pub struct Gate {
    streams: Mutex<Tracks>,
    healer: OnceLock<Healer>,
    /// Bytes of answers that may wait past the queue's bound (0: none).
    burst: AtomicUsize,
}

/// Each (stream, subscription tag)'s track: a connection may follow one
/// stream from two subscriptions, and each gets every publication once.
/// By stream first (one lookup per publication), then a short list by tag.
#[derive(Default)]
struct Tracks(HashMap<Box<str>, Vec<(Tag, Track)>>);

impl Tracks {
    fn get(&self, channel: &str, tag: &Tag) -> Option<&Track> {
        let list = self.0.get(channel)?;
        list.iter().find(|(t, _)| t == tag).map(|(_, k)| k)
    }

    fn get_mut(&mut self, channel: &str, tag: &Tag) -> Option<&mut Track> {
        let list = self.0.get_mut(channel)?;
        list.iter_mut().find(|(t, _)| t == tag).map(|(_, k)| k)
    }

    fn insert(&mut self, channel: &str, tag: &Tag, track: Track) {
        match self.get_mut(channel, tag) {
            Some(k) => *k = track,
            None => self
                .0
                .entry(channel.into())
                .or_default()
                .push((tag.clone(), track)),
        }
    }

    fn remove(&mut self, channel: &str, tag: &Tag) -> Option<Track> {
        let list = self.0.get_mut(channel)?;
        let i = list.iter().position(|(t, _)| t == tag)?;
        let (_, track) = list.swap_remove(i);
        if list.is_empty() {
            self.0.remove(channel);
        }
        Some(track)
    }
}

/// Most live publications held per stream while its history is answered;
/// past it the hold ends (they go out as they come).
pub const MAX_HELD: usize = 1024;

/// Reads of the history for one gap before the gate gives up on it (the
/// engine no longer has what is missing) and lets the stream go on.
pub const MAX_HEALS: u8 = 3;

enum Track {
    Live { epoch: Arc<str>, last: u64 },
    Held(Held),
}

struct Held {
    frames: Vec<(Position, Frame)>,
    /// What was sent before the hold (a gap's hold keeps it; a history
    /// request's starts afresh: the client said where it stands).
    base: Option<(Arc<str>, u64)>,
    /// For a gap's hold: the history reads so far.
    healing: Option<u8>,
}

impl Gate {
    /// Fill gaps in live offsets through `healer` from now on (once).
    pub fn heal_with(&self, healer: Healer) {
        let _ = self.healer.set(healer);
    }

    /// Let up to `bytes` of answers wait past the queue's bound.
    pub fn allow_burst(&self, bytes: usize) {
        self.burst.store(bytes, Ordering::Relaxed);
    }

    /// Bytes of answers that may wait past the queue's bound.
    pub fn burst_room(&self) -> usize {
        self.burst.load(Ordering::Relaxed)
    }

    fn burst(&self, conn: &Connection, frame: Frame) -> bool {
        conn.send_burst(frame, self.burst_room())
    }

    /// Fan-out: deliver `frame` (publication at `pos` on `channel`, for
    /// subscription `tag`) now, hold it, or drop it as already sent.
    /// Returns whether it was queued or held.
    pub fn pass(
        &self,
        conn: &Connection,
        channel: &str,
        tag: &Tag,
        pos: &Position,
        frame: Frame,
    ) -> bool {
        let mut streams = self.streams.lock();
        match streams.get_mut(channel, tag) {
            Some(Track::Held(h)) => {
                if h.frames.len() < MAX_HELD {
                    h.frames.push((pos.clone(), frame));
                    return true;
                }
                // Held too long: everything goes out as it is.
                let held = std::mem::take(&mut h.frames);
                let mut last = None;
                for (p, f) in held {
                    self.burst(conn, f);
                    last = Some(p);
                }
                match last {
                    Some(p) => streams.insert(
                        channel,
                        tag,
                        Track::Live {
                            epoch: p.epoch,
                            last: p.offset,
                        },
                    ),
                    None => {
                        streams.remove(channel, tag);
                    }
                };
                drop(streams);
                self.pass(conn, channel, tag, pos, frame)
            }
            Some(Track::Live { epoch, last }) if **epoch == *pos.epoch && pos.offset <= *last => {
                false
            }
            Some(Track::Live { epoch, last })
                if **epoch == *pos.epoch
                    && pos.offset > *last + 1
                    && self.healer.get().is_some() =>
            {
                let gap = Gap {
                    channel: channel.into(),
                    tag: tag.clone(),
                    epoch: epoch.clone(),
                    after: *last,
                };
                let mut held = Held {
                    frames: Vec::with_capacity(4),
                    base: Some((epoch.clone(), *last)),
                    healing: Some(1),
                };
                held.frames.push((pos.clone(), frame));
                streams.insert(channel, tag, Track::Held(held));
                drop(streams);
                if let Some(heal) = self.healer.get() {
                    heal(gap);
                }
                true
            }
            Some(Track::Live { epoch, last }) => {
                *epoch = pos.epoch.clone();
                *last = pos.offset;
                conn.send(frame)
            }
            None => {
                streams.insert(
                    channel,
                    tag,
                    Track::Live {
                        epoch: pos.epoch.clone(),
                        last: pos.offset,
                    },
                );
                conn.send(frame)
            }
        }
    }

    /// Hold live publications of `channel` until [`Gate::release`] (a
    /// history request: its answer starts afresh).
    pub fn hold(&self, channel: &str, tag: &Tag) {
        let mut streams = self.streams.lock();
        if !matches!(streams.get(channel, tag), Some(Track::Held(_))) {
            let fresh = Held {
                frames: Vec::new(),
                base: None,
                healing: None,
            };
            streams.insert(channel, tag, Track::Held(fresh));
        }
    }

    /// Send `backlog` (frames built by `frame`, the ones not sent yet),
    /// then what was held, in order and each once, and let live
    /// publications through again. `backlog` is `None` when the history
    /// could not be read: the held ones go out as they are. When a gap's
    /// answer still leaves a hole before what was held, the stream stays
    /// held and the history is read again (at most [`MAX_HEALS`] times).
    pub fn release(
        &self,
        conn: &Connection,
        channel: &str,
        tag: &Tag,
        backlog: Option<&Backlog>,
        frame: impl Fn(&Entry, &Arc<str>) -> Frame,
    ) {
        let mut streams = self.streams.lock();
        let (base, mut held, healing) = match streams.remove(channel, tag) {
            Some(Track::Live { epoch, last }) => (Some((epoch, last)), Vec::new(), None),
            Some(Track::Held(h)) => (h.base, h.frames, h.healing),
            None => (None, Vec::new(), None),
        };
        let (mut epoch, mut last) = match base {
            Some((e, l)) => (Some(e), l),
            None => (None, 0),
        };
        if let Some(b) = backlog {
            let fresh = epoch.as_deref() != Some(&*b.epoch);
            for e in &b.entries {
                if fresh || e.offset > last {
                    self.burst(conn, frame(e, &b.epoch));
                    last = e.offset;
                    epoch = Some(b.epoch.clone());
                }
            }
        }
        // Publications from several nodes may have been held out of order.
        if held.iter().all(|(p, _)| p.epoch == held[0].0.epoch) {
            held.sort_by_key(|(p, _)| p.offset);
        }
        let mut rest = held.into_iter();
        while let Some((p, f)) = rest.next() {
            let same = epoch.as_deref() == Some(&*p.epoch);
            if same && p.offset <= last {
                continue;
            }
            if let (true, Some(reads), Some(heal), Some(e)) =
                (same, healing, self.healer.get(), &epoch)
            {
                if p.offset > last + 1 && backlog.is_some() && reads < MAX_HEALS {
                    let gap = Gap {
                        channel: channel.into(),
                        tag: tag.clone(),
                        epoch: e.clone(),
                        after: last,
                    };
                    let mut frames = vec![(p, f)];
                    frames.extend(rest);
                    streams.insert(
                        channel,
                        tag,
                        Track::Held(Held {
                            frames,
                            base: Some((e.clone(), last)),
                            healing: Some(reads + 1),
                        }),
                    );
                    drop(streams);
                    heal(gap);
                    return;
                }
            }
            self.burst(conn, f);
            last = p.offset;
            epoch = Some(p.epoch);
        }
        if let Some(epoch) = epoch {
            streams.insert(channel, tag, Track::Live { epoch, last });
        }
    }

    /// End a history request's hold on `channel` that no answer came for
    /// (the client never asked): what was held goes out as it is. A gap's
    /// hold, or a stream not held, is left alone.
    pub fn let_go(&self, conn: &Connection, channel: &str, tag: &Tag) {
        let waiting = matches!(
            self.streams.lock().get(channel, tag),
            Some(Track::Held(Held { healing: None, .. }))
        );
        if waiting {
            self.release(conn, channel, tag, None, |_, _| Frame::text(""));
        }
    }

    /// What was sent last on `channel` for `tag`, if the connection is
    /// where the gate knows it (a history answer sends only what is after
    /// it, in that epoch).
    pub fn last_sent(&self, channel: &str, tag: &Tag) -> Option<(Arc<str>, u64)> {
        match self.streams.lock().get(channel, tag)? {
            Track::Live { epoch, last } => Some((epoch.clone(), *last)),
            Track::Held(h) => h.base.clone(),
        }
    }

    /// Forget `channel` for subscription `tag` (it left the stream).
    pub fn forget(&self, channel: &str, tag: &Tag) {
        self.streams.lock().remove(channel, tag);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Limits, MemoryHistory};

    fn limits(per_stream: usize, ttl_ms: u64, max_bytes: usize) -> Limits {
        Limits {
            per_stream,
            ttl_ms,
            max_bytes,
        }
    }

    fn conn() -> Connection {
        use crate::connection::QueueLimit;
        use crate::publication::{Event, Wire};
        struct W;
        impl Wire for W {
            fn name(&self) -> &'static str {
                "t"
            }
            fn publication(&self, _: &crate::publication::Publication, _: &str) -> Frame {
                Frame::text("")
            }
            fn event(&self, _: &Event<'_>, _: &str) -> Option<Frame> {
                None
            }
        }
        static WIRE: W = W;
        Connection::new(
            1,
            "1.1".into(),
            &WIRE,
            QueueLimit {
                frames: 100,
                bytes: 1 << 20,
            },
        )
    }

    fn sent(conn: &Connection) -> Vec<String> {
        let mut out = Vec::new();
        conn.take(&mut out, 100);
        out.iter().map(|f| f.payload_text()).collect()
    }

    #[test]
    fn the_gate_sends_each_publication_once_in_order() {
        let conn = conn();
        let h = MemoryHistory::new(limits(100, 300_000, 1 << 20));
        h.retain_at("s", 0);
        let pos: Vec<Position> = (1..=6)
            .map(|i| h.append_at("s", &i.to_string(), 0).unwrap())
            .collect();
        let gate = Gate::default();
        gate.hold("s", &None);
        // Live 5 and 6 arrive while the answer (3..=6) is prepared.
        for p in &pos[4..] {
            gate.pass(&conn, "s", &None, p, Frame::text(&p.offset.to_string()));
        }
        let backlog = h.after_now("s", &pos[0].epoch, 2).unwrap();
        gate.release(&conn, "s", &None, Some(&backlog), |e, _| {
            Frame::text(&e.data)
        });
        // A late duplicate of 6, then 7.
        gate.pass(&conn, "s", &None, &pos[5], Frame::text("6"));
        let p7 = h.append_at("s", "7", 0).unwrap();
        gate.pass(&conn, "s", &None, &p7, Frame::text("7"));
        assert_eq!(sent(&conn), ["3", "4", "5", "6", "7"]);
    }

    #[test]
    fn publications_held_past_the_answer_go_out_in_offset_order() {
        let conn = conn();
        let h = MemoryHistory::new(limits(100, 300_000, 1 << 20));
        h.retain_at("s", 0);
        let pos: Vec<Position> = (1..=9)
            .map(|i| h.append_at("s", &i.to_string(), 0).unwrap())
            .collect();
        let gate = Gate::default();
        gate.hold("s", &None);
        // Held while the answer is read, in the order several nodes'
        // publications can arrive: 9 before 7 and 8.
        for i in [8, 6, 7] {
            let p = &pos[i];
            gate.pass(&conn, "s", &None, p, Frame::text(&p.offset.to_string()));
        }
        // The answer ends at 6.
        let mut backlog = h.after_now("s", &pos[0].epoch, 2).unwrap();
        backlog.entries.truncate(4);
        gate.release(&conn, "s", &None, Some(&backlog), |e, _| {
            Frame::text(&e.data)
        });
        assert_eq!(sent(&conn), ["3", "4", "5", "6", "7", "8", "9"]);
    }

    #[test]
    fn a_gap_is_filled_from_the_history_and_late_arrivals_dropped() {
        let conn = conn();
        let h = MemoryHistory::new(limits(100, 300_000, 1 << 20));
        h.retain_at("s", 0);
        let pos: Vec<Position> = (1..=7)
            .map(|i| h.append_at("s", &i.to_string(), 0).unwrap())
            .collect();
        let gaps = Arc::new(Mutex::new(Vec::new()));
        let gate = Gate::default();
        let seen = gaps.clone();
        gate.heal_with(Box::new(move |g| seen.lock().push(g)));
        let tag: Tag = Some(Arc::from("sub"));
        let text = |p: &Position| Frame::text(&p.offset.to_string());
        for i in [0, 1, 4, 3] {
            gate.pass(&conn, "s", &tag, &pos[i], text(&pos[i]));
        }
        let gap = gaps.lock().pop().expect("a gap after 2");
        assert_eq!((gap.after, gap.tag.as_deref()), (2, Some("sub")));
        // 7 came before 6; the read (made before 6 and 7 were appended)
        // answers up to 5: a hole before 7 is read again.
        gate.pass(&conn, "s", &tag, &pos[6], text(&pos[6]));
        let mut b = h.after_now("s", &pos[0].epoch, 2).unwrap();
        b.entries.truncate(3);
        gate.release(&conn, "s", &tag, Some(&b), |e, _| Frame::text(&e.data));
        let gap = gaps.lock().pop().expect("a hole before 7");
        assert_eq!(gap.after, 5);
        let b = h.after_now("s", &pos[0].epoch, 5).unwrap();
        gate.release(&conn, "s", &tag, Some(&b), |e, _| Frame::text(&e.data));
        // 6 arrives late: already sent.
        assert!(!gate.pass(&conn, "s", &tag, &pos[5], text(&pos[5])));
        assert_eq!(sent(&conn), ["1", "2", "3", "4", "5", "6", "7"]);
    }

    #[test]
    fn a_gap_the_history_cannot_fill_is_given_up_after_a_few_reads() {
        let conn = conn();
        let gaps = Arc::new(Mutex::new(0));
        let gate = Gate::default();
        let seen = gaps.clone();
        gate.heal_with(Box::new(move |_| *seen.lock() += 1));
        let at = |o| Position {
            epoch: Arc::from("e"),
            offset: o,
        };
        gate.pass(&conn, "s", &None, &at(1), Frame::text("1"));
        gate.pass(&conn, "s", &None, &at(3), Frame::text("3"));
        let empty = Backlog {
            epoch: Arc::from("e"),
            entries: Vec::new(),
        };
        for _ in 0..10 {
            gate.release(&conn, "s", &None, Some(&empty), |e, _| Frame::text(&e.data));
        }
        assert_eq!(*gaps.lock(), usize::from(MAX_HEALS));
        assert_eq!(sent(&conn), ["1", "3"]);
        // Without a healer (one node) a jump is taken as it is.
        let plain = Gate::default();
        plain.pass(&conn, "s", &None, &at(1), Frame::text("1"));
        assert!(plain.pass(&conn, "s", &None, &at(3), Frame::text("3")));
        assert_eq!(sent(&conn), ["1", "3"]);
    }

    #[test]
    fn a_hold_nobody_answers_can_be_let_go() {
        let conn = conn();
        let gate = Gate::default();
        let at = |o| Position {
            epoch: Arc::from("e"),
            offset: o,
        };
        gate.hold("s", &None);
        gate.pass(&conn, "s", &None, &at(4), Frame::text("4"));
        gate.pass(&conn, "s", &None, &at(5), Frame::text("5"));
        assert!(sent(&conn).is_empty());
        gate.let_go(&conn, "s", &None);
        gate.let_go(&conn, "s", &None);
        gate.pass(&conn, "s", &None, &at(6), Frame::text("6"));
        assert_eq!(sent(&conn), ["4", "5", "6"]);
    }

    #[test]
    fn two_subscriptions_of_one_stream_each_get_every_publication() {
        let conn = conn();
        let gate = Gate::default();
        let at = |o| Position {
            epoch: Arc::from("e"),
            offset: o,
        };
        let (a, b): (Tag, Tag) = (Some(Arc::from("a")), Some(Arc::from("b")));
        for o in 1..=2 {
            for t in [&a, &b] {
                let text = format!("{}{o}", t.as_deref().unwrap_or_default());
                assert!(gate.pass(&conn, "s", t, &at(o), Frame::text(&text)));
            }
        }
        gate.forget("s", &a);
        assert!(gate.pass(&conn, "s", &a, &at(3), Frame::text("a3")));
        assert!(!gate.pass(&conn, "s", &b, &at(2), Frame::text("b2")));
        assert_eq!(sent(&conn), ["a1", "b1", "a2", "b2", "a3"]);
    }
}
