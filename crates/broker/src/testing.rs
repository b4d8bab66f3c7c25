//! Real broker servers for tests: `redis-server` or `nats-server` (Debian's
//! packages; the README's test command installs them) on a free loopback
//! port, killed on drop, restartable on the same port.

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
