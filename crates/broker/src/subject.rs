//! Subjects (NATS) and channel names (Redis) of the cluster's traffic, the
//! same strings for both engines:
//!
//! ```text
//! {prefix}.all                  every node: heartbeats, leaving, control,
//!                               requests, signed-in users, user events, state
//! {prefix}.node.{id}            one node: replies, a heartbeat for a newcomer
//! {prefix}.canary.{id}          one node: its own broker canary
//! {prefix}.c.{app}.{ns}.{channel}  nodes with subscribers to that channel
//!                               of namespace `ns` (the protocol's): its
//!                               publications, members, counts
//! ```
//!
//! App ids and channel names are escaped into tokens made of letters,
//! digits and `_-=@,;%` only: every other byte becomes `%XX`. A channel is
//! split at `/` into one token per segment (an empty segment is a lone
//! `%`), so a trailing-wildcard pattern `/ns/a/` is the native wildcard
//! subscription `….%.ns.a.>` (NATS) or `….%.ns.a.*` (Redis): a node that
//! watches a pattern receives the matching channels' traffic without
//! anyone else knowing about patterns.

use herald_core::namespace::Namespace;

/// Append `s` escaped as one token.
fn token(out: &mut String, s: &str) {
    if s.is_empty() {
        out.push('%');
        return;
    }
    for b in s.bytes() {
        let plain = b.is_ascii_alphanumeric() || b"_-=@,;".contains(&b);
        if plain {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

fn channel_tokens(out: &mut String, channel: &str) {
    for (i, segment) in channel.split('/').enumerate() {
        if i > 0 {
            out.push('.');
        }
        token(out, segment);
    }
}

/// `{prefix}.c.{app}.{namespace}.`: a namespace is plain lowercase
/// letters, digits and `-` (see herald-core's `namespace`), one token.
fn app_base(prefix: &str, app: &str, ns: Namespace) -> String {
    let ns = ns.as_str();
    let mut s = String::with_capacity(prefix.len() + app.len() + ns.len() + 48);
    s.push_str(prefix);
    s.push_str(".c.");
    token(&mut s, app);
    s.push('.');
    s.push_str(ns);
    s.push('.');
    s
}

/// Every node listens here.
pub fn all(prefix: &str) -> String {
    format!("{prefix}.all")
}

/// Only node `node` listens here.
pub fn node(prefix: &str, node: u64) -> String {
    format!("{prefix}.node.{node}")
}

/// `{prefix}.canary.{id}`: the subject only node `id` listens to, for the
/// broker canary ([`crate::engine`]'s `canary`).
pub fn canary(prefix: &str, node: u64) -> String {
    format!("{prefix}.canary.{node}")
}

/// The subject of an exact channel.
pub fn channel(prefix: &str, app: &str, ns: Namespace, channel: &str) -> String {
    let mut s = app_base(prefix, app, ns);
    channel_tokens(&mut s, channel);
    s
}

/// The wildcard subscription for a trailing-wildcard pattern (a prefix
/// ending at `/`), with the engine's multi-token `wildcard`.
pub fn pattern(prefix: &str, app: &str, ns: Namespace, pattern: &str, wildcard: &str) -> String {
    let mut s = app_base(prefix, app, ns);
    channel_tokens(&mut s, pattern.strip_suffix('/').unwrap_or(pattern));
    s.push('.');
    s.push_str(wildcard);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    const N: Namespace = Namespace::new("n");

    #[test]
    fn tokens_are_escaped() {
        assert_eq!(channel("h", "app-id", N, "news"), "h.c.app-id.n.news");
        assert_eq!(
            channel("h", "a.b", N, "private-x.y z"),
            "h.c.a%2Eb.n.private-x%2Ey%20z"
        );
        assert_eq!(channel("h", "a", N, "/ns/a/b"), "h.c.a.n.%.ns.a.b");
        assert_eq!(channel("h", "a", N, "/ns//"), "h.c.a.n.%.ns.%.%");
        assert_eq!(channel("h", "a", N, "é*>"), "h.c.a.n.%C3%A9%2A%3E");
    }

    #[test]
    fn patterns_cover_their_channels_at_segment_boundaries() {
        let p = pattern("h", "a", N, "/ns/a/", ">");
        assert_eq!(p, "h.c.a.n.%.ns.a.>");
        let base = p.trim_end_matches('>');
        assert!(channel("h", "a", N, "/ns/a/b").starts_with(base));
        assert!(channel("h", "a", N, "/ns/a/b/c").starts_with(base));
        assert!(channel("h", "a", N, "/ns/a/").starts_with(base));
        assert!(!channel("h", "a", N, "/ns/ab").starts_with(base));
        assert_eq!(pattern("h", "a", N, "/", "*"), "h.c.a.n.%.*");
    }

    #[test]
    fn distinct_names_give_distinct_subjects() {
        let names = ["a.b", "a/b", "a%2Eb", "a%2Fb", "a", "a/", "/a", ""];
        let mut seen = std::collections::HashSet::new();
        for n in names {
            assert!(seen.insert(channel("h", "x", N, n)), "{n}");
        }
        // The same name in two namespaces: two subjects.
        let other = Namespace::new("m");
        assert_ne!(channel("h", "x", N, "a"), channel("h", "x", other, "a"));
    }
}
