//! CDI specs: the pure builder on the simulated nodes' snapshots with hand-made host files
//! (exact golden specs), and `gpud cdi generate` end to end on the mock with a fake driver
//! root, fake MIG capabilities and a fake hook in a temp dir, which must write the very same
//! specs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use common::{Node, assert_golden, stdout_ok};
use gpud::cdi::render::render;
use gpud::cdi::{self, Format, HostFiles, HostPath, MigCaps, NameStrategy, Options, Spec};
use gpud::inventory::model::{Gpu, Mig, MigDevice, MigEngines, Node as NodeFacts, Pci};
use gpud::inventory::{Health, Snapshot};
use serde_json::Value;

/// Where a driver container puts its root; the e2e tests map their temp root to it.
const DRIVER_ROOT: &str = "/run/nvidia/driver";
const HOOK: &str = "/usr/bin/nvidia-cdi-hook";

/// The driver files of the fake installation, in the order discovery reports them.
const LIBRARIES: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libcuda.so.570.133.20",
    "/usr/lib/x86_64-linux-gnu/libcudadebugger.so.570.133.20",
    "/usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.570.133.20",
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.133.20",
    "/usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.570.133.20",
    "/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.570.133.20",
];
const BINARIES: &[&str] = &[
    "/usr/bin/nvidia-smi",
    "/usr/bin/nvidia-debugdump",
    "/usr/bin/nvidia-persistenced",
    "/usr/bin/nvidia-cuda-mps-control",
    "/usr/bin/nvidia-cuda-mps-server",
];
const IPC: &[&str] = &[
    "/run/nvidia-persistenced/socket",
    "/run/nvidia-fabricmanager/socket",
];
const FIRMWARE: &[&str] = &[
    "/lib/firmware/nvidia/570.133.20/gsp_ga10x.bin",
    "/lib/firmware/nvidia/570.133.20/gsp_tu10x.bin",
];
const CONTROL_DEVICES: &[&str] = &[
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

/// The a100-mig fixture's GPU (minor 0) has GPU instances 1, 4 and 8, one compute instance 0
/// each. Minors follow the driver's layout: 3 + 135 per GPU + 9 per GI, CIs right after.
const MIG_CAPS: &[(u32, u32, Option<u32>, u32)] = &[
    (0, 1, None, 12),
    (0, 1, Some(0), 13),
    (0, 4, None, 39),
    (0, 4, Some(0), 40),
    (0, 8, None, 75),
    (0, 8, Some(0), 76),
];

// === the snapshot, from the real binary on the mock ===

/// The fixture's snapshot as `gpud inventory` reports it, as the model type.
fn snapshot(fixture: &str) -> Snapshot {
    let node = Node::new(fixture);
    let json: Value = serde_json::from_str(&stdout_ok(&node.run(&["inventory"]))).unwrap();
    let text = |v: &Value| v.as_str().unwrap().to_owned();
    let num = |v: &Value| u32::try_from(v.as_u64().unwrap()).unwrap();
    Snapshot {
        node: NodeFacts {
            hostname: text(&json["node"]["hostname"]),
            driver_version: text(&json["node"]["driver_version"]),
            cuda_driver_version: None,
            nvml_version: None,
            machine_type: None,
        },
        gpus: json["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| Gpu {
                index: num(&g["index"]),
                minor_number: g["minor_number"].as_u64().map(|m| m as u32),
                device_node: None,
                uuid: text(&g["uuid"]),
                serial: None,
                name: text(&g["name"]),
                brand: None,
                architecture: None,
                family: None,
                compute_capability: None,
                memory_mib: g["memory_mib"].as_u64().unwrap(),
                pci: Pci {
                    bus_id: text(&g["pci"]["bus_id"]).into(),
                    device_id: text(&g["pci"]["device_id"]),
                    subsystem_id: None,
                },
                numa_node: None,
                power_limit_watts: None,
                mig: Mig {
                    capable: g["mig"]["capable"].as_bool().unwrap(),
                    enabled: g["mig"]["enabled"].as_bool().unwrap(),
                    pending_enabled: g["mig"]["pending_enabled"].as_bool().unwrap(),
                    reconfiguring: false,
                    devices: g["mig"]["devices"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|m| MigDevice {
                            index: num(&m["index"]),
                            uuid: text(&m["uuid"]),
                            gpu_instance_id: num(&m["gpu_instance_id"]),
                            compute_instance_id: num(&m["compute_instance_id"]),
                            profile: text(&m["profile"]),
                            memory_mib: m["memory_mib"].as_u64().unwrap(),
                            multiprocessors: num(&m["multiprocessors"]),
                            gpu_slices: num(&m["gpu_slices"]),
                            compute_slices: num(&m["compute_slices"]),
                            engines: MigEngines {
                                copy: 0,
                                decoder: 0,
                                encoder: 0,
                                jpeg: 0,
                                ofa: 0,
                            },
                            placement: None,
                            gpu_instance_profile_id: None,
                            health: Health::healthy(),
                        })
                        .collect(),
                },
                nvlinks: vec![],
                fabric: None,
                health: Health::healthy(),
                remediation: None,
                device_taints: Vec::new(),
            })
            .collect(),
        topology: vec![],
    }
}

