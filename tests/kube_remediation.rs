//! The Kubernetes building blocks of remediation, in-process against the stand-in API server
//! and the fake kubelet pod-resources server:
//!
//! - the slot budget on Leases: one holder per slot, however the nodes race; a released slot
//!   passes on; a dead holder's slot is taken only after its lease duration; a restarted
//!   holder resumes its own slot; a holder that cannot renew, or whose slot was taken, knows;
//!   refusals by the API server are errors and hold nothing;
//! - pod eviction: evicted, already gone, refused by a disruption budget and retried;
//! - the pods holding a GPU, through the device plugin and through DRA claims.
//!
//! Each test runs its own multi-threaded runtime, so that the renewals of a held slot go on
//! while the test waits on a fact with `common::until`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/fake_api.rs"]
mod fake_api;
#[path = "common/fake_pod_resources.rs"]
mod fake_pod_resources;

use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_api::{FakeApi, Fault, Rule};
use fake_pod_resources::{ClaimHolder, FakeKubelet, Holder};
use gpud::holdings::pod_resources::{self, PodName};
use gpud::inventory::Snapshot;
use gpud::kube::{Eviction, HeldSlot, SlotBudget};
use serde_json::{Value, json};

const NAMESPACE: &str = "gpud";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/gpud/leases";
/// Long enough that no slot expires within a test that does not wait for it.
const LONG: Duration = Duration::from_secs(60);
/// Short enough to wait for an expiry.
const SHORT: Duration = Duration::from_secs(2);

/// A stand-in API server and a client of it, on a runtime of the test's own.
struct Cluster {
    api: FakeApi,
    client: ::kube::Client,
    _dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

impl Cluster {
    fn start() -> Cluster {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let api = FakeApi::start(json!({}));
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = api.kubeconfig(dir.path());
        let client = rt.block_on(gpud::kube::connect(Some(&kubeconfig))).unwrap();
        Cluster {
            api,
            client,
            _dir: dir,
            rt,
        }
    }

    /// Node `holder`'s budget of `slots` slots.
    fn budget(&self, holder: &str, slots: u32, duration: Duration) -> SlotBudget {
        // Built within the runtime: the client's service lives there.
        let _inside = self.rt.enter();
        SlotBudget::new(
            self.client.clone(),
            NAMESPACE.to_owned(),
            holder.to_owned(),
            slots,
            duration,
        )
    }

    /// What `budget` takes now; the API server answers.
    fn acquire(&self, budget: &SlotBudget) -> Option<HeldSlot> {
        self.rt.block_on(budget.try_acquire()).unwrap()
    }

    fn release(&self, slot: HeldSlot) {
        self.rt.block_on(slot.release()).unwrap();
    }

    /// Lease `gpud-remediation-<index>` as the API server holds it.
    fn lease(&self, index: u32) -> Value {
        self.api.leases()[&format!("{NAMESPACE}/gpud-remediation-{index}")].clone()
    }

    /// Every budget's `try_acquire` at once: the holder names with what each got.
    fn race(&self, budgets: &[(String, Arc<SlotBudget>)]) -> Vec<(String, Option<HeldSlot>)> {
        let tasks: Vec<_> = budgets
            .iter()
            .map(|(name, budget)| {
                let budget = Arc::clone(budget);
                let task = self
                    .rt
                    .spawn(async move { budget.try_acquire().await.unwrap() });
                (name.clone(), task)
            })
            .collect();
        tasks
            .into_iter()
            .map(|(name, task)| (name, self.rt.block_on(task).unwrap()))
            .collect()
    }

