//! The counters CSV: which DCGM fields to export, with their Prometheus type and help text.
//!
//! The format is dcgm-exporter's, so its files work unchanged: one record per line with exactly
//! three comma-separated fields — DCGM field name, type (`gauge`, `counter`, `histogram`,
//! `summary` or `label`), help text — each trimmed of surrounding spaces. Lines whose first
//! non-blank character is `#` are comments and blank lines are skipped. A field may be quoted
//! with `"` (CSV style, `""` for a literal quote), which is how a help text carries a comma.
//!
//! Parsing is pure: [`parse`] takes the text and the path to name in errors.

use std::fmt;
use std::path::{Path, PathBuf};

/// The built-in default counter set: dcgm-exporter's default fields.
pub const DEFAULT_COUNTERS: &str = include_str!("default-counters.csv");

/// Name shown in messages for the built-in set.
pub const DEFAULT_COUNTERS_NAME: &str = "<built-in default counters>";

/// A Prometheus metric type as the CSV names it, or `label`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Gauge,
    Counter,
    Histogram,
    Summary,
    /// Not a metric: the field's value becomes a label on every metric of the device.
    Label,
}

impl MetricKind {
    /// The word used in the CSV and in `# TYPE` lines.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Gauge => "gauge",
            MetricKind::Counter => "counter",
            MetricKind::Histogram => "histogram",
            MetricKind::Summary => "summary",
            MetricKind::Label => "label",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "gauge" => MetricKind::Gauge,
            "counter" => MetricKind::Counter,
            "histogram" => MetricKind::Histogram,
            "summary" => MetricKind::Summary,
            "label" => MetricKind::Label,
            _ => return None,
        })
    }
}

impl fmt::Display for MetricKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One record of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterRow {
    /// 1-based line number, for messages.
    pub line: usize,
    /// The DCGM field name, e.g. `DCGM_FI_DEV_GPU_UTIL`.
    pub field: String,
    /// The Prometheus type.
    pub kind: MetricKind,
    /// The `# HELP` text.
    pub help: String,
}

/// A counters file that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CountersError {
    /// The file cannot be read.
    #[error("{path}: cannot read the counters file: {reason}")]
    Read { path: PathBuf, reason: String },
    /// A line is not a valid record.
    #[error("{path}: line {line}: {reason}: {}", crate::files::excerpt(text))]
    Syntax {
        path: PathBuf,
        line: usize,
        reason: String,
        text: String,
    },
    /// A record names something unusable.
    #[error(
        "{path}: line {line}: field {field}: invalid value {}: {reason}",
        crate::files::excerpt(value)
    )]
    Invalid {
        path: PathBuf,
        line: usize,
        field: &'static str,
        value: String,
        reason: String,
    },
}

/// Reads and parses a counters file.
pub fn load(path: &Path) -> Result<Vec<CounterRow>, CountersError> {
    let text = crate::files::read_text(path).map_err(|err| CountersError::Read {
        path: path.to_path_buf(),
        reason: match err {
            crate::files::ReadError::Io { source, .. } => source.to_string(),
            refused => refused.to_string(),
        },
    })?;
    parse(path, &text)
}

/// Parses counters text; `path` names the source in errors.
pub fn parse(path: &Path, text: &str) -> Result<Vec<CounterRow>, CountersError> {
    let mut rows = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let syntax = |reason: String| CountersError::Syntax {
            path: path.to_path_buf(),
            line,
            reason,
            text: trimmed.to_owned(),
        };
        let fields = split_record(trimmed).map_err(|reason| syntax(reason.to_owned()))?;
        let [field, kind, help] = <[String; 3]>::try_from(fields).map_err(|fields| {
            syntax(format!(
                "expected 3 fields (DCGM field, type, help), found {}",
                fields.len()
            ))
        })?;
        if field.is_empty() {
            return Err(CountersError::Invalid {
                path: path.to_path_buf(),
                line,
                field: "DCGM field",
                value: field,
                reason: "must not be empty".into(),
            });
        }
        let kind = MetricKind::parse(&kind).ok_or_else(|| CountersError::Invalid {
            path: path.to_path_buf(),
            line,
            field: "type",
            value: kind.clone(),
            reason: "must be one of gauge, counter, histogram, summary, label".into(),
        })?;
        rows.push(CounterRow {
            line,
            field,
            kind,
            help,
        });
    }
    Ok(rows)
}

