//! The Pusher Channels v7 wire format: parsing client frames into typed
//! commands, encoding server frames, and the protocol's error codes.
//!
//! Thin by design: this module knows JSON shapes and codes, not what a
//! channel is (that is `names`). [`PusherWire`] is how the core asks for
//! Pusher frames.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Close / error codes from Pusher's protocol documentation.
pub mod code {
    /// App key unknown.
    pub const APP_NOT_FOUND: u16 = 4001;
    pub const APP_DISABLED: u16 = 4003;
    pub const OVER_CONNECTION_QUOTA: u16 = 4004;
    pub const PATH_NOT_FOUND: u16 = 4005;
    pub const INVALID_VERSION: u16 = 4006;
    pub const UNSUPPORTED_PROTOCOL: u16 = 4007;
    pub const NO_PROTOCOL_VERSION: u16 = 4008;
    /// Sign-in failed, or the app terminated the user's connections.
    pub const UNAUTHORIZED: u16 = 4009;
    /// Over capacity: reconnect after a back-off (too slow, flooding).
    pub const OVER_CAPACITY: u16 = 4100;
    /// Generic "reconnect now" (graceful shutdown).
    pub const RECONNECT: u16 = 4200;
    pub const PONG_NOT_RECEIVED: u16 = 4201;
    /// Pusher's "closed after inactivity" (for clients without pings).
    pub const INACTIVE: u16 = 4202;
    pub const CLIENT_EVENT_RATE_LIMIT: u16 = 4301;
}

/// The protocol version Herald speaks.
pub const PROTOCOL_VERSION: u32 = 7;
/// Oldest version whose frames are identical for our purposes.
pub const MIN_PROTOCOL_VERSION: u32 = 5;

/// A command from a client, parsed from one text frame.
#[derive(Debug)]
pub enum ClientMessage {
    Ping,
    Pong,
    Subscribe {
        channel: String,
        auth: Option<String>,
        channel_data: Option<String>,
    },
    Unsubscribe {
        channel: String,
    },
    Signin {
        auth: String,
        user_data: String,
    },
    ClientEvent {
        event: String,
        channel: String,
        /// The `data` exactly as sent (any JSON value), relayed untouched.
        data: Box<RawValue>,
    },
}

impl PartialEq for ClientMessage {
    fn eq(&self, other: &Self) -> bool {
        use ClientMessage::*;
        match (self, other) {
            (Ping, Ping) | (Pong, Pong) => true,
            (
                Subscribe {
                    channel: a,
                    auth: b,
                    channel_data: c,
                },
                Subscribe {
                    channel: x,
                    auth: y,
                    channel_data: z,
                },
            ) => a == x && b == y && c == z,
            (Unsubscribe { channel: a }, Unsubscribe { channel: x }) => a == x,
            (
                Signin {
                    auth: a,
                    user_data: b,
                },
                Signin {
                    auth: x,
                    user_data: y,
                },
            ) => a == x && b == y,
            (
                ClientEvent {
                    event: a,
                    channel: b,
                    data: c,
                },
                ClientEvent {
                    event: x,
                    channel: y,
                    data: z,
                },
            ) => a == x && b == y && c.get() == z.get(),
            _ => false,
        }
    }
}

/// Why a frame could not be understood. The message is sent to the client.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ParseError {
    #[error("invalid JSON: {0}")]
    Json(String),
    #[error("{0}")]
    Shape(String),
    #[error("unsupported event: {0:?}")]
    UnknownEvent(String),
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    event: Option<std::borrow::Cow<'a, str>>,
    channel: Option<String>,
    /// `Some("null")` for `"data": null`: a client event may carry null.
    #[serde(default, deserialize_with = "present")]
    data: Option<Box<RawValue>>,
}

/// Deserialize a field that is present, whatever its value (`Option`'s own
/// impl would turn JSON `null` into `None`, as if it were missing).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct SubscribeData {
    channel: String,
    auth: Option<String>,
    channel_data: Option<String>,
}

#[derive(Deserialize)]
struct UnsubscribeData {
    channel: String,
}

#[derive(Deserialize)]
struct SigninData {
    auth: String,
    user_data: String,
}

