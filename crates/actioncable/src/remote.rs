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

use herald_core::connection::{ConnId, Connection, Reason};
use parking_lot::Mutex;
use serde::Deserialize;
use std::collections::HashMap;
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

type Shard = HashMap<Arc<str>, Holders>;

/// The connections under one identifiers text: nearly always one, kept
/// inline (a `Vec` would be a 64-byte allocation per connection).
enum Holders {
    One(ConnId, Weak<Connection>),
    Many(Vec<(ConnId, Weak<Connection>)>),
}

impl Holders {
    fn push(&mut self, id: ConnId, conn: Weak<Connection>) {
        match self {
            Holders::One(..) => {
                let Holders::One(first, weak) =
                    std::mem::replace(self, Holders::Many(Vec::with_capacity(2)))
                else {
                    unreachable!()
                };
                if let Holders::Many(v) = self {
                    v.push((first, weak));
                    v.push((id, conn));
                }
            }
            Holders::Many(v) => v.push((id, conn)),
        }
    }

    /// Forget `id`; whether none is left.
    fn remove(&mut self, id: ConnId) -> bool {
        match self {
            Holders::One(first, _) => *first == id,
            Holders::Many(v) => {
                v.retain(|(i, _)| *i != id);
                v.is_empty()
            }
        }
    }

    fn live(&self) -> Vec<Arc<Connection>> {
        match self {
            Holders::One(_, c) => c.upgrade().into_iter().collect(),
            Holders::Many(v) => v.iter().filter_map(|(_, c)| c.upgrade()).collect(),
        }
    }
}

/// This node's Action Cable connections by their identifiers. Sharded: a
/// connect or a close takes one short lock among 16.
pub struct Identities {
    shards: Vec<Mutex<Shard>>,
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
    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    /// Index `conn` under `identifiers` (none for a client without any):
    /// whether it was, so the session knows to [`Identities::remove`] it.
    pub fn add(&self, identifiers: &Arc<str>, conn: &Arc<Connection>) -> bool {
        if identifiers.is_empty() || identifiers.len() > MAX_IDENTIFIERS {
            return false;
        }
        let weak = Arc::downgrade(conn);
        match self.shard(identifiers).lock().entry(identifiers.clone()) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().push(conn.id, weak),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Holders::One(conn.id, weak));
            }
        }
        true
    }

    /// Take connection `id` out of the index (its session is ending). The
    /// session keeps a flag, not a guard holding the set, the key and the
    /// id: those 32 bytes would be part of every connection's task, and
    /// it holds the key and the connection already.
    pub fn remove(&self, identifiers: &str, id: ConnId) {
        let mut shard = self.shard(identifiers).lock();
        if shard.get_mut(identifiers).is_some_and(|h| h.remove(id)) {
            shard.remove(identifiers);
        }
    }

    /// Close this node's connections with exactly `identifiers`; how many.
    pub fn disconnect(&self, identifiers: &str, reconnect: bool) -> usize {
        let conns: Vec<Arc<Connection>> = self
            .shard(identifiers)
            .lock()
            .get(identifiers)
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

    #[test]
    fn one_holder_inline_then_many_then_none() {
        let ids = |h: &Holders| match h {
            Holders::One(i, _) => vec![*i],
            Holders::Many(v) => v.iter().map(|(i, _)| *i).collect(),
        };
        let mut h = Holders::One(1, Weak::new());
        h.push(2, Weak::new());
        h.push(3, Weak::new());
        assert_eq!(ids(&h), [1, 2, 3]);
        assert!(!h.remove(2));
        assert!(!h.remove(9), "not there: nothing removed");
        assert_eq!(ids(&h), [1, 3]);
        assert!(!h.remove(1));
        assert!(h.remove(3), "the last one gone");
        let mut one = Holders::One(7, Weak::new());
        assert!(!one.remove(8));
        assert!(one.remove(7));
        assert!(h.live().is_empty(), "dropped connections are not returned");
    }

    #[test]
    fn a_removed_connection_is_no_longer_disconnected_and_its_key_goes() {
        use herald_core::connection::QueueLimit;
        let limit = QueueLimit {
            frames: 16,
            bytes: 1 << 20,
        };
        let conn = |i| {
            Arc::new(Connection::new(
                i,
                format!("s.{i}"),
                &crate::wire::WIRE,
                limit,
            ))
        };
        let (a, b) = (conn(1), conn(2));
        let set = Identities::default();
        let key: Arc<str> = Arc::from(r#"{"u":1}"#);
        assert!(set.add(&key, &a) && set.add(&key, &b));
        assert!(!set.add(&Arc::from(""), &a), "no identifiers: not indexed");
        set.remove(&key, a.id);
        assert_eq!(set.disconnect(&key, false), 1, "only b is left");
        set.remove(&key, b.id);
        assert_eq!(set.disconnect(&key, false), 0);
        assert!(
            set.shard(&key).lock().get(&*key).is_none(),
            "the key is gone"
        );
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
