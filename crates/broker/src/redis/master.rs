//! Where the Redis master is now: one answer shared by everything that
//! talks to Redis (the pub/sub transport, history and sessions, the
//! ingress), so a Sentinel failover is followed the same way everywhere.
//!
//! `redis://` / `rediss://` name one server: [`Master::client`] is always
//! the same client. `redis-sentinel://[user:pass@]H:P[,H:P...]/NAME` (and
//! `rediss-sentinel://`, TLS to the sentinels and to the master) names
//! Sentinels watching the master group `NAME`: each call asks them
//! (`SENTINEL MASTERS`, up to three at once, answers taken in the URL's
//! order, a master flagged down skipped; the redis crate's `sentinel`
//! module) and checks with `ROLE` that the address given really is a
//! master before returning a client for it. Callers ask again only when
//! they connect, which they do after any broken connection, failed call
//! (a `-READONLY` write to a demoted master included) or failed canary,
//! so a failover costs no restart. (Sentinel also closes the clients of
//! an instance it reconfigures, which ends connections to a demoted
//! master even when they are idle.)
//!
//! The credentials in the URL are the master's (and its replicas');
//! the sentinels are reached without a password. The broker's TLS
//! settings (`broker.tls_*`, [`crate::tls`]) apply to the sentinels and to
//! the master alike (one deployment, one authority).

use crate::tls::BrokerTls;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{IntoConnectionInfo, TlsMode};
use std::sync::Arc;
use std::time::Duration;

/// Most sentinels in one URL (a bound on what a setting can make a lookup
/// try in turn).
pub const MAX_SENTINELS: usize = 16;

/// Longest a lookup (every sentinel asked, the master's role checked) may
/// take before the caller counts it as a failed connection.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest wait between reconnects with Sentinels (the usual backoff
/// grows to 5 s): what is retried is a lookup (one `SENTINEL MASTERS`, one
/// `ROLE`), not the dead master, and a failover is typically over 2 to 3 s
/// after the master dies; a longer wait would only add to what is lost.
pub const SENTINEL_MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Longest master group name accepted.
const MAX_NAME: usize = 256;

/// How a node finds the Redis master. Cheap to clone (shared state).
#[derive(Clone)]
pub enum Master {
    /// One server, as configured.
    Fixed(Box<redis::Client>),
    /// Asked of Sentinels on each connection.
    Sentinel(Arc<Sentinels>),
}

/// The Sentinels of one master group and the last master they named.
pub struct Sentinels {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    name: String,
    /// The master last returned (`host:port`), to log a change once.
    last: parking_lot::Mutex<Option<String>>,
}

impl Master {
    /// Parse `url` (nothing connects). Errors never contain the password.
    pub fn parse(url: &str) -> Result<Master, String> {
        Self::parse_with(url, None)
    }

    /// [`Master::parse`], every connection with the broker's TLS settings
    /// (a `rediss` URL; [`BrokerTls::load`] refused the others).
    pub fn parse_with(url: &str, tls: Option<&BrokerTls>) -> Result<Master, String> {
        if let Some(rest) = url
            .strip_prefix("redis-sentinel://")
            .map(|r| (r, false))
            .or_else(|| url.strip_prefix("rediss-sentinel://").map(|r| (r, true)))
        {
            return parse_sentinel(rest.0, rest.1, tls).map(|s| Master::Sentinel(Arc::new(s)));
        }
        let client = crate::urls::redis_client(url)?;
        match tls {
            None => Ok(Master::Fixed(Box::new(client))),
            Some(_) => BrokerTls::redis_client(tls, client.get_connection_info().clone())
                .map(|c| Master::Fixed(Box::new(c))),
        }
    }

    /// Whether `url` is a Sentinel URL.
    pub fn is_sentinel_url(url: &str) -> bool {
        url.starts_with("redis-sentinel://") || url.starts_with("rediss-sentinel://")
    }

    /// The wait before reconnect attempt `n` (from 0): the engine's backoff,
    /// at most [`SENTINEL_MAX_BACKOFF`] with Sentinels.
    pub fn backoff(&self, n: u32) -> Duration {
        match self {
            Master::Fixed(_) => crate::backoff(n),
            Master::Sentinel(_) => crate::backoff(n).min(SENTINEL_MAX_BACKOFF),
        }
    }

    /// A client for the master now (for a Sentinel URL: asked of the
    /// sentinels, its role checked, within [`LOOKUP_TIMEOUT`]).
    pub async fn client(&self) -> Result<redis::Client, String> {
        match self {
            Master::Fixed(c) => Ok((**c).clone()),
            Master::Sentinel(s) => s.master().await,
        }
    }
}

