//! Herald's metrics, exposed in Prometheus text format on `/metrics`
//! through the `metrics` crate and its Prometheus exporter.
//!
//! Two kinds of counting, by how hot the path is:
//!
//! - **Hot paths** (frames delivered, bytes and messages in and out,
//!   socket writes) count into [`Sharded`] counters: one cache line per
//!   shard, a thread always adding to its own shard, so worker threads never
//!   contend on one atomic. Their totals are handed to the `metrics`
//!   recorder when `/metrics` is scraped ([`render`]).
//! - **Everything else** (API requests, client-event rejections, the
//!   fan-out time histogram, once per publication; adapters' own, such as
//!   Pusher's webhooks) records straight into the `metrics` recorder.
//!
//! Labels are the app and the protocol (plus a bounded reason, endpoint or
//! status), never a channel or a user: the number of series stays bounded.
//! The names are a contract (tests, dashboards, alerts);
//! docs/webhooks-and-monitoring.md lists every one.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

// ----- sharded counters ------------------------------------------------------

/// Shards per counter: more than the threads that count on most machines.
const SHARDS: usize = 16;

#[repr(align(64))]
struct Slot(AtomicU64);

/// A counter spread over cache lines; each thread adds to its own.
pub struct Sharded([Slot; SHARDS]);

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn shard() -> usize {
    SHARD.with(|s| {
        let mut i = s.get();
        if i == usize::MAX {
            i = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
            s.set(i);
        }
        i
    })
}

impl Sharded {
    pub const fn new() -> Sharded {
        Sharded([const { Slot(AtomicU64::new(0)) }; SHARDS])
    }

