//! The HTTP publish endpoints: `POST /graphql` (the generic pub/sub
//! API's `publish` mutation, and its `getChannel` query) and `POST /event`
//! (the Events API). Both authorize with the `x-api-key` header, read the
//! body whatever its `Content-Type` (AppSync's benchmark sends none),
//! bound its size, and answer errors in AppSync's shapes: GraphQL's
//! `{"data": null, "errors": [...]}` (status 200 for a document that does
//! not fit the schema, as GraphQL servers answer and clients expect; 400
//! for a request that is not GraphQL at all; 401 for a bad key), the Events
//! API's `{"errors": [...]}`, with the error type in an `x-amzn-errortype`
//! header too.

use crate::auth;
use crate::config::{AppKeys, Keys};
use crate::events::{self, MAX_EVENTS, MAX_EVENT_BYTES};
use crate::graphql::{self, channel_json, Operation, Request, RootField};
use crate::graphql_ws::NAMESPACE;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use herald_core::broker::Full;
use herald_core::hub::Hub;
use herald_core::metrics;
use herald_core::node::Node;
use herald_core::publication::{json_string, Publication, Wire};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Largest `POST /event` body: five events of 240 KB and their framing
/// (AWS allows about 1.2 MB per request).
pub const MAX_EVENT_BODY: usize = MAX_EVENTS * (MAX_EVENT_BYTES + 8 * 1024);

/// Headers a browser may send cross-origin: what Amplify sends, and IAM's
/// (such requests are refused, but with an answer the page can read).
const CORS_ALLOW_HEADERS: &str =
    "content-type, x-api-key, x-amz-date, x-amz-user-agent, x-amz-security-token, authorization";

fn reply(status: StatusCode, body: Value, error_type: Option<&str>) -> Response {
    let mut res = (status, axum::Json(body)).into_response();
    let h = res.headers_mut();
    if let Some(t) = error_type.and_then(|t| HeaderValue::from_str(t).ok()) {
        h.insert("x-amzn-errortype", t);
    }
    // Browser apps publish from their own origin, authorized by the API
    // key in a header (no cookies), as they do with AppSync.
    h.insert("access-control-allow-origin", HeaderValue::from_static("*"));
    h.insert(
        "access-control-expose-headers",
        HeaderValue::from_static("x-amzn-errortype"),
    );
    res
}

/// `OPTIONS /graphql`, `OPTIONS /event`: the CORS preflight of a browser
/// publishing from another origin.
pub async fn preflight() -> Response {
    let mut res = StatusCode::NO_CONTENT.into_response();
    let h = res.headers_mut();
    h.insert("access-control-allow-origin", HeaderValue::from_static("*"));
    h.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("POST, OPTIONS"),
    );
    h.insert(
        "access-control-allow-headers",
        HeaderValue::from_static(CORS_ALLOW_HEADERS),
    );
    h.insert("access-control-max-age", HeaderValue::from_static("86400"));
    res
}

/// An error in the Events API's shape (also used before a GraphQL body
/// is parsed, where AppSync answers the same way).
fn error(status: StatusCode, error_type: &str, message: &str) -> Response {
    metrics::count(&metrics::API_ERRORS);
    reply(
        status,
        json!({ "errors": [{ "errorType": error_type, "message": message }] }),
        Some(error_type),
    )
}

fn unauthorized() -> Response {
    error(
        StatusCode::UNAUTHORIZED,
        auth::UNAUTHORIZED,
        auth::UNAUTHORIZED_MESSAGE,
    )
}

