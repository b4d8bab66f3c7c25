//! HMAC-SHA256 signatures as the Pusher protocol defines them: channel and
//! user authentication tokens, and HTTP API request signatures. Shared by
//! the Herald server (which checks them) and `herald bench` (which makes
//! them), so neither depends on the other.
//!
//! Every check goes through [`verify_hex`], which compares in constant time
//! (the `hmac` crate's `verify_slice`, built on `subtle`), so a client
//! cannot learn a valid signature byte by byte from response timings.

use hmac::{Hmac, Mac};
use md5::{Digest, Md5};
use sha2::Sha256;
use std::time::{SystemTime, UNIX_EPOCH};

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &str) -> HmacSha256 {
    // HMAC accepts keys of any length, so this cannot fail.
    HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length")
}

/// Lowercase hex HMAC-SHA256 of `message` under `secret`.
pub fn sign(secret: &str, message: &str) -> String {
    let mut m = mac(secret);
    m.update(message.as_bytes());
    hex::encode(m.finalize().into_bytes())
}

/// Whether `signature_hex` is the HMAC of `message`, compared in constant time.
pub fn verify_hex(secret: &str, message: &str, signature_hex: &str) -> bool {
    let Ok(signature) = hex::decode(signature_hex) else {
        return false;
    };
    let mut m = mac(secret);
    m.update(message.as_bytes());
    m.verify_slice(&signature).is_ok()
}

/// The string a private or encrypted channel's auth signs.
pub fn channel_string(socket_id: &str, channel: &str, channel_data: Option<&str>) -> String {
    match channel_data {
        Some(data) => format!("{socket_id}:{channel}:{data}"),
        None => format!("{socket_id}:{channel}"),
    }
}

/// The string a `pusher:signin` auth signs.
pub fn user_string(socket_id: &str, user_data: &str) -> String {
    format!("{socket_id}::user::{user_data}")
}

/// Check a client auth token of the form `{key}:{hex signature}`.
pub fn verify_token(key: &str, secret: &str, token: &str, message: &str) -> bool {
    match token.split_once(':') {
        // Comparing the key is not secret-dependent, so a plain comparison is fine.
        Some((k, sig)) if k == key => verify_hex(secret, message, sig),
        _ => false,
    }
}

/// Produce a client auth token (used by `herald bench` and the tests).
pub fn token(key: &str, secret: &str, message: &str) -> String {
    format!("{key}:{}", sign(secret, message))
}

/// Lowercase hex MD5 of an HTTP body (`body_md5`).
pub fn body_md5(body: &[u8]) -> String {
    hex::encode(Md5::digest(body))
}

/// The string an HTTP API request signs: `METHOD\nPATH\nsorted query`.
/// `params` must not contain `auth_signature`; keys are lowercased and sorted.
pub fn api_string(method: &str, path: &str, params: &[(String, String)]) -> String {
    let mut pairs: Vec<(String, &str)> = params
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str()))
        .collect();
    pairs.sort();
    let query: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{method}\n{path}\n{}", query.join("&"))
}

/// Sign a request the way Pusher's server SDKs do (for `herald bench` and
/// tests). Returns the full query string including `auth_signature`.
pub fn sign_query(
    key: &str,
    secret: &str,
    method: &str,
    path: &str,
    body: &[u8],
    extra: &[(&str, &str)],
) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut params: Vec<(String, String)> = vec![
        ("auth_key".into(), key.into()),
        ("auth_timestamp".into(), now.to_string()),
        ("auth_version".into(), "1.0".into()),
    ];
    if !body.is_empty() {
        params.push(("body_md5".into(), body_md5(body)));
    }
    params.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let signature = sign(secret, &api_string(method, path, &params));
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in &params {
        q.append_pair(k, v);
    }
    q.append_pair("auth_signature", &signature);
    q.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_channel_token_matches_pusher_docs_example() {
        // Example from Pusher's "Authorizing users" protocol documentation.
        let t = token(
            "278d425bdf160c739803",
            "7ad3773142a6692b25b8",
            &channel_string("1234.1234", "private-foobar", None),
        );
        assert_eq!(
            t,
            "278d425bdf160c739803:58df8b0c36d6982b82c3ecf6b4662e34fe8c25bba48f5369f135bf843651c3a4"
        );
        assert!(verify_token(
            "278d425bdf160c739803",
            "7ad3773142a6692b25b8",
            &t,
            "1234.1234:private-foobar"
        ));
    }

    #[test]
    fn tampered_or_malformed_tokens_fail() {
        let msg = "1.2:private-a";
        let good = token("k", "s", msg);
        assert!(verify_token("k", "s", &good, msg));
        assert!(!verify_token("k", "s", &good, "1.2:private-b"));
        assert!(!verify_token("other", "s", &good, msg));
        assert!(!verify_token("k", "s", "k:zz", msg));
        assert!(!verify_token("k", "s", "nocolon", msg));
        assert!(!verify_token("k", "s", "k:", msg));
    }

    #[test]
    fn api_string_sorts_and_lowercases() {
        let s = api_string(
            "POST",
            "/apps/3/events",
            &[
                ("auth_version".into(), "1.0".into()),
                ("Auth_Key".into(), "k".into()),
                ("body_md5".into(), "abc".into()),
            ],
        );
        assert_eq!(
            s,
            "POST\n/apps/3/events\nauth_key=k&auth_version=1.0&body_md5=abc"
        );
    }

    #[test]
    fn sign_query_signs_what_api_string_rebuilds() {
        let body = br#"{"name":"e"}"#;
        let q = sign_query("k", "s", "POST", "/apps/3/events", body, &[("info", "a b")]);
        let params: Vec<(String, String)> = form_urlencoded::parse(q.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let (signature, signed): (Vec<_>, Vec<_>) =
            params.into_iter().partition(|(k, _)| k == "auth_signature");
        assert!(signed.contains(&("body_md5".into(), body_md5(body))));
        assert!(signed.contains(&("info".into(), "a b".into())));
        let message = api_string("POST", "/apps/3/events", &signed);
        assert!(verify_hex("s", &message, &signature[0].1));
        assert!(!verify_hex("other", &message, &signature[0].1));
    }
}
