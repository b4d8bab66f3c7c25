//! A measurement, not a behaviour test (ignored by default; run with
//! `cargo test -p herald-broker --test it -- shard_follow:: --ignored --nocapture`):
//! whether a node could follow only the shard that failed instead of
//! reconnecting to the whole cluster. One cluster connection configured as
//! the transport's (RESP3 pushes, no retries, 2 s timeouts) subscribes to
//! one shard channel per master; another connection publishes to each
//! every 20 ms; the master of the first is SIGKILLed. Measured: whether the
//! other shards' messages keep arriving on the same connection, and how
//! soon the same connection can `SSUBSCRIBE` the lost channel again on the
//! promoted replica and hear it. (Its counts of messages after the kill
//! include some queued just before it.) Results: docs/cluster.md, Known
//! limits.

use herald_broker::redis_conn::slot;
use herald_broker::testing::RedisCluster;
use redis::cluster::ClusterClient;
use redis::{ProtocolVersion, PushInfo, PushKind, Value};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

#[tokio::test]
#[ignore]
async fn following_one_shard_on_the_same_connection() {
    let mut cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    // One channel per master.
    let masters: Vec<u16> = cluster
        .nodes()
        .into_iter()
        .filter(|n| n.master)
        .map(|n| n.port)
        .collect();
    let mut chans: Vec<(String, u16)> = Vec::new();
    for m in &masters {
        let name = (0..)
            .map(|k| format!("probe-{k}"))
            .find(|n| cluster.master_of_slot(slot(n.as_bytes())) == Some(*m))
            .unwrap();
        chans.push((name, *m));
    }
    let seeds: Vec<String> = masters
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect();
    let (tx, mut pushes) = mpsc::unbounded_channel::<PushInfo>();
    let sub = ClusterClient::builder(seeds.clone())
        .use_protocol(ProtocolVersion::RESP3)
        .push_sender(tx)
        .retries(0)
        .connection_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut conn = sub.get_async_connection().await.unwrap();
    for (c, _) in &chans {
        conn.ssubscribe(c).await.unwrap();
    }
    let publisher = ClusterClient::builder(seeds).build().unwrap();
    let pc = publisher.get_async_connection().await.unwrap();
    // One publisher task per channel: a call to the dead master must not
    // hold up the others.
    for (n, _) in &chans {
        let (n, mut pc) = (n.clone(), pc.clone());
        tokio::spawn(async move {
            for k in 0u64.. {
                let _: redis::RedisResult<()> = redis::cmd("SPUBLISH")
                    .arg(&n)
                    .arg(k)
                    .query_async(&mut pc)
                    .await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
    // Everything flows before the kill.
    let mut last: Vec<Option<Instant>> = vec![None; chans.len()];
    let deadline = Instant::now() + Duration::from_secs(10);
    while last.iter().any(Option::is_none) {
        assert!(Instant::now() < deadline, "no messages before the kill");
        if let Some(p) = pushes.recv().await {
            if let Some(i) = which(&p, &chans) {
                last[i] = Some(Instant::now());
            }
        }
    }
    let killed = Instant::now();
    cluster.kill(chans[0].1);
    let mut gap = vec![Duration::ZERO; chans.len()];
    let mut after = vec![0u32; chans.len()];
    let mut events: Vec<String> = Vec::new();
    let mut resubscribed: Option<Duration> = None;
    let mut heard_again: Option<Duration> = None;
    let mut next_try = Instant::now();
    let end = killed + Duration::from_secs(20);
    while Instant::now() < end && heard_again.is_none() {
        if resubscribed.is_none() && Instant::now() >= next_try {
            next_try = Instant::now() + Duration::from_millis(200);
            match tokio::time::timeout(Duration::from_secs(3), conn.ssubscribe(&chans[0].0)).await {
                Ok(Ok(()))
                    if cluster.master_of_slot(slot(chans[0].0.as_bytes())) != Some(chans[0].1) =>
                {
                    resubscribed = Some(killed.elapsed());
                }
                Ok(Ok(())) => {}
                Ok(Err(e)) => events.push(format!("{:?} ssubscribe: {e}", killed.elapsed())),
                Err(_) => events.push(format!("{:?} ssubscribe timed out", killed.elapsed())),
            }
        }
        let Ok(Some(p)) = tokio::time::timeout(Duration::from_millis(50), pushes.recv()).await
        else {
            continue;
        };
        match (&p.kind, which(&p, &chans)) {
            (PushKind::SMessage, Some(i)) => {
                let now = Instant::now();
                if let Some(l) = last[i] {
                    gap[i] = gap[i].max(now - l);
                }
                after[i] += 1;
                last[i] = Some(now);
                if i == 0 && resubscribed.is_some() {
                    heard_again = Some(killed.elapsed());
                }
            }
            (k, _) => events.push(format!("{:?} push {k:?}", killed.elapsed())),
        }
    }
    events.dedup();
    for e in events.iter().take(30) {
        eprintln!("{e}");
    }
    eprintln!(
        "messages per channel after the kill {after:?}; longest gap per channel \
         (0 = the killed master's): {gap:?}; \
         resubscribed on the same connection at {resubscribed:?}, heard again at {heard_again:?}"
    );
    // The other shards kept flowing on the same connection.
    for (g, n) in gap[1..].iter().zip(&after[1..]) {
        assert!(*n > 0 && *g < Duration::from_secs(1), "{after:?} {gap:?}");
    }
    assert!(heard_again.is_some(), "{events:?}");
}

fn which(p: &PushInfo, chans: &[(String, u16)]) -> Option<usize> {
    if p.kind != PushKind::SMessage {
        return None;
    }
    let Some(Value::BulkString(c)) = p.data.first() else {
        return None;
    };
    chans.iter().position(|(n, _)| n.as_bytes() == c.as_slice())
}
