//! Cluster-wide occupancy and membership, decided once for the cluster
//! (what webhooks such as `channel_occupied` or `member_removed` report).
//!
//! The tally: for each node, the channels it has subscribers to and the
//! presence members it has a socket of ("keys"). A node tells every other
//! node when one of its keys appears or goes (`Msg::Held` on `all`), and
//! sends its whole set with its presence state (after connecting, and when
//! a node asks). A key is held in the cluster while some node holds it; it
//! *flips* when the first node takes it or the last one lets it go (or is
//! declared gone).
//!
//! Only the **leader** reports flips: the oldest node alive (earliest
//! start, then lowest id; a node that was cut off for longer than the TTL
//! counts as started again). All nodes agree on it once they have heard
//! each other, and it changes only when the leader leaves or dies, never
//! when a node joins. One reporter also means a channel that empties on one
//! node and fills again on another is seen in order by one webhook queue,
//! whose leave delay can cancel the pair.
//!
//! Only the leader and its **successor** (the next oldest, which would lead
//! next) keep the other nodes' keys: the *keepers*. Every other node keeps
//! its own keys only (to re-send its set), so its memory follows what it
//! serves, not the cluster's size. A node that becomes a keeper without the
//! others' keys (the successor after the leader went, or both keepers gone
//! at once) asks every node for its whole set and decides no flip until all
//! have answered: it never reports from a partial tally (see
//! `Tally::rebuilding`).
//!
//! The successor keeps a **journal**: for each key that flipped since the
//! leader last spoke, whether it was held before. The journal is cleared
//! whenever a message from the leader arrives. When the node becomes the
//! leader because the old one died (or because it finds itself alone, or
//! back after an outage), it reports the net change of each journaled key:
//! what the old leader may not have lived to report.

use herald_core::namespace::ChannelId;
use herald_core::publication::NodeId;
use std::collections::{HashMap, HashSet};

/// App, channel, and the user for a member (`None`: the channel itself).
pub type Key = (String, ChannelId, Option<String>);

/// Most keys the journal holds; changes beyond it are not replayed (only
/// reached while no leader speaks for a long time, e.g. a broker outage).
pub const JOURNAL_MAX: usize = 64 * 1024;

/// A key flipped in the whole cluster: now held (`on`) or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flip {
    pub key: Key,
    pub on: bool,
}

#[derive(Default)]
pub struct Tally {
    /// Node → the keys it holds (a keeper: every node; else only its own).
    nodes: HashMap<NodeId, HashSet<Key>>,
    /// Keys in `nodes`, over all nodes.
    total: usize,
    /// Key → how many nodes hold it.
    held: HashMap<Key, u32>,
    /// Key → whether it was held before its first flip since the leader
    /// last spoke (only while this node does not lead), and the node whose
    /// burial flipped it, if that was the cause.
    journal: HashMap<Key, (bool, Option<NodeId>)>,
    /// Whether this node led at the last check.
    pub leading: bool,
    /// Whether this node keeps the other nodes' keys (it leads or would
    /// lead next).
    pub keeper: bool,
    /// Nodes whose whole set this keeper still waits for since it became
    /// one; no flip is decided (reported or journaled) while any is missing.
    pub rebuilding: HashSet<NodeId>,
}

impl Tally {
    pub fn is_held(&self, key: &Key) -> bool {
        self.held.get(key).is_some_and(|n| *n > 0)
    }

    /// Whether flips are decided now: a keeper with every node's set.
    pub fn whole(&self) -> bool {
        self.keeper && self.rebuilding.is_empty()
    }

    /// Keys held for nodes other than `me` (0 on a node that does not keep).
    pub fn others(&self, me: NodeId) -> usize {
        self.total - self.nodes.get(&me).map_or(0, HashSet::len)
    }

