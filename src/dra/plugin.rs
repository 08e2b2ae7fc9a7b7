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
        share_id: None,
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

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let results = self
            .preparer
            .prepare(claims!(request.into_inner().claims))
            .await;
        let claims = results
            .into_iter()
            .map(|(uid, result)| {
                let answer = match result {
                    Ok(devices) => v1::NodePrepareResourceResponse {
                        devices: devices.iter().map(v1_device).collect(),
                        error: String::new(),
                    },
                    Err(error) => v1::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    },
                };
                (uid, answer)
            })
            .collect();
        Ok(Response::new(v1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let results = self
            .preparer
            .unprepare(claims!(request.into_inner().claims))
            .await;
        Ok(Response::new(v1::NodeUnprepareResourcesResponse {
            claims: unprepared(results, |error| v1::NodeUnprepareResourceResponse { error }),
        }))
    }
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let results = self
            .preparer
            .prepare(claims!(request.into_inner().claims))
            .await;
        let claims = results
            .into_iter()
            .map(|(uid, result)| {
                let answer = match result {
                    Ok(devices) => v1beta1::NodePrepareResourceResponse {
                        devices: devices.iter().map(v1beta1_device).collect(),
                        error: String::new(),
                    },
                    Err(error) => v1beta1::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    },
                };
                (uid, answer)
            })
            .collect();
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let results = self
            .preparer
            .unprepare(claims!(request.into_inner().claims))
            .await;
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse {
            claims: unprepared(results, |error| v1beta1::NodeUnprepareResourceResponse {
                error,
            }),
        }))
    }
}
