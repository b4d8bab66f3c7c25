//! Configuration: one typed struct, loaded from built-in defaults, then a TOML
//! file, then `HERALD_*` environment variables, then command-line flags (each
//! layer overrides the one before), and validated once at start.
//!
//! Unknown keys are rejected rather than ignored: a typo such as
//! `max_conections` silently falling back to a default is the kind of bug an
//! operator finds in production. Every error names the key it is about.
//!
//! Over 800 lines on purpose: every core setting's field, default, override
//! and check side by side, so that adding one touches one file in one
//! pattern (adapters' settings live in their own crates).

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

/// Server-wide settings plus the list of apps. (Unknown keys are caught
/// by [`crate::adapter::check_config`]: serde's `deny_unknown_fields`
/// does not combine with the flattened [`Config::sections`].)
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
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
    /// Apply `write_delay_ms` only while the node's fan-out delivers at
    /// least this many frames a second (0: whatever the rate); below it
    /// every frame goes out at once. See [`crate::load`].
    pub write_delay_min_rate: u32,
    /// Let senders write a quiet plain-TCP connection's frames to its
    /// socket themselves (the fan-out in batches on an io_uring where the
    /// kernel allows one), instead of waking its session for each.
    pub direct_writes: bool,
    /// Negotiate permessage-deflate (RFC 7692) with WebSocket clients that
    /// offer it (each app may turn it off with its own key).
    pub websocket_compression: bool,
    /// Publications smaller than this many bytes go uncompressed even to
    /// connections that negotiated permessage-deflate.
    pub websocket_compression_min_bytes: usize,
    /// Serve the development app (its secret is public) on an address
    /// other clients can reach. Off: refused at start, so a copied
    /// container line cannot expose it by accident.
    pub allow_development_credentials: bool,
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
    /// The cluster's broker (`[broker]`).
    pub broker: BrokerConfig,
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
    /// Apps from a database table (`[apps_database]`), beside the file's.
    pub apps_database: AppsDatabase,
    /// The adapters' keys (`webhook_*`, `[rpc]`, ...), raw: each adapter
    /// parses and checks its own (see [`crate::adapter`]); a key no
    /// adapter claims is refused at load.
    #[serde(flatten)]
    pub sections: toml::Table,
}

/// Apps read from a table in the format of soketi's `apps` table.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AppsDatabase {
    /// `postgres://user:password@host:port/database` or `mysql://...`
    /// (MySQL, MariaDB); none: no database.
    pub url: Option<String>,
    /// The table, soketi's layout (`apps`).
    pub table: String,
    /// Seconds between reads of the table: a new, changed or deleted row
    /// takes effect within this.
    pub refresh: u64,
}

