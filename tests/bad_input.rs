//! Hostile or broken client input. Each case checks what the offending
//! client sees, then that a healthy client on the same server still gets a
//! broadcast (the server neither crashed nor wedged); the oversize-frame and
//! invalid-channel cases also check that `/metrics` counted them.

mod common;

use common::*;
use futures_util::SinkExt;
use serde_json::json;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn non_json_and_wrong_shapes_get_pusher_error_and_keep_the_connection() {
    let server = Server::start().await;
    let mut healthy = bystander(&server).await;
    let mut bad = server.client().await;
    let inputs = [
        "not json",
        "",
        "[]",
        "null",
        "{}",
        r#"{"event":5}"#,
        r#"{"event":"pusher:subscribe"}"#,
        r#"{"event":"pusher:subscribe","data":{"channel":["x"]}}"#,
        r#"{"event":"pusher:subscribe","data":"{not json"}"#,
        r#"{"event":"pusher:unsubscribe","data":42}"#,
        r#"{"event":"pusher:signin","data":{}}"#,
        r#"{"event":"client-x","data":1}"#,
        r#"{"event":"no-such-event","data":{}}"#,
        &format!("{}1{}", "[".repeat(1000), "]".repeat(1000)),
        &format!(
            r#"{{"event":"client-x","channel":"private-a","data":{}1{}}}"#,
            "[".repeat(1000),
            "]".repeat(1000)
        ),
        "{\"event\":\"\u{0}\"}",
    ];
    for input in inputs {
        bad.send_text(input).await;
        let f = bad.recv().await;
        assert_eq!(f["event"], "pusher:error", "for {input:?}: {f}");
        assert!(
            data(&f)["code"].is_null(),
            "no close code for {input:?}: {f}"
        );
    }
    // The bad client itself is still usable.
    bad.subscribe("healthy").await;
    still_healthy(&server, &mut healthy).await;
    bad.expect("still-here", Some("healthy")).await;
}

#[tokio::test]
async fn binary_frame_closes_with_1003() {
    let server = Server::start().await;
    let mut healthy = bystander(&server).await;
    let mut bad = server.client().await;
    bad.ws
        .send(Message::Binary(vec![0u8, 1, 2, 255].into()))
        .await
        .unwrap();
    bad.expect_closed_with(1003).await;
    still_healthy(&server, &mut healthy).await;
}

#[tokio::test]
async fn oversize_message_closes_with_1009() {
    let server = Server::start_with("", "max_frame_size = 4096").await;
    let mut healthy = bystander(&server).await;
    let mut bad = server.client().await;
    let before = server.metric("herald_bad_messages_total").await;
    let big = json!({ "event": "client-x", "channel": "private-a", "data": "x".repeat(5000) });
    bad.send(big).await;
    expect_close_code(&mut bad, 1009).await;
    assert_eq!(
        server.metric("herald_bad_messages_total").await,
        before + 1,
        "the oversize frame is counted once"
    );
    still_healthy(&server, &mut healthy).await;
}

#[tokio::test]
async fn invalid_utf8_text_closes_with_1007() {
    let server = Server::start().await;
    let mut healthy = bystander(&server).await;
    let mut bad = server.client().await;
    let bytes: Vec<u8> = b"{\"event\":\"pusher:ping\",\"data\":\"\xff\xfe\"}".to_vec();
    bad.ws
        .send(Message::Frame(Frame::message(
            bytes,
            OpCode::Data(Data::Text),
            true,
        )))
        .await
        .unwrap();
    expect_close_code(&mut bad, 1007).await;
    still_healthy(&server, &mut healthy).await;
}

#[tokio::test]
async fn message_flood_closes_with_4100() {
    let server = Server::start_with("", "max_messages_per_second = 20").await;
    let mut healthy = bystander(&server).await;
    let mut bad = server.client().await;
    for _ in 0..50 {
        if bad
            .ws
            .feed(Message::text(r#"{"event":"pusher:ping","data":{}}"#))
            .await
            .is_err()
        {
            break;
        }
    }
    let _ = bad.ws.flush().await;
    // Some pongs come first; then the error and the close.
    loop {
        match next(&mut bad.ws).await {
            Next::Frame(f) if f["event"] == "pusher:pong" => continue,
            Next::Frame(f) => {
                assert_eq!(f["event"], "pusher:error", "{f}");
                assert_eq!(data(&f)["code"], 4100, "{f}");
                break;
            }
            Next::Close(c) => panic!("closed ({c:?}) without pusher:error"),
        }
    }
    bad.expect_close(4100).await;
    still_healthy(&server, &mut healthy).await;
}

#[tokio::test]
async fn subscribe_garbage_channels_get_subscription_errors() {
    let server = Server::start().await;
    let mut healthy = bystander(&server).await;
    let mut bad = server.client().await;
    let before = server.metric("herald_subscription_errors_total").await;
    let names = [
        "#server-to-user-someone",
        "presence-",
        "\u{202e}rtl",
        "a\u{0}b",
        "has space",
        &"é".repeat(100),
        &"x".repeat(10_000),
    ];
    for name in names {
        bad.subscribe_raw(name, Some("k:sig"), Some("{}")).await;
        let f = bad.expect("pusher:subscription_error", None).await;
        let shown = f["channel"].as_str().unwrap_or("");
        assert!(shown.chars().count() <= 200, "echoed name is bounded");
    }
    assert_eq!(
        server.metric("herald_subscription_errors_total").await,
        before + names.len() as u64,
        "each refused subscription is counted"
    );
    still_healthy(&server, &mut healthy).await;
}

/// The server may or may not manage to send its `pusher:error` before the
/// close after a WebSocket-level error; the close code is what counts.
async fn expect_close_code(c: &mut Client, code: u16) {
    loop {
        match next(&mut c.ws).await {
            Next::Frame(f) => {
                assert_eq!(f["event"], "pusher:error", "{f}");
                assert_eq!(data(&f)["code"], code, "{f}");
            }
            Next::Close(got) => {
                assert_eq!(got, Some(code), "close code");
                return;
            }
        }
    }
}
