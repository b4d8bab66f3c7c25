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

impl Why {
    /// The `reason` label this end is counted under.
    fn closed(&self) -> metrics::Closed {
        use metrics::Closed;
        match self {
            Why::Reason(Reason::SlowConsumer) => Closed::SlowConsumer,
            Why::Reason(Reason::Terminated | Reason::AppClosed) => Closed::Terminated,
            Why::Reason(Reason::ShuttingDown) => Closed::Shutdown,
            Why::Reason(Reason::KeepAliveTimeout) => Closed::KeepAliveTimeout,
            Why::Reason(Reason::RateLimited) => Closed::RateLimited,
            Why::Reason(Reason::Idle) => Closed::IdleTimeout,
            Why::Reason(Reason::Code(_)) | Why::Said(..) => Closed::Adapter,
            Why::Protocol(_) | Why::Binary => Closed::ProtocolError,
        }
    }
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
    /// client that may never answer; may run more than once (it must be
    /// idempotent): also as soon as a close is asked for mid-write.
    fn on_close(&mut self) -> impl Future<Output = ()> + Send;
    /// The id of the app this session belongs to: the `app` label of its
    /// connection and message metrics.
    fn app_id(&self) -> &str {
        ""
    }
    /// Whether the connection holds nothing (no subscription) that a
    /// silent client could be waiting on. Asked only when the loop's
    /// timer fires; a session idle and silent for
    /// [`Settings::idle_timeout`] is closed with [`Reason::Idle`]. The
    /// default, never idle, is for protocols whose clients may keep an
    /// empty socket (their keep-alives decide).
    fn idle(&self) -> bool {
        false
    }
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
    /// See the server's `write_delay_busy_only`.
    pub write_delay_busy_only: bool,
    /// See the server's `write_delay_min_rate`.
    pub write_delay_min_rate: u32,
    /// See the server's `direct_writes`.
    pub direct_writes: bool,
    /// How long a session whose handler is [`Handler::idle`] may stay
    /// without a client message (the server's `ws_idle_timeout`).
    pub idle_timeout: Duration,
    /// Where the session's teardown goes when its client has gone away.
    pub reaper: crate::reaper::Reaper,
    /// The node's shutdown signal: the session's own (its app's) also
    /// fires when the app is closed, and this tells the two apart.
    pub draining: CancellationToken,
}

impl Settings {
    /// The settings of a session of `app` on `node`.
    pub fn new(node: &crate::node::Node, app: &crate::config::AppConfig) -> Settings {
        let config = &node.config;
        Settings {
            max_message: app.max_frame_size,
            max_messages_per_second: app.max_messages_per_second,
            write_delay: config.write_delay(),
            write_delay_busy_only: config.write_delay_busy_only,
            write_delay_min_rate: config.write_delay_min_rate,
            direct_writes: config.direct_writes,
            idle_timeout: config.ws_idle_timeout(),
            reaper: node.reaper.clone(),
            draining: node.shutdown.clone(),
        }
    }
}

/// What every protocol's session starts from.
pub struct Opened {
    pub conn: Arc<Connection>,
    pub settings: Settings,
    pub shutdown: CancellationToken,
}

/// Open a session's connection on `hub`'s app: its queue bounded by the
/// app's `outbound_queue` and `outbound_bytes`, the loop's [`Settings`]
/// from the server's and the app's, and the node's shutdown signal. Every
/// adapter's session starts here, so a limit added to the app's settings
/// reaches every protocol.
pub fn open(
    node: &crate::node::Node,
    hub: &crate::hub::Hub,
    id: crate::publication::ConnId,
    socket_id: String,
    wire: &'static dyn crate::publication::Wire,
) -> Opened {
    let app = hub.config();
    let limit = crate::connection::QueueLimit {
        frames: app.outbound_queue,
        bytes: app.outbound_bytes,
    };
    Opened {
        conn: Arc::new(Connection::new(id, socket_id, wire, limit)),
        settings: Settings::new(node, &app),
        // The app's signal: fires on the node's shutdown, and when the
        // app is disabled or removed.
        shutdown: app.closing.clone(),
    }
}

