//! Process-wide counters, exposed in Prometheus text format on `/metrics`.
//!
//! Plain atomics for now: they cost one relaxed add on the paths that count
//! and need no registry. The metrics issue may move these onto the
//! `metrics` crate with histograms; the names are the contract.

use std::sync::atomic::{AtomicU64, Ordering};

pub struct Counter {
    pub name: &'static str,
    pub help: &'static str,
    value: AtomicU64,
}

impl Counter {
    pub const fn new(name: &'static str, help: &'static str) -> Counter {
        Counter {
            name,
            help,
            value: AtomicU64::new(0),
        }
    }

    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

pub fn count(c: &Counter) {
    c.value.fetch_add(1, Ordering::Relaxed);
}

pub fn add(c: &Counter, n: u64) {
    c.value.fetch_add(n, Ordering::Relaxed);
}

pub static CONNECTIONS_OPENED: Counter = Counter::new(
    "herald_connections_opened_total",
    "WebSocket connections accepted",
);
pub static CONNECTIONS_CLOSED: Counter = Counter::new(
    "herald_connections_closed_total",
    "WebSocket connections ended",
);
pub static CONNECTIONS_REFUSED: Counter = Counter::new(
    "herald_connections_refused_total",
    "Connections refused at open (unknown or disabled app, quota, protocol version, draining)",
);
pub static BAD_MESSAGES: Counter = Counter::new(
    "herald_bad_messages_total",
    "Client frames rejected: invalid JSON, wrong shape, unknown event, binary, invalid UTF-8, too large",
);
pub static RATE_LIMITED: Counter = Counter::new(
    "herald_rate_limited_total",
    "Client messages or client events refused by a rate limit",
);
pub static SUBSCRIPTION_ERRORS: Counter = Counter::new(
    "herald_subscription_errors_total",
    "Subscriptions refused (bad name, bad auth, limits)",
);
pub static SLOW_CLIENTS_CLOSED: Counter = Counter::new(
    "herald_slow_clients_closed_total",
    "Connections closed because their outbound queue was full",
);
pub static MESSAGES_PUBLISHED: Counter = Counter::new(
    "herald_messages_published_total",
    "Events published to channels",
);
pub static FRAMES_DELIVERED: Counter = Counter::new(
    "herald_frames_delivered_total",
    "Frames queued to subscribers",
);
pub static SOCKET_WRITES: Counter = Counter::new(
    "herald_socket_writes_total",
    "Batches of frames written to client sockets (one flush each)",
);
pub static FRAMES_ENCODED: Counter = Counter::new(
    "herald_frames_encoded_total",
    "Publication frames built (once per protocol and tag, then shared)",
);
pub static FANOUT_JOBS: Counter = Counter::new(
    "herald_fanout_jobs_total",
    "Publications fanned out to this node's subscribers",
);
pub static FANOUT_MICROS: Counter = Counter::new(
    "herald_fanout_microseconds_total",
    "Time spent queueing publications to subscribers, in microseconds",
);
pub static FANOUT_OVERFLOW: Counter = Counter::new(
    "herald_fanout_overflow_total",
    "Broker publications queued while a fan-out worker was full",
);
pub static BROKER_RECEIVED: Counter = Counter::new(
    "herald_broker_publications_received_total",
    "Publications received from other nodes through the broker",
);
pub static API_REQUESTS: Counter = Counter::new("herald_api_requests_total", "HTTP API requests");
pub static API_ERRORS: Counter = Counter::new(
    "herald_api_errors_total",
    "HTTP API requests answered with an error",
);

/// Time one publication's fan-out took.
pub fn observe_fanout(took: std::time::Duration) {
    count(&FANOUT_JOBS);
    add(&FANOUT_MICROS, took.as_micros() as u64);
}

static ALL: [&Counter; 17] = [
    &CONNECTIONS_OPENED,
    &CONNECTIONS_CLOSED,
    &CONNECTIONS_REFUSED,
    &BAD_MESSAGES,
    &RATE_LIMITED,
    &SUBSCRIPTION_ERRORS,
    &SLOW_CLIENTS_CLOSED,
    &MESSAGES_PUBLISHED,
    &FRAMES_DELIVERED,
    &SOCKET_WRITES,
    &FRAMES_ENCODED,
    &FANOUT_JOBS,
    &FANOUT_MICROS,
    &BROKER_RECEIVED,
    &FANOUT_OVERFLOW,
    &API_REQUESTS,
    &API_ERRORS,
];

/// Counters an adapter defines for itself (its own `static`s), rendered
/// after the core's.
static EXTRA: parking_lot::Mutex<Vec<&'static Counter>> = parking_lot::Mutex::new(Vec::new());

/// Add an adapter's counter to `/metrics` (once; registering it again, or a
/// counter with the same name, does nothing).
pub fn register(c: &'static Counter) {
    let mut extra = EXTRA.lock();
    if !ALL.iter().chain(extra.iter()).any(|e| e.name == c.name) {
        extra.push(c);
    }
}

/// Render every counter, plus the given gauges, in Prometheus text format.
pub fn render(gauges: &[(&str, &str, u64)]) -> String {
    let mut out = String::new();
    let extra = EXTRA.lock().clone();
    for c in ALL.iter().copied().chain(extra) {
        out.push_str(&format!(
            "# HELP {0} {1}\n# TYPE {0} counter\n{0} {2}\n",
            c.name,
            c.help,
            c.get()
        ));
    }
    for (name, help, value) in gauges {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    static MINE: Counter = Counter::new("herald_test_extra_total", "A registered counter");

    #[test]
    fn registered_counters_are_rendered_once() {
        register(&MINE);
        register(&MINE);
        count(&MINE);
        let text = render(&[]);
        assert_eq!(
            text.matches("# TYPE herald_test_extra_total counter")
                .count(),
            1
        );
        assert!(text.contains("herald_test_extra_total 1"), "{text}");
    }
}
