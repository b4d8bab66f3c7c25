//! A TLS broker against real TLS-only servers: `redis-server --port 0
//! --tls-port …` (alone, as a Redis Cluster with the bus and replication
//! over TLS, and as a master, a replica and three sentinels on TLS) and
//! `nats-server --tls`.
//!
//! With the broker's own settings (`broker.tls_ca`, `broker.tls_cert`,
//! `broker.tls_key`; no `SSL_CERT_FILE`): the servers require a client
//! certificate (`tls-auth-clients yes`, `--tlsverify`) signed by a private
//! authority (tests/fixtures/broker-*.pem, made by broker-pki.sh); two
//! nodes, one configured by its file and one by `HERALD_BROKER_TLS_*`,
//! become ready and a publication on one reaches a client of the other
//! exactly once; the AnyCable ingress reads the app's publications over
//! the same TLS. A node without the client certificate is not ready and
//! its log says why.
//!
//! With `SSL_CERT_FILE` (the way before those settings, still working):
//! the self-signed test certificate of tests/it/tls.rs trusted through it; a
//! node that trusts another certificate never connects.

use crate::common;

use common::{Client, Server, Spawned, TIMEOUT};
use futures_util::{SinkExt, StreamExt};
use herald_broker::testing::{BrokerServer, Kind, RedisCluster, Tls};
use herald_broker::testing_sentinel::RedisSentinel;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn shown(name: &str) -> String {
    fixture(name).display().to_string()
}

/// The self-signed test certificate for 127.0.0.1 (tests/it/tls.rs's);
/// client certificates optional.
fn self_signed() -> Tls {
    Tls {
        cert: fixture("tls-test-cert.pem"),
        key: fixture("tls-test-key.pem"),
        ca: None,
        client: None,
    }
}

/// A server certificate from the private authority; every client must
/// present a certificate from it too.
fn private_ca() -> Tls {
    Tls {
        cert: fixture("broker-server-cert.pem"),
        key: fixture("broker-server-key.pem"),
        ca: Some(fixture("broker-ca.pem")),
        client: Some((
            fixture("broker-client-cert.pem"),
            fixture("broker-client-key.pem"),
        )),
    }
}

/// `[broker]` for `url`, and `extra` keys.
fn broker_toml(url: &str, prefix: &str, extra: &str) -> String {
    format!("[broker]\nurl = \"{url}\"\nprefix = \"{prefix}\"\nttl = 60\n{extra}")
}

/// The three settings as `[broker]` keys.
fn tls_keys() -> String {
    format!(
        "tls_ca = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
        shown("broker-ca.pem"),
        shown("broker-client-cert.pem"),
        shown("broker-client-key.pem")
    )
}

