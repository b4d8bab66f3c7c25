//! HTTP API request authentication: arbitrary method/path/query/body never
//! panic, a forged request is never accepted, and what `sign_query` signs
//! (with fuzzed extra parameters) is always accepted.
#![no_main]

use herald_pusher::auth::{authenticate, sign_query, SignedRequest};
use herald_core::broker::local::LocalBroker;
use herald_core::config::{AppConfig, Config};
use herald_core::node::Node;
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};

const SECRET: &str = "fuzz-secret";

fn node() -> &'static Arc<Node> {
    static NODE: OnceLock<Arc<Node>> = OnceLock::new();
    NODE.get_or_init(|| {
        let config = Config {
            apps: vec![AppConfig {
                id: "1".into(),
                key: "fuzz-key".into(),
                secret: SECRET.into(),
                ..AppConfig::default()
            }],
            ..Config::default()
        };
        Node::new(config, Arc::new(LocalBroker::new()))
    })
}

fuzz_target!(|data: &[u8]| {
    let node = node();
    let mut parts = data.splitn(4, |&b| b == 0);
    let (Some(head), Some(path), Some(query), body) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return;
    };
    let body = body.unwrap_or(&[]);
    let (Ok(path), Ok(query)) = (std::str::from_utf8(path), std::str::from_utf8(query)) else {
        return;
    };
    let method = if head.first().is_some_and(|b| b & 1 == 1) {
        "POST"
    } else {
        "GET"
    };
    let app_id = if head.get(1).is_some_and(|b| b & 1 == 1) {
        "nope"
    } else {
        "1"
    };

    // 1. Arbitrary input: never panics; never accepted without the secret
    //    (the fuzzer cannot compute an HMAC, so acceptance means a bug).
    let forged = authenticate(
        node,
        &SignedRequest {
            app_id,
            method,
            path,
            query,
            body,
        },
    );
    assert!(forged.is_err(), "accepted an unsigned request: {query:?}");

    // 2. The same path and body, signed properly with the fuzzed query's
    //    pairs as extra parameters (minus Pusher's own), are accepted.
    let extra: Vec<(String, String)> = herald_query_pairs(query)
        .into_iter()
        .filter(|(k, _)| {
            let k = k.to_ascii_lowercase();
            !k.starts_with("auth_") && k != "body_md5"
        })
        .collect();
    let extra_refs: Vec<(&str, &str)> = extra
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let signed = sign_query("fuzz-key", SECRET, method, path, body, &extra_refs);
    let ok = authenticate(
        node,
        &SignedRequest {
            app_id: "1",
            method,
            path,
            query: &signed,
            body,
        },
    );
    assert!(
        ok.is_ok(),
        "rejected a properly signed request: {signed:?}: {:?}",
        ok.err().map(|e| e.message)
    );
});

/// Decode a query string the way the server does.
fn herald_query_pairs(query: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect()
}