// === the host, by hand (pure tests) and on disk (end to end) ===

/// What discovery finds on a complete installation under `root`.
fn full_host(root: &str, with_mig: bool) -> HostFiles {
    let under = |list: &[&str]| list.iter().map(|p| HostPath::under(root, p)).collect();
    let caps_dir = format!(
        "{}/proc/driver/nvidia/capabilities",
        root.trim_end_matches('/')
    );
    let mut mig_caps = MigCaps::new(caps_dir);
    if with_mig {
        for &(gpu, gi, ci, minor) in MIG_CAPS {
            match ci {
                None => mig_caps.insert_gpu_instance(gpu, gi, minor),
                Some(ci) => mig_caps.insert_compute_instance(gpu, gi, ci, minor),
            }
        }
    }
    HostFiles {
        dev_root: root.to_owned(),
        control_devices: CONTROL_DEVICES.iter().map(|d| (*d).to_owned()).collect(),
        libraries: under(LIBRARIES),
        binaries: under(BINARIES),
        ipc: under(IPC),
        firmware: under(FIRMWARE),
        mig_caps,
        hook: Some(HOOK.to_owned()),
    }
}

/// A temporary machine: a driver root with the files above (plus decoys discovery must
/// ignore), MIG capabilities in its procfs, and a host root holding the hook.
struct FakeHost {
    dir: tempfile::TempDir,
}

impl FakeHost {
    fn new(with_mig: bool) -> FakeHost {
        let fake = FakeHost {
            dir: tempfile::tempdir().unwrap(),
        };
        let driver = fake.driver_root();
        // Merged /usr: /lib is a link to usr/lib, so every library and firmware file is
        // reachable under two names and must still be mounted once.
        fs::create_dir_all(driver.join("usr/lib")).unwrap();
        symlink("usr/lib", driver.join("lib")).unwrap();
        for lib in LIBRARIES {
            write(&driver, lib, "", 0o644);
        }
        // Decoys: development and SONAME links, another driver's library, other firmware.
        let libdir = driver.join("usr/lib/x86_64-linux-gnu");
        symlink("libcuda.so.570.133.20", libdir.join("libcuda.so.1")).unwrap();
        symlink("libcuda.so.1", libdir.join("libcuda.so")).unwrap();
        write(
            &driver,
            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.565.57.01",
            "",
            0o644,
        );
        write(
            &driver,
            "/lib/firmware/nvidia/565.57.01/gsp_ga10x.bin",
            "",
            0o644,
        );
        for bin in BINARIES {
            write(&driver, bin, "#!/bin/sh\n", 0o755);
        }
        for path in IPC.iter().chain(FIRMWARE).chain(CONTROL_DEVICES) {
            write(&driver, path, "", 0o644);
        }
        if with_mig {
            for &(gpu, gi, ci, minor) in MIG_CAPS {
                let rel = match ci {
                    None => format!("/proc/driver/nvidia/capabilities/gpu{gpu}/mig/gi{gi}/access"),
                    Some(ci) => format!(
                        "/proc/driver/nvidia/capabilities/gpu{gpu}/mig/gi{gi}/ci{ci}/access"
                    ),
                };
                let body =
                    format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n");
                write(&driver, &rel, &body, 0o444);
            }
        }
        write(&fake.host_root(), HOOK, "#!/bin/sh\n", 0o755);
        fake
    }

