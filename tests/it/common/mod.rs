//! Shared helpers for the integration tests: a real `herald` process on a
//! free port, WebSocket clients speaking Pusher v7, and a signed HTTP API
//! client. Everything waits for a concrete event with a timeout; nothing
//! sleeps and hopes.

#![allow(dead_code)]

/// One test body run twice, on Redis and on NATS (`Kind` in scope):
/// `both!(name)` beside `async fn name(kind: Kind)`.
#[allow(unused_macros)]
macro_rules! both {
    ($name:ident) => {
        mod $name {
            use super::*;
            #[tokio::test]
            async fn redis() {
                super::$name(Kind::Redis).await
            }
            #[tokio::test]
            async fn nats() {
                super::$name(Kind::Nats).await
            }
        }
    };
}

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub mod ext;
pub mod mariadb;
pub mod postgres;
pub mod proxy;

pub const APP_ID: &str = "test-app";
pub const APP_KEY: &str = "test-key";
pub const APP_SECRET: &str = "test-secret";

/// How long any single expected event may take. Generous: the suite runs on
/// loaded machines, and a passing test never waits this long.
pub const TIMEOUT: Duration = Duration::from_secs(10);

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A unique scratch directory for one server's config and log.
fn scratch_dir() -> PathBuf {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("herald-it-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// A port nobody listens on right now, never given to another test of this
/// process (see [`herald_broker::testing::free_port`]). The server may
/// still lose a race for it to an outside process, so
/// [`Server::start_with`] retries with a new port.
pub use herald_broker::testing::free_port;

/// `herald` as a child that dies with the test: `PR_SET_PDEATHSIG` makes
/// the kernel send it SIGKILL when the thread that spawned it ends, so a
/// test that panics before its guard is dropped, aborts, or is killed (a
/// harness timeout, ^C) leaves no server running. [`Server`] and
/// [`Spawned`] also kill it on drop; this covers the paths where drop never
/// runs. Every test that starts `herald` should start it from here.
pub fn herald_command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    die_with_parent(&mut cmd);
    cmd
}

/// Make `cmd`'s process get SIGKILL when the spawning thread exits (see
/// [`herald_command`]); for commands built elsewhere, e.g. a
/// `tokio::process::Command` through its `as_std_mut`.
pub fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid before the fork; in the child only prctl, getppid and
    // _exit, which are async-signal-safe, and no allocation.
    let parent = unsafe { libc::getpid() };
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then no
            // signal will ever come, so do not start at all.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// A loopback port another socket listens on, for as long as the returned
/// listener lives. A `herald` told to serve there fails to bind at once
/// (exit status 1), so a case meant to be refused before binding can never
/// turn into a server that runs until someone kills it. (Port 1 is no such
/// guarantee: as root it binds.)
pub fn occupied_port() -> (std::net::TcpListener, u16) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

/// Run `cmd` (built with [`herald_command`]) to its end and collect its
/// output, waiting at most `limit`: if it is still running then, it is
/// killed and this panics with its arguments and stderr, so a command
/// expected to exit on its own fails fast instead of hanging the suite.
pub fn output_within(cmd: &mut Command, limit: Duration) -> std::process::Output {
    use std::io::Read;
    let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn herald");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for herald") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = stderr.join().unwrap_or_default();
            panic!(
                "herald {args:?} was still running after {limit:?}; it should have exited. stderr:\n{}",
                String::from_utf8_lossy(&stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// A running `herald serve`, killed on drop.
pub struct Server {
    pub child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl Server {
    /// The test app with default limits.
    pub async fn start() -> Server {
        Server::start_with("", "").await
    }

    /// `top` is TOML for top-level keys, `app` for keys of the test app.
    pub async fn start_with(top: &str, app: &str) -> Server {
        Server::start_with_env(top, app, &[]).await
    }

    /// [`Server::start_with`] with these environment variables set too
    /// (e.g. `SSL_CERT_FILE`: the authorities a TLS broker is checked by).
    pub async fn start_with_env(top: &str, app: &str, env: &[(&str, &str)]) -> Server {
        Server::start_until("127.0.0.1", top, app, env, "/ready").await
    }

    /// [`Server::start_with_env`] listening on `host` (e.g. `::`, which
    /// serves IPv4 too, so [`Server::url`]'s 127.0.0.1 still reaches it).
    pub async fn start_on(host: &str, top: &str, app: &str, env: &[(&str, &str)]) -> Server {
        Server::start_until(host, top, app, env, "/ready").await
    }

    /// [`Server::start_with`], returning once `/up` answers 200 rather
    /// than `/ready`: a node whose broker is not reachable (yet).
    pub async fn start_serving(top: &str, app: &str) -> Server {
        Server::start_until("127.0.0.1", top, app, &[], "/up").await
    }

    async fn start_until(
        host: &str,
        top: &str,
        app: &str,
        env: &[(&str, &str)],
        probe: &str,
    ) -> Server {
        let dir = scratch_dir();
        let mut last_log = String::new();
        for _ in 0..5 {
            // A failed attempt's drop removed the directory.
            std::fs::create_dir_all(&dir).expect("create scratch dir");
            let port = free_port();
            let config = format!(
                "host = \"{host}\"\nport = {port}\nshutdown_grace = 5\nlog = \"warn\"\n{top}\n\
                 [[apps]]\nid = \"{APP_ID}\"\nkey = \"{APP_KEY}\"\nsecret = \"{APP_SECRET}\"\n{app}\n"
            );
            let config_path = dir.join("herald.toml");
            std::fs::write(&config_path, config).unwrap();
            let log = std::fs::File::create(dir.join("herald.log")).unwrap();
            let child = herald_command()
                .arg("serve")
                .arg("--config")
                .arg(&config_path)
                .env_remove("HERALD_CONFIG")
                .env_remove("HERALD_PORT")
                .env_remove("HERALD_HOST")
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn herald");
            let mut server = Server {
                child,
                port,
                dir: dir.clone(),
            };
            if server.wait_ready(probe).await {
                return server;
            }
            last_log = server.log();
            // Most likely lost the port to someone else: try another.
        }
        panic!("herald did not become ready; last log:\n{last_log}");
    }

    /// Poll `probe` (`/ready`, `/up`) until 200; false if the process
    /// exits first.
    async fn wait_ready(&mut self, probe: &str) -> bool {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(r) = http.get(self.url(probe)).send().await {
                if r.status() == 200 {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = self.child.kill();
        false
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn ws_url(&self, key: &str, query: &str) -> String {
        format!("ws://127.0.0.1:{}/app/{key}{query}", self.port)
    }

    /// The config file the server was started with (rewrite it, then
    /// SIGHUP, to change its apps while it runs).
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("herald.toml")
    }

    /// The server's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("herald.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Wait for the process to exit on its own.
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "herald did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // ----- clients -----------------------------------------------------------

    /// A Pusher client on the test app, past `connection_established`.
    pub async fn client(&self) -> Client {
        Client::connect(&self.ws_url(APP_KEY, "?protocol=7&client=js&version=8.4.0")).await
    }

    /// A Pusher client on the test app with a small, fixed kernel receive
    /// buffer (see [`Client::connect_with_recv_buffer`]).
    pub async fn client_with_recv_buffer(&self, bytes: u32) -> Client {
        let url = self.ws_url(APP_KEY, "?protocol=7&client=js&version=8.4.0");
        Client::connect_with_recv_buffer(&url, bytes).await
    }

    /// A raw WebSocket, before any Pusher frame was read.
    pub async fn raw_ws(&self, key: &str, query: &str) -> Ws {
        let (ws, _) = tokio::time::timeout(
            TIMEOUT,
            tokio_tungstenite::connect_async(self.ws_url(key, query)),
        )
        .await
        .expect("connect timed out")
        .expect("connect");
        ws
    }

    // ----- HTTP API ------------------------------------------------------------

    /// A signed request to the test app; returns status and JSON body.
    pub async fn api(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        let query = herald_pusher::auth::sign_query(
            APP_KEY,
            APP_SECRET,
            method,
            path,
            body.as_bytes(),
            &[],
        );
        self.raw_api(method, path, &query, body).await
    }

    /// A request with exactly this query string (for signature tests).
    pub async fn raw_api(&self, method: &str, path: &str, query: &str, body: &str) -> (u16, Value) {
        let http = reqwest::Client::new();
        let url = format!("{}?{query}", self.url(path));
        let req = match method {
            "GET" => http.get(url),
            "POST" => http
                .post(url)
                .header("content-type", "application/json")
                .body(body.to_owned()),
            other => panic!("method {other}"),
        };
        let resp = tokio::time::timeout(TIMEOUT, req.send())
            .await
            .expect("API request timed out")
            .expect("API request");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    /// The current value of a `/metrics` counter or gauge: the sum of its
    /// series (over every app, protocol, reason...).
    pub async fn metric(&self, name: &str) -> u64 {
        self.metric_where(name, &[]).await
    }

    /// Counter `name`, 0 when the server has no such series (for figures
    /// a test only reports, so that it also runs against older builds).
    pub async fn counter(&self, name: &str) -> u64 {
        metric_in(&self.scrape().await, name, &[]).unwrap_or(0)
    }

    /// The sum of the series of `name` whose labels include `labels`.
    /// Panics if there is none.
    pub async fn metric_where(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let scrape = self.scrape().await;
        metric_in(&scrape, name, labels)
            .unwrap_or_else(|| panic!("no {name} with {labels:?} in /metrics"))
    }

    /// `/metrics`, parsed with a Prometheus text-format parser.
    pub async fn scrape(&self) -> prometheus_parse::Scrape {
        scrape_url(&self.url("/metrics")).await
    }

    /// Publish `data` (a string) as `event` on `channel`; asserts 200.
    pub async fn trigger(&self, channel: &str, event: &str, data: &str) {
        let body = json!({ "name": event, "channel": channel, "data": data }).to_string();
        let path = format!("/apps/{APP_ID}/events");
        let (status, reply) = self.api("POST", &path, &body).await;
        assert_eq!(status, 200, "trigger failed: {reply}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// What the server did next on a socket.
#[derive(Debug)]
pub enum Next {
    Frame(Value),
    Close(Option<u16>),
}

/// Read the next Pusher frame or close from `ws`, skipping WebSocket
/// ping/pong. Panics on timeout.
pub async fn next(ws: &mut Ws) -> Next {
    loop {
        let msg = tokio::time::timeout(TIMEOUT, ws.next())
            .await
            .expect("timed out waiting for a frame");
        match msg {
            None => return Next::Close(None),
            Some(Err(_)) => return Next::Close(None),
            Some(Ok(Message::Text(t))) => {
                let v: Value = serde_json::from_str(&t)
                    .unwrap_or_else(|e| panic!("server sent non-JSON {t:?}: {e}"));
                return Next::Frame(v);
            }
            Some(Ok(Message::Close(frame))) => {
                return Next::Close(frame.map(|f| u16::from(f.code)));
            }
            Some(Ok(Message::Binary(b))) => panic!("server sent a binary frame: {b:?}"),
            Some(Ok(_)) => continue,
        }
    }
}

/// `data` of a server frame, decoding it when it is a JSON-encoded string.
pub fn data(frame: &Value) -> Value {
    match &frame["data"] {
        Value::String(s) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
        other => other.clone(),
    }
}

/// A connected Pusher client.
pub struct Client {
    pub ws: Ws,
    pub socket_id: String,
    pub established: Value,
}

impl Client {
    pub async fn connect(url: &str) -> Client {
        let (ws, _) = tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(url))
            .await
            .expect("connect timed out")
            .expect("connect");
        Client::established(ws).await
    }

    /// A client whose socket has a fixed kernel receive buffer of about
    /// `bytes`. Setting it turns off the kernel's receive-buffer autotuning,
    /// which on some machines (`net.ipv4.tcp_rmem` max 32 MiB) would let a
    /// client that never reads absorb tens of megabytes: tests of slow
    /// clients must not depend on the machine's sysctls.
    pub async fn connect_with_recv_buffer(url: &str, bytes: u32) -> Client {
        let addr = url
            .strip_prefix("ws://")
            .and_then(|rest| rest.split('/').next())
            .expect("a ws:// URL");
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(bytes).expect("SO_RCVBUF");
        let stream = tokio::time::timeout(TIMEOUT, socket.connect(addr.parse().expect("addr")))
            .await
            .expect("connect timed out")
            .expect("connect");
        let (ws, _) = tokio::time::timeout(
            TIMEOUT,
            tokio_tungstenite::client_async(url, MaybeTlsStream::Plain(stream)),
        )
        .await
        .expect("handshake timed out")
        .expect("handshake");
        Client::established(ws).await
    }

    /// Read `connection_established` on a fresh socket.
    async fn established(mut ws: Ws) -> Client {
        let established = match next(&mut ws).await {
            Next::Frame(f) => f,
            Next::Close(c) => panic!("closed ({c:?}) before connection_established"),
        };
        assert_eq!(established["event"], "pusher:connection_established");
        let socket_id = data(&established)["socket_id"]
            .as_str()
            .expect("socket_id is a string")
            .to_owned();
        Client {
            ws,
            socket_id,
            established,
        }
    }

    pub async fn send(&mut self, frame: Value) {
        self.send_text(&frame.to_string()).await;
    }

    pub async fn send_text(&mut self, text: &str) {
        self.ws
            .send(Message::text(text.to_owned()))
            .await
            .expect("send");
    }

    /// The next frame; panics if the socket closes instead.
    pub async fn recv(&mut self) -> Value {
        match next(&mut self.ws).await {
            Next::Frame(f) => f,
            Next::Close(c) => panic!("socket closed ({c:?}) while a frame was expected"),
        }
    }

    /// The next frame, which must be `event` (on `channel` if given).
    pub async fn expect(&mut self, event: &str, channel: Option<&str>) -> Value {
        let f = self.recv().await;
        assert_eq!(f["event"], event, "unexpected frame {f}");
        if let Some(c) = channel {
            assert_eq!(f["channel"], c, "unexpected frame {f}");
        }
        f
    }

    /// Expect `pusher:error` with `code`, then a close with the same code.
    pub async fn expect_closed_with(&mut self, code: u16) {
        let f = self.recv().await;
        assert_eq!(f["event"], "pusher:error", "unexpected frame {f}");
        assert_eq!(data(&f)["code"], code, "unexpected frame {f}");
        self.expect_close(code).await;
    }

    /// Expect a close frame with `code` (no further frames first).
    pub async fn expect_close(&mut self, code: u16) {
        match next(&mut self.ws).await {
            Next::Close(c) => assert_eq!(c, Some(code), "close code"),
            Next::Frame(f) => panic!("expected close {code}, got frame {f}"),
        }
    }

    pub async fn subscribe_raw(
        &mut self,
        channel: &str,
        auth: Option<&str>,
        channel_data: Option<&str>,
    ) {
        let mut d = json!({ "channel": channel });
        if let Some(a) = auth {
            d["auth"] = json!(a);
        }
        if let Some(cd) = channel_data {
            d["channel_data"] = json!(cd);
        }
        self.send(json!({ "event": "pusher:subscribe", "data": d }))
            .await;
    }

    /// Subscribe to a public channel and wait for the confirmation.
    pub async fn subscribe(&mut self, channel: &str) -> Value {
        self.subscribe_raw(channel, None, None).await;
        self.expect("pusher_internal:subscription_succeeded", Some(channel))
            .await
    }

    /// Subscribe to a private channel with a valid signature.
    pub async fn subscribe_private(&mut self, channel: &str) -> Value {
        let auth = private_auth(&self.socket_id, channel);
        self.subscribe_raw(channel, Some(&auth), None).await;
        self.expect("pusher_internal:subscription_succeeded", Some(channel))
            .await
    }

    /// Subscribe to a presence channel as `user_id`; returns the
    /// confirmation's decoded `data`.
    pub async fn subscribe_presence(&mut self, channel: &str, user_id: &str, info: Value) -> Value {
        let channel_data = json!({ "user_id": user_id, "user_info": info }).to_string();
        let auth = presence_auth(&self.socket_id, channel, &channel_data);
        self.subscribe_raw(channel, Some(&auth), Some(&channel_data))
            .await;
        let f = self
            .expect("pusher_internal:subscription_succeeded", Some(channel))
            .await;
        data(&f)
    }

    /// Send a correctly signed `pusher:signin` with exactly `user_data`.
    pub async fn signin(&mut self, user_data: &str) {
        let auth = user_auth(&self.socket_id, user_data);
        self.send(
            json!({ "event": "pusher:signin", "data": { "auth": auth, "user_data": user_data } }),
        )
        .await;
    }

    pub async fn unsubscribe(&mut self, channel: &str) {
        self.send(json!({ "event": "pusher:unsubscribe", "data": { "channel": channel } }))
            .await;
    }

    /// Close politely and wait for the server's close reply, so the server
    /// has run its cleanup for this socket when this returns... as far as
    /// the WebSocket handshake can tell.
    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
        while let Ok(Some(Ok(_))) = tokio::time::timeout(TIMEOUT, self.ws.next()).await {}
    }
}

/// A client subscribed to `healthy` that must keep receiving broadcasts
/// while other clients misbehave.
pub async fn bystander(server: &Server) -> Client {
    let mut c = server.client().await;
    c.subscribe("healthy").await;
    c
}

/// The bystander still gets a broadcast, and a new client can connect and
/// subscribe: the server neither crashed nor wedged.
pub async fn still_healthy(server: &Server, c: &mut Client) {
    server.trigger("healthy", "still-here", "ok").await;
    let f = c.expect("still-here", Some("healthy")).await;
    assert_eq!(f["data"], "ok");
    // And new clients can still connect and subscribe.
    let mut fresh = server.client().await;
    fresh.subscribe("healthy").await;
}

pub fn private_auth(socket_id: &str, channel: &str) -> String {
    herald_pusher::signing::token(
        APP_KEY,
        APP_SECRET,
        &herald_pusher::signing::channel_string(socket_id, channel, None),
    )
}

pub fn presence_auth(socket_id: &str, channel: &str, channel_data: &str) -> String {
    herald_pusher::signing::token(
        APP_KEY,
        APP_SECRET,
        &herald_pusher::signing::channel_string(socket_id, channel, Some(channel_data)),
    )
}

/// `auth` for `pusher:signin`: the signature over `socket_id::user::user_data`
/// (docs/protocol.md, "User sign-in and watchlists"), spelled out here so
/// the string signed is the documented one.
pub fn user_auth(socket_id: &str, user_data: &str) -> String {
    herald_pusher::signing::token(
        APP_KEY,
        APP_SECRET,
        &format!("{socket_id}::user::{user_data}"),
    )
}

/// A close code as tungstenite reports it.
pub fn close_code(c: CloseCode) -> u16 {
    u16::from(c)
}

// ----- a herald started by hand ------------------------------------------------

/// A `herald serve` with exactly the given flags and `HERALD_*` variables
/// (every other `HERALD_*` variable of the test's environment removed), its
/// stderr in `dir/herald.log`; killed on drop. For tests of how the process
/// reads its configuration; [`Server`] covers everything else.
pub struct Spawned {
    pub child: Child,
    dir: PathBuf,
}

impl Spawned {
    pub fn serve(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Spawned {
        let mut cmd = herald_command();
        cmd.arg("serve").args(args);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("HERALD_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("herald.log")).expect("create log"));
        Spawned {
            child: cmd.spawn().expect("spawn herald"),
            dir: dir.to_owned(),
        }
    }

    /// The process's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("herald.log")).unwrap_or_default()
    }

    /// Wait until `host:port` answers `/ready` with 200. `Err` with the log
    /// if the process exits first (most likely it lost its port to another
    /// process: the caller retries with a new one); panics on timeout,
    /// naming which of the `other` addresses answer instead.
    pub async fn ready_on(
        &mut self,
        host: &str,
        port: u16,
        other: &[(&str, u16)],
    ) -> Result<(), String> {
        let deadline = Instant::now() + TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("herald exited ({status}):\n{}", self.log()));
            }
            if is_ready(host, port).await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut elsewhere = Vec::new();
        for &(h, p) in other {
            if is_ready(h, p).await {
                elsewhere.push(format!("{h}:{p}"));
            }
        }
        panic!(
            "herald is not serving on {host}:{port} (answering instead: {elsewhere:?}); log:\n{}",
            self.log()
        );
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a herald on `host:port` answers `/ready` with 200.
pub async fn is_ready(host: &str, port: u16) -> bool {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("HTTP client");
    matches!(
        client.get(format!("http://{host}:{port}/ready")).send().await,
        Ok(r) if r.status() == 200
    )
}

/// GET a Prometheus text endpoint and parse it.
pub async fn scrape_url(url: &str) -> prometheus_parse::Scrape {
    let resp = tokio::time::timeout(TIMEOUT, reqwest::get(url))
        .await
        .expect("GET /metrics timed out")
        .expect("GET /metrics");
    assert_eq!(resp.status(), 200, "GET {url}");
    let text = resp.text().await.expect("metrics body");
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("/metrics parses as Prometheus text format")
}

/// The sum of the series of counter or gauge `name` whose labels include
/// `labels`; `None` if there is no such series.
pub fn metric_in(
    scrape: &prometheus_parse::Scrape,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<u64> {
    let mut found = None;
    for s in &scrape.samples {
        if s.metric != name || !labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)) {
            continue;
        }
        let v = match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => continue,
        };
        *found.get_or_insert(0) += v as u64;
    }
    found
}

/// `herald bench rpc-server`, killed on drop.
pub struct RpcServer(pub Child);

impl Drop for RpcServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Herald (`top` and `app` as for [`Server::start_with`]) with gRPC RPC
/// to a `herald bench rpc-server` that broadcasts through Herald's
/// `/_broadcast`; returns once the app listens.
pub async fn herald_with_bench_app(top: &str, app: &str) -> (Server, RpcServer) {
    let rpc_port = free_port();
    let server = Server::start_with(
        &format!("{top}\n[rpc]\nhost = \"127.0.0.1:{rpc_port}\"\ntimeout_ms = 5000"),
        app,
    )
    .await;
    let app = herald_command()
        .args([
            "bench",
            "rpc-server",
            "--port",
            &rpc_port.to_string(),
            "--threads",
            "1",
            "--broadcast-url",
            &server.url("/_broadcast"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn herald bench rpc-server");
    let app = RpcServer(app);
    let deadline = Instant::now() + TIMEOUT;
    while tokio::net::TcpStream::connect(("127.0.0.1", rpc_port))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "herald bench rpc-server did not listen"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (server, app)
}

/// A `herald bench` target: this server with the test app's credentials.
pub fn bench_target(s: &Server) -> herald_bench::Target {
    herald_bench::Target::new(
        &format!("ws://127.0.0.1:{}", s.port),
        APP_ID,
        APP_KEY,
        APP_SECRET,
        false,
    )
    .unwrap()
}

/// A figure a bench report must have.
pub fn figure(r: &herald_bench::report::Report, name: &str) -> f64 {
    r.figure(name)
        .unwrap_or_else(|| panic!("no {name} in the report:\n{}", r.summary()))
}

/// What every `storm` of `clients` must show, whatever the protocol:
/// everyone connected and back, the gauge holding them, every newcomer in,
/// nothing lost, and after everyone left the gauge and the descriptors
/// where they started.
#[allow(dead_code)]
pub fn assert_storm_came_back(r: &herald_bench::report::Report, clients: f64) {
    let summary = r.summary();
    assert_eq!(r.fraction("connected_before_storm"), Some(1.0), "{summary}");
    assert_eq!(r.fraction("back_and_subscribed"), Some(1.0), "{summary}");
    assert!(r.figure("all_back_after").is_some(), "{summary}");
    assert_eq!(r.count("reconnects_given_up"), 0, "{summary}");
    assert_eq!(
        figure(r, "connections_gauge_before_storm"),
        clients,
        "{summary}"
    );
    assert_eq!(
        figure(r, "connections_gauge_after_storm"),
        clients,
        "{summary}"
    );
    assert!(r.count("newcomers_during_disconnect") > 0, "{summary}");
    assert_eq!(r.fraction("newcomer_success"), Some(1.0), "{summary}");
    assert_eq!(r.count("connections_lost_while_held"), 0, "{summary}");
    assert_eq!(r.count("connection_errors"), 0, "{summary}");
    assert_eq!(
        figure(r, "connections_gauge_after_all_left"),
        0.0,
        "{summary}"
    );
    assert_eq!(figure(r, "gauge_back_to_baseline"), 1.0, "{summary}");
    assert_eq!(
        figure(r, "fds_after_all_left"),
        figure(r, "fds_baseline"),
        "{summary}"
    );
}

// ----- several nodes ---------------------------------------------------------

/// Wait (at most `within`) until `GET /ready` answers `want`; how long it took.
pub async fn wait_ready(s: &Server, want: u16, within: Duration) -> Duration {
    let t0 = std::time::Instant::now();
    loop {
        let (status, body) = s.raw_api("GET", "/ready", "", "").await;
        if status == want {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < within,
            "/ready stayed {status} {body}, wanted {want}; log:\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The ids of a presence channel's members as `GET …/users` lists them.
pub async fn api_users(s: &Server, channel: &str) -> Vec<String> {
    let (status, body) = s
        .api(
            "GET",
            &format!("/apps/test-app/channels/{channel}/users"),
            "",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let mut ids: Vec<String> = body["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

/// Wait (at most `within`) until every node's API lists exactly `want`.
pub async fn users_everywhere(
    nodes: &[impl std::borrow::Borrow<Server>],
    channel: &str,
    want: &[&str],
    within: Duration,
) {
    let deadline = std::time::Instant::now() + within;
    for s in nodes {
        let s = s.borrow();
        loop {
            let got = api_users(s, channel).await;
            if got == want {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "users {got:?} on :{}, wanted {want:?}",
                s.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
