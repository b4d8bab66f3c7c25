//! `storm` over several nodes, and its rolling restart (`--node-url`,
//! `--restart-cmd`).
//!
//! A cluster is measured the way it is used: clients are spread over the
//! nodes round-robin, and a client that loses its node reconnects to one
//! of the others (spread by client index, then the next on each failed
//! attempt), as a load balancer sends it to a live node; publishers
//! publish through a node that is up ([`Publishers`]).
//!
//! The rolling restart replaces the storm's single drop: the bench runs an
//! operator-given command for node 0, 1, 2, ... in turn ([`Restart`]), one
//! that stops the node (SIGTERM, a graceful shutdown, or SIGKILL),
//! starts it again and returns once it listens; after each it waits until
//! every client of that node has noticed and every client is back before
//! the next. The bench knows nothing of how a node is run, so the same
//! generator drives Herald and AnyCable.

use super::proto::{Broadcast, Proto, Publisher};
use super::report::Report;
use super::Target;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The nodes clients connect to, which of them the bench is restarting,
/// and how many clients each holds now.
pub struct Nodes {
    targets: Vec<Target>,
    down: Vec<AtomicBool>,
    connected: Vec<AtomicUsize>,
}

impl Nodes {
    /// `targets` must not be empty.
    pub fn new(targets: Vec<Target>) -> Nodes {
        assert!(!targets.is_empty(), "at least one node");
        Nodes {
            down: targets.iter().map(|_| AtomicBool::new(false)).collect(),
            connected: targets.iter().map(|_| AtomicUsize::new(0)).collect(),
            targets,
        }
    }

    pub fn len(&self) -> usize {
        self.targets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    pub fn target(&self, node: usize) -> &Target {
        &self.targets[node % self.len()]
    }

    /// Client `i`'s first node: round-robin.
    pub fn first_for(&self, i: usize) -> usize {
        i % self.len()
    }

    /// Where client `i`, having lost node `lost`, makes its `attempt`-th
    /// try (from 0): one of the other nodes, spread by client index so a
    /// node's clients share the others, the next one on each failure. With
    /// one node, that node.
    pub fn next_for(&self, i: usize, lost: usize, attempt: usize) -> usize {
        next_node(self.len(), i, lost, attempt)
    }

    /// A client connected to `node`, or left it.
    pub fn joined(&self, node: usize) {
        self.connected[node].fetch_add(1, Relaxed);
    }

    pub fn left(&self, node: usize) {
        self.connected[node].fetch_sub(1, Relaxed);
    }

    pub fn clients_on(&self, node: usize) -> usize {
        self.connected[node].load(Relaxed)
    }

    fn set_down(&self, node: usize, down: bool) {
        self.down[node].store(down, Relaxed);
    }

    fn is_down(&self, node: usize) -> bool {
        self.down[node].load(Relaxed)
    }
}

/// [`Nodes::next_for`] over `n` nodes (`fanout` with a fault uses it
/// without the rest of [`Nodes`]).
pub fn next_node(n: usize, i: usize, lost: usize, attempt: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    (lost + 1 + (i + attempt) % (n - 1)) % n
}

/// One publisher per node (its own pooled HTTP connections, dropped with
/// it before the server's descriptors are compared with their baseline).
pub struct Publishers {
    nodes: Arc<Nodes>,
    each: Vec<Publisher>,
}

impl Publishers {
    /// Each node's Action Cable publishes go to `/_broadcast` on its own
    /// port unless `broadcast.url` names one endpoint (one node only).
    pub fn new(proto: Proto, nodes: Arc<Nodes>, broadcast: &Broadcast) -> Publishers {
        let each = nodes
            .targets
            .iter()
            .map(|t| Publisher::new(proto, t, broadcast))
            .collect();
        Publishers { nodes, each }
    }

    /// The first node from `prefer` (mod the count) that the bench is not
    /// restarting, and its publisher. When every node is down (one node
    /// being restarted), `prefer`'s: the publish fails and is not counted.
    pub fn pick(&self, prefer: usize) -> (usize, &Publisher) {
        let n = self.each.len();
        let node = (0..n)
            .map(|k| (prefer + k) % n)
            .find(|&k| !self.nodes.is_down(k))
            .unwrap_or(prefer % n);
        (node, &self.each[node])
    }

    pub fn target(&self, node: usize) -> &Target {
        self.nodes.target(node)
    }
}

/// The signal the restart command is asked to stop a node with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: a graceful shutdown.
    Term,
    /// SIGKILL: the node dies at once.
    Kill,
}

impl Signal {
    /// As `kill -s` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Term => "TERM",
            Signal::Kill => "KILL",
        }
    }
}

