//! Allowed origins: which web pages may open a connection to an app.
//!
//! A browser sends `Origin` with every WebSocket upgrade and every
//! cross-site POST, and it sends the visitor's cookies with them: a page on
//! any site could otherwise open `/cable` as the visitor (cross-site
//! WebSocket hijacking) or publish with a key it read from the app's page.
//! Each app lists the origins it serves, as Reverb and AnyCable write them:
//!
//! - `*`: any origin (the default; no check at all);
//! - a host, `app.example.com`: that host, any scheme and port;
//! - a host and port, `localhost:3000`: that host on that port only;
//! - a wildcard, `*.example.org`: any subdomain of `example.org` (not
//!   `example.org` itself: list it too);
//! - a full origin, `https://app.example.com` or `https://*.example.org:8443`:
//!   that scheme too (and the port, when given; else the scheme's default).
//!
//! Hosts are compared whole and case-insensitively, so suffix tricks
//! (`example.org.evil.net`, `evilexample.org`) never match. `Origin: null`
//! (sandboxed frames, `file:` pages, some redirects) matches nothing but
//! `*`: any page can send it. A request **without** an `Origin` header is
//! not a browser's (mobile apps, servers, the `pusher` SDKs) and is
//! accepted: the check protects browsers' visitors, and refusing those
//! clients (as AnyCable does) only breaks them.
//!
//! Each adapter asks [`check`] before any session exists and answers a
//! refusal with its protocol's code (Pusher 4009 as Reverb, HTTP 403 on
//! `/cable` as AnyCable, `UnauthorizedException` on AppSync); [`check`]
//! counts it in `herald_origins_refused_total`.

use axum::http::header::ORIGIN;
use axum::http::HeaderMap;

/// One entry of `allowed_origins`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern {
    /// `https`, when the entry names a scheme.
    scheme: Option<String>,
    /// Lowercase; for a wildcard, the domain after `*.`.
    host: String,
    /// `*.host`: subdomains of `host` only.
    wildcard: bool,
    port: Option<u16>,
}

/// An app's allowed origins, parsed once (when the app is loaded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedOrigins {
    /// `*` is in the list: no check.
    any: bool,
    patterns: Box<[Pattern]>,
}

impl Default for AllowedOrigins {
    fn default() -> Self {
        AllowedOrigins::any()
    }
}

impl AllowedOrigins {
    /// Any origin (`["*"]`).
    pub fn any() -> AllowedOrigins {
        AllowedOrigins {
            any: true,
            patterns: Box::new([]),
        }
    }

    /// No browser origin at all (clients without `Origin` still pass).
    pub fn none() -> AllowedOrigins {
        AllowedOrigins {
            any: false,
            patterns: Box::new([]),
        }
    }

    /// Parse a list as the settings hold it; an error says which entry is
    /// wrong and why (its index in the list first).
    pub fn parse<S: AsRef<str>>(list: &[S]) -> Result<AllowedOrigins, (usize, String)> {
        if list.is_empty() {
            return Err((
                0,
                "must list at least one origin (\"*\" for any)".to_owned(),
            ));
        }
        let mut out = AllowedOrigins::none();
        let mut patterns = Vec::with_capacity(list.len());
        for (i, entry) in list.iter().enumerate() {
            let entry = entry.as_ref().trim();
            if entry == "*" {
                out.any = true;
                continue;
            }
            patterns.push(parse_pattern(entry).map_err(|why| (i, why))?);
        }
        out.patterns = patterns.into();
        Ok(out)
    }

    /// Whether every origin is allowed (`*`).
    pub fn allows_any(&self) -> bool {
        self.any
    }

    /// Whether a request with this `Origin` value (None: no header) may go on.
    pub fn allows(&self, origin: Option<&[u8]>) -> bool {
        if self.any {
            return true;
        }
        let Some(origin) = origin else {
            return true;
        };
        let Some(o) = std::str::from_utf8(origin).ok().and_then(parse_origin) else {
            return false;
        };
        self.patterns.iter().any(|p| p.matches(&o))
    }
}

