//! The Events API over WebSocket (`/event/realtime`,
//! `aws-appsync-event-ws`): `connection_init` → `connection_ack` + `ka`,
//! `subscribe` → `subscribe_success`/`subscribe_error`, `data` per event,
//! `publish` → `publish_success`/`publish_error`, `unsubscribe` →
//! `unsubscribe_success`/`unsubscribe_error`; anything else an `error`.
//! Also the publishing both the socket and `POST /event` share.

use crate::auth::{self, Action};
use crate::auth_modes::{self, Op};
use crate::channel::{self, ChannelPath};
use crate::config::AppKeys;
use crate::session::{check_id, parse_message, uuid, Base};
use crate::wire;
use herald_core::frame::Frame;
use herald_core::hub::Hub;
use herald_core::metrics;
use herald_core::namespace::Namespace;
use herald_core::node::Node;
use herald_core::publication::Publication;
use herald_core::session::{Closing, Handler, KeepAlive, Next, Why};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// The hub namespace of Events channels (`/ns/a/b`): their own, apart
/// from the GraphQL API's names and every other protocol's.
pub const NAMESPACE: Namespace = Namespace::new("appsync-events");

/// Most events in one publish (AWS's fixed limit).
pub const MAX_EVENTS: usize = 5;
/// Largest event, in bytes of its JSON text (AWS's 240 KB).
pub const MAX_EVENT_BYTES: usize = 240 * 1024;

/// A message from an Events client. Unknown fields (Amplify's duplicate
/// `payload`) are ignored.
#[derive(Deserialize)]
struct Message {
    #[serde(rename = "type")]
    ty: Option<String>,
    id: Option<Value>,
    channel: Option<Value>,
    events: Option<Value>,
    authorization: Option<Value>,
}

/// The API key in a message's `authorization` object, if any.
pub fn own_key(authorization: Option<&Value>) -> Option<String> {
    match authorization {
        Some(Value::Object(m)) => auth::api_key_of(m),
        _ => None,
    }
}

pub struct EventsSession {
    base: Base,
}

impl EventsSession {
    pub fn new(base: Base) -> EventsSession {
        EventsSession { base }
    }

    fn error(&self, kind: &str, id: Option<&str>, error_type: &str, message: &str) {
        metrics::count(&metrics::BAD_MESSAGES);
        self.base
            .send(&wire::events_error(kind, id, error_type, message));
    }

    async fn subscribe(&mut self, m: Message) {
        let id = match check_id(m.id.as_ref()) {
            Ok(id) => id.to_owned(),
            Err(e) => return self.subscribe_error(None, "BadRequestException", e),
        };
        let Some(Value::String(path)) = &m.channel else {
            return self.subscribe_error(Some(&id), "BadRequestException", "Missing `channel`");
        };
        let ch = match channel::parse_subscribe(path) {
            Ok(c) => c,
            Err(e) => return self.subscribe_error(Some(&id), "BadRequestException", &e.0),
        };
        let body = auth_modes::signed_message_body(m.channel.as_ref(), None);
        let own = m.authorization.as_ref();
        if let Err(d) = self
            .base
            .authorize(own, Op::Subscribe, ch.namespace(), path, "/event", &body)
            .await
        {
            return self.subscribe_error(Some(&id), d.error_type, &d.message);
        }
        let tag = wire::events_tag(&id);
        if let Err(e) = self
            .base
            .subscribe(&id, NAMESPACE, ch.name, ch.wildcard, tag)
            .await
        {
            self.subscribe_error(Some(&id), e.error_type, &e.message);
        }
    }

    fn subscribe_error(&self, id: Option<&str>, error_type: &str, message: &str) {
        metrics::count(&metrics::SUBSCRIPTION_ERRORS);
        self.base.send(&wire::events_error(
            "subscribe_error",
            id,
            error_type,
            message,
        ));
    }

