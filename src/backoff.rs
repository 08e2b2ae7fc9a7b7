//! The one retry schedule gpud uses for calls to other processes (the API server, the kubelet):
//! exponential from [`START`] to a cap, each pause lengthened by up to a quarter at random so
//! that a fleet of nodes retrying the same outage spreads out instead of arriving together.
//!
//! The jitter comes from a xorshift generator seeded per node ([`seed_from`]), so two nodes
//! never share a schedule and a test can predict one.

use std::time::Duration;

/// The first pause.
pub const START: Duration = Duration::from_millis(500);
/// The longest pause, unless [`Backoff::capped`] says otherwise.
pub const MAX: Duration = Duration::from_secs(30);

/// Exponential backoff with jitter.
#[derive(Debug, Clone)]
pub struct Backoff {
    start: Duration,
    next: Duration,
    max: Duration,
    seed: u64,
}

impl Backoff {
    /// From [`START`] to [`MAX`], jittered from `seed`.
    pub fn new(seed: u64) -> Self {
        Backoff::capped(seed, MAX)
    }

    /// From [`START`] (or `max`, if smaller) to `max`.
    pub fn capped(seed: u64, max: Duration) -> Self {
        Backoff::between(START.min(max), max, seed)
    }

    /// From `start` to `max`.
    pub fn between(start: Duration, max: Duration, seed: u64) -> Self {
        Backoff {
            start,
            next: start,
            max,
            // xorshift never leaves zero.
            seed: seed | 1,
        }
    }

    /// The pause before the next attempt: the current step plus up to a quarter of it; the
    /// step then doubles, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let step = self.next;
        let jitter = step.mul_f64((self.seed % 1000) as f64 / 4000.0);
        self.next = (self.next * 2).min(self.max);
        step + jitter
    }

    /// The step without jitter that the next [`Backoff::next_delay`] starts from.
    pub fn current_step(&self) -> Duration {
        self.next
    }

    /// After a success: the next failure starts from the first step again.
    pub fn reset(&mut self) {
        self.next = self.start;
    }
}

/// A jitter seed from a name (the node's), stable across restarts and different per node.
pub fn seed_from(name: &str) -> u64 {
    name.bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_with_bounded_jitter() {
        let mut backoff = Backoff::new(42);
        let mut step = START;
        for _ in 0..10 {
            let delay = backoff.next_delay();
            assert!(
                delay >= step && delay <= step.mul_f64(1.25),
                "{delay:?} vs {step:?}"
            );
            step = (step * 2).min(MAX);
        }
        backoff.reset();
        assert!(backoff.next_delay() < Duration::from_millis(700));
    }

    #[test]
    fn a_custom_start_is_where_reset_returns() {
        let mut backoff = Backoff::between(Duration::from_millis(250), Duration::from_secs(1), 7);
        assert!(backoff.next_delay() < Duration::from_millis(320));
        assert!(backoff.next_delay() >= Duration::from_millis(500));
        backoff.reset();
        assert_eq!(backoff.current_step(), Duration::from_millis(250));
    }

    #[test]
    fn seeds_differ_per_node() {
        assert_ne!(seed_from("node-a"), seed_from("node-b"));
        assert_eq!(seed_from("node-a"), seed_from("node-a"));
    }
}
