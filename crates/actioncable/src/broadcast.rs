//! `POST /_broadcast`: the app publishes to streams as it does to AnyCable,
//! `{"stream": "...", "data": "<JSON text>", "meta": {"exclude_socket": sid}}`
//! or an array of such messages. With `rpc.broadcast_key` set the request
//! must carry `Authorization: Bearer <key>` (checked in constant time).
//! Accepted messages go through `node.publish_reliably` (with a position
//! on a reliable stream), so every node's subscribers get them; the answer
//! is 201, as AnyCable's.
//!
//! With `rpc.broadcast_adapter` naming `redis` or `nats`, the same messages
//! also arrive on the broker's server (Redis pub/sub channel or NATS
//! subject `rpc.broadcast_channel`, AnyCable's `__anycable__`), as
//! AnyCable's `redis` and `nats` broadcast adapters take them: see
//! [`ingest`]. A body that is a remote command (`{"command":"disconnect",
//! ...}`) is run on every node instead: see [`crate::remote`].

use crate::config::RpcConfig;
use crate::config::MAX_STREAM_NAME;
use crate::metrics as m;
use crate::wire::message_value;
use crate::{Cable, NAMESPACE};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use herald_core::adapter::StreamEntry;
use herald_core::config::BrokerConfig;
use herald_core::hub::Hub;
use herald_core::metrics;
use herald_core::node::Node;
use herald_core::publication::Publication;
use herald_core::reliable::ReliableStreams;
use serde::Deserialize;
use std::sync::Arc;
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;

#[derive(Deserialize)]
struct Message {
    stream: String,
    data: String,
    #[serde(default)]
    meta: Option<Meta>,
}

#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default)]
    exclude_socket: Option<String>,
    // AnyCable's other hints (history, broadcast type) have no meaning here.
    #[serde(flatten)]
    _rest: serde_json::Map<String, serde_json::Value>,
}

/// A broadcast body as sent: one message, or an array of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum Broadcasts {
    One(Message),
    Many(Vec<Message>),
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    metrics::count(&m::BROADCAST_ERRORS);
    (status, Json(serde_json::json!({ "error": message.into() }))).into_response()
}

pub async fn handle(
    State(node): State<Arc<Node>>,
    Extension(cable): Extension<Arc<Cable>>,
    req: Request,
) -> Response {
    if let Some(key) = &cable.broadcast_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
            return error(
                StatusCode::UNAUTHORIZED,
                "Authorization: Bearer <broadcast key> is missing or wrong",
            );
        }
    }
    let limit = node.config.max_request_size;
    let bytes = match axum::body::to_bytes(Body::new(req.into_body()), limit).await {
        Ok(b) => b,
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("Body is larger than {limit} bytes (max_request_size)"),
            )
        }
    };
    if let Some(command) = crate::remote::parse(&bytes) {
        return match command {
            Ok(d) => {
                metrics::count(&m::BROADCASTS);
                node.command(&cable.hub, NAMESPACE, &crate::remote::body(&d));
                StatusCode::CREATED.into_response()
            }
            Err(why) => error(StatusCode::UNPROCESSABLE_ENTITY, why),
        };
    }
    let messages = match parse(&bytes) {
        Ok(m) => m,
        Err((status, message)) => return error(status, message),
    };
    for msg in messages {
        if let Err(full) = node
            .publish_reliably(&cable.hub, &cable.reliable, publication(msg))
            .await
        {
            // The broker's outbox is full: 503 and retry, never a 201 for
            // a message that goes nowhere (those before it went out).
            let mut res = error(StatusCode::SERVICE_UNAVAILABLE, full.to_string());
            res.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                herald_core::broker::Full::RETRY_AFTER.into(),
            );
            return res;
        }
    }
    StatusCode::CREATED.into_response()
}

