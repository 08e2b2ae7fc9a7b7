//! GetPreferredAllocation: which devices the kubelet should give a container.
//!
//! Whole GPUs: the set with the best interconnect. A pair of GPUs scores like NVIDIA's
//! best-effort policy — 100 per NVLink plus 10 (across sockets), 20 (same NUMA node),
//! 30 (same host bridge), 40 (several PCIe switches), 50 (one PCIe switch) or 60 (same board)
//! — and a set scores the sum of its pairs. Unlike NVIDIA's partition heuristic, gpud finds the
//! best-scoring set that holds the must-include devices exactly, by exhaustive search while the
//! number of candidate sets is small (every request on an 8- or 16-GPU node), and greedily
//! above that. Ties go to the lowest GPU indices, so answers are stable.
//!
//! Shared (time-sliced) devices: NVIDIA's greedy replica policies — `distributed` prefers the
//! GPU with the fewest replicas in use, `packed` the most; ties go to the GPU picked least in
//! this request, then the lowest index.

use std::collections::BTreeMap;

use crate::inventory::model::{PcieLevel, Snapshot};
use crate::resources::Resource;
use crate::resources::settings::SharedPolicy;

/// Largest number of candidate sets searched exhaustively.
const EXHAUSTIVE_LIMIT: u64 = 50_000;

/// The preferred IDs, or an empty list when the request cannot be met (as NVIDIA answers).
pub fn preferred(
    resource: &Resource,
    snapshot: &Snapshot,
    available: &[String],
    must_include: &[String],
    size: usize,
    policy: SharedPolicy,
) -> Vec<String> {
    if size == 0 || available.len() < size || must_include.len() > size {
        return Vec::new();
    }
    if resource.replicas.is_some() {
        return replicas(resource, available, must_include, size, policy);
    }
    let gpu_of = |id: &String| resource.device(id).map(|d| (d.gpu, d.mig.is_some()));
    let whole_gpus = available
        .iter()
        .all(|id| matches!(gpu_of(id), Some((_, false))));
    if !whole_gpus {
        // MIG devices share their parent's links; keep the kubelet's order after the
        // must-include ones.
        return fill_in_order(available, must_include, size);
    }
    best_set(resource, snapshot, available, must_include, size)
}

/// Score of two GPUs by index.
pub fn pair_score(snapshot: &Snapshot, a: u32, b: u32) -> u64 {
    let Some(link) = snapshot.link_between(a, b) else {
        return 0;
    };
    let pcie = match link.pcie {
        PcieLevel::System => 10,
        PcieLevel::NumaNode => 20,
        PcieLevel::HostBridge => 30,
        PcieLevel::MultipleSwitches => 40,
        PcieLevel::SingleSwitch => 50,
        PcieLevel::SameBoard => 60,
        PcieLevel::Unknown => 0,
    };
    100 * u64::from(link.nvlinks) + pcie
}

/// Sum of pair scores of a set of GPU indices.
pub fn set_score(snapshot: &Snapshot, gpus: &[u32]) -> u64 {
    let mut total = 0;
    for (i, &a) in gpus.iter().enumerate() {
        for &b in &gpus[i + 1..] {
            total += pair_score(snapshot, a, b);
        }
    }
    total
}

fn fill_in_order(available: &[String], must_include: &[String], size: usize) -> Vec<String> {
    let mut out: Vec<String> = must_include.to_vec();
    for id in available {
        if out.len() == size {
            break;
        }
        if !out.contains(id) {
            out.push(id.clone());
        }
    }
    out
}

fn best_set(
    resource: &Resource,
    snapshot: &Snapshot,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    let index_of = |id: &String| resource.device(id).map(|d| d.gpu);
    let mut fixed: Vec<u32> = must_include.iter().filter_map(index_of).collect();
    fixed.sort_unstable();
    fixed.dedup();
    let mut pool: Vec<u32> = available
        .iter()
        .filter_map(index_of)
        .filter(|g| !fixed.contains(g))
        .collect();
    pool.sort_unstable();
    pool.dedup();
    let need = size.saturating_sub(fixed.len());
    if pool.len() < need {
        return Vec::new();
    }
    let chosen = if binomial(pool.len() as u64, need as u64) <= EXHAUSTIVE_LIMIT {
        exhaustive(snapshot, &fixed, &pool, need)
    } else {
        greedy(snapshot, &fixed, &pool, need)
    };
    let mut gpus: Vec<u32> = fixed.into_iter().chain(chosen).collect();
    gpus.sort_unstable();
    gpus.iter()
        .filter_map(|g| {
            available
                .iter()
                .find(|id| index_of(id) == Some(*g))
                .cloned()
        })
        .collect()
}

