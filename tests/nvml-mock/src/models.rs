//! GPU models: everything that is the same for every board of one product (name, memory,
//! PCI ids, power and thermal limits, clocks, NVLink, MIG table).
//!
//! The built-in catalog is `models.json`, compiled in; a fixture may add models or replace a
//! built-in one in its own `models` section, using the same schema.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::profiles::{self, MigTable};
use nvml_wrapper_sys::bindings as b;

/// The built-in catalog.
const CATALOG: &str = include_str!("models.json");

/// Board power, all in milliwatts.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PowerSpec {
    pub default_mw: u32,
    pub min_mw: u32,
    pub max_mw: u32,
    /// Draw at 0% utilisation; telemetry scales between this and the limit.
    pub idle_mw: u32,
}

/// Temperature thresholds in °C, plus the idle temperature telemetry starts from.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ThermalSpec {
    pub shutdown: u32,
    pub slowdown: u32,
    pub gpu_max: u32,
    /// Absent on boards whose memory has no sensor (GDDR): the threshold is not supported.
    #[serde(default)]
    pub memory_max: Option<u32>,
    pub idle: u32,
}

/// A clock per domain, in MHz.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClockSpec {
    pub graphics: u32,
    pub sm: u32,
    pub memory: u32,
    pub video: u32,
}

/// The NVLink side of a model.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NvLinkSpec {
    /// Links per GPU.
    pub links: u32,
    /// What `nvmlDeviceGetNvLinkVersion` reports (an `nvmlNvlinkVersion_t`, e.g. 4 = NVLink 3.0).
    pub version: u32,
    /// Per-link speed in MB/s, for the NVLink speed field values.
    pub speed_mbps: u32,
}

/// `nvmlBrandType_t` values by the names fixtures use.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Brand {
    Tesla,
    Quadro,
    Geforce,
    Titan,
    NvidiaRtx,
    Nvidia,
}

impl Brand {
    pub fn nvml(self) -> u32 {
        match self {
            Brand::Tesla => b::nvmlBrandType_enum_NVML_BRAND_TESLA,
            Brand::Quadro => b::nvmlBrandType_enum_NVML_BRAND_QUADRO,
            Brand::Geforce => b::nvmlBrandType_enum_NVML_BRAND_GEFORCE,
            Brand::Titan => b::nvmlBrandType_enum_NVML_BRAND_TITAN,
            Brand::NvidiaRtx => b::nvmlBrandType_enum_NVML_BRAND_NVIDIA_RTX,
            Brand::Nvidia => b::nvmlBrandType_enum_NVML_BRAND_NVIDIA,
        }
    }
}

/// `nvmlDeviceArchitecture_t` values by name.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    Volta,
    Turing,
    Ampere,
    Ada,
    Hopper,
    Blackwell,
}

impl Architecture {
    pub fn nvml(self) -> u32 {
        match self {
            Architecture::Volta => b::NVML_DEVICE_ARCH_VOLTA,
            Architecture::Turing => b::NVML_DEVICE_ARCH_TURING,
            Architecture::Ampere => b::NVML_DEVICE_ARCH_AMPERE,
            Architecture::Ada => b::NVML_DEVICE_ARCH_ADA,
            Architecture::Hopper => b::NVML_DEVICE_ARCH_HOPPER,
            Architecture::Blackwell => b::NVML_DEVICE_ARCH_BLACKWELL,
        }
    }
}

/// One model as written in JSON.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// The marketing name NVML reports, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    pub brand: Brand,
    pub architecture: Architecture,
    /// `"major.minor"`, e.g. `"9.0"`.
    pub compute_capability: String,
    /// Framebuffer as NVML reports it (`total`), in MiB.
    pub memory_mib: u64,
    /// What `nvmlDeviceGetMemoryInfo_v2` reports as `reserved`, in MiB.
    pub reserved_memory_mib: u64,
    pub bar1_mib: u64,
    /// `0xDDDDVVVV`: device id in the high half, vendor `10DE` in the low half.
    pub pci_device_id: String,
    pub pci_subsystem_id: String,
    pub power: PowerSpec,
    pub temperature: ThermalSpec,
    pub max_clocks_mhz: ClockSpec,
    pub idle_clocks_mhz: ClockSpec,
    /// Whether the board has ECC memory (enabled unless a GPU overrides it).
    #[serde(default = "yes")]
    pub ecc: bool,
    #[serde(default)]
    pub nvlink: Option<NvLinkSpec>,
    /// Fans NVML can read; data-centre boards are passively cooled and have none.
    #[serde(default)]
    pub fans: u32,
    /// Key of the MIG profile table (`a100-40gb`, `a100-80gb`, `h100-80gb`); absent when the
    /// model is not MIG capable.
    #[serde(default)]
    pub mig: Option<String>,
}

fn yes() -> bool {
    true
}

