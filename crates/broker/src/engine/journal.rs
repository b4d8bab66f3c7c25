//! The publishing side of acknowledged publications (an acknowledgement is true): every
//! publication this node hands the broker takes the next number of the
//! node's sequence and is kept here, bounded.
//!
//! - **Outbox**: entries the broker has not taken yet (the transport's
//!   PUBLISH not answered, or the broker away). They are never evicted;
//!   they go out again, in order, each time the broker comes back
//!   ([`Journal::resume`]). Over [`OUTBOX`] of them a publication is
//!   refused ([`Full`]), which an HTTP endpoint answers with 503: a 2xx
//!   never stands for a message that goes nowhere.
//! - **Window**: taken entries stay [`WINDOW`] (at most [`WINDOW_MAX`]
//!   of them, [`WINDOW_BYTES`] in all) so that a node that missed some of
//!   them (its own outage, a broker restart that lost what it had taken)
//!   asks for them by number after it subscribes again
//!   ([`super::recover`]).
//!
//! One lock, taken once per publication: numbering, keeping and queueing
//! to the transport happen together, so the transport sends in sequence
//! order and a resend never overtakes a newer entry.

use super::Out;
use bytes::Bytes;
use herald_core::broker::Full;
use herald_core::metrics;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Publications held for the broker (not yet taken) before more are
/// refused (`broker.outbox`).
pub const OUTBOX: usize = 16 * 1024;

/// The largest `broker.outbox` (the engine's queue keeps room for two).
pub const OUTBOX_MAX: usize = 1 << 20;

/// How long a taken publication stays for the nodes that missed it
/// (`broker.recovery_window`).
pub const WINDOW: Duration = Duration::from_secs(60);

/// Most publications kept in the window (`broker.recovery_max`).
pub const WINDOW_MAX: usize = 100_000;

/// Most bytes kept (window and outbox): over it, taken entries go first;
/// if only the outbox is left, publications are refused
/// (`broker.journal_max_bytes`).
pub const WINDOW_BYTES: usize = 64 << 20;

/// The journal's bounds (the `broker.*` settings above).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub outbox: usize,
    pub window: Duration,
    pub window_max: usize,
    pub bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            outbox: OUTBOX,
            window: WINDOW,
            window_max: WINDOW_MAX,
            bytes: WINDOW_BYTES,
        }
    }
}

impl Limits {
    /// The bounds `config` sets.
    pub fn of(config: &herald_core::config::BrokerConfig) -> Limits {
        Limits {
            outbox: config.outbox.min(OUTBOX_MAX),
            window: Duration::from_secs(config.recovery_window),
            window_max: config.recovery_max,
            bytes: config.journal_max_bytes,
        }
    }
}

struct Kept {
    seq: u64,
    at: Instant,
    subject: String,
    bytes: Bytes,
}

struct Inner {
    /// The next publication's number (from 1).
    next: u64,
    /// Every entry up to this number was taken by the broker.
    taken: u64,
    /// Queue entries to the transport as they come (the broker is up and
    /// the outbox was sent again).
    live: bool,
    entries: VecDeque<Kept>,
    bytes: usize,
    limits: Limits,
}

pub struct Journal {
    inner: Mutex<Inner>,
}

impl Default for Journal {
    fn default() -> Self {
        Journal {
            inner: Mutex::new(Inner {
                next: 1,
                taken: 0,
                live: false,
                entries: VecDeque::new(),
                bytes: 0,
                limits: Limits::default(),
            }),
        }
    }
}

impl Inner {
    fn unsent(&self) -> u64 {
        self.next - 1 - self.taken
    }

    /// Drop taken entries past the window's bounds.
    fn evict(&mut self, now: Instant) {
        while let Some(f) = self.entries.front() {
            let l = &self.limits;
            let old = now.duration_since(f.at) > l.window
                || self.entries.len() > l.window_max
                || self.bytes > l.bytes;
            if f.seq > self.taken || !old {
                break;
            }
            self.bytes -= f.bytes.len();
            self.entries.pop_front();
        }
    }

    fn gauge(&self) {
        metrics::BROKER_OUTBOX.set(self.unsent());
    }
}

impl Journal {
    /// Set the bounds (before the engine starts).
    pub fn configure(&self, limits: Limits) {
        self.inner.lock().limits = limits;
    }

