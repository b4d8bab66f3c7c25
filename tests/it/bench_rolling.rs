//! `herald bench storm --node-url ... --restart-cmd ...` at small scale:
//! three real `herald serve` nodes on a real `redis-server` (and on
//! `nats-server -js`), started and restarted by `bench/node.sh` (the same
//! script bench/rolling.sh measures with), a real `herald bench
//! rpc-server` as their app, publishers going on throughout. Each node is
//! stopped with SIGTERM and started again in turn while its clients
//! reconnect to the others: over `actioncable-ext` every returning client
//! restores its session on another node (no new `Connect`) and gets every
//! message once, in order; plain `actioncable` clients under the same
//! ledger (two nodes, to keep the test short) lose what was published
//! while they were away (so the ledger can fail). Counts, never speeds.

use crate::common;

use common::{figure, free_port, herald_command, RpcServer, APP_ID, APP_KEY, APP_SECRET};
use herald_bench::proto::Proto;
use herald_bench::report::Report;
use herald_bench::rolling::{Restart, Signal};
use herald_bench::storm::{self, StormParams};
use herald_bench::Target;
use herald_broker::testing::{BrokerServer, Kind};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CLIENTS: usize = 30;

/// A port for a node, below the kernel's ephemeral range (32768 and up
/// here): while a node is down for its restart, the clients reconnecting
/// elsewhere take ephemeral source ports, and one of them must not be the
/// node's. Free now; a test that loses it to another test tries another.
fn node_port() -> u16 {
    loop {
        let port = rand::random_range(20_000..32_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

fn node_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/node.sh")
}

/// Three nodes run by `bench/node.sh` in `dir`; stopped (SIGKILL) on drop,
/// with the app and the broker.
struct Cluster {
    dir: PathBuf,
    ports: Vec<u16>,
    _app: RpcServer,
    _broker: BrokerServer,
}

impl Cluster {
    fn node(&self, action: &str, n: usize, signal: &str) -> std::process::Output {
        Command::new("bash")
            .arg(node_script())
            .args([action, &n.to_string(), signal])
            .env("NODE_DIR", &self.dir)
            .stdin(Stdio::null())
            .output()
            .expect("run bench/node.sh")
    }

    async fn start(broker: BrokerServer, name: &str, nodes: usize) -> Cluster {
        let dir =
            std::env::temp_dir().join(format!("herald-rolling-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let rpc = free_port();
        let ports: Vec<u16> = (0..nodes).map(|_| node_port()).collect();
        let app = herald_command()
            .args(["bench", "rpc-server", "--port", &rpc.to_string()])
            .args(["--threads", "1", "--broadcast-url"])
            .arg(format!("http://127.0.0.1:{}/_broadcast", ports[0]))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn herald bench rpc-server");
        let mut cluster = Cluster {
            dir: dir.clone(),
            ports: ports.clone(),
            _app: RpcServer(app),
            _broker: broker,
        };
        let url = cluster._broker.url();
        for n in 0..nodes {
            let mut tries = 0;
            while let Err(e) = cluster.start_node(n, &url, rpc, name) {
                tries += 1;
                assert!(tries < 5, "node {n} did not start: {e}");
                cluster.ports[n] = node_port();
            }
        }
        // The app listens too.
        let deadline = Instant::now() + common::TIMEOUT;
        while std::net::TcpStream::connect(("127.0.0.1", rpc)).is_err() {
            assert!(Instant::now() < deadline, "rpc-server did not listen");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cluster
    }

    /// Write node `n`'s files and start it; its stderr when it does not.
    fn start_node(&self, n: usize, url: &str, rpc: u16, name: &str) -> Result<(), String> {
        let (dir, port) = (&self.dir, self.ports[n]);
        // A short grace: SIGTERM closes every client at once anyway.
        let config = format!(
            "host = \"127.0.0.1\"\nport = {port}\nshutdown_grace = 3\nlog = \"warn\"\n\
                 [broker]\nurl = \"{url}\"\nprefix = \"roll-{name}\"\n\
                 [rpc]\nhost = \"127.0.0.1:{rpc}\"\ntimeout_ms = 5000\n\
                 [[apps]]\nid = \"{APP_ID}\"\nkey = \"{APP_KEY}\"\nsecret = \"{APP_SECRET}\"\n"
        );
        let toml = dir.join(format!("node-{n}.toml"));
        std::fs::write(&toml, config).unwrap();
        let bin = env!("CARGO_BIN_EXE_herald");
        std::fs::write(
            dir.join(format!("node-{n}.cmd")),
            format!("{bin} serve --config {}", toml.display()),
        )
        .unwrap();
        std::fs::write(dir.join(format!("node-{n}.port")), port.to_string()).unwrap();
        std::fs::write(
            dir.join(format!("node-{n}.ready")),
            format!("http://127.0.0.1:{port}/ready"),
        )
        .unwrap();
        let out = self.node("start", n, "TERM");
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(())
    }

    fn storm(&self, protocol: Proto) -> StormParams {
        let targets: Vec<Target> = self
            .ports
            .iter()
            .map(|p| {
                Target::new(
                    &format!("ws://127.0.0.1:{p}"),
                    APP_ID,
                    APP_KEY,
                    APP_SECRET,
                    false,
                )
                .unwrap()
            })
            .collect();
        StormParams {
            protocol,
            clients: CLIENTS,
            channels: 3,
            // 5 publishes per second per channel: every gap (1.5 s and
            // more) spans several of them.
            rate: 15.0,
            give_up: Duration::from_secs(40),
            settle: Duration::from_secs(10),
            timeout: Duration::from_secs(10),
            progress: false,
            restart: Some(Restart {
                command: format!(
                    "NODE_DIR='{}' bash '{}' restart {{n}} {{signal}}",
                    self.dir.display(),
                    node_script().display()
                ),
                signal: Signal::Term,
                timeout: Duration::from_secs(60),
            }),
            nodes: targets.clone(),
            ..StormParams::new(targets[0].clone())
        }
    }

    fn logs(&self) -> String {
        (0..self.ports.len())
            .map(|n| {
                let log = std::fs::read_to_string(self.dir.join(format!("node-{n}.log")))
                    .unwrap_or_default();
                format!("--- node {n}:\n{}", tail(&log, 3000))
            })
            .collect()
    }
}

fn tail(s: &str, n: usize) -> &str {
    let mut i = s.len().saturating_sub(n);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in 0..self.ports.len() {
            let _ = self.node("stop", n, "KILL");
        }
    }
}

/// What both protocols must show: every node restarted, everyone back
/// after each, messages published while they were away.
fn assert_rolled_with_gaps(r: &Report, nodes: usize, logs: &str) {
    let summary = r.summary();
    for n in 0..nodes {
        assert!(
            r.figure(&format!("restart_took{{node:{n}}}")).is_some(),
            "node {n} not restarted:\n{summary}\n{logs}"
        );
        assert!(
            r.figure(&format!("all_back_after_restart{{node:{n}}}"))
                .is_some(),
            "not all back after node {n}:\n{summary}\n{logs}"
        );
    }
    assert_eq!(r.fraction("connected_before_storm"), Some(1.0), "{summary}");
    assert_eq!(r.fraction("back_and_subscribed"), Some(1.0), "{summary}");
    assert_eq!(r.count("reconnects_given_up"), 0, "{summary}");
    assert!(r.count("messages_published") > 30, "{summary}");
    // Every client lost its node at least once while its channel published.
    assert!(
        r.count("messages_published_during_gaps") >= CLIENTS as u64,
        "{summary}"
    );
    assert_eq!(r.count("messages_unexpected"), 0, "{summary}");
    assert_eq!(r.count("messages_duplicated"), 0, "{summary}\n{logs}");
}

async fn extended_clients_miss_nothing(broker: BrokerServer, name: &str) {
    let c = Cluster::start(broker, name, 3).await;
    let r = storm::run(&c.storm(Proto::ActionCableExt)).await.unwrap();
    let (summary, logs) = (r.summary(), c.logs());
    assert!(summary.contains("rolling_restart"), "{summary}");
    assert_rolled_with_gaps(&r, 3, &logs);
    assert_eq!(r.count("messages_missed"), 0, "{summary}\n{logs}");
    assert_eq!(r.count("messages_out_of_order"), 0, "{summary}\n{logs}");
    assert_eq!(
        r.count("messages_received"),
        r.count("messages_expected"),
        "{summary}"
    );
    // Each reconnect restored its session on another node and none called
    // the app's Connect; no history request was rejected. (A client just
    // back may lose its new node to the next restart before its
    // `confirm_history` arrives: the bench moves on once every client is
    // subscribed, so a confirmation can be short of a restore.)
    let restored = r.count("sessions_restored");
    assert!(restored >= CLIENTS as u64, "{summary}");
    assert_eq!(r.count("sessions_fresh"), 0, "{summary}\n{logs}");
    let confirmed = r.count("history_confirmed");
    assert!(
        confirmed <= restored && confirmed + 3 >= restored,
        "{summary}"
    );
    assert_eq!(r.count("history_rejected"), 0, "{summary}\n{logs}");
    assert_eq!(figure(&r, "connect_calls_during_storm"), 0.0, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_clients_miss_nothing_across_a_rolling_restart_over_redis() {
    extended_clients_miss_nothing(BrokerServer::start(Kind::Redis), "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_clients_miss_nothing_across_a_rolling_restart_over_nats() {
    extended_clients_miss_nothing(BrokerServer::start_jetstream(), "nats").await;
}

/// Two nodes: @rails/actioncable comes back 6 to 18 s after a close, and
/// each restart waits for everyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_clients_lose_what_was_published_while_their_node_was_away() {
    let c = Cluster::start(BrokerServer::start(Kind::Redis), "plain", 2).await;
    let r = storm::run(&c.storm(Proto::ActionCable)).await.unwrap();
    let summary = r.summary();
    assert_rolled_with_gaps(&r, 2, &c.logs());
    let missed = r.count("messages_missed");
    assert!(missed >= CLIENTS as u64 * 5, "{summary}");
    assert!(
        missed <= r.count("messages_published_during_gaps") + CLIENTS as u64,
        "{summary}"
    );
    assert_eq!(
        r.fraction("returning_clients_missing"),
        Some(1.0),
        "{summary}"
    );
    assert!(r.get("sessions_restored").is_none(), "{summary}");
    assert!(
        figure(&r, "connect_calls_during_storm") >= CLIENTS as f64,
        "{summary}"
    );
}
