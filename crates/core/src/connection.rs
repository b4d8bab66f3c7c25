//! The shared handle of one client connection: its identity, its protocol,
//! its bounded outbound queue, and a way for anyone (hub, API, shutdown) to
//! ask it to close.
//!
//! The handle is small on purpose; what only the session needs (its
//! subscriptions, rate counters, the socket) lives in the session task. The
//! queue is a plain `VecDeque` behind a short lock plus one waker: it
//! allocates nothing until the first frame (an idle connection holds no
//! queue memory), a frame costs one lock and a push, and the writer is woken
//! only when the queue goes from empty to non-empty. It is bounded twice, in
//! frames and in bytes: a full queue means the client reads slower than we
//! publish, and rather than buffer without bound the connection is closed
//! ([`Reason::SlowConsumer`]) and the client reconnects.
//!
//! One exception, [`Connection::send_burst`]: an answer the client asked
//! for and whose size its owner already bounded (a history answer: at most
//! `history_limit` messages per stream, and streams are limited) is queued
//! past the bound, so a legal request never gets its client cut. Why not
//! wait for the queue to drain instead: the adapter's message handler runs
//! in the task that writes the queue to the socket, so it cannot wait; a
//! feeder task would have to keep the stream's gate held across chunks and
//! order the confirmation after the last one, for the same memory (the
//! answer is read before it is sent). The burst's frames keep their own
//! account, so live frames keep the whole normal room meanwhile: a client
//! that reads is never cut for its answer, one that does not read is cut
//! as before once live frames fill the normal room.
//!
//! **Direct writes.** A frame for a quiet connection (nothing queued, its
//! session not writing, nothing written to it within [`BUSY_WINDOW`]) is
//! written to the socket by whoever sends it, usually a fan-out worker: one
//! non-blocking `sendmsg` under the queue's lock, and no wake-up, poll or
//! allocation in the session's task. Under light traffic (each subscriber
//! gets a message every few hundred milliseconds, say) those are most of a
//! delivery's cost above the system call itself. A busy connection keeps
//! the queue, so its frames still share writes. What a direct write could
//! not finish (a full socket buffer) goes to the queue's front, marked
//! partial, and the session writes the rest before anything else. The
//! session attaches the socket's descriptor only for plain TCP sockets
//! (TLS must encrypt in order, in the session) and detaches it, under the
//! same lock, before the socket closes, so a write never reaches a
//! descriptor number reused by another connection.

pub mod gate;

use crate::frame::Frame;
use crate::history::budget::ANSWERS;
use crate::load::now_ms;
use crate::metrics;
use crate::publication::{ConnId, Wire};
use futures_util::task::AtomicWaker;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// A connection written to within this long counts as busy: its frames
/// wait in the queue, to share writes, rather than go out directly.
pub const BUSY_WINDOW: Duration = Duration::from_millis(50);

/// How much may wait in one connection's outbound queue.
#[derive(Debug, Clone, Copy)]
pub struct QueueLimit {
    pub frames: usize,
    pub bytes: usize,
}

/// Why the core (or an adapter) asks a connection to close. Each adapter
/// maps a reason to its own close code and message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Its outbound queue filled up: the client reads too slowly.
    SlowConsumer,
    /// The app asked (terminate a user's connections).
    Terminated,
    /// The server is shutting down; the client should reconnect elsewhere.
    ShuttingDown,
    /// The client stopped answering keep-alives.
    KeepAliveTimeout,
    /// The client sent more messages per second than allowed.
    RateLimited,
    /// The connection held nothing and said nothing for the server's
    /// `ws_idle_timeout`.
    Idle,
    /// An adapter's own close code.
    Code(u16),
    /// The app was disabled or removed while the connection was open.
    AppClosed,
}

/// [`Connection::close`]'s word for a connection whose client is gone: not
/// 0, so frames are refused, and no reason ([`Reason::unpack`] gives none).
const GONE: u32 = u32::MAX;

