//! The server: one listener, routing by path to the protocol front doors,
//! the HTTP API and the operator endpoints, plus the node's housekeeping.
//!
//! ```text
//! /app/{key}      Pusher Channels v7 WebSocket
//! /apps/{id}/...  Pusher HTTP API
//! /up             liveness: 200 while the process serves
//! /ready          readiness: 503 while starting or draining
//! /metrics        Prometheus text format
//! ```

pub mod shutdown;
pub mod tls;

use crate::node::Node;
use crate::session::pusher::{self as pusher_session, ConnectParams};
use crate::{api, metrics};
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket};

/// Read buffer per WebSocket. tungstenite allocates it up front for every
/// connection (128 KiB by default), so it dominates idle memory. 1 KiB holds
/// a subscribe, a ping or a typical client event; a larger frame reserves
/// its full length once its header is read, and is then read at most 1 KiB
/// per syscall. `herald bench idle` measured 8.9 KiB of server memory per
/// idle connection with 4 KiB here and 6.0 KiB with 1 KiB (target: < 8 KiB).
const WS_READ_BUFFER: usize = 1024;
/// Bytes buffered before tungstenite writes to the socket mid-batch.
const WS_WRITE_BUFFER: usize = 16 * 1024;

pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/app/{key}", get(pusher_ws))
        .route("/up", get(|| async { "OK" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics_text))
        .merge(api::router())
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                Json(serde_json::json!({ "error": "Not found" })),
            )
        })
        .with_state(node)
}

async fn ready(State(node): State<Arc<Node>>) -> Response {
    if node.is_ready() {
        "READY".into_response()
    } else {
        let why = if node.is_draining() {
            "DRAINING"
        } else {
            "STARTING"
        };
        (StatusCode::SERVICE_UNAVAILABLE, why).into_response()
    }
}

async fn metrics_text(State(node): State<Arc<Node>>) -> String {
    metrics::render(&[(
        "herald_connections",
        "Open client connections",
        node.connection_count(),
    )])
}

/// `/app/{key}`: upgrade first, then refuse with a Pusher error code if the
/// app or protocol version is wrong, because Pusher clients act on close
/// codes (an HTTP error would make them retry forever).
async fn pusher_ws(
    State(node): State<Arc<Node>>,
    Path(key): Path<String>,
    Query(params): Query<ConnectParams>,
    ws: WebSocketUpgrade,
) -> Response {
    if node.is_draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "Server is draining").into_response();
    }
    let hub = node.hub_by_key(&key).cloned();
    let max = hub.as_ref().map_or(64 * 1024, |h| h.app.max_frame_size);
    ws.read_buffer_size(WS_READ_BUFFER)
        .write_buffer_size(WS_WRITE_BUFFER)
        .max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| async move {
            let Some(hub) = hub else {
                return pusher_session::refuse(
                    socket,
                    crate::protocol::pusher::code::APP_NOT_FOUND,
                )
                .await;
            };
            if let Err(code) = pusher_session::check_version(&params) {
                return pusher_session::refuse(socket, code).await;
            }
            if let Err(code) = hub.admit() {
                return pusher_session::refuse(socket, code).await;
            }
            pusher_session::run(node, hub, socket).await
        })
}

/// Raise the open-file soft limit to the hard limit. Every connection is a
/// file descriptor, and many systems start processes with a soft limit of
/// 1024, which would cap a server at about a thousand clients. Returns the
/// limit now in force, if it could be read.
pub fn raise_open_file_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return Some(raised.rlim_cur as u64);
            }
        }
    }
    Some(lim.rlim_cur as u64)
}

/// Bind with a large listen backlog so a connection avalanche queues
/// instead of being dropped.
pub fn bind(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// Serve until a shutdown signal, then drain (see [`shutdown`]).
pub async fn serve(
    node: Arc<Node>,
    listener: TcpListener,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let housekeeping = tokio::spawn(housekeeping(node.clone()));
    let app = router(node.clone());
    let stop = tokio_util::sync::CancellationToken::new();
    let server = match (&node.config.tls_cert, &node.config.tls_key) {
        (Some(cert), Some(key)) => {
            let acceptor = tls::acceptor(cert.as_ref(), key.as_ref())?;
            spawn_server(
                tls::TlsListener::new(listener, acceptor)?,
                app,
                stop.clone(),
            )
        }
        _ => spawn_server(listener, app, stop.clone()),
    };
    node.set_ready(true);
    signal.await;
    shutdown::drain(&node).await;
    stop.cancel();
    // Idle keep-alive HTTP connections close at once; do not wait long on
    // anything else.
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    housekeeping.abort();
    Ok(())
}

fn spawn_server<L>(
    listener: L,
    app: Router,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<std::io::Result<()>>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
    })
}

/// How often changed subscription counts are sent (coalesced).
pub const SUBSCRIPTION_COUNT_INTERVAL: Duration = Duration::from_millis(250);

/// Periodic work: expiring cache slots (so memory stays flat) and sending
/// coalesced subscription counts.
async fn housekeeping(node: Arc<Node>) {
    let mut cache = tokio::time::interval(Duration::from_secs(30));
    let mut counts = tokio::time::interval(SUBSCRIPTION_COUNT_INTERVAL);
    loop {
        tokio::select! {
            _ = cache.tick() => node.hubs().for_each(|hub| hub.expire_cache()),
            _ = counts.tick() => node.hubs().for_each(|hub| hub.flush_subscription_counts()),
        }
    }
}
