//! The DRA plugin's command line: driver name, the kubelet's folders, where CDI specs go, the
//! host paths the specs describe, and the kubelet's pod-resources socket (to see what the
//! device plugin handed out). The same flags serve `gpud dra` and `gpud run --dra`; claims'
//! MPS control daemons take the MPS subsystem's `--mps-*` flags.

use std::path::PathBuf;

use clap::Args;

use crate::cdi::discover::HostPaths;
use crate::cuda_mps::server::Launch;
use crate::dns_name;

/// NVIDIA's DRA driver name for GPUs and MIG devices.
pub const DEFAULT_DRIVER: &str = crate::dra_names::DEFAULT_DRIVER;
/// Where the kubelet looks for plugin registration sockets.
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Where DRA plugins keep their sockets and state (`<dir>/<driver>/`).
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// The kubelet's pod-resources socket.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = crate::holdings::pod_resources::DEFAULT_SOCKET;
/// Where the per-claim CDI specs are written (the folder NVIDIA's chart mounts).
pub const DEFAULT_CDI_ROOT: &str = "/var/run/cdi";

/// The DRA kubelet plugin's options.
#[derive(Debug, Clone, Args)]
pub struct DraArgs {
    /// The DRA driver name: in ResourceSlices, DeviceClasses, claims and taint keys.
    #[arg(long = "dra-driver-name", value_name = "NAME", env = "GPUD_DRA_DRIVER_NAME",
          default_value = DEFAULT_DRIVER)]
    pub dra_driver_name: String,

    /// The kubelet's plugin registration folder (plugins_registry).
    #[arg(long = "dra-registry-dir", value_name = "DIR", env = "GPUD_DRA_REGISTRY_DIR",
          default_value = DEFAULT_REGISTRY_DIR)]
    pub dra_registry_dir: PathBuf,

    /// The kubelet's plugins folder; the plugin socket, checkpoint and lock go in
    /// <dir>/<driver>/.
    #[arg(long = "dra-plugins-dir", value_name = "DIR", env = "GPUD_DRA_PLUGINS_DIR",
          default_value = DEFAULT_PLUGINS_DIR)]
    pub dra_plugins_dir: PathBuf,

    /// Folder for the per-claim CDI specs (the container runtime must read it).
    #[arg(long = "dra-cdi-root", value_name = "DIR", env = "GPUD_DRA_CDI_ROOT",
          default_value = DEFAULT_CDI_ROOT)]
    pub dra_cdi_root: PathBuf,

    /// Root of the driver installation the CDI specs mount from (/run/nvidia/driver for a
    /// driver container).
    #[arg(
        long = "dra-driver-root",
        value_name = "PATH",
        env = "GPUD_DRA_DRIVER_ROOT",
        default_value = "/"
    )]
    pub dra_driver_root: PathBuf,

    /// Root under which /dev is found [default: the driver root].
    #[arg(long = "dra-dev-root", value_name = "PATH", env = "GPUD_DRA_DEV_ROOT")]
    pub dra_dev_root: Option<PathBuf>,

    /// The procfs holding the driver's MIG capability tree (MIG device nodes).
    #[arg(
        long = "dra-proc-root",
        value_name = "PATH",
        env = "GPUD_DRA_PROC_ROOT",
        default_value = "/proc"
    )]
    pub dra_proc_root: PathBuf,

    /// The sysfs where each GPU's PCIe root complex is read (the
    /// resource.kubernetes.io/pcieRoot attribute).
    #[arg(
        long = "dra-sysfs-root",
        value_name = "PATH",
        env = "GPUD_DRA_SYSFS_ROOT",
        default_value = "/sys"
    )]
    pub dra_sysfs_root: PathBuf,

    /// The nvidia-cdi-hook executable the CDI specs name [default: gpud's hook,
    /// /usr/local/nvidia/toolkit/nvidia-cdi-hook, when installed, else
    /// /usr/bin/nvidia-cdi-hook].
    #[arg(
        long = "dra-nvidia-cdi-hook-path",
        value_name = "PATH",
        env = "GPUD_DRA_NVIDIA_CDI_HOOK_PATH"
    )]
    pub dra_hook_path: Option<PathBuf>,

    /// The kubelet's pod-resources socket: GPUs the device plugin gave to running pods are
    /// refused to claims. "" skips the check (only when no device plugin runs on the node).
    #[arg(long = "dra-pod-resources-socket", value_name = "PATH",
          env = "GPUD_DRA_POD_RESOURCES_SOCKET",
          default_value = DEFAULT_POD_RESOURCES_SOCKET)]
    pub dra_pod_resources_socket: String,

    /// The nvidia-smi that applies a claim's time-slice interval [default:
    /// <driver root>/usr/bin/nvidia-smi when it exists, else nvidia-smi on PATH].
    #[arg(
        long = "dra-nvidia-smi-path",
        value_name = "PATH",
        env = "GPUD_DRA_NVIDIA_SMI_PATH"
    )]
    pub dra_nvidia_smi_path: Option<PathBuf>,

    /// Dynamic MIG: publish each MIG-capable GPU as a counter set with the whole GPU and every
    /// placement of every MIG profile as devices consuming it, and create the MIG device a
    /// claim was given when it is prepared (needs the API server's partitionable devices). A
    /// GPU with MIG devices gpud did not make, or with MIG off and processes on it, stays as
    /// it is.
    #[arg(long = "dra-dynamic-mig", env = "GPUD_DRA_DYNAMIC_MIG", value_name = "BOOL",
          default_value = "false", action = clap::ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true",
          value_parser = crate::nvidia_config::parse_bool)]
    pub dra_dynamic_mig: bool,
    /// Publish whole GPUs shareable by memory (allowMultipleAllocations and a memory request
    /// policy; Kubernetes feature gate DRAConsumableCapacity): several claims share a GPU, each
    /// taking the memory it asks for.
    #[arg(long = "dra-shared-capacity", env = "GPUD_DRA_SHARED_CAPACITY", value_name = "BOOL",
          default_value = "false", action = clap::ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true",
          value_parser = crate::nvidia_config::parse_bool)]
    pub dra_shared_capacity: bool,
}

