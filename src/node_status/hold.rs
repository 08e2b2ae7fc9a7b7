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

/// A held value as handed to the gpud that takes over: what was shown and seen, and how long
/// before the offer each last changed (instants mean nothing in another process).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Handed<T> {
    shown: T,
    seen: T,
    changed_ago_ms: Option<u64>,
    seen_for_ms: u64,
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

    /// What the gpud that takes over at `now` needs to hold this value on.
    pub fn handed(&self, now: Instant) -> Handed<T> {
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Handed {
            shown: self.shown.clone(),
            seen: self.seen.clone(),
            changed_ago_ms: self
                .changed_at
                .map(|at| millis(now.saturating_duration_since(at))),
            seen_for_ms: millis(now.saturating_duration_since(self.seen_since)),
        }
    }

    /// Goes on holding where the gpud taken over from was: it showed `handed.shown`, and the
    /// hold counts from its instants. What this process observes stays the observed value; it
    /// has been seen for as long as the old process saw it when the severity is the same.
    pub fn take_on(&mut self, handed: Handed<T>, now: Instant) {
        let ago = |ms: u64| now.checked_sub(Duration::from_millis(ms));
        self.shown = handed.shown;
        self.changed_at = handed.changed_ago_ms.and_then(ago);
        if handed.seen.severity() == self.seen.severity()
            && let Some(since) = ago(handed.seen_for_ms)
        {
            self.seen_since = since;
        }
        self.settle(now);
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
    fn a_value_handed_over_keeps_its_hold_in_the_next_process() {
        let t = Instant::now() + Duration::from_secs(100);
        let mut old = Held::quiet(S(0, "ok"), HOLD, t);
        old.observe(S(2, "xid"), at(t, 1));
        old.observe(S(0, "ok"), at(t, 4));
        let handed = old.handed(at(t, 6));
        // The new process sees the GPU healthy at once: it still shows the failure until the
        // old process's quiet hold is over (healthy since 4: shown at 14).
        let mut new = Held::quiet(S(0, "ok"), HOLD, at(t, 6));
        new.take_on(handed, at(t, 6));
        assert_eq!(*new.shown(), S(2, "xid"));
        assert_eq!(new.deadline(), Some(at(t, 14)));
        assert!(new.settle(at(t, 14)));
        assert_eq!(*new.shown(), S(0, "ok"));
    }

    #[test]
    fn same_severity_changes_show_at_once() {
        let t = Instant::now();
        let mut held = Held::quiet(S(2, "xid 79"), HOLD, t);
        held.observe(S(2, "xid 79, lost"), at(t, 1));
        assert_eq!(*held.shown(), S(2, "xid 79, lost"));
    }
}
