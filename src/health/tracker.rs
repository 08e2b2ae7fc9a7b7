//! The health state machine: observations in, per-device health out.
//!
//! Pure: it never reads a clock or talks to NVML. Callers pass the time of each observation,
//! which makes every transition reproducible in tests. Each GPU keeps a set of *conditions*
//! (an XID, an uncorrectable ECC error, a pending row remap, a lost GPU …); its health is the
//! most severe active condition. Conditions clear by themselves:
//!
//! | condition | state | clears when |
//! |---|---|---|
//! | GPU lost | unhealthy | the GPU answers NVML again (this counts as a GPU reset) |
//! | fatal XID (79, 48, 95, 119 …) | unhealthy | the GPU is reset (seen as below) |
//! | critical XID | unhealthy | no new occurrence for the quiet period |
//! | warning / application XID not ignored | degraded | no new occurrence for the quiet period |
//! | XID named in `DP_ENABLE_HEALTHCHECKS` | unhealthy | as its severity says |
//! | uncorrectable (double-bit) ECC error | unhealthy | the volatile DBE counter reads 0 (after a reset) |
//! | row remap / page retirement pending | unhealthy | NVML no longer reports it pending (after a reset) |
//! | row remap failure | unhealthy | NVML no longer reports it (the GPU was replaced) |
//! | temperature at or past slowdown | degraded | temperature falls below the threshold |
//! | an NVLink that was up went down | degraded | the link is up again |
//!
//! A reset is recognised from what NVML reports after it, whether or not the GPU stopped
//! answering in between: answering again after being lost; NVML's recovery action (field 230)
//! back to none after asking for something; the volatile uncorrectable-ECC counter back to 0
//! after counting; a pending row remap or page retirement no longer pending. Each compares two
//! polls, so a reset inside one poll interval that leaves no such trace (a fatal XID on a
//! driver without the recovery-action field, reset before the next poll) is not seen.
//!
//! A GPU-wide condition covers all its MIG devices; an XID the driver attributes to one MIG
//! instance covers only that instance. Repeats of an active condition refresh its last-seen
//! time and count but change nothing visible, so a storm of 10 000 identical XIDs is one
//! transition. Each GPU keeps a bounded ring of recent findings.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::inventory::health::{Health, HealthSource, HealthState};
use crate::inventory::model::Snapshot;
use crate::nvml::GpuSignals;
use crate::xid::catalog::{self as xid, Action, Severity, XidPolicy};

/// How a remediation hold ends: with the reset gpud is running (the GPU's own, or an NVLink
/// peer's that takes it too), or only by a person (a reboot, a reset by hand) once gpud
/// escalated it. Typed, so the advice a verdict carries never depends on the hold's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldEnds {
    WithTheReset,
    ByHand,
}

/// Tunables of the tracker.
#[derive(Debug, Clone, PartialEq)]
pub struct TrackerConfig {
    /// How long an XID-driven condition below fatal must stay quiet before it clears.
    pub xid_quiet_period: Duration,
    /// How many recent findings each GPU remembers.
    pub history_len: usize,
}

/// Default quiet period after which a non-fatal XID condition clears.
pub const DEFAULT_XID_QUIET_PERIOD: Duration = Duration::from_secs(10 * 60);
/// Default number of findings kept per GPU.
pub const DEFAULT_HISTORY_LEN: usize = 64;

impl Default for TrackerConfig {
    fn default() -> Self {
        TrackerConfig {
            xid_quiet_period: DEFAULT_XID_QUIET_PERIOD,
            history_len: DEFAULT_HISTORY_LEN,
        }
    }
}

/// One thing the tracker learned, kept in a GPU's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// When it was observed.
    pub at: SystemTime,
    /// What it was, in words.
    pub what: String,
}

/// Why a device is not healthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    // Declared from least to most urgent: the most urgent condition names the state.
    /// Held out of service by gpud's remediation: a reset of an NVLink peer takes it too.
    Held,
    /// Held out of service until gpud has fresh evidence for it: what a restart kept of it
    /// could not be read.
    Unproven,
    NvLinkDown(u32),
    Thermal,
    Xid(u32),
    RetiredPagesPending,
    RemapPending,
    DoubleBitEcc,
    RemapFailure,
    Lost,
}

/// What a condition asks for: the typed remedy programs decide by, and the words people read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Advice {
    remedy: Action,
    text: String,
}

impl Advice {
    /// `remedy` in words other than its own phrase.
    fn text(remedy: Action, text: &str) -> Self {
        Advice {
            remedy,
            text: text.to_owned(),
        }
    }
}

impl From<Action> for Advice {
    fn from(remedy: Action) -> Self {
        Advice::text(remedy, remedy.phrase())
    }
}

