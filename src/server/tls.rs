//! TLS termination (`tls_cert` + `tls_key`), for deployments without a
//! proxy in front. Handshakes run in their own tasks so one slow or hostile
//! client cannot stall the accept loop; finished streams are handed to the
//! HTTP server through a bounded queue.
//!
//! The certificate can be replaced while serving ([`Reloadable::reload`],
//! on SIGHUP): new handshakes use the new one, established connections keep
//! theirs and are not dropped.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
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

/// A listener yielding TLS streams whose handshake has completed.
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, acceptor: Reloadable) -> io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(async move {
            loop {
                let (stream, addr) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors and the like: back off, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                if tx.is_closed() {
                    break;
                }
                let acceptor = acceptor.current();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, addr)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%addr, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { rx, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept task only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
