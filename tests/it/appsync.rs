//! The AppSync-compatible endpoints over real sockets against a real
//! `herald`: both WebSocket protocols (Events, `aws-appsync-event-ws`;
//! generic pub/sub GraphQL, `graphql-ws`), both HTTP publish endpoints,
//! and every error path a client can reach: bad or missing keys, unknown
//! namespaces, invalid channel paths, publishing to a wildcard, too many or
//! too large events, malformed messages, unknown GraphQL operations. After
//! the bad input the server must go on serving (a bystander still gets
//! events) and `/metrics` must have counted it.

use crate::common;

use base64::Engine;
use common::*;
use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

const API_KEY: &str = "test-api-key";
const APP: &str = "api_keys = [\"test-api-key\", \"second-key\"]";

fn auth(key: &str) -> Value {
    json!({ "host": "example.com", "x-api-key": key })
}

fn header_protocol(key: &str) -> String {
    let enc = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(auth(key).to_string());
    format!("header-{enc}")
}

/// An AppSync socket: the raw WebSocket and the subprotocol answered.
struct Sock {
    ws: Ws,
    protocol: Option<String>,
}

async fn open(server: &Server, path_and_query: &str, protocols: &[String]) -> Sock {
    let url = format!("ws://127.0.0.1:{}{path_and_query}", server.port);
    let mut req = url.into_client_request().unwrap();
    if !protocols.is_empty() {
        req.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_str(&protocols.join(", ")).unwrap(),
        );
    }
    let (ws, res) = tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(req))
        .await
        .expect("connect timed out")
        .expect("connect");
    let protocol = res
        .headers()
        .get("sec-websocket-protocol")
        .map(|v| v.to_str().unwrap().to_owned());
    Sock { ws, protocol }
}

impl Sock {
    async fn send(&mut self, v: Value) {
        self.send_text(&v.to_string()).await;
    }

    async fn send_text(&mut self, t: &str) {
        self.ws
            .send(Message::text(t.to_owned()))
            .await
            .expect("send");
    }

    async fn recv(&mut self) -> Value {
        loop {
            match next(&mut self.ws).await {
                Next::Frame(f) if f["type"] == "ka" => continue,
                Next::Frame(f) => return f,
                Next::Close(c) => panic!("closed ({c:?}) while a message was expected"),
            }
        }
    }

    /// The next message, which must be of `ty`.
    async fn expect(&mut self, ty: &str) -> Value {
        let m = self.recv().await;
        assert_eq!(m["type"], ty, "unexpected message {m}");
        m
    }

    /// The close code, skipping what comes before it (keep-alives, a
    /// last error message).
    async fn expect_close(&mut self) -> Option<u16> {
        loop {
            match next(&mut self.ws).await {
                Next::Frame(f) => assert!(f["type"] == "ka" || f["type"] == "error", "{f}"),
                Next::Close(c) => return c,
            }
        }
    }
}

/// An Events socket, past `connection_ack`.
async fn events(server: &Server, key: &str) -> Sock {
    let mut s = open(
        server,
        "/event/realtime",
        &["aws-appsync-event-ws".into(), header_protocol(key)],
    )
    .await;
    assert_eq!(s.protocol.as_deref(), Some("aws-appsync-event-ws"));
    s.send(json!({ "type": "connection_init" })).await;
    let ack = s.expect("connection_ack").await;
    assert_eq!(ack["connectionTimeoutMs"], 300000);
    s
}

/// A GraphQL socket on `path`, authorized by the `header` query parameter,
/// past `connection_ack`.
async fn graphql(server: &Server, path: &str, key: &str) -> Sock {
    let header = base64::engine::general_purpose::STANDARD.encode(auth(key).to_string());
    let mut s = open(
        server,
        &format!("{path}?header={header}&payload=e30="),
        &["graphql-ws".into()],
    )
    .await;
    assert_eq!(s.protocol.as_deref(), Some("graphql-ws"));
    s.send(json!({ "type": "connection_init" })).await;
    let ack = s.expect("connection_ack").await;
    assert_eq!(ack["payload"]["connectionTimeoutMs"], 300000);
    s
}

async fn subscribe(s: &mut Sock, id: &str, channel: &str) -> Value {
    s.send(json!({ "type": "subscribe", "id": id, "channel": channel, "authorization": auth(API_KEY) }))
        .await;
    s.recv().await
}

async fn start(s: &mut Sock, id: &str, query: &str, variables: Value) -> Value {
    let data = json!({ "query": query, "variables": variables }).to_string();
    s.send(json!({
        "type": "start", "id": id,
        "payload": { "data": data, "extensions": { "authorization": auth(API_KEY) } },
    }))
    .await;
    s.recv().await
}

async fn post(
    server: &Server,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, Value, Option<String>) {
    let http = reqwest::Client::new();
    let mut req = http.post(server.url(path)).body(body.to_owned());
    if let Some(k) = key {
        req = req.header("x-api-key", k);
    }
    let res = tokio::time::timeout(TIMEOUT, req.send())
        .await
        .expect("request timed out")
        .expect("request");
    let status = res.status().as_u16();
    let error_type = res
        .headers()
        .get("x-amzn-errortype")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = res.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
        error_type,
    )
}

async fn post_event(server: &Server, channel: &str, events: Value) -> (u16, Value, Option<String>) {
    let body = json!({ "channel": channel, "events": events }).to_string();
    post(server, "/event", Some(API_KEY), &body).await
}

async fn publish_graphql(server: &Server, name: &str, data: &str) -> Value {
    let body = json!({
        "query": "mutation PublishData($name: String!, $data: AWSJSON!) { publish(name: $name, data: $data) { name data } }",
        "variables": { "name": name, "data": data },
    });
    let (status, reply, _) = post(server, "/graphql", Some(API_KEY), &body.to_string()).await;
    assert_eq!(status, 200, "{reply}");
    reply
}

/// A GraphQL subscriber of `healthy` (id `h`) that must keep receiving.
async fn bystander_graphql(server: &Server) -> Sock {
    let mut s = graphql(server, "/graphql", API_KEY).await;
    let q = "subscription { subscribe(name: \"healthy\") { data } }";
    assert_eq!(start(&mut s, "h", q, json!({})).await["type"], "start_ack");
    s
}