/// Splits one CSV record into trimmed fields, honouring `"` quoting.
fn split_record(line: &str) -> Result<Vec<String>, &'static str> {
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        // Leading blanks of a field do not count, so `a, "b"` is quoted.
        while chars.next_if(|c| *c == ' ' || *c == '\t').is_some() {}
        let mut field = String::new();
        if chars.next_if_eq(&'"').is_some() {
            loop {
                match chars.next() {
                    Some('"') if chars.next_if_eq(&'"').is_some() => field.push('"'),
                    Some('"') => break,
                    Some(c) => field.push(c),
                    None => return Err("unterminated quoted field"),
                }
            }
            while chars.next_if(|c| *c == ' ' || *c == '\t').is_some() {}
            match chars.peek() {
                None | Some(',') => {}
                Some(_) => return Err("text after a closing quote"),
            }
        } else {
            while let Some(c) = chars.next_if(|c| *c != ',') {
                field.push(c);
            }
        }
        fields.push(field.trim().to_owned());
        if chars.next().is_none() {
            return Ok(fields);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> Result<Vec<CounterRow>, CountersError> {
        parse(Path::new("/etc/dcgm-exporter/custom.csv"), text)
    }

    #[test]
    fn default_set_is_dcgm_exporters_26_fields() {
        let rows = parse(Path::new(DEFAULT_COUNTERS_NAME), DEFAULT_COUNTERS).unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.field.as_str()).collect();
        assert_eq!(
            names,
            [
                "DCGM_FI_DEV_SM_CLOCK",
                "DCGM_FI_DEV_MEM_CLOCK",
                "DCGM_FI_DEV_MEMORY_TEMP",
                "DCGM_FI_DEV_GPU_TEMP",
                "DCGM_FI_DEV_POWER_USAGE",
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                "DCGM_FI_DEV_GPU_UTIL",
                "DCGM_FI_DEV_MEM_COPY_UTIL",
                "DCGM_FI_DEV_ENC_UTIL",
                "DCGM_FI_DEV_DEC_UTIL",
                "DCGM_FI_DEV_XID_ERRORS",
                "DCGM_FI_DEV_FB_FREE",
                "DCGM_FI_DEV_FB_USED",
                "DCGM_FI_DEV_FB_RESERVED",
                "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                "DCGM_FI_DRIVER_VERSION",
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                "DCGM_FI_PROF_DRAM_ACTIVE",
                "DCGM_FI_PROF_PCIE_TX_BYTES",
                "DCGM_FI_PROF_PCIE_RX_BYTES",
            ]
        );
        let energy = &rows[5];
        assert_eq!(energy.kind, MetricKind::Counter);
        assert_eq!(energy.help, "Total energy consumption since boot (in mJ).");
        assert_eq!(
            rows[10].help, "Decoder utilization (in %).",
            "stray space trimmed"
        );
        assert_eq!(rows[20].kind, MetricKind::Label);
    }

    #[test]
    fn records_are_trimmed_and_quotes_carry_commas() {
        let rows = parse_str(
            "\n  # comment\nDCGM_FI_DEV_GPU_UTIL ,gauge ,  Util  \n\"DCGM_FI_DEV_FB_USED\", gauge, \"Used, in MiB \"\"FB\"\"\"\n",
        )
        .unwrap();
        assert_eq!(
            rows,
            [
                CounterRow {
                    line: 3,
                    field: "DCGM_FI_DEV_GPU_UTIL".into(),
                    kind: MetricKind::Gauge,
                    help: "Util".into()
                },
                CounterRow {
                    line: 4,
                    field: "DCGM_FI_DEV_FB_USED".into(),
                    kind: MetricKind::Gauge,
                    help: "Used, in MiB \"FB\"".into()
                },
            ]
        );
    }

    #[test]
    fn errors_name_file_line_field_and_value() {
        let err = parse_str("DCGM_FI_DEV_GPU_UTIL, gauge\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/dcgm-exporter/custom.csv: line 1: expected 3 fields (DCGM field, type, help), found 2: \"DCGM_FI_DEV_GPU_UTIL, gauge\""
        );
        let err =
            parse_str("# x\nDCGM_FI_DEV_GPU_UTIL, gague, GPU utilization (in %).\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/dcgm-exporter/custom.csv: line 2: field type: invalid value \"gague\": must be one of gauge, counter, histogram, summary, label"
        );
        let err = parse_str("A, gauge, Help, with a comma\n").unwrap_err();
        assert!(err.to_string().contains("found 4"), "{err}");
        let err = parse_str("\"A, gauge, x\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("line 1: unterminated quoted field"),
            "{err}"
        );
        let err = parse_str(" , gauge, x\n").unwrap_err();
        assert!(err.to_string().contains("field DCGM field"), "{err}");
    }
}
