//! Stream history in one JetStream stream, `{prefix}_history`, over the
//! subjects `{prefix}.h.<stream>` (the stream name escaped into one token
//! as the cluster's subjects escape channels, or `~` and its SHA-256 when
//! the escaped name is long: a subject fits in a direct get's request).
//!
//! Limits are the stream's own, so the server enforces them: per subject
//! `max_msgs_per_subject` = `history_limit`, `max_age` = `history_ttl`,
//! and `history_max_bytes` for the whole stream (oldest dropped first).
//! File storage: a restarted nats-server keeps what it had.
//!
//! Positions: JetStream's sequence counts the whole stream, so each
//! message carries its stream's epoch and offset in headers
//! (`Herald-Epoch`, `Herald-Offset`). An append is published with
//! `Nats-Expected-Last-Subject-Sequence` set to the sequence of the
//! stream's last message as this node last saw it; when another node
//! appended meanwhile the server refuses it, and the node reads the new
//! last message and tries again (at most [`ATTEMPTS`] times). So offsets
//! are consecutive whichever node appends, and the messages of one
//! subject are always one epoch with consecutive offsets. A subject with
//! no message left (expired, purged, the stream recreated) starts a new
//! epoch at offset 1.
//!
//! Which streams: every Action Cable stream published while history is
//! on (see docs/cluster.md, "History on nats"): a node cannot know
//! whether another node has an extended-protocol subscriber without
//! asking the server, which would cost a round trip per publication too.
//!
//! Reads: the subject's last message (a direct get) says the epoch and
//! the last offset; the retained messages are then read one direct get
//! each, oldest first, at most `history_limit` of them.

use super::{Conn, Mode, Throttle, CALL_TIMEOUT};
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{
    Config, DirectGetErrorKind, DiscardPolicy, StorageType, Stream,
};
use async_nats::jetstream::{self};
use async_nats::HeaderMap;
use herald_core::broker::BoxFuture;
use herald_core::history::{Backlog, Entry, History, Limits, MemoryHistory, Miss, Position};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;

/// Appends refused because another node appended first, before this one
/// gives up (the publication then goes out without a position).
pub const ATTEMPTS: usize = 5;

/// Streams whose last sequence is remembered; past it the cache starts
/// afresh (a miss costs one direct get).
const TIPS: usize = 10_000;

/// Escaped names longer than this are hashed.
const MAX_TOKEN: usize = 200;

const EPOCH: &str = "Herald-Epoch";
const OFFSET: &str = "Herald-Offset";

/// The last message of one stream's subject, as this node last saw it.
#[derive(Clone)]
struct Tip {
    seq: u64,
    epoch: Arc<str>,
    offset: u64,
}

/// The NATS engine's history (see the module's comment).
pub struct NatsHistory(Arc<Inner>);

impl std::ops::Deref for NatsHistory {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl NatsHistory {
    pub fn new(conn: Option<Arc<Conn>>, prefix: &str, limits: Limits) -> NatsHistory {
        NatsHistory(Arc::new(Inner::new(conn, prefix, limits)))
    }

