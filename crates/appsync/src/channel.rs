//! Events API channel paths: `/namespace/segment/...`, at most five
//! segments of 1-50 characters of `[A-Za-z0-9-]`, case-sensitive. A
//! subscription may end in `/*`, which matches every channel below that
//! prefix, at any depth (`/ns/*` receives `/ns/a` and `/ns/a/b/c`): that is
//! what AWS does (a `default/*` subscriber receives events published to
//! `/default/download/{user}/{id}`; aws/aws-appsync-community#398), and
//! what the core's pattern subscriptions match. Publishing needs a concrete
//! path.
//!
//! Clients write paths with or without the leading slash (Amplify's docs
//! write `default/channel`); the canonical form, used as the core's channel
//! name, has it.

use crate::config::is_namespace_name;

/// Most segments in a path, the namespace included (AWS's limit).
pub const MAX_SEGMENTS: usize = 5;

/// A checked channel path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelPath {
    /// For a concrete channel, the path (`/ns/a/b`); for a wildcard, the
    /// core's pattern prefix (`/ns/a/` for `/ns/a/*`).
    pub name: String,
    /// Length of the namespace in `name` after the leading slash.
    ns_len: usize,
    pub wildcard: bool,
}

impl ChannelPath {
    pub fn namespace(&self) -> &str {
        &self.name[1..1 + self.ns_len]
    }
}

/// Why a path was refused; the message is sent to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidChannel(pub String);

impl std::fmt::Display for InvalidChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parse a path a client subscribes to: a trailing `*` segment is allowed.
pub fn parse_subscribe(path: &str) -> Result<ChannelPath, InvalidChannel> {
    parse(path, true)
}

/// Parse a path a client publishes to: it must be concrete.
pub fn parse_publish(path: &str) -> Result<ChannelPath, InvalidChannel> {
    parse(path, false)
}

fn parse(path: &str, wildcard_ok: bool) -> Result<ChannelPath, InvalidChannel> {
    let invalid =
        |why: &str| InvalidChannel(format!("Invalid channel path {}: {why}", shown(path)));
    let body = path.strip_prefix('/').unwrap_or(path);
    if body.is_empty() {
        return Err(invalid("a channel path needs a namespace and a channel"));
    }
    let segments: Vec<&str> = body.split('/').collect();
    if segments.len() > MAX_SEGMENTS {
        return Err(invalid(&format!("at most {MAX_SEGMENTS} segments")));
    }
    let last = segments.len() - 1;
    let wildcard = segments[last] == "*";
    if wildcard && !wildcard_ok {
        return Err(invalid(
            "publishing needs a concrete channel, not a wildcard",
        ));
    }
    if wildcard && last == 0 {
        return Err(invalid("the namespace cannot be a wildcard"));
    }
    for (i, seg) in segments.iter().enumerate() {
        if wildcard && i == last {
            continue;
        }
        if seg.contains('*') {
            return Err(invalid("'*' is only allowed as the whole last segment"));
        }
        if !is_namespace_name(seg) {
            return Err(invalid(
                "each segment is 1-50 characters of A-Z, a-z, 0-9 and '-'",
            ));
        }
    }
    if segments.len() == 1 {
        return Err(invalid("a channel path needs a namespace and a channel"));
    }
    let mut name = String::with_capacity(body.len() + 1);
    name.push('/');
    if wildcard {
        // `/ns/a/*` → the prefix `/ns/a/`.
        name.push_str(&body[..body.len() - 1]);
    } else {
        name.push_str(body);
    }
    Ok(ChannelPath {
        ns_len: segments[0].len(),
        name,
        wildcard,
    })
}

/// A bounded, quoted copy of a client's path for an error message.
fn shown(path: &str) -> String {
    let cut: String = path.chars().take(80).collect();
    if cut.len() < path.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concrete_paths() {
        let c = parse_publish("/default/chat").unwrap();
        assert_eq!(
            (c.name.as_str(), c.namespace(), c.wildcard),
            ("/default/chat", "default", false)
        );
        // Without the leading slash, as Amplify users write it.
        assert_eq!(parse_publish("default/a/b").unwrap().name, "/default/a/b");
        assert!(parse_publish("/a/b/c/d/e").is_ok());
        assert!(parse_publish(&format!("/ns/{}", "x".repeat(50))).is_ok());
    }

    #[test]
    fn wildcards() {
        let c = parse_subscribe("/default/*").unwrap();
        assert_eq!(
            (c.name.as_str(), c.namespace(), c.wildcard),
            ("/default/", "default", true)
        );
        assert_eq!(parse_subscribe("ns/a/b/c/*").unwrap().name, "/ns/a/b/c/");
        assert!(parse_subscribe("/ns/a/b/c/d/*").is_err(), "six segments");
        assert!(parse_publish("/default/*").is_err());
        assert!(parse_subscribe("/*").is_err());
        assert!(parse_subscribe("/ns/*/a").is_err());
        assert!(parse_subscribe("/ns/a*").is_err());
        assert!(parse_subscribe("/ns/**").is_err());
    }

    #[test]
    fn invalid_paths() {
        for p in [
            "",
            "/",
            "/ns",
            "ns",
            "/ns/",
            "//a",
            "/ns//a",
            "/ns/a/",
            "/ns/a_b",
            "/ns/a.b",
            "/ns/é",
            "/a/b/c/d/e/f",
            "/ns/a b",
        ] {
            assert!(parse_publish(p).is_err(), "{p:?}");
            assert!(parse_subscribe(p).is_err(), "{p:?}");
        }
        assert!(parse_publish(&format!("/ns/{}", "x".repeat(51))).is_err());
        let long = format!("/ns/{}", "é".repeat(500));
        let e = parse_publish(&long).unwrap_err();
        assert!(e.0.len() < 300, "the echo is bounded: {}", e.0.len());
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn never_panics_and_accepts_only_valid(path in ".{0,80}", sub in any::<bool>()) {
                let r = if sub { parse_subscribe(&path) } else { parse_publish(&path) };
                if let Ok(c) = r {
                    prop_assert!(c.name.starts_with('/'));
                    let segs: Vec<&str> = c.name[1..].trim_end_matches('/').split('/').collect();
                    prop_assert!(segs.len() + usize::from(c.wildcard) <= MAX_SEGMENTS);
                    prop_assert!(segs.iter().all(|s| is_namespace_name(s)));
                }
            }
        }
    }
}