/// An Events subscriber on `/healthy/ch` that must keep receiving.
async fn bystander_events(server: &Server) -> Sock {
    let mut s = events(server, API_KEY).await;
    assert_eq!(
        subscribe(&mut s, "b", "/healthy/ch").await["type"],
        "subscribe_success"
    );
    s
}

async fn events_still_healthy(server: &Server, s: &mut Sock) {
    let (status, reply, _) = post_event(server, "/healthy/ch", json!(["\"still-here\""])).await;
    assert_eq!(status, 200, "{reply}");
    let d = s.expect("data").await;
    assert_eq!(d["event"], "\"still-here\"");
}

// ----- Events API ------------------------------------------------------------

#[tokio::test]
async fn events_subscribe_publish_unsubscribe() {
    let server = Server::start_with("", APP).await;
    let mut a = events(&server, API_KEY).await;
    let mut b = events(&server, "second-key").await;
    assert_eq!(
        subscribe(&mut a, "exact", "/default/room").await,
        json!({ "type": "subscribe_success", "id": "exact" })
    );
    // Without the leading slash, as Amplify's users write paths.
    assert_eq!(
        subscribe(&mut a, "wild", "default/*").await["type"],
        "subscribe_success"
    );
    assert_eq!(
        subscribe(&mut b, "b1", "/default/room").await["type"],
        "subscribe_success"
    );

    // Publish over the socket: two events, each its own data message, to
    // each matching subscription.
    b.send(json!({
        "type": "publish", "id": "p1", "channel": "/default/room",
        "events": ["{\"n\":1}", "\"two\""], "authorization": auth(API_KEY),
    }))
    .await;
    // `b` subscribed to the room too: its own two data messages and the
    // publish_success come in no promised order (AppSync promises none;
    // fan-out runs beside the publisher's reply).
    let mut own = Vec::new();
    let mut ok = Value::Null;
    for _ in 0..3 {
        let m = b.recv().await;
        match m["type"].as_str() {
            Some("publish_success") if ok.is_null() => ok = m,
            Some("data") => own.push(m),
            _ => panic!("unexpected message {m}"),
        }
    }
    assert_eq!(ok["id"], "p1");
    assert_eq!(ok["failed"], json!([]));
    let succ = ok["successful"].as_array().unwrap();
    assert_eq!(succ.len(), 2);
    assert_eq!(
        (succ[0]["index"].clone(), succ[1]["index"].clone()),
        (json!(0), json!(1))
    );
    assert_eq!(succ[0]["identifier"].as_str().unwrap().len(), 36);
    let mut got: Vec<(String, String)> = Vec::new();
    for _ in 0..4 {
        let d = a.expect("data").await;
        got.push((
            d["id"].as_str().unwrap().into(),
            d["event"].as_str().unwrap().into(),
        ));
    }
    got.sort();
    assert_eq!(
        got,
        vec![
            ("exact".into(), "\"two\"".into()),
            ("exact".into(), "{\"n\":1}".into()),
            ("wild".into(), "\"two\"".into()),
            ("wild".into(), "{\"n\":1}".into()),
        ]
    );
    // In publish order among themselves.
    assert_eq!(own[0]["event"], "{\"n\":1}");
    assert_eq!(own[1]["event"], "\"two\"");
    assert_eq!(own[0]["id"], "b1");

    // HTTP publish.
    let (status, reply, _) = post_event(&server, "default/room", json!(["[1,2]"])).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["successful"][0]["index"], 0);
    assert_eq!(
        b.expect("data").await,
        json!({ "type": "data", "id": "b1", "event": "[1,2]" })
    );

    // Unsubscribe: confirmed, and nothing more arrives for it.
    b.send(json!({ "type": "unsubscribe", "id": "b1" })).await;
    assert_eq!(b.expect("unsubscribe_success").await["id"], "b1");
    b.send(json!({ "type": "unsubscribe", "id": "b1" })).await;
    let e = b.expect("unsubscribe_error").await;
    assert_eq!(e["id"], "b1");
    assert_eq!(e["errors"][0]["errorType"], "BadRequestException");
    assert_eq!(
        subscribe(&mut b, "b2", "/default/other").await["type"],
        "subscribe_success"
    );
    post_event(&server, "/default/room", json!(["3"])).await;
    post_event(&server, "/default/other", json!(["4"])).await;
    assert_eq!(
        b.expect("data").await,
        json!({ "type": "data", "id": "b2", "event": "4" })
    );

    // /metrics: both sockets under the app's id, the POSTs counted.
    let scrape = server.scrape().await;
    let sockets = [("app", APP_ID), ("protocol", "appsync-events")];
    assert_eq!(metric_in(&scrape, "herald_connections", &sockets), Some(2));
    let posted = [
        ("app", APP_ID),
        ("protocol", "appsync-events"),
        ("endpoint", "event"),
        ("status", "200"),
    ];
    assert_eq!(
        metric_in(&scrape, "herald_api_requests_total", &posted),
        Some(3)
    );
}

#[tokio::test]
async fn wildcards_match_any_depth_below_their_prefix() {
    let server = Server::start_with("", APP).await;
    let mut s = events(&server, API_KEY).await;
    assert_eq!(
        subscribe(&mut s, "ns", "/ns/*").await["type"],
        "subscribe_success"
    );
    assert_eq!(
        subscribe(&mut s, "a", "/ns/a/*").await["type"],
        "subscribe_success"
    );
    for (channel, n) in [
        ("/ns/b", 1),
        ("/ns/a/x/y/z", 2),
        ("/other/a", 3),
        ("/ns/ab", 4),
    ] {
        let (status, reply, _) = post_event(&server, channel, json!([n.to_string()])).await;
        assert_eq!(status, 200, "{reply}");
    }
    // Fan-out keeps one channel's order; across channels, sort.
    let mut got = Vec::new();
    for _ in 0..4 {
        let d = s.expect("data").await;
        got.push(format!(
            "{}:{}",
            d["id"].as_str().unwrap(),
            d["event"].as_str().unwrap()
        ));
    }
    got.sort();
    assert_eq!(got, vec!["a:2", "ns:1", "ns:2", "ns:4"]);
}

