//! `actioncable-v1-ext-json` history on a JetStream *cluster*: three routed
//! `nats-server -js` processes (one cluster name, a store each) and three
//! herald nodes, each on a different server. History appended through any
//! server is read alike, same epoch and offsets, from every node.

use crate::common;

use common::ext::{broadcast, cable, frame, ident, send};
use common::{Server, TIMEOUT};
use herald_broker::testing::NatsCluster;
use serde_json::{json, Value};
use std::time::Instant;

async fn subscribed(server: &Server, identifier: &str) -> common::Ws {
    let mut ws = cable(server, "").await;
    let welcome = frame(&mut ws).await;
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": identifier }),
    )
    .await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    ws
}

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
            _ => got.push((f["message"]["n"].clone(), f["offset"].clone())),
        }
    }
}

#[tokio::test]
async fn history_on_a_jetstream_cluster_is_read_alike_from_every_node() {
    let cluster = NatsCluster::start(3, true);
    let mut n = Vec::new();
    for i in 0..3 {
        let top = format!(
            "[broker]\nurl = \"{}\"\nprefix = \"jsc\"\n[rpc]\npublic_streams = true\n",
            cluster.url(i)
        );
        n.push(Server::start_with(&top, "").await);
    }
    let id = ident("s");
    let mut ws = subscribed(&n[1], &id).await;
    // The cluster elects its JetStream leader after the routes form: until
    // then publications go out without a position. Wait (bounded) for the
    // first positioned one.
    let deadline = Instant::now() + TIMEOUT;
    let (epoch, first) = loop {
        broadcast(&n[1], "s", json!({ "n": 0 })).await;
        let f = frame(&mut ws).await;
        if let Some(e) = f["epoch"].as_str() {
            break (e.to_owned(), f["offset"].as_u64().unwrap());
        }
        assert!(Instant::now() < deadline, "no position yet: {f}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    drop(ws);
    for (k, i) in [0usize, 2, 0].iter().enumerate() {
        broadcast(&n[*i], "s", json!({ "n": k + 1 })).await;
    }
    let want: Vec<(Value, Value)> = (1..=3)
        .map(|k| (json!(k), json!(first + k as u64)))
        .collect();
    for (i, node) in n.iter().enumerate() {
        let mut ws = subscribed(node, &id).await;
        let (got, end) = history(&mut ws, &id, "s", &epoch, first).await;
        assert_eq!(
            (got, end.as_str()),
            (want.clone(), "confirm_history"),
            "node {i}"
        );
    }
}

/// `broker.jetstream_replicas = 3`: the history stream and the sessions
/// bucket are kept on all three servers, so killing the server that leads
/// the history stream loses none of it (with one replica, the stream lives
/// on one server and goes with it).
#[tokio::test]
async fn three_replicas_keep_history_when_its_leader_dies() {
    let mut cluster = NatsCluster::start(3, true);
    let mut n = Vec::new();
    for i in 0..3 {
        let top = format!(
            "[broker]\nurl = \"{}\"\nprefix = \"rep\"\njetstream_replicas = 3\n[rpc]\npublic_streams = true\n",
            cluster.url(i)
        );
        n.push(Server::start_with(&top, "").await);
    }
    let id = ident("r");
    let mut ws = subscribed(&n[0], &id).await;
    let deadline = Instant::now() + TIMEOUT;
    let (epoch, first) = loop {
        broadcast(&n[0], "r", json!({ "n": 0 })).await;
        let f = frame(&mut ws).await;
        if let Some(e) = f["epoch"].as_str() {
            break (e.to_owned(), f["offset"].as_u64().unwrap());
        }
        assert!(Instant::now() < deadline, "no position yet: {f}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    for k in 1..=5 {
        broadcast(&n[k % 3], "r", json!({ "n": k })).await;
        assert_eq!(frame(&mut ws).await["message"]["n"], k, "live delivery");
    }
    drop(ws);
    let (leader, copies) = cluster
        .stream_leader("rep_history")
        .expect("history stream");
    assert_eq!(copies, 3, "history stream copies");
    // The sessions bucket is made on the first snapshot write.
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match cluster.stream_leader("KV_rep_sessions") {
            Some((_, c)) => break assert_eq!(c, 3, "sessions bucket copies"),
            None => assert!(Instant::now() < deadline, "no sessions bucket"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    cluster.kill(leader);
    let reader = &n[(leader + 1) % 3];
    let want: Vec<(Value, Value)> = (1..=5)
        .map(|k| (json!(k), json!(first + k as u64)))
        .collect();
    // The survivors elect a new leader for the stream first (a few
    // seconds at most); until then a read may be refused.
    let deadline = Instant::now() + 2 * TIMEOUT;
    loop {
        let mut ws = subscribed(reader, &id).await;
        let (got, end) = history(&mut ws, &id, "r", &epoch, first).await;
        if end == "confirm_history" {
            assert_eq!(got, want, "history after the leader died");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "history still refused after the leader (n{leader}) died"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}
