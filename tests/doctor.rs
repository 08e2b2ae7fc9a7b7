//! `gpud doctor` end to end: the real binary against the simulated NVML and a fake host root
//! built in code, healthy by default with one fault at a time. Each case asserts the exact
//! finding and fix of the check it breaks, and that every other check stays as it was.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::Node;
use common::host::{CONTAINERD_NVIDIA, Host, cdi_spec, uuids};
use serde_json::Value;

const CONTAINERD_PLAIN: &str = r#"version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
"#;

/// One doctor run: exit code and the report's checks by id.
struct Run {
    code: i32,
    checks: BTreeMap<String, Value>,
}

impl Run {
    fn status(&self, id: &str) -> &str {
        self.checks[id]["status"].as_str().unwrap()
    }

    fn found(&self, id: &str) -> &str {
        self.checks[id]["found"].as_str().unwrap()
    }

    fn fix(&self, id: &str) -> &str {
        self.checks[id]["fix"].as_str().unwrap_or("")
    }

    /// Every check that is neither ok nor skip, as `id status`.
    fn problems(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|(_, c)| !matches!(c["status"].as_str(), Some("ok" | "skip")))
            .map(|(id, c)| format!("{id} {}", c["status"].as_str().unwrap()))
            .collect()
    }

    /// Asserts that `id` is the only problem, with exactly this status, finding and fix.
    fn only_problem(&self, id: &str, status: &str, found: &str, fix: &str) {
        assert_eq!(self.problems(), vec![format!("{id} {status}")]);
        assert_eq!(self.found(id), found);
        assert_eq!(self.fix(id), fix);
        assert_eq!(self.code, if status == "fail" { 2 } else { 1 });
    }
}

fn doctor(node: &Node, host: &Host, extra: &[&str]) -> Run {
    doctor_with_env(node, host, extra, &[])
}

/// [`doctor`] with these environment variables set as well.
fn doctor_with_env(node: &Node, host: &Host, extra: &[&str], vars: &[(&str, &str)]) -> Run {
    let root = host.dir.path().to_str().unwrap().to_owned();
    let kmsg = host.path("kmsg");
    let mut args = vec![
        "doctor",
        "--json",
        "--host-root",
        &root,
        "--kmsg",
        kmsg.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = node
        .gpud(&args)
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(report["schema"], "gpud.doctor/v1");
    let checks = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["id"].as_str().unwrap().to_owned(), c.clone()))
        .collect();
    Run {
        code: out.status.code().unwrap(),
        checks,
    }
}

#[test]
fn healthy_dgx_h100_is_clean() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    let run = doctor(&node, &host, &[]);
    assert_eq!(run.problems(), Vec::<String>::new());
    assert_eq!(run.code, 0);
    assert_eq!(run.checks.len(), 33);
    assert_eq!(
        run.found("driver.version"),
        "driver 570.133.20, CUDA 12.8; kernel module 570.133.20"
    );
    assert_eq!(
        run.found("driver.modules"),
        "nvidia, nvidia_uvm, nvidia_modeset loaded, version 570.133.20"
    );
    assert_eq!(
        run.found("devices.gpus"),
        "/dev/nvidia<N> exists for all 8 GPUs"
    );
    assert_eq!(
        run.found("devices.char-links"),
        "every NVIDIA device node has its /dev/char link"
    );
    assert_eq!(run.found("gpu.present"), "8 GPUs answer");
    assert_eq!(run.found("gpu.nvlink"), "all 144 NVLinks up");
    assert_eq!(
        run.found("fabric.state"),
        "NVSwitch system; nv-fabricmanager is running"
    );
    assert_eq!(
        run.found("runtime.containerd"),
        "containerd: runtime \"nvidia\" → /usr/bin/nvidia-container-runtime"
    );
    assert_eq!(
        run.found("runtime.cdi-spec"),
        "/var/run/cdi/nvidia.yaml lists every GPU and MIG device (8 devices)"
    );
    assert_eq!(
        run.found("kubelet.plugin"),
        "plugin socket nvidia-gpu.sock in /var/lib/kubelet/device-plugins"
    );
    assert_eq!(run.found("gpu.xid"), "no XIDs in the kernel log since boot");
    assert_eq!(
        run.found("mps.compute-mode"),
        "no GPU is in compute mode EXCLUSIVE_PROCESS"
    );
    // Every skip says why.
    for (id, check) in &run.checks {
        if check["status"] == "skip" {
            assert!(!check["found"].as_str().unwrap().is_empty(), "{id}");
        }
    }
    assert_eq!(
        run.found("gpu.recovery"),
        "NVML asks for no recovery action"
    );
    assert_eq!(
        run.found("gpu.persistence"),
        "persistence mode on for every GPU"
    );
}

#[test]
fn table_output_without_a_terminal_has_no_colour() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    let root = host.dir.path().to_str().unwrap();
    let out = node.run(&[
        "doctor",
        "--host-root",
        root,
        "--only",
        "selinux,driver.modules",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "CHECK           STATUS  FOUND\n\
         driver.modules  ok      nvidia, nvidia_uvm, nvidia_modeset loaded, version 570.133.20\n\
         selinux.mode    ok      SELinux is not enabled\n\
         \n2 ok, 0 warn, 0 fail, 0 skip\n"
    );
}

#[test]
fn unknown_check_names_are_usage_errors() {
    let node = Node::new("dgx-h100");
    let out = node.run(&["doctor", "--only", "gpus"]);
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.starts_with("gpud doctor: unknown check or group \"gpus\" (groups: driver, devices, gpu, mig, fabric, mps, runtime, kubelet, gpudirect, selinux, config;"), "{stderr}");
}

