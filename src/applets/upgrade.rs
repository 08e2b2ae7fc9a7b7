//! `gpud upgrade`: asks the running gpud to start the installed binary, which takes over from
//! it without a gap (see `gpud::handover`), and waits until it has.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::cli::{self, StateArgs};
use crate::daemon::Error;
use crate::handover;

/// Replace the running gpud with the binary now installed at its path: the new process takes
/// over the sockets, state and MPS daemons, then the old one stops. `systemctl reload` still
/// only re-reads the configuration.
///
/// Exit status: 0 the new gpud took over; 64 bad arguments; 69 no upgrade happened and the
/// running gpud (if any) serves on: none answers on the state directory's socket, it could
/// not start the installed binary, the new gpud exited before taking over, or it did not
/// take over within --timeout (it is stopped then).
#[derive(Debug, Parser)]
#[command(name = "gpud upgrade", version)]
struct Args {
    #[command(flatten)]
    state: StateArgs,

    /// The applet whose running process to upgrade (`run` on bare metal; in a per-applet
    /// deployment each container is its own).
    #[arg(long, value_name = "APPLET", default_value = "run")]
    applet: String,

    /// How long the new gpud has to take over (the old process gone); one still taking over
    /// then is stopped, and the old one serves on.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = crate::values::positive_duration)]
    timeout: Duration,
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> Result<ExitCode, Error> {
    let args: Args = cli::parse(argv)?;
    if args.state.state_dir.is_empty() {
        return Err(Error::Usage(
            "gpud upgrade: --state-dir is empty, so no gpud can be reached: give the running \
             one's state directory"
                .into(),
        ));
    }
    let socket = handover::socket_of(Path::new(&args.state.state_dir), &args.applet);
    let upgraded = handover::upgrade::ask(&socket, args.timeout)
        .map_err(|err| Error::Unavailable(format!("gpud upgrade: {err}")))?;
    match upgraded.took {
        Some(took) => println!(
            "gpud {} ({}) took over from gpud {} in {} ms",
            upgraded.new_pid,
            upgraded.program,
            upgraded.old_pid,
            took.as_millis()
        ),
        None => println!(
            "gpud {} ({}) started to take over from gpud {}",
            upgraded.new_pid, upgraded.program, upgraded.old_pid
        ),
    }
    Ok(ExitCode::SUCCESS)
}
