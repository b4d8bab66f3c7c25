//! The adapter seam: what a protocol crate hands the server, so that the
//! binary is the core plus a list of adapters and a new protocol is one
//! new crate and one line in that list.
//!
//! An adapter brings its own settings (config keys it owns, parsed and
//! checked in its crate; the environment variables and flags that set
//! them), its routes, its background tasks, its metrics and its part in a
//! graceful shutdown. The core's [`Config`] keeps an adapter's keys raw
//! ([`Config::sections`], [`AppConfig::extra`](crate::config::AppConfig))
//! until the adapter that claims them ([`Adapter::keys`]) reads them; a key
//! no adapter claims is refused at load, as an unknown key always was.

use crate::config::{Config, ConfigError};
use crate::node::Node;
use axum::Router;
use bytes::Bytes;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// A boxed future an adapter returns from [`Adapter::stop`].
pub type Stopping = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The config keys an adapter owns.
#[derive(Debug, Clone, Copy, Default)]
pub struct Keys {
    /// Top-level keys: plain values (`webhook_batch_ms`) or tables (`rpc`).
    pub top: &'static [&'static str],
    /// Keys inside each `[[apps]]` entry (`webhooks`, `api_keys`).
    pub app: &'static [&'static str],
}

/// An environment variable and flag of `herald serve` that set one of an
/// adapter's keys (the layer above the file and peer variables).
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The key it sets, as `herald config` shows it: `rpc.host`, or
    /// `apps[0].api_keys` (only with exactly one app).
    pub key: &'static str,
    /// The long flag, without `--`.
    pub flag: &'static str,
    pub env: &'static str,
    /// The flag's help line.
    pub help: &'static str,
    /// Its value is never shown (`--help` hides the environment's value).
    pub secret: bool,
    /// The value as the key holds it (a list from a comma-separated one).
    pub parse: fn(&str) -> Result<toml::Value, String>,
}

/// A string setting as it is.
pub fn text(v: &str) -> Result<toml::Value, String> {
    Ok(toml::Value::String(v.to_owned()))
}

/// What the server lends adapters when they start.
pub struct Context<'a> {
    /// Messages an app publishes straight to the broker's server.
    pub ingress: &'a dyn Ingress,
}

/// Reading an app's own publications from the broker's server (Redis or
/// NATS), outside the cluster's protocol: what AnyCable's broadcast
/// adapters need. The binary implements it with the broker engines.
pub trait Ingress: Send + Sync {
    /// Every message on a pub/sub channel (Redis) or subject (NATS).
    fn subscribe(&self, channel: &str) -> Result<mpsc::Receiver<Bytes>, String>;
    /// A Redis stream read in a consumer group (each entry to one node).
    fn consume_stream(
        &self,
        stream: &str,
        group: &str,
    ) -> Result<mpsc::Receiver<StreamEntry>, String>;
}

/// One entry of a stream read in a consumer group. It is acknowledged in
/// the stream only once the reader says it was taken; one refused (the
/// broker's outbox is full) stays pending and is read again.
pub struct StreamEntry {
    pub payload: Bytes,
    /// `true`: taken (acknowledge it); `false`: refused. Dropped
    /// unanswered: taken.
    pub taken: tokio::sync::oneshot::Sender<bool>,
}

impl StreamEntry {
    /// Say whether the entry was taken.
    pub fn answer(self, taken: bool) -> Bytes {
        let _ = self.taken.send(taken);
        self.payload
    }
}

/// A protocol front door, as the server sees it. Every method but
/// [`name`](Adapter::name) and [`routes`](Adapter::routes) has a default
/// that does nothing, so a small adapter is a few lines.
pub trait Adapter: Send + Sync {
    /// A short name for logs and errors (`pusher`).
    fn name(&self) -> &'static str;

    /// The config keys it owns.
    fn keys(&self) -> Keys {
        Keys::default()
    }

    /// The environment variables and flags that set its keys.
    fn settings(&self) -> &'static [Setting] {
        &[]
    }

    /// Parse and check its keys of `config` (errors name the key), and
    /// return them with every default filled in, shaped as the file is:
    /// an object of its top-level keys, and under `apps` one object per
    /// app in order (unset options as `null`). `herald config` shows this;
    /// `herald serve` refuses to start on an error.
    fn config(&self, config: &Config) -> Result<serde_json::Value, ConfigError> {
        let _ = config;
        Ok(serde_json::Value::Object(Default::default()))
    }

    /// Checks at start beyond the keys' values: files they name, and how
    /// they fit the core's settings (the broker they read from).
    fn check(&self, config: &Config) -> Result<(), String> {
        let _ = config;
        Ok(())
    }

    /// Its routes (called once, inside the runtime). Counters registered
    /// with [`crate::metrics::register`] here appear on `/metrics`.
    fn routes(&self, node: &Arc<Node>) -> Router<Arc<Node>>;

    /// Start its background tasks, once the node has joined the cluster.
    /// Work that must finish before the process exits goes on
    /// `node.tasks`; what an [`Observer`](crate::observer::Observer) it
    /// registers holds is flushed on shutdown by the core.
    fn start(&self, node: &Arc<Node>, cx: &Context<'_>) -> Result<(), String> {
        let _ = (node, cx);
        Ok(())
    }

    /// Its part in a graceful shutdown, after clients left and the
    /// adapters' tasks finished: anything else it must send before
    /// `deadline`.
    fn stop(&self, node: &Arc<Node>, deadline: Instant) -> Stopping {
        let _ = (node, deadline);
        Box::pin(async {})
    }
}

