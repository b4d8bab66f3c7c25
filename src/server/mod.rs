//! The server: one listener, routing by path to the adapters' routes (the
//! protocol front doors and their HTTP APIs) and the operator endpoints,
//! the adapters' background tasks and their part in shutdown, plus the
//! node's housekeeping.
//!
//! ```text
//! /app/{key}      Pusher Channels v7 WebSocket
//! /apps/{id}/...  Pusher HTTP API
//! /cable          Action Cable WebSocket (RPC to the app, AnyCable's)
//! /_broadcast     AnyCable-style broadcast ingress
//! /graphql, /graphql/realtime, /event/realtime, /event
//!                 AppSync's GraphQL pub/sub and Events APIs
//! /up             liveness: 200 while the process serves
//! /version        the build: version, commit (JSON; see [`crate::build_info`])
//! /ready          readiness: 503 while starting or draining
//! /metrics        Prometheus text format (or on `metrics_port`)
//! /dashboard      the live dashboard, when enabled (see [`dashboard`])
//! ```

pub mod admission;
pub mod dashboard;
pub mod hangup;
pub mod listener;
pub mod shutdown;
pub mod tls;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use herald_core::adapter::{Adapters, Context, Ingress};
use herald_core::metrics;
use herald_core::node::Node;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket};

/// The routes of Herald's own adapters ([`crate::adapters`]) and the
/// operator endpoints.
pub fn router(node: Arc<Node>) -> Router {
    router_with(&crate::adapters(), node)
}

/// Every adapter's routes, then the operator endpoints.
pub fn router_with(adapters: &Adapters, node: Arc<Node>) -> Router {
    let mut router = Router::new();
    for a in adapters {
        router = router.merge(a.routes(&node));
    }
    let mut router = router
        .route("/up", get(|| async { "OK" }))
        .route(
            "/version",
            get(|| async { Json(crate::build_info::json()) }),
        )
        .route("/ready", get(ready));
    if node.config.metrics_port.is_none() {
        router = router.route("/metrics", get(metrics_text));
    }
    let dashboard = dashboard::router(&node);
    let router = router
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                Json(serde_json::json!({ "error": "Not found" })),
            )
        })
        .with_state(node);
    match dashboard {
        Some(d) => router.merge(d),
        None => router,
    }
}

