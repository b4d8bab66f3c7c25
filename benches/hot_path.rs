//! Micro-benchmarks of the hot path, in-process (no sockets): parsing a
//! client frame, and publishing one event to a channel's subscribers (encode
//! once, queue the shared bytes to each). `herald bench` measures the whole
//! server; these isolate Herald's own user-space cost per delivery.
//!
//! Run: `cargo bench --bench hot_path`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use herald::broker::local::LocalBroker;
use herald::config::AppConfig;
use herald::connection::{Connection, QueueLimit};
use herald::fanout::{json_string, Frame, Publication};
use herald::hub::Hub;
use herald::protocol::{pusher, Protocol};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::Receiver;

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

fn hub_with_subscribers(n: usize) -> (Hub, Vec<(Arc<Connection>, Receiver<Frame>)>) {
    let hub = Hub::new(AppConfig::development(), 1, Arc::new(LocalBroker::new()));
    let limit = QueueLimit {
        frames: 64,
        bytes: 1 << 20,
    };
    let conns = (0..n as u64)
        .map(|i| {
            let (conn, mut rx) = Connection::new(i, format!("1.{i}"), Protocol::Pusher, limit);
            let conn = Arc::new(conn);
            hub.subscribe(&conn, "news", None, None).unwrap();
            while rx.try_recv().is_ok() {} // subscription_succeeded
            (conn, rx)
        })
        .collect();
    (hub, conns)
}

fn publish(c: &mut Criterion) {
    let mut g = c.benchmark_group("publish");
    for n in [100usize, 1000] {
        let (hub, mut conns) = hub_with_subscribers(n);
        let data = json_string(r#"{"title":"hello","body":"a short news item of typical size"}"#);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("to_{n}_subscribers"), |b| {
            // Time only the publish; drain the queues (as the writers would)
            // between publishes so none fills up.
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let p = Publication::new(
                        "news".into(),
                        "headline".into(),
                        data.clone(),
                        None,
                        None,
                    );
                    let start = Instant::now();
                    hub.publish(p);
                    total += start.elapsed();
                    for (conn, rx) in conns.iter_mut() {
                        while let Ok(f) = rx.try_recv() {
                            conn.dequeued(&f);
                        }
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
