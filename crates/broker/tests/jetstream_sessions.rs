//! The NATS engine's session snapshots over a real `nats-server -js`
//! (issue 19), two stores in one process standing for two nodes: a burst
//! of snapshots as large as a node's share of a reconnect storm is
//! written whole (none dropped), only the newest snapshot of a session is
//! kept, and a session taken by another node is not written back by the
//! node that had it (the compare-and-set on its last revision).

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
        if let Some(v) = s.take(sid).await {
            return v;
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
    assert_eq!(b.take("sid-0").await, None);
    assert_eq!(
        m::SESSIONS_WRITTEN.get() - written,
        200,
        "the late one refused"
    );
}
