//! `gpud runtime configure` end to end: the built binary on config files in a temp dir. Exit
//! codes (0, 64, 65, 73), `--dry-run` writing nothing, a second run changing nothing (same
//! bytes), `--revert` giving the original bytes back, and the restart through a stand-in
//! `systemctl`. The version-2 file gpud writes is read back by the real containerd
//! (`containerd config dump`, no daemon needed); CI requires containerd.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::gpud_bin;

fn fixture(name: &str) -> String {
    fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/runtime")
            .join(name),
    )
    .unwrap()
}

fn configure(args: &[&str]) -> Output {
    Command::new(gpud_bin())
        .args(["runtime", "configure"])
        .args(args)
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

/// A temp dir holding `name` with `text`.
fn file_in(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    fs::write(&path, text).unwrap();
    (dir, path)
}

const FULL: &[&str] = &[
    "--runtime=containerd",
    "--enable-cdi",
    "--cdi-spec-dirs=/etc/cdi,/var/run/cdi",
    "--set-as-default",
];

fn full_with(config: &Path, more: &[&str]) -> Vec<String> {
    FULL.iter()
        .map(|s| (*s).to_owned())
        .chain([format!("--config={}", config.display())])
        .chain(more.iter().map(|s| (*s).to_owned()))
        .collect()
}

fn run(args: &[String]) -> Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    configure(&args)
}

#[test]
fn containerd_configure_is_idempotent_and_reverts_to_the_same_bytes() {
    for version in ["v2", "v3"] {
        let original = fixture(&format!("containerd-{version}.toml"));
        let (dir, path) = file_in("config.toml", &original);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();

        let first = run(&full_with(&path, &[]));
        assert_eq!(code(&first), 0, "{}", stderr(&first));
        let written = fs::read_to_string(&path).unwrap();
        assert_eq!(
            written,
            fixture(&format!("containerd-{version}.configured.toml"))
        );
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o640
        );
        let backup = dir.path().join("config.toml.gpud.bak");
        assert_eq!(fs::read_to_string(&backup).unwrap(), original);

        let second = run(&full_with(&path, &[]));
        assert_eq!(code(&second), 0, "{}", stderr(&second));
        assert!(
            stderr(&second).contains("already configured, nothing to change"),
            "{}",
            stderr(&second)
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), written);
        assert_eq!(fs::read_to_string(&backup).unwrap(), original);

        let revert = run(&full_with(&path, &["--revert"]));
        assert_eq!(code(&revert), 0, "{}", stderr(&revert));
        assert_eq!(fs::read_to_string(&path).unwrap(), original);
        assert!(!backup.exists());
    }
}

