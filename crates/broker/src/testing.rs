//! Real broker servers for tests: `redis-server` or `nats-server` (Debian's
//! packages; the README's test command installs them) on a free loopback
//! port, killed on drop, restartable on the same port; a cluster of
//! `nats-server`s routed together ([`NatsCluster`]); and a Redis Cluster
//! of six `redis-server`s, three masters and three replicas
//! ([`RedisCluster`]).

pub use crate::testing_tls::Tls;
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
    /// TLS only ([`BrokerServer::start_tls`]).
    tls: Option<Tls>,
}

/// A loopback port nobody listens on now and that no other caller in this
/// process has been given. Tests run in parallel threads: two of them could
/// each be handed the same just-released port, start a server on it, and
/// the loser's readiness check would connect to the winner's server (then
/// fail once the winner's test kills it). Remembering every port handed
/// out rules that out; a test process uses a few hundred at most.
pub fn free_port() -> u16 {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static GIVEN: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let given = GIVEN.get_or_init(Default::default);
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind an ephemeral port")
            .local_addr()
            .unwrap()
            .port();
        if given.lock().unwrap().insert(port) {
            return port;
        }
    }
}

impl BrokerServer {
    /// Start one on a free port; panics with a clear message if the server
    /// binary is missing.
    pub fn start(kind: Kind) -> BrokerServer {
        Self::start_with(kind, false, None)
    }

    /// `nats-server -js` (JetStream, its store in a fresh directory).
    pub fn start_jetstream() -> BrokerServer {
        Self::start_with(Kind::Nats, true, None)
    }

    /// TLS only: `redis-server --port 0 --tls-port …` or `nats-server
    /// --tls …` (with `--tlsverify` when [`Tls::client`] is set); the URL
    /// is `rediss://` or `tls://`.
    pub fn start_tls(kind: Kind, tls: Tls) -> BrokerServer {
        Self::start_with(kind, false, Some(tls))
    }

    fn start_with(kind: Kind, jetstream: bool, tls: Option<Tls>) -> BrokerServer {
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
                tls: tls.clone(),
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
                match &self.tls {
                    Some(t) => c.args(t.server_args(self.port)),
                    None => c.args(["--port", &port]),
                };
                c.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
                c
            }
            Kind::Nats => {
                let mut c = Command::new("nats-server");
                c.args(["-a", "127.0.0.1", "-p", &port]);
                if let Some(t) = &self.tls {
                    c.arg("--tls")
                        .arg("--tlscert")
                        .arg(&t.cert)
                        .arg("--tlskey")
                        .arg(&t.key)
                        .arg("--tlscacert")
                        .arg(t.ca());
                    if t.client.is_some() {
                        c.arg("--tlsverify");
                    }
                }
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
        match (self.kind, self.tls.is_some()) {
            (Kind::Redis, false) => format!("redis://127.0.0.1:{}", self.port),
            (Kind::Redis, true) => format!("rediss://127.0.0.1:{}", self.port),
            (Kind::Nats, false) => format!("nats://127.0.0.1:{}", self.port),
            (Kind::Nats, true) => format!("tls://127.0.0.1:{}", self.port),
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
    /// Route URLs per member instead of every other member's (a slow route).
    routes: Option<Vec<Vec<String>>>,
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
        let mut c = Self::unstarted(n, jetstream);
        for i in 0..n {
            c.spawn(i);
        }
        c
    }

    /// Two servers whose only route passes through a relay that delays
    /// it by `delay` each way: member 1 routes to member 0 through it,
    /// member 0 routes to nobody. What one server's clients subscribe
    /// reaches the other `delay` late.
    pub fn start_slow_route(delay: Duration) -> NatsCluster {
        let mut c = Self::unstarted(2, false);
        let relay = crate::testing_delay::DelayRelay::start(c.members[0].route_port, delay);
        c.routes = Some(vec![
            Vec::new(),
            vec![format!("nats://127.0.0.1:{}", relay.port)],
        ]);
        c.spawn(0);
        c.spawn(1);
        c.wait_routed();
        c
    }

    /// `n` members with their ports (and stores), none started; each routes
    /// to every other.
    fn unstarted(n: usize, jetstream: bool) -> NatsCluster {
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
        NatsCluster {
            members,
            name,
            routes: None,
        }
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
        let routes: Vec<String> = match &self.routes {
            Some(r) => r[i].clone(),
            None => self
                .members
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, m)| format!("nats://127.0.0.1:{}", m.route_port))
                .collect(),
        };
        let m = &self.members[i];
        let mut cmd = Command::new("nats-server");
        cmd.args(["-a", "127.0.0.1", "-p", &m.port.to_string()])
            .args(["-m", &m.monitor_port.to_string()])
            .args(["--cluster", &format!("nats://127.0.0.1:{}", m.route_port)])
            .args(["--cluster_name", &self.name])
            .args(["--server_name", &format!("n{i}")]);
        if !routes.is_empty() {
            cmd.args(["--routes", &routes.join(",")]);
        }
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

/// Six `redis-server --cluster-enabled yes` on loopback (own ports for
/// clients and the cluster bus, files in a temp dir) made into one cluster
/// of three masters with a replica each by `redis-cli --cluster create`,
/// `cluster-node-timeout` 1000 ms so a killed master's replica is
/// promoted within a few seconds. Killed on drop. [`RedisCluster::start_tls`]:
/// the same over TLS only (clients, the cluster bus and replication).
pub struct RedisCluster {
    dir: std::path::PathBuf,
    ports: Vec<u16>,
    children: Vec<Option<Child>>,
    /// SIGSTOPped servers (never asked anything: they would not answer).
    frozen: Vec<u16>,
    tls: Option<Tls>,
}

/// One line of `CLUSTER NODES`: port, flags, the slot ranges it owns.
#[derive(Debug, Clone)]
pub struct ClusterNode {
    pub port: u16,
    pub master: bool,
    pub failed: bool,
    pub slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Start the six servers, create the cluster, and wait (at most 30 s)
    /// until every node says `cluster_state:ok` and every replica's link
    /// to its master is up.
    pub fn start() -> RedisCluster {
        // A bus port taken between choosing and binding it can leave one
        // server unmet, and `--cluster create` waiting for it forever:
        // bounded, and the whole cluster made again.
        Self::start_with(None)
    }

