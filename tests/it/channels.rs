//! Subscriptions and delivery: public, private and presence channels, HTTP
//! triggers, client events. Non-delivery is proven with a later marker: if
//! the marker arrives first, the earlier message was never sent.

use crate::common;

use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test]
async fn public_subscribe_and_http_trigger() {
    let server = Server::start().await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    let ok = a.subscribe("news").await;
    assert_eq!(
        ok["data"], "{}",
        "non-presence data is the string \"{{}}\": {ok}"
    );
    b.subscribe("other").await;

    server.trigger("news", "headline", r#"{"x":1}"#).await;
    let f = a.expect("headline", Some("news")).await;
    assert_eq!(f["data"], r#"{"x":1}"#, "data relayed as the same string");

    // b is not subscribed to news: its first frame is the marker on its own channel.
    server.trigger("other", "marker", "m").await;
    b.expect("marker", Some("other")).await;
}

#[tokio::test]
async fn unsubscribe_stops_delivery() {
    let server = Server::start().await;
    let mut a = server.client().await;
    a.subscribe("news").await;
    a.subscribe("marker").await;
    a.unsubscribe("news").await;
    // A ping round trip proves the unsubscribe was handled.
    a.send(json!({ "event": "pusher:ping", "data": {} })).await;
    a.expect("pusher:pong", None).await;
    server.trigger("news", "late", "x").await;
    server.trigger("marker", "marker", "m").await;
    a.expect("marker", Some("marker")).await;
}

#[tokio::test]
async fn http_trigger_excludes_socket_id() {
    let server = Server::start().await;
    let mut a = server.client().await;
    a.subscribe("news").await;
    let body = json!({ "name": "e", "channel": "news", "data": "x", "socket_id": a.socket_id })
        .to_string();
    let (status, _) = server
        .api("POST", &format!("/apps/{APP_ID}/events"), &body)
        .await;
    assert_eq!(status, 200);
    server.trigger("news", "marker", "m").await;
    a.expect("marker", Some("news")).await;
}

#[tokio::test]
async fn private_channel_with_valid_auth() {
    let server = Server::start().await;
    let mut a = server.client().await;
    a.subscribe_private("private-room").await;
    server.trigger("private-room", "secret", "s").await;
    let f = a.expect("secret", Some("private-room")).await;
    assert_eq!(f["data"], "s");
}

#[tokio::test]
async fn private_auth_failures_are_subscription_errors() {
    let server = Server::start().await;
    let mut a = server.client().await;
    let ch = "private-room";
    let cases = [
        // No auth at all.
        None,
        // Signed for another socket.
        Some(private_auth("1.1", ch)),
        // Signed for another channel.
        Some(private_auth(&a.socket_id, "private-other")),
        // Right signature, wrong key.
        Some(private_auth(&a.socket_id, ch).replacen(APP_KEY, "other-key", 1)),
        // Garbage.
        Some("nonsense".to_owned()),
    ];
    for auth in cases {
        a.subscribe_raw(ch, auth.as_deref(), None).await;
        let f = a.expect("pusher:subscription_error", Some(ch)).await;
        let d = data(&f);
        assert_eq!(d["type"], "AuthError", "{f}");
        assert_eq!(d["status"], 401, "{f}");
    }
    // Still connected, still not subscribed.
    server.trigger(ch, "leak", "x").await;
    a.subscribe("marker").await;
    server.trigger("marker", "marker", "m").await;
    a.expect("marker", Some("marker")).await;
}

#[tokio::test]
async fn invalid_channel_names_are_subscription_errors() {
    let server = Server::start().await;
    let mut a = server.client().await;
    for name in ["", "has space", "ünïcode", &"a".repeat(165)] {
        a.subscribe_raw(name, None, None).await;
        let f = a.expect("pusher:subscription_error", None).await;
        assert_eq!(data(&f)["status"], 400, "{f}");
    }
    // The longest valid name works.
    a.subscribe(&"a".repeat(164)).await;
}

#[tokio::test]
async fn presence_member_added_and_removed_only_for_first_and_last_socket() {
    let server = Server::start().await;
    let ch = "presence-room";
    let mut a = server.client().await;
    let d = a
        .subscribe_presence(ch, "alice", json!({ "name": "Alice" }))
        .await;
    assert_eq!(d["presence"]["count"], 1, "{d}");
    assert_eq!(d["presence"]["ids"], json!(["alice"]), "{d}");
    assert_eq!(
        d["presence"]["hash"]["alice"],
        json!({ "name": "Alice" }),
        "{d}"
    );

    // Bob's first socket: alice sees member_added with the user_info.
    let mut b1 = server.client().await;
    let d = b1
        .subscribe_presence(ch, "bob", json!({ "name": "Bob" }))
        .await;
    assert_eq!(d["presence"]["count"], 2, "{d}");
    let f = a.expect("pusher_internal:member_added", Some(ch)).await;
    assert_eq!(
        data(&f),
        json!({ "user_id": "bob", "user_info": { "name": "Bob" } })
    );

    // Bob's second socket: listed once, and nobody hears a second member_added.
    let mut b2 = server.client().await;
    let d = b2
        .subscribe_presence(ch, "bob", json!({ "name": "Bob" }))
        .await;
    assert_eq!(d["presence"]["count"], 2, "a user is listed once: {d}");
    let mut ids: Vec<String> = serde_json::from_value(d["presence"]["ids"].clone()).unwrap();
    ids.sort();
    assert_eq!(ids, ["alice", "bob"]);
    server.trigger(ch, "marker", "1").await;
    a.expect("marker", Some(ch)).await;
    b1.expect("marker", Some(ch)).await;
    b2.expect("marker", Some(ch)).await;

    // One of Bob's sockets leaves: no member_removed.
    b2.unsubscribe(ch).await;
    b2.send(json!({ "event": "pusher:ping", "data": {} })).await;
    b2.expect("pusher:pong", None).await;
    server.trigger(ch, "marker", "2").await;
    let f = a.expect("marker", Some(ch)).await;
    assert_eq!(f["data"], "2");

    // His last socket goes away (closing, not unsubscribing): member_removed.
    b1.close().await;
    let f = a.expect("pusher_internal:member_removed", Some(ch)).await;
    assert_eq!(data(&f), json!({ "user_id": "bob" }));

    // The HTTP API agrees.
    let (status, users) = server
        .api("GET", &format!("/apps/{APP_ID}/channels/{ch}/users"), "")
        .await;
    assert_eq!(status, 200);
    assert_eq!(users, json!({ "users": [{ "id": "alice" }] }));
}

#[tokio::test]
async fn presence_requires_valid_channel_data() {
    let server = Server::start().await;
    let ch = "presence-room";
    let mut a = server.client().await;
    // No channel_data.
    a.subscribe_raw(ch, Some(&private_auth(&a.socket_id, ch)), None)
        .await;
    let f = a.expect("pusher:subscription_error", Some(ch)).await;
    assert_eq!(data(&f)["status"], 400, "{f}");
    // channel_data that does not match the signature.
    let auth = presence_auth(&a.socket_id, ch, r#"{"user_id":"a"}"#);
    a.subscribe_raw(ch, Some(&auth), Some(r#"{"user_id":"b"}"#))
        .await;
    let f = a.expect("pusher:subscription_error", Some(ch)).await;
    assert_eq!(data(&f)["status"], 401, "{f}");
    // Signed, but not a valid member.
    let cd = r#"{"user_id":""}"#;
    let auth = presence_auth(&a.socket_id, ch, cd);
    a.subscribe_raw(ch, Some(&auth), Some(cd)).await;
    let f = a.expect("pusher:subscription_error", Some(ch)).await;
    assert_eq!(data(&f)["status"], 400, "{f}");
}

#[tokio::test]
async fn client_events_reach_others_but_are_not_echoed() {
    let server = Server::start().await;
    let ch = "presence-chat";
    let mut a = server.client().await;
    let mut b = server.client().await;
    a.subscribe_presence(ch, "alice", json!({})).await;
    b.subscribe_presence(ch, "bob", json!({})).await;
    a.expect("pusher_internal:member_added", Some(ch)).await;

    a.send(json!({ "event": "client-typing", "channel": ch, "data": { "n": 1 } }))
        .await;
    let f = b.expect("client-typing", Some(ch)).await;
    assert_eq!(f["data"], json!({ "n": 1 }), "data relayed as sent");
    assert_eq!(
        f["user_id"], "alice",
        "presence client events carry user_id"
    );

    // b got it, so any echo to a was queued before this marker.
    server.trigger(ch, "marker", "m").await;
    a.expect("marker", Some(ch)).await;
}

#[tokio::test]
async fn client_events_on_private_channel_and_refusals() {
    let server = Server::start().await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    a.subscribe_private("private-x").await;
    b.subscribe_private("private-x").await;
    a.send(json!({ "event": "client-hi", "channel": "private-x", "data": "hello" }))
        .await;
    let f = b.expect("client-hi", Some("private-x")).await;
    assert_eq!(f["data"], "hello");
    assert!(f.get("user_id").is_none(), "{f}");

    // Public channel: refused with a pusher:error that does not close.
    a.subscribe("public").await;
    a.send(json!({ "event": "client-hi", "channel": "public", "data": "x" }))
        .await;
    a.expect("pusher:error", None).await;
    // Not subscribed: refused.
    a.send(json!({ "event": "client-hi", "channel": "private-y", "data": "x" }))
        .await;
    a.expect("pusher:error", None).await;
    // Still healthy.
    a.send(json!({ "event": "pusher:ping", "data": {} })).await;
    a.expect("pusher:pong", None).await;
}

#[tokio::test]
async fn cache_channel_replays_last_event_or_reports_miss() {
    let server = Server::start().await;
    let mut a = server.client().await;
    a.subscribe("cache-x").await;
    a.expect("pusher:cache_miss", Some("cache-x")).await;
    server.trigger("cache-x", "e", "1").await;
    a.expect("e", Some("cache-x")).await;
    let mut b = server.client().await;
    b.subscribe("cache-x").await;
    let f = b.expect("e", Some("cache-x")).await;
    assert_eq!(f["data"], "1");
}

#[tokio::test]
async fn signin_and_server_to_user() {
    let server = Server::start().await;
    let mut a = server.client().await;
    let user_data = r#"{"id":"u1","user_info":{"n":1}}"#;
    let auth = herald_pusher::signing::token(
        APP_KEY,
        APP_SECRET,
        &herald_pusher::signing::user_string(&a.socket_id, user_data),
    );
    a.send(json!({ "event": "pusher:signin", "data": { "auth": auth, "user_data": user_data } }))
        .await;
    let f = a.expect("pusher:signin_success", None).await;
    assert_eq!(data(&f)["user_data"], user_data);
    server.trigger("#server-to-user-u1", "direct", "d").await;
    a.expect("direct", Some("#server-to-user-u1")).await;

    // A bad signature closes with 4009.
    let mut b = server.client().await;
    b.send(json!({ "event": "pusher:signin", "data": { "auth": "test-key:00", "user_data": user_data } }))
        .await;
    b.expect_closed_with(4009).await;
}

#[tokio::test]
async fn signin_with_user_data_without_an_id_is_refused_with_4009() {
    let server = Server::start().await;
    // Correctly signed each time: only the missing or empty id is wrong.
    for user_data in [
        r#"{"user_info":{"name":"nobody"}}"#,
        r#"{}"#,
        r#"{"id":""}"#,
        r#"{"id":null,"watchlist":["a"]}"#,
    ] {
        let mut c = server.client().await;
        c.signin(user_data).await;
        let f = c.recv().await;
        assert_eq!(f["event"], "pusher:error", "for {user_data}: {f}");
        assert_eq!(data(&f)["code"], 4009, "for {user_data}: {f}");
        c.expect_close(4009).await;
    }
    // The same signing with an id is accepted, so the refusals above were
    // about the id, not the signature.
    let mut ok = server.client().await;
    ok.signin(r#"{"id":"somebody"}"#).await;
    ok.expect("pusher:signin_success", None).await;
}

#[tokio::test]
async fn a_watchlist_of_100_is_accepted_and_of_101_refused_with_4009() {
    let server = Server::start().await;
    let ids = |n: usize| (0..n).map(|i| format!("w{i}")).collect::<Vec<_>>();

    // 100 users, the limit: signed in, and told all 100 are offline.
    let mut ok = server.client().await;
    let user_data = json!({ "id": "watcher", "watchlist": ids(100) }).to_string();
    ok.signin(&user_data).await;
    ok.expect("pusher:signin_success", None).await;
    let w = ok.expect("pusher_internal:watchlist_events", None).await;
    let mut offline: Vec<String> = data(&w)["events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events in {w}"))
        .iter()
        .filter(|e| e["name"] == "offline")
        .flat_map(|e| e["user_ids"].as_array().cloned().unwrap_or_default())
        .map(|id| id.as_str().unwrap_or_default().to_owned())
        .collect();
    offline.sort();
    let mut expected = ids(100);
    expected.sort();
    assert_eq!(offline, expected, "all 100 watched users offline: {w}");

    // 101: refused as malformed user_data, with 4009 and a close.
    let mut refused = server.client().await;
    let user_data = json!({ "id": "greedy", "watchlist": ids(101) }).to_string();
    refused.signin(&user_data).await;
    refused.expect_closed_with(4009).await;
}

#[tokio::test]
async fn a_cached_event_is_replayed_within_cache_ttl_and_missed_after() {
    let ttl = Duration::from_secs(1);
    let server = Server::start_with("", "cache_ttl = 1").await;
    let published = Instant::now();
    server.trigger("cache-brief", "e", "soon gone").await;

    // Right after the publish (well within the TTL): replayed, no miss.
    let mut first = server.client().await;
    first.subscribe("cache-brief").await;
    let f = first.recv().await;
    assert_eq!(f["event"], "e", "replay expected within the TTL: {f}");
    assert_eq!(f["data"], "soon gone");

    // Fresh subscribers until one gets a miss. The event was cached no
    // earlier than `published`, so a miss received before `published + ttl`
    // expired it early; one never coming means it does not expire.
    let deadline = published + ttl + Duration::from_secs(5);
    loop {
        let mut c = server.client().await;
        c.subscribe("cache-brief").await;
        let f = c.recv().await;
        let now = Instant::now();
        match f["event"].as_str() {
            Some("e") => {
                assert!(
                    now < deadline,
                    "still replayed {:?} after the publish, cache_ttl is 1 s",
                    now - published
                );
            }
            Some("pusher:cache_miss") => {
                assert_eq!(f["channel"], "cache-brief", "{f}");
                assert!(
                    now >= published + ttl,
                    "expired after {:?}, before cache_ttl (1 s)",
                    now - published
                );
                break;
            }
            _ => panic!("unexpected frame {f}"),
        }
        c.close().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Publishing again fills the cache again.
    server.trigger("cache-brief", "e", "back").await;
    let mut again = server.client().await;
    again.subscribe("cache-brief").await;
    assert_eq!(again.expect("e", Some("cache-brief")).await["data"], "back");
}