    fn driver_root(&self) -> PathBuf {
        self.dir.path().join("driver")
    }

    fn host_root(&self) -> PathBuf {
        self.dir.path().join("host")
    }

    fn hook(&self) -> PathBuf {
        self.host_root().join(HOOK.trim_start_matches('/'))
    }

    fn out(&self, name: &str) -> PathBuf {
        self.dir.path().join("out/cdi").join(name)
    }

    /// The arguments pointing `gpud cdi generate` at this machine.
    fn args(&self) -> Vec<String> {
        vec![
            "cdi".into(),
            "generate".into(),
            "--driver-root".into(),
            path(&self.driver_root()),
            "--nvidia-cdi-hook-path".into(),
            path(&self.hook()),
        ]
    }

    /// A written spec with the temp paths mapped back to a driver container's, so it can be
    /// compared with the golden built for `DRIVER_ROOT`.
    fn normalise(&self, text: &str) -> String {
        text.replace(&path(&self.driver_root()), DRIVER_ROOT)
            .replace(&path(&self.host_root()), "")
    }
}

fn path(p: &Path) -> String {
    p.to_str().unwrap().to_owned()
}

fn write(root: &Path, rel: &str, body: &str, mode: u32) {
    let file = root.join(rel.trim_start_matches('/'));
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    fs::write(&file, body).unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(mode)).unwrap();
}

fn run_generate(node: &Node, args: &[String]) -> std::process::Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    node.run(&args)
}

fn spec_text(snapshot: &Snapshot, host: &HostFiles, options: &Options, format: Format) -> String {
    let generated = cdi::build(snapshot, host, options).unwrap();
    assert!(generated.skipped.is_empty(), "{:?}", generated.skipped);
    render(&generated.spec, format).unwrap()
}

// === pure: golden specs ===

#[test]
fn dgx_h100_spec_matches_golden() {
    let snapshot = snapshot("dgx-h100");
    let text = spec_text(
        &snapshot,
        &full_host("/", false),
        &Options::default(),
        Format::Yaml,
    );
    assert_golden("cdi/dgx-h100.yaml", &text);

    let spec: Spec = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(spec.cdi_version, "0.5.0");
    assert_eq!(spec.kind, "nvidia.com/gpu");
    // Index and UUID per GPU, then `all`.
    assert_eq!(spec.devices.len(), 8 * 2 + 1);
    assert_eq!(spec.devices[0].name, "0");
    assert_eq!(spec.devices[1].name, snapshot.gpus[0].uuid);
    assert_eq!(spec.devices[16].name, "all");
    assert_eq!(spec.devices[16].container_edits.device_nodes.len(), 8);
}

#[test]
fn dgx_h100_spec_under_a_driver_root_matches_golden() {
    let text = spec_text(
        &snapshot("dgx-h100"),
        &full_host(DRIVER_ROOT, false),
        &Options::default(),
        Format::Yaml,
    );
    assert_golden("cdi/dgx-h100.driver-root.yaml", &text);
}

#[test]
fn a100_mig_spec_matches_golden_in_yaml_and_json() {
    let snapshot = snapshot("a100-mig");
    let host = full_host(DRIVER_ROOT, true);
    let yaml = spec_text(&snapshot, &host, &Options::default(), Format::Yaml);
    assert_golden("cdi/a100-mig.yaml", &yaml);
    let json = spec_text(&snapshot, &host, &Options::default(), Format::Json);
    assert_golden("cdi/a100-mig.json", &json);
    let from_yaml: Spec = serde_yaml_ng::from_str(&yaml).unwrap();
    let from_json: Spec = serde_json::from_str(&json).unwrap();
    assert_eq!(from_yaml, from_json);

    let mig = from_yaml.devices.iter().find(|d| d.name == "0:1").unwrap();
    let nodes: Vec<&str> = mig
        .container_edits
        .device_nodes
        .iter()
        .map(|n| n.path.as_str())
        .collect();
    // MIG device 1 is the 2g.20gb in GPU instance 4.
    assert_eq!(
        nodes,
        [
            "/dev/nvidia0",
            "/dev/nvidia-caps/nvidia-cap39",
            "/dev/nvidia-caps/nvidia-cap40"
        ]
    );
}

