//! The accepted connection as tonic reads it: client bytes pass through a [`Rewriter`] so h2
//! accepts any `:authority`; server bytes are written untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::Stream;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::Connected;
use tracing::warn;

use super::rewrite::Rewriter;

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 8 * 1024;

/// A connection whose incoming HTTP/2 header blocks get their `:authority` fixed.
#[derive(Debug)]
pub struct AuthorityFix<S> {
    inner: S,
    rewriter: Rewriter,
    /// Bytes just read from `inner`.
    input: Box<[u8]>,
    /// Rewritten bytes not yet handed to the reader, from `sent` on.
    output: Vec<u8>,
    sent: usize,
    /// Set when the input was refused; every later read fails the same way.
    failed: Option<String>,
}

impl<S> AuthorityFix<S> {
    /// Wraps a freshly accepted connection (nothing read from it yet).
    pub fn new(inner: S) -> AuthorityFix<S> {
        AuthorityFix {
            inner,
            rewriter: Rewriter::new(),
            input: vec![0; READ_CHUNK].into_boxed_slice(),
            output: Vec::new(),
            sent: 0,
            failed: None,
        }
    }
}

/// The connections accepted on `listener`, wrapped: what tonic's `serve_with_incoming*` takes.
pub fn incoming(
    listener: UnixListener,
) -> impl Stream<Item = io::Result<AuthorityFix<UnixStream>>> + Send + 'static {
    UnixListenerStream::new(listener).map(|accepted| accepted.map(AuthorityFix::new))
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if this.sent < this.output.len() {
                let n = (this.output.len() - this.sent).min(buf.remaining());
                buf.put_slice(&this.output[this.sent..this.sent + n]);
                this.sent += n;
                if this.sent == this.output.len() {
                    this.output.clear();
                    this.sent = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if let Some(reason) = &this.failed {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    reason.clone(),
                )));
            }
            let mut read = ReadBuf::new(&mut this.input);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let received = read.filled();
            if received.is_empty() {
                // End of input; h2 judges a frame cut short.
                return Poll::Ready(Ok(()));
            }
            if let Err(err) = this.rewriter.push(received, &mut this.output) {
                warn!(error = %crate::logging::error_chain(&err), "Closing a gRPC connection: the client sent malformed HTTP/2");
                this.failed = Some(err.to_string());
                this.output.clear();
                this.sent = 0;
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for AuthorityFix<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::super::rewrite::PREFACE;
    use super::*;

    #[tokio::test]
    async fn passes_bytes_through_and_fails_on_malformed_input() {
        let (client, server) = tokio::io::duplex(64);
        let mut fixed = AuthorityFix::new(server);
        let mut client = client;
        // Preface and a PING, written in two pieces, come out unchanged.
        let mut sent = PREFACE.to_vec();
        sent.extend([0, 0, 8, 0x6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        let writer = async {
            client.write_all(&sent[..10]).await.unwrap();
            client.write_all(&sent[10..]).await.unwrap();
            client
        };
        let reader = async {
            let mut got = vec![0; sent.len()];
            fixed.read_exact(&mut got).await.unwrap();
            got
        };
        let (mut client, got) = tokio::join!(writer, reader);
        assert_eq!(got, sent);
        // Server bytes reach the client untouched.
        fixed.write_all(b"reply").await.unwrap();
        let mut reply = [0; 5];
        client.read_exact(&mut reply).await.unwrap();
        assert_eq!(&reply, b"reply");
        // A HEADERS frame with a bad HPACK index ends the connection.
        client
            .write_all(&[0, 0, 1, 0x1, 0x4, 0, 0, 0, 1, 0x80])
            .await
            .unwrap();
        let mut more = [0; 1];
        for _ in 0..2 {
            let err = fixed.read(&mut more).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData);
            assert_eq!(
                err.to_string(),
                "stream 1: HPACK index 0 is not in the tables (dynamic table holds 0 entries)"
            );
        }
    }
}
