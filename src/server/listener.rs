//! The accept loop and HTTP/1.1 serving, with the limits that keep
//! connections that never finish from holding the server:
//!
//! - **Request heads on a clock** (`http_header_timeout`): hyper's header
//!   read timeout, one deadline for the whole head (a client trickling a
//!   byte every few seconds is cut as surely as a silent one), which also
//!   runs while a keep-alive connection waits for its next request.
//! - **Per-address admission** ([`admission`](super::admission)): over
//!   `max_connections_per_address` or `max_connection_rate_per_address`,
//!   the request is answered 429 before any upgrade, and the connection
//!   closed.
//! - **Out of descriptors** (`EMFILE`): one descriptor is kept in reserve
//!   (`/dev/null`). When accept fails for want of descriptors the reserve
//!   is given up to take one waiting connection, which gets `/up`, `/ready`
//!   and `/metrics` as usual and a 503 for anything else, under a short
//!   deadline; then the reserve is taken back. Without a reserve the loop
//!   waits a little before trying again: never a hot loop. The condition is
//!   logged once per interval, with the count of failed accepts, and
//!   counted in `herald_accept_errors_total{reason="fd_limit"}`.
//!
//! HTTP/2 is not served: every client of Herald's protocols speaks
//! HTTP/1.1 (TLS offers only `http/1.1` by ALPN), and one protocol means one
//! set of deadlines to get right.

use super::admission::{Admit, Counted, Refusal, Table};
use super::tls;
use axum::extract::ConnectInfo;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use herald_core::metrics;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// How long a refused connection has to send its request head (it is
/// answered only once it has).
const REFUSE_HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a connection taken with the reserve descriptor has to send its
/// request head: under descriptor pressure the slot must turn over fast (a
/// health check sends its request at once).
const SHED_HEAD_TIMEOUT: Duration = Duration::from_secs(1);

/// Pause after an accept error when no reserve descriptor is free.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Repeated accept errors are logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// How one listener serves.
#[derive(Clone)]
pub struct Options {
    /// `http_header_timeout`.
    pub header_timeout: Duration,
    /// Per-address limits (`None`: off, as on the metrics port).
    pub table: Option<Arc<Table>>,
    /// TLS termination.
    pub tls: Option<tls::Reloadable>,
}

/// What a connection gets served.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Normal,
    Refuse(Refusal),
    /// Taken with the reserve descriptor.
    Shed,
}

