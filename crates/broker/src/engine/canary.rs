//! The broker canary: a node that silently stops hearing the broker
//! (its socket open, nothing delivered: a frozen or wedged server, a
//! half-dead route; AnyCable #275, soketi #428) keeps its clients
//! connected and delivers them nothing. Neither transport notices by
//! itself soon: NATS pings every 5 s and gives up after two unanswered,
//! Redis's pub/sub connection has no keep-alive at all.
//!
//! So every `broker.canary_interval` the node publishes a sequence number
//! to `{prefix}.canary.{id}`, a subject only it subscribes to, through the
//! same queue and connections as its publications, and expects to hear it
//! back within `broker.canary_timeout`. When it does not:
//! `herald_broker_canary_failures_total` counts it, one warning is logged
//! (then at most one per [`crate::nats::jetstream::LOG_EVERY`] while it lasts),
//! and the node reports itself not connected (`/ready` 503 `BROKER DOWN`,
//! `herald_broker_up` 0). While failing it checks every `canary_timeout`
//! rather than every interval, and once a canary is heard again the node
//! is ready again.
//!
//! A reconnect (the transport drops its connection and subscribes to
//! everything again; a NATS client may move to another server of the
//! cluster) waits until the node has heard *no* canary at all, not even a
//! late one, for [`DEAF_ROUNDS`] rounds in a row. A late canary means the
//! path works and is slow: a broker or node starved of CPU, a backlog.
//! Reconnecting then only makes it worse: what the other nodes publish
//! while the connection is rebuilt is lost, and the resubscription adds
//! load. Measured at 100,000 users on six nodes of a two-core machine
//! (bench/RESULTS.md, `broadcast` across nodes), such reconnects were a
//! large share of the deliveries lost; a frozen server, which delivers
//! nothing, is still left after `interval + DEAF_ROUNDS × timeout`.

#[allow(unused_imports)]
use super::*;
use herald_core::metrics::Counter;

/// Rounds in a row with no canary heard (none, not even a late one)
/// before the transport reconnects.
pub const DEAF_ROUNDS: u32 = 3;

pub static CANARY_FAILURES: Counter = Counter::new(
    "herald_broker_canary_failures_total",
    "Broker canaries this node published and did not hear back in time",
);

/// The canary's settings and state, one per engine.
pub struct Canary {
    /// Between canaries, in ms (0: off).
    every_ms: AtomicU64,
    /// How long to wait for one, in ms.
    deadline_ms: AtomicU64,
    sent: AtomicU64,
    heard: AtomicU64,
    heard_now: Notify,
    ok: AtomicBool,
    /// Poked when the transport should drop its connection and reconnect.
    pub reconnect: Notify,
    log: crate::nats::jetstream::Throttle,
}

impl Default for Canary {
    fn default() -> Self {
        Canary {
            every_ms: AtomicU64::new(0),
            deadline_ms: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            heard: AtomicU64::new(0),
            heard_now: Notify::new(),
            ok: AtomicBool::new(true),
            reconnect: Notify::new(),
            log: Default::default(),
        }
    }
}

impl Canary {
    /// Whether the last canary came back (true while off or before the first).
    pub fn ok(&self) -> bool {
        self.ok.load(Ordering::Acquire)
    }

    pub(super) fn configure(&self, every: Duration, deadline: Duration) {
        self.every_ms
            .store(every.as_millis() as u64, Ordering::Release);
        self.deadline_ms
            .store(deadline.as_millis() as u64, Ordering::Release);
    }

    /// A message on the canary subject: the sequence number it carries.
    fn heard(&self, payload: &[u8]) {
        let Some(n) = std::str::from_utf8(payload)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
        else {
            return;
        };
        self.heard.fetch_max(n, Ordering::AcqRel);
        self.heard_now.notify_waiters();
    }
}

impl Shared {
    pub fn canary_subject(&self) -> String {
        subject::canary(&self.prefix, self.me())
    }

    /// Whether `via` is this node's canary subject; if so, it is handled.
    pub(super) fn on_canary(&self, via: &str, payload: &[u8]) -> bool {
        // Every message from the broker passes here: tell the canary's
        // subject by its shape before building it to compare.
        let is_canary = via
            .strip_prefix(self.prefix.as_str())
            .is_some_and(|rest| rest.starts_with(".canary."));
        if !is_canary || via != self.canary_subject() {
            return false;
        }
        self.canary.heard(payload);
        true
    }

    /// Publish one canary and wait for it; whether it came back in time.
    async fn canary_round(&self, deadline: Duration) -> bool {
        let c = &self.canary;
        let seq = c.sent.fetch_add(1, Ordering::AcqRel) + 1;
        let back = async {
            loop {
                let wait = c.heard_now.notified();
                if c.heard.load(Ordering::Acquire) >= seq {
                    return;
                }
                wait.await;
            }
        };
        if !self.send(self.canary_subject(), seq.to_string().into_bytes()) {
            // Not even queued (the queue is full): the broker is not
            // keeping up, which the canary is there to notice.
            return false;
        }
        tokio::time::timeout(deadline, back).await.is_ok()
    }
}

/// The canary's loop, for the life of the engine (started on attach).
pub(super) async fn run(sh: Arc<Shared>) {
    let c = &sh.canary;
    // Listed (at 0) even when off, so a dashboard can rely on it.
    metrics::register(&CANARY_FAILURES);
    let every = Duration::from_millis(c.every_ms.load(Ordering::Acquire));
    let deadline = Duration::from_millis(c.deadline_ms.load(Ordering::Acquire));
    if every.is_zero() || deadline.is_zero() {
        return;
    }
    let mut failing = false;
    // Failed rounds in a row since which no canary came back at all, and
    // the newest canary heard when the last round ended.
    let mut deaf = 0;
    let mut seen = c.heard.load(Ordering::Acquire);
    loop {
        tokio::time::sleep(if failing { deadline } else { every }).await;
        if sh.left.load(Ordering::Acquire) {
            return;
        }
        if !sh.is_up() {
            // The transport knows it is down and is reconnecting already.
            deaf = 0;
            continue;
        }
        if sh.canary_round(deadline).await {
            if failing {
                tracing::info!(engine = sh.name, "broker canary heard again; ready");
                failing = false;
            }
            deaf = 0;
            seen = c.heard.load(Ordering::Acquire);
            c.ok.store(true, Ordering::Release);
            continue;
        }
        metrics::count(&CANARY_FAILURES);
        c.ok.store(false, Ordering::Release);
        if c.log.allow() {
            tracing::warn!(
                engine = sh.name,
                timeout_ms = deadline.as_millis() as u64,
                failures = CANARY_FAILURES.get(),
                "broker canary not heard back: this node may not be hearing the broker; \
                 not ready (reconnecting if it stays silent for {DEAF_ROUNDS} rounds)"
            );
        }
        failing = true;
        // An earlier canary that came back late (during this round or the
        // wait before it): slow, not deaf.
        let now = c.heard.load(Ordering::Acquire);
        deaf = if now > seen { 0 } else { deaf + 1 };
        seen = now;
        if deaf >= DEAF_ROUNDS {
            tracing::warn!(
                engine = sh.name,
                rounds = deaf,
                "broker canary silent: no canary heard back in {deaf} rounds; reconnecting"
            );
            deaf = 0;
            c.reconnect.notify_one();
        }
    }
}
