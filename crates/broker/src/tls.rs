//! The broker's own TLS settings: `broker.tls_ca` (the authorities to
//! trust for the broker's certificate) and `broker.tls_cert` +
//! `broker.tls_key` (a client certificate, for servers that require one:
//! Redis's default `tls-auth-clients yes`, `nats-server --tlsverify`).
//!
//! Read and checked once, at start ([`BrokerTls::load`]): each file read
//! (at most [`MAX_PEM`] bytes), its PEM parsed, the key matched to the
//! certificate, and the URL required to be a TLS one (`rediss://`,
//! `rediss-sentinel://`, `rediss-cluster://`, `tls://`: a certificate given
//! for a plain connection is a mistake, not something to ignore). What was
//! checked is what every connection to the broker then uses: the engine's,
//! history and sessions', the sentinels' and the master's, every node of a
//! Redis Cluster, the ingress's, JetStream's.
//!
//! `tls_ca` *replaces* the system's authorities for the broker (it is not
//! added to them): both clients do so with a given root (the redis crate's
//! `TlsCertificates::root_cert`, async-nats's root certificates), as
//! `redis-cli --cacert` and `nats --tlsca` do, and a broker with a private
//! authority should be trusted through it alone, not also through any
//! public authority that would certify its name. Without `tls_ca` the
//! system's authorities apply (or those of the file `SSL_CERT_FILE` names,
//! for the whole process).
//!
//! Errors name the setting and the file, never what the key file holds.

use async_nats::rustls;
use herald_core::config::BrokerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;

/// Largest PEM file read for one setting (a CA bundle of the public
/// authorities is about 200 KiB).
pub const MAX_PEM: u64 = 1 << 20;

/// The broker's TLS material, checked. Cheap to clone.
#[derive(Clone)]
pub struct BrokerTls(Arc<Inner>);

struct Inner {
    /// `tls_ca`'s PEM, as read.
    ca: Option<Vec<u8>>,
    /// `tls_cert`'s and `tls_key`'s PEM, as read.
    client: Option<(Vec<u8>, Vec<u8>)>,
    /// The whole client configuration for NATS (built here so that a
    /// certificate the client could not use fails at start).
    nats: Option<rustls::ClientConfig>,
}

impl std::fmt::Debug for BrokerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerTls")
            .field("ca", &self.0.ca.is_some())
            .field("client_certificate", &self.0.client.is_some())
            .finish()
    }
}

impl BrokerTls {
    /// The settings of `config`, read and checked; `None` when none is set.
    pub fn load(config: &BrokerConfig) -> Result<Option<BrokerTls>, String> {
        let (ca, cert, key) = (
            config.tls_ca.as_deref(),
            config.tls_cert.as_deref(),
            config.tls_key.as_deref(),
        );
        let named = match (ca, cert, key) {
            (None, None, None) => return Ok(None),
            (_, Some(_), None) => {
                return Err("broker.tls_key is required with broker.tls_cert".into())
            }
            (_, None, Some(_)) => {
                return Err("broker.tls_cert is required with broker.tls_key".into())
            }
            (Some(_), _, _) => "broker.tls_ca",
            (None, _, _) => "broker.tls_cert",
        };
        let nats = tls_url(&config.url).map_err(|why| {
            format!(
                "{named} needs a TLS broker.url (rediss://, rediss-sentinel://, \
                 rediss-cluster:// or tls://); broker.url {:?} {why}",
                config.shown_url()
            )
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let mut roots = rustls::RootCertStore::empty();
        let ca = match ca {
            Some(path) => {
                let pem = read("broker.tls_ca", path)?;
                for c in certificates("broker.tls_ca", path, &pem)? {
                    roots.add(c).map_err(|e| {
                        format!("broker.tls_ca {}: not a usable authority: {e}", shown(path))
                    })?;
                }
                Some(pem)
            }
            None => {
                if nats {
                    // What async-nats itself would trust without a root.
                    let found = rustls_native_certs::load_native_certs();
                    roots.add_parsable_certificates(found.certs);
                }
                None
            }
        };
        let builder = builder.with_root_certificates(roots);
        let (client, config) = match (cert, key) {
            (Some(cert), Some(key)) => {
                let cert_pem = read("broker.tls_cert", cert)?;
                let chain = certificates("broker.tls_cert", cert, &cert_pem)?;
                let key_pem = read("broker.tls_key", key)?;
                // The parser's message could quote the file: not shown.
                let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| {
                    format!(
                        "broker.tls_key {}: no PEM private key (PKCS#8, PKCS#1 or SEC1) in it",
                        shown(key)
                    )
                })?;
                let config =
                    builder
                        .with_client_auth_cert(chain, private)
                        .map_err(|e| match e {
                            rustls::Error::InconsistentKeys(_) => format!(
                                "broker.tls_key {} is not the key of broker.tls_cert {}",
                                shown(key),
                                shown(cert)
                            ),
                            e => format!("broker.tls_cert and broker.tls_key: {e}"),
                        })?;
                (Some((cert_pem, key_pem)), config)
            }
            _ => (None, builder.with_no_client_auth()),
        };
        Ok(Some(BrokerTls(Arc::new(Inner {
            ca,
            client,
            nats: nats.then_some(config),
        }))))
    }

    /// For the redis crate (`Client::build_with_tls`, the cluster
    /// builder's `certs`, the sentinel builder's certificates).
    pub fn redis(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .0
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.0.ca.clone(),
        }
    }