/// A broadcast body: one message or an array of them, every stream name
/// 1 to [`MAX_STREAM_NAME`] bytes. The error is the HTTP status and what
/// was wrong.
fn parse(bytes: &[u8]) -> Result<Vec<Message>, (StatusCode, String)> {
    let messages = match serde_json::from_slice::<Broadcasts>(bytes) {
        Ok(Broadcasts::One(m)) => vec![m],
        Ok(Broadcasts::Many(v)) => v,
        Err(_) => {
            return Err((
                StatusCode::BAD_REQUEST,
                "Body must be {\"stream\": string, \"data\": string, \"meta\"?: object} or an array of them".into(),
            ))
        }
    };
    for msg in &messages {
        if msg.stream.is_empty() || msg.stream.len() > MAX_STREAM_NAME {
            return Err((
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("stream must be 1 to {MAX_STREAM_NAME} bytes"),
            ));
        }
    }
    Ok(messages)
}

fn publication(msg: Message) -> Publication {
    metrics::count(&m::BROADCASTS);
    let exclude = msg
        .meta
        .and_then(|m| m.exclude_socket)
        .filter(|s| !s.is_empty());
    Publication::new(
        NAMESPACE,
        msg.stream,
        String::new(),
        message_value(&msg.data),
    )
    .excluding(exclude)
}

/// The broker channel (Redis) or subject (NATS) the app's broadcasts also
/// arrive on, when `rpc.broadcast_adapter` names `redis` or `nats`.
pub fn ingress_channel(rpc: &RpcConfig) -> Option<&str> {
    rpc.broadcast_adapter
        .split(',')
        .any(|a| matches!(a.trim(), "redis" | "nats"))
        .then_some(rpc.broadcast_channel.as_str())
}

/// The Redis stream the app's broadcasts also arrive on, when
/// `rpc.broadcast_adapter` names `redisx` (AnyCable's Redis Streams
/// adapter).
pub fn ingress_stream(rpc: &RpcConfig) -> Option<&str> {
    rpc.broadcast_adapter
        .split(',')
        .any(|a| a.trim() == "redisx")
        .then_some(rpc.broadcast_channel.as_str())
}

/// The consumer group every node reads the stream in (AnyCable's).
pub const STREAM_GROUP: &str = "bx";

/// Check that the broadcast adapter matches the broker: `redis` and
/// `redisx` need a Redis `broker.url` (one server, Sentinels or a
/// cluster, with or without TLS), `nats` a `nats://` (or `tls://`) one,
/// since the messages are read from the broker's server.
pub fn check_adapter(rpc: &RpcConfig, broker: &BrokerConfig) -> Result<(), String> {
    let url = broker.url.as_str();
    let redis = [
        "redis://",
        "rediss://",
        "redis-sentinel://",
        "rediss-sentinel://",
        "redis-cluster://",
        "rediss-cluster://",
    ]
    .iter()
    .any(|s| url.starts_with(s));
    for a in rpc.broadcast_adapter.split(',').map(str::trim) {
        let ok = match a {
            "redis" | "redisx" => redis,
            "nats" => url.starts_with("nats://") || url.starts_with("tls://"),
            _ => true,
        };
        if !ok {
            let scheme = if a == "nats" { "nats" } else { "redis" };
            return Err(format!(
                "rpc.broadcast_adapter {a:?} reads broadcasts from the broker's server, but \
                 broker.url is {:?}: set broker.url to a {scheme}:// server (see docs/cluster.md)",
                broker.shown_url()
            ));
        }
    }
    Ok(())
}

/// Take the app's broadcasts from the broker's server (`rx`, raw
/// messages: AnyCable's format, one message or an array) until it closes.
///
/// From a pub/sub channel (`local`): every node subscribes to the channel
/// and so receives every message; each delivers it to its own subscribers
/// only ([`Node::publish_here`]), never through the broker, so each
/// subscriber in the cluster gets it exactly once. (One node taking each
/// message and publishing it through the broker would need the server to
/// hand each message to one subscriber, which Redis pub/sub cannot.)
/// Such messages carry no stream position: every node would append each
/// one to the shared history, N times in an N-node cluster (the adapter
/// warns at start; `http` and `redisx` broadcasts are reliable).
/// From a Redis stream read in a consumer group ([`ingest_stream`]; not
/// `local`): each entry reaches one node, which appends it to the history
/// where the stream is reliable and publishes it to the whole cluster
/// ([`Node::publish_reliably`]).
/// A message that is not a broadcast is counted in
/// `herald_broadcast_errors_total` and logged.
pub async fn ingest(
    node: Arc<Node>,
    hub: Arc<Hub>,
    reliable: Arc<ReliableStreams>,
    mut rx: mpsc::Receiver<Bytes>,
    local: bool,
) {
    while let Some(bytes) = rx.recv().await {
        take(&node, &hub, &reliable, &bytes, local).await;
    }
}

