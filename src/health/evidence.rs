//! Fresh evidence for GPUs held out of service because what a restart kept of them could not
//! be read: the doctor's per-GPU checks, run by this same binary in a child process (as the
//! remediation checks a reset GPU, [`crate::child::doctor`]), one GPU at a time, again
//! every retry period until each passes. A GPU is reported proven once, when its checks pass;
//! one that fails stays held, said once per GPU.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::child::doctor;

/// A held GPU, as the watcher knows it when it starts gathering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldGpu {
    pub index: u32,
    pub uuid: String,
}

/// The longest wait between two checks of a GPU that failed them.
const RETRY_MAX: Duration = Duration::from_secs(60);
/// The shortest (the watcher's poll interval in tests is milliseconds).
const RETRY_MIN: Duration = Duration::from_secs(1);

/// Starts checking `gpus` with the NVML library at `nvml_lib`; their UUIDs come back on the
/// returned queue as each passes. Ends when every GPU passed, `cancel` fires or the queue's
/// reader is gone. `retry` is how long after a failed check it is run again.
pub fn start(
    gpus: Vec<HeldGpu>,
    nvml_lib: PathBuf,
    retry: Duration,
    cancel: CancellationToken,
) -> mpsc::UnboundedReceiver<String> {
    let (proven, queue) = mpsc::unbounded_channel();
    let Some(gpud) = std::env::current_exe().ok() else {
        warn!(
            "Cannot find gpud's own binary (/proc/self/exe): the GPUs held for want of fresh evidence stay out of service until gpud restarts with its saved verdicts readable"
        );
        return queue;
    };
    let retry = retry.clamp(RETRY_MIN, RETRY_MAX);
    crate::logging::spawn(async move {
        tokio::select! {
            () = cancel.cancelled() => {}
            () = gather(gpus, gpud, nvml_lib, retry, proven) => {}
        }
    });
    queue
}

async fn gather(
    mut pending: Vec<HeldGpu>,
    gpud: PathBuf,
    nvml_lib: PathBuf,
    retry: Duration,
    proven: mpsc::UnboundedSender<String>,
) {
    let mut said: Vec<String> = Vec::new();
    loop {
        let mut still = Vec::new();
        for gpu in pending {
            match doctor::check(&gpud, &nvml_lib, &[gpu.index], doctor::LIMIT).await {
                Ok(_) => {
                    info!(gpu = gpu.index, uuid = %gpu.uuid, "The doctor's checks of the GPU pass: fresh evidence, it returns to service");
                    if proven.send(gpu.uuid).is_err() {
                        return;
                    }
                }
                Err(why) => {
                    if !said.contains(&gpu.uuid) {
                        warn!(gpu = gpu.index, uuid = %gpu.uuid, failed = %why, "The doctor's checks of a GPU held for want of fresh evidence fail: it stays out of service; checked again every {}", humantime::format_duration(retry));
                        said.push(gpu.uuid.clone());
                    }
                    still.push(gpu);
                }
            }
        }
        if still.is_empty() || proven.is_closed() {
            return;
        }
        pending = still;
        tokio::time::sleep(retry).await;
    }
}
