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
//!   └ auth_modes   Cognito, OIDC, Lambda and IAM per app, namespace and
//!                  operation: auth_jwt (JWKS, RS256/ES256), auth_lambda
//!                  (an HTTP authorizer), auth_iam (SigV4)
//! wire        both wire formats (the core's `Wire`s) and control messages
//! config      each app's `api_keys` and `namespaces`, parsed and checked
//! ```
//!
//! [`AppSync`] is the adapter value the server lists (the core's
//! `herald_core::adapter::Adapter`).

pub mod auth;
pub mod auth_iam;
pub mod auth_jwt;
pub mod auth_lambda;
pub mod auth_modes;
pub mod channel;
pub mod config;
pub mod events;
pub mod graphql;
pub mod graphql_ws;
pub mod http;
pub mod nesting;
pub mod session;
pub mod wire;

use axum::routing::{get, post};
use axum::{Extension, Router};
use herald_core::adapter::{Adapter, Keys, Setting};
use herald_core::config::{Config, ConfigError};
use herald_core::node::Node;
use std::sync::Arc;

/// The AppSync adapter: both real-time APIs and their HTTP publish.
pub struct AppSync;

impl Adapter for AppSync {
    fn name(&self) -> &'static str {
        "appsync"
    }

    fn keys(&self) -> Keys {
        Keys {
            top: &[],
            app: config::APP_KEYS,
        }
    }

    fn settings(&self) -> &'static [Setting] {
        config::SETTINGS
    }

    fn config(&self, config: &Config) -> Result<serde_json::Value, ConfigError> {
        Ok(serde_json::json!({ "apps": config::load(config)? }))
    }

    fn routes(&self, node: &Arc<Node>) -> Router<Arc<Node>> {
        match config::Keys::load(&node.config) {
            Ok(keys) => router(Arc::new(keys)),
            Err(e) => {
                tracing::error!(error = %e, "AppSync disabled");
                Router::new()
            }
        }
    }
}

/// The AppSync routes: both WebSocket APIs and both publish endpoints,
/// with every app's API keys.
pub fn router(keys: Arc<config::Keys>) -> Router<Arc<Node>> {
    herald_core::metrics::register(&auth_modes::AUTH_FAILURES);
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
        .layer(Extension(keys))
}
