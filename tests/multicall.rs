//! Applet dispatch through the real binary: `gpud <applet>`, `gpud-<applet>` links, `--list`,
//! `--version`, per-applet `--help`, and the usage errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::symlink;
use std::process::Command;

use common::{Node, gpud_bin, stdout_ok};

#[test]
fn list_names_exactly_the_working_applets() {
    let out = Command::new(gpud_bin()).arg("--list").output().unwrap();
    assert_eq!(
        stdout_ok(&out),
        "cdi
cdi-hook
device-plugin
doctor
dra
exporter
health
inventory
labeller
mig
mps-control-daemon
node-status
run
runtime
upgrade
"
    );
}

#[test]
fn version_prints_the_package_version() {
    let out = Command::new(gpud_bin()).arg("--version").output().unwrap();
    assert_eq!(
        stdout_ok(&out),
        format!("gpud {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn unknown_applet_is_one_line_and_exit_64() {
    let out = Command::new(gpud_bin()).arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(out.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "gpud: unknown applet 'frobnicate' (gpud --list shows the applets)\n"
    );
}

#[test]
fn link_named_after_an_applet_runs_it() {
    let node = Node::new("pcie-4gpu");
    let link = node.dir.path().join("gpud-inventory");
    symlink(gpud_bin(), &link).unwrap();
    let mut cmd = Command::new(&link);
    node.wire(&mut cmd);
    let json: serde_json::Value = serde_json::from_str(&stdout_ok(&cmd.output().unwrap())).unwrap();
    assert_eq!(json["gpus"].as_array().unwrap().len(), 4);
}

#[test]
fn link_to_an_unknown_applet_exits_64() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("gpud-nonesuch");
    symlink(gpud_bin(), &link).unwrap();
    let out = Command::new(&link).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "gpud: unknown applet 'nonesuch' (gpud --list shows the applets)\n"
    );
}

#[test]
fn applet_help_exits_zero_and_bad_flags_exit_64() {
    let help = Command::new(gpud_bin())
        .args(["inventory", "--help"])
        .output()
        .unwrap();
    let text = stdout_ok(&help);
    assert!(text.contains("Usage: gpud inventory"), "{text}");
    assert!(text.contains("--nvml-lib <PATH>"), "{text}");

    let bad = Command::new(gpud_bin())
        .args(["inventory", "--format", "yaml"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid value 'yaml' for '--format"));
}

#[test]
fn mistyped_applet_gets_a_suggestion() {
    assert_eq!(
        usage_error(&["labeler"]),
        "gpud: unknown applet 'labeler'; did you mean 'labeller'? (gpud --list shows the applets)\n"
    );
}

/// Runs `gpud <args>`, which must be a usage error (64), and returns its stderr.
fn usage_error(args: &[&str]) -> String {
    let out = Command::new(gpud_bin()).args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn mistyped_flag_gets_a_suggestion() {
    let stderr = usage_error(&["health", "--xid-quiet-perod", "5m"]);
    assert!(
        stderr.starts_with(
            "error: unexpected argument '--xid-quiet-perod' found\n\n  tip: a similar argument \
             exists: '--xid-quiet-period'\n"
        ),
        "{stderr}"
    );
}

#[test]
fn bad_duration_shows_the_format() {
    let stderr = usage_error(&["health", "--xid-quiet-period", "abc"]);
    assert!(
        stderr.starts_with(
            "error: invalid value 'abc' for '--xid-quiet-period <DURATION>': not a duration; \
             write a number with a unit, e.g. 30s, 500ms, 10m or 1h30m\n"
        ),
        "{stderr}"
    );
}

#[test]
fn help_aligns_every_applet_description_in_one_column() {
    let help = Command::new(gpud_bin()).arg("--help").output().unwrap();
    let text = stdout_ok(&help);
    let applets: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "Applets:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    let listed = Command::new(gpud_bin()).arg("--list").output().unwrap();
    let names = stdout_ok(&listed);
    assert_eq!(applets.len(), names.lines().count(), "{text}");
    // Each line is "  <name><spaces><description>": the description starts in one column,
    // with at least two spaces after the name.
    let columns: BTreeSet<usize> = applets
        .iter()
        .map(|line| {
            let name = line.split_whitespace().next().unwrap();
            let after = &line[2 + name.len()..];
            assert!(after.starts_with("  "), "no gap after {name:?}: {line:?}");
            line.len() - after.trim_start().len()
        })
        .collect();
    assert_eq!(
        columns.len(),
        1,
        "descriptions start in several columns:\n{text}"
    );
}
