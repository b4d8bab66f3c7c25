//! The Redis Cluster transport (`redis-cluster://`): the engine's subjects
//! over sharded pub/sub (`SSUBSCRIBE` / `SPUBLISH`, Redis 7), so a
//! publication is handled by the one shard that owns its channel's slot,
//! never broadcast over the cluster bus to every node as `PUBLISH` is.
//! One cluster connection (RESP3: the messages arrive as pushes on the
//! same connections as the commands) keeps one socket per master.
//!
//! Where the subjects go, and why:
//!
//! - **Channel subjects** (`{prefix}.c.…`: publications, members, counts)
//!   keep their names: each hashes to its own slot, so channels spread
//!   over the shards and a shard carries only its channels' traffic.
//! - **The cluster-wide subjects** (`all`: heartbeats, first/last holders,
//!   requests, state; `node.{id}`: replies) share one slot, the hash tag
//!   `{prefix}` put before their names on the wire. Every node must hear
//!   `all` anyway, so spreading it would not spread its load; on one slot
//!   a node's control messages and the replies to it keep their order
//!   (one shard, one connection).
//! - **The canary** (`canary.{id}`) goes as one copy per master of the
//!   slot map, each behind a hash tag of that master's slots, and counts
//!   as heard once every copy is ([`crate::redis::shards`]): a node that
//!   stops hearing one channel shard is noticed as one that stops hearing
//!   the broker.
//! - **Patterns** (AppSync's trailing wildcards): there is no sharded
//!   `PSUBSCRIBE`. A pattern `/a/b/` is subscribed to as the literal
//!   sharded channel `….%.a.b.*` (its single-server name), and a message to
//!   a channel with several segments is also `SPUBLISH`ed to each of its
//!   ancestors' pattern channels (`/a/b/c`: `….%.*`, `….%.a.*`,
//!   `….%.a.b.*`). That costs one `SPUBLISH` per segment for channels with
//!   `/` (Pusher's names have none: one), each on its slot's shard, instead
//!   of a cluster-wide `PUBLISH` for every publication; a node receiving
//!   one copy through its channel and another through a pattern delivers
//!   one ([`crate::engine`]'s canonical subscription rule).
//!
//! Order: Redis keeps the order of one connection's messages to one
//! shard. Messages to different shards can overtake each other, so a batch
//! is sent in runs: a run of channel messages, then (once those are
//! answered, so handed to the subscribers' sockets) a run of cluster-wide
//! ones, and so on; within a run each slot's messages go as one pipeline,
//! the slots' pipelines together. So a node's presence state on `all` is
//! out before a member change it made afterwards on a channel.
//!
//! Faults: a master that dies (or a connection that drops: the client
//! reports it as a `Disconnection` push), a slot that moves away from
//! under a subscription (the server's own `SUNSUBSCRIBE`), a slot map
//! that differs from the one the session subscribed by (checked every
//! [`TOPOLOGY_CHECK`]: a frozen master failed over tells nobody), a failed
//! command, or a canary not heard back (from any master) end the session,
//! as a broken connection does on one server: the node is not ready, what it would
//! send meanwhile is dropped and counted, and after a backoff (100 ms
//! doubling to 1 s) a new cluster connection reads the slots afresh,
//! subscribes to everything wanted on the shards that own it now (the
//! promoted replica after a failover) and announces the node, whose
//! presence the others reconcile. The client never retries a command by
//! itself (`retries(0)`): a publication it resent after a connection broke
//! mid-call could be delivered twice.

use crate::engine::{Engine, Out, Shared};
use crate::redis::conn::slot;
use crate::redis::shards::ShardCanary;
use crate::tls::BrokerTls;
use futures_util::stream::{self, StreamExt};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionInfo, ProtocolVersion, PushInfo, PushKind, Value};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Most messages taken from the queue in one batch.
const BATCH: usize = 512;

/// Subscriptions in flight at once when subscribing to everything.
const SUBSCRIBE_CONCURRENCY: usize = 64;

/// Longest wait for one node's connection or answer. Shorter than the
/// single server's 5 s: a master that cannot answer a publish within it
/// is treated as gone (the cluster will promote its replica), and a new
/// cluster connection waits this long for a seed that is frozen.
const NODE_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a node compares the cluster's slot map with the one it
/// subscribed by: a master that is frozen (not closed) and failed over
/// never tells its subscribers, who would otherwise hear nothing from its
/// slots' new owner.
const TOPOLOGY_CHECK: Duration = Duration::from_secs(2);

