//! What the fake gRPC peers on unix sockets share (the kubelet's pod-resources API, the
//! container runtime): a real tonic server on its own thread, stopped and its socket removed
//! on drop (starting another on the same path is a restart), counting the connections it
//! accepts; and the [`Mode`] its calls are answered in.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::oneshot;
use tonic::Status;
use tonic::service::Routes;

/// How calls are answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// With the answer set.
    #[default]
    Answer,
    /// With an `UNAVAILABLE` status, as a peer still starting.
    Fail,
    /// Not while this mode lasts: the call is accepted and stays open.
    Hang,
}

/// The mode, shared between the test and the service.
#[derive(Debug, Clone, Default)]
pub struct Modes(Arc<Mutex<Mode>>);

impl Modes {
    pub fn set(&self, mode: Mode) {
        *self.0.lock().unwrap() = mode;
    }

    /// Waits while the mode is `Hang` (so that stopping the fake, which waits for calls in
    /// flight, cannot hang the test), then fails with `failing` or lets the call answer.
    pub async fn admit(&self, failing: &str) -> Result<(), Status> {
        let mode = loop {
            let mode = *self.0.lock().unwrap();
            if mode != Mode::Hang {
                break mode;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        };
        match mode {
            Mode::Fail => Err(Status::unavailable(failing.to_owned())),
            Mode::Answer | Mode::Hang => Ok(()),
        }
    }
}

/// A running server; stopped (and its socket removed) on drop.
pub struct UnixServer {
    pub socket: PathBuf,
    connections: Arc<AtomicUsize>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl UnixServer {
    /// Serves `routes` on `socket`, once it is bound.
    pub fn start(socket: &Path, routes: Routes) -> UnixServer {
        let connections = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = oneshot::channel::<()>();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let accepted = Arc::clone(&connections);
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
                    .add_routes(routes)
                    .serve_with_incoming_shutdown(
                        tokio_stream::StreamExt::map(
                            tokio_stream::wrappers::UnixListenerStream::new(listener),
                            move |connection| {
                                accepted.fetch_add(1, Ordering::SeqCst);
                                connection
                            },
                        ),
                        async {
                            let _ = stopped.await;
                        },
                    )
                    .await
                    .unwrap();
            });
        });
        bound_rx.recv().unwrap();
        UnixServer {
            socket: socket.to_path_buf(),
            connections,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for UnixServer {
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
