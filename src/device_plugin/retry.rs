//! When to try registering again after a failed attempt.
//!
//! A restarting kubelet creates `kubelet.sock` at `bind`, before it `listen`s: the first
//! connect, started by the inotify event, is often refused although the kubelet is a few
//! milliseconds from answering. So attempts come every [`FAST_STEP`] for the first
//! [`FAST_WINDOW`], then back off exponentially from [`SLOW_START`] to [`SLOW_MAX`] so that an
//! absent kubelet costs neither CPU nor log lines.

use std::time::{Duration, Instant};

/// The pause between attempts right after the socket appeared.
pub const FAST_STEP: Duration = Duration::from_millis(5);
/// How long attempts stay fast.
pub const FAST_WINDOW: Duration = Duration::from_millis(200);
/// The first pause after the fast window; it doubles on each failure.
pub const SLOW_START: Duration = Duration::from_millis(250);
/// The longest pause.
pub const SLOW_MAX: Duration = Duration::from_secs(30);

/// The pauses of one registration's attempts.
#[derive(Debug)]
pub struct Retry {
    started: Instant,
    slow: Duration,
}

impl Retry {
    /// A schedule whose fast window starts now.
    pub fn new() -> Retry {
        Retry::starting_at(Instant::now())
    }

    fn starting_at(started: Instant) -> Retry {
        Retry {
            started,
            slow: SLOW_START,
        }
    }

    /// Whether `now` is past the fast window (a failure then is worth a warning).
    pub fn past_fast_window(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.started) >= FAST_WINDOW
    }

    /// The pause before the next attempt, the last one having failed at `now`.
    pub fn next_delay(&mut self, now: Instant) -> Duration {
        if now.saturating_duration_since(self.started) < FAST_WINDOW {
            return FAST_STEP;
        }
        let delay = self.slow;
        self.slow = (self.slow * 2).min(SLOW_MAX);
        delay
    }
}

impl Default for Retry {
    fn default() -> Self {
        Retry::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_for_the_first_window_then_exponential_up_to_the_cap() {
        let start = Instant::now();
        let mut retry = Retry::starting_at(start);
        let mut at = start;
        let mut fast = 0;
        while at.duration_since(start) < FAST_WINDOW {
            assert_eq!(retry.next_delay(at), FAST_STEP);
            at += FAST_STEP;
            fast += 1;
        }
        assert_eq!(fast, 40);
        let slow: Vec<u64> = (0..10)
            .map(|_| retry.next_delay(at).as_millis() as u64)
            .collect();
        assert_eq!(
            slow,
            [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
    }
}
