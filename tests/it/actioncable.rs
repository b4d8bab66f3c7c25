//! Action Cable at /cable over real sockets: bad input of every kind gets
//! the protocol's answer (or Action Cable's silence), is counted, and never
//! disturbs other clients. The app is a small HTTP RPC server in this test
//! (real HTTP on loopback), speaking AnyCable's JSON.

use crate::common;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use common::{Server, TIMEOUT};
use futures_util::SinkExt;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

#[derive(Default)]
struct App {
    /// Calls in the order the app got them (`connect:<user>`, `slow`,
    /// `slow done`).
    calls: std::sync::Mutex<Vec<String>>,
    /// Room "slow"'s subscribe waits for a permit here.
    gate: Gate,
    disconnects: AtomicUsize,
    /// When each Disconnect call arrived.
    disconnect_times: std::sync::Mutex<Vec<std::time::Instant>>,
    /// Each call's method and `env`, in the order the app got them.
    envs: std::sync::Mutex<Vec<(String, Value)>>,
}

/// A semaphore that starts closed (no permits).
struct Gate(tokio::sync::Semaphore);

impl Default for Gate {
    fn default() -> Gate {
        Gate(tokio::sync::Semaphore::new(0))
    }
}

/// Connect: a `user` cookie is required. Subscribe: `{"channel":"Room",
/// "room":R}` streams `room:R`; room "garbage" gets an unreadable answer,
/// room "boom" an ERROR status.
async fn rpc(
    State(app): State<Arc<App>>,
    axum::extract::Path(method): axum::extract::Path<String>,
    Json(body): Json<Value>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    app.envs
        .lock()
        .unwrap()
        .push((method.clone(), body["env"].clone()));
    match method.as_str() {
        "connect" => {
            let cookie = body["env"]["headers"]["cookie"].as_str().unwrap_or("");
            app.calls.lock().unwrap().push(format!("connect:{cookie}"));
            match cookie.strip_prefix("user=") {
                Some(user) => Json(json!({
                    "status": 1,
                    "identifiers": json!({ "user": user }).to_string(),
                    "transmissions": [r#"{"type":"welcome"}"#],
                }))
                .into_response(),
                None => Json(json!({
                    "status": 2,
                    "transmissions": [r#"{"type":"disconnect","reason":"unauthorized","reconnect":false}"#],
                }))
                .into_response(),
            }
        }
        "command" => {
            let identifier = body["identifier"].as_str().unwrap_or_default().to_owned();
            let params: Value = serde_json::from_str(&identifier).unwrap_or(Value::Null);
            let room = params["room"].as_str().unwrap_or_default();
            if room == "slow" {
                app.calls.lock().unwrap().push("slow".into());
                app.gate.0.acquire().await.unwrap().forget();
                app.calls.lock().unwrap().push("slow done".into());
            }
            match (body["command"].as_str(), room) {
                (_, "garbage") => "{not json".into_response(),
                (_, "boom") => Json(json!({ "status": 0, "error_msg": "exception" })).into_response(),
                (Some("subscribe"), _) => Json(json!({
                    "status": 1,
                    "streams": [format!("room:{room}")],
                    "transmissions": [json!({ "identifier": identifier, "type": "confirm_subscription" }).to_string()],
                }))
                .into_response(),
                _ => Json(json!({ "status": 1 })).into_response(),
            }
        }
        "disconnect" => {
            app.disconnect_times
                .lock()
                .unwrap()
                .push(std::time::Instant::now());
            app.disconnects.fetch_add(1, Ordering::SeqCst);
            Json(json!({ "status": 1 })).into_response()
        }
        _ => axum::http::StatusCode::NOT_FOUND.into_response(),
    }
}

/// The app on a loopback port; returns its base URL.
async fn start_app(app: Arc<App>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let router = Router::new()
        .route("/rpc/{method}", post(rpc))
        .with_state(app);
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://127.0.0.1:{port}/rpc")
}

async fn server(app: &Arc<App>, extra: &str) -> Server {
    let url = start_app(app.clone()).await;
    Server::start_with(
        &format!("[rpc]\nhost = \"{url}\"\ntimeout_ms = 1000\nretries = 1\n{extra}"),
        "",
    )
    .await
}

type Ws = common::Ws;

async fn cable(server: &Server, cookie: Option<&str>) -> Ws {
    let mut req = format!("ws://127.0.0.1:{}/cable", server.port)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        "actioncable-v1-json".parse().unwrap(),
    );
    if let Some(c) = cookie {
        req.headers_mut().insert("cookie", c.parse().unwrap());
    }
    let (ws, resp) = tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(req))
        .await
        .expect("connect timed out")
        .expect("connect");
    assert_eq!(
        resp.headers()
            .get("sec-websocket-protocol")
            .and_then(|v| v.to_str().ok()),
        Some("actioncable-v1-json")
    );
    ws
}

