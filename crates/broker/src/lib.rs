//! Herald's cluster engines: several `herald serve` processes behave as
//! one server through a Redis server (pub/sub), a Redis Cluster (sharded
//! pub/sub) or a NATS server (core subjects). Stream history and resumable sessions live on the same
//! server (Redis Streams and keys; JetStream and a key-value bucket). Both implement herald-core's broker traits
//! (one per concern, together [`Broker`](herald_core::broker::Broker))
//! with the same cluster logic; the transports only move bytes. See
//! docs/cluster.md.
//!
//! ```text
//! engine/     the cluster logic, by concern:
//!   mod         shared state, the engine handle
//!   pubsub      subjects, publications, interest, counts
//!   presence    members per node, reconciliation, occupancy decisions
//!   liveness    heartbeats, the leader, burying silent nodes, reconnects
//!   queries     request/reply: figures, members, a cache's last event
//!   inbound     messages from the transport, dispatched by kind
//!   interest    when the broker holds the node's interest (confirmations wait)
//! subject     subject / Redis channel names (namespace included)
//! msg         the messages on the wire
//! tally       cluster-wide first/last holders (occupied, member added)
//! redis, nats the transports
//!   └ nats_tls_probe  why a NATS server refuses the node's TLS, in words
//! redis_cluster  the Redis Cluster transport (sharded pub/sub)
//!   ├ redis_shards  the canary through every master
//!   └ redis_conn  one command connection type for a server or a cluster
//! jetstream   history and sessions on NATS JetStream
//! ingress     AnyCable-style broadcasts from the app (Redis/NATS)
//! redis_master   where the Redis master is (one server, or asked of Sentinels)
//! redis_streams  history and sessions on the Redis server
//!   └ redis_sessions  resumable session snapshots (compare-and-set writes)
//! urls        `broker.url` checked at start; NATS server lists
//! tls         `broker.tls_ca` / `tls_cert` / `tls_key`, checked at start
//! testing     real redis-server / nats-server for tests (feature `testing`)
//!   testing_sentinel  a master, a replica and three sentinels
//!   testing_tls       their TLS: certificates, authority, client certificates
//!   testing_delay     a relay that delays a link (a slow NATS route)
//! ```

pub mod engine;
pub mod ingress;
pub mod jetstream;
pub mod msg;
pub mod nats;
pub mod nats_tls_probe;
pub mod redis;
pub mod redis_cluster;
pub mod redis_conn;
pub mod redis_master;
pub mod redis_sessions;
pub mod redis_shards;
pub mod redis_streams;
pub mod subject;
pub mod tally;
/// Test helpers: only with the `testing` feature (dev-dependencies) or in
/// the crate's own unit tests.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
/// A slow link for the test servers (same feature as [`testing`]).
#[cfg(any(test, feature = "testing"))]
pub mod testing_delay;
/// A Sentinel-watched Redis for tests (same feature as [`testing`]).
#[cfg(any(test, feature = "testing"))]
pub mod testing_sentinel;
/// TLS for the test servers (same feature as [`testing`]).
#[cfg(any(test, feature = "testing"))]
pub mod testing_tls;
pub mod tls;
pub mod urls;

use herald_core::broker::local::LocalBroker;
use herald_core::broker::Broker;
use herald_core::config::BrokerConfig;
use std::sync::Arc;

/// The engine `config` names: the in-process one for `local`, else Redis
/// or NATS. Networked engines connect in the background (call inside a
/// Tokio runtime); until they are connected the node serves its own
/// clients and `connected()` is false.
pub fn from_config(config: &BrokerConfig) -> Result<Arc<dyn Broker>, String> {
    let url = config.url.as_str();
    let bad = |e: String| format!("broker.url {:?}: {e}", config.shown_url());
    let (every, deadline) = config.canary();
    let journal = engine::journal::Limits::of(config);
    let kind = urls::check(config)?;
    let tls = tls::BrokerTls::load(config)?;
    let tls = tls.as_ref();
    Ok(match kind {
        urls::Kind::Local => Arc::new(LocalBroker::with_ttl(config.ttl())),
        urls::Kind::Redis => Arc::new(
            redis::engine_with_tls(url, &config.prefix, config.ttl(), tls)
                .map_err(bad)?
                .with_canary(every, deadline)
                .with_journal(journal),
        ),
        urls::Kind::RedisCluster => Arc::new(
            redis_cluster::engine_with_tls(url, &config.prefix, config.ttl(), tls)
                .map_err(bad)?
                .with_canary(every, deadline)
                .with_journal(journal),
        ),
        urls::Kind::Nats => Arc::new(
            nats::engine_with_replicas(
                url,
                &config.prefix,
                config.ttl(),
                config.jetstream_replicas,
                tls,
            )
            .map_err(bad)?
            .with_canary(every, deadline)
            .with_journal(journal),
        ),
    })
}

/// Backoff before reconnect attempt `n` (from 0): 100 ms doubling to 5 s.
pub(crate) fn backoff(n: u32) -> std::time::Duration {
    let ms = 100u64.saturating_mul(1u64 << n.min(6));
    std::time::Duration::from_millis(ms.min(5000))
}

/// Wait until `until` between two sessions of a transport: what is queued
/// meanwhile is dropped and counted (it would arrive late and out of order
/// with what the others sent since), except publications, which the
/// journal sends again in order when the broker is back; flushes are
/// answered.
/// `false` once the engine stopped.
pub(crate) async fn drop_until(
    rx: &mut tokio::sync::mpsc::Receiver<engine::Out>,
    until: tokio::time::Instant,
) -> bool {
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(until) => return true,
            o = rx.recv() => match o {
                // A publication stays in the journal and is sent again
                // when the broker is back; anything else is dropped.
                Some(engine::Out::Send(_, _, seq)) => {
                    if seq == 0 {
                        herald_core::metrics::count(&herald_core::metrics::BROKER_DROPPED)
                    }
                }
                Some(engine::Out::Flush(done)) => {
                    let _ = done.send(());
                }
                None => return false,
            },
        }
    }
}
