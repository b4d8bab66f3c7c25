//! Reliable publishing as a protocol asks the core for it: a followed
//! stream's publications come back from `publish_reliably` with their
//! positions, go out stamped with them and in that order, and can be read
//! again after a position; a stream nobody follows publishes as any other.

use herald_core::broker::local::LocalBroker;
use herald_core::config::{AppConfig, Config};
use herald_core::connection::{Connection, QueueLimit};
use herald_core::frame::Frame;
use herald_core::future::BoxFuture;
use herald_core::history::{Backlog, History, Limits, MemoryHistory, Miss};
use herald_core::hub::SubscribeOptions;
use herald_core::node::Node;
use herald_core::publication::{Event, Position, Publication, Wire};
use herald_core::reliable::ReliableStreams;
use herald_core::testing::NS;
use std::sync::Arc;

/// Frames that show a publication's position: `epoch:offset|data`, or
/// `-|data` without one.
struct PositionWire;

impl Wire for PositionWire {
    fn name(&self) -> &'static str {
        "position-test"
    }
    fn publication(&self, p: &Publication, _tag: &str) -> Frame {
        let at = p.position.as_ref().map_or("-".to_owned(), |pos| {
            format!("{}:{}", pos.epoch, pos.offset)
        });
        Frame::text(&format!("{at}|{}", p.data.get()))
    }
    fn event(&self, _e: &Event<'_>, _tag: &str) -> Option<Frame> {
        None
    }
}

const LIMITS: Limits = Limits {
    per_stream: 100,
    ttl_ms: 300_000,
    max_bytes: 1 << 20,
};

fn node() -> Arc<Node> {
    let config = Config {
        apps: vec![AppConfig::development()],
        ..Config::default()
    };
    Node::new(config, Arc::new(LocalBroker::new()))
}

fn publication(channel: &str, n: usize) -> Publication {
    let data = serde_json::value::RawValue::from_string(n.to_string()).unwrap();
    Publication::new(NS, channel.into(), String::new(), data)
}

async fn subscriber(node: &Node, channel: &str) -> Arc<Connection> {
    let limit = QueueLimit {
        frames: 4096,
        bytes: 1 << 22,
    };
    let c = Arc::new(Connection::new(1, "1.1".into(), &PositionWire, limit));
    let hub = node.hub_by_id("app-id").unwrap();
    node.subscribe(&hub, &c, NS, channel, SubscribeOptions::default())
        .await
        .unwrap();
    c
}

fn frames(c: &Connection) -> Vec<String> {
    let mut out = Vec::new();
    c.take(&mut out, usize::MAX);
    out.iter().map(|f| f.payload_text()).collect()
}

/// The in-process history, answering appends after a few turns of the
/// runtime, as an engine across the network would: publishers then
/// overtake each other unless publishing holds each stream's order.
struct Slow(MemoryHistory);