/// Longest pause between reconnect attempts (the single server's is 5 s).
const RETRY_CAP: Duration = Duration::from_secs(1);

/// Longest wait for a whole new cluster connection (seeds, slots, every
/// master's connection).
const TIMEOUT: Duration = Duration::from_secs(10);

/// A Redis Cluster engine on the `redis-cluster://` seeds, with the
/// broker's TLS settings (`broker.tls_*`) on every node's connections
/// (pub/sub and commands).
pub fn engine(
    url: &str,
    prefix: &str,
    ttl: Duration,
    tls: Option<&BrokerTls>,
) -> Result<Engine, String> {
    let seeds = crate::urls::redis_cluster_seeds(url)?;
    let commands =
        crate::redis::conn::Connector::cluster(seeds.clone(), NODE_TIMEOUT, NODE_TIMEOUT, tls)?;
    let streams = crate::redis::streams::RedisStreams::new(commands, prefix);
    let transport = Sharded {
        seeds,
        tls: tls.cloned(),
    };
    Ok(Engine::new(transport, prefix, ttl).with_streams(Arc::new(streams)))
}

/// The transport over a Redis Cluster (sharded pub/sub).
struct Sharded {
    seeds: Vec<redis::ConnectionInfo>,
    tls: Option<BrokerTls>,
}

impl crate::engine::Transport for Sharded {
    fn name(&self) -> &'static str {
        "redis-cluster"
    }
    fn wildcard(&self) -> &'static str {
        "*"
    }
    fn run(
        self: Box<Self>,
        shared: Arc<Shared>,
        outgoing: mpsc::Receiver<Out>,
    ) -> herald_core::future::BoxFuture<()> {
        Box::pin(run(shared, outgoing, self.seeds, self.tls))
    }
}

/// The name a subject has on the wire: the cluster-wide ones behind the
/// hash tag `{prefix}` (one slot), channels as they are.
fn wire(prefix: &str, subject: &str) -> String {
    if is_control(prefix, subject) {
        format!("{{{prefix}}}{subject}")
    } else {
        subject.to_owned()
    }
}

/// The subject a wire name stands for ([`wire`] undone).
fn unwire(name: &str) -> &str {
    match name.strip_prefix('{').and_then(|r| r.split_once('}')) {
        Some((_, subject)) => subject,
        None => name,
    }
}

fn is_control(prefix: &str, subject: &str) -> bool {
    subject.strip_prefix(prefix).is_some_and(|rest| {
        rest == ".all" || rest.starts_with(".node.") || rest.starts_with(".canary.")
    })
}

/// The pattern channels a message to `subject` also goes to: one per
/// proper prefix of its channel's segments (none for a one-segment
/// channel or a cluster-wide subject).
fn ancestors(prefix: &str, subject: &str, wildcard: &str) -> Vec<String> {
    let Some(rest) = subject
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix(".c."))
    else {
        return Vec::new();
    };
    // `{app}.{ns}.{segment}[.{segment}…]`; app and namespace are one token.
    let mut dots = rest.match_indices('.').map(|(i, _)| i);
    let (Some(_), Some(ns_end)) = (dots.next(), dots.next()) else {
        return Vec::new();
    };
    let base = subject.len() - rest.len();
    let mut out = Vec::new();
    for cut in rest[ns_end + 1..]
        .match_indices('.')
        .map(|(i, _)| base + ns_end + 1 + i)
    {
        out.push(format!("{}.{wildcard}", &subject[..cut]));
    }
    out
}

async fn run(
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<Out>,
    seeds: Vec<ConnectionInfo>,
    tls: Option<BrokerTls>,
) {
    let mut attempt = 0u32;
    loop {
        let mut connected = false;
        let err = session(&shared, &mut rx, &seeds, tls.as_ref(), &mut connected).await;
        if connected {
            attempt = 0;
        }
        shared.set_up(false, &err);
        if attempt == 0 && !connected {
            tracing::warn!(engine = "redis-cluster", error = %err, "cannot reach the cluster; retrying");
        } else {
            tracing::debug!(engine = "redis-cluster", error = %err, attempt, "cluster session ended");
        }
        // Back off; what is queued meanwhile is dropped, never kept. At
        // most RETRY_CAP apart: a failover lasts a few seconds, and the
        // node should follow its end soon, not up to 5 s later.
        let until = tokio::time::Instant::now() + crate::backoff(attempt).min(RETRY_CAP);
        attempt = attempt.saturating_add(1);
        if !crate::drop_until(&mut rx, until).await {
            return;
        }
    }
}

