//! Device nodes: what a container's device list and the CDI spec point at must exist on the
//! host. On a fresh node they appear only after something (nvidia-smi, nvidia-ctk) creates them.

use crate::doctor::env::Env;
use crate::doctor::host::HostRoot;
use crate::doctor_report::Verdict;

/// The control device nodes: path, the driver whose major they have, minor.
const CONTROL: [(&str, &str, u32); 4] = [
    ("/dev/nvidiactl", "nvidia", 255),
    ("/dev/nvidia-modeset", "nvidia", 254),
    ("/dev/nvidia-uvm", "nvidia-uvm", 0),
    ("/dev/nvidia-uvm-tools", "nvidia-uvm", 1),
];

/// The driver's own tools make these nodes: nvidia-smi (any run) the control node and one per
/// GPU, nvidia-modprobe the unified-memory pair; a gpud node needs no NVIDIA toolkit binary.
const CREATE_FIX: &str = "create them: run nvidia-smi once (it makes /dev/nvidiactl and /dev/nvidia<N>), and nvidia-modprobe -u -c 0 for /dev/nvidia-uvm and /dev/nvidia-uvm-tools";

/// `devices.control`
pub fn control(env: &Env) -> Verdict {
    let missing: Vec<&str> = CONTROL
        .iter()
        .map(|(path, _, _)| *path)
        .filter(|path| !env.host.exists(path))
        .collect();
    if missing.is_empty() {
        Verdict::ok(
            "/dev/nvidiactl, /dev/nvidia-modeset, /dev/nvidia-uvm, /dev/nvidia-uvm-tools exist",
        )
    } else {
        Verdict::fail(format!("missing {}", missing.join(", ")), CREATE_FIX)
    }
}

/// `devices.gpus`
pub fn gpus(env: &Env) -> Verdict {
    let Some(snapshot) = env.snapshot() else {
        return env.no_nvml();
    };
    let mut missing = Vec::new();
    for gpu in &snapshot.gpus {
        if let Some(minor) = gpu.minor_number
            && !env.host.exists(&format!("/dev/nvidia{minor}"))
        {
            missing.push(format!("/dev/nvidia{minor} (GPU {})", gpu.index));
        }
    }
    if snapshot.gpus.is_empty() {
        Verdict::skip("NVML reports no GPUs")
    } else if missing.is_empty() {
        Verdict::ok(format!(
            "/dev/nvidia<N> exists for all {} GPUs",
            snapshot.gpus.len()
        ))
    } else {
        Verdict::fail(format!("missing {}", missing.join(", ")), CREATE_FIX)
    }
}

/// The `nvidia` major (renamed from `nvidia-frontend` in 550.40).
fn nvidia_major(host: &HostRoot) -> Option<u32> {
    host.char_major("nvidia")
        .or_else(|| host.char_major("nvidia-frontend"))
}

/// `devices.char-links`
pub fn char_links(env: &Env) -> Verdict {
    let Some(nvidia) = nvidia_major(&env.host) else {
        return Verdict::skip("no nvidia major in /proc/devices (see driver.modules)");
    };
    let uvm = env.host.char_major("nvidia-uvm");
    let mut nodes: Vec<(String, u32, u32)> = CONTROL
        .iter()
        .filter_map(|(path, driver, minor)| {
            let major = if *driver == "nvidia" {
                Some(nvidia)
            } else {
                uvm
            };
            Some(((*path).to_owned(), major?, *minor))
        })
        .collect();
    if let Some(snapshot) = env.snapshot() {
        nodes.extend(
            snapshot
                .gpus
                .iter()
                .filter_map(|g| g.minor_number)
                .map(|minor| (format!("/dev/nvidia{minor}"), nvidia, minor)),
        );
    }
    let missing: Vec<(String, String)> = nodes
        .iter()
        .filter(|(path, _, _)| env.host.exists(path))
        .map(|(path, major, minor)| (path.clone(), format!("/dev/char/{major}:{minor}")))
        .filter(|(_, link)| !env.host.exists(link))
        .collect();
    if missing.is_empty() {
        return Verdict::ok("every NVIDIA device node has its /dev/char link");
    }
    let links: Vec<&str> = missing.iter().map(|(_, link)| link.as_str()).collect();
    // The exact commands: links relative to /dev/char, as udev makes them.
    let commands: Vec<String> = missing
        .iter()
        .map(|(path, link)| {
            let name = path.trim_start_matches("/dev/");
            format!("ln -s ../{name} {link}")
        })
        .collect();
    Verdict::warn(
        format!("missing {}", links.join(", ")),
        format!(
            "create them: {} (without them systemd's cgroup driver can cut containers off their GPUs)",
            commands.join("; ")
        ),
    )
}

/// `devices.mig-caps`
pub fn mig_caps(env: &Env) -> Verdict {
    let Some(snapshot) = env.snapshot() else {
        return env.no_nvml();
    };
    let mig_gpus: Vec<_> = snapshot.gpus.iter().filter(|g| g.mig.enabled).collect();
    if mig_gpus.is_empty() {
        return Verdict::skip("no GPU has MIG enabled");
    }
    let capabilities = env.host.path("/proc/driver/nvidia/capabilities");
    let caps = match crate::cdi::discover::mig_caps(&capabilities) {
        Ok(caps) => caps,
        Err(err) => {
            return Verdict::fail(
                format!("cannot read the MIG capabilities: {err}"),
                "check that the nvidia module is loaded and /proc/driver/nvidia is readable",
            );
        }
    };
    let mut missing = Vec::new();
    let mut node = |minor: u32| {
        let path = format!("/dev/nvidia-caps/nvidia-cap{minor}");
        if !env.host.exists(&path) && !missing.contains(&path) {
            missing.push(path);
        }
    };
    // config (1) and monitor (2) are needed by whoever manages MIG.
    node(1);
    node(2);
    let mut unknown = Vec::new();
    for gpu in &mig_gpus {
        let Some(gpu_minor) = gpu.minor_number else {
            continue;
        };
        for device in &gpu.mig.devices {
            let (gi, ci) = (device.gpu_instance_id, device.compute_instance_id);
            match (
                caps.gpu_instance(gpu_minor, gi),
                caps.compute_instance(gpu_minor, gi, ci),
            ) {
                (Some(gi_minor), Some(ci_minor)) => {
                    node(gi_minor);
                    node(ci_minor);
                }
                _ => unknown.push(caps.compute_instance_file(gpu_minor, gi, ci)),
            }
        }
    }
    if !unknown.is_empty() {
        return Verdict::fail(
            format!("no capability entry {}", unknown.join(", ")),
            "the driver's capability tree does not match NVML: reload the nvidia module or reboot",
        );
    }
    if missing.is_empty() {
        Verdict::ok("capability device nodes exist for every MIG device")
    } else {
        Verdict::fail(
            format!("missing {}", missing.join(", ")),
            "create them: nvidia-modprobe -f /proc/driver/nvidia/capabilities/<the instance's access file> for each, as the container runtime does (MIG containers cannot open their instance without them)",
        )
    }
}
