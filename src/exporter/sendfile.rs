//! The metrics server's connections: TCP streams that send the published body from its
//! memory file with `sendfile(2)` instead of copying it from user memory.
//!
//! hyper stays in charge of HTTP; only the last step changes. hyper writes a response as a
//! list of slices (head, then body). When one of those slices lies inside the body published
//! now ([`Body::locate`]), the slices before it go out with `MSG_MORE` (so the head rides in
//! the body's first segment) and the slice itself is sent from the sealed file at the same
//! offset: the same bytes, without the per-scrape copy into the socket. Anything else (an
//! older body still being sent after a new render, other routes, the probe answers) is
//! written as usual.
//!
//! A short write is reported as such and hyper writes the rest, so partial sends behave as
//! for any socket.

use std::io::{self, IoSlice};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use nix::sys::sendfile::sendfile;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

use super::body::FileSpan;
use super::server::Shared;

/// One accepted connection.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    shared: Shared,
}

impl Connection {
    /// Wraps an accepted stream; `shared` is where the current body is published.
    pub fn new(stream: TcpStream, shared: Shared) -> Self {
        Connection { stream, shared }
    }

    /// The first slice that is part of the current body, with its place in the body's file.
    fn find_body(&self, slices: &[IoSlice<'_>]) -> Option<(usize, FileSpan)> {
        // Out of the lock: the first scrape of a body writes its file, and the renderer must
        // not wait for that to publish the next one.
        let body = self.shared.borrow().body.clone();
        slices
            .iter()
            .enumerate()
            .find_map(|(i, slice)| body.locate(slice).map(|span| (i, span)))
    }
}

/// Sends `head` (with `MSG_MORE`), then `len` bytes of the file from `span`. Returns the bytes
/// sent; a short count when the socket filled up part way.
fn send_from_file(
    stream: &TcpStream,
    head: &[IoSlice<'_>],
    span: &FileSpan,
    len: usize,
) -> io::Result<usize> {
    let mut sent = 0;
    let head_len: usize = head.iter().map(|s| s.len()).sum();
    if head_len > 0 {
        sent = socket2::SockRef::from(stream)
            .send_vectored_with_flags(head, nix::libc::MSG_MORE | nix::libc::MSG_NOSIGNAL)?;
        if sent < head_len {
            return Ok(sent);
        }
    }
    // sendfile has no MSG_NOSIGNAL; a peer that went away is EPIPE all the same, since Rust's
    // runtime starts every program with SIGPIPE ignored.
    let mut offset = i64::try_from(span.offset).map_err(io::Error::other)?;
    match sendfile(stream.as_fd(), span.file.as_fd(), Some(&mut offset), len) {
        Ok(0) if sent == 0 => Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "metrics body file is shorter than the body",
        )),
        Ok(n) => Ok(sent + n),
        // The head is out: report it, and let the next call meet the error (or the space).
        Err(_) if sent > 0 => Ok(sent),
        Err(errno) => Err(errno.into()),
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        slices: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let Some((at, span)) = self.find_body(slices) else {
            return Pin::new(&mut self.stream).poll_write_vectored(cx, slices);
        };
        let (head, body) = (&slices[..at], &slices[at]);
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            // A full socket clears the readiness, and the next poll waits for space.
            match self.stream.try_io(Interest::WRITABLE, || {
                send_from_file(&self.stream, head, &span, body.len())
            }) {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
                done => return Poll::Ready(done),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        // hyper then hands over the head and the body as separate slices, which is what lets
        // the body be recognised, instead of copying both into one buffer.
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::sync::Arc;

    use axum::body::Bytes;
    use tokio::sync::watch;

    use super::*;
    use crate::exporter::body::Body;
    use crate::exporter::server::Published;

    fn publish(shared: &Shared, body: Body) {
        shared.send_replace(Published {
            body,
            ready: true,
            nvml_up: true,
        });
    }

    /// A body big enough to fill any socket, with no two neighbouring KiB alike.
    fn big_body(len: usize, seed: u8) -> Bytes {
        (0..len)
            .map(|i| (i / 1024) as u8 ^ (i as u8).wrapping_mul(31) ^ seed)
            .collect::<Vec<u8>>()
            .into()
    }

    /// An accepted connection whose socket holds little (so sends come up short and would
    /// block), and a client that reads `len` bytes slowly on its own thread.
    async fn connection(
        shared: &Shared,
        len: usize,
    ) -> (Connection, std::thread::JoinHandle<Vec<u8>>) {
        let inner = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = inner.local_addr().unwrap();
        let reader = std::thread::spawn(move || {
            let mut client = std::net::TcpStream::connect(address).unwrap();
            socket2::SockRef::from(&client)
                .set_recv_buffer_size(8 * 1024)
                .unwrap();
            let mut got = vec![0; len];
            let mut at = 0;
            while at < len {
                let n = client
                    .read(&mut got[at..(at + 16 * 1024).min(len)])
                    .unwrap();
                assert!(n > 0, "connection closed after {at} bytes");
                at += n;
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            got
        });
        let (stream, _) = inner.accept().await.unwrap();
        let connection = Connection::new(stream, Arc::clone(shared));
        socket2::SockRef::from(&connection.stream)
            .set_send_buffer_size(8 * 1024)
            .unwrap();
        (connection, reader)
    }

    /// Writes `head` then `body` as hyper does (both slices at once, again from wherever a
    /// short write stopped); `midway` runs once, after the first write. Returns the writes.
    async fn respond(
        connection: &mut Connection,
        head: &[u8],
        body: &[u8],
        mut midway: impl FnMut(),
    ) -> usize {
        let (mut head, mut body) = (head, body);
        let mut writes = 0;
        while !head.is_empty() || !body.is_empty() {
            let slices = [IoSlice::new(head), IoSlice::new(body)];
            let n = std::future::poll_fn(|cx| {
                Pin::new(&mut *connection).poll_write_vectored(cx, &slices)
            })
            .await
            .unwrap();
            assert!(n > 0);
            let from_head = n.min(head.len());
            head = &head[from_head..];
            body = &body[n - from_head..];
            writes += 1;
            if writes == 1 {
                midway();
            }
        }
        writes
    }

    #[tokio::test]
    async fn the_published_body_is_sent_from_its_file_exactly() {
        let shared: Shared = Arc::new(watch::Sender::new(Published::default()));
        let bytes = big_body(256 << 10, 0);
        publish(&shared, Body::new(bytes.clone()));
        let head = b"HTTP/1.1 200 OK\r\ncontent-length: 262144\r\n\r\n";
        let (mut connection, reader) = connection(&shared, head.len() + bytes.len()).await;
        let slices = [IoSlice::new(head), IoSlice::new(&bytes[10..])];
        assert_eq!(
            connection.find_body(&slices).map(|(i, s)| (i, s.offset)),
            Some((1, 10))
        );
        let writes = respond(&mut connection, head, &bytes, || {}).await;
        let got = reader.join().unwrap();
        assert!(writes > 1, "the small socket made sends come up short");
        assert_eq!(&got[..head.len()], head);
        assert!(got[head.len()..] == bytes[..], "body bytes differ");
    }

    #[tokio::test]
    async fn a_body_replaced_while_it_is_sent_goes_out_unchanged() {
        let shared: Shared = Arc::new(watch::Sender::new(Published::default()));
        let old = big_body(256 << 10, 1);
        publish(&shared, Body::new(old.clone()));
        let head = b"HTTP/1.1 200 OK\r\n\r\n";
        let (mut connection, reader) = connection(&shared, head.len() + old.len()).await;
        // The next render lands after the first write: the rest of the old body is copied.
        respond(&mut connection, head, &old, || {
            publish(&shared, Body::new(big_body(256 << 10, 2)));
        })
        .await;
        let got = reader.join().unwrap();
        assert_eq!(&got[..head.len()], head);
        assert!(got[head.len()..] == old[..], "body bytes differ");
    }

    #[tokio::test]
    async fn other_bytes_are_written_as_they_are() {
        let shared: Shared = Arc::new(watch::Sender::new(Published::default()));
        publish(&shared, Body::new(big_body(1024, 3)));
        // Equal content, other memory: not the published body.
        let copy = shared.borrow().body.bytes().to_vec();
        let (mut connection, reader) = connection(&shared, 5 + copy.len()).await;
        assert!(
            connection
                .find_body(&[IoSlice::new(b"head\n"), IoSlice::new(&copy)])
                .is_none()
        );
        respond(&mut connection, b"head\n", &copy, || {}).await;
        let got = reader.join().unwrap();
        assert_eq!(&got[..5], b"head\n");
        assert_eq!(got[5..], copy[..]);
    }
}