impl Default for AppsDatabase {
    fn default() -> Self {
        AppsDatabase {
            url: None,
            table: "apps".into(),
            refresh: 5,
        }
    }
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
    /// `local`, `redis://…`, `rediss://…` (TLS), `redis-sentinel://…` /
    /// `rediss-sentinel://…` (Sentinels, then the master group's name),
    /// `nats://…` or `tls://…` (NATS over TLS); credentials may be in the URL.
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
    /// Seconds between broker canaries (a message to a subject only this
    /// node hears; 0: none), to notice a broker that stops delivering
    /// without closing the connection.
    pub canary_interval: u64,
    /// Seconds a canary may take to come back before the node reports
    /// itself not ready and reconnects.
    pub canary_timeout: u64,
    /// Seconds a subscription's confirmation may wait for the broker to
    /// hold its interest (no connection yet, or one being restored) before
    /// the client gets its protocol's retryable error instead.
    pub confirm_timeout: u64,
    /// Copies JetStream keeps of the history stream and the sessions
    /// bucket (NATS only): 1 keeps them on one server of a NATS cluster,
    /// 3 lets them survive a server's loss.
    pub jetstream_replicas: usize,
    /// Publications a node holds for the broker while it has not taken
    /// them (the broker away or slow) before it refuses more (503).
    pub outbox: usize,
    /// Seconds a node keeps the publications the broker took, for nodes
    /// that missed them to ask for (0: not kept; nothing recovered).
    pub recovery_window: u64,
    /// Most publications kept for that window.
    pub recovery_max: usize,
    /// Most bytes of publications kept (outbox and window together).
    pub journal_max_bytes: usize,
    /// PEM file of the authorities to trust for the broker's certificate,
    /// instead of the system's (a TLS `url` only; see herald-broker's
    /// `tls` module for why instead).
    pub tls_ca: Option<String>,
    /// PEM client certificate (chain) the node presents to the broker,
    /// for servers that require one; with `tls_key`.
    pub tls_cert: Option<String>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<String>,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            url: "local".into(),
            prefix: "herald".into(),
            ttl: 30,
            ready_needs_broker: true,
            canary_interval: 5,
            canary_timeout: 2,
            confirm_timeout: 5,
            jetstream_replicas: 1,
            outbox: 16 * 1024,
            recovery_window: 60,
            recovery_max: 100_000,
            journal_max_bytes: 64 << 20,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
        }
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

    /// The canary's (interval, timeout); a zero interval: no canary.
    pub fn canary(&self) -> (Duration, Duration) {
        (
            Duration::from_secs(self.canary_interval),
            Duration::from_secs(self.canary_timeout),
        )
    }

    /// The longest a confirmation waits for the broker to hold its
    /// interest (`confirm_timeout`).
    pub fn confirm_timeout(&self) -> Duration {
        Duration::from_secs(self.confirm_timeout)
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
            write_delay_min_rate: crate::load::DEFAULT_MIN_RATE,
            direct_writes: true,
            // Every browser offers it; compressed once per publication and
            // shared, with no state per connection (bench/RESULTS.md).
            websocket_compression: true,
            websocket_compression_min_bytes: crate::deflate::DEFAULT_MIN_BYTES,
            allow_development_credentials: false,
            log: "info".into(),
            tls_cert: None,
            tls_key: None,
            log_format: LogFormat::Text,
            metrics_port: None,
            dashboard: false,
            dashboard_token: None,
            broker: BrokerConfig::default(),
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
            apps_database: AppsDatabase::default(),
            sections: toml::Table::new(),
        }
    }
}

/// One tenant: its credentials and limits. Every limit has Pusher's default.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct AppConfig {
    pub id: String,
    pub key: String,
    pub secret: String,
    /// A disabled app refuses connections with 4003 and API calls with 403.
    pub enabled: bool,
    /// Web pages that may connect (see [`crate::origin`]): hosts
    /// (`app.example.com`), wildcards (`*.example.org`), full origins
    /// (`https://app.example.com`), or `*` for any (the default).
    pub allowed_origins: Vec<String>,
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
    /// Negotiate permessage-deflate with this app's WebSocket clients
    /// (where the server's `websocket_compression` is on too).
    pub websocket_compression: bool,
    /// The adapters' keys of this app (`webhooks`, `api_keys`, ...), raw,
    /// as [`Config::sections`].
    #[serde(flatten)]
    pub extra: toml::Table,
}

