//! Raw messages from one channel of the broker's server, for adapters that
//! take publications from outside the cluster (an app publishing straight
//! to Redis or NATS). Its own connection, beside the engine's: a Redis
//! `SUBSCRIBE` or a NATS subscription to the name as given (no prefix),
//! reconnecting with the engine's backoff (100 ms doubling to 5 s).
//!
//! [`subscribe`]: every node that asks subscribes, so every node receives
//! every message: the caller delivers what arrives to its own node's
//! subscribers only. Messages sent while a node's connection is down are
//! not received there (pub/sub is at most once), as with the engine's own
//! publications.
//!
//! [`consume_stream`]: a Redis stream read through a consumer group, so
//! each entry goes to one node, which publishes it to the cluster; entries
//! wait in Redis while no node reads.
//!
//! On a Redis Cluster (`redis-cluster://`, `rediss-cluster://`): a plain
//! `PUBLISH` is forwarded over the cluster bus to every node, masters and
//! replicas, so a plain `SUBSCRIBE` on any one node hears what the app
//! publishes through any other; the ingress subscribes on the URL's seeds,
//! the next one after each broken connection. The stream is one key: its
//! commands go through a cluster connection to the master of its slot.
//!
//! Every connection carries the broker's TLS settings (`broker.tls_*`,
//! [`crate::tls`]), as the engine's do.

use crate::redis_conn::Connector;
use crate::redis_master::Master;
use crate::tls::BrokerTls;
use bytes::Bytes;
use futures_util::StreamExt;
use herald_core::adapter::StreamEntry;
use std::time::Duration;
use tokio::sync::mpsc;

/// Messages received and not yet taken before newer ones are dropped.
pub const QUEUE: usize = 4096;

/// Largest message passed on; longer ones are dropped (and logged).
pub const MAX_MESSAGE: usize = 4 << 20;

const TIMEOUT: Duration = Duration::from_secs(5);

/// Subscribe to `channel` on the server at `url` (`redis://`, `rediss://`,
/// `nats://` or `tls://`, as `broker.url`), with the broker's TLS settings
/// `tls`. Call inside a Tokio runtime; the subscription lives until the
/// receiver is dropped.
pub fn subscribe(
    url: &str,
    tls: Option<&BrokerTls>,
    channel: &str,
) -> Result<mpsc::Receiver<Bytes>, String> {
    let (tx, rx) = mpsc::channel(QUEUE);
    let channel = channel.to_owned();
    if let Some(source) = Source::parse(url, tls)? {
        tokio::spawn(redis_loop(source, channel, tx));
    } else if url.starts_with("nats://") || url.starts_with("tls://") {
        // A list of servers, as the engine takes it (a NATS cluster).
        let servers = crate::urls::nats_servers(url).map_err(|e| format!("broker.url: {e}"))?;
        tokio::spawn(nats_loop(servers, tls.cloned(), channel, tx));
    } else {
        return Err("broker.url: an ingress needs a redis:// or nats:// broker".into());
    }
    Ok(rx)
}

/// Where the ingress's Redis connections go.
enum Source {
    /// One server, or the master the Sentinels name at each connection.
    Master(Master),
    /// A Redis Cluster's seed nodes, the next one to try, the TLS settings.
    Cluster(
        Vec<redis::ConnectionInfo>,
        std::sync::atomic::AtomicUsize,
        Option<BrokerTls>,
    ),
}

impl Source {
    /// The Redis source `url` names; `None` for another kind of URL.
    fn parse(url: &str, tls: Option<&BrokerTls>) -> Result<Option<Source>, String> {
        let bad = |e: String| format!("broker.url: {e}");
        if url.starts_with("redis-cluster://") || url.starts_with("rediss-cluster://") {
            let seeds = crate::urls::redis_cluster_seeds(url).map_err(bad)?;
            return Ok(Some(Source::Cluster(
                seeds,
                Default::default(),
                tls.cloned(),
            )));
        }
        if is_redis(url) {
            return Ok(Some(Source::Master(
                Master::parse_with(url, tls).map_err(bad)?,
            )));
        }
        Ok(None)
    }