    pub fn add(&self, n: u64) {
        self.0[shard()].0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

impl Default for Sharded {
    fn default() -> Self {
        Sharded::new()
    }
}

/// A process-wide counter without labels.
pub struct Counter {
    pub name: &'static str,
    pub help: &'static str,
    value: Sharded,
}

impl Counter {
    pub const fn new(name: &'static str, help: &'static str) -> Counter {
        Counter {
            name,
            help,
            value: Sharded::new(),
        }
    }

    pub fn get(&self) -> u64 {
        self.value.get()
    }
}

pub fn count(c: &Counter) {
    c.value.add(1);
}

pub fn add(c: &Counter, n: u64) {
    c.value.add(n);
}

pub static CONNECTIONS_REFUSED: Counter = Counter::new(
    "herald_connections_refused_total",
    "Connections refused at open (unknown or disabled app, quota, protocol version, draining)",
);
pub static BAD_MESSAGES: Counter = Counter::new(
    "herald_bad_messages_total",
    "Client frames rejected: invalid JSON, wrong shape, unknown event, binary, invalid UTF-8, too large",
);
pub static RATE_LIMITED: Counter = Counter::new(
    "herald_rate_limited_total",
    "Client messages or client events refused by a rate limit",
);
pub static SUBSCRIPTION_ERRORS: Counter = Counter::new(
    "herald_subscription_errors_total",
    "Subscriptions refused (bad name, bad auth, limits)",
);
pub static SLOW_CLIENTS_CLOSED: Counter = Counter::new(
    "herald_slow_clients_closed_total",
    "Connections closed because their outbound queue was full",
);
pub static MESSAGES_PUBLISHED: Counter = Counter::new(
    "herald_messages_published_total",
    "Events published to channels (from this node's API and clients, and from other nodes)",
);
pub static FRAMES_DELIVERED: Counter = Counter::new(
    "herald_frames_delivered_total",
    "Frames queued to subscribers",
);
pub static SOCKET_WRITES: Counter = Counter::new(
    "herald_socket_writes_total",
    "Batches of frames written to client sockets (one flush each)",
);
pub static DIRECT_WRITES: Counter = Counter::new(
    "herald_direct_writes_total",
    "Frames written to a quiet connection's socket by their sender, skipping the session (also counted in herald_socket_writes_total)",
);
pub static DIRECT_WRITES_CUT: Counter = Counter::new(
    "herald_direct_writes_cut_total",
    "Direct writes a full socket buffer cut short; the session wrote the rest",
);
pub static FRAMES_ENCODED: Counter = Counter::new(
    "herald_frames_encoded_total",
    "Publication frames built (once per protocol and tag, then shared)",
);
pub static FRAMES_COMPRESSED: Counter = Counter::new(
    "herald_frames_compressed_total",
    "Publication frames compressed with permessage-deflate (once per protocol and tag, then shared)",
);
pub static DEFLATE_CONNECTIONS: Counter = Counter::new(
    "herald_websocket_deflate_connections_total",
    "WebSocket upgrades that negotiated permessage-deflate",
);
pub static FANOUT_JOBS: Counter = Counter::new(
    "herald_fanout_jobs_total",
    "Publications fanned out to this node's subscribers",
);
pub static FANOUT_MICROS: Counter = Counter::new(
    "herald_fanout_microseconds_total",
    "Time spent queueing publications to subscribers, in microseconds",
);
pub static FANOUT_OVERFLOW: Counter = Counter::new(
    "herald_fanout_overflow_total",
    "Broker publications queued while a fan-out worker was full",
);
pub static BROKER_RECEIVED: Counter = Counter::new(
    "herald_broker_publications_received_total",
    "Publications received from other nodes through the broker",
);
pub static BROKER_DROPPED: Counter = Counter::new(
    "herald_broker_dropped_total",
    "Messages for other nodes dropped: the broker was unreachable or the engine's queue was full",
);
pub static BROKER_OUTAGES: Counter = Counter::new(
    "herald_broker_outages_total",
    "Times the connection to the broker was lost",
);
pub static CONFIRMATIONS_HELD: Counter = Counter::new(
    "herald_confirmations_held_total",
    "Subscription confirmations that waited for the broker to hold the channel's interest",
);
pub static CONFIRMATIONS_REFUSED: Counter = Counter::new(
    "herald_confirmations_refused_total",
    "Subscriptions answered with a retryable error: the broker did not hold their interest within broker.confirm_timeout",
);
pub static BROKER_REFUSED: Counter = Counter::new(
    "herald_broker_refused_total",
    "Publications refused (HTTP 503) because the outbox for the broker was full",
);
pub static BROKER_RECOVERED: Counter = Counter::new(
    "herald_broker_recovered_total",
    "Publications of other nodes recovered from their window after an outage",
);
pub static BROKER_UNRECOVERED: Counter = Counter::new(
    "herald_broker_unrecovered_total",
    "Publications of other nodes that could not be recovered after an outage (gone from the \
     publishing node's window, or the node gone): an upper bound",
);
pub static BROKER_DUPLICATES: Counter = Counter::new(
    "herald_broker_duplicates_total",
    "Publications from other nodes received twice (a resend after a reconnect) and dropped",
);
pub static API_ERRORS: Counter = Counter::new(
    "herald_api_errors_total",
    "HTTP API requests answered with an error",
);

/// A process-wide gauge without labels, set by the part that owns the
/// figure and read when scraping.
pub struct Gauge {
    pub name: &'static str,
    pub help: &'static str,
    value: AtomicU64,
}

impl Gauge {
    pub const fn new(name: &'static str, help: &'static str) -> Gauge {
        Gauge {
            name,
            help,
            value: AtomicU64::new(0),
        }
    }

    pub fn set(&self, v: u64) {
        self.value.store(v, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

pub static CLUSTER_TALLY_KEYS: Gauge = Gauge::new(
    "herald_cluster_tally_keys",
    "Other nodes' occupied channels and presence members this node keeps for occupancy webhooks \
     (non-zero only on the leader and its successor)",
);

pub static CLUSTER_NODES: Gauge = Gauge::new(
    "herald_cluster_nodes",
    "Nodes this node knows to be alive in its cluster, itself included (0 without a broker)",
);

/// Bytes of history answers (and held publications) waiting past the
/// outbound bound of their connections, over all connections
/// ([`crate::history::budget`]).
pub static HISTORY_ANSWER_BYTES: Gauge = Gauge::new(
    "herald_history_answer_bytes",
    "Bytes of history answers waiting past their connections' outbound queue bound, over the whole node (bounded by rpc.history_answers_max_bytes)",
);

pub static BROKER_OUTBOX: Gauge = Gauge::new(
    "herald_broker_outbox",
    "Publications for other nodes not yet taken by the broker (held while it is away)",
);

static GAUGES: [&Gauge; 4] = [
    &CLUSTER_TALLY_KEYS,
    &CLUSTER_NODES,
    &HISTORY_ANSWER_BYTES,
    &BROKER_OUTBOX,
];

static ALL: [&Counter; 26] = [
    &CONNECTIONS_REFUSED,
    &BAD_MESSAGES,
    &RATE_LIMITED,
    &SUBSCRIPTION_ERRORS,
    &SLOW_CLIENTS_CLOSED,
    &MESSAGES_PUBLISHED,
    &FRAMES_DELIVERED,
    &SOCKET_WRITES,
    &DIRECT_WRITES,
    &DIRECT_WRITES_CUT,
    &FRAMES_ENCODED,
    &FRAMES_COMPRESSED,
    &DEFLATE_CONNECTIONS,
    &FANOUT_JOBS,
    &FANOUT_MICROS,
    &BROKER_RECEIVED,
    &FANOUT_OVERFLOW,
    &BROKER_DROPPED,
    &BROKER_OUTAGES,
    &CONFIRMATIONS_HELD,
    &CONFIRMATIONS_REFUSED,
    &BROKER_REFUSED,
    &BROKER_RECOVERED,
    &BROKER_UNRECOVERED,
    &BROKER_DUPLICATES,
    &API_ERRORS,
];

/// Counters an adapter defines for itself (its own `static`s), handed to
/// the recorder beside the core's.
static EXTRA: parking_lot::Mutex<Vec<&'static Counter>> = parking_lot::Mutex::new(Vec::new());

/// Add an adapter's counter to `/metrics` (once; registering it again, or a
/// counter with the same name, does nothing).
pub fn register(c: &'static Counter) {
    let mut extra = EXTRA.lock();
    if !ALL.iter().chain(extra.iter()).any(|e| e.name == c.name) {
        extra.push(c);
        ::metrics::describe_counter!(c.name, c.help);
    }
}

// ----- per (app, protocol) traffic ---------------------------------------------

/// Why a connection ended, as the `reason` label of
/// `herald_connections_closed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The client closed or went away.
    Client,
    /// Writing to the socket failed or timed out.
    WriteError,
    SlowConsumer,
    Terminated,
    Shutdown,
    KeepAliveTimeout,
    RateLimited,
    /// The client's bytes broke the WebSocket protocol or the wire format.
    ProtocolError,
    /// The adapter closed it with a code of its own.
    Adapter,
    /// It held nothing and said nothing for `ws_idle_timeout`.
    IdleTimeout,
}

impl Closed {
    const ALL: [Closed; 10] = [
        Closed::Client,
        Closed::WriteError,
        Closed::SlowConsumer,
        Closed::Terminated,
        Closed::Shutdown,
        Closed::KeepAliveTimeout,
        Closed::RateLimited,
        Closed::ProtocolError,
        Closed::Adapter,
        Closed::IdleTimeout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Closed::Client => "client",
            Closed::WriteError => "write_error",
            Closed::SlowConsumer => "slow_consumer",
            Closed::Terminated => "terminated",
            Closed::Shutdown => "shutdown",
            Closed::KeepAliveTimeout => "keepalive_timeout",
            Closed::RateLimited => "rate_limited",
            Closed::ProtocolError => "protocol_error",
            Closed::Adapter => "adapter",
            Closed::IdleTimeout => "idle_timeout",
        }
    }
}

/// The connections and messages of one (app, protocol): what the session
/// loop counts. Each session holds an `Arc` to its own.
pub struct Traffic {
    pub app: Box<str>,
    pub protocol: &'static str,
    opened: AtomicU64,
    closed: [AtomicU64; Closed::ALL.len()],
    received: Sharded,
    received_bytes: Sharded,
    sent: Sharded,
    sent_bytes: Sharded,
}

impl Traffic {
    fn new(app: &str, protocol: &'static str) -> Traffic {
        Traffic {
            app: app.into(),
            protocol,
            opened: AtomicU64::new(0),
            closed: Default::default(),
            received: Sharded::new(),
            received_bytes: Sharded::new(),
            sent: Sharded::new(),
            sent_bytes: Sharded::new(),
        }
    }

    pub fn opened(&self) {
        self.opened.fetch_add(1, Ordering::Relaxed);
    }

    pub fn closed(&self, why: Closed) {
        self.closed[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// One client message of `bytes` bytes arrived.
    pub fn received(&self, bytes: usize) {
        self.received.add(1);
        self.received_bytes.add(bytes as u64);
    }

    /// `frames` frames of `bytes` bytes in all were written to a client.
    pub fn sent(&self, frames: usize, bytes: usize) {
        self.sent.add(frames as u64);
        self.sent_bytes.add(bytes as u64);
    }

    /// Connections open now (opened minus closed).
    pub fn open(&self) -> u64 {
        let closed: u64 = self.closed.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        self.opened.load(Ordering::Relaxed).saturating_sub(closed)
    }

    pub fn messages_received(&self) -> u64 {
        self.received.get()
    }

    pub fn messages_sent(&self) -> u64 {
        self.sent.get()
    }
}

/// Traffic counters by (app, protocol).
type TrafficMap = HashMap<(Box<str>, &'static str), Arc<Traffic>>;

static TRAFFIC: OnceLock<Mutex<TrafficMap>> = OnceLock::new();

/// The traffic counters of (`app`, `protocol`), created on first use. A
/// session looks its own up once, when it starts.
pub fn traffic(app: &str, protocol: &'static str) -> Arc<Traffic> {
    let mut map = TRAFFIC.get_or_init(Default::default).lock();
    if let Some(t) = map.get(&(Box::from(app), protocol)) {
        return t.clone();
    }
    let t = Arc::new(Traffic::new(app, protocol));
    map.insert((app.into(), protocol), t.clone());
    t
}

/// Every (app, protocol) seen so far.
pub fn all_traffic() -> Vec<Arc<Traffic>> {
    TRAFFIC
        .get_or_init(Default::default)
        .lock()
        .values()
        .cloned()
        .collect()
}

// ----- the recorder ----------------------------------------------------------------

/// Buckets of `herald_fanout_seconds`: 10 µs to 1 s.
const FANOUT_BUCKETS: [f64; 12] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.1, 1.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Install the Prometheus recorder (once per process; later calls return
/// the same handle). `None` if another recorder was installed first.
pub fn init() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("herald_fanout_seconds".into()),
                    &FANOUT_BUCKETS,
                )
                .ok()?;
            let handle = builder.install_recorder().ok()?;
            describe();
            Some(handle)
        })
        .as_ref()
}

fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    for c in ALL {
        describe_counter!(c.name, c.help);
    }
    for g in GAUGES {
        describe_gauge!(g.name, g.help);
    }
    describe_gauge!(
        "herald_connections",
        "Open client connections (by app and protocol)"
    );
    describe_counter!(
        "herald_connections_opened_total",
        "Client connections accepted (by app and protocol)"
    );
    describe_counter!(
        "herald_connections_closed_total",
        "Client connections ended, by reason (client, write_error, slow_consumer, terminated, \
         shutdown, keepalive_timeout, rate_limited, protocol_error, adapter, idle_timeout)"
    );
    describe_counter!(
        "herald_listener_refused_total",
        "Connections turned away by the listener before any request was served, by reason \
         (address_connections, address_rate, address_overflow, fd_limit)"
    );
    describe_counter!(
        "herald_accept_errors_total",
        "Failed accepts, by reason (fd_limit: out of file descriptors; other)"
    );
    describe_counter!(
        "herald_http_timeouts_total",
        "HTTP connections closed for want of a request head within http_header_timeout, by \
         reason (head: none finished yet; keepalive: idle after a response)"
    );
    describe_counter!(
        "herald_messages_received_total",
        "Messages received from clients"
    );
    describe_counter!(
        "herald_bytes_received_total",
        Unit::Bytes,
        "Bytes of messages received from clients (payloads)"
    );
    describe_counter!("herald_messages_sent_total", "Frames written to clients");
    describe_counter!(
        "herald_bytes_sent_total",
        Unit::Bytes,
        "Bytes written to clients (whole WebSocket frames)"
    );
    describe_gauge!("herald_channels", "Channels with subscribers on this node");
    describe_gauge!("herald_subscriptions", "Subscriptions on this node");
    describe_gauge!(
        "herald_cache_bytes",
        Unit::Bytes,
        "Bytes held by cache channels' last events (at most max_cache_bytes per app)"
    );
    describe_gauge!(
        "herald_cache_events",
        "Cache channels' last events held on this node"
    );
    describe_counter!(
        "herald_cache_evictions_total",
        "Cached events evicted (least recently used first) to keep within max_cache_bytes"
    );
    describe_histogram!(
        "herald_fanout_seconds",
        Unit::Seconds,
        "Time to queue one publication to this node's subscribers"
    );
    describe_counter!(
        "herald_client_events_rejected_total",
        "Client events refused, by reason"
    );
    describe_counter!(
        "herald_api_requests_total",
        "HTTP API requests, by endpoint and status"
    );
    describe_gauge!(
        "herald_broker_up",
        "1 while the cluster broker is connected, else 0"
    );
}

/// Time one publication's fan-out took.
pub fn observe_fanout(took: Duration) {
    count(&FANOUT_JOBS);
    add(&FANOUT_MICROS, took.as_micros() as u64);
    static HISTOGRAM: OnceLock<::metrics::Histogram> = OnceLock::new();
    if init().is_some() {
        HISTOGRAM
            .get_or_init(|| ::metrics::histogram!("herald_fanout_seconds"))
            .record(took.as_secs_f64());
    }
}

/// A client event refused (`reason`: a short fixed word).
pub fn client_event_rejected(app: &str, protocol: &'static str, reason: &'static str) {
    ::metrics::counter!("herald_client_events_rejected_total",
        "app" => app.to_owned(), "protocol" => protocol, "reason" => reason)
    .increment(1);
}

/// An HTTP API request answered. `endpoint` is the route's pattern (never
/// the path itself); `app` is a configured app's id or empty.
pub fn api_request(app: &str, protocol: &'static str, endpoint: &str, status: u16) {
    ::metrics::counter!("herald_api_requests_total",
        "app" => app.to_owned(), "protocol" => protocol,
        "endpoint" => endpoint.to_owned(), "status" => status.to_string())
    .increment(1);
}

/// A connection or request refused for its `Origin` (see
/// [`crate::origin`]).
pub fn origin_refused(app: &str, protocol: &'static str) {
    ::metrics::counter!("herald_origins_refused_total",
        "app" => app.to_owned(), "protocol" => protocol)
    .increment(1);
}

/// A read of the apps' source (the database) that failed: the apps read
/// last stay in force.
pub fn apps_source_error() {
    ::metrics::counter!("herald_apps_source_errors_total").increment(1);
}

/// A connection the listener turned away (`reason`: a short fixed word).
/// Once per refused accept, never per message.
pub fn listener_refused(reason: &'static str) {
    ::metrics::counter!("herald_listener_refused_total", "reason" => reason).increment(1);
}

/// An accept that failed (`reason`: `fd_limit` or `other`).
pub fn accept_error(reason: &'static str) {
    ::metrics::counter!("herald_accept_errors_total", "reason" => reason).increment(1);
}

/// An HTTP connection cut by `http_header_timeout` (`reason`: `head` or
/// `keepalive`).
pub fn http_timeout(reason: &'static str) {
    ::metrics::counter!("herald_http_timeouts_total", "reason" => reason).increment(1);
}

/// One app's figures that are read when scraping, not counted.
pub struct AppGauges<'a> {
    pub app: &'a str,
    pub channels: usize,
    pub subscriptions: usize,
    /// Bytes and events held by the app's cache channels.
    pub cache_bytes: usize,
    pub cache_events: usize,
    /// Cached events evicted to keep within `max_cache_bytes`.
    pub cache_evictions: u64,
}

/// Bounds memory: histograms hold samples until this runs (the server runs
/// it on its housekeeping tick and before each scrape).
pub fn upkeep() {
    if let Some(h) = init() {
        h.run_upkeep();
    }
}

/// Everything in Prometheus text format: the counters above, every
/// (app, protocol)'s traffic, and the gauges read now.
pub fn render(apps: &[AppGauges<'_>], broker: &'static str, broker_up: bool) -> String {
    use ::metrics::{counter, gauge};
    let Some(handle) = init() else {
        return String::new();
    };
    let extra = EXTRA.lock().clone();
    for c in ALL.iter().copied().chain(extra) {
        counter!(c.name).absolute(c.get());
    }
    for g in GAUGES {
        gauge!(g.name).set(g.get() as f64);
    }
    for t in all_traffic() {
        let (app, protocol) = (t.app.to_string(), t.protocol);
        let labels = [("app", app), ("protocol", protocol.to_owned())];
        gauge!("herald_connections", &labels).set(t.open() as f64);
        counter!("herald_connections_opened_total", &labels)
            .absolute(t.opened.load(Ordering::Relaxed));
        for why in Closed::ALL {
            let n = t.closed[why as usize].load(Ordering::Relaxed);
            if n > 0 {
                let mut l = labels.to_vec();
                l.push(("reason", why.as_str().to_owned()));
                counter!("herald_connections_closed_total", &l).absolute(n);
            }
        }
        counter!("herald_messages_received_total", &labels).absolute(t.received.get());
        counter!("herald_bytes_received_total", &labels).absolute(t.received_bytes.get());
        counter!("herald_messages_sent_total", &labels).absolute(t.sent.get());
        counter!("herald_bytes_sent_total", &labels).absolute(t.sent_bytes.get());
    }
    for a in apps {
        let app = a.app.to_owned();
        gauge!("herald_channels", "app" => app.clone()).set(a.channels as f64);
        gauge!("herald_subscriptions", "app" => app.clone()).set(a.subscriptions as f64);
        gauge!("herald_cache_bytes", "app" => app.clone()).set(a.cache_bytes as f64);
        gauge!("herald_cache_events", "app" => app.clone()).set(a.cache_events as f64);
        counter!("herald_cache_evictions_total", "app" => app).absolute(a.cache_evictions);
    }
    gauge!("herald_broker_up", "broker" => broker).set(if broker_up { 1.0 } else { 0.0 });
    handle.run_upkeep();
    handle.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharded_counts_from_many_threads() {
        static C: Sharded = Sharded::new();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..1000 {
                        C.add(1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(C.get(), 8000);
    }

    #[test]
    fn traffic_is_shared_per_app_and_protocol() {
        let a = traffic("metrics-test-app", "p1");
        let b = traffic("metrics-test-app", "p1");
        let c = traffic("metrics-test-app", "p2");
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        a.opened();
        a.opened();
        b.closed(Closed::Client);
        assert_eq!(a.open(), 1);
        assert_eq!(c.open(), 0);
    }

    #[test]
    fn render_has_labels_and_the_histogram() {
        let t = traffic("render-test-app", "p");
        t.opened();
        t.received(10);
        observe_fanout(Duration::from_micros(30));
        let text = render(
            &[AppGauges {
                app: "render-test-app",
                channels: 2,
                subscriptions: 3,
                cache_bytes: 4096,
                cache_events: 4,
                cache_evictions: 5,
            }],
            "local",
            true,
        );
        assert!(
            text.contains(r#"herald_connections{app="render-test-app",protocol="p"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"herald_channels{app="render-test-app"} 2"#));
        assert!(text.contains(r#"herald_cache_bytes{app="render-test-app"} 4096"#));
        assert!(text.contains(r#"herald_cache_events{app="render-test-app"} 4"#));
        assert!(text.contains(r#"herald_cache_evictions_total{app="render-test-app"} 5"#));
        assert!(text.contains("herald_fanout_seconds_bucket"));
        assert!(text.contains(r#"herald_broker_up{broker="local"} 1"#));
        assert!(text.contains("# TYPE herald_frames_delivered_total counter"));
    }

    static MINE: Counter = Counter::new("herald_test_extra_total", "A registered counter");

    #[test]
    fn registered_counters_are_rendered_once() {
        init();
        register(&MINE);
        register(&MINE);
        count(&MINE);
        let text = render(&[], "local", true);
        assert_eq!(
            text.matches("# TYPE herald_test_extra_total counter")
                .count(),
            1,
            "{text}"
        );
        assert!(text.contains("herald_test_extra_total 1"), "{text}");
    }
}
