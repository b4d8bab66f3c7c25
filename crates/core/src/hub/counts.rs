//! Subscription counts: a channel's count across the cluster, pushed to its
//! subscribers in batches (sending on every change would make N clients
//! joining one channel cost N² frames) and exchanged with the other nodes.

use super::space::Space;
use super::FlushedCounts;
use crate::publication::{EncodeOnce, Event, NodeId};

impl Space {
    /// Note that `channel`'s count changed; [`Space::flush_counts`] sends it.
    pub(super) fn count_changed(&self, channel: &str) {
        if !self.counts_changed.contains(channel) {
            self.counts_changed.insert(channel.to_owned());
        }
        if !self.counts_announce.contains(channel) {
            self.counts_announce.insert(channel.to_owned());
        }
    }

    /// See [`super::Hub::flush_subscription_counts`].
    pub(super) fn flush_counts(&self, me: NodeId) -> FlushedCounts {
        let changed: Vec<String> = self.counts_changed.iter().map(|c| c.clone()).collect();
        let announce: Vec<String> = self.counts_announce.iter().map(|c| c.clone()).collect();
        // Unmark before reading the count: a change after this point marks
        // the channel again and goes out with the next flush.
        for channel in &changed {
            self.counts_changed.remove(channel);
        }
        for channel in &announce {
            self.counts_announce.remove(channel);
        }
        let mut sent = Vec::new();
        let mut report = Vec::new();
        for channel in changed {
            if let Some(ch) = self.channels.get(&channel) {
                if ch.subs.is_empty() || !ch.count {
                    continue;
                }
                let count = ch.subs.len() + ch.remote_counts.values().sum::<usize>();
                let mut event = EncodeOnce::new(Event::SubscriptionCount {
                    channel: &channel,
                    count,
                });
                ch.send_to_all(None, &mut event);
                let lowest = ch.remote_counts.keys().all(|n| me < *n);
                drop(ch);
                if lowest {
                    report.push((channel.clone(), count));
                }
                sent.push((channel, count));
            }
        }
        let announce = announce
            .into_iter()
            .map(|c| {
                let n = self.channels.get(&c).map_or(0, |ch| ch.subs.len());
                (c, n)
            })
            .collect();
        FlushedCounts {
            ns: self.ns,
            sent,
            report,
            announce,
        }
    }

    /// See [`super::Hub::remote_count`].
    pub(super) fn remote_count(&self, channel: &str, node: NodeId, count: usize) {
        let Some(mut ch) = self.channels.get_mut(channel) else {
            return;
        };
        if !ch.count || ch.subs.is_empty() {
            return;
        }
        let new = if count == 0 {
            ch.remote_counts.remove(&node);
            false
        } else {
            ch.remote_counts.insert(node, count).is_none()
        };
        drop(ch);
        if !self.counts_changed.contains(channel) {
            self.counts_changed.insert(channel.to_owned());
        }
        if new && !self.counts_announce.contains(channel) {
            self.counts_announce.insert(channel.to_owned());
        }
    }

    /// Forget the subscription counts node `node` reported.
    pub(super) fn forget_node(&self, node: NodeId) {
        let mut changed = Vec::new();
        for mut e in self.channels.iter_mut() {
            if e.remote_counts.remove(&node).is_some() {
                changed.push(e.key().clone());
            }
        }
        for c in changed {
            self.counts_changed.insert(c);
        }
    }
}
