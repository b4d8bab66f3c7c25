//! The NATS transport (core NATS; history and sessions on JetStream are
//! [`crate::nats::jetstream`]'s, over a connection of their own): one connection; one
//! subscription per wanted subject (a pattern is a `>` wildcard subject),
//! each forwarding into the engine's single inbound task. The client
//! reconnects by itself (backoff 100 ms doubling to 5 s) and restores the
//! subscriptions; its connection events tell the engine when the broker
//! is away and when to announce the node again. While the connection is
//! down the writer drops what is queued instead of letting the client
//! buffer it.

pub mod jetstream;
pub mod tls_probe;

use crate::engine::{Engine, Out, Shared};
use async_nats::{Event, ServerAddr};
use bytes::Bytes;
use futures_util::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Messages received but not yet handled before the subscriptions wait.
const INBOUND: usize = 8192;

/// The messages received, with the subscription they came through.
type Inbound = (Arc<str>, Bytes);

/// A NATS engine on the servers `url` lists (or the cluster they
/// announce), keeping `replicas` copies of the JetStream history stream and
/// sessions bucket (`broker.jetstream_replicas`), every connection with the
/// broker's TLS settings `tls` (`broker.tls_*`).
pub fn engine(
    url: &str,
    prefix: &str,
    ttl: Duration,
    replicas: usize,
    tls: Option<&crate::tls::BrokerTls>,
) -> Result<Engine, String> {
    let servers = crate::urls::nats_servers(url)?;
    let streams = Arc::new(
        crate::nats::jetstream::JetStream::new(servers.clone(), prefix)
            .with_replicas(replicas)
            .with_tls(tls.cloned()),
    );
    let transport = Core {
        servers,
        tls: tls.cloned(),
    };
    Ok(Engine::new(transport, prefix, ttl).with_streams(streams))
}

/// The transport over NATS core subjects.
struct Core {
    servers: Vec<async_nats::ServerAddr>,
    tls: Option<crate::tls::BrokerTls>,
}

impl crate::engine::Transport for Core {
    fn name(&self) -> &'static str {
        "nats"
    }
    fn wildcard(&self) -> &'static str {
        ">"
    }
    fn run(
        self: Box<Self>,
        shared: Arc<Shared>,
        outgoing: mpsc::Receiver<Out>,
    ) -> herald_core::future::BoxFuture<()> {
        Box::pin(run(shared, outgoing, self.servers, self.tls))
    }
}

