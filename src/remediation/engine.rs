//! The per-GPU state machine: healthy → quarantined → draining → resetting → verifying →
//! healthy again, or → escalated. One step looks at every GPU once, with the snapshot the
//! health verdicts are in and a fresh poll of NVML's signals, and moves each as far as it can
//! go now. Every transition is logged once with its reason, sent as a Node event, written to
//! the record before anything acts on it (a restart resumes from there) and published in the
//! inventory.
//!
//! The safety rules, in the order they are checked:
//! - never a reset under a running process: a GPU is reset only when NVML lists no process on
//!   it (nor in its MIG instances); a drain that does not end by the deadline escalates;
//! - never a reset without a slot of the cluster-wide budget;
//! - never a second blind reset: a restart that finds a reset started goes on to verify
//!   when NVML shows the reset happened, and holds the GPU out of service otherwise;
//! - never a GPU back in service on a reset not proved: the health watchers are told of the
//!   reset (and clear what it cleared) only once NVML, the doctor's checks and the verify
//!   command passed; until then, and while escalated, the GPU is held out of service;
//! - never a reset loop: a GPU reset `--remediation-max-resets` times within the window, and
//!   a node where more than half of the GPUs failed within a minute, escalate instead.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tracing::{info, warn};

use super::args::{Mode, Settings};
use super::budget::{Budget, Slot};
use super::drain::Drainer;
use super::escalation::Escalation;
use super::mig_layout;
use super::need::{Need, need};
use super::{peers, verify};
use crate::child::command::{self, Outcome};
use crate::child::doctor;
use crate::inventory::health::HealthSource;
use crate::inventory::model::Gpu;
use crate::inventory::{HealthState, Inventory, Snapshot};
use crate::kube::EventSender;
use crate::kube::events::{Kind, NodeEvent};
use crate::nvml::GpuSignals;
use crate::nvml::processes::ProcessesRead;
use crate::remediation_state::metrics::Metrics;
use crate::remediation_state::record::{GpuRecord, Records, millis, seconds};
use crate::remediation_state::reset_marks::ResetMarks;
use crate::remediation_state::{GpuRemediation, Phase};

/// How long a reset GPU may take to look clean (its health verdict cleared, its counters
/// read back) before the verification fails.
pub const VERIFY_GRACE: Duration = Duration::from_secs(10);
/// The circuit breaker's window: more than half of the GPUs failing within it is a node fault.
pub const NODE_FAULT_WINDOW: Duration = Duration::from_secs(60);
/// How long the node must have been free of new GPU faults before a GPU is reset: a
/// node-level fault reaches its GPUs' health within moments of each other, not always in one
/// health sample, and the circuit breaker must see all of them before the first reset.
pub const SETTLE: Duration = Duration::from_millis(500);

/// Escalation reasons, least urgent first (the Node condition names the most urgent).
pub const DRAIN_TIMED_OUT: &str = "DrainTimedOut";
pub const REBOOT_REQUIRED: &str = "RebootRequired";
pub const RESET_FAILED: &str = "ResetFailed";
pub const HARDWARE_SUSPECTED: &str = "HardwareSuspected";
const URGENCY: [&str; 4] = [
    DRAIN_TIMED_OUT,
    REBOOT_REQUIRED,
    RESET_FAILED,
    HARDWARE_SUSPECTED,
];

/// Why a GPU that failed its checks after a reset stays out of service (its verdict quotes it).
pub const WITHHELD: &str =
    "it failed its checks after gpud reset it; it returns to service after the node reboots";
/// Why a GPU whose reset may have been cut short stays out of service.
pub const RESET_UNKNOWN: &str =
    "gpud cannot tell whether its reset ended; it returns to service after the node reboots";

/// What NVML says of every GPU at one step.
#[derive(Debug)]
pub struct Observed {
    /// Signals by GPU index.
    pub signals: BTreeMap<u32, GpuSignals>,
}

