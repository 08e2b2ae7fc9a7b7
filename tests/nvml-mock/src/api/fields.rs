//! `nvmlDeviceGetFieldValues`: the field-id interface DCGM-style collectors use. Fields whose
//! value the mock models (ECC, retired pages, remapping, energy, power limits, PCIe replays,
//! NVLink inventory and throughput, memory temperature, the recovery action a `recovery-action`
//! control line set) are answered; every other field gets
//! `NVML_ERROR_NOT_SUPPORTED` in its own `nvmlReturn`, as the real call does.
//!
//! Field ids are the NVML 12 numbering (the driver version reported is below 580.82, so
//! nvml-wrapper uses that scheme too); none of the ids that changed in 13.0 U1 are modelled.

use std::os::raw::c_int;

use super::addr;
use crate::driver::{self, Dev, Runtime, Session};
use crate::ffi::{Res, export, get, put, rc};
use nvml_wrapper_sys::bindings as b;
use nvml_wrapper_sys::bindings::field_id as f;
use nvml_wrapper_sys::bindings::*;

/// A field's value in one of the union's representations.
enum Value {
    Uint(u32),
    Ull(u64),
}

/// Per-link NVLink fields with the link in the id: `(first id, links covered)` ranges.
const PER_LINK_ERROR_RANGES: &[(u32, u32)] = &[
    (f::NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0, 6),
    (f::NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0, 6),
    (f::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0, 6),
    (f::NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0, 6),
    (f::NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6, 6),
    (f::NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6, 6),
    (f::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6, 6),
    (f::NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6, 6),
    (f::NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_L0, 12),
];

/// The link a per-link speed field refers to.
fn speed_field_link(id: u32) -> Option<u32> {
    match id {
        f::NVML_FI_DEV_NVLINK_SPEED_MBPS_L0..=f::NVML_FI_DEV_NVLINK_SPEED_MBPS_L5 => {
            Some(id - f::NVML_FI_DEV_NVLINK_SPEED_MBPS_L0)
        }
        f::NVML_FI_DEV_NVLINK_SPEED_MBPS_L6..=f::NVML_FI_DEV_NVLINK_SPEED_MBPS_L11 => {
            Some(6 + id - f::NVML_FI_DEV_NVLINK_SPEED_MBPS_L6)
        }
        _ => None,
    }
}

