//! API-key authorization, as AppSync clients send it: a JSON object of
//! headers (`host`, `x-api-key`, `x-amz-date`, ...) carried
//!
//! - in the WebSocket URL's `header` query parameter, base64-encoded (the
//!   generic pub/sub GraphQL API's documented handshake);
//! - in a `header-<base64url JSON>` WebSocket subprotocol (the Events API,
//!   and Amplify's GraphQL client too);
//! - as `authorization` (Events) or `payload.extensions.authorization`
//!   (GraphQL `start`) in each subscribe and publish message;
//! - as the `x-api-key` HTTP header on publishes.
//!
//! Here: `x-api-key` (`host` names whatever host the client used and is
//! not checked: a self-hosted server has many names). Cognito, OIDC,
//! Lambda and IAM are `crate::auth_modes`'. Keys are compared in constant
//! time and never logged.

use crate::config::{AppKeys, NamespaceConfig};
use base64::Engine;
use serde_json::{Map, Value};
use subtle::ConstantTimeEq;

/// Largest encoded `header` we decode (they hold a few headers; a JWT
/// would be the largest).
pub const MAX_HEADER_ENCODED: usize = 16 * 1024;

/// The `x-api-key` in an object of headers, if it is a string.
pub fn api_key_of(headers: &Map<String, Value>) -> Option<String> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("x-api-key"))
        .and_then(|(_, v)| v.as_str())
        .map(str::to_owned)
}

/// Decode base64 in any of its common spellings (standard or URL-safe,
/// padded or not) into a JSON object of headers.
pub fn decode_header(encoded: &str) -> Option<Map<String, Value>> {
    if encoded.is_empty() || encoded.len() > MAX_HEADER_ENCODED {
        return None;
    }
    let trimmed = encoded.trim_end_matches('=');
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(trimmed)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(trimmed))
        .ok()?;
    match serde_json::from_slice::<Value>(&bytes).ok()? {
        Value::Object(m) => Some(m),
        _ => None,
    }
}

/// The API key a WebSocket upgrade carries: in a `header-...` subprotocol
/// or the `header` query parameter. `Err` when one is there but cannot be
/// read (not base64 of a JSON object).
pub fn upgrade_key(
    subprotocols: &[String],
    query: Option<&str>,
) -> Result<Option<String>, &'static str> {
    Ok(upgrade_headers(subprotocols, query)?.and_then(|h| api_key_of(&h)))
}

/// The object of headers a WebSocket upgrade carries (every mode's
/// credentials travel in it), `None` when there is none.
pub fn upgrade_headers(
    subprotocols: &[String],
    query: Option<&str>,
) -> Result<Option<Map<String, Value>>, &'static str> {
    for p in subprotocols {
        if let Some(enc) = p.strip_prefix("header-") {
            let headers = decode_header(enc)
                .ok_or("the header- subprotocol is not base64url of a JSON object")?;
            return Ok(Some(headers));
        }
    }
    let param = query.and_then(|q| {
        q.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (k == "header").then_some(v)
        })
    });
    if let Some(raw) = param {
        let decoded = percent_decode(raw);
        let headers = decode_header(&decoded)
            .ok_or("the header query parameter is not base64 of a JSON object")?;
        return Ok(Some(headers));
    }
    Ok(None)
}

/// The offered subprotocols, in the client's order.
pub fn subprotocols(headers: &axum::http::HeaderMap) -> Vec<String> {
    headers
        .get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .take(16)
        .collect()
}

/// `%XX` escapes (a base64 `+`, `/` or `=` may arrive encoded).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `key` is one of `keys`, in constant time for each comparison.
pub fn key_in<'a>(keys: impl IntoIterator<Item = &'a str>, key: &str) -> bool {
    let mut found = subtle::Choice::from(0u8);
    for k in keys {
        found |= k.as_bytes().ct_eq(key.as_bytes());
    }
    found.into()
}

/// What a client wants to do in a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Publish,
    Subscribe,
}

/// Why a namespace check failed: AppSync's error type and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub error_type: &'static str,
    pub message: String,
}

pub const UNAUTHORIZED: &str = "UnauthorizedException";
pub const UNAUTHORIZED_MESSAGE: &str = "You are not authorized to make this call.";

