//! Fixture files: the JSON schema of a simulated node, the built-in fixtures compiled into the
//! library, and validation into a [`Node`].
//!
//! Selection: `NVML_MOCK_FIXTURE` is a built-in name (`dgx-h100`, …) or a path to a JSON file;
//! unset means `dgx-h100`. Every schema struct denies unknown fields, and every error names the
//! file and the JSON path of the field, so a typo fails `nvmlInit` loudly instead of silently
//! simulating something else. `README.md` documents the schema for fixture authors.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use serde::Deserialize;

use crate::jsonpath;
use crate::mig::MigState;
use crate::models::{self, Model, ModelSpec, parse_hex_u32};
use crate::node::{Fabric, Gpu, Link, Node, NvSwitch, PciAddress, Remote};
use nvml_wrapper_sys::bindings as b;

/// The fixture used when `NVML_MOCK_FIXTURE` is unset.
pub const DEFAULT_FIXTURE: &str = "dgx-h100";

/// Built-in fixtures by name; the same files live in `tests/fixtures/nodes/`.
pub const BUILTIN: &[(&str, &str)] = &[
    (
        "dgx-h100",
        include_str!("../../fixtures/nodes/dgx-h100.json"),
    ),
    (
        "dgx-a100",
        include_str!("../../fixtures/nodes/dgx-a100.json"),
    ),
    (
        "pcie-4gpu",
        include_str!("../../fixtures/nodes/pcie-4gpu.json"),
    ),
    ("mixed", include_str!("../../fixtures/nodes/mixed.json")),
    (
        "a100-mig",
        include_str!("../../fixtures/nodes/a100-mig.json"),
    ),
    ("empty", include_str!("../../fixtures/nodes/empty.json")),
    (
        "gb200-nvl",
        include_str!("../../fixtures/nodes/gb200-nvl.json"),
    ),
    (
        "h100-mig",
        include_str!("../../fixtures/nodes/h100-mig.json"),
    ),
];

// ---------------------------------------------------------------------------------------------
// Schema
// ---------------------------------------------------------------------------------------------

/// The top level of a fixture file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FixtureSpec {
    /// Free text for humans.
    #[serde(default)]
    #[allow(dead_code)]
    description: String,
    /// `nvmlSystemGetDriverVersion`, e.g. `570.133.20`.
    driver_version: String,
    /// `nvmlSystemGetNVMLVersion`, e.g. `12.570.133.20`.
    nvml_version: String,
    /// `nvmlSystemGetCudaDriverVersion`, e.g. 12080 for CUDA 12.8.
    cuda_driver_version: i32,
    /// Seeds the telemetry generator.
    seed: u64,
    /// Extra or replacement models, same schema as the built-in catalog.
    #[serde(default)]
    models: BTreeMap<String, ModelSpec>,
    /// NVSwitch chips that NVLinks may end on.
    #[serde(default)]
    nvswitches: Vec<NvSwitchSpec>,
    /// GPUs in NVML index order.
    gpus: Vec<GpuSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NvSwitchSpec {
    pci_bus_id: String,
    pci_device_id: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuSpec {
    /// A key of the fixture's `models` or of the built-in catalog.
    model: String,
    uuid: String,
    serial: String,
    board_part_number: String,
    pci_bus_id: String,
    /// `/dev/nvidia<N>`; defaults to the GPU's index.
    #[serde(default)]
    minor_number: Option<u32>,
    numa_node: u32,
    /// CPU list in `/sys` syntax, e.g. `0-55,112-167`.
    cpu_affinity: String,
    #[serde(default)]
    pcie: PcieSpec,
    /// Current power limit; defaults to the model's default limit.
    #[serde(default)]
    power_limit_mw: Option<u32>,
    /// Overrides the model's ECC setting.
    #[serde(default)]
    ecc_enabled: Option<bool>,
    #[serde(default = "yes")]
    persistence_mode: bool,
    #[serde(default)]
    compute_mode: ComputeModeSpec,
    /// Link groups in link order; links not covered are untrained.
    #[serde(default)]
    nvlinks: Vec<LinkSpec>,
    /// Initial MIG state; only for MIG-capable models.
    #[serde(default)]
    mig: Option<MigSpec>,
    /// Multi-node NVLink fabric registration; absent outside such a fabric.
    #[serde(default)]
    fabric: Option<FabricSpec>,
}

/// What `nvmlDeviceGetGpuFabricInfo*` reports for a GPU of a multi-node NVLink fabric.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FabricSpec {
    /// Canonical 8-4-4-4-12 lower-case hex, e.g. `3f5a0c2e-9b1d-4e7a-8c63-1d2e4f5a6b7c`.
    cluster_uuid: String,
    clique_id: u32,
    #[serde(default)]
    state: FabricStateSpec,
    /// The registration's `nvmlReturn_t`; 0 (success) by default.
    #[serde(default)]
    status: u32,
}

