//! Herald's cluster engines: several `herald serve` processes behave as
//! one server through a Redis server (pub/sub), a Redis Cluster (sharded
//! pub/sub) or a NATS server (core subjects). Stream history and resumable sessions live on the same
//! server (Redis Streams and keys; JetStream and a key-value bucket). Both implement herald-core's broker traits
//! (one per concern, together [`Broker`](herald_core::broker::Broker))
//! with the same cluster logic; the transports only move bytes. See
//! docs/cluster.md.
//!
//! ```text
//! engine/     the cluster logic, by concern, over any transport:
//!   mod         shared state, the engine handle, the `Transport` seam
//!   pubsub      subjects, publications, interest, counts
//!   presence    members per node, reconciliation, occupancy decisions
//!   liveness    heartbeats, the leader, burying silent nodes, reconnects
//!   queries     request/reply: figures, members, a cache's last event
//!   inbound     messages from the transport, dispatched by kind
//!   interest    when the broker holds the node's interest (confirmations wait)
//!   canary      a node that no longer hears its broker, told from a slow one
//!   journal     what this node published lately, kept for the others' recovery
//!   recover     a node that lost its broker fetches what it missed
//!   reach       a probe round through every node (NATS clusters)
//! redis/      the Redis family:
//!   mod         the transport over one server (or the Sentinels' master)
//!   cluster     the transport over a Redis Cluster (sharded pub/sub)
//!   shards      the canary through every master
//!   conn        one command connection type for a server or a cluster
//!   master      where the master is (one server, or asked of Sentinels)
//!   streams     history and sessions on Redis (streams and keys)
//!   sessions    resumable session snapshots (compare-and-set writes)
//! nats/       the NATS family:
//!   mod         the transport over NATS core subjects (one server or a cluster)
//!   jetstream/  history and sessions on JetStream and a key-value bucket
//!   tls_probe   why a NATS server refuses the node's TLS, in words
//! subject     subject / Redis channel names (namespace included)
//! msg         the messages on the wire
//! tally       cluster-wide first/last holders (occupied, member added)
//! ingress     AnyCable-style broadcasts from the app (Redis/NATS)
//! urls        `broker.url` checked at start; NATS server lists
//! tls         `broker.tls_ca` / `tls_cert` / `tls_key`, checked at start
//! testing/    real redis-server / nats-server for tests (feature `testing`)
//!   sentinel    a master, a replica and three sentinels
//!   tls         their TLS: certificates, authority, client certificates
//!   delay       a relay that delays a link (a slow NATS route)
//! ```
//!
//! **How an engine plugs in.** A new broker is one folder beside `redis/`
//! and `nats/`: a type implementing [`engine::Transport`] (connect,
//! subscribe to what the shared state asks for, send the engine's queued
//! messages, hand received ones to the logic, reconnect by itself), a
//! constructor that makes [`engine::Engine::new`] over it (with a
//! [`herald_core::broker::Streams`] if the broker keeps history and
//! sessions), and one arm in [`from_config`] for its URL scheme. The
//! cluster logic in `engine/` is the same for every transport.

pub mod engine;
pub mod ingress;
pub mod msg;
pub mod nats;
pub mod redis;
pub mod subject;
pub mod tally;
/// Test helpers: only with the `testing` feature (dev-dependencies) or in
/// the crate's own unit tests.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
pub mod urls;

use herald_core::broker::local::LocalBroker;
use herald_core::broker::Broker;
use herald_core::config::BrokerConfig;
use std::sync::Arc;

/// The engine a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Local,
    Redis,
    Nats,
    /// `redis-cluster://` / `rediss-cluster://` ([`crate::redis::cluster`]).
    RedisCluster,
}

/// Check `config.url` the way the engine will read it; the error names
/// `broker.url` and shows the URL without credentials.
pub fn check(config: &BrokerConfig) -> Result<Kind, String> {
    let url = config.url.as_str();
    let bad = |why: String| format!("broker.url {:?}: {why}", config.shown_url());
    if url == "local" {
        return Ok(Kind::Local);
    }
    if redis::master::Master::is_sentinel_url(url) {
        redis::master::Master::parse(url).map_err(bad)?;
        return Ok(Kind::Redis);
    }
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        urls::redis_client(url).map_err(bad)?;
        return Ok(Kind::Redis);
    }
    if url.starts_with("nats://") || url.starts_with("tls://") {
        urls::nats_servers(url).map_err(bad)?;
        return Ok(Kind::Nats);
    }
    if url.starts_with("redis-cluster://") || url.starts_with("rediss-cluster://") {
        urls::redis_cluster_seeds(url).map_err(bad)?;
        return Ok(Kind::RedisCluster);
    }
    Err(bad(
        "expected local, redis://, rediss://, redis-sentinel://, rediss-sentinel://, \
         redis-cluster://, rediss-cluster://, nats:// or tls:// (several NATS servers, \
         sentinels or cluster seeds comma-separated)"
            .into(),
    ))
}

/// The engine `config` names: the in-process one for `local`, else Redis
/// or NATS. Networked engines connect in the background (call inside a
/// Tokio runtime); until they are connected the node serves its own
/// clients and `connected()` is false.
pub fn from_config(config: &BrokerConfig) -> Result<Arc<dyn Broker>, String> {
    let url = config.url.as_str();
    let bad = |e: String| format!("broker.url {:?}: {e}", config.shown_url());
    let (every, deadline) = config.canary();
    let journal = engine::journal::Limits::of(config);
    let kind = check(config)?;
    let tls = tls::BrokerTls::load(config)?;
    let tls = tls.as_ref();
    let (prefix, ttl) = (config.prefix.as_str(), config.ttl());
    let engine = match kind {
        Kind::Local => return Ok(Arc::new(LocalBroker::with_ttl(ttl))),
        Kind::Redis => redis::engine(url, prefix, ttl, tls),
        Kind::RedisCluster => redis::cluster::engine(url, prefix, ttl, tls),
        Kind::Nats => nats::engine(url, prefix, ttl, config.jetstream_replicas, tls),
    };
    let engine = engine.map_err(bad)?;
    Ok(Arc::new(
        engine.with_canary(every, deadline).with_journal(journal),
    ))
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
