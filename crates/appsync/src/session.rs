//! What both AppSync WebSocket APIs share: the upgrade (subprotocol, API
//! key, app, admission), the refusal of a connection in AppSync's words,
//! and the per-connection subscription registry. Each API's messages are
//! its own [`Handler`] (`events`, `graphql_ws`); the socket itself is the
//! core's session loop.

use crate::auth;
use crate::config::{AppKeys, Keys};
use crate::wire;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use herald_core::connection::{Connection, Reason};
use herald_core::frame::Frame;
use herald_core::hub::{Hub, Refused, SubscribeOptions};
use herald_core::namespace::Namespace;
use herald_core::node::Node;
use herald_core::publication::{Tag, Wire};
use herald_core::session::{self, Closing, Why};
use herald_core::ws::{Incoming, Socket};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// Longest subscription or publish id a client may choose, in bytes
/// (clients send UUIDs).
pub const MAX_ID_BYTES: usize = 128;

/// The error type of a subscription the node could not confirm in time
/// because the cluster's broker did not hold its interest: temporary,
/// subscribe again (`subscribe_error` on Events, `error` on GraphQL).
pub const UNAVAILABLE: &str = "ServiceUnavailableException";

/// How long a refused connection waits for the client's first message
/// before answering: clients send `connection_init` first and listen for
/// the answer only then.
const REFUSE_WAIT: Duration = Duration::from_secs(5);

/// Which of the two APIs a socket speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Graphql,
    Events,
}

impl Api {
    pub fn subprotocol(self) -> &'static str {
        match self {
            Api::Graphql => "graphql-ws",
            Api::Events => "aws-appsync-event-ws",
        }
    }

    pub fn wire(self) -> &'static dyn Wire {
        match self {
            Api::Graphql => &wire::GRAPHQL_WIRE,
            Api::Events => &wire::EVENTS_WIRE,
        }
    }

    /// The HTTP path a SigV4 signature of this API's WebSocket covers
    /// (Amplify signs its connection as a POST to `/event` or
    /// `/graphql/connect`, its messages to `/event` or `/graphql`).
    pub fn signed_path(self, connect: bool) -> &'static str {
        match (self, connect) {
            (Api::Events, _) => "/event",
            (Api::Graphql, true) => "/graphql/connect",
            (Api::Graphql, false) => "/graphql",
        }
    }

    fn connection_error(self, error_type: &str, message: &str, code: u16) -> String {
        match self {
            Api::Graphql => wire::graphql_connection_error(error_type, message, code),
            Api::Events => wire::events_connection_error(error_type, message, code),
        }
    }
}

/// `GET /graphql` and `GET /graphql/realtime`.
pub async fn upgrade_graphql(
    State(node): State<Arc<Node>>,
    Extension(keys): Extension<Arc<Keys>>,
    req: Request,
) -> Response {
    upgrade(node, keys, req, Api::Graphql)
}

/// `GET /event/realtime`.
pub async fn upgrade_events(
    State(node): State<Arc<Node>>,
    Extension(keys): Extension<Arc<Keys>>,
    req: Request,
) -> Response {
    upgrade(node, keys, req, Api::Events)
}

