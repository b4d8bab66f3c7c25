//! The Pusher HTTP API over real HTTP: authentication failures, limits and
//! malformed bodies, and the channel queries.

use crate::common;

use common::*;
use herald_pusher::signing;
use serde_json::{json, Value};

fn events_path() -> String {
    format!("/apps/{APP_ID}/events")
}

/// A query signed with an explicit timestamp and extra params.
fn query_at(method: &str, path: &str, body: &str, ts: i64, secret: &str) -> String {
    let mut params: Vec<(String, String)> = vec![
        ("auth_key".into(), APP_KEY.into()),
        ("auth_timestamp".into(), ts.to_string()),
        ("auth_version".into(), "1.0".into()),
    ];
    if !body.is_empty() {
        params.push(("body_md5".into(), signing::body_md5(body.as_bytes())));
    }
    let sig = signing::sign(secret, &signing::api_string(method, path, &params));
    let mut q: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    q.push(format!("auth_signature={sig}"));
    q.join("&")
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn event(channel: &str) -> String {
    json!({ "name": "e", "channel": channel, "data": "x" }).to_string()
}

#[tokio::test]
async fn signed_requests_are_accepted() {
    let server = Server::start().await;
    let path = events_path();
    let body = event("news");
    let (status, reply) = server.api("POST", &path, &body).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply, json!({}));
    // A hand-built query with the same rules works too.
    let q = query_at("POST", &path, &body, now(), APP_SECRET);
    let (status, reply) = server.raw_api("POST", &path, &q, &body).await;
    assert_eq!(status, 200, "{reply}");
}