impl Default for AppConfig {
    fn default() -> Self {
        AppConfig {
            id: String::new(),
            key: String::new(),
            secret: String::new(),
            enabled: true,
            allowed_origins: vec!["*".into()],
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
            websocket_compression: true,
            extra: toml::Table::new(),
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
    pub write_delay_min_rate: Option<u32>,
    pub direct_writes: Option<bool>,
    pub websocket_compression: Option<bool>,
    pub allow_development_credentials: Option<bool>,
    pub log: Option<String>,
    /// Replace the single app's credentials (handy in containers).
    pub app_id: Option<String>,
    pub app_key: Option<String>,
    pub app_secret: Option<String>,
    /// The single app's `allowed_origins`.
    pub allowed_origins: Option<Vec<String>>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
    pub log_format: Option<LogFormat>,
    pub metrics_port: Option<u16>,
    pub dashboard: Option<bool>,
    pub dashboard_token: Option<String>,
    /// `broker.url`.
    pub broker: Option<String>,
    /// `broker.tls_ca`, `broker.tls_cert`, `broker.tls_key`.
    pub broker_tls_ca: Option<String>,
    pub broker_tls_cert: Option<String>,
    pub broker_tls_key: Option<String>,
    pub keepalive_interval: Option<u64>,
    /// Adapters' settings from their environment variables and flags:
    /// (key, the variable or flag's name for errors, value); see
    /// [`crate::adapter::Setting`].
    pub adapter: Vec<(String, String, toml::Value)>,
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
    /// Every error found, in the order of the checks (never fewer than two:
    /// [`ConfigError::all`] gives a lone error as itself).
    #[error("{} configuration errors:\n{}", .0.len(), list(.0))]
    Several(Vec<ConfigError>),
}

/// Errors one after another, each as `- ERROR` with its own further lines
/// (TOML's snippet) indented under it.
fn list(errors: &[ConfigError]) -> String {
    errors
        .iter()
        .map(|e| format!("- {}", e.to_string().replace('\n', "\n  ")))
        .collect::<Vec<_>>()
        .join("\n")
}

impl ConfigError {
    /// `errors` as one result: none is Ok, one is itself, more are
    /// [`ConfigError::Several`] (nested lists flattened).
    pub fn all(errors: Vec<ConfigError>) -> Result<(), ConfigError> {
        let mut flat = Vec::new();
        for e in errors {
            match e {
                ConfigError::Several(inner) => flat.extend(inner),
                e => flat.push(e),
            }
        }
        match flat.len() {
            0 => Ok(()),
            1 => Err(flat.remove(0)),
            _ => Err(ConfigError::Several(flat)),
        }
    }

    /// The errors this one holds: itself, or each of [`ConfigError::Several`].
    pub fn into_list(self) -> Vec<ConfigError> {
        match self {
            ConfigError::Several(list) => list,
            e => vec![e],
        }
    }
}

/// A key no part of Herald reads.
pub fn unknown(key: &str) -> ConfigError {
    invalid(
        key,
        "is not a setting (misspelt? docs/configuration.md lists every key)",
    )
}

/// Crates whose log lines a filter may name (as `tracing` targets match:
/// a directive's target is a prefix of the line's). Herald's own crates
/// all start with `herald`; the rest are the dependencies that log.
const LOG_TARGETS: &[&str] = &[
    "herald",
    "tokio",
    "hyper",
    "hyper_util",
    "h2",
    "axum",
    "tower",
    "tonic",
    "reqwest",
    "rustls",
    "tokio_rustls",
    "redis",
    "async_nats",
    "tungstenite",
    "tokio_tungstenite",
    "mio",
];

const LOG_LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error", "off"];

/// Refuse a log filter that would match nothing Herald logs: a bare word
/// like `verbose` is a target directive to `tracing`, which silences every
/// line (the development-credentials warning included) without a word.
pub fn check_log_filter(filter: &str) -> Result<(), String> {
    tracing_subscriber::EnvFilter::builder()
        .parse(filter)
        .map_err(|e| format!("{filter:?} is not a log filter: {e}"))?;
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let (target, level) = match directive.rsplit_once('=') {
            Some((t, l)) => (t, Some(l)),
            None => (directive, None),
        };
        let target = target.split('[').next().unwrap_or_default().trim();
        if level.is_none() && LOG_LEVELS.contains(&target.to_ascii_lowercase().as_str()) {
            continue;
        }
        let known = target.is_empty()
            || LOG_TARGETS
                .iter()
                .any(|t| t.starts_with(target) || target.starts_with(t));
        if !known {
            return Err(format!(
                "{directive:?} names neither a level ({}) nor a target Herald logs under ({}, e.g. `herald=debug`); it would hide every line",
                LOG_LEVELS.join(", "),
                LOG_TARGETS.join(", ")
            ));
        }
    }
    Ok(())
}

/// An error naming `key` (adapters' checks use it too).
pub fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

impl Config {
    /// Parse a TOML document (the file layer); every error of the file in
    /// one [`ConfigError`] (see [`Config::from_toml_all`]).
    pub fn from_toml(text: &str, path: &str) -> Result<Config, ConfigError> {
        let (config, errors) = Config::from_toml_all(text, path);
        ConfigError::all(errors).map(|()| config.unwrap_or_default())
    }

