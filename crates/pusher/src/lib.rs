//! Herald's Pusher Channels v7 adapter: everything Pusher-specific, on top
//! of the protocol-neutral core.
//!
//! ```text
//! session   /app/{key}: the connection handshake, client commands → node
//!   ├ names          what a channel name means (private-, presence-, cache-,
//!   │                #server-to-user-) and which names are valid
//!   ├ presence_data  the signed `channel_data` of a presence subscription
//!   └ signing        HMAC channel/user auth, constant-time checks
//! api       /apps/{id}/...: the HTTP API (events, batches, channel queries,
//!   ├ auth           terminate) and its request signatures
//!   └ api_error      its error answer (status, message; 503 with Retry-After)
//! xhr       pusher-js's HTTP transports (xhr_streaming, xhr_polling):
//!           the same session on the core's relay instead of a socket
//! wire      parse/encode Pusher frames, error codes; the core's `Wire`
//! webhooks  Pusher-compatible webhooks from the core's observers
//!   ├ config       `webhook_*` and each app's `webhooks`, parsed and checked
//!   └ metrics      webhook deliveries, failures, drops, queues
//! ```
//!
//! [`Pusher`] is the adapter value the server lists (the core's
//! `herald_core::adapter::Adapter`).

pub mod api;
pub mod api_error;
pub mod auth;
pub mod config;
pub mod metrics;
pub mod names;
pub mod presence_data;
pub mod session;
pub mod webhooks;
pub mod wire;
pub mod xhr;

/// HMAC channel and user auth, API signatures (shared with `herald bench`).
pub use herald_signing as signing;

use axum::routing::get;
use axum::Router;
use herald_core::adapter::{Adapter, Context, Keys};
use herald_core::config::{Config, ConfigError};
use herald_core::node::Node;
use std::sync::Arc;

/// The Pusher Channels adapter: `/app/{key}`, the HTTP API, webhooks.
pub struct Pusher;

impl Adapter for Pusher {
    fn name(&self) -> &'static str {
        "pusher"
    }

    fn keys(&self) -> Keys {
        Keys {
            top: config::TOP_KEYS,
            app: config::APP_KEYS,
        }
    }

    fn config(&self, config: &Config) -> Result<serde_json::Value, ConfigError> {
        Ok(config::PusherConfig::load(config)?.shown())
    }

    fn routes(&self, node: &Arc<Node>) -> Router<Arc<Node>> {
        metrics::describe();
        router(node)
    }

    /// Webhooks: an observer on the node (flushed by the core on
    /// shutdown, within the grace period) and a worker per app.
    fn start(&self, node: &Arc<Node>, _cx: &Context<'_>) -> Result<(), String> {
        let config = config::PusherConfig::load(&node.config).map_err(|e| e.to_string())?;
        webhooks::start(node, &config);
        Ok(())
    }
}

/// The Pusher routes: the WebSocket endpoint, pusher-js's HTTP transports
/// and the HTTP API.
pub fn router(node: &Arc<Node>) -> Router<Arc<Node>> {
    // The server checked the configuration before it got here.
    let http = config::PusherConfig::load(&node.config)
        .map(|c| c.http)
        .unwrap_or_default();
    Router::new()
        .route("/app/{key}", get(session::upgrade))
        .merge(xhr::router(node, http))
        .merge(api::router(node))
}
