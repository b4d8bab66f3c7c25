//! History and resumable sessions on NATS JetStream (reliable streams): what the
//! NATS engine hands Action Cable instead of per-node stores, so every
//! node answers from the same history and restores the same sessions.
//!
//! - [`history`]: one JetStream stream `{prefix}_history` over subjects
//!   `{prefix}.h.<stream>`, per-subject limits (`history_limit` messages,
//!   `history_ttl` age), epoch and offset in each message's headers.
//! - [`sessions`]: a key-value bucket `{prefix}_sessions` with the
//!   `sessions_ttl` as its max age.
//!
//! Both use their own NATS connection (so a long history read never
//! delays the cluster's pub/sub), made here once for both. JetStream is
//! an option of the server (`nats-server -js`): when the server answers
//! that it has none, one warning says so and both fall back to this
//! node's memory, as on one node. Every call to the server is bounded by
//! [`CALL_TIMEOUT`]; while the server is away, appends give no position
//! and reads `Unavailable` at once, logged once per [`LOG_EVERY`].

mod cache;
mod flight;
pub mod history;
pub mod metrics;
mod pending;
pub mod sessions;

use async_nats::jetstream;
use async_nats::{ConnectOptions, ServerAddr};
use herald_core::broker::Streams;
use herald_core::history::{History, Limits};
use herald_core::sessions::SessionStore;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Longest wait for the server on any one call (append, read, take).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// A repeated condition (server away, appends failing) is logged at most
/// once per this interval.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// After start, how long calls wait for the first answer about JetStream
/// before they give up (later they never wait for it).
const STARTUP: Duration = Duration::from_secs(5);

/// What the node knows about the server's JetStream.
#[derive(Clone)]
pub enum Mode {
    /// Not known yet (connecting).
    Starting,
    /// JetStream answers: history and sessions live there.
    Ready(Box<jetstream::Context>),
    /// The server has no JetStream: per-node history and sessions.
    Local,
}

/// The connection to JetStream both stores share.
pub struct Conn {
    mode: watch::Receiver<Mode>,
    started: Instant,
    client: Mutex<Option<async_nats::Client>>,
    /// Copies of the history stream and the sessions bucket
    /// (`broker.jetstream_replicas`).
    replicas: usize,
}

impl Conn {
    /// How many servers keep a copy of what this node creates.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    pub fn mode(&self) -> Mode {
        self.mode.borrow().clone()
    }

    /// The context if JetStream is there and the connection is up now;
    /// `Err(true)` when the node fell back to its memory, `Err(false)`
    /// when the server cannot be asked now. Waits for the first answer
    /// only during [`STARTUP`].
    pub async fn ready(&self) -> Result<jetstream::Context, bool> {
        let mut rx = self.mode.clone();
        if matches!(*rx.borrow(), Mode::Starting) {
            let left = STARTUP.saturating_sub(self.started.elapsed());
            if left.is_zero() {
                return Err(false);
            }
            let _ = tokio::time::timeout(
                left.min(CALL_TIMEOUT),
                rx.wait_for(|m| !matches!(m, Mode::Starting)),
            )
            .await;
        }
        let mode = rx.borrow().clone();
        match mode {
            Mode::Ready(ctx) => {
                let ctx = *ctx;
                let up = self.client.lock().as_ref().is_some_and(|c| {
                    c.connection_state() == async_nats::connection::State::Connected
                });
                if up {
                    Ok(ctx)
                } else {
                    Err(false)
                }
            }
            Mode::Local => Err(true),
            Mode::Starting => Err(false),
        }
    }
}

/// The NATS engine's [`Streams`]: history and sessions on JetStream.
pub struct JetStream {
    servers: Vec<ServerAddr>,
    prefix: String,
    replicas: usize,
    /// The broker's TLS settings (`broker.tls_*`).
    tls: Option<crate::tls::BrokerTls>,
    conn: OnceLock<Option<Arc<Conn>>>,
}

impl JetStream {
    pub fn new(servers: Vec<ServerAddr>, prefix: &str) -> JetStream {
        JetStream {
            servers,
            prefix: prefix.to_owned(),
            replicas: 1,
            tls: None,
            conn: OnceLock::new(),
        }
    }

    /// Connect with the broker's TLS settings.
    pub fn with_tls(mut self, tls: Option<crate::tls::BrokerTls>) -> JetStream {
        self.tls = tls;
        self
    }

    /// Keep `n` copies of the history stream and the sessions bucket (a
    /// JetStream cluster of at least `n` servers; JetStream refuses more).
    pub fn with_replicas(mut self, n: usize) -> JetStream {
        self.replicas = n.max(1);
        self
    }

