//! `actioncable-v1-ext-json` (issue 19) over real sockets against a real
//! herald: bad history requests get `reject_history` and leave the client
//! connected and served; a forged or used `sid` gets a normal welcome; a
//! closed session restores once, with what it missed.

mod common;

use common::{Server, TIMEOUT};
use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const EXT: &str = "actioncable-v1-ext-json";

async fn cable(server: &Server, query: &str) -> common::Ws {
    let mut req = format!("ws://127.0.0.1:{}/cable{query}", server.port)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("sec-websocket-protocol", EXT.parse().unwrap());
    let (ws, resp) = tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(req))
        .await
        .expect("connect timed out")
        .expect("connect");
    assert_eq!(
        resp.headers()
            .get("sec-websocket-protocol")
            .and_then(|v| v.to_str().ok()),
        Some(EXT)
    );
    ws
}

async fn frame(ws: &mut common::Ws) -> Value {
    loop {
        match common::next(ws).await {
            common::Next::Frame(f) if f["type"] == "ping" => continue,
            common::Next::Frame(f) => return f,
            common::Next::Close(c) => panic!("closed ({c:?}) while a frame was expected"),
        }
    }
}

async fn send(ws: &mut common::Ws, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

async fn broadcast(server: &Server, stream: &str, data: Value) {
    let body = json!({ "stream": stream, "data": data.to_string() }).to_string();
    let resp = reqwest::Client::new()
        .post(server.url("/_broadcast"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
}

fn ident(stream: &str) -> String {
    json!({ "channel": "$pubsub", "stream_name": stream }).to_string()
}

async fn subscribed(server: &Server, stream: &str) -> (common::Ws, String) {
    let mut ws = cable(server, "").await;
    let welcome = frame(&mut ws).await;
    assert_eq!(welcome["type"], "welcome");
    let sid = welcome["sid"].as_str().unwrap().to_owned();
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": ident(stream) }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    (ws, sid)
}

#[tokio::test]
async fn bad_history_requests_are_rejected_and_the_client_stays_served() {
    let server = Server::start_with("[rpc]\npublic_streams = true", "").await;
    let (mut ws, _) = subscribed(&server, "s").await;
    broadcast(&server, "s", json!({ "n": 1 })).await;
    let live = frame(&mut ws).await;
    assert_eq!(live["offset"], 1);
    assert_eq!(live["stream_id"], "s");
    let epoch = live["epoch"].as_str().unwrap().to_owned();
    let id = ident("s");
    let many: serde_json::Map<String, Value> = (0..1001)
        .map(|i| (format!("x{i}"), json!({ "epoch": epoch, "offset": 0 })))
        .collect();
    for (what, history) in [
        (
            "unknown epoch",
            json!({ "streams": { "s": { "epoch": "forged", "offset": 0 } } }),
        ),
        (
            "offset ahead",
            json!({ "streams": { "s": { "epoch": epoch, "offset": 99 } } }),
        ),
        (
            "negative offset",
            json!({ "streams": { "s": { "epoch": epoch, "offset": -1 } } }),
        ),
        ("not an object", json!("since yesterday")),
        ("over 1000 streams", json!({ "streams": many })),
    ] {
        send(
            &mut ws,
            json!({ "command": "history", "identifier": id, "history": history }),
        )
        .await;
        assert_eq!(
            frame(&mut ws).await,
            json!({ "type": "reject_history", "identifier": id }),
            "{what}"
        );
    }
    // A request for a subscription the client does not have: no answer
    // (as anycable-go); the next frame is the next broadcast.
    send(
        &mut ws,
        json!({ "command": "history", "identifier": ident("other"), "history": { "since": 1 } }),
    )
    .await;
    send(&mut ws, json!({ "command": "pong" })).await;
    broadcast(&server, "s", json!({ "n": 2 })).await;
    let f = frame(&mut ws).await;
    assert_eq!(
        (f["message"].clone(), f["offset"].clone()),
        (json!({ "n": 2 }), json!(2))
    );
    assert!(server.metric("herald_cable_history_rejected_total").await >= 2);
}

#[tokio::test]
async fn a_session_restores_once_with_what_it_missed_and_a_forged_sid_connects_anew() {
    let server = Server::start_with("[rpc]\npublic_streams = true", "").await;
    let (mut ws, sid) = subscribed(&server, "r").await;
    assert_eq!(
        sid.split('.').count(),
        3,
        "the sid carries a random part: {sid}"
    );
    broadcast(&server, "r", json!({ "n": 1 })).await;
    let first = frame(&mut ws).await;
    let epoch = first["epoch"].as_str().unwrap().to_owned();
    ws.close(None).await.unwrap();
    drop(ws);
    // The server has the session once the restore works; retry until then.
    let deadline = std::time::Instant::now() + TIMEOUT;
    broadcast(&server, "r", json!({ "n": 2 })).await;
    let mut back = loop {
        let mut ws = cable(&server, &format!("?sid={sid}")).await;
        let welcome = frame(&mut ws).await;
        if welcome["restored"] == true {
            assert_eq!(welcome["restored_ids"], json!([ident("r")]));
            assert_ne!(welcome["sid"], json!(sid));
            break ws;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never restored: {welcome}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    send(
        &mut back,
        json!({ "command": "history", "identifier": ident("r"),
        "history": { "streams": { "r": { "epoch": epoch, "offset": 1 } } } }),
    )
    .await;
    let missed = frame(&mut back).await;
    assert_eq!(
        (missed["message"].clone(), missed["offset"].clone()),
        (json!({ "n": 2 }), json!(2))
    );
    assert_eq!(frame(&mut back).await["type"], "confirm_history");
    // The same sid again, and a forged one: a normal welcome.
    for query in [
        format!("?sid={sid}"),
        "?sid=1.2.0123456789abcdef".to_owned(),
    ] {
        let mut ws = cable(&server, &query).await;
        let welcome = frame(&mut ws).await;
        assert_eq!(welcome["type"], "welcome");
        assert!(welcome.get("restored").is_none(), "{query}: {welcome}");
    }
    assert_eq!(
        server.metric("herald_cable_sessions_restored_total").await,
        1
    );
}

/// A restored client that never asks for its history still gets its live
/// publications (after the restored hold), in order.
#[tokio::test]
async fn a_restored_client_that_asks_nothing_gets_its_live_messages() {
    let server = Server::start_with("[rpc]\npublic_streams = true", "").await;
    let (mut ws, sid) = subscribed(&server, "q").await;
    ws.close(None).await.unwrap();
    drop(ws);
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut back = loop {
        let mut ws = cable(&server, &format!("?sid={sid}")).await;
        if frame(&mut ws).await["restored"] == true {
            break ws;
        }
        assert!(std::time::Instant::now() < deadline, "never restored");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    for n in 1..=3 {
        broadcast(&server, "q", json!({ "n": n })).await;
    }
    // Held for up to 5 s (RESTORED_HOLD), then they go out; common::next
    // waits up to TIMEOUT for each frame.
    for n in 1..=3 {
        let f = frame(&mut back).await;
        assert_eq!(f["message"], json!({ "n": n }), "{f}");
    }
}

/// A stream followed but idle for longer than `history_ttl` stays
/// reliable: its next message still carries a position (the engine would
/// otherwise have forgotten the idle stream).
#[tokio::test]
async fn a_followed_stream_idle_past_the_ttl_stays_reliable() {
    let server = Server::start_with("[rpc]\npublic_streams = true\nhistory_ttl = 1", "").await;
    let (mut ws, _) = subscribed(&server, "idle").await;
    // The idleness is the scenario: three sweeps of a 1 s history.
    tokio::time::sleep(std::time::Duration::from_millis(3500)).await;
    broadcast(&server, "idle", json!({ "n": 1 })).await;
    let f = frame(&mut ws).await;
    assert_eq!(f["message"], json!({ "n": 1 }), "{f}");
    assert!(
        f["offset"].is_u64() && f["epoch"].is_string(),
        "no position: {f}"
    );
}
