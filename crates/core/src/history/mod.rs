//! Stream history: the position of each publication on a reliable stream
//! (an epoch and an offset) and a bounded log of recent publications, so a
//! client that reconnects can ask for exactly what it missed.
//!
//! Vocabulary (ARCHITECTURE.md, "Position"): the offset grows by one per
//! publication; the epoch changes whenever the stream's history may have
//! been lost (a process start for the in-process engine, the stream being
//! evicted, the engine's copy expiring), so a position from before the
//! loss is refused instead of answered wrongly.
//!
//! - [`History`]: the interface an engine implements. The broker hands
//!   reliable publishing one ([`crate::broker::Streams`],
//!   [`crate::reliable::ReliableStreams`]): [`memory::MemoryHistory`]
//!   for one node; the cluster engines keep theirs in Redis Streams or
//!   JetStream, so any node answers from the same history.
//! - [`crate::connection::gate::Gate`]: the per-connection side, so a
//!   client's live deliveries and its history answers never overlap (each
//!   publication once, in order), and, where publications of one stream
//!   come from several nodes, a gap in the offsets is filled from the
//!   history.

pub mod budget;
pub mod memory;

pub use budget::AnswerBudget;
pub use memory::{MemoryHistory, ENTRY_OVERHEAD};

use crate::future::BoxFuture;
use crate::publication::Position;
use bytes::Bytes;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// One retained publication.
#[derive(Debug, Clone)]
pub struct Entry {
    pub offset: u64,
    /// When it was appended, Unix milliseconds.
    pub at_ms: u64,
    /// The message exactly as subscribers got it (JSON text).
    pub data: Data,
}

/// A retained message's JSON text, stored with one `}` after it (not part
/// of the message: [`Data`] derefs to the message alone).
///
/// Why: a history answer used to copy every message into a frame of its
/// own per client (100 streams of 100 messages of 6 KB asked for by a
/// client: 60 MB, per client). A protocol whose frame carries the message
/// as its JSON object's last member ends that frame with exactly
/// [`Data::closing`]: the frame's small per-client head and these shared
/// bytes ([`crate::frame::Frame::text_with_prefix`]), as publications
/// share theirs.
#[derive(Clone, PartialEq, Eq)]
pub struct Data(Bytes);

impl Data {
    /// The message followed by `}`, shared (no copy).
    pub fn closing(&self) -> &Bytes {
        &self.0
    }
}

impl From<&str> for Data {
    fn from(text: &str) -> Data {
        let mut b = Vec::with_capacity(text.len() + 1);
        b.extend_from_slice(text.as_bytes());
        b.push(b'}');
        Data(Bytes::from(b))
    }
}

impl std::ops::Deref for Data {
    type Target = str;

    fn deref(&self) -> &str {
        let text = &self.0[..self.0.len() - 1];
        // SAFETY: built from a `str` and one ASCII byte after it (`From`),
        // which is all this slice leaves out.
        unsafe { std::str::from_utf8_unchecked(text) }
    }
}

impl std::fmt::Debug for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

/// What a history read found: the stream's epoch and the publications.
#[derive(Debug, Clone)]
pub struct Backlog {
    pub epoch: Arc<str>,
    pub entries: Vec<Entry>,
}

/// Why a read cannot answer exactly (the adapter rejects the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// No history for this stream (never reliable, or evicted).
    UnknownStream,
    /// The stream's history was lost since that position was given.
    UnknownEpoch,
    /// Publications after that offset are no longer retained.
    Evicted,
    /// The offset was never reached in this epoch.
    Ahead,
    /// The engine could not be asked (unreachable, timed out).
    Unavailable,
}

/// Bounds of the history, AnyCable's names and defaults.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most publications kept per stream (`history_limit`, 100; 0: off).
    pub per_stream: usize,
    /// Oldest publication kept, milliseconds (`history_ttl`, 300 s).
    pub ttl_ms: u64,
    /// Most bytes of data kept over all streams (`history_max_bytes`);
    /// the in-process engine's bound (a server engine has its own).
    pub max_bytes: usize,
}

impl Limits {
    /// Whether any history is kept at all.
    pub fn enabled(&self) -> bool {
        self.per_stream > 0 && self.ttl_ms > 0
    }
}

/// A history engine: where positions come from and backlogs are read.
///
/// Reads and appends are futures because a cluster engine asks its server;
/// the in-process engine answers at once. Protocols do not append
/// themselves: reliable publishing ([`crate::reliable`],
/// `Node::publish_reliably`) appends, stamps the position and publishes,
/// holding the stream's order while it does.
pub trait History: Send + Sync {
    /// Engine name for logs and docs (`memory`, `redis`, `nats`).
    fn name(&self) -> &'static str;
    /// Keep history for `stream` from now on (a subscriber may need it).
    fn retain(&self, stream: &str);
    /// [`History::retain`], resolving once the engine keeps `stream`'s
    /// history (or could not be made to): a subscription is confirmed
    /// only after this, so a publication made anywhere after the
    /// confirmation gets a position. Engines that mark a stream at once
    /// need not override it.
    fn retain_now(&self, stream: &str) -> BoxFuture<()> {
        self.retain(stream);
        Box::pin(std::future::ready(()))
    }
    /// Whether [`History::append`] may return a position now: when it
    /// cannot, publishers skip appending and ordering altogether.
    fn any_reliable(&self) -> bool;
    /// Record a publication on `stream`; its position, or `None` when the
    /// stream is not reliable or the engine could not record it.
    fn append(&self, stream: &str, data: &str) -> BoxFuture<Option<Position>>;
    /// Publications after `offset` in `epoch`, all of them, or why not.
    fn after(&self, stream: &str, epoch: &str, offset: u64) -> BoxFuture<Result<Backlog, Miss>>;
    /// Publications appended at or after `unix_secs` that are still kept.
    fn since(&self, stream: &str, unix_secs: u64) -> BoxFuture<Result<Backlog, Miss>>;
    /// Whether one stream's publications may reach a node from several
    /// nodes (so out of order, or with one lost between them): then
    /// connections fill gaps in the offsets from the history
    /// ([`crate::connection::gate::Gate`]).
    fn shared(&self) -> bool {
        false
    }
    /// Expire what is past its age (called about once a second).
    fn sweep(&self) {}
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
