//! Apps changed while running: the config file rewritten, then SIGHUP to a
//! real `herald`. A new app works at once; a rotated secret signs from
//! then on (the old one no longer does) on connections that stayed open
//! and on the HTTP API; a removed or disabled app refuses new connections
//! and API calls, and its open connections are closed with their
//! protocol's code (Pusher 4003, AppSync a 1008 close); a file that no
//! longer parses keeps the apps in force.

use crate::common;

use base64::Engine;
use common::*;
use futures_util::SinkExt;
use serde_json::json;
use std::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

const OTHER: &str = "\n[[apps]]\nid = \"other\"\nkey = \"other-key\"\nsecret = \"other-secret\"\napi_keys = [\"other-api-key\"]\n";

fn hup(server: &Server) {
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(server.pid(), libc::SIGHUP) }, 0);
}

/// Rewrite the server's config file with `edit`, then SIGHUP.
fn change(server: &Server, edit: impl FnOnce(String) -> String) {
    let path = server.config_path();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, edit(text)).unwrap();
    hup(server);
}

/// Connect to `key` until `connection_established` (the reload is
/// applied), within [`TIMEOUT`].
async fn until_established(server: &Server, key: &str) -> Client {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let url = server.ws_url(key, "?protocol=7");
        let (mut ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("connect");
        match next(&mut ws).await {
            Next::Frame(f) if f["event"] == "pusher:connection_established" => {
                let socket_id = data(&f)["socket_id"].as_str().unwrap().to_owned();
                return Client {
                    ws,
                    socket_id,
                    established: f,
                };
            }
            other => {
                assert!(
                    Instant::now() < deadline,
                    "{key} never connected: {other:?}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// The Pusher error code a new connection to `key` is refused with.
async fn refused_with(server: &Server, key: &str) -> u16 {
    let mut ws = server.raw_ws(key, "?protocol=7").await;
    match next(&mut ws).await {
        Next::Frame(f) if f["event"] == "pusher:error" => data(&f)["code"].as_u64().unwrap() as u16,
        other => panic!("{key}: not refused: {other:?}"),
    }
}

async fn api_as(server: &Server, key: &str, secret: &str, path: &str, body: &str) -> u16 {
    let query = herald_pusher::auth::sign_query(key, secret, "POST", path, body.as_bytes(), &[]);
    server.raw_api("POST", path, &query, body).await.0
}

fn event(channel: &str) -> String {
    json!({ "name": "e", "channel": channel, "data": "{}" }).to_string()
}

async fn appsync_events(server: &Server, api_key: &str) -> Ws {
    let auth = json!({ "host": "example.com", "x-api-key": api_key }).to_string();
    let header = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(auth);
    let mut req = format!("ws://127.0.0.1:{}/event/realtime", server.port)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        HeaderValue::from_str(&format!("aws-appsync-event-ws, header-{header}")).unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    ws.send(Message::text(r#"{"type":"connection_init"}"#))
        .await
        .unwrap();
    match next(&mut ws).await {
        Next::Frame(f) => assert_eq!(f["type"], "connection_ack", "{f}"),
        Next::Close(c) => panic!("closed {c:?}"),
    }
    ws
}

#[tokio::test]
async fn sighup_adds_rotates_and_removes_apps() {
    let server = Server::start_with("", OTHER).await;
    let mut open = server.client().await;
    open.subscribe("news").await;
    let mut other = until_established(&server, "other-key").await;
    let mut other_appsync = appsync_events(&server, "other-api-key").await;
    assert_eq!(refused_with(&server, "new-key").await, 4001);

    // Rotate the test app's secret, remove `other`, add `new`.
    change(&server, |text| {
        let text = text.replace(OTHER, "");
        text.replace("secret = \"test-secret\"", "secret = \"rotated\"")
            + "\n[[apps]]\nid = \"new\"\nkey = \"new-key\"\nsecret = \"new-secret\"\n"
    });
    let mut fresh = until_established(&server, "new-key").await;
    fresh.subscribe("hello").await;

    // The removed app's open connections were closed with its protocol's code.
    other.expect_closed_with(4003).await;
    let mut said = Vec::new();
    loop {
        match next(&mut other_appsync).await {
            Next::Close(c) => {
                assert_eq!(c, Some(1008), "{said:?}");
                break;
            }
            Next::Frame(f) if f["type"] == "ka" => {}
            Next::Frame(f) => said.push(f),
        }
    }
    assert!(
        said.iter()
            .all(|f| f["type"] == "error" && f["errors"][0]["errorType"] == "UnauthorizedException"),
        "{said:?}"
    );
    // ... and it refuses new ones and its API.
    assert_eq!(refused_with(&server, "other-key").await, 4001);
    let path = "/apps/other/events";
    assert_ne!(
        api_as(&server, "other-key", "other-secret", path, &event("x")).await,
        200
    );

    // The rotated secret signs from now on; the old one no longer does.
    let path = "/apps/test-app/events";
    assert_eq!(
        api_as(&server, APP_KEY, APP_SECRET, path, &event("news")).await,
        401
    );
    assert_eq!(
        api_as(&server, APP_KEY, "rotated", path, &event("news")).await,
        200
    );
    // The connection that stayed open is on the same app: it gets the event.
    let f = open.expect("e", Some("news")).await;
    assert_eq!(f["data"], "{}");
    // Its private subscriptions are checked with the new secret.
    let old = private_auth(&open.socket_id, "private-a");
    open.subscribe_raw("private-a", Some(&old), None).await;
    open.expect("pusher:subscription_error", Some("private-a"))
        .await;
    let new = herald_pusher::signing::token(
        APP_KEY,
        "rotated",
        &herald_pusher::signing::channel_string(&open.socket_id, "private-b", None),
    );
    open.subscribe_raw("private-b", Some(&new), None).await;
    open.expect("pusher_internal:subscription_succeeded", Some("private-b"))
        .await;
}

#[tokio::test]
async fn sighup_disables_an_app_and_changes_its_limits() {
    let server = Server::start_with("", "max_payload = 10240").await;
    let mut open = server.client().await;
    open.subscribe("news").await;
    let path = "/apps/test-app/events";
    let big = json!({ "name": "e", "channel": "news", "data": "x".repeat(2000) }).to_string();
    assert_eq!(api_as(&server, APP_KEY, APP_SECRET, path, &big).await, 200);
    open.expect("e", Some("news")).await;

    // A smaller payload limit applies to the next call.
    change(&server, |t| {
        t.replace("max_payload = 10240", "max_payload = 1024")
    });
    let deadline = Instant::now() + TIMEOUT;
    while api_as(&server, APP_KEY, APP_SECRET, path, &big).await != 413 {
        assert!(Instant::now() < deadline, "the new limit never applied");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Events published meanwhile (before the change applied) are skipped.
    let small = event("news");
    assert_eq!(
        api_as(&server, APP_KEY, APP_SECRET, path, &small).await,
        200
    );
    loop {
        let f = open.recv().await;
        if f["data"] == "{}" {
            break;
        }
    }

    // Disabled: the open connection is closed with 4003, new ones are
    // refused with 4003, the API with 403.
    change(&server, |t| {
        t.replace("max_payload = 1024", "max_payload = 1024\nenabled = false")
    });
    open.expect_closed_with(4003).await;
    assert_eq!(refused_with(&server, APP_KEY).await, 4003);
    assert_eq!(
        api_as(&server, APP_KEY, APP_SECRET, path, &small).await,
        403
    );

    // A file that no longer parses keeps the apps in force (and says so).
    change(&server, |t| {
        t.replace("enabled = false", "") + "\nthis is not = = toml\n"
    });
    let deadline = Instant::now() + TIMEOUT;
    while !server.log().contains("apps reload failed") {
        assert!(
            Instant::now() < deadline,
            "no reload error logged:\n{}",
            server.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        refused_with(&server, APP_KEY).await,
        4003,
        "still the old apps"
    );
    // Fixed: enabled again, for new connections.
    change(&server, |t| t.replace("this is not = = toml", ""));
    let mut back = until_established(&server, APP_KEY).await;
    back.subscribe("news").await;
}