#[test]
fn empty_node_spec_matches_golden() {
    let host = HostFiles {
        dev_root: "/".into(),
        ..HostFiles::default()
    };
    let text = spec_text(&snapshot("empty"), &host, &Options::default(), Format::Yaml);
    assert_golden("cdi/empty.yaml", &text);
}

#[test]
fn device_plugin_spec_uses_its_kind_and_uuids_only() {
    let snapshot = snapshot("a100-mig");
    let options = Options {
        kind: cdi::Kind::parse("k8s.device-plugin.nvidia.com/gpu").unwrap(),
        name_strategies: vec![NameStrategy::Uuid],
        all_device: false,
        ..Options::default()
    };
    let spec = cdi::build(&snapshot, &full_host("/", true), &options)
        .unwrap()
        .spec;
    let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
    let gpu = &snapshot.gpus[0];
    let mut want = vec![gpu.uuid.as_str()];
    want.extend(gpu.mig.devices.iter().map(|m| m.uuid.as_str()));
    assert_eq!(names, want);
    assert_eq!(spec.kind, "k8s.device-plugin.nvidia.com/gpu");
    assert_eq!(spec.cdi_version, "0.3.0");
}

// === end to end: the binary on the mock ===

#[test]
fn generate_writes_the_golden_spec_under_a_driver_root() {
    let fake = FakeHost::new(false);
    let node = Node::new("dgx-h100");
    let out = fake.out("nvidia.yaml");
    let mut args = fake.args();
    args.extend(["--output".into(), path(&out)]);
    let result = run_generate(&node, &args);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    assert!(result.stdout.is_empty());

    let text = fs::read_to_string(&out).unwrap();
    let spec: Spec = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(spec.devices.len(), 17);
    assert_golden("cdi/dgx-h100.driver-root.yaml", &fake.normalise(&text));

    let mode = fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);
    let names: Vec<String> = fs::read_dir(out.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["nvidia.yaml"], "no temporary file left behind");
}

#[test]
fn generate_on_a_mig_node_reads_capabilities_and_writes_yaml_or_json() {
    let fake = FakeHost::new(true);
    let node = Node::new("a100-mig");
    for (name, golden, extra) in [
        ("nvidia.yaml", "cdi/a100-mig.yaml", vec![]),
        ("nvidia.json", "cdi/a100-mig.json", vec![]),
        // An explicit --format wins over the extension.
        ("spec.yaml", "cdi/a100-mig.json", vec!["--format", "json"]),
    ] {
        let out = fake.out(name);
        let mut args = fake.args();
        args.extend(["--output".into(), path(&out)]);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let result = run_generate(&node, &args);
        assert!(
            result.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&result.stderr)
        );
        let text = fs::read_to_string(&out).unwrap();
        if golden.ends_with(".json") {
            serde_json::from_str::<Spec>(&text).unwrap();
        } else {
            serde_yaml_ng::from_str::<Spec>(&text).unwrap();
        }
        assert_golden(golden, &fake.normalise(&text));
    }
}

#[test]
fn generate_on_an_empty_node_prints_the_golden_spec_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::new("empty");
    let root = path(dir.path());
    let missing_hook = path(&dir.path().join("no-hook"));
    let out = node.run(&[
        "cdi",
        "generate",
        "--output",
        "-",
        "--driver-root",
        &root,
        "--nvidia-cdi-hook-path",
        &missing_hook,
    ]);
    let text = stdout_ok(&out);
    assert_golden("cdi/empty.yaml", &text);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("No CDI hook is an executable file")
            && stderr.contains(&format!("tried={missing_hook}")),
        "{stderr}"
    );
}

