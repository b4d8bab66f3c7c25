//! Connections that never finish, against a real `herald` over real
//! sockets: a silent TCP connection, half a request head, a client
//! trickling its head a byte at a time, an idle keep-alive connection, an
//! AppSync socket that never sends `connection_init` nor subscribes, an
//! Action Cable socket whose app never answers Connect: each is closed
//! after its (short, configured) deadline. Per-address limits answer 429
//! before the upgrade and are counted; and a server out of file
//! descriptors still answers `/up`, takes clients again once the silent
//! connections are cut, and logs the condition once per interval, not per
//! accept.

use crate::common;

use base64::Engine;
use common::*;
use futures_util::SinkExt;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

/// Wait (bounded) until the server closes `stream`; returns how long it
/// took. Whatever arrives before the end is discarded.
async fn closed_after(stream: &mut tokio::net::tcp::OwnedReadHalf, since: Instant) -> Duration {
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(TIMEOUT, stream.read(&mut buf)).await {
            Err(_) => panic!("the server kept the connection open for {TIMEOUT:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return since.elapsed(),
            Ok(Ok(_)) => {}
        }
    }
}

async fn connect(port: u16) -> TcpStream {
    tokio::time::timeout(TIMEOUT, TcpStream::connect(("127.0.0.1", port)))
        .await
        .expect("connect timed out")
        .expect("connect")
}

/// Connect from `source` (another loopback address) to the server.
async fn connect_from(source: &str, port: u16) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{source}:0").parse::<SocketAddr>().unwrap())
        .expect("bind a second loopback address");
    tokio::time::timeout(
        TIMEOUT,
        s.connect(format!("127.0.0.1:{port}").parse().unwrap()),
    )
    .await
    .expect("connect timed out")
    .expect("connect")
}

/// Send one `GET path` on `stream` and read the response head and body
/// (Content-Length framed); returns the status and body.
async fn get(stream: &mut TcpStream, path: &str) -> (u16, String) {
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .expect("write the request");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(TIMEOUT, stream.read(&mut buf))
            .await
            .expect("response timed out")
            .expect("read the response");
        assert!(
            n > 0,
            "closed before a whole response: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = &text[..end];
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if text.len() >= end + 4 + len {
                let status = head.split(' ').nth(1).unwrap().parse().unwrap();
                return (status, text[end + 4..end + 4 + len].to_owned());
            }
        }
    }
}

fn assert_near(took: Duration, deadline: Duration, what: &str) {
    assert!(
        took >= deadline - Duration::from_millis(300),
        "{what}: closed after {took:?}, before the {deadline:?} deadline"
    );
    assert!(
        took <= deadline + Duration::from_secs(3),
        "{what}: closed after {took:?}, long past the {deadline:?} deadline"
    );
}

