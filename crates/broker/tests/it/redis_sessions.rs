//! The Redis engine's session snapshots over a real `redis-server`, two
//! stores in one process standing for two nodes: once another node took a
//! session, the node that had it never writes it back, however many more
//! changes it snapshots (each write is a compare-and-set on the last
//! token this node wrote), so the session restores once.

use herald_broker::redis_conn::Connector;
use herald_broker::redis_master::Master;
use herald_broker::redis_streams::RedisStreams;
use herald_broker::testing::{BrokerServer, Kind};
use herald_core::broker::Streams as _;
use herald_core::sessions::SessionStore;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const TIMEOUT: Duration = Duration::from_secs(20);

fn store(broker: &BrokerServer, prefix: &str) -> Arc<dyn SessionStore> {
    let master = Master::parse_with(&broker.url(), None).unwrap();
    RedisStreams::new(Connector::Single(master), prefix).sessions(Duration::from_secs(300), 100_000)
}

/// `sid`'s snapshot once it reads as `want` (writes do not wait).
async fn until_reads(s: &Arc<dyn SessionStore>, sid: &str, want: &str) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if s.read(sid).await.is_some_and(|k| k.snapshot == want) {
            return;
        }
        assert!(Instant::now() < deadline, "{sid} never read as {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_taken_session_is_never_written_back_by_later_changes() {
    let broker = BrokerServer::start(Kind::Redis);
    let prefix = format!("rs-{}", std::process::id());
    let (a, b) = (store(&broker, &prefix), store(&broker, &prefix));
    a.store("sid", "first".into());
    until_reads(&b, "sid", "first").await;
    let kept = b.read("sid").await.unwrap();
    assert!(b.take("sid", &kept).await, "taken by the other node");
    // The old node goes on snapshotting its (stale) session, change after
    // change; a marker written after each shows the write went out.
    for (n, late) in ["late-1", "late-2", "late-3"].into_iter().enumerate() {
        a.store("sid", late.into());
        let marker = format!("marker-{n}");
        a.store(&marker, marker.clone());
        until_reads(&b, &marker, &marker).await;
        assert_eq!(b.read("sid").await, None, "{late} wrote the session back");
    }
}
