//! What the exporter remembers about XIDs: the last code per GPU (dcgm-exporter's
//! `DCGM_FI_DEV_XID_ERRORS`), a monotonic count per GPU, MIG instance and code
//! (`gpud_xid_errors_total`), and recent occurrences for the windowed count
//! (`DCGM_EXP_XID_ERRORS_COUNT`).
//!
//! Pure: times are passed in. Memory is bounded: totals grow by one entry per distinct
//! `(instance, code)` pair, and the recent list keeps at most [`RECENT_CAP`] entries per GPU.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime};

/// Recent occurrences remembered per GPU for the windowed count; a storm beyond this many
/// within one window is counted as this many.
pub const RECENT_CAP: usize = 4096;

/// Default window of `DCGM_EXP_XID_ERRORS_COUNT` (dcgm-exporter's `-x` default, 5 minutes).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(300);

#[derive(Debug, Default, Clone)]
struct GpuXids {
    last: Option<u32>,
    /// `(GPU instance or None for the whole GPU, code)` → occurrences.
    totals: BTreeMap<(Option<u32>, u32), u64>,
    recent: VecDeque<(SystemTime, u32)>,
}

/// XID memory of the node.
#[derive(Debug, Clone)]
pub struct XidState {
    window: Duration,
    gpus: BTreeMap<u32, GpuXids>,
}

impl XidState {
    /// Empty, with the count window.
    pub fn new(window: Duration) -> Self {
        XidState {
            window,
            gpus: BTreeMap::new(),
        }
    }

    /// The count window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Records one occurrence of `code` on `gpu`, attributed to GPU instance `gi` when the
    /// driver said which.
    pub fn observe(&mut self, gpu: u32, gi: Option<u32>, code: u32, at: SystemTime) {
        let state = self.gpus.entry(gpu).or_default();
        state.last = Some(code);
        *state.totals.entry((gi, code)).or_default() += 1;
        if state.recent.len() >= RECENT_CAP {
            state.recent.pop_front();
        }
        state.recent.push_back((at, code));
    }

    /// The most recent XID of a GPU (sticky, as DCGM keeps it).
    pub fn last(&self, gpu: u32) -> Option<u32> {
        self.gpus.get(&gpu).and_then(|s| s.last)
    }

    /// Occurrences so far by `(GPU instance, code)`, ordered.
    pub fn totals(&self, gpu: u32) -> impl Iterator<Item = (Option<u32>, u32, u64)> + '_ {
        self.gpus
            .get(&gpu)
            .into_iter()
            .flat_map(|s| s.totals.iter().map(|((gi, code), n)| (*gi, *code, *n)))
    }

    /// Occurrences per code within the window ending at `now`, ordered by code.
    pub fn in_window(&self, gpu: u32, now: SystemTime) -> BTreeMap<u32, u64> {
        let mut counts = BTreeMap::new();
        let Some(state) = self.gpus.get(&gpu) else {
            return counts;
        };
        for (at, code) in &state.recent {
            let age = now.duration_since(*at).unwrap_or(Duration::ZERO);
            if age <= self.window {
                *counts.entry(*code).or_default() += 1;
            }
        }
        counts
    }

    /// Forgets the totals of GPU instances for which `exists(gpu, gpu_instance)` is false (a
    /// MIG layout changed): their series go away with them, and an instance created later
    /// under the same id counts from zero instead of inheriting another instance's errors.
    /// Whole-GPU totals, the last code and the windowed count stay.
    pub fn retain_instances(&mut self, mut exists: impl FnMut(u32, u32) -> bool) {
        for (gpu, state) in &mut self.gpus {
            state
                .totals
                .retain(|(gi, _), _| gi.is_none_or(|gi| exists(*gpu, gi)));
        }
    }

    /// Drops recent occurrences older than the window (bounded work per call).
    pub fn expire(&mut self, now: SystemTime) {
        let window = self.window;
        for state in self.gpus.values_mut() {
            while let Some((at, _)) = state.recent.front() {
                if now.duration_since(*at).unwrap_or(Duration::ZERO) > window {
                    state.recent.pop_front();
                } else {
                    break;
                }
            }
        }
    }
}

/// The text dcgm-exporter puts in `err_msg` for an XID: the catalog's description, or
/// `Unknown Error` for a code the catalog lacks; XID 0 is `No Error`.
pub fn message(code: u32) -> &'static str {
    if code == 0 {
        return "No Error";
    }
    crate::health::xid::find(code).map_or("Unknown Error", |info| info.description)
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    #[test]
    fn last_is_sticky_and_totals_count_every_occurrence() {
        let mut x = XidState::new(Duration::from_secs(60));
        assert_eq!(x.last(3), None);
        x.observe(3, None, 79, t(0));
        x.observe(3, None, 79, t(1));
        x.observe(3, Some(2), 94, t(2));
        assert_eq!(x.last(3), Some(94));
        assert_eq!(
            x.totals(3).collect::<Vec<_>>(),
            [(None, 79, 2), (Some(2), 94, 1)]
        );
        x.expire(t(10_000));
        assert_eq!(x.last(3), Some(94), "the last code never resets");
        assert_eq!(x.totals(3).count(), 2, "totals are monotonic");
    }

    #[test]
    fn totals_of_vanished_instances_are_forgotten() {
        let mut x = XidState::new(Duration::from_secs(60));
        x.observe(0, Some(1), 94, t(0));
        x.observe(0, Some(2), 94, t(1));
        x.observe(0, None, 79, t(2));
        x.observe(1, Some(2), 43, t(3));
        x.retain_instances(|gpu, gi| (gpu, gi) != (0, 2));
        assert_eq!(
            x.totals(0).collect::<Vec<_>>(),
            [(None, 79, 1), (Some(1), 94, 1)]
        );
        assert_eq!(x.totals(1).collect::<Vec<_>>(), [(Some(2), 43, 1)]);
        assert_eq!(x.last(0), Some(79));
        assert_eq!(x.in_window(0, t(3)), BTreeMap::from([(79, 1), (94, 2)]));
    }

    #[test]
    fn window_counts_only_recent_occurrences() {
        let mut x = XidState::new(Duration::from_secs(60));
        x.observe(0, None, 48, t(0));
        x.observe(0, None, 48, t(50));
        x.observe(0, None, 63, t(55));
        assert_eq!(x.in_window(0, t(70)), BTreeMap::from([(48, 1), (63, 1)]));
        x.expire(t(200));
        assert!(x.in_window(0, t(200)).is_empty());
        assert!(x.in_window(7, t(0)).is_empty());
    }

    #[test]
    fn recent_list_is_bounded() {
        let mut x = XidState::new(Duration::from_secs(3600));
        for i in 0..(RECENT_CAP as u64 + 10) {
            x.observe(1, None, 13, t(i / 1000));
        }
        assert_eq!(x.in_window(1, t(10))[&13], RECENT_CAP as u64);
        assert_eq!(x.totals(1).next(), Some((None, 13, RECENT_CAP as u64 + 10)));
    }

    #[test]
    fn messages_follow_the_catalog() {
        assert_eq!(message(79), "GPU has fallen off the bus");
        assert_eq!(message(0), "No Error");
        assert_eq!(message(9999), "Unknown Error");
    }
}