/// Upgrade first, then check: AppSync clients act on `connection_error`
/// messages (an HTTP error at the upgrade makes Amplify retry for seconds).
fn upgrade(node: Arc<Node>, keys: Arc<Keys>, req: Request, api: Api) -> Response {
    if node.is_draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "Server is draining").into_response();
    }
    let offered = auth::subprotocols(req.headers());
    let speaks = offered.iter().any(|p| p == api.subprotocol());
    let headers = auth::upgrade_headers(&offered, req.uri().query());
    let http_host = req
        .headers()
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // permessage-deflate: the server's switch and, where an API key in the
    // upgrade names an app already, that app's.
    let app_key = headers
        .as_ref()
        .ok()
        .and_then(|h| auth::api_key_of(h.as_ref()?));
    let deflate = match app_key {
        Some(k) => keys
            .app_for_key(&node, &k)
            .is_none_or(|(hub, _)| node.config.compression(&hub.config())),
        None => node.config.websocket_compression,
    };
    // The page's origin, checked once the app is known (below).
    let origin: axum::http::HeaderMap = req
        .headers()
        .get_all(axum::http::header::ORIGIN)
        .iter()
        .map(|v| (axum::http::header::ORIGIN, v.clone()))
        .collect();
    let subprotocol = [api.subprotocol()];
    herald_core::ws::upgrade(req, &subprotocol, deflate, move |socket, _| async move {
        if !speaks {
            let msg = format!(
                "SubProtocolNotSupported: offer the WebSocket subprotocol {:?}",
                api.subprotocol()
            );
            return refuse(
                socket,
                api.connection_error("BadRequestException", &msg, 400),
            )
            .await;
        }
        let headers = match headers {
            Ok(h) => h.unwrap_or_default(),
            Err(why) => {
                return refuse(
                    socket,
                    api.connection_error("BadRequestException", why, 400),
                )
                .await
            }
        };
        let key = auth::api_key_of(&headers);
        let found = match &key {
            Some(k) => keys.app_for_key(&node, k),
            None => crate::auth_modes::app_for(&node, &keys, &headers, http_host.as_deref()),
        };
        let Some((hub, app_keys)) = found else {
            let message = if key.is_none()
                && !headers
                    .keys()
                    .any(|k| k.eq_ignore_ascii_case("authorization"))
            {
                "Missing API key: send x-api-key in the header query parameter or a header- subprotocol"
            } else {
                auth::UNAUTHORIZED_MESSAGE
            };
            let error = api.connection_error(auth::UNAUTHORIZED, message, 401);
            return refuse(socket, error).await;
        };
        // A page the app does not list, refused as a bad key is.
        if !herald_core::origin::check(
            &origin,
            &hub.config().origins,
            &hub.app.id,
            api.wire().name(),
        ) {
            let error = api.connection_error(
                auth::UNAUTHORIZED,
                herald_core::origin::REFUSED_MESSAGE,
                403,
            );
            return refuse(socket, error).await;
        }
        if app_keys.auth.configured {
            let cred = crate::auth_modes::Credential {
                headers: &headers,
                method: "POST",
                path: api.signed_path(true),
                query: "",
                body: b"{}",
            };
            let op = crate::auth_modes::Op::Connect;
            if let Err(d) = crate::auth_modes::authorize(&app_keys, &cred, op, None, None).await {
                let error = api.connection_error(d.error_type, &d.message, 401);
                return refuse(socket, error).await;
            }
        }
        let key = key.unwrap_or_default();
        if let Err(e) = hub.admit() {
            let error = match e {
                Refused::OverLimit(m) => api.connection_error("LimitExceededException", &m, 429),
                other => api.connection_error(auth::UNAUTHORIZED, &other.to_string(), 401),
            };
            return refuse(socket, error).await;
        }
        // Kept only where other modes may need them (an API key alone
        // needs nothing more than the key: connections stay small).
        let auth_headers = app_keys.auth.configured.then(|| Arc::new(headers));
        run(node, hub, app_keys, socket, key, auth_headers, api).await
    })
}

/// Refuse an upgraded connection: wait (bounded) for the client's first
/// message, answer with `error` (a `connection_error`) and close.
async fn refuse(mut socket: Socket, error: String) {
    let _ = tokio::time::timeout(REFUSE_WAIT, async {
        let mut decoder = socket.decoder(64 * 1024);
        let mut buf = [0u8; 2048];
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => decoder.feed(&buf[..n]),
            }
            while let Some(m) = decoder.next() {
                if !matches!(m, Ok(Incoming::Ping(_)) | Ok(Incoming::Pong)) {
                    return;
                }
            }
        }
    })
    .await;
    let frames = [
        Frame::text(&error),
        Frame::close(1008, "Connection refused"),
    ];
    session::refuse(socket, &frames).await;
}