#[tokio::test]
async fn heads_that_never_finish_and_idle_keepalives_are_cut() {
    let server = Server::start_with("http_header_timeout = 2", "").await;
    let deadline = Duration::from_secs(2);
    let port = server.port;
    let t0 = Instant::now();

    // Silent: connects and sends nothing.
    let silent = tokio::spawn(async move {
        let (mut r, _w) = connect(port).await.into_split();
        closed_after(&mut r, Instant::now()).await
    });
    // Half a head, then nothing.
    let half = tokio::spawn(async move {
        let (mut r, mut w) = connect(port).await.into_split();
        let at = Instant::now();
        w.write_all(b"GET /up HTTP/1.1\r\nHost: x\r\nX-Half: ")
            .await
            .unwrap();
        closed_after(&mut r, at).await
    });
    // A byte every 200 ms: the deadline is for the whole head, not per
    // byte. The head is long enough to take 20 s at that pace.
    let trickler = tokio::spawn(async move {
        let (mut r, mut w) = connect(port).await.into_split();
        let at = Instant::now();
        let head = format!(
            "GET /up HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(100)
        );
        let writer = tokio::spawn(async move {
            let mut sent = 0;
            for b in head.bytes() {
                if w.write_all(&[b]).await.is_err() {
                    break;
                }
                sent += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            sent
        });
        let took = closed_after(&mut r, at).await;
        let sent = writer.await.unwrap();
        (took, sent)
    });
    // A whole request, answered, then an idle keep-alive connection.
    let idle = tokio::spawn(async move {
        let mut s = connect(port).await;
        let (status, body) = get(&mut s, "/up").await;
        assert_eq!((status, body.as_str()), (200, "OK"));
        let at = Instant::now();
        let (mut r, _w) = s.into_split();
        closed_after(&mut r, at).await
    });

    assert_near(silent.await.unwrap(), deadline, "silent connection");
    assert_near(half.await.unwrap(), deadline, "half a request head");
    let (took, sent) = trickler.await.unwrap();
    assert_near(took, deadline, "trickling client");
    assert!(sent < 40, "the trickler got {sent} bytes in before the cut");
    assert_near(idle.await.unwrap(), deadline, "idle keep-alive connection");
    assert!(t0.elapsed() < Duration::from_secs(8));

    // The server itself is fine, and counted each cut.
    let mut s = connect(port).await;
    assert_eq!(get(&mut s, "/up").await.0, 200);
    assert!(
        server
            .metric_where("herald_http_timeouts_total", &[("reason", "head")])
            .await
            >= 3
    );
    assert!(
        server
            .metric_where("herald_http_timeouts_total", &[("reason", "keepalive")])
            .await
            >= 1
    );
}

const API_KEY: &str = "test-api-key";

fn header_protocol() -> String {
    let auth = json!({ "host": "example.com", "x-api-key": API_KEY }).to_string();
    let enc = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(auth);
    format!("header-{enc}")
}

async fn appsync_socket(server: &Server, path: &str, protocol: &str) -> Ws {
    let url = format!("ws://127.0.0.1:{}{path}", server.port);
    let mut req = url.into_client_request().unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        HeaderValue::from_str(&format!("{protocol}, {}", header_protocol())).unwrap(),
    );
    let (ws, _) = tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(req))
        .await
        .expect("connect timed out")
        .expect("connect");
    ws
}

/// Frames until the close; returns its code and when it came.
async fn close_of(ws: &mut Ws, since: Instant) -> (Option<u16>, Duration) {
    loop {
        match next(ws).await {
            Next::Frame(f) => assert!(f["type"] == "ka" || f["type"] == "connection_ack", "{f}"),
            Next::Close(c) => return (c, since.elapsed()),
        }
    }
}

#[tokio::test]
async fn appsync_sockets_that_hold_nothing_are_closed_when_idle() {
    let server = Server::start_with(
        "ws_idle_timeout = 2\nkeepalive_interval = 1",
        &format!("api_keys = [\"{API_KEY}\"]"),
    )
    .await;
    let deadline = Duration::from_secs(2);
    let t0 = Instant::now();
    // Events and GraphQL sockets that never send connection_init.
    let mut events = appsync_socket(&server, "/event/realtime", "aws-appsync-event-ws").await;
    let mut graphql = appsync_socket(&server, "/graphql/realtime", "graphql-ws").await;
    // One that says connection_init, then nothing: idle from then on.
    let mut inited = appsync_socket(&server, "/event/realtime", "aws-appsync-event-ws").await;
    inited
        .send(Message::text(
            json!({ "type": "connection_init" }).to_string(),
        ))
        .await
        .unwrap();
    // One with a subscription: it holds something and stays.
    let mut busy = appsync_socket(&server, "/event/realtime", "aws-appsync-event-ws").await;
    busy.send(Message::text(
        json!({ "type": "subscribe", "id": "s1", "channel": "/default/room" }).to_string(),
    ))
    .await
    .unwrap();
    loop {
        match next(&mut busy).await {
            Next::Frame(f) if f["type"] == "subscribe_success" => break,
            Next::Frame(f) => assert_eq!(f["type"], "ka", "{f}"),
            Next::Close(c) => panic!("subscribed socket closed: {c:?}"),
        }
    }

    for (name, ws) in [
        ("events", &mut events),
        ("graphql", &mut graphql),
        ("connection_init only", &mut inited),
    ] {
        let (code, took) = close_of(ws, t0).await;
        assert_eq!(code, Some(1000), "{name}");
        assert_near(took, deadline, name);
    }
    // Well past the deadline, the subscribed socket still gets keep-alives.
    while t0.elapsed() < deadline + Duration::from_secs(2) {
        match next(&mut busy).await {
            Next::Frame(f) => assert_eq!(f["type"], "ka", "{f}"),
            Next::Close(c) => panic!("subscribed socket closed: {c:?}"),
        }
    }
    assert_eq!(
        server
            .metric_where(
                "herald_connections_closed_total",
                &[("reason", "idle_timeout")]
            )
            .await,
        3
    );
}

