//! The session loop: one task per client socket, the same for every
//! protocol. It reads and decodes client frames and hands messages to the
//! protocol's [`Handler`]; it keeps the connection alive the protocol's way;
//! it is the connection's writer (drains the bounded queue, several frames
//! per vectored write); and it closes: slow consumers, rate limits, broken
//! frames, shutdown, with the close handshake. An adapter writes only its
//! message handling.
//!
//! One task per connection, not two: a mostly idle connection then costs
//! one small future, and reading, writing, timers and close requests are
//! decided in one poll without locks. Reads go through one scratch buffer
//! per thread, so an idle connection holds no read buffer (see [`crate::ws`]).

use crate::connection::{Connection, Reason};
use crate::frame::{Frame, OpCode};
use crate::metrics;
use crate::ws::{Decoder, Incoming, WsError};
use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Most frames written in one batch.
const MAX_BATCH: usize = 64;

/// How long one batch may take to reach the socket before the client is
/// considered stuck and dropped. Without it a client that stops reading
/// would pin its session (and its queue) forever.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long to wait for the client's answer to our close frame.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Bytes of the per-thread read buffer.
const SCRATCH: usize = 16 * 1024;

thread_local! {
    static SCRATCH_BUF: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; SCRATCH].into_boxed_slice());
}

/// How a protocol keeps its connections alive.
#[derive(Debug, Clone, Copy)]
pub enum KeepAlive {
    /// After `idle` without client traffic, send the keep-alive frame; if
    /// the client stays silent for `wait` more, close with
    /// [`Reason::KeepAliveTimeout`] (Pusher).
    WhenIdle { idle: Duration, wait: Duration },
    /// Send the keep-alive frame every `every`, whatever the traffic
    /// (Action Cable's pings, AppSync's `ka`).
    Every(Duration),
}

/// Why a session ends, for the handler to put in its protocol's words.
#[derive(Debug, Clone, PartialEq)]
pub enum Why {
    /// Asked for through the connection handle, or decided by the loop.
    Reason(Reason),
    /// The client's bytes broke the WebSocket protocol.
    Protocol(WsError),
    /// The client sent a binary frame to a text protocol.
    Binary,
    /// The handler's own code and message.
    Said(u16, String),
}

/// How to say goodbye: the close code and reason, and optionally a last
/// text frame sent before the close (Pusher's `pusher:error`).
#[derive(Debug, Clone)]
pub struct Closing {
    pub code: u16,
    pub message: String,
    pub last: Option<Frame>,
}

/// What the loop does after a message.
#[derive(Debug)]
pub enum Next {
    Continue,
    Close(Why),
}

/// One protocol's side of a session.
pub trait Handler: Send {
    /// A text message from the client.
    fn on_text(&mut self, text: String) -> impl Future<Output = Next> + Send;
    /// The keep-alive policy and frame.
    fn keepalive(&self) -> KeepAlive;
    fn keepalive_frame(&mut self) -> Option<Frame>;
    /// The close to send for `why`.
    fn closing(&mut self, why: &Why) -> Closing;
    /// The session is over: leave channels, sign out. Runs before the close
    /// handshake, so others hear of the departure without waiting on a
    /// client that may never answer.
    fn on_close(&mut self) -> impl Future<Output = ()> + Send;
}

/// Per-session settings from the app and the server.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Largest client message, in bytes.
    pub max_message: usize,
    /// Client messages per second before the connection is closed.
    pub max_messages_per_second: u32,
    /// See the server's `write_delay_ms`.
    pub write_delay: Duration,
}

/// What woke the loop.
enum Wake {
    Close(Reason),
    Shutdown,
    Read,
    Eof,
    Frames,
    Timer,
}

