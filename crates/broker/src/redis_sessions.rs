//! Resumable Action Cable sessions on the Redis server: a
//! session's snapshot at `<prefix>:sess:<h>` (`<h>` the hashed `sid`),
//! written whenever it changes and at the close, expiring `sessions_ttl`
//! after the last write (`PX`). A restore reads it (`GET`) and, once its
//! adapter decided it may be restored, takes it with the [`TAKE`] script:
//! deleted only if it still carries the token read, so a snapshot
//! restores once, on any node, and one rewritten meanwhile (its session
//! closing) is read again.
//!
//! Every write is a compare-and-set (the [`SAVE`] script): the value is
//! `<token>\n<snapshot>`, the token unique to the write, and a node writes
//! only where it finds the token of its own last write of that sid (the
//! first write: where there is nothing). Why: once another node took the
//! session ([`TAKE`]), a snapshot of it this node writes late (its client
//! closing just as it restored elsewhere, or changing meanwhile) would
//! otherwise bring the session back, and it would restore twice. Refused,
//! the sid's later writes are skipped. The tokens are kept per sid for
//! `sessions_ttl` after its last write (about 150 bytes each, as many as
//! sessions written in that time). A batch whose outcome is unknown (an
//! error, a timeout) lets the next write accept either token: what landed
//! last stays restorable. Like the NATS engine's KV revisions
//! (`crate::jetstream::sessions`).

use crate::redis_streams::{hashed, Link, CALL_TIMEOUT};
use herald_core::future::BoxFuture;
use herald_core::sessions::{Kept, SessionStore};
use redis::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Session snapshots waiting to be written before more are dropped.
const SESSION_QUEUE: usize = 4096;

/// Most snapshots written in one pipeline.
const SESSION_BATCH: usize = 256;

/// `KEYS[1]` the session; `ARGV[1]`, `ARGV[2]` the tokens the value may
/// carry (`''`: no value at all), `ARGV[3]` the new token, `ARGV[4]` the
/// snapshot, `ARGV[5]` the ttl (ms). 1 when written, 0 when refused.
pub(crate) const SAVE: &str = r"
local cur = redis.call('GET', KEYS[1])
local t = ''
if cur then t = string.match(cur, '^([^\n]*)\n') or '?' end
if t ~= ARGV[1] and t ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], ARGV[3] .. '\n' .. ARGV[4], 'PX', ARGV[5])
return 1
";

/// `KEYS[1]` the session; `ARGV[1]` the token it was read with (a value
/// without one: the whole value). 1 when deleted, 0 when it changed or
/// is gone.
pub(crate) const TAKE: &str = r"
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local t = string.match(cur, '^([^\n]*)\n') or cur
if t ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
";

/// Session snapshots on the Redis server (see the module's doc).
pub struct RedisSessions {
    link: Arc<Link>,
    prefix: String,
    ttl: Duration,
    /// The writer's queue: snapshots go out in the order they were kept
    /// (a later one of a sid never overwritten by an earlier one).
    writer: std::sync::OnceLock<mpsc::Sender<(String, String)>>,
}

impl RedisSessions {
    pub(crate) fn new(link: Arc<Link>, prefix: &str, ttl: Duration) -> RedisSessions {
        RedisSessions {
            link,
            prefix: prefix.to_owned(),
            ttl,
            writer: std::sync::OnceLock::new(),
        }
    }

    fn key(&self, sid: &str) -> String {
        format!("{}:sess:{}", self.prefix, hashed(sid))
    }

    fn writer(&self) -> Option<&mpsc::Sender<(String, String)>> {
        if let Some(w) = self.writer.get() {
            return Some(w);
        }
        let rt = tokio::runtime::Handle::try_current().ok()?;
        Some(self.writer.get_or_init(|| {
            let (tx, rx) = mpsc::channel(SESSION_QUEUE);
            rt.spawn(write_sessions(self.link.clone(), self.ttl, rx));
            tx
        }))
    }
}

