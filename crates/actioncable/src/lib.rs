//! Herald's Action Cable adapter (`actioncable-v1-json`), compatible with
//! AnyCable: clients such as `@rails/actioncable` and `@anycable/web` talk
//! to `/cable`, and the app decides who they are and what their channels do
//! through AnyCable's RPC service, over gRPC or HTTP, so AnyCable's RPC
//! servers (anycable-rails, `@anycable/serverless-js`) work unchanged.
//!
//! ```text
//! session     /cable: Connect before the welcome, commands → RPC Command,
//!   │         answers → streams (core channels), states, transmissions
//!   ├ opening      the upgrade; who the client is (restored session,
//!   │              token, or Connect)
//!   ├ env          what every call tells the app (request, states)
//!   ├ history      history answers and restores (extended protocol)
//!   ├ membership   presence and whisper commands (extended protocol)
//!   ├ streams      `$pubsub` streams: signed names, public names
//!   ├ turbo        Turbo Streams and CableReady signed names, no RPC
//!   └ disconnects  Disconnect calls, queued and rate-limited
//! ext         AnyCable's extended protocol (`actioncable-v1-ext-json`)
//!   ├ protocol     its frames, history requests, its wire, their limits
//!   ├ presence     presence and whispers: members, frames, gone nodes
//!   └ resume       history bounds (reliable publishing is the core's:
//!                  `herald_core::reliable`), resumable session snapshots
//! rpc         the client: gRPC (one multiplexed connection) or HTTP;
//!   └ proto        AnyCable's messages, field numbers as in rpc.proto
//! sse         Server-Sent Events (`rpc.sse_path`): query → subscribe
//!             commands to a session over an in-process pipe, its frames →
//!             events, `id:` positions, `Last-Event-ID` → history requests
//! jwt         AnyCable's JWT identification (`?jid=`, `x-jid`)
//! broadcast   POST /_broadcast → node.publish_reliably; the broker's
//!             `__anycable__` channel (Redis/NATS) → node.publish_here
//!   └ remote       remote commands (disconnect by identifiers)
//! wire        parse/encode frames; the core's `Wire` (a frame per
//!             (stream, identifier), shared by its subscribers)
//! config      the `[rpc]` table, parsed and checked; stream limits
//! metrics     RPC, Disconnect and broadcast counters
//! ```
//!
//! [`ActionCable`] is the adapter value the server lists (the core's
//! `herald_core::adapter::Adapter`): its routes, the broadcast ingest from
//! the broker's server as a background task, its settings.
//!
//! Streams live in the app's hub in their own namespace, [`NAMESPACE`],
//! so clients of another protocol on the same app never see them, and a
//! stream may have any name (another protocol's channel of the same name
//! is another channel).

pub mod broadcast;
pub mod config;
pub mod disconnects;
pub mod ext;
pub mod jwt;
pub mod metrics;
/// AnyCable's RPC messages (a crate of their own, shared with the bench).
pub use herald_anycable_proto as proto;
pub mod remote;
pub mod rpc;
pub mod session;
pub mod sse;
pub mod streams;
pub mod turbo;
pub mod wire;

use axum::routing::{get, post};
use axum::{Extension, Router};
use config::RpcConfig;
use herald_core::adapter::{Adapter, Context, Keys};
use herald_core::config::{Config, ConfigError};
use herald_core::hub::Hub;
use herald_core::namespace::Namespace;
use herald_core::node::Node;
use herald_core::reliable::ReliableStreams;
use std::sync::Arc;

/// The WebSocket path unless `rpc.path` says otherwise.
pub const DEFAULT_PATH: &str = "/cable";

/// The hub namespace of streams (a stream's hub channel is its name).
pub const NAMESPACE: Namespace = Namespace::new("actioncable");

/// The adapter's shared state.
pub struct Cable {
    /// The node serving it (no cycle: the node does not hold its routes).
    pub node: Arc<Node>,
    pub hub: Arc<Hub>,
    pub rpc: Option<Arc<rpc::Rpc>>,
    pub disconnects: Option<disconnects::Disconnects>,
    /// Request headers passed to Connect (lowercase).
    pub headers: Vec<String>,
    pub public_streams: bool,
    /// Key of signed stream names.
    pub streams_key: Option<String>,
    /// Turbo Streams and CableReady subscriptions verified here.
    pub signed: turbo::SignedChannels,
    pub broadcast_key: Option<String>,
    /// JWT identification: the key, the query parameter, and whether a
    /// token is required.
    pub jwt: Option<Jwt>,
    /// Reliable streams (`actioncable-v1-ext-json`): the core publishes
    /// their broadcasts with positions and keeps their history.
    pub reliable: Arc<ReliableStreams>,
    /// What one connection may ask of the history.
    pub history: ext::protocol::HistoryLimits,
    /// Sessions a reconnecting client restores.
    pub resumable: Arc<ext::resume::Resumable>,
    /// Presence and whispers (`actioncable-v1-ext-json`).
    pub presence: ext::presence::Settings,
    /// This node's connections by identifiers, for remote disconnects.
    pub identities: Arc<remote::Identities>,
}

