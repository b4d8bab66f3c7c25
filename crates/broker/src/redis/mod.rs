//! The Redis transport: one pub/sub connection (SUBSCRIBE for channels,
//! PSUBSCRIBE for patterns) and one connection for PUBLISH, pipelined: the
//! writer takes everything queued (up to [`BATCH`]) and sends it in one
//! round trip, in order. A broken connection ends the session; the next
//! one starts after a backoff (100 ms doubling to 5 s; at most 500 ms with
//! Sentinels), subscribes to
//! everything wanted again and announces the node (see [`crate::engine`]).
//! Stream history and sessions live on the same server, over a connection
//! of their own: [`crate::redis::streams`].
//!
//! Each session asks [`Master`] where the master is, so with a Sentinel
//! URL a session ended by a failover (the old master gone, a `-READONLY`
//! answer, a silent canary) starts again on the promoted replica.

pub mod cluster;
pub mod conn;
pub mod link;
pub mod master;
pub mod sessions;
pub mod shards;
pub mod streams;

use crate::engine::{Engine, Out, Shared};
use crate::redis::master::Master;
use futures_util::StreamExt;
use redis::AsyncConnectionConfig;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Most messages sent in one pipeline.
const BATCH: usize = 512;

/// Subjects per SUBSCRIBE when subscribing to everything at once.
const SUBSCRIBE_CHUNK: usize = 256;

const TIMEOUT: Duration = Duration::from_secs(5);

/// With Sentinels, how often a session checks that its server is still
/// the master (`ROLE`; Sentinel normally closes a demoted master's
/// clients itself, this is the backstop).
const ROLE_EVERY: Duration = Duration::from_secs(5);

/// A Redis engine on the server a `redis://` URL names, or on the master
/// the Sentinels of a `redis-sentinel://` URL name, with the broker's TLS
/// settings (`broker.tls_*`) on every connection.
pub fn engine(
    url: &str,
    prefix: &str,
    ttl: Duration,
    tls: Option<&crate::tls::BrokerTls>,
) -> Result<Engine, String> {
    let master = Master::parse_with(url, tls)?;
    let streams = crate::redis::streams::RedisStreams::new(
        crate::redis::conn::Connector::Single(master.clone()),
        prefix,
    );
    Ok(Engine::new(Single { master }, prefix, ttl).with_streams(Arc::new(streams)))
}

/// The transport over one Redis server (or the Sentinels' master).
struct Single {
    master: Master,
}

impl crate::engine::Transport for Single {
    fn name(&self) -> &'static str {
        "redis"
    }
    fn wildcard(&self) -> &'static str {
        "*"
    }
    fn run(
        self: Box<Self>,
        shared: Arc<Shared>,
        outgoing: mpsc::Receiver<Out>,
    ) -> herald_core::future::BoxFuture<()> {
        Box::pin(run(shared, outgoing, self.master))
    }
}

async fn run(shared: Arc<Shared>, mut rx: mpsc::Receiver<Out>, master: Master) {
    let mut attempt = 0u32;
    loop {
        let mut connected = false;
        let err = session(&shared, &mut rx, &master, &mut connected).await;
        if connected {
            attempt = 0;
        }
        shared.set_up(false, &err);
        if attempt == 0 && !connected {
            tracing::warn!(engine = "redis", error = %err, "cannot reach the broker; retrying");
        }
        // Back off; what is queued meanwhile is dropped, never kept.
        let until = tokio::time::Instant::now() + master.backoff(attempt);
        attempt = attempt.saturating_add(1);
        if !crate::drop_until(&mut rx, until).await {
            return;
        }
    }
}

