//! `gpud runtime configure` / `install` end to end: the built binary on config files in a temp
//! dir. Exit codes (0, 64, 65, 73), `--dry-run` writing nothing, a second run changing nothing
//! (same bytes), `--revert` giving the original bytes back, the restart through a stand-in
//! `systemctl` (also inside a host root, as from the toolkit's container), and the toolkit
//! folder install. The files gpud writes are read back by real containerd 1.6, 1.7 and 2.x
//! (`containerd config dump`, no daemon needed); CI requires 1.7 and 2.x.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
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
    assert_eq!(
        names_in(dir.path()),
        ["crio.conf.d"],
        "gpud's record of the file it created goes with it"
    );
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
        !host
            .join("etc/containerd/config.toml.gpud.restart")
            .exists(),
        "the restart succeeded inside the host root: nothing is owed"
    );
    assert!(
        fs::read_to_string(&config)
            .unwrap()
            .contains("enable_cdi = true")
    );
}

// ---- Fail closed (issue 39, part 5): symlinks, backups, revert, locking, restarts, limits.

/// The config versions to try, each with the containerd that reads it back: 2 with
/// containerd 1.7, 3 with 2.x. CI requires both; elsewhere a version without its containerd
/// is still configured and checked on the file, without the read-back.
fn versions() -> Vec<(i64, Option<PathBuf>)> {
    let found = containerds();
    let pick = |v2: bool| {
        found
            .iter()
            .find(|(_, line)| {
                if v2 {
                    line.contains(" 1.7.")
                } else {
                    line.contains("/v2 ")
                }
            })
            .map(|(binary, _)| binary.clone())
    };
    let (v2, v3) = (pick(true), pick(false));
    common::tool_missing(
        v2.is_none() || v3.is_none(),
        "containerd 1.7 and 2.x are required in CI (tests/runtime/fetch-containerd.sh)",
        "NOTICE: containerd 1.7 or 2.x missing here; checking the files without reading them back",
    );
    vec![(2, v2), (3, v3)]
}

fn cri_plugin(version: i64) -> &'static str {
    if version == 2 {
        "io.containerd.grpc.v1.cri"
    } else {
        "io.containerd.cri.v1.runtime"
    }
}

/// A config as NVIDIA's toolkit leaves it: CDI on, the `nvidia` entry with `SystemdCgroup` and
/// the default runtime, with root and state in `dir`.
fn nvidia_configured(version: i64, dir: &Path) -> String {
    let cri = cri_plugin(version);
    format!(
        "version = {version}\nroot = \"{0}/root\"\nstate = \"{0}/state\"\n\n\
         [plugins.\"{cri}\"]\n  enable_cdi = true\n\n\
         [plugins.\"{cri}\".containerd]\n  default_runtime_name = \"nvidia\"\n\n\
         [plugins.\"{cri}\".containerd.runtimes.nvidia]\n  runtime_type = \"io.containerd.runc.v2\"\n\n\
         [plugins.\"{cri}\".containerd.runtimes.nvidia.options]\n  \
         BinaryName = \"/usr/bin/nvidia-container-runtime\"\n  SystemdCgroup = true\n",
        dir.display()
    )
}

/// A plain config of `version` with CDI off, root and state in `dir`.
fn plain_config(version: i64, dir: &Path) -> String {
    format!(
        "version = {version}\nroot = \"{0}/root\"\nstate = \"{0}/state\"\n\n[plugins.\"{1}\"]\n  enable_cdi = false\n",
        dir.display(),
        cri_plugin(version)
    )
}

/// What containerd reads from `config`, when there is a containerd for it.
fn dump_if(containerd: &Option<PathBuf>, config: &Path) -> Option<String> {
    containerd.as_ref().map(|binary| dump(binary, config))
}

