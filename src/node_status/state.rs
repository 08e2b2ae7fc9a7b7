//! What the Node should show now: every GPU's held health, the conditions and the taints
//! derived from it, and the doctor's held verdict. Pure: fed snapshots, reports and instants,
//! so the hold rules are tested without a clock or an API server.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::doctor_report::Report;
use crate::inventory::model::Snapshot;

use super::conditions::{self, Condition, Counts, GpuHealth};
use super::hold::{Handed, Held};
use super::taints::{Policy, Wanted};

/// The desired state of the Node, held against flapping.
#[derive(Debug)]
pub struct Desired {
    hold: Duration,
    policy: Policy,
    /// Per GPU UUID.
    gpus: BTreeMap<String, Held<GpuHealth>>,
    gpu_condition: Held<Condition>,
    /// `None` when this process runs no doctor.
    doctor: Option<Held<Condition>>,
    taints: BTreeMap<&'static str, Held<Wanted>>,
}

impl Desired {
    /// The state for the first snapshot (and doctor report, with `with_doctor`), shown as it is.
    pub fn new(
        hold: Duration,
        policy: Policy,
        snapshot: &Snapshot,
        with_doctor: bool,
        report: Option<&Report>,
        now: Instant,
    ) -> Self {
        let gpus: BTreeMap<String, Held<GpuHealth>> = conditions::gpus(snapshot)
            .into_iter()
            .map(|g| (g.uuid.clone(), Held::quiet(g, hold, now)))
            .collect();
        let shown = shown_gpus(&gpus);
        let taints = policy
            .wanted(Counts::of(&shown))
            .into_iter()
            .map(|w| (w.key, Held::new(w, hold, now)))
            .collect();
        Desired {
            hold,
            policy,
            gpu_condition: Held::new(conditions::gpu_condition(&shown), hold, now),
            doctor: with_doctor
                .then(|| Held::quiet(conditions::doctor_condition(report), hold, now)),
            gpus,
            taints,
        }
    }

    /// The GPUs' held health, by UUID, to hand to the gpud that takes over ([`handed`]).
    pub fn held_gpus(&self) -> BTreeMap<String, Held<GpuHealth>> {
        self.gpus.clone()
    }

    /// Goes on holding the GPUs' health where the gpud taken over from was (GPUs it did not
    /// know start as this process sees them).
    pub fn take_on(&mut self, handed: BTreeMap<String, Handed<GpuHealth>>, now: Instant) {
        for (uuid, handed) in handed {
            if let Some(held) = self.gpus.get_mut(&uuid) {
                held.take_on(handed, now);
            }
        }
        self.derive(now);
    }

    /// Takes in the GPUs' health now.
    pub fn observe_gpus(&mut self, snapshot: &Snapshot, now: Instant) {
        let seen = conditions::gpus(snapshot);
        self.gpus
            .retain(|uuid, _| seen.iter().any(|g| &g.uuid == uuid));
        for gpu in seen {
            match self.gpus.get_mut(&gpu.uuid) {
                Some(held) => held.observe(gpu, now),
                None => {
                    self.gpus
                        .insert(gpu.uuid.clone(), Held::quiet(gpu, self.hold, now));
                }
            }
        }
        self.derive(now);
    }

    /// Takes in the doctor's latest report; returns the doctor condition when its shown
    /// status changed.
    pub fn observe_doctor(&mut self, report: Option<&Report>, now: Instant) -> Option<Condition> {
        let held = self.doctor.as_mut()?;
        let before = held.shown().status;
        held.observe(conditions::doctor_condition(report), now);
        (held.shown().status != before).then(|| held.shown().clone())
    }

    /// Lets held values change that may at `now`; returns the doctor condition when its
    /// shown status changed.
    pub fn settle(&mut self, now: Instant) -> Option<Condition> {
        for held in self.gpus.values_mut() {
            held.settle(now);
        }
        self.derive(now);
        let held = self.doctor.as_mut()?;
        let before = held.shown().status;
        held.settle(now);
        (held.shown().status != before).then(|| held.shown().clone())
    }

    /// Recomputes the conditions and taints from the GPUs' shown health.
    fn derive(&mut self, now: Instant) {
        let shown = shown_gpus(&self.gpus);
        self.gpu_condition
            .observe(conditions::gpu_condition(&shown), now);
        for want in self.policy.wanted(Counts::of(&shown)) {
            if let Some(held) = self.taints.get_mut(want.key) {
                held.observe(want, now);
            }
        }
    }

