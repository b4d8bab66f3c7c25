//! Several nodes in one process, each with its own engine, over a real
//! `redis-server` or `nats-server` started here on a free loopback port:
//! the multi-node contract of crates/core/tests/it/cluster.rs, through the
//! network. Every test runs on both engines. Everything waits for what it
//! expects with a deadline; nothing sleeps and hopes.

use herald_broker::engine::Engine;
use herald_broker::testing::{BrokerServer, Kind};
use herald_core::broker::Cluster as _;
use herald_core::config::{AppConfig, BrokerConfig, Config};
use herald_core::connection::{Connection, QueueLimit, Reason};
use herald_core::hub::presence::Member;
use herald_core::hub::{Hub, StatsFilter, SubscribeOptions};
use herald_core::node::Node;
use herald_core::publication::{json_string, Publication};
use herald_core::testing::{TestWire, NS};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const LIMIT: QueueLimit = QueueLimit {
    frames: 4096,
    bytes: 1 << 22,
};
const TIMEOUT: Duration = Duration::from_secs(10);

fn config(url: &str, prefix: &str, ttl: u64, app: AppConfig) -> Config {
    Config {
        apps: vec![app],
        broker: BrokerConfig {
            url: url.into(),
            prefix: prefix.into(),
            ttl,
            ..BrokerConfig::default()
        },
        ..Config::default()
    }
}

struct Cluster {
    broker: BrokerServer,
    nodes: Vec<Arc<Node>>,
    engines: Vec<Arc<Engine>>,
    tickers: Vec<tokio::task::JoinHandle<()>>,
}

impl Cluster {
    async fn start(kind: Kind, n: usize, ttl: u64) -> Cluster {
        Cluster::with_app(kind, n, ttl, AppConfig::development()).await
    }

    async fn with_app(kind: Kind, n: usize, ttl: u64, app: AppConfig) -> Cluster {
        let broker = BrokerServer::start(kind);
        let prefix = format!("t{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let mut nodes = Vec::new();
        let mut engines = Vec::new();
        let mut tickers = Vec::new();
        for _ in 0..n {
            let c = config(&broker.url(), &prefix, ttl, app.clone());
            let ttl = c.broker.ttl();
            let engine = Arc::new(
                match kind {
                    Kind::Redis => herald_broker::redis::engine(&broker.url(), &prefix, ttl, None),
                    Kind::Nats => herald_broker::nats::engine(&broker.url(), &prefix, ttl, 1, None),
                }
                .unwrap(),
            );
            let node = Node::new(c, engine.clone());
            tickers.push(tokio::spawn(ticker(node.clone())));
            nodes.push(node);
            engines.push(engine);
        }
        let cluster = Cluster {
            broker,
            nodes,
            engines,
            tickers,
        };
        cluster.wait_connected().await;
        cluster
    }

    /// Every node connected and knowing every other.
    async fn wait_connected(&self) {
        let n = self.nodes.len();
        until("every node connected and knowing the others", || {
            self.engines
                .iter()
                .all(|e| e.connected() && e.shared().peers() == n - 1)
        })
        .await;
    }
}

/// The node's housekeeping, as the server runs it (heartbeats at a third
/// of the TTL, counts every 50 ms here).
async fn ticker(node: Arc<Node>) {
    let mut beat = tokio::time::interval(node.broker.ttl() / 3);
    let mut counts = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            _ = beat.tick() => node.tick(),
            _ = counts.tick() => node.flush_counts(),
        }
    }
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

