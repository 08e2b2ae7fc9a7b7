//! Dynamic MIG (`--dra-dynamic-mig`): counter sets and placement devices in the slices, MIG
//! devices made at prepare and destroyed at unprepare, kept or cleaned up across a restart,
//! and the GPU's health on every device of its counter set.

use super::*;
use crate::pynvml;

use gpud::dra::api_version::ServedFields;
use gpud::dra::objects::{Device as SliceDevice, SliceSpec};
use gpud::dra::partitions::{self, Group};

impl Dra {
    /// A node whose plugin partitions MIG-capable GPUs on demand, with the driver's capability
    /// files for every GPU instance GPU 0 may get.
    fn dynamic(fixture: &str) -> Dra {
        let mut dra = Dra::new(fixture);
        dra.applet = ["dra", "--dra-dynamic-mig", "--rescan-interval", "1h"]
            .map(String::from)
            .to_vec();
        for gi in 0..15 {
            mig_caps(&dra, gi, 0, 100 + 2 * gi, 101 + 2 * gi);
        }
        dra
    }

    /// GPU 0 as `gpud inventory` reads it now.
    fn gpu0(&self) -> Value {
        let out = stdout_ok(&self.node.run(&["inventory", "--format", "json"]));
        let inventory: Value = serde_json::from_str(&out).unwrap();
        inventory["gpus"][0].clone()
    }

