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

/// The JWT key of the nodes in the restore scenarios below
/// (`rpc.jwt_secret`; tokens in `?jid=`).
pub const JWT_KEY: &str = "restore-key";

/// The `[rpc]` lines those nodes need.
pub const RESTORE_RPC: &str = "public_streams = true\njwt_secret = \"restore-key\"";

/// A token naming `user`, valid for ten minutes.
pub fn token(user: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    herald_actioncable::jwt::sign(JWT_KEY, &json!({ "user": user }).to_string(), now + 600)
}

/// `herald_cable_restores_refused_total` on `server` (0 where absent).
async fn refused(server: &Server) -> u64 {
    let scrape = server.scrape().await;
    super::metric_in(&scrape, "herald_cable_restores_refused_total", &[]).unwrap_or(0)
}

/// A welcome on `server` for `query`, asserted not to restore anything.
async fn not_restored(server: &Server, query: &str, why: &str) {
    let mut ws = cable(server, query).await;
    let welcome = frame(&mut ws).await;
    assert_eq!(welcome["type"], "welcome", "{why}: {welcome}");
    assert!(welcome.get("restored").is_none(), "{why}: {welcome}");
}

/// Wait until `stored(marker)` (the engine's kept snapshot whose text holds
/// `marker`) satisfies `ok`.
pub async fn until_stored(
    stored: &impl AsyncFn(&str) -> Option<String>,
    marker: &str,
    ok: impl Fn(&Option<String>) -> bool,
    what: &str,
) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if ok(&stored(marker).await) {
            return;
        }
        assert!(Instant::now() < deadline, "{marker}: never {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A live session is never restored, on every engine: alice's session (made on `nodes[0]` with
/// her token) is not restored on the last node while she is connected (by
/// its sid alone, or with another user's token), nor after she left with
/// another user's token; then she restores it with her own, once: the same
/// sid again restores nothing. `stored(marker)` is the engine's snapshot
/// holding `marker` (engines that keep only closed sessions: any text).
pub async fn a_session_restores_only_once_its_connection_is_gone(
    nodes: &[&Server],
    stored: impl AsyncFn(&str) -> Option<String>,
) {
    let (a, b) = (nodes[0], nodes[nodes.len() - 1]);
    let room = format!("alice-room-{}", std::process::id());
    let mut alice = cable(a, &format!("?jid={}", token("alice"))).await;
    let welcome = frame(&mut alice).await;
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    let sid = welcome["sid"].as_str().unwrap().to_owned();
    send(
        &mut alice,
        json!({ "command": "subscribe", "identifier": ident(&room) }),
    )
    .await;
    assert_eq!(frame(&mut alice).await["type"], "confirm_subscription");
    // The engine holds her live session (a cluster engine writes it now).
    until_stored(&stored, &room, |v| v.is_some(), "kept").await;
    // While she is connected: nothing is restored, by any token or none.
    let mallory = format!("?sid={sid}&jid={}", token("mallory"));
    not_restored(b, &mallory, "live, another user's token").await;
    not_restored(b, &format!("?sid={sid}"), "live, the sid alone").await;
    // She is still served.
    broadcast(b, &room, json!({ "n": 1 })).await;
    assert_eq!(frame(&mut alice).await["message"], json!({ "n": 1 }));
    alice.close(None).await.unwrap();
    drop(alice);
    // Closed (no longer marked live): another identity's token still
    // restores nothing, and leaves the session to her.
    until_stored(
        &stored,
        &room,
        |v| v.as_ref().is_some_and(|v| !v.contains("\"live\"")),
        "closed",
    )
    .await;
    // (Until one such try found the session: on one node its close may
    // still be on its way to the cache; each try is refused.)
    let before = refused(b).await;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        not_restored(b, &mallory, "closed, another user's token").await;
        if refused(b).await > before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed session was never found"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mine = format!("?sid={sid}&jid={}", token("alice"));
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut ws = cable(b, &mine).await;
        let welcome = frame(&mut ws).await;
        if welcome["restored"] == true {
            assert_eq!(welcome["restored_ids"], json!([ident(&room)]), "{welcome}");
            break;
        }
        // (One node: the close may still be on its way to the cache.)
        assert!(Instant::now() < deadline, "never restored: {welcome}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // At most once: the same sid again, with her token or none.
    not_restored(b, &mine, "restored already, her token").await;
    not_restored(b, &format!("?sid={sid}"), "restored already, the sid alone").await;
    let mut restored = 0;
    for n in nodes.iter().take(if a.port == b.port { 1 } else { 2 }) {
        restored += n.metric("herald_cable_sessions_restored_total").await;
    }
    assert_eq!(restored, 1);
    assert!(refused(b).await >= 1);
}

/// On the cluster engines: a session whose node is frozen
/// (SIGSTOP, the way a killed node looks to the others) restores on
/// `b` once `b` has declared the node gone (its `broker.ttl` short); the
/// node, thawed, does not write the session back when it changes (the
/// compare-and-set on its last write), so the sid restores once.
pub async fn a_frozen_nodes_session_restores_elsewhere_once(
    a: &Server,
    b: &Server,
    stored: impl AsyncFn(&str) -> Option<String>,
) {
    let tag = std::process::id();
    let (first, second, barrier) = (
        format!("first-{tag}"),
        format!("second-{tag}"),
        format!("barrier-{tag}"),
    );
    let mut old = cable(a, "").await;
    let sid = frame(&mut old).await["sid"].as_str().unwrap().to_owned();
    send(
        &mut old,
        json!({ "command": "subscribe", "identifier": ident(&first) }),
    )
    .await;
    assert_eq!(frame(&mut old).await["type"], "confirm_subscription");
    until_stored(&stored, &first, |v| v.is_some(), "kept").await;
    let pid = a.child.id().to_string();
    let signal = |s: &str| {
        let ok = std::process::Command::new("kill")
            .args([s, pid.as_str()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {s} {pid}");
    };
    signal("-STOP");
    // `b` waits for its verdict on the silent node, then restores.
    let mut taker = cable(b, &format!("?sid={sid}")).await;
    let welcome = frame(&mut taker).await;
    signal("-CONT");
    assert_eq!(welcome["restored"], true, "{welcome}");
    assert_eq!(welcome["restored_ids"], json!([ident(&first)]), "{welcome}");
    // The thawed node's session changes: it writes its snapshot again
    // (refused now).
    send(
        &mut old,
        json!({ "command": "subscribe", "identifier": ident(&second) }),
    )
    .await;
    assert_eq!(frame(&mut old).await["type"], "confirm_subscription");
    // It writes in order: once a session made after that write is kept,
    // the write was tried.
    let mut later = cable(a, "").await;
    frame(&mut later).await;
    send(
        &mut later,
        json!({ "command": "subscribe", "identifier": ident(&barrier) }),
    )
    .await;
    assert_eq!(frame(&mut later).await["type"], "confirm_subscription");
    until_stored(&stored, &barrier, |v| v.is_some(), "kept").await;
    // (The session `b` restored is kept too, but never with `second`.)
    assert_eq!(stored(&second).await, None, "the taken session came back");
    not_restored(b, &format!("?sid={sid}"), "restored already").await;
}
