//! Property tests over the HTTP API's request-body parsing and validation
//! (`POST events`, `POST batch_events`). The bodies go through herald's own
//! router in-process (no socket), properly signed, to an app whose limits
//! are drawn per case:
//!
//! - arbitrary bytes never panic and are answered 200, 400 or 413, errors
//!   as `{"error": "..."}`;
//! - generated events agree with a reference model of the documented rules
//!   (docs/protocol.md): a valid body is accepted, an invalid one is refused
//!   with the status of one of its faults;
//! - a refused body publishes nothing (a batch with one bad item included),
//!   an accepted one reaches a subscriber once per channel, except the
//!   socket named by `socket_id`.
//!
//! Driving `herald::server::router` covers `api::parse_event`/`parse_batch`
//! and the handlers around them (signature, reply shape, what gets
//! published); the `api_body` fuzz target drives the parsers directly.

use axum::body::Body;
use axum::http::Request;
use herald_core::broker::local::LocalBroker;
use herald_core::config::{AppConfig, Config};
use herald_core::connection::{Connection, QueueLimit};
use herald_core::hub::SubscribeOptions;
use herald_core::node::Node;
use herald_pusher::auth::sign_query;
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use tower::ServiceExt;

const KEY: &str = "prop-key";
const SECRET: &str = "prop-secret";
/// Channels a listener is subscribed to (all valid for every drawn limit).
const POOL: [&str; 4] = ["a", "b", "c-d", "cache-x"];
/// The listener's socket id.
const LISTENER: &str = "1.1";

#[derive(Debug, Clone, Copy)]
struct Limits {
    event_name: usize,
    payload: usize,
    channel_name: usize,
    subscription_count: bool,
}

/// A node with one app, its router, and a listener subscribed to [`POOL`].
struct Harness {
    rt: tokio::runtime::Runtime,
    router: axum::Router,
    node: Arc<Node>,
    listener: Arc<Connection>,
}

impl Harness {
    fn new(l: Limits) -> Harness {
        let config = Config {
            apps: vec![AppConfig {
                id: "1".into(),
                key: KEY.into(),
                secret: SECRET.into(),
                max_event_name: l.event_name,
                max_payload: l.payload,
                max_channel_name: l.channel_name,
                subscription_count: l.subscription_count,
                ..AppConfig::default()
            }],
            ..Config::default()
        };
        // Node 1, so the listener's socket id "1.1" is connection 1 of it.
        let node = Node::with_id(config, Arc::new(LocalBroker::new()), 1);
        let hub = node.hub_by_id("1").unwrap().clone();
        let conn = Arc::new(Connection::new(
            1,
            LISTENER.into(),
            &herald_pusher::wire::WIRE,
            QueueLimit {
                frames: 4096,
                bytes: 16 << 20,
            },
        ));
        for c in POOL {
            let opts = SubscribeOptions {
                cache: herald_pusher::names::ChannelKind::of(c).cache,
                ..SubscribeOptions::default()
            };
            assert!(
                hub.subscribe(&conn, herald_pusher::names::NAMESPACE, c, opts)
                    .unwrap()
                    .new
            );
        }
        // Drop the confirmations (and the cache channel's cache_miss).
        conn.take(&mut Vec::new(), usize::MAX);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Harness {
            rt,
            router: herald::server::router(node.clone()),
            node,
            listener: conn,
        }
    }

    /// POST `body` to `/apps/1/{endpoint}`, signed; status and reply.
    fn post(&self, endpoint: &str, body: &[u8]) -> (u16, Value) {
        let path = format!("/apps/1/{endpoint}");
        let query = sign_query(KEY, SECRET, "POST", &path, body, &[]);
        let req = Request::post(format!("{path}?{query}"))
            .header("content-type", "application/json")
            .body(Body::from(body.to_vec()))
            .unwrap();
        self.rt.block_on(async {
            let resp = self.router.clone().oneshot(req).await.unwrap();
            let status = resp.status().as_u16();
            let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap();
            let reply = serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("reply is not JSON ({e}): {bytes:?}"));
            (status, reply)
        })
    }

    /// The frames delivered to the listener since the last call.
    fn delivered(&mut self) -> Vec<Value> {
        // Publishing queues delivery on the fan-out workers: wait for them.
        self.rt.block_on(self.node.settle());
        let mut frames = Vec::new();
        self.listener.take(&mut frames, usize::MAX);
        frames
            .iter()
            .map(|f| serde_json::from_str(&f.payload_text()).expect("frames are JSON"))
            .collect()
    }
}

