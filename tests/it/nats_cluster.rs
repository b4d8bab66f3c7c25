//! Herald on a real three-server NATS cluster (`nats-server --cluster
//! --routes` on loopback, [`NatsCluster`]): three nodes, each connected to
//! a different server, behave as one server, exactly once, from the first
//! publication after a subscription is confirmed; a node whose server is
//! killed moves to another server of the cluster (learnt from the server,
//! or from a comma-separated list) and carries on, and its clients miss
//! nothing of what was acknowledged meanwhile.

use crate::common;

use common::{wait_ready, Client, Server, TIMEOUT};
use futures_util::StreamExt;
use herald_broker::testing::NatsCluster;
use serde_json::Value;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// One herald node per broker URL.
async fn nodes(urls: &[String], prefix: &str, ttl: u64) -> Vec<Server> {
    let mut out = Vec::new();
    for url in urls {
        let top = format!("[broker]\nurl = \"{url}\"\nprefix = \"{prefix}\"\nttl = {ttl}\n");
        out.push(Server::start_with(&top, "").await);
    }
    for s in &out {
        wait_ready(s, 200, TIMEOUT).await;
    }
    out
}

/// The data of the `event` frames that arrive before `until`, stopping
/// early once `want` have (other frames skipped).
async fn gather(c: &mut Client, event: &str, until: Instant, want: usize) -> Vec<String> {
    let mut got = Vec::new();
    while got.len() < want {
        let left = until.saturating_duration_since(Instant::now());
        let Ok(Some(Ok(m))) = tokio::time::timeout(left, c.ws.next()).await else {
            break;
        };
        if let Message::Text(t) = m {
            let f: Value = serde_json::from_str(&t).unwrap();
            if f["event"] == event {
                got.push(f["data"].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    got
}

#[tokio::test]
async fn every_event_reaches_every_node_exactly_once() {
    let cluster = NatsCluster::start(3, false);
    let urls: Vec<String> = (0..3).map(|i| cluster.url(i)).collect();
    let n = nodes(&urls, "exact", 30).await;
    let mut clients = Vec::new();
    for s in &n {
        let mut c = s.client().await;
        c.subscribe("news").await;
        clients.push(c);
    }
    // Every node publishes, at once: 3 × 20 events through three servers.
    let per = 20;
    let sends = n.iter().enumerate().map(|(i, s)| async move {
        for k in 0..per {
            s.trigger("news", "e", &format!("{i}:{k}")).await;
        }
    });
    futures_util::future::join_all(sends).await;
    let until = Instant::now() + TIMEOUT;
    for (ci, c) in clients.iter_mut().enumerate() {
        let got = gather(c, "e", until, 3 * per).await;
        assert_eq!(got.len(), 3 * per, "client on node {ci} got {got:?}");
        // Each publisher's events once each, in the order it sent them.
        let mut next: HashMap<&str, usize> = HashMap::new();
        for d in &got {
            let (from, k) = d.split_once(':').unwrap();
            let want = next.entry(from).or_default();
            assert_eq!(k.parse::<usize>().unwrap(), *want, "{got:?}");
            *want += 1;
        }
    }
    // Nothing twice: a marker is the next frame.
    n[1].trigger("news", "marker", "m").await;
    for c in &mut clients {
        c.expect("marker", Some("news")).await;
    }
}

/// A subscription confirmed on one server's node hears the very next
/// publication from a node on another server, round after round on fresh
/// channels (each a new interest the servers must pass along their routes).
#[tokio::test]
async fn a_confirmed_subscription_hears_the_next_publication_from_any_server() {
    let cluster = NatsCluster::start(3, false);
    let urls: Vec<String> = (0..3).map(|i| cluster.url(i)).collect();
    let n = nodes(&urls, "race", 30).await;
    let mut c1 = n[1].client().await;
    let mut c2 = n[2].client().await;
    for r in 0..50 {
        let ch = format!("ch-{r}");
        c1.subscribe(&ch).await;
        c2.subscribe(&ch).await;
        n[0].trigger(&ch, "e", &r.to_string()).await;
        assert_eq!(c1.expect("e", Some(&ch)).await["data"], r.to_string());
        assert_eq!(c2.expect("e", Some(&ch)).await["data"], r.to_string());
    }
}

/// Node 0 is given one server's URL, node 2 a comma-separated list. The
/// server node 0 is on is SIGKILLed while node 1 publishes every 10 ms:
/// node 0 moves to a server it learnt from the cluster, `/ready` goes 503
/// and back to 200, and delivery resumes on it; node 2's client misses
/// nothing, and node 0's client gets every event too (what it missed
/// while it moved is recovered), once each and in order.
#[tokio::test]
async fn a_killed_server_is_left_for_another_and_the_gap_is_measured() {
    let mut cluster = NatsCluster::start(3, false);
    let urls = vec![
        cluster.url(0),
        cluster.url(1),
        format!("{},{}", cluster.url(2), cluster.url(1)),
    ];
    let n = nodes(&urls, "failover", 30).await;
    let mut clients = Vec::new();
    for s in &n {
        let mut c = s.client().await;
        c.subscribe("feed").await;
        clients.push(c);
    }
    let outages = n[0].metric("herald_broker_outages_total").await;
    let total = 300usize;
    let publisher = async {
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        for k in 0..total {
            tick.tick().await;
            n[1].trigger("feed", "e", &k.to_string()).await;
        }
    };
    let killer = async {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        cluster.kill(0);
        let t0 = Instant::now();
        wait_ready(&n[0], 503, TIMEOUT).await;
        wait_ready(&n[0], 200, TIMEOUT).await;
        t0.elapsed()
    };
    let ((), back_after) = tokio::join!(publisher, killer);
    let until = Instant::now() + TIMEOUT;
    let mut got = Vec::new();
    for c in &mut clients {
        got.push(gather(c, "e", until, total).await);
    }
    // Node 1 (the publisher) and node 2 lost nothing.
    assert_eq!(got[1].len(), total);
    assert_eq!(got[2].len(), total);
    // Node 0: every event (each one was acknowledged), once each, in the
    // order they were published (what it missed while it moved is
    // recovered from node 1's window, in order).
    let seen: Vec<usize> = got[0].iter().map(|d| d.parse().unwrap()).collect();
    let mut unique = seen.clone();
    unique.sort_unstable();
    unique.dedup();
    let lost = total - unique.len();
    eprintln!(
        "failover: node 0 back (ready) {back_after:?} after its server was killed; \
         its client missed {lost} of {total} events published every 10 ms, {} twice; \
         {} recovered",
        seen.len() - unique.len(),
        n[0].counter("herald_broker_recovered_total").await,
    );
    assert_eq!(lost, 0, "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    assert!(n[0].metric("herald_broker_outages_total").await > outages);
    // And it keeps going exactly once, everywhere.
    n[2].trigger("feed", "marker", "m").await;
    for c in &mut clients {
        c.expect("marker", Some("feed")).await;
    }
}

/// Over a route that passes everything along 300 ms late, a subscription
/// confirmed on one server still hears an event triggered through a node
/// on the other server right after the confirmation: the confirmation
/// waits until the far node has heard a probe sent after the `SUB`
/// (crates/broker/src/engine/reach.rs), so the far server knows of the
/// interest first. Without the probe round every such event was lost.
#[tokio::test]
async fn a_slow_route_does_not_cost_the_first_events_after_a_confirmation() {
    let delay = Duration::from_millis(300);
    let cluster = NatsCluster::start_slow_route(delay);
    let n = nodes(&[cluster.url(0), cluster.url(1)], "slow", 30).await;
    // Each node knows the other (heartbeats cross the slow route too).
    for s in &n {
        let deadline = Instant::now() + TIMEOUT;
        while s.metric("herald_cluster_nodes").await < 2 {
            assert!(Instant::now() < deadline, "the nodes never met");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let mut c = n[0].client().await;
    for r in 0..5 {
        let ch = format!("slow-{r}");
        let t0 = Instant::now();
        c.subscribe(&ch).await;
        let confirmed = t0.elapsed();
        n[1].trigger(&ch, "e", &r.to_string()).await;
        assert_eq!(
            c.expect("e", Some(&ch)).await["data"],
            r.to_string(),
            "round {r}"
        );
        // The confirmation waited for the route (there and back).
        assert!(confirmed >= delay, "confirmed after {confirmed:?}");
    }
}