async fn run(
    node: Arc<Node>,
    hub: Arc<Hub>,
    keys: Arc<AppKeys>,
    socket: Socket,
    key: String,
    auth_headers: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    api: Api,
) {
    let (id, socket_id) = node.next_connection();
    let session::Opened {
        conn,
        settings,
        shutdown,
    } = session::open(&node, &hub, id, socket_id, api.wire());
    let base = Base {
        node,
        hub,
        keys,
        conn: conn.clone(),
        key,
        auth_headers,
        subs: HashMap::new(),
    };
    match api {
        Api::Events => {
            let h = crate::events::EventsSession::new(base);
            session::run(socket, conn, h, settings, shutdown).await
        }
        Api::Graphql => {
            let h = crate::graphql_ws::GraphqlSession::new(base);
            session::run(socket, conn, h, settings, shutdown).await
        }
    }
    // Dropping the handler released the connection (see `Drop for Base`).
}

/// One subscription of a connection.
struct Sub {
    ns: Namespace,
    channel: String,
    pattern: bool,
    tag: Tag,
}

/// A subscription the core or Herald's limits refused.
#[derive(Debug)]
pub struct SubscribeError {
    pub error_type: &'static str,
    pub message: String,
}

/// Per-connection state both APIs share.
pub struct Base {
    pub node: Arc<Node>,
    pub hub: Arc<Hub>,
    /// The app's API keys and namespaces.
    pub keys: Arc<AppKeys>,
    pub conn: Arc<Connection>,
    /// The API key the connection was opened with (used when a message
    /// carries no `authorization` of its own).
    pub key: String,
    /// The headers the connection was opened with, for an app with other
    /// modes (what a message without its own `authorization` authorizes
    /// with).
    pub auth_headers: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    subs: HashMap<String, Sub>,
}

impl Base {
    /// The key a message authorizes with: its own, or the connection's.
    pub fn key_for<'a>(&'a self, own: &'a Option<String>) -> &'a str {
        own.as_deref().unwrap_or(&self.key)
    }

    pub fn send(&self, text: &str) {
        self.conn.send(Frame::text(text));
    }

    /// Subscribe under the client's `id`. The acknowledgement is queued by
    /// the hub (the wire's answer to `Subscribed`), before any data.
    pub async fn subscribe(
        &mut self,
        id: &str,
        ns: Namespace,
        channel: String,
        pattern: bool,
        tag: String,
    ) -> Result<(), SubscribeError> {
        if self.subs.contains_key(id) {
            return Err(SubscribeError {
                error_type: "BadRequestException",
                message: "A subscription with this id already exists on this connection".into(),
            });
        }
        let max = self.hub.config().max_subscriptions_per_connection as usize;
        if self.subs.len() >= max {
            return Err(SubscribeError {
                error_type: "LimitExceededException",
                message: format!("Subscription limit reached: at most {max} per connection"),
            });
        }
        let tag: Tag = Some(Arc::from(tag));
        let opts = SubscribeOptions {
            tag: tag.clone(),
            pattern,
            ..SubscribeOptions::default()
        };
        match self
            .node
            .subscribe(&self.hub, &self.conn, ns, &channel, opts)
            .await
        {
            Ok(_) => {
                self.subs.insert(
                    id.to_owned(),
                    Sub {
                        ns,
                        channel,
                        pattern,
                        tag,
                    },
                );
                Ok(())
            }
            Err(e) => Err(SubscribeError {
                error_type: match e {
                    Refused::Unauthorized(_) => auth::UNAUTHORIZED,
                    Refused::OverLimit(_) => "LimitExceededException",
                    // Retryable: subscribe again.
                    Refused::Unavailable(_) => UNAVAILABLE,
                    _ => "BadRequestException",
                },
                message: e.to_string(),
            }),
        }
    }

    /// Whether the connection has no subscription (the session's
    /// [`herald_core::session::Handler::idle`]).
    pub fn is_empty(&self) -> bool {
        self.subs.is_empty()
    }