    /// Parse a TOML document and find every error in it: each syntax error
    /// (TOML's parser recovers and goes on), or else each key whose value
    /// does not fit, named and shown with TOML's snippet of the file (the
    /// line, a caret under the value), in the file's order. Returns the
    /// configuration of the keys that fit, so the checks after this one
    /// ([`Config::validate`], the adapters') can report theirs too; none
    /// after a syntax error, where no key can be trusted.
    pub fn from_toml_all(text: &str, path: &str) -> (Option<Config>, Vec<ConfigError>) {
        use serde::Deserialize;
        use toml::de::{DeTable, Deserializer};
        let parse_error = |key: Option<&str>, mut e: toml::de::Error| {
            e.set_input(Some(text));
            // TOML's own message: the line, the column and a snippet of
            // the file with a caret, on several lines.
            let message = e.to_string().trim_end().to_owned();
            ConfigError::Parse {
                path: path.into(),
                message: match key {
                    Some(key) => format!("`{key}`: {message}"),
                    None => message,
                },
            }
        };
        let line_of = |e: &toml::de::Error| {
            let at = e.span().map_or(0, |s| s.start).min(text.len());
            text.as_bytes()[..at]
                .iter()
                .filter(|&&b| b == b'\n')
                .count()
        };
        let (doc, syntax) = DeTable::parse_recoverable(text);
        if !syntax.is_empty() {
            // The parser recovers and goes on, but one mistake often
            // trips it several times on its line: the first per line.
            let mut seen = std::collections::HashSet::new();
            let errors = syntax
                .into_iter()
                .filter(|e| seen.insert(line_of(e)))
                .map(|e| parse_error(None, e))
                .collect();
            return (None, errors);
        }
        let whole = match Config::deserialize(Deserializer::from(doc.clone())) {
            Ok(config) => return (Some(config), Vec::new()),
            Err(e) => e,
        };
        let mut found = Vec::new();
        let mut failed = Vec::new();
        for (key, path_in, alone) in leaves(&doc) {
            if let Err(e) = Config::deserialize(Deserializer::from(alone)) {
                found.push((e.span().map_or(usize::MAX, |s| s.start), key, e));
                failed.push(path_in);
            }
        }
        found.sort_by_key(|(at, _, _)| *at);
        let mut errors: Vec<ConfigError> = found
            .into_iter()
            .map(|(_, key, e)| parse_error(Some(&key), e))
            .collect();
        // The keys that fit, for the later checks.
        let rest = text.parse::<toml::Table>().ok().and_then(|mut table| {
            for path in &failed {
                remove(&mut table, path);
            }
            toml::Value::Table(table).try_into::<Config>().ok()
        });
        if errors.is_empty() || rest.is_none() {
            // Only the keys together fail: TOML's error for the whole file.
            errors.insert(0, parse_error(None, whole));
        }
        (rest, errors)
    }

    /// Build the effective configuration: defaults, then `file`, then
    /// `overrides` (environment and flags, already merged by the caller with
    /// flags winning), then validation.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        let (config, mut errors) = Config::from_file_all(file)?;
        let Some(mut config) = config else {
            return ConfigError::all(errors).map(|()| Config::default());
        };
        config.apply(overrides)?;
        errors.extend(config.problems());
        ConfigError::all(errors).map(|()| config)
    }

    /// The defaults, then `file` when given (the first two layers; callers
    /// that put a layer of their own between the file and the overrides,
    /// such as the binary's peer settings, call this, then [`Config::apply`]
    /// and [`Config::validate`]).
    pub fn from_file(file: Option<&Path>) -> Result<Config, ConfigError> {
        let (config, errors) = Config::from_file_all(file)?;
        ConfigError::all(errors).map(|()| config.unwrap_or_default())
    }

