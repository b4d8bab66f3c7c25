//! `actioncable-v1-ext-json` over three real `herald serve` nodes on a
//! real `redis-server` (history on redis): a publication made on
//! one node is recovered by a client that reconnects to another, with the
//! same offsets whichever node is asked; a session kept by a node that is
//! then SIGKILLed is restored on another without a new `Connect`; the
//! server going away rejects history requests and publications go on
//! without positions, and both come back with it.

use crate::common;

use common::ext::{broadcast, cable, frame, ident, send};

use common::{Server, Ws, TIMEOUT};
use herald_broker::testing::{BrokerServer, Kind};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const PREFIX: &str = "hx";

async fn nodes(broker: &BrokerServer, n: usize, extra: &str) -> Vec<Server> {
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"{PREFIX}\"\nttl = 3\n{extra}",
        broker.url()
    );
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(Server::start_with(&top, "").await);
    }
    out
}

/// Broadcast probes to `stream` through `node` until `ws` gets one live:
/// the other nodes subscribe to a stream's channel on the broker shortly
/// after their client's subscription is confirmed, and a publication made
/// before that reaches none of them (the broker's pub/sub keeps nothing).
/// Its position. (Probes lost on the way were appended too: offsets
/// after it are what the test counts from; the gate drops any late one.)
async fn probe(node: &Server, ws: &mut Ws, stream: &str) -> (String, u64) {
    let deadline = Instant::now() + TIMEOUT;
    for k in 0.. {
        assert!(Instant::now() < deadline, "no probe of {stream} arrived");
        broadcast(node, stream, json!({ "probe": k })).await;
        if let Ok(f) = tokio::time::timeout(Duration::from_millis(300), frame(ws)).await {
            assert!(f["message"]["probe"].is_number(), "{f}");
            let (_, o, e) = pub_of(&f);
            return (e, o);
        }
    }
    unreachable!()
}