async fn ready(State(node): State<Arc<Node>>) -> Response {
    let broker_down = !node.broker.connected() && node.config.broker.ready_needs_broker;
    if node.is_ready() && broker_down {
        (StatusCode::SERVICE_UNAVAILABLE, "BROKER DOWN").into_response()
    } else if node.is_ready() {
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

/// `/metrics` on its own port (`metrics_port`): nothing else is served there.
pub fn metrics_router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .with_state(node)
}

async fn metrics_text(State(node): State<Arc<Node>>) -> Response {
    let hubs: Vec<_> = node.hubs().collect();
    let apps: Vec<metrics::AppGauges<'_>> = hubs
        .iter()
        .map(|h| {
            let (channels, subscriptions) = h.channel_figures();
            metrics::AppGauges {
                app: h.app.id.as_str(),
                channels,
                subscriptions,
                cache_bytes: h.cache.bytes(),
                cache_events: h.cache.events(),
                cache_evictions: h.cache.evictions(),
            }
        })
        .collect();
    let mut text = metrics::render(&apps, node.broker.name(), node.broker.connected());
    text.push_str(&crate::build_info::metric());
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// Raise the open-file soft limit to the hard limit. Every connection is a
/// file descriptor, and many systems start processes with a soft limit of
/// 1024, which would cap a server at about a thousand clients. Returns the
/// limit now in force, if it could be read.
pub fn raise_open_file_limit() -> Option<u64> {
    rlimit::increase_nofile_limit(u64::MAX).ok()
}

/// Bind with a large listen backlog so a connection avalanche queues
/// instead of being dropped. The IPv6 wildcard `::` takes IPv4 clients
/// too (as IPv4-mapped addresses), whatever the system's default
/// (`net.ipv6.bindv6only`): `host = "::"` means every address.
pub fn bind(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        let s = TcpSocket::new_v6()?;
        socket2::SockRef::from(&s).set_only_v6(false)?;
        s
    };
    socket.set_reuseaddr(true)?;
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// The broker's server lent to adapters ([`Ingress`]): the Redis or NATS
/// server of `broker.url`, with the broker's TLS settings (read again
/// here: they were checked at start; a file gone since is the adapter's
/// error when it asks).
struct BrokerIngress(
    String,
    Result<Option<herald_broker::tls::BrokerTls>, String>,
);

impl BrokerIngress {
    fn tls(&self) -> Result<Option<&herald_broker::tls::BrokerTls>, String> {
        self.1.as_ref().map(Option::as_ref).map_err(Clone::clone)
    }
}

impl Ingress for BrokerIngress {
    fn subscribe(
        &self,
        channel: &str,
    ) -> Result<tokio::sync::mpsc::Receiver<axum::body::Bytes>, String> {
        herald_broker::ingress::subscribe(&self.0, self.tls()?, channel)
    }

    fn consume_stream(
        &self,
        stream: &str,
        group: &str,
    ) -> Result<tokio::sync::mpsc::Receiver<herald_core::adapter::StreamEntry>, String> {
        herald_broker::ingress::consume_stream(&self.0, self.tls()?, stream, group)
    }
}

/// Serve Herald's own adapters ([`serve_with`]).
pub async fn serve(
    node: Arc<Node>,
    listener: TcpListener,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(crate::adapters(), node, listener, signal).await
}

/// Serve `adapters` until a shutdown signal, then drain (see [`shutdown`]).
pub async fn serve_with(
    adapters: Adapters,
    node: Arc<Node>,
    listener: TcpListener,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // First: a SIGHUP from here on reloads, never ends the process.
    let hangup = hangup::Hangup::install();
    node.join_cluster().await;
    let ingress = BrokerIngress(
        node.config.broker.url.clone(),
        herald_broker::tls::BrokerTls::load(&node.config.broker),
    );
    for a in &adapters {
        a.start(&node, &Context { ingress: &ingress })
            .map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{}: {e}", a.name()),
                )
            })?;
    }
    let housekeeping = tokio::spawn(housekeeping(node.clone()));
    let app = router_with(&adapters, node.clone());
    let stop = tokio_util::sync::CancellationToken::new();
    let metrics_server = match node.config.metrics_port {
        Some(port) => {
            let addr = SocketAddr::new(listener.local_addr()?.ip(), port);
            let l = bind(addr, 128).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot listen on {addr} (metrics_port): {e}"),
                )
            })?;
            tracing::info!(%addr, "metrics listening");
            let opts = listener::Options {
                header_timeout: node.config.http_header_timeout(),
                table: None,
                tls: None,
            };
            Some(listener::spawn(
                l,
                metrics_router(node.clone()),
                opts,
                stop.clone(),
            ))
        }
        None => None,
    };
    let mut reloads = hangup::Reloads {
        node: Some(node.clone()),
        ..Default::default()
    };
    let tls = match (&node.config.tls_cert, &node.config.tls_key) {
        (Some(cert), Some(key)) => {
            let acceptor = tls::Reloadable::new(tls::acceptor(cert.as_ref(), key.as_ref())?);
            reloads.tls = Some((acceptor.clone(), cert.into(), key.into()));
            Some(acceptor)
        }
        _ => None,
    };
    hangup.serve(reloads);
    let c = &node.config;
    let table = admission::Table::new(
        c.max_connections_per_address,
        c.max_connection_rate_per_address,
        c.address_limits_exempt(),
    );
    let sweeper = table.clone().map(|t| {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            loop {
                tick.tick().await;
                t.sweep();
            }
        })
    });
    let opts = listener::Options {
        header_timeout: c.http_header_timeout(),
        table,
        tls,
    };
    let server = listener::spawn(listener, app, opts, stop.clone());
    node.set_ready(true);
    signal.await;
    let grace_end = std::time::Instant::now() + node.config.shutdown_grace();
    shutdown::drain(&node).await;
    // Work the adapters started for clients that left (calls telling the
    // app about them) finishes before the process exits.
    if !node.finish_tasks(node.config.shutdown_grace()).await {
        tracing::warn!("grace period over; some backend calls were not made");
    }
    let deadline = grace_end.max(std::time::Instant::now() + Duration::from_millis(500));
    for a in &adapters {
        a.stop(&node, deadline).await;
    }
    // What observers hold (webhooks) goes out within the grace period
    // (at least half a second, when draining took all of it).
    node.flush_observers(deadline).await;
    node.leave_cluster();
    // The others must hear we left before the process ends.
    let _ = tokio::time::timeout(Duration::from_secs(2), node.broker.flush()).await;
    stop.cancel();
    // Idle keep-alive HTTP connections close at once; do not wait long on
    // anything else.
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    if let Some(m) = metrics_server {
        let _ = tokio::time::timeout(Duration::from_secs(1), m).await;
    }
    housekeeping.abort();
    if let Some(s) = sweeper {
        s.abort();
    }
    Ok(())
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
            _ = tick.tick() => {
                node.tick();
                metrics::upkeep();
            }
            _ = counts.tick() => node.flush_counts(),
        }
    }
}
