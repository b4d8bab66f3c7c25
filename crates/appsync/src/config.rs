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

use crate::auth_modes::{AppAuth, Mode, ProviderConfig};

/// The keys of an app this adapter owns.
pub const APP_KEYS: &[&str] = &[
    "api_keys",
    "namespaces",
    "auth_providers",
    "connection_auth_modes",
    "default_publish_auth_modes",
    "default_subscribe_auth_modes",
    "hosts",
];

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
    /// Authorization modes besides API keys (`crate::auth_modes`).
    pub auth_providers: Vec<ProviderConfig>,
    /// Modes allowed to connect (unset: every mode the app has).
    pub connection_auth_modes: Option<Vec<Mode>>,
    /// Modes allowed to publish where a namespace does not say (unset: all).
    pub default_publish_auth_modes: Option<Vec<Mode>>,
    /// Modes allowed to subscribe where a namespace does not say (unset: all).
    pub default_subscribe_auth_modes: Option<Vec<Mode>>,
    /// Host names that select this app for requests without an API key.
    pub hosts: Vec<String>,
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
    /// Modes allowed to publish here (`None`: the app's default).
    pub publish_auth_modes: Option<Vec<Mode>>,
    /// Modes allowed to subscribe here (`None`: the app's default).
    pub subscribe_auth_modes: Option<Vec<Mode>>,
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
    /// Modes besides API keys, when the app has `auth_providers`.
    pub auth: Arc<AppAuth>,
}

