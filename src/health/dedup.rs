//! Merging the two reports of one XID.
//!
//! The driver reports most XIDs twice: as an `NVRM: Xid` line in the kernel log and as an NVML
//! event. Counting both would double every count, so the [`Deduper`] pairs them: a report is a
//! duplicate when the *other* source reported the same (bus id, code) within the window and
//! that report has not been paired yet. Reports from one source are never merged with each
//! other — two kernel-log lines are two faults, and so are two NVML events — so a storm from
//! one source is counted in full. Pairing is first-in first-out: the n-th kernel-log line for a
//! (bus id, code) pairs with the n-th NVML event for it.
//!
//! Memory is bounded without losing counts. Unpaired reports of one (bus id, code) from one
//! source are kept as runs (a count per slice of a sixteenth of the window), and a run is
//! forgotten once it is older than the window, when no partner can come any more: a storm of
//! 10 000 NVML events that the kernel log never prints costs a handful of runs. Only when more
//! than [`MAX_KEYS`] distinct (bus id, code) pairs are waiting at once, or one pair's runs
//! alternate between sources more than [`MAX_RUNS`] times within a window, are unpaired reports
//! forgotten early; a partner arriving later is then counted as a new occurrence (an over-count,
//! never a lost fault), and [`Deduper::forgotten`] says how many reports that concerned so the
//! exporter can show it.
//!
//! Pure: the caller passes the time of each report, in microseconds on one monotonic clock.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::inventory::PciBusId;
use crate::inventory::pci_bus_id::PciAddress;

/// Where an XID report came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XidSource {
    /// Parsed from the kernel log.
    Kmsg,
    /// Delivered by an NVML event set.
    Nvml,
}

/// The verdict of [`Deduper::observe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Occurrence {
    /// A fault not seen before: count it and act on it.
    New,
    /// The other source's report of a fault already counted.
    Duplicate,
}

/// Most (bus id, code) pairs with unpaired reports remembered at once.
pub const MAX_KEYS: usize = 1024;

/// Most runs remembered for one (bus id, code) pair.
pub const MAX_RUNS: usize = 64;

/// Runs per window: reports of one source less than `window / RUNS_PER_WINDOW` apart share a
/// run.
const RUNS_PER_WINDOW: u64 = 16;

/// Unpaired reports of one source, close in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    source: XidSource,
    first_us: u64,
    last_us: u64,
    count: u64,
}

impl Run {
    /// Whether some report of the run is within `window_us` of `at_us`.
    fn overlaps(&self, at_us: u64, window_us: u64) -> bool {
        self.first_us <= at_us.saturating_add(window_us)
            && self.last_us.saturating_add(window_us) >= at_us
    }

    /// Whether every report of the run is more than `window_us` before `at_us`.
    fn expired(&self, at_us: u64, window_us: u64) -> bool {
        self.last_us.saturating_add(window_us) < at_us
    }
}

/// Pairs kernel-log and NVML reports of the same XID; see the module documentation.
#[derive(Debug, Clone)]
pub struct Deduper {
    window_us: u64,
    run_us: u64,
    pending: HashMap<(PciAddress, u32), VecDeque<Run>>,
    forgotten: u64,
}

impl Deduper {
    /// A deduper that pairs reports at most `window` apart.
    pub fn new(window: Duration) -> Self {
        let window_us = u64::try_from(window.as_micros()).unwrap_or(u64::MAX);
        Self {
            window_us,
            run_us: window_us / RUNS_PER_WINDOW,
            pending: HashMap::new(),
            forgotten: 0,
        }
    }

    /// Records a report seen at `at_us` and says whether it is a new occurrence. A bus id that
    /// is not a PCI address is always new and not remembered.
    pub fn observe(
        &mut self,
        source: XidSource,
        bus_id: &PciBusId,
        code: u32,
        at_us: u64,
    ) -> Occurrence {
        let Some(address) = bus_id.address() else {
            return Occurrence::New;
        };
        let key = (address, code);
        let (window_us, run_us) = (self.window_us, self.run_us);
        if let Some(runs) = self.pending.get_mut(&key) {
            while runs
                .front()
                .is_some_and(|run| run.expired(at_us, window_us))
            {
                runs.pop_front();
            }
            let partner = runs
                .iter()
                .position(|run| run.source != source && run.overlaps(at_us, window_us));
            if let Some(index) = partner {
                if let Some(run) = runs.get_mut(index) {
                    run.count -= 1;
                    if run.count == 0 {
                        runs.remove(index);
                    }
                }
                if runs.is_empty() {
                    self.pending.remove(&key);
                }
                return Occurrence::Duplicate;
            }
        } else if self.pending.len() >= MAX_KEYS {
            self.make_room(at_us);
        }
        let runs = self.pending.entry(key).or_default();
        let joins_last = runs.back().is_some_and(|last| {
            last.source == source
                && (at_us.abs_diff(last.first_us) <= run_us || runs.len() >= MAX_RUNS)
        });
        match runs.back_mut() {
            Some(last) if joins_last => {
                last.count += 1;
                last.first_us = last.first_us.min(at_us);
                last.last_us = last.last_us.max(at_us);
            }
            _ => {
                if runs.len() >= MAX_RUNS
                    && let Some(oldest) = runs.pop_front()
                {
                    self.forgotten += oldest.count;
                }
                runs.push_back(Run {
                    source,
                    first_us: at_us,
                    last_us: at_us,
                    count: 1,
                });
            }
        }
        Occurrence::New
    }