    /// [`RedisCluster::start`] over TLS only: `rediss-cluster://` URLs.
    pub fn start_tls(tls: Tls) -> RedisCluster {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<Tls>) -> RedisCluster {
        for _ in 0..3 {
            if let Some(c) = Self::try_start(tls.clone()) {
                return c;
            }
        }
        panic!("the Redis Cluster could not be created three times");
    }

    fn try_start(tls: Option<Tls>) -> Option<RedisCluster> {
        let dir = std::env::temp_dir().join(format!(
            "herald-rcluster-{}-{}",
            std::process::id(),
            free_port()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the cluster's directory");
        let mut c = RedisCluster {
            dir,
            ports: Vec::new(),
            children: Vec::new(),
            frozen: Vec::new(),
            tls,
        };
        for _ in 0..6 {
            // A free port may be taken before the server binds it (other
            // tests pick ports too): try new ones a few times.
            let mut started = None;
            for _ in 0..5 {
                let port = free_port();
                if let Some(child) = c.spawn(port) {
                    started = Some((port, child));
                    break;
                }
            }
            let (port, child) = started.expect("redis-server did not start on 5 free ports");
            c.ports.push(port);
            c.children.push(Some(child));
        }
        let mut create = Command::new("timeout");
        create.args(["20", "redis-cli"]);
        if let Some(t) = &c.tls {
            create.args(t.cli_args());
        }
        create.args(["--cluster", "create"]);
        for p in &c.ports {
            create.arg(format!("127.0.0.1:{p}"));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        if !out.status.success() {
            eprintln!(
                "redis-cli --cluster create failed ({}), trying again: {}",
                out.status,
                String::from_utf8_lossy(&out.stdout)
            );
            return None;
        }
        c.wait_ok();
        Some(c)
    }

    /// A cluster-enabled `redis-server` on `port` (and a free bus port),
    /// once it accepts connections; None if it exited (a port taken).
    fn spawn(&self, port: u16) -> Option<Child> {
        let bus = free_port();
        let mut cmd = Command::new("redis-server");
        match &self.tls {
            Some(t) => cmd.args(t.server_args(port)),
            None => cmd.args(["--port", &port.to_string()]),
        };
        let mut child = cmd
            .args(["--cluster-port", &bus.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
            .args(["--cluster-node-timeout", "1000"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run redis-server ({e}); apt-get install redis-server")
            });
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(_)) = child.try_wait() {
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server {port} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(child)
    }

    /// `redis-cli -p port args…`'s output (empty if it fails).
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(self.tls.iter().flat_map(Tls::cli_args))
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// Ports of the servers running now (not killed, not frozen).
    pub fn running(&self) -> Vec<u16> {
        self.ports
            .iter()
            .zip(&self.children)
            .filter(|(p, c)| c.is_some() && !self.frozen.contains(p))
            .map(|(p, _)| *p)
            .collect()
    }

    /// The cluster as a running server sees it.
    pub fn nodes(&self) -> Vec<ClusterNode> {
        for port in self.running() {
            let text = self.cli(port, &["cluster", "nodes"]);
            if text.trim().is_empty() {
                continue;
            }
            return text
                .lines()
                .filter_map(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    let addr = f.get(1)?;
                    let port = addr.split('@').next()?.rsplit(':').next()?.parse().ok()?;
                    let flags = f.get(2)?;
                    let slots = f
                        .iter()
                        .skip(8)
                        .filter(|s| !s.starts_with('['))
                        .filter_map(|s| {
                            let (a, b) = s.split_once('-').unwrap_or((s, s));
                            Some((a.parse().ok()?, b.parse().ok()?))
                        })
                        .collect();
                    Some(ClusterNode {
                        port,
                        master: flags.contains("master"),
                        failed: flags.contains("fail") && !flags.contains("fail?"),
                        slots,
                    })
                })
                .collect();
        }
        Vec::new()
    }

    /// The port of the master that owns `slot` now.
    pub fn master_of_slot(&self, slot: u16) -> Option<u16> {
        self.nodes()
            .into_iter()
            .find(|n| {
                n.master && !n.failed && n.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
            })
            .map(|n| n.port)
    }

    /// Wait (at most 30 s) until every running node says
    /// `cluster_state:ok`, three live masters own all the slots, and every
    /// running replica's link to its master is up.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let states_ok = self.running().iter().all(|&p| {
                self.cli(p, &["cluster", "info"])
                    .contains("cluster_state:ok")
            });
            let nodes = self.nodes();
            let owned: u32 = nodes
                .iter()
                .filter(|n| n.master && !n.failed)
                .flat_map(|n| n.slots.iter().map(|(a, b)| u32::from(b - a) + 1))
                .sum();
            let running = self.running();
            let replicas_up = nodes
                .iter()
                .filter(|n| !n.master && running.contains(&n.port))
                .all(|n| {
                    self.cli(n.port, &["info", "replication"])
                        .contains("master_link_status:up")
                });
            // Every running server known to the view, and no master
            // without slots: on a busy machine a fresh node can be listed
            // late, or as a master before it becomes a replica, and
            // "every replica is up" would then hold of none.
            let all_known = running.iter().all(|p| nodes.iter().any(|n| n.port == *p));
            let masters_serve = nodes
                .iter()
                .filter(|n| n.master && !n.failed && running.contains(&n.port))
                .all(|n| !n.slots.is_empty());
            if states_ok && owned == 16384 && replicas_up && all_known && masters_serve {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the Redis Cluster is not ok: {:?}",
                self.nodes()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis-cluster://` with the first three servers as seeds.
    pub fn url(&self) -> String {
        self.url_of(&self.ports[..3])
    }

    /// `redis-cluster://` (`rediss-cluster://` over TLS) with these
    /// servers as seeds.
    pub fn url_of(&self, ports: &[u16]) -> String {
        let seeds: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let scheme = if self.tls.is_some() {
            "rediss-cluster"
        } else {
            "redis-cluster"
        };
        format!("{scheme}://{}", seeds.join(","))
    }

    /// The ports of the replicas now.
    pub fn replicas(&self) -> Vec<u16> {
        self.nodes()
            .into_iter()
            .filter(|n| !n.master && !n.failed)
            .map(|n| n.port)
            .collect()
    }

    /// SIGKILL the server on `port` and wait until it is gone.
    pub fn kill(&mut self, port: u16) {
        if let Some(i) = self.ports.iter().position(|p| *p == port) {
            if let Some(mut c) = self.children[i].take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) the server on `port`.
    pub fn freeze(&mut self, port: u16, stop: bool) {
        if let Some(i) = self.ports.iter().position(|p| *p == port) {
            if let Some(c) = &self.children[i] {
                signal(c.id(), stop);
            }
        }
        self.frozen.retain(|p| *p != port);
        if stop {
            self.frozen.push(port);
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for p in self.ports.clone() {
            self.kill(p);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