fn check_error_reply(status: u16, reply: &Value) -> Result<(), TestCaseError> {
    prop_assert!(
        matches!(status, 200 | 400 | 413),
        "status {} for {}",
        status,
        reply
    );
    if status != 200 {
        prop_assert!(reply["error"].is_string(), "error reply {}", reply);
    }
    Ok(())
}

// ----- generated events and the reference model -----------------------------------

#[derive(Debug, Clone)]
enum Target {
    Channel(String),
    Channels(Vec<String>),
    Both(String, Vec<String>),
    Neither,
}

#[derive(Debug, Clone)]
struct GenEvent {
    name: Option<Value>,
    data: Option<Value>,
    target: Target,
    socket_id: Option<String>,
    info: Option<String>,
    unknown_field: bool,
}

impl GenEvent {
    fn to_json(&self) -> Value {
        let mut m = Map::new();
        if let Some(n) = &self.name {
            m.insert("name".into(), n.clone());
        }
        if let Some(d) = &self.data {
            m.insert("data".into(), d.clone());
        }
        match &self.target {
            Target::Channel(c) => {
                m.insert("channel".into(), json!(c));
            }
            Target::Channels(cs) => {
                m.insert("channels".into(), json!(cs));
            }
            Target::Both(c, cs) => {
                m.insert("channel".into(), json!(c));
                m.insert("channels".into(), json!(cs));
            }
            Target::Neither => {}
        }
        if let Some(s) = &self.socket_id {
            m.insert("socket_id".into(), json!(s));
        }
        if let Some(i) = &self.info {
            m.insert("info".into(), json!(i));
        }
        if self.unknown_field {
            m.insert("extra".into(), json!(1));
        }
        Value::Object(m)
    }

    fn channels(&self) -> Vec<&str> {
        match &self.target {
            Target::Channel(c) => vec![c.as_str()],
            Target::Channels(cs) => cs.iter().map(String::as_str).collect(),
            _ => Vec::new(),
        }
    }

    /// The statuses of every fault this event has, by the documented rules.
    /// Unknown fields are not a fault: they are ignored, as Pusher does.
    fn faults(&self, l: Limits, in_batch: bool) -> Vec<u16> {
        let mut f = Vec::new();
        match &self.name {
            Some(Value::String(n)) => {
                // Event names are limited in characters, not bytes.
                if n.is_empty()
                    || n.chars().count() > l.event_name
                    || n.starts_with("pusher:")
                    || n.starts_with("pusher_internal:")
                {
                    f.push(400);
                }
            }
            _ => f.push(400),
        }
        match &self.data {
            Some(Value::String(d)) if d.len() > l.payload => f.push(413),
            Some(Value::String(_)) => {}
            _ => f.push(400),
        }
        match &self.target {
            Target::Channel(c) => {
                if !valid_publish_channel(c, l.channel_name) {
                    f.push(400);
                }
            }
            Target::Channels(cs) => {
                if in_batch
                    || cs.is_empty()
                    || cs.len() > 100
                    || cs.iter().any(|c| !valid_publish_channel(c, l.channel_name))
                {
                    f.push(400);
                }
            }
            Target::Both(..) | Target::Neither => f.push(400),
        }
        if let Some(s) = &self.socket_id {
            if !valid_socket_id(s) {
                f.push(400);
            }
        }
        if self.info_attributes(l).is_none() {
            f.push(400);
        }
        f
    }

    /// The `info` attributes asked for; `None` if one is unsupported, or is
    /// `subscription_count` while the app does not count subscriptions.
    fn info_attributes(&self, l: Limits) -> Option<Vec<&str>> {
        let mut out = Vec::new();
        for a in self.info.as_deref().unwrap_or("").split(',').map(str::trim) {
            match a {
                "" => {}
                "user_count" => out.push(a),
                "subscription_count" if l.subscription_count => out.push(a),
                _ => return None,
            }
        }
        Some(out)
    }

