//! What nodes send each other through the broker: JSON, one message per
//! broker message, every one naming the node it comes from.

use crate::tally::Key;
use herald_core::broker::{Control, Scope};
use herald_core::hub::{ChannelStats, StatsFilter};
use herald_core::namespace::{ChannelId, Namespace};
use herald_core::publication::{NodeId, Publication};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

pub type Info = Option<Box<RawValue>>;

/// One presence entry of a node's state: app, scope, user, info.
pub type Entry = (String, Scope, String, Info);

#[derive(Serialize, Deserialize)]
pub enum Msg {
    /// A publication (on its channel's subject, or `all` for a user).
    #[serde(rename = "P")]
    Pub {
        n: NodeId,
        a: String,
        p: Publication,
        /// Its number in node `n`'s sequence (0 from a node that does not
        /// number them): see engine/journal.rs and engine/recover.rs.
        #[serde(default)]
        s: u64,
    },
    /// A member's first socket on node `n` joined (`j`), or its last left.
    #[serde(rename = "M")]
    Member {
        n: NodeId,
        a: String,
        s: Scope,
        u: String,
        j: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        i: Info,
    },
    /// Node `n` is alive, with its connections per app. `h`: it has just
    /// connected (answer with a heartbeat of your own, to its node
    /// subject); `r`: it asks every node to send its presence state.
    #[serde(rename = "H")]
    Beat {
        n: NodeId,
        l: Vec<(String, u32)>,
        #[serde(default)]
        h: bool,
        #[serde(default)]
        r: bool,
        /// When the node started (ms since the epoch): the oldest node
        /// reports cluster-wide flips (see [`crate::tally`]).
        #[serde(default)]
        t: u64,
        /// Nodes the sender buried (sent by the leader only).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        g: Vec<NodeId>,
        /// The number of the sender's last publication (sent before this).
        #[serde(default)]
        s: u64,
    },
    /// Node `n` leaves the cluster (graceful shutdown).
    #[serde(rename = "B")]
    Bye { n: NodeId },
    #[serde(rename = "X")]
    Control { n: NodeId, a: String, c: Control },
    /// A request; every node answers on the asker's node subject.
    #[serde(rename = "Q")]
    Request {
        n: NodeId,
        id: u64,
        a: String,
        q: Query,
    },
    #[serde(rename = "R")]
    Reply { n: NodeId, id: u64, r: Answer },
    /// Node `n` has `c` subscriptions to channel `ch`.
    #[serde(rename = "C")]
    Count {
        n: NodeId,
        a: String,
        ns: Namespace,
        ch: String,
        c: usize,
    },
    /// Node `n`'s whole presence state follows (after a reconnect): parts,
    /// then the end, all on `all` so they arrive in order.
    #[serde(rename = "S")]
    StateBegin { n: NodeId },
    #[serde(rename = "T")]
    StatePart { n: NodeId, e: Vec<Entry> },
    #[serde(rename = "E")]
    StateEnd { n: NodeId },
    /// Node `n` now holds (`j`) or no longer holds a key of the tally: a
    /// channel with subscribers (`u` absent) or a presence member.
    #[serde(rename = "O")]
    Held {
        n: NodeId,
        a: String,
        ch: ChannelId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        u: Option<String>,
        j: bool,
    },
    /// Part of node `n`'s state: keys of the tally it holds.
    #[serde(rename = "K")]
    StateHeld { n: NodeId, k: Vec<Key> },
    /// Node `n` asks (on the receiver's node subject) for the publications
    /// it kept numbered above `f`.
    #[serde(rename = "V")]
    Recover { n: NodeId, f: u64 },
    /// Part of node `n`'s answer: `o` is the first number it still held
    /// above the one asked for, `e` its publications as sent (each a
    /// [`Msg::Pub`]), `d` the last part.
    #[serde(rename = "Y")]
    Replay {
        n: NodeId,
        o: u64,
        d: bool,
        e: Vec<Box<RawValue>>,
    },
}

impl Msg {
    pub fn from(&self) -> NodeId {
        match self {
            Msg::Pub { n, .. }
            | Msg::Member { n, .. }
            | Msg::Beat { n, .. }
            | Msg::Bye { n }
            | Msg::Control { n, .. }
            | Msg::Request { n, .. }
            | Msg::Reply { n, .. }
            | Msg::Count { n, .. }
            | Msg::StateBegin { n }
            | Msg::StatePart { n, .. }
            | Msg::StateEnd { n }
            | Msg::Held { n, .. }
            | Msg::StateHeld { n, .. }
            | Msg::Recover { n, .. }
            | Msg::Replay { n, .. } => *n,
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A publication as sent, borrowed (the same JSON as [`Msg::Pub`]).
#[derive(Serialize)]
pub enum PubRef<'a> {
    #[serde(rename = "P")]
    Pub {
        n: NodeId,
        a: &'a str,
        p: &'a Publication,
        s: u64,
    },
}

#[derive(Serialize, Deserialize)]
pub enum Query {
    Stats(Option<Namespace>, StatsFilter),
    Members(Scope),
    Cached(ChannelId),
    /// Answer at once (engine/reach.rs: interest known across a cluster).
    Probe,
}

// Answers are built once per query and serialized at once: the cached
// publication's size is not worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Serialize, Deserialize)]
pub enum Answer {
    Stats(Vec<ChannelStats>),
    Members(Vec<(String, Info)>),
    /// Milliseconds since the Unix epoch when it was published, and it.
    Cached(Option<(u64, Publication)>),
    Probe,
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::publication::json_string;

    #[test]
    fn publication_roundtrip_borrowed_and_owned() {
        let p = Publication::new(
            Namespace::new("n"),
            "c".into(),
            "e".into(),
            json_string("x"),
        )
        .cached(true);
        let bytes = serde_json::to_vec(&PubRef::Pub {
            n: 3,
            a: "app",
            p: &p,
            s: 9,
        })
        .unwrap();
        match serde_json::from_slice::<Msg>(&bytes).unwrap() {
            Msg::Pub { n, a, p, s } => {
                assert_eq!(
                    (n, a.as_str(), p.channel.as_str(), p.cache, s),
                    (3, "app", "c", true, 9)
                );
                assert_eq!(p.data.get(), "\"x\"");
            }
            _ => panic!("not a publication"),
        }
    }

    #[test]
    fn member_info_survives() {
        let m = Msg::Member {
            n: 1,
            a: "a".into(),
            s: Scope::Channel(ChannelId(Namespace::new("n"), "presence-x".into())),
            u: "u".into(),
            j: true,
            i: Some(RawValue::from_string("{\"k\":1}".into()).unwrap()),
        };
        match serde_json::from_slice::<Msg>(&m.to_bytes()).unwrap() {
            Msg::Member { i: Some(i), j, .. } => assert_eq!((i.get(), j), ("{\"k\":1}", true)),
            _ => panic!(),
        }
    }
}
