//! The two AppSync wire formats, as the core's [`Wire`]s, and the control
//! messages of both protocols.
//!
//! Every AppSync data message names the subscription it is for, so frames
//! differ per subscriber. Both wires are [`Wire::per_subscriber`]: the
//! event is encoded once per publication (the shared body, which holds the
//! payload as a JSON string, escaped once) and each subscriber's frame is
//! its own small prefix written beside that body
//! ([`Frame::text_with_prefix`]).
//!
//! The subscription's tag *is* that prefix, built once at subscribe time:
//!
//! ```text
//! Events   tag   {"type":"data","id":"<id>","event":
//!          body  "<event JSON, escaped>"}
//! GraphQL  tag   {"type":"data","id":"<id>","payload":{"data":{"subscribe":{"name":"n","data":
//!          body  "<data, escaped>"}}}}
//! ```
//!
//! A GraphQL subscription's selection decides the fields and their names
//! (aliases, `__typename`), all of which go in the tag; `data`, when
//! selected, is written last so that the shared body can follow it. A
//! selection without `data` makes the whole frame the tag (it ends in `}`
//! rather than `:`), and the body is not used. The subscription id is read
//! back from the tag for the acknowledgement the core asks for
//! ([`Event::Subscribed`]), which the hub queues before any data for the
//! subscription.

use herald_core::frame::Frame;
use herald_core::publication::{json_string, Event, Publication, Wire};
use serde_json::{json, Value};

/// Milliseconds a client may go without a `ka` before it gives up; the
/// value AppSync announces. Herald's `keepalive_interval` stays well below.
pub const CONNECTION_TIMEOUT_MS: u64 = 300_000;

const DATA_HEAD: &str = r#"{"type":"data","id":"#;

/// A JSON string literal (with its quotes).
pub use herald_core::publication::quote;

/// The Events API tag (and frame prefix) for subscription `id`.
pub fn events_tag(id: &str) -> String {
    format!(r#"{DATA_HEAD}{},"event":"#, quote(id))
}

/// A GraphQL field the subscriber selected on `Channel`, under its
/// response key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelField {
    Name,
    Data,
    Typename,
}

/// The GraphQL tag for subscription `id` on channel `name`: `root` is the
/// response key of the `subscribe` field, `fields` the selection.
pub fn graphql_tag(id: &str, root: &str, name: &str, fields: &[(String, ChannelField)]) -> String {
    let mut t = format!(
        r#"{DATA_HEAD}{},"payload":{{"data":{{{}:{{"#,
        quote(id),
        quote(root)
    );
    let mut first = true;
    let mut data_key = None;
    for (key, f) in fields {
        let value = match f {
            ChannelField::Name => quote(name),
            ChannelField::Typename => "\"Channel\"".to_owned(),
            ChannelField::Data => {
                data_key = Some(key);
                continue;
            }
        };
        if !first {
            t.push(',');
        }
        first = false;
        t.push_str(&quote(key));
        t.push(':');
        t.push_str(&value);
    }
    match data_key {
        Some(key) => {
            if !first {
                t.push(',');
            }
            t.push_str(&quote(key));
            t.push(':');
        }
        None => t.push_str("}}}}"),
    }
    t
}

/// The subscription id (a JSON string literal) at the start of a tag.
fn tag_id(tag: &str) -> Option<&str> {
    let rest = tag.strip_prefix(DATA_HEAD)?;
    let mut it = serde_json::Deserializer::from_str(rest).into_iter::<String>();
    match it.next() {
        Some(Ok(_)) => Some(&rest[..it.byte_offset()]),
        _ => None,
    }
}

/// The publication's payload as a JSON string literal: AppSync payloads
/// are always strings. Herald's own publishers store them that way; any
/// other JSON value is stringified.
fn payload_literal(p: &Publication) -> std::borrow::Cow<'_, str> {
    let raw = p.data.get();
    if raw.starts_with('"') {
        raw.into()
    } else {
        json_string(raw).get().to_owned().into()
    }
}

fn personalize(shared: &Frame, tag: &str) -> Frame {
    if tag.ends_with('}') {
        // A selection without `data`: the whole frame is the tag.
        return Frame::text(tag);
    }
    // The tag before the shared payload (compressed or not: see
    // `Frame::with_prefix`).
    shared.with_prefix(tag.as_bytes())
}

