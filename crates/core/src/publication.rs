//! The publication: the core's central noun, on the ground floor.
//!
//! [`Publication`] is what travels from a publisher through the node and
//! the broker, with the ids that place it ([`NodeId`], [`ConnId`], a
//! subscription's [`Tag`]) and its [`Position`] on a reliable stream. Its
//! frames are built lazily: on the first subscriber of each (wire, tag),
//! then cloned (a reference count) into every other queue.
//!
//! Beside it, what the core needs from a protocol adapter to put bytes on a
//! socket: how to encode a publication and the events the core produces
//! itself (a confirmed subscription, a member joining or leaving, a count).
//! Every connection carries its adapter's [`Wire`], and every subscription
//! a tag. Frames are built once per (wire, tag) and shared; a wire whose
//! frames differ per subscriber ([`Wire::per_subscriber`]) gets one shared
//! frame and adds the subscriber's part beside it ([`Wire::personalize`]).

use crate::frame::Frame;
use crate::metrics;
use crate::namespace::Namespace;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::sync::{Arc, OnceLock};

/// Identifies a node (one `herald serve` process) in a cluster.
pub type NodeId = u64;

/// Process-unique connection number; the key in every registry.
pub type ConnId = u64;

/// A subscription's tag: what makes its frames differ from other
/// subscribers' of the same channel (`None`: the empty tag).
pub type Tag = Option<Arc<str>>;

/// Where a publication sits in its stream's history. Carried between
/// nodes with the publication (`{"e":epoch,"o":offset}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    #[serde(rename = "e")]
    pub epoch: Arc<str>,
    #[serde(rename = "o")]
    pub offset: u64,
}

/// An event published on a channel.
#[derive(Serialize, Deserialize)]
pub struct Publication {
    /// The namespace of the protocol whose channel this is.
    #[serde(rename = "n")]
    pub ns: Namespace,
    #[serde(rename = "c")]
    pub channel: String,
    /// The event's name (protocols without names leave it empty).
    #[serde(rename = "e")]
    pub event: String,
    /// The payload as JSON, relayed exactly as the publisher gave it.
    #[serde(rename = "d")]
    pub data: Box<RawValue>,
    /// Public id of a socket that must not receive it (its sender).
    #[serde(rename = "x", default, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<String>,
    /// The sender's user id, where the protocol shows it.
    #[serde(rename = "u", default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// Deliver to this signed-in user's sockets instead of the channel's
    /// subscribers (the channel name is kept for the frame).
    #[serde(rename = "t", default, skip_serializing_if = "Option::is_none")]
    pub to_user: Option<String>,
    /// Keep as the channel's last event, replayed to new subscribers.
    #[serde(rename = "k", default)]
    pub cache: bool,
    /// The node it was first published on, and its id there: a node never
    /// delivers again what it published itself.
    #[serde(rename = "o", default)]
    pub origin: NodeId,
    #[serde(rename = "i", default)]
    pub id: u64,
    /// `exclude` resolved on the delivering node: the connection it names
    /// there, if it names one of that node's (see [`Publication::resolve`]).
    #[serde(skip)]
    exclude_conn: Option<ConnId>,
    /// Reliable streams: the publication's place in its stream's
    /// history, set by reliable publishing ([`crate::reliable`]); carried to
    /// the other nodes with it.
    #[serde(rename = "q", default, skip_serializing_if = "Option::is_none")]
    pub position: Option<Position>,
    #[serde(skip)]
    frames: Frames,
}

impl std::fmt::Debug for Publication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publication")
            .field("ns", &self.ns)
            .field("channel", &self.channel)
            .field("event", &self.event)
            .field("origin", &self.origin)
            .field("id", &self.id)
            .finish()
    }
}

/// Frames built so far: the first (wire, tag) pair lock-free, the rest
/// behind a lock only protocols with several tags per channel touch.
#[derive(Default)]
struct Frames {
    first: OnceLock<(&'static str, Tag, Frame)>,
    more: Mutex<Vec<(&'static str, Tag, Frame)>>,
}

impl Publication {
    pub fn new(ns: Namespace, channel: String, event: String, data: Box<RawValue>) -> Publication {
        Publication {
            ns,
            channel,
            event,
            data,
            exclude: None,
            user_id: None,
            to_user: None,
            cache: false,
            origin: 0,
            id: 0,
            exclude_conn: None,
            position: None,
            frames: Frames::default(),
        }
    }

    pub fn excluding(mut self, socket_id: Option<String>) -> Self {
        self.exclude = socket_id;
        self
    }

    /// A client's own event, sent by the socket `socket_id` (excluded from
    /// its delivery).
    pub fn sent_by(self, socket_id: String) -> Self {
        self.excluding(Some(socket_id))
    }

    pub fn from_user(mut self, user_id: Option<String>) -> Self {
        self.user_id = user_id;
        self
    }

    pub fn to_user(mut self, user_id: Option<String>) -> Self {
        self.to_user = user_id;
        self
    }

    pub fn cached(mut self, cache: bool) -> Self {
        self.cache = cache;
        self
    }

    /// The frame for subscribers speaking `wire` with `tag`, built on first
    /// use and shared afterwards.
    pub fn frame(&self, wire: &'static dyn Wire, tag: &Tag) -> Frame {
        if wire.per_subscriber() {
            let shared = self.shared(wire, &None);
            return wire.personalize(&shared, tag.as_deref().unwrap_or(""));
        }
        self.shared(wire, tag)
    }

    fn shared(&self, wire: &'static dyn Wire, tag: &Tag) -> Frame {
        let name = wire.name();
        let first = self
            .frames
            .first
            .get_or_init(|| (name, tag.clone(), self.encode(wire, tag)));
        if first.0 == name && first.1 == *tag {
            return first.2.clone();
        }
        let mut more = self.frames.more.lock();
        if let Some((_, _, f)) = more.iter().find(|(n, t, _)| *n == name && t == tag) {
            return f.clone();
        }
        let f = self.encode(wire, tag);
        more.push((name, tag.clone(), f.clone()));
        f
    }

    fn encode(&self, wire: &'static dyn Wire, tag: &Tag) -> Frame {
        metrics::count(&metrics::FRAMES_ENCODED);
        wire.publication(self, tag.as_deref().unwrap_or(""))
    }

    /// Resolve `exclude` for delivery on node `node`: public socket ids are
    /// `"{node}.{connection}"`, so fan-out compares connection numbers, not
    /// strings, and a socket of another node excludes nobody here.
    pub fn resolve(&mut self, node: NodeId) {
        self.exclude_conn = self.exclude.as_deref().and_then(|sid| {
            let (n, c) = sid.split_once('.')?;
            // "node.conn" or, for resumable sessions, "node.conn.secret".
            let c = c.split('.').next()?;
            (n.parse::<NodeId>().ok()? == node).then(|| c.parse().ok())?
        });
    }

    /// Whether the connection with this number should skip the message.
    pub fn excludes(&self, conn: ConnId) -> bool {
        self.exclude_conn == Some(conn)
    }

    /// The publication as bytes for a broker (frames are not carried: each
    /// node builds its own).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a publication serializes")
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Publication, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// `s` as a JSON string literal (with its quotes): every adapter writes
/// names and ids into frames it builds by hand.
pub fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// A JSON string value holding `s`.
pub fn json_string(s: &str) -> Box<RawValue> {
    RawValue::from_string(quote(s)).expect("a serialized string is valid JSON")
}

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
/// today, and its extended protocol's presence is what the
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