    /// Number, keep and (while live) queue the message `make` builds for
    /// its number. `Err(Full)`: the outbox is full; nothing was kept.
    pub fn publish(
        &self,
        subject: String,
        make: impl FnOnce(u64) -> Vec<u8>,
        out: &mpsc::Sender<Out>,
    ) -> Result<(), Full> {
        let mut j = self.inner.lock();
        let now = Instant::now();
        j.evict(now);
        if j.unsent() >= j.limits.outbox as u64 || j.bytes > j.limits.bytes {
            return Err(Full);
        }
        let seq = j.next;
        j.next += 1;
        let bytes = Bytes::from(make(seq));
        j.bytes += bytes.len();
        if j.live {
            queue(out, seq, subject.clone(), bytes.clone());
        }
        j.entries.push_back(Kept {
            seq,
            at: now,
            subject,
            bytes,
        });
        j.gauge();
        Ok(())
    }

    /// The transport's broker answered every message up to `seq`.
    pub fn taken(&self, seq: u64) {
        let mut j = self.inner.lock();
        if seq > j.taken {
            j.taken = seq.min(j.next - 1);
            j.evict(Instant::now());
            j.gauge();
        }
    }

    /// The broker is back (subscriptions in place): send the outbox again,
    /// in order, then every new entry as it comes. What the broker had
    /// taken before it went away may be sent twice; receivers drop the
    /// second copy by number.
    pub fn resume(&self, out: &mpsc::Sender<Out>) {
        let mut j = self.inner.lock();
        let taken = j.taken;
        for k in j.entries.iter().filter(|k| k.seq > taken) {
            queue(out, k.seq, k.subject.clone(), k.bytes.clone());
        }
        j.live = true;
    }

    /// The broker went away: keep, do not queue.
    pub fn pause(&self) {
        self.inner.lock().live = false;
    }

    /// The last number given (0: none yet).
    pub fn last(&self) -> u64 {
        self.inner.lock().next - 1
    }

    /// The kept messages numbered above `after`, and the first number
    /// still kept above it (the ones between `after` and it are gone).
    pub fn since(&self, after: u64) -> (u64, Vec<Bytes>) {
        let j = self.inner.lock();
        let first = j.entries.front().map_or(j.next, |f| f.seq).max(after + 1);
        let start = j.entries.partition_point(|k| k.seq <= after);
        let list = j.entries.range(start..).map(|k| k.bytes.clone()).collect();
        (first, list)
    }
}

/// Queue one entry for the transport. The queue keeps room for a whole
/// outbox (see [`super::Shared::send`]), so this fails only if the engine
/// stopped; the entry stays kept either way and nodes that miss it ask.
fn queue(out: &mpsc::Sender<Out>, seq: u64, subject: String, bytes: Bytes) {
    if out.try_send(Out::Send(subject, bytes, seq)).is_err() {
        tracing::debug!(
            seq,
            "publication kept but not queued; receivers will ask for it"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(rx: &mut mpsc::Receiver<Out>) -> Vec<u64> {
        let mut seqs = Vec::new();
        while let Ok(Out::Send(_, _, s)) = rx.try_recv() {
            seqs.push(s);
        }
        seqs
    }

    #[test]
    fn outbox_is_resent_in_order_and_bounded() {
        let (tx, mut rx) = mpsc::channel(OUTBOX * 2);
        let j = Journal::default();
        for _ in 0..3 {
            j.publish("s".into(), |n| n.to_string().into_bytes(), &tx)
                .unwrap();
        }
        // Not live yet: kept, not queued.
        assert!(drain(&mut rx).is_empty());
        j.resume(&tx);
        assert_eq!(drain(&mut rx), [1, 2, 3]);
        j.publish("s".into(), |n| n.to_string().into_bytes(), &tx)
            .unwrap();
        assert_eq!(drain(&mut rx), [4]);
        j.taken(2);
        j.pause();
        j.resume(&tx);
        assert_eq!(drain(&mut rx), [3, 4]);
        let (first, list) = j.since(1);
        assert_eq!((first, list.len()), (2, 3));
        // A full outbox refuses.
        j.pause();
        j.taken(4);
        for _ in 0..OUTBOX {
            j.publish("s".into(), |_| b"x".to_vec(), &tx).unwrap();
        }
        assert_eq!(j.publish("s".into(), |_| b"x".to_vec(), &tx), Err(Full));
        j.taken(j.last());
        assert!(j.publish("s".into(), |_| b"x".to_vec(), &tx).is_ok());
    }
}
