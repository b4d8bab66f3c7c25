//! The Action Cable wire format (`actioncable-v1-json`): parsing client
//! commands and encoding server frames. [`CableWire`] is how the core asks
//! for Action Cable frames: a stream's message is encoded once per
//! subscription identifier (the subscription's tag) and shared by every
//! subscriber with that identifier.

use herald_core::frame::Frame;
use herald_core::publication::{Event, Publication, Wire};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The event name marking a stream publication as a presence event
/// (`crate::ext::presence`): written as a `presence` frame. No broadcast
/// sets an event name, so the app cannot forge one.
pub const PRESENCE_EVENT: &str = "$presence";

/// A `presence` frame for subscription `identifier` carrying `message`.
pub fn presence_frame(identifier: &str, message: &str) -> String {
    format!(
        r#"{{"type":"presence","identifier":{},"message":{}}}"#,
        json_string(identifier),
        message
    )
}

/// Longest subscription identifier accepted, in bytes.
pub const MAX_IDENTIFIER: usize = 1024;

/// Disconnect reasons (Rails' and AnyCable's words, plus Herald's own
/// `rpc_error`, `over_capacity` and `broker_unavailable`).
pub mod reason {
    pub const UNAUTHORIZED: &str = "unauthorized";
    pub const INVALID_REQUEST: &str = "invalid_request";
    pub const SERVER_RESTART: &str = "server_restart";
    pub const REMOTE: &str = "remote";
    pub const TOO_SLOW: &str = "too_slow";
    /// The app's RPC server could not be reached, was too slow, failed or
    /// answered garbage: reconnect later.
    pub const RPC_ERROR: &str = "rpc_error";
    /// The app is at its connection quota, or the client sent too much.
    pub const OVER_CAPACITY: &str = "over_capacity";
    /// The cluster's broker did not take a stream of this connection in
    /// time (`broker.confirm_timeout`): reconnect, perhaps to another node.
    pub const BROKER_UNAVAILABLE: &str = "broker_unavailable";
}

/// A command from a client.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Subscribe {
        identifier: String,
    },
    Unsubscribe {
        identifier: String,
    },
    /// Perform an action: `data` is the JSON-encoded action and arguments.
    Message {
        identifier: String,
        data: String,
    },
    /// `actioncable-v1-ext-json`: missed publications of a subscription's
    /// streams (the request itself: [`crate::ext::protocol::history_request`]).
    History {
        identifier: String,
    },
    /// `actioncable-v1-ext-json`: the client's answer to a ping.
    Pong,
    /// `actioncable-v1-ext-json` presence: join the subscription's presence
    /// stream (the member itself: [`crate::ext::presence::member`]), leave it,
    /// or ask who is there.
    Join {
        identifier: String,
    },
    Leave {
        identifier: String,
    },
    PresenceInfo {
        identifier: String,
    },
    /// `actioncable-v1-ext-json`: a message for the subscription's other
    /// clients; `data` is any JSON value (its text), relayed as given.
    Whisper {
        identifier: String,
        data: String,
    },
}

#[derive(Deserialize)]
struct Raw<'a> {
    #[serde(borrow, default)]
    command: Option<&'a RawValue>,
    #[serde(borrow, default)]
    identifier: Option<&'a RawValue>,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

fn string(v: Option<&RawValue>, field: &str) -> Result<String, String> {
    let v = v.ok_or_else(|| format!("`{field}` is missing"))?;
    serde_json::from_str::<String>(v.get()).map_err(|_| format!("`{field}` must be a string"))
}

