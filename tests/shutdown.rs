//! Graceful shutdown on SIGTERM or SIGINT: every client is told to
//! reconnect (`pusher:error` 4200, then close 4200) and the process exits 0.

mod common;

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
