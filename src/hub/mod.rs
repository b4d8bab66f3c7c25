//! The hub: one per app. It owns channel semantics for every protocol:
//! who is subscribed to what, presence members, cache slots, signed-in users
//! and their watchers, and the app's connection count.
//!
//! Registries are sharded maps (`DashMap`), so connections on different
//! channels never contend on one lock, and a lock is only ever held while
//! queueing frames (which never waits). Frames a subscriber must see in
//! order relative to broadcasts (`subscription_succeeded`, a cache replay,
//! `member_added`) are queued while the channel's shard lock is held, so no
//! broadcast can slip in between.

pub mod channel;
pub mod presence;

use crate::broker::{Broker, NodeId};
use crate::config::AppConfig;
use crate::connection::{ConnId, Connection};
use crate::fanout::Publication;
use crate::metrics;
use crate::protocol::pusher::{code, PresenceEntry};
use crate::protocol::{CoreEvent, EncodeOnce};
use crate::signing;
use channel::{validate_name, ChannelKind, NameError, SERVER_TO_USER_PREFIX};
use dashmap::{DashMap, DashSet};
use presence::{MemberData, MemberLimits};
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a subscription was refused; maps onto `pusher:subscription_error`.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    #[error("{0}")]
    BadName(#[from] NameError),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    BadChannelData(String),
    #[error("{0}")]
    LimitReached(String),
}

impl SubscribeError {
    /// The `type` field of `pusher:subscription_error`.
    pub fn kind(&self) -> &'static str {
        match self {
            SubscribeError::BadName(_) => "InvalidChannel",
            SubscribeError::Unauthorized(_) => "AuthError",
            SubscribeError::BadChannelData(_) => "InvalidChannelData",
            SubscribeError::LimitReached(_) => "LimitReached",
        }
    }

    /// The `status` field, an HTTP-like status.
    pub fn status(&self) -> u16 {
        match self {
            SubscribeError::BadName(_) | SubscribeError::BadChannelData(_) => 400,
            SubscribeError::Unauthorized(_) => 401,
            SubscribeError::LimitReached(_) => 403,
        }
    }
}

/// Channel state on this node.
#[derive(Default)]
struct Channel {
    subscribers: HashMap<ConnId, Subscriber>,
    /// Presence members by user id; a user with several sockets is one member.
    members: HashMap<String, Member>,
}

struct Subscriber {
    conn: Arc<Connection>,
    /// The presence user this socket joined as.
    user_id: Option<Arc<str>>,
}

struct Member {
    info: Option<Box<RawValue>>,
    sockets: u32,
}

struct Cached {
    publication: Arc<Publication>,
    at: Instant,
}

/// Public information about a channel, for the HTTP API.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChannelInfo {
    pub subscription_count: usize,
    pub user_count: usize,
}

pub struct Hub {
    pub app: AppConfig,
    node: NodeId,
    broker: Arc<dyn Broker>,
    channels: DashMap<String, Channel>,
    cache: DashMap<String, Cached>,
    /// Signed-in users' sockets.
    users: DashMap<String, Vec<Arc<Connection>>>,
    /// Watched user id → the connections watching it.
    watchers: DashMap<String, Vec<Arc<Connection>>>,
    /// Channels whose subscription count changed since the last flush.
    /// Sharded like the channel map: a join storm on many channels must not
    /// queue on one app-wide lock.
    counts_changed: DashSet<String>,
    connections: AtomicU32,
}

impl Hub {
    pub fn new(app: AppConfig, node: NodeId, broker: Arc<dyn Broker>) -> Hub {
        Hub {
            app,
            node,
            broker,
            channels: DashMap::new(),
            cache: DashMap::new(),
            users: DashMap::new(),
            watchers: DashMap::new(),
            counts_changed: DashSet::new(),
            connections: AtomicU32::new(0),
        }
    }

    // ----- connections -----------------------------------------------------