    /// A client for one server: the master now, or the next seed (a
    /// plain `SUBSCRIBE` hears the cluster's `PUBLISH`es on any node).
    async fn client(&self) -> Result<redis::Client, String> {
        match self {
            Source::Master(m) => m.client().await,
            Source::Cluster(seeds, next, tls) => {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % seeds.len();
                BrokerTls::redis_client(tls.as_ref(), seeds[i].clone())
            }
        }
    }

    /// The command connection for a stream: the cluster's routes each
    /// command to its key's master. `call` bounds one call.
    fn connector(&self, call: Duration) -> Result<Connector, String> {
        match self {
            Source::Master(m) => Ok(Connector::Single(m.clone())),
            Source::Cluster(seeds, _, tls) => {
                Connector::cluster(seeds.clone(), TIMEOUT, call, tls.as_ref())
            }
        }
    }

    fn backoff(&self, n: u32) -> Duration {
        match self {
            Source::Master(m) => m.backoff(n),
            Source::Cluster(..) => crate::backoff(n),
        }
    }
}

/// Hand one message on; false once nobody listens.
fn pass(tx: &mpsc::Sender<Bytes>, channel: &str, payload: Bytes) -> bool {
    if payload.len() > MAX_MESSAGE {
        tracing::warn!(
            channel,
            bytes = payload.len(),
            "ingress message over {MAX_MESSAGE} bytes dropped"
        );
        return true;
    }
    match tx.try_send(payload) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(_)) => {
            herald_core::metrics::count(&herald_core::metrics::BROKER_DROPPED);
            true
        }
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    }
}

/// What became of a stream entry offered to the caller.
enum Offer {
    Taken,
    Refused,
    /// Nobody listens any more.
    Closed,
}

/// Offer one stream entry and wait for the caller's answer. An entry over
/// [`MAX_MESSAGE`] is dropped (logged), as on a channel: taken.
async fn offer(tx: &mpsc::Sender<StreamEntry>, stream: &str, payload: Bytes) -> Offer {
    if payload.len() > MAX_MESSAGE {
        tracing::warn!(
            stream,
            bytes = payload.len(),
            "ingress message over {MAX_MESSAGE} bytes dropped"
        );
        return Offer::Taken;
    }
    let (taken, answer) = tokio::sync::oneshot::channel();
    if tx.send(StreamEntry { payload, taken }).await.is_err() {
        return Offer::Closed;
    }
    match answer.await {
        Ok(false) => Offer::Refused,
        // Answered, or dropped without an answer (taken).
        _ => Offer::Taken,
    }
}

/// A `redis://`, `rediss://` or Sentinel URL.
fn is_redis(url: &str) -> bool {
    url.starts_with("redis://") || url.starts_with("rediss://") || Master::is_sentinel_url(url)
}

/// Each connection is made to the master [`Master`] names then, so a
/// Sentinel failover (which closes the old master's pub/sub clients) is
/// followed; on a cluster, to the next seed.
async fn redis_loop(source: Source, channel: String, tx: mpsc::Sender<Bytes>) {
    let mut attempt = 0u32;
    loop {
        let err = async {
            let client = source.client().await?;
            let mut pubsub = tokio::time::timeout(TIMEOUT, client.get_async_pubsub())
                .await
                .map_err(|_| "timed out connecting".to_string())?
                .map_err(|e| e.to_string())?;
            pubsub
                .subscribe(&channel)
                .await
                .map_err(|e| e.to_string())?;
            attempt = 0;
            tracing::info!(engine = "redis", channel, "ingress subscribed");
            let mut stream = pubsub.on_message();
            loop {
                tokio::select! {
                    m = stream.next() => match m {
                        Some(m) => {
                            if !pass(&tx, &channel, Bytes::copy_from_slice(m.get_payload_bytes())) {
                                return Ok(());
                            }
                        }
                        None => return Err("connection closed".to_string()),
                    },
                    _ = tx.closed() => return Ok(()),
                }
            }
        }
        .await;
        match err {
            Ok(()) => return,
            Err(e) => {
                if attempt == 0 {
                    tracing::warn!(engine = "redis", channel, error = %e, "ingress lost its connection; retrying");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(source.backoff(attempt)) => {}
            _ = tx.closed() => return,
        }
        attempt = attempt.saturating_add(1);
    }
}

async fn nats_loop(
    servers: Vec<async_nats::ServerAddr>,
    tls: Option<BrokerTls>,
    channel: String,
    tx: mpsc::Sender<Bytes>,
) {
    // The engine's options: credentials, TLS, retries for ever.
    let options = crate::jetstream::options(&servers, "herald-ingress", tls.as_ref());
    let client = match options.connect(servers).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(engine = "nats", channel, error = %e, "cannot start the ingress client");
            return;
        }
    };
    // The client resubscribes by itself after a reconnect.
    let mut sub = match client.subscribe(channel.clone()).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(engine = "nats", channel, error = %e, "ingress cannot subscribe");
            return;
        }
    };
    tracing::info!(engine = "nats", channel, "ingress subscribed");
    loop {
        tokio::select! {
            m = sub.next() => match m {
                Some(m) => {
                    if !pass(&tx, &channel, m.payload) {
                        return;
                    }
                }
                None => return,
            },
            _ = tx.closed() => return,
        }
    }
}