/// Two nodes on `url` with the private authority and the client
/// certificate: the first from its file, the second from the environment.
/// `rest` is more TOML (after `[broker]`'s keys).
async fn private_nodes(url: &str, prefix: &str, rest: &str) -> Vec<Server> {
    let (ca, cert, key) = (
        shown("broker-ca.pem"),
        shown("broker-client-cert.pem"),
        shown("broker-client-key.pem"),
    );
    let env = [
        ("HERALD_BROKER_TLS_CA", ca.as_str()),
        ("HERALD_BROKER_TLS_CERT", cert.as_str()),
        ("HERALD_BROKER_TLS_KEY", key.as_str()),
    ];
    vec![
        Server::start_with(
            &broker_toml(url, prefix, &format!("{}{rest}", tls_keys())),
            "",
        )
        .await,
        Server::start_with_env(&broker_toml(url, prefix, rest), "", &env).await,
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

/// A node on `url` with `extra` `[broker]` keys and `env`: its log comes
/// to say `why` (any of them) and `/ready` is not 200 (503 `BROKER DOWN`).
async fn refused(url: &str, extra: &str, env: &[(&str, &str)], why: &[&str]) {
    let dir = std::env::temp_dir().join(format!(
        "herald-broker-tls-{}-{}",
        std::process::id(),
        common::free_port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let port = common::free_port();
    let config = dir.join("herald.toml");
    std::fs::write(
        &config,
        format!(
            "host = \"127.0.0.1\"\nport = {port}\nlog = \"warn\"\n[broker]\nurl = \"{url}\"\n{extra}\
             [[apps]]\nid = \"1\"\nkey = \"k\"\nsecret = \"s\"\n"
        ),
    )
    .unwrap();
    let p = Spawned::serve(&dir, &["--config", &config.display().to_string()], env);
    let deadline = Instant::now() + TIMEOUT;
    while !why.iter().any(|w| p.log().contains(w)) {
        assert!(
            Instant::now() < deadline,
            "wanted {why:?}; log:\n{}",
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("refused as expected:\n{}", p.log());
    let ready = reqwest::get(format!("http://127.0.0.1:{port}/ready"))
        .await
        .expect("herald answers");
    assert_eq!(ready.status(), 503, "{}", p.log());
    assert!(ready.text().await.unwrap().contains("BROKER DOWN"));
    let log = p.log();
    assert!(!log.contains("PRIVATE KEY"), "{log}");
    drop(p);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The settings without the client certificate: the server's refusal,
/// `why`, in the log.
async fn without_client_certificate_is_refused(url: &str, why: &[&str]) {
    let ca = format!("tls_ca = \"{}\"\n", shown("broker-ca.pem"));
    refused(url, &ca, &[], why).await;
}

#[tokio::test]
async fn a_redis_server_requiring_a_client_certificate_from_a_private_ca() {
    let broker = tokio::task::spawn_blocking(|| BrokerServer::start_tls(Kind::Redis, private_ca()))
        .await
        .unwrap();
    assert!(broker.url().starts_with("rediss://"));
    let n = private_nodes(&broker.url(), "pr", "").await;
    crosses_once(&n).await;
    // TLS 1.3: the server's alert, read after the handshake.
    without_client_certificate_is_refused(&broker.url(), &["alert: CertificateRequired"]).await;
    // Another authority in broker.tls_ca: the server's certificate refused.
    let wrong_ca = tls_keys().replace(&shown("broker-ca.pem"), &shown("tls-test-cert.pem"));
    refused(
        &broker.url(),
        &wrong_ca,
        &[],
        &["invalid peer certificate: UnknownIssuer"],
    )
    .await;
}

#[tokio::test]
async fn a_tls_redis_cluster_requiring_a_client_certificate() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start_tls(private_ca()))
        .await
        .unwrap();
    assert!(cluster.url().starts_with("rediss-cluster://"));
    let n = private_nodes(&cluster.url(), "pc", "").await;
    crosses_once(&n).await;
}

#[tokio::test]
async fn tls_sentinels_requiring_a_client_certificate() {
    let s = tokio::task::spawn_blocking(|| RedisSentinel::start_tls(private_ca()))
        .await
        .unwrap();
    assert!(s.url().starts_with("rediss-sentinel://"));
    let n = private_nodes(&s.url(), "ps", "").await;
    crosses_once(&n).await;
}

#[tokio::test]
async fn a_nats_server_with_tlsverify() {
    let broker = tokio::task::spawn_blocking(|| BrokerServer::start_tls(Kind::Nats, private_ca()))
        .await
        .unwrap();
    assert!(broker.url().starts_with("tls://"));
    let n = private_nodes(&broker.url(), "pn", "").await;
    crosses_once(&n).await;
    // nats-server's refusal, as the engine's TLS probe hears it.
    without_client_certificate_is_refused(&broker.url(), &["alert: BadCertificate"]).await;
}

// ----- the AnyCable ingress over the same TLS ------------------------------

const CHANNEL: &str = "__anycable__";

async fn cable(server: &Server) -> common::Ws {
    let mut req = format!("ws://127.0.0.1:{}/cable", server.port)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        "actioncable-v1-json".parse().unwrap(),
    );
    let (mut ws, _) = tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(req))
        .await
        .expect("connect timed out")
        .expect("connect");
    assert_eq!(frame(&mut ws).await["type"], "welcome");
    let id = json!({ "channel": "$pubsub", "stream_name": "room" }).to_string();
    let cmd = json!({ "command": "subscribe", "identifier": id }).to_string();
    ws.send(Message::text(cmd)).await.unwrap();
    assert_eq!(frame(&mut ws).await["type"], "confirm_subscription");
    ws
}

/// The next frame that is not a ping, within `wait`.
async fn frame_within(ws: &mut common::Ws, wait: Duration) -> Option<Value> {
    let until = Instant::now() + wait;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["type"] != "ping" {
                    return Some(v);
                }
            }
            Ok(Some(Ok(_))) => continue,
            Ok(other) => panic!("connection ended: {other:?}"),
            Err(_) => return None,
        }
    }
}

async fn frame(ws: &mut common::Ws) -> Value {
    frame_within(ws, TIMEOUT).await.expect("no frame in time")
}

