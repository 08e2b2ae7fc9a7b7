//! Generated kubelet and container-runtime gRPC bindings (compiled from `proto/` by `build.rs`).

/// Kubelet Device Plugin API (`deviceplugin/v1beta1`).
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
pub mod deviceplugin {
    tonic::include_proto!("v1beta1");
}

/// Protobuf package `v1`: the kubelet pod-resources API and the DRA health API v1 share it
/// (both are `package v1` on the wire), so they are generated into one module.
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
mod package_v1 {
    tonic::include_proto!("v1");
}

/// Kubelet pod-resources API (`podresources/v1`).
pub mod podresources {
    pub use super::package_v1::*;
}

/// Kubelet plugin registration (`pluginregistration/v1`, proto package `pluginregistration`).
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// Kubelet DRA plugin API v1 (Kubernetes 1.34 and later).
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// Kubelet DRA plugin API v1beta1 (Kubernetes 1.32 and 1.33).
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
pub mod dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// DRA device health v1 (`dra-health/v1`, proto package `v1`).
pub mod drahealth_v1 {
    pub use super::package_v1::{
        DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesRequest,
        NodeWatchResourcesResponse, dra_resource_health_client, dra_resource_health_server,
    };
}

/// DRA device health v1alpha1 (`dra-health/v1alpha1`).
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
pub mod drahealth_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

/// Container Runtime Interface v1 (`runtime.v1`): the runtime service's pod sandbox and
/// container lists, which name this node's containers for per-pod usage.
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
pub mod cri_runtime {
    tonic::include_proto!("runtime.v1");
}