/// Where a GPU goes next, and why.
enum Next {
    Stay,
    /// The same phase with a new reason (said in the log, not as an event).
    Note(String),
    To(Phase, String),
    Escalate(&'static str, String),
    /// Escalate as `ResetFailed` and hold it out of service until the node reboots (why, in
    /// the verdict's words; the reason): it failed the checks after its reset, or its reset
    /// may not have ended, although its health verdict may look fine.
    Withhold(&'static str, String),
}

/// The state machine of every GPU of the node.
#[derive(Debug)]
pub struct Engine {
    settings: Settings,
    nvml: crate::nvml::Nvml,
    metrics: Metrics,
    pub records: Records,
    budget: Budget,
    slot: Option<Slot>,
    budget_failing: bool,
    drainer: Drainer,
    events: Option<EventSender>,
    escalation: Option<watch::Sender<Escalation>>,
    /// When which GPU left service lately, for the circuit breaker.
    recent_faults: VecDeque<(SystemTime, String)>,
    /// GPUs that passed every check of their current verification, and when (the health
    /// watchers were told of the reset then).
    verified: BTreeMap<String, SystemTime>,
    /// GPUs reset whose owner's MIG layout is still to be made again.
    relayout: BTreeSet<String>,
    /// A MIG layout was made again: the inventory should be read afresh.
    rescan: bool,
    /// Where each GPU's phase is published, for the health watcher, the exporter and
    /// `/readyz`: at the end of every step, and before a reset command runs (which may take
    /// minutes).
    inventory: Option<Inventory>,
}

impl Engine {
    pub fn new(
        settings: Settings,
        nvml: crate::nvml::Nvml,
        metrics: Metrics,
        events: Option<EventSender>,
        escalation: Option<watch::Sender<Escalation>>,
    ) -> Self {
        let mut records = Records::load(settings.state_file.clone());
        records.keep_counters(&metrics);
        let budget = Budget::new(&settings);
        let drainer = Drainer::new(&settings);
        Engine {
            settings,
            nvml,
            metrics,
            records,
            budget,
            slot: None,
            budget_failing: false,
            drainer,
            events,
            escalation,
            recent_faults: VecDeque::new(),
            verified: BTreeMap::new(),
            relayout: BTreeSet::new(),
            rescan: false,
            inventory: None,
        }
    }

    /// Publishes each GPU's phase into `inventory` from now on (see [`publish`](Self::publish)).
    pub fn publish_to(&mut self, inventory: Inventory) {
        self.inventory = Some(inventory);
    }

    /// Writes each GPU's remediation into the inventory, when there is one.
    pub fn publish(&self) {
        let Some(inventory) = &self.inventory else {
            return;
        };
        let views = self.views();
        inventory.update(|s| {
            for gpu in &mut s.gpus {
                gpu.remediation = views.get(&gpu.uuid).cloned();
            }
        });
    }

    /// Whether the node should be rescanned (MIG devices made again); asking clears it.
    pub fn take_rescan(&mut self) -> bool {
        std::mem::take(&mut self.rescan)
    }

    /// Whether any GPU is on its way back (the loop then polls; otherwise it only waits for a
    /// change of the inventory).
    pub fn busy(&self) -> bool {
        self.records
            .gpus
            .values()
            .any(|r| !matches!(r.phase, Phase::Healthy | Phase::Escalated))
    }

    /// Whether NVML must be asked this step: some GPU is unhealthy or not back yet.
    pub fn wants_signals(&self, snapshot: &Snapshot) -> bool {
        self.busy()
            || snapshot.gpus.iter().any(|g| {
                g.health.state == HealthState::Unhealthy
                    && self.records.get(&g.uuid).phase == Phase::Healthy
            })
    }

    /// Moves every GPU as far as it can go now.
    pub async fn step(&mut self, snapshot: &Snapshot, observed: &Observed) {
        let now = SystemTime::now();
        self.recent_faults
            .retain(|(at, _)| now.duration_since(*at).is_ok_and(|d| d < NODE_FAULT_WINDOW));
        // Every GPU that failed is quarantined first, so the circuit breaker sees all the
        // GPUs that failed together before any of them is reset.
        for gpu in &snapshot.gpus {
            let record = self.records.get(&gpu.uuid);
            if !gpu.uuid.is_empty() && record.phase == Phase::Healthy {
                let next = self.next(snapshot, gpu, &record, None).await;
                self.apply(gpu, record, next);
            }
        }
        for gpu in &snapshot.gpus {
            if gpu.uuid.is_empty() {
                continue;
            }
            // A few transitions per step at most: quarantined → draining → resetting →
            // verifying on an idle GPU; verifying waits for the watcher's next verdict.
            for _ in 0..4 {
                let record = self.records.get(&gpu.uuid);
                let next = self.next(snapshot, gpu, &record, Some(observed)).await;
                let moved = matches!(next, Next::To(..) | Next::Escalate(..) | Next::Withhold(..));
                // Read again: a reset records itself before its command runs.
                let record = self.records.get(&gpu.uuid);
                self.apply(gpu, record, next);
                let phase = self.records.get(&gpu.uuid).phase;
                if !moved || matches!(phase, Phase::Verifying | Phase::Escalated | Phase::Healthy) {
                    break;
                }
            }
        }
        self.release_idle_slot().await;
        self.publish_escalation(snapshot);
    }

    /// The inventory's view of each GPU's remediation.
    pub fn views(&self) -> BTreeMap<String, GpuRemediation> {
        self.records
            .gpus
            .iter()
            .map(|(uuid, r)| (uuid.clone(), r.view()))
            .collect()
    }

    /// What `/readyz` says the remediation is busy with, if anything.
    pub fn busy_with(&self, snapshot: &Snapshot) -> Option<String> {
        let busy: Vec<String> = snapshot
            .gpus
            .iter()
            .filter_map(|g| {
                let record = self.records.gpus.get(&g.uuid)?;
                (record.phase != Phase::Healthy)
                    .then(|| format!("GPU {} {}: {}", g.index, record.phase, record.reason))
            })
            .collect();
        (!busy.is_empty()).then(|| busy.join("; "))
    }

    /// Gives back the slot, if held (gpud is stopping).
    pub async fn stop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.release().await;
        }
    }

