//! Where the sources' observations land, in the watcher's task: the [`Tracker`], the
//! de-duplicator that merges the NVML event and the kernel-log line of one XID, and the XID
//! ledger that counts every occurrence, all updated in the same step.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use crate::health::dedup::Deduper;
use crate::health::tracker::Tracker;
use crate::inventory::{PciBusId, Snapshot};
use crate::xid::counts::DropSource;
use crate::xid::ledger::XidLedger;

/// The judging state the sources feed.
#[derive(Debug)]
pub struct Observer {
    pub tracker: Tracker,
    pub dedup: Deduper,
    pub xids: Option<XidLedger>,
    /// Zero of the de-duplicator's clock.
    origin: Instant,
    /// The de-duplicator's forgotten count already passed to the ledger.
    forgotten: u64,
}

impl Observer {
    pub fn new(tracker: Tracker, dedup: Deduper, xids: Option<XidLedger>) -> Self {
        Observer {
            tracker,
            dedup,
            xids,
            origin: Instant::now(),
            forgotten: 0,
        }
    }

    /// Microseconds since the watcher started, on the monotonic clock: the de-duplicator's
    /// time, which a wall-clock step cannot disturb.
    pub fn now_us(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// One XID occurrence, after de-duplication: counted, then judged.
    pub fn on_xid(&mut self, gpus: &GpuMap, gpu: u32, code: u32, mig: Option<(u32, u32)>) {
        let now = SystemTime::now();
        if let Some(ledger) = &self.xids {
            ledger.record(gpu, gpus.gpu_instance(gpu, mig), code, now);
        }
        self.tracker.observe_xid(gpu, code, mig, now);
    }

    /// Passes what the de-duplicator had to forget to the ledger, and wakes its readers.
    pub fn publish_xids(&mut self) {
        let Some(ledger) = &self.xids else {
            return;
        };
        let forgotten = self.dedup.forgotten();
        ledger.record_dropped(
            DropSource::Dedup,
            forgotten - self.forgotten,
            SystemTime::now(),
        );
        self.forgotten = forgotten;
        ledger.publish();
    }
}

/// The GPUs of one snapshot by bus id, for one batch of reports.
#[derive(Debug)]
pub struct GpuMap {
    snapshot: Arc<Snapshot>,
    pub by_bus: HashMap<PciBusId, u32>,
}

impl GpuMap {
    pub fn new(snapshot: Arc<Snapshot>) -> Self {
        let by_bus = snapshot
            .gpus
            .iter()
            .filter(|gpu| gpu.pci.bus_id.address().is_some())
            .map(|gpu| (gpu.pci.bus_id.clone(), gpu.index))
            .collect();
        GpuMap { snapshot, by_bus }
    }

    pub fn bus_id(&self, gpu: u32) -> Option<&PciBusId> {
        self.snapshot.gpu(gpu).map(|g| &g.pci.bus_id)
    }

    /// The GPU instance an XID is counted against: the one the driver named, when the GPU has
    /// an instance with that id; the whole GPU otherwise.
    fn gpu_instance(&self, gpu: u32, mig: Option<(u32, u32)>) -> Option<u32> {
        let (gi, _) = mig?;
        self.snapshot
            .gpu(gpu)
            .is_some_and(|g| g.mig.devices.iter().any(|m| m.gpu_instance_id == gi))
            .then_some(gi)
    }
}
