//! Pod attribution of devices allocated through DRA claims (the pod-resources answer's dynamic
//! resources), beside device-plugin allocations in the same answer: whole GPUs on dgx-h100,
//! MIG devices on a100-mig, claims shared by several pods, and the devices that must be left
//! out (another driver, another node's pool, a name the node does not have).

use std::time::{Duration, Instant};

use crate::common::Node;
use crate::harness::family;
use crate::kubelet::{ClaimHolder, FakeKubelet, Holder, answer, with_claims};
use crate::pods::start;

/// The driver gpud attributes by default.
const GPU: &str = "gpu.nvidia.com";
/// The pool of this node (NODE_NAME of the test harness).
const POOL: &str = "test-node";

/// The label sets (everything before the value) of every `metric` sample, in body order.
fn label_sets<'a>(body: &'a str, metric: &str) -> Vec<&'a str> {
    family(body, metric)
        .into_iter()
        .map(|l| l.rsplit_once(' ').unwrap().0)
        .collect()
}

/// Waits until the fake kubelet has answered `more` further `List` calls.
fn polls(kubelet: &FakeKubelet, more: usize) {
    let until = kubelet.calls() + more;
    let deadline = Instant::now() + Duration::from_secs(20);
    while kubelet.calls() < until {
        assert!(Instant::now() < deadline, "the exporter stopped polling");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const H100_UUIDS: [&str; 8] = [
    "GPU-50679f0e-63af-04db-1989-74b23d854dbf",
    "GPU-9b266fff-626c-364f-39b6-4685154e8afb",
    "GPU-821ab636-9dc4-0696-e2eb-c98790d91e14",
    "GPU-dc11538d-fbed-91ef-42be-1508c18a34b7",
    "GPU-1a8e9568-3ea5-41d5-c5e7-805da923b6c9",
    "GPU-bcbe4e81-e99a-f2ce-bfe5-f1955b68a17b",
    "GPU-27613b14-2eef-f4c6-ddc4-87eebf06ef86",
    "GPU-20f73337-b91f-b084-c12c-872066f58c4c",
];

const H100_BUS_IDS: [&str; 8] = [
    "00000000:18:00.0",
    "00000000:2A:00.0",
    "00000000:3A:00.0",
    "00000000:5D:00.0",
    "00000000:9A:00.0",
    "00000000:AB:00.0",
    "00000000:BA:00.0",
    "00000000:DB:00.0",
];

#[test]
fn whole_gpu_claims_beside_device_plugin_allocations_on_dgx_h100() {
    let node = Node::new("dgx-h100");
    let pods = with_claims(
        answer(&[Holder {
            namespace: "ml",
            pod: "legacy",
            container: "c",
            resource: "nvidia.com/gpu",
            ids: &[H100_UUIDS[0]],
        }]),
        &[
            ClaimHolder {
                namespace: "ml",
                pod: "trainer",
                container: "main",
                claim: "two-gpus",
                devices: &[(GPU, POOL, "gpu-3"), (GPU, POOL, "gpu-5")],
            },
            // One claim referenced by two pods: both get the series.
            ClaimHolder {
                namespace: "ml",
                pod: "share-b",
                container: "app",
                claim: "shared",
                devices: &[(GPU, POOL, "gpu-6")],
            },
            ClaimHolder {
                namespace: "ml",
                pod: "share-a",
                container: "app",
                claim: "shared",
                devices: &[(GPU, POOL, "gpu-6")],
            },
            // Not this node's GPUs: another driver, another pool, a name nothing has.
            ClaimHolder {
                namespace: "x",
                pod: "ignored",
                container: "c",
                claim: "other",
                devices: &[
                    ("gpu.example.com", POOL, "gpu-1"),
                    (GPU, "other-node", "gpu-2"),
                    (GPU, POOL, "gpu-42"),
                ],
            },
        ],
    );
    let kubelet = FakeKubelet::start(&node.dir.path().join("kubelet.sock"), pods);
    let mut exporter = start(&node, &kubelet, &[]);
    let body = exporter.metrics_until(20, |b| b.contains("pod=\"share-b\""));

    let series = |gpu: usize, pod: &str| {
        format!(
            "DCGM_FI_DEV_FB_USED{{gpu=\"{gpu}\",UUID=\"{}\",pci_bus_id=\"{}\",device=\"nvidia{gpu}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"test-node\",DCGM_FI_DRIVER_VERSION=\"570.133.20\"{pod}}}",
            H100_UUIDS[gpu], H100_BUS_IDS[gpu]
        )
    };
    let pod = |ns: &str, pod: &str, container: &str| {
        format!(",container=\"{container}\",namespace=\"{ns}\",pod=\"{pod}\"")
    };
    let want = [
        series(0, &pod("ml", "legacy", "c")),
        series(1, ""),
        series(2, ""),
        series(3, &pod("ml", "trainer", "main")),
        series(4, ""),
        series(5, &pod("ml", "trainer", "main")),
        series(6, &pod("ml", "share-a", "app")),
        series(6, &pod("ml", "share-b", "app")),
        series(7, ""),
    ];
    assert_eq!(label_sets(&body, "DCGM_FI_DEV_FB_USED"), want);
    assert!(
        body.contains("\ngpud_pod_resources_unresolved_devices 1\n"),
        "{body}"
    );

    // The unknown name is logged once, however many polls keep it.
    polls(&kubelet, 5);
    exporter.drain_log();
    let logged: Vec<&String> = exporter
        .log
        .iter()
        .filter(|l| l.contains("A DRA claim holds a device this node does not have"))
        .collect();
    assert_eq!(logged.len(), 1, "{:?}", exporter.log);
    assert!(logged[0].contains("gpu-42"), "{}", logged[0]);
}

#[test]
fn mig_device_claims_on_a100_mig() {
    let node = Node::new("a100-mig");
    // GPU instances 1 (3g.40gb at 4), 4 (2g.20gb at 2) and 8 (1g.10gb at 1).
    let pods = with_claims(
        answer(&[Holder {
            namespace: "ml",
            pod: "big",
            container: "c",
            resource: "nvidia.com/mig-3g.40gb",
            ids: &["MIG-7fe92cb3-f842-6aff-9763-b6bc90e0610e"],
        }]),
        &[
            ClaimHolder {
                namespace: "ml",
                pod: "small",
                container: "c",
                claim: "one-slice",
                devices: &[(GPU, POOL, "gpu-0-mig-1g10gb-19-1")],
            },
            // A MIG-enabled GPU is not a DRA device, and a destroyed MIG device is gone.
            ClaimHolder {
                namespace: "ml",
                pod: "stale",
                container: "c",
                claim: "gone",
                devices: &[(GPU, POOL, "gpu-0"), (GPU, POOL, "gpu-0-mig-1g10gb-19-0")],
            },
        ],
    );
    let kubelet = FakeKubelet::start(&node.dir.path().join("kubelet.sock"), pods);
    let exporter = start(&node, &kubelet, &[]);
    let body = exporter.metrics_until(20, |b| b.contains("pod=\"small\""));
    let prefix = "DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-92943319-76de-de32-f55a-b6a72767408c\",pci_bus_id=\"00000000:07:00.0\",device=\"nvidia0\",modelName=\"NVIDIA A100-SXM4-80GB\"";
    let line = |gi: &str, pod: &str| {
        format!(
            "{prefix},GPU_I_PROFILE=\"{gi}\",Hostname=\"test-node\",DCGM_FI_DRIVER_VERSION=\"570.133.20\"{pod}}}"
        )
    };
    let sets = label_sets(&body, "DCGM_FI_DEV_FB_USED");
    let mut sorted = sets.clone();
    sorted.sort_unstable();
    let mut want = vec![
        line(
            "3g.40gb\",GPU_I_ID=\"1",
            ",container=\"c\",namespace=\"ml\",pod=\"big\"",
        ),
        line("2g.20gb\",GPU_I_ID=\"4", ""),
        line(
            "1g.10gb\",GPU_I_ID=\"8",
            ",container=\"c\",namespace=\"ml\",pod=\"small\"",
        ),
    ];
    want.sort_unstable();
    assert_eq!(sorted, want, "{body}");
    assert!(
        body.contains("\ngpud_pod_resources_unresolved_devices 2\n"),
        "{body}"
    );
}

#[test]
fn the_dra_driver_name_is_configurable() {
    let node = Node::new("dgx-h100");
    let pods = with_claims(
        answer(&[]),
        &[ClaimHolder {
            namespace: "ml",
            pod: "p",
            container: "c",
            claim: "claim",
            devices: &[("gpu.example.com", POOL, "gpu-1"), (GPU, POOL, "gpu-2")],
        }],
    );
    let kubelet = FakeKubelet::start(&node.dir.path().join("kubelet.sock"), pods);
    let exporter = start(
        &node,
        &kubelet,
        &["--kubernetes-dra-driver-name", "gpu.example.com"],
    );
    let body = exporter.metrics_until(20, |b| b.contains("pod=\"p\""));
    let attributed: Vec<&str> = family(&body, "DCGM_FI_DEV_FB_USED")
        .into_iter()
        .filter(|l| l.contains("pod=\"p\""))
        .collect();
    assert_eq!(attributed.len(), 1, "{attributed:?}");
    assert!(attributed[0].starts_with("DCGM_FI_DEV_FB_USED{gpu=\"1\","));
    assert!(body.contains("\ngpud_pod_resources_unresolved_devices 0\n"));
}
