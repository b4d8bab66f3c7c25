//! Action Cable's settings: the `[rpc]` table (the app's RPC backend,
//! `/_broadcast`, streams, JWT identification, the broadcast adapters),
//! parsed and checked here (the core keeps it raw; see
//! `herald_core::adapter`). Names and meanings as they always were;
//! docs/configuration.md lists them.

use herald_core::adapter::{section, text, Setting};
use herald_core::config::{invalid, AppConfig, Config, ConfigError};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Where Server-Sent Events are served unless `rpc.sse_path` says
/// otherwise (AnyCable's default).
pub const DEFAULT_SSE_PATH: &str = "/events";

/// Most streams one connection may follow (over all its subscriptions).
pub const MAX_STREAMS: usize = 1000;

/// Longest stream name, in bytes.
pub const MAX_STREAM_NAME: usize = 1024;

/// The table this adapter owns.
pub const TOP_KEYS: &[&str] = &["rpc"];

/// Parse and check `[rpc]`.
pub fn load(config: &Config) -> Result<RpcConfig, ConfigError> {
    let rpc: RpcConfig = section(config, "rpc")?;
    rpc.validate(&config.apps)?;
    Ok(rpc)
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
    /// Serve Server-Sent Events at `sse_path` (AnyCable's `--sse`).
    pub sse: bool,
    /// The path of Server-Sent Events (AnyCable's `--sse_path`).
    pub sse_path: String,
    /// Bearer token the broadcast endpoint requires (unset: none).
    pub broadcast_key: Option<String>,
    /// Allow subscriptions to unsigned stream names without the backend.
    pub public_streams: bool,
    /// Key for signed stream names (unset: the app's secret).
    pub streams_secret: Option<String>,
    /// Turbo Streams subscriptions (`Turbo::StreamsChannel` with a
    /// `signed_stream_name`) are verified here, without the app.
    pub turbo_streams: bool,
    /// Key of Turbo's signed stream names (unset: `streams_secret`'s).
    pub turbo_streams_secret: Option<String>,
    /// CableReady stream subscriptions (`CableReady::Stream`) are verified
    /// here, without the app.
    pub cable_ready_streams: bool,
    /// Key of CableReady's signed identifiers (unset: `streams_secret`'s).
    pub cable_ready_secret: Option<String>,
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
    // --- Reliable streams and resumable sessions, AnyCable's names.
    /// Most publications kept per reliable stream (0: no history).
    pub history_limit: usize,
    /// Seconds a publication stays in a stream's history (0: no history).
    pub history_ttl: u64,
    /// Most bytes all streams' histories hold together.
    pub history_max_bytes: usize,
    /// Most bytes of history answers the whole node may have waiting past
    /// its connections' outbound bounds (`herald_core::history::budget`).
    pub history_answers_max_bytes: usize,
    /// Seconds a closed session can be restored (0: no resumption).
    pub sessions_ttl: u64,
    /// Most sessions kept for restoring.
    pub sessions_max: usize,
    /// Most history requests per connection per second.
    pub history_rate: u32,
    // --- Presence and whispers (`actioncable-v1-ext-json`), AnyCable's names.
    /// Seconds a member whose connection closed without leaving stays
    /// present (AnyCable's `--presence_ttl`).
    pub presence_ttl: u64,
    /// `$pubsub` streams are presence-enabled (AnyCable's
    /// `--streams_presence`; public streams always are).
    pub streams_presence: bool,
    /// Clients may whisper on `$pubsub` streams (AnyCable's
    /// `--streams_whisper`; public streams always may).
    pub streams_whisper: bool,
    /// Most members one stream's presence may hold.
    pub presence_max_members: usize,
    /// Most records in one presence `info` answer (its `total` still
    /// counts every member).
    pub presence_max_records: usize,
    /// Most bytes of a member's id and info (as JSON) together.
    pub presence_max_info: usize,
    /// Most streams one connection may be present in at once.
    pub presence_max_joins: usize,
    /// Most whispers per connection per second.
    pub whisper_rate: u32,
    /// Most presence commands (join, leave, info) per connection per second.
    pub presence_rate: u32,
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
            sse: false,
            sse_path: DEFAULT_SSE_PATH.into(),
            broadcast_key: None,
            public_streams: false,
            streams_secret: None,
            turbo_streams: false,
            turbo_streams_secret: None,
            cable_ready_streams: false,
            cable_ready_secret: None,
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
            history_answers_max_bytes: 256 * 1024 * 1024,
            sessions_ttl: 300,
            sessions_max: 100_000,
            history_rate: 100,
            presence_ttl: 15,
            streams_presence: true,
            streams_whisper: false,
            presence_max_members: 10_000,
            presence_max_records: 100,
            presence_max_info: 1024,
            presence_max_joins: 100,
            whisper_rate: 10,
            presence_rate: 100,
        }
    }
}

