//! The server: one listener, routing by path to the protocol front doors,
//! the HTTP API and the operator endpoints, plus the node's housekeeping.
//!
//! ```text
//! /app/{key}      Pusher Channels v7 WebSocket
//! /apps/{id}/...  Pusher HTTP API
//! /graphql, /graphql/realtime, /event/realtime, /event
//!                 AppSync's GraphQL pub/sub and Events APIs
//! /up             liveness: 200 while the process serves
//! /ready          readiness: 503 while starting or draining
//! /metrics        Prometheus text format
//! ```

pub mod shutdown;
pub mod tls;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use herald_core::metrics;
use herald_core::node::Node;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket};

pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .merge(herald_pusher::router())
        .merge(herald_appsync::router())
        .route("/up", get(|| async { "OK" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics_text))
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
    node.join_cluster().await;
    let housekeeping = tokio::spawn(housekeeping(node.clone()));
    let app = router(node.clone());
    let stop = tokio_util::sync::CancellationToken::new();
    let server = match (&node.config.tls_cert, &node.config.tls_key) {
        (Some(cert), Some(key)) => {
            let acceptor = tls::Reloadable::new(tls::acceptor(cert.as_ref(), key.as_ref())?);
            reload_on_hangup(acceptor.clone(), cert.into(), key.into());
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
    node.leave_cluster();
    stop.cancel();
    // Idle keep-alive HTTP connections close at once; do not wait long on
    // anything else.
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    housekeeping.abort();
    Ok(())
}

/// On SIGHUP, read the certificate and key again (renewed certificates
/// without a restart; established connections stay).
fn reload_on_hangup(acceptor: tls::Reloadable, cert: std::path::PathBuf, key: std::path::PathBuf) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP: TLS certificates will not reload");
            return;
        };
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                match acceptor.reload(&cert, &key) {
                    Ok(()) => tracing::info!(cert = %cert.display(), "TLS certificate reloaded"),
                    Err(e) => {
                        tracing::error!(error = %e, "TLS certificate reload failed; keeping the current one")
                    }
                }
            }
        });
    }
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

/// Periodic work: heartbeats to the broker and expiring cache slots (so
/// memory stays flat) at a third of the broker's TTL, and coalesced
/// subscription counts.
pub async fn housekeeping(node: Arc<Node>) {
    let every = (node.broker.ttl() / 3).min(Duration::from_secs(10));
    let mut tick = tokio::time::interval(every);
    let mut counts = tokio::time::interval(SUBSCRIPTION_COUNT_INTERVAL);
    loop {
        tokio::select! {
            _ = tick.tick() => node.tick(),
            _ = counts.tick() => node.flush_counts(),
        }
    }
}
