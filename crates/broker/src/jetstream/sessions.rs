//! Resumable sessions in a JetStream key-value bucket, `{prefix}_sessions`,
//! with `sessions_ttl` as its max age (the server forgets old snapshots
//! by itself) and one value per key. Keys are the session ids in base64url
//! (a sid comes from the client: it never reaches a subject as it is).
//!
//! Writes do not wait: a node's writer task keeps up to [`WRITERS`] of
//! them in flight from a queue that holds only the newest snapshot per sid
//! ([`super::pending`]), at most [`QUEUE`] sids and [`QUEUE_BYTES`] (past
//! that a snapshot is dropped, counted in
//! `herald_jetstream_sessions_dropped_total` and logged once per interval:
//! its client connects anew). One write at a time went too slowly for a
//! reconnect storm's closing sessions. A restore reads the
//! entry and, once its adapter decided it may be restored, deletes it
//! expecting that revision: of two nodes taking one sid at once one gets
//! it, and one rewritten meanwhile (its session closing) is read again.
//!
//! Every write is a compare-and-set on the revision this node last wrote
//! for the sid (the first on "no entry at all"): once another node took
//! the session (its delete is a newer revision), a snapshot of it this
//! node writes late (its client closing just as it restored elsewhere) is
//! refused, so a session restores once. The revisions are kept for
//! `sessions_ttl` (the entry's own age), as many as sessions written in
//! that time. A write whose outcome is unknown (timed out) ends the
//! sid's writes: what landed last stays restorable.
//!
//! The bucket holds at most `sessions_max` entries (a delete marker counts
//! as one until it ages out) and refuses new ones when full (discard
//! `new`): like the in-process store, a session closing then is not kept.

use super::metrics as m;
use super::pending::{Pending, Pushed};
use super::{Conn, Mode, Throttle, CALL_TIMEOUT};
use async_nats::jetstream::kv::{Operation, Store, UpdateErrorKind};
use async_nats::jetstream::{
    self,
    stream::{DiscardPolicy, StorageType},
};
use base64::Engine as _;
use herald_core::future::BoxFuture;
use herald_core::metrics::count;
use herald_core::sessions::{Kept, MemorySessions, SessionStore};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::task::JoinSet;

/// Most sessions whose snapshot waits to be written (a node closing all
/// its clients at once, as in a rolling restart, snapshots every one).
pub const QUEUE: usize = 65_536;

/// Most bytes of snapshots waiting to be written.
pub const QUEUE_BYTES: usize = 64 * 1024 * 1024;

/// Snapshot writes in flight at once per node.
pub const WRITERS: usize = 32;

/// Longest session id looked up (longer ones are not ours).
const MAX_SID: usize = 256;

/// Largest snapshot kept (the bucket refuses bigger values).
pub const MAX_VALUE: i32 = 256 * 1024;

pub struct NatsSessions {
    conn: Option<Arc<Conn>>,
    ttl: Duration,
    max: usize,
    local: Arc<MemorySessions>,
    writes: Arc<Queue>,
    bucket: Arc<Bucket>,
    log: Throttle,
}

/// The snapshots waiting, and the writer task's wake-up.
struct Queue {
    pending: Mutex<Pending>,
    wake: Notify,
    /// The store is gone: the writer ends once the queue is empty.
    closed: AtomicBool,
}

impl Drop for NatsSessions {
    fn drop(&mut self) {
        self.writes.closed.store(true, Ordering::Relaxed);
        self.writes.wake.notify_one();
    }
}

/// The bucket, made on first use.
struct Bucket {
    name: String,
    /// Copies JetStream keeps (`broker.jetstream_replicas`).
    replicas: usize,
    ttl: Duration,
    /// Most entries (`sessions_max`).
    max: usize,
    store: tokio::sync::Mutex<Option<Store>>,
    log: Throttle,
}

impl Bucket {
    async fn get(&self, ctx: &jetstream::Context) -> Option<Store> {
        let mut held = self.store.lock().await;
        if let Some(s) = held.as_ref() {
            return Some(s.clone());
        }
        // The bucket's stream as the key-value convention has it, made
        // directly: the client's own bucket creation first reads account
        // details in a shape older servers (2.9) do not answer.
        let config = jetstream::stream::Config {
            name: format!("KV_{}", self.name),
            description: Some("Herald: resumable Action Cable sessions".into()),
            subjects: vec![format!("$KV.{}.>", self.name)],
            max_messages_per_subject: 1,
            max_messages: i64::try_from(self.max).unwrap_or(i64::MAX),
            max_age: self.ttl,
            max_message_size: MAX_VALUE,
            storage: StorageType::File,
            discard: DiscardPolicy::New,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            num_replicas: self.replicas,
            ..Default::default()
        };
        let made = match ctx.create_or_update_stream(config).await {
            Ok(_) => ctx
                .get_key_value(&self.name)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match made {
            Ok(s) => {
                *held = Some(s.clone());
                Some(s)
            }
            Err(e) => {
                if self.log.allow() {
                    tracing::warn!(engine = "nats", error = %e, "cannot create the sessions bucket (logged once per 10 s)");
                }
                None
            }
        }
    }
}

fn key(sid: &str) -> Option<String> {
    (!sid.is_empty() && sid.len() <= MAX_SID)
        .then(|| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sid))
}

