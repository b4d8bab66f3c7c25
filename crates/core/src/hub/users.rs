//! Signed-in users: their sockets on this node, the other nodes where they
//! are signed in (as the broker reports them), and the connections watching
//! whether they are online. A user is online while it has a socket anywhere
//! in the cluster; watchers hear when that changes, once.

use crate::connection::{Connection, Reason};
use crate::fanout::Target;
use crate::publication::{EncodeOnce, Event, NodeId};
use dashmap::DashMap;
use std::sync::Arc;

#[derive(Default)]
struct User {
    sockets: Vec<Arc<Connection>>,
    remote: Vec<NodeId>,
}

impl User {
    fn online(&self) -> bool {
        !self.sockets.is_empty() || !self.remote.is_empty()
    }
}

#[derive(Default)]
pub struct Users {
    users: DashMap<String, User>,
    /// Watched user id → the connections watching it.
    watchers: DashMap<String, Vec<Arc<Connection>>>,
}

impl Users {
    /// Register a signed-in socket and its watchlist. Returns which watched
    /// users are online and offline now, and whether this is the user's
    /// first socket on this node (the cluster must hear of it).
    pub fn sign_in(
        &self,
        conn: &Arc<Connection>,
        user_id: &str,
        watchlist: &[String],
    ) -> (Vec<String>, Vec<String>, bool) {
        let (first_here, came_online) = {
            let mut user = self.users.entry(user_id.to_owned()).or_default();
            let was = user.online();
            user.sockets.push(conn.clone());
            (user.sockets.len() == 1, !was)
        };
        if came_online {
            self.notify(user_id, true);
        }
        for watched in watchlist {
            self.watchers
                .entry(watched.clone())
                .or_default()
                .push(conn.clone());
        }
        let (online, offline) = watchlist.iter().cloned().partition(|w| self.is_online(w));
        (online, offline, first_here)
    }

    /// Undo [`Users::sign_in`]. Returns whether it was the user's last
    /// socket on this node.
    pub fn sign_out(&self, conn: &Connection, user_id: &str, watchlist: &[String]) -> bool {
        for watched in watchlist {
            if let Some(mut list) = self.watchers.get_mut(watched) {
                list.retain(|c| c.id != conn.id);
            }
            self.watchers.remove_if(watched, |_, l| l.is_empty());
        }
        let (last_here, went_offline) = match self.users.get_mut(user_id) {
            Some(mut user) => {
                let before = user.sockets.len();
                user.sockets.retain(|c| c.id != conn.id);
                let last = before > 0 && user.sockets.is_empty();
                (last, last && !user.online())
            }
            None => (false, false),
        };
        self.users.remove_if(user_id, |_, u| !u.online());
        if went_offline {
            self.notify(user_id, false);
        }
        last_here
    }

    /// User `user_id` signed in (`true`) or out (`false`) on node `node`.
    pub fn remote(&self, node: NodeId, user_id: &str, signed_in: bool) {
        let flipped = {
            let mut user = self.users.entry(user_id.to_owned()).or_default();
            let was = user.online();
            if signed_in {
                if !user.remote.contains(&node) {
                    user.remote.push(node);
                }
            } else {
                user.remote.retain(|n| *n != node);
            }
            was != user.online()
        };
        self.users.remove_if(user_id, |_, u| !u.online());
        if flipped {
            self.notify(user_id, signed_in);
        }
    }

    pub fn is_online(&self, user_id: &str) -> bool {
        self.users.get(user_id).is_some_and(|u| u.online())
    }

    /// Users signed in on this node (a snapshot for a node joining later).
    pub fn local_users(&self) -> Vec<String> {
        self.users
            .iter()
            .filter(|u| !u.sockets.is_empty())
            .map(|u| u.key().clone())
            .collect()
    }

    fn notify(&self, user_id: &str, online: bool) {
        let Some(watchers) = self.watchers.get(user_id) else {
            return;
        };
        let ids = [user_id.to_owned()];
        let (on, off): (&[String], &[String]) = if online { (&ids, &[]) } else { (&[], &ids) };
        let mut event = EncodeOnce::new(Event::Watchlist {
            online: on,
            offline: off,
        });
        for conn in watchers.iter() {
            if let Some(f) = event.frame(conn.wire, &None) {
                conn.send(f);
            }
        }
    }

    /// This node's sockets of a user, as fan-out targets.
    pub fn targets(&self, user_id: &str) -> Option<Arc<[Target]>> {
        self.users.get(user_id).and_then(|u| {
            (!u.sockets.is_empty()).then(|| {
                u.sockets
                    .iter()
                    .map(|c| Target {
                        conn: c.clone(),
                        tag: None,
                    })
                    .collect()
            })
        })
    }

    /// Close every socket of a user on this node; returns how many.
    pub fn terminate(&self, user_id: &str) -> usize {
        match self.users.get(user_id) {
            Some(user) => {
                for conn in &user.sockets {
                    conn.close(Reason::Terminated);
                }
                user.sockets.len()
            }
            None => 0,
        }
    }
}
