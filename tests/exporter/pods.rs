//! Pod attribution against a fake kubelet: whole GPUs by UUID and by index, MIG devices by UUID
//! and by index, time-sliced replicas shared by several pods, the kubelet going away, and `List`
//! staying off the scrape path.

use crate::common::{Node, stdout_ok};
use crate::harness::{Exporter, family};
use crate::kubelet::{FakeKubelet, Holder, answer};

/// GPU UUIDs and, per GPU, MIG device UUIDs, from `gpud inventory`.
fn uuids(node: &Node) -> Vec<(String, Vec<String>)> {
    let json: serde_json::Value =
        serde_json::from_str(&stdout_ok(&node.run(&["inventory"]))).unwrap();
    json["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let migs = g["mig"]["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["uuid"].as_str().unwrap().to_owned())
                .collect();
            (g["uuid"].as_str().unwrap().to_owned(), migs)
        })
        .collect()
}

/// The pod part of a sample line (`container=…,namespace=…,pod=…[,vgpu=…]`), or "" without.
fn pod_labels(line: &str) -> String {
    match line.find(",container=") {
        Some(at) => line[at + 1..line.rfind('}').unwrap()].to_owned(),
        None => String::new(),
    }
}

/// Pod labels of every `metric` sample of GPU `gpu` (and GPU instance `gi`), in order.
fn holders(body: &str, metric: &str, gpu: u32, gi: Option<u32>) -> Vec<String> {
    family(body, metric)
        .into_iter()
        .filter(|l| l.contains(&format!("{{gpu=\"{gpu}\",")))
        .filter(|l| gi.is_none_or(|gi| l.contains(&format!(",GPU_I_ID=\"{gi}\","))))
        .map(pod_labels)
        .collect()
}

/// `gpud exporter -k` against `kubelet`, polling every 100 ms.
pub fn start(node: &Node, kubelet: &FakeKubelet, extra: &[&str]) -> Exporter {
    let socket = kubelet.socket.to_str().unwrap().to_owned();
    let mut args = vec![
        "-k",
        "--pod-resources-kubelet-socket",
        &socket,
        "--pod-resources-poll-interval",
        "100ms",
    ];
    args.extend_from_slice(extra);
    Exporter::start(node, &args)
}

#[test]
fn whole_gpus_by_uuid_and_by_index() {
    let node = Node::new("dgx-h100");
    let ids = uuids(&node);
    let kubelet = FakeKubelet::start(
        &node.dir.path().join("kubelet.sock"),
        answer(&[
            Holder {
                namespace: "ml",
                pod: "trainer-0",
                container: "main",
                resource: "nvidia.com/gpu",
                ids: &[&ids[0].0, &ids[5].0],
            },
            Holder {
                namespace: "ml",
                pod: "eval",
                container: "worker",
                resource: "nvidia.com/gpu",
                ids: &["3"],
            },
        ]),
    );
    let exporter = start(&node, &kubelet, &[]);
    let body = exporter.metrics_until(20, |b| b.contains("pod=\"eval\""));
    let trainer = "container=\"main\",namespace=\"ml\",pod=\"trainer-0\"";
    for (gpu, want) in [
        (0, trainer),
        (1, ""),
        (3, "container=\"worker\",namespace=\"ml\",pod=\"eval\""),
        (5, trainer),
    ] {
        assert_eq!(
            holders(&body, "DCGM_FI_DEV_GPU_UTIL", gpu, None),
            [want],
            "GPU {gpu}"
        );
    }
    // Attributes are sorted: err_code and err_msg fall between container and namespace.
    let xid = family(&body, "DCGM_FI_DEV_XID_ERRORS")
        .into_iter()
        .find(|l| l.contains("{gpu=\"3\","))
        .unwrap();
    assert!(
        xid.ends_with(",container=\"worker\",err_code=\"0\",err_msg=\"No Error\",namespace=\"ml\",pod=\"eval\"} 0"),
        "{xid}"
    );
    assert!(body.contains("\ngpud_pod_resources_up 1\n"));
}

