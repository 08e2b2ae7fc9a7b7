//! The health watcher: runs the three sources and folds them into the inventory.
//!
//! NVML events arrive on their own thread, the kernel log on another; polled signals are read
//! on a blocking thread every poll interval. One task owns the [`Tracker`] and, after each
//! batch of inputs, writes its verdicts into the inventory — which publishes only when a
//! device's health actually changed, so a storm is one publish.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::dedup::{Deduper, Occurrence, XidSource};
use super::kmsg::KmsgEvent;
use super::kmsg_source;
use super::tracker::{Tracker, TrackerConfig};
use super::transitions;
use super::xid::XidPolicy;
use crate::inventory::{Inventory, PciBusId, Snapshot};
use crate::nvml::events::{EventKind, GpuEvent};
use crate::nvml::{GpuSignals, Nvml, NvmlError};

/// Settings of the watcher.
#[derive(Debug, Clone)]
pub struct WatcherConfig {
    /// How often counters, temperatures, links and reachability are polled.
    pub poll_interval: Duration,
    /// Kernel log to follow; `None` disables the kernel-log source.
    pub kmsg_path: Option<PathBuf>,
    /// Which XIDs count.
    pub policy: XidPolicy,
    /// Recovery timing and history size.
    pub tracker: TrackerConfig,
    /// An NVML event and a kernel-log line for the same XID within this window are one
    /// occurrence.
    pub dedup_window: Duration,
}

/// Default poll interval.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);

impl Default for WatcherConfig {
    fn default() -> Self {
        WatcherConfig {
            poll_interval: DEFAULT_POLL_INTERVAL,
            kmsg_path: Some(PathBuf::from(kmsg_source::DEFAULT_KMSG_PATH)),
            policy: XidPolicy::default(),
            tracker: TrackerConfig::default(),
            dedup_window: Duration::from_secs(2),
        }
    }
}

/// Health settings given on the command line (or through their environment variables);
/// `None` means not given.
#[derive(Debug, Clone, Copy, Default)]
pub struct WatcherOverrides<'a> {
    pub poll_interval: Option<Duration>,
    pub xid_quiet_period: Option<Duration>,
    /// Kernel log path; `""` disables the kernel-log source.
    pub kmsg: Option<&'a str>,
}

impl WatcherConfig {
    /// Flags over gpud's config file over the defaults, with the XID policy from the config
    /// file and NVIDIA's `DP_DISABLE_HEALTHCHECKS` / `DP_ENABLE_HEALTHCHECKS`. Returns the
    /// warnings about malformed XID lists, to be logged once.
    pub fn resolve(
        flags: WatcherOverrides<'_>,
        file: &crate::config::HealthSection,
    ) -> (WatcherConfig, Vec<String>) {
        let disable = std::env::var(super::xid::ENV_DISABLE_HEALTHCHECKS).ok();
        let enable = std::env::var(super::xid::ENV_ENABLE_HEALTHCHECKS).ok();
        let (policy, warnings) =
            XidPolicy::from_config_and_env(&file.xid, disable.as_deref(), enable.as_deref());
        let kmsg_path = match (flags.kmsg, &file.kmsg_path) {
            (Some(flag), _) => (!flag.is_empty()).then(|| PathBuf::from(flag)),
            (None, Some(from_file)) => from_file.clone(),
            (None, None) => Some(PathBuf::from(kmsg_source::DEFAULT_KMSG_PATH)),
        };
        let config = WatcherConfig {
            poll_interval: flags
                .poll_interval
                .or(file.poll_interval)
                .unwrap_or(DEFAULT_POLL_INTERVAL),
            kmsg_path,
            policy,
            tracker: TrackerConfig {
                xid_quiet_period: flags
                    .xid_quiet_period
                    .or(file.xid_quiet_period)
                    .unwrap_or(super::tracker::DEFAULT_XID_QUIET_PERIOD),
                ..TrackerConfig::default()
            },
            ..WatcherConfig::default()
        };
        (config, warnings)
    }
}

/// Queue depth between the source threads and the tracker.
const QUEUE: usize = 1024;

/// One XID occurrence, after the NVML event and the kernel-log line for it were merged:
/// what the exporter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidSeen {
    /// NVML index of the GPU.
    pub gpu: u32,
    /// The XID.
    pub code: u32,
    /// `(gpu instance, compute instance)` when the driver attributed it to a MIG device.
    pub mig: Option<(u32, u32)>,
    /// When gpud saw it.
    pub at: SystemTime,
}

/// Runs until `cancel` fires. Fails only when the NVML event source cannot be set up.
pub async fn run(
    cancel: CancellationToken,
    nvml: Nvml,
    inventory: Inventory,
    config: WatcherConfig,
) -> Result<(), NvmlError> {
    run_with_xids(cancel, nvml, inventory, config, None).await
}

