//! `broker.url`'s parsers: a Redis server, a Redis Cluster's seeds, a list
//! of NATS servers (nothing connects). [`crate::check`] reads the URL with
//! them at start, so a bad one is refused before the node listens, with a
//! message that names the setting and never shows the credentials.
//!
//! NATS takes several servers as NATS clients do: comma-separated URLs
//! (`nats://a:4222,nats://b:4222`; an entry without a scheme takes the
//! first's, as `nats.go` does). The client also learns the rest of a
//! cluster from any one server (the servers gossip their client URLs), so
//! one URL of a routed cluster is enough to fail over; listing several
//! only matters for the first connection.
//!
//! Redis Cluster takes `redis-cluster://[user:password@]host:port[,host:port...]`
//! (`rediss-cluster://` over TLS): any reachable nodes seed the topology
//! (the client learns the rest with `CLUSTER SLOTS`); the credentials of
//! the first entry are used for every node, and a cluster has no database
//! but 0, so no `/db` path.

use async_nats::ServerAddr;
use std::str::FromStr;

/// Most servers in one `nats://` list (a bound on what a setting can make
/// the client try in turn).
pub const MAX_NATS_SERVERS: usize = 64;

/// Most seed nodes in one `redis-cluster://` list.
pub const MAX_CLUSTER_SEEDS: usize = 64;

/// The Redis client for `url` (parsing only; nothing connects).
pub fn redis_client(url: &str) -> Result<redis::Client, String> {
    if url.contains(',') {
        return Err("one Redis server only (a comma-separated list is for NATS)".into());
    }
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let info = client.get_connection_info();
    if let redis::ConnectionAddr::Tcp(host, _) | redis::ConnectionAddr::TcpTls { host, .. } =
        info.addr()
    {
        if host.is_empty() {
            return Err("no host".into());
        }
    }
    Ok(client)
}

/// The seed nodes of a `redis-cluster://` / `rediss-cluster://` URL, as
/// `redis://` / `rediss://` connection infos carrying the first entry's
/// credentials (parsing only; nothing connects).
pub fn redis_cluster_seeds(url: &str) -> Result<Vec<redis::ConnectionInfo>, String> {
    use redis::IntoConnectionInfo;
    let (scheme, rest) = match url.split_once("://") {
        Some(("redis-cluster", rest)) => ("redis", rest),
        Some(("rediss-cluster", rest)) => ("rediss", rest),
        _ => return Err("expected redis-cluster:// or rediss-cluster://".into()),
    };
    let parts: Vec<&str> = rest.split(',').map(str::trim).collect();
    if parts.len() > MAX_CLUSTER_SEEDS {
        return Err(format!("at most {MAX_CLUSTER_SEEDS} seed nodes"));
    }
    let mut credentials = "";
    let mut out = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let n = i + 1;
        if part.is_empty() {
            return Err(format!("seed {n} of the list is empty"));
        }
        let hostport = match part.rsplit_once('@') {
            Some((creds, hostport)) if i == 0 => {
                credentials = creds;
                hostport
            }
            Some((creds, hostport)) if creds == credentials => hostport,
            Some(_) => {
                return Err(
                    "credentials go on the first seed only (they apply to every node)".into(),
                )
            }
            None => part,
        };
        if hostport.contains(['/', '?', '#']) {
            return Err(format!(
                "seed {n} of the list: host:port only (a cluster has database 0 only)"
            ));
        }
        let Some((host, port)) = hostport.rsplit_once(':') else {
            return Err(format!("seed {n} of the list: expected host:port"));
        };
        if host.is_empty() {
            return Err(format!("seed {n} of the list has no host"));
        }
        if port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("seed {n} of the list: the port must be 1 to 65535"));
        }
        let full = if credentials.is_empty() {
            format!("{scheme}://{hostport}")
        } else {
            format!("{scheme}://{credentials}@{hostport}")
        };
        let info = full
            .into_connection_info()
            .map_err(|e| format!("seed {n} of the list: {}", e))?;
        out.push(info);
    }
    Ok(out)
}

