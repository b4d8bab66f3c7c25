//! Configuration: one typed struct, loaded from built-in defaults, then a TOML
//! file, then `HERALD_*` environment variables, then command-line flags (each
//! layer overrides the one before), and validated once at start.
//!
//! Unknown keys are rejected rather than ignored: a typo such as
//! `max_conections` silently falling back to a default is the kind of bug an
//! operator finds in production. Every error names the key it is about.

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

/// The development app served when no app is configured.
pub const DEV_APP_ID: &str = "app-id";
pub const DEV_APP_KEY: &str = "app-key";
pub const DEV_APP_SECRET: &str = "app-secret";

/// Longest `write_delay_ms`: a delay meant to batch frames, not to hold
/// them (a second is already far beyond what any real-time client accepts).
pub const MAX_WRITE_DELAY_MS: u64 = 1000;

/// Longest `keepalive_interval`: clients that expect keep-alives on a clock
/// give up on a connection after a few minutes of silence (AppSync's
/// clients after 300 s), so the interval must stay well below that.
pub const MAX_KEEPALIVE_INTERVAL: u64 = 240;

/// Longest `http_header_timeout`: nginx's default `client_header_timeout`
/// is 60 s; five times that is no longer a deadline.
pub const MAX_HTTP_HEADER_TIMEOUT: u64 = 300;

/// Longest `ws_idle_timeout` (a day, AppSync's longest connection).
pub const MAX_WS_IDLE_TIMEOUT: u64 = 86_400;

/// Server-wide settings plus the list of apps.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address to bind. Loopback by default so a development server with the
    /// public development credentials is not exposed by accident.
    pub host: String,
    pub port: u16,
    /// Seconds of silence before the server pings a client (Pusher: 120).
    pub activity_timeout: u64,
    /// Seconds to wait for a pong before closing with 4201 (Pusher: ~30).
    pub pong_timeout: u64,
    /// Seconds given to clients to leave on SIGTERM/SIGINT before exit.
    pub shutdown_grace: u64,
    /// Largest HTTP API request body, in bytes.
    pub max_request_size: usize,
    /// TCP listen backlog; a small one turns a reconnect storm into dropped SYNs.
    pub listen_backlog: u32,
    /// Milliseconds a connection's writer keeps collecting frames after
    /// the first before writing them together (0: write at once). Trades up
    /// to this much latency for fewer `write` calls.
    pub write_delay_ms: u64,
    /// Apply `write_delay_ms` only to connections written to within the
    /// last 50 ms: busy connections coalesce, quiet ones write at once.
    pub write_delay_busy_only: bool,
    /// `tracing` filter, e.g. `info` or `herald=debug`.
    pub log: String,
    /// PEM certificate chain; with `tls_key`, Herald serves TLS (wss/https).
    pub tls_cert: Option<String>,
    /// PEM private key for `tls_cert`.
    pub tls_key: Option<String>,
    /// Log lines as text (default) or JSON objects.
    pub log_format: LogFormat,
    /// Serve `/metrics` on this port only (same `host`), not on `port`.
    pub metrics_port: Option<u16>,
    /// Serve the live dashboard at `/dashboard` (needs `dashboard_token`).
    pub dashboard: bool,
    /// The bearer token the dashboard asks for (at least 16 characters).
    pub dashboard_token: Option<String>,
    /// Webhooks: longest wait before a batch is sent, in milliseconds.
    pub webhook_batch_ms: u64,
    /// Webhooks: most events in one request.
    pub webhook_batch_size: usize,
    /// Webhooks: how long `channel_vacated` and `member_removed` wait, in
    /// milliseconds, and are dropped if the channel or member comes back.
    pub webhook_leave_delay_ms: u64,
    /// Webhooks: one request's time limit, in milliseconds.
    pub webhook_timeout_ms: u64,
    /// Webhooks: first retry delay in milliseconds (doubling, with jitter,
    /// up to a minute).
    pub webhook_retry_ms: u64,
    /// Webhooks: seconds after which a failing request is given up.
    pub webhook_retry_for: u64,
    /// Webhooks: events one app may have waiting; more are dropped.
    pub webhook_queue: usize,
    /// Bytes of webhook events one app may have waiting (a slow receiver
    /// and large client events must not grow memory without bound).
    pub webhook_queue_bytes: usize,
    /// The cluster's broker (`[broker]`).
    pub broker: BrokerConfig,
    /// The app backend some adapters call (see [`RpcConfig`]).
    pub rpc: RpcConfig,
    /// Seconds between keep-alive messages on protocols that send them on
    /// a clock whatever the traffic (AppSync's `ka`).
    pub keepalive_interval: u64,
    /// Seconds a client has to send a whole HTTP request head, counted
    /// from the connection's accept or the end of the previous response
    /// (so it is also how long an idle keep-alive connection stays).
    pub http_header_timeout: u64,
    /// Seconds a WebSocket that holds nothing (no subscription) and says
    /// nothing may stay open, on protocols whose clients close such
    /// sockets themselves (AppSync's).
    pub ws_idle_timeout: u64,
    /// Open connections one client address may hold (0: no limit); over
    /// it, HTTP 429 before any upgrade.
    pub max_connections_per_address: u32,
    /// New connections one client address may open per second (0: no
    /// limit); over it, HTTP 429.
    pub max_connection_rate_per_address: u32,
    /// Addresses (CIDR blocks or single addresses) the two limits above do
    /// not apply to: loopback by default (development, load tests), and a
    /// proxy in front of Herald.
    pub address_limits_exempt: Vec<String>,
    pub apps: Vec<AppConfig>,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("{s:?} is not a log format (text or json)")),
        }
    }
}

