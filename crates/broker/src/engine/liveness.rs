//! Liveness: the transport coming and going, heartbeats (with each node's
//! connections per app), the leader (the oldest node) that reports
//! cluster-wide flips for nodes that are gone and its successor (which
//! alone with it keeps the other nodes' keys, see [`crate::tally`]),
//! burying nodes silent for a whole TTL, and the full state a node sends
//! after a reconnect or when a new keeper asks.

#[allow(unused_imports)]
use super::*;

impl Shared {
    /// The connection is up (subscriptions in place) or down. A transport
    /// then says when the connection holds the node's interest
    /// ([`Shared::holds_interest`]).
    pub fn set_up(self: &Arc<Self>, up: bool, why: &str) {
        if !up {
            self.release();
        }
        let was = self.up.swap(up, Ordering::AcqRel);
        if was == up {
            return;
        }
        if up {
            tracing::info!(engine = self.name, "broker connected; announcing this node");
            // The outbox first, in order, then the hello: a node that
            // hears the hello and asks for what it missed finds the
            // resent ones on their way already.
            self.journal.resume(&self.out);
            self.resync_all();
            if let Some(since) = self.down_since.lock().take() {
                if since.elapsed() > self.ttl {
                    // The others have declared us gone: we come back as a
                    // new node, not as their leader with a stale view.
                    self.born.store(now_ms(), Ordering::Release);
                }
            }
            *self.settled.lock() = Instant::now() + DISCOVERY;
            {
                let mut s = self.state.lock();
                let now = Instant::now();
                for p in s.peers.values_mut() {
                    p.seen = now;
                }
                s.grace_until = Some(now + self.ttl);
                // Not judged while away: no stall to see in that gap.
                s.last_judged = None;
                s.count_nodes();
            }
            self.beat(true);
            self.send_state();
            // Once settled this node may lead (alone, or the oldest back
            // from an outage): report what it journaled meanwhile then,
            // not at the next heartbeat.
            let me = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(DISCOVERY + Duration::from_millis(10)).await;
                me.settle_check();
            });
        } else {
            self.journal.pause();
            *self.down_since.lock() = Some(Instant::now());
            metrics::count(&metrics::BROKER_OUTAGES);
            tracing::warn!(
                engine = self.name,
                error = why,
                "broker connection lost; serving local clients, reconnecting"
            );
            // Nobody can answer now.
            let mut pending = self.pending.lock();
            for p in pending.values_mut() {
                if let Some(done) = p.done.take() {
                    let _ = done.send(());
                }
            }
        }
    }

    pub(super) fn beat(&self, hello: bool) {
        let load = self
            .inbox
            .get()
            .map(|i| i.connections())
            .unwrap_or_default();
        let g = {
            let s = self.state.lock();
            if s.tally.leading {
                s.gone.keys().copied().collect()
            } else {
                Vec::new()
            }
        };
        let msg = Msg::Beat {
            n: self.me(),
            l: load,
            h: hello,
            r: hello,
            t: self.born(),
            g,
            s: self.journal.last(),
        };
        self.send_msg(self.all(), &msg);
    }

    /// Send our whole presence state, in order, on `all`.
    pub(super) fn send_state(&self) {
        // Queued under the lock: a change made meanwhile goes out after
        // the state, never before it (the others would undo it).
        let s = self.state.lock();
        let entries: Vec<Entry> = s
            .own
            .iter()
            .flat_map(|((app, scope), members)| {
                members
                    .iter()
                    .map(move |(u, i)| (app.clone(), scope.clone(), u.clone(), i.clone()))
            })
            .collect();
        let n = self.me();
        let held = s.tally.of(n);
        let all = self.all();
        self.send_msg(all.clone(), &Msg::StateBegin { n });
        for chunk in entries.chunks(STATE_CHUNK) {
            self.send_msg(
                all.clone(),
                &Msg::StatePart {
                    n,
                    e: chunk.to_vec(),
                },
            );
        }
        for chunk in held.chunks(STATE_CHUNK) {
            self.send_msg(
                all.clone(),
                &Msg::StateHeld {
                    n,
                    k: chunk.to_vec(),
                },
            );
        }
        self.send_msg(all, &Msg::StateEnd { n });
        drop(s);
    }

    pub fn born(&self) -> u64 {
        self.born.load(Ordering::Acquire)
    }

    /// The leader (the node that reports cluster-wide flips) and its
    /// successor, as this node sees them: the two oldest alive (earliest
    /// start, then lowest id).
    pub(super) fn keepers(&self, s: &State) -> (NodeId, Option<NodeId>) {
        let mut first = (self.born(), self.me());
        let mut second: Option<(u64, NodeId)> = None;
        for (n, p) in &s.peers {
            let c = (p.born, *n);
            if c < first {
                second = Some(first);
                first = c;
            } else if second.is_none_or(|x| c < x) {
                second = Some(c);
            }
        }
        (first.1, second.map(|x| x.1))
    }

    pub(super) fn leader(&self, s: &State) -> NodeId {
        self.keepers(s).0
    }

    /// Whether this node keeps the other nodes' keys ([`crate::tally`]):
    /// on becoming a keeper it asks every node for its set; on ceasing to
    /// be one (only once settled and every peer's age is known, so that a
    /// peer not yet heard of cannot make it drop what it needs) it forgets
    /// them.
    fn role_check(&self, s: &mut State) {
        let me = self.me();
        let (leader, next) = self.keepers(s);
        let keeps = leader == me || next == Some(me);
        if keeps && !s.tally.keeper {
            s.tally.keeper = true;
            s.tally.rebuilding = s.peers.keys().copied().collect();
            if !s.tally.rebuilding.is_empty() {
                tracing::info!(
                    nodes = s.tally.rebuilding.len(),
                    "this node now keeps the cluster's occupancy tally; asking every node for its set"
                );
                self.ask_sets(s);
            }
        } else if !keeps
            && s.tally.keeper
            && self.is_settled()
            && s.peers.values().all(|p| p.born != 0)
        {
            tracing::info!(
                "this node is neither leader nor successor: it keeps only its own occupancy keys"
            );
            s.tally.forget_others(me);
            s.incoming_held = HashMap::new();
        }
        self.tally_gauge(s);
    }

    /// Ask every node whose set this keeper lacks for its whole state
    /// (the path a node back from the dead is asked through).
    pub(super) fn ask_sets(&self, s: &State) {
        let g: Vec<NodeId> = if s.tally.leading {
            s.gone.keys().copied().collect()
        } else {
            Vec::new()
        };
        for n in &s.tally.rebuilding {
            let ask = Msg::Beat {
                n: self.me(),
                l: Vec::new(),
                h: true,
                r: true,
                t: self.born(),
                g: g.clone(),
                s: self.journal.last(),
            };
            self.send_msg(subject::node(&self.prefix, *n), &ask);
        }
    }

    /// Publish how many of the other nodes' keys this node keeps.
    pub(super) fn tally_gauge(&self, s: &State) {
        metrics::CLUSTER_TALLY_KEYS.set(s.tally.others(self.me()) as u64);
    }

    /// Node `n`'s whole set arrived: the tally takes it. The flips it makes
    /// are decided unless this keeper was waiting for it to rebuild (then
    /// they are what the cluster already had, reported long ago).
    pub(super) fn take_set(
        &self,
        s: &mut State,
        n: NodeId,
        held: HashSet<Key>,
        acts: &mut Vec<Act>,
    ) {
        self.lead_check(s, acts);
        let awaited = s.tally.rebuilding.remove(&n);
        let flips = s.tally.replace(n, held);
        if awaited {
            if s.tally.rebuilding.is_empty() {
                tracing::info!("occupancy tally rebuilt from every node's set");
            }
        } else {
            Self::flipped(s, flips, acts, None);
        }
        self.tally_gauge(s);
    }

    /// Whether this node leads now; on becoming the leader, report what
    /// the journal says the old one may not have (unless its tally is still
    /// being rebuilt: then it has no journal to trust).
    pub(super) fn lead_check(&self, s: &mut State, acts: &mut Vec<Act>) {
        self.role_check(s);
        let leads = self.is_settled() && self.leader(s) == self.me();
        if leads && !s.tally.leading {
            let flips = s.tally.replay();
            if s.tally.whole() {
                acts.extend(flips.into_iter().map(Act::Observed));
            }
        }
        s.tally.leading = leads;
    }

    pub(super) fn settle_check(&self) {
        let mut acts = Vec::new();
        {
            let mut s = self.state.lock();
            self.lead_check(&mut s, &mut acts);
        }
        if let Some(inbox) = self.inbox.get() {
            run(inbox, acts);
        }
    }

    /// Flips of the tally: reported by the leader, journaled by the others
    /// (`buried`: burying that node caused them).
    pub(super) fn flipped(
        s: &mut State,
        flips: Vec<Flip>,
        acts: &mut Vec<Act>,
        buried: Option<NodeId>,
    ) {
        // Decided only from a whole tally (see `Tally::rebuilding`).
        if flips.is_empty() || !s.tally.whole() {
            return;
        }
        if s.tally.leading {
            // A buried node's flips: nobody announced them (see
            // `Observer::gone`).
            let act = if buried.is_some() {
                Act::ObservedGone
            } else {
                Act::Observed
            };
            acts.extend(flips.into_iter().map(act));
            return;
        }
        if !buried.is_some_and(|n| s.leader_buried.contains(&n)) {
            s.tally.journal(&flips, buried);
        }
        acts.extend(flips.into_iter().map(Act::Seen));
    }

    /// This node now holds (`on`) or no longer holds `key`: tell the
    /// others. Returns whether the caller reports the flip it made.
    pub(super) fn hold(&self, key: Key, on: bool) -> bool {
        let mut acts = Vec::new();
        let mine = {
            let mut s = self.state.lock();
            self.lead_check(&mut s, &mut acts);
            let (changed, flip) = s.tally.set(self.me(), key.clone(), on);
            if changed {
                let (a, ch, u) = key;
                let msg = Msg::Held {
                    n: self.me(),
                    a,
                    ch,
                    u,
                    j: on,
                };
                self.send_msg(self.all(), &msg);
            }
            self.tally_gauge(&s);
            // A node that does not keep the others' keys, or is rebuilding
            // them, has no flip to decide (the keepers do).
            match flip {
                Some(_) if s.tally.leading && s.tally.whole() => true,
                Some(f) if s.tally.whole() => {
                    s.tally.journal(std::slice::from_ref(&f), None);
                    acts.push(Act::Seen(f));
                    false
                }
                _ => false,
            }
        };
        if let Some(inbox) = self.inbox.get() {
            run(inbox, acts);
        }
        mine
    }

    /// Forget node `n`: its members leave, its counts are dropped.
    pub(super) fn bury(&self, s: &mut State, n: NodeId, acts: &mut Vec<Act>) {
        s.peers.remove(&n);
        let held = self.forget_recv(s, n);
        if !held.is_empty() {
            acts.push(Act::Publications(held));
        }
        s.count_nodes();
        s.incoming.remove(&n);
        s.incoming_held.remove(&n);
        s.gone.insert(n, Instant::now());
        // Whoever leads now (perhaps this node, in place of `n`) reports
        // what `n` held alone.
        self.lead_check(s, acts);
        // A node whose set a rebuilding keeper still waited for: what it
        // heard of its keys is partial, so their loss decides nothing.
        let awaited = s.tally.rebuilding.remove(&n);
        let flips = s.tally.replace(n, HashSet::new());
        if !awaited {
            Self::flipped(s, flips, acts, Some(n));
        }
        self.tally_gauge(s);
        if let Some(scopes) = s.remote.remove(&n) {
            for ((app, scope), members) in scopes {
                for user in members.into_keys() {
                    acts.push(Act::Presence(
                        app.clone(),
                        PresenceChange {
                            scope: scope.clone(),
                            node: n,
                            user_id: user,
                            joined: None,
                        },
                    ));
                }
            }
        }
        acts.push(Act::Gone(n));
        acts.extend(connection_sums(s));
        let mut pending = self.pending.lock();
        for p in pending.values_mut() {
            p.waiting.remove(&n);
            if p.waiting.is_empty() {
                if let Some(done) = p.done.take() {
                    let _ = done.send(());
                }
            }
        }
    }

    /// Judge the peers' heartbeats: bury those silent for a whole TTL.
    pub(super) fn judge(&self) {
        let Some(inbox) = self.inbox.get().cloned() else {
            return;
        };
        let mut acts = Vec::new();
        let buried;
        {
            let mut s = self.state.lock();
            let now = Instant::now();
            if s.last_judged
                .replace(now)
                .is_some_and(|t| now - t > self.ttl)
            {
                // This process was frozen: the others were not silent, we
                // were (and they have declared us gone). Give them a TTL,
                // and come back as the youngest node.
                tracing::warn!("this node stalled for longer than the TTL");
                for p in s.peers.values_mut() {
                    p.seen = now;
                }
                self.born.store(now_ms(), Ordering::Release);
            }
            // A node alone since it started leads once settled.
            self.lead_check(&mut s, &mut acts);
            // A keeper still missing some node's set asks again (a message
            // lost, or the node was busy).
            if !s.tally.rebuilding.is_empty() {
                let st = &mut *s;
                st.tally.rebuilding.retain(|n| st.peers.contains_key(n));
                self.ask_sets(st);
                if s.tally.rebuilding.is_empty() {
                    tracing::info!("occupancy tally rebuilt from every node's set");
                }
            }
            if s.grace_until.is_some_and(|g| now < g) {
                drop(s);
                run(&inbox, acts);
                return;
            }
            let silent: Vec<NodeId> = s
                .peers
                .iter()
                .filter(|(_, p)| now.duration_since(p.seen) > self.ttl)
                .map(|(n, _)| *n)
                .collect();
            let any = !silent.is_empty();
            for n in silent {
                tracing::warn!(node = n, "node missed its heartbeats; removing its members");
                self.bury(&mut s, n, &mut acts);
            }
            // (Leading now: perhaps because the leader was among them.)
            buried = any && s.tally.leading;
            // Forget the dead after a while (a node id is never reused).
            let keep = self.ttl * 10;
            s.gone.retain(|_, at| now.duration_since(*at) < keep);
        }
        run(&inbox, acts);
        if buried {
            // Tell the others at once that the leader buried them, so
            // none replays it should the leader die before its next beat.
            self.beat(false);
        }
    }
}