/// An active condition.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Condition {
    state: HealthState,
    reason: String,
    action: Advice,
    xid: Option<u32>,
    since: SystemTime,
    last_seen: SystemTime,
    /// Cleared only by a GPU reset (fatal XIDs).
    until_reset: bool,
    /// Cleared after the quiet period.
    quiet_expiry: bool,
    occurrences: u64,
}

#[derive(Debug, Default)]
struct GpuState {
    conditions: BTreeMap<Kind, Condition>,
    mig_conditions: BTreeMap<(u32, u32), BTreeMap<Kind, Condition>>,
    /// NVLinks seen up at least once: only those count as "went down".
    links_seen_up: BTreeSet<u32>,
    history: VecDeque<Finding>,
    /// What the last poll said of the things a reset clears.
    reset_marks: Option<ResetMarks>,
}

/// The polled signals a GPU reset clears, kept between polls (and across a restart, in
/// [`Kept`]) to see a reset happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetMarks {
    recovery_action: Option<u64>,
    volatile_dbe: Option<u64>,
    remap_pending: Option<bool>,
    retired_pages_pending: Option<bool>,
}

impl ResetMarks {
    fn of(signals: &GpuSignals) -> Self {
        ResetMarks {
            recovery_action: signals.recovery_action,
            volatile_dbe: signals.volatile_dbe,
            remap_pending: signals.remap_pending,
            retired_pages_pending: signals.retired_pages_pending,
        }
    }

    /// What in `now` says the GPU was reset since `self` was polled, if anything.
    fn reset_since(&self, now: &ResetMarks) -> Option<&'static str> {
        let cleared = |before: Option<bool>, after: Option<bool>| {
            before == Some(true) && after == Some(false)
        };
        if self.recovery_action.is_some_and(|a| a != 0) && now.recovery_action == Some(0) {
            Some("NVML's recovery action is back to none")
        } else if self.volatile_dbe.is_some_and(|n| n > 0) && now.volatile_dbe == Some(0) {
            Some("the volatile uncorrectable-ECC counter is back to 0")
        } else if cleared(self.remap_pending, now.remap_pending) {
            Some("the pending row remap was applied")
        } else if cleared(self.retired_pages_pending, now.retired_pages_pending) {
            Some("the pending page retirement was applied")
        } else {
            None
        }
    }
}

/// What of one GPU's state only events prove, kept across a restart: its XID conditions
/// (GPU-wide and per MIG instance) and the last poll of the signals a reset clears, so that a
/// reset while gpud was down is still seen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    pub xids: Vec<KeptXid>,
    pub reset_marks: Option<ResetMarks>,
}

/// One active XID condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptXid {
    pub code: u32,
    /// The MIG instance `(gi, ci)` it was attributed to, if any.
    pub mig: Option<(u32, u32)>,
    pub since: SystemTime,
    pub last_seen: SystemTime,
    pub occurrences: u64,
}

/// Per-GPU health state machine.
#[derive(Debug)]
pub struct Tracker {
    policy: XidPolicy,
    config: TrackerConfig,
    gpus: BTreeMap<u32, GpuState>,
}

impl Tracker {
    /// A tracker with no findings.
    pub fn new(policy: XidPolicy, config: TrackerConfig) -> Self {
        Tracker {
            policy,
            config,
            gpus: BTreeMap::new(),
        }
    }

    /// Records an XID on `gpu` (optionally attributed to MIG instance `(gi, ci)`).
    pub fn observe_xid(&mut self, gpu: u32, code: u32, mig: Option<(u32, u32)>, at: SystemTime) {
        let info = xid::lookup(code);
        let history_len = self.config.history_len;
        let judged = self.policy.judge(code);
        let state = self.gpus.entry(gpu).or_default();
        let scope = mig.map_or_else(String::new, |(gi, ci)| format!(" (MIG GI {gi} CI {ci})"));
        let verdict = if judged.is_none() {
            " [ignored by policy]"
        } else {
            ""
        };
        push_history(
            state,
            history_len,
            at,
            format!("{}{scope}{verdict}", info.summary()),
        );
        let Some(judged) = judged else {
            return;
        };
        let condition = xid_condition(code, judged, at);
        let set = match mig {
            Some(key) => state.mig_conditions.entry(key).or_default(),
            None => &mut state.conditions,
        };
        raise(set, Kind::Xid(code), condition);
    }

    /// What a restart must not forget of `gpu` (see [`Kept`]); empty without XID conditions.
    pub fn kept(&self, gpu: u32) -> Kept {
        let Some(state) = self.gpus.get(&gpu) else {
            return Kept::default();
        };
        let scoped = std::iter::once((None, &state.conditions)).chain(
            state
                .mig_conditions
                .iter()
                .map(|(key, set)| (Some(*key), set)),
        );
        let xids: Vec<KeptXid> = scoped
            .flat_map(|(mig, set)| {
                set.iter().filter_map(move |(kind, condition)| match kind {
                    Kind::Xid(code) => Some(KeptXid {
                        code: *code,
                        mig,
                        since: condition.since,
                        last_seen: condition.last_seen,
                        occurrences: condition.occurrences,
                    }),
                    _ => None,
                })
            })
            .collect();
        if xids.is_empty() {
            return Kept::default();
        }
        Kept {
            xids,
            reset_marks: state.reset_marks,
        }
    }

