//! `actioncable-v1-ext-json` over real sockets against a real
//! herald: bad history requests get `reject_history` and leave the client
//! connected and served; a forged or used `sid` gets a normal welcome; a
//! closed session restores once, with what it missed, and never over a
//! token naming another user.

use crate::common;

use common::ext::{broadcast, cable, frame, ident, send};

use common::{Server, TIMEOUT};
use herald_broker::testing::{BrokerServer, Kind};
use serde_json::{json, Value};

async fn subscribed(server: &Server, stream: &str) -> (common::Ws, String) {
    let mut ws = cable(server, "").await;
    let welcome = frame(&mut ws).await;
    assert_eq!(welcome["type"], "welcome");
    let sid = welcome["sid"].as_str().unwrap().to_owned();
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": ident(stream) }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    (ws, sid)
}

#[tokio::test]
async fn bad_history_requests_are_rejected_and_the_client_stays_served() {
    let server = Server::start_with("[rpc]\npublic_streams = true", "").await;
    let (mut ws, _) = subscribed(&server, "s").await;
    broadcast(&server, "s", json!({ "n": 1 })).await;
    let live = frame(&mut ws).await;
    assert_eq!(live["offset"], 1);
    assert_eq!(live["stream_id"], "s");
    let epoch = live["epoch"].as_str().unwrap().to_owned();
    let id = ident("s");
    let many: serde_json::Map<String, Value> = (0..1001)
        .map(|i| (format!("x{i}"), json!({ "epoch": epoch, "offset": 0 })))
        .collect();
    for (what, history) in [
        (
            "unknown epoch",
            json!({ "streams": { "s": { "epoch": "forged", "offset": 0 } } }),
        ),
        (
            "offset ahead",
            json!({ "streams": { "s": { "epoch": epoch, "offset": 99 } } }),
        ),
        (
            "negative offset",
            json!({ "streams": { "s": { "epoch": epoch, "offset": -1 } } }),
        ),
        ("not an object", json!("since yesterday")),
        ("over 1000 streams", json!({ "streams": many })),
        // Neither a time nor a position: nothing to answer but a refusal.
        ("since 0", json!({ "since": 0 })),
        ("empty", json!({})),
        ("no streams", json!({ "streams": {} })),
    ] {
        send(
            &mut ws,
            json!({ "command": "history", "identifier": id, "history": history }),
        )
        .await;
        assert_eq!(
            frame(&mut ws).await,
            json!({ "type": "reject_history", "identifier": id }),
            "{what}"
        );
    }
    // A request for a subscription the client does not have: no answer
    // (as anycable-go); the next frame is the next broadcast.
    send(
        &mut ws,
        json!({ "command": "history", "identifier": ident("other"), "history": { "since": 1 } }),
    )
    .await;
    send(&mut ws, json!({ "command": "pong" })).await;
    broadcast(&server, "s", json!({ "n": 2 })).await;
    let f = frame(&mut ws).await;
    assert_eq!(
        (f["message"].clone(), f["offset"].clone()),
        (json!({ "n": 2 }), json!(2))
    );
    // Every reject_history is counted, whatever its reason.
    assert_eq!(
        server.metric("herald_cable_history_rejected_total").await,
        8
    );
}

/// Requests over `rpc.history_rate` get `reject_history` too, counted in
/// `herald_cable_history_rejected_total` (every rejection) and
/// `herald_cable_history_limited_total` (these).
#[tokio::test]
async fn history_requests_over_the_rate_are_rejected_and_counted() {
    let server = Server::start_with("[rpc]\npublic_streams = true\nhistory_rate = 1", "").await;
    let (mut ws, _) = subscribed(&server, "s").await;
    broadcast(&server, "s", json!({ "n": 1 })).await;
    let live = frame(&mut ws).await;
    let epoch = live["epoch"].as_str().unwrap().to_owned();
    let id = ident("s");
    // Five at once: the bucket holds one, and refills at one a second.
    for _ in 0..5 {
        send(
            &mut ws,
            json!({ "command": "history", "identifier": id,
                    "history": { "streams": { "s": { "epoch": epoch, "offset": 1 } } } }),
        )
        .await;
    }
    let (mut confirmed, mut rejected) = (0, 0);
    while confirmed + rejected < 5 {
        let f = frame(&mut ws).await;
        match f["type"].as_str() {
            Some("confirm_history") => confirmed += 1,
            Some("reject_history") => rejected += 1,
            _ => panic!("unexpected {f}"),
        }
    }
    assert!(
        rejected >= 1 && confirmed >= 1,
        "{confirmed} confirmed, {rejected} rejected"
    );
    assert_eq!(
        server.metric("herald_cable_history_rejected_total").await,
        rejected
    );
    assert_eq!(
        server.metric("herald_cable_history_limited_total").await,
        rejected
    );
}