/// Run a session until it ends. `stream` is the upgraded socket; `conn`
/// the connection's handle, already known to whoever may send to it.
pub async fn run<S, H>(
    mut stream: S,
    conn: Arc<Connection>,
    mut handler: H,
    settings: Settings,
    shutdown: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
    H: Handler,
{
    let mut decoder = Decoder::new(settings.max_message);
    let keepalive = handler.keepalive();
    let mut last_seen = Instant::now();
    let mut ping_sent: Option<Instant> = None;
    let first = match keepalive {
        KeepAlive::WhenIdle { idle, .. } => idle,
        KeepAlive::Every(every) => every,
    };
    let timer = tokio::time::sleep_until(last_seen + first);
    tokio::pin!(timer);
    let cancelled = shutdown.cancelled();
    tokio::pin!(cancelled);
    let mut inbound = RateWindow::new();
    // The handler closed: what it queued before deciding to close goes out
    // before the close (its last answers to the client).
    let mut flush_queued = false;

    let end: Option<Why> = 'session: loop {
        let wake = poll_fn(|cx| {
            if let Some(r) = conn.close_requested() {
                return Poll::Ready(Wake::Close(r));
            }
            if cancelled.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Wake::Shutdown);
            }
            let read = SCRATCH_BUF.with(|b| {
                let mut b = b.borrow_mut();
                let mut rb = ReadBuf::new(&mut b[..]);
                match Pin::new(&mut stream).poll_read(cx, &mut rb) {
                    Poll::Ready(Ok(())) if rb.filled().is_empty() => Some(Wake::Eof),
                    Poll::Ready(Ok(())) => {
                        decoder.feed(rb.filled());
                        Some(Wake::Read)
                    }
                    Poll::Ready(Err(_)) => Some(Wake::Eof),
                    Poll::Pending => None,
                }
            });
            if let Some(w) = read {
                return Poll::Ready(w);
            }
            // After reads: a busy channel must not starve the client's pongs.
            if conn.poll_ready(cx).is_ready() {
                return Poll::Ready(match conn.close_requested() {
                    Some(r) => Wake::Close(r),
                    None => Wake::Frames,
                });
            }
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Wake::Timer);
            }
            Poll::Pending
        })
        .await;

        match wake {
            Wake::Close(r) => break Some(Why::Reason(r)),
            Wake::Shutdown => break Some(Why::Reason(Reason::ShuttingDown)),
            Wake::Eof => break None,
            Wake::Read => {
                while let Some(msg) = decoder.next() {
                    last_seen = Instant::now();
                    ping_sent = None;
                    let msg = match msg {
                        Ok(m) => m,
                        Err(e) => {
                            metrics::count(&metrics::BAD_MESSAGES);
                            break 'session Some(Why::Protocol(e));
                        }
                    };
                    if !inbound.allow(settings.max_messages_per_second) {
                        metrics::count(&metrics::RATE_LIMITED);
                        break 'session Some(Why::Reason(Reason::RateLimited));
                    }
                    let next = match msg {
                        Incoming::Text(text) => handler.on_text(text).await,
                        Incoming::Binary(_) => {
                            metrics::count(&metrics::BAD_MESSAGES);
                            Next::Close(Why::Binary)
                        }
                        Incoming::Ping(payload) => {
                            // Pongs bypass the queue's bounds: they are tiny
                            // and the client is evidently reading.
                            let _ =
                                write_frames(&mut stream, &[Frame::new(OpCode::Pong, &payload)])
                                    .await;
                            Next::Continue
                        }
                        Incoming::Pong => Next::Continue,
                        Incoming::Close(frame) => {
                            // The client closed first: echo its code
                            // (RFC 6455 5.5.1) and end.
                            handler.on_close().await;
                            let echo = match frame {
                                Some(f) if is_sendable(f.code) => Frame::close(f.code, &f.reason),
                                _ => Frame::close(1000, ""),
                            };
                            let _ = write_frames(&mut stream, &[echo]).await;
                            return;
                        }
                    };
                    if let Next::Close(why) = next {
                        flush_queued = true;
                        break 'session Some(why);
                    }
                }
                if conn.close_requested().is_some() {
                    continue;
                }
                // Reset the keep-alive timer to the new deadline.
                if let KeepAlive::WhenIdle { idle, .. } = keepalive {
                    if ping_sent.is_none() {
                        timer.as_mut().reset(last_seen + idle);
                    }
                }
            }
            Wake::Frames => {
                if !settings.write_delay.is_zero() {
                    // Sleep, then take what came: waiting on the queue
                    // instead would wake this task once per frame.
                    tokio::time::sleep(settings.write_delay).await;
                }
                let mut batch = Vec::new();
                conn.take(&mut batch, MAX_BATCH);
                if batch.is_empty() {
                    continue;
                }
                let write = tokio::time::timeout(WRITE_TIMEOUT, write_frames(&mut stream, &batch));
                if !matches!(write.await, Ok(Ok(()))) {
                    break None;
                }
                metrics::count(&metrics::SOCKET_WRITES);
            }
            Wake::Timer => {
                let now = Instant::now();
                match keepalive {
                    KeepAlive::Every(every) => {
                        if let Some(f) = handler.keepalive_frame() {
                            conn.send(f);
                        }
                        timer.as_mut().reset(now + every);
                    }
                    KeepAlive::WhenIdle { idle, wait } => match ping_sent {
                        Some(at) if now >= at + wait => {
                            break Some(Why::Reason(Reason::KeepAliveTimeout));
                        }
                        Some(at) => timer.as_mut().reset(at + wait),
                        None if now >= last_seen + idle => {
                            if let Some(f) = handler.keepalive_frame() {
                                conn.send(f);
                            }
                            ping_sent = Some(now);
                            timer.as_mut().reset(now + wait);
                        }
                        None => timer.as_mut().reset(last_seen + idle),
                    },
                }
            }
        }
    };

    // Leave channels first: the closing handshake may wait on the client.
    handler.on_close().await;
    let Some(why) = end else {
        return;
    };
    let closing = handler.closing(&why);
    let mut last = Vec::with_capacity(2);
    if flush_queued {
        conn.take(&mut last, MAX_BATCH);
    }
    last.extend(closing.last);
    last.push(Frame::close(closing.code, &closing.message));
    let sent = matches!(
        tokio::time::timeout(WRITE_TIMEOUT, write_frames(&mut stream, &last)).await,
        Ok(Ok(()))
    );
    // After broken framing (1002) or an oversized message (1009) the stream
    // may stop mid-frame: nothing more can be read from it.
    if !sent || matches!(closing.code, 1002 | 1009) {
        return;
    }
    // Finish the closing handshake (RFC 6455 7.1.1): wait, bounded, for the
    // client's close frame, discarding what it sends meanwhile, so the TCP
    // connection ends after the client has read our close. Dropping it at
    // once can reset the connection and lose the close code.
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        loop {
            let got = poll_fn(|cx| {
                SCRATCH_BUF.with(|b| {
                    let mut b = b.borrow_mut();
                    let mut rb = ReadBuf::new(&mut b[..]);
                    match Pin::new(&mut stream).poll_read(cx, &mut rb) {
                        Poll::Ready(Ok(())) if rb.filled().is_empty() => Poll::Ready(false),
                        Poll::Ready(Ok(())) => {
                            decoder.feed(rb.filled());
                            Poll::Ready(true)
                        }
                        Poll::Ready(Err(_)) => Poll::Ready(false),
                        Poll::Pending => Poll::Pending,
                    }
                })
            })
            .await;
            if !got {
                return;
            }
            while let Some(m) = decoder.next() {
                if matches!(m, Ok(Incoming::Close(_)) | Err(_)) {
                    return;
                }
            }
        }
    })
    .await;
    let _ = stream.shutdown().await;
}

/// Close codes an endpoint may send (RFC 6455 7.4).
fn is_sendable(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// Write whole frames, as few syscalls as the kernel allows: every part of
/// every frame in one vectored write, continuing after partial writes.
pub async fn write_frames<S: AsyncWrite + Unpin>(
    stream: &mut S,
    frames: &[Frame],
) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = frames
        .iter()
        .flat_map(|f| f.parts())
        .filter(|b| !b.is_empty())
        .map(|b| IoSlice::new(b))
        .collect();
    let mut bufs = &mut slices[..];
    while !bufs.is_empty() {
        let n = stream.write_vectored(bufs).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    stream.flush().await
}

/// A fixed-window counter: at most `limit` events per second.
pub struct RateWindow {
    start: Instant,
    count: u32,
}

impl RateWindow {
    pub fn new() -> RateWindow {
        RateWindow {
            start: Instant::now(),
            count: 0,
        }
    }

    /// Count one event; false when it exceeds `limit` in the current second.
    pub fn allow(&mut self, limit: u32) -> bool {
        let now = Instant::now();
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
