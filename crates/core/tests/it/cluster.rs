//! Several nodes in one process on the in-process broker, as a cluster:
//! publications reach every node's subscribers exactly once, presence and
//! users are the cluster's, queries answer for every node, control messages
//! reach every node, and a node that stops sending heartbeats has its
//! members removed everywhere.

use herald_core::broker::local::LocalBroker;
use herald_core::broker::Presence as _;
use herald_core::config::{AppConfig, Config};
use herald_core::connection::{Connection, QueueLimit, Reason};
use herald_core::hub::presence::Member;
use herald_core::hub::{StatsFilter, SubscribeOptions};
use herald_core::node::Node;
use herald_core::publication::{json_string, Publication};
use herald_core::testing::{TestWire, NS};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const LIMIT: QueueLimit = QueueLimit {
    frames: 1024,
    bytes: 1 << 20,
};

fn config() -> Config {
    Config {
        apps: vec![AppConfig::development()],
        ..Config::default()
    }
}

fn cluster(n: usize, broker: Arc<LocalBroker>) -> Vec<Arc<Node>> {
    (0..n)
        .map(|_| Node::new(config(), broker.clone()))
        .collect()
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

fn app(node: &Node) -> Arc<herald_core::hub::Hub> {
    node.hub_by_id("app-id").unwrap()
}

/// The frames queued to `c` since the last call, as text.
fn frames(c: &Connection) -> Vec<String> {
    let mut out = Vec::new();
    c.take(&mut out, usize::MAX);
    out.iter().map(|f| f.payload_text()).collect()
}

async fn settle(nodes: &[Arc<Node>]) {
    for n in nodes {
        n.settle().await;
    }
}

async fn join(node: &Node, c: &Arc<Connection>, channel: &str, user: Option<&str>) {
    let opts = SubscribeOptions {
        member: user.map(|u| Member {
            user_id: u.into(),
            info: None,
        }),
        max_members: 100,
        ..SubscribeOptions::default()
    };
    node.subscribe(&app(node), c, NS, channel, opts)
        .await
        .unwrap();
}

fn publication(channel: &str, data: &str) -> Publication {
    Publication::new(NS, channel.into(), "e".into(), json_string(data))
}

#[tokio::test]
async fn publications_reach_every_node_exactly_once() {
    let nodes = cluster(3, Arc::new(LocalBroker::new()));
    let subs: Vec<_> = nodes.iter().map(|n| conn(n)).collect();
    for (n, c) in nodes.iter().zip(&subs) {
        join(n, c, "news", None).await;
        frames(c);
    }
    nodes[0]
        .publish(&app(&nodes[0]), publication("news", "1"))
        .await
        .unwrap();
    nodes[2]
        .publish(&app(&nodes[2]), publication("news", "2"))
        .await
        .unwrap();
    settle(&nodes).await;
    for c in &subs {
        assert_eq!(
            frames(c),
            vec!["|e|news|\"1\"".to_string(), "|e|news|\"2\"".to_string()]
        );
    }
}

/// What each node receives on its own (an ingress every node subscribes
/// to) goes to its own subscribers only: one copy per subscriber.
#[tokio::test]
async fn publish_here_stays_on_its_node() {
    let nodes = cluster(3, Arc::new(LocalBroker::new()));
    let subs: Vec<_> = nodes.iter().map(|n| conn(n)).collect();
    for (n, c) in nodes.iter().zip(&subs) {
        join(n, c, "news", None).await;
        frames(c);
    }
    for n in &nodes {
        n.publish_here(&app(n), publication("news", "1")).await;
    }
    settle(&nodes).await;
    for c in &subs {
        assert_eq!(frames(c), vec!["|e|news|\"1\"".to_string()]);
    }
    nodes[1]
        .publish_here(&app(&nodes[1]), publication("news", "2"))
        .await;
    settle(&nodes).await;
    assert!(frames(&subs[0]).is_empty());
    assert_eq!(frames(&subs[1]), vec!["|e|news|\"2\"".to_string()]);
    assert!(frames(&subs[2]).is_empty());
}

#[tokio::test]
async fn only_interested_nodes_receive_a_channel() {
    let broker = Arc::new(LocalBroker::new());
    let nodes = cluster(3, broker.clone());
    let a = conn(&nodes[1]);
    join(&nodes[1], &a, "news", None).await;
    assert_eq!(broker.interested("app-id", NS, "news"), vec![nodes[1].id]);
    nodes[1].unsubscribe(&app(&nodes[1]), &a, NS, "news", &None, false);
    assert!(broker.interested("app-id", NS, "news").is_empty());
}

#[tokio::test]
async fn presence_is_the_clusters() {
    let nodes = cluster(3, Arc::new(LocalBroker::new()));
    let obs = conn(&nodes[0]);
    join(&nodes[0], &obs, "presence-room", Some("obs")).await;
    assert_eq!(frames(&obs), vec!["|subscribed|presence-room|obs"]);

    // One user, two sockets on two other nodes: one member, announced once.
    let s1 = conn(&nodes[1]);
    join(&nodes[1], &s1, "presence-room", Some("u1")).await;
    let s2 = conn(&nodes[2]);
    join(&nodes[2], &s2, "presence-room", Some("u1")).await;
    assert_eq!(frames(&obs), vec!["|member_added|presence-room|u1"]);
    // The second socket's member list holds the members of every node.
    let listed = frames(&s2);
    assert_eq!(listed.len(), 1);
    let mut members: Vec<&str> = listed[0].rsplit('|').next().unwrap().split(',').collect();
    members.sort();
    assert_eq!(members, ["obs", "u1"]);

    // Removed once, when its last socket anywhere leaves.
    nodes[1].unsubscribe(&app(&nodes[1]), &s1, NS, "presence-room", &None, false);
    assert!(frames(&obs).is_empty());
    nodes[2].unsubscribe(&app(&nodes[2]), &s2, NS, "presence-room", &None, false);
    assert_eq!(frames(&obs), vec!["|member_removed|presence-room|u1"]);
}

#[tokio::test]
async fn queries_answer_for_the_whole_cluster() {
    let nodes = cluster(3, Arc::new(LocalBroker::new()));
    for (i, n) in nodes.iter().take(2).enumerate() {
        let c = conn(n);
        join(n, &c, "presence-room", Some("u1")).await;
        let d = conn(n);
        join(n, &d, "presence-room", Some(&format!("only{i}"))).await;
        std::mem::forget((c, d));
    }
    // Asked on the node that has no subscriber at all.
    let stats = nodes[2]
        .stats(
            &app(&nodes[2]),
            Some(NS),
            StatsFilter::Exact("presence-room".into()),
        )
        .await;
    assert_eq!(stats.len(), 1);
    assert_eq!(stats[0].subscriptions, 4);
    assert_eq!(stats[0].users, ["only0", "only1", "u1"]);
    let all = nodes[2]
        .stats(
            &app(&nodes[2]),
            Some(NS),
            StatsFilter::Prefix("presence-".into()),
        )
        .await;
    assert_eq!(all.len(), 1);
}

#[tokio::test]
async fn terminate_reaches_every_node() {
    let nodes = cluster(3, Arc::new(LocalBroker::new()));
    let a = conn(&nodes[0]);
    let b = conn(&nodes[1]);
    nodes[0].sign_in(&app(&nodes[0]), &a, "u9", &[]);
    nodes[1].sign_in(&app(&nodes[1]), &b, "u9", &[]);
    nodes[2].terminate_user(&app(&nodes[2]), "u9");
    assert_eq!(a.close_requested(), Some(Reason::Terminated));
    assert_eq!(b.close_requested(), Some(Reason::Terminated));
}

#[tokio::test]
async fn watchlists_and_user_events_cross_nodes() {
    let nodes = cluster(2, Arc::new(LocalBroker::new()));
    let watcher = conn(&nodes[0]);
    let (online, offline) = nodes[0].sign_in(&app(&nodes[0]), &watcher, "w", &["u2".into()]);
    assert_eq!((online.len(), offline), (0, vec!["u2".to_string()]));
    let u2 = conn(&nodes[1]);
    nodes[1].sign_in(&app(&nodes[1]), &u2, "u2", &[]);
    assert_eq!(frames(&watcher), vec!["|watchlist|u2|"]);
    // An event to the user, published on the other node.
    let p = publication("#server-to-user-u2", "hi").to_user(Some("u2".into()));
    nodes[0].publish(&app(&nodes[0]), p).await.unwrap();
    settle(&nodes).await;
    assert_eq!(frames(&u2), vec!["|e|#server-to-user-u2|\"hi\""]);
    nodes[1].sign_out(&app(&nodes[1]), &u2, "u2", &[]);
    assert_eq!(frames(&watcher), vec!["|watchlist||u2"]);
}

#[tokio::test]
async fn patterns_match_at_segment_boundaries_across_nodes() {
    let nodes = cluster(2, Arc::new(LocalBroker::new()));
    let sub = conn(&nodes[1]);
    let opts = SubscribeOptions {
        pattern: true,
        ..SubscribeOptions::default()
    };
    nodes[1]
        .subscribe(&app(&nodes[1]), &sub, NS, "/ns/a/", opts)
        .await
        .unwrap();
    frames(&sub);
    for ch in ["/ns/a/b", "/ns/a/b/c", "/ns/ab", "/ns/b/a"] {
        nodes[0]
            .publish(&app(&nodes[0]), publication(ch, "x"))
            .await
            .unwrap();
    }
    settle(&nodes).await;
    assert_eq!(frames(&sub), vec!["|e|/ns/a/b|\"x\"", "|e|/ns/a/b/c|\"x\""]);
}

#[tokio::test]
async fn a_silent_node_has_its_members_removed_everywhere() {
    let broker = Arc::new(LocalBroker::with_ttl(Duration::from_millis(200)));
    let nodes = cluster(2, broker.clone());
    let obs = conn(&nodes[0]);
    join(&nodes[0], &obs, "presence-room", Some("obs")).await;
    let gone = conn(&nodes[1]);
    join(&nodes[1], &gone, "presence-room", Some("u5")).await;
    assert_eq!(frames(&obs)[1], "|member_added|presence-room|u5");
    // Node 1 stops sending heartbeats; node 0 keeps going. Wait for the
    // removal (bounded), not for a fixed time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    while seen.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        nodes[0].tick();
        seen = frames(&obs);
    }
    assert_eq!(seen, vec!["|member_removed|presence-room|u5"]);
    // Once, and the broker forgot the node's members.
    nodes[0].tick();
    assert!(frames(&obs).is_empty());
    let left = broker
        .members(
            "app-id",
            &herald_core::broker::Scope::Channel(herald_core::namespace::ChannelId(
                NS,
                "presence-room".into(),
            )),
            nodes[0].id,
        )
        .await;
    assert!(left.is_empty(), "{left:?}");
}