/// The app publishes `{"stream","data"}` to `__anycable__` (over TLS with
/// the client certificate, as the nodes) until each node's Action Cable
/// client got one.
async fn ingress_delivers(
    n: &[Server],
    mut publish: impl FnMut(String) -> tokio::task::JoinHandle<()>,
) {
    let mut clients = Vec::new();
    for s in n {
        clients.push(cable(s).await);
    }
    let deadline = Instant::now() + TIMEOUT;
    let mut seen = vec![false; clients.len()];
    let mut k = 0;
    while seen.iter().any(|s| !s) {
        assert!(
            Instant::now() < deadline,
            "the ingress never delivered; log:\n{}",
            n[0].log()
        );
        k += 1;
        let data = json!({ "probe": k }).to_string();
        publish(json!({ "stream": "room", "data": data }).to_string())
            .await
            .unwrap();
        for (c, s) in clients.iter_mut().zip(seen.iter_mut()) {
            if let Some(f) = frame_within(c, Duration::from_millis(100)).await {
                assert!(f["message"]["probe"].is_number(), "{f}");
                *s = true;
            }
        }
    }
}

#[tokio::test]
async fn the_redis_and_nats_ingress_use_the_broker_tls_settings() {
    let (redis, nats) = tokio::task::spawn_blocking(|| {
        (
            BrokerServer::start_tls(Kind::Redis, private_ca()),
            BrokerServer::start_tls(Kind::Nats, private_ca()),
        )
    })
    .await
    .unwrap();
    let rest = "[rpc]\npublic_streams = true\nbroadcast_adapter = \"redis\"\n";
    let n = private_nodes(&redis.url(), "ir", rest).await;
    let client =
        redis::Client::build_with_tls(redis.url(), private_ca().redis_certs().unwrap()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    ingress_delivers(&n, |body| {
        let mut c = conn.clone();
        tokio::spawn(async move {
            let _: i64 = redis::cmd("PUBLISH")
                .arg(CHANNEL)
                .arg(body)
                .query_async(&mut c)
                .await
                .unwrap();
        })
    })
    .await;
    drop(n);

    let rest = "[rpc]\npublic_streams = true\nbroadcast_adapter = \"nats\"\n";
    let n = private_nodes(&nats.url(), "in", rest).await;
    let app = async_nats::ConnectOptions::new()
        .add_root_certificates(fixture("broker-ca.pem"))
        .add_client_certificate(
            fixture("broker-client-cert.pem"),
            fixture("broker-client-key.pem"),
        )
        .require_tls(true)
        .connect(nats.url())
        .await
        .unwrap();
    ingress_delivers(&n, |body| {
        let c = app.clone();
        tokio::spawn(async move {
            c.publish(CHANNEL, body.into()).await.unwrap();
            c.flush().await.unwrap();
        })
    })
    .await;
}

// ----- SSL_CERT_FILE, as before the settings ---------------------------------

/// Two nodes on `url`, trusting the self-signed test certificate through
/// `SSL_CERT_FILE`.
async fn ssl_cert_file_nodes(url: &str, prefix: &str) -> Vec<Server> {
    let top = broker_toml(url, prefix, "");
    let cert = self_signed().cert.display().to_string();
    let env = [("SSL_CERT_FILE", cert.as_str())];
    vec![
        Server::start_with_env(&top, "", &env).await,
        Server::start_with_env(&top, "", &env).await,
    ]
}

/// A node on `url` trusting another certificate: it logs the refused
/// certificate and is not ready.
async fn untrusted_is_refused(url: &str) {
    let other = shown("tls-test-cert-2.pem");
    refused(
        url,
        "",
        &[("SSL_CERT_FILE", &other)],
        &["invalid peer certificate"],
    )
    .await;
}

#[tokio::test]
async fn a_broadcast_crosses_nodes_on_a_tls_redis_cluster() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start_tls(self_signed()))
        .await
        .unwrap();
    assert!(cluster.url().starts_with("rediss-cluster://"));
    let n = ssl_cert_file_nodes(&cluster.url(), "tc").await;
    crosses_once(&n).await;
    untrusted_is_refused(&cluster.url()).await;
}

#[tokio::test]
async fn a_broadcast_crosses_nodes_through_tls_sentinels() {
    let s = tokio::task::spawn_blocking(|| RedisSentinel::start_tls(self_signed()))
        .await
        .unwrap();
    assert!(s.url().starts_with("rediss-sentinel://"));
    let n = ssl_cert_file_nodes(&s.url(), "ts").await;
    crosses_once(&n).await;
    untrusted_is_refused(&s.url()).await;
}