/// One of the two AppSync wires: they differ only in their name, how the
/// shared body closes after the payload, and the acknowledgement of a
/// subscription.
pub struct AppsyncWire {
    name: &'static str,
    /// What follows the payload literal to close the data message.
    close: &'static str,
    /// The `type` of the acknowledgement of a subscription.
    ack: &'static str,
}

/// The Events API (`aws-appsync-event-ws`).
pub static EVENTS_WIRE: AppsyncWire = AppsyncWire {
    name: "appsync-events",
    close: "}",
    ack: "subscribe_success",
};

/// The generic pub/sub GraphQL API (`graphql-ws`).
pub static GRAPHQL_WIRE: AppsyncWire = AppsyncWire {
    name: "appsync-graphql",
    close: "}}}}",
    ack: "start_ack",
};

impl Wire for AppsyncWire {
    fn name(&self) -> &'static str {
        self.name
    }

    fn publication(&self, p: &Publication, _tag: &str) -> Frame {
        let lit = payload_literal(p);
        let mut body = String::with_capacity(lit.len() + self.close.len());
        body.push_str(&lit);
        body.push_str(self.close);
        Frame::text(&body)
    }

    fn per_subscriber(&self) -> bool {
        true
    }

    fn personalize(&self, shared: &Frame, tag: &str) -> Frame {
        personalize(shared, tag)
    }

    fn event(&self, e: &Event<'_>, tag: &str) -> Option<Frame> {
        match e {
            Event::Subscribed { .. } => tag_id(tag)
                .map(|id| Frame::text(&format!(r#"{{"type":"{}","id":{id}}}"#, self.ack))),
            _ => None,
        }
    }
}

// ----- control messages ----------------------------------------------------

/// One AppSync error object.
pub fn error_object(error_type: &str, message: &str) -> Value {
    json!({ "errorType": error_type, "message": message })
}

/// The Events API's `connection_ack` (timeout at the top level).
pub fn events_ack() -> String {
    json!({ "type": "connection_ack", "connectionTimeoutMs": CONNECTION_TIMEOUT_MS }).to_string()
}

/// The GraphQL API's `connection_ack` (timeout under `payload`).
pub fn graphql_ack() -> String {
    json!({ "type": "connection_ack", "payload": { "connectionTimeoutMs": CONNECTION_TIMEOUT_MS } })
        .to_string()
}

pub const KA: &str = r#"{"type":"ka"}"#;

/// Events: `connection_error` with top-level `errors` (Amplify reads
/// `errors[0].errorType` and `errorCode` there).
pub fn events_connection_error(error_type: &str, message: &str, code: u16) -> String {
    json!({
        "type": "connection_error",
        "errors": [{ "errorType": error_type, "message": message, "errorCode": code }],
    })
    .to_string()
}

/// GraphQL: `connection_error` with `payload.errors`.
pub fn graphql_connection_error(error_type: &str, message: &str, code: u16) -> String {
    json!({
        "type": "connection_error",
        "payload": { "errors": [{ "errorType": error_type, "message": message, "errorCode": code }] },
    })
    .to_string()
}

/// Events: a reply of `kind` (`subscribe_error`, `publish_error`,
/// `unsubscribe_error`, `error`) with `errors`; `id` when the client gave one.
pub fn events_error(kind: &str, id: Option<&str>, error_type: &str, message: &str) -> String {
    let mut v = json!({ "type": kind, "errors": [error_object(error_type, message)] });
    if let Some(id) = id {
        v["id"] = json!(id);
    }
    v.to_string()
}

/// GraphQL: an `error` message with `payload.errors`.
pub fn graphql_error(id: Option<&str>, errors: Vec<Value>) -> String {
    let mut v = json!({ "type": "error", "payload": { "errors": errors } });
    if let Some(id) = id {
        v["id"] = json!(id);
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::connection::{Connection, QueueLimit};
    use herald_core::fanout::{deliver, Target};
    use std::sync::Arc;

    fn publication(data: &str) -> Publication {
        Publication::new(
            crate::events::NAMESPACE,
            "/ns/a".into(),
            String::new(),
            json_string(data),
        )
    }

    fn target(id: u64, wire: &'static dyn Wire, tag: String) -> Target {
        let limit = QueueLimit {
            frames: 8,
            bytes: 1 << 20,
        };
        Target {
            conn: Arc::new(Connection::new(id, format!("1.{id}"), wire, limit)),
            tag: Some(Arc::from(tag)),
        }
    }

    fn received(t: &Target) -> Vec<Frame> {
        let mut out = Vec::new();
        t.conn.take(&mut out, 8);
        out
    }

    #[test]
    fn events_frames_share_the_body() {
        let p = publication(r#"{"msg":"hé \"quoted\""}"#);
        let ts = [
            target(1, &EVENTS_WIRE, events_tag("sub-1")),
            target(2, &EVENTS_WIRE, events_tag("s\"2")),
        ];
        deliver(&p, &ts);
        let a = received(&ts[0]).remove(0);
        let b = received(&ts[1]).remove(0);
        let va: Value = serde_json::from_str(&a.payload_text()).unwrap();
        let vb: Value = serde_json::from_str(&b.payload_text()).unwrap();
        assert_eq!(
            va,
            json!({"type":"data","id":"sub-1","event":r#"{"msg":"hé \"quoted\""}"#})
        );
        assert_eq!(vb["id"], "s\"2");
        assert_eq!(a.parts()[1].as_ptr(), b.parts()[1].as_ptr(), "one body");
    }

    #[test]
    fn graphql_frames_follow_the_selection() {
        let p = publication(r#"{"a":1}"#);
        let full = graphql_tag(
            "g1",
            "subscribe",
            "room",
            &[
                ("name".into(), ChannelField::Name),
                ("data".into(), ChannelField::Data),
            ],
        );
        let aliased = graphql_tag(
            "g2",
            "s",
            "room",
            &[
                ("d".into(), ChannelField::Data),
                ("__typename".into(), ChannelField::Typename),
            ],
        );
        let no_data = graphql_tag(
            "g3",
            "subscribe",
            "room",
            &[("n".into(), ChannelField::Name)],
        );
        let ts = [
            target(1, &GRAPHQL_WIRE, full),
            target(2, &GRAPHQL_WIRE, aliased),
            target(3, &GRAPHQL_WIRE, no_data),
        ];
        deliver(&p, &ts);
        let f: Vec<Value> = ts
            .iter()
            .map(|t| serde_json::from_str(&received(t).remove(0).payload_text()).unwrap())
            .collect();
        assert_eq!(
            f[0],
            json!({"type":"data","id":"g1","payload":{"data":{"subscribe":{"name":"room","data":"{\"a\":1}"}}}})
        );
        assert_eq!(
            f[1],
            json!({"type":"data","id":"g2","payload":{"data":{"s":{"__typename":"Channel","d":"{\"a\":1}"}}}})
        );
        assert_eq!(
            f[2],
            json!({"type":"data","id":"g3","payload":{"data":{"subscribe":{"n":"room"}}}})
        );
    }

    #[test]
    fn acknowledgements_carry_the_id() {
        let sub = Event::Subscribed {
            channel: "x",
            members: None,
        };
        let f = EVENTS_WIRE.event(&sub, &events_tag("a\"b")).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&f.payload_text()).unwrap(),
            json!({"type":"subscribe_success","id":"a\"b"})
        );
        let tag = graphql_tag(
            "q",
            "subscribe",
            "n",
            &[("data".into(), ChannelField::Data)],
        );
        let f = GRAPHQL_WIRE.event(&sub, &tag).unwrap();
        assert_eq!(f.payload_text(), r#"{"type":"start_ack","id":"q"}"#);
        assert!(EVENTS_WIRE.event(&sub, "garbage").is_none());
    }

    #[test]
    fn non_string_payloads_are_stringified() {
        let p = Publication::new(
            crate::events::NAMESPACE,
            "/ns/a".into(),
            String::new(),
            serde_json::value::RawValue::from_string("{\"x\":2}".into()).unwrap(),
        );
        let t = target(1, &EVENTS_WIRE, events_tag("i"));
        deliver(&p, std::slice::from_ref(&t));
        let v: Value = serde_json::from_str(&received(&t).remove(0).payload_text()).unwrap();
        assert_eq!(v["event"], "{\"x\":2}");
    }
}
