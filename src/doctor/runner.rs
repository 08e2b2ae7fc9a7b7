//! Running the checks: NVML's facts gathered once under a deadline, then every selected check
//! on its own thread, each with the same deadline. A check still running at its deadline is
//! reported as `fail` ("did not finish") and its thread is left behind: a thread blocked in
//! the driver cannot be cancelled, only abandoned.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Instant;

use super::checks::{CATALOG, Check};
use super::env::{Driver, Env, Options};
use super::host::HostRoot;
use super::report::{CheckResult, Report, Verdict};
use super::select::Selection;
use crate::nvml::{NodeFacts, Nvml};

/// Starts `work` on a thread of its own; `None` when the thread cannot start.
pub fn start<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<mpsc::Receiver<T>> {
    let (tx, rx) = mpsc::sync_channel(1);
    crate::telemetry::spawn_thread(name, move || {
        let _ = tx.send(work());
    })
    .ok()
    .map(|_| rx)
}

/// Waits for a [`start`]ed result until `deadline`; `None` when it did not come by then (its
/// thread is abandoned).
pub fn wait<T>(started: Option<mpsc::Receiver<T>>, deadline: Instant) -> Option<T> {
    started?
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .ok()
}

/// Loads NVML (when `nvml` is not given) and reads discovery and preflight facts, each bounded
/// by the timeout.
pub fn gather(options: &Options, nvml: Option<Nvml>) -> Driver {
    let timeout = options.timeout;
    let waited = format!(
        "did not answer within {}",
        humantime::format_duration(timeout)
    );
    let nvml = match nvml {
        Some(nvml) => nvml,
        None => {
            let explicit = options.nvml_lib.clone();
            let opened = start("gpud-doctor-nvml", move || {
                Nvml::open(explicit.as_deref()).map_err(|err| err.to_string())
            });
            match wait(opened, Instant::now() + timeout) {
                Some(Ok(nvml)) => nvml,
                Some(Err(why)) => return Driver::Unavailable(why),
                None => return Driver::Unavailable(format!("nvmlInit {waited}")),
            }
        }
    };
    let deadline = Instant::now() + timeout;
    let discovered = start("gpud-doctor-discover", {
        let nvml = nvml.clone();
        move || {
            let facts = NodeFacts {
                node_name: None,
                machine_type_file: None,
            };
            nvml.discover(&facts).map_err(|err| err.to_string())
        }
    });
    let preflight = start("gpud-doctor-preflight", {
        let nvml = nvml.clone();
        move || nvml.preflight()
    });
    let snapshot = wait(discovered, deadline)
        .unwrap_or_else(|| Err(format!("NVML discovery {waited}")))
        .map(Arc::new);
    let preflight = wait(preflight, deadline)
        .map(Arc::new)
        .ok_or_else(|| format!("NVML health queries {waited}"));
    Driver::Loaded {
        path: nvml.library_path().to_path_buf(),
        snapshot,
        preflight,
    }
}

/// Runs the selected checks over `env`, all at once, each bounded by the timeout.
pub fn run_checks(env: &Env, selection: &Selection) -> Vec<CheckResult> {
    let timeout = env.options.timeout;
    let selected: Vec<&'static Check> = CATALOG
        .iter()
        .filter(|check| selection.includes(check.id))
        .collect();
    let started = Instant::now();
    let deadline = started + timeout;
    let receivers: Vec<_> = selected
        .iter()
        .map(|check| {
            let (env, run) = (env.clone(), check.run);
            start("gpud-doctor-check", move || {
                let began = Instant::now();
                (run(&env), began.elapsed())
            })
        })
        .collect();
    selected
        .iter()
        .zip(receivers)
        .map(|(check, rx)| {
            let outcome = wait(rx, deadline);
            let (verdict, took) = outcome.unwrap_or_else(|| {
                (
                    Verdict::fail(
                        format!(
                            "did not finish within {} (a driver call or a file read hangs)",
                            humantime::format_duration(timeout)
                        ),
                        "look for a GPU that fell off the bus (dmesg | grep -i xid) or a hung mount; reboot the node if NVML hangs",
                    ),
                    started.elapsed(),
                )
            });
            CheckResult {
                id: check.id.to_owned(),
                group: check.group().to_owned(),
                status: verdict.status,
                found: verdict.found,
                fix: verdict.fix,
                duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            }
        })
        .collect()
}

/// A whole doctor run: gathers NVML's facts (opening NVML unless `nvml` is given) and runs the
/// selected checks. Blocks; returns within about twice the timeout whatever the driver does.
/// Also returns what NVML said, for the support bundle and the validator's files.
pub fn run(options: Options, selection: &Selection, nvml: Option<Nvml>) -> (Report, Driver) {
    let host_root = options.host_root.display().to_string();
    let needs_nvml = CATALOG
        .iter()
        .any(|c| c.needs_nvml && selection.includes(c.id));
    let driver = if needs_nvml {
        gather(&options, nvml)
    } else {
        Driver::Unavailable("not loaded: no selected check needs it".to_owned())
    };
    let env = Env {
        host: HostRoot::new(options.host_root.clone()),
        driver,
        options: Arc::new(options),
    };
    (
        Report::new(host_root, run_checks(&env, selection)),
        env.driver,
    )
}