impl Reason {
    fn pack(self) -> u32 {
        match self {
            Reason::SlowConsumer => 1 << 16,
            Reason::Terminated => 2 << 16,
            Reason::ShuttingDown => 3 << 16,
            Reason::KeepAliveTimeout => 4 << 16,
            Reason::RateLimited => 5 << 16,
            Reason::Code(c) => (6 << 16) | c as u32,
            Reason::Idle => 7 << 16,
            Reason::AppClosed => 8 << 16,
        }
    }

    fn unpack(v: u32) -> Option<Reason> {
        Some(match v >> 16 {
            1 => Reason::SlowConsumer,
            2 => Reason::Terminated,
            3 => Reason::ShuttingDown,
            4 => Reason::KeepAliveTimeout,
            5 => Reason::RateLimited,
            6 => Reason::Code(v as u16),
            7 => Reason::Idle,
            8 => Reason::AppClosed,
            _ => return None,
        })
    }
}

struct Queue {
    frames: VecDeque<Frame>,
    /// Bytes queued (u32: bounded by `outbound_bytes` plus bounded bursts;
    /// the queue is part of every connection).
    bytes: u32,
    /// Frames queued past the bound ([`Connection::send_burst`]); boxed,
    /// so a connection that never gets one pays a pointer.
    burst: Option<Box<Burst>>,
    /// The socket, while its session allows direct writes; -1 otherwise.
    fd: i32,
    /// When (by [`now_ms`]) the connection was last written to. Compared
    /// by wrapping difference, so the clock's wrap (every 49.7 days) costs
    /// nothing.
    written_at: u32,
    /// Who is writing to the socket now, if anyone.
    writer: Writer,
    /// The front frame is the rest of a direct write: its start is on the
    /// wire already, so nothing may be written before it.
    partial: bool,
    /// The session's traffic counters, for what direct writes send.
    traffic: Option<Arc<metrics::Traffic>>,
}

/// Who holds the socket's write side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writer {
    Nobody,
    /// The session took frames (or claimed the socket for a pong) and has
    /// not finished writing them.
    Session,
    /// A sender put a direct write in a batch ([`Connection::begin_direct`])
    /// and has not yet seen its result; short (no await in between).
    Batch,
}

impl Default for Queue {
    fn default() -> Queue {
        Queue {
            frames: VecDeque::new(),
            bytes: 0,
            burst: None,
            fd: -1,
            // Quiet from the start.
            written_at: now_ms().wrapping_sub(BUSY_MS),
            writer: Writer::Nobody,
            partial: false,
            traffic: None,
        }
    }
}

/// [`BUSY_WINDOW`] in [`now_ms`] units.
const BUSY_MS: u32 = BUSY_WINDOW.as_millis() as u32;

/// One non-blocking `sendmsg` of `frame`'s parts. Returns the bytes
/// written, or a negative number if none could be (a full buffer, or a
/// broken socket the session will find on its own).
fn send_now(fd: i32, frame: &Frame) -> isize {
    let [head, body] = frame.parts();
    if head.is_empty() {
        // SAFETY: as below; one buffer needs no message header.
        return unsafe {
            libc::send(
                fd,
                body.as_ptr() as *const libc::c_void,
                body.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
    }
    let iov = [
        libc::iovec {
            iov_base: head.as_ptr() as *mut libc::c_void,
            iov_len: head.len(),
        },
        libc::iovec {
            iov_base: body.as_ptr() as *mut libc::c_void,
            iov_len: body.len(),
        },
    ];
    // SAFETY: `msghdr` is plain data, zero is a valid value of each field;
    // the iovecs point into `frame`, which outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `fd` is the session's open socket: the session detaches it
    // under the queue's lock (held by our caller) before closing it.
    unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) }
}

