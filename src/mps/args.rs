//! The MPS control daemons' command line, shared by `gpud mps-control-daemon`, `gpud run`
//! and (for the per-claim daemons) `gpud dra`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::service::Options;

/// How gpud runs the MPS control daemons.
#[derive(Debug, Clone, Args)]
pub struct MpsArgs {
    /// The MPS control binary: a path, or a name looked up on PATH.
    #[arg(
        long,
        value_name = "PATH",
        env = "GPUD_MPS_CONTROL_BINARY",
        default_value = "nvidia-cuda-mps-control"
    )]
    pub mps_control_binary: PathBuf,

    /// Do not mount the shared-memory tmpfs on <mpsRoot>/shm (mounting needs CAP_SYS_ADMIN);
    /// for hosts that prepare it otherwise, and unprivileged tests.
    #[arg(long, env = "GPUD_MPS_SKIP_SHM_MOUNT", value_name = "BOOL", default_value = "false",
          action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = crate::nvidia_config::parse_bool)]
    pub mps_skip_shm_mount: bool,

    /// How often each MPS control daemon is probed (get_default_active_thread_percentage); a
    /// daemon that does not answer is restarted.
    #[arg(long, value_name = "DURATION", env = "GPUD_MPS_PROBE_INTERVAL", default_value = "5s",
          value_parser = crate::values::positive_duration)]
    pub mps_probe_interval: Duration,
}

impl MpsArgs {
    /// How daemons are run, for the DRA plugin's per-claim daemons.
    pub fn launch(&self) -> crate::cuda_mps::server::Launch {
        crate::cuda_mps::server::Launch {
            binary: on_path(&self.mps_control_binary),
            skip_shm_mount: self.mps_skip_shm_mount,
            probe_interval: self.mps_probe_interval,
        }
    }

    /// The subsystem's options; `events` names the Node and kubeconfig for restart events.
    pub fn options(&self, events: Option<(String, Option<PathBuf>)>) -> Options {
        Options {
            binary: on_path(&self.mps_control_binary),
            skip_shm_mount: self.mps_skip_shm_mount,
            probe_interval: self.mps_probe_interval,
            events,
        }
    }
}

/// `binary` as given when it names a path, else the first executable of that name on gpud's
/// PATH: the daemons run with a cleared environment (NVIDIA's), where no PATH lookup happens.
/// A name not found stays as it is, and starting the daemon says so.
// The search path is configuration, read once here.
#[allow(clippy::disallowed_methods)]
fn on_path(binary: &Path) -> PathBuf {
    if binary.components().count() > 1 {
        return binary.to_path_buf();
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(binary))
        .find(|candidate| is_executable(candidate))
        .unwrap_or_else(|| binary.to_path_buf())
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