/// `data` may be an object or, as some clients send it, a JSON string that
/// holds the object. Accept both.
fn decode_data<T: serde::de::DeserializeOwned>(
    data: Option<&RawValue>,
    event: &str,
) -> Result<T, ParseError> {
    let raw = data.ok_or_else(|| ParseError::Shape(format!("{event} requires `data`")))?;
    let shape = |e: serde_json::Error| ParseError::Shape(format!("{event}: invalid data: {e}"));
    match serde_json::from_str::<T>(raw.get()) {
        Ok(v) => Ok(v),
        Err(first) => match serde_json::from_str::<String>(raw.get()) {
            Ok(inner) => serde_json::from_str::<T>(&inner).map_err(shape),
            Err(_) => Err(shape(first)),
        },
    }
}

/// Parse one client text frame.
pub fn parse(text: &str) -> Result<ClientMessage, ParseError> {
    let env: Envelope = serde_json::from_str(text).map_err(|e| ParseError::Json(e.to_string()))?;
    // serde also accepts a struct written as a JSON array; the protocol's
    // frames are objects.
    if !text.trim_start().starts_with('{') {
        return Err(ParseError::Shape("a frame must be a JSON object".into()));
    }
    let event = env
        .event
        .ok_or_else(|| ParseError::Shape("missing `event`".into()))?;
    let data = env.data.as_deref();
    Ok(match event.as_ref() {
        "pusher:ping" => ClientMessage::Ping,
        "pusher:pong" => ClientMessage::Pong,
        "pusher:subscribe" => {
            let d: SubscribeData = decode_data(data, &event)?;
            ClientMessage::Subscribe {
                channel: d.channel,
                auth: d.auth,
                channel_data: d.channel_data,
            }
        }
        "pusher:unsubscribe" => {
            let d: UnsubscribeData = decode_data(data, &event)?;
            ClientMessage::Unsubscribe { channel: d.channel }
        }
        "pusher:signin" => {
            let d: SigninData = decode_data(data, &event)?;
            ClientMessage::Signin {
                auth: d.auth,
                user_data: d.user_data,
            }
        }
        name if name.starts_with("client-") => {
            let channel = env
                .channel
                .ok_or_else(|| ParseError::Shape("client event requires `channel`".into()))?;
            let data = env
                .data
                .ok_or_else(|| ParseError::Shape("client event requires `data`".into()))?;
            ClientMessage::ClientEvent {
                event: name.to_owned(),
                channel,
                data,
            }
        }
        other => return Err(ParseError::UnknownEvent(truncate(other, 64).to_owned())),
    })
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// A server frame. `data` is pre-encoded JSON; user_id is set on presence
/// client events.
#[derive(Serialize)]
struct Frame<'a> {
    event: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    channel: Option<&'a str>,
    data: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    user_id: Option<&'a str>,
}

/// Encode a frame whose `data` is already JSON (a string or an object).
pub fn encode_raw(
    event: &str,
    channel: Option<&str>,
    data: &RawValue,
    user_id: Option<&str>,
) -> String {
    serde_json::to_string(&Frame {
        event,
        channel,
        data,
        user_id,
    })
    .expect("serializing borrowed strings cannot fail")
}

/// Encode a frame whose `data` is `value` serialized into a JSON *string*,
/// as Pusher does for its own `pusher:` and `pusher_internal:` events.
pub fn encode<T: Serialize>(event: &str, channel: Option<&str>, value: &T) -> String {
    let inner = serde_json::to_string(value).expect("serializable value");
    let as_string = serde_json::to_string(&inner).expect("string");
    let raw = RawValue::from_string(as_string).expect("valid JSON string");
    encode_raw(event, channel, &raw, None)
}

pub fn connection_established(socket_id: &str, activity_timeout: u64) -> String {
    #[derive(Serialize)]
    struct D<'a> {
        socket_id: &'a str,
        activity_timeout: u64,
    }
    encode(
        "pusher:connection_established",
        None,
        &D {
            socket_id,
            activity_timeout,
        },
    )
}

/// `pusher:error`. `code` is `None` for errors that do not close the socket.
pub fn error(code: Option<u16>, message: &str) -> String {
    #[derive(Serialize)]
    struct D<'a> {
        code: Option<u16>,
        message: &'a str,
    }
    let d = D { code, message };
    // pusher:error carries `data` as an object, not a string.
    let raw =
        RawValue::from_string(serde_json::to_string(&d).expect("serializable")).expect("json");
    encode_raw("pusher:error", None, &raw, None)
}

pub fn ping() -> &'static str {
    r#"{"event":"pusher:ping","data":"{}"}"#
}

pub fn pong() -> &'static str {
    r#"{"event":"pusher:pong","data":"{}"}"#
}

