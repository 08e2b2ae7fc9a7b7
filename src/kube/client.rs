//! A client for the API server: from a kubeconfig file when one is named, else the usual
//! inference (in-cluster service account, then `$KUBECONFIG` / `~/.kube/config`).

use std::path::Path;

use super::ApiError;

/// Builds a client; fails with the kubeconfig's path and the reason.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<::kube::Client, ApiError> {
    let config = match kubeconfig {
        Some(path) => {
            let named =
                |e: &dyn std::fmt::Display| ApiError::Config(format!("{}: {e}", path.display()));
            let file = ::kube::config::Kubeconfig::read_from(path).map_err(|e| named(&e))?;
            ::kube::Config::from_custom_kubeconfig(
                file,
                &::kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| named(&e))?
        }
        None => ::kube::Config::infer()
            .await
            .map_err(|e| ApiError::Config(e.to_string()))?,
    };
    ::kube::Client::try_from(config).map_err(|e| ApiError::Config(e.to_string()))
}
