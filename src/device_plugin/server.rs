//! The gRPC DevicePlugin service for one resource — thin handlers over the pure cores.
//!
//! ListAndWatch streams the resource's device list from a watch channel: the whole list at
//! once, then again on every change. When the plugin is stopped the channel's sender is
//! dropped, which ends every stream, so the server can shut down without waiting on the
//! kubelet.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::allocate::{self, HostView};
use super::preferred;
use crate::inventory::Snapshot;
use crate::proto::deviceplugin::device_plugin_server::DevicePlugin;
use crate::proto::deviceplugin::{
    AllocateRequest, AllocateResponse, ContainerPreferredAllocationResponse, Device,
    DevicePluginOptions, Empty, ListAndWatchResponse, NumaNode, PreStartContainerRequest,
    PreStartContainerResponse, PreferredAllocationRequest, PreferredAllocationResponse,
    TopologyInfo,
};
use crate::resources::Resource;
use crate::resources::settings::Settings;

/// What one plugin serves from: its resource, the node snapshot and the settings, each
/// replaced as a whole when they change.
#[derive(Debug, Clone)]
pub struct PluginState {
    pub resource: Arc<Resource>,
    pub snapshot: Arc<Snapshot>,
    pub settings: Arc<Settings>,
    /// Control device nodes that exist under the dev root.
    pub control_nodes: Arc<Vec<&'static str>>,
    /// MIG capability device nodes per MIG UUID.
    pub mig_caps: Arc<HashMap<String, Vec<String>>>,
}

/// The DevicePlugin service of one resource.
#[derive(Debug, Clone)]
pub struct PluginService {
    state: watch::Receiver<PluginState>,
}

impl PluginService {
    /// A service reading from `state`.
    pub fn new(state: watch::Receiver<PluginState>) -> Self {
        PluginService { state }
    }
}

/// The kubelet's view of a resource's devices.
pub fn device_list(resource: &Resource) -> ListAndWatchResponse {
    ListAndWatchResponse {
        devices: resource
            .devices
            .iter()
            .map(|d| Device {
                id: d.id.clone(),
                health: if d.healthy { "Healthy" } else { "Unhealthy" }.to_owned(),
                topology: d.numa.map(|node| TopologyInfo {
                    nodes: vec![NumaNode {
                        id: i64::from(node),
                    }],
                }),
            })
            .collect(),
    }
}

/// A random suffix for the CDI annotation key, as NVIDIA uses a random UUID there.
fn annotation_suffix() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            format!("{nanos:032x}")
        })
}

type DeviceStream =
    Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl DevicePlugin for PluginService {
    type ListAndWatchStream = DeviceStream;

    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut last: Option<ListAndWatchResponse> = None;
        let stream = WatchStream::new(self.state.clone()).filter_map(move |state| {
            let list = device_list(&state.resource);
            // Resend only when the kubelet would see a difference.
            if last.as_ref() == Some(&list) {
                return None;
            }
            last = Some(list.clone());
            Some(Ok(list))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let state = self.state.borrow().clone();
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|req| ContainerPreferredAllocationResponse {
                device_i_ds: preferred::preferred(
                    &state.resource,
                    &state.snapshot,
                    &req.available_device_i_ds,
                    &req.must_include_device_i_ds,
                    usize::try_from(req.allocation_size).unwrap_or(0),
                    state.settings.shared_policy,
                ),
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let state = self.state.borrow().clone();
        let host = HostView {
            control_nodes: &state.control_nodes,
            mig_caps: Some(&state.mig_caps),
        };
        let mut container_responses = Vec::new();
        for req in request.into_inner().container_requests {
            match allocate::allocate(
                &state.resource,
                &state.settings,
                &req.devices_ids,
                &annotation_suffix(),
                &host,
            ) {
                Ok(response) => container_responses.push(response),
                Err(err) => {
                    warn!(resource = %state.resource.name, error = %crate::logging::error_chain(&err), "Allocate refused");
                    return Err(Status::invalid_argument(err.to_string()));
                }
            }
        }
        info!(resource = %state.resource.name, containers = container_responses.len(), "Allocated");
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
