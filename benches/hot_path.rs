//! Micro-benchmarks of the hot path, in-process (no sockets): parsing a
//! client frame, and publishing one event to a channel's subscribers (encode
//! once, queue the shared bytes to each). `herald bench` measures the whole
//! server; these isolate Herald's own user-space cost per delivery.
//!
//! Run: `cargo bench --bench hot_path`

/// The channels' namespace (Pusher's: the benchmark's default protocol).
const NS: herald_core::namespace::Namespace = herald_pusher::names::NAMESPACE;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use herald_core::config::AppConfig;
use herald_core::connection::{Connection, QueueLimit};
use herald_core::fanout::deliver;
use herald_core::hub::{Hub, SubscribeOptions};
use herald_core::publication::{json_string, Publication};
use herald_pusher::wire::{self as pusher, WIRE};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn parse(c: &mut Criterion) {
    let frame = r#"{"event":"client-typing","channel":"private-chat.42","data":{"user":"ana","typing":true}}"#;
    let subscribe = r#"{"event":"pusher:subscribe","data":{"channel":"private-chat.42","auth":"app-key:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}}"#;
    let mut g = c.benchmark_group("parse");
    g.bench_function("client_event", |b| {
        b.iter(|| pusher::parse(black_box(frame)).unwrap())
    });
    g.bench_function("subscribe", |b| {
        b.iter(|| pusher::parse(black_box(subscribe)).unwrap())
    });
    g.finish();
}

fn hub_with_subscribers(n: usize) -> (Hub, Vec<Arc<Connection>>) {
    hub_with(n, &WIRE, |_| None)
}

/// `n` subscribers of `news` speaking `wire`, subscriber `i` with tag
/// `tag(i)` (AppSync: each its own subscription id).
fn hub_with(
    n: usize,
    wire: &'static dyn herald_core::publication::Wire,
    tag: impl Fn(u64) -> Option<String>,
) -> (Hub, Vec<Arc<Connection>>) {
    let hub = Hub::new(AppConfig::development());
    let limit = QueueLimit {
        frames: 64,
        bytes: 1 << 20,
    };
    let conns = (0..n as u64)
        .map(|i| {
            let conn = Arc::new(Connection::new(i, format!("1.{i}"), wire, limit));
            let opts = SubscribeOptions {
                tag: tag(i).map(Arc::from),
                ..SubscribeOptions::default()
            };
            hub.subscribe(&conn, NS, "news", opts).unwrap();
            conn.take(&mut Vec::new(), 64); // the subscription's acknowledgement
            conn
        })
        .collect();
    (hub, conns)
}

/// One publication to a channel's subscribers as a fan-out worker runs it:
/// the snapshot of the subscriber list, one frame built, queued to each.
fn publish(c: &mut Criterion) {
    let mut g = c.benchmark_group("publish");
    use herald_appsync::wire::{self as appsync, ChannelField};
    let gql_fields = [
        ("name".to_string(), ChannelField::Name),
        ("data".to_string(), ChannelField::Data),
    ];
    for (protocol, n) in [
        ("", 100usize),
        ("", 1000),
        ("appsync_events_", 1000),
        ("appsync_graphql_", 1000),
    ] {
        let (hub, conns) = match protocol {
            "appsync_events_" => hub_with(n, &appsync::EVENTS_WIRE, |i| {
                Some(appsync::events_tag(&format!(
                    "5f1c2a7e-0000-4000-8000-{i:012}"
                )))
            }),
            "appsync_graphql_" => hub_with(n, &appsync::GRAPHQL_WIRE, |i| {
                let id = format!("5f1c2a7e-0000-4000-8000-{i:012}");
                Some(appsync::graphql_tag(&id, "subscribe", "news", &gql_fields))
            }),
            _ => hub_with_subscribers(n),
        };
        let data = json_string(r#"{"title":"hello","body":"a short news item of typical size"}"#);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("{protocol}to_{n}_subscribers"), |b| {
            // Time only the fan-out; drain the queues (as the writers would)
            // between publishes so none fills up.
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut sink = Vec::new();
                for _ in 0..iters {
                    let p = Arc::new(Publication::new(
                        NS,
                        "news".into(),
                        "headline".into(),
                        data.clone(),
                    ));
                    let start = Instant::now();
                    for targets in hub.targets(&p) {
                        black_box(deliver(&p, &targets));
                    }
                    total += start.elapsed();
                    for conn in &conns {
                        conn.take(&mut sink, 64);
                        sink.clear();
                    }
                }
                total
            });
        });
    }
    g.finish();
}

criterion_group!(benches, parse, publish);
criterion_main!(benches);
