//! Hostile or broken client input. Each case checks what the offending
//! client sees, then that a healthy client on the same server still gets a
//! broadcast (the server neither crashed nor wedged); the oversize-frame and
//! invalid-channel cases also check that `/metrics` counted them.

use crate::common;

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

// ----- frames that break the WebSocket protocol, written by hand ----------------

/// A TCP connection upgraded to a WebSocket by hand, past the server's
/// `connection_established` frame, for frames no WebSocket library sends.
async fn raw_socket(server: &Server) -> tokio::net::TcpStream {
    let (mut tcp, mut frames) = raw_upgrade(server, &[]).await;
    let (opcode, payload) = frames.next(&mut tcp).await.expect("a first frame");
    assert_eq!(opcode, 0x1);
    assert!(
        String::from_utf8_lossy(&payload).contains("pusher:connection_established"),
        "{}",
        String::from_utf8_lossy(&payload)
    );
    assert!(frames.buf.is_empty(), "nothing else was sent yet");
    tcp
}

/// Write a Pusher upgrade request by hand with `behind` right after it in
/// the same write, and read up to the end of the 101 response; what the
/// server sent after it is in the returned frames' buffer.
async fn raw_upgrade(server: &Server, behind: &[u8]) -> (tokio::net::TcpStream, ServerFrames) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::time::timeout(
        TIMEOUT,
        tokio::net::TcpStream::connect(("127.0.0.1", server.port)),
    )
    .await
    .expect("connect timed out")
    .expect("connect");
    let mut request = format!(
        "GET /app/{APP_KEY}?protocol=7&client=js&version=8.4.0 HTTP/1.1\r\n\
         Host: 127.0.0.1:{}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        server.port
    )
    .into_bytes();
    request.extend_from_slice(behind);
    tcp.write_all(&request).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            assert!(head.starts_with("HTTP/1.1 101"), "upgrade refused: {head}");
            buf.drain(..end + 4);
            return (tcp, ServerFrames { buf });
        }
        let n = tokio::time::timeout(TIMEOUT, tcp.read(&mut chunk))
            .await
            .expect("no upgrade response")
            .unwrap();
        assert!(n > 0, "closed during the upgrade");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Server-to-client frames (never masked) read off a raw socket.
struct ServerFrames {
    buf: Vec<u8>,
}