    /// As [`Config::from_file`], but the file's errors beside the
    /// configuration of the keys that fit (see [`Config::from_toml_all`]);
    /// only a file that cannot be read is an error at once.
    #[allow(clippy::type_complexity)]
    pub fn from_file_all(
        file: Option<&Path>,
    ) -> Result<(Option<Config>, Vec<ConfigError>), ConfigError> {
        Ok(match file {
            Some(path) => {
                let shown = path.display().to_string();
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: shown.clone(),
                    source,
                })?;
                Config::from_toml_all(&text, &shown)
            }
            None => (Some(Config::default()), Vec::new()),
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
        if let Some(v) = o.write_delay_min_rate {
            self.write_delay_min_rate = v;
        }
        if let Some(v) = o.direct_writes {
            self.direct_writes = v;
        }
        if let Some(v) = o.websocket_compression {
            self.websocket_compression = v;
        }
        if let Some(v) = o.allow_development_credentials {
            self.allow_development_credentials = v;
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
        if let Some(v) = o.dashboard {
            self.dashboard = v;
        }
        if let Some(v) = &o.dashboard_token {
            self.dashboard_token = Some(v.clone());
        }
        if let Some(v) = &o.broker {
            self.broker.url = v.clone();
        }
        if let Some(v) = &o.broker_tls_ca {
            self.broker.tls_ca = Some(v.clone());
        }
        if let Some(v) = &o.broker_tls_cert {
            self.broker.tls_cert = Some(v.clone());
        }
        if let Some(v) = &o.broker_tls_key {
            self.broker.tls_key = Some(v.clone());
        }
        if let Some(v) = o.keepalive_interval {
            self.keepalive_interval = v;
        }
        // With a database of apps, the development app is never implied.
        if self.apps.is_empty() && self.apps_database.url.is_none() {
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
        if let Some(origins) = &o.allowed_origins {
            match self.apps.as_mut_slice() {
                [one] => one.allowed_origins = origins.clone(),
                _ => {
                    return Err(invalid(
                        "HERALD_ALLOWED_ORIGINS",
                        "can only be used with exactly one app; set allowed_origins per app in the file",
                    ))
                }
            }
        }
        for (key, name, value) in &o.adapter {
            self.set(key, value.clone())
                .map_err(|message| invalid(name, message))?;
        }
        Ok(())
    }

    /// Set an adapter's key, raw: `rpc.host` (a key of a table), `webhook_batch_ms`
    /// (a top-level key) or `apps[0].api_keys` (a key of the only app; an
    /// error with several). The adapter parses and checks it at load.
    pub fn set(&mut self, key: &str, value: toml::Value) -> Result<(), String> {
        if let Some(k) = key.strip_prefix("apps[0].") {
            if self.apps.is_empty() {
                self.apps.push(AppConfig::development());
            }
            return match self.apps.as_mut_slice() {
                [one] => {
                    one.extra.insert(k.to_owned(), value);
                    Ok(())
                }
                _ => Err(
                    "can only be used with exactly one app; configure several apps in the file"
                        .into(),
                ),
            };
        }
        match key.split_once('.') {
            None => {
                self.sections.insert(key.to_owned(), value);
            }
            Some((table, k)) => {
                let entry = self
                    .sections
                    .entry(table.to_owned())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()));
                match entry {
                    toml::Value::Table(t) => {
                        t.insert(k.to_owned(), value);
                    }
                    _ => return Err(format!("`{table}` in the file is not a table")),
                }
            }
        }
        Ok(())
    }

