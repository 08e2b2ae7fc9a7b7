//! Where the daemons keep their state: the MIG reconciler's directory follows `--state-dir`
//! (`<state-dir>/mig`) unless `--mig-state-dir` names one, in `gpud run` as in `gpud mig
//! reconcile`, and `gpud doctor` reads the reconciler's record from the same place.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_api.rs"]
mod fake_api;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use common::Node;
use fake_api::FakeApi;
use serde_json::json;

const CONFIG_LABEL: &str = "nvidia.com/mig.config";
const STATE_LABEL: &str = "nvidia.com/mig.config.state";

fn default_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/mig/config-default.yaml")
}

/// A running gpud, killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The reconciler's last state as recorded in `dir`, if any.
fn record(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("last-state.json")).unwrap_or_default();
    serde_json::from_str(&text).unwrap_or_default()
}

#[test]
fn gpud_run_keeps_the_mig_state_under_its_state_dir() {
    let node = Node::new("a100-mig");
    let api = FakeApi::start(json!({CONFIG_LABEL: "all-1g.10gb"}));
    let kubeconfig = api.kubeconfig(node.dir.path());
    let state_dir = node.dir.path().join("elsewhere");
    let child = node
        .gpud(&[
            "run",
            "--disable",
            "device-plugin,labeller,exporter",
            "--health-address",
            "",
            "--kmsg",
            "",
            "--doctor-interval",
            "0",
            "--node-name",
            "test-node",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--mig-config-file",
            default_config().to_str().unwrap(),
            "--state-dir",
            state_dir.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _gpud = Running(child);
    common::until("the Node's state success", 60, || {
        match api.node_labels().get(STATE_LABEL) {
            Some(state) if state == "success" => Ok(()),
            other => Err(format!("{STATE_LABEL}: {other:?}")),
        }
    });
    let mig = state_dir.join("mig");
    common::until("the recorded state success", 10, || {
        let record = record(&mig);
        (record["state"] == "success")
            .then_some(())
            .ok_or_else(|| record.to_string())
    });
    assert_eq!(record(&mig)["config"], "all-1g.10gb");
    // Nothing under the harness's own state directory (GPUD_STATE_DIR): the flag won.
    assert!(!node.dir.path().join("state/mig").exists());

    // The doctor, given the same --state-dir, finds the reconciler's record there.
    let cfg = default_config();
    let out = node.run(&[
        "doctor",
        "--only",
        "mig.config",
        "--json",
        "--mig-config-file",
        cfg.to_str().unwrap(),
        "--state-dir",
        state_dir.to_str().unwrap(),
    ]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = report.to_string();
    // Only the record names the config to check: the file holds many, none selected.
    assert!(
        text.contains("config all-1g.10gb of "),
        "the doctor did not read the reconciler's config from {}: {text}",
        mig.display()
    );
}

#[test]
fn mig_state_dir_given_wins_over_state_dir() {
    let node = Node::new("a100-mig");
    let api = FakeApi::start(json!({CONFIG_LABEL: "all-1g.10gb"}));
    let kubeconfig = api.kubeconfig(node.dir.path());
    let state_dir = node.dir.path().join("elsewhere");
    let mig = node.dir.path().join("mig-here");
    let child = node
        .gpud(&[
            "mig",
            "reconcile",
            "--health-address",
            "",
            "--node-name",
            "test-node",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--mig-config-file",
            default_config().to_str().unwrap(),
            "--state-dir",
            state_dir.to_str().unwrap(),
            "--mig-state-dir",
            mig.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _gpud = Running(child);
    common::until("the recorded state success", 60, || {
        let record = record(&mig);
        (record["state"] == "success")
            .then_some(())
            .ok_or_else(|| record.to_string())
    });
    assert!(!state_dir.join("mig").exists());
}