/// A connection written to within this long counts as busy (see
/// [`Settings::write_delay_busy_only`]).
pub use crate::connection::BUSY_WINDOW;

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
///
/// This future is what an idle connection costs, so it is kept small: not
/// an `async fn` (whose arguments the compiler stores twice, as arguments
/// and again as the body's locals), and every await off the idle path
/// (a pong, the close, a write) boxed so its state is not part of every
/// connection's task.
pub fn run<S, H>(
    mut stream: S,
    conn: Arc<Connection>,
    mut handler: H,
    settings: Settings,
    shutdown: CancellationToken,
) -> impl Future<Output = ()> + Send
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Handler + 'static,
{
    // Made out here, so the block keeps the decoder but not its setting.
    // permessage-deflate, if the upgrade negotiated it: client messages
    // inflated, publications sent compressed (see `deflate`).
    let deflate = (&stream as &dyn std::any::Any)
        .downcast_ref::<crate::ws::Socket>()
        .is_some_and(crate::ws::Socket::deflate);
    if deflate {
        conn.set_deflate(true);
        metrics::count(&metrics::DEFLATE_CONNECTIONS);
    }
    let mut decoder = Decoder::new(settings.max_message).inflating(deflate);
    async move {
        let keepalive = handler.keepalive();
        let mut last_seen = Instant::now();
        let mut ping_sent: Option<Instant> = None;
        let first = match keepalive {
            KeepAlive::WhenIdle { idle, .. } => idle,
            KeepAlive::Every(every) => every,
        };
        // When the next clock keep-alive is due (`KeepAlive::Every`): the timer
        // also fires for the idle check, which must not send one early.
        let mut next_keepalive = last_seen + first;
        let idle_check = handler.idle();
        let timer = tokio::time::sleep_until(if idle_check {
            next_keepalive.min(last_seen + settings.idle_timeout)
        } else {
            next_keepalive
        });
        tokio::pin!(timer);
        // Poll the timer only after a reset (to register it) or once it has
        // fired: it is not what wakes this task for a delivery.
        let mut timer_reset = true;
        let cancelled = shutdown.cancelled();
        tokio::pin!(cancelled);
        let mut registered = false;
        let mut inbound = RateWindow::new();
        let traffic = metrics::traffic(handler.app_id(), conn.wire.name());
        traffic.opened();
        // Plain TCP: let senders write quiet connections' frames directly
        // (see `connection`), except where every frame is to be delayed.
        if settings.direct_writes
            && (settings.write_delay.is_zero() || settings.write_delay_busy_only)
        {
            if let Some(socket) =
                (&mut stream as &mut dyn std::any::Any).downcast_mut::<crate::ws::Socket>()
            {
                // Busy connections' frames wait for the session only
                // where it would hold them for company.
                let coalesce_from = if settings.write_delay.is_zero() {
                    u32::MAX
                } else {
                    settings.write_delay_min_rate
                };
                socket.attach(&conn, coalesce_from, traffic.clone());
            }
        }
        let mut write_failed = false;
        // The handler closed: what it queued before deciding to close goes out
        // before the close (its last answers to the client).
        let mut flush_queued = false;

        let end: Option<Why> = 'session: loop {
            let wake = poll_fn(|cx| {
                if let Some(r) = conn.close_requested() {
                    return Poll::Ready(Wake::Close(r));
                }
                // The shutdown future is polled once, to register this task's
                // waker with the token; after that an atomic load suffices
                // (the task's waker does not change). Polling it on every wake
                // would take the token's lock, shared by every connection, once
                // per delivered batch.
                if !registered {
                    registered = true;
                    if cancelled.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Wake::Shutdown);
                    }
                } else if shutdown.is_cancelled() {
                    return Poll::Ready(Wake::Shutdown);
                }
                // An answer past the queue's bound waits (a history answer):
                // the client's next messages wait until it is written, so a
                // client that stops reading gets no second answer (the first
                // sits in its socket's buffer and the write times out), and
                // its requests cannot pile answers up in our memory.
                if !conn.bursting() {
                    if decoder.has_next() {
                        return Poll::Ready(Wake::Read);
                    }
                    if let Poll::Ready(got) = poll_read(&mut stream, &mut decoder, cx) {
                        return Poll::Ready(if got { Wake::Read } else { Wake::Eof });
                    }
                }
                // After reads: a busy channel must not starve the client's pongs.
                if conn.poll_ready(cx).is_ready() {
                    return Poll::Ready(match conn.close_requested() {
                        Some(r) => Wake::Close(r),
                        None => Wake::Frames,
                    });
                }
                if timer_reset || timer.is_elapsed() {
                    timer_reset = false;
                    if timer.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Wake::Timer);
                    }
                }
                Poll::Pending
            })
            .await;

            match wake {
                Wake::Close(r) => break Some(Why::Reason(r)),
                Wake::Shutdown => {
                    break Some(Why::Reason(if settings.draining.is_cancelled() {
                        Reason::ShuttingDown
                    } else {
                        Reason::AppClosed
                    }))
                }
                Wake::Eof => break None,
                Wake::Read => {
                    // Boxed: a message's handling is not part of every idle
                    // connection's task.
                    let (seen, read) = Box::pin(on_messages(
                        &mut stream,
                        &conn,
                        &mut decoder,
                        &mut handler,
                        &mut inbound,
                        &traffic,
                        settings.max_messages_per_second,
                    ))
                    .await;
                    if seen {
                        last_seen = Instant::now();
                        ping_sent = None;
                    }
                    match read {
                        Read::Continue => {}
                        Read::Close(why) => break 'session Some(why),
                        Read::Handled(why) => {
                            flush_queued = true;
                            break 'session Some(why);
                        }
                        Read::ClientClosed => return,
                    }
                    // The keep-alive timer is not moved on every message (that
                    // would be timer-wheel work per message): when it fires
                    // early it re-arms itself from `last_seen`.
                }
                Wake::Frames => {
                    // Held for company only where that saves writes worth
                    // the wait: a busy connection on a node delivering
                    // many frames (`crate::load`). Otherwise at once.
                    let coalesce = !settings.write_delay.is_zero()
                        && (!settings.write_delay_busy_only || conn.busy())
                        && crate::load::coalescing(settings.write_delay_min_rate);
                    if coalesce {
                        // Sleep, then take what came: waiting on the queue
                        // instead would wake this task once per frame.
                        Box::pin(tokio::time::sleep(settings.write_delay)).await;
                    }
                    let mut batch = Vec::new();
                    conn.take(&mut batch, MAX_BATCH);
                    if batch.is_empty() {
                        continue;
                    }
                    // Boxed, like the handler's futures: idle tasks stay small.
                    if !Box::pin(write_batch(&mut stream, &conn, &mut handler, &batch)).await {
                        write_failed = true;
                        break None;
                    }
                    conn.written();
                    metrics::count(&metrics::SOCKET_WRITES);
                    traffic.sent(batch.len(), batch.iter().map(Frame::len).sum());
                }
                Wake::Timer => {
                    let now = Instant::now();
                    let next = match handler.keepalive() {
                        KeepAlive::Every(every) if now >= next_keepalive => {
                            if let Some(f) = handler.keepalive_frame() {
                                conn.send(f);
                            }
                            next_keepalive = now + every;
                            next_keepalive
                        }
                        KeepAlive::Every(_) => next_keepalive,
                        KeepAlive::WhenIdle { idle, wait } => match ping_sent {
                            Some(at) if now >= at + wait => {
                                break Some(Why::Reason(Reason::KeepAliveTimeout));
                            }
                            Some(at) => at + wait,
                            None if now >= last_seen + idle => {
                                if let Some(f) = handler.keepalive_frame() {
                                    conn.send(f);
                                }
                                ping_sent = Some(now);
                                now + wait
                            }
                            None => last_seen + idle,
                        },
                    };
                    // Checked here, on the timer, and not per message: an idle
                    // connection is one that wakes only for its timer.
                    let next = if handler.idle() {
                        let deadline = last_seen + settings.idle_timeout;
                        if now >= deadline {
                            break Some(Why::Reason(Reason::Idle));
                        }
                        next.min(deadline)
                    } else {
                        next
                    };
                    timer.as_mut().reset(next);
                    timer_reset = true;
                }
            }
        };

        let Some(why) = end else {
            // The client went away (or its socket broke): nothing to say,
            // so the whole teardown, leaving channels first, waits its turn
            // in the reaper, behind new connections (see there why). From
            // now on nothing is queued for it, nor written to its socket.
            conn.gone();
            conn.detach();
            let closed = if write_failed {
                metrics::Closed::WriteError
            } else {
                metrics::Closed::Client
            };
            settings.reaper.defer(Box::pin(async move {
                handler.on_close().await;
                traffic.closed(closed);
                drop((stream, decoder, conn));
            }));
            return;
        };
        // Leave channels first: the closing handshake may wait on the client.
        Box::pin(handler.on_close()).await;
        traffic.closed(why.closed());
        let closing = handler.closing(&why);
        Box::pin(close(stream, decoder, closing, &conn, flush_queued)).await;
    }
}

