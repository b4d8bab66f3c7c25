//! The command connection of history and sessions ([`crate::redis::streams`])
//! to one Redis server or to a Redis Cluster, behind one type: the callers
//! build the same commands, and a cluster connection routes each to the
//! master of its key's slot.
//!
//! What the cluster needs of those callers: every command and script
//! touches keys of one slot (the history's two keys share a hash tag; a
//! session is one key), and a pipeline holds commands of one slot only
//! (the client refuses others), which [`Conn::is_cluster`] lets a caller
//! with many keys (session writes) split by.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, Value};
use std::time::Duration;

/// Where the command connection goes.
// One per engine, cloned never on a hot path: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum Connector {
    /// One server: the one a `redis://` URL names, or the master the
    /// Sentinels name at each connection.
    Single(crate::redis::master::Master),
    Cluster(ClusterClient),
}

impl Connector {
    /// A cluster client for the `redis-cluster://` seeds: no retries of
    /// its own (a failed call fails at once; the caller's outage handling
    /// applies, as on one server), RESP3 not needed for commands. Its
    /// connections are made within `connect`, its calls bounded by `call`
    /// (for a cluster, [`Connector::connect`]'s are not used); `tls`: the
    /// broker's TLS settings, for every node.
    pub fn cluster(
        seeds: Vec<redis::ConnectionInfo>,
        connect: Duration,
        call: Duration,
        tls: Option<&crate::tls::BrokerTls>,
    ) -> Result<Self, String> {
        let mut builder = ClusterClient::builder(seeds)
            .retries(0)
            .connection_timeout(connect)
            .response_timeout(call);
        if let Some(t) = tls {
            builder = builder.certs(t.redis());
        }
        builder
            .build()
            .map(Connector::Cluster)
            .map_err(|e| e.to_string())
    }

    /// A new connection within `connect` (and calls bounded by `call`).
    pub async fn connect(&self, connect: Duration, call: Duration) -> Result<Conn, String> {
        match self {
            Connector::Single(master) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect))
                    .set_response_timeout(Some(call));
                master
                    .client()
                    .await?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map(Conn::Single)
                    .map_err(|e| e.to_string())
            }
            Connector::Cluster(client) => {
                match tokio::time::timeout(connect, client.get_async_connection()).await {
                    Ok(r) => r.map(Conn::Cluster).map_err(|e| e.to_string()),
                    Err(_) => Err("timed out connecting to the cluster".into()),
                }
            }
        }
    }
}

/// One connection to a server or a cluster.
#[derive(Clone)]
pub enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    pub fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The cluster slot of `key` (CRC16/XMODEM of its hash tag, if any, mod
/// 16384), as Redis computes it.
pub fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % 16384
}

#[cfg(test)]
mod tests {
    use super::slot;

    #[test]
    fn slots_follow_redis_hash_tags() {
        // Values from the Redis Cluster specification / CLUSTER KEYSLOT.
        assert_eq!(slot(b"123456789"), 12739);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"herald:hist:{ab}:m"), slot(b"herald:hist:{ab}:s"));
    }
}