    async fn next(
        &mut self,
        snapshot: &Snapshot,
        gpu: &Gpu,
        record: &GpuRecord,
        observed: Option<&Observed>,
    ) -> Next {
        if let Some(leader) = &record.leader {
            return self.follow(record, leader);
        }
        let signals = observed.and_then(|o| o.signals.get(&gpu.index));
        // Held for a peer's reset (and not yet let go by every watcher) is not a fault.
        let healthy = gpu.health.state != HealthState::Unhealthy
            || gpu.health.source == Some(HealthSource::Remediation);
        match record.phase {
            Phase::Healthy if healthy => Next::Stay,
            Phase::Healthy => Next::To(
                Phase::Quarantined,
                gpu.health
                    .reason
                    .clone()
                    .unwrap_or_else(|| "unhealthy".to_owned()),
            ),
            // A GPU withheld after failed checks waits for a reboot, whatever its verdict says.
            Phase::Quarantined | Phase::Draining | Phase::Escalated
                if healthy && record.held_for.is_none() =>
            {
                Next::To(
                    Phase::Healthy,
                    "its health verdict cleared by itself".to_owned(),
                )
            }
            Phase::Quarantined => self.decide(snapshot, gpu, record, signals),
            Phase::Draining => self.drain(snapshot, gpu, record, observed).await,
            Phase::Resetting => self.resumed(snapshot, gpu, record, signals),
            Phase::Verifying => self.verify(snapshot, gpu, record, observed).await,
            Phase::Escalated => {
                self.reboot_if_asked(record).await;
                Next::Stay
            }
        }
    }

    /// A sound GPU held for its NVLink peer's reset: it stays while the peer is on its way
    /// through drain, reset and verification, and goes back to service with it (or when the
    /// peer escalates: it was not the one at fault).
    fn follow(&self, record: &GpuRecord, leader: &str) -> Next {
        let leader = self.records.get(leader);
        match leader.phase {
            Phase::Draining | Phase::Resetting | Phase::Verifying => Next::Stay,
            // The reset that took it too was not proved: it is no sounder than its leader.
            Phase::Escalated
                if leader.held_for.is_some()
                    && matches!(record.phase, Phase::Resetting | Phase::Verifying) =>
            {
                Next::Withhold(
                    leader.held_for.map_or(WITHHELD, |why| match why.as_str() {
                        RESET_UNKNOWN => RESET_UNKNOWN,
                        _ => WITHHELD,
                    }),
                    format!("its NVLink peer's reset was not proved: {}", leader.reason),
                )
            }
            phase => Next::To(
                Phase::Healthy,
                format!("let go: its NVLink peer's remediation ended ({phase})"),
            ),
        }
    }

    /// Holds out of service the sound NVLink peers that a reset of `gpu` takes too, and says
    /// which (`" and GPU 1's"`), for the drain's reason.
    fn hold_peers(&mut self, snapshot: &Snapshot, gpu: &Gpu) -> String {
        let mut held = Vec::new();
        for peer in peers::reset_with(snapshot, gpu) {
            let mut record = self.records.get(&peer.uuid);
            if !matches!(record.phase, Phase::Healthy | Phase::Quarantined)
                || record.leader.is_some()
            {
                continue;
            }
            record.leader = Some(gpu.uuid.clone());
            record.held_for = Some(peers::held_for(gpu));
            let reason = peers::held_for(gpu);
            self.apply(peer, record, Next::To(Phase::Draining, reason));
            held.push(format!(" and GPU {}'s", peer.index));
        }
        held.concat()
    }

    /// `gpu` and the peers held for its reset: what is drained, reset and checked together.
    fn group<'a>(&self, snapshot: &'a Snapshot, gpu: &'a Gpu) -> Vec<&'a Gpu> {
        let mut group = vec![gpu];
        group.extend(snapshot.gpus.iter().filter(|g| {
            self.records
                .gpus
                .get(&g.uuid)
                .and_then(|r| r.leader.as_deref())
                == Some(gpu.uuid.as_str())
        }));
        group
    }

    /// Moves the peers held for `leader`'s reset to `phase` with it (logged, no event: the
    /// leader's event tells the story).
    fn carry_peers(&mut self, snapshot: &Snapshot, leader: &Gpu, phase: Phase) {
        for peer in self.group(snapshot, leader).into_iter().skip(1) {
            let mut record = self.records.get(&peer.uuid);
            if record.phase != phase {
                info!(gpu = peer.index, uuid = %peer.uuid, from = %record.phase, to = %phase, leader = leader.index, "GPU remediation (held for its NVLink peer)");
                record.phase = phase;
                record.since = seconds(SystemTime::now());
                self.records.set(&peer.uuid, record);
            }
        }
        self.records.save();
    }

