//! Property tests over everything that parses untrusted input: client
//! frames, channel names, presence `channel_data`, the protocol version,
//! config TOML, client auth tokens and HTTP API request signatures.

use herald_core::broker::local::LocalBroker;
use herald_core::config::{AppConfig, Config};
use herald_core::node::Node;
use herald_pusher::auth::{authenticate, sign_query, SignedRequest};
use herald_pusher::names::{validate_name, validate_publish_name, NameError};
use herald_pusher::presence_data::{parse_channel_data, MemberLimits};
use herald_pusher::session::{check_version, ConnectParams};
use herald_pusher::signing;
use herald_pusher::wire::{parse, ClientMessage, ParseError};
use proptest::prelude::*;
use serde_json::{json, Value};
use std::sync::Arc;

const NAME_CHARS: &str = "[A-Za-z0-9_\\-=@,.;]";

fn valid_name(max: usize) -> impl Strategy<Value = String> {
    proptest::string::string_regex(&format!("{NAME_CHARS}{{1,{max}}}")).unwrap()
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_-=@,.;".contains(c)
}

/// Arbitrary JSON values, biased towards the keys and events Pusher uses.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        any::<String>().prop_map(Value::String),
        prop_oneof![
            Just("pusher:subscribe"),
            Just("pusher:unsubscribe"),
            Just("pusher:signin"),
            Just("pusher:ping"),
            Just("pusher:pong"),
            Just("client-x"),
            Just("private-a"),
            Just("presence-a"),
        ]
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        let key = prop_oneof![
            Just("event".to_string()),
            Just("channel".to_string()),
            Just("data".to_string()),
            Just("auth".to_string()),
            Just("channel_data".to_string()),
            Just("user_data".to_string()),
            any::<String>(),
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key, inner.clone(), 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            // Nested data as a JSON string, as pusher-js sends it.
            inner.prop_map(|v| Value::String(v.to_string())),
        ]
    })
}

/// A frame-shaped object: an envelope with an event and arbitrary parts.
fn frame_like() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            Just("pusher:subscribe".to_string()),
            Just("pusher:unsubscribe".to_string()),
            Just("pusher:signin".to_string()),
            Just("pusher:ping".to_string()),
            Just("client-typing".to_string()),
            any::<String>(),
        ],
        proptest::option::of(json_value()),
        proptest::option::of(json_value()),
    )
        .prop_map(|(event, channel, data)| {
            let mut m = serde_json::Map::new();
            m.insert("event".into(), Value::String(event));
            if let Some(c) = channel {
                m.insert("channel".into(), c);
            }
            if let Some(d) = data {
                m.insert("data".into(), d);
            }
            Value::Object(m)
        })
}

