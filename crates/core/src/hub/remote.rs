//! Presence from other nodes: members that join and leave elsewhere, as
//! the broker reports them, applied to one namespace's channels here; and
//! the snapshot a presence channel new to this node starts from.

use super::presence::MemberState;
use super::space::Space;
use crate::publication::{EncodeOnce, Event, MemberRef, NodeId};
use serde_json::value::RawValue;
use std::sync::Arc;

impl Space {
    /// See [`super::Hub::remote_member`].
    pub(super) fn remote_member(
        &self,
        channel: &str,
        node: NodeId,
        user_id: &str,
        joined: Option<Option<Box<RawValue>>>,
    ) {
        let Some(mut entry) = self.channels.get_mut(channel) else {
            return;
        };
        let ch = entry.value_mut();
        if let Some(gone) = &mut ch.syncing {
            gone.retain(|(n, u)| !(*n == node && **u == *user_id));
            if joined.is_none() {
                gone.push((node, Arc::from(user_id)));
            }
        }
        match joined {
            Some(info) => {
                let was = {
                    let state = ch
                        .members
                        .entry(Arc::from(user_id))
                        .or_insert_with(|| MemberState::new(info));
                    let was = state.visible();
                    if !state.remote.contains(&node) {
                        state.remote.push(node);
                    }
                    was
                };
                if !was {
                    let info = ch.members.get(user_id).and_then(|m| m.info.as_deref());
                    let mut event = EncodeOnce::new(Event::MemberAdded {
                        channel,
                        member: MemberRef { user_id, info },
                    });
                    ch.send_to_all(None, &mut event);
                }
            }
            None => {
                let Some(state) = ch.members.get_mut(user_id) else {
                    return;
                };
                state.remote.retain(|n| *n != node);
                if !state.visible() {
                    ch.members.remove(user_id);
                    let mut event = EncodeOnce::new(Event::MemberRemoved { channel, user_id });
                    ch.send_to_all(None, &mut event);
                }
            }
        }
    }

    /// See [`super::Hub::begin_sync`].
    pub(super) fn begin_sync(&self, channel: &str) {
        let mut entry = self.channels.entry(channel.to_owned()).or_default();
        if entry.subs.is_empty() && entry.syncing.is_none() {
            entry.syncing = Some(Vec::new());
        }
    }

    /// See [`super::Hub::seed_members`].
    pub(super) fn seed_members(
        &self,
        channel: &str,
        members: Vec<(NodeId, String, Option<Box<RawValue>>)>,
    ) {
        let mut entry = self.channels.entry(channel.to_owned()).or_default();
        let gone = entry.syncing.take().unwrap_or_default();
        for (node, user, info) in members {
            if gone.iter().any(|(n, u)| *n == node && **u == *user) {
                continue;
            }
            let state = entry
                .members
                .entry(Arc::from(user.as_str()))
                .or_insert_with(|| MemberState::new(info));
            if !state.remote.contains(&node) {
                state.remote.push(node);
            }
        }
    }

    pub(super) fn is_syncing(&self, channel: &str) -> bool {
        self.channels
            .get(channel)
            .is_some_and(|c| c.syncing.is_some())
    }

    pub(super) fn drop_if_unused(&self, channel: &str) -> bool {
        self.channels
            .remove_if(channel, |_, c| c.subs.is_empty())
            .is_some()
    }
}
