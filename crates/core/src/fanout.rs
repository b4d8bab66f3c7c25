//! Fan-out: a published message, encoded once per (protocol, tag) and
//! queued to every subscriber as the same bytes, off the publisher's task.
//!
//! Delivery runs on a small pool of fan-out workers, not on the task that
//! published: a publish to 100 channels of 10,000 subscribers must not run a
//! million queue pushes on an HTTP handler's thread. A channel always goes
//! to the same worker (by a hash of its name) and each worker runs its jobs
//! in order, so one publisher's messages on one channel arrive in order.
//!
//! A worker writes quiet subscribers' frames to their sockets itself
//! (direct writes, see [`crate::connection`]), up to [`SENDS_PER_SUBMIT`]
//! of them per system call on an io_uring ([`Sends`]): under light
//! traffic per subscriber, a delivery then costs the kernel's send path
//! and little else. Where the kernel refuses io_uring (old kernels,
//! container seccomp profiles), each direct write is its own `send`.

use crate::connection::Connection;
use crate::frame::Frame;
use crate::metrics;
use crate::namespace::Namespace;
use crate::publication::{json_string, same, Position, Publication, Tag, Wire};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use tokio::sync::mpsc;

/// One subscription, as fan-out sees it.
#[derive(Clone)]
pub struct Target {
    pub conn: Arc<Connection>,
    pub tag: Tag,
}

/// Queue `p` to every target; returns how many frames were queued. The last
/// (wire, tag) frame is remembered, so a run of subscribers with the same
/// protocol and tag costs one comparison each.
pub fn deliver(p: &Publication, targets: &[Target]) -> u64 {
    deliver_with(p, targets, None)
}

