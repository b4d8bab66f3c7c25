//! Direct writes (docs/architecture.md, "Connection"): a quiet
//! connection's frames are written to its socket by the fan-out itself,
//! counted like the session's writes; a frame that a full socket cuts
//! short is finished before anything else reaches that client, pongs
//! included, and the stream stays whole.

use crate::common;

use common::{data, Server, APP_ID};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;

/// Longer than the server's busy window (50 ms): a connection last written
/// to this long ago is quiet, and its next frame is written directly.
const QUIET: Duration = Duration::from_millis(150);

#[tokio::test]
async fn a_quiet_subscriber_is_written_by_the_fan_out_and_counted() {
    let s = Server::start().await;
    let mut c = s.client().await;
    c.subscribe("quiet").await;
    let labels = [("app", APP_ID), ("protocol", "pusher")];
    for i in 0..3 {
        tokio::time::sleep(QUIET).await;
        let direct = s.metric("herald_direct_writes_total").await;
        let sent = s.metric_where("herald_messages_sent_total", &labels).await;
        s.trigger("quiet", "tick", &format!("{{\"n\":{i}}}")).await;
        let f = c.expect("tick", Some("quiet")).await;
        assert_eq!(data(&f)["n"], i, "{f}");
        assert!(
            s.metric("herald_direct_writes_total").await > direct,
            "event {i} to a quiet subscriber was not written directly"
        );
        assert!(
            s.metric_where("herald_messages_sent_total", &labels).await > sent,
            "a direct write was not counted as sent"
        );
    }
}

#[tokio::test]
async fn a_frame_cut_by_a_full_socket_is_finished_before_anything_else() {
    // Every frame direct when nothing waits (no coalescing delay), and
    // room in the queue for everything this test sends.
    // A long activity timeout: the client reads nothing for as long as the
    // publishing takes, which on a busy machine can outlast the default's
    // ping and pong deadline.
    let s = Server::start_with(
        "write_delay_ms = 0\nactivity_timeout = 900",
        "outbound_bytes = 16777216\noutbound_queue = 100000",
    )
    .await;
    let mut slow = s.client_with_recv_buffer(64 * 1024).await;
    slow.subscribe("firehose").await;

    // The client reads nothing while events of 10 KB are published, until
    // a direct write was cut short by the full socket.
    let payload = "x".repeat(10_000);
    let bulk = |n: u64| json!({ "n": n, "p": payload }).to_string();
    let mut sent = 0u64;
    while s.metric("herald_direct_writes_cut_total").await == 0 {
        assert!(sent < 2000, "no direct write was cut after {sent} events");
        s.trigger("firehose", "bulk", &bulk(sent)).await;
        sent += 1;
    }
    // A WebSocket ping while the cut frame's rest waits: its pong must not
    // land inside that frame. Then a few more events behind it.
    slow.ws
        .send(Message::Ping(b"mid".to_vec().into()))
        .await
        .expect("ping");
    for _ in 0..5 {
        s.trigger("firehose", "bulk", &bulk(sent)).await;
        sent += 1;
    }

    // Now it reads: every event whole and in order, and the pong.
    let mut next_n = 0u64;
    let mut pongs = 0;
    while next_n < sent || pongs == 0 {
        let msg = tokio::time::timeout(Duration::from_secs(10), slow.ws.next())
            .await
            .expect("the client got nothing for 10 s")
            .expect("the stream ended")
            .expect("a broken WebSocket stream");
        match msg {
            Message::Pong(p) => {
                assert_eq!(&p[..], b"mid");
                pongs += 1;
            }
            Message::Text(t) => {
                let f: Value = serde_json::from_str(&t).expect("JSON");
                // On a busy machine the publishing can outlast the
                // activity timeout: the server's own ping is not an event.
                if f["event"] == "pusher:ping" {
                    continue;
                }
                assert_eq!(f["event"], "bulk", "{f}");
                let d = data(&f);
                assert_eq!(d["n"], next_n, "out of order");
                assert_eq!(d["p"].as_str().map(str::len), Some(10_000));
                next_n += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(pongs, 1);
    assert_eq!(s.metric("herald_slow_clients_closed_total").await, 0);
}

#[tokio::test]
async fn direct_writes_off_leaves_every_frame_to_the_session() {
    let s = Server::start_with("direct_writes = false", "").await;
    let mut c = s.client().await;
    c.subscribe("quiet").await;
    tokio::time::sleep(QUIET).await;
    s.trigger("quiet", "tick", "{\"n\":0}").await;
    let f = c.expect("tick", Some("quiet")).await;
    assert_eq!(data(&f)["n"], 0, "{f}");
    assert_eq!(s.metric("herald_direct_writes_total").await, 0);
}
