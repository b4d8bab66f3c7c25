//! A real Sentinel-watched Redis for tests: a master, a replica
//! (`--replicaof`) and three sentinels (`redis-server CONF --sentinel`,
//! quorum 2, `down-after-milliseconds` 1000, `failover-timeout` 3000), all
//! on free loopback ports with their files in a temp directory. The master
//! can be SIGKILLed and the sentinels' promotion of the replica awaited.
//! Everything is killed and the directory removed on drop.
//! [`RedisSentinel::start_tls`]: the same over TLS only (the data servers,
//! replication and the sentinels).

use crate::testing::{free_port, Tls};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The master group's name in the sentinels.
pub const MASTER_NAME: &str = "heraldmaster";

/// Longest wait for the setup (replica synced, sentinels acquainted) and
/// for a failover.
const WAIT: Duration = Duration::from_secs(30);

pub struct RedisSentinel {
    dir: PathBuf,
    /// Data servers by port (master and replica; a killed one is `None`).
    servers: BTreeMap<u16, Option<Child>>,
    sentinels: Vec<(u16, Child)>,
    tls: Option<Tls>,
}

fn spawn(cmd: &mut Command, port: u16) -> Child {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run redis-server ({e}); install it (apt-get install redis-server)")
        });
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("redis-server on port {port} exited at start: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "redis-server on {port} did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn query<T: redis::FromRedisValue>(
    tls: Option<&Tls>,
    port: u16,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    let client = match tls {
        None => redis::Client::open(format!("redis://127.0.0.1:{port}"))?,
        Some(t) => {
            redis::Client::build_with_tls(format!("rediss://127.0.0.1:{port}"), t.redis_certs()?)?
        }
    };
    let mut c = client.get_connection_with_timeout(Duration::from_secs(1))?;
    c.set_read_timeout(Some(Duration::from_secs(1)))?;
    cmd.query(&mut c)
}

/// Poll `f` until it gives something, or panic naming `what` after [`WAIT`].
fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl RedisSentinel {
    /// Start the master, the replica and three sentinels; return once the
    /// replica is in sync and every sentinel knows the replica and the two
    /// other sentinels.
    pub fn start() -> RedisSentinel {
        Self::start_with(None)
    }

    /// [`RedisSentinel::start`] over TLS only: `rediss-sentinel://` URLs.
    pub fn start_tls(tls: Tls) -> RedisSentinel {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<Tls>) -> RedisSentinel {
        let dir = std::env::temp_dir().join(format!(
            "herald-sentinel-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("create the sentinel directory");
        let mut s = RedisSentinel {
            dir,
            servers: BTreeMap::new(),
            sentinels: Vec::new(),
            tls,
        };
        let master = free_port();
        s.start_server(master, None);
        let replica = free_port();
        s.start_server(replica, Some(master));
        wait_for("the replica to sync", || {
            let info: String = s
                .query(replica, redis::cmd("INFO").arg("replication"))
                .ok()?;
            info.contains("master_link_status:up").then_some(())
        });
        for _ in 0..3 {
            let port = free_port();
            let conf = s.dir.join(format!("sentinel-{port}.conf"));
            let listen = match &s.tls {
                None => format!("port {port}\n"),
                Some(t) => format!(
                    "port 0\ntls-port {port}\ntls-cert-file {c}\ntls-key-file {k}\n\
                     tls-ca-cert-file {ca}\ntls-auth-clients {auth}\ntls-replication yes\n",
                    c = t.cert.display(),
                    k = t.key.display(),
                    ca = t.ca().display(),
                    auth = t.auth_clients()
                ),
            };
            std::fs::write(
                &conf,
                format!(
                    "{listen}bind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                     sentinel failover-timeout {MASTER_NAME} 3000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir = s.dir.display()
                ),
            )
            .expect("write sentinel.conf");
            let child = spawn(
                Command::new("redis-server").arg(&conf).arg("--sentinel"),
                port,
            );
            s.sentinels.push((port, child));
        }
        for &(port, _) in &s.sentinels {
            wait_for("the sentinels to know each other and the replica", || {
                let m: BTreeMap<String, String> = s
                    .query(port, redis::cmd("SENTINEL").arg("MASTER").arg(MASTER_NAME))
                    .ok()?;
                (m.get("num-other-sentinels").map(String::as_str) == Some("2")
                    && m.get("num-slaves").map(String::as_str) == Some("1"))
                .then_some(())
            });
        }
        s
    }

    fn start_server(&mut self, port: u16, replica_of: Option<u16>) {
        let mut cmd = Command::new("redis-server");
        match &self.tls {
            Some(t) => cmd.args(t.server_args(port)),
            None => cmd.args(["--port", &port.to_string()]),
        };
        cmd.args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir);
        if let Some(m) = replica_of {
            cmd.args(["--replicaof", "127.0.0.1", &m.to_string()]);
        }
        let child = spawn(&mut cmd, port);
        self.servers.insert(port, Some(child));
    }

    /// One command to the server or sentinel on `port` (over TLS if ours is).
    fn query<T: redis::FromRedisValue>(
        &self,
        port: u16,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        query(self.tls.as_ref(), port, cmd)
    }

    /// The URL herald takes: every sentinel, then the master group.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        let scheme = if self.tls.is_some() {
            "rediss-sentinel"
        } else {
            "redis-sentinel"
        };
        format!("{scheme}://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The master's port as the first sentinel that answers names it.
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|&(p, _)| {
            let (_, port): (String, u16) = self
                .query(
                    p,
                    redis::cmd("SENTINEL")
                        .arg("get-master-addr-by-name")
                        .arg(MASTER_NAME),
                )
                .ok()?;
            Some(port)
        })
    }

    /// A plain URL of the master now (for a test's own inspection).
    pub fn master_url(&self) -> String {
        format!(
            "{}://127.0.0.1:{}",
            if self.tls.is_some() {
                "rediss"
            } else {
                "redis"
            },
            self.master_port().expect("no sentinel names a master")
        )
    }

    /// SIGKILL the current master; its port.
    pub fn kill_master(&mut self) -> u16 {
        let port = self.master_port().expect("no sentinel names a master");
        let child = self
            .servers
            .get_mut(&port)
            .and_then(Option::take)
            .expect("the master is one of ours and running");
        kill(child);
        port
    }

    /// Wait until every sentinel names a master other than `old` and that
    /// server answers `ROLE` as a master; its port.
    pub fn wait_failover(&self, old: u16) -> u16 {
        wait_for("the sentinels to promote the replica", || {
            let port = self.master_port().filter(|p| *p != old)?;
            let agree = self.sentinels.iter().all(|&(p, _)| {
                self.query::<(String, u16)>(
                    p,
                    redis::cmd("SENTINEL")
                        .arg("get-master-addr-by-name")
                        .arg(MASTER_NAME),
                )
                .is_ok_and(|(_, m)| m == port)
            });
            let role: Vec<redis::Value> = self.query(port, &redis::cmd("ROLE")).ok()?;
            let is_master =
                matches!(role.first(), Some(redis::Value::BulkString(b)) if b == b"master");
            (agree && is_master).then_some(port)
        })
    }

    /// `SENTINEL FAILOVER`: the replica promoted and the master demoted to
    /// a replica while it keeps running (a role change, no process lost).
    /// Waits until the new master is one and the old answers `ROLE` as a
    /// replica; (old, new) ports.
    pub fn manual_failover(&self) -> (u16, u16) {
        let old = self.master_port().expect("no sentinel names a master");
        let (sentinel, _) = &self.sentinels[0];
        let ok: String = self
            .query(
                *sentinel,
                redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER_NAME),
            )
            .expect("SENTINEL FAILOVER");
        assert_eq!(ok, "OK");
        let new = self.wait_failover(old);
        wait_for("the old master to become a replica", || {
            let role: Vec<redis::Value> = self.query(old, &redis::cmd("ROLE")).ok()?;
            matches!(role.first(), Some(redis::Value::BulkString(b)) if b == b"slave").then_some(())
        });
        (old, new)
    }

    /// Swap the roles behind the sentinels' back (`REPLICAOF NO ONE` on
    /// the replica, `REPLICAOF` it on the master): the old master is a
    /// replica, its clients' connections left open, and the sentinels
    /// still name it. (old master, new master) ports.
    pub fn demote_behind_sentinels(&self) -> (u16, u16) {
        let old = self.master_port().expect("no sentinel names a master");
        let new = *self.servers.keys().find(|p| **p != old).expect("a replica");
        let _: String = self
            .query(new, redis::cmd("REPLICAOF").arg("NO").arg("ONE"))
            .unwrap();
        let _: String = self
            .query(
                old,
                redis::cmd("REPLICAOF")
                    .arg("127.0.0.1")
                    .arg(new.to_string()),
            )
            .unwrap();
        (old, new)
    }

    /// Start a killed server again on its port (the sentinels make it a
    /// replica of the master now).
    pub fn restart(&mut self, port: u16) {
        let master = self.master_port().filter(|p| *p != port);
        self.start_server(port, master);
    }
}

