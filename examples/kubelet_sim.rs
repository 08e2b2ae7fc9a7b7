//! A simulated kubelet for trying `gpud device-plugin` without Kubernetes.
//!
//! Serves the kubelet's registration socket in a directory, waits for a plugin to register,
//! prints its devices, asks for the preferred 2-GPU set and allocates it, then — given the
//! simulated driver's control file — injects an XID into the last GPU the plugin advertises
//! (itself or through its MIG devices) and shows it withdrawn, and a reset bringing it back.
//!
//! ```sh
//! gpud inventory > DIR/inventory.json
//! cargo run --example kubelet_sim -- DIR [CONTROL_FILE]
//! ```
//!
//! `DIR/inventory.json` (what `gpud inventory` prints) tells it what the node holds: on a node
//! without GPUs there is nothing to register, so it says so and exits 0. The GPU it chose is
//! written to `DIR/demo-gpu` for the demo's next steps.

// A development tool built on the test fake, whose helpers stop on a failed expectation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/fake_kubelet.rs"]
mod fake_kubelet;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use fake_kubelet::{FakeKubelet, list_and_watch};
use gpud::proto::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest,
    ListAndWatchResponse, PreferredAllocationRequest,
};
use tonic::Streaming;

type Error = Box<dyn std::error::Error>;

/// A GPU as the inventory describes it: its index and the IDs the plugin may advertise for it.
struct NodeGpu {
    index: u64,
    ids: Vec<String>,
}

/// The node's GPUs from `gpud inventory`'s JSON; `None` when the file is not there.
fn node_gpus(dir: &Path) -> Result<Option<Vec<NodeGpu>>, Error> {
    let path = dir.join("inventory.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display()).into()),
    };
    let inventory: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not gpud inventory's JSON: {e}", path.display()))?;
    let gpus = inventory["gpus"].as_array().cloned().unwrap_or_default();
    let text_of = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    Ok(Some(
        gpus.iter()
            .map(|gpu| NodeGpu {
                index: gpu["index"].as_u64().unwrap_or_default(),
                ids: std::iter::once(text_of(&gpu["uuid"]))
                    .chain(
                        gpu["mig"]["devices"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|m| text_of(&m["uuid"])),
                    )
                    .collect(),
            })
            .collect(),
    ))
}

fn show(list: &ListAndWatchResponse) {
    for device in &list.devices {
        let numa = device
            .topology
            .as_ref()
            .and_then(|t| t.nodes.first())
            .map_or(-1, |n| n.id);
        println!("    {:<44} {:<9} numa {numa}", device.id, device.health);
    }
}

fn inject(control: &Path, line: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().append(true).open(control)?;
    writeln!(file, "{line}")
}

/// The next device list, or an error saying what did not arrive.
async fn next_list(
    stream: &mut Streaming<ListAndWatchResponse>,
    waiting_for: &str,
) -> Result<ListAndWatchResponse, Error> {
    match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
        Ok(Ok(Some(list))) => Ok(list),
        Ok(Ok(None)) => Err(format!("the plugin closed ListAndWatch before {waiting_for}").into()),
        Ok(Err(status)) => {
            Err(format!("ListAndWatch failed before {waiting_for}: {status}").into())
        }
        Err(_) => Err(format!("no ListAndWatch update within 10 s for {waiting_for}").into()),
    }
}

/// Whether a device ID (`<uuid>` or `<uuid>::<replica>`) belongs to `gpu`.
fn advertises(gpu: &NodeGpu, device_id: &str) -> bool {
    let uuid = device_id.split("::").next().unwrap_or(device_id);
    gpu.ids.iter().any(|id| id == uuid)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kubelet-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: kubelet_sim DIR [CONTROL_FILE]")?);
    let control = args.next().map(PathBuf::from);
    let gpus = node_gpus(&dir)?;
    if gpus.as_ref().is_some_and(Vec::is_empty) {
        println!(
            "kubelet-sim: this node has no GPUs, so the device plugin has nothing to register \
             and nothing can be allocated; try a node with GPUs, e.g. FIXTURE=dgx-h100"
        );
        return Ok(());
    }

    let mut kubelet = FakeKubelet::start(&dir).await;
    println!("kubelet-sim: serving {}", kubelet.socket().display());
    let reg = kubelet
        .registration_within(30_000)
        .await
        .ok_or("no device plugin registered within 30 s")?;
    println!(
        "kubelet-sim: Register(version={}, resource={}, endpoint={}, preferredAllocation={})",
        reg.version,
        reg.resource_name,
        reg.endpoint,
        reg.options
            .as_ref()
            .is_some_and(|o| o.get_preferred_allocation_available)
    );

    let mut client = kubelet.plugin(&reg.endpoint).await;
    let mut stream = list_and_watch(&mut client).await;
    let list = next_list(&mut stream, "the first device list").await?;
    println!("kubelet-sim: ListAndWatch: {} devices", list.devices.len());
    show(&list);

    let available: Vec<String> = list.devices.iter().map(|d| d.id.clone()).collect();
    // Two devices where the node has them; a one-device resource asks for its only one.
    let size = i32::try_from(available.len().min(2))?;
    let preferred = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available.clone(),
                must_include_device_i_ds: vec![],
                allocation_size: size,
            }],
        })
        .await?
        .into_inner();
    let chosen = preferred
        .container_responses
        .first()
        .map(|c| c.device_i_ds.clone())
        .unwrap_or_default();
    println!("kubelet-sim: GetPreferredAllocation({size}) -> {chosen:?}");
    let allocated = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: chosen,
            }],
        })
        .await?
        .into_inner();
    for container in &allocated.container_responses {
        let mut envs: Vec<_> = container.envs.iter().collect();
        envs.sort();
        println!("kubelet-sim: Allocate -> envs {envs:?}");
    }

    let Some(control) = control else {
        return Ok(());
    };
    // The last GPU this resource advertises, itself or through its MIG devices; without the
    // inventory, the GPU behind the last device is unknown, so nothing is injected.
    let Some(gpu) = gpus
        .iter()
        .flatten()
        .rev()
        .find(|gpu| available.iter().any(|id| advertises(gpu, id)))
    else {
        println!(
            "kubelet-sim: no GPU of {} found in {}: no fault injected",
            reg.resource_name,
            dir.join("inventory.json").display()
        );
        return Ok(());
    };
    let index = gpu.index;
    std::fs::write(dir.join("demo-gpu"), index.to_string())?;
    println!("kubelet-sim: injecting 'xid {index} 79' (GPU {index} falls off the bus)");
    inject(&control, &format!("xid {index} 79"))?;
    let sick = next_list(&mut stream, "the XID").await?;
    println!("kubelet-sim: ListAndWatch update:");
    show(&sick);
    println!("kubelet-sim: resetting GPU {index} ('lost {index}', then 'recover {index}')");
    inject(&control, &format!("lost {index}"))?;
    tokio::time::sleep(Duration::from_millis(700)).await;
    inject(&control, &format!("recover {index}"))?;
    let back = next_list(&mut stream, "the reset").await?;
    println!("kubelet-sim: ListAndWatch update:");
    show(&back);
    Ok(())
}
