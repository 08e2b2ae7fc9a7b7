//! The accept loop: admits connections into the table, serves each on its own task, survives
//! running out of descriptors, and drains on cancellation.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, warn};

use super::registry::Table;
use super::stats::Stats;
use super::{Limits, connection, fd_limit};

/// How long connections get, once cancelled, to finish the answers they are writing.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

/// Pause after the process ran out of descriptors, once an idle connection was asked to close.
const FD_EXHAUSTED_PAUSE: Duration = Duration::from_millis(10);

/// Pause after any other accept failure (memory, or a failure not expected at all).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// How often an accept failure that repeats is logged.
const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(60);

/// Serves `router` on `listener` within `limits` until `cancel` fires, counting in `stats`.
/// Returns once every connection has closed, [`DRAIN_TIMEOUT`] at most after `cancel`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stats: Arc<Stats>,
    cancel: CancellationToken,
) -> io::Result<()> {
    let cap = fd_limit::connection_cap(limits.max_connections, fd_limit::soft_limit());
    let table = Table::new(cap, Arc::clone(&stats));
    let mut connections = JoinSet::new();
    let mut last_warned: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        // Reap the tasks of closed connections.
        while connections.try_join_next().is_some() {}
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                accept_failed(&table, &err, &mut last_warned).await;
                continue;
            }
        };
        let Some(admitted) = table.admit() else {
            // Closed at once: every open connection is answering a request.
            continue;
        };
        let made_room = admitted.made_room;
        // A body goes out in one write: without Nagle its last segment is not held back
        // waiting for the peer's acknowledgement.
        let _ = stream.set_nodelay(true);
        connections.spawn(
            connection::serve(
                stream,
                router.clone(),
                admitted,
                limits,
                Arc::clone(&stats),
                cancel.clone(),
            )
            .in_current_span(),
        );
        if made_room {
            // Let the evicted connection's task run and close its socket before accepting more.
            tokio::task::yield_now().await;
        }
    }
    // No new connections from here on.
    drop(listener);
    let all_closed = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN_TIMEOUT, all_closed)
        .await
        .is_err()
    {
        warn!(
            connections = connections.len(),
            "Closing HTTP connections still open {DRAIN_TIMEOUT:?} after the stop"
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// After a failed accept: connection-level failures are the client's and are skipped; out of
/// descriptors, an idle connection is closed to make room; anything else pauses the loop.
async fn accept_failed(table: &Table, err: &io::Error, last_warned: &mut Option<Instant>) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        err.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        debug!(error = %crate::logging::error_chain(&err), "A connection closed before it was accepted");
        return;
    }
    let out_of_fds = matches!(
        err.raw_os_error(),
        Some(nix::libc::EMFILE | nix::libc::ENFILE)
    );
    if last_warned.is_none_or(|at| at.elapsed() >= ACCEPT_WARN_EVERY) {
        *last_warned = Some(Instant::now());
        if out_of_fds {
            warn!(error = %crate::logging::error_chain(&err), "Out of file descriptors: closing the longest idle HTTP connection to accept new ones");
        } else {
            warn!(error = %crate::logging::error_chain(&err), "Cannot accept HTTP connections; retrying");
        }
    }
    if out_of_fds && table.evict_oldest() {
        tokio::time::sleep(FD_EXHAUSTED_PAUSE).await;
    } else {
        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::sync::Notify;
    use tokio::task::JoinHandle;

    use super::*;
    use crate::http::StatsSnapshot;

    struct Running {
        address: SocketAddr,
        stats: Arc<Stats>,
        cancel: CancellationToken,
        server: JoinHandle<io::Result<()>>,
    }

    async fn start(router: Router, limits: Limits) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let stats = Arc::new(Stats::default());
        let cancel = CancellationToken::new();
        let server = crate::logging::spawn(serve(
            listener,
            router,
            limits,
            Arc::clone(&stats),
            cancel.clone(),
        ));
        Running {
            address,
            stats,
            cancel,
            server,
        }
    }

    fn limits(header_ms: u64, idle_ms: u64, max_connections: usize) -> Limits {
        Limits {
            header_read_timeout: Duration::from_millis(header_ms),
            idle_timeout: Duration::from_millis(idle_ms),
            max_connections,
        }
    }

    fn body_router(len: usize) -> Router {
        let body = axum::body::Bytes::from(vec![b'x'; len]);
        Router::new().route(
            "/",
            get(move || {
                let body = body.clone();
                async move { body }
            }),
        )
    }

    /// `/` answers three bytes; `/slow` answers `done` once `release` is notified.
    fn slow_router(release: &Arc<Notify>) -> Router {
        let release = Arc::clone(release);
        body_router(3).route(
            "/slow",
            get(move || {
                let release = Arc::clone(&release);
                async move {
                    release.notified().await;
                    "done"
                }
            }),
        )
    }

    /// One keep-alive `GET path` on `stream`: status and body.
    async fn request(stream: &mut TcpStream, path: &str) -> (u16, Vec<u8>) {
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(stream.read_u8().await.unwrap());
        }
        let head = String::from_utf8(head).unwrap();
        let status = head[9..12].parse().unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.unwrap();
        (status, body)
    }

    /// How long after `from` the server closed `stream` (EOF or reset), failing after `limit`.
    async fn closed_after(stream: &mut TcpStream, from: Instant, limit: Duration) -> Duration {
        let mut buf = [0; 64];
        let read = tokio::time::timeout_at(from + limit, async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        });
        read.await.expect("the server did not close the connection");
        from.elapsed()
    }

    async fn wait_for(stats: &Stats, done: impl Fn(&StatsSnapshot) -> bool) -> StatsSnapshot {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let snapshot = stats.snapshot();
            if done(&snapshot) {
                return snapshot;
            }
            assert!(Instant::now() < deadline, "stats stayed {snapshot:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_silent_or_trickling_client_is_closed_at_the_header_timeout() {
        let server = start(body_router(10), limits(300, 5_000, 16)).await;
        let accepted = Instant::now();
        let mut silent = TcpStream::connect(server.address).await.unwrap();
        let mut trickling = TcpStream::connect(server.address).await.unwrap();
        let trickle = crate::logging::spawn(async move {
            for byte in b"GET / HTTP/1.1\r\nHost: t\r\n".iter().cycle().take(40) {
                if trickling.write_all(&[*byte]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            trickling
        });
        let silent_after = closed_after(&mut silent, accepted, Duration::from_secs(3)).await;
        let mut trickling = trickle.await.unwrap();
        let trickling_after = closed_after(&mut trickling, accepted, Duration::from_secs(3)).await;
        for after in [silent_after, trickling_after] {
            assert!(
                after >= Duration::from_millis(280) && after < Duration::from_millis(1500),
                "{after:?}"
            );
        }
        let stats = wait_for(&server.stats, |s| s.open == 0).await;
        assert_eq!((stats.header_timeouts, stats.idle_timeouts), (2, 0));
    }

    #[tokio::test]
    async fn a_keep_alive_connection_waits_the_idle_timeout_not_the_header_one() {
        let server = start(body_router(10), limits(200, 700, 16)).await;
        let mut stream = TcpStream::connect(server.address).await.unwrap();
        for _ in 0..2 {
            assert_eq!(request(&mut stream, "/").await, (200, vec![b'x'; 10]));
        }
        let answered = Instant::now();
        let after = closed_after(&mut stream, answered, Duration::from_secs(3)).await;
        assert!(
            after >= Duration::from_millis(650) && after < Duration::from_millis(2000),
            "{after:?}"
        );
        let stats = wait_for(&server.stats, |s| s.open == 0).await;
        assert_eq!((stats.header_timeouts, stats.idle_timeouts), (0, 1));
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_is_closed_at_the_idle_timeout() {
        // 32 MiB does not fit the socket buffers: the write stalls on the client.
        let server = start(body_router(32 << 20), limits(200, 500, 16)).await;
        let mut stream = TcpStream::connect(server.address).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        wait_for(&server.stats, |s| s.idle_timeouts == 1).await;
        let stats = wait_for(&server.stats, |s| s.open == 0).await;
        assert_eq!(stats.header_timeouts, 0);
    }

    #[tokio::test]
    async fn at_the_cap_the_longest_idle_connection_makes_room_and_busy_ones_do_not() {
        let release = Arc::new(Notify::new());
        let router = slow_router(&release);
        let server = start(router, limits(5_000, 5_000, 2)).await;
        let mut first = TcpStream::connect(server.address).await.unwrap();
        assert_eq!(request(&mut first, "/").await.0, 200);
        let mut second = TcpStream::connect(server.address).await.unwrap();
        second
            .write_all(b"GET /slow HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        wait_for(&server.stats, |s| s.open == 2).await;
        tokio::time::sleep(Duration::from_millis(50)).await; // the slow request is in the handler

        // The cap is full: the idle first connection is closed for the third.
        let mut third = TcpStream::connect(server.address).await.unwrap();
        assert_eq!(request(&mut third, "/").await, (200, b"xxx".to_vec()));
        closed_after(&mut first, Instant::now(), Duration::from_secs(2)).await;

        // Third is idle again: the next one evicts it, never the busy second.
        let mut fourth = TcpStream::connect(server.address).await.unwrap();
        assert_eq!(request(&mut fourth, "/").await.0, 200);
        closed_after(&mut third, Instant::now(), Duration::from_secs(2)).await;

        // Both busy: a new connection is closed at once.
        fourth
            .write_all(b"GET /slow HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut fifth = TcpStream::connect(server.address).await.unwrap();
        closed_after(&mut fifth, Instant::now(), Duration::from_secs(2)).await;
        release.notify_waiters();
        let mut answer = String::new();
        second.read_to_string(&mut answer).await.ok();
        let stats = wait_for(&server.stats, |s| s.refused == 1).await;
        assert_eq!((stats.evicted, stats.max), (2, 2));
        assert!(answer.ends_with("done"), "{answer:?}");
    }

    /// A body served from its memory-file mirror (from its second answer on) arrives whole and
    /// unchanged, however the socket splits it, and the connection keeps serving after it.
    #[tokio::test]
    async fn a_mirrored_body_arrives_whole_through_partial_writes() {
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        let body = Arc::new(crate::http::mirror::Mirrored::new(bytes.clone().into()));
        let router = body_router(3).route(
            "/big",
            get(move || {
                let (body, mirror) = body.serve();
                async move { (mirror.map(axum::Extension), body) }
            }),
        );
        let server = start(router, limits(5_000, 5_000, 16)).await;
        let mut stream = TcpStream::connect(server.address).await.unwrap();
        for _ in 0..3 {
            let (status, got) = request(&mut stream, "/big").await;
            assert_eq!(status, 200);
            assert!(got == bytes, "{} bytes, not the body", got.len());
            assert_eq!(request(&mut stream, "/").await, (200, b"xxx".to_vec()));
        }
    }

    /// A connection accepted just before the stop whose request arrives just after it is
    /// answered, not reset: in a takeover the kernel may queue a scrape on the old process a
    /// moment before it stops.
    #[tokio::test]
    async fn a_request_arriving_on_a_fresh_connection_as_the_server_stops_is_answered() {
        let release = Arc::new(Notify::new());
        let server = start(slow_router(&release), limits(5_000, 5_000, 16)).await;
        let mut fresh = TcpStream::connect(server.address).await.unwrap();
        wait_for(&server.stats, |s| s.open == 1).await;
        server.cancel.cancel();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (status, _) = request(&mut fresh, "/").await;
        assert_eq!(status, 200);
        let served = tokio::time::timeout(Duration::from_secs(2), server.server).await;
        assert!(matches!(served, Ok(Ok(Ok(())))), "{served:?}");
    }

    #[tokio::test]
    async fn cancelling_finishes_the_answer_in_progress_and_closes_the_rest() {
        let release = Arc::new(Notify::new());
        let router = slow_router(&release);
        let server = start(router, limits(5_000, 5_000, 16)).await;
        let mut idle = TcpStream::connect(server.address).await.unwrap();
        assert_eq!(request(&mut idle, "/").await.0, 200);
        let mut busy = TcpStream::connect(server.address).await.unwrap();
        busy.write_all(b"GET /slow HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        wait_for(&server.stats, |s| s.open == 2).await;
        tokio::time::sleep(Duration::from_millis(50)).await;

        server.cancel.cancel();
        closed_after(&mut idle, Instant::now(), Duration::from_secs(1)).await;
        let deadline = Instant::now() + Duration::from_secs(1);
        while TcpStream::connect(server.address).await.is_ok() {
            assert!(Instant::now() < deadline, "the listener is still open");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        release.notify_waiters();
        let mut answer = String::new();
        busy.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("done"), "{answer}");
        let served = tokio::time::timeout(Duration::from_secs(1), server.server).await;
        assert!(matches!(served, Ok(Ok(Ok(())))), "{served:?}");
        assert_eq!(server.stats.snapshot().open, 0);
    }
}