    /// Drop the subscription `id`; false if there is none.
    pub fn unsubscribe(&mut self, id: &str) -> bool {
        match self.subs.remove(id) {
            Some(s) => {
                let (hub, conn) = (&self.hub, &self.conn);
                self.node
                    .unsubscribe(hub, conn, s.ns, &s.channel, &s.tag, s.pattern);
                true
            }
            None => false,
        }
    }

    /// Leave every subscription. Idempotent: runs when the loop ends and
    /// again on drop.
    pub fn cleanup(&mut self) {
        for (_, s) in std::mem::take(&mut self.subs) {
            let (hub, conn) = (&self.hub, &self.conn);
            self.node
                .unsubscribe(hub, conn, s.ns, &s.channel, &s.tag, s.pattern);
        }
    }

    /// The close both APIs send for `why`; `error` wraps a message in the
    /// API's error shape for the last frame.
    pub fn closing(&self, why: &Why, error: impl Fn(&str, &str) -> String) -> Closing {
        let max = self.hub.config().max_messages_per_second;
        let (code, message, last) = match why {
            Why::Reason(Reason::SlowConsumer) => (
                1008,
                "Client too slow: its outbound queue filled up; reconnect".to_owned(),
                None,
            ),
            Why::Reason(Reason::Terminated) => (1008, "Connection terminated".to_owned(), None),
            Why::Reason(Reason::AppClosed) => {
                (1008, "App is disabled".to_owned(), Some(auth::UNAUTHORIZED))
            }
            Why::Reason(Reason::ShuttingDown) => {
                (1001, "Server is shutting down; reconnect".to_owned(), None)
            }
            Why::Reason(Reason::KeepAliveTimeout) => (1001, "Keep-alive timeout".to_owned(), None),
            // AppSync's clients close a socket once its last subscription
            // ends; one that never had any and stays silent is closed
            // normally (see the server's `ws_idle_timeout`).
            Why::Reason(Reason::Idle) => (
                1000,
                format!(
                    "Idle: no subscription and no message for {} s",
                    self.node.config.ws_idle_timeout
                ),
                None,
            ),
            Why::Reason(Reason::RateLimited) => (
                1008,
                format!("Too many messages: the limit is {max} per second"),
                Some("LimitExceededException"),
            ),
            Why::Reason(Reason::Code(c)) => (*c, "Connection closed".to_owned(), None),
            Why::Protocol(e) => (e.close_code(), e.to_string(), None),
            Why::Binary => (
                1003,
                "Binary frames are not supported".to_owned(),
                Some("BadRequestException"),
            ),
            Why::Said(c, m) => (*c, m.clone(), None),
        };
        Closing {
            last: last.map(|t| Frame::text(&error(t, &message))),
            code,
            message,
        }
    }
}

/// Unregistering happens on drop, so even a session that ends abnormally
/// leaves no stale entry in the hub and gives its connection slot back.
impl Drop for Base {
    fn drop(&mut self) {
        self.cleanup();
        self.hub.release();
    }
}

/// A client's id: a non-empty string of at most [`MAX_ID_BYTES`].
pub fn check_id(id: Option<&serde_json::Value>) -> Result<&str, &'static str> {
    match id {
        Some(serde_json::Value::String(s)) if !s.is_empty() && s.len() <= MAX_ID_BYTES => Ok(s),
        Some(serde_json::Value::String(_)) => Err("`id` must be 1-128 bytes"),
        _ => Err("Missing `id`: a string naming the subscription or publish"),
    }
}

/// A random UUID (v4), for event identifiers.
pub fn uuid() -> String {
    let b: [u8; 16] = rand::random();
    let mut b = b;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A client message decoded as `M`, or what is wrong with it (the text of
/// the `BadRequestException` both protocols answer with).
pub(crate) fn parse_message<M: serde::de::DeserializeOwned>(text: &str) -> Result<M, String> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v @ serde_json::Value::Object(_)) => {
            serde_json::from_value(v).map_err(|e| format!("Invalid message: {e}"))
        }
        Ok(_) => Err("A message must be a JSON object".into()),
        Err(e) => Err(format!("Invalid JSON: {e}")),
    }
}