    fn clone_handle(&self) -> Arc<Inner> {
        self.0.clone()
    }
}

pub struct Inner {
    conn: Option<Arc<Conn>>,
    limits: Limits,
    /// The fallback when the server has no JetStream.
    local: MemoryHistory,
    name: String,
    base: String,
    stream: tokio::sync::Mutex<Option<Stream<()>>>,
    tips: Mutex<HashMap<Arc<str>, Tip>>,
    log: Throttle,
}

/// The subject of `stream`'s history under `prefix`.
pub fn subject(prefix: &str, stream: &str) -> String {
    let mut token = String::with_capacity(stream.len() + 8);
    for b in stream.bytes() {
        if b.is_ascii_alphanumeric() || b"_-=@,;".contains(&b) {
            token.push(b as char);
        } else {
            token.push_str(&format!("%{b:02X}"));
        }
    }
    if token.is_empty() {
        token.push('%');
    }
    if token.len() > MAX_TOKEN {
        // `~` is escaped in plain tokens, so a hashed name never meets one.
        let digest = Sha256::digest(stream.as_bytes());
        token = format!("~{}", hex(&digest));
    }
    format!("{prefix}.h.{token}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn stream_name(prefix: &str) -> String {
    format!("{prefix}_history")
}

impl Inner {
    fn new(conn: Option<Arc<Conn>>, prefix: &str, limits: Limits) -> Inner {
        Inner {
            conn,
            limits,
            local: MemoryHistory::new(limits),
            name: stream_name(prefix),
            base: prefix.to_owned(),
            stream: tokio::sync::Mutex::new(None),
            tips: Mutex::new(HashMap::new()),
            log: Throttle::default(),
        }
    }

    fn local_mode(&self) -> bool {
        match &self.conn {
            None => true,
            Some(c) => matches!(c.mode(), Mode::Local),
        }
    }

    fn config(&self) -> Config {
        Config {
            name: self.name.clone(),
            description: Some("Herald: Action Cable stream history".into()),
            subjects: vec![format!("{}.h.>", self.base)],
            max_messages_per_subject: self.limits.per_stream as i64,
            max_age: std::time::Duration::from_millis(self.limits.ttl_ms),
            max_bytes: i64::try_from(self.limits.max_bytes).unwrap_or(i64::MAX),
            discard: DiscardPolicy::Old,
            storage: StorageType::File,
            allow_direct: true,
            ..Config::default()
        }
    }

    /// The stream, created or updated to this node's limits on first use
    /// (and again when the server lost it).
    async fn stream(&self, ctx: &jetstream::Context, again: bool) -> Result<Stream<()>, String> {
        let mut held = self.stream.lock().await;
        if let (Some(s), false) = (held.as_ref(), again) {
            return Ok(s.clone());
        }
        ctx.create_or_update_stream(self.config())
            .await
            .map_err(|e| e.to_string())?;
        let s = ctx
            .get_stream_no_info(&self.name)
            .await
            .map_err(|e| e.to_string())?;
        *held = Some(s.clone());
        Ok(s)
    }

    fn warn(&self, what: &str, error: &str) {
        if self.log.allow() {
            tracing::warn!(
                engine = "nats",
                error,
                "JetStream history: {what} (logged once per 10 s)"
            );
        }
    }

    /// The subject's last message now: `None` when it has none.
    async fn tip(&self, stream: &Stream<()>, subject: &str) -> Result<Option<Tip>, String> {
        match stream.direct_get_last_for_subject(subject).await {
            Ok(m) => Ok(parse(&m).map(|(epoch, offset)| Tip {
                seq: m.sequence,
                epoch,
                offset,
            })),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    fn remember(&self, name: &str, tip: Option<Tip>) {
        let mut tips = self.tips.lock();
        match tip {
            Some(t) => {
                if tips.len() >= TIPS && !tips.contains_key(name) {
                    tips.clear();
                }
                tips.insert(Arc::from(name), t);
            }
            None => {
                tips.remove(name);
            }
        }
    }

    async fn append_js(
        &self,
        ctx: &jetstream::Context,
        name: &str,
        data: &str,
    ) -> Option<Position> {
        let subject = subject(&self.base, name);
        let mut stream = match self.stream(ctx, false).await {
            Ok(s) => s,
            Err(e) => {
                self.warn("cannot create the stream", &e);
                return None;
            }
        };
        for _ in 0..ATTEMPTS {
            let cached = self.tips.lock().get(name).cloned();
            let tip = match cached {
                Some(t) => Some(t),
                None => match self.tip(&stream, &subject).await {
                    Ok(t) => t,
                    Err(e) => {
                        self.warn("cannot read a stream's last position", &e);
                        return None;
                    }
                },
            };
            let (epoch, offset, expect) = match &tip {
                Some(t) => (t.epoch.clone(), t.offset + 1, t.seq),
                None => (new_epoch(), 1, 0),
            };
            let mut headers = HeaderMap::new();
            headers.insert(EPOCH, &*epoch);
            headers.insert(OFFSET, offset.to_string());
            headers.insert(
                async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                expect.to_string(),
            );
            let ack = match ctx
                .publish_with_headers(subject.clone(), headers, data.to_owned().into())
                .await
            {
                Ok(f) => f.await,
                Err(e) => Err(e),
            };
            match ack {
                Ok(ack) => {
                    self.remember(
                        name,
                        Some(Tip {
                            seq: ack.sequence,
                            epoch: epoch.clone(),
                            offset,
                        }),
                    );
                    return Some(Position { epoch, offset });
                }
                // Another node appended first (or our cache is stale).
                Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
                    self.remember(name, None);
                }
                Err(e) if e.kind() == PublishErrorKind::StreamNotFound => {
                    self.remember(name, None);
                    stream = match self.stream(ctx, true).await {
                        Ok(s) => s,
                        Err(e) => {
                            self.warn("cannot create the stream", &e);
                            return None;
                        }
                    };
                }
                Err(e) => {
                    self.remember(name, None);
                    self.warn("append failed", &e.to_string());
                    return None;
                }
            }
        }
        self.warn("append kept losing to other nodes' appends", "conflict");
        None
    }

    /// The subject's retained messages up to `tip`, oldest first, at most
    /// `history_limit` of them.
    async fn read_js(
        &self,
        ctx: &jetstream::Context,
        name: &str,
    ) -> Result<(Tip, Vec<Entry>), Miss> {
        let subject = subject(&self.base, name);
        let stream = self.stream(ctx, false).await.map_err(|e| {
            self.warn("cannot create the stream", &e);
            Miss::Unavailable
        })?;
        let tip = match self.tip(&stream, &subject).await {
            Ok(Some(t)) => t,
            Ok(None) => return Err(Miss::UnknownStream),
            Err(e) => {
                self.warn("read failed", &e);
                return Err(Miss::Unavailable);
            }
        };
        let mut entries = Vec::new();
        let mut from = None;
        while entries.len() < self.limits.per_stream {
            let m = match stream.direct_get_next_for_subject(&subject, from).await {
                Ok(m) => m,
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => break,
                Err(e) => {
                    self.warn("read failed", &e.to_string());
                    return Err(Miss::Unavailable);
                }
            };
            if m.sequence > tip.seq {
                break;
            }
            if let Some((epoch, offset)) = parse(&m) {
                if epoch == tip.epoch {
                    entries.push(Entry {
                        offset,
                        at_ms: (m.time.unix_timestamp_nanos() / 1_000_000).max(0) as u64,
                        data: Arc::from(String::from_utf8_lossy(&m.payload).as_ref()),
                    });
                }
            }
            if m.sequence == tip.seq {
                break;
            }
            from = Some(m.sequence + 1);
        }
        // Keep the newest when more were found than a read may return.
        if entries.len() > self.limits.per_stream {
            entries.drain(..entries.len() - self.limits.per_stream);
        }
        Ok((tip, entries))
    }

    async fn after_js(
        &self,
        ctx: &jetstream::Context,
        name: &str,
        epoch: &str,
        offset: u64,
    ) -> Result<Backlog, Miss> {
        let (tip, entries) = self.read_js(ctx, name).await?;
        answer_after(tip.epoch, tip.offset, entries, epoch, offset)
    }
}

/// What an `after` read answers from a subject's messages (all of one
/// epoch, consecutive offsets ending at `last`).
fn answer_after(
    have: Arc<str>,
    last: u64,
    entries: Vec<Entry>,
    epoch: &str,
    offset: u64,
) -> Result<Backlog, Miss> {
    if *have != *epoch {
        return Err(Miss::UnknownEpoch);
    }
    if offset > last {
        return Err(Miss::Ahead);
    }
    let first = entries.first().map_or(last + 1, |e| e.offset);
    if offset + 1 < first {
        return Err(Miss::Evicted);
    }
    let entries: Vec<Entry> = entries.into_iter().filter(|e| e.offset > offset).collect();
    // Consecutive up to `last`, or something is missing in between.
    let whole = entries
        .iter()
        .enumerate()
        .all(|(i, e)| e.offset == offset + 1 + i as u64)
        && entries.last().map_or(offset, |e| e.offset) == last;
    if !whole {
        return Err(Miss::Evicted);
    }
    Ok(Backlog {
        epoch: have,
        entries,
    })
}

fn parse(m: &StreamMessage) -> Option<(Arc<str>, u64)> {
    let epoch = m.headers.get(EPOCH)?.as_str();
    let offset = m.headers.get(OFFSET)?.as_str().parse().ok()?;
    Some((Arc::from(epoch), offset))
}

fn new_epoch() -> Arc<str> {
    Arc::from(format!("{:016x}", rand::random::<u64>()))
}

impl History for NatsHistory {
    fn name(&self) -> &'static str {
        "nats"
    }

    /// Every stream is appended while JetStream keeps the history; the
    /// fallback keeps only what this node's subscribers asked for.
    fn retain(&self, stream: &str) {
        if self.local_mode() {
            self.local.retain(stream)
        }
    }

    fn any_reliable(&self) -> bool {
        if self.local_mode() {
            self.local.any_reliable()
        } else {
            self.limits.enabled()
        }
    }

    fn append(&self, stream: &str, data: &str) -> BoxFuture<Option<Position>> {
        if self.local_mode() {
            return self.local.append(stream, data);
        }
        let (me, stream, data) = (self.clone_handle(), stream.to_owned(), data.to_owned());
        Box::pin(async move {
            let conn = me.conn.as_ref()?;
            let ctx = match conn.ready().await {
                Ok(c) => c,
                Err(true) => return me.local.append(&stream, &data).await,
                Err(false) => {
                    me.warn(
                        "the server is away; publishing without positions",
                        "not connected",
                    );
                    return None;
                }
            };
            match tokio::time::timeout(CALL_TIMEOUT, me.append_js(&ctx, &stream, &data)).await {
                Ok(p) => p,
                Err(_) => {
                    me.remember(&stream, None);
                    me.warn("append timed out", "timeout");
                    None
                }
            }
        })
    }

    fn after(&self, stream: &str, epoch: &str, offset: u64) -> BoxFuture<Result<Backlog, Miss>> {
        if self.local_mode() {
            return self.local.after(stream, epoch, offset);
        }
        let (me, stream, epoch) = (self.clone_handle(), stream.to_owned(), epoch.to_owned());
        Box::pin(async move {
            let conn = me.conn.as_ref().ok_or(Miss::Unavailable)?;
            let ctx = match conn.ready().await {
                Ok(c) => c,
                Err(true) => return me.local.after(&stream, &epoch, offset).await,
                Err(false) => return Err(Miss::Unavailable),
            };
            tokio::time::timeout(CALL_TIMEOUT, me.after_js(&ctx, &stream, &epoch, offset))
                .await
                .unwrap_or(Err(Miss::Unavailable))
        })
    }

    fn since(&self, stream: &str, unix_secs: u64) -> BoxFuture<Result<Backlog, Miss>> {
        if self.local_mode() {
            return self.local.since(stream, unix_secs);
        }
        let (me, stream) = (self.clone_handle(), stream.to_owned());
        Box::pin(async move {
            let conn = me.conn.as_ref().ok_or(Miss::Unavailable)?;
            let ctx = match conn.ready().await {
                Ok(c) => c,
                Err(true) => return me.local.since(&stream, unix_secs).await,
                Err(false) => return Err(Miss::Unavailable),
            };
            let read = tokio::time::timeout(CALL_TIMEOUT, me.read_js(&ctx, &stream))
                .await
                .unwrap_or(Err(Miss::Unavailable));
            let (tip, entries) = read?;
            let from = unix_secs.saturating_mul(1000);
            Ok(Backlog {
                epoch: tip.epoch,
                entries: entries.into_iter().filter(|e| e.at_ms >= from).collect(),
            })
        })
    }

    fn shared(&self) -> bool {
        !self.local_mode()
    }

    fn sweep(&self) {
        if self.local_mode() {
            self.local.sweep()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(offsets: std::ops::RangeInclusive<u64>) -> Vec<Entry> {
        offsets
            .map(|offset| Entry {
                offset,
                at_ms: 0,
                data: Arc::from("x"),
            })
            .collect()
    }

    fn offsets(r: Result<Backlog, Miss>) -> Result<Vec<u64>, Miss> {
        r.map(|b| b.entries.iter().map(|e| e.offset).collect())
    }

    #[test]
    fn after_answers_exactly_or_says_why_not() {
        let e: Arc<str> = Arc::from("e");
        let read = |offset, kept| offsets(answer_after(e.clone(), 5, kept, "e", offset));
        assert_eq!(read(2, entries(3..=5)), Ok(vec![3, 4, 5]));
        assert_eq!(read(5, entries(3..=5)), Ok(vec![]));
        assert_eq!(read(1, entries(3..=5)), Err(Miss::Evicted));
        assert_eq!(read(6, entries(3..=5)), Err(Miss::Ahead));
        // A hole in what was read (a message lost in between).
        let mut holed = entries(3..=5);
        holed.remove(1);
        assert_eq!(read(2, holed), Err(Miss::Evicted));
        assert_eq!(
            offsets(answer_after(e.clone(), 5, entries(3..=5), "other", 3)),
            Err(Miss::UnknownEpoch)
        );
    }

    #[test]
    fn stream_names_become_one_safe_token() {
        assert_eq!(subject("p", "chat/1"), "p.h.chat%2F1");
        assert_eq!(subject("p", "a.b *>"), "p.h.a%2Eb%20%2A%3E");
        assert_eq!(subject("p", ""), "p.h.%");
        let long = subject("p", &"é".repeat(600));
        assert!(
            long.starts_with("p.h.~") && long.len() == 4 + 1 + 64,
            "{long}"
        );
        assert_ne!(long, subject("p", &"é".repeat(601)));
    }
}
