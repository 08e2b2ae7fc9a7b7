//! When to try registering again after a failed attempt.
//!
//! A restarting kubelet creates `kubelet.sock` at `bind`, before it `listen`s: the first
//! connect, started by the inotify event, is often refused although the kubelet is a few
//! milliseconds from answering. So attempts come every [`FAST_STEP`] for the first
//! [`FAST_WINDOW`], then back off exponentially from [`SLOW_START`] to [`SLOW_MAX`] so that an
//! absent kubelet costs neither CPU nor log lines. The schedule is gpud's one backoff
//! ([`crate::backoff`]) with a fast window in front.

use std::time::{Duration, Instant};

use crate::backoff::{self, Backoff};

/// The pause between attempts right after the socket appeared.
pub const FAST_STEP: Duration = Duration::from_millis(5);
/// How long attempts stay fast.
pub const FAST_WINDOW: Duration = Duration::from_millis(200);
/// The first pause after the fast window; it doubles on each failure.
pub const SLOW_START: Duration = Duration::from_millis(250);
/// The longest pause (before jitter).
pub const SLOW_MAX: Duration = Duration::from_secs(30);

/// The pauses of one registration of `resource`, whose fast window starts at `now`. Seeded by
/// the resource so that the plugins of one node do not retry in lockstep.
pub fn schedule(resource: &str, now: Instant) -> Backoff {
    Backoff::between(SLOW_START, SLOW_MAX, backoff::seed_from(resource)).with_fast_window(
        FAST_STEP,
        FAST_WINDOW,
        now,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_for_the_first_window_then_exponential_up_to_the_cap() {
        let start = Instant::now();
        let mut retry = schedule("nvidia.com/gpu", start);
        let mut at = start;
        let mut fast = 0;
        while at.duration_since(start) < FAST_WINDOW {
            assert!(!retry.past_fast_window(at));
            assert_eq!(retry.next_delay_at(at), FAST_STEP);
            at += FAST_STEP;
            fast += 1;
        }
        assert_eq!(fast, 40);
        assert!(retry.past_fast_window(at));
        // Each slow pause is its step plus at most a quarter of jitter.
        for step in [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000] {
            let delay = retry.next_delay_at(at).as_millis() as u64;
            assert!(
                delay >= step && delay <= step + step / 4,
                "{delay} ms for a step of {step} ms"
            );
        }
    }
}