    /// A quarantined GPU: what it needs, and whether gpud may do it.
    fn decide(
        &mut self,
        snapshot: &Snapshot,
        gpu: &Gpu,
        record: &GpuRecord,
        signals: Option<&GpuSignals>,
    ) -> Next {
        let fault = gpu.health.reason.clone().unwrap_or_default();
        let total = snapshot.gpus.len();
        // Distinct GPUs: one GPU failing again is the reset limit's to judge.
        let failing = self
            .recent_faults
            .iter()
            .map(|(_, uuid)| uuid)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        if total >= 2 && failing * 2 > total {
            return Next::Escalate(
                REBOOT_REQUIRED,
                format!(
                    "{failing} of {total} GPUs failed within {}: a node-level fault (driver, \
                     power, NVSwitch), not reset one by one; {fault}",
                    humantime::format_duration(NODE_FAULT_WINDOW)
                ),
            );
        }
        match need(&gpu.health, signals.and_then(|s| s.recovery_action)) {
            Need::Wait => Next::Stay,
            Need::Reboot => {
                Next::Escalate(REBOOT_REQUIRED, format!("{fault}: needs a node reboot"))
            }
            Need::Hardware => Next::Escalate(
                HARDWARE_SUSPECTED,
                format!("{fault}: needs the hardware inspected"),
            ),
            Need::Reset => {
                let now = SystemTime::now();
                let last_fault = self.recent_faults.back().map(|(at, _)| *at);
                if last_fault.is_some_and(|at| now.duration_since(at).unwrap_or_default() < SETTLE)
                {
                    return Next::Stay;
                }
                let done = record.resets_within(self.settings.reset_window, now);
                if done >= self.settings.max_resets as usize {
                    return Next::Escalate(
                        HARDWARE_SUSPECTED,
                        format!(
                            "reset {done} times within {} and failing again: {fault}",
                            humantime::format_duration(self.settings.reset_window)
                        ),
                    );
                }
                match self.settings.mode {
                    Mode::Reset => {
                        let held = self.hold_peers(snapshot, gpu);
                        Next::To(
                            Phase::Draining,
                            format!("{fault}; waiting for its processes{held} to end"),
                        )
                    }
                    Mode::Off | Mode::Report => Next::Note(format!(
                        "{fault}; would drain and reset it (--remediation report)"
                    )),
                }
            }
        }
    }

    /// A draining GPU: reset once nothing runs on it and a slot is held.
    async fn drain(
        &mut self,
        snapshot: &Snapshot,
        gpu: &Gpu,
        record: &GpuRecord,
        observed: Option<&Observed>,
    ) -> Next {
        let now = SystemTime::now();
        let waited = Duration::from_secs(seconds(now).saturating_sub(record.since));
        let group = self.group(snapshot, gpu);
        // An admin's NoExecute DeviceTaintRule is maintenance under way: the reset waits for
        // it to be lifted, and says which rule it waits for.
        if let Some(why) = admin_hold(&group) {
            return Next::Note(why);
        }
        // The peers held for this reset must be out of service (withdrawn from the kubelet,
        // tainted: unhealthy in the inventory) before their processes are looked at: a pod
        // placed on one after that look would be reset under. The hold is published when
        // this step ends; the next step, on the inventory's change, finds it in place.
        let exposed: Vec<String> = group
            .iter()
            .skip(1)
            .filter(|peer| peer.health.state != HealthState::Unhealthy)
            .map(|peer| format!("GPU {}", peer.index))
            .collect();
        if !exposed.is_empty() {
            return self.drain_wait(
                waited,
                format!(
                    "waiting for its NVLink peer(s) {} to be withdrawn from service",
                    exposed.join(", ")
                ),
            );
        }
        let mut running = Vec::new();
        let mut busy = Vec::new();
        for member in &group {
            let processes = {
                let nvml = self.nvml.clone();
                let index = member.index;
                tokio::task::spawn_blocking(move || nvml.processes_on(index))
                    .await
                    .unwrap_or_else(|e| ProcessesRead::Unavailable(e.to_string()))
            };
            match processes {
                ProcessesRead::Read(list) if list.is_empty() => {}
                ProcessesRead::Read(list) => {
                    running.extend(list.into_iter().map(|p| p.pid));
                    busy.push(*member);
                }
                ProcessesRead::Lost => {
                    return Next::Escalate(
                        REBOOT_REQUIRED,
                        format!("GPU {} fell off the bus while draining", member.index),
                    );
                }
                ProcessesRead::Unavailable(why) => {
                    return self.drain_wait(
                        waited,
                        format!("cannot list the processes on GPU {} ({why})", member.index),
                    );
                }
            }
        }
        if !running.is_empty() {
            let mut forbidden = Vec::new();
            if self.settings.evict {
                for member in busy {
                    forbidden.extend(
                        self.drainer
                            .evict_holders(snapshot, member, &self.metrics)
                            .await,
                    );
                }
            }
            let pids: Vec<String> = running.iter().map(u32::to_string).collect();
            let mut what = format!(
                "waiting for {} process(es) to end (pid {})",
                pids.len(),
                pids.join(", ")
            );
            // Waiting does not fix what RBAC forbids: the reason says what to grant.
            for why in forbidden {
                what.push_str("; ");
                what.push_str(&why);
            }
            return self.drain_wait(waited, what);
        }
        if self.slot.as_ref().is_none_or(|s| !s.is_held()) {
            self.slot = self.budget.take(&mut self.budget_failing).await;
        }
        if self.slot.is_none() {
            return self.drain_wait(
                waited,
                format!(
                    "idle; waiting for a remediation slot (at most {} node(s) reset at once)",
                    self.settings.max_concurrent
                ),
            );
        }
        self.reset(snapshot, gpu, observed).await
    }