    /// Semantic checks serde cannot make, every error at once (see
    /// [`Config::problems`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::all(self.problems())
    }

    /// Every semantic error serde cannot catch, each naming its key.
    pub fn problems(&self) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        if let Err(m) = check_log_filter(&self.log) {
            errors.push(invalid("log", m));
        }
        match self.bind_ip() {
            // Whether the address is loopback is known only for a good one.
            Ok(_) => errors.extend(self.check_development_credentials().err()),
            Err(e) => errors.push(e),
        }
        if self.activity_timeout == 0 {
            errors.push(invalid("activity_timeout", "must be at least 1 second"));
        }
        if self.pong_timeout == 0 {
            errors.push(invalid("pong_timeout", "must be at least 1 second"));
        }
        if self.write_delay_ms > MAX_WRITE_DELAY_MS {
            errors.push(invalid(
                "write_delay_ms",
                format!("must be at most {MAX_WRITE_DELAY_MS} (milliseconds)"),
            ));
        }
        if !(1..=MAX_KEEPALIVE_INTERVAL).contains(&self.keepalive_interval) {
            errors.push(invalid(
                "keepalive_interval",
                format!("must be 1 to {MAX_KEEPALIVE_INTERVAL} seconds"),
            ));
        }
        if self.listen_backlog == 0 {
            errors.push(invalid("listen_backlog", "must be positive"));
        }
        if !(1..=MAX_HTTP_HEADER_TIMEOUT).contains(&self.http_header_timeout) {
            errors.push(invalid(
                "http_header_timeout",
                format!("must be 1 to {MAX_HTTP_HEADER_TIMEOUT} seconds"),
            ));
        }
        if !(1..=MAX_WS_IDLE_TIMEOUT).contains(&self.ws_idle_timeout) {
            errors.push(invalid(
                "ws_idle_timeout",
                format!("must be 1 to {MAX_WS_IDLE_TIMEOUT} seconds"),
            ));
        }
        for (i, net) in self.address_limits_exempt.iter().enumerate() {
            if parse_net(net).is_none() {
                errors.push(invalid(
                    format!("address_limits_exempt[{i}]"),
                    format!("{net:?} is not an IP address or CIDR block (e.g. 10.0.0.0/8, ::1)"),
                ));
            }
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => errors.push(invalid("tls_key", "is required with tls_cert")),
            (None, Some(_)) => errors.push(invalid("tls_cert", "is required with tls_key")),
            _ => {}
        }
        let b = &self.broker;
        let schemes = [
            "redis://",
            "rediss://",
            "redis-sentinel://",
            "rediss-sentinel://",
            "redis-cluster://",
            "rediss-cluster://",
            "nats://",
            "tls://",
        ];
        if b.url != "local" && !schemes.iter().any(|s| b.url.starts_with(s)) {
            errors.push(invalid(
                "broker.url",
                "must be `local`, or a redis://, rediss://, redis-sentinel://, rediss-sentinel://, \
                 redis-cluster://, rediss-cluster://, nats:// or tls:// URL",
            ));
        }
        if b.prefix.is_empty()
            || b.prefix.len() > 64
            || !b
                .prefix
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
        {
            errors.push(invalid(
                "broker.prefix",
                "must be 1 to 64 letters, digits, '_' or '-'",
            ));
        }
        if b.ttl == 0 || b.ttl > 3600 {
            errors.push(invalid("broker.ttl", "must be 1 to 3600 (seconds)"));
        }
        if b.canary_interval > 3600 {
            errors.push(invalid(
                "broker.canary_interval",
                "must be 0 (off) to 3600 (seconds)",
            ));
        }
        if b.canary_timeout == 0 || b.canary_timeout > 60 {
            errors.push(invalid(
                "broker.canary_timeout",
                "must be 1 to 60 (seconds)",
            ));
        }
        if b.confirm_timeout == 0 || b.confirm_timeout > 60 {
            errors.push(invalid(
                "broker.confirm_timeout",
                "must be 1 to 60 (seconds)",
            ));
        }
        // The files themselves are read and checked by the engine's
        // loader at start (herald-broker's `tls`), before anything listens.
        match (&b.tls_cert, &b.tls_key) {
            (Some(_), None) => errors.push(invalid(
                "broker.tls_key",
                "is required with broker.tls_cert",
            )),
            (None, Some(_)) => errors.push(invalid(
                "broker.tls_cert",
                "is required with broker.tls_key",
            )),
            _ => {}
        }
        if b.outbox == 0 || b.outbox > 1 << 20 {
            errors.push(invalid("broker.outbox", "must be 1 to 1048576"));
        }
        if b.recovery_window > 3600 {
            errors.push(invalid(
                "broker.recovery_window",
                "must be 0 (none kept) to 3600 (seconds)",
            ));
        }
        if b.recovery_max > 10_000_000 {
            errors.push(invalid("broker.recovery_max", "must be 0 to 10000000"));
        }
        if b.journal_max_bytes < 1 << 20 || b.journal_max_bytes > 1 << 34 {
            errors.push(invalid(
                "broker.journal_max_bytes",
                "must be 1048576 (1 MiB) to 17179869184 (16 GiB)",
            ));
        }
        if b.jetstream_replicas == 0 || b.jetstream_replicas > 5 {
            errors.push(invalid(
                "broker.jetstream_replicas",
                "must be 1 to 5 (JetStream's own limit)",
            ));
        }
        if self.metrics_port.is_some_and(|p| p != 0 && p == self.port) {
            errors.push(invalid("metrics_port", "must differ from port"));
        }
        if self.dashboard {
            match &self.dashboard_token {
                None => errors.push(invalid(
                    "dashboard_token",
                    "is required with dashboard = true",
                )),
                Some(t) if t.chars().count() < 16 || t.chars().any(char::is_control) => errors
                    .push(invalid(
                        "dashboard_token",
                        "must be at least 16 characters, without control characters",
                    )),
                Some(_) => {}
            }
        }
        let db = &self.apps_database;
        if let Some(url) = &db.url {
            let schemes = ["postgres://", "postgresql://", "mysql://"];
            if !schemes.iter().any(|s| url.starts_with(s)) {
                errors.push(invalid(
                    "apps_database.url",
                    "must be a postgres:// (PostgreSQL) or mysql:// (MySQL, MariaDB) URL",
                ));
            }
        }
        if db.table.is_empty()
            || db.table.len() > 63
            || !db
                .table
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'_')
        {
            errors.push(invalid(
                "apps_database.table",
                "must be 1 to 63 letters, digits or '_'",
            ));
        }
        if !(1..=3600).contains(&db.refresh) {
            errors.push(invalid(
                "apps_database.refresh",
                "must be 1 to 3600 (seconds)",
            ));
        }
        let mut ids = std::collections::HashSet::new();
        let mut keys = std::collections::HashSet::new();
        for (i, app) in self.apps.iter().enumerate() {
            let k = |field: &str| format!("apps[{i}].{field}");
            for (field, value) in [("id", &app.id), ("key", &app.key), ("secret", &app.secret)] {
                if value.is_empty() {
                    errors.push(invalid(k(field), "is required (and must not be empty)"));
                    continue;
                }
                if value.len() > 200 || value.chars().any(|c| c.is_control() || c == '/') {
                    errors.push(invalid(
                        k(field),
                        "must be at most 200 characters, without '/' or control characters",
                    ));
                }
            }
            if !app.id.is_empty() && !ids.insert(&app.id) {
                errors.push(invalid(k("id"), format!("duplicates app id {:?}", app.id)));
            }
            if !app.key.is_empty() && !keys.insert(&app.key) {
                errors.push(invalid(
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
                    errors.push(invalid(k(field), "must be positive"));
                }
            }
            if app.outbound_bytes != 0 && app.outbound_bytes < 64 * 1024 {
                errors.push(invalid(
                    k("outbound_bytes"),
                    "must be at least 65536 (it must hold the largest frame sent, e.g. a full presence member list)",
                ));
            }
            if app.max_cache_bytes < 4_usize.saturating_mul(app.max_payload) {
                errors.push(invalid(
                    k("max_cache_bytes"),
                    "must be at least 4 × max_payload (it must hold the largest cached event)",
                ));
            }
            if let Err((j, why)) = crate::origin::AllowedOrigins::parse(&app.allowed_origins) {
                let key = match app.allowed_origins.is_empty() {
                    true => k("allowed_origins"),
                    false => k(&format!("allowed_origins[{j}]")),
                };
                errors.push(invalid(key, why));
            }
            if app.max_frame_size != 0 && app.max_frame_size < 1024 {
                errors.push(invalid(k("max_frame_size"), "must be at least 1024 bytes"));
            }
        }
        errors
    }

    /// Whether `app`'s WebSocket upgrades may negotiate permessage-deflate.
    pub fn compression(&self, app: &AppConfig) -> bool {
        self.websocket_compression && app.websocket_compression
    }

    /// The address `host` names, as `herald serve` binds it: an IPv4 or
    /// IPv6 address (`::1`, `[::1]`; `::` serves IPv4 too), an
    /// IPv4-mapped IPv6 address as its IPv4 address, or `localhost`
    /// (127.0.0.1). [`Config::validate`] refuses what this refuses, so
    /// `herald config --check` and `serve` agree.
    pub fn bind_ip(&self) -> Result<std::net::IpAddr, ConfigError> {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        let host = self.host.as_str();
        if host == "localhost" {
            return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        let ip = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(v6) => v6.parse::<Ipv6Addr>().map(IpAddr::V6),
            None => host.parse::<IpAddr>(),
        };
        ip.map(|ip| ip.to_canonical()).map_err(|_| {
            invalid(
                "host",
                "must be an IP address (IPv4, or IPv6 such as ::1 or ::, bracketed or not) or localhost",
            )
        })
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

    /// Whether `host` is a loopback address: only this machine reaches
    /// the port, so open endpoints and public credentials harm nobody.
    pub fn serves_loopback_only(&self) -> bool {
        self.bind_ip().is_ok_and(|ip| ip.is_loopback())
    }

    /// The development app's secret is public: refuse to serve it on an
    /// address other machines can reach unless the operator says so.
    fn check_development_credentials(&self) -> Result<(), ConfigError> {
        if self.serves_loopback_only() || self.allow_development_credentials {
            return Ok(());
        }
        match self.apps.iter().find(|a| a.is_development()) {
            Some(app) => Err(invalid(
                "allow_development_credentials",
                format!(
                    "app {:?} has the DEVELOPMENT secret, which is public, and host {} is reachable \
                     from other machines: give your own app (HERALD_APP_ID, HERALD_APP_KEY, \
                     HERALD_APP_SECRET or [[apps]]), or set allow_development_credentials = true \
                     (HERALD_ALLOW_DEVELOPMENT_CREDENTIALS=true) to serve it anyway",
                    app.id, self.host
                ),
            )),
            None => Ok(()),
        }
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

/// Each leaf of a parsed file as a document of its own, keeping its spans:
/// `(shown key, path for [`remove`], the document)` for `port`,
/// `broker.ttl`, `apps[1].max_payload`. A leaf that fails to deserialize
/// alone is one error of the file.
fn leaves<'i>(
    doc: &toml::Spanned<toml::de::DeTable<'i>>,
) -> Vec<(String, Vec<Step>, toml::Spanned<toml::de::DeTable<'i>>)> {
    use toml::de::{DeString, DeTable, DeValue};
    use toml::Spanned;
    type Key<'i> = Spanned<DeString<'i>>;
    let one = |k: &Key<'i>, v: Spanned<DeValue<'i>>| {
        let mut t = DeTable::new();
        t.insert(k.clone(), v);
        t
    };
    let document = |t: DeTable<'i>| Spanned::new(doc.span(), t);
    let mut out = Vec::new();
    for (k, v) in doc.get_ref().iter() {
        let name = k.get_ref().to_string();
        match v.get_ref() {
            DeValue::Table(t) if !t.is_empty() => {
                for (k2, v2) in t.iter() {
                    let inner = Spanned::new(v.span(), DeValue::Table(one(k2, v2.clone())));
                    out.push((
                        format!("{name}.{}", k2.get_ref()),
                        vec![Step::Key(name.clone()), Step::Key(k2.get_ref().to_string())],
                        document(one(k, inner)),
                    ));
                }
            }
            DeValue::Array(items)
                if items
                    .iter()
                    .any(|i| matches!(i.get_ref(), DeValue::Table(_))) =>
            {
                for (i, item) in items.iter().enumerate() {
                    let single = |elem: Spanned<DeValue<'i>>| {
                        document(one(
                            k,
                            Spanned::new(v.span(), DeValue::Array(std::iter::once(elem).collect())),
                        ))
                    };
                    match item.get_ref() {
                        DeValue::Table(t) if !t.is_empty() => {
                            for (k2, v2) in t.iter() {
                                let elem =
                                    Spanned::new(item.span(), DeValue::Table(one(k2, v2.clone())));
                                out.push((
                                    format!("{name}[{i}].{}", k2.get_ref()),
                                    vec![
                                        Step::Key(name.clone()),
                                        Step::Index(i),
                                        Step::Key(k2.get_ref().to_string()),
                                    ],
                                    single(elem),
                                ));
                            }
                        }
                        _ => out.push((
                            format!("{name}[{i}]"),
                            vec![Step::Key(name.clone()), Step::Index(i)],
                            single(item.clone()),
                        )),
                    }
                }
            }
            _ => out.push((
                name.clone(),
                vec![Step::Key(name)],
                document(one(k, v.clone())),
            )),
        }
    }
    out
}

