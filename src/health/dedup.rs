//! Merging the two reports of one XID: the driver prints each XID to the kernel log and
//! usually also delivers it as an NVML event; the [`Deduper`] decides whether a report is the
//! other source's view of an occurrence already seen.

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
    /// A fault not seen before: act on it.
    New,
    /// The other source's report of a fault already acted on.
    Duplicate,
}

/// How many recent reports a [`Deduper`] remembers.
pub const DEDUP_CAPACITY: usize = 64;

/// Pairs kernel-log and NVML reports of the same XID.
///
/// The driver reports most XIDs both ways; acting on both would double
/// every count. A report is a duplicate when the *other* source already
/// reported the same (bus id, code) within `window` of it, and that report
/// has not been paired yet. Reports from the same source are never merged:
/// two kernel log lines are two faults.
///
/// Timestamps are microseconds on one clock chosen by the caller (the kmsg
/// timestamp and `CLOCK_MONOTONIC` at NVML delivery are close enough for a
/// window of a second or two). Arrival order does not matter.
///
/// Memory is bounded: a fixed ring of [`DEDUP_CAPACITY`] entries (a few
/// kilobytes, no heap). When more distinct reports than that arrive within
/// one window, the oldest are forgotten and a late partner is counted as
/// new. That errs towards double counting during a storm rather than
/// dropping a real fault.
#[derive(Debug, Clone)]
pub struct Deduper {
    window_us: u64,
    ring: [Option<Sighting>; DEDUP_CAPACITY],
    next: usize,
}

/// One remembered report.
#[derive(Debug, Clone, Copy)]
struct Sighting {
    address: PciAddress,
    code: u32,
    source: XidSource,
    at_us: u64,
    paired: bool,
}

impl Deduper {
    /// A deduper that pairs reports at most `window` apart.
    pub fn new(window: Duration) -> Self {
        Self {
            window_us: u64::try_from(window.as_micros()).unwrap_or(u64::MAX),
            ring: [None; DEDUP_CAPACITY],
            next: 0,
        }
    }