    /// Frames the listener gets when this (accepted) event is published.
    fn expected_frames(&self) -> usize {
        if self.socket_id.as_deref() == Some(LISTENER) {
            return 0;
        }
        self.channels().iter().filter(|c| POOL.contains(c)).count()
    }
}

/// Pusher's channel name rules, plus `#server-to-user-{id}` for publishing.
fn valid_publish_channel(c: &str, max: usize) -> bool {
    // Characters: other names are ASCII-only anyway, and a user id is
    // limited in characters.
    if c.is_empty() || c.chars().count() > max {
        return false;
    }
    if let Some(user) = c.strip_prefix("#server-to-user-") {
        return !user.is_empty() && !user.chars().any(|ch| ch.is_control() || ch.is_whitespace());
    }
    c.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_-=@,.;".contains(&b))
}

/// Two runs of digits joined by a dot, at most 40 digits in all.
fn valid_socket_id(s: &str) -> bool {
    match s.split_once('.') {
        Some((a, b)) => {
            !a.is_empty()
                && !b.is_empty()
                && a.len() + b.len() <= 40
                && (a.bytes().chain(b.bytes())).all(|c| c.is_ascii_digit())
        }
        None => false,
    }
}

fn limits() -> impl Strategy<Value = Limits> {
    (1usize..40, 1usize..64, 8usize..30, any::<bool>()).prop_map(
        |(event_name, payload, channel_name, subscription_count)| Limits {
            event_name,
            payload,
            channel_name,
            subscription_count,
        },
    )
}

fn channel() -> impl Strategy<Value = String> {
    prop_oneof![
        10 => proptest::sample::select(POOL.to_vec()).prop_map(String::from),
        2 => "[A-Za-z0-9_=@,.;-]{1,35}",
        1 => "[a-z]{0,5}[ #/é\u{0}]?[a-z]{0,5}",
        1 => "#server-to-user-[a-z0-9 é]{0,6}",
        1 => any::<String>(),
    ]
}

/// An event that is valid more often than not, so both the accepting and
/// the refusing paths are exercised (each field is usually valid; a few
/// invalid fields make most events, and most batches, invalid).
fn gen_event() -> impl Strategy<Value = GenEvent> {
    let name = prop_oneof![
        12 => "[a-z][a-z0-9_-]{0,5}".prop_map(|s| Some(json!(s))),
        3 => "[a-z][a-z0-9_-]{0,44}".prop_map(|s| Some(json!(s))),
        2 => "[a-zé]{1,40}".prop_map(|s| Some(json!(s))),
        1 => Just(Some(json!(""))),
        1 => "(pusher|pusher_internal):[a-z]{1,5}".prop_map(|s| Some(json!(s))),
        1 => any::<String>().prop_map(|s| Some(json!(s))),
        1 => Just(Some(json!(42))),
        1 => Just(None),
    ];
    let data = prop_oneof![
        16 => "[a-z\"\\\\é]{0,10}".prop_map(|s| Some(json!(s))),
        3 => "[a-z\"\\\\é]{0,70}".prop_map(|s| Some(json!(s))),
        1 => Just(Some(json!({ "an": "object" }))),
        1 => Just(Some(json!(7))),
        1 => Just(Some(Value::Null)),
        1 => Just(None),
    ];
    let channels = prop_oneof![
        8 => proptest::collection::vec(channel(), 1..4),
        1 => Just(Vec::new()),
        1 => Just(vec!["a".to_string(); 101]),
    ];
    let target = prop_oneof![
        12 => channel().prop_map(Target::Channel),
        4 => channels.prop_map(Target::Channels),
        1 => (channel(), proptest::collection::vec(channel(), 1..3))
            .prop_map(|(c, cs)| Target::Both(c, cs)),
        1 => Just(Target::Neither),
    ];
    let socket_id = proptest::option::weighted(
        0.3,
        prop_oneof![
            Just(LISTENER.to_string()),
            "[0-9]{1,3}\\.[0-9]{1,3}",
            "[0-9a-z.]{0,6}",
        ],
    );
    let info = proptest::option::weighted(
        0.3,
        prop_oneof![
            Just("user_count".to_string()),
            Just("subscription_count".to_string()),
            Just("user_count, subscription_count".to_string()),
            Just(String::new()),
            "[a-z_,]{1,12}",
        ],
    );
    (
        name,
        data,
        target,
        socket_id,
        info,
        proptest::bool::weighted(0.1),
    )
        .prop_map(
            |(name, data, target, socket_id, info, unknown_field)| GenEvent {
                name,
                data,
                target,
                socket_id,
                info,
                unknown_field,
            },
        )
}

