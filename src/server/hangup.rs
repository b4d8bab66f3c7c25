//! SIGHUP: reload what can be reloaded, say what was, never exit.
//!
//! Operators send HUP out of habit (log rotation, `systemctl reload`) and
//! docs/deploy.md asks them to for a renewed certificate, so the signal's
//! default disposition (end the process, exit 129, no drain) must never
//! apply: the handler is installed at the very start of serving, whatever
//! the configuration. A HUP reloads the apps (the config file's
//! `[[apps]]` with the environment and flags over them, checked as at
//! start; see `herald_core::apps` for what a change does) and the TLS
//! certificate and key (when `tls_cert` is set). Other settings need a
//! restart.

use super::tls;
use herald_core::node::Node;
use std::path::PathBuf;
use std::sync::Arc;

/// What a SIGHUP reloads.
#[derive(Default)]
pub struct Reloads {
    /// The TLS acceptor and the files it is read from.
    pub tls: Option<(tls::Reloadable, PathBuf, PathBuf)>,
    /// The node whose apps are re-read from their source.
    pub node: Option<Arc<Node>>,
}

impl Reloads {
    /// Reload everything once, logging each outcome.
    async fn reload(&self) {
        let mut reloaded = Vec::new();
        if let Some(node) = &self.node {
            match node.apps.reload().await {
                Ok(Some((source, changes))) => {
                    tracing::info!(
                        source,
                        added = ?changes.added,
                        changed = ?changes.changed,
                        closed = ?changes.closed,
                        "apps reloaded"
                    );
                    reloaded.push("apps");
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(error = %e, "apps reload failed; keeping the apps in force")
                }
            }
        }
        if let Some((acceptor, cert, key)) = &self.tls {
            match acceptor.reload(cert, key) {
                Ok(()) => {
                    tracing::info!(cert = %cert.display(), "TLS certificate reloaded");
                    reloaded.push("tls certificate");
                }
                Err(e) => {
                    tracing::error!(error = %e, "TLS certificate reload failed; keeping the current one")
                }
            }
        }
        if reloaded.is_empty() {
            tracing::info!("SIGHUP: nothing reloaded; still serving");
        } else {
            tracing::info!(reloaded = ?reloaded, "SIGHUP: reloaded; still serving");
        }
    }
}

/// The SIGHUP handler, installed by [`Hangup::install`]; the reloads are
/// given later, once they exist ([`Hangup::serve`]). Signals that arrive in
/// between are kept by the handler and acted on then.
pub struct Hangup {
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
}

impl Hangup {
    /// Take over SIGHUP now (inside the runtime), so that from here on it
    /// never ends the process.
    pub fn install() -> Hangup {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let hup = match signal(SignalKind::hangup()) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGHUP: nothing will reload");
                    None
                }
            };
            Hangup { hup }
        }
        #[cfg(not(unix))]
        Hangup {}
    }

    /// Act on every SIGHUP from now on: reload `reloads`.
    pub fn serve(self, reloads: Reloads) {
        #[cfg(unix)]
        if let Some(mut hup) = self.hup {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    reloads.reload().await;
                }
            });
        }
        #[cfg(not(unix))]
        let _ = reloads;
    }
}
