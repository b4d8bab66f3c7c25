//! One channel's state on this node: its subscriptions (with the snapshot
//! fan-out reads), presence members, and the figures kept for counts. The
//! helpers here send to a channel's subscribers under its lock, so frames
//! that must stay in order (`Subscribed`, `MemberAdded`) do.

use super::presence::MemberState;
use crate::connection::Connection;
use crate::fanout::Target;
use crate::publication::{ConnId, EncodeOnce, Event, MemberRef, NodeId, Tag};
use dashmap::DashMap;
use std::collections::HashMap;
use std::sync::Arc;

/// One channel's subscribers and members on this node.
#[derive(Default)]
pub(super) struct Channel {
    pub(super) subs: HashMap<(ConnId, Tag), Sub>,
    /// The subscriber list fan-out reads, rebuilt after a change.
    pub(super) snapshot: Option<Arc<[Target]>>,
    /// Presence members by user id (empty for other channels).
    pub(super) members: HashMap<Arc<str>, MemberState>,
    /// Its subscription count is pushed to subscribers.
    pub(super) count: bool,
    /// Subscriptions on other nodes, as they reported them.
    pub(super) remote_counts: HashMap<NodeId, usize>,
    /// While the members on other nodes are being fetched: (node, user)
    /// pairs that left meanwhile, so the fetched list does not bring them
    /// back (see [`super::Hub::begin_sync`]).
    pub(super) syncing: Option<Vec<(NodeId, Arc<str>)>>,
}

pub(super) struct Sub {
    pub(super) target: Target,
    /// The presence user this subscription joined as.
    pub(super) user: Option<Arc<str>>,
}

impl Channel {
    pub(super) fn snapshot(&mut self) -> Arc<[Target]> {
        self.snapshot
            .get_or_insert_with(|| self.subs.values().map(|s| s.target.clone()).collect())
            .clone()
    }

    pub(super) fn send_to_all(&self, except: Option<ConnId>, event: &mut EncodeOnce<'_>) {
        for ((id, _), sub) in &self.subs {
            if Some(*id) != except {
                let t = &sub.target;
                if let Some(f) = event.frame(t.conn.wire, &t.tag) {
                    t.conn.send(f);
                }
            }
        }
    }

    fn member_list(&self) -> Vec<MemberRef<'_>> {
        self.members
            .iter()
            .filter(|(_, m)| m.visible())
            .map(|(id, m)| MemberRef {
                user_id: id,
                info: m.info.as_deref(),
            })
            .collect()
    }
}

/// A channel's subscriber snapshot: under a shared lock when it is built
/// (the common case), rebuilt under the shard's write lock after a change.
pub(super) fn snapshot_of(map: &DashMap<String, Channel>, name: &str) -> Option<Arc<[Target]>> {
    if let Some(ch) = map.get(name) {
        if ch.subs.is_empty() {
            return None;
        }
        if let Some(s) = &ch.snapshot {
            return Some(s.clone());
        }
    }
    let mut ch = map.get_mut(name)?;
    (!ch.subs.is_empty()).then(|| ch.snapshot())
}

pub(super) fn send_subscribed(
    conn: &Connection,
    tag: &Tag,
    channel: &str,
    ch: &Channel,
    presence: bool,
) {
    let list;
    let members = if presence {
        list = ch.member_list();
        Some(list.as_slice())
    } else {
        None
    };
    if let Some(f) = conn.wire.event(
        &Event::Subscribed { channel, members },
        tag.as_deref().unwrap_or(""),
    ) {
        conn.send(f);
    }
}

/// The pattern prefixes that match `channel`: each prefix ending at a `/`,
/// shortest first (`/a/b/c` → `/`, `/a/`, `/a/b/`).
pub fn prefixes(channel: &str) -> impl Iterator<Item = &str> {
    channel
        .char_indices()
        .filter(|(_, c)| *c == '/')
        .map(move |(i, _)| &channel[..=i])
}
