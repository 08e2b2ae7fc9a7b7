//! A response body that also lives in a memory file, so that its bytes go to the socket with
//! `sendfile(2)` instead of being copied out of the process on every request.
//!
//! Written with `writev`, every answer copies the whole body from gpud's memory into the
//! socket's buffers: for a 224 KiB exposition, most of a scrape's CPU. `sendfile` from a file
//! hands the kernel the file's pages instead, as a static file server does. Making the file
//! costs one copy of the body, so a body gets one only when it is served a second time
//! ([`Mirrored::serve`]): a body scraped once per render (what a node's exporter usually sees)
//! costs what it did, one scraped flat out costs no copy after its second answer. The handler
//! attaches the [`Mirror`] to its response (an extension) beside the same [`Bytes`]; the
//! connection ([`super::connection`]) recognises those bytes among what hyper asks it to write,
//! by address, and sends them from the file. The file is sealed and never written again (a new
//! body gets a new file), so pages the kernel still holds are the bytes that were meant.
//!
//! Where a memfd cannot be made (an old kernel, a seccomp profile), [`Mirror::of`] gives
//! `None` and the body is written as before.

use std::io::{self, IoSlice, Write};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use axum::body::Bytes;
use rustix::fs::{MemfdFlags, SealFlags};

/// A body to serve, which gets its [`Mirror`] when it is served a second time.
#[derive(Debug, Default)]
pub struct Mirrored {
    bytes: Bytes,
    served: AtomicBool,
    mirror: OnceLock<Option<Mirror>>,
}

impl Mirrored {
    /// `bytes`, not mirrored yet.
    pub fn new(bytes: Bytes) -> Self {
        Mirrored {
            bytes,
            served: AtomicBool::new(false),
            mirror: OnceLock::new(),
        }
    }

    /// The body.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The body for one more answer, and its mirror from the second answer on (made then, by
    /// the answer that finds none; concurrent answers wait for it).
    pub fn serve(&self) -> (Bytes, Option<Mirror>) {
        let mirror = if self.served.swap(true, Ordering::Relaxed) {
            self.mirror.get_or_init(|| Mirror::of(&self.bytes)).clone()
        } else {
            None
        };
        (self.bytes.clone(), mirror)
    }
}

/// A body and a sealed memory file holding the same bytes.
#[derive(Debug, Clone)]
pub struct Mirror {
    bytes: Bytes,
    file: Arc<OwnedFd>,
}

impl Mirror {
    /// `bytes` copied into a new sealed memfd; `None` where that fails.
    pub fn of(bytes: &Bytes) -> Option<Mirror> {
        let fd =
            rustix::fs::memfd_create("gpud-body", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
                .ok()?;
        let mut file = std::fs::File::from(fd);
        file.write_all(bytes).ok()?;
        // Nothing may change the pages sendfile hands out, gpud included.
        let seals = SealFlags::SEAL | SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE;
        rustix::fs::fcntl_add_seals(&file, seals).ok()?;
        Some(Mirror {
            bytes: bytes.clone(),
            file: Arc::new(OwnedFd::from(file)),
        })
    }

    /// Where `slice` starts in the file, when it is a part of the mirrored bytes (compared by
    /// address: hyper hands back the very bytes the handler returned).
    fn offset_of(&self, slice: &[u8]) -> Option<u64> {
        let base = self.bytes.as_ptr() as usize;
        let start = slice.as_ptr() as usize;
        let end = start.checked_add(slice.len())?;
        (start >= base && end <= base + self.bytes.len() && !slice.is_empty())
            .then(|| (start - base) as u64)
    }

    /// The first of `bufs` that is mirrored, and where it starts in the file.
    pub fn locate(&self, bufs: &[IoSlice<'_>]) -> Option<(usize, u64)> {
        bufs.iter()
            .enumerate()
            .find_map(|(i, b)| self.offset_of(b).map(|o| (i, o)))
    }

    /// Writes `bufs` to `socket` (non-blocking) as [`Mirror::locate`] found them (`at`,
    /// `offset`): the slices before `at` with `sendmsg`, held back (`MSG_MORE`) to leave in the
    /// same segment as the body, then slice `at` from the file. Like a `writev`, may write less
    /// than asked; `WouldBlock` only when nothing was written.
    pub fn send(
        &self,
        socket: BorrowedFd<'_>,
        bufs: &[IoSlice<'_>],
        (at, offset): (usize, u64),
    ) -> io::Result<usize> {
        let (before, body) = (&bufs[..at], &bufs[at]);
        self.send_parts(socket, before, body, offset)
    }

    fn send_parts(
        &self,
        socket: BorrowedFd<'_>,
        before: &[IoSlice<'_>],
        body: &[u8],
        mut offset: u64,
    ) -> io::Result<usize> {
        let head: usize = before.iter().map(|b| b.len()).sum();
        let mut written = 0;
        if head > 0 {
            let flags = rustix::net::SendFlags::MORE | rustix::net::SendFlags::NOSIGNAL;
            let mut control = rustix::net::SendAncillaryBuffer::default();
            written = rustix::net::sendmsg(socket, before, &mut control, flags)?;
            if written < head {
                return Ok(written);
            }
        }
        match rustix::fs::sendfile(socket, &*self.file, Some(&mut offset), body.len()) {
            Ok(sent) => Ok(written + sent),
            Err(err) if written > 0 && err == rustix::io::Errno::AGAIN => Ok(written),
            Err(err) => Err(err.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsFd;

    #[test]
    fn a_body_is_mirrored_from_its_second_answer() {
        let body = Mirrored::new(Bytes::from_static(b"metrics"));
        let (first, mirror) = body.serve();
        assert_eq!((first.as_ref(), mirror.is_none()), (&b"metrics"[..], true));
        let (_, second) = body.serve();
        let (_, third) = body.serve();
        if let (Some(second), Some(third)) = (second, third) {
            assert!(Arc::ptr_eq(&second.file, &third.file), "made once");
            assert_eq!(second.bytes.as_ptr(), body.bytes().as_ptr());
        }
    }

    #[test]
    fn mirrored_bytes_are_sent_from_the_file_after_what_precedes_them() {
        let body = Bytes::from((0..200_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        let Some(mirror) = Mirror::of(&body) else {
            return; // no memfd here: the plain path serves
        };
        let (mut reader, writer) = std::os::unix::net::UnixStream::pair().unwrap();
        let reading = std::thread::spawn(move || {
            let mut all = Vec::new();
            reader.read_to_end(&mut all).unwrap();
            all
        });
        let head = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
        let other = b"not mirrored".to_vec();
        assert!(mirror.locate(&[IoSlice::new(&other)]).is_none());
        // From the middle of the body, as after a partial write.
        let mut from = 0;
        let mut first = true;
        while from < body.len() {
            let rest = &body[from..];
            let bufs = if first {
                vec![IoSlice::new(&head), IoSlice::new(rest)]
            } else {
                vec![IoSlice::new(rest)]
            };
            let found = mirror.locate(&bufs).unwrap();
            assert_eq!(found, (usize::from(first), from as u64));
            let n = mirror.send(writer.as_fd(), &bufs, found).unwrap();
            from += if first { n - head.len() } else { n };
            first = false;
        }
        drop(writer);
        let got = reading.join().unwrap();
        assert_eq!(&got[..head.len()], head);
        assert!(got[head.len()..] == body[..], "the body arrives as it is");
    }
}