    /// Takes back what a previous run kept of `gpu`, judged by today's XID policy (an XID
    /// now ignored is dropped); the next poll compares against the kept reset marks, so a
    /// reset while gpud was down clears what it clears.
    pub fn restore(&mut self, gpu: u32, kept: &Kept, at: SystemTime) {
        let history_len = self.config.history_len;
        let state = self.gpus.entry(gpu).or_default();
        for xid in &kept.xids {
            let Some(judged) = self.policy.judge(xid.code) else {
                continue;
            };
            let condition = Condition {
                since: xid.since,
                last_seen: xid.last_seen,
                occurrences: xid.occurrences,
                ..xid_condition(xid.code, judged, xid.since)
            };
            let set = match xid.mig {
                Some(key) => state.mig_conditions.entry(key).or_default(),
                None => &mut state.conditions,
            };
            set.insert(Kind::Xid(xid.code), condition);
            let scope = xid
                .mig
                .map_or_else(String::new, |(gi, ci)| format!(" (MIG GI {gi} CI {ci})"));
            push_history(
                state,
                history_len,
                at,
                format!(
                    "{}{scope}, kept from before gpud restarted",
                    xid::lookup(xid.code).summary()
                ),
            );
        }
        if state.reset_marks.is_none() {
            state.reset_marks = kept.reset_marks;
        }
    }

    /// Records a double-bit ECC event on `gpu`.
    pub fn observe_dbe_event(&mut self, gpu: u32, at: SystemTime) {
        let history_len = self.config.history_len;
        let state = self.gpus.entry(gpu).or_default();
        push_history(
            state,
            history_len,
            at,
            "uncorrectable (double-bit) ECC error".to_owned(),
        );
        raise(&mut state.conditions, Kind::DoubleBitEcc, dbe_condition(at));
    }

    /// Records a single-bit ECC event: corrected by the hardware, kept only in the history.
    pub fn observe_sbe_event(&mut self, gpu: u32, at: SystemTime) {
        let history_len = self.config.history_len;
        let state = self.gpus.entry(gpu).or_default();
        push_history(
            state,
            history_len,
            at,
            "corrected (single-bit) ECC error".to_owned(),
        );
    }

    /// Applies one poll of a GPU's signals.
    pub fn observe_signals(&mut self, signals: &GpuSignals, at: SystemTime) {
        let history_len = self.config.history_len;
        let state = self.gpus.entry(signals.gpu).or_default();
        let was_lost = state.conditions.contains_key(&Kind::Lost);
        if signals.lost {
            if !was_lost {
                push_history(
                    state,
                    history_len,
                    at,
                    "GPU is lost (NVML_ERROR_GPU_IS_LOST)".to_owned(),
                );
            }
            raise(&mut state.conditions, Kind::Lost, lost_condition(at));
            // A lost GPU answers nothing else: keep the other conditions as they were.
            return;
        }
        if was_lost {
            // Answering again after being lost means the GPU was reset: everything that only
            // a reset clears is gone.
            push_history(
                state,
                history_len,
                at,
                "GPU answers again (reset)".to_owned(),
            );
            state.conditions.remove(&Kind::Lost);
            clear_until_reset(&mut state.conditions);
            for set in state.mig_conditions.values_mut() {
                clear_until_reset(set);
            }
        }
        let marks = ResetMarks::of(signals);
        if let Some(why) = state
            .reset_marks
            .replace(marks)
            .and_then(|before| before.reset_since(&marks))
        {
            push_history(state, history_len, at, format!("GPU was reset ({why})"));
            clear_until_reset(&mut state.conditions);
            for set in state.mig_conditions.values_mut() {
                clear_until_reset(set);
            }
        }
        let conditions = &mut state.conditions;
        match signals.volatile_dbe {
            Some(0) => {
                conditions.remove(&Kind::DoubleBitEcc);
            }
            Some(n) => raise(
                conditions,
                Kind::DoubleBitEcc,
                Condition {
                    occurrences: n,
                    ..dbe_condition(at)
                },
            ),
            None => {}
        }
        toggle(
            conditions,
            Kind::RemapPending,
            signals.remap_pending == Some(true),
            at,
            "row remapping pending: an uncorrectable memory error was repaired and needs a GPU reset to take effect",
            Action::ResetGpu.into(),
            HealthState::Unhealthy,
        );
        toggle(
            conditions,
            Kind::RemapFailure,
            signals.remap_failure == Some(true),
            at,
            "row remapping failed: the GPU memory can no longer be repaired",
            Action::ReplaceGpu.into(),
            HealthState::Unhealthy,
        );
        toggle(
            conditions,
            Kind::RetiredPagesPending,
            signals.retired_pages_pending == Some(true),
            at,
            "page retirement pending: needs a GPU reset to take effect",
            Action::ResetGpu.into(),
            HealthState::Unhealthy,
        );
        let hot = matches!((signals.temperature_c, signals.slowdown_c), (Some(t), Some(limit)) if limit > 0 && t >= limit);
        let thermal_reason = match (signals.temperature_c, signals.slowdown_c) {
            (Some(t), Some(limit)) => {
                format!("temperature {t} °C at or past the slowdown threshold {limit} °C")
            }
            _ => String::new(),
        };
        toggle(
            conditions,
            Kind::Thermal,
            hot,
            at,
            &thermal_reason,
            Action::CheckCooling.into(),
            HealthState::Degraded,
        );
        for &(link, up) in &signals.nvlinks_up {
            if up {
                state.links_seen_up.insert(link);
            }
            let went_down = !up && state.links_seen_up.contains(&link);
            toggle(
                &mut state.conditions,
                Kind::NvLinkDown(link),
                went_down,
                at,
                &format!("NVLink {link} went down"),
                Action::CheckNvlinks.into(),
                HealthState::Degraded,
            );
        }
    }

