//! What the core needs from a protocol adapter to put bytes on a socket:
//! how to encode a publication and the events the core produces itself
//! (a confirmed subscription, a member joining or leaving, a count).
//!
//! Every connection carries its adapter's [`Wire`], and every subscription
//! a tag. Frames are built once per (wire, tag) and shared; a wire whose
//! frames differ per subscriber ([`Wire::per_subscriber`]) gets one shared
//! frame and adds the subscriber's part beside it ([`Wire::personalize`]).

use crate::fanout::Publication;
use crate::frame::Frame;
use serde_json::value::RawValue;

/// A presence member as the core lists it.
#[derive(Debug, Clone, Copy)]
pub struct MemberRef<'a> {
    pub user_id: &'a str,
    pub info: Option<&'a RawValue>,
}

/// Events the core produces, described independently of any wire format.
///
/// They are outcomes of the hub's own features (subscriptions, presence,
/// counts, the last-event cache, watched users), not one protocol's
/// messages: Pusher encodes every one; AppSync encodes `Subscribed` as its
/// `start_ack`/`subscribe_success` and answers `None` to the rest (its
/// protocols have no such messages); Action Cable answers `None` to all
/// today, and its extended protocol's presence (issue 19) is what the
/// member events are for. Hence they stay in the core, under neutral names.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A subscription was accepted; presence channels list their members.
    Subscribed {
        channel: &'a str,
        members: Option<&'a [MemberRef<'a>]>,
    },
    MemberAdded {
        channel: &'a str,
        member: MemberRef<'a>,
    },
    MemberRemoved {
        channel: &'a str,
        user_id: &'a str,
    },
    /// The channel's subscription count changed.
    SubscriptionCount {
        channel: &'a str,
        count: usize,
    },
    /// A subscriber asked for the channel's last event and there is none.
    CacheMiss {
        channel: &'a str,
    },
    /// Watched users came online or went offline.
    Watchlist {
        online: &'a [String],
        offline: &'a [String],
    },
}

/// One protocol's encoder, implemented by each adapter.
pub trait Wire: Send + Sync + 'static {
    /// Short name for logs and metrics labels; also the wire's identity.
    fn name(&self) -> &'static str;

    /// The frame subscribers with `tag` receive for `p`. Called once per
    /// (wire, tag) per publication, or once per publication with the empty
    /// tag when [`Wire::per_subscriber`] holds.
    fn publication(&self, p: &Publication, tag: &str) -> Frame;

    /// Whether every subscriber's tag is its own (a subscription id): then
    /// the frame is built once and [`Wire::personalize`] adds the tag.
    fn per_subscriber(&self) -> bool {
        false
    }

    /// A subscriber's frame from the shared one, without re-encoding it.
    fn personalize(&self, shared: &Frame, _tag: &str) -> Frame {
        shared.clone()
    }

    /// The frame for a core event to a subscription with `tag`; `None` when
    /// the protocol has no such message.
    fn event(&self, e: &Event<'_>, tag: &str) -> Option<Frame>;
}

/// Whether two wires are the same protocol.
pub fn same(a: &dyn Wire, b: &dyn Wire) -> bool {
    a.name() == b.name()
}

/// Encodes one [`Event`] at most once per (wire, tag) while it goes to many
/// subscriptions.
pub struct EncodeOnce<'a> {
    event: Event<'a>,
    frames: Vec<Encoded>,
}

/// One encoding: the wire's name, the tag, and the frame (`None`: the
/// wire sends nothing for this tag).
type Encoded = (&'static str, Option<std::sync::Arc<str>>, Option<Frame>);

impl<'a> EncodeOnce<'a> {
    pub fn new(event: Event<'a>) -> Self {
        EncodeOnce {
            event,
            frames: Vec::new(),
        }
    }

    pub fn frame(
        &mut self,
        wire: &'static dyn Wire,
        tag: &Option<std::sync::Arc<str>>,
    ) -> Option<Frame> {
        let name = wire.name();
        if let Some((_, _, f)) = self.frames.iter().find(|(n, t, _)| *n == name && t == tag) {
            return f.clone();
        }
        let f = wire.event(&self.event, tag.as_deref().unwrap_or(""));
        self.frames.push((name, tag.clone(), f.clone()));
        f
    }
}
