//! Observers hear what the node decided: occupied and vacated channels,
//! members added and removed, cache misses, counts, publications while
//! watched. On a cluster (several nodes on the in-process broker) each
//! occupancy and membership change is reported by exactly one node.

use herald_core::broker::local::LocalBroker;
use herald_core::config::{AppConfig, Config};
use herald_core::connection::{Connection, QueueLimit};
use herald_core::hub::presence::Member;
use herald_core::hub::SubscribeOptions;
use herald_core::node::Node;
use herald_core::observer::{Change, Observer};
use herald_core::publication::{json_string, Publication};
use herald_core::testing::{TestWire, NS};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const LIMIT: QueueLimit = QueueLimit {
    frames: 1024,
    bytes: 1 << 20,
};

/// Every change, as `app:kind:channel[:detail]`.
#[derive(Default)]
struct Log(Mutex<Vec<String>>);

impl Observer for Log {
    fn changed(&self, app: &str, _ns: herald_core::namespace::Namespace, change: &Change<'_>) {
        let line = match change {
            Change::Occupied { channel } => format!("{app}:occupied:{channel}"),
            Change::Vacated { channel } => format!("{app}:vacated:{channel}"),
            Change::MemberAdded { channel, user_id } => {
                format!("{app}:member_added:{channel}:{user_id}")
            }
            Change::MemberRemoved { channel, user_id } => {
                format!("{app}:member_removed:{channel}:{user_id}")
            }
            Change::CacheMiss { channel } => format!("{app}:cache_miss:{channel}"),
            Change::SubscriptionCount { channel, count } => {
                format!("{app}:count:{channel}:{count}")
            }
            Change::Published(p) => format!("{app}:published:{}:{}", p.channel, p.event),
            Change::ClientEvent(p) => format!("{app}:client_event:{}", p.channel),
        };
        self.0.lock().push(line);
    }
}

impl Log {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock())
    }
}

fn node(broker: &Arc<LocalBroker>) -> (Arc<Node>, Arc<Log>) {
    let config = Config {
        apps: vec![AppConfig::development()],
        ..Config::default()
    };
    let node = Node::new(config, broker.clone());
    let log = Arc::new(Log::default());
    node.observe(log.clone());
    (node, log)
}

static NEXT: AtomicU64 = AtomicU64::new(1);

fn conn(node: &Node) -> Arc<Connection> {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    Arc::new(Connection::new(
        n,
        format!("{}.{n}", node.id),
        &TestWire,
        LIMIT,
    ))
}

async fn join(node: &Node, c: &Arc<Connection>, channel: &str, opts: SubscribeOptions) {
    let hub = node.hub_by_id("app-id").unwrap();
    node.subscribe(&hub, c, NS, channel, opts).await.unwrap();
}

fn leave(node: &Node, c: &Connection, channel: &str) {
    let hub = node.hub_by_id("app-id").unwrap();
    assert!(node.unsubscribe(&hub, c, NS, channel, &None, false));
}

fn member(user: &str) -> SubscribeOptions {
    SubscribeOptions {
        member: Some(Member {
            user_id: user.into(),
            info: None,
        }),
        max_members: 100,
        ..SubscribeOptions::default()
    }
}

#[tokio::test]
async fn one_node_reports_first_and_last() {
    let broker = Arc::new(LocalBroker::new());
    let (n, log) = node(&broker);
    let (a, b) = (conn(&n), conn(&n));
    join(&n, &a, "room", SubscribeOptions::default()).await;
    join(&n, &b, "room", SubscribeOptions::default()).await;
    assert_eq!(log.take(), ["app-id:occupied:room"]);
    leave(&n, &a, "room");
    assert!(log.take().is_empty(), "one subscriber is left");
    leave(&n, &b, "room");
    assert_eq!(log.take(), ["app-id:vacated:room"]);
}

#[tokio::test]
async fn members_are_reported_once_per_user() {
    let broker = Arc::new(LocalBroker::new());
    let (n, log) = node(&broker);
    let (a, b) = (conn(&n), conn(&n));
    join(&n, &a, "presence-x", member("u1")).await;
    join(&n, &b, "presence-x", member("u1")).await;
    assert_eq!(
        log.take(),
        [
            "app-id:occupied:presence-x",
            "app-id:member_added:presence-x:u1"
        ]
    );
    leave(&n, &a, "presence-x");
    assert!(log.take().is_empty(), "u1 still has a socket");
    leave(&n, &b, "presence-x");
    assert_eq!(
        log.take(),
        [
            "app-id:member_removed:presence-x:u1",
            "app-id:vacated:presence-x"
        ]
    );
}

