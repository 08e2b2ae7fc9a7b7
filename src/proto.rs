//! Generated kubelet gRPC bindings (compiled from `proto/` by `build.rs`).

/// Kubelet Device Plugin API (`deviceplugin/v1beta1`).
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
pub mod deviceplugin {
    tonic::include_proto!("v1beta1");
}

/// Kubelet pod-resources API (`podresources/v1`).
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
pub mod podresources {
    tonic::include_proto!("v1");
}
