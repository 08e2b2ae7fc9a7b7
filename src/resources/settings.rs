//! The device plugin's resolved settings: what NVIDIA's config file, flags and environment
//! amount to once merged and validated (`crate::nvidia_config`). Everything downstream of
//! configuration reads this: the device plugin, and the MPS subsystem that plans its daemons
//! from the same resources.

use std::path::PathBuf;

pub use crate::nvidia_config::{
    AllocationPolicy as SharedPolicy, DeviceIdStrategy as IdStrategy,
    DeviceListStrategy as ListStrategy, MigStrategy,
};

/// Replication (time-slicing or MPS) of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sharing {
    /// The resource being shared, e.g. `nvidia.com/gpu`.
    pub name: String,
    /// Replicas per device (≥ 2).
    pub replicas: u32,
    /// Name to advertise instead (`<name>.shared` with `renameByDefault`).
    pub rename: Option<String>,
}

/// Everything the device plugin needs to decide resources and allocations.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub mig_strategy: MigStrategy,
    /// Never empty; duplicates removed, in a stable order.
    pub list_strategies: Vec<ListStrategy>,
    pub id_strategy: IdStrategy,
    pub pass_device_specs: bool,
    /// Host path the device nodes are under (`nvidiaDevRoot`, else `nvidiaDriverRoot`).
    pub dev_root: PathBuf,
    /// Prefix of the CDI annotation key.
    pub cdi_annotation_prefix: String,
    pub shared_policy: SharedPolicy,
    /// Replicated resources.
    pub sharing: Vec<Sharing>,
    /// Reject shared requests for more than one replica.
    pub fail_requests_greater_than_one: bool,
    /// `mpsRoot` when the replicated resources are shared with MPS (NVIDIA's strategy `mps`);
    /// `None` for time-slicing or no sharing.
    pub mps_root: Option<PathBuf>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            mig_strategy: MigStrategy::None,
            list_strategies: vec![ListStrategy::Envvar],
            id_strategy: IdStrategy::Uuid,
            pass_device_specs: false,
            dev_root: PathBuf::from("/"),
            cdi_annotation_prefix: "cdi.k8s.io/".to_owned(),
            shared_policy: SharedPolicy::Distributed,
            sharing: Vec::new(),
            fail_requests_greater_than_one: false,
            mps_root: None,
        }
    }
}

/// The CDI kind the device plugin's device names use (`k8s.device-plugin.nvidia.com/gpu`).
pub const CDI_KIND: &str = "k8s.device-plugin.nvidia.com/gpu";
