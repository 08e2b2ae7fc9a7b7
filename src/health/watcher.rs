//! The health watcher: runs the three sources and folds them into the inventory.
//!
//! NVML events arrive on their own thread, the kernel log on another; polled signals are read
//! on a blocking thread every poll interval. One task owns the [`Tracker`] and, after each
//! batch of inputs, writes its verdicts into the inventory — which publishes only when a
//! device's health actually changed, so a storm is one publish.
//!
//! XIDs are counted exactly: the source threads hand their reports over bounded queues that
//! make them wait rather than drop when full, and the task records each occurrence (the NVML
//! event and the kernel-log line of one XID merged by the [`Deduper`]) in the [`XidLedger`]
//! in the same step that feeds the tracker.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::dedup::{Deduper, Occurrence, XidSource};
use super::evidence;
use super::kept::{KeptVerdicts, NodeEvents};
use super::kmsg_source;
use super::tracker::{Tracker, TrackerConfig};
use crate::daemon::ReadyLatch;
use crate::inventory::transitions;
use crate::inventory::{Inventory, PciBusId, Snapshot};
use crate::nvml::events::{EventKind, GpuEvent};
use crate::nvml::{Nvml, NvmlError};
use crate::remediation_state::{GpuRemediation, record};
use crate::xid::catalog::XidPolicy;
use crate::xid::counts::DropSource;
use crate::xid::kmsg::KmsgEvent;
use crate::xid::ledger::XidLedger;

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
    /// Where verdicts only an event proves are kept across restarts ([`KeptVerdicts`]);
    /// `None` keeps nothing.
    pub kept_file: Option<PathBuf>,
    /// The remediation record of this node's gpud (`<state-dir>/remediation.json`), followed
    /// for the resets it ran: in a DaemonSet the remediation runs in another container.
    pub remediation_record: Option<PathBuf>,
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
            kept_file: None,
            remediation_record: None,
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
    // Resolution of the watcher's configuration: NVIDIA's DP_* variables are read here.
    #[allow(clippy::disallowed_methods)]
    pub fn resolve(
        flags: WatcherOverrides<'_>,
        file: &crate::config::HealthSection,
    ) -> (WatcherConfig, Vec<String>) {
        let disable = std::env::var(crate::xid::catalog::ENV_DISABLE_HEALTHCHECKS).ok();
        let enable = std::env::var(crate::xid::catalog::ENV_ENABLE_HEALTHCHECKS).ok();
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

/// Queue depth between each source thread and the tracker. A full queue makes the source
/// thread wait (the NVML driver and the kernel keep their own queues meanwhile); nothing is
/// dropped.
const QUEUE: usize = 1024;

/// Runs until `cancel` fires. Fails only when the NVML event source cannot be set up.
pub async fn run(
    cancel: CancellationToken,
    nvml: Nvml,
    inventory: Inventory,
    config: WatcherConfig,
) -> Result<(), NvmlError> {
    run_with_xids(
        cancel,
        nvml,
        inventory,
        config,
        None,
        ReadyLatch::detached(),
        None,
    )
    .await
}

/// [`run`], also recording every XID occurrence (ignored ones included, the NVML and
/// kernel-log reports of one occurrence merged) in `xids`, which it publishes after each batch.
/// `ready` is set once the NVML event set is registered and the kernel log followed: from then
/// on no fault goes unseen, which is what the watcher's readiness means; it is unset, naming
/// the file and the error, while the kept verdicts cannot be written. `node_events`, when given,
/// says a damaged kept-verdicts file on the Node.
pub async fn run_with_xids(
    cancel: CancellationToken,
    nvml: Nvml,
    inventory: Inventory,
    config: WatcherConfig,
    xids: Option<XidLedger>,
    ready: ReadyLatch,
    node_events: Option<NodeEvents>,
) -> Result<(), NvmlError> {
    let (event_tx, events) = mpsc::channel(QUEUE);
    // ECC events count whatever the XID policy says, so the event source always runs.
    let event_thread = nvml.watch_events(event_tx)?;
    let (kmsg_tx, kmsg) = mpsc::channel(QUEUE);
    let kmsg_thread = config
        .kmsg_path
        .as_deref()
        .and_then(|path| kmsg_source::start(path, kmsg_tx));
    let mut tracker = Tracker::new(config.policy.clone(), config.tracker.clone());
    let mut kept = config.kept_file.clone().map(|path| {
        KeptVerdicts::new(path)
            .reporting_on(ready.clone())
            .with_events(node_events)
    });
    let mut proven = None;
    if let Some(kept) = &mut kept {
        // Before readiness, with a first poll: a GPU that still needs a reset is never offered
        // in between, and one reset while gpud was down is not withdrawn for a poll interval.
        let held = kept.restore(&mut tracker, &inventory.current());
        poll_into(&nvml, &mut tracker).await;
        publish(&inventory, &tracker);
        kept.save_now(&tracker, &inventory.current());
        if !held.is_empty() {
            let lib = nvml.library_path().to_path_buf();
            proven = Some(evidence::start(
                held,
                lib,
                config.poll_interval,
                cancel.child_token(),
            ));
        }
    }
    match &kept {
        Some(kept) => kept.outcome().registered(),
        None => ready.set(),
    }
    let mut queues = Queues {
        events,
        kmsg,
        proven,
    };
    let mut state = State {
        tracker,
        dedup: Deduper::new(config.dedup_window),
        xids,
        origin: Instant::now(),
        forgotten: 0,
        kept,
        resets_seen: BTreeMap::new(),
        record: config.remediation_record.clone().map(record::Follower::new),
    };
    watch(&cancel, &nvml, &inventory, &config, &mut queues, &mut state).await;
    // The event thread may be waiting to hand over an event: closing its queue first lets it
    // see that nobody listens any more, so joining it (dropping the watcher) cannot hang.
    drop(queues);
    drop(event_thread);
    drop(kmsg_thread);
    Ok(())
}

/// The receiving ends of the source threads' queues.
struct Queues {
    events: mpsc::Receiver<GpuEvent>,
    kmsg: mpsc::Receiver<KmsgEvent>,
    /// The GPUs held for want of fresh evidence whose doctor's checks passed, by UUID.
    proven: Option<mpsc::UnboundedReceiver<String>>,
}

/// What the watcher keeps between batches.
struct State {
    tracker: Tracker,
    dedup: Deduper,
    xids: Option<XidLedger>,
    /// Zero of the de-duplicator's clock.
    origin: Instant,
    /// The de-duplicator's forgotten count already passed to the ledger.
    forgotten: u64,
    /// Where the verdicts only an event proves are kept, if anywhere.
    kept: Option<KeptVerdicts>,
    /// When the last reset gpud's remediation reported for each GPU (by UUID) finished.
    resets_seen: BTreeMap<String, u64>,
    /// The remediation record file, when there is a state directory.
    record: Option<record::Follower>,
}

async fn watch(
    cancel: &CancellationToken,
    nvml: &Nvml,
    inventory: &Inventory,
    config: &WatcherConfig,
    queues: &mut Queues,
    state: &mut State,
) {
    let mut changes = inventory.subscribe();
    let mut poll = tokio::time::interval(config.poll_interval);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick fires at once: an initial poll before anything else.
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            Some(event) = queues.events.recv() => {
                state.batch(inventory, event, &mut queues.events, State::on_event);
                // The driver says what a fault needs (the recovery action) right after it:
                // polling then, after this batch's verdict is published, lets a reset that
                // follows within one poll interval be seen.
                poll.reset_immediately();
            }
            Some(line) = queues.kmsg.recv() => {
                state.batch(inventory, line, &mut queues.kmsg, State::on_kmsg);
                poll.reset_immediately();
            }
            _ = poll.tick() => {
                state.follow_record(inventory);
                poll_into(nvml, &mut state.tracker).await;
            }
            Some(uuid) = next_proven(&mut queues.proven) => state.on_proven(inventory, &uuid),
            Ok(()) = changes.changed() => {
                let snapshot = changes.borrow_and_update().clone();
                let reported = snapshot.gpus.iter().filter_map(|g| Some((g.index, g.uuid.as_str(), g.remediation.as_ref()?)));
                state.on_resets(reported);
            }
        }
        state.tracker.tick(SystemTime::now());
        publish(inventory, &state.tracker);
        if let Some(kept) = &mut state.kept {
            kept.save(&state.tracker, &inventory.current());
        }
    }
}