/// Everything the DRA plugin runs with, resolved from [`DraArgs`].
#[derive(Debug, Clone)]
pub struct DraConfig {
    pub driver: String,
    pub node: String,
    pub registry_dir: PathBuf,
    pub plugins_dir: PathBuf,
    pub cdi_root: PathBuf,
    /// Where the GPUs' PCIe root complexes are read.
    pub sysfs_root: PathBuf,
    pub host: HostPaths,
    pub pod_resources: Option<PathBuf>,
    pub kubeconfig: Option<PathBuf>,
    /// How long the node's ResourceSlices may fail to publish before the plugin is not ready
    /// (`--api-unready-after`); until then `/readyz` names the failure and stays ready.
    pub unready_after: std::time::Duration,
    /// The nvidia-smi that sets time-slice intervals.
    pub nvidia_smi: PathBuf,
    /// How claims' MPS control daemons run (the `--mps-*` flags).
    pub mps: Launch,
    /// MIG devices made at prepare time (`--dra-dynamic-mig`).
    pub dynamic_mig: bool,
    /// Whole GPUs are published shareable by memory ([`super::shares`]).
    pub shared_capacity: bool,
    /// The state directory with the MIG layout owners' record and lock (dynamic MIG); set by
    /// the applet, `None` without one.
    pub layout_dir: Option<PathBuf>,
    /// gpud's state directory (`--state-dir`), where the admins' device taints are kept for
    /// `gpud inventory`; `None` without one.
    pub state_dir: Option<PathBuf>,
}

impl DraConfig {
    /// This config keeping what needs keeping in `state_dir` (`""`: nowhere).
    pub fn with_state_dir(mut self, state_dir: &str) -> DraConfig {
        self.state_dir = (!state_dir.is_empty()).then(|| PathBuf::from(state_dir));
        self
    }
}

