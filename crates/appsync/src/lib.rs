//! Herald's AWS AppSync-compatible adapter: the two real-time APIs AppSync
//! offers, on top of the protocol-neutral core, so AppSync clients (Amplify,
//! the Events API's own protocol, the generic pub/sub GraphQL API) only
//! change their host names.
//!
//! ```text
//! session     the upgrade both WebSocket APIs share: subprotocol, API key,
//!   │          app, admission, refusals; per-connection subscriptions
//!   ├ events       /event/realtime (aws-appsync-event-ws): subscribe,
//!   │              publish, unsubscribe; also publishing for POST /event
//!   └ graphql_ws   /graphql, /graphql/realtime (graphql-ws): start, stop
//! graphql     the generic pub/sub schema: parse and check operations
//!   └ nesting    the bracket depth bound, checked before the parser runs
//! http        POST /graphql (publish mutation), POST /event
//! channel     Events channel paths (/ns/a/b, /ns/a/*)
//! auth        API keys from headers, the header query parameter and the
//!             header- subprotocol; namespaces
//! wire        both wire formats (the core's `Wire`s) and control messages
//! ```

pub mod auth;
pub mod channel;
pub mod events;
pub mod graphql;
pub mod graphql_ws;
pub mod http;
pub mod nesting;
pub mod session;
pub mod wire;

use axum::routing::{get, post};
use axum::Router;
use herald_core::node::Node;
use std::sync::Arc;

/// The AppSync routes: both WebSocket APIs and both publish endpoints.
pub fn router() -> Router<Arc<Node>> {
    Router::new()
        .route(
            "/graphql",
            get(session::upgrade_graphql)
                .post(http::post_graphql)
                .options(http::preflight),
        )
        .route("/graphql/realtime", get(session::upgrade_graphql))
        .route("/event/realtime", get(session::upgrade_events))
        .route("/event", post(http::post_event).options(http::preflight))
}
