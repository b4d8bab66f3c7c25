//! A client that stops reading is closed with 4100 once its outbound queue
//! passes `outbound_bytes` or `outbound_queue` (each on its own), instead of
//! growing server memory; a healthy client on the same channel receives
//! every message meanwhile, and a presence member cut off this way is
//! removed from its channels at once.

use crate::common;

use common::{data, next, Next, Server, APP_ID};
use futures_util::SinkExt;
use serde_json::json;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

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
    let bulk = drain_until_4100(&mut slow).await;
    assert!(bulk < sent, "the slow client was never cut off");
    slow.expect_close(4100).await;
    assert_eq!(slow_clients_closed(&s).await, 1);
}

/// Read a cut-off slow client: the `bulk` events queued before the
/// overflow, then `pusher:error` 4100. Returns how many events it got.
async fn drain_until_4100(slow: &mut common::Client) -> usize {
    let mut bulk = 0;
    loop {
        let f = slow.recv().await;
        match f["event"].as_str() {
            Some("bulk") => bulk += 1,
            Some("pusher:error") => {
                assert_eq!(data(&f)["code"], 4100, "{f}");
                return bulk;
            }
            _ => panic!("unexpected frame {f}"),
        }
    }
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

/// A presence member closed with 4100 for flooding (over
/// `max_messages_per_second`) that then goes silent, never answering the
/// close: the other members get `member_removed` at once, not after the
/// closing handshake's 2 s wait (docs/protocol.md: "The connection has left
/// all its channels before this wait").
#[tokio::test]
async fn a_presence_member_closed_for_flooding_is_removed_before_the_closing_handshake() {
    let s = Server::start_with("", "max_messages_per_second = 5").await;
    let ch = "presence-flood";
    let mut watcher = s.client().await;
    watcher.subscribe_presence(ch, "watcher", json!({})).await;
    let mut flooder = s.client().await;
    flooder.subscribe_presence(ch, "flooder", json!({})).await;
    let added = watcher
        .expect("pusher_internal:member_added", Some(ch))
        .await;
    assert_eq!(data(&added)["user_id"], "flooder", "{added}");

    // Wait out the rate window the subscribe opened, then send 10 pings
    // at once: the 6th is over the limit. The flooder then reads nothing,
    // so it never answers the server's close frame.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let sent_at = Instant::now();
    for _ in 0..10 {
        flooder
            .ws
            .feed(Message::text(r#"{"event":"pusher:ping","data":{}}"#))
            .await
            .expect("send");
    }
    flooder.ws.flush().await.expect("send");

    let f = watcher
        .expect("pusher_internal:member_removed", Some(ch))
        .await;
    let delay = sent_at.elapsed();
    assert_eq!(data(&f)["user_id"], "flooder", "{f}");
    assert!(
        delay < Duration::from_secs(1),
        "member_removed came {delay:?} after the flood that closed the member"
    );

    // The flooder was closed for its rate: pongs, then 4100.
    loop {
        let f = flooder.recv().await;
        if f["event"] == "pusher:pong" {
            continue;
        }
        assert_eq!(f["event"], "pusher:error", "{f}");
        assert_eq!(data(&f)["code"], 4100, "{f}");
        break;
    }
    flooder.expect_close(4100).await;
}

/// A presence member that stops reading is cut off by the slow-client
/// limit, and the other members learn it left (`member_removed`) within a
/// second of the server deciding to close it: the connection leaves its
/// channels at once, not after its writes or the closing handshake time
/// out (docs/protocol.md: "a silent client never delays member_removed").
///
/// The queue overflows while the session is blocked writing a batch to the
/// full socket; the session watches close requests during the write, so it
/// does not wait for the write's 10 s timeout.
#[tokio::test]
async fn a_presence_member_that_stops_reading_is_removed_within_a_second() {
    let s = Server::start_with("", "outbound_bytes = 262144\noutbound_queue = 100000").await;
    let ch = "presence-firehose";
    let mut watcher = s.client().await;
    watcher.subscribe_presence(ch, "watcher", json!({})).await;
    let mut slow = s.client_with_recv_buffer(64 * 1024).await;
    slow.subscribe_presence(ch, "slow", json!({})).await;
    let added = watcher
        .expect("pusher_internal:member_added", Some(ch))
        .await;
    assert_eq!(data(&added)["user_id"], "slow", "{added}");

    // The watcher reads everything, and reports when `slow` is removed.
    let (removed_tx, removed_rx) = tokio::sync::oneshot::channel();
    let reader = tokio::spawn(async move {
        let mut removed_tx = Some(removed_tx);
        let mut bulk = 0;
        loop {
            // Longer than any server timeout, so a late member_removed is
            // measured and reported rather than cut short here.
            let f = match tokio::time::timeout(Duration::from_secs(30), next(&mut watcher.ws))
                .await
                .expect("the watcher got nothing for 30 s")
            {
                Next::Frame(f) => f,
                Next::Close(c) => panic!("the watcher was closed ({c:?})"),
            };
            match f["event"].as_str() {
                Some("bulk") => bulk += 1,
                Some("pusher_internal:member_removed") => {
                    assert_eq!(data(&f)["user_id"], "slow", "{f}");
                    let at = Instant::now();
                    removed_tx
                        .take()
                        .expect("one member_removed")
                        .send(at)
                        .unwrap();
                }
                Some("done") => return bulk,
                _ => panic!("unexpected frame {f}"),
            }
        }
    });

    // Publish until the server decides to close `slow`. It decides while
    // queueing one of these batches (nothing else is sent to it), so the
    // decision is no earlier than the start of the last call: measuring
    // from there can only overstate the delay, never hide one.
    let payload = "x".repeat(10_000);
    let path = format!("/apps/{APP_ID}/batch_events");
    let mut sent = 0;
    let decided_no_earlier_than = loop {
        assert!(
            sent < 3000,
            "the slow member was never cut off after {sent} events"
        );
        let batch: Vec<_> = (0..10)
            .map(|_| json!({ "channel": ch, "name": "bulk", "data": payload }))
            .collect();
        let call = Instant::now();
        let (status, reply) = s
            .api("POST", &path, &json!({ "batch": batch }).to_string())
            .await;
        assert_eq!(status, 200, "{reply}");
        sent += 10;
        if slow_clients_closed(&s).await > 0 {
            break call;
        }
    };

    let removed_at = tokio::time::timeout(Duration::from_secs(30), removed_rx)
        .await
        .expect("no member_removed for the slow member within 30 s of its close")
        .expect("the watcher's reader ended early");
    let delay = removed_at.saturating_duration_since(decided_no_earlier_than);
    assert!(
        delay < Duration::from_secs(1),
        "member_removed came {delay:?} after the server decided to close the slow member"
    );

    // Only the watcher is left, it got every event, and only `slow` was cut.
    let (status, users) = s
        .api("GET", &format!("/apps/{APP_ID}/channels/{ch}/users"), "")
        .await;
    assert_eq!(status, 200, "{users}");
    assert_eq!(users, json!({ "users": [{ "id": "watcher" }] }));
    s.trigger(ch, "done", "{}").await;
    assert_eq!(reader.await.unwrap(), sent, "the watcher lost messages");
    assert_eq!(slow_clients_closed(&s).await, 1);

    // What reaches `slow` when it reads again: some of the events, and at
    // most a 4100 close; never anything after it.
    let mut bulk = 0;
    loop {
        match next(&mut slow.ws).await {
            Next::Frame(f) if f["event"] == "bulk" => bulk += 1,
            Next::Frame(f) => {
                assert_eq!(f["event"], "pusher:error", "{f}");
                assert_eq!(data(&f)["code"], 4100, "{f}");
                slow.expect_close(4100).await;
                break;
            }
            Next::Close(c) => {
                assert!(matches!(c, None | Some(4100)), "closed with {c:?}");
                break;
            }
        }
    }
    assert!(bulk < sent, "the slow member was never cut off");
}

/// `outbound_queue`, the queue's bound in frames, cuts a slow client off on
/// its own: `outbound_bytes` is set far above everything this test sends,
/// so only the frame count can trip, and the client sees 4100.
#[tokio::test]
async fn the_frame_limit_alone_closes_a_slow_client_with_4100() {
    // 1 GiB of bytes against at most 700 events of 60 KB (42 MB) sent.
    let s = Server::start_with(
        "",
        "outbound_queue = 16\noutbound_bytes = 1073741824\nmax_payload = 65536",
    )
    .await;
    let mut slow = s.client_with_recv_buffer(64 * 1024).await;
    slow.subscribe("frames").await;

    // `slow` is not read from during this loop: once the kernel's buffers
    // are full, 16 queued frames are the limit. Large events keep the
    // kernel's share small in frames: its buffers (at most
    // `net.ipv4.tcp_wmem`'s maximum, 4 MiB by default, plus the client's
    // 64 KiB) hold about 70 of them, 280 at a 16 MiB maximum. So the cut
    // comes well before 700 events with a 16-frame queue, and could not
    // with the default 1024: the configured value is the one in force.
    let payload = "x".repeat(60_000);
    let path = format!("/apps/{APP_ID}/batch_events");
    let mut sent = 0;
    while slow_clients_closed(&s).await == 0 {
        assert!(
            sent < 700,
            "the slow client was never cut off after {sent} events: \
             outbound_queue = 16 did not limit its queue"
        );
        let batch: Vec<_> = (0..10)
            .map(|_| json!({ "channel": "frames", "name": "bulk", "data": payload }))
            .collect();
        let (status, reply) = s
            .api("POST", &path, &json!({ "batch": batch }).to_string())
            .await;
        assert_eq!(status, 200, "{reply}");
        sent += 10;
    }

    // What was queued before the overflow, then the error and the close.
    let bulk = drain_until_4100(&mut slow).await;
    eprintln!("cut off after {sent} events sent, {bulk} delivered");
    assert!(bulk < sent, "the slow client was never cut off");
    slow.expect_close(4100).await;
    assert_eq!(slow_clients_closed(&s).await, 1);
}