/// The app of the request's `x-api-key` (or, for an app with other
/// modes, its host or credential), and the key (empty without one).
// The error is the HTTP answer itself, as for the core's handshake.
#[allow(clippy::result_large_err)]
fn authorize(
    node: &Node,
    keys: &Keys,
    headers: &HeaderMap,
) -> Result<(Arc<Hub>, Arc<AppKeys>, String), Response> {
    let key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    let (hub, app_keys) = match key {
        Some(key) => keys.app_for_key(node, key),
        None => {
            let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
            let object = crate::auth_modes::headers_object(headers);
            crate::auth_modes::app_for(node, keys, &object, host)
        }
    }
    .ok_or_else(unauthorized)?;
    let key = key.unwrap_or_default();
    if !hub.config().enabled {
        return Err(error(
            StatusCode::FORBIDDEN,
            auth::UNAUTHORIZED,
            "App is disabled",
        ));
    }
    if !herald_core::origin::check(headers, &hub.config().origins, &hub.app.id, "appsync") {
        return Err(error(
            StatusCode::FORBIDDEN,
            auth::UNAUTHORIZED,
            herald_core::origin::REFUSED_MESSAGE,
        ));
    }
    Ok((hub, app_keys, key.to_owned()))
}

async fn read_body(body: Body, limit: usize) -> Result<axum::body::Bytes, Response> {
    axum::body::to_bytes(body, limit).await.map_err(|_| {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "BadRequestException",
            &format!("Request body is larger than {limit} bytes"),
        )
    })
}

/// Count an HTTP API request (`herald_api_requests_total`): `app` is the
/// app its API key named, empty when the key named none (so a caller
/// cannot grow the number of series by inventing keys).
fn counted(app: &str, wire: &dyn Wire, endpoint: &str, response: Response) -> Response {
    metrics::api_request(app, wire.name(), endpoint, response.status().as_u16());
    response
}

/// `POST /event`: `{"channel": "/ns/a", "events": ["<json>", ...]}`.
pub async fn post_event(
    State(node): State<Arc<Node>>,
    Extension(keys): Extension<Arc<Keys>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let mut app = String::new();
    let response = event_request(&node, &keys, &headers, body, &mut app).await;
    counted(&app, &crate::wire::EVENTS_WIRE, "event", response)
}

async fn event_request(
    node: &Arc<Node>,
    keys: &Keys,
    headers: &HeaderMap,
    body: Body,
    app: &mut String,
) -> Response {
    let (hub, app_keys, key) = match authorize(node, keys, headers) {
        Ok(x) => x,
        Err(r) => return r,
    };
    app.clone_from(&hub.app.id);
    let bytes = match read_body(body, MAX_EVENT_BODY).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let mut body: Map<String, Value> = match serde_json::from_slice(&bytes) {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequestException",
                "The body must be a JSON object",
            )
        }
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequestException",
                &format!("Invalid JSON body: {e}"),
            )
        }
    };
    let events = body.remove("events");
    let object = crate::auth_modes::headers_object(headers);
    let cred = crate::auth_modes::Credential {
        headers: &object,
        method: "POST",
        path: "/event",
        query: "",
        body: &bytes,
    };
    let by = events::PublishAuth::Http {
        key: &key,
        cred: &cred,
    };
    let request = match events::check_publish(&app_keys, body.get("channel"), events, by).await {
        Ok(r) => r,
        Err((t, m)) => {
            let status = if t == auth::UNAUTHORIZED {
                StatusCode::UNAUTHORIZED
            } else {
                StatusCode::BAD_REQUEST
            };
            return error(status, t, &m);
        }
    };
    let (successful, failed) = events::publish(node, &hub, &request).await;
    if !failed.is_empty() {
        metrics::count(&metrics::API_ERRORS);
    }
    // Nothing went out because the broker's outbox is full: 503, retry.
    if successful.is_empty() && failed.iter().any(|f| f["code"] == 503) {
        let mut res = reply(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "successful": successful, "failed": failed }),
            Some("ServiceUnavailable"),
        );
        res.headers_mut()
            .insert(header::RETRY_AFTER, Full::RETRY_AFTER.into());
        return res;
    }
    reply(
        StatusCode::OK,
        json!({ "successful": successful, "failed": failed }),
        None,
    )
}

