//! The JetStream engine's counters, added to `/metrics` when the engine
//! hands out its history or sessions: what a reconnect storm costs the
//! server, and what it could not be given in time.

use herald_core::metrics::{register, Counter};

pub static HISTORY_READS: Counter = Counter::new(
    "herald_jetstream_history_reads_total",
    "History reads asked of JetStream (concurrent requests for one stream share one read)",
);
pub static HISTORY_READS_SHARED: Counter = Counter::new(
    "herald_jetstream_history_reads_shared_total",
    "History requests answered by another request's read of the same stream, in flight at the time",
);
pub static HISTORY_READ_TIMEOUTS: Counter = Counter::new(
    "herald_jetstream_history_read_timeouts_total",
    "History reads JetStream did not answer within 1 s (the requests were rejected)",
);
pub static HISTORY_READ_ERRORS: Counter = Counter::new(
    "herald_jetstream_history_read_errors_total",
    "History reads that failed for another reason than a timeout (the requests were rejected)",
);
pub static SESSIONS_WRITTEN: Counter = Counter::new(
    "herald_jetstream_sessions_written_total",
    "Session snapshots written to the sessions bucket",
);
pub static SESSIONS_COALESCED: Counter = Counter::new(
    "herald_jetstream_sessions_coalesced_total",
    "Session snapshots replaced by a newer one of the same session before they were written",
);
pub static SESSIONS_DROPPED: Counter = Counter::new(
    "herald_jetstream_sessions_dropped_total",
    "Session snapshots not kept: the write queue was full, the server away, the write failed or timed out",
);

pub fn register_all() {
    for c in [
        &HISTORY_READS,
        &HISTORY_READS_SHARED,
        &HISTORY_READ_TIMEOUTS,
        &HISTORY_READ_ERRORS,
        &SESSIONS_WRITTEN,
        &SESSIONS_COALESCED,
        &SESSIONS_DROPPED,
    ] {
        register(c);
    }
}
