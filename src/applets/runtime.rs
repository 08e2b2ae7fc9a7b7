//! `gpud runtime configure`: turns on CDI and adds the NVIDIA runtime in containerd's, CRI-O's
//! or Docker's config, a drop-in for `nvidia-ctk runtime configure` (same flag names and
//! defaults; docs/toolkit.md says where gpud differs), then tells the runtime.
//! `gpud runtime install` / `uninstall`: this binary and its `nvidia-cdi-hook` link in the
//! host folder CDI specs name ([`crate::runtime_config::install`]).
//!
//! A thin shell over [`crate::runtime_config`]: flags become a request, the file's text is
//! edited there, written with a backup (or printed with `--dry-run`), and the runtime is
//! restarted or signalled as `--restart-mode` says. Nothing is written when any step before
//! the write fails.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{ArgAction, Parser, Subcommand};

use crate::cli;
use crate::daemon::Error;
use crate::runtime_config::install;
use crate::runtime_config::record::{self, SideFiles};
use crate::runtime_config::restart::{self, Host, RestartError, RestartMode};
use crate::runtime_config::{
    self, Edited, NvidiaRuntime, Request, Runtime, containerd, crio, docker, lock, resolve, write,
};

/// The NVIDIA runtime's executable for containerd and CRI-O (an absolute path there).
const DEFAULT_RUNTIME_PATH: &str = "/usr/bin/nvidia-container-runtime";

/// The NVIDIA runtime's executable for Docker (looked up in dockerd's PATH).
const DEFAULT_DOCKER_RUNTIME_PATH: &str = "nvidia-container-runtime";

/// Configure container runtimes for GPUs.
#[derive(Debug, Parser)]
#[command(name = "gpud runtime", version, subcommand_required = true)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Turn on CDI and add the NVIDIA runtime in containerd's, CRI-O's or Docker's config,
    /// keeping everything else in the file; then restart or signal the runtime if asked.
    Configure(Box<ConfigureArgs>),
    /// Copy this gpud into a host folder with the link nvidia-cdi-hook -> gpud, the hook CDI
    /// specs name by default; the same binary again writes nothing.
    Install(ToolkitArgs),
    /// Remove what install put in the folder (the folder too when that empties it).
    Uninstall(ToolkitArgs),
}

#[derive(Debug, clap::Args)]
struct ToolkitArgs {
    /// The host folder gpud and its hook link go to.
    #[arg(long, value_name = "DIR", default_value = install::DEFAULT_TOOLKIT_DIR)]
    toolkit_dir: PathBuf,

    #[command(flatten)]
    check: cli::CheckArgs,
}

#[derive(Debug, clap::Args)]
struct ConfigureArgs {
    /// The container runtime to configure.
    #[arg(long, value_enum, default_value_t = Runtime::Docker)]
    runtime: Runtime,

    /// The runtime's config file [default: /etc/containerd/config.toml for containerd,
    /// /etc/docker/daemon.json for docker; crio's is not edited, see --drop-in-config].
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,

    /// crio only: the drop-in file gpud writes its settings to [default:
    /// /etc/crio/crio.conf.d/99-gpud.conf].
    #[arg(long, value_name = "PATH")]
    drop_in_config: Option<PathBuf>,

    /// containerd only: the config version of a file that does not exist yet (2: containerd
    /// 1.x, 3: containerd 2.x) [default: from `containerd --version`, else 2].
    #[arg(long, value_name = "VERSION", value_parser = clap::value_parser!(i64).range(2..=3))]
    config_version: Option<i64>,

    /// Turn CDI on (containerd's enable_cdi, Docker's features.cdi; CRI-O always has it on).
    #[arg(long = "enable-cdi", visible_aliases = ["cdi.enabled", "cdi.enable"])]
    enable_cdi: bool,

    /// Folders the runtime reads CDI specs from; repeat or comma-separate [default: the
    /// runtime's own, /etc/cdi and /var/run/cdi].
    #[arg(long, value_name = "DIR", value_delimiter = ',', action = ArgAction::Append)]
    cdi_spec_dirs: Vec<String>,