/// An `Origin` header's parts.
struct Origin {
    scheme: String,
    host: String,
    /// The port given, or the scheme's default (None for schemes without one).
    port: Option<u16>,
}

/// `scheme://host[:port]` as browsers send it; anything else (`null`, a
/// path, user info, several origins) is no origin.
fn parse_origin(s: &str) -> Option<Origin> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("null") || s.contains(char::is_whitespace) {
        return None;
    }
    let url = url::Url::parse(s).ok()?;
    let host = url.host_str()?;
    if !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
        || !matches!(url.path(), "" | "/")
    {
        return None;
    }
    Some(Origin {
        scheme: url.scheme().to_owned(),
        host: host.to_ascii_lowercase(),
        port: url.port_or_known_default(),
    })
}

fn parse_pattern(entry: &str) -> Result<Pattern, String> {
    let bad = |why: &str| format!("{entry:?} is not an origin pattern: {why}");
    let (scheme, rest) = match entry.split_once("://") {
        Some((s, rest)) => {
            let ok = s.starts_with(|c: char| c.is_ascii_alphabetic())
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
            if !ok {
                return Err(bad("the scheme must be letters, e.g. https"));
            }
            (Some(s.to_ascii_lowercase()), rest)
        }
        None => (None, entry),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#', '@']) {
        return Err(bad(
            "give a host (app.example.com) or an origin (https://app.example.com), without a path",
        ));
    }
    let (host, port) = match rest.rsplit_once(':') {
        // A bare IPv6 address: its colons are not a port's.
        Some((h, _)) if !h.ends_with(']') && h.contains(':') => (rest, None),
        Some((h, p)) => {
            let port: u16 = p
                .parse()
                .map_err(|_| bad("the port must be a number (localhost:3000)"))?;
            (h, Some(port))
        }
        None => (rest, None),
    };
    let (wildcard, host) = match host.strip_prefix("*.") {
        Some(h) => (true, h),
        None => (false, host),
    };
    let host = host.to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || !c.is_ascii())
    };
    let ip_ok =
        host.starts_with('[') && host.ends_with(']') || host.parse::<std::net::IpAddr>().is_ok();
    if host.is_empty() || !(ip_ok || host.split('.').all(label_ok)) {
        return Err(bad(
            "a host is names of letters, digits and '-' joined by '.', with '*.' only at its start",
        ));
    }
    // The origin's host as `url` writes it (IDNs in punycode, IPv6 in
    // brackets), so both sides compare alike.
    let probe = format!("{}://{host}", scheme.as_deref().unwrap_or("https"));
    let host = match url::Url::parse(&probe)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned))
    {
        Some(h) => h.to_ascii_lowercase(),
        None => return Err(bad("the host is not valid")),
    };
    Ok(Pattern {
        scheme,
        host,
        wildcard,
        port,
    })
}

impl Pattern {
    fn matches(&self, o: &Origin) -> bool {
        if self.scheme.as_ref().is_some_and(|s| *s != o.scheme) {
            return false;
        }
        let host_ok = if self.wildcard {
            o.host.len() > self.host.len() + 1
                && o.host.ends_with(self.host.as_str())
                && o.host.as_bytes()[o.host.len() - self.host.len() - 1] == b'.'
        } else {
            o.host == self.host
        };
        if !host_ok {
            return false;
        }
        match (self.port, &self.scheme) {
            (Some(p), _) => o.port == Some(p),
            // A full origin without a port means the scheme's default,
            // as a browser writes it.
            (None, Some(s)) => {
                o.port
                    == url::Url::parse(&format!("{s}://x"))
                        .ok()
                        .and_then(|u| u.port_or_known_default())
            }
            (None, None) => true,
        }
    }
}

