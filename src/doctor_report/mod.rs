//! The doctor's report as plain data: one result per check, a summary, and the exit code it
//! implies. The doctor writes it; the node status and the admin endpoint read it, through
//! [`LatestReport`] inside a daemon.

mod latest;

pub use latest::LatestReport;

use serde::{Deserialize, Serialize};

/// The JSON schema identifier; bumped only for incompatible changes.
pub const SCHEMA: &str = "gpud.doctor/v1";

/// A check's outcome, least serious first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The check does not apply here; `found` says why.
    Skip,
    /// Nothing wrong.
    Ok,
    /// Works now, but something needs attention.
    Warn,
    /// Broken: GPU workloads fail or will fail.
    Fail,
}

impl Status {
    /// The word printed in the table and the JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Skip => "skip",
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// What a check concluded: its status, what it found, and the fix in one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub status: Status,
    pub found: String,
    pub fix: Option<String>,
}

impl Verdict {
    pub fn ok(found: impl Into<String>) -> Self {
        Verdict {
            status: Status::Ok,
            found: found.into(),
            fix: None,
        }
    }

    pub fn skip(why: impl Into<String>) -> Self {
        Verdict {
            status: Status::Skip,
            found: why.into(),
            fix: None,
        }
    }

    pub fn warn(found: impl Into<String>, fix: impl Into<String>) -> Self {
        Verdict {
            status: Status::Warn,
            found: found.into(),
            fix: Some(fix.into()),
        }
    }

    pub fn fail(found: impl Into<String>, fix: impl Into<String>) -> Self {
        Verdict {
            status: Status::Fail,
            found: found.into(),
            fix: Some(fix.into()),
        }
    }
}

/// One check's line in the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    /// `group.name`, e.g. `gpu.ecc`.
    pub id: String,
    /// The part of the id before the dot.
    pub group: String,
    pub status: Status,
    pub found: String,
    /// One line saying what to do; absent for `ok` and `skip`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// How long the check took, in milliseconds.
    pub duration_ms: u64,
}

/// Counts by status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub ok: usize,
    pub warn: usize,
    pub fail: usize,
    pub skip: usize,
}

/// A whole doctor run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// gpud's version.
    pub version: String,
    /// When the run finished, RFC 3339 UTC.
    pub generated_at: String,
    /// The host root the checks read under.
    pub host_root: String,
    pub summary: Summary,
    /// In the order of the check catalog.
    pub checks: Vec<CheckResult>,
}

impl Report {
    /// A report over `checks`, stamped now.
    pub fn new(host_root: String, checks: Vec<CheckResult>) -> Self {
        let mut summary = Summary::default();
        for check in &checks {
            match check.status {
                Status::Ok => summary.ok += 1,
                Status::Warn => summary.warn += 1,
                Status::Fail => summary.fail += 1,
                Status::Skip => summary.skip += 1,
            }
        }
        Report {
            schema: SCHEMA.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            generated_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now())
                .to_string(),
            host_root,
            summary,
            checks,
        }
    }

    /// The worst status of any check (`Ok` for an empty report).
    pub fn worst(&self) -> Status {
        self.checks
            .iter()
            .map(|c| c.status)
            .max()
            .unwrap_or(Status::Ok)
            .max(Status::Ok)
    }

    /// 0 clean, 1 warnings only, 2 failures.
    pub fn exit_code(&self) -> u8 {
        match self.worst() {
            Status::Fail => 2,
            Status::Warn => 1,
            Status::Ok | Status::Skip => 0,
        }
    }

    /// The result of check `id`, if it ran.
    pub fn check(&self, id: &str) -> Option<&CheckResult> {
        self.checks.iter().find(|c| c.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(id: &str, status: Status) -> CheckResult {
        CheckResult {
            id: id.to_owned(),
            group: id.split('.').next().unwrap_or("").to_owned(),
            status,
            found: String::new(),
            fix: None,
            duration_ms: 0,
        }
    }

    #[test]
    fn exit_code_follows_the_worst_status() {
        let report = |statuses: &[Status]| {
            Report::new(
                "/".into(),
                statuses.iter().map(|s| result("a.b", *s)).collect(),
            )
        };
        assert_eq!(report(&[]).exit_code(), 0);
        assert_eq!(report(&[Status::Ok, Status::Skip]).exit_code(), 0);
        assert_eq!(report(&[Status::Ok, Status::Warn]).exit_code(), 1);
        assert_eq!(report(&[Status::Fail, Status::Warn]).exit_code(), 2);
        let r = report(&[Status::Ok, Status::Warn, Status::Skip, Status::Skip]);
        assert_eq!(
            r.summary,
            Summary {
                ok: 1,
                warn: 1,
                fail: 0,
                skip: 2
            }
        );
    }
}
