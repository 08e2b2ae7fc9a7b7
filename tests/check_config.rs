//! `--check-config`: every daemon applet and `run` validate their command line, environment
//! and config files and exit (0, 64 or 65) without loading NVML or binding anything; and the
//! simulated NVML declares the driver's needed libraries, so the image carries them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Output};

use common::{gpud_bin, mock_lib};

const DAEMONS: &[&str] = &["device-plugin", "labeller", "exporter", "health", "run"];

/// gpud with a clean environment: no NVML library at all (a wrong explicit path), so a check
/// that tried to load it would exit 69 instead of 0.
fn check(args: &[&str]) -> Output {
    Command::new(gpud_bin())
        .args(args)
        .arg("--check-config")
        .env_clear()
        .env("GPUD_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
        .env("NODE_NAME", "gpu-node-1")
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_good_command_line_exits_0_without_nvml() {
    for applet in DAEMONS {
        let out = check(&[applet]);
        assert_eq!(out.status.code(), Some(0), "{applet}: {}", stderr(&out));
        assert_eq!(
            stderr(&out),
            "gpud: the command line, environment and config files are valid\n",
            "{applet}"
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "", "{applet}");
    }
}

#[test]
fn an_unknown_flag_exits_64() {
    for applet in DAEMONS {
        let out = check(&[applet, "--no-such-flag"]);
        assert_eq!(out.status.code(), Some(64), "{applet}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("unexpected argument '--no-such-flag'"),
            "{applet}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn a_bad_config_file_exits_65_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpud.yaml");
    std::fs::write(&path, "health:\n  pollInterval: soon\n").unwrap();
    let path = path.to_str().unwrap();
    for applet in DAEMONS {
        let out = check(&[applet, "--config", path]);
        assert_eq!(out.status.code(), Some(65), "{applet}: {}", stderr(&out));
        assert!(
            stderr(&out).starts_with(&format!("gpud: {path}")),
            "{applet}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn a_bad_nvidia_config_file_exits_65_naming_file_field_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, "version: v1\nflags:\n  migStrategy: bogus\n").unwrap();
    let path = path.to_str().unwrap();
    for applet in ["device-plugin", "labeller", "run"] {
        let out = check(&[applet, "--config-file", path]);
        assert_eq!(out.status.code(), Some(65), "{applet}: {}", stderr(&out));
        assert_eq!(
            stderr(&out),
            format!(
                "gpud: {path}: field flags.migStrategy: invalid value \"bogus\": must be one of none, single, mixed\n"
            ),
            "{applet}"
        );
    }
}

#[test]
fn a_bad_environment_value_exits_64() {
    let out = Command::new(gpud_bin())
        .args(["labeller", "--check-config"])
        .env_clear()
        .env("GPUD_LABELLER_SINK", "bogus")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains("invalid value 'bogus' for '--sink <SINK>'"));
}

/// The applets that rescan the node, which all take --rescan-interval.
const RESCANNING: &[&str] = &[
    "run",
    "device-plugin",
    "dra",
    "exporter",
    "labeller",
    "mps-control-daemon",
];

/// `check` with `env` added.
fn check_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(gpud_bin())
        .args(args)
        .arg("--check-config")
        .env_clear()
        .env("GPUD_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
        .env("NODE_NAME", "gpu-node-1")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

#[test]
fn every_rescanning_applet_reads_gpud_rescan_interval() {
    for applet in RESCANNING {
        let out = check_with(&[applet], &[("GPUD_RESCAN_INTERVAL", "0s")]);
        assert_eq!(out.status.code(), Some(64), "{applet}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("invalid value '0s' for '--rescan-interval <DURATION>'"),
            "{applet}: {}",
            stderr(&out)
        );
    }
}

/// The applets that talk to the API server, which all take its client's flags, from one
/// declaration: the exporter (per-pod usage) paces its requests as the others do.
const API_CLIENTS: &[&[&str]] = &[
    &["run"],
    &["dra"],
    &["exporter"],
    &["labeller"],
    &["node-status"],
    &["mps-control-daemon"],
    &["mig", "reconcile"],
];

#[test]
fn every_api_client_reads_the_api_pace() {
    for applet in API_CLIENTS {
        let out = check_with(applet, &[("GPUD_API_QPS", "0")]);
        assert_eq!(out.status.code(), Some(64), "{applet:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("invalid value '0' for '--api-qps <QPS>'"),
            "{applet:?}: {}",
            stderr(&out)
        );
        let mut args = applet.to_vec();
        args.extend(["--api-burst", "0"]);
        let out = check_with(&args, &[]);
        assert_eq!(out.status.code(), Some(64), "{applet:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("for '--api-burst <N>'"),
            "{applet:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn the_labellers_former_rescan_variable_is_read_after_the_shared_one() {
    let bad_legacy = [("GPUD_LABELLER_RESCAN_INTERVAL", "0s")];
    let out = check_with(&["labeller"], &bad_legacy);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("invalid value '0s' for GPUD_LABELLER_RESCAN_INTERVAL"),
        "{}",
        stderr(&out)
    );
    // The flag or the shared variable wins: the former one is not read at all.
    let out = check_with(&["labeller", "--rescan-interval", "5s"], &bad_legacy);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = check_with(
        &["labeller"],
        &[bad_legacy[0], ("GPUD_RESCAN_INTERVAL", "5s")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = check_with(&["labeller"], &[("GPUD_LABELLER_RESCAN_INTERVAL", "10s")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn the_mock_needs_the_libraries_the_driver_needs() {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(mock_lib())
        .output()
        .expect("readelf (binutils) is needed");
    let text = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.strip_suffix(']'))
        .collect();
    for lib in [
        "libc.so.6",
        "libm.so.6",
        "libdl.so.2",
        "libpthread.so.0",
        "librt.so.1",
    ] {
        assert!(needed.contains(&lib), "{lib} not in {needed:?}");
    }
}

#[test]
fn a_config_that_is_a_fifo_or_a_device_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("config.yaml");
    // A FIFO nobody writes to: a reader that opened it the ordinary way would wait forever.
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let zero = dir.path().join("zero.yaml");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let (fifo, zero) = (fifo.to_str().unwrap(), zero.to_str().unwrap());
    let cases: &[(&[&str], &str, &str)] = &[
        (&["run", "--config"], fifo, "a FIFO"),
        (&["run", "--config-file"], fifo, "a FIFO"),
        (
            &["device-plugin", "--config-file"],
            zero,
            "a character device",
        ),
        (&["exporter", "-f"], fifo, "a FIFO"),
        (&["labeller", "--config-file"], zero, "a character device"),
    ];
    for (args, path, kind) in cases {
        let mut argv = args.to_vec();
        argv.push(path);
        let out = check(&argv);
        assert_eq!(out.status.code(), Some(65), "{argv:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!(
                "{path}: is {kind}, not a regular file; refused without reading"
            )),
            "{argv:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn a_counters_file_the_exporter_would_refuse_fails_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "DCGM_FI_DEV_GPU_UTIL, gauge, util\nDCGM_FI_DEV_GPU_UTIL, gauge, again\n",
            "already listed on line 1",
        ),
        ("NOT_A_FIELD, gauge, nothing\n", "not a DCGM field name"),
    ];
    for (n, (text, reason)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("counters{n}.csv"));
        std::fs::write(&path, text).unwrap();
        let path = path.to_str().unwrap();
        let out = check(&["exporter", "-f", path]);
        assert_eq!(out.status.code(), Some(65), "{text}: {}", stderr(&out));
        assert!(
            stderr(&out).starts_with(&format!("gpud: {path}")) && stderr(&out).contains(reason),
            "{text}: {}",
            stderr(&out)
        );
    }
}
