//! AnyCable's `redis` and `nats` broadcast adapters: two real `herald
//! serve` nodes on a real `redis-server` / `nats-server`, an app
//! publishing `{"stream","data"}` to `__anycable__` with the real Redis /
//! NATS client, and an Action Cable client on each node: every message
//! reaches each client exactly once, in order, batches included; both
//! Redis adapters on a real Redis Cluster too. Plus the configuration
//! checks (the adapter must match the broker).

use crate::common;

use common::{Server, Ws, TIMEOUT};
use futures_util::{SinkExt, StreamExt};
use herald_broker::testing::{BrokerServer, Kind, RedisCluster};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const CHANNEL: &str = "__anycable__";

/// The app: publishes raw messages to the broadcast channel.
enum App {
    Redis(redis::aio::MultiplexedConnection),
    Nats(async_nats::Client),
}

impl App {
    async fn connect(broker: &BrokerServer) -> App {
        match broker.kind {
            Kind::Redis => {
                let client = redis::Client::open(broker.url()).unwrap();
                App::Redis(client.get_multiplexed_async_connection().await.unwrap())
            }
            Kind::Nats => App::Nats(async_nats::connect(broker.url()).await.unwrap()),
        }
    }

    async fn publish(&mut self, channel: &str, body: &str) {
        match self {
            App::Redis(c) => {
                let _: i64 = redis::cmd("PUBLISH")
                    .arg(channel)
                    .arg(body)
                    .query_async(c)
                    .await
                    .unwrap();
            }
            App::Nats(c) => {
                c.publish(channel.to_owned(), body.to_owned().into())
                    .await
                    .unwrap();
                c.flush().await.unwrap();
            }
        }
    }

    /// `XADD stream * payload body` (AnyCable's `redisx` format).
    async fn xadd(&mut self, stream: &str, body: &str) {
        let App::Redis(c) = self else {
            panic!("streams are Redis's")
        };
        let _: String = redis::cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("payload")
            .arg(body)
            .query_async(c)
            .await
            .unwrap();
    }
}

async fn cable(server: &Server) -> Ws {
    let mut ws = welcomed(server).await;
    let id = json!({ "channel": "$pubsub", "stream_name": "room" }).to_string();
    let cmd = json!({ "command": "subscribe", "identifier": id }).to_string();
    ws.send(Message::text(cmd)).await.unwrap();
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    ws
}

/// The next frame that is not a ping.
async fn frame(ws: &mut Ws) -> Value {
    loop {
        match common::next(ws).await {
            common::Next::Frame(f) if f["type"] == "ping" => continue,
            common::Next::Frame(f) => return f,
            common::Next::Close(code) => panic!("closed ({code:?})"),
        }
    }
}

/// A frame within `wait`, or none.
async fn frame_within(ws: &mut Ws, wait: Duration) -> Option<Value> {
    let until = Instant::now() + wait;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["type"] != "ping" {
                    return Some(v);
                }
            }
            Ok(Some(Ok(_))) => continue,
            Ok(other) => panic!("connection ended: {other:?}"),
            Err(_) => return None,
        }
    }
}

fn message(stream: &str, data: Value) -> Value {
    json!({ "stream": stream, "data": data.to_string() })
}

async fn nodes(broker: &BrokerServer, adapter: &str) -> Vec<Server> {
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"t-{}\"\n[rpc]\npublic_streams = true\nbroadcast_adapter = \"{adapter}\"\n",
        broker.url(),
        std::process::id()
    );
    vec![
        Server::start_with(&top, "").await,
        Server::start_with(&top, "").await,
    ]
}

/// Each node subscribes to the channel in the background: publish probes
/// until every client has seen one, then drain what is still on its way.
async fn until_subscribed(app: &mut App, clients: &mut [Ws]) {
    let deadline = Instant::now() + TIMEOUT;
    let mut seen = vec![false; clients.len()];
    let mut k = 0;
    while seen.iter().any(|s| !s) {
        assert!(Instant::now() < deadline, "the ingress never delivered");
        k += 1;
        let body = message("room", json!({ "probe": k })).to_string();
        app.publish(CHANNEL, &body).await;
        for (c, s) in clients.iter_mut().zip(seen.iter_mut()) {
            if let Some(f) = frame_within(c, Duration::from_millis(100)).await {
                assert!(f["message"]["probe"].is_number(), "{f}");
                *s = true;
            }
        }
    }
    let end = message("room", json!({ "probe": "end" })).to_string();
    app.publish(CHANNEL, &end).await;
    for c in clients.iter_mut() {
        while frame(c).await["message"]["probe"] != "end" {}
    }
}