proptest! {
    // ----- client frames ---------------------------------------------------

    #[test]
    fn parse_never_panics_on_strings(s in any::<String>()) {
        let _ = parse(&s);
    }

    #[test]
    fn parse_never_panics_on_json(v in json_value()) {
        let _ = parse(&v.to_string());
    }

    #[test]
    fn parse_never_panics_on_frame_shapes(v in frame_like()) {
        let text = v.to_string();
        match parse(&text) {
            // Anything accepted had a recognised event.
            Ok(ClientMessage::ClientEvent { event, .. }) => prop_assert!(event.starts_with("client-")),
            Ok(_) => prop_assert!(v["event"].as_str().unwrap().starts_with("pusher:")),
            Err(ParseError::UnknownEvent(e)) => prop_assert!(e.chars().count() <= 64),
            Err(_) => {}
        }
    }

    #[test]
    fn subscribe_round_trips(
        channel in valid_name(164),
        auth in proptest::option::of(any::<String>()),
        channel_data in proptest::option::of(any::<String>()),
        as_string in any::<bool>(),
    ) {
        let mut d = json!({ "channel": channel });
        if let Some(a) = &auth { d["auth"] = json!(a); }
        if let Some(c) = &channel_data { d["channel_data"] = json!(c); }
        let data = if as_string { Value::String(d.to_string()) } else { d };
        let frame = json!({ "event": "pusher:subscribe", "data": data }).to_string();
        let expected = ClientMessage::Subscribe { channel, auth, channel_data };
        prop_assert_eq!(parse(&frame).unwrap(), expected);
    }

    #[test]
    fn unsubscribe_and_signin_round_trip(channel in any::<String>(), auth in any::<String>(), user in any::<String>()) {
        let f = json!({ "event": "pusher:unsubscribe", "data": { "channel": channel } }).to_string();
        prop_assert_eq!(parse(&f).unwrap(), ClientMessage::Unsubscribe { channel });
        let f = json!({ "event": "pusher:signin", "data": { "auth": auth, "user_data": user } }).to_string();
        prop_assert_eq!(parse(&f).unwrap(), ClientMessage::Signin { auth, user_data: user });
    }

    #[test]
    fn client_event_data_is_kept_byte_for_byte(
        suffix in "[a-z0-9_-]{0,20}",
        channel in valid_name(164),
        data in json_value(),
        pretty in any::<bool>(),
    ) {
        let event = format!("client-{suffix}");
        let raw = if pretty { serde_json::to_string_pretty(&data).unwrap() } else { data.to_string() };
        let frame = format!(
            r#"{{"event":{},"channel":{},"data":{raw}}}"#,
            json!(event), json!(channel)
        );
        match parse(&frame).unwrap() {
            ClientMessage::ClientEvent { event: e, channel: c, data: d } => {
                prop_assert_eq!(e, event);
                prop_assert_eq!(c, channel);
                prop_assert_eq!(d.get(), raw.as_str());
            }
            other => prop_assert!(false, "parsed as {:?}", other),
        }
    }

    // ----- channel names ---------------------------------------------------

    #[test]
    fn validate_name_accepts_exactly_the_charset_and_length(s in any::<String>(), max in 1usize..300) {
        let ok = !s.is_empty() && s.len() <= max && s.chars().all(is_name_char);
        prop_assert_eq!(validate_name(&s, max).is_ok(), ok, "{:?}", s);
    }

    #[test]
    fn validate_name_boundaries(name in valid_name(300), max in 1usize..300) {
        let r = validate_name(&name, max);
        if name.len() <= max {
            prop_assert_eq!(r, Ok(()));
        } else {
            prop_assert_eq!(r, Err(NameError::TooLong(max)));
        }
    }

    #[test]
    fn one_bad_character_is_refused(
        name in valid_name(100),
        bad in any::<char>().prop_filter("not a name char", |c| !is_name_char(*c)),
        at in any::<prop::sample::Index>(),
    ) {
        let mut chars: Vec<char> = name.chars().collect();
        let i = at.index(chars.len() + 1);
        chars.insert(i, bad);
        let s: String = chars.into_iter().collect();
        prop_assert_eq!(validate_name(&s, 1000), Err(NameError::BadCharacter));
    }

    #[test]
    fn publish_names_match_subscribe_names_outside_user_channels(s in any::<String>(), max in 1usize..300) {
        if let Some(user) = s.strip_prefix("#server-to-user-") {
            let r = validate_publish_name(&s, max);
            let ok = !user.is_empty()
                && s.len() <= max
                && !user.chars().any(|c| c.is_control() || c.is_whitespace());
            prop_assert_eq!(r.is_ok(), ok);
        } else {
            prop_assert_eq!(validate_publish_name(&s, max), validate_name(&s, max));
        }
    }

    // ----- presence channel_data -------------------------------------------

    #[test]
    fn channel_data_never_panics(s in any::<String>(), id in 1usize..200, info in 1usize..2000) {
        let _ = parse_channel_data(&s, &MemberLimits { max_user_id: id, max_user_info: info });
    }

    #[test]
    fn channel_data_never_panics_on_json(v in json_value(), id in 1usize..200, info in 1usize..2000) {
        let _ = parse_channel_data(&v.to_string(), &MemberLimits { max_user_id: id, max_user_info: info });
    }

    #[test]
    fn channel_data_enforces_limits(
        user_id in any::<String>(),
        info in proptest::option::of(json_value()),
        max_id in 1usize..64,
        max_info in 1usize..256,
    ) {
        let mut d = json!({ "user_id": user_id });
        if let Some(i) = &info { d["user_info"] = i.clone(); }
        // `"user_info": null` is the same as no user_info.
        let info = info.filter(|i| !i.is_null());
        let text = d.to_string();
        let limits = MemberLimits { max_user_id: max_id, max_user_info: max_info };
        let info_len = info.as_ref().map_or(0, |i| i.to_string().len());
        let should = !user_id.is_empty() && user_id.chars().count() <= max_id && info_len <= max_info;
        match parse_channel_data(&text, &limits) {
            Ok(m) => {
                prop_assert!(should, "accepted {}", text);
                prop_assert_eq!(&m.user_id, &user_id);
                prop_assert_eq!(m.user_info.map(|r| r.get().to_owned()), info.map(|i| i.to_string()));
            }
            Err(e) => prop_assert!(!should, "refused {}: {}", text, e),
        }
    }

    #[test]
    fn numeric_user_ids_become_strings(n in any::<i64>()) {
        let m = parse_channel_data(&format!(r#"{{"user_id":{n}}}"#), &MemberLimits { max_user_id: 128, max_user_info: 1024 }).unwrap();
        prop_assert_eq!(m.user_id, n.to_string());
    }

    // ----- protocol version, config --------------------------------------------

    #[test]
    fn check_version_accepts_only_5_to_7(v in proptest::option::of(any::<String>())) {
        // No version at all is taken as 7 (as Pusher and its peers do).
        let expected = match v.as_deref() {
            None => true,
            Some(s) => s.parse::<u32>().is_ok_and(|n| (5..=7).contains(&n)),
        };
        prop_assert_eq!(check_version(&ConnectParams { protocol: v }).is_ok(), expected);
    }

    #[test]
    fn config_toml_never_panics(s in any::<String>()) {
        if let Ok(c) = Config::from_toml(&s, "fuzz.toml") {
            let _ = c.validate();
        }
    }

    #[test]
    fn config_unknown_keys_are_named(key in "[a-z_]{3,20}") {
        let known = ["host", "port", "activity_timeout", "pong_timeout", "shutdown_grace",
            "max_request_size", "listen_backlog", "write_delay_ms", "log", "apps"];
        // The adapters' keys are known too: a key is refused once every
        // adapter has declined it (the last step of a load).
        let adapters = herald::adapters();
        let claimed = adapters.iter().any(|a| a.keys().top.contains(&key.as_str()));
        prop_assume!(!known.contains(&key.as_str()) && !claimed);
        let err = Config::from_toml(&format!("{key} = 1\n"), "x.toml")
            .and_then(|c| herald_core::adapter::check_config(&c, &adapters))
            .unwrap_err()
            .to_string();
        prop_assert!(err.contains(&key), "{}", err);
    }

    // ----- signatures --------------------------------------------------------

    #[test]
    fn channel_tokens_verify_and_mutations_fail(
        sid in "[0-9]{1,10}\\.[0-9]{1,10}",
        channel in valid_name(164),
        data in proptest::option::of(any::<String>()),
        flip in any::<prop::sample::Index>(),
    ) {
        let msg = signing::channel_string(&sid, &channel, data.as_deref());
        let token = signing::token("key", "secret", &msg);
        prop_assert!(signing::verify_token("key", "secret", &token, &msg));
        prop_assert!(!signing::verify_token("key", "other", &token, &msg));
        prop_assert!(!signing::verify_token("key", "secret", &token, &(msg.clone() + "x")));
        // Change one hex digit of the signature to a different digit.
        let (k, sig) = token.split_once(':').unwrap();
        let mut sig: Vec<u8> = sig.bytes().collect();
        let i = flip.index(sig.len());
        let d = (sig[i] as char).to_digit(16).unwrap();
        sig[i] = char::from_digit((d + 1) % 16, 16).unwrap() as u8;
        let bad = format!("{k}:{}", String::from_utf8(sig).unwrap());
        prop_assert!(!signing::verify_token("key", "secret", &bad, &msg));
    }
}

// ----- HTTP API request signatures ---------------------------------------------

fn api_node() -> Arc<Node> {
    let config = Config {
        apps: vec![AppConfig {
            id: "1".into(),
            key: "key".into(),
            secret: "secret".into(),
            ..AppConfig::default()
        }],
        ..Config::default()
    };
    Node::new(config, Arc::new(LocalBroker::new()))
}

fn verify(node: &Node, method: &str, path: &str, query: &str, body: &[u8]) -> Result<(), u16> {
    authenticate(
        node,
        &SignedRequest {
            app_id: "1",
            method,
            path,
            query,
            body,
        },
    )
    .map(|_| ())
    .map_err(|e| e.status)
}

/// Extra query parameters that are not Pusher's own auth parameters.
fn extra_params() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec(
        (
            "[a-z][a-z_]{0,9}".prop_filter("not an auth param", |k| {
                !k.starts_with("auth_") && k != "body_md5"
            }),
            any::<String>(),
        ),
        0..4,
    )
}

#[derive(Debug, Clone)]
enum Mutation {
    Method,
    Path,
    Body,
    /// Change the value of the query parameter at this index.
    Value(prop::sample::Index),
    /// Drop the query parameter at this index.
    Drop(prop::sample::Index),
    /// Add a parameter that was not signed.
    Add,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        Just(Mutation::Method),
        Just(Mutation::Path),
        Just(Mutation::Body),
        any::<prop::sample::Index>().prop_map(Mutation::Value),
        any::<prop::sample::Index>().prop_map(Mutation::Drop),
        Just(Mutation::Add),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn api_signatures_verify_and_any_mutation_fails(
        post in any::<bool>(),
        path_tail in "[a-z0-9_/-]{0,30}",
        body in prop::collection::vec(any::<u8>(), 0..64),
        extra in extra_params(),
        m in mutation(),
    ) {
        let node = api_node();
        let method = if post { "POST" } else { "GET" };
        let path = format!("/apps/1/{path_tail}");
        let extra_refs: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let query = sign_query("key", "secret", method, &path, &body, &extra_refs);
        prop_assert_eq!(verify(&node, method, &path, &query, &body), Ok(()));

        let mut params: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        let (mut method, mut path, mut body) = (method.to_string(), path, body);
        match m {
            Mutation::Method => method = if post { "GET".into() } else { "POST".into() },
            Mutation::Path => path.push('x'),
            Mutation::Body => body.push(b'!'),
            Mutation::Value(i) => {
                let i = i.index(params.len());
                let v = &mut params[i].1;
                // A different value that still parses where a number is expected.
                if let Ok(n) = v.parse::<u64>() { *v = (n + 1).to_string() } else { v.push('0') }
            }
            Mutation::Drop(i) => {
                let i = i.index(params.len());
                // Dropping body_md5 of an empty body changes nothing signed... it is
                // only present for non-empty bodies, so every param here is signed.
                params.remove(i);
            }
            Mutation::Add => params.push(("unsigned".into(), "1".into())),
        }
        let mutated = form_urlencoded::Serializer::new(String::new()).extend_pairs(&params).finish();
        let r = verify(&node, &method, &path, &mutated, &body);
        prop_assert_eq!(r, Err(401), "mutation {:?} accepted", m);
    }
}

#[test]
fn api_signature_of_pusher_docs_example() {
    // From Pusher's HTTP API reference ("Generating authentication signatures").
    let s = signing::api_string(
        "POST",
        "/apps/3/events",
        &[
            ("auth_key".into(), "278d425bdf160c739803".into()),
            ("auth_timestamp".into(), "1353088179".into()),
            ("auth_version".into(), "1.0".into()),
            ("body_md5".into(), "ec365a775a4cd0599faeb73354201b6f".into()),
        ],
    );
    assert_eq!(
        signing::sign("7ad3773142a6692b25b8", &s),
        "da454824c97ba181a32ccc17a72625ba02771f50b50e1e7430e47a1f3f457e6c"
    );
}
