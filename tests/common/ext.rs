//! Helpers for `actioncable-v1-ext-json` tests (one node or a cluster): an
//! extended-protocol socket, its frames within one deadline, broadcasts
//! through `/_broadcast`, and `herald bench rpc-server` as the app.

use super::{herald_command, Server, Ws, TIMEOUT};
use futures_util::SinkExt;
use serde_json::{json, Value};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

pub const EXT: &str = "actioncable-v1-ext-json";

/// A socket at `/cable{query}` that negotiated the extended protocol.
pub async fn cable(server: &Server, query: &str) -> Ws {
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

/// The next frame that is not a ping, within [`TIMEOUT`] in all (pings
/// come every 3 s, so a wait per frame would never end).
pub async fn frame(ws: &mut Ws) -> Value {
    let next = async {
        loop {
            match super::next(ws).await {
                super::Next::Frame(f) if f["type"] == "ping" => continue,
                super::Next::Frame(f) => return f,
                super::Next::Close(c) => panic!("closed ({c:?}) while a frame was expected"),
            }
        }
    };
    tokio::time::timeout(TIMEOUT, next)
        .await
        .expect("timed out waiting for a frame")
}

pub async fn send(ws: &mut Ws, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

/// `POST /_broadcast` of `data` to `stream` through `server`.
pub async fn broadcast(server: &Server, stream: &str, data: Value) {
    let body = json!({ "stream": stream, "data": data.to_string() }).to_string();
    let resp = reqwest::Client::new()
        .post(server.url("/_broadcast"))
        .timeout(TIMEOUT)
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST /_broadcast to port {}: {e}", server.port));
    assert_eq!(resp.status(), 201);
}

/// A `$pubsub` subscription's identifier for `stream`.
pub fn ident(stream: &str) -> String {
    json!({ "channel": "$pubsub", "stream_name": stream }).to_string()
}

/// `herald bench rpc-server` (gRPC), killed on drop.
pub struct App(Child);

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `herald bench rpc-server` on `port`, its broadcasts to
/// `broadcast_url`; returns once it listens.
pub async fn rpc_app(port: u16, broadcast_url: &str) -> App {
    let child = herald_command()
        .args([
            "bench",
            "rpc-server",
            "--port",
            &port.to_string(),
            "--threads",
            "1",
            "--broadcast-url",
            broadcast_url,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn herald bench rpc-server");
    let app = App(child);
    let deadline = Instant::now() + TIMEOUT;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "rpc-server did not listen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app
}