/// Messages of a Redis stream through a consumer group (AnyCable's
/// `redisx` adapter): the group is created at the stream's end if missing
/// (`XGROUP CREATE … $ MKSTREAM`), every node reads with `XREADGROUP` as
/// its own consumer, so each entry goes to one node; the entry's `payload`
/// field is passed on, one entry at a time, and the entry is acknowledged
/// and deleted once the caller says it took it. One the caller refuses
/// (the engine's outbox is full) stays pending, and so do the rest of its
/// batch: after [`REFUSED_PAUSE`] this consumer reads its own pending
/// entries again, in order, before anything new. Entries a consumer took
/// and never acknowledged (its node died, or it has been refusing for a
/// while) are claimed by another after `block` idle time (`XAUTOCLAIM`).
/// The caller publishes what arrives to the whole cluster.
pub fn consume_stream(
    url: &str,
    tls: Option<&BrokerTls>,
    stream: &str,
    group: &str,
) -> Result<mpsc::Receiver<StreamEntry>, String> {
    let Some(source) = Source::parse(url, tls)? else {
        return Err("broker.url: a Redis stream needs a redis:// broker".into());
    };
    // One call may block for the read's block time.
    let connector = source.connector(TIMEOUT + Duration::from_millis(BLOCK_MS))?;
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::spawn(stream_loop(
        source,
        connector,
        stream.to_owned(),
        group.to_owned(),
        tx,
    ));
    Ok(rx)
}

/// How long one `XREADGROUP` waits for entries (AnyCable's default), and
/// how long an entry stays unacknowledged before another consumer takes it.
const BLOCK_MS: u64 = 2000;
/// Entries read at once.
const READ_COUNT: usize = 100;

/// After a refusal, how long before the refused entry is offered again
/// (the `Retry-After` of an HTTP publish).
const REFUSED_PAUSE: Duration = Duration::from_millis(200);