    /// The conditions to write, GPU health first.
    pub fn conditions(&self) -> Vec<Condition> {
        std::iter::once(self.gpu_condition.shown().clone())
            .chain(self.doctor.as_ref().map(|d| d.shown().clone()))
            .collect()
    }

    /// The configured taints, each present or not.
    pub fn taints(&self) -> Vec<Wanted> {
        self.taints.values().map(|h| *h.shown()).collect()
    }

    /// When a held value may change next.
    pub fn deadline(&self) -> Option<Instant> {
        self.gpus
            .values()
            .map(Held::deadline)
            .chain(std::iter::once(self.gpu_condition.deadline()))
            .chain(self.doctor.as_ref().map(Held::deadline))
            .chain(self.taints.values().map(Held::deadline))
            .flatten()
            .min()
    }
}

/// The GPUs' held health (from [`Desired::held_gpus`]) as handed over at `now`.
pub fn handed(
    gpus: &BTreeMap<String, Held<GpuHealth>>,
    now: Instant,
) -> BTreeMap<String, Handed<GpuHealth>> {
    gpus.iter()
        .map(|(uuid, held)| (uuid.clone(), held.handed(now)))
        .collect()
}

/// The GPUs' shown health, by index.
fn shown_gpus(gpus: &BTreeMap<String, Held<GpuHealth>>) -> Vec<GpuHealth> {
    let mut shown: Vec<GpuHealth> = gpus.values().map(|h| h.shown().clone()).collect();
    shown.sort_by_key(|g| g.index);
    shown
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::health::Health;
    use crate::inventory::test_support;
    use crate::node_status::conditions::Status;
    use crate::node_status::taints::{Effect, UNHEALTHY_KEY};

    const HOLD: Duration = Duration::from_secs(300);

    fn dgx() -> Snapshot {
        Snapshot {
            gpus: (0..8)
                .map(|i| test_support::gpu(i, &format!("GPU-{i}"), "NVIDIA H100 80GB HBM3", 81559))
                .collect(),
            ..Snapshot::default()
        }
    }

    fn lose(snapshot: &Snapshot, index: usize) -> Snapshot {
        let mut lost = snapshot.clone();
        lost.gpus[index].health = Health::lost(std::time::SystemTime::UNIX_EPOCH);
        lost
    }

    #[test]
    fn a_flapping_gpu_changes_the_condition_and_taint_once_per_hold() {
        let healthy = dgx();
        let sick = lose(&healthy, 3);
        let policy = Policy {
            unhealthy: Some(Effect::NoSchedule),
            ..Policy::default()
        };
        let t = Instant::now();
        let mut desired = Desired::new(HOLD, policy, &healthy, false, None, t);
        assert_eq!(desired.conditions()[0].status, Status::True);
        let mut statuses = vec![Status::True];
        for second in 1..=100u64 {
            let now = t + Duration::from_secs(second);
            let snapshot = if second % 2 == 1 { &sick } else { &healthy };
            desired.observe_gpus(snapshot, now);
            desired.settle(now);
            let status = desired.conditions()[0].status;
            if statuses.last() != Some(&status) {
                statuses.push(status);
            }
        }
        assert_eq!(statuses, [Status::True, Status::False]);
        assert!(desired.taints()[0].present);
        assert_eq!(desired.taints()[0].key, UNHEALTHY_KEY);
        // Healthy since second 100: shown healthy 300 s later, not before.
        assert!(desired.deadline().is_some());
        desired.settle(t + Duration::from_secs(399));
        assert_eq!(desired.conditions()[0].status, Status::False);
        desired.settle(t + Duration::from_secs(400));
        assert_eq!(desired.conditions()[0].status, Status::True);
        assert!(!desired.taints()[0].present);
        assert_eq!(desired.deadline(), None);
    }

    #[test]
    fn the_doctor_condition_is_unknown_until_the_first_report() {
        let healthy = dgx();
        let t = Instant::now();
        let desired = Desired::new(HOLD, Policy::default(), &healthy, true, None, t);
        let kinds: Vec<_> = desired
            .conditions()
            .iter()
            .map(|c| (c.kind, c.status))
            .collect();
        assert_eq!(
            kinds,
            [
                ("GPUHealthy", Status::True),
                ("GPUStackValidated", Status::Unknown)
            ]
        );
    }
}
