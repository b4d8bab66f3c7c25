//! AnyCable's remote commands: the app sends
//! `{"command":"disconnect","payload":{"identifier":"<identifiers>","reconnect":bool}}`
//! through the broadcast API (`POST /_broadcast`, or the broker's broadcast
//! channel or stream), and every node closes the connections whose
//! identifiers (the JSON text the app's `Connect` answered, or a JWT's)
//! are exactly those, with `{"type":"disconnect","reason":"remote",
//! "reconnect":...}` and close 1000, as anycable-go does.
//!
//! Each node keeps an index of its own connections by identifiers
//! ([`Identities`]); a command given to one node reaches the others as the
//! core's `Control::Command` (like Pusher's terminate-user), so no node
//! scans its connections.

use herald_core::connection::{Connection, Reason};
use parking_lot::Mutex;
use serde::Deserialize;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Weak};

/// The close "reason" a remote disconnect asks for: the session maps it to
/// Action Cable's `remote` disconnect message (close code 1000 on the
/// wire); the number itself never leaves the process.
pub const CLOSE_REMOTE: u16 = 4000;
/// The same, telling the client to reconnect.
pub const CLOSE_REMOTE_RECONNECT: u16 = 4001;

/// Most identifiers text indexed (longer identifiers are not indexed and
/// cannot be disconnected remotely; apps send a few dozen bytes).
pub const MAX_IDENTIFIERS: usize = 4096;

const SHARDS: usize = 16;

/// The connections under one identifiers text. Nearly always one, kept
/// inline with its key: a table slot is then 24 bytes (the key shared with
/// the session, and the connection), where a map of key to holders took 40
/// (the connection's id beside it, and room for a list); at 10,000 idle
/// connections the index went from 67 to about 41 bytes per connection
/// (bench/RESULTS.md "Idle memory"). Connections are told apart by their
/// address: a session stays in the index only while it holds its
/// connection, so no other connection can have that address meanwhile.
enum Holders {
    One(Arc<str>, Weak<Connection>),
    /// Several connections with the same identifiers (one user's tabs, or
    /// an app that gives every guest the same ones): one slot for all of
    /// them, so they never lengthen the table's probe sequences.
    Many(Box<(Arc<str>, Vec<Weak<Connection>>)>),
}

impl Holders {
    fn key(&self) -> &str {
        match self {
            Holders::One(k, _) => k,
            Holders::Many(m) => &m.0,
        }
    }

    fn push(&mut self, conn: Weak<Connection>) {
        match self {
            Holders::One(key, first) => {
                let first = std::mem::replace(first, Weak::new());
                *self = Holders::Many(Box::new((key.clone(), vec![first, conn])));
            }
            Holders::Many(m) => m.1.push(conn),
        }
    }

    /// Forget `conn`; whether none is left.
    fn remove(&mut self, conn: *const Connection) -> bool {
        match self {
            Holders::One(_, c) => c.as_ptr() == conn,
            Holders::Many(m) => {
                m.1.retain(|c| c.as_ptr() != conn);
                m.1.is_empty()
            }
        }
    }

    fn live(&self) -> Vec<Arc<Connection>> {
        match self {
            Holders::One(_, c) => c.upgrade().into_iter().collect(),
            Holders::Many(m) => m.1.iter().filter_map(Weak::upgrade).collect(),
        }
    }
}

/// This node's Action Cable connections by their identifiers. Sharded: a
/// connect or a close takes one short lock among 16.
pub struct Identities {
    shards: Vec<Mutex<hashbrown::HashTable<Holders>>>,
    hasher: RandomState,
}