    /// `client` over `certs`'s TLS settings (a `rediss://` connection
    /// info; anything else is refused at start).
    pub fn redis_client(
        tls: Option<&BrokerTls>,
        info: redis::ConnectionInfo,
    ) -> Result<redis::Client, String> {
        match tls {
            None => redis::Client::open(info),
            Some(t) => redis::Client::build_with_tls(info, t.redis()),
        }
        .map_err(|e| e.to_string())
    }

    /// The NATS client configuration (a `tls://` URL only).
    pub(crate) fn nats_config(&self) -> Option<rustls::ClientConfig> {
        self.0.nats.clone()
    }

    /// NATS options with these settings: TLS required, this client
    /// configuration (for a Redis URL: unchanged).
    pub fn nats(
        tls: Option<&BrokerTls>,
        options: async_nats::ConnectOptions,
    ) -> async_nats::ConnectOptions {
        match tls.and_then(|t| t.0.nats.clone()) {
            Some(config) => options.require_tls(true).tls_client_config(config),
            None => options,
        }
    }
}

/// Whether `url` is a TLS URL: `Ok(true)` for NATS, `Ok(false)` for
/// Redis; why not otherwise.
fn tls_url(url: &str) -> Result<bool, String> {
    if ["rediss://", "rediss-sentinel://", "rediss-cluster://"]
        .iter()
        .any(|s| url.starts_with(s))
    {
        return Ok(false);
    }
    if url.starts_with("nats://") || url.starts_with("tls://") {
        let servers = crate::urls::nats_servers(url)?;
        return match servers.iter().position(|s| s.scheme() != "tls") {
            None => Ok(true),
            Some(i) => Err(format!(
                "has nats:// for server {} (write tls:// so that TLS is required)",
                i + 1
            )),
        };
    }
    Err("is not one".into())
}

fn shown(path: &str) -> String {
    format!("{path:?}")
}

/// The file at `path`, at most [`MAX_PEM`] bytes.
fn read(setting: &str, path: &str) -> Result<Vec<u8>, String> {
    let cannot = |e: &dyn std::fmt::Display| format!("{setting} {}: cannot read: {e}", shown(path));
    let meta = std::fs::metadata(Path::new(path)).map_err(|e| cannot(&e))?;
    if !meta.is_file() {
        return Err(cannot(&"not a file"));
    }
    if meta.len() > MAX_PEM {
        return Err(cannot(&format!("larger than {MAX_PEM} bytes")));
    }
    std::fs::read(path).map_err(|e| cannot(&e))
}

