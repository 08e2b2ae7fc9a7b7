//! The Node conditions gpud owns, worked out from the GPUs' health and the doctor's report.
//!
//! Both have positive polarity (`True` is good), as the kubelet's `Ready` and EKS's
//! `AcceleratedHardwareReady`:
//! - [`GPU_CONDITION`] (`GPUHealthy`): every GPU healthy (degraded GPUs are named in the
//!   message but keep it `True`); `False` names each unhealthy GPU with its reason, XID and the
//!   suggested action. The message starts with gpud's per-node counts.
//! - [`DOCTOR_CONDITION`] (`GPUStackValidated`): the latest doctor run found no failing
//!   check; `False` lists the failing checks, `Unknown` until the first run finished.

use crate::doctor_report::{Report, Status as CheckStatus};
use crate::inventory::health::{Health, HealthState};
use crate::inventory::model::Snapshot;
use crate::inventory::transitions::state_word;

use super::hold::Severity;

/// Condition type for the GPUs' health.
pub const GPU_CONDITION: &str = "GPUHealthy";
/// Condition type for the doctor's verdict on the GPU stack.
pub const DOCTOR_CONDITION: &str = "GPUStackValidated";
/// Longest message written; longer ones end in `…`.
pub const MAX_MESSAGE: usize = crate::kube::MAX_CONDITION_MESSAGE;

/// A condition's status, as Kubernetes spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }

    /// Parses the API's spelling; anything else is `Unknown`.
    pub fn parse(text: &str) -> Status {
        match text {
            "True" => Status::True,
            "False" => Status::False,
            _ => Status::Unknown,
        }
    }
}

/// One condition gpud owns, without its timestamps (the writer adds them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub kind: &'static str,
    pub status: Status,
    pub reason: &'static str,
    pub message: String,
}

impl Severity for Condition {
    fn severity(&self) -> u8 {
        match self.status {
            Status::True => 0,
            Status::Unknown => 1,
            Status::False => 2,
        }
    }
}

/// One physical GPU's health as the node status sees it: the worst of the GPU's own state
/// and its MIG devices'.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GpuHealth {
    pub index: u32,
    pub uuid: String,
    pub health: Health,
    /// What admins' DeviceTaintRules put on the GPU's DRA devices: named in the message,
    /// not a verdict on the GPU's health.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_taints: Vec<crate::inventory::device_taints::RuleTaint>,
}

impl Severity for GpuHealth {
    fn severity(&self) -> u8 {
        match self.health.state {
            HealthState::Healthy => 0,
            HealthState::Degraded => 1,
            HealthState::Unhealthy => 2,
        }
    }
}

/// Every GPU of `snapshot`, with the worst state of the GPU and its MIG devices.
pub fn gpus(snapshot: &Snapshot) -> Vec<GpuHealth> {
    snapshot
        .gpus
        .iter()
        .map(|gpu| {
            let worst = std::iter::once(&gpu.health)
                .chain(gpu.mig.devices.iter().map(|m| &m.health))
                .fold(&gpu.health, |a, b| if b.state > a.state { b } else { a });
            GpuHealth {
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                health: worst.clone(),
                device_taints: gpu.device_taints.clone(),
            }
        })
        .collect()
}

/// How many GPUs are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub healthy: usize,
    pub degraded: usize,
    pub unhealthy: usize,
}

impl Counts {
    pub fn of(gpus: &[GpuHealth]) -> Counts {
        let mut counts = Counts::default();
        for gpu in gpus {
            match gpu.health.state {
                HealthState::Healthy => counts.healthy += 1,
                HealthState::Degraded => counts.degraded += 1,
                HealthState::Unhealthy => counts.unhealthy += 1,
            }
        }
        counts
    }

    /// `8 GPUs: 7 healthy, 0 degraded, 1 unhealthy`.
    pub fn line(&self) -> String {
        let total = self.healthy + self.degraded + self.unhealthy;
        let noun = if total == 1 { "GPU" } else { "GPUs" };
        format!(
            "{total} {noun}: {} healthy, {} degraded, {} unhealthy",
            self.healthy, self.degraded, self.unhealthy
        )
    }
}

