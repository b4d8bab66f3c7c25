//! Memory a publisher or a client can make Herald keep, held to its
//! bounds ("memory any publisher can pin"), over real sockets
//! against a real `herald`: cache channels' last events within
//! `max_cache_bytes` (by the metric and by the process's resident memory),
//! least recently used evicted first, expired ones freed by the sweep.

use crate::common;

use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

/// Resident memory of `pid`, in bytes.
fn rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// Publish one 10 KiB event on each of `channels` (10 per signed batch).
async fn publish_10k(server: &Server, channels: std::ops::Range<usize>, tag: &str) {
    let payload = "x".repeat(10_000);
    let path = format!("/apps/{APP_ID}/batch_events");
    let all: Vec<usize> = channels.collect();
    for chunk in all.chunks(10) {
        let batch: Vec<_> = chunk
            .iter()
            .map(|i| json!({ "name": tag, "channel": format!("cache-{i}"), "data": payload }))
            .collect();
        let body = json!({ "batch": batch }).to_string();
        let (status, reply) = server.api("POST", &path, &body).await;
        assert_eq!(status, 200, "batch refused: {reply}");
    }
}

const BUDGET: u64 = 1024 * 1024;

#[tokio::test]
async fn cache_channels_stay_within_their_byte_budget() {
    let server = Server::start_with("", &format!("max_cache_bytes = {BUDGET}")).await;
    // 300 channels × 10 KiB: about three megabytes of events for a budget
    // of one.
    publish_10k(&server, 0..300, "e").await;
    let bytes = server.metric("herald_cache_bytes").await;
    let events = server.metric("herald_cache_events").await;
    let evicted = server.metric("herald_cache_evictions_total").await;
    assert!(bytes <= BUDGET, "{bytes} cached bytes over the budget");
    // Each event costs its payload and one frame (about 20 KiB): the
    // budget holds about 50 of them, and is filled, not left mostly empty.
    assert!(bytes > BUDGET * 9 / 10, "{bytes} cached bytes");
    assert!((40..=52).contains(&events), "{events} cached events");
    assert_eq!(events + evicted, 300, "every event is cached or evicted");

    // The newest is replayed to a new subscriber; the oldest was evicted.
    let mut c = server.client().await;
    c.subscribe("cache-299").await;
    let f = c.expect("e", Some("cache-299")).await;
    assert_eq!(f["data"].as_str().map(str::len), Some(10_000));
    c.subscribe("cache-0").await;
    c.expect("pusher:cache_miss", Some("cache-0")).await;

    // A replay is a use: cache-250 (older than cache-299, replayed now)
    // outlives events published before it once more come in.
    c.subscribe("cache-250").await;
    c.expect("e", Some("cache-250")).await;
    publish_10k(&server, 300..340, "e").await;
    let mut d = server.client().await;
    d.subscribe("cache-250").await;
    d.expect("e", Some("cache-250")).await;
    d.subscribe("cache-260").await;
    d.expect("pusher:cache_miss", Some("cache-260")).await;
    assert!(server.metric("herald_cache_bytes").await <= BUDGET);
}

#[tokio::test]
async fn many_cache_channels_do_not_grow_resident_memory_past_the_budget() {
    let server = Server::start_with("", &format!("max_cache_bytes = {BUDGET}")).await;
    // Warm up (allocator arenas, the HTTP path) before the baseline.
    publish_10k(&server, 0..200, "warm").await;
    let before = rss(server.pid());
    // 4,000 channels × 10 KiB: 40 MB of payload (80 MB with frames) that
    // an unbounded cache would keep for 30 minutes.
    publish_10k(&server, 200..4200, "e").await;
    let after = rss(server.pid());
    let grew = after.saturating_sub(before);
    eprintln!(
        "RSS {} KiB before, {} KiB after 4,000 cache events of 10 KiB",
        before / 1024,
        after / 1024
    );
    assert!(
        grew < 16 * 1024 * 1024,
        "resident memory grew by {} KiB (before {} KiB, after {} KiB)",
        grew / 1024,
        before / 1024,
        after / 1024
    );
    assert!(server.metric("herald_cache_bytes").await <= BUDGET);
    assert!(server.metric("herald_cache_evictions_total").await >= 4000);
}

#[tokio::test]
async fn expired_cache_events_are_freed_without_being_looked_up() {
    // broker.ttl = 3 runs the housekeeping tick (and so the sweep) every
    // second.
    let server = Server::start_with("[broker]\nttl = 3", "cache_ttl = 2").await;
    publish_10k(&server, 0..20, "e").await;
    // Cached (on a busy machine the first may already have expired while
    // the last were published).
    let cached = server.metric("herald_cache_events").await;
    assert!((1..=20).contains(&cached), "{cached} events cached");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (events, bytes) = (
            server.metric("herald_cache_events").await,
            server.metric("herald_cache_bytes").await,
        );
        if events == 0 && bytes == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{events} events ({bytes} bytes) still cached 10 s after a 2 s TTL"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Expiry is not an eviction.
    assert_eq!(server.metric("herald_cache_evictions_total").await, 0);
}
