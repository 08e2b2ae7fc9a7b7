//! A fake kubelet speaking the real Device Plugin API v1beta1 over unix sockets in a temp
//! dir: it serves `Registration` on `kubelet.sock`, records every registration, and talks to
//! plugins as their client. It can "restart": stop, wipe the plugin sockets as a starting
//! kubelet does, and serve a fresh `kubelet.sock` — at once, or, as a real kubelet does, with
//! a pause between `bind` (the socket file appears) and `listen` (connections are accepted).
//!
//! Used by the device-plugin tests and by `examples/kubelet_sim.rs` (the demo).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use gpud::proto::deviceplugin::device_plugin_client::DevicePluginClient;
use gpud::proto::deviceplugin::registration_server::{Registration, RegistrationServer};
use gpud::proto::deviceplugin::{Empty, ListAndWatchResponse, RegisterRequest};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status, Streaming};

/// A registration and the moment its call arrived.
type Arrival = (Instant, RegisterRequest);

struct Recorder {
    tx: mpsc::UnboundedSender<Arrival>,
    /// Registrations still to refuse, as a kubelet refuses a version it does not support.
    refusals: Arc<AtomicU32>,
}

#[tonic::async_trait]
impl Registration for Recorder {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let refuse = self
            .refusals
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if refuse {
            // The kubelet's own words for a plugin it will not take (its gRPC status Unknown).
            return Err(Status::unknown(format!(
                "requested device plugin version {} is not supported. Supported version(s) are: [v1beta1]",
                request.get_ref().version
            )));
        }
        let _ = self.tx.send((Instant::now(), request.into_inner()));
        Ok(Response::new(Empty {}))
    }
}

/// The fake kubelet.
pub struct FakeKubelet {
    pub dir: PathBuf,
    registrations: mpsc::UnboundedReceiver<Arrival>,
    tx: mpsc::UnboundedSender<Arrival>,
    stop: Option<oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
    refusals: Arc<AtomicU32>,
}

impl FakeKubelet {
    /// Starts serving `<dir>/kubelet.sock`.
    pub async fn start(dir: &Path) -> FakeKubelet {
        let (tx, registrations) = mpsc::unbounded_channel();
        let mut kubelet = FakeKubelet {
            dir: dir.to_path_buf(),
            registrations,
            tx,
            stop: None,
            served: None,
            refusals: Arc::new(AtomicU32::new(0)),
        };
        kubelet.serve();
        kubelet
    }

    /// Refuses the next `n` registrations (they are not recorded).
    pub fn refuse_next(&self, n: u32) {
        self.refusals.store(n, Ordering::SeqCst);
    }

    /// Path of the registration socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("kubelet.sock")
    }

    #[allow(clippy::disallowed_methods)] // a fake peer, not a gpud subsystem: no span to keep
    fn serve(&mut self) {
        let socket = self.socket();
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).expect("bind kubelet.sock");
        self.serve_on(listener);
    }

    #[allow(clippy::disallowed_methods)] // a fake peer, not a gpud subsystem: no span to keep
    fn serve_on(&mut self, listener: UnixListener) {
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let recorder = Recorder {
            tx: self.tx.clone(),
            refusals: Arc::clone(&self.refusals),
        };
        self.served = Some(tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(recorder))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stop_rx.await;
                })
                .await;
        }));
        self.stop = Some(stop_tx);
    }

    /// The next registration, failing after `secs` seconds.
    pub async fn next_registration(&mut self, secs: u64) -> RegisterRequest {
        self.next_registration_at(secs).await.1
    }

    /// The next registration and when its call arrived (not when the test got to it),
    /// failing after `secs` seconds.
    pub async fn next_registration_at(&mut self, secs: u64) -> (Instant, RegisterRequest) {
        tokio::time::timeout(Duration::from_secs(secs), self.registrations.recv())
            .await
            .expect("no registration in time")
            .expect("registration channel closed")
    }

    /// Whether a registration arrives within `millis`.
    pub async fn registration_within(&mut self, millis: u64) -> Option<RegisterRequest> {
        tokio::time::timeout(Duration::from_millis(millis), self.registrations.recv())
            .await
            .ok()
            .flatten()
            .map(|(_, request)| request)
    }

    /// A registration that has already arrived, without waiting: for a test that has seen
    /// gpud get past the point where it would have registered.
    pub fn registered_already(&mut self) -> Option<RegisterRequest> {
        self.registrations
            .try_recv()
            .ok()
            .map(|(_, request)| request)
    }

    /// Stops serving, wipes every socket in the directory, and serves a new `kubelet.sock`.
    pub async fn restart(&mut self) {
        self.stop_and_wipe().await;
        self.serve();
    }

    /// Like [`FakeKubelet::restart`], but `kubelet.sock` is bound `delay` before it listens:
    /// connects in between are refused, as they are while a real kubelet starts. Returns when
    /// it started listening.
    pub async fn restart_listening_after(&mut self, delay: Duration) -> Instant {
        use nix::sys::socket::{
            AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, listen, socket,
        };
        use std::os::fd::AsRawFd;
        self.stop_and_wipe().await;
        let socket = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .expect("socket");
        bind(
            socket.as_raw_fd(),
            &UnixAddr::new(&self.socket()).expect("address"),
        )
        .expect("bind kubelet.sock");
        tokio::time::sleep(delay).await;
        listen(&socket, Backlog::new(128).expect("backlog")).expect("listen");
        let listening = Instant::now();
        let listener = std::os::unix::net::UnixListener::from(socket);
        self.serve_on(UnixListener::from_std(listener).expect("tokio listener"));
        listening
    }

    async fn stop_and_wipe(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            let _ = served.await;
        }
        for entry in std::fs::read_dir(&self.dir)
            .expect("read plugin dir")
            .flatten()
        {
            if entry.path().extension().is_some_and(|e| e == "sock") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// A client for the plugin serving `endpoint` in the directory. Dials as the kubelet does
    /// (a blocking dial with a deadline): a plugin may register a moment before its socket,
    /// wiped by a kubelet restart, is served again.
    pub async fn plugin(&self, endpoint: &str) -> DevicePluginClient<Channel> {
        let path = self.dir.join(endpoint);
        let endpoint = Endpoint::try_from(format!("unix://{}", path.display())).expect("endpoint");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let channel = loop {
            match endpoint.connect().await {
                Ok(channel) => break channel,
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(err) => panic!("connect to plugin {}: {err:?}", path.display()),
            }
        };
        DevicePluginClient::new(channel)
    }
}

/// Opens ListAndWatch on a plugin.
pub async fn list_and_watch(
    client: &mut DevicePluginClient<Channel>,
) -> Streaming<ListAndWatchResponse> {
    client
        .list_and_watch(Empty {})
        .await
        .expect("ListAndWatch")
        .into_inner()
}

/// The next device list from a ListAndWatch stream, failing after `secs` seconds.
pub async fn next_list(
    stream: &mut Streaming<ListAndWatchResponse>,
    secs: u64,
) -> ListAndWatchResponse {
    tokio::time::timeout(Duration::from_secs(secs), stream.message())
        .await
        .expect("no device list in time")
        .expect("stream error")
        .expect("stream ended")
}