/// A model after validation, with its numbers parsed.
#[derive(Debug, Clone)]
pub struct Model {
    pub key: String,
    pub name: String,
    pub brand: u32,
    pub architecture: u32,
    pub compute_capability: (i32, i32),
    pub memory_mib: u64,
    pub reserved_memory_mib: u64,
    pub bar1_mib: u64,
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
    pub power: PowerSpec,
    pub temperature: ThermalSpec,
    pub max_clocks: ClockSpec,
    pub idle_clocks: ClockSpec,
    pub ecc: bool,
    pub nvlink: Option<NvLinkSpec>,
    pub fans: u32,
    pub mig: Option<&'static MigTable>,
}

/// Parses `0x1234ABCD` (the prefix is optional).
pub fn parse_hex_u32(text: &str) -> Option<u32> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    u32::from_str_radix(digits, 16).ok()
}

impl Model {
    /// Validates a spec; on failure returns the offending field (relative to the model) and why.
    pub fn from_spec(key: &str, spec: &ModelSpec) -> Result<Model, (String, String)> {
        let bad = |field: &str, why: String| Err((field.to_owned(), why));
        let cc = spec
            .compute_capability
            .split_once('.')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
        let Some(compute_capability) = cc else {
            return bad("compute_capability", "expected \"major.minor\"".into());
        };
        let Some(pci_device_id) = parse_hex_u32(&spec.pci_device_id) else {
            return bad("pci_device_id", "expected a hex id like 0x233010DE".into());
        };
        let Some(pci_subsystem_id) = parse_hex_u32(&spec.pci_subsystem_id) else {
            return bad(
                "pci_subsystem_id",
                "expected a hex id like 0x16C110DE".into(),
            );
        };
        let p = spec.power;
        if !(p.min_mw <= p.default_mw && p.default_mw <= p.max_mw && p.idle_mw < p.min_mw.max(1)) {
            return bad(
                "power",
                "need idle_mw < min_mw <= default_mw <= max_mw".into(),
            );
        }
        let t = spec.temperature;
        if !(t.idle < t.gpu_max && t.gpu_max <= t.slowdown && t.slowdown < t.shutdown) {
            return bad(
                "temperature",
                "need idle < gpu_max <= slowdown < shutdown".into(),
            );
        }
        if spec.reserved_memory_mib >= spec.memory_mib {
            return bad("reserved_memory_mib", "must be below memory_mib".into());
        }
        let (max, idle) = (spec.max_clocks_mhz, spec.idle_clocks_mhz);
        if idle.graphics > max.graphics
            || idle.sm > max.sm
            || idle.memory > max.memory
            || idle.video > max.video
        {
            return bad(
                "idle_clocks_mhz",
                "idle clocks must not exceed max_clocks_mhz".into(),
            );
        }
        if let Some(n) = spec.nvlink
            && (n.links == 0 || n.links > b::NVML_NVLINK_MAX_LINKS)
        {
            return bad(
                "nvlink.links",
                format!("must be 1..={}", b::NVML_NVLINK_MAX_LINKS),
            );
        }
        let mig = match &spec.mig {
            None => None,
            Some(table_key) => match profiles::table(table_key) {
                Some(t) => Some(t),
                None => {
                    let known: Vec<_> = profiles::TABLES.iter().map(|t| t.key).collect();
                    return bad(
                        "mig",
                        format!("unknown MIG table; known: {}", known.join(", ")),
                    );
                }
            },
        };
        Ok(Model {
            key: key.to_owned(),
            name: spec.name.clone(),
            brand: spec.brand.nvml(),
            architecture: spec.architecture.nvml(),
            compute_capability,
            memory_mib: spec.memory_mib,
            reserved_memory_mib: spec.reserved_memory_mib,
            bar1_mib: spec.bar1_mib,
            pci_device_id,
            pci_subsystem_id,
            power: spec.power,
            temperature: spec.temperature,
            max_clocks: spec.max_clocks_mhz,
            idle_clocks: spec.idle_clocks_mhz,
            ecc: spec.ecc,
            nvlink: spec.nvlink,
            fans: spec.fans,
            mig,
        })
    }
}

/// The built-in catalog as raw specs. A parse failure here is a defect of the crate itself,
/// which the unit tests catch; at run time it surfaces as a fixture error.
pub fn builtin_specs() -> Result<BTreeMap<String, ModelSpec>, String> {
    serde_json::from_str(CATALOG).map_err(|e| format!("built-in models.json: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_catalog_is_valid() {
        let specs = builtin_specs().unwrap();
        assert!(specs.len() >= 5);
        for (key, spec) in &specs {
            let m = Model::from_spec(key, spec).unwrap();
            assert_eq!(m.pci_device_id & 0xffff, 0x10de, "{key}");
        }
        let h100 = Model::from_spec("H100-SXM5-80GB", &specs["H100-SXM5-80GB"]).unwrap();
        assert_eq!(h100.memory_mib, 81559);
        assert_eq!(h100.compute_capability, (9, 0));
        assert_eq!(h100.mig.map(|t| t.key), Some("h100-80gb"));
    }
}
