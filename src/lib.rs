//! gpud: the node half of a GPU stack for Kubernetes and bare metal, in one binary.
//!
//! `nvml` is the only code that talks to the driver; it builds the [`inventory`] that every
//! subsystem reads. Applets (`gpud <applet>`) are thin shells over the subsystems.

pub mod applets;
pub mod cdi;
pub mod cli;
pub mod config;
pub mod cuda_mps;
pub mod daemon;
pub mod device_plugin;
pub mod doctor;
pub mod dra;
pub mod exit;
pub mod exporter;
pub mod files;
pub mod grpc;
pub mod health;
pub mod http;
pub mod inventory;
pub mod labeller;
pub mod mig;
pub mod mps;
pub mod multicall;
pub mod node_status;
pub mod nvidia_config;
pub mod nvml;
pub mod proto;
pub mod telemetry;
pub mod values;
