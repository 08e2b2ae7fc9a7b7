//! Running the checks: NVML's facts gathered once under a deadline, then every selected check
//! on its own thread, each with the same deadline. A check still running at its deadline is
//! reported as `fail` ("did not finish") and its thread is left behind: a thread blocked in
//! the driver cannot be cancelled, only abandoned. A [`Busy`] remembers the threads left
//! behind, so a later run (the periodic doctor in `gpud run`) does not start the same work
//! again while the last one still hangs: one thread per check or NVML query, ever.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use super::busy::Busy;
use super::checks::Check;
use super::env::{Driver, Env, Options, Unlisted};
use super::host::HostRoot;
use super::select::Selection;
use crate::doctor_report::{CheckResult, Report, Verdict};
use crate::nvml::{NodeFacts, Nvml};

/// Why started work has no result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// It did not finish by the deadline (its thread is abandoned).
    Late(Duration),
    /// Not started: the thread an earlier run started for it, then, has not finished.
    StillRunning(SystemTime),
    /// Its thread could not start.
    NoThread(String),
}

impl Missing {
    /// What happened, as the end of a sentence whose subject is the work.
    pub fn describe(&self) -> String {
        match self {
            Missing::Late(timeout) => format!(
                "did not finish within {}",
                humantime::format_duration(*timeout)
            ),
            Missing::StillRunning(since) => format!(
                "still not finished since {} (not started again while it hangs)",
                humantime::format_rfc3339_seconds(*since)
            ),
            Missing::NoThread(why) => format!("could not start: {why}"),
        }
    }
}

/// Work [`start`]ed on a thread of its own, or why it was not.
pub type Started<T> = Result<mpsc::Receiver<T>, Missing>;

/// Starts `work` on a thread of its own under the name `name` in `busy`; not when that name's
/// last thread has not finished.
pub fn start<T: Send + 'static>(
    busy: &Busy,
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Started<T> {
    let claim = busy.claim(name).map_err(Missing::StillRunning)?;
    let (tx, rx) = mpsc::sync_channel(1);
    crate::logging::spawn_thread("gpud-doctor", move || {
        let result = work();
        // Released before the result is sent: whoever sees the result sees the name free.
        drop(claim);
        let _ = tx.send(result);
    })
    .map_err(|err| Missing::NoThread(err.to_string()))?;
    Ok(rx)
}

/// Waits for a [`start`]ed result until `deadline` (`timeout` after the start).
pub fn wait<T>(started: Started<T>, deadline: Instant, timeout: Duration) -> Result<T, Missing> {
    started?
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .map_err(|_| Missing::Late(timeout))
}

/// Loads NVML (when `nvml` is not given) and reads discovery and preflight facts, each bounded
/// by the timeout.
pub fn gather(options: &Options, nvml: Option<Nvml>, busy: &Busy) -> Driver {
    let timeout = options.timeout;
    let nvml = match nvml {
        Some(nvml) => nvml,
        None => {
            let explicit = options.nvml_lib.clone();
            let opened = start(busy, "nvml.init", move || {
                Nvml::open(explicit.as_deref()).map_err(|err| err.to_string())
            });
            match wait(opened, Instant::now() + timeout, timeout) {
                Ok(Ok(nvml)) => nvml,
                Ok(Err(why)) => return Driver::Unavailable(why),
                Err(missing) => {
                    return Driver::Unavailable(format!("nvmlInit {}", missing.describe()));
                }
            }
        }
    };
    let deadline = Instant::now() + timeout;
    let discovered = start(busy, "nvml.discover", {
        let nvml = nvml.clone();
        move || {
            let facts = NodeFacts {
                node_name: None,
                machine_type_file: None,
            };
            nvml.discover(&facts).map_err(|err| err.to_string())
        }
    });
    let preflight = start(busy, "nvml.preflight", {
        let nvml = nvml.clone();
        move || nvml.preflight()
    });
    let mig = options.mig_config.is_some().then(|| {
        let admin = nvml.mig_admin();
        start(busy, "nvml.mig", move || {
            admin
                .gpus()
                .map_err(|err| crate::logging::error_chain(&err))
        })
    });
    let chosen = |index: u32| options.gpus.is_empty() || options.gpus.contains(&index);
    let snapshot = wait(discovered, deadline, timeout)
        .unwrap_or_else(|missing| Err(format!("NVML discovery {}", missing.describe())))
        .map(|mut snapshot| {
            snapshot.gpus.retain(|g| chosen(g.index));
            Arc::new(snapshot)
        });
    let mut unlisted = Unlisted::default();
    let preflight = wait(preflight, deadline, timeout)
        .map_err(|missing| format!("NVML health queries {}", missing.describe()))
        .map(|mut gpus| {
            let listed: Vec<u32> = gpus.iter().map(|g| g.signals.gpu).collect();
            let named: Vec<u32> = (options.gpus.iter())
                .filter(|i| !listed.contains(i))
                .copied()
                .collect();
            if !named.is_empty() {
                unlisted = Unlisted { named, listed };
            }
            gpus.retain(|g| chosen(g.signals.gpu));
            Arc::new(gpus)
        });
    let mig = match mig {
        None => Err("no MIG config file given".to_owned()),
        Some(started) => wait(started, deadline, timeout)
            .unwrap_or_else(|missing| Err(format!("NVML MIG queries {}", missing.describe())))
            .map(Arc::new),
    };
    Driver::Loaded {
        path: nvml.library_path().to_path_buf(),
        snapshot,
        preflight,
        mig,
        unlisted,
    }
}