impl RpcConfig {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    fn validate(&self, apps: &[AppConfig]) -> Result<(), ConfigError> {
        // Every error at once (see herald_core's ConfigError::all).
        let mut errors = Vec::new();
        if let Some(h) = &self.host {
            if h.trim().is_empty() || h.chars().any(|c| c.is_whitespace() || c.is_control()) {
                errors.push(invalid(
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
                errors.push(invalid(
                    "rpc.headers",
                    format!("{h:?} is not a header name (letters, digits, '-', '_')"),
                ));
            }
        }
        if self.timeout_ms == 0 {
            errors.push(invalid("rpc.timeout_ms", "must be positive"));
        }
        if self.concurrency == 0 {
            errors.push(invalid("rpc.concurrency", "must be positive"));
        }
        if self.disconnect_rate == 0 {
            errors.push(invalid("rpc.disconnect_rate", "must be positive"));
        }
        if self.disconnect_queue == 0 {
            errors.push(invalid("rpc.disconnect_queue", "must be positive"));
        }
        if self.disconnect_queue_bytes < 64 * 1024 {
            errors.push(invalid(
                "rpc.disconnect_queue_bytes",
                "must be at least 65536 (it must hold the largest Disconnect call)",
            ));
        }
        if let Some(app) = &self.app {
            if !apps.iter().any(|a| &a.id == app) {
                errors.push(invalid(
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
            errors.push(invalid(
                "rpc.jwt_param",
                "must be a name of letters, digits, '-' and '_'",
            ));
        }
        if self.history_rate == 0 {
            errors.push(invalid("rpc.history_rate", "must be positive"));
        }
        if self.history_answers_max_bytes == 0 {
            errors.push(invalid("rpc.history_answers_max_bytes", "must be positive"));
        }
        for (key, v) in [
            ("rpc.presence_max_members", self.presence_max_members),
            ("rpc.presence_max_records", self.presence_max_records),
            ("rpc.presence_max_joins", self.presence_max_joins),
            ("rpc.whisper_rate", self.whisper_rate as usize),
            ("rpc.presence_rate", self.presence_rate as usize),
        ] {
            if v == 0 {
                errors.push(invalid(key, "must be positive"));
            }
        }
        if self.presence_max_info < 16 {
            errors.push(invalid(
                "rpc.presence_max_info",
                "must be at least 16 (bytes of a member's id and info)",
            ));
        }
        if self.jwt_force && self.jwt_secret.is_none() {
            errors.push(invalid("rpc.jwt_force", "needs rpc.jwt_secret"));
        }
        if let Some(p) = &self.path {
            if !p.starts_with('/') || p.len() < 2 || p.chars().any(|c| c.is_whitespace()) {
                errors.push(invalid(
                    "rpc.path",
                    "must be a path such as /ws (a '/' and a name)",
                ));
            }
        }
        let p = &self.sse_path;
        if !p.starts_with('/') || p.len() < 2 || p.chars().any(|c| c.is_whitespace()) {
            errors.push(invalid(
                "rpc.sse_path",
                "must be a path such as /events (a '/' and a name)",
            ));
        } else if self.sse
            && (self.path.as_deref().unwrap_or(crate::DEFAULT_PATH) == p || p == "/_broadcast")
        {
            errors.push(invalid(
                "rpc.sse_path",
                format!("{p:?} is already served (rpc.path or /_broadcast)"),
            ));
        }
        for a in self.broadcast_adapter.split(',').map(str::trim) {
            if !["http", "redis", "redisx", "nats"].contains(&a) {
                errors.push(invalid(
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
            errors.push(invalid(
                "rpc.broadcast_channel",
                "must be 1 to 256 characters without spaces",
            ));
        }
        if self.tls_root_ca.is_some() && !self.tls {
            errors.push(invalid("rpc.tls_root_ca", "needs rpc.tls = true"));
        }
        for (key, v) in [
            ("rpc.secret", &self.secret),
            ("rpc.broadcast_key", &self.broadcast_key),
            ("rpc.streams_secret", &self.streams_secret),
            ("rpc.turbo_streams_secret", &self.turbo_streams_secret),
            ("rpc.cable_ready_secret", &self.cable_ready_secret),
            ("rpc.jwt_secret", &self.jwt_secret),
        ] {
            if v.as_deref() == Some("") {
                errors.push(invalid(key, "must not be empty when set"));
            }
        }
        ConfigError::all(errors)
    }
}

/// `HERALD_RPC_HEADERS` / `--rpc-headers`: comma-separated, lowercased.
fn header_list(v: &str) -> Result<toml::Value, String> {
    Ok(toml::Value::Array(
        v.split(',')
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty())
            .map(toml::Value::String)
            .collect(),
    ))
}

/// The environment variables and flags of `herald serve` for `[rpc]`.
pub static SETTINGS: &[Setting] = &[
    Setting {
        key: "rpc.host",
        flag: "rpc-host",
        env: "HERALD_RPC_HOST",
        help: "The app's RPC server for /cable: http(s)://... = HTTP RPC, host:port \
               or grpc://host:port = gRPC (AnyCable's convention)",
        secret: false,
        parse: text,
    },
    Setting {
        key: "rpc.secret",
        flag: "rpc-secret",
        env: "HERALD_RPC_SECRET",
        help: "Bearer token sent to an HTTP RPC server",
        secret: true,
        parse: text,
    },
    Setting {
        key: "rpc.headers",
        flag: "rpc-headers",
        env: "HERALD_RPC_HEADERS",
        help: "Request headers forwarded to the RPC Connect call, comma-separated \
               (default cookie)",
        secret: false,
        parse: header_list,
    },
    Setting {
        key: "rpc.sse",
        flag: "sse",
        env: "HERALD_SSE",
        help: "Serve Server-Sent Events at rpc.sse_path: EventSource clients of \
               streams and channels (AnyCable's --sse; default false)",
        secret: false,
        parse: flag,
    },
    Setting {
        key: "rpc.sse_path",
        flag: "sse-path",
        env: "HERALD_SSE_PATH",
        help: "The path of Server-Sent Events (AnyCable's --sse_path; default /events)",
        secret: false,
        parse: text,
    },
    Setting {
        key: "rpc.broadcast_key",
        flag: "broadcast-key",
        env: "HERALD_BROADCAST_KEY",
        help: "Bearer token required by POST /_broadcast (default: none)",
        secret: true,
        parse: text,
    },
    Setting {
        key: "rpc.broadcast_adapter",
        flag: "broadcast-adapter",
        env: "HERALD_BROADCAST_ADAPTER",
        help: "Broadcasts from the app also through the broker's server: redis \
               or nats (AnyCable's --broadcast_adapter; default http, i.e. only \
               POST /_broadcast)",
        secret: false,
        parse: text,
    },
    Setting {
        key: "rpc.turbo_streams",
        flag: "turbo-streams",
        env: "HERALD_TURBO_STREAMS",
        help: "Verify Turbo Streams subscriptions (Turbo::StreamsChannel) here, \
               without RPC (AnyCable's --turbo_streams)",
        secret: false,
        parse: flag,
    },
    Setting {
        key: "rpc.turbo_streams_secret",
        flag: "turbo-streams-secret",
        env: "HERALD_TURBO_STREAMS_SECRET",
        help: "Key of Turbo's signed stream names, Rails' \
               config.turbo.signed_stream_verifier_key (default: rpc.streams_secret)",
        secret: true,
        parse: text,
    },
    Setting {
        key: "rpc.cable_ready_streams",
        flag: "cable-ready-streams",
        env: "HERALD_CABLE_READY_STREAMS",
        help: "Verify CableReady stream subscriptions (CableReady::Stream) here, \
               without RPC (AnyCable's --cable_ready_streams)",
        secret: false,
        parse: flag,
    },
    Setting {
        key: "rpc.cable_ready_secret",
        flag: "cable-ready-secret",
        env: "HERALD_CABLE_READY_SECRET",
        help: "Key of CableReady's signed identifiers, its verifier_key \
               (default: rpc.streams_secret)",
        secret: true,
        parse: text,
    },
    Setting {
        key: "rpc.presence_ttl",
        flag: "presence-ttl",
        env: "HERALD_PRESENCE_TTL",
        help: "Seconds a presence member whose connection closed without leaving \
               stays present (AnyCable's --presence_ttl; default 15)",
        secret: false,
        parse: whole,
    },
    Setting {
        key: "rpc.history_limit",
        flag: "history-limit",
        env: "HERALD_HISTORY_LIMIT",
        help: "Most messages kept per reliable stream for actioncable-v1-ext-json \
               clients (AnyCable's --history_limit, default 100; 0: no history)",
        secret: false,
        parse: whole,
    },
    Setting {
        key: "rpc.history_ttl",
        flag: "history-ttl",
        env: "HERALD_HISTORY_TTL",
        help: "Seconds a message stays in its stream's history (default 300; 0: no history)",
        secret: false,
        parse: whole,
    },
    Setting {
        key: "rpc.sessions_ttl",
        flag: "sessions-ttl",
        env: "HERALD_SESSIONS_TTL",
        help: "Seconds an actioncable-v1-ext-json session can be restored without \
               Connect (default 300; 0: no resumption)",
        secret: false,
        parse: whole,
    },
];

/// A true/false setting.
fn flag(v: &str) -> Result<toml::Value, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(toml::Value::Boolean(true)),
        "false" | "0" | "no" | "off" | "" => Ok(toml::Value::Boolean(false)),
        _ => Err(format!("{v:?} is not a boolean (true or false)")),
    }
}

/// A whole number setting (its range is checked with the section).
fn whole(v: &str) -> Result<toml::Value, String> {
    let n: i64 = v
        .trim()
        .parse()
        .map_err(|_| format!("{v:?} is not a whole number"))?;
    if n < 0 {
        return Err(format!("{v:?} is negative"));
    }
    Ok(toml::Value::Integer(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(toml: &str) -> Result<RpcConfig, ConfigError> {
        let mut c = Config::from_toml(toml, "x").unwrap();
        c.apply(&Default::default()).unwrap();
        load(&c)
    }

    #[test]
    fn broadcast_adapters_are_checked() {
        let c = parsed("[rpc]\nbroadcast_adapter = 'http, redis'").unwrap();
        assert_eq!(c.broadcast_channel, "__anycable__");
        for bad in [
            "broadcast_adapter = 'kafka'",
            "broadcast_adapter = ''",
            "broadcast_channel = ''",
            "broadcast_channel = 'a b'",
        ] {
            let err = parsed(&format!("[rpc]\n{bad}")).unwrap_err().to_string();
            assert!(err.contains("rpc.broadcast_"), "{bad}: {err}");
        }
        let err = parsed("[rpc]\ntls_root_ca = 'ca.pem'")
            .unwrap_err()
            .to_string();
        assert!(err.contains("rpc.tls_root_ca"), "{err}");
        parsed("[rpc]\ntls = true\ntls_root_ca = 'ca.pem'").unwrap();
    }

    #[test]
    fn wrong_types_and_unknown_keys_are_named() {
        let err = parsed("[rpc]\ntimeout_ms = 'x'").unwrap_err().to_string();
        assert!(err.contains("`rpc.timeout_ms`"), "{err}");
        let err = parsed("[rpc]\nhots = 'x'").unwrap_err().to_string();
        assert!(err.contains("`rpc.hots` unknown field"), "{err}");
    }

    #[test]
    fn presence_limits_are_checked() {
        let c = parsed("[rpc]").unwrap();
        assert_eq!((c.presence_ttl, c.presence_max_records), (15, 100));
        for bad in [
            "presence_max_members = 0",
            "presence_max_records = 0",
            "presence_max_joins = 0",
            "whisper_rate = 0",
            "presence_rate = 0",
            "presence_max_info = 8",
        ] {
            let err = parsed(&format!("[rpc]\n{bad}")).unwrap_err().to_string();
            let key = bad.split(' ').next().unwrap();
            assert!(err.contains(&format!("rpc.{key}")), "{bad}: {err}");
        }
        assert_eq!(whole("20").unwrap(), toml::Value::Integer(20));
        assert!(whole("-1").is_err());
    }

    #[test]
    fn headers_from_the_environment_are_lowercased() {
        assert_eq!(
            header_list("Cookie, X-Api,").unwrap(),
            toml::Value::Array(vec!["cookie".into(), "x-api".into()])
        );
    }
}
