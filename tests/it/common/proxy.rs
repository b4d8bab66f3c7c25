//! A proxy in front of herald that drops or duplicates the bench's
//! messages on their way to WebSocket clients, for tests of the bench's
//! loss and duplicate accounting (one generator process or several).

use futures_util::{SinkExt, StreamExt};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

/// What the faulty proxy does with the n-th bench message (n = 1, 2, ...)
/// it forwards to one client.
#[derive(Clone, Copy, PartialEq)]
pub enum Fault {
    Pass,
    Drop,
    Duplicate,
}

/// Every third bench message dropped.
pub fn drop_every_third(n: u64) -> Fault {
    if n.is_multiple_of(3) {
        Fault::Drop
    } else {
        Fault::Pass
    }
}

/// Every third dropped and every third duplicated: as many frames arrive
/// as were sent, so only exact accounting can see the losses.
pub fn drop_and_duplicate(n: u64) -> Fault {
    match n % 3 {
        0 => Fault::Drop,
        1 => Fault::Duplicate,
        _ => Fault::Pass,
    }
}

/// What the proxy did, over all connections.
#[derive(Default)]
pub struct Faults {
    pub dropped: AtomicU64,
    pub duplicated: AtomicU64,
}

/// A proxy in front of herald. WebSocket connections (`GET`) are proxied
/// frame by frame, applying `fault` to the bench's messages (frames with a
/// `bench_t`) on their way to the client; anything else (the HTTP API's
/// `POST`s) is piped through, each chunk of the server's answers held back
/// `http_delay`, so HTTP publishers and WebSocket subscribers can share the
/// proxy's one address as they share a server's.
#[allow(clippy::result_large_err)] // tungstenite's handshake callback signature
pub async fn faulty_proxy(
    upstream: u16,
    fault: fn(u64) -> Fault,
    http_delay: Duration,
) -> (u16, Arc<Faults>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let faults = Arc::new(Faults::default());
    let counts = faults.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let counts = counts.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 4];
                loop {
                    match stream.peek(&mut first).await {
                        Ok(4) => break,
                        Ok(0) | Err(_) => return,
                        Ok(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                    }
                }
                if &first != b"GET " {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let (mut cr, mut cw) = stream.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = tokio::io::copy(&mut cr, &mut sw);
                    let down = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        while let Ok(n @ 1..) = sr.read(&mut buf).await {
                            tokio::time::sleep(http_delay).await;
                            if cw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    tokio::select! { _ = up => {}, _ = down => {} }
                    return;
                }
                let mut path = String::new();
                let Ok(client) = tokio_tungstenite::accept_hdr_async(
                    stream,
                    |req: &tokio_tungstenite::tungstenite::handshake::server::Request, resp| {
                        path = req.uri().to_string();
                        Ok(resp)
                    },
                )
                .await
                else {
                    return;
                };
                let url = format!("ws://127.0.0.1:{upstream}{path}");
                let Ok((server, _)) = tokio_tungstenite::connect_async(url).await else {
                    return;
                };
                let (mut c_tx, mut c_rx) = client.split();
                let (mut s_tx, mut s_rx) = server.split();
                let up = async {
                    while let Some(Ok(m)) = c_rx.next().await {
                        if s_tx.send(m).await.is_err() {
                            break;
                        }
                    }
                };
                let down = async {
                    let mut n = 0u64;
                    while let Some(Ok(m)) = s_rx.next().await {
                        let mut copies = 1;
                        if let Message::Text(t) = &m {
                            if t.contains("bench_t") {
                                n += 1;
                                match fault(n) {
                                    Fault::Pass => {}
                                    Fault::Drop => {
                                        counts.dropped.fetch_add(1, Ordering::Relaxed);
                                        copies = 0;
                                    }
                                    Fault::Duplicate => {
                                        counts.duplicated.fetch_add(1, Ordering::Relaxed);
                                        copies = 2;
                                    }
                                }
                            }
                        }
                        for _ in 0..copies {
                            if c_tx.send(m.clone()).await.is_err() {
                                return;
                            }
                        }
                    }
                };
                tokio::select! { _ = up => {}, _ = down => {} }
            });
        }
    });
    (port, faults)
}
