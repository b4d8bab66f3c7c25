//! The AppSync adapter's parsers of client input: a GraphQL request against
//! the generic pub/sub schema, an Events channel path, and the auth header
//! of a WebSocket upgrade. Besides "never panics": an accepted subscription
//! names a channel within the limit and selects something; an accepted
//! publish carries valid JSON data; an accepted channel path follows the
//! path rules.
#![no_main]

use herald_appsync::{auth, channel, graphql};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match mode % 3 {
        0 => {
            // query, NUL, variables as JSON
            let (query, vars) = text.split_once('\0').unwrap_or((text, "{}"));
            let req = graphql::Request {
                query: Some(query.to_owned()),
                variables: serde_json::from_str(vars).ok(),
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
        }
        1 => {
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
            let _ = auth::upgrade_key(&[format!("header-{text}")], None);
            let _ = auth::upgrade_key(&[], Some(text));
        }
    }
});
