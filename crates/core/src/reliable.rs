//! Reliable publishing: publications on a stream a client may resume get
//! a position (epoch, offset) in the stream's history before they go out,
//! so a client that comes back with the last position it saw is answered
//! exactly what it missed, once, in order. The history lives in the
//! broker's engine ([`crate::broker::Streams`]): in process on one node,
//! Redis Streams or JetStream in a cluster, where any node answers.
//!
//! One [`ReliableStreams`] per protocol that resumes its clients. How a
//! protocol asks for it:
//!
//! 1. At start, one value from the broker and the protocol's bounds:
//!    `ReliableStreams::new(&*node.broker, limits)`, then
//!    [`ReliableStreams::start_sweeper`] (inside the runtime).
//! 2. A client that may resume subscribes to a stream: await
//!    [`ReliableStreams::follow`] before confirming it (on a cluster
//!    engine the stream is then reliable on the server, so a publication
//!    made anywhere after the confirmation has a position), and call
//!    [`ReliableStreams::unfollow`] when it leaves. Streams nobody follows
//!    keep no history and publish exactly as any other.
//! 3. Publish through [`crate::node::Node::publish_reliably`]: the node
//!    orders the stream's publications, appends each to the history,
//!    stamps its position on it ([`crate::publication::Publication::position`],
//!    which the protocol's [`crate::publication::Wire`] writes in its
//!    frame) and delivers it; it returns the position (`None` when the
//!    stream is not reliable).
//! 4. A client resumes: read what it missed with
//!    [`ReliableStreams::after`] (after the position it gives: the SSE
//!    `Last-Event-ID`, Action Cable's `{epoch, offset}`) or
//!    [`ReliableStreams::since`] (a time). A [`crate::history::Miss`]
//!    means the history cannot answer exactly: tell the client to start
//!    over. Give the connection a gate (`Connection::with_gate`,
//!    [`crate::connection::gate::Gate`]): `hold` the stream before
//!    subscribing, then `release` it with the backlog read, so live
//!    deliveries and the answer never overlap; where the engine is
//!    [`ReliableStreams::shared`], let the gate fill gaps in the live
//!    offsets from the history: `gate.heal_with(streams.healer(..))`
//!    ([`ReliableStreams::healer`]).
//!
//! A stream's history is keyed by the stream's name alone: two protocols
//! on one engine that name the same stream share it.

use crate::broker::Broker;
use crate::connection::gate::{Gap, Healer};
use crate::connection::Connection;
use crate::frame::Frame;
use crate::future::BoxFuture;
use crate::history::{Backlog, Entry, History, Limits, MemoryHistory, Miss};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

/// Publications to one stream are appended and handed to fan-out under
/// one of these locks, so live delivery sees offsets in order (the
/// connection gate drops anything at or below what it already sent).
const ORDER_LOCKS: usize = 64;

/// One protocol's reliable streams: their history, the per-stream order
/// of their publications, and the streams this node's clients follow.
pub struct ReliableStreams {
    /// The broker's history engine: in process on one node, the engine's
    /// server in a cluster.
    history: Arc<dyn History>,
    order: Vec<tokio::sync::Mutex<()>>,
    /// Streams this node's clients follow, and how many follow each:
    /// retained again every `retain_every` seconds, so a stream followed
    /// for hours but published to rarely stays reliable (an engine forgets
    /// a stream idle past its history's age).
    followed: Mutex<HashMap<Box<str>, usize>>,
    /// Half the history's age, 1 to 10 s.
    retain_every: u64,
}

impl ReliableStreams {
    /// Reliable streams whose history `broker`'s engine keeps within
    /// `limits`; with limits that keep nothing, no stream is ever
    /// reliable, whatever the engine.
    pub fn new(broker: &dyn Broker, limits: Limits) -> ReliableStreams {
        let history: Arc<dyn History> = if limits.enabled() {
            broker.history(limits)
        } else {
            Arc::new(MemoryHistory::new(limits))
        };
        ReliableStreams::with_history(history, limits)
    }