/// How a node is restarted: a shell command (`sh -c`) in which `{n}` is
/// the node's index (0, 1, ...) and `{signal}` `TERM` or `KILL`. It must
/// stop the node, start it again and return once it listens; a non-zero
/// exit or a command still running after `timeout` is reported.
#[derive(Debug, Clone)]
pub struct Restart {
    pub command: String,
    pub signal: Signal,
    pub timeout: Duration,
}

impl Restart {
    pub fn command_for(&self, node: usize) -> String {
        self.command
            .replace("{n}", &node.to_string())
            .replace("{signal}", self.signal.name())
    }

    /// Run the command for `node`; how long it took, or why it failed.
    pub async fn run(&self, node: usize) -> Result<Duration, String> {
        super::fault::shell(&self.command_for(node), self.timeout).await
    }
}

/// Restart every node in turn: mark it down (publishers go elsewhere), run
/// the command, then wait (at most `limit`) until no client is left on it
/// and `away()` (clients that lost their node and are not back, given-up
/// ones excluded) is 0. Per node: `restart_took{node:N}` (the command) and
/// `all_back_after_restart{node:N}` (from the command's start to every
/// client back; absent when they were not).
pub async fn roll(
    restart: &Restart,
    nodes: &Nodes,
    away: impl Fn() -> usize,
    limit: Duration,
    report: &mut Report,
) {
    for node in 0..nodes.len() {
        let started = Instant::now();
        nodes.set_down(node, true);
        let ran = restart.run(node).await;
        nodes.set_down(node, false);
        match &ran {
            Ok(took) => report.value(
                &format!("restart_took{{node:{node}}}"),
                Some(took.as_secs_f64()),
                "s",
            ),
            Err(e) => {
                eprintln!("herald bench: restart of node {node}: {e}");
                report.notes.push(format!("restart of node {node}: {e}"));
            }
        }
        let deadline = Instant::now() + limit;
        let mut back = false;
        while Instant::now() < deadline {
            if nodes.clients_on(node) == 0 && away() == 0 {
                back = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !back {
            report.notes.push(format!(
                "after node {node}'s restart not every client was back within {limit:?} \
                 ({} still on it, {} away)",
                nodes.clients_on(node),
                away()
            ));
        }
        report.value(
            &format!("all_back_after_restart{{node:{node}}}"),
            back.then(|| started.elapsed().as_secs_f64()),
            "s",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Nodes {
        Nodes::new(
            (0..n)
                .map(|k| {
                    Target::new(
                        &format!("ws://127.0.0.1:{}", 1000 + k),
                        "a",
                        "b",
                        "c",
                        false,
                    )
                    .unwrap()
                })
                .collect(),
        )
    }

    #[test]
    fn a_lost_node_s_clients_share_the_others_and_skip_on_failure() {
        let ns = nodes(3);
        assert_eq!(
            (0..6).map(|i| ns.first_for(i)).collect::<Vec<_>>(),
            [0, 1, 2, 0, 1, 2]
        );
        // Node 0's clients 0 and 3 go to 1 and 2; never to 0.
        assert_eq!(ns.next_for(0, 0, 0), 1);
        assert_eq!(ns.next_for(3, 0, 0), 2);
        assert_eq!(ns.next_for(0, 0, 1), 2);
        for i in 0..10 {
            for a in 0..4 {
                assert_ne!(ns.next_for(i, 1, a), 1);
            }
        }
        assert_eq!(nodes(1).next_for(5, 0, 3), 0);
    }

    #[test]
    fn publishers_skip_the_node_being_restarted() {
        let ns = Arc::new(nodes(3));
        let p = Publishers::new(Proto::ActionCableExt, ns.clone(), &Broadcast::default());
        assert_eq!(p.pick(4).0, 1);
        ns.set_down(1, true);
        assert_eq!(p.pick(4).0, 2);
        assert_eq!(p.pick(4).1.url(), "http://127.0.0.1:1002/_broadcast");
        let one = Arc::new(nodes(1));
        let p = Publishers::new(Proto::ActionCableExt, one.clone(), &Broadcast::default());
        one.set_down(0, true);
        assert_eq!(p.pick(3).0, 0);
    }

    #[tokio::test]
    async fn the_command_gets_the_node_and_signal_and_its_failure_is_told() {
        let r = Restart {
            command: "test {n} = 2 && test {signal} = KILL".into(),
            signal: Signal::Kill,
            timeout: Duration::from_secs(10),
        };
        assert!(r.run(2).await.is_ok());
        let e = r.run(1).await.unwrap_err();
        assert!(e.contains("`test 1 = 2 && test KILL = KILL` failed"), "{e}");
        let slow = Restart {
            command: "sleep 5".into(),
            signal: Signal::Term,
            timeout: Duration::from_millis(100),
        };
        assert!(slow.run(0).await.unwrap_err().contains("still running"));
    }
}
