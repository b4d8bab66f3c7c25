//! Allowed origins against a real `herald`, with the `Origin` header a
//! browser sends, on every browser-facing endpoint: the Pusher WebSocket
//! (refused with `pusher:error` 4009 and a 4009 close, as Reverb does),
//! `/cable` (HTTP 403 at the upgrade, as AnyCable), both AppSync
//! real-time endpoints (`connection_error`, `UnauthorizedException`) and
//! both AppSync HTTP publish endpoints (403), pusher-js's HTTP transports
//! and Server-Sent Events (403). A listed host, a wildcard's
//! subdomain and a request without `Origin` (not a browser) pass; suffix
//! tricks, `null` and other sites are refused, and counted.

use crate::common;

use base64::Engine;
use common::*;
use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

const API_KEY: &str = "test-api-key";
const APP: &str = "api_keys = [\"test-api-key\"]\n\
                   allowed_origins = [\"app.example.com\", \"*.example.org\", \"http://localhost:3000\"]";

/// Origins the app lists (or that a pattern covers).
const ALLOWED: &[&str] = &[
    "https://app.example.com",
    "http://app.example.com:8080",
    "https://eu.example.org",
    "https://a.b.example.org",
    "http://localhost:3000",
];

/// Origins that must be refused: other sites, suffix tricks, `null`.
const FOREIGN: &[&str] = &[
    "https://evil.net",
    "https://app.example.com.evil.net",
    "https://example.org.evil.net",
    "https://evilexample.org",
    "https://example.org",
    "https://localhost:3000",
    "null",
];

fn request(
    url: &str,
    origin: Option<&str>,
    protocols: &[String],
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    let mut req = url.into_client_request().unwrap();
    if let Some(o) = origin {
        req.headers_mut()
            .insert("origin", HeaderValue::from_str(o).unwrap());
    }
    if !protocols.is_empty() {
        req.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_str(&protocols.join(", ")).unwrap(),
        );
    }
    req
}

/// Open a WebSocket; Err(status) when the upgrade is answered with HTTP.
async fn open(url: &str, origin: Option<&str>, protocols: &[String]) -> Result<Ws, u16> {
    let req = request(url, origin, protocols);
    match tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(req))
        .await
        .expect("connect timed out")
    {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(res)) => Err(res.status().as_u16()),
        Err(e) => panic!("connect: {e}"),
    }
}

/// The first frame that is not a keep-alive or a ping.
async fn first(ws: &mut Ws) -> Value {
    loop {
        match next(ws).await {
            Next::Frame(f) if f["type"] == "ka" || f["type"] == "ping" => continue,
            Next::Frame(f) => return f,
            Next::Close(c) => panic!("closed ({c:?}) before a frame"),
        }
    }
}

async fn pusher(server: &Server, origin: Option<&str>) -> Ws {
    let url = server.ws_url(APP_KEY, "?protocol=7&client=js&version=8.4.0");
    open(&url, origin, &[]).await.expect("Pusher upgrades")
}

#[tokio::test]
async fn pusher_websocket_refuses_foreign_origins_with_4009() {
    let server = Server::start_with("", APP).await;
    for origin in ALLOWED.iter().map(|o| Some(*o)).chain([None]) {
        let mut ws = pusher(&server, origin).await;
        let f = first(&mut ws).await;
        assert_eq!(
            f["event"], "pusher:connection_established",
            "{origin:?}: {f}"
        );
    }
    for origin in FOREIGN {
        let mut ws = pusher(&server, Some(origin)).await;
        let f = first(&mut ws).await;
        assert_eq!(f["event"], "pusher:error", "{origin}: {f}");
        assert_eq!(data(&f)["code"], 4009, "{origin}: {f}");
        assert_eq!(data(&f)["message"], "Origin not allowed", "{origin}: {f}");
        match next(&mut ws).await {
            Next::Close(c) => assert_eq!(c, Some(4009), "{origin}"),
            Next::Frame(f) => panic!("{origin}: a frame after the refusal: {f}"),
        }
    }
    let refused = server
        .metric_where(
            "herald_origins_refused_total",
            &[("app", APP_ID), ("protocol", "pusher")],
        )
        .await;
    assert_eq!(refused, FOREIGN.len() as u64);
    // The refusals took nothing from the app: it still serves.
    let mut c = server.client().await;
    c.subscribe("still").await;
}

