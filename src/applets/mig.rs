//! `gpud mig`: mig-parted's `apply`, `assert` and `export` with its flags and environment,
//! plus `plan`, which says what `apply` would do without doing it.
//!
//! Exit codes follow mig-parted: 0 done, 1 failed (an assertion that does not hold, an apply
//! step that failed); in gpud's scheme a bad config file or flag is 65 or 64, and a missing
//! driver 69.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args as ClapArgs, Parser, Subcommand, ValueEnum};

use crate::cli::{self, AdminArgs, ApiArgs, CommonArgs};
use crate::daemon::{Daemon, Error};
use crate::holdings::layout::{self, Owner, TakeError};
use crate::holdings::layout_lock::{self, LayoutLock};
use crate::mig::apply::{self, ApplyError, Options, Outcome};
use crate::mig::hooks::{FlagEnv, Hooks};
use crate::mig::reconcile::args::ReconcileArgs;
use crate::mig::{export, generate, plan};
use crate::mig_config::spec::{Entry, Spec};
use crate::mig_config::{self, assert, select};
use crate::nvml::mig_admin::{MigAdmin, MigGpu};
use crate::nvml::{NodeFacts, Rescanner};

/// Partition GPUs with MIG from mig-parted config files.
#[derive(Debug, Parser)]
#[command(name = "gpud mig", version)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply the selected config (idempotent: an applied config changes nothing).
    Apply(ApplyArgs),
    /// Exit 0 when the selected config is what the GPUs are now, 1 otherwise.
    Assert(AssertArgs),
    /// Print the GPUs' current layout as a mig-parted config.
    Export(ExportArgs),
    /// Print what apply would change on each GPU, touching nothing.
    Plan(PlanArgs),
    /// Print the all-* configs (all-disabled, all-enabled, one all-<profile> per profile at
    /// its maximum count) for the GPUs present, as a mig-parted config.
    GenerateConfig(GenerateArgs),
    /// Keep the GPUs at the config the Node's nvidia.com/mig.config label names, reporting
    /// nvidia.com/mig.config.state (a daemon, mig-manager's job).
    Reconcile(ReconcileCommand),
}

/// The config file and the label in it.
#[derive(Debug, ClapArgs)]
struct ConfigArgs {
    /// mig-parted config file; "-" reads stdin.
    #[arg(short = 'f', long, value_name = "PATH", env = "MIG_PARTED_CONFIG_FILE")]
    config_file: PathBuf,

    /// Config label to use; optional when the file has exactly one.
    #[arg(
        short = 'c',
        long,
        value_name = "LABEL",
        env = "MIG_PARTED_SELECTED_CONFIG"
    )]
    selected_config: Option<String>,

    /// Accepted for mig-parted compatibility: every step is logged at the default level
    /// already (GPUD_LOG=debug adds more).
    #[arg(short = 'd', long, env = "MIG_PARTED_DEBUG")]
    debug: bool,

    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, ClapArgs)]
struct ApplyArgs {
    #[command(flatten)]
    config: ConfigArgs,

    /// mig-parted hooks file (apply-start, pre-apply-mode, pre-apply-config, apply-exit).
    #[arg(short = 'k', long, value_name = "PATH", env = "MIG_PARTED_HOOKS_FILE")]
    hooks_file: Option<PathBuf>,

    /// Do not reset GPUs after a mode change; the change stays pending.
    #[arg(short = 's', long, env = "MIG_PARTED_SKIP_RESET")]
    skip_reset: bool,

    #[command(flatten)]
    mode: ModeOnly,

    /// Change GPUs even while compute processes use them.
    #[arg(long, env = "GPUD_MIG_FORCE")]
    force: bool,

    /// Command that resets GPUs; the comma-separated PCI bus ids are appended.
    #[arg(
        long,
        value_name = "COMMAND",
        default_value = "nvidia-smi -r -i",
        env = "GPUD_MIG_RESET_COMMAND"
    )]
    reset_command: String,

    /// How long a reset may take to bring a pending mode into effect.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    reset_wait: Duration,

    /// Where the layout owners' record and lock are (`--state-dir`): an apply never changes a
    /// GPU DRA dynamic MIG owns, and never runs while another layout change is under way.
    #[command(flatten)]
    state: cli::StateArgs,
}

