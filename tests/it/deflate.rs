//! permessage-deflate (RFC 7692) on the wire, with a client written by hand
//! so every bit of the frames is checked: the negotiation on every
//! WebSocket endpoint and its switches, publications compressed once and
//! shared, small frames left plain, client messages inflated, a client
//! that offers nothing served plain frames, and a compression bomb closed
//! with 1009.

use crate::common::{Server, APP_KEY, TIMEOUT};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What browsers and the `ws` package offer.
const OFFER: &str = "permessage-deflate; client_max_window_bits";
const ANSWER: &str = "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

/// A WebSocket client speaking frames by hand.
struct Raw {
    tcp: TcpStream,
    buf: Vec<u8>,
    /// The `Sec-WebSocket-Extensions` of the 101 answer, if any.
    extensions: Option<String>,
}

/// One server frame: its first byte (FIN, RSV1, opcode) and payload.
struct Frame {
    first: u8,
    payload: Vec<u8>,
}

impl Frame {
    fn compressed(&self) -> bool {
        self.first & 0x40 != 0
    }

    fn opcode(&self) -> u8 {
        self.first & 0x0f
    }

    /// The message's text, inflated if compressed.
    fn text(&self) -> String {
        let bytes = if self.compressed() {
            inflate(&self.payload)
        } else {
            self.payload.clone()
        };
        String::from_utf8(bytes).expect("UTF-8")
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.text()).expect("JSON")
    }
}

fn inflate(data: &[u8]) -> Vec<u8> {
    let mut input = data.to_vec();
    input.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut d = Decompress::new(false);
    let mut out = Vec::with_capacity(1 << 20);
    d.decompress_vec(&input, &mut out, FlushDecompress::Sync)
        .expect("inflates");
    assert_eq!(d.total_in() as usize, input.len(), "all of it");
    out
}

fn deflate(data: &[u8]) -> Vec<u8> {
    let mut c = Compress::new(Compression::default(), false);
    let mut out = Vec::with_capacity(data.len() + 1024);
    c.compress_vec(data, &mut out, FlushCompress::Sync).unwrap();
    assert_eq!(c.total_in() as usize, data.len());
    out.truncate(out.len() - 4);
    out
}

impl Raw {
    /// Upgrade at `path`, with `headers` (e.g. the extension offer) added.
    async fn open(server: &Server, path: &str, headers: &[(&str, &str)]) -> Raw {
        let mut tcp = tokio::time::timeout(TIMEOUT, TcpStream::connect(("127.0.0.1", server.port)))
            .await
            .expect("connect timed out")
            .expect("connect");
        let mut request = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n",
            server.port
        );
        for (k, v) in headers {
            request.push_str(&format!("{k}: {v}\r\n"));
        }
        request.push_str("\r\n");
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                assert!(head.starts_with("HTTP/1.1 101"), "upgrade refused: {head}");
                let extensions = head.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("sec-websocket-extensions")
                        .then(|| v.trim().to_string())
                });
                buf.drain(..end + 4);
                return Raw {
                    tcp,
                    buf,
                    extensions,
                };
            }
            let n = tokio::time::timeout(TIMEOUT, tcp.read(&mut chunk))
                .await
                .expect("no upgrade answer")
                .unwrap();
            assert!(n > 0, "closed during the upgrade");
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn pusher(server: &Server, offer: bool) -> Raw {
        let path = format!("/app/{APP_KEY}?protocol=7&client=js&version=8.4.0");
        let headers: &[(&str, &str)] = if offer {
            &[("Sec-WebSocket-Extensions", OFFER)]
        } else {
            &[]
        };
        let mut raw = Raw::open(server, &path, headers).await;
        let first = raw.next().await.expect("connection_established");
        assert!(!first.compressed(), "a short frame goes plain");
        assert_eq!(first.json()["event"], "pusher:connection_established");
        raw
    }

    /// The next frame; `None` once the server closed the socket.
    async fn next(&mut self) -> Option<Frame> {
        let mut chunk = [0u8; 8192];
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
                    let first = self.buf[0];
                    assert_eq!(self.buf[1] & 0x80, 0, "server frames are not masked");
                    let payload = self.buf[head..head + len].to_vec();
                    self.buf.drain(..head + len);
                    return Some(Frame { first, payload });
                }
            }
            let n = tokio::time::timeout(TIMEOUT, self.tcp.read(&mut chunk))
                .await
                .expect("timed out waiting for a frame")
                .unwrap_or(0);
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The next text frame's JSON, skipping pings.
    async fn json(&mut self) -> (Frame, Value) {
        loop {
            let f = self.next().await.expect("a frame");
            if f.opcode() == 0x1 {
                let v = f.json();
                return (f, v);
            }
        }
    }

    /// Send a masked frame with this first byte.
    async fn send(&mut self, first: u8, payload: &[u8]) {
        let mut f = vec![first];
        match payload.len() {
            n @ 0..=125 => f.push(0x80 | n as u8),
            n @ 126..=65535 => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask = [7u8, 1, 9, 3];
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
        self.tcp.write_all(&f).await.unwrap();
    }

    /// Send `text` compressed (RSV1), as a browser does.
    async fn send_compressed(&mut self, text: &str) {
        self.send(0x80 | 0x40 | 0x1, &deflate(text.as_bytes()))
            .await;
    }

    /// Read until the close frame; its code.
    async fn close_code(&mut self) -> u16 {
        while let Some(f) = self.next().await {
            if f.opcode() == 0x8 {
                return u16::from_be_bytes([f.payload[0], f.payload[1]]);
            }
        }
        panic!("closed without a close frame");
    }
}

