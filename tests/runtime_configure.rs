//! `gpud runtime configure` / `install` end to end: the built binary on config files in a temp
//! dir. Exit codes (0, 64, 65, 73), `--dry-run` writing nothing, a second run changing nothing
//! (same bytes), `--revert` giving the original bytes back, the restart through a stand-in
//! `systemctl` (also inside a host root, as from the toolkit's container), and the toolkit
//! folder install. The files gpud writes are read back by real containerd 1.6, 1.7 and 2.x
//! (`containerd config dump`, no daemon needed); CI requires 1.7 and 2.x.

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

/// The containerd binaries on this machine: Debian's on PATH and those
/// tests/runtime/fetch-containerd.sh unpacked (1.7 from trixie, 2.x from sid), each with its
/// version line.
fn containerds() -> Vec<(PathBuf, String)> {
    let fetched = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/containerd");
    [PathBuf::from("containerd")]
        .into_iter()
        .chain(["trixie", "sid"].map(|suite| fetched.join(suite).join("containerd")))
        .filter_map(|binary| {
            let out = Command::new(&binary).arg("--version").output().ok()?;
            let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            out.status.success().then_some((binary, line))
        })
        .collect()
}

/// `containerd config dump` of `config`: containerd's own reading of the file, merged over its
/// defaults, without a daemon.
fn dump(containerd: &Path, config: &Path) -> String {
    let out = Command::new(containerd)
        .arg("--config")
        .arg(config)
        .args(["config", "dump"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        containerd.display(),
        stderr(&out)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// containerd reads back what gpud wrote: 1.x the version-2 file, 2.x the version-3 file, each
/// starting from CDI turned off and a spec folder of gpud's, so the dump shows gpud's values
/// and not containerd's defaults. containerd 1.6 (Debian bookworm's) has no CDI keys and
/// drops unknown ones, so on it only the runtime entry is checked; CI requires a 1.7 and a
/// 2.x (.ci/run fetches them).
#[test]
fn containerd_reads_the_config_gpud_wrote() {
    let found = containerds();
    let has = |major: &str| {
        found.iter().any(|(_, line)| {
            line.contains(&format!(" {major}.")) || line.contains(&format!("/v{major} {major}."))
        })
    };
    let ci_ready = found.iter().any(|(_, l)| l.contains(" 1.7.")) && has("2");
    if common::tool_missing(
        !ci_ready,
        "containerd 1.7 and 2.x are required in CI (tests/runtime/fetch-containerd.sh)",
        "NOTICE: no containerd 1.7 and 2.x here (tests/runtime/fetch-containerd.sh); checking those found",
    ) && found.is_empty()
    {
        return;
    }
    for (containerd, line) in &found {
        let v2 = !line.contains("/v2 ");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        // Root and state in the temp dir: nothing of the host's containerd is touched.
        let cri = if v2 {
            "plugins.\"io.containerd.grpc.v1.cri\""
        } else {
            "plugins.\"io.containerd.cri.v1.runtime\""
        };
        fs::write(
            &path,
            format!(
                "version = {}\nroot = \"{1}/root\"\nstate = \"{1}/state\"\n\n[{cri}]\n  enable_cdi = false\n",
                if v2 { 2 } else { 3 },
                dir.path().display()
            ),
        )
        .unwrap();
        let out = run(&full_with(&path, &["--cdi-spec-dirs=/etc/gpud-cdi"]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let text = dump(containerd, &path);
        let runtimes = if v2 {
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]"
        } else {
            "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]"
        };
        let q = if v2 { '"' } else { '\'' };
        assert!(text.contains(runtimes), "{line}:\n{text}");
        assert!(
            text.contains(&format!(
                "BinaryName = {q}/usr/bin/nvidia-container-runtime{q}"
            )),
            "{line}:\n{text}"
        );
        assert!(
            text.contains(&format!("default_runtime_name = {q}nvidia{q}")),
            "{line}:\n{text}"
        );
        if line.contains(" 1.6.") {
            eprintln!("NOTICE: {line} has no CDI keys; checked the runtime entry only");
            continue;
        }
        assert!(text.contains("enable_cdi = true"), "{line}:\n{text}");
        assert!(
            text.contains(&format!(
                "cdi_spec_dirs = [{q}/etc/cdi{q}, {q}/var/run/cdi{q}, {q}/etc/gpud-cdi{q}]"
            )),
            "{line}:\n{text}"
        );
    }
}

/// The version-3 golden (a containerd 2.x config as gpud leaves it) is one containerd 2.x
/// reads, with gpud's keys where 2.x looks for them.
#[test]
fn containerd_2_reads_the_version_3_golden() {
    let Some((containerd, line)) = containerds().into_iter().find(|(_, l)| l.contains("/v2 "))
    else {
        common::tool_missing(
            true,
            "containerd 2.x is required in CI (tests/runtime/fetch-containerd.sh)",
            "NOTICE: no containerd 2.x here; skipping the version-3 golden check",
        );
        return;
    };
    let (_dir, path) = file_in("config.toml", &fixture("containerd-v3.configured.toml"));
    let text = dump(&containerd, &path);
    assert!(text.contains("enable_cdi = true"), "{line}:\n{text}");
    assert!(
        text.contains(
            "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]"
        ),
        "{line}:\n{text}"
    );
    assert!(
        text.contains("SystemdCgroup = true"),
        "the file's own settings stay: {text}"
    );
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

#[test]
fn install_puts_gpud_and_its_hook_link_in_the_toolkit_folder_once() {
    let dir = tempfile::tempdir().unwrap();
    let toolkit = dir.path().join("usr/local/nvidia/toolkit");
    let flag = format!("--toolkit-dir={}", toolkit.display());
    let gpud = |args: &[&str]| {
        Command::new(gpud_bin())
            .arg("runtime")
            .args(args)
            .output()
            .unwrap()
    };

    let checked = gpud(&["install", &flag, "--check-config"]);
    assert_eq!(code(&checked), 0, "{}", stderr(&checked));
    assert!(!toolkit.exists(), "--check-config writes nothing");

    let out = gpud(&["install", &flag]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("installed"), "{}", stderr(&out));
    assert_eq!(
        fs::read(toolkit.join("gpud")).unwrap(),
        fs::read(gpud_bin()).unwrap()
    );
    assert_eq!(
        fs::read_link(toolkit.join("nvidia-cdi-hook")).unwrap(),
        Path::new("gpud")
    );
    let version = Command::new(toolkit.join("gpud"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout),
        format!("gpud {}\n", env!("CARGO_PKG_VERSION"))
    );

    let again = gpud(&["install", &flag]);
    assert_eq!(code(&again), 0);
    assert!(
        stderr(&again).contains("nothing to change"),
        "{}",
        stderr(&again)
    );

    let removed = gpud(&["uninstall", &flag]);
    assert_eq!(code(&removed), 0, "{}", stderr(&removed));
    assert!(!toolkit.exists(), "the emptied folder goes too");
}

/// The libraries `ldd` names for `binary`, as absolute paths.
fn libraries_of(binary: &str) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(binary).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|word| word.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// From a container (`--host-root`), the restart runs the host's own systemctl inside the
/// host's root: here a folder with a shell and a systemctl that records its arguments there.
#[test]
fn systemd_restart_from_a_container_runs_the_hosts_systemctl_in_its_root() {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let root_user = status
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    if common::tool_missing(
        !root_user,
        "CI runs the tests as root (chroot needs it)",
        "NOTICE: not root; skipping the chroot restart check",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    for file in std::iter::once(PathBuf::from("/bin/sh")).chain(libraries_of("/bin/sh")) {
        let inside = host.join(file.strip_prefix("/").unwrap());
        fs::create_dir_all(inside.parent().unwrap()).unwrap();
        fs::copy(fs::canonicalize(&file).unwrap(), &inside).unwrap();
    }
    let systemctl = host.join("usr/bin/systemctl");
    fs::create_dir_all(systemctl.parent().unwrap()).unwrap();
    fs::write(&systemctl, "#!/bin/sh\necho \"$@\" > /restarted\n").unwrap();
    fs::set_permissions(&systemctl, fs::Permissions::from_mode(0o755)).unwrap();
    let config = host.join("etc/containerd/config.toml");
    fs::create_dir_all(config.parent().unwrap()).unwrap();
    fs::write(&config, "version = 2\n").unwrap();

    let out = configure(&[
        "--runtime=containerd",
        &format!("--config={}", config.display()),
        "--enable-cdi",
        "--restart-mode=systemd",
        &format!("--host-root={}", host.display()),
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        fs::read_to_string(host.join("restarted")).unwrap(),
        "restart containerd\n"
    );
    assert!(
        fs::read_to_string(&config)
            .unwrap()
            .contains("enable_cdi = true")
    );
}
