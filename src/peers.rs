//! Peer settings: the environment that the servers Herald replaces read
//! (Laravel Reverb's `REVERB_*` with Laravel's `REDIS_*`, soketi's
//! `SOKETI_*`, AnyCable's `ANYCABLE_*`, a Laravel app's `PUSHER_APP_*`),
//! read as they are and mapped onto Herald's settings.
//!
//! One table, [`VARS`], says for every variable Herald knows what it does:
//! sets a Herald setting, is one part of a composite one (a broker URL built
//! from host, port and password), describes the client side only, or names a
//! feature Herald does not have. Composite settings are built by the few
//! rules in [`RULES`]. Any other variable with a peer's prefix is reported as
//! unknown: nothing a peer reads is ignored without a word.
//!
//! The peer layer sits between the config file and Herald's own environment
//! and flags: Herald's own names win wherever both are set (the file's keys
//! included), and each such conflict is reported with the winner. Values are
//! checked when applied; a malformed one is an error naming the variable.
//!
//! Longer than most modules (about 1000 lines) on purpose: the table of
//! some 200 variables and the settings they reach are one concept, and
//! splitting them would scatter what docs/configuration.md lists in one
//! place.

use herald_core::config::{AppConfig, Config};
use herald_pusher::config::WebhookConfig;
use std::collections::{BTreeMap, BTreeSet};

/// A server whose settings Herald reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    Reverb,
    /// Laravel's own settings that Reverb uses (its Redis connection).
    Laravel,
    Soketi,
    AnyCable,
    /// A Laravel app's Pusher credentials (`config/broadcasting.php`).
    Pusher,
    /// sockudo's default app (only the variables listed here: its
    /// prefix is not reported as unknown).
    Sockudo,
}

impl Peer {
    pub fn name(self) -> &'static str {
        match self {
            Peer::Reverb => "Laravel Reverb",
            Peer::Laravel => "Laravel",
            Peer::Soketi => "soketi",
            Peer::AnyCable => "AnyCable",
            Peer::Pusher => "Laravel (Pusher)",
            Peer::Sockudo => "sockudo",
        }
    }
}

/// Parses a variable's value into the configuration.
type Apply = fn(&mut Config, &str) -> Result<(), String>;

/// A Herald setting a peer variable can set.
#[derive(Clone, Copy)]
pub struct Target {
    /// The setting's name as `herald config` shows it.
    pub key: &'static str,
    /// Shown masked.
    pub secret: bool,
    apply: Apply,
}

