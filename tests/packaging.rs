//! The shipped systemd unit and its environment file: the unit passes `systemd-analyze
//! verify` with no finding, its `systemd-analyze security` exposure is 3.0 or lower, and every
//! variable the environment file documents is one `gpud run` reads.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::gpud_bin;

fn repo_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

#[test]
fn systemd_unit_verifies_without_findings() {
    let unit = repo_file("systemd/gpud.service")
        .replace("/usr/local/bin/gpud", gpud_bin().to_str().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpud.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian's systemd package) is needed; .ci/run installs it");
    // Unknown keys and bad values are reported on stderr with exit 0, so both must be clean.
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

/// The unit keeps gpud to what it needs (one capability, a system-call filter, address
/// families, a device allow-list, a read-only file system but for three directories); the
/// offline score says whether a change loosened it.
#[test]
fn systemd_unit_exposure_is_at_most_3_0() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/gpud.service");
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian's systemd package) is needed; .ci/run installs it");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let overall = stdout
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for gpud.service: "))
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| {
            panic!(
                "no overall score in:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let score: f64 = overall.split_whitespace().next().unwrap().parse().unwrap();
    println!("systemd-analyze security --offline=yes: {overall}");
    assert!(score <= 3.0, "exposure {overall}:\n{stdout}");
    // The settings the score cannot see but gpud relies on being exact.
    let unit = repo_file("systemd/gpud.service");
    for line in [
        "CapabilityBoundingSet=CAP_SYSLOG",
        "SystemCallFilter=@system-service",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidia-frontend rw",
        "DeviceAllow=/dev/kmsg r",
        "UMask=0077",
        "LimitNOFILE=65536",
        "ProtectSystem=strict",
        "ReadWritePaths=-/var/lib/kubelet/device-plugins -/etc/kubernetes/node-feature-discovery/features.d -/var/run/cdi -/var/lib/kubelet/plugins -/var/lib/kubelet/plugins_registry",
    ] {
        assert!(unit.contains(&format!("\n{line}\n")), "missing {line}");
    }
}

#[test]
fn systemd_unit_runs_gpud_run_and_reloads_with_sighup() {
    let unit = repo_file("systemd/gpud.service");
    assert!(unit.contains("\nExecStart=/usr/local/bin/gpud run $GPUD_ARGS\n"));
    assert!(unit.contains("\nExecReload=/bin/kill -HUP $MAINPID\n"));
    assert!(unit.contains("\nEnvironmentFile=-/etc/default/gpud\n"));
}

#[test]
fn every_documented_variable_is_read_by_gpud_run() {
    let help = Command::new(gpud_bin())
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let env_file = repo_file("systemd/gpud.env");
    let documented: Vec<&str> = env_file
        .lines()
        .filter_map(|l| l.strip_prefix('#')?.split_once('=').map(|(name, _)| name))
        .filter(|name| !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .collect();
    assert!(documented.len() >= 8, "{documented:?}");
    for name in documented {
        if name == "GPUD_ARGS" {
            continue; // the unit's own variable, expanded into ExecStart
        }
        assert!(
            help.contains(name),
            "gpud run --help does not mention {name}"
        );
    }
}