    /// Still draining: escalates past the deadline, else says what it waits for.
    fn drain_wait(&self, waited: Duration, what: String) -> Next {
        if waited >= self.settings.drain_timeout {
            Next::Escalate(
                DRAIN_TIMED_OUT,
                format!(
                    "not drained within {}: {what}",
                    humantime::format_duration(self.settings.drain_timeout)
                ),
            )
        } else {
            Next::Note(what)
        }
    }

    /// Runs the reset command. The reset is in the record before the command starts, so a
    /// restart in between knows it may have happened, with what NVML showed just before it
    /// (so that the restart can tell whether it did).
    async fn reset(&mut self, snapshot: &Snapshot, gpu: &Gpu, observed: Option<&Observed>) -> Next {
        let now = SystemTime::now();
        let group = self.group(snapshot, gpu);
        for member in group.iter().skip(1) {
            let mut peer = self.records.get(&member.uuid);
            peer.marks_before_reset = Some(marks_of(observed, member.index));
            peer.reset_ended_ms = None;
            self.records.set(&member.uuid, peer);
        }
        let mut record = self.records.get(&gpu.uuid);
        record.resets.push(seconds(now));
        let window = self.settings.reset_window.as_secs();
        record
            .resets
            .retain(|&at| seconds(now).saturating_sub(at) < window);
        record.reset_count += 1;
        record.marks_before_reset = Some(marks_of(observed, gpu.index));
        record.reset_ended_ms = None;
        // One command for the GPUs a reset takes together: the driver refuses to reset one of
        // them alone.
        let bus_id = group
            .iter()
            .map(|g| g.pci.bus_id.to_string())
            .collect::<Vec<_>>()
            .join(",");
        self.carry_peers(snapshot, gpu, Phase::Resetting);
        self.apply(
            gpu,
            record,
            Next::To(
                Phase::Resetting,
                format!(
                    "running {} -i {bus_id}",
                    self.settings.reset_command.join(" ")
                ),
            ),
        );
        // The command may run for minutes: the inventory shows it resetting meanwhile.
        self.publish();
        let outcome = command::run(
            &self.settings.reset_command,
            &["-i", &bus_id],
            &[],
            self.settings.reset_timeout,
        )
        .await;
        self.metrics.count(
            "reset",
            if outcome.succeeded() {
                "success"
            } else {
                "failed"
            },
        );
        match outcome {
            Outcome::Succeeded => {
                for member in &group {
                    self.reset_ended(&member.uuid, SystemTime::now());
                }
                self.carry_peers(snapshot, gpu, Phase::Verifying);
                self.verified.remove(&gpu.uuid);
                self.relayout
                    .extend(group.iter().map(|member| member.uuid.clone()));
                Next::To(
                    Phase::Verifying,
                    "reset; checking it before it goes back to work".to_owned(),
                )
            }
            // Killed in the middle: the GPU may be half reset.
            Outcome::TimedOut(_) => Next::Withhold(
                RESET_UNKNOWN,
                format!(
                    "the reset command {} {outcome}",
                    self.settings.reset_command.join(" ")
                ),
            ),
            other => Next::Escalate(
                RESET_FAILED,
                format!(
                    "the reset command {} {other}",
                    self.settings.reset_command.join(" ")
                ),
            ),
        }
    }

    /// A GPU found `resetting` at start: gpud was stopped while its reset ran, and the reset
    /// command (in a process group of its own) may have outlived it, or not. Only NVML showing
    /// the reset — every mark it clears gone since just before it — lets the GPU go on to its
    /// checks; anything less holds it out of service until the node reboots. Never a second
    /// reset: the first may still run.
    fn resumed(
        &mut self,
        snapshot: &Snapshot,
        gpu: &Gpu,
        record: &GpuRecord,
        signals: Option<&GpuSignals>,
    ) -> Next {
        let before = record.marks_before_reset.unwrap_or_default();
        let Some(shown) = before.cleared_in(signals) else {
            let why = match before.any() {
                true => "NVML still shows the fault the reset should have cleared",
                false => "NVML keeps no trace of a reset for this fault",
            };
            return Next::Withhold(
                RESET_UNKNOWN,
                format!(
                    "gpud was stopped while the reset ran and cannot tell whether it ended: {why}"
                ),
            );
        };
        // It ended by the time NVML showed it; what was seen before it started is what it
        // cleared (an XID seen while it ran stays).
        let started = SystemTime::UNIX_EPOCH + Duration::from_secs(record.since);
        for member in self
            .group(snapshot, gpu)
            .iter()
            .map(|g| g.uuid.clone())
            .collect::<Vec<_>>()
        {
            self.reset_ended(&member, started);
        }
        self.carry_peers(snapshot, gpu, Phase::Verifying);
        self.verified.remove(&gpu.uuid);
        Next::To(
            Phase::Verifying,
            format!(
                "gpud restarted while the reset ran, and NVML shows it happened ({shown}); checking the GPU instead of resetting it again"
            ),
        )
    }

