//! Device names: how a GPU or MIG device is called after the `=` of a qualified CDI name.
//!
//! The three strategies of `nvidia-ctk cdi generate --device-name-strategy`:
//!
//! | strategy | GPU | MIG device |
//! |---|---|---|
//! | `index` | `0` | `0:1` (GPU index : MIG device index) |
//! | `uuid` | `GPU-…` | `MIG-…` |
//! | `type-index` | `gpu0` | `mig0:1` |
//!
//! A spec carries one device per name, so a GPU named by index and UUID appears twice with the
//! same edits.

use std::fmt;
use std::str::FromStr;

use crate::inventory::model::{Gpu, MigDevice};

/// How devices are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum NameStrategy {
    /// By NVML index: `0`, MIG `0:1`.
    Index,
    /// By UUID: `GPU-…`, MIG `MIG-…`.
    Uuid,
    /// By type and index: `gpu0`, MIG `mig0:1`.
    TypeIndex,
}

/// The strategies used when none is asked for: index and UUID, as `nvidia-ctk` does.
pub const DEFAULT_STRATEGIES: [NameStrategy; 2] = [NameStrategy::Index, NameStrategy::Uuid];

/// A strategy name that does not exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown device name strategy {0:?} (expected index, uuid or type-index)")]
pub struct UnknownStrategy(pub String);

impl NameStrategy {
    /// The name as written on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            NameStrategy::Index => "index",
            NameStrategy::Uuid => "uuid",
            NameStrategy::TypeIndex => "type-index",
        }
    }

    /// The name of a whole GPU.
    pub fn gpu(self, gpu: &Gpu) -> String {
        match self {
            NameStrategy::Index => gpu.index.to_string(),
            NameStrategy::Uuid => gpu.uuid.clone(),
            NameStrategy::TypeIndex => format!("gpu{}", gpu.index),
        }
    }

    /// The name of a MIG device of `parent`.
    pub fn mig(self, parent: &Gpu, mig: &MigDevice) -> String {
        match self {
            NameStrategy::Index => format!("{}:{}", parent.index, mig.index),
            NameStrategy::Uuid => mig.uuid.clone(),
            NameStrategy::TypeIndex => format!("mig{}:{}", parent.index, mig.index),
        }
    }
}

impl fmt::Display for NameStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for NameStrategy {
    type Err = UnknownStrategy;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "index" => Ok(NameStrategy::Index),
            "uuid" => Ok(NameStrategy::Uuid),
            "type-index" => Ok(NameStrategy::TypeIndex),
            other => Err(UnknownStrategy(other.to_owned())),
        }
    }
}

/// The strategies to apply, in the order given, each once; the defaults when `asked` is empty.
pub fn effective(asked: &[NameStrategy]) -> Vec<NameStrategy> {
    let source: &[NameStrategy] = if asked.is_empty() {
        &DEFAULT_STRATEGIES
    } else {
        asked
    };
    let mut out = Vec::with_capacity(source.len());
    for strategy in source {
        if !out.contains(strategy) {
            out.push(*strategy);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_command_line_names() {
        for strategy in [
            NameStrategy::Index,
            NameStrategy::Uuid,
            NameStrategy::TypeIndex,
        ] {
            assert_eq!(strategy.as_str().parse::<NameStrategy>(), Ok(strategy));
        }
        assert_eq!(
            "name".parse::<NameStrategy>().unwrap_err().to_string(),
            "unknown device name strategy \"name\" (expected index, uuid or type-index)"
        );
    }

    #[test]
    fn defaults_to_index_then_uuid_and_drops_repeats() {
        assert_eq!(
            effective(&[]),
            vec![NameStrategy::Index, NameStrategy::Uuid]
        );
        assert_eq!(
            effective(&[
                NameStrategy::Uuid,
                NameStrategy::TypeIndex,
                NameStrategy::Uuid
            ]),
            vec![NameStrategy::Uuid, NameStrategy::TypeIndex]
        );
    }
}
