//! Self-healing as data, below the remediation subsystem and its readers: the phase each GPU
//! is in ([`Phase`], carried in the inventory snapshot as [`GpuRemediation`]), the record kept
//! across restarts in the state directory ([`record`]) and the counters the exporter reports
//! ([`metrics`]); what NVML showed before a reset ([`reset_marks`]). The remediation
//! subsystem writes all of it; the health watchers (in its
//! process through the inventory, in the other containers of a DaemonSet through the record
//! file), the exporter and `gpud inventory` only read.

pub mod metrics;
pub mod record;
pub mod reset_marks;

pub use crate::inventory::remediation::{GpuRemediation, Phase};