    /// Count a new connection, or refuse it with the protocol's code.
    pub fn admit(&self) -> Result<(), u16> {
        if !self.app.enabled {
            return Err(code::APP_DISABLED);
        }
        let max = self.app.max_connections;
        let admitted = self
            .connections
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (max == 0 || n < max).then_some(n + 1)
            });
        admitted
            .map(|_| ())
            .map_err(|_| code::OVER_CONNECTION_QUOTA)
    }

    /// Undo [`Hub::admit`] when a connection ends.
    pub fn release(&self) {
        self.connections.fetch_sub(1, Ordering::AcqRel);
    }

    pub fn connection_count(&self) -> u32 {
        self.connections.load(Ordering::Acquire)
    }

    // ----- subscriptions ---------------------------------------------------

    /// Subscribe `conn` to `channel`, checking name, signature and limits.
    /// Queues `subscription_succeeded` (and a cache replay or `cache_miss`)
    /// to the subscriber. Returns `false` if it was already subscribed.
    pub fn subscribe(
        &self,
        conn: &Arc<Connection>,
        channel: &str,
        auth: Option<&str>,
        channel_data: Option<&str>,
    ) -> Result<bool, SubscribeError> {
        validate_name(channel, self.app.max_channel_name)?;
        let kind = ChannelKind::of(channel);
        let member = if kind.needs_auth {
            self.check_channel_auth(conn, channel, kind, auth, channel_data)?
        } else {
            None
        };

        let mut entry = self.channels.entry(channel.to_owned()).or_default();
        let ch = entry.value_mut();
        if ch.subscribers.contains_key(&conn.id) {
            // Already subscribed: confirm again, as clients retrying expect.
            send_succeeded(conn, channel, ch);
            return Ok(false);
        }
        if let Some(m) = &member {
            if !ch.members.contains_key(&m.user_id)
                && ch.members.len() >= self.app.max_presence_members
            {
                let max = self.app.max_presence_members;
                drop(entry);
                self.channels
                    .remove_if(channel, |_, c| c.subscribers.is_empty());
                return Err(SubscribeError::LimitReached(format!(
                    "presence channel is full ({max} members)"
                )));
            }
        }

        let mut first_socket_of_user = false;
        let user_id = member
            .as_ref()
            .map(|m| Arc::<str>::from(m.user_id.as_str()));
        if let Some(m) = member {
            let slot = ch.members.entry(m.user_id).or_insert_with(|| {
                first_socket_of_user = true;
                Member {
                    info: m.user_info,
                    sockets: 0,
                }
            });
            slot.sockets += 1;
        }
        ch.subscribers.insert(
            conn.id,
            Subscriber {
                conn: conn.clone(),
                user_id: user_id.clone(),
            },
        );

        send_succeeded(conn, channel, ch);
        if first_socket_of_user {
            let uid = user_id.as_deref().unwrap_or_default();
            let info = ch.members.get(uid).and_then(|m| m.info.as_deref());
            let mut event = EncodeOnce::new(CoreEvent::MemberAdded {
                channel,
                user_id: uid,
                user_info: info,
            });
            send_to_all(ch, Some(conn.id), &mut event);
        }
        if kind.cache {
            self.replay_cache(conn, channel);
        }
        if self.app.subscription_count && !kind.presence {
            self.count_changed(channel);
        }
        Ok(true)
    }

    fn check_channel_auth(
        &self,
        conn: &Connection,
        channel: &str,
        kind: ChannelKind,
        auth: Option<&str>,
        channel_data: Option<&str>,
    ) -> Result<Option<MemberData>, SubscribeError> {
        let auth = auth.ok_or_else(|| {
            SubscribeError::Unauthorized(format!("subscribing to {channel} requires auth"))
        })?;
        let data = if kind.presence {
            Some(channel_data.ok_or_else(|| {
                SubscribeError::BadChannelData("presence channels require channel_data".into())
            })?)
        } else {
            None
        };
        let message = signing::channel_string(&conn.socket_id, channel, data);
        if !signing::verify_token(&self.app.key, &self.app.secret, auth, &message) {
            return Err(SubscribeError::Unauthorized(format!(
                "invalid signature for {channel}"
            )));
        }
        match data {
            None => Ok(None),
            Some(text) => {
                let limits = MemberLimits {
                    max_user_id: self.app.max_presence_user_id,
                    max_user_info: self.app.max_presence_user_info,
                };
                presence::parse_channel_data(text, &limits)
                    .map(Some)
                    .map_err(SubscribeError::BadChannelData)
            }
        }
    }

    /// Remove `conn` from `channel`. Returns whether it was subscribed.
    pub fn unsubscribe(&self, conn: &Connection, channel: &str) -> bool {
        let Some(mut entry) = self.channels.get_mut(channel) else {
            return false;
        };
        let ch = entry.value_mut();
        let Some(sub) = ch.subscribers.remove(&conn.id) else {
            return false;
        };
        if let Some(uid) = sub.user_id.as_deref() {
            let gone = match ch.members.get_mut(uid) {
                Some(m) => {
                    m.sockets -= 1;
                    m.sockets == 0
                }
                None => false,
            };
            if gone {
                ch.members.remove(uid);
                let mut event = EncodeOnce::new(CoreEvent::MemberRemoved {
                    channel,
                    user_id: uid,
                });
                send_to_all(ch, None, &mut event);
            }
        }
        let empty = ch.subscribers.is_empty();
        if !empty && self.app.subscription_count && !ChannelKind::of(channel).presence {
            self.count_changed(channel);
        }
        drop(entry);
        if empty {
            self.channels
                .remove_if(channel, |_, c| c.subscribers.is_empty());
        }
        true
    }

    /// `None` if `conn` is not subscribed to `channel`; otherwise the
    /// presence user id it joined as, if any (client events carry it).
    pub fn subscription(&self, conn: &Connection, channel: &str) -> Option<Option<Arc<str>>> {
        self.channels
            .get(channel)
            .and_then(|c| c.subscribers.get(&conn.id).map(|s| s.user_id.clone()))
    }

    /// Note that `channel`'s count changed. Counts are sent in batches by
    /// [`Hub::flush_subscription_counts`]: sending on every change would make
    /// N clients joining one channel cost N² frames, and turn a reconnect
    /// storm into a storm of count updates.
    fn count_changed(&self, channel: &str) {
        if !self.counts_changed.contains(channel) {
            self.counts_changed.insert(channel.to_owned());
        }
    }

    /// Send `pusher_internal:subscription_count` to the subscribers of every
    /// channel whose count changed since the last call (run periodically).
    pub fn flush_subscription_counts(&self) {
        let changed: Vec<String> = self.counts_changed.iter().map(|c| c.clone()).collect();
        // Unmark before reading the count: a change after this point marks
        // the channel again and goes out with the next flush.
        for channel in &changed {
            self.counts_changed.remove(channel);
        }
        for channel in &changed {
            if let Some(ch) = self.channels.get(channel) {
                let mut event = EncodeOnce::new(CoreEvent::SubscriptionCount {
                    channel,
                    count: ch.subscribers.len(),
                });
                send_to_all(&ch, None, &mut event);
            }
        }
    }

    // ----- publishing ------------------------------------------------------

    /// Publish an event: deliver it to this node's subscribers now, then
    /// hand it to the broker for the other nodes.
    pub fn publish(&self, publication: Publication) {
        let publication = Arc::new(publication);
        self.deliver_local(&publication);
        self.broker.publish(self.node, &self.app.id, publication);
    }

    /// Deliver to this node's subscribers only (also the broker's entry point
    /// for messages from other nodes).
    pub fn deliver_local(&self, publication: &Arc<Publication>) {
        metrics::count(&metrics::MESSAGES_PUBLISHED);
        let mut delivered = 0u64;
        if let Some(user) = publication.channel.strip_prefix(SERVER_TO_USER_PREFIX) {
            if let Some(sockets) = self.users.get(user) {
                for conn in sockets.iter() {
                    if !publication.excludes(&conn.socket_id)
                        && conn.send(publication.frame(conn.protocol).clone())
                    {
                        delivered += 1;
                    }
                }
            }
        } else {
            if ChannelKind::of(&publication.channel).cache {
                self.cache.insert(
                    publication.channel.clone(),
                    Cached {
                        publication: publication.clone(),
                        at: Instant::now(),
                    },
                );
            }
            if let Some(ch) = self.channels.get(&publication.channel) {
                for sub in ch.subscribers.values() {
                    let conn = &sub.conn;
                    if !publication.excludes(&conn.socket_id)
                        && conn.send(publication.frame(conn.protocol).clone())
                    {
                        delivered += 1;
                    }
                }
            }
        }
        metrics::add(&metrics::FRAMES_DELIVERED, delivered);
    }

    fn replay_cache(&self, conn: &Connection, channel: &str) {
        let ttl = Duration::from_secs(self.app.cache_ttl);
        let hit = self
            .cache
            .get(channel)
            .filter(|c| c.at.elapsed() < ttl)
            .map(|c| c.publication.clone());
        match hit {
            Some(p) => {
                conn.send(p.frame(conn.protocol).clone());
            }
            None => {
                conn.send(CoreEvent::CacheMiss { channel }.encode(conn.protocol));
            }
        }
    }

    /// Drop cache slots older than the TTL (run periodically so memory stays
    /// flat when many short-lived cache channels come and go).
    pub fn expire_cache(&self) {
        let ttl = Duration::from_secs(self.app.cache_ttl);
        self.cache.retain(|_, c| c.at.elapsed() < ttl);
    }

    // ----- users -----------------------------------------------------------

    /// Register a signed-in socket and its watchlist. Returns which watched
    /// users are online and which are offline right now.
    pub fn sign_in(
        &self,
        conn: &Arc<Connection>,
        user_id: &str,
        watchlist: &[String],
    ) -> (Vec<String>, Vec<String>) {
        let first = {
            let mut sockets = self.users.entry(user_id.to_owned()).or_default();
            sockets.push(conn.clone());
            sockets.len() == 1
        };
        if first {
            self.notify_watchers(user_id, true);
        }
        for watched in watchlist {
            self.watchers
                .entry(watched.clone())
                .or_default()
                .push(conn.clone());
        }
        watchlist
            .iter()
            .cloned()
            .partition(|w| self.users.contains_key(w))
    }

    /// Undo [`Hub::sign_in`] when the socket closes.
    pub fn sign_out(&self, conn: &Connection, user_id: &str, watchlist: &[String]) {
        for watched in watchlist {
            if let Some(mut list) = self.watchers.get_mut(watched) {
                list.retain(|c| c.id != conn.id);
            }
            self.watchers.remove_if(watched, |_, l| l.is_empty());
        }
        let last = match self.users.get_mut(user_id) {
            Some(mut sockets) => {
                sockets.retain(|c| c.id != conn.id);
                sockets.is_empty()
            }
            None => false,
        };
        if last && self.users.remove_if(user_id, |_, s| s.is_empty()).is_some() {
            self.notify_watchers(user_id, false);
        }
    }

    fn notify_watchers(&self, user_id: &str, online: bool) {
        let Some(watchers) = self.watchers.get(user_id) else {
            return;
        };
        let ids = [user_id.to_owned()];
        let (on, off): (&[String], &[String]) = if online { (&ids, &[]) } else { (&[], &ids) };
        let mut event = EncodeOnce::new(CoreEvent::Watchlist {
            online: on,
            offline: off,
        });
        for conn in watchers.iter() {
            conn.send(event.frame(conn.protocol));
        }
    }

    /// Close every connection of a signed-in user (HTTP API).
    pub fn terminate_user(&self, user_id: &str) -> usize {
        match self.users.get(user_id) {
            Some(sockets) => {
                for conn in sockets.iter() {
                    conn.close(code::UNAUTHORIZED);
                }
                sockets.len()
            }
            None => 0,
        }
    }

    // ----- queries (HTTP API) ----------------------------------------------

    /// Occupied channels whose names start with `prefix`.
    pub fn channels(&self, prefix: &str) -> Vec<(String, ChannelInfo)> {
        self.channels
            .iter()
            .filter(|e| e.key().starts_with(prefix) && !e.subscribers.is_empty())
            .map(|e| (e.key().clone(), info_of(e.value())))
            .collect()
    }

    /// Information about one channel; `None` when nobody is subscribed.
    pub fn channel(&self, name: &str) -> Option<ChannelInfo> {
        self.channels
            .get(name)
            .filter(|c| !c.subscribers.is_empty())
            .map(|c| info_of(&c))
    }

    /// User ids present on a presence channel.
    pub fn presence_users(&self, name: &str) -> Vec<String> {
        self.channels
            .get(name)
            .map(|c| c.members.keys().cloned().collect())
            .unwrap_or_default()
    }
}