#[tokio::test]
async fn authentication_failures_are_401() {
    let server = Server::start().await;
    let path = events_path();
    let body = event("news");
    let good =
        herald_pusher::auth::sign_query(APP_KEY, APP_SECRET, "POST", &path, body.as_bytes(), &[]);

    let mut cases: Vec<(&str, String, String)> = vec![
        ("no query", String::new(), body.clone()),
        (
            "wrong secret",
            query_at("POST", &path, &body, now(), "wrong"),
            body.clone(),
        ),
        (
            "stale timestamp",
            query_at("POST", &path, &body, now() - 3600, APP_SECRET),
            body.clone(),
        ),
        (
            "future timestamp",
            query_at("POST", &path, &body, now() + 3600, APP_SECRET),
            body.clone(),
        ),
        ("body changed after signing", good.clone(), event("other")),
        (
            "unknown key",
            good.replace(&format!("auth_key={APP_KEY}"), "auth_key=nope"),
            body.clone(),
        ),
        (
            "wrong version",
            good.replace("auth_version=1.0", "auth_version=2.0"),
            body.clone(),
        ),
        (
            "signature removed",
            good.split("&auth_signature=").next().unwrap().to_owned(),
            body.clone(),
        ),
    ];
    // Flip one hex digit of the signature.
    let (head, sig) = good.rsplit_once('=').unwrap();
    let mut sig: Vec<u8> = sig.bytes().collect();
    sig[0] = if sig[0] == b'0' { b'1' } else { b'0' };
    cases.push((
        "tampered signature",
        format!("{head}={}", String::from_utf8(sig).unwrap()),
        body.clone(),
    ));

    for (what, query, body) in cases {
        let (status, reply) = server.raw_api("POST", &path, &query, &body).await;
        assert_eq!(status, 401, "{what}: {reply}");
        assert!(reply["error"].is_string(), "{what}: {reply}");
    }

    // A request signed for another path is refused on this one.
    let other = herald_pusher::auth::sign_query(
        APP_KEY,
        APP_SECRET,
        "POST",
        "/apps/other/events",
        body.as_bytes(),
        &[],
    );
    let (status, _) = server.raw_api("POST", &path, &other, &body).await;
    assert_eq!(status, 401);
    // Signed as GET, sent as POST.
    let get =
        herald_pusher::auth::sign_query(APP_KEY, APP_SECRET, "GET", &path, body.as_bytes(), &[]);
    let (status, _) = server.raw_api("POST", &path, &get, &body).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn unknown_app_and_path_are_404() {
    let server = Server::start().await;
    let path = "/apps/no-such-app/events";
    let body = event("news");
    let (status, reply) = server.api("POST", path, &body).await;
    assert_eq!(status, 404, "{reply}");
    let (status, _) = server.api("GET", "/nothing/here", "").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn oversize_data_and_bodies_are_413() {
    let server = Server::start_with("max_request_size = 65536", "").await;
    let path = events_path();
    // data over max_payload (10 KiB by default).
    let body =
        json!({ "name": "e", "channel": "news", "data": "x".repeat(10 * 1024 + 1) }).to_string();
    let (status, reply) = server.api("POST", &path, &body).await;
    assert_eq!(status, 413, "{reply}");
    // Exactly at the limit is fine.
    let body = json!({ "name": "e", "channel": "news", "data": "x".repeat(10 * 1024) }).to_string();
    let (status, reply) = server.api("POST", &path, &body).await;
    assert_eq!(status, 200, "{reply}");
    // A body over max_request_size.
    let body = json!({ "name": "e", "channel": "news", "data": "x".repeat(70_000) }).to_string();
    let (status, reply) = server.api("POST", &path, &body).await;
    assert_eq!(status, 413, "{reply}");
    // One oversize item in a batch is 413 too.
    let batch = json!({ "batch": [
        { "name": "e", "channel": "a", "data": "ok" },
        { "name": "e", "channel": "b", "data": "x".repeat(10 * 1024 + 1) },
    ]})
    .to_string();
    let (status, reply) = server
        .api("POST", &format!("/apps/{APP_ID}/batch_events"), &batch)
        .await;
    assert_eq!(status, 413, "{reply}");
}

#[tokio::test]
async fn malformed_requests_are_400() {
    let server = Server::start().await;
    let path = events_path();
    let too_many: Vec<String> = (0..101).map(|i| format!("c{i}")).collect();
    let cases: Vec<(&str, String)> = vec![
        ("not JSON", "{nope".into()),
        ("JSON array", "[]".into()),
        (
            "no name",
            json!({ "channel": "a", "data": "x" }).to_string(),
        ),
        (
            "empty name",
            json!({ "name": "", "channel": "a", "data": "x" }).to_string(),
        ),
        (
            "reserved name",
            json!({ "name": "pusher:x", "channel": "a", "data": "x" }).to_string(),
        ),
        (
            "object data",
            json!({ "name": "e", "channel": "a", "data": {"a":1} }).to_string(),
        ),
        (
            "no channel",
            json!({ "name": "e", "data": "x" }).to_string(),
        ),
        (
            "both channel and channels",
            json!({ "name": "e", "channel": "a", "channels": ["b"], "data": "x" }).to_string(),
        ),
        (
            "empty channels",
            json!({ "name": "e", "channels": [], "data": "x" }).to_string(),
        ),
        (
            "101 channels",
            json!({ "name": "e", "channels": too_many, "data": "x" }).to_string(),
        ),
        (
            "bad channel name",
            json!({ "name": "e", "channel": "a b", "data": "x" }).to_string(),
        ),
        (
            "long channel name",
            json!({ "name": "e", "channel": "a".repeat(165), "data": "x" }).to_string(),
        ),
        (
            "long event name",
            json!({ "name": "e".repeat(201), "channel": "a", "data": "x" }).to_string(),
        ),
        (
            "bad socket_id",
            json!({ "name": "e", "channel": "a", "data": "x", "socket_id": "abc" }).to_string(),
        ),
        (
            "subscription_count while counting is off",
            json!({ "name": "e", "channel": "a", "data": "x", "info": "subscription_count" })
                .to_string(),
        ),
        (
            "multi-byte event name of 201 characters",
            json!({ "name": "é".repeat(201), "channel": "a", "data": "x" }).to_string(),
        ),
        (
            "unknown info",
            json!({ "name": "e", "channel": "a", "data": "x", "info": "bogus" }).to_string(),
        ),
        // Nesting far past serde_json's bound of 128 (a recursion limit
        // error, never a deep recursion): the body and a field.
        (
            "body nested 100,000 deep",
            format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000)),
        ),
        (
            "channels nested 100,000 deep",
            format!(
                r#"{{"name":"e","data":"x","channels":{}"a"{}}}"#,
                "[".repeat(100_000),
                "]".repeat(100_000)
            ),
        ),
    ];
    for (what, body) in cases {
        let (status, reply) = server.api("POST", &path, &body).await;
        assert_eq!(status, 400, "{what}: {reply}");
        assert!(reply["error"].is_string(), "{what}: {reply}");
    }
}