#[tokio::test]
async fn action_cable_connect_the_app_never_answers_ends_at_the_rpc_timeout() {
    // An "app" that accepts the RPC connection and never answers.
    let app = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app_port = app.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((s, _)) = app.accept().await {
            conns.push(s);
        }
    });
    let server = Server::start_with(
        &format!(
            "[rpc]\nhost = \"http://127.0.0.1:{app_port}/rpc\"\ntimeout_ms = 1000\nretries = 0"
        ),
        "",
    )
    .await;
    let mut req = format!("ws://127.0.0.1:{}/cable", server.port)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        HeaderValue::from_static("actioncable-v1-json"),
    );
    let t0 = Instant::now();
    let (mut ws, _) = tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(req))
        .await
        .expect("connect timed out")
        .expect("connect");
    let frame: Value = match next(&mut ws).await {
        Next::Frame(f) => f,
        Next::Close(c) => panic!("closed ({c:?}) without a disconnect message"),
    };
    assert_eq!(frame["type"], "disconnect", "{frame}");
    assert_eq!(frame["reason"], "rpc_error");
    assert!(matches!(next(&mut ws).await, Next::Close(Some(1011))));
    assert_near(
        t0.elapsed(),
        Duration::from_secs(1),
        "Connect without an answer",
    );
    held.abort();
}

/// Connect a WebSocket from `source`; the HTTP status and body when the
/// upgrade is refused, `None` when it succeeds.
async fn upgrade_from(source: &str, port: u16) -> Option<(u16, String)> {
    let tcp = connect_from(source, port).await;
    let url = format!("ws://127.0.0.1:{port}/app/{APP_KEY}?protocol=7");
    match tokio::time::timeout(TIMEOUT, tokio_tungstenite::client_async(url, tcp))
        .await
        .expect("upgrade timed out")
    {
        Ok(_) => None,
        Err(tokio_tungstenite::tungstenite::Error::Http(res)) => {
            let body = res
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            Some((res.status().as_u16(), body))
        }
        Err(e) => panic!("upgrade failed otherwise: {e}"),
    }
}

#[tokio::test]
async fn connections_per_address_are_bounded_with_a_429() {
    // 127.0.0.1 (the harness, /metrics) is exempt; the clients come from
    // 127.0.0.2.
    let server = Server::start_with(
        "address_limits_exempt = [\"127.0.0.1\"]\nmax_connections_per_address = 3\n\
         max_connection_rate_per_address = 1000",
        "",
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = connect_from("127.0.0.2", server.port).await;
        assert_eq!(get(&mut s, "/up").await.0, 200);
        held.push(s);
    }
    let (status, body) = upgrade_from("127.0.0.2", server.port)
        .await
        .expect("a fourth connection must be refused");
    assert_eq!(status, 429);
    assert!(
        body.contains("Too many connections from your address (at most 3)"),
        "{body}"
    );
    // A plain request is refused the same way.
    let mut s = connect_from("127.0.0.2", server.port).await;
    let (status, _) = get(&mut s, "/up").await;
    assert_eq!(status, 429);
    assert_eq!(
        server
            .metric_where(
                "herald_listener_refused_total",
                &[("reason", "address_connections")]
            )
            .await,
        2
    );
    // The exempt address is not limited.
    let mut exempt = Vec::new();
    for _ in 0..5 {
        let mut s = connect(server.port).await;
        assert_eq!(get(&mut s, "/up").await.0, 200);
        exempt.push(s);
    }
    // A closed connection gives its slot back.
    drop(held.pop());
    let until = Instant::now() + TIMEOUT;
    loop {
        match upgrade_from("127.0.0.2", server.port).await {
            None => break,
            Some((429, _)) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Some(other) => panic!("after a close: {other:?}"),
        }
    }
}

/// Connect to `ip:port`, IPv4 or IPv6.
async fn connect_to(ip: &str, port: u16) -> TcpStream {
    let addr = SocketAddr::new(ip.parse().unwrap(), port);
    tokio::time::timeout(TIMEOUT, TcpStream::connect(addr))
        .await
        .expect("connect timed out")
        .expect("connect")
}