/// The account of burst frames still queued. Sequence numbers count frames
/// from the front of the queue as it was when the burst began, so taking
/// `n` frames from the front retires exactly the burst frames among them.
/// Its bytes also count in the node's account ([`ANSWERS`]) while they
/// wait, and leave it when taken or when the connection goes.
#[derive(Default)]
struct Burst {
    /// (sequence number, length) of each burst frame, oldest first.
    frames: VecDeque<(u64, usize)>,
    bytes: usize,
    pushed: u64,
    taken: u64,
}

impl Drop for Burst {
    fn drop(&mut self) {
        if self.bytes > 0 {
            ANSWERS.release(self.bytes);
        }
    }
}

impl Queue {
    /// Frames and bytes that count against the normal bound.
    fn normal(&self) -> (usize, usize) {
        match &self.burst {
            Some(b) => (
                self.frames.len() - b.frames.len(),
                self.bytes as usize - b.bytes,
            ),
            None => (self.frames.len(), self.bytes as usize),
        }
    }

    fn push(&mut self, frame: Frame) {
        self.bytes = self.bytes.saturating_add(frame.len() as u32);
        self.frames.push_back(frame);
        if let Some(b) = &mut self.burst {
            b.pushed += 1;
        }
    }

    /// Put what a direct write could not send before everything queued
    /// meanwhile (past the bounds: it was sent before them).
    fn push_front(&mut self, frame: Frame) {
        self.bytes = self.bytes.saturating_add(frame.len() as u32);
        self.frames.push_front(frame);
        if let Some(b) = &mut self.burst {
            // One more frame ahead of the burst's: its numbers move up.
            b.pushed += 1;
            for f in &mut b.frames {
                f.0 += 1;
            }
        }
    }

    /// The connection was just written to: busy for [`BUSY_WINDOW`].
    fn mark_written(&mut self) {
        self.written_at = now_ms();
    }

    /// Take the rest of a cut direct write off the front, if it is there.
    fn take_partial(&mut self) -> Option<Frame> {
        if !std::mem::take(&mut self.partial) {
            return None;
        }
        let f = self.frames.pop_front()?;
        self.bytes = self.bytes.saturating_sub(f.len() as u32);
        if let Some(b) = &mut self.burst {
            // Sequence numbers count from the front: one fewer before them.
            b.taken += 1;
        }
        Some(f)
    }

    /// Whether it was written to within [`BUSY_WINDOW`].
    fn busy(&self) -> bool {
        now_ms().wrapping_sub(self.written_at) < BUSY_MS
    }

    /// Whether a frame may be written to the socket directly now: a
    /// socket attached, nothing queued before it, nobody writing, and the
    /// connection quiet unless the node delivers too few frames for its
    /// session to coalesce them (`coalesce_from`, see
    /// [`Connection::attach`] and [`crate::load`]).
    fn direct_now(&self, coalesce_from: u32) -> bool {
        if self.fd < 0 || !self.frames.is_empty() || self.writer != Writer::Nobody {
            return false;
        }
        if coalesce_from == u32::MAX {
            return true;
        }
        // One clock read for both (this runs for every delivery).
        let now = now_ms();
        now.wrapping_sub(self.written_at) >= BUSY_MS
            || !crate::load::coalescing_at(coalesce_from, now)
    }
}

pub struct Connection {
    pub id: ConnId,
    /// The protocol's public id for this socket (Pusher: "123.456").
    pub socket_id: Box<str>,
    /// The wire format of this connection's frames.
    pub wire: &'static dyn Wire,
    queue: Mutex<Queue>,
    /// The queue's bound in frames and bytes ([`QueueLimit`], kept in
    /// u32s: this handle is part of every connection).
    limit: (u32, u32),
    waker: AtomicWaker,
    /// 0 while open; otherwise the packed [`Reason`] asked for (first wins).
    close: AtomicU32,
    /// The node's delivery rate from which a busy connection's frames
    /// wait for its session, to share a write, instead of going out
    /// directly ([`Connection::attach`]). Beside `close`, in what was its
    /// padding.
    coalesce_from: AtomicU32,
    /// permessage-deflate was negotiated: publications go compressed
    /// ([`crate::deflate`]). Set by the session when it starts.
    deflate: std::sync::atomic::AtomicBool,
    /// Reliable streams: set once for connections whose
    /// protocol resumes streams; fan-out consults it for positioned
    /// publications only.
    gate: std::sync::OnceLock<Box<gate::Gate>>,
}

