//! `actioncable-v1-ext-json` sessions on a real `redis-server` with two
//! real herald nodes (issue 19): a snapshot of a session written by its old
//! node after another node took the session (`GETDEL`) is refused by the
//! compare-and-set, so the session does not come back and restores once.

#[macro_use]
mod common;

use common::ext::{cable, frame, ident, send};
use common::{Server, TIMEOUT};
use herald_broker::testing::{BrokerServer, Kind};
use serde_json::json;
use std::time::{Duration, Instant};

async fn values(r: &mut redis::aio::MultiplexedConnection, prefix: &str) -> Vec<String> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:sess:*"))
        .query_async(r)
        .await
        .unwrap();
    let mut out = Vec::new();
    for k in keys {
        let v: Option<String> = redis::cmd("GET").arg(k).query_async(r).await.unwrap();
        out.extend(v);
    }
    out
}

#[tokio::test]
async fn a_redis_session_taken_elsewhere_is_not_written_back_by_its_old_node() {
    let broker = BrokerServer::start(Kind::Redis);
    let prefix = format!("rs{}", std::process::id());
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"{prefix}\"\n[rpc]\npublic_streams = true\n",
        broker.url()
    );
    let n = [
        Server::start_with(&top, "").await,
        Server::start_with(&top, "").await,
    ];
    let mut r = redis::Client::open(broker.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut until_kept = async |what: &str| {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if values(&mut r, &prefix)
                .await
                .iter()
                .any(|v| v.contains(what))
            {
                return;
            }
            assert!(Instant::now() < deadline, "{what} never kept");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let mut old = cable(&n[0], "").await;
    let sid = frame(&mut old).await["sid"].as_str().unwrap().to_owned();
    send(
        &mut old,
        json!({ "command": "subscribe", "identifier": ident("first") }),
    )
    .await;
    assert_eq!(frame(&mut old).await["type"], "confirm_subscription");
    until_kept("first").await;
    // Node B takes the session while node A still serves it.
    let mut taker = cable(&n[1], &format!("?sid={sid}")).await;
    let welcome = frame(&mut taker).await;
    assert_eq!(welcome["restored"], true, "{welcome}");
    // A's session changes: A writes its snapshot again (refused now).
    send(
        &mut old,
        json!({ "command": "subscribe", "identifier": ident("second") }),
    )
    .await;
    assert_eq!(frame(&mut old).await["type"], "confirm_subscription");
    // A writes in order: once a session made after that write is on the
    // server, the write was tried.
    let mut later = cable(&n[0], "").await;
    frame(&mut later).await;
    send(
        &mut later,
        json!({ "command": "subscribe", "identifier": ident("barrier") }),
    )
    .await;
    assert_eq!(frame(&mut later).await["type"], "confirm_subscription");
    until_kept("barrier").await;
    let kept = values(&mut r, &prefix).await;
    assert!(
        !kept.iter().any(|v| v.contains("second")),
        "the taken session came back: {kept:?}"
    );
    let mut again = cable(&n[1], &format!("?sid={sid}")).await;
    let welcome = frame(&mut again).await;
    assert_eq!(welcome["type"], "welcome");
    assert!(
        welcome.get("restored").is_none(),
        "restored twice: {welcome}"
    );
}