fn arbitrary_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..200),
        any::<String>().prop_map(String::into_bytes),
        gen_event().prop_map(|e| e.to_json().to_string().into_bytes()),
        proptest::collection::vec(gen_event(), 0..3).prop_map(|es| {
            json!({ "batch": es.iter().map(GenEvent::to_json).collect::<Vec<_>>() })
                .to_string()
                .into_bytes()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn arbitrary_bodies_never_panic_and_get_a_documented_status(
        l in limits(),
        body in arbitrary_body(),
        batch in any::<bool>(),
    ) {
        let mut h = Harness::new(l);
        let (status, reply) = h.post(if batch { "batch_events" } else { "events" }, &body);
        check_error_reply(status, &reply)?;
        if status == 200 {
            prop_assert!(serde_json::from_slice::<Value>(&body).is_ok());
        } else {
            prop_assert!(h.delivered().is_empty(), "a refused body published something");
        }
    }

    #[test]
    fn events_body_agrees_with_the_model(l in limits(), ev in gen_event()) {
        let mut h = Harness::new(l);
        let (status, reply) = h.post("events", ev.to_json().to_string().as_bytes());
        check_error_reply(status, &reply)?;
        let faults = ev.faults(l, false);
        let frames = h.delivered();
        if faults.is_empty() {
            prop_assert_eq!(status, 200, "valid event refused: {}", reply);
            prop_assert_eq!(frames.len(), ev.expected_frames());
            for f in &frames {
                prop_assert_eq!(&f["event"], ev.name.as_ref().unwrap());
                prop_assert_eq!(&f["data"], ev.data.as_ref().unwrap());
                prop_assert!(POOL.contains(&f["channel"].as_str().unwrap()));
            }
            // The reply: `{}`, or per-channel attributes when `info` asks
            // for any.
            match ev.info_attributes(l).unwrap().len() {
                0 => prop_assert_eq!(reply, json!({})),
                _ => {
                    let got = reply["channels"].as_object().expect("channels object");
                    for c in ev.channels() {
                        prop_assert!(got.contains_key(c), "no info for {:?}: {}", c, reply);
                    }
                    prop_assert!(got.len() <= ev.channels().len());
                }
            }
        } else {
            prop_assert!(faults.contains(&status), "status {} not among {:?}: {}", status, faults, reply);
            prop_assert!(frames.is_empty(), "a refused event was published");
        }
    }

    #[test]
    fn batch_body_agrees_with_the_model(
        l in limits(),
        events in prop_oneof![
            3 => proptest::collection::vec(gen_event(), 0..4),
            1 => proptest::collection::vec(gen_event(), 0..12),
        ],
        unknown_top_level in proptest::bool::weighted(0.1),
    ) {
        let mut h = Harness::new(l);
        let mut body = json!({ "batch": events.iter().map(GenEvent::to_json).collect::<Vec<_>>() });
        if unknown_top_level {
            // Ignored, like unknown fields in the events.
            body["extra"] = json!(true);
        }
        let (status, reply) = h.post("batch_events", body.to_string().as_bytes());
        check_error_reply(status, &reply)?;
        let mut faults: Vec<u16> = events.iter().flat_map(|e| e.faults(l, true)).collect();
        if events.len() > 10 {
            faults.push(400);
        }
        let frames = h.delivered();
        if faults.is_empty() {
            prop_assert_eq!(status, 200, "valid batch refused: {}", reply);
            let expected: usize = events.iter().map(GenEvent::expected_frames).sum();
            prop_assert_eq!(frames.len(), expected);
            if events.iter().any(|e| !e.info_attributes(l).unwrap().is_empty()) {
                prop_assert_eq!(reply["batch"].as_array().map(Vec::len), Some(events.len()), "{}", reply);
            } else {
                prop_assert_eq!(reply, json!({}));
            }
        } else {
            prop_assert!(faults.contains(&status), "status {} not among {:?}: {}", status, faults, reply);
            prop_assert!(frames.is_empty(), "a refused batch published {} frames", frames.len());
        }
    }
}
