//! `gpud doctor`: every node check at once, a table or JSON, and an exit code for scripts;
//! optionally a support bundle and the GPU Operator validator's status files.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::cli;
use crate::daemon::Error;
use crate::doctor::host::HostRoot;
use crate::doctor::select::Selection;
use crate::doctor::{bundle, checks, render, runner, validations};
use crate::logging;

/// Check the node: driver, device nodes, every GPU, MIG, NVSwitch fabric, container runtime,
/// CDI, kubelet, GPUDirect, SELinux and gpud's config; say what is wrong and what to do.
///
/// Exit status: 0 every check ok or skipped, 1 warnings, 2 failures (64 bad arguments).
#[derive(Debug, Parser)]
#[command(name = "gpud doctor", version)]
struct Args {
    #[command(flatten)]
    common: cli::CommonArgs,

    #[command(flatten)]
    host: cli::HostRootArgs,

    /// Kernel log to read XIDs from [default: <host-root>/dev/kmsg].
    #[arg(long, value_name = "PATH")]
    kmsg: Option<PathBuf>,

    /// gpud's config file to validate.
    #[command(flatten)]
    gpud_config: cli::GpudConfigArgs,

    /// NVIDIA device plugin / GFD config file to validate.
    #[arg(long, value_name = "PATH", env = "CONFIG_FILE")]
    nvidia_config: Option<PathBuf>,

    /// The mig-parted config file the node follows.
    #[command(flatten)]
    mig_config: cli::MigConfigArgs,

    /// The config of --mig-config-file to check [default: the one the reconciler last
    /// followed, else the file's only one].
    #[arg(long, value_name = "LABEL", env = "MIG_PARTED_SELECTED_CONFIG")]
    mig_selected_config: Option<String>,

    /// The UID MPS workloads run as (their pods' runAsUser): `mps.uid` fails when an MPS
    /// server runs under another one.
    #[arg(long, value_name = "UID", env = "GPUD_MPS_WORKLOAD_UID")]
    mps_workload_uid: Option<u32>,

    /// The MIG reconciler's state directory, where it records its last state and reason.
    #[command(flatten)]
    mig_state: cli::MigStateArgs,

    /// The state directory of the gpud whose MIG reconciler is checked (where its
    /// `--mig-state-dir` defaults to).
    #[command(flatten)]
    state: cli::StateArgs,

    /// Print the report as JSON (schema gpud.doctor/v1, see docs/doctor.md).
    #[arg(long)]
    json: bool,

    /// Run only these checks or groups (comma-separated, e.g. gpu,runtime.cdi-spec).
    #[arg(long, value_name = "CHECKS", value_delimiter = ',')]
    only: Vec<String>,

    /// Judge only these GPUs (NVML indices, comma-separated) in the per-GPU checks, e.g. the
    /// GPUs just reset [default: every GPU].
    #[arg(long, value_name = "INDICES", value_delimiter = ',')]
    gpu: Vec<u32>,

    /// Leave out these checks or groups (comma-separated).
    #[arg(long, value_name = "CHECKS", value_delimiter = ',')]
    skip: Vec<String>,

    /// Per-check deadline: a check (or NVML) that takes longer is reported as failed.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = cli::positive_duration)]
    timeout: Duration,

    /// Also write a support bundle (tar.gz) to this file.
    #[arg(long, value_name = "FILE")]
    bundle: Option<PathBuf>,

    /// Also write the GPU Operator validator's status files (driver-ready, toolkit-ready,
    /// plugin-ready, nvidia-peermem-ready) into this directory, removing those whose checks
    /// failed [operator default: /run/nvidia/validations].
    #[arg(long, value_name = "DIR")]
    write_validations: Option<PathBuf>,

    /// List the checks and exit.
    #[arg(long)]
    list: bool,
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> Result<ExitCode, Error> {
    let args: Args = cli::parse(argv)?;
    args.common.stop_if_checking()?;
    logging::init(args.common.log_format);
    if args.list {
        let text: String = checks::CATALOG
            .iter()
            .map(|c| format!("{:<20}{}\n", c.id, c.about))
            .collect();
        cli::print_stdout(&text, "the check list")?;
        return Ok(ExitCode::SUCCESS);
    }
    let selection = Selection::new(args.only.clone(), args.skip.clone()).map_err(|why| {
        eprintln!("gpud doctor: {why}");
        Error::Reported(crate::exit::USAGE)
    })?;
    let options = crate::doctor::Options {
        host_root: args.host.host_root.clone(),
        nvml_lib: args.common.nvml_lib.clone(),
        kmsg: args.kmsg.clone(),
        gpud_config: args.gpud_config.config.clone(),
        nvidia_config: args.nvidia_config.clone(),
        timeout: args.timeout,
        mig_config: args.mig_config.mig_config_file.clone(),
        mig_selected: args.mig_selected_config.clone(),
        mig_state_dir: args.mig_state.resolve(&args.state),
        mps_workload_uid: args.mps_workload_uid,
        gpus: args.gpu.clone(),
        watched: None,
    };
    let (report, driver) = runner::run(options.clone(), &selection, None);
    let text = if args.json {
        render::json(&report)
    } else {
        render::table(&report, std::io::stdout().is_terminal())
    };
    cli::print_stdout(&text, "the report")?;
    if let Some(path) = &args.bundle {
        bundle::write(path, &report, &judge_health, &driver, &options).map_err(|err| {
            Error::Failure(format!(
                "cannot write the support bundle {}: {err}",
                path.display()
            ))
        })?;
        eprintln!("gpud doctor: support bundle written to {}", path.display());
    }
    if let Some(dir) = &args.write_validations {
        let host = HostRoot::new(args.host.host_root.clone());
        let peermem = host.modules().is_some_and(|m| m.contains("nvidia_peermem"));
        let variables = validations::driver_variables(&driver, &args.host.host_root);
        let outcome = validations::write(dir, &report, &variables, peermem).map_err(|err| {
            Error::Failure(format!(
                "cannot write the status files in {}: {err}",
                dir.display()
            ))
        })?;
        eprintln!(
            "gpud doctor: {}: wrote {}; removed {}",
            dir.display(),
            list_or_none(&outcome.written),
            list_or_none(&outcome.removed)
        );
    }
    Ok(ExitCode::from(report.exit_code()))
}

fn list_or_none(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// The bundle's `health.txt` and `health.jsonl`: the health subsystem's one-shot judgement
/// (with the default policy) of the signals the doctor read.
fn judge_health(
    snapshot: &mut crate::inventory::Snapshot,
    signals: &[&crate::nvml::GpuSignals],
) -> (String, String) {
    use crate::health::report;
    report::assess(
        snapshot,
        signals.iter().copied(),
        crate::health::watcher::WatcherConfig::default(),
    );
    (report::table(snapshot), report::json_lines(snapshot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_doctor_reads_the_mig_state_where_the_state_dir_puts_it() {
        let args = Args::try_parse_from(["gpud doctor", "--state-dir", "/srv/gpud"]).unwrap();
        assert_eq!(
            args.mig_state.resolve(&args.state),
            std::path::Path::new("/srv/gpud/mig")
        );
        let args = Args::try_parse_from(["gpud doctor"]).unwrap();
        assert_eq!(
            args.mig_state.resolve(&args.state),
            std::path::Path::new(crate::mig_state::DEFAULT_STATE_DIR)
        );
    }
}
