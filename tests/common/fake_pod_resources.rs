//! A fake kubelet pod-resources server: a real tonic server on a unix socket in a temp dir,
//! speaking `podresources/v1`, whose `List` answer the test sets, or that fails or hangs every
//! `List` ([`Mode`]). Stopping it (drop) removes its socket; starting another on the same path
//! is a kubelet restart. Answers hold device-plugin devices ([`answer`]) and DRA claims'
//! devices ([`with_claims`]), as a kubelet with both allocation paths does.

// Each test binary that includes this file uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gpud::proto::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use gpud::proto::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, CdiDevice, ClaimResource,
    ContainerDevices, ContainerResources, DynamicResource, GetPodResourcesRequest,
    GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

pub use crate::common::unix_grpc::Mode;
use crate::common::unix_grpc::{Modes, UnixServer};

struct Lister {
    answer: Arc<Mutex<ListPodResourcesResponse>>,
    mode: Modes,
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.mode.admit("the fake kubelet is failing").await?;
        Ok(Response::new(self.answer.lock().unwrap().clone()))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not in this fake"))
    }

    async fn get(
        &self,
        _: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not in this fake"))
    }
}

/// A running fake kubelet; stopped (and its socket removed) on drop.
pub struct FakeKubelet {
    pub socket: PathBuf,
    answer: Arc<Mutex<ListPodResourcesResponse>>,
    mode: Modes,
    calls: Arc<AtomicUsize>,
    server: UnixServer,
}

impl FakeKubelet {
    /// Serves `answer` on `socket`.
    pub fn start(socket: &Path, answer: ListPodResourcesResponse) -> FakeKubelet {
        let answer = Arc::new(Mutex::new(answer));
        let mode = Modes::default();
        let calls = Arc::new(AtomicUsize::new(0));
        let service = Lister {
            answer: Arc::clone(&answer),
            mode: mode.clone(),
            calls: Arc::clone(&calls),
        };
        let server = UnixServer::start(socket, Routes::new(PodResourcesListerServer::new(service)));
        FakeKubelet {
            socket: socket.to_path_buf(),
            answer,
            mode,
            calls,
            server,
        }
    }

    /// Changes what `List` answers.
    pub fn set(&self, answer: ListPodResourcesResponse) {
        *self.answer.lock().unwrap() = answer;
    }

    /// Changes how `List` is answered.
    pub fn set_mode(&self, mode: Mode) {
        self.mode.set(mode);
    }

    /// `List` calls received so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.server.connections()
    }
}

/// One container holding `ids` of `resource`.
pub struct Holder<'a> {
    pub namespace: &'a str,
    pub pod: &'a str,
    pub container: &'a str,
    pub resource: &'a str,
    pub ids: &'a [&'a str],
}

/// A `List` answer with one pod per holder (plus a CPU-only pod that must be ignored).
pub fn answer(holders: &[Holder<'_>]) -> ListPodResourcesResponse {
    let mut pods: Vec<PodResources> = holders
        .iter()
        .map(|h| PodResources {
            name: h.pod.into(),
            namespace: h.namespace.into(),
            containers: vec![ContainerResources {
                name: h.container.into(),
                devices: vec![ContainerDevices {
                    resource_name: h.resource.into(),
                    device_ids: h.ids.iter().map(|s| (*s).to_owned()).collect(),
                    topology: None,
                }],
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    pods.push(PodResources {
        name: "cpu-only".into(),
        namespace: "default".into(),
        containers: vec![ContainerResources {
            name: "app".into(),
            cpu_ids: vec![1, 2],
            ..Default::default()
        }],
        ..Default::default()
    });
    ListPodResourcesResponse {
        pod_resources: pods,
    }
}

/// One container holding devices through a DRA claim in its own namespace.
pub struct ClaimHolder<'a> {
    pub namespace: &'a str,
    pub pod: &'a str,
    pub container: &'a str,
    pub claim: &'a str,
    /// (driver, pool, device name) of each allocated device.
    pub devices: &'a [(&'a str, &'a str, &'a str)],
}

/// `answer` with one more pod per claim holder, its container's `dynamic_resources` holding
/// the claim's devices, each with the CDI device a DRA driver would have returned for it.
pub fn with_claims(
    mut answer: ListPodResourcesResponse,
    holders: &[ClaimHolder<'_>],
) -> ListPodResourcesResponse {
    answer
        .pod_resources
        .extend(holders.iter().map(|h| PodResources {
            name: h.pod.into(),
            namespace: h.namespace.into(),
            containers: vec![ContainerResources {
                name: h.container.into(),
                dynamic_resources: vec![DynamicResource {
                    claim_name: h.claim.into(),
                    claim_namespace: h.namespace.into(),
                    claim_resources: h
                        .devices
                        .iter()
                        .map(|(driver, pool, device)| ClaimResource {
                            cdi_devices: vec![CdiDevice {
                                name: format!("k8s.{driver}/claim={}-{device}", h.claim),
                            }],
                            driver_name: (*driver).into(),
                            pool_name: (*pool).into(),
                            device_name: (*device).into(),
                            share_id: None,
                        })
                        .collect(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        }));
    answer
}
