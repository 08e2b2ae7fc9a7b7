//! The published exposition body, held as shared bytes (what the HTTP layer is handed and
//! what in-process readers see) and, once it is scraped, also as a sealed in-memory file with
//! the same content.
//!
//! The file is what makes a large scrape cheap. Writing a few hundred KiB from user memory
//! costs the kernel a copy into the socket on every scrape; from a file the connection layer
//! ([`super::sendfile`]) hands the kernel the file's pages instead, as a static file server
//! does. The file is sealed against writes, so the bytes in flight on any connection stay
//! exactly the bytes that were rendered, even after the next render replaces them.
//!
//! Writing the file costs about what one copy into a socket does, so it is made on the body's
//! first scrape, not at render time: a body rendered every second and scraped every 30 s is
//! written once, not 30 times. The file lives in memory (`memfd_create`): one more copy of the
//! body, outside the process' resident set. Where it cannot be made, one warning is logged and
//! scrapes copy.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use axum::body::Bytes;
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use tracing::warn;

/// One rendered body. Clones share the bytes and the file.
#[derive(Debug, Clone, Default)]
pub struct Body {
    bytes: Bytes,
    /// The sealed memory file holding exactly `bytes`, made on first use; `None` inside when
    /// it could not be made.
    file: Arc<OnceLock<Option<Arc<OwnedFd>>>>,
}

/// A span of the body found in its file.
#[derive(Debug, Clone)]
pub struct FileSpan {
    /// The sealed file.
    pub file: Arc<OwnedFd>,
    /// Where the span starts in it.
    pub offset: u64,
}

/// Whether a failure to make a body file was logged already (it is said once per process).
static FILE_WARNED: AtomicBool = AtomicBool::new(false);

impl Body {
    /// A body; its file is made when it is first located.
    pub fn new(bytes: Bytes) -> Self {
        Body {
            bytes,
            file: Arc::default(),
        }
    }

    /// The bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Where `slice` is in the file, when `slice` is a non-empty part of this body's own
    /// memory (not merely equal bytes elsewhere) and the file exists or can be made now.
    /// Holding `self` keeps that memory alive, so no other allocation can share its addresses.
    pub fn locate(&self, slice: &[u8]) -> Option<FileSpan> {
        let start = self.bytes.as_ptr() as usize;
        let end = start + self.bytes.len();
        let at = slice.as_ptr() as usize;
        if slice.is_empty() || at < start || at + slice.len() > end {
            return None;
        }
        let file = self.file.get_or_init(|| match sealed_file(&self.bytes) {
            Ok(file) => Some(Arc::new(file)),
            Err(err) => {
                if !FILE_WARNED.swap(true, Ordering::Relaxed) {
                    warn!(error = %err, "Scrapes copy the body instead of sending it from a file");
                }
                None
            }
        });
        Some(FileSpan {
            file: Arc::clone(file.as_ref()?),
            offset: (at - start) as u64,
        })
    }
}

/// A memory file holding `bytes`, sealed so that it can never change.
fn sealed_file(bytes: &[u8]) -> Result<OwnedFd, std::io::Error> {
    let step = |what: &str, err: std::io::Error| {
        std::io::Error::new(err.kind(), format!("metrics body file: {what}: {err}"))
    };
    let fd = memfd_create(
        c"gpud-metrics",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(|errno| step("memfd_create", errno.into()))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes).map_err(|err| step("write", err))?;
    let seals = SealFlag::F_SEAL_SHRINK
        | SealFlag::F_SEAL_GROW
        | SealFlag::F_SEAL_WRITE
        | SealFlag::F_SEAL_SEAL;
    fcntl(&file, FcntlArg::F_ADD_SEALS(seals))
        .map_err(|errno| step("F_ADD_SEALS", errno.into()))?;
    Ok(OwnedFd::from(file))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, SeekFrom};

    use super::*;

    fn read_file(span: &FileSpan, len: usize) -> Vec<u8> {
        let mut file = std::fs::File::from(span.file.try_clone().unwrap());
        file.seek(SeekFrom::Start(span.offset)).unwrap();
        let mut out = vec![0; len];
        file.read_exact(&mut out).unwrap();
        out
    }

    #[test]
    fn the_file_holds_the_same_bytes_at_the_same_offsets() {
        let body = Body::new(Bytes::from_static(b"# HELP a\na 1\nb 2\n"));
        assert!(body.file.get().is_none(), "no file before the first scrape");
        let whole = body.bytes().clone();
        let span = body.locate(&whole).unwrap();
        assert_eq!(span.offset, 0);
        assert_eq!(read_file(&span, whole.len()), whole.as_ref());
        let tail = &whole[9..];
        let span = body.locate(tail).unwrap();
        assert_eq!(span.offset, 9);
        assert_eq!(read_file(&span, tail.len()), b"a 1\nb 2\n");
    }

    #[test]
    fn only_its_own_memory_is_located() {
        let body = Body::new(Bytes::from(b"a 1\n".to_vec()));
        let copy = body.bytes().to_vec();
        assert!(body.locate(&copy).is_none(), "equal bytes elsewhere");
        assert!(body.locate(&body.bytes()[4..]).is_none(), "empty slice");
        assert!(body.file.get().is_none(), "nothing located, no file made");
        let clone = body.clone();
        assert!(clone.locate(clone.bytes()).is_some());
        assert!(body.file.get().is_some(), "clones share the file");
    }

    #[test]
    fn the_file_is_sealed() {
        use std::io::Write as _;
        let body = Body::new(Bytes::from_static(b"x 1\n"));
        let span = body.locate(body.bytes()).unwrap();
        let mut file = std::fs::File::from(span.file.try_clone().unwrap());
        assert_eq!(
            file.write_all(b"y").unwrap_err().raw_os_error(),
            Some(nix::libc::EPERM)
        );
        assert_eq!(
            file.set_len(1).unwrap_err().raw_os_error(),
            Some(nix::libc::EPERM)
        );
    }
}
