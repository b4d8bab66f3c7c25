//! Real broker servers for tests: `redis-server` or `nats-server` (Debian's
//! packages; the README's test command installs them) on a free loopback
//! port, killed on drop, restartable on the same port; and a cluster of
//! `nats-server`s routed together ([`NatsCluster`]).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Redis,
    Nats,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Redis => "redis",
            Kind::Nats => "nats",
        }
    }
}

/// A running broker server.
pub struct BrokerServer {
    pub kind: Kind,
    pub port: u16,
    child: Option<Child>,
    /// `nats-server -js`: its store directory (kept across restarts).
    store: Option<std::path::PathBuf>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind an ephemeral port")
        .local_addr()
        .unwrap()
        .port()
}

impl BrokerServer {
    /// Start one on a free port; panics with a clear message if the server
    /// binary is missing.
    pub fn start(kind: Kind) -> BrokerServer {
        Self::start_with(kind, false)
    }

    /// `nats-server -js` (JetStream, its store in a fresh directory).
    pub fn start_jetstream() -> BrokerServer {
        Self::start_with(Kind::Nats, true)
    }

    fn start_with(kind: Kind, jetstream: bool) -> BrokerServer {
        for _ in 0..5 {
            let port = free_port();
            let store = jetstream.then(|| {
                let d =
                    std::env::temp_dir().join(format!("herald-js-{}-{port}", std::process::id()));
                let _ = std::fs::remove_dir_all(&d);
                d
            });
            let mut s = BrokerServer {
                kind,
                port,
                child: None,
                store,
            };
            if s.spawn() {
                return s;
            }
        }
        panic!("{} did not start", kind.name());
    }

