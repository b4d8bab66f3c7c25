//! `actioncable-v1-ext-json` over several real `herald serve` nodes on a
//! real `redis-server` and `nats-server -js`: the members of a SIGKILLed
//! node leave, once, for every subscriber of the stream on the other nodes; on NATS JetStream a live
//! session is restored by no one, and a frozen node's restores elsewhere
//! once (a live session is never restored).

use crate::common;

use common::ext::{broadcast, cable, frame, ident, send};

use common::{Server, Ws, TIMEOUT};
use herald_broker::testing::{BrokerServer, Kind};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// `n` nodes on `broker`, a 2 s broker TTL (a killed node's members go
/// within about 3 s), started in order (the first is the oldest: the
/// engine's reporting node until it dies).
async fn nodes(broker: &BrokerServer, n: usize, extra: &str) -> Vec<Server> {
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"g{}\"\nttl = 2\n[rpc]\npublic_streams = true\n{extra}",
        broker.url(),
        std::process::id()
    );
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(Server::start_with(&top, "").await);
    }
    out
}

async fn subscribed(server: &Server, stream: &str) -> Ws {
    let mut ws = cable(server, "").await;
    assert_eq!(frame(&mut ws).await["type"], "welcome");
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": ident(stream) }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    ws
}

async fn join(ws: &mut Ws, stream: &str, id: &str) {
    send(
        ws,
        json!({ "command": "join", "identifier": ident(stream), "presence": { "id": id } }),
    )
    .await;
}

/// The `presence` (info) answer of `ws` for `stream`.
async fn info(ws: &mut Ws, stream: &str) -> Value {
    send(
        ws,
        json!({ "command": "presence", "identifier": ident(stream), "data": {} }),
    )
    .await;
    let f = frame(ws).await;
    assert_eq!(f["type"], "presence", "{f}");
    f["message"].clone()
}