/// A 2 KiB JSON event's data, order-like.
fn big_data() -> String {
    let items: Vec<Value> = (0..24)
        .map(|i| json!({"sku": format!("SKU-{:05}", i * 7919 % 100000), "name": "Ceramic mug", "quantity": 1 + i % 4, "unit_price": 12.5 + i as f64}))
        .collect();
    json!({"type": "order.updated", "order": {"id": "ord_1234", "status": "paid"}, "items": items})
        .to_string()
}

#[tokio::test]
async fn deflate_clients_get_publications_compressed_once_and_shared() {
    let server = Server::start().await;
    let mut a = Raw::pusher(&server, true).await;
    let mut b = Raw::pusher(&server, true).await;
    assert_eq!(a.extensions.as_deref(), Some(ANSWER));
    // Client messages may come compressed: the subscribe is inflated.
    for c in [&mut a, &mut b] {
        c.send_compressed(
            &json!({"event": "pusher:subscribe", "data": {"channel": "orders"}}).to_string(),
        )
        .await;
        let (_, v) = c.json().await;
        assert_eq!(v["event"], "pusher_internal:subscription_succeeded", "{v}");
    }
    let compressed_before = server.metric("herald_frames_compressed_total").await;
    let data = big_data();
    assert!(data.len() > 1500);
    server.trigger("orders", "updated", &data).await;
    let (fa, va) = a.json().await;
    let (fb, _) = b.json().await;
    assert!(fa.compressed(), "RSV1 set on a 2 KiB event");
    assert_eq!(va["event"], "updated");
    assert_eq!(va["data"], data.as_str());
    // The same bytes for both subscribers, compressed once.
    assert_eq!(fa.payload, fb.payload);
    assert_eq!(
        server.metric("herald_frames_compressed_total").await - compressed_before,
        1
    );
    let plain_len = va.to_string().len();
    assert!(
        fa.payload.len() * 3 < plain_len,
        "{} compressed bytes for {plain_len}",
        fa.payload.len()
    );
    // A short event goes plain (RSV1 clear): the per-message choice.
    server.trigger("orders", "small", "hi").await;
    let (f, v) = a.json().await;
    assert!(!f.compressed());
    assert_eq!(v["data"], "hi");
    assert!(
        server
            .metric("herald_websocket_deflate_connections_total")
            .await
            >= 2
    );
}

#[tokio::test]
async fn a_client_that_offers_nothing_gets_plain_frames() {
    let server = Server::start().await;
    let mut c = Raw::pusher(&server, false).await;
    assert_eq!(c.extensions, None);
    c.send(
        0x81,
        json!({"event": "pusher:subscribe", "data": {"channel": "orders"}})
            .to_string()
            .as_bytes(),
    )
    .await;
    let (_, v) = c.json().await;
    assert_eq!(v["event"], "pusher_internal:subscription_succeeded");
    let data = big_data();
    server.trigger("orders", "updated", &data).await;
    let (f, v) = c.json().await;
    assert!(!f.compressed());
    assert_eq!(v["data"], data.as_str());
    // RSV1 without the extension is a protocol error.
    c.send_compressed(r#"{"event":"pusher:ping","data":{}}"#)
        .await;
    assert_eq!(c.close_code().await, 1002);
}

#[tokio::test]
async fn a_compression_bomb_is_closed_with_1009_and_harms_no_one_else() {
    let server = Server::start().await;
    let mut other = Raw::pusher(&server, true).await;
    other
        .send(
            0x81,
            json!({"event": "pusher:subscribe", "data": {"channel": "orders"}})
                .to_string()
                .as_bytes(),
        )
        .await;
    other.json().await;
    let mut c = Raw::pusher(&server, true).await;
    // 4 MiB of JSON-ish text in a few KiB; the app's max_frame_size
    // is 64 KiB.
    let mut body = String::from(r#"{"event":"client-x","channel":"orders","data":""#);
    body.push_str(&" ".repeat(4 << 20));
    body.push_str(r#""}"#);
    let bomb = deflate(body.as_bytes());
    assert!(bomb.len() < 64 << 10, "{} bytes on the wire", bomb.len());
    c.send(0x80 | 0x40 | 0x1, &bomb).await;
    assert_eq!(c.close_code().await, 1009);
    // The server and its other clients carry on.
    server.trigger("orders", "after", "still here").await;
    let (_, v) = other.json().await;
    assert_eq!(v["data"], "still here");
}

#[tokio::test]
async fn every_websocket_endpoint_negotiates_it_and_the_switches_turn_it_off() {
    let server = Server::start().await;
    let offer = [("Sec-WebSocket-Extensions", OFFER)];
    let cable = Raw::open(&server, "/cable", &offer).await;
    assert_eq!(cable.extensions.as_deref(), Some(ANSWER));
    let events = Raw::open(
        &server,
        "/event/realtime",
        &[
            ("Sec-WebSocket-Extensions", OFFER),
            ("Sec-WebSocket-Protocol", "aws-appsync-event-ws"),
        ],
    )
    .await;
    assert_eq!(events.extensions.as_deref(), Some(ANSWER));
    // An offer Herald cannot take (a smaller server window) is declined.
    let path = format!("/app/{APP_KEY}?protocol=7");
    let declined = Raw::open(
        &server,
        &path,
        &[(
            "Sec-WebSocket-Extensions",
            "permessage-deflate; server_max_window_bits=10",
        )],
    )
    .await;
    assert_eq!(declined.extensions, None);

    let off = Server::start_with("websocket_compression = false", "").await;
    assert_eq!(Raw::open(&off, &path, &offer).await.extensions, None);
    assert_eq!(Raw::open(&off, "/cable", &offer).await.extensions, None);
    let app_off = Server::start_with("", "websocket_compression = false").await;
    assert_eq!(Raw::open(&app_off, &path, &offer).await.extensions, None);
}
