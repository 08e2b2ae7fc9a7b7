//! A fake kubelet pod-resources server: a real tonic server on a unix socket in a temp dir,
//! speaking `podresources/v1`, whose `List` answer the test sets.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use gpud::proto::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use gpud::proto::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

struct Lister {
    answer: Arc<Mutex<ListPodResourcesResponse>>,
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
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
    calls: Arc<AtomicUsize>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeKubelet {
    /// Serves `answer` on `socket`.
    pub fn start(socket: &Path, answer: ListPodResourcesResponse) -> FakeKubelet {
        let answer = Arc::new(Mutex::new(answer));
        let calls = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = oneshot::channel::<()>();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let service = Lister {
            answer: Arc::clone(&answer),
            calls: Arc::clone(&calls),
        };
        let path = socket.to_path_buf();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let _ = std::fs::remove_file(&path);
                let listener = tokio::net::UnixListener::bind(&path).unwrap();
                bound_tx.send(()).unwrap();
                tonic::transport::Server::builder()
                    .add_service(PodResourcesListerServer::new(service))
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::UnixListenerStream::new(listener),
                        async {
                            let _ = stopped.await;
                        },
                    )
                    .await
                    .unwrap();
            });
        });
        bound_rx.recv().unwrap();
        FakeKubelet {
            socket: socket.to_path_buf(),
            answer,
            calls,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Changes what `List` answers.
    pub fn set(&self, answer: ListPodResourcesResponse) {
        *self.answer.lock().unwrap() = answer;
    }

    /// `List` calls served so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.socket);
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
