//! Graceful shutdown: on SIGTERM or SIGINT the node stops being ready,
//! refuses new WebSocket upgrades, tells every client to reconnect
//! (`pusher:error` 4200, then a close with 4200) and waits for them to go,
//! at most `shutdown_grace`. A deploy then moves clients to the new process
//! without anyone losing more than a reconnect.

use crate::node::Node;
use std::time::Duration;
use tokio::time::Instant;

/// Resolves on SIGTERM or SIGINT.
pub async fn signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Tell every session to close, then wait until they have or the grace
/// period is over.
pub async fn drain(node: &Node) {
    let grace = node.config.shutdown_grace();
    tracing::info!(
        connections = node.connection_count(),
        grace_secs = grace.as_secs(),
        "shutting down: asking clients to reconnect"
    );
    node.shutdown.cancel();
    let deadline = Instant::now() + grace;
    while node.connection_count() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = node.connection_count();
    if left > 0 {
        tracing::warn!(
            connections = left,
            "grace period over; dropping remaining connections"
        );
    } else {
        tracing::info!("all clients gone");
    }
}