/// One cluster connection's life; returns why it ended.
async fn session(
    shared: &Arc<Shared>,
    rx: &mut mpsc::Receiver<Out>,
    seeds: &[ConnectionInfo],
    tls: Option<&BrokerTls>,
    connected: &mut bool,
) -> String {
    let (push_tx, mut pushes) = mpsc::unbounded_channel::<PushInfo>();
    let mut builder = ClusterClient::builder(seeds.to_vec())
        .use_protocol(ProtocolVersion::RESP3)
        .push_sender(push_tx)
        .retries(0)
        .connection_timeout(NODE_TIMEOUT)
        .response_timeout(NODE_TIMEOUT);
    if let Some(t) = tls {
        builder = builder.certs(t.redis());
    }
    let client = match builder.build() {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    let mut conn = match tokio::time::timeout(TIMEOUT, client.get_async_connection()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return e.to_string(),
        Err(_) => return "timed out connecting to the cluster".into(),
    };
    let prefix = shared.prefix.as_str();
    // The slot map this session subscribes by (the canary's copies go to
    // its masters; a change ends the session).
    let slots = match slot_map(&mut conn).await {
        Ok(s) => s,
        Err(e) => return e,
    };
    let mut canary = ShardCanary::new(prefix, &shared.canary_subject(), &slots);
    // Subjects subscribed to, by their engine names.
    let mut subscribed: HashSet<String> = HashSet::new();
    let mut names: Vec<(String, String)> = [shared.all(), shared.own_subject()]
        .into_iter()
        .chain(shared.wanted_now().into_iter().map(|(s, _)| s))
        .map(|s| (wire(prefix, &s), s))
        .collect();
    names.extend(
        canary
            .wires()
            .iter()
            .map(|w| (w.clone(), canary.subject().to_owned())),
    );
    let results: Vec<Result<String, String>> = stream::iter(names)
        .map(|(name, subject)| {
            let mut c = conn.clone();
            async move {
                c.ssubscribe(name)
                    .await
                    .map(|()| subject)
                    .map_err(|e| e.to_string())
            }
        })
        .buffer_unordered(SUBSCRIBE_CONCURRENCY)
        .collect()
        .await;
    for r in results {
        match r {
            Ok(subject) => {
                subscribed.insert(subject);
            }
            Err(e) => return e,
        }
    }
    *connected = true;
    let n = shared.next_connection();
    shared.set_up(true, "");
    // Every SSUBSCRIBE above was answered: the interest is in effect.
    shared.holds_interest(n);
    let mut batch: Vec<Out> = Vec::with_capacity(BATCH);
    // The check runs beside the loop (a call to a frozen node must not
    // hold up the messages), for this session only.
    let (changed_tx, mut changed) = tokio::sync::oneshot::channel::<String>();
    let checker = AbortOnDrop(tokio::spawn(watch_slots(conn.clone(), slots, changed_tx)));
    loop {
        tokio::select! {
            why = &mut changed => {
                drop(checker);
                return why.unwrap_or_else(|_| "slot map check stopped".into());
            }
            p = pushes.recv() => match p {
                Some(p) => {
                    if let Some(why) = on_push(shared, &subscribed, &mut canary, p) {
                        return why;
                    }
                }
                None => return "connection closed".into(),
            },
            _ = shared.wake.notified() => {
                if let Err(e) = apply_dirty(shared, &mut conn, &mut subscribed).await {
                    return e;
                }
            }
            // The canary did not come back: this session's connections are
            // open but deliver nothing; start a new session.
            _ = shared.canary.reconnect.notified() => return "broker canary not heard back".into(),
            n = rx.recv_many(&mut batch, BATCH) => {
                if n == 0 {
                    return "engine stopped".into();
                }
                // Interest changes made before these messages were queued
                // take effect first (a request must find us subscribed).
                if let Err(e) = apply_dirty(shared, &mut conn, &mut subscribed).await {
                    return e;
                }
                let last = batch
                    .iter()
                    .map(|o| match o {
                        Out::Send(_, _, seq) => *seq,
                        Out::Flush(_) => 0,
                    })
                    .max()
                    .unwrap_or(0);
                if let Err(e) = send_batch(shared, &conn, &canary, &mut batch).await {
                    return e;
                }
                // Every run answered: the masters took them.
                shared.taken(last);
            }
        }
    }
}

/// A push from the cluster: a message is handed to the engine; a dropped
/// connection or a subscription the server ended is a reason to start
/// again (returned).
fn on_push(
    shared: &Shared,
    subscribed: &HashSet<String>,
    canary: &mut ShardCanary,
    p: PushInfo,
) -> Option<String> {
    match p.kind {
        PushKind::SMessage => {
            if let [channel, payload, ..] = p.data.as_slice() {
                if let (Some(channel), Some(payload)) = (bytes(channel), bytes(payload)) {
                    if let Ok(name) = std::str::from_utf8(channel) {
                        let subject = unwire(name);
                        if subject == canary.subject() {
                            // One shard's copy: the engine hears the
                            // canary once every shard's has come back.
                            if let Some(n) = canary.heard(name, payload) {
                                shared.on_message(subject, n.to_string().as_bytes());
                            }
                        } else {
                            shared.on_message(subject, payload);
                        }
                    }
                }
            }
            None
        }
        PushKind::Disconnection => Some("a cluster node's connection closed".into()),
        // A SUNSUBSCRIBE this node did not ask for: the channel's slot moved
        // to another shard (resharding, a failover seen by the old master).
        // Ours remove the subject from `subscribed` before they are sent.
        PushKind::SUnsubscribe => {
            let name = p.data.first().and_then(bytes)?;
            let subject = unwire(std::str::from_utf8(name).ok()?);
            subscribed
                .contains(subject)
                .then(|| format!("the cluster moved {subject}'s slot"))
        }
        _ => None,
    }
}

/// Aborts the task when the session that started it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Every [`TOPOLOGY_CHECK`], compare the slot map with `slots` (the one
/// the session subscribed by); say why the session should end, once.
async fn watch_slots(
    mut conn: ClusterConnection,
    slots: Vec<(i64, i64, String)>,
    changed: tokio::sync::oneshot::Sender<String>,
) {
    loop {
        tokio::time::sleep(TOPOLOGY_CHECK).await;
        let why = match slot_map(&mut conn).await {
            Ok(now) if now != slots => "the cluster's slot map changed".to_owned(),
            Ok(_) => continue,
            Err(e) => format!("checking the slot map: {e}"),
        };
        let _ = changed.send(why);
        return;
    }
}

/// Every slot range and its master's address, as `CLUSTER SLOTS` (asked
/// of any node) lists them, sorted.
async fn slot_map(conn: &mut ClusterConnection) -> Result<Vec<(i64, i64, String)>, String> {
    let v: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    let Value::Array(ranges) = v else {
        return Err("unexpected CLUSTER SLOTS answer".into());
    };
    let mut out = Vec::with_capacity(ranges.len());
    for r in &ranges {
        let Value::Array(f) = r else { continue };
        let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(master))) =
            (f.first(), f.get(1), f.get(2))
        else {
            continue;
        };
        let host = master.first().and_then(bytes).unwrap_or_default();
        let port = match master.get(1) {
            Some(Value::Int(p)) => *p,
            _ => 0,
        };
        out.push((
            *first,
            *last,
            format!("{}:{port}", String::from_utf8_lossy(host)),
        ));
    }
    out.sort();
    Ok(out)
}

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