impl NatsSessions {
    /// The store, with its writer task (when there is a runtime).
    pub fn start(
        conn: Option<Arc<Conn>>,
        prefix: &str,
        ttl: Duration,
        max: usize,
    ) -> Arc<dyn SessionStore> {
        let local = Arc::new(MemorySessions::new(ttl, max));
        let queue = Arc::new(Queue {
            pending: Mutex::new(Pending::new(QUEUE, QUEUE_BYTES)),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
        });
        let bucket = Arc::new(Bucket {
            name: format!("{prefix}_sessions"),
            replicas: conn.as_ref().map_or(1, |c| c.replicas()),
            ttl,
            max,
            store: tokio::sync::Mutex::new(None),
            log: Throttle::default(),
        });
        let me = NatsSessions {
            conn: conn.clone(),
            ttl,
            max,
            local: local.clone(),
            writes: queue.clone(),
            bucket: bucket.clone(),
            log: Throttle::default(),
        };
        if let (Some(conn), Ok(rt)) = (conn, tokio::runtime::Handle::try_current()) {
            if me.enabled() {
                let w = Arc::new(Writer {
                    conn,
                    bucket,
                    local,
                    revisions: Mutex::new(Revisions {
                        ttl,
                        last: HashMap::new(),
                        swept: Instant::now(),
                    }),
                    log: Throttle::default(),
                });
                rt.spawn(write(w, queue));
            }
        }
        Arc::new(me)
    }

    fn local_mode(&self) -> bool {
        match &self.conn {
            None => true,
            Some(c) => matches!(c.mode(), Mode::Local),
        }
    }
}

/// The revision this node last wrote per sid (see the module doc).
struct Revisions {
    ttl: Duration,
    /// sid's key → (revision, when written); `None`: writes ended.
    last: HashMap<String, (Option<u64>, Instant)>,
    swept: Instant,
}

impl Revisions {
    /// What the next write of `key` must find: `Some(0)` (nothing), the
    /// revision written last, or `None` (do not write).
    fn expected(&mut self, key: &str) -> Option<u64> {
        if self.swept.elapsed() >= self.ttl.min(Duration::from_secs(10)) {
            let ttl = self.ttl;
            self.last.retain(|_, (_, at)| at.elapsed() < ttl);
            self.swept = Instant::now();
        }
        match self.last.get(key) {
            Some((rev, at)) if at.elapsed() < self.ttl => *rev,
            _ => Some(0),
        }
    }

    fn wrote(&mut self, key: String, rev: Option<u64>) {
        self.last.insert(key, (rev, Instant::now()));
    }
}

/// What a snapshot write needs.
struct Writer {
    conn: Arc<Conn>,
    bucket: Arc<Bucket>,
    local: Arc<MemorySessions>,
    revisions: Mutex<Revisions>,
    log: Throttle,
}

/// Keeps up to [`WRITERS`] snapshot writes in flight, the newest snapshot
/// of each sid, one write per sid at a time (see [`super::pending`]).
async fn write(w: Arc<Writer>, queue: Arc<Queue>) {
    let mut running: JoinSet<()> = JoinSet::new();
    let mut sids: HashMap<tokio::task::Id, String> = HashMap::new();
    loop {
        while running.len() < WRITERS {
            let Some((sid, snapshot)) = queue.pending.lock().next() else {
                break;
            };
            let w = w.clone();
            let key = sid.clone();
            let task = running.spawn(async move { w.put(&key, snapshot).await });
            sids.insert(task.id(), sid);
        }
        if running.is_empty()
            && queue.closed.load(Ordering::Relaxed)
            && queue.pending.lock().is_empty()
        {
            return;
        }
        tokio::select! {
            Some(done) = running.join_next_with_id(), if !running.is_empty() => {
                let id = match done {
                    Ok((id, ())) => id,
                    Err(e) => e.id(),
                };
                if let Some(sid) = sids.remove(&id) {
                    queue.pending.lock().done(&sid);
                }
            }
            _ = queue.wake.notified() => {}
        }
    }
}

impl Writer {
    fn dropped(&self, why: &str, error: &str) {
        count(&m::SESSIONS_DROPPED);
        if self.log.allow() {
            tracing::warn!(
                engine = "nats",
                error,
                "session snapshot not kept: {why} (logged once per 10 s)"
            );
        }
    }

