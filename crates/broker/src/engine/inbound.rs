//! Inbound dispatch: a message from the transport, read, checked against
//! what this node knows of its sender (buried nodes, the leader's journal),
//! and handed to the handler of its kind. Inbox calls wait until the state
//! lock is released.

#[allow(unused_imports)]
use super::*;

/// The engine's state, locked.
type Guard<'a> = parking_lot::MutexGuard<'a, State>;

impl Shared {
    /// A message arrived on subscription `via` (a subject or a pattern).
    pub fn on_message(&self, via: &str, payload: &[u8]) {
        if self.on_canary(via, payload) {
            return;
        }
        let Ok(msg) = serde_json::from_slice::<Msg>(payload) else {
            tracing::debug!(via, "unreadable broker message ignored");
            return;
        };
        let from = msg.from();
        if from == self.me() || from == 0 {
            return;
        }
        let Some(inbox) = self.inbox.get().cloned() else {
            return;
        };
        let mut acts = Vec::new();
        let mut s = self.state.lock();
        if !self.heard_from(&mut s, from, &msg) {
            return;
        }
        self.track(&mut s, from, &msg);
        match msg {
            Msg::Pub { a, p, s: seq, .. } => {
                if p.to_user.is_none() && !self.canonical(&s, via, &a, p.ns, &p.channel) {
                    return;
                }
                // After the canonical check: the copy through the other
                // subscription (dropped above) must not count as the first.
                let out = self.live_pub(&mut s, from, seq, a, p);
                drop(s);
                match out {
                    recover::Deliver::Nothing => {}
                    recover::Deliver::One(a, p) => inbox.publication(&a, p),
                    recover::Deliver::Many(list) => {
                        for (a, p, _) in list {
                            inbox.publication(&a, p);
                        }
                    }
                }
                return;
            }
            Msg::Member {
                n,
                a,
                s: scope,
                u,
                j,
                i,
            } => self.on_member(&mut s, (n, a, scope), u, j.then_some(i), &mut acts),
            Msg::Beat { n, l, h, r, .. } => return self.on_beat(s, n, l, (h, r), &inbox),
            Msg::Bye { n } => {
                tracing::info!(node = n, "node left the cluster");
                self.bury(&mut s, n, &mut acts);
            }
            Msg::Control { a, c, .. } => {
                drop(s);
                inbox.control(&a, &c);
                return;
            }
            Msg::Request { n, id, a, q } => return self.on_request(s, (n, id), a, q, &inbox),
            Msg::Reply { n, id, r } => {
                drop(s);
                self.answered(n, id, r);
                return;
            }
            Msg::Recover { n, f } => {
                drop(s);
                self.on_recover(n, f);
                return;
            }
            Msg::Replay { n, o, d, e } => return self.on_replay(s, n, o, d, e, &inbox),
            Msg::Count { n, a, ns, ch, c } => {
                if !s.wanted.contains_key(&self.channel_subject(&a, ns, &ch)) {
                    return;
                }
                drop(s);
                inbox.count(&a, ns, &ch, n, c);
                return;
            }
            state => self.on_state(&mut s, state, &mut acts),
        }
        drop(s);
        run(&inbox, acts);
    }