/// The value of one field on GPU `gpu`.
fn field(s: &Session, rt: &Runtime, gpu: usize, id: u32, scope: u32) -> Res<Value> {
    let g = &s.node.gpus[gpu];
    let faults = &rt.faults[gpu];
    let probe = s.probe(gpu);
    let links = g.links.len() as u32;
    let nvlink = || g.model.nvlink.ok_or(rc::NOT_SUPPORTED);
    let ecc = || {
        if g.ecc_enabled {
            Ok(())
        } else {
            Err(rc::NOT_SUPPORTED)
        }
    };
    let link_scope = || {
        if scope < links {
            Ok(scope as usize)
        } else {
            Err(rc::INVALID_ARGUMENT)
        }
    };
    let pages = |cause| {
        faults
            .retired_pages
            .iter()
            .filter(|p| p.cause == cause)
            .count() as u64
    };

    if PER_LINK_ERROR_RANGES
        .iter()
        .any(|(first, n)| (*first..*first + n).contains(&id))
    {
        nvlink()?;
        return Ok(Value::Ull(0));
    }
    if let Some(link) = speed_field_link(id) {
        let speed = nvlink()?.speed_mbps;
        return if link < links {
            Ok(Value::Uint(speed))
        } else {
            Err(rc::NOT_SUPPORTED)
        };
    }
    Ok(match id {
        f::NVML_FI_DEV_ECC_CURRENT | f::NVML_FI_DEV_ECC_PENDING => {
            if !g.model.ecc {
                return Err(rc::NOT_SUPPORTED);
            }
            Value::Uint(g.ecc_enabled as u32)
        }
        f::NVML_FI_DEV_ECC_SBE_VOL_TOTAL | f::NVML_FI_DEV_ECC_SBE_VOL_DEV => {
            ecc()?;
            Value::Ull(faults.sbe_volatile)
        }
        f::NVML_FI_DEV_ECC_DBE_VOL_TOTAL | f::NVML_FI_DEV_ECC_DBE_VOL_DEV => {
            ecc()?;
            Value::Ull(faults.dbe_volatile)
        }
        f::NVML_FI_DEV_ECC_SBE_AGG_TOTAL | f::NVML_FI_DEV_ECC_SBE_AGG_DEV => {
            ecc()?;
            Value::Ull(faults.sbe_aggregate)
        }
        f::NVML_FI_DEV_ECC_DBE_AGG_TOTAL | f::NVML_FI_DEV_ECC_DBE_AGG_DEV => {
            ecc()?;
            Value::Ull(faults.dbe_aggregate)
        }
        f::NVML_FI_DEV_ECC_SBE_VOL_L1..=f::NVML_FI_DEV_ECC_DBE_VOL_L2
        | f::NVML_FI_DEV_ECC_SBE_VOL_REG..=f::NVML_FI_DEV_ECC_SBE_AGG_L2
        | f::NVML_FI_DEV_ECC_DBE_AGG_L2
        | f::NVML_FI_DEV_ECC_SBE_AGG_REG..=f::NVML_FI_DEV_ECC_DBE_AGG_CBU => {
            ecc()?;
            Value::Ull(0)
        }
        f::NVML_FI_DEV_RETIRED_SBE => {
            ecc()?;
            Value::Ull(pages(b::nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS))
        }
        f::NVML_FI_DEV_RETIRED_DBE => {
            ecc()?;
            Value::Ull(pages(
                b::nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
            ))
        }
        f::NVML_FI_DEV_RETIRED_PENDING | f::NVML_FI_DEV_RETIRED_PENDING_DBE => {
            ecc()?;
            Value::Ull(faults.pages_pending as u64)
        }
        f::NVML_FI_DEV_RETIRED_PENDING_SBE => {
            ecc()?;
            Value::Ull(0)
        }
        f::NVML_FI_DEV_REMAPPED_COR => Value::Uint(faults.remapped_correctable),
        f::NVML_FI_DEV_REMAPPED_UNC => Value::Uint(faults.remapped_uncorrectable),
        f::NVML_FI_DEV_REMAPPED_PENDING => Value::Uint(faults.remap_pending as u32),
        f::NVML_FI_DEV_REMAPPED_FAILURE => Value::Uint(faults.remap_failure as u32),
        f::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION => Value::Uint(faults.recovery_action),
        f::NVML_FI_DEV_MEMORY_TEMP => {
            Value::Uint(probe.memory_temperature().ok_or(rc::NOT_SUPPORTED)?)
        }
        f::NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION | f::NVML_FI_DEV_ENERGY => {
            Value::Ull(probe.energy_mj())
        }
        f::NVML_FI_DEV_POWER_AVERAGE | f::NVML_FI_DEV_POWER_INSTANT => {
            if scope != b::NVML_POWER_SCOPE_GPU {
                return Err(rc::NOT_SUPPORTED);
            }
            Value::Uint(probe.power_mw())
        }
        f::NVML_FI_DEV_POWER_MIN_LIMIT => Value::Uint(g.model.power.min_mw),
        f::NVML_FI_DEV_POWER_MAX_LIMIT => Value::Uint(g.model.power.max_mw),
        f::NVML_FI_DEV_POWER_DEFAULT_LIMIT => Value::Uint(g.model.power.default_mw),
        f::NVML_FI_DEV_POWER_CURRENT_LIMIT | f::NVML_FI_DEV_POWER_REQUESTED_LIMIT => {
            Value::Uint(g.power_limit_mw)
        }
        f::NVML_FI_DEV_PCIE_REPLAY_COUNTER => Value::Ull(probe.pcie_replays() as u64),
        f::NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER => Value::Ull(0),
        f::NVML_FI_DEV_NVLINK_LINK_COUNT => Value::Uint(links),
        f::NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON => Value::Uint(nvlink()?.speed_mbps),
        f::NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
        | f::NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
        | f::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
        | f::NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
        | f::NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL
        | f::NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY
        | f::NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY
        | f::NVML_FI_DEV_NVLINK_ERROR_DL_CRC => {
            nvlink()?;
            Value::Ull(0)
        }
        f::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
        | f::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
        | f::NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX
        | f::NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX => {
            nvlink()?;
            let tx = id == f::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
                || id == f::NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX;
            // Raw counts include protocol overhead: a fixed 1/16 on top of the data.
            let raw = id >= f::NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX;
            let data = if scope == u32::MAX {
                (0..links).map(|l| probe.nvlink_kib(l, tx)).sum()
            } else {
                probe.nvlink_kib(link_scope()? as u32, tx)
            };
            Value::Ull(if raw { data + data / 16 } else { data })
        }
        f::NVML_FI_DEV_NVLINK_GET_SPEED => {
            link_scope()?;
            Value::Uint(nvlink()?.speed_mbps)
        }
        f::NVML_FI_DEV_NVLINK_GET_STATE => {
            let l = link_scope()?;
            Value::Uint(
                (faults.link_up[l] && g.links[l].remote != crate::node::Remote::None) as u32,
            )
        }
        f::NVML_FI_DEV_NVLINK_GET_VERSION => {
            link_scope()?;
            Value::Uint(nvlink()?.version)
        }
        _ => return Err(rc::NOT_SUPPORTED),
    })
}

export! {
    /// Reads a batch of fields; per-field failures go into each entry's `nvmlReturn`.
    fn nvmlDeviceGetFieldValues(device: nvmlDevice_t, values_count: c_int, values: *mut nvmlFieldValue_t) {
        if values_count < 0 {
            return Err(rc::INVALID_ARGUMENT);
        }
        let count = values_count as usize;
        let mut requests = Vec::with_capacity(count);
        for i in 0..count {
            requests.push(get!(values.wrapping_add(i)));
        }
        let answers = driver::with(|s, rt| {
            let dev = rt.device(&s.node, addr(device))?;
            let timestamp = s.timestamp_us() as i64;
            Ok(requests
                .iter()
                .map(|r| {
                    let result = match dev {
                        Dev::Gpu(gpu) => field(s, rt, gpu, r.fieldId, r.scopeId),
                        Dev::Mig { .. } => Err(rc::NOT_SUPPORTED),
                    };
                    let (value_type, value, ret) = match result {
                        Ok(Value::Uint(v)) => (b::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT, nvmlValue_t { uiVal: v }, rc::SUCCESS),
                        Ok(Value::Ull(v)) => {
                            (b::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, nvmlValue_t { ullVal: v }, rc::SUCCESS)
                        }
                        Err(code) => (r.valueType, nvmlValue_t { ullVal: 0 }, code),
                    };
                    nvmlFieldValue_t {
                        fieldId: r.fieldId,
                        scopeId: r.scopeId,
                        timestamp,
                        latencyUsec: 0,
                        valueType: value_type,
                        nvmlReturn: ret,
                        value,
                    }
                })
                .collect::<Vec<_>>())
        })?;
        for (i, answer) in answers.into_iter().enumerate() {
            put!(values.wrapping_add(i), answer);
        }
        Ok(())
    }
}