#[tokio::test]
async fn events_bad_keys_and_namespaces() {
    let app = format!(
        "{APP}\n[[apps.namespaces]]\nname = \"open\"\n\
         [[apps.namespaces]]\nname = \"locked\"\npublish_keys = [\"second-key\"]\nsubscribe_keys = [\"second-key\"]\n"
    );
    let server = Server::start_with("", &app).await;
    let refused_before = server.metric("herald_connections_refused_total").await;

    // A wrong key, no key, a malformed header: connection_error, then close.
    for protocols in [
        vec!["aws-appsync-event-ws".to_string(), header_protocol("wrong")],
        vec!["aws-appsync-event-ws".to_string()],
        vec![
            "aws-appsync-event-ws".to_string(),
            "header-!!notbase64".to_string(),
        ],
    ] {
        let mut s = open(&server, "/event/realtime", &protocols).await;
        s.send(json!({ "type": "connection_init" })).await;
        let e = s.expect("connection_error").await;
        let t = e["errors"][0]["errorType"].as_str().unwrap().to_owned();
        assert!(
            t == "UnauthorizedException" || t == "BadRequestException",
            "{e}"
        );
        assert!(e["errors"][0]["errorCode"].is_number(), "{e}");
        assert!(s.expect_close().await.is_some());
    }
    // Not offering the subprotocol.
    let mut s = open(&server, "/event/realtime", &[]).await;
    assert_eq!(s.protocol, None);
    s.send(json!({ "type": "connection_init" })).await;
    let e = s.expect("connection_error").await;
    assert!(
        e["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("aws-appsync-event-ws"),
        "{e}"
    );
    assert_eq!(
        server.metric("herald_connections_refused_total").await,
        refused_before + 4
    );

    let mut s = events(&server, API_KEY).await;
    // Unknown namespace, a key the namespace refuses, a wrong key.
    let e = subscribe(&mut s, "u", "/nowhere/a").await;
    assert_eq!(e["type"], "subscribe_error", "{e}");
    assert_eq!(e["id"], "u");
    assert!(
        e["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("nowhere"),
        "{e}"
    );
    let e = subscribe(&mut s, "l", "/locked/a").await;
    assert_eq!(e["errors"][0]["errorType"], "UnauthorizedException", "{e}");
    s.send(json!({ "type": "subscribe", "id": "w", "channel": "/open/a", "authorization": auth("wrong") }))
        .await;
    assert_eq!(
        s.expect("subscribe_error").await["errors"][0]["errorType"],
        "UnauthorizedException"
    );
    // The namespace's own key works there, over the socket and over HTTP.
    s.send(json!({ "type": "subscribe", "id": "ok", "channel": "/locked/a", "authorization": auth("second-key") }))
        .await;
    assert_eq!(s.expect("subscribe_success").await["id"], "ok");
    let (status, reply, error_type) = post_event(&server, "/locked/a", json!(["1"])).await;
    assert_eq!(
        (status, error_type.as_deref()),
        (401, Some("UnauthorizedException")),
        "{reply}"
    );
    let body = json!({ "channel": "/locked/a", "events": ["2"] }).to_string();
    let (status, reply, _) = post(&server, "/event", Some("second-key"), &body).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(s.expect("data").await["event"], "2");

    // HTTP without a key, with a wrong one.
    for key in [None, Some("wrong")] {
        let (status, reply, error_type) = post(&server, "/event", key, &body).await;
        assert_eq!(status, 401, "{reply}");
        assert_eq!(error_type.as_deref(), Some("UnauthorizedException"));
        assert_eq!(reply["errors"][0]["errorType"], "UnauthorizedException");
    }
    let (status, reply, _) = post_event(&server, "/nowhere/a", json!(["1"])).await;
    assert_eq!(status, 400, "{reply}");
}

#[tokio::test]
async fn events_invalid_channels_and_limits() {
    let server =
        Server::start_with("", &format!("{APP}\nmax_subscriptions_per_connection = 3")).await;
    let mut healthy = bystander_events(&server).await;
    let errors_before = server.metric("herald_subscription_errors_total").await;
    let mut s = events(&server, API_KEY).await;
    let bad_paths = [
        "",
        "/",
        "/ns",
        "/ns/",
        "/ns/a b",
        "/ns/a_b",
        "/ns//a",
        "/a/b/c/d/e/f",
        "/ns/*/a",
        "/*",
        "/ns/a*",
        &format!("/ns/{}", "x".repeat(51)),
    ];
    for (i, path) in bad_paths.iter().enumerate() {
        let e = subscribe(&mut s, &format!("bad{i}"), path).await;
        assert_eq!(e["type"], "subscribe_error", "{path:?}: {e}");
        assert_eq!(
            e["errors"][0]["errorType"], "BadRequestException",
            "{path:?}: {e}"
        );
    }
    s.send(json!({ "type": "subscribe", "id": "x", "channel": 5 }))
        .await;
    assert_eq!(s.expect("subscribe_error").await["id"], "x");
    s.send(json!({ "type": "subscribe", "channel": "/ns/a" }))
        .await;
    assert!(s.expect("subscribe_error").await["errors"][0]["message"]
        .as_str()
        .unwrap()
        .contains("id"));
    s.send(json!({ "type": "subscribe", "id": "x".repeat(129), "channel": "/ns/a" }))
        .await;
    s.expect("subscribe_error").await;
    assert!(
        server.metric("herald_subscription_errors_total").await
            >= errors_before + bad_paths.len() as u64 + 3
    );

    // A duplicate id, then the per-connection limit (one is the
    // bystander's connection, not this one: three here).
    assert_eq!(
        subscribe(&mut s, "one", "/ns/a").await["type"],
        "subscribe_success"
    );
    let e = subscribe(&mut s, "one", "/ns/b").await;
    assert!(
        e["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("already"),
        "{e}"
    );
    assert_eq!(
        subscribe(&mut s, "two", "/ns/b").await["type"],
        "subscribe_success"
    );
    assert_eq!(
        subscribe(&mut s, "three", "/ns/c").await["type"],
        "subscribe_success"
    );
    let e = subscribe(&mut s, "four", "/ns/d").await;
    assert_eq!(e["errors"][0]["errorType"], "LimitExceededException", "{e}");

    // Publishing: to a wildcard, to a bad path, too many events, not an
    // array, events that are not strings of JSON, too large.
    let publish = |channel: Value, events: Value| json!({ "type": "publish", "id": "p", "channel": channel, "events": events, "authorization": auth(API_KEY) });
    for (channel, events) in [
        (json!("/ns/*"), json!(["1"])),
        (json!("/ns/a b"), json!(["1"])),
        (json!("/ns/a"), json!(["1", "2", "3", "4", "5", "6"])),
        (json!("/ns/a"), json!([])),
        (json!("/ns/a"), json!("1")),
        (json!(null), json!(["1"])),
    ] {
        s.send(publish(channel.clone(), events)).await;
        let e = s.expect("publish_error").await;
        assert_eq!(e["id"], "p");
        assert_eq!(
            e["errors"][0]["errorType"], "BadRequestException",
            "{channel}: {e}"
        );
    }
    // Every event invalid: publish_error, listing them.
    s.send(publish(
        json!("/ns/a"),
        json!([{"not": "a string"}, "not json"]),
    ))
    .await;
    let e = s.expect("publish_error").await;
    assert_eq!(e["failed"].as_array().unwrap().len(), 2, "{e}");
    // Some valid: publish_success with the failures listed.
    s.send(publish(json!("/ns/a"), json!(["\"fine\"", "{broken"])))
        .await;
    let ok = s.expect("publish_success").await;
    assert_eq!(ok["successful"][0]["index"], 0);
    assert_eq!(ok["failed"][0]["index"], 1);
    assert_eq!(s.expect("data").await["event"], "\"fine\"");

    // Over HTTP: 400s for request-wide problems, per-event failures listed.
    for (channel, events) in [
        ("/ns/*", json!(["1"])),
        ("/ns", json!(["1"])),
        ("/ns/a", json!(["1", "2", "3", "4", "5", "6"])),
    ] {
        let (status, reply, error_type) = post_event(&server, channel, events).await;
        assert_eq!(status, 400, "{channel}: {reply}");
        assert_eq!(error_type.as_deref(), Some("BadRequestException"));
        assert!(reply["errors"][0]["message"].is_string(), "{reply}");
    }
    let big = format!("\"{}\"", "x".repeat(240 * 1024));
    let (status, reply, _) = post_event(&server, "/ns/a", json!([big, "1"])).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["failed"][0]["index"], 0);
    assert!(
        reply["failed"][0]["message"]
            .as_str()
            .unwrap()
            .contains("larger"),
        "{reply}"
    );
    assert_eq!(reply["successful"][0]["index"], 1);
    assert_eq!(s.expect("data").await["event"], "1");
    // A body over the limit, and bodies that are not what they should be.
    let huge = json!({ "channel": "/ns/a", "events": vec![big.clone(); 6] }).to_string();
    assert_eq!(post(&server, "/event", Some(API_KEY), &huge).await.0, 413);
    for body in ["", "not json", "[]", "{\"channel\":\"/ns/a\"}"] {
        let (status, reply, _) = post(&server, "/event", Some(API_KEY), body).await;
        assert_eq!(status, 400, "{body:?}: {reply}");
    }
    events_still_healthy(&server, &mut healthy).await;
}

#[tokio::test]
async fn events_malformed_messages_keep_the_connection() {
    let server = Server::start_with("", APP).await;
    let mut healthy = bystander_events(&server).await;
    let bad_before = server.metric("herald_bad_messages_total").await;
    let mut s = events(&server, API_KEY).await;
    let inputs = [
        "not json",
        "",
        "[]",
        "null",
        "{}",
        r#"{"type":5}"#,
        r#"{"type":"nope","id":"i"}"#,
        r#"{"type":"publish"}"#,
        r#"{"type":"unsubscribe"}"#,
        &format!("{}1{}", "[".repeat(1000), "]".repeat(1000)),
    ];
    for input in inputs {
        s.send_text(input).await;
        let e = s.recv().await;
        assert!(
            e["type"].as_str().unwrap().ends_with("error") && e["errors"][0]["message"].is_string(),
            "{input:?}: {e}"
        );
    }
    assert!(server.metric("herald_bad_messages_total").await >= bad_before + inputs.len() as u64);
    // Still usable.
    assert_eq!(
        subscribe(&mut s, "h", "/healthy/ch").await["type"],
        "subscribe_success"
    );
    events_still_healthy(&server, &mut healthy).await;
    assert_eq!(s.expect("data").await["id"], "h");
    // A binary frame closes with 1003; an oversized message with 1009.
    s.ws.send(Message::binary(vec![1u8, 2, 3])).await.unwrap();
    assert_eq!(s.expect_close().await, Some(1003));
    let mut s = events(&server, API_KEY).await;
    s.send_text(&"x".repeat(70 * 1024)).await;
    assert_eq!(s.expect_close().await, Some(1009));
    events_still_healthy(&server, &mut healthy).await;
}

#[tokio::test]
async fn keepalives_come_on_a_clock() {
    let server = Server::start_with("keepalive_interval = 1", APP).await;
    let mut s = events(&server, API_KEY).await;
    // connection_ack is followed by a ka at once, then one per interval
    // whatever the traffic.
    let started = std::time::Instant::now();
    let mut kas = 0;
    while kas < 3 {
        match next(&mut s.ws).await {
            Next::Frame(f) if f["type"] == "ka" => kas += 1,
            Next::Frame(f) => panic!("unexpected {f}"),
            Next::Close(c) => panic!("closed {c:?}"),
        }
    }
    assert!(started.elapsed() >= std::time::Duration::from_millis(1500));
    let mut g = graphql(&server, "/graphql", API_KEY).await;
    match next(&mut g.ws).await {
        Next::Frame(f) => assert_eq!(f["type"], "ka"),
        Next::Close(c) => panic!("closed {c:?}"),
    }
}

// ----- generic pub/sub GraphQL API --------------------------------------------

#[tokio::test]
async fn graphql_start_publish_stop() {
    let server = Server::start_with("", APP).await;
    let mut a = graphql(&server, "/graphql", API_KEY).await;
    // /graphql/realtime with the header- subprotocol, as Amplify connects.
    let mut b = open(
        &server,
        "/graphql/realtime",
        &["graphql-ws".into(), header_protocol("second-key")],
    )
    .await;
    assert_eq!(b.protocol.as_deref(), Some("graphql-ws"));
    b.send(json!({ "type": "connection_init" })).await;
    b.expect("connection_ack").await;

    let q = "subscription SubscribeToData($name: String!) { subscribe(name: $name) { name data } }";
    assert_eq!(
        start(&mut a, "s1", q, json!({ "name": "room" })).await,
        json!({ "type": "start_ack", "id": "s1" })
    );
    let aliased = r#"subscription { s: subscribe(name: "room") { __typename d: data } }"#;
    assert_eq!(
        start(&mut b, "s2", aliased, json!({})).await["type"],
        "start_ack"
    );
    // No data selected: the frame still arrives, without it.
    assert_eq!(
        start(
            &mut b,
            "s3",
            r#"subscription { subscribe(name: "room") { name } }"#,
            json!({})
        )
        .await["type"],
        "start_ack"
    );

    let reply = publish_graphql(&server, "room", "{\"msg\":\"hi\"}").await;
    assert_eq!(
        reply,
        json!({ "data": { "publish": { "name": "room", "data": "{\"msg\":\"hi\"}" } } })
    );
    assert_eq!(
        a.expect("data").await,
        json!({ "type": "data", "id": "s1", "payload": { "data": { "subscribe": { "name": "room", "data": "{\"msg\":\"hi\"}" } } } })
    );
    let mut got = [b.expect("data").await, b.expect("data").await];
    got.sort_by_key(|v| v["id"].as_str().unwrap().to_owned());
    assert_eq!(
        got[0]["payload"],
        json!({ "data": { "s": { "__typename": "Channel", "d": "{\"msg\":\"hi\"}" } } })
    );
    assert_eq!(
        got[1]["payload"],
        json!({ "data": { "subscribe": { "name": "room" } } })
    );

    // Another name does not reach them; several aliased publishes do, in order.
    let body = json!({ "query": r#"mutation { x: publish(name: "other", data: "1") { name } y: publish(name: "room", data: "2") { data __typename } __typename }"# });
    let (status, reply, _) = post(&server, "/graphql", Some(API_KEY), &body.to_string()).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["data"],
        json!({ "x": { "name": "other" }, "y": { "data": "2", "__typename": "Channel" }, "__typename": "Mutation" })
    );
    assert_eq!(
        a.expect("data").await["payload"]["data"]["subscribe"]["data"],
        "2"
    );

    // stop → complete, and no more data for it.
    a.send(json!({ "type": "stop", "id": "s1" })).await;
    assert_eq!(
        a.expect("complete").await,
        json!({ "type": "complete", "id": "s1" })
    );
    assert_eq!(
        start(&mut a, "s4", q, json!({ "name": "later" })).await["type"],
        "start_ack"
    );
    publish_graphql(&server, "room", "3").await;
    publish_graphql(&server, "later", "4").await;
    assert_eq!(a.expect("data").await["id"], "s4");

    // The demo schema's query answers null.
    let (status, reply, _) = post(
        &server,
        "/graphql",
        Some(API_KEY),
        &json!({ "query": "query { getChannel { name } }" }).to_string(),
    )
    .await;
    assert_eq!(
        (status, reply),
        (200, json!({ "data": { "getChannel": null } }))
    );

    // /metrics: the sockets under the app's id, the POSTs as API requests
    // (an unknown key under no app).
    let (status, _, _) = post(&server, "/graphql", Some("no-such-key"), "{}").await;
    assert_eq!(status, 401);
    let scrape = server.scrape().await;
    let graphql = [("app", APP_ID), ("protocol", "appsync-graphql")];
    assert!(metric_in(&scrape, "herald_connections_opened_total", &graphql).unwrap() >= 1);
    let published = [
        ("app", APP_ID),
        ("protocol", "appsync-graphql"),
        ("endpoint", "graphql"),
        ("status", "200"),
    ];
    assert!(metric_in(&scrape, "herald_api_requests_total", &published).unwrap() >= 4);
    let refused = [("app", ""), ("endpoint", "graphql"), ("status", "401")];
    assert_eq!(
        metric_in(&scrape, "herald_api_requests_total", &refused),
        Some(1)
    );
}

#[tokio::test]
async fn graphql_errors_in_appsync_shapes() {
    let server = Server::start_with("", APP).await;
    let mut healthy = bystander_graphql(&server).await;
    let q = "subscription { subscribe(name: \"healthy\") { data } }";

    // Refused connections: bad key, no key, no graphql-ws subprotocol.
    for (path, protocols) in [
        (
            format!(
                "/graphql?header={}",
                base64::engine::general_purpose::STANDARD.encode(auth("wrong").to_string())
            ),
            vec!["graphql-ws".to_string()],
        ),
        (
            "/graphql/realtime".to_string(),
            vec!["graphql-ws".to_string()],
        ),
        (
            "/graphql?header=bm90IGpzb24".to_string(),
            vec!["graphql-ws".to_string()],
        ),
        ("/graphql".to_string(), vec![]),
    ] {
        let mut s = open(&server, &path, &protocols).await;
        s.send(json!({ "type": "connection_init" })).await;
        let e = s.expect("connection_error").await;
        assert!(
            e["payload"]["errors"][0]["errorType"].is_string(),
            "{path}: {e}"
        );
        assert!(s.expect_close().await.is_some());
    }

    let mut s = graphql(&server, "/graphql", API_KEY).await;
    let cases = [
        (
            "mutation { publish(name: \"a\", data: \"1\") { name } }",
            "UnsupportedOperation",
        ),
        ("query { getChannel { name } }", "UnsupportedOperation"),
        (
            "subscription { subscribe(name: \"a\") { name",
            "InvalidSyntax",
        ),
        (
            "subscription { other(name: \"a\") { name } }",
            "ValidationError",
        ),
        (
            "subscription { subscribe(name: \"a\") { nope } }",
            "ValidationError",
        ),
        ("subscription { subscribe { name } }", "ValidationError"),
    ];
    for (i, (query, error_type)) in cases.iter().enumerate() {
        let e = start(&mut s, &format!("e{i}"), query, json!({})).await;
        assert_eq!(e["type"], "error", "{query}: {e}");
        assert_eq!(e["id"], format!("e{i}"));
        assert_eq!(
            e["payload"]["errors"][0]["errorType"], *error_type,
            "{query}: {e}"
        );
    }
    // A start with a wrong key in its own authorization.
    let data = json!({ "query": q }).to_string();
    s.send(json!({ "type": "start", "id": "k", "payload": { "data": data, "extensions": { "authorization": auth("wrong") } } }))
        .await;
    assert_eq!(
        s.expect("error").await["payload"]["errors"][0]["errorType"],
        "UnauthorizedException"
    );
    // Malformed messages.
    for input in [
        "not json".to_string(),
        "[]".to_string(),
        r#"{"type":"start","id":"x"}"#.to_string(),
        r#"{"type":"start","id":"x","payload":{"data":"{not json"}}"#.to_string(),
        r#"{"type":"start","payload":{}}"#.to_string(),
        r#"{"type":"connection_terminate"}"#.to_string(),
        r#"{"type":"stop"}"#.to_string(),
    ] {
        s.send_text(&input).await;
        let e = s.expect("error").await;
        assert!(
            e["payload"]["errors"][0]["message"].is_string(),
            "{input}: {e}"
        );
    }
    // A duplicate id.
    assert_eq!(
        start(&mut s, "dup", q, json!({})).await["type"],
        "start_ack"
    );
    let e = start(&mut s, "dup", q, json!({})).await;
    assert_eq!(e["type"], "error", "{e}");

    // HTTP: bad key, bad body, bad operations.
    let good = json!({ "query": "mutation { publish(name: \"healthy\", data: \"1\") { name } }" })
        .to_string();
    for key in [None, Some("wrong")] {
        let (status, reply, error_type) = post(&server, "/graphql", key, &good).await;
        assert_eq!(
            (status, error_type.as_deref()),
            (401, Some("UnauthorizedException")),
            "{reply}"
        );
    }
    // Not GraphQL requests: 400. Documents outside the schema: 200 with
    // `errors` and null `data`, as GraphQL clients read them.
    for (body, want) in [
        ("not json".to_string(), 400),
        ("{}".to_string(), 400),
        (json!({ "query": "{ __typename }", "variables": [1] }).to_string(), 400),
        (json!({ "query": "mutation { delete(name: \"a\") { name } }" }).to_string(), 200),
        (json!({ "query": "mutation { publish(name: \"a\", data: \"not json\") { name } }" }).to_string(), 200),
        (json!({ "query": "subscription { subscribe(name: \"a\") { name } }" }).to_string(), 200),
        (json!({ "query": "mutation($d: AWSJSON!) { publish(name: \"a\", data: $d) { name } }", "variables": { "d": 1 } }).to_string(), 200),
        (json!({ "query": "mutation { publish(name: \"a\" data: \"1\") { name" }).to_string(), 200),
    ] {
        let (status, reply, error_type) = post(&server, "/graphql", Some(API_KEY), &body).await;
        assert_eq!(status, want, "{body}: {reply}");
        if want == 200 {
            assert_eq!(reply["data"], Value::Null, "{body}: {reply}");
        }
        assert!(reply["errors"][0]["message"].is_string(), "{body}: {reply}");
        assert!(error_type.is_some(), "{body}");
    }
    // The server goes on serving.
    let (status, _, _) = post(&server, "/graphql", Some(API_KEY), &good).await;
    assert_eq!(status, 200);
    assert_eq!(
        healthy.expect("data").await["payload"]["data"]["subscribe"]["data"],
        "1"
    );
}

#[tokio::test]
async fn browsers_may_publish_cross_origin() {
    let server = Server::start_with("", APP).await;
    let http = reqwest::Client::new();
    for path in ["/event", "/graphql"] {
        let res = http
            .request(reqwest::Method::OPTIONS, server.url(path))
            .header("origin", "https://app.example.com")
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "content-type,x-api-key,x-amz-user-agent",
            )
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 204, "{path}");
        let h = res.headers();
        assert_eq!(h["access-control-allow-origin"], "*");
        assert!(h["access-control-allow-methods"]
            .to_str()
            .unwrap()
            .contains("POST"));
        let allowed = h["access-control-allow-headers"].to_str().unwrap();
        for want in ["content-type", "x-api-key", "x-amz-user-agent"] {
            assert!(allowed.contains(want), "{allowed}");
        }
    }
    let res = http
        .post(server.url("/event"))
        .header("origin", "https://app.example.com")
        .header("x-api-key", API_KEY)
        .body(json!({ "channel": "/ns/a", "events": ["1"] }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["access-control-allow-origin"], "*");
}

#[tokio::test]
async fn development_app_key_is_accepted_on_the_embedded_default() {
    // No apps in the file: the development app, whose key is an API key
    // and for which every namespace is open.
    let dir = std::env::temp_dir().join(format!("herald-appsync-dev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for _ in 0..5 {
        let port = free_port();
        let port_arg = port.to_string();
        let mut herald = Spawned::serve(&dir, &["--port", &port_arg, "--log", "warn"], &[]);
        if herald.ready_on("127.0.0.1", port, &[]).await.is_err() {
            continue;
        }
        let http = reqwest::Client::new();
        let res = http
            .post(format!("http://127.0.0.1:{port}/event"))
            .header("x-api-key", "app-key")
            .body(json!({ "channel": "/anything/at/all", "events": ["1"] }).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let res = http
            .post(format!("http://127.0.0.1:{port}/graphql"))
            .header("x-api-key", "app-key")
            .body(
                json!({ "query": "mutation { publish(name: \"n\", data: \"1\") { name } }" })
                    .to_string(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        drop(herald);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    panic!("herald did not start");
}

#[tokio::test]
async fn shutdown_closes_appsync_sockets_with_going_away() {
    let mut server = Server::start_with("", APP).await;
    let mut e = events(&server, API_KEY).await;
    assert_eq!(
        subscribe(&mut e, "s", "/ns/a").await["type"],
        "subscribe_success"
    );
    let mut g = graphql(&server, "/graphql", API_KEY).await;
    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(server.pid(), libc::SIGTERM) }, 0);
    assert_eq!(e.expect_close().await, Some(1001));
    assert_eq!(g.expect_close().await, Some(1001));
    assert!(server.wait_exit().await.success());
}

/// Each protocol's channels are a namespace of their own in the app's hub:
/// a Pusher channel, an Action Cable stream and a GraphQL channel all named
/// `room` are three channels. A publication to one never reaches another's
/// subscriber, and Pusher's HTTP API lists and counts Pusher channels only.
/// (Merge the namespaces and each of the `next frame` assertions below
/// fails: publications on one worker are delivered in order, so a leaked
/// one arrives before the marker that follows it.)
#[tokio::test]
async fn protocols_channels_of_one_name_never_meet() {
    let server = Server::start_with("[rpc]\npublic_streams = true", APP).await;
    let mut e = events(&server, API_KEY).await;
    assert_eq!(
        subscribe(&mut e, "s", "/default/room").await["type"],
        "subscribe_success"
    );
    let mut g = graphql(&server, "/graphql/realtime", API_KEY).await;
    let query = "subscription Subscribe($name: String!) { subscribe(name: $name) { name data } }";
    assert_eq!(
        start(&mut g, "g", query, json!({ "name": "room" })).await["type"],
        "start_ack"
    );
    let mut req = format!("ws://127.0.0.1:{}/cable", server.port)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        HeaderValue::from_static("actioncable-v1-json"),
    );
    let (mut cable, _) = tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(req))
        .await
        .expect("connect timed out")
        .expect("connect");
    // Two streams: `room` (a Pusher channel has the same name) and
    // `cable-only` (a valid Pusher name no Pusher client uses).
    for stream in ["room", "cable-only"] {
        let id = json!({ "channel": "$pubsub", "stream_name": stream }).to_string();
        let cmd = json!({ "command": "subscribe", "identifier": id }).to_string();
        cable.send(Message::text(cmd)).await.unwrap();
        loop {
            match next(&mut cable).await {
                Next::Frame(f) if f["type"] == "confirm_subscription" => break,
                Next::Frame(f) => assert!(f["type"] == "welcome" || f["type"] == "ping", "{f}"),
                Next::Close(c) => panic!("cable closed: {c:?}"),
            }
        }
    }
    let mut p = server.client().await;
    p.subscribe("room").await;

    // Pusher's channel list and figures: its own channels only.
    let (status, body) = server.api("GET", "/apps/test-app/channels", "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({ "channels": { "room": {} } }));
    let (status, body) = server
        .api("GET", "/apps/test-app/channels/cable-only", "")
        .await;
    assert_eq!((status, body), (200, json!({ "occupied": false })));

    // The next message an Action Cable client gets, past pings.
    async fn cable_message(ws: &mut common::Ws) -> Value {
        loop {
            match next(ws).await {
                Next::Frame(f) if f["type"] == "ping" => continue,
                Next::Frame(f) => return f,
                Next::Close(c) => panic!("cable closed: {c:?}"),
            }
        }
    }
    async fn pusher_event(server: &Server, name: &str) {
        let body = json!({ "name": name, "channel": "room", "data": "\"p\"" }).to_string();
        let (status, reply) = server.api("POST", "/apps/test-app/events", &body).await;
        assert_eq!(status, 200, "{reply}");
    }
    async fn cable_broadcast(server: &Server, n: u32) {
        let body = json!({ "stream": "room", "data": json!({ "n": n }).to_string() });
        let resp = reqwest::Client::new()
            .post(server.url("/_broadcast"))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
    }

    // Pusher, then Action Cable, then GraphQL, then a marker on each: every
    // subscriber's next message is its own protocol's.
    pusher_event(&server, "first").await;
    cable_broadcast(&server, 1).await;
    publish_graphql(&server, "room", "{\"g\":1}").await;
    pusher_event(&server, "marker").await;
    cable_broadcast(&server, 2).await;

    p.expect("first", Some("room")).await;
    p.expect("marker", Some("room")).await;
    for n in [1, 2] {
        let f = cable_message(&mut cable).await;
        assert_eq!(f["message"], json!({ "n": n }), "{f}");
    }
    let d = g.expect("data").await;
    assert_eq!(
        d["payload"]["data"]["subscribe"]["data"], "{\"g\":1}",
        "{d}"
    );
    // The Events subscriber of `/default/room` got none of them: its next
    // message is an Events publication.
    let (status, reply, _) = post_event(&server, "/default/room", json!(["\"e\""])).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(e.expect("data").await["event"], "\"e\"");
    // And GraphQL's next is its own again.
    publish_graphql(&server, "room", "{\"g\":2}").await;
    let d = g.expect("data").await;
    assert_eq!(
        d["payload"]["data"]["subscribe"]["data"], "{\"g\":2}",
        "{d}"
    );
    // The hub holds all five channels, each in its namespace.
    let metric = server.metric("herald_channels").await;
    assert!(metric >= 5, "herald_channels {metric}");
}

/// Every place a GraphQL document can nest, each 2,000 deep in about 4 KiB
/// (deep enough to overflow a worker's stack before the bound existed).
fn deeply_nested_documents() -> Vec<(&'static str, String)> {
    let n = 2_000;
    let list = format!("{}\"r\"{}", "[".repeat(n), "]".repeat(n));
    let object = format!("{}\"r\"{}", "{a:".repeat(n), "}".repeat(n));
    let selection = format!("{}a{}", "a{".repeat(n), "}".repeat(n));
    let list_type = format!("{}String{}", "[".repeat(n), "]".repeat(n));
    vec![
        (
            "argument list",
            format!("subscription {{ subscribe(name: {list}) {{ name }} }}"),
        ),
        (
            "argument object",
            format!("subscription {{ subscribe(name: {object}) {{ name }} }}"),
        ),
        (
            "directive argument",
            format!("subscription {{ subscribe(name: \"a\") @skip(if: {list}) {{ name }} }}"),
        ),
        (
            "field directive argument",
            format!("subscription {{ subscribe(name: \"a\") {{ name @include(if: {object}) }} }}"),
        ),
        (
            "variable default",
            format!("subscription S($n: String = {list}) {{ subscribe(name: $n) {{ name }} }}"),
        ),
        (
            "variable type",
            format!("subscription S($n: {list_type}) {{ subscribe(name: \"a\") {{ name }} }}"),
        ),
        (
            "selection set",
            format!("subscription {{ subscribe(name: \"a\") {{ {selection} }} }}"),
        ),
        (
            "mutation argument",
            format!("mutation {{ publish(name: \"a\", data: {list}) {{ name }} }}"),
        ),
        (
            "fragment",
            format!("subscription {{ subscribe(name: \"a\") {{ ...F }} }} fragment F on Channel {{ {selection} }}"),
        ),
    ]
}

#[tokio::test]
async fn deeply_nested_or_multiplying_graphql_is_refused_on_both_transports() {
    let server = Server::start_with("", APP).await;
    let mut healthy = bystander_graphql(&server).await;
    let mut ws = graphql(&server, "/graphql/realtime", API_KEY).await;
    for (i, (form, query)) in deeply_nested_documents().into_iter().enumerate() {
        assert!(query.len() < 16 * 1024, "{form} fits the size limit");
        // Over HTTP: a 400 naming the bound, not a dropped connection.
        let body = json!({ "query": query }).to_string();
        let (status, reply, error_type) = post(&server, "/graphql", Some(API_KEY), &body).await;
        assert_eq!(status, 400, "{form}: {reply}");
        assert_eq!(error_type.as_deref(), Some("BadRequestException"), "{form}");
        let message = reply["errors"][0]["message"].as_str().unwrap_or_default();
        assert!(message.contains("nests deeper than 64"), "{form}: {reply}");
        // Over the WebSocket: an `error` for that id, and the socket lives on.
        let reply = start(&mut ws, &format!("deep-{i}"), &query, json!({})).await;
        assert_eq!(reply["type"], "error", "{form}: {reply}");
        assert_eq!(reply["id"], format!("deep-{i}"), "{form}");
        let error = &reply["payload"]["errors"][0];
        assert_eq!(error["errorType"], "BadRequestException", "{form}: {reply}");
        // And the process is alive and serving.
        assert!(is_ready("127.0.0.1", server.port).await, "{form}");
    }
    // JSON around the document (the body, `variables`, the WebSocket's
    // `payload.data`) is bounded by serde_json at 128 levels: refused.
    let deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
    let body = format!(r#"{{"query":"{{ __typename }}","variables":{{"v":{deep}}}}}"#);
    let (status, reply, _) = post(&server, "/graphql", Some(API_KEY), &body).await;
    assert_eq!(status, 400, "{reply}");
    ws.send(json!({ "type": "start", "id": "deep-json", "payload": { "data": deep } }))
        .await;
    assert_eq!(ws.recv().await["type"], "error");
    // Fragments that multiply (16 levels, each spreading the next 4 times:
    // 4^15 paths in under 1 KiB) are refused after 1,024 selections, not
    // walked for hours on a worker thread.
    let mut q = String::from("mutation { publish(name: \"a\", data: \"1\") { ...F0 } }");
    for i in 0..15 {
        q += &format!(
            " fragment F{i} on Channel {{ ...F{n} ...F{n} ...F{n} ...F{n} }}",
            n = i + 1
        );
    }
    q += " fragment F15 on Channel { data @skip(if: true) }";
    let (status, reply, _) = post(
        &server,
        "/graphql",
        Some(API_KEY),
        &json!({ "query": q }).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    let message = reply["errors"][0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("more than 1024 selections"), "{reply}");
    // The same socket still subscribes; the bystander still gets events.
    let q = "subscription { subscribe(name: \"after\") { data } }";
    assert_eq!(
        start(&mut ws, "after", q, json!({})).await["type"],
        "start_ack"
    );
    publish_graphql(&server, "healthy", "1").await;
    assert_eq!(
        healthy.expect("data").await["payload"]["data"]["subscribe"]["data"],
        "1"
    );
    // Nesting within the bound is not refused for its depth: a valid
    // document with the deepest selection the schema has still works.
    let (status, reply, _) = post(
        &server,
        "/graphql",
        Some(API_KEY),
        &json!({ "query": "mutation { a: publish(name: \"healthy\", data: \"[[[[2]]]]\") { ... on Channel { ... on Channel { data } } } }" }).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["data"]["a"]["data"], "[[[[2]]]]", "{reply}");
}

/// Wait until `s`'s counter `name` is at least `want`.
async fn until_metric(s: &Server, name: &str, want: u64) {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let got = metric_in(&s.scrape().await, name, &[]).unwrap_or(0);
        if got >= want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} stayed at {got}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

// A confirmation is true, on both AppSync APIs: on a node whose broker is not up
// yet, `subscribe_success` and `start_ack` wait until the broker holds the
// interest (then everything published through another node arrives), and
// after `broker.confirm_timeout` the answer is the retryable
// `ServiceUnavailableException`, never a confirmation.
#[tokio::test]
async fn confirmations_wait_for_the_broker_on_both_apis() {
    use herald_broker::testing::{BrokerServer, Kind};
    let mut broker = BrokerServer::start(Kind::Redis);
    broker.kill();
    let url = broker.url();
    let top = |confirm: u64| {
        format!(
            "[broker]\nurl = \"{}\"\nprefix = \"as-confirm\"\nconfirm_timeout = {confirm}\n",
            url
        )
    };
    let q = "subscription { subscribe(name: \"news\") { name data } }";

    // The bound: retryable errors.
    let gives_up = Server::start_serving(&top(1), APP).await;
    let mut e = events(&gives_up, API_KEY).await;
    let m = subscribe(&mut e, "e1", "/default/news").await;
    assert_eq!(m["type"], "subscribe_error", "{m}");
    assert_eq!(m["errors"][0]["errorType"], "ServiceUnavailableException");
    let mut g = graphql(&gives_up, "/graphql", API_KEY).await;
    let m = start(&mut g, "g1", q, json!({})).await;
    assert_eq!(m["type"], "error", "{m}");
    assert_eq!(m["id"], "g1");
    assert_eq!(
        m["payload"]["errors"][0]["errorType"],
        "ServiceUnavailableException"
    );

    // Held until the broker holds the interest.
    let waits = Server::start_serving(&top(30), APP).await;
    let mut e = events(&waits, API_KEY).await;
    e.send(json!({ "type": "subscribe", "id": "e2", "channel": "/default/news", "authorization": auth(API_KEY) }))
        .await;
    let mut g = graphql(&waits, "/graphql", API_KEY).await;
    let data = json!({ "query": q, "variables": {} }).to_string();
    g.send(json!({
        "type": "start", "id": "g2",
        "payload": { "data": data, "extensions": { "authorization": auth(API_KEY) } },
    }))
    .await;
    until_metric(&waits, "herald_confirmations_held_total", 2).await;
    for s in [&mut e, &mut g] {
        if let Ok(m) = tokio::time::timeout(std::time::Duration::from_millis(300), s.recv()).await {
            panic!("answered while the broker was away: {m}");
        }
    }
    broker.restart();
    let first = Server::start_with(&top(30), APP).await;
    assert_eq!(e.expect("subscribe_success").await["id"], "e2");
    assert_eq!(g.expect("start_ack").await["id"], "g2");
    for i in 0..20 {
        let (status, reply, _) = post_event(
            &first,
            "/default/news",
            json!([json!({ "i": i }).to_string()]),
        )
        .await;
        assert_eq!(status, 200, "{reply}");
    }
    for i in 0..20 {
        let m = e.expect("data").await;
        let event: Value = serde_json::from_str(m["event"].as_str().unwrap()).unwrap();
        assert_eq!(event["i"], i, "{m}");
    }
    publish_graphql(&first, "news", "{\"x\":1}").await;
    let m = g.expect("data").await;
    assert_eq!(m["id"], "g2", "{m}");
}