impl Sentinels {
    async fn master(&self) -> Result<redis::Client, String> {
        let lookup = async {
            let mut sentinel = self.sentinel.lock().await;
            sentinel
                .async_get_client()
                .await
                .map_err(|e| format!("no master {:?} from the sentinels: {e}", self.name))
        };
        let client = tokio::time::timeout(LOOKUP_TIMEOUT, lookup)
            .await
            .map_err(|_| format!("the sentinels did not name master {:?} in time", self.name))??;
        let addr = match client.get_connection_info().addr() {
            redis::ConnectionAddr::Tcp(h, p)
            | redis::ConnectionAddr::TcpTls {
                host: h, port: p, ..
            } => {
                format!("{h}:{p}")
            }
            other => other.to_string(),
        };
        let mut last = self.last.lock();
        if last.as_deref() != Some(addr.as_str()) {
            match last.as_deref() {
                None => {
                    tracing::info!(engine = "redis", master = %self.name, at = %addr, "sentinels name the master")
                }
                Some(before) => tracing::warn!(
                    engine = "redis",
                    master = %self.name,
                    from = %before,
                    to = %addr,
                    "the master moved (sentinel failover); following it"
                ),
            }
            *last = Some(addr);
        }
        Ok(client)
    }
}

/// `[user:pass@]H:P[,H:P...]/NAME` after the scheme.
fn parse_sentinel(rest: &str, tls: bool, certs: Option<&BrokerTls>) -> Result<Sentinels, String> {
    let (authority, name) = rest
        .split_once('/')
        .ok_or("expected redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME (no master name)")?;
    if name.is_empty() {
        return Err("no master name after the sentinels".into());
    }
    if name.len() > MAX_NAME
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
    {
        return Err(format!(
            "the master name must be 1 to {MAX_NAME} letters, digits or -_.:"
        ));
    }
    let (creds, hosts) = match authority.rsplit_once('@') {
        Some((c, h)) => (Some(c), h),
        None => (None, authority),
    };
    let hosts: Vec<&str> = hosts.split(',').map(str::trim).collect();
    if hosts.len() > MAX_SENTINELS {
        return Err(format!("at most {MAX_SENTINELS} sentinels"));
    }
    let scheme = if tls { "rediss" } else { "redis" };
    let mut sentinels = Vec::with_capacity(hosts.len());
    for (i, h) in hosts.iter().enumerate() {
        if h.is_empty() {
            return Err(format!("sentinel {} of the list is empty", i + 1));
        }
        let (host, port) = h
            .rsplit_once(':')
            .ok_or(format!("sentinel {} of the list has no port", i + 1))?;
        if host.is_empty() {
            return Err(format!("sentinel {} of the list has no host", i + 1));
        }
        port.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or(format!("sentinel {} of the list: bad port", i + 1))?;
        let info = format!("{scheme}://{h}")
            .into_connection_info()
            .map_err(|e| format!("sentinel {} of the list: {e}", i + 1))?;
        sentinels.push(info);
    }
    // The master's credentials: read by the redis crate's own URL parser
    // (percent-decoding included) from a URL that is never shown.
    let mut builder = SentinelClientBuilder::new(
        sentinels.iter().map(|i| i.addr().clone()),
        name,
        SentinelServerType::Master,
    )
    .map_err(|e| e.to_string())?;
    if let Some(c) = creds {
        let redis = format!("redis://{c}@{}", hosts[0])
            .into_connection_info()
            .map_err(|_| "the credentials cannot be read".to_string())?;
        let redis = redis.redis_settings();
        if let Some(u) = redis.username() {
            builder = builder.set_client_to_redis_username(u);
        }
        if let Some(p) = redis.password() {
            builder = builder.set_client_to_redis_password(p);
        }
    }
    if tls {
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(TlsMode::Secure);
        if let Some(c) = certs {
            builder = builder
                .set_client_to_redis_certificates(c.redis())
                .set_client_to_sentinel_certificates(c.redis());
        }
    }
    let sentinel = builder.build().map_err(|e| e.to_string())?;
    Ok(Sentinels {
        sentinel: tokio::sync::Mutex::new(sentinel),
        name: name.to_owned(),
        last: parking_lot::Mutex::new(None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls() {
        for good in [
            "redis-sentinel://127.0.0.1:26379/mymaster",
            "redis-sentinel://a:26379,b:26380,c:26381/my-master.1",
            "redis-sentinel://:pw@a:26379/m",
            "redis-sentinel://user:p%40ss@a:26379,b:1/m",
            "rediss-sentinel://s.internal:26379/m",
        ] {
            assert!(Master::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "redis-sentinel://",
            "redis-sentinel://a:26379",
            "redis-sentinel://a:26379/",
            "redis-sentinel://a/m",
            "redis-sentinel://a:notaport/m",
            "redis-sentinel://a:0/m",
            "redis-sentinel://a:1,,b:2/m",
            "redis-sentinel://:1/m",
            "redis-sentinel://a:1/bad name",
            "redis-sentinel://a:1/m/extra",
        ] {
            assert!(Master::parse(bad).is_err(), "{bad}");
        }
        let long = vec!["a:1"; MAX_SENTINELS + 1].join(",");
        assert!(Master::parse(&format!("redis-sentinel://{long}/m")).is_err());
    }

    #[test]
    fn credentials_go_to_the_master() {
        let Master::Sentinel(s) = Master::parse("redis-sentinel://u:p%40ss@a:1/m").unwrap() else {
            panic!("not a sentinel")
        };
        // Only observable through a connection; parsed without error and
        // never part of a message.
        assert_eq!(s.name, "m");
        let e = Master::parse("redis-sentinel://u:secretpw@a:notaport/m")
            .err()
            .unwrap();
        assert!(!e.contains("secretpw"), "{e}");
    }
}
