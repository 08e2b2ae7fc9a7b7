//! The driver: NVML loads, the kernel module and the library are one version, the modules
//! containers need are loaded.

use crate::doctor::env::{Driver, Env};
use crate::doctor::host::HostRoot;
use crate::doctor_report::Verdict;

/// The modules the NVIDIA container toolkit loads for every GPU container.
const REQUIRED_MODULES: [&str; 3] = ["nvidia", "nvidia_uvm", "nvidia_modeset"];

const HUNG_FIX: &str = "check dmesg for NVRM errors; reboot the node if the driver hangs";

const INSTALL_FIX: &str = "install the NVIDIA driver (or start the driver container), or point --nvml-lib at libnvidia-ml.so.1";

/// `driver.nvml`
pub fn nvml(env: &Env) -> Verdict {
    match &env.driver {
        Driver::Unavailable(why) => Verdict::fail(format!("NVML did not load: {why}"), INSTALL_FIX),
        Driver::Loaded { unlisted, .. } if !unlisted.named.is_empty() => Verdict::fail(
            format!(
                "--gpu names {}, which NVML does not list (it lists {})",
                gpu_list(&unlisted.named),
                gpu_list(&unlisted.listed)
            ),
            "name the GPUs by the indices NVML lists (gpud inventory --format table shows them)",
        ),
        Driver::Loaded {
            path,
            preflight: Err(why),
            snapshot: Ok(_),
            ..
        } => Verdict::fail(
            format!(
                "NVML loaded from {} but cannot read the GPUs' health: {why}",
                path.display()
            ),
            HUNG_FIX,
        ),
        Driver::Loaded { path, snapshot, .. } => match snapshot {
            Ok(snapshot) => Verdict::ok(format!(
                "NVML {} loaded from {}",
                snapshot
                    .node
                    .nvml_version
                    .as_deref()
                    .unwrap_or("(version unknown)"),
                path.display()
            )),
            Err(why) => Verdict::fail(
                format!(
                    "NVML loaded from {} but cannot read the node: {why}",
                    path.display()
                ),
                HUNG_FIX,
            ),
        },
    }
}

/// "GPU 9", "GPUs 0, 1, 2", or "none".
fn gpu_list(indices: &[u32]) -> String {
    let names: Vec<String> = indices.iter().map(u32::to_string).collect();
    match names.as_slice() {
        [] => "none".to_owned(),
        [one] => format!("GPU {one}"),
        _ => format!("GPUs {}", names.join(", ")),
    }
}

/// The version in `/proc/driver/nvidia/version`'s NVRM line, and whether it is the open
/// kernel module.
pub fn kernel_module(host: &HostRoot) -> Option<(String, bool)> {
    crate::nvml::library::nvrm_version(&host.read("/proc/driver/nvidia/version")?)
}

/// `driver.version`
pub fn version(env: &Env) -> Verdict {
    let Some(snapshot) = env.snapshot() else {
        return env.no_nvml();
    };
    let library = &snapshot.node.driver_version;
    let cuda = snapshot
        .node
        .cuda_driver_version
        .as_deref()
        .unwrap_or("unknown");
    match kernel_module(&env.host) {
        None => Verdict::fail(
            format!(
                "driver {library} (CUDA {cuda}) but /proc/driver/nvidia/version is missing: the kernel module is not loaded"
            ),
            "load it: modprobe nvidia (or check the driver container's log)",
        ),
        Some((module, _)) if module != *library => Verdict::fail(
            format!(
                "kernel module {module} but NVML library {library}: containers fail with a driver/library version mismatch"
            ),
            "reboot the node (or reload the nvidia modules) so the kernel module matches the installed driver",
        ),
        Some(_) => Verdict::ok(format!(
            "driver {library}, CUDA {cuda}; kernel module {library}"
        )),
    }
}

/// `driver.modules`
pub fn modules(env: &Env) -> Verdict {
    let Some(loaded) = env.host.modules() else {
        return Verdict::skip("cannot read /proc/modules");
    };
    let missing: Vec<&str> = REQUIRED_MODULES
        .iter()
        .copied()
        .filter(|m| !loaded.contains(*m))
        .collect();
    if !missing.is_empty() {
        return Verdict::fail(
            format!("not loaded: {}", missing.join(", ")),
            format!("load them: modprobe -a {}", missing.join(" ")),
        );
    }
    let versions: Vec<(&str, String)> = REQUIRED_MODULES
        .iter()
        .filter_map(|m| {
            let text = env.host.read(&format!("/sys/module/{m}/version"))?;
            Some((*m, text.trim().to_owned()))
        })
        .collect();
    // driver.version compares the kernel module with the library; here the modules are
    // compared with each other (one stale module after a partial upgrade).
    let expected = versions.first().map(|(_, v)| v.clone());
    let differing: Vec<String> = versions
        .iter()
        .filter(|(_, v)| Some(v) != expected.as_ref())
        .map(|(m, v)| format!("{m} {v}"))
        .collect();
    match (differing.is_empty(), expected) {
        (false, Some(expected)) => Verdict::fail(
            format!("{} differ from nvidia {expected}", differing.join(", ")),
            "reboot the node (or unload and reload every nvidia module) so all modules come from one driver",
        ),
        (_, Some(expected)) if !versions.is_empty() => Verdict::ok(format!(
            "{} loaded, version {expected}",
            REQUIRED_MODULES.join(", ")
        )),
        _ => Verdict::ok(format!("{} loaded", REQUIRED_MODULES.join(", "))),
    }
}
