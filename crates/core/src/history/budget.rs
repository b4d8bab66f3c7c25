//! The node-wide account of history answers waiting past connections'
//! outbound bounds ([`crate::connection::Connection::send_burst`]).
//!
//! Each connection's answers are bounded (`history_max_bytes`), but not
//! their sum: clients that stop reading and ask every stream's history
//! could pin that bound once per connection, tens of megabytes each, far
//! past what the machine has. Every burst frame counts here while it
//! waits (charged when queued, released when the writer takes it or the
//! connection goes); an adapter reserves an answer's size before queuing
//! it and refuses the request when the node's answers would pass the
//! bound. One account per process: the bound is the node's.

use crate::metrics::HISTORY_ANSWER_BYTES as ANSWER_BYTES;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The account (see the module's doc).
pub struct AnswerBudget {
    most: AtomicUsize,
    used: AtomicUsize,
}

/// The node's account.
pub static ANSWERS: AnswerBudget = AnswerBudget::new(usize::MAX);

impl AnswerBudget {
    pub const fn new(most: usize) -> AnswerBudget {
        AnswerBudget {
            most: AtomicUsize::new(most),
            used: AtomicUsize::new(0),
        }
    }

    /// Bound the account at `most` bytes; with several callers (apps of
    /// one node), the smallest bound holds.
    pub fn bound(&self, most: usize) {
        self.most.fetch_min(most, Ordering::Relaxed);
    }

    /// The bound.
    pub fn most(&self) -> usize {
        self.most.load(Ordering::Relaxed)
    }

    /// Bytes counted now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Count `n` bytes if they fit under the bound; whether they did. An
    /// answer reserves its size before its frames are queued (which count
    /// again, [`AnswerBudget::charge`]), and releases the reservation
    /// after: two concurrent answers can never both pass on the same room.
    pub fn try_reserve(&self, n: usize) -> bool {
        let most = self.most();
        let ok = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|&t| t <= most)
            })
            .is_ok();
        if ok {
            self.publish();
        }
        ok
    }

    /// Count `n` bytes queued (already reserved, or held publications).
    pub fn charge(&self, n: usize) {
        self.used.fetch_add(n, Ordering::AcqRel);
        self.publish();
    }

    /// `n` bytes counted before no longer wait.
    pub fn release(&self, n: usize) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(n))
            });
        self.publish();
    }

    fn publish(&self) {
        if std::ptr::eq(self, &ANSWERS) {
            ANSWER_BYTES.set(self.used() as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_fit_under_the_bound_and_come_back() {
        let b = AnswerBudget::new(usize::MAX);
        b.bound(100);
        b.bound(1000);
        assert_eq!(b.most(), 100, "the smallest bound holds");
        assert!(b.try_reserve(60));
        assert!(!b.try_reserve(41), "60 + 41 > 100");
        b.charge(30);
        b.release(60);
        assert_eq!(b.used(), 30);
        assert!(b.try_reserve(70));
        b.release(1000);
        assert_eq!(b.used(), 0, "never below zero");
    }
}
