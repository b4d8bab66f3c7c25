//! Subjects (NATS) and channel names (Redis) of the cluster's traffic, the
//! same strings for both engines:
//!
//! ```text
//! {prefix}.all                  every node: heartbeats, leaving, control,
//!                               requests, signed-in users, user events, state
//! {prefix}.node.{id}            one node: replies, a heartbeat for a newcomer
//! {prefix}.c.{app}.{channel}    nodes with subscribers to that channel:
//!                               its publications, members, counts
//! ```
//!
//! App ids and channel names are escaped into tokens made of letters,
//! digits and `_-=@,;%` only: every other byte becomes `%XX`. A channel is
//! split at `/` into one token per segment (an empty segment is a lone
//! `%`), so a trailing-wildcard pattern `/ns/a/` is the native wildcard
//! subscription `….%.ns.a.>` (NATS) or `….%.ns.a.*` (Redis): a node that
//! watches a pattern receives the matching channels' traffic without
//! anyone else knowing about patterns.

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

fn app_base(prefix: &str, app: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + app.len() + 48);
    s.push_str(prefix);
    s.push_str(".c.");
    token(&mut s, app);
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

/// The subject of an exact channel.
pub fn channel(prefix: &str, app: &str, channel: &str) -> String {
    let mut s = app_base(prefix, app);
    channel_tokens(&mut s, channel);
    s
}

/// The wildcard subscription for a trailing-wildcard pattern (a prefix
/// ending at `/`), with the engine's multi-token `wildcard`.
pub fn pattern(prefix: &str, app: &str, pattern: &str, wildcard: &str) -> String {
    let mut s = app_base(prefix, app);
    channel_tokens(&mut s, pattern.strip_suffix('/').unwrap_or(pattern));
    s.push('.');
    s.push_str(wildcard);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_escaped() {
        assert_eq!(channel("h", "app-id", "news"), "h.c.app-id.news");
        assert_eq!(
            channel("h", "a.b", "private-x.y z"),
            "h.c.a%2Eb.private-x%2Ey%20z"
        );
        assert_eq!(channel("h", "a", "/ns/a/b"), "h.c.a.%.ns.a.b");
        assert_eq!(channel("h", "a", "/ns//"), "h.c.a.%.ns.%.%");
        assert_eq!(channel("h", "a", "é*>"), "h.c.a.%C3%A9%2A%3E");
    }

    #[test]
    fn patterns_cover_their_channels_at_segment_boundaries() {
        let p = pattern("h", "a", "/ns/a/", ">");
        assert_eq!(p, "h.c.a.%.ns.a.>");
        let base = p.trim_end_matches('>');
        assert!(channel("h", "a", "/ns/a/b").starts_with(base));
        assert!(channel("h", "a", "/ns/a/b/c").starts_with(base));
        assert!(channel("h", "a", "/ns/a/").starts_with(base));
        assert!(!channel("h", "a", "/ns/ab").starts_with(base));
        assert_eq!(pattern("h", "a", "/", "*"), "h.c.a.%.*");
    }

    #[test]
    fn distinct_names_give_distinct_subjects() {
        let names = ["a.b", "a/b", "a%2Eb", "a%2Fb", "a", "a/", "/a", ""];
        let mut seen = std::collections::HashSet::new();
        for n in names {
            assert!(seen.insert(channel("h", "x", n)), "{n}");
        }
    }
}