async fn every_message_once_on_every_node(kind: Kind) {
    let broker = BrokerServer::start(kind);
    let servers = nodes(&broker, &format!("http,{}", kind.name())).await;
    let mut clients = vec![cable(&servers[0]).await, cable(&servers[1]).await];
    let mut app = App::connect(&broker).await;
    until_subscribed(&mut app, &mut clients).await;

    // Ten single messages, a batch of three (one to another stream), and
    // one through /_broadcast on node 0 (through the cluster broker).
    for n in 0..10 {
        let body = message("room", json!({ "n": n })).to_string();
        app.publish(CHANNEL, &body).await;
    }
    let batch = json!([
        message("room", json!({ "n": 10 })),
        message("elsewhere", json!({ "n": -1 })),
        message("room", json!({ "n": 11 })),
    ]);
    app.publish(CHANNEL, &batch.to_string()).await;
    // Not broadcasts: counted and ignored, nothing else happens.
    app.publish(CHANNEL, "not json").await;
    app.publish(CHANNEL, r#"{"command":"disconnect","payload":{}}"#)
        .await;
    app.publish(CHANNEL, &message("", json!(1)).to_string())
        .await;
    for (i, c) in clients.iter_mut().enumerate() {
        let mut got = Vec::new();
        while got.len() < 12 {
            let f = frame(c).await;
            got.push(f["message"]["n"].as_i64().unwrap_or_else(|| panic!("{f}")));
        }
        assert_eq!(got, (0..12).collect::<Vec<_>>(), "client on node {i}");
    }
    let last = json!({ "stream": "room", "data": json!({ "n": 12 }).to_string() });
    let resp = reqwest::Client::new()
        .post(servers[0].url("/_broadcast"))
        .body(last.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    for (i, c) in clients.iter_mut().enumerate() {
        assert_eq!(frame(c).await["message"]["n"], 12, "client on node {i}");
        // Nothing more: no copy of anything from the other node.
        assert_eq!(
            frame_within(c, Duration::from_millis(300)).await,
            None,
            "client on node {i}"
        );
    }
    for s in &servers {
        let deadline = Instant::now() + TIMEOUT;
        while s.metric("herald_broadcast_errors_total").await < 3 {
            assert!(Instant::now() < deadline, "errors not counted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

both!(every_message_once_on_every_node);

/// AnyCable's `redisx`: the app adds entries to the `__anycable__` stream;
/// each entry is read by one node (consumer group `bx`), which publishes it
/// to the cluster, so the client on each node gets every message once, in
/// order; acknowledged entries are deleted from the stream.
#[tokio::test]
async fn redis_stream_entries_reach_every_node_once() {
    let broker = BrokerServer::start(Kind::Redis);
    let servers = nodes(&broker, "redisx").await;
    let mut clients = [cable(&servers[0]).await, cable(&servers[1]).await];
    let mut app = App::connect(&broker).await;
    // The group is created at the stream's end when a node starts reading:
    // add probes until both clients have one.
    let deadline = Instant::now() + TIMEOUT;
    let mut seen = [false, false];
    let mut k = 0;
    while !(seen[0] && seen[1]) {
        assert!(Instant::now() < deadline, "the stream was never read");
        k += 1;
        let body = message("room", json!({ "probe": k })).to_string();
        app.xadd(CHANNEL, &body).await;
        for (c, s) in clients.iter_mut().zip(seen.iter_mut()) {
            while let Some(f) = frame_within(c, Duration::from_millis(100)).await {
                assert!(f["message"]["probe"].is_number(), "{f}");
                *s = true;
            }
        }
    }
    let end = message("room", json!({ "probe": "end" })).to_string();
    app.xadd(CHANNEL, &end).await;
    for c in clients.iter_mut() {
        while frame(c).await["message"]["probe"] != "end" {}
    }
    for n in 0..10 {
        let body = message("room", json!({ "n": n })).to_string();
        app.xadd(CHANNEL, &body).await;
    }
    let batch = json!([
        message("room", json!({ "n": 10 })),
        message("room", json!({ "n": 11 }))
    ]);
    app.xadd(CHANNEL, &batch.to_string()).await;
    for (i, c) in clients.iter_mut().enumerate() {
        let mut got = Vec::new();
        while got.len() < 12 {
            let f = frame(c).await;
            got.push(f["message"]["n"].as_i64().unwrap_or_else(|| panic!("{f}")));
        }
        // One node reads an entry, the next may be read by the other: the
        // two nodes' publications may interleave, but none is repeated.
        got.sort();
        assert_eq!(got, (0..12).collect::<Vec<_>>(), "client on node {i}");
        assert_eq!(
            frame_within(c, Duration::from_millis(300)).await,
            None,
            "client on node {i}"
        );
    }
    // Read entries are acknowledged and deleted.
    let App::Redis(c) = &mut app else {
        unreachable!()
    };
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let len: u64 = redis::cmd("XLEN")
            .arg(CHANNEL)
            .query_async(c)
            .await
            .unwrap();
        if len == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{len} entries left in the stream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `redisx` entries the engine refuses (its outbox full: `broker.outbox =
/// 2`, entries read a hundred at a time and published back to back) stay
/// pending in the stream and are read again: every one reaches the client
/// on each node once, and refusals did happen.
#[tokio::test]
async fn redis_stream_entries_refused_by_a_full_outbox_are_read_again() {
    let broker = BrokerServer::start(Kind::Redis);
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"full-{}\"\noutbox = 2\n[rpc]\npublic_streams = true\nbroadcast_adapter = \"redisx\"\n",
        broker.url(),
        std::process::id()
    );
    let servers = [
        Server::start_with(&top, "").await,
        Server::start_with(&top, "").await,
    ];
    let mut clients = [cable(&servers[0]).await, cable(&servers[1]).await];
    let mut app = App::connect(&broker).await;
    // Probes until both clients have one (the group exists, both read).
    let deadline = Instant::now() + TIMEOUT;
    let mut seen = [false, false];
    let mut k = 0;
    while !(seen[0] && seen[1]) {
        assert!(Instant::now() < deadline, "the stream was never read");
        k += 1;
        let body = message("room", json!({ "probe": k })).to_string();
        app.xadd(CHANNEL, &body).await;
        for (c, s) in clients.iter_mut().zip(seen.iter_mut()) {
            while let Some(f) = frame_within(c, Duration::from_millis(100)).await {
                assert!(f["message"]["probe"].is_number(), "{f}");
                *s = true;
            }
        }
    }
    let end = message("room", json!({ "probe": "end" })).to_string();
    app.xadd(CHANNEL, &end).await;
    for c in clients.iter_mut() {
        while frame(c).await["message"]["probe"] != "end" {}
    }
    // 200 entries in one pipeline: a node reads up to 100 at once.
    const N: i64 = 200;
    {
        let App::Redis(c) = &mut app else {
            unreachable!()
        };
        let mut pipe = redis::pipe();
        for n in 0..N {
            let body = message("room", json!({ "n": n })).to_string();
            pipe.cmd("XADD")
                .arg(CHANNEL)
                .arg("*")
                .arg("payload")
                .arg(body)
                .ignore();
        }
        let () = pipe.query_async(c).await.unwrap();
    }
    for (i, c) in clients.iter_mut().enumerate() {
        let mut got = Vec::new();
        while got.len() < N as usize {
            let Some(f) = frame_within(c, TIMEOUT).await else {
                got.sort();
                panic!("client on node {i}: {} of {N}: {got:?}", got.len());
            };
            got.push(f["message"]["n"].as_i64().unwrap_or_else(|| panic!("{f}")));
        }
        got.sort();
        assert_eq!(got, (0..N).collect::<Vec<_>>(), "client on node {i}");
        assert_eq!(
            frame_within(c, Duration::from_millis(300)).await,
            None,
            "client on node {i}"
        );
    }
    let refused = servers[0].metric("herald_broker_refused_total").await
        + servers[1].metric("herald_broker_refused_total").await;
    eprintln!("redisx with outbox = 2: {refused} publications refused and read again");
    assert!(refused > 0, "the outbox never filled: nothing tested");
}

/// Probes (`{"probe": k}`, then `"end"`) sent with `send` until every
/// client has had one, then what is still on its way drained.
async fn probe_until_heard(clients: &mut [Ws], mut send: impl FnMut(usize, &str)) {
    let deadline = Instant::now() + TIMEOUT;
    let mut seen = vec![false; clients.len()];
    let mut k = 0;
    while seen.iter().any(|s| !s) {
        assert!(Instant::now() < deadline, "the ingress never delivered");
        k += 1;
        send(k, &message("room", json!({ "probe": k })).to_string());
        for (c, s) in clients.iter_mut().zip(seen.iter_mut()) {
            while let Some(f) = frame_within(c, Duration::from_millis(100)).await {
                assert!(f["message"]["probe"].is_number(), "{f}");
                *s = true;
            }
        }
    }
    send(
        k + 1,
        &message("room", json!({ "probe": "end" })).to_string(),
    );
    for c in clients.iter_mut() {
        while frame(c).await["message"]["probe"] != "end" {}
    }
}

/// Each client gets `n` messages `{"n": 0..n}` (in any order: they come
/// through different nodes), and nothing more.
async fn each_once(clients: &mut [Ws], n: i64) {
    for (i, c) in clients.iter_mut().enumerate() {
        let mut got = Vec::new();
        while got.len() < n as usize {
            let f = frame(c).await;
            got.push(f["message"]["n"].as_i64().unwrap_or_else(|| panic!("{f}")));
        }
        got.sort();
        assert_eq!(got, (0..n).collect::<Vec<_>>(), "client on node {i}");
        assert_eq!(
            frame_within(c, Duration::from_millis(300)).await,
            None,
            "client on node {i}"
        );
    }
}

/// Both Redis adapters on a Redis Cluster (`redis-cluster://`): the app
/// `PUBLISH`es through every node of the cluster in turn, replicas
/// included (the cluster bus forwards a plain `PUBLISH` to every node, so
/// each node's ingress hears it whichever node it subscribed on), and
/// `XADD`s to the master of the stream's slot (each entry read by one
/// node, published to both); each Action Cable client gets every message
/// once, and the read entries are deleted.
#[tokio::test]
async fn both_redis_adapters_work_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"cx-{}\"\n[rpc]\npublic_streams = true\nbroadcast_adapter = \"redis,redisx\"\n",
        cluster.url(),
        std::process::id()
    );
    let servers = [
        Server::start_with(&top, "").await,
        Server::start_with(&top, "").await,
    ];
    let mut clients = [cable(&servers[0]).await, cable(&servers[1]).await];
    let all = cluster.running();
    assert_eq!(all.len(), 6);
    let publish = |k: usize, body: &str| {
        let port = all[k % all.len()];
        let out = cluster.cli(port, &["publish", CHANNEL, body]);
        assert!(
            out.trim().parse::<u64>().is_ok(),
            "PUBLISH on {port}: {out:?}"
        );
    };
    probe_until_heard(&mut clients, publish).await;
    for n in 0..12 {
        publish(n, &message("room", json!({ "n": n })).to_string());
    }
    each_once(&mut clients, 12).await;

    // The stream: one key, on the master of its slot.
    let slot: u16 = cluster
        .cli(all[0], &["cluster", "keyslot", CHANNEL])
        .trim()
        .parse()
        .unwrap();
    let master = cluster.master_of_slot(slot).unwrap();
    let xadd = |_: usize, body: &str| {
        let out = cluster.cli(master, &["xadd", CHANNEL, "*", "payload", body]);
        assert!(out.contains('-'), "XADD on {master}: {out:?}");
    };
    probe_until_heard(&mut clients, xadd).await;
    for n in 0..12 {
        xadd(0, &message("room", json!({ "n": n })).to_string());
    }
    each_once(&mut clients, 12).await;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let len = cluster.cli(master, &["xlen", CHANNEL]);
        if len.trim() == "0" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{len} entries left in the stream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The adapter reads the broker's server: it must be the matching kind.
#[test]
fn the_adapter_must_match_the_broker() {
    for (broker, adapter) in [
        ("local", "redis"),
        ("nats://127.0.0.1:4222", "redis"),
        ("redis://127.0.0.1:6379", "nats"),
        ("nats://127.0.0.1:4222", "redisx"),
        ("redis-cluster://127.0.0.1:7000", "nats"),
    ] {
        let dir = std::env::temp_dir().join(format!(
            "herald-adapter-{}-{adapter}-{}",
            std::process::id(),
            broker.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("herald.toml");
        std::fs::write(
            &config,
            format!("[broker]\nurl = \"{broker}\"\n[rpc]\nbroadcast_adapter = \"{adapter}\"\n"),
        )
        .unwrap();
        let (_hold, port) = common::occupied_port();
        let out = common::output_within(
            common::herald_command()
                .args(["serve", "--port", &port.to_string(), "--config"])
                .arg(&config)
                .env_remove("HERALD_CONFIG"),
            TIMEOUT,
        );
        assert_eq!(out.status.code(), Some(2), "{broker} {adapter}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("rpc.broadcast_adapter"), "{err}");
    }
    let (_hold, port) = common::occupied_port();
    let out = common::output_within(
        common::herald_command()
            .args([
                "serve",
                "--port",
                &port.to_string(),
                "--broadcast-adapter",
                "kafka",
            ])
            .env_remove("HERALD_CONFIG"),
        TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rpc.broadcast_adapter"), "{err}");
}

/// An Action Cable socket past its welcome.
async fn welcomed(server: &Server) -> Ws {
    let mut req = format!("ws://127.0.0.1:{}/cable", server.port)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        "actioncable-v1-json".parse().unwrap(),
    );
    let (mut ws, _) = tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(req))
        .await
        .expect("connect timed out")
        .expect("connect");
    assert_eq!(frame(&mut ws).await["type"], "welcome");
    ws
}

async fn subscribe_room(ws: &mut Ws) {
    let id = json!({ "channel": "$pubsub", "stream_name": "room" }).to_string();
    let cmd = json!({ "command": "subscribe", "identifier": id }).to_string();
    ws.send(Message::text(cmd)).await.unwrap();
}

// A confirmation is true, on Action Cable: on a node whose broker is not up
// yet, `confirm_subscription` waits until the broker holds the stream's
// interest (then every broadcast through another node arrives), and after
// `broker.confirm_timeout` the client gets Action Cable's one retryable
// answer, `disconnect` with `reconnect: true` (close 1013), never a
// confirmation (`reject_subscription` would be final).
both!(confirmation_waits_for_the_broker);
async fn confirmation_waits_for_the_broker(kind: Kind) {
    let mut broker = BrokerServer::start(kind);
    broker.kill();
    let url = broker.url();
    let top = |confirm: u64| {
        format!(
            "[broker]\nurl = \"{}\"\nprefix = \"ac-confirm\"\nconfirm_timeout = {confirm}\n[rpc]\npublic_streams = true\n",
            url
        )
    };
    // The bound.
    let gives_up = Server::start_serving(&top(1), "").await;
    let mut ws = welcomed(&gives_up).await;
    subscribe_room(&mut ws).await;
    let f = frame(&mut ws).await;
    assert_eq!(f["type"], "disconnect", "{f}");
    assert_eq!(f["reason"], "broker_unavailable", "{f}");
    assert_eq!(f["reconnect"], true, "{f}");
    match common::next(&mut ws).await {
        common::Next::Close(code) => assert_eq!(code, Some(1013)),
        common::Next::Frame(f) => panic!("expected the close, got {f}"),
    }

    // Held until the broker holds the interest.
    let waits = Server::start_serving(&top(30), "").await;
    let mut ws = welcomed(&waits).await;
    subscribe_room(&mut ws).await;
    let deadline = Instant::now() + TIMEOUT;
    while common::metric_in(
        &waits.scrape().await,
        "herald_confirmations_held_total",
        &[],
    )
    .unwrap_or(0)
        < 1
    {
        assert!(Instant::now() < deadline, "the confirmation never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Some(f) = frame_within(&mut ws, Duration::from_millis(300)).await {
        panic!("answered while the broker was away: {f}");
    }
    broker.restart();
    let first = Server::start_with(&top(30), "").await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    for i in 0..20 {
        let body = message("room", json!({ "i": i })).to_string();
        let resp = reqwest::Client::new()
            .post(first.url("/_broadcast"))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
    }
    for i in 0..20 {
        let f = frame(&mut ws).await;
        assert_eq!(f["message"]["i"], i, "{f}");
    }
}
