//! `gpud cdi generate`: writes a CDI spec for the node's GPUs and MIG devices, a drop-in for
//! `nvidia-ctk cdi generate` (same flags, names, spec shape).
//!
//! A thin shell: NVML discovery gives the snapshot, [`cdi::discover`] the host files,
//! [`cdi::build`] the spec; the file is written atomically with mode 0644.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, Parser, Subcommand, ValueEnum};

use crate::cdi::discover::{self, HostPaths};
use crate::cdi::kind::{DEFAULT_CLASS, DEFAULT_VENDOR, check_class, check_vendor};
use crate::cdi::{self, Format, HookName, Kind, NameStrategy, Options};
use crate::cli::{self, CommonArgs};
use crate::daemon::{Error, signals};
use crate::inventory::{Inventory, Snapshot};
use crate::nvml::library::nvrm_version;
use crate::nvml::{NodeFacts, Rescanner};

/// Where the spec goes by default: the folder runtimes scan for generated specs, under the
/// name the toolkit's refresh service uses.
pub const DEFAULT_OUTPUT: &str = "/var/run/cdi/nvidia.yaml";

/// Generate and manage CDI specs for the node's GPUs.
#[derive(Debug, Parser)]
#[command(name = "gpud cdi", version, subcommand_required = true)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write a CDI spec naming every GPU and MIG device (by index and UUID by default) plus
    /// `all`, with the driver's libraries, utilities, sockets, firmware and hooks.
    Generate(Box<GenerateArgs>),
}

/// Discovery modes of `nvidia-ctk`; gpud always reads the node through NVML.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Same as `nvml`.
    Auto,
    /// Devices from NVML.
    Nvml,
}

#[derive(Debug, clap::Args)]
struct GenerateArgs {
    #[command(flatten)]
    common: CommonArgs,

