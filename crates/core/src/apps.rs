//! The apps a node serves, and how they change while it runs.
//!
//! The registry maps keys and ids to each app's [`Hub`]. Lookups take a
//! read lock for a map lookup and an `Arc` clone: one per connection or
//! API call, never per message. A change replaces the maps whole (apps
//! change rarely; lookups never wait on one another).
//!
//! Apps come from a [`Source`]. The config file is one that knows every
//! app at once ([`Source::load`], re-read on SIGHUP); a database is one
//! that is asked per key, behind a cache, and plugs in behind the same
//! trait. Whatever the source, [`Apps::apply`] is the one place where a
//! change takes effect, so every source behaves alike:
//!
//! - a new app works at once (its first connection, its first API call);
//! - a changed app keeps its hub (its channels, members, connections) and
//!   uses its new settings for new work: a rotated secret signs from then
//!   on, new limits apply to the next connection, subscription or event;
//! - a disabled or removed app refuses new connections and API calls, and
//!   its open sessions close with their protocol's code (Pusher 4003): the
//!   hub's [`Live::closing`](crate::hub::Live::closing) signal.
//!
//! An app whose key changes is found under its new key only; its id is its
//! identity (an id that changes is one app removed and another added).

use crate::config::AppConfig;
use crate::future::BoxFuture;
use crate::hub::Hub;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Where apps come from (the config file; later, a database).
pub trait Source: Send + Sync {
    /// A short name for logs and the dashboard (`file`, `postgres`).
    fn name(&self) -> &'static str;
    /// Every app, checked (an error keeps the apps in force).
    fn load(&self) -> BoxFuture<Result<Vec<AppConfig>, String>>;
    /// Where app `id` came from, as of the last load (`file`, `postgres`):
    /// the dashboard shows it.
    fn source_of(&self, id: &str) -> &'static str {
        let _ = id;
        self.name()
    }
}

#[derive(Default)]
struct Maps {
    by_key: HashMap<String, Arc<Hub>>,
    by_id: HashMap<String, Arc<Hub>>,
}

/// What [`Apps::apply`] changed, by app id.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    /// Removed, or disabled by the change: their sessions are closing.
    pub closed: Vec<String>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.closed.is_empty()
    }
}

/// The apps of a node.
pub struct Apps {
    maps: RwLock<Arc<Maps>>,
    /// Held for a whole [`Apps::apply`]: one change at a time.
    writer: parking_lot::Mutex<()>,
    /// The node's shutdown signal: each hub's sessions watch a child of it.
    shutdown: CancellationToken,
    source: RwLock<Option<Arc<dyn Source>>>,
}

impl Apps {
    pub fn new(apps: &[AppConfig], shutdown: CancellationToken) -> Apps {
        let out = Apps {
            maps: RwLock::new(Arc::default()),
            writer: Default::default(),
            shutdown,
            source: RwLock::new(None),
        };
        out.apply(apps.to_vec());
        out
    }

    pub fn by_key(&self, key: &str) -> Option<Arc<Hub>> {
        self.maps.read().by_key.get(key).cloned()
    }

    pub fn by_id(&self, id: &str) -> Option<Arc<Hub>> {
        self.maps.read().by_id.get(id).cloned()
    }

    /// Every app now (a snapshot).
    pub fn all(&self) -> Vec<Arc<Hub>> {
        self.maps.read().by_id.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.maps.read().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Make `apps` the apps in force (see the module's doc for what each
    /// change does). The list is assumed checked (unique ids and keys).
    pub fn apply(&self, apps: Vec<AppConfig>) -> Changes {
        let mut changes = Changes::default();
        // One writer at a time: the maps' lock is held for the swap only,
        // this one for the whole change.
        let _writer = self.writer.lock();
        let old = self.maps.read().clone();
        let mut next = Maps::default();
        for app in apps {
            let id = app.id.clone();
            let hub = match old.by_id.get(&id) {
                Some(hub) => {
                    let before = hub.config();
                    if before.app != app {
                        if before.enabled && !app.enabled {
                            changes.closed.push(id.clone());
                        } else {
                            changes.changed.push(id.clone());
                        }
                        hub.set_config(app.clone(), &self.shutdown);
                    }
                    hub.clone()
                }
                None => {
                    changes.added.push(id.clone());
                    Arc::new(Hub::with_shutdown(app.clone(), &self.shutdown))
                }
            };
            next.by_key.insert(app.key.clone(), hub.clone());
            next.by_id.insert(id, hub);
        }
        for (id, hub) in &old.by_id {
            if !next.by_id.contains_key(id) {
                hub.close();
                changes.closed.push(id.clone());
            }
        }
        *self.maps.write() = Arc::new(next);
        changes
    }

    /// Where app `id` came from (`file` without a source).
    pub fn source_of(&self, id: &str) -> &'static str {
        self.source
            .read()
            .as_ref()
            .map_or("file", |s| s.source_of(id))
    }

    /// Read the apps from `source` from now on ([`Apps::reload`]).
    pub fn set_source(&self, source: Arc<dyn Source>) {
        *self.source.write() = Some(source);
    }

    /// Load the source's apps and apply them; `Ok(None)` without a
    /// source. An error (a file that does not parse, a database away)
    /// keeps the apps in force.
    pub async fn reload(&self) -> Result<Option<(&'static str, Changes)>, String> {
        let Some(source) = self.source.read().clone() else {
            return Ok(None);
        };
        let apps = source.load().await?;
        Ok(Some((source.name(), self.apply(apps))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(id: &str, key: &str) -> AppConfig {
        AppConfig {
            id: id.into(),
            key: key.into(),
            secret: "s".into(),
            ..AppConfig::default()
        }
    }

    #[test]
    fn added_changed_disabled_removed() {
        let apps = Apps::new(&[app("a", "ka"), app("b", "kb")], CancellationToken::new());
        let a = apps.by_key("ka").unwrap();
        let a_closing = a.config().closing.clone();
        let b_closing = apps.by_id("b").unwrap().config().closing.clone();
        let mut a2 = app("a", "ka2");
        a2.secret = "rotated".into();
        let changes = apps.apply(vec![a2, app("c", "kc")]);
        assert_eq!(changes.added, ["c"]);
        assert_eq!(changes.changed, ["a"]);
        assert_eq!(changes.closed, ["b"]);
        assert!(apps.by_key("ka").is_none() && apps.by_key("kb").is_none());
        let same = apps.by_key("ka2").unwrap();
        assert!(Arc::ptr_eq(&a, &same), "a changed app keeps its hub");
        assert_eq!(a.config().secret, "rotated");
        assert!(!a_closing.is_cancelled() && b_closing.is_cancelled());
        let mut off = app("a", "ka2");
        off.enabled = false;
        let changes = apps.apply(vec![off, app("c", "kc")]);
        assert_eq!(changes.closed, ["a"]);
        assert!(a_closing.is_cancelled() && a.admit().is_err());
        apps.apply(vec![app("a", "ka2")]);
        assert!(!a.config().closing.is_cancelled() && a.admit().is_ok());
        assert!(apps.apply(vec![app("a", "ka2")]).is_empty());
        assert_eq!(apps.len(), 1);
    }

    #[test]
    fn the_nodes_shutdown_reaches_every_app() {
        let shutdown = CancellationToken::new();
        let apps = Apps::new(&[app("a", "ka")], shutdown.clone());
        apps.apply(vec![app("a", "ka"), app("b", "kb")]);
        shutdown.cancel();
        for hub in apps.all() {
            assert!(hub.config().closing.is_cancelled());
        }
    }
}
