//! The XID ledger: the node's [`XidCounts`], shared between the health watcher that writes it
//! and the exporter that renders it.
//!
//! The watcher records every XID occurrence synchronously, in the same step that feeds the
//! health tracker, so nothing stands between the driver's report and the counter that could
//! fill up and drop it; after each batch it [`publish`](XidLedger::publish)es, which wakes the
//! exporter's renderer once per batch rather than once per XID. The lock is held for a few map
//! updates at a time (a render works on a copy), so neither side waits on the other for long.
//!
//! A memory bound that lets go of reports (see [`DropSource`]) is counted, and logged once per
//! episode: at the first drop after a minute without any.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tracing::warn;

use super::counts::{DropSource, XidCounts};

/// Drops closer together than this belong to one episode and are logged once.
const DROP_EPISODE_GAP: Duration = Duration::from_secs(60);

/// A shared handle on the node's XID record; clones share it.
#[derive(Debug, Clone)]
pub struct XidLedger {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Bumped by [`XidLedger::publish`]; the value itself means nothing.
    version: watch::Sender<u64>,
}

#[derive(Debug)]
struct State {
    counts: XidCounts,
    /// When each source last dropped something, to log once per episode.
    last_drop: BTreeMap<DropSource, SystemTime>,
}

impl XidLedger {
    /// An empty ledger whose windowed count spans `window` (the exporter's
    /// `--xid-count-window-size`).
    pub fn new(window: Duration) -> Self {
        XidLedger {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    counts: XidCounts::new(window),
                    last_drop: BTreeMap::new(),
                }),
                version: watch::Sender::new(0),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves at worst one occurrence half-counted; the
        // counts stay usable, so poisoning is not propagated.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Records one occurrence of `code` on GPU `gpu` (attributed to GPU instance `gi` when the
    /// driver named one this GPU has), seen at `at`. Subscribers learn of it at the next
    /// [`XidLedger::publish`].
    pub fn record(&self, gpu: u32, gi: Option<u32>, code: u32, at: SystemTime) {
        let mut state = self.lock();
        let dropped = state.counts.observe(gpu, gi, code, at);
        if dropped > 0 {
            state.note_drop(DropSource::Window, dropped, at);
        }
    }

    /// Counts `count` reports a bound made `source` let go of (and logs the first of an
    /// episode).
    pub fn record_dropped(&self, source: DropSource, count: u64, at: SystemTime) {
        if count == 0 {
            return;
        }
        let mut state = self.lock();
        state.counts.add_dropped(source, count);
        state.note_drop(source, count, at);
    }

    /// Wakes the subscribers: call once after a batch of [`XidLedger::record`]s.
    pub fn publish(&self) {
        self.shared
            .version
            .send_modify(|version| *version = version.wrapping_add(1));
    }

    /// A receiver woken by every [`XidLedger::publish`].
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.version.subscribe()
    }

    /// The record to hand to the gpud that takes over, as JSON.
    pub fn handed(&self) -> serde_json::Value {
        serde_json::to_value(self.lock().counts.handed()).unwrap_or_default()
    }

    /// Takes on the record the gpud taken over from handed over (see [`XidLedger::handed`]).
    pub fn take_on(&self, handed: serde_json::Value) -> Result<(), serde_json::Error> {
        let handed = serde_json::from_value(handed)?;
        self.lock().counts.take_on(handed);
        self.publish();
        Ok(())
    }

    /// A copy of the record as of `now`, for rendering: occurrences older than the window are
    /// expired first, and the totals of GPU instances for which `exists(gpu, gi)` is false are
    /// forgotten for good (see [`XidCounts::retain_instances`]).
    pub fn view(&self, now: SystemTime, exists: impl FnMut(u32, u32) -> bool) -> XidCounts {
        let mut state = self.lock();
        state.counts.expire(now);
        state.counts.retain_instances(exists);
        state.counts.clone()
    }
}

impl State {
    fn note_drop(&mut self, source: DropSource, count: u64, at: SystemTime) {
        let before = self.last_drop.insert(source, at);
        let new_episode = before.is_none_or(|before| {
            at.duration_since(before).unwrap_or(Duration::ZERO) > DROP_EPISODE_GAP
        });
        if new_episode {
            let total = self.counts.dropped(source);
            match source {
                DropSource::Window => warn!(
                    count,
                    total,
                    "XID storm: occurrences left out of DCGM_EXP_XID_ERRORS_COUNT early to bound memory (gpud_xid_errors_total still counts them); see gpud_xid_events_dropped_total"
                ),
                DropSource::Dedup => warn!(
                    count,
                    total,
                    "XID storm: kernel-log/NVML de-duplication forgot unpaired reports to bound memory; a late partner counts again; see gpud_xid_events_dropped_total"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;
    use crate::xid::counts::RECENT_CAP;

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    #[tokio::test]
    async fn records_are_shared_and_published_once_per_batch() {
        let ledger = XidLedger::new(Duration::from_secs(60));
        let writer = ledger.clone();
        let mut changes = ledger.subscribe();
        for _ in 0..1_000 {
            writer.record(2, None, 48, t(0));
        }
        assert!(!changes.has_changed().unwrap(), "nothing published yet");
        writer.publish();
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        let view = ledger.view(t(1), |_, _| true);
        assert_eq!(view.totals(2).collect::<Vec<_>>(), [(None, 48, 1_000)]);
        assert_eq!(view.last(2), Some(48));
    }

    #[test]
    fn views_expire_the_window_and_forget_vanished_instances() {
        let ledger = XidLedger::new(Duration::from_secs(60));
        ledger.record(0, Some(3), 94, t(0));
        ledger.record(0, None, 79, t(30));
        let view = ledger.view(t(70), |_, gi| gi != 3);
        assert_eq!(view.totals(0).collect::<Vec<_>>(), [(None, 79, 1)]);
        assert_eq!(view.in_window(0, t(70)), BTreeMap::from([(79, 1)]));
        // The forgetting is for good: a later view with the instance back starts it at 0.
        let view = ledger.view(t(70), |_, _| true);
        assert_eq!(view.totals(0).count(), 1);
    }

    #[test]
    fn drops_are_counted_per_source() {
        let ledger = XidLedger::new(Duration::from_secs(3600));
        ledger.record_dropped(DropSource::Dedup, 4, t(0));
        ledger.record_dropped(DropSource::Dedup, 0, t(1));
        for i in 0..(RECENT_CAP as u64 + 2) {
            ledger.record(0, None, 1_000 + i as u32, t(i));
        }
        let view = ledger.view(t(RECENT_CAP as u64 + 2), |_, _| true);
        assert_eq!(view.dropped(DropSource::Dedup), 4);
        assert_eq!(view.dropped(DropSource::Window), 2);
    }
}