pub fn subscription_error(channel: &str, kind: &str, error: &str, status: u16) -> String {
    #[derive(Serialize)]
    struct D<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        error: &'a str,
        status: u16,
    }
    encode(
        "pusher:subscription_error",
        Some(channel),
        &D {
            kind,
            error,
            status,
        },
    )
}

/// A presence member as listed in `subscription_succeeded`.
pub struct PresenceEntry<'a> {
    pub user_id: &'a str,
    pub user_info: Option<&'a RawValue>,
}

/// `pusher_internal:subscription_succeeded`, with the member list on
/// presence channels.
pub fn subscription_succeeded(channel: &str, presence: Option<&[PresenceEntry<'_>]>) -> String {
    match presence {
        None => encode_raw(
            "pusher_internal:subscription_succeeded",
            Some(channel),
            &RawValue::from_string("\"{}\"".into()).expect("json"),
            None,
        ),
        Some(members) => {
            /// `hash`: user id → user_info exactly as the app signed it.
            struct Hash<'a>(&'a [PresenceEntry<'a>]);
            impl Serialize for Hash<'_> {
                fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                    s.collect_map(self.0.iter().map(|m| (m.user_id, m.user_info)))
                }
            }
            #[derive(Serialize)]
            struct P<'a> {
                ids: Vec<&'a str>,
                hash: Hash<'a>,
                count: usize,
            }
            #[derive(Serialize)]
            struct D<'a> {
                presence: P<'a>,
            }
            let d = D {
                presence: P {
                    ids: members.iter().map(|m| m.user_id).collect(),
                    hash: Hash(members),
                    count: members.len(),
                },
            };
            encode("pusher_internal:subscription_succeeded", Some(channel), &d)
        }
    }
}

pub fn member_added(channel: &str, user_id: &str, user_info: Option<&RawValue>) -> String {
    #[derive(Serialize)]
    struct D<'a> {
        user_id: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        user_info: Option<&'a RawValue>,
    }
    encode(
        "pusher_internal:member_added",
        Some(channel),
        &D { user_id, user_info },
    )
}

pub fn member_removed(channel: &str, user_id: &str) -> String {
    #[derive(Serialize)]
    struct D<'a> {
        user_id: &'a str,
    }
    encode(
        "pusher_internal:member_removed",
        Some(channel),
        &D { user_id },
    )
}

pub fn subscription_count(channel: &str, count: usize) -> String {
    #[derive(Serialize)]
    struct D {
        subscription_count: usize,
    }
    encode(
        "pusher_internal:subscription_count",
        Some(channel),
        &D {
            subscription_count: count,
        },
    )
}

pub fn cache_miss(channel: &str) -> String {
    encode_raw(
        "pusher:cache_miss",
        Some(channel),
        &RawValue::from_string("\"{}\"".into()).expect("json"),
        None,
    )
}

pub fn signin_success(user_data: &str) -> String {
    #[derive(Serialize)]
    struct D<'a> {
        user_data: &'a str,
    }
    encode("pusher:signin_success", None, &D { user_data })
}

/// `pusher_internal:watchlist_events` with one event of `name`
/// (`online` or `offline`) for `user_ids`.
pub fn watchlist_events(events: &[(&str, &[String])]) -> String {
    #[derive(Serialize)]
    struct E<'a> {
        name: &'a str,
        user_ids: &'a [String],
    }
    #[derive(Serialize)]
    struct D<'a> {
        events: Vec<E<'a>>,
    }
    let d = D {
        events: events
            .iter()
            .filter(|(_, ids)| !ids.is_empty())
            .map(|(name, user_ids)| E { name, user_ids })
            .collect(),
    };
    encode("pusher_internal:watchlist_events", None, &d)
}

/// The core's encoder for Pusher connections. Pusher frames do not differ
/// per subscriber, so the tag is always empty.
pub struct PusherWire;

/// The one instance every Pusher connection points to.
pub static WIRE: PusherWire = PusherWire;

/// The wire's name: the `protocol` label of Pusher metrics.
pub const NAME: &str = "pusher";

