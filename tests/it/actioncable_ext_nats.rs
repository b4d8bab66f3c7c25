//! `actioncable-v1-ext-json` on the NATS engine with JetStream:
//! three real `herald serve` nodes on a real `nats-server -js`. History
//! appended on any node is read from any node with the same positions; a
//! session written by a node that is then SIGKILLed restores on another
//! without a new `Connect`; a server without JetStream is named at start
//! (per-node fallback); a JetStream that goes away costs positions and
//! history answers, never the connection.

use crate::common;

use common::ext::{broadcast, cable, frame, ident, send};

use base64::Engine as _;
use common::{free_port, Server, TIMEOUT};
use herald_broker::testing::{BrokerServer, Kind};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn prefix(name: &str) -> String {
    format!("t-{}-{name}", std::process::id())
}

/// `n` nodes on `broker` under `prefix`, with `extra` TOML.
async fn nodes(broker: &BrokerServer, prefix: &str, extra: &str, n: usize) -> Vec<Server> {
    nodes_ttl(broker, prefix, extra, n, "").await
}

/// [`nodes`] with `ttl` TOML in `[broker]` (`"ttl = 2\n"`: a killed node
/// is declared gone within about 3 s).
async fn nodes_ttl(
    broker: &BrokerServer,
    prefix: &str,
    extra: &str,
    n: usize,
    ttl: &str,
) -> Vec<Server> {
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"{prefix}\"\n{ttl}[rpc]\n{extra}\n",
        broker.url()
    );
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(Server::start_with(&top, "").await);
    }
    v
}

/// A subscribed ext client on `server`: (socket, sid, identifier).
async fn subscribed(server: &Server, identifier: &str) -> (common::Ws, String) {
    let mut ws = cable(server, "").await;
    let welcome = frame(&mut ws).await;
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    let sid = welcome["sid"].as_str().unwrap().to_owned();
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": identifier }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    (ws, sid)
}

/// Ask for `stream`'s history after (epoch, offset): the entries' (n,
/// offset) and the closing frame's type.
async fn history(
    ws: &mut common::Ws,
    identifier: &str,
    stream: &str,
    epoch: &str,
    offset: u64,
) -> (Vec<(Value, Value)>, String) {
    send(
        ws,
        json!({ "command": "history", "identifier": identifier,
            "history": { "streams": { stream: { "epoch": epoch, "offset": offset } } } }),
    )
    .await;
    let mut got = Vec::new();
    loop {
        let f = frame(ws).await;
        match f["type"].as_str() {
            Some(t @ ("confirm_history" | "reject_history")) => return (got, t.to_owned()),
            _ => {
                assert_eq!(f["epoch"], json!(epoch), "{f}");
                assert_eq!(f["stream_id"], json!(stream), "{f}");
                got.push((f["message"]["n"].clone(), f["offset"].clone()));
            }
        }
    }
}

#[tokio::test]
async fn history_appended_on_any_node_is_read_alike_from_every_node() {
    let broker = BrokerServer::start_jetstream();
    let n = nodes(&broker, &prefix("hist"), "public_streams = true", 3).await;
    let id = ident("s");
    let (mut ws, _) = subscribed(&n[1], &id).await;
    // On its own node the client gets it live: the first position.
    broadcast(&n[1], "s", json!({ "n": 1 })).await;
    let first = frame(&mut ws).await;
    assert_eq!(
        (first["message"]["n"].clone(), first["offset"].clone()),
        (json!(1), json!(1)),
        "{first}"
    );
    let epoch = first["epoch"].as_str().unwrap().to_owned();
    drop(ws);
    // Published while the client is away, on the two other nodes (one
    // of them has no subscriber of the stream at all).
    broadcast(&n[0], "s", json!({ "n": 2 })).await;
    broadcast(&n[2], "s", json!({ "n": 3 })).await;
    broadcast(&n[0], "s", json!({ "n": 4 })).await;
    let want = vec![
        (json!(2), json!(2)),
        (json!(3), json!(3)),
        (json!(4), json!(4)),
    ];
    for (i, node) in n.iter().enumerate() {
        let (mut ws, _) = subscribed(node, &id).await;
        let (got, end) = history(&mut ws, &id, "s", &epoch, 1).await;
        assert_eq!(
            (got, end.as_str()),
            (want.clone(), "confirm_history"),
            "node {i}"
        );
        // An offset ahead and a foreign epoch are refused; the client stays.
        let (_, end) = history(&mut ws, &id, "s", &epoch, 9).await;
        assert_eq!(end, "reject_history", "node {i}");
        let (_, end) = history(&mut ws, &id, "s", "forged", 0).await;
        assert_eq!(end, "reject_history", "node {i}");
    }
    // Live publications carry the next offset whichever node publishes.
    let (mut ws, _) = subscribed(&n[2], &id).await;
    broadcast(&n[2], "s", json!({ "n": 5 })).await;
    let f = frame(&mut ws).await;
    assert_eq!(
        (f["offset"].clone(), f["epoch"].clone()),
        (json!(5), json!(epoch)),
        "{f}"
    );
    // A long stream name (hashed into the subject) works like any other.
    let long = "x/.*> ".repeat(150);
    let lid = ident(&long);
    let (mut ws, _) = subscribed(&n[0], &lid).await;
    broadcast(&n[0], &long, json!({ "n": 1 })).await;
    let f = frame(&mut ws).await;
    assert_eq!(f["offset"], 1, "{f}");
    let lepoch = f["epoch"].as_str().unwrap().to_owned();
    broadcast(&n[1], &long, json!({ "n": 2 })).await;
    let (mut ws, _) = subscribed(&n[2], &lid).await;
    let (got, end) = history(&mut ws, &lid, &long, &lepoch, 0).await;
    assert_eq!(end, "confirm_history");
    assert_eq!(got, vec![(json!(1), json!(1)), (json!(2), json!(2))]);
}

