//! JSON Web Tokens as AppSync's `OPENID_CONNECT` and
//! `AMAZON_COGNITO_USER_POOLS` modes take them: the token in the
//! `Authorization` header, signed with RS256 or ES256 by a key of the
//! issuer's JWKS, its `iss`, audience and times checked.
//!
//! The JWKS comes from a URL (fetched at first use, kept for `jwks_ttl`,
//! fetched again at once for a token whose `kid` it lacks, at most once per
//! [`REFETCH_EVERY`]) or from a file (read at start and again, as rarely,
//! for an unknown `kid`). Every fetch is bounded in time, in bytes and in
//! keys kept; one fetch runs at a time per provider and the others keep
//! verifying with the keys they have. Signatures are checked with `ring`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{Map, Value};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Largest token accepted (bytes): far above what identity providers issue.
pub const MAX_TOKEN: usize = 16 * 1024;
/// Largest JWKS document read (bytes).
pub const MAX_JWKS_BYTES: usize = 256 * 1024;
/// Most keys kept from one JWKS (the rest are ignored, and logged).
pub const MAX_KEYS: usize = 64;
/// Fewest seconds between two fetches for unknown `kid`s.
pub const REFETCH_EVERY: Duration = Duration::from_secs(30);
/// Fewest seconds between two fetches while no key could be had at all.
pub const NO_KEYS_RETRY: Duration = Duration::from_secs(2);

/// Why a token was refused (the message the client gets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

fn refused(m: impl Into<String>) -> Refused {
    Refused(m.into())
}

/// A verification key from a JWKS.
#[derive(Debug, Clone)]
enum Key {
    /// RSA modulus and exponent (big-endian bytes).
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// An uncompressed P-256 point (0x04 || x || y).
    P256(Vec<u8>),
}

#[derive(Debug, Clone)]
struct Jwk {
    kid: Option<String>,
    key: Key,
}

/// Parse a JWKS document: its RSA (`RS256`) and P-256 (`ES256`) signing
/// keys, at most [`MAX_KEYS`]; others are skipped.
fn parse_jwks(bytes: &[u8]) -> Result<Vec<Jwk>, String> {
    let doc: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let keys = doc
        .get("keys")
        .and_then(Value::as_array)
        .ok_or("no `keys` array")?;
    let b64 = |v: Option<&Value>| -> Option<Vec<u8>> {
        URL_SAFE_NO_PAD
            .decode(v?.as_str()?.trim_end_matches('='))
            .ok()
    };
    let mut out = Vec::new();
    for k in keys {
        if out.len() == MAX_KEYS {
            tracing::warn!(
                total = keys.len(),
                kept = MAX_KEYS,
                "JWKS has more keys than Herald keeps"
            );
            break;
        }
        if k.get("use")
            .and_then(Value::as_str)
            .is_some_and(|u| u != "sig")
        {
            continue;
        }
        let kid = k.get("kid").and_then(Value::as_str).map(str::to_owned);
        let key = match k.get("kty").and_then(Value::as_str) {
            Some("RSA") => match (b64(k.get("n")), b64(k.get("e"))) {
                (Some(n), Some(e)) if n.len() >= 256 && n.len() <= 1024 => Key::Rsa { n, e },
                _ => continue,
            },
            Some("EC") if k.get("crv").and_then(Value::as_str) == Some("P-256") => {
                match (b64(k.get("x")), b64(k.get("y"))) {
                    (Some(x), Some(y)) if x.len() == 32 && y.len() == 32 => {
                        let mut p = Vec::with_capacity(65);
                        p.push(4);
                        p.extend_from_slice(&x);
                        p.extend_from_slice(&y);
                        Key::P256(p)
                    }
                    _ => continue,
                }
            }
            _ => continue,
        };
        out.push(Jwk { kid, key });
    }
    Ok(out)
}

/// Where a provider's keys come from.
#[derive(Debug, Clone)]
pub enum Source {
    Url(String),
    /// The OIDC discovery document (`{issuer}/.well-known/openid-configuration`),
    /// whose `jwks_uri` names the JWKS.
    Discovery(String),
    File(String),
}

/// A provider's keys, cached.
#[derive(Debug)]
pub struct Jwks {
    source: Source,
    ttl: Duration,
    timeout: Duration,
    client: reqwest::Client,
    keys: RwLock<Option<(Arc<Vec<Jwk>>, Instant)>>,
    /// Held while one fetch runs; when the last one started, and the
    /// last one for an unknown `kid`.
    fetching: tokio::sync::Mutex<(Option<Instant>, Option<Instant>)>,
}

