//! Protocol adapters' wire formats. Each submodule parses its clients'
//! frames into core commands and encodes core events into its own frames;
//! none of them holds channel semantics (that is the hub's job).
//!
//! [`Protocol`] tags a connection with the format its frames use, so the
//! fan-out can encode each message once per protocol, not once per socket.

pub mod pusher;

/// The wire format a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Pusher Channels v7 (`/app/{key}`).
    Pusher,
}

impl Protocol {
    /// Index into per-protocol caches of encoded frames.
    pub const COUNT: usize = 1;

    pub fn index(self) -> usize {
        match self {
            Protocol::Pusher => 0,
        }
    }
}

use crate::fanout::Frame;
use serde_json::value::RawValue;

/// Events the hub produces itself (not published by anyone), described
/// independently of any wire format. Each protocol adapter encodes them.
pub enum CoreEvent<'a> {
    SubscriptionSucceeded {
        channel: &'a str,
        presence: Option<&'a [pusher::PresenceEntry<'a>]>,
    },
    MemberAdded {
        channel: &'a str,
        user_id: &'a str,
        user_info: Option<&'a RawValue>,
    },
    MemberRemoved {
        channel: &'a str,
        user_id: &'a str,
    },
    SubscriptionCount {
        channel: &'a str,
        count: usize,
    },
    CacheMiss {
        channel: &'a str,
    },
    Watchlist {
        online: &'a [String],
        offline: &'a [String],
    },
}

impl CoreEvent<'_> {
    pub fn encode(&self, protocol: Protocol) -> Frame {
        match protocol {
            Protocol::Pusher => match self {
                CoreEvent::SubscriptionSucceeded { channel, presence } => {
                    pusher::subscription_succeeded(channel, *presence)
                }
                CoreEvent::MemberAdded {
                    channel,
                    user_id,
                    user_info,
                } => pusher::member_added(channel, user_id, *user_info),
                CoreEvent::MemberRemoved { channel, user_id } => {
                    pusher::member_removed(channel, user_id)
                }
                CoreEvent::SubscriptionCount { channel, count } => {
                    pusher::subscription_count(channel, *count)
                }
                CoreEvent::CacheMiss { channel } => pusher::cache_miss(channel),
                CoreEvent::Watchlist { online, offline } => {
                    pusher::watchlist_events(&[("online", online), ("offline", offline)])
                }
            }
            .into(),
        }
    }
}

/// Encodes a [`CoreEvent`] at most once per protocol while it is sent to
/// many connections.
pub struct EncodeOnce<'a> {
    event: CoreEvent<'a>,
    frames: [Option<Frame>; Protocol::COUNT],
}

impl<'a> EncodeOnce<'a> {
    pub fn new(event: CoreEvent<'a>) -> Self {
        EncodeOnce {
            event,
            frames: Default::default(),
        }
    }

    pub fn frame(&mut self, protocol: Protocol) -> Frame {
        self.frames[protocol.index()]
            .get_or_insert_with(|| self.event.encode(protocol))
            .clone()
    }
}
