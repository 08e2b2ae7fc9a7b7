//! The DRAResourceHealth stream (v1 and v1alpha1): the health of every device of the driver,
//! so the kubelet can show it in the status of the pods using them
//! (`allocatedResourcesStatus`). Each message is the complete list, sent at once and again
//! whenever the inventory's health changes; a MIG device is unhealthy when it or its GPU is.

use std::pin::Pin;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::dra_names::{self, DraDevice};
use crate::inventory::Snapshot;
use crate::inventory::health::{Health, HealthState};
use crate::proto::{drahealth_v1 as v1, drahealth_v1alpha1 as v1alpha1};
use std::sync::Arc;

/// The longest message the kubelet keeps.
pub const MAX_MESSAGE: usize = 1024;

/// One device's health, version-neutral.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceState {
    pub device: String,
    pub healthy: bool,
    pub since: i64,
    pub message: String,
}

/// The health of every device of `snapshot`.
pub fn states(snapshot: &Snapshot) -> Vec<DeviceState> {
    dra_names::devices(snapshot)
        .map(|(device, d)| {
            let worst: &Health = match d {
                DraDevice::Mig(gpu, mig) if gpu.health.state >= mig.health.state => &gpu.health,
                DraDevice::Mig(_, mig) => &mig.health,
                DraDevice::Gpu(gpu) => &gpu.health,
            };
            DeviceState {
                device,
                healthy: worst.state != HealthState::Unhealthy,
                since: worst
                    .since
                    .and_then(|s| s.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
                message: clip(worst.reason.as_deref().unwrap_or_default()),
            }
        })
        .collect()
}

/// Longer messages are cut to 1021 characters and `...`, as the kubelet would.
fn clip(text: &str) -> String {
    if text.chars().count() <= MAX_MESSAGE {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(MAX_MESSAGE - 3).collect();
    out.push_str("...");
    out
}

/// The health service (both versions).
#[derive(Debug, Clone)]
pub struct HealthService {
    pool: String,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    /// Ends every stream: a server stopping gracefully waits for its calls, and this one
    /// would never end by itself.
    stop: CancellationToken,
}

impl HealthService {
    pub fn new(
        pool: &str,
        snapshots: watch::Receiver<Arc<Snapshot>>,
        stop: CancellationToken,
    ) -> Self {
        HealthService {
            pool: pool.to_owned(),
            snapshots,
            stop,
        }
    }

    /// The complete lists, the first at once, then one per change, until the stop.
    fn lists(&self) -> impl Stream<Item = Vec<DeviceState>> + Send + 'static {
        futures_util::StreamExt::take_until(self.changes(), self.stop.clone().cancelled_owned())
    }

    fn changes(&self) -> impl Stream<Item = Vec<DeviceState>> + Send + 'static {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0));
        let mut last: Option<Vec<DeviceState>> = None;
        WatchStream::new(self.snapshots.clone()).filter_map(move |snapshot| {
            let mut list = states(&snapshot);
            for state in &mut list {
                if state.since == 0 {
                    state.since = started;
                }
            }
            if last.as_ref() == Some(&list) {
                return None;
            }
            last = Some(list.clone());
            Some(list)
        })
    }
}

/// The service of one API version: the same stream, with that version's messages.
macro_rules! health_service {
    ($api:ident) => {
        #[tonic::async_trait]
        impl $api::dra_resource_health_server::DraResourceHealth for HealthService {
            type NodeWatchResourcesStream = Pin<
                Box<dyn Stream<Item = Result<$api::NodeWatchResourcesResponse, Status>> + Send>,
            >;

            async fn node_watch_resources(
                &self,
                _: Request<$api::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                let pool = self.pool.clone();
                let stream = self.lists().map(move |list| {
                    let devices = list
                        .into_iter()
                        .map(|s| $api::DeviceHealth {
                            device: Some($api::DeviceIdentifier {
                                pool_name: pool.clone(),
                                device_name: s.device,
                            }),
                            health: if s.healthy {
                                $api::HealthStatus::Healthy
                            } else {
                                $api::HealthStatus::Unhealthy
                            } as i32,
                            last_updated_time: s.since,
                            health_check_timeout_seconds: 0,
                            message: s.message,
                        })
                        .collect();
                    Ok($api::NodeWatchResourcesResponse { devices })
                });
                Ok(Response::new(Box::pin(stream)))
            }
        }
    };
}

health_service!(v1);
health_service!(v1alpha1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_as_the_kubelet_cuts_them() {
        let long = "x".repeat(2000);
        let cut = clip(&long);
        assert_eq!(cut.chars().count(), 1024);
        assert!(cut.ends_with("..."));
        assert_eq!(clip("short"), "short");
    }
}