    /// Write one snapshot expecting the revision this node wrote before;
    /// to memory when the server turned out to have no JetStream.
    async fn put(&self, sid: &str, snapshot: String) {
        let ctx = match self.conn.ready().await {
            Ok(c) => c,
            Err(true) => return self.local.store(sid, snapshot),
            Err(false) => return self.dropped("the server is away", "not connected"),
        };
        let Some(k) = key(sid) else { return };
        let Some(expected) = self.revisions.lock().expected(&k) else {
            return;
        };
        let put = async {
            let store = self.bucket.get(&ctx).await.ok_or(None)?;
            store
                .update(&k, snapshot.into(), expected)
                .await
                .map_err(Some)
        };
        match tokio::time::timeout(CALL_TIMEOUT, put).await {
            Ok(Ok(rev)) => {
                count(&m::SESSIONS_WRITTEN);
                self.revisions.lock().wrote(k, Some(rev));
            }
            Ok(Err(Some(e))) if e.kind() == UpdateErrorKind::WrongLastRevision => {
                // Taken (restored) elsewhere, or gone: never written again.
                tracing::debug!(
                    engine = "nats",
                    "session taken elsewhere: snapshot not kept"
                );
                self.revisions.lock().wrote(k, None);
            }
            Ok(Err(e)) => {
                // Not written: the revision this node knows still holds.
                let error = e.map_or("no bucket".to_owned(), |e| e.to_string());
                self.dropped("the write failed", &error);
            }
            Err(_) => {
                self.revisions.lock().wrote(k, None);
                self.dropped("timed out", "timeout");
            }
        }
    }
}

impl SessionStore for NatsSessions {
    fn name(&self) -> &'static str {
        "nats"
    }

    fn enabled(&self) -> bool {
        !self.ttl.is_zero() && self.max > 0
    }

    fn store(&self, sid: &str, snapshot: String) {
        if !self.enabled() {
            return;
        }
        if self.local_mode() {
            return self.local.store(sid, snapshot);
        }
        let pushed = self.writes.pending.lock().push(sid, snapshot);
        match pushed {
            Pushed::Queued => self.writes.wake.notify_one(),
            Pushed::Coalesced => count(&m::SESSIONS_COALESCED),
            Pushed::Dropped => {
                count(&m::SESSIONS_DROPPED);
                if self.log.allow() {
                    tracing::warn!(
                        engine = "nats",
                        "session snapshots are written slower than they come: some are not kept (logged once per 10 s)"
                    );
                }
            }
        }
    }

    fn read(&self, sid: &str) -> BoxFuture<Option<Kept>> {
        if self.local_mode() {
            return self.local.read(sid);
        }
        let (conn, bucket, local, sid) = (
            self.conn.clone(),
            self.bucket.clone(),
            self.local.clone(),
            sid.to_owned(),
        );
        Box::pin(async move {
            let ctx = match conn?.ready().await {
                Ok(c) => c,
                Err(true) => return local.read(&sid).await,
                Err(false) => return None,
            };
            let k = key(&sid)?;
            let read = async {
                let store = bucket.get(&ctx).await?;
                let entry = store.entry(k).await.ok()??;
                if entry.operation != Operation::Put {
                    return None;
                }
                Some(Kept {
                    snapshot: String::from_utf8(entry.value.to_vec()).ok()?,
                    version: entry.revision.to_string(),
                })
            };
            tokio::time::timeout(CALL_TIMEOUT, read)
                .await
                .ok()
                .flatten()
        })
    }

    fn take(&self, sid: &str, kept: &Kept) -> BoxFuture<bool> {
        if self.local_mode() {
            return self.local.take(sid, kept);
        }
        let (conn, bucket, local, sid, kept) = (
            self.conn.clone(),
            self.bucket.clone(),
            self.local.clone(),
            sid.to_owned(),
            kept.clone(),
        );
        Box::pin(async move {
            let Some(conn) = conn else { return false };
            let ctx = match conn.ready().await {
                Ok(c) => c,
                Err(true) => return local.take(&sid, &kept).await,
                Err(false) => return false,
            };
            let (Some(k), Ok(rev)) = (key(&sid), kept.version.parse::<u64>()) else {
                return false;
            };
            let take = async {
                let store = bucket.get(&ctx).await?;
                // Only the node whose delete lands on this revision has it.
                store.delete_expect_revision(&k, Some(rev)).await.ok()
            };
            tokio::time::timeout(CALL_TIMEOUT, take)
                .await
                .ok()
                .flatten()
                .is_some()
        })
    }

    fn sweep(&self) {
        if self.local_mode() {
            self.local.sweep()
        }
    }

    fn durable(&self) -> bool {
        !self.local_mode()
    }
}
