//! The AppSync adapter's parsers of client input: a GraphQL request against
//! the generic pub/sub schema, an Events channel path, and the auth header
//! of a WebSocket upgrade. Besides "never panics": an accepted subscription
//! names a channel within the limit and selects something; an accepted
//! publish carries valid JSON data; an accepted channel path follows the
//! path rules.
//!
//! Mode 3 builds deep documents from short inputs (a template repeated up to
//! 4,095 times), which byte-level mutation of a 4 KiB input rarely reaches.
//! Every GraphQL parse runs on a thread with a 1 MiB stack, half a tokio
//! worker's, so a recursion that nesting can drive overflows here (and the
//! fuzzer reports the crash) before it could in the server.
#![no_main]

use herald_appsync::{auth, channel, graphql};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => {
            // query, NUL, variables as JSON
            let Ok(text) = std::str::from_utf8(rest) else {
                return;
            };
            let (query, vars) = text.split_once('\0').unwrap_or((text, "{}"));
            check_graphql(query.to_owned(), vars.to_owned());
        }
        3 => {
            // 2 bytes of count, then head NUL open NUL middle NUL tail: the
            // query is head + open×n + middle + (open mirrored)×n + tail.
            let [hi, lo, template @ ..] = rest else {
                return;
            };
            let n = usize::from(u16::from_be_bytes([*hi, *lo]) & 0x0fff);
            let Ok(text) = std::str::from_utf8(template) else {
                return;
            };
            let mut parts = text.splitn(4, '\0');
            let mut part = || parts.next().unwrap_or("");
            let (head, open, middle, tail) = (part(), part(), part(), part());
            let close: String = open.chars().rev().map(mirror).collect();
            let query = format!("{head}{}{middle}{}{tail}", open.repeat(n), close.repeat(n));
            check_graphql(query, "{}".to_owned());
        }
        1 => {
            let Ok(text) = std::str::from_utf8(rest) else {
                return;
            };
            for c in [channel::parse_subscribe(text), channel::parse_publish(text)]
                .into_iter()
                .flatten()
            {
                assert!(c.name.starts_with('/'));
                let segments = c.name[1..].trim_end_matches('/').split('/').count();
                assert!(segments + usize::from(c.wildcard) <= channel::MAX_SEGMENTS);
            }
        }
        _ => {
            let Ok(text) = std::str::from_utf8(rest) else {
                return;
            };
            let _ = auth::upgrade_key(&[format!("header-{text}")], None);
            let _ = auth::upgrade_key(&[], Some(text));
        }
    }
});

/// The closing bracket of an opening one (anything else stays).
fn mirror(c: char) -> char {
    match c {
        '[' => ']',
        '{' => '}',
        '(' => ')',
        other => other,
    }
}

/// Parse on a small stack and check what an accepted operation carries.
fn check_graphql(query: String, vars: String) {
    std::thread::Builder::new()
        .stack_size(1024 * 1024)
        .spawn(move || {
            let req = graphql::Request {
                query: Some(query),
                variables: serde_json::from_str(&vars).ok(),
                operation_name: None,
            };
            match graphql::parse(&req) {
                Ok(graphql::Operation::Subscribe(s)) => {
                    assert!(s.name.len() <= graphql::MAX_NAME_BYTES);
                    assert!(!s.fields.is_empty());
                }
                Ok(graphql::Operation::Mutation(fields)) => {
                    for f in fields {
                        if let graphql::RootField::Publish { data, .. } = f {
                            assert!(serde_json::from_str::<serde_json::Value>(&data).is_ok());
                        }
                    }
                }
                _ => {}
            }
        })
        .expect("spawn the parser's thread")
        .join()
        .expect("the parser panicked");
}
