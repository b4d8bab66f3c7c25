//! `herald bench broadcast --protocol actioncable` and `connect --protocol
//! actioncable` at tiny scale against a real herald whose RPC app is a real
//! `herald bench rpc-server` process: every client connects and subscribes,
//! every broadcast reaches every other subscriber (counts, never speeds).

mod common;

use common::Server;
use herald_bench::actioncable::WsProtocol;
use herald_bench::broadcast::{self, BroadcastParams, Via};
use herald_bench::connect::{self, ConnectParams};
use herald_bench::Target;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// `herald bench rpc-server`, killed on drop.
struct RpcServer(Child);

impl Drop for RpcServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Herald with gRPC RPC to a `herald bench rpc-server` that broadcasts
/// through Herald's `/_broadcast`; returns once a client is welcomed and
/// confirmed through the app.
async fn herald_with_bench_app() -> (Server, RpcServer) {
    let rpc_port = common::free_port();
    let server = Server::start_with(
        &format!("[rpc]\nhost = \"127.0.0.1:{rpc_port}\"\ntimeout_ms = 5000"),
        "",
    )
    .await;
    let app = common::herald_command()
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
    let deadline = Instant::now() + common::TIMEOUT;
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

fn target(server: &Server) -> Target {
    Target::new(
        &format!("ws://127.0.0.1:{}", server.port),
        common::APP_ID,
        common::APP_KEY,
        common::APP_SECRET,
        false,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_over_action_cable_delivers_everything() {
    let (server, _app) = herald_with_bench_app().await;
    let mut p = BroadcastParams::new(target(&server));
    p.protocol = WsProtocol::ActionCable;
    p.peak = 8;
    p.duration = Duration::from_secs(3);
    p.lifetime = Duration::from_millis(1500);
    p.sender_every = 2;
    p.send_probability = 1.0;
    p.grace = Duration::from_millis(1000);
    p.progress = false;
    p.server_pid = Some(server.child.id());
    let r = broadcast::run(&p).await.unwrap();
    let text = r.summary();
    assert!(r.count("ws_sessions") >= 8, "{text}");
    let sent = r.count("ws_msgs_sent");
    assert!(sent > 10, "{text}");
    let expected = r.count("deliveries_expected");
    assert!(expected > sent, "{text}");
    assert_eq!(r.count("deliveries_received"), expected, "{text}");
    assert_eq!(r.count("deliveries_lost"), 0, "{text}");
    assert_eq!(r.count("deliveries_duplicated"), 0, "{text}");
    assert_eq!(r.count("deliveries_unexpected"), 0, "{text}");
    assert_eq!(r.count("connection_errors"), 0, "{text}");
    assert_eq!(r.count("server_errors"), 0, "{text}");
    assert!(r.latency("message_latency").unwrap().count > 0, "{text}");
    assert!(text.contains("actioncable"), "{text}");

    // Through HTTP publishes there is nothing to send with: refused.
    p.via = Via::Http;
    let Err(e) = broadcast::run(&p).await else {
        panic!("--via http was not refused")
    };
    assert!(e.0.contains("--via http"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_over_action_cable_connects_everyone() {
    let (server, _app) = herald_with_bench_app().await;
    let mut p = ConnectParams::new(target(&server));
    p.protocol = WsProtocol::ActionCable;
    p.clients = 30;
    p.hold = true;
    p.progress = false;
    let r = connect::run(&p).await.unwrap();
    let text = r.summary();
    assert_eq!(r.count("ws_sessions"), 30, "{text}");
    assert_eq!(r.fraction("ws_connect_success"), Some(1.0), "{text}");
    assert_eq!(r.fraction("ws_subscribe_success"), Some(1.0), "{text}");
    assert_eq!(r.count("connection_errors"), 0, "{text}");
    assert_eq!(r.latency("ws_session_setup").unwrap().count, 30, "{text}");
}

/// A server whose app is not the bench's: one clear error, not thousands
/// of failed clients.
#[tokio::test]
async fn action_cable_preflight_names_the_missing_app() {
    // Herald without RPC welcomes everyone but has no BenchmarkChannel.
    let server = Server::start().await;
    let mut p = ConnectParams::new(target(&server));
    p.protocol = WsProtocol::ActionCable;
    p.clients = 3;
    p.progress = false;
    let Err(e) = connect::run(&p).await else {
        panic!("a server without the bench app was not refused")
    };
    assert!(e.0.contains("rpc-server"), "{e}");
}
