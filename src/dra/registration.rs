//! The plugin-registration service the kubelet calls on `<registry>/<driver>-reg.sock`:
//! `GetInfo` says what gpud is (a DRA plugin for the driver, its socket, the gRPC services it
//! serves); `NotifyRegistrationStatus` says whether the kubelet took it. Every accepted
//! registration is signalled, so that the slices are checked again after a kubelet restart.
//!
//! A refused registration leaves the kubelet unable to send claims to gpud: the subsystem is
//! not ready, with the kubelet's reason on `/readyz`, until a registration is accepted. The
//! socket stays served as it is: the kubelet's plugin watcher tries a socket it failed to
//! register again on its own, and serving it anew would only restart that schedule.

use std::sync::Arc;

use tokio::sync::Notify;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::readiness::{Cause, DraReadiness};
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

/// Where the kubelet's answers to registrations go: the slices' loop and readiness.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Woken whenever the kubelet accepts the plugin.
    pub registered: Arc<Notify>,
    /// The subsystem's readiness, not ready while the kubelet's last answer was a refusal
    /// (shared by every registration socket served in this run, so one served again still
    /// clears it).
    pub ready: DraReadiness,
}

/// The registration service.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    driver: String,
    endpoint: String,
    outcome: Outcome,
}

impl RegistrationService {
    /// Answers for `driver` served at `endpoint` (absolute socket path); reports the
    /// kubelet's answers to `outcome`.
    pub fn new(driver: &str, endpoint: &str, outcome: Outcome) -> Self {
        RegistrationService {
            driver: driver.to_owned(),
            endpoint: endpoint.to_owned(),
            outcome,
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
        let outcome = &self.outcome;
        if status.plugin_registered {
            info!(driver = %self.driver, "The kubelet registered the DRA plugin");
            outcome.ready.clear(Cause::Registration);
            outcome.registered.notify_one();
            Ok(Response::new(RegistrationStatusResponse {}))
        } else {
            warn!(driver = %self.driver, error = %status.error, "The kubelet refused the DRA plugin; claims cannot reach gpud until it registers it (the kubelet tries again on its own)");
            outcome.ready.not_ready(
                Cause::Registration,
                format!(
                    "the kubelet refused to register the DRA plugin {}: {}; fix what the kubelet \
                 names (its log has more), it tries again on its own",
                    self.driver, status.error
                ),
            );
            Err(Status::internal(format!(
                "the kubelet refused the DRA plugin: {}",
                status.error
            )))
        }
    }
}