impl History for Slow {
    fn name(&self) -> &'static str {
        "slow"
    }
    fn retain(&self, stream: &str) {
        self.0.retain(stream)
    }
    fn any_reliable(&self) -> bool {
        self.0.any_reliable()
    }
    fn append(&self, stream: &str, data: &str) -> BoxFuture<Option<Position>> {
        let appended = self.0.append(stream, data);
        let turns = data.len() % 3 + 1;
        Box::pin(async move {
            let position = appended.await;
            for _ in 0..turns {
                tokio::task::yield_now().await;
            }
            position
        })
    }
    fn after(&self, stream: &str, epoch: &str, offset: u64) -> BoxFuture<Result<Backlog, Miss>> {
        self.0.after(stream, epoch, offset)
    }
    fn since(&self, stream: &str, unix_secs: u64) -> BoxFuture<Result<Backlog, Miss>> {
        self.0.since(stream, unix_secs)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_streams_publications_get_positions_in_order() {
    let node = node();
    let hub = node.hub_by_id("app-id").unwrap();
    let history = Arc::new(Slow(MemoryHistory::new(LIMITS)));
    let streams = Arc::new(ReliableStreams::with_history(history, LIMITS));
    streams.follow("room").await;
    let c = subscriber(&node, "room").await;

    // Many publishers at once: the offsets they are given are the order
    // the subscriber sees.
    let publishes = (0..200).map(|n| {
        let (node, hub, streams) = (node.clone(), hub.clone(), streams.clone());
        tokio::spawn(async move {
            node.publish_reliably(&hub, &streams, publication("room", n))
                .await
                .unwrap()
                .expect("a followed stream's publication has a position")
        })
    });
    let mut positions = Vec::new();
    for p in futures_util::future::join_all(publishes).await {
        positions.push(p.unwrap());
    }
    node.settle().await;
    let epoch = positions[0].epoch.clone();
    assert!(positions.iter().all(|p| p.epoch == epoch));
    let mut offsets: Vec<u64> = positions.iter().map(|p| p.offset).collect();
    offsets.sort_unstable();
    assert_eq!(offsets, (1..=200).collect::<Vec<u64>>());
    let seen: Vec<String> = frames(&c)
        .iter()
        .map(|f| f.split('|').next().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (1..=200).map(|o| format!("{epoch}:{o}")).collect();
    assert_eq!(seen, expected, "delivered out of offset order");

    // What a client that saw offset 198 missed, and nothing before it.
    let backlog = streams.after("room", &epoch, 198).await.unwrap();
    assert_eq!(
        backlog.entries.iter().map(|e| e.offset).collect::<Vec<_>>(),
        [199, 200]
    );
    assert_eq!(
        streams.after("room", "another-epoch", 198).await.err(),
        Some(Miss::UnknownEpoch)
    );
    // The history keeps its bound: the last 100.
    let kept = streams.since("room", 0).await.unwrap().entries;
    assert_eq!(kept.first().map(|e| e.offset), Some(101));
    assert_eq!(kept.len(), 100);
}

#[tokio::test]
async fn a_stream_nobody_follows_publishes_without_a_position() {
    let node = node();
    let hub = node.hub_by_id("app-id").unwrap();
    let streams = ReliableStreams::new(&*node.broker, LIMITS);
    streams.follow("room").await;
    let c = subscriber(&node, "lobby").await;
    let got = node
        .publish_reliably(&hub, &streams, publication("lobby", 1))
        .await
        .unwrap();
    assert_eq!(got, None);
    node.settle().await;
    assert_eq!(frames(&c), ["-|1"]);
    assert_eq!(
        streams.after("lobby", "e", 0).await.err(),
        Some(Miss::UnknownStream)
    );

    // With history off nothing is ever reliable, followed or not.
    let off = ReliableStreams::new(
        &*node.broker,
        Limits {
            per_stream: 0,
            ..LIMITS
        },
    );
    off.follow("room").await;
    let got = node
        .publish_reliably(&hub, &off, publication("room", 2))
        .await
        .unwrap();
    assert_eq!(got, None);
}

/// A gap in a stream's live offsets (another node's publications not yet
/// here, or lost by the broker) is filled from the history by the core's
/// healer, with the protocol's history frames, each publication once and
/// in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_in_the_live_offsets_is_filled_from_the_history() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static FILLED: AtomicUsize = AtomicUsize::new(0);
    let node = node();
    let hub = node.hub_by_id("app-id").unwrap();
    let history = Arc::new(MemoryHistory::new(LIMITS));
    let streams = Arc::new(ReliableStreams::with_history(history.clone(), LIMITS));
    streams.follow("room").await;
    let c = subscriber(&node, "room").await;
    c.with_gate().heal_with(streams.healer(
        &c,
        |gap, e, epoch| Frame::text(&format!("healed {epoch}:{}|{}", e.offset, gap.channel)),
        |filled| {
            if filled {
                FILLED.fetch_add(1, Ordering::Relaxed);
            }
        },
    ));

    // Offset 1 published here; 2 and 3 appended elsewhere (only in the
    // history); 4 published here reveals the gap.
    let first = node
        .publish_reliably(&hub, &streams, publication("room", 1))
        .await
        .unwrap()
        .unwrap();
    node.settle().await;
    history.append("room", "2").await.unwrap();
    history.append("room", "3").await.unwrap();
    node.publish_reliably(&hub, &streams, publication("room", 4))
        .await
        .unwrap();
    node.settle().await;
    let epoch = first.epoch;
    let expected = [
        format!("{epoch}:1|1"),
        format!("healed {epoch}:2|room"),
        format!("healed {epoch}:3|room"),
        format!("healed {epoch}:4|room"),
    ];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < expected.len() && std::time::Instant::now() < deadline {
        got.extend(frames(&c));
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(got, expected);
    assert_eq!(FILLED.load(Ordering::Relaxed), 1);
}
