//! The `kind` of a spec, `vendor/class`, checked against the CDI naming rules so that gpud
//! never writes a file a runtime would refuse.
//!
//! Vendor: starts with a letter, ends with a letter or digit, and holds only letters, digits,
//! `-`, `_` and `.` (`nvidia.com`, `k8s.device-plugin.nvidia.com`). Class: the same, where a
//! `.` makes the spec need version 0.6.0 (`gpu`, `gpu.coherent`).

use std::fmt;

/// A vendor or class that breaks the CDI naming rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KindError {
    /// The name is empty.
    #[error("{what} must not be empty")]
    Empty { what: &'static str },
    /// The first character is not a letter.
    #[error("{what} {value:?} must start with a letter")]
    BadStart { what: &'static str, value: String },
    /// The last character is not a letter or a digit.
    #[error("{what} {value:?} must end with a letter or a digit")]
    BadEnd { what: &'static str, value: String },
    /// A character outside letters, digits, `-`, `_`, `.`.
    #[error("{what} {value:?} has {ch:?}; only letters, digits, '-', '_' and '.' are allowed")]
    BadChar {
        what: &'static str,
        value: String,
        ch: char,
    },
    /// A `kind` without the `/` between vendor and class.
    #[error("kind {value:?} is not of the form vendor/class")]
    NoSlash { value: String },
}

/// A validated `vendor/class`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kind {
    vendor: String,
    class: String,
}

/// The vendor `nvidia-ctk cdi generate` uses by default.
pub const DEFAULT_VENDOR: &str = "nvidia.com";
/// The class `nvidia-ctk cdi generate` uses by default.
pub const DEFAULT_CLASS: &str = "gpu";

impl Kind {
    /// Checks both halves.
    pub fn new(vendor: &str, class: &str) -> Result<Self, KindError> {
        Ok(Kind {
            vendor: check_vendor(vendor)?,
            class: check_class(class)?,
        })
    }

    /// Parses `vendor/class`.
    pub fn parse(kind: &str) -> Result<Self, KindError> {
        let (vendor, class) = kind.split_once('/').ok_or_else(|| KindError::NoSlash {
            value: kind.to_owned(),
        })?;
        Kind::new(vendor, class)
    }

    /// The vendor, e.g. `nvidia.com`.
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// The class, e.g. `gpu`.
    pub fn class(&self) -> &str {
        &self.class
    }

    /// The fully qualified name of a device of this kind, e.g. `nvidia.com/gpu=0`.
    pub fn qualified(&self, device: &str) -> String {
        format!("{self}={device}")
    }
}

impl Default for Kind {
    /// `nvidia.com/gpu`.
    fn default() -> Self {
        Kind {
            vendor: DEFAULT_VENDOR.to_owned(),
            class: DEFAULT_CLASS.to_owned(),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.vendor, self.class)
    }
}

/// Checks a vendor name (`--vendor`).
pub fn check_vendor(value: &str) -> Result<String, KindError> {
    check("vendor", value)
}

/// Checks a class name (`--class`).
pub fn check_class(value: &str) -> Result<String, KindError> {
    check("class", value)
}

fn check(what: &'static str, value: &str) -> Result<String, KindError> {
    let owned = || value.to_owned();
    let first = value.chars().next().ok_or(KindError::Empty { what })?;
    if !first.is_ascii_alphabetic() {
        return Err(KindError::BadStart {
            what,
            value: owned(),
        });
    }
    if let Some(ch) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(KindError::BadChar {
            what,
            value: owned(),
            ch,
        });
    }
    if value
        .chars()
        .next_back()
        .is_some_and(|c| !c.is_ascii_alphanumeric())
    {
        return Err(KindError::BadEnd {
            what,
            value: owned(),
        });
    }
    Ok(owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_kinds_nvidia_components_use() {
        for kind in [
            "nvidia.com/gpu",
            "management.nvidia.com/gpu",
            "k8s.device-plugin.nvidia.com/gpu",
            "nvidia.com/gpu.coherent",
            "nvidia.com/mig_1",
        ] {
            let parsed = Kind::parse(kind).unwrap();
            assert_eq!(parsed.to_string(), kind);
        }
        assert_eq!(Kind::default().qualified("all"), "nvidia.com/gpu=all");
    }

    #[test]
    fn rejects_names_a_runtime_would_refuse() {
        let cases = [
            ("", "gpu", "vendor must not be empty"),
            (
                "1nvidia.com",
                "gpu",
                "vendor \"1nvidia.com\" must start with a letter",
            ),
            (
                "nvidia.com.",
                "gpu",
                "vendor \"nvidia.com.\" must end with a letter or a digit",
            ),
            (
                "nvidia com",
                "gpu",
                "vendor \"nvidia com\" has ' '; only letters, digits, '-', '_' and '.' are allowed",
            ),
            (
                "nvidia.com",
                "gpu/x",
                "class \"gpu/x\" has '/'; only letters, digits, '-', '_' and '.' are allowed",
            ),
            (
                "nvidia.com",
                "gpu-",
                "class \"gpu-\" must end with a letter or a digit",
            ),
        ];
        for (vendor, class, message) in cases {
            let err = Kind::new(vendor, class).unwrap_err();
            assert_eq!(err.to_string(), message, "{vendor}/{class}");
        }
        assert_eq!(
            Kind::parse("nvidia.com").unwrap_err().to_string(),
            "kind \"nvidia.com\" is not of the form vendor/class"
        );
    }
}