/// One connection's life; returns why it ended.
async fn session(
    shared: &Arc<Shared>,
    rx: &mut mpsc::Receiver<Out>,
    master: &Master,
    connected: &mut bool,
) -> String {
    let client = match master.client().await {
        Ok(c) => c,
        Err(e) => return e,
    };
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(TIMEOUT))
        .set_response_timeout(Some(TIMEOUT));
    let mut conn = match client
        .get_multiplexed_async_connection_with_config(&config)
        .await
    {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    let pubsub = match tokio::time::timeout(TIMEOUT, client.get_async_pubsub()).await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return e.to_string(),
        Err(_) => return "timed out opening the pub/sub connection".into(),
    };
    let (mut sink, mut stream) = pubsub.split();
    let mut exact: HashSet<String> = HashSet::new();
    let mut patterns: HashSet<String> = HashSet::new();
    let base = [shared.all(), shared.own_subject(), shared.canary_subject()];
    if let Err(e) = sink.subscribe(&base).await {
        return e.to_string();
    }
    let wanted = shared.wanted_now();
    let (p, e): (Vec<_>, Vec<_>) = wanted.into_iter().partition(|(_, pattern)| *pattern);
    for chunk in e.chunks(SUBSCRIBE_CHUNK) {
        let names: Vec<&str> = chunk.iter().map(|(s, _)| s.as_str()).collect();
        if let Err(e) = sink.subscribe(&names).await {
            return e.to_string();
        }
        exact.extend(names.iter().map(|s| s.to_string()));
    }
    for chunk in p.chunks(SUBSCRIBE_CHUNK) {
        let names: Vec<&str> = chunk.iter().map(|(s, _)| s.as_str()).collect();
        if let Err(e) = sink.psubscribe(&names).await {
            return e.to_string();
        }
        patterns.extend(names.iter().map(|s| s.to_string()));
    }
    *connected = true;
    let n = shared.next_connection();
    shared.set_up(true, "");
    // Every SUBSCRIBE above was answered: the interest is in effect.
    shared.holds_interest(n);
    let mut batch: Vec<Out> = Vec::with_capacity(BATCH);
    let sentinel = matches!(master, Master::Sentinel(_));
    let mut role_check =
        tokio::time::interval_at(tokio::time::Instant::now() + ROLE_EVERY, ROLE_EVERY);
    loop {
        tokio::select! {
            m = stream.next() => match m {
                Some(m) => {
                    let via = if m.from_pattern() {
                        m.get_pattern::<String>().unwrap_or_default()
                    } else {
                        m.get_channel_name().to_owned()
                    };
                    shared.on_message(&via, m.get_payload_bytes());
                }
                None => return "connection closed".into(),
            },
            _ = shared.wake.notified() => {
                if let Err(e) = apply_dirty(shared, &mut sink, &mut exact, &mut patterns).await {
                    return e;
                }
            }
            // The canary did not come back: this session's connections are
            // open but deliver nothing; start a new session.
            _ = shared.canary.reconnect.notified() => return "broker canary not heard back".into(),
            // A demoted master still takes PUBLISH and SUBSCRIBE (replicas
            // do) and the canary still comes back through it, so nothing
            // else would notice that the other nodes moved to the new one.
            _ = role_check.tick(), if sentinel => {
                if let Err(e) = still_master(&mut conn).await {
                    return e;
                }
            }
            n = rx.recv_many(&mut batch, BATCH) => {
                if n == 0 {
                    return "engine stopped".into();
                }
                // Interest changes made before these messages were queued
                // take effect first (a request must find us subscribed).
                if let Err(e) = apply_dirty(shared, &mut sink, &mut exact, &mut patterns).await {
                    return e;
                }
                let mut pipe = redis::pipe();
                let mut flushes = Vec::new();
                let mut any = false;
                let mut last = 0;
                for o in batch.drain(..) {
                    match o {
                        Out::Send(subject, bytes, seq) => {
                            pipe.cmd("PUBLISH").arg(subject).arg(bytes.as_ref()).ignore();
                            any = true;
                            last = last.max(seq);
                        }
                        Out::Flush(done) => flushes.push(done),
                    }
                }
                let r: redis::RedisResult<()> = if any {
                    pipe.query_async(&mut conn).await
                } else {
                    Ok(())
                };
                for done in flushes {
                    let _ = done.send(());
                }
                if let Err(e) = r {
                    return e.to_string();
                }
                // Every PUBLISH answered: the server took them.
                shared.taken(last);
            }
        }
    }
}

async fn apply_dirty(
    shared: &Shared,
    sink: &mut redis::aio::PubSubSink,
    exact: &mut HashSet<String>,
    patterns: &mut HashSet<String>,
) -> Result<(), String> {
    for (subject, want, pattern) in shared.take_dirty() {
        let set = if pattern { &mut *patterns } else { &mut *exact };
        let r = match (want, set.contains(&subject), pattern) {
            (true, false, false) => sink.subscribe(&subject).await,
            (true, false, true) => sink.psubscribe(&subject).await,
            (false, true, false) => sink.unsubscribe(&subject).await,
            (false, true, true) => sink.punsubscribe(&subject).await,
            _ => continue,
        };
        r.map_err(|e| e.to_string())?;
        if want {
            set.insert(subject);
        } else {
            set.remove(&subject);
        }
    }
    Ok(())
}

/// `Ok` while the server answers `ROLE` as a master.
async fn still_master(conn: &mut redis::aio::MultiplexedConnection) -> Result<(), String> {
    let role: Vec<redis::Value> = redis::cmd("ROLE")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    match role.first() {
        Some(redis::Value::BulkString(b)) if b == b"master" => Ok(()),
        _ => Err("the server is no longer the master (demoted); asking the sentinels again".into()),
    }
}
