//! Graceful shutdown: on SIGTERM or SIGINT the node stops being ready,
//! refuses new WebSocket upgrades, tells every client to reconnect
//! (`pusher:error` 4200, then a close with 4200) and waits for them to go,
//! at most `shutdown_grace`. A deploy then moves clients to the new process
//! without anyone losing more than a reconnect.

use herald_core::node::Node;
use std::time::Duration;
use tokio::time::Instant;

/// Resolves on SIGTERM or SIGINT.
///
/// The handlers are installed when this is *called*, not when the future is
/// first polled: the server reports ready before it awaits the signal, and a
/// SIGTERM arriving in between must start a graceful shutdown, not kill the
/// process with the default disposition. Call it inside the runtime.
pub fn signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
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