    /// Records a report and says whether it is a new occurrence.
    ///
    /// A bus id that is not a PCI address is always new and not remembered.
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
        if let Some(partner) = self.partner(address, code, source, at_us) {
            partner.paired = true;
            return Occurrence::Duplicate;
        }
        if let Some(slot) = self.ring.get_mut(self.next) {
            *slot = Some(Sighting {
                address,
                code,
                source,
                at_us,
                paired: false,
            });
        }
        self.next = (self.next + 1) % DEDUP_CAPACITY;
        Occurrence::New
    }

    /// The unpaired report from the other source closest in time.
    fn partner(
        &mut self,
        address: PciAddress,
        code: u32,
        source: XidSource,
        at_us: u64,
    ) -> Option<&mut Sighting> {
        let window_us = self.window_us;
        self.ring
            .iter_mut()
            .flatten()
            .filter(|seen| {
                !seen.paired
                    && seen.address == address
                    && seen.code == code
                    && seen.source != source
                    && seen.at_us.abs_diff(at_us) <= window_us
            })
            .min_by_key(|seen| seen.at_us.abs_diff(at_us))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bus(text: &str) -> PciBusId {
        PciBusId::from_nvml(text)
    }

    const WINDOW: Duration = Duration::from_secs(2);
    const SEC: u64 = 1_000_000;

    #[test]
    fn kmsg_then_nvml_is_one_occurrence() {
        let mut dedup = Deduper::new(WINDOW);
        let kmsg = dedup.observe(XidSource::Kmsg, &bus("PCI:0000:3b:00"), 79, 10 * SEC);
        let nvml = dedup.observe(XidSource::Nvml, &bus("00000000:3B:00.0"), 79, 11 * SEC);
        assert_eq!((kmsg, nvml), (Occurrence::New, Occurrence::Duplicate));
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
        let _ = dedup.observe(XidSource::Kmsg, &bus("0000:3b:00"), 79, 0);
        assert_eq!(
            dedup.observe(XidSource::Nvml, &bus("0000:3b:00"), 79, 2 * SEC),
            Occurrence::Duplicate
        );
        let _ = dedup.observe(XidSource::Kmsg, &bus("0000:3b:00"), 79, 10 * SEC);
        assert_eq!(
            dedup.observe(XidSource::Nvml, &bus("0000:3b:00"), 79, 12 * SEC + 1),
            Occurrence::New
        );
    }

    #[test]
    fn different_gpu_code_or_same_source_are_new() {
        let mut dedup = Deduper::new(WINDOW);
        let _ = dedup.observe(XidSource::Kmsg, &bus("0000:3b:00"), 79, SEC);
        assert_eq!(
            dedup.observe(XidSource::Nvml, &bus("0000:3c:00"), 79, SEC),
            Occurrence::New
        );
        assert_eq!(
            dedup.observe(XidSource::Nvml, &bus("0000:3b:00"), 48, SEC),
            Occurrence::New
        );
        assert_eq!(
            dedup.observe(XidSource::Kmsg, &bus("0000:3b:00"), 79, SEC),
            Occurrence::New
        );
    }

    #[test]
    fn each_report_pairs_at_most_once() {
        let mut dedup = Deduper::new(WINDOW);
        let _ = dedup.observe(XidSource::Kmsg, &bus("0000:3b:00"), 13, SEC);
        let _ = dedup.observe(XidSource::Kmsg, &bus("0000:3b:00"), 13, SEC + 500_000);
        // Two kernel lines, two NVML events: two pairs, then a new one.
        let verdicts: Vec<_> = [SEC + 100_000, SEC + 600_000, SEC + 700_000]
            .into_iter()
            .map(|at| dedup.observe(XidSource::Nvml, &bus("0000:3b:00"), 13, at))
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
    fn pairs_with_the_closest_report() {
        let mut dedup = Deduper::new(WINDOW);
        let _ = dedup.observe(XidSource::Kmsg, &bus("0000:3b:00"), 13, SEC);
        let _ = dedup.observe(XidSource::Kmsg, &bus("0000:3b:00"), 13, 2 * SEC);
        // Closest to 2 s is the second line; the first stays free for a
        // report near it.
        assert_eq!(
            dedup.observe(XidSource::Nvml, &bus("0000:3b:00"), 13, 2 * SEC + 100),
            Occurrence::Duplicate
        );
        assert_eq!(
            dedup.observe(XidSource::Nvml, &bus("0000:3b:00"), 13, SEC - 100),
            Occurrence::Duplicate
        );
    }

    #[test]
    fn memory_is_bounded_by_the_ring() {
        let mut dedup = Deduper::new(WINDOW);
        let _ = dedup.observe(XidSource::Kmsg, &bus("0000:3b:00"), 79, SEC);
        // A storm of distinct reports pushes the first one out.
        for code in (1000..).take(DEDUP_CAPACITY) {
            let _ = dedup.observe(XidSource::Kmsg, &bus("0000:3c:00"), code, SEC);
        }
        assert_eq!(
            dedup.observe(XidSource::Nvml, &bus("0000:3b:00"), 79, SEC),
            Occurrence::New
        );
    }

    #[test]
    fn unparseable_bus_ids_are_always_new() {
        let mut dedup = Deduper::new(WINDOW);
        let _ = dedup.observe(XidSource::Kmsg, &bus("garbage"), 79, SEC);
        assert_eq!(
            dedup.observe(XidSource::Nvml, &bus("garbage"), 79, SEC),
            Occurrence::New
        );
    }

    #[test]
    fn huge_window_does_not_overflow() {
        let mut dedup = Deduper::new(Duration::MAX);
        let _ = dedup.observe(XidSource::Kmsg, &bus("0000:3b:00"), 79, 0);
        assert_eq!(
            dedup.observe(XidSource::Nvml, &bus("0000:3b:00"), 79, u64::MAX),
            Occurrence::Duplicate
        );
    }
}
