//! The NATS engine's session snapshots over a real `nats-server -js`
//! two stores in one process standing for two nodes: a burst
//! of snapshots as large as a node's share of a reconnect storm is
//! written whole (none dropped), only the newest snapshot of a session is
//! kept, a session taken by another node is not written back by the
//! node that had it (the compare-and-set on its last revision), and a
//! take of a snapshot rewritten since it was read takes nothing.

use herald_broker::jetstream::{metrics as m, JetStream};
use herald_broker::testing::BrokerServer;
use herald_core::broker::Streams as _;
use herald_core::sessions::SessionStore;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const TIMEOUT: Duration = Duration::from_secs(20);

fn store(broker: &BrokerServer, prefix: &str) -> Arc<dyn SessionStore> {
    let servers = vec![broker.url().parse().unwrap()];
    JetStream::new(servers, prefix).sessions(Duration::from_secs(300), 100_000)
}

/// `sid`'s snapshot taken from `s` once it is there (writes do not wait).
async fn taken(s: &Arc<dyn SessionStore>, sid: &str) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(k) = s.read(sid).await {
            assert!(s.take(sid, &k).await, "{sid} read but not taken");
            return k.snapshot;
        }
        assert!(Instant::now() < deadline, "{sid} never written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_snapshots_is_written_whole_newest_only_and_restores_once() {
    let broker = BrokerServer::start_jetstream();
    let prefix = format!("js-{}", std::process::id());
    let (a, b) = (store(&broker, &prefix), store(&broker, &prefix));
    // More sessions at once than the old queue (4,096) held, each
    // snapshotted twice: the second replaces the first while it waits.
    const N: usize = 6_000;
    let dropped = m::SESSIONS_DROPPED.get();
    for i in 0..N {
        a.store(&format!("sid-{i}"), format!("old-{i}"));
    }
    for i in 0..N {
        a.store(&format!("sid-{i}"), format!("new-{i}"));
    }
    // Every session restores on the other node with its newest snapshot.
    for i in (0..N).rev() {
        assert_eq!(taken(&b, &format!("sid-{i}")).await, format!("new-{i}"));
    }
    assert_eq!(m::SESSIONS_DROPPED.get(), dropped, "none dropped");
    // Once taken, a late snapshot from the node that had it is refused,
    // and the session does not restore a second time.
    // Its write goes out before 200 fresh ones, each of which lands; a
    // write ends within the engine's 1 s call timeout.
    let written = m::SESSIONS_WRITTEN.get();
    a.store("sid-0", "late".into());
    for i in 0..200 {
        a.store(&format!("fresh-{i}"), format!("fresh-{i}"));
    }
    for i in 0..200 {
        assert_eq!(taken(&b, &format!("fresh-{i}")).await, format!("fresh-{i}"));
    }
    assert_eq!(b.read("sid-0").await, None);
    assert_eq!(
        m::SESSIONS_WRITTEN.get() - written,
        200,
        "the late one refused"
    );
}

#[tokio::test]
async fn a_snapshot_rewritten_after_its_read_is_not_taken() {
    let broker = BrokerServer::start_jetstream();
    let prefix = format!("jr-{}", std::process::id());
    let (a, b) = (store(&broker, &prefix), store(&broker, &prefix));
    a.store("s", "live".into());
    let deadline = Instant::now() + TIMEOUT;
    let read = loop {
        if let Some(k) = b.read("s").await {
            break k;
        }
        assert!(Instant::now() < deadline, "never written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(read.snapshot, "live");
    a.store("s", "closed".into());
    let deadline = Instant::now() + TIMEOUT;
    while b.read("s").await.map(|k| k.snapshot).as_deref() != Some("closed") {
        assert!(Instant::now() < deadline, "never rewritten");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!b.take("s", &read).await, "a stale read took the session");
    let now = b.read("s").await.unwrap();
    assert!(b.take("s", &now).await);
    assert!(!b.take("s", &now).await, "taken twice");
    assert_eq!(b.read("s").await, None);
}
