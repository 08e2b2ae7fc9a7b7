//! The check catalog: one file per group, each check a function from the gathered facts and
//! the host's files to a [`Verdict`](super::Verdict).

mod config;
mod devices;
mod driver;
mod fabric;
mod gpu;
mod gpudirect;
mod kubelet;
mod mig;
mod mps;
mod runtime;
mod selinux;

pub use gpu::read_kernel_log;

use super::env::Env;
use crate::doctor_report::Verdict;

/// One check.
#[derive(Debug)]
pub struct Check {
    /// `group.name`.
    pub id: &'static str,
    /// One line for `--list`.
    pub about: &'static str,
    /// Reads NVML's facts (the doctor loads NVML only when a selected check does).
    pub needs_nvml: bool,
    pub run: fn(&Env) -> Verdict,
}

impl Check {
    /// The part of the id before the dot.
    pub fn group(&self) -> &'static str {
        self.id.split('.').next().unwrap_or(self.id)
    }
}

macro_rules! check {
    ($id:literal, $nvml:literal, $run:path, $about:literal) => {
        Check {
            id: $id,
            about: $about,
            needs_nvml: $nvml,
            run: $run,
        }
    };
}

/// Every check, in report order.
pub static CATALOG: &[Check] = &[
    check!(
        "driver.nvml",
        true,
        driver::nvml,
        "NVML loads, and from where"
    ),
    check!(
        "driver.version",
        true,
        driver::version,
        "driver and CUDA versions; the kernel module matches the library"
    ),
    check!(
        "driver.modules",
        false,
        driver::modules,
        "nvidia, nvidia_uvm and nvidia_modeset loaded, at the driver's version"
    ),
    check!(
        "devices.control",
        false,
        devices::control,
        "/dev/nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset exist"
    ),
    check!(
        "devices.gpus",
        true,
        devices::gpus,
        "/dev/nvidia<N> exists for every GPU"
    ),
    check!(
        "devices.char-links",
        true,
        devices::char_links,
        "/dev/char/<major>:<minor> links for every NVIDIA device node"
    ),
    check!(
        "devices.mig-caps",
        true,
        devices::mig_caps,
        "MIG capability device nodes for every live GPU and compute instance"
    ),
    check!(
        "gpu.present",
        true,
        gpu::present,
        "every GPU answers NVML (none fell off the bus)"
    ),
    check!(
        "gpu.persistence",
        true,
        gpu::persistence,
        "persistence mode is on"
    ),
    check!(
        "gpu.ecc",
        true,
        gpu::ecc,
        "ECC mode now equals ECC mode after the next reboot"
    ),
    check!(
        "gpu.memory",
        true,
        gpu::memory,
        "no row remap or page retirement pending, no remap failure"
    ),
    check!(
        "gpu.recovery",
        true,
        gpu::recovery,
        "the recovery action NVML asks for"
    ),
    check!(
        "gpu.pcie",
        true,
        gpu::pcie,
        "PCIe link generation and width at the maximum"
    ),
    check!(
        "gpu.nvlink",
        true,
        gpu::nvlink,
        "every trained NVLink is up"
    ),
    check!(
        "gpu.throttle",
        true,
        gpu::throttle,
        "no thermal or hardware clock slowdown"
    ),
    check!(
        "gpu.temperature",
        true,
        gpu::temperature,
        "temperature margin to the slowdown threshold"
    ),
    check!(
        "gpu.xid",
        true,
        gpu::xid,
        "XIDs in the kernel log since boot, with the catalog's action"
    ),
    check!(
        "mig.mode",
        true,
        mig::mode,
        "MIG mode is not waiting for a GPU reset"
    ),
    check!(
        "mig.nvidia-drm",
        true,
        mig::nvidia_drm,
        "nvidia_drm is not loaded on a MIG node"
    ),
    check!(
        "mig.config",
        true,
        mig::config,
        "the selected mig-parted config is in effect; the reconciler's reason when it failed"
    ),
    check!(
        "fabric.state",
        true,
        fabric::state,
        "NVSwitch fabric: fabric manager running, or NVML fabric registration completed"
    ),
    check!(
        "mps.compute-mode",
        true,
        mps::compute_mode,
        "no GPU is left in EXCLUSIVE_PROCESS without an MPS control daemon"
    ),
    check!(
        "mps.uid",
        false,
        mps::uid,
        "MPS servers run as the workloads' UID (--mps-workload-uid)"
    ),
    check!(
        "runtime.containerd",
        false,
        runtime::containerd,
        "containerd has the NVIDIA runtime or CDI enabled"
    ),
    check!(
        "runtime.crio",
        false,
        runtime::crio,
        "CRI-O's NVIDIA runtime points at an existing binary"
    ),
    check!(
        "runtime.cdi-spec",
        true,
        runtime::cdi_spec,
        "a readable CDI spec lists every current GPU and MIG device"
    ),
    check!(
        "kubelet.sockets",
        false,
        kubelet::sockets,
        "the kubelet's device-plugin and pod-resources sockets exist"
    ),
    check!(
        "kubelet.plugin",
        false,
        kubelet::plugin,
        "an NVIDIA device plugin is registered with the kubelet"
    ),
    check!(
        "gpudirect.rdma",
        false,
        gpudirect::rdma,
        "RDMA NICs have nvidia_peermem or DMA-BUF"
    ),
    check!(
        "gpudirect.iommu",
        false,
        gpudirect::iommu,
        "IOMMU off or in passthrough for GPUDirect RDMA"
    ),
    check!("selinux.mode", false, selinux::mode, "SELinux mode"),
    check!(
        "config.gpud",
        false,
        config::gpud,
        "gpud's config file is valid"
    ),
    check!(
        "config.nvidia",
        false,
        config::nvidia,
        "NVIDIA's device plugin / GFD config file is valid"
    ),
];

/// `GPU 0, 3` style lists.
fn gpu_list(indices: &[u32]) -> String {
    indices
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Joins per-GPU findings with `; `.
fn joined(items: &[String]) -> String {
    items.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_grouped() {
        let mut ids: Vec<&str> = CATALOG.iter().map(|c| c.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), CATALOG.len());
        for check in CATALOG {
            assert!(check.id.contains('.'), "{}", check.id);
        }
    }
}