#[derive(Debug, Default, Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum FabricStateSpec {
    NotStarted,
    InProgress,
    #[default]
    Completed,
}

fn yes() -> bool {
    true
}

/// Where the GPU sits in the PCIe tree; drives `nvmlDeviceGetTopologyCommonAncestor`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PcieSpec {
    #[serde(default)]
    host_bridge: Option<String>,
    /// PCIe switches from the host bridge down to the GPU.
    #[serde(default)]
    switches: Vec<String>,
}

#[derive(Debug, Default, Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum ComputeModeSpec {
    #[default]
    Default,
    ExclusiveThread,
    Prohibited,
    ExclusiveProcess,
}

/// `count` consecutive links with the same far end.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkSpec {
    #[serde(default = "one")]
    count: u32,
    remote: RemoteSpec,
    #[serde(default)]
    state: LinkState,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum RemoteSpec {
    /// Index of the peer GPU.
    Gpu(usize),
    /// Index into the fixture's `nvswitches`.
    Nvswitch(usize),
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum LinkState {
    #[default]
    Up,
    Down,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MigSpec {
    mode: MigModeSpec,
    #[serde(default)]
    instances: Vec<GiSpec>,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum MigModeSpec {
    Enabled,
    Disabled,
}

/// A GPU instance to create at start-up, in the order listed (ids follow the driver rules).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GiSpec {
    /// Short profile name, e.g. `3g.40gb`.
    profile: String,
    /// Placement start in memory slices; the driver's default choice when absent.
    #[serde(default)]
    placement: Option<u32>,
    /// CI profile names (`1c.3g.40gb`, `3g.40gb`); absent means one full-size CI.
    #[serde(default)]
    compute_instances: Option<Vec<String>>,
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// Why a fixture was rejected: which file, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixtureError {
    pub origin: String,
    pub path: String,
    pub message: String,
}

impl fmt::Display for FixtureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fixture {}: {}: {}",
            self.origin, self.path, self.message
        )
    }
}

/// Collects the origin so validation code only has to name the field.
struct Checker<'a> {
    origin: &'a str,
}

