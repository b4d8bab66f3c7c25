//! Streams a client may subscribe to without asking the app: AnyCable's
//! `$pubsub` channel, with a signed stream name (Rails' `MessageVerifier`
//! format: base64 of the JSON-encoded name, `--`, the hex HMAC-SHA256 of
//! that base64 text) or, when `rpc.public_streams` is on, a plain one.

use base64::Engine;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The channel name of stream subscriptions.
pub const PUBSUB: &str = "$pubsub";

#[derive(Deserialize)]
struct Identifier {
    channel: Option<String>,
    stream_name: Option<String>,
    signed_stream_name: Option<String>,
}

/// What a `$pubsub` identifier asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// Not a `$pubsub` identifier: the app decides.
    NotPubsub,
    Public(String),
    Signed(String),
    /// A `$pubsub` identifier without a stream.
    Malformed,
}

pub fn request(identifier: &str) -> Request {
    let Ok(id) = serde_json::from_str::<Identifier>(identifier) else {
        return Request::NotPubsub;
    };
    if id.channel.as_deref() != Some(PUBSUB) {
        return Request::NotPubsub;
    }
    match (id.signed_stream_name, id.stream_name) {
        (Some(s), _) if !s.is_empty() => Request::Signed(s),
        (_, Some(s)) if !s.is_empty() => Request::Public(s),
        _ => Request::Malformed,
    }
}

/// The hex HMAC-SHA256 of `data` with `key`.
pub fn sign(key: &str, data: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("any key length");
    mac.update(data.as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Sign a stream name (for tests and tools).
pub fn signed_stream(key: &str, stream: &str) -> String {
    let json = serde_json::to_string(stream).expect("a string serializes");
    let data = base64::engine::general_purpose::STANDARD.encode(json);
    let digest = sign(key, &data);
    format!("{data}--{digest}")
}

/// The stream name inside a signed one, if the signature is right.
pub fn verify(key: &str, signed: &str) -> Option<String> {
    let mut parts = signed.split("--");
    let (data, digest) = (parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let want = sign(key, data);
    if !bool::from(want.as_bytes().ct_eq(digest.as_bytes())) {
        return None;
    }
    let json = base64::engine::general_purpose::STANDARD
        .decode(data)
        .ok()?;
    serde_json::from_slice::<String>(&json).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_streams_roundtrip_and_reject_tampering() {
        let s = signed_stream("k", "chat_42");
        assert_eq!(verify("k", &s).as_deref(), Some("chat_42"));
        assert_eq!(verify("other", &s), None);
        let (data, digest) = s.split_once("--").unwrap();
        let mut bad = digest.to_owned();
        bad.replace_range(0..1, if &bad[0..1] == "0" { "1" } else { "0" });
        assert_eq!(verify("k", &format!("{data}--{bad}")), None);
        assert_eq!(verify("k", "nodigest"), None);
        assert_eq!(verify("k", &format!("{s}--x")), None);
    }

    #[test]
    fn pubsub_identifiers() {
        assert_eq!(request(r#"{"channel":"Chat"}"#), Request::NotPubsub);
        assert_eq!(request("not json"), Request::NotPubsub);
        assert_eq!(
            request(r#"{"channel":"$pubsub","stream_name":"a"}"#),
            Request::Public("a".into())
        );
        assert_eq!(
            request(r#"{"channel":"$pubsub","signed_stream_name":"x--y"}"#),
            Request::Signed("x--y".into())
        );
        assert_eq!(request(r#"{"channel":"$pubsub"}"#), Request::Malformed);
    }
}