/// Serve `app` on `listener` until `stop`, then let connections finish
/// (idle keep-alive ones close at once) and end.
pub fn spawn(
    listener: TcpListener,
    app: Router,
    opts: Options,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<io::Result<()>> {
    tokio::spawn(async move {
        let tracker = TaskTracker::new();
        let shared = Arc::new(Shared { app, opts });
        let reserve = Arc::new(Reserve::open());
        let shedding = Arc::new(AtomicBool::new(false));
        let mut fd_log = Throttle::new(LOG_EVERY);
        let mut other_log = Throttle::new(LOG_EVERY);
        loop {
            if !shedding.load(Ordering::Acquire) {
                reserve.refill();
            }
            let accepted = tokio::select! {
                r = listener.accept() => r,
                _ = stop.cancelled() => break,
            };
            match accepted {
                Ok((tcp, addr)) => admit(&tracker, &shared, tcp, addr, &stop),
                Err(e) if is_fd_limit(&e) => {
                    metrics::accept_error("fd_limit");
                    if let Some(failed) = fd_log.hit() {
                        tracing::warn!(
                            error = %e,
                            failed_accepts = failed,
                            every_secs = LOG_EVERY.as_secs(),
                            "out of file descriptors: new connections wait or get 503 \
                             (raise the open-file limit, or lower the per-address limits)"
                        );
                    }
                    if !shedding.load(Ordering::Acquire) && reserve.release() {
                        // One descriptor is free now: take one waiting
                        // connection with it. Bounded: the backlog may
                        // have emptied meanwhile.
                        match tokio::time::timeout(ACCEPT_BACKOFF, listener.accept()).await {
                            Ok(Ok((tcp, addr))) => {
                                metrics::listener_refused("fd_limit");
                                shedding.store(true, Ordering::Release);
                                let done = shedding.clone();
                                let reserve = reserve.clone();
                                let shared = shared.clone();
                                let stop = stop.clone();
                                tracker.spawn(async move {
                                    let _ = tcp.set_nodelay(true);
                                    serve(Counted::new(tcp, None), addr, &shared, Mode::Shed, stop)
                                        .await;
                                    // The connection's descriptor is free:
                                    // take it back at once, before the
                                    // accept loop hands it to a newcomer.
                                    reserve.refill();
                                    done.store(false, Ordering::Release);
                                });
                                continue;
                            }
                            _ => continue,
                        }
                    }
                    backoff(&stop).await;
                }
                // The client gave up between its SYN and our accept.
                Err(e) if is_connection_error(&e) => {}
                Err(e) => {
                    metrics::accept_error("other");
                    if let Some(failed) = other_log.hit() {
                        tracing::warn!(error = %e, failed_accepts = failed, "accept failed");
                    }
                    backoff(&stop).await;
                }
            }
        }
        drop(listener);
        tracker.close();
        tracker.wait().await;
        Ok(())
    })
}

struct Shared {
    app: Router,
    opts: Options,
}

/// Decide for one accepted connection and start serving it (or not).
fn admit(
    tracker: &TaskTracker,
    shared: &Arc<Shared>,
    tcp: TcpStream,
    addr: SocketAddr,
    stop: &CancellationToken,
) {
    let _ = tcp.set_nodelay(true);
    let decision = match &shared.opts.table {
        Some(t) => t.admit(addr.ip()),
        None => Admit::Yes(None),
    };
    let (io, mode) = match decision {
        Admit::Yes(ticket) => (Counted::new(tcp, ticket), Mode::Normal),
        Admit::Refuse(why, ticket) => {
            metrics::listener_refused(why.label());
            (Counted::new(tcp, Some(ticket)), Mode::Refuse(why))
        }
        Admit::Drop => {
            metrics::listener_refused("address_overflow");
            return;
        }
    };
    let shared = shared.clone();
    let stop = stop.clone();
    tracker.spawn(async move { serve(io, addr, &shared, mode, stop).await });
}

/// TLS if configured, then HTTP.
async fn serve(
    io: Counted<TcpStream>,
    addr: SocketAddr,
    shared: &Arc<Shared>,
    mode: Mode,
    stop: CancellationToken,
) {
    match &shared.opts.tls {
        Some(acceptor) => {
            if let Some(tls) = tls::handshake(acceptor, io, addr).await {
                http(tls, None, addr, shared, mode, stop).await
            }
        }
        None => {
            // Plain TCP: sessions may write to the socket directly.
            let fd = std::os::fd::AsRawFd::as_raw_fd(io.inner());
            http(io, Some(fd), addr, shared, mode, stop).await
        }
    }
}

/// Serve HTTP/1.1 on one connection, upgrades included.
async fn http<I>(
    io: I,
    fd: Option<i32>,
    addr: SocketAddr,
    shared: &Arc<Shared>,
    mode: Mode,
    stop: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let served = Arc::new(AtomicBool::new(false));
    let app = shared.app.clone();
    let opts = &shared.opts;
    let limits = opts
        .table
        .as_ref()
        .map_or((0, 0), |t| (t.max_open(), t.max_rate()));
    let seen = served.clone();
    let service =
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            seen.store(true, Ordering::Relaxed);
            req.extensions_mut().insert(ConnectInfo(addr));
            if let Some(fd) = fd {
                req.extensions_mut().insert(herald_core::ws::RawSocket(fd));
            }
            let app = app.clone();
            async move {
                let req = req.map(axum::body::Body::new);
                Ok::<Response, std::convert::Infallible>(match mode {
                    Mode::Normal => app.oneshot(req).await.unwrap_or_else(|e| match e {}),
                    Mode::Refuse(why) => refusal(why, limits),
                    Mode::Shed if matches!(req.uri().path(), "/up" | "/ready" | "/metrics") => {
                        app.oneshot(req).await.unwrap_or_else(|e| match e {})
                    }
                    Mode::Shed => error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "Server is at its open-file limit; retry later",
                    ),
                })
            }
        });
    let head = match mode {
        Mode::Normal => opts.header_timeout,
        Mode::Refuse(_) => opts.header_timeout.min(REFUSE_HEAD_TIMEOUT),
        Mode::Shed => opts.header_timeout.min(SHED_HEAD_TIMEOUT),
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(head)
        .keep_alive(mode == Mode::Normal);
    let conn = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        if e.is_timeout() {
            metrics::http_timeout(if served.load(Ordering::Relaxed) {
                "keepalive"
            } else {
                "head"
            });
        }
    }
}

/// The answer to a connection over a per-address limit.
fn refusal(why: Refusal, (max_open, max_rate): (u32, u32)) -> Response {
    let message = match why {
        Refusal::Connections => format!(
            "Too many connections from your address (at most {max_open}); close some, then retry"
        ),
        Refusal::Rate => format!(
            "Too many new connections from your address (at most {max_rate} a second); retry later"
        ),
    };
    let mut res = error(StatusCode::TOO_MANY_REQUESTS, &message);
    res.headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    res
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

async fn backoff(stop: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(ACCEPT_BACKOFF) => {}
        _ = stop.cancelled() => {}
    }
}

/// Out of descriptors (the process's or the system's) or of socket memory.
fn is_fd_limit(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// The reserve descriptor (shared with the task serving the connection
/// taken with it, which gives it back).
struct Reserve(std::sync::Mutex<Option<std::fs::File>>);

impl Reserve {
    fn open() -> Reserve {
        let r = Reserve(std::sync::Mutex::new(None));
        r.refill();
        r
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<std::fs::File>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take the descriptor back if it is not held (cheap when it is).
    fn refill(&self) {
        let mut slot = self.slot();
        if slot.is_none() {
            *slot = std::fs::File::open("/dev/null").ok();
        }
    }

    /// Close it, freeing one descriptor; false if there was none.
    fn release(&self) -> bool {
        self.slot().take().is_some()
    }
}

/// Once per interval: `hit` says when to log, with the events since.
struct Throttle {
    every: Duration,
    last: Option<Instant>,
    count: u64,
}

impl Throttle {
    fn new(every: Duration) -> Throttle {
        Throttle {
            every,
            last: None,
            count: 0,
        }
    }

    fn hit(&mut self) -> Option<u64> {
        self.count += 1;
        let now = Instant::now();
        if self
            .last
            .is_some_and(|l| now.duration_since(l) < self.every)
        {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_logs_once_per_interval_with_the_count() {
        let mut t = Throttle::new(Duration::from_secs(3600));
        assert_eq!(t.hit(), Some(1));
        for _ in 0..99 {
            assert_eq!(t.hit(), None);
        }
        let mut t = Throttle::new(Duration::ZERO);
        assert_eq!(t.hit(), Some(1));
        assert_eq!(t.hit(), Some(1));
    }
}
