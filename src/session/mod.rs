//! Sessions: the task that owns one client socket. It reads client frames
//! and hands them to the protocol's handler, and it is the connection
//! writer: it drains the connection's bounded queue and writes frames in
//! batches (one flush, usually one syscall, for everything queued).
//!
//! One task per connection, not two: a mostly idle connection then costs
//! one small future, and reading, writing, timers and close requests are
//! all decided in one `select!` without locks.

pub mod pusher;

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

/// Write `first` and whatever else is already queued, then flush.
pub async fn write_batch(
    socket: &mut WebSocket,
    first: Frame,
    rx: &mut mpsc::Receiver<Frame>,
) -> Result<(), ()> {
    let work = async {
        socket.feed(Message::Text(first)).await?;
        for _ in 1..MAX_BATCH {
            match rx.try_recv() {
                Ok(frame) => socket.feed(Message::Text(frame)).await?,
                Err(_) => break,
            }
        }
        socket.flush().await
    };
    match tokio::time::timeout(WRITE_TIMEOUT, work).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}

/// Send a last text frame (if any) and a close frame, ignoring errors: the
/// peer may already be gone.
pub async fn close(socket: &mut WebSocket, last: Option<String>, code: u16, reason: &str) {
    let work = async {
        if let Some(text) = last {
            let _ = socket.feed(Message::Text(text.into())).await;
        }
        let _ = socket
            .send(Message::Close(Some(CloseFrame {
                code,
                reason: reason.into(),
            })))
            .await;
    };
    let _ = tokio::time::timeout(WRITE_TIMEOUT, work).await;
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
