//! Shared harness for the black-box tests: the built `gpud` binary run against the simulated
//! NVML library, one temporary node per test.
//!
//! The mock library is a dev-dependency, so cargo builds `libnvidia_ml_mock.so` next to the
//! test executables before any test runs; every test passes it explicitly (`GPUD_NVML_LIB`),
//! together with its own fixture, control file and state file, so tests never share a node.

#![allow(dead_code)]

pub mod host;
pub mod http;
pub mod reset_command;
pub mod unix_grpc;

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The simulated `libnvidia-ml.so.1` built for this test run.
pub fn mock_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    let lib = deps.join("libnvidia_ml_mock.so");
    assert!(lib.exists(), "mock NVML not built at {}", lib.display());
    lib
}

/// Whether a check that needs a tool from outside (python3, promtool, kubectl) runs: when the
/// tool is `missing`, the check is skipped with `skip` on stderr, except in CI (`CI` set, as
/// `.ci/run` does), where the tool is installed and its absence fails with `required`.
#[allow(clippy::disallowed_methods)] // CI decides whether a missing tool fails
pub fn tool_missing(missing: bool, required: &str, skip: &str) -> bool {
    if missing {
        assert!(std::env::var_os("CI").is_none(), "{required}");
        eprintln!("{skip}");
    }
    missing
}

/// What `check` gives once it gives something, asked again every 20 ms (a file, a process,
/// a pipe has no event to wait on here); fails the test after `secs` seconds with `what` and
/// the last state `check` reported.
pub fn until<T>(what: &str, secs: u64, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        match check() {
            Ok(found) => return found,
            Err(state) => assert!(
                std::time::Instant::now() < deadline,
                "{what} not within {secs} s:\n{state}"
            ),
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The text of the file at `path` once it contains `needle` (a daemon's log line), failing the
/// test after `secs` seconds with what the file held.
pub fn file_when(path: &Path, needle: &str, secs: u64) -> String {
    until(&format!("{needle:?} in {}", path.display()), secs, || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            Ok(text)
        } else {
            Err(text)
        }
    })
}

/// The `gpud` binary under test.
pub fn gpud_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpud"))
}

/// A simulated node: a fixture plus its own control and state files in a temp dir.
pub struct Node {
    pub fixture: String,
    pub dir: tempfile::TempDir,
}

impl Node {
    pub fn new(fixture: &str) -> Node {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("product_name"), "DGX Test\n").expect("machine type file");
        std::fs::write(dir.path().join("control"), "").expect("control file");
        Node {
            fixture: fixture.to_owned(),
            dir,
        }
    }

    pub fn control_path(&self) -> PathBuf {
        self.dir.path().join("control")
    }

    pub fn state_path(&self) -> PathBuf {
        self.dir.path().join("state.json")
    }

    /// The DRA plugin's folders on this node (made here) as `gpud dra`/`run --dra` flags: the
    /// kubelet's registry and plugins folders, the CDI root, the driver and proc roots, the
    /// pod-resources socket.
    pub fn dra_flags(&self) -> Vec<String> {
        // `sys`: the PCIe roots a test lays out (none by default, never the machine's own).
        for dir in ["plugins_registry", "plugins", "cdi", "driver", "sys"] {
            std::fs::create_dir_all(self.dir.path().join(dir)).expect("DRA folder");
        }
        let path = |rel: &str| self.dir.path().join(rel).display().to_string();
        [
            ("--dra-registry-dir", "plugins_registry"),
            ("--dra-plugins-dir", "plugins"),
            ("--dra-cdi-root", "cdi"),
            ("--dra-driver-root", "driver"),
            ("--dra-proc-root", "driver"),
            ("--dra-pod-resources-socket", "pod-resources.sock"),
            ("--dra-sysfs-root", "sys"),
        ]
        .into_iter()
        .flat_map(|(flag, rel)| [flag.to_owned(), path(rel)])
        .collect()
    }

    /// Appends one fault-injection line to the node's control file.
    pub fn inject(&self, line: &str) {
        let mut file = OpenOptions::new()
            .append(true)
            .open(self.control_path())
            .expect("open control file");
        writeln!(file, "{line}").expect("write control file");
        file.sync_all().expect("sync control file");
    }

    /// Appends many fault-injection lines to the control file in one write, as a storm that
    /// the simulated driver sees all at once.
    pub fn inject_all(&self, lines: &[String]) {
        let mut text = lines.join("\n");
        text.push('\n');
        let mut file = OpenOptions::new()
            .append(true)
            .open(self.control_path())
            .expect("open control file");
        file.write_all(text.as_bytes()).expect("write control file");
        file.sync_all().expect("sync control file");
    }

    /// Replaces the simulated driver's MIG state of GPU `uuid` at once (through a rename, as
    /// the driver's state changes in one step): MIG mode on, with `gpu_instances` in the state
    /// file's form (see tests/nvml-mock/README.md). Running processes see it on their next NVML
    /// call that reads MIG state.
    pub fn write_mig_state(&self, uuid: &str, gpu_instances: serde_json::Value) {
        let state = serde_json::json!({"version": 1, "gpus": {uuid: {
            "current": 1, "pending": 1, "gpu_instances": gpu_instances}}});
        let tmp = self.dir.path().join("state.tmp");
        std::fs::write(&tmp, serde_json::to_vec(&state).expect("state json")).expect("write state");
        std::fs::rename(&tmp, self.state_path()).expect("rename state");
    }

    /// `gpud <args…>` wired to this node, with a deterministic environment.
    pub fn gpud(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(gpud_bin());
        cmd.args(args);
        self.wire(&mut cmd);
        cmd
    }

    /// `gpud <args…>` wired to this node, started by `sh` after `umask <umask>`, so that the
    /// files it creates get the mode a service manager's umask would give them.
    pub fn gpud_under_umask(&self, umask: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
            .arg(gpud_bin())
            .args(args);
        self.wire(&mut cmd);
        cmd
    }

    /// Sets the environment that points a command at this node.
    #[allow(clippy::disallowed_methods)] // the test harness passes PATH on
    pub fn wire(&self, cmd: &mut Command) {
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("GPUD_NVML_LIB", mock_lib())
            .env("NVML_MOCK_FIXTURE", &self.fixture)
            .env("NVML_MOCK_CONTROL", self.control_path())
            .env("NVML_MOCK_STATE", self.state_path())
            .env("NVML_MOCK_CLOCK", "1000")
            .env("NODE_NAME", "test-node")
            // Tests run in parallel: the admin endpoint's fixed default port would collide.
            // Tests that wait on /readyz pass their own address.
            .env("GPUD_HEALTH_ADDRESS", "")
            // What gpud keeps across restarts stays with this node, not in /var/lib/gpud.
            .env("GPUD_STATE_DIR", self.dir.path().join("state"))
            .env(
                "GFD_MACHINE_TYPE_FILE",
                self.dir.path().join("product_name"),
            );
    }

    /// Runs `gpud <args…>` to completion.
    pub fn run(&self, args: &[&str]) -> Output {
        self.gpud(args).output().expect("run gpud")
    }
}

