//! Kubernetes 1.37's side of DRA: `resource.kubernetes.io/numaNode` as a list where the API
//! server keeps list-type attributes (the scalar elsewhere, said once), the scheduler's
//! extended-resource claims (KEP-5004) prepared like any other, and `gpud run` offering each
//! extended resource name one way only.

use super::*;

/// A two-socket node with each socket split in two NUMA nodes (sub-NUMA clustering): nodes 0
/// and 1 on socket 0, 2 and 3 on socket 1, siblings at distance 12, the other socket at 21.
fn numa_tree(dra: &Dra) {
    let rows = ["10 12 21 21", "12 10 21 21", "21 21 10 12", "21 21 12 10"];
    for (node, row) in rows.iter().enumerate() {
        let dir = dra.path(&format!("sys/devices/system/node/node{node}"));
        std::fs::create_dir_all(&dir).unwrap();
        let first = node * 16;
        std::fs::write(dir.join("cpulist"), format!("{first}-{}\n", first + 15)).unwrap();
        std::fs::write(dir.join("distance"), format!("{row}\n")).unwrap();
        let topology = dra.path(&format!("sys/devices/system/cpu/cpu{first}/topology"));
        std::fs::create_dir_all(&topology).unwrap();
        std::fs::write(
            topology.join("physical_package_id"),
            format!("{}\n", node / 2),
        )
        .unwrap();
    }
}

const NUMA: &str = "resource.kubernetes.io/numaNode";

const LISTS_OFF_1_34: &str = "Publishing resource.kubernetes.io/numaNode as the GPU's NUMA \
    node alone (an int): the API server is Kubernetes 1.34, which has no list-type attributes; \
    they need Kubernetes 1.36 or newer with feature gate DRAListTypeAttributes";
const LISTS_REFUSED: &str = "The API server does not keep list-type attributes (feature gate \
    DRAListTypeAttributes is off there): publishing resource.kubernetes.io/numaNode as the \
    GPU's NUMA node alone (an int); enable DRAListTypeAttributes on the API server and the \
    scheduler to publish it with the nearest NUMA nodes of the GPU's socket";