/// How nodes find each other: `local` (one node), or a Redis or NATS
/// server shared by every node.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// `local`, `redis://…`, `rediss://…` (TLS), `nats://…` or `tls://…`
    /// (NATS over TLS); credentials may be in the URL.
    pub url: String,
    /// Namespaces keys and subjects, so several environments can share one
    /// Redis or NATS server.
    pub prefix: String,
    /// Seconds a node may go without a heartbeat before the others remove
    /// its members.
    pub ttl: u64,
    /// `/ready` answers 503 while the broker is unreachable, so a load
    /// balancer moves new clients to nodes that reach the cluster.
    pub ready_needs_broker: bool,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            url: "local".into(),
            prefix: "herald".into(),
            ttl: 30,
            ready_needs_broker: true,
        }
    }
}

/// The webhook event types an app may ask for.
pub const WEBHOOK_EVENT_TYPES: [&str; 7] = [
    "channel_occupied",
    "channel_vacated",
    "member_added",
    "member_removed",
    "client_event",
    "cache_miss",
    "subscription_count",
];

/// One webhook endpoint of an app, written as soketi and sockudo configs
/// write it: `{ url, event_types, headers, filter }`.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    pub url: String,
    pub event_types: Vec<String>,
    /// Extra request headers (e.g. a token for the receiver).
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub filter: WebhookFilter,
}

/// Only events on channels whose names match are sent.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebhookFilter {
    pub channel_name_starts_with: Option<String>,
    pub channel_name_ends_with: Option<String>,
}

impl WebhookFilter {
    pub fn matches(&self, channel: &str) -> bool {
        self.channel_name_starts_with
            .as_deref()
            .is_none_or(|p| channel.starts_with(p))
            && self
                .channel_name_ends_with
                .as_deref()
                .is_none_or(|p| channel.ends_with(p))
    }
}

/// Header values and URL queries may hold credentials: Debug shows only
/// the URL's origin and the header names.
impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &redact_url(&self.url))
            .field("event_types", &self.event_types)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("filter", &self.filter)
            .finish()
    }
}

/// A URL as logs may show it: scheme, host and port, path; no user info,
/// query or fragment (they may carry credentials).
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => format!(
            "{}://{}{}{}",
            u.scheme(),
            u.host_str().unwrap_or(""),
            u.port().map(|p| format!(":{p}")).unwrap_or_default(),
            u.path()
        ),
        Err(_) => "(invalid URL)".into(),
    }
}

impl BrokerConfig {
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl)
    }

    /// The URL without its password or token, for logs.
    pub fn shown_url(&self) -> String {
        match (self.url.find("://"), self.url.rfind('@')) {
            (Some(s), Some(at)) if at > s => {
                format!("{}://***@{}", &self.url[..s], &self.url[at + 1..])
            }
            _ => self.url.clone(),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            host: "127.0.0.1".into(),
            port: 8080,
            activity_timeout: 120,
            pong_timeout: 30,
            shutdown_grace: 10,
            max_request_size: 1024 * 1024,
            listen_backlog: 4096,
            // Measured (bench/RESULTS.md, "core issue"): on busy
            // connections only, 2 ms cut the server's CPU per delivery by a
            // third at the broadcast peak with no worse p(99); quiet
            // connections pay nothing.
            write_delay_ms: 2,
            write_delay_busy_only: true,
            log: "info".into(),
            tls_cert: None,
            tls_key: None,
            log_format: LogFormat::Text,
            metrics_port: None,
            dashboard: false,
            dashboard_token: None,
            webhook_batch_ms: 250,
            webhook_batch_size: 20,
            webhook_leave_delay_ms: 3000,
            webhook_timeout_ms: 5000,
            webhook_retry_ms: 1000,
            webhook_retry_for: 300,
            webhook_queue: 10_000,
            webhook_queue_bytes: 16 * 1024 * 1024,
            broker: BrokerConfig::default(),
            rpc: RpcConfig::default(),
            keepalive_interval: 60,
            // nginx waits 60 s for a request head and 75 s on an idle
            // keep-alive connection, Node.js 60 s and 5 s: a real client
            // sends its head within milliseconds of connecting.
            http_header_timeout: 10,
            ws_idle_timeout: 60,
            max_connections_per_address: 1000,
            max_connection_rate_per_address: 100,
            address_limits_exempt: vec!["127.0.0.0/8".into(), "::1/128".into()],
            apps: Vec::new(),
        }
    }
}