async fn stream_loop(
    source: Source,
    connector: Connector,
    stream: String,
    group: String,
    tx: mpsc::Sender<StreamEntry>,
) {
    let consumer = format!("herald-{:016x}", rand::random::<u64>());
    let mut attempt = 0u32;
    loop {
        let err = async {
            let mut conn = connector
                .connect(TIMEOUT, TIMEOUT + Duration::from_millis(BLOCK_MS))
                .await?;
            let created: redis::RedisResult<()> = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(&stream)
                .arg(&group)
                .arg("$")
                .arg("MKSTREAM")
                .query_async(&mut conn)
                .await;
            if let Err(e) = created {
                if e.code() != Some("BUSYGROUP") {
                    return Err(e.to_string());
                }
            }
            attempt = 0;
            tracing::info!(
                engine = "redis",
                stream,
                group,
                consumer,
                "stream ingress reading"
            );
            // This consumer's own pending entries come first after a
            // refusal or a reconnect (read from the start of its list).
            let mut own = true;
            loop {
                if tx.is_closed() {
                    return Ok(());
                }
                let mut entries = Vec::new();
                if own {
                    let read: redis::Value = redis::cmd("XREADGROUP")
                        .arg("GROUP")
                        .arg(&group)
                        .arg(&consumer)
                        .arg("COUNT")
                        .arg(READ_COUNT)
                        .arg("STREAMS")
                        .arg(&stream)
                        .arg("0")
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    entries = read_entries(&read);
                    own = !entries.is_empty();
                }
                if !own {
                    // Entries another consumer left unacknowledged for too long.
                    let claimed: redis::Value = redis::cmd("XAUTOCLAIM")
                        .arg(&stream)
                        .arg(&group)
                        .arg(&consumer)
                        .arg(BLOCK_MS)
                        .arg("0-0")
                        .arg("COUNT")
                        .arg(READ_COUNT)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    entries = match &claimed {
                        redis::Value::Array(parts) => {
                            parts.get(1).map(entries_of).unwrap_or_default()
                        }
                        _ => Vec::new(),
                    };
                    let read: redis::Value = redis::cmd("XREADGROUP")
                        .arg("GROUP")
                        .arg(&group)
                        .arg(&consumer)
                        .arg("COUNT")
                        .arg(READ_COUNT)
                        .arg("BLOCK")
                        .arg(BLOCK_MS)
                        .arg("STREAMS")
                        .arg(&stream)
                        .arg(">")
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    entries.extend(read_entries(&read));
                }
                // Acknowledged once taken; the first refusal leaves it and
                // the rest pending, read again after a pause.
                let mut done = Vec::with_capacity(entries.len());
                let mut refused = false;
                for (id, payload) in entries {
                    match payload {
                        Some(p) => match offer(&tx, &stream, p).await {
                            Offer::Taken => done.push(id),
                            Offer::Refused => {
                                refused = true;
                                break;
                            }
                            Offer::Closed => return Ok(()),
                        },
                        None => {
                            tracing::debug!(
                                stream,
                                id,
                                "stream entry without a payload field; dropped"
                            );
                            done.push(id);
                        }
                    }
                }
                if !done.is_empty() {
                    let _: redis::RedisResult<()> = redis::pipe()
                        .cmd("XACK")
                        .arg(&stream)
                        .arg(&group)
                        .arg(&done)
                        .ignore()
                        .cmd("XDEL")
                        .arg(&stream)
                        .arg(&done)
                        .ignore()
                        .query_async(&mut conn)
                        .await;
                }
                if refused {
                    own = true;
                    tokio::select! {
                        _ = tokio::time::sleep(REFUSED_PAUSE) => {}
                        _ = tx.closed() => return Ok(()),
                    }
                }
            }
        }
        .await;
        match err {
            Ok(()) => return,
            Err(e) => {
                if attempt == 0 {
                    tracing::warn!(engine = "redis", stream, error = %e, "stream ingress lost its connection; retrying");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(source.backoff(attempt)) => {}
            _ = tx.closed() => return,
        }
        attempt = attempt.saturating_add(1);
    }
}

fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        redis::Value::SimpleString(s) => Some(s.clone()),
        redis::Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// `[[id, [field, value, ...]], ...]` → (id, the `payload` field).
fn entries_of(v: &redis::Value) -> Vec<(String, Option<Bytes>)> {
    let redis::Value::Array(list) = v else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|e| {
            let redis::Value::Array(pair) = e else {
                return None;
            };
            let id = text(pair.first()?)?;
            let payload = match pair.get(1) {
                Some(redis::Value::Array(fields)) => fields
                    .chunks(2)
                    .find(|kv| kv.len() == 2 && text(&kv[0]).as_deref() == Some("payload"))
                    .and_then(|kv| match &kv[1] {
                        redis::Value::BulkString(b) => Some(Bytes::copy_from_slice(b)),
                        other => text(other).map(Bytes::from),
                    }),
                _ => None,
            };
            Some((id, payload))
        })
        .collect()
}

/// An `XREADGROUP` answer: nil (nothing within the block time), or
/// `[[stream, entries]]` (RESP2) / `{stream: entries}` (RESP3).
fn read_entries(v: &redis::Value) -> Vec<(String, Option<Bytes>)> {
    match v {
        redis::Value::Array(streams) => streams
            .iter()
            .flat_map(|s| match s {
                redis::Value::Array(pair) if pair.len() == 2 => entries_of(&pair[1]),
                _ => Vec::new(),
            })
            .collect(),
        redis::Value::Map(pairs) => pairs.iter().flat_map(|(_, e)| entries_of(e)).collect(),
        _ => Vec::new(),
    }
}

// Whether the ingress is subscribed yet is not observable from outside:
// the tests publish until a message arrives.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{BrokerServer, Kind};

    /// `listed`: the ingress is given the server in a list after one
    /// that is down, as a NATS cluster's URLs are written.
    async fn roundtrip(kind: Kind, listed: bool) {
        let server = BrokerServer::start(kind);
        let url = server.url();
        let given = if listed {
            format!("nats://127.0.0.1:1,{url}")
        } else {
            url.clone()
        };
        let mut rx = subscribe(&given, None, "__ingress_test__").unwrap();
        // Publish with the server's own tools' protocol until one arrives
        // (the subscription is made in the background).
        let publisher = async {
            match kind {
                Kind::Redis => {
                    let client = redis::Client::open(url.as_str()).unwrap();
                    let mut c = client.get_multiplexed_async_connection().await.unwrap();
                    loop {
                        let _: i64 = redis::cmd("PUBLISH")
                            .arg("__ingress_test__")
                            .arg("hello")
                            .query_async(&mut c)
                            .await
                            .unwrap();
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                Kind::Nats => {
                    let c = async_nats::connect(url.as_str()).await.unwrap();
                    loop {
                        c.publish("__ingress_test__", Bytes::from_static(b"hello"))
                            .await
                            .unwrap();
                        c.flush().await.unwrap();
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        };
        let got = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::select! {
                m = rx.recv() => m,
                _ = publisher => None,
            }
        })
        .await
        .expect("a message within 10 s");
        assert_eq!(got.as_deref(), Some(&b"hello"[..]));
    }

    #[tokio::test]
    async fn redis_messages_arrive() {
        roundtrip(Kind::Redis, false).await;
    }

    #[tokio::test]
    async fn nats_messages_arrive() {
        roundtrip(Kind::Nats, false).await;
    }

    #[tokio::test]
    async fn nats_messages_arrive_through_a_list_of_servers() {
        roundtrip(Kind::Nats, true).await;
    }

    /// An entry a consumer read and never acknowledged (its node died) is
    /// claimed and passed on once it has been idle for the block time;
    /// passed entries are acknowledged and deleted.
    #[tokio::test]
    async fn stream_entries_left_by_a_dead_consumer_are_claimed() {
        let server = BrokerServer::start(Kind::Redis);
        let client = redis::Client::open(server.url()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg("s")
            .arg("bx")
            .arg("$")
            .arg("MKSTREAM")
            .query_async(&mut c)
            .await
            .unwrap();
        let _: String = redis::cmd("XADD")
            .arg("s")
            .arg("*")
            .arg("payload")
            .arg("orphan")
            .query_async(&mut c)
            .await
            .unwrap();
        // The dead consumer takes it and never acknowledges it.
        let taken: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("bx")
            .arg("dead")
            .arg("STREAMS")
            .arg("s")
            .arg(">")
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(read_entries(&taken).len(), 1);
        let mut rx = consume_stream(&server.url(), None, "s", "bx").unwrap();
        let _: String = redis::cmd("XADD")
            .arg("s")
            .arg("*")
            .arg("other")
            .arg("no payload field")
            .query_async(&mut c)
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("claimed within 10 s");
        assert_eq!(got.map(|e| e.answer(true)).as_deref(), Some(&b"orphan"[..]));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let len: u64 = redis::cmd("XLEN")
                .arg("s")
                .query_async(&mut c)
                .await
                .unwrap();
            if len == 0 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{len} entries left");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(consume_stream("nats://127.0.0.1:1", None, "s", "bx").is_err());
    }

    #[test]
    fn other_urls_are_refused() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let _g = rt.enter();
        assert!(subscribe("local", None, "x").is_err());
    }
}
