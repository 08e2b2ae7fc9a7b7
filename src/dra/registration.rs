//! The plugin-registration service the kubelet calls on `<registry>/<driver>-reg.sock`:
//! `GetInfo` says what gpud is (a DRA plugin for the driver, its socket, the gRPC services it
//! serves); `NotifyRegistrationStatus` says whether the kubelet took it. Every accepted
//! registration is signalled, so that the slices are checked again after a kubelet restart.

use std::sync::Arc;

use tokio::sync::Notify;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::proto::pluginregistration::registration_server::Registration;
use crate::proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};

/// `PluginInfo.type` of a DRA plugin.
pub const PLUGIN_TYPE: &str = "DRAPlugin";

/// The gRPC services gpud serves on the plugin socket, in the kubelet's order of preference
/// (it takes the first of its own list that the plugin offers): the DRA API v1 (Kubernetes
/// 1.34+), v1beta1 (1.32, 1.33), and the device health stream in both versions.
pub const SERVICES: [&str; 4] = [
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
];

/// The registration service.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    driver: String,
    endpoint: String,
    registered: Arc<Notify>,
}

impl RegistrationService {
    /// Answers for `driver` served at `endpoint` (absolute socket path); wakes `registered`
    /// whenever the kubelet accepts the plugin.
    pub fn new(driver: &str, endpoint: &str, registered: Arc<Notify>) -> Self {
        RegistrationService {
            driver: driver.to_owned(),
            endpoint: endpoint.to_owned(),
            registered,
        }
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_owned(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: SERVICES.iter().map(|s| (*s).to_owned()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            info!(driver = %self.driver, "The kubelet registered the DRA plugin");
            self.registered.notify_one();
            Ok(Response::new(RegistrationStatusResponse {}))
        } else {
            warn!(driver = %self.driver, error = %status.error, "The kubelet refused the DRA plugin");
            Err(Status::internal(format!(
                "the kubelet refused the DRA plugin: {}",
                status.error
            )))
        }
    }
}