#[test]
fn output_path_comes_from_the_toolkit_environment_variable() {
    let fake = FakeHost::new(false);
    let node = Node::new("dgx-h100");
    let out = fake.out("from-env.yaml");
    let args = fake.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = node
        .gpud(&args)
        .env("NVIDIA_CTK_CDI_OUTPUT_FILE_PATH", &out)
        .output()
        .unwrap();
    assert!(result.status.success());
    assert_golden(
        "cdi/dgx-h100.driver-root.yaml",
        &fake.normalise(&fs::read_to_string(&out).unwrap()),
    );
}

#[test]
fn names_kind_all_device_and_hooks_follow_the_flags() {
    let fake = FakeHost::new(false);
    let node = Node::new("dgx-h100");
    let mut args = fake.args();
    args.extend(
        [
            "--output",
            "-",
            "--vendor",
            "management.nvidia.com",
            "--class",
            "gpu",
            "--device-name-strategy",
            "type-index,uuid",
            "--device-name-strategy",
            "type-index",
            "--no-all-device",
            "--disable-hook",
            "enable-cuda-compat",
            "--disable-hook",
            "update-ldcache,disable-device-node-modification",
        ]
        .map(String::from),
    );
    let spec: Spec = serde_yaml_ng::from_str(&stdout_ok(&run_generate(&node, &args))).unwrap();
    assert_eq!(spec.kind, "management.nvidia.com/gpu");
    // Letters only and a driver root (host paths on device nodes): 0.5.0 for the host paths.
    assert_eq!(spec.cdi_version, "0.5.0");
    let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        &names[..4],
        [
            "gpu0",
            "GPU-50679f0e-63af-04db-1989-74b23d854dbf",
            "gpu1",
            "GPU-9b266fff-626c-364f-39b6-4685154e8afb"
        ]
    );
    assert_eq!(names.len(), 16);
    assert!(!names.contains(&"all"));
    let hooks: Vec<&str> = spec
        .container_edits
        .hooks
        .iter()
        .map(|h| h.args[1].as_str())
        .collect();
    assert_eq!(hooks, ["create-symlinks"]);

    let mut args = fake.args();
    args.extend(["--output", "-", "--disable-hook", "all"].map(String::from));
    let spec: Spec = serde_yaml_ng::from_str(&stdout_ok(&run_generate(&node, &args))).unwrap();
    assert!(spec.container_edits.hooks.is_empty());
}

#[test]
fn dev_root_and_proc_root_are_separate_from_the_driver_root() {
    let fake = FakeHost::new(true);
    let node = Node::new("a100-mig");
    // Device nodes and capabilities on the host's own /dev and a separate procfs copy.
    let proc_copy = fake.dir.path().join("proc-copy");
    for &(gpu, gi, ci, minor) in MIG_CAPS {
        let rel = match ci {
            None => format!("/driver/nvidia/capabilities/gpu{gpu}/mig/gi{gi}/access"),
            Some(ci) => format!("/driver/nvidia/capabilities/gpu{gpu}/mig/gi{gi}/ci{ci}/access"),
        };
        write(
            &proc_copy,
            &rel,
            &format!("DeviceFileMinor: {}\n", minor + 1000),
            0o444,
        );
    }
    let mut args = fake.args();
    args.extend(
        ["--output", "-", "--dev-root", "/", "--proc-root"]
            .map(String::from)
            .into_iter()
            .chain([path(&proc_copy)]),
    );
    let spec: Spec = serde_yaml_ng::from_str(&stdout_ok(&run_generate(&node, &args))).unwrap();
    let mig = spec.devices.iter().find(|d| d.name == "0:0").unwrap();
    assert_eq!(
        mig.container_edits.device_nodes,
        [
            cdi::DeviceNode::from_host("/dev/nvidia0".into(), None),
            cdi::DeviceNode::from_host("/dev/nvidia-caps/nvidia-cap1012".into(), None),
            cdi::DeviceNode::from_host("/dev/nvidia-caps/nvidia-cap1013".into(), None),
        ]
    );
    // Whatever control nodes this machine's /dev has, they need no host path.
    assert!(
        spec.container_edits
            .device_nodes
            .iter()
            .all(|n| n.host_path.is_none())
    );
}

