//! AnyCable's remote commands against real herald processes:
//! `{"command":"disconnect","payload":{"identifier":...,"reconnect":...}}`
//! through `POST /_broadcast` closes every connection whose identifiers
//! (the app's `Connect` answer) are those, with Action Cable's
//! `{"type":"disconnect","reason":"remote","reconnect":...}` and close 1000,
//! and no other; a malformed command is refused (422). On one node, and on
//! two nodes over a real `redis-server`: the command given to one node (by
//! HTTP, or on the broker's `__anycable__` channel) closes the connection
//! on the other.

use crate::common;

use axum::routing::post;
use axum::{Json, Router};
use common::{Server, Ws, TIMEOUT};
use herald_broker::testing::{BrokerServer, Kind};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// HTTP RPC: Connect identifies the client by its `user` cookie
/// (identifiers `{"user":U}`); nothing else is needed here.
async fn rpc(
    axum::extract::Path(method): axum::extract::Path<String>,
    Json(body): Json<Value>,
) -> Json<Value> {
    let cookie = body["env"]["headers"]["cookie"].as_str().unwrap_or("");
    let user = cookie.strip_prefix("user=").unwrap_or("anonymous");
    Json(match method.as_str() {
        "connect" => json!({
            "status": "SUCCESS",
            "identifiers": ids(user),
            "transmissions": [r#"{"type":"welcome"}"#],
        }),
        _ => json!({ "status": "SUCCESS" }),
    })
}

fn ids(user: &str) -> String {
    json!({ "user": user }).to_string()
}

/// The RPC app on a loopback port; its URL.
async fn app() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let router = Router::new().route("/rpc/{method}", post(rpc));
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://127.0.0.1:{port}/rpc")
}

async fn client(server: &Server, user: &str) -> Ws {
    let mut req = format!("ws://127.0.0.1:{}/cable", server.port)
        .into_client_request()
        .unwrap();
    let h = req.headers_mut();
    h.insert(
        "sec-websocket-protocol",
        "actioncable-v1-json".parse().unwrap(),
    );
    h.insert("cookie", format!("user={user}").parse().unwrap());
    let (mut ws, _) = tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(req))
        .await
        .expect("connect timed out")
        .expect("connect");
    assert_eq!(common::ext::frame(&mut ws).await["type"], "welcome");
    ws
}

async fn command(server: &Server, body: Value) -> u16 {
    reqwest::Client::new()
        .post(server.url("/_broadcast"))
        .timeout(TIMEOUT)
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn disconnect(user: &str, reconnect: bool) -> Value {
    json!({ "command": "disconnect", "payload": { "identifier": ids(user), "reconnect": reconnect } })
}

/// The disconnect message, then close 1000 (pings skipped).
async fn remotely_closed(ws: &mut Ws, reconnect: bool) {
    assert_eq!(
        common::ext::frame(ws).await,
        json!({ "type": "disconnect", "reason": "remote", "reconnect": reconnect })
    );
    loop {
        match common::next(ws).await {
            common::Next::Frame(f) if f["type"] == "ping" => continue,
            common::Next::Close(code) => return assert_eq!(code, Some(1000)),
            common::Next::Frame(f) => panic!("a frame after the disconnect: {f}"),
        }
    }
}

/// Still open: it keeps getting Action Cable's pings (every 3 s).
async fn still_open(ws: &mut Ws) {
    match common::next(ws).await {
        common::Next::Frame(f) => assert_eq!(f["type"], "ping", "{f}"),
        common::Next::Close(c) => panic!("closed ({c:?})"),
    }
}

#[tokio::test]
async fn a_remote_disconnect_closes_every_connection_of_those_identifiers() {
    let url = app().await;
    let server = Server::start_with(&format!("[rpc]\nhost = \"{url}\"\n"), "").await;
    let mut alice1 = client(&server, "alice").await;
    let mut alice2 = client(&server, "alice").await;
    let mut bob = client(&server, "bob").await;
    assert_eq!(command(&server, disconnect("alice", true)).await, 201);
    remotely_closed(&mut alice1, true).await;
    remotely_closed(&mut alice2, true).await;
    still_open(&mut bob).await;
    // Bad commands: refused, nobody closed.
    for bad in [
        json!({ "command": "disconnect" }),
        json!({ "command": "disconnect", "payload": { "identifier": "" } }),
        json!({ "command": "reboot", "payload": { "identifier": ids("bob") } }),
    ] {
        assert_eq!(command(&server, bad.clone()).await, 422, "{bad}");
    }
    // Nobody with those identifiers: accepted, nothing happens.
    assert_eq!(command(&server, disconnect("carol", false)).await, 201);
    still_open(&mut bob).await;
    assert_eq!(command(&server, disconnect("bob", false)).await, 201);
    remotely_closed(&mut bob, false).await;
}

#[tokio::test]
async fn a_remote_disconnect_given_to_one_node_closes_connections_on_the_other() {
    let broker = BrokerServer::start(Kind::Redis);
    let url = app().await;
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"rc\"\n[rpc]\nhost = \"{url}\"\nbroadcast_adapter = \"http,redis\"\n",
        broker.url()
    );
    let a = Server::start_with(&top, "").await;
    let b = Server::start_with(&top, "").await;
    // Over HTTP to node B: alice's connection on node A closes.
    let mut alice = client(&a, "alice").await;
    let mut bob = client(&a, "bob").await;
    assert_eq!(command(&b, disconnect("alice", false)).await, 201);
    remotely_closed(&mut alice, false).await;
    still_open(&mut bob).await;
    // On the broker's channel: every node runs it for its own clients.
    let mut dave_a = client(&a, "dave").await;
    let mut dave_b = client(&b, "dave").await;
    let mut r = redis::Client::open(broker.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: i64 = redis::cmd("PUBLISH")
        .arg("__anycable__")
        .arg(disconnect("dave", true).to_string())
        .query_async(&mut r)
        .await
        .unwrap();
    remotely_closed(&mut dave_a, true).await;
    remotely_closed(&mut dave_b, true).await;
    still_open(&mut bob).await;
}
