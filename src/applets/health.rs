//! `gpud health`: the health watcher on its own, printing every transition; or, with `--once`,
//! the current health of every device and an exit code for scripts.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{self, AdminArgs, CommonArgs, NodeArgs};
use crate::daemon::{self, Daemon, Error};
use crate::health::args::HealthArgs;
use crate::health::report;
use crate::health::service::{HealthWatcher, TransitionPrinter};

/// Watch GPU health: XIDs, ECC errors, row remapping, lost GPUs, temperature and NVLinks.
///
/// Prints one line per health transition. XIDs that NVIDIA's device plugin treats as
/// application errors (13, 31, 43, 45, 68, 109) are ignored; DP_DISABLE_HEALTHCHECKS and
/// DP_ENABLE_HEALTHCHECKS adjust that list exactly as they do for NVIDIA's plugin.
#[derive(Debug, Parser)]
#[command(name = "gpud health", version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    node: NodeArgs,

    /// Print the health of every device now and exit: 0 all healthy, 1 degraded, 2 unhealthy.
    #[arg(long)]
    once: bool,

    /// Print JSON (one object per line) instead of text.
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    health: HealthArgs,

    #[command(flatten)]
    admin: AdminArgs,
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> Result<ExitCode, Error> {
    let args: Args = cli::parse(argv)?;
    if args.once {
        // A one-off command: signals keep their default actions.
        daemon::signals::unblock();
    }
    let (settings, _) = args.health.resolve("health")?;
    let nvml = args.common.start()?;
    // No rescans: the watcher notices lost GPUs and their return on its own.
    let inventory = nvml.inventory(&args.node.facts())?;
    if args.once {
        let record = settings.remediation_record.clone();
        let mut snapshot = report::poll_once(&nvml, &inventory, settings);
        // What gpud's remediation holds out of service is unhealthy here too; a record that
        // cannot be read is said, and every GPU reported unhealthy.
        if let Some(path) = record
            && let Err(why) = report::hold_by_record(&mut snapshot, &path)
        {
            eprintln!("gpud: {why}");
        }
        let text = if args.json {
            report::json_lines(&snapshot)
        } else {
            report::table(&snapshot)
        };
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        return Ok(ExitCode::from(report::exit_code(&snapshot)));
    }
    let mut daemon = Daemon::fixed("health");
    daemon.add_support(HealthWatcher::required(nvml, settings));
    daemon.add_fixed(TransitionPrinter::new(args.json));
    daemon.serve_admin(&args.admin.address(super::admin_port("health")));
    daemon.hand_over(&args.health.state.state_dir);
    daemon.run(inventory)
}