#[test]
fn lost_gpu() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    node.inject("lost 3");
    let run = doctor(&node, &host, &[]);
    run.only_problem(
        "gpu.present",
        "fail",
        "GPU 3 fell off the bus (NVML_ERROR_GPU_IS_LOST)",
        "drain the node and reboot it; if it happens again, have the GPU and its slot inspected",
    );
}

#[test]
fn pending_ecc_mode() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    node.inject("ecc-pending 0 off");
    doctor(&node, &host, &[]).only_problem(
        "gpu.ecc",
        "warn",
        "GPU 0: ECC enabled now, disabled after the next reboot",
        "reboot the node to apply the pending ECC mode (or set it back with nvidia-smi -e)",
    );
}

#[test]
fn pending_row_remap_and_remap_failure() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    node.inject("remap-pending 5");
    doctor(&node, &host, &[]).only_problem(
        "gpu.memory",
        "warn",
        "GPU 5: a row remap is pending",
        "drain the GPU and reset it (nvidia-smi -r -i <index>) or reboot, so the repair takes effect",
    );
    node.inject("remap-failure 5");
    doctor(&node, &host, &[]).only_problem(
        "gpu.memory",
        "fail",
        "GPU 5: row remapping failed",
        "replace the GPU: its memory has no spare rows left and cannot be repaired in the field",
    );
}

#[test]
fn persistence_mode_off() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture_with(dir.path(), "dgx-h100", |f| {
        for gpu in [1, 6] {
            f["gpus"][gpu]["persistence_mode"] = false.into();
        }
    });
    let node = Node::new(&fixture);
    let host = Host::healthy(&node);
    doctor(&node, &host, &[]).only_problem(
        "gpu.persistence",
        "warn",
        "persistence mode off on GPU 1, 6",
        "run nvidia-persistenced (or nvidia-smi -pm 1): without it the driver tears the GPU down between jobs",
    );
}

#[test]
fn recovery_action_asked_for() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    node.inject("recovery-action 3 drain-p2p");
    doctor(&node, &host, &[]).only_problem(
        "gpu.recovery",
        "warn",
        "GPU 3: NVML asks for draining peer-to-peer traffic",
        "drain the node's GPU workloads, then do draining peer-to-peer traffic",
    );
    node.inject("recovery-action 4 reset");
    doctor(&node, &host, &[]).only_problem(
        "gpu.recovery",
        "fail",
        "GPU 3: NVML asks for draining peer-to-peer traffic; GPU 4: NVML asks for a GPU reset",
        "drain the node's GPU workloads, then do a GPU reset",
    );
    node.inject("recover 3");
    node.inject("recover 4");
    let run = doctor(&node, &host, &["--only", "gpu.recovery"]);
    assert_eq!(run.problems(), Vec::<String>::new());
    assert_eq!(
        run.found("gpu.recovery"),
        "NVML asks for no recovery action"
    );
}

/// Runs `doctor` and returns it with how long it took, failing if it takes longer than
/// `limit` (it would otherwise hang the test).
fn doctor_within(node: &Node, host: &Host, extra: &[&str], limit: Duration) -> (Run, Duration) {
    let began = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| tx.send(doctor(node, host, extra)).unwrap());
        let run = rx
            .recv_timeout(limit)
            .unwrap_or_else(|_| panic!("gpud doctor {extra:?} still runs after {limit:?}"));
        (run, began.elapsed())
    })
}

#[test]
fn a_hung_nvml_call_fails_driver_nvml_and_does_not_hang_the_doctor() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    // Every GPU health query starts with persistence mode: it never returns.
    node.inject("hang nvmlDeviceGetPersistenceMode");
    let (run, took) = doctor_within(
        &node,
        &host,
        &["--only", "driver.nvml,gpu", "--timeout", "1s"],
        Duration::from_secs(60),
    );
    println!("doctor with a hung NVML call (1s timeout) took {took:?}");
    assert_eq!(run.problems(), vec!["driver.nvml fail"]);
    assert_eq!(run.code, 2);
    let found = run.found("driver.nvml");
    assert!(found.starts_with("NVML loaded from "), "{found}");
    assert!(
        found.ends_with(
            " but cannot read the GPUs' health: NVML health queries did not finish within 1s"
        ),
        "{found}"
    );
    assert_eq!(
        run.fix("driver.nvml"),
        "check dmesg for NVRM errors; reboot the node if the driver hangs"
    );
    for id in ["gpu.persistence", "gpu.ecc", "gpu.recovery"] {
        assert_eq!(run.status(id), "skip", "{id}");
        assert_eq!(
            run.found(id),
            "needs NVML, which failed: NVML health queries did not finish within 1s (see driver.nvml)",
            "{id}"
        );
    }
}

#[test]
fn a_hung_file_read_fails_only_its_check() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    // A FIFO nobody writes: opening it blocks forever, like a read on a hung mount.
    let fifo = host.path("sys/fs/selinux/enforce");
    std::fs::create_dir_all(fifo.parent().unwrap()).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let (run, took) = doctor_within(
        &node,
        &host,
        &["--only", "selinux,driver.modules", "--timeout", "1s"],
        Duration::from_secs(60),
    );
    println!("doctor with a hung file read (1s timeout) took {took:?}");
    run.only_problem(
        "selinux.mode",
        "fail",
        "did not finish within 1s (a driver call or a file read hangs)",
        "look for a GPU that fell off the bus (dmesg | grep -i xid) or a hung mount; reboot the node if NVML hangs",
    );
    assert_eq!(run.status("driver.modules"), "ok");
}