#[tokio::test]
async fn batch_is_validated_before_anything_is_published() {
    let server = Server::start().await;
    let mut c = server.client().await;
    c.subscribe("a").await;
    let batch_path = format!("/apps/{APP_ID}/batch_events");
    let bad = json!({ "batch": [
        { "name": "first", "channel": "a", "data": "1" },
        { "name": "e", "channel": "bad name", "data": "2" },
    ]})
    .to_string();
    let (status, reply) = server.api("POST", &batch_path, &bad).await;
    assert_eq!(status, 400, "{reply}");
    let eleven: Vec<Value> = (0..11)
        .map(|i| json!({ "name": "e", "channel": "a", "data": i.to_string() }))
        .collect();
    let (status, reply) = server
        .api("POST", &batch_path, &json!({ "batch": eleven }).to_string())
        .await;
    assert_eq!(status, 400, "{reply}");

    // A good batch is delivered in order, after nothing from the bad ones.
    let good = json!({ "batch": [
        { "name": "one", "channel": "a", "data": "1" },
        { "name": "two", "channel": "a", "data": "2" },
    ]})
    .to_string();
    let (status, reply) = server.api("POST", &batch_path, &good).await;
    assert_eq!(status, 200, "{reply}");
    c.expect("one", Some("a")).await;
    c.expect("two", Some("a")).await;
}

#[tokio::test]
async fn unknown_body_fields_are_ignored_as_pusher_does() {
    let server = Server::start().await;
    let mut c = server.client().await;
    c.subscribe("tolerant").await;
    // Names are limited in characters, not bytes: 200 two-byte characters pass.
    let name = "é".repeat(200);
    let body = json!({
        "name": name, "channel": "tolerant", "data": "x",
        "some_future_field": { "a": 1 }, "async": true,
    })
    .to_string();
    let (status, reply) = server.api("POST", &events_path(), &body).await;
    assert_eq!(status, 200, "{reply}");
    c.expect(&name, Some("tolerant")).await;
}

