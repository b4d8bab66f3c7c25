//! AppSync scales out like Pusher channels: two nodes sharing a broker (the
//! in-process engine, as in the core's cluster tests), each serving the
//! AppSync routes on its own loopback port. A subscriber on one node gets
//! what is published on the other: Events (exact and wildcard channels)
//! and GraphQL.

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use herald_core::broker::local::LocalBroker;
use herald_core::config::{AppConfig, Config};
use herald_core::node::Node;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

const TIMEOUT: Duration = Duration::from_secs(10);

/// A node serving the AppSync routes on a free port.
async fn serve(broker: Arc<LocalBroker>) -> (Arc<Node>, u16) {
    let config = Config {
        apps: vec![AppConfig::development()],
        ..Config::default()
    };
    let node = Node::new(config, broker);
    node.set_ready(true);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    use herald_core::adapter::Adapter;
    let app = herald_appsync::AppSync
        .routes(&node)
        .with_state(node.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (node, port)
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn open(port: u16, path: &str, protocols: &str) -> Ws {
    let mut req = format!("ws://127.0.0.1:{port}{path}")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        HeaderValue::from_str(protocols).unwrap(),
    );
    let (mut ws, _) = tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(req))
        .await
        .unwrap()
        .unwrap();
    ws.send(Message::text(r#"{"type":"connection_init"}"#))
        .await
        .unwrap();
    assert_eq!(recv(&mut ws).await["type"], "connection_ack");
    ws
}

/// The next message that is not a keep-alive.
async fn recv(ws: &mut Ws) -> Value {
    loop {
        let m = tokio::time::timeout(TIMEOUT, ws.next())
            .await
            .expect("a message in time")
            .expect("open")
            .expect("a frame");
        if let Message::Text(t) = m {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["type"] != "ka" {
                return v;
            }
        }
    }
}

async fn post(port: u16, path: &str, body: Value) -> Value {
    let res = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}{path}"))
        .header("x-api-key", "app-key")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publications_cross_nodes() {
    let broker = Arc::new(LocalBroker::new());
    let (_a, port_a) = serve(broker.clone()).await;
    let (_b, port_b) = serve(broker.clone()).await;
    let auth = json!({ "host": "h", "x-api-key": "app-key" }).to_string();

    // Events subscribers on node A.
    let header = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&auth);
    let mut events = open(
        port_a,
        "/event/realtime",
        &format!("aws-appsync-event-ws, header-{header}"),
    )
    .await;
    for (id, channel) in [("exact", "/ns/room"), ("wild", "/ns/*")] {
        events
            .send(Message::text(
                json!({ "type": "subscribe", "id": id, "channel": channel }).to_string(),
            ))
            .await
            .unwrap();
        assert_eq!(recv(&mut events).await["type"], "subscribe_success");
    }
    // A GraphQL subscriber on node A.
    let header = base64::engine::general_purpose::STANDARD.encode(&auth);
    let mut gql = open(port_a, &format!("/graphql?header={header}"), "graphql-ws").await;
    let data =
        json!({ "query": "subscription { subscribe(name: \"room\") { name data } }" }).to_string();
    gql.send(Message::text(
        json!({ "type": "start", "id": "g", "payload": { "data": data } }).to_string(),
    ))
    .await
    .unwrap();
    assert_eq!(recv(&mut gql).await["type"], "start_ack");

    // Publishes on node B reach them.
    post(
        port_b,
        "/event",
        json!({ "channel": "/ns/room", "events": ["\"one\""] }),
    )
    .await;
    post(
        port_b,
        "/event",
        json!({ "channel": "/ns/deeper/path", "events": ["\"two\""] }),
    )
    .await;
    let mut got = Vec::new();
    for _ in 0..3 {
        let m = recv(&mut events).await;
        got.push(format!(
            "{}:{}",
            m["id"].as_str().unwrap(),
            m["event"].as_str().unwrap()
        ));
    }
    got.sort();
    assert_eq!(got, vec!["exact:\"one\"", "wild:\"one\"", "wild:\"two\""]);
    let reply = post(
        port_b,
        "/graphql",
        json!({ "query": "mutation { publish(name: \"room\", data: \"{\\\"n\\\":1}\") { name } }" }),
    )
    .await;
    assert_eq!(reply["data"]["publish"]["name"], "room");
    let m = recv(&mut gql).await;
    assert_eq!(
        m["payload"]["data"]["subscribe"],
        json!({ "name": "room", "data": "{\"n\":1}" })
    );
}