#[test]
fn time_sliced_gpu_gets_one_series_per_pod() {
    let node = Node::new("dgx-h100");
    let ids = uuids(&node);
    let replica = |n: u32| format!("{}::{n}", ids[1].0);
    let (r0, r3, r4, r7) = (replica(0), replica(3), replica(4), replica(7));
    let kubelet = FakeKubelet::start(
        &node.dir.path().join("kubelet.sock"),
        answer(&[
            Holder {
                namespace: "a",
                pod: "notebook",
                container: "jupyter",
                resource: "nvidia.com/gpu",
                ids: &[&r3],
            },
            Holder {
                namespace: "b",
                pod: "batch",
                container: "job",
                resource: "nvidia.com/gpu",
                ids: &[&r7, &r0],
            },
            Holder {
                namespace: "c",
                pod: "renamed",
                container: "app",
                resource: "nvidia.com/gpu.shared",
                ids: &[&r4],
            },
        ]),
    );
    let exporter = start(
        &node,
        &kubelet,
        &["--nvidia-resource-names", "nvidia.com/gpu.shared"],
    );
    let body = exporter.metrics_until(20, |b| b.contains("pod=\"renamed\""));
    assert_eq!(
        holders(&body, "DCGM_FI_DEV_FB_USED", 1, None),
        [
            "container=\"jupyter\",namespace=\"a\",pod=\"notebook\",vgpu=\"3\"",
            "container=\"job\",namespace=\"b\",pod=\"batch\",vgpu=\"0,7\"",
            "container=\"app\",namespace=\"c\",pod=\"renamed\",vgpu=\"4\"",
        ]
    );
    let values: Vec<&str> = family(&body, "DCGM_FI_DEV_FB_USED")
        .into_iter()
        .filter(|l| l.contains("{gpu=\"1\","))
        .map(|l| l.rsplit_once(' ').unwrap().1)
        .collect();
    assert!(
        values.windows(2).all(|w| w[0] == w[1]),
        "same device value: {values:?}"
    );
    assert_eq!(holders(&body, "DCGM_FI_DEV_FB_USED", 2, None), [""]);
}

#[test]
fn mig_devices_by_uuid_and_by_index() {
    let node = Node::new("a100-mig");
    let ids = uuids(&node);
    let migs = &ids[0].1;
    assert_eq!(migs.len(), 3);
    // MIG devices are enumerated by GI id: index 0 is GI 1 (3g), 1 is GI 4 (2g), 2 is GI 8 (1g).
    let kubelet = FakeKubelet::start(
        &node.dir.path().join("kubelet.sock"),
        answer(&[
            Holder {
                namespace: "ml",
                pod: "big",
                container: "c",
                resource: "nvidia.com/mig-3g.40gb",
                ids: &[&migs[0]],
            },
            Holder {
                namespace: "ml",
                pod: "small",
                container: "c",
                resource: "nvidia.com/mig-1g.10gb",
                ids: &["0:2"],
            },
        ]),
    );
    let exporter = start(&node, &kubelet, &[]);
    let body = exporter.metrics_until(20, |b| b.contains("pod=\"small\""));
    assert_eq!(
        holders(&body, "DCGM_FI_DEV_FB_USED", 0, Some(1)),
        ["container=\"c\",namespace=\"ml\",pod=\"big\""]
    );
    assert_eq!(holders(&body, "DCGM_FI_DEV_FB_USED", 0, Some(4)), [""]);
    assert_eq!(
        holders(&body, "DCGM_FI_DEV_FB_USED", 0, Some(8)),
        ["container=\"c\",namespace=\"ml\",pod=\"small\""]
    );
}

#[test]
fn kubelet_gone_drops_labels_but_not_the_scrape() {
    let node = Node::new("pcie-4gpu");
    let ids = uuids(&node);
    let socket = node.dir.path().join("kubelet.sock");
    let pods = answer(&[Holder {
        namespace: "ml",
        pod: "p",
        container: "c",
        resource: "nvidia.com/gpu",
        ids: &[&ids[2].0],
    }]);
    let kubelet = FakeKubelet::start(&socket, pods.clone());
    let mut exporter = start(&node, &kubelet, &[]);
    exporter.metrics_until(20, |b| b.contains("pod=\"p\""));

    drop(kubelet);
    let body = exporter.metrics_until(20, |b| {
        !b.contains("pod=\"p\"") && b.contains("\ngpud_pod_resources_up 0\n")
    });
    assert_eq!(
        family(&body, "DCGM_FI_DEV_GPU_UTIL").len(),
        4,
        "every GPU still reported"
    );
    assert_eq!(exporter.get("/metrics").status, 200);
    exporter.drain_log();
    let off = exporter
        .log
        .iter()
        .filter(|l| l.contains("Pod attribution off"))
        .count();
    assert_eq!(off, 1, "one line, not one per poll: {:?}", exporter.log);

    let _back = FakeKubelet::start(&socket, pods);
    exporter.metrics_until(20, |b| {
        b.contains("pod=\"p\"") && b.contains("\ngpud_pod_resources_up 1\n")
    });
}

#[test]
fn scrapes_never_call_the_kubelet() {
    let node = Node::new("pcie-4gpu");
    let kubelet = FakeKubelet::start(&node.dir.path().join("kubelet.sock"), answer(&[]));
    let socket = kubelet.socket.to_str().unwrap().to_owned();
    let exporter = Exporter::start(
        &node,
        &[
            "-k",
            "--pod-resources-kubelet-socket",
            &socket,
            "--pod-resources-poll-interval",
            "1h",
        ],
    );
    exporter.metrics_until(20, |b| b.contains("\ngpud_pod_resources_up 1\n"));
    let before = kubelet.calls();
    for _ in 0..50 {
        assert_eq!(exporter.get("/metrics").status, 200);
    }
    assert_eq!(kubelet.calls(), before, "50 scrapes, no List");
    assert_eq!(
        before, 1,
        "one List at start, the next after the poll interval"
    );
    kubelet.set(answer(&[]));
}
