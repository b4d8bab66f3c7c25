//! The shared handle of one client connection: its identity, its bounded
//! outbound queue, and a way for anyone (hub, API, shutdown) to ask it to
//! close.
//!
//! The handle is deliberately small; everything only the session needs
//! (subscriptions, rate counters, the socket itself) lives in the session
//! task, not here. A full queue means the client reads slower than we
//! publish: rather than buffer without bound, the connection is closed with
//! the protocol's "over capacity" code and the client reconnects.

use crate::fanout::Frame;
use crate::protocol::pusher::code;
use crate::protocol::Protocol;
use std::sync::atomic::{AtomicU16, Ordering};
use tokio::sync::{mpsc, Notify};

/// Process-unique connection number; the key in every registry.
pub type ConnId = u64;

pub struct Connection {
    pub id: ConnId,
    /// The protocol's public id for this socket (Pusher: "123.456").
    pub socket_id: Box<str>,
    pub protocol: Protocol,
    tx: mpsc::Sender<Frame>,
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
        queue: usize,
    ) -> (Connection, mpsc::Receiver<Frame>) {
        let (tx, rx) = mpsc::channel(queue);
        let conn = Connection {
            id,
            socket_id: socket_id.into_boxed_str(),
            protocol,
            tx,
            close: Notify::new(),
            close_code: AtomicU16::new(0),
        };
        (conn, rx)
    }

    /// Queue a frame without waiting. A full queue closes the connection as
    /// too slow; returns whether the frame was queued.
    pub fn send(&self, frame: Frame) -> bool {
        match self.tx.try_send(frame) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                crate::metrics::count(&crate::metrics::SLOW_CLIENTS_CLOSED);
                self.close(code::OVER_CAPACITY);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
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