#[test]
fn degraded_pcie_link() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    node.inject("pcie-link 2 5 8");
    doctor(&node, &host, &[]).only_problem(
        "gpu.pcie",
        "warn",
        "GPU 2: PCIe Gen5 x8, maximum Gen5 x16",
        "reseat the GPU and check its riser, slot and BIOS PCIe settings: a degraded link cuts host-to-GPU bandwidth",
    );
}

#[test]
fn nvlink_down() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    node.inject("nvlink-down 1 3");
    doctor(&node, &host, &[]).only_problem(
        "gpu.nvlink",
        "fail",
        "GPU 1: NVLink 3 down",
        "drain the GPU and reset it; if the link stays down, inspect the NVLink cabling or baseboard (nvidia-smi nvlink -s)",
    );
}

/// `--gpu` judges only the GPUs named: GPU 1's link is not GPU 4's problem, and a GPU NVML
/// does not list is a failure naming the ones it does.
#[test]
fn the_per_gpu_checks_judge_only_the_gpus_named() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    node.inject("nvlink-down 1 3");
    let others = doctor(
        &node,
        &host,
        &["--only", "gpu.nvlink,gpu.present", "--gpu", "4,5"],
    );
    assert_eq!(others.problems(), Vec::<String>::new());
    assert_eq!(others.found("gpu.present"), "2 GPUs answer");
    assert_eq!(others.found("gpu.nvlink"), "all 36 NVLinks up");
    doctor(&node, &host, &["--only", "gpu.nvlink", "--gpu", "1"]).only_problem(
        "gpu.nvlink",
        "fail",
        "GPU 1: NVLink 3 down",
        "drain the GPU and reset it; if the link stays down, inspect the NVLink cabling or baseboard (nvidia-smi nvlink -s)",
    );
    // A mistyped index is the user's to fix, not the driver's: no word of dmesg or hangs.
    doctor(&node, &host, &["--only", "gpu.nvlink", "--gpu", "9"]).only_problem(
        "driver.nvml",
        "fail",
        "--gpu names GPU 9, which NVML does not list (it lists GPUs 0, 1, 2, 3, 4, 5, 6, 7)",
        "name the GPUs by the indices NVML lists (gpud inventory --format table shows them)",
    );
}

#[test]
fn hot_gpu_is_throttled() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    node.inject("temp 4 95");
    let run = doctor(&node, &host, &["--only", "gpu"]);
    assert_eq!(
        run.problems(),
        vec!["gpu.temperature fail", "gpu.throttle warn"]
    );
    assert!(
        run.found("gpu.temperature")
            .starts_with("GPU 4: 95 °C, slowdown at "),
        "{}",
        run.found("gpu.temperature")
    );
    assert_eq!(
        run.found("gpu.throttle"),
        "GPU 4: software thermal slowdown, hardware thermal slowdown"
    );
}

#[test]
fn xids_in_the_kernel_log() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    host.write(
        "kmsg",
        "[  12.5] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n\
         [  13.1] NVRM: Xid (PCI:0000:2a:00): 13, pid=4242, name=python, Graphics Exception\n\
         [  13.2] NVRM: Xid (PCI:0000:2a:00): 13, pid=4242, name=python, Graphics Exception\n",
    );
    let run = doctor(&node, &host, &[]);
    assert_eq!(run.problems(), vec!["gpu.xid fail"]);
    let found = run.found("gpu.xid");
    assert!(found.starts_with("GPU 0: XID 79 "), "{found}");
    assert!(
        found.contains("; GPU 1: XID 13 ") && found.ends_with(" (2 times)"),
        "{found}"
    );
    assert_eq!(
        run.fix("gpu.xid"),
        "drain and reboot the node (XID 79, the most severe)"
    );
}

const XID_79_ON_GPU_0: &str = "[  12.5] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n";

#[test]
fn an_xid_the_configured_policy_ignores_is_not_a_failure() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    host.write("kmsg", XID_79_ON_GPU_0);
    let ignored = "GPU 0: XID 79 (ignored by policy) GPU has fallen off the bus";
    // NVIDIA's variable, as the health watcher reads it.
    let run = doctor_with_env(&node, &host, &[], &[("DP_DISABLE_HEALTHCHECKS", "79")]);
    assert_eq!(run.problems(), Vec::<String>::new());
    assert_eq!(run.found("gpu.xid"), ignored);
    assert_eq!(run.code, 0);
    // gpud's config file, as the health watcher reads it.
    host.write(
        "gpud.yaml",
        "version: v1\nhealth:\n  xid:\n    ignore: [79]\n",
    );
    let config = host.path("gpud.yaml");
    let run = doctor(&node, &host, &["--config", config.to_str().unwrap()]);
    assert_eq!(run.problems(), Vec::<String>::new());
    assert_eq!(run.found("gpu.xid"), ignored);
    // An XID ignored by default that the node enables takes the GPU out of service, as in
    // the watcher.
    host.write(
        "kmsg",
        "[  13.1] NVRM: Xid (PCI:0000:2a:00): 13, pid=4242, name=python, Graphics Exception\n",
    );
    let run = doctor_with_env(&node, &host, &[], &[("DP_ENABLE_HEALTHCHECKS", "13")]);
    assert_eq!(run.problems(), vec!["gpu.xid fail"]);
    assert!(
        run.found("gpu.xid").starts_with("GPU 1: XID 13 "),
        "{}",
        run.found("gpu.xid")
    );
}

