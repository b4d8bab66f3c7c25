//! `/metrics` parsed as Prometheus text format, its counters and gauges
//! checked against what the test did; `metrics_port`; JSON logs.

use crate::common;

use common::*;
use futures_util::SinkExt;
use serde_json::{json, Value};

const PUSHER: (&str, &str) = ("protocol", "pusher");
const APP: (&str, &str) = ("app", APP_ID);

#[tokio::test]
async fn counters_and_gauges_follow_what_clients_do() {
    let server = Server::start().await;
    let m = |s: &prometheus_parse::Scrape, name: &str, extra: &[(&str, &str)]| {
        let mut labels = vec![APP, PUSHER];
        labels.extend_from_slice(extra);
        metric_in(s, name, &labels)
    };
    let mut a = server.client().await;
    let mut b = server.client().await;
    a.subscribe("m1").await;
    b.subscribe("m1").await;
    b.subscribe("m2").await;

    let s = server.scrape().await;
    assert_eq!(m(&s, "herald_connections", &[]), Some(2));
    assert_eq!(m(&s, "herald_connections_opened_total", &[]), Some(2));
    assert_eq!(
        m(&s, "herald_messages_received_total", &[]),
        Some(3),
        "three subscribes"
    );
    let received = json!({"event": "pusher:subscribe", "data": {"channel": "m1"}})
        .to_string()
        .len() as u64;
    assert!(m(&s, "herald_bytes_received_total", &[]).unwrap() >= 3 * received - 10);
    // connection_established and subscription_succeeded frames.
    assert_eq!(m(&s, "herald_messages_sent_total", &[]), Some(5));
    assert!(m(&s, "herald_bytes_sent_total", &[]).unwrap() > 5 * 20);
    assert_eq!(metric_in(&s, "herald_channels", &[APP]), Some(2));
    assert_eq!(metric_in(&s, "herald_subscriptions", &[APP]), Some(3));
    assert_eq!(
        metric_in(&s, "herald_broker_up", &[("broker", "local")]),
        Some(1)
    );

    // A publication: one fan-out, observed by the histogram.
    server.trigger("m1", "e", "x").await;
    a.expect("e", Some("m1")).await;
    b.expect("e", Some("m1")).await;
    let s = server.scrape().await;
    let hist = s
        .samples
        .iter()
        .find(|x| x.metric == "herald_fanout_seconds")
        .expect("fan-out histogram");
    match &hist.value {
        prometheus_parse::Value::Histogram(buckets) => {
            let inf = buckets.iter().find(|b| b.less_than.is_infinite()).unwrap();
            assert_eq!(
                inf.count as u64,
                metric_in(&s, "herald_fanout_jobs_total", &[]).unwrap()
            );
            assert!(inf.count >= 1.0);
        }
        other => panic!("herald_fanout_seconds is not a histogram: {other:?}"),
    }
    let endpoint = ("endpoint", "events");
    assert_eq!(
        metric_in(
            &s,
            "herald_api_requests_total",
            &[APP, PUSHER, endpoint, ("status", "200")]
        ),
        Some(1)
    );
    assert_eq!(m(&s, "herald_messages_sent_total", &[]), Some(7));

    // A bad API request is counted under its status; an unknown app id
    // under no app (callers cannot add series).
    let (status, _) = server
        .api("POST", &format!("/apps/{APP_ID}/events"), "{}")
        .await;
    assert_eq!(status, 400);
    let (status, _) = server
        .raw_api("GET", "/apps/someone-else/channels", "", "")
        .await;
    assert_eq!(status, 404);
    let s = server.scrape().await;
    assert_eq!(
        metric_in(
            &s,
            "herald_api_requests_total",
            &[endpoint, ("status", "400"), APP]
        ),
        Some(1)
    );
    assert_eq!(
        metric_in(
            &s,
            "herald_api_requests_total",
            &[("status", "404"), ("app", "")]
        ),
        Some(1)
    );
    assert!(!s
        .samples
        .iter()
        .any(|x| x.labels.get("app") == Some("someone-else")));

    // Client events refused, by reason.
    a.send(json!({"event": "client-x", "channel": "m1", "data": {}}))
        .await;
    a.expect("pusher:error", None).await;
    assert_eq!(
        metric_in(
            &server.scrape().await,
            "herald_client_events_rejected_total",
            &[APP, PUSHER, ("reason", "channel_type")]
        ),
        Some(1)
    );

    // Closes by reason: the client closing, and a protocol error.
    b.close().await;
    let mut bad = server.client().await;
    bad.ws
        .send(tokio_tungstenite::tungstenite::Message::Binary(
            vec![1, 2, 3].into(),
        ))
        .await
        .unwrap();
    bad.expect_closed_with(1003).await;
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let s = server.scrape().await;
        let client = m(
            &s,
            "herald_connections_closed_total",
            &[("reason", "client")],
        );
        let protocol = m(
            &s,
            "herald_connections_closed_total",
            &[("reason", "protocol_error")],
        );
        if client == Some(1) && protocol == Some(1) {
            assert_eq!(m(&s, "herald_connections", &[]), Some(1));
            assert_eq!(m(&s, "herald_connections_opened_total", &[]), Some(3));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "closes not counted: {client:?} {protocol:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn metrics_port_serves_metrics_alone() {
    for _ in 0..5 {
        let port = free_port();
        let server = Server::start_with(&format!("metrics_port = {port}"), "").await;
        let resp = match reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await {
            Ok(r) => r,
            // Lost the port to someone else: try another.
            Err(_) if server.log().contains("metrics_port") => continue,
            Err(e) => panic!("metrics port: {e}; log:\n{}", server.log()),
        };
        assert_eq!(resp.status(), 200);
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4"));
        let text = resp.text().await.unwrap();
        assert!(text.contains("# TYPE herald_frames_delivered_total counter"));
        let on_main = reqwest::get(server.url("/metrics")).await.unwrap();
        assert_eq!(on_main.status(), 404, "not on the WebSocket port");
        let other = reqwest::get(format!("http://127.0.0.1:{port}/up"))
            .await
            .unwrap();
        assert_eq!(other.status(), 404, "nothing else on the metrics port");
        return;
    }
    panic!("no free metrics port in five tries");
}

#[tokio::test]
async fn json_logs_are_json_and_hold_no_secrets() {
    // A receiver that refuses every webhook: a final failure, logged with
    // the webhook's URL, which must lose its query.
    let refuser = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!(
        "http://user:pass@{}/hook?token=hook-credential",
        refuser.local_addr().unwrap()
    );
    let refused = std::sync::Arc::new(tokio::sync::Notify::new());
    let seen = refused.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let seen = seen.clone();
            async move {
                seen.notify_one();
                axum::http::StatusCode::BAD_REQUEST
            }
        }),
    );
    tokio::spawn(async move { axum::serve(refuser, app).await });
    let server = Server::start_with(
        "log_format = \"json\"\nwebhook_batch_ms = 10",
        &format!("webhooks = [{{ url = \"{hook}\", event_types = [\"channel_occupied\"] }}]"),
    )
    .await;
    let mut c = server.client().await;
    c.subscribe("logged").await;
    tokio::time::timeout(TIMEOUT, refused.notified())
        .await
        .expect("webhook sent");
    let (status, _) = server
        .raw_api("GET", "/apps/test-app/channels", "auth_key=x", "")
        .await;
    assert_eq!(status, 401);
    let mut c2 = server.client().await;
    c2.send_text("not json").await;
    c2.expect("pusher:error", None).await;
    // SIGTERM writes the shutdown lines (and, past the grace, the webhook).
    // SAFETY: kill(2) on the child we spawned and still own.
    assert_eq!(unsafe { libc::kill(server.pid(), libc::SIGTERM) }, 0);
    let mut server = server;
    server.wait_exit().await;
    let log = server.log();
    let lines: Vec<Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect();
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(l["level"].is_string() && l["timestamp"].is_string(), "{l}");
    }
    // At `warn` (the test servers' level) the refused webhook is what gets
    // logged, with its URL cut to scheme, host, port and path.
    let refusal = lines
        .iter()
        .find(|l| l["target"].as_str().is_some_and(|t| t.contains("webhooks")))
        .unwrap_or_else(|| panic!("no webhook line in\n{log}"));
    assert!(
        refusal["url"].as_str().unwrap().ends_with("/hook"),
        "{refusal}"
    );
    assert!(
        refusal["message"].as_str().unwrap().contains("400"),
        "{refusal}"
    );
    for secret in [APP_SECRET, "hook-credential", "pass@"] {
        assert!(!log.contains(secret), "{secret} logged:\n{log}");
    }
}