/// What a known variable does.
#[derive(Clone, Copy)]
pub enum Does {
    /// Sets this Herald setting.
    Set(Target),
    /// Read by a rule of [`RULES`] with other variables.
    Part,
    /// Known, and nothing for the server to do (with why).
    Nothing(&'static str),
    /// A feature Herald does not have (with what to do instead).
    Unsupported(&'static str),
}

pub struct Var {
    pub name: &'static str,
    pub peer: Peer,
    pub does: Does,
}

/// One setting given by peer variables.
#[derive(Clone)]
pub struct Assignment {
    pub target: Target,
    pub value: String,
    /// The variables it came from.
    pub from: Vec<&'static str>,
    pub peer: Peer,
}

/// What the environment held for Herald's peers.
#[derive(Default)]
pub struct Reading {
    pub assignments: Vec<Assignment>,
    /// Known variables with nothing to do on the server: (name, why).
    pub no_effect: Vec<(&'static str, &'static str)>,
    /// Known variables naming features Herald lacks: (name, what instead).
    pub unsupported: Vec<(&'static str, &'static str)>,
    /// Variables with a peer's prefix that no peer documents.
    pub unknown: Vec<String>,
    /// Conflicts and partial readings, one sentence each.
    pub notes: Vec<String>,
}

/// Prefixes of the variables that belong to a peer: any unknown variable
/// with one of them is reported. (`PUSHER_` and `REDIS_` are not among them:
/// other tools use them too.)
const OWNED_PREFIXES: [&str; 3] = ["REVERB_", "SOKETI_", "ANYCABLE_"];

macro_rules! target {
    ($key:expr, $secret:expr, |$c:ident, $v:ident| $body:expr) => {
        Target {
            key: $key,
            secret: $secret,
            apply: |$c: &mut Config, $v: &str| $body,
        }
    };
}

fn parse<T: std::str::FromStr>(v: &str, what: &str) -> Result<T, String> {
    v.trim().parse().map_err(|_| format!("{v:?} is not {what}"))
}

/// Booleans as the peers write them (Laravel's `env()` and soketi's JSON
/// parse: true/false, 1/0; AnyCable also yes/no).
fn boolean(v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" | "(true)" => Ok(true),
        "false" | "0" | "no" | "off" | "(false)" | "" => Ok(false),
        _ => Err(format!("{v:?} is not a boolean (true or false)")),
    }
}

/// A peer's "-1 means no limit" count, as Herald's 0-means-unlimited.
fn limit(v: &str) -> Result<u32, String> {
    let n: i64 = parse(v, "a whole number (-1 for no limit)")?;
    match n {
        -1 | 0 => Ok(0),
        n if n > 0 && n <= u32::MAX as i64 => Ok(n as u32),
        _ => Err(format!("{v:?} is not a whole number (-1 for no limit)")),
    }
}

/// Set an adapter's key (see [`Config::set`]).
fn set(c: &mut Config, key: &str, value: toml::Value) -> Result<(), String> {
    c.set(key, value)
}

fn text(v: &str) -> toml::Value {
    toml::Value::String(v.to_owned())
}

/// A whole number as the config file holds it.
fn int(n: u64) -> Result<toml::Value, String> {
    i64::try_from(n)
        .map(toml::Value::Integer)
        .map_err(|_| format!("{n} is too large"))
}

/// The single app peer variables describe (the development app when the
/// file has none).
fn app(c: &mut Config) -> Result<&mut AppConfig, String> {
    if c.apps.is_empty() {
        c.apps.push(AppConfig::development());
    }
    match c.apps.as_mut_slice() {
        [one] => Ok(one),
        _ => Err(
            "describes one app, but the config file has several: configure them in the file".into(),
        ),
    }
}

const HOST: Target = target!("host", false, |c, v| {
    c.host = v.trim().to_string();
    Ok(())
});
const PORT: Target = target!("port", false, |c, v| {
    c.port = parse(v, "a port number (0-65535)")?;
    Ok(())
});
const APP_ID: Target = target!("apps[0].id", false, |c, v| {
    app(c)?.id = v.to_string();
    Ok(())
});
const APP_KEY: Target = target!("apps[0].key", false, |c, v| {
    app(c)?.key = v.to_string();
    Ok(())
});
const APP_SECRET: Target = target!("apps[0].secret", true, |c, v| {
    app(c)?.secret = v.to_string();
    Ok(())
});
const BROKER_URL: Target = target!("broker.url", true, |c, v| {
    c.broker.url = v.to_string();
    Ok(())
});
const BROKER_PREFIX: Target = target!("broker.prefix", false, |c, v| {
    c.broker.prefix = v.trim_end_matches([':', '#', '.']).to_string();
    Ok(())
});
const MAX_REQUEST_SIZE: Target = target!("max_request_size", false, |c, v| {
    c.max_request_size = parse(v, "a size in bytes")?;
    Ok(())
});
const ACTIVITY_TIMEOUT: Target = target!("activity_timeout", false, |c, v| {
    c.activity_timeout = parse(v, "a whole number of seconds")?;
    Ok(())
});
const PONG_TIMEOUT: Target = target!("pong_timeout", false, |c, v| {
    c.pong_timeout = parse(v, "a whole number of seconds")?;
    Ok(())
});
const MAX_FRAME_SIZE: Target = target!("apps[0].max_frame_size", false, |c, v| {
    app(c)?.max_frame_size = parse(v, "a size in bytes")?;
    Ok(())
});
const MAX_CONNECTIONS: Target = target!("apps[0].max_connections", false, |c, v| {
    app(c)?.max_connections = limit(v)?;
    Ok(())
});
const CLIENT_EVENTS: Target = target!("apps[0].client_events", false, |c, v| {
    app(c)?.client_events = boolean(v)?;
    Ok(())
});
const APP_ENABLED: Target = target!("apps[0].enabled", false, |c, v| {
    app(c)?.enabled = boolean(v)?;
    Ok(())
});
const CLIENT_EVENT_RATE: Target = target!("apps[0].client_event_rate", false, |c, v| {
    match limit(v)? {
        0 => Err("no limit (-1) is not offered: Herald limits client events per connection; give a number".into()),
        n => {
            app(c)?.client_event_rate = n;
            Ok(())
        }
    }
});
const ALLOWED_ORIGINS: Target = target!("apps[0].allowed_origins", false, |c, v| {
    // Comma-separated, as AnyCable and sockudo write them; checked with the
    // rest of the app at load.
    let list: Vec<String> = v
        .split(',')
        .map(|o| o.trim().to_owned())
        .filter(|o| !o.is_empty())
        .collect();
    if list.is_empty() {
        return Err("lists no origin (\"*\" for any)".into());
    }
    app(c)?.allowed_origins = list;
    Ok(())
});
const APPS_DB_URL: Target = target!("apps_database.url", true, |c, v| {
    c.apps_database.url = Some(v.to_string());
    Ok(())
});
const APPS_DB_TABLE: Target = target!("apps_database.table", false, |c, v| {
    c.apps_database.table = v.trim().to_string();
    Ok(())
});
const APPS_DB_REFRESH: Target = target!("apps_database.refresh", false, |c, v| {
    // soketi's -1 (cache forever) and 0 keep Herald's default: the table
    // is re-read whatever soketi's cache would do.
    let n: i64 = parse(v, "a whole number of seconds")?;
    if n > 0 {
        c.apps_database.refresh = n as u64;
    }
    Ok(())
});
const WEBHOOKS: Target = target!("apps[0].webhooks", true, |c, v| {
    let hooks: Vec<WebhookConfig> = serde_json::from_str(v).map_err(|e| {
        format!("is not a JSON list of {{\"url\", \"event_types\", \"headers\", \"filter\"}}: {e}")
    })?;
    let value = toml::Value::try_from(&hooks).map_err(|e| e.to_string())?;
    app(c)?.extra.insert("webhooks".into(), value);
    Ok(())
});
const WEBHOOK_BATCH_MS: Target = target!("webhook_batch_ms", false, |c, v| {
    let ms: u64 = parse(v, "a whole number of milliseconds")?;
    set(c, "webhook_batch_ms", int(ms)?)
});
const SHUTDOWN_GRACE: Target = target!("shutdown_grace", false, |c, v| {
    c.shutdown_grace = parse(v, "a whole number of seconds")?;
    Ok(())
});
const SHUTDOWN_GRACE_MS: Target = target!("shutdown_grace", false, |c, v| {
    let ms: u64 = parse(v, "a whole number of milliseconds")?;
    c.shutdown_grace = ms.div_ceil(1000);
    Ok(())
});
const TLS_CERT: Target = target!("tls_cert", false, |c, v| {
    c.tls_cert = Some(v.to_string());
    Ok(())
});
const TLS_KEY: Target = target!("tls_key", false, |c, v| {
    c.tls_key = Some(v.to_string());
    Ok(())
});
const METRICS_PORT: Target = target!("metrics_port", false, |c, v| {
    c.metrics_port = Some(parse(v, "a port number (0-65535)")?);
    Ok(())
});
const DEBUG_LOG: Target = target!("log", false, |c, v| {
    if boolean(v)? {
        c.log = "debug".into();
    }
    Ok(())
});
const LOG_LEVEL: Target = target!("log", false, |c, v| {
    c.log = match v.trim() {
        l @ ("debug" | "info" | "warn" | "error" | "trace") => l.to_string(),
        _ => {
            return Err(format!(
                "{v:?} is not a log level (debug, info, warn, error)"
            ))
        }
    };
    Ok(())
});
const MAX_PAYLOAD_KB: Target = target!("apps[0].max_payload", false, |c, v| {
    app(c)?.max_payload = parse::<usize>(v, "a whole number of kilobytes")? * 1024;
    Ok(())
});
const MAX_EVENT_NAME: Target = target!("apps[0].max_event_name", false, |c, v| {
    app(c)?.max_event_name = parse(v, "a length")?;
    Ok(())
});
const MAX_CHANNEL_NAME: Target = target!("apps[0].max_channel_name", false, |c, v| {
    app(c)?.max_channel_name = parse(v, "a length")?;
    Ok(())
});
const MAX_PRESENCE_MEMBERS: Target = target!("apps[0].max_presence_members", false, |c, v| {
    app(c)?.max_presence_members = parse(v, "a count")?;
    Ok(())
});
const MAX_MEMBER_KB: Target = target!("apps[0].max_presence_user_info", false, |c, v| {
    app(c)?.max_presence_user_info = parse::<usize>(v, "a whole number of kilobytes")? * 1024;
    Ok(())
});
const CACHE_TTL: Target = target!("apps[0].cache_ttl", false, |c, v| {
    app(c)?.cache_ttl = parse(v, "a whole number of seconds")?;
    Ok(())
});
const RPC_HOST: Target = target!("rpc.host", false, |c, v| {
    set(c, "rpc.host", text(v.trim()))
});
const RPC_SECRET: Target = target!("rpc.secret", true, |c, v| { set(c, "rpc.secret", text(v)) });
const STREAMS_SECRET: Target = target!("rpc.streams_secret", true, |c, v| {
    set(c, "rpc.streams_secret", text(v))
});
const TURBO_STREAMS: Target = target!("rpc.turbo_streams", false, |c, v| {
    set(c, "rpc.turbo_streams", toml::Value::Boolean(boolean(v)?))
});
const TURBO_STREAMS_SECRET: Target = target!("rpc.turbo_streams_secret", true, |c, v| {
    set(c, "rpc.turbo_streams_secret", text(v))
});
/// AnyCable's older name of the Turbo secret, which also turned the
/// feature on.
const TURBO_RAILS_KEY: Target = target!("rpc.turbo_streams_secret", true, |c, v| {
    set(c, "rpc.turbo_streams", toml::Value::Boolean(true))?;
    set(c, "rpc.turbo_streams_secret", text(v))
});
const CABLE_READY_STREAMS: Target = target!("rpc.cable_ready_streams", false, |c, v| {
    set(
        c,
        "rpc.cable_ready_streams",
        toml::Value::Boolean(boolean(v)?),
    )
});
const CABLE_READY_SECRET: Target = target!("rpc.cable_ready_secret", true, |c, v| {
    set(c, "rpc.cable_ready_secret", text(v))
});
/// AnyCable's older name of the CableReady secret, which also turned the
/// feature on.
const CABLE_READY_KEY: Target = target!("rpc.cable_ready_secret", true, |c, v| {
    set(c, "rpc.cable_ready_streams", toml::Value::Boolean(true))?;
    set(c, "rpc.cable_ready_secret", text(v))
});
const JWT_SECRET: Target = target!("rpc.jwt_secret", true, |c, v| {
    set(c, "rpc.jwt_secret", text(v))
});
const JWT_PARAM: Target = target!("rpc.jwt_param", false, |c, v| {
    set(c, "rpc.jwt_param", text(v.trim()))
});
const JWT_FORCE: Target = target!("rpc.jwt_force", false, |c, v| {
    set(c, "rpc.jwt_force", toml::Value::Boolean(boolean(v)?))
});
const BROADCAST_ADAPTER: Target = target!("rpc.broadcast_adapter", false, |c, v| {
    set(c, "rpc.broadcast_adapter", text(v.trim()))
});
const BROADCAST_CHANNEL: Target = target!("rpc.broadcast_channel", false, |c, v| {
    set(c, "rpc.broadcast_channel", text(v.trim()))
});
const BROADCAST_KEY: Target = target!("rpc.broadcast_key", true, |c, v| {
    set(c, "rpc.broadcast_key", text(v))
});
const RPC_HEADERS: Target = target!("rpc.headers", false, |c, v| {
    let headers = v
        .split(',')
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .map(toml::Value::String)
        .collect();
    set(c, "rpc.headers", toml::Value::Array(headers))
});
const RPC_PATH: Target = target!("rpc.path", false, |c, v| {
    if v.contains(',') || v.contains('*') || v.contains('{') {
        return Err(format!(
            "{v:?}: Herald serves one fixed path (no lists, wildcards or placeholders)"
        ));
    }
    set(c, "rpc.path", text(v.trim()))
});
const RPC_CONCURRENCY: Target = target!("rpc.concurrency", false, |c, v| {
    let n: u64 = parse(v, "a count")?;
    set(c, "rpc.concurrency", int(n)?)
});
const RPC_TIMEOUT_MS: Target = target!("rpc.timeout_ms", false, |c, v| {
    let n: u64 = parse(v, "a whole number of milliseconds")?;
    set(c, "rpc.timeout_ms", int(n)?)
});
const DISCONNECT_RATE: Target = target!("rpc.disconnect_rate", false, |c, v| {
    let n: u32 = parse(v, "a rate per second")?;
    set(c, "rpc.disconnect_rate", int(n.into())?)
});
const HISTORY_LIMIT: Target = target!("rpc.history_limit", false, |c, v| {
    let n: u64 = parse(v, "a count")?;
    set(c, "rpc.history_limit", int(n)?)
});
const HISTORY_TTL: Target = target!("rpc.history_ttl", false, |c, v| {
    let n: u64 = parse(v, "a whole number of seconds")?;
    set(c, "rpc.history_ttl", int(n)?)
});
const SESSIONS_TTL: Target = target!("rpc.sessions_ttl", false, |c, v| {
    let n: u64 = parse(v, "a whole number of seconds")?;
    set(c, "rpc.sessions_ttl", int(n)?)
});
const PRESENCE_TTL: Target = target!("rpc.presence_ttl", false, |c, v| {
    let n: u64 = parse(v, "a whole number of seconds")?;
    set(c, "rpc.presence_ttl", int(n)?)
});
const STREAMS_PRESENCE: Target = target!("rpc.streams_presence", false, |c, v| {
    set(c, "rpc.streams_presence", toml::Value::Boolean(boolean(v)?))
});
const STREAMS_WHISPER: Target = target!("rpc.streams_whisper", false, |c, v| {
    set(c, "rpc.streams_whisper", toml::Value::Boolean(boolean(v)?))
});
const PUBLIC_STREAMS: Target = target!("rpc.public_streams", false, |c, v| {
    set(c, "rpc.public_streams", toml::Value::Boolean(boolean(v)?))
});
const SSE: Target = target!("rpc.sse", false, |c, v| {
    set(c, "rpc.sse", toml::Value::Boolean(boolean(v)?))
});
const SSE_PATH: Target = target!("rpc.sse_path", false, |c, v| {
    set(c, "rpc.sse_path", text(v.trim()))
});
const RPC_TLS: Target = target!("rpc.tls", false, |c, v| {
    set(c, "rpc.tls", toml::Value::Boolean(boolean(v)?))
});
const RPC_TLS_ROOT_CA: Target = target!("rpc.tls_root_ca", false, |c, v| {
    set(c, "rpc.tls_root_ca", text(v))
});

use Does::{Nothing, Part, Set, Unsupported};
use Peer::{AnyCable, Laravel, Pusher, Reverb, Sockudo, Soketi};

const CLIENT: &str = "where clients and the app connect, not where the server listens";
const NO_PULSE: &str = "Laravel Pulse/Telescope ingestion: watch Herald's /metrics instead";
const APP_MANAGER: &str = "apps come from the config file, PostgreSQL or MySQL/MariaDB (SOKETI_APP_MANAGER_DRIVER=postgres|mysql); DynamoDB is not supported";
const QUEUE: &str =
    "webhooks are sent by each node from memory (docs/webhooks-and-monitoring.md), no queue";
const LIMITER: &str = "rate limits are per connection and in memory";
const SOKETI_CLUSTER: &str = "UDP discovery is not offered: use a redis or nats adapter";
const REDIS_OPTS: &str =
    "Herald takes one Redis URL (SOKETI_DB_REDIS_*), no ioredis options, Sentinel or Cluster";
const METRICS: &str = "Herald always serves Prometheus /metrics with its own names";
const NO_EQUIV: &str = "no equivalent in Herald";

/// Every peer variable Herald knows: what its peer's docs name it and
/// what Herald does with it. Sources: Reverb's `config/reverb.php` (and
/// Laravel's `config/database.php` for `REDIS_*`), soketi's CLI variable
/// list and docs ("Environment variables"), AnyCable's server and Ruby
/// configuration docs.
#[rustfmt::skip]
pub static VARS: &[Var] = &[
    // Laravel Reverb (config/reverb.php).
    Var { name: "REVERB_APP_ID", peer: Reverb, does: Set(APP_ID) },
    Var { name: "REVERB_APP_KEY", peer: Reverb, does: Set(APP_KEY) },
    Var { name: "REVERB_APP_SECRET", peer: Reverb, does: Set(APP_SECRET) },
    Var { name: "REVERB_SERVER_HOST", peer: Reverb, does: Set(HOST) },
    Var { name: "REVERB_SERVER_PORT", peer: Reverb, does: Set(PORT) },
    Var { name: "REVERB_SCALING_ENABLED", peer: Reverb, does: Part },
    Var { name: "REVERB_SCALING_CHANNEL", peer: Reverb, does: Set(BROKER_PREFIX) },
    Var { name: "REVERB_MAX_REQUEST_SIZE", peer: Reverb, does: Set(MAX_REQUEST_SIZE) },
    Var { name: "REVERB_APP_PING_INTERVAL", peer: Reverb, does: Set(ACTIVITY_TIMEOUT) },
    Var { name: "REVERB_APP_ACTIVITY_TIMEOUT", peer: Reverb, does: Set(PONG_TIMEOUT) },
    Var { name: "REVERB_APP_MAX_MESSAGE_SIZE", peer: Reverb, does: Set(MAX_FRAME_SIZE) },
    Var { name: "REVERB_APP_MAX_CONNECTIONS", peer: Reverb, does: Set(MAX_CONNECTIONS) },
    Var { name: "REVERB_HOST", peer: Reverb, does: Nothing(CLIENT) },
    Var { name: "REVERB_PORT", peer: Reverb, does: Nothing(CLIENT) },
    Var { name: "REVERB_SCHEME", peer: Reverb, does: Nothing(CLIENT) },
    Var { name: "REVERB_SERVER", peer: Reverb, does: Nothing("Reverb's server name; Herald is the server") },
    Var { name: "REVERB_SERVER_PATH", peer: Reverb, does: Unsupported("Herald serves the Pusher paths at the root (/app, /apps); put a prefix in the proxy") },
    Var { name: "REVERB_PULSE_INGEST_INTERVAL", peer: Reverb, does: Unsupported(NO_PULSE) },
    Var { name: "REVERB_TELESCOPE_INGEST_INTERVAL", peer: Reverb, does: Unsupported(NO_PULSE) },
    // Laravel's default Redis connection (config/database.php), which
    // Reverb's scaling uses; read only with REVERB_SCALING_ENABLED.
    Var { name: "REDIS_URL", peer: Laravel, does: Part },
    Var { name: "REDIS_HOST", peer: Laravel, does: Part },
    Var { name: "REDIS_PORT", peer: Laravel, does: Part },
    Var { name: "REDIS_USERNAME", peer: Laravel, does: Part },
    Var { name: "REDIS_PASSWORD", peer: Laravel, does: Part },
    Var { name: "REDIS_DB", peer: Laravel, does: Part },
    // A Laravel app's Pusher credentials (config/broadcasting.php).
    Var { name: "PUSHER_APP_ID", peer: Pusher, does: Set(APP_ID) },
    Var { name: "PUSHER_APP_KEY", peer: Pusher, does: Set(APP_KEY) },
    Var { name: "PUSHER_APP_SECRET", peer: Pusher, does: Set(APP_SECRET) },
    Var { name: "PUSHER_HOST", peer: Pusher, does: Nothing(CLIENT) },
    Var { name: "PUSHER_PORT", peer: Pusher, does: Nothing(CLIENT) },
    Var { name: "PUSHER_SCHEME", peer: Pusher, does: Nothing(CLIENT) },
    Var { name: "PUSHER_APP_CLUSTER", peer: Pusher, does: Nothing(CLIENT) },
    // soketi (its CLI's variable list; every name with SOKETI_ before it).
    Var { name: "SOKETI_DEFAULT_APP_ID", peer: Soketi, does: Set(APP_ID) },
    Var { name: "SOKETI_DEFAULT_APP_KEY", peer: Soketi, does: Set(APP_KEY) },
    Var { name: "SOKETI_DEFAULT_APP_SECRET", peer: Soketi, does: Set(APP_SECRET) },
    Var { name: "SOKETI_DEFAULT_APP_MAX_CONNS", peer: Soketi, does: Set(MAX_CONNECTIONS) },
    Var { name: "SOKETI_DEFAULT_APP_ENABLE_CLIENT_MESSAGES", peer: Soketi, does: Set(CLIENT_EVENTS) },
    Var { name: "SOKETI_DEFAULT_APP_ENABLED", peer: Soketi, does: Set(APP_ENABLED) },
    Var { name: "SOKETI_DEFAULT_APP_MAX_CLIENT_EVENTS_PER_SEC", peer: Soketi, does: Set(CLIENT_EVENT_RATE) },
    Var { name: "SOKETI_DEFAULT_APP_WEBHOOKS", peer: Soketi, does: Set(WEBHOOKS) },
    Var { name: "SOKETI_DEFAULT_APP_MAX_BACKEND_EVENTS_PER_SEC", peer: Soketi, does: Unsupported("the HTTP API is not rate-limited per app") },
    Var { name: "SOKETI_DEFAULT_APP_MAX_READ_REQ_PER_SEC", peer: Soketi, does: Unsupported("the HTTP API is not rate-limited per app") },
    Var { name: "SOKETI_DEFAULT_APP_USER_AUTHENTICATION", peer: Soketi, does: Unsupported("user sign-in (pusher:signin) is always available") },
    Var { name: "SOKETI_HOST", peer: Soketi, does: Set(HOST) },
    Var { name: "SOKETI_PORT", peer: Soketi, does: Set(PORT) },
    Var { name: "SOKETI_DEBUG", peer: Soketi, does: Set(DEBUG_LOG) },
    Var { name: "SOKETI_MODE", peer: Soketi, does: Unsupported("every Herald node serves clients and sends webhooks (soketi's `full`)") },
    Var { name: "SOKETI_PATH_PREFIX", peer: Soketi, does: Unsupported("Herald serves the Pusher paths at the root; put a prefix in the proxy") },
    Var { name: "SOKETI_SHUTDOWN_GRACE_PERIOD", peer: Soketi, does: Set(SHUTDOWN_GRACE_MS) },
    Var { name: "SOKETI_SSL_CERT", peer: Soketi, does: Set(TLS_CERT) },
    Var { name: "SOKETI_SSL_KEY", peer: Soketi, does: Set(TLS_KEY) },
    Var { name: "SOKETI_SSL_PASS", peer: Soketi, does: Unsupported("encrypted private keys are not read: decrypt the key file") },
    Var { name: "SOKETI_SSL_CA", peer: Soketi, does: Unsupported("put the chain in the certificate file (tls_cert)") },
    Var { name: "SOKETI_ADAPTER_DRIVER", peer: Soketi, does: Part },
    Var { name: "SOKETI_ADAPTER_REDIS_PREFIX", peer: Soketi, does: Set(BROKER_PREFIX) },
    Var { name: "SOKETI_ADAPTER_NATS_PREFIX", peer: Soketi, does: Set(BROKER_PREFIX) },
    Var { name: "SOKETI_ADAPTER_NATS_SERVERS", peer: Soketi, does: Part },
    Var { name: "SOKETI_ADAPTER_NATS_USER", peer: Soketi, does: Part },
    Var { name: "SOKETI_ADAPTER_NATS_PASSWORD", peer: Soketi, does: Part },
    Var { name: "SOKETI_ADAPTER_NATS_TOKEN", peer: Soketi, does: Part },
    Var { name: "SOKETI_DB_REDIS_HOST", peer: Soketi, does: Part },
    Var { name: "SOKETI_DB_REDIS_PORT", peer: Soketi, does: Part },
    Var { name: "SOKETI_DB_REDIS_DB", peer: Soketi, does: Part },
    Var { name: "SOKETI_DB_REDIS_USERNAME", peer: Soketi, does: Part },
    Var { name: "SOKETI_DB_REDIS_PASSWORD", peer: Soketi, does: Part },
    Var { name: "SOKETI_WEBHOOKS_BATCHING", peer: Soketi, does: Part },
    Var { name: "SOKETI_WEBHOOKS_BATCHING_DURATION", peer: Soketi, does: Part },
    Var { name: "SOKETI_EVENT_MAX_SIZE_IN_KB", peer: Soketi, does: Set(MAX_PAYLOAD_KB) },
    Var { name: "SOKETI_EVENT_MAX_NAME_LENGTH", peer: Soketi, does: Set(MAX_EVENT_NAME) },
    Var { name: "SOKETI_CHANNEL_LIMITS_MAX_NAME_LENGTH", peer: Soketi, does: Set(MAX_CHANNEL_NAME) },
    Var { name: "SOKETI_CHANNEL_CACHE_TTL", peer: Soketi, does: Set(CACHE_TTL) },
    Var { name: "SOKETI_PRESENCE_MAX_MEMBERS", peer: Soketi, does: Set(MAX_PRESENCE_MEMBERS) },
    Var { name: "SOKETI_PRESENCE_MAX_MEMBER_SIZE", peer: Soketi, does: Set(MAX_MEMBER_KB) },
    Var { name: "SOKETI_METRICS_SERVER_PORT", peer: Soketi, does: Set(METRICS_PORT) },
    Var { name: "SOKETI_METRICS_ENABLED", peer: Soketi, does: Nothing(METRICS) },
    Var { name: "SOKETI_METRICS_DRIVER", peer: Soketi, does: Nothing(METRICS) },
    Var { name: "SOKETI_METRICS_HOST", peer: Soketi, does: Unsupported("metrics listen on Herald's host (metrics_port)") },
    Var { name: "SOKETI_METRICS_PROMETHEUS_PREFIX", peer: Soketi, does: Unsupported(METRICS) },
    Var { name: "SOKETI_EVENT_MAX_BATCH_SIZE", peer: Soketi, does: Unsupported("the batch size of the HTTP API is Pusher's (10)") },
    Var { name: "SOKETI_EVENT_MAX_CHANNELS_AT_ONCE", peer: Soketi, does: Unsupported("the channels per event are Pusher's (100)") },
    Var { name: "SOKETI_USER_AUTHENTICATION_TIMEOUT", peer: Soketi, does: Unsupported(NO_EQUIV) },
    Var { name: "SOKETI_HTTP_ACCEPT_TRAFFIC_MEMORY_THRESHOLD", peer: Soketi, does: Unsupported("use the connection limits (docs/operating.md)") },
    Var { name: "SOKETI_ADAPTER_CLUSTER_REQUESTS_TIMEOUT", peer: Soketi, does: Unsupported(SOKETI_CLUSTER) },
    Var { name: "SOKETI_ADAPTER_REDIS_CLUSTER_MODE", peer: Soketi, does: Unsupported(REDIS_OPTS) },
    Var { name: "SOKETI_ADAPTER_REDIS_REQUESTS_TIMEOUT", peer: Soketi, does: Unsupported(NO_EQUIV) },
    Var { name: "SOKETI_ADAPTER_REDIS_SUB_OPTIONS", peer: Soketi, does: Unsupported(REDIS_OPTS) },
    Var { name: "SOKETI_ADAPTER_REDIS_PUB_OPTIONS", peer: Soketi, does: Unsupported(REDIS_OPTS) },
    Var { name: "SOKETI_ADAPTER_NATS_TIMEOUT", peer: Soketi, does: Unsupported(NO_EQUIV) },
    Var { name: "SOKETI_ADAPTER_NATS_REQUESTS_TIMEOUT", peer: Soketi, does: Unsupported(NO_EQUIV) },
    Var { name: "SOKETI_ADAPTER_NATS_NODES_NUMBER", peer: Soketi, does: Unsupported("nodes find each other through the broker") },
    Var { name: "SOKETI_DB_REDIS_KEY_PREFIX", peer: Soketi, does: Unsupported("use SOKETI_ADAPTER_REDIS_PREFIX (broker.prefix)") },
    Var { name: "SOKETI_DB_REDIS_SENTINELS", peer: Soketi, does: Unsupported(REDIS_OPTS) },
    Var { name: "SOKETI_DB_REDIS_SENTINEL_PASSWORD", peer: Soketi, does: Unsupported(REDIS_OPTS) },
    Var { name: "SOKETI_DB_REDIS_CLUSTER_NODES", peer: Soketi, does: Unsupported(REDIS_OPTS) },
    Var { name: "SOKETI_DB_REDIS_INSTANCE_NAME", peer: Soketi, does: Unsupported(REDIS_OPTS) },
    Var { name: "SOKETI_APP_MANAGER_DRIVER", peer: Soketi, does: Part },
    Var { name: "SOKETI_APP_MANAGER_CACHE_ENABLED", peer: Soketi, does: Nothing("the table's apps are always kept in memory and re-read every apps_database.refresh seconds") },
    Var { name: "SOKETI_APP_MANAGER_CACHE_TTL", peer: Soketi, does: Set(APPS_DB_REFRESH) },
    Var { name: "SOKETI_APP_MANAGER_DYNAMODB_TABLE", peer: Soketi, does: Unsupported(APP_MANAGER) },
    Var { name: "SOKETI_APP_MANAGER_DYNAMODB_REGION", peer: Soketi, does: Unsupported(APP_MANAGER) },
    Var { name: "SOKETI_APP_MANAGER_DYNAMODB_ENDPOINT", peer: Soketi, does: Unsupported(APP_MANAGER) },
    Var { name: "SOKETI_APP_MANAGER_MYSQL_TABLE", peer: Soketi, does: Set(APPS_DB_TABLE) },
    Var { name: "SOKETI_APP_MANAGER_MYSQL_VERSION", peer: Soketi, does: Nothing("the MySQL driver needs no version") },
    Var { name: "SOKETI_APP_MANAGER_MYSQL_USE_V2", peer: Soketi, does: Nothing("the MySQL driver needs no choice of client") },
    Var { name: "SOKETI_APP_MANAGER_POSTGRES_TABLE", peer: Soketi, does: Set(APPS_DB_TABLE) },
    Var { name: "SOKETI_APP_MANAGER_POSTGRES_VERSION", peer: Soketi, does: Nothing("the PostgreSQL driver needs no version") },
    Var { name: "SOKETI_DB_POOLING_ENABLED", peer: Soketi, does: Unsupported(APP_MANAGER) },
    Var { name: "SOKETI_DB_POOLING_MIN", peer: Soketi, does: Unsupported(APP_MANAGER) },
    Var { name: "SOKETI_DB_POOLING_MAX", peer: Soketi, does: Unsupported(APP_MANAGER) },
    Var { name: "SOKETI_DB_MYSQL_HOST", peer: Soketi, does: Part },
    Var { name: "SOKETI_DB_MYSQL_PORT", peer: Soketi, does: Part },
    Var { name: "SOKETI_DB_MYSQL_USERNAME", peer: Soketi, does: Part },
    Var { name: "SOKETI_DB_MYSQL_PASSWORD", peer: Soketi, does: Part },
    Var { name: "SOKETI_DB_MYSQL_DATABASE", peer: Soketi, does: Part },
    Var { name: "SOKETI_DB_POSTGRES_HOST", peer: Soketi, does: Part },
    Var { name: "SOKETI_DB_POSTGRES_PORT", peer: Soketi, does: Part },
    Var { name: "SOKETI_DB_POSTGRES_USERNAME", peer: Soketi, does: Part },
    Var { name: "SOKETI_DB_POSTGRES_PASSWORD", peer: Soketi, does: Part },
    Var { name: "SOKETI_DB_POSTGRES_DATABASE", peer: Soketi, does: Part },
    Var { name: "SOKETI_CACHE_DRIVER", peer: Soketi, does: Unsupported("cache channels keep their last event in the node (and the broker)") },
    Var { name: "SOKETI_CACHE_REDIS_CLUSTER_MODE", peer: Soketi, does: Unsupported(REDIS_OPTS) },
    Var { name: "SOKETI_CACHE_REDIS_OPTIONS", peer: Soketi, does: Unsupported(REDIS_OPTS) },
    Var { name: "SOKETI_QUEUE_DRIVER", peer: Soketi, does: Unsupported(QUEUE) },
    Var { name: "SOKETI_QUEUE_REDIS_CONCURRENCY", peer: Soketi, does: Unsupported(QUEUE) },
    Var { name: "SOKETI_QUEUE_REDIS_OPTIONS", peer: Soketi, does: Unsupported(QUEUE) },
    Var { name: "SOKETI_QUEUE_REDIS_CLUSTER_MODE", peer: Soketi, does: Unsupported(QUEUE) },
    Var { name: "SOKETI_QUEUE_SQS_REGION", peer: Soketi, does: Unsupported(QUEUE) },
    Var { name: "SOKETI_QUEUE_SQS_CLIENT_OPTIONS", peer: Soketi, does: Unsupported(QUEUE) },
    Var { name: "SOKETI_QUEUE_SQS_URL", peer: Soketi, does: Unsupported(QUEUE) },
    Var { name: "SOKETI_QUEUE_SQS_ENDPOINT", peer: Soketi, does: Unsupported(QUEUE) },
    Var { name: "SOKETI_QUEUE_SQS_PROCESS_BATCH", peer: Soketi, does: Unsupported(QUEUE) },
    Var { name: "SOKETI_QUEUE_SQS_BATCH_SIZE", peer: Soketi, does: Unsupported(QUEUE) },
    Var { name: "SOKETI_QUEUE_SQS_POLLING_WAIT_TIME_MS", peer: Soketi, does: Unsupported(QUEUE) },
    Var { name: "SOKETI_RATE_LIMITER_DRIVER", peer: Soketi, does: Unsupported(LIMITER) },
    Var { name: "SOKETI_RATE_LIMITER_REDIS_OPTIONS", peer: Soketi, does: Unsupported(LIMITER) },
    Var { name: "SOKETI_RATE_LIMITER_REDIS_CLUSTER_MODE", peer: Soketi, does: Unsupported(LIMITER) },
    Var { name: "SOKETI_CLUSTER_CHECK_INTERVAL", peer: Soketi, does: Unsupported(SOKETI_CLUSTER) },
    Var { name: "SOKETI_CLUSTER_HOST", peer: Soketi, does: Unsupported(SOKETI_CLUSTER) },
    Var { name: "SOKETI_CLUSTER_IGNORE_PROCESS", peer: Soketi, does: Unsupported(SOKETI_CLUSTER) },
    Var { name: "SOKETI_CLUSTER_BROADCAST_ADDRESS", peer: Soketi, does: Unsupported(SOKETI_CLUSTER) },
    Var { name: "SOKETI_CLUSTER_KEEPALIVE_INTERVAL", peer: Soketi, does: Unsupported(SOKETI_CLUSTER) },
    Var { name: "SOKETI_CLUSTER_MASTER_TIMEOUT", peer: Soketi, does: Unsupported(SOKETI_CLUSTER) },
    Var { name: "SOKETI_CLUSTER_MULTICAST_ADDRESS", peer: Soketi, does: Unsupported(SOKETI_CLUSTER) },
    Var { name: "SOKETI_CLUSTER_NODE_TIMEOUT", peer: Soketi, does: Unsupported(SOKETI_CLUSTER) },
    Var { name: "SOKETI_CLUSTER_PORT", peer: Soketi, does: Unsupported(SOKETI_CLUSTER) },
    Var { name: "SOKETI_CLUSTER_PREFIX", peer: Soketi, does: Unsupported(SOKETI_CLUSTER) },
    Var { name: "SOKETI_CLUSTER_UNICAST_ADDRESSES", peer: Soketi, does: Unsupported(SOKETI_CLUSTER) },
    // AnyCable (the server's and the Ruby library's configuration docs).
    Var { name: "ANYCABLE_HOST", peer: AnyCable, does: Set(HOST) },
    Var { name: "ANYCABLE_PORT", peer: AnyCable, does: Set(PORT) },
    Var { name: "ANYCABLE_PATH", peer: AnyCable, does: Set(RPC_PATH) },
    Var { name: "ANYCABLE_RPC_HOST", peer: AnyCable, does: Set(RPC_HOST) },
    Var { name: "ANYCABLE_HTTP_RPC_SECRET", peer: AnyCable, does: Set(RPC_SECRET) },
    Var { name: "ANYCABLE_HEADERS", peer: AnyCable, does: Set(RPC_HEADERS) },
    Var { name: "ANYCABLE_RPC_CONCURRENCY", peer: AnyCable, does: Set(RPC_CONCURRENCY) },
    Var { name: "ANYCABLE_RPC_REQUEST_TIMEOUT", peer: AnyCable, does: Set(RPC_TIMEOUT_MS) },
    Var { name: "ANYCABLE_RPC_ENABLE_TLS", peer: AnyCable, does: Set(RPC_TLS) },
    Var { name: "ANYCABLE_RPC_TLS_ROOT_CA", peer: AnyCable, does: Set(RPC_TLS_ROOT_CA) },
    Var { name: "ANYCABLE_DISCONNECT_RATE", peer: AnyCable, does: Set(DISCONNECT_RATE) },
    Var { name: "ANYCABLE_PUBLIC_STREAMS", peer: AnyCable, does: Set(PUBLIC_STREAMS) },
    Var { name: "ANYCABLE_SSE", peer: AnyCable, does: Set(SSE) },
    Var { name: "ANYCABLE_SSE_PATH", peer: AnyCable, does: Set(SSE_PATH) },
    Var { name: "ANYCABLE_BROADCAST_ADAPTER", peer: AnyCable, does: Set(BROADCAST_ADAPTER) },
    Var { name: "ANYCABLE_BROADCAST_KEY", peer: AnyCable, does: Set(BROADCAST_KEY) },
    Var { name: "ANYCABLE_HTTP_BROADCAST_SECRET", peer: AnyCable, does: Set(BROADCAST_KEY) },
    Var { name: "ANYCABLE_REDIS_URL", peer: AnyCable, does: Set(BROKER_URL) },
    Var { name: "ANYCABLE_NATS_SERVERS", peer: AnyCable, does: Part },
    Var { name: "ANYCABLE_REDIS_CHANNEL", peer: AnyCable, does: Set(BROADCAST_CHANNEL) },
    Var { name: "ANYCABLE_NATS_CHANNEL", peer: AnyCable, does: Set(BROADCAST_CHANNEL) },
    Var { name: "ANYCABLE_REDISX_STREAM", peer: AnyCable, does: Set(BROADCAST_CHANNEL) },
    Var { name: "ANYCABLE_SECRET", peer: AnyCable, does: Part },
    Var { name: "ANYCABLE_STREAMS_SECRET", peer: AnyCable, does: Part },
    Var { name: "ANYCABLE_JWT_SECRET", peer: AnyCable, does: Part },
    Var { name: "ANYCABLE_JWT_ID_KEY", peer: AnyCable, does: Part },
    Var { name: "ANYCABLE_JWT_PARAM", peer: AnyCable, does: Set(JWT_PARAM) },
    Var { name: "ANYCABLE_JWT_ID_PARAM", peer: AnyCable, does: Set(JWT_PARAM) },
    Var { name: "ANYCABLE_ENFORCE_JWT", peer: AnyCable, does: Set(JWT_FORCE) },
    Var { name: "ANYCABLE_JWT_ID_ENFORCE", peer: AnyCable, does: Set(JWT_FORCE) },
    Var { name: "ANYCABLE_PUSHER_APP_ID", peer: AnyCable, does: Set(APP_ID) },
    Var { name: "ANYCABLE_PUSHER_APP_KEY", peer: AnyCable, does: Set(APP_KEY) },
    Var { name: "ANYCABLE_PUSHER_SECRET", peer: AnyCable, does: Set(APP_SECRET) },
    Var { name: "ANYCABLE_SSL_CERT", peer: AnyCable, does: Set(TLS_CERT) },
    Var { name: "ANYCABLE_SSL_KEY", peer: AnyCable, does: Set(TLS_KEY) },
    Var { name: "ANYCABLE_LOG_LEVEL", peer: AnyCable, does: Set(LOG_LEVEL) },
    Var { name: "ANYCABLE_DEBUG", peer: AnyCable, does: Set(DEBUG_LOG) },
    Var { name: "ANYCABLE_SHUTDOWN_TIMEOUT", peer: AnyCable, does: Set(SHUTDOWN_GRACE) },
    Var { name: "ANYCABLE_NORPC", peer: AnyCable, does: Nothing("leave rpc.host unset for the same") },
    Var { name: "ANYCABLE_RPC_IMPL", peer: AnyCable, does: Nothing("Herald infers it from rpc.host, as AnyCable does by default") },
    Var { name: "ANYCABLE_HTTP_BROADCAST_URL", peer: AnyCable, does: Nothing(CLIENT) },
    Var { name: "ANYCABLE_WEBSOCKET_URL", peer: AnyCable, does: Nothing(CLIENT) },
    Var { name: "ANYCABLE_HTTP_RPC_MOUNT_PATH", peer: AnyCable, does: Nothing("the app's HTTP RPC path: put it in rpc.host's URL") },
    Var { name: "ANYCABLE_HTTP_BROADCAST_PORT", peer: AnyCable, does: Unsupported("POST /_broadcast is on Herald's own port") },
    Var { name: "ANYCABLE_ALLOWED_ORIGINS", peer: AnyCable, does: Set(ALLOWED_ORIGINS) },
    Var { name: "ANYCABLE_PROXY_COOKIES", peer: AnyCable, does: Unsupported("every cookie is passed (ANYCABLE_HEADERS)") },
    Var { name: "ANYCABLE_DISCONNECT_MODE", peer: AnyCable, does: Unsupported("Herald behaves as `auto`") },
    Var { name: "ANYCABLE_PING_INTERVAL", peer: AnyCable, does: Unsupported("pings go every 3 s, as AnyCable's default") },
    Var { name: "ANYCABLE_HISTORY_LIMIT", peer: AnyCable, does: Set(HISTORY_LIMIT) },
    Var { name: "ANYCABLE_HISTORY_TTL", peer: AnyCable, does: Set(HISTORY_TTL) },
    Var { name: "ANYCABLE_SESSIONS_TTL", peer: AnyCable, does: Set(SESSIONS_TTL) },
    Var { name: "ANYCABLE_PRESENCE_TTL", peer: AnyCable, does: Set(PRESENCE_TTL) },
    Var { name: "ANYCABLE_STREAMS_PRESENCE", peer: AnyCable, does: Set(STREAMS_PRESENCE) },
    Var { name: "ANYCABLE_STREAMS_WHISPER", peer: AnyCable, does: Set(STREAMS_WHISPER) },
    Var { name: "ANYCABLE_BROKER", peer: AnyCable, does: Unsupported("history and session restore for actioncable-v1-ext-json are on by default (rpc.history_limit, rpc.sessions_ttl): in process on one node, on the broker's server (Redis, NATS with -js) in a cluster") },
    Var { name: "ANYCABLE_PUBSUB", peer: AnyCable, does: Unsupported("nodes exchange broadcasts through broker.url") },
    Var { name: "ANYCABLE_EMBED_NATS", peer: AnyCable, does: Unsupported("run nats-server beside Herald") },
    Var { name: "ANYCABLE_PRESETS", peer: AnyCable, does: Unsupported(NO_EQUIV) },
    Var { name: "ANYCABLE_TURBO_STREAMS", peer: AnyCable, does: Set(TURBO_STREAMS) },
    Var { name: "ANYCABLE_TURBO_STREAMS_SECRET", peer: AnyCable, does: Set(TURBO_STREAMS_SECRET) },
    Var { name: "ANYCABLE_TURBO_RAILS_KEY", peer: AnyCable, does: Set(TURBO_RAILS_KEY) },
    Var { name: "ANYCABLE_CABLE_READY_STREAMS", peer: AnyCable, does: Set(CABLE_READY_STREAMS) },
    Var { name: "ANYCABLE_CABLE_READY_SECRET", peer: AnyCable, does: Set(CABLE_READY_SECRET) },
    Var { name: "ANYCABLE_CABLE_READY_KEY", peer: AnyCable, does: Set(CABLE_READY_KEY) },
    Var { name: "ANYCABLE_METRICS_HTTP", peer: AnyCable, does: Nothing(METRICS) },
    Var { name: "ANYCABLE_METRICS_PORT", peer: AnyCable, does: Set(METRICS_PORT) },
    Var { name: "ANYCABLE_REDIS_SENTINELS", peer: AnyCable, does: Unsupported("Herald takes one Redis URL") },
    Var { name: "ANYCABLE_NOAUTH", peer: AnyCable, does: Unsupported("leave rpc.host unset to welcome every client") },
    // sockudo's default app (its documented SOCKUDO_DEFAULT_APP_* names).
    Var { name: "SOCKUDO_DEFAULT_APP_ID", peer: Sockudo, does: Set(APP_ID) },
    Var { name: "SOCKUDO_DEFAULT_APP_KEY", peer: Sockudo, does: Set(APP_KEY) },
    Var { name: "SOCKUDO_DEFAULT_APP_SECRET", peer: Sockudo, does: Set(APP_SECRET) },
    Var { name: "SOCKUDO_DEFAULT_APP_ALLOWED_ORIGINS", peer: Sockudo, does: Set(ALLOWED_ORIGINS) },
];

/// The variables read as they are set, empty values counting as unset (an
/// empty `PUSHER_APP_ID=` in a Laravel `.env` means "none"), and so do
/// `null` and `(null)`, which Laravel's `env()` reads as PHP's null (its
/// default `.env` has `REDIS_PASSWORD=null`).
pub struct Env(BTreeMap<String, String>);

impl Env {
    /// The process environment.
    pub fn from_process() -> Env {
        Env::from_pairs(std::env::vars())
    }

    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Env {
        let unset = |v: &str| matches!(v.trim(), "" | "null" | "(null)");
        Env(pairs.into_iter().filter(|(_, v)| !unset(v)).collect())
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

/// A setting a rule built: the target, its value, the variables used.
type Built = (Target, String, Vec<&'static str>);

/// A rule building settings from several variables.
struct Rule {
    /// Every variable the rule may read (for the log line of what was read).
    reads: &'static [&'static str],
    build: fn(&Env) -> Result<Vec<Built>, String>,
    peer: Peer,
}

/// Percent-encode a URL's user or password (RFC 3986 unreserved kept).
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A `redis://` URL from parts, with the peer's defaults for what is unset.
fn redis_url(
    env: &Env,
    vars: [&'static str; 5],
    defaults: (&str, &str, &str),
) -> (String, Vec<&'static str>) {
    let [host, port, user, pass, db] = vars;
    let used: Vec<_> = vars
        .iter()
        .copied()
        .filter(|v| env.get(v).is_some())
        .collect();
    let auth = match (env.get(user), env.get(pass)) {
        (Some(u), Some(p)) => format!("{}:{}@", enc(u), enc(p)),
        (None, Some(p)) => format!(":{}@", enc(p)),
        (Some(u), None) => format!("{}@", enc(u)),
        (None, None) => String::new(),
    };
    let url = format!(
        "redis://{auth}{}:{}/{}",
        env.get(host).unwrap_or(defaults.0),
        env.get(port).unwrap_or(defaults.1),
        env.get(db).unwrap_or(defaults.2)
    );
    (url, used)
}

/// The first of a list of NATS servers (comma-separated or a JSON array),
/// as a `nats://` URL with the credentials given.
fn nats_url(
    list: &str,
    user: Option<&str>,
    pass: Option<&str>,
    token: Option<&str>,
) -> Result<(String, usize), String> {
    let servers: Vec<String> = if list.trim_start().starts_with('[') {
        serde_json::from_str(list)
            .map_err(|e| format!("{list:?} is not a JSON list of servers: {e}"))?
    } else {
        list.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    };
    let first = servers
        .first()
        .ok_or_else(|| format!("{list:?} names no server"))?;
    let hostport = first
        .strip_prefix("nats://")
        .unwrap_or(first)
        .rsplit('@')
        .next()
        .unwrap_or(first);
    let auth = match (user, pass, token) {
        (Some(u), Some(p), _) => format!("{}:{}@", enc(u), enc(p)),
        (_, _, Some(t)) => format!("{}@", enc(t)),
        (Some(u), None, None) => format!("{}@", enc(u)),
        _ => {
            // Credentials written into the server's address stay.
            if let Some(at) = first.strip_prefix("nats://").unwrap_or(first).rfind('@') {
                let s = first.strip_prefix("nats://").unwrap_or(first);
                format!("{}@", &s[..at])
            } else {
                String::new()
            }
        }
    };
    Ok((format!("nats://{auth}{hostport}"), servers.len()))
}

static RULES: &[Rule] = &[
    // soketi's app manager: PostgreSQL or MySQL from its DB_POSTGRES_* or
    // DB_MYSQL_* connection, with soketi's defaults for what is unset.
    Rule {
        reads: &[
            "SOKETI_APP_MANAGER_DRIVER",
            "SOKETI_DB_POSTGRES_HOST",
            "SOKETI_DB_POSTGRES_PORT",
            "SOKETI_DB_POSTGRES_USERNAME",
            "SOKETI_DB_POSTGRES_PASSWORD",
            "SOKETI_DB_POSTGRES_DATABASE",
            "SOKETI_DB_MYSQL_HOST",
            "SOKETI_DB_MYSQL_PORT",
            "SOKETI_DB_MYSQL_USERNAME",
            "SOKETI_DB_MYSQL_PASSWORD",
            "SOKETI_DB_MYSQL_DATABASE",
        ],
        peer: Soketi,
        build: |env| {
            let Some(driver) = env.get("SOKETI_APP_MANAGER_DRIVER") else {
                return Ok(vec![]);
            };
            match driver.trim() {
                "array" => Ok(vec![]),
                driver @ ("postgres" | "mysql") => {
                    let (vars, port, user) = match driver {
                        "postgres" => (
                            [
                                "SOKETI_DB_POSTGRES_HOST",
                                "SOKETI_DB_POSTGRES_PORT",
                                "SOKETI_DB_POSTGRES_USERNAME",
                                "SOKETI_DB_POSTGRES_PASSWORD",
                                "SOKETI_DB_POSTGRES_DATABASE",
                            ],
                            "5432",
                            "postgres",
                        ),
                        _ => (
                            [
                                "SOKETI_DB_MYSQL_HOST",
                                "SOKETI_DB_MYSQL_PORT",
                                "SOKETI_DB_MYSQL_USERNAME",
                                "SOKETI_DB_MYSQL_PASSWORD",
                                "SOKETI_DB_MYSQL_DATABASE",
                            ],
                            "3306",
                            "root",
                        ),
                    };
                    let get = |i: usize, default: &'static str| env.get(vars[i]).unwrap_or(default);
                    let url = format!(
                        "{driver}://{}:{}@{}:{}/{}",
                        enc(get(2, user)),
                        enc(get(3, "password")),
                        get(0, "127.0.0.1"),
                        get(1, port),
                        enc(get(4, "main")),
                    );
                    let mut used: Vec<_> = vars.iter().copied().filter(|v| env.get(v).is_some()).collect();
                    used.insert(0, "SOKETI_APP_MANAGER_DRIVER");
                    Ok(vec![(APPS_DB_URL, url, used)])
                }
                other => Err(format!(
                    "SOKETI_APP_MANAGER_DRIVER={other:?}: Herald reads apps from PostgreSQL (postgres), MySQL/MariaDB (mysql) or its config file (array); {other} is not supported yet"
                )),
            }
        },
    },
    // Reverb's scaling: Redis pub/sub over Laravel's default connection.
    Rule {
        reads: &[
            "REVERB_SCALING_ENABLED",
            "REDIS_URL",
            "REDIS_HOST",
            "REDIS_PORT",
            "REDIS_USERNAME",
            "REDIS_PASSWORD",
            "REDIS_DB",
        ],
        peer: Reverb,
        build: |env| {
            let Some(on) = env.get("REVERB_SCALING_ENABLED") else {
                return Ok(vec![]);
            };
            if !boolean(on).map_err(|e| format!("REVERB_SCALING_ENABLED: {e}"))? {
                return Ok(vec![]);
            }
            if let Some(url) = env.get("REDIS_URL") {
                return Ok(vec![(
                    BROKER_URL,
                    url.to_string(),
                    vec!["REVERB_SCALING_ENABLED", "REDIS_URL"],
                )]);
            }
            let (url, mut used) = redis_url(
                env,
                [
                    "REDIS_HOST",
                    "REDIS_PORT",
                    "REDIS_USERNAME",
                    "REDIS_PASSWORD",
                    "REDIS_DB",
                ],
                ("127.0.0.1", "6379", "0"),
            );
            used.insert(0, "REVERB_SCALING_ENABLED");
            Ok(vec![(BROKER_URL, url, used)])
        },
    },
    // soketi's adapter: local, redis (its DB_REDIS_* connection) or nats.
    Rule {
        reads: &[
            "SOKETI_ADAPTER_DRIVER",
            "SOKETI_DB_REDIS_HOST",
            "SOKETI_DB_REDIS_PORT",
            "SOKETI_DB_REDIS_USERNAME",
            "SOKETI_DB_REDIS_PASSWORD",
            "SOKETI_DB_REDIS_DB",
            "SOKETI_ADAPTER_NATS_SERVERS",
            "SOKETI_ADAPTER_NATS_USER",
            "SOKETI_ADAPTER_NATS_PASSWORD",
            "SOKETI_ADAPTER_NATS_TOKEN",
        ],
        peer: Soketi,
        build: |env| {
            let Some(driver) = env.get("SOKETI_ADAPTER_DRIVER") else {
                return Ok(vec![]);
            };
            match driver.trim() {
                "local" => Ok(vec![(
                    BROKER_URL,
                    "local".into(),
                    vec!["SOKETI_ADAPTER_DRIVER"],
                )]),
                "redis" => {
                    let (url, mut used) = redis_url(
                        env,
                        [
                            "SOKETI_DB_REDIS_HOST",
                            "SOKETI_DB_REDIS_PORT",
                            "SOKETI_DB_REDIS_USERNAME",
                            "SOKETI_DB_REDIS_PASSWORD",
                            "SOKETI_DB_REDIS_DB",
                        ],
                        ("127.0.0.1", "6379", "0"),
                    );
                    used.insert(0, "SOKETI_ADAPTER_DRIVER");
                    Ok(vec![(BROKER_URL, url, used)])
                }
                "nats" => {
                    let list = env
                        .get("SOKETI_ADAPTER_NATS_SERVERS")
                        .unwrap_or("127.0.0.1:4222");
                    let (url, _) = nats_url(
                        list,
                        env.get("SOKETI_ADAPTER_NATS_USER"),
                        env.get("SOKETI_ADAPTER_NATS_PASSWORD"),
                        env.get("SOKETI_ADAPTER_NATS_TOKEN"),
                    )
                    .map_err(|e| format!("SOKETI_ADAPTER_NATS_SERVERS: {e}"))?;
                    let mut used = vec!["SOKETI_ADAPTER_DRIVER"];
                    used.extend(
                        [
                            "SOKETI_ADAPTER_NATS_SERVERS",
                            "SOKETI_ADAPTER_NATS_USER",
                            "SOKETI_ADAPTER_NATS_PASSWORD",
                            "SOKETI_ADAPTER_NATS_TOKEN",
                        ]
                        .into_iter()
                        .filter(|v| env.get(v).is_some()),
                    );
                    Ok(vec![(BROKER_URL, url, used)])
                }
                "cluster" => Err(format!(
                    "SOKETI_ADAPTER_DRIVER: \"cluster\": {SOKETI_CLUSTER}"
                )),
                other => Err(format!(
                    "SOKETI_ADAPTER_DRIVER: {other:?} is not an adapter (local, redis, nats)"
                )),
            }
        },
    },
    // soketi's webhook batching: off sends each event at once.
    Rule {
        reads: &[
            "SOKETI_WEBHOOKS_BATCHING",
            "SOKETI_WEBHOOKS_BATCHING_DURATION",
        ],
        peer: Soketi,
        build: |env| {
            let Some(on) = env.get("SOKETI_WEBHOOKS_BATCHING") else {
                if env.get("SOKETI_WEBHOOKS_BATCHING_DURATION").is_some() {
                    // soketi ignores the duration without batching.
                    return Ok(vec![]);
                }
                return Ok(vec![]);
            };
            let on = boolean(on).map_err(|e| format!("SOKETI_WEBHOOKS_BATCHING: {e}"))?;
            if on {
                let ms = env.get("SOKETI_WEBHOOKS_BATCHING_DURATION").unwrap_or("50");
                Ok(vec![(
                    WEBHOOK_BATCH_MS,
                    ms.to_string(),
                    vec![
                        "SOKETI_WEBHOOKS_BATCHING",
                        "SOKETI_WEBHOOKS_BATCHING_DURATION",
                    ],
                )])
            } else {
                // Herald always collects a batch; 1 ms is as good as none.
                Ok(vec![(
                    WEBHOOK_BATCH_MS,
                    "1".into(),
                    vec!["SOKETI_WEBHOOKS_BATCHING"],
                )])
            }
        },
    },
    // AnyCable's NATS servers: the broker (Herald takes the first).
    Rule {
        reads: &["ANYCABLE_NATS_SERVERS"],
        peer: AnyCable,
        build: |env| {
            let Some(list) = env.get("ANYCABLE_NATS_SERVERS") else {
                return Ok(vec![]);
            };
            let (url, _) = nats_url(list, None, None, None)
                .map_err(|e| format!("ANYCABLE_NATS_SERVERS: {e}"))?;
            Ok(vec![(BROKER_URL, url, vec!["ANYCABLE_NATS_SERVERS"])])
        },
    },
    // AnyCable's application secret is the fallback of the streams and
    // JWT secrets (AnyCable 1.5); ANYCABLE_JWT_ID_KEY is the JWT secret's
    // name before 1.5.
    Rule {
        reads: &[
            "ANYCABLE_SECRET",
            "ANYCABLE_STREAMS_SECRET",
            "ANYCABLE_JWT_SECRET",
            "ANYCABLE_JWT_ID_KEY",
        ],
        peer: AnyCable,
        build: |env| {
            let mut out = Vec::new();
            let first = |names: &[&'static str]| {
                names
                    .iter()
                    .find_map(|n| env.get(n).map(|v| (*n, v.to_string())))
            };
            if let Some((n, v)) = first(&["ANYCABLE_STREAMS_SECRET", "ANYCABLE_SECRET"]) {
                out.push((STREAMS_SECRET, v, vec![n]));
            }
            if let Some((n, v)) = first(&[
                "ANYCABLE_JWT_SECRET",
                "ANYCABLE_JWT_ID_KEY",
                "ANYCABLE_SECRET",
            ]) {
                out.push((JWT_SECRET, v, vec![n]));
            }
            Ok(out)
        },
    },
];

/// Read every peer variable in `env`.
pub fn read(env: &Env) -> Result<Reading, String> {
    let mut r = Reading::default();
    let mut known = BTreeSet::new();
    for var in VARS {
        known.insert(var.name);
        if env.get(var.name).is_none() {
            continue;
        }
        match var.does {
            Set(target) => r.assignments.push(Assignment {
                target,
                value: env.get(var.name).unwrap_or_default().to_string(),
                from: vec![var.name],
                peer: var.peer,
            }),
            Part => {}
            Nothing(why) => r.no_effect.push((var.name, why)),
            Unsupported(why) => r.unsupported.push((var.name, why)),
        }
    }
    for rule in RULES {
        debug_assert!(rule.reads.iter().all(|n| known.contains(n)));
        for (target, value, from) in (rule.build)(env)? {
            r.assignments.push(Assignment {
                target,
                value,
                from,
                peer: rule.peer,
            });
        }
    }
    if env.get("ANYCABLE_SECRET").is_some() {
        for (derived, name) in [
            ("ANYCABLE_HTTP_RPC_SECRET", "the HTTP RPC secret"),
            ("ANYCABLE_BROADCAST_KEY", "the broadcast key"),
        ] {
            if env.get(derived).is_none() {
                r.notes.push(format!(
                    "ANYCABLE_SECRET: {name} is not derived from it as AnyCable does; set {derived} if you use it"
                ));
            }
        }
    }
    for name in env.0.keys() {
        if OWNED_PREFIXES.iter().any(|p| name.starts_with(p)) && !known.contains(name.as_str()) {
            r.unknown.push(name.clone());
        }
    }
    // Two variables giving one setting different values: the first in
    // the table wins, and the operator hears about it.
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let mut kept = Vec::new();
    for a in std::mem::take(&mut r.assignments) {
        match seen.get(a.target.key) {
            Some(&i) => {
                let first: &Assignment = &kept[i];
                if first.value != a.value {
                    r.notes.push(format!(
                        "{} and {} disagree on {}: using {}",
                        first.from.join("+"),
                        a.from.join("+"),
                        a.target.key,
                        first.from.join("+")
                    ));
                }
            }
            None => {
                seen.insert(a.target.key, kept.len());
                kept.push(a);
            }
        }
    }
    r.assignments = kept;
    Ok(r)
}

impl Reading {
    /// Apply the readings to `config`, except settings the config file
    /// gave (`file_keys`, Herald's own names win). A malformed value is an
    /// error naming its variable.
    pub fn apply(
        &mut self,
        config: &mut Config,
        file_keys: &BTreeSet<String>,
    ) -> Result<(), String> {
        let mut applied = Vec::new();
        for a in std::mem::take(&mut self.assignments) {
            if file_keys.contains(a.target.key) {
                self.notes.push(format!(
                    "{} is set in the config file: it wins over {}",
                    a.target.key,
                    a.from.join("+")
                ));
                continue;
            }
            (a.target.apply)(config, &a.value).map_err(|e| format!("{}: {e}", a.from.join("+")))?;
            applied.push(a);
        }
        self.assignments = applied;
        Ok(())
    }

    /// The variables that set something, for the start-up log line.
    pub fn read_names(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = self
            .assignments
            .iter()
            .flat_map(|a| a.from.iter().copied())
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    pub fn peers(&self) -> Vec<&'static str> {
        let mut peers: Vec<_> = self.assignments.iter().map(|a| a.peer.name()).collect();
        peers.sort_unstable();
        peers.dedup();
        peers
    }
}