impl Default for Identities {
    fn default() -> Identities {
        Identities {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl Identities {
    /// The key's hash and its shard. The shard is taken from bits the
    /// table does not use for a slot's place (its low bits) nor for its
    /// tag (its top seven): with the low bits, every key of a shard would
    /// land in the same sixteenth of its table.
    fn shard(&self, key: &str) -> (u64, &Mutex<hashbrown::HashTable<Holders>>) {
        let hash = self.hasher.hash_one(key);
        (hash, &self.shards[(hash >> 40) as usize % SHARDS])
    }

    /// Index `conn` under `identifiers` (none for a client without any):
    /// whether it was, so the session knows to [`Identities::remove`] it.
    pub fn add(&self, identifiers: &Arc<str>, conn: &Arc<Connection>) -> bool {
        if identifiers.is_empty() || identifiers.len() > MAX_IDENTIFIERS {
            return false;
        }
        let weak = Arc::downgrade(conn);
        let (hash, shard) = self.shard(identifiers);
        let mut table = shard.lock();
        match table.find_mut(hash, |h| h.key() == &**identifiers) {
            Some(h) => h.push(weak),
            None => {
                table.insert_unique(hash, Holders::One(identifiers.clone(), weak), |h| {
                    self.hasher.hash_one(h.key())
                });
            }
        }
        true
    }

    /// Take `conn` out of the index (its session is ending). The session
    /// keeps a flag, not a guard holding the set, the key and the
    /// connection: those 32 bytes would be part of every connection's task,
    /// and it holds the key and the connection already.
    pub fn remove(&self, identifiers: &str, conn: &Arc<Connection>) {
        let (hash, shard) = self.shard(identifiers);
        let mut table = shard.lock();
        if let Ok(mut e) = table.find_entry(hash, |h| h.key() == identifiers) {
            if e.get_mut().remove(Arc::as_ptr(conn)) {
                e.remove();
            }
        }
    }

    /// Close this node's connections with exactly `identifiers`; how many.
    pub fn disconnect(&self, identifiers: &str, reconnect: bool) -> usize {
        let (hash, shard) = self.shard(identifiers);
        let conns: Vec<Arc<Connection>> = shard
            .lock()
            .find(hash, |h| h.key() == identifiers)
            .map(Holders::live)
            .unwrap_or_default();
        let code = if reconnect {
            CLOSE_REMOTE_RECONNECT
        } else {
            CLOSE_REMOTE
        };
        for c in &conns {
            c.close(Reason::Code(code));
        }
        conns.len()
    }
}

#[derive(Deserialize)]
struct Command {
    command: String,
    #[serde(default)]
    payload: Option<Disconnect>,
}

#[derive(Deserialize)]
pub struct Disconnect {
    pub identifier: String,
    #[serde(default)]
    pub reconnect: bool,
}

/// A remote command in a broadcast body: `None` when the body is not one
/// (no `command` field); `Err` says what is wrong with one (an unknown
/// command, a missing or malformed payload).
pub fn parse(body: &[u8]) -> Option<Result<Disconnect, String>> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.get("command")?;
    Some(match serde_json::from_value::<Command>(v) {
        Ok(Command {
            command,
            payload: Some(d),
        }) if command == "disconnect" => {
            if d.identifier.is_empty() {
                Err("payload.identifier is empty".into())
            } else {
                Ok(d)
            }
        }
        Ok(c) if c.command == "disconnect" => {
            Err("disconnect needs a payload: {\"identifier\": string, \"reconnect\": bool}".into())
        }
        Ok(c) => Err(format!(
            "unknown remote command {:?} (disconnect is the one there is)",
            c.command.chars().take(64).collect::<String>()
        )),
        Err(e) => Err(format!("malformed remote command: {e}")),
    })
}

/// The command as the nodes pass it on (`Control::Command`'s body).
pub fn body(d: &Disconnect) -> String {
    serde_json::json!({ "identifier": d.identifier, "reconnect": d.reconnect }).to_string()
}

/// Run a command another node passed on (its [`body`]).
pub fn run(identities: &Identities, body: &str) {
    match serde_json::from_str::<Disconnect>(body) {
        Ok(d) => {
            let n = identities.disconnect(&d.identifier, d.reconnect);
            tracing::debug!(closed = n, "remote disconnect");
        }
        Err(e) => tracing::debug!(error = %e, "unreadable remote command from another node"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(i: u64) -> Arc<Connection> {
        use herald_core::connection::QueueLimit;
        let limit = QueueLimit {
            frames: 16,
            bytes: 1 << 20,
        };
        Arc::new(Connection::new(
            i,
            format!("s.{i}"),
            &crate::wire::WIRE,
            limit,
        ))
    }

    #[test]
    fn one_holder_inline_then_many_then_none() {
        let ids = |h: &Holders| h.live().iter().map(|c| c.id).collect::<Vec<_>>();
        let (a, b, c, d) = (conn(1), conn(2), conn(3), conn(4));
        let key: Arc<str> = Arc::from("k");
        let mut h = Holders::One(key.clone(), Arc::downgrade(&a));
        h.push(Arc::downgrade(&b));
        h.push(Arc::downgrade(&c));
        assert_eq!(ids(&h), [1, 2, 3]);
        assert_eq!(h.key(), "k");
        assert!(!h.remove(Arc::as_ptr(&b)));
        assert!(!h.remove(Arc::as_ptr(&d)), "not there: nothing removed");
        assert_eq!(ids(&h), [1, 3]);
        drop(c);
        assert_eq!(ids(&h), [1], "dropped connections are not returned");
        assert!(!h.remove(Arc::as_ptr(&a)));
        let gone = h.live().len();
        assert_eq!(gone, 0);
        let mut one = Holders::One(key, Arc::downgrade(&d));
        assert!(!one.remove(Arc::as_ptr(&a)));
        assert!(one.remove(Arc::as_ptr(&d)));
    }

    /// A slot is the key and one connection, 24 bytes: what an idle
    /// connection costs the index depends on it.
    #[test]
    fn a_slot_is_a_key_and_a_connection() {
        assert_eq!(std::mem::size_of::<Holders>(), 24);
    }

    #[test]
    fn a_removed_connection_is_no_longer_disconnected_and_its_key_goes() {
        let (a, b) = (conn(1), conn(2));
        let set = Identities::default();
        let key: Arc<str> = Arc::from(r#"{"u":1}"#);
        assert!(set.add(&key, &a) && set.add(&key, &b));
        assert!(!set.add(&Arc::from(""), &a), "no identifiers: not indexed");
        set.remove(&key, &a);
        assert_eq!(set.disconnect(&key, false), 1, "only b is left");
        set.remove(&key, &b);
        assert_eq!(set.disconnect(&key, false), 0);
        let (hash, shard) = set.shard(&key);
        assert!(
            shard.lock().find(hash, |h| h.key() == &*key).is_none(),
            "the key is gone"
        );
    }

    /// Many keys, over every shard: each found alone, and every slot gone
    /// once its connections are.
    #[test]
    fn many_keys_each_found_alone_then_all_gone() {
        let set = Identities::default();
        let conns: Vec<_> = (0..2000).map(conn).collect();
        let keys: Vec<Arc<str>> = (0..1000)
            .map(|i| Arc::from(format!(r#"{{"u":{i}}}"#)))
            .collect();
        // Two connections per key, the second added after every first.
        for (i, c) in conns.iter().enumerate() {
            assert!(set.add(&keys[i % 1000], c));
        }
        assert!(set.shards.iter().all(|s| !s.lock().is_empty()));
        for (i, c) in conns.iter().enumerate().take(1000) {
            set.remove(&keys[i], c);
        }
        for k in &keys {
            assert_eq!(set.disconnect(k, false), 1, "{k}");
        }
        assert_eq!(set.disconnect(r#"{"u":1000}"#, false), 0);
        for (i, c) in conns.iter().enumerate().skip(1000) {
            set.remove(&keys[i % 1000], c);
        }
        assert!(set.shards.iter().all(|s| s.lock().is_empty()));
    }

    #[test]
    fn commands_are_told_from_broadcasts_and_checked() {
        assert!(parse(br#"{"stream":"s","data":"1"}"#).is_none());
        assert!(parse(b"not json").is_none());
        let d = parse(
            br#"{"command":"disconnect","payload":{"identifier":"{\"u\":1}","reconnect":true}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!((d.identifier.as_str(), d.reconnect), (r#"{"u":1}"#, true));
        for bad in [
            &br#"{"command":"disconnect"}"#[..],
            br#"{"command":"disconnect","payload":{"identifier":""}}"#,
            br#"{"command":"explode","payload":{"identifier":"x"}}"#,
            br#"{"command":7}"#,
        ] {
            assert!(
                parse(bad).unwrap().is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
