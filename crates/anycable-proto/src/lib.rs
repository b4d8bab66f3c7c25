//! AnyCable's RPC messages (package `anycable`, service `anycable.RPC`),
//! written by hand with the field numbers of AnyCable's `rpc.proto`, so
//! nothing is generated at build time. The same structs are the JSON bodies
//! of HTTP RPC: snake_case field names, empty fields left out, `status` as a
//! number (what AnyCable sends); answers are read leniently (missing or
//! `null` fields are empty, camelCase names and status names are accepted).

use serde::{Deserialize, Deserializer, Serialize};
use std::collections::HashMap;

/// The gRPC service's path prefix.
pub const SERVICE: &str = "anycable.RPC";

/// A call's outcome as the app reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Status {
    /// The app failed (an exception).
    Error = 0,
    Success = 1,
    /// The app said no (unauthorized, subscription rejected).
    Failure = 2,
}

type Map = HashMap<String, String>;

/// The client's request and state, sent with every call.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct Env {
    #[prost(string, tag = "1")]
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub url: String,
    #[prost(map = "string, string", tag = "2")]
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "HashMap::is_empty"
    )]
    pub headers: Map,
    /// Connection state.
    #[prost(map = "string, string", tag = "3")]
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "HashMap::is_empty"
    )]
    pub cstate: Map,
    /// Channel state: the channel's own for a command, every channel's
    /// (identifier → JSON object) for a disconnect.
    #[prost(map = "string, string", tag = "4")]
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "HashMap::is_empty"
    )]
    pub istate: Map,
}

/// State changes the app sends back: a key with an empty value is removed.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct EnvResponse {
    #[prost(map = "string, string", tag = "1")]
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "HashMap::is_empty"
    )]
    pub cstate: Map,
    #[prost(map = "string, string", tag = "2")]
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "HashMap::is_empty"
    )]
    pub istate: Map,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct PresenceResponse {
    #[prost(string, tag = "1")]
    #[serde(default, deserialize_with = "nullable", rename = "type")]
    pub kind: String,
    #[prost(string, tag = "2")]
    #[serde(default, deserialize_with = "nullable")]
    pub id: String,
    #[prost(string, tag = "3")]
    #[serde(default, deserialize_with = "nullable")]
    pub info: String,
    #[prost(uint32, tag = "4")]
    #[serde(default, deserialize_with = "nullable")]
    pub ttl: u32,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct ConnectionRequest {
    #[prost(message, optional, tag = "3")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Env>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct ConnectionResponse {
    #[prost(enumeration = "Status", tag = "1")]
    #[serde(default, deserialize_with = "status")]
    pub status: i32,
    #[prost(string, tag = "2")]
    #[serde(default, deserialize_with = "nullable")]
    pub identifiers: String,
    #[prost(string, repeated, tag = "3")]
    #[serde(default, deserialize_with = "nullable")]
    pub transmissions: Vec<String>,
    #[prost(string, tag = "4")]
    #[serde(default, deserialize_with = "nullable", alias = "errorMsg")]
    pub error_msg: String,
    #[prost(message, optional, tag = "5")]
    #[serde(default)]
    pub env: Option<EnvResponse>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct CommandMessage {
    /// `subscribe`, `unsubscribe` or `message`.
    #[prost(string, tag = "1")]
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub command: String,
    #[prost(string, tag = "2")]
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub identifier: String,
    #[prost(string, tag = "3")]
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty",
        alias = "connectionIdentifiers"
    )]
    pub connection_identifiers: String,
    #[prost(string, tag = "4")]
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub data: String,
    #[prost(message, optional, tag = "5")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Env>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct CommandResponse {
    #[prost(enumeration = "Status", tag = "1")]
    #[serde(default, deserialize_with = "status")]
    pub status: i32,
    /// Close the connection after this answer.
    #[prost(bool, tag = "2")]
    #[serde(default, deserialize_with = "nullable")]
    pub disconnect: bool,
    /// Stop every stream of this subscription.
    #[prost(bool, tag = "3")]
    #[serde(default, deserialize_with = "nullable", alias = "stopStreams")]
    pub stop_streams: bool,
    #[prost(string, repeated, tag = "4")]
    #[serde(default, deserialize_with = "nullable")]
    pub streams: Vec<String>,
    #[prost(string, repeated, tag = "5")]
    #[serde(default, deserialize_with = "nullable")]
    pub transmissions: Vec<String>,
    #[prost(string, tag = "6")]
    #[serde(default, deserialize_with = "nullable", alias = "errorMsg")]
    pub error_msg: String,
    #[prost(message, optional, tag = "7")]
    #[serde(default)]
    pub env: Option<EnvResponse>,
    #[prost(string, repeated, tag = "8")]
    #[serde(default, deserialize_with = "nullable", alias = "stoppedStreams")]
    pub stopped_streams: Vec<String>,
    #[prost(message, optional, tag = "9")]
    #[serde(default)]
    pub presence: Option<PresenceResponse>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct DisconnectRequest {
    #[prost(string, tag = "1")]
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub identifiers: String,
    #[prost(string, repeated, tag = "2")]
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub subscriptions: Vec<String>,
    #[prost(message, optional, tag = "5")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Env>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct DisconnectResponse {
    #[prost(enumeration = "Status", tag = "1")]
    #[serde(default, deserialize_with = "status")]
    pub status: i32,
    #[prost(string, tag = "2")]
    #[serde(default, deserialize_with = "nullable", alias = "errorMsg")]
    pub error_msg: String,
}

/// A field that may be `null` (read as its empty value).
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `status` as a number (0-2) or as its name.
fn status<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    use serde::de::Error;
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Number(i64),
        Name(String),
    }
    match Option::<Either>::deserialize(d)? {
        None => Ok(0),
        Some(Either::Number(n)) if (0..=2).contains(&n) => Ok(n as i32),
        Some(Either::Number(n)) => Err(D::Error::custom(format!("unknown status {n}"))),
        Some(Either::Name(s)) => match s.to_ascii_uppercase().as_str() {
            "ERROR" => Ok(0),
            "SUCCESS" => Ok(1),
            "FAILURE" => Ok(2),
            _ => Err(D::Error::custom(format!("unknown status {s:?}"))),
        },
    }
}