/// One step of a path into a TOML document: a table's key or an array's index.
enum Step {
    Key(String),
    Index(usize),
}

/// Take the value at `path` out of `table`: what is left of a file once
/// the keys that failed are gone. An array element becomes an empty table
/// (the other elements keep their indexes).
fn remove(table: &mut toml::Table, path: &[Step]) {
    let [Step::Key(first), rest @ ..] = path else {
        return;
    };
    if rest.is_empty() {
        table.remove(first);
        return;
    }
    let mut value = match table.get_mut(first) {
        Some(v) => v,
        None => return,
    };
    for (n, step) in rest.iter().enumerate() {
        let last = n + 1 == rest.len();
        value = match (step, value) {
            (Step::Key(k), toml::Value::Table(t)) if last => {
                t.remove(k);
                return;
            }
            (Step::Key(k), toml::Value::Table(t)) => match t.get_mut(k) {
                Some(v) => v,
                None => return,
            },
            (Step::Index(i), toml::Value::Array(a)) if last => {
                if let Some(v) = a.get_mut(*i) {
                    *v = toml::Value::Table(toml::Table::new());
                }
                return;
            }
            (Step::Index(i), toml::Value::Array(a)) => match a.get_mut(*i) {
                Some(v) => v,
                None => return,
            },
            _ => return,
        };
    }
}

/// A CIDR block, or a single address as its own block.
fn parse_net(s: &str) -> Option<ipnet::IpNet> {
    s.parse::<ipnet::IpNet>()
        .ok()
        .or_else(|| s.parse::<std::net::IpAddr>().ok().map(ipnet::IpNet::from))
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
