//! AppSync's `AWS_LAMBDA` mode, with the function behind an HTTP URL: for
//! a token in the `Authorization` header Herald POSTs the request AppSync
//! gives a Lambda authorizer (`authorizationToken`, `requestContext` with
//! the operation and channel, `requestHeaders`) and honours the answer's
//! `isAuthorized`, `ttlOverride` and context (`handlerContext`, or
//! `resolverContext` as the GraphQL API names it).
//!
//! Bounded: each call by `timeout_ms`, the calls in flight by
//! [`MAX_IN_FLIGHT`], the answer by [`MAX_ANSWER_BYTES`], the cache by
//! [`MAX_CACHED`] entries. An authorizer that fails, answers badly or is
//! unreachable refuses (never allows), and is counted.

use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const MAX_IN_FLIGHT: usize = 64;
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;
pub const MAX_CACHED: usize = 10_000;
/// Longest cache time an answer may ask for (AppSync's limit).
pub const MAX_TTL: u64 = 3600;

#[derive(Debug)]
pub struct Lambda {
    pub url: String,
    pub ttl: u64,
    pub timeout: Duration,
    /// Tokens not matching it are refused without a call.
    pub validation: Option<regex::Regex>,
    client: reqwest::Client,
    slots: tokio::sync::Semaphore,
    cache: Mutex<HashMap<String, (Answer, Instant)>>,
}

/// What the authorizer said.
#[derive(Debug, Clone)]
pub struct Answer {
    pub authorized: bool,
    pub context: Value,
}

/// Where the request comes from (AppSync's `requestContext`).
pub struct Context<'a> {
    pub api_id: &'a str,
    /// `EVENT_CONNECT`, `EVENT_SUBSCRIBE`, `EVENT_PUBLISH`.
    pub operation: &'a str,
    pub namespace: Option<&'a str>,
    pub channel: Option<&'a str>,
}

impl Lambda {
    pub fn new(
        url: String,
        ttl: u64,
        timeout: Duration,
        validation: Option<regex::Regex>,
    ) -> Lambda {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Lambda {
            url,
            ttl,
            timeout,
            validation,
            client,
            slots: tokio::sync::Semaphore::new(MAX_IN_FLIGHT),
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn cache_key(token: &str, cx: &Context<'_>) -> String {
        // Per token, and per operation and channel: the authorizer sees
        // both and may answer differently for each. Hashed, so an entry is
        // small whatever the token's size.
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for part in [cx.operation, cx.channel.unwrap_or(""), token] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        hex::encode(h.finalize())
    }

    fn cached(&self, key: &str) -> Option<Answer> {
        let mut cache = self.cache.lock().ok()?;
        match cache.get(key) {
            Some((a, until)) if Instant::now() < *until => Some(a.clone()),
            Some(_) => {
                cache.remove(key);
                None
            }
            None => None,
        }
    }

    fn remember(&self, key: String, answer: &Answer, ttl: u64) {
        if ttl == 0 {
            return;
        }
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= MAX_CACHED {
                let now = Instant::now();
                cache.retain(|_, (_, until)| *until > now);
                if cache.len() >= MAX_CACHED {
                    return;
                }
            }
            cache.insert(
                key,
                (answer.clone(), Instant::now() + Duration::from_secs(ttl)),
            );
        }
    }

    /// Ask the authorizer about `token` (from cache when it allows).
    pub async fn authorize(
        &self,
        token: &str,
        cx: &Context<'_>,
        headers: &Map<String, Value>,
    ) -> Result<Answer, String> {
        if token.is_empty() || token.len() > crate::auth_jwt::MAX_TOKEN {
            return Err("Missing or oversized authorization token".into());
        }
        if let Some(re) = &self.validation {
            if !re.is_match(token) {
                return Err("Token does not match identity_validation_expression".into());
            }
        }
        let key = Self::cache_key(token, cx);
        if let Some(a) = self.cached(&key) {
            return Ok(a);
        }
        let request_headers: Map<String, Value> = headers
            .iter()
            .filter(|(k, _)| !k.eq_ignore_ascii_case("authorization"))
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .collect();
        let body = json!({
            "authorizationToken": token,
            "requestContext": {
                "apiId": cx.api_id,
                "accountId": "",
                "requestId": crate::session::uuid(),
                "operation": cx.operation,
                "channelNamespaceName": cx.namespace,
                "channel": cx.channel,
            },
            "requestHeaders": request_headers,
        });
        let call = async {
            let _slot = self
                .slots
                .acquire()
                .await
                .map_err(|_| "authorizer closed".to_owned())?;
            let mut res = self
                .client
                .post(&self.url)
                .json(&body)
                .send()
                .await
                .map_err(|e| format!("authorizer unreachable: {e}"))?;
            if !res.status().is_success() {
                return Err(format!("authorizer answered HTTP {}", res.status()));
            }
            let mut bytes = Vec::new();
            while let Some(chunk) = res.chunk().await.map_err(|e| format!("authorizer: {e}"))? {
                if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
                    return Err(format!(
                        "authorizer answer is over {MAX_ANSWER_BYTES} bytes"
                    ));
                }
                bytes.extend_from_slice(&chunk);
            }
            serde_json::from_slice::<Map<String, Value>>(&bytes)
                .map_err(|e| format!("authorizer answer is not a JSON object: {e}"))
        };
        let answer = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => {
                crate::auth_modes::count_failure();
                return Err(e);
            }
            Err(_) => {
                crate::auth_modes::count_failure();
                return Err("authorizer timed out".into());
            }
        };
        let authorized = answer.get("isAuthorized").and_then(Value::as_bool) == Some(true);
        let context = answer
            .get("handlerContext")
            .or_else(|| answer.get("resolverContext"))
            .cloned()
            .unwrap_or(Value::Null);
        let ttl = answer
            .get("ttlOverride")
            .and_then(Value::as_u64)
            .unwrap_or(self.ttl)
            .min(MAX_TTL);
        let a = Answer {
            authorized,
            context,
        };
        self.remember(key, &a, ttl);
        Ok(a)
    }
}