/// [`ingest`] from a Redis stream (`redisx`): each entry is acknowledged
/// in the stream once its publications were taken by the engine; one the
/// engine refuses (its outbox full: `herald_broker_refused_total`) stays
/// pending and is read again, never dropped. (An entry carrying an array
/// refused part way is read again whole: the messages before the refusal
/// go out twice.)
pub async fn ingest_stream(
    node: Arc<Node>,
    hub: Arc<Hub>,
    reliable: Arc<ReliableStreams>,
    mut rx: mpsc::Receiver<StreamEntry>,
) {
    while let Some(entry) = rx.recv().await {
        let taken = take(&node, &hub, &reliable, &entry.payload, false).await;
        entry.answer(taken);
    }
}

/// One message from the broker's server: run, published here (`local`)
/// or to the cluster. False only when the engine refused a publication
/// (the ones before it in the message went out).
async fn take(
    node: &Arc<Node>,
    hub: &Arc<Hub>,
    reliable: &ReliableStreams,
    bytes: &[u8],
    local: bool,
) -> bool {
    if let Some(command) = crate::remote::parse(bytes) {
        match command {
            Ok(d) => {
                metrics::count(&m::BROADCASTS);
                let body = crate::remote::body(&d);
                if local {
                    // Every node reads the channel: each runs it here.
                    node.command_here(&hub.app.id, NAMESPACE.as_str(), &body);
                } else {
                    node.command(hub, NAMESPACE, &body);
                }
            }
            Err(why) => {
                metrics::count(&m::BROADCAST_ERRORS);
                tracing::debug!(error = %why, "broadcast channel: bad remote command; ignored");
            }
        }
        return true;
    }
    match parse(bytes) {
        Ok(messages) => {
            for msg in messages {
                if local {
                    node.publish_here(hub, publication(msg)).await;
                } else {
                    // Refused only while the broker's outbox is full
                    // (counted: herald_broker_refused_total).
                    if node
                        .publish_reliably(hub, reliable, publication(msg))
                        .await
                        .is_err()
                    {
                        return false;
                    }
                }
            }
        }
        Err((_, why)) => {
            metrics::count(&m::BROADCAST_ERRORS);
            tracing::debug!(error = %why, "broadcast channel: not a broadcast; ignored")
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_adapters_take_any_redis_broker_and_nats_only_nats() {
        let rpc = |a: &str| RpcConfig {
            broadcast_adapter: a.into(),
            ..RpcConfig::default()
        };
        let broker = |u: &str| BrokerConfig {
            url: u.into(),
            ..BrokerConfig::default()
        };
        for url in [
            "redis://a:6379",
            "rediss://a:6380",
            "redis-sentinel://a:26379/m",
            "rediss-sentinel://a:26379/m",
            "redis-cluster://a:7000,b:7001",
            "rediss-cluster://a:7000",
        ] {
            for a in ["redis", "redisx", "http,redis,redisx"] {
                assert!(check_adapter(&rpc(a), &broker(url)).is_ok(), "{a} {url}");
            }
            assert!(check_adapter(&rpc("nats"), &broker(url)).is_err(), "{url}");
        }
        for url in ["local", "nats://a:4222", "tls://a:4222"] {
            assert!(check_adapter(&rpc("redis"), &broker(url)).is_err(), "{url}");
            assert!(
                check_adapter(&rpc("redisx"), &broker(url)).is_err(),
                "{url}"
            );
        }
        assert!(check_adapter(&rpc("nats"), &broker("nats://a:4222")).is_ok());
    }
}
