//! History and resumable sessions on the Redis server (reliable streams), so that
//! every node answers a history request from the same log and restores a
//! session another node kept (even one SIGKILLed).
//!
//! Per reliable stream, two keys (the stream name hashed, so any name up
//! to 1 KiB makes a short key and nothing in it is ever interpreted):
//!
//! - `<prefix>:hist:{<h>}:m`, a hash: `e` the epoch, `o` the last offset.
//!   It is also the stream's "reliable" marker: a node whose client on
//!   the extended protocol follows the stream creates it ([`History::retain`]),
//!   and an append on any node writes only while it exists. Its absence
//!   (expired, evicted, FLUSHALL) is exactly "the history may have been
//!   lost": the next retain starts a new epoch.
//! - `<prefix>:hist:{<h>}:s`, a Redis Stream of the publications, entry id
//!   `<offset>-0`, fields `d` (the message) and `t` (Redis's clock, ms),
//!   bounded by `XADD MAXLEN history_limit`; a read is one `XRANGE`.
//!
//! Both keys expire `history_ttl` after the last append or retain; entries
//! older than `history_ttl` are never returned. Appends and reads are Lua
//! scripts, so the counter, the entry and the expiries change in one step
//! whichever node appends (offsets consecutive), and a read sees the
//! marker and the entries at one instant.
//!
//! Sessions: `<prefix>:sess:<h>`, in [`crate::redis_sessions`], sharing
//! this module's command connection.
//!
//! On Redis Cluster ([`crate::redis_cluster`]) the same names work as they
//! are: a stream's two keys share the hash tag `{<h>}`, so the scripts
//! that touch both run on one slot's master; different streams spread
//! over the slots; a session is one key. The names are the single
//! server's, so a rolling upgrade on one Redis keeps its history.
//!
//! The commands use their own multiplexed connection (not the pub/sub
//! one), connected on first use and again after a failure (at most once
//! per [`RETRY`]). Every call is bounded by [`CALL_TIMEOUT`]; when the
//! server cannot answer, appends give no position (the publication goes
//! out without one), reads give [`Miss::Unavailable`], stores are dropped,
//! and one warning per [`LOG_EVERY`] says how many calls failed.

use crate::redis_conn::{Conn, Connector};
use futures_util::future::{FutureExt, Shared};
use herald_core::broker::Streams;
use herald_core::future::BoxFuture;
use herald_core::history::{Backlog, Entry, History, Limits, Miss};
use herald_core::publication::Position;
use herald_core::sessions::SessionStore;
use parking_lot::Mutex;
use redis::Value;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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

/// A retain of a stream is sent at most once per this interval per node:
/// a reconnect storm of many clients following one stream costs one call.
const RETAIN_EVERY: Duration = Duration::from_secs(1);

/// `KEYS[1]` the marker, `KEYS[2]` the stream; `ARGV[1]` a fresh epoch,
/// `ARGV[2]` the ttl (ms). Creates the marker (and drops any stream left
/// from a lost epoch) or refreshes both keys' expiry.
const RETAIN: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 0
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'e', ARGV[1], 'o', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

/// `ARGV[1]` the message, `ARGV[2]` history_limit, `ARGV[3]` the ttl (ms).
/// Nothing unless the stream is reliable; else `{epoch, offset}`.
const APPEND: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local o = redis.call('HINCRBY', KEYS[1], 'o', 1)
local e = redis.call('HGET', KEYS[1], 'e')
local t = redis.call('TIME')
local ms = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[2], o .. '-0', 'd', ARGV[1], 't', ms)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {e, o}
";