/// An app backend that adapters call over RPC (who a connecting client
/// is, what its commands do, told when it leaves), and the HTTP broadcast
/// endpoint that goes with it.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RpcConfig {
    /// Where the backend listens: an `http://` or `https://` URL means
    /// JSON over HTTP; `host:port` or `grpc://host:port` means gRPC. Unset:
    /// no backend.
    pub host: Option<String>,
    /// Bearer token sent to an HTTP backend.
    pub secret: Option<String>,
    /// Request headers passed to the backend when a client connects
    /// (lowercase names).
    pub headers: Vec<String>,
    /// Milliseconds one call may take in all: waiting for a free slot,
    /// retries and back-off included.
    pub timeout_ms: u64,
    /// How often a call the backend could not take (unreachable,
    /// overloaded) is tried again within `timeout_ms`.
    pub retries: u32,
    /// Most calls in flight at once (over one multiplexed connection).
    pub concurrency: usize,
    /// Most calls per second telling the backend that clients left; on
    /// shutdown the rest go out at once, bounded by `concurrency`.
    pub disconnect_rate: u32,
    /// Most Disconnect calls waiting for their turn, and their bytes in
    /// all (clients that connect and leave faster than `disconnect_rate`
    /// must not grow memory without bound); more are dropped and counted.
    pub disconnect_queue: usize,
    pub disconnect_queue_bytes: usize,
    /// Id of the app whose channels these clients use (default: the first).
    pub app: Option<String>,
    /// The WebSocket path the adapter serves (unset: its own default).
    pub path: Option<String>,
    /// Bearer token the broadcast endpoint requires (unset: none).
    pub broadcast_key: Option<String>,
    /// Allow subscriptions to unsigned stream names without the backend.
    pub public_streams: bool,
    /// Key for signed stream names (unset: the app's secret).
    pub streams_secret: Option<String>,
    /// Key of HMAC-signed JSON Web Tokens that identify clients without a
    /// backend call (unset: tokens are not accepted).
    pub jwt_secret: Option<String>,
    /// URL query parameter carrying the token (also read from the header
    /// `x-<param>`).
    pub jwt_param: String,
    /// Refuse clients without a token.
    pub jwt_force: bool,
    /// Where the app's broadcasts come from besides `POST /_broadcast`:
    /// `http` (only that), `redis` or `nats` (also the broker's server,
    /// on `broadcast_channel`), `redisx` (a Redis stream of that name);
    /// a comma-separated list, as AnyCable's.
    pub broadcast_adapter: String,
    /// The Redis channel, NATS subject or Redis stream of those broadcasts.
    pub broadcast_channel: String,
    /// gRPC over TLS to the backend (its certificate verified against the
    /// system's roots and `tls_root_ca`).
    pub tls: bool,
    /// A PEM file of extra certificate authorities for the backend's TLS.
    pub tls_root_ca: Option<String>,
    // --- Reliable streams and resumable sessions (issue 19), AnyCable's names.
    /// Most publications kept per reliable stream (0: no history).
    pub history_limit: usize,
    /// Seconds a publication stays in a stream's history (0: no history).
    pub history_ttl: u64,
    /// Most bytes all streams' histories hold together.
    pub history_max_bytes: usize,
    /// Seconds a closed session can be restored (0: no resumption).
    pub sessions_ttl: u64,
    /// Most sessions kept for restoring.
    pub sessions_max: usize,
    /// Most history requests per connection per second.
    pub history_rate: u32,
}

impl Default for RpcConfig {
    fn default() -> Self {
        RpcConfig {
            host: None,
            secret: None,
            headers: vec!["cookie".into()],
            timeout_ms: 3000,
            retries: 3,
            concurrency: 28,
            disconnect_rate: 100,
            disconnect_queue: 50_000,
            disconnect_queue_bytes: 64 * 1024 * 1024,
            app: None,
            path: None,
            broadcast_key: None,
            public_streams: false,
            streams_secret: None,
            jwt_secret: None,
            jwt_param: "jid".into(),
            jwt_force: false,
            broadcast_adapter: "http".into(),
            broadcast_channel: "__anycable__".into(),
            tls: false,
            tls_root_ca: None,
            history_limit: 100,
            history_ttl: 300,
            history_max_bytes: 64 * 1024 * 1024,
            sessions_ttl: 300,
            sessions_max: 100_000,
            history_rate: 100,
        }
    }
}

impl RpcConfig {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    fn validate(&self, apps: &[AppConfig]) -> Result<(), ConfigError> {
        if let Some(h) = &self.host {
            if h.trim().is_empty() || h.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(invalid(
                    "rpc.host",
                    "must be a URL or host:port without spaces",
                ));
            }
        }
        for h in &self.headers {
            if h.is_empty()
                || !h
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
            {
                return Err(invalid(
                    "rpc.headers",
                    format!("{h:?} is not a header name (letters, digits, '-', '_')"),
                ));
            }
        }
        if self.timeout_ms == 0 {
            return Err(invalid("rpc.timeout_ms", "must be positive"));
        }
        if self.concurrency == 0 {
            return Err(invalid("rpc.concurrency", "must be positive"));
        }
        if self.disconnect_rate == 0 {
            return Err(invalid("rpc.disconnect_rate", "must be positive"));
        }
        if self.disconnect_queue == 0 {
            return Err(invalid("rpc.disconnect_queue", "must be positive"));
        }
        if self.disconnect_queue_bytes < 64 * 1024 {
            return Err(invalid(
                "rpc.disconnect_queue_bytes",
                "must be at least 65536 (it must hold the largest Disconnect call)",
            ));
        }
        if let Some(app) = &self.app {
            if !apps.iter().any(|a| &a.id == app) {
                return Err(invalid(
                    "rpc.app",
                    format!("names no configured app ({app:?})"),
                ));
            }
        }
        if self.jwt_param.is_empty()
            || !self
                .jwt_param
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
        {
            return Err(invalid(
                "rpc.jwt_param",
                "must be a name of letters, digits, '-' and '_'",
            ));
        }
        if self.history_rate == 0 {
            return Err(invalid("rpc.history_rate", "must be positive"));
        }
        if self.jwt_force && self.jwt_secret.is_none() {
            return Err(invalid("rpc.jwt_force", "needs rpc.jwt_secret"));
        }
        if let Some(p) = &self.path {
            if !p.starts_with('/') || p.len() < 2 || p.chars().any(|c| c.is_whitespace()) {
                return Err(invalid(
                    "rpc.path",
                    "must be a path such as /ws (a '/' and a name)",
                ));
            }
        }
        for a in self.broadcast_adapter.split(',').map(str::trim) {
            if !["http", "redis", "redisx", "nats"].contains(&a) {
                return Err(invalid(
                    "rpc.broadcast_adapter",
                    format!("{a:?}: expected http, redis, redisx or nats (comma-separated)"),
                ));
            }
        }
        if self.broadcast_channel.is_empty()
            || self.broadcast_channel.len() > 256
            || self
                .broadcast_channel
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(invalid(
                "rpc.broadcast_channel",
                "must be 1 to 256 characters without spaces",
            ));
        }
        if self.tls_root_ca.is_some() && !self.tls {
            return Err(invalid("rpc.tls_root_ca", "needs rpc.tls = true"));
        }
        for (key, v) in [
            ("rpc.secret", &self.secret),
            ("rpc.broadcast_key", &self.broadcast_key),
            ("rpc.streams_secret", &self.streams_secret),
            ("rpc.jwt_secret", &self.jwt_secret),
        ] {
            if v.as_deref() == Some("") {
                return Err(invalid(key, "must not be empty when set"));
            }
        }
        Ok(())
    }
}