/// Check a request's `Origin` against `allowed`: true to go on. A refusal
/// is counted (`herald_origins_refused_total`, by app and protocol) and
/// logged at debug with the origin (a browser's page address, no secret).
/// Call it once the request's app is known and before any session or
/// publication exists; answer false with the protocol's refusal.
pub fn check(
    headers: &HeaderMap,
    allowed: &AllowedOrigins,
    app: &str,
    protocol: &'static str,
) -> bool {
    if allowed.allows_any() {
        return true;
    }
    // Several `Origin` headers: not a browser's request; take none of them.
    let mut values = headers.get_all(ORIGIN).iter();
    let origin = values.next();
    let ok = values.next().is_none() && allowed.allows(origin.map(|v| v.as_bytes()));
    if !ok {
        crate::metrics::origin_refused(app, protocol);
        tracing::debug!(
            app,
            protocol,
            origin = %origin.map(|v| String::from_utf8_lossy(v.as_bytes())).unwrap_or_default(),
            "origin not allowed"
        );
    }
    ok
}

/// The message every protocol's refusal carries (Reverb's words).
pub const REFUSED_MESSAGE: &str = "Origin not allowed";

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(list: &[&str]) -> AllowedOrigins {
        AllowedOrigins::parse(list).unwrap()
    }

    fn ok(a: &AllowedOrigins, origin: &str) -> bool {
        a.allows(Some(origin.as_bytes()))
    }

    #[test]
    fn hosts_wildcards_and_full_origins() {
        let a = allowed(&[
            "app.example.com",
            "*.example.org",
            "https://secure.example.net",
            "localhost:3000",
        ]);
        assert!(ok(&a, "https://app.example.com"));
        assert!(ok(&a, "http://app.example.com:8080"));
        assert!(ok(&a, "https://APP.Example.com"));
        assert!(ok(&a, "https://a.example.org"));
        assert!(ok(&a, "https://a.b.example.org"));
        assert!(
            !ok(&a, "https://example.org"),
            "a wildcard is subdomains only"
        );
        assert!(ok(&a, "https://secure.example.net"));
        assert!(
            !ok(&a, "http://secure.example.net"),
            "the scheme is part of a full origin"
        );
        assert!(
            !ok(&a, "https://secure.example.net:8443"),
            "and its default port"
        );
        assert!(ok(&a, "http://localhost:3000"));
        assert!(!ok(&a, "http://localhost:3001"));
        assert!(a.allows(None), "no Origin header: not a browser");
    }

    #[test]
    fn suffix_tricks_null_and_garbage_are_refused() {
        let a = allowed(&["app.example.com", "*.example.org"]);
        for o in [
            "https://app.example.com.evil.net",
            "https://example.org.evil.net",
            "https://evilexample.org",
            "https://evil-app.example.com",
            "https://app.example.com@evil.net",
            "null",
            "NULL",
            "",
            "app.example.com",
            "https://app.example.com/path",
            "https://app.example.com https://evil.net",
        ] {
            assert!(!ok(&a, o), "{o:?} must be refused");
        }
        assert!(!a.allows(Some(b"https://app.example.com\xff")));
    }

    #[test]
    fn any_allows_everything() {
        let a = allowed(&["app.example.com", "*"]);
        assert!(ok(&a, "null") && ok(&a, "https://evil.net"));
        assert!(AllowedOrigins::default().allows_any());
    }

    #[test]
    fn bad_patterns_are_refused_with_their_index() {
        for (list, at) in [
            (vec!["ok.example.com", "https://x.com/path"], 1),
            (vec!["a..b"], 0),
            (vec!["*"; 0], 0),
            (vec!["app.*.com"], 0),
            (vec!["localhost:http"], 0),
            (vec!["ht tp://x.com"], 0),
        ] {
            let e = AllowedOrigins::parse(&list).unwrap_err();
            assert_eq!(e.0, at, "{list:?}: {e:?}");
        }
    }

    #[test]
    fn ip_addresses() {
        let a = allowed(&["127.0.0.1:8080", "[::1]"]);
        assert!(ok(&a, "http://127.0.0.1:8080"));
        assert!(!ok(&a, "http://127.0.0.1:8081"));
        assert!(ok(&a, "http://[::1]:5000"));
    }
}