/// The adapters a server runs, in order.
pub type Adapters = Vec<Arc<dyn Adapter>>;

/// Deserialize `value` into `T`; an error names the key: `prefix`, then
/// the path inside `value` (`rpc.timeout_ms`, `apps[0].webhooks[1].url`).
pub fn parse<T: serde::de::DeserializeOwned>(
    value: toml::Value,
    prefix: &str,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let key = match (prefix.is_empty(), path.as_str()) {
            (_, ".") => prefix.to_owned(),
            (true, p) => p.to_owned(),
            (false, p) if p.starts_with('[') => format!("{prefix}{p}"),
            (false, p) => format!("{prefix}.{p}"),
        };
        crate::config::invalid(key, e.into_inner().message().trim().replace('\n', " "))
    })
}

/// Parse a top-level table an adapter owns (`[rpc]`) into `T`, its
/// defaults when absent.
pub fn section<T: serde::de::DeserializeOwned + Default>(
    config: &Config,
    key: &str,
) -> Result<T, ConfigError> {
    match config.sections.get(key) {
        None => Ok(T::default()),
        Some(v) => parse(v.clone(), key),
    }
}

/// Parse the top-level plain keys an adapter owns (`webhook_*`) into `T`
/// (a struct of those keys, defaults for the missing ones).
pub fn top_keys<T: serde::de::DeserializeOwned>(
    config: &Config,
    keys: &[&str],
) -> Result<T, ConfigError> {
    parse(subset(&config.sections, keys), "")
}

/// Parse the keys an adapter owns in app `i` (`apps[i].webhooks`) into
/// `T` (a struct of those keys).
pub fn app_keys<T: serde::de::DeserializeOwned>(
    config: &Config,
    i: usize,
    keys: &[&str],
) -> Result<T, ConfigError> {
    parse(subset(&config.apps[i].extra, keys), &format!("apps[{i}]"))
}

fn subset(table: &toml::Table, keys: &[&str]) -> toml::Value {
    toml::Value::Table(
        table
            .iter()
            .filter(|(k, _)| keys.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    )
}

/// Check every key of `config` is the core's or an adapter's, then each
/// adapter's keys (the whole load's last step, after [`Config::validate`]);
/// every error at once.
pub fn check_config(config: &Config, adapters: &[Arc<dyn Adapter>]) -> Result<(), ConfigError> {
    let claimed = |key: &str, app: bool| {
        adapters.iter().any(|a| {
            let k = a.keys();
            (if app { k.app } else { k.top }).contains(&key)
        })
    };
    let mut errors = Vec::new();
    for key in config.sections.keys() {
        if !claimed(key, false) {
            errors.push(crate::config::unknown(key));
        }
    }
    for (i, app) in config.apps.iter().enumerate() {
        for key in app.extra.keys() {
            if !claimed(key, true) {
                errors.push(crate::config::unknown(&format!("apps[{i}].{key}")));
            }
        }
    }
    for a in adapters {
        errors.extend(a.config(config).err());
    }
    ConfigError::all(errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Default, Debug)]
    #[serde(deny_unknown_fields, default)]
    #[allow(dead_code)]
    struct Rpc {
        timeout_ms: u64,
        host: Option<String>,
    }

    #[derive(serde::Deserialize, Default, Debug)]
    #[serde(deny_unknown_fields, default)]
    #[allow(dead_code)]
    struct Hooks {
        webhooks: Vec<Rpc>,
    }

    #[test]
    fn errors_name_the_key() {
        let c = Config::from_toml("[rpc]\ntimeout_ms = 'x'", "x").unwrap();
        let e = section::<Rpc>(&c, "rpc").unwrap_err().to_string();
        assert!(e.contains("rpc") && e.contains("timeout_ms"), "{e}");
        let c = Config::from_toml("[rpc]\ntimeout_msx = 1", "x").unwrap();
        let e = section::<Rpc>(&c, "rpc").unwrap_err().to_string();
        assert!(e.contains("timeout_msx"), "{e}");
        let c = Config::from_toml("timeout_ms = -1", "x").unwrap();
        let e = top_keys::<Rpc>(&c, &["timeout_ms"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`timeout_ms`"), "{e}");
        let c = Config::from_toml(
            "[[apps]]\nid='a'\nkey='k'\nsecret='s'\nwebhooks=[{timeout_ms='x'}]",
            "x",
        )
        .unwrap();
        let e = app_keys::<Hooks>(&c, 0, &["webhooks"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("apps[0].webhooks") && e.contains("timeout_ms"),
            "{e}"
        );
    }
}
