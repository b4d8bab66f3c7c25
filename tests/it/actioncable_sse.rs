//! Server-Sent Events (`/events`) under hostile clients, against a real
//! herald over raw TCP: a client that stops reading is closed as a slow
//! consumer and counted, while a client that reads on the same stream
//! gets every message in order; an SSE stream counts against the app's
//! `max_connections` like a WebSocket. (Real `EventSource` clients are in
//! conformance/tests/actioncable_sse.test.mjs.)

use crate::common;

use common::ext::broadcast;
use common::{Server, TIMEOUT};
use serde_json::json;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `GET /events?query` on a socket whose receive buffer is `recv` bytes
/// (a fixed one: the kernel's autotuning would let a client that never
/// reads absorb megabytes).
async fn sse(server: &Server, query: &str, recv: Option<u32>) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    if let Some(bytes) = recv {
        socket.set_recv_buffer_size(bytes).unwrap();
    }
    let addr = format!("127.0.0.1:{}", server.port).parse().unwrap();
    let mut s = tokio::time::timeout(TIMEOUT, socket.connect(addr))
        .await
        .expect("connect timed out")
        .expect("connect");
    let req = format!(
        "GET /events?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    s
}

/// Read until what was read contains `needle` (each read within
/// [`TIMEOUT`]); all of it.
async fn read_until(s: &mut TcpStream, got: &mut String, needle: &str) {
    let mut buf = vec![0u8; 64 * 1024];
    // Only the last read (and a needle's length before it) can hold it new.
    let has = |got: &str| {
        let from = got.len().saturating_sub(64 * 1024 + needle.len());
        got.as_bytes()[from..]
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
    };
    while !has(got) {
        let n = tokio::time::timeout(TIMEOUT, s.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no {needle:?} in {:?}", &got[..got.len().min(300)]))
            .unwrap();
        assert!(n > 0, "closed before {needle:?}: {got}");
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

#[tokio::test]
async fn a_client_that_stops_reading_is_closed_and_a_reading_one_gets_everything() {
    let server = Server::start_with(
        "[rpc]\npublic_streams = true\nsse = true",
        "outbound_queue = 32",
    )
    .await;
    let mut slow = sse(&server, "stream=flood", Some(4096)).await;
    let mut got = String::new();
    read_until(&mut slow, &mut got, "confirm_subscription").await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.contains("content-type: text/event-stream"), "{got}");

    const N: u64 = 300;
    let pad = "x".repeat(32 * 1024);
    let mut fast = sse(&server, "stream=flood", None).await;
    let mut seen = String::new();
    read_until(&mut fast, &mut seen, "confirm_subscription").await;
    let reader = tokio::spawn(async move {
        read_until(&mut fast, &mut seen, &format!("\"n\":{N},")).await;
        (fast, seen)
    });
    for n in 1..=N {
        broadcast(&server, "flood", json!({ "n": n, "pad": pad })).await;
    }
    let (_fast, seen) = tokio::time::timeout(std::time::Duration::from_secs(60), reader)
        .await
        .expect("the reading client got everything in time")
        .unwrap();
    let ns: Vec<u64> = seen
        .lines()
        .filter_map(|l| l.strip_prefix("data: {\"n\":"))
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ns, (1..=N).collect::<Vec<_>>(), "every message, in order");
    let ids = seen.lines().filter(|l| l.starts_with("id: ")).count() as u64;
    assert_eq!(ids, N, "every message has its position");

    // The client that stopped reading is dropped (its queue overflowed,
    // or a write waited past the deadline); the reader stays.
    let sse_conns = [("protocol", "actioncable-sse")];
    let deadline = Instant::now() + std::time::Duration::from_secs(40);
    while server.metric_where("herald_connections", &sse_conns).await > 1 {
        assert!(
            Instant::now() < deadline,
            "the client that stopped reading is still connected"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let scrape = server.scrape().await;
    let closed = |reason| {
        common::metric_in(
            &scrape,
            "herald_connections_closed_total",
            &[("protocol", "actioncable-sse"), ("reason", reason)],
        )
        .unwrap_or(0)
    };
    assert_eq!(
        closed("slow_consumer") + closed("write_error"),
        1,
        "closed as slow: {:?}",
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == "herald_connections_closed_total")
            .map(|s| format!("{:?} {:?}", s.labels, s.value))
            .collect::<Vec<_>>()
    );
    drop(slow);
}

#[tokio::test]
async fn an_sse_stream_counts_against_max_connections() {
    let server = Server::start_with(
        "[rpc]\npublic_streams = true\nsse = true",
        "max_connections = 1",
    )
    .await;
    let mut first = sse(&server, "stream=a", None).await;
    let mut got = String::new();
    read_until(&mut first, &mut got, "confirm_subscription").await;
    let mut second = sse(&server, "stream=a", None).await;
    let mut refused = String::new();
    read_until(&mut second, &mut refused, "\r\n\r\n").await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert_eq!(server.metric("herald_sse_refused_total").await, 1);
    // Gone, its place is free again.
    drop(first);
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut again = sse(&server, "stream=a", None).await;
        let mut text = String::new();
        read_until(&mut again, &mut text, "\r\n\r\n").await;
        if text.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "the place never freed: {text}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