    /// Unpaired reports forgotten before their window passed (see the module documentation);
    /// monotonic.
    pub fn forgotten(&self) -> u64 {
        self.forgotten
    }

    /// Frees a key slot: first by dropping everything that expired, then, if every pair is
    /// still live, by forgetting the pair heard from longest ago.
    fn make_room(&mut self, at_us: u64) {
        let window_us = self.window_us;
        self.pending.retain(|_, runs| {
            runs.retain(|run| !run.expired(at_us, window_us));
            !runs.is_empty()
        });
        if self.pending.len() < MAX_KEYS {
            return;
        }
        let stalest = self
            .pending
            .iter()
            .min_by_key(|(_, runs)| runs.back().map_or(0, |run| run.last_us))
            .map(|(key, _)| *key);
        if let Some(runs) = stalest.and_then(|key| self.pending.remove(&key)) {
            self.forgotten += runs.iter().map(|run| run.count).sum::<u64>();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(2);
    const SEC: u64 = 1_000_000;

    fn bus(text: &str) -> PciBusId {
        PciBusId::from_nvml(text)
    }

    /// Reports waiting for a partner.
    fn pending(dedup: &Deduper) -> u64 {
        dedup.pending.values().flatten().map(|run| run.count).sum()
    }

    #[test]
    fn kmsg_then_nvml_is_one_occurrence() {
        let mut dedup = Deduper::new(WINDOW);
        let kmsg = dedup.observe(XidSource::Kmsg, &bus("PCI:0000:3b:00"), 79, 10 * SEC);
        let nvml = dedup.observe(XidSource::Nvml, &bus("00000000:3B:00.0"), 79, 11 * SEC);
        assert_eq!((kmsg, nvml), (Occurrence::New, Occurrence::Duplicate));
        assert_eq!(pending(&dedup), 0);
    }

    #[test]
    fn nvml_then_kmsg_is_one_occurrence() {
        let mut dedup = Deduper::new(WINDOW);
        let nvml = dedup.observe(XidSource::Nvml, &bus("00000000:3B:00.0"), 48, 10 * SEC);
        let kmsg = dedup.observe(XidSource::Kmsg, &bus("0000:3b:00.0"), 48, 10 * SEC - 1);
        assert_eq!((nvml, kmsg), (Occurrence::New, Occurrence::Duplicate));
    }

    #[test]
    fn window_is_inclusive_and_bounded() {
        let mut dedup = Deduper::new(WINDOW);
        let id = bus("0000:3b:00");
        let _ = dedup.observe(XidSource::Kmsg, &id, 79, 0);
        assert_eq!(
            dedup.observe(XidSource::Nvml, &id, 79, 2 * SEC),
            Occurrence::Duplicate
        );
        let _ = dedup.observe(XidSource::Kmsg, &id, 79, 10 * SEC);
        assert_eq!(
            dedup.observe(XidSource::Nvml, &id, 79, 12 * SEC + 1),
            Occurrence::New
        );
    }

    #[test]
    fn different_gpu_code_or_same_source_are_new() {
        let mut dedup = Deduper::new(WINDOW);
        let id = bus("0000:3b:00");
        let _ = dedup.observe(XidSource::Kmsg, &id, 79, SEC);
        assert_eq!(
            dedup.observe(XidSource::Nvml, &bus("0000:3c:00"), 79, SEC),
            Occurrence::New
        );
        assert_eq!(
            dedup.observe(XidSource::Nvml, &id, 48, SEC),
            Occurrence::New
        );
        assert_eq!(
            dedup.observe(XidSource::Kmsg, &id, 79, SEC),
            Occurrence::New
        );
    }

    #[test]
    fn each_report_pairs_at_most_once() {
        let mut dedup = Deduper::new(WINDOW);
        let id = bus("0000:3b:00");
        let _ = dedup.observe(XidSource::Kmsg, &id, 13, SEC);
        let _ = dedup.observe(XidSource::Kmsg, &id, 13, SEC + 500_000);
        // Two kernel lines, three NVML events: two pairs, then a new one.
        let verdicts: Vec<_> = [SEC + 100_000, SEC + 600_000, SEC + 700_000]
            .into_iter()
            .map(|at| dedup.observe(XidSource::Nvml, &id, 13, at))
            .collect();
        assert_eq!(
            verdicts,
            [
                Occurrence::Duplicate,
                Occurrence::Duplicate,
                Occurrence::New
            ]
        );
    }

    #[test]
    fn a_storm_from_one_source_is_counted_in_full_in_little_memory() {
        let mut dedup = Deduper::new(WINDOW);
        let id = bus("00000000:18:00.0");
        let codes = [94, 46, 13, 79];
        let new = (0..10_000u64)
            .filter(|&i| {
                let code = codes[(i % 4) as usize];
                dedup.observe(XidSource::Nvml, &id, code, SEC + i * 10) == Occurrence::New
            })
            .count();
        assert_eq!(new, 10_000, "one source's reports never merge");
        assert_eq!(pending(&dedup), 10_000);
        let runs: usize = dedup.pending.values().map(VecDeque::len).sum();
        assert!(runs <= 4 * 2, "{runs} runs for 4 codes within one window");
        assert_eq!(dedup.forgotten(), 0);
    }

    #[test]
    fn a_storm_seen_by_both_sources_counts_once_per_fault() {
        let mut dedup = Deduper::new(WINDOW);
        let id = bus("00000000:18:00.0");
        let codes = [94, 46, 13, 79];
        // The kernel log runs ahead by a thousand lines, then NVML catches up.
        let mut new = 0;
        for i in 0..5_000u64 {
            let code = codes[(i % 4) as usize];
            if dedup.observe(XidSource::Kmsg, &id, code, SEC + i * 100) == Occurrence::New {
                new += 1;
            }
            if i >= 1_000 {
                let j = i - 1_000;
                let code = codes[(j % 4) as usize];
                if dedup.observe(XidSource::Nvml, &id, code, SEC + i * 100) == Occurrence::New {
                    new += 1;
                }
            }
        }
        for j in 4_000..5_000u64 {
            let code = codes[(j % 4) as usize];
            if dedup.observe(XidSource::Nvml, &id, code, SEC + 500_000 + j * 10) == Occurrence::New
            {
                new += 1;
            }
        }
        assert_eq!(new, 5_000);
        assert_eq!(pending(&dedup), 0);
    }

    #[test]
    fn unpaired_reports_expire_after_the_window() {
        let mut dedup = Deduper::new(WINDOW);
        let id = bus("0000:3b:00");
        let _ = dedup.observe(XidSource::Nvml, &id, 79, 0);
        assert_eq!(
            dedup.observe(XidSource::Kmsg, &id, 79, 3 * SEC),
            Occurrence::New,
            "too late to be the same fault"
        );
        assert_eq!(pending(&dedup), 1, "only the kernel line waits now");
    }

    #[test]
    fn too_many_live_pairs_forget_the_stalest_and_say_so() {
        let mut dedup = Deduper::new(WINDOW);
        let first = bus("0000:3b:00");
        let _ = dedup.observe(XidSource::Kmsg, &first, 79, SEC);
        for code in (1000..).take(MAX_KEYS) {
            let _ = dedup.observe(XidSource::Kmsg, &bus("0000:3c:00"), code, SEC + 1);
        }
        assert_eq!(dedup.forgotten(), 1);
        assert_eq!(
            dedup.observe(XidSource::Nvml, &first, 79, SEC + 2),
            Occurrence::New,
            "its partner was forgotten: counted again rather than lost"
        );
        assert_eq!(dedup.forgotten(), 2, "remembering it took another slot");
        // Expired pairs make room without forgetting anything.
        let _ = dedup.observe(XidSource::Kmsg, &bus("0000:3d:00"), 1, 10 * SEC);
        assert_eq!(dedup.forgotten(), 2);
        assert_eq!(pending(&dedup), 1);
    }

    #[test]
    fn runs_per_pair_are_bounded() {
        let mut dedup = Deduper::new(Duration::MAX);
        let id = bus("0000:3b:00");
        // Stamps far apart and out of order: each would start a run of its own.
        for i in 0..1_000u64 {
            let at = if i % 2 == 0 { i } else { u64::MAX - i };
            let _ = dedup.observe(XidSource::Kmsg, &id, 13, at);
        }
        assert_eq!(pending(&dedup), 1_000);
        assert!(dedup.pending.values().all(|runs| runs.len() <= MAX_RUNS));
        assert_eq!(
            dedup.forgotten(),
            0,
            "same-source runs merge, none is forgotten"
        );
    }

    #[test]
    fn unparsed_bus_ids_are_always_new() {
        let mut dedup = Deduper::new(WINDOW);
        let garbage = bus("garbage");
        let _ = dedup.observe(XidSource::Kmsg, &garbage, 79, SEC);
        assert_eq!(
            dedup.observe(XidSource::Nvml, &garbage, 79, SEC),
            Occurrence::New
        );
    }

    #[test]
    fn huge_window_does_not_overflow() {
        let mut dedup = Deduper::new(Duration::MAX);
        let id = bus("0000:3b:00");
        let _ = dedup.observe(XidSource::Kmsg, &id, 79, 0);
        assert_eq!(
            dedup.observe(XidSource::Nvml, &id, 79, u64::MAX),
            Occurrence::Duplicate
        );
    }
}
