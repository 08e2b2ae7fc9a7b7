//! vGPU detection from PCI configuration space, for GFD's `nvidia.com/vgpu.*` labels.
//!
//! Inside a VM, a vGPU is an NVIDIA PCI function whose vendor-specific capability (capability
//! id `0x09` in the standard capability list) carries the signature `VF` at bytes 3–4. After
//! the signature come records `[id, length, payload…]`, where `length` counts the whole
//! record; the record with id 0 holds the host's vGPU manager driver version (10 bytes) then
//! its branch (10 bytes), NUL-padded, e.g. `550.90.05` and `r550_00`.
//!
//! NVML cannot tell a guest this (it reports the guest driver), so GFD reads the config space
//! from sysfs, and so does gpud: [`detect`] is the pure part over already read config spaces;
//! [`crate::labeller::pci::nvidia_functions`] reads them. Reading needs privilege: without it
//! sysfs returns only the first 64 bytes, which is reported as a problem, not as "no vGPU".

use std::fmt;

use super::pci::Function;

/// Bytes of the standard PCI configuration header plus capability area GFD insists on.
pub const CONFIG_SPACE_STANDARD: usize = 256;
/// PCI status register (low byte) and its "capability list present" bit.
const STATUS: usize = 0x06;
const STATUS_CAPABILITY_LIST: u8 = 0x10;
/// Offset of the pointer to the first capability.
const CAPABILITY_POINTER: usize = 0x34;
/// Capability id of a vendor-specific capability.
const VENDOR_SPECIFIC: u8 = 0x09;
/// A capability id that means the chain is broken (unreadable config space reads as 0xff).
const BROKEN: u8 = 0xff;
/// The vGPU signature at bytes 3–4 of the vendor-specific capability.
const SIGNATURE: [u8; 2] = *b"VF";
/// Where the records start inside the capability.
const RECORDS: usize = 5;
/// Id of the host driver record, and the widths of its two fields.
const HOST_DRIVER_RECORD: u8 = 0;
const VERSION_LEN: usize = 10;
const BRANCH_LEN: usize = 10;

/// The vGPU manager driver of the host a vGPU runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDriver {
    /// e.g. `550.90.05`.
    pub version: String,
    /// e.g. `r550_00`.
    pub branch: String,
}

/// What the node's NVIDIA PCI functions say about vGPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vgpu {
    /// No NVIDIA function carries the vGPU signature.
    Absent,
    /// A vGPU, on a host with this driver (the last vGPU's, in address order, as GFD does).
    Present(HostDriver),
    /// The config spaces could not be read or parsed; the reason names the device and
    /// offset. Labelled as no vGPU, as GFD does since v0.15.
    Unknown(String),
}

/// Why one function's configuration space cannot be interpreted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// Fewer bytes than the standard header (an unprivileged read returns 64).
    Short { len: usize },
    /// A capability or record reaches past the bytes read.
    OutOfBounds { what: &'static str, offset: usize },
    /// A record whose length cannot be right.
    BadLength {
        what: &'static str,
        offset: usize,
        length: usize,
    },
    /// The records end without a host driver record.
    NoHostDriver,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Short { len } => write!(
                f,
                "only {len} bytes of PCI configuration space readable, {CONFIG_SPACE_STANDARD} \
                 needed (reading it takes privilege)"
            ),
            ConfigError::OutOfBounds { what, offset } => {
                write!(f, "{what} at offset {offset:#x} runs past the data read")
            }
            ConfigError::BadLength {
                what,
                offset,
                length,
            } => write!(
                f,
                "{what} at offset {offset:#x} has invalid length {length}"
            ),
            ConfigError::NoHostDriver => {
                f.write_str("the vGPU capability has no host driver record (record id 0)")
            }
        }
    }
}

/// The vendor-specific capability of a configuration space (its id byte first, `length`
/// bytes long), or `None` when the capability list has none.
pub fn vendor_capability(config: &[u8]) -> Result<Option<&[u8]>, ConfigError> {
    if config.len() < CONFIG_SPACE_STANDARD {
        return Err(ConfigError::Short { len: config.len() });
    }
    if config[STATUS] & STATUS_CAPABILITY_LIST == 0 {
        return Ok(None);
    }
    // Each offset is a byte, so the chain visits at most 256 capabilities before repeating.
    let mut visited = [false; 256];
    let mut offset = usize::from(config[CAPABILITY_POINTER]);
    while offset != 0 && !visited[offset] {
        visited[offset] = true;
        let header = config
            .get(offset..offset + 3)
            .ok_or(ConfigError::OutOfBounds {
                what: "capability header",
                offset,
            })?;
        let (id, next, length) = (header[0], header[1], usize::from(header[2]));
        if id == BROKEN {
            break;
        }
        if id == VENDOR_SPECIFIC {
            return config
                .get(offset..offset + length)
                .map(Some)
                .ok_or(ConfigError::OutOfBounds {
                    what: "vendor-specific capability",
                    offset,
                });
        }
        offset = usize::from(next);
    }
    Ok(None)
}

/// Whether a vendor-specific capability is a vGPU's.
pub fn is_vgpu(capability: &[u8]) -> bool {
    capability.get(3..5) == Some(&SIGNATURE[..])
}

/// The host driver record of a vGPU's capability. Records before it are skipped by their
/// length; every length is checked against the capability's bytes.
pub fn host_driver(capability: &[u8]) -> Result<HostDriver, ConfigError> {
    let mut offset = RECORDS;
    loop {
        let Some(&id) = capability.get(offset) else {
            return Err(ConfigError::NoHostDriver);
        };
        let length = usize::from(*capability.get(offset + 1).ok_or(ConfigError::OutOfBounds {
            what: "record header",
            offset,
        })?);
        if id == HOST_DRIVER_RECORD {
            if length < 2 + VERSION_LEN + BRANCH_LEN {
                return Err(ConfigError::BadLength {
                    what: "host driver record",
                    offset,
                    length,
                });
            }
            let payload =
                capability
                    .get(offset + 2..offset + length)
                    .ok_or(ConfigError::OutOfBounds {
                        what: "host driver record",
                        offset,
                    })?;
            return Ok(HostDriver {
                version: nul_padded(&payload[..VERSION_LEN]),
                branch: nul_padded(&payload[VERSION_LEN..VERSION_LEN + BRANCH_LEN]),
            });
        }
        if length < 2 {
            return Err(ConfigError::BadLength {
                what: "record",
                offset,
                length,
            });
        }
        if offset + length > capability.len() {
            return Err(ConfigError::OutOfBounds {
                what: "record",
                offset,
            });
        }
        offset += length;
    }
}

/// A fixed-width text field without its NUL padding (GFD trims NULs at both ends).
fn nul_padded(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim_matches('\0').to_owned()
}

/// The host driver when this configuration space is a vGPU's, `None` when it is not one.
pub fn parse_config(config: &[u8]) -> Result<Option<HostDriver>, ConfigError> {
    match vendor_capability(config)? {
        Some(capability) if is_vgpu(capability) => host_driver(capability).map(Some),
        _ => Ok(None),
    }
}

/// The verdict over every NVIDIA function of the node, in address order.
pub fn detect(functions: &[Function]) -> Vgpu {
    let mut found = None;
    for function in functions {
        match parse_config(&function.config) {
            Ok(Some(driver)) => found = Some(driver),
            Ok(None) => {}
            Err(err) => return Vgpu::Unknown(format!("PCI device {}: {err}", function.address)),
        }
    }
    found.map_or(Vgpu::Absent, Vgpu::Present)
}

#[cfg(test)]
#[path = "vgpu_tests.rs"]
mod tests;
