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
    let mut slow = s.client().await;
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

    // 30 MB: far more than the kernel's socket buffers plus the 256 KiB
    // queue can hold for a client that reads nothing. `slow` is not read
    // from during this loop.
    let payload = "x".repeat(10_000);
    let path = format!("/apps/{APP_ID}/batch_events");
    for _ in 0..300 {
        let batch: Vec<_> = (0..10)
            .map(|_| json!({ "channel": "firehose", "name": "bulk", "data": payload }))
            .collect();
        let (status, reply) = s
            .api("POST", &path, &json!({ "batch": batch }).to_string())
            .await;
        assert_eq!(status, 200, "{reply}");
    }
    s.trigger("firehose", "done", "{}").await;
    assert_eq!(
        reader.await.unwrap(),
        3000,
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
    assert!(bulk < 3000, "the slow client was never cut off");
    slow.expect_close(4100).await;

    let (status, metrics) = s.raw_api("GET", "/metrics", "", "").await;
    assert_eq!(status, 200);
    let text = metrics.as_str().unwrap_or_default().to_owned();
    let closed: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("herald_slow_clients_closed_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(closed >= 1, "{text}");
}
