//! The NATS engine's history over a real `nats-server -js`, two
//! engines in one process standing for two nodes: every way a read
//! is answered (afresh through a consumer, from the cache at the same
//! tip, extended by a few direct gets or by a consumer) gives the same
//! entries, offsets and epoch as a fresh read on the other node, and the
//! server's bounds; concurrent reads of one stream share one read.

use herald_broker::jetstream::{metrics as m, JetStream};
use herald_broker::testing::BrokerServer;
use herald_core::broker::Streams as _;
use herald_core::history::{Backlog, History, Limits, Miss};
use herald_core::publication::Position;
use std::sync::Arc;

fn engine(broker: &BrokerServer, prefix: &str) -> Arc<dyn History> {
    let servers = vec![broker.url().parse().unwrap()];
    JetStream::new(servers, prefix).history(Limits {
        per_stream: 20,
        ttl_ms: 300_000,
        max_bytes: 1 << 20,
    })
}

async fn append(h: &Arc<dyn History>, stream: &str, n: u64) -> Position {
    h.append(stream, &format!("{{\"n\":{n}}}"))
        .await
        .expect("a position")
}

/// The offsets of an answer, each entry's data checked against its offset
/// (message n has offset n in these streams).
fn offsets(r: Result<Backlog, Miss>) -> Result<Vec<u64>, Miss> {
    r.map(|b| {
        b.entries
            .iter()
            .map(|e| {
                assert_eq!(&*e.data, format!("{{\"n\":{}}}", e.offset));
                e.offset
            })
            .collect()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_read_path_answers_alike_and_concurrent_reads_are_shared() {
    let broker = BrokerServer::start_jetstream();
    let prefix = format!("jh-{}", std::process::id());
    let (a, b) = (engine(&broker, &prefix), engine(&broker, &prefix));
    let s = "chat/1";
    let first = append(&a, s, 1).await;
    assert_eq!(first.offset, 1);
    let epoch = first.epoch.to_string();
    for n in 2..=3 {
        assert_eq!(append(&a, s, n).await.offset, n);
    }
    let range = |from: u64, to: u64| Ok((from..=to).collect::<Vec<_>>());
    // Afresh (a consumer read of everything kept), then at the same tip.
    assert_eq!(offsets(a.after(s, &epoch, 0).await), range(1, 3));
    assert_eq!(offsets(a.after(s, &epoch, 1).await), range(2, 3));
    // The other node appends; a few more: extended by direct gets.
    for n in 4..=5 {
        assert_eq!(append(&b, s, n).await.offset, n);
    }
    assert_eq!(offsets(a.after(s, &epoch, 1).await), range(2, 5));
    // Many more: extended through a consumer.
    for n in 6..=15 {
        append(&a, s, n).await;
    }
    assert_eq!(offsets(a.after(s, &epoch, 3).await), range(4, 15));
    assert_eq!(offsets(b.after(s, &epoch, 3).await), range(4, 15));
    // Past history_limit (20): the server keeps 6..=25, so do the caches.
    for n in 16..=25 {
        append(&b, s, n).await;
    }
    for h in [&a, &b] {
        assert_eq!(offsets(h.after(s, &epoch, 5).await), range(6, 25));
        assert_eq!(offsets(h.after(s, &epoch, 4).await), Err(Miss::Evicted));
        assert_eq!(offsets(h.after(s, &epoch, 26).await), Err(Miss::Ahead));
        assert_eq!(
            offsets(h.after(s, "forged", 5).await),
            Err(Miss::UnknownEpoch)
        );
        assert_eq!(offsets(h.since(s, 0).await), range(6, 25));
    }
    assert_eq!(
        offsets(a.after("nobody", &epoch, 0).await),
        Err(Miss::UnknownStream)
    );

    // 200 concurrent reads of one stream on a node with a cold cache.
    let c = engine(&broker, &prefix);
    let (reads, shared) = (m::HISTORY_READS.get(), m::HISTORY_READS_SHARED.get());
    let mut all = tokio::task::JoinSet::new();
    for i in 0..200u64 {
        let (c, epoch) = (c.clone(), epoch.clone());
        all.spawn(async move { (i, offsets(c.after(s, &epoch, 5 + i % 10).await)) });
    }
    while let Some(done) = all.join_next().await {
        let (i, got) = done.unwrap();
        assert_eq!(got, range(6 + i % 10, 25));
    }
    let (reads, shared) = (
        m::HISTORY_READS.get() - reads,
        m::HISTORY_READS_SHARED.get() - shared,
    );
    assert_eq!(reads + shared, 200, "every request read or joined a read");
    assert!(shared > 0, "{reads} reads, {shared} shared");
    assert_eq!(m::HISTORY_READ_TIMEOUTS.get(), 0);
}
