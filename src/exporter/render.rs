//! The exposition body: every metric of one sample in Prometheus' text format, laid out as
//! dcgm-exporter lays it out.
//!
//! Families come in counters-file order, each as `# HELP`, `# TYPE` and one line per device.
//! Labels are in dcgm-exporter's order: `gpu`, `UUID`, `pci_bus_id`, `device` (`nvidia<gpu>`),
//! `modelName`, then `GPU_I_PROFILE` and `GPU_I_ID` for a GPU instance, `Hostname`, the label
//! fields (such as `DCGM_FI_DRIVER_VERSION`) sorted by name, and last the per-sample attributes
//! sorted by name (`container`, `err_code`, `err_msg`, `namespace`, `pod`, `vgpu`,
//! `window_size_in_ms`, `xid`). Integers print as integers and decimals with six places, as
//! dcgm-exporter prints them. A MIG-enabled GPU with GPU instances is reported once per
//! instance and not as a whole, device-wide values repeated on each instance. gpud's own
//! families (`gpud_*`) follow, with the same labels except `modelName` (so they pass
//! Prometheus' snake_case lint) and without label fields or pods.
//!
//! Pure: everything comes in through [`Frame`]; the body is appended to a `String`.

use std::fmt::Write as _;
use std::time::SystemTime;

use super::fields::{LabelSource, MetricDef, Selection, Source, Value};
use super::pods::{Attribution, DeviceKey, PodLabels};
use super::xids;
use crate::http::StatsSnapshot;
use crate::inventory::model::{Gpu, MigDevice};
use crate::inventory::{HealthState, Snapshot};
use crate::mig_state::metrics::{DURATION_BUCKETS, Reading as MigReading, STATES};
use crate::nvml::sampling::{
    GpuTelemetry, InstanceTelemetry, NodeTelemetry, SampleStatus, gpm_per_instance,
};
use crate::remediation_state::Phase;
use crate::remediation_state::metrics::{
    DURATION_BUCKETS as REMEDIATION_BUCKETS, Reading as RemediationReading,
};
use crate::xid::counts::{DropSource, XidCounts};

/// How device labels are spelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelOptions {
    /// Name of the host label (`Hostname`, or `hostname` as newer dcgm-exporter spells it);
    /// `None` drops it (`--no-hostname`).
    pub hostname_label: Option<String>,
    /// Replace spaces in `modelName` with `-`.
    pub replace_blanks_in_model_name: bool,
}

impl Default for LabelOptions {
    fn default() -> Self {
        LabelOptions {
            hostname_label: Some("Hostname".to_owned()),
            replace_blanks_in_model_name: false,
        }
    }
}

/// gpud's view of its own work, for the `gpud_*` families.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OwnStats {
    /// Sample cycles completed.
    pub samples: u64,
    /// Wall time of the last sample cycle.
    pub last_sample_seconds: f64,
    /// How long ago the last sample cycle finished, when the body was rendered.
    pub last_sample_age_seconds: f64,
    /// Whether the last pod-resources `List` succeeded; `None` without `--kubernetes`.
    pub pod_resources_up: Option<bool>,
    /// The HTTP server's connection counters when the body was rendered.
    pub http: Option<StatsSnapshot>,
    /// The MIG reconciler's counters; `None` when it does not run in this process.
    pub mig: Option<MigReading>,
    /// The remediation's counters; `None` when it does not run in this process.
    pub remediation: Option<RemediationReading>,
    /// Kept health verdicts files the health watcher of this process found damaged.
    pub kept_verdicts_damaged: u64,
}

/// Everything one body is rendered from.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    pub selection: &'a Selection,
    pub labels: &'a LabelOptions,
    pub snapshot: &'a Snapshot,
    /// The latest sample; `None` before the first.
    pub telemetry: Option<&'a NodeTelemetry>,
    /// NVLink throughput per GPU index, MB/s, between the last two samples.
    pub nvlink_rates: &'a [(u32, f64)],
    pub pods: &'a Attribution,
    pub xids: &'a XidCounts,
    pub now: SystemTime,
    pub own: &'a OwnStats,
}

/// One set of series: a whole GPU, or one GPU instance of a MIG-enabled GPU.
struct Entity<'a> {
    gpu: &'a Gpu,
    telemetry: &'a GpuTelemetry,
    instance: Option<(u32, Option<&'a InstanceTelemetry>)>,
    /// `gpu=…,…,Hostname=…` plus the label fields.
    prefix: String,
}

impl Entity<'_> {
    fn key(&self) -> DeviceKey {
        DeviceKey {
            gpu: self.gpu.index,
            gpu_instance: self.instance.map(|(gi, _)| gi),
        }
    }
}

/// Appends the whole body for `frame` to `out`.
pub fn render(frame: &Frame<'_>, out: &mut String) {
    let entities = entities(frame);
    for metric in &frame.selection.metrics {
        family(frame, metric, &entities, out);
    }
    own_families(frame, out);
}

