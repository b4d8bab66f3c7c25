//! Confirmations that wait for the broker: which channels have a
//! subscriber waiting for the broker to hold their interest.
//!
//! A subscription is confirmed only once the broker holds its interest
//! ([`crate::broker::PubSub::held`]). While one waits, the channel has no
//! subscriber in the hub yet, so a subscriber leaving the channel, or
//! another waiter giving up, would see it empty and drop the interest the
//! waiter is about to be confirmed on. Waiters are counted here per
//! channel, and interest is dropped only for a channel nobody waits on.
//!
//! Only the slow path touches the map: a subscribe whose interest is held
//! already never waits, and a check for waiters is one atomic load while
//! nobody waits anywhere.

use crate::namespace::Namespace;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A channel (or pattern) of an app's namespace.
type Key = (String, Namespace, String, bool);

#[derive(Default)]
pub struct Waiting {
    /// Waiters in the whole map (checked before taking the lock).
    total: AtomicUsize,
    by_channel: Mutex<HashMap<Key, usize>>,
}

impl Waiting {
    /// Count a waiter on the channel until the guard is dropped.
    pub fn enter(&self, app: &str, ns: Namespace, channel: &str, pattern: bool) -> Waiter<'_> {
        let key = (app.to_owned(), ns, channel.to_owned(), pattern);
        *self.by_channel.lock().entry(key.clone()).or_default() += 1;
        self.total.fetch_add(1, Ordering::AcqRel);
        Waiter { of: self, key }
    }

    /// Whether a subscriber waits for the channel's interest.
    pub fn any(&self, app: &str, ns: Namespace, channel: &str, pattern: bool) -> bool {
        if self.total.load(Ordering::Acquire) == 0 {
            return false;
        }
        let key = (app.to_owned(), ns, channel.to_owned(), pattern);
        self.by_channel.lock().contains_key(&key)
    }
}

/// One waiting subscriber (see [`Waiting::enter`]).
pub struct Waiter<'a> {
    of: &'a Waiting,
    key: Key,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut map = self.of.by_channel.lock();
        if let Some(n) = map.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.key);
            }
        }
        self.of.total.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_is_waited_on_while_a_guard_lives() {
        let w = Waiting::default();
        let ns = Namespace::new("t");
        assert!(!w.any("app", ns, "news", false));
        let a = w.enter("app", ns, "news", false);
        let b = w.enter("app", ns, "news", false);
        assert!(w.any("app", ns, "news", false));
        assert!(!w.any("app", ns, "news", true));
        assert!(!w.any("other", ns, "news", false));
        drop(a);
        assert!(w.any("app", ns, "news", false));
        drop(b);
        assert!(!w.any("app", ns, "news", false));
        assert_eq!(w.total.load(Ordering::Acquire), 0);
    }
}