#[tokio::test]
async fn a_session_of_a_killed_node_restores_on_another_without_connect() {
    let broker = BrokerServer::start_jetstream();
    let rpc_port = free_port();
    let pre = prefix("sess");
    // Its session restores once the others declared it gone.
    let mut n = nodes_ttl(
        &broker,
        &pre,
        &format!("host = \"127.0.0.1:{rpc_port}\"\ntimeout_ms = 5000"),
        3,
        "ttl = 2\n",
    )
    .await;
    let _app = common::ext::rpc_app(rpc_port, &n[0].url("/_broadcast")).await;
    let id = json!({ "channel": "BenchmarkChannel" }).to_string();
    let (mut ws, sid) = subscribed(&n[0], &id).await;
    broadcast(&n[0], "all", json!({ "n": 1 })).await;
    let first = frame(&mut ws).await;
    assert_eq!(first["offset"], 1, "{first}");
    let epoch = first["epoch"].as_str().unwrap().to_owned();
    // The node writes the snapshot as the session changes: wait until the
    // bucket holds it with the subscription, then kill the node.
    let js = async_nats::jetstream::new(async_nats::connect(broker.url()).await.unwrap());
    let key = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&sid);
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let kv = js.get_key_value(format!("{pre}_sessions")).await;
        if let Ok(kv) = kv {
            let got = kv.get(&key).await;
            if let Ok(Some(v)) = got {
                if String::from_utf8_lossy(&v).contains("BenchmarkChannel") {
                    break;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "the snapshot never reached the bucket"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    n[0].child.kill().unwrap();
    n[0].child.wait().unwrap();
    broadcast(&n[2], "all", json!({ "n": 2 })).await;
    assert_eq!(n[1].metric("herald_rpc_calls_total").await, 0);
    let mut back = cable(&n[1], &format!("?sid={sid}")).await;
    let welcome = frame(&mut back).await;
    assert_eq!(welcome["restored"], true, "{welcome}");
    assert_eq!(welcome["restored_ids"], json!([id]), "{welcome}");
    let (got, end) = history(&mut back, &id, "all", &epoch, 1).await;
    assert_eq!(
        (got, end.as_str()),
        (vec![(json!(2), json!(2))], "confirm_history")
    );
    // Restored without asking the app.
    assert_eq!(n[1].metric("herald_rpc_calls_total").await, 0);
    assert_eq!(n[1].metric("herald_cable_sessions_restored_total").await, 1);
    // Once: the same sid on the third node connects anew (through the app).
    let mut again = cable(&n[2], &format!("?sid={sid}")).await;
    let welcome = frame(&mut again).await;
    assert_eq!(welcome["type"], "welcome");
    assert!(welcome.get("restored").is_none(), "{welcome}");
}

#[tokio::test]
async fn without_jetstream_the_node_says_so_and_keeps_history_per_node() {
    let broker = BrokerServer::start(Kind::Nats);
    let n = nodes(&broker, &prefix("nojs"), "public_streams = true", 1).await;
    let (mut ws, _) = subscribed(&n[0], &ident("s")).await;
    broadcast(&n[0], "s", json!({ "n": 1 })).await;
    let f = frame(&mut ws).await;
    assert_eq!(
        f["offset"], 1,
        "per-node history still gives positions: {f}"
    );
    let deadline = Instant::now() + TIMEOUT;
    while !n[0].log().contains("run nats-server with -js") {
        assert!(Instant::now() < deadline, "no warning:\n{}", n[0].log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(n[0].log().matches("run nats-server with -js").count(), 1);
}

#[tokio::test]
async fn a_lost_jetstream_costs_positions_and_answers_not_the_connection() {
    let mut broker = BrokerServer::start_jetstream();
    let n = nodes(&broker, &prefix("lost"), "public_streams = true", 1).await;
    let id = ident("s");
    let (mut ws, _) = subscribed(&n[0], &id).await;
    broadcast(&n[0], "s", json!({ "n": 1 })).await;
    let f = frame(&mut ws).await;
    assert_eq!(f["offset"], 1, "{f}");
    let epoch = f["epoch"].as_str().unwrap().to_owned();
    broker.kill();
    let started = Instant::now();
    // Published without a position, delivered live all the same.
    broadcast(&n[0], "s", json!({ "n": 2 })).await;
    let f = frame(&mut ws).await;
    assert_eq!(f["message"]["n"], 2, "{f}");
    assert!(f.get("offset").is_none(), "{f}");
    let (_, end) = history(&mut ws, &id, "s", &epoch, 0).await;
    assert_eq!(end, "reject_history");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "calls are bounded"
    );
    // Back: the history the server kept (file storage) goes on in the
    // same epoch, and answers again.
    broker.restart();
    let deadline = Instant::now() + TIMEOUT;
    let mut k = 2;
    let f = loop {
        k += 1;
        broadcast(&n[0], "s", json!({ "n": k })).await;
        let f = frame(&mut ws).await;
        assert_eq!(f["message"]["n"], k, "{f}");
        if f.get("offset").is_some() {
            break f;
        }
        assert!(Instant::now() < deadline, "positions never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (f["offset"].clone(), f["epoch"].clone()),
        (json!(2), json!(epoch)),
        "{f}"
    );
    let (mut fresh, _) = subscribed(&n[0], &id).await;
    let (got, end) = history(&mut fresh, &id, "s", &epoch, 0).await;
    assert_eq!(end, "confirm_history");
    assert_eq!(got, vec![(json!(1), json!(1)), (json!(k), json!(2))]);
}

/// A reconnect storm's history requests: many clients on every node ask at
/// once for the whole history of the same few streams. Each is answered
/// exactly (confirm_history with every missed entry), none rejected; the
/// nodes share reads of one stream instead of asking JetStream for each.
#[tokio::test]
async fn many_concurrent_history_reads_of_the_same_streams_are_all_confirmed() {
    const STREAMS: usize = 10;
    const KEPT: u64 = 100;
    const PER_NODE: usize = 200;
    let broker = BrokerServer::start_jetstream();
    let n = nodes(
        &broker,
        &prefix("storm"),
        "public_streams = true\nhistory_limit = 100",
        3,
    )
    .await;
    let n = std::sync::Arc::new(n);
    // Each stream's epoch, from a watcher's first live message.
    let mut epochs = Vec::new();
    for s in 0..STREAMS {
        let stream = format!("storm-{s}");
        let (mut ws, _) = subscribed(&n[s % 3], &ident(&stream)).await;
        broadcast(&n[s % 3], &stream, json!({ "n": 1 })).await;
        let f = frame(&mut ws).await;
        assert_eq!(f["offset"], 1, "{f}");
        epochs.push(f["epoch"].as_str().unwrap().to_owned());
    }
    // The rest of each stream's history, published through every node.
    let mut publishers = tokio::task::JoinSet::new();
    for s in 0..STREAMS {
        let n = n.clone();
        publishers.spawn(async move {
            for i in 2..=KEPT {
                let stream = format!("storm-{s}");
                broadcast(&n[i as usize % 3], &stream, json!({ "n": i })).await;
            }
        });
    }
    while let Some(done) = publishers.join_next().await {
        done.unwrap();
    }
    // Every client connected and subscribed, then all ask at once.
    let clients = 3 * PER_NODE;
    let ready = std::sync::Arc::new(tokio::sync::Barrier::new(clients));
    let mut asking = tokio::task::JoinSet::new();
    for c in 0..clients {
        let (n, ready, s) = (n.clone(), ready.clone(), c % STREAMS);
        let (stream, epoch) = (format!("storm-{s}"), epochs[s].clone());
        asking.spawn(async move {
            let id = ident(&stream);
            let (mut ws, _) = subscribed(&n[c % 3], &id).await;
            tokio::time::timeout(TIMEOUT, ready.wait())
                .await
                .expect("every client subscribed in time");
            let after = (c as u64) % (KEPT / 2);
            let (got, end) = history(&mut ws, &id, &stream, &epoch, after).await;
            let offsets: Vec<u64> = got.iter().map(|(_, o)| o.as_u64().unwrap()).collect();
            (end, offsets, after)
        });
    }
    let mut rejected = 0;
    while let Some(done) = asking.join_next().await {
        let (end, offsets, after) = done.unwrap();
        if end == "confirm_history" {
            assert_eq!(offsets, (after + 1..=KEPT).collect::<Vec<_>>());
        } else {
            rejected += 1;
        }
    }
    assert_eq!(rejected, 0, "of {clients} history requests");
    let mut reads = 0;
    for node in n.iter() {
        assert_eq!(
            node.metric("herald_jetstream_history_read_timeouts_total")
                .await,
            0
        );
        reads += node.metric("herald_jetstream_history_reads_total").await;
    }
    assert!(
        reads < clients as u64 / 2,
        "{reads} engine reads for {clients} requests: concurrent reads are shared"
    );
}
