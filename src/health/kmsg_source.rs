//! Following the kernel log: `/dev/kmsg` live, or a regular file (tests, replays).
//!
//! The NVIDIA driver prints every XID to the kernel log, with the process that hit it — often
//! before, and sometimes instead of, the NVML event. A dedicated thread reads it and hands
//! parsed events to the tracker. `/dev/kmsg` is read from its end (only new records: a fresh
//! start must not resurrect XIDs from before the last GPU reset); a regular file is read from
//! its start and then followed as it grows. Lacking permission is one warning; the other
//! sources carry on.

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::xid::kmsg::{KmsgEvent, KmsgParser};

/// Default kernel log device.
pub const DEFAULT_KMSG_PATH: &str = "/dev/kmsg";

/// How often a regular file is checked for growth.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(20);

/// `read` on `/dev/kmsg` after the ring overwrote unread records.
const EPIPE: i32 = 32;

/// The largest kmsg record the kernel hands out (util-linux uses the same bound).
const RECORD_BUFFER: usize = 8192;

/// A running kernel-log reader; dropping it asks the thread to stop.
#[derive(Debug)]
pub struct KmsgSource {
    stop: Arc<AtomicBool>,
    _thread: JoinHandle<()>,
}

impl Drop for KmsgSource {
    fn drop(&mut self) {
        // `/dev/kmsg` reads block until the next record, so the thread is not joined; it exits
        // at its next record or when the process ends.
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Starts following `path`. Returns `None` (after one warning) when it cannot be opened.
pub fn start(path: &Path, tx: mpsc::Sender<KmsgEvent>) -> Option<KmsgSource> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(err) => {
            warn!(path = %path.display(), error = %crate::logging::error_chain(&err), "Cannot read the kernel log; XIDs come from NVML events only");
            return None;
        }
    };
    let is_device = file
        .metadata()
        .map(|m| m.file_type().is_char_device())
        .unwrap_or(false);
    let stop = Arc::new(AtomicBool::new(false));
    let thread_stop = Arc::clone(&stop);
    let owned: PathBuf = path.to_path_buf();
    let thread = crate::logging::spawn_thread("gpud-kmsg", move || {
        if is_device {
            follow_device(file, &tx, &thread_stop);
        } else {
            follow_file(file, &tx, &thread_stop);
        }
        debug!(path = %owned.display(), "Kernel log reader stopped");
    });
    match thread {
        Ok(thread) => Some(KmsgSource {
            stop,
            _thread: thread,
        }),
        Err(err) => {
            warn!(error = %crate::logging::error_chain(&err), "Cannot start the kernel log reader");
            None
        }
    }
}

/// Overruns of the kernel's ring closer together than this are one episode, logged once.
const OVERRUN_EPISODE_GAP: Duration = Duration::from_secs(60);

/// `/dev/kmsg`: each `read` returns one record. `EPIPE` means records were overwritten before
/// we read them (the ring wrapped, in the kernel, before gpud could read it); that is logged
/// once per episode — the NVML events still carry those XIDs — and reading continues with the
/// next record.
fn follow_device(mut file: File, tx: &mpsc::Sender<KmsgEvent>, stop: &AtomicBool) {
    let _ = file.seek(SeekFrom::End(0));
    let mut parser = KmsgParser::new();
    let mut buf = vec![0u8; RECORD_BUFFER];
    let mut last_overrun: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        match file.read(&mut buf) {
            Ok(0) => std::thread::sleep(FOLLOW_INTERVAL),
            Ok(n) => {
                let record = String::from_utf8_lossy(&buf[..n]);
                for line in record.lines() {
                    if !forward(&mut parser, line, tx) {
                        return;
                    }
                }
            }
            Err(err) if err.raw_os_error() == Some(EPIPE) => {
                if last_overrun.is_none_or(|at| at.elapsed() > OVERRUN_EPISODE_GAP) {
                    warn!(
                        "Kernel log records were overwritten before gpud read them; XIDs among them come from NVML events only"
                    );
                }
                last_overrun = Some(Instant::now());
            }
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(err) => {
                warn!(error = %crate::logging::error_chain(&err), "Kernel log read failed; stopping the kernel log reader");
                return;
            }
        }
    }
}

/// A regular file: read what is there, then follow appends. A partial last line waits for
/// its newline.
fn follow_file(mut file: File, tx: &mpsc::Sender<KmsgEvent>, stop: &AtomicBool) {
    let mut parser = KmsgParser::new();
    let mut pending = Vec::new();
    let mut buf = vec![0u8; RECORD_BUFFER];
    while !stop.load(Ordering::Relaxed) {
        match file.read(&mut buf) {
            Ok(0) => std::thread::sleep(FOLLOW_INTERVAL),
            Ok(n) => {
                pending.extend_from_slice(&buf[..n]);
                while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    let text = String::from_utf8_lossy(&line[..line.len() - 1]);
                    if !forward(&mut parser, &text, tx) {
                        return;
                    }
                }
                // Bound a line that never ends (garbage without newlines).
                if pending.len() > RECORD_BUFFER {
                    pending.clear();
                }
            }
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(err) => {
                warn!(error = %crate::logging::error_chain(&err), "Kernel log file read failed; stopping the kernel log reader");
                return;
            }
        }
    }
}

/// Parses one line and sends any event, waiting while the watcher's queue is full (the file,
/// or the kernel's ring, holds the rest meanwhile); `false` when the receiver is gone.
fn forward(parser: &mut KmsgParser, line: &str, tx: &mpsc::Sender<KmsgEvent>) -> bool {
    match parser.feed(line) {
        Some(event) => tx.blocking_send(event).is_ok(),
        None => true,
    }
}