/// What this node may find under each sid it wrote: the tokens a value
/// may carry (`""` for none), or `None` once a write was refused.
struct Tokens {
    ttl: Duration,
    last: HashMap<String, (Option<[String; 2]>, Instant)>,
    swept: Instant,
    /// Tokens: a random per-process part and a counter.
    tag: u64,
    next: u64,
}

impl Tokens {
    fn expected(&mut self, key: &str) -> Option<[String; 2]> {
        if self.swept.elapsed() >= self.ttl.min(Duration::from_secs(10)) {
            let ttl = self.ttl;
            self.last.retain(|_, (_, at)| at.elapsed() < ttl);
            self.swept = Instant::now();
        }
        match self.last.get(key) {
            Some((t, at)) if at.elapsed() < self.ttl => t.clone(),
            _ => Some([String::new(), String::new()]),
        }
    }

    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("{:016x}.{:x}", self.tag, self.next)
    }

    fn set(&mut self, key: String, t: Option<[String; 2]>) {
        self.last.insert(key, (t, Instant::now()));
    }
}

/// Write queued snapshots, pipelined, in order, each a compare-and-set on
/// this node's last token, until the store is gone.
async fn write_sessions(link: Arc<Link>, ttl: Duration, mut rx: mpsc::Receiver<(String, String)>) {
    let ttl_ms = ttl.as_millis().max(1) as u64;
    let mut tokens = Tokens {
        ttl,
        last: HashMap::new(),
        swept: Instant::now(),
        tag: rand::random(),
        next: 0,
    };
    let mut batch = Vec::with_capacity(SESSION_BATCH);
    while rx.recv_many(&mut batch, SESSION_BATCH).await > 0 {
        // Only the last snapshot of a sid in a batch matters (each write
        // replaces the one before), and one write per sid keeps each
        // write's expected token known.
        let mut latest: HashMap<String, String> = HashMap::with_capacity(batch.len());
        for (key, snap) in batch.drain(..) {
            latest.insert(key, snap);
        }
        let mut writes = Vec::with_capacity(latest.len());
        for (key, snap) in latest {
            if let Some(expect) = tokens.expected(&key) {
                let token = tokens.fresh();
                writes.push((key, snap, expect, token));
            }
        }
        if writes.is_empty() {
            continue;
        }
        let run = async {
            let (conn, scripts) = link.get().await?;
            // One pipeline on one server; on a cluster one per slot (a
            // pipeline may not cross slots), sent together.
            let mut groups: HashMap<u16, (Vec<usize>, redis::Pipeline)> = HashMap::new();
            for (i, (key, snap, [a, b], token)) in writes.iter().enumerate() {
                let slot = if conn.is_cluster() {
                    crate::redis_conn::slot(key.as_bytes())
                } else {
                    0
                };
                let (at, pipe) = groups
                    .entry(slot)
                    .or_insert_with(|| (Vec::new(), redis::pipe()));
                at.push(i);
                pipe.cmd("EVALSHA")
                    .arg(&scripts.save)
                    .arg(1)
                    .arg(key)
                    .arg(a)
                    .arg(b)
                    .arg(token)
                    .arg(snap)
                    .arg(ttl_ms);
            }
            let sent = groups.into_values().map(|(at, pipe)| {
                let mut conn = conn.clone();
                async move {
                    let r = pipe.query_async::<Vec<i64>>(&mut conn).await;
                    r.map(|done| (at, done))
                }
            });
            let mut out = vec![0i64; writes.len()];
            for r in futures_util::future::join_all(sent).await {
                let (at, done) = r.map_err(|e| e.to_string())?;
                for (i, ok) in at.into_iter().zip(done) {
                    out[i] = ok;
                }
            }
            Ok::<_, String>(out)
        };
        let r = match tokio::time::timeout(CALL_TIMEOUT, run).await {
            Ok(r) => r,
            Err(_) => Err("timed out".into()),
        };
        match r {
            Ok(done) => {
                for ((key, _, _, token), ok) in writes.into_iter().zip(done) {
                    if ok == 1 {
                        tokens.set(key, Some([token.clone(), token]));
                    } else {
                        tracing::debug!("session taken elsewhere: not written back");
                        tokens.set(key, None);
                    }
                }
            }
            Err(e) => {
                // Unknown outcome: the value is the old one or the new one.
                for (key, _, [a, _], token) in writes {
                    tokens.set(key, Some([a, token]));
                }
                link.broken().await;
                link.outage.fail("store session", &e);
            }
        }
    }
}

