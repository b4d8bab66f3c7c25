//! Three real `herald serve` nodes on `redis-sentinel://` (a real master, a
//! replica and three sentinels from `herald_broker::testing_sentinel`):
//! publications cross nodes exactly once; the master SIGKILLed under a
//! publish loop, the sentinels promote the replica and the nodes follow it
//! without a restart (`/ready` back, every acknowledged publication at
//! every subscriber exactly once, presence right again within the TTL). Extended Action Cable
//! history on the Sentinel engine restores across nodes, before and after
//! a failover.

use crate::common;

use common::ext::{broadcast, cable, frame, ident, send};
use common::{users_everywhere, wait_ready, Client, Server, Ws, TIMEOUT};
use herald_broker::testing_sentinel::RedisSentinel;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Heartbeat TTL of the nodes (s): presence must be right again within it
/// once the nodes are back on the promoted master.
const TTL: u64 = 3;

/// How long the sentinels may take to promote the replica and the nodes
/// to follow (`down-after-milliseconds` 1000, an election, the promotion,
/// the nodes' backoff of at most 5 s).
const FAILOVER: Duration = Duration::from_secs(30);

async fn sentinel() -> RedisSentinel {
    tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap()
}

/// `n` nodes on the Sentinel URL; `extra` is more TOML after `[broker]`.
async fn nodes(s: &RedisSentinel, n: usize, prefix: &str, extra: &str) -> Vec<Server> {
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"{prefix}\"\nttl = {TTL}\n{extra}",
        s.url()
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

/// What one subscriber received: `(event, data)` in order, from a task
/// that reads its socket all along.
fn reader(mut c: Client) -> mpsc::UnboundedReceiver<(String, String)> {
    use futures_util::StreamExt;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        // Not `Client::recv`: its 10 s limit per frame would end the
        // reader in a quiet stretch of a failover.
        while let Ok(Some(Ok(m))) =
            tokio::time::timeout(Duration::from_secs(120), c.ws.next()).await
        {
            let Ok(text) = m.to_text() else { continue };
            let Ok(f) = serde_json::from_str::<Value>(text) else {
                continue;
            };
            let event = f["event"].as_str().unwrap_or_default().to_owned();
            let data = f["data"].as_str().unwrap_or_default().to_owned();
            if tx.send((event, data)).is_err() {
                return;
            }
        }
    });
    rx
}

/// Ticks received per subscriber: tick number → times received.
type Counts = Vec<BTreeMap<u64, u32>>;

/// Count a `tick` frame's number in `counts`; false for other events.
fn count(counts: &mut BTreeMap<u64, u32>, event: &str, data: &str) -> bool {
    if event != "tick" {
        return false;
    }
    *counts.entry(data.parse().unwrap()).or_insert(0) += 1;
    true
}

/// Probe `news` through each node until every subscriber got a probe
/// from every node: each node's subscription on the broker is in place.
/// Ticks arriving meanwhile are counted.
async fn probe_all(
    nodes: &[Server],
    inboxes: &mut [mpsc::UnboundedReceiver<(String, String)>],
    counts: &mut Counts,
) {
    let deadline = Instant::now() + FAILOVER;
    let mut heard = vec![vec![false; nodes.len()]; inboxes.len()];
    let mut k = 0u64;
    while heard.iter().flatten().any(|h| !h) {
        assert!(
            Instant::now() < deadline,
            "probes did not reach every subscriber: {heard:?}"
        );
        for (i, n) in nodes.iter().enumerate() {
            n.trigger("news", "probe", &format!("{i}/{k}")).await;
        }
        k += 1;
        let until = tokio::time::Instant::now() + Duration::from_millis(300);
        for (s, inbox) in inboxes.iter_mut().enumerate() {
            while let Ok(Some((event, data))) = tokio::time::timeout_at(until, inbox.recv()).await {
                if count(&mut counts[s], &event, &data) || event == "end" {
                    continue;
                }
                assert_eq!(event, "probe", "{data}");
                let from: usize = data.split('/').next().unwrap().parse().unwrap();
                heard[s][from] = true;
            }
        }
    }
}

