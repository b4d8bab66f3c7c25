//! Request/reply: a request to every node, answered on the asker's own
//! subject, collected from the nodes alive within the query timeout;
//! channel figures, control messages and a cache channel's last event.

#[allow(unused_imports)]
use super::*;

impl Shared {
    pub(super) fn answered(&self, from: NodeId, id: u64, r: Answer) {
        if let Answer::Members(list) = &r {
            // Remember what the node has, to remove it if the node goes.
            let mut s = self.state.lock();
            let key = self.pending_scope(id);
            if let Some((app, scope)) = key {
                if wants_scope(&s, self, &app, &scope) {
                    let m = s
                        .remote
                        .entry(from)
                        .or_default()
                        .entry((app, scope))
                        .or_default();
                    for (u, i) in list {
                        m.insert(u.clone(), i.clone());
                    }
                }
            }
        }
        let mut pending = self.pending.lock();
        if let Some(p) = pending.get_mut(&id) {
            if p.waiting.remove(&from) {
                p.answers.push((from, r));
            }
            if p.waiting.is_empty() {
                if let Some(done) = p.done.take() {
                    let _ = done.send(());
                }
            }
        }
    }

    pub(super) fn pending_scope(&self, id: u64) -> Option<ScopeKey> {
        self.scopes.lock().get(&id).cloned()
    }

    /// Send a request to every node and collect the answers of those
    /// alive, within [`QUERY_TIMEOUT`].
    pub(super) async fn ask(
        self: Arc<Self>,
        app: String,
        q: Query,
        scope: Option<ScopeKey>,
    ) -> Vec<(NodeId, Answer)> {
        if !self.is_up() {
            return Vec::new();
        }
        let settled = *self.settled.lock();
        if Instant::now() < settled {
            tokio::time::sleep_until(settled.into()).await;
        }
        self.ask_within(app, q, scope, QUERY_TIMEOUT).await
    }

    /// [`Shared::ask`] of the nodes known now, waiting at most `timeout`.
    pub(super) async fn ask_within(
        self: Arc<Self>,
        app: String,
        q: Query,
        scope: Option<ScopeKey>,
        timeout: Duration,
    ) -> Vec<(NodeId, Answer)> {
        let waiting: HashSet<NodeId> = self.state.lock().peers.keys().copied().collect();
        if waiting.is_empty() {
            return Vec::new();
        }
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Some(k) = scope {
            self.scopes.lock().insert(id, k);
        }
        self.pending.lock().insert(
            id,
            Pending {
                waiting,
                answers: Vec::new(),
                done: Some(tx),
            },
        );
        let msg = Msg::Request {
            n: self.me(),
            id,
            a: app,
            q,
        };
        if self.send_msg(self.all(), &msg) {
            let _ = tokio::time::timeout(timeout, rx).await;
        }
        self.scopes.lock().remove(&id);
        self.pending
            .lock()
            .remove(&id)
            .map(|p| p.answers)
            .unwrap_or_default()
    }
}

impl Queries for Engine {
    fn query(
        &self,
        _from: NodeId,
        app_id: &str,
        ns: Option<Namespace>,
        filter: StatsFilter,
    ) -> BoxFuture<Vec<ChannelStats>> {
        let sh = self.shared.clone();
        let app = app_id.to_owned();
        Box::pin(async move {
            sh.ask(app, Query::Stats(ns, filter), None)
                .await
                .into_iter()
                .flat_map(|(_, a)| match a {
                    Answer::Stats(s) => s,
                    _ => Vec::new(),
                })
                .collect()
        })
    }

    fn control(&self, from: NodeId, app_id: &str, control: Control) {
        let msg = Msg::Control {
            n: from,
            a: app_id.to_owned(),
            c: control,
        };
        self.shared.send_msg(self.shared.all(), &msg);
    }
}

/// History and sessions: on the transport's server where it keeps them
/// ([`Engine::with_streams`]), else per node (the trait's defaults).
impl herald_core::broker::Streams for Engine {
    fn history(
        &self,
        limits: herald_core::history::Limits,
    ) -> Arc<dyn herald_core::history::History> {
        match &self.streams {
            Some(s) => s.history(limits),
            None => Arc::new(herald_core::history::MemoryHistory::new(limits)),
        }
    }

    fn sessions(&self, ttl: Duration, max: usize) -> Arc<dyn herald_core::sessions::SessionStore> {
        match &self.streams {
            Some(s) => s.sessions(ttl, max),
            None => Arc::new(herald_core::sessions::MemorySessions::new(ttl, max)),
        }
    }
}

impl LastEvent for Engine {
    fn cached(
        &self,
        _from: NodeId,
        app_id: &str,
        ns: Namespace,
        channel: &str,
    ) -> BoxFuture<Option<(Publication, Duration)>> {
        let sh = self.shared.clone();
        let app = app_id.to_owned();
        let channel = ChannelId(ns, channel.to_owned());
        Box::pin(async move {
            let now = now_ms();
            sh.ask(app, Query::Cached(channel), None)
                .await
                .into_iter()
                .filter_map(|(_, a)| match a {
                    Answer::Cached(c) => c,
                    _ => None,
                })
                .max_by_key(|(at, _)| *at)
                .map(|(at, p)| (p, Duration::from_millis(now.saturating_sub(at))))
        })
    }
}
