//! The doctor's checks of the GPUs just reset: `gpud doctor --only gpu,mig.mode --gpu <i,…>`
//! run by this same binary in a child process, so the remediation judges a reset GPU exactly
//! as `gpud doctor` judges any GPU without reaching into the doctor (and a driver call that
//! hangs there hangs a child that is killed at the limit, not gpud).
//!
//! A failed check keeps the GPU out of service; a warning is logged and lets it go back.

use std::path::Path;
use std::time::Duration;

use super::command::{self, Outcome};
use crate::doctor_report::{Report, Status};

/// The checks run: every per-GPU check and whether MIG mode waits for another reset.
const CHECKS: &str = "gpu,mig.mode";
/// Left out: the kernel log's XIDs since boot are history a reset does not erase, and
/// persistence mode is a setting of the node, not the GPU's fitness.
const LEFT_OUT: &str = "gpu.xid,gpu.persistence";

/// The longest the doctor may take (its checks are reads; NVML answers in milliseconds).
pub const LIMIT: Duration = Duration::from_secs(30);

/// What the doctor found on `gpus`: `Ok` with its warnings (each `check: found`) when
/// nothing failed, `Err` with the failed checks (or why the doctor did not answer).
pub async fn check(
    gpud: &Path,
    nvml_lib: &Path,
    gpus: &[u32],
    limit: Duration,
) -> Result<Vec<String>, String> {
    let line = [gpud.display().to_string(), "doctor".to_owned()];
    let indices = gpus
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    // Each check gets half the limit, so the report comes back before the child is killed.
    let per_check = format!("{}ms", (limit / 2).as_millis().max(1));
    let lib = nvml_lib.display().to_string();
    let args = [
        "--json",
        "--only",
        CHECKS,
        "--skip",
        LEFT_OUT,
        "--gpu",
        &indices,
        "--timeout",
        &per_check,
        "--nvml-lib",
        &lib,
    ];
    let (outcome, stdout) = command::output(&line, &args, &[], limit).await;
    match serde_json::from_slice::<Report>(&stdout) {
        Ok(report) => judge(&report),
        Err(_) => Err(match outcome {
            Outcome::Succeeded => "gpud doctor printed no report".to_owned(),
            other => format!("gpud doctor {other}"),
        }),
    }
}

/// The report's failures, or its warnings.
fn judge(report: &Report) -> Result<Vec<String>, String> {
    let said = |status: Status| -> Vec<String> {
        report
            .checks
            .iter()
            .filter(|c| c.status == status)
            .map(|c| format!("{}: {}", c.id, c.found))
            .collect()
    };
    let failed = said(Status::Fail);
    match failed.is_empty() {
        true => Ok(said(Status::Warn)),
        false => Err(failed.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor_report::CheckResult;

    fn result(id: &str, status: Status, found: &str) -> CheckResult {
        CheckResult {
            id: id.into(),
            group: id.split('.').next().unwrap().into(),
            status,
            found: found.into(),
            fix: None,
            duration_ms: 1,
        }
    }

    #[test]
    fn failures_keep_the_gpu_out_and_warnings_let_it_go() {
        let present = result("gpu.present", Status::Ok, "1 GPUs answer");
        let pcie = result(
            "gpu.pcie",
            Status::Warn,
            "GPU 3: PCIe Gen4 x8, maximum Gen5 x16",
        );
        let nvlink = result("gpu.nvlink", Status::Fail, "GPU 3: NVLinks 2, 5 down");
        let memory = result("gpu.memory", Status::Fail, "GPU 3: a row remap is pending");
        let report = |checks: &[&CheckResult]| {
            Report::new("/".into(), checks.iter().map(|&c| c.clone()).collect())
        };
        assert_eq!(
            judge(&report(&[&present, &pcie, &nvlink, &memory])),
            Err(
                "gpu.nvlink: GPU 3: NVLinks 2, 5 down; gpu.memory: GPU 3: a row remap is pending"
                    .to_owned()
            )
        );
        assert_eq!(
            judge(&report(&[&present, &pcie])),
            Ok(vec![
                "gpu.pcie: GPU 3: PCIe Gen4 x8, maximum Gen5 x16".to_owned()
            ])
        );
    }
}
