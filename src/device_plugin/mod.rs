//! The Kubernetes device plugin: advertises the node's GPUs (and MIG devices, and time-sliced
//! replicas) to the kubelet, allocates them, prefers well-connected sets, and withdraws sick
//! devices — and returns them when they recover.

pub mod allocate;
pub mod kubelet_watch;
pub mod manager;
pub mod mps;
pub mod preferred;
pub mod registration;
pub mod retry;
pub mod server;
pub mod service;
pub mod settings_source;