    /// GPU `gpu` was reset by gpud itself at `reset` (its remediation ran the reset command
    /// and saw it succeed), whether or not NVML leaves a trace of it: every condition last
    /// seen before then that a reset clears is gone, and so are the XIDs from before it, which
    /// described a GPU that no longer runs that way. What was seen after it stays.
    pub fn observe_reset(&mut self, gpu: u32, reset: SystemTime, at: SystemTime) {
        let history_len = self.config.history_len;
        let Some(state) = self.gpus.get_mut(&gpu) else {
            return;
        };
        let cleared = |kind: &Kind, condition: &Condition| {
            (condition.until_reset || matches!(kind, Kind::Xid(_))) && condition.last_seen <= reset
        };
        let before = state.conditions.len();
        state.conditions.retain(|kind, c| !cleared(kind, c));
        let mut gone = before - state.conditions.len();
        for set in state.mig_conditions.values_mut() {
            let before = set.len();
            set.retain(|kind, c| !cleared(kind, c));
            gone += before - set.len();
        }
        if gone > 0 {
            push_history(
                state,
                history_len,
                at,
                "GPU was reset by gpud's remediation".to_owned(),
            );
        }
    }

    /// GPU `gpu` is held out of service by gpud's remediation (`Some((why, ends))`: on its way
    /// through a reset, its own or an NVLink peer's, or escalated), or no longer (`None`).
    /// While held it is unhealthy, so every reader withdraws it as it would a faulty GPU; a
    /// fault of its own still names the state.
    pub fn observe_hold(&mut self, gpu: u32, held: Option<(&str, HoldEnds)>, at: SystemTime) {
        let state = self.gpus.entry(gpu).or_default();
        let reason =
            held.map(|(why, _)| format!("held out of service by gpud's remediation: {why}"));
        let advice = match held.map(|(_, ends)| ends) {
            Some(HoldEnds::ByHand) => {
                "reboot the node (or reset the GPU by hand): gpud keeps it out of service until then"
            }
            _ => "none: gpud gives it back once the reset it waits for passed every check",
        };
        if state.conditions.get(&Kind::Held).map(|c| &c.reason) == reason.as_ref() {
            return;
        }
        state.conditions.remove(&Kind::Held);
        toggle(
            &mut state.conditions,
            Kind::Held,
            reason.is_some(),
            at,
            reason.as_deref().unwrap_or_default(),
            Advice::text(Action::None, advice),
            HealthState::Unhealthy,
        );
    }

    /// GPU `gpu` is held out of service until gpud has fresh evidence for it (`Some(why)`:
    /// the verdicts kept for it across a restart could not be read), or no longer (`None`:
    /// the doctor's checks of it passed). Only this clears it; a reset does not prove health.
    pub fn observe_unproven(&mut self, gpu: u32, why: Option<&str>, at: SystemTime) {
        let state = self.gpus.entry(gpu).or_default();
        let reason = why
            .map(|why| format!("held out of service until gpud has fresh evidence for it: {why}"));
        if state.conditions.get(&Kind::Unproven).map(|c| &c.reason) == reason.as_ref() {
            return;
        }
        state.conditions.remove(&Kind::Unproven);
        toggle(
            &mut state.conditions,
            Kind::Unproven,
            reason.is_some(),
            at,
            reason.as_deref().unwrap_or_default(),
            Advice::text(
                Action::None,
                "none: gpud runs the doctor's GPU checks on it and returns it to service once they pass",
            ),
            HealthState::Unhealthy,
        );
    }