#[test]
fn stale_cdi_spec() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    let mut uuids = uuids(&node);
    let gone = uuids.pop().unwrap();
    let old_mig = "MIG-0d3a2b1c-aaaa-5bbb-8ccc-000000000001";
    host.write("var/run/cdi/nvidia.yaml", &cdi_spec(&uuids, &[old_mig]));
    doctor(&node, &host, &[]).only_problem(
        "runtime.cdi-spec",
        "fail",
        &format!(
            "/var/run/cdi/nvidia.yaml is stale: lacks {gone}; lists {old_mig} not on this node"
        ),
        "regenerate it after every MIG change, or keep it current: gpud cdi generate --watch --output /var/run/cdi/nvidia.yaml (the toolkit component runs it)",
    );
}

#[test]
fn cdi_spec_naming_a_missing_hook() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    let spec = cdi_spec(&uuids(&node), &[]).replace(
        "containerEdits: {}\n",
        "containerEdits:\n  hooks:\n  - hookName: createContainer\n    path: /usr/local/nvidia/toolkit/nvidia-cdi-hook\n    args: [nvidia-cdi-hook, update-ldcache]\n",
    );
    host.write("var/run/cdi/nvidia.yaml", &spec);
    doctor(&node, &host, &[]).only_problem(
        "runtime.cdi-spec",
        "fail",
        "/var/run/cdi/nvidia.yaml names the hook /usr/local/nvidia/toolkit/nvidia-cdi-hook, which does not exist: every container given a GPU through it fails to start",
        "install gpud's hook (gpud runtime install) and regenerate the spec: gpud cdi generate --output /var/run/cdi/nvidia.yaml",
    );
    // Installed (any executable file at that path, as gpud runtime install leaves it): fine.
    host.write("usr/local/nvidia/toolkit/nvidia-cdi-hook", "");
    let run = doctor(&node, &host, &[]);
    assert_eq!(
        run.status("runtime.cdi-spec"),
        "ok",
        "{}",
        run.found("runtime.cdi-spec")
    );
}

#[test]
fn containerd_without_the_nvidia_runtime() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    host.write("etc/containerd/config.toml", CONTAINERD_PLAIN);
    doctor(&node, &host, &[]).only_problem(
        "runtime.containerd",
        "fail",
        "containerd has no \"nvidia\" runtime and CDI is off (/etc/containerd/config.toml)",
        "run gpud runtime configure --runtime=containerd --enable-cdi --restart-mode=systemd",
    );
    // The runtime in a drop-in the main file imports counts.
    host.write(
        "etc/containerd/config.toml",
        &format!("imports = [\"/etc/containerd/conf.d/*.toml\"]\n{CONTAINERD_PLAIN}"),
    );
    host.write("etc/containerd/conf.d/99-nvidia.toml", CONTAINERD_NVIDIA);
    assert_eq!(doctor(&node, &host, &[]).problems(), Vec::<String>::new());
}

#[test]
fn crio_drop_in() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    host.write(
        "etc/crio/crio.conf.d/99-nvidia.conf",
        "[crio.runtime.runtimes.nvidia]\nruntime_path = \"/usr/bin/nvidia-container-runtime\"\nruntime_type = \"oci\"\n",
    );
    let run = doctor(&node, &host, &["--only", "runtime.crio"]);
    assert_eq!(run.status("runtime.crio"), "ok");
    assert_eq!(
        run.found("runtime.crio"),
        "CRI-O: CDI always on; runtime \"nvidia\" → /usr/bin/nvidia-container-runtime"
    );
    host.remove("usr/bin/nvidia-container-runtime");
    let run = doctor(&node, &host, &["--only", "runtime.crio"]);
    run.only_problem(
        "runtime.crio",
        "fail",
        "CRI-O runtime \"nvidia\" (/etc/crio/crio.conf.d/99-nvidia.conf) runs /usr/bin/nvidia-container-runtime, which does not exist",
        "fix runtime_path and restart CRI-O, or drop the entry: CRI-O reads CDI specs without it",
    );
}

#[test]
fn missing_device_nodes() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    host.remove("dev/nvidia-uvm");
    host.remove("dev/nvidia-uvm-tools");
    doctor(&node, &host, &[]).only_problem(
        "devices.control",
        "fail",
        "missing /dev/nvidia-uvm, /dev/nvidia-uvm-tools",
        "create them: run nvidia-smi once (it makes /dev/nvidiactl and /dev/nvidia<N>), and nvidia-modprobe -u -c 0 for /dev/nvidia-uvm and /dev/nvidia-uvm-tools",
    );
    let host = Host::healthy(&node);
    host.remove("dev/char/195:6");
    doctor(&node, &host, &[]).only_problem(
        "devices.char-links",
        "warn",
        "missing /dev/char/195:6",
        "create them: ln -s ../nvidia6 /dev/char/195:6 (without them systemd's cgroup driver can cut containers off their GPUs)",
    );
}