/// Read `inbox` up to the `end` marker with data `end`, counting ticks.
async fn until_end(
    inbox: &mut mpsc::UnboundedReceiver<(String, String)>,
    counts: &mut BTreeMap<u64, u32>,
    end: &str,
) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let (event, data) = tokio::time::timeout_at(deadline, inbox.recv())
            .await
            .unwrap_or_else(|_| panic!("no end marker {end}"))
            .expect("subscriber gone");
        if !count(counts, &event, &data) && event == "end" && data == end {
            return;
        }
    }
}

#[tokio::test]
async fn nodes_follow_a_sentinel_failover_without_a_restart() {
    let mut sentinel = sentinel().await;
    let n = nodes(&sentinel, 3, "sen", "").await;

    // Presence: a member on node 0 and one on node 1.
    let mut a = n[0].client().await;
    a.subscribe_presence("presence-room", "a", json!({})).await;
    let mut b = n[1].client().await;
    b.subscribe_presence("presence-room", "b", json!({})).await;
    users_everywhere(&n, "presence-room", &["a", "b"], TIMEOUT).await;

    // A subscriber of `news` on every node.
    let mut inboxes = Vec::new();
    for s in &n {
        let mut c = s.client().await;
        c.subscribe("news").await;
        inboxes.push(reader(c));
    }
    let mut counts: Counts = vec![BTreeMap::new(); inboxes.len()];
    probe_all(&n, &mut inboxes, &mut counts).await;

    // Before the failover: every tick, through any node, reaches every
    // subscriber exactly once.
    for k in 0..30u64 {
        n[(k % 3) as usize]
            .trigger("news", "tick", &k.to_string())
            .await;
    }
    n[0].trigger("news", "end", "before").await;
    for (i, inbox) in inboxes.iter_mut().enumerate() {
        until_end(inbox, &mut counts[i], "before").await;
        let got = &counts[i];
        assert_eq!(got.len(), 30, "subscriber {i}: {got:?}");
        assert!(got.values().all(|c| *c == 1), "subscriber {i}: {got:?}");
    }

    // A publish loop through all three nodes, one tick per 10 ms each.
    let stop = Arc::new(tokio::sync::Notify::new());
    let ports: Vec<u16> = n.iter().map(|s| s.port).collect();
    let publisher = tokio::spawn({
        let stop = stop.clone();
        async move {
            let http = reqwest::Client::new();
            let mut k = 1000u64;
            // When each tick was published, and whether its node
            // acknowledged it (2xx; 503 is a refusal: the outbox is full).
            let mut at: Vec<(Instant, bool)> = Vec::new();
            loop {
                let port = ports[(k % 3) as usize];
                let body =
                    json!({ "name": "tick", "channel": "news", "data": k.to_string() }).to_string();
                let path = format!("/apps/{}/events", common::APP_ID);
                let query = herald_pusher::auth::sign_query(
                    common::APP_KEY,
                    common::APP_SECRET,
                    "POST",
                    &path,
                    body.as_bytes(),
                    &[],
                );
                let url = format!("http://127.0.0.1:{port}{path}?{query}");
                let r = http
                    .post(url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .expect("trigger");
                let ok = r.status().is_success();
                if !ok {
                    assert_eq!(r.status(), 503, "a refusal is 503");
                }
                at.push((Instant::now(), ok));
                k += 1;
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                    _ = stop.notified() => return at,
                }
            }
        }
    });
    let warm = Instant::now() + Duration::from_secs(1);
    while Instant::now() < warm {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // SIGKILL the master; the sentinels promote the replica.
    let t0 = Instant::now();
    let (sentinel_back, old, new) = tokio::task::spawn_blocking(move || {
        let old = sentinel.kill_master();
        let new = sentinel.wait_failover(old);
        (sentinel, old, new)
    })
    .await
    .unwrap();
    sentinel = sentinel_back;
    let promoted = t0.elapsed();
    assert_ne!(old, new);

    // The nodes follow by themselves: /ready back on every one.
    for s in &n {
        wait_ready(s, 200, FAILOVER).await;
    }
    let followed = t0.elapsed();
    // Every node's subscriptions are in place again (probes through each
    // node reach every subscriber); ticks keep flowing meanwhile.
    probe_all(&n, &mut inboxes, &mut counts).await;
    let delivering = t0.elapsed();
    // A second of ticks after recovery, then stop.
    let settle = Instant::now() + Duration::from_secs(1);
    while Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.notify_one();
    let at = publisher.await.unwrap();
    let published = at.len() as u64;
    let acked: Vec<u64> = (1000..1000 + published)
        .filter(|k| at[(*k - 1000) as usize].1)
        .collect();
    let at: Vec<Instant> = at.into_iter().map(|(t, _)| t).collect();

    // Presence right again within the TTL of the nodes being back.
    let t1 = Instant::now();
    users_everywhere(
        &n,
        "presence-room",
        &["a", "b"],
        Duration::from_secs(TTL) + Duration::from_secs(2),
    )
    .await;
    let presence_after = t1.elapsed();

    // Ticks published after recovery: exactly once everywhere.
    for k in 0..30u64 {
        n[(k % 3) as usize]
            .trigger("news", "tick", &(100_000 + k).to_string())
            .await;
    }
    // Wait for those 30 at every subscriber before the end marker (they
    // come from three nodes, so no order across them is assumed).
    let mut report = Vec::new();
    for (i, inbox) in inboxes.iter_mut().enumerate() {
        let got = &mut counts[i];
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        while (100_000..100_030).any(|k| !got.contains_key(&k))
            || acked.iter().any(|k| !got.contains_key(k))
        {
            let (event, data) = tokio::time::timeout_at(deadline, inbox.recv())
                .await
                .unwrap_or_else(|_| {
                    let missing: Vec<_> = acked.iter().filter(|k| !got.contains_key(k)).collect();
                    panic!(
                        "subscriber {i}: ticks missing: acknowledged {missing:?}, \
                         post-failover {:?}",
                        (100_000..100_030)
                            .filter(|k| !got.contains_key(k))
                            .collect::<Vec<_>>()
                    )
                })
                .unwrap();
            count(got, &event, &data);
        }
        // Anything still on its way comes before this marker.
        n[0].trigger("news", "end", &format!("last-{i}")).await;
        until_end(inbox, got, &format!("last-{i}")).await;
        let dup: Vec<_> = got.iter().filter(|(_, c)| **c > 1).collect();
        assert!(dup.is_empty(), "subscriber {i}: duplicates {dup:?}");
        for k in 100_000..100_030 {
            assert_eq!(got.get(&k), Some(&1), "subscriber {i}: tick {k}");
        }
        let loop_got = got.keys().filter(|k| (1000..100_000).contains(*k)).count() as u64;
        // The ticks missed: how many were the subscriber's own node's
        // (always delivered locally: none), and the span of time in which
        // the missed ones were published.
        let missed: Vec<u64> = (1000..1000 + published)
            .filter(|k| !got.contains_key(k))
            .collect();
        let own = missed.iter().filter(|k| *k % 3 == i as u64).count();
        assert_eq!(
            own, 0,
            "subscriber {i} missed its own node's ticks: {missed:?}"
        );
        let span = match (missed.first(), missed.last()) {
            (Some(a), Some(b)) => at[(*b - 1000) as usize] - at[(*a - 1000) as usize],
            _ => Duration::ZERO,
        };
        eprintln!(
            "sentinel failover: subscriber on node {i}: missed ticks published over {span:?} \
             (from {:?} to {:?} after the kill)",
            missed
                .first()
                .map(|k| at[(*k - 1000) as usize].saturating_duration_since(t0)),
            missed
                .last()
                .map(|k| at[(*k - 1000) as usize].saturating_duration_since(t0)),
        );
        report.push((i, loop_got));
        // Every acknowledged tick arrived (the wait above), once.
        assert_eq!(loop_got, acked.len() as u64, "subscriber {i}");
    }
    for (i, got) in &report {
        eprintln!(
            "sentinel failover: subscriber on node {i}: {got} of {published} loop ticks received, \
             {} lost",
            published - got
        );
    }
    eprintln!(
        "sentinel failover: promoted after {promoted:?}, all nodes ready after {followed:?}, \
         delivering everywhere after {delivering:?}; presence right {presence_after:?} later"
    );
    eprintln!(
        "sentinel failover: {} of {published} ticks acknowledged; recovered on nodes 0, 1, 2: \
         {}, {}, {}",
        acked.len(),
        n[0].counter("herald_broker_recovered_total").await,
        n[1].counter("herald_broker_recovered_total").await,
        n[2].counter("herald_broker_recovered_total").await,
    );
    drop(a);
    drop(b);
    drop(sentinel);
}

// ---- Extended Action Cable: history on the Sentinel engine ----

/// Broadcast probes to `stream` through `node` until `ws` gets one live
/// (see tests/it/actioncable_ext_redis.rs); its (epoch, offset).
async fn probe(node: &Server, ws: &mut Ws, stream: &str) -> (String, u64) {
    let deadline = Instant::now() + FAILOVER;
    for k in 0.. {
        assert!(Instant::now() < deadline, "no probe of {stream} arrived");
        broadcast(node, stream, json!({ "probe": k })).await;
        if let Ok(f) = tokio::time::timeout(Duration::from_millis(300), frame(ws)).await {
            // Until the stream's marker is on the server (a node creates
            // it shortly after the subscription), probes carry no offset.
            if f["message"]["probe"].is_number() && f["offset"].is_u64() {
                let (_, o, e) = pub_of(&f);
                return (e, o);
            }
        }
    }
    unreachable!()
}

fn pub_of(f: &Value) -> (Value, u64, String) {
    (
        f["message"].clone(),
        f["offset"]
            .as_u64()
            .unwrap_or_else(|| panic!("no offset: {f}")),
        f["epoch"]
            .as_str()
            .unwrap_or_else(|| panic!("no epoch: {f}"))
            .to_owned(),
    )
}

/// A client on the extended protocol following `stream` on `node`.
async fn follower(node: &Server, stream: &str) -> Ws {
    let mut ws = cable(node, "").await;
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": ident(stream) }),
    )
    .await;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let f = tokio::time::timeout_at(deadline.into(), frame(&mut ws))
            .await
            .expect("no confirmation");
        if f["type"] == "confirm_subscription" {
            return ws;
        }
    }
}

