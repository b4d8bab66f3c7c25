//! `POST /_broadcast`: the app publishes to streams as it does to AnyCable,
//! `{"stream": "...", "data": "<JSON text>", "meta": {"exclude_socket": sid}}`
//! or an array of such messages. With `rpc.broadcast_key` set the request
//! must carry `Authorization: Bearer <key>` (checked in constant time).
//! Accepted messages go through `node.publish`, so every node's
//! subscribers get them; the answer is 201, as AnyCable's.

use crate::metrics as m;
use crate::session::MAX_STREAM_NAME;
use crate::wire::message_value;
use crate::{channel_of, Cable};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use herald_core::fanout::Publication;
use herald_core::metrics;
use herald_core::node::Node;
use serde::Deserialize;
use std::sync::Arc;
use subtle::ConstantTimeEq;

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

#[derive(Deserialize)]
#[serde(untagged)]
enum Body0 {
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
    let messages = match serde_json::from_slice::<Body0>(&bytes) {
        Ok(Body0::One(m)) => vec![m],
        Ok(Body0::Many(v)) => v,
        Err(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "Body must be {\"stream\": string, \"data\": string, \"meta\"?: object} or an array of them",
            )
        }
    };
    for msg in &messages {
        if msg.stream.is_empty() || msg.stream.len() > MAX_STREAM_NAME {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("stream must be 1 to {MAX_STREAM_NAME} bytes"),
            );
        }
    }
    for msg in messages {
        metrics::count(&m::BROADCASTS);
        let exclude = msg
            .meta
            .and_then(|m| m.exclude_socket)
            .filter(|s| !s.is_empty());
        let p = Publication::new(
            channel_of(&msg.stream),
            String::new(),
            message_value(&msg.data),
        )
        .excluding(exclude);
        node.publish(&cable.hub, p).await;
    }
    StatusCode::CREATED.into_response()
}
