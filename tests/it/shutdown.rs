//! Graceful shutdown on SIGTERM or SIGINT: every client is told to
//! reconnect (`pusher:error` 4200, then close 4200) and the process exits 0.
//! SIGHUP never ends it.

use crate::common;

use common::*;

fn sigterm(server: &Server) {
    signal(server, libc::SIGTERM);
}

fn signal(server: &Server, sig: libc::c_int) {
    // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped).
    let rc = unsafe { libc::kill(server.pid(), sig) };
    assert_eq!(rc, 0, "kill failed");
}

#[tokio::test]
async fn sigterm_tells_clients_to_reconnect_and_exits_zero() {
    let mut server = Server::start().await;
    let mut a = server.client().await;
    a.subscribe("news").await;
    let mut b = server.client().await;
    b.subscribe_private("private-x").await;
    let mut idle = server.client().await;

    sigterm(&server);
    for c in [&mut a, &mut b, &mut idle] {
        c.expect_closed_with(4200).await;
    }
    // The drain waits at most the closing handshake's 2 s for these
    // clients (they do not answer the close), well within shutdown_grace.
    let status = server.wait_exit().await;
    assert!(status.success(), "exit status {status:?}\n{}", server.log());
}

#[tokio::test]
async fn sigint_is_as_graceful_as_sigterm() {
    let mut server = Server::start().await;
    let mut a = server.client().await;
    a.subscribe("news").await;
    signal(&server, libc::SIGINT);
    a.expect_closed_with(4200).await;
    let status = server.wait_exit().await;
    assert!(status.success(), "exit status {status:?}\n{}", server.log());
}

#[tokio::test]
async fn sigterm_with_no_clients_exits_zero() {
    let mut server = Server::start().await;
    sigterm(&server);
    let status = server.wait_exit().await;
    assert!(status.success(), "exit status {status:?}\n{}", server.log());
}

#[tokio::test]
async fn sigterm_right_after_ready_is_graceful() {
    // The signal handler must be installed before /ready says 200.
    for _ in 0..3 {
        let mut server = Server::start().await;
        sigterm(&server);
        let status = server.wait_exit().await;
        assert!(status.success(), "exit status {status:?}\n{}", server.log());
    }
}

#[tokio::test]
async fn websocket_upgrades_are_refused_with_503_while_draining() {
    let mut server = Server::start().await;
    // A client that never reads never answers the server's close frame,
    // so the drain waits for it (the closing handshake's 2 s): the window
    // in which new upgrades must be refused.
    let silent = server.client().await;
    sigterm(&server);
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let (status, body) = server.raw_api("GET", "/ready", "", "").await;
        if status == 503 {
            assert_eq!(body, "DRAINING");
            break;
        }
        assert_eq!(status, 200, "/ready: {body}");
        assert!(
            std::time::Instant::now() < deadline,
            "/ready never turned 503 after SIGTERM"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // Draining: a new WebSocket upgrade gets HTTP 503, not a socket.
    let url = server.ws_url(APP_KEY, "?protocol=7&client=js&version=8.4.0");
    match tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(url))
        .await
        .expect("upgrade attempt timed out")
    {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 503, "{response:?}");
        }
        Ok((_, response)) => panic!("upgraded while draining: {response:?}"),
        Err(e) => panic!("expected an HTTP 503 refusal, got {e}"),
    }
    drop(silent);
    let status = server.wait_exit().await;
    assert!(status.success(), "exit status {status:?}\n{}", server.log());
}

/// SIGHUP reloads what can be reloaded and never ends the server: without
/// TLS there is nothing to reload, and the process, its clients and its
/// readiness stay as they were (log rotation and `systemctl reload` habits
/// send it; docs/deploy.md tells operators to).
#[tokio::test]
async fn sighup_without_tls_keeps_serving_and_keeps_its_clients() {
    let mut server = Server::start().await;
    let mut a = server.client().await;
    a.subscribe("news").await;
    for round in 0..2 {
        signal(&server, libc::SIGHUP);
        // The next event reaches the client over the same socket: had the
        // signal ended the process, this would find it closed instead.
        server
            .trigger("news", "after-hup", &round.to_string())
            .await;
        let f = a.expect("after-hup", Some("news")).await;
        assert_eq!(f["data"], round.to_string());
        assert!(
            server.child.try_wait().unwrap().is_none(),
            "SIGHUP ended the server\n{}",
            server.log()
        );
        let (status, body) = server.raw_api("GET", "/ready", "", "").await;
        assert_eq!((status, body.as_str()), (200, Some("READY")));
    }
    // A new client is still let in.
    let mut b = server.client().await;
    b.subscribe("news").await;
    // And SIGTERM still drains as before.
    sigterm(&server);
    a.expect_closed_with(4200).await;
    assert!(server.wait_exit().await.success());
}