    /// The statuses the API server answered to `method` requests under `path`, from request
    /// `from` of the log on.
    fn answers(&self, from: usize, method: &str, path: &str) -> Vec<u16> {
        self.api.log()[from..]
            .iter()
            .filter(|r| r.method == method && r.path.starts_with(path))
            .map(|r| r.status)
            .collect()
    }
}

/// Waits until `held` is held no more.
fn until_lost(held: &HeldSlot, what: &str) {
    common::until(what, 10, || {
        if held.is_held() {
            Err(format!("{} still held", held.name()))
        } else {
            Ok(())
        }
    });
}

fn holder(lease: &Value) -> Option<&str> {
    lease["spec"]["holderIdentity"].as_str()
}

#[test]
fn one_slot_has_one_holder_and_passes_on_when_released() {
    let cluster = Cluster::start();
    let [a, b, c] = ["a", "b", "c"].map(|node| cluster.budget(node, 1, LONG));
    let held = cluster.acquire(&a).expect("a free slot");
    assert_eq!(held.name(), "gpud-remediation-0");
    assert_eq!(held.index(), 0);
    assert!(held.is_held());
    assert!(cluster.acquire(&b).is_none());
    assert!(cluster.acquire(&c).is_none());
    let lease = cluster.lease(0);
    assert_eq!(holder(&lease), Some("a"));
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 60);
    assert_eq!(lease["spec"]["leaseTransitions"], 0);
    assert_eq!(lease["spec"]["acquireTime"], lease["spec"]["renewTime"]);
    assert_eq!(
        lease["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "gpud"
    );

    cluster.release(held);
    assert_eq!(holder(&cluster.lease(0)), None);
    let passed = cluster.acquire(&b).expect("the released slot");
    assert_eq!(passed.name(), "gpud-remediation-0");
    let lease = cluster.lease(0);
    assert_eq!(holder(&lease), Some("b"));
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    assert!(cluster.acquire(&c).is_none());
    assert!(cluster.acquire(&a).is_none());
    // The one Lease, written by create, then replaced: by release, then by b.
    let writes: Vec<(String, Option<String>)> = cluster
        .api
        .lease_writes()
        .iter()
        .map(|w| (w.method.clone(), w.holder().map(str::to_owned)))
        .collect();
    assert_eq!(
        writes,
        [
            ("POST".to_owned(), Some("a".to_owned())),
            ("PUT".to_owned(), None),
            ("PUT".to_owned(), Some("b".to_owned())),
        ]
    );
}

#[test]
fn a_dead_holders_slot_is_taken_only_after_its_lease_duration() {
    let cluster = Cluster::start();
    let a = cluster.budget("a", 1, SHORT);
    let b = cluster.budget("b", 1, SHORT);
    let held = cluster.acquire(&a).expect("a free slot");
    assert_eq!(cluster.lease(0)["spec"]["leaseDurationSeconds"], 2);
    // A live holder renews: b, asking all along, never gets the slot, for longer than a
    // lease duration (four renewals, a third of it apart).
    let renewals = || {
        cluster
            .api
            .lease_writes()
            .iter()
            .filter(|w| w.method == "PUT" && w.holder() == Some("a"))
            .count()
    };
    common::until("four renewals by a", 10, || {
        assert!(cluster.acquire(&b).is_none(), "b took a live holder's slot");
        match renewals() {
            n if n >= 4 => Ok(()),
            n => Err(format!("{n} renewals")),
        }
    });
    assert!(held.is_held());

    // Killed: no release, no more renewals.
    drop(held);
    let taken = common::until("b takes the dead holder's slot", 10, || {
        cluster
            .acquire(&b)
            .ok_or_else(|| format!("{} held by a", cluster.lease(0)))
    });
    assert!(taken.is_held());
    let writes = cluster.api.lease_writes();
    let last_by_a = writes.iter().rfind(|w| w.holder() == Some("a")).unwrap().at;
    let took = writes.iter().find(|w| w.holder() == Some("b")).unwrap().at;
    let waited = took.duration_since(last_by_a);
    assert!(
        waited >= SHORT,
        "b took the slot {waited:?} after a's last renewal, within its lease duration"
    );
    assert!(
        waited < SHORT + Duration::from_secs(2),
        "b waited {waited:?}"
    );
    let lease = cluster.lease(0);
    assert_eq!(holder(&lease), Some("b"));
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
}

#[test]
fn two_slots_hold_two_nodes_and_never_three() {
    let cluster = Cluster::start();
    let [a, b, c] = ["a", "b", "c"].map(|node| cluster.budget(node, 2, LONG));
    let first = cluster.acquire(&a).expect("slot 0");
    let second = cluster.acquire(&b).expect("slot 1");
    assert_eq!(
        (first.name(), second.name()),
        ("gpud-remediation-0", "gpud-remediation-1")
    );
    assert!(cluster.acquire(&c).is_none());
    assert!(
        cluster.acquire(&a).is_some_and(|again| again.index() == 0),
        "a holder asking again gets its own slot, not a second one"
    );
    cluster.release(first);
    let third = cluster.acquire(&c).expect("the released slot");
    assert_eq!(third.name(), "gpud-remediation-0");
    let holders: Vec<Option<String>> = cluster
        .api
        .leases()
        .values()
        .map(|l| holder(l).map(str::to_owned))
        .collect();
    assert_eq!(holders, [Some("c".to_owned()), Some("b".to_owned())]);
    assert!(cluster.acquire(&a).is_none());
}

#[test]
fn racing_nodes_never_share_a_slot() {
    let cluster = Cluster::start();
    let budgets: Vec<(String, Arc<SlotBudget>)> = (0..8)
        .map(|i| {
            let name = format!("node-{i}");
            let budget = Arc::new(cluster.budget(&name, 1, LONG));
            (name, budget)
        })
        .collect();
    // Creates: every node reads no Lease, every create is held back until all have read,
    // the first taken wins and the others are told the name exists.
    let from = cluster.api.log().len();
    let stall = Fault::Stall(Duration::from_millis(500));
    let rule = cluster
        .api
        .refuse(Rule::prefix("POST", LEASES, stall.clone()));
    let won: Vec<(String, HeldSlot)> = cluster
        .race(&budgets)
        .into_iter()
        .filter_map(|(name, slot)| Some((name, slot?)))
        .collect();
    assert_eq!(won.len(), 1, "{won:?}");
    assert_eq!(cluster.api.refused_by(rule), 8);
    let mut creates = cluster.answers(from, "POST", LEASES);
    creates.sort_unstable();
    assert_eq!(creates, [201, 409, 409, 409, 409, 409, 409, 409]);
    assert_eq!(holder(&cluster.lease(0)), Some(won[0].0.as_str()));

    // Replaces: the slot released, every node reads it free at one version and writes over
    // that version; the first write taken wins, the others are answered 409 Conflict.
    let (_, slot) = won.into_iter().next().unwrap();
    cluster.release(slot);
    cluster.api.allow_all();
    let from = cluster.api.log().len();
    let slot_path = format!("{LEASES}/gpud-remediation-0");
    cluster.api.refuse(Rule::exact("PUT", &slot_path, stall));
    let won: Vec<(String, HeldSlot)> = cluster
        .race(&budgets)
        .into_iter()
        .filter_map(|(name, slot)| Some((name, slot?)))
        .collect();
    assert_eq!(won.len(), 1, "{won:?}");
    let mut replaces = cluster.answers(from, "PUT", &slot_path);
    replaces.sort_unstable();
    assert_eq!(replaces, [200, 409, 409, 409, 409, 409, 409, 409]);
    assert_eq!(holder(&cluster.lease(0)), Some(won[0].0.as_str()));
    assert_eq!(cluster.lease(0)["spec"]["leaseTransitions"], 1);
}

#[test]
fn a_restarted_holder_resumes_its_own_slot() {
    let cluster = Cluster::start();
    let b = cluster.budget("b", 2, LONG);
    let a = cluster.budget("a", 2, LONG);
    let b_slot = cluster.acquire(&b).expect("slot 0");
    let a_slot = cluster.acquire(&a).expect("slot 1");
    assert_eq!(a_slot.index(), 1);
    let acquired = cluster.lease(1)["spec"]["acquireTime"].clone();
    cluster.release(b_slot);
    // gpud on node a restarts: its slot was not released, its budget is new.
    drop(a_slot);
    drop(a);
    let a = cluster.budget("a", 2, LONG);
    let resumed = cluster.acquire(&a).expect("its own slot");
    assert_eq!(resumed.index(), 1, "a holds its own slot, not the free one");
    let lease = cluster.lease(1);
    assert_eq!(holder(&lease), Some("a"));
    assert_eq!(lease["spec"]["acquireTime"], acquired);
    assert_eq!(lease["spec"]["leaseTransitions"], 0);
    assert_eq!(holder(&cluster.lease(0)), None);
}

#[test]
fn a_holder_knows_when_it_lost_its_slot() {
    let cluster = Cluster::start();
    let a = cluster.budget("a", 1, SHORT);
    // Renewals refused: held until one lease duration after the write that took it.
    let asked = Instant::now();
    let held = cluster.acquire(&a).expect("a free slot");
    let rule = cluster
        .api
        .refuse(Rule::prefix("PUT", LEASES, Fault::Forbidden));
    until_lost(&held, "the slot lost");
    assert!(asked.elapsed() >= SHORT, "lost after {:?}", asked.elapsed());
    assert!(cluster.api.refused_by(rule) >= 1);
    cluster.api.allow_all();
    // Not taken by anyone: the release still gives it back.
    cluster.release(held);
    assert_eq!(holder(&cluster.lease(0)), None);

    // Taken by another writer: the next renewal finds it so.
    let held = cluster.acquire(&a).expect("the slot again");
    let mut lease = cluster.lease(0);
    lease["spec"]["holderIdentity"] = json!("intruder");
    cluster.api.put_lease(lease);
    let before = Instant::now();
    until_lost(&held, "the slot lost to the intruder");
    assert!(before.elapsed() < SHORT, "noticed only on expiry");
    cluster.release(held);
    assert_eq!(holder(&cluster.lease(0)), Some("intruder"));
}

#[test]
fn refusals_by_the_api_server_are_errors_and_hold_nothing() {
    let cluster = Cluster::start();
    let a = cluster.budget("a", 1, LONG);
    cluster
        .api
        .refuse(Rule::prefix("GET", LEASES, Fault::TooManyRequests(3)).times(1));
    let err = cluster.rt.block_on(a.try_acquire()).unwrap_err();
    assert_eq!(err.status(), Some(429));
    assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
    assert!(cluster.api.leases().is_empty());

    cluster
        .api
        .refuse(Rule::prefix("POST", LEASES, Fault::Forbidden).times(1));
    let err = cluster.rt.block_on(a.try_acquire()).unwrap_err();
    assert_eq!(err.status(), Some(403));
    assert!(err.to_string().contains("forbidden by RBAC"), "{err}");
    assert!(cluster.api.leases().is_empty());

    // A released slot whose replace is refused stays free.
    let held = cluster.acquire(&a).expect("a free slot");
    cluster.release(held);
    cluster
        .api
        .refuse(Rule::prefix("PUT", LEASES, Fault::Forbidden).times(1));
    let b = cluster.budget("b", 1, LONG);
    let err = cluster.rt.block_on(b.try_acquire()).unwrap_err();
    assert_eq!(err.status(), Some(403));
    assert_eq!(holder(&cluster.lease(0)), None);
    assert!(cluster.acquire(&b).is_some());
}

fn pod(namespace: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")}})
}

#[test]
fn an_eviction_is_taken_finds_the_pod_gone_or_waits_for_the_disruption_budget() {
    let cluster = Cluster::start();
    cluster.api.put_pod(pod("ml", "train"));
    cluster.api.put_pod(pod("ml", "serve"));
    let evict = |name: &str| {
        cluster
            .rt
            .block_on(gpud::kube::evict(&cluster.client, "ml", name))
    };
    assert!(matches!(evict("train"), Ok(Eviction::Evicted)));
    assert!(!cluster.api.pods().contains_key("ml/train"));
    assert!(matches!(evict("train"), Ok(Eviction::Gone)));

    // The budget allows no disruption once, and asks for 5 s; then it does.
    let path = "/api/v1/namespaces/ml/pods/serve/eviction";
    let rule = cluster
        .api
        .refuse(Rule::exact("POST", path, Fault::DisruptionBudget(5)).times(1));
    let Ok(Eviction::Refused(err)) = evict("serve") else {
        panic!("not refused");
    };
    assert_eq!(err.status(), Some(429));
    // Retry-After, lengthened by up to as long again (a fleet must not retry in one second).
    let paced = err.paced(Duration::from_secs(1));
    assert!(
        paced >= Duration::from_secs(5) && paced < Duration::from_secs(10),
        "{paced:?}"
    );
    assert!(
        err.to_string().contains(
            "429 TooManyRequests: Cannot evict pod as it would violate the pod's disruption \
             budget."
        ),
        "{err}"
    );
    assert!(cluster.api.pods().contains_key("ml/serve"));
    assert!(matches!(evict("serve"), Ok(Eviction::Evicted)));
    assert_eq!(cluster.api.refused_by(rule), 1);
    assert_eq!(cluster.api.evictions(), ["ml/train", "ml/serve"]);
    assert!(cluster.api.pods().is_empty());

    // A refusal with no wait asked: the caller's own backoff.
    cluster.api.put_pod(pod("ml", "serve"));
    cluster
        .api
        .refuse(Rule::exact("POST", path, Fault::DisruptionBudget(0)).times(1));
    let Ok(Eviction::Refused(err)) = evict("serve") else {
        panic!("not refused");
    };
    assert_eq!(err.retry_after(), None);
    let paced = err.paced(Duration::from_secs(1));
    assert!(
        paced >= Duration::from_secs(1) && paced < Duration::from_millis(1500),
        "{paced:?}"
    );
    // Anything else is an error.
    cluster
        .api
        .refuse(Rule::exact("POST", path, Fault::Forbidden).times(1));
    assert_eq!(evict("serve").unwrap_err().status(), Some(403));
    let statuses: Vec<u16> = cluster
        .api
        .log()
        .iter()
        .filter(|r| r.method == "POST" && r.path.contains("/eviction"))
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, [201, 404, 429, 201, 429, 403]);
}