fn app(node: &Node) -> Arc<Hub> {
    node.hub_by_id("app-id").unwrap()
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

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Collects a connection's frames until `n` have arrived (or panics).
async fn frames(c: &Connection, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while out.len() < n {
        let mut got = Vec::new();
        c.take(&mut got, usize::MAX);
        out.extend(got.iter().map(|f| f.payload_text()));
        if out.len() >= n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {n} frames; got {out:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    out
}

/// Waits until a frame containing `needle` arrives at `c`.
async fn wait_for(c: &Connection, needle: &str) {
    let deadline = Instant::now() + TIMEOUT;
    let mut seen = Vec::new();
    loop {
        seen.extend(queued(c));
        if seen.iter().any(|f| f.contains(needle)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{needle:?} never came; got {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Whatever is queued now.
fn queued(c: &Connection) -> Vec<String> {
    let mut got = Vec::new();
    c.take(&mut got, usize::MAX);
    got.iter().map(|f| f.payload_text()).collect()
}

/// A marker published on `node` to `channel` arrives at `c` after anything
/// sent to `c` before it (one publisher's order): proof that nothing else
/// was sent in between.
async fn quiet(node: &Node, c: &Connection, channel: &str) -> Vec<String> {
    let m = format!("m{}", NEXT.fetch_add(1, Ordering::Relaxed));
    node.publish(&app(node), publication(channel, &m))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        seen.extend(queued(c));
        if let Some(i) = seen.iter().position(|f| f.contains(&m)) {
            seen.remove(i);
            return seen;
        }
        assert!(Instant::now() < deadline, "marker never came; got {seen:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

macro_rules! both {
    ($name:ident) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$name(Kind::Redis).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn nats() {
                super::$name(Kind::Nats).await
            }
        }
    };
}

both!(exactly_once_in_order);
async fn exactly_once_in_order(kind: Kind) {
    let c = Cluster::start(kind, 3, 30).await;
    let subs: Vec<_> = c.nodes.iter().map(|n| conn(n)).collect();
    for (n, s) in c.nodes.iter().zip(&subs) {
        join(n, s, "news", None).await;
        frames(s, 1).await;
    }
    for i in 0..50 {
        let node = &c.nodes[i % 3];
        node.publish(&app(node), publication("news", &i.to_string()))
            .await
            .unwrap();
    }
    for s in &subs {
        let got = frames(s, 50).await;
        // Each publisher's messages in order; 50 in all, each once.
        let mut ids: Vec<usize> = got
            .iter()
            .map(|f| {
                f.rsplit('|')
                    .next()
                    .unwrap()
                    .trim_matches('"')
                    .parse()
                    .unwrap()
            })
            .collect();
        for k in 0..3 {
            let mine: Vec<usize> = ids.iter().copied().filter(|i| i % 3 == k).collect();
            assert!(mine.windows(2).all(|w| w[0] < w[1]), "{mine:?}");
        }
        ids.sort_unstable();
        assert_eq!(ids, (0..50).collect::<Vec<_>>());
    }
    // Nothing more arrives.
    let extra = quiet(&c.nodes[0], &subs[1], "news").await;
    assert!(extra.is_empty(), "{extra:?}");
}

both!(only_interested_nodes_subscribe);
async fn only_interested_nodes_subscribe(kind: Kind) {
    let c = Cluster::start(kind, 2, 30).await;
    let a = conn(&c.nodes[1]);
    join(&c.nodes[1], &a, "news", None).await;
    let before = herald_core::metrics::BROKER_RECEIVED.get();
    // Node 0 has no subscriber: node 1's publications do not reach it
    // (process-wide counter: node 1 ignores its own, node 0 never gets it).
    c.nodes[1]
        .publish(&app(&c.nodes[1]), publication("news", "x"))
        .await
        .unwrap();
    frames(&a, 2).await;
    // A publication node 1 does receive, sent after: proves the first one
    // had its chance to arrive.
    c.nodes[0]
        .publish(&app(&c.nodes[0]), publication("news", "y"))
        .await
        .unwrap();
    frames(&a, 1).await;
    let after = herald_core::metrics::BROKER_RECEIVED.get();
    // Other tests run in parallel; this one received at least "y", and the
    // per-node check is in the subject names: node 0 never subscribed.
    assert!(after > before);
}

both!(presence_is_the_clusters);
async fn presence_is_the_clusters(kind: Kind) {
    let c = Cluster::start(kind, 3, 30).await;
    let n = &c.nodes;
    let obs = conn(&n[0]);
    join(&n[0], &obs, "presence-room", Some("obs")).await;
    assert_eq!(frames(&obs, 1).await, vec!["|subscribed|presence-room|obs"]);

    let s1 = conn(&n[1]);
    join(&n[1], &s1, "presence-room", Some("u1")).await;
    let s2 = conn(&n[2]);
    join(&n[2], &s2, "presence-room", Some("u1")).await;
    assert_eq!(
        frames(&obs, 1).await,
        vec!["|member_added|presence-room|u1"]
    );
    let listed = frames(&s2, 1).await;
    let mut members: Vec<&str> = listed[0].rsplit('|').next().unwrap().split(',').collect();
    members.sort();
    assert_eq!(members, ["obs", "u1"]);
    // The API's list agrees on every node.
    for node in n {
        let stats = node
            .stats(
                &app(node),
                Some(NS),
                StatsFilter::Exact("presence-room".into()),
            )
            .await;
        assert_eq!(stats[0].users, ["obs", "u1"]);
        assert_eq!(stats[0].subscriptions, 3);
    }

    n[1].unsubscribe(&app(&n[1]), &s1, NS, "presence-room", &None, false);
    let extra = quiet(&n[1], &obs, "presence-room").await;
    assert!(extra.is_empty(), "{extra:?}");
    n[2].unsubscribe(&app(&n[2]), &s2, NS, "presence-room", &None, false);
    assert_eq!(
        frames(&obs, 1).await,
        vec!["|member_removed|presence-room|u1"]
    );
}

both!(terminate_and_users_across_nodes);
async fn terminate_and_users_across_nodes(kind: Kind) {
    let c = Cluster::start(kind, 3, 30).await;
    let n = &c.nodes;
    let watcher = conn(&n[0]);
    let (_, offline) = n[0].sign_in(&app(&n[0]), &watcher, "w", &["u2".into()]);
    assert_eq!(offline, vec!["u2".to_string()]);
    let u2 = conn(&n[1]);
    n[1].sign_in(&app(&n[1]), &u2, "u2", &[]);
    assert_eq!(frames(&watcher, 1).await, vec!["|watchlist|u2|"]);
    let p = publication("#server-to-user-u2", "hi").to_user(Some("u2".into()));
    n[2].publish(&app(&n[2]), p).await.unwrap();
    assert_eq!(frames(&u2, 1).await, vec!["|e|#server-to-user-u2|\"hi\""]);
    n[2].terminate_user(&app(&n[2]), "u2");
    until("u2 terminated", || {
        u2.close_requested() == Some(Reason::Terminated)
    })
    .await;
    n[1].sign_out(&app(&n[1]), &u2, "u2", &[]);
    assert_eq!(frames(&watcher, 1).await, vec!["|watchlist||u2"]);
}

both!(patterns_once_at_segment_boundaries);
async fn patterns_once_at_segment_boundaries(kind: Kind) {
    let c = Cluster::start(kind, 2, 30).await;
    let n = &c.nodes;
    let sub = conn(&n[1]);
    for (ch, pattern) in [("/ns/a/", true), ("/ns/", true), ("/ns/a/b", false)] {
        let opts = SubscribeOptions {
            pattern,
            tag: Some(Arc::from(ch)),
            ..SubscribeOptions::default()
        };
        n[1].subscribe(&app(&n[1]), &sub, NS, ch, opts)
            .await
            .unwrap();
    }
    queued(&sub);
    for ch in ["/ns/a/b", "/ns/a/b/c", "/ns/ab", "/other/a/b"] {
        n[0].publish(&app(&n[0]), publication(ch, "x"))
            .await
            .unwrap();
    }
    // Every matching subscription of the node gets each message once (the
    // node receives one copy from the broker however many match).
    let mut got = frames(&sub, 6).await;
    got.sort();
    assert_eq!(
        got,
        vec![
            "/ns/a/b|e|/ns/a/b|\"x\"",
            "/ns/a/|e|/ns/a/b/c|\"x\"",
            "/ns/a/|e|/ns/a/b|\"x\"",
            "/ns/|e|/ns/a/b/c|\"x\"",
            "/ns/|e|/ns/a/b|\"x\"",
            "/ns/|e|/ns/ab|\"x\"",
        ]
    );
    let extra = quiet(&n[0], &sub, "/ns/a/b").await;
    // The marker itself reaches the other two matching subscriptions.
    assert_eq!(extra.len(), 2, "{extra:?}");
}

both!(silent_node_is_removed_within_the_ttl);
async fn silent_node_is_removed_within_the_ttl(kind: Kind) {
    let c = Cluster::start(kind, 2, 2).await;
    let n = &c.nodes;
    let obs = conn(&n[0]);
    join(&n[0], &obs, "presence-room", Some("obs")).await;
    let gone = conn(&n[1]);
    join(&n[1], &gone, "presence-room", Some("u5")).await;
    assert_eq!(frames(&obs, 2).await[1], "|member_added|presence-room|u5");
    // Node 1 stops its heartbeats (as if frozen or killed).
    c.tickers[1].abort();
    let t0 = Instant::now();
    assert_eq!(
        frames(&obs, 1).await,
        vec!["|member_removed|presence-room|u5"]
    );
    let took = t0.elapsed();
    assert!(took <= Duration::from_millis(2000 + 1500), "{took:?}");
    let stats = n[0]
        .stats(
            &app(&n[0]),
            Some(NS),
            StatsFilter::Exact("presence-room".into()),
        )
        .await;
    assert_eq!(stats[0].users, ["obs"]);
}

both!(graceful_leave_is_immediate);
async fn graceful_leave_is_immediate(kind: Kind) {
    let c = Cluster::start(kind, 2, 30).await;
    let n = &c.nodes;
    let obs = conn(&n[0]);
    join(&n[0], &obs, "presence-room", Some("obs")).await;
    let s = conn(&n[1]);
    join(&n[1], &s, "presence-room", Some("u6")).await;
    assert_eq!(frames(&obs, 2).await[1], "|member_added|presence-room|u6");
    n[1].leave_cluster();
    n[1].broker.flush().await;
    assert_eq!(
        frames(&obs, 1).await,
        vec!["|member_removed|presence-room|u6"]
    );
}

both!(cache_channels_share_their_last_event);
async fn cache_channels_share_their_last_event(kind: Kind) {
    let c = Cluster::start(kind, 2, 30).await;
    let n = &c.nodes;
    // Published on node 0, where nobody listens; a subscriber on node 1.
    n[0].publish(&app(&n[0]), publication("cache-x", "last").cached(true))
        .await
        .unwrap();
    n[0].settle().await;
    let s = conn(&n[1]);
    let opts = SubscribeOptions {
        cache: true,
        ..SubscribeOptions::default()
    };
    n[1].subscribe(&app(&n[1]), &s, NS, "cache-x", opts)
        .await
        .unwrap();
    assert_eq!(
        frames(&s, 2).await,
        vec!["|subscribed|cache-x|", "|e|cache-x|\"last\""]
    );
}

both!(subscription_counts_are_cluster_totals);
async fn subscription_counts_are_cluster_totals(kind: Kind) {
    let c = Cluster::start(kind, 3, 30).await;
    let n = &c.nodes;
    let opts = || SubscribeOptions {
        count: true,
        ..SubscribeOptions::default()
    };
    let mut conns = Vec::new();
    for (i, node) in n.iter().enumerate() {
        for _ in 0..=i {
            let s = conn(node);
            node.subscribe(&app(node), &s, NS, "counted", opts())
                .await
                .unwrap();
            conns.push(s);
        }
    }
    // Six subscriptions over three nodes: every subscriber ends at 6.
    for s in &conns {
        let deadline = Instant::now() + TIMEOUT;
        let mut last = String::new();
        while !last.ends_with("|count|counted|6") {
            if let Some(f) = queued(s).into_iter().rfind(|f| f.contains("|count|")) {
                last = f;
            }
            assert!(Instant::now() < deadline, "count never reached 6: {last}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

both!(connection_limit_counts_the_cluster);
async fn connection_limit_counts_the_cluster(kind: Kind) {
    let app_cfg = AppConfig {
        max_connections: 3,
        ..AppConfig::development()
    };
    let c = Cluster::with_app(kind, 2, 1, app_cfg).await;
    let n = &c.nodes;
    for _ in 0..2 {
        app(&n[0]).admit().unwrap();
    }
    // Node 1 learns node 0's two with its next heartbeat: then one more
    // fits there, not two (alone it would take three).
    let h1 = app(&n[1]);
    until("node 1 counting node 0's connections", || {
        h1.admit().unwrap();
        let second = h1.admit();
        if second.is_ok() {
            h1.release();
        }
        h1.release();
        second.is_err()
    })
    .await;
}

both!(broker_restart_resumes_delivery_and_reconciles);
async fn broker_restart_resumes_delivery_and_reconciles(kind: Kind) {
    let mut c = Cluster::start(kind, 2, 30).await;
    let n = c.nodes.clone();
    let obs = conn(&n[0]);
    join(&n[0], &obs, "presence-room", Some("obs")).await;
    let s = conn(&n[1]);
    join(&n[1], &s, "presence-room", Some("u7")).await;
    let t = conn(&n[1]);
    join(&n[1], &t, "presence-room", Some("u8")).await;
    frames(&obs, 3).await;

    c.broker.kill();
    until("both nodes see the broker down", || {
        n.iter().all(|node| !node.broker.connected())
    })
    .await;
    // Local delivery goes on; the publication for the other node is held
    // in the outbox (an acknowledgement is true) and delivered once the broker is back.
    n[0].publish(&app(&n[0]), publication("presence-room", "during"))
        .await
        .unwrap();
    assert!(frames(&obs, 1).await[0].contains("during"));
    assert!(herald_core::metrics::BROKER_OUTBOX.get() > 0);
    // u7 leaves while the broker is away.
    n[1].unsubscribe(&app(&n[1]), &s, NS, "presence-room", &None, false);

    c.broker.restart();
    c.wait_connected().await;
    wait_for(&t, "during").await;
    // The state exchanged on reconnect removes u7 on node 0, once.
    assert_eq!(
        frames(&obs, 1).await,
        vec!["|member_removed|presence-room|u7"]
    );
    // Delivery resumes both ways.
    n[1].publish(&app(&n[1]), publication("presence-room", "after"))
        .await
        .unwrap();
    assert!(frames(&obs, 1).await[0].contains("after"));
    n[0].publish(&app(&n[0]), publication("presence-room", "back"))
        .await
        .unwrap();
    wait_for(&t, "back").await;
    let stats = n[0]
        .stats(
            &app(&n[0]),
            Some(NS),
            StatsFilter::Exact("presence-room".into()),
        )
        .await;
    assert_eq!(stats[0].users, ["obs", "u8"]);
}

/// What a node's observers heard: (`changed` or `seen`, what).
#[derive(Default)]
struct Heard(parking_lot::Mutex<Vec<(&'static str, String)>>);

fn line(change: &herald_core::observer::Change<'_>) -> String {
    use herald_core::observer::Change;
    match change {
        Change::Occupied { channel } => format!("occupied:{channel}"),
        Change::Vacated { channel } => format!("vacated:{channel}"),
        Change::MemberAdded { channel, user_id } => format!("added:{channel}:{user_id}"),
        Change::MemberRemoved { channel, user_id } => format!("removed:{channel}:{user_id}"),
        _ => String::new(),
    }
}

impl herald_core::observer::Observer for Heard {
    fn changed(
        &self,
        _app: &str,
        _ns: herald_core::namespace::Namespace,
        change: &herald_core::observer::Change<'_>,
    ) {
        let l = line(change);
        if !l.is_empty() {
            self.0.lock().push(("changed", l));
        }
    }
    fn seen(
        &self,
        _app: &str,
        _ns: herald_core::namespace::Namespace,
        change: &herald_core::observer::Change<'_>,
    ) {
        self.0.lock().push(("seen", line(change)));
    }
}

impl Heard {
    fn has(&self, kind: &str, what: &str) -> bool {
        self.0.lock().iter().any(|(k, w)| *k == kind && w == what)
    }
    fn count(&self, kind: &str) -> usize {
        self.0.lock().iter().filter(|(k, _)| *k == kind).count()
    }
}

both!(the_oldest_node_reports_the_others_see);
async fn the_oldest_node_reports_the_others_see(kind: Kind) {
    let c = Cluster::start(kind, 2, 30).await;
    let heard: Vec<Arc<Heard>> = c
        .nodes
        .iter()
        .map(|n| {
            let h = Arc::new(Heard::default());
            n.observe(h.clone());
            h
        })
        .collect();
    let age = |i: usize| (c.engines[i].shared().born(), c.nodes[i].id);
    let (leader, other) = if age(0) < age(1) { (0, 1) } else { (1, 0) };
    // A subscriber and a member on the younger node only.
    let s = conn(&c.nodes[other]);
    join(&c.nodes[other], &s, "presence-r", Some("u1")).await;
    until("the leader reports", || {
        heard[leader].has("changed", "occupied:presence-r")
            && heard[leader].has("changed", "added:presence-r:u1")
    })
    .await;
    until("the other sees", || {
        heard[other].has("seen", "occupied:presence-r")
            && heard[other].has("seen", "added:presence-r:u1")
    })
    .await;
    c.nodes[other].unsubscribe(&app(&c.nodes[other]), &s, NS, "presence-r", &None, false);
    until("the leader reports the leave", || {
        heard[leader].has("changed", "vacated:presence-r")
            && heard[leader].has("changed", "removed:presence-r:u1")
    })
    .await;
    until("the other sees the leave", || {
        heard[other].has("seen", "vacated:presence-r")
    })
    .await;
    assert_eq!(heard[other].count("changed"), 0, "only the leader reports");
    assert_eq!(heard[leader].count("seen"), 0);
    assert_eq!(heard[leader].count("changed"), 4);
}