/// On a dual-stack `::` listener, an IPv6 client (::1, counted by its /64)
/// is bounded by `max_connections_per_address` like an IPv4 one, and an
/// IPv4 client (arriving as an IPv4-mapped address) has a count of its
/// own: each address family's fourth connection is refused with a 429.
#[tokio::test]
async fn ipv6_clients_are_bounded_per_64_on_a_dual_stack_listener() {
    let server = Server::start_on(
        "::",
        "address_limits_exempt = [\"127.0.0.1\"]\nmax_connections_per_address = 3\n\
         max_connection_rate_per_address = 1000",
        "",
        &[],
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = connect_to("::1", server.port).await;
        assert_eq!(get(&mut s, "/up").await.0, 200);
        held.push(s);
    }
    let mut s = connect_to("::1", server.port).await;
    let (status, body) = get(&mut s, "/up").await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body.contains("Too many connections from your address (at most 3)"),
        "{body}"
    );
    // IPv4 on the same listener: 127.0.0.2 is not ::1's /64.
    for _ in 0..3 {
        let mut s = connect_from("127.0.0.2", server.port).await;
        assert_eq!(get(&mut s, "/up").await.0, 200);
        held.push(s);
    }
    let mut s = connect_from("127.0.0.2", server.port).await;
    assert_eq!(get(&mut s, "/up").await.0, 429);
    assert_eq!(
        server
            .metric_where(
                "herald_listener_refused_total",
                &[("reason", "address_connections")]
            )
            .await,
        2
    );
    // ::1 gets its slot back when one of its connections closes.
    drop(held.remove(0));
    let until = Instant::now() + TIMEOUT;
    loop {
        let mut s = connect_to("::1", server.port).await;
        match get(&mut s, "/up").await.0 {
            200 => break,
            429 if Instant::now() < until => tokio::time::sleep(Duration::from_millis(20)).await,
            other => panic!("after a close: {other}"),
        }
    }
}

