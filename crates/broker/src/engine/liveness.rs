//! Liveness: the transport coming and going, heartbeats (with each node's
//! connections per app), the leader (the oldest node) that reports
//! cluster-wide flips for nodes that are gone, burying nodes silent for a
//! whole TTL, and the full state a node sends after a reconnect.

#[allow(unused_imports)]
use super::*;

impl Shared {
    /// The connection is up (subscriptions in place) or down.
    pub fn set_up(self: &Arc<Self>, up: bool, why: &str) {
        let was = self.up.swap(up, Ordering::AcqRel);
        if was == up {
            return;
        }
        if up {
            tracing::info!(engine = self.name, "broker connected; announcing this node");
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

    /// The node that reports cluster-wide flips as this node sees it: the
    /// oldest alive (earliest start, then lowest id).
    pub(super) fn leader(&self, s: &State) -> NodeId {
        let mut best = (self.born(), self.me());
        for (n, p) in &s.peers {
            best = best.min((p.born, *n));
        }
        best.1
    }

    /// Whether this node leads now; on becoming the leader, report what
    /// the journal says the old one may not have.
    pub(super) fn lead_check(&self, s: &mut State, acts: &mut Vec<Act>) {
        let leads = self.is_settled() && self.leader(s) == self.me();
        if leads && !s.tally.leading {
            acts.extend(s.tally.replay().into_iter().map(Act::Observed));
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
        if flips.is_empty() {
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
            match flip {
                Some(_) if s.tally.leading => true,
                Some(f) => {
                    s.tally.journal(std::slice::from_ref(&f), None);
                    acts.push(Act::Seen(f));
                    false
                }
                None => false,
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
        s.incoming.remove(&n);
        s.incoming_held.remove(&n);
        s.gone.insert(n, Instant::now());
        // Whoever leads now (perhaps this node, in place of `n`) reports
        // what `n` held alone.
        self.lead_check(s, acts);
        let flips = s.tally.replace(n, HashSet::new());
        Self::flipped(s, flips, acts, Some(n));
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
        }
    }

    fn ttl(&self) -> Duration {
        self.shared.ttl
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