/// One tenant: its credentials and limits. Every limit has Pusher's default.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AppConfig {
    pub id: String,
    pub key: String,
    pub secret: String,
    /// A disabled app refuses connections with 4003 and API calls with 403.
    pub enabled: bool,
    /// Concurrent connections allowed; 0 means unlimited. Over it: 4004.
    pub max_connections: u32,
    /// Whether `client-*` events are accepted at all.
    pub client_events: bool,
    /// Client events per second per connection; over it: 4301.
    pub client_event_rate: u32,
    /// Any inbound messages per second per connection; over it the
    /// connection is closed with 4100 (protects against subscribe floods).
    pub max_messages_per_second: u32,
    /// Channels one connection may be subscribed to at once.
    pub max_subscriptions_per_connection: u32,
    /// Largest event `data`, in bytes (HTTP API: 413; client events: error).
    pub max_payload: usize,
    /// Largest WebSocket message accepted from a client, in bytes.
    pub max_frame_size: usize,
    pub max_channel_name: usize,
    pub max_event_name: usize,
    pub max_presence_members: usize,
    pub max_presence_user_info: usize,
    pub max_presence_user_id: usize,
    /// Send `pusher_internal:subscription_count` on non-presence channels.
    pub subscription_count: bool,
    /// Seconds a cache channel keeps its last event (Pusher: 30 min).
    pub cache_ttl: u64,
    /// Bytes the app's cache channels may keep in all (their last events);
    /// past it the least recently used is evicted.
    pub max_cache_bytes: usize,
    /// Frames queued for one connection before it is closed as too slow.
    pub outbound_queue: usize,
    /// Bytes queued for one connection before it is closed as too slow.
    pub outbound_bytes: usize,
    /// Where to send webhooks, and which events.
    pub webhooks: Vec<WebhookConfig>,
    /// Keys a client may present as its credential on protocols that
    /// authorize with a shared key instead of a signature (AppSync's API
    /// keys). Empty: such protocols are closed for this app, except the
    /// development app, whose `key` is accepted.
    pub api_keys: Vec<String>,
    /// Channel namespaces (the first `/` segment of a channel path) and
    /// who may publish and subscribe in each. Empty: every namespace is
    /// open to the app's API keys.
    pub namespaces: Vec<NamespaceConfig>,
}

/// One channel namespace of an app.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct NamespaceConfig {
    /// 1-50 characters of `[A-Za-z0-9-]`.
    pub name: String,
    /// Keys allowed to publish here; `None`: the app's API keys.
    pub publish_keys: Option<Vec<String>>,
    /// Keys allowed to subscribe here; `None`: the app's API keys.
    pub subscribe_keys: Option<Vec<String>>,
}

/// Whether `name` is a valid namespace (or channel path segment) name.
pub fn is_namespace_name(name: &str) -> bool {
    (1..=50).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

impl Default for AppConfig {
    fn default() -> Self {
        AppConfig {
            id: String::new(),
            key: String::new(),
            secret: String::new(),
            enabled: true,
            max_connections: 0,
            client_events: true,
            client_event_rate: 10,
            max_messages_per_second: 100,
            max_subscriptions_per_connection: 100,
            max_payload: 10 * 1024,
            max_frame_size: 64 * 1024,
            max_channel_name: 164,
            max_event_name: 200,
            max_presence_members: 100,
            max_presence_user_info: 1024,
            max_presence_user_id: 128,
            subscription_count: false,
            cache_ttl: 1800,
            max_cache_bytes: 64 * 1024 * 1024,
            outbound_queue: 1024,
            outbound_bytes: 1024 * 1024,
            webhooks: Vec::new(),
            api_keys: Vec::new(),
            namespaces: Vec::new(),
        }
    }
}

impl AppConfig {
    /// The development app: public credentials, default limits.
    pub fn development() -> Self {
        AppConfig {
            id: DEV_APP_ID.into(),
            key: DEV_APP_KEY.into(),
            secret: DEV_APP_SECRET.into(),
            ..AppConfig::default()
        }
    }

    pub fn is_development(&self) -> bool {
        self.secret == DEV_APP_SECRET
    }

    /// The API keys in force: the configured ones, or the development
    /// app's own key when it has none.
    pub fn effective_api_keys(&self) -> Vec<&str> {
        if self.api_keys.is_empty() && self.is_development() {
            vec![self.key.as_str()]
        } else {
            self.api_keys.iter().map(String::as_str).collect()
        }
    }
}

/// Overrides from the environment and the command line. `None` leaves the
/// value from the previous layer in place.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub activity_timeout: Option<u64>,
    pub shutdown_grace: Option<u64>,
    pub write_delay_ms: Option<u64>,
    pub write_delay_busy_only: Option<bool>,
    pub log: Option<String>,
    /// Replace the single app's credentials (handy in containers).
    pub app_id: Option<String>,
    pub app_key: Option<String>,
    pub app_secret: Option<String>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
    pub log_format: Option<LogFormat>,
    pub metrics_port: Option<u16>,
    pub dashboard_token: Option<String>,
    /// `broker.url`.
    pub broker: Option<String>,
    pub rpc_host: Option<String>,
    pub rpc_secret: Option<String>,
    /// Comma-separated header names.
    pub rpc_headers: Option<String>,
    pub broadcast_key: Option<String>,
    /// `rpc.broadcast_adapter`.
    pub broadcast_adapter: Option<String>,
    pub keepalive_interval: Option<u64>,
    /// Replace the single app's API keys.
    pub api_keys: Option<Vec<String>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("invalid config: `{key}` {message}")]
    Invalid { key: String, message: String },
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