/// One check to run: its id and group, and its work.
pub struct Job {
    pub id: &'static str,
    pub group: &'static str,
    pub work: Box<dyn FnOnce() -> Verdict + Send>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Job {
    fn of(check: &'static Check, env: &Env) -> Job {
        let (env, run) = (env.clone(), check.run);
        Job {
            id: check.id,
            group: check.group(),
            work: Box::new(move || run(&env)),
        }
    }
}

/// Runs `jobs` all at once, each bounded by `timeout`; a job whose thread from an earlier run
/// (same `busy`) still runs is not started and reported as failed.
pub fn run_jobs(jobs: Vec<Job>, timeout: Duration, busy: &Busy) -> Vec<CheckResult> {
    let started = Instant::now();
    let deadline = started + timeout;
    let running: Vec<_> = jobs
        .into_iter()
        .map(|job| {
            let work = job.work;
            let rx = start(busy, job.id, move || {
                let began = Instant::now();
                (work(), began.elapsed())
            });
            (job.id, job.group, rx)
        })
        .collect();
    running
        .into_iter()
        .map(|(id, group, rx)| {
            let (verdict, took) = wait(rx, deadline, timeout).unwrap_or_else(|missing| {
                let found = match missing {
                    Missing::Late(_) => {
                        format!("{} (a driver call or a file read hangs)", missing.describe())
                    }
                    _ => missing.describe(),
                };
                (
                    Verdict::fail(
                        found,
                        "look for a GPU that fell off the bus (dmesg | grep -i xid) or a hung mount; reboot the node if NVML hangs",
                    ),
                    started.elapsed(),
                )
            });
            CheckResult {
                id: id.to_owned(),
                group: group.to_owned(),
                status: verdict.status,
                found: verdict.found,
                fix: verdict.fix,
                duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            }
        })
        .collect()
}

/// Runs the selected checks over `env`, all at once, each bounded by the timeout.
pub fn run_checks(env: &Env, selection: &Selection, busy: &Busy) -> Vec<CheckResult> {
    let jobs = selection
        .checks()
        .map(|check| Job::of(check, env))
        .collect();
    run_jobs(jobs, env.options.timeout, busy)
}

/// A whole doctor run: gathers NVML's facts (opening NVML unless `nvml` is given) and runs the
/// selected checks. Blocks; returns within about twice the timeout whatever the driver does.
/// Also returns what NVML said, for the support bundle and the validator's files.
pub fn run(options: Options, selection: &Selection, nvml: Option<Nvml>) -> (Report, Driver) {
    run_with(options, selection, nvml, &Busy::default())
}

/// [`run`], remembering the threads it leaves behind in `busy` and not starting work again
/// whose thread from an earlier run with the same `busy` still hangs.
pub fn run_with(
    options: Options,
    selection: &Selection,
    nvml: Option<Nvml>,
    busy: &Busy,
) -> (Report, Driver) {
    let host_root = options.host_root.display().to_string();
    let needs_nvml = selection.checks().any(|c| c.needs_nvml);
    let driver = if needs_nvml {
        gather(&options, nvml, busy)
    } else {
        Driver::Unavailable("not loaded: no selected check needs it".to_owned())
    };
    let env = Env {
        host: HostRoot::new(options.host_root.clone()),
        driver,
        options: Arc::new(options),
    };
    (
        Report::new(host_root, run_checks(&env, selection, busy)),
        env.driver,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor_report::Status;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A check that counts its starts and, given a gate, blocks until the gate opens.
    fn job(starts: &Arc<AtomicUsize>, gate: Option<mpsc::Receiver<()>>) -> Job {
        let starts = Arc::clone(starts);
        Job {
            id: "test.hang",
            group: "test",
            work: Box::new(move || {
                starts.fetch_add(1, Ordering::SeqCst);
                if let Some(gate) = gate {
                    let _ = gate.recv();
                }
                Verdict::ok("answered")
            }),
        }
    }

    #[test]
    fn a_hung_check_keeps_one_thread_and_is_not_started_again() {
        let busy = Busy::default();
        let starts = Arc::new(AtomicUsize::new(0));
        let timeout = Duration::from_millis(50);
        let (open, gate) = mpsc::channel::<()>();

        let first = run_jobs(vec![job(&starts, Some(gate))], timeout, &busy);
        assert_eq!(first[0].status, Status::Fail);
        assert_eq!(
            first[0].found,
            "did not finish within 50ms (a driver call or a file read hangs)"
        );
        let since = busy.since("test.hang").unwrap();

        // Every later run finds the first thread still blocked: it neither starts another nor
        // waits for the deadline again.
        for _ in 0..3 {
            let again = run_jobs(vec![job(&starts, None)], timeout, &busy);
            assert_eq!(again[0].status, Status::Fail);
            assert_eq!(
                again[0].found,
                format!(
                    "still not finished since {} (not started again while it hangs)",
                    humantime::format_rfc3339_seconds(since)
                )
            );
            assert_eq!(starts.load(Ordering::SeqCst), 1);
            assert_eq!(busy.len(), 1);
        }

        // Once the blocked call returns, the check runs again.
        open.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !busy.is_empty() {
            assert!(
                Instant::now() < deadline,
                "the released check never finished"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let last = run_jobs(vec![job(&starts, None)], timeout, &busy);
        assert_eq!(last[0].status, Status::Ok);
        assert_eq!(last[0].found, "answered");
        assert_eq!(starts.load(Ordering::SeqCst), 2);
        assert!(busy.is_empty());
    }
}