    /// The MIG devices GPU 0 has now: `profile@start` words.
    fn mig_devices(&self) -> Vec<String> {
        let gpu = self.gpu0();
        let mut out: Vec<String> = gpu["mig"]["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                format!(
                    "{}@{}",
                    m["profile"].as_str().unwrap(),
                    m["placement"]["start"]
                )
            })
            .collect();
        out.sort();
        out
    }

    /// Puts claim `name` for `device` and prepares it, which must succeed.
    async fn prepare_ok(&self, name: &str, uid: &str, device: &str) {
        self.put_claim(name, uid, &[device]);
        let answer = self.prepare(name, uid).await;
        assert_eq!(answer.claims[uid].error, "", "{device}");
        assert_eq!(answer.claims[uid].devices, [prepared(uid, device)]);
    }

    /// The record of the MIG devices gpud made, as `device` names.
    fn made(&self) -> Vec<String> {
        let path = self.path("plugins/gpu.nvidia.com/dynamic-mig.json");
        let Ok(text) = std::fs::read_to_string(path) else {
            return Vec::new();
        };
        let record: Value = serde_json::from_str(&text).unwrap();
        record["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["device"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// Whether the published slices are one whole pool holding counter sets (slices are written
/// one by one: the fake API server may hold the first ones only).
fn partitioned(slices: &[Value]) -> bool {
    let pool = |s: &Value| {
        (
            s["spec"]["pool"]["generation"].clone(),
            s["spec"]["pool"]["resourceSliceCount"].clone(),
        )
    };
    let whole = slices.iter().all(|s| pool(s) == pool(&slices[0]))
        && slices[0]["spec"]["pool"]["resourceSliceCount"] == slices.len();
    whole
        && slices
            .iter()
            .any(|s| s["spec"].get("sharedCounters").is_some())
}

/// The same devices laid out as a Kubernetes 1.34 API server keeps them (counter sets in the
/// slice of their devices), through the slice builder with that server's fields.
fn as_1_34(slices: &[Value]) -> String {
    let specs: Vec<SliceSpec> = slices
        .iter()
        .map(|s| serde_json::from_value(s["spec"].clone()).unwrap())
        .collect();
    let generation = specs[0].pool.generation;
    let devices: Vec<SliceDevice> = specs.iter().flat_map(|s| s.devices.clone()).collect();
    let plain: Vec<SliceDevice> = devices
        .iter()
        .filter(|d| d.consumes_counters.is_empty())
        .cloned()
        .collect();
    let groups: Vec<Group> = specs
        .iter()
        .flat_map(|s| s.shared_counters.clone())
        .map(|set| Group {
            devices: devices
                .iter()
                .filter(|d| {
                    d.consumes_counters
                        .iter()
                        .any(|c| c.counter_set == set.name)
                })
                .cloned()
                .collect(),
            counter_set: set,
        })
        .collect();
    let served = ServedFields {
        counters_in_own_slices: false,
        ..ServedFields::ALL
    };
    let built = partitions::specs(DRIVER, "test-node", plain, groups, generation, served);
    let shown: Vec<Value> = built
        .iter()
        .enumerate()
        .map(|(i, spec)| json!({"name": format!("test-node-{DRIVER}-{i}"), "spec": spec}))
        .collect();
    let mut text = serde_json::to_string_pretty(&shown).unwrap();
    text.push('\n');
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mig_placement_is_published_with_nvidias_counters_in_both_shapes() {
    for fixture in ["dgx-a100", "dgx-h100"] {
        let mut dra = Dra::dynamic(fixture);
        dra.start();
        dra.register().await;
        let slices = dra.slices_when("counter sets", partitioned);
        assert_golden(
            &format!("dra/{fixture}-dynamic-mig-1.36.json"),
            &render(&slices),
        );
        assert_golden(
            &format!("dra/{fixture}-dynamic-mig-1.34.json"),
            &as_1_34(&slices),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_makes_the_placed_mig_devices_and_unprepare_destroys_them() {
    let mut dra = Dra::dynamic("dgx-h100");
    dra.start();
    dra.register().await;
    dra.slices_when("counter sets", partitioned);
    let claims = [
        ("big", "uid-big", "gpu-0-mig-3g40gb-9-4"),
        ("one", "uid-one", "gpu-0-mig-1g10gb-19-0"),
        ("two", "uid-two", "gpu-0-mig-1g10gb-19-1"),
    ];
    for (name, uid, device) in claims {
        dra.prepare_ok(name, uid, device).await;
    }
    assert_eq!(dra.mig_devices(), ["1g.10gb@0", "1g.10gb@1", "3g.40gb@4"]);
    if let Some(seen) = pynvml::mig_devices(&dra.node) {
        assert_eq!(seen, "1g.10gb=2 3g.40gb=1");
    }
    // The checkpoint names each claim's new MIG device before the answer; its spec too.
    let checkpoint: Value =
        serde_json::from_str(&std::fs::read_to_string(dra.checkpoint()).unwrap()).unwrap();
    let uuid = checkpoint["claims"]["uid-big"]["devices"][0]["uuid"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(uuid.starts_with("MIG-"), "{uuid}");
    let spec = std::fs::read_to_string(dra.spec_file("uid-big")).unwrap();
    assert!(spec.contains("/dev/nvidia-caps/nvidia-cap"), "{spec}");
    assert_eq!(
        dra.made(),
        [
            "gpu-0-mig-3g40gb-9-4",
            "gpu-0-mig-1g10gb-19-0",
            "gpu-0-mig-1g10gb-19-1"
        ]
    );
    // The slices name the made device by its UUID.
    let slices = dra.slices_when("the made device's UUID", |s| {
        device(s, "gpu-0-mig-3g40gb-9-4")["attributes"]
            .get("uuid")
            .is_some()
    });
    assert_eq!(
        device(&slices, "gpu-0-mig-3g40gb-9-4")["attributes"]["uuid"]["string"],
        uuid
    );

    for (name, uid, _) in claims {
        assert_eq!(dra.unprepare(name, uid).await, "");
    }
    assert_eq!(dra.mig_devices(), Vec::<String>::new());
    assert_eq!(dra.made(), Vec::<String>::new());
    if let Some(seen) = pynvml::mig_devices(&dra.node) {
        assert_eq!(seen, "");
    }
    // The whole GPU again: MIG goes off for it.
    dra.prepare_ok("whole", "uid-whole", "gpu-0").await;
    let gpu = dra.gpu0();
    assert_eq!(gpu["mig"]["enabled"], false);
}

/// Adds a GPU instance nobody asked gpud for to GPU `uuid`'s simulated MIG state (MIG on).
fn add_foreign_instance(node: &Node, uuid: &str, instance: Value) {
    let path = node.state_path();
    let mut state: Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| json!({"version": 1, "gpus": {}}));
    let gpu = state["gpus"]
        .as_object_mut()
        .unwrap()
        .entry(uuid)
        .or_insert_with(|| json!({"current": 1, "pending": 1, "gpu_instances": []}));
    gpu["gpu_instances"].as_array_mut().unwrap().push(instance);
    let tmp = node.dir.path().join("state.tmp");
    std::fs::write(&tmp, serde_json::to_vec(&state).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_taken_out_of_band_fails_that_claim_only() {
    let mut dra = Dra::dynamic("dgx-h100");
    dra.start();
    dra.register().await;
    dra.slices_when("counter sets", partitioned);
    let uuid = dra.uuid(0);
    // A 3g.40gb instance at memory slice 4, made by someone else after gpud started.
    add_foreign_instance(
        &dra.node,
        &uuid,
        json!({"id": 2, "profile_id": 9, "placement": {"start": 4, "size": 4},
            "compute_instances": [{"id": 0, "profile_id": 2, "placement": {"start": 0, "size": 3}}]}),
    );
    dra.put_claim("blocked", "uid-blocked", &["gpu-0-mig-1g10gb-19-5"]);
    dra.put_claim("same", "uid-same", &["gpu-0-mig-3g40gb-9-4"]);
    dra.put_claim("free", "uid-free", &["gpu-0-mig-1g10gb-19-0"]);
    let request = NodePrepareResourcesRequest {
        claims: ["blocked", "same", "free"]
            .iter()
            .map(|name| fake_dra_kubelet::claim_v1("ns", name, &format!("uid-{name}")))
            .collect(),
    };
    let answer = fake_dra_kubelet::prepare_v1(&dra.plugin_socket(), request).await;
    assert_eq!(
        answer.claims["uid-blocked"].error,
        "device gpu-0-mig-1g10gb-19-5: placement 5..6 of gpu-0 is taken by GPU instance 2 \
         (profile id 9, memory slices 4..8), which gpud did not make; this claim cannot be \
         prepared until that instance is gone"
    );
    assert_eq!(
        answer.claims["uid-same"].error,
        "device gpu-0-mig-3g40gb-9-4: placement 4..8 of gpu-0 is taken by GPU instance 2 \
         (profile id 9, memory slices 4..8), which gpud did not make; this claim cannot be \
         prepared until that instance is gone"
    );
    assert_eq!(answer.claims["uid-free"].error, "");
    assert_eq!(
        answer.claims["uid-free"].devices,
        [prepared("uid-free", "gpu-0-mig-1g10gb-19-0")]
    );
    assert_eq!(dra.mig_devices(), ["1g.10gb@0", "3g.40gb@4"]);
    assert_eq!(dra.made(), ["gpu-0-mig-1g10gb-19-0"]);
    // Unprepare takes gpud's instance only; the other stays.
    assert_eq!(dra.unprepare("free", "uid-free").await, "");
    assert_eq!(dra.mig_devices(), ["3g.40gb@4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_prepared_instances_and_destroys_only_gpuds_orphans() {
    let mut dra = Dra::dynamic("dgx-h100");
    dra.start();
    dra.register().await;
    dra.slices_when("counter sets", partitioned);
    for (name, uid, device) in [
        ("kept", "uid-kept", "gpu-0-mig-1g10gb-19-0"),
        ("lost", "uid-lost", "gpu-0-mig-1g10gb-19-1"),
    ] {
        dra.prepare_ok(name, uid, device).await;
    }
    let uuid_of = |dra: &Dra, uid: &str| -> String {
        let checkpoint: Value =
            serde_json::from_str(&std::fs::read_to_string(dra.checkpoint()).unwrap()).unwrap();
        checkpoint["claims"][uid]["devices"][0]["uuid"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let kept = uuid_of(&dra, "uid-kept");
    dra.stop();
    // gpud died between making the second claim's device and answering: its checkpoint entry
    // never reached the disk. And someone else made an instance meanwhile.
    let mut checkpoint: Value =
        serde_json::from_str(&std::fs::read_to_string(dra.checkpoint()).unwrap()).unwrap();
    checkpoint["claims"]
        .as_object_mut()
        .unwrap()
        .remove("uid-lost");
    std::fs::write(dra.checkpoint(), checkpoint.to_string()).unwrap();
    let uuid = dra.uuid(0);
    add_foreign_instance(
        &dra.node,
        &uuid,
        json!({"id": 3, "profile_id": 9, "placement": {"start": 4, "size": 4},
            "compute_instances": [{"id": 0, "profile_id": 2, "placement": {"start": 0, "size": 3}}]}),
    );

    dra.start();
    dra.register().await;
    dra.log_when("Destroyed a MIG device gpud made for a claim that is no longer prepared");
    assert_eq!(dra.mig_devices(), ["1g.10gb@0", "3g.40gb@4"]);
    assert_eq!(dra.made(), ["gpu-0-mig-1g10gb-19-0"]);
    // A GPU instance gpud did not make is on GPU 0 now: it is published as it is.
    let slices = dra.slices_when("GPU 0's static MIG devices", |s| {
        names(s).contains(&"gpu-0-mig-3g40gb-9-4".to_owned())
            && !names(s).contains(&"gpu-0".to_owned())
    });
    assert!(
        device(&slices, "gpu-0-mig-1g10gb-19-0")
            .get("consumesCounters")
            .is_none()
    );
    // The kept claim answers as before, with the same MIG device.
    let again = dra.prepare("kept", "uid-kept").await;
    assert_eq!(again.claims["uid-kept"].error, "");
    assert_eq!(uuid_of(&dra, "uid-kept"), kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_taints_every_device_of_the_gpus_counter_set_until_it_recovers() {
    let mut dra = Dra::dynamic("dgx-h100");
    dra.start();
    dra.register().await;
    let before = dra.slices_when("counter sets", partitioned);
    dra.prepare_ok("one", "uid-one", "gpu-0-mig-1g10gb-19-0")
        .await;
    let on_gpu = |slices: &[Value], minor: u32| -> Vec<Value> {
        slices
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().unwrap().clone())
            .filter(|d| {
                let name = d["name"].as_str().unwrap();
                name == format!("gpu-{minor}") || name.starts_with(&format!("gpu-{minor}-mig-"))
            })
            .collect()
    };
    assert_eq!(on_gpu(&before, 0).len(), 26);

    dra.log_when("health: Ready");
    dra.node.inject("xid 0 79");
    let xid = json!([{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]);
    let tainted = dra.slices_when("the XID taint on the counter set", |s| {
        on_gpu(s, 0).iter().all(|d| d.get("taints").is_some())
    });
    for device in on_gpu(&tainted, 0) {
        assert_eq!(device["taints"], xid, "{}", device["name"]);
    }
    assert!(
        on_gpu(&tainted, 1)
            .iter()
            .all(|d| d.get("taints").is_none())
    );

    dra.node.inject("lost 0");
    dra.log_when("unhealthy -> unhealthy: GPU is lost");
    dra.node.inject("recover 0");
    let clear = dra.slices_when("the taints removed", |s| {
        generation(s) > generation(&tainted)
            && on_gpu(s, 0).iter().all(|d| d.get("taints").is_none())
    });
    assert_eq!(on_gpu(&clear, 0).len(), 26);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_of_a_made_instance_taints_only_its_device_until_it_is_quiet() {
    let mut dra = Dra::dynamic("dgx-h100");
    dra.applet
        .extend(["--xid-quiet-period", "1s"].map(String::from));
    dra.start();
    dra.register().await;
    dra.slices_when("counter sets", partitioned);
    dra.prepare_ok("one", "uid-one", "gpu-0-mig-1g10gb-19-0")
        .await;
    let gpu = dra.gpu0();
    let gi = &gpu["mig"]["devices"][0]["gpu_instance_id"];

    dra.log_when("health: Ready");
    // A critical XID the driver attributes to the made instance (link training failed).
    dra.node.inject(&format!("xid 0 136 {gi} 0"));
    let made = "gpu-0-mig-1g10gb-19-0";
    let tainted = dra.slices_when("the instance's taint", |s| {
        device(s, made).get("taints").is_some()
    });
    assert_eq!(
        device(&tainted, made)["taints"],
        json!([{"key": "gpu.nvidia.com/xid", "value": "136", "effect": "NoSchedule"}])
    );
    for other in ["gpu-0", "gpu-0-mig-1g10gb-19-1", "gpu-0-mig-7g80gb-0-0"] {
        assert!(device(&tainted, other).get("taints").is_none(), "{other}");
    }
    let clear = dra.slices_when("the taint gone once quiet", |s| {
        generation(s) > generation(&tainted) && device(s, made).get("taints").is_none()
    });
    assert!(device(&clear, made)["attributes"].get("uuid").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpud_run_partitions_on_demand_when_the_environment_says_so() {
    let mut dra = Dra::dynamic("dgx-h100");
    let kubelet = fake_kubelet::FakeKubelet::start(dra.node.dir.path()).await;
    let socket = kubelet.socket();
    dra.applet = run_applet(&socket);
    dra.env.push(("GPUD_DRA_DYNAMIC_MIG".into(), "true".into()));
    dra.start();
    dra.register().await;
    dra.slices_when("counter sets", partitioned);
    dra.prepare_ok("one", "uid-one", "gpu-0-mig-1g10gb-19-0")
        .await;
    assert_eq!(dra.mig_devices(), ["1g.10gb@0"]);
    assert_eq!(dra.unprepare("one", "uid-one").await, "");
    assert_eq!(dra.mig_devices(), Vec::<String>::new());
}

const COUNTERS_DROPPED: &str = "The API server dropped sharedCounters and consumesCounters \
    (partitionable devices) from the ResourceSlices gpud wrote: feature gate \
    DRAPartitionableDevices is off there.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_34_server_gets_counter_sets_beside_their_devices_and_without_the_gate_whole_gpus() {
    // The release the API server reports decides the shape: counter sets in the slice of their
    // devices, exactly the 1.34 golden file.
    let mut dra = Dra::dynamic("dgx-h100");
    dra.api.set_server_version(Some("v1.34.2"));
    dra.start();
    dra.register().await;
    let slices = dra.slices_when("counter sets", partitioned);
    assert_golden("dra/dgx-h100-dynamic-mig-1.34.json", &render(&slices));
    assert_eq!(log_count(&dra, "The API server dropped"), 0);

    // A server that keeps no counters (its gate off clears them from the write) gets whole
    // GPUs only, as without the flag: placements without counters would overlap. Said once.
    let mut dra = Dra::dynamic("dgx-h100");
    dra.api.set_server_version(Some("v1.34.2"));
    dra.api.disable_gate("DRAPartitionableDevices");
    dra.start();
    dra.register().await;
    dra.log_when(COUNTERS_DROPPED);
    let slices = dra.slices_when("whole GPUs only", |s| {
        s.iter()
            .all(|slice| slice["spec"].get("sharedCounters").is_none())
            && s.iter()
                .flat_map(|slice| {
                    slice["spec"]["devices"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                })
                .count()
                == 8
    });
    assert_eq!(all_devices(&slices), golden_devices("dgx-h100.json"));
    // The last write held no counter consumer either.
    let writes = dra.api.slice_writes();
    let last = writes.last().unwrap();
    assert!(
        last["devices"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d.get("consumesCounters").is_none()
                && !d["name"].as_str().unwrap().contains("-mig-")),
        "{last}"
    );
    assert_eq!(log_count(&dra, COUNTERS_DROPPED), 1, "{}", dra.log());
}

/// GPU `uuid`'s GPU instances in the simulated driver, as (profile id, placement start,
/// compute instances): a GPU instance left without its compute instance shows as `(…, 0)`.
fn gpu_instances(node: &Node, uuid: &str) -> Vec<(u64, u64, usize)> {
    let state: Value = std::fs::read_to_string(node.state_path())
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    state["gpus"][uuid]["gpu_instances"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|gi| {
            (
                gi["profile_id"].as_u64().unwrap(),
                gi["placement"]["start"].as_u64().unwrap(),
                gi["compute_instances"].as_array().map_or(0, Vec::len),
            )
        })
        .collect()
}

impl Dra {
    /// Whether the checkpoint holds claim `uid`.
    fn checkpointed(&self, uid: &str) -> bool {
        std::fs::read_to_string(self.checkpoint())
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|c| c["claims"].get(uid).is_some())
    }

    /// Prepares claim `uid` for `device`, which must fail with exactly `error` (or, with
    /// `prefix`, an error starting so) and leave nothing behind: no GPU instance on GPU 0,
    /// nothing in gpud's record of what it made, nothing in the checkpoint.
    async fn refused(&self, uid: &str, device: &str, error: &str, prefix: bool) -> String {
        self.put_claim("c", uid, &[device]);
        let answer = self.prepare("c", uid).await;
        let got = answer.claims[uid].error.clone();
        if prefix {
            assert!(got.starts_with(error), "{got}");
        } else {
            assert_eq!(got, error);
        }
        assert_eq!(gpu_instances(&self.node, &self.uuid(0)), []);
        assert_eq!(self.made(), Vec::<String>::new());
        assert!(!self.checkpointed(uid));
        got
    }
}

const ONE_G: &str = "gpu-0-mig-1g10gb-19-0";
const ONE_G_AT: &str = "device gpu-0-mig-1g10gb-19-0: placement 0..1 of gpu-0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvml_refusing_an_instance_fails_the_claim_whole_and_a_retry_succeeds_once_it_is_cleared() {
    let mut dra = Dra::dynamic("dgx-h100");
    dra.start();
    dra.register().await;
    dra.slices_when("counter sets", partitioned);
    dra.node.inject("mig-fail 0 create-gi");
    dra.refused(
        "uid-c",
        ONE_G,
        &format!("{ONE_G_AT}: NVML cannot create the GPU instance: "),
        true,
    )
    .await;
    dra.node.inject("mig-ok 0 create-gi");
    dra.node.inject("mig-fail 0 create-ci");
    let error = dra
        .refused(
            "uid-c",
            ONE_G,
            &format!("{ONE_G_AT}: NVML cannot create the compute instance: "),
            true,
        )
        .await;
    assert!(
        error.ends_with("; the GPU instance made for it was destroyed"),
        "{error}"
    );
    dra.node.inject("mig-ok 0 create-ci");
    dra.prepare_ok("c", "uid-c", ONE_G).await;
    assert_eq!(dra.mig_devices(), ["1g.10gb@0"]);
    assert_eq!(gpu_instances(&dra.node, &dra.uuid(0)), [(19, 0, 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_on_the_gpu_or_a_mode_pending_a_reset_fail_the_claim_until_they_are_gone() {
    let mut dra = Dra::dynamic("dgx-h100");
    // The driver leaves a new MIG mode pending until the GPU is reset.
    dra.env
        .push(("NVML_MOCK_MIG_RESET_REQUIRED".into(), "1".into()));
    dra.start();
    dra.register().await;
    dra.slices_when("counter sets", partitioned);
    // MIG is off on GPU 0 and a process starts on it after the plugin chose its GPUs.
    dra.node.inject("process 0 4242 1024");
    let busy = format!(
        "{ONE_G_AT}: MIG is off on gpu-0 and processes run on it (PIDs [4242]); MIG cannot be \
         turned on under them, so the claim waits until they end"
    );
    dra.refused("uid-c", ONE_G, &busy, false).await;
    dra.node.inject("process-end 0 4242");
    let pending = format!(
        "{ONE_G_AT}: MIG on gpu-0 is pending a GPU reset; the claim can be prepared once it is \
         in effect"
    );
    dra.refused("uid-c", ONE_G, &pending, false).await;
    // Asked again while still pending: the same answer, and MIG is not asked for twice.
    dra.refused("uid-c", ONE_G, &pending, false).await;
    dra.node.inject("reset 0");
    dra.prepare_ok("c", "uid-c", ONE_G).await;
    assert_eq!(dra.mig_devices(), ["1g.10gb@0"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_mig_change_waits_until_another_layout_change_has_finished() {
    let mut dra = Dra::dynamic("dgx-h100");
    dra.start();
    dra.register().await;
    dra.slices_when("counter sets", partitioned);
    // Another writer (the MIG manager's apply, a restore after a reset) holds the node's lock.
    let state = dra.path("state");
    let held = gpud::holdings::layout_lock::lock(Some(&state), "the test")
        .await
        .unwrap();
    dra.put_claim("one", "uid-one", &[ONE_G]);
    let socket = dra.plugin_socket();
    let prepare = gpud::logging::spawn(async move {
        let request = NodePrepareResourcesRequest {
            claims: vec![fake_dra_kubelet::claim_v1("ns", "one", "uid-one")],
        };
        fake_dra_kubelet::prepare_v1(&socket, request).await
    });
    dra.log_when("Waiting for another MIG layout change to finish");
    assert!(!prepare.is_finished());
    assert_eq!(dra.mig_devices(), Vec::<String>::new());
    drop(held);
    let answer = prepare.await.unwrap();
    assert_eq!(answer.claims["uid-one"].error, "");
    assert_eq!(dra.mig_devices(), ["1g.10gb@0"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mig_manager_started_beside_dynamic_mig_is_a_usage_error_naming_the_gpu_and_both_owners()
{
    let mut dra = Dra::dynamic("dgx-h100");
    dra.start();
    dra.register().await;
    dra.slices_when("counter sets", partitioned);
    let config = default_mig_config();
    let out = dra.node.run(&[
        "mig",
        "reconcile",
        "--mig-config-file",
        config.to_str().unwrap(),
        "--node-name",
        "test-node",
        "--mig-state-dir",
        dra.path("mig-state").to_str().unwrap(),
        "--health-address",
        "",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    let gpu = format!(
        "GPU 0 ({}): its MIG layout would have two owners, ",
        dra.uuid(0)
    );
    assert!(stderr.contains(&gpu), "{stderr}");
    assert!(
        stderr.contains(
            "the MIG manager (gpud mig reconcile, --mig-config-file) and DRA dynamic MIG \
             (--dra-dynamic-mig)"
        ),
        "{stderr}"
    );
    // The plugin's GPUs stay its own.
    let owners: Value = serde_json::from_str(
        &std::fs::read_to_string(dra.path("state/mig-layout-owners.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(owners["gpus"][dra.uuid(0)]["owner"], "dra-dynamic-mig");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_mig_apply_beside_dynamic_mig_is_refused_and_changes_nothing() {
    let mut dra = Dra::dynamic("dgx-h100");
    dra.start();
    dra.register().await;
    dra.slices_when("counter sets", partitioned);
    let config = default_mig_config();
    let out = dra.node.run(&[
        "mig",
        "apply",
        "-f",
        config.to_str().unwrap(),
        "-c",
        "all-1g.10gb",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "GPU 0 ({}): its MIG layout would have two owners, the MIG manager (gpud mig \
             reconcile, --mig-config-file) and DRA dynamic MIG (--dra-dynamic-mig)",
            dra.uuid(0)
        )),
        "{stderr}"
    );
    assert_eq!(dra.mig_devices(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_mig_apply_waits_for_another_layout_change_to_finish() {
    let node = common::Node::new("dgx-h100");
    let state = node.dir.path().join("state");
    let held = gpud::holdings::layout_lock::lock(Some(&state), "the test")
        .await
        .unwrap();
    let config = default_mig_config();
    let mut apply = node
        .gpud(&[
            "mig",
            "apply",
            "-f",
            config.to_str().unwrap(),
            "-c",
            "all-1g.10gb",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The apply says it waits; it has changed nothing until the lock is let go.
    let mut stderr = std::io::BufReader::new(apply.stderr.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("Waiting for another MIG layout change to finish") {
        let mut line = String::new();
        assert!(
            std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() > 0,
            "apply ended without waiting: {seen}"
        );
        seen.push_str(&line);
    }
    assert!(apply.try_wait().unwrap().is_none(), "{seen}");
    drop(held);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    let status = apply.wait().unwrap();
    assert!(status.success(), "{seen}{rest}");
    assert!(
        rest.contains("MIG configuration applied successfully"),
        "{rest}"
    );
}

/// NVIDIA's default mig-parted config, as packaged.
fn default_mig_config() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/mig/config-default.yaml")
}