/// What handling the client's messages came to.
enum Read {
    Continue,
    /// The loop closes (broken framing, a rate limit, a binary frame).
    Close(Why),
    /// The handler closed: what it queued goes out first.
    Handled(Why),
    /// The client closed first; its close was echoed and the session left.
    ClientClosed,
}

/// Hand every whole message the decoder holds to the handler, in order.
/// Returns whether there was one (client traffic, for the keep-alive) and
/// what the loop does next.
async fn on_messages<S, H>(
    stream: &mut S,
    conn: &Connection,
    decoder: &mut Decoder,
    handler: &mut H,
    inbound: &mut RateWindow,
    traffic: &metrics::Traffic,
    max_per_second: u32,
) -> (bool, Read)
where
    S: AsyncWrite + Unpin,
    H: Handler,
{
    let mut seen = false;
    while let Some(msg) = decoder.next() {
        seen = true;
        let msg = match msg {
            Ok(m) => m,
            Err(e) => {
                metrics::count(&metrics::BAD_MESSAGES);
                return (seen, Read::Close(Why::Protocol(e)));
            }
        };
        if !inbound.allow(max_per_second) {
            metrics::count(&metrics::RATE_LIMITED);
            return (seen, Read::Close(Why::Reason(Reason::RateLimited)));
        }
        let next = match msg {
            Incoming::Text(text) => {
                traffic.received(text.len());
                let next = handler.on_text(text).await;
                if matches!(next, Next::Continue) && conn.bursting() {
                    // Written first (see `run`); the rest stays decoded.
                    return (seen, Read::Continue);
                }
                next
            }
            Incoming::Binary(b) => {
                traffic.received(b.len());
                metrics::count(&metrics::BAD_MESSAGES);
                return (seen, Read::Close(Why::Binary));
            }
            Incoming::Ping(payload) => {
                // Pongs bypass the queue's bounds: they are tiny and the
                // client is evidently reading. Not into a direct write's
                // unfinished frame, though: its rest goes first.
                let pong = Frame::new(OpCode::Pong, &payload);
                let _ = match conn.claim() {
                    Some(rest) => write_frames(stream, &[rest, pong]).await,
                    None => write_frames(stream, &[pong]).await,
                };
                conn.written();
                Next::Continue
            }
            Incoming::Pong => Next::Continue,
            Incoming::Close(frame) => {
                // The client closed first: echo its code (RFC 6455 5.5.1)
                // and end.
                handler.on_close().await;
                traffic.closed(metrics::Closed::Client);
                // The decoder refused codes nobody may send (1002), so what
                // is here can be echoed.
                let echo = match frame {
                    Some(f) => Frame::close(f.code, &f.reason),
                    None => Frame::close(1000, ""),
                };
                let last: Vec<Frame> = conn.detach().into_iter().chain([echo]).collect();
                let _ = write_frames(stream, &last).await;
                return (seen, Read::ClientClosed);
            }
        };
        if let Next::Close(why) = next {
            return (seen, Read::Handled(why));
        }
    }
    (seen, Read::Continue)
}

