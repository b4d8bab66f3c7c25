//! Three real `herald serve` nodes on a real Redis Cluster (six
//! `redis-server --cluster-enabled yes`: three masters, three replicas,
//! made by `redis-cli --cluster create`; [`RedisCluster`]): publications
//! cross nodes exactly once over sharded pub/sub (the channel is an
//! `SSUBSCRIBE`d shard channel on its slot's master only), presence and
//! channel figures agree on every node and a SIGKILLed node's members
//! leave within the TTL; the extended Action Cable protocol restores a
//! killed node's session on another with its history (keys on the
//! cluster's slots); a master SIGKILLed under a publish loop is replaced by
//! its replica and the nodes follow without a crash, every acknowledged
//! publication reaching every client once; a master that stops answering
//! (SIGSTOP), of the cluster-wide slot or of channels only, is noticed by
//! the broker canary (a copy through every master); a slot moved to another
//! master under subscribers is followed; replicas alone seed the
//! topology; AppSync's trailing wildcards match across nodes, once each.
//! (tests/it/webhooks.rs runs its cluster webhook tests on a Redis Cluster
//! too: occupancy and members reported once, a killed node's once.)
//!
//! Longer than 800 lines on purpose: the failover tests must share one
//! lock ([`FAILOVERS`], one failover at a time on a small machine), which
//! only holds within one test binary, and they share the helpers here.

use crate::common;

use common::ext::{broadcast, cable, frame, send};
use common::{users_everywhere, wait_ready, Client, Server, Ws, TIMEOUT};
use herald_broker::testing::RedisCluster;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Failovers take a few seconds (node timeout 1 s, then an election).
const FAILOVER: Duration = Duration::from_secs(30);

/// One failover at a time in this file: each runs six servers whose
/// failure detection and election are timed (node timeout 1 s), and on a
/// small machine several at once, beside the other tests, starve them.
static FAILOVERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn nodes(cluster: &RedisCluster, n: usize, prefix: &str, extra: &str) -> Vec<Server> {
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"{prefix}\"\n{extra}",
        cluster.url()
    );
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(Server::start_with(&top, "").await);
    }
    for s in &out {
        wait_ready(s, 200, TIMEOUT).await;
    }
    out
}

/// The masters' ports whose `PUBSUB SHARDCHANNELS` list a shard channel
/// whose name ends with `suffix`.
fn shard_owners(cluster: &RedisCluster, suffix: &str) -> Vec<u16> {
    cluster
        .nodes()
        .into_iter()
        .filter(|n| n.master && !n.failed)
        .filter(|n| {
            cluster
                .cli(n.port, &["pubsub", "shardchannels"])
                .lines()
                .any(|l| l.ends_with(suffix))
        })
        .map(|n| n.port)
        .collect()
}

/// Keys matching `pattern` on every live master.
fn cluster_keys(cluster: &RedisCluster, pattern: &str) -> Vec<String> {
    let mut out = Vec::new();
    for n in cluster
        .nodes()
        .into_iter()
        .filter(|n| n.master && !n.failed)
    {
        out.extend(
            cluster
                .cli(n.port, &["keys", pattern])
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_owned),
        );
    }
    out
}

async fn member_event(c: &mut Client, event: &str) -> Value {
    let f = c.expect(event, Some("presence-room")).await;
    common::data(&f)
}

