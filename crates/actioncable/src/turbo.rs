//! Turbo Streams and CableReady subscriptions decided here, without asking
//! the app (AnyCable's `--turbo_streams` and `--cable_ready_streams`).
//!
//! A Hotwire page subscribes with
//! `{"channel":"Turbo::StreamsChannel","signed_stream_name":"..."}` and a
//! CableReady one with `{"channel":"CableReady::Stream","identifier":"..."}`.
//! Both names are signed by the app with Rails' `MessageVerifier` (JSON
//! serializer, SHA256: base64 of the JSON-encoded stream name, `--`, the hex
//! HMAC-SHA256 of that base64 text), the format of `$pubsub` signed streams
//! ([`crate::streams`]), each with its own key: `config.turbo.
//! signed_stream_verifier_key` and CableReady's `verifier_key`. Each kind is
//! off unless enabled; its key defaults to the signed streams' key, as
//! AnyCable's does. A verified name is an ordinary stream: broadcasts to it
//! arrive through every broadcast path, with positions and history for
//! `actioncable-v1-ext-json` clients.

use crate::config::RpcConfig;
use crate::streams;
use serde::Deserialize;

/// The channel of Turbo Streams subscriptions (turbo-rails).
pub const TURBO_CHANNEL: &str = "Turbo::StreamsChannel";
/// The channel of CableReady stream subscriptions (`cable_ready_stream_from`).
pub const CABLE_READY_CHANNEL: &str = "CableReady::Stream";

#[derive(Deserialize)]
struct Identifier {
    channel: Option<String>,
    signed_stream_name: Option<String>,
    identifier: Option<String>,
}

/// The keys of the enabled kinds (`None`: that kind goes to the app).
#[derive(Debug, Default, Clone)]
pub struct SignedChannels {
    turbo: Option<String>,
    cable_ready: Option<String>,
}

impl SignedChannels {
    /// From the settings; `streams_key` is the signed streams' key (the
    /// default of both).
    pub fn new(config: &RpcConfig, streams_key: Option<&str>) -> SignedChannels {
        let key = |on: bool, own: &Option<String>| {
            on.then(|| own.as_deref().or(streams_key).map(str::to_owned))
                .flatten()
        };
        SignedChannels {
            turbo: key(config.turbo_streams, &config.turbo_streams_secret),
            cable_ready: key(config.cable_ready_streams, &config.cable_ready_secret),
        }
    }

    /// Whether any kind is decided here.
    pub fn any(&self) -> bool {
        self.turbo.is_some() || self.cable_ready.is_some()
    }

    /// Whether `identifier` names an enabled kind's channel (so this node,
    /// not the app, answers its commands).
    pub fn handles(&self, identifier: &str) -> bool {
        self.check(identifier).is_some()
    }

    /// For an identifier of an enabled kind: `Some` with the verified stream
    /// name, or `Some(None)` for a forged, missing or malformed one. `None`
    /// when it is not one of these channels (or that kind is off).
    pub fn check(&self, identifier: &str) -> Option<Option<String>> {
        if !self.any() || !identifier.contains("::") {
            return None;
        }
        let id = serde_json::from_str::<Identifier>(identifier).ok()?;
        let (key, signed) = match id.channel.as_deref()? {
            TURBO_CHANNEL => (self.turbo.as_deref()?, id.signed_stream_name),
            CABLE_READY_CHANNEL => (self.cable_ready.as_deref()?, id.identifier),
            _ => return None,
        };
        Some(
            signed
                .filter(|s| !s.is_empty())
                .and_then(|s| streams::verify(key, &s)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(turbo: bool, cr: bool) -> RpcConfig {
        RpcConfig {
            turbo_streams: turbo,
            cable_ready_streams: cr,
            ..Default::default()
        }
    }

    /// A vector made by hand, as Rails' `MessageVerifier.new(key, digest:
    /// "SHA256", serializer: JSON).generate("chat:1")` makes it:
    /// base64 of `"chat:1"` (with its quotes), then the hex HMAC of that.
    #[test]
    fn a_rails_vector_verifies() {
        let data = "ImNoYXQ6MSI=";
        let digest = streams::sign("s3cret", data);
        let signed = format!("{data}--{digest}");
        assert_eq!(signed, streams::signed_stream("s3cret", "chat:1"));
        let t = SignedChannels::new(&config(true, false), Some("s3cret"));
        let id =
            format!(r#"{{"channel":"Turbo::StreamsChannel","signed_stream_name":"{signed}"}}"#);
        assert_eq!(t.check(&id), Some(Some("chat:1".into())));
    }

    #[test]
    fn kinds_keys_and_forgeries() {
        let mut c = config(true, true);
        c.cable_ready_secret = Some("cr".into());
        let t = SignedChannels::new(&c, Some("streams"));
        let turbo = |s: &str| {
            format!(r#"{{"channel":"Turbo::StreamsChannel","signed_stream_name":"{s}"}}"#)
        };
        let cr = |s: &str| format!(r#"{{"channel":"CableReady::Stream","identifier":"{s}"}}"#);
        let good = streams::signed_stream("streams", "a");
        assert_eq!(t.check(&turbo(&good)), Some(Some("a".into())));
        // Signed with another key, tampered, missing.
        assert_eq!(
            t.check(&turbo(&streams::signed_stream("x", "a"))),
            Some(None)
        );
        assert_eq!(t.check(&turbo(&good.replace("--", "--0"))), Some(None));
        assert_eq!(
            t.check(r#"{"channel":"Turbo::StreamsChannel"}"#),
            Some(None)
        );
        // CableReady's own key, its own parameter.
        assert_eq!(t.check(&cr(&good)), Some(None));
        let crs = streams::signed_stream("cr", "b");
        assert_eq!(t.check(&cr(&crs)), Some(Some("b".into())));
        assert_eq!(t.check(&turbo(&crs)), Some(None));
        // Other channels go to the app; so does a kind that is off.
        assert_eq!(t.check(r#"{"channel":"ChatChannel"}"#), None);
        let off = SignedChannels::new(&config(false, true), Some("streams"));
        assert_eq!(off.check(&turbo(&good)), None);
        assert!(!off.handles(&turbo(&good)));
        assert!(off.handles(&cr(&streams::signed_stream("streams", "c"))));
    }
}