    /// Keep only `me`'s keys (this node no longer keeps the others'), and
    /// give their memory back; the journal goes too (it is the keepers').
    pub fn forget_others(&mut self, me: NodeId) {
        let mine = self.nodes.remove(&me).unwrap_or_default();
        self.nodes = HashMap::new();
        self.held = mine.iter().map(|k| (k.clone(), 1)).collect();
        self.total = mine.len();
        if !mine.is_empty() {
            self.nodes.insert(me, mine);
        }
        self.journal = HashMap::new();
        self.rebuilding.clear();
        self.keeper = false;
    }

    /// The keys node `n` holds.
    pub fn of(&self, n: NodeId) -> Vec<Key> {
        self.nodes
            .get(&n)
            .map(|k| k.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Node `n` now holds (`on`) or no longer holds `key`. Returns whether
    /// that changed the node's set, and the cluster's flip if any.
    pub fn set(&mut self, n: NodeId, key: Key, on: bool) -> (bool, Option<Flip>) {
        if on {
            if !self.nodes.entry(n).or_default().insert(key.clone()) {
                return (false, None);
            }
            self.total += 1;
            let c = self.held.entry(key.clone()).or_default();
            *c += 1;
            (true, (*c == 1).then_some(Flip { key, on: true }))
        } else {
            let Some(keys) = self.nodes.get_mut(&n) else {
                return (false, None);
            };
            if !keys.remove(&key) {
                return (false, None);
            }
            self.total -= 1;
            if keys.is_empty() {
                self.nodes.remove(&n);
            }
            (true, self.release(key))
        }
    }

    fn release(&mut self, key: Key) -> Option<Flip> {
        let c = self.held.get_mut(&key)?;
        *c -= 1;
        if *c > 0 {
            return None;
        }
        self.held.remove(&key);
        Some(Flip { key, on: false })
    }

    /// Node `n`'s whole set is `new` now (its state after a reconnect; an
    /// empty set when it is gone). Returns the flips.
    pub fn replace(&mut self, n: NodeId, new: HashSet<Key>) -> Vec<Flip> {
        let old = self.nodes.remove(&n).unwrap_or_default();
        self.total = self.total - old.len() + new.len();
        let mut flips = Vec::new();
        for key in old.difference(&new) {
            flips.extend(self.release(key.clone()));
        }
        for key in new.difference(&old) {
            let c = self.held.entry(key.clone()).or_default();
            *c += 1;
            if *c == 1 {
                flips.push(Flip {
                    key: key.clone(),
                    on: true,
                });
            }
        }
        if !new.is_empty() {
            self.nodes.insert(n, new);
        }
        flips
    }

    /// Flips nobody reported (this node does not lead): remember what each
    /// key was before, and whether burying node `buried` caused them.
    pub fn journal(&mut self, flips: &[Flip], buried: Option<NodeId>) {
        for f in flips {
            if self.journal.len() >= JOURNAL_MAX && !self.journal.contains_key(&f.key) {
                continue;
            }
            let e = self.journal.entry(f.key.clone()).or_insert((!f.on, None));
            e.1 = buried;
        }
    }

    /// The leader spoke: the changes it heard of as we did were its to
    /// report. (Those of a burial stay until it says it buried the node
    /// too: each node judges heartbeats on its own clock.)
    pub fn clear_journal(&mut self) {
        if !self.journal.is_empty() {
            self.journal.retain(|_, (_, buried)| buried.is_some());
        }
    }

    /// The leader says it buried these nodes (and reported what they held).
    pub fn clear_buried(&mut self, gone: &HashSet<NodeId>) {
        if !self.journal.is_empty() {
            self.journal
                .retain(|_, (_, buried)| !buried.is_some_and(|n| gone.contains(&n)));
        }
    }

    #[cfg(test)]
    fn clone_journal_len(&self) -> usize {
        self.journal.len()
    }

    /// This node leads now: the net change of every journaled key.
    pub fn replay(&mut self) -> Vec<Flip> {
        let journal = std::mem::take(&mut self.journal);
        journal
            .into_iter()
            .filter_map(|(key, (before, _))| {
                let now = self.is_held(&key);
                (now != before).then_some(Flip { key, on: now })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(c: &str) -> Key {
        let ns = herald_core::namespace::Namespace::new("n");
        ("a".into(), ChannelId(ns, c.into()), None)
    }

    #[test]
    fn first_and_last_holder_flip() {
        let mut t = Tally::default();
        assert_eq!(
            t.set(1, k("c"), true).1,
            Some(Flip {
                key: k("c"),
                on: true
            })
        );
        assert_eq!(t.set(2, k("c"), true), (true, None));
        assert_eq!(t.set(2, k("c"), true), (false, None), "already held");
        assert_eq!(t.set(1, k("c"), false).1, None);
        assert_eq!(t.set(3, k("c"), false), (false, None), "never held");
        assert_eq!(
            t.set(2, k("c"), false).1,
            Some(Flip {
                key: k("c"),
                on: false
            })
        );
    }

    #[test]
    fn replacing_a_node_flips_what_only_it_held() {
        let mut t = Tally::default();
        t.set(1, k("shared"), true);
        t.set(2, k("shared"), true);
        t.set(2, k("mine"), true);
        let mut f = t.replace(2, HashSet::new());
        assert_eq!(
            f,
            [Flip {
                key: k("mine"),
                on: false
            }]
        );
        f = t.replace(2, [k("new"), k("shared")].into_iter().collect());
        assert_eq!(
            f,
            [Flip {
                key: k("new"),
                on: true
            }]
        );
        assert!(t.is_held(&k("shared")) && !t.is_held(&k("mine")));
        assert_eq!(t.of(2).len(), 2);
    }

    #[test]
    fn the_journal_replays_net_changes_only() {
        let mut t = Tally::default();
        let on = t.set(1, k("flapped"), true).1.unwrap();
        let off = t.set(1, k("flapped"), false).1.unwrap();
        let stays = t.set(1, k("stays"), true).1.unwrap();
        t.journal(&[on, off, stays], None);
        assert_eq!(
            t.replay(),
            [Flip {
                key: k("stays"),
                on: true
            }]
        );
        assert!(t.replay().is_empty(), "replayed once");
        let f = t.set(2, k("x"), true).1.unwrap();
        t.journal(&[f], None);
        t.clear_journal();
        assert!(t.replay().is_empty());
    }

    #[test]
    fn a_node_that_stops_keeping_holds_only_its_own() {
        let mut t = Tally {
            keeper: true,
            ..Tally::default()
        };
        t.set(1, k("mine"), true);
        t.set(1, k("shared"), true);
        t.set(2, k("shared"), true);
        t.set(2, k("theirs"), true);
        t.replace(3, [k("third")].into_iter().collect());
        assert_eq!(t.others(1), 3);
        assert_eq!(t.others(2), 3);
        let f = t.set(2, k("x"), true).1.unwrap();
        t.journal(&[f], None);
        t.forget_others(1);
        assert!(!t.keeper && !t.whole());
        assert_eq!(t.others(1), 0);
        assert_eq!(t.of(1).len(), 2);
        assert!(t.is_held(&k("shared")) && !t.is_held(&k("theirs")));
        assert!(t.replay().is_empty(), "the journal was the keepers'");
        // Its own keys still come and go as before.
        assert_eq!(t.set(1, k("shared"), false).1.map(|f| f.on), Some(false));
        assert_eq!(t.of(1), [k("mine")]);
    }

    #[test]
    fn a_burial_stays_journaled_until_the_leader_did_it_too() {
        let mut t = Tally::default();
        t.set(7, k("dead"), true);
        let flips = t.replace(7, HashSet::new());
        t.journal(&flips, Some(7));
        t.clear_journal();
        assert_eq!(
            t.clone_journal_len(),
            1,
            "the leader may not have judged yet"
        );
        t.clear_buried(&[8].into_iter().collect());
        assert_eq!(t.clone_journal_len(), 1);
        t.clear_buried(&[7].into_iter().collect());
        assert!(t.replay().is_empty());
    }
}