/// The next GPU proven by the doctor's checks; pending forever when none is held.
async fn next_proven(queue: &mut Option<mpsc::UnboundedReceiver<String>>) -> Option<String> {
    match queue {
        Some(queue) => queue.recv().await,
        None => std::future::pending().await,
    }
}

/// Polls every GPU's signals (on a blocking thread) into the tracker.
async fn poll_into(nvml: &Nvml, tracker: &mut Tracker) {
    let poller = nvml.clone();
    match tokio::task::spawn_blocking(move || poller.poll_signals()).await {
        Ok(signals) => {
            let now = SystemTime::now();
            for gpu in &signals {
                tracker.observe_signals(gpu, now);
            }
        }
        Err(err) => warn!(error = %crate::logging::error_chain(&err), "Signal poll failed"),
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

/// The GPUs of one snapshot by bus id, for one batch of reports.
struct GpuMap {
    snapshot: Arc<Snapshot>,
    by_bus: HashMap<PciBusId, u32>,
}

impl GpuMap {
    fn new(snapshot: Arc<Snapshot>) -> Self {
        let by_bus = snapshot
            .gpus
            .iter()
            .filter(|gpu| gpu.pci.bus_id.address().is_some())
            .map(|gpu| (gpu.pci.bus_id.clone(), gpu.index))
            .collect();
        GpuMap { snapshot, by_bus }
    }

    fn bus_id(&self, gpu: u32) -> Option<&PciBusId> {
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

impl State {
    /// Handles `first` and everything already queued behind it as one batch, against one
    /// snapshot, and publishes the XIDs once for all of them.
    fn batch<T>(
        &mut self,
        inventory: &Inventory,
        first: T,
        queue: &mut mpsc::Receiver<T>,
        handle: fn(&mut State, &GpuMap, T),
    ) {
        let gpus = GpuMap::new(inventory.current());
        handle(self, &gpus, first);
        while let Ok(item) = queue.try_recv() {
            handle(self, &gpus, item);
        }
        self.publish_xids();
    }

    /// Microseconds since the watcher started, on the monotonic clock: the de-duplicator's
    /// time, which a wall-clock step cannot disturb.
    fn now_us(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// One XID occurrence, after de-duplication: counted, then judged.
    /// Clears what a reset clears on each GPU gpud's remediation reports reset since this
    /// watcher last looked (at start: any reset it reports), as of when that reset finished,
    /// and holds out of service the GPUs it holds for a peer's reset.
    /// `reported` is `(index, uuid, remediation)` of each GPU, from the inventory of this
    /// process or from the record another process wrote.
    fn on_resets<'a>(
        &mut self,
        reported: impl Iterator<Item = (u32, &'a str, &'a GpuRemediation)>,
    ) {
        for (index, uuid, remediation) in reported {
            self.tracker
                .observe_hold(index, remediation.held_for.as_deref(), SystemTime::now());
            let Some(reset_ms) = remediation.last_reset_ms else {
                continue;
            };
            let seen = self.resets_seen.entry(uuid.to_owned()).or_insert(0);
            if reset_ms > *seen {
                *seen = reset_ms;
                let reset = SystemTime::UNIX_EPOCH + Duration::from_millis(reset_ms);
                self.tracker.observe_reset(index, reset, SystemTime::now());
            }
        }
    }

    /// The doctor's checks of the held GPU `uuid` passed: it returns to service (as far as
    /// its other conditions let it).
    fn on_proven(&mut self, inventory: &Inventory, uuid: &str) {
        let snapshot = inventory.current();
        let (Some(kept), Some(gpu)) = (
            self.kept.as_mut(),
            snapshot.gpus.iter().find(|gpu| gpu.uuid == uuid),
        ) else {
            return;
        };
        kept.proven(&mut self.tracker, gpu.index, uuid);
    }

    /// Reads the remediation record when it changed and takes the resets it reports.
    /// Each GPU's phase goes into the inventory too: the exporter of a container without the
    /// remediation shows it.
    fn follow_record(&mut self, inventory: &Inventory) {
        let Some(view) = self.record.as_mut().and_then(record::Follower::changed) else {
            return;
        };
        let snapshot = inventory.current();
        let reported = snapshot
            .gpus
            .iter()
            .filter_map(|g| Some((g.index, g.uuid.as_str(), view.gpus.get(&g.uuid)?)));
        self.on_resets(reported);
        inventory.update(|snapshot| {
            for gpu in &mut snapshot.gpus {
                if let Some(remediation) = view.gpus.get(&gpu.uuid) {
                    gpu.remediation = Some(remediation.clone());
                }
            }
        });
    }

    fn on_xid(&mut self, gpus: &GpuMap, gpu: u32, code: u32, mig: Option<(u32, u32)>) {
        let now = SystemTime::now();
        if let Some(ledger) = &self.xids {
            ledger.record(gpu, gpus.gpu_instance(gpu, mig), code, now);
        }
        self.tracker.observe_xid(gpu, code, mig, now);
    }

    fn on_event(&mut self, gpus: &GpuMap, event: GpuEvent) {
        match event.kind {
            EventKind::Xid(code) => {
                let at_us = self.now_us();
                if let Some(bus_id) = gpus.bus_id(event.gpu)
                    && self.dedup.observe(XidSource::Nvml, bus_id, code, at_us)
                        == Occurrence::Duplicate
                {
                    return;
                }
                self.on_xid(gpus, event.gpu, code, event.mig);
            }
            EventKind::DoubleBitEcc => self.tracker.observe_dbe_event(event.gpu, SystemTime::now()),
            EventKind::SingleBitEcc => self.tracker.observe_sbe_event(event.gpu, SystemTime::now()),
        }
    }

    fn on_kmsg(&mut self, gpus: &GpuMap, event: KmsgEvent) {
        let Some(&gpu) = gpus.by_bus.get(event.pci_bus_id()) else {
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
                let at_us = self.now_us();
                if self.dedup.observe(XidSource::Kmsg, pci_bus_id, code, at_us)
                    == Occurrence::Duplicate
                {
                    return;
                }
                self.on_xid(gpus, gpu, code, gpu_instance_id.zip(compute_instance_id));
            }
            // Not an XID report of its own (the driver prints XID 79 next to it, counted from
            // that line), but proof the GPU is gone even when that line was lost: health only.
            KmsgEvent::FallenOffBus { .. } => {
                self.tracker.observe_xid(gpu, 79, None, SystemTime::now());
            }
            KmsgEvent::GpuIdentified { .. } => {}
        }
    }

    /// Passes what the de-duplicator had to forget to the ledger, and wakes its readers.
    fn publish_xids(&mut self) {
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