impl Connection {
    pub fn new(
        id: ConnId,
        socket_id: String,
        wire: &'static dyn Wire,
        limit: QueueLimit,
    ) -> Connection {
        Connection {
            id,
            socket_id: socket_id.into_boxed_str(),
            wire,
            queue: Mutex::new(Queue::default()),
            limit: (
                limit.frames.min(u32::MAX as usize) as u32,
                limit.bytes.min(u32::MAX as usize) as u32,
            ),
            waker: AtomicWaker::new(),
            close: AtomicU32::new(0),
            coalesce_from: AtomicU32::new(u32::MAX),
            deflate: std::sync::atomic::AtomicBool::new(false),
            gate: std::sync::OnceLock::new(),
        }
    }

    /// Whether this connection negotiated permessage-deflate.
    pub fn deflate(&self) -> bool {
        self.deflate.load(Ordering::Relaxed)
    }

    /// Mark this connection as having negotiated permessage-deflate (its
    /// session does, from its socket).
    pub fn set_deflate(&self, on: bool) {
        self.deflate.store(on, Ordering::Relaxed);
    }

    /// This connection's history gate, if it has one.
    pub fn gate(&self) -> Option<&gate::Gate> {
        self.gate.get().map(|g| &**g)
    }

    /// Give this connection a history gate (once; later calls return it).
    pub fn with_gate(&self) -> &gate::Gate {
        self.gate.get_or_init(Box::default)
    }

    /// Queue a frame without waiting. A full queue (in frames or bytes)
    /// closes the connection as too slow; returns whether it was queued.
    /// A connection asked to close takes nothing more: the client must see
    /// the close reason right after what was queued before it, not after
    /// frames published since (and they would be wasted work anyway).
    pub fn send(&self, frame: Frame) -> bool {
        if self.close.load(Ordering::Acquire) != 0 {
            return false;
        }
        let len = frame.len();
        let was_empty = {
            let mut q = self.queue.lock();
            let (frames, bytes) = q.normal();
            if frames >= self.limit.0 as usize || bytes + len > self.limit.1 as usize {
                drop(q);
                self.too_slow();
                return false;
            }
            if q.direct_now(self.coalesce_from.load(Ordering::Relaxed)) {
                let n = send_now(q.fd, &frame);
                return self.sent_direct(q, frame, n);
            }
            q.push(frame);
            q.frames.len() == 1
        };
        if was_empty {
            self.waker.wake();
        }
        true
    }

    /// The outcome of a direct write of `frame` that wrote `n` bytes (or
    /// none, negative): the rest, if any, waits at the queue's front for
    /// the session, which is woken for it and for anything queued
    /// meanwhile. Takes the queue's guard and releases it.
    fn sent_direct(
        &self,
        mut q: parking_lot::MutexGuard<'_, Queue>,
        frame: Frame,
        n: isize,
    ) -> bool {
        q.writer = Writer::Nobody;
        let len = frame.len();
        if n as usize == len && n > 0 {
            q.mark_written();
            let wake = !q.frames.is_empty();
            let traffic = q.traffic.clone();
            drop(q);
            metrics::count(&metrics::SOCKET_WRITES);
            metrics::count(&metrics::DIRECT_WRITES);
            if let Some(t) = traffic {
                t.sent(1, len);
            }
            if wake {
                self.waker.wake();
            }
            return true;
        }
        let rest = if n > 0 {
            metrics::count(&metrics::DIRECT_WRITES_CUT);
            q.partial = true;
            q.mark_written();
            frame.after(n as usize)
        } else {
            frame
        };
        q.push_front(rest);
        drop(q);
        self.waker.wake();
        true
    }