/// A node with GPU-A (minor 0, MIG on: two `1g.10gb` devices) and GPU-B (minor 1, whole).
fn node() -> Snapshot {
    let health = json!({"state": "healthy", "reason": null, "xid": null, "action": null,
                        "since": null, "source": null});
    let mig = |index: u32, uuid: &str, start: u32| {
        json!({"index": index, "uuid": uuid, "gpu_instance_id": index + 1,
               "compute_instance_id": 0, "profile": "1g.10gb", "memory_mib": 9728,
               "multiprocessors": 14, "gpu_slices": 1, "compute_slices": 1,
               "engines": {"copy": 1, "decoder": 0, "encoder": 0, "jpeg": 0, "ofa": 0},
               "placement": {"start": start, "size": 1}, "gpu_instance_profile_id": 19,
               "health": health})
    };
    let gpu = |index: u32, uuid: &str, migs: Vec<Value>| {
        json!({"index": index, "minor_number": index, "device_node": null, "uuid": uuid,
               "serial": null, "name": "NVIDIA A100-SXM4-80GB", "brand": null,
               "architecture": null, "family": null, "compute_capability": null,
               "memory_mib": 81920,
               "pci": {"bus_id": format!("00000000:{:02X}:00.0", 16 + index),
                       "device_id": "0x20B210DE", "subsystem_id": null},
               "numa_node": null, "power_limit_watts": null,
               "mig": {"capable": true, "enabled": !migs.is_empty(),
                       "pending_enabled": !migs.is_empty(), "devices": migs},
               "nvlinks": [], "health": health})
    };
    serde_json::from_value(json!({
        "node": {"hostname": "test-node", "driver_version": "570.133.20",
                 "cuda_driver_version": null, "nvml_version": null, "machine_type": null},
        "gpus": [
            gpu(0, "GPU-A", vec![mig(0, "MIG-A0", 0), mig(1, "MIG-A1", 1)]),
            gpu(1, "GPU-B", Vec::new()),
        ],
        "topology": [],
    }))
    .unwrap()
}