#[derive(Debug, ClapArgs)]
struct AssertArgs {
    #[command(flatten)]
    config: ConfigArgs,

    #[command(flatten)]
    mode: ModeOnly,

    /// Only check that the file is valid and has the selected config (no GPU access).
    #[arg(short = 'a', long, env = "MIG_PARTED_VALID_CONFIG")]
    valid_config: bool,
}

/// mig-parted's `--mode-only`, for `apply` and `assert`.
#[derive(Debug, ClapArgs)]
struct ModeOnly {
    /// Only the MIG mode, not the instances: apply sets it alone, assert checks it alone.
    #[arg(short = 'm', long, env = "MIG_PARTED_MODE_CHANGE_ONLY")]
    mode_only: bool,
}

/// mig-parted's `--output-format`, for `export` and `generate-config`.
#[derive(Debug, ClapArgs)]
struct SpecFormat {
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Yaml, env = "MIG_PARTED_OUTPUT_FORMAT")]
    output_format: Format,
}

#[derive(Debug, ClapArgs)]
struct ExportArgs {
    /// Label of the exported config.
    #[arg(
        short = 'l',
        long,
        value_name = "LABEL",
        default_value = "current",
        env = "MIG_PARTED_CONFIG_LABEL"
    )]
    config_label: String,

    #[command(flatten)]
    format: SpecFormat,

    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, ClapArgs)]
struct GenerateArgs {
    #[command(flatten)]
    format: SpecFormat,

    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, ClapArgs)]
struct PlanArgs {
    #[command(flatten)]
    config: ConfigArgs,

    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = PlanFormat::Text)]
    output: PlanFormat,
}

#[derive(Debug, ClapArgs)]
struct ReconcileCommand {
    #[command(flatten)]
    reconcile: ReconcileArgs,

    /// The Node to follow.
    #[command(flatten)]
    node: cli::NodeNameArgs,

    #[command(flatten)]
    api: ApiArgs,

    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    admin: AdminArgs,

    #[command(flatten)]
    state: cli::StateArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Yaml,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum PlanFormat {
    Text,
    Json,
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> Result<ExitCode, Error> {
    let args: Args = cli::parse(argv)?;
    match args.command {
        Command::Apply(a) => run_apply(a),
        Command::Assert(a) => run_assert(a),
        Command::Export(a) => run_export(a),
        Command::Plan(a) => run_plan(a),
        Command::GenerateConfig(a) => run_generate(a),
        Command::Reconcile(a) => run_reconcile(a),
    }
}

/// The config's selected entries.
fn selected(config: &ConfigArgs) -> Result<(Spec, String), Error> {
    let spec = mig_config::load(&config.config_file).map_err(Error::config)?;
    let label = spec
        .select(config.selected_config.as_deref())
        .map_err(|why| Error::Config(format!("{}: {why}", config.config_file.display())))?
        .0
        .to_owned();
    Ok((spec, label))
}

fn entries<'a>(spec: &'a Spec, label: &str) -> &'a [Entry] {
    spec.mig_configs.get(label).map_or(&[], Vec::as_slice)
}

fn start(config: &ConfigArgs) -> Result<MigAdmin, Error> {
    Ok(config.common.start()?.mig_admin())
}

fn read_gpus(admin: &MigAdmin) -> Result<Vec<crate::nvml::mig_admin::MigGpu>, Error> {
    Ok(admin.gpus()?)
}

fn run_assert(args: AssertArgs) -> Result<ExitCode, Error> {
    let (spec, label) = selected(&args.config)?;
    if args.valid_config {
        return Ok(ExitCode::SUCCESS);
    }
    let admin = start(&args.config)?;
    let gpus = read_gpus(&admin)?;
    let targets = select::targets(entries(&spec, &label), &gpus);
    let scope = if args.mode.mode_only {
        assert::Scope::Mode
    } else {
        assert::Scope::Full
    };
    match assert::check(&gpus, &targets, scope) {
        Ok(()) => {
            eprintln!("Selected MIG configuration currently applied");
            Ok(ExitCode::SUCCESS)
        }
        Err(why) => Err(Error::Failure(format!(
            "assertion failure: selected configuration not currently applied ({why})"
        ))),
    }
}