/// Write one batch. A close asked for while the socket is full (the queue
/// of a client that stopped reading overflowed) must not wait for the
/// write to finish or time out: the session leaves its channels at once, so
/// others hear of the departure, then finishes the write (bounded) and
/// closes as usual. Returns whether the batch was written.
async fn write_batch<S, H>(
    stream: &mut S,
    conn: &Connection,
    handler: &mut H,
    batch: &[Frame],
) -> bool
where
    S: AsyncWrite + Unpin,
    H: Handler,
{
    let write = tokio::time::timeout(WRITE_TIMEOUT, write_frames(stream, batch));
    tokio::pin!(write);
    let mut left = false;
    let done = loop {
        tokio::select! {
            biased;
            done = &mut write => break done,
            _ = poll_fn(|cx| conn.poll_close(cx)), if !left => {
                handler.on_close().await;
                left = true;
            }
        }
    };
    matches!(done, Ok(Ok(())))
}

/// Send the closing frames and finish the closing handshake.
async fn close<S>(
    mut stream: S,
    mut decoder: Decoder,
    closing: Closing,
    conn: &Connection,
    flush_queued: bool,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut last = Vec::with_capacity(2);
    // No more direct writes; one left unfinished is finished first.
    last.extend(conn.detach());
    // The handler closed: what it queued before deciding to close goes
    // out before the close (its last answers to the client).
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
        while poll_fn(|cx| poll_read(&mut stream, &mut decoder, cx)).await {
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

/// Read what the socket has into the decoder, through this thread's scratch
/// buffer. `Ready(false)` at the end of the stream or on an error.
fn poll_read<S: AsyncRead + Unpin>(
    stream: &mut S,
    decoder: &mut Decoder,
    cx: &mut std::task::Context<'_>,
) -> Poll<bool> {
    SCRATCH_BUF.with(|b| {
        let mut b = b.borrow_mut();
        let mut rb = ReadBuf::new(&mut b[..]);
        match Pin::new(stream).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => {
                let got = !rb.filled().is_empty();
                decoder.feed(rb.filled());
                Poll::Ready(got)
            }
            Poll::Ready(Err(_)) => Poll::Ready(false),
            Poll::Pending => Poll::Pending,
        }
    })
}

/// Refuse a connection before its session starts: write `frames` (the
/// protocol's error and a close frame), then wait, bounded, for the client
/// to read them and go, so the close is not lost to a reset.
pub async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(mut socket: S, frames: &[Frame]) {
    metrics::count(&metrics::CONNECTIONS_REFUSED);
    let _ = tokio::time::timeout(WRITE_TIMEOUT, write_frames(&mut socket, frames)).await;
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        let mut buf = [0u8; 256];
        loop {
            match tokio::io::AsyncReadExt::read(&mut socket, &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
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
