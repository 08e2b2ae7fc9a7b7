//! PCIe link state: the trained generation and width against the maxima of the GPU and of the
//! slot. Boards train at their maximum (generation 5 from Hopper on, 4 before; 16 lanes) unless
//! a `pcie-link` control command degrades the link, as a marginal riser or a reseated card does.

use std::os::raw::c_uint;

use super::addr;
use crate::driver;
use crate::ffi::{Res, export, put};
use nvml_wrapper_sys::bindings::*;

/// Lanes of every simulated board.
const MAX_WIDTH: u32 = 16;

/// `(current, maximum)` generation and width of the GPU behind `device`.
fn link(device: nvmlDevice_t) -> Res<((u32, u32), (u32, u32))> {
    driver::with(|s, rt| {
        let gpu = rt.gpu(&s.node, addr(device))?;
        let architecture = s.node.gpus[gpu].model.architecture;
        let generation = if architecture >= NVML_DEVICE_ARCH_HOPPER {
            5
        } else {
            4
        };
        let max = (generation, MAX_WIDTH);
        Ok((rt.faults[gpu].pcie_link.unwrap_or(max), max))
    })
}

export! {
    /// The generation the link trained at.
    fn nvmlDeviceGetCurrPcieLinkGeneration(device: nvmlDevice_t, curr_link_gen: *mut c_uint) {
        put!(curr_link_gen, link(device)?.0.0);
        Ok(())
    }
}

export! {
    /// The lanes the link trained with.
    fn nvmlDeviceGetCurrPcieLinkWidth(device: nvmlDevice_t, curr_link_width: *mut c_uint) {
        put!(curr_link_width, link(device)?.0.1);
        Ok(())
    }
}

export! {
    /// The highest generation the GPU and the slot both support.
    fn nvmlDeviceGetMaxPcieLinkGeneration(device: nvmlDevice_t, max_link_gen: *mut c_uint) {
        put!(max_link_gen, link(device)?.1.0);
        Ok(())
    }
}

export! {
    /// The highest generation the GPU supports.
    fn nvmlDeviceGetGpuMaxPcieLinkGeneration(device: nvmlDevice_t, max_link_gen_device: *mut c_uint) {
        put!(max_link_gen_device, link(device)?.1.0);
        Ok(())
    }
}

export! {
    /// The most lanes the GPU and the slot both support.
    fn nvmlDeviceGetMaxPcieLinkWidth(device: nvmlDevice_t, max_link_width: *mut c_uint) {
        put!(max_link_width, link(device)?.1.1);
        Ok(())
    }
}