/// Whether `key` may `action` in namespace `ns` of `app`: a configured
/// namespace's own key list, or the app's API keys. With no namespaces
/// configured every namespace is open to the app's keys.
pub fn check_namespace(app: &AppKeys, ns: &str, action: Action, key: &str) -> Result<(), Denied> {
    let unauthorized = || Denied {
        error_type: UNAUTHORIZED,
        message: UNAUTHORIZED_MESSAGE.into(),
    };
    if app.namespaces.is_empty() {
        return if key_in(app.effective_api_keys(), key) {
            Ok(())
        } else {
            Err(unauthorized())
        };
    }
    let Some(config) = app.namespaces.iter().find(|n| n.name == ns) else {
        return Err(Denied {
            error_type: "BadRequestException",
            message: format!("Namespace {ns:?} does not exist"),
        });
    };
    if key_in(namespace_keys(app, config, action), key) {
        Ok(())
    } else {
        Err(unauthorized())
    }
}

fn namespace_keys<'a>(app: &'a AppKeys, ns: &'a NamespaceConfig, action: Action) -> Vec<&'a str> {
    let own = match action {
        Action::Publish => &ns.publish_keys,
        Action::Subscribe => &ns.subscribe_keys,
    };
    match own {
        Some(keys) => keys.iter().map(String::as_str).collect(),
        None => app.effective_api_keys().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

    #[test]
    fn keys_from_the_handshake() {
        let json = r#"{"host":"example.com","x-api-key":"da2-abc?>"}"#;
        let sub = format!("header-{}", URL_SAFE_NO_PAD.encode(json));
        let got = upgrade_key(&["aws-appsync-event-ws".into(), sub], None).unwrap();
        assert_eq!(got.as_deref(), Some("da2-abc?>"));
        let q = format!("header={}&payload=e30=", STANDARD.encode(json));
        assert_eq!(
            upgrade_key(&[], Some(&q)).unwrap().as_deref(),
            Some("da2-abc?>")
        );
        // Percent-encoded base64 too.
        let q = format!(
            "header={}",
            STANDARD
                .encode(json)
                .replace('=', "%3D")
                .replace('+', "%2B")
        );
        assert_eq!(
            upgrade_key(&[], Some(&q)).unwrap().as_deref(),
            Some("da2-abc?>")
        );
        assert_eq!(upgrade_key(&[], Some("payload=e30=")).unwrap(), None);
        assert!(upgrade_key(&["header-!!!".into()], None).is_err());
        assert!(upgrade_key(&[], Some("header=bm90IGpzb24")).is_err());
        // A JSON value that is not an object.
        let arr = URL_SAFE_NO_PAD.encode("[1]");
        assert!(upgrade_key(&[format!("header-{arr}")], None).is_err());
    }

    #[test]
    fn key_lists() {
        assert!(key_in(["a", "bb"], "bb"));
        assert!(!key_in(["a", "bb"], "b"));
        assert!(!key_in([], ""));
    }

    #[test]
    fn namespaces() {
        let dev = herald_core::config::AppConfig::development();
        let mut app = AppKeys::new(&dev, &Default::default());
        assert!(check_namespace(&app, "any", Action::Publish, "app-key").is_ok());
        assert_eq!(
            check_namespace(&app, "any", Action::Publish, "nope")
                .unwrap_err()
                .error_type,
            UNAUTHORIZED
        );
        app.api_keys = vec!["k1".into(), "k2".into()];
        app.namespaces = vec![NamespaceConfig {
            name: "chat".into(),
            publish_keys: Some(vec!["k2".into()]),
            subscribe_keys: None,
            ..Default::default()
        }];
        assert!(check_namespace(&app, "chat", Action::Subscribe, "k1").is_ok());
        assert!(check_namespace(&app, "chat", Action::Publish, "k1").is_err());
        assert!(check_namespace(&app, "chat", Action::Publish, "k2").is_ok());
        assert_eq!(
            check_namespace(&app, "other", Action::Subscribe, "k1")
                .unwrap_err()
                .error_type,
            "BadRequestException"
        );
        // The development key is not accepted once keys are configured.
        assert!(check_namespace(&app, "chat", Action::Subscribe, "app-key").is_err());
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn decoding_never_panics(s in ".{0,200}", q in ".{0,200}") {
                let _ = upgrade_key(&[format!("header-{s}")], None);
                let _ = upgrade_key(&[], Some(&q));
                let _ = percent_decode(&q);
            }
        }
    }
}
