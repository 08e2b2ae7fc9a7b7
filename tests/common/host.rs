//! A fake host root for the doctor's checks, built in code: a healthy dgx-h100 node (driver,
//! kernel modules, device nodes, Fabric Manager, containerd with NVIDIA's runtime, a CDI spec,
//! the kubelet's sockets) unless a test breaks something. Shared by the doctor's tests and the
//! node status's doctor condition.

use std::path::PathBuf;

use serde_json::Value;

use super::{Node, stdout_ok};

/// A fake host root: a healthy dgx-h100 node unless a test breaks something.
pub struct Host {
    pub dir: tempfile::TempDir,
}

impl Host {
    pub fn healthy(node: &Node) -> Host {
        let host = Host {
            dir: tempfile::tempdir().unwrap(),
        };
        host.write(
            "proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  Release Build  (dvs-builder@U16-I3-B03-4-3)  Fri Mar 14 2025\nGCC version:  gcc version 12.2.0\n",
        );
        host.write(
            "proc/modules",
            "nvidia_uvm 2076672 0 - Live 0x0 (PO)\nnvidia_modeset 1638400 0 - Live 0x0 (PO)\nnvidia 104071168 2 nvidia_uvm,nvidia_modeset, Live 0x0 (PO)\n",
        );
        for module in ["nvidia", "nvidia_uvm", "nvidia_modeset"] {
            host.write(&format!("sys/module/{module}/version"), "570.133.20\n");
        }
        host.write(
            "proc/devices",
            "Character devices:\n  1 mem\n195 nvidia\n508 nvidia-uvm\n509 nvidia-caps\n\nBlock devices:\n  8 sd\n",
        );
        let mut nodes = vec![
            ("nvidiactl".to_owned(), "195:255".to_owned()),
            ("nvidia-modeset".to_owned(), "195:254".to_owned()),
            ("nvidia-uvm".to_owned(), "508:0".to_owned()),
            ("nvidia-uvm-tools".to_owned(), "508:1".to_owned()),
        ];
        nodes.extend((0..8).map(|i| (format!("nvidia{i}"), format!("195:{i}"))));
        for (name, numbers) in nodes {
            host.write(&format!("dev/{name}"), "");
            host.link(&format!("../{name}"), &format!("dev/char/{numbers}"));
        }
        host.write("proc/4242/comm", "nv-fabricmanager\n");
        host.write("proc/1/comm", "systemd\n");
        host.write("etc/containerd/config.toml", CONTAINERD_NVIDIA);
        host.write("usr/bin/nvidia-container-runtime", "");
        host.write("var/run/cdi/nvidia.yaml", &cdi_spec(&uuids(node), &[]));
        for sock in [
            "var/lib/kubelet/device-plugins/kubelet.sock",
            "var/lib/kubelet/pod-resources/kubelet.sock",
            "var/lib/kubelet/device-plugins/nvidia-gpu.sock",
        ] {
            host.write(sock, "");
        }
        host.write(
            "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint",
            r#"{"Data":{"RegisteredDevices":{"nvidia.com/gpu":["GPU-0"]}}}"#,
        );
        host.write("kmsg", "");
        host
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn write(&self, rel: &str, text: &str) {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    pub fn link(&self, target: &str, rel: &str) {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, path).unwrap();
    }

    pub fn remove(&self, rel: &str) {
        std::fs::remove_file(self.path(rel)).unwrap();
    }
}

/// containerd's config with NVIDIA's runtime registered.
pub const CONTAINERD_NVIDIA: &str = r#"version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
"#;

/// The node's GPU UUIDs, from `gpud inventory`.
pub fn uuids(node: &Node) -> Vec<String> {
    let out = stdout_ok(&node.run(&["inventory", "--format", "json"]));
    let inventory: Value = serde_json::from_str(&out).unwrap();
    inventory["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap().to_owned())
        .collect()
}

/// A CDI spec naming each GPU by index and UUID, plus `extra` names.
pub fn cdi_spec(uuids: &[String], extra: &[&str]) -> String {
    let mut text = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n".to_owned();
    for (index, uuid) in uuids.iter().enumerate() {
        for name in [index.to_string(), uuid.clone()] {
            text.push_str(&format!(
                "- name: {name}\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia{index}\n"
            ));
        }
    }
    for name in extra {
        text.push_str(&format!("- name: {name}\n  containerEdits: {{}}\n"));
    }
    text.push_str("containerEdits: {}\n");
    text
}