impl SessionStore for RedisSessions {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn enabled(&self) -> bool {
        !self.ttl.is_zero()
    }

    /// Queued for the writer; dropped (and counted as a failure) when the
    /// queue is full, as while the server is away.
    fn store(&self, sid: &str, snapshot: String) {
        if !self.enabled() {
            return;
        }
        let key = self.key(sid);
        if let Some(w) = self.writer() {
            if w.try_send((key, snapshot)).is_err() {
                self.link.outage.fail("store session", "write queue full");
            }
        }
    }

    fn read(&self, sid: &str) -> BoxFuture<Option<Kept>> {
        let key = self.key(sid);
        let link = self.link.clone();
        Box::pin(async move {
            let v = link
                .call("restore session", |_| {
                    let mut c = redis::cmd("GET");
                    c.arg(key);
                    c
                })
                .await?;
            match v {
                Value::BulkString(b) => kept_of(String::from_utf8(b).ok()?),
                _ => None,
            }
        })
    }

    fn take(&self, sid: &str, kept: &Kept) -> BoxFuture<bool> {
        let key = self.key(sid);
        let link = self.link.clone();
        let version = kept.version.clone();
        Box::pin(async move {
            let v = link
                .call("restore session", |s| {
                    let mut c = redis::cmd("EVALSHA");
                    c.arg(&s.take).arg(1).arg(key).arg(version);
                    c
                })
                .await;
            matches!(v, Some(Value::Int(1)))
        })
    }

    /// The server expires snapshots itself (`PX`).
    fn sweep(&self) {}

    fn durable(&self) -> bool {
        true
    }
}

/// The snapshot in a stored value (`<token>\n<snapshot>`) and its token
/// (a value without a token, from a node before tokens, is the snapshot
/// itself, its own token: a JSON snapshot has no raw newline).
fn kept_of(mut value: String) -> Option<Kept> {
    Some(match value.find('\n') {
        Some(i) => {
            let snapshot = value.split_off(i + 1);
            value.pop();
            Kept {
                snapshot,
                version: value,
            }
        }
        None => Kept {
            version: value.clone(),
            snapshot: value,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_cut_from_a_stored_value() {
        let k = kept_of("ab.1\n{\"x\":1}".into()).unwrap();
        assert_eq!(
            (k.snapshot.as_str(), k.version.as_str()),
            ("{\"x\":1}", "ab.1")
        );
        let k = kept_of("{\"x\":1}".into()).unwrap();
        assert_eq!(
            (k.snapshot.as_str(), k.version.as_str()),
            ("{\"x\":1}", "{\"x\":1}")
        );
    }

    #[test]
    fn a_refused_sid_is_never_written_again_within_the_ttl() {
        let mut t = Tokens {
            ttl: Duration::from_secs(60),
            last: HashMap::new(),
            swept: Instant::now(),
            tag: 1,
            next: 0,
        };
        assert_eq!(t.expected("k"), Some([String::new(), String::new()]));
        let a = t.fresh();
        t.set("k".into(), Some([a.clone(), a.clone()]));
        assert_eq!(t.expected("k"), Some([a.clone(), a]));
        t.set("k".into(), None);
        assert_eq!(t.expected("k"), None);
        assert_ne!(t.fresh(), t.fresh());
    }
}