pub struct Jwt {
    pub secret: String,
    pub param: String,
    pub header: String,
    pub force: bool,
}

/// Check the settings this adapter reads against what they name (at
/// start, before serving): the host's form, the CA file, the broker.
pub fn check_config(config: &Config, rpc: &RpcConfig) -> Result<(), String> {
    if let Some(host) = &rpc.host {
        let (http, _) = rpc::parse_host(host)?;
        if http && rpc.tls {
            return Err(format!(
                "rpc.tls is for gRPC; rpc.host {host:?} is HTTP RPC (use an https:// URL for TLS)"
            ));
        }
    }
    if let Some(path) = &rpc.tls_root_ca {
        let pem = std::fs::read_to_string(path)
            .map_err(|e| format!("rpc.tls_root_ca {path:?}: cannot read it: {e}"))?;
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(format!(
                "rpc.tls_root_ca {path:?}: no PEM certificate in it"
            ));
        }
    }
    broadcast::check_adapter(rpc, &config.broker)
}

/// The hub of the app whose streams `/cable` serves (`rpc.app`, else the
/// first app).
pub fn hub_of(node: &Node, rpc: &RpcConfig) -> Option<Arc<Hub>> {
    match &rpc.app {
        Some(id) => node.hub_by_id(id),
        None => node.config.apps.first().and_then(|a| node.hub_by_id(&a.id)),
    }
}

impl Cable {
    pub fn new(node: &Arc<Node>, config: &RpcConfig) -> Result<Cable, String> {
        let hub = hub_of(node, config).ok_or("no app to serve /cable")?;
        let rpc = match &config.host {
            Some(_) => Some(Arc::new(rpc::Rpc::new(config)?)),
            None => None,
        };
        let disconnects = rpc
            .as_ref()
            .map(|r| disconnects::Disconnects::new(r.clone(), config));
        let streams_key = config
            .streams_secret
            .clone()
            .or_else(|| Some(hub.config().secret.clone()));
        // Remote disconnects reach this node's connections here, whichever
        // node the app gave the command to.
        let identities = Arc::new(remote::Identities::default());
        let (set, app) = (identities.clone(), hub.app.id.clone());
        node.on_command(
            NAMESPACE,
            Arc::new(move |hub: &Arc<Hub>, body: &str| {
                if hub.app.id == app {
                    remote::run(&set, body);
                }
            }),
        );
        Ok(Cable {
            node: node.clone(),
            hub,
            rpc,
            disconnects,
            headers: config
                .headers
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
            public_streams: config.public_streams,
            signed: turbo::SignedChannels::new(config, streams_key.as_deref()),
            streams_key,
            broadcast_key: config.broadcast_key.clone(),
            jwt: config.jwt_secret.clone().map(|secret| Jwt {
                secret,
                param: config.jwt_param.clone(),
                header: format!("x-{}", config.jwt_param.to_ascii_lowercase()),
                force: config.jwt_force,
            }),
            reliable: {
                // One account for the node's answers, whichever app queues them.
                herald_core::history::budget::ANSWERS.bound(config.history_answers_max_bytes);
                let limits = ext::resume::history_limits(config);
                let r = Arc::new(ReliableStreams::new(&*node.broker, limits));
                r.start_sweeper();
                r
            },
            history: ext::protocol::HistoryLimits {
                rate: config.history_rate,
                answer_room: config.history_max_bytes,
            },
            resumable: {
                let r = Arc::new(ext::resume::Resumable::new(config, &*node.broker));
                r.start_sweeper();
                r
            },
            presence: ext::presence::Settings::new(config),
            identities,
        })
    }
}

/// The Action Cable adapter: `/cable` (or `rpc.path`), `/_broadcast`,
/// and the broadcasts from the broker's server.
pub struct ActionCable;

