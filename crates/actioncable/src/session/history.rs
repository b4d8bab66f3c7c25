//! A session's history and resumption (`actioncable-v1-ext-json`):
//! restoring a session from the cache, `subscribe` with a history request,
//! and `history` answers (a child of `session`, which it extends; the
//! protocol's frames are `crate::ext::protocol`).

use super::*;

/// How long a restored session's streams wait for the client's history
/// requests (which `@anycable/core` sends right after the welcome) before
/// their live publications go out without them.
pub const RESTORED_HOLD: std::time::Duration = std::time::Duration::from_secs(5);

/// A history frame's bytes beyond its message, identifier (counted twice:
/// it is escaped JSON), stream and epoch: keys, offset, WebSocket header.
const ANSWER_FRAME: usize = 96;

/// `actioncable-v1-ext-json` history and resumption.
impl CableSession {
    /// Put a restored session's subscriptions back, holding their live
    /// publications until the client's history requests are answered.
    pub(super) async fn restore(&mut self, snap: Snapshot) {
        self.hold = true;
        for (identifier, streams) in snap.subs {
            super::push_boxed(
                &mut self.subs,
                Sub {
                    identifier: Arc::from(identifier.as_str()),
                    streams: Box::default(),
                },
            );
            for s in streams {
                self.add_stream(&identifier, s).await;
            }
        }
        self.hold = false;
        // A client that never asks for its history must not wait for its
        // live publications forever: after RESTORED_HOLD they go out.
        let held: Vec<(herald_core::publication::Tag, String)> = self
            .subs
            .iter()
            .flat_map(|s| {
                s.streams
                    .iter()
                    .map(|x| (Some(s.identifier.clone()), x.to_string()))
            })
            .collect();
        let conn = Arc::downgrade(&self.conn);
        tokio::spawn(async move {
            tokio::time::sleep(RESTORED_HOLD).await;
            let Some(conn) = conn.upgrade() else { return };
            if let Some(gate) = conn.gate() {
                for (tag, s) in &held {
                    gate.let_go(&conn, s, tag);
                }
            }
        });
    }

    /// A `subscribe` that may carry a `history` request: the streams the
    /// subscription gets are held until it is answered, after the
    /// confirmation, as anycable-go answers it.
    pub(super) async fn subscribe_with_history(&mut self, identifier: String, text: &str) -> Next {
        let request = crate::ext::protocol::history_request(text).ok().flatten();
        if request.is_none() || self.find(&identifier).is_some() {
            return self.subscribe(identifier).await;
        }
        self.hold = true;
        let next = self.subscribe(identifier.clone()).await;
        self.hold = false;
        if let (Some(at), Some(req)) = (self.find(&identifier), request) {
            self.answer_history(at, &identifier, &req).await;
        }
        next
    }

    pub(super) async fn history(&mut self, identifier: &str, text: &str) -> Next {
        let Some(at) = self.find(identifier).filter(|_| self.ext) else {
            metrics::count(&metrics::BAD_MESSAGES);
            tracing::debug!(sid = %self.conn.socket_id, "history for an unknown identifier");
            return Next::Continue;
        };
        match crate::ext::protocol::history_request(text) {
            Ok(Some(req)) if !req.is_empty() => self.answer_history(at, identifier, &req).await,
            other => {
                // Malformed, absent, or asking nothing (no `since`, no
                // stream): a `history` command always gets an answer.
                metrics::count(&metrics::BAD_MESSAGES);
                if let Err(e) = other {
                    tracing::debug!(sid = %self.conn.socket_id, error = %e, "bad history request");
                }
                self.reject_history(at, identifier);
            }
        }
        Next::Continue
    }

    /// Answer `reject_history` (counted, whatever the reason), letting the
    /// subscription's held live publications go.
    fn reject_history(&mut self, at: usize, identifier: &str) {
        metrics::count(&m::CABLE_HISTORY_REJECTED);
        self.release_all(at);
        self.send(&crate::ext::protocol::reject_history(identifier));
    }

    /// Take one history request from the bucket.
    fn history_allowed(&mut self) -> bool {
        let rate = self.cable.history.rate;
        self.rare().history.take(rate)
    }