#[tokio::test]
async fn new_connections_per_second_per_address_are_bounded_with_a_429() {
    let server = Server::start_with(
        "address_limits_exempt = [\"127.0.0.1\"]\nmax_connections_per_address = 0\n\
         max_connection_rate_per_address = 3",
        "",
    )
    .await;
    let mut refused = 0;
    let mut bodies = Vec::new();
    for _ in 0..10 {
        let mut s = connect_from("127.0.0.2", server.port).await;
        let (status, body) = get(&mut s, "/up").await;
        if status == 429 {
            refused += 1;
            bodies.push(body);
        } else {
            assert_eq!(status, 200);
        }
    }
    // Ten in well under two seconds: at most six get through.
    assert!(refused >= 4, "{refused} refused");
    assert!(
        bodies[0].contains("Too many new connections from your address (at most 3 a second)"),
        "{}",
        bodies[0]
    );
    assert_eq!(
        server
            .metric_where(
                "herald_listener_refused_total",
                &[("reason", "address_rate")]
            )
            .await,
        refused
    );
    // A later second admits again (the window's exact reset is pinned by
    // the admission table's own test, on a clock it moves).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut s = connect_from("127.0.0.2", server.port).await;
        if get(&mut s, "/up").await.0 == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never admitted again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `herald serve` with an open-file limit of `nofile` (soft and hard: it
/// raises the soft limit to the hard one) and `top` as extra config.
struct Limited {
    child: std::process::Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Limited {
    async fn start(nofile: u64, top: &str) -> Limited {
        use std::os::unix::process::CommandExt;
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("herald-emfile-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let config = dir.join("herald.toml");
        std::fs::write(
            &config,
            format!(
                "host = \"127.0.0.1\"\nport = {port}\nlog = \"warn\"\n{top}\n\
                 [[apps]]\nid = \"{APP_ID}\"\nkey = \"{APP_KEY}\"\nsecret = \"{APP_SECRET}\"\n"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("herald.log")).unwrap();
        let mut cmd = herald_command();
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .env_remove("HERALD_CONFIG")
            .env_remove("HERALD_PORT")
            .env_remove("HERALD_HOST")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log);
        // SAFETY: setrlimit is async-signal-safe; nothing else runs here.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: nofile,
                    rlim_max: nofile,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn herald");
        let me = Limited { child, port, dir };
        let until = Instant::now() + TIMEOUT;
        while !is_ready("127.0.0.1", port).await {
            assert!(
                Instant::now() < until,
                "herald did not start:\n{}",
                me.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        me
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("herald.log")).unwrap_or_default()
    }

    fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn out_of_descriptors_the_server_recovers_and_logs_once_per_interval() {
    const NOFILE: u64 = 128;
    let server = Limited::start(NOFILE, "http_header_timeout = 2").await;
    let port = server.port;
    // More silent connections than the server has descriptors: the ones it
    // accepts use them all up, the rest wait in the listen backlog.
    let mut silent = Vec::new();
    for _ in 0..(NOFILE as usize * 2) {
        silent.push(connect(port).await);
    }
    let full = Instant::now();
    let until = full + TIMEOUT;
    while (server.open_fds() as u64) < NOFILE - 2 {
        assert!(Instant::now() < until, "never ran out of descriptors");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // /up answers: through the reserve descriptor, or once the silent
    // connections are cut by the head deadline.
    let mut up = connect(port).await;
    let (status, body) = tokio::time::timeout(Duration::from_secs(20), get(&mut up, "/up"))
        .await
        .expect("/up never answered");
    assert_eq!((status, body.as_str()), (200, "OK"));
    drop(up);
    // A normal client connects and is served.
    let url = format!("ws://127.0.0.1:{port}/app/{APP_KEY}?protocol=7&client=js&version=8.4.0");
    let until = Instant::now() + Duration::from_secs(20);
    let mut ws = loop {
        match tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(&url)).await {
            Ok(Ok((ws, _))) => break ws,
            _ if Instant::now() < until => tokio::time::sleep(Duration::from_millis(100)).await,
            other => panic!("no client could connect: {:?}", other.map(|r| r.err())),
        }
    };
    match next(&mut ws).await {
        Next::Frame(f) => assert_eq!(f["event"], "pusher:connection_established", "{f}"),
        Next::Close(c) => panic!("closed ({c:?}) before connection_established"),
    }
    let scrape = scrape_url(&format!("http://127.0.0.1:{port}/metrics")).await;
    let failed = metric_in(
        &scrape,
        "herald_accept_errors_total",
        &[("reason", "fd_limit")],
    )
    .expect("accept errors counted");
    let log = server.log();
    let lines = log.matches("out of file descriptors").count();
    let secs = full.elapsed().as_secs();
    assert!(lines >= 1, "the condition was not logged:\n{log}");
    // Once per 10 s interval, however many accepts failed.
    assert!(
        lines as u64 <= secs / 10 + 1,
        "{lines} log lines in {secs} s:\n{log}"
    );
    assert!(
        failed > lines as u64 * 5,
        "{failed} failed accepts for {lines} log lines"
    );
    drop(silent);
}

#[tokio::test]
async fn the_reserve_descriptor_answers_up_and_refuses_politely() {
    const NOFILE: u64 = 128;
    // Silent connections are not cut within this test: only the reserve
    // can answer.
    let server = Limited::start(NOFILE, "http_header_timeout = 60").await;
    let port = server.port;
    let mut silent = Vec::new();
    // Connect until every descriptor the server may have is in use (the
    // reserve included).
    while (server.open_fds() as u64) < NOFILE {
        let before = server.open_fds();
        silent.push(connect(port).await);
        let until = Instant::now() + Duration::from_millis(200);
        while server.open_fds() <= before && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(silent.len() < 2 * NOFILE as usize, "the limit never bit");
    }
    // The last one waits in the backlog; the reserve takes it, gives it a
    // second for its request head, and is free again for the next.
    let t0 = Instant::now();
    let mut up = connect(port).await;
    let (status, body) = get(&mut up, "/up").await;
    assert_eq!((status, body.as_str()), (200, "OK"));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    drop(up);
    // Anything else gets a 503 that says why.
    let mut other = connect(port).await;
    let (status, body) = get(&mut other, "/apps/x/channels").await;
    assert_eq!(status, 503);
    assert!(body.contains("open-file limit"), "{body}");
    drop(other);
    let mut m = connect(port).await;
    let (status, text) = get(&mut m, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        text.lines()
            .any(|l| l.starts_with("herald_listener_refused_total{reason=\"fd_limit\"}")),
        "{text}"
    );
    drop(silent);
}
