//! The effective configuration and where each value came from: the layers
//! in order (defaults, the TOML file, peer variables, `HERALD_*`, flags),
//! used by `herald serve` to start and by `herald config` to show and check
//! what a deploy would run with. Secrets are masked in anything shown.

use crate::peers::{self, Env, Reading};
use herald_core::adapter::Adapters;
use herald_core::config::{redact_url, Config, Overrides};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::OnceLock;

/// Where a value came from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    Default,
    File,
    /// Peer variables (names joined with `+`) and the peer's name.
    Peer(String, &'static str),
    /// A `HERALD_*` variable.
    Env(String),
    /// A command-line flag.
    Flag(String),
}

/// Names of the variables an `--env-file` supplied (for labels).
static FROM_ENV_FILE: OnceLock<BTreeSet<String>> = OnceLock::new();

fn file_tag(names: &str) -> &'static str {
    let from_file = FROM_ENV_FILE.get();
    if names
        .split('+')
        .any(|n| from_file.is_some_and(|f| f.contains(n)))
    {
        ", from --env-file"
    } else {
        ""
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => write!(f, "default"),
            Source::File => write!(f, "file"),
            Source::Peer(vars, peer) => write!(f, "{vars} ({peer}{})", file_tag(vars)),
            Source::Env(var) => write!(f, "environment {var}{}", file_tag(var)),
            Source::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// Read a Laravel or Rails `.env` file into the process environment, for
/// every variable not already set (the environment wins, as with Laravel's
/// and Rails' dotenv loaders). `${VAR}` references are expanded, bounded
/// (see [`crate::env_file`]); errors name the file, line and variable,
/// never a value. Call before any thread starts.
pub fn load_env_file(path: &Path) -> Result<(), String> {
    use std::io::Read;
    let shown = path.display();
    let limit = crate::env_file::MAX_FILE_BYTES;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        // One byte past the bound tells a file over it (whatever its
        // metadata says: a pipe, a file still growing).
        .and_then(|f| f.take(limit as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("--env-file {shown}: {e}"))?;
    if bytes.len() > limit {
        return Err(format!(
            "--env-file {shown}: larger than {limit} bytes (a .env holds a few KiB; is this the right file?)"
        ));
    }
    let vars = crate::env_file::parse(&bytes, |name| std::env::var(name).ok())
        .map_err(|e| format!("--env-file {shown}: {e}"))?;
    let mut names = BTreeSet::new();
    for v in vars {
        if std::env::var_os(&v.name).is_none() {
            // Single-threaded here (see above), so setting is sound.
            std::env::set_var(&v.name, v.value);
            names.insert(v.name);
        }
    }
    let _ = FROM_ENV_FILE.set(names);
    Ok(())
}

/// The configuration in force, where each value came from, and what the
/// peer layer read.
pub struct Effective {
    pub config: Config,
    pub peers: Reading,
    /// Herald's own settings (environment and flags) that beat a peer's.
    pub notes: Vec<String>,
    herald: Vec<(String, Source)>,
    file_keys: BTreeSet<String>,
    /// The adapters' keys with their defaults (see
    /// [`herald_core::adapter::Adapter::config`]), shown with the core's.
    adapter_keys: Vec<serde_json::Value>,
}

/// Build the effective configuration. `herald` lists the settings
/// Herald's own environment and flags gave (config key, source), already
/// folded into `overrides`.
pub fn load(
    file: Option<&Path>,
    overrides: &Overrides,
    herald: Vec<(String, Source)>,
    env: &Env,
    adapters: &Adapters,
) -> Result<Effective, String> {
    // Every error of the configuration is reported at once: the file's
    // (each key whose value does not fit), then the checks of what the
    // layers made of the rest, the core's and every adapter's.
    let (config, mut errors) = Config::from_file_all(file).map_err(|e| e.to_string())?;
    let Some(mut config) = config else {
        // Syntax errors: no key of the file can be trusted, nothing to check.
        return Err(herald_core::config::ConfigError::all(errors)
            .err()
            .map_or_else(String::new, |e| e.to_string()));
    };
    let file_keys = match file {
        // Keys that did not fit are left out of the configuration.
        Some(path) if errors.is_empty() => {
            let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
            let value: toml::Value = toml::from_str(&text).map_err(|e| e.to_string())?;
            let json = serde_json::to_value(value).map_err(|e| e.to_string())?;
            let mut keys = BTreeMap::new();
            flatten("", &json, &mut keys);
            keys.into_keys().collect()
        }
        _ => BTreeSet::new(),
    };
    let mut peers = peers::read(env)?;
    let mut notes = Vec::new();
    for a in &peers.assignments {
        if let Some((_, src)) = herald.iter().find(|(k, _)| k == a.target.key) {
            notes.push(format!(
                "{} from {src} wins over {}",
                a.target.key,
                a.from.join("+")
            ));
        }
    }
    peers.apply(&mut config, &file_keys)?;
    if let Err(e) = config.apply(overrides) {
        errors.push(e);
    }
    errors.extend(config.problems());
    if let Err(e) = herald_core::adapter::check_config(&config, adapters) {
        errors.extend(e.into_list());
    }
    let mut messages: Vec<String> = errors
        .into_iter()
        .map(|e| named_as_given(e, &herald))
        .collect();
    let mut adapter_keys = Vec::new();
    for a in adapters {
        // An adapter's start-up checks read its keys: only once they parse
        // (an error in them is check_config's, above).
        if let Ok(keys) = a.config(&config) {
            if let Err(e) = a.check(&config) {
                messages.push(format!("invalid config: {e}"));
            }
            adapter_keys.push(keys);
        }
    }
    match messages.len() {
        0 => {}
        1 => return Err(messages.remove(0)),
        n => {
            let list: Vec<String> = messages
                .iter()
                .map(|m| format!("- {}", m.replace('\n', "\n  ")))
                .collect();
            return Err(format!("{n} configuration errors:\n{}", list.join("\n")));
        }
    }
    Ok(Effective {
        config,
        peers,
        notes,
        herald,
        file_keys,
        adapter_keys,
    })
}

/// A configuration error, naming the flag or variable the user typed when
/// one of them gave the offending key (`--activity-timeout 0` is refused
/// as `--activity-timeout`, not only as `activity_timeout`).
fn named_as_given(e: herald_core::config::ConfigError, herald: &[(String, Source)]) -> String {
    use herald_core::config::ConfigError;
    if let ConfigError::Invalid { key, message } = &e {
        let given = herald
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .and_then(|(_, s)| match s {
                Source::Flag(f) => Some(f.clone()),
                Source::Env(v) => Some(v.clone()),
                _ => None,
            });
        if let Some(given) = given {
            return format!("invalid config: `{given}` ({key}) {message}");
        }
    }
    e.to_string()
}

/// Flatten JSON into `a.b`, `apps[0].key` leaves; arrays of plain values
/// (and empty ones) are one leaf.
fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, serde_json::Value>) {
    use serde_json::Value;
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&p, v, out);
            }
        }
        Value::Array(items) if items.iter().any(|i| i.is_object()) => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), v, out);
            }
        }
        _ => {
            out.insert(prefix.to_string(), v.clone());
        }
    }
}