#[test]
fn dry_run_prints_the_file_and_writes_nothing() {
    let original = fixture("containerd-v2.toml");
    let (dir, path) = file_in("config.toml", &original);
    let out = run(&full_with(&path, &["--dry-run"]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        fixture("containerd-v2.configured.toml")
    );
    assert_eq!(fs::read_to_string(&path).unwrap(), original);
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn bad_files_are_refused_naming_file_and_line_with_nothing_written() {
    for (text, needle) in [
        ("version = 2\n[plugins\nx = 1\n", ":2:"),
        (
            "version = 4\n",
            "containerd config version 4 is not one gpud edits",
        ),
        ("root = \"/x\"\n", "version 1 (no `version` key)"),
    ] {
        let (dir, path) = file_in("config.toml", text);
        let out = run(&full_with(&path, &[]));
        assert_eq!(code(&out), 65, "{}", stderr(&out));
        let message = stderr(&out);
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains(needle), "{message}");
        assert_eq!(fs::read_to_string(&path).unwrap(), text);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}

#[test]
fn a_file_that_cannot_be_written_is_exit_73() {
    // Root may write anywhere: a regular file where the folder should be stops everyone.
    let (dir, blocker) = file_in("etc", "");
    let path = blocker.join("containerd/config.toml");
    let out = run(&full_with(&path, &[]));
    assert_eq!(code(&out), 73, "{}", stderr(&out));
    assert!(stderr(&out).contains(&blocker.display().to_string()));
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn signal_is_refused_for_containerd_before_anything_is_written() {
    let original = fixture("containerd-v2.toml");
    let (_dir, path) = file_in("config.toml", &original);
    let out = run(&full_with(&path, &["--restart-mode=signal"]));
    assert_eq!(code(&out), 64, "{}", stderr(&out));
    assert!(stderr(&out).contains("--restart-mode=systemd"));
    assert_eq!(fs::read_to_string(&path).unwrap(), original);
}

#[test]
fn systemd_mode_restarts_the_unit_once_and_only_on_change() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("systemctl.log");
    let systemctl = dir.path().join("systemctl");
    fs::write(
        &systemctl,
        format!("#!/bin/sh\necho \"$@\" >> {}\n", log.display()),
    )
    .unwrap();
    fs::set_permissions(&systemctl, fs::Permissions::from_mode(0o755)).unwrap();
    let config = dir.path().join("daemon.json");
    fs::write(&config, "{\n  \"log-driver\": \"journald\"\n}\n").unwrap();
    let path_var = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", dir.path().display());
    let config_flag = format!("--config={}", config.display());
    let args = [
        "runtime",
        "configure",
        "--runtime=docker",
        "--enable-cdi",
        "--restart-mode=systemd",
        config_flag.as_str(),
    ];
    for _ in 0..2 {
        let out = Command::new(gpud_bin())
            .args(args)
            .env("PATH", &path_var)
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
    assert_eq!(fs::read_to_string(&log).unwrap(), "restart docker\n");
    assert_eq!(
        fs::read_to_string(&config).unwrap(),
        "{\n  \"log-driver\": \"journald\",\n  \"features\": {\n    \"cdi\": true\n  }\n}\n"
    );
}

#[test]
fn crio_gets_a_drop_in_that_revert_removes() {
    let dir = tempfile::tempdir().unwrap();
    let drop_in = dir.path().join("crio.conf.d/99-gpud.conf");
    let flag = format!("--drop-in-config={}", drop_in.display());
    let out = configure(&["--runtime=crio", "--set-as-default", &flag]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        fs::read_to_string(&drop_in).unwrap(),
        "[crio.runtime]\ndefault_runtime = \"nvidia\"\n\n[crio.runtime.runtimes.nvidia]\n\
         runtime_path = \"/usr/bin/nvidia-container-runtime\"\nruntime_type = \"oci\"\n"
    );
    let out = configure(&["--runtime=crio", "--revert", &flag]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!drop_in.exists());
}

/// containerd reads back what gpud wrote: `config dump` merges the file over its defaults
/// without a daemon. containerd before 1.7 has no CDI keys (it drops unknown ones), so they
/// are checked only where the default config has `enable_cdi`.
#[test]
fn containerd_reads_the_version_2_config_gpud_wrote() {
    let Ok(version) = Command::new("containerd").arg("--version").output() else {
        common::tool_missing(
            true,
            "containerd is required in CI (.ci/run installs Debian's containerd)",
            "NOTICE: containerd is not installed; skipping the config dump check",
        );
        return;
    };
    eprintln!("{}", String::from_utf8_lossy(&version.stdout).trim());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    // Root and state in the temp dir: nothing of the host's containerd is touched.
    fs::write(
        &path,
        format!(
            "version = 2\nroot = \"{0}/root\"\nstate = \"{0}/state\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let out = run(&full_with(&path, &[]));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let dump = Command::new("containerd")
        .arg("--config")
        .arg(&path)
        .args(["config", "dump"])
        .output()
        .unwrap();
    assert!(dump.status.success(), "{}", stderr(&dump));
    let text = String::from_utf8_lossy(&dump.stdout);
    assert!(
        text.contains("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]"),
        "{text}"
    );
    assert!(
        text.contains("BinaryName = \"/usr/bin/nvidia-container-runtime\""),
        "{text}"
    );
    assert!(text.contains("default_runtime_name = \"nvidia\""), "{text}");
    let defaults = Command::new("containerd")
        .args(["config", "default"])
        .output()
        .unwrap();
    if String::from_utf8_lossy(&defaults.stdout).contains("enable_cdi") {
        assert!(text.contains("enable_cdi = true"), "{text}");
        assert!(
            text.contains("cdi_spec_dirs = [\"/etc/cdi\", \"/var/run/cdi\"]"),
            "{text}"
        );
    } else {
        eprintln!("NOTICE: this containerd has no CDI keys (before 1.7); checked the runtime only");
    }
}

#[test]
fn a_gpud_runtime_link_runs_the_applet() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("gpud-runtime");
    std::os::unix::fs::symlink(gpud_bin(), &link).unwrap();
    let config = dir.path().join("daemon.json");
    let out = Command::new(&link)
        .args(["configure", "--enable-cdi", "--dry-run"])
        .arg(format!("--config={}", config.display()))
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "{\n    \"features\": {\n        \"cdi\": true\n    }\n}\n"
    );
    assert!(!config.exists());
}