impl herald_core::publication::Wire for PusherWire {
    fn name(&self) -> &'static str {
        NAME
    }

    fn publication(
        &self,
        p: &herald_core::publication::Publication,
        _tag: &str,
    ) -> herald_core::frame::Frame {
        herald_core::frame::Frame::text(&encode_raw(
            &p.event,
            Some(&p.channel),
            &p.data,
            p.user_id.as_deref(),
        ))
    }

    fn event(
        &self,
        e: &herald_core::publication::Event<'_>,
        _tag: &str,
    ) -> Option<herald_core::frame::Frame> {
        use herald_core::publication::Event;
        let text = match e {
            Event::Subscribed { channel, members } => {
                let entries: Option<Vec<PresenceEntry<'_>>> = members.map(|m| {
                    m.iter()
                        .map(|m| PresenceEntry {
                            user_id: m.user_id,
                            user_info: m.info,
                        })
                        .collect()
                });
                subscription_succeeded(channel, entries.as_deref())
            }
            Event::MemberAdded { channel, member } => {
                member_added(channel, member.user_id, member.info)
            }
            Event::MemberRemoved { channel, user_id } => member_removed(channel, user_id),
            Event::SubscriptionCount { channel, count } => subscription_count(channel, *count),
            Event::CacheMiss { channel } => cache_miss(channel),
            Event::Watchlist { online, offline } => {
                watchlist_events(&[("online", online), ("offline", offline)])
            }
        };
        Some(herald_core::frame::Frame::text(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_subscribe_with_object_or_string_data() {
        let a =
            parse(r#"{"event":"pusher:subscribe","data":{"channel":"x","auth":"k:s"}}"#).unwrap();
        let b =
            parse(r#"{"event":"pusher:subscribe","data":"{\"channel\":\"x\",\"auth\":\"k:s\"}"}"#)
                .unwrap();
        assert_eq!(a, b);
        assert_eq!(
            a,
            ClientMessage::Subscribe {
                channel: "x".into(),
                auth: Some("k:s".into()),
                channel_data: None
            }
        );
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(matches!(parse("nope"), Err(ParseError::Json(_))));
        assert!(matches!(parse("[]"), Err(ParseError::Json(_))));
        assert!(matches!(
            parse(r#"["client-x","private-a",{}]"#),
            Err(ParseError::Shape(_))
        ));
        assert!(matches!(parse(r#"{"data":1}"#), Err(ParseError::Shape(_))));
        assert!(matches!(
            parse(r#"{"event":"pusher:subscribe"}"#),
            Err(ParseError::Shape(_))
        ));
        assert!(matches!(
            parse(r#"{"event":"pusher:subscribe","data":{"channel":5}}"#),
            Err(ParseError::Shape(_))
        ));
        assert!(matches!(
            parse(r#"{"event":"whatever"}"#),
            Err(ParseError::UnknownEvent(_))
        ));
        assert!(matches!(
            parse(r#"{"event":"client-x","data":1}"#),
            Err(ParseError::Shape(_))
        ));
    }

    #[test]
    fn client_event_keeps_raw_data() {
        let m = parse(r#"{"event":"client-typing","channel":"private-a","data":{"a": [1, 2]}}"#)
            .unwrap();
        match m {
            ClientMessage::ClientEvent { data, .. } => assert_eq!(data.get(), r#"{"a": [1, 2]}"#),
            other => panic!("{other:?}"),
        }
        let m = parse(r#"{"event":"client-x","channel":"private-a","data":null}"#).unwrap();
        match m {
            ClientMessage::ClientEvent { data, .. } => assert_eq!(data.get(), "null"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn presence_hash_keeps_user_info_as_signed() {
        let info = RawValue::from_string("{\"n\":1E605}".into()).unwrap();
        let members = [
            PresenceEntry {
                user_id: "a",
                user_info: Some(&info),
            },
            PresenceEntry {
                user_id: "b",
                user_info: None,
            },
        ];
        let frame = subscription_succeeded("presence-x", Some(&members));
        let outer: serde_json::Value = serde_json::from_str(&frame).unwrap();
        let data = outer["data"].as_str().unwrap();
        assert_eq!(
            data,
            r#"{"presence":{"ids":["a","b"],"hash":{"a":{"n":1E605},"b":null},"count":2}}"#
        );
    }

    #[test]
    fn encodes_data_as_json_string() {
        let f = connection_established("1.2", 120);
        assert_eq!(
            f,
            r#"{"event":"pusher:connection_established","data":"{\"socket_id\":\"1.2\",\"activity_timeout\":120}"}"#
        );
        let e = error(Some(4001), "nope");
        assert_eq!(
            e,
            r#"{"event":"pusher:error","data":{"code":4001,"message":"nope"}}"#
        );
    }
}
