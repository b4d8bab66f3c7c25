//! What the bench measures while it runs: latencies in HDR histograms,
//! live counters, and the once-a-second monitor that prints the progress
//! line and keeps the timeline. Delivery accounting is in
//! [`super::ledger`].

use hdrhistogram::Histogram;
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Largest latency recorded, in microseconds (larger values saturate).
const MAX_US: u64 = 600_000_000;
const SHARDS: usize = 16;

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_US, 3).expect("valid histogram bounds")
}

struct Shard {
    total: Histogram<u64>,
    window: Histogram<u64>,
}

/// A latency in microseconds, recorded from many tasks: sharded so the
/// receivers of one busy channel do not queue on one lock.
pub struct Latency {
    shards: Vec<Mutex<Shard>>,
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        total: histogram(),
                        window: histogram(),
                    })
                })
                .collect(),
        }
    }
}

impl Latency {
    /// Record one value; `hint` (e.g. the connection number) picks the shard.
    pub fn record(&self, hint: usize, micros: u64) {
        let mut s = self.shards[hint % SHARDS].lock().unwrap();
        let v = micros.max(1);
        s.total.saturating_record(v);
        s.window.saturating_record(v);
    }

    pub fn record_duration(&self, hint: usize, d: Duration) {
        self.record(hint, d.as_micros() as u64);
    }

    /// Everything recorded since the last call (for the timeline).
    pub fn take_window(&self) -> Histogram<u64> {
        let mut h = histogram();
        for s in &self.shards {
            let mut s = s.lock().unwrap();
            let _ = h.add(&s.window);
            s.window.reset();
        }
        h
    }

    /// Everything recorded.
    pub fn total(&self) -> Histogram<u64> {
        let mut h = histogram();
        for s in &self.shards {
            let _ = h.add(&s.lock().unwrap().total);
        }
        h
    }
}

/// Counters every scenario updates, read by the monitor.
#[derive(Default)]
pub struct Live {
    /// Open connections (a gauge).
    pub connections: AtomicI64,
    pub sent: AtomicU64,
    pub received: AtomicU64,
    pub errors: AtomicU64,
    /// Errors by kind (`connect`, `timeout`, ...).
    kinds: Mutex<HashMap<&'static str, u64>>,
    /// The first few distinct error messages, for the summary.
    examples: Mutex<Vec<String>>,
}

impl Live {
    pub fn error(&self, kind: &'static str, message: String) {
        self.errors.fetch_add(1, Relaxed);
        *self.kinds.lock().unwrap().entry(kind).or_default() += 1;
        let mut ex = self.examples.lock().unwrap();
        if ex.len() < 5 && !ex.contains(&message) {
            ex.push(message);
        }
    }

    pub fn error_kinds(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<_> = self
            .kinds
            .lock()
            .unwrap()
            .iter()
            .map(|(k, n)| (*k, *n))
            .collect();
        v.sort();
        v
    }

    pub fn error_examples(&self) -> Vec<String> {
        self.examples.lock().unwrap().clone()
    }
}

/// One second of the run. `sent`, `received` and `errors` are counts in
/// this second (not running totals); `connections` is the gauge at its end.
/// The last tick of a run covers only what remained of its last second,
/// so a run shorter than a second still has a timeline.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tick {
    /// Seconds since the run started, at the end of this tick.
    pub second: u64,
    /// In a `connect --sweep`, the step's N (each step has its own monitor
    /// and its seconds count from the sweep's start).
    pub step: Option<u64>,
    pub connections: i64,
    pub sent: u64,
    pub received: u64,
    pub errors: u64,
    /// p99 of the main latency in this second, in ms (None: no samples).
    pub p99_ms: Option<f64>,
}

/// Turns the live running totals into one tick's per-second counts.
#[derive(Default)]
struct Sampler {
    /// Totals at the previous tick.
    sent: u64,
    received: u64,
    errors: u64,
}

