//! The XID record of the node: the last code per GPU (dcgm-exporter's
//! `DCGM_FI_DEV_XID_ERRORS`), an exact, monotonic count per GPU, GPU instance and code
//! (`gpud_xid_errors_total`), and recent occurrences for the windowed count
//! (`DCGM_EXP_XID_ERRORS_COUNT`).
//!
//! Pure: times are passed in. Memory is bounded without bounding the counts: totals grow by one
//! entry per distinct `(instance, code)` pair, and recent occurrences are kept as a count per
//! code and second, at most [`RECENT_CAP`] of them per GPU — a storm of any size within one
//! second is one entry per code. Only when a GPU has more than that many (second, code) pairs
//! within one window does the oldest pair leave the windowed count early; those occurrences are
//! counted in [`XidCounts::dropped`] (`gpud_xid_events_dropped_total{source="window"}`), and
//! the totals still hold them.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Most (second, code) pairs remembered per GPU for the windowed count.
pub const RECENT_CAP: usize = 4096;

/// Where a memory bound made gpud let go of XID reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DropSource {
    /// Occurrences left out of the windowed count before their window passed.
    Window,
    /// Unpaired reports the NVML/kernel-log de-duplicator forgot before their partner could
    /// arrive (a partner arriving later counts again).
    Dedup,
}

impl DropSource {
    /// Every source, in the order the exporter prints them.
    pub const ALL: [DropSource; 2] = [DropSource::Window, DropSource::Dedup];

    /// The `source` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            DropSource::Window => "window",
            DropSource::Dedup => "dedup",
        }
    }
}

#[derive(Debug, Default, Clone)]
struct GpuXids {
    last: Option<u32>,
    /// `(GPU instance or None for the whole GPU, code)` → occurrences.
    totals: BTreeMap<(Option<u32>, u32), u64>,
    /// `(second since the epoch, rounded up; code)` → occurrences in that second.
    recent: BTreeMap<(u64, u32), u64>,
}

/// XID record of the node; see the module documentation.
#[derive(Debug, Clone)]
pub struct XidCounts {
    window: Duration,
    gpus: BTreeMap<u32, GpuXids>,
    dropped: BTreeMap<DropSource, u64>,
}

/// The second an occurrence is filed under: rounded up, so that it never leaves the window
/// early (it may stay up to a second late).
fn second_of(at: SystemTime) -> u64 {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    since.as_secs() + u64::from(since.subsec_nanos() > 0)
}

/// How long ago, at `now`, the second `second` ended (zero for one not over yet).
fn age(second: u64, now: SystemTime) -> Duration {
    now.duration_since(UNIX_EPOCH + Duration::from_secs(second))
        .unwrap_or(Duration::ZERO)
}

/// The record as handed to the gpud that takes over: plain lists, since JSON keys are text.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Handed {
    /// `(gpu, last code, [(instance, code, total)], [(second, code, occurrences)])`.
    gpus: Vec<HandedGpu>,
    /// `(source, count)` with the source's label value.
    dropped: Vec<(String, u64)>,
}

type HandedGpu = (
    u32,
    Option<u32>,
    Vec<(Option<u32>, u32, u64)>,
    Vec<(u64, u32, u64)>,
);

impl XidCounts {
    /// The record to hand to the next process.
    pub fn handed(&self) -> Handed {
        Handed {
            gpus: self
                .gpus
                .iter()
                .map(|(gpu, state)| {
                    (
                        *gpu,
                        state.last,
                        state
                            .totals
                            .iter()
                            .map(|((gi, code), n)| (*gi, *code, *n))
                            .collect(),
                        state
                            .recent
                            .iter()
                            .map(|((s, code), n)| (*s, *code, *n))
                            .collect(),
                    )
                })
                .collect(),
            dropped: self
                .dropped
                .iter()
                .map(|(source, n)| (source.as_str().to_owned(), *n))
                .collect(),
        }
    }

    /// Takes on the record `handed` by the process taken over from, added to what this one
    /// counted meanwhile (nothing, as it restores before it watches).
    pub fn take_on(&mut self, handed: Handed) {
        for (gpu, last, totals, recent) in handed.gpus {
            let state = self.gpus.entry(gpu).or_default();
            state.last = state.last.or(last);
            for (gi, code, n) in totals {
                *state.totals.entry((gi, code)).or_default() += n;
            }
            for (second, code, n) in recent {
                *state.recent.entry((second, code)).or_default() += n;
            }
        }
        for (source, n) in handed.dropped {
            if let Some(source) = DropSource::ALL.into_iter().find(|s| s.as_str() == source) {
                self.add_dropped(source, n);
            }
        }
    }

    /// Empty, with the count window.
    pub fn new(window: Duration) -> Self {
        XidCounts {
            window,
            gpus: BTreeMap::new(),
            dropped: BTreeMap::new(),
        }
    }

