//! Why a NATS server refuses the node's TLS, in words: async-nats reports
//! a failed connection as its error's kind only ("IO error", "TLS error"),
//! the cause (a certificate the server requires and was not given, an
//! authority that does not sign the server's certificate) dropped. With
//! the broker's TLS settings in use, the engine's first failure of an
//! outage runs this once: the NATS greeting read, the TLS handshake made
//! with the same client configuration, a `PING` sent (TLS 1.3 servers
//! refuse a client certificate only after the handshake, on the first
//! read), and rustls's own error returned for the log.

use crate::tls::BrokerTls;
use async_nats::ServerAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The whole probe's bound.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Longest greeting (`INFO {…}`) or answer line read.
const MAX_LINE: u64 = 64 * 1024;

/// What happened trying `server` with `tls`: the error, or that the
/// handshake and a `PING` went through when tried alone.
pub async fn probe(tls: &BrokerTls, server: &ServerAddr) -> String {
    match tokio::time::timeout(TIMEOUT, attempt(tls, server)).await {
        Ok(Ok(())) => "a TLS handshake and PING alone succeed".into(),
        Ok(Err(e)) => e,
        Err(_) => "the TLS probe timed out".into(),
    }
}

async fn attempt(tls: &BrokerTls, server: &ServerAddr) -> Result<(), String> {
    let config = tls.nats_config().ok_or("no TLS configuration")?;
    let tcp = TcpStream::connect((server.host(), server.port()))
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let mut plain = BufReader::new(tcp);
    let mut line = Vec::new();
    (&mut plain)
        .take(MAX_LINE)
        .read_until(b'\n', &mut line)
        .await
        .map_err(|e| format!("no greeting: {e}"))?;
    if !line.starts_with(b"INFO ") {
        return Err("not a NATS server (no INFO greeting)".into());
    }
    let name = async_nats::rustls::pki_types::ServerName::try_from(server.host().to_owned())
        .map_err(|e| format!("server name: {e}"))?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, plain.into_inner())
        .await
        .map_err(|e| format!("TLS handshake: {e}"))?;
    let mut stream = BufReader::new(stream);
    stream
        .get_mut()
        .write_all(b"CONNECT {\"verbose\":false,\"tls_required\":true}\r\nPING\r\n")
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    line.clear();
    (&mut stream)
        .take(MAX_LINE)
        .read_until(b'\n', &mut line)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    if line.starts_with(b"-ERR") {
        return Err(String::from_utf8_lossy(&line).trim().to_owned());
    }
    if line.is_empty() {
        return Err("the server closed the connection after the handshake".into());
    }
    Ok(())
}
