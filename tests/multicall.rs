//! Applet dispatch through the real binary: `gpud <applet>`, `gpud-<applet>` links, `--list`,
//! `--version`, per-applet `--help`, and the usage errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::symlink;
use std::process::Command;

use common::{Node, gpud_bin, stdout_ok};

#[test]
fn list_names_exactly_the_working_applets() {
    let out = Command::new(gpud_bin()).arg("--list").output().unwrap();
    assert_eq!(
        stdout_ok(&out),
        "cdi\ndevice-plugin\ndoctor\nexporter\nhealth\ninventory\nlabeller\nnode-status\nrun\n"
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