async fn apply_dirty(
    shared: &Shared,
    conn: &mut ClusterConnection,
    subscribed: &mut HashSet<String>,
) -> Result<(), String> {
    for (subject, want, _pattern) in shared.take_dirty() {
        let name = wire(&shared.prefix, &subject);
        match (want, subscribed.contains(&subject)) {
            (true, false) => {
                conn.ssubscribe(&name).await.map_err(|e| e.to_string())?;
                subscribed.insert(subject);
            }
            (false, true) => {
                subscribed.remove(&subject);
                conn.sunsubscribe(&name).await.map_err(|e| e.to_string())?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Send a batch in runs (see the module doc): channel messages and
/// cluster-wide ones alternate only after the run before is answered.
/// When a run fails, its messages (their outcome unknown: some may have
/// been delivered) and the rest of the batch are counted as dropped.
async fn send_batch(
    shared: &Shared,
    conn: &ClusterConnection,
    canary: &ShardCanary,
    batch: &mut Vec<Out>,
) -> Result<(), String> {
    let prefix = shared.prefix.as_str();
    let mut run: Vec<(String, bytes::Bytes)> = Vec::new();
    // Messages in `run` (each with its ancestors' copies).
    let mut in_run = 0usize;
    let mut run_control = false;
    let mut flushes = Vec::new();
    let mut result = Ok(());
    let mut dropped = 0usize;
    for o in batch.drain(..) {
        match o {
            Out::Send(subject, payload, seq) => {
                if result.is_err() {
                    // A publication stays in the journal (sent again on
                    // reconnect); anything else is dropped.
                    dropped += usize::from(seq == 0);
                    continue;
                }
                let control = is_control(prefix, &subject);
                if control != run_control && !run.is_empty() {
                    result = send_run(conn, std::mem::take(&mut run)).await;
                    if result.is_err() {
                        dropped += in_run + 1;
                        continue;
                    }
                    in_run = 0;
                }
                run_control = control;
                if subject == canary.subject() {
                    // A copy through every master (crate::redis::shards).
                    for w in canary.wires() {
                        run.push((w.clone(), payload.clone()));
                    }
                } else {
                    for a in ancestors(prefix, &subject, shared.wildcard) {
                        run.push((a, payload.clone()));
                    }
                    run.push((wire(prefix, &subject), payload));
                }
                in_run += 1;
            }
            Out::Flush(done) => flushes.push(done),
        }
    }
    if !run.is_empty() && result.is_ok() {
        result = send_run(conn, run).await;
        if result.is_err() {
            dropped += in_run;
        }
    }
    for _ in 0..dropped {
        herald_core::metrics::count(&herald_core::metrics::BROKER_DROPPED);
    }
    for done in flushes {
        let _ = done.send(());
    }
    result
}

/// `SPUBLISH` a run: one pipeline per slot, in order within it, the slots
/// together.
async fn send_run(
    conn: &ClusterConnection,
    run: Vec<(String, bytes::Bytes)>,
) -> Result<(), String> {
    let mut pipes: HashMap<u16, redis::Pipeline> = HashMap::new();
    for (name, payload) in &run {
        pipes
            .entry(slot(name.as_bytes()))
            .or_insert_with(redis::pipe)
            .cmd("SPUBLISH")
            .arg(name)
            .arg(payload.as_ref())
            .ignore();
    }
    let sent = pipes.into_values().map(|pipe| {
        let mut c = conn.clone();
        async move { pipe.query_async::<()>(&mut c).await }
    });
    for r in futures_util::future::join_all(sent).await {
        r.map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_wide_subjects_share_one_slot_and_channels_keep_their_names() {
        let p = "h";
        let names = [
            wire(p, "h.all"),
            wire(p, "h.node.42"),
            wire(p, "h.canary.42"),
        ];
        assert_eq!(names[0], "{h}h.all");
        assert!(names.iter().all(|n| slot(n.as_bytes()) == slot(b"h")));
        assert_eq!(unwire(&names[1]), "h.node.42");
        assert_eq!(wire(p, "h.c.app.n.news"), "h.c.app.n.news");
        assert_eq!(unwire("h.c.app.n.news"), "h.c.app.n.news");
        // A channel that merely starts like a control name is a channel.
        assert!(!is_control(p, "h.allx"));
        assert!(!is_control(p, "hh.all"));
    }

    #[test]
    fn a_channel_with_segments_also_goes_to_its_ancestors_patterns() {
        use herald_core::namespace::Namespace;
        let ns = Namespace::new("n");
        let channel = crate::subject::channel("h", "app", ns, "/a/b/c");
        let got = ancestors("h", &channel, "*");
        let want: Vec<String> = ["/", "/a/", "/a/b/"]
            .iter()
            .map(|p| crate::subject::pattern("h", "app", ns, p, "*"))
            .collect();
        assert_eq!(got, want);
        assert!(ancestors("h", &crate::subject::channel("h", "app", ns, "news"), "*").is_empty());
        assert!(ancestors("h", "h.all", "*").is_empty());
        assert!(ancestors("h", "h.node.1", "*").is_empty());
    }
}