    /// Expires quiet conditions. Call it periodically and before reading verdicts.
    pub fn tick(&mut self, now: SystemTime) {
        let quiet = self.config.xid_quiet_period;
        for state in self.gpus.values_mut() {
            expire(&mut state.conditions, now, quiet);
            for set in state.mig_conditions.values_mut() {
                expire(set, now, quiet);
            }
            state.mig_conditions.retain(|_, set| !set.is_empty());
        }
    }

    /// The watcher's verdict on a whole GPU.
    pub fn verdict(&self, gpu: u32) -> Health {
        self.gpus
            .get(&gpu)
            .map_or_else(Health::healthy, |state| health_of(&state.conditions))
    }

    /// The watcher's verdict on one MIG instance, counting only faults attributed to it.
    pub fn mig_verdict(&self, gpu: u32, gpu_instance: u32, compute_instance: u32) -> Health {
        self.gpus
            .get(&gpu)
            .and_then(|state| state.mig_conditions.get(&(gpu_instance, compute_instance)))
            .map_or_else(Health::healthy, health_of)
    }

    /// Recent findings of a GPU, oldest first.
    pub fn history(&self, gpu: u32) -> impl Iterator<Item = &Finding> {
        self.gpus
            .get(&gpu)
            .into_iter()
            .flat_map(|state| state.history.iter())
    }

    /// Writes the watcher's verdicts into a snapshot.
    ///
    /// Discovery's own verdict (a GPU it found lost) stands until discovery clears it; a
    /// GPU-wide state covers the GPU's MIG devices unless an instance has a worse one of its own.
    pub fn apply(&self, snapshot: &mut Snapshot) {
        for gpu in &mut snapshot.gpus {
            let verdict = self.verdict(gpu.index);
            if !(gpu.health.set_by_discovery() && !gpu.health.is_healthy() && verdict.is_healthy())
            {
                gpu.health = verdict;
            }
            for mig in &mut gpu.mig.devices {
                let own = self.mig_verdict(gpu.index, mig.gpu_instance_id, mig.compute_instance_id);
                mig.health = if own.state > gpu.health.state {
                    own
                } else {
                    gpu.health.clone()
                };
            }
        }
    }
}

fn push_history(state: &mut GpuState, capacity: usize, at: SystemTime, what: String) {
    if capacity == 0 {
        return;
    }
    while state.history.len() >= capacity {
        state.history.pop_front();
    }
    state.history.push_back(Finding { at, what });
}

/// Adds a condition, or refreshes it if already active (keeping its `since`).
fn raise(set: &mut BTreeMap<Kind, Condition>, kind: Kind, condition: Condition) {
    match set.get_mut(&kind) {
        Some(existing) => {
            existing.last_seen = condition.last_seen;
            existing.occurrences = existing
                .occurrences
                .saturating_add(1)
                .max(condition.occurrences);
            if condition.state > existing.state {
                existing.state = condition.state;
            }
        }
        None => {
            set.insert(kind, condition);
        }
    }
}

/// Raises or clears a signal-driven condition.
fn toggle(
    set: &mut BTreeMap<Kind, Condition>,
    kind: Kind,
    active: bool,
    at: SystemTime,
    reason: &str,
    action: Advice,
    state: HealthState,
) {
    if !active {
        set.remove(&kind);
        return;
    }
    raise(
        set,
        kind,
        Condition {
            state,
            reason: reason.to_owned(),
            action,
            xid: None,
            since: at,
            last_seen: at,
            until_reset: false,
            quiet_expiry: false,
            occurrences: 1,
        },
    );
}

/// The condition XID `code` raises, in the `state` the XID policy judged it
/// ([`XidPolicy::judge`]).
fn xid_condition(code: u32, state: HealthState, at: SystemTime) -> Condition {
    let info = xid::lookup(code);
    Condition {
        state,
        reason: format!("XID {code}: {}", info.description),
        action: info.action.into(),
        xid: Some(code),
        since: at,
        last_seen: at,
        until_reset: info.severity == Severity::Fatal,
        quiet_expiry: info.severity != Severity::Fatal,
        occurrences: 1,
    }
}

fn dbe_condition(at: SystemTime) -> Condition {
    Condition {
        state: HealthState::Unhealthy,
        reason: "uncorrectable (double-bit) ECC error".to_owned(),
        action: Action::ResetGpu.into(),
        xid: None,
        since: at,
        last_seen: at,
        until_reset: false,
        quiet_expiry: false,
        occurrences: 1,
    }
}

fn lost_condition(at: SystemTime) -> Condition {
    Condition {
        state: HealthState::Unhealthy,
        reason: crate::inventory::health::LOST_REASON.to_owned(),
        action: Advice::text(Action::RebootNode, crate::inventory::health::LOST_ACTION),
        xid: None,
        since: at,
        last_seen: at,
        until_reset: false,
        quiet_expiry: false,
        occurrences: 1,
    }
}

