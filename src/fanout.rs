//! Fan-out: a published message, encoded once per protocol and shared by
//! every subscriber as the same bytes.
//!
//! [`Publication`] is what travels from the hub through the broker. Its wire
//! frames are built lazily, on the first subscriber of each protocol, then
//! cloned (a reference-count bump) into every other subscriber's queue. No
//! per-subscriber JSON work happens on the hot path.

use crate::protocol::{pusher, Protocol};
use serde_json::value::RawValue;
use std::sync::OnceLock;

/// One encoded WebSocket text frame; cloning shares the bytes.
pub type Frame = axum::extract::ws::Utf8Bytes;

/// An event published on a channel.
#[derive(Debug)]
pub struct Publication {
    pub channel: String,
    pub event: String,
    /// The event's `data` as JSON: a string for HTTP API events, any value
    /// for client events (relayed exactly as the client sent it).
    pub data: Box<RawValue>,
    /// Socket id that must not receive it (the sender, or `socket_id` of an
    /// API call).
    pub exclude: Option<String>,
    /// Sender's user id, carried on presence-channel client events.
    pub user_id: Option<String>,
    frames: [OnceLock<Frame>; Protocol::COUNT],
}

impl Publication {
    pub fn new(
        channel: String,
        event: String,
        data: Box<RawValue>,
        exclude: Option<String>,
        user_id: Option<String>,
    ) -> Publication {
        Publication {
            channel,
            event,
            data,
            exclude,
            user_id,
            frames: Default::default(),
        }
    }

    /// The frame for `protocol`, encoded on first use.
    pub fn frame(&self, protocol: Protocol) -> &Frame {
        self.frames[protocol.index()].get_or_init(|| match protocol {
            Protocol::Pusher => pusher::encode_raw(
                &self.event,
                Some(&self.channel),
                &self.data,
                self.user_id.as_deref(),
            )
            .into(),
        })
    }

    /// Whether the socket with this id should skip the message.
    pub fn excludes(&self, socket_id: &str) -> bool {
        self.exclude.as_deref() == Some(socket_id)
    }
}

/// A JSON string value holding `s` (how Pusher carries event data).
pub fn json_string(s: &str) -> Box<RawValue> {
    RawValue::from_string(serde_json::to_string(s).expect("string serializes"))
        .expect("a serialized string is valid JSON")
}