/// Escapes a label value: backslash, double quote and newline.
pub fn escape_label(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn escape_help(text: &str, out: &mut String) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn push_label(out: &mut String, name: &str, value: &str) {
    if !out.is_empty() && !out.ends_with('{') {
        out.push(',');
    }
    out.push_str(name);
    out.push_str("=\"");
    escape_label(value, out);
    out.push('"');
}

/// The GPU-instance profile of a MIG device: its name without the compute-instance part
/// (`1c.3g.40gb` belongs to GPU instance profile `3g.40gb`).
pub fn gpu_instance_profile(mig: &MigDevice) -> &str {
    match mig.profile.split_once('.') {
        Some((first, rest)) if first.ends_with('c') && rest.contains('g') => rest,
        _ => &mig.profile,
    }
}

/// Whether a label set carries `modelName`: dcgm-exporter's families do; gpud's own leave it
/// out, so they pass Prometheus' snake_case lint (join on `UUID` for the model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Model {
    Include,
    Omit,
}

/// `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, the GPU-instance labels, `Hostname`.
pub(crate) fn identity(
    frame: &Frame<'_>,
    gpu: &Gpu,
    instance: Option<(&str, u32)>,
    model: Model,
) -> String {
    let mut s = String::with_capacity(160);
    push_label(&mut s, "gpu", &gpu.index.to_string());
    push_label(&mut s, "UUID", &gpu.uuid);
    push_label(&mut s, "pci_bus_id", &gpu.pci.bus_id.nvml());
    push_label(&mut s, "device", &format!("nvidia{}", gpu.index));
    if model == Model::Include {
        if frame.labels.replace_blanks_in_model_name {
            push_label(&mut s, "modelName", &gpu.name.replace(' ', "-"));
        } else {
            push_label(&mut s, "modelName", &gpu.name);
        }
    }
    if let Some((profile, id)) = instance {
        push_label(&mut s, "GPU_I_PROFILE", profile);
        push_label(&mut s, "GPU_I_ID", &id.to_string());
    }
    if let Some(name) = &frame.labels.hostname_label {
        push_label(&mut s, name, &frame.snapshot.node.hostname);
    }
    s
}

fn label_field_value<'a>(frame: &'a Frame<'_>, gpu: &'a Gpu, source: LabelSource) -> String {
    let node = &frame.snapshot.node;
    match source {
        LabelSource::DriverVersion => node.driver_version.clone(),
        LabelSource::NvmlVersion => node.nvml_version.clone().unwrap_or_default(),
        LabelSource::CudaDriverVersion => node.cuda_driver_version.clone().unwrap_or_default(),
        LabelSource::Brand => gpu.brand.clone().unwrap_or_default(),
        LabelSource::Serial => gpu.serial.clone().unwrap_or_default(),
        LabelSource::Name => gpu.name.clone(),
        LabelSource::Uuid => gpu.uuid.clone(),
        LabelSource::PciBusId => gpu.pci.bus_id.to_string(),
        LabelSource::PciDeviceId => gpu.pci.device_id.clone(),
    }
}

/// The devices that have series: GPUs the last sample could read, split into GPU instances
/// where MIG is on and instances exist.
fn entities<'a>(frame: &'a Frame<'a>) -> Vec<Entity<'a>> {
    let Some(telemetry) = frame.telemetry else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in telemetry
        .gpus
        .iter()
        .filter(|t| t.status == SampleStatus::Ok)
    {
        let Some(gpu) = frame.snapshot.gpu(t.index) else {
            continue;
        };
        let with_fields = |identity: String| {
            let mut prefix = identity;
            for label in &frame.selection.labels {
                push_label(
                    &mut prefix,
                    &label.name,
                    &label_field_value(frame, gpu, label.source),
                );
            }
            prefix
        };
        if gpu.mig.enabled && !gpu.mig.devices.is_empty() {
            let mut seen: Vec<u32> = Vec::new();
            let mut migs: Vec<&MigDevice> = gpu.mig.devices.iter().collect();
            migs.sort_by_key(|m| (m.gpu_instance_id, m.compute_instance_id));
            for mig in migs {
                if seen.contains(&mig.gpu_instance_id) {
                    continue;
                }
                seen.push(mig.gpu_instance_id);
                let prefix = with_fields(identity(
                    frame,
                    gpu,
                    Some((gpu_instance_profile(mig), mig.gpu_instance_id)),
                    Model::Include,
                ));
                let own = t
                    .instances
                    .iter()
                    .find(|i| i.gpu_instance_id == mig.gpu_instance_id);
                out.push(Entity {
                    gpu,
                    telemetry: t,
                    instance: Some((mig.gpu_instance_id, own)),
                    prefix,
                });
            }
        } else {
            let prefix = with_fields(identity(frame, gpu, None, Model::Include));
            out.push(Entity {
                gpu,
                telemetry: t,
                instance: None,
                prefix,
            });
        }
    }
    out
}

/// The value of a plain (non-XID) source on one entity.
fn value_of(frame: &Frame<'_>, source: &Source, entity: &Entity<'_>) -> Option<Value> {
    let instance = entity.instance.map(|(_, own)| own);
    match *source {
        Source::Reading(reading, conv) => {
            let raw = match instance {
                Some(own) if reading.per_instance() => own?.value(reading)?,
                _ => entity.telemetry.value(reading)?,
            };
            Some(conv.int(raw))
        }
        Source::Gpm {
            metric,
            conv,
            fallback,
        } => {
            let gpm = match instance {
                Some(own) if gpm_per_instance(metric) => own.and_then(|i| i.gpm(metric)),
                _ => entity.telemetry.gpm(metric),
            };
            match gpm {
                Some(v) => Some(conv.float(v)),
                None => {
                    let (reading, conv) = fallback?;
                    Some(conv.int(entity.telemetry.value(reading)?))
                }
            }
        }
        Source::NvLinkRate => frame
            .nvlink_rates
            .iter()
            .find(|(gpu, _)| *gpu == entity.gpu.index)
            .map(|(_, rate)| Value::Int(rate.max(0.0).round() as u64)),
        Source::LastXid | Source::XidCount | Source::Label(_) | Source::Unavailable(_) => None,
    }
}