#[test]
fn kernel_module_differs_from_the_library() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    host.write(
        "proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  565.57.01  Release Build\n",
    );
    doctor(&node, &host, &[]).only_problem(
        "driver.version",
        "fail",
        "kernel module 565.57.01 but NVML library 570.133.20: containers fail with a driver/library version mismatch",
        "reboot the node (or reload the nvidia modules) so the kernel module matches the installed driver",
    );
    let host = Host::healthy(&node);
    host.write("proc/modules", "nvidia 1 0 - Live 0x0\n");
    doctor(&node, &host, &[]).only_problem(
        "driver.modules",
        "fail",
        "not loaded: nvidia_uvm, nvidia_modeset",
        "load them: modprobe -a nvidia_uvm nvidia_modeset",
    );
}

#[test]
fn nvidia_drm_on_a_mig_node() {
    let node = Node::new("a100-mig");
    let host = Host::healthy(&node);
    let run = doctor(&node, &host, &["--only", "mig"]);
    assert_eq!(run.problems(), Vec::<String>::new());
    assert_eq!(
        run.found("mig.mode"),
        "MIG enabled on GPU 0, nothing pending"
    );
    host.write(
        "proc/modules",
        "nvidia_drm 1 0 - Live 0x0\nnvidia_uvm 1 0 - Live 0x0\nnvidia_modeset 1 1 nvidia_drm, Live 0x0\nnvidia 1 2 nvidia_uvm,nvidia_modeset, Live 0x0\n",
    );
    doctor(&node, &host, &["--only", "mig"]).only_problem(
        "mig.nvidia-drm",
        "warn",
        "nvidia_drm is loaded on a MIG node (MIG on GPU 0)",
        "unload it (modprobe -r nvidia_drm) and blacklist it: it holds the GPUs open and blocks the reset a MIG change needs",
    );
}

/// A built-in fixture changed by `edit`, written into `dir`; returns its path.
fn fixture_with(dir: &Path, name: &str, edit: impl FnOnce(&mut Value)) -> String {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/nodes/{name}.json"));
    let mut fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut fixture);
    let out = dir.join(format!("{name}-edited.json"));
    std::fs::write(&out, serde_json::to_vec(&fixture).unwrap()).unwrap();
    out.to_str().unwrap().to_owned()
}

/// The gb200-nvl fixture with GPU 2's fabric registration still in progress.
fn gb200_in_progress(dir: &Path) -> String {
    fixture_with(dir, "gb200-nvl", |f| {
        f["gpus"][2]["fabric"]["state"] = "in_progress".into();
    })
}

#[test]
fn fabric_on_gb200() {
    let node = Node::new("gb200-nvl");
    let host = Host::healthy(&node);
    let run = doctor(&node, &host, &["--only", "fabric"]);
    assert_eq!(run.status("fabric.state"), "ok");
    assert_eq!(
        run.found("fabric.state"),
        "all 4 GPUs registered with NVLink fabric 3f5a0c2e-9b1d-4e7a-8c63-1d2e4f5a6b7c"
    );
    let fixture = gb200_in_progress(node.dir.path());
    let node = Node::new(&fixture);
    doctor(&node, &host, &["--only", "fabric"]).only_problem(
        "fabric.state",
        "fail",
        "GPU 2: fabric registration in progress, status 0",
        "check the rack's NVLink switch trays and their fabric manager (NMX); CUDA jobs fail with 'system not yet initialized' until registration completes",
    );
}

#[test]
fn fabric_manager_not_running() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    host.remove("proc/4242/comm");
    doctor(&node, &host, &[]).only_problem(
        "fabric.state",
        "fail",
        "NVSwitch system but nv-fabricmanager is not running: CUDA fails with 'system not yet initialized'",
        "start it: systemctl enable --now nvidia-fabricmanager (the same version as the driver)",
    );
}

#[test]
fn kubelet_sockets_and_plugin() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    host.remove("var/lib/kubelet/pod-resources/kubelet.sock");
    host.remove("var/lib/kubelet/device-plugins/nvidia-gpu.sock");
    let run = doctor(&node, &host, &["--only", "kubelet"]);
    assert_eq!(
        run.problems(),
        vec!["kubelet.plugin fail", "kubelet.sockets fail"]
    );
    assert_eq!(
        run.found("kubelet.sockets"),
        "missing /var/lib/kubelet/pod-resources/kubelet.sock"
    );
    assert_eq!(
        run.found("kubelet.plugin"),
        "no NVIDIA device plugin socket in /var/lib/kubelet/device-plugins"
    );
}

#[test]
fn gpudirect_rdma() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    host.write("sys/class/infiniband/mlx5_0/node_type", "1: CA\n");
    let run = doctor(&node, &host, &["--only", "gpudirect"]);
    assert_eq!(run.found("gpudirect.iommu"), "IOMMU off");
    run.only_problem(
        "gpudirect.rdma",
        "warn",
        "RDMA NICs mlx5_0 but neither nvidia_peermem nor the open kernel modules (DMA-BUF)",
        "install the open kernel modules for DMA-BUF, or modprobe nvidia_peermem",
    );
    host.write(
        "proc/modules",
        "nvidia_peermem 1 0 - Live 0x0\nnvidia 1 1 nvidia_peermem, Live 0x0\n",
    );
    host.write("sys/kernel/iommu_groups/0/type", "DMA\n");
    let run = doctor(&node, &host, &["--only", "gpudirect"]);
    assert_eq!(
        run.found("gpudirect.rdma"),
        "RDMA NICs mlx5_0; nvidia_peermem loaded"
    );
    assert_eq!(run.status("gpudirect.iommu"), "warn");
    host.write(
        "proc/cmdline",
        "BOOT_IMAGE=/vmlinuz intel_iommu=on iommu=pt\n",
    );
    let run = doctor(&node, &host, &["--only", "gpudirect"]);
    assert_eq!(run.problems(), Vec::<String>::new());
    assert_eq!(
        run.found("gpudirect.iommu"),
        "IOMMU in passthrough (iommu=pt)"
    );
}

