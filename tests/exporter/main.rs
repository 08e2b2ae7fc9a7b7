//! `gpud exporter` end to end: the real binary on the simulated NVML library, scraped over
//! HTTP. Golden bodies for whole nodes, promtool's verdict, fault handling, and pod attribution
//! against a fake kubelet pod-resources server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod dra;
#[path = "../common/fake_api.rs"]
mod fake_api;
#[path = "../common/fake_cri.rs"]
mod fake_cri;
mod faults;
mod harness;
#[path = "../common/fake_pod_resources.rs"]
mod kubelet;
mod metrics;
mod packaging;
mod pods;
mod rescan;
mod storm;
mod usage;
mod usage_runtime;