/// A new client on `node` asking for `stream` since (epoch, offset):
/// the messages restored, in order, until the `confirm_history`.
async fn restored(node: &Server, stream: &str, epoch: &str, offset: u64) -> Vec<Value> {
    let mut ws = cable(node, "").await;
    send(
        &mut ws,
        json!({ "command": "subscribe", "identifier": ident(stream),
                "history": { "streams": { stream: { "epoch": epoch, "offset": offset } } } }),
    )
    .await;
    let mut got = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let f = tokio::time::timeout_at(deadline.into(), frame(&mut ws))
            .await
            .expect("no history answer");
        match f["type"].as_str() {
            Some("confirm_history") => return got,
            Some("reject_history") => panic!("history rejected: {f}"),
            _ if f["message"].is_object() && f["offset"].is_u64() => got.push(f["message"].clone()),
            _ => {}
        }
    }
}

#[tokio::test]
async fn extended_history_is_restored_across_nodes_before_and_after_a_failover() {
    let mut sentinel = sentinel().await;
    let n = nodes(&sentinel, 2, "senx", "[rpc]\npublic_streams = true\n").await;
    let stream = "room-1";
    let mut ws = follower(&n[0], stream).await;
    let (epoch, at) = probe(&n[1], &mut ws, stream).await;
    for k in 0..5 {
        broadcast(&n[1], stream, json!({ "n": k })).await;
    }
    // Restored on the other node, from the shared log on the master.
    let got = restored(&n[1], stream, &epoch, at).await;
    let ns: Vec<&Value> = got.iter().map(|m| &m["n"]).collect();
    assert_eq!(
        ns,
        (0..5)
            .map(|k| json!(k))
            .collect::<Vec<_>>()
            .iter()
            .collect::<Vec<_>>()
    );

    // Failover: the replica has the log (asynchronous replication, so a
    // write in the last instant before the kill could be missing; these
    // were acknowledged long before).
    let (back, _, _) = tokio::task::spawn_blocking(move || {
        let old = sentinel.kill_master();
        let new = sentinel.wait_failover(old);
        (sentinel, old, new)
    })
    .await
    .unwrap();
    sentinel = back;
    for s in &n {
        wait_ready(s, 200, FAILOVER).await;
    }
    let mut ws = follower(&n[1], stream).await;
    let (epoch2, at2) = probe(&n[0], &mut ws, stream).await;
    assert_eq!(epoch2, epoch, "the epoch survived the failover");
    assert!(
        at2 > at + 5,
        "offsets go on after the failover: {at2} after {at}"
    );
    for k in 5..8 {
        broadcast(&n[0], stream, json!({ "n": k })).await;
    }
    let got = restored(&n[1], stream, &epoch, at).await;
    let ns: Vec<i64> = got.iter().filter_map(|m| m["n"].as_i64()).collect();
    assert_eq!(ns, (0..8).collect::<Vec<_>>());
    drop(sentinel);
}