    /// Makes the MIG layout the owner of reset GPU `member` recorded again; with no owner
    /// recorded, nothing.
    async fn relayout_one(&mut self, member: &Gpu) -> Result<(), String> {
        let dir = self.settings.layout_dir.as_deref();
        let wanted = mig_layout::wanted(&self.nvml, dir, member.index, &member.uuid).await?;
        let Some(wanted) = wanted else {
            info!(gpu = member.index, uuid = %member.uuid, "No owner of the GPU's MIG layout is recorded; making none again after its reset");
            return Ok(());
        };
        let made = mig_layout::restore(&self.nvml, dir, member.index, wanted.layout).await?;
        if made > 0 {
            info!(gpu = member.index, uuid = %member.uuid, owner = %wanted.owner, gpu_instances = made, "Made the GPU's MIG layout again after its reset");
            self.rescan = true;
        }
        Ok(())
    }

    /// A reset GPU: NVML's signals, the verify command, then the health verdict.
    async fn verify(
        &mut self,
        snapshot: &Snapshot,
        gpu: &Gpu,
        record: &GpuRecord,
        observed: Option<&Observed>,
    ) -> Next {
        let waited = Duration::from_secs(seconds(SystemTime::now()).saturating_sub(record.since));
        let group = self.group(snapshot, gpu);
        for member in &group {
            let signals = observed.and_then(|o| o.signals.get(&member.index));
            if let Some(fault) = verify::signals_fault(signals) {
                let fault = match member.index == gpu.index {
                    true => fault,
                    false => format!("its NVLink peer GPU {}: {fault}", member.index),
                };
                return match waited >= VERIFY_GRACE {
                    true => Next::Withhold(
                        WITHHELD,
                        format!("the reset did not clear the fault: {fault}"),
                    ),
                    false => Next::Note(format!("checking: {fault}")),
                };
            }
        }
        for member in &group {
            if !self.relayout.remove(&member.uuid) {
                continue;
            }
            if let Err(why) = self.relayout_one(member).await {
                return Next::Escalate(
                    RESET_FAILED,
                    format!(
                        "reset, but the MIG layout of GPU {} could not be made again: {why}",
                        member.index
                    ),
                );
            }
        }
        let confirmed = match self.verified.get(&gpu.uuid) {
            Some(at) => *at,
            None => {
                let indices: Vec<u32> = group.iter().map(|g| g.index).collect();
                let checked = self.checks(gpu, &indices).await;
                self.metrics
                    .count("verify", if checked.is_ok() { "success" } else { "failed" });
                if let Err(why) = checked {
                    return Next::Withhold(WITHHELD, format!("reset, but {why}"));
                }
                // Proved: now the health watchers clear what the reset cleared.
                let uuids: Vec<String> = group.iter().map(|g| g.uuid.clone()).collect();
                for uuid in &uuids {
                    self.reset_proved(uuid);
                }
                let now = SystemTime::now();
                self.verified.insert(gpu.uuid.clone(), now);
                now
            }
        };
        let waited = SystemTime::now()
            .duration_since(confirmed)
            .unwrap_or_default();
        // Held out of service by this very phase is not a fault of its own.
        let own_fault = gpu.health.state == HealthState::Unhealthy
            && gpu.health.source != Some(HealthSource::Remediation);
        match own_fault {
            true if waited >= VERIFY_GRACE => Next::Escalate(
                HARDWARE_SUSPECTED,
                format!(
                    "still unhealthy after its reset: {}",
                    gpu.health.reason.as_deref().unwrap_or("unknown")
                ),
            ),
            true => Next::Note("reset; waiting for the health verdict to clear".to_owned()),
            false => Next::To(
                Phase::Healthy,
                "reset, verified and back in service".to_owned(),
            ),
        }
    }

