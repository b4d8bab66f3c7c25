//! Protocol limits enforced over a socket: client event name length and
//! data size, presence `user_info` size and user id length (Pusher's
//! defaults), and small per-app limits that replace them for one app only.
//! Each refusal is the documented frame (docs/protocol.md: `pusher:error`
//! with a null code for client events, `pusher:subscription_error` for
//! subscriptions); the offending connection stays usable, nothing reaches
//! other subscribers, and a bystander still receives a broadcast. Rates and
//! counts (`client_event_rate`, `max_subscriptions_per_connection`) are
//! pinned exactly at the limit, so an off-by-one either way fails.

use crate::common;

use common::*;
use futures_util::SinkExt;
use serde_json::{json, Value};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

/// A refused client event: `pusher:error`, null code (the socket stays
/// open), and a message naming the limit.
async fn expect_client_event_error(c: &mut Client, limit: &str) {
    let f = c.expect("pusher:error", None).await;
    let d = data(&f);
    assert!(d["code"].is_null(), "must not close: {f}");
    let message = d["message"].as_str().unwrap_or_default();
    assert!(message.contains(limit), "message names {limit}: {f}");
}

/// A refused subscription: `pusher:subscription_error` for `channel` with
/// the given type and status, and an error naming the limit.
async fn expect_subscription_error(
    c: &mut Client,
    channel: &str,
    kind: &str,
    status: u16,
    limit: &str,
) {
    let f = c.expect("pusher:subscription_error", Some(channel)).await;
    let d = data(&f);
    assert_eq!(d["type"], kind, "{f}");
    assert_eq!(d["status"], status, "{f}");
    let error = d["error"].as_str().unwrap_or_default();
    assert!(error.contains(limit), "error names {limit}: {f}");
}

/// Subscribe to a presence channel with a correctly signed `channel_data`
/// given as text (so sizes are exact).
async fn subscribe_presence_text(c: &mut Client, channel: &str, channel_data: &str) {
    let auth = presence_auth(&c.socket_id, channel, channel_data);
    c.subscribe_raw(channel, Some(&auth), Some(channel_data))
        .await;
}