/// The best `need` GPUs from `pool` to add to `fixed`; ties to the lexicographically lowest.
fn exhaustive(snapshot: &Snapshot, fixed: &[u32], pool: &[u32], need: usize) -> Vec<u32> {
    let mut best: Option<(u64, Vec<u32>)> = None;
    let mut current = Vec::with_capacity(need);
    let mut set = fixed.to_vec();
    search(snapshot, pool, 0, need, &mut current, &mut set, &mut best);
    best.map(|(_, chosen)| chosen).unwrap_or_default()
}

fn search(
    snapshot: &Snapshot,
    pool: &[u32],
    start: usize,
    need: usize,
    current: &mut Vec<u32>,
    set: &mut Vec<u32>,
    best: &mut Option<(u64, Vec<u32>)>,
) {
    if current.len() == need {
        let score = set_score(snapshot, set);
        // Combinations come in lexicographic order: only a strictly better score replaces.
        if best.as_ref().is_none_or(|(s, _)| score > *s) {
            *best = Some((score, current.clone()));
        }
        return;
    }
    let remaining = need - current.len();
    for i in start..=pool.len().saturating_sub(remaining) {
        current.push(pool[i]);
        set.push(pool[i]);
        search(snapshot, pool, i + 1, need, current, set, best);
        set.pop();
        current.pop();
    }
}

/// Adds, one at a time, the GPU that raises the score most (the best pair first when nothing
/// is fixed).
fn greedy(snapshot: &Snapshot, fixed: &[u32], pool: &[u32], need: usize) -> Vec<u32> {
    let mut set = fixed.to_vec();
    let mut left: Vec<u32> = pool.to_vec();
    let mut chosen = Vec::with_capacity(need);
    if set.is_empty() && need >= 2 {
        let mut best = (0, 0, 0u64);
        let mut found = false;
        for (i, &a) in left.iter().enumerate() {
            for &b in &left[i + 1..] {
                let score = pair_score(snapshot, a, b);
                if !found || score > best.2 {
                    best = (a, b, score);
                    found = true;
                }
            }
        }
        for g in [best.0, best.1] {
            set.push(g);
            chosen.push(g);
            left.retain(|x| *x != g);
        }
    }
    while chosen.len() < need {
        let Some((pos, _)) = left
            .iter()
            .enumerate()
            .map(|(pos, &g)| {
                (
                    pos,
                    set.iter().map(|&s| pair_score(snapshot, s, g)).sum::<u64>(),
                )
            })
            .fold(None::<(usize, u64)>, |best, (pos, gain)| match best {
                Some((_, g)) if g >= gain => best,
                _ => Some((pos, gain)),
            })
        else {
            break;
        };
        let g = left.remove(pos);
        set.push(g);
        chosen.push(g);
    }
    chosen
}

fn binomial(n: u64, k: u64) -> u64 {
    let k = k.min(n.saturating_sub(k));
    let mut result: u64 = 1;
    for i in 0..k {
        result = result.saturating_mul(n - i) / (i + 1);
    }
    result
}