/// [`deliver`], direct writes batched on `sends` where there is one.
fn deliver_with(p: &Publication, targets: &[Target], mut sends: Option<&mut Sends>) -> u64 {
    // Reliable streams: positioned publications go through each
    // connection's gate; the at-most-once path below is unchanged.
    if let Some(pos) = &p.position {
        return deliver_positioned(p, pos, targets);
    }
    let mut delivered = 0;
    let mut last: Option<(&'static dyn Wire, &Tag, Frame)> = None;
    for t in targets {
        let conn = &t.conn;
        if p.excludes(conn.id) {
            continue;
        }
        let frame = match &last {
            Some((w, tag, f))
                if !conn.wire.per_subscriber() && same(*w, conn.wire) && **tag == t.tag =>
            {
                f.clone()
            }
            _ => {
                let f = p.frame(conn.wire, &t.tag);
                last = Some((conn.wire, &t.tag, f.clone()));
                f
            }
        };
        if let Some(s) = sends.as_deref_mut() {
            if frame.parts()[0].is_empty() && !s.failed {
                if let Some(fd) = conn.begin_direct() {
                    s.add(conn, fd, frame);
                    delivered += 1;
                    continue;
                }
            }
        }
        if conn.send(frame) {
            delivered += 1;
        }
    }
    delivered
}

/// Direct writes per io_uring submission.
pub const SENDS_PER_SUBMIT: usize = 128;

/// Failed `io_uring_enter` calls in a row before a batch is given up.
const MAX_RING_FAILURES: u32 = 100;

/// A fan-out worker's batch of direct writes: one `Send` per socket
/// queued on an io_uring and submitted together, the frames (whose bytes
/// the kernel reads) held until their completions are reaped. Every send
/// is non-blocking (`MSG_DONTWAIT`), so the kernel completes it during
/// the submission and the wait that follows never waits on a client.
pub struct Sends {
    ring: io_uring::IoUring,
    pending: Vec<Option<(Arc<Connection>, Frame)>>,
    /// The ring failed: the worker stops using it (see `flush`).
    failed: bool,
}

impl Sends {
    /// A ring, or `None` where the kernel refuses one.
    pub fn new() -> Option<Sends> {
        let ring = io_uring::IoUring::new(SENDS_PER_SUBMIT as u32).ok()?;
        Some(Sends {
            ring,
            pending: Vec::with_capacity(SENDS_PER_SUBMIT),
            failed: false,
        })
    }

    /// Queue `frame` (one part) to socket `fd`, reserved on `conn` with
    /// [`Connection::begin_direct`]; submits when the ring is full.
    fn add(&mut self, conn: &Arc<Connection>, fd: i32, frame: Frame) {
        let body = frame.parts()[1];
        let sqe =
            io_uring::opcode::Send::new(io_uring::types::Fd(fd), body.as_ptr(), body.len() as u32)
                .flags(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                .build()
                .user_data(self.pending.len() as u64);
        // SAFETY: the bytes belong to `frame`, kept in `pending` until the
        // send's completion is reaped in `flush`; the descriptor stays open
        // until then (`begin_direct`'s reservation holds off its close).
        let pushed = unsafe { self.ring.submission().push(&sqe) };
        if pushed.is_err() {
            // Cannot happen (flushed when full); never leave it reserved.
            conn.end_direct(frame, -1);
            return;
        }
        self.pending.push(Some((conn.clone(), frame)));
        if self.pending.len() == SENDS_PER_SUBMIT && !self.flush() {
            self.failed = true;
        }
    }

    /// Submit what is queued and report each result to its connection.
    /// `false`: the ring failed and must not be used (nor dropped: the
    /// kernel may still read the buffers it was given; see below).
    #[must_use]
    pub fn flush(&mut self) -> bool {
        let mut left = self.pending.iter().filter(|p| p.is_some()).count();
        let mut failures = 0;
        while left > 0 {
            match self.ring.submit_and_wait(left) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if failures < MAX_RING_FAILURES => {
                    // Transient (the kernel short of memory): again.
                    failures += 1;
                    tracing::debug!("fan-out io_uring: {e}; retrying");
                    std::thread::yield_now();
                }
                Err(e) => {
                    // Not seen in practice. Whether the kernel still holds
                    // these sends is unknown, so their bytes must stay
                    // valid (leaked) and their frames neither resent nor
                    // counted sent: the connections close, and their
                    // clients reconnect (resuming, where they can).
                    tracing::warn!("fan-out io_uring failed ({e}); closing {left} connections");
                    self.reap();
                    for (conn, frame) in self.pending.drain(..).flatten() {
                        std::mem::forget(frame);
                        conn.abandon_direct();
                    }
                    return false;
                }
            }
            left -= self.reap();
        }
        self.pending.clear();
        true
    }

    /// Report the completions that are in; returns how many.
    fn reap(&mut self) -> usize {
        let mut n = 0;
        for cqe in self.ring.completion() {
            let slot = self
                .pending
                .get_mut(cqe.user_data() as usize)
                .and_then(Option::take);
            if let Some((conn, frame)) = slot {
                conn.end_direct(frame, cqe.result() as isize);
                n += 1;
            }
        }
        n
    }
}

/// [`deliver`] for a publication with a position: a connection with a
/// [`crate::connection::gate::Gate`] decides whether the frame goes now,
/// waits, or was already sent in a history answer.
fn deliver_positioned(p: &Publication, pos: &Position, targets: &[Target]) -> u64 {
    let mut delivered = 0;
    for t in targets {
        let conn = &t.conn;
        if p.excludes(conn.id) {
            continue;
        }
        let frame = p.frame(conn.wire, &t.tag);
        let sent = match conn.gate() {
            Some(gate) => gate.pass(conn, &p.channel, &t.tag, pos, frame),
            None => conn.send(frame),
        };
        if sent {
            delivered += 1;
        }
    }
    delivered
}

/// Work for a fan-out worker: a publication and the subscriber lists it
/// goes to (an exact channel's and matching patterns').
pub struct Job {
    pub publication: Arc<Publication>,
    pub targets: Vec<Arc<[Target]>>,
    /// Told when the job is done (see [`Fanout::settle`]).
    pub done: Option<tokio::sync::oneshot::Sender<()>>,
}

/// Jobs one worker may have waiting before publishers wait for it.
const WORKER_QUEUE: usize = 4096;

/// The pool of fan-out workers.
pub struct Fanout {
    workers: Vec<mpsc::Sender<Job>>,
}

impl Fanout {
    /// Start `n` workers on the current runtime, batching direct writes
    /// on an io_uring each (`direct`, where the kernel allows one).
    pub fn start(n: usize, direct: bool) -> Fanout {
        let workers = (0..n.max(1))
            .map(|_| {
                let (tx, mut rx) = mpsc::channel::<Job>(WORKER_QUEUE);
                tokio::spawn(async move {
                    let mut sends = if direct { Sends::new() } else { None };
                    while let Some(mut job) = rx.recv().await {
                        if !run(&job, sends.as_mut()) {
                            // Leaked, not dropped: see `Sends::flush`.
                            std::mem::forget(sends.take());
                        }
                        if let Some(done) = job.done.take() {
                            let _ = done.send(());
                        }
                        // Let sessions on this thread write between big jobs.
                        tokio::task::yield_now().await;
                    }
                });
                tx
            })
            .collect();
        Fanout { workers }
    }

    /// The worker that owes `p` its order: one per channel. (Spreading a
    /// channel's client events over workers by sender was measured and
    /// lost: two workers pushing to the same connections interleave their
    /// bursts, which costs more wake-ups and writes than it saves;
    /// bench/RESULTS.md, core issue.)
    fn worker(&self, p: &Publication) -> &mpsc::Sender<Job> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        p.channel.hash(&mut h);
        &self.workers[h.finish() as usize % self.workers.len()]
    }

    /// Hand a job to the worker that owns its channel. Waits only when that
    /// worker is far behind (backpressure on the publisher, bounded memory).
    pub async fn submit(&self, job: Job) {
        let worker = self.worker(&job.publication);
        if let Err(mpsc::error::TrySendError::Full(job)) = worker.try_send(job) {
            let _ = worker.send(job).await;
        }
    }

    /// Resolves once every job submitted before the call has been
    /// delivered (tests and tools: publishing is otherwise fire-and-forget).
    pub async fn settle(&self) {
        let mut waits = Vec::new();
        for worker in &self.workers {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let job = Job {
                // A marker job: no channel, no subscriber.
                publication: Arc::new(Publication::new(
                    Namespace::new("settle"),
                    String::new(),
                    String::new(),
                    json_string(""),
                )),
                targets: Vec::new(),
                done: Some(tx),
            };
            if worker.send(job).await.is_ok() {
                waits.push(rx);
            }
        }
        for w in waits {
            let _ = w.await;
        }
    }

    /// [`Fanout::submit`] for callers that cannot wait (the broker's inbox):
    /// a full worker queue gets the job from a task instead, which may
    /// reorder it behind later ones; counted, as it means overload.
    pub fn submit_now(&self, job: Job) {
        let worker = self.worker(&job.publication).clone();
        if let Err(mpsc::error::TrySendError::Full(job)) = worker.try_send(job) {
            metrics::count(&metrics::FANOUT_OVERFLOW);
            tokio::spawn(async move {
                let _ = worker.send(job).await;
            });
        }
    }
}