/// Parse one client frame. The error says what was wrong (for logs).
pub fn parse(text: &str) -> Result<Command, String> {
    let raw: Raw = serde_json::from_str(text).map_err(|e| {
        if text.trim_start().starts_with('{') {
            format!("invalid JSON: {e}")
        } else {
            "a command must be a JSON object".to_owned()
        }
    })?;
    let command = string(raw.command, "command")?;
    if command == "pong" {
        return Ok(Command::Pong);
    }
    let identifier = string(raw.identifier, "identifier")?;
    if identifier.is_empty() {
        return Err("`identifier` is empty".into());
    }
    if identifier.len() > MAX_IDENTIFIER {
        return Err(format!(
            "`identifier` is longer than {MAX_IDENTIFIER} bytes"
        ));
    }
    match command.as_str() {
        "subscribe" => Ok(Command::Subscribe { identifier }),
        "unsubscribe" => Ok(Command::Unsubscribe { identifier }),
        "history" => Ok(Command::History { identifier }),
        "join" => Ok(Command::Join { identifier }),
        "leave" => Ok(Command::Leave { identifier }),
        "presence" => Ok(Command::PresenceInfo { identifier }),
        "whisper" => Ok(Command::Whisper {
            identifier,
            data: raw.data.ok_or("`data` is missing")?.get().to_owned(),
        }),
        "message" => Ok(Command::Message {
            identifier,
            data: string(raw.data, "data")?,
        }),
        other => Err(format!(
            "unknown command {:?}",
            other.chars().take(64).collect::<String>()
        )),
    }
}

/// `s` as a JSON string literal.
pub use herald_core::publication::quote as json_string;