fn run_export(args: ExportArgs) -> Result<ExitCode, Error> {
    let admin = args.common.start()?.mig_admin();
    let gpus = read_gpus(&admin)?;
    print_spec(
        &export::export(&gpus, &args.config_label),
        args.format.output_format,
    )
}

fn run_generate(args: GenerateArgs) -> Result<ExitCode, Error> {
    let admin = args.common.start()?.mig_admin();
    let gpus = read_gpus(&admin)?;
    print_spec(&generate::generate(&gpus), args.format.output_format)
}

/// Prints a config in mig-parted's YAML or JSON shape.
fn print_spec(spec: &Spec, format: Format) -> Result<ExitCode, Error> {
    let text = match format {
        Format::Yaml => serde_yaml_ng::to_string(spec)
            .map_err(|e| Error::Failure(format!("cannot render the config: {e}")))?,
        Format::Json => {
            let mut json = serde_json::to_string_pretty(spec)
                .map_err(|e| Error::Failure(format!("cannot render the config: {e}")))?;
            json.push('\n');
            json
        }
    };
    cli::print_stdout(&text, "the config")?;
    Ok(ExitCode::SUCCESS)
}

fn run_plan(args: PlanArgs) -> Result<ExitCode, Error> {
    let (spec, label) = selected(&args.config)?;
    let admin = start(&args.config)?;
    let gpus = read_gpus(&admin)?;
    let targets = select::targets(entries(&spec, &label), &gpus);
    let plans = apply::plans(&gpus, &targets).map_err(Error::Failure)?;
    let text = match args.output {
        PlanFormat::Text => plan::render(&plans),
        PlanFormat::Json => {
            let mut json = serde_json::to_string_pretty(&plans)
                .map_err(|e| Error::Failure(format!("cannot render the plan: {e}")))?;
            json.push('\n');
            json
        }
    };
    cli::print_stdout(&text, "the plan")?;
    Ok(ExitCode::SUCCESS)
}

fn run_apply(args: ApplyArgs) -> Result<ExitCode, Error> {
    let (spec, label) = selected(&args.config)?;
    let hooks = match &args.hooks_file {
        Some(path) => Hooks::load(path).map_err(Error::Config)?,
        None => Hooks::default(),
    };
    let admin = start(&args.config)?;
    let layouts = LayoutGuard::take(&args.state.state_dir, &spec, &read_gpus(&admin)?)?;
    let opts = Options {
        skip_reset: args.skip_reset,
        mode_only: args.mode.mode_only,
        force: args.force,
        reset_command: args
            .reset_command
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
        reset_wait: args.reset_wait,
        hook_env: FlagEnv {
            config_file: &args.config.config_file,
            selected_config: &label,
            hooks_file: args.hooks_file.as_deref(),
            skip_reset: args.skip_reset,
            mode_only: args.mode.mode_only,
            debug: args.config.debug,
        }
        .vars(),
    };
    let applied = apply::apply(&admin, entries(&spec, &label), &hooks, &opts);
    // Recording the layout is the running MIG manager's (its config's layout is what a reset
    // remakes); a one-shot apply only keeps out of the other writers' way.
    drop(layouts);
    match applied {
        Ok(Outcome::ResetPending(gpus)) => {
            let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
            eprintln!(
                "MIG mode change pending on GPU {} until a GPU reset (--skip-reset)",
                list.join(", ")
            );
            if args.mode.mode_only {
                Ok(ExitCode::SUCCESS)
            } else {
                Err(Error::Failure(
                    "MIG configuration not applied: the mode change waits for a GPU reset".into(),
                ))
            }
        }
        Ok(Outcome::AlreadyApplied | Outcome::Applied) => {
            eprintln!("MIG configuration applied successfully");
            Ok(ExitCode::SUCCESS)
        }
        Err(
            err @ (ApplyError::Refused(_) | ApplyError::RebootRequired(_) | ApplyError::Failed(_)),
        ) => Err(Error::Failure(err.to_string())),
    }
}

