//! The kernel log source: `/dev/kmsg` live, or a regular file (tests, replays).
//!
//! The NVIDIA driver prints every XID to the kernel log, with the process that hit it — often
//! before, and sometimes instead of, the NVML event. A dedicated thread reads it and hands
//! parsed events to the watcher. `/dev/kmsg` is read from its end (only new records: a fresh
//! start must not resurrect XIDs from before the last GPU reset); a regular file is read from
//! its start and then followed as it grows. Lacking permission leaves it unmonitored (one
//! warning; the other sources carry on); a read that fails later ends the thread, and the
//! watcher then reports the kernel log's end on `/readyz`.

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::FileTypeExt;
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::feed::{self, Feed, Observation, Report, Row, Setup, Started};
use super::observer::{GpuMap, Observer};
use crate::health::dedup::{Occurrence, XidSource};
use crate::xid::kmsg::{KmsgEvent, KmsgParser};

/// The row of the table.
pub const ROW: Row = Row {
    name: "kernel log",
    start,
};

/// Default kernel log device.
pub const DEFAULT_KMSG_PATH: &str = "/dev/kmsg";

/// How often a regular file is checked for growth.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(20);

/// `read` on `/dev/kmsg` after the ring overwrote unread records.
const EPIPE: i32 = 32;

/// The largest kmsg record the kernel hands out (util-linux uses the same bound).
const RECORD_BUFFER: usize = 8192;

/// Overruns of the kernel's ring closer together than this are one episode, logged once.
const OVERRUN_EPISODE_GAP: Duration = Duration::from_secs(60);

/// Starts following the configured kernel log. The thread is not joined when the watcher
/// stops: `/dev/kmsg` reads block until the next record, so it exits at its next record or
/// when the process ends.
fn start(setup: &Setup<'_>, feed: Feed) -> Started {
    let Some(path) = setup.kmsg_path else {
        return Started::Off;
    };
    let file = match File::open(path) {
        Ok(file) => file,
        Err(err) => {
            return Started::Unmonitored(format!(
                "cannot read {}: {}; XIDs come from NVML events only",
                path.display(),
                crate::logging::error_chain(&err)
            ));
        }
    };
    let is_device = file
        .metadata()
        .map(|m| m.file_type().is_char_device())
        .unwrap_or(false);
    let shown = path.display().to_string();
    let thread = feed::spawn_thread(
        ROW.name,
        "gpud-kmsg",
        feed,
        setup.stop.clone(),
        move |feed, stop| {
            let followed = if is_device {
                follow_device(file, feed, stop)
            } else {
                follow_file(file, feed, stop)
            };
            debug!(path = %shown, "Kernel log reader stopped");
            followed.map_err(|err| {
                format!(
                    "reading {shown} failed: {}; XIDs come from NVML events only until gpud restarts",
                    crate::logging::error_chain(&err)
                )
            })
        },
    );
    match thread {
        Ok(thread) => Started::Running(Box::new(thread)),
        Err(err) => Started::Unmonitored(format!(
            "cannot start the kernel log reader: {}",
            crate::logging::error_chain(&err)
        )),
    }
}

/// `/dev/kmsg`: each `read` returns one record. `EPIPE` means records were overwritten before
/// we read them (the ring wrapped, in the kernel, before gpud could read it); that is logged
/// once per episode — the NVML events still carry those XIDs — and reading continues with the
/// next record. Any other read error ends the reader.
fn follow_device(mut file: File, feed: &Feed, stop: &CancellationToken) -> std::io::Result<()> {
    let _ = file.seek(SeekFrom::End(0));
    let mut parser = KmsgParser::new();
    let mut buf = vec![0u8; RECORD_BUFFER];
    let mut last_overrun: Option<Instant> = None;
    while !stop.is_cancelled() {
        match file.read(&mut buf) {
            Ok(0) => std::thread::sleep(FOLLOW_INTERVAL),
            Ok(n) => {
                let record = String::from_utf8_lossy(&buf[..n]);
                for line in record.lines() {
                    if !forward(&mut parser, line, feed) {
                        return Ok(());
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
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// A regular file: read what is there, then follow appends. A partial last line waits for
/// its newline. A read error ends the reader.
fn follow_file(mut file: File, feed: &Feed, stop: &CancellationToken) -> std::io::Result<()> {
    let mut parser = KmsgParser::new();
    let mut pending = Vec::new();
    let mut buf = vec![0u8; RECORD_BUFFER];
    while !stop.is_cancelled() {
        match file.read(&mut buf) {
            Ok(0) => std::thread::sleep(FOLLOW_INTERVAL),
            Ok(n) => {
                pending.extend_from_slice(&buf[..n]);
                while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    let text = String::from_utf8_lossy(&line[..line.len() - 1]);
                    if !forward(&mut parser, &text, feed) {
                        return Ok(());
                    }
                }
                // Bound a line that never ends (garbage without newlines).
                if pending.len() > RECORD_BUFFER {
                    pending.clear();
                }
            }
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// Parses one line and sends any event, waiting while the watcher's queue is full (the file,
/// or the kernel's ring, holds the rest meanwhile); `false` when the receiver is gone.
fn forward(parser: &mut KmsgParser, line: &str, feed: &Feed) -> bool {
    match parser.feed(line) {
        Some(event) => feed.blocking_send(Report::Seen(Box::new(event))).is_ok(),
        None => true,
    }
}

impl Observation for KmsgEvent {
    fn observe(self: Box<Self>, observer: &mut Observer, gpus: &GpuMap) {
        let Some(&gpu) = gpus.by_bus.get(self.pci_bus_id()) else {
            return; // a GPU this node's NVML does not know (or not a GPU at all)
        };
        match *self {
            KmsgEvent::Xid {
                ref pci_bus_id,
                code,
                gpu_instance_id,
                compute_instance_id,
                ..
            } => {
                let at_us = observer.now_us();
                if observer
                    .dedup
                    .observe(XidSource::Kmsg, pci_bus_id, code, at_us)
                    == Occurrence::Duplicate
                {
                    return;
                }
                observer.on_xid(gpus, gpu, code, gpu_instance_id.zip(compute_instance_id));
            }
            // Not an XID report of its own (the driver prints XID 79 next to it, counted from
            // that line), but proof the GPU is gone even when that line was lost: health only.
            KmsgEvent::FallenOffBus { .. } => {
                observer
                    .tracker
                    .observe_xid(gpu, 79, None, SystemTime::now());
            }
            KmsgEvent::GpuIdentified { .. } => {}
        }
    }
}
