//! A simulated kubelet for trying `gpud device-plugin` without Kubernetes.
//!
//! Serves the kubelet's registration socket in a directory, waits for a plugin to register,
//! prints its devices, asks for the preferred 2-GPU set and allocates it, then — given the
//! simulated driver's control file — injects an XID and shows the GPU withdrawn, and a reset
//! bringing it back.
//!
//! ```sh
//! cargo run --example kubelet_sim -- DIR [CONTROL_FILE]
//! ```

// A development tool built on the test fake: a failed expectation is a clear stop, not a bug.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/fake_kubelet.rs"]
mod fake_kubelet;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use fake_kubelet::{FakeKubelet, list_and_watch, next_list};
use gpud::proto::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest,
    ListAndWatchResponse, PreferredAllocationRequest,
};

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

fn inject(control: &PathBuf, line: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().append(true).open(control)?;
    writeln!(file, "{line}")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: kubelet_sim DIR [CONTROL_FILE]")?);
    let control = args.next().map(PathBuf::from);

    let mut kubelet = FakeKubelet::start(&dir).await;
    println!("kubelet-sim: serving {}", kubelet.socket().display());
    let reg = kubelet.next_registration(30).await;
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
    let list = next_list(&mut stream, 10).await;
    println!("kubelet-sim: ListAndWatch: {} devices", list.devices.len());
    show(&list);

    let available: Vec<String> = list.devices.iter().map(|d| d.id.clone()).collect();
    // Two devices where the node has them; a one-GPU node asks for its only one.
    let size = i32::try_from(available.len().min(2))?;
    let preferred = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
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

    if let Some(control) = control {
        println!("kubelet-sim: injecting 'xid 3 79' (GPU 3 falls off the bus)");
        inject(&control, "xid 3 79")?;
        let sick = next_list(&mut stream, 10).await;
        println!("kubelet-sim: ListAndWatch update:");
        show(&sick);
        println!("kubelet-sim: resetting GPU 3 ('lost 3', then 'recover 3')");
        inject(&control, "lost 3")?;
        tokio::time::sleep(Duration::from_millis(700)).await;
        inject(&control, "recover 3")?;
        let back = next_list(&mut stream, 10).await;
        println!("kubelet-sim: ListAndWatch update:");
        show(&back);
    }
    Ok(())
}