impl ServerFrames {
    /// The next frame's opcode and payload; `None` when the server closed
    /// the TCP connection. Panics on timeout.
    async fn next(&mut self, tcp: &mut tokio::net::TcpStream) -> Option<(u8, Vec<u8>)> {
        use tokio::io::AsyncReadExt;
        loop {
            if self.buf.len() >= 2 {
                let (len, head) = match self.buf[1] & 0x7f {
                    126 if self.buf.len() >= 4 => {
                        (u16::from_be_bytes([self.buf[2], self.buf[3]]) as usize, 4)
                    }
                    127 if self.buf.len() >= 10 => {
                        let b: [u8; 8] = self.buf[2..10].try_into().unwrap();
                        (u64::from_be_bytes(b) as usize, 10)
                    }
                    126 | 127 => (usize::MAX, 0),
                    n => (n as usize, 2),
                };
                if len != usize::MAX && self.buf.len() >= head + len {
                    let opcode = self.buf[0] & 0x0f;
                    let payload = self.buf[head..head + len].to_vec();
                    self.buf.drain(..head + len);
                    return Some((opcode, payload));
                }
            }
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(TIMEOUT, tcp.read(&mut chunk))
                .await
                .expect("timed out waiting for a frame or the end of the connection")
                .unwrap_or(0);
            if n == 0 {
                assert!(self.buf.is_empty(), "connection ended mid-frame");
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Send `frame` on a fresh raw socket; expect `pusher:error` 1002, a close
/// frame with 1002, and the TCP connection dropped at once: after 1002 the
/// server does not wait (up to 2 s) for a closing handshake, since the
/// stream may have stopped mid-frame (docs/protocol.md).
async fn expect_1002_at_once(server: &Server, frame: &[u8], what: &str) {
    use tokio::io::AsyncWriteExt;
    let before = server.metric("herald_bad_messages_total").await;
    let mut tcp = raw_socket(server).await;
    let mut frames = ServerFrames { buf: Vec::new() };
    let sent = std::time::Instant::now();
    tcp.write_all(frame).await.unwrap();

    let (opcode, payload) = frames
        .next(&mut tcp)
        .await
        .unwrap_or_else(|| panic!("{what}: closed without pusher:error"));
    assert_eq!(opcode, 0x1, "{what}: a text frame first");
    let f: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(f["event"], "pusher:error", "{what}: {f}");
    assert_eq!(data(&f)["code"], 1002, "{what}: {f}");
    let (opcode, payload) = frames
        .next(&mut tcp)
        .await
        .unwrap_or_else(|| panic!("{what}: TCP closed without a close frame"));
    assert_eq!(opcode, 0x8, "{what}: a close frame next");
    assert!(payload.len() >= 2, "{what}: close frame without a code");
    assert_eq!(
        u16::from_be_bytes([payload[0], payload[1]]),
        1002,
        "{what}: close code"
    );
    // We never answer the close: the server ends the connection anyway.
    assert!(
        frames.next(&mut tcp).await.is_none(),
        "{what}: a frame after the close"
    );
    let took = sent.elapsed();
    assert!(
        took < std::time::Duration::from_millis(1500),
        "{what}: the connection ended {took:?} after the frame; \
         no closing handshake is awaited after 1002"
    );
    assert_eq!(
        server.metric("herald_bad_messages_total").await,
        before + 1,
        "{what}: counted as a bad message"
    );
}

/// A client frame: FIN, `flags` (the RSV bits) and `opcode`, masked
/// or not.
fn client_frame(flags: u8, opcode: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mut out = vec![0x80 | flags | opcode];
    if masked {
        let mask = [0x12, 0x34, 0x56, 0x78];
        out.push(0x80 | payload.len() as u8);
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    } else {
        out.push(payload.len() as u8);
        out.extend_from_slice(payload);
    }
    out
}

const PING: &[u8] = br#"{"event":"pusher:ping","data":{}}"#;

#[tokio::test]
async fn a_frame_sent_right_behind_the_upgrade_request_is_read() {
    // A client may write its first frame before the 101 arrives; the bytes
    // behind the request head must reach the session, in order.
    let server = Server::start().await;
    let (mut tcp, mut frames) = raw_upgrade(&server, &client_frame(0, 0x1, PING, true)).await;
    let mut events = Vec::new();
    while !events.iter().any(|e: &String| e.contains("pusher:pong")) {
        let (_, payload) = frames.next(&mut tcp).await.expect("a frame");
        events.push(String::from_utf8_lossy(&payload).into_owned());
    }
    assert!(
        events[0].contains("pusher:connection_established"),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_well_formed_raw_frame_is_answered() {
    // The control for the cases below: the same bytes, masked and without
    // reserved bits, get a pong, so what they change is what is refused.
    let server = Server::start().await;
    let mut tcp = raw_socket(&server).await;
    use tokio::io::AsyncWriteExt;
    tcp.write_all(&client_frame(0, 0x1, PING, true))
        .await
        .unwrap();
    let mut frames = ServerFrames { buf: Vec::new() };
    let (opcode, payload) = frames.next(&mut tcp).await.expect("a reply");
    assert_eq!(opcode, 0x1);
    assert!(
        String::from_utf8_lossy(&payload).contains("pusher:pong"),
        "{}",
        String::from_utf8_lossy(&payload)
    );
}

#[tokio::test]
async fn an_unmasked_client_frame_closes_with_1002_at_once() {
    let server = Server::start().await;
    let mut healthy = bystander(&server).await;
    expect_1002_at_once(
        &server,
        &client_frame(0, 0x1, PING, false),
        "unmasked text frame",
    )
    .await;
    // An unmasked control frame too.
    expect_1002_at_once(
        &server,
        &client_frame(0, 0x9, b"hb", false),
        "unmasked ping frame",
    )
    .await;
    still_healthy(&server, &mut healthy).await;
}

#[tokio::test]
async fn reserved_bits_close_with_1002_at_once() {
    let server = Server::start().await;
    let mut healthy = bystander(&server).await;
    for (flags, name) in [(0x40, "RSV1"), (0x20, "RSV2"), (0x10, "RSV3")] {
        let frame = client_frame(flags, 0x1, PING, true);
        expect_1002_at_once(&server, &frame, name).await;
    }
    still_healthy(&server, &mut healthy).await;
}

#[tokio::test]
async fn invalid_close_codes_are_answered_with_1002() {
    // RFC 6455 7.4: 999 and below, the reserved 1004-1006 and 1015, the
    // unassigned 1016-2999 and 5000 and up never travel in a close frame.
    let server = Server::start().await;
    let mut healthy = bystander(&server).await;
    for code in [999u16, 1004, 1005, 1006, 1015, 2999, 5000] {
        let frame = client_frame(0, 0x8, &code.to_be_bytes(), true);
        expect_1002_at_once(&server, &frame, &format!("close code {code}")).await;
    }
    still_healthy(&server, &mut healthy).await;
}

#[tokio::test]
async fn a_valid_close_code_is_echoed() {
    // The control for the case above: the same frame with a code a client
    // may send gets that code back, and no pusher:error.
    use tokio::io::AsyncWriteExt;
    let server = Server::start().await;
    for code in [1000u16, 1001, 4000] {
        let mut tcp = raw_socket(&server).await;
        let mut frames = ServerFrames { buf: Vec::new() };
        tcp.write_all(&client_frame(0, 0x8, &code.to_be_bytes(), true))
            .await
            .unwrap();
        let (opcode, payload) = frames.next(&mut tcp).await.expect("a close frame");
        assert_eq!(opcode, 0x8, "close code {code}: {payload:?}");
        assert_eq!(u16::from_be_bytes([payload[0], payload[1]]), code);
    }
}