fn info_of(c: &Channel) -> ChannelInfo {
    ChannelInfo {
        subscription_count: c.subscribers.len(),
        user_count: c.members.len(),
    }
}

fn send_succeeded(conn: &Connection, channel: &str, ch: &Channel) {
    let frame = if ChannelKind::of(channel).presence {
        let entries: Vec<PresenceEntry> = ch
            .members
            .iter()
            .map(|(id, m)| PresenceEntry {
                user_id: id,
                user_info: m.info.as_deref(),
            })
            .collect();
        CoreEvent::SubscriptionSucceeded {
            channel,
            presence: Some(&entries),
        }
        .encode(conn.protocol)
    } else {
        CoreEvent::SubscriptionSucceeded {
            channel,
            presence: None,
        }
        .encode(conn.protocol)
    };
    conn.send(frame);
}

fn send_to_all(ch: &Channel, except: Option<ConnId>, event: &mut EncodeOnce<'_>) {
    for (id, sub) in &ch.subscribers {
        if Some(*id) != except {
            sub.conn.send(event.frame(sub.conn.protocol));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::local::LocalBroker;
    use crate::connection::QueueLimit;
    use crate::protocol::Protocol;

    const LIMIT: QueueLimit = QueueLimit {
        frames: 16,
        bytes: 1 << 20,
    };

    fn hub(app: AppConfig) -> Hub {
        Hub::new(app, 1, Arc::new(LocalBroker::new()))
    }

    #[test]
    fn subscription_counts_are_coalesced_per_flush() {
        let hub = hub(AppConfig {
            subscription_count: true,
            ..AppConfig::development()
        });
        let mut queues = Vec::new();
        for i in 0..50u64 {
            let (conn, rx) = Connection::new(i, format!("1.{i}"), Protocol::Pusher, LIMIT);
            let conn = Arc::new(conn);
            assert_eq!(hub.subscribe(&conn, "room", None, None).unwrap(), true);
            queues.push((conn, rx));
        }
        hub.flush_subscription_counts();
        hub.flush_subscription_counts(); // nothing changed since: sends nothing
        for (_, rx) in &mut queues {
            let mut frames = Vec::new();
            while let Ok(f) = rx.try_recv() {
                frames.push(f.to_string());
            }
            // subscription_succeeded, then exactly one count, the final one.
            assert_eq!(frames.len(), 2, "{frames:?}");
            assert!(frames[0].contains("subscription_succeeded"));
            assert!(frames[1].contains("subscription_count"));
            assert!(
                frames[1].contains(r#"\"subscription_count\":50"#),
                "{}",
                frames[1]
            );
        }
    }

    #[test]
    fn counts_are_not_tracked_when_disabled() {
        let hub = hub(AppConfig::development());
        let (conn, _rx) = Connection::new(1, "1.1".into(), Protocol::Pusher, LIMIT);
        hub.subscribe(&Arc::new(conn), "room", None, None).unwrap();
        assert!(hub.counts_changed.is_empty());
    }
}