/// `GPU 3 GPU-…: unhealthy: XID 79: GPU has fallen off the bus — drain and reboot the node`.
fn describe(gpu: &GpuHealth) -> String {
    let mut text = format!(
        "GPU {} {}: {}",
        gpu.index,
        gpu.uuid,
        state_word(gpu.health.state)
    );
    if let Some(reason) = &gpu.health.reason {
        text.push_str(": ");
        text.push_str(reason);
    }
    if let Some(action) = &gpu.health.action {
        text.push_str(" — ");
        text.push_str(action);
    }
    text
}

/// The `GPUHealthy` condition for the GPUs' (held) health.
pub fn gpu_condition(gpus: &[GpuHealth]) -> Condition {
    let counts = Counts::of(gpus);
    let (status, reason) = if gpus.is_empty() {
        (Status::Unknown, "NoGPUs")
    } else if let Some(first) = gpus
        .iter()
        .find(|g| g.health.state == HealthState::Unhealthy)
    {
        let reason = if first.health.xid.is_some() {
            "GPUXIDError"
        } else if first.health.set_by_discovery() {
            "GPUUnreachable"
        } else {
            "GPUUnhealthy"
        };
        (Status::False, reason)
    } else if counts.degraded > 0 {
        (Status::True, "GPUsDegraded")
    } else {
        (Status::True, "AllGPUsHealthy")
    };
    let mut message = counts.line();
    let named: Vec<String> = gpus
        .iter()
        .filter(|g| !g.health.is_healthy())
        .map(describe)
        .collect();
    if !named.is_empty() {
        message.push_str(". ");
        message.push_str(&named.join("; "));
    }
    let tainted: Vec<String> = gpus
        .iter()
        .flat_map(|g| {
            g.device_taints.iter().map(move |t| {
                format!(
                    "GPU {} {}: {} {} by DeviceTaintRule {}",
                    g.index,
                    g.uuid,
                    t.device,
                    t.spelled(),
                    t.rule
                )
            })
        })
        .collect();
    if !tainted.is_empty() {
        message.push_str(". Tainted by an admin: ");
        message.push_str(&tainted.join("; "));
    }
    Condition {
        kind: GPU_CONDITION,
        status,
        reason,
        message: crate::kube::clip_message(message),
    }
}

