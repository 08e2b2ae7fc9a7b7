//! Files gpud writes get their documented mode whatever the umask: the NFD features file and
//! the CDI spec are 0644 (their readers may run as other users) under umask 000 and 077 alike.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::Node;

const UMASKS: [&str; 2] = ["000", "077"];

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn run_ok(node: &Node, umask: &str, args: &[&str]) {
    let output = node.gpud_under_umask(umask, args).output().unwrap();
    assert!(
        output.status.success(),
        "gpud {args:?} under umask {umask}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn features_file_is_0644_under_any_umask() {
    for umask in UMASKS {
        let node = Node::new("pcie-4gpu");
        let out = node.dir.path().join("gfd");
        run_ok(
            &node,
            umask,
            &["labeller", "--oneshot", "-o", out.to_str().unwrap()],
        );
        let labels = std::fs::read_to_string(&out).unwrap();
        assert!(labels.contains("nvidia.com/gpu.count=4\n"), "{labels}");
        assert_eq!(mode(&out), 0o644, "umask {umask}");
    }
}

#[test]
fn cdi_spec_is_0644_under_any_umask() {
    for umask in UMASKS {
        let node = Node::new("empty");
        let root = node.dir.path().join("driver");
        std::fs::create_dir(&root).unwrap();
        let out = node.dir.path().join("cdi/nvidia.yaml");
        let missing_hook = node.dir.path().join("no-hook");
        run_ok(
            &node,
            umask,
            &[
                "cdi",
                "generate",
                "--output",
                out.to_str().unwrap(),
                "--driver-root",
                root.to_str().unwrap(),
                "--nvidia-cdi-hook-path",
                missing_hook.to_str().unwrap(),
            ],
        );
        common::assert_golden("cdi/empty.yaml", &std::fs::read_to_string(&out).unwrap());
        assert_eq!(mode(&out), 0o644, "umask {umask}");
    }
}