    /// Reliable streams kept in `history` (made with `limits`).
    pub fn with_history(history: Arc<dyn History>, limits: Limits) -> ReliableStreams {
        ReliableStreams {
            history,
            order: (0..ORDER_LOCKS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            followed: Mutex::new(HashMap::new()),
            retain_every: (limits.ttl_ms / 1000 / 2).clamp(1, 10),
        }
    }

    /// The history engine itself (its name, its reads).
    pub fn history(&self) -> &Arc<dyn History> {
        &self.history
    }

    /// A client follows `stream`: it is reliable once the returned future
    /// resolves (on a cluster engine, once the server marked it), which
    /// the subscription's confirmation waits for.
    pub fn follow(&self, stream: &str) -> BoxFuture<()> {
        *self.followed.lock().entry(stream.into()).or_default() += 1;
        self.history.retain_now(stream)
    }

    /// One follower of `stream` left.
    pub fn unfollow(&self, stream: &str) {
        let mut followed = self.followed.lock();
        if let Some(n) = followed.get_mut(stream) {
            *n -= 1;
            if *n == 0 {
                followed.remove(stream);
            }
        }
    }

    /// Publications of `stream` after `offset` in `epoch` (the last
    /// position a client saw), all of them, or why not.
    pub fn after(
        &self,
        stream: &str,
        epoch: &str,
        offset: u64,
    ) -> BoxFuture<Result<Backlog, Miss>> {
        self.history.after(stream, epoch, offset)
    }

    /// Publications of `stream` appended at or after `unix_secs` that are
    /// still kept.
    pub fn since(&self, stream: &str, unix_secs: u64) -> BoxFuture<Result<Backlog, Miss>> {
        self.history.since(stream, unix_secs)
    }

    /// Whether one stream's publications may reach a node from several
    /// nodes: then a connection's gate fills gaps in the live offsets from
    /// [`ReliableStreams::after`].
    pub fn shared(&self) -> bool {
        self.history.shared()
    }

    /// A healer for `conn`'s gate ([`crate::connection::gate::Gate::heal_with`], where the engine
    /// is [`ReliableStreams::shared`]): a gap in a stream's live offsets
    /// (publications from several nodes crossed, or the broker lost one) is
    /// read from the history after the last offset the connection got, off
    /// the fan-out worker, and the missing publications go out before the
    /// held live ones. `frame` encodes one history entry for the gap's
    /// subscription (the protocol's history frame); `filled` hears whether
    /// the read answered (the protocol counts it); unanswered, the live
    /// publications go on without the missing ones.
    pub fn healer<F>(self: &Arc<Self>, conn: &Arc<Connection>, frame: F, filled: fn(bool)) -> Healer
    where
        F: Fn(&Gap, &Entry, &Arc<str>) -> Frame + Send + Sync + 'static,
    {
        let me = self.clone();
        let conn = Arc::downgrade(conn);
        let frame = Arc::new(frame);
        Box::new(move |gap| {
            let (me, conn, frame) = (me.clone(), conn.clone(), frame.clone());
            tokio::spawn(async move {
                let read = me.after(&gap.channel, &gap.epoch, gap.after).await;
                let Some(conn) = conn.upgrade() else { return };
                let Some(gate) = conn.gate() else { return };
                filled(read.is_ok());
                gate.release(
                    &conn,
                    &gap.channel,
                    &gap.tag,
                    read.as_ref().ok(),
                    |e, epoch| frame(&gap, e, epoch),
                );
            });
        })
    }

    /// Retain every followed stream again (see `followed`).
    fn retain_followed(&self) {
        let streams: Vec<Box<str>> = self.followed.lock().keys().cloned().collect();
        for s in &streams {
            self.history.retain(s);
        }
    }

    /// Expire history once a second (a task on the runtime). Outside a
    /// runtime (a router built in-process by a test) there is no sweeper,
    /// and the history stays bounded by its counts and bytes alone.
    pub fn start_sweeper(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let me = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut ticks: u64 = 0;
            loop {
                tick.tick().await;
                let Some(me) = me.upgrade() else { return };
                ticks += 1;
                if ticks.is_multiple_of(me.retain_every) {
                    me.retain_followed();
                }
                me.history.sweep();
            }
        });
    }

    /// Whether any stream may be reliable now: when none can, publishing
    /// skips appending and ordering altogether.
    pub(crate) fn any(&self) -> bool {
        self.history.any_reliable()
    }

    /// Hold `stream`'s publishing order: its publications are appended and
    /// handed on one at a time, in the order they took this.
    pub(crate) async fn order(&self, stream: &str) -> tokio::sync::MutexGuard<'_, ()> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        stream.hash(&mut h);
        self.order[h.finish() as usize % ORDER_LOCKS].lock().await
    }

    /// Record a publication of `stream`; its position, or `None`.
    pub(crate) fn append(
        &self,
        stream: &str,
        data: &str,
    ) -> BoxFuture<Option<crate::publication::Position>> {
        self.history.append(stream, data)
    }
}
