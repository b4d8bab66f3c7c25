//! `rediss-cluster://` and `rediss-sentinel://` against real TLS-only
//! servers (`redis-server --port 0 --tls-port …`, the cluster bus and
//! replication over TLS too; sentinels on TLS): two `herald serve` nodes
//! trust the test certificate through `SSL_CERT_FILE` (the redis client's
//! rustls reads the system's authorities, which that variable replaces),
//! become ready, and a publication on one node reaches a client of the
//! other exactly once. A node that trusts another certificate never
//! connects: the certificates are checked.

mod common;

use common::{Client, Server, TIMEOUT};
use herald_broker::testing::{RedisCluster, Tls};
use herald_broker::testing_sentinel::RedisSentinel;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The self-signed test certificate for 127.0.0.1 (tests/tls.rs's).
fn tls() -> Tls {
    Tls {
        cert: fixture("tls-test-cert.pem"),
        key: fixture("tls-test-key.pem"),
    }
}

/// Two nodes on `url`, trusting the test certificate.
async fn nodes(url: &str, prefix: &str) -> Vec<Server> {
    let top = format!("[broker]\nurl = \"{url}\"\nprefix = \"{prefix}\"\nttl = 60\n");
    let cert = tls().cert.display().to_string();
    let env = [("SSL_CERT_FILE", cert.as_str())];
    vec![
        Server::start_with_env(&top, "", &env).await,
        Server::start_with_env(&top, "", &env).await,
    ]
}

/// Node 0 publishes on `news` until node 1's client hears it (node 1's
/// subscription reaches the broker in the background), then once more:
/// each client gets it once.
async fn crosses_once(n: &[Server]) {
    let mut a: Client = n[0].client().await;
    a.subscribe("news").await;
    let mut b: Client = n[1].client().await;
    b.subscribe("news").await;
    let deadline = Instant::now() + TIMEOUT;
    for k in 0.. {
        assert!(
            Instant::now() < deadline,
            "nothing crossed the nodes; log:\n{}",
            n[1].log()
        );
        n[0].trigger("news", "p", &k.to_string()).await;
        assert_eq!(a.expect("p", Some("news")).await["data"], k.to_string());
        if let Ok(f) =
            tokio::time::timeout(Duration::from_millis(300), b.expect("p", Some("news"))).await
        {
            assert_eq!(f["data"], k.to_string());
            break;
        }
    }
    n[0].trigger("news", "last", "x").await;
    for c in [&mut a, &mut b] {
        assert_eq!(c.expect("last", Some("news")).await["data"], "x");
        assert!(
            tokio::time::timeout(Duration::from_millis(300), c.expect("last", Some("news")))
                .await
                .is_err(),
            "a second copy"
        );
    }
}

/// A node on `url` trusting another certificate: it logs the refused
/// certificate and is not ready.
async fn untrusted_is_refused(url: &str) {
    let dir = std::env::temp_dir().join(format!(
        "herald-redis-tls-{}-{}",
        std::process::id(),
        url.len()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let port = common::free_port();
    let config = dir.join("herald.toml");
    std::fs::write(
        &config,
        format!(
            "host = \"127.0.0.1\"\nport = {port}\nlog = \"warn\"\n[broker]\nurl = \"{url}\"\n\
             [[apps]]\nid = \"1\"\nkey = \"k\"\nsecret = \"s\"\n"
        ),
    )
    .unwrap();
    let other = fixture("tls-test-cert-2.pem").display().to_string();
    let p = common::Spawned::serve(
        &dir,
        &["--config", &config.display().to_string()],
        &[("SSL_CERT_FILE", &other)],
    );
    let deadline = Instant::now() + TIMEOUT;
    while !p.log().contains("invalid peer certificate") {
        assert!(Instant::now() < deadline, "log:\n{}", p.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!common::is_ready("127.0.0.1", port).await, "{}", p.log());
    drop(p);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_broadcast_crosses_nodes_on_a_tls_redis_cluster() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start_tls(tls()))
        .await
        .unwrap();
    assert!(cluster.url().starts_with("rediss-cluster://"));
    let n = nodes(&cluster.url(), "tc").await;
    crosses_once(&n).await;
    untrusted_is_refused(&cluster.url()).await;
}

#[tokio::test]
async fn a_broadcast_crosses_nodes_through_tls_sentinels() {
    let s = tokio::task::spawn_blocking(|| RedisSentinel::start_tls(tls()))
        .await
        .unwrap();
    assert!(s.url().starts_with("rediss-sentinel://"));
    let n = nodes(&s.url(), "ts").await;
    crosses_once(&n).await;
    untrusted_is_refused(&s.url()).await;
}
