//! Presence and whispers as AnyCable 1.6 speaks them on
//! `actioncable-v1-ext-json`: which streams allow them, the
//! member a `join` names, the `presence` frames (join, leave, info, error),
//! and what is left of a member whose connection closed without leaving.
//!
//! A stream is presence-enabled (whisper-enabled) for a subscription when
//! the subscription's state has `$p` (`$w`) set to the stream's name:
//! the app's RPC `subscribe` answer sets it, as AnyCable's Rails and JS
//! libraries do; `$pubsub` subscriptions get it from `rpc.streams_presence`
//! and `rpc.streams_whisper` (public streams always), as anycable-go does.
//!
//! Members live in the core's hub, in a namespace of their own
//! ([`NAMESPACE`]), one hub channel per presence stream with the member as
//! the subscription's presence user: the hub counts a member's sockets on
//! this node and learns the other nodes' from the broker, so one id joined
//! from several connections (or nodes) is one member, announced once and
//! removed once, exactly as Pusher's presence channels are. Announcements
//! go to every subscriber of the stream (joined or not) as a publication
//! of the stream marked [`EVENT`], which the wire writes as a `presence`
//! frame and which, like a whisper, has no position (AnyCable's
//! "transient" messages: never in the history).
//!
//! The members of a node that died (or left) leave without anyone on
//! their node to announce it: the engine removes them and has one node
//! report each removal for the cluster, the same decision Pusher's
//! `member_removed` webhook is made from; [`Gone`] hears it and announces
//! the leave on the stream, so every subscriber hears it once.