/// `{"bio":"xx…"}` of exactly `len` bytes.
fn user_info_of_len(len: usize) -> String {
    let info = format!(r#"{{"bio":"{}"}}"#, "x".repeat(len - 10));
    assert_eq!(info.len(), len);
    info
}

// ----- client events, default limits ------------------------------------------

#[tokio::test]
async fn client_event_name_over_200_chars_is_refused_and_not_relayed() {
    let server = Server::start().await;
    let mut healthy = bystander(&server).await;
    let ch = "private-names";
    let mut a = server.client().await;
    let mut b = server.client().await;
    a.subscribe_private(ch).await;
    b.subscribe_private(ch).await;

    let too_long = format!("client-{}", "x".repeat(194));
    assert_eq!(too_long.len(), 201);
    a.send(json!({ "event": too_long, "channel": ch, "data": {} }))
        .await;
    expect_client_event_error(&mut a, "200").await;

    // 200 characters is the limit and is relayed; it is the first thing b
    // sees, so the refused event never reached it.
    let longest = format!("client-{}", "x".repeat(193));
    a.send(json!({ "event": longest, "channel": ch, "data": { "n": 1 } }))
        .await;
    let f = b.expect(&longest, Some(ch)).await;
    assert_eq!(f["data"], json!({ "n": 1 }));

    // The sender still receives broadcasts on its channel.
    server.trigger(ch, "after", "still here").await;
    assert_eq!(a.expect("after", Some(ch)).await["data"], "still here");
    still_healthy(&server, &mut healthy).await;
}

#[tokio::test]
async fn client_event_data_over_max_payload_is_refused_and_not_relayed() {
    let server = Server::start().await;
    let mut healthy = bystander(&server).await;
    let ch = "presence-payload";
    let mut a = server.client().await;
    let mut b = server.client().await;
    a.subscribe_presence(ch, "alice", json!({})).await;
    b.subscribe_presence(ch, "bob", json!({})).await;
    a.expect("pusher_internal:member_added", Some(ch)).await;

    // 10 KiB of data plus its quotes: over the 10240-byte default.
    a.send(json!({ "event": "client-big", "channel": ch, "data": "x".repeat(10 * 1024) }))
        .await;
    expect_client_event_error(&mut a, "10240").await;
    // Also as an object, not only as a string.
    a.send(
        json!({ "event": "client-big", "channel": ch, "data": { "pad": "x".repeat(10 * 1024) } }),
    )
    .await;
    expect_client_event_error(&mut a, "10240").await;

    // Well under the limit is relayed, and is the first event b sees.
    let fits = "y".repeat(10 * 1024 - 100);
    a.send(json!({ "event": "client-fits", "channel": ch, "data": fits }))
        .await;
    let f = b.expect("client-fits", Some(ch)).await;
    assert_eq!(f["data"], fits);
    assert_eq!(f["user_id"], "alice");

    server.trigger(ch, "after", "still here").await;
    assert_eq!(a.expect("after", Some(ch)).await["data"], "still here");
    still_healthy(&server, &mut healthy).await;
}

// ----- presence, default limits --------------------------------------------------

#[tokio::test]
async fn presence_user_info_over_1_kib_and_user_id_over_128_chars_are_refused() {
    let server = Server::start().await;
    let mut healthy = bystander(&server).await;
    let ch = "presence-limits";
    let mut member = server.client().await;
    member.subscribe_presence(ch, "bob", json!({})).await;
    let mut a = server.client().await;

    // Correctly signed, but user_info is 1025 bytes.
    let cd = format!(
        r#"{{"user_id":"alice","user_info":{}}}"#,
        user_info_of_len(1025)
    );
    subscribe_presence_text(&mut a, ch, &cd).await;
    expect_subscription_error(&mut a, ch, "InvalidChannelData", 400, "1024").await;

    // Correctly signed, but the user id is 129 characters (string or number).
    let cd = json!({ "user_id": "u".repeat(129), "user_info": {} }).to_string();
    subscribe_presence_text(&mut a, ch, &cd).await;
    expect_subscription_error(&mut a, ch, "InvalidChannelData", 400, "128").await;

    // At both limits exactly: accepted. The member list and member_added
    // show only this member, so the refused attempts left no trace.
    let id = "u".repeat(128);
    let info = user_info_of_len(1024);
    let cd = format!(r#"{{"user_id":"{id}","user_info":{info}}}"#);
    subscribe_presence_text(&mut a, ch, &cd).await;
    let ok = a
        .expect("pusher_internal:subscription_succeeded", Some(ch))
        .await;
    let presence = &data(&ok)["presence"];
    assert_eq!(presence["count"], 2, "{ok}");
    assert_eq!(
        presence["hash"][&id],
        serde_json::from_str::<Value>(&info).unwrap()
    );
    let added = member
        .expect("pusher_internal:member_added", Some(ch))
        .await;
    assert_eq!(data(&added)["user_id"], id.as_str());

    // The refused client is usable and both members get broadcasts.
    server.trigger(ch, "after", "x").await;
    a.expect("after", Some(ch)).await;
    member.expect("after", Some(ch)).await;
    still_healthy(&server, &mut healthy).await;
}

// ----- per-app limits ----------------------------------------------------------------

/// The test app with small limits, next to a `roomy` app with the defaults:
/// the limits are the app's own, not the server's.
const SMALL: &str = "max_channel_name = 20\nmax_event_name = 30\nmax_payload = 100\n\
                     max_presence_members = 2\nmax_presence_user_info = 64\nmax_presence_user_id = 8\n\
                     [[apps]]\nid = \"roomy\"\nkey = \"roomy-key\"\nsecret = \"roomy-secret\"\n";

async fn roomy_client(server: &Server) -> Client {
    Client::connect(&server.ws_url("roomy-key", "?protocol=7&client=js&version=8.4.0")).await
}

async fn roomy_subscribe_private(c: &mut Client, channel: &str) {
    let auth = herald_pusher::signing::token(
        "roomy-key",
        "roomy-secret",
        &herald_pusher::signing::channel_string(&c.socket_id, channel, None),
    );
    c.subscribe_raw(channel, Some(&auth), None).await;
    c.expect("pusher_internal:subscription_succeeded", Some(channel))
        .await;
}

#[tokio::test]
async fn per_app_channel_and_event_name_and_payload_limits_are_honoured() {
    let server = Server::start_with("", SMALL).await;
    let mut healthy = bystander(&server).await;
    let mut a = server.client().await;

    // Channel names: 21 characters refused, 20 accepted.
    let long = "c".repeat(21);
    a.subscribe_raw(&long, None, None).await;
    expect_subscription_error(&mut a, &long, "InvalidChannel", 400, "20").await;
    a.subscribe(&"c".repeat(20)).await;

    // Client event names: 31 refused, 30 relayed; data: over 100 bytes refused.
    let ch = "private-small";
    let mut b = server.client().await;
    a.subscribe_private(ch).await;
    b.subscribe_private(ch).await;
    let name31 = format!("client-{}", "e".repeat(24));
    let name30 = format!("client-{}", "e".repeat(23));
    a.send(json!({ "event": name31, "channel": ch, "data": {} }))
        .await;
    expect_client_event_error(&mut a, "30").await;
    a.send(json!({ "event": "client-x", "channel": ch, "data": "x".repeat(100) }))
        .await;
    expect_client_event_error(&mut a, "100").await;
    a.send(json!({ "event": name30, "channel": ch, "data": "x".repeat(50) }))
        .await;
    assert_eq!(b.expect(&name30, Some(ch)).await["data"], "x".repeat(50));

    // The HTTP API applies the same app's limits.
    let path = format!("/apps/{APP_ID}/events");
    let event = |name: &str, channel: &str, data: &str| {
        json!({ "name": name, "channel": channel, "data": data }).to_string()
    };
    let (status, reply) = server
        .api("POST", &path, &event(&"e".repeat(31), "ok", "x"))
        .await;
    assert_eq!(status, 400, "{reply}");
    assert!(
        reply["error"].as_str().unwrap().contains("max_event_name"),
        "{reply}"
    );
    let (status, reply) = server.api("POST", &path, &event("e", &long, "x")).await;
    assert_eq!(status, 400, "{reply}");
    let (status, reply) = server
        .api("POST", &path, &event("e", "ok", &"x".repeat(101)))
        .await;
    assert_eq!(status, 413, "{reply}");
    assert!(
        reply["error"].as_str().unwrap().contains("max_payload"),
        "{reply}"
    );

    // The other app on the same server keeps Pusher's defaults.
    let mut r = roomy_client(&server).await;
    r.subscribe(&long).await;
    let mut r2 = roomy_client(&server).await;
    roomy_subscribe_private(&mut r, "private-roomy").await;
    roomy_subscribe_private(&mut r2, "private-roomy").await;
    r.send(json!({ "event": name31, "channel": "private-roomy", "data": "x".repeat(500) }))
        .await;
    assert_eq!(
        r2.expect(&name31, Some("private-roomy")).await["data"],
        "x".repeat(500)
    );

    still_healthy(&server, &mut healthy).await;
}

#[tokio::test]
async fn per_app_presence_limits_are_honoured() {
    let server = Server::start_with("", SMALL).await;
    let mut healthy = bystander(&server).await;
    let ch = "presence-small";
    let mut a = server.client().await;

    // User id over 8 characters, user_info over 64 bytes: refused.
    subscribe_presence_text(&mut a, ch, r#"{"user_id":"123456789"}"#).await;
    expect_subscription_error(&mut a, ch, "InvalidChannelData", 400, "8").await;
    let cd = format!(r#"{{"user_id":"a","user_info":{}}}"#, user_info_of_len(65));
    subscribe_presence_text(&mut a, ch, &cd).await;
    expect_subscription_error(&mut a, ch, "InvalidChannelData", 400, "64").await;

    // At the limits: accepted.
    let cd = format!(
        r#"{{"user_id":"12345678","user_info":{}}}"#,
        user_info_of_len(64)
    );
    subscribe_presence_text(&mut a, ch, &cd).await;
    a.expect("pusher_internal:subscription_succeeded", Some(ch))
        .await;

    // Two members fill the channel; a third user is refused...
    let mut b = server.client().await;
    b.subscribe_presence(ch, "b", json!({})).await;
    a.expect("pusher_internal:member_added", Some(ch)).await;
    let mut c = server.client().await;
    let cd = r#"{"user_id":"c"}"#;
    subscribe_presence_text(&mut c, ch, cd).await;
    expect_subscription_error(&mut c, ch, "LimitReached", 403, "2").await;
    // ...but a second socket of a member is not a new member.
    let mut b2 = server.client().await;
    let ok = b2.subscribe_presence(ch, "b", json!({})).await;
    assert_eq!(ok["presence"]["count"], 2, "{ok}");

    // The refused client is usable: it joins once a member leaves.
    a.unsubscribe(ch).await;
    b.expect("pusher_internal:member_removed", Some(ch)).await;
    let ok = c.subscribe_presence(ch, "c", json!({})).await;
    assert_eq!(ok["presence"]["count"], 2, "{ok}");
    server.trigger(ch, "after", "x").await;
    b.expect("pusher_internal:member_added", Some(ch)).await;
    b.expect("after", Some(ch)).await;
    c.expect("after", Some(ch)).await;

    // The roomy app takes what this one refused.
    let mut r = roomy_client(&server).await;
    let cd = r#"{"user_id":"123456789"}"#;
    let auth = herald_pusher::signing::token(
        "roomy-key",
        "roomy-secret",
        &herald_pusher::signing::channel_string(&r.socket_id, ch, Some(cd)),
    );
    r.subscribe_raw(ch, Some(&auth), Some(cd)).await;
    r.expect("pusher_internal:subscription_succeeded", Some(ch))
        .await;

    still_healthy(&server, &mut healthy).await;
}

// ----- rates and counts ------------------------------------------------------------

#[tokio::test]
async fn client_event_rate_lets_exactly_the_limit_through_then_4301() {
    let server = Server::start_with("", "client_event_rate = 3").await;
    let ch = "private-rate";
    let mut a = server.client().await;
    let mut b = server.client().await;
    a.subscribe_private(ch).await;
    b.subscribe_private(ch).await;

    // The limit is a window of one second that starts at a connection's
    // first client event once a second has passed since the previous
    // window began (the first window begins with the connection). Waiting
    // out that second makes the burst below open a fresh window, so the
    // outcome is exact rather than dependent on where a window boundary
    // falls; the burst takes milliseconds.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let event = |n: u32| json!({ "event": "client-n", "channel": ch, "data": { "n": n } });
    for n in 0..4 {
        a.ws.feed(Message::text(event(n).to_string()))
            .await
            .expect("send");
    }
    a.ws.flush().await.expect("send");

    // The 4th of 4 in one second is refused with 4301, and a stays open.
    let f = a.expect("pusher:error", None).await;
    assert_eq!(data(&f)["code"], 4301, "{f}");
    // Exactly the first three reach b, then the marker: the fourth was dropped.
    server.trigger(ch, "marker", "m").await;
    for n in 0..3 {
        let f = b.expect("client-n", Some(ch)).await;
        assert_eq!(f["data"], json!({ "n": n }), "{f}");
    }
    b.expect("marker", Some(ch)).await;
    a.expect("marker", Some(ch)).await;

    // A later window lets events through again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    a.send(event(9)).await;
    assert_eq!(
        b.expect("client-n", Some(ch)).await["data"],
        json!({ "n": 9 })
    );
}

#[tokio::test]
async fn max_subscriptions_per_connection_admits_exactly_the_limit() {
    let server = Server::start_with("", "max_subscriptions_per_connection = 5").await;
    let mut healthy = bystander(&server).await;
    let mut a = server.client().await;
    // Exactly 5 succeed, of mixed kinds.
    for ch in ["s1", "s2", "s3", "cache-s4"] {
        a.subscribe(ch).await;
    }
    a.expect("pusher:cache_miss", Some("cache-s4")).await;
    a.subscribe_private("private-s5").await;

    // The 6th is refused with LimitReached 403, public or private alike.
    a.subscribe_raw("s6", None, None).await;
    expect_subscription_error(&mut a, "s6", "LimitReached", 403, "5").await;
    let auth = private_auth(&a.socket_id, "private-s6");
    a.subscribe_raw("private-s6", Some(&auth), None).await;
    expect_subscription_error(&mut a, "private-s6", "LimitReached", 403, "5").await;
    // The refused channel is not occupied by it.
    server.trigger("s6", "leak", "x").await;

    // Subscribing again to a channel it has is not a new subscription.
    a.subscribe("s1").await;
    // Unsubscribing frees exactly one slot.
    a.unsubscribe("s2").await;
    a.subscribe("s6").await;
    a.subscribe_raw("s7", None, None).await;
    expect_subscription_error(&mut a, "s7", "LimitReached", 403, "5").await;

    // Still connected and receiving on its channels; "leak" never reached it.
    server.trigger("s6", "after", "x").await;
    a.expect("after", Some("s6")).await;
    still_healthy(&server, &mut healthy).await;
}

#[tokio::test]
async fn integer_user_ids_above_2_pow_53_stay_exact_and_distinct() {
    // 2^53 and 2^53 + 1 are one f64; 2^70 printed through f64 would be
    // "1.1805916207174113e+21". Each is one user, named by its digits.
    let server = Server::start().await;
    let ch = "presence-big-ids";
    let ids = [
        "9007199254740992",
        "9007199254740993",
        "1180591620717411303424",
    ];
    let mut clients = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        let mut c = server.client().await;
        subscribe_presence_text(&mut c, ch, &format!(r#"{{"user_id":{id}}}"#)).await;
        let f = c
            .expect("pusher_internal:subscription_succeeded", Some(ch))
            .await;
        let presence = &data(&f)["presence"];
        assert_eq!(presence["count"], n + 1, "{f}");
        let mut listed: Vec<String> = presence["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().expect("ids are strings").to_owned())
            .collect();
        listed.sort();
        let mut want: Vec<String> = ids[..=n].iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(listed, want, "{f}");
        for earlier in &mut clients {
            let added = Client::expect(earlier, "pusher_internal:member_added", Some(ch)).await;
            assert_eq!(data(&added)["user_id"], *id, "{added}");
        }
        clients.push(c);
    }
}

#[tokio::test]
async fn channel_data_that_is_not_an_object_is_refused() {
    let server = Server::start().await;
    let mut a = server.client().await;
    // serde reads a struct from an array too: `[1,2]` was user 1.
    for (n, cd) in ["[1,2]", r#"["u1",{"name":"x"}]"#, "42", r#""u1""#]
        .iter()
        .enumerate()
    {
        let ch = format!("presence-shape-{n}");
        subscribe_presence_text(&mut a, &ch, cd).await;
        expect_subscription_error(&mut a, &ch, "InvalidChannelData", 400, "channel_data").await;
    }
    // The same connection still joins with an object.
    subscribe_presence_text(&mut a, "presence-shape-ok", r#"{"user_id":1}"#).await;
    let f = a
        .expect(
            "pusher_internal:subscription_succeeded",
            Some("presence-shape-ok"),
        )
        .await;
    assert_eq!(data(&f)["presence"]["ids"], json!(["1"]), "{f}");
}