/// A manual failover (`SENTINEL FAILOVER`): the master is demoted to a
/// replica and keeps running, so a node that stayed on it would write into
/// `-READONLY` and hear nothing. Sentinel closes its clients; the nodes ask
/// again, move to the promoted replica, and publications and history
/// appends (writes) work there: positions in the same epoch, every
/// publication to every subscriber once.
#[tokio::test]
async fn a_demoted_master_is_left_for_the_promoted_replica() {
    let sentinel = sentinel().await;
    let n = nodes(&sentinel, 2, "sendem", "[rpc]\npublic_streams = true\n").await;
    let stream = "room-2";
    let mut ws = follower(&n[0], stream).await;
    let (epoch, at) = probe(&n[1], &mut ws, stream).await;
    let mut inboxes = Vec::new();
    for s in &n {
        let mut c = s.client().await;
        c.subscribe("news").await;
        inboxes.push(reader(c));
    }
    let mut counts: Counts = vec![BTreeMap::new(); inboxes.len()];
    probe_all(&n, &mut inboxes, &mut counts).await;

    let t0 = Instant::now();
    let (sentinel, (old, new)) = tokio::task::spawn_blocking(move || {
        let ports = sentinel.manual_failover();
        (sentinel, ports)
    })
    .await
    .unwrap();
    assert_ne!(old, new);
    let moved = t0.elapsed();
    for s in &n {
        wait_ready(s, 200, FAILOVER).await;
    }
    probe_all(&n, &mut inboxes, &mut counts).await;
    eprintln!(
        "manual failover: the old master a replica and every sentinel agreeing after {moved:?}, \
         delivering everywhere {:?} after SENTINEL FAILOVER",
        t0.elapsed()
    );

    // Writes land on the new master: the stream goes on in its epoch.
    let (epoch2, at2) = probe(&n[1], &mut ws, stream).await;
    assert_eq!(epoch2, epoch);
    assert!(at2 > at, "{at2} after {at}");
    // Every publication, through either node, reaches both subscribers once.
    counts.iter_mut().for_each(BTreeMap::clear);
    for k in 0..20u64 {
        n[(k % 2) as usize]
            .trigger("news", "tick", &k.to_string())
            .await;
    }
    for (i, inbox) in inboxes.iter_mut().enumerate() {
        let got = &mut counts[i];
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        while got.len() < 20 {
            let (event, data) = tokio::time::timeout_at(deadline, inbox.recv())
                .await
                .unwrap_or_else(|_| panic!("subscriber {i}: ticks missing: {got:?}"))
                .unwrap();
            count(got, &event, &data);
        }
        n[0].trigger("news", "end", &format!("last-{i}")).await;
        until_end(inbox, got, &format!("last-{i}")).await;
        assert_eq!(got.len(), 20, "subscriber {i}: {got:?}");
        assert!(got.values().all(|c| *c == 1), "subscriber {i}: {got:?}");
    }
    drop(sentinel);
}

/// A master demoted without Sentinel (an operator's `REPLICAOF`) keeps its
/// clients' connections open and still takes PUBLISH, so only the node's
/// periodic `ROLE` check can tell: the node leaves it (`/ready` 503 within
/// the check's 5 s and the lookup's limits) and, the sentinels naming no
/// master it can accept, stays away rather than carry on on a replica.
#[tokio::test]
async fn a_master_demoted_behind_the_sentinels_is_left() {
    let sentinel = sentinel().await;
    let n = nodes(&sentinel, 1, "senrole", "").await;
    let t0 = Instant::now();
    let (old, new) = sentinel.demote_behind_sentinels();
    assert_ne!(old, new);
    wait_ready(&n[0], 503, Duration::from_secs(8)).await;
    eprintln!(
        "demoted behind the sentinels: node not ready after {:?}",
        t0.elapsed()
    );
    let deadline = Instant::now() + TIMEOUT;
    while !n[0].log().contains("no longer the master") {
        assert!(Instant::now() < deadline, "log:\n{}", n[0].log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(sentinel);
}
