//! The report as a table for people (colour only on a terminal) and as JSON for machines.

use crate::doctor_report::{Report, Status};

/// The table: one line per check (`CHECK  STATUS  FOUND`), the fix on the line below when
/// there is one, and a summary line.
pub fn table(report: &Report, colour: bool) -> String {
    let width = report
        .checks
        .iter()
        .map(|c| c.id.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!("{:<width$}  {:<6}  FOUND\n", "CHECK", "STATUS");
    for check in &report.checks {
        let status = check.status.as_str();
        let padded = format!("{status:<6}");
        let shown = if colour {
            paint(check.status, &padded)
        } else {
            padded
        };
        out.push_str(&format!("{:<width$}  {shown}  {}\n", check.id, check.found));
        if let Some(fix) = &check.fix {
            out.push_str(&format!("{:<width$}  {:<6}  fix: {fix}\n", "", ""));
        }
    }
    let s = report.summary;
    out.push_str(&format!(
        "\n{} ok, {} warn, {} fail, {} skip\n",
        s.ok, s.warn, s.fail, s.skip
    ));
    out
}

fn paint(status: Status, text: &str) -> String {
    let code = match status {
        Status::Ok => "32",
        Status::Warn => "33",
        Status::Fail => "31",
        Status::Skip => "2",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

/// Pretty JSON, newline-terminated.
pub fn json(report: &Report) -> String {
    match serde_json::to_string_pretty(report) {
        Ok(mut text) => {
            text.push('\n');
            text
        }
        // Plain data always serialises; say so in the output rather than panic if it ever
        // did not.
        Err(err) => format!("{{\"error\":\"cannot serialise the report: {err}\"}}\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor_report::CheckResult;

    #[test]
    fn table_lines_and_fix_below() {
        let report = Report::new(
            "/".into(),
            vec![
                CheckResult {
                    id: "gpu.ecc".into(),
                    group: "gpu".into(),
                    status: Status::Warn,
                    found: "GPU 0: pending".into(),
                    fix: Some("reboot".into()),
                    duration_ms: 1,
                },
                CheckResult {
                    id: "selinux.mode".into(),
                    group: "selinux".into(),
                    status: Status::Ok,
                    found: "SELinux is not enabled".into(),
                    fix: None,
                    duration_ms: 0,
                },
            ],
        );
        assert_eq!(
            table(&report, false),
            "CHECK         STATUS  FOUND\n\
             gpu.ecc       warn    GPU 0: pending\n\
             \x20                     fix: reboot\n\
             selinux.mode  ok      SELinux is not enabled\n\
             \n1 ok, 1 warn, 0 fail, 0 skip\n"
        );
        assert!(table(&report, true).contains("\x1b[33mwarn  \x1b[0m"));
    }
}