#[tokio::test]
async fn a_session_restores_once_with_what_it_missed_and_a_forged_sid_connects_anew() {
    let server = Server::start_with("[rpc]\npublic_streams = true", "").await;
    let (mut ws, sid) = subscribed(&server, "r").await;
    assert_eq!(
        sid.split('.').count(),
        3,
        "the sid carries a random part: {sid}"
    );
    broadcast(&server, "r", json!({ "n": 1 })).await;
    let first = frame(&mut ws).await;
    let epoch = first["epoch"].as_str().unwrap().to_owned();
    ws.close(None).await.unwrap();
    drop(ws);
    // The server has the session once the restore works; retry until then.
    let deadline = std::time::Instant::now() + TIMEOUT;
    broadcast(&server, "r", json!({ "n": 2 })).await;
    let mut back = loop {
        let mut ws = cable(&server, &format!("?sid={sid}")).await;
        let welcome = frame(&mut ws).await;
        if welcome["restored"] == true {
            assert_eq!(welcome["restored_ids"], json!([ident("r")]));
            assert_ne!(welcome["sid"], json!(sid));
            break ws;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never restored: {welcome}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    send(
        &mut back,
        json!({ "command": "history", "identifier": ident("r"),
        "history": { "streams": { "r": { "epoch": epoch, "offset": 1 } } } }),
    )
    .await;
    let missed = frame(&mut back).await;
    assert_eq!(
        (missed["message"].clone(), missed["offset"].clone()),
        (json!({ "n": 2 }), json!(2))
    );
    assert_eq!(frame(&mut back).await["type"], "confirm_history");
    // The same sid again, and a forged one: a normal welcome.
    for query in [
        format!("?sid={sid}"),
        "?sid=1.2.0123456789abcdef".to_owned(),
    ] {
        let mut ws = cable(&server, &query).await;
        let welcome = frame(&mut ws).await;
        assert_eq!(welcome["type"], "welcome");
        assert!(welcome.get("restored").is_none(), "{query}: {welcome}");
    }
    assert_eq!(
        server.metric("herald_cable_sessions_restored_total").await,
        1
    );
}

/// In process: a session is restored only once its connection
/// closed, never over another user's token, and once.
#[tokio::test]
async fn a_session_restores_only_once_its_connection_is_gone_in_process() {
    let top = format!("[rpc]\n{}", common::ext::RESTORE_RPC);
    let server = Server::start_with(&top, "").await;
    // Only closed sessions are kept in process: nothing to look at.
    common::ext::a_session_restores_only_once_its_connection_is_gone(
        &[&server],
        async |_: &str| Some(String::new()),
    )
    .await;
}

/// A restored client that never asks for its history still gets its live
/// publications (after the restored hold), in order.
#[tokio::test]
async fn a_restored_client_that_asks_nothing_gets_its_live_messages() {
    let server = Server::start_with("[rpc]\npublic_streams = true", "").await;
    let (mut ws, sid) = subscribed(&server, "q").await;
    ws.close(None).await.unwrap();
    drop(ws);
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut back = loop {
        let mut ws = cable(&server, &format!("?sid={sid}")).await;
        if frame(&mut ws).await["restored"] == true {
            break ws;
        }
        assert!(std::time::Instant::now() < deadline, "never restored");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    for n in 1..=3 {
        broadcast(&server, "q", json!({ "n": n })).await;
    }
    // Held for up to 5 s (RESTORED_HOLD), then they go out; common::next
    // waits up to TIMEOUT for each frame.
    for n in 1..=3 {
        let f = frame(&mut back).await;
        assert_eq!(f["message"], json!({ "n": n }), "{f}");
    }
}

/// A stream followed but idle for longer than `history_ttl` stays
/// reliable: its next message still carries a position (the engine would
/// otherwise have forgotten the idle stream).
#[tokio::test]
async fn a_followed_stream_idle_past_the_ttl_stays_reliable() {
    let server = Server::start_with("[rpc]\npublic_streams = true\nhistory_ttl = 1", "").await;
    let (mut ws, _) = subscribed(&server, "idle").await;
    // The idleness is the scenario: three sweeps of a 1 s history.
    tokio::time::sleep(std::time::Duration::from_millis(3500)).await;
    broadcast(&server, "idle", json!({ "n": 1 })).await;
    let f = frame(&mut ws).await;
    assert_eq!(f["message"], json!({ "n": 1 }), "{f}");
    assert!(
        f["offset"].is_u64() && f["epoch"].is_string(),
        "no position: {f}"
    );
}

// ----- Presence and whispers ---------------------------------------------

async fn join(ws: &mut common::Ws, identifier: &str, presence: Value) {
    send(
        ws,
        json!({ "command": "join", "identifier": identifier, "presence": presence }),
    )
    .await;
}

async fn info(ws: &mut common::Ws, identifier: &str) -> Value {
    send(
        ws,
        json!({ "command": "presence", "identifier": identifier, "data": {} }),
    )
    .await;
    let f = frame(ws).await;
    assert_eq!(f["type"], "presence", "{f}");
    assert_eq!(f["identifier"], identifier, "{f}");
    f["message"].clone()
}

/// The next frame of `ws` is a presence error for `identifier` whose
/// reason mentions `why`.
async fn presence_error(ws: &mut common::Ws, identifier: &str, why: &str) {
    let f = frame(ws).await;
    assert_eq!(f["type"], "presence", "{f}");
    assert_eq!(f["identifier"], identifier, "{f}");
    assert_eq!(f["message"]["type"], "error", "{f}");
    let reason = f["message"]["reason"].as_str().unwrap();
    assert!(reason.contains(why), "{why:?} not in {reason:?}");
}

#[tokio::test]
async fn presence_join_info_leave_and_bad_members_get_presence_errors() {
    let server = Server::start_with(
        "[rpc]\npublic_streams = true\nstreams_presence = false\npresence_max_info = 64\npresence_max_joins = 2",
        "",
    )
    .await;
    let (mut a, _) = subscribed(&server, "room").await;
    let (mut b, _) = subscribed(&server, "room").await;
    let room = ident("room");
    join(
        &mut a,
        &room,
        json!({ "id": "1", "info": { "name": "Ann" } }),
    )
    .await;
    let joined = json!({ "type": "presence", "identifier": room,
        "message": { "type": "join", "info": { "name": "Ann" }, "id": "1" } });
    assert_eq!(frame(&mut a).await, joined);
    assert_eq!(frame(&mut b).await, joined);
    // The same id again, from another connection: one member, no event.
    join(
        &mut b,
        &room,
        json!({ "id": "1", "info": { "name": "Ann" } }),
    )
    .await;
    let got = info(&mut b, &room).await;
    assert_eq!(
        got,
        json!({ "type": "info", "total": 1, "records": [{ "info": { "name": "Ann" }, "id": "1" }] })
    );
    assert_eq!(
        info(&mut a, &room).await["total"],
        1,
        "the member is one, whichever connection asks"
    );
    // Bad members, each answered and the client still served.
    join(&mut a, &room, json!({ "id": "2" })).await;
    presence_error(&mut a, &room, "another id").await;
    join(&mut a, &room, json!({ "id": "" })).await;
    presence_error(&mut a, &room, "empty").await;
    join(&mut a, &room, json!({ "id": 7 })).await;
    presence_error(&mut a, &room, "malformed").await;
    send(&mut a, json!({ "command": "join", "identifier": room })).await;
    presence_error(&mut a, &room, "missing").await;
    let (mut c, _) = subscribed(&server, "other").await;
    let other = ident("other");
    join(&mut c, &other, json!({ "id": "3", "info": "x".repeat(64) })).await;
    presence_error(&mut c, &other, "presence_max_info").await;
    // A signed stream is not presence-enabled with streams_presence off.
    let signed = json!({ "channel": "$pubsub", "signed_stream_name":
        herald_actioncable::streams::signed_stream(common::APP_SECRET, "signed") })
    .to_string();
    send(
        &mut c,
        json!({ "command": "subscribe", "identifier": signed }),
    )
    .await;
    assert_eq!(frame(&mut c).await["type"], "confirm_subscription");
    join(&mut c, &signed, json!({ "id": "3" })).await;
    presence_error(&mut c, &signed, "not enabled").await;
    send(
        &mut c,
        json!({ "command": "presence", "identifier": signed }),
    )
    .await;
    presence_error(&mut c, &signed, "not enabled").await;
    // presence_max_joins = 2 per connection.
    for s in ["j1", "j2", "j3"] {
        send(
            &mut c,
            json!({ "command": "subscribe", "identifier": ident(s) }),
        )
        .await;
        assert_eq!(frame(&mut c).await["type"], "confirm_subscription");
        join(&mut c, &ident(s), json!({ "id": "9" })).await;
        if s == "j3" {
            presence_error(&mut c, &ident(s), "presence_max_joins").await;
        } else {
            assert_eq!(frame(&mut c).await["message"]["type"], "join");
        }
    }
    // Leaving: the member goes when its last connection leaves.
    send(&mut a, json!({ "command": "leave", "identifier": room })).await;
    assert_eq!(info(&mut a, &room).await["total"], 1);
    send(
        &mut b,
        json!({ "command": "unsubscribe", "identifier": room }),
    )
    .await;
    let left = json!({ "type": "presence", "identifier": room,
        "message": { "type": "leave", "id": "1" } });
    assert_eq!(frame(&mut a).await, left);
    assert_eq!(
        info(&mut a, &room).await,
        json!({ "type": "info", "total": 0 })
    );
    // Presence events never take a place in the stream's history.
    broadcast(&server, "room", json!({ "n": 1 })).await;
    assert_eq!(frame(&mut a).await["offset"], 1);
}

#[tokio::test]
async fn a_member_gone_without_leaving_stays_for_the_ttl_then_leaves() {
    let server = Server::start_with("[rpc]\npublic_streams = true\npresence_ttl = 1", "").await;
    let room = ident("room");
    let (mut watcher, _) = subscribed(&server, "room").await;
    let (mut a, _) = subscribed(&server, "room").await;
    join(&mut a, &room, json!({ "id": "a" })).await;
    assert_eq!(frame(&mut watcher).await["message"]["type"], "join");
    // Back within the TTL on a new connection: one member throughout.
    drop(a);
    let (mut a2, _) = subscribed(&server, "room").await;
    join(&mut a2, &room, json!({ "id": "a" })).await;
    assert_eq!(info(&mut watcher, &room).await["total"], 1);
    // The first connection's membership expires; the member stays (no
    // leave reaches the watcher before the marker broadcast after it).
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    broadcast(&server, "room", json!({ "marker": 1 })).await;
    assert_eq!(frame(&mut watcher).await["message"]["marker"], 1);
    assert_eq!(info(&mut watcher, &room).await["total"], 1);
    // Gone for good: the leave comes after the TTL.
    let gone = std::time::Instant::now();
    drop(a2);
    let f = frame(&mut watcher).await;
    assert_eq!(f["message"], json!({ "type": "leave", "id": "a" }), "{f}");
    assert!(gone.elapsed() >= std::time::Duration::from_millis(900));
    assert_eq!(info(&mut watcher, &room).await["total"], 0);
}

#[tokio::test]
async fn whispers_reach_the_others_only_within_the_rate_and_where_allowed() {
    let server = Server::start_with("[rpc]\npublic_streams = true\nwhisper_rate = 3", "").await;
    let room = ident("room");
    let (mut a, _) = subscribed(&server, "room").await;
    let (mut b, _) = subscribed(&server, "room").await;
    for n in 0..10 {
        send(
            &mut a,
            json!({ "command": "whisper", "identifier": room, "data": { "typing": n } }),
        )
        .await;
    }
    // The whisper rate: 3 of the 10, in order, without positions.
    for n in 0..3 {
        let f = frame(&mut b).await;
        assert_eq!(f, json!({ "identifier": room, "message": { "typing": n } }));
    }
    // A signed stream may not whisper (streams_whisper is off by default).
    let signed = json!({ "channel": "$pubsub", "signed_stream_name":
        herald_actioncable::streams::signed_stream(common::APP_SECRET, "quiet") })
    .to_string();
    for ws in [&mut a, &mut b] {
        send(ws, json!({ "command": "subscribe", "identifier": signed })).await;
        assert_eq!(frame(ws).await["type"], "confirm_subscription");
    }
    send(
        &mut a,
        json!({ "command": "whisper", "identifier": signed, "data": { "typing": "signed" } }),
    )
    .await;
    // None to the sender, none on the signed stream, none past the rate:
    // the broadcasts after them come next.
    send(&mut a, json!({ "command": "pong" })).await;
    broadcast(&server, "quiet", json!({ "after": true })).await;
    broadcast(&server, "room", json!({ "after": true })).await;
    for ws in [&mut a, &mut b] {
        let mut ids = Vec::new();
        for _ in 0..2 {
            let f = frame(ws).await;
            assert_eq!(f["message"], json!({ "after": true }), "{f}");
            ids.push(f["identifier"].as_str().unwrap().to_owned());
        }
        ids.sort();
        let mut want = vec![room.clone(), signed.clone()];
        want.sort();
        assert_eq!(ids, want);
    }
}

/// Two nodes on a real broker server: a member joined on node A is in
/// node B's `info` (B has no member of its own, so it asks the broker),
/// and joins and leaves on either node reach the stream's subscribers on
/// both.
async fn presence_across_two_nodes(kind: Kind) {
    let broker = BrokerServer::start(kind);
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"p-{}\"\n[rpc]\npublic_streams = true\n",
        broker.url(),
        std::process::id()
    );
    let node_a = Server::start_with(&top, "").await;
    let node_b = Server::start_with(&top, "").await;
    let room = ident("room");
    let (mut a, _) = subscribed(&node_a, "room").await;
    let (mut b, _) = subscribed(&node_b, "room").await;
    join(&mut a, &room, json!({ "id": "a", "info": { "node": "A" } })).await;
    let joined_a = json!({ "type": "presence", "identifier": room,
        "message": { "type": "join", "info": { "node": "A" }, "id": "a" } });
    assert_eq!(frame(&mut a).await, joined_a);
    assert_eq!(frame(&mut b).await, joined_a, "node B hears of A's member");
    // The broker records the member as it relays the join: B's answer
    // shows it once it is there (asked again within the deadline).
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let got = info(&mut b, &room).await;
        if got["total"] == 1 {
            assert_eq!(
                got["records"],
                json!([{ "info": { "node": "A" }, "id": "a" }])
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "B never saw A's member: {got}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    join(&mut b, &room, json!({ "id": "b" })).await;
    for ws in [&mut a, &mut b] {
        assert_eq!(
            frame(ws).await["message"],
            json!({ "type": "join", "id": "b" })
        );
    }
    // Each node's count is the broker's record, which may trail the
    // relayed join a moment: asked again until it is there.
    until_total(&mut a, &room, 2).await;
    until_total(&mut b, &room, 2).await;
    send(&mut a, json!({ "command": "leave", "identifier": room })).await;
    for ws in [&mut a, &mut b] {
        assert_eq!(
            frame(ws).await["message"],
            json!({ "type": "leave", "id": "a" })
        );
    }
    let got = until_total(&mut b, &room, 1).await;
    assert_eq!(
        got,
        json!({ "type": "info", "total": 1, "records": [{ "id": "b" }] })
    );
}

/// Ask `ws` for `identifier`'s presence until it counts `total` members;
/// that answer.
async fn until_total(ws: &mut common::Ws, identifier: &str, total: u64) -> Value {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let got = info(ws, identifier).await;
        if got["total"] == total {
            return got;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{got}, wanted {total} members"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

both!(presence_across_two_nodes);

/// A client that reconnects without a session to restore subscribes again
/// naming its member (`@anycable/core` does): confirmed, then joined.
#[tokio::test]
async fn a_subscribe_naming_the_member_joins_after_the_confirmation() {
    let server = Server::start_with("[rpc]\npublic_streams = true", "").await;
    let room = ident("room");
    let mut ws = cable(&server, "").await;
    assert_eq!(frame(&mut ws).await["type"], "welcome");
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": room, "presence": { "id": "z" } }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    assert_eq!(
        frame(&mut ws).await,
        json!({ "type": "presence", "identifier": room,
            "message": { "id": "z", "type": "join" } })
    );
    assert_eq!(
        info(&mut ws, &room).await,
        json!({ "type": "info", "total": 1, "records": [{ "id": "z" }] })
    );
}

/// Two subscriptions of one connection to the same stream each get every
/// message of it (the gate keeps one track per subscription).
#[tokio::test]
async fn two_subscriptions_of_one_stream_each_get_every_message() {
    let server = Server::start_with("[rpc]\npublic_streams = true", "").await;
    let (mut ws, _) = subscribed(&server, "both").await;
    let second = json!({ "channel": "$pubsub", "stream_name": "both", "n": 2 }).to_string();
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": second }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    broadcast(&server, "both", json!({ "n": 1 })).await;
    let mut got = vec![];
    for _ in 0..2 {
        let f = frame(&mut ws).await;
        assert_eq!(
            (f["message"].clone(), f["offset"].clone()),
            (json!({ "n": 1 }), json!(1)),
            "{f}"
        );
        got.push(f["identifier"].as_str().unwrap().to_owned());
    }
    got.sort();
    let mut want = vec![ident("both"), second];
    want.sort();
    assert_eq!(got, want);
}
