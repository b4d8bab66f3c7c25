//! TLS termination (`tls_cert` + `tls_key`), for deployments without a
//! proxy in front. Handshakes run in each connection's own task (see
//! [`super::listener`]), bounded in time, so one slow or hostile client
//! cannot stall the accept loop.
//!
//! The certificate can be replaced while serving ([`Reloadable::reload`],
//! on SIGHUP): new handshakes use the new one, established connections keep
//! theirs and are not dropped.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Load a PEM certificate chain and private key.
pub fn acceptor(cert: &Path, key: &Path) -> io::Result<TlsAcceptor> {
    let bad = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} {}: {e}", path.display()),
        )
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad("cannot read tls_cert", cert, &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad("invalid tls_cert", cert, &e))?;
    if certs.is_empty() {
        return Err(bad("no certificate in tls_cert", cert, &"empty"));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| bad("invalid tls_key", key, &e))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| io::Error::other(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("tls_cert/tls_key: {e}"),
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The acceptor in force, replaceable while the listener runs.
#[derive(Clone)]
pub struct Reloadable(Arc<std::sync::RwLock<TlsAcceptor>>);

impl Reloadable {
    pub fn new(acceptor: TlsAcceptor) -> Reloadable {
        Reloadable(Arc::new(std::sync::RwLock::new(acceptor)))
    }

    fn current(&self) -> TlsAcceptor {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Read `cert` and `key` again and use them for new handshakes. On an
    /// error the certificate in force stays.
    pub fn reload(&self, cert: &Path, key: &Path) -> io::Result<()> {
        let fresh = acceptor(cert, key)?;
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }
}

/// Finish a client's TLS handshake, bounded by [`HANDSHAKE_TIMEOUT`];
/// `None` if it failed or took too long. Each connection's handshake runs
/// on its own task (see the listener), so a slow client stalls nobody.
pub async fn handshake<S>(acceptor: &Reloadable, io: S, addr: SocketAddr) -> Option<TlsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.current().accept(io)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            tracing::debug!(%addr, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%addr, "TLS handshake timed out");
            None
        }
    }
}
