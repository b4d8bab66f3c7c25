//! A client that stops reading is closed with 4100 once its outbound queue
//! passes `outbound_bytes`, instead of growing server memory, and a healthy
//! client on the same channel receives every message meanwhile.

mod common;

use common::{data, Server, APP_ID};
use serde_json::json;

#[tokio::test]
async fn a_client_that_stops_reading_is_closed_and_others_get_everything() {
    // A frame bound far above what is sent: only the byte bound can trip.
    let s = Server::start_with("", "outbound_bytes = 262144\noutbound_queue = 100000").await;
    // A small fixed receive buffer: what the kernel may hold for a client
    // that reads nothing must stay small whatever the machine's sysctls.
    let mut slow = s.client_with_recv_buffer(64 * 1024).await;
    slow.subscribe_raw("firehose", None, None).await;
    slow.expect("pusher_internal:subscription_succeeded", Some("firehose"))
        .await;

    let mut healthy = s.client().await;
    healthy.subscribe_raw("firehose", None, None).await;
    healthy
        .expect("pusher_internal:subscription_succeeded", Some("firehose"))
        .await;
    // The healthy client reads everything until the closing marker.
    let reader = tokio::spawn(async move {
        let mut bulk = 0;
        loop {
            let f = healthy.recv().await;
            match f["event"].as_str() {
                Some("bulk") => bulk += 1,
                Some("done") => return bulk,
                _ => panic!("unexpected frame {f}"),
            }
        }
    });

    // Publish 100 KB batches until the server reports the slow client
    // closed: the kernel's buffers (the slow client's 64 KiB receive
    // buffer, the server's send buffer of at most `net.ipv4.tcp_wmem`'s
    // maximum, 4 MiB by default) and the 256 KiB queue fill after a few
    // megabytes. `slow` is not read from during this loop.
    let payload = "x".repeat(10_000);
    let path = format!("/apps/{APP_ID}/batch_events");
    let mut sent = 0;
    while slow_clients_closed(&s).await == 0 {
        assert!(
            sent < 3000,
            "the slow client was never cut off after {sent} events"
        );
        let batch: Vec<_> = (0..10)
            .map(|_| json!({ "channel": "firehose", "name": "bulk", "data": payload }))
            .collect();
        let (status, reply) = s
            .api("POST", &path, &json!({ "batch": batch }).to_string())
            .await;
        assert_eq!(status, 200, "{reply}");
        sent += 10;
    }
    s.trigger("firehose", "done", "{}").await;
    assert_eq!(
        reader.await.unwrap(),
        sent,
        "the healthy client lost messages"
    );

    // Now the slow client reads: what was queued before the overflow, then
    // the error and the close.
    let mut bulk = 0;
    loop {
        let f = slow.recv().await;
        match f["event"].as_str() {
            Some("bulk") => bulk += 1,
            Some("pusher:error") => {
                assert_eq!(data(&f)["code"], 4100, "{f}");
                break;
            }
            _ => panic!("unexpected frame {f}"),
        }
    }
    assert!(bulk < sent, "the slow client was never cut off");
    slow.expect_close(4100).await;
    assert_eq!(slow_clients_closed(&s).await, 1);
}

/// `herald_slow_clients_closed_total` from the server's metrics.
async fn slow_clients_closed(s: &Server) -> u64 {
    let (status, metrics) = s.raw_api("GET", "/metrics", "", "").await;
    assert_eq!(status, 200);
    let text = metrics.as_str().unwrap_or_default().to_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("herald_slow_clients_closed_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no herald_slow_clients_closed_total in {text}"))
}
