//! The Redis command connection that history and sessions share: made
//! on first use, dropped on any error, made again (with the scripts
//! loaded) at most once per [`RETRY`], every call bounded by
//! [`CALL_TIMEOUT`], failures counted and logged once per [`LOG_EVERY`].

use crate::redis::conn::{Conn, Connector};
use parking_lot::Mutex;
use redis::Value;
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Longest wait for one call (append, read, restore) before it counts as
/// unavailable. An append holds its stream's publications while it waits.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// Longest wait for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// After a failed connection, calls fail at once for this long (rather
/// than each waiting for a connection that will not come).
pub const RETRY: Duration = Duration::from_secs(1);

/// A failing server is logged once per this interval, with the count.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// A short, fixed-length key part for any name: the first 128 bits of its
/// SHA-256, in hex.
pub(crate) fn hashed(name: &str) -> String {
    let d = Sha256::digest(name.as_bytes());
    d[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// Counts failed calls and logs them once per [`LOG_EVERY`].
pub(crate) struct Outage {
    failed: AtomicU64,
    logged: Mutex<Option<Instant>>,
}

impl Outage {
    pub(crate) fn fail(&self, what: &str, error: &str) {
        let n = self.failed.fetch_add(1, Ordering::Relaxed) + 1;
        let mut logged = self.logged.lock();
        if logged.is_some_and(|at| at.elapsed() < LOG_EVERY) {
            return;
        }
        *logged = Some(Instant::now());
        self.failed.store(0, Ordering::Relaxed);
        drop(logged);
        tracing::warn!(
            engine = "redis",
            failed = n,
            last = what,
            error = %error,
            "history/sessions: the Redis server did not answer; publications go out without \
             positions and history requests are rejected until it does"
        );
    }
}

/// The Lua scripts a connection loads, by what they do (their text lives
/// beside what uses them: history in `streams`, sessions in `sessions`).
#[derive(Clone, Copy)]
pub(crate) struct Bodies {
    pub(crate) retain: &'static str,
    pub(crate) append: &'static str,
    pub(crate) read: &'static str,
    pub(crate) save: &'static str,
    pub(crate) take: &'static str,
}

/// The loaded scripts' SHA1s (`SCRIPT LOAD` on each new connection).
#[derive(Clone)]
pub(crate) struct Scripts {
    pub(crate) retain: String,
    pub(crate) append: String,
    pub(crate) read: String,
    /// [`crate::redis::sessions::SAVE`].
    pub(crate) save: String,
    /// [`crate::redis::sessions::TAKE`].
    pub(crate) take: String,
}

/// The command connection: made on first use, dropped on any error, made
/// again (with the scripts loaded) at most once per [`RETRY`], on the
/// master [`crate::redis::master::Master`] names then (a Sentinel failover
/// followed), or on the cluster.
pub(crate) struct Link {
    client: Connector,
    bodies: Bodies,
    conn: tokio::sync::Mutex<Option<(Conn, Scripts)>>,
    tried: Mutex<Option<Instant>>,
    pub(crate) outage: Outage,
}

impl Link {
    pub(crate) fn new(client: Connector, bodies: Bodies) -> Link {
        Link {
            client,
            bodies,
            conn: tokio::sync::Mutex::new(None),
            tried: Mutex::new(None),
            outage: Outage {
                failed: AtomicU64::new(0),
                logged: Mutex::new(None),
            },
        }
    }

    pub(crate) async fn get(&self) -> Result<(Conn, Scripts), String> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = &*slot {
            return Ok(c.clone());
        }
        {
            let mut tried = self.tried.lock();
            if tried.is_some_and(|at| at.elapsed() < RETRY) {
                return Err("not connected (retrying)".into());
            }
            *tried = Some(Instant::now());
        }
        let conn = self.client.connect(CONNECT_TIMEOUT, CALL_TIMEOUT).await?;
        let load = |body: &'static str| {
            let mut c = conn.clone();
            async move {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(body)
                    .query_async::<String>(&mut c)
                    .await
                    .map_err(|e| e.to_string())
            }
        };
        let b = self.bodies;
        let scripts = Scripts {
            retain: load(b.retain).await?,
            append: load(b.append).await?,
            read: load(b.read).await?,
            save: load(b.save).await?,
            take: load(b.take).await?,
        };
        *slot = Some((conn.clone(), scripts.clone()));
        Ok((conn, scripts))
    }

    /// Forget the connection (the next call connects anew).
    pub(crate) async fn broken(&self) {
        *self.conn.lock().await = None;
    }

    /// Run `cmd` (built with the scripts' SHA1s) within [`CALL_TIMEOUT`];
    /// on failure, count and maybe log it under `what`.
    pub(crate) async fn call(
        &self,
        what: &str,
        cmd: impl FnOnce(&Scripts) -> redis::Cmd,
    ) -> Option<Value> {
        let run = async {
            let (mut conn, scripts) = self.get().await?;
            cmd(&scripts)
                .query_async::<Value>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        };
        let r = match tokio::time::timeout(CALL_TIMEOUT, run).await {
            Ok(r) => r,
            Err(_) => Err("timed out".into()),
        };
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                // NOSCRIPT (a restarted server), a closed socket, a timeout:
                // a fresh connection reloads the scripts.
                self.broken().await;
                self.outage.fail(what, &e);
                None
            }
        }
    }
}