impl Jwks {
    pub fn new(source: Source, ttl: Duration, timeout: Duration) -> Jwks {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::limited(3))
            .build()
            .unwrap_or_default();
        let jwks = Jwks {
            source,
            ttl,
            timeout,
            client,
            keys: RwLock::new(None),
            fetching: tokio::sync::Mutex::new((None, None)),
        };
        if let Source::File(path) = &jwks.source {
            match std::fs::read(path)
                .map_err(|e| e.to_string())
                .and_then(|b| parse_jwks(&b))
            {
                Ok(keys) => jwks.store(keys),
                Err(e) => tracing::error!(path, error = %e, "JWKS file unreadable"),
            }
        }
        jwks
    }

    /// Check a JWKS file at start (an unreadable one is a config error).
    pub fn check_file(path: &str) -> Result<usize, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
        let keys = parse_jwks(&bytes)?;
        if keys.is_empty() {
            return Err("no RS256 or ES256 signing key in it".into());
        }
        Ok(keys.len())
    }

    fn store(&self, keys: Vec<Jwk>) {
        if let Ok(mut k) = self.keys.write() {
            *k = Some((Arc::new(keys), Instant::now()));
        }
    }

    fn cached(&self) -> Option<(Arc<Vec<Jwk>>, Instant)> {
        self.keys.read().ok().and_then(|k| k.clone())
    }

    async fn get_bounded(&self, url: &str) -> Result<Vec<u8>, String> {
        let mut res = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        if !res.status().is_success() {
            return Err(format!("{url}: HTTP {}", res.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = res.chunk().await.map_err(|e| format!("{url}: {e}"))? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(format!("{url}: larger than {MAX_JWKS_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    async fn fetch(&self) -> Result<Vec<Jwk>, String> {
        let work = async {
            match &self.source {
                Source::File(path) => {
                    let b = tokio::fs::read(path).await.map_err(|e| e.to_string())?;
                    parse_jwks(&b)
                }
                Source::Url(url) => parse_jwks(&self.get_bounded(url).await?),
                Source::Discovery(url) => {
                    let doc: Value = serde_json::from_slice(&self.get_bounded(url).await?)
                        .map_err(|e| format!("{url}: not JSON: {e}"))?;
                    let jwks = doc
                        .get("jwks_uri")
                        .and_then(Value::as_str)
                        .ok_or_else(|| format!("{url}: no jwks_uri"))?
                        .to_owned();
                    parse_jwks(&self.get_bounded(&jwks).await?)
                }
            }
        };
        // The client's timeout bounds each request; this bounds them all.
        tokio::time::timeout(self.timeout * 2, work)
            .await
            .map_err(|_| "JWKS fetch timed out".to_owned())?
    }

    /// Fetch again, unless another caller just did (or is doing it: then
    /// wait for it, bounded by the fetch's own timeout). An unknown `kid`
    /// fetches at most once per [`REFETCH_EVERY`]; an expired or missing
    /// cache at most once per [`NO_KEYS_RETRY`].
    async fn refresh(&self, unknown_kid: bool) {
        let mut last = self.fetching.lock().await;
        let (any, unknown) = &mut *last;
        if unknown_kid {
            if unknown.is_some_and(|at| at.elapsed() < REFETCH_EVERY) {
                return;
            }
            *unknown = Some(Instant::now());
        } else {
            // Fresh keys (another caller just fetched them), or a fetch
            // tried within NO_KEYS_RETRY: a JWKS that is down is not asked
            // again for each token (stale keys, if any, keep serving).
            match self.cached() {
                Some((_, got)) if got.elapsed() < self.ttl => return,
                _ if any.is_some_and(|at| at.elapsed() < NO_KEYS_RETRY) => return,
                _ => {}
            }
        }
        *any = Some(Instant::now());
        match self.fetch().await {
            Ok(keys) => self.store(keys),
            Err(e) => {
                crate::auth_modes::count_failure();
                tracing::warn!(error = %e, "JWKS fetch failed");
            }
        }
    }

    /// The keys that may have signed a token with `kid`.
    async fn keys_for(&self, kid: Option<&str>) -> Vec<Jwk> {
        let pick = |keys: &[Jwk]| -> Vec<Jwk> {
            keys.iter()
                .filter(|k| kid.is_none() || k.kid.as_deref() == kid)
                .cloned()
                .collect()
        };
        match self.cached() {
            Some((keys, at))
                if at.elapsed() < self.ttl || matches!(self.source, Source::File(_)) =>
            {
                let found = pick(&keys);
                if !found.is_empty() {
                    return found;
                }
                self.refresh(true).await;
            }
            _ => self.refresh(false).await,
        }
        self.cached().map(|(k, _)| pick(&k)).unwrap_or_default()
    }
}

/// What a verified token says.
#[derive(Debug, Clone)]
pub struct Verified {
    pub claims: Map<String, Value>,
}

impl Verified {
    pub fn str(&self, name: &str) -> Option<&str> {
        self.claims.get(name).and_then(Value::as_str)
    }

    /// Cognito's groups (`cognito:groups`).
    pub fn groups(&self) -> Vec<&str> {
        self.claims
            .get("cognito:groups")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    }

    /// Whether `aud` (a string or a list), `client_id` or `azp` names `id`.
    pub fn names_client(&self, id: &str) -> bool {
        let aud = match self.claims.get("aud") {
            Some(Value::String(s)) => s == id,
            Some(Value::Array(a)) => a.iter().any(|v| v.as_str() == Some(id)),
            _ => false,
        };
        aud || self.str("client_id") == Some(id) || self.str("azp") == Some(id)
    }
}

/// The checks of one provider's tokens.
#[derive(Debug)]
pub struct Verifier {
    pub issuer: String,
    pub jwks: Jwks,
    pub skew: u64,
    /// Most seconds since `iat` (AppSync's `iatTTL`; 0: any).
    pub iat_ttl: u64,
    /// Most seconds since `auth_time` (AppSync's `authTTL`; 0: any).
    pub auth_ttl: u64,
}

/// The bearer token in an `Authorization` value.
pub fn token_of(value: &str) -> &str {
    let v = value.trim();
    v.strip_prefix("Bearer ")
        .or_else(|| v.strip_prefix("bearer "))
        .unwrap_or(v)
        .trim()
}

/// The `iss` of a token without checking anything (to pick its provider).
pub fn peek_issuer(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload).ok()?;
    let claims: Map<String, Value> = serde_json::from_slice(&bytes).ok()?;
    claims.get("iss")?.as_str().map(str::to_owned)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn num(claims: &Map<String, Value>, name: &str) -> Result<Option<u64>, Refused> {
    match claims.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(|f| Some(f as u64))
            .ok_or_else(|| refused(format!("Token claim `{name}` is not a number"))),
    }
}

impl Verifier {
    /// Verify `token`: its form, algorithm, signature, issuer and times.
    pub async fn verify(&self, token: &str) -> Result<Verified, Refused> {
        if token.len() > MAX_TOKEN {
            return Err(refused("Token is too large"));
        }
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(refused("Token is not a JWT"));
        };
        let header: Map<String, Value> = URL_SAFE_NO_PAD
            .decode(h)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| refused("Token header is not base64url JSON"))?;
        let alg = header.get("alg").and_then(Value::as_str).unwrap_or("");
        if alg != "RS256" && alg != "ES256" {
            return Err(refused(format!(
                "Token algorithm {alg:?} is not accepted (RS256 or ES256)"
            )));
        }
        let claims: Map<String, Value> = URL_SAFE_NO_PAD
            .decode(p)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| refused("Token payload is not base64url JSON"))?;
        let sig = URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| refused("Token signature is not base64url"))?;
        let signed = &token.as_bytes()[..h.len() + 1 + p.len()];
        let kid = header.get("kid").and_then(Value::as_str);
        let keys = self.jwks.keys_for(kid).await;
        if keys.is_empty() {
            return Err(refused("Token is signed by an unknown key"));
        }
        let ok = keys.iter().any(|k| match (&k.key, alg) {
            (Key::Rsa { n, e }, "RS256") => ring::signature::RsaPublicKeyComponents { n, e }
                .verify(&ring::signature::RSA_PKCS1_2048_8192_SHA256, signed, &sig)
                .is_ok(),
            (Key::P256(point), "ES256") => ring::signature::UnparsedPublicKey::new(
                &ring::signature::ECDSA_P256_SHA256_FIXED,
                point,
            )
            .verify(signed, &sig)
            .is_ok(),
            _ => false,
        });
        if !ok {
            return Err(refused("Token signature is invalid"));
        }
        if claims.get("iss").and_then(Value::as_str) != Some(self.issuer.as_str()) {
            return Err(refused("Token issuer is not accepted"));
        }
        let now = now_secs();
        let exp = num(&claims, "exp")?.ok_or_else(|| refused("Token has no expiry"))?;
        if now > exp.saturating_add(self.skew) {
            return Err(refused("Token has expired."));
        }
        if let Some(nbf) = num(&claims, "nbf")? {
            if nbf > now.saturating_add(self.skew) {
                return Err(refused("Token is not valid yet"));
            }
        }
        if let Some(iat) = num(&claims, "iat")? {
            if iat > now.saturating_add(self.skew) {
                return Err(refused("Token is issued in the future"));
            }
            if self.iat_ttl > 0 && now > iat.saturating_add(self.iat_ttl) {
                return Err(refused("Token is older than iat_ttl"));
            }
        } else if self.iat_ttl > 0 {
            return Err(refused("Token has no iat"));
        }
        if self.auth_ttl > 0 {
            let at = num(&claims, "auth_time")?.ok_or_else(|| refused("Token has no auth_time"))?;
            if now > at.saturating_add(self.auth_ttl) {
                return Err(refused("Token authentication is older than auth_ttl"));
            }
        }
        Ok(Verified { claims })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwks_keeps_signing_keys_within_bounds() {
        let n = URL_SAFE_NO_PAD.encode([0xABu8; 256]);
        let x = URL_SAFE_NO_PAD.encode([1u8; 32]);
        let mut keys = vec![
            serde_json::json!({"kty":"RSA","kid":"r","n":n,"e":"AQAB"}),
            serde_json::json!({"kty":"EC","crv":"P-256","kid":"e","x":x,"y":x}),
            serde_json::json!({"kty":"EC","crv":"P-384","kid":"no","x":x,"y":x}),
            serde_json::json!({"kty":"RSA","kid":"enc","use":"enc","n":n,"e":"AQAB"}),
            serde_json::json!({"kty":"oct","k":"AAAA"}),
        ];
        let doc = serde_json::json!({ "keys": keys }).to_string();
        let got = parse_jwks(doc.as_bytes()).unwrap();
        assert_eq!(
            got.iter()
                .map(|k| k.kid.clone().unwrap())
                .collect::<Vec<_>>(),
            ["r", "e"]
        );
        keys = (0..5000)
            .map(|i| serde_json::json!({"kty":"RSA","kid":i.to_string(),"n":n,"e":"AQAB"}))
            .collect();
        let doc = serde_json::json!({ "keys": keys }).to_string();
        assert_eq!(parse_jwks(doc.as_bytes()).unwrap().len(), MAX_KEYS);
        assert!(parse_jwks(b"[]").is_err());
    }

    #[test]
    fn bearer_and_issuer() {
        assert_eq!(token_of("Bearer a.b.c"), "a.b.c");
        assert_eq!(token_of(" a.b.c "), "a.b.c");
        let p = URL_SAFE_NO_PAD.encode(r#"{"iss":"https://i"}"#);
        assert_eq!(
            peek_issuer(&format!("x.{p}.y")).as_deref(),
            Some("https://i")
        );
        assert_eq!(peek_issuer("nope"), None);
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn parsing_never_panics(s in ".{0,300}", b in proptest::collection::vec(any::<u8>(), 0..300)) {
                let _ = parse_jwks(&b);
                let _ = parse_jwks(s.as_bytes());
                let _ = peek_issuer(&s);
                let _ = token_of(&s);
                let _ = crate::auth_iam::region_of_host(&s);
            }
        }
    }

    #[tokio::test]
    async fn alg_none_and_garbage_are_refused_before_any_key() {
        let v = Verifier {
            issuer: "https://i".into(),
            jwks: Jwks::new(
                Source::Url("http://127.0.0.1:9/jwks".into()),
                Duration::from_secs(60),
                Duration::from_millis(200),
            ),
            skew: 0,
            iat_ttl: 0,
            auth_ttl: 0,
        };
        let h = URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#);
        let p = URL_SAFE_NO_PAD.encode(r#"{"iss":"https://i","exp":9999999999}"#);
        let e = v.verify(&format!("{h}.{p}.")).await.unwrap_err();
        assert!(e.0.contains("\"none\""), "{e:?}");
        let h = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256"}"#);
        assert!(v.verify(&format!("{h}.{p}.c2ln")).await.is_err());
        assert!(v.verify("a.b").await.is_err());
        assert!(v.verify(&"a".repeat(MAX_TOKEN + 1)).await.is_err());
        // An unreachable JWKS: refused, never allowed.
        let h = URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","kid":"k"}"#);
        let e = v.verify(&format!("{h}.{p}.c2ln")).await.unwrap_err();
        assert!(e.0.contains("unknown key"), "{e:?}");
    }
}