/// Deliver a job; `false` if its batch's ring failed.
fn run(job: &Job, mut sends: Option<&mut Sends>) -> bool {
    let started = std::time::Instant::now();
    // Counted before delivering: a publication to many subscribers is
    // itself the load under which their sessions should coalesce.
    crate::load::note(job.targets.iter().map(|t| t.len() as u64).sum());
    let mut delivered = 0;
    for targets in &job.targets {
        delivered += deliver_with(&job.publication, targets, sends.as_deref_mut());
    }
    let ring_ok = match sends {
        Some(s) => !s.failed && s.flush(),
        None => true,
    };
    metrics::add(&metrics::FRAMES_DELIVERED, delivered);
    metrics::observe_fanout(started.elapsed());
    ring_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::QueueLimit;
    use crate::testing::{IdWire, TestWire};

    const LIMIT: QueueLimit = QueueLimit {
        frames: 64,
        bytes: 1 << 20,
    };

    fn target(id: u64, wire: &'static dyn Wire, tag: Option<&str>) -> Target {
        Target {
            conn: Arc::new(Connection::new(id, format!("1.{id}"), wire, LIMIT)),
            tag: tag.map(Arc::from),
        }
    }

    fn frames(t: &Target) -> Vec<Frame> {
        let mut out = Vec::new();
        t.conn.take(&mut out, 64);
        out
    }

    fn publication() -> Publication {
        Publication::new(
            crate::testing::NS,
            "room".into(),
            "e".into(),
            json_string("hi"),
        )
    }

    #[test]
    fn one_encoding_per_wire_and_tag() {
        let p = publication();
        let ts = [
            target(1, &TestWire, None),
            target(2, &TestWire, Some("a")),
            target(3, &TestWire, None),
            target(4, &TestWire, Some("a")),
            target(5, &TestWire, Some("b")),
        ];
        let before = metrics::FRAMES_ENCODED.get();
        assert_eq!(deliver(&p, &ts), 5);
        // Three (wire, tag) pairs: three encodings (other tests may encode
        // concurrently, so count at least, and check sharing below).
        assert!(metrics::FRAMES_ENCODED.get() - before >= 3);
        let f: Vec<Frame> = ts.iter().map(|t| frames(t).remove(0)).collect();
        assert_eq!(f[0].payload_text(), "|e|room|\"hi\"");
        assert_eq!(f[1].payload_text(), "a|e|room|\"hi\"");
        assert_eq!(f[4].payload_text(), "b|e|room|\"hi\"");
        // Same (wire, tag): the very same bytes.
        assert_eq!(f[0].parts()[1].as_ptr(), f[2].parts()[1].as_ptr());
        assert_eq!(f[1].parts()[1].as_ptr(), f[3].parts()[1].as_ptr());
        assert_ne!(f[0].parts()[1].as_ptr(), f[1].parts()[1].as_ptr());
        // Asking again builds nothing new.
        let again = p.frame(&TestWire, &Some(Arc::from("b")));
        assert_eq!(again.parts()[1].as_ptr(), f[4].parts()[1].as_ptr());
    }

    #[test]
    fn per_subscriber_tags_share_the_body() {
        let p = publication();
        let ts = [
            target(1, &IdWire, Some("s1")),
            target(2, &IdWire, Some("s22")),
        ];
        deliver(&p, &ts);
        let a = frames(&ts[0]).remove(0);
        let b = frames(&ts[1]).remove(0);
        assert_eq!(a.payload_text(), "s1:\"hi\"");
        assert_eq!(b.payload_text(), "s22:\"hi\"");
        assert_eq!(a.parts()[1].as_ptr(), b.parts()[1].as_ptr());
    }

    #[test]
    fn excluded_socket_is_skipped() {
        let mut p = publication().excluding(Some("1.2".into()));
        p.resolve(1);
        let ts = [target(1, &TestWire, None), target(2, &TestWire, None)];
        assert_eq!(deliver(&p, &ts), 1);
        assert!(frames(&ts[1]).is_empty());
    }

    #[test]
    fn bytes_roundtrip() {
        let mut p = publication().excluding(Some("1.1".into())).cached(true);
        p.origin = 7;
        p.id = 9;
        let q = Publication::from_bytes(&p.to_bytes()).unwrap();
        assert_eq!(
            (
                q.channel.as_str(),
                q.data.get(),
                q.exclude.as_deref(),
                q.cache,
                q.origin,
                q.id
            ),
            ("room", "\"hi\"", Some("1.1"), true, 7, 9)
        );
    }
}
