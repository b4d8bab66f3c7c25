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
//! the last offset (the tip). What this node read before at that tip is
//! the answer ([`super::cache`]); when the tip moved on, only the messages
//! after the cached one are read; otherwise all retained messages. A few
//! messages are read one direct get each; more through one ephemeral pull
//! consumer (filter subject, start sequence, no acks) and one fetch, so a
//! read costs a handful of round trips, not one per message. Concurrent
//! reads of one stream share one read ([`super::flight`]): in a reconnect
//! storm thousands of clients ask for the same streams at once. A read
//! the server does not answer within [`CALL_TIMEOUT`] is counted and
//! logged once per interval, and its requests are rejected.

use super::cache::{Cache, Read};
use super::flight::Flights;
use super::metrics as m;
use super::{Conn, Mode, Throttle, CALL_TIMEOUT};
use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream::{
    Config, DirectGetErrorKind, DiscardPolicy, StorageType, Stream,
};
use async_nats::jetstream::{self};
use async_nats::HeaderMap;
use futures_util::StreamExt;
use herald_core::future::BoxFuture;
use herald_core::history::{Backlog, Entry, History, Limits, MemoryHistory, Miss};
use herald_core::publication::Position;
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

/// Reads of at most this many messages go one direct get each; longer
/// ones through a consumer (whose creation is a round trip of its own).
const DIRECT_READS: usize = 4;

