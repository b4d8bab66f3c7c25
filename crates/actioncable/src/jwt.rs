//! AnyCable's JWT identification: a client brings a token (`?jid=` in the
//! URL, or an `x-jid` header), an HMAC-signed JWT (HS256, HS384 or HS512)
//! whose `ext` claim holds the connection identifiers. A valid token
//! identifies the client without a `Connect` call; an expired one gets
//! `token_expired`, a bad one `unauthorized`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::{Sha256, Sha384, Sha512};
use subtle::ConstantTimeEq;

/// Longest token read, in bytes.
pub const MAX_TOKEN: usize = 8 * 1024;

#[derive(Debug, PartialEq, Eq)]
pub enum Identity {
    /// The connection identifiers from `ext`.
    Valid(String),
    /// Signed by us but past its `exp`: the identifiers it names, if any
    /// (a restore compares them with the session's: a token naming
    /// another identity restores nothing).
    Expired(Option<String>),
    Invalid(&'static str),
}

#[derive(Deserialize)]
struct Header {
    alg: String,
}

#[derive(Deserialize)]
struct Claims {
    ext: Option<serde_json::Value>,
    exp: Option<f64>,
    nbf: Option<f64>,
}

fn mac(alg: &str, key: &[u8], data: &[u8]) -> Option<Vec<u8>> {
    Some(match alg {
        "HS256" => {
            let mut m = Hmac::<Sha256>::new_from_slice(key).ok()?;
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        "HS384" => {
            let mut m = Hmac::<Sha384>::new_from_slice(key).ok()?;
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        "HS512" => {
            let mut m = Hmac::<Sha512>::new_from_slice(key).ok()?;
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        _ => return None,
    })
}

/// Check `token` with `secret` at `now` (Unix seconds).
pub fn identify(secret: &str, token: &str, now: u64) -> Identity {
    if token.len() > MAX_TOKEN {
        return Identity::Invalid("token too long");
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Identity::Invalid("not a JWT");
    };
    let Some(header) = URL_SAFE_NO_PAD
        .decode(h)
        .ok()
        .and_then(|b| serde_json::from_slice::<Header>(&b).ok())
    else {
        return Identity::Invalid("bad header");
    };
    let Some(want) = mac(
        &header.alg,
        secret.as_bytes(),
        &token.as_bytes()[..h.len() + 1 + p.len()],
    ) else {
        return Identity::Invalid("unsupported algorithm (HS256, HS384, HS512)");
    };
    let Ok(given) = URL_SAFE_NO_PAD.decode(s) else {
        return Identity::Invalid("bad signature");
    };
    if !bool::from(want.ct_eq(&given)) {
        return Identity::Invalid("bad signature");
    }
    let Some(claims) = URL_SAFE_NO_PAD
        .decode(p)
        .ok()
        .and_then(|b| serde_json::from_slice::<Claims>(&b).ok())
    else {
        return Identity::Invalid("bad claims");
    };
    let now = now as f64;
    let ids = match claims.ext {
        Some(serde_json::Value::String(ids)) => Some(ids),
        _ => None,
    };
    if claims.exp.is_some_and(|exp| exp <= now) {
        return Identity::Expired(ids);
    }
    if claims.nbf.is_some_and(|nbf| nbf > now) {
        return Identity::Invalid("not valid yet");
    }
    match ids {
        Some(ids) => Identity::Valid(ids),
        None => Identity::Invalid("no identifiers (ext)"),
    }
}

/// An HS256 token carrying `identifiers`, valid until `exp` (for tests
/// and tools).
pub fn sign(secret: &str, identifiers: &str, exp: u64) -> String {
    let h = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let claims = serde_json::json!({ "ext": identifiers, "exp": exp });
    let p = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signing = format!("{h}.{p}");
    let sig = mac("HS256", secret.as_bytes(), signing.as_bytes()).expect("HS256");
    format!("{signing}.{}", URL_SAFE_NO_PAD.encode(sig))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        let t = sign("k", r#"{"user":"a"}"#, 2000);
        assert_eq!(
            identify("k", &t, 1000),
            Identity::Valid(r#"{"user":"a"}"#.into())
        );
        assert_eq!(
            identify("k", &t, 2000),
            Identity::Expired(Some(r#"{"user":"a"}"#.into()))
        );
        assert!(matches!(identify("other", &t, 1000), Identity::Invalid(_)));
        let mut bad = t.clone();
        bad.push('A');
        assert!(matches!(identify("k", &bad, 1000), Identity::Invalid(_)));
        assert!(matches!(identify("k", "a.b", 1000), Identity::Invalid(_)));
        assert!(matches!(identify("k", "", 1000), Identity::Invalid(_)));
        // "none" and asymmetric algorithms are refused.
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(br#"{"ext":"x"}"#)
        );
        assert!(matches!(identify("k", &none, 1000), Identity::Invalid(_)));
    }
}
