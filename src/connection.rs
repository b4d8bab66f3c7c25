//! The shared handle of one client connection: its identity, its bounded
//! outbound queue, and a way for anyone (hub, API, shutdown) to ask it to
//! close.
//!
//! The handle is deliberately small; everything only the session needs
//! (subscriptions, rate counters, the socket itself) lives in the session
//! task, not here. The queue is bounded twice, in frames and in bytes: a
//! full queue means the client reads slower than we publish, and rather than
//! buffer without bound the connection is closed with the protocol's "over
//! capacity" code and the client reconnects.

use crate::fanout::Frame;
use crate::protocol::pusher::code;
use crate::protocol::Protocol;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use tokio::sync::{mpsc, Notify};

/// Process-unique connection number; the key in every registry.
pub type ConnId = u64;

/// How much may wait in one connection's outbound queue.
#[derive(Debug, Clone, Copy)]
pub struct QueueLimit {
    pub frames: usize,
    pub bytes: usize,
}

pub struct Connection {
    pub id: ConnId,
    /// The protocol's public id for this socket (Pusher: "123.456").
    pub socket_id: Box<str>,
    pub protocol: Protocol,
    tx: mpsc::Sender<Frame>,
    /// Bytes of the frames queued and not yet taken by the writer.
    queued_bytes: AtomicUsize,
    max_bytes: usize,
    close: Notify,
    /// 0 while open; otherwise the close code somebody asked for (first wins).
    close_code: AtomicU16,
}

impl Connection {
    /// A handle and the receiving end of its queue, which the session drains.
    pub fn new(
        id: ConnId,
        socket_id: String,
        protocol: Protocol,
        limit: QueueLimit,
    ) -> (Connection, mpsc::Receiver<Frame>) {
        let (tx, rx) = mpsc::channel(limit.frames);
        let conn = Connection {
            id,
            socket_id: socket_id.into_boxed_str(),
            protocol,
            tx,
            queued_bytes: AtomicUsize::new(0),
            max_bytes: limit.bytes,
            close: Notify::new(),
            close_code: AtomicU16::new(0),
        };
        (conn, rx)
    }

    /// Queue a frame without waiting. A full queue (in frames or bytes)
    /// closes the connection as too slow; returns whether it was queued.
    /// A connection asked to close takes nothing more: the client must see
    /// the close reason right after what was queued before it, not after
    /// frames published since (and they would be wasted work anyway).
    pub fn send(&self, frame: Frame) -> bool {
        if self.close_code.load(Ordering::Acquire) != 0 {
            return false;
        }
        let len = frame.len();
        if self.queued_bytes.fetch_add(len, Ordering::AcqRel) + len > self.max_bytes {
            self.queued_bytes.fetch_sub(len, Ordering::AcqRel);
            self.too_slow();
            return false;
        }
        match self.tx.try_send(frame) {
            Ok(()) => true,
            Err(e) => {
                self.queued_bytes.fetch_sub(len, Ordering::AcqRel);
                if matches!(e, mpsc::error::TrySendError::Full(_)) {
                    self.too_slow();
                }
                false
            }
        }
    }

    /// The writer took `frame` off the queue.
    pub fn dequeued(&self, frame: &Frame) {
        self.queued_bytes.fetch_sub(frame.len(), Ordering::AcqRel);
    }

    fn too_slow(&self) {
        if self.close_code.load(Ordering::Acquire) == 0 {
            crate::metrics::count(&crate::metrics::SLOW_CLIENTS_CLOSED);
        }
        self.close(code::OVER_CAPACITY);
    }

    /// Ask the session to close with `code`. Only the first request counts.
    pub fn close(&self, code: u16) {
        if self
            .close_code
            .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.close.notify_one();
        }
    }

    /// Resolves once somebody asked this connection to close; gives the code.
    pub async fn close_requested(&self) -> u16 {
        loop {
            let c = self.close_code.load(Ordering::Acquire);
            if c != 0 {
                return c;
            }
            self.close.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(n: usize) -> Frame {
        "x".repeat(n).into()
    }

    #[tokio::test]
    async fn queue_is_bounded_in_bytes() {
        let limit = QueueLimit {
            frames: 16,
            bytes: 100,
        };
        let (conn, mut rx) = Connection::new(1, "1.1".into(), Protocol::Pusher, limit);
        assert!(conn.send(frame(60)));
        assert!(!conn.send(frame(60)), "160 bytes exceed the 100-byte bound");
        assert_eq!(conn.close_requested().await, code::OVER_CAPACITY);
        // Bytes taken by the writer free room, but a connection that is
        // closing takes nothing more.
        let f = rx.recv().await.unwrap();
        conn.dequeued(&f);
        assert!(!conn.send(frame(10)));
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn taken_bytes_free_room() {
        let limit = QueueLimit {
            frames: 16,
            bytes: 100,
        };
        let (conn, mut rx) = Connection::new(1, "1.1".into(), Protocol::Pusher, limit);
        assert!(conn.send(frame(60)));
        let f = rx.recv().await.unwrap();
        conn.dequeued(&f);
        assert!(conn.send(frame(90)), "the writer took the first 60 bytes");
    }

    #[tokio::test]
    async fn queue_is_bounded_in_frames() {
        let limit = QueueLimit {
            frames: 2,
            bytes: 1 << 20,
        };
        let (conn, _rx) = Connection::new(1, "1.1".into(), Protocol::Pusher, limit);
        assert!(conn.send(frame(1)));
        assert!(conn.send(frame(1)));
        assert!(!conn.send(frame(1)));
        assert_eq!(conn.close_requested().await, code::OVER_CAPACITY);
    }
}