/// `ARGV[1]` the first id to read (`-` or an offset), `ARGV[2]` the most
/// entries. Nothing for an unknown stream; else `{epoch, last offset, now
/// (ms), offset, t, data, offset, t, data, ...}`.
const READ: &str = r"
local m = redis.call('HMGET', KEYS[1], 'e', 'o')
if not m[1] then return false end
local t = redis.call('TIME')
local r = {m[1], tonumber(m[2]) or 0, t[1] * 1000 + math.floor(t[2] / 1000)}
for _, x in ipairs(redis.call('XRANGE', KEYS[2], ARGV[1], '+', 'COUNT', ARGV[2])) do
  local f = {}
  for i = 1, #x[2], 2 do f[x[2][i]] = x[2][i + 1] end
  r[#r + 1] = tonumber(string.match(x[1], '^(%d+)'))
  r[#r + 1] = tonumber(f['t']) or 0
  r[#r + 1] = f['d'] or ''
end
return r
";

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

/// The loaded scripts' SHA1s (`SCRIPT LOAD` on each new connection).
#[derive(Clone)]
pub(crate) struct Scripts {
    retain: String,
    append: String,
    read: String,
    /// [`crate::redis_sessions::SAVE`].
    pub(crate) save: String,
    /// [`crate::redis_sessions::TAKE`].
    pub(crate) take: String,
}

/// The command connection: made on first use, dropped on any error, made
/// again (with the scripts loaded) at most once per [`RETRY`], on the
/// master [`crate::redis_master::Master`] names then (a Sentinel failover
/// followed), or on the cluster.
pub(crate) struct Link {
    client: Connector,
    conn: tokio::sync::Mutex<Option<(Conn, Scripts)>>,
    tried: Mutex<Option<Instant>>,
    pub(crate) outage: Outage,
}

impl Link {
    fn new(client: Connector) -> Link {
        Link {
            client,
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
        let scripts = Scripts {
            retain: load(RETAIN).await?,
            append: load(APPEND).await?,
            read: load(READ).await?,
            save: load(crate::redis_sessions::SAVE).await?,
            take: load(crate::redis_sessions::TAKE).await?,
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

/// What the Redis engine hands Action Cable: history and sessions on the
/// server, sharing one command connection.
pub struct RedisStreams {
    link: Arc<Link>,
    prefix: String,
}

impl RedisStreams {
    /// On one server ([`Connector::Single`]) or a Redis Cluster, where the
    /// keys below are placed on slots deliberately (see the module doc).
    pub fn new(client: Connector, prefix: &str) -> RedisStreams {
        RedisStreams {
            link: Arc::new(Link::new(client)),
            prefix: prefix.to_owned(),
        }
    }
}

impl Streams for RedisStreams {
    fn history(&self, limits: Limits) -> Arc<dyn History> {
        Arc::new(RedisHistory {
            link: self.link.clone(),
            prefix: self.prefix.clone(),
            limits,
            retained: Mutex::new(HashMap::new()),
        })
    }

    fn sessions(&self, ttl: Duration, _max: usize) -> Arc<dyn SessionStore> {
        Arc::new(crate::redis_sessions::RedisSessions::new(
            self.link.clone(),
            &self.prefix,
            ttl,
        ))
    }
}

/// A retain call on its way (or done), shared by whoever waits for it.
type Retaining = Shared<BoxFuture<()>>;

/// History in Redis Streams (see the module's doc).
pub struct RedisHistory {
    link: Arc<Link>,
    prefix: String,
    limits: Limits,
    /// Streams retained lately by this node: when ([`RETAIN_EVERY`]), and
    /// the call, which every subscription to the stream meanwhile awaits.
    retained: Mutex<HashMap<Box<str>, (Instant, Retaining)>>,
}

impl RedisHistory {
    fn keys(&self, stream: &str) -> (String, String) {
        let h = hashed(stream);
        (
            format!("{}:hist:{{{h}}}:m", self.prefix),
            format!("{}:hist:{{{h}}}:s", self.prefix),
        )
    }

    /// Read from `start` (`-` or an offset): the epoch, last offset and
    /// the entries not older than `history_ttl` (a future owning what it
    /// needs).
    fn read(
        &self,
        stream: &str,
        start: String,
    ) -> impl std::future::Future<Output = Result<(Arc<str>, u64, Vec<Entry>), Miss>> + Send + 'static
    {
        let (m, s) = self.keys(stream);
        let count = self.limits.per_stream.max(1);
        let ttl = self.limits.ttl_ms;
        let link = self.link.clone();
        async move {
            let v = link
                .call("read", |sc| {
                    let mut c = redis::cmd("EVALSHA");
                    c.arg(&sc.read).arg(2).arg(m).arg(s).arg(start).arg(count);
                    c
                })
                .await
                .ok_or(Miss::Unavailable)?;
            parse_read(v, ttl, count)
        }
    }
}

/// The read script's answer: (epoch, last offset, entries kept by age).
fn parse_read(v: Value, ttl_ms: u64, most: usize) -> Result<(Arc<str>, u64, Vec<Entry>), Miss> {
    let Value::Array(items) = v else {
        return Err(Miss::UnknownStream);
    };
    let mut it = items.into_iter();
    let epoch = match it.next() {
        Some(Value::BulkString(b)) => Arc::<str>::from(String::from_utf8_lossy(&b).as_ref()),
        _ => return Err(Miss::Unavailable),
    };
    let int = |v: Option<Value>| match v {
        Some(Value::Int(n)) => Some(n.max(0) as u64),
        _ => None,
    };
    let last = int(it.next()).ok_or(Miss::Unavailable)?;
    let now = int(it.next()).ok_or(Miss::Unavailable)?;
    let cutoff = now.saturating_sub(ttl_ms);
    let mut entries = Vec::new();
    while let (Some(o), Some(t), Some(d)) = (it.next(), it.next(), it.next()) {
        let (Some(offset), Some(at_ms)) = (int(Some(o)), int(Some(t))) else {
            return Err(Miss::Unavailable);
        };
        let Value::BulkString(d) = d else {
            return Err(Miss::Unavailable);
        };
        if at_ms >= cutoff && entries.len() < most {
            entries.push(Entry {
                offset,
                at_ms,
                data: String::from_utf8_lossy(&d).as_ref().into(),
            });
        }
    }
    Ok((epoch, last, entries))
}

/// Whether `entries` (read from `offset + 1` on, `last` being the stream's
/// last offset) answer "after `offset` in `epoch`" exactly, as the
/// in-process engine decides.
fn exact_after(
    want_epoch: &str,
    offset: u64,
    (epoch, last, entries): (Arc<str>, u64, Vec<Entry>),
) -> Result<Backlog, Miss> {
    if &*epoch != want_epoch {
        return Err(Miss::UnknownEpoch);
    }
    if offset > last {
        return Err(Miss::Ahead);
    }
    let complete = entries.len() as u64 == last - offset
        && entries.first().is_none_or(|e| e.offset == offset + 1);
    if !complete {
        return Err(Miss::Evicted);
    }
    Ok(Backlog { epoch, entries })
}

impl History for RedisHistory {
    fn name(&self) -> &'static str {
        "redis"
    }

    /// Create or refresh the stream's marker, in the background (the
    /// periodic refresh of followed streams; a new follower waits for it,
    /// [`History::retain_now`]).
    fn retain(&self, stream: &str) {
        drop(self.retain_now(stream));
    }

    /// The marker's call runs on a task of its own (it completes even if
    /// nobody waits); the subscriptions to the stream made while it is on
    /// its way, on this node, all wait for that one call, so none is
    /// confirmed before the stream is reliable on the server, and a
    /// publication on any node after the confirmation is appended with a
    /// position. The wait is bounded by [`CALL_TIMEOUT`] (a server away:
    /// the subscription goes on, without positions, as publications do).
    fn retain_now(&self, stream: &str) -> BoxFuture<()> {
        if !self.limits.enabled() {
            return Box::pin(std::future::ready(()));
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return Box::pin(std::future::ready(()));
        };
        let mut r = self.retained.lock();
        if let Some((at, call)) = r.get(stream) {
            if at.elapsed() < RETAIN_EVERY {
                return Box::pin(call.clone());
            }
        }
        let (m, s) = self.keys(stream);
        let link = self.link.clone();
        let ttl = self.limits.ttl_ms;
        let epoch = format!("{:016x}", rand::random::<u64>());
        let task = rt.spawn(async move {
            link.call("retain", |sc| {
                let mut c = redis::cmd("EVALSHA");
                c.arg(&sc.retain).arg(2).arg(m).arg(s).arg(epoch).arg(ttl);
                c
            })
            .await;
        });
        let done: BoxFuture<()> = Box::pin(async move {
            let _ = task.await;
        });
        let call = done.shared();
        r.insert(stream.into(), (Instant::now(), call.clone()));
        Box::pin(call)
    }

    /// Whether any node may keep a history of some stream is not known
    /// here without asking: every Action Cable publication is offered to
    /// the server, which appends only to marked streams.
    fn any_reliable(&self) -> bool {
        self.limits.enabled()
    }

    fn append(&self, stream: &str, data: &str) -> BoxFuture<Option<Position>> {
        let (m, s) = self.keys(stream);
        let link = self.link.clone();
        let data = data.to_owned();
        let limit = self.limits.per_stream;
        let ttl = self.limits.ttl_ms;
        Box::pin(async move {
            let v = link
                .call("append", |sc| {
                    let mut c = redis::cmd("EVALSHA");
                    c.arg(&sc.append)
                        .arg(2)
                        .arg(m)
                        .arg(s)
                        .arg(data)
                        .arg(limit)
                        .arg(ttl);
                    c
                })
                .await?;
            match v {
                Value::Array(a) => match a.as_slice() {
                    [Value::BulkString(e), Value::Int(o)] => Some(Position {
                        epoch: Arc::from(String::from_utf8_lossy(e).as_ref()),
                        offset: (*o).max(0) as u64,
                    }),
                    _ => None,
                },
                _ => None,
            }
        })
    }

    fn after(&self, stream: &str, epoch: &str, offset: u64) -> BoxFuture<Result<Backlog, Miss>> {
        let epoch = epoch.to_owned();
        let read = self.read(stream, offset.saturating_add(1).to_string());
        Box::pin(async move { exact_after(&epoch, offset, read.await?) })
    }

    fn since(&self, stream: &str, unix_secs: u64) -> BoxFuture<Result<Backlog, Miss>> {
        let read = self.read(stream, "-".into());
        Box::pin(async move {
            let (epoch, _, entries) = read.await?;
            let from = unix_secs.saturating_mul(1000);
            Ok(Backlog {
                epoch,
                entries: entries.into_iter().filter(|e| e.at_ms >= from).collect(),
            })
        })
    }

    fn shared(&self) -> bool {
        true
    }

    fn sweep(&self) {
        self.retained
            .lock()
            .retain(|_, (at, _)| at.elapsed() < RETAIN_EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(offset: u64, at_ms: u64) -> Entry {
        Entry {
            offset,
            at_ms,
            data: "x".into(),
        }
    }

    #[test]
    fn names_make_short_fixed_keys() {
        let long = "}{:*\n\0".repeat(200);
        assert_eq!(hashed(&long).len(), 32);
        assert_ne!(hashed("a"), hashed("b"));
        assert!(hashed(&long).bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn reads_are_exact_or_say_why_not() {
        let ep: Arc<str> = Arc::from("e1");
        let read = |last, entries: Vec<Entry>| (ep.clone(), last, entries);
        // Everything after 1 up to 3: exact.
        let b = exact_after("e1", 1, read(3, vec![e(2, 0), e(3, 0)])).unwrap();
        assert_eq!(b.entries.len(), 2);
        // Up to date: an empty answer.
        assert!(exact_after("e1", 3, read(3, vec![]))
            .unwrap()
            .entries
            .is_empty());
        assert_eq!(
            exact_after("e2", 1, read(3, vec![])).unwrap_err(),
            Miss::UnknownEpoch
        );
        assert_eq!(
            exact_after("e1", 4, read(3, vec![])).unwrap_err(),
            Miss::Ahead
        );
        // Offset 2 trimmed (count or age): evicted.
        assert_eq!(
            exact_after("e1", 1, read(3, vec![e(3, 0)])).unwrap_err(),
            Miss::Evicted
        );
        assert_eq!(
            exact_after("e1", 1, read(3, vec![])).unwrap_err(),
            Miss::Evicted
        );
    }

    #[test]
    fn the_read_answer_drops_old_entries_and_keeps_at_most_the_limit() {
        let v = Value::Array(vec![
            Value::BulkString(b"ep".to_vec()),
            Value::Int(3),
            Value::Int(10_000),
            Value::Int(1),
            Value::Int(1_000),
            Value::BulkString(b"old".to_vec()),
            Value::Int(2),
            Value::Int(9_500),
            Value::BulkString(b"two".to_vec()),
            Value::Int(3),
            Value::Int(9_600),
            Value::BulkString(b"three".to_vec()),
        ]);
        let (epoch, last, entries) = parse_read(v.clone(), 5_000, 100).unwrap();
        assert_eq!((&*epoch, last), ("ep", 3));
        let got: Vec<u64> = entries.iter().map(|e| e.offset).collect();
        assert_eq!(got, vec![2, 3]);
        assert_eq!(parse_read(v, 5_000, 1).unwrap().2.len(), 1);
        assert_eq!(
            parse_read(Value::Nil, 1, 1).unwrap_err(),
            Miss::UnknownStream
        );
    }
}