    /// For a sender batching direct writes (the fan-out's io_uring): if
    /// this connection may be written to directly now, reserve its socket
    /// and return the descriptor; the sender must then report the result
    /// with [`Connection::end_direct`] before it waits on anything. `None`:
    /// use [`Connection::send`].
    pub fn begin_direct(&self) -> Option<i32> {
        if self.close.load(Ordering::Acquire) != 0 {
            return None;
        }
        let mut q = self.queue.lock();
        if !q.direct_now(self.coalesce_from.load(Ordering::Relaxed)) {
            return None;
        }
        q.writer = Writer::Batch;
        Some(q.fd)
    }

    /// The result of a batched direct write begun with
    /// [`Connection::begin_direct`]: `n` bytes of `frame` written, or none
    /// (negative).
    pub fn end_direct(&self, frame: Frame, n: isize) {
        let q = self.queue.lock();
        self.sent_direct(q, frame, n);
    }

    /// A batched direct write whose fate is unknown (its ring failed):
    /// the stream may be cut mid-frame, so the connection closes.
    pub fn abandon_direct(&self) {
        self.queue.lock().writer = Writer::Nobody;
        self.close(Reason::ShuttingDown);
    }

    /// The queue's guard once no batched direct write is in flight (they
    /// last microseconds: a sender never waits between begin and end).
    fn settled(&self) -> parking_lot::MutexGuard<'_, Queue> {
        loop {
            let q = self.queue.lock();
            if q.writer != Writer::Batch {
                return q;
            }
            drop(q);
            std::thread::yield_now();
        }
    }

    /// Let frames be written to socket `fd` directly (see the module's
    /// doc): whenever possible while the node delivers fewer than
    /// `coalesce_from` frames a second ([`crate::load::coalescing`]: 0
    /// always coalesces, `u32::MAX` never), and past that only while the
    /// connection is quiet, its session coalescing a busy one's frames.
    /// `traffic` counts what they send.
    pub fn attach(&self, fd: i32, coalesce_from: u32, traffic: Arc<metrics::Traffic>) {
        self.coalesce_from.store(coalesce_from, Ordering::Relaxed);
        let mut q = self.queue.lock();
        q.fd = fd;
        q.traffic = Some(traffic);
    }

    /// No more direct writes (the socket is about to close); returns what
    /// a direct write left unfinished, which must go out before anything
    /// else is written.
    pub fn detach(&self) -> Option<Frame> {
        let mut q = self.settled();
        q.fd = -1;
        q.traffic = None;
        q.take_partial()
    }

    /// The session writes on its own (a pong): no direct write until
    /// [`Connection::written`]; returns what a direct write left
    /// unfinished, to be written first.
    pub fn claim(&self) -> Option<Frame> {
        let mut q = self.settled();
        q.writer = Writer::Session;
        q.take_partial()
    }

    /// The session finished writing what it took (or claimed): direct
    /// writes may resume, and the connection counts as busy for a while.
    pub fn written(&self) {
        let mut q = self.queue.lock();
        q.writer = Writer::Nobody;
        q.mark_written();
    }

    /// Whether the connection was written to within [`BUSY_WINDOW`].
    pub fn busy(&self) -> bool {
        self.queue.lock().busy()
    }

    /// Queue a frame of a bounded answer past the queue's bound (see the
    /// module's doc): up to `most` bytes of such frames may wait at once,
    /// and they take none of the normal room. Past `most` it is an
    /// ordinary [`Connection::send`]. Returns whether it was queued.
    pub fn send_burst(&self, frame: Frame, most: usize) -> bool {
        if self.close.load(Ordering::Acquire) != 0 {
            return false;
        }
        let len = frame.len();
        let was_empty = {
            let mut q = self.queue.lock();
            if q.burst.as_ref().map_or(0, |b| b.bytes) + len > most {
                drop(q);
                return self.send(frame);
            }
            let front = q.frames.len() as u64;
            let b = q.burst.get_or_insert_with(|| {
                let mut b = Box::<Burst>::default();
                b.pushed = front;
                b
            });
            b.frames.push_back((b.pushed, len));
            b.bytes += len;
            ANSWERS.charge(len);
            q.push(frame);
            q.frames.len() == 1
        };
        if was_empty {
            self.waker.wake();
        }
        true
    }

    /// Bytes of burst frames still waiting for the writer.
    pub fn burst_bytes(&self) -> usize {
        self.queue.lock().burst.as_ref().map_or(0, |b| b.bytes)
    }

    /// Whether burst frames wait for the writer: the session then writes
    /// before it handles the client's next message (see `session::run`).
    pub fn bursting(&self) -> bool {
        self.queue.lock().burst.is_some()
    }

    /// Move up to `max` queued frames into `out` (the writer's batch).
    pub fn take(&self, out: &mut Vec<Frame>, max: usize) {
        let mut guard = self.queue.lock();
        let q = &mut *guard;
        // A batched direct write in flight: its sender wakes the session
        // when it ends (see `poll_ready`).
        let n = if q.writer == Writer::Batch {
            0
        } else {
            q.frames.len().min(max)
        };
        if n > 0 {
            q.writer = Writer::Session;
            q.partial = false;
        }
        for f in q.frames.drain(..n) {
            q.bytes = q.bytes.saturating_sub(f.len() as u32);
            out.push(f);
        }
        if let Some(b) = &mut q.burst {
            b.taken += n as u64;
            let before = b.bytes;
            while let Some(&(seq, len)) = b.frames.front() {
                if seq >= b.taken {
                    break;
                }
                b.frames.pop_front();
                b.bytes -= len;
            }
            if b.bytes < before {
                ANSWERS.release(before - b.bytes);
            }
            if b.frames.is_empty() {
                q.burst = None;
            }
        }
        if q.frames.is_empty() && q.frames.capacity() > 0 {
            // An idle connection keeps no queue memory.
            q.frames = VecDeque::new();
        }
    }

    /// Whether frames are waiting; registers the session's waker first so a
    /// frame queued right after is not missed.
    pub fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.waker.register(cx.waker());
        if self.close.load(Ordering::Acquire) != 0 || {
            let q = self.queue.lock();
            !q.frames.is_empty() && q.writer != Writer::Batch
        } {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Ready once somebody asked this connection to close (registers the
    /// session's waker first, like [`Connection::poll_ready`]).
    pub fn poll_close(&self, cx: &mut Context<'_>) -> Poll<Reason> {
        self.waker.register(cx.waker());
        match self.close_requested() {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }

    fn too_slow(&self) {
        if self.close.load(Ordering::Acquire) == 0 {
            metrics::count(&metrics::SLOW_CLIENTS_CLOSED);
        }
        self.close(Reason::SlowConsumer);
    }

    /// Ask the session to close for `reason`. Only the first request counts.
    pub fn close(&self, reason: Reason) {
        if self
            .close
            .compare_exchange(0, reason.pack(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.waker.wake();
        }
    }

    /// The close somebody asked for, if any.
    pub fn close_requested(&self) -> Option<Reason> {
        Reason::unpack(self.close.load(Ordering::Acquire))
    }

    /// The client is gone and its session's teardown waits in the node's
    /// [`Reaper`](crate::reaper::Reaper): frames are refused from now on
    /// (see [`Connection::send`]), and a close asked for later is moot.
    /// Not a [`Reason`]: nobody is left to be told one.
    pub fn gone(&self) {
        self.close.store(GONE, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestWire;
    use std::time::Instant;

    fn frame(n: usize) -> Frame {
        Frame::text(&"x".repeat(n))
    }

    fn conn(frames: usize, bytes: usize) -> Connection {
        Connection::new(1, "1.1".into(), &TestWire, QueueLimit { frames, bytes })
    }

    #[test]
    fn queue_is_bounded_in_bytes() {
        let c = conn(16, 100);
        assert!(c.send(frame(60)));
        assert!(!c.send(frame(60)), "over the 100-byte bound");
        assert_eq!(c.close_requested(), Some(Reason::SlowConsumer));
        // Taken frames free room, but a closing connection takes nothing.
        let mut out = Vec::new();
        c.take(&mut out, 64);
        assert_eq!(out.len(), 1);
        assert!(!c.send(frame(10)));
    }

    #[test]
    fn taken_bytes_free_room() {
        let c = conn(16, 100);
        assert!(c.send(frame(60)));
        c.take(&mut Vec::new(), 64);
        assert!(c.send(frame(90)), "the writer took the first frame");
    }

    #[test]
    fn queue_is_bounded_in_frames() {
        let c = conn(2, 1 << 20);
        assert!(c.send(frame(1)));
        assert!(c.send(frame(1)));
        assert!(!c.send(frame(1)));
        assert_eq!(c.close_requested(), Some(Reason::SlowConsumer));
    }

    #[test]
    fn a_burst_takes_none_of_the_normal_room_until_it_is_written() {
        let c = conn(2, 100);
        assert!(c.send(frame(10)));
        for _ in 0..5 {
            assert!(c.send_burst(frame(30), 200));
        }
        assert_eq!(c.burst_bytes(), 5 * frame(30).len());
        // The live frames still have their room: one more fits, not two.
        assert!(c.send(frame(10)));
        // Taking the live frame and two of the burst frees exactly those.
        let mut out = Vec::new();
        c.take(&mut out, 3);
        assert_eq!(c.burst_bytes(), 3 * frame(30).len());
        assert!(c.send(frame(10)));
        assert!(!c.send(frame(10)), "the normal room is two frames");
        assert_eq!(c.close_requested(), Some(Reason::SlowConsumer));
    }

    #[test]
    fn a_burst_past_its_bound_is_an_ordinary_send() {
        let c = conn(1, 1000);
        assert!(c.send_burst(frame(50), 60));
        assert!(c.send_burst(frame(50), 60), "over `most`: the normal room");
        assert!(!c.send_burst(frame(50), 60), "and that room is one frame");
        assert_eq!(c.close_requested(), Some(Reason::SlowConsumer));
        c.take(&mut Vec::new(), 10);
        assert_eq!(c.burst_bytes(), 0);
    }

    #[test]
    fn first_close_reason_wins() {
        let c = conn(2, 100);
        c.close(Reason::Code(4009));
        c.close(Reason::ShuttingDown);
        assert_eq!(c.close_requested(), Some(Reason::Code(4009)));
    }

    // ----- direct writes, over a socket pair ----------------------------

    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    /// A connection attached to one end of a socket pair, its busy frames
    /// coalesced from `coalesce_from` frames a second (see `attach`).
    fn attached(coalesce_from: u32) -> (Connection, UnixStream, UnixStream) {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        ours.set_nonblocking(true).unwrap();
        theirs.set_nonblocking(true).unwrap();
        let c = conn(1000, 64 << 20);
        c.attach(
            ours.as_raw_fd(),
            coalesce_from,
            metrics::traffic("t", "test"),
        );
        (c, ours, theirs)
    }

    fn read_all(s: &mut UnixStream) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        got
    }

    fn bytes(f: &Frame) -> Vec<u8> {
        f.parts().iter().flat_map(|b| b.iter().copied()).collect()
    }

    #[test]
    fn a_quiet_connection_is_written_directly_and_a_busy_one_queues() {
        // Coalescing at any rate (`write_delay_min_rate = 0`).
        let (c, _ours, mut theirs) = attached(0);
        let first = frame(10);
        let at = Instant::now();
        assert!(c.send(first.clone()));
        assert_eq!(read_all(&mut theirs), bytes(&first), "written at once");
        // Busy for the window after a write: the next frame waits for the
        // session, to share a write. (A machine that stalled this thread
        // past the window sees the quiet case again instead.)
        let second = frame(20);
        assert!(c.send(second.clone()));
        let within = at.elapsed() < BUSY_WINDOW;
        let mut out = Vec::new();
        c.take(&mut out, 64);
        let written = read_all(&mut theirs);
        if within {
            assert!(written.is_empty());
            assert_eq!(out, vec![second]);
        } else {
            // Either way, exactly once.
            assert!(
                out == vec![second.clone()] && written.is_empty()
                    || out.is_empty() && written == bytes(&second)
            );
        }
    }

    /// Below the rate from which busy connections coalesce, a busy
    /// connection is written directly too: nothing waits for company
    /// where company is not coming.
    #[test]
    fn below_the_coalescing_rate_a_busy_connection_is_written_directly() {
        // A rate no node delivers (the process's fan-out counts for every
        // test in it; this one must not depend on the others).
        let (c, _ours, mut theirs) = attached(1_000_000_000);
        let first = frame(10);
        assert!(c.send(first.clone()));
        assert_eq!(read_all(&mut theirs), bytes(&first), "written at once");
        let second = frame(20);
        assert!(c.send(second.clone()));
        assert!(c.busy(), "written to just now");
        assert_eq!(
            read_all(&mut theirs),
            bytes(&second),
            "busy, and still at once"
        );
        let mut out = Vec::new();
        c.take(&mut out, 64);
        assert!(out.is_empty(), "nothing left for the session");
    }

    #[test]
    fn a_cut_write_leaves_its_rest_first_and_nothing_passes_it() {
        let (c, _ours, mut theirs) = attached(u32::MAX);
        // Far more than a socket pair's buffer: the write is cut.
        let big = frame(4 << 20);
        assert!(c.send(big.clone()));
        let head = read_all(&mut theirs);
        assert!(!head.is_empty() && head.len() < big.len(), "{}", head.len());
        // Queued behind the rest, not written past it.
        let small = frame(5);
        assert!(c.send(small.clone()));
        // The session's own write (a pong) gets the rest first.
        let rest = c.claim().expect("the cut frame's rest");
        assert_eq!([head, bytes(&rest)].concat(), bytes(&big));
        c.written();
        let mut out = Vec::new();
        c.take(&mut out, 64);
        assert_eq!(out, vec![small]);
        c.written();
        assert!(c.detach().is_none());
    }

    #[test]
    fn a_batched_write_holds_the_socket_until_its_result() {
        let (c, _ours, mut theirs) = attached(u32::MAX);
        let fd = c.begin_direct().expect("quiet and attached");
        assert!(c.begin_direct().is_none(), "reserved once");
        // Meanwhile frames queue, and the session neither sees nor takes
        // them until the batch's result is in.
        let queued = frame(7);
        assert!(c.send(queued.clone()));
        let mut out = Vec::new();
        c.take(&mut out, 64);
        assert!(out.is_empty());
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(c.poll_ready(&mut cx).is_pending());
        // The batch sent half its frame.
        let sent = frame(30);
        let all = bytes(&sent);
        // SAFETY: a valid buffer on our own socket.
        let n = unsafe { libc::send(fd, all.as_ptr().cast(), 10, 0) };
        assert_eq!(n, 10);
        c.end_direct(sent, n);
        assert!(c.poll_ready(&mut cx).is_ready());
        c.take(&mut out, 64);
        assert_eq!(out.len(), 2);
        assert_eq!(bytes(&out[0]), all[10..], "the rest first");
        assert_eq!(out[1], queued);
        assert_eq!(read_all(&mut theirs), all[..10]);
    }
}
