//! The adapter's metrics: webhook deliveries, failures, drops and queues
//! (recorded straight into the `metrics` recorder the core installs; the
//! names are a contract, listed in docs/webhooks-and-monitoring.md).

use metrics::{describe_counter, describe_gauge, Unit};

/// Describe the webhook metrics (once the core's recorder is installed).
pub fn describe() {
    describe_counter!(
        "herald_webhook_deliveries_total",
        "Webhook requests answered with 2xx"
    );
    describe_counter!(
        "herald_webhook_failures_total",
        "Webhook requests that failed (non-2xx, timeout, connection error), by whether they will be retried"
    );
    describe_counter!(
        "herald_webhook_events_dropped_total",
        "Webhook events dropped because the app's webhook queue was full (webhook_queue events or webhook_queue_bytes bytes)"
    );
    describe_gauge!(
        "herald_webhook_queue_bytes",
        Unit::Bytes,
        "Bytes of webhook events waiting to be sent (at most webhook_queue_bytes per app)"
    );
    describe_gauge!(
        "herald_webhook_queue_depth",
        "Webhook events waiting to be sent (batched, delayed or retrying)"
    );
}

/// Webhook requests: delivered (2xx), or failed (`retry`: it will be sent
/// again).
pub fn webhook_sent(app: &str, ok: bool, retry: bool) {
    if ok {
        metrics::counter!("herald_webhook_deliveries_total", "app" => app.to_owned()).increment(1);
    } else {
        let r = if retry { "true" } else { "false" };
        metrics::counter!("herald_webhook_failures_total", "app" => app.to_owned(), "retry" => r)
            .increment(1);
    }
}

/// `n` webhook events dropped for `app` (its queue was full).
pub fn webhook_dropped(app: &str, n: u64) {
    metrics::counter!("herald_webhook_events_dropped_total", "app" => app.to_owned()).increment(n);
}

/// Webhook events waiting for `app`, and their bytes.
pub fn webhook_queue(app: &str, depth: usize, bytes: usize) {
    metrics::gauge!("herald_webhook_queue_depth", "app" => app.to_owned()).set(depth as f64);
    metrics::gauge!("herald_webhook_queue_bytes", "app" => app.to_owned()).set(bytes as f64);
}