#[tokio::test]
async fn cache_misses_counts_and_watched_publications() {
    let broker = Arc::new(LocalBroker::new());
    let (n, log) = node(&broker);
    let hub = n.hub_by_id("app-id").unwrap();
    let a = conn(&n);
    let cached = SubscribeOptions {
        cache: true,
        count: true,
        ..SubscribeOptions::default()
    };
    join(&n, &a, "cache-x", cached).await;
    assert_eq!(
        log.take(),
        ["app-id:occupied:cache-x", "app-id:cache_miss:cache-x"]
    );
    n.flush_counts();
    assert_eq!(log.take(), ["app-id:count:cache-x:1"]);

    let p = || Publication::new(NS, "cache-x".into(), "e".into(), json_string("d")).cached(true);
    n.publish(&hub, p()).await.unwrap();
    assert!(log.take().is_empty(), "nobody watches publications");
    let watch = n.watch_publications();
    n.publish(&hub, p()).await.unwrap();
    assert_eq!(log.take(), ["app-id:published:cache-x:e"]);
    drop(watch);
    n.publish(&hub, p()).await.unwrap();
    assert!(log.take().is_empty());

    // A second subscriber finds the cached event: no miss.
    join(
        &n,
        &conn(&n),
        "cache-x",
        SubscribeOptions {
            cache: true,
            ..SubscribeOptions::default()
        },
    )
    .await;
    assert!(log.take().is_empty());
}

#[tokio::test]
async fn a_cluster_reports_each_change_once() {
    let broker = Arc::new(LocalBroker::new());
    let nodes: Vec<_> = (0..3).map(|_| node(&broker)).collect();
    let conns: Vec<_> = nodes.iter().map(|(n, _)| conn(n)).collect();
    let all = |nodes: &[(Arc<Node>, Arc<Log>)]| -> Vec<String> {
        let mut v: Vec<String> = nodes.iter().flat_map(|(_, l)| l.take()).collect();
        v.sort();
        v
    };
    for ((n, _), c) in nodes.iter().zip(&conns) {
        join(n, c, "presence-room", member("u1")).await;
    }
    assert_eq!(
        all(&nodes),
        [
            "app-id:member_added:presence-room:u1",
            "app-id:occupied:presence-room"
        ],
        "three nodes joined: each change once"
    );
    // The first two leave: the channel and member are still on node 3.
    for ((n, _), c) in nodes.iter().zip(&conns).take(2) {
        leave(n, c, "presence-room");
    }
    assert!(all(&nodes).is_empty());
    leave(&nodes[2].0, &conns[2], "presence-room");
    assert_eq!(
        all(&nodes),
        [
            "app-id:member_removed:presence-room:u1",
            "app-id:vacated:presence-room"
        ]
    );
}

#[tokio::test]
async fn a_departed_nodes_members_and_channels_are_reported_once() {
    let broker = Arc::new(LocalBroker::new());
    let nodes: Vec<_> = (0..3).map(|_| node(&broker)).collect();
    let all = |nodes: &[(Arc<Node>, Arc<Log>)]| -> Vec<String> {
        let mut v: Vec<String> = nodes.iter().flat_map(|(_, l)| l.take()).collect();
        v.sort();
        v
    };
    join(
        &nodes[0].0,
        &conn(&nodes[0].0),
        "presence-room",
        member("stays"),
    )
    .await;
    let c = conn(&nodes[2].0);
    join(&nodes[2].0, &c, "presence-room", member("gone")).await;
    join(&nodes[2].0, &c, "only-there", SubscribeOptions::default()).await;
    all(&nodes);
    // The node goes without its sockets leaving (as when it dies): what
    // only it held is reported gone, once, by a remaining node.
    nodes[2].0.leave_cluster();
    assert_eq!(
        all(&nodes),
        [
            "app-id:member_removed:presence-room:gone",
            "app-id:vacated:only-there"
        ]
    );
}