impl Checker<'_> {
    fn fail<T>(
        &self,
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> Result<T, FixtureError> {
        Err(FixtureError {
            origin: self.origin.to_owned(),
            path: path.into(),
            message: message.into(),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

/// Resolves `NVML_MOCK_FIXTURE`'s value (or the default) to `(origin, text)`.
pub fn read(selector: Option<&str>) -> Result<(String, String), FixtureError> {
    let selector = selector
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_FIXTURE);
    if let Some((name, text)) = BUILTIN.iter().find(|(name, _)| *name == selector) {
        return Ok(((*name).to_owned(), (*text).to_owned()));
    }
    match std::fs::read_to_string(selector) {
        Ok(text) => Ok((selector.to_owned(), text)),
        Err(e) => {
            let names: Vec<_> = BUILTIN.iter().map(|(n, _)| *n).collect();
            Err(FixtureError {
                origin: selector.to_owned(),
                path: "(file)".into(),
                message: format!("{e}; not a built-in fixture either ({})", names.join(", ")),
            })
        }
    }
}

/// Parses and validates a fixture.
pub fn parse(origin: &str, text: &str) -> Result<Node, FixtureError> {
    let check = Checker { origin };
    let spec: FixtureSpec = match serde_json::from_str(text) {
        Ok(spec) => spec,
        Err(e) => {
            let message = e.to_string();
            let missing = message.starts_with("missing field");
            let path = jsonpath::path_at(text, e.line(), e.column(), missing);
            return check.fail(path, message);
        }
    };
    validate(&check, spec)
}

/// Loads the fixture a selector names.
pub fn load(selector: Option<&str>) -> Result<Node, FixtureError> {
    let (origin, text) = read(selector)?;
    parse(&origin, &text)
}

fn valid_version(text: &str, min_parts: usize) -> bool {
    let parts: Vec<_> = text.split('.').collect();
    parts.len() >= min_parts
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
}

/// `GPU-` followed by a canonical 8-4-4-4-12 hex UUID, as NVML prints them.
pub fn valid_gpu_uuid(text: &str) -> bool {
    let Some(rest) = text.strip_prefix("GPU-") else {
        return false;
    };
    let groups: Vec<_> = rest.split('-').collect();
    groups.len() == 5
        && groups.iter().zip([8, 4, 4, 4, 12]).all(|(g, n)| {
            g.len() == n
                && g.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        })
}

/// The 16 bytes of a canonical 8-4-4-4-12 lower-case hex UUID.
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let groups: Vec<_> = text.split('-').collect();
    let canonical = groups.len() == 5
        && groups.iter().zip([8, 4, 4, 4, 12]).all(|(g, n)| {
            g.len() == n
                && g.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        });
    if !canonical {
        return None;
    }
    let hex: String = groups.concat();
    let mut bytes = [0u8; 16];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(bytes)
}

/// Parses a `/sys`-style CPU list (`0-3,8,10-11`).
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if a > b || b >= 4096 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => {
                let c: u32 = part.parse().ok()?;
                if c >= 4096 {
                    return None;
                }
                cpus.push(c);
            }
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    (!cpus.is_empty()).then_some(cpus)
}

fn validate(check: &Checker<'_>, spec: FixtureSpec) -> Result<Node, FixtureError> {
    if !valid_version(&spec.driver_version, 2) {
        return check.fail("driver_version", "expected a version like 570.133.20");
    }
    if !valid_version(&spec.nvml_version, 3) {
        return check.fail("nvml_version", "expected a version like 12.570.133.20");
    }
    if spec.cuda_driver_version < 1000 {
        return check.fail(
            "cuda_driver_version",
            "expected 1000*major + 10*minor, e.g. 12080",
        );
    }

    let builtin = models::builtin_specs().or_else(|e| check.fail("models", e))?;
    let mut catalog: BTreeMap<String, Model> = BTreeMap::new();
    for (key, model) in &builtin {
        let m = Model::from_spec(key, model)
            .or_else(|(field, why)| check.fail(format!("(built-in model {key}).{field}"), why))?;
        catalog.insert(key.clone(), m);
    }
    for (key, model) in &spec.models {
        let m = Model::from_spec(key, model)
            .or_else(|(field, why)| check.fail(format!("models.{key}.{field}"), why))?;
        catalog.insert(key.clone(), m);
    }

    let mut nvswitches = Vec::new();
    for (i, sw) in spec.nvswitches.iter().enumerate() {
        let Some(address) = PciAddress::parse(&sw.pci_bus_id) else {
            return check.fail(
                format!("nvswitches[{i}].pci_bus_id"),
                "expected 00000000:05:00.0",
            );
        };
        let Some(pci_device_id) = parse_hex_u32(&sw.pci_device_id) else {
            return check.fail(
                format!("nvswitches[{i}].pci_device_id"),
                "expected 0x22A310DE",
            );
        };
        nvswitches.push(NvSwitch {
            address,
            pci_device_id,
        });
    }

    let gpu_count = spec.gpus.len();
    let mut gpus = Vec::new();
    let (mut uuids, mut serials, mut buses, mut minors) = (
        HashSet::new(),
        HashSet::new(),
        HashSet::new(),
        HashSet::new(),
    );
    for (index, g) in spec.gpus.iter().enumerate() {
        let at = |field: &str| format!("gpus[{index}].{field}");
        let Some(model) = catalog.get(&g.model).cloned() else {
            let known: Vec<_> = catalog.keys().map(String::as_str).collect();
            return check.fail(
                at("model"),
                format!("unknown model; known: {}", known.join(", ")),
            );
        };
        if !valid_gpu_uuid(&g.uuid) {
            return check.fail(
                at("uuid"),
                "expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (lower-case hex)",
            );
        }
        if !uuids.insert(g.uuid.clone()) {
            return check.fail(at("uuid"), "duplicate UUID");
        }
        if g.serial.is_empty() || g.serial.len() >= b::NVML_DEVICE_SERIAL_BUFFER_SIZE as usize {
            return check.fail(at("serial"), "must be 1 to 29 characters");
        }
        if !serials.insert(g.serial.clone()) {
            return check.fail(at("serial"), "duplicate serial");
        }
        if g.board_part_number.len() >= b::NVML_DEVICE_PART_NUMBER_BUFFER_SIZE as usize {
            return check.fail(at("board_part_number"), "too long");
        }
        let Some(address) = PciAddress::parse(&g.pci_bus_id) else {
            return check.fail(at("pci_bus_id"), "expected a bus id like 00000000:18:00.0");
        };
        if !buses.insert(address) {
            return check.fail(at("pci_bus_id"), "duplicate PCI bus id");
        }
        let minor_number = g.minor_number.unwrap_or(index as u32);
        if !minors.insert(minor_number) {
            return check.fail(at("minor_number"), "duplicate minor number");
        }
        let Some(cpus) = parse_cpu_list(&g.cpu_affinity) else {
            return check.fail(at("cpu_affinity"), "expected a CPU list like 0-55,112-167");
        };
        let power_limit_mw = g.power_limit_mw.unwrap_or(model.power.default_mw);
        if power_limit_mw < model.power.min_mw || power_limit_mw > model.power.max_mw {
            return check.fail(at("power_limit_mw"), "outside the model's min/max limits");
        }
        let links = build_links(check, index, g, &model, gpu_count, nvswitches.len())?;
        let initial_mig = build_mig(check, index, g, &model)?;
        let fabric = match &g.fabric {
            None => Fabric::NONE,
            Some(spec) => {
                let Some(cluster_uuid) = parse_uuid(&spec.cluster_uuid) else {
                    return check.fail(
                        at("fabric.cluster_uuid"),
                        "expected xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (lower-case hex)",
                    );
                };
                Fabric {
                    cluster_uuid,
                    clique_id: spec.clique_id,
                    state: match spec.state {
                        FabricStateSpec::NotStarted => 1,
                        FabricStateSpec::InProgress => 2,
                        FabricStateSpec::Completed => 3,
                    },
                    status: spec.status,
                }
            }
        };
        let compute_mode = match g.compute_mode {
            ComputeModeSpec::Default => b::nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT,
            ComputeModeSpec::ExclusiveThread => {
                b::nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_THREAD
            }
            ComputeModeSpec::Prohibited => b::nvmlComputeMode_enum_NVML_COMPUTEMODE_PROHIBITED,
            ComputeModeSpec::ExclusiveProcess => {
                b::nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
            }
        };
        gpus.push(Gpu {
            index,
            ecc_enabled: g.ecc_enabled.unwrap_or(model.ecc) && model.ecc,
            model,
            uuid: g.uuid.clone(),
            serial: g.serial.clone(),
            board_part_number: g.board_part_number.clone(),
            address,
            minor_number,
            numa_node: g.numa_node,
            cpus,
            host_bridge: g.pcie.host_bridge.clone(),
            switches: g.pcie.switches.clone(),
            power_limit_mw,
            persistence_mode: g.persistence_mode,
            compute_mode,
            links,
            initial_mig,
            fabric,
        });
    }

    // A GPU-to-GPU link must be seen from both ends, or P2P answers would be asymmetric.
    for gpu in &gpus {
        for (l, link) in gpu.links.iter().enumerate() {
            if let Remote::Gpu(peer) = link.remote {
                let back = gpus[peer]
                    .links
                    .iter()
                    .any(|x| x.remote == Remote::Gpu(gpu.index));
                if !back {
                    return check.fail(
                        format!("gpus[{}].nvlinks", gpu.index),
                        format!("link {l} goes to GPU {peer}, which has no link back"),
                    );
                }
            }
        }
    }

    Ok(Node {
        origin: check.origin.to_owned(),
        driver_version: spec.driver_version,
        nvml_version: spec.nvml_version,
        cuda_driver_version: spec.cuda_driver_version,
        seed: spec.seed,
        nvswitches,
        gpus,
    })
}

fn build_links(
    check: &Checker<'_>,
    index: usize,
    g: &GpuSpec,
    model: &Model,
    gpu_count: usize,
    switch_count: usize,
) -> Result<Vec<Link>, FixtureError> {
    let capacity = model.nvlink.map_or(0, |n| n.links) as usize;
    let mut links = Vec::new();
    for (i, spec) in g.nvlinks.iter().enumerate() {
        let at = format!("gpus[{index}].nvlinks[{i}]");
        let remote = match spec.remote {
            RemoteSpec::Gpu(peer) if peer >= gpu_count || peer == index => {
                return check.fail(
                    format!("{at}.remote.gpu"),
                    "not another GPU of this fixture",
                );
            }
            RemoteSpec::Nvswitch(sw) if sw >= switch_count => {
                return check.fail(
                    format!("{at}.remote.nvswitch"),
                    "no such entry in nvswitches",
                );
            }
            RemoteSpec::Gpu(peer) => Remote::Gpu(peer),
            RemoteSpec::Nvswitch(sw) => Remote::NvSwitch(sw),
        };
        for _ in 0..spec.count {
            links.push(Link {
                remote,
                up: spec.state == LinkState::Up,
            });
        }
        if links.len() > capacity {
            return check.fail(
                at,
                format!(
                    "model {} has {capacity} NVLinks, fixture declares more",
                    model.key
                ),
            );
        }
    }
    links.resize(
        capacity,
        Link {
            remote: Remote::None,
            up: false,
        },
    );
    Ok(links)
}

fn build_mig(
    check: &Checker<'_>,
    index: usize,
    g: &GpuSpec,
    model: &Model,
) -> Result<MigState, FixtureError> {
    let at = |field: &str| format!("gpus[{index}].mig{field}");
    let Some(spec) = &g.mig else {
        return Ok(MigState::default());
    };
    let Some(table) = model.mig else {
        return check.fail(at(""), format!("model {} is not MIG capable", model.key));
    };
    let mode = match spec.mode {
        MigModeSpec::Enabled => b::NVML_DEVICE_MIG_ENABLE,
        MigModeSpec::Disabled => b::NVML_DEVICE_MIG_DISABLE,
    };
    let mut state = MigState {
        current: mode,
        pending: mode,
        gpu_instances: Vec::new(),
    };
    if mode == b::NVML_DEVICE_MIG_DISABLE && !spec.instances.is_empty() {
        return check.fail(at(".instances"), "instances need mode \"enabled\"");
    }
    for (i, gi) in spec.instances.iter().enumerate() {
        let here = format!(".instances[{i}]");
        let Some(profile) = table.by_name(&gi.profile) else {
            let names: Vec<_> = table.profiles.iter().map(|p| p.name).collect();
            return check.fail(
                at(&format!("{here}.profile")),
                format!("unknown profile; known: {}", names.join(", ")),
            );
        };
        let gi_id = state
            .create_gi(table, profile.id, gi.placement)
            .or_else(|_| check.fail(at(&here), "does not fit (placement or capacity)"))?;
        let ci_names = gi
            .compute_instances
            .clone()
            .unwrap_or_else(|| vec![profile.name.to_owned()]);
        let offered = crate::profiles::ci_profiles(table, profile);
        for (c, name) in ci_names.iter().enumerate() {
            let path = at(&format!("{here}.compute_instances[{c}]"));
            let Some(ci) = offered.iter().find(|p| &p.name == name) else {
                let names: Vec<_> = offered.iter().map(|p| p.name.as_str()).collect();
                return check.fail(
                    path,
                    format!("unknown compute profile; known: {}", names.join(", ")),
                );
            };
            state
                .create_ci(table, gi_id, ci.id, None)
                .or_else(|_| check.fail(path, "does not fit"))?;
        }
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_fixture_loads() {
        for (name, _) in BUILTIN {
            let node = load(Some(name)).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(node.origin, *name);
        }
        assert_eq!(load(None).unwrap().origin, DEFAULT_FIXTURE);
    }

    #[test]
    fn errors_name_the_field() {
        let base = r#"{"driver_version": "570.133.20", "nvml_version": "12.570.133.20",
            "cuda_driver_version": 12080, "seed": 1, "gpus": [GPU]}"#;
        let gpu = r#"{"model": "L40S", "uuid": "GPU-00000000-0000-0000-0000-000000000001",
            "serial": "1", "board_part_number": "x", "pci_bus_id": "0000:01:00.0",
            "numa_node": 0, "cpu_affinity": "0-3" EXTRA}"#;
        let with = |extra: &str| base.replace("GPU", &gpu.replace("EXTRA", extra));
        assert!(parse("t.json", &with("")).is_ok());
        let e = parse("t.json", &with(r#", "colour": "green""#)).unwrap_err();
        assert_eq!(e.path, "gpus[0].colour");
        assert!(
            e.to_string()
                .starts_with("fixture t.json: gpus[0].colour: unknown field")
        );
        let e = parse("t.json", &with(r#", "nvlinks": [{"remote": {"gpu": 0}}]"#)).unwrap_err();
        assert_eq!(e.path, "gpus[0].nvlinks[0].remote.gpu");
        let e = parse("t.json", &with(r#", "mig": {"mode": "enabled"}"#)).unwrap_err();
        assert_eq!(e.path, "gpus[0].mig");
        let e = parse("t.json", &with(r#", "numa_node": "zero""#)).unwrap_err();
        assert_eq!(e.path, "gpus[0].numa_node");
        let e = parse(
            "t.json",
            &with(r#", "fabric": {"cluster_uuid": "not-a-uuid", "clique_id": 1}"#),
        )
        .unwrap_err();
        assert_eq!(e.path, "gpus[0].fabric.cluster_uuid");
        let e = parse(
            "t.json",
            &with(r#", "fabric": {"cluster_uuid": "00000000-0000-0000-0000-000000000001", "clique_id": 1, "state": "done"}"#),
        )
        .unwrap_err();
        assert_eq!(e.path, "gpus[0].fabric.state");
    }

    #[test]
    fn fabric_defaults_to_none_and_parses_when_given() {
        let node = load(Some("dgx-h100")).unwrap();
        assert!(node.gpus.iter().all(|g| g.fabric == Fabric::NONE));
        let node = load(Some("gb200-nvl")).unwrap();
        let f = node.gpus[0].fabric;
        assert_eq!((f.state, f.status, f.clique_id), (3, 0, 32766));
        assert_eq!(f.cluster_uuid[..4], [0x3f, 0x5a, 0x0c, 0x2e]);
        assert_eq!(parse_uuid("3f5a0c2e-9b1d-4e7a-8c63-1d2e4f5a6b7C"), None);
    }

    #[test]
    fn cpu_lists_parse_like_sysfs() {
        assert_eq!(parse_cpu_list("0-2,8"), Some(vec![0, 1, 2, 8]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list(""), None);
    }
}
