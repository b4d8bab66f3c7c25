//! The connection handshake: `connection_established`, refusals with Pusher
//! close codes, and keep-alive (Pusher-level and WebSocket-level pings).

use crate::common;

use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn connection_established_has_pusher_shape() {
    let server = Server::start_with("activity_timeout = 77", "").await;
    let c = server.client().await;
    let f = &c.established;
    assert_eq!(f["event"], "pusher:connection_established");
    assert!(
        f["data"].is_string(),
        "data must be a JSON-encoded string: {f}"
    );
    assert!(f.get("channel").is_none(), "{f}");
    let d = data(f);
    assert_eq!(d["activity_timeout"], 77);
    let sid = d["socket_id"].as_str().unwrap();
    let (a, b) = sid.split_once('.').expect("socket_id has a '.'");
    assert!(
        !a.is_empty() && a.bytes().all(|c| c.is_ascii_digit()),
        "{sid}"
    );
    assert!(
        !b.is_empty() && b.bytes().all(|c| c.is_ascii_digit()),
        "{sid}"
    );

    let other = server.client().await;
    assert_ne!(other.socket_id, c.socket_id, "socket ids are unique");
}

#[tokio::test]
async fn unknown_app_key_is_refused_with_4001() {
    let server = Server::start().await;
    let ws = server.raw_ws("no-such-key", "?protocol=7").await;
    let mut c = refused(ws);
    c.expect_closed_with(4001).await;
}

/// Pusher itself, soketi, sockudo, Reverb and AnyCable take a connection
/// without `protocol` as the current version (soketi's benchmark script
/// connects so): established, and it receives what is published.
#[tokio::test]
async fn missing_protocol_version_is_taken_as_7() {
    let server = Server::start().await;
    let url = format!("ws://127.0.0.1:{}/app/{APP_KEY}", server.port);
    let mut c = Client::connect(&url).await;
    c.subscribe("news").await;
    server.trigger("news", "headline", "hi").await;
    let f = c.expect("headline", Some("news")).await;
    assert_eq!(f["data"], "hi");
}

#[tokio::test]
async fn unsupported_protocol_versions_are_refused_with_4007() {
    let server = Server::start().await;
    for v in ["8", "4", "99"] {
        let mut c = refused(server.raw_ws(APP_KEY, &format!("?protocol={v}")).await);
        c.expect_closed_with(4007).await;
    }
    // Garbage is an invalid version string, 4006.
    let mut c = refused(server.raw_ws(APP_KEY, "?protocol=seven").await);
    c.expect_closed_with(4006).await;
    // ...and the supported range still connects.
    for v in ["5", "6", "7"] {
        Client::connect(&server.ws_url(APP_KEY, &format!("?protocol={v}"))).await;
    }
}

#[tokio::test]
async fn disabled_app_is_refused_with_4003() {
    let server = Server::start_with("", "enabled = false").await;
    let mut c = refused(server.raw_ws(APP_KEY, "?protocol=7").await);
    c.expect_closed_with(4003).await;
}

#[tokio::test]
async fn connection_quota_is_enforced_with_4004() {
    let server = Server::start_with("", "max_connections = 1").await;
    let first = server.client().await;
    let mut c = refused(server.raw_ws(APP_KEY, "?protocol=7").await);
    c.expect_closed_with(4004).await;
    // The slot comes back when the first client leaves.
    first.close().await;
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let mut ws = server.raw_ws(APP_KEY, "?protocol=7").await;
        match next(&mut ws).await {
            Next::Frame(f) if f["event"] == "pusher:connection_established" => break,
            _ => assert!(std::time::Instant::now() < deadline, "slot never came back"),
        }
        // The server may not have released the slot yet; try again.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn ping_is_answered_with_pong() {
    let server = Server::start().await;
    let mut c = server.client().await;
    c.send(json!({ "event": "pusher:ping", "data": {} })).await;
    c.expect("pusher:pong", None).await;
}

#[tokio::test]
async fn server_pings_after_activity_timeout_and_closes_4201_without_pong() {
    let server = Server::start_with("activity_timeout = 1\npong_timeout = 1", "").await;
    let mut c = server.client().await;
    // A silent client is pinged...
    c.expect("pusher:ping", None).await;
    // ...answering keeps it alive: the next thing is another ping, not a close.
    c.send(json!({ "event": "pusher:pong", "data": {} })).await;
    c.expect("pusher:ping", None).await;
    // Not answering closes it with 4201.
    c.expect_closed_with(4201).await;
}

fn refused(ws: Ws) -> Client {
    Client {
        ws,
        socket_id: String::new(),
        established: serde_json::Value::Null,
    }
}

#[tokio::test]
async fn websocket_pings_count_as_activity() {
    let server = Server::start_with("activity_timeout = 1\npong_timeout = 1", "").await;
    let mut c = server.client().await;
    // 3.5 s: a client silent that long would have been sent pusher:ping
    // after 1 s and closed with 4201 a second later. This one sends only
    // WebSocket ping frames, every 250 ms, and must get nothing but their
    // pongs: no pusher:ping, no close.
    let until = tokio::time::Instant::now() + Duration::from_millis(3500);
    let mut pongs = 0;
    while tokio::time::Instant::now() < until {
        c.ws.send(Message::Ping(b"hb".to_vec().into()))
            .await
            .expect("send a ping");
        let tick = tokio::time::Instant::now() + Duration::from_millis(250);
        while let Ok(msg) = tokio::time::timeout_at(tick, c.ws.next()).await {
            match msg {
                Some(Ok(Message::Pong(p))) => {
                    assert_eq!(&p[..], b"hb");
                    pongs += 1;
                }
                other => panic!("a client sending WebSocket pings got {other:?}"),
            }
        }
    }
    assert!(pongs >= 10, "only {pongs} pongs");
    // Silent from now on, it is pinged: the keep-alive was live all along.
    c.expect("pusher:ping", None).await;
}