#[tokio::test]
async fn subscription_count_is_refused_while_counting_is_off() {
    // Pusher: asking for subscription_count when the app has subscription
    // counting disabled is an error.
    let server = Server::start().await;
    let mut a = server.client().await;
    a.subscribe("news").await;
    for (rel, extra) in [
        ("/channels/news", vec![("info", "subscription_count")]),
        ("/channels", vec![("info", "subscription_count")]),
    ] {
        let (status, reply) = api_get(&server, rel, &extra).await;
        assert_eq!(status, 400, "{rel}: {reply}");
        assert!(
            reply["error"]
                .as_str()
                .unwrap_or_default()
                .contains("subscription_count"),
            "{reply}"
        );
    }
    // The rest of the API still answers.
    let (status, reply) = api_get(&server, "/channels/news", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(reply, json!({ "occupied": true }));
}

#[tokio::test]
async fn channel_queries() {
    let server = Server::start_with("", "subscription_count = true").await;
    let mut a = server.client().await;
    a.subscribe("news").await;
    // Another socket: `a` may already be getting news's count pushes,
    // which would come before this subscription's confirmation.
    let mut p = server.client().await;
    p.subscribe_presence("presence-x", "u1", json!({})).await;
    let mut b = server.client().await;
    b.subscribe("news").await;

    let (status, reply) = server
        .api("GET", &format!("/apps/{APP_ID}/channels"), "")
        .await;
    assert_eq!(status, 200, "{reply}");
    let mut names: Vec<&String> = reply["channels"].as_object().unwrap().keys().collect();
    names.sort();
    assert_eq!(names, ["news", "presence-x"]);

    let (status, reply) =
        api_get(&server, "/channels/news", &[("info", "subscription_count")]).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply, json!({ "occupied": true, "subscription_count": 2 }));

    let (status, reply) = api_get(
        &server,
        "/channels",
        &[("filter_by_prefix", "presence-"), ("info", "user_count")],
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply,
        json!({ "channels": { "presence-x": { "user_count": 1 } } })
    );

    let (status, reply) = api_get(&server, "/channels", &[("info", "subscription_count")]).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply,
        json!({ "channels": {
            "news": { "subscription_count": 2 },
            "presence-x": { "subscription_count": 1 },
        } })
    );

    let (status, reply) = api_get(&server, "/channels/empty", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(reply, json!({ "occupied": false }));

    // user_count is for presence channels only.
    let (status, _) = api_get(&server, "/channels/news", &[("info", "user_count")]).await;
    assert_eq!(status, 400);
    let (status, _) = api_get(&server, "/channels/news/users", &[]).await;
    assert_eq!(status, 400);
}

async fn api_get(server: &Server, rel: &str, extra: &[(&str, &str)]) -> (u16, Value) {
    let path = format!("/apps/{APP_ID}{rel}");
    let q = herald_pusher::auth::sign_query(APP_KEY, APP_SECRET, "GET", &path, b"", extra);
    server.raw_api("GET", &path, &q, "").await
}

/// A client of `server` signed in as `user`.
async fn signed_in(server: &Server, user: &str) -> Client {
    let mut a = server.client().await;
    let user_data = json!({ "id": user }).to_string();
    let auth = signing::token(
        APP_KEY,
        APP_SECRET,
        &signing::user_string(&a.socket_id, &user_data),
    );
    a.send(json!({ "event": "pusher:signin", "data": { "auth": auth, "user_data": user_data } }))
        .await;
    a.expect("pusher:signin_success", None).await;
    a
}

#[tokio::test]
async fn terminate_connections_closes_the_users_sockets() {
    let server = Server::start().await;
    let mut a = signed_in(&server, "u9").await;
    let (status, reply) = server
        .api(
            "POST",
            &format!("/apps/{APP_ID}/users/u9/terminate_connections"),
            "",
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    a.expect_closed_with(4009).await;
}

/// Python's `pusher` SDK posts `terminate_user_connections` without the
/// `/apps/{app_id}` prefix: the app is the one the signed `auth_key` names.
#[tokio::test]
async fn terminate_connections_without_the_app_prefix() {
    let server = Server::start().await;
    let mut a = signed_in(&server, "u7").await;
    let path = "/users/u7/terminate_connections";
    // Signed with another secret: refused, the socket stays.
    let forged = herald_pusher::auth::sign_query(APP_KEY, "not-the-secret", "POST", path, b"", &[]);
    let (status, _) = server.raw_api("POST", path, &forged, "").await;
    assert_eq!(status, 401);
    let unknown =
        herald_pusher::auth::sign_query("no-such-key", APP_SECRET, "POST", path, b"", &[]);
    let (status, _) = server.raw_api("POST", path, &unknown, "").await;
    assert_eq!(status, 404);
    let q = herald_pusher::auth::sign_query(APP_KEY, APP_SECRET, "POST", path, b"", &[]);
    let (status, reply) = server.raw_api("POST", path, &q, "").await;
    assert_eq!(status, 200, "{reply}");
    a.expect_closed_with(4009).await;
    assert_eq!(
        server
            .metric_where(
                "herald_api_requests_total",
                &[("app", APP_ID), ("status", "200")]
            )
            .await,
        1
    );
}