/// Put an adapter's keys (with defaults) over the raw ones the core kept:
/// its top-level keys replace the core's, and `apps[i]`'s merge into
/// each app.
fn merge(into: &mut serde_json::Value, adapter: &serde_json::Value) {
    use serde_json::Value;
    let (Value::Object(into), Value::Object(keys)) = (into, adapter) else {
        return;
    };
    for (k, v) in keys {
        match (k.as_str(), v, into.get_mut(k)) {
            ("apps", Value::Array(apps), Some(Value::Array(ours))) => {
                for (app, theirs) in ours.iter_mut().zip(apps) {
                    if let (Value::Object(app), Value::Object(theirs)) = (app, theirs) {
                        app.extend(theirs.clone());
                    }
                }
            }
            _ => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Whether `key` is `layer_key` or lies under it.
fn under(key: &str, layer_key: &str) -> bool {
    key == layer_key
        || key
            .strip_prefix(layer_key)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

/// Values shown as `****`: credentials, tokens, API keys, header values.
fn is_secret(key: &str) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key);
    let last = last.split('[').next().unwrap_or(last);
    matches!(
        last,
        "secret"
            | "dashboard_token"
            | "streams_secret"
            | "turbo_streams_secret"
            | "cable_ready_secret"
            | "secret_access_key"
            | "jwt_secret"
            | "broadcast_key"
            | "api_keys"
            | "publish_keys"
            | "subscribe_keys"
    ) || (key.contains(".webhooks[") && key.contains(".headers."))
}

impl Effective {
    fn source_of(&self, key: &str) -> Source {
        // The last layer that set the key (or a table above it) wins.
        let mut found = Source::Default;
        if self.file_keys.iter().any(|k| under(key, k)) {
            found = Source::File;
        }
        for a in &self.peers.assignments {
            if under(key, a.target.key) {
                found = Source::Peer(a.from.join("+"), a.peer.name());
            }
        }
        // `herald` lists environment settings before flags.
        for (k, src) in &self.herald {
            if under(key, k) {
                found = src.clone();
            }
        }
        found
    }

    /// Every setting as `(key, shown value, source)`, secrets masked.
    pub fn settings(&self) -> Vec<(String, String, Source)> {
        let mut json = serde_json::to_value(&self.config).unwrap_or_default();
        for keys in &self.adapter_keys {
            merge(&mut json, keys);
        }
        let mut leaves = BTreeMap::new();
        flatten("", &json, &mut leaves);
        let mut out: Vec<_> = leaves
            .into_iter()
            .map(|(key, value)| {
                let shown = if key == "broker.url" {
                    serde_json::Value::String(self.config.broker.shown_url()).to_string()
                } else if key == "apps_database.url" && !value.is_null() {
                    // The password is in the URL.
                    serde_json::Value::String(redact_url(value.as_str().unwrap_or(""))).to_string()
                } else if key.contains(".webhooks[") && key.ends_with(".url") {
                    serde_json::Value::String(redact_url(value.as_str().unwrap_or(""))).to_string()
                } else if is_secret(&key) && !value.is_null() && value != serde_json::json!([]) {
                    "\"****\"".to_string()
                } else {
                    value.to_string()
                };
                let source = self.source_of(&key);
                (key, shown, source)
            })
            .collect();
        // Alphabetical (serde_json's map order), the apps last.
        out.sort_by_key(|(k, _, _)| k.starts_with("apps["));
        out
    }

    /// Problems worth a look that do not stop the server: unsupported and
    /// unknown peer variables, conflicts and who won.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        for (name, why) in &self.peers.unsupported {
            w.push(format!("{name} is not supported: {why}"));
        }
        for name in &self.peers.unknown {
            w.push(format!(
                "{name} is not a variable of any server Herald reads (a typo, or a newer setting): not read"
            ));
        }
        w.extend(self.peers.notes.iter().cloned());
        w.extend(self.notes.iter().cloned());
        let c = &self.config;
        if c.dashboard_token.is_some() && !c.dashboard {
            w.push(
                "dashboard_token is set but the dashboard is off: set HERALD_DASHBOARD=true \
                 (--dashboard, dashboard = true) to serve it at /dashboard"
                    .into(),
            );
        }
        if c.metrics_port.is_none() && !c.serves_loopback_only() {
            w.push(format!(
                "/metrics is served with no key on the public port {}: set metrics_port \
                 (HERALD_METRICS_PORT) to serve it on a port of its own and keep that one private",
                c.port
            ));
        }
        w
    }
}
