//! Registering a plugin with the kubelet over its unix socket.

use std::path::Path;
use std::time::Duration;

use tonic::transport::Endpoint;

use crate::proto::deviceplugin::registration_client::RegistrationClient;
use crate::proto::deviceplugin::{DevicePluginOptions, RegisterRequest};

/// The API version gpud speaks.
pub const API_VERSION: &str = "v1beta1";

/// Why a registration attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("cannot connect to the kubelet at {path}: {source}")]
    Connect {
        path: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("the kubelet refused {resource}: {status}")]
    Refused {
        resource: String,
        status: tonic::Status,
    },
}

/// Registers `resource`, served on `endpoint` (a socket file name in the kubelet's directory).
pub async fn register(
    kubelet_socket: &Path,
    endpoint: &str,
    resource: &str,
) -> Result<(), RegistrationError> {
    let path = kubelet_socket.to_string_lossy().into_owned();
    let connect = |source| RegistrationError::Connect {
        path: path.clone(),
        source,
    };
    let channel = Endpoint::try_from(format!("unix://{path}"))
        .map_err(connect)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(connect)?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: API_VERSION.to_owned(),
            endpoint: endpoint.to_owned(),
            resource_name: resource.to_owned(),
            options: Some(DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .map_err(|status| RegistrationError::Refused {
            resource: resource.to_owned(),
            status,
        })?;
    Ok(())
}
