//! TLS termination: with `tls_cert` and `tls_key`, Herald serves `wss://`
//! and `https://` on its port, and a Pusher client connects as usual.
//! The certificate in tests/fixtures is a self-signed test certificate for
//! 127.0.0.1 / localhost, used nowhere else.

mod common;

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