async fn redis(broker: &BrokerServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(broker.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn keys(c: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    tokio::time::timeout(TIMEOUT, redis::cmd("KEYS").arg(pattern).query_async(c))
        .await
        .expect("KEYS timed out")
        .unwrap()
}

/// Wait until `pattern` matches `n` keys on the server.
async fn wait_keys(c: &mut redis::aio::MultiplexedConnection, pattern: &str, n: usize) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let k = keys(c, pattern).await;
        if k.len() == n {
            return;
        }
        assert!(Instant::now() < deadline, "{pattern}: {k:?}, wanted {n}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client on `node` following `stream`, once the stream's marker is on
/// the server: a fresh client each try (a node asks the server to mark a
/// stream at most once a second), within the deadline.
async fn follower(node: &Server, r: &mut redis::aio::MultiplexedConnection, stream: &str) -> Ws {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut ws = cable(node, "").await;
        assert_eq!(frame(&mut ws).await["type"], "welcome");
        send(
            &mut ws,
            json!({ "command": "subscribe", "identifier": ident(stream) }),
        )
        .await;
        assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
        let wait = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < wait {
            if keys(r, &format!("{PREFIX}:hist:*:m")).await.len() == 1 {
                return ws;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(Instant::now() < deadline, "{stream} never marked reliable");
    }
}

/// (message, offset, epoch) of a stream message.
fn pub_of(f: &Value) -> (Value, u64, String) {
    (
        f["message"].clone(),
        f["offset"]
            .as_u64()
            .unwrap_or_else(|| panic!("no offset: {f}")),
        f["epoch"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Ask `node` for the history of `stream` after `offset` in `epoch`, on a
/// fresh client subscribing with the request; its answer (messages, then
/// the confirm or reject frame).
async fn history_from(node: &Server, stream: &str, epoch: &str, offset: u64) -> Vec<Value> {
    let mut ws = cable(node, "").await;
    assert_eq!(frame(&mut ws).await["type"], "welcome");
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": ident(stream),
                "history": { "streams": { stream: { "epoch": epoch, "offset": offset } } } }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    let mut got = Vec::new();
    loop {
        let f = frame(&mut ws).await;
        let t = f["type"].as_str().unwrap_or_default().to_owned();
        got.push(f);
        if t == "confirm_history" || t == "reject_history" {
            return got;
        }
    }
}

#[tokio::test]
async fn a_publication_on_one_node_is_recovered_on_another_with_the_same_offsets() {
    let broker = BrokerServer::start(Kind::Redis);
    let mut r = redis(&broker).await;
    let ns = nodes(&broker, 3, "[rpc]\npublic_streams = true\n").await;
    let (a, b, c) = (&ns[0], &ns[1], &ns[2]);

    // A client on node B follows "room": the stream becomes reliable for
    // the whole cluster (its marker is on the server).
    let mut ws = cable(b, "").await;
    assert_eq!(frame(&mut ws).await["type"], "welcome");
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": ident("room") }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    wait_keys(&mut r, &format!("{PREFIX}:hist:*:m"), 1).await;

    // Node A publishes: B's client gets it live, with its position.
    let (epoch, base) = probe(a, &mut ws, "room").await;
    assert!(!epoch.is_empty() && base >= 1);
    drop(ws);

    // While it is away, A and C publish: consecutive offsets.
    broadcast(a, "room", json!({ "n": 2 })).await;
    broadcast(c, "room", json!({ "n": 3 })).await;

    // Whichever node it reconnects to, it gets exactly what it missed.
    for node in [b, c, a] {
        let got = history_from(node, "room", &epoch, base).await;
        let msgs: Vec<(Value, u64, String)> = got[..got.len() - 1].iter().map(pub_of).collect();
        assert_eq!(
            msgs,
            vec![
                (json!({ "n": 2 }), base + 1, epoch.clone()),
                (json!({ "n": 3 }), base + 2, epoch.clone())
            ],
            "on port {}",
            node.port
        );
        assert_eq!(got.last().unwrap()["type"], "confirm_history");
    }

    // Up to date: nothing, confirmed. A forged epoch, an offset ahead: rejected.
    let got = history_from(c, "room", &epoch, base + 2).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["type"], "confirm_history");
    assert_eq!(
        history_from(a, "room", "forged", base)
            .await
            .last()
            .unwrap()["type"],
        "reject_history"
    );
    assert_eq!(
        history_from(b, "room", &epoch, base + 3)
            .await
            .last()
            .unwrap()["type"],
        "reject_history"
    );

    // The server lost the history (FLUSHALL): the old epoch is refused,
    // and the next subscriber makes the stream reliable in a new epoch.
    let _: () = redis::cmd("FLUSHALL").query_async(&mut r).await.unwrap();
    assert_eq!(
        history_from(a, "room", &epoch, base).await.last().unwrap()["type"],
        "reject_history"
    );
    let mut ws = follower(c, &mut r, "room").await;
    let (e2, _) = probe(b, &mut ws, "room").await;
    assert_ne!(e2, epoch);
}

#[tokio::test]
async fn history_is_bounded_by_history_limit_on_the_server() {
    let broker = BrokerServer::start(Kind::Redis);
    let mut r = redis(&broker).await;
    let ns = nodes(
        &broker,
        2,
        "[rpc]\npublic_streams = true\nhistory_limit = 3\n",
    )
    .await;
    // A stream name no key may be built from unescaped.
    let stream = format!("*}}{{:\n\"{}", "x".repeat(900));
    let mut ws = cable(&ns[0], "").await;
    assert_eq!(frame(&mut ws).await["type"], "welcome");
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": ident(&stream) }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    wait_keys(&mut r, &format!("{PREFIX}:hist:*:m"), 1).await;
    let (epoch, base) = probe(&ns[1], &mut ws, &stream).await;
    for n in 1..=5 {
        broadcast(&ns[1], &stream, json!({ "n": n })).await;
        let (m, o, e) = pub_of(&frame(&mut ws).await);
        assert_eq!((m, o, &e), (json!({ "n": n }), base + n, &epoch));
    }
    // The server keeps 3 entries: after n = 2 is exact, after 1 evicted.
    let len: usize = redis::cmd("XLEN")
        .arg(&keys(&mut r, &format!("{PREFIX}:hist:*:s")).await[0])
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(len, 3);
    let got = history_from(&ns[1], &stream, &epoch, base + 2).await;
    let offsets: Vec<u64> = got[..got.len() - 1].iter().map(|f| pub_of(f).1).collect();
    assert_eq!(offsets, vec![base + 3, base + 4, base + 5]);
    assert_eq!(
        history_from(&ns[0], &stream, &epoch, base + 1)
            .await
            .last()
            .unwrap()["type"],
        "reject_history"
    );
}

#[tokio::test]
async fn a_session_of_a_killed_node_is_restored_on_another_without_connect() {
    let broker = BrokerServer::start(Kind::Redis);
    let mut r = redis(&broker).await;
    let rpc_port = common::free_port();
    let mut ns = nodes(
        &broker,
        3,
        &format!("[rpc]\nhost = \"127.0.0.1:{rpc_port}\"\ntimeout_ms = 5000\n"),
    )
    .await;
    let _app = common::ext::rpc_app(rpc_port, &ns[1].url("/_broadcast")).await;
    let id = json!({ "channel": "BenchmarkChannel", "id": 7 }).to_string();

    // A client on node A (the app's Connect and Subscribe run there).
    let mut ws = cable(&ns[0], "").await;
    let welcome = frame(&mut ws).await;
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    let sid = welcome["sid"].as_str().unwrap().to_owned();
    send(&mut ws, json!({ "command": "subscribe", "identifier": id })).await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    wait_keys(&mut r, &format!("{PREFIX}:hist:*:m"), 1).await;
    // The snapshot with its subscription is on the server already.
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let k = keys(&mut r, &format!("{PREFIX}:sess:*")).await;
        let snap: Option<String> = match k.first() {
            Some(k) => redis::cmd("GET").arg(k).query_async(&mut r).await.unwrap(),
            None => None,
        };
        if snap.is_some_and(|s| s.contains("BenchmarkChannel")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no snapshot with the subscription"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (epoch, base) = probe(&ns[1], &mut ws, "all7").await;

    // Node A dies without closing anything; C publishes meanwhile.
    ns[0].child.kill().unwrap();
    ns[0].child.wait().unwrap();
    drop(ws);
    broadcast(&ns[2], "all7", json!({ "n": 2 })).await;

    // Node B restores the session: no RPC call at all, its subscription
    // back, and the history after offset 1.
    let calls = ns[1].metric("herald_rpc_calls_total").await;
    let mut back = cable(&ns[1], &format!("?sid={sid}")).await;
    let welcome = frame(&mut back).await;
    assert_eq!(welcome["restored"], true, "{welcome}");
    assert_eq!(welcome["restored_ids"], json!([id]));
    send(
        &mut back,
        json!({ "command": "history", "identifier": id,
                "history": { "streams": { "all7": { "epoch": epoch, "offset": base } } } }),
    )
    .await;
    let (m, o, e) = pub_of(&frame(&mut back).await);
    assert_eq!((m, o, e), (json!({ "n": 2 }), base + 1, epoch.clone()));
    assert_eq!(frame(&mut back).await["type"], "confirm_history");
    // Live again, through node B.
    let (e, o) = probe(&ns[2], &mut back, "all7").await;
    assert_eq!(e, epoch);
    assert!(o > base + 1);
    assert_eq!(ns[1].metric("herald_rpc_calls_total").await, calls);
    assert_eq!(
        ns[1].metric("herald_cable_sessions_restored_total").await,
        1
    );
    // A snapshot restores once: the same sid on node C connects anew.
    let mut again = cable(&ns[2], &format!("?sid={sid}")).await;
    let welcome = frame(&mut again).await;
    assert_eq!(welcome["type"], "welcome");
    assert!(welcome.get("restored").is_none(), "{welcome}");
}

#[tokio::test]
async fn without_the_server_history_is_rejected_and_publications_go_on() {
    let mut broker = BrokerServer::start(Kind::Redis);
    let mut r = redis(&broker).await;
    let ns = nodes(&broker, 1, "[rpc]\npublic_streams = true\n").await;
    let node = &ns[0];
    let mut ws = cable(node, "").await;
    assert_eq!(frame(&mut ws).await["type"], "welcome");
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": ident("s") }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    wait_keys(&mut r, &format!("{PREFIX}:hist:*:m"), 1).await;
    broadcast(node, "s", json!({ "n": 1 })).await;
    let (_, o, epoch) = pub_of(&frame(&mut ws).await);
    assert_eq!(o, 1);

    broker.kill();
    // Delivered on this node without a position; the client stays.
    broadcast(node, "s", json!({ "n": 2 })).await;
    let f = frame(&mut ws).await;
    assert_eq!(f["message"], json!({ "n": 2 }));
    assert!(f.get("offset").is_none(), "{f}");
    send(
        &mut ws,
        json!({ "command": "history", "identifier": ident("s"),
                "history": { "streams": { "s": { "epoch": epoch, "offset": 0 } } } }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "reject_history");
    let log = node.log();
    assert!(
        log.matches("did not answer").count() <= 1,
        "logged once per interval:\n{log}"
    );

    // Back (empty, as after a restart): the stream is marked again by the
    // next subscriber, in a new epoch.
    broker.restart();
    let mut r = redis(&broker).await;
    let mut w = follower(node, &mut r, "s").await;
    broadcast(node, "s", json!({ "n": 3 })).await;
    let f = frame(&mut w).await;
    let (m, o, e) = pub_of(&f);
    assert_eq!((m, o), (json!({ "n": 3 }), 1));
    assert_ne!(e, epoch);
}

fn anycable_message(stream: &str, data: Value) -> String {
    json!({ "stream": stream, "data": data.to_string() }).to_string()
}

/// AnyCable's `redisx` broadcasts (one node reads each entry) are appended
/// to the shared history like `/_broadcast` ones: positions, and recovery
/// on another node.
#[tokio::test]
async fn redisx_broadcasts_get_positions_and_are_recovered_elsewhere() {
    let broker = BrokerServer::start(Kind::Redis);
    let mut r = redis(&broker).await;
    let ns = nodes(
        &broker,
        2,
        "[rpc]\npublic_streams = true\nbroadcast_adapter = \"redisx\"\n",
    )
    .await;
    let mut ws = follower(&ns[0], &mut r, "rx").await;
    // The consumer group starts at the stream's end once a node reads:
    // add probes until one arrives.
    let deadline = Instant::now() + TIMEOUT;
    let mut k = 0u64;
    let (epoch, first) = loop {
        assert!(Instant::now() < deadline, "the stream was never read");
        k += 1;
        let _: String = redis::cmd("XADD")
            .arg("__anycable__")
            .arg("*")
            .arg("payload")
            .arg(anycable_message("rx", json!({ "probe": k })))
            .query_async(&mut r)
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_millis(200), frame(&mut ws)).await;
        if let Ok(f) = got {
            let (_, o, e) = pub_of(&f);
            break (e, o);
        }
    };
    for n in 1..=3 {
        let _: String = redis::cmd("XADD")
            .arg("__anycable__")
            .arg("*")
            .arg("payload")
            .arg(anycable_message("rx", json!({ "n": n })))
            .query_async(&mut r)
            .await
            .unwrap();
    }
    // Each entry is read by one of the two nodes, so entries read at once
    // may be appended in either order; live offsets are consecutive, and
    // the history is what the client saw live, in offset order.
    let mut live = Vec::new();
    let mut last = first;
    while !(1..=3).all(|n| live.contains(&json!({ "n": n }))) {
        let (m, o, e) = pub_of(&frame(&mut ws).await);
        assert_eq!((o, &e), (last + 1, &epoch), "consecutive offsets: {m}");
        last = o;
        live.push(m);
    }
    let got = history_from(&ns[1], "rx", &epoch, first).await;
    assert_eq!(got.last().unwrap()["type"], "confirm_history");
    let msgs: Vec<Value> = got[..got.len() - 1].iter().map(|f| pub_of(f).0).collect();
    assert_eq!(msgs, live);
}

/// AnyCable's `redis` (pub/sub) broadcasts reach every node, so they go out
/// without positions (each node would append each one): said at start.
#[tokio::test]
async fn pubsub_broadcasts_go_out_without_positions_and_the_node_says_so() {
    let broker = BrokerServer::start(Kind::Redis);
    let mut r = redis(&broker).await;
    let ns = nodes(
        &broker,
        2,
        "[rpc]\npublic_streams = true\nbroadcast_adapter = \"redis\"\n",
    )
    .await;
    assert!(
        ns[0].log().contains("without stream positions"),
        "{}",
        ns[0].log()
    );
    let mut ws = follower(&ns[1], &mut r, "ps").await;
    let deadline = Instant::now() + TIMEOUT;
    let f = loop {
        assert!(Instant::now() < deadline, "the channel was never read");
        let _: i64 = redis::cmd("PUBLISH")
            .arg("__anycable__")
            .arg(anycable_message("ps", json!({ "n": 1 })))
            .query_async(&mut r)
            .await
            .unwrap();
        if let Ok(f) = tokio::time::timeout(Duration::from_millis(200), frame(&mut ws)).await {
            break f;
        }
    };
    assert_eq!(f["message"], json!({ "n": 1 }));
    assert!(f.get("offset").is_none(), "{f}");
    // Exactly once on this node: no second copy from the other node.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), frame(&mut ws))
            .await
            .is_err(),
        "a second copy arrived"
    );
}
