//! The binary this daemon was started from, started again to take over from it (`gpud
//! upgrade`, SIGUSR2): the path is the one the process was started as, so a binary replaced
//! there since (a package upgrade) is the one that starts.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use tracing::{info, warn};

use super::signals;

/// How to start this daemon again.
#[derive(Debug, Clone)]
pub struct Successor {
    program: PathBuf,
    /// argv[0] as given: a `gpud-<applet>` link name picks the applet.
    arg0: OsString,
    args: Vec<OsString>,
}

impl Successor {
    /// This process's program and arguments, read at start (before the binary on disk can
    /// change).
    pub fn of_this_process() -> Option<Self> {
        let program = std::env::current_exe().ok()?;
        // A binary replaced before this was read shows as "<path> (deleted)".
        let text = program.to_string_lossy();
        let program = text
            .strip_suffix(" (deleted)")
            .map_or(program.clone(), PathBuf::from);
        let mut args = std::env::args_os();
        let arg0 = args.next()?;
        Some(Successor {
            program,
            arg0,
            args: args.collect(),
        })
    }

    /// Starts it with this process's environment and the default signal mask; returns its pid
    /// and program. A thread reaps it if it exits while this process still runs, and logs how.
    pub fn start(&self) -> Result<(u32, String), String> {
        let mut command = Command::new(&self.program);
        command
            .arg0(&self.arg0)
            .args(&self.args)
            .stdin(Stdio::null());
        let mut child = signals::with_default_mask(|| command.spawn())
            .map_err(|err| format!("cannot start {}: {err}", self.program.display()))?;
        let pid = child.id();
        let program = self.program.display().to_string();
        let spawned = std::thread::Builder::new()
            .name("gpud-successor".into())
            .spawn(move || match child.wait() {
                Ok(status) if status.success() => info!(pid, "The gpud started to take over exited"),
                Ok(status) => warn!(pid, %status, "The gpud started to take over exited; this one keeps serving"),
                Err(err) => warn!(pid, error = %err, "Cannot wait for the gpud started to take over"),
            });
        if let Err(err) = spawned {
            warn!(error = %err, "Cannot watch the gpud started to take over");
        }
        Ok((pid, program))
    }
}
