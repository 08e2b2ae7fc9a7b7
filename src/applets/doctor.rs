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
use crate::logging::{self, LogFormat};

/// Check the node: driver, device nodes, every GPU, MIG, NVSwitch fabric, container runtime,
/// CDI, kubelet, GPUDirect, SELinux and gpud's config; say what is wrong and what to do.
///
/// Exit status: 0 every check ok or skipped, 1 warnings, 2 failures (64 bad arguments).
#[derive(Debug, Parser)]
#[command(name = "gpud doctor", version)]
struct Args {
    /// NVML library to load instead of searching the usual places.
    #[arg(long, value_name = "PATH", env = crate::nvml::LIB_ENV)]
    nvml_lib: Option<PathBuf>,

    /// Log line format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "GPUD_LOG_FORMAT")]
    log_format: LogFormat,

    /// Where the host's root is mounted (inside a container, e.g. /host); every host path
    /// read (/dev, /proc, /sys, /etc, /var/lib/kubelet, /run) is taken under it.
    #[arg(long, value_name = "PATH", env = "GPUD_HOST_ROOT", default_value = "/")]
    host_root: PathBuf,

    /// Kernel log to read XIDs from [default: <host-root>/dev/kmsg].
    #[arg(long, value_name = "PATH")]
    kmsg: Option<PathBuf>,

    /// gpud config file to validate.
    #[arg(long, value_name = "PATH", env = crate::config::CONFIG_ENV)]
    config: Option<PathBuf>,

    /// NVIDIA device plugin / GFD config file to validate.
    #[arg(long, value_name = "PATH", env = "CONFIG_FILE")]
    nvidia_config: Option<PathBuf>,

    /// mig-parted config file the node follows; mig.config checks that its selected config
    /// is in effect.
    #[arg(long, value_name = "PATH", env = "GPUD_MIG_CONFIG_FILE")]
    mig_config_file: Option<PathBuf>,

    /// The config of --mig-config-file to check [default: the one the reconciler last
    /// followed, else the file's only one].
    #[arg(long, value_name = "LABEL", env = "MIG_PARTED_SELECTED_CONFIG")]
    mig_selected_config: Option<String>,

    /// The UID MPS workloads run as (their pods' runAsUser): `mps.uid` fails when an MPS
    /// server runs under another one.
    #[arg(long, value_name = "UID", env = "GPUD_MPS_WORKLOAD_UID")]
    mps_workload_uid: Option<u32>,

    /// The MIG reconciler's state directory, where it records its last state and reason.
    #[arg(long, value_name = "PATH", env = "GPUD_MIG_STATE_DIR",
          default_value = crate::mig_state::DEFAULT_STATE_DIR)]
    mig_state_dir: PathBuf,

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
    logging::init(args.log_format);
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
        host_root: args.host_root.clone(),
        nvml_lib: args.nvml_lib.clone(),
        kmsg: args.kmsg.clone(),
        gpud_config: args.config.clone(),
        nvidia_config: args.nvidia_config.clone(),
        timeout: args.timeout,
        mig_config: args.mig_config_file.clone(),
        mig_selected: args.mig_selected_config.clone(),
        mig_state_dir: args.mig_state_dir.clone(),
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
        let host = HostRoot::new(args.host_root.clone());
        let peermem = host.modules().is_some_and(|m| m.contains("nvidia_peermem"));
        let variables = validations::driver_variables(&driver, &args.host_root);
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
