//! The Pusher HTTP API (`/apps/{app_id}/...`): how backends publish events
//! and query channels. Every request is authenticated ([`auth`]) and every
//! size and count the caller controls is bounded, with errors that name the
//! limit.

use crate::auth::{authenticate, SignedRequest};
use crate::names::{validate_publish_name, ChannelKind, NAMESPACE, SERVER_TO_USER_PREFIX};
use axum::extract::Path;
use axum::http::Uri;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use herald_core::broker::Full;
use herald_core::config::AppConfig;
use herald_core::hub::{ChannelStats, Hub, StatsFilter};
use herald_core::metrics;
use herald_core::node::Node;
use herald_core::publication::{json_string, Publication};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Channels one `events` call may name (Pusher's limit).
pub const MAX_CHANNELS_PER_EVENT: usize = 100;
/// Events one `batch_events` call may carry (Pusher's limit).
pub const MAX_BATCH_EVENTS: usize = 10;

pub use crate::api_error::ApiError;

type ApiResult = Result<Json<Value>, ApiError>;

pub fn router(node: &Arc<Node>) -> Router<Arc<Node>> {
    Router::new()
        .route("/apps/{app_id}/events", post(events))
        .route("/apps/{app_id}/batch_events", post(batch_events))
        .route("/apps/{app_id}/channels", get(channels))
        .route("/apps/{app_id}/channels/{channel}", get(channel))
        .route("/apps/{app_id}/channels/{channel}/users", get(users))
        .route(
            "/apps/{app_id}/users/{user_id}/terminate_connections",
            post(terminate),
        )
        // Python's `pusher` SDK posts here without the `/apps/{app_id}`
        // prefix; the app is the one the signed `auth_key` names.
        .route(
            "/users/{user_id}/terminate_connections",
            post(terminate_unprefixed),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            node.clone(),
            count_request,
        ))
}

/// Count every API request by endpoint (the route's pattern after the app,
/// e.g. `events`, `channels/:channel`) and status.
/// The app label is the path's app id, except for 404 (the only status for
/// an unknown app id, checked before anything else): a caller cannot grow
/// the number of series by inventing app ids.
async fn count_request(
    axum::extract::State(node): axum::extract::State<Arc<Node>>,
    path: axum::extract::MatchedPath,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let app = app_id_of(&node, req.uri()).unwrap_or_default();
    // "/apps/{app_id}/channels/{channel}" → "channels/:channel".
    let endpoint = path
        .as_str()
        .trim_start_matches("/apps/{app_id}/")
        .trim_start_matches('/')
        .replace('{', ":")
        .replace('}', "");
    let response = next.run(req).await;
    let status = response.status().as_u16();
    let app = if status == 404 { "" } else { app.as_str() };
    metrics::api_request(app, crate::wire::NAME, &endpoint, status);
    response
}

/// An authenticated API request: the app's hub, the body (read within
/// `max_request_size`) and the URI. As an extractor it runs before every
/// handler, so no endpoint can forget the signature check.
pub struct Signed {
    node: Arc<Node>,
    hub: Arc<Hub>,
    body: axum::body::Bytes,
    uri: Uri,
}

impl axum::extract::FromRequest<Arc<Node>> for Signed {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, node: &Arc<Node>) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        // Before the body: only a known app's requests get further (and
        // are counted under its id).
        let Some(app_id) = app_id_of(node, &parts.uri) else {
            return Err(ApiError::new(404, "Unknown app id"));
        };
        let app_id = app_id.as_str();
        let limit = node.config.max_request_size;
        let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
            ApiError::new(
                413,
                format!("Request body is larger than max_request_size ({limit} bytes)"),
            )
        })?;
        let hub = authenticate(
            node,
            &SignedRequest {
                app_id,
                method: parts.method.as_str(),
                path: parts.uri.path(),
                query: parts.uri.query().unwrap_or(""),
                body: &bytes,
            },
        )?;
        Ok(Signed {
            node: node.clone(),
            hub,
            body: bytes,
            uri: parts.uri,
        })
    }
}