/// Whether any device of a slice write carries a list-type attribute.
fn has_lists(write: &Value) -> bool {
    write["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|d| d["attributes"][NUMA].get("ints").is_some())
}

/// `gpud dra` on dgx-h100 (GPUs 0–3 on NUMA node 0, 4–7 on node 1) with the NUMA tree, once
/// `api` has set the API server up.
async fn numa_node(api: impl FnOnce(&FakeApi)) -> Dra {
    let mut dra = Dra::new("dgx-h100");
    numa_tree(&dra);
    api(&dra.api);
    dra.start();
    dra.register().await;
    dra
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_37_server_keeping_lists_gets_numa_node_with_the_sockets_nearest_node() {
    let dra = numa_node(|api| {
        api.set_server_version(Some("v1.37.0"));
        api.enable_gate("DRAListTypeAttributes");
    })
    .await;
    let slices = dra.slices_when("slices", |_| true);
    assert_golden("dra/dgx-h100-1.37.json", &render(&slices));
    let lists: Vec<Value> = (0..8)
        .map(|i| device(&slices, &format!("gpu-{i}"))["attributes"][NUMA].clone())
        .collect();
    let expected: Vec<Value> = (0..8)
        .map(|i| match i < 4 {
            true => json!({"ints": [0, 1]}),
            false => json!({"ints": [1, 0]}),
        })
        .collect();
    assert_eq!(lists, expected);
    // The list is all that changes: with the scalar back, NVIDIA's devices exactly.
    let scalar: Vec<Value> = all_devices(&slices)
        .into_iter()
        .map(|mut d| {
            let node = d["attributes"][NUMA]["ints"][0].clone();
            d["attributes"][NUMA] = json!({"int": node});
            d
        })
        .collect();
    assert_eq!(scalar, golden_devices("dgx-h100.json"));
    // Written once, refused never, nothing said.
    assert_eq!(dra.api.slice_writes().len(), 1);
    assert!(dra.api.log().iter().all(|r| r.status != 422));
    assert_eq!(log_count(&dra, "list-type attributes"), 0, "{}", dra.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_34_server_gets_the_scalar_numa_node_and_gpud_says_so_once() {
    let dra = numa_node(|api| api.set_server_version(Some("v1.34.2"))).await;
    let slices = dra.slices_when("slices", |_| true);
    assert_eq!(all_devices(&slices), golden_devices("dgx-h100.json"));
    dra.log_when(LISTS_OFF_1_34);
    // Published again after the kubelet's wipe: still no list sent, and no second message.
    dra.api.wipe_slices("test-node");
    dra.until("the slices published again", || {
        (dra.api.slice_writes().len() == 2 && !dra.api.slices().is_empty()).then_some(())
    });
    assert!(!dra.api.slice_writes().iter().any(has_lists));
    assert_eq!(log_count(&dra, LISTS_OFF_1_34), 1, "{}", dra.log());
    assert_eq!(log_count(&dra, "list-type attributes"), 1, "{}", dra.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_the_gate_off_refuses_the_list_once_and_gets_the_scalar() {
    // 1.37 with DRAListTypeAttributes off: the list is dropped and the attribute, left
    // without a value, refused (422).
    let dra = numa_node(|api| api.set_server_version(Some("v1.37.0"))).await;
    dra.log_when(LISTS_REFUSED);
    let slices = dra.slices_when("slices", |_| true);
    assert_eq!(all_devices(&slices), golden_devices("dgx-h100.json"));
    // The refused write took no generation: the scalar slices are generation 1.
    assert_eq!(generation(&slices), 1);
    let writes: Vec<bool> = dra.api.slice_writes().iter().map(has_lists).collect();
    assert_eq!(writes, [true, false]);
    let refused = dra
        .api
        .requests_to("POST", "/apis/resource.k8s.io/v1/resourceslices")
        .iter()
        .filter(|r| r.status == 422)
        .count();
    assert_eq!(refused, 1);
    dra.api.wipe_slices("test-node");
    dra.until("the slices published again", || {
        (dra.api.slice_writes().len() == 3 && !dra.api.slices().is_empty()).then_some(())
    });
    assert!(!has_lists(&dra.api.slice_writes()[2]));
    assert_eq!(log_count(&dra, "list-type attributes"), 1, "{}", dra.log());
}

/// The scheduler's claim for pod `pod`'s extended resources: named
/// `<pod>-extended-resources-<suffix>`, annotated, owned by the pod, with one request per
/// (container, resource) and the class's config only.
fn extended_claim(pod: &str, uid: &str, results: &[(&str, &str)], class_config: Value) -> Value {
    let results: Vec<Value> = results
        .iter()
        .map(|(request, device)| {
            json!({"request": request, "driver": DRIVER, "pool": "test-node", "device": device})
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "ns", "name": format!("{pod}-extended-resources-x7k2p"),
            "uid": uid,
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod,
                "uid": format!("{pod}-uid"), "controller": true}]},
        "status": {"allocation": {"devices": {"results": results,
            "config": [{"source": "FromClass", "requests": [], "opaque": class_config}]}}}
    })
}

/// The pod as the scheduler leaves it: containers asking for extended resources, no
/// `spec.resourceClaims`, and the claim and its request per container in its status.
fn extended_pod(pod: &str, containers: &[(&str, &str, &str)]) -> Value {
    let specs: Vec<Value> = containers
        .iter()
        .map(|(name, resource, _)| {
            json!({"name": name, "image": "cuda", "resources": {"limits": {*resource: "1"}}})
        })
        .collect();
    let mappings: Vec<Value> = containers
        .iter()
        .map(|(name, resource, request)| {
            json!({"containerName": name, "extendedResourceName": resource,
                "requestName": request})
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "ns", "name": pod, "uid": format!("{pod}-uid")},
        "spec": {"nodeName": "test-node", "containers": specs},
        "status": {"extendedResourceClaimStatus": {
            "resourceClaimName": format!("{pod}-extended-resources-x7k2p"),
            "requestMappings": mappings}}})
}

/// The kubelet's part: each container of `pod` gets the CDI IDs of the devices prepared for
/// the request its status maps it to.
fn routed(pod: &Value, devices: &[Device]) -> BTreeMap<String, Vec<String>> {
    pod["status"]["extendedResourceClaimStatus"]["requestMappings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let request = m["requestName"].as_str().unwrap();
            let ids = devices
                .iter()
                .filter(|d| d.request_names.iter().any(|r| r == request))
                .flat_map(|d| d.cdi_device_ids.clone())
                .collect();
            (m["containerName"].as_str().unwrap().to_owned(), ids)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedulers_extended_resource_claim_is_prepared_like_any_other() {
    // A mixed-strategy pod: nvidia.com/mig-1g.10gb for one container, nvidia.com/mig-2g.20gb
    // for the other, through classes mig-1g-10gb.gpu.nvidia.com and mig-2g-20gb.gpu.nvidia.com.
    let mut dra = Dra::new("a100-mig");
    for gi in 0..15 {
        mig_caps(&dra, gi, 0, 100 + 2 * gi, 101 + 2 * gi);
    }
    dra.start();
    dra.register().await;
    dra.slices_when("slices", |_| true);
    let pod = extended_pod(
        "trainer",
        &[
            ("train", "nvidia.com/mig-1g.10gb", "container-0-request-0"),
            ("eval", "nvidia.com/mig-2g.20gb", "container-1-request-0"),
        ],
    );
    dra.api.put_pod(pod.clone());
    let mig_config = json!({"driver": DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"}});
    let (small, large) = ("gpu-0-mig-1g10gb-19-1", "gpu-0-mig-2g20gb-14-2");
    dra.api.put_claim(extended_claim(
        "trainer",
        "uid-ext",
        &[
            ("container-0-request-0", small),
            ("container-1-request-0", large),
        ],
        mig_config.clone(),
    ));
    let answer = dra
        .prepare("trainer-extended-resources-x7k2p", "uid-ext")
        .await;
    assert_eq!(answer.claims["uid-ext"].error, "");
    let devices = &answer.claims["uid-ext"].devices;
    assert_eq!(
        routed(&pod, devices),
        BTreeMap::from([
            (
                "train".to_owned(),
                vec![format!("k8s.gpu.nvidia.com/claim=uid-ext-{small}")]
            ),
            (
                "eval".to_owned(),
                vec![format!("k8s.gpu.nvidia.com/claim=uid-ext-{large}")]
            ),
        ])
    );
    let spec = std::fs::read_to_string(dra.spec_file("uid-ext")).unwrap();

    // Nothing depends on the request names: the same devices under other names give the same
    // CDI spec, and the answer differs only in the names.
    assert_eq!(
        dra.unprepare("trainer-extended-resources-x7k2p", "uid-ext")
            .await,
        ""
    );
    dra.api.put_claim(extended_claim(
        "other",
        "uid-renamed",
        &[("a", small), ("b", large)],
        mig_config,
    ));
    let again = dra
        .prepare("other-extended-resources-x7k2p", "uid-renamed")
        .await;
    assert_eq!(again.claims["uid-renamed"].error, "");
    let renamed = std::fs::read_to_string(dra.spec_file("uid-renamed")).unwrap();
    assert_eq!(renamed.replace("uid-renamed", "uid-ext"), spec);
    let names: Vec<(Vec<String>, String)> = again.claims["uid-renamed"]
        .devices
        .iter()
        .map(|d| (d.request_names.clone(), d.device_name.clone()))
        .collect();
    assert_eq!(
        names,
        [
            (vec!["a".to_owned()], small.to_owned()),
            (vec!["b".to_owned()], large.to_owned())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_resource_claim_takes_its_class_config() {
    // The same on a 1.34 server (DRAExtendedResource alpha) and a 1.37 one (GA): gpud does
    // nothing special for these claims.
    for server in ["v1.34.2", "v1.37.0"] {
        extended_gpu_claim(server).await;
    }
}

/// nvidia.com/gpu through class gpu.nvidia.com, whose config asks for a Long time slice, on a
/// server of release `server`.
async fn extended_gpu_claim(server: &str) {
    let mut dra = Dra::new("dgx-h100");
    dra.api.set_server_version(Some(server));
    dra.start();
    dra.register().await;
    dra.slices_when("slices", |_| true);
    let pod = extended_pod(
        "worker",
        &[("main", "nvidia.com/gpu", "container-0-request-0")],
    );
    dra.api.put_pod(pod.clone());
    let gpu_config = json!({"driver": DRIVER, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}});
    dra.api.put_claim(extended_claim(
        "worker",
        "uid-gpu",
        &[("container-0-request-0", "gpu-2")],
        gpu_config,
    ));
    let answer = dra
        .prepare("worker-extended-resources-x7k2p", "uid-gpu")
        .await;
    assert_eq!(answer.claims["uid-gpu"].error, "");
    assert_eq!(
        routed(&pod, &answer.claims["uid-gpu"].devices),
        BTreeMap::from([(
            "main".to_owned(),
            vec!["k8s.gpu.nvidia.com/claim=uid-gpu-gpu-2".to_owned()]
        )])
    );
    let gpu2 = dra.uuid(2);
    assert_eq!(
        dra.nvidia_smi_runs(),
        [format!("compute-policy -i {gpu2} --set-timeslice 3")]
    );
}

/// `gpud run --dra` with the device plugin on the fake kubelet, and `owner` as
/// `--extended-resource-owner` (none: not given).
fn run_with_owner(dra: &mut Dra, socket: &std::path::Path, owner: Option<&str>) {
    let mut applet = run_applet(socket);
    // run_applet names the device plugin as owner: take that off, then say what the case says.
    let at = applet
        .iter()
        .position(|a| a == "--extended-resource-owner")
        .unwrap();
    applet.drain(at..at + 2);
    if let Some(owner) = owner {
        applet.extend(["--extended-resource-owner".to_owned(), owner.to_owned()]);
    }
    dra.applet = applet;
    dra.start();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpud_run_offers_each_extended_resource_one_way() {
    // Nobody said which path owns nvidia.com/gpu: a usage error naming it and both paths.
    let mut dra = Dra::new("dgx-h100");
    let mut kubelet = fake_kubelet::FakeKubelet::start(dra.node.dir.path()).await;
    run_with_owner(&mut dra, &kubelet.socket(), None);
    let mut refused = dra.gpud.take().unwrap();
    let status = dra.until("gpud to exit", || refused.try_wait().unwrap());
    assert_eq!(status.code(), Some(64), "{}", dra.log());
    dra.log_when(
        "the device plugin would advertise nvidia.com/gpu, which DeviceClass gpu.nvidia.com \
         also serves through DRA (extendedResourceName): a node must offer a name one way \
         only, else the scheduler serves it through the device plugin here and the DRA path is \
         never used. Say which path owns the names both could offer: \
         --extended-resource-owner=device-plugin (the device plugin keeps advertising \
         nvidia.com/gpu; DRA serves ResourceClaims only) or --extended-resource-owner=dra (the \
         device plugin leaves nvidia.com/gpu out; pods asking for it are served through DRA)",
    );
    assert!(dra.api.slices().is_empty());

    // DRA owns it: the slices are published and the device plugin registers nothing.
    run_with_owner(&mut dra, &kubelet.socket(), Some("dra"));
    dra.register().await;
    let slices = dra.slices_when("slices", |_| true);
    assert_eq!(all_devices(&slices).len(), 8);
    assert!(kubelet.registration_within(1500).await.is_none());
    dra.stop();

    // The device plugin owns it: it registers nvidia.com/gpu as before.
    run_with_owner(&mut dra, &kubelet.socket(), Some("device-plugin"));
    let registration = kubelet.next_registration(15).await;
    assert_eq!(registration.resource_name, "nvidia.com/gpu");
}

#[test]
fn every_mig_device_class_serves_the_device_plugins_mixed_strategy_name() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("packaging/k8s/components/dra/deviceclasses.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let classes: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .collect();
    let mut profiles = Vec::new();
    for class in &classes {
        let name = class["metadata"]["name"].as_str().unwrap();
        let spec = &class["spec"];
        let Some(resource) = spec["extendedResourceName"].as_str() else {
            assert_eq!(name, "mig.nvidia.com");
            continue;
        };
        assert_eq!(
            gpud::resources::extended::dra_class(resource).as_deref(),
            Some(name)
        );
        if name == "gpu.nvidia.com" {
            continue;
        }
        let cel = spec["selectors"][0]["cel"]["expression"].as_str().unwrap();
        let profile = cel
            .rsplit("profile == '")
            .next()
            .unwrap()
            .trim_end_matches('\'');
        assert_eq!(resource, gpud::resources::extended::mig_resource(profile));
        profiles.push(profile.to_owned());
    }
    // The profiles of the simulated A100 and H100, 80GB and 40GB alike, with the media one.
    for profile in [
        "1g.10gb",
        "1g.10gb+me",
        "2g.20gb",
        "3g.40gb",
        "7g.80gb",
        "1g.5gb",
    ] {
        assert!(
            profiles.iter().any(|p| p == profile),
            "{profile}: {profiles:?}"
        );
    }
    assert_eq!(profiles.len(), 32);
}
