//! HTTP API request authentication, exactly as Pusher specifies it:
//! `auth_key`, `auth_timestamp` (±600 s), `auth_version`, `body_md5` for
//! bodies, and `auth_signature` = HMAC-SHA256 over
//! `METHOD\nPATH\nsorted query without auth_signature`.

use crate::api_error::ApiError;
use crate::signing;
use herald_core::hub::Hub;
use herald_core::node::Node;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// How far `auth_timestamp` may be from the server clock.
pub const MAX_CLOCK_SKEW_SECS: i64 = 600;

/// One API request as signed by the client.
pub struct SignedRequest<'a> {
    pub app_id: &'a str,
    pub method: &'a str,
    /// The request path as sent (still percent-encoded).
    pub path: &'a str,
    /// The raw query string.
    pub query: &'a str,
    pub body: &'a [u8],
}

/// Find the app and check the request's signature. Every failure says what
/// was wrong, never what the right value would have been.
pub fn authenticate(node: &Node, req: &SignedRequest<'_>) -> Result<Arc<Hub>, ApiError> {
    let hub = node
        .hub_by_id(req.app_id)
        .ok_or_else(|| ApiError::new(404, "Unknown app id"))?
        .clone();
    let params: Vec<(String, String)> = form_urlencoded::parse(req.query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let unauthorized = |msg: &str| ApiError::new(401, msg);

    let key = get("auth_key").ok_or_else(|| unauthorized("Missing auth_key"))?;
    let timestamp = get("auth_timestamp").ok_or_else(|| unauthorized("Missing auth_timestamp"))?;
    let version = get("auth_version").ok_or_else(|| unauthorized("Missing auth_version"))?;
    let signature = get("auth_signature").ok_or_else(|| unauthorized("Missing auth_signature"))?;
    if key != hub.config().key {
        return Err(unauthorized("Unknown auth_key"));
    }
    if version != "1.0" {
        return Err(unauthorized("Unsupported auth_version (expected 1.0)"));
    }
    let ts: i64 = timestamp
        .parse()
        .map_err(|_| unauthorized("auth_timestamp must be an integer (Unix seconds)"))?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    if (now - ts).abs() > MAX_CLOCK_SKEW_SECS {
        return Err(unauthorized(
            "auth_timestamp is more than 600 seconds away from the server's clock",
        ));
    }
    if !req.body.is_empty() {
        let md5 = get("body_md5")
            .ok_or_else(|| unauthorized("Missing body_md5 for a request with a body"))?;
        // Not secret: the client computed it from its own body.
        if !md5.eq_ignore_ascii_case(&signing::body_md5(req.body)) {
            return Err(unauthorized("body_md5 does not match the request body"));
        }
    }
    let signed: Vec<(String, String)> = params
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("auth_signature"))
        .cloned()
        .collect();
    let expected = signing::api_string(req.method, req.path, &signed);
    if !signing::verify_hex(&hub.config().secret, &expected, signature) {
        return Err(unauthorized("Invalid auth_signature"));
    }
    if !hub.config().enabled {
        return Err(ApiError::new(403, "App is disabled"));
    }
    Ok(hub)
}

/// Moved to the `herald-signing` crate, which `herald bench` shares;
/// re-exported so `herald_pusher::auth::sign_query` keeps working.
pub use crate::signing::sign_query;