/// The app a request is for: the id in `/apps/{app_id}/...`, or for the
/// unprefixed routes the app whose key is the query's `auth_key` (the
/// signature check that follows proves the caller holds its secret).
/// `None` for an unknown app.
fn app_id_of(node: &Node, uri: &Uri) -> Option<String> {
    let path = uri.path();
    if let Some(rest) = path.strip_prefix("/apps/") {
        let id = rest.split('/').next().unwrap_or_default();
        return node.hub_by_id(id).map(|h| h.app.id.clone());
    }
    let key = query_param(uri, "auth_key")?;
    node.hub_by_key(&key).map(|h| h.app.id.clone())
}

fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::new(400, format!("Invalid JSON body: {e}")))
}

fn query_param(uri: &Uri, name: &str) -> Option<String> {
    form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// The attributes asked for with `info=a,b`. `subscription_count` is only
/// answered for apps with subscription counting on: Pusher documents that
/// asking for it while the feature is disabled is an error.
fn info_attributes(
    app: &AppConfig,
    info: Option<&str>,
    allowed: &[&str],
) -> Result<Vec<String>, ApiError> {
    let mut out = Vec::new();
    for attr in info
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        if !allowed.contains(&attr) {
            return Err(ApiError::new(
                400,
                format!(
                    "Unsupported info attribute {attr:?} (supported: {})",
                    allowed.join(", ")
                ),
            ));
        }
        if attr == "subscription_count" && !app.subscription_count {
            return Err(ApiError::new(
                400,
                "info=subscription_count needs subscription counting, which is off for this app \
                 (set subscription_count = true in its config)",
            ));
        }
        out.push(attr.to_owned());
    }
    Ok(out)
}

/// One event to publish, as in `events` and each `batch_events` item.
/// Unknown fields are ignored, as Pusher does: server SDKs add their own
/// (and may add more), and refusing them would break a drop-in switch.
#[derive(Deserialize)]
struct EventRequest {
    name: String,
    data: Value,
    channel: Option<String>,
    channels: Option<Vec<String>>,
    socket_id: Option<String>,
    info: Option<String>,
}

/// An event that passed validation, ready to publish.
#[derive(Debug)]
pub struct Checked {
    pub name: String,
    /// `data` encoded once as a JSON string, as it goes on the wire.
    pub data: Box<serde_json::value::RawValue>,
    pub channels: Vec<String>,
    pub socket_id: Option<String>,
    /// The `info` attributes asked for.
    pub attrs: Vec<String>,
}

/// Parse and validate a `POST events` body against the app's limits.
/// Pure (publishes nothing), so property tests and fuzzing can drive it.
pub fn parse_event(app: &AppConfig, body: &[u8]) -> Result<Checked, ApiError> {
    check(app, parse_body(body)?)
}

/// Parse and validate a whole `POST batch_events` body; one bad item fails
/// the batch before anything is published.
pub fn parse_batch(app: &AppConfig, body: &[u8]) -> Result<Vec<Checked>, ApiError> {
    let req: BatchRequest = parse_body(body)?;
    if req.batch.len() > MAX_BATCH_EVENTS {
        return Err(ApiError::new(
            400,
            format!("A batch may hold at most {MAX_BATCH_EVENTS} events"),
        ));
    }
    if req.batch.iter().any(|e| e.channels.is_some()) {
        return Err(ApiError::new(
            400,
            "Batch events take `channel`, not `channels`",
        ));
    }
    req.batch.into_iter().map(|ev| check(app, ev)).collect()
}

