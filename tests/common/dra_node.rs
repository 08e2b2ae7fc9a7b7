//! `gpud dra` on a simulated node with the fake API server and the fake kubelet's DRA calls:
//! the small harness of the tests that look at what the plugin writes to the API server
//! beside its slices (claims' device status, DeviceTaintRules).

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Child;

use serde_json::{Value, json};

use crate::common::Node;
use crate::fake_api::FakeApi;
use crate::fake_dra_kubelet;
use gpud::proto::dra_v1::{
    NodePrepareResourcesRequest, NodePrepareResourcesResponse, NodeUnprepareResourcesRequest,
};

pub const DRIVER: &str = "gpu.nvidia.com";

/// A node with gpud's DRA plugin and the fake API server.
pub struct DraNode {
    pub node: Node,
    pub api: FakeApi,
    gpud: Option<Child>,
}

impl DraNode {
    pub fn new(fixture: &str) -> DraNode {
        DraNode {
            node: Node::new(fixture),
            api: FakeApi::start(json!({})),
            gpud: None,
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.node.dir.path().join(rel)
    }

    /// Starts `gpud <applet…> <DRA flags>` with stderr in `<node>/gpud.log`.
    pub fn start(&mut self, applet: &[&str]) {
        let kubeconfig = self.api.kubeconfig(self.node.dir.path());
        let mut args: Vec<String> = applet.iter().map(|a| (*a).to_owned()).collect();
        args.extend(self.node.dra_flags());
        args.extend(
            [
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--kmsg",
                "",
                "--health-poll-interval",
                "50ms",
            ]
            .map(String::from),
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("gpud.log"))
            .unwrap();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.gpud = Some(self.node.gpud(&args).stderr(log).spawn().unwrap());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("gpud.log")).unwrap_or_default()
    }

    /// gpud's log once it holds `line`.
    pub fn log_when(&self, line: &str) -> String {
        crate::common::file_when(&self.path("gpud.log"), line, 15)
    }

    /// Waits up to 15 s for `check`, with gpud's log in the failure.
    pub fn until<T>(&self, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
        crate::common::until(what, 15, || {
            check().ok_or_else(|| format!("gpud's log:\n{}", self.log()))
        })
    }

    /// Waits for the registration socket, then registers as the kubelet does.
    pub async fn register(&self) {
        let socket = self.path("plugins_registry/gpu.nvidia.com-reg.sock");
        self.until("the registration socket", || {
            std::os::unix::net::UnixStream::connect(&socket).ok()
        });
        fake_dra_kubelet::register(&socket).await;
    }

    /// A claim in namespace `ns` allocated `devices` of this node for request `gpu`.
    pub fn put_claim(&self, name: &str, uid: &str, devices: &[&str]) {
        let results: Vec<Value> = devices
            .iter()
            .map(|d| json!({"request": "gpu", "driver": DRIVER, "pool": "test-node", "device": d}))
            .collect();
        self.api.put_claim(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "ns", "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": results, "config": []}}}
        }));
    }

    pub async fn prepare(&self, name: &str, uid: &str) -> NodePrepareResourcesResponse {
        let request = NodePrepareResourcesRequest {
            claims: vec![fake_dra_kubelet::claim_v1("ns", name, uid)],
        };
        fake_dra_kubelet::prepare_v1(&self.path("plugins/gpu.nvidia.com/dra.sock"), request).await
    }

    /// Unprepares the claim; its error ("" when none).
    pub async fn unprepare(&self, name: &str, uid: &str) -> String {
        let request = NodeUnprepareResourcesRequest {
            claims: vec![fake_dra_kubelet::claim_v1("ns", name, uid)],
        };
        let socket = self.path("plugins/gpu.nvidia.com/dra.sock");
        let answer = fake_dra_kubelet::unprepare_v1(&socket, request).await;
        answer.claims[uid].error.clone()
    }

    /// GPU `index`'s UUID, from `gpud inventory`.
    pub fn uuid(&self, index: usize) -> String {
        let inventory: Value =
            serde_json::from_str(&crate::common::stdout_ok(&self.node.run(&["inventory"])))
                .unwrap();
        inventory["gpus"][index]["uuid"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

impl Drop for DraNode {
    fn drop(&mut self) {
        if let Some(mut child) = self.gpud.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- gpud's log ---\n{}", self.log());
        }
    }
}