    fn release_all(&self, at: usize) {
        let gate = self.conn.with_gate();
        let tag = Some(self.subs[at].identifier.clone());
        for s in &self.subs[at].streams {
            gate.release(&self.conn, s, &tag, None, |_, _| unreachable!());
        }
    }

    /// Answer a history request for the subscription at `at`: every missed
    /// publication of each of its streams then `confirm_history`, or
    /// `reject_history` when any stream cannot be answered exactly (the
    /// client stays connected). Held live publications follow the answer.
    /// The reads run one after another: a cluster engine answers each
    /// within its own timeout, and the streams stay held meanwhile.
    async fn answer_history(
        &mut self,
        at: usize,
        identifier: &str,
        req: &crate::ext::protocol::HistoryRequest,
    ) {
        use herald_core::history::Miss;
        if req.is_empty() {
            // A `subscribe` asking nothing: anycable-go answers nothing
            // (beyond the confirmation). A `history` command never gets
            // here (see `history`).
            return self.release_all(at);
        }
        if !self.history_allowed() {
            metrics::count(&m::CABLE_HISTORY_LIMITED);
            tracing::debug!(sid = %self.conn.socket_id, "history request over rpc.history_rate");
            return self.reject_history(at, identifier);
        }
        let history = self.cable.reliable.clone();
        let streams = self.subs[at].streams.clone();
        let mut answers = Vec::with_capacity(streams.len());
        for stream in &streams {
            let channel = stream.clone();
            let read = match req.streams.get(&**stream) {
                Some(p) => Some(history.after(&channel, &p.epoch, p.offset).await),
                None if req.since > 0 => match history.since(&channel, req.since).await {
                    Err(Miss::UnknownStream) => None,
                    r => Some(r),
                },
                None => None,
            };
            match read {
                Some(Ok(b)) => answers.push((stream, channel, Some(b))),
                None => answers.push((stream, channel, None)),
                Some(Err(miss)) => {
                    tracing::debug!(sid = %self.conn.socket_id, ?miss, "history rejected");
                    return self.reject_history(at, identifier);
                }
            }
        }
        // The answer goes out past the outbound queue's bound (see
        // `Gate`), within the connection's room for answers: one that
        // would not fit (with the answers still unread) is refused.
        let gate = self.conn.with_gate();
        let tag = Some(self.subs[at].identifier.clone());
        let size: usize = answers
            .iter()
            .filter_map(|(stream, _, b)| Some((stream, b.as_ref()?)))
            .map(|(stream, b)| {
                let each = 2 * identifier.len() + stream.len() + b.epoch.len() + ANSWER_FRAME;
                // What the gate will skip (sent already) costs nothing.
                let after = match gate.last_sent(stream, &tag) {
                    Some((epoch, last)) if epoch == b.epoch => last,
                    _ => 0,
                };
                b.entries
                    .iter()
                    .filter(|e| e.offset > after)
                    .map(|e| e.data.len() + each)
                    .sum::<usize>()
            })
            .sum();
        if self.conn.burst_bytes() + size > gate.burst_room() {
            tracing::debug!(sid = %self.conn.socket_id, size, "history answer over rpc.history_max_bytes");
            return self.reject_history(at, identifier);
        }
        // The node's answers together stay within their budget: reserved
        // here, the frames count on their own once queued (see `budget`).
        let budget = &herald_core::history::budget::ANSWERS;
        if !budget.try_reserve(size) {
            metrics::count(&m::CABLE_HISTORY_OVER_BUDGET);
            tracing::debug!(sid = %self.conn.socket_id, size, "history answer over rpc.history_answers_max_bytes");
            self.release_all(at);
            return self.send(&crate::ext::protocol::reject_history(identifier));
        }
        for (stream, channel, backlog) in &answers {
            gate.release(&self.conn, channel, &tag, backlog.as_ref(), |e, epoch| {
                crate::ext::protocol::entry_frame(identifier, stream, epoch, e)
            });
        }
        budget.release(size);
        self.send(&crate::ext::protocol::confirm_history(identifier));
    }
}