/// Validate an event against the app's limits without publishing it.
fn check(app: &AppConfig, ev: EventRequest) -> Result<Checked, ApiError> {
    if ev.name.is_empty() {
        return Err(ApiError::new(400, "Event name must not be empty"));
    }
    if ev.name.chars().count() > app.max_event_name {
        return Err(ApiError::new(
            400,
            format!(
                "Event name is longer than max_event_name ({} characters)",
                app.max_event_name
            ),
        ));
    }
    if ev.name.starts_with("pusher:") || ev.name.starts_with("pusher_internal:") {
        return Err(ApiError::new(
            400,
            "Event names starting with pusher: are reserved",
        ));
    }
    let Value::String(data) = ev.data else {
        return Err(ApiError::new(
            400,
            "data must be a string (JSON-encode objects first)",
        ));
    };
    if data.len() > app.max_payload {
        return Err(ApiError::new(
            413,
            format!(
                "data is larger than max_payload ({} bytes)",
                app.max_payload
            ),
        ));
    }
    let channels = match (ev.channel, ev.channels) {
        (Some(c), None) => vec![c],
        (None, Some(cs)) => cs,
        _ => {
            return Err(ApiError::new(
                400,
                "Give exactly one of channel or channels",
            ))
        }
    };
    if channels.is_empty() {
        return Err(ApiError::new(400, "channels must not be empty"));
    }
    if channels.len() > MAX_CHANNELS_PER_EVENT {
        return Err(ApiError::new(
            400,
            format!("An event may go to at most {MAX_CHANNELS_PER_EVENT} channels"),
        ));
    }
    for c in &channels {
        validate_publish_name(c, app.max_channel_name)
            .map_err(|e| ApiError::new(400, format!("Invalid channel {c:?}: {e}")))?;
    }
    if let Some(sid) = &ev.socket_id {
        if !is_socket_id(sid) {
            return Err(ApiError::new(400, format!("Invalid socket_id {sid:?}")));
        }
    }
    let attrs = info_attributes(
        app,
        ev.info.as_deref(),
        &["user_count", "subscription_count"],
    )?;
    Ok(Checked {
        name: ev.name,
        data: json_string(&data),
        channels,
        socket_id: ev.socket_id,
        attrs,
    })
}

/// Figures of one channel for the whole cluster (`None`: not occupied).
async fn info(node: &Node, hub: &Hub, name: &str) -> Option<ChannelStats> {
    let exact = StatsFilter::Exact(name.to_owned());
    node.stats(hub, Some(NAMESPACE), exact)
        .await
        .into_iter()
        .next()
}

/// Publish a checked event; returns the `info` reply object (per channel).
/// `Err(Full)`: the broker's outbox is full; the channels before the
/// refused one got the event (a publisher that retries repeats it there).
pub async fn publish(node: &Node, hub: &Hub, ev: Checked) -> Result<Value, Full> {
    for c in &ev.channels {
        let user = c.strip_prefix(SERVER_TO_USER_PREFIX).map(str::to_owned);
        let p = Publication::new(NAMESPACE, c.clone(), ev.name.clone(), ev.data.clone())
            .excluding(ev.socket_id.clone())
            .cached(ChannelKind::of(c).cache)
            .to_user(user);
        node.publish(hub, p).await?;
    }
    if ev.attrs.is_empty() {
        return Ok(json!({}));
    }
    let mut out = Map::new();
    for c in &ev.channels {
        let stats = info(node, hub, c).await;
        out.insert(
            c.clone(),
            Value::Object(attributes_of(c, stats.as_ref(), &ev.attrs)),
        );
    }
    Ok(Value::Object(out))
}

/// The `info` attributes of channel `name` from its figures (`None`: not
/// occupied, so every count is 0). `user_count` exists only for presence
/// channels.
fn attributes_of(name: &str, info: Option<&ChannelStats>, attrs: &[String]) -> Map<String, Value> {
    let mut m = Map::new();
    for a in attrs {
        match a.as_str() {
            "subscription_count" => {
                m.insert(a.clone(), json!(info.map_or(0, |i| i.subscriptions)));
            }
            "user_count" if ChannelKind::of(name).presence => {
                m.insert(a.clone(), json!(info.map_or(0, |i| i.users.len())));
            }
            _ => {}
        }
    }
    m
}

fn is_socket_id(s: &str) -> bool {
    match s.split_once('.') {
        Some((a, b)) => {
            !a.is_empty()
                && !b.is_empty()
                && a.len() + b.len() <= 40
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        }
        None => false,
    }
}