#[tokio::test]
async fn broadcast_presence_and_figures_across_nodes_over_sharded_pubsub() {
    let cluster = RedisCluster::start();
    let ttl = 2;
    let mut n = nodes(&cluster, 3, "rc", &format!("ttl = {ttl}\n")).await;
    let mut clients = Vec::new();
    for s in &n {
        let mut c = s.client().await;
        c.subscribe("news").await;
        clients.push(c);
    }
    // Each node subscribes on the broker right after its client's
    // subscription; wait until all three are on the shard channel, which
    // exactly one master (its slot's) carries.
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let owners = shard_owners(&cluster, ".news");
        let subs = owners.first().map(|&p| {
            cluster.cli(
                p,
                &["pubsub", "shardnumsub", &channel_on(p, &cluster, ".news")],
            )
        });
        if owners.len() == 1
            && subs
                .as_deref()
                .is_some_and(|s| s.lines().nth(1) == Some("3"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "news on {owners:?}: {subs:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Not classic pub/sub: no node has a PUBLISH channel of Herald's.
    for p in cluster.running() {
        assert_eq!(cluster.cli(p, &["pubsub", "channels", "rc*"]).trim(), "");
    }

    // Every node's publication reaches every client once.
    for (i, s) in n.iter().enumerate() {
        s.trigger("news", "e", &i.to_string()).await;
    }
    for c in &mut clients {
        let mut got: Vec<String> = Vec::new();
        for _ in 0..3 {
            got.push(
                c.expect("e", Some("news")).await["data"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        got.sort();
        assert_eq!(got, ["0", "1", "2"]);
    }
    n[2].trigger("news", "marker", "m").await;
    for c in &mut clients {
        c.expect("marker", Some("news")).await;
    }

    // Presence across nodes; figures agree everywhere.
    let mut obs = n[0].client().await;
    obs.subscribe_presence("presence-room", "obs", json!({}))
        .await;
    let mut doomed = n[2].client().await;
    doomed
        .subscribe_presence("presence-room", "doomed", json!({}))
        .await;
    assert_eq!(
        member_event(&mut obs, "pusher_internal:member_added").await["user_id"],
        "doomed"
    );
    users_everywhere(
        &[&n[0], &n[1], &n[2]],
        "presence-room",
        &["doomed", "obs"],
        TIMEOUT,
    )
    .await;
    for s in &n {
        let (_, list) = s.api("GET", "/apps/test-app/channels", "").await;
        let names: Vec<&String> = list["channels"].as_object().unwrap().keys().collect();
        assert_eq!(names, ["news", "presence-room"], "{list}");
    }

    // A node SIGKILLed: its member leaves everywhere within the TTL, once.
    n[2].child.kill().unwrap();
    let t0 = Instant::now();
    let gone = member_event(&mut obs, "pusher_internal:member_removed").await;
    assert_eq!(gone["user_id"], "doomed");
    assert!(
        t0.elapsed() < Duration::from_secs(ttl) + Duration::from_millis(1500),
        "removed after {:?}",
        t0.elapsed()
    );
    users_everywhere(&[&n[0], &n[1]], "presence-room", &["obs"], TIMEOUT).await;
    n[1].trigger("presence-room", "marker", "m").await;
    obs.expect("marker", Some("presence-room")).await;
    drop(doomed);
    let _ = n.pop();
}

/// The full name of the shard channel ending with `suffix` on `port`.
fn channel_on(port: u16, cluster: &RedisCluster, suffix: &str) -> String {
    cluster
        .cli(port, &["pubsub", "shardchannels"])
        .lines()
        .find(|l| l.ends_with(suffix))
        .unwrap_or_default()
        .to_owned()
}

/// Broadcast probes to `stream` through `node` until `ws` gets one with a
/// position (the stream is reliable and every node subscribed); its
/// (epoch, offset).
async fn probe(node: &Server, ws: &mut Ws, stream: &str) -> (String, u64) {
    let deadline = Instant::now() + TIMEOUT;
    for k in 0.. {
        assert!(Instant::now() < deadline, "no probe of {stream} arrived");
        broadcast(node, stream, json!({ "probe": k })).await;
        if let Ok(f) = tokio::time::timeout(Duration::from_millis(300), frame(ws)).await {
            if let Some(o) = f["offset"].as_u64() {
                return (f["epoch"].as_str().unwrap_or_default().to_owned(), o);
            }
        }
    }
    unreachable!()
}

/// Replicas as the only seeds: the client learns the masters from them,
/// and the nodes stay connected (dropping the seeds' connections is not
/// a lost connection).
#[tokio::test]
async fn replicas_alone_seed_the_topology() {
    let cluster = RedisCluster::start();
    let replicas = cluster.replicas();
    assert_eq!(replicas.len(), 3);
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"rs\"\nttl = 3\n",
        cluster.url_of(&replicas)
    );
    let a = Server::start_with(&top, "").await;
    let b = Server::start_with(&top, "").await;
    for s in [&a, &b] {
        wait_ready(s, 200, TIMEOUT).await;
    }
    let mut ca = a.client().await;
    ca.subscribe("news").await;
    let mut cb = b.client().await;
    cb.subscribe("news").await;
    let deadline = Instant::now() + TIMEOUT;
    for k in 0.. {
        assert!(Instant::now() < deadline, "nothing crossed the nodes");
        a.trigger("news", "p", &k.to_string()).await;
        assert_eq!(ca.expect("p", Some("news")).await["data"], k.to_string());
        if let Ok(f) =
            tokio::time::timeout(Duration::from_millis(300), cb.expect("p", Some("news"))).await
        {
            assert_eq!(f["data"], k.to_string());
            break;
        }
    }
    // Connected once each: no session ended since.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for s in [&a, &b] {
        assert_eq!(
            s.metric("herald_broker_outages_total").await,
            0,
            "{}",
            s.log()
        );
        assert_eq!(wait_ready(s, 200, TIMEOUT).await.as_secs(), 0);
    }
}

#[tokio::test]
async fn a_session_of_a_killed_node_is_restored_on_another_with_its_history() {
    let cluster = RedisCluster::start();
    let rpc_port = common::free_port();
    let mut ns = nodes(
        &cluster,
        3,
        "hx",
        &format!("ttl = 3\n[rpc]\nhost = \"127.0.0.1:{rpc_port}\"\ntimeout_ms = 5000\n"),
    )
    .await;
    let _app = common::ext::rpc_app(rpc_port, &ns[1].url("/_broadcast")).await;
    let id = json!({ "channel": "BenchmarkChannel", "id": 7 }).to_string();

    let mut ws = cable(&ns[0], "").await;
    let welcome = frame(&mut ws).await;
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    let sid = welcome["sid"].as_str().unwrap().to_owned();
    send(&mut ws, json!({ "command": "subscribe", "identifier": id })).await;
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    let (epoch, base) = probe(&ns[1], &mut ws, "all7").await;
    // The history's two keys share a slot (one master holds both).
    let m = cluster_keys(&cluster, "hx:hist:*:m");
    let s = cluster_keys(&cluster, "hx:hist:*:s");
    assert_eq!((m.len(), s.len()), (1, 1), "{m:?} {s:?}");
    let owner = |k: &str| {
        let slot: u16 = cluster
            .cli(cluster.running()[0], &["cluster", "keyslot", k])
            .trim()
            .parse()
            .unwrap();
        cluster.master_of_slot(slot)
    };
    assert_eq!(owner(&m[0]), owner(&s[0]));
    // The snapshot (with the subscription) is on the cluster.
    let deadline = Instant::now() + TIMEOUT;
    while cluster_keys(&cluster, "hx:sess:*").is_empty() {
        assert!(Instant::now() < deadline, "no session snapshot");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Node A dies without closing anything; C publishes meanwhile.
    ns[0].child.kill().unwrap();
    ns[0].child.wait().unwrap();
    drop(ws);
    broadcast(&ns[2], "all7", json!({ "n": 2 })).await;

    // Node B restores the session without an RPC call, with the history.
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
    let f = frame(&mut back).await;
    assert_eq!(
        (&f["message"], f["offset"].as_u64(), f["epoch"].as_str()),
        (&json!({ "n": 2 }), Some(base + 1), Some(epoch.as_str())),
        "{f}"
    );
    assert_eq!(frame(&mut back).await["type"], "confirm_history");
    let (e, o) = probe(&ns[2], &mut back, "all7").await;
    assert_eq!(e, epoch);
    assert!(o > base + 1);
    assert_eq!(ns[1].metric("herald_rpc_calls_total").await, calls);
}

#[tokio::test]
async fn a_master_killed_under_load_is_replaced_and_nothing_is_lost_or_duplicated() {
    let _one = FAILOVERS.lock().await;
    let mut cluster = RedisCluster::start();
    let n = nodes(&cluster, 3, "fo", "ttl = 3\n").await;
    let mut clients = Vec::new();
    for s in &n {
        let mut c = s.client().await;
        c.subscribe("news").await;
        clients.push(c);
    }
    let deadline = Instant::now() + TIMEOUT;
    let victim = loop {
        let owners = shard_owners(&cluster, ".news");
        if let [p] = owners[..] {
            let subs = cluster.cli(
                p,
                &["pubsub", "shardnumsub", &channel_on(p, &cluster, ".news")],
            );
            if subs.lines().nth(1) == Some("3") {
                break p;
            }
        }
        assert!(Instant::now() < deadline, "news not subscribed by 3 nodes");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // A member on node 2, seen from node 0.
    let mut obs = n[0].client().await;
    obs.subscribe_presence("presence-room", "obs", json!({}))
        .await;
    let mut member = n[2].client().await;
    member
        .subscribe_presence("presence-room", "before", json!({}))
        .await;
    users_everywhere(
        &[&n[0], &n[1], &n[2]],
        "presence-room",
        &["before", "obs"],
        TIMEOUT,
    )
    .await;
    assert_eq!(
        member_event(&mut obs, "pusher_internal:member_added").await["user_id"],
        "before"
    );

    // A publish loop on node 0 (every 10 ms), the news channel's master
    // SIGKILLed in the middle of it.
    let stop = std::sync::Arc::new(tokio::sync::Notify::new());
    let publisher = tokio::spawn({
        let url = n[0].url("");
        let stop = stop.clone();
        async move { publish_loop(url, stop).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.kill(victim);
    let killed_at = Instant::now();
    // The nodes notice and are not ready, then ready again on the
    // promoted replica.
    for s in &n[1..] {
        wait_ready(s, 503, TIMEOUT).await;
    }
    for s in &n {
        wait_ready(s, 200, FAILOVER).await;
    }
    let back_after = killed_at.elapsed();
    cluster.wait_ok();
    let new_owner = shard_owners(&cluster, ".news");
    assert!(
        new_owner.len() == 1 && new_owner[0] != victim,
        "{new_owner:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.notify_one();
    let acked = publisher.await.expect("the publish loop failed");
    // Presence is right on every node (nobody removed by the outage), and
    // a member joining after it is seen everywhere, once.
    users_everywhere(
        &[&n[0], &n[1], &n[2]],
        "presence-room",
        &["before", "obs"],
        TIMEOUT,
    )
    .await;
    let mut late = n[1].client().await;
    late.subscribe_presence("presence-room", "late", json!({}))
        .await;
    users_everywhere(
        &[&n[0], &n[1], &n[2]],
        "presence-room",
        &["before", "late", "obs"],
        TIMEOUT,
    )
    .await;
    // The next member event node 0's client sees is "late" joining: no
    // "before" removed or added again by the reconnects.
    let added = member_event(&mut obs, "pusher_internal:member_added").await;
    assert_eq!(added["user_id"], "late", "{added}");
    // Publications after the failover arrive everywhere.
    for (i, s) in n.iter().enumerate() {
        s.trigger("news", "after", &i.to_string()).await;
    }
    // Every acknowledged publication of the loop at every client, once
    // each (docs/cluster.md, "Acknowledged publications across broker
    // outages"), then the three "after"s, once each; an end marker
    // last: anything before it counts.
    let mut report = Vec::new();
    for (i, c) in clients.iter_mut().enumerate() {
        let mut seq: Vec<u64> = Vec::new();
        let mut after: Vec<String> = Vec::new();
        let complete = |seq: &Vec<u64>, after: &Vec<String>| {
            after.len() >= 3 && acked.iter().all(|k| seq.contains(k))
        };
        while !complete(&seq, &after) {
            let Ok(f) = tokio::time::timeout(Duration::from_secs(5), c.recv()).await else {
                break;
            };
            match f["event"].as_str() {
                Some("seq") => seq.push(f["data"].as_str().unwrap().parse().unwrap()),
                Some("after") => after.push(f["data"].as_str().unwrap().to_owned()),
                _ => panic!("client {i}: {f}"),
            }
        }
        report.push((i, seq, after));
    }
    n[0].trigger("news", "end", "m").await;
    for (c, (i, seq, after)) in clients.iter_mut().zip(report.iter_mut()) {
        loop {
            let f = c.recv().await;
            match f["event"].as_str() {
                Some("end") => break,
                Some("seq") => seq.push(f["data"].as_str().unwrap().parse().unwrap()),
                Some("after") => after.push(f["data"].as_str().unwrap().to_owned()),
                _ => panic!("client {i}: {f}"),
            }
        }
    }
    let mut lost = Vec::new();
    for (i, seq, after) in &mut report {
        after.sort();
        assert_eq!(after, &["0", "1", "2"], "client {i}");
        let received = seq.len();
        seq.sort_unstable();
        seq.dedup();
        let twice = received - seq.len();
        let missing = acked
            .iter()
            .filter(|k| seq.binary_search(k).is_err())
            .count();
        lost.push((*i, received, missing, twice));
    }
    eprintln!(
        "failover: nodes ready again {back_after:?} after the SIGKILL; {} acknowledged; \
         (client, received, lost, twice): {lost:?}; recovered on nodes 1, 2: {}, {}",
        acked.len(),
        n[1].counter("herald_broker_recovered_total").await,
        n[2].counter("herald_broker_recovered_total").await,
    );
    assert!(
        lost.iter()
            .all(|(_, _, missing, twice)| *missing == 0 && *twice == 0),
        "acknowledged publications lost or delivered twice: {lost:?}"
    );
}

/// Trigger `seq` events 0, 1, 2, … on `news` through `base`'s HTTP API
/// until `stop`; the numbers answered 2xx (a 503 is a refusal: the
/// outbox is full).
async fn publish_loop(base: String, stop: std::sync::Arc<tokio::sync::Notify>) -> Vec<u64> {
    let http = reqwest::Client::new();
    let mut acked = Vec::new();
    for k in 0u64.. {
        let body = json!({ "name": "seq", "channel": "news", "data": k.to_string() }).to_string();
        let path = "/apps/test-app/events";
        let q = herald_pusher::auth::sign_query(
            common::APP_KEY,
            common::APP_SECRET,
            "POST",
            path,
            body.as_bytes(),
            &[],
        );
        let sent = http
            .post(format!("{base}{path}?{q}"))
            .header("content-type", "application/json")
            .body(body)
            .send();
        // Every request is answered (a node serves while its broker is away).
        let status = tokio::time::timeout(TIMEOUT, sent)
            .await
            .expect("trigger timed out")
            .expect("trigger")
            .status();
        if status.is_success() {
            acked.push(k);
        } else {
            assert_eq!(status, 503, "a refusal is 503");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            _ = stop.notified() => return acked,
        }
    }
    unreachable!()
}

#[tokio::test]
async fn a_master_that_stops_answering_is_noticed_by_the_canary() {
    let _one = FAILOVERS.lock().await;
    let mut cluster = RedisCluster::start();
    let n = nodes(
        &cluster,
        2,
        "cy",
        "ttl = 60\ncanary_interval = 1\ncanary_timeout = 1\n",
    )
    .await;
    // The cluster-wide subjects (and the canary) live on the slot of the
    // hash tag {cy}: freeze its master.
    let slot: u16 = cluster
        .cli(cluster.running()[0], &["cluster", "keyslot", "{cy}"])
        .trim()
        .parse()
        .unwrap();
    let frozen = cluster.master_of_slot(slot).unwrap();
    let failures = n[0].metric("herald_broker_canary_failures_total").await;
    cluster.freeze(frozen, true);
    for s in &n {
        wait_ready(s, 503, TIMEOUT).await;
    }
    assert!(n[0].metric("herald_broker_canary_failures_total").await > failures);
    // Its replica is promoted; the nodes follow it and deliver again.
    for s in &n {
        wait_ready(s, 200, FAILOVER).await;
    }
    cluster.freeze(frozen, false);
    let mut a = n[0].client().await;
    a.subscribe("news").await;
    let mut b = n[1].client().await;
    b.subscribe("news").await;
    let deadline = Instant::now() + TIMEOUT;
    for k in 0.. {
        assert!(Instant::now() < deadline, "nothing crossed the nodes");
        n[0].trigger("news", "p", &k.to_string()).await;
        assert_eq!(a.expect("p", Some("news")).await["data"], k.to_string());
        if let Ok(f) =
            tokio::time::timeout(Duration::from_millis(300), b.expect("p", Some("news"))).await
        {
            assert_eq!(f["data"], k.to_string());
            break;
        }
    }
}

/// An AppSync Events socket on `server`, past `connection_ack`.
async fn appsync_events(server: &Server) -> Ws {
    use base64::Engine;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let header = json!({ "host": "example.com", "x-api-key": APPSYNC_KEY }).to_string();
    let header = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(header);
    let url = format!("ws://127.0.0.1:{}/event/realtime", server.port);
    let mut req = url.into_client_request().unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        format!("aws-appsync-event-ws, header-{header}")
            .parse()
            .unwrap(),
    );
    let (mut ws, _) = tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(req))
        .await
        .expect("connect timed out")
        .expect("connect");
    send(&mut ws, json!({ "type": "connection_init" })).await;
    assert_eq!(appsync_next(&mut ws).await["type"], "connection_ack");
    ws
}

const APPSYNC_KEY: &str = "test-api-key";

/// The next AppSync message that is not a keep-alive.
async fn appsync_next(ws: &mut Ws) -> Value {
    loop {
        match common::next(ws).await {
            common::Next::Frame(f) if f["type"] == "ka" => continue,
            common::Next::Frame(f) => return f,
            common::Next::Close(c) => panic!("closed ({c:?})"),
        }
    }
}

/// Trailing-wildcard subscriptions (no sharded PSUBSCRIBE exists) across
/// nodes: every matching subscription on another node gets each
/// publication once, through the pattern's own shard channel.
#[tokio::test]
async fn appsync_wildcards_match_across_nodes_once_each() {
    let cluster = RedisCluster::start();
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"aw\"\nttl = 3\n",
        cluster.url()
    );
    let app = format!("api_keys = [\"{APPSYNC_KEY}\"]");
    let a = Server::start_with(&top, &app).await;
    let b = Server::start_with(&top, &app).await;
    for s in [&a, &b] {
        wait_ready(s, 200, TIMEOUT).await;
    }
    let mut ws = appsync_events(&b).await;
    for (id, channel) in [("ns", "/ns/*"), ("a", "/ns/a/*"), ("x", "/ns/a/x")] {
        send(
            &mut ws,
            json!({ "type": "subscribe", "id": id, "channel": channel,
                    "authorization": { "host": "example.com", "x-api-key": APPSYNC_KEY } }),
        )
        .await;
        assert_eq!(appsync_next(&mut ws).await["type"], "subscribe_success");
    }
    // Node B's three shard channels (two patterns, one channel) are on
    // the cluster before anything is published.
    let deadline = Instant::now() + TIMEOUT;
    for suffix in [".%.ns.*", ".%.ns.a.*", ".%.ns.a.x"] {
        while shard_owners(&cluster, suffix).len() != 1 {
            assert!(Instant::now() < deadline, "{suffix} not subscribed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let http = reqwest::Client::new();
    for (channel, n) in [
        ("/ns/b", 1),
        ("/ns/a/x/y", 2),
        ("/other/a", 3),
        ("/ns/ab", 4),
        ("/ns/a/x", 5),
    ] {
        let body = json!({ "channel": channel, "events": [n.to_string()] }).to_string();
        let res = http
            .post(a.url("/event"))
            .header("x-api-key", APPSYNC_KEY)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    let want = ["a:2", "a:5", "ns:1", "ns:2", "ns:4", "ns:5", "x:5"];
    let mut got = Vec::new();
    for _ in 0..want.len() {
        let d = appsync_next(&mut ws).await;
        assert_eq!(d["type"], "data", "{d}");
        got.push(format!(
            "{}:{}",
            d["id"].as_str().unwrap(),
            d["event"].as_str().unwrap()
        ));
    }
    got.sort();
    assert_eq!(got, want);
    // Nothing more (no second copy through another shard channel): a
    // marker published now is the next message.
    let body = json!({ "channel": "/ns/a/x", "events": ["\"end\""] }).to_string();
    http.post(a.url("/event"))
        .header("x-api-key", APPSYNC_KEY)
        .body(body)
        .send()
        .await
        .unwrap();
    let mut tail = Vec::new();
    for _ in 0..3 {
        let d = appsync_next(&mut ws).await;
        tail.push(d["event"].as_str().unwrap_or_default().to_owned());
    }
    assert!(tail.iter().all(|e| e.contains("end")), "{tail:?}");
}

/// A slot moved to another master under subscribers (resharding): the
/// server unsubscribes them (`SUNSUBSCRIBE`), the nodes reconnect and
/// subscribe on the new owner, and deliver across nodes again, once.
#[tokio::test]
async fn a_slot_moved_under_its_subscribers_is_followed() {
    let _one = FAILOVERS.lock().await;
    let cluster = RedisCluster::start();
    let n = nodes(&cluster, 2, "mv", "ttl = 3\n").await;
    let mut clients = Vec::new();
    for s in &n {
        let mut c = s.client().await;
        c.subscribe("news").await;
        clients.push(c);
    }
    let deadline = Instant::now() + TIMEOUT;
    let (from, channel) = loop {
        if let [p] = shard_owners(&cluster, ".news")[..] {
            let channel = channel_on(p, &cluster, ".news");
            if cluster
                .cli(p, &["pubsub", "shardnumsub", &channel])
                .lines()
                .nth(1)
                == Some("2")
            {
                break (p, channel);
            }
        }
        assert!(Instant::now() < deadline, "news not subscribed by 2 nodes");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let slot = cluster.cli(from, &["cluster", "keyslot", &channel]);
    let slot = slot.trim();
    let to = cluster
        .nodes()
        .into_iter()
        .find(|m| m.master && m.port != from)
        .unwrap()
        .port;
    let id = |p: u16| cluster.cli(p, &["cluster", "myid"]).trim().to_owned();
    let (from_id, to_id) = (id(from), id(to));
    let outages: Vec<u64> = {
        let mut v = Vec::new();
        for s in &n {
            v.push(s.metric("herald_broker_outages_total").await);
        }
        v
    };
    // The migration as redis-cli --cluster does it (the slot has no keys).
    let ok = |out: String| assert_eq!(out.trim(), "OK", "{out}");
    ok(cluster.cli(to, &["cluster", "setslot", slot, "importing", &from_id]));
    ok(cluster.cli(from, &["cluster", "setslot", slot, "migrating", &to_id]));
    for m in cluster.nodes().into_iter().filter(|m| m.master) {
        ok(cluster.cli(m.port, &["cluster", "setslot", slot, "node", &to_id]));
    }
    // Both nodes end their session and subscribe on the new owner.
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let owners = shard_owners(&cluster, ".news");
        let subs = cluster.cli(to, &["pubsub", "shardnumsub", &channel]);
        if owners == [to] && subs.lines().nth(1) == Some("2") {
            break;
        }
        assert!(Instant::now() < deadline, "news on {owners:?}: {subs}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (s, before) in n.iter().zip(outages) {
        assert!(s.metric("herald_broker_outages_total").await > before);
        wait_ready(s, 200, TIMEOUT).await;
        // Told by the server, not by a timeout.
        assert!(s.log().contains("the cluster moved"), "{}", s.log());
    }
    // Across nodes, once each.
    n[0].trigger("news", "e", "1").await;
    n[1].trigger("news", "e", "2").await;
    for c in &mut clients {
        let mut got = Vec::new();
        for _ in 0..2 {
            got.push(
                c.expect("e", Some("news")).await["data"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        got.sort();
        assert_eq!(got, ["1", "2"]);
    }
    n[1].trigger("news", "marker", "m").await;
    for c in &mut clients {
        c.expect("marker", Some("news")).await;
    }
}

/// The master owning the cluster-wide slot (hash tag `{prefix}`).
fn control_master(cluster: &RedisCluster, prefix: &str) -> u16 {
    let slot: u16 = cluster
        .cli(
            cluster.running()[0],
            &["cluster", "keyslot", &format!("{{{prefix}}}")],
        )
        .trim()
        .parse()
        .unwrap();
    cluster.master_of_slot(slot).unwrap()
}

/// A channel subscribed on both nodes whose shard is another master
/// than `control`: its name, that master, a client on each node, and the
/// clients of channels tried before (to keep until the test ends).
async fn channel_off(
    cluster: &RedisCluster,
    n: &[Server],
    control: u16,
) -> (String, u16, Client, Client, Vec<(Client, Client)>) {
    let mut keep = Vec::new();
    for k in 0..16 {
        let name = format!("chan-{k}");
        let suffix = format!(".{name}");
        let mut a = n[0].client().await;
        a.subscribe(&name).await;
        let mut b = n[1].client().await;
        b.subscribe(&name).await;
        let deadline = Instant::now() + TIMEOUT;
        let owner = loop {
            if let [p] = shard_owners(cluster, &suffix)[..] {
                let ch = channel_on(p, cluster, &suffix);
                if cluster
                    .cli(p, &["pubsub", "shardnumsub", &ch])
                    .lines()
                    .nth(1)
                    == Some("2")
                {
                    break p;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{name} not subscribed by 2 nodes"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if owner != control {
            return (name, owner, a, b, keep);
        }
        keep.push((a, b));
    }
    panic!("no channel off the control slot in 16");
}

/// Node 0 publishes on `name` until node 1's client hears the latest one
/// (within `within`); each publication reaches node 0's own client. Earlier
/// ones published while node 1 was deaf may reach it late (recovered from
/// node 0's window after the outage), each at most once.
async fn heard_again(n: &[Server], name: &str, a: &mut Client, b: &mut Client, within: Duration) {
    let deadline = Instant::now() + within;
    let mut seen = std::collections::HashSet::new();
    for k in 0u64.. {
        assert!(
            Instant::now() < deadline,
            "node 1 never heard {name} again; log:\n{}",
            n[1].log()
        );
        n[0].trigger(name, "p", &k.to_string()).await;
        assert_eq!(a.expect("p", Some(name)).await["data"], k.to_string());
        while let Ok(f) =
            tokio::time::timeout(Duration::from_millis(300), b.expect("p", Some(name))).await
        {
            let got: u64 = f["data"]
                .as_str()
                .and_then(|d| d.parse().ok())
                .expect("a number");
            assert!(got <= k, "{f}");
            assert!(seen.insert(got), "{got} arrived twice");
            if got == k {
                return;
            }
        }
    }
}

/// A master of channels only (not of the cluster-wide slot) frozen: its
/// subscribers are never told (no closed socket, no `SUNSUBSCRIBE`), but
/// the slot map changes when its replica is promoted, which the nodes
/// check, and they subscribe on the new owner. The canary is off here
/// (it would notice first: the next test), so this tests the check.
#[tokio::test]
async fn a_frozen_channel_master_failed_over_is_followed() {
    let _one = FAILOVERS.lock().await;
    let mut cluster = RedisCluster::start();
    let n = nodes(&cluster, 2, "fz", "ttl = 60\ncanary_interval = 0\n").await;
    let control = control_master(&cluster, "fz");
    let (name, owner, mut a, mut b, keep) = channel_off(&cluster, &n, control).await;
    cluster.freeze(owner, true);
    // Node 1 hears node 0's publications again once it follows the
    // promoted replica.
    heard_again(&n, &name, &mut a, &mut b, FAILOVER).await;
    // Found by the slot map check (changed, or its call to the frozen
    // node timed out): node 1 sends nothing to that shard. Node 1 may hear
    // the publications before that, recovered from node 0's window over
    // the cluster-wide shard (its heartbeats show the gap), so the check
    // is waited for.
    let deadline = Instant::now() + FAILOVER;
    while !n[1].log().contains("slot map") {
        assert!(
            Instant::now() < deadline,
            "no slot map check: {}",
            n[1].log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!n[1].log().contains("canary"), "{}", n[1].log());
    cluster.freeze(owner, false);
    drop(keep);
}

/// One Redis Cluster master goes silent: a master of channels only (not
/// the shard of the cluster-wide subjects) stops answering with its sockets open. The
/// canary goes through every master, so both nodes notice within its
/// interval and timeout: `/ready` 503, the failure counted and logged;
/// they reconnect, follow the promoted replica and deliver again.
#[tokio::test]
async fn a_frozen_channel_master_is_noticed_by_the_canary_of_its_shard() {
    let _one = FAILOVERS.lock().await;
    let mut cluster = RedisCluster::start();
    let n = nodes(
        &cluster,
        2,
        "sc",
        "ttl = 60\ncanary_interval = 1\ncanary_timeout = 1\n",
    )
    .await;
    let control = control_master(&cluster, "sc");
    let (name, owner, mut a, mut b, keep) = channel_off(&cluster, &n, control).await;
    // Every node's canary has a copy subscribed on that master.
    let copies = cluster
        .cli(owner, &["pubsub", "shardchannels", "*sc.canary.*"])
        .lines()
        .filter(|l| !l.is_empty())
        .count();
    assert_eq!(copies, 2, "one canary copy per node on {owner}");
    let failures: Vec<u64> = futures_util::future::join_all(
        n.iter()
            .map(|s| s.metric("herald_broker_canary_failures_total")),
    )
    .await;
    let frozen_at = Instant::now();
    cluster.freeze(owner, true);
    for s in &n {
        wait_ready(s, 503, TIMEOUT).await;
    }
    let noticed = frozen_at.elapsed();
    eprintln!("both nodes not ready {noticed:?} after the freeze");
    for (s, before) in n.iter().zip(&failures) {
        assert!(s.metric("herald_broker_canary_failures_total").await > *before);
        assert!(
            s.log().contains("broker canary not heard back"),
            "{}",
            s.log()
        );
    }
    // They reconnect: ready on the promoted replica, the old master still
    // frozen, and node 1 hears node 0 on that shard again.
    for s in &n {
        wait_ready(s, 200, FAILOVER).await;
    }
    eprintln!(
        "both nodes ready again {:?} after the freeze",
        frozen_at.elapsed()
    );
    heard_again(&n, &name, &mut a, &mut b, TIMEOUT).await;
    cluster.freeze(owner, false);
    drop(keep);
}