pub fn welcome(sid: &str) -> String {
    format!(r#"{{"type":"welcome","sid":{}}}"#, json_string(sid))
}

pub fn ping(unix_seconds: u64) -> String {
    format!(r#"{{"type":"ping","message":{unix_seconds}}}"#)
}

pub fn confirm(identifier: &str) -> String {
    format!(
        r#"{{"identifier":{},"type":"confirm_subscription"}}"#,
        json_string(identifier)
    )
}

pub fn reject(identifier: &str) -> String {
    format!(
        r#"{{"identifier":{},"type":"reject_subscription"}}"#,
        json_string(identifier)
    )
}

pub fn disconnect(reason: &str, reconnect: bool) -> String {
    format!(
        r#"{{"type":"disconnect","reason":{},"reconnect":{reconnect}}}"#,
        json_string(reason)
    )
}

/// A broadcast's `data` as the `message` subscribers get: the data parsed as
/// JSON when it is JSON (and not `null`), otherwise the string itself, as
/// AnyCable delivers it.
pub fn message_value(data: &str) -> Box<RawValue> {
    match serde_json::from_str::<Box<RawValue>>(data) {
        Ok(v) if v.get() != "null" => v,
        _ => herald_core::publication::json_string(data),
    }
}

/// The core's encoder for Action Cable connections.
pub struct CableWire;

pub static WIRE: CableWire = CableWire;

impl Wire for CableWire {
    fn name(&self) -> &'static str {
        "actioncable"
    }

    fn publication(&self, p: &Publication, tag: &str) -> Frame {
        if !p.event.is_empty() && p.event == PRESENCE_EVENT {
            return Frame::text(&presence_frame(tag, p.data.get()));
        }
        let id = json_string(tag);
        let data = p.data.get();
        let mut s = String::with_capacity(30 + id.len() + data.len());
        s.push_str(r#"{"identifier":"#);
        s.push_str(&id);
        s.push_str(r#","message":"#);
        s.push_str(data);
        s.push('}');
        Frame::text(&s)
    }

    /// Confirmations come from the app (its transmissions); the core's own
    /// events have no Action Cable message.
    fn event(&self, _e: &Event<'_>, _tag: &str) -> Option<Frame> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands() {
        assert_eq!(
            parse(r#"{"command":"subscribe","identifier":"{\"channel\":\"C\"}"}"#),
            Ok(Command::Subscribe {
                identifier: r#"{"channel":"C"}"#.into()
            })
        );
        assert_eq!(
            parse(r#"{"command":"message","identifier":"x","data":"{\"action\":\"a\"}"}"#),
            Ok(Command::Message {
                identifier: "x".into(),
                data: r#"{"action":"a"}"#.into()
            })
        );
        assert_eq!(
            parse(r#"{"command":"whisper","identifier":"x","data":{"typing":true}}"#),
            Ok(Command::Whisper {
                identifier: "x".into(),
                data: r#"{"typing":true}"#.into()
            })
        );
        assert_eq!(
            parse(r#"{"command":"join","identifier":"x","presence":{"id":"1"}}"#),
            Ok(Command::Join {
                identifier: "x".into()
            })
        );
        for bad in [
            r#"{"command":"whisper","identifier":"x"}"#,
            "",
            "[]",
            "nope",
            "{",
            r#"{"identifier":"x"}"#,
            r#"{"command":"subscribe"}"#,
            r#"{"command":"subscribe","identifier":{"channel":"C"}}"#,
            r#"{"command":"subscribe","identifier":""}"#,
            r#"{"command":"message","identifier":"x","data":{"action":"a"}}"#,
            r#"{"command":"bogus","identifier":"x"}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let long = format!(
            r#"{{"command":"subscribe","identifier":"{}"}}"#,
            "a".repeat(MAX_IDENTIFIER + 1)
        );
        assert!(parse(&long).unwrap_err().contains("longer"));
    }

    #[test]
    fn publication_frames_carry_the_identifier() {
        let p = Publication::new(
            crate::NAMESPACE,
            "s".into(),
            String::new(),
            message_value(r#"{"text":"hi"}"#),
        );
        let f = WIRE.publication(&p, r#"{"channel":"Chat"}"#);
        assert_eq!(
            f.payload_text(),
            r#"{"identifier":"{\"channel\":\"Chat\"}","message":{"text":"hi"}}"#
        );
        assert_eq!(message_value("plain").get(), r#""plain""#);
        assert_eq!(message_value("null").get(), r#""null""#);
        assert_eq!(message_value("42").get(), "42");
    }

    #[test]
    fn one_frame_per_identifier_shared_by_its_subscribers() {
        use herald_core::connection::{Connection, QueueLimit};
        use herald_core::fanout::{deliver, Target};
        use std::sync::Arc;
        let limit = QueueLimit {
            frames: 16,
            bytes: 1 << 20,
        };
        let conns: Vec<Arc<Connection>> = (0..3)
            .map(|i| Arc::new(Connection::new(i, format!("s.{i}"), &WIRE, limit)))
            .collect();
        let a: Arc<str> = Arc::from(r#"{"channel":"A"}"#);
        let b: Arc<str> = Arc::from(r#"{"channel":"B"}"#);
        let targets: Vec<Target> = [(0, &a), (1, &b), (2, &a)]
            .into_iter()
            .map(|(i, tag)| Target {
                conn: conns[i].clone(),
                tag: Some(tag.clone()),
            })
            .collect();
        let p = Publication::new(
            crate::NAMESPACE,
            "s".into(),
            String::new(),
            message_value("1"),
        );
        assert_eq!(deliver(&p, &targets), 3);
        let frames: Vec<_> = conns
            .iter()
            .map(|c| {
                let mut out = Vec::new();
                c.take(&mut out, 8);
                out.remove(0)
            })
            .collect();
        // Subscribers 0 and 2 share identifier A: the same bytes, not a copy.
        assert_eq!(frames[0].parts()[1].as_ptr(), frames[2].parts()[1].as_ptr());
        assert_ne!(frames[0].parts()[1].as_ptr(), frames[1].parts()[1].as_ptr());
        assert!(frames[1].payload_text().contains(r#"{\"channel\":\"B\"}"#));
    }

    #[test]
    fn server_frames() {
        assert_eq!(welcome("a.1"), r#"{"type":"welcome","sid":"a.1"}"#);
        assert_eq!(
            disconnect("rpc_error", true),
            r#"{"type":"disconnect","reason":"rpc_error","reconnect":true}"#
        );
        assert_eq!(
            reject("i\"d"),
            r#"{"identifier":"i\"d","type":"reject_subscription"}"#
        );
    }
}