    /// The shared connection, started on first use; `None` outside a
    /// Tokio runtime (then the stores are per node).
    fn conn(&self) -> Option<Arc<Conn>> {
        self.conn
            .get_or_init(|| {
                let runtime = tokio::runtime::Handle::try_current().ok()?;
                let (tx, rx) = watch::channel(Mode::Starting);
                let conn = Arc::new(Conn {
                    mode: rx,
                    started: Instant::now(),
                    client: Mutex::new(None),
                    replicas: self.replicas,
                });
                runtime.spawn(probe(
                    conn.clone(),
                    tx,
                    self.servers.clone(),
                    self.tls.clone(),
                ));
                Some(conn)
            })
            .clone()
    }
}

impl Streams for JetStream {
    fn history(&self, limits: Limits) -> Arc<dyn History> {
        metrics::register_all();
        Arc::new(history::NatsHistory::new(self.conn(), &self.prefix, limits))
    }

    fn sessions(&self, ttl: Duration, max: usize) -> Arc<dyn SessionStore> {
        metrics::register_all();
        sessions::NatsSessions::start(self.conn(), &self.prefix, ttl, max)
    }
}

/// Connection options shared with the pub/sub transport (credentials from
/// the URLs, which [`crate::urls`] made sure agree; the broker's TLS
/// settings; reconnects forever with the crate's backoff, to any server of
/// the list or that the servers told of).
pub fn options(
    servers: &[ServerAddr],
    name: &str,
    tls: Option<&crate::tls::BrokerTls>,
) -> ConnectOptions {
    let options = ConnectOptions::new()
        .name(name)
        .retry_on_initial_connect()
        .max_reconnects(None::<usize>)
        .connection_timeout(Duration::from_secs(5))
        .ping_interval(Duration::from_secs(5))
        .reconnect_delay_callback(|n| crate::backoff(n as u32));
    let mut options = crate::tls::BrokerTls::nats(tls, options);
    let Some(addr) = servers.first() else {
        return options;
    };
    match (addr.username(), addr.password()) {
        (Some(u), Some(p)) => options = options.user_and_password(u.into(), p.into()),
        (Some(token), None) => options = options.token(token.into()),
        _ => {}
    }
    options
}

/// Connect, then ask the server about JetStream until it answers: ready,
/// or none (one warning, per-node fallback for the life of the process).
async fn probe(
    conn: Arc<Conn>,
    tx: watch::Sender<Mode>,
    servers: Vec<ServerAddr>,
    tls: Option<crate::tls::BrokerTls>,
) {
    let client = match options(&servers, "herald-jetstream", tls.as_ref())
        .connect(servers)
        .await
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(engine = "nats", error = %e, "cannot start the JetStream client; history and sessions are per node");
            let _ = tx.send(Mode::Local);
            return;
        }
    };
    *conn.client.lock() = Some(client.clone());
    let ctx = jetstream::ContextBuilder::new()
        .timeout(CALL_TIMEOUT)
        .build(client.clone());
    let log = Throttle::default();
    let mut attempt = 0u32;
    loop {
        match has_jetstream(&client).await {
            Ok(true) => {
                tracing::info!(engine = "nats", "history and sessions on JetStream");
                let _ = tx.send(Mode::Ready(Box::new(ctx)));
                return;
            }
            Ok(false) => {
                tracing::warn!(
                    engine = "nats",
                    "the NATS server has no JetStream: stream history and resumable sessions are kept per node \
                     (a client that reconnects to another node cannot recover); run nats-server with -js"
                );
                let _ = tx.send(Mode::Local);
                return;
            }
            Err(e) => {
                if log.allow() {
                    tracing::warn!(engine = "nats", error = %e, "JetStream not reachable yet; retrying");
                }
            }
        }
        tokio::time::sleep(crate::backoff(attempt)).await;
        attempt = attempt.saturating_add(1);
    }
}

/// Ask `$JS.API.INFO` (a raw request: the answer's shape varies between
/// server versions, and only its error code matters here): no responder,
/// or JetStream's "not enabled" codes, mean the server has none.
async fn has_jetstream(client: &async_nats::Client) -> Result<bool, String> {
    use async_nats::RequestErrorKind;
    let asked = tokio::time::timeout(
        CALL_TIMEOUT,
        client.request("$JS.API.INFO", bytes::Bytes::new()),
    )
    .await
    .map_err(|_| "timed out".to_owned())?;
    match asked {
        Ok(reply) => {
            let v: serde_json::Value =
                serde_json::from_slice(&reply.payload).map_err(|e| e.to_string())?;
            let code = v["error"]["err_code"].as_u64();
            Ok(!matches!(code, Some(10039) | Some(10076)))
        }
        Err(e) if e.kind() == RequestErrorKind::NoResponders => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

/// Lets a repeated condition through once per [`LOG_EVERY`].
#[derive(Default)]
pub struct Throttle(AtomicU64);

impl Throttle {
    pub fn allow(&self) -> bool {
        let now = herald_core::history::now_ms();
        let last = self.0.load(Ordering::Relaxed);
        (last == 0 || now.saturating_sub(last) >= LOG_EVERY.as_millis() as u64)
            && self
                .0
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}
