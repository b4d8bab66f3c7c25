//! Presence across the cluster: this node's own members (announced on the
//! channel's subject), the mirror of what the others told it, reconciling
//! that mirror with a node's full state, and the once-per-cluster
//! occupancy and member decisions (the tally).

#[allow(unused_imports)]
use super::*;

pub(super) fn wants_scope(s: &State, shared: &Shared, app: &str, scope: &Scope) -> bool {
    match scope {
        Scope::Users => true,
        Scope::Channel(ChannelId(ns, c)) => {
            s.wanted.contains_key(&shared.channel_subject(app, *ns, c))
        }
    }
}

/// Bring our mirror of node `n` in line with its full state `new`: members
/// it no longer has leave, members we did not know join.
pub(super) fn reconcile(
    s: &mut State,
    n: NodeId,
    new: HashMap<ScopeKey, Members>,
    acts: &mut Vec<Act>,
) {
    let old = s.remote.remove(&n).unwrap_or_default();
    let change = |app: &str, scope: &Scope, user: &str, joined: Option<Info>| {
        Act::Presence(
            app.to_owned(),
            PresenceChange {
                scope: scope.clone(),
                node: n,
                user_id: user.to_owned(),
                joined,
            },
        )
    };
    for ((app, scope), members) in &old {
        let now = new.get(&(app.clone(), scope.clone()));
        for user in members.keys() {
            if !now.is_some_and(|m| m.contains_key(user)) {
                acts.push(change(app, scope, user, None));
            }
        }
    }
    for ((app, scope), members) in &new {
        let before = old.get(&(app.clone(), scope.clone()));
        for (user, info) in members {
            if !before.is_some_and(|m| m.contains_key(user)) {
                acts.push(change(app, scope, user, Some(info.clone())));
            }
        }
    }
    s.remote.insert(n, new);
}

impl Presence for Engine {
    fn presence(&self, app_id: &str, change: PresenceChange) {
        let sh = &self.shared;
        let key = (app_id.to_owned(), change.scope.clone());
        {
            let mut s = sh.state.lock();
            match &change.joined {
                Some(info) => {
                    s.own
                        .entry(key)
                        .or_default()
                        .insert(change.user_id.clone(), info.clone());
                }
                None => {
                    if let Some(m) = s.own.get_mut(&key) {
                        m.remove(&change.user_id);
                        if m.is_empty() {
                            s.own.remove(&key);
                        }
                    }
                }
            }
        }
        let subject = match &change.scope {
            Scope::Users => sh.all(),
            Scope::Channel(ChannelId(ns, c)) => sh.channel_subject(app_id, *ns, c),
        };
        let (j, i) = match change.joined {
            Some(i) => (true, i),
            None => (false, None),
        };
        let msg = Msg::Member {
            n: sh.me(),
            a: app_id.to_owned(),
            s: change.scope,
            u: change.user_id,
            j,
            i,
        };
        // Lost while the broker is away: the state sent on reconnect
        // carries it.
        sh.send_msg(subject, &msg);
    }

    fn members(
        &self,
        app_id: &str,
        scope: &Scope,
        _except: NodeId,
    ) -> BoxFuture<Vec<RemoteMember>> {
        let sh = self.shared.clone();
        let app = app_id.to_owned();
        let scope = scope.clone();
        Box::pin(async move {
            let key = Some((app.clone(), scope.clone()));
            sh.ask(app, Query::Members(scope), key)
                .await
                .into_iter()
                .flat_map(|(n, a)| match a {
                    Answer::Members(list) => {
                        list.into_iter().map(|(u, i)| (n, u, i)).collect::<Vec<_>>()
                    }
                    _ => Vec::new(),
                })
                .collect()
        })
    }
}

impl Occupancy for Engine {
    fn occupancy(
        &self,
        _node: NodeId,
        app_id: &str,
        ns: Namespace,
        channel: &str,
        occupied: bool,
    ) -> BoxFuture<bool> {
        let key = (app_id.to_owned(), ChannelId(ns, channel.to_owned()), None);
        Box::pin(std::future::ready(self.shared.hold(key, occupied)))
    }

    fn member(
        &self,
        _node: NodeId,
        app_id: &str,
        ns: Namespace,
        channel: &str,
        user_id: &str,
        joined: bool,
    ) -> BoxFuture<bool> {
        let key = (
            app_id.to_owned(),
            ChannelId(ns, channel.to_owned()),
            Some(user_id.to_owned()),
        );
        Box::pin(std::future::ready(self.shared.hold(key, joined)))
    }
}