    /// Bookkeeping of the sender of every message: stragglers of a buried
    /// node are dropped (false), a node back from the dead is asked for its
    /// state, peers are seen, the leader's journal and burials applied.
    fn heard_from(&self, s: &mut State, from: NodeId, msg: &Msg) -> bool {
        let is_beat = matches!(msg, Msg::Beat { .. });
        if s.gone.contains_key(&from) && !is_beat {
            // A node we buried: ignore stragglers until it beats again.
            return false;
        }
        if !matches!(msg, Msg::Bye { .. }) {
            let now = Instant::now();
            if s.gone.remove(&from).is_some() {
                // Back from the dead (it was stalled): ask for its state.
                tracing::info!(node = from, "node is back; asking for its state");
                let ask = Msg::Beat {
                    n: self.me(),
                    l: Vec::new(),
                    h: true,
                    r: true,
                    t: self.born(),
                    g: Vec::new(),
                    s: self.journal.last(),
                };
                self.send_msg(subject::node(&self.prefix, from), &ask);
            }
            match s.peers.entry(from) {
                std::collections::hash_map::Entry::Occupied(mut p) => p.get_mut().seen = now,
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(Peer {
                        seen: now,
                        load: Vec::new(),
                        born: 0,
                    });
                    s.count_nodes();
                }
            }
        }
        if let Msg::Beat { t, .. } = msg {
            if let Some(p) = s.peers.get_mut(&from) {
                if *t != 0 {
                    p.born = *t;
                }
            }
        }
        if !s.tally.leading && self.leader(s) == from {
            s.tally.clear_journal();
            if let Msg::Beat { g, .. } = msg {
                let gone: HashSet<NodeId> = g.iter().copied().collect();
                s.tally.clear_buried(&gone);
                s.leader_buried = gone;
            }
        }
        true
    }

    /// A member joined (`joined` holds its info) or left on node `n`.
    fn on_member(
        &self,
        s: &mut State,
        (n, a, scope): (NodeId, String, Scope),
        u: String,
        joined: Option<Info>,
        acts: &mut Vec<Act>,
    ) {
        if !wants_scope(s, self, &a, &scope) {
            return;
        }
        let key = (a.clone(), scope.clone());
        let m = s.remote.entry(n).or_default().entry(key).or_default();
        match &joined {
            Some(i) => m.insert(u.clone(), i.clone()),
            None => m.remove(&u),
        };
        acts.push(Act::Presence(
            a,
            PresenceChange {
                scope,
                node: n,
                user_id: u,
                joined,
            },
        ));
    }

    /// Node `n`'s heartbeat (`hello`: it is new, answer at once;
    /// `resend`: it wants our whole state).
    fn on_beat(
        &self,
        mut s: Guard<'_>,
        n: NodeId,
        load: Vec<(String, u32)>,
        (hello, resend): (bool, bool),
        inbox: &Arc<dyn Inbox>,
    ) {
        if let Some(p) = s.peers.get_mut(&n) {
            if !load.is_empty() || !hello {
                p.load = load;
            }
        }
        let acts = connection_sums(&s);
        drop(s);
        if hello {
            // Let the newcomer know us at once.
            let reply = Msg::Beat {
                n: self.me(),
                l: inbox.connections(),
                h: false,
                r: false,
                t: self.born(),
                g: Vec::new(),
                s: self.journal.last(),
            };
            self.send_msg(subject::node(&self.prefix, n), &reply);
        }
        if resend {
            self.send_state();
        }
        run(inbox, acts);
    }

    /// Answer node `n`'s request `id` with this node's own figures.
    fn on_request(
        &self,
        s: Guard<'_>,
        (n, id): (NodeId, u64),
        a: String,
        q: Query,
        inbox: &Arc<dyn Inbox>,
    ) {
        let own = match &q {
            Query::Members(scope) => s
                .own
                .get(&(a.clone(), scope.clone()))
                .map(|m| m.iter().map(|(u, i)| (u.clone(), i.clone())).collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        drop(s);
        let r = match q {
            Query::Stats(ns, filter) => Answer::Stats(inbox.stats(&a, ns, &filter)),
            Query::Members(_) => Answer::Members(own),
            Query::Cached(ChannelId(ns, channel)) => Answer::Cached(
                inbox
                    .cached(&a, ns, &channel)
                    .map(|(p, age)| (now_ms().saturating_sub(age.as_millis() as u64), p)),
            ),
            Query::Probe => Answer::Probe,
        };
        let reply = Msg::Reply {
            n: self.me(),
            id,
            r,
        };
        self.send_msg(subject::node(&self.prefix, n), &reply);
    }

    /// A node's full state after its reconnect (begin, parts, held tally
    /// keys, end) and single tally changes (`Held`).
    fn on_state(&self, s: &mut State, msg: Msg, acts: &mut Vec<Act>) {
        match msg {
            Msg::StateBegin { n } => {
                s.incoming.insert(n, HashMap::new());
                // Only keepers hold the other nodes' keys.
                if s.tally.keeper {
                    s.incoming_held.insert(n, HashSet::new());
                }
            }
            Msg::StateHeld { n, k } => {
                if let Some(inc) = s.incoming_held.get_mut(&n) {
                    inc.extend(k);
                }
            }
            Msg::Held { n, a, ch, u, j } => {
                self.lead_check(s, acts);
                if !s.tally.keeper {
                    return;
                }
                let (_, flip) = s.tally.set(n, (a, ch, u), j);
                Self::flipped(s, flip.into_iter().collect(), acts, None);
                self.tally_gauge(s);
            }
            Msg::StatePart { n, e } => {
                let mut keep = Vec::new();
                for (a, scope, u, i) in e {
                    if wants_scope(s, self, &a, &scope) {
                        keep.push((a, scope, u, i));
                    }
                }
                if let Some(inc) = s.incoming.get_mut(&n) {
                    for (a, scope, u, i) in keep {
                        inc.entry((a, scope)).or_default().insert(u, i);
                    }
                }
            }
            Msg::StateEnd { n } => {
                if let Some(inc) = s.incoming.remove(&n) {
                    reconcile(s, n, inc, acts);
                }
                if let Some(held) = s.incoming_held.remove(&n) {
                    self.take_set(s, n, held, acts);
                } else {
                    // Perhaps it made this node a keeper (its age known).
                    self.lead_check(s, acts);
                }
            }
            // Every other kind has its own handler in `on_message`.
            _ => {}
        }
    }

    /// Whether a publication that came through `via` is the one this node
    /// delivers: through its exact subscription if it has one, else through
    /// the shortest matching pattern (a node with several matching
    /// subscriptions receives one copy through each).
    pub(super) fn canonical(
        &self,
        s: &State,
        via: &str,
        app: &str,
        ns: Namespace,
        channel: &str,
    ) -> bool {
        let exact = self.channel_subject(app, ns, channel);
        if s.wanted.contains_key(&exact) {
            return via == exact;
        }
        for prefix in prefixes(channel) {
            let p = subject::pattern(&self.prefix, app, ns, prefix, self.wildcard);
            if s.wanted.contains_key(&p) {
                return via == p;
            }
        }
        false
    }
}
