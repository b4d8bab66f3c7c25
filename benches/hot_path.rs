//! Micro-benchmarks of the hot path, in-process (no sockets): parsing a
//! client frame, and publishing one event to a channel's subscribers (encode
//! once, queue the shared bytes to each). `herald bench` measures the whole
//! server; these isolate Herald's own user-space cost per delivery.
//!
//! Run: `cargo bench --bench hot_path`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use herald::config::AppConfig;
use herald::connection::{Connection, QueueLimit};
use herald::fanout::{deliver, json_string, Publication};
use herald::hub::{Hub, SubscribeOptions};
use herald::wire::{self as pusher, WIRE};
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
    let hub = Hub::new(AppConfig::development());
    let limit = QueueLimit {
        frames: 64,
        bytes: 1 << 20,
    };
    let conns = (0..n as u64)
        .map(|i| {
            let conn = Arc::new(Connection::new(i, format!("1.{i}"), &WIRE, limit));
            hub.subscribe(&conn, "news", SubscribeOptions::default())
                .unwrap();
            conn.take(&mut Vec::new(), 64); // subscription_succeeded
            conn
        })
        .collect();
    (hub, conns)
}

/// One publication to a channel's subscribers as a fan-out worker runs it:
/// the snapshot of the subscriber list, one frame built, queued to each.
fn publish(c: &mut Criterion) {
    let mut g = c.benchmark_group("publish");
    for n in [100usize, 1000] {
        let (hub, conns) = hub_with_subscribers(n);
        let data = json_string(r#"{"title":"hello","body":"a short news item of typical size"}"#);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("to_{n}_subscribers"), |b| {
            // Time only the fan-out; drain the queues (as the writers would)
            // between publishes so none fills up.
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut sink = Vec::new();
                for _ in 0..iters {
                    let p = Arc::new(Publication::new(
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
