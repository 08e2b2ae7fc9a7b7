//! Anti-flap: a value shown to the cluster that changes at most once per hold time, and that
//! gets better only after the observed value has been better for a whole hold time.
//!
//! Getting worse is shown at once (unless the last change was less than a hold time ago);
//! for a [`Held::quiet`] value, getting better waits until the better value has been seen
//! continuously for the hold time, so a GPU that keeps failing and recovering stays failed.
//! Values derived from quiet ones (the conditions, the taints) are [`Held::new`]: only the
//! rate limit applies, so a recovery is not held twice. Changes that keep the severity
//! (another reason, another message) are shown at once and do not count as changes: the
//! hold is about what a remediation controller acts on, the status.

use std::time::{Duration, Instant};

/// How bad a value is; a higher number is worse.
pub trait Severity {
    fn severity(&self) -> u8;
}

/// A held value: what is observed now, and what is shown.
#[derive(Debug, Clone)]
pub struct Held<T> {
    hold: Duration,
    shown: T,
    /// When the shown severity last changed (`None`: never, so no wait for the first change).
    changed_at: Option<Instant>,
    seen: T,
    /// Since when the observed value has had its severity.
    seen_since: Instant,
    /// Better values must be seen for a hold time before they show.
    quiet: bool,
}

impl<T: Severity + Clone + PartialEq> Held<T> {
    /// A value shown as `initial` from `now`, as it is (start-up shows the truth at once),
    /// that changes at most once per `hold`.
    pub fn new(initial: T, hold: Duration, now: Instant) -> Self {
        Held {
            hold,
            shown: initial.clone(),
            changed_at: None,
            seen: initial,
            seen_since: now,
            quiet: false,
        }
    }

    /// As [`Held::new`], and a better value shows only once it has been seen for `hold`.
    pub fn quiet(initial: T, hold: Duration, now: Instant) -> Self {
        Held {
            quiet: true,
            ..Held::new(initial, hold, now)
        }
    }

    /// The value shown.
    pub fn shown(&self) -> &T {
        &self.shown
    }

    /// Records the value observed at `now`, then updates what is shown.
    pub fn observe(&mut self, value: T, now: Instant) {
        if value.severity() != self.seen.severity() {
            self.seen_since = now;
        }
        self.seen = value;
        self.settle(now);
    }

    /// Shows the observed value if the hold allows it at `now`; returns whether the shown
    /// value changed.
    pub fn settle(&mut self, now: Instant) -> bool {
        if self.seen == self.shown {
            return false;
        }
        if self.seen.severity() == self.shown.severity() {
            self.shown = self.seen.clone();
            return true;
        }
        if self.earliest_change().is_some_and(|at| now < at) {
            return false;
        }
        self.shown = self.seen.clone();
        self.changed_at = Some(now);
        true
    }

    /// When the shown value may change next (`None` when it shows what is observed).
    pub fn deadline(&self) -> Option<Instant> {
        if self.seen == self.shown {
            return None;
        }
        self.earliest_change().or(Some(self.seen_since))
    }

    /// The earliest time the shown severity may change to the observed one.
    fn earliest_change(&self) -> Option<Instant> {
        let after_last = self.changed_at.map(|at| at + self.hold);
        if self.quiet && self.seen.severity() < self.shown.severity() {
            let stable = self.seen_since + self.hold;
            return Some(after_last.map_or(stable, |at| at.max(stable)));
        }
        after_last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    struct S(u8, &'static str);

    impl Severity for S {
        fn severity(&self) -> u8 {
            self.0
        }
    }

    const HOLD: Duration = Duration::from_secs(10);

    fn at(start: Instant, secs: u64) -> Instant {
        start + Duration::from_secs(secs)
    }

    #[test]
    fn worse_is_shown_at_once_and_better_after_a_quiet_hold() {
        let t = Instant::now();
        let mut held = Held::quiet(S(0, "ok"), HOLD, t);
        held.observe(S(2, "xid"), at(t, 1));
        assert_eq!(*held.shown(), S(2, "xid"));
        held.observe(S(0, "ok"), at(t, 3));
        assert_eq!(*held.shown(), S(2, "xid"));
        assert_eq!(held.deadline(), Some(at(t, 13)));
        assert!(!held.settle(at(t, 12)));
        assert!(held.settle(at(t, 13)));
        assert_eq!(*held.shown(), S(0, "ok"));
        assert_eq!(held.deadline(), None);
    }

    #[test]
    fn a_flapping_value_stays_bad_until_quiet_for_the_hold() {
        let t = Instant::now();
        let mut held = Held::quiet(S(0, "ok"), HOLD, t);
        let mut changes = 0;
        let mut last = *held.shown();
        for second in 1..40 {
            let value = if second % 2 == 1 {
                S(2, "xid")
            } else {
                S(0, "ok")
            };
            held.observe(value, at(t, second));
            if *held.shown() != last {
                changes += 1;
                last = *held.shown();
            }
        }
        assert_eq!((changes, *held.shown()), (1, S(2, "xid")));
        // Last failure at 39, healthy from 40: shown healthy at 50.
        held.observe(S(0, "ok"), at(t, 40));
        assert!(!held.settle(at(t, 49)));
        assert!(held.settle(at(t, 50)));
    }

    #[test]
    fn worse_again_soon_after_recovery_waits_for_the_hold() {
        let t = Instant::now();
        let mut held = Held::quiet(S(2, "xid"), HOLD, t);
        held.observe(S(0, "ok"), at(t, 0));
        assert!(held.settle(at(t, 10)));
        held.observe(S(2, "lost"), at(t, 12));
        assert_eq!(*held.shown(), S(0, "ok"));
        assert_eq!(held.deadline(), Some(at(t, 20)));
        assert!(held.settle(at(t, 20)));
        assert_eq!(*held.shown(), S(2, "lost"));
    }

    #[test]
    fn a_plain_value_only_waits_for_the_rate_limit() {
        let t = Instant::now();
        let mut held = Held::new(S(0, "ok"), HOLD, t);
        held.observe(S(2, "bad"), at(t, 1));
        held.observe(S(0, "ok"), at(t, 2));
        assert_eq!(held.deadline(), Some(at(t, 11)));
        assert!(held.settle(at(t, 11)));
    }

    #[test]
    fn same_severity_changes_show_at_once() {
        let t = Instant::now();
        let mut held = Held::quiet(S(2, "xid 79"), HOLD, t);
        held.observe(S(2, "xid 79, lost"), at(t, 1));
        assert_eq!(*held.shown(), S(2, "xid 79, lost"));
    }
}
