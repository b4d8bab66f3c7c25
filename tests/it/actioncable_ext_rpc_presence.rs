//! Server-side presence, AnyCable's `CommandResponse.presence`
//! (field 9): the app's answer to `subscribe` joins the connection to the
//! subscription's presence stream (`$p`), and its answer to an action
//! leaves it; the stream's subscribers see the join and the leave and
//! `presence` info counts the member. Over both RPC transports, against a
//! real herald: gRPC with `herald bench rpc-server`, HTTP RPC with a small
//! app in this file.

use crate::common;

use axum::routing::post;
use axum::{Json, Router};
use common::ext::{cable, frame, send};
use common::{Server, Ws};
use serde_json::{json, Value};

async fn welcomed(server: &Server) -> Ws {
    let mut ws = cable(server, "").await;
    assert_eq!(frame(&mut ws).await["type"], "welcome");
    ws
}

/// Subscribe `identifier`; the confirmation comes first, then the join
/// the app's answer made (the joiner is a subscriber of the stream too).
async fn subscribe_and_join(ws: &mut Ws, identifier: &str, id: &str) {
    send(
        ws,
        json!({ "command": "subscribe", "identifier": identifier }),
    )
    .await;
    assert_eq!(frame(ws).await["type"], "confirm_subscription");
    assert_eq!(
        frame(ws).await,
        json!({ "type": "presence", "identifier": identifier,
                "message": { "id": id, "info": { "id": id }, "type": "join" } })
    );
}

async fn total(ws: &mut Ws, identifier: &str) -> Value {
    send(
        ws,
        json!({ "command": "presence", "identifier": identifier, "data": {} }),
    )
    .await;
    let f = frame(ws).await;
    assert_eq!(f["message"]["type"], "info", "{f}");
    f["message"]["total"].clone()
}

/// Two clients, each joined by the app; one leaves by an action.
async fn joins_and_leaves_from_the_app(server: &Server, a_id: &str, b_id: &str, leave: Value) {
    let mut a = welcomed(server).await;
    let mut b = welcomed(server).await;
    subscribe_and_join(&mut a, a_id, "u1").await;
    subscribe_and_join(&mut b, b_id, "u2").await;
    // A (on the same stream) sees B join.
    assert_eq!(
        frame(&mut a).await["message"],
        json!({ "id": "u2", "info": { "id": "u2" }, "type": "join" })
    );
    assert_eq!(total(&mut a, a_id).await, 2);
    send(
        &mut b,
        json!({ "command": "message", "identifier": b_id, "data": leave.to_string() }),
    )
    .await;
    assert_eq!(
        frame(&mut a).await,
        json!({ "type": "presence", "identifier": a_id,
                "message": { "id": "u2", "type": "leave" } })
    );
    assert_eq!(total(&mut a, a_id).await, 1);
}

#[tokio::test]
async fn the_apps_grpc_answer_joins_and_leaves_presence() {
    let rpc_port = common::free_port();
    let server = Server::start_with(
        &format!("[rpc]\nhost = \"127.0.0.1:{rpc_port}\"\ntimeout_ms = 5000\n"),
        "",
    )
    .await;
    let _app = common::ext::rpc_app(rpc_port, &server.url("/_broadcast")).await;
    let ident =
        |id: &str| json!({ "channel": "BenchmarkChannel", "id": 3, "presence": id }).to_string();
    joins_and_leaves_from_the_app(
        &server,
        &ident("u1"),
        &ident("u2"),
        json!({ "action": "leave" }),
    )
    .await;
}

/// HTTP RPC: every connection is accepted; `{"channel":"Room","user":U}`
/// streams `room` with `$p` and joins `U` (info `{"id":U}`, as JSON text);
/// the action `leave` leaves; the action `bad` answers a join with an
/// empty id (refused: counted, nothing sent).
async fn rpc(
    axum::extract::Path(method): axum::extract::Path<String>,
    Json(body): Json<Value>,
) -> Json<Value> {
    let ok = json!({ "status": "SUCCESS", "identifiers": "{}", "transmissions": [r#"{"type":"welcome"}"#] });
    if method != "command" {
        return Json(ok);
    }
    let identifier = body["identifier"].as_str().unwrap_or_default().to_owned();
    let params: Value = serde_json::from_str(&identifier).unwrap_or(Value::Null);
    let user = params["user"].as_str().unwrap_or_default();
    let data: Value =
        serde_json::from_str(body["data"].as_str().unwrap_or("null")).unwrap_or_default();
    Json(match (body["command"].as_str(), data["action"].as_str()) {
        (Some("subscribe"), _) => json!({
            "status": "SUCCESS",
            "streams": ["room"],
            "env": { "istate": { "$p": "room" } },
            "presence": { "type": "join", "id": user, "info": json!({ "id": user }).to_string() },
            "transmissions": [json!({ "identifier": identifier, "type": "confirm_subscription" }).to_string()],
        }),
        (_, Some("leave")) => json!({ "status": "SUCCESS", "presence": { "type": "leave" } }),
        (_, Some("bad")) => {
            json!({ "status": "SUCCESS", "presence": { "type": "join", "id": "" } })
        }
        _ => json!({ "status": "SUCCESS" }),
    })
}

#[tokio::test]
async fn the_apps_http_rpc_answer_joins_and_leaves_presence() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let router = Router::new().route("/rpc/{method}", post(rpc));
    tokio::spawn(async move { axum::serve(listener, router).await });
    let server = Server::start_with(
        &format!("[rpc]\nhost = \"http://127.0.0.1:{port}/rpc\"\ntimeout_ms = 5000\n"),
        "",
    )
    .await;
    let ident = |id: &str| json!({ "channel": "Room", "user": id }).to_string();
    joins_and_leaves_from_the_app(
        &server,
        &ident("u1"),
        &ident("u2"),
        json!({ "action": "leave" }),
    )
    .await;
    // A refused join from the app: counted, the client still served.
    let mut c = welcomed(&server).await;
    subscribe_and_join(&mut c, &ident("u3"), "u3").await;
    send(
        &mut c,
        json!({ "command": "message", "identifier": ident("u3"), "data": json!({ "action": "bad" }).to_string() }),
    )
    .await;
    // u3, and u1, whose socket closed without leaving: it stays present
    // for rpc.presence_ttl (15 s); u2 left, and the empty id never joined.
    assert_eq!(total(&mut c, &ident("u3")).await, 2);
    assert_eq!(
        server.metric("herald_cable_presence_refused_total").await,
        1
    );
}
