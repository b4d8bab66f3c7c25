//! Interest known across a NATS cluster before a subscriber is confirmed.
//!
//! On one NATS server a subscription is in effect for every publisher once
//! the server has read the `SUB` (the transport's round trip). In a
//! cluster the other servers learn of it over their routes a moment later,
//! and a publication another node sends through its own server in that
//! moment reaches nobody here: the subscriber was confirmed, and missed
//! it. Exactly once must hold on a cluster as on one server, so there the
//! confirmation also waits for a *probe round*: a request to every node
//! alive, sent after the `SUB`s, answered by each. A route carries a
//! server's interest changes and its messages in the order it made them,
//! so when a node has heard the probe, its server knew of the new
//! subscriptions before it: anything published through it from then on
//! reaches this node. (Over a slow route, measured with a route that
//! delays everything 300 ms, tests/it/nats_cluster.rs: without the round,
//! every event triggered through the far node at once was lost.)
//!
//! Rounds are shared: a subscription joins the next round that starts
//! after its `SUB` was sent, so a storm of subscriptions costs a few rounds,
//! not one each. A node that does not answer within [`PROBE_TIMEOUT`]
//! (dead but not yet declared gone, or an older version that does not know
//! the probe) holds the confirmation no longer than that.

#[allow(unused_imports)]
use super::*;

/// Longest wait for the probe round's answers.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Shared probe rounds: how many started and finished. One runs at a
/// time, so one is running while `started > finished`.
#[derive(Default)]
pub struct Rounds {
    state: Mutex<RoundsState>,
    finished: Notify,
}

#[derive(Default)]
struct RoundsState {
    started: u64,
    finished: u64,
}

impl Shared {
    /// Returns once a probe round that started after this call has been
    /// answered by every node alive (or timed out).
    pub async fn reach_peers(self: &Arc<Self>) {
        let need = self.rounds.state.lock().started + 1;
        loop {
            let finished = self.rounds.finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            let mine = {
                let mut s = self.rounds.state.lock();
                if s.finished >= need {
                    return;
                }
                if s.started > s.finished {
                    None
                } else {
                    s.started += 1;
                    Some(s.started)
                }
            };
            match mine {
                Some(round) => {
                    self.clone()
                        .ask_within(String::new(), Query::Probe, None, PROBE_TIMEOUT)
                        .await;
                    let mut s = self.rounds.state.lock();
                    s.finished = round;
                    drop(s);
                    self.rounds.finished.notify_waiters();
                }
                None => finished.await,
            }
        }
    }
}
