//! The DRAPlugin gRPC service in both versions the kubelet speaks — v1 (Kubernetes 1.34+)
//! and v1beta1 (1.32, 1.33), the same messages but for v1's `share_id` — as thin handlers over
//! [`Preparer`]. A claim's failure is its `error`; the call itself fails only on requests
//! that cannot be answered at all.

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::checkpoint::PreparedDevice;
use super::prepare::{ClaimRef, Preparer};
use crate::proto::{dra_v1 as v1, dra_v1beta1 as v1beta1};

/// The DRAPlugin service (both versions).
#[derive(Debug, Clone)]
pub struct DraService {
    preparer: Arc<Preparer>,
}

impl DraService {
    pub fn new(preparer: Arc<Preparer>) -> Self {
        DraService { preparer }
    }
}

/// The claims of a request, in either version.
macro_rules! claims {
    ($claims:expr) => {
        $claims
            .into_iter()
            .map(|c| ClaimRef {
                namespace: c.namespace,
                uid: c.uid,
                name: c.name,
            })
            .collect::<Vec<_>>()
    };
}

fn unprepared<T>(
    results: std::collections::BTreeMap<String, Result<(), String>>,
    answer: impl Fn(String) -> T,
) -> HashMap<String, T> {
    results
        .into_iter()
        .map(|(uid, result)| (uid, answer(result.err().unwrap_or_default())))
        .collect()
}

fn v1_device(d: &PreparedDevice) -> v1::Device {
    v1::Device {
        request_names: d.request_names.clone(),
        pool_name: d.pool.clone(),
        device_name: d.device.clone(),
        cdi_device_ids: d.cdi_device_ids.clone(),
        share_id: d.share.as_ref().map(|s| s.id.clone()),
    }
}

fn v1beta1_device(d: &PreparedDevice) -> v1beta1::Device {
    v1beta1::Device {
        request_names: d.request_names.clone(),
        pool_name: d.pool.clone(),
        device_name: d.device.clone(),
        cdi_device_ids: d.cdi_device_ids.clone(),
    }
}

/// The service of one API version: the same handlers, with that version's messages.
macro_rules! dra_plugin {
    ($api:ident, $device:ident) => {
        #[tonic::async_trait]
        impl $api::dra_plugin_server::DraPlugin for DraService {
            async fn node_prepare_resources(
                &self,
                request: Request<$api::NodePrepareResourcesRequest>,
            ) -> Result<Response<$api::NodePrepareResourcesResponse>, Status> {
                let results = self
                    .preparer
                    .prepare(claims!(request.into_inner().claims))
                    .await;
                let claims = results
                    .into_iter()
                    .map(|(uid, result)| {
                        let (devices, error) = match result {
                            Ok(devices) => (devices.iter().map($device).collect(), String::new()),
                            Err(error) => (Vec::new(), error),
                        };
                        (uid, $api::NodePrepareResourceResponse { devices, error })
                    })
                    .collect();
                Ok(Response::new($api::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$api::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$api::NodeUnprepareResourcesResponse>, Status> {
                let results = self
                    .preparer
                    .unprepare(claims!(request.into_inner().claims))
                    .await;
                Ok(Response::new($api::NodeUnprepareResourcesResponse {
                    claims: unprepared(results, |error| $api::NodeUnprepareResourceResponse {
                        error,
                    }),
                }))
            }
        }
    };
}

dra_plugin!(v1, v1_device);
dra_plugin!(v1beta1, v1beta1_device);