/// `needle` in containerd's dump, with the version's quoting (2.x dumps single quotes).
fn quoted(version: i64, text: &str) -> String {
    if version == 2 {
        text.to_owned()
    } else {
        text.replace('"', "'")
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn a_symlinked_config_is_edited_through_the_link_which_stays_a_link() {
    for (version, containerd) in versions() {
        let dir = tempfile::tempdir().unwrap();
        let srv = dir.path().join("srv");
        let etc = dir.path().join("etc");
        fs::create_dir_all(&srv).unwrap();
        fs::create_dir_all(&etc).unwrap();
        let real = srv.join("containerd.toml");
        let original = plain_config(version, dir.path());
        fs::write(&real, &original).unwrap();
        let link = etc.join("config.toml");
        std::os::unix::fs::symlink("../srv/containerd.toml", &link).unwrap();

        let out = run(&full_with(&link, &[]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            fs::read_link(&link).unwrap(),
            Path::new("../srv/containerd.toml")
        );
        let written = fs::read_to_string(&real).unwrap();
        assert!(written.contains("enable_cdi = true"), "{written}");
        assert_eq!(
            fs::read_to_string(srv.join("containerd.toml.gpud.bak")).unwrap(),
            original,
            "the backup is the target's, beside it"
        );
        if let Some(text) = dump_if(&containerd, &link) {
            assert!(text.contains("enable_cdi = true"), "{text}");
            assert!(
                text.contains(&quoted(version, "default_runtime_name = \"nvidia\"")),
                "{text}"
            );
        }

        let revert = run(&full_with(&link, &["--revert"]));
        assert_eq!(code(&revert), 0, "{}", stderr(&revert));
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_to_string(&real).unwrap(), original);
        assert_eq!(names_in(&etc), ["config.toml"]);
        assert_eq!(names_in(&srv), ["containerd.toml"]);
    }
}

#[test]
fn a_dangling_symlink_is_refused_naming_the_link_and_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("config.toml");
    let missing = dir.path().join("nowhere/containerd.toml");
    std::os::unix::fs::symlink(&missing, &link).unwrap();
    let out = run(&full_with(&link, &[]));
    assert_ne!(code(&out), 0, "{}", stderr(&out));
    let message = stderr(&out);
    assert!(message.contains(&link.display().to_string()), "{message}");
    assert!(
        message.contains(&format!("is a symlink to {}", missing.display())),
        "{message}"
    );
    assert!(message.contains("does not exist"), "{message}");
    assert!(
        message.contains("create the file the link points to"),
        "{message}"
    );
    assert_eq!(
        fs::read_link(&link).unwrap(),
        missing,
        "the link is untouched"
    );
    assert_eq!(names_in(dir.path()), ["config.toml"], "nothing written");
}

/// The toolkit DaemonSet's layout: the host at `/host`, the config an absolute link that
/// means something on the host only. gpud resolves it inside `--host-root`.
#[test]
fn an_absolute_link_resolves_inside_the_host_root() {
    for (version, containerd) in versions() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host");
        fs::create_dir_all(host.join("etc/containerd")).unwrap();
        fs::create_dir_all(host.join("srv/conf")).unwrap();
        let real = host.join("srv/conf/containerd.toml");
        let original = plain_config(version, dir.path());
        fs::write(&real, &original).unwrap();
        let link = host.join("etc/containerd/config.toml");
        std::os::unix::fs::symlink("/srv/conf/containerd.toml", &link).unwrap();
        let host_flag = format!("--host-root={}", host.display());

        let out = run(&full_with(&link, &[&host_flag]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(
            fs::read_to_string(&real)
                .unwrap()
                .contains("enable_cdi = true")
        );
        if let Some(text) = dump_if(&containerd, &real) {
            assert!(text.contains("enable_cdi = true"), "{text}");
        }
        let revert = run(&full_with(&link, &[&host_flag, "--revert"]));
        assert_eq!(code(&revert), 0, "{}", stderr(&revert));
        assert_eq!(fs::read_to_string(&real).unwrap(), original);
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );

        // Without the host root the same link dangles: refused, nothing written.
        let out = run(&full_with(&link, &[]));
        assert_ne!(code(&out), 0);
        assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
        assert_eq!(fs::read_to_string(&real).unwrap(), original);
    }
}

/// On a node NVIDIA's toolkit configured, gpud's revert leaves NVIDIA's entry (with its
/// `SystemdCgroup`), the default runtime and `enable_cdi` as they were: they are not gpud's.
#[test]
fn revert_leaves_what_nvidias_toolkit_set() {
    for (version, containerd) in versions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let original = nvidia_configured(version, dir.path());
        fs::write(&path, &original).unwrap();
        let check = |what: &str| {
            assert_eq!(fs::read_to_string(&path).unwrap(), original, "{what}");
            if let Some(text) = dump_if(&containerd, &path) {
                assert!(text.contains("SystemdCgroup = true"), "{what}: {text}");
                assert!(text.contains("enable_cdi = true"), "{what}: {text}");
                assert!(
                    text.contains(&quoted(version, "default_runtime_name = \"nvidia\"")),
                    "{what}: {text}"
                );
            }
        };

        // Everything asked for is there already: nothing changes, and nothing is gpud's.
        let cdi = [
            "--runtime=containerd".to_owned(),
            "--enable-cdi".to_owned(),
            "--set-as-default".to_owned(),
            format!("--config={}", path.display()),
        ];
        let out = run(&cdi);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(
            stderr(&out).contains("already configured"),
            "{}",
            stderr(&out)
        );
        let mut revert = cdi.to_vec();
        revert.push("--revert".to_owned());
        let out = run(&revert);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        check("a revert after a run that changed nothing");

        // A run that adds a spec folder: backed up first; the revert takes back only that.
        let out = run(&full_with(&path, &[]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert_eq!(
            fs::read_to_string(dir.path().join("config.toml.gpud.bak")).unwrap(),
            original
        );
        let out = run(&full_with(&path, &["--revert"]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        check("a revert after gpud added cdi_spec_dirs");
    }
}

#[test]
fn an_admins_file_holding_only_enable_cdi_survives_revert() {
    for (version, containerd) in versions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let original = format!(
            "version = {version}\nroot = \"{0}/root\"\nstate = \"{0}/state\"\n\n[plugins.\"{1}\"]\n  enable_cdi = true\n",
            dir.path().display(),
            cri_plugin(version)
        );
        fs::write(&path, &original).unwrap();
        let flag = format!("--config={}", path.display());
        for extra in [None, Some("--revert")] {
            let out = configure(
                &["--runtime=containerd", "--enable-cdi", &flag]
                    .into_iter()
                    .chain(extra)
                    .collect::<Vec<_>>(),
            );
            assert_eq!(code(&out), 0, "{}", stderr(&out));
        }
        assert_eq!(fs::read_to_string(&path).unwrap(), original);
        if let Some(text) = dump_if(&containerd, &path) {
            assert!(text.contains("enable_cdi = true"), "{text}");
        }
    }
}

/// A key changed by hand after gpud set it is the admin's now: the revert leaves it and takes
/// back the rest.
#[test]
fn revert_after_a_hand_edit_keeps_the_edit() {
    for (version, containerd) in versions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs::write(&path, plain_config(version, dir.path())).unwrap();
        let out = run(&full_with(&path, &[]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let edited = fs::read_to_string(&path).unwrap().replace(
            "\"/usr/bin/nvidia-container-runtime\"",
            "\"/opt/admin/runtime\"",
        ) + "\n[debug]\n  level = \"debug\"\n";
        fs::write(&path, &edited).unwrap();
        let out = run(&full_with(&path, &["--revert"]));
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(
            stderr(&out).contains("was changed since gpud set it"),
            "{}",
            stderr(&out)
        );
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("BinaryName = \"/opt/admin/runtime\""),
            "{text}"
        );
        assert!(text.contains("enable_cdi = false"), "{text}");
        assert!(text.contains("level = \"debug\""), "{text}");
        assert!(!text.contains("default_runtime_name"), "{text}");
        assert!(!text.contains("cdi_spec_dirs"), "{text}");
        assert!(
            dir.path().join("config.toml.gpud.bak").exists(),
            "the file differs from the backup: the backup stays"
        );
        let again = run(&full_with(&path, &["--revert"]));
        assert_eq!(code(&again), 0, "{}", stderr(&again));
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            text,
            "a second revert does not take the kept backup for gpud's"
        );
        if let Some(dump) = dump_if(&containerd, &path) {
            assert!(
                dump.contains(&quoted(version, "BinaryName = \"/opt/admin/runtime\"")),
                "{dump}"
            );
            assert!(dump.contains("enable_cdi = false"), "{dump}");
        }
    }
}

/// Concurrent runs, each adding its own runtime entry: every run that says it succeeded has
/// its entry in the file, and none leaves a temporary file.
#[test]
fn concurrent_runs_all_land() {
    const RUNS: usize = 8;
    for (version, containerd) in versions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs::write(&path, plain_config(version, dir.path())).unwrap();
        let children: Vec<_> = (0..RUNS)
            .map(|i| {
                Command::new(gpud_bin())
                    .args(["runtime", "configure", "--runtime=containerd"])
                    .arg(format!("--config={}", path.display()))
                    .arg(format!("--nvidia-runtime-name=rt{i}"))
                    .arg(format!("--nvidia-runtime-path=/usr/bin/rt{i}"))
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let results: Vec<Output> = children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let text = fs::read_to_string(&path).unwrap();
        for (i, out) in results.iter().enumerate() {
            assert_eq!(code(out), 0, "run {i}: {}", stderr(out));
            assert!(
                text.contains(&format!("BinaryName = \"/usr/bin/rt{i}\"")),
                "run {i} said it succeeded but its entry is lost:\n{text}"
            );
        }
        let leftovers: Vec<String> = names_in(dir.path())
            .into_iter()
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        if let Some(dump) = dump_if(&containerd, &path) {
            for i in 0..RUNS {
                assert!(
                    dump.contains(&quoted(
                        version,
                        &format!("BinaryName = \"/usr/bin/rt{i}\"")
                    )),
                    "{dump}"
                );
            }
        }
        // Each run's revert takes back its own entry only.
        let out = configure(&[
            "--runtime=containerd",
            &format!("--config={}", path.display()),
            "--nvidia-runtime-name=rt0",
            "--revert",
        ]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let text = fs::read_to_string(&path).unwrap();
        assert!(!text.contains("/usr/bin/rt0\""), "{text}");
        assert!(text.contains("/usr/bin/rt7\""), "{text}");
    }
}

/// A `systemctl` that fails while `fail` exists beside it and logs each call.
fn flaky_systemctl(dir: &Path) -> (PathBuf, PathBuf) {
    let log = dir.join("systemctl.log");
    let fail = dir.join("fail");
    let systemctl = dir.join("systemctl");
    fs::write(
        &systemctl,
        format!(
            "#!/bin/sh\necho \"$@\" >> {}\n[ -e {} ] && exit 1\nexit 0\n",
            log.display(),
            fail.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&systemctl, fs::Permissions::from_mode(0o755)).unwrap();
    (log, fail)
}

/// A restart that failed is owed: the next run restarts even though the file needs no more
/// change, and only a successful restart settles it.
#[test]
fn a_failed_restart_is_retried_by_the_next_run() {
    for (version, _) in versions() {
        let dir = tempfile::tempdir().unwrap();
        let (log, fail) = flaky_systemctl(dir.path());
        fs::write(&fail, "").unwrap();
        let config = dir.path().join("config.toml");
        fs::write(&config, plain_config(version, dir.path())).unwrap();
        let path_var = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", dir.path().display());
        let gpud = || {
            Command::new(gpud_bin())
                .args([
                    "runtime",
                    "configure",
                    "--runtime=containerd",
                    "--enable-cdi",
                ])
                .arg("--restart-mode=systemd")
                .arg(format!("--config={}", config.display()))
                .env("PATH", &path_var)
                .output()
                .unwrap()
        };
        let first = gpud();
        assert_eq!(code(&first), 1, "{}", stderr(&first));
        assert!(
            stderr(&first).contains("is written, but"),
            "{}",
            stderr(&first)
        );

        fs::remove_file(&fail).unwrap();
        let second = gpud();
        assert_eq!(code(&second), 0, "{}", stderr(&second));
        assert!(
            !stderr(&second).contains("nothing to change"),
            "{}",
            stderr(&second)
        );
        assert_eq!(
            fs::read_to_string(&log).unwrap(),
            "restart containerd\nrestart containerd\n"
        );

        let third = gpud();
        assert_eq!(code(&third), 0, "{}", stderr(&third));
        assert!(
            stderr(&third).contains("already configured, nothing to change"),
            "{}",
            stderr(&third)
        );
        assert_eq!(
            fs::read_to_string(&log).unwrap().lines().count(),
            2,
            "once restarted, nothing more is owed"
        );
    }
}

/// Runs `gpud runtime configure args`, killing it after `secs`: a read that never ends fails
/// the test instead of hanging it.
fn run_bounded(args: &[String], secs: u64) -> Output {
    let mut child = Command::new(gpud_bin())
        .args(["runtime", "configure"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let finished = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        common::until("gpud runtime configure to exit", secs, || {
            match child.try_wait().unwrap() {
                Some(_) => Ok(()),
                None => Err("still running".to_owned()),
            }
        })
    }));
    if finished.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("gpud runtime configure {args:?} did not finish in {secs} s");
    }
    child.wait_with_output().unwrap()
}

#[test]
fn huge_and_non_regular_configs_are_refused_without_reading_them() {
    let dir = tempfile::tempdir().unwrap();
    // Over 4 MiB, valid TOML: refused before it is parsed, naming the file, size and limit.
    let huge = dir.path().join("config.toml");
    let text = format!(
        "version = 2\n{}",
        "# padding padding padding padding padding padding padding padding\n".repeat(70_000)
    );
    fs::write(&huge, &text).unwrap();
    let out = run_bounded(&full_with(&huge, &[]), 30);
    assert_eq!(code(&out), 65, "{}", stderr(&out));
    let message = stderr(&out);
    assert!(message.contains(&huge.display().to_string()), "{message}");
    assert!(
        message.contains(&format!("{} bytes", text.len())),
        "{message}"
    );
    assert!(message.contains("4194304-byte limit"), "{message}");
    assert_eq!(fs::metadata(&huge).unwrap().len(), text.len() as u64);

    let fifo = dir.path().join("fifo.toml");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    for (path, kind) in [
        (PathBuf::from("/dev/zero"), "a character device"),
        (fifo.clone(), "a FIFO"),
    ] {
        let out = run_bounded(&full_with(&path, &[]), 30);
        assert_eq!(code(&out), 65, "{}", stderr(&out));
        assert!(stderr(&out).contains(kind), "{}", stderr(&out));
        assert!(
            stderr(&out).contains(&path.display().to_string()),
            "{}",
            stderr(&out)
        );
    }
    assert!(
        fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(),
        "the FIFO stays"
    );
}

/// Docker's daemon.json and CRI-O's drop-in take the same write path: a link stays a link,
/// and a revert gives back the target's bytes.
#[test]
fn docker_and_crio_configs_behind_links_stay_links() {
    let dir = tempfile::tempdir().unwrap();
    let srv = dir.path().join("srv");
    fs::create_dir_all(&srv).unwrap();
    let daemon = srv.join("daemon.json");
    let original = "{\n  \"log-driver\": \"journald\"\n}\n";
    fs::write(&daemon, original).unwrap();
    let docker_link = dir.path().join("daemon.json");
    std::os::unix::fs::symlink(&daemon, &docker_link).unwrap();
    let flag = format!("--config={}", docker_link.display());
    let out = configure(&["--runtime=docker", "--enable-cdi", &flag]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        fs::symlink_metadata(&docker_link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(
        fs::read_to_string(&daemon)
            .unwrap()
            .contains("\"cdi\": true")
    );
    let out = configure(&["--runtime=docker", "--enable-cdi", "--revert", &flag]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(fs::read_to_string(&daemon).unwrap(), original);
    assert!(
        fs::symlink_metadata(&docker_link)
            .unwrap()
            .file_type()
            .is_symlink()
    );

    let conf_d = dir.path().join("crio/crio.conf.d");
    fs::create_dir_all(&conf_d).unwrap();
    let drop_in = srv.join("99-gpud.conf");
    fs::write(&drop_in, "[crio.runtime]\nlog_level = \"info\"\n").unwrap();
    let crio_link = conf_d.join("99-gpud.conf");
    std::os::unix::fs::symlink(&drop_in, &crio_link).unwrap();
    let flag = format!("--drop-in-config={}", crio_link.display());
    let out = configure(&["--runtime=crio", "--set-as-default", &flag]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        fs::symlink_metadata(&crio_link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(
        fs::read_to_string(&drop_in)
            .unwrap()
            .contains("default_runtime = \"nvidia\"")
    );
    assert_eq!(
        names_in(&conf_d),
        ["99-gpud.conf"],
        "CRI-O reads every file in its drop-in folder: gpud's own files are not there"
    );
    let out = configure(&["--runtime=crio", "--revert", &flag]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        fs::read_to_string(&drop_in).unwrap(),
        "[crio.runtime]\nlog_level = \"info\"\n"
    );
    assert!(
        fs::symlink_metadata(&crio_link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
}
