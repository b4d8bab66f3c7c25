//! AppSync's settings: each app's `api_keys` and `namespaces`, parsed and
//! checked here (the core keeps them raw; see `herald_core::adapter`),
//! and `HERALD_API_KEYS` / `--api-keys`. Names and meanings as they always
//! were; docs/configuration.md lists them.

use herald_core::adapter::{app_keys, Setting};
use herald_core::config::{invalid, AppConfig, Config, ConfigError};
use herald_core::hub::Hub;
use herald_core::node::Node;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// The keys of an app this adapter owns.
pub const APP_KEYS: &[&str] = &["api_keys", "namespaces"];

/// An app's AppSync keys.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AppSettings {
    /// Keys a client presents as its credential (AppSync's API keys).
    /// Empty: closed for this app, except the development app, whose
    /// `key` is accepted.
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

/// An app's keys as the adapter checks them.
#[derive(Debug, Clone, Default)]
pub struct AppKeys {
    /// The API keys in force: the configured ones, or the development
    /// app's own key when it has none.
    pub api_keys: Vec<String>,
    pub namespaces: Vec<NamespaceConfig>,
}

impl AppKeys {
    pub fn new(app: &AppConfig, settings: &AppSettings) -> AppKeys {
        let api_keys = if settings.api_keys.is_empty() && app.is_development() {
            vec![app.key.clone()]
        } else {
            settings.api_keys.clone()
        };
        AppKeys {
            api_keys,
            namespaces: settings.namespaces.clone(),
        }
    }

    pub fn effective_api_keys(&self) -> impl Iterator<Item = &str> {
        self.api_keys.iter().map(String::as_str)
    }
}

/// Every app's keys, by app id (the routes' shared state).
#[derive(Debug, Default)]
pub struct Keys {
    by_app: HashMap<String, Arc<AppKeys>>,
}

impl Keys {
    pub fn load(config: &Config) -> Result<Keys, ConfigError> {
        let apps = load(config)?;
        Ok(Keys {
            by_app: config
                .apps
                .iter()
                .zip(&apps)
                .map(|(a, s)| (a.id.clone(), Arc::new(AppKeys::new(a, s))))
                .collect(),
        })
    }

    /// The keys of `app_id` (none for an app this adapter was not told of).
    pub fn of(&self, app_id: &str) -> Arc<AppKeys> {
        self.by_app.get(app_id).cloned().unwrap_or_default()
    }

    /// The app whose API keys include `key`, and its keys.
    pub fn app_for_key(&self, node: &Node, key: &str) -> Option<(Arc<Hub>, Arc<AppKeys>)> {
        node.hubs().find_map(|hub| {
            let keys = self.by_app.get(&hub.app.id)?;
            crate::auth::key_in(keys.effective_api_keys(), key).then(|| (hub.clone(), keys.clone()))
        })
    }
}

/// Parse and check every app's keys, in the order of `config.apps`.
pub fn load(config: &Config) -> Result<Vec<AppSettings>, ConfigError> {
    let mut out = Vec::with_capacity(config.apps.len());
    for i in 0..config.apps.len() {
        let app: AppSettings = app_keys(config, i, APP_KEYS)?;
        let k = |field: &str| format!("apps[{i}].{field}");
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
        out.push(app);
    }
    Ok(out)
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

/// `HERALD_API_KEYS` / `--api-keys`: comma-separated, as given.
fn key_list(v: &str) -> Result<toml::Value, String> {
    Ok(toml::Value::Array(
        v.split(',')
            .map(|k| toml::Value::String(k.into()))
            .collect(),
    ))
}

/// The environment variables and flags of `herald serve` for these keys.
pub static SETTINGS: &[Setting] = &[Setting {
    key: "apps[0].api_keys",
    flag: "api-keys",
    env: "HERALD_API_KEYS",
    help: "API keys of the single app, comma-separated (AppSync endpoints)",
    secret: true,
    parse: key_list,
}];

#[cfg(test)]
mod tests {
    use super::*;
    use herald_core::config::{Overrides, DEV_APP_KEY};

    fn keys(toml: &str) -> Result<Vec<AppKeys>, ConfigError> {
        let mut c = Config::from_toml(toml, "x").unwrap();
        c.apply(&Overrides::default()).unwrap();
        let apps = load(&c)?;
        Ok(c.apps
            .iter()
            .zip(&apps)
            .map(|(a, s)| AppKeys::new(a, s))
            .collect())
    }

    #[test]
    fn api_keys_and_namespaces() {
        assert_eq!(keys("").unwrap()[0].api_keys, vec![DEV_APP_KEY]);
        let k = keys(
            "[[apps]]\nid='a'\nkey='k'\nsecret='s'\napi_keys=['da2-x']\n\
             [[apps.namespaces]]\nname='chat'\npublish_keys=['backend']\n",
        )
        .unwrap();
        assert_eq!(k[0].api_keys, vec!["da2-x"]);
        assert_eq!(k[0].namespaces[0].subscribe_keys, None);
        // A configured app without API keys accepts none.
        let k = keys("[[apps]]\nid='a'\nkey='k'\nsecret='s'\n").unwrap();
        assert!(k[0].api_keys.is_empty());
        for (toml, key) in [
            ("api_keys=['has space']", "apps[0].api_keys[0]"),
            ("api_keys='one'", "apps[0].api_keys"),
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
            let err = keys(&format!("[[apps]]\nid='a'\nkey='k'\nsecret='s'\n{toml}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{toml}: {err}");
        }
    }
}
