//! gpud: the node half of a GPU stack for Kubernetes and bare metal, in one binary.
//!
//! `nvml` is the only code that talks to the driver; it builds the [`inventory`] that every
//! subsystem reads. Applets (`gpud <applet>`) are thin shells over the subsystems.

pub mod applets;
pub mod backoff;
pub mod cdi;
pub mod cdi_hook;
pub mod child;
pub mod cli;
pub mod config;
pub mod cri;
pub mod cuda_mps;
pub mod daemon;
pub mod device_plugin;
pub mod dns_name;
pub mod doctor;
pub mod doctor_report;
pub mod dra;
pub mod dra_names;
pub mod exit;
pub mod exporter;
pub mod files;
pub mod grpc;
pub mod handover;
pub mod health;
pub mod holdings;
pub mod http;
pub mod inventory;
pub mod kube;
pub mod labeller;
pub mod listeners;
pub mod logging;
pub mod mig;
pub mod mig_config;
pub mod mig_state;
pub mod mps;
pub mod multicall;
pub mod node_status;
pub mod nvidia_config;
pub mod nvml;
pub mod pod_directory;
pub mod proto;
pub mod remediation;
pub mod remediation_state;
pub mod resources;
pub mod runtime_config;
pub mod values;
pub mod xid;
