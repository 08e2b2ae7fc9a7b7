//! One connection: hyper's HTTP/1.1 state machine over the socket, with the phase tracking
//! that drives its timeouts and the watchdog that closes it when a phase runs out, when the
//! table evicts it, or (gracefully) when the server stops.
//!
//! The phase moves at three points: bytes read on an idle connection start a request head
//! ([`Watched`]); hyper handing a request to the router makes it busy ([`Answer`]); the response
//! body being released by hyper, once its last frame is taken, makes it idle ([`Tracked`]).

use std::convert::Infallible;
use std::future::Future;
use std::io::{self, IoSlice};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use axum::Router;
use axum::body::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::Limits;
use super::activity::{Activity, Phase};
use super::mirror::Mirror;
use super::registry::Admitted;
use super::stats::Stats;

/// Largest request head accepted (hyper answers 431 beyond it): gpud's endpoints take a
/// request line and a few headers, and this bounds what each connection buffers.
const MAX_REQUEST_HEAD: usize = 16 * 1024;

/// How long a connection waiting for a request head still gets once the server stops: a
/// client that has just connected has its request on the way (in a takeover the kernel may
/// have queued it on the old process a moment before it stopped), and closing with its bytes
/// unread resets the connection under it. An idle keep-alive connection is closed at once.
const HEAD_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Serves `stream` until the client closes it, a phase times out, the table evicts it, or the
/// server stops (then the request in progress, if any, is answered first). Frees its place in
/// the table when it ends, after the socket is closed.
pub async fn serve(
    stream: TcpStream,
    router: Router,
    admitted: Admitted,
    limits: Limits,
    stats: Arc<Stats>,
    cancel: CancellationToken,
) {
    let activity = Arc::clone(&admitted.activity);
    let mirror = MirrorSlot::default();
    let io = TokioIo::new(Watched {
        stream,
        activity: Arc::clone(&activity),
        mirror: Arc::clone(&mirror),
    });
    let answer = Answer {
        router: TowerToHyperService::new(router),
        activity: Arc::clone(&activity),
        mirror,
    };
    let mut builder = http1::Builder::new();
    // The watchdog below times the head; hyper's own timer would also run between requests.
    builder
        .header_read_timeout(Option::<std::time::Duration>::None)
        .max_buf_size(MAX_REQUEST_HEAD);
    let conn = builder.serve_connection(io, answer);
    tokio::pin!(conn);
    let mut watchdog = Watchdog::new(Arc::clone(&activity), limits);
    let mut stopping = false;
    // Set while a connection waiting for its head gets [`HEAD_GRACE`] before it is closed.
    let mut close_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            // The connection first: it moves the phase, which the watchdog then reads.
            biased;
            ended = conn.as_mut() => {
                if let Err(err) = ended {
                    debug!(error = %crate::logging::error_chain(&err), "HTTP connection ended with an error");
                }
                return;
            }
            phase = std::future::poll_fn(|cx| watchdog.poll_expired(cx)) => {
                stats.timed_out(phase);
                return;
            }
            () = activity.evicted() => return,
            () = cancel.cancelled(), if !stopping => {
                stopping = true;
                if activity.phase().0 == Phase::Head {
                    close_at = Some(tokio::time::Instant::now() + HEAD_GRACE);
                } else {
                    // Closes an idle connection now, a busy one once its answer is written.
                    conn.as_mut().graceful_shutdown();
                }
            }
            () = tokio::time::sleep_until(close_at.unwrap_or_else(tokio::time::Instant::now)), if close_at.is_some() => {
                close_at = None;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The [`Mirror`] of the last response's body, if it has one: set by [`Answer`], read by
/// [`Watched`] to send those bytes from its file.
type MirrorSlot = Arc<Mutex<Option<Mirror>>>;

/// The socket, noting when bytes arrive, and sending a mirrored body from its file.
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
    mirror: MirrorSlot,
}

impl Watched {
    /// The mirror holding one of `bufs`, and where.
    fn mirrored(&self, bufs: &[IoSlice<'_>]) -> Option<(Mirror, (usize, u64))> {
        let slot = self.mirror.lock().ok()?;
        let mirror = slot.as_ref()?;
        let found = mirror.locate(bufs)?;
        Some((mirror.clone(), found))
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.stream).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            self.activity.bytes_read();
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let Some((mirror, found)) = self.mirrored(bufs) else {
            return Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        };
        // tokio's readiness protocol: wait until writable, try, and on WouldBlock (which
        // clears the readiness) wait again.
        let stream = &self.stream;
        loop {
            ready!(stream.poll_write_ready(cx))?;
            match stream.try_io(Interest::WRITABLE, || {
                mirror.send(stream.as_fd(), bufs, found)
            }) {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                done => return Poll::Ready(done),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        // hyper then queues the response head and the body's bytes as they are and writes them
        // with one writev, instead of copying the body into its own buffer first.
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The router as hyper's service: the connection is busy from the request until hyper releases
/// the response body.
#[derive(Clone)]
struct Answer {
    router: TowerToHyperService<Router>,
    activity: Arc<Activity>,
    mirror: MirrorSlot,
}

type Answering = Pin<Box<dyn Future<Output = Result<Response<Tracked>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for Answer {
    type Response = Response<Tracked>;
    type Error = Infallible;
    type Future = Answering;

    fn call(&self, request: Request<Incoming>) -> Answering {
        self.activity.enter(Phase::Busy);
        let done = IdleWhenDropped(Arc::clone(&self.activity));
        let answer = hyper::service::Service::call(&self.router, request);
        let slot = Arc::clone(&self.mirror);
        Box::pin(async move {
            let mut response = answer.await?;
            // Any bytes of an earlier body hyper still holds stay correct either way: they are
            // sent from their file only while their mirror is the one set.
            let mirror = response.extensions_mut().remove::<Mirror>();
            if let Ok(mut slot) = slot.lock() {
                *slot = mirror;
            }
            Ok(response.map(|inner| Tracked { inner, _done: done }))
        })
    }
}

/// Makes the connection idle when dropped.
struct IdleWhenDropped(Arc<Activity>);

impl Drop for IdleWhenDropped {
    fn drop(&mut self) {
        self.0.enter(Phase::Idle);
    }
}

/// A response body that makes its connection idle when hyper releases it: right after its last
/// frame was taken (hyper may still be writing it), or when the connection goes away.
struct Tracked {
    inner: axum::body::Body,
    _done: IdleWhenDropped,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        // An exact size becomes the Content-Length.
        self.inner.size_hint()
    }
}

/// Fires when the connection's current phase has lasted longer than its limit.
struct Watchdog {
    activity: Arc<Activity>,
    limits: Limits,
    sleep: Pin<Box<Sleep>>,
    armed: Option<tokio::time::Instant>,
}

impl Watchdog {
    fn new(activity: Arc<Activity>, limits: Limits) -> Self {
        Watchdog {
            activity,
            limits,
            sleep: Box::pin(tokio::time::sleep(limits.idle_timeout)),
            armed: None,
        }
    }

    /// Ready with the phase that ran out. Polled after the connection in the same task, so a
    /// phase change made while the connection was polled is seen here before the task sleeps.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<Phase> {
        let Some((deadline, phase)) = self.activity.deadline(&self.limits) else {
            self.armed = None;
            return Poll::Pending;
        };
        if self.armed != Some(deadline) {
            self.sleep.as_mut().reset(deadline);
            self.armed = Some(deadline);
        }
        ready!(self.sleep.as_mut().poll(cx));
        Poll::Ready(phase)
    }
}
