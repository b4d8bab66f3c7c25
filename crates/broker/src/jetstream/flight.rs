//! Single flight: concurrent reads of one key share one engine read.
//!
//! In a reconnect storm thousands of clients ask for the history of the
//! same few streams within the same second; each asking the server on its
//! own is what made reads time out. The first caller for a key
//! starts the read on its own task (so a caller that goes away, its client
//! gone, does not cancel it for the others) and everyone who asks for that
//! key before it ends waits for the same answer. The entry is gone as soon
//! as the read ends: the next caller starts a fresh read.

use futures_util::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

type Flight<V> = Shared<BoxFuture<'static, Option<V>>>;

/// Reads in flight by key; see the module's comment.
pub struct Flights<K, V: Clone> {
    inner: Arc<Mutex<State<K, V>>>,
}

struct State<K, V: Clone> {
    next: u64,
    flying: HashMap<K, (u64, Flight<V>)>,
}

impl<K, V> Default for Flights<K, V>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    fn default() -> Self {
        Flights {
            inner: Arc::new(Mutex::new(State {
                next: 0,
                flying: HashMap::new(),
            })),
        }
    }
}

impl<K, V> Flights<K, V>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The answer of the read of `key` in flight, or of `read` started now
    /// when none is; `joined` says which. `None` only when the read's task
    /// panicked or the runtime is shutting down.
    pub async fn run<F, Fut>(&self, key: K, read: F) -> (Option<V>, bool)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V> + Send + 'static,
    {
        let (flight, joined) = {
            let mut state = self.inner.lock();
            match state.flying.get(&key) {
                Some((_, f)) => (f.clone(), true),
                None => {
                    state.next += 1;
                    let id = state.next;
                    let inner = self.inner.clone();
                    let k = key.clone();
                    let fut = read();
                    // Spawned while the lock is held: the task's removal
                    // of its entry waits for the insert below.
                    let task = tokio::spawn(async move {
                        let v = fut.await;
                        let mut state = inner.lock();
                        if state.flying.get(&k).is_some_and(|(i, _)| *i == id) {
                            state.flying.remove(&k);
                        }
                        v
                    });
                    let f = async move { task.await.ok() }.boxed().shared();
                    state.flying.insert(key, (id, f.clone()));
                    (f, false)
                }
            }
        };
        (flight.await, joined)
    }

    /// Reads in flight now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inner.lock().flying.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::sync::Notify;

    #[tokio::test]
    async fn concurrent_callers_share_one_read() {
        let flights: Arc<Flights<&'static str, u64>> = Arc::default();
        let reads = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Notify::new());
        let mut waiting = Vec::new();
        for _ in 0..50 {
            let (flights, reads, gate) = (flights.clone(), reads.clone(), gate.clone());
            waiting.push(tokio::spawn(async move {
                flights
                    .run("s", || async move {
                        reads.fetch_add(1, Ordering::SeqCst);
                        gate.notified().await;
                        7
                    })
                    .await
            }));
        }
        // Every caller is waiting on the one read before it may end.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while reads.load(Ordering::SeqCst) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "no read started");
            tokio::task::yield_now().await;
        }
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        gate.notify_one();
        let mut joined = 0;
        for w in waiting {
            let (v, j) = w.await.unwrap();
            assert_eq!(v, Some(7));
            joined += j as usize;
        }
        assert_eq!(reads.load(Ordering::SeqCst), 1, "one engine read");
        assert_eq!(joined, 49, "all but the first joined it");
        assert_eq!(flights.len(), 0, "the entry is gone once the read ended");
    }

    #[tokio::test]
    async fn keys_fly_apart_and_a_later_call_reads_afresh() {
        let flights: Flights<u32, u32> = Flights::default();
        let reads = Arc::new(AtomicUsize::new(0));
        let read = |k: u32| {
            let reads = reads.clone();
            move || async move {
                reads.fetch_add(1, Ordering::SeqCst);
                k * 10
            }
        };
        let (a, b) = tokio::join!(flights.run(1, read(1)), flights.run(2, read(2)));
        assert_eq!((a.0, b.0), (Some(10), Some(20)));
        assert_eq!(flights.run(1, read(1)).await, (Some(10), false));
        assert_eq!(reads.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_caller_that_goes_away_does_not_cancel_the_read() {
        let flights: Arc<Flights<u8, u8>> = Arc::default();
        let gate = Arc::new(Notify::new());
        let g = gate.clone();
        let first = {
            let flights = flights.clone();
            tokio::spawn(async move {
                flights
                    .run(0, || async move {
                        g.notified().await;
                        1
                    })
                    .await
            })
        };
        while flights.len() == 0 {
            tokio::task::yield_now().await;
        }
        first.abort();
        let _ = first.await;
        let second = {
            let flights = flights.clone();
            tokio::spawn(async move { flights.run(0, || async { 2 }).await })
        };
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        gate.notify_one();
        assert_eq!(second.await.unwrap(), (Some(1), true));
    }
}
