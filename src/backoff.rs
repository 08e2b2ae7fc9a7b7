//! The one retry schedule gpud uses for calls to other processes (the API server, the kubelet):
//! exponential from [`START`] to a cap, each pause lengthened by up to a quarter at random so
//! that a fleet of nodes retrying the same outage spreads out instead of arriving together.
//!
//! The jitter comes from a xorshift generator seeded per node ([`seed_from`]), so two nodes
//! never share a schedule and a test can predict one.
//!
//! Checks every node repeats (a resync, a watch's renewal, the doctor) wait a [`period`]:
//! a little shorter each time, at random, so a fleet started together drifts out of step.
//!
//! A caller whose peer is usually back within milliseconds (a restarting kubelet) puts a fast
//! window in front ([`Backoff::with_fast_window`]): short fixed pauses for a while, then the
//! exponential schedule.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
    fast: Option<FastWindow>,
}

/// Fixed pauses of `step` until `until`; `until` is `None` when the window's end does not fit
/// in an `Instant`, which leaves the window open for good.
#[derive(Debug, Clone, Copy)]
struct FastWindow {
    step: Duration,
    until: Option<Instant>,
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
            fast: None,
        }
    }

    /// The same schedule after a fast window: until `window` has passed from `now`, every
    /// pause is `step`, without jitter (the peer is expected back before a fleet could pile
    /// up on it). Only [`Backoff::next_delay_at`] knows the time, so only it honours the window.
    pub fn with_fast_window(mut self, step: Duration, window: Duration, now: Instant) -> Self {
        self.fast = Some(FastWindow {
            step,
            until: now.checked_add(window),
        });
        self
    }

    /// Whether `now` is past the fast window (always, without one): a failure from then on is
    /// worth a warning.
    pub fn past_fast_window(&self, now: Instant) -> bool {
        self.fast
            .is_none_or(|fast| fast.until.is_some_and(|until| now >= until))
    }

    /// The pause before the next attempt, the last one having failed at `now`: the fast step
    /// inside the fast window, [`Backoff::next_delay`] after it.
    pub fn next_delay_at(&mut self, now: Instant) -> Duration {
        match self.fast {
            Some(fast) if !self.past_fast_window(now) => fast.step,
            _ => self.next_delay(),
        }
    }

    /// The pause before the next attempt: the current step plus up to a quarter of it; the
    /// step then doubles, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.next;
        let jitter = step.mul_f64((next_random(&mut self.seed) % 1000) as f64 / 4000.0);
        self.next = (self.next * 2).min(self.max);
        step + jitter
    }

    /// The step without jitter that the next [`Backoff::next_delay`] starts from.
    pub fn current_step(&self) -> Duration {
        self.next
    }

    /// After a success: the next failure starts from the first step again (the fast window,
    /// if any, is not reopened).
    pub fn reset(&mut self) {
        self.next = self.start;
    }
}

/// The next number of the xorshift generator whose state is `seed` (never zero).
fn next_random(seed: &mut u64) -> u64 {
    *seed |= 1;
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// A pause drawn uniformly from `[0, window)` ("full jitter"): for a fleet that must not
/// arrive together, where [`Backoff`]'s quarter of jitter would keep it in step.
pub fn spread(seed: &mut u64, window: Duration) -> Duration {
    window.mul_f64((next_random(seed) % 1_000_000) as f64 / 1_000_000.0)
}

/// `base` less a random part of it, drawn anew for each period of a check every node repeats:
/// a fleet started together would otherwise send those in the same second for as long as it
/// runs. In the process's first `base` the part is up to a half (the fleet spreads over half a
/// period at once), after it up to a tenth (it keeps drifting; a fleet that fell into step,
/// as after an outage, drifts apart again). Never longer than `base`, which the documented
/// "every five minutes" counts on.
pub fn period(base: Duration) -> Duration {
    /// The generator's state, shared by the process's periodic checks; 0 until first used.
    static STATE: AtomicU64 = AtomicU64::new(0);
    /// When the process first drew a period: about when its checks started.
    static FIRST: OnceLock<Instant> = OnceLock::new();
    let first = FIRST.get_or_init(Instant::now).elapsed() < base;
    let mut seed = STATE.load(Ordering::Relaxed);
    if seed == 0 {
        seed = process_seed();
    }
    let drawn = shortened(&mut seed, base, first);
    // Two checks drawing at once may draw alike: harmless for a spread.
    STATE.store(seed, Ordering::Relaxed);
    drawn
}

/// `base` less a random part of its half (`first`) or of its tenth.
fn shortened(seed: &mut u64, base: Duration, first: bool) -> Duration {
    let share = if first { base / 2 } else { base / 10 };
    base.saturating_sub(spread(seed, share))
}

/// A jitter seed that differs between processes and between starts of one process, so that
/// a fleet restarted at once does not draw alike.
pub fn process_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    seed_from(&format!("{}-{nanos}", std::process::id()))
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
    fn a_fast_window_comes_before_the_exponential_steps() {
        let start = Instant::now();
        let step = Duration::from_millis(5);
        let mut backoff = Backoff::between(Duration::from_millis(250), Duration::from_secs(2), 3)
            .with_fast_window(step, Duration::from_millis(20), start);
        let mut at = start;
        for _ in 0..4 {
            assert!(!backoff.past_fast_window(at));
            assert_eq!(backoff.next_delay_at(at), step);
            at += step;
        }
        assert!(backoff.past_fast_window(at));
        let first = backoff.next_delay_at(at);
        assert!(
            first >= Duration::from_millis(250) && first <= Duration::from_millis(313),
            "{first:?}"
        );
        assert_eq!(backoff.current_step(), Duration::from_millis(500));
    }

    #[test]
    fn without_a_fast_window_the_time_does_not_matter() {
        let now = Instant::now();
        let mut timed = Backoff::new(9);
        let mut plain = Backoff::new(9);
        assert!(timed.past_fast_window(now));
        for _ in 0..5 {
            assert_eq!(timed.next_delay_at(now), plain.next_delay());
        }
    }

    #[test]
    fn a_spread_pause_is_uniform_in_its_window() {
        let mut seed = seed_from("node-a");
        let window = Duration::from_secs(10);
        let pauses: Vec<Duration> = (0..1000).map(|_| spread(&mut seed, window)).collect();
        assert!(pauses.iter().all(|p| *p < window));
        let early = pauses.iter().filter(|p| **p < window / 2).count();
        assert!(
            (400..600).contains(&early),
            "{early} of 1000 in the first half"
        );
    }

    #[test]
    fn seeds_differ_per_node() {
        assert_ne!(seed_from("node-a"), seed_from("node-b"));
        assert_eq!(seed_from("node-a"), seed_from("node-a"));
    }

    #[test]
    fn periods_are_at_most_their_base_and_spread_over_a_half_then_a_tenth() {
        let base = Duration::from_secs(300);
        let mut seed = seed_from("node-7");
        for (first, share) in [(true, base / 2), (false, base / 10)] {
            let periods: Vec<Duration> = (0..1000)
                .map(|_| shortened(&mut seed, base, first))
                .collect();
            assert!(periods.iter().all(|p| *p <= base && *p > base - share));
            // Spread over the share, not bunched: both ends of it are drawn.
            assert!(periods.iter().any(|p| *p > base - base / 100));
            assert!(periods.iter().any(|p| *p < base - share + base / 100));
        }
        // The process-wide draw: within its first period, from the half.
        let drawn = period(base);
        assert!(drawn <= base && drawn > base / 2, "{drawn:?}");
    }
}