/// How long the server keeps a read's consumer once its fetch ended (it
/// is not deleted: that would cost every read another round trip).
const CONSUMER_IDLE: std::time::Duration = std::time::Duration::from_secs(5);

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
    /// Reads in flight by stream (see the module's comment).
    flights: Flights<Arc<str>, Result<Arc<Read>, Miss>>,
    /// What was read last per stream, at its tip.
    cache: Mutex<Cache>,
    /// Reads that failed or timed out (apart from appends' warnings, so
    /// a storm of one does not hide the other).
    read_log: Throttle,
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
            flights: Flights::default(),
            cache: Mutex::new(Cache::default()),
            read_log: Throttle::default(),
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
            num_replicas: self.conn.as_ref().map_or(1, |c| c.replicas()),
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
            Ok(m) => Ok(parse(&m.headers).map(|(epoch, offset)| Tip {
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

    fn read_failed(&self, what: &str, error: &str) {
        if self.read_log.allow() {
            tracing::warn!(
                engine = "nats",
                error,
                "JetStream history: {what}; history requests are rejected (logged once per 10 s)"
            );
        }
    }

    /// The stream's history now: shared with the reads of it in flight,
    /// bounded by [`CALL_TIMEOUT`], counted.
    async fn read(
        self: &Arc<Self>,
        ctx: &jetstream::Context,
        name: &str,
    ) -> Result<Arc<Read>, Miss> {
        let (me, ctx2, owned) = (self.clone(), ctx.clone(), name.to_owned());
        let (got, joined) = self
            .flights
            .run(Arc::from(name), move || async move {
                herald_core::metrics::count(&m::HISTORY_READS);
                match tokio::time::timeout(CALL_TIMEOUT, me.read_js(&ctx2, &owned)).await {
                    Ok(r) => r,
                    Err(_) => {
                        herald_core::metrics::count(&m::HISTORY_READ_TIMEOUTS);
                        me.read_failed("a read timed out", "timeout");
                        Err(Miss::Unavailable)
                    }
                }
            })
            .await;
        if joined {
            herald_core::metrics::count(&m::HISTORY_READS_SHARED);
        }
        got.unwrap_or(Err(Miss::Unavailable))
    }

    /// The subject's retained messages up to its tip, oldest first, at
    /// most `history_limit` of them (see the module's comment).
    async fn read_js(&self, ctx: &jetstream::Context, name: &str) -> Result<Arc<Read>, Miss> {
        let subject = subject(&self.base, name);
        let failed = |what: &str, e: &str| {
            herald_core::metrics::count(&m::HISTORY_READ_ERRORS);
            self.read_failed(what, e);
            Miss::Unavailable
        };
        let stream = self
            .stream(ctx, false)
            .await
            .map_err(|e| failed("cannot create the stream", &e))?;
        let tip = match self.tip(&stream, &subject).await {
            Ok(Some(t)) => t,
            Ok(None) => {
                self.cache.lock().remove(name);
                return Err(Miss::UnknownStream);
            }
            Err(e) => return Err(failed("read failed", &e)),
        };
        let cached = self.cache.lock().get(name);
        let now = herald_core::history::now_ms();
        let read = match cached {
            Some(c) if c.at(tip.seq, &tip.epoch, tip.offset) => {
                return Ok(Arc::new((*c).clone().bounded(&self.limits, now)));
            }
            Some(c) if c.extends_to(tip.seq, &tip.epoch, tip.offset) => {
                let expect = (tip.offset - c.offset) as usize;
                let more = self
                    .scan(&stream, &subject, c.seq + 1, &tip, expect)
                    .await
                    .map_err(|e| failed("read failed", &e))?;
                c.extend(tip.seq, tip.offset, more, &self.limits)
            }
            _ => {
                let all = self
                    .scan(&stream, &subject, 1, &tip, self.limits.per_stream)
                    .await
                    .map_err(|e| failed("read failed", &e))?;
                Read {
                    seq: tip.seq,
                    epoch: tip.epoch.clone(),
                    offset: tip.offset,
                    entries: Arc::new(all),
                }
                .bounded(&self.limits, now)
            }
        };
        let read = Arc::new(read);
        self.cache.lock().put(name, read.clone());
        Ok(read)
    }

    /// The subject's messages of `tip`'s epoch from sequence `from` up to
    /// `tip`, oldest first; `expect` of them at most (more are not kept).
    async fn scan(
        &self,
        stream: &Stream<()>,
        subject: &str,
        from: u64,
        tip: &Tip,
        expect: usize,
    ) -> Result<Vec<Entry>, String> {
        let expect = expect.clamp(1, self.limits.per_stream.max(1));
        let mut entries = Vec::new();
        let mut keep = |seq: u64, headers: Option<&HeaderMap>, at_ms: u64, data: &[u8]| {
            if let Some((epoch, offset)) = headers.and_then(parse) {
                if epoch == tip.epoch && seq <= tip.seq {
                    entries.push(Entry {
                        offset,
                        at_ms,
                        data: String::from_utf8_lossy(data).as_ref().into(),
                    });
                }
            }
        };
        if expect <= DIRECT_READS {
            let mut from = Some(from);
            for _ in 0..expect {
                let m = match stream.direct_get_next_for_subject(subject, from).await {
                    Ok(m) => m,
                    Err(e) if e.kind() == DirectGetErrorKind::NotFound => break,
                    Err(e) => return Err(e.to_string()),
                };
                if m.sequence > tip.seq {
                    break;
                }
                keep(
                    m.sequence,
                    Some(&m.headers),
                    unix_ms(m.time.unix_timestamp_nanos()),
                    &m.payload,
                );
                if m.sequence == tip.seq {
                    break;
                }
                from = Some(m.sequence + 1);
            }
            return Ok(entries);
        }
        let consumer: PullConsumer = stream
            .create_consumer(pull::Config {
                filter_subject: subject.to_owned(),
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: from,
                },
                ack_policy: AckPolicy::None,
                inactive_threshold: CONSUMER_IDLE,
                memory_storage: true,
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        let mut batch = consumer
            .fetch()
            .max_messages(expect)
            .messages()
            .await
            .map_err(|e| e.to_string())?;
        while let Some(msg) = batch.next().await {
            let msg = msg.map_err(|e| e.to_string())?;
            let (seq, at) = {
                let info = msg.info().map_err(|e| e.to_string())?;
                (
                    info.stream_sequence,
                    unix_ms(info.published.unix_timestamp_nanos()),
                )
            };
            if seq > tip.seq {
                break;
            }
            keep(seq, msg.headers.as_ref(), at, &msg.payload);
            if seq == tip.seq {
                break;
            }
        }
        Ok(entries)
    }

    async fn after_js(
        self: &Arc<Self>,
        ctx: &jetstream::Context,
        name: &str,
        epoch: &str,
        offset: u64,
    ) -> Result<Backlog, Miss> {
        let read = self.read(ctx, name).await?;
        match answer_after(&read, epoch, offset) {
            // A shared read may have begun before the publication the
            // client already has was appended: ask once more, afresh.
            Err(Miss::Ahead) => answer_after(&*self.read(ctx, name).await?, epoch, offset),
            r => r,
        }
    }
}

fn unix_ms(nanos: i128) -> u64 {
    (nanos / 1_000_000).max(0) as u64
}

/// What an `after` read answers from a subject's messages (all of one
/// epoch, consecutive offsets ending at the read's tip).
fn answer_after(read: &Read, epoch: &str, offset: u64) -> Result<Backlog, Miss> {
    let last = read.offset;
    if *read.epoch != *epoch {
        return Err(Miss::UnknownEpoch);
    }
    if offset > last {
        return Err(Miss::Ahead);
    }
    let first = read.entries.first().map_or(last + 1, |e| e.offset);
    if offset + 1 < first {
        return Err(Miss::Evicted);
    }
    let entries: Vec<Entry> = read
        .entries
        .iter()
        .filter(|e| e.offset > offset)
        .cloned()
        .collect();
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
        epoch: read.epoch.clone(),
        entries,
    })
}

fn parse(headers: &HeaderMap) -> Option<(Arc<str>, u64)> {
    let epoch = headers.get(EPOCH)?.as_str();
    let offset = headers.get(OFFSET)?.as_str().parse().ok()?;
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
            me.after_js(&ctx, &stream, &epoch, offset).await
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
            let read = me.read(&ctx, &stream).await?;
            let from = unix_secs.saturating_mul(1000);
            Ok(Backlog {
                epoch: read.epoch.clone(),
                entries: read
                    .entries
                    .iter()
                    .filter(|e| e.at_ms >= from)
                    .cloned()
                    .collect(),
            })
        })
    }

    fn shared(&self) -> bool {
        !self.local_mode()
    }

    fn sweep(&self) {
        if self.local_mode() {
            self.local.sweep()
        } else {
            self.cache.lock().sweep();
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
                data: "x".into(),
            })
            .collect()
    }

    fn offsets(r: Result<Backlog, Miss>) -> Result<Vec<u64>, Miss> {
        r.map(|b| b.entries.iter().map(|e| e.offset).collect())
    }

    #[test]
    fn after_answers_exactly_or_says_why_not() {
        let at = |kept: Vec<Entry>| Read {
            seq: 9,
            epoch: Arc::from("e"),
            offset: 5,
            entries: Arc::new(kept),
        };
        let read = |offset, kept| offsets(answer_after(&at(kept), "e", offset));
        assert_eq!(read(2, entries(3..=5)), Ok(vec![3, 4, 5]));
        assert_eq!(read(5, entries(3..=5)), Ok(vec![]));
        assert_eq!(read(1, entries(3..=5)), Err(Miss::Evicted));
        assert_eq!(read(6, entries(3..=5)), Err(Miss::Ahead));
        // A hole in what was read (a message lost in between).
        let mut holed = entries(3..=5);
        holed.remove(1);
        assert_eq!(read(2, holed), Err(Miss::Evicted));
        assert_eq!(
            offsets(answer_after(&at(entries(3..=5)), "other", 3)),
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