#[test]
fn selinux_enforcing() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    host.write("sys/fs/selinux/enforce", "1");
    doctor(&node, &host, &["--only", "selinux"]).only_problem(
        "selinux.mode",
        "warn",
        "SELinux enforcing",
        "make sure a policy lets containers use the NVIDIA devices (container_use_devices=on, or the driver container's policy); denials show in ausearch -m avc",
    );
    host.write("sys/fs/selinux/enforce", "0");
    let run = doctor(&node, &host, &["--only", "selinux"]);
    assert_eq!(run.found("selinux.mode"), "SELinux permissive");
}

#[test]
fn gpud_config_file() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    let good = host.path("gpud.yaml");
    std::fs::write(&good, "version: v1\n").unwrap();
    let run = doctor(
        &node,
        &host,
        &["--only", "config", "--config", good.to_str().unwrap()],
    );
    assert_eq!(run.status("config.gpud"), "ok");
    let bad = host.path("bad.yaml");
    std::fs::write(&bad, "version: v2\n").unwrap();
    let run = doctor(
        &node,
        &host,
        &["--only", "config", "--config", bad.to_str().unwrap()],
    );
    assert_eq!(run.problems(), vec!["config.gpud fail"]);
    assert!(
        run.found("config.gpud").contains(bad.to_str().unwrap()),
        "{}",
        run.found("config.gpud")
    );
}

#[test]
fn nvidia_config_file() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    let good = host.path("nvidia.yaml");
    std::fs::write(&good, "version: v1\nflags:\n  migStrategy: single\n").unwrap();
    let good = good.to_str().unwrap();
    let run = doctor(&node, &host, &["--only", "config", "--nvidia-config", good]);
    assert_eq!(run.problems(), Vec::<String>::new());
    assert_eq!(run.found("config.nvidia"), format!("{good} is valid"));
    let bad = host.path("bad-nvidia.yaml");
    std::fs::write(&bad, "version: v1\nflags:\n  migStrategy: bogus\n").unwrap();
    let bad = bad.to_str().unwrap();
    doctor(&node, &host, &["--only", "config", "--nvidia-config", bad]).only_problem(
        "config.nvidia",
        "fail",
        &format!("{bad}: field flags.migStrategy: invalid value \"bogus\": must be one of none, single, mixed"),
        "correct the field named above: gpud refuses to start with this file (exit 65) and keeps the old one on reload",
    );
    let run = doctor(&node, &host, &["--only", "config"]);
    assert_eq!(run.status("config.nvidia"), "skip");
    assert_eq!(
        run.found("config.nvidia"),
        "no NVIDIA config file given (--nvidia-config)"
    );
}

#[test]
fn support_bundle_has_no_secrets() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    let token = "planted-s3cret-token-5f1e";
    host.write(
        "var/lib/kubelet/kubeconfig",
        &format!("apiVersion: v1\nusers:\n- name: kubelet\n  user:\n    token: {token}\n"),
    );
    host.write(
        "kmsg",
        "[  12.5] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n[  12.6] usb 1-1: new device\n",
    );
    let config = host.path("gpud.yaml");
    std::fs::write(&config, "version: v1\n").unwrap();
    node.inject("remap-pending 2");
    let bundle = host.path("bundle.tar.gz");
    let root = host.dir.path().to_str().unwrap();
    let kmsg = host.path("kmsg");
    let mut cmd = node.gpud(&[
        "doctor",
        "--host-root",
        root,
        "--kmsg",
        kmsg.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--bundle",
        bundle.to_str().unwrap(),
    ]);
    cmd.env("KUBE_TOKEN", token)
        .env("GPUD_API_TOKEN", token)
        .env("GPUD_LOG", "warn");
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listing = std::process::Command::new("tar")
        .args(["-tzf"])
        .arg(&bundle)
        .output()
        .unwrap();
    let listing = String::from_utf8(listing.stdout).unwrap();
    for file in [
        "doctor.json",
        "versions.txt",
        "environment.txt",
        "xid.log",
        "health.txt",
        "health.jsonl",
        "inventory.json",
        "config/gpud-gpud.yaml",
        "cdi/var/run/cdi/nvidia.yaml",
    ] {
        assert!(
            listing.lines().any(|l| l == format!("gpud-doctor/{file}")),
            "{file} missing from\n{listing}"
        );
    }
    let dump = std::process::Command::new("tar")
        .args(["-xzOf"])
        .arg(&bundle)
        .output()
        .unwrap();
    let dump = String::from_utf8(dump.stdout).unwrap();
    assert!(
        !dump.contains(token),
        "the planted token leaked into the bundle"
    );
    assert!(!dump.contains("KUBE_TOKEN"));
    assert!(dump.contains("GPUD_API_TOKEN=<redacted>"));
    assert!(dump.contains("NVRM: Xid (PCI:0000:18:00): 79"));
    assert!(!dump.contains("usb 1-1"));
    assert!(dump.contains("\"schema\": \"gpud.doctor/v1\""));
    // The health `gpud health --once` prints, from the signals the doctor read.
    let health = std::process::Command::new("tar")
        .args(["-xzOf"])
        .arg(&bundle)
        .arg("gpud-doctor/health.txt")
        .output()
        .unwrap();
    let health = String::from_utf8(health.stdout).unwrap();
    assert_eq!(
        health.lines().nth(3).unwrap(),
        "2   GPU-821ab636-9dc4-0696-e2eb-c98790d91e14 unhealthy  row remapping pending: an uncorrectable memory error was repaired and needs a GPU reset to take effect — drain and reset the GPU"
    );
    let once = node.run(&["health", "--once"]);
    assert_eq!(once.status.code(), Some(2));
    assert_eq!(health, String::from_utf8(once.stdout).unwrap());
}

