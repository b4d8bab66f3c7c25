//! The adapter's counters, added to `/metrics` when the routes are built.

use herald_core::metrics::{register, Counter};

pub static RPC_CALLS: Counter =
    Counter::new("herald_rpc_calls_total", "Calls to the app's RPC server");
pub static RPC_RETRIES: Counter = Counter::new(
    "herald_rpc_retries_total",
    "RPC calls tried again because the RPC server was unreachable or overloaded",
);
pub static RPC_ERRORS: Counter = Counter::new(
    "herald_rpc_errors_total",
    "RPC calls that failed: unreachable, an error answer, or an unreadable answer",
);
pub static RPC_TIMEOUTS: Counter = Counter::new(
    "herald_rpc_timeouts_total",
    "RPC calls that took longer than rpc.timeout_ms",
);
pub static RPC_APP_ERRORS: Counter = Counter::new(
    "herald_rpc_app_errors_total",
    "RPC answers with status ERROR (an exception in the app)",
);
pub static CABLE_RPC_FAILURES: Counter = Counter::new(
    "herald_cable_rpc_failures_total",
    "Action Cable clients disconnected (reconnect: true) or subscriptions rejected because an RPC call failed",
);
pub static CABLE_BROKER_AWAY: Counter = Counter::new(
    "herald_cable_broker_unavailable_total",
    "Action Cable clients disconnected (reconnect: true) because the cluster's broker did not take a stream in time",
);
pub static CABLE_UNAUTHORIZED: Counter = Counter::new(
    "herald_cable_unauthorized_total",
    "Action Cable connections the app refused (Connect answered FAILURE)",
);
pub static DISCONNECTS_QUEUED: Counter = Counter::new(
    "herald_rpc_disconnects_queued_total",
    "Disconnect calls queued for clients that left",
);
pub static DISCONNECTS_DROPPED: Counter = Counter::new(
    "herald_rpc_disconnects_dropped_total",
    "Disconnect calls not made: the queue held rpc.disconnect_queue calls or rpc.disconnect_queue_bytes bytes",
);
pub static DISCONNECTS_SENT: Counter = Counter::new(
    "herald_rpc_disconnects_sent_total",
    "Disconnect calls made (answered or failed)",
);
pub static BROADCASTS: Counter = Counter::new(
    "herald_broadcasts_total",
    "Stream messages accepted on POST /_broadcast",
);
pub static BROADCAST_ERRORS: Counter = Counter::new(
    "herald_broadcast_errors_total",
    "POST /_broadcast requests refused (bad key, bad body, too large)",
);

pub static CABLE_SESSIONS_RESTORED: Counter = Counter::new(
    "herald_cable_sessions_restored_total",
    "actioncable-v1-ext-json sessions restored from the sessions cache (no Connect call)",
);
pub static CABLE_RESTORES_REFUSED: Counter = Counter::new(
    "herald_cable_restores_refused_total",
    "Restore requests (?sid=) of a kept session refused: its connection still live, or the request's token names another identity",
);
pub static CABLE_HISTORY_REJECTED: Counter = Counter::new(
    "herald_cable_history_rejected_total",
    "History requests answered reject_history, every one whatever the reason: malformed or asking nothing, over rpc.history_rate, an unknown stream or epoch, an offset evicted or ahead, an answer over the connection's room",
);
pub static CABLE_HISTORY_LIMITED: Counter = Counter::new(
    "herald_cable_history_limited_total",
    "History requests answered reject_history because the connection was over rpc.history_rate",
);
pub static CABLE_HISTORY_OVER_BUDGET: Counter = Counter::new(
    "herald_cable_history_over_budget_total",
    "History requests answered reject_history because the node's answers waiting past outbound bounds would pass rpc.history_answers_max_bytes",
);
pub static CABLE_GAPS_FILLED: Counter = Counter::new(
    "herald_cable_gaps_filled_total",
    "Gaps in a reliable stream's live offsets (publications from several nodes crossed, or lost by the broker) read from the shared history",
);
pub static CABLE_GAPS_UNFILLED: Counter = Counter::new(
    "herald_cable_gaps_unfilled_total",
    "Gaps in a reliable stream's live offsets the shared history could not be read for (the publications went on without them)",
);
pub static CABLE_PRESENCE_REFUSED: Counter = Counter::new(
    "herald_cable_presence_refused_total",
    "Presence commands (join, leave, info) answered with a presence error: stream not presence-enabled, bad member, over a limit or rpc.presence_rate",
);
pub static CABLE_WHISPERS: Counter = Counter::new(
    "herald_cable_whispers_total",
    "Whispers relayed to a stream's other subscribers",
);
pub static CABLE_WHISPERS_DROPPED: Counter = Counter::new(
    "herald_cable_whispers_dropped_total",
    "Whispers dropped: the subscription may not whisper, or the connection was over rpc.whisper_rate",
);

pub static SSE_OPENED: Counter = Counter::new(
    "herald_sse_connections_total",
    "Server-Sent Events streams opened at rpc.sse_path (every subscription confirmed); their live count is herald_connections{protocol=\"actioncable-sse\"}",
);
pub static SSE_REFUSED: Counter = Counter::new(
    "herald_sse_refused_total",
    "Server-Sent Events requests refused: no or bad subscription parameters (400), unauthorized or a subscription rejected (401), over capacity, draining or the app unreachable (503)",
);
pub static SSE_RESUMES: Counter = Counter::new(
    "herald_sse_resumes_total",
    "Server-Sent Events requests resuming from a Last-Event-ID (header or last_event_id parameter)",
);

pub fn register_all() {
    for c in [
        &RPC_CALLS,
        &RPC_RETRIES,
        &RPC_ERRORS,
        &RPC_TIMEOUTS,
        &RPC_APP_ERRORS,
        &CABLE_RPC_FAILURES,
        &CABLE_BROKER_AWAY,
        &CABLE_UNAUTHORIZED,
        &DISCONNECTS_QUEUED,
        &DISCONNECTS_DROPPED,
        &DISCONNECTS_SENT,
        &BROADCASTS,
        &BROADCAST_ERRORS,
        &CABLE_SESSIONS_RESTORED,
        &CABLE_RESTORES_REFUSED,
        &CABLE_HISTORY_REJECTED,
        &CABLE_HISTORY_LIMITED,
        &CABLE_HISTORY_OVER_BUDGET,
        &CABLE_GAPS_FILLED,
        &CABLE_GAPS_UNFILLED,
        &CABLE_PRESENCE_REFUSED,
        &CABLE_WHISPERS,
        &CABLE_WHISPERS_DROPPED,
        &SSE_OPENED,
        &SSE_REFUSED,
        &SSE_RESUMES,
    ] {
        register(c);
    }
}
