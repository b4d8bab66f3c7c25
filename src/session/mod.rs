//! Sessions: the task that owns one client socket. It reads client frames
//! and hands them to the protocol's handler, and it is the connection
//! writer: it drains the connection's bounded queue and writes frames in
//! batches (one flush, usually one syscall, for everything queued).
//!
//! One task per connection, not two: a mostly idle connection then costs
//! one small future, and reading, writing, timers and close requests are
//! all decided in one `select!` without locks.

pub mod pusher;

use crate::connection::Connection;
use crate::fanout::Frame;
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::SinkExt;
use std::time::Duration;
use tokio::sync::mpsc;

/// Most frames written before one flush.
const MAX_BATCH: usize = 64;

/// How long one batch may take to reach the socket before the client is
/// considered stuck and dropped. Without it a client that stops reading
/// would pin its session (and its queue) forever.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Write `first` and whatever else is queued, then flush: one batch.
///
/// With a non-zero `delay` (the server's `write_delay_ms`) the writer
/// waits `delay` after `first` arrived and then writes it with everything
/// queued meanwhile (up to a full batch) in one flush, so frames that come
/// close together share a write.
///
/// Why: on loopback and in VMs a small `write` costs several microseconds of
/// kernel time however little it carries (bench/RESULTS.md measures ~8 µs
/// here), so at high fan-out rates the number of writes, not the bytes, is
/// what costs CPU, on the server and on every client. Waiting after the
/// first frame, rather than only pacing writes to at most one per `delay`,
/// is what actually gathers frames: under load the writers already batch
/// naturally, and a pace of a few milliseconds rarely binds (measured in
/// bench/RESULTS.md). The price is up to `delay` on every message, which
/// is why it is off by default.
pub async fn write_batch(
    socket: &mut WebSocket,
    conn: &Connection,
    first: Frame,
    rx: &mut mpsc::Receiver<Frame>,
    delay: Duration,
) -> Result<(), ()> {
    let work = async {
        if !delay.is_zero() {
            // Sleep, then take what came: waiting on the queue instead would
            // wake this task once per arriving frame.
            tokio::time::sleep(delay).await;
        }
        conn.dequeued(&first);
        socket.feed(Message::Text(first)).await?;
        for _ in 1..MAX_BATCH {
            let Ok(frame) = rx.try_recv() else { break };
            conn.dequeued(&frame);
            socket.feed(Message::Text(frame)).await?;
        }
        crate::metrics::count(&crate::metrics::SOCKET_WRITES);
        socket.flush().await
    };
    match tokio::time::timeout(WRITE_TIMEOUT, work).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}

/// How long to wait for the client's answer to our close frame.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Send a last text frame (if any) and a close frame, ignoring errors: the
/// peer may already be gone.
pub async fn close(socket: &mut WebSocket, last: Option<String>, code: u16, reason: &str) {
    let work = async {
        if let Some(text) = last {
            let _ = socket.feed(Message::Text(text.into())).await;
        }
        socket
            .send(Message::Close(Some(CloseFrame {
                code,
                reason: reason.into(),
            })))
            .await
    };
    let sent = matches!(tokio::time::timeout(WRITE_TIMEOUT, work).await, Ok(Ok(())));
    // After bad framing (1002) or an oversized message (1009) the stream
    // may stop mid-frame: nothing more can be read from it.
    if !sent || matches!(code, 1002 | 1009) {
        return;
    }
    // Finish the closing handshake (RFC 6455 7.1.1): wait, bounded, for
    // the client's close frame, discarding what it sent meanwhile, so the
    // TCP connection ends after the client has read our close. Dropping it
    // at once can reset the connection and lose the close code. A session
    // is counted until this returns, so a shutdown drain waits for it.
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        while let Some(Ok(msg)) = socket.recv().await {
            if matches!(msg, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}

/// The client closed first: send the close frame tungstenite queued in
/// answer (RFC 6455 5.5.1); without it the client sees an abnormal
/// closure (1006) instead of its own code.
pub async fn answer_close(socket: &mut WebSocket) {
    let _ = tokio::time::timeout(WRITE_TIMEOUT, socket.flush()).await;
}

/// A fixed-window counter: at most `limit` events per second.
pub struct RateWindow {
    start: tokio::time::Instant,
    count: u32,
}

impl RateWindow {
    pub fn new() -> RateWindow {
        RateWindow {
            start: tokio::time::Instant::now(),
            count: 0,
        }
    }

    /// Count one event; false when it exceeds `limit` in the current second.
    pub fn allow(&mut self, limit: u32) -> bool {
        let now = tokio::time::Instant::now();
        if now.duration_since(self.start) >= Duration::from_secs(1) {
            self.start = now;
            self.count = 0;
        }
        self.count += 1;
        self.count <= limit
    }
}

impl Default for RateWindow {
    fn default() -> Self {
        RateWindow::new()
    }
}