#[test]
fn validator_status_files() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    let dir = host.path("validations");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("nvidia-peermem-ready"), "").unwrap();
    let root = host.dir.path().to_str().unwrap();
    let out = node.run(&[
        "doctor",
        "--host-root",
        root,
        "--kmsg",
        host.path("kmsg").to_str().unwrap(),
        "--write-validations",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files, ["driver-ready", "plugin-ready", "toolkit-ready"]);
    assert_eq!(
        std::fs::read_to_string(dir.join("driver-ready")).unwrap(),
        format!(
            "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH={root}\nNVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH={root}\n"
        )
    );
    // A runtime that cannot inject GPUs takes toolkit-ready away, and only it.
    host.write("etc/containerd/config.toml", CONTAINERD_PLAIN);
    let out = node.run(&[
        "doctor",
        "--host-root",
        root,
        "--kmsg",
        host.path("kmsg").to_str().unwrap(),
        "--write-validations",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files, ["driver-ready", "plugin-ready"]);
}

#[test]
fn run_serves_the_latest_report_at_doctor() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    let port = common::http::free_port();
    let address = format!("127.0.0.1:{port}");
    let root = host.dir.path().to_str().unwrap();
    let mut cmd = node.gpud(&[
        "run",
        "--disable",
        "device-plugin,labeller,exporter",
        "--kmsg",
        "",
        "--doctor-interval",
        "1s",
        "--host-root",
        root,
    ]);
    cmd.env("GPUD_HEALTH_ADDRESS", &address);
    let _running = common::Running::spawn(cmd);
    let answer = common::http::wait_for(port, "/doctor", 30, |a| a.status == 200);
    let report: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(report["schema"], "gpud.doctor/v1");
    assert_eq!(report["summary"]["fail"], 0, "{}", answer.body);
}

#[test]
fn mig_config_in_effect_or_the_reconcilers_reason() {
    let node = Node::new("a100-mig");
    let host = Host::healthy(&node);
    let config = host.path("mig.yaml");
    std::fs::write(
        &config,
        "version: v1\nmig-configs:\n  current:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {1g.10gb: 1, 2g.20gb: 1, 3g.40gb: 1}\n  all-1g.10gb:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {1g.10gb: 7}\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let state_dir = host.path("mig-state");
    let state = state_dir.to_str().unwrap();
    let base = [
        "--only",
        "mig.config",
        "--mig-config-file",
        config,
        "--mig-state-dir",
        state,
    ];
    let with = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        doctor(&node, &host, &args)
    };
    let run = with(&["--mig-selected-config", "current"]);
    assert_eq!(run.problems(), Vec::<String>::new());
    assert_eq!(
        run.found("mig.config"),
        format!("config current of {config} is in effect")
    );
    let apply = "apply it (gpud mig apply -f <file> -c <config>), or let the reconciler do it: see its log and gpud_mig_config_state";
    let differs = "GPU 0: MIG devices are {1g.10gb: 1, 2g.20gb: 1, 3g.40gb: 1}, the config wants {1g.10gb: 7}";
    with(&["--mig-selected-config", "all-1g.10gb"]).only_problem(
        "mig.config",
        "fail",
        &format!("config all-1g.10gb is not in effect: {differs}"),
        apply,
    );
    // Without a selected config, the one the reconciler last followed, with its reason.
    std::fs::create_dir_all(&state_dir).unwrap();
    let record = state_dir.join("last-state.json");
    std::fs::write(
        &record,
        r#"{"config":"all-1g.10gb","state":"failed","reason":"GPU 0: creating GPU instance 1g.10gb at slice 0 failed"}"#,
    )
    .unwrap();
    with(&[]).only_problem(
        "mig.config",
        "fail",
        &format!("config all-1g.10gb is not in effect: {differs}; the reconciler reported failed: GPU 0: creating GPU instance 1g.10gb at slice 0 failed"),
        apply,
    );
    std::fs::write(&record, r#"{"config":"all-1g.10gb","state":"pending"}"#).unwrap();
    with(&[]).only_problem(
        "mig.config",
        "warn",
        &format!("config all-1g.10gb is being applied: {differs}"),
        "wait for nvidia.com/mig.config.state=success",
    );
    let run = doctor(&node, &host, &["--only", "mig.config"]);
    assert_eq!(run.status("mig.config"), "skip");
    assert_eq!(
        run.found("mig.config"),
        "no MIG config file given (--mig-config-file)"
    );
}

/// Sets the simulated driver's compute mode of the given GPUs to EXCLUSIVE_PROCESS, as an MPS
/// daemon that died would have left them (the mock's state file, see tests/nvml-mock).
fn exclusive_process(node: &Node, gpus: &[usize]) {
    let uuids = uuids(node);
    let modes: serde_json::Map<String, Value> = gpus
        .iter()
        .map(|&i| (uuids[i].clone(), Value::from(3)))
        .collect();
    let state = serde_json::json!({"version": 1, "gpus": {}, "compute_modes": modes});
    std::fs::write(node.state_path(), state.to_string()).unwrap();
}

#[test]
fn exclusive_process_left_without_an_mps_daemon() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    exclusive_process(&node, &[0, 2]);
    doctor(&node, &host, &[]).only_problem(
        "mps.compute-mode",
        "fail",
        "GPUs 0, 2 are in compute mode EXCLUSIVE_PROCESS but no nvidia-cuda-mps-control runs: \
         only one process at a time can use them (left behind by an MPS daemon that died or was \
         stopped without restoring the mode)",
        "start the MPS control daemon (gpud mps-control-daemon, or gpud run with sharing.mps in \
         the config), or give the GPUs back: nvidia-smi -i <GPU> -c DEFAULT",
    );
    host.write("proc/5150/comm", "nvidia-cuda-mps-control\n");
    host.write(
        "proc/5150/status",
        "Name:\tnvidia-cuda-mps\nUid:\t0\t0\t0\t0\n",
    );
    let run = doctor(&node, &host, &["--only", "mps"]);
    assert_eq!(run.status("mps.compute-mode"), "ok");
    assert_eq!(
        run.found("mps.compute-mode"),
        "GPUs 0, 2 are in EXCLUSIVE_PROCESS, served by 1 MPS control daemon(s)"
    );
}

