//! The Kubernetes device plugin: advertises the node's GPUs (and MIG devices, and time-sliced
//! replicas) to the kubelet, allocates them, prefers well-connected sets, and withdraws sick
//! devices — and returns them when they recover.

pub mod allocate;
pub mod preferred;
pub mod resources;
pub mod settings;