fn write_value(out: &mut String, value: Value) {
    let _ = match value {
        Value::Int(v) => write!(out, "{v}"),
        Value::Float(v) => write!(out, "{v:.6}"),
    };
}

pub(crate) fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    escape_help(help, out);
    out.push_str("\n# TYPE ");
    out.push_str(name);
    out.push(' ');
    out.push_str(kind);
    out.push('\n');
}

/// One sample line per attributed container (or one without pod labels), with `extra`
/// attributes merged in name order.
fn sample_lines(
    out: &mut String,
    name: &str,
    entity: &Entity<'_>,
    pods: &Attribution,
    extra: &[(&str, &str)],
    value: Value,
) {
    let mut holders = pods.for_device(entity.key()).peekable();
    if holders.peek().is_none() {
        sample_line(out, name, &entity.prefix, None, extra, value);
        return;
    }
    for holder in holders {
        sample_line(out, name, &entity.prefix, Some(holder), extra, value);
    }
}

pub(crate) fn sample_line(
    out: &mut String,
    name: &str,
    prefix: &str,
    pod: Option<&PodLabels>,
    extra: &[(&str, &str)],
    value: Value,
) {
    let mut attributes: Vec<(&str, &str)> = extra.to_vec();
    if let Some(pod) = pod {
        attributes.push(("container", &pod.container));
        attributes.push(("namespace", &pod.namespace));
        attributes.push(("pod", &pod.pod));
        if let Some(vgpu) = &pod.vgpu {
            attributes.push(("vgpu", vgpu));
        }
    }
    attributes.sort_by(|a, b| a.0.cmp(b.0));
    out.push_str(name);
    out.push('{');
    out.push_str(prefix);
    for (key, val) in attributes {
        out.push(',');
        out.push_str(key);
        out.push_str("=\"");
        escape_label(val, out);
        out.push('"');
    }
    out.push_str("} ");
    write_value(out, value);
    out.push('\n');
}

fn family(frame: &Frame<'_>, metric: &MetricDef, entities: &[Entity<'_>], out: &mut String) {
    let start = out.len();
    header(out, &metric.name, &metric.help, metric.kind.as_str());
    let after_header = out.len();
    for entity in entities {
        match metric.source {
            Source::LastXid => {
                let code = frame.xids.last(entity.gpu.index).unwrap_or(0);
                let code_text = code.to_string();
                sample_lines(
                    out,
                    &metric.name,
                    entity,
                    frame.pods,
                    &[("err_code", &code_text), ("err_msg", xids::message(code))],
                    Value::Int(u64::from(code)),
                );
            }
            Source::XidCount => {
                let window = frame.xids.window().as_millis().to_string();
                for (code, count) in frame.xids.in_window(entity.gpu.index, frame.now) {
                    let code_text = code.to_string();
                    sample_lines(
                        out,
                        &metric.name,
                        entity,
                        frame.pods,
                        &[("window_size_in_ms", &window), ("xid", &code_text)],
                        Value::Int(count),
                    );
                }
            }
            ref source => {
                if let Some(value) = value_of(frame, source, entity) {
                    sample_lines(out, &metric.name, entity, frame.pods, &[], value);
                }
            }
        }
    }
    if out.len() == after_header {
        // No device has a value: leave the family out rather than print an empty one.
        out.truncate(start);
    }
}