    fn spawn(&mut self) -> bool {
        let port = self.port.to_string();
        let mut cmd = match self.kind {
            Kind::Redis => {
                let mut c = Command::new("redis-server");
                c.args([
                    "--port",
                    &port,
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ]);
                c
            }
            Kind::Nats => {
                let mut c = Command::new("nats-server");
                c.args(["-a", "127.0.0.1", "-p", &port]);
                if let Some(dir) = &self.store {
                    c.arg("-js").arg("-sd").arg(dir);
                }
                c
            }
        };
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {}-server ({e}); install it (apt-get install redis-server nats-server) or run ./scripts/test",
                    self.kind.name()
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                return false;
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The URL nodes connect to.
    pub fn url(&self) -> String {
        match self.kind {
            Kind::Redis => format!("redis://127.0.0.1:{}", self.port),
            Kind::Nats => format!("nats://127.0.0.1:{}", self.port),
        }
    }

    /// Kill it (SIGKILL) and wait until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same port.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.spawn() {
            assert!(
                Instant::now() < deadline,
                "{} did not restart",
                self.kind.name()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for BrokerServer {
    fn drop(&mut self) {
        self.kill();
        if let Some(dir) = &self.store {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl BrokerServer {
    /// The server's process id (to SIGSTOP it: a broker that stops
    /// delivering without closing anyone's socket).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) the server.
    pub fn freeze(&self, stop: bool) {
        if let Some(pid) = self.pid() {
            signal(pid, stop);
        }
    }
}

fn signal(pid: u32, stop: bool) {
    let sig = if stop { "-STOP" } else { "-CONT" };
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid} failed");
}

/// One `nats-server` of a [`NatsCluster`].
struct Member {
    port: u16,
    route_port: u16,
    monitor_port: u16,
    child: Option<Child>,
    store: Option<std::path::PathBuf>,
}

/// Several `nats-server` processes routed into one cluster on loopback
/// (`--cluster`, `--routes` to every other member, one cluster name; the
/// monitoring port binds the `-a` address too),
/// optionally with JetStream (`-js`, a store each, unique server names).
/// Killed on drop; a member can be killed, restarted on its ports, frozen.
pub struct NatsCluster {
    members: Vec<Member>,
    name: String,
}

impl NatsCluster {
    /// Start `n` servers and wait until every one has a route to every
    /// other (from their monitoring endpoint), at most 20 s.
    pub fn start(n: usize, jetstream: bool) -> NatsCluster {
        let c = Self::start_unrouted(n, jetstream);
        c.wait_routed();
        c
    }

    /// Start `n` servers without waiting for their routes (as a user
    /// starting servers and nodes together would).
    pub fn start_unrouted(n: usize, jetstream: bool) -> NatsCluster {
        let name = format!("herald-{}-{}", std::process::id(), free_port());
        let members = (0..n)
            .map(|i| Member {
                port: free_port(),
                route_port: free_port(),
                monitor_port: free_port(),
                child: None,
                store: jetstream.then(|| {
                    let d = std::env::temp_dir().join(format!("{name}-js-{i}"));
                    let _ = std::fs::remove_dir_all(&d);
                    d
                }),
            })
            .collect();
        let mut c = NatsCluster { members, name };
        for i in 0..n {
            c.spawn(i);
        }
        c
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i`'s client URL.
    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.members[i].port)
    }

    /// Every member's client URL, comma-separated (as NATS clients take them).
    pub fn urls(&self) -> String {
        (0..self.len())
            .map(|i| self.url(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    fn spawn(&mut self, i: usize) {
        let routes: Vec<String> = self
            .members
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, m)| format!("nats://127.0.0.1:{}", m.route_port))
            .collect();
        let m = &self.members[i];
        let mut cmd = Command::new("nats-server");
        cmd.args(["-a", "127.0.0.1", "-p", &m.port.to_string()])
            .args(["-m", &m.monitor_port.to_string()])
            .args(["--cluster", &format!("nats://127.0.0.1:{}", m.route_port)])
            .args(["--cluster_name", &self.name])
            .args(["--routes", &routes.join(",")])
            .args(["--server_name", &format!("n{i}")]);
        if let Some(dir) = &m.store {
            cmd.arg("-js").arg("-sd").arg(dir);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run nats-server ({e}); apt-get install nats-server")
            });
        let port = m.port;
        self.members[i].child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(Ok(Some(st))) = self.members[i].child.as_mut().map(|c| c.try_wait()) {
                panic!("nats-server {i} exited at start ({st}); a port may be taken");
            }
            assert!(Instant::now() < deadline, "nats-server {i} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The body of member `i`'s monitoring endpoint `path`, `None` if it
    /// does not answer.
    fn monitor(&self, i: usize, path: &str) -> Option<String> {
        use std::io::{Read, Write};
        let mut s =
            std::net::TcpStream::connect(("127.0.0.1", self.members[i].monitor_port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        Some(body)
    }

    /// Routes member `i` has now (its `/routez`), `None` if it does not answer.
    pub fn routes(&self, i: usize) -> Option<usize> {
        let body = self.monitor(i, "/routez")?;
        let at = body.find("\"num_routes\":")? + "\"num_routes\":".len();
        body[at..]
            .trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    }

    /// The member leading JetStream stream `name` and how many copies it
    /// has (from the running members' `/jsz`), `None` if no running member
    /// reports it.
    pub fn stream_leader(&self, name: &str) -> Option<(usize, usize)> {
        for i in 0..self.len() {
            if self.members[i].child.is_none() {
                continue;
            }
            let Some(body) = self.monitor(i, "/jsz?streams=true") else {
                continue;
            };
            let Some(json) = body.split_once("\r\n\r\n").map(|(_, b)| b) else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
                continue;
            };
            let accounts = v["account_details"].as_array().cloned().unwrap_or_default();
            for a in accounts {
                for st in a["stream_detail"].as_array().cloned().unwrap_or_default() {
                    if st["name"] != name {
                        continue;
                    }
                    let copies = 1 + st["cluster"]["replicas"].as_array().map_or(0, Vec::len);
                    let leader = st["cluster"]["leader"].as_str()?;
                    let n: usize = leader.strip_prefix('n')?.parse().ok()?;
                    return Some((n, copies));
                }
            }
        }
        None
    }

    /// Wait until every running member routes to every other running one.
    pub fn wait_routed(&self) {
        let running: Vec<usize> = (0..self.len())
            .filter(|i| self.members[*i].child.is_some())
            .collect();
        let want = running.len() - 1;
        let deadline = Instant::now() + Duration::from_secs(20);
        for &i in &running {
            loop {
                if self.routes(i).is_some_and(|r| r >= want) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "nats-server {i} has {:?} routes, wanted {want}",
                    self.routes(i)
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// SIGKILL member `i` and wait until it is gone.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start member `i` again on its ports and wait for the routes.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        self.wait_routed();
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) member `i`.
    pub fn freeze(&self, i: usize, stop: bool) {
        if let Some(pid) = self.pid(i) {
            signal(pid, stop);
        }
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.len() {
            self.kill(i);
            if let Some(dir) = &self.members[i].store {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}
