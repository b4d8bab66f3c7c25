//! The echo adapter in a real `herald-echo` process: its setting from the
//! environment, its route, its messages through the core's fan-out, its
//! config section checked and shown, next to the three real adapters.

use futures_util::{SinkExt, StreamExt};
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

const DEADLINE: Duration = Duration::from_secs(10);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn herald_echo() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald-echo"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HERALD_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("HERALD_HOST", "127.0.0.1")
        .env("HERALD_LOG", "warn");
    cmd
}

/// One plain HTTP GET; the status line's code.
fn get(port: u16, path: &str) -> Option<u16> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut head = [0u8; 32];
    let n = s.read(&mut head).ok()?;
    String::from_utf8_lossy(&head[..n])
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(port: u16) -> Server {
    let child = herald_echo()
        .arg("serve")
        .env("HERALD_PORT", port.to_string())
        .env("HERALD_ECHO_PATH", "/talk")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server(child);
    let end = Instant::now() + DEADLINE;
    while get(port, "/ready") != Some(200) {
        assert!(
            Instant::now() < end,
            "herald-echo not ready within {DEADLINE:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

async fn next_text(
    ws: &mut tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
) -> String {
    loop {
        let m = tokio::time::timeout(DEADLINE, ws.next())
            .await
            .expect("no message within the deadline")
            .expect("socket closed")
            .unwrap();
        if let Message::Text(t) = m {
            return t.to_string();
        }
    }
}

#[tokio::test]
async fn echo_messages_go_through_the_core_to_every_client_of_the_path() {
    let port = free_port();
    let _server = start(port);
    let url = format!("ws://127.0.0.1:{port}/talk");
    let (mut a, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let (mut b, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    // A client is subscribed after its upgrade answered, before its
    // session reads: its own first message coming back shows it is.
    for ws in [&mut a, &mut b] {
        ws.send(Message::text("ready")).await.unwrap();
        while next_text(ws).await != r#""ready""# {}
    }
    // a's message reaches a and b, as a JSON string, through the core's
    // publish (after any "ready" of the other's still on its way).
    a.send(Message::text("hello \"core\"")).await.unwrap();
    for ws in [&mut a, &mut b] {
        let mut got = next_text(ws).await;
        while got == r#""ready""# {
            got = next_text(ws).await;
        }
        assert_eq!(got, r#""hello \"core\"""#);
    }
    // The default path is not served (the setting from the environment
    // moved it); the real adapters still are.
    assert_eq!(get(port, "/echo"), Some(404));
    assert_eq!(
        get(port, "/apps/app-id/channels"),
        Some(401),
        "the Pusher HTTP API answers (unsigned: 401)"
    );
}

#[test]
fn the_section_is_shown_checked_and_named() {
    let out = herald_echo()
        .args(["config", "--echo-path", "/flagged"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = text.lines().find(|l| l.starts_with("echo.path")).unwrap();
    assert!(
        line.contains("\"/flagged\"") && line.contains("flag --echo-path"),
        "{line}"
    );
    // Beside the real adapters' keys.
    assert!(
        text.contains("rpc.broadcast_channel = \"__anycable__\""),
        "{text}"
    );

    let dir = std::env::temp_dir().join(format!("herald-echo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (toml, named) in [
        ("[echo]\npth = '/x'\n", "pth"),
        ("[echo]\npath = 'x'\n", "echo.path"),
    ] {
        let file = dir.join("bad.toml");
        std::fs::write(&file, toml).unwrap();
        let out = herald_echo()
            .args(["config", "--check", "--config"])
            .arg(&file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{toml}: {text}");
        assert!(text.contains(named), "{toml}: {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