/// gpud's own families: build, NVML, sampling, per-device sampling and health, XID counts and
/// drops, pod-resources reachability, HTTP connections.
fn own_families(frame: &Frame<'_>, out: &mut String) {
    header(out, "gpud_build_info", "gpud's version; always 1.", "gauge");
    let _ = writeln!(
        out,
        "gpud_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );

    if let Some(t) = frame.telemetry {
        header(
            out,
            "gpud_nvml_up",
            "Whether the last sample could talk to NVML (1) or not (0).",
            "gauge",
        );
        let _ = writeln!(out, "gpud_nvml_up {}", u8::from(t.nvml_up));
    }
    header(
        out,
        "gpud_samples_total",
        "NVML sample cycles completed.",
        "counter",
    );
    let _ = writeln!(out, "gpud_samples_total {}", frame.own.samples);
    header(
        out,
        "gpud_sample_duration_seconds",
        "Wall time of the last NVML sample cycle, in seconds.",
        "gauge",
    );
    let _ = writeln!(
        out,
        "gpud_sample_duration_seconds {}",
        frame.own.last_sample_seconds
    );
    header(
        out,
        "gpud_exporter_last_sample_age_seconds",
        "Seconds since the last NVML sample finished, when this body was rendered; past three \
         collect intervals the exporter is not ready (an NVML call hangs).",
        "gauge",
    );
    let _ = writeln!(
        out,
        "gpud_exporter_last_sample_age_seconds {:.3}",
        frame.own.last_sample_age_seconds
    );

    let snapshot = frame.snapshot;
    if let Some(t) = frame.telemetry {
        header(
            out,
            "gpud_gpu_sampled",
            "Whether the last sample could read the GPU (1) or it was lost or failed (0).",
            "gauge",
        );
        for gpu_t in &t.gpus {
            let Some(gpu) = snapshot.gpu(gpu_t.index) else {
                continue;
            };
            let labels = identity(frame, gpu, None, Model::Omit);
            let ok = gpu_t.status == SampleStatus::Ok;
            let _ = writeln!(out, "gpud_gpu_sampled{{{labels}}} {}", u8::from(ok));
        }
    }

    header(
        out,
        "gpud_gpu_health",
        "Health of each GPU and GPU instance as a state set: 1 for the current state (healthy, degraded or unhealthy, with the reason), 0 for the others.",
        "gauge",
    );
    for gpu in &snapshot.gpus {
        health_line(
            out,
            &identity(frame, gpu, None, Model::Omit),
            gpu.health.state,
            gpu.health.reason.as_deref(),
        );
        let mut instances: Vec<(u32, &MigDevice)> = Vec::new();
        for mig in &gpu.mig.devices {
            match instances
                .iter_mut()
                .find(|(gi, _)| *gi == mig.gpu_instance_id)
            {
                Some((_, worst)) if mig.health.state > worst.health.state => *worst = mig,
                Some(_) => {}
                None => instances.push((mig.gpu_instance_id, mig)),
            }
        }
        instances.sort_by_key(|(gi, _)| *gi);
        for (gi, mig) in instances {
            let labels = identity(
                frame,
                gpu,
                Some((gpu_instance_profile(mig), gi)),
                Model::Omit,
            );
            health_line(out, &labels, mig.health.state, mig.health.reason.as_deref());
        }
    }

    let mut xid_header = false;
    for gpu in &snapshot.gpus {
        for (gi, code, count) in frame.xids.totals(gpu.index) {
            if !xid_header {
                header(
                    out,
                    "gpud_xid_errors_total",
                    "XID errors reported by the driver, by code (a GPU instance's when the driver attributes it).",
                    "counter",
                );
                xid_header = true;
            }
            let profile = gi.and_then(|gi| {
                gpu.mig
                    .devices
                    .iter()
                    .find(|m| m.gpu_instance_id == gi)
                    .map(|m| (gpu_instance_profile(m), gi))
            });
            let mut labels = identity(frame, gpu, profile, Model::Omit);
            push_label(&mut labels, "xid", &code.to_string());
            let _ = writeln!(out, "gpud_xid_errors_total{{{labels}}} {count}");
        }
    }
    header(
        out,
        "gpud_xid_events_dropped_total",
        "XID reports a memory bound made gpud let go of, by where: window (left out of DCGM_EXP_XID_ERRORS_COUNT early; gpud_xid_errors_total still counts them), dedup (unpaired NVML/kernel-log reports forgotten; a late partner counts again).",
        "counter",
    );
    for source in DropSource::ALL {
        let _ = writeln!(
            out,
            "gpud_xid_events_dropped_total{{source=\"{}\"}} {}",
            source.as_str(),
            frame.xids.dropped(source)
        );
    }

    // Only once there is something to count: a node whose file was never damaged has no such
    // series (and the exporter's golden bodies stay as they are).
    let damaged = frame.own.kept_verdicts_damaged;
    if damaged > 0 {
        header(
            out,
            "gpud_health_kept_verdicts_damaged_total",
            "Kept health verdicts files found damaged by this process (moved aside; the GPUs they could have covered held until the doctor's checks pass).",
            "counter",
        );
        let _ = writeln!(out, "gpud_health_kept_verdicts_damaged_total {damaged}");
    }

    if let Some(up) = frame.own.pod_resources_up {
        header(
            out,
            "gpud_pod_resources_up",
            "Whether the last kubelet pod-resources List succeeded (1) or not (0).",
            "gauge",
        );
        let _ = writeln!(out, "gpud_pod_resources_up {}", u8::from(up));
        header(
            out,
            "gpud_pod_resources_unresolved_devices",
            "DRA devices claimed on this node, in the last pod-resources List, whose name is no GPU or MIG device of the node (not attributed).",
            "gauge",
        );
        let _ = writeln!(
            out,
            "gpud_pod_resources_unresolved_devices {}",
            frame.pods.unresolved().len()
        );
    }

    if let Some(http) = &frame.own.http {
        http_families(http, out);
    }
    if let Some(mig) = &frame.own.mig {
        mig_families(mig, out);
    }
    if let Some(remediation) = &frame.own.remediation {
        remediation_families(frame, remediation, out);
    }
    device_taint_family(frame, out);
}

/// One series per taint an admin's DeviceTaintRule puts on a device (shown only while there
/// is one: the DRA plugin puts them into the inventory).
fn device_taint_family(frame: &Frame<'_>, out: &mut String) {
    if frame
        .snapshot
        .gpus
        .iter()
        .all(|g| g.device_taints.is_empty())
    {
        return;
    }
    header(
        out,
        "gpud_dra_device_taint",
        "A taint a DeviceTaintRule puts on a DRA device of the GPU (the GPU or a MIG device of it): 1 per rule, device, key and effect.",
        "gauge",
    );
    for gpu in &frame.snapshot.gpus {
        for taint in &gpu.device_taints {
            let mut labels = identity(frame, gpu, None, Model::Omit);
            push_label(&mut labels, "dra_device", &taint.device);
            push_label(&mut labels, "rule", &taint.rule);
            push_label(&mut labels, "key", &taint.key);
            push_label(&mut labels, "effect", &taint.effect);
            let _ = writeln!(out, "gpud_dra_device_taint{{{labels}}} 1");
        }
    }
}

/// The remediation's actions, each GPU's phase and how long GPUs were out of service.
fn remediation_families(frame: &Frame<'_>, reading: &RemediationReading, out: &mut String) {
    header(
        out,
        "gpud_remediation_total",
        "Remediation actions by result: reset and verify (success or failed), escalate (by the escalation's reason), evict (success, refused or failed), reboot.",
        "counter",
    );
    for ((action, result), count) in &reading.totals {
        let _ = writeln!(
            out,
            "gpud_remediation_total{{action=\"{action}\",result=\"{result}\"}} {count}"
        );
    }
    header(
        out,
        "gpud_remediation_state",
        "Where each GPU is on its way back to service, as a state set: 1 for its phase (healthy, quarantined, draining, resetting, verifying, escalated), 0 for the others.",
        "gauge",
    );
    for gpu in &frame.snapshot.gpus {
        let labels = identity(frame, gpu, None, Model::Omit);
        let phase = gpu.remediation.as_ref().map_or(Phase::Healthy, |r| r.phase);
        for state in Phase::ALL {
            let _ = writeln!(
                out,
                "gpud_remediation_state{{{labels},state=\"{state}\"}} {}",
                u8::from(state == phase)
            );
        }
    }
    header(
        out,
        "gpud_remediation_duration_seconds",
        "Time from a GPU's fault to its return to service after a reset, for the GPUs gpud brought back.",
        "histogram",
    );
    for (bound, count) in REMEDIATION_BUCKETS.iter().zip(reading.buckets) {
        let _ = writeln!(
            out,
            "gpud_remediation_duration_seconds_bucket{{le=\"{bound}\"}} {count}"
        );
    }
    let _ = writeln!(
        out,
        "gpud_remediation_duration_seconds_bucket{{le=\"+Inf\"}} {}",
        reading.returned
    );
    let _ = writeln!(
        out,
        "gpud_remediation_duration_seconds_sum {}",
        reading.seconds
    );
    let _ = writeln!(
        out,
        "gpud_remediation_duration_seconds_count {}",
        reading.returned
    );
}

/// The MIG reconciler's applies, their duration and the Node's `nvidia.com/mig.config.state`.
fn mig_families(mig: &MigReading, out: &mut String) {
    header(
        out,
        "gpud_mig_apply_total",
        "MIG config applies by the reconciler, by result: success (the layout was reached) or failed (refused, failed, or a reset or reboot still needed).",
        "counter",
    );
    for (result, count) in [("success", mig.succeeded), ("failed", mig.failed)] {
        let _ = writeln!(out, "gpud_mig_apply_total{{result=\"{result}\"}} {count}");
    }
    header(
        out,
        "gpud_mig_apply_duration_seconds",
        "Wall time of the reconciler's MIG config applies, hooks and GPU resets included, in seconds.",
        "histogram",
    );
    for (bound, count) in DURATION_BUCKETS.iter().zip(mig.buckets) {
        let _ = writeln!(
            out,
            "gpud_mig_apply_duration_seconds_bucket{{le=\"{bound}\"}} {count}"
        );
    }
    let applies = mig.applies();
    let _ = writeln!(
        out,
        "gpud_mig_apply_duration_seconds_bucket{{le=\"+Inf\"}} {applies}"
    );
    let _ = writeln!(out, "gpud_mig_apply_duration_seconds_sum {}", mig.seconds);
    let _ = writeln!(out, "gpud_mig_apply_duration_seconds_count {applies}");
    header(
        out,
        "gpud_mig_config_state",
        "The nvidia.com/mig.config.state the reconciler last wrote or confirmed on the Node: 1 for that state, 0 for the others (all 0 before the first).",
        "gauge",
    );
    for state in STATES {
        let _ = writeln!(
            out,
            "gpud_mig_config_state{{state=\"{}\"}} {}",
            state.as_str(),
            u8::from(mig.state == Some(state))
        );
    }
}

/// The HTTP server's connection counters.
fn http_families(http: &StatsSnapshot, out: &mut String) {
    let families = [
        (
            "gpud_http_connections_open",
            "HTTP connections open when this body was rendered.",
            "gauge",
            http.open,
        ),
        (
            "gpud_http_connections_max",
            "Most HTTP connections open at once (--http-max-connections, lower under a small open-file limit).",
            "gauge",
            http.max,
        ),
        (
            "gpud_http_connections_refused_total",
            "HTTP connections closed at once: the cap was reached and every open connection was answering a request.",
            "counter",
            http.refused,
        ),
        (
            "gpud_http_connections_evicted_total",
            "HTTP connections without a request in progress closed to make room for a new one at the cap.",
            "counter",
            http.evicted,
        ),
    ];
    for (name, help, kind, value) in families {
        header(out, name, help, kind);
        let _ = writeln!(out, "{name} {value}");
    }
    header(
        out,
        "gpud_http_connections_timed_out_total",
        "HTTP connections closed for waiting too long: for a whole request head (phase=\"header\") or for the next request (phase=\"idle\").",
        "counter",
    );
    for (phase, value) in [
        ("header", http.header_timeouts),
        ("idle", http.idle_timeouts),
    ] {
        let _ = writeln!(
            out,
            "gpud_http_connections_timed_out_total{{phase=\"{phase}\"}} {value}"
        );
    }
}

/// A Prometheus state set: one series per state, 1 for the current one (which carries the
/// reason), 0 for the others, so `gpud_gpu_health{state="healthy"} 1` reads as it should.
fn health_line(out: &mut String, identity: &str, state: HealthState, reason: Option<&str>) {
    for candidate in HealthState::ALL {
        let mut labels = identity.to_owned();
        push_label(&mut labels, "state", candidate.word());
        let current = candidate == state;
        if let (true, Some(reason)) = (current, reason) {
            push_label(&mut labels, "reason", reason);
        }
        let _ = writeln!(out, "gpud_gpu_health{{{labels}}} {}", u8::from(current));
    }
}

#[cfg(test)]
mod tests {
    use crate::inventory::test_support;
    use std::path::Path;
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::exporter::counters;
    use crate::exporter::fields::select;
    use crate::exporter::pods::{self, ResourceFilter};
    use crate::inventory::health::Health;
    use crate::inventory::model::{MigEngines, Node, Pci};
    use crate::nvml::sampling::Reading;
    use crate::proto::podresources::{
        ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources,
    };

    fn gpu(index: u32, migs: &[(u32, u32, &str)]) -> Gpu {
        let base = test_support::gpu(
            index,
            &format!("GPU-{index}"),
            "NVIDIA H100 80GB HBM3",
            81559,
        );
        let devices = migs
            .iter()
            .enumerate()
            .map(|(i, &(gi, ci, profile))| MigDevice {
                profile: profile.into(),
                memory_mib: 9984,
                multiprocessors: 16,
                engines: MigEngines {
                    copy: 1,
                    decoder: 1,
                    encoder: 0,
                    jpeg: 1,
                    ofa: 0,
                },
                ..test_support::mig(i as u32, &format!("MIG-{index}-{gi}-{ci}"), gi, ci)
            })
            .collect();
        test_support::with_migs(
            Gpu {
                serial: Some("1234".into()),
                brand: Some("nvidia".into()),
                pci: Pci {
                    bus_id: format!("00000000:{:02X}:00.0", 0x18 + index).into(),
                    device_id: "0x233010DE".into(),
                    subsystem_id: None,
                },
                ..base
            },
            devices,
        )
    }

    fn snapshot(gpus: Vec<Gpu>) -> Snapshot {
        Snapshot {
            node: Node {
                hostname: "node-a".into(),
                driver_version: "570.133.20".into(),
                cuda_driver_version: Some("12.8".into()),
                nvml_version: None,
                machine_type: None,
            },
            gpus,
            topology: Vec::new(),
        }
    }

    fn telemetry(index: u32, values: &[(Reading, u64)]) -> GpuTelemetry {
        GpuTelemetry {
            index,
            status: SampleStatus::Ok,
            values: values.to_vec(),
            gpm: Vec::new(),
            instances: Vec::new(),
            processes: None,
        }
    }

    struct Case {
        selection: Selection,
        snapshot: Snapshot,
        telemetry: NodeTelemetry,
        pods: Attribution,
        xids: XidCounts,
        labels: LabelOptions,
    }

    impl Case {
        fn new(csv: &str, gpus: Vec<Gpu>, t: Vec<GpuTelemetry>) -> Case {
            let rows = counters::parse(Path::new("t.csv"), csv).unwrap();
            Case {
                selection: select(Path::new("t.csv"), &rows, true).unwrap(),
                snapshot: snapshot(gpus),
                telemetry: NodeTelemetry {
                    nvml_up: true,
                    gpus: t,
                },
                pods: Attribution::default(),
                xids: XidCounts::new(Duration::from_secs(300)),
                labels: LabelOptions::default(),
            }
        }

        /// The DCGM part of the body (gpud's own families cut off).
        fn dcgm(&self) -> String {
            let own = OwnStats::default();
            let frame = Frame {
                selection: &self.selection,
                labels: &self.labels,
                snapshot: &self.snapshot,
                telemetry: Some(&self.telemetry),
                nvlink_rates: &[],
                pods: &self.pods,
                xids: &self.xids,
                now: UNIX_EPOCH + Duration::from_secs(1_800_000_100),
                own: &own,
            };
            let mut out = String::new();
            render(&frame, &mut out);
            let cut = out.find("# HELP gpud_").unwrap_or(out.len());
            out.truncate(cut);
            out
        }
    }

    #[test]
    fn labels_units_and_number_formats_follow_dcgm_exporter() {
        let case = Case::new(
            "DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).\nDCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\nDCGM_FI_DRIVER_VERSION, label, Driver Version\n",
            vec![gpu(0, &[])],
            vec![telemetry(
                0,
                &[
                    (Reading::PowerMw, 52_636),
                    (Reading::FbUsedBytes, 1500 << 20),
                ],
            )],
        );
        assert_eq!(
            case.dcgm(),
            "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n\
             # TYPE DCGM_FI_DEV_POWER_USAGE gauge\n\
             DCGM_FI_DEV_POWER_USAGE{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:18:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-a\",DCGM_FI_DRIVER_VERSION=\"570.133.20\"} 52.636000\n\
             # HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n\
             # TYPE DCGM_FI_DEV_FB_USED gauge\n\
             DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:18:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-a\",DCGM_FI_DRIVER_VERSION=\"570.133.20\"} 1500\n"
        );
    }

    #[test]
    fn mig_gpus_are_reported_per_gpu_instance_only() {
        let mut t = telemetry(
            0,
            &[(Reading::PowerMw, 100_000), (Reading::FbUsedBytes, 9 << 30)],
        );
        t.instances = vec![
            InstanceTelemetry {
                gpu_instance_id: 2,
                values: vec![(Reading::FbUsedBytes, 300 << 20)],
                gpm: Vec::new(),
            },
            InstanceTelemetry {
                gpu_instance_id: 9,
                values: vec![(Reading::FbUsedBytes, 20 << 20)],
                gpm: Vec::new(),
            },
        ];
        let mut case = Case::new(
            "DCGM_FI_DEV_POWER_USAGE, gauge, p\nDCGM_FI_DEV_FB_USED, gauge, f\nDCGM_FI_DEV_GPU_UTIL, gauge, u\n",
            vec![gpu(
                0,
                &[
                    (9, 0, "1g.10gb"),
                    (2, 1, "1c.3g.40gb"),
                    (2, 0, "1c.3g.40gb"),
                ],
            )],
            vec![t],
        );
        case.labels.hostname_label = None;
        let id = |gi: u32, profile: &str| {
            format!(
                "gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:18:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",GPU_I_PROFILE=\"{profile}\",GPU_I_ID=\"{gi}\""
            )
        };
        assert_eq!(
            case.dcgm(),
            format!(
                "# HELP DCGM_FI_DEV_POWER_USAGE p\n# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n\
                 DCGM_FI_DEV_POWER_USAGE{{{}}} 100.000000\n\
                 DCGM_FI_DEV_POWER_USAGE{{{}}} 100.000000\n\
                 # HELP DCGM_FI_DEV_FB_USED f\n# TYPE DCGM_FI_DEV_FB_USED gauge\n\
                 DCGM_FI_DEV_FB_USED{{{}}} 300\n\
                 DCGM_FI_DEV_FB_USED{{{}}} 20\n",
                id(2, "3g.40gb"),
                id(9, "1g.10gb"),
                id(2, "3g.40gb"),
                id(9, "1g.10gb"),
            ),
            "one sample per GPU instance, no parent sample, no empty GPU_UTIL family"
        );
    }

    #[test]
    fn xid_gauge_carries_code_and_message_and_pods_sort_into_the_attributes() {
        let mut case = Case::new(
            "DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.\nDCGM_EXP_XID_ERRORS_COUNT, gauge, Count of XID errors within the window.\n",
            vec![gpu(0, &[]), gpu(1, &[])],
            vec![telemetry(0, &[]), telemetry(1, &[])],
        );
        case.labels.hostname_label = Some("hostname".into());
        case.xids
            .observe(1, None, 79, UNIX_EPOCH + Duration::from_secs(1_800_000_000));
        case.pods = pods::attribute(
            &ListPodResourcesResponse {
                pod_resources: vec![PodResources {
                    name: "trainer".into(),
                    namespace: "ml".into(),
                    containers: vec![ContainerResources {
                        name: "main".into(),
                        devices: vec![ContainerDevices {
                            resource_name: "nvidia.com/gpu".into(),
                            device_ids: vec!["GPU-1".into()],
                            topology: None,
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
            },
            &ResourceFilter::default(),
            &case.snapshot,
        );
        let body = case.dcgm();
        let lines: Vec<&str> = body.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [
                "DCGM_FI_DEV_XID_ERRORS{gpu=\"0\",UUID=\"GPU-0\",pci_bus_id=\"00000000:18:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",hostname=\"node-a\",err_code=\"0\",err_msg=\"No Error\"} 0",
                "DCGM_FI_DEV_XID_ERRORS{gpu=\"1\",UUID=\"GPU-1\",pci_bus_id=\"00000000:19:00.0\",device=\"nvidia1\",modelName=\"NVIDIA H100 80GB HBM3\",hostname=\"node-a\",container=\"main\",err_code=\"79\",err_msg=\"GPU has fallen off the bus\",namespace=\"ml\",pod=\"trainer\"} 79",
                "DCGM_EXP_XID_ERRORS_COUNT{gpu=\"1\",UUID=\"GPU-1\",pci_bus_id=\"00000000:19:00.0\",device=\"nvidia1\",modelName=\"NVIDIA H100 80GB HBM3\",hostname=\"node-a\",container=\"main\",namespace=\"ml\",pod=\"trainer\",window_size_in_ms=\"300000\",xid=\"79\"} 1",
            ]
        );
    }

    #[test]
    fn lost_gpus_drop_their_series_and_own_families_say_why() {
        let mut lost_gpu = gpu(1, &[]);
        lost_gpu.health = Health::lost(UNIX_EPOCH);
        let mut case = Case::new(
            "DCGM_FI_DEV_GPU_TEMP, gauge, t\n",
            vec![gpu(0, &[]), lost_gpu],
            vec![
                telemetry(0, &[(Reading::GpuTempC, 41)]),
                GpuTelemetry {
                    status: SampleStatus::Lost,
                    ..telemetry(1, &[])
                },
            ],
        );
        case.labels.hostname_label = None;
        case.labels.replace_blanks_in_model_name = true;
        let own = OwnStats {
            samples: 3,
            last_sample_seconds: 0.25,
            last_sample_age_seconds: 0.0,
            pod_resources_up: Some(false),
            http: Some(StatsSnapshot {
                open: 2,
                max: 512,
                refused: 3,
                evicted: 4,
                header_timeouts: 5,
                idle_timeouts: 6,
            }),
            mig: None,
            remediation: None,
            kept_verdicts_damaged: 0,
        };
        let frame = Frame {
            selection: &case.selection,
            labels: &case.labels,
            snapshot: &case.snapshot,
            telemetry: Some(&case.telemetry),
            nvlink_rates: &[],
            pods: &case.pods,
            xids: &case.xids,
            now: UNIX_EPOCH,
            own: &own,
        };
        let mut body = String::new();
        render(&frame, &mut body);
        let own_id = |i: u32| {
            format!(
                "gpu=\"{i}\",UUID=\"GPU-{i}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{i}\"",
                0x18 + i
            )
        };
        let id = |i: u32| format!("{},modelName=\"NVIDIA-H100-80GB-HBM3\"", own_id(i));
        let samples: Vec<&str> = body.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            samples,
            [
                format!("DCGM_FI_DEV_GPU_TEMP{{{}}} 41", id(0)),
                format!(
                    "gpud_build_info{{version=\"{}\"}} 1",
                    env!("CARGO_PKG_VERSION")
                ),
                "gpud_nvml_up 1".to_owned(),
                "gpud_samples_total 3".to_owned(),
                "gpud_sample_duration_seconds 0.25".to_owned(),
                "gpud_exporter_last_sample_age_seconds 0.000".to_owned(),
                format!("gpud_gpu_sampled{{{}}} 1", own_id(0)),
                format!("gpud_gpu_sampled{{{}}} 0", own_id(1)),
                format!("gpud_gpu_health{{{},state=\"healthy\"}} 1", own_id(0)),
                format!("gpud_gpu_health{{{},state=\"degraded\"}} 0", own_id(0)),
                format!("gpud_gpu_health{{{},state=\"unhealthy\"}} 0", own_id(0)),
                format!("gpud_gpu_health{{{},state=\"healthy\"}} 0", own_id(1)),
                format!("gpud_gpu_health{{{},state=\"degraded\"}} 0", own_id(1)),
                format!(
                    "gpud_gpu_health{{{},state=\"unhealthy\",reason=\"{}\"}} 1",
                    own_id(1),
                    crate::inventory::health::LOST_REASON
                ),
                "gpud_xid_events_dropped_total{source=\"window\"} 0".to_owned(),
                "gpud_xid_events_dropped_total{source=\"dedup\"} 0".to_owned(),
                "gpud_pod_resources_up 0".to_owned(),
                "gpud_pod_resources_unresolved_devices 0".to_owned(),
                "gpud_http_connections_open 2".to_owned(),
                "gpud_http_connections_max 512".to_owned(),
                "gpud_http_connections_refused_total 3".to_owned(),
                "gpud_http_connections_evicted_total 4".to_owned(),
                "gpud_http_connections_timed_out_total{phase=\"header\"} 5".to_owned(),
                "gpud_http_connections_timed_out_total{phase=\"idle\"} 6".to_owned(),
            ]
        );
    }

    #[test]
    fn mig_families_count_applies_and_set_the_state() {
        use crate::mig_state::State;
        use crate::mig_state::metrics::Metrics;
        let metrics = Metrics::default();
        metrics.applied(true, Duration::from_millis(2500));
        metrics.applied(false, Duration::from_secs(700));
        metrics.state(State::Failed);
        let mut body = String::new();
        mig_families(&metrics.read(), &mut body);
        let samples: Vec<&str> = body.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            samples,
            [
                "gpud_mig_apply_total{result=\"success\"} 1",
                "gpud_mig_apply_total{result=\"failed\"} 1",
                "gpud_mig_apply_duration_seconds_bucket{le=\"1\"} 0",
                "gpud_mig_apply_duration_seconds_bucket{le=\"5\"} 1",
                "gpud_mig_apply_duration_seconds_bucket{le=\"10\"} 1",
                "gpud_mig_apply_duration_seconds_bucket{le=\"30\"} 1",
                "gpud_mig_apply_duration_seconds_bucket{le=\"60\"} 1",
                "gpud_mig_apply_duration_seconds_bucket{le=\"120\"} 1",
                "gpud_mig_apply_duration_seconds_bucket{le=\"300\"} 1",
                "gpud_mig_apply_duration_seconds_bucket{le=\"600\"} 1",
                "gpud_mig_apply_duration_seconds_bucket{le=\"+Inf\"} 2",
                "gpud_mig_apply_duration_seconds_sum 702.5",
                "gpud_mig_apply_duration_seconds_count 2",
                "gpud_mig_config_state{state=\"pending\"} 0",
                "gpud_mig_config_state{state=\"success\"} 0",
                "gpud_mig_config_state{state=\"failed\"} 1",
                "gpud_mig_config_state{state=\"rebooting\"} 0",
            ]
        );
        assert!(body.contains("# TYPE gpud_mig_apply_duration_seconds histogram\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        let mut s = String::new();
        escape_label("a\"b\\c\nd", &mut s);
        assert_eq!(s, "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn gpu_instance_profile_drops_the_compute_part() {
        let mut mig = gpu(0, &[(1, 0, "1c.3g.40gb")]).mig.devices.remove(0);
        assert_eq!(gpu_instance_profile(&mig), "3g.40gb");
        mig.profile = "1g.10gb+me".into();
        assert_eq!(gpu_instance_profile(&mig), "1g.10gb+me");
        mig.profile = "7g.80gb".into();
        assert_eq!(gpu_instance_profile(&mig), "7g.80gb");
    }
}
