//! One namespace's channels in an app's hub: the subscription registry
//! (exact channels and trailing-wildcard patterns) that subscribing,
//! unsubscribing and publishing go through. Each protocol's channels live
//! in their own [`Space`], so the same name in two namespaces is two
//! channels and a query of one namespace never sees another's.

use super::cache::Cache;
use super::channel::{prefixes, send_subscribed, snapshot_of, Channel, Sub};
use super::presence::MemberState;
use super::{ChannelStats, Joined, Left, Refused, StatsFilter, SubscribeOptions};
use crate::connection::Connection;
use crate::fanout::Target;
use crate::namespace::Namespace;
use crate::publication::{EncodeOnce, Event, MemberRef, Publication, Tag};
use dashmap::{DashMap, DashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One namespace's channels and patterns on this node.
pub(crate) struct Space {
    pub(super) ns: Namespace,
    pub(super) channels: DashMap<String, Channel>,
    pub(super) patterns: DashMap<String, Channel>,
    /// Pattern subscriptions in this space: publishing skips the pattern
    /// index entirely while there are none.
    pub(super) pattern_count: AtomicUsize,
    /// Channels whose subscription count changed since the last flush.
    pub(super) counts_changed: DashSet<String>,
    /// Channels whose count on this node the other nodes must hear.
    pub(super) counts_announce: DashSet<String>,
}

impl Space {
    pub(super) fn new(ns: Namespace) -> Space {
        Space {
            ns,
            channels: DashMap::new(),
            patterns: DashMap::new(),
            pattern_count: AtomicUsize::new(0),
            counts_changed: DashSet::new(),
            counts_announce: DashSet::new(),
        }
    }

    /// Which map a subscription lives in.
    pub(super) fn map(&self, pattern: bool) -> &DashMap<String, Channel> {
        if pattern {
            &self.patterns
        } else {
            &self.channels
        }
    }

    /// See [`super::Hub::subscribe`].
    pub(super) fn subscribe(
        &self,
        cache: &Cache,
        conn: &Arc<Connection>,
        channel: &str,
        opts: SubscribeOptions,
    ) -> Result<Joined, Refused> {
        let map = self.map(opts.pattern);
        let mut entry = map.entry(channel.to_owned()).or_default();
        let ch = entry.value_mut();
        let key = (conn.id, opts.tag.clone());
        if ch.subs.contains_key(&key) {
            // Already subscribed: confirm again, as retrying clients expect.
            send_subscribed(conn, &opts.tag, channel, ch, opts.member.is_some());
            return Ok(Joined::default());
        }
        let first_here = ch.subs.is_empty();
        if let Some(m) = &opts.member {
            let present = ch
                .members
                .get(m.user_id.as_str())
                .is_some_and(|s| s.visible());
            let count = ch.members.values().filter(|s| s.visible()).count();
            if !present && count >= opts.max_members {
                drop(entry);
                map.remove_if(channel, |_, c| c.subs.is_empty() && c.members.is_empty());
                return Err(Refused::OverLimit(format!(
                    "presence channel is full ({} members)",
                    opts.max_members
                )));
            }
        }
        let mut joined = Joined {
            new: true,
            first_here,
            ..Joined::default()
        };
        let mut added = false;
        let user = opts.member.map(|m| {
            let id: Arc<str> = Arc::from(m.user_id.as_str());
            let state = ch
                .members
                .entry(id.clone())
                .or_insert_with(|| MemberState::new(m.info.clone()));
            added = !state.visible();
            state.local += 1;
            if state.local == 1 {
                joined.member_joined = Some((m.user_id, m.info));
            }
            id
        });
        ch.subs.insert(
            key,
            Sub {
                target: Target {
                    conn: conn.clone(),
                    tag: opts.tag.clone(),
                },
                user: user.clone(),
            },
        );
        ch.snapshot = None;
        send_subscribed(conn, &opts.tag, channel, ch, user.is_some());
        if let (true, Some(uid)) = (added, &user) {
            let info = ch.members.get(uid).and_then(|m| m.info.as_deref());
            let mut event = EncodeOnce::new(Event::MemberAdded {
                channel,
                member: MemberRef { user_id: uid, info },
            });
            ch.send_to_all(Some(conn.id), &mut event);
        }
        joined.member_added = added;
        if opts.pattern {
            self.pattern_count.fetch_add(1, Ordering::AcqRel);
        }
        if opts.cache {
            joined.cache_miss = !self.replay_cache(cache, conn, &opts.tag, channel);
        }
        if opts.count {
            ch.count = true;
            drop(entry);
            self.count_changed(channel);
        }
        Ok(joined)
    }

    /// See [`super::Hub::unsubscribe`].
    pub(super) fn unsubscribe(
        &self,
        conn: &Connection,
        channel: &str,
        tag: &Tag,
        pattern: bool,
    ) -> Left {
        let map = self.map(pattern);
        let Some(mut entry) = map.get_mut(channel) else {
            return Left::default();
        };
        let ch = entry.value_mut();
        let Some(sub) = ch.subs.remove(&(conn.id, tag.clone())) else {
            return Left::default();
        };
        ch.snapshot = None;
        let mut left = Left {
            was_subscribed: true,
            ..Left::default()
        };
        if let Some(uid) = sub.user.as_deref() {
            if let Some(m) = ch.members.get_mut(uid) {
                m.local -= 1;
                if m.local == 0 {
                    left.member_left = Some(uid.to_owned());
                    if !m.visible() {
                        left.member_removed = true;
                        ch.members.remove(uid);
                        let mut event = EncodeOnce::new(Event::MemberRemoved {
                            channel,
                            user_id: uid,
                        });
                        ch.send_to_all(None, &mut event);
                    }
                }
            }
        }
        left.last_here = ch.subs.is_empty();
        let count = ch.count;
        drop(entry);
        if count && left.last_here {
            // The others hear this node has none left (no push: nobody here).
            self.counts_announce.insert(channel.to_owned());
        } else if count {
            self.count_changed(channel);
        }
        if pattern {
            self.pattern_count.fetch_sub(1, Ordering::AcqRel);
        }
        if left.last_here {
            map.remove_if(channel, |_, c| c.subs.is_empty());
        }
        left
    }

    /// See [`super::Hub::subscription`].
    pub(super) fn subscription(
        &self,
        conn: &Connection,
        channel: &str,
        tag: &Tag,
    ) -> Option<Option<Arc<str>>> {
        self.channels
            .get(channel)
            .and_then(|c| c.subs.get(&(conn.id, tag.clone())).map(|s| s.user.clone()))
    }

    /// See [`super::Hub::targets`].
    pub(super) fn targets(&self, cache: &Cache, p: &Arc<Publication>) -> Vec<Arc<[Target]>> {
        let mut out = Vec::with_capacity(1);
        if p.cache {
            let mut entry = self.channels.entry(p.channel.clone()).or_default();
            cache.put(p.clone());
            if !entry.subs.is_empty() {
                out.push(entry.snapshot());
            }
            let empty = entry.subs.is_empty();
            drop(entry);
            if empty {
                self.channels
                    .remove_if(&p.channel, |_, c| c.subs.is_empty() && c.members.is_empty());
            }
        } else if let Some(t) = snapshot_of(&self.channels, &p.channel) {
            out.push(t);
        }
        if self.pattern_count.load(Ordering::Acquire) > 0 {
            out.extend(prefixes(&p.channel).filter_map(|pre| snapshot_of(&self.patterns, pre)));
        }
        out
    }

    /// Queue the channel's last event, or `CacheMiss`; returns whether
    /// there was one.
    fn replay_cache(&self, cache: &Cache, conn: &Connection, tag: &Tag, channel: &str) -> bool {
        let hit = cache.get(self.ns, channel).map(|(p, _)| p);
        let found = hit.is_some();
        let frame = match hit {
            Some(p) => Some(p.frame_for(conn.wire, tag, conn.deflate())),
            None => conn
                .wire
                .event(&Event::CacheMiss { channel }, tag.as_deref().unwrap_or("")),
        };
        if let Some(f) = frame {
            conn.send(f);
        }
        found
    }

    /// (channels, subscriptions) with subscribers on this node.
    pub(super) fn figures(&self) -> (usize, usize) {
        let mut channels = 0;
        let mut subscriptions = 0;
        for map in [&self.channels, &self.patterns] {
            for c in map.iter() {
                if !c.subs.is_empty() {
                    channels += 1;
                    subscriptions += c.subs.len();
                }
            }
        }
        (channels, subscriptions)
    }

    /// See [`super::Hub::stats`].
    pub(super) fn stats(&self, filter: &StatsFilter, out: &mut Vec<ChannelStats>) {
        let of = |name: &str, c: &Channel| ChannelStats {
            ns: self.ns,
            name: name.to_owned(),
            subscriptions: c.subs.len(),
            users: c
                .members
                .iter()
                .filter(|(_, m)| m.local > 0)
                .map(|(id, _)| id.to_string())
                .collect(),
        };
        match filter {
            StatsFilter::Exact(name) => out.extend(
                self.channels
                    .get(name)
                    .filter(|c| !c.subs.is_empty())
                    .map(|c| of(name, &c)),
            ),
            StatsFilter::Prefix(prefix) => out.extend(
                self.channels
                    .iter()
                    .filter(|e| e.key().starts_with(prefix.as_str()) && !e.subs.is_empty())
                    .map(|e| of(e.key(), e.value())),
            ),
        }
    }
}