    /// The count window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Records one occurrence of `code` on `gpu`, attributed to GPU instance `gi` when the
    /// driver said which. Returns how many occurrences left the windowed count to make room
    /// (0 but in a storm of many codes; see the module documentation).
    pub fn observe(&mut self, gpu: u32, gi: Option<u32>, code: u32, at: SystemTime) -> u64 {
        let state = self.gpus.entry(gpu).or_default();
        state.last = Some(code);
        *state.totals.entry((gi, code)).or_default() += 1;
        *state.recent.entry((second_of(at), code)).or_default() += 1;
        let mut dropped = 0;
        while state.recent.len() > RECENT_CAP {
            if let Some((_, count)) = state.recent.pop_first() {
                dropped += count;
            }
        }
        self.add_dropped(DropSource::Window, dropped);
        dropped
    }

    /// Counts `count` reports let go at `source`.
    pub fn add_dropped(&mut self, source: DropSource, count: u64) {
        if count > 0 {
            *self.dropped.entry(source).or_default() += count;
        }
    }

    /// Reports let go at `source` so far.
    pub fn dropped(&self, source: DropSource) -> u64 {
        self.dropped.get(&source).copied().unwrap_or(0)
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
        for ((second, code), n) in &state.recent {
            if age(*second, now) <= self.window {
                *counts.entry(*code).or_default() += n;
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

    /// Drops recent occurrences older than the window.
    pub fn expire(&mut self, now: SystemTime) {
        let window = self.window;
        for state in self.gpus.values_mut() {
            while let Some(entry) = state.recent.first_entry() {
                let (second, _) = *entry.key();
                if age(second, now) > window {
                    entry.remove();
                } else {
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    #[test]
    fn last_is_sticky_and_totals_count_every_occurrence() {
        let mut x = XidCounts::new(Duration::from_secs(60));
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
        let mut x = XidCounts::new(Duration::from_secs(60));
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
        let mut x = XidCounts::new(Duration::from_secs(60));
        x.observe(0, None, 48, t(0));
        x.observe(0, None, 48, t(50));
        x.observe(0, None, 63, t(55));
        assert_eq!(x.in_window(0, t(60)), BTreeMap::from([(48, 2), (63, 1)]));
        assert_eq!(x.in_window(0, t(70)), BTreeMap::from([(48, 1), (63, 1)]));
        x.expire(t(200));
        assert!(x.in_window(0, t(200)).is_empty());
        assert!(x.in_window(7, t(0)).is_empty());
    }

    #[test]
    fn an_occurrence_never_leaves_the_window_early() {
        let mut x = XidCounts::new(Duration::from_secs(60));
        let at = t(10) + Duration::from_millis(700);
        x.observe(0, None, 31, at);
        let edge = at + Duration::from_secs(60);
        x.expire(edge);
        assert_eq!(x.in_window(0, edge), BTreeMap::from([(31, 1)]));
        x.expire(edge + Duration::from_secs(1));
        assert!(x.in_window(0, edge + Duration::from_secs(1)).is_empty());
    }

    #[test]
    fn a_storm_is_counted_exactly_in_the_window_too() {
        let mut x = XidCounts::new(Duration::from_secs(300));
        let codes = [94, 46, 13, 79];
        for i in 0..10_000u64 {
            let at = t(0) + Duration::from_micros(i * 37);
            assert_eq!(x.observe(1, None, codes[(i % 4) as usize], at), 0);
        }
        let want = BTreeMap::from([(13, 2_500), (46, 2_500), (79, 2_500), (94, 2_500)]);
        assert_eq!(x.in_window(1, t(1)), want);
        assert_eq!(x.totals(1).map(|(_, _, n)| n).sum::<u64>(), 10_000);
        assert_eq!(x.dropped(DropSource::Window), 0);
    }

    #[test]
    fn the_recent_record_is_bounded_and_says_what_it_let_go() {
        let mut x = XidCounts::new(Duration::from_secs(100_000));
        // A new code every second: one (second, code) pair each.
        let mut dropped = 0;
        for i in 0..(RECENT_CAP as u64 + 10) {
            dropped += x.observe(1, None, 1_000 + i as u32, t(i));
        }
        assert_eq!(dropped, 10);
        assert_eq!(x.dropped(DropSource::Window), 10);
        let now = t(RECENT_CAP as u64 + 10);
        assert_eq!(x.in_window(1, now).values().sum::<u64>(), RECENT_CAP as u64);
        assert_eq!(
            x.totals(1).count(),
            RECENT_CAP + 10,
            "totals keep everything"
        );
    }

    #[test]
    fn drops_add_up_per_source() {
        let mut x = XidCounts::new(Duration::from_secs(60));
        x.add_dropped(DropSource::Dedup, 3);
        x.add_dropped(DropSource::Dedup, 0);
        x.add_dropped(DropSource::Dedup, 2);
        assert_eq!(x.dropped(DropSource::Dedup), 5);
        assert_eq!(x.dropped(DropSource::Window), 0);
        assert_eq!(DropSource::ALL.map(DropSource::as_str), ["window", "dedup"]);
    }
}