fn clear_until_reset(set: &mut BTreeMap<Kind, Condition>) {
    set.retain(|_, condition| !condition.until_reset);
}

fn expire(set: &mut BTreeMap<Kind, Condition>, now: SystemTime, quiet: Duration) {
    set.retain(|_, condition| {
        !condition.quiet_expiry
            || now
                .duration_since(condition.last_seen)
                .map_or(true, |elapsed| elapsed < quiet)
    });
}

/// The health a set of conditions amounts to: the worst state, named by its most urgent cause.
fn health_of(set: &BTreeMap<Kind, Condition>) -> Health {
    let worst = set
        .iter()
        .max_by(|(ka, a), (kb, b)| a.state.cmp(&b.state).then(ka.cmp(kb)));
    match worst {
        None => Health::healthy(),
        Some((kind, condition)) => Health {
            state: condition.state,
            reason: Some(condition.reason.clone()),
            xid: condition.xid,
            action: Some(condition.action.text.clone()),
            remedy: Some(condition.action.remedy),
            since: Some(condition.since),
            source: Some(match kind {
                Kind::Held => HealthSource::Remediation,
                _ => HealthSource::Watcher,
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn tracker() -> Tracker {
        Tracker::new(
            XidPolicy::default(),
            TrackerConfig {
                xid_quiet_period: Duration::from_secs(60),
                history_len: 8,
            },
        )
    }

    fn signals(gpu: u32) -> GpuSignals {
        GpuSignals {
            gpu,
            volatile_dbe: Some(0),
            remap_pending: Some(false),
            remap_failure: Some(false),
            retired_pages_pending: Some(false),
            temperature_c: Some(40),
            slowdown_c: Some(87),
            ..GpuSignals::default()
        }
    }

    #[test]
    fn a_gpu_held_for_its_peers_reset_is_withdrawn_until_let_go_and_its_own_fault_names_it() {
        let mut tr = tracker();
        tr.observe_signals(&signals(1), t(0));
        tr.observe_hold(
            1,
            Some(("the reset of GPU 0 takes it too", HoldEnds::WithTheReset)),
            t(1),
        );
        let held = tr.verdict(1);
        assert_eq!(held.state, HealthState::Unhealthy);
        assert_eq!(held.source, Some(HealthSource::Remediation));
        assert_eq!(
            held.reason.as_deref(),
            Some("held out of service by gpud's remediation: the reset of GPU 0 takes it too")
        );
        // The same hold again changes nothing (not even its since).
        tr.observe_hold(
            1,
            Some(("the reset of GPU 0 takes it too", HoldEnds::WithTheReset)),
            t(2),
        );
        assert_eq!(tr.verdict(1), held);
        // A fault of its own names the state while it is held.
        tr.observe_xid(1, 95, None, t(3));
        assert_eq!(tr.verdict(1).source, Some(HealthSource::Watcher));
        assert_eq!(tr.verdict(1).xid, Some(95));
        tr.observe_reset(1, t(4), t(4));
        assert_eq!(tr.verdict(1), held);
        tr.observe_hold(1, None, t(5));
        assert_eq!(tr.verdict(1), Health::healthy());
    }

    #[test]
    fn a_hold_says_who_ends_it() {
        let mut tr = tracker();
        tr.observe_hold(1, Some(("on its way back", HoldEnds::WithTheReset)), t(1));
        assert_eq!(
            tr.verdict(1).action.as_deref(),
            Some("none: gpud gives it back once the reset it waits for passed every check")
        );
        tr.observe_hold(1, Some(("it failed its checks", HoldEnds::ByHand)), t(2));
        let held = tr.verdict(1);
        assert_eq!(held.state, HealthState::Unhealthy);
        assert_eq!(
            held.action.as_deref(),
            Some(
                "reboot the node (or reset the GPU by hand): gpud keeps it out of service until then"
            )
        );
    }

    #[test]
    fn a_reset_gpud_ran_clears_the_xids_from_before_it_and_what_a_reset_clears() {
        let mut tr = tracker();
        tr.observe_signals(&signals(2), t(0));
        // A fatal XID on a driver without the recovery-action field: no trace of the reset.
        tr.observe_xid(2, 95, None, t(1));
        tr.observe_xid(2, 13, None, t(1));
        tr.observe_xid(2, 95, Some((1, 0)), t(1));
        assert_eq!(tr.verdict(2).state, HealthState::Unhealthy);
        tr.observe_signals(&signals(2), t(2));
        assert_eq!(
            tr.verdict(2).state,
            HealthState::Unhealthy,
            "no trace, no reset seen"
        );
        // A fault after the reset is not the reset's to clear.
        tr.observe_signals(&signals(5), t(0));
        tr.observe_xid(5, 95, None, t(4));
        tr.observe_reset(2, t(3), t(5));
        tr.observe_reset(5, t(3), t(5));
        assert_eq!(tr.verdict(2), Health::healthy());
        assert_eq!(tr.verdict(5).state, HealthState::Unhealthy);
        // Polled conditions stay what NVML says: a remap still pending is still there.
        tr.observe_signals(
            &GpuSignals {
                remap_pending: Some(true),
                ..signals(2)
            },
            t(6),
        );
        tr.observe_reset(2, t(7), t(7));
        assert_eq!(tr.verdict(2).state, HealthState::Unhealthy);
    }

    #[test]
    fn a_reset_is_seen_from_what_it_clears_while_the_gpu_answers_throughout() {
        let asking = |gpu, action| GpuSignals {
            recovery_action: Some(action),
            ..signals(gpu)
        };
        // Recovery action: the driver asks for a reset after the XID, then says none.
        let mut tr = tracker();
        tr.observe_signals(&asking(3, 0), t(0));
        tr.observe_xid(3, 79, None, t(1));
        tr.observe_signals(&asking(3, 0), t(2));
        assert_eq!(
            tr.verdict(3).state,
            HealthState::Unhealthy,
            "none all along is no reset"
        );
        tr.observe_signals(&asking(3, 1), t(3));
        assert_eq!(tr.verdict(3).state, HealthState::Unhealthy);
        tr.observe_signals(&asking(3, 0), t(4));
        assert_eq!(
            tr.verdict(3),
            Health::healthy(),
            "recovery action back to none"
        );
        let history: Vec<&str> = tr.history(3).map(|f| f.what.as_str()).collect();
        assert!(
            history.contains(&"GPU was reset (NVML's recovery action is back to none)"),
            "{history:?}"
        );

        // The volatile uncorrectable-ECC counter, back to 0 after counting.
        let mut tr = tracker();
        tr.observe_xid(2, 48, None, t(0));
        let counted = GpuSignals {
            volatile_dbe: Some(2),
            ..signals(2)
        };
        tr.observe_signals(&counted, t(1));
        assert_eq!(tr.verdict(2).state, HealthState::Unhealthy);
        tr.observe_signals(&signals(2), t(2));
        assert_eq!(tr.verdict(2), Health::healthy(), "DBE counter back to 0");

        // A pending remap applied clears a fatal XID seen with it.
        let mut tr = tracker();
        tr.observe_xid(1, 95, None, t(0));
        let pending = GpuSignals {
            remap_pending: Some(true),
            ..signals(1)
        };
        tr.observe_signals(&pending, t(1));
        tr.observe_signals(&signals(1), t(2));
        assert_eq!(tr.verdict(1), Health::healthy(), "remap applied");

        // A driver without the field (None) never looks reset.
        let mut tr = tracker();
        tr.observe_xid(0, 79, None, t(0));
        let unknown = GpuSignals {
            recovery_action: None,
            ..signals(0)
        };
        tr.observe_signals(&unknown, t(1));
        tr.observe_signals(&unknown, t(2));
        assert_eq!(tr.verdict(0).state, HealthState::Unhealthy);
    }

    #[test]
    fn fatal_xid_is_unhealthy_until_reset() {
        let mut tr = tracker();
        tr.observe_xid(3, 79, None, t(0));
        let h = tr.verdict(3);
        assert_eq!(h.state, HealthState::Unhealthy);
        assert_eq!(
            h.reason.as_deref(),
            Some("XID 79: GPU has fallen off the bus")
        );
        assert_eq!(h.action.as_deref(), Some("drain and reboot the node"));
        assert_eq!(h.xid, Some(79));
        assert_eq!(h.since, Some(t(0)));
        tr.tick(t(3600));
        assert_eq!(
            tr.verdict(3).state,
            HealthState::Unhealthy,
            "fatal does not expire"
        );
        tr.observe_signals(
            &GpuSignals {
                lost: true,
                ..signals(3)
            },
            t(3601),
        );
        tr.observe_signals(&signals(3), t(3602));
        assert_eq!(tr.verdict(3), Health::healthy(), "a reset clears it");
        assert_eq!(tr.verdict(2), Health::healthy());
    }

    #[test]
    fn application_xids_are_ignored_by_default() {
        let mut tr = tracker();
        for code in [13, 31, 43, 45, 68, 109] {
            tr.observe_xid(0, code, None, t(0));
        }
        assert_eq!(tr.verdict(0), Health::healthy());
        assert_eq!(
            tr.history(0).count(),
            6,
            "ignored XIDs are still remembered"
        );
    }

    #[test]
    fn env_overrides_follow_nvidia() {
        let (policy, _) = XidPolicy::from_env_values(Some("94"), Some("13"));
        let mut tr = Tracker::new(policy, TrackerConfig::default());
        tr.observe_xid(0, 94, None, t(0));
        assert_eq!(
            tr.verdict(0),
            Health::healthy(),
            "94 ignored by DP_DISABLE_HEALTHCHECKS"
        );
        tr.observe_xid(0, 13, None, t(1));
        assert_eq!(
            tr.verdict(0).state,
            HealthState::Unhealthy,
            "13 forced by DP_ENABLE_HEALTHCHECKS"
        );

        let (all_off, _) = XidPolicy::from_env_values(Some("all"), None);
        let mut tr = Tracker::new(all_off, TrackerConfig::default());
        tr.observe_xid(0, 79, None, t(0));
        assert_eq!(tr.verdict(0), Health::healthy());
    }

    #[test]
    fn critical_xid_clears_after_quiet_period_and_repeats_extend_it() {
        let mut tr = tracker();
        tr.observe_xid(1, 9999, None, t(0)); // unknown: critical
        assert_eq!(tr.verdict(1).state, HealthState::Unhealthy);
        tr.observe_xid(1, 9999, None, t(50));
        tr.tick(t(100));
        assert_eq!(tr.verdict(1).since, Some(t(0)), "a repeat keeps since");
        tr.tick(t(111));
        assert_eq!(tr.verdict(1), Health::healthy());
    }

    #[test]
    fn dbe_event_then_counter_reset() {
        let mut tr = tracker();
        tr.observe_dbe_event(2, t(0));
        assert_eq!(
            tr.verdict(2).reason.as_deref(),
            Some("uncorrectable (double-bit) ECC error")
        );
        tr.observe_signals(
            &GpuSignals {
                volatile_dbe: Some(1),
                ..signals(2)
            },
            t(1),
        );
        assert_eq!(tr.verdict(2).state, HealthState::Unhealthy);
        tr.observe_signals(&signals(2), t(2));
        assert_eq!(tr.verdict(2), Health::healthy());
    }

    #[test]
    fn remap_pending_and_failure() {
        let mut tr = tracker();
        tr.observe_signals(
            &GpuSignals {
                remap_pending: Some(true),
                ..signals(0)
            },
            t(0),
        );
        assert_eq!(
            tr.verdict(0).action.as_deref(),
            Some("drain and reset the GPU")
        );
        tr.observe_signals(
            &GpuSignals {
                remap_failure: Some(true),
                ..signals(0)
            },
            t(1),
        );
        let h = tr.verdict(0);
        assert!(h.reason.unwrap().starts_with("row remapping failed"));
        tr.observe_signals(&signals(0), t(2));
        assert_eq!(tr.verdict(0), Health::healthy());
    }

    #[test]
    fn mig_attributed_xid_marks_only_that_instance() {
        let mut tr = tracker();
        tr.observe_xid(0, 9999, Some((1, 0)), t(0));
        assert_eq!(tr.verdict(0), Health::healthy());
        assert_eq!(tr.mig_verdict(0, 1, 0).state, HealthState::Unhealthy);
        assert_eq!(tr.mig_verdict(0, 2, 0), Health::healthy());
    }

    #[test]
    fn storm_is_one_state_and_bounded_history() {
        let mut tr = tracker();
        for i in 0..10_000 {
            tr.observe_xid(4, 79, None, t(i / 100));
        }
        let h = tr.verdict(4);
        assert_eq!(h.since, Some(t(0)));
        assert_eq!(tr.history(4).count(), 8);
    }

    #[test]
    fn nvlink_down_only_after_seen_up() {
        let mut tr = tracker();
        tr.observe_signals(
            &GpuSignals {
                nvlinks_up: vec![(0, true), (1, false)],
                ..signals(0)
            },
            t(0),
        );
        assert_eq!(tr.verdict(0), Health::healthy(), "link 1 was never up");
        tr.observe_signals(
            &GpuSignals {
                nvlinks_up: vec![(0, false), (1, false)],
                ..signals(0)
            },
            t(1),
        );
        let h = tr.verdict(0);
        assert_eq!(
            (h.state, h.reason.as_deref()),
            (HealthState::Degraded, Some("NVLink 0 went down"))
        );
        tr.observe_signals(
            &GpuSignals {
                nvlinks_up: vec![(0, true), (1, false)],
                ..signals(0)
            },
            t(2),
        );
        assert_eq!(tr.verdict(0), Health::healthy());
    }

    #[test]
    fn thermal_slowdown_degrades() {
        let mut tr = tracker();
        tr.observe_signals(
            &GpuSignals {
                temperature_c: Some(90),
                ..signals(0)
            },
            t(0),
        );
        let h = tr.verdict(0);
        assert_eq!(h.state, HealthState::Degraded);
        assert_eq!(
            h.reason.as_deref(),
            Some("temperature 90 °C at or past the slowdown threshold 87 °C")
        );
    }
}