impl AppKeys {
    pub fn new(app: &AppConfig, settings: &AppSettings) -> AppKeys {
        let api_keys = if settings.api_keys.is_empty() && app.is_development() {
            vec![app.key.clone()]
        } else {
            settings.api_keys.clone()
        };
        let auth = AppAuth::new(
            &app.id,
            &settings.auth_providers,
            [
                &settings.connection_auth_modes,
                &settings.default_publish_auth_modes,
                &settings.default_subscribe_auth_modes,
            ],
            &settings.hosts,
            !api_keys.is_empty(),
        );
        AppKeys {
            api_keys,
            namespaces: settings.namespaces.clone(),
            auth: Arc::new(auth),
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
    // Every error at once (see herald_core's ConfigError::all).
    let mut errors = Vec::new();
    let mut out = Vec::with_capacity(config.apps.len());
    for i in 0..config.apps.len() {
        let app: AppSettings = match app_keys(config, i, APP_KEYS) {
            Ok(app) => app,
            Err(e) => {
                errors.push(e);
                AppSettings::default()
            }
        };
        let k = |field: &str| format!("apps[{i}].{field}");
        for (j, key) in app.api_keys.iter().enumerate() {
            errors.extend(check_api_key(&k(&format!("api_keys[{j}]")), key).err());
        }
        let mut names = std::collections::HashSet::new();
        for (j, ns) in app.namespaces.iter().enumerate() {
            let field = |f: &str| k(&format!("namespaces[{j}].{f}"));
            if !is_namespace_name(&ns.name) {
                errors.push(invalid(
                    field("name"),
                    "must be 1-50 characters of A-Z, a-z, 0-9 and '-'",
                ));
            } else if !names.insert(&ns.name) {
                errors.push(invalid(
                    field("name"),
                    format!("duplicates namespace {:?}", ns.name),
                ));
            }
            for (f, keys) in [
                ("publish_keys", &ns.publish_keys),
                ("subscribe_keys", &ns.subscribe_keys),
            ] {
                for (n, key) in keys.iter().flatten().enumerate() {
                    errors.extend(check_api_key(&field(&format!("{f}[{n}]")), key).err());
                }
            }
        }
        let at = format!("apps[{i}]");
        let has_keys = !app.api_keys.is_empty() || config.apps[i].is_development();
        let checked = crate::auth_modes::check(
            &at,
            &app.auth_providers,
            [
                ("connection_auth_modes", &app.connection_auth_modes),
                (
                    "default_publish_auth_modes",
                    &app.default_publish_auth_modes,
                ),
                (
                    "default_subscribe_auth_modes",
                    &app.default_subscribe_auth_modes,
                ),
            ],
            &app.namespaces,
            &app.hosts,
            has_keys,
        );
        errors.extend(checked.err());
        out.push(app);
    }
    errors.extend(one_app_per_key(config, &out).err());
    // A host picks one app for requests without an API key.
    let mut hosts: HashMap<String, usize> = HashMap::new();
    for (i, app) in out.iter().enumerate() {
        for (j, h) in app.hosts.iter().enumerate() {
            if let Some(other) = hosts.insert(h.to_ascii_lowercase(), i) {
                if other != i {
                    errors.push(invalid(
                        format!("apps[{i}].hosts[{j}]"),
                        format!("{h:?} is also apps[{other}]'s: a host picks one app"),
                    ));
                }
            }
        }
    }
    ConfigError::all(errors).map(|()| out)
}

/// Every key an app names (its API keys in force, its namespaces' key
/// lists), with where it is set.
fn places(i: usize, app: &AppConfig, settings: &AppSettings) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = if settings.api_keys.is_empty() && app.is_development() {
        vec![(format!("apps[{i}].key"), app.key.clone())]
    } else {
        let keys = settings.api_keys.iter().enumerate();
        keys.map(|(j, k)| (format!("apps[{i}].api_keys[{j}]"), k.clone()))
            .collect()
    };
    for (j, ns) in settings.namespaces.iter().enumerate() {
        for (f, keys) in [
            ("publish_keys", &ns.publish_keys),
            ("subscribe_keys", &ns.subscribe_keys),
        ] {
            for (n, key) in keys.iter().flatten().enumerate() {
                out.push((format!("apps[{i}].namespaces[{j}].{f}[{n}]"), key.clone()));
            }
        }
    }
    out
}

/// An AppSync key selects one app, as a Pusher key does: the HTTP publish
/// endpoints find the app by the key, so a key of two apps would put one
/// tenant's clients in the other's channels (and a namespace naming
/// another app's key would let that app's clients publish there). Refused
/// naming where the key is set in both apps, never the key (a secret).
/// Every source of apps goes through here.
fn one_app_per_key(config: &Config, apps: &[AppSettings]) -> Result<(), ConfigError> {
    let mut first: HashMap<String, (usize, String)> = HashMap::new();
    for (i, (app, settings)) in config.apps.iter().zip(apps).enumerate() {
        for (place, key) in places(i, app, settings) {
            match first.get(&key) {
                Some((owner, other)) if *owner != i => {
                    return Err(invalid(
                        place,
                        format!("is the key {other} has: an AppSync key belongs to one app (give each app its own)"),
                    ));
                }
                Some(_) => {}
                None => {
                    first.insert(key, (i, place));
                }
            }
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
    fn auth_modes_are_parsed_and_checked() {
        let app = "[[apps]]\nid='a'\nkey='k'\nsecret='s'\napi_keys=['da2-x']\n";
        let iam = "[[apps.auth_providers]]\ntype='AWS_IAM'\n\
                   access_keys=[{access_key_id='AK', secret_access_key='SK'}]\n";
        let k = keys(&format!(
            "{app}default_publish_auth_modes=['AWS_IAM']\nhosts=['rt.example.com']\n{iam}\
             [[apps.auth_providers]]\ntype='OPENID_CONNECT'\nissuer='https://i.example'\n"
        ))
        .unwrap();
        assert!(k[0].auth.configured);
        assert_eq!(k[0].auth.hosts, ["rt.example.com"]);
        // No providers: API keys alone, as before.
        assert!(!keys(app).unwrap()[0].auth.configured);
        for (extra, field) in [
            // A mode the app does not have.
            (
                "connection_auth_modes=['AWS_LAMBDA']\n",
                "apps[0].connection_auth_modes",
            ),
            (
                "default_subscribe_auth_modes=[]\n",
                "apps[0].default_subscribe_auth_modes",
            ),
            ("hosts=['a b']\n", "apps[0].hosts[0]"),
        ] {
            let err = keys(&format!("{app}{extra}{iam}")).unwrap_err().to_string();
            assert!(err.contains(field), "{extra}: {err}");
        }
        for (provider, field) in [
            (
                "type='AWS_LAMBDA'\nauthorizer_url='ftp://x'",
                "authorizer_url",
            ),
            (
                "type='AWS_LAMBDA'\nauthorizer_url='http://x'\nidentity_validation_expression='('",
                "identity_validation_expression",
            ),
            (
                "type='OPENID_CONNECT'\nissuer='https://i'\njwks_file='/no/such/file'",
                "jwks_file",
            ),
            (
                "type='AMAZON_COGNITO_USER_POOLS'\nuser_pool_id='nopool'",
                "user_pool_id",
            ),
            ("type='AWS_IAM'\naccess_keys=[]", "access_keys"),
            (
                "type='OPENID_CONNECT'\nissuer='https://i'\nclient='x'",
                "client",
            ),
            ("type='NOPE'", "auth_providers"),
        ] {
            let err = keys(&format!("{app}[[apps.auth_providers]]\n{provider}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(field), "{provider}: {err}");
        }
        // A host names one app.
        let two = format!(
            "{app}hosts=['h']\n{iam}[[apps]]\nid='b'\nkey='k2'\nsecret='s'\napi_keys=['da2-y']\nhosts=['H']\n"
        );
        assert!(keys(&two)
            .unwrap_err()
            .to_string()
            .contains("apps[1].hosts[0]"));
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

    #[test]
    fn a_key_belongs_to_one_app() {
        let a = "[[apps]]\nid='a'\nkey='ka'\nsecret='s'\napi_keys=['x','y']\n";
        let b = "[[apps]]\nid='b'\nkey='kb'\nsecret='s'\n";
        for (toml, named, other) in [
            (
                format!("{a}{b}api_keys=['y']"),
                "apps[1].api_keys[0]",
                "apps[0].api_keys[1]",
            ),
            (
                format!(
                    "{a}{b}api_keys=['z']\n[[apps.namespaces]]\nname='n'\nsubscribe_keys=['z','x']"
                ),
                "apps[1].namespaces[0].subscribe_keys[1]",
                "apps[0].api_keys[0]",
            ),
            (
                format!("{a}[[apps.namespaces]]\nname='n'\npublish_keys=['p']\n{b}api_keys=['p']"),
                "apps[1].api_keys[0]",
                "apps[0].namespaces[0].publish_keys[0]",
            ),
            // The development credentials' key is an API key too.
            (
                format!(
                    "[[apps]]\nid='d'\nkey='dev'\nsecret='{}'\n{b}api_keys=['dev']",
                    herald_core::config::DEV_APP_SECRET
                ),
                "apps[1].api_keys[0]",
                "apps[0].key",
            ),
        ] {
            let err = keys(&toml).unwrap_err().to_string();
            assert!(err.contains(named) && err.contains(other), "{toml}: {err}");
            assert!(!err.contains("'y'") && !err.contains("\"y\""), "{err}");
        }
        // Within one app a key may be named again (API key and namespace).
        keys(&format!(
            "{a}[[apps.namespaces]]\nname='n'\npublish_keys=['x','x']\n{b}api_keys=['b']"
        ))
        .unwrap();
    }
}