/// The certificates of a PEM file (other sections skipped); at least one.
fn certificates(
    setting: &str,
    path: &str,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{setting} {}: not a PEM file: {e}", shown(path)))?;
    if certs.is_empty() {
        return Err(format!(
            "{setting} {}: no certificate (-----BEGIN CERTIFICATE-----) in it",
            shown(path)
        ));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        format!("{}/../../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
    }

    fn config(url: &str, ca: Option<&str>, cert: Option<&str>, key: Option<&str>) -> BrokerConfig {
        BrokerConfig {
            url: url.into(),
            tls_ca: ca.map(fixture),
            tls_cert: cert.map(fixture),
            tls_key: key.map(fixture),
            ..BrokerConfig::default()
        }
    }

    #[test]
    fn none_set_is_none() {
        assert!(BrokerTls::load(&config("redis://a:1", None, None, None))
            .unwrap()
            .is_none());
    }

    #[test]
    fn good_settings_load() {
        for url in [
            "rediss://127.0.0.1:6380",
            "rediss-cluster://127.0.0.1:7000",
            "rediss-sentinel://127.0.0.1:26379/m",
            "tls://127.0.0.1:4222",
        ] {
            let t = BrokerTls::load(&config(
                url,
                Some("broker-ca.pem"),
                Some("broker-client-cert.pem"),
                Some("broker-client-key.pem"),
            ))
            .unwrap()
            .unwrap();
            let r = t.redis();
            assert!(r.client_tls.is_some() && r.root_cert.is_some(), "{url}");
            assert_eq!(t.0.nats.is_some(), url.starts_with("tls://"), "{url}");
            // Nothing of the files in its Debug form.
            assert!(!format!("{t:?}").contains("BEGIN"));
        }
        let ca_only = config("rediss://a:1", Some("broker-ca.pem"), None, None);
        let t = BrokerTls::load(&ca_only).unwrap().unwrap();
        assert!(t.redis().client_tls.is_none());
    }

    #[test]
    fn bad_settings_are_named() {
        let err = |c: BrokerConfig| BrokerTls::load(&c).unwrap_err();
        let e = err(config("redis://a:1", Some("broker-ca.pem"), None, None));
        assert!(e.starts_with("broker.tls_ca needs a TLS broker.url"), "{e}");
        let e = err(config(
            "nats://a:1",
            None,
            Some("broker-client-cert.pem"),
            Some("broker-client-key.pem"),
        ));
        assert!(
            e.starts_with("broker.tls_cert needs a TLS") && e.contains("tls://"),
            "{e}"
        );
        let e = err(config("local", Some("broker-ca.pem"), None, None));
        assert!(e.contains("TLS broker.url"), "{e}");
        let e = err(config(
            "rediss://a:1",
            None,
            Some("broker-client-cert.pem"),
            None,
        ));
        assert_eq!(e, "broker.tls_key is required with broker.tls_cert");
        let e = err(config(
            "rediss://a:1",
            None,
            None,
            Some("broker-client-key.pem"),
        ));
        assert_eq!(e, "broker.tls_cert is required with broker.tls_key");
        let e = err(config("rediss://a:1", Some("no-such.pem"), None, None));
        assert!(
            e.starts_with("broker.tls_ca ") && e.contains("cannot read"),
            "{e}"
        );
        // A key where a certificate should be: no certificate in it.
        let e = err(config(
            "rediss://a:1",
            Some("broker-client-key.pem"),
            None,
            None,
        ));
        assert!(e.contains("no certificate"), "{e}");
        // A certificate where the key should be; the key file not quoted.
        let e = err(config(
            "rediss://a:1",
            None,
            Some("broker-client-cert.pem"),
            Some("broker-client-cert.pem"),
        ));
        assert!(
            e.starts_with("broker.tls_key ") && e.contains("no PEM private key"),
            "{e}"
        );
        // Another certificate's key.
        let e = err(config(
            "rediss://a:1",
            None,
            Some("broker-client-cert.pem"),
            Some("broker-server-key.pem"),
        ));
        assert!(
            e.starts_with("broker.tls_key ") && e.contains("is not the key of"),
            "{e}"
        );
        assert!(!e.contains("BEGIN"), "{e}");
    }
}