async fn events(
    Signed {
        node, hub, body, ..
    }: Signed,
) -> ApiResult {
    let ev = parse_event(&hub.config(), &body)?;
    let has_info = !ev.attrs.is_empty();
    let info = publish(&node, &hub, ev).await?;
    Ok(Json(if has_info {
        json!({ "channels": info })
    } else {
        info
    }))
}

#[derive(Deserialize)]
struct BatchRequest {
    batch: Vec<EventRequest>,
}

async fn batch_events(
    Signed {
        node, hub, body, ..
    }: Signed,
) -> ApiResult {
    let checked = parse_batch(&hub.config(), &body)?;
    let any_info = checked.iter().any(|e| !e.attrs.is_empty());
    let mut replies = Vec::with_capacity(checked.len());
    for ev in checked {
        let channel = ev.channels[0].clone();
        let info = publish(&node, &hub, ev).await?;
        replies.push(info.get(&channel).cloned().unwrap_or_else(|| json!({})));
    }
    Ok(Json(if any_info {
        json!({ "batch": replies })
    } else {
        json!({})
    }))
}

async fn channels(Signed { node, hub, uri, .. }: Signed) -> ApiResult {
    let prefix = query_param(&uri, "filter_by_prefix").unwrap_or_default();
    let attrs = info_attributes(
        &hub.config(),
        query_param(&uri, "info").as_deref(),
        &["user_count", "subscription_count"],
    )?;
    if attrs.iter().any(|a| a == "user_count") && !prefix.starts_with("presence-") {
        return Err(ApiError::new(
            400,
            "info=user_count requires filter_by_prefix=presence-",
        ));
    }
    let mut out = Map::new();
    // Pusher's namespace only: the app's other protocols' channels are
    // not Pusher's to list.
    let filter = StatsFilter::Prefix(prefix);
    for stats in node.stats(&hub, Some(NAMESPACE), filter).await {
        let m = attributes_of(&stats.name, Some(&stats), &attrs);
        out.insert(stats.name, Value::Object(m));
    }
    Ok(Json(json!({ "channels": out })))
}

async fn channel(
    Path((_, name)): Path<(String, String)>,
    Signed { node, hub, uri, .. }: Signed,
) -> ApiResult {
    let attrs = info_attributes(
        &hub.config(),
        query_param(&uri, "info").as_deref(),
        &["user_count", "subscription_count"],
    )?;
    if attrs.iter().any(|a| a == "user_count") && !ChannelKind::of(&name).presence {
        return Err(ApiError::new(
            400,
            "info=user_count is only available for presence channels",
        ));
    }
    let stats = info(&node, &hub, &name).await;
    let mut m = Map::new();
    m.insert("occupied".into(), json!(stats.is_some()));
    m.extend(attributes_of(&name, stats.as_ref(), &attrs));
    Ok(Json(Value::Object(m)))
}

async fn users(
    Path((_, name)): Path<(String, String)>,
    Signed { node, hub, .. }: Signed,
) -> ApiResult {
    if !ChannelKind::of(&name).presence {
        return Err(ApiError::new(
            400,
            "Users are only available for presence channels",
        ));
    }
    let users: Vec<Value> = info(&node, &hub, &name)
        .await
        .map(|s| s.users)
        .unwrap_or_default()
        .into_iter()
        .map(|id| json!({ "id": id }))
        .collect();
    Ok(Json(json!({ "users": users })))
}

async fn terminate(
    Path((_, user_id)): Path<(String, String)>,
    Signed { node, hub, .. }: Signed,
) -> ApiResult {
    node.terminate_user(&hub, &user_id);
    Ok(Json(json!({})))
}

/// `POST /users/{user_id}/terminate_connections`, as Python's SDK sends it.
async fn terminate_unprefixed(
    Path(user_id): Path<String>,
    Signed { node, hub, .. }: Signed,
) -> ApiResult {
    node.terminate_user(&hub, &user_id);
    Ok(Json(json!({})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_ids() {
        assert!(is_socket_id("123.456"));
        assert!(!is_socket_id("123"));
        assert!(!is_socket_id("a.1"));
        assert!(!is_socket_id(".1"));
    }
}