/// The `GPUStackValidated` condition for the doctor's latest report (`None`: not run yet).
pub fn doctor_condition(report: Option<&Report>) -> Condition {
    let Some(report) = report else {
        return Condition {
            kind: DOCTOR_CONDITION,
            status: Status::Unknown,
            reason: "DoctorNotRunYet",
            message: "the first doctor run has not finished".to_owned(),
        };
    };
    let listed = |status: CheckStatus| -> Vec<String> {
        report
            .checks
            .iter()
            .filter(|c| c.status == status)
            .map(|c| match &c.fix {
                Some(fix) => format!("{}: {} — {fix}", c.id, c.found),
                None => format!("{}: {}", c.id, c.found),
            })
            .collect()
    };
    let s = &report.summary;
    let counts = format!(
        "doctor: {} ok, {} warn, {} fail, {} skipped",
        s.ok, s.warn, s.fail, s.skip
    );
    let (status, reason, details) = if s.fail > 0 {
        (
            Status::False,
            "DoctorChecksFailed",
            listed(CheckStatus::Fail),
        )
    } else if s.warn > 0 {
        (
            Status::True,
            "DoctorPassedWithWarnings",
            listed(CheckStatus::Warn),
        )
    } else {
        (Status::True, "DoctorPassed", Vec::new())
    };
    let mut message = counts;
    if !details.is_empty() {
        message.push_str(". ");
        message.push_str(&details.join("; "));
    }
    Condition {
        kind: DOCTOR_CONDITION,
        status,
        reason,
        message: crate::kube::clip_message(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor_report::CheckResult;
    use crate::inventory::health::HealthSource;

    fn gpu(index: u32, health: Health) -> GpuHealth {
        GpuHealth {
            index,
            uuid: format!("GPU-{index}"),
            health,
            device_taints: Vec::new(),
        }
    }

    #[test]
    fn an_admins_device_taint_is_named_without_changing_the_verdict() {
        let mut tainted = gpu(3, Health::healthy());
        tainted.device_taints = vec![crate::inventory::device_taints::RuleTaint {
            rule: "maint".into(),
            device: "gpu-3".into(),
            key: "example.com/maintenance".into(),
            value: Some("bios".into()),
            effect: "NoExecute".into(),
        }];
        let condition = gpu_condition(&[gpu(0, Health::healthy()), tainted]);
        assert_eq!(condition.status, Status::True);
        assert_eq!(condition.reason, "AllGPUsHealthy");
        assert_eq!(
            condition.message,
            "2 GPUs: 2 healthy, 0 degraded, 0 unhealthy. Tainted by an admin: GPU 3 GPU-3: \
             gpu-3 example.com/maintenance=bios:NoExecute by DeviceTaintRule maint"
        );
    }

    fn xid(state: HealthState, code: u32, reason: &str, action: &str) -> Health {
        Health {
            state,
            reason: Some(format!("XID {code}: {reason}")),
            xid: Some(code),
            action: Some(action.to_owned()),
            remedy: None,
            since: None,
            source: Some(HealthSource::Watcher),
        }
    }

    #[test]
    fn all_healthy_is_true_with_the_counts() {
        let gpus: Vec<_> = (0..8).map(|i| gpu(i, Health::healthy())).collect();
        assert_eq!(
            gpu_condition(&gpus),
            Condition {
                kind: "GPUHealthy",
                status: Status::True,
                reason: "AllGPUsHealthy",
                message: "8 GPUs: 8 healthy, 0 degraded, 0 unhealthy".into(),
            }
        );
    }

    #[test]
    fn a_fatal_xid_is_false_naming_gpu_xid_and_action() {
        let mut gpus: Vec<_> = (0..4).map(|i| gpu(i, Health::healthy())).collect();
        gpus[3].health = xid(
            HealthState::Unhealthy,
            79,
            "GPU has fallen off the bus",
            "drain and reboot the node",
        );
        gpus[1].health = xid(HealthState::Degraded, 63, "row remapping", "reset the GPU");
        let condition = gpu_condition(&gpus);
        assert_eq!(
            (condition.status, condition.reason),
            (Status::False, "GPUXIDError")
        );
        assert_eq!(
            condition.message,
            "4 GPUs: 2 healthy, 1 degraded, 1 unhealthy. \
             GPU 1 GPU-1: degraded: XID 63: row remapping — reset the GPU; \
             GPU 3 GPU-3: unhealthy: XID 79: GPU has fallen off the bus — drain and reboot the node"
        );
    }

    #[test]
    fn degraded_only_stays_true() {
        let gpus = vec![gpu(
            0,
            xid(HealthState::Degraded, 63, "row remapping", "reset the GPU"),
        )];
        let condition = gpu_condition(&gpus);
        assert_eq!(
            (condition.status, condition.reason),
            (Status::True, "GPUsDegraded")
        );
    }

    #[test]
    fn a_lost_gpu_is_unreachable() {
        let gpus = vec![gpu(0, Health::lost(std::time::SystemTime::UNIX_EPOCH))];
        assert_eq!(gpu_condition(&gpus).reason, "GPUUnreachable");
    }

    #[test]
    fn no_gpus_is_unknown() {
        assert_eq!(gpu_condition(&[]).status, Status::Unknown);
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let text = crate::kube::clip_message("é".repeat(2000));
        assert!(text.len() <= MAX_MESSAGE && text.ends_with('…'));
    }

    #[test]
    fn doctor_failures_are_listed_with_their_fix() {
        let check = |id: &str, status, fix: Option<&str>| CheckResult {
            id: id.into(),
            group: id.split('.').next().unwrap_or_default().into(),
            status,
            found: format!("{id} found"),
            fix: fix.map(Into::into),
            duration_ms: 1,
        };
        let report = Report::new(
            "/".into(),
            vec![
                check("driver.loaded", CheckStatus::Ok, None),
                check("gpu.present", CheckStatus::Fail, Some("reboot")),
                check("mig.mode", CheckStatus::Warn, Some("reset")),
            ],
        );
        let condition = doctor_condition(Some(&report));
        assert_eq!(
            (condition.kind, condition.status, condition.reason),
            ("GPUStackValidated", Status::False, "DoctorChecksFailed")
        );
        assert_eq!(
            condition.message,
            "doctor: 1 ok, 1 warn, 1 fail, 0 skipped. gpu.present: gpu.present found — reboot"
        );
        assert_eq!(doctor_condition(None).status, Status::Unknown);
    }
}