/// The servers of a `nats://` / `tls://` URL or comma-separated list.
pub fn nats_servers(url: &str) -> Result<Vec<ServerAddr>, String> {
    let parts: Vec<&str> = url.split(',').map(str::trim).collect();
    if parts.len() > MAX_NATS_SERVERS {
        return Err(format!("at most {MAX_NATS_SERVERS} servers"));
    }
    let scheme = url.split("://").next().unwrap_or("nats");
    let mut out = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        if part.is_empty() {
            return Err(format!("server {} of the list is empty", i + 1));
        }
        let full = if part.contains("://") {
            (*part).to_owned()
        } else {
            format!("{scheme}://{part}")
        };
        if !(full.starts_with("nats://") || full.starts_with("tls://")) {
            return Err(format!(
                "server {} of the list: expected nats:// or tls://",
                i + 1
            ));
        }
        let addr = ServerAddr::from_str(&full)
            .map_err(|e| format!("server {} of the list: {e}", i + 1))?;
        if addr.host().is_empty() {
            return Err(format!("server {} of the list has no host", i + 1));
        }
        // One connection's credentials: the client sends the same to every
        // server it tries, so differing ones would fail on some of them.
        if let Some(first) = out.first() {
            let first: &ServerAddr = first;
            if (first.username(), first.password()) != (addr.username(), addr.password()) {
                return Err("every server of the list must carry the same credentials".into());
            }
        }
        out.push(addr);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{check, Kind};
    use herald_core::config::BrokerConfig;

    fn config(url: &str) -> BrokerConfig {
        BrokerConfig {
            url: url.into(),
            ..BrokerConfig::default()
        }
    }

    #[test]
    fn good_urls() {
        for (url, kind) in [
            ("local", Kind::Local),
            ("redis://127.0.0.1:6379", Kind::Redis),
            ("redis://:pw@127.0.0.1:6379/2", Kind::Redis),
            ("rediss://redis.internal:6380", Kind::Redis),
            ("nats://127.0.0.1:4222", Kind::Nats),
            ("tls://nats.internal:4222", Kind::Nats),
            ("nats://a:4222,nats://b:4222,nats://c:4222", Kind::Nats),
            ("nats://a:4222, b:4223", Kind::Nats),
            ("nats://u:p@a:4222,nats://u:p@b:4222", Kind::Nats),
            ("nats://a", Kind::Nats),
            ("redis-sentinel://a:26379,b:26379/mymaster", Kind::Redis),
            ("rediss-sentinel://:pw@a:26379/mymaster", Kind::Redis),
            ("redis-cluster://127.0.0.1:7000", Kind::RedisCluster),
            (
                "redis-cluster://127.0.0.1:7000, 127.0.0.1:7001,h:7002",
                Kind::RedisCluster,
            ),
            ("redis-cluster://:pw@a:7000,b:7001", Kind::RedisCluster),
            (
                "rediss-cluster://u:pw@a:7000,u:pw@b:7001",
                Kind::RedisCluster,
            ),
        ] {
            assert_eq!(check(&config(url)), Ok(kind), "{url}");
        }
        assert_eq!(nats_servers("nats://a:1, b:2").unwrap().len(), 2);
        assert_eq!(nats_servers("tls://a:1,b:2").unwrap()[1].scheme(), "tls");
        let seeds = redis_cluster_seeds("rediss-cluster://:pw@a:1,b:2").unwrap();
        assert_eq!(seeds.len(), 2);
        assert_eq!(seeds[1].redis_settings().password(), Some("pw"));
        assert!(matches!(
            seeds[1].addr(),
            redis::ConnectionAddr::TcpTls { host, port: 2, .. } if host == "b"
        ));
    }

    #[test]
    fn bad_urls_name_the_setting_and_hide_credentials() {
        for url in [
            "",
            "http://x",
            "redis://127.0.0.1:notaport",
            "redis://:secretpw@127.0.0.1:99999",
            "redis://a:1,redis://b:2",
            "redis://127.0.0.1:6379/notadb",
            "nats://",
            "nats://a:4222,",
            "nats://a:4222,,nats://b:4222",
            "nats://a:notaport",
            "nats://a:4222,redis://b:6379",
            "nats://u:secretpw@a:1,nats://b:2",
            "nats://a:99999",
            "redis-sentinel://:secretpw@a:26379",
            "redis-sentinel://:secretpw@a:notaport/m",
            "redis-sentinel://a:1,,b:2/m",
            "redis-cluster://",
            "redis-cluster://a:7000,",
            "redis-cluster://a:7000,,b:7001",
            "redis-cluster://a",
            "redis-cluster://a:notaport",
            "redis-cluster://:secretpw@a:99999",
            "redis-cluster://a:7000/2",
            "redis-cluster://:secretpw@a:7000,:otherpw@b:7001",
            "redis-cluster://a:7000,:secretpw@b:7001",
            "rediss-cluster://:7000",
            "redis-clusters://a:7000",
        ] {
            let e = check(&config(url)).expect_err(url);
            assert!(e.starts_with("broker.url"), "{url}: {e}");
            assert!(!e.contains("secretpw"), "{url}: {e}");
        }
        let long = vec!["nats://a:1"; MAX_NATS_SERVERS + 1].join(",");
        assert!(check(&config(&long)).is_err());
        let long = format!(
            "redis-cluster://{}",
            vec!["a:1"; MAX_CLUSTER_SEEDS + 1].join(",")
        );
        assert!(check(&config(&long)).is_err());
    }
}
