//! Namespaces: each protocol's own space of channel names in an app's hub.
//!
//! An adapter declares the namespace(s) its channels live in (a constant,
//! `Namespace::new("pusher")`), and passes it with every channel name it
//! hands the core. The same name in two namespaces is two channels: a
//! Pusher channel `room` and an Action Cable stream `room` never share a
//! subscriber, a presence member, a cache slot or a count, and a query
//! (Pusher's channel list) asks about one namespace only. The core keeps
//! no list of protocols: a fourth one declares its own namespace.
//!
//! A namespace is a `&'static str` so it is `Copy` and compares by pointer
//! first; the cluster carries it by name, and a name that arrives from
//! another node is interned once (bounded: see [`Namespace::intern`]).

use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::OnceLock;

/// Longest namespace name (they end up in broker subjects and keys).
pub const MAX_LEN: usize = 32;

/// Most distinct names interned from the wire: a cluster runs a handful of
/// protocols, so more than this means a peer speaks something else.
const MAX_INTERNED: usize = 64;

/// A protocol's space of channel names (see the module doc).
#[derive(Clone, Copy)]
pub struct Namespace(&'static str);

impl Namespace {
    /// A namespace named `name`: 1 to [`MAX_LEN`] bytes of ASCII lowercase
    /// letters, digits and `-`, so any engine can put it in a subject or a
    /// key unescaped. Meant for constants, where a bad name fails the
    /// build (a `const` evaluated at compile time).
    pub const fn new(name: &'static str) -> Namespace {
        assert!(valid(name), "a namespace is 1-32 bytes of [a-z0-9-]");
        Namespace(name)
    }

    pub fn as_str(&self) -> &'static str {
        self.0
    }

    /// The namespace named `name`, as received from another node. Names
    /// are interned (leaked once each, at most 64 distinct), so a peer
    /// cannot make this node grow without bound.
    pub fn intern(name: &str) -> Result<Namespace, String> {
        if !valid(name) {
            return Err(format!("invalid namespace {name:?}"));
        }
        static SEEN: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
        let mut seen = SEEN.get_or_init(Default::default).lock();
        if let Some(s) = seen.get(name) {
            return Ok(Namespace(s));
        }
        if seen.len() >= MAX_INTERNED {
            return Err(format!("too many namespaces (namespace {name:?})"));
        }
        let s: &'static str = Box::leak(name.to_owned().into_boxed_str());
        seen.insert(s);
        Ok(Namespace(s))
    }
}

const fn valid(name: &str) -> bool {
    let b = name.as_bytes();
    if b.is_empty() || b.len() > MAX_LEN {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-') {
            return false;
        }
        i += 1;
    }
    true
}

impl PartialEq for Namespace {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.0, other.0) || self.0 == other.0
    }
}

impl Eq for Namespace {}

impl std::hash::Hash for Namespace {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

impl PartialOrd for Namespace {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Namespace {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(other.0)
    }
}

impl std::fmt::Debug for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::fmt::Display for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl serde::Serialize for Namespace {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Namespace {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Namespace, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Namespace::intern(&name).map_err(serde::de::Error::custom)
    }
}

/// A channel as the cluster names it: its namespace and its name.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ChannelId(pub Namespace, pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_interned_once() {
        const P: Namespace = Namespace::new("chat");
        assert_eq!(Namespace::intern("chat").unwrap(), P);
        let a = Namespace::intern("some-proto").unwrap();
        let b = Namespace::intern("some-proto").unwrap();
        assert!(std::ptr::eq(a.as_str(), b.as_str()));
        for bad in ["", "Chat", "a.b", "a/b", &"x".repeat(33)] {
            assert!(Namespace::intern(bad).is_err(), "{bad}");
        }
        let json = serde_json::to_string(&P).unwrap();
        assert_eq!(json, "\"chat\"");
        assert_eq!(serde_json::from_str::<Namespace>(&json).unwrap(), P);
    }
}