#[test]
fn every_pod_holding_a_gpu_is_named_whichever_way_it_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    const DRIVER: &str = "gpu.nvidia.com";
    let plugin = |pod: &'static str, resource: &'static str, ids: &'static [&'static str]| Holder {
        namespace: "ml",
        pod,
        container: "main",
        resource,
        ids,
    };
    type Devices = &'static [(&'static str, &'static str, &'static str)];
    let claim = |pod: &'static str, claim: &'static str, devices: Devices| ClaimHolder {
        namespace: "ml",
        pod,
        container: "main",
        claim,
        devices,
    };
    let answer = fake_pod_resources::with_claims(
        fake_pod_resources::answer(&[
            // The device plugin's mixed strategy: a MIG device of GPU-A.
            plugin("train", "nvidia.com/mig-1g.10gb", &["MIG-A0"]),
            // GPU-B whole, by index.
            plugin("render", "nvidia.com/gpu", &["1"]),
        ]),
        &[
            // Through DRA: the other MIG device of GPU-A, and GPU-B whole.
            claim(
                "infer",
                "infer-gpu",
                &[(DRIVER, "test-node", "gpu-0-mig-1g10gb-19-1")],
            ),
            claim("encode", "encode-gpu", &[(DRIVER, "test-node", "gpu-1")]),
            // Another driver's device of the same name is not a GPU of gpud's.
            claim(
                "nic",
                "nic-claim",
                &[("nic.example.com", "test-node", "gpu-0")],
            ),
        ],
    );
    let kubelet = FakeKubelet::start(&dir.path().join("kubelet.sock"), answer);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let snapshot = node();
    let holders = |gpu: &str| -> Vec<String> {
        rt.block_on(pod_resources::gpu_holders(
            &kubelet.socket,
            &snapshot,
            DRIVER,
            gpu,
        ))
        .unwrap()
        .iter()
        .map(PodName::to_string)
        .collect()
    };
    assert_eq!(holders("GPU-A"), ["ml/infer", "ml/train"]);
    assert_eq!(holders("GPU-B"), ["ml/encode", "ml/render"]);
    assert!(holders("GPU-C").is_empty());
    assert_eq!(kubelet.calls(), 3, "one List per question");

    // The device plugin's holdings, for the DRA plugin, are read the same way.
    let plugin_held: Vec<(String, String, String)> = rt
        .block_on(pod_resources::device_plugin_holders(
            &kubelet.socket,
            &snapshot,
        ))
        .unwrap()
        .into_iter()
        .map(|h| (h.uuid, h.gpu_uuid, h.owner))
        .collect();
    let triple = |u: &str, g: &str, o: &str| (u.to_owned(), g.to_owned(), o.to_owned());
    assert_eq!(
        plugin_held,
        [
            triple("MIG-A0", "GPU-A", "ml/train"),
            triple("GPU-B", "GPU-B", "ml/render"),
        ]
    );
}