/// A GraphQL error answer.
fn graphql_errors(status: StatusCode, errors: Vec<Value>) -> Response {
    metrics::count(&metrics::API_ERRORS);
    let error_type = errors
        .first()
        .and_then(|e| e["errorType"].as_str())
        .map(str::to_owned);
    reply(
        status,
        json!({ "data": null, "errors": errors }),
        error_type.as_deref(),
    )
}

/// `POST /graphql`: the `publish` mutation (several, aliased, are run in
/// order), `__typename`, and the `getChannel` query (null).
pub async fn post_graphql(
    State(node): State<Arc<Node>>,
    Extension(keys): Extension<Arc<Keys>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let mut app = String::new();
    let response = graphql_request(&node, &keys, &headers, body, &mut app).await;
    counted(&app, &crate::wire::GRAPHQL_WIRE, "graphql", response)
}

async fn graphql_request(
    node: &Arc<Node>,
    keys: &Keys,
    headers: &HeaderMap,
    body: Body,
    app: &mut String,
) -> Response {
    let (hub, app_keys, _) = match authorize(node, keys, headers) {
        Ok(x) => x,
        Err(r) => return r,
    };
    app.clone_from(&hub.app.id);
    let bytes = match read_body(body, node.config.max_request_size).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if app_keys.auth.configured {
        let object = crate::auth_modes::headers_object(headers);
        let cred = crate::auth_modes::Credential {
            headers: &object,
            method: "POST",
            path: "/graphql",
            query: "",
            body: &bytes,
        };
        let op = crate::auth_modes::Op::Publish;
        if let Err(d) = crate::auth_modes::authorize(&app_keys, &cred, op, None, None).await {
            return error(StatusCode::UNAUTHORIZED, d.error_type, &d.message);
        }
    }
    let request: Request = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => {
            return graphql_errors(
                StatusCode::BAD_REQUEST,
                vec![json!({
                    "errorType": "MalformedHttpRequestException",
                    "message": format!("The body must be a JSON object with a `query`: {e}"),
                })],
            )
        }
    };
    // A request that is not a GraphQL request is a 400; a document that
    // does not fit the schema (syntax, validation) is answered as GraphQL
    // does, 200 with `errors`, which is what clients read them from.
    let op = match graphql::parse(&request) {
        Ok(op) => op,
        Err(e) => {
            let status = if e.error_type == "BadRequestException" {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::OK
            };
            return graphql_errors(status, vec![e.to_json()]);
        }
    };
    let roots = match op {
        Operation::Mutation(r) | Operation::Query(r) => r,
        Operation::Subscribe(_) => {
            return graphql_errors(
                StatusCode::OK,
                vec![json!({
                    "errorType": "UnsupportedOperation",
                    "message": "subscriptions are served over the WebSocket (/graphql/realtime)",
                })],
            )
        }
    };
    let mut data = Map::new();
    for field in roots {
        match field {
            RootField::Typename { key, type_name } => {
                data.insert(key, Value::String(type_name.into()));
            }
            RootField::Null { key } => {
                data.insert(key, Value::Null);
            }
            RootField::Publish {
                key,
                name,
                data: payload,
                fields,
            } => {
                let body = json_string(&payload);
                let p = Publication::new(NAMESPACE, name.clone(), "publish".into(), body);
                if let Err(full) = node.publish(&hub, p).await {
                    let mut res = graphql_errors(
                        StatusCode::SERVICE_UNAVAILABLE,
                        vec![json!({
                            "errorType": "ServiceUnavailable",
                            "message": full.to_string(),
                        })],
                    );
                    res.headers_mut()
                        .insert(header::RETRY_AFTER, Full::RETRY_AFTER.into());
                    return res;
                }
                data.insert(key, channel_json(&name, &payload, &fields));
            }
        }
    }
    reply(StatusCode::OK, json!({ "data": data }), None)
}
