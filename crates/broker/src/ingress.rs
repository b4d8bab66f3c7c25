//! Raw messages from one channel of the broker's server, for adapters that
//! take publications from outside the cluster (an app publishing straight
//! to Redis or NATS). Its own connection, beside the engine's: a Redis
//! `SUBSCRIBE` or a NATS subscription to the name as given (no prefix),
//! reconnecting with the engine's backoff (100 ms doubling to 5 s).
//!
//! Every node that asks subscribes, so every node receives every message:
//! the caller delivers what arrives to its own node's subscribers only.
//! Messages sent while a node's connection is down are not received there
//! (pub/sub is at most once), as with the engine's own publications.

use bytes::Bytes;
use futures_util::StreamExt;
use std::str::FromStr;
use std::time::Duration;
use tokio::sync::mpsc;

/// Messages received and not yet taken before newer ones are dropped.
pub const QUEUE: usize = 4096;

/// Largest message passed on; longer ones are dropped (and logged).
pub const MAX_MESSAGE: usize = 4 << 20;

const TIMEOUT: Duration = Duration::from_secs(5);

/// Subscribe to `channel` on the server at `url` (`redis://`, `rediss://`,
/// `nats://` or `tls://`, as `broker.url`). Call inside a Tokio runtime;
/// the subscription lives until the receiver is dropped.
pub fn subscribe(url: &str, channel: &str) -> Result<mpsc::Receiver<Bytes>, String> {
    let (tx, rx) = mpsc::channel(QUEUE);
    let channel = channel.to_owned();
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        let client = redis::Client::open(url).map_err(|e| format!("broker.url: {e}"))?;
        tokio::spawn(redis_loop(client, channel, tx));
    } else if url.starts_with("nats://") || url.starts_with("tls://") {
        let addr = async_nats::ServerAddr::from_str(url).map_err(|e| format!("broker.url: {e}"))?;
        tokio::spawn(nats_loop(addr, channel, tx));
    } else {
        return Err("broker.url: an ingress needs a redis:// or nats:// broker".into());
    }
    Ok(rx)
}

/// Hand one message on; false once nobody listens.
fn pass(tx: &mpsc::Sender<Bytes>, channel: &str, payload: Bytes) -> bool {
    if payload.len() > MAX_MESSAGE {
        tracing::warn!(
            channel,
            bytes = payload.len(),
            "ingress message over {MAX_MESSAGE} bytes dropped"
        );
        return true;
    }
    match tx.try_send(payload) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(_)) => {
            herald_core::metrics::count(&herald_core::metrics::BROKER_DROPPED);
            true
        }
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    }
}

async fn redis_loop(client: redis::Client, channel: String, tx: mpsc::Sender<Bytes>) {
    let mut attempt = 0u32;
    loop {
        let err = async {
            let mut pubsub = tokio::time::timeout(TIMEOUT, client.get_async_pubsub())
                .await
                .map_err(|_| "timed out connecting".to_string())?
                .map_err(|e| e.to_string())?;
            pubsub
                .subscribe(&channel)
                .await
                .map_err(|e| e.to_string())?;
            attempt = 0;
            tracing::info!(engine = "redis", channel, "ingress subscribed");
            let mut stream = pubsub.on_message();
            loop {
                tokio::select! {
                    m = stream.next() => match m {
                        Some(m) => {
                            if !pass(&tx, &channel, Bytes::copy_from_slice(m.get_payload_bytes())) {
                                return Ok(());
                            }
                        }
                        None => return Err("connection closed".to_string()),
                    },
                    _ = tx.closed() => return Ok(()),
                }
            }
        }
        .await;
        match err {
            Ok(()) => return,
            Err(e) => {
                if attempt == 0 {
                    tracing::warn!(engine = "redis", channel, error = %e, "ingress lost its connection; retrying");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(crate::backoff(attempt)) => {}
            _ = tx.closed() => return,
        }
        attempt = attempt.saturating_add(1);
    }
}

async fn nats_loop(addr: async_nats::ServerAddr, channel: String, tx: mpsc::Sender<Bytes>) {
    let mut options = async_nats::ConnectOptions::new()
        .name("herald-ingress")
        .retry_on_initial_connect()
        .max_reconnects(None::<usize>)
        .connection_timeout(TIMEOUT)
        .reconnect_delay_callback(|n| crate::backoff(n as u32));
    match (addr.username(), addr.password()) {
        (Some(u), Some(p)) => options = options.user_and_password(u.into(), p.into()),
        (Some(token), None) => options = options.token(token.into()),
        _ => {}
    }
    let client = match options.connect(addr).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(engine = "nats", channel, error = %e, "cannot start the ingress client");
            return;
        }
    };
    // The client resubscribes by itself after a reconnect.
    let mut sub = match client.subscribe(channel.clone()).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(engine = "nats", channel, error = %e, "ingress cannot subscribe");
            return;
        }
    };
    tracing::info!(engine = "nats", channel, "ingress subscribed");
    loop {
        tokio::select! {
            m = sub.next() => match m {
                Some(m) => {
                    if !pass(&tx, &channel, m.payload) {
                        return;
                    }
                }
                None => return,
            },
            _ = tx.closed() => return,
        }
    }
}

// Whether the ingress is subscribed yet is not observable from outside:
// the tests publish until a message arrives.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{BrokerServer, Kind};

    async fn roundtrip(kind: Kind) {
        let server = BrokerServer::start(kind);
        let mut rx = subscribe(&server.url(), "__ingress_test__").unwrap();
        let url = server.url();
        // Publish with the server's own tools' protocol until one arrives
        // (the subscription is made in the background).
        let publisher = async {
            match kind {
                Kind::Redis => {
                    let client = redis::Client::open(url.as_str()).unwrap();
                    let mut c = client.get_multiplexed_async_connection().await.unwrap();
                    loop {
                        let _: i64 = redis::cmd("PUBLISH")
                            .arg("__ingress_test__")
                            .arg("hello")
                            .query_async(&mut c)
                            .await
                            .unwrap();
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                Kind::Nats => {
                    let c = async_nats::connect(url.as_str()).await.unwrap();
                    loop {
                        c.publish("__ingress_test__", Bytes::from_static(b"hello"))
                            .await
                            .unwrap();
                        c.flush().await.unwrap();
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        };
        let got = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::select! {
                m = rx.recv() => m,
                _ = publisher => None,
            }
        })
        .await
        .expect("a message within 10 s");
        assert_eq!(got.as_deref(), Some(&b"hello"[..]));
    }

    #[tokio::test]
    async fn redis_messages_arrive() {
        roundtrip(Kind::Redis).await;
    }

    #[tokio::test]
    async fn nats_messages_arrive() {
        roundtrip(Kind::Nats).await;
    }

    #[test]
    fn other_urls_are_refused() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let _g = rt.enter();
        assert!(subscribe("local", "x").is_err());
    }
}
