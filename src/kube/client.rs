//! A client for the API server: from a kubeconfig file when one is named, else the usual
//! inference (in-cluster service account, then `$KUBECONFIG` / `~/.kube/config`). A named
//! kubeconfig is read under the same limits as every config file ([`crate::files`]).

use std::path::Path;

use super::ApiError;

/// Builds a client; fails with the kubeconfig's path and the reason.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<::kube::Client, ApiError> {
    let config = match kubeconfig {
        Some(path) => {
            let named =
                |e: &dyn std::fmt::Display| ApiError::Config(format!("{}: {e}", path.display()));
            // Checked first with gpud's own limits: a regular file of bounded size, so a FIFO
            // or a link to a device cannot hang or bloat the process.
            crate::files::read_text(path).map_err(|e| ApiError::Config(e.to_string()))?;
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
    // No retries hidden inside one call: kube-rs would otherwise repeat a 429, 503 or 504 up
    // to 15 times from 5 ms within the call's time limit, unseen by gpud's log and backoff.
    // Each call is one request; its caller retries on gpud's backoff, lengthened to what the
    // API server asks for ([`ApiError::paced`]).
    let mut config = config;
    config.default_retry = false;
    ::kube::Client::try_from(config).map_err(|e| ApiError::Config(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn refused(path: &Path) -> ApiError {
        match connect(Some(path)).await {
            Err(err) => err,
            Ok(_) => panic!("{} was accepted", path.display()),
        }
    }

    #[tokio::test]
    async fn a_kubeconfig_that_is_a_fifo_or_a_device_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("kubeconfig");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR).unwrap();
        let err = refused(&fifo).await;
        assert_eq!(
            err.to_string(),
            format!(
                "cannot configure the Kubernetes client: {}: is a FIFO, not a regular file; \
                 refused without reading (name the file itself)",
                fifo.display()
            )
        );
        let err = refused(Path::new("/dev/zero")).await;
        assert!(err.to_string().contains("is a character device"), "{err}");
    }
}
