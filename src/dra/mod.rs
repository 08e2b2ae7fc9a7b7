//! Dynamic Resource Allocation: gpud as the kubelet plugin of driver `gpu.nvidia.com`.
//!
//! One job per file (device names are [`crate::dra_names`]): [`args`] (flags and paths),
//! [`objects`] (the `resource.k8s.io/v1` fields gpud uses), [`api_version`] (the
//! `resource.k8s.io` version the API server serves, and which newer slice fields it keeps),
//! [`read_back`] (fields the API server dropped from a write), [`shares`] (GPUs shared by
//! capacity), [`quantity`] (Kubernetes quantities), [`slices`] (devices, attributes,
//! capacities, per-slice limits), [`taints`] (health → device taints), [`taint_rules`]
//! (admins' DeviceTaintRules into the inventory), [`numa`] (the NUMA nodes near a GPU's),
//! [`publish`] (the
//! slices on the API server), [`registration`] (plugin registration), [`sockets`] (serving both sockets, in order, and again if they vanish), [`plugin`] (the
//! DRAPlugin gRPC service), [`prepare`] (prepare and unprepare), [`checkpoint`] (prepared
//! claims on disk), [`claim_cdi`] (one CDI spec per claim), [`opaque`] (NVIDIA's device
//! configs), [`partitions`] (dynamic MIG's counter sets and placement devices), [`dynamic_mig`]
//! (MIG devices made and destroyed with claims), [`timeslice`] (a claim's time-slice interval on its GPU), coexistence with the device plugin through [`crate::holdings`], [`health_stream`] (device
//! health for pods' status), [`device_status`] and [`status_writer`] (each prepared device's
//! status in its claim) and [`service`] (the subsystem).

pub mod api_version;
pub mod args;
pub mod checkpoint;
pub mod claim_cdi;
pub mod claim_mps;
pub mod device_status;
pub mod dynamic_mig;
pub mod health_stream;
pub mod numa;
pub mod objects;
pub mod opaque;
pub mod partitions;
pub mod plugin;
pub mod prepare;
pub mod publish;
pub mod quantity;
pub mod read_back;
pub mod readiness;
pub mod registration;
pub mod service;
pub mod shares;
pub mod slices;
pub mod sockets;
pub mod status_writer;
pub mod taint_rules;
pub mod taints;
pub mod timeslice;
pub mod topology;

pub use args::{DraArgs, DraConfig};
pub use service::Dra;