    /// Name of the NVIDIA runtime entry.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "nvidia",
        visible_alias = "runtime-name"
    )]
    nvidia_runtime_name: String,

    /// The NVIDIA runtime's executable; giving it adds the runtime entry [default:
    /// /usr/bin/nvidia-container-runtime, for docker nvidia-container-runtime].
    #[arg(long, value_name = "PATH", visible_alias = "runtime-path")]
    nvidia_runtime_path: Option<String>,

    /// Make the NVIDIA runtime the default runtime (adds the entry).
    #[arg(long, visible_alias = "set-as-default")]
    nvidia_set_as_default: bool,

    /// Print the new file to stdout and write nothing.
    #[arg(long)]
    dry_run: bool,

    /// Undo what gpud added: the backup comes back when the file is unchanged since, else
    /// only the keys gpud sets (CDI, the runtime entry by --nvidia-runtime-name, the default
    /// runtime) go back to their values before gpud's first edit.
    #[arg(long)]
    revert: bool,

    /// How the runtime is told once the file changed: systemd (systemctl restart), signal
    /// (SIGHUP; docker and crio only) or none.
    #[arg(long, value_enum, default_value_t = RestartMode::None)]
    restart_mode: RestartMode,

    /// The systemd unit --restart-mode=systemd restarts [default: containerd, crio or docker].
    #[arg(long, value_name = "UNIT")]
    restart_unit: Option<String>,

    /// Where --restart-mode=signal looks for the daemon's process.
    #[arg(long, value_name = "PATH", default_value = "/proc", hide = true)]
    proc_root: PathBuf,

    /// Where this process sees the host's root: config paths resolve inside it, and
    /// --restart-mode=systemd enters it (chroot) to run the host's systemctl.
    #[command(flatten)]
    host: cli::HostRootArgs,

    #[command(flatten)]
    check: cli::CheckArgs,
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> Result<ExitCode, Error> {
    let args: Args = cli::parse(argv)?;
    match args.command {
        Command::Configure(configure) => run_configure(&configure)?,
        Command::Install(toolkit) => run_install(&toolkit)?,
        Command::Uninstall(toolkit) => run_uninstall(&toolkit)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// With `--check-config`, ends here with exit 0: the flags parsed, nothing was touched.
fn stop_if_checking(check: &cli::CheckArgs) -> Result<(), Error> {
    check.stop_if_checking("the command line is")
}

fn run_install(args: &ToolkitArgs) -> Result<(), Error> {
    stop_if_checking(&args.check)?;
    let source = std::env::current_exe()
        .map_err(|err| Error::Failure(format!("cannot find this gpud's own binary: {err}")))?;
    let installed = install::install(&source, &args.toolkit_dir)
        .map_err(|err| Error::CantCreate(err.to_string()))?;
    if installed.changed {
        eprintln!(
            "gpud: installed {} and its hook {} -> {}",
            installed.binary.display(),
            installed.hook.display(),
            install::BINARY
        );
    } else {
        eprintln!(
            "gpud: {} is this gpud already, nothing to change",
            installed.binary.display()
        );
    }
    Ok(())
}

fn run_uninstall(args: &ToolkitArgs) -> Result<(), Error> {
    stop_if_checking(&args.check)?;
    let removed =
        install::uninstall(&args.toolkit_dir).map_err(|err| Error::CantCreate(err.to_string()))?;
    if removed.is_empty() {
        eprintln!(
            "gpud: nothing of gpud's in {}, nothing to remove",
            args.toolkit_dir.display()
        );
    }
    for path in removed {
        eprintln!("gpud: removed {}", path.display());
    }
    Ok(())
}

fn run_configure(args: &ConfigureArgs) -> Result<(), Error> {
    let runtime = args.runtime;
    let unit = args
        .restart_unit
        .clone()
        .unwrap_or_else(|| restart::default_unit(runtime).to_owned());
    restart::check(runtime, args.restart_mode, &unit).map_err(|e| Error::Usage(e.to_string()))?;
    let given = target(args)?;
    stop_if_checking(&args.check)?;
    let file = resolve::resolve(&given, &args.host.host_root).map_err(failure)?;
    if file.is_link() {
        eprintln!(
            "gpud: {} is a symlink: editing the file it points to, {}",
            given.display(),
            file.real.display()
        );
    }
    let path = file.real.as_path();
    let side = SideFiles::of(runtime, path);
    // The lock is held from the read to the restart. A dry run writes nothing and takes none;
    // nor does a revert where the folder is missing (there is nothing to revert).
    let folder_missing = path
        .parent()
        .is_some_and(|folder| !folder.as_os_str().is_empty() && !folder.is_dir());
    let held = if args.dry_run || (args.revert && folder_missing) {
        None
    } else {
        if !args.revert {
            write::make_folder(path).map_err(failure)?;
        }
        Some(lock::lock_folder_of(path).map_err(failure)?)
    };
    if held.is_some() {
        write::remove_leftovers(path);
    }
    let text = write::read(path).map_err(failure)?;
    let pending = side.pending.exists();
    let changed = if args.revert {
        revert(args, path, &side, text.as_deref())?
    } else {
        configure(args, path, &side, text.as_deref(), pending)?
    };
    if args.dry_run || !(changed || pending) {
        return Ok(());
    }
    if pending && !changed {
        eprintln!(
            "gpud: {}: {} has not been told of gpud's last change yet (its restart failed)",
            path.display(),
            runtime.name()
        );
    }
    let host = Host {
        root: &args.host.host_root,
        proc_root: &args.proc_root,
    };
    // Opened before the restart, which may enter the host's root.
    let marker = write::LaterRemoval::of(&side.pending).map_err(failure)?;
    match restart::restart(runtime, args.restart_mode, &unit, host) {
        Ok(Some(done)) => {
            marker
                .remove("remove the pending-restart marker")
                .map_err(failure)?;
            eprintln!("gpud: {done}");
        }
        Ok(None) => eprintln!(
            "gpud: restart {} to apply it (or run again with --restart-mode)",
            runtime.name()
        ),
        Err(RestartError::Refused(why) | RestartError::Failed(why)) => {
            return Err(Error::Failure(format!(
                "{} is written, but {why}; the next gpud runtime configure restarts it again (marker {})",
                path.display(),
                side.pending.display()
            )));
        }
    }
    Ok(())
}

/// The file gpud edits: crio's drop-in, else the runtime's config.
fn target(args: &ConfigureArgs) -> Result<PathBuf, Error> {
    match args.runtime {
        Runtime::Crio => {
            if let Some(config) = &args.config {
                eprintln!(
                    "gpud: warning: {} is not edited for crio; gpud writes its drop-in (--drop-in-config)",
                    config.display()
                );
            }
            Ok(args
                .drop_in_config
                .clone()
                .unwrap_or_else(|| PathBuf::from(crio::DEFAULT_DROP_IN)))
        }
        Runtime::Containerd | Runtime::Docker if args.drop_in_config.is_some() => {
            Err(Error::Usage(format!(
                "--drop-in-config is for crio only: gpud edits {}'s --config in place",
                args.runtime.name()
            )))
        }
        Runtime::Containerd => Ok(args
            .config
            .clone()
            .unwrap_or_else(|| PathBuf::from(containerd::DEFAULT_CONFIG))),
        Runtime::Docker => Ok(args
            .config
            .clone()
            .unwrap_or_else(|| PathBuf::from(docker::DEFAULT_CONFIG))),
    }
}

/// What the flags ask for. The runtime entry is added when its path or `--set-as-default` is
/// given, or when nothing about CDI is (a bare `configure` adds it, as nvidia-ctk's does);
/// CDI alone needs no entry.
fn request(args: &ConfigureArgs) -> Request {
    let cdi_only = args.enable_cdi || !args.cdi_spec_dirs.is_empty();
    let wants_entry = args.nvidia_runtime_path.is_some() || args.nvidia_set_as_default || !cdi_only;
    let default_path = match args.runtime {
        Runtime::Docker => DEFAULT_DOCKER_RUNTIME_PATH,
        Runtime::Containerd | Runtime::Crio => DEFAULT_RUNTIME_PATH,
    };
    Request {
        enable_cdi: args.enable_cdi,
        cdi_spec_dirs: args.cdi_spec_dirs.clone(),
        runtime: wants_entry.then(|| NvidiaRuntime {
            name: args.nvidia_runtime_name.clone(),
            path: args
                .nvidia_runtime_path
                .clone()
                .unwrap_or_else(|| default_path.to_owned()),
        }),
        set_as_default: args.nvidia_set_as_default,
    }
}

/// Edits (or prints) the file; whether it changed. The record of what gpud changed and the
/// pending-restart marker are written before the file (see [`record`]).
fn configure(
    args: &ConfigureArgs,
    path: &Path,
    side: &SideFiles,
    text: Option<&str>,
    pending: bool,
) -> Result<bool, Error> {
    if args.runtime == Runtime::Crio && args.enable_cdi {
        eprintln!(
            "gpud: CRI-O reads CDI specs without a switch (1.23 and later): --enable-cdi adds nothing for crio"
        );
    }
    let new_version = match (args.runtime, text) {
        (Runtime::Containerd, None) => args
            .config_version
            .or_else(containerd::installed_config_version)
            .unwrap_or(2),
        _ => 2,
    };
    let (new, changes) =
        runtime_config::configure(args.runtime, path, text, &request(args), new_version)
            .map_err(failure)?;
    if args.runtime == Runtime::Containerd {
        for line in containerd::shadowing_imports(path, &new, &args.nvidia_runtime_name) {
            eprintln!("gpud: warning: {line}");
        }
    }
    let unchanged = text.map_or(new.is_empty(), |old| old == new);
    if args.dry_run {
        cli::print_stdout(&new, "the new config")?;
    }
    if unchanged {
        if !pending {
            eprintln!(
                "gpud: {}: already configured, nothing to change",
                path.display()
            );
        }
        return Ok(false);
    }
    if args.dry_run {
        return Ok(true);
    }
    let mut kept = record::load(&side.record)
        .map_err(failure)?
        .unwrap_or_default();
    if text.is_none() && kept.changes.is_empty() {
        kept.created = true;
    }
    kept.merge(changes);
    record::store(&side.record, &kept).map_err(failure)?;
    if args.restart_mode != RestartMode::None {
        write::put_own(&side.pending, &format!("{}\n", args.runtime.name())).map_err(failure)?;
    }
    write::put(path, &side.backup, text, &new).map_err(failure)?;
    match text {
        Some(_) => eprintln!(
            "gpud: {}: configured for {} (the file before gpud is kept in {})",
            path.display(),
            args.runtime.name(),
            side.backup.display()
        ),
        None => eprintln!(
            "gpud: {}: created for {}",
            path.display(),
            args.runtime.name()
        ),
    }
    Ok(true)
}

/// Takes back what gpud recorded it changed (or prints the result); whether the file changed.
fn revert(
    args: &ConfigureArgs,
    path: &Path,
    side: &SideFiles,
    text: Option<&str>,
) -> Result<bool, Error> {
    let Some(text) = text else {
        eprintln!(
            "gpud: {}: does not exist, nothing to revert",
            path.display()
        );
        return Ok(false);
    };
    let backup = write::read(&side.backup).map_err(failure)?;
    let Some(mut kept) = record::load(&side.record).map_err(failure)? else {
        return match backup {
            Some(backup) => revert_from_backup(args, path, side, text, &backup),
            None => {
                eprintln!(
                    "gpud: {}: gpud has changed nothing in it (no record {}), nothing to revert",
                    path.display(),
                    side.record.display()
                );
                Ok(false)
            }
        };
    };
    let owned = runtime_config::owned(args.runtime, path, text, &args.nvidia_runtime_name)
        .map_err(failure)?;
    let (ours, others): (Vec<_>, Vec<_>) = kept
        .changes
        .drain(..)
        .partition(|c| owned.iter().any(|key| c.key.starts_with(key)));
    kept.changes = others;
    let (edited, skipped) = runtime_config::revert_recorded(
        args.runtime,
        path,
        text,
        &ours,
        backup.as_deref(),
        kept.created && kept.changes.is_empty(),
    )
    .map_err(failure)?;
    for change in &skipped {
        eprintln!(
            "gpud: {}: {} was changed since gpud set it ({} now); left as it is",
            path.display(),
            change.key.join("."),
            change.set
        );
    }
    let reverted = match &edited {
        Edited::Text(new) if new == text => None,
        Edited::Text(new) => Some(Some(new.as_str())),
        Edited::Remove => Some(None),
    };
    if args.dry_run {
        match reverted {
            Some(Some(new)) => cli::print_stdout(new, "the reverted config")?,
            None => cli::print_stdout(text, "the reverted config")?,
            Some(None) => eprintln!(
                "gpud: {}: would be removed (gpud created it)",
                path.display()
            ),
        }
        return Ok(reverted.is_some());
    }
    if args.restart_mode != RestartMode::None && reverted.is_some() {
        write::put_own(&side.pending, &format!("{}\n", args.runtime.name())).map_err(failure)?;
    }
    match reverted {
        Some(Some(new)) => {
            write::put(path, &side.backup, None, new).map_err(failure)?;
            eprintln!("gpud: {}: reverted", path.display());
        }
        Some(None) => {
            write::remove(path, "remove the file gpud created").map_err(failure)?;
            eprintln!("gpud: {}: removed (gpud created it)", path.display());
        }
        None => eprintln!(
            "gpud: {}: nothing of gpud's left in it, nothing to revert",
            path.display()
        ),
    }
    // The backup goes only once nothing of gpud's is left and the file is the backup again
    // (or gone, gpud having created it): otherwise it is the only copy of the file before gpud.
    let back_to_backup = match (&edited, &backup) {
        (Edited::Remove, _) => true,
        (Edited::Text(new), Some(old)) => new == old,
        (Edited::Text(_), None) => false,
    };
    let drop_backup = kept.changes.is_empty() && back_to_backup;
    kept.backup_kept = backup.is_some() && !drop_backup;
    // Once nothing of gpud's is left, the file is no longer one gpud created.
    kept.created &= !kept.changes.is_empty();
    record::store(&side.record, &kept).map_err(failure)?;
    if drop_backup {
        write::remove(&side.backup, "remove the backup").map_err(failure)?;
    } else if backup.is_some() {
        eprintln!(
            "gpud: the file before gpud stays in {}",
            side.backup.display()
        );
    }
    Ok(reverted.is_some())
}

/// Revert of a file a gpud without records configured: the backup is the file before gpud.
fn revert_from_backup(
    args: &ConfigureArgs,
    path: &Path,
    side: &SideFiles,
    text: &str,
    backup: &str,
) -> Result<bool, Error> {
    let edited = runtime_config::revert(
        args.runtime,
        path,
        text,
        Some(backup),
        &args.nvidia_runtime_name,
    )
    .map_err(failure)?;
    let new = match edited {
        Edited::Text(new) => new,
        // Only a file gpud created (no backup) is ever removed.
        Edited::Remove => String::new(),
    };
    if args.dry_run {
        cli::print_stdout(&new, "the reverted config")?;
        return Ok(new != text);
    }
    if new != text {
        if args.restart_mode != RestartMode::None {
            write::put_own(&side.pending, &format!("{}\n", args.runtime.name()))
                .map_err(failure)?;
        }
        write::put(path, &side.backup, None, &new).map_err(failure)?;
        eprintln!("gpud: {}: reverted", path.display());
    } else {
        eprintln!(
            "gpud: {}: nothing of gpud's in it, nothing to revert",
            path.display()
        );
    }
    write::remove(&side.backup, "remove the backup").map_err(failure)?;
    Ok(new != text)
}

/// A config that does not validate is 65; a file or folder that cannot be written, 73.
fn failure(err: runtime_config::Error) -> Error {
    if err.is_data() {
        Error::Config(err.to_string())
    } else if matches!(err, runtime_config::Error::Write(_)) {
        Error::CantCreate(err.to_string())
    } else {
        Error::Failure(err.to_string())
    }
}
