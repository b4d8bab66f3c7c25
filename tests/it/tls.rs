//! TLS termination: with `tls_cert` and `tls_key`, Herald serves `wss://`
//! and `https://` on its port, and a Pusher client connects as usual.
//! The certificate in tests/fixtures is a self-signed test certificate for
//! 127.0.0.1 / localhost, used nowhere else.

use crate::common;

use futures_util::StreamExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn connector() -> TlsConnector {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(fixture("tls-test-cert.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

async fn tls_connect(port: u16) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    connector().connect(name, tcp).await
}

#[tokio::test]
async fn serves_wss_and_https_with_the_configured_certificate() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("herald-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("herald.toml");
    std::fs::write(
        &config,
        format!(
            "host = \"127.0.0.1\"\nport = {port}\nlog = \"warn\"\ntls_cert = {:?}\ntls_key = {:?}\n",
            fixture("tls-test-cert.pem").display().to_string(),
            fixture("tls-test-key.pem").display().to_string()
        ),
    )
    .unwrap();
    let mut child = common::herald_command()
        .args(["serve", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();

    // Wait until an HTTPS /ready answers 200.
    let deadline = Instant::now() + Duration::from_secs(15);
    let ready = loop {
        if let Ok(mut tls) = tls_connect(port).await {
            tls.write_all(b"GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut response = String::new();
            let _ = tls.read_to_string(&mut response).await;
            if response.starts_with("HTTP/1.1 200") {
                break true;
            }
        }
        if Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        ready,
        "herald never answered https://127.0.0.1:{port}/ready"
    );

    let tls = tls_connect(port).await.unwrap();
    let url = format!("wss://127.0.0.1:{port}/app/app-key?protocol=7");
    let (mut ws, _) = tokio_tungstenite::client_async(url, tls).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("connection_established in time")
        .unwrap()
        .unwrap();
    let text = first.into_text().unwrap();
    assert!(text.contains("pusher:connection_established"), "{text}");

    // A plain-text client gets no HTTP answer from a TLS port.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    plain
        .write_all(b"GET /up HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(15), plain.read(&mut buf))
        .await
        .map(|r| r.unwrap_or(0))
        .unwrap_or(0);
    assert!(!String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));

    child.kill().unwrap();
    let _ = child.wait();
}

#[test]
fn tls_cert_without_key_is_a_named_config_error() {
    let dir = std::env::temp_dir().join(format!("herald-tls-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("herald.toml");
    std::fs::write(&config, "tls_cert = \"/nonexistent.pem\"\n").unwrap();
    // An occupied port and a deadline: accepted by mistake, it fails fast.
    let (_occupied, port) = common::occupied_port();
    let out = common::output_within(
        common::herald_command()
            .args(["serve", "--config"])
            .arg(&config)
            .env_remove("HERALD_CONFIG")
            .env("HERALD_HOST", "127.0.0.1")
            .env("HERALD_PORT", port.to_string()),
        common::TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tls_key"), "{err}");
}

#[test]
fn tls_env_variables_are_read() {
    // HERALD_TLS_KEY alone: the error names the missing tls_cert, which
    // shows the variable reached the configuration.
    let (_occupied, port) = common::occupied_port();
    let out = common::output_within(
        common::herald_command()
            .arg("serve")
            .env("HERALD_TLS_KEY", fixture("tls-test-key.pem"))
            .env_remove("HERALD_TLS_CERT")
            .env_remove("HERALD_CONFIG")
            .env("HERALD_HOST", "127.0.0.1")
            .env("HERALD_PORT", port.to_string()),
        common::TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tls_cert"), "{err}");
}

fn connector_trusting(cert: &str) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(fixture(cert)).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

/// Whether a TLS handshake trusting only `cert` succeeds.
async fn handshake_trusting(port: u16, cert: &str) -> bool {
    let Ok(tcp) = TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let name = ServerName::try_from("127.0.0.1").unwrap();
    matches!(
        tokio::time::timeout(
            Duration::from_secs(5),
            connector_trusting(cert).connect(name, tcp)
        )
        .await,
        Ok(Ok(_))
    )
}

/// A child process killed when dropped, so a failing test leaves no server
/// behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// SIGHUP reloads the certificate: new handshakes get the new one, an
/// established connection keeps working, and a broken file keeps the
/// certificate in force.
#[tokio::test]
async fn sighup_reloads_the_certificate_without_dropping_connections() {
    use futures_util::SinkExt;
    let dir = std::env::temp_dir().join(format!("herald-tls-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::copy(fixture("tls-test-cert.pem"), &cert).unwrap();
    std::fs::copy(fixture("tls-test-key.pem"), &key).unwrap();
    let mut started = None;
    for _ in 0..5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.join("herald.toml");
        std::fs::write(
            &config,
            format!(
                "host = \"127.0.0.1\"\nport = {port}\nlog = \"warn\"\ntls_cert = {:?}\ntls_key = {:?}\n",
                cert.display().to_string(),
                key.display().to_string()
            ),
        )
        .unwrap();
        // The log tells when the failed reload below has run.
        let log = std::fs::File::create(dir.join("herald.log")).unwrap();
        let mut child = common::herald_command()
            .args(["serve", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline && !handshake_trusting(port, "tls-test-cert.pem").await {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if handshake_trusting(port, "tls-test-cert.pem").await {
            started = Some((child, port));
            break;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    let (child, port) = started.expect("herald serving TLS");
    let mut child = KillOnDrop(child);
    let pid = child.0.id() as i32;

    // A connection made with the first certificate.
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let tls = connector_trusting("tls-test-cert.pem")
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let url = format!("wss://127.0.0.1:{port}/app/app-key?protocol=7");
    let (mut ws, _) = tokio_tungstenite::client_async(url, tls).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(first
        .into_text()
        .unwrap()
        .contains("connection_established"));

    // Renew: new files, SIGHUP.
    std::fs::copy(fixture("tls-test-cert-2.pem"), &cert).unwrap();
    std::fs::copy(fixture("tls-test-key-2.pem"), &key).unwrap();
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !handshake_trusting(port, "tls-test-cert-2.pem").await {
        assert!(
            Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !handshake_trusting(port, "tls-test-cert.pem").await,
        "the old one is gone"
    );

    // The established connection still works.
    ws.send(tokio_tungstenite::tungstenite::Message::text(
        r#"{"event":"pusher:ping","data":{}}"#,
    ))
    .await
    .unwrap();
    let pong = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("pong in time")
        .unwrap()
        .unwrap();
    assert!(pong.into_text().unwrap().contains("pusher:pong"));

    // A broken file: the reload fails and the certificate in force stays.
    std::fs::write(&cert, "not a certificate").unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    // Wait until the reload has run (and failed), so what follows checks
    // its outcome rather than the time before it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let failed = |log: &str| log.contains("TLS certificate reload failed");
    while !failed(&std::fs::read_to_string(dir.join("herald.log")).unwrap_or_default()) {
        assert!(
            Instant::now() < deadline,
            "the failed reload was never logged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(handshake_trusting(port, "tls-test-cert-2.pem").await);
    assert!(child.0.try_wait().unwrap().is_none(), "still running");
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}