/// Check one webhook: an http(s) URL, known event types, sendable headers.
/// Errors name the field (relative to the webhook) and what is wrong.
fn validate_webhook(hook: &WebhookConfig) -> Result<(), (String, String)> {
    let url = url::Url::parse(&hook.url)
        .map_err(|e| (".url".to_string(), format!("is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err((
            ".url".into(),
            "must be an http:// or https:// URL with a host".into(),
        ));
    }
    if hook.event_types.is_empty() {
        return Err((
            ".event_types".into(),
            format!(
                "must list at least one of {}",
                WEBHOOK_EVENT_TYPES.join(", ")
            ),
        ));
    }
    for t in &hook.event_types {
        if !WEBHOOK_EVENT_TYPES.contains(&t.as_str()) {
            return Err((
                ".event_types".into(),
                format!(
                    "has unknown event type {t:?} (known: {})",
                    WEBHOOK_EVENT_TYPES.join(", ")
                ),
            ));
        }
    }
    for (name, value) in &hook.headers {
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            return Err((
                format!(".headers.{name}"),
                "is not a valid header name".into(),
            ));
        }
        let lower = name.to_ascii_lowercase();
        if matches!(lower.as_str(), "content-type" | "content-length" | "host") {
            return Err((
                format!(".headers.{name}"),
                "is set by Herald and cannot be overridden".into(),
            ));
        }
        if value.chars().any(|c| c.is_control()) {
            return Err((
                format!(".headers.{name}"),
                "must not contain control characters".into(),
            ));
        }
    }
    Ok(())
}

/// An API key: 1-200 printable characters (it travels in HTTP headers).
fn check_api_key(key: &str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() || value.len() > 200 || !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(
            key,
            "must be 1-200 printable ASCII characters without spaces",
        ));
    }
    Ok(())
}

