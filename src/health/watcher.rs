//! The health watcher: runs the sources of [`sources::table`] and folds what they see into
//! the inventory.
//!
//! Each source (NVML events, the kernel log, the polled signals) runs on its own thread or
//! task and hands its observations over one bounded queue that makes it wait rather than drop
//! when full. One task owns the [`Tracker`] and, after each batch of inputs, writes its
//! verdicts into the inventory — which publishes only when a device's health actually
//! changed, so a storm is one publish.
//!
//! XIDs are counted exactly: the task records each occurrence (the NVML event and the
//! kernel-log line of one XID merged by the de-duplicator) in the [`XidLedger`] in the same
//! step that feeds the tracker. A source that ends before the watcher stops it (a kernel log
//! that cannot be read any more) fails the watcher's readiness, naming the source and why:
//! the GPUs it fed are no longer fully watched.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use super::dedup::Deduper;
use super::evidence;
use super::kept::{KeptVerdicts, NodeEvents};
use super::sources::feed::{Report, Setup};
use super::sources::observer::{GpuMap, Observer};
use super::sources::{kmsg, poll, table};
use super::tracker::{HoldEnds, Tracker, TrackerConfig};
use crate::daemon::ReadyLatch;
use crate::inventory::transitions;
use crate::inventory::{Inventory, Snapshot};
use crate::nvml::{Nvml, NvmlError};
use crate::remediation_state::{GpuRemediation, Phase, record};
use crate::xid::catalog::XidPolicy;
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
            kmsg_path: Some(PathBuf::from(kmsg::DEFAULT_KMSG_PATH)),
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
    pub fn resolve(
        flags: WatcherOverrides<'_>,
        file: &crate::config::HealthSection,
    ) -> (WatcherConfig, Vec<String>) {
        let (policy, warnings) = crate::xid::configured::policy(&file.xid);
        let kmsg_path = match (flags.kmsg, &file.kmsg_path) {
            (Some(flag), _) => (!flag.is_empty()).then(|| PathBuf::from(flag)),
            (None, Some(from_file)) => from_file.clone(),
            (None, None) => Some(PathBuf::from(kmsg::DEFAULT_KMSG_PATH)),
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

/// Queue depth between the sources and the tracker. A full queue makes a source wait (the
/// NVML driver and the kernel keep their own queues meanwhile); nothing is dropped.
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
/// `ready` is set once every source has started (the NVML event set registered, the kernel log
/// followed): from then on no fault goes unseen, which is what the watcher's readiness means;
/// it is unset, naming the file and the error, while the kept verdicts cannot be written, and
/// failed for good, naming the source and the reason, when a source ends on its own.
/// `node_events`, when given, says a damaged kept-verdicts file on the Node.
pub async fn run_with_xids(
    cancel: CancellationToken,
    nvml: Nvml,
    inventory: Inventory,
    config: WatcherConfig,
    xids: Option<XidLedger>,
    ready: ReadyLatch,
    node_events: Option<NodeEvents>,
) -> Result<(), NvmlError> {
    let (feed, reports) = mpsc::channel(QUEUE);
    let poll_soon = Arc::new(Notify::new());
    let stop = cancel.child_token();
    let setup = Setup {
        nvml: &nvml,
        kmsg_path: config.kmsg_path.as_deref(),
        poll_interval: config.poll_interval,
        poll_soon: Arc::clone(&poll_soon),
        stop: stop.clone(),
    };
    let sources = table::start_all(&setup, &feed)?;
    // Only the sources hold the sending end: the queue closes when the last one is gone.
    drop(feed);
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
        if let Some(polled) = poll::poll_once(&nvml).await {
            polled.into_tracker(&mut tracker);
        }
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
    let mut queues = Queues { reports, proven };
    let mut state = State {
        observer: Observer::new(tracker, Deduper::new(config.dedup_window), xids),
        kept,
        resets_seen: BTreeMap::new(),
        record: config.remediation_record.clone().map(record::Follower::new),
        ready,
        poll_soon,
    };
    watch(&cancel, &inventory, &config, &mut queues, &mut state).await;
    // Every end from here on is expected. A source may be waiting to hand over an
    // observation: closing the queue first lets it see that nobody listens any more, so
    // stopping the sources (joining NVML's event thread) cannot hang.
    stop.cancel();
    drop(queues);
    drop(sources);
    Ok(())
}

/// The receiving ends of the watcher's queues.
struct Queues {
    reports: mpsc::Receiver<Report>,
    /// The GPUs held for want of fresh evidence whose doctor's checks passed, by UUID.
    proven: Option<mpsc::UnboundedReceiver<String>>,
}

/// What the watcher keeps between batches.
struct State {
    /// The tracker, the de-duplicator and the XID ledger the sources feed.
    observer: Observer,
    /// Where the verdicts only an event proves are kept, if anywhere.
    kept: Option<KeptVerdicts>,
    /// When the last reset gpud's remediation reported for each GPU (by UUID) finished.
    resets_seen: BTreeMap<String, u64>,
    /// The remediation record file, when there is a state directory.
    record: Option<record::Follower>,
    /// The watcher's readiness, failed when a source ends.
    ready: ReadyLatch,
    /// Asks the poll source for a poll now.
    poll_soon: Arc<Notify>,
}

async fn watch(
    cancel: &CancellationToken,
    inventory: &Inventory,
    config: &WatcherConfig,
    queues: &mut Queues,
    state: &mut State,
) {
    let mut changes = inventory.subscribe();
    // The remediation record is read as often as the signals are polled.
    let mut record = tokio::time::interval(config.poll_interval);
    record.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            Some(report) = queues.reports.recv() => {
                if state.batch(inventory, report, &mut queues.reports) {
                    state.poll_soon.notify_one();
                }
            }
            _ = record.tick() => state.follow_record(inventory),
            Some(uuid) = next_proven(&mut queues.proven) => state.on_proven(inventory, &uuid),
            Ok(()) = changes.changed() => {
                let snapshot = changes.borrow_and_update().clone();
                let reported = snapshot.gpus.iter().filter_map(|g| Some((g.index, g.uuid.as_str(), g.remediation.as_ref()?)));
                state.on_resets(reported);
            }
        }
        state.observer.tracker.tick(SystemTime::now());
        publish(inventory, &state.observer.tracker);
        if let Some(kept) = &mut state.kept {
            kept.save(&state.observer.tracker, &inventory.current());
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

impl State {
    /// Handles `first` and everything already queued behind it as one batch, against one
    /// snapshot, and publishes the XIDs once for all of them. Returns whether an observation
    /// of the batch asks for a poll right after it.
    fn batch(
        &mut self,
        inventory: &Inventory,
        first: Report,
        queue: &mut mpsc::Receiver<Report>,
    ) -> bool {
        let gpus = GpuMap::new(inventory.current());
        let mut poll = self.handle(&gpus, first);
        while let Ok(report) = queue.try_recv() {
            poll |= self.handle(&gpus, report);
        }
        self.observer.publish_xids();
        poll
    }

    /// One report: an observation into the tracker, or a source's end into readiness.
    fn handle(&mut self, gpus: &GpuMap, report: Report) -> bool {
        match report {
            Report::Seen(observation) => {
                let poll = observation.polls_after();
                observation.observe(&mut self.observer, gpus);
                poll
            }
            Report::Ended { source, reason } => {
                let why = format!("the {source} source stopped: {reason}");
                error!(source, reason = %reason, "Health source stopped; /readyz reports the health watcher failed, the other sources carry on");
                // Final: nothing restarts the source, so nothing may say ready again.
                self.ready.fail(why);
                false
            }
        }
    }

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
            let ends = if remediation.phase == Phase::Escalated {
                HoldEnds::ByHand
            } else {
                HoldEnds::WithTheReset
            };
            self.observer.tracker.observe_hold(
                index,
                remediation.held_for.as_deref().map(|why| (why, ends)),
                SystemTime::now(),
            );
            let Some(reset_ms) = remediation.last_reset_ms else {
                continue;
            };
            let seen = self.resets_seen.entry(uuid.to_owned()).or_insert(0);
            if reset_ms > *seen {
                *seen = reset_ms;
                let reset = SystemTime::UNIX_EPOCH + Duration::from_millis(reset_ms);
                self.observer
                    .tracker
                    .observe_reset(index, reset, SystemTime::now());
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
        kept.proven(&mut self.observer.tracker, gpu.index, uuid);
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
}