    async fn publish(&mut self, m: Message) {
        let id = match check_id(m.id.as_ref()) {
            Ok(id) => id.to_owned(),
            Err(e) => return self.error("publish_error", None, "BadRequestException", e),
        };
        let body = auth_modes::signed_message_body(m.channel.as_ref(), m.events.as_ref());
        let by = PublishAuth::Session {
            base: &self.base,
            own: m.authorization.as_ref(),
            body: &body,
        };
        let request = match check_publish(&self.base.keys, m.channel.as_ref(), m.events, by).await {
            Ok(r) => r,
            Err((error_type, message)) => {
                return self.error("publish_error", Some(&id), error_type, &message)
            }
        };
        let (successful, failed) = publish(&self.base.node, &self.base.hub, &request).await;
        if successful.is_empty() {
            metrics::count(&metrics::BAD_MESSAGES);
            let errors: Vec<Value> = failed
                .iter()
                .map(|f| {
                    wire::error_object("BadRequestException", f["message"].as_str().unwrap_or(""))
                })
                .collect();
            let reply =
                json!({ "type": "publish_error", "id": id, "errors": errors, "failed": failed });
            return self.base.send(&reply.to_string());
        }
        let reply = json!({
            "type": "publish_success",
            "id": id,
            "successful": successful,
            "failed": failed,
        });
        self.base.send(&reply.to_string());
    }

    fn unsubscribe(&mut self, m: Message) {
        let id = match check_id(m.id.as_ref()) {
            Ok(id) => id.to_owned(),
            Err(e) => return self.error("unsubscribe_error", None, "BadRequestException", e),
        };
        if self.base.unsubscribe(&id) {
            self.base
                .send(&json!({ "type": "unsubscribe_success", "id": id }).to_string());
        } else {
            self.error(
                "unsubscribe_error",
                Some(&id),
                "BadRequestException",
                "No subscription with this id on this connection",
            );
        }
    }
}

impl Handler for EventsSession {
    fn app_id(&self) -> &str {
        &self.base.hub.app.id
    }

    async fn on_text(&mut self, text: String) -> Next {
        let m: Message = match parse_message(&text) {
            Ok(m) => m,
            Err(why) => {
                self.error("error", None, "BadRequestException", &why);
                return Next::Continue;
            }
        };
        match m.ty.as_deref() {
            Some("connection_init") => {
                self.base.send(&wire::events_ack());
                self.base.send(wire::KA);
            }
            Some("subscribe") => self.subscribe(m).await,
            Some("publish") => self.publish(m).await,
            Some("unsubscribe") => self.unsubscribe(m),
            Some(other) => {
                let shown: String = other.chars().take(64).collect();
                let id = m.id.as_ref().and_then(Value::as_str);
                self.error(
                    "error",
                    id,
                    "UnsupportedOperation",
                    &format!("Unknown message type {shown:?}"),
                )
            }
            None => self.error("error", None, "BadRequestException", "Missing `type`"),
        }
        Next::Continue
    }

    fn idle(&self) -> bool {
        self.base.is_empty()
    }

    fn keepalive(&self) -> KeepAlive {
        KeepAlive::Every(self.base.node.config.keepalive_interval())
    }

    fn keepalive_frame(&mut self) -> Option<Frame> {
        Some(Frame::text(wire::KA))
    }

    fn closing(&mut self, why: &Why) -> Closing {
        self.base
            .closing(why, |t, m| wire::events_error("error", None, t, m))
    }

    async fn on_close(&mut self) {
        self.base.cleanup();
    }
}

/// A publish request that passed the request-wide checks.
pub struct PublishRequest {
    pub channel: ChannelPath,
    pub events: Vec<Box<RawValue>>,
}

/// Who a publish is authorized as.
pub enum PublishAuth<'a> {
    /// A WebSocket message: its own `authorization`, else the
    /// connection's; `body` is what a SigV4 signature of it covers.
    Session {
        base: &'a crate::session::Base,
        own: Option<&'a Value>,
        body: &'a str,
    },
    /// An HTTP publish: its API key, and the whole request.
    Http {
        key: &'a str,
        cred: &'a auth_modes::Credential<'a>,
    },
}