/// Ask `ws` for `stream`'s presence until it counts `total` members.
async fn until_total(ws: &mut Ws, stream: &str, total: u64) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let got = info(ws, stream).await;
        if got["total"] == total {
            return;
        }
        assert!(Instant::now() < deadline, "{stream}: {got}, wanted {total}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Three nodes; a member joined on the first (the oldest, so the node
/// that reports for the cluster dies with it), a member on the second,
/// and a subscriber that never joined on the third. The first is
/// SIGKILLed: both others hear its member's `leave`, once, within the
/// broker's TTL, and their `info` no longer counts it.
async fn a_killed_nodes_members_leave_for_everyone(kind: Kind) {
    let broker = BrokerServer::start(kind);
    let mut n = nodes(&broker, 3, "").await;
    let mut a = subscribed(&n[0], "room").await;
    let mut b = subscribed(&n[1], "room").await;
    let mut c = subscribed(&n[2], "room").await;
    join(&mut a, "room", "a").await;
    for ws in [&mut a, &mut b, &mut c] {
        assert_eq!(
            frame(ws).await["message"],
            json!({ "type": "join", "id": "a" })
        );
    }
    join(&mut b, "room", "b").await;
    for ws in [&mut a, &mut b, &mut c] {
        assert_eq!(
            frame(ws).await["message"],
            json!({ "type": "join", "id": "b" })
        );
    }
    until_total(&mut c, "room", 2).await;
    until_total(&mut b, "room", 2).await;

    n[0].child.kill().unwrap();
    let killed = Instant::now();
    for ws in [&mut b, &mut c] {
        let f = frame(ws).await;
        assert_eq!(
            f,
            json!({ "type": "presence", "identifier": ident("room"),
                    "message": { "type": "leave", "id": "a" } })
        );
    }
    // Gone by the TTL, not before (the broker's heartbeats decide).
    assert!(killed.elapsed() >= Duration::from_secs(1), "{killed:?}");
    // Once: the next frame on both is a broadcast made after it.
    broadcast(&n[1], "room", json!({ "after": 1 })).await;
    for ws in [&mut b, &mut c] {
        let f = frame(ws).await;
        assert_eq!(f["message"], json!({ "after": 1 }), "{f}");
    }
    assert_eq!(
        info(&mut b, "room").await,
        json!({ "type": "info", "total": 1, "records": [{ "id": "b" }] })
    );
    until_total(&mut c, "room", 1).await;
}

both!(a_killed_nodes_members_leave_for_everyone);

/// Redis: the first extended-protocol subscription to a stream marks it
/// reliable on the server before `confirm_subscription`, so a publication
/// made on another node right after the confirmation has a position. The
/// server's writes are paused while the client subscribes (`CLIENT PAUSE
/// WRITE`: the marker's script waits, reads and the node's `SUBSCRIBE` do
/// not), so a confirmation sent before the marker exists is seen as such.
#[tokio::test]
async fn a_stream_is_reliable_on_redis_before_its_subscription_is_confirmed() {
    let broker = BrokerServer::start(Kind::Redis);
    let n = nodes(&broker, 2, "").await;
    let mut r = redis::Client::open(broker.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let markers = |r: &mut redis::aio::MultiplexedConnection| {
        let mut r = r.clone();
        async move {
            let k: Vec<String> = redis::cmd("KEYS")
                .arg("*:hist:*:m")
                .query_async(&mut r)
                .await
                .unwrap();
            k.len()
        }
    };
    for k in 0..3 {
        let stream = format!("fresh-{k}");
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(400)
            .arg("WRITE")
            .query_async(&mut r)
            .await
            .unwrap();
        let mut ws = subscribed(&n[0], &stream).await;
        assert_eq!(
            markers(&mut r).await,
            k + 1,
            "{stream} confirmed before it was marked reliable on the server"
        );
        broadcast(&n[1], &stream, json!({ "n": k })).await;
        let f = frame(&mut ws).await;
        assert_eq!(f["message"], json!({ "n": k }), "{f}");
        assert_eq!(f["offset"], 1, "{stream}: no position: {f}");
        assert!(f["epoch"].is_string(), "{f}");
    }
}

/// The snapshot in the NATS sessions bucket whose text holds `marker`.
async fn nats_stored(
    js: &async_nats::jetstream::Context,
    bucket: &str,
    marker: &str,
) -> Option<String> {
    use futures_util::TryStreamExt;
    let kv = js.get_key_value(bucket).await.ok()?;
    let keys: Vec<String> = kv.keys().await.ok()?.try_collect().await.ok()?;
    for k in keys {
        if let Ok(Some(v)) = kv.get(&k).await {
            let v = String::from_utf8_lossy(&v).into_owned();
            if v.contains(marker) {
                return Some(v);
            }
        }
    }
    None
}

/// A live session is never restored, on NATS JetStream, two nodes: a live session is restored by
/// no one, a closed one not over another user's token, and once.
#[tokio::test]
async fn a_nats_session_restores_only_once_its_connection_is_gone() {
    let broker = BrokerServer::start_jetstream();
    let n = nodes(&broker, 2, "jwt_secret = \"restore-key\"").await;
    let js = async_nats::jetstream::new(async_nats::connect(broker.url()).await.unwrap());
    let bucket = format!("g{}_sessions", std::process::id());
    common::ext::a_session_restores_only_once_its_connection_is_gone(
        &[&n[0], &n[1]],
        async |m: &str| nats_stored(&js, &bucket, m).await,
    )
    .await;
}

/// On NATS JetStream: a frozen node's session restores on the
/// other once it is declared gone, and the node, back, does not write it
/// back (the compare-and-set on its last revision).
#[tokio::test]
async fn a_frozen_nats_nodes_session_restores_elsewhere_once() {
    let broker = BrokerServer::start_jetstream();
    let n = nodes(&broker, 2, "").await;
    let js = async_nats::jetstream::new(async_nats::connect(broker.url()).await.unwrap());
    let bucket = format!("g{}_sessions", std::process::id());
    common::ext::a_frozen_nodes_session_restores_elsewhere_once(&n[0], &n[1], async |m: &str| {
        nats_stored(&js, &bucket, m).await
    })
    .await;
}