impl Sampler {
    fn tick(&mut self, live: &Live, latency: Option<&Latency>, second: u64) -> Tick {
        let sent = live.sent.load(Relaxed);
        let received = live.received.load(Relaxed);
        let errors = live.errors.load(Relaxed);
        let tick = Tick {
            second,
            step: None,
            connections: live.connections.load(Relaxed),
            sent: sent - self.sent,
            received: received - self.received,
            errors: errors - self.errors,
            p99_ms: latency.and_then(|l| {
                let h = l.take_window();
                (!h.is_empty()).then(|| h.value_at_quantile(0.99) as f64 / 1000.0)
            }),
        };
        (self.sent, self.received, self.errors) = (sent, received, errors);
        tick
    }
}

/// Prints the progress line and records the timeline until stopped.
pub struct Monitor {
    stop: Arc<tokio::sync::Notify>,
    handle: tokio::task::JoinHandle<Vec<Tick>>,
}

impl Monitor {
    pub fn start(
        label: &'static str,
        live: Arc<Live>,
        latency: Option<Arc<Latency>>,
        progress: bool,
    ) -> Monitor {
        let stop = Arc::new(tokio::sync::Notify::new());
        let stopped = stop.clone();
        let handle = tokio::spawn(async move {
            let started = Instant::now();
            let tty = unsafe { libc::isatty(2) } == 1;
            let mut ticks = Vec::new();
            let mut interval = tokio::time::interval(Duration::from_secs(1));
            interval.tick().await;
            let mut sampler = Sampler::default();
            loop {
                let stopping = tokio::select! {
                    _ = interval.tick() => false,
                    _ = stopped.notified() => true,
                };
                let elapsed = started.elapsed();
                // The final, partial tick is rounded up (and kept after the
                // one before it) so no two ticks share a second.
                let second = if stopping {
                    let last = ticks.last().map_or(0, |t: &Tick| t.second);
                    (elapsed.as_secs_f64().ceil() as u64).max(last + 1)
                } else {
                    elapsed.as_secs()
                };
                let tick = sampler.tick(&live, latency.as_deref(), second);
                if stopping {
                    // Worth a point only if something happened since the
                    // last full second (counts, or connections closing), or
                    // the run was shorter than one.
                    let busy = tick.sent > 0 || tick.received > 0 || tick.errors > 0;
                    let moved = ticks
                        .last()
                        .is_none_or(|t: &Tick| t.connections != tick.connections);
                    if busy || moved {
                        ticks.push(tick);
                    }
                    break;
                }
                if progress {
                    // The progress line shows running totals; the timeline
                    // keeps per-second counts.
                    let line = format!(
                        "{label}: {:>4}s  connections {:>6}  sent {:>9}  received {:>10}  errors {:>5}{}",
                        tick.second,
                        tick.connections,
                        sampler.sent,
                        sampler.received,
                        sampler.errors,
                        tick.p99_ms.map_or(String::new(), |p| format!("  p99 {p:.1}ms")),
                    );
                    let mut err = std::io::stderr().lock();
                    if tty {
                        let _ = write!(err, "\r{line}\x1b[K");
                    } else {
                        let _ = writeln!(err, "{line}");
                    }
                    let _ = err.flush();
                }
                ticks.push(tick);
            }
            if progress && tty {
                let _ = writeln!(std::io::stderr());
            }
            ticks
        });
        Monitor { stop, handle }
    }

    pub async fn finish(self) -> Vec<Tick> {
        self.stop.notify_one();
        self.handle.await.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_shards_merge() {
        let lat = Latency::default();
        for i in 0..1000u64 {
            lat.record(i as usize, 1000 + i);
        }
        assert_eq!(lat.total().len(), 1000);
        assert_eq!(lat.take_window().len(), 1000);
        assert_eq!(lat.take_window().len(), 0);
        assert_eq!(lat.total().len(), 1000);
    }
}
