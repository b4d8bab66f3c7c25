//! The reaper: the teardown of sessions whose clients went away (leave
//! their channels, tell the app, close the socket, free the session),
//! done by one task per node in bounded batches, behind new connections.
//!
//! Why: when thousands of clients drop at once (a network blip, a load
//! balancer restarting) their sessions all see the end of their streams in
//! the same instant. Torn down in those tasks, the departures fill the
//! runtime's run queue, which is first in, first out, with thousands of
//! tasks each doing tens of microseconds of hub removals, `close(2)` and
//! frees, and a new client's accept, upgrade and first answer wait behind
//! all of them at every hop (bench/RESULTS.md, "newcomers during a mass
//! disconnect"). Handed here, a departure costs its session a push onto a
//! list; the drain task takes [`BATCH`] at a time and yields between
//! batches, so new clients wait at most about one batch at each hop, and
//! the teardown of a whole mass disconnect keeps at most one core busy.
//! One task, not one per worker thread: tried (2026-11-25), two drain tasks
//! emptied the list sooner but kept both cores in batches, and the
//! newcomers' p(99) went back up (bench/RESULTS.md).
//!
//! A departed connection is marked gone first ([`Connection::gone`]): what
//! is published to it while it waits here (the `member_removed` of its
//! fellow members leaving with it) is refused at once instead of queued
//! and written to a dead socket.
//!
//! The drain task runs only while there is work: started by the first
//! departure, it ends when the list is empty. Nothing waits here forever:
//! a departure that cannot finish at once (none does today: every
//! adapter's `on_close` is synchronous) is moved to a task of its own. A
//! graceful shutdown waits for the connection gauge, which the departures
//! bring down, so the teardown of the last departures is not cut short.
//!
//! [`Connection::gone`]: crate::connection::Connection::gone

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

/// Departures torn down between two yields. At tens of microseconds each
/// (mostly the kernel's socket teardown), a batch is a few milliseconds:
/// what a new connection may wait behind at each step of its opening.
/// 128 rather than 32: with 32 the list drained slowly enough that a
/// reconnect storm's clients came back while their old sessions still
/// waited here, and the process held both (peak RSS ~98 against ~68-84 MiB
/// in the Pusher storm at 15,000, bench/RESULTS.md).
pub const BATCH: usize = 128;

/// The rest of a departed session: its teardown.
pub type Departure = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The node's reaper (cheap to clone: every session's settings hold one).
#[derive(Clone, Default)]
pub struct Reaper(Arc<Inner>);

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    list: VecDeque<Departure>,
    /// The drain task runs.
    running: bool,
}

impl std::fmt::Debug for Reaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reaper")
            .field("waiting", &self.waiting())
            .finish()
    }
}

impl Reaper {
    /// Queue a departure; starts the drain task if it is not running.
    /// Call from inside the runtime.
    pub fn defer(&self, departure: Departure) {
        let start = {
            let mut s = self.0.state.lock();
            s.list.push_back(departure);
            !std::mem::replace(&mut s.running, true)
        };
        if start {
            tokio::spawn(drain(self.0.clone()));
        }
    }

    /// Departures not torn down yet.
    pub fn waiting(&self) -> usize {
        self.0.state.lock().list.len()
    }
}

/// Marks the reaper stopped if its task is dropped unfinished (its runtime
/// shut down), so a later departure starts a new one.
struct Running(Option<Arc<Inner>>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take() {
            inner.state.lock().running = false;
        }
    }
}

async fn drain(inner: Arc<Inner>) {
    let mut running = Running(Some(inner.clone()));
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        {
            let mut s = inner.state.lock();
            if s.list.is_empty() {
                // Under the lock: a departure queued after this starts a
                // new task.
                s.running = false;
                running.0 = None;
                return;
            }
            let n = s.list.len().min(BATCH);
            batch.extend(s.list.drain(..n));
        }
        std::future::poll_fn(|cx| {
            for mut d in batch.drain(..) {
                if d.as_mut().poll(cx).is_pending() {
                    // It waits on something: not here, where it would hold
                    // up every departure behind it.
                    tokio::spawn(d);
                }
            }
            Poll::Ready(())
        })
        .await;
        // Behind whatever became ready meanwhile (new connections first).
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn every_departure_runs_once_and_the_task_ends_when_empty() {
        let reaper = Reaper::default();
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..(BATCH * 3 + 5) {
            let done = done.clone();
            reaper.defer(Box::pin(async move {
                done.fetch_add(1, Ordering::Relaxed);
            }));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while done.load(Ordering::Relaxed) < BATCH * 3 + 5 {
            assert!(tokio::time::Instant::now() < deadline, "not drained");
            tokio::task::yield_now().await;
        }
        assert_eq!(reaper.waiting(), 0);
        // The task ended; a later departure starts another.
        while reaper.0.state.lock().running {
            assert!(tokio::time::Instant::now() < deadline, "task still running");
            tokio::task::yield_now().await;
        }
        let done2 = done.clone();
        reaper.defer(Box::pin(async move {
            done2.fetch_add(1, Ordering::Relaxed);
        }));
        while done.load(Ordering::Relaxed) < BATCH * 3 + 6 {
            assert!(tokio::time::Instant::now() < deadline, "second not drained");
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_departure_that_waits_does_not_hold_up_the_others() {
        let reaper = Reaper::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let waited = Arc::new(AtomicUsize::new(0));
        let w = waited.clone();
        reaper.defer(Box::pin(async move {
            let _ = rx.await;
            w.fetch_add(1, Ordering::Relaxed);
        }));
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..BATCH * 2 {
            let done = done.clone();
            reaper.defer(Box::pin(async move {
                done.fetch_add(1, Ordering::Relaxed);
            }));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while done.load(Ordering::Relaxed) < BATCH * 2 {
            assert!(tokio::time::Instant::now() < deadline, "held up");
            tokio::task::yield_now().await;
        }
        assert_eq!(waited.load(Ordering::Relaxed), 0);
        tx.send(()).unwrap();
        while waited.load(Ordering::Relaxed) == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the waiting one never finished"
            );
            tokio::task::yield_now().await;
        }
    }
}
