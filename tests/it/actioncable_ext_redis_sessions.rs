//! `actioncable-v1-ext-json` sessions on a real `redis-server` with two
//! real herald nodes: a live session is restored by no
//! one, a closed one not over another user's token, and once; a frozen
//! node's session restores on the other once it is declared gone, and
//! the node, back, does not write it back (the compare-and-set), so it
//! restores once.

use crate::common;

use common::ext::RESTORE_RPC;
use common::Server;
use herald_broker::testing::{BrokerServer, Kind};

/// The snapshot under `<prefix>:sess:*` whose text holds `marker`.
async fn stored(url: &str, prefix: &str, marker: &str) -> Option<String> {
    let mut r = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:sess:*"))
        .query_async(&mut r)
        .await
        .unwrap();
    for k in keys {
        let v: Option<String> = redis::cmd("GET").arg(k).query_async(&mut r).await.unwrap();
        if let Some(v) = v.filter(|v| v.contains(marker)) {
            return Some(v);
        }
    }
    None
}

/// Two nodes on `broker` under `prefix`, a 2 s broker TTL.
async fn two(broker: &BrokerServer, prefix: &str) -> [Server; 2] {
    let top = format!(
        "[broker]\nurl = \"{}\"\nprefix = \"{prefix}\"\nttl = 2\n[rpc]\n{RESTORE_RPC}\n",
        broker.url()
    );
    [
        Server::start_with(&top, "").await,
        Server::start_with(&top, "").await,
    ]
}

#[tokio::test]
async fn a_redis_session_restores_only_once_its_connection_is_gone() {
    let broker = BrokerServer::start(Kind::Redis);
    let prefix = format!("rs{}", std::process::id());
    let n = two(&broker, &prefix).await;
    let url = broker.url();
    common::ext::a_session_restores_only_once_its_connection_is_gone(
        &[&n[0], &n[1]],
        async |m: &str| stored(&url, &prefix, m).await,
    )
    .await;
}

#[tokio::test]
async fn a_frozen_redis_nodes_session_restores_elsewhere_once() {
    let broker = BrokerServer::start(Kind::Redis);
    let prefix = format!("rf{}", std::process::id());
    let n = two(&broker, &prefix).await;
    let url = broker.url();
    common::ext::a_frozen_nodes_session_restores_elsewhere_once(&n[0], &n[1], async |m: &str| {
        stored(&url, &prefix, m).await
    })
    .await;
}