impl DraArgs {
    /// Checks the flags; a bad driver name is a usage error naming the flag and the value.
    pub fn config(
        &self,
        node: String,
        kubeconfig: Option<PathBuf>,
        unready_after: std::time::Duration,
        mps: Launch,
    ) -> Result<DraConfig, crate::daemon::Error> {
        if !is_driver_name(&self.dra_driver_name) {
            return Err(crate::daemon::Error::Usage(format!(
                "--dra-driver-name {:?}: a DRA driver name must be a DNS subdomain of at most 63 \
                 characters (lower-case letters, digits, '-' and '.'), e.g. {DEFAULT_DRIVER}",
                self.dra_driver_name
            )));
        }
        Ok(DraConfig {
            driver: self.dra_driver_name.clone(),
            node,
            registry_dir: self.dra_registry_dir.clone(),
            plugins_dir: self.dra_plugins_dir.clone(),
            cdi_root: self.dra_cdi_root.clone(),
            sysfs_root: self.dra_sysfs_root.clone(),
            host: HostPaths {
                host_root: PathBuf::from("/"),
                driver_root: self.dra_driver_root.clone(),
                dev_root: self
                    .dra_dev_root
                    .clone()
                    .unwrap_or_else(|| self.dra_driver_root.clone()),
                proc_root: self.dra_proc_root.clone(),
                hooks: crate::cdi::discover::hook_candidates(self.dra_hook_path.as_deref()),
                nvml_dir: crate::nvml::library::loaded_dir(),
            },
            pod_resources: (!self.dra_pod_resources_socket.is_empty())
                .then(|| PathBuf::from(&self.dra_pod_resources_socket)),
            kubeconfig,
            unready_after,
            nvidia_smi: self.nvidia_smi(),
            mps,
            dynamic_mig: self.dra_dynamic_mig,
            shared_capacity: self.dra_shared_capacity,
            layout_dir: None,
            state_dir: None,
        })
    }

    /// The flag's nvidia-smi, else the driver root's, else the one on `PATH`.
    fn nvidia_smi(&self) -> PathBuf {
        if let Some(path) = &self.dra_nvidia_smi_path {
            return path.clone();
        }
        let under_root = self.dra_driver_root.join("usr/bin/nvidia-smi");
        if under_root.is_file() {
            under_root
        } else {
            PathBuf::from("nvidia-smi")
        }
    }
}

impl DraConfig {
    /// `<plugins>/<driver>/`: the plugin socket, the checkpoint.
    pub fn plugin_dir(&self) -> PathBuf {
        self.plugins_dir.join(&self.driver)
    }

    /// The DRA service socket the kubelet dials.
    pub fn plugin_socket(&self) -> PathBuf {
        self.plugin_dir().join("dra.sock")
    }

    /// The registration socket the kubelet finds in its registry folder.
    pub fn registration_socket(&self) -> PathBuf {
        // Each instance registers through a socket of its own (the kubelet's rule for plugins
        // that overlap during an upgrade): the old one's going away unregisters only it.
        self.registry_dir
            .join(crate::listeners::instance_file_name(&format!(
                "{}-reg.sock",
                self.driver
            )))
    }

    /// The prepared-claims checkpoint.
    pub fn checkpoint(&self) -> PathBuf {
        self.plugin_dir().join(super::checkpoint::FILE_NAME)
    }

    /// The MIG instances gpud made for claims (dynamic MIG).
    pub fn made_instances(&self) -> PathBuf {
        self.plugin_dir().join(super::dynamic_mig::FILE_NAME)
    }
}

/// Kubernetes' rule for a DRA driver name (`resource.k8s.io`): a DNS subdomain of at most 63
/// characters.
fn is_driver_name(name: &str) -> bool {
    name.len() <= dns_name::MAX_LABEL && dns_name::is_subdomain(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names_are_dns_subdomains() {
        assert!(is_driver_name("gpu.nvidia.com"));
        assert!(is_driver_name("gpu-1.example"));
        assert!(is_driver_name(&format!("{}.com", "a".repeat(59))));
        assert!(!is_driver_name(&format!("{}.com", "a".repeat(60))));
        assert!(!is_driver_name("GPU.nvidia.com"));
        assert!(!is_driver_name("gpu..com"));
        assert!(!is_driver_name("-gpu.com"));
        assert!(!is_driver_name(""));
    }
}
