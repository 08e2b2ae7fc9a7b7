//! A fake container runtime: a real tonic server on a unix socket in a temp dir, speaking
//! `runtime.v1.RuntimeService`'s `ListPodSandbox` and `ListContainers`, whose answers the
//! test sets (pods as the kubelet makes them: sandbox metadata and `io.kubernetes.*` labels),
//! or that fails or hangs every call ([`Mode`]). Stopping it (drop) removes its socket.

// Each test binary that includes this file uses part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gpud::proto::cri_runtime::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use gpud::proto::cri_runtime::{
    Container, ContainerMetadata, ListContainersRequest, ListContainersResponse,
    ListPodSandboxRequest, ListPodSandboxResponse, PodSandbox, PodSandboxMetadata,
};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

pub use crate::common::unix_grpc::Mode;
use crate::common::unix_grpc::{Modes, UnixServer};

/// One pod as the runtime knows it: its sandbox and its containers `(name, id)`.
#[derive(Debug, Clone)]
pub struct RuntimePod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub containers: Vec<(String, String)>,
}

impl RuntimePod {
    pub fn new(namespace: &str, name: &str, uid: &str, containers: &[(&str, &str)]) -> Self {
        RuntimePod {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
            containers: containers
                .iter()
                .map(|(n, id)| ((*n).to_owned(), (*id).to_owned()))
                .collect(),
        }
    }

    fn labels(&self) -> HashMap<String, String> {
        HashMap::from([
            ("io.kubernetes.pod.uid".to_owned(), self.uid.clone()),
            ("io.kubernetes.pod.name".to_owned(), self.name.clone()),
            (
                "io.kubernetes.pod.namespace".to_owned(),
                self.namespace.clone(),
            ),
        ])
    }

    fn sandbox_id(&self) -> String {
        format!("sandbox-{}", self.uid)
    }
}

#[derive(Default)]
struct Calls {
    sandboxes: AtomicUsize,
    containers: AtomicUsize,
}

struct Runtime {
    pods: Arc<Mutex<Vec<RuntimePod>>>,
    mode: Modes,
    calls: Arc<Calls>,
}

#[tonic::async_trait]
impl RuntimeService for Runtime {
    async fn list_pod_sandbox(
        &self,
        _: Request<ListPodSandboxRequest>,
    ) -> Result<Response<ListPodSandboxResponse>, Status> {
        self.calls.sandboxes.fetch_add(1, Ordering::SeqCst);
        self.mode.admit("the fake runtime is failing").await?;
        let items = self
            .pods
            .lock()
            .unwrap()
            .iter()
            .map(|pod| PodSandbox {
                id: pod.sandbox_id(),
                metadata: Some(PodSandboxMetadata {
                    name: pod.name.clone(),
                    uid: pod.uid.clone(),
                    namespace: pod.namespace.clone(),
                    attempt: 0,
                }),
                labels: pod.labels(),
            })
            .collect();
        Ok(Response::new(ListPodSandboxResponse { items }))
    }

    async fn list_containers(
        &self,
        _: Request<ListContainersRequest>,
    ) -> Result<Response<ListContainersResponse>, Status> {
        self.calls.containers.fetch_add(1, Ordering::SeqCst);
        self.mode.admit("the fake runtime is failing").await?;
        let containers = self
            .pods
            .lock()
            .unwrap()
            .iter()
            .flat_map(|pod| {
                pod.containers.iter().map(move |(name, id)| {
                    let mut labels = pod.labels();
                    labels.insert("io.kubernetes.container.name".into(), name.clone());
                    Container {
                        id: id.clone(),
                        pod_sandbox_id: pod.sandbox_id(),
                        metadata: Some(ContainerMetadata {
                            name: name.clone(),
                            attempt: 0,
                        }),
                        labels,
                    }
                })
            })
            .collect();
        Ok(Response::new(ListContainersResponse { containers }))
    }
}

/// A running fake runtime; stopped (and its socket removed) on drop.
pub struct FakeRuntime {
    pub socket: PathBuf,
    pods: Arc<Mutex<Vec<RuntimePod>>>,
    mode: Modes,
    calls: Arc<Calls>,
    _server: UnixServer,
}

impl FakeRuntime {
    /// Serves `pods` on `socket`.
    pub fn start(socket: &Path, pods: Vec<RuntimePod>) -> FakeRuntime {
        let pods = Arc::new(Mutex::new(pods));
        let mode = Modes::default();
        let calls = Arc::new(Calls::default());
        let service = Runtime {
            pods: Arc::clone(&pods),
            mode: mode.clone(),
            calls: Arc::clone(&calls),
        };
        let server = UnixServer::start(socket, Routes::new(RuntimeServiceServer::new(service)));
        FakeRuntime {
            socket: socket.to_path_buf(),
            pods,
            mode,
            calls,
            _server: server,
        }
    }

    /// Changes the pods the runtime has.
    pub fn set(&self, pods: Vec<RuntimePod>) {
        *self.pods.lock().unwrap() = pods;
    }

    /// Changes how calls are answered.
    pub fn set_mode(&self, mode: Mode) {
        self.mode.set(mode);
    }

    /// `(ListPodSandbox, ListContainers)` calls received so far.
    pub fn calls(&self) -> (usize, usize) {
        (
            self.calls.sandboxes.load(Ordering::SeqCst),
            self.calls.containers.load(Ordering::SeqCst),
        )
    }
}