/// The next frame that is not a ping.
async fn next(ws: &mut Ws) -> common::Next {
    loop {
        match common::next(ws).await {
            common::Next::Frame(f) if f["type"] == "ping" => continue,
            other => return other,
        }
    }
}

async fn frame(ws: &mut Ws) -> Value {
    match next(ws).await {
        common::Next::Frame(f) => f,
        common::Next::Close(c) => panic!("closed ({c:?}) while a frame was expected"),
    }
}

async fn send(ws: &mut Ws, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

fn room(r: &str) -> String {
    json!({ "channel": "Room", "room": r }).to_string()
}

/// A welcomed client subscribed to `room`.
async fn member(server: &Server, r: &str) -> Ws {
    let mut ws = cable(server, Some("user=bystander")).await;
    assert_eq!(frame(&mut ws).await["type"], "welcome");
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": room(r) }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    ws
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

/// Wait until the app has had `n` Disconnect calls.
async fn disconnects_reach(app: &App, n: usize) {
    let deadline = std::time::Instant::now() + TIMEOUT;
    while app.disconnects.load(Ordering::SeqCst) < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {n} Disconnect calls",
            app.disconnects.load(Ordering::SeqCst)
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `ws` (subscribed to room `r`) still gets broadcasts.
async fn still_served(server: &Server, ws: &mut Ws, r: &str) {
    broadcast(server, &format!("room:{r}"), json!({ "ok": true })).await;
    let f = frame(ws).await;
    assert_eq!(f["identifier"], room(r));
    assert_eq!(f["message"], json!({ "ok": true }));
}

#[tokio::test]
async fn malformed_and_unknown_commands_are_ignored_and_counted() {
    let app = Arc::new(App::default());
    let server = server(&app, "").await;
    let mut other = member(&server, "calm").await;
    let mut ws = member(&server, "busy").await;
    let before = server.metric("herald_bad_messages_total").await;
    let bad = [
        "not json".to_owned(),
        "[1,2]".into(),
        r#"{"command":"subscribe"}"#.into(),
        r#"{"command":"subscribe","identifier":{"channel":"Room"}}"#.into(),
        r#"{"command":"bogus","identifier":"x"}"#.into(),
        json!({ "command": "message", "identifier": room("nowhere"), "data": "{}" }).to_string(),
        json!({ "command": "unsubscribe", "identifier": room("nowhere") }).to_string(),
        json!({ "command": "message", "identifier": room("busy"), "data": {"action": "x"} })
            .to_string(),
        // Subscribing twice to one identifier: no second answer.
        json!({ "command": "subscribe", "identifier": room("busy") }).to_string(),
        // Nesting past serde_json's bound (128), in the frame and in the
        // identifier's own JSON.
        format!("{}1{}", "[".repeat(20_000), "]".repeat(20_000)),
        json!({ "command": "subscribe", "identifier": format!("{}1{}", "[".repeat(20_000), "]".repeat(20_000)) }).to_string(),
    ];
    for text in &bad {
        ws.send(Message::text(text.clone())).await.unwrap();
    }
    // Nothing came back for any of them: the next frame is the broadcast,
    // once (the double subscribe did not double the stream).
    still_served(&server, &mut ws, "busy").await;
    broadcast(&server, "room:busy", json!({ "n": 2 })).await;
    assert_eq!(frame(&mut ws).await["message"], json!({ "n": 2 }));
    let after = server.metric("herald_bad_messages_total").await;
    assert_eq!(after - before, bad.len() as u64, "each bad command counted");
    still_served(&server, &mut other, "calm").await;
    // The broadcast endpoint reads JSON too.
    let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
    let resp = reqwest::Client::new()
        .post(server.url("/_broadcast"))
        .body(deep)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    still_served(&server, &mut other, "calm").await;
}

#[tokio::test]
async fn oversized_and_binary_frames_close_with_invalid_request() {
    let app = Arc::new(App::default());
    let server = server(&app, "").await;
    let mut other = member(&server, "calm").await;

    let mut ws = member(&server, "big").await;
    let huge = json!({ "command": "subscribe", "identifier": "x".repeat(70 * 1024) }).to_string();
    ws.send(Message::text(huge)).await.unwrap();
    let f = frame(&mut ws).await;
    assert_eq!(
        f,
        json!({ "type": "disconnect", "reason": "invalid_request", "reconnect": false })
    );
    assert!(matches!(
        next(&mut ws).await,
        common::Next::Close(Some(1009))
    ));

    let mut ws = member(&server, "bin").await;
    ws.send(Message::binary(vec![1, 2, 3])).await.unwrap();
    assert_eq!(frame(&mut ws).await["reason"], "invalid_request");
    assert!(matches!(
        next(&mut ws).await,
        common::Next::Close(Some(1003))
    ));

    // An identifier over the 1 KiB limit is ignored like other bad input.
    let mut ws = member(&server, "long").await;
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": "y".repeat(2000) }),
    )
    .await;
    still_served(&server, &mut ws, "long").await;

    still_served(&server, &mut other, "calm").await;
}

#[tokio::test]
async fn rpc_failures_reject_the_subscription_and_spare_the_rest() {
    let app = Arc::new(App::default());
    let server = server(&app, "").await;
    let mut other = member(&server, "calm").await;
    let mut ws = member(&server, "fine").await;
    let errors = server.metric("herald_rpc_errors_total").await;
    for r in ["garbage", "boom"] {
        send(
            &mut ws,
            json!({ "command": "subscribe", "identifier": room(r) }),
        )
        .await;
        assert_eq!(
            frame(&mut ws).await,
            json!({ "identifier": room(r), "type": "reject_subscription" })
        );
    }
    assert!(server.metric("herald_rpc_errors_total").await > errors);
    assert!(server.metric("herald_rpc_app_errors_total").await >= 1);
    assert!(server.metric("herald_cable_rpc_failures_total").await >= 2);
    still_served(&server, &mut ws, "fine").await;
    still_served(&server, &mut other, "calm").await;
}

#[tokio::test]
async fn refused_connections_get_the_apps_message_and_no_disconnect_call() {
    let app = Arc::new(App::default());
    let server = server(&app, "").await;
    let mut ws = cable(&server, None).await;
    assert_eq!(
        frame(&mut ws).await,
        json!({ "type": "disconnect", "reason": "unauthorized", "reconnect": false })
    );
    assert!(matches!(
        next(&mut ws).await,
        common::Next::Close(Some(1000))
    ));
    assert_eq!(server.metric("herald_cable_unauthorized_total").await, 1);
    // A connected client that leaves is reported; the refused one was not.
    let ws = member(&server, "x").await;
    drop(ws);
    disconnects_reach(&app, 1).await;
    assert_eq!(app.disconnects.load(Ordering::SeqCst), 1);
}

/// Every call tells the app the request as AnyCable does: the URL, the
/// forwarded headers and the client's address as `REMOTE_ADDR`.
#[tokio::test]
async fn every_call_carries_the_url_the_cookie_and_the_remote_address() {
    let app = Arc::new(App::default());
    let server = server(&app, "").await;
    let ws = member(&server, "env").await;
    drop(ws);
    disconnects_reach(&app, 1).await;
    let envs = app.envs.lock().unwrap().clone();
    let methods: Vec<&str> = envs.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(methods, ["connect", "command", "disconnect"]);
    for (method, env) in &envs {
        assert_eq!(
            env["url"],
            format!("http://127.0.0.1:{}/cable", server.port),
            "{method}"
        );
        assert_eq!(env["headers"]["cookie"], "user=bystander", "{method}");
        assert_eq!(env["headers"]["REMOTE_ADDR"], "127.0.0.1", "{method}");
    }
}

#[tokio::test]
async fn disconnect_calls_are_rate_limited() {
    let app = Arc::new(App::default());
    // Four calls per second: four clients leaving at once are reported
    // over about 750 ms, not in one burst.
    let server = server(&app, "disconnect_rate = 4").await;
    let mut clients = Vec::new();
    for i in 0..4 {
        clients.push(member(&server, &format!("r{i}")).await);
    }
    drop(clients);
    disconnects_reach(&app, 4).await;
    let times = app.disconnect_times.lock().unwrap().clone();
    let spread = *times.iter().max().unwrap() - *times.iter().min().unwrap();
    assert!(
        spread >= std::time::Duration::from_millis(600),
        "4 calls at 4/s arrived within {spread:?}"
    );
}

#[tokio::test]
async fn the_disconnect_queue_is_bounded_and_counts_what_it_drops() {
    let app = Arc::new(App::default());
    // One call per second and room for three waiting: ten clients leaving
    // at once overflow it (clients that connect and leave faster than the
    // rate must not grow the queue without end).
    let server = server(&app, "disconnect_rate = 1\ndisconnect_queue = 3").await;
    let mut clients = Vec::new();
    for i in 0..10 {
        clients.push(member(&server, &format!("r{i}")).await);
    }
    drop(clients);
    let deadline = std::time::Instant::now() + TIMEOUT;
    let (made, dropped) = loop {
        let made = app.disconnects.load(Ordering::SeqCst) as u64;
        let dropped = server.metric("herald_rpc_disconnects_dropped_total").await;
        if made + dropped == 10 {
            break (made, dropped);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{made} made, {dropped} dropped of 10"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    // At most three waited, plus the one the drain took at once (and one
    // more per second the sessions took to end).
    assert!((3..=6).contains(&made), "{made} made, {dropped} dropped");
    assert_eq!(
        server.metric("herald_rpc_disconnects_queued_total").await,
        made
    );
    assert_eq!(server.log().matches("Disconnect queue full").count(), 1);
}

#[tokio::test]
async fn disconnect_calls_are_made_before_a_graceful_shutdown_ends() {
    let app = Arc::new(App::default());
    // One call per second: the queue outlasts the clients, and shutdown
    // must still make every call.
    let mut server = server(&app, "disconnect_rate = 1").await;
    let mut clients = Vec::new();
    for i in 0..5 {
        clients.push(member(&server, &format!("r{i}")).await);
    }
    drop(clients);
    // SIGTERM: the sessions are gone already; the queued calls go out now.
    unsafe { libc::kill(server.pid(), libc::SIGTERM) };
    let status = server.wait_exit().await;
    assert!(status.success(), "{status}");
    assert_eq!(
        app.disconnects.load(Ordering::SeqCst),
        5,
        "{}",
        server.log()
    );
}

#[tokio::test]
async fn signed_and_public_streams_without_the_app() {
    let server = Server::start_with("[rpc]\npublic_streams = false", "").await;
    let mut ws = cable(&server, None).await;
    let welcome = frame(&mut ws).await;
    assert_eq!(welcome["type"], "welcome");
    assert!(welcome["sid"].is_string());
    let public = json!({ "channel": "$pubsub", "stream_name": "open" }).to_string();
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": public }),
    )
    .await;
    assert_eq!(
        frame(&mut ws).await["type"],
        "reject_subscription",
        "public streams are off"
    );
    let signed_name =
        herald_actioncable::streams::signed_stream(common::APP_SECRET, "secret-stream");
    let signed = json!({ "channel": "$pubsub", "signed_stream_name": signed_name }).to_string();
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": signed }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    let forged = json!({ "channel": "$pubsub", "signed_stream_name": format!("{signed_name}0") })
        .to_string();
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": forged }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "reject_subscription");
    // Any other channel needs the app, which is not configured.
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": room("a") }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "reject_subscription");
    broadcast(&server, "secret-stream", json!("hi")).await;
    let f = frame(&mut ws).await;
    assert_eq!(f["identifier"], signed);
    assert_eq!(f["message"], "hi");
}

#[tokio::test]
async fn bench_rpc_server_and_scenario_over_grpc() {
    use herald_bench::rpc;
    // The bench's BenchmarkChannel app on a free port.
    let port = common::free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let app = Arc::new(rpc::BenchApp::new(String::new(), None));
    let server_task = tokio::spawn(rpc::serve(addr, app.clone(), async {
        let _ = stop_rx.await;
    }));
    // The scenario against it: every echo answered, none failed.
    let target = format!("127.0.0.1:{port}");
    let mut run = None;
    for _ in 0..50 {
        match rpc::run_once(&target, 2, 1, std::time::Duration::from_millis(300)).await {
            Ok(r) => {
                run = Some(r);
                break;
            }
            // The server may not be listening yet.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
    let run = run.expect("the bench RPC server answered");
    assert!(run.requests > 0, "{run:?}");
    assert_eq!(run.errors, 0, "{run:?}");
    assert!(run.p50 > 0 && run.p50 <= run.p99);
    let _ = stop_tx.send(());
    let _ = server_task.await;
}

#[tokio::test]
async fn herald_calls_a_grpc_app_benchmark_channel_broadcasts() {
    use herald_bench::rpc;
    let port = common::free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // Herald first (the app broadcasts to it), then the app.
    let server = Server::start_with(
        &format!("[rpc]\nhost = \"grpc://127.0.0.1:{port}\"\ntimeout_ms = 3000"),
        "",
    )
    .await;
    let app = Arc::new(rpc::BenchApp::new(server.url("/_broadcast"), None));
    tokio::spawn(rpc::serve(addr, app, std::future::pending()));
    let mut ws = None;
    for _ in 0..50 {
        let mut c = cable(&server, None).await;
        match next(&mut c).await {
            common::Next::Frame(f) if f["type"] == "welcome" => {
                ws = Some(c);
                break;
            }
            // The app was not listening yet: rpc_error, try again.
            _ => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
    let mut ws = ws.expect("welcomed through the gRPC app");
    let id = json!({ "channel": "BenchmarkChannel" }).to_string();
    send(&mut ws, json!({ "command": "subscribe", "identifier": id })).await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    let data = json!({ "action": "broadcast", "payload": "x" }).to_string();
    send(
        &mut ws,
        json!({ "command": "message", "identifier": id, "data": data }),
    )
    .await;
    // The broadcast (through /_broadcast) and the answer to the sender, in
    // either order.
    let mut got = [frame(&mut ws).await, frame(&mut ws).await];
    got.sort_by_key(|f| f["message"]["action"].as_str().unwrap_or("").to_owned());
    assert_eq!(
        got[0]["message"],
        json!({ "action": "broadcast", "payload": "x" })
    );
    assert_eq!(
        got[1]["message"],
        json!({ "action": "broadcastResult", "payload": "x" })
    );
    assert_eq!(got[1]["identifier"], id);
}

#[tokio::test]
async fn jwt_identification_without_the_app() {
    let server = Server::start_with("[rpc]\njwt_secret = \"jwt-key\"\njwt_force = true", "").await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let open = |query: String| {
        let url = format!("ws://127.0.0.1:{}/cable{query}", server.port);
        async move {
            let (ws, _) = tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(url))
                .await
                .expect("connect timed out")
                .expect("connect");
            ws
        }
    };
    // A valid token: welcomed with a sid, no app needed.
    let token = herald_actioncable::jwt::sign("jwt-key", r#"{"user":"a"}"#, now + 60);
    let mut ws = open(format!("?jid={token}")).await;
    let f = frame(&mut ws).await;
    assert_eq!(f["type"], "welcome");
    assert!(f["sid"].is_string());
    // Expired, forged, missing: refused, each with its reason.
    let expired = herald_actioncable::jwt::sign("jwt-key", r#"{"user":"a"}"#, now - 1);
    let forged = herald_actioncable::jwt::sign("other-key", r#"{"user":"a"}"#, now + 60);
    for (query, reason) in [
        (format!("?jid={expired}"), "token_expired"),
        (format!("?jid={forged}"), "unauthorized"),
        (String::new(), "unauthorized"),
    ] {
        let mut ws = open(query).await;
        assert_eq!(
            frame(&mut ws).await,
            json!({ "type": "disconnect", "reason": reason, "reconnect": false })
        );
        assert!(matches!(
            next(&mut ws).await,
            common::Next::Close(Some(1000))
        ));
    }
    // The x-jid header works too.
    let mut req = format!("ws://127.0.0.1:{}/cable", server.port)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert("x-jid", token.parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    assert_eq!(frame(&mut ws).await["type"], "welcome");
}

/// gRPC over TLS (`rpc.tls`): the app serves `anycable.RPC` with the test
/// certificate; with the certificate as `rpc.tls_root_ca` Herald connects
/// and the client is welcomed and subscribed through it; without it the
/// certificate is not trusted and the client gets `rpc_error`.
#[tokio::test]
async fn grpc_over_tls_verifies_the_apps_certificate() {
    use herald_bench::rpc;
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let cert = fixtures.join("tls-test-cert.pem");
    let key = fixtures.join("tls-test-key.pem");
    let port = common::free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let app = Arc::new(rpc::BenchApp::new(String::new(), None));
    tokio::spawn(rpc::serve_tls(
        addr,
        app,
        std::fs::read(&cert).unwrap(),
        std::fs::read(&key).unwrap(),
        std::future::pending(),
    ));
    let trusted = Server::start_with(
        &format!(
            "[rpc]\nhost = \"127.0.0.1:{port}\"\ntls = true\ntls_root_ca = {:?}\ntimeout_ms = 3000",
            cert.display().to_string()
        ),
        "",
    )
    .await;
    let mut ws = None;
    for _ in 0..50 {
        let mut c = cable(&trusted, None).await;
        match next(&mut c).await {
            common::Next::Frame(f) if f["type"] == "welcome" => {
                ws = Some(c);
                break;
            }
            // The app was not listening yet: rpc_error, try again.
            _ => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
    let mut ws = ws.unwrap_or_else(|| panic!("welcomed over TLS; log:\n{}", trusted.log()));
    let id = json!({ "channel": "BenchmarkChannel" }).to_string();
    send(&mut ws, json!({ "command": "subscribe", "identifier": id })).await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");

    // The same app, its certificate not trusted: no welcome, rpc_error.
    let untrusted = Server::start_with(
        &format!("[rpc]\nhost = \"127.0.0.1:{port}\"\ntls = true\ntimeout_ms = 2000\nretries = 0"),
        "",
    )
    .await;
    let mut c = cable(&untrusted, None).await;
    let f = frame(&mut c).await;
    assert_eq!(f["type"], "disconnect", "{f}");
    assert_eq!(f["reason"], "rpc_error", "{f}");
}

/// Herald calling `app` one call at a time (`rpc.concurrency = 1`).
async fn one_call_at_a_time(app: &Arc<App>, timeout_ms: u64) -> Server {
    let url = start_app(app.clone()).await;
    let rpc = format!("[rpc]\nhost = \"{url}\"\ntimeout_ms = {timeout_ms}\nconcurrency = 1");
    Server::start_with(&rpc, "").await
}

/// Herald calling `app` one call at a time, and a client whose subscribe
/// to room "slow" holds that one place (the app waits on its gate).
async fn holding_the_only_place(app: &Arc<App>, timeout_ms: u64) -> (Server, Ws) {
    let server = one_call_at_a_time(app, timeout_ms).await;
    let mut first = cable(&server, Some("user=first")).await;
    assert_eq!(frame(&mut first).await["type"], "welcome");
    send(
        &mut first,
        json!({ "command": "subscribe", "identifier": room("slow") }),
    )
    .await;
    app_got(app, "slow").await;
    (server, first)
}

/// Until the app has got `call`.
async fn app_got(app: &App, call: &str) {
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !app.calls.lock().unwrap().iter().any(|c| c == call) {
        assert!(
            std::time::Instant::now() < deadline,
            "the app never got {call}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn calls_beyond_rpc_concurrency_wait_their_turn() {
    // One call at a time: a newcomer's Connect waits for the subscribe in
    // flight, and reaches the app only once that call is answered.
    let app = Arc::new(App::default());
    let (server, mut first) = holding_the_only_place(&app, 10_000).await;
    let mut newcomer = cable(&server, Some("user=second")).await;
    // Upgraded, it waits for its place: nothing within half a second (a
    // window only a broken limit can fail), and the app has not heard of it.
    let early = tokio::time::timeout(std::time::Duration::from_millis(500), frame(&mut newcomer));
    assert!(
        early.await.is_err(),
        "the newcomer was answered while the only place was taken"
    );
    assert!(!app
        .calls
        .lock()
        .unwrap()
        .iter()
        .any(|c| c == "connect:user=second"));
    app.gate.0.add_permits(1);
    assert_eq!(frame(&mut first).await["type"], "confirm_subscription");
    assert_eq!(frame(&mut newcomer).await["type"], "welcome");
    let calls = app.calls.lock().unwrap().clone();
    let at = |c: &str| calls.iter().position(|x| x == c).unwrap();
    assert!(at("slow done") < at("connect:user=second"), "{calls:?}");
}

#[tokio::test]
async fn a_call_the_app_never_answers_frees_its_place_at_rpc_timeout() {
    // The only place is held by a call the app never answers: at
    // `rpc.timeout_ms` that call fails (its subscription is rejected) and
    // the newcomer waiting behind it is served.
    let app = Arc::new(App::default());
    let (server, mut first) = holding_the_only_place(&app, 600).await;
    let timeouts = server.metric("herald_rpc_timeouts_total").await;
    let mut newcomer = cable(&server, Some("user=second")).await;
    assert_eq!(frame(&mut first).await["type"], "reject_subscription");
    assert_eq!(frame(&mut newcomer).await["type"], "welcome");
    assert!(server.metric("herald_rpc_timeouts_total").await > timeouts);
    let calls = app.calls.lock().unwrap().clone();
    assert!(!calls.iter().any(|c| c == "slow done"), "{calls:?}");
    app.gate.0.add_permits(1);
}