/// The status of an answer; an unknown number counts as an error.
pub fn status_of(n: i32) -> Status {
    Status::try_from(n).unwrap_or(Status::Error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn field_numbers_match_anycable() {
        // Env{url=1 "u"}; ConnectionRequest{env=3}: tag 3 (0x1a), len, then
        // tag 1 (0x0a) "u".
        let req = ConnectionRequest {
            env: Some(Env {
                url: "u".into(),
                ..Env::default()
            }),
        };
        assert_eq!(req.encode_to_vec(), vec![0x1a, 3, 0x0a, 1, b'u']);
        // CommandResponse: stopped_streams = 8 (0x42), presence = 9 (0x4a).
        let res = CommandResponse {
            status: 1,
            stopped_streams: vec!["s".into()],
            ..CommandResponse::default()
        };
        assert_eq!(res.encode_to_vec(), vec![0x08, 1, 0x42, 1, b's']);
        // DisconnectRequest: env = 5 (0x2a).
        let d = DisconnectRequest {
            env: Some(Env::default()),
            ..DisconnectRequest::default()
        };
        assert_eq!(d.encode_to_vec(), vec![0x2a, 0]);
    }

    #[test]
    fn json_is_lenient_on_answers() {
        let r: CommandResponse = serde_json::from_str(
            r#"{"status":"SUCCESS","streams":null,"stoppedStreams":["a"],"env":{"cstate":null,"istate":{"k":"v"}},"error_msg":""}"#,
        )
        .unwrap();
        assert_eq!(status_of(r.status), Status::Success);
        assert_eq!(r.stopped_streams, vec!["a".to_string()]);
        assert_eq!(r.env.unwrap().istate["k"], "v");
        assert!(serde_json::from_str::<CommandResponse>(r#"{"status":7}"#).is_err());
        let empty: ConnectionResponse = serde_json::from_str("{}").unwrap();
        assert_eq!(status_of(empty.status), Status::Error);
    }

    #[test]
    fn json_requests_leave_out_empty_fields() {
        let m = CommandMessage {
            command: "subscribe".into(),
            identifier: "x".into(),
            env: Some(Env {
                url: "http://h/cable".into(),
                ..Env::default()
            }),
            ..CommandMessage::default()
        };
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"command":"subscribe","identifier":"x","env":{"url":"http://h/cable"}}"#
        );
    }
}