#[test]
fn mig_node_without_capabilities_fails_naming_the_file_and_writes_nothing() {
    let fake = FakeHost::new(false);
    let node = Node::new("a100-mig");
    let out = fake.out("nvidia.yaml");
    let mut args = fake.args();
    args.extend(["--output".into(), path(&out)]);
    let result = run_generate(&node, &args);
    assert_eq!(result.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&result.stderr);
    let want = format!(
        "gpud: cannot build the CDI spec: MIG device 0:0 (MIG-7fe92cb3-f842-6aff-9763-b6bc90e0610e): \
         no access capability for GPU instance 1: {}/proc/driver/nvidia/capabilities/gpu0/mig/gi1/access \
         was not found or not readable (--proc-root names the procfs to read)\n",
        path(&fake.driver_root())
    );
    assert!(stderr.ends_with(&want), "{stderr}");
    assert!(!out.exists());
}

#[test]
fn malformed_capability_file_fails_naming_it() {
    let fake = FakeHost::new(true);
    let bad = fake
        .driver_root()
        .join("proc/driver/nvidia/capabilities/gpu0/mig/gi4/ci0/access");
    fs::set_permissions(&bad, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&bad, "DeviceFileMode: 292\n").unwrap();
    let node = Node::new("a100-mig");
    let mut args = fake.args();
    args.extend(["--output", "-"].map(String::from));
    let result = run_generate(&node, &args);
    assert_eq!(result.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        stderr.ends_with(&format!(
            "gpud: cannot read the host's driver files: {}: no DeviceFileMinor line\n",
            bad.display()
        )),
        "{stderr}"
    );
    assert!(result.stdout.is_empty());
}

#[test]
fn unwritable_output_fails_naming_the_path() {
    let fake = FakeHost::new(false);
    let blocker = fake.dir.path().join("blocker");
    fs::write(&blocker, "").unwrap();
    let node = Node::new("dgx-h100");
    let mut args = fake.args();
    args.extend(["--output".into(), path(&blocker.join("nvidia.yaml"))]);
    let result = run_generate(&node, &args);
    assert_eq!(result.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        stderr.contains(&format!(
            "gpud: {}: cannot create the folder: ",
            blocker.display()
        )),
        "{stderr}"
    );
}

#[test]
fn bad_arguments_exit_64_naming_the_flag() {
    let node = Node::new("dgx-h100");
    let cases: &[(&[&str], &str)] = &[
        (
            &["--device-name-strategy", "name"],
            "--device-name-strategy",
        ),
        (&["--format", "xml"], "--format"),
        (&["--vendor", "nvidia com"], "--vendor"),
        (&["--class", "gpu/"], "--class"),
        (&["--disable-hook", "frobnicate"], "--disable-hook"),
        (&["--mode", "management"], "--mode"),
        (&["--no-such-flag"], "--no-such-flag"),
    ];
    for (extra, flag) in cases {
        let mut args = vec!["cdi", "generate", "--output", "-"];
        args.extend_from_slice(extra);
        let out = node.run(&args);
        assert_eq!(out.status.code(), Some(64), "{extra:?}");
        assert!(out.stdout.is_empty());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag), "{extra:?}: {stderr}");
    }
    let vendor = node.run(&["cdi", "generate", "--vendor", "nvidia com"]);
    assert!(String::from_utf8_lossy(&vendor.stderr).contains(
        "vendor \"nvidia com\" has ' '; only letters, digits, '-', '_' and '.' are allowed"
    ));
    for args in [&["cdi"][..], &["cdi", "frobnicate"]] {
        let out = node.run(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}");
    }
}

#[test]
fn missing_nvml_exits_69() {
    let node = Node::new("dgx-h100");
    let out = node.run(&[
        "cdi",
        "generate",
        "--output",
        "-",
        "--nvml-lib",
        "/nonexistent/libnvidia-ml.so.1",
    ]);
    assert_eq!(out.status.code(), Some(69));
    assert!(out.stdout.is_empty());
}

