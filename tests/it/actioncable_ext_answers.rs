//! A history answer larger than the connection's outbound queue
//! (several streams × `history_limit` messages, asked for at once after a
//! restore) reaches a client that reads, whole and in order, without it
//! being cut as too slow; and another client's live deliveries on the same
//! stream are untouched meanwhile. Against a real herald whose app's
//! `outbound_queue` (32 frames) is far below one answer (100 messages).

use crate::common;

use common::ext::{broadcast, cable, frame, ident, send};
use common::{Server, TIMEOUT};
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const STREAMS: usize = 3;
const MESSAGES: u64 = 100;

#[tokio::test]
async fn history_answers_larger_than_the_queue_reach_a_reading_client_whole() {
    let server = Server::start_with(
        "[rpc]\npublic_streams = true\nhistory_limit = 100",
        "outbound_queue = 32",
    )
    .await;
    let streams: Vec<String> = (0..STREAMS).map(|i| format!("big{i}")).collect();
    // A subscribes to every stream, and leaves.
    let mut a = cable(&server, "").await;
    let welcome = frame(&mut a).await;
    let sid = welcome["sid"].as_str().unwrap().to_owned();
    for s in &streams {
        send(
            &mut a,
            json!({ "command": "subscribe", "identifier": ident(s) }),
        )
        .await;
        assert_eq!(frame(&mut a).await["type"], "confirm_subscription");
    }
    // B follows the first stream live throughout.
    let mut b = cable(&server, "").await;
    frame(&mut b).await;
    send(
        &mut b,
        json!({ "command": "subscribe", "identifier": ident(&streams[0]) }),
    )
    .await;
    assert_eq!(frame(&mut b).await["type"], "confirm_subscription");
    a.close(None).await.unwrap();
    drop(a);

    // While A is away, every stream gets MESSAGES publications.
    for n in 1..=MESSAGES {
        for s in &streams {
            broadcast(&server, s, json!({ "n": n, "s": s })).await;
        }
    }
    // B got each of its stream's messages live, in order.
    let mut epochs = Vec::new();
    for n in 1..=MESSAGES {
        let f = frame(&mut b).await;
        assert_eq!(
            (f["offset"].as_u64(), &f["message"]["n"]),
            (Some(n), &json!(n))
        );
        if n == 1 {
            epochs.push(f["epoch"].as_str().unwrap().to_owned());
        }
    }

    // A comes back restored and asks for all of it at once, as
    // @anycable/core does after a restore: since the start of time.
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut a = loop {
        let mut ws = cable(&server, &format!("?sid={sid}")).await;
        if frame(&mut ws).await["restored"] == true {
            break ws;
        }
        assert!(std::time::Instant::now() < deadline, "never restored");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    for s in &streams {
        send(
            &mut a,
            json!({ "command": "history", "identifier": ident(s), "history": { "since": 1 } }),
        )
        .await;
    }
    // Each subscription's answer: its MESSAGES in order, then its
    // confirm_history; `frame` panics if the server closes instead.
    for s in &streams {
        for n in 1..=MESSAGES {
            let f = frame(&mut a).await;
            assert_eq!(f["identifier"], json!(ident(s)), "{f}");
            assert_eq!(
                (f["offset"].as_u64(), &f["message"]["n"]),
                (Some(n), &json!(n))
            );
        }
        assert_eq!(
            frame(&mut a).await,
            json!({ "type": "confirm_history", "identifier": ident(s) })
        );
    }
    // Both are still served: the next publication reaches each once.
    broadcast(&server, &streams[0], json!({ "n": MESSAGES + 1 })).await;
    for ws in [&mut a, &mut b] {
        let f = frame(ws).await;
        assert_eq!(f["offset"].as_u64(), Some(MESSAGES + 1), "{f}");
    }
    assert_eq!(server.metric("herald_slow_clients_closed_total").await, 0);
}

/// An answer that would hold more than `rpc.history_max_bytes` waiting past
/// the queue's bound is refused with `reject_history`; the client stays
/// connected and served. (On one node only a request for about all the
/// node keeps can be: here the node keeps 20,000 bytes of history, and a
/// restored client asks for all of it.)
#[tokio::test]
async fn a_history_answer_over_history_max_bytes_is_rejected_and_the_client_stays() {
    let server = Server::start_with(
        "[rpc]\npublic_streams = true\nhistory_limit = 100\nhistory_max_bytes = 20000",
        "outbound_queue = 32",
    )
    .await;
    let mut a = cable(&server, "").await;
    let sid = frame(&mut a).await["sid"].as_str().unwrap().to_owned();
    send(
        &mut a,
        json!({ "command": "subscribe", "identifier": ident("full") }),
    )
    .await;
    assert_eq!(frame(&mut a).await["type"], "confirm_subscription");
    a.close(None).await.unwrap();
    drop(a);
    let pad = "x".repeat(150);
    for n in 1..=MESSAGES {
        broadcast(&server, "full", json!({ "n": n, "pad": pad })).await;
    }
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut a = loop {
        let mut ws = cable(&server, &format!("?sid={sid}")).await;
        if frame(&mut ws).await["restored"] == true {
            break ws;
        }
        assert!(std::time::Instant::now() < deadline, "never restored");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    send(
        &mut a,
        json!({ "command": "history", "identifier": ident("full"), "history": { "since": 1 } }),
    )
    .await;
    assert_eq!(
        frame(&mut a).await,
        json!({ "type": "reject_history", "identifier": ident("full") })
    );
    broadcast(&server, "full", json!({ "n": MESSAGES + 1 })).await;
    assert_eq!(frame(&mut a).await["offset"].as_u64(), Some(MESSAGES + 1));
    assert_eq!(
        server.metric("herald_cable_history_rejected_total").await,
        1
    );
}

/// History answers have a node-wide budget
/// (`rpc.history_answers_max_bytes`), and a connection whose socket does
/// not drain gets no second answer. A client that stops reading asks for
/// two streams' history (1,000 messages of 30 KB each, 30 MB an answer)
/// at once: its first answer is queued, and while it sits unwritten the
/// second request is not even read, so the node's answer bytes never pass
/// one answer. Meanwhile a reading client asking for one stream (which
/// alone fits the 40 MB budget) is refused with `reject_history` and
/// counted; once the stuck client is cut at the write deadline its bytes
/// leave the account and the same request is answered whole.
#[tokio::test]
async fn history_answers_share_a_node_budget_and_a_socket_not_draining_gets_no_more() {
    const LIMIT: u64 = 1000;
    const SIZE: usize = 30_000;
    let budget = 40_000_000u64;
    let server = Server::start_with(
        &format!(
            "[rpc]\npublic_streams = true\nhistory_limit = {LIMIT}\n\
             history_max_bytes = 100000000\nhistory_answers_max_bytes = {budget}"
        ),
        "",
    )
    .await;
    let streams = ["wide1", "wide2"];
    // Someone follows both streams (they become reliable), and leaves.
    let mut f = cable(&server, "").await;
    frame(&mut f).await;
    for s in streams {
        send(
            &mut f,
            json!({ "command": "subscribe", "identifier": ident(s) }),
        )
        .await;
        assert_eq!(frame(&mut f).await["type"], "confirm_subscription");
    }
    f.close(None).await.unwrap();
    drop(f);
    let pad = "x".repeat(SIZE);
    for s in streams {
        for first in (1..=LIMIT).step_by(25) {
            let batch: Vec<_> = (first..first + 25)
                .map(|n| json!({ "stream": s, "data": json!({ "n": n, "pad": pad }).to_string() }))
                .collect();
            let resp = reqwest::Client::new()
                .post(server.url("/_broadcast"))
                .timeout(TIMEOUT)
                .body(serde_json::Value::Array(batch).to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 201);
        }
    }
    // One answer's bytes on the wire: each message and its frame's
    // members (under 200 bytes).
    let answer = LIMIT * (SIZE as u64 + 200);

    // The stuck client: a small receive buffer, and it never reads. It
    // subscribes to both streams asking for their history, back to back.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let tcp = socket
        .connect(format!("127.0.0.1:{}", server.port).parse().unwrap())
        .await
        .unwrap();
    let mut req = format!("ws://127.0.0.1:{}/cable", server.port)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("sec-websocket-protocol", common::ext::EXT.parse().unwrap());
    let (mut stuck, _) =
        tokio_tungstenite::client_async(req, tokio_tungstenite::MaybeTlsStream::Plain(tcp))
            .await
            .unwrap();
    for s in streams {
        send(
            &mut stuck,
            json!({ "command": "subscribe", "identifier": ident(s), "history": { "since": 1 } }),
        )
        .await;
    }
    // Its first answer waits, most of it still in the server's queue.
    let deadline = std::time::Instant::now() + TIMEOUT;
    while server.metric("herald_history_answer_bytes").await < answer / 2 {
        assert!(std::time::Instant::now() < deadline, "no answer queued");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // A reading client's answer (30 MB) would fit the budget alone, not
    // beside the stuck one's: refused, counted, and the client stays.
    let mut b = cable(&server, "").await;
    frame(&mut b).await;
    send(
        &mut b,
        json!({ "command": "subscribe", "identifier": ident("wide1"), "history": { "since": 1 } }),
    )
    .await;
    assert_eq!(frame(&mut b).await["type"], "confirm_subscription");
    assert_eq!(
        frame(&mut b).await,
        json!({ "type": "reject_history", "identifier": ident("wide1") })
    );
    assert_eq!(
        server
            .metric("herald_cable_history_over_budget_total")
            .await,
        1
    );

    // Until the stuck client is cut (it never reads: the write deadline),
    // the node never holds more than its one answer: its second request
    // waits unread behind it.
    let deadline = std::time::Instant::now() + 3 * TIMEOUT;
    loop {
        let held = server.metric("herald_history_answer_bytes").await;
        assert!(
            held <= answer,
            "{held} bytes of answers queued: a second answer"
        );
        if held == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the stuck client stayed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    drop(stuck);

    // Its bytes left the account: the same request is answered whole.
    send(
        &mut b,
        json!({ "command": "history", "identifier": ident("wide1"), "history": { "since": 1 } }),
    )
    .await;
    for n in 1..=LIMIT {
        let f = frame(&mut b).await;
        assert_eq!(f["message"]["n"], json!(n), "{}", f["offset"]);
    }
    assert_eq!(
        frame(&mut b).await,
        json!({ "type": "confirm_history", "identifier": ident("wide1") })
    );
}