/// NVIDIA's replica policies.
fn replicas(
    resource: &Resource,
    available: &[String],
    must_include: &[String],
    size: usize,
    policy: SharedPolicy,
) -> Vec<String> {
    let total = u64::from(resource.replicas.unwrap_or(1));
    let gpu_of = |id: &str| resource.device(id).map(|d| d.gpu);
    // Replicas in use per GPU: all of its replicas minus those still available.
    let mut in_use: BTreeMap<u32, u64> = BTreeMap::new();
    for device in &resource.devices {
        in_use.entry(device.gpu).or_insert(total);
    }
    for id in available {
        if let Some(g) = gpu_of(id) {
            let used = in_use.entry(g).or_insert(total);
            *used = used.saturating_sub(1);
        }
    }
    let mut out: Vec<String> = must_include.to_vec();
    let mut candidates: Vec<&String> = available
        .iter()
        .filter(|id| !must_include.contains(id))
        .collect();
    let mut picked_now: BTreeMap<u32, u64> = BTreeMap::new();
    while out.len() < size {
        let best = candidates
            .iter()
            .enumerate()
            .filter_map(|(pos, id)| gpu_of(id).map(|g| (pos, g)))
            .min_by_key(|&(_, g)| {
                let used = in_use.get(&g).copied().unwrap_or(0);
                let primary = match policy {
                    SharedPolicy::Distributed => used,
                    SharedPolicy::Packed => u64::MAX - used,
                };
                (primary, picked_now.get(&g).copied().unwrap_or(0), g)
            });
        let Some((pos, g)) = best else {
            return Vec::new();
        };
        out.push(candidates.remove(pos).clone());
        *in_use.entry(g).or_insert(0) += 1;
        *picked_now.entry(g).or_insert(0) += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::PluginDevice;

    fn replica_resource(gpus: u32, replicas: u32) -> Resource {
        let devices = (0..gpus)
            .flat_map(|g| {
                (0..replicas).map(move |n| PluginDevice {
                    id: format!("GPU-{g}::{n}"),
                    base_id: format!("GPU-{g}"),
                    uuid: format!("GPU-{g}"),
                    index_id: g.to_string(),
                    gpu: g,
                    minor: Some(g),
                    mig: None,
                    healthy: true,
                    numa: None,
                    replica: Some(n),
                })
            })
            .collect();
        Resource {
            name: "nvidia.com/gpu".into(),
            replicas: Some(replicas),
            devices,
        }
    }

    fn all_ids(r: &Resource) -> Vec<String> {
        r.devices.iter().map(|d| d.id.clone()).collect()
    }

    fn per_gpu(r: &Resource, ids: &[String]) -> Vec<usize> {
        let mut counts = BTreeMap::new();
        for id in ids {
            *counts.entry(r.device(id).unwrap().gpu).or_insert(0) += 1;
        }
        let mut v: Vec<usize> = counts.into_values().collect();
        v.sort_unstable();
        v.reverse();
        v
    }

    fn empty_snapshot() -> Snapshot {
        serde_json::from_value(serde_json::json!({
            "node": {"hostname": "n", "driver_version": "1", "cuda_driver_version": null, "nvml_version": null, "machine_type": null},
            "gpus": [], "topology": []
        }))
        .unwrap()
    }

    #[test]
    fn replica_policies_match_nvidias_cases() {
        let snap = empty_snapshot();
        let r = replica_resource(2, 4);
        let got = preferred(&r, &snap, &all_ids(&r), &[], 2, SharedPolicy::Distributed);
        assert_eq!(per_gpu(&r, &got), [1, 1]);
        let got = preferred(&r, &snap, &all_ids(&r), &[], 2, SharedPolicy::Packed);
        assert_eq!(per_gpu(&r, &got), [2]);
        let got = preferred(&r, &snap, &all_ids(&r), &[], 5, SharedPolicy::Packed);
        assert_eq!(per_gpu(&r, &got), [4, 1]);
        let r3 = replica_resource(3, 2);
        let got = preferred(&r3, &snap, &all_ids(&r3), &[], 3, SharedPolicy::Distributed);
        assert_eq!(per_gpu(&r3, &got), [1, 1, 1]);
    }

    #[test]
    fn distributed_prefers_the_least_used_gpu() {
        let snap = empty_snapshot();
        let r = replica_resource(2, 4);
        // Three replicas of GPU 0 are taken already: only GPU-0::3 and GPU 1's four remain.
        let available: Vec<String> = ["GPU-0::3", "GPU-1::0", "GPU-1::1", "GPU-1::2", "GPU-1::3"]
            .map(String::from)
            .to_vec();
        let got = preferred(&r, &snap, &available, &[], 1, SharedPolicy::Distributed);
        assert_eq!(got, ["GPU-1::0"]);
        let got = preferred(&r, &snap, &available, &[], 1, SharedPolicy::Packed);
        assert_eq!(got, ["GPU-0::3"]);
    }

    #[test]
    fn impossible_requests_get_nothing() {
        let snap = empty_snapshot();
        let r = replica_resource(1, 2);
        assert!(preferred(&r, &snap, &all_ids(&r), &[], 3, SharedPolicy::Distributed).is_empty());
        assert!(preferred(&r, &snap, &all_ids(&r), &[], 0, SharedPolicy::Distributed).is_empty());
    }

    #[test]
    fn binomials() {
        assert_eq!(binomial(8, 4), 70);
        assert_eq!(binomial(16, 8), 12870);
        assert_eq!(binomial(5, 0), 1);
    }
}
