//! Where the metrics server's connections run: one acceptor hands them round-robin to
//! [`LOOPS`] threads, each a single-threaded event loop with its own runtime and its own epoll,
//! as a static file server's worker processes serve theirs.
//!
//! Why not the exporter's multi-threaded runtime: its workers poll the network only when they
//! run out of tasks. While one worker sends a body (tens of microseconds in the kernel for a MIG
//! node's few hundred KiB), a request that arrives on another connection waits for it even
//! though a second worker is parked, so scrapes were served one after the other. Two loops
//! that each watch their own connections serve two scrapes at once.
//!
//! Every loop runs axum's server (routes, keep-alive, graceful shutdown) over the connections
//! it is handed. One loop failing stops the others; the first error is returned.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::sendfile::Connection;
use super::server::{Shared, router};

/// Serving threads.
pub const LOOPS: usize = 2;

/// Connections accepted but not yet taken by a loop, per loop.
const HANDOFF_QUEUE: usize = 64;

/// Accepts on `listener` and serves every connection on one of the loops until `cancel` fires.
pub async fn serve(
    listener: TcpListener,
    shared: Shared,
    cancel: CancellationToken,
) -> io::Result<()> {
    let local = listener.local_addr()?;
    let mut handoffs = Vec::with_capacity(LOOPS);
    let mut finished = Vec::with_capacity(LOOPS);
    for n in 0..LOOPS {
        let (tx, rx) = mpsc::channel(HANDOFF_QUEUE);
        let (done_tx, done_rx) = oneshot::channel();
        let handoff = Handoff {
            rx,
            local,
            shared: Arc::clone(&shared),
        };
        let (cancel_loop, router) = (cancel.clone(), router(Arc::clone(&shared)));
        let started = std::thread::Builder::new()
            .name(format!("gpud-http-{n}"))
            .spawn(move || {
                let result = run_loop(handoff, router, cancel_loop.clone());
                if result.is_err() {
                    cancel_loop.cancel();
                }
                let _ = done_tx.send(result);
            });
        if let Err(err) = started {
            cancel.cancel();
            drop(handoffs);
            wait_all(finished).await?;
            return Err(err);
        }
        handoffs.push(tx);
        finished.push(done_rx);
    }
    accept(listener, &handoffs, &cancel).await;
    drop(handoffs);
    wait_all(finished).await
}

/// Hands accepted connections round-robin to the loops until `cancel` fires.
async fn accept(
    mut listener: TcpListener,
    handoffs: &[mpsc::Sender<(std::net::TcpStream, SocketAddr)>],
    cancel: &CancellationToken,
) {
    let mut next = 0;
    loop {
        let (stream, peer) = tokio::select! {
            () = cancel.cancelled() => return,
            // axum's accept loop: it retries and backs off on errors such as EMFILE.
            accepted = axum::serve::Listener::accept(&mut listener) => accepted,
        };
        // A body is written in one go: without Nagle its last segment is not held back
        // waiting for the peer's ACK.
        let _ = stream.set_nodelay(true);
        // Leaves this runtime's epoll; the loop registers it with its own.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(err) => {
                debug!(%peer, error = %err, "Dropping a connection that could not be handed over");
                continue;
            }
        };
        let Some(handoff) = handoffs.get(next % handoffs.len()) else {
            return;
        };
        next = next.wrapping_add(1);
        if handoff.send((stream, peer)).await.is_err() {
            return; // the loop stopped: the exporter is stopping
        }
    }
}

/// Waits for every loop to end; the first error wins.
async fn wait_all(finished: Vec<oneshot::Receiver<io::Result<()>>>) -> io::Result<()> {
    let mut first = Ok(());
    for done in finished {
        let result = done.await.unwrap_or_else(|_| {
            Err(io::Error::other(
                "a metrics serving thread ended without a result",
            ))
        });
        if first.is_ok() {
            first = result;
        }
    }
    first
}

/// One loop: a current-thread runtime running axum's server over the handed connections.
fn run_loop(handoff: Handoff, router: axum::Router, cancel: CancellationToken) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        axum::serve(handoff, router)
            .with_graceful_shutdown(cancel.cancelled_owned())
            .await
    })
}

/// The connections one loop is handed, as an axum listener.
struct Handoff {
    rx: mpsc::Receiver<(std::net::TcpStream, SocketAddr)>,
    local: SocketAddr,
    shared: Shared,
}

impl axum::serve::Listener for Handoff {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Some((stream, peer)) = self.rx.recv().await else {
                // The acceptor stopped: shutdown is under way and ends the server.
                return std::future::pending().await;
            };
            match TcpStream::from_std(stream) {
                Ok(stream) => return (Connection::new(stream, Arc::clone(&self.shared)), peer),
                Err(err) => {
                    debug!(%peer, error = %err, "Dropping a connection this loop cannot watch")
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::time::Duration;

    use axum::body::Bytes;
    use tokio::sync::watch;

    use super::*;
    use crate::exporter::body::Body;
    use crate::exporter::server::Published;

    /// One keep-alive `GET /metrics` on `stream`: the body.
    fn get(stream: &mut BufReader<std::net::TcpStream>) -> Vec<u8> {
        stream
            .get_mut()
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
            .unwrap();
        let mut length = 0;
        loop {
            let mut line = String::new();
            stream.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        stream.read_exact(&mut body).unwrap();
        body
    }

    fn serving_threads() -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .map(|name| name.trim().to_owned())
            .filter(|name| name.starts_with("gpud-http-"))
            .collect();
        names.sort();
        names
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_are_served_by_the_loops_until_cancelled() {
        let shared: Shared = Arc::new(watch::Sender::new(Published::default()));
        let bytes = Bytes::from((0..100_000).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        shared.send_replace(Published {
            body: Body::new(bytes.clone()),
            ready: true,
            nvml_up: true,
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let cancel = CancellationToken::new();
        let server = tokio::spawn(serve(listener, Arc::clone(&shared), cancel.clone()));

        let clients = tokio::task::spawn_blocking(move || {
            // More connections than loops, each used twice (keep-alive), all left open.
            let mut open = Vec::new();
            for _ in 0..2 * LOOPS + 1 {
                let mut stream = BufReader::new(std::net::TcpStream::connect(address).unwrap());
                for _ in 0..2 {
                    assert!(get(&mut stream) == bytes[..]);
                }
                open.push(stream);
            }
            open
        })
        .await
        .unwrap();
        assert_eq!(serving_threads(), ["gpud-http-0", "gpud-http-1"]);

        // Idle keep-alive connections do not hold the shutdown up.
        cancel.cancel();
        let served = tokio::time::timeout(Duration::from_secs(5), server).await;
        assert!(matches!(served, Ok(Ok(Ok(())))), "{served:?}");
        // The threads have handed in their result; they are gone a moment later.
        for _ in 0..100 {
            if serving_threads().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(serving_threads(), Vec::<String>::new());
        drop(clients);
    }
}