#[test]
fn mps_server_under_another_uid_than_the_workloads() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    let run = doctor(&node, &host, &["--only", "mps.uid"]);
    assert_eq!(run.status("mps.uid"), "skip");
    assert_eq!(run.found("mps.uid"), "no MPS daemon runs");
    host.write("proc/5150/comm", "nvidia-cuda-mps-control\n");
    host.write("proc/5150/status", "Uid:\t0\t0\t0\t0\n");
    host.write("proc/5151/comm", "nvidia-cuda-mps-server\n");
    host.write("proc/5151/status", "Uid:\t1001\t1001\t1001\t1001\n");
    let run = doctor(&node, &host, &["--only", "mps.uid"]);
    assert_eq!(run.status("mps.uid"), "skip");
    assert_eq!(
        run.found("mps.uid"),
        "the workloads' UID is not given (--mps-workload-uid, GPUD_MPS_WORKLOAD_UID)"
    );
    doctor(&node, &host, &["--mps-workload-uid", "1000"]).only_problem(
        "mps.uid",
        "fail",
        "nvidia-cuda-mps-server pid 5151 runs as UID 1001; workloads run as UID 1000, so their \
         MPS clients wait until that server's clients finish",
        "run every MPS workload as UID 1000 (securityContext.runAsUser), or stop the stray MPS \
         server; the control daemon runs as root",
    );
    let run = doctor(
        &node,
        &host,
        &["--only", "mps.uid", "--mps-workload-uid", "1001"],
    );
    assert_eq!(run.status("mps.uid"), "ok");
    assert_eq!(
        run.found("mps.uid"),
        "1 MPS server(s) and 1 control daemon(s) run as UID 1001 or root"
    );
}

#[test]
fn every_gpud_command_a_fix_suggests_exists() {
    let list = std::process::Command::new(common::gpud_bin())
        .arg("--list")
        .output()
        .unwrap();
    let applets: Vec<String> = String::from_utf8(list.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/doctor");
    let mut texts = Vec::new();
    for dir in [src.clone(), src.join("checks")] {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                texts.push(std::fs::read_to_string(path).unwrap());
            }
        }
    }
    let mut commands = std::collections::BTreeSet::new();
    for text in &texts {
        for (at, _) in text.match_indices("gpud ") {
            let words: Vec<&str> = text[at + 5..]
                .split(|c: char| !(c.is_ascii_lowercase() || c == '-'))
                .take(2)
                .collect();
            let Some(applet) = words.first().filter(|w| applets.iter().any(|a| a == *w)) else {
                continue;
            };
            let mut command = vec![(*applet).to_owned()];
            // An applet with subcommands is named with its subcommand.
            if matches!(*applet, "cdi" | "mig") {
                command.push(words.get(1).copied().unwrap_or_default().to_owned());
            }
            commands.insert(command);
        }
    }
    assert!(
        commands.contains(&vec!["cdi".to_owned(), "generate".to_owned()]),
        "{commands:?}"
    );
    for command in commands {
        let out = std::process::Command::new(common::gpud_bin())
            .args(&command)
            .arg("--help")
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "a doctor fix suggests `gpud {}`, which is not a command: {}",
            command.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn only_gpu_with_a_hung_nvml_still_fails_through_driver_nvml() {
    let node = Node::new("dgx-h100");
    let host = Host::healthy(&node);
    node.inject("hang nvmlDeviceGetPersistenceMode");
    // Only GPU checks asked for: driver.nvml comes along, since they all stand on it, so the
    // hang is a failure (exit 2) and not a run of skips that exits 0.
    let (run, _) = doctor_within(
        &node,
        &host,
        &["--only", "gpu", "--timeout", "1s"],
        Duration::from_secs(60),
    );
    assert_eq!(run.problems(), vec!["driver.nvml fail"]);
    assert_eq!(run.code, 2);
    // Skipped by name, it stays out (the user asked), and only skips remain.
    let (run, _) = doctor_within(
        &node,
        &host,
        &["--only", "gpu", "--skip", "driver.nvml", "--timeout", "1s"],
        Duration::from_secs(60),
    );
    assert_eq!(run.problems(), Vec::<String>::new());
}