fn kill(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        for (_, child) in std::mem::take(&mut self.sentinels) {
            kill(child);
        }
        for (_, child) in std::mem::take(&mut self.servers) {
            if let Some(c) = child {
                kill(c);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// The Sentinel tests of the crate's own pieces (the locator, the ingress)
// live here, beside the helper they need; the nodes' tests are in
// tests/it/redis_sentinel.rs.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis_master::Master;

    fn at(c: &redis::Client, port: u16) -> bool {
        c.get_connection_info()
            .addr()
            .to_string()
            .ends_with(&format!(":{port}"))
    }

    /// The locator names the master, and after a SIGKILL and the
    /// sentinels' promotion, names the replica.
    #[tokio::test]
    async fn the_master_is_found_and_followed_through_a_failover() {
        let s = tokio::task::spawn_blocking(RedisSentinel::start)
            .await
            .unwrap();
        let master = Master::parse(&s.url()).unwrap();
        let port = s.master_port().unwrap();
        assert!(at(&master.client().await.unwrap(), port));
        let (s, old, new) = tokio::task::spawn_blocking(move || {
            let mut s = s;
            let old = s.kill_master();
            let new = s.wait_failover(old);
            (s, old, new)
        })
        .await
        .unwrap();
        assert_ne!(new, old);
        let deadline = Instant::now() + WAIT;
        loop {
            if master.client().await.is_ok_and(|c| at(&c, new)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the locator did not follow to {new}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        drop(s);
    }

    /// `PUBLISH` `payload` on `channel` (and `XADD` it to `stream`) on the
    /// server at `url`, every 50 ms, until both ingress receivers got it.
    async fn feed_until_received(
        url: &str,
        channel: &str,
        stream: &str,
        payload: &str,
        sub: &mut tokio::sync::mpsc::Receiver<bytes::Bytes>,
        group: &mut tokio::sync::mpsc::Receiver<herald_core::adapter::StreamEntry>,
    ) {
        let mut c = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let (mut from_sub, mut from_group) = (false, false);
        let deadline = Instant::now() + WAIT;
        while !(from_sub && from_group) {
            assert!(
                Instant::now() < deadline,
                "{payload}: pub/sub {from_sub}, stream {from_group}"
            );
            let _: i64 = redis::cmd("PUBLISH")
                .arg(channel)
                .arg(payload)
                .query_async(&mut c)
                .await
                .unwrap();
            if !from_group {
                let _: String = redis::cmd("XADD")
                    .arg(stream)
                    .arg("*")
                    .arg("payload")
                    .arg(payload)
                    .query_async(&mut c)
                    .await
                    .unwrap();
            }
            let until = tokio::time::Instant::now() + Duration::from_millis(50);
            while let Ok(Some(m)) = tokio::time::timeout_at(until, sub.recv()).await {
                from_sub |= m.as_ref() == payload.as_bytes();
            }
            while let Ok(Some(m)) = tokio::time::timeout_at(until, group.recv()).await {
                from_group |= m.answer(true).as_ref() == payload.as_bytes();
            }
        }
    }

    /// The ingress given a Sentinel URL (pub/sub and a stream through a
    /// consumer group) reads from the master, and after the master is
    /// SIGKILLed and the replica promoted, from the new master.
    #[tokio::test]
    async fn the_ingress_follows_a_failover() {
        let s = tokio::task::spawn_blocking(RedisSentinel::start)
            .await
            .unwrap();
        let mut sub = crate::ingress::subscribe(&s.url(), None, "app-broadcasts").unwrap();
        let mut group =
            crate::ingress::consume_stream(&s.url(), None, "app-stream", "herald").unwrap();
        let url = s.master_url();
        feed_until_received(
            &url,
            "app-broadcasts",
            "app-stream",
            "before",
            &mut sub,
            &mut group,
        )
        .await;
        let s = tokio::task::spawn_blocking(move || {
            let mut s = s;
            let old = s.kill_master();
            s.wait_failover(old);
            s
        })
        .await
        .unwrap();
        let url = s.master_url();
        feed_until_received(
            &url,
            "app-broadcasts",
            "app-stream",
            "after",
            &mut sub,
            &mut group,
        )
        .await;
        drop(s);
    }
}