async fn run(
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<Out>,
    servers: Vec<ServerAddr>,
    tls: Option<crate::tls::BrokerTls>,
) {
    let several = servers.len() > 1;
    let mut options = crate::nats::jetstream::options(&servers, "herald", tls.as_ref());
    let (events_tx, mut events) = mpsc::unbounded_channel::<bool>();
    // Why the client cannot connect (a refused certificate, a wrong
    // password, no server): logged once per outage, as the Redis engine
    // does, not at every attempt.
    // With the broker's TLS settings, async-nats's bare "IO error" is
    // completed by a probe of the first server (crate::nats::tls_probe).
    let told = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = tls.clone().zip(servers.first().cloned());
    options = options.event_callback(move |ev| {
        let tx = events_tx.clone();
        let told = told.clone();
        let probe = probe.clone();
        async move {
            match ev {
                Event::Connected => {
                    told.store(false, std::sync::atomic::Ordering::Relaxed);
                    let _ = tx.send(true);
                }
                Event::Disconnected | Event::Closed => {
                    let _ = tx.send(false);
                }
                Event::ClientError(e) => {
                    if told.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    match probe {
                        // In a task of its own: the client waits for this
                        // callback before it hands on the next event.
                        Some((tls, server)) => drop(tokio::spawn(async move {
                            let why = crate::nats::tls_probe::probe(&tls, &server).await;
                            tracing::warn!(engine = "nats", error = %e, tls = %why, "cannot reach the broker; retrying");
                        })),
                        None => {
                            tracing::warn!(engine = "nats", error = %e, "cannot reach the broker; retrying")
                        }
                    }
                }
                Event::ServerError(e) if !told.swap(true, std::sync::atomic::Ordering::Relaxed) => {
                    tracing::warn!(engine = "nats", error = %e, "the broker refused the node; retrying");
                }
                _ => {}
            }
        }
    });
    let client = match options.connect(servers).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(engine = "nats", error = %e, "cannot start the NATS client");
            return;
        }
    };
    let (in_tx, mut inbound) = mpsc::channel::<Inbound>(INBOUND);
    let mut subs: HashMap<String, JoinHandle<()>> = HashMap::new();
    let base = [shared.all(), shared.own_subject(), shared.canary_subject()];
    for s in &base {
        if let Err(e) = subscribe(&client, s, &in_tx, &mut subs).await {
            tracing::error!(engine = "nats", error = %e, "cannot subscribe");
        }
    }
    loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(true) => {
                    // Subscriptions made while away are restored by the
                    // client; make sure every wanted one exists.
                    let wanted = shared.wanted_now();
                    for (subject, _) in wanted {
                        if !subs.contains_key(&subject) {
                            let _ = subscribe(&client, &subject, &in_tx, &mut subs).await;
                        }
                    }
                    apply_dirty(&shared, &client, &in_tx, &mut subs).await;
                    // The client restored its SUBs on the new connection;
                    // a round trip shows the server has read them.
                    let n = shared.next_connection();
                    let _ = tokio::time::timeout(Duration::from_secs(5), round_trip(&client)).await;
                    shared.set_up(true, "");
                    if clustered(&client, several) {
                        // The other servers learn of them over their routes
                        // (engine/reach.rs): held once every node heard a
                        // probe sent after them. In a task: the answers come
                        // in through this loop.
                        let sh = shared.clone();
                        tokio::spawn(async move {
                            sh.reach_peers().await;
                            sh.holds_interest(n);
                        });
                    } else {
                        shared.holds_interest(n);
                    }
                }
                Some(false) => shared.set_up(false, "disconnected"),
                None => return,
            },
            m = inbound.recv() => {
                if let Some((via, payload)) = m {
                    shared.on_message(&via, &payload);
                }
            }
            _ = shared.wake.notified() => {
                apply_dirty(&shared, &client, &in_tx, &mut subs).await;
            }
            _ = shared.canary.reconnect.notified() => {
                // The canary did not come back: drop this connection (a
                // server that stopped delivering) for a new one, perhaps to
                // another server of the cluster; the client subscribes to
                // everything again, and its events tell us when it is up.
                shared.set_up(false, "broker canary not heard back");
                if let Err(e) = client.force_reconnect().await {
                    tracing::debug!(engine = "nats", error = %e, "reconnect request failed");
                }
            }
            o = rx.recv() => match o {
                None => return,
                Some(Out::Flush(done)) => {
                    apply_dirty(&shared, &client, &in_tx, &mut subs).await;
                    if !shared.is_up() {
                        let _ = done.send(());
                        continue;
                    }
                    let _ = tokio::time::timeout(Duration::from_secs(5), round_trip(&client)).await;
                    if clustered(&client, several) {
                        // The other servers learn of the SUBs over their
                        // routes: confirm once every node has heard a probe
                        // sent after them (engine/reach.rs). In a task: its
                        // answers come in through this loop.
                        let sh = shared.clone();
                        tokio::spawn(async move {
                            sh.reach_peers().await;
                            let _ = done.send(());
                        });
                    } else {
                        let _ = done.send(());
                    }
                }
                Some(Out::Send(subject, payload, seq)) => {
                    apply_dirty(&shared, &client, &in_tx, &mut subs).await;
                    if !shared.is_up() {
                        // A publication stays in the journal (sent again
                        // on reconnect); anything else is dropped.
                        if seq == 0 {
                            herald_core::metrics::count(&herald_core::metrics::BROKER_DROPPED);
                        }
                        continue;
                    }
                    if client.publish(subject, payload).await.is_err() {
                        if seq == 0 {
                            herald_core::metrics::count(&herald_core::metrics::BROKER_DROPPED);
                        }
                    } else {
                        // In the client's buffer, on its way to the server
                        // (core NATS has no acknowledgement): a node that
                        // misses it asks for it by number.
                        shared.taken(seq);
                    }
                }
            },
        }
    }
}

/// Whether the node's server is one of a cluster: several servers were
/// given, or the server announces others (its `connect_urls`).
fn clustered(client: &async_nats::Client, several: bool) -> bool {
    several || !client.server_info().connect_urls.is_empty()
}

/// Returns once the server has handled everything this connection sent
/// before. The client's `flush` only empties its own buffer; a `SUB` in
/// the socket is not yet in effect, and a `PUB` from another node can
/// overtake it (the server reads each connection on its own). A message
/// to a fresh inbox comes back only after the server has read every
/// earlier command of this connection, the `SUB`s among them.
async fn round_trip(client: &async_nats::Client) {
    let inbox = client.new_inbox();
    let Ok(mut sub) = client.subscribe(inbox.clone()).await else {
        return;
    };
    if client.publish(inbox, Bytes::new()).await.is_ok() {
        let _ = sub.next().await;
    }
}

async fn subscribe(
    client: &async_nats::Client,
    subject: &str,
    in_tx: &mpsc::Sender<Inbound>,
    subs: &mut HashMap<String, JoinHandle<()>>,
) -> Result<(), String> {
    let mut sub = client
        .subscribe(subject.to_owned())
        .await
        .map_err(|e| e.to_string())?;
    let via: Arc<str> = Arc::from(subject);
    let tx = in_tx.clone();
    let task = tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            if tx.send((via.clone(), m.payload)).await.is_err() {
                break;
            }
        }
    });
    subs.insert(subject.to_owned(), task);
    Ok(())
}

async fn apply_dirty(
    shared: &Shared,
    client: &async_nats::Client,
    in_tx: &mpsc::Sender<Inbound>,
    subs: &mut HashMap<String, JoinHandle<()>>,
) {
    for (subject, want, _) in shared.take_dirty() {
        match (want, subs.contains_key(&subject)) {
            (true, false) => {
                if let Err(e) = subscribe(client, &subject, in_tx, subs).await {
                    tracing::debug!(engine = "nats", error = %e, "subscribe failed");
                }
            }
            (false, true) => {
                // Dropping the subscriber unsubscribes.
                if let Some(t) = subs.remove(&subject) {
                    t.abort();
                }
            }
            _ => {}
        }
    }
}