use crate::config::RpcConfig;
use crate::wire::json_string;
use herald_core::connection::Connection;
use herald_core::hub::Hub;
use herald_core::namespace::Namespace;
use herald_core::node::Node;
use herald_core::observer::{Change, Observer};
use herald_core::publication::Publication;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The hub namespace of presence members (channel = the stream's name),
/// apart from the streams' own so a stream's publications never reach it.
pub const NAMESPACE: Namespace = Namespace::new("actioncable-presence");

/// The event name marking a stream publication as a presence event.
pub use crate::wire::PRESENCE_EVENT as EVENT;

/// Subscription state keys, AnyCable's: the stream a subscription may
/// whisper on, and the stream whose presence it may join.
pub const WHISPER_STATE: &str = "$w";
pub const PRESENCE_STATE: &str = "$p";

/// The presence and whisper settings of `[rpc]`.
#[derive(Debug, Clone)]
pub struct Settings {
    pub ttl: Duration,
    pub streams_presence: bool,
    pub streams_whisper: bool,
    pub max_members: usize,
    pub max_records: usize,
    pub max_info: usize,
    pub max_joins: usize,
    pub whisper_rate: u32,
    pub presence_rate: u32,
}

impl Settings {
    pub fn new(c: &RpcConfig) -> Settings {
        Settings {
            ttl: Duration::from_secs(c.presence_ttl),
            streams_presence: c.streams_presence,
            streams_whisper: c.streams_whisper,
            max_members: c.presence_max_members,
            max_records: c.presence_max_records,
            max_info: c.presence_max_info,
            max_joins: c.presence_max_joins,
            whisper_rate: c.whisper_rate,
            presence_rate: c.presence_rate,
        }
    }
}

/// A token bucket: `rate` a second, bursts of `rate`.
#[derive(Debug)]
pub struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    pub fn full(rate: u32) -> Bucket {
        Bucket {
            tokens: f64::from(rate),
            at: Instant::now(),
        }
    }

    /// Take one token, if there is one.
    pub fn take(&mut self, rate: u32) -> bool {
        let rate = f64::from(rate);
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * rate).min(rate);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A connection's presence: the streams it joined (by subscription) and
/// its buckets.
#[derive(Debug)]
pub struct ConnPresence {
    /// (subscription identifier, presence stream, member id).
    pub joined: Vec<(Arc<str>, String, String)>,
    pub whispers: Bucket,
    pub commands: Bucket,
}

impl ConnPresence {
    pub fn new(s: &Settings) -> ConnPresence {
        ConnPresence {
            joined: Vec::new(),
            whispers: Bucket::full(s.whisper_rate),
            commands: Bucket::full(s.presence_rate),
        }
    }
}

/// A member as a `join` names it.
#[derive(Debug, Deserialize)]
pub struct Member {
    pub id: String,
    #[serde(default)]
    pub info: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
struct WithPresence {
    #[serde(default)]
    presence: Option<Member>,
}

/// The `presence` field of a client command (`join`, or `subscribe` on a
/// reconnect): `Ok(None)` when absent, `Err` saying what is wrong when it
/// is malformed, has an empty id, or its id and info take more than
/// `max_info` bytes.
pub fn member(text: &str, max_info: usize) -> Result<Option<Member>, String> {
    let w: WithPresence =
        serde_json::from_str(text).map_err(|e| format!("`presence` is malformed: {e}"))?;
    let Some(m) = w.presence else {
        return Ok(None);
    };
    if m.id.is_empty() {
        return Err("`presence.id` is empty".into());
    }
    let size = m.id.len() + m.info.as_ref().map_or(0, |i| i.get().len());
    if size > max_info {
        return Err(format!(
            "`presence` id and info take {size} bytes; the limit is {max_info} (rpc.presence_max_info)"
        ));
    }
    Ok(Some(m))
}

/// The member an app's RPC answer names (`PresenceResponse`: `id`, and
/// `info` as JSON text; text that is not JSON is the info as a string, as
/// anycable-go reads it), within the same bounds as a client's.
pub fn app_member(id: String, info: String, max_info: usize) -> Result<Member, String> {
    if id.is_empty() {
        return Err("`presence.id` is empty".into());
    }
    let info = match info.as_str() {
        "" => None,
        text => Some(match RawValue::from_string(text.to_owned()) {
            Ok(json) => json,
            Err(_) => RawValue::from_string(json_string(text)).expect("a JSON string"),
        }),
    };
    let size = id.len() + info.as_ref().map_or(0, |i| i.get().len());
    if size > max_info {
        return Err(format!(
            "`presence` id and info take {size} bytes; the limit is {max_info} (rpc.presence_max_info)"
        ));
    }
    Ok(Member { id, info })
}

#[derive(Deserialize, Default)]
struct InfoOptions {
    #[serde(default = "yes")]
    return_records: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct WithData {
    #[serde(default)]
    data: Option<InfoOptions>,
}

/// Whether a `presence` (info) command wants the records (AnyCable's
/// `data.return_records`, true unless it says false).
pub fn wants_records(text: &str) -> bool {
    serde_json::from_str::<WithData>(text)
        .ok()
        .and_then(|w| w.data)
        .is_none_or(|o| o.return_records)
}

/// A join event's message, as anycable-go 1.6.16 writes it (`id`,
/// `info`, `type`; `info` left out when the member has none).
pub fn join_event(id: &str, info: Option<&RawValue>) -> Box<RawValue> {
    let s = match info {
        Some(i) => format!(
            r#"{{"id":{},"info":{},"type":"join"}}"#,
            json_string(id),
            i.get()
        ),
        None => format!(r#"{{"id":{},"type":"join"}}"#, json_string(id)),
    };
    RawValue::from_string(s).expect("built as JSON")
}

pub fn leave_event(id: &str) -> Box<RawValue> {
    RawValue::from_string(format!(r#"{{"id":{},"type":"leave"}}"#, json_string(id)))
        .expect("built as JSON")
}

/// A `presence` frame for subscription `identifier` carrying `message`.
pub use crate::wire::presence_frame as frame;

/// The answer to `presence`: how many members, and (unless the client
/// said `return_records: false`) up to `rpc.presence_max_records` of them.
pub fn info_frame(
    identifier: &str,
    total: usize,
    records: Option<&[herald_core::hub::presence::Record]>,
) -> String {
    let mut m = format!(r#"{{"type":"info","total":{total}"#);
    if let Some(records) = records.filter(|r| !r.is_empty()) {
        m.push_str(r#","records":["#);
        for (n, (id, info)) in records.iter().enumerate() {
            if n > 0 {
                m.push(',');
            }
            match info {
                Some(i) => m.push_str(&format!(
                    r#"{{"info":{},"id":{}}}"#,
                    i.get(),
                    json_string(id)
                )),
                None => m.push_str(&format!(r#"{{"id":{}}}"#, json_string(id))),
            }
        }
        m.push(']');
    }
    m.push('}');
    frame(identifier, &m)
}

/// AnyCable answers a presence command it cannot serve with
/// `{"type":"error"}` (the client rejects its pending `info()`); Herald
/// adds why.
pub fn error_frame(identifier: &str, why: &str) -> String {
    frame(
        identifier,
        &format!(r#"{{"type":"error","reason":{}}}"#, json_string(why)),
    )
}

/// Tell every subscriber of `stream`, on every node, of a presence event.
pub async fn announce(node: &Node, hub: &Hub, stream: &str, message: Box<RawValue>) {
    let p = Publication::new(crate::NAMESPACE, stream.to_owned(), EVENT.into(), message);
    let _ = node.publish(hub, p).await;
}

/// Take `conn`'s memberships out of presence, announcing each member no
/// connection is left for anywhere.
pub async fn remove_all(
    node: &Node,
    hub: &Hub,
    conn: &Connection,
    joined: Vec<(Arc<str>, String, String)>,
) {
    for (identifier, stream, id) in joined {
        let left = node.unsubscribe_left(hub, conn, NAMESPACE, &stream, &Some(identifier), false);
        if left.member_removed {
            announce(node, hub, &stream, leave_event(&id)).await;
        }
    }
}

/// Announces the leave of a member whose node is gone (see the module
/// doc). Registered for [`NAMESPACE`] only ([`Node::observe_in`]): the
/// cluster-wide member decisions are then made for presence streams, and
/// for nothing else.
pub struct Gone {
    node: Weak<Node>,
    app_id: String,
}

impl Gone {
    /// Hear, on `node`, of the members of `hub`'s app whose node is gone.
    pub fn register(node: &Arc<Node>, hub: &Hub) {
        let gone = Gone {
            node: Arc::downgrade(node),
            app_id: hub.app.id.clone(),
        };
        node.observe_in(NAMESPACE, Arc::new(gone));
    }
}

impl Observer for Gone {
    /// Leaves of live nodes' members are announced by their node (the
    /// session, when the member's last connection there leaves).
    fn changed(&self, _: &str, _: Namespace, _: &Change<'_>) {}

    fn gone(&self, app_id: &str, ns: Namespace, change: &Change<'_>) {
        let Change::MemberRemoved { channel, user_id } = *change else {
            return;
        };
        if ns != NAMESPACE || app_id != self.app_id {
            return;
        }
        let (Some(node), Ok(rt)) = (self.node.upgrade(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let Some(hub) = node.hub_by_id(app_id) else {
            return;
        };
        tracing::debug!(stream = channel, "member of a gone node left");
        let (stream, event) = (channel.to_owned(), leave_event(user_id));
        // Observers must not block: the publication goes on a task.
        rt.spawn(async move { announce(&node, &hub, &stream, event).await });
    }
}

/// A connection closed without leaving: its memberships stay for `ttl`
/// (a client that reconnects and joins again within it is one member
/// throughout, with no leave and join in between), then go.
pub fn linger(
    node: Arc<Node>,
    hub: Arc<Hub>,
    conn: Arc<Connection>,
    joined: Vec<(Arc<str>, String, String)>,
    ttl: Duration,
) {
    // Nothing to keep, or no runtime left to keep it on (the process is
    // going away, and the broker drops this node's members with it).
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if joined.is_empty() {
        return;
    }
    rt.spawn(async move {
        tokio::time::sleep(ttl).await;
        remove_all(&node, &hub, &conn, joined).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_match_anycable() {
        let info = RawValue::from_string(r#"{"name":"Ann"}"#.into()).unwrap();
        assert_eq!(
            join_event("1", Some(&info)).get(),
            r#"{"id":"1","info":{"name":"Ann"},"type":"join"}"#
        );
        assert_eq!(leave_event("1").get(), r#"{"id":"1","type":"leave"}"#);
        assert_eq!(
            info_frame("i", 1, Some(&[("1".into(), Some(info))])),
            r#"{"type":"presence","identifier":"i","message":{"type":"info","total":1,"records":[{"info":{"name":"Ann"},"id":"1"}]}}"#
        );
        assert_eq!(
            info_frame("i", 0, Some(&[])),
            r#"{"type":"presence","identifier":"i","message":{"type":"info","total":0}}"#
        );
    }

    #[test]
    fn members_are_checked() {
        let m = member(r#"{"presence":{"id":"7","info":{"a":1}}}"#, 64)
            .unwrap()
            .unwrap();
        assert_eq!((m.id.as_str(), m.info.unwrap().get()), ("7", r#"{"a":1}"#));
        assert!(member(r#"{"command":"join"}"#, 64).unwrap().is_none());
        assert!(member(r#"{"presence":{"id":""}}"#, 64).is_err());
        assert!(member(r#"{"presence":{"id":7}}"#, 64).is_err());
        assert!(member(r#"{"presence":"x"}"#, 64).is_err());
        let big = format!(r#"{{"presence":{{"id":"1","info":"{}"}}}}"#, "x".repeat(64));
        assert!(member(&big, 64).unwrap_err().contains("presence_max_info"));
        assert!(wants_records(r#"{"command":"presence"}"#));
        assert!(!wants_records(r#"{"data":{"return_records":false}}"#));
    }

    /// docs/actioncable.md states what every connection carries for this.
    #[test]
    fn per_connection_state_is_72_bytes() {
        assert!(std::mem::size_of::<ConnPresence>() <= 72);
    }

    #[test]
    fn buckets_refill() {
        let mut b = Bucket::full(2);
        assert!(b.take(2) && b.take(2));
        assert!(!b.take(2));
    }
}
