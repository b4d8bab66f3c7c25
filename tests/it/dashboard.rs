//! The dashboard over real HTTP: off by default, its API behind the
//! token, a test event validated like the HTTP API's and delivered, and
//! the live console as server-sent events. (conformance/ drives the page
//! itself in headless Chromium.)

use crate::common;

use common::*;
use serde_json::{json, Value};

const TOKEN: &str = "a-dashboard-token-for-tests";

fn dashboard_config() -> String {
    format!("dashboard = true\ndashboard_token = \"{TOKEN}\"")
}

async fn get(server: &Server, path: &str, token: Option<&str>) -> (u16, String) {
    let mut req = reqwest::Client::new().get(server.url(path));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = tokio::time::timeout(TIMEOUT, req.send())
        .await
        .unwrap()
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

async fn post(server: &Server, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(server.url(path))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn off_unless_enabled() {
    let server = Server::start_with(&format!("dashboard_token = \"{TOKEN}\""), "").await;
    assert_eq!(get(&server, "/dashboard", None).await.0, 404);
    assert_eq!(
        get(&server, "/dashboard/api/stats", Some(TOKEN)).await.0,
        404
    );
}

/// The dashboard switched on by environment alone (no file key), its URL
/// in the start-up log; a token with the dashboard off is a warning, not
/// silence. Neither log line shows the token.
#[tokio::test]
async fn the_environment_switches_it_on_and_the_log_says_where() {
    let server = Server::start_with_env(
        "",
        "",
        &[
            ("HERALD_DASHBOARD", "true"),
            ("HERALD_DASHBOARD_TOKEN", TOKEN),
            ("HERALD_LOG", "info"),
        ],
    )
    .await;
    assert_eq!(get(&server, "/dashboard", None).await.0, 200);
    let log = server.log();
    let url = format!("http://127.0.0.1:{}/dashboard", server.port);
    assert!(log.contains(&url), "{log}");
    assert!(!log.contains(TOKEN), "{log}");

    let off = Server::start_with_env("", "", &[("HERALD_DASHBOARD_TOKEN", TOKEN)]).await;
    assert_eq!(get(&off, "/dashboard", None).await.0, 404);
    let log = off.log();
    assert!(
        log.contains("dashboard_token is set but the dashboard is off"),
        "{log}"
    );
    assert!(!log.contains(TOKEN), "{log}");
    assert!(
        !log.contains("\u{1b}["),
        "colour codes in a log file: {log}"
    );
}

#[tokio::test]
async fn the_api_wants_the_token_and_reports_the_app() {
    let server = Server::start_with(&dashboard_config(), "").await;
    let (status, page) = get(&server, "/dashboard", None).await;
    assert_eq!(status, 200);
    assert!(page.contains("/dashboard/assets/app.js"));
    assert_eq!(get(&server, "/dashboard/assets/app.js", None).await.0, 200);
    assert_eq!(get(&server, "/dashboard/assets/nope.js", None).await.0, 404);
    assert_eq!(get(&server, "/dashboard/api/stats", None).await.0, 401);
    assert_eq!(
        get(&server, "/dashboard/api/stats", Some("wrong")).await.0,
        401
    );

    let mut c = server.client().await;
    c.subscribe("dash").await;
    let (status, body) = get(&server, "/dashboard/api/stats", Some(TOKEN)).await;
    assert_eq!(status, 200);
    let stats: Value = serde_json::from_str(&body).unwrap();
    let app = &stats["apps"][0];
    assert_eq!(app["id"], APP_ID);
    // Where it came from and whether it serves, never a secret.
    assert_eq!(
        (&app["source"], &app["enabled"]),
        (&json!("file"), &json!(true))
    );
    assert!(!body.contains(APP_SECRET), "{body}");
    assert_eq!(app["connections"], 1);
    assert_eq!(app["channels"], 1);
    assert_eq!(app["subscriptions"], 1);
    // Figures per protocol namespace too.
    assert_eq!(
        app["namespaces"],
        json!([{"namespace": "pusher", "channels": 1, "subscriptions": 1}])
    );
    let (_, body) = get(
        &server,
        &format!("/dashboard/api/apps/{APP_ID}/channels"),
        Some(TOKEN),
    )
    .await;
    let channels: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        channels["channels"],
        json!([{"namespace": "pusher", "name": "dash", "subscriptions": 1, "users": 0}])
    );
    let (status, _) = get(&server, "/dashboard/api/apps/nope/channels", Some(TOKEN)).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn test_events_reach_clients_and_the_console() {
    let server = Server::start_with(&dashboard_config(), "").await;
    let mut c = server.client().await;
    c.subscribe("dash").await;

    // Open the console: a server-sent event stream.
    let resp = reqwest::Client::new()
        .get(server.url(&format!("/dashboard/api/apps/{APP_ID}/events")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut resp = resp;

    let path = format!("/dashboard/api/apps/{APP_ID}/events");
    let (status, body) = post(
        &server,
        &path,
        json!({"channel": "dash", "name": "hello", "data": "{\"n\":1}"}),
    )
    .await;
    assert_eq!((status, body), (200, json!({"ok": true})));
    let got = c.expect("hello", Some("dash")).await;
    assert_eq!(data(&got), json!({"n": 1}));

    let mut text = String::new();
    while !text.contains("\"type\":\"event\"") {
        let chunk = tokio::time::timeout(TIMEOUT, resp.chunk())
            .await
            .expect("console event timed out")
            .unwrap()
            .expect("stream open");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let line = text
        .lines()
        .find(|l| l.contains("\"type\":\"event\""))
        .unwrap();
    let ev: Value = serde_json::from_str(line.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(ev["channel"], "dash");
    assert_eq!(ev["event"], "hello");
    assert_eq!(ev["data"], "{\"n\":1}");

    // Validated as the HTTP API validates events.
    let (status, body) = post(
        &server,
        &path,
        json!({"channel": "bad name", "name": "e", "data": "x"}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("channel"),
        "{body}"
    );
    let (status, _) = post(
        &server,
        &path,
        json!({"channel": "dash", "name": "pusher:x", "data": "x"}),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = post(
        &server,
        &path,
        json!({"channel": "dash", "name": "e", "data": "x".repeat(20_000)}),
    )
    .await;
    assert_eq!(status, 413);
}