#[tokio::test]
async fn cable_refuses_foreign_origins_with_403() {
    let server = Server::start_with("", APP).await;
    let url = format!("ws://127.0.0.1:{}/cable", server.port);
    let protocols = ["actioncable-v1-json".to_owned()];
    for origin in ALLOWED.iter().map(|o| Some(*o)).chain([None]) {
        let mut ws = open(&url, origin, &protocols)
            .await
            .unwrap_or_else(|s| panic!("{origin:?}: HTTP {s}"));
        assert_eq!(first(&mut ws).await["type"], "welcome", "{origin:?}");
    }
    for origin in FOREIGN {
        let status = open(&url, Some(origin), &protocols).await.err();
        assert_eq!(status, Some(403), "{origin}");
    }
    let refused = server
        .metric_where(
            "herald_origins_refused_total",
            &[("app", APP_ID), ("protocol", "actioncable")],
        )
        .await;
    assert_eq!(refused, FOREIGN.len() as u64);
}

fn header_protocol(key: &str) -> String {
    let auth = json!({ "host": "example.com", "x-api-key": key }).to_string();
    format!(
        "header-{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(auth)
    )
}

#[tokio::test]
async fn appsync_realtime_endpoints_refuse_foreign_origins() {
    let server = Server::start_with("", APP).await;
    let header = base64::engine::general_purpose::STANDARD
        .encode(json!({ "host": "example.com", "x-api-key": API_KEY }).to_string());
    // (path, subprotocols, where the errors are)
    let endpoints = [
        (
            "/event/realtime".to_owned(),
            vec!["aws-appsync-event-ws".to_owned(), header_protocol(API_KEY)],
            "/errors/0",
        ),
        (
            format!("/graphql?header={header}&payload=e30="),
            vec!["graphql-ws".to_owned()],
            "/payload/errors/0",
        ),
        (
            format!("/graphql/realtime?header={header}&payload=e30="),
            vec!["graphql-ws".to_owned()],
            "/payload/errors/0",
        ),
    ];
    for (path, protocols, errors) in &endpoints {
        let url = format!("ws://127.0.0.1:{}{path}", server.port);
        for origin in [Some("https://app.example.com"), None] {
            let mut ws = open(&url, origin, protocols).await.unwrap();
            ws.send(Message::text(r#"{"type":"connection_init"}"#))
                .await
                .unwrap();
            assert_eq!(
                first(&mut ws).await["type"],
                "connection_ack",
                "{path} {origin:?}"
            );
        }
        for origin in FOREIGN {
            let mut ws = open(&url, Some(origin), protocols).await.unwrap();
            ws.send(Message::text(r#"{"type":"connection_init"}"#))
                .await
                .unwrap();
            let f = first(&mut ws).await;
            assert_eq!(f["type"], "connection_error", "{path} {origin}: {f}");
            let e = f.pointer(errors).expect("an error");
            assert_eq!(e["errorType"], "UnauthorizedException", "{f}");
            assert_eq!(e["message"], "Origin not allowed", "{f}");
        }
    }
    let scrape = server.scrape().await;
    for protocol in ["appsync-events", "appsync-graphql"] {
        let per_endpoint = if protocol == "appsync-events" { 1 } else { 2 };
        let n = metric_in(
            &scrape,
            "herald_origins_refused_total",
            &[("app", APP_ID), ("protocol", protocol)],
        );
        assert_eq!(n, Some(per_endpoint * FOREIGN.len() as u64), "{protocol}");
    }
}

#[tokio::test]
async fn appsync_http_publish_refuses_foreign_origins() {
    let server = Server::start_with("", APP).await;
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value, origin: Option<&str>| {
        let mut req = http
            .post(server.url(path))
            .header("x-api-key", API_KEY)
            .body(body.to_string());
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        async move {
            let res = tokio::time::timeout(TIMEOUT, req.send())
                .await
                .expect("timed out")
                .expect("request");
            let status = res.status().as_u16();
            let kind = res
                .headers()
                .get("x-amzn-errortype")
                .map(|v| v.to_str().unwrap().to_owned());
            (status, kind)
        }
    };
    let event = json!({ "channel": "/default/ch", "events": ["\"hi\""] });
    let graphql = json!({
        "query": "mutation PublishData($name: String!, $data: AWSJSON!) { publish(name: $name, data: $data) { name data } }",
        "variables": { "name": "ch", "data": "{}" },
    });
    for (path, body) in [("/event", &event), ("/graphql", &graphql)] {
        for origin in [Some("https://eu.example.org"), None] {
            let (status, _) = post(path, body.clone(), origin).await;
            assert_eq!(status, 200, "{path} {origin:?}");
        }
        for origin in FOREIGN {
            let (status, kind) = post(path, body.clone(), Some(origin)).await;
            assert_eq!(status, 403, "{path} {origin}");
            assert_eq!(
                kind.as_deref(),
                Some("UnauthorizedException"),
                "{path} {origin}"
            );
        }
    }
    let refused = server
        .metric_where(
            "herald_origins_refused_total",
            &[("app", APP_ID), ("protocol", "appsync")],
        )
        .await;
    assert_eq!(refused, 2 * FOREIGN.len() as u64);
}

/// `HERALD_ALLOWED_ORIGINS` and the peers' names set the single app's list.
#[tokio::test]
async fn the_environment_sets_the_single_apps_origins() {
    for var in [
        "HERALD_ALLOWED_ORIGINS",
        "ANYCABLE_ALLOWED_ORIGINS",
        "SOCKUDO_DEFAULT_APP_ALLOWED_ORIGINS",
    ] {
        let server =
            Server::start_with_env("", "", &[(var, "app.example.com, *.example.org")]).await;
        let mut ws = pusher(&server, Some("https://x.example.org")).await;
        assert_eq!(
            first(&mut ws).await["event"],
            "pusher:connection_established",
            "{var}"
        );
        let mut ws = pusher(&server, Some("https://example.org.evil.net")).await;
        let f = first(&mut ws).await;
        assert_eq!(data(&f)["code"], 4009, "{var}: {f}");
    }
}

#[tokio::test]
async fn a_bad_pattern_is_refused_at_start_naming_its_entry() {
    let dir = std::env::temp_dir().join(format!("herald-origins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("herald.toml");
    std::fs::write(
        &path,
        "[[apps]]\nid = \"a\"\nkey = \"k\"\nsecret = \"s\"\n\
         allowed_origins = [\"app.example.com\", \"https://x.com/path\"]\n",
    )
    .unwrap();
    let out = output_within(
        herald_command()
            .args(["config", "--check", "--config"])
            .arg(&path),
        TIMEOUT,
    );
    let err =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("apps[0].allowed_origins[1]"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// pusher-js's HTTP fallback (`xhr_streaming`, `xhr_polling`) is checked
/// as its WebSocket is: a foreign page's session opens, hears 4009
/// `Origin not allowed` and closes, before any session exists.
#[tokio::test]
async fn pusher_http_transports_refuse_foreign_origins() {
    let server = Server::start_with("", APP).await;
    let http = reqwest::Client::new();
    for (n, transport) in ["xhr_streaming", "xhr"].into_iter().enumerate() {
        for (m, origin) in FOREIGN.iter().enumerate() {
            let url = server.url(&format!(
                "/pusher/app/{APP_KEY}/1/s{n}x{m}/{transport}?protocol=7"
            ));
            let res =
                tokio::time::timeout(TIMEOUT, http.post(url).header("origin", *origin).send())
                    .await
                    .expect("timed out")
                    .expect("request");
            let body = tokio::time::timeout(TIMEOUT, res.text())
                .await
                .unwrap()
                .unwrap();
            assert!(body.starts_with("o\n"), "{transport} {origin}: {body:?}");
            assert!(
                body.contains("4009") && body.contains("Origin not allowed"),
                "{transport} {origin}: {body:?}"
            );
        }
        // A listed page gets its session: `o`, then (streaming) the
        // connection's first frame.
        let url = server.url(&format!(
            "/pusher/app/{APP_KEY}/1/ok{n}/{transport}?protocol=7"
        ));
        let res = http
            .post(url)
            .header("origin", "https://app.example.com")
            .send()
            .await
            .unwrap();
        let mut res = res;
        let first = tokio::time::timeout(TIMEOUT, res.chunk())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let first = String::from_utf8_lossy(&first).to_string();
        assert!(first.starts_with("o"), "{transport}: {first:?}");
        assert!(!first.contains("4009"), "{transport}: {first:?}");
    }
    let refused = server
        .metric_where(
            "herald_origins_refused_total",
            &[("app", APP_ID), ("protocol", "pusher")],
        )
        .await;
    assert_eq!(refused, 2 * FOREIGN.len() as u64);
}

#[tokio::test]
async fn server_sent_events_refuse_foreign_origins_with_403() {
    let server = Server::start_with("[rpc]\npublic_streams = true\nsse = true", APP).await;
    let http = reqwest::Client::new();
    let get = |origin: Option<&str>| {
        let mut req = http.get(server.url("/events?stream=news"));
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        async move {
            tokio::time::timeout(TIMEOUT, req.send())
                .await
                .expect("timed out")
                .expect("request")
                .status()
                .as_u16()
        }
    };
    for origin in ALLOWED.iter().map(|o| Some(*o)).chain([None]) {
        assert_eq!(get(origin).await, 200, "{origin:?}");
    }
    for origin in FOREIGN {
        assert_eq!(get(Some(origin)).await, 403, "{origin}");
    }
    let refused = server
        .metric_where(
            "herald_origins_refused_total",
            &[("app", APP_ID), ("protocol", "actioncable-sse")],
        )
        .await;
    assert_eq!(refused, FOREIGN.len() as u64);
}
