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
//!   └ auth           terminate) and its request signatures
//! wire      parse/encode Pusher frames, error codes; the core's `Wire`
//! webhooks  Pusher-compatible webhooks from the core's observers
//! ```

pub mod api;
pub mod auth;
pub mod names;
pub mod presence_data;
pub mod session;
pub mod webhooks;
pub mod wire;

/// HMAC channel and user auth, API signatures (shared with `herald bench`).
pub use herald_signing as signing;

use axum::routing::get;
use axum::Router;
use herald_core::node::Node;
use std::sync::Arc;

/// The Pusher routes: the WebSocket endpoint and the HTTP API.
pub fn router() -> Router<Arc<Node>> {
    Router::new()
        .route("/app/{key}", get(session::upgrade))
        .merge(api::router())
}