    /// File to write ("-" for stdout).
    #[arg(long, value_name = "PATH", env = "NVIDIA_CTK_CDI_OUTPUT_FILE_PATH",
          default_value = DEFAULT_OUTPUT)]
    output: PathBuf,

    /// Output format [default: from the --output extension, else yaml].
    #[arg(long, value_enum)]
    format: Option<Format>,

    /// How devices are found (only NVML-based modes exist in gpud).
    #[arg(long, value_enum, default_value_t = Mode::Auto)]
    mode: Mode,

    /// Vendor of the spec's kind (vendor/class).
    #[arg(long, value_name = "VENDOR", default_value = DEFAULT_VENDOR, value_parser = check_vendor)]
    vendor: String,

    /// Class of the spec's kind (vendor/class).
    #[arg(long, value_name = "CLASS", default_value = DEFAULT_CLASS, value_parser = check_class)]
    class: String,

    /// How devices are named; repeat or comma-separate for several [default: index,uuid].
    #[arg(long, value_name = "STRATEGY", value_enum, value_delimiter = ',', action = ArgAction::Append)]
    device_name_strategy: Vec<NameStrategy>,

    /// Root of the driver installation (libraries, utilities, firmware, sockets).
    #[arg(long, value_name = "PATH", default_value = "/")]
    driver_root: PathBuf,

    /// Where this process sees the host's root: files are read under it, the spec names
    /// them as the host sees them.
    #[command(flatten)]
    host: cli::HostRootArgs,

    /// Root under which /dev is found [default: the driver root].
    #[arg(long, value_name = "PATH")]
    dev_root: Option<PathBuf>,

    /// procfs to read MIG capability minors from [default: <driver root>/proc].
    #[arg(long, value_name = "PATH")]
    proc_root: Option<PathBuf>,

    /// nvidia-cdi-hook executable the spec's hooks run; hooks are left out when it does not
    /// exist [default: gpud's hook, /usr/local/nvidia/toolkit/nvidia-cdi-hook, when
    /// installed, else /usr/bin/nvidia-cdi-hook].
    #[arg(long, value_name = "PATH", visible_alias = "nvidia-ctk-path")]
    nvidia_cdi_hook_path: Option<PathBuf>,

    /// Hook to leave out ("all" for every hook); repeat or comma-separate for several.
    #[arg(long, value_name = "HOOK", value_enum, value_delimiter = ',', action = ArgAction::Append)]
    disable_hook: Vec<HookName>,

    /// ldconfig for the update-ldcache hook to run [default: the hook's own choice].
    #[arg(long, value_name = "PATH")]
    ldconfig_path: Option<String>,

    /// Do not add the "all" device.
    #[arg(long)]
    no_all_device: bool,

    /// Keep running: rescan the node every --interval and write the spec again whenever it
    /// changes (a GPU lost or back, MIG repartitioned, a new driver). The toolkit step's way
    /// of keeping the spec runtimes read current.
    #[arg(long)]
    watch: bool,

    /// Rescan interval for --watch, e.g. "30s", "500ms".
    #[arg(long, value_name = "DURATION", default_value = "30s",
          value_parser = crate::values::positive_duration)]
    interval: Duration,
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> Result<ExitCode, Error> {
    let args: Args = cli::parse(argv)?;
    match args.command {
        Command::Generate(generate) => run_generate(&generate)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn run_generate(args: &GenerateArgs) -> Result<(), Error> {
    let nvml = args.common.start()?;
    tracing::debug!(mode = ?args.mode, "Reading the node through NVML");
    let facts = NodeFacts {
        node_name: None,
        machine_type_file: None,
    };
    let to_stdout = args.output.as_os_str() == "-";
    if args.watch && to_stdout {
        return Err(Error::Usage(
            "--watch writes the spec file again on every change; give --output a path, not -"
                .to_owned(),
        ));
    }
    let rescanner = Rescanner::new(nvml, facts, args.interval);
    let inventory = rescanner.discover()?;
    let first = generate(args, &inventory.current())?;
    if to_stdout {
        return cli::print_stdout(&first, "the spec");
    }
    write_if_changed(&args.output, &first)?;
    if !args.watch {
        return Ok(());
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| Error::Failure(format!("cannot start the runtime: {err}")))?
        .block_on(watch(args, rescanner, inventory))
}

/// Writes the spec again on every inventory change, until SIGINT/SIGTERM. A spec that cannot
/// be built or written is logged and the old file kept: the next change tries again.
async fn watch(
    args: &GenerateArgs,
    rescanner: Rescanner,
    inventory: Inventory,
) -> Result<(), Error> {
    let mut updates = inventory.subscribe();
    updates.borrow_and_update();
    let rescans = rescanner.spawn(&inventory);
    let stop_signal = signals::shutdown();
    tokio::pin!(stop_signal);
    let mut driver_check = tokio::time::interval(args.interval);
    let outcome = loop {
        tokio::select! {
            () = &mut stop_signal => break Ok(()),
            _ = driver_check.tick() => {
                if let Err(err) = same_driver(args, &inventory.current()) {
                    break Err(err);
                }
            }
            changed = updates.changed() => {
                if changed.is_err() {
                    break Ok(());
                }
                let snapshot = updates.borrow_and_update().clone();
                if let Err(err) = generate(args, &snapshot)
                    .and_then(|text| write_if_changed(&args.output, &text))
                {
                    tracing::error!(
                        path = %args.output.display(),
                        error = %err,
                        "Cannot bring the CDI spec up to date; the file on disk is kept"
                    );
                }
            }
        }
    };
    rescans.stop().await;
    outcome
}

/// Fails once the loaded kernel module is another driver than the one NVML was loaded for: a
/// driver upgrade leaves this process with the old library, whose rescans fail from then on,
/// so it ends and its restart (the kubelet's, systemd's) loads the new one and writes the new
/// driver's spec.
fn same_driver(args: &GenerateArgs, snapshot: &Snapshot) -> Result<(), Error> {
    let paths = host_paths(args);
    let path = paths.seen(&paths.proc_root).join("driver/nvidia/version");
    let Some((module, _open)) = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| nvrm_version(&text))
    else {
        return Ok(());
    };
    let loaded = &snapshot.node.driver_version;
    if loaded.is_empty() || *loaded == module {
        return Ok(());
    }
    Err(Error::Failure(format!(
        "{}: the kernel module is now driver {module}, NVML here is {loaded}; exiting so that \
         a restart loads the new driver's library and writes its spec",
        path.display()
    )))
}

/// The host's files the spec is made of, as the flags say.
fn host_paths(args: &GenerateArgs) -> HostPaths {
    HostPaths {
        host_root: args.host.host_root.clone(),
        driver_root: args.driver_root.clone(),
        dev_root: args
            .dev_root
            .clone()
            .unwrap_or_else(|| args.driver_root.clone()),
        proc_root: args
            .proc_root
            .clone()
            .unwrap_or_else(|| args.driver_root.join("proc")),
        hooks: discover::hook_candidates(args.nvidia_cdi_hook_path.as_deref()),
        nvml_dir: crate::nvml::library::loaded_dir(),
    }
}

/// The spec for `snapshot`, rendered in the format asked for.
fn generate(args: &GenerateArgs, snapshot: &Snapshot) -> Result<String, Error> {
    let paths = host_paths(args);
    let driver_version = snapshot.node.driver_version.as_str();
    let host = discover::discover(&paths, driver_version)
        .map_err(|err| Error::Failure(format!("cannot read the host's driver files: {err}")))?;
    let options = options(args);
    warn_about_host(&paths, &host, &options, driver_version);

    let generated = cdi::build(snapshot, &host, &options).map_err(|err| {
        Error::Failure(format!(
            "cannot build the CDI spec: {err} (--proc-root names the procfs to read)"
        ))
    })?;
    for line in &generated.skipped {
        tracing::warn!(device = %line, "Device left out of the CDI spec");
    }
    let to_file = (args.output.as_os_str() != "-").then_some(args.output.as_path());
    let format = output_format(args.format, to_file);
    let text = cdi::render::render(&generated.spec, format)
        .map_err(|err| Error::Failure(err.to_string()))?;
    tracing::debug!(
        kind = %generated.spec.kind,
        devices = generated.spec.devices.len(),
        "Built the CDI spec"
    );
    Ok(text)
}

/// Writes `text` atomically unless the file already holds exactly it: a rescan that finds
/// nothing new leaves the file (and its mtime, which runtimes may watch) alone.
fn write_if_changed(path: &Path, text: &str) -> Result<(), Error> {
    if std::fs::read(path).is_ok_and(|on_disk| on_disk == text.as_bytes()) {
        tracing::debug!(path = %path.display(), "The CDI spec is unchanged");
        return Ok(());
    }
    cdi::write::write_atomic(path, text).map_err(|err| Error::Failure(err.to_string()))?;
    tracing::info!(path = %path.display(), "Wrote the CDI spec");
    Ok(())
}

fn options(args: &GenerateArgs) -> Options {
    Options {
        // Both halves were checked while parsing.
        kind: Kind::new(&args.vendor, &args.class).unwrap_or_default(),
        name_strategies: args.device_name_strategy.clone(),
        all_device: !args.no_all_device,
        disabled_hooks: args.disable_hook.iter().copied().collect::<BTreeSet<_>>(),
        ldconfig_path: args.ldconfig_path.clone(),
    }
}

/// Says what is missing when the spec will be thinner than on a complete driver install.
fn warn_about_host(paths: &HostPaths, host: &cdi::HostFiles, options: &Options, version: &str) {
    if host.libraries.is_empty() {
        tracing::warn!(
            driver_root = %paths.driver_root.display(),
            driver_version = version,
            "No driver libraries of this version under the driver root; the spec mounts none"
        );
    }
    if host.hook.is_none() && !options.disabled_hooks.contains(&HookName::All) {
        let tried: Vec<String> = paths
            .hooks
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        tracing::warn!(
            tried = %tried.join(", "),
            "No CDI hook is an executable file; the spec has no hooks (gpud runtime install puts gpud's)"
        );
    }
}

/// `--format` wins; otherwise the extension; otherwise YAML. A clash is worth a warning.
fn output_format(asked: Option<Format>, path: Option<&Path>) -> Format {
    let implied = path.and_then(Format::from_path);
    match (asked, implied) {
        (Some(asked), Some(implied)) if asked != implied => {
            tracing::warn!(
                format = asked.as_str(),
                implied = implied.as_str(),
                "--format differs from the output file's extension; writing the requested format"
            );
            asked
        }
        (Some(asked), _) => asked,
        (None, Some(implied)) => implied,
        (None, None) => Format::Yaml,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_follows_flag_then_extension_then_yaml() {
        let json = Path::new("/var/run/cdi/k8s.json");
        assert_eq!(output_format(None, Some(json)), Format::Json);
        assert_eq!(output_format(Some(Format::Yaml), Some(json)), Format::Yaml);
        assert_eq!(output_format(None, Some(Path::new("spec"))), Format::Yaml);
        assert_eq!(output_format(Some(Format::Json), None), Format::Json);
        assert_eq!(output_format(None, None), Format::Yaml);
    }
}