    /// The checks a reset GPU (with the peers reset with it, `indices`) passes before it goes
    /// back: the doctor's per-GPU checks, then the user's verify command. `Err` says which
    /// failed.
    async fn checks(&mut self, gpu: &Gpu, indices: &[u32]) -> Result<(), String> {
        match &self.settings.gpud_binary {
            Some(gpud) => {
                let lib = self.nvml.library_path().to_path_buf();
                let limit = self.settings.verify_timeout.min(doctor::LIMIT);
                let warnings = doctor::check(gpud, &lib, indices, limit).await;
                let warnings =
                    warnings.map_err(|why| format!("the doctor's checks fail: {why}"))?;
                if !warnings.is_empty() {
                    warn!(gpu = gpu.index, uuid = %gpu.uuid, warnings = %warnings.join("; "), "The reset GPU passes the doctor's checks with warnings");
                }
            }
            None => {
                warn!(
                    gpu = gpu.index,
                    "Cannot find gpud's own binary (/proc/self/exe): the reset GPU is verified without the doctor's checks"
                );
            }
        }
        let Some(line) = self.settings.verify_command.clone() else {
            return Ok(());
        };
        let bus_id = gpu.pci.bus_id.to_string();
        let index = gpu.index.to_string();
        let env = [
            ("GPUD_GPU_UUID", gpu.uuid.as_str()),
            ("GPUD_GPU_BUS_ID", bus_id.as_str()),
            ("GPUD_GPU_INDEX", index.as_str()),
        ];
        let outcome = command::run(&line, &[], &env, self.settings.verify_timeout).await;
        match outcome.succeeded() {
            true => Ok(()),
            false => Err(format!("the verify command {} {outcome}", line.join(" "))),
        }
    }

    /// Records that a reset of `uuid` ended at `at`, not yet proved: the health watchers are
    /// not told yet.
    fn reset_ended(&mut self, uuid: &str, at: SystemTime) {
        let mut record = self.records.get(uuid);
        record.reset_ended_ms = Some(millis(at));
        self.records.set(uuid, record);
        self.records.save();
    }

    /// Records that the reset of `uuid` passed every check: the health watchers clear what
    /// they saw before it ended.
    fn reset_proved(&mut self, uuid: &str) {
        let mut record = self.records.get(uuid);
        let ended = record
            .reset_ended_ms
            .unwrap_or_else(|| record.since.saturating_mul(1000));
        record.last_reset_ms = Some(ended);
        self.records.set(uuid, record);
        self.records.save();
    }

    /// Runs the reboot command once for an escalation that asks for a reboot, when one is set.
    async fn reboot_if_asked(&mut self, record: &GpuRecord) {
        let Some(line) = self.settings.reboot_command.clone() else {
            return;
        };
        if self.settings.mode != Mode::Reset
            || record.escalation.as_deref() != Some(REBOOT_REQUIRED)
            || self.records.gpus.values().any(|r| r.reboot_asked)
        {
            return;
        }
        for r in self.records.gpus.values_mut() {
            if r.escalation.as_deref() == Some(REBOOT_REQUIRED) {
                r.reboot_asked = true;
            }
        }
        self.records.save();
        warn!(command = %line.join(" "), "Rebooting the node: a GPU needs it (--remediation-reboot-command)");
        let outcome = command::run_reboot(&line, self.settings.reset_timeout).await;
        self.metrics.count(
            "reboot",
            if outcome.succeeded() {
                "success"
            } else {
                "failed"
            },
        );
        if !outcome.succeeded() {
            warn!(command = %line.join(" "), outcome = %outcome, "The reboot command did not succeed; the escalation stays on the Node");
        }
    }