fn run_reconcile(args: ReconcileCommand) -> Result<ExitCode, Error> {
    if args.reconcile.config.mig_config_file.is_none() {
        return Err(Error::Usage(
            "gpud mig reconcile needs --mig-config-file (or GPUD_MIG_CONFIG_FILE)".into(),
        ));
    }
    args.reconcile.validate(args.node.node_name.as_deref())?;
    super::set_pace(&args.api.client);
    let nvml = args.common.start()?;
    let facts = NodeFacts {
        node_name: args.node.node_name.clone(),
        machine_type_file: None,
    };
    // The rescanner only feeds this process's inventory; it is not run on a timer here.
    let rescanner = Rescanner::new(nvml.clone(), facts, Duration::from_secs(3600));
    let inventory = rescanner.discover()?;
    let Some(mut reconciler) = args.reconcile.reconciler(
        args.node.node_name.as_deref(),
        args.api.client.kubeconfig(),
        args.api.api_unready_after,
        &args.state,
        &nvml,
        rescanner,
    )?
    else {
        return Ok(ExitCode::SUCCESS);
    };
    if let Some(config_file) = &args.reconcile.config.mig_config_file {
        let gpus = read_gpus(&nvml.mig_admin())?;
        reconciler.layout_dir = take_layouts(&args.state.state_dir, config_file, &gpus)?;
    }
    let mut daemon = Daemon::fixed("mig-reconcile");
    // Two reconcilers side by side (a DaemonSet's surge) would repartition the same GPUs at
    // once: the new one takes over, and acts only once the old one has finished.
    daemon.hand_over(&args.state.state_dir);
    daemon.add_fixed(reconciler);
    daemon.serve_admin(&args.admin.address(super::admin_port("mig reconcile")));
    daemon.run(inventory)
}

/// A one-shot apply's place among the layout owners: checked as the MIG manager's against the
/// record (a GPU a running DRA dynamic MIG owns is refused, exit 64) and the node's layout lock
/// held until dropped. Without a state directory it locks this process only.
struct LayoutGuard {
    _lock: LayoutLock,
}

impl LayoutGuard {
    fn take(state_dir: &str, spec: &Spec, gpus: &[MigGpu]) -> Result<Self, Error> {
        let dir = (!state_dir.is_empty()).then(|| PathBuf::from(state_dir));
        if let Some(dir) = &dir {
            layout::check(dir, Owner::MigManager, &select::covered(spec, gpus))
                .map_err(TakeError::into_error)?;
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Failure(format!("cannot wait for the MIG layout lock: {e}")))?;
        let lock = runtime
            .block_on(layout_lock::lock(dir.as_deref(), "gpud mig apply"))
            .map_err(Error::Failure)?;
        Ok(LayoutGuard { _lock: lock })
    }
}

/// Takes the GPUs of `gpus` that the MIG config file covers as the MIG manager's in the
/// layout owners' record of `state_dir` (refused, exit 64, while DRA dynamic MIG runs with
/// one of them); the folder the reconciler then records its layouts and locks changes in,
/// `None` when gpud keeps no state.
pub(super) fn take_layouts(
    state_dir: &str,
    config_file: &Path,
    gpus: &[MigGpu],
) -> Result<Option<PathBuf>, Error> {
    if state_dir.is_empty() {
        return Ok(None);
    }
    let dir = PathBuf::from(state_dir);
    let spec = mig_config::load(config_file).map_err(Error::config)?;
    let covered = select::covered(&spec, gpus);
    layout::take(&dir, Owner::MigManager, &covered, None).map_err(TakeError::into_error)?;
    Ok(Some(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconcile_takes_the_shared_node_name_and_state_dir() {
        let args = Args::try_parse_from([
            "gpud mig",
            "reconcile",
            "--node-name",
            "n1",
            "--state-dir",
            "/srv/gpud",
        ])
        .unwrap();
        let Command::Reconcile(reconcile) = args.command else {
            panic!("not reconcile: {:?}", args.command);
        };
        assert_eq!(reconcile.node.get(), Some("n1"));
        assert_eq!(
            reconcile.reconcile.state_dir(&reconcile.state),
            std::path::Path::new("/srv/gpud/mig")
        );
    }
}
