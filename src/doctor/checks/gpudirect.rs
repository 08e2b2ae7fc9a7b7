//! GPUDirect RDMA: a node with RDMA NICs needs the GPU memory exported to them, through the
//! `nvidia_peermem` module or DMA-BUF (the open kernel modules), and the IOMMU off or in
//! passthrough so peer traffic is not translated.

use crate::doctor::env::Env;
use crate::doctor_report::Verdict;

use super::driver::kernel_module;

const RDMA_CLASS: &str = "/sys/class/infiniband";

/// RDMA devices on the host, or the skip verdict when there are none.
fn nics(env: &Env) -> Result<Vec<String>, Verdict> {
    let nics = env.host.list(RDMA_CLASS);
    if nics.is_empty() {
        Err(Verdict::skip(format!(
            "no RDMA NICs ({RDMA_CLASS} is empty)"
        )))
    } else {
        Ok(nics)
    }
}

/// `gpudirect.rdma`
pub fn rdma(env: &Env) -> Verdict {
    let nics = match nics(env) {
        Ok(nics) => nics,
        Err(verdict) => return verdict,
    };
    let list = nics.join(", ");
    let peermem = env
        .host
        .modules()
        .is_some_and(|m| m.contains("nvidia_peermem"));
    let open = kernel_module(&env.host).is_some_and(|(_, open)| open);
    match (peermem, open) {
        (true, _) => Verdict::ok(format!("RDMA NICs {list}; nvidia_peermem loaded")),
        (false, true) => Verdict::ok(format!(
            "RDMA NICs {list}; DMA-BUF through the open kernel modules"
        )),
        (false, false) => Verdict::warn(
            format!(
                "RDMA NICs {list} but neither nvidia_peermem nor the open kernel modules (DMA-BUF)"
            ),
            "install the open kernel modules for DMA-BUF, or modprobe nvidia_peermem",
        ),
    }
}

/// `gpudirect.iommu`
pub fn iommu(env: &Env) -> Verdict {
    if let Err(verdict) = nics(env) {
        return verdict;
    }
    let cmdline = env.host.read("/proc/cmdline").unwrap_or_default();
    let passthrough = cmdline.split_whitespace().any(|w| w == "iommu=pt");
    let groups = env.host.list("/sys/kernel/iommu_groups");
    if groups.is_empty() {
        Verdict::ok("IOMMU off")
    } else if passthrough {
        Verdict::ok("IOMMU in passthrough (iommu=pt)")
    } else {
        Verdict::warn(
            format!(
                "IOMMU translating DMA ({} groups, no iommu=pt on the kernel command line): GPUDirect RDMA traffic goes through it",
                groups.len()
            ),
            "boot with iommu=pt (with intel_iommu=on or amd_iommu=on) for GPUDirect RDMA",
        )
    }
}