/// [`run`], also sending every XID occurrence (ignored ones included, duplicates merged) to
/// `xids`. The send never waits: if the receiver falls behind, occurrences are dropped rather
/// than stalling health.
pub async fn run_with_xids(
    cancel: CancellationToken,
    nvml: Nvml,
    inventory: Inventory,
    config: WatcherConfig,
    xids: Option<mpsc::Sender<XidSeen>>,
) -> Result<(), NvmlError> {
    let (event_tx, mut events) = mpsc::channel(QUEUE);
    // ECC events count whatever the XID policy says, so the event source always runs.
    let _event_thread = nvml.watch_events(event_tx)?;
    let (kmsg_tx, mut kmsg) = mpsc::channel(QUEUE);
    let _kmsg_thread = config
        .kmsg_path
        .as_deref()
        .and_then(|path| kmsg_source::start(path, kmsg_tx));

    let mut tracker = Tracker::new(config.policy.clone(), config.tracker.clone());
    let mut dedup = Deduper::new(config.dedup_window);
    let mut poll = tokio::time::interval(config.poll_interval);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick fires at once: an initial poll before anything else.
    loop {
        tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            Some(event) = events.recv() => {
                let bus = bus_ids(&inventory.current());
                on_event(&mut tracker, &mut dedup, &bus, event, xids.as_ref());
                while let Ok(event) = events.try_recv() {
                    on_event(&mut tracker, &mut dedup, &bus, event, xids.as_ref());
                }
            }
            Some(line) = kmsg.recv() => {
                let bus = bus_ids(&inventory.current());
                on_kmsg(&mut tracker, &mut dedup, &bus, line, xids.as_ref());
                while let Ok(line) = kmsg.try_recv() {
                    on_kmsg(&mut tracker, &mut dedup, &bus, line, xids.as_ref());
                }
            }
            _ = poll.tick() => {
                let poller = nvml.clone();
                match tokio::task::spawn_blocking(move || poller.poll_signals()).await {
                    Ok(signals) => observe_all(&mut tracker, &signals),
                    Err(err) => warn!(error = %err, "Signal poll failed"),
                }
            }
        }
        tracker.tick(SystemTime::now());
        publish(&inventory, &tracker);
    }
}

fn observe_all(tracker: &mut Tracker, signals: &[GpuSignals]) {
    let now = SystemTime::now();
    for gpu in signals {
        tracker.observe_signals(gpu, now);
    }
}

/// Writes the tracker's verdicts into the inventory and logs each device that changed.
fn publish(inventory: &Inventory, tracker: &Tracker) {
    let before = inventory.current();
    if inventory.update(|snapshot| tracker.apply(snapshot)) {
        log_transitions(&before, &inventory.current());
    }
}

fn log_transitions(before: &Snapshot, after: &Snapshot) {
    for change in transitions::between(before, after) {
        info!(gpu = change.gpu, uuid = %change.uuid, "Health changed: {}", change.line());
    }
}

/// GPU bus ids by index, and the reverse.
struct BusMap {
    by_bus: HashMap<PciBusId, u32>,
    by_index: HashMap<u32, PciBusId>,
}

fn bus_ids(snapshot: &Snapshot) -> BusMap {
    let mut by_bus = HashMap::new();
    let mut by_index = HashMap::new();
    for gpu in &snapshot.gpus {
        if gpu.pci.bus_id.address().is_some() {
            by_bus.insert(gpu.pci.bus_id.clone(), gpu.index);
            by_index.insert(gpu.index, gpu.pci.bus_id.clone());
        }
    }
    BusMap { by_bus, by_index }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Passes an XID occurrence on to the exporter, if one listens.
fn forward(xids: Option<&mpsc::Sender<XidSeen>>, seen: XidSeen) {
    if let Some(tx) = xids {
        let _ = tx.try_send(seen);
    }
}

fn on_event(
    tracker: &mut Tracker,
    dedup: &mut Deduper,
    bus: &BusMap,
    event: GpuEvent,
    xids: Option<&mpsc::Sender<XidSeen>>,
) {
    let now = SystemTime::now();
    match event.kind {
        EventKind::Xid(code) => {
            if let Some(bus_id) = bus.by_index.get(&event.gpu)
                && dedup.observe(XidSource::Nvml, bus_id, code, now_us()) == Occurrence::Duplicate
            {
                return;
            }
            forward(
                xids,
                XidSeen {
                    gpu: event.gpu,
                    code,
                    mig: event.mig,
                    at: now,
                },
            );
            tracker.observe_xid(event.gpu, code, event.mig, now);
        }
        EventKind::DoubleBitEcc => tracker.observe_dbe_event(event.gpu, now),
        EventKind::SingleBitEcc => tracker.observe_sbe_event(event.gpu, now),
    }
}

fn on_kmsg(
    tracker: &mut Tracker,
    dedup: &mut Deduper,
    bus: &BusMap,
    event: KmsgEvent,
    xids: Option<&mpsc::Sender<XidSeen>>,
) {
    let now = SystemTime::now();
    let Some(&gpu) = bus.by_bus.get(event.pci_bus_id()) else {
        return; // a GPU this node's NVML does not know (or not a GPU at all)
    };
    match event {
        KmsgEvent::Xid {
            ref pci_bus_id,
            code,
            gpu_instance_id,
            compute_instance_id,
            ..
        } => {
            if dedup.observe(XidSource::Kmsg, pci_bus_id, code, now_us()) == Occurrence::Duplicate {
                return;
            }
            let mig = gpu_instance_id.zip(compute_instance_id);
            forward(
                xids,
                XidSeen {
                    gpu,
                    code,
                    mig,
                    at: now,
                },
            );
            tracker.observe_xid(gpu, code, mig, now);
        }
        KmsgEvent::FallenOffBus { .. } => {
            forward(
                xids,
                XidSeen {
                    gpu,
                    code: 79,
                    mig: None,
                    at: now,
                },
            );
            tracker.observe_xid(gpu, 79, None, now);
        }
        KmsgEvent::GpuIdentified { .. } => {}
    }
}