impl Adapter for ActionCable {
    fn name(&self) -> &'static str {
        "actioncable"
    }

    fn keys(&self) -> Keys {
        Keys {
            top: config::TOP_KEYS,
            app: &[],
        }
    }

    fn settings(&self) -> &'static [herald_core::adapter::Setting] {
        config::SETTINGS
    }

    fn config(&self, config: &Config) -> Result<serde_json::Value, ConfigError> {
        let mut rpc = config::load(config)?;
        // Shown as in effect: the path served when none is set.
        rpc.path.get_or_insert_with(|| DEFAULT_PATH.to_owned());
        Ok(serde_json::json!({ "rpc": rpc }))
    }

    fn check(&self, config: &Config) -> Result<(), String> {
        let rpc = config::load(config).map_err(|e| e.to_string())?;
        check_config(config, &rpc)
    }

    fn routes(&self, node: &Arc<Node>) -> Router<Arc<Node>> {
        match config::load(&node.config) {
            Ok(rpc) => router(node, &rpc),
            Err(e) => {
                tracing::error!(error = %e, "Action Cable disabled");
                Router::new()
            }
        }
    }

    /// AnyCable's redis/nats/redisx broadcast adapters: the app publishes
    /// to the broker's server; every node reads the channel (delivering to
    /// its own clients), or the stream in a group (publishing to all).
    fn start(&self, node: &Arc<Node>, cx: &Context<'_>) -> Result<(), String> {
        let rpc = config::load(&node.config).map_err(|e| e.to_string())?;
        let Some(hub) = hub_of(node, &rpc) else {
            return Ok(());
        };
        ext::presence::Gone::register(node, &hub);
        if rpc.broadcast_key.is_none() && !node.config.serves_loopback_only() {
            tracing::warn!(
                host = %node.config.host,
                "POST /_broadcast accepts broadcasts from anyone who reaches this port: set \
                 rpc.broadcast_key (HERALD_BROADCAST_KEY, ANYCABLE_BROADCAST_KEY) or keep \
                 the port private (docs/actioncable.md)"
            );
        }
        // The routes' `Cable` is not reachable from here: the ingest gets
        // its own handle on the broker's history. For a cluster engine that
        // keeps it on its server that is the same history; one kept in
        // process starts empty here, so nothing retained, no positions.
        let reliable = Arc::new(ReliableStreams::new(
            &*node.broker,
            ext::resume::history_limits(&rpc),
        ));
        if let Some(channel) = broadcast::ingress_channel(&rpc) {
            if rpc.history_limit > 0 && rpc.history_ttl > 0 {
                tracing::warn!(
                    adapter = %rpc.broadcast_adapter,
                    "broadcasts from the broker's pub/sub channel reach every node, so they go \
                     out without stream positions and are not kept in the history: for reliable \
                     streams in a cluster, broadcast with the http or redisx adapter \
                     (docs/cluster.md, History on redis)"
                );
            }
            let rx = cx.ingress.subscribe(channel)?;
            tokio::spawn(broadcast::ingest(
                node.clone(),
                hub.clone(),
                reliable.clone(),
                rx,
                true,
            ));
        }
        if let Some(stream) = broadcast::ingress_stream(&rpc) {
            let rx = cx.ingress.consume_stream(stream, broadcast::STREAM_GROUP)?;
            tokio::spawn(broadcast::ingest_stream(node.clone(), hub, reliable, rx));
        }
        Ok(())
    }
}

/// The routes: the WebSocket endpoint and the broadcast ingress. Call
/// inside the runtime (the gRPC client starts there).
pub fn router(node: &Arc<Node>, rpc: &RpcConfig) -> Router<Arc<Node>> {
    metrics::register_all();
    let path = rpc.path.clone().unwrap_or_else(|| DEFAULT_PATH.to_owned());
    match Cable::new(node, rpc) {
        Ok(cable) => {
            if let Some(rpc) = &cable.rpc {
                tracing::info!(
                    target = %rpc.target,
                    transport = if rpc.is_http() { "http" } else { "grpc" },
                    path,
                    "Action Cable RPC"
                );
            }
            let mut router = Router::new()
                .route(&path, get(session::upgrade))
                .route("/_broadcast", post(broadcast::handle));
            if rpc.sse {
                tracing::info!(path = %rpc.sse_path, "Action Cable Server-Sent Events");
                router = router.route(&rpc.sse_path, get(sse::handle));
            }
            router.layer(Extension(Arc::new(cable)))
        }
        Err(e) => {
            tracing::error!(error = %e, "Action Cable disabled");
            Router::new()
        }
    }
}