/// Whether goldens are rewritten: `GPUD_BLESS` set (`bless`), and never in CI (`ci`: the
/// `CI` variable every CI system sets), where a run that rewrote its goldens would compare
/// gpud's output with itself and pass whatever it printed. Both set is an error, so the run
/// fails instead of passing vacuously.
pub fn blessing(
    bless: Option<&std::ffi::OsStr>,
    ci: Option<&std::ffi::OsStr>,
) -> Result<bool, String> {
    let in_ci = ci.is_some_and(|v| !v.is_empty() && v != "false" && v != "0");
    match (bless.is_some(), in_ci) {
        (true, true) => Err(
            "GPUD_BLESS is set while CI is set: goldens are never rewritten in CI (that would \
             compare gpud's output with itself); unset GPUD_BLESS, or bless locally and commit \
             the reviewed goldens"
                .to_owned(),
        ),
        (bless, _) => Ok(bless),
    }
}

/// Compares `actual` with the golden file at `tests/fixtures/golden/<name>`; with
/// `GPUD_BLESS=1` it rewrites the file instead (review the diff before committing). In CI
/// (`CI` set) `GPUD_BLESS` fails the test instead ([`blessing`]).
#[allow(clippy::disallowed_methods)] // GPUD_BLESS and CI are the harness's own switches
pub fn assert_golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/golden")
        .join(name);
    let bless = std::env::var_os("GPUD_BLESS");
    let ci = std::env::var_os("CI");
    let bless = blessing(bless.as_deref(), ci.as_deref()).unwrap_or_else(|why| panic!("{why}"));
    if bless {
        std::fs::create_dir_all(path.parent().expect("golden dir")).expect("create golden dir");
        std::fs::write(&path, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "missing golden {} ({e}); run with GPUD_BLESS=1",
            path.display()
        )
    });
    if expected != actual {
        let diff_at = expected
            .lines()
            .zip(actual.lines())
            .position(|(e, a)| e != a)
            .map_or_else(
                || "length differs".to_owned(),
                |n| format!("first difference at line {}", n + 1),
            );
        panic!(
            "{} does not match ({diff_at})\n--- expected\n{expected}\n--- actual\n{actual}",
            path.display()
        );
    }
}

/// Stdout as text, asserting the command succeeded.
pub fn stdout_ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("utf-8 stdout")
}

/// A long-running `gpud` whose stdout lines are read with a timeout.
pub struct Running {
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    /// gpud's stderr, kept to be shown only when the test fails: a passing run prints none of
    /// the warnings the tests provoke on purpose.
    stderr: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Running {
    /// Starts `cmd` with stdout captured line by line and stderr kept for a failure report.
    pub fn spawn(mut cmd: Command) -> Running {
        use std::io::BufRead;
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn gpud");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let pipe = child.stderr.take().expect("stderr");
        let kept = std::sync::Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                kept.lock().unwrap().push(line);
            }
        });
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running {
            child,
            lines,
            stderr,
        }
    }

    /// The next line, failing the test after `secs` seconds.
    pub fn next_line(&self, secs: u64) -> String {
        self.lines
            .recv_timeout(std::time::Duration::from_secs(secs))
            .unwrap_or_else(|e| panic!("no output line within {secs}s: {e}"))
    }

    /// The next line, if one arrives within `millis` (a round of a retry loop).
    pub fn line_within(&self, millis: u64) -> Option<String> {
        self.lines
            .recv_timeout(std::time::Duration::from_millis(millis))
            .ok()
    }

    /// gpud's stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// Resident memory of the process in KiB.
    pub fn rss_kib(&self) -> u64 {
        self.proc_status_kib("VmRSS")
    }

    /// The most resident memory the process has had so far, in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        self.proc_status_kib("VmHWM")
    }

    /// A `<field>: <n> kB` line of `/proc/<pid>/status`.
    fn proc_status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc/<pid>/status"))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let kept = self.stderr.lock().map(|l| l.join("\n")).unwrap_or_default();
            eprintln!("--- gpud's stderr ---\n{kept}");
        }
    }
}

/// Sends a signal by name (`TERM`, `HUP`, …) to a child process.
pub fn send_signal(child: &std::process::Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}