    /// Records, logs, announces and counts what `next` says.
    fn apply(&mut self, gpu: &Gpu, mut record: GpuRecord, next: Next) {
        let now = SystemTime::now();
        let (phase, reason, escalation) = match next {
            Next::Stay => return,
            Next::Note(reason) => {
                if reason != record.reason {
                    info!(gpu = gpu.index, uuid = %gpu.uuid, phase = %record.phase, %reason, "GPU remediation");
                    record.reason = reason;
                    self.records.set(&gpu.uuid, record);
                    self.records.save();
                }
                return;
            }
            Next::To(phase, reason) => (phase, reason, None),
            Next::Escalate(why, reason) => (Phase::Escalated, reason, Some(why)),
            Next::Withhold(why, reason) => {
                record.held_for = Some(why.to_owned());
                // A peer withheld with its leader no longer follows it.
                record.leader = None;
                (Phase::Escalated, reason, Some(RESET_FAILED))
            }
        };
        let from = record.phase;
        match phase {
            Phase::Quarantined => {
                self.recent_faults.push_back((now, gpu.uuid.clone()));
                record.out_since = Some(gpu.health.since.map_or_else(|| seconds(now), seconds));
            }
            Phase::Healthy => {
                if from == Phase::Verifying && record.leader.is_none() {
                    let out = record
                        .out_since
                        .map_or(now, |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s));
                    self.metrics
                        .returned(now.duration_since(out).unwrap_or_default());
                }
                record.out_since = None;
                record.escalation = None;
                record.reboot_asked = false;
                record.leader = None;
                record.held_for = None;
                self.verified.remove(&gpu.uuid);
            }
            Phase::Escalated => {
                self.metrics
                    .count("escalate", escalation.unwrap_or(RESET_FAILED));
                record.escalation = escalation.map(str::to_owned);
            }
            _ => {}
        }
        if phase == Phase::Escalated {
            warn!(gpu = gpu.index, uuid = %gpu.uuid, from = %from, to = %phase, escalation = escalation.unwrap_or_default(), %reason, "GPU remediation");
        } else {
            info!(gpu = gpu.index, uuid = %gpu.uuid, from = %from, to = %phase, %reason, "GPU remediation");
        }
        if let Some(events) = &self.events {
            events.send(NodeEvent {
                kind: match phase {
                    Phase::Quarantined | Phase::Escalated => Kind::Warning,
                    _ => Kind::Normal,
                },
                reason: event_reason(from, phase),
                message: format!("GPU {} ({}): {reason}", gpu.index, gpu.uuid),
                at: now,
            });
        }
        record.phase = phase;
        record.since = seconds(now);
        record.reason = reason;
        self.records.set(&gpu.uuid, record);
        self.records.save();
    }

    /// Gives the slot back once no GPU of this node is being reset or verified, and none is
    /// drained and idle (it would take the slot again at once).
    async fn release_idle_slot(&mut self) {
        let needed = self
            .records
            .gpus
            .values()
            .any(|r| matches!(r.phase, Phase::Resetting | Phase::Verifying));
        if !needed && let Some(slot) = self.slot.take() {
            slot.release().await;
        }
    }

    /// Sets the Node condition from the escalated GPUs.
    fn publish_escalation(&self, snapshot: &Snapshot) {
        let Some(sender) = &self.escalation else {
            return;
        };
        let escalated: Vec<(&Gpu, &GpuRecord)> = snapshot
            .gpus
            .iter()
            .filter_map(|g| self.records.gpus.get(&g.uuid).map(|r| (g, r)))
            .filter(|(_, r)| r.phase == Phase::Escalated)
            .collect();
        let wanted = match escalated.is_empty() {
            true => Escalation::none(),
            false => {
                let reason = escalated
                    .iter()
                    .filter_map(|(_, r)| r.escalation.as_deref())
                    .max_by_key(|why| URGENCY.iter().position(|u| u == why))
                    .unwrap_or(RESET_FAILED);
                let message = escalated
                    .iter()
                    .map(|(g, r)| format!("GPU {} ({}): {}", g.index, g.uuid, r.reason))
                    .collect::<Vec<_>>()
                    .join("; ");
                Escalation {
                    required: true,
                    reason: reason.to_owned(),
                    message: crate::kube::clip_message(message),
                }
            }
        };
        sender.send_if_modified(|current| {
            let changed = *current != wanted;
            *current = wanted;
            changed
        });
    }
}

/// The Node event's reason for a transition.
fn event_reason(from: Phase, to: Phase) -> &'static str {
    match to {
        Phase::Healthy if from == Phase::Verifying => "GPURemediated",
        Phase::Healthy => "GPURecovered",
        Phase::Quarantined => "GPUQuarantined",
        Phase::Draining => "GPUDraining",
        Phase::Resetting => "GPUResetting",
        Phase::Verifying => "GPUReset",
        Phase::Escalated => "GPURemediationRequired",
    }
}

/// What NVML showed of GPU `index` at this step that a reset clears.
fn marks_of(observed: Option<&Observed>, index: u32) -> ResetMarks {
    ResetMarks::of(observed.and_then(|o| o.signals.get(&index)))
}

/// Why `group` must not be reset now: a device of one of its GPUs carries a `NoExecute`
/// taint of an admin's DeviceTaintRule (maintenance); `None` when none does.
fn admin_hold(group: &[&Gpu]) -> Option<String> {
    let held: Vec<String> = group
        .iter()
        .flat_map(|gpu| {
            gpu.device_taints
                .iter()
                .filter(|t| t.effect == crate::inventory::device_taints::NO_EXECUTE)
                .map(move |t| {
                    format!(
                        "GPU {} ({} {}, DeviceTaintRule {})",
                        gpu.index,
                        t.device,
                        t.spelled(),
                        t.rule
                    )
                })
        })
        .collect();
    (!held.is_empty()).then(|| {
        format!(
            "waiting: an admin tainted {} for maintenance; not reset until the rule is lifted",
            held.join(", ")
        )
    })
}

#[cfg(test)]
mod admin_hold_tests {
    use super::*;
    use crate::inventory::device_taints::RuleTaint;
    use crate::inventory::test_support::gpu;

    #[test]
    fn only_an_admins_no_execute_taint_holds_the_reset() {
        let mut held = gpu(3, "GPU-d", "NVIDIA H100 80GB HBM3", 81559);
        let free = gpu(2, "GPU-c", "NVIDIA H100 80GB HBM3", 81559);
        assert_eq!(admin_hold(&[&held, &free]), None);
        let taint = |effect: &str| RuleTaint {
            rule: "maint".into(),
            device: "gpu-3".into(),
            key: "example.com/maintenance".into(),
            value: None,
            effect: effect.into(),
        };
        held.device_taints = vec![taint("NoSchedule")];
        assert_eq!(admin_hold(&[&held, &free]), None);
        held.device_taints = vec![taint("NoExecute")];
        assert_eq!(
            admin_hold(&[&free, &held]).as_deref(),
            Some(
                "waiting: an admin tainted GPU 3 (gpu-3 example.com/maintenance:NoExecute, \
                 DeviceTaintRule maint) for maintenance; not reset until the rule is lifted"
            )
        );
    }
}
