//! The process's recent delivery rate, which decides whether write
//! coalescing is worth its delay (`write_delay_min_rate`).
//!
//! Holding a busy connection's frames for `write_delay_ms` saves system
//! calls only where many frames are being written: at a few hundred
//! frames a second the writes it saves cost the server next to nothing,
//! while every reply and message still waits the delay (about 3 ms with
//! the timer's granularity: 7× a loopback round trip). So frames are held
//! only while the fan-out delivers at least `write_delay_min_rate` frames
//! a second; below that every frame goes out at once.
//!
//! The rate is counted per fan-out job (one atomic add per publication,
//! not per frame, before its frames are sent) into ticks of [`TICK_MS`]; the rate is the larger of the
//! last whole tick and the current one so far, so a burst turns coalescing
//! on at once and it turns off a tick or two after the burst. Ticks roll
//! over without a lock: two threads rolling at once can misplace a job's
//! count by one tick, which moves the decision by as much, harmlessly.
//! One node per process (`herald serve`), so the counters are the
//! process's.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Instant;

/// Length of a tick of the rate's clock, in milliseconds.
pub const TICK_MS: u32 = 8;

/// The default of `write_delay_min_rate`, in frames a second: below it,
/// the system calls that coalescing saves are under about 5 % of one core
/// on the bench machine (~6 µs of kernel time per small write), not worth
/// milliseconds on every message.
pub const DEFAULT_MIN_RATE: u32 = 10_000;

/// A delivery rate counted in ticks of [`TICK_MS`].
pub struct Rate {
    /// The tick (by [`now_ms`]`/ TICK_MS`) that `current` counts.
    tick: AtomicU32,
    /// Frames delivered in tick `tick` so far.
    current: AtomicU32,
    /// Frames delivered in the tick before `tick` (0 if none was counted).
    last: AtomicU32,
}

impl Rate {
    pub const fn new() -> Rate {
        Rate {
            tick: AtomicU32::new(0),
            current: AtomicU32::new(0),
            last: AtomicU32::new(0),
        }
    }

    /// Count `n` frames delivered at `now_ms`.
    pub fn note_at(&self, now_ms: u32, n: u64) {
        if n == 0 {
            return;
        }
        let now = now_ms / TICK_MS;
        let tick = self.tick.load(Relaxed);
        if tick != now
            && self
                .tick
                .compare_exchange(tick, now, Relaxed, Relaxed)
                .is_ok()
        {
            let ended = self.current.swap(0, Relaxed);
            // A gap of more than one tick: the last whole tick delivered
            // nothing.
            let last = if now.wrapping_sub(tick) == 1 {
                ended
            } else {
                0
            };
            self.last.store(last, Relaxed);
        }
        self.current
            .fetch_add(n.min(u32::MAX as u64) as u32, Relaxed);
    }

    /// Frames a second delivered as of `now_ms`: the larger of the last
    /// whole tick's and the current tick's so far, scaled to a second.
    pub fn at(&self, now_ms: u32) -> u64 {
        let now = now_ms / TICK_MS;
        let frames = match now.wrapping_sub(self.tick.load(Relaxed)) {
            0 => self.last.load(Relaxed).max(self.current.load(Relaxed)),
            1 => self.current.load(Relaxed),
            _ => 0,
        };
        frames as u64 * (1000 / TICK_MS) as u64
    }
}

impl Default for Rate {
    fn default() -> Rate {
        Rate::new()
    }
}

/// The process's fan-out deliveries.
static DELIVERIES: Rate = Rate::new();

/// Count `n` frames being delivered now: the fan-out, once per job,
/// before it delivers them.
pub fn note(n: u64) {
    DELIVERIES.note_at(now_ms(), n);
}

/// Frames a second the fan-out delivered lately.
pub fn rate() -> u64 {
    DELIVERIES.at(now_ms())
}

/// Whether busy connections should coalesce their frames now, given
/// `write_delay_min_rate`: the rate is at least `min` (always where `min`
/// is 0, never where it is `u32::MAX`).
pub fn coalescing(min: u32) -> bool {
    coalescing_at(min, now_ms())
}

/// [`coalescing`] as of `now_ms` (by [`now_ms`]), for a caller that has
/// read the clock already.
pub fn coalescing_at(min: u32, now_ms: u32) -> bool {
    match min {
        0 => true,
        u32::MAX => false,
        _ => DELIVERIES.at(now_ms) >= min as u64,
    }
}

/// A coarse process clock in milliseconds, for the delivery rate's ticks
/// and the connections' busy window ([`crate::connection`]).
pub(crate) fn now_ms() -> u32 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_counts_at_once_and_fades_within_two_ticks() {
        let r = Rate::new();
        let t0 = 1000 * TICK_MS;
        assert_eq!(r.at(t0), 0);
        r.note_at(t0, 100);
        r.note_at(t0 + 1, 25);
        assert_eq!(r.at(t0 + 2), 125 * 125, "the current tick so far");
        // The next tick: the whole last one counts until it has more.
        assert_eq!(r.at(t0 + TICK_MS), 125 * 125);
        r.note_at(t0 + TICK_MS, 1);
        assert_eq!(r.at(t0 + TICK_MS + 1), 125 * 125, "the larger");
        // Two ticks on, only the one before.
        assert_eq!(r.at(t0 + 2 * TICK_MS), 125);
        // A gap: nothing delivered lately.
        assert_eq!(r.at(t0 + 5 * TICK_MS), 0);
        r.note_at(t0 + 5 * TICK_MS, 2);
        assert_eq!(
            r.at(t0 + 5 * TICK_MS),
            2 * 125,
            "the gap was not the last tick"
        );
    }

    #[test]
    fn zero_and_max_are_always_and_never() {
        assert!(coalescing(0));
        assert!(!coalescing(u32::MAX));
    }
}