impl Config {
    /// Parse a TOML document (the file layer).
    pub fn from_toml(text: &str, path: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: e.to_string().trim().replace('\n', " "),
        })
    }

    /// Build the effective configuration: defaults, then `file`, then
    /// `overrides` (environment and flags, already merged by the caller with
    /// flags winning), then validation.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        let mut config = Config::from_file(file)?;
        config.apply(overrides)?;
        config.validate()?;
        Ok(config)
    }

    /// The defaults, then `file` when given (the first two layers; callers
    /// that put a layer of their own between the file and the overrides,
    /// such as the binary's peer settings, call this, then [`Config::apply`]
    /// and [`Config::validate`]).
    pub fn from_file(file: Option<&Path>) -> Result<Config, ConfigError> {
        Ok(match file {
            Some(path) => {
                let shown = path.display().to_string();
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: shown.clone(),
                    source,
                })?;
                Config::from_toml(&text, &shown)?
            }
            None => Config::default(),
        })
    }

    /// Apply the environment and flag layer (see [`Overrides`]).
    pub fn apply(&mut self, o: &Overrides) -> Result<(), ConfigError> {
        if let Some(v) = &o.host {
            self.host = v.clone();
        }
        if let Some(v) = o.port {
            self.port = v;
        }
        if let Some(v) = o.activity_timeout {
            self.activity_timeout = v;
        }
        if let Some(v) = o.shutdown_grace {
            self.shutdown_grace = v;
        }
        if let Some(v) = o.write_delay_ms {
            self.write_delay_ms = v;
        }
        if let Some(v) = o.write_delay_busy_only {
            self.write_delay_busy_only = v;
        }
        if let Some(v) = &o.log {
            self.log = v.clone();
        }
        if let Some(v) = &o.tls_cert {
            self.tls_cert = Some(v.clone());
        }
        if let Some(v) = &o.tls_key {
            self.tls_key = Some(v.clone());
        }
        if let Some(v) = o.log_format {
            self.log_format = v;
        }
        if let Some(v) = o.metrics_port {
            self.metrics_port = Some(v);
        }
        if let Some(v) = &o.dashboard_token {
            self.dashboard_token = Some(v.clone());
        }
        if let Some(v) = &o.broker {
            self.broker.url = v.clone();
        }
        if let Some(v) = &o.rpc_host {
            self.rpc.host = Some(v.clone());
        }
        if let Some(v) = &o.rpc_secret {
            self.rpc.secret = Some(v.clone());
        }
        if let Some(v) = &o.rpc_headers {
            self.rpc.headers = v
                .split(',')
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect();
        }
        if let Some(v) = &o.broadcast_key {
            self.rpc.broadcast_key = Some(v.clone());
        }
        if let Some(v) = &o.broadcast_adapter {
            self.rpc.broadcast_adapter = v.clone();
        }
        if let Some(v) = o.keepalive_interval {
            self.keepalive_interval = v;
        }
        if self.apps.is_empty() {
            self.apps.push(AppConfig::development());
        }
        let creds = [&o.app_id, &o.app_key, &o.app_secret];
        if creds.iter().any(|c| c.is_some()) {
            if self.apps.len() != 1 {
                return Err(invalid(
                    "HERALD_APP_ID/HERALD_APP_KEY/HERALD_APP_SECRET",
                    "can only be used with exactly one app; configure several apps in the file",
                ));
            }
            let app = &mut self.apps[0];
            if let Some(v) = &o.app_id {
                app.id = v.clone();
            }
            if let Some(v) = &o.app_key {
                app.key = v.clone();
            }
            if let Some(v) = &o.app_secret {
                app.secret = v.clone();
            }
        }
        if let Some(keys) = &o.api_keys {
            if self.apps.len() != 1 {
                return Err(invalid(
                    "HERALD_API_KEYS",
                    "can only be used with exactly one app; configure several apps in the file",
                ));
            }
            self.apps[0].api_keys = keys.clone();
        }
        Ok(())
    }

    /// Semantic checks serde cannot make. Errors name the offending key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.host.parse::<std::net::IpAddr>().is_err() && self.host != "localhost" {
            return Err(invalid("host", "must be an IP address"));
        }
        if self.activity_timeout == 0 {
            return Err(invalid("activity_timeout", "must be at least 1 second"));
        }
        if self.pong_timeout == 0 {
            return Err(invalid("pong_timeout", "must be at least 1 second"));
        }
        if self.write_delay_ms > MAX_WRITE_DELAY_MS {
            return Err(invalid(
                "write_delay_ms",
                format!("must be at most {MAX_WRITE_DELAY_MS} (milliseconds)"),
            ));
        }
        if !(1..=MAX_KEEPALIVE_INTERVAL).contains(&self.keepalive_interval) {
            return Err(invalid(
                "keepalive_interval",
                format!("must be 1 to {MAX_KEEPALIVE_INTERVAL} seconds"),
            ));
        }
        if self.listen_backlog == 0 {
            return Err(invalid("listen_backlog", "must be positive"));
        }
        if !(1..=MAX_HTTP_HEADER_TIMEOUT).contains(&self.http_header_timeout) {
            return Err(invalid(
                "http_header_timeout",
                format!("must be 1 to {MAX_HTTP_HEADER_TIMEOUT} seconds"),
            ));
        }
        if !(1..=MAX_WS_IDLE_TIMEOUT).contains(&self.ws_idle_timeout) {
            return Err(invalid(
                "ws_idle_timeout",
                format!("must be 1 to {MAX_WS_IDLE_TIMEOUT} seconds"),
            ));
        }
        for (i, net) in self.address_limits_exempt.iter().enumerate() {
            if parse_net(net).is_none() {
                return Err(invalid(
                    format!("address_limits_exempt[{i}]"),
                    format!("{net:?} is not an IP address or CIDR block (e.g. 10.0.0.0/8, ::1)"),
                ));
            }
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => return Err(invalid("tls_key", "is required with tls_cert")),
            (None, Some(_)) => return Err(invalid("tls_cert", "is required with tls_key")),
            _ => {}
        }
        let b = &self.broker;
        let schemes = ["redis://", "rediss://", "nats://", "tls://"];
        if b.url != "local" && !schemes.iter().any(|s| b.url.starts_with(s)) {
            return Err(invalid(
                "broker.url",
                "must be `local`, or a redis://, rediss://, nats:// or tls:// URL",
            ));
        }
        if b.prefix.is_empty()
            || b.prefix.len() > 64
            || !b
                .prefix
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
        {
            return Err(invalid(
                "broker.prefix",
                "must be 1 to 64 letters, digits, '_' or '-'",
            ));
        }
        if b.ttl == 0 || b.ttl > 3600 {
            return Err(invalid("broker.ttl", "must be 1 to 3600 (seconds)"));
        }
        self.rpc.validate(&self.apps)?;
        if self.log.parse::<tracing_subscriber::EnvFilter>().is_err() {
            return Err(invalid("log", "is not a valid log filter"));
        }
        if self.metrics_port.is_some_and(|p| p != 0 && p == self.port) {
            return Err(invalid("metrics_port", "must differ from port"));
        }
        if self.dashboard {
            match &self.dashboard_token {
                None => {
                    return Err(invalid(
                        "dashboard_token",
                        "is required with dashboard = true",
                    ))
                }
                Some(t) if t.chars().count() < 16 || t.chars().any(char::is_control) => {
                    return Err(invalid(
                        "dashboard_token",
                        "must be at least 16 characters, without control characters",
                    ))
                }
                Some(_) => {}
            }
        }
        let positive = [
            ("webhook_batch_ms", self.webhook_batch_ms as usize),
            ("webhook_batch_size", self.webhook_batch_size),
            ("webhook_timeout_ms", self.webhook_timeout_ms as usize),
            ("webhook_retry_ms", self.webhook_retry_ms as usize),
            ("webhook_queue", self.webhook_queue),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(invalid(field, "must be positive"));
            }
        }
        if self.webhook_batch_ms > 60_000 || self.webhook_leave_delay_ms > 60_000 {
            return Err(invalid(
                "webhook_batch_ms/webhook_leave_delay_ms",
                "must be at most 60000 (a minute)",
            ));
        }
        if self.webhook_queue_bytes < 64 * 1024 {
            return Err(invalid(
                "webhook_queue_bytes",
                "must be at least 65536 (it must hold the largest client event)",
            ));
        }
        if self.webhook_batch_size > 1000 {
            return Err(invalid("webhook_batch_size", "must be at most 1000"));
        }
        let mut ids = std::collections::HashSet::new();
        let mut keys = std::collections::HashSet::new();
        for (i, app) in self.apps.iter().enumerate() {
            let k = |field: &str| format!("apps[{i}].{field}");
            for (field, value) in [("id", &app.id), ("key", &app.key), ("secret", &app.secret)] {
                if value.is_empty() {
                    return Err(invalid(k(field), "must not be empty"));
                }
                if value.len() > 200 || value.chars().any(|c| c.is_control() || c == '/') {
                    return Err(invalid(
                        k(field),
                        "must be at most 200 characters, without '/' or control characters",
                    ));
                }
            }
            if !ids.insert(&app.id) {
                return Err(invalid(k("id"), format!("duplicates app id {:?}", app.id)));
            }
            if !keys.insert(&app.key) {
                return Err(invalid(
                    k("key"),
                    format!("duplicates app key {:?}", app.key),
                ));
            }
            let positive = [
                ("client_event_rate", app.client_event_rate as usize),
                (
                    "max_messages_per_second",
                    app.max_messages_per_second as usize,
                ),
                (
                    "max_subscriptions_per_connection",
                    app.max_subscriptions_per_connection as usize,
                ),
                ("max_payload", app.max_payload),
                ("max_frame_size", app.max_frame_size),
                ("max_channel_name", app.max_channel_name),
                ("max_event_name", app.max_event_name),
                ("max_presence_members", app.max_presence_members),
                ("max_presence_user_info", app.max_presence_user_info),
                ("max_presence_user_id", app.max_presence_user_id),
                ("outbound_queue", app.outbound_queue),
                ("outbound_bytes", app.outbound_bytes),
            ];
            for (field, value) in positive {
                if value == 0 {
                    return Err(invalid(k(field), "must be positive"));
                }
            }
            if app.outbound_bytes < 64 * 1024 {
                return Err(invalid(
                    k("outbound_bytes"),
                    "must be at least 65536 (it must hold the largest frame sent, e.g. a full presence member list)",
                ));
            }
            if app.max_cache_bytes < 4 * app.max_payload {
                return Err(invalid(
                    k("max_cache_bytes"),
                    "must be at least 4 × max_payload (it must hold the largest cached event)",
                ));
            }
            if app.max_frame_size < 1024 {
                return Err(invalid(k("max_frame_size"), "must be at least 1024 bytes"));
            }
            for (j, hook) in app.webhooks.iter().enumerate() {
                validate_webhook(hook)
                    .map_err(|(field, msg)| invalid(k(&format!("webhooks[{j}]{field}")), msg))?;
            }
            for (j, key) in app.api_keys.iter().enumerate() {
                check_api_key(&k(&format!("api_keys[{j}]")), key)?;
            }
            let mut names = std::collections::HashSet::new();
            for (j, ns) in app.namespaces.iter().enumerate() {
                let field = |f: &str| k(&format!("namespaces[{j}].{f}"));
                if !is_namespace_name(&ns.name) {
                    return Err(invalid(
                        field("name"),
                        "must be 1-50 characters of A-Z, a-z, 0-9 and '-'",
                    ));
                }
                if !names.insert(&ns.name) {
                    return Err(invalid(
                        field("name"),
                        format!("duplicates namespace {:?}", ns.name),
                    ));
                }
                for (f, keys) in [
                    ("publish_keys", &ns.publish_keys),
                    ("subscribe_keys", &ns.subscribe_keys),
                ] {
                    for (n, key) in keys.iter().flatten().enumerate() {
                        check_api_key(&field(&format!("{f}[{n}]")), key)?;
                    }
                }
            }
        }
        Ok(())
    }

    pub fn activity_timeout(&self) -> Duration {
        Duration::from_secs(self.activity_timeout)
    }

    pub fn pong_timeout(&self) -> Duration {
        Duration::from_secs(self.pong_timeout)
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace)
    }

    pub fn write_delay(&self) -> Duration {
        Duration::from_millis(self.write_delay_ms)
    }

    /// Whether the dashboard is served (on, with a valid token).
    pub fn dashboard_token(&self) -> Option<&str> {
        self.dashboard_token.as_deref().filter(|_| self.dashboard)
    }

    pub fn keepalive_interval(&self) -> Duration {
        Duration::from_secs(self.keepalive_interval)
    }

    pub fn http_header_timeout(&self) -> Duration {
        Duration::from_secs(self.http_header_timeout)
    }

    pub fn ws_idle_timeout(&self) -> Duration {
        Duration::from_secs(self.ws_idle_timeout)
    }

    /// `address_limits_exempt`, parsed (validated at load).
    pub fn address_limits_exempt(&self) -> Vec<ipnet::IpNet> {
        self.address_limits_exempt
            .iter()
            .filter_map(|n| parse_net(n))
            .collect()
    }
}