impl Shared {
    /// Whether node `n` is gone from the cluster (a live session is never
    /// restored: one it holds may be restored elsewhere only then): it left
    /// or was declared gone, or it is unknown to this settled node. A node known alive is asked
    /// directly ([`reach::PROBE_TIMEOUT`]): one that answers is alive; one
    /// that does not (killed, but not yet declared gone) is waited for, at
    /// most `wait`, until its missed heartbeats bury it.
    pub async fn node_gone(self: &Arc<Self>, n: NodeId, wait: Duration) -> bool {
        if n == self.me() || !self.is_up() {
            return false;
        }
        let settled = *self.settled.lock();
        if Instant::now() < settled {
            tokio::time::sleep_until(settled.into()).await;
        }
        let known = |sh: &Shared| {
            let s = sh.state.lock();
            s.peers.contains_key(&n) && !s.gone.contains_key(&n)
        };
        if !known(self) {
            return true;
        }
        if self.answers(n).await {
            return false;
        }
        let deadline = Instant::now() + wait;
        loop {
            if !known(self) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether node `n` answers a probe sent to it alone in time.
    async fn answers(self: &Arc<Self>, n: NodeId) -> bool {
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(
            id,
            Pending {
                waiting: HashSet::from([n]),
                answers: Vec::new(),
                done: Some(tx),
            },
        );
        let msg = Msg::Request {
            n: self.me(),
            id,
            a: String::new(),
            q: Query::Probe,
        };
        if self.send_msg(subject::node(&self.prefix, n), &msg) {
            let _ = tokio::time::timeout(super::reach::PROBE_TIMEOUT, rx).await;
        }
        self.pending
            .lock()
            .remove(&id)
            .is_some_and(|p| !p.answers.is_empty())
    }
}

/// The other nodes' connections per app, summed.
pub(super) fn connection_sums(s: &State) -> Vec<Act> {
    let mut sums: HashMap<&str, u32> = HashMap::new();
    for p in s.peers.values() {
        for (app, c) in &p.load {
            *sums.entry(app.as_str()).or_default() += c;
        }
    }
    sums.into_iter()
        .map(|(a, c)| Act::Connections(a.to_owned(), c))
        .collect()
}

impl Cluster for Engine {
    fn name(&self) -> &'static str {
        self.shared.name
    }

    fn attach(&self, node: NodeId, inbox: Arc<dyn Inbox>) {
        if self.shared.me.set(node).is_err() {
            tracing::error!(
                "a {} engine serves one node; ignoring another",
                self.shared.name
            );
            return;
        }
        let _ = self.shared.inbox.set(inbox);
        if let Some((start, rx)) = self.start.lock().take() {
            start(self.shared.clone(), rx);
            tokio::spawn(super::canary::run(self.shared.clone()));
        }
    }

    fn detach(&self, node: NodeId) {
        if node != self.shared.me() || self.shared.left.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared
            .send_msg(self.shared.all(), &Msg::Bye { n: node });
    }

    fn heartbeat(&self, node: NodeId) {
        if node != self.shared.me() {
            return;
        }
        if self.shared.is_up() {
            self.shared.beat(false);
            self.shared.judge();
            self.shared.recover_tick();
        }
    }

    fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    fn gone(&self, node: NodeId, wait: Duration) -> BoxFuture<bool> {
        let sh = self.shared.clone();
        Box::pin(async move { sh.node_gone(node, wait).await })
    }

    fn connected(&self) -> bool {
        self.shared.is_settled() && self.shared.canary.ok()
    }

    fn flush(&self) -> BoxFuture<()> {
        let sh = self.shared.clone();
        Box::pin(async move {
            if !sh.is_up() {
                return;
            }
            let (tx, rx) = oneshot::channel();
            if sh.out.send(Out::Flush(tx)).await.is_ok() {
                let _ = rx.await;
            }
        })
    }
}
