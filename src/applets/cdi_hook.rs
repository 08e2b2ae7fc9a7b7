//! `gpud cdi-hook`: the OCI hook a CDI spec's `createContainer` hooks run, with the
//! subcommands and flags of NVIDIA's `nvidia-cdi-hook` (a link of that name runs it too).
//!
//! A thin shell over [`crate::cdi_hook`]: parse, find the container root from the state on
//! stdin, do the one job. A failure is one line and exit 1, which makes the runtime fail the
//! container's start.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgAction, Parser, Subcommand};

use crate::cdi_hook::cuda_compat;
use crate::cdi_hook::device_nodes::{self, Params};
use crate::cdi_hook::symlinks::{self, Link};
use crate::cdi_hook::{HookError, Root, chmod, ldcache, sandbox, state};
use crate::cli;
use crate::daemon::Error;

/// Prepare a container for its GPUs: the hooks a CDI spec runs at createContainer (the OCI
/// state on stdin names the container), as NVIDIA's nvidia-cdi-hook.
#[derive(Debug, Parser)]
#[command(name = "gpud cdi-hook", version, subcommand_required = true)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create symlinks inside the container.
    CreateSymlinks(CreateSymlinksArgs),
    /// Put the image's CUDA compat libraries first in its linker config when they are newer
    /// than the host's driver.
    EnableCudaCompat(EnableCudaCompatArgs),
    /// Add the mounted driver folders to the container's linker cache with the host's ldconfig.
    UpdateLdcache(UpdateLdcacheArgs),
    /// Mount driver parameters saying ModifyDeviceFiles: 0 over the container's
    /// /proc/driver/nvidia/params.
    DisableDeviceNodeModification(DisableDeviceNodeModificationArgs),
    /// Change the mode of files inside the container (a symlink is refused, never followed).
    Chmod(ChmodArgs),
    /// update-ldcache's own child: runs ldconfig with the container root as its root.
    #[command(name = "ldconfig-sandbox", hide = true)]
    LdconfigSandbox(LdconfigSandboxArgs),
}

/// Where the container state comes from; every subcommand takes it.
#[derive(Debug, clap::Args)]
struct ContainerArgs {
    /// File holding the OCI container state (or the bundle's config.json) instead of stdin
    /// ("-" is stdin).
    #[arg(long, value_name = "PATH")]
    container_spec: Option<PathBuf>,
}

impl ContainerArgs {
    fn root(&self) -> Result<Root, HookError> {
        let path = state::container_root(self.container_spec.as_deref(), &mut std::io::stdin())?;
        Root::open(&path)
    }
}

#[derive(Debug, clap::Args)]
struct CreateSymlinksArgs {
    /// A link to make, TARGET::LINK (LINK absolute in the container); repeat for several.
    #[arg(long, value_name = "TARGET::LINK", action = ArgAction::Append,
          value_parser = symlinks::parse_link)]
    link: Vec<Link>,

    #[command(flatten)]
    container: ContainerArgs,
}

#[derive(Debug, clap::Args)]
struct EnableCudaCompatArgs {
    /// The host's driver version; compat libraries with a higher major are enabled.
    #[arg(long, value_name = "VERSION")]
    host_driver_version: Option<String>,

    #[command(flatten)]
    container: ContainerArgs,
}

#[derive(Debug, clap::Args)]
struct UpdateLdcacheArgs {
    /// A folder inside the container to add to the linker cache; repeat for several.
    #[arg(long, value_name = "DIR", action = ArgAction::Append)]
    folder: Vec<String>,

    /// The host's ldconfig, a static program, run with the container root as its root ("@"
    /// before the path is accepted; a script beside a static `<path>.real` runs that one).
    #[arg(long, value_name = "PATH", default_value = ldcache::DEFAULT_LDCONFIG)]
    ldconfig_path: String,

    /// How long ldconfig may take before it is ended and the container's start fails.
    #[arg(long, value_name = "DURATION", default_value = "20s",
          value_parser = crate::values::positive_duration)]
    timeout: std::time::Duration,

    #[command(flatten)]
    container: ContainerArgs,
}

#[derive(Debug, clap::Args)]
struct LdconfigSandboxArgs {
    /// The container root on the host.
    #[arg(long, value_name = "DIR")]
    root: PathBuf,

    /// The host's ldconfig.
    #[arg(long, value_name = "PATH")]
    ldconfig_path: PathBuf,

    /// A folder inside the container; repeat for several.
    #[arg(long, value_name = "DIR", action = ArgAction::Append)]
    folder: Vec<String>,
}

#[derive(Debug, clap::Args)]
struct DisableDeviceNodeModificationArgs {
    /// The host's driver parameters (tests point it at a file of their own).
    #[arg(long, value_name = "PATH", default_value = device_nodes::PARAMS, hide = true)]
    driver_params: PathBuf,

    #[command(flatten)]
    container: ContainerArgs,
}

#[derive(Debug, clap::Args)]
struct ChmodArgs {
    /// The mode to set, in octal (755).
    #[arg(long, value_name = "MODE", value_parser = chmod::parse_mode)]
    mode: u32,

    /// A path inside the container; repeat for several (missing ones are skipped).
    #[arg(long, value_name = "PATH", action = ArgAction::Append)]
    path: Vec<PathBuf>,

    #[command(flatten)]
    container: ContainerArgs,
}

/// Entry point.
pub fn main(argv: Vec<OsString>) -> Result<ExitCode, Error> {
    let args: Args = cli::parse(argv)?;
    run(args.command).map_err(|err| Error::Failure(format!("cdi-hook: {err}")))?;
    Ok(ExitCode::SUCCESS)
}

fn run(command: Command) -> Result<(), HookError> {
    match command {
        Command::CreateSymlinks(args) => {
            symlinks::create(&args.container.root()?, &args.link)?;
        }
        Command::EnableCudaCompat(args) => {
            let root = args.container.root()?;
            // As NVIDIA's hook: without a host version there is nothing to compare with.
            if let Some(host_major) = args
                .host_driver_version
                .as_deref()
                .and_then(cuda_compat::major)
            {
                cuda_compat::enable(&root, host_major)?;
            }
        }
        Command::UpdateLdcache(args) => {
            let ldconfig = ldcache::ldconfig_path(&args.ldconfig_path);
            ldcache::update(
                &args.container.root()?,
                &ldconfig,
                &args.folder,
                args.timeout,
            )?;
        }
        Command::DisableDeviceNodeModification(args) => {
            let root = args.container.root()?;
            if device_nodes::disable(&root, &args.driver_params)? == Params::HostNamespace {
                eprintln!(
                    "gpud cdi-hook: not masking {} of {}: the hook runs in the host's mount \
                     namespace (run it as a createContainer hook)",
                    device_nodes::PARAMS,
                    root.path().display()
                );
            }
        }
        Command::Chmod(args) => {
            chmod::apply(&args.container.root()?, args.mode, &args.path)?;
        }
        Command::LdconfigSandbox(args) => {
            let Err(err) = sandbox::exec_ldconfig(&args.root, &args.ldconfig_path, &args.folder);
            return Err(err);
        }
    }
    Ok(())
}