/// A CIDR block, or a single address as its own block.
fn parse_net(s: &str) -> Option<ipnet::IpNet> {
    s.parse::<ipnet::IpNet>()
        .ok()
        .or_else(|| s.parse::<std::net::IpAddr>().ok().map(ipnet::IpNet::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_serve_the_development_app() {
        let c = Config::load(None, &Overrides::default()).unwrap();
        assert_eq!(c.port, 8080);
        assert_eq!(c.apps, vec![AppConfig::development()]);
        assert!(c.apps[0].is_development());
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::from_toml("prot = 1", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("prot"), "{err}");
        let err = Config::from_toml(
            "[[apps]]\nid='a'\nkey='b'\nsecret='c'\nmax_conections=3",
            "x.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("max_conections"), "{err}");
    }

    #[test]
    fn wrong_type_is_named() {
        let err = Config::from_toml("port = \"eighty\"", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("port"), "{err}");
    }

    #[test]
    fn semantic_errors_name_the_key() {
        let mut c = Config::from_toml(
            "[[apps]]\nid='a'\nkey='k'\nsecret='s'\n[[apps]]\nid='b'\nkey='k'\nsecret='s'",
            "x",
        )
        .unwrap();
        c.apply(&Overrides::default()).unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("apps[1].key"), "{err}");
    }

    #[test]
    fn metrics_port_must_differ_from_port() {
        let mut c = Config::from_toml("port = 9000\nmetrics_port = 9000", "x").unwrap();
        c.apply(&Overrides::default()).unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("metrics_port"), "{err}");
    }

    #[test]
    fn broker_settings_are_checked() {
        let c =
            Config::from_toml("[broker]\nurl = 'nats://u:p@127.0.0.1:4222'\nttl = 3", "x").unwrap();
        c.validate().unwrap();
        assert_eq!(c.broker.shown_url(), "nats://***@127.0.0.1:4222");
        assert_eq!(c.broker.prefix, "herald");
        for (toml, key) in [
            ("[broker]\nurl = 'http://x'", "broker.url"),
            ("[broker]\nprefix = 'a.b'", "broker.prefix"),
            ("[broker]\nttl = 0", "broker.ttl"),
        ] {
            let err = Config::from_toml(toml, "x")
                .unwrap()
                .validate()
                .unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        }
        let err = Config::from_toml("[broker]\nurll = 'x'", "x").unwrap_err();
        assert!(err.to_string().contains("urll"), "{err}");
    }

    #[test]
    fn api_keys_and_namespaces() {
        let c = Config::load(None, &Overrides::default()).unwrap();
        assert_eq!(c.apps[0].effective_api_keys(), vec![DEV_APP_KEY]);
        let mut c = Config::from_toml(
            "[[apps]]\nid='a'\nkey='k'\nsecret='s'\napi_keys=['da2-x']\n\
             [[apps.namespaces]]\nname='chat'\npublish_keys=['backend']\n",
            "x",
        )
        .unwrap();
        c.apply(&Overrides::default()).unwrap();
        c.validate().unwrap();
        assert_eq!(c.apps[0].effective_api_keys(), vec!["da2-x"]);
        assert_eq!(c.apps[0].namespaces[0].subscribe_keys, None);
        // A configured app without API keys accepts none.
        let mut c = Config::from_toml("[[apps]]\nid='a'\nkey='k'\nsecret='s'\n", "x").unwrap();
        c.apply(&Overrides::default()).unwrap();
        assert!(c.apps[0].effective_api_keys().is_empty());
        for (toml, key) in [
            ("api_keys=['has space']", "apps[0].api_keys[0]"),
            (
                "[[apps.namespaces]]\nname='a/b'",
                "apps[0].namespaces[0].name",
            ),
            (
                "[[apps.namespaces]]\nname='a'\n[[apps.namespaces]]\nname='a'",
                "apps[0].namespaces[1].name",
            ),
            (
                "[[apps.namespaces]]\nname='a'\nsubscribe_keys=['']",
                "apps[0].namespaces[0].subscribe_keys[0]",
            ),
        ] {
            let mut c = Config::from_toml(
                &format!("[[apps]]\nid='a'\nkey='k'\nsecret='s'\n{toml}"),
                "x",
            )
            .unwrap();
            c.apply(&Overrides::default()).unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(key), "{toml}: {err}");
        }
        let err = Config::from_toml("keepalive_interval = 0", "x")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("keepalive_interval"), "{err}");
    }

    #[test]
    fn connection_deadlines_and_address_limits_are_checked() {
        let c = Config::load(None, &Overrides::default()).unwrap();
        assert_eq!(c.http_header_timeout(), Duration::from_secs(10));
        assert_eq!(c.address_limits_exempt().len(), 2);
        let c = Config::from_toml("address_limits_exempt = ['10.0.0.0/8', '192.168.1.7']", "x")
            .unwrap();
        c.validate().unwrap();
        assert!(c.address_limits_exempt()[1]
            .contains(&"192.168.1.7".parse::<std::net::IpAddr>().unwrap()));
        for (toml, key) in [
            ("http_header_timeout = 0", "http_header_timeout"),
            ("http_header_timeout = 301", "http_header_timeout"),
            ("ws_idle_timeout = 0", "ws_idle_timeout"),
            (
                "address_limits_exempt = ['nope']",
                "address_limits_exempt[0]",
            ),
            (
                "address_limits_exempt = ['10.0.0.0/33']",
                "address_limits_exempt[0]",
            ),
        ] {
            let err = Config::from_toml(toml, "x")
                .unwrap()
                .validate()
                .unwrap_err();
            assert!(err.to_string().contains(key), "{toml}: {err}");
        }
    }

    #[test]
    fn broadcast_adapters_are_checked() {
        let c = Config::from_toml("[rpc]\nbroadcast_adapter = 'http, redis'", "x").unwrap();
        assert_eq!(c.rpc.broadcast_channel, "__anycable__");
        c.validate().unwrap();
        for bad in [
            "broadcast_adapter = 'kafka'",
            "broadcast_adapter = ''",
            "broadcast_channel = ''",
            "broadcast_channel = 'a b'",
        ] {
            let c = Config::from_toml(&format!("[rpc]\n{bad}"), "x").unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("rpc.broadcast_"), "{bad}: {err}");
        }
        let c = Config::from_toml("[rpc]\ntls_root_ca = 'ca.pem'", "x").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("rpc.tls_root_ca"), "{err}");
        let c = Config::from_toml("[rpc]\ntls = true\ntls_root_ca = 'ca.pem'", "x").unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn later_layers_override_earlier_ones() {
        let mut c = Config::from_toml("port = 9000\nhost = '0.0.0.0'", "x").unwrap();
        c.apply(&Overrides {
            port: Some(9100),
            app_secret: Some("s3cret".into()),
            ..Overrides::default()
        })
        .unwrap();
        assert_eq!(c.port, 9100);
        assert_eq!(c.host, "0.0.0.0");
        assert_eq!(c.apps[0].secret, "s3cret");
        assert_eq!(c.apps[0].key, DEV_APP_KEY);
    }
}