/// Request-wide checks of a publish (socket or HTTP): a concrete channel
/// path, the namespace and key, 1 to [`MAX_EVENTS`] events in an array.
/// `Err` is (errorType, message).
pub async fn check_publish(
    keys: &AppKeys,
    channel: Option<&Value>,
    events: Option<Value>,
    by: PublishAuth<'_>,
) -> Result<PublishRequest, (&'static str, String)> {
    let bad = |m: &str| ("BadRequestException", m.to_owned());
    let Some(Value::String(path)) = channel else {
        return Err(bad("Missing `channel`"));
    };
    let channel = channel::parse_publish(path).map_err(|e| ("BadRequestException", e.0))?;
    let ns = channel.namespace();
    match by {
        PublishAuth::Session { base, own, body } => {
            base.authorize(own, Op::Publish, ns, path, "/event", body)
                .await
        }
        PublishAuth::Http { cred, .. } if keys.auth.configured => {
            auth_modes::authorize(keys, cred, Op::Publish, Some(ns), Some(path)).await
        }
        PublishAuth::Http { key, .. } => auth::check_namespace(keys, ns, Action::Publish, key),
    }
    .map_err(|d| (d.error_type, d.message))?;
    let Some(Value::Array(items)) = events else {
        return Err(bad("`events` must be an array of JSON strings"));
    };
    if items.is_empty() || items.len() > MAX_EVENTS {
        return Err(bad(&format!("A publish carries 1 to {MAX_EVENTS} events")));
    }
    // Each item back to its JSON text: a string stays the literal the
    // client sent (it is checked per event).
    let events = items
        .into_iter()
        .map(|v| RawValue::from_string(v.to_string()).expect("serialized JSON is valid"))
        .collect();
    Ok(PublishRequest { channel, events })
}

/// Publish each valid event; returns AppSync's `successful` and `failed`
/// lists (`identifier`, `index`, and for failures `code` and `message`).
/// An event the broker's outbox had no room for fails with code 503.
pub async fn publish(node: &Node, hub: &Hub, req: &PublishRequest) -> (Vec<Value>, Vec<Value>) {
    let mut successful = Vec::new();
    let mut failed = Vec::new();
    for (index, raw) in req.events.iter().enumerate() {
        let identifier = uuid();
        match check_event(raw) {
            Ok(()) => {
                let p = Publication::new(
                    NAMESPACE,
                    req.channel.name.clone(),
                    String::new(),
                    raw.clone(),
                );
                match node.publish(hub, p).await {
                    Ok(()) => successful.push(json!({ "identifier": identifier, "index": index })),
                    Err(full) => failed.push(json!({
                        "identifier": identifier,
                        "index": index,
                        "code": 503,
                        "message": full.to_string(),
                    })),
                }
            }
            Err(message) => failed.push(json!({
                "identifier": identifier,
                "index": index,
                "code": 400,
                "message": message,
            })),
        }
    }
    (successful, failed)
}

/// An event is a JSON string holding valid JSON, at most
/// [`MAX_EVENT_BYTES`] of it.
fn check_event(raw: &RawValue) -> Result<(), String> {
    let text: String = serde_json::from_str(raw.get())
        .map_err(|_| "An event must be a string holding JSON (a stringified value)".to_owned())?;
    if text.len() > MAX_EVENT_BYTES {
        return Err(format!("An event is larger than {MAX_EVENT_BYTES} bytes"));
    }
    if text.is_empty() {
        return Err("An event must not be empty".into());
    }
    serde_json::from_str::<serde::de::IgnoredAny>(&text)
        .map_err(|e| format!("An event must hold valid JSON: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(v: Value) -> Box<RawValue> {
        RawValue::from_string(v.to_string()).unwrap()
    }

    #[test]
    fn events_are_strings_of_json() {
        assert!(check_event(&raw(json!("{\"a\":1}"))).is_ok());
        assert!(check_event(&raw(json!("42"))).is_ok());
        assert!(check_event(&raw(json!({"a": 1}))).is_err());
        assert!(check_event(&raw(json!("not json"))).is_err());
        assert!(check_event(&raw(json!(""))).is_err());
        let big = format!("\"{}\"", "x".repeat(MAX_EVENT_BYTES));
        assert!(check_event(&raw(json!(big)))
            .unwrap_err()
            .contains("larger"));
    }

    #[test]
    fn authorization_key() {
        let a = json!({"host": "h", "x-api-key": "k"});
        assert_eq!(own_key(Some(&a)).as_deref(), Some("k"));
        assert_eq!(own_key(Some(&json!("k"))), None);
        assert_eq!(own_key(None), None);
    }
}