/// The device names of the spec file at `out` once it exists and `done` holds for them.
fn spec_names_when(out: &Path, what: &str, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    common::until(what, 20, || {
        let names: Vec<String> = fs::read_to_string(out)
            .ok()
            .and_then(|text| serde_yaml_ng::from_str::<Spec>(&text).ok())
            .map(|spec| spec.devices.into_iter().map(|d| d.name).collect())
            .unwrap_or_default();
        if done(&names) {
            Ok(names)
        } else {
            Err(format!("the spec names {names:?}"))
        }
    })
}

#[test]
fn watch_writes_the_spec_again_on_a_mig_change_and_ends_on_a_new_driver() {
    let fake = FakeHost::new(true);
    let node = Node::new("a100-mig");
    let uuid = snapshot("a100-mig").gpus[0].uuid.clone();
    let out = fake.out("nvidia.yaml");
    let mut args = fake.args();
    args.extend(["--output".into(), path(&out), "--watch".into()]);
    args.extend(["--interval".into(), "100ms".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut gpud = common::Running::spawn(node.gpud(&args));

    let first = spec_names_when(&out, "the first spec", |names| !names.is_empty());
    assert_eq!(
        first.iter().filter(|n| n.starts_with("0:")).count(),
        3,
        "{first:?}"
    );

    // MIG repartitioned to one 3g instance (GPU instance 1): the spec follows.
    node.write_mig_state(
        &uuid,
        serde_json::json!([{"id": 1, "profile_id": 9, "placement": {"start": 4, "size": 4},
            "compute_instances": [{"id": 0, "profile_id": 2, "placement": {"start": 0, "size": 3}}]}]),
    );
    let after = spec_names_when(&out, "the repartitioned spec", |names| {
        names.iter().filter(|n| n.starts_with("0:")).count() == 1
    });
    assert_eq!(
        after.len(),
        5,
        "GPU twice, one MIG device twice, all: {after:?}"
    );
    assert_eq!(after[2], "0:0");
    assert!(
        after[3].starts_with("MIG-") && after[4] == "all",
        "{after:?}"
    );

    // The kernel module is replaced by another driver's: the process ends with an error so
    // that its restart loads the new library; the last spec stays.
    let written = fs::read(&out).unwrap();
    write(
        &fake.driver_root(),
        "/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:04 UTC 2025\n",
        0o444,
    );
    let status = common::until("the end after the driver changed", 20, || {
        gpud.child
            .try_wait()
            .unwrap()
            .ok_or_else(|| "still running".to_owned())
    });
    assert_eq!(status.code(), Some(1));
    // The pipe's reader thread may still be taking the last lines in.
    let said = "the kernel module is now driver 580.65.06, NVML here is 570.133.20";
    common::until("the reason on stderr", 20, || {
        let stderr = gpud.stderr();
        if stderr.contains(said) {
            Ok(())
        } else {
            Err(stderr)
        }
    });
    assert_eq!(
        fs::read(&out).unwrap(),
        written,
        "the spec is left as it was"
    );
}

#[test]
fn watch_needs_a_file() {
    let node = Node::new("dgx-h100");
    let result = node.run(&["cdi", "generate", "--output", "-", "--watch"]);
    assert_eq!(result.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&result.stderr).contains("give --output a path"));
}

#[test]
fn a_container_that_sees_the_host_under_host_root_writes_the_hosts_paths() {
    let fake = FakeHost::new(false);
    let node = Node::new("dgx-h100");
    // The toolkit's view: the host's / (here the fake driver files) mounted at another path.
    write(&fake.driver_root(), HOOK, "#!/bin/sh\n", 0o755);
    let out = fake.out("nvidia.yaml");
    let result = node.run(&[
        "cdi",
        "generate",
        "--host-root",
        &path(&fake.driver_root()),
        "--nvidia-cdi-hook-path",
        HOOK,
        "--output",
        &path(&out),
    ]);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    assert_golden("cdi/dgx-h100.yaml", &fs::read_to_string(&out).unwrap());
}
