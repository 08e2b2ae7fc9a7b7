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
mod tests {
    //! Table tests of vGPU detection on hand-built PCI configuration spaces.

    use super::*;

    /// A 256-byte configuration space with NVIDIA's vendor id and the capabilities `caps` chained
    /// from offset 0x40, 0x20 bytes apart; each is `(id, bytes after the next pointer)`.
    fn config(caps: &[(u8, Vec<u8>)]) -> Vec<u8> {
        let mut c = vec![0u8; 256];
        c[0..2].copy_from_slice(&0x10deu16.to_le_bytes());
        c[2..4].copy_from_slice(&0x2330u16.to_le_bytes());
        if !caps.is_empty() {
            c[STATUS] = STATUS_CAPABILITY_LIST;
            c[CAPABILITY_POINTER] = 0x40;
        }
        for (i, (id, body)) in caps.iter().enumerate() {
            let at = 0x40 + 0x20 * i;
            let next = if i + 1 < caps.len() { at + 0x20 } else { 0 };
            c[at] = *id;
            c[at + 1] = next as u8;
            c[at + 2..at + 2 + body.len()].copy_from_slice(body);
        }
        c
    }

    /// A vendor-specific capability body (length byte first) holding `payload` after its header.
    fn vendor(payload: &[u8]) -> (u8, Vec<u8>) {
        let mut body = vec![(3 + payload.len()) as u8];
        body.extend_from_slice(payload);
        (VENDOR_SPECIFIC, body)
    }

    /// The `VF` signature followed by `records`.
    fn vgpu(records: &[u8]) -> (u8, Vec<u8>) {
        let mut payload = b"VF".to_vec();
        payload.extend_from_slice(records);
        vendor(&payload)
    }

    /// A host driver record: id 0, length 22, two NUL-padded 10-byte fields.
    fn host_record(version: &str, branch: &str) -> Vec<u8> {
        let mut r = vec![HOST_DRIVER_RECORD, 22];
        for field in [version, branch] {
            let mut bytes = field.as_bytes().to_vec();
            bytes.resize(10, 0);
            r.extend_from_slice(&bytes);
        }
        r
    }

    fn driver(version: &str, branch: &str) -> HostDriver {
        HostDriver {
            version: version.into(),
            branch: branch.into(),
        }
    }

    /// What parsing one configuration space gives.
    type Verdict = Result<Option<HostDriver>, ConfigError>;

    #[test]
    fn configuration_spaces() {
        let power_management = (0x01, vec![0x03, 0x00]);
        let express = (0x10, vec![0x02, 0x00]);
        let cases: Vec<(&str, Vec<u8>, Verdict)> = vec![
            ("no capability list", config(&[]), Ok(None)),
            (
                "capabilities but no vendor-specific one",
                config(&[power_management.clone(), express.clone()]),
                Ok(None),
            ),
            (
                "passthrough GPU: vendor-specific capability without the signature",
                config(&[
                    power_management.clone(),
                    vendor(&[0x01, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00]),
                ]),
                Ok(None),
            ),
            (
                "vGPU, host driver record first",
                config(&[vgpu(&host_record("550.90.05", "r550_00"))]),
                Ok(Some(driver("550.90.05", "r550_00"))),
            ),
            (
                "vGPU behind other capabilities, an unknown record skipped",
                config(&[
                    power_management.clone(),
                    express.clone(),
                    vgpu(
                        &[
                            [0x07, 0x04, 0xaa, 0xbb].as_slice(),
                            &host_record("580.95.02", "r581_36"),
                        ]
                        .concat(),
                    ),
                ]),
                Ok(Some(driver("580.95.02", "r581_36"))),
            ),
            (
                "only 64 bytes readable (no privilege)",
                config(&[vgpu(&host_record("550.90.05", "r550_00"))])[..64].to_vec(),
                Err(ConfigError::Short { len: 64 }),
            ),
            (
                "vGPU without a host driver record",
                // The records end with the capability, not with the configuration space.
                config(&[vgpu(&[0x07, 0x03, 0xaa])]),
                Err(ConfigError::NoHostDriver),
            ),
            (
                "record of length 0",
                config(&[vgpu(&[0x07, 0x00, 0xaa])]),
                Err(ConfigError::BadLength {
                    what: "record",
                    offset: 5,
                    length: 0,
                }),
            ),
            (
                "record of length 1",
                config(&[vgpu(&[0x07, 0x01])]),
                Err(ConfigError::BadLength {
                    what: "record",
                    offset: 5,
                    length: 1,
                }),
            ),
            (
                "host driver record shorter than its fields",
                config(&[vgpu(&[HOST_DRIVER_RECORD, 12, b'5', b'5', b'0'])]),
                Err(ConfigError::BadLength {
                    what: "host driver record",
                    offset: 5,
                    length: 12,
                }),
            ),
            (
                "capability longer than the configuration space",
                {
                    let mut c = config(&[vgpu(&host_record("550.90.05", "r550_00"))]);
                    c[0x42] = 0xff;
                    c
                },
                Err(ConfigError::OutOfBounds {
                    what: "vendor-specific capability",
                    offset: 0x40,
                }),
            ),
            (
                "capability header at the last byte",
                {
                    let mut c = config(&[]);
                    c[STATUS] = STATUS_CAPABILITY_LIST;
                    c[CAPABILITY_POINTER] = 0xff;
                    c
                },
                Err(ConfigError::OutOfBounds {
                    what: "capability header",
                    offset: 0xff,
                }),
            ),
            (
                "a chain that loops ends without a capability",
                {
                    let mut c = config(&[power_management.clone(), express.clone()]);
                    c[0x61] = 0x40;
                    c
                },
                Ok(None),
            ),
            (
                "a broken chain (id 0xff) ends without a capability",
                config(&[
                    (0xff, vec![0x00]),
                    vgpu(&host_record("550.90.05", "r550_00")),
                ]),
                Ok(None),
            ),
        ];
        for (name, bytes, want) in cases {
            assert_eq!(parse_config(&bytes), want, "{name}");
        }
    }

    /// The first 256 bytes of `config` of a real H200 passed through to a VM (0000:00:06.0,
    /// driver 580.159.04): power management, MSI, PCI Express and MSI-X capabilities, no
    /// vendor-specific one.
    const H200_PASSTHROUGH: &str = "\
    de10352346051000a1000203000000000c000002401000000c00000000100000\
    0c0000004010000000000000de10bf18000000004000000000000000ff010000\
    0148130008000000056088030000000000000000000000000000000000000000\
    10b0020021802c11345100000579450000000511000000000000000000000000\
    0000000013080700401000003e00800105005e00000000000000000000000000\
    00000000000000000000000000000000110008800000b9000000ba0000000000\
    0000000000000000000000000000000000000000000000000000000000000000\
    0000000000000000000000000000000000000000000000000000000000000000";

    #[test]
    fn a_real_passthrough_h200_is_not_a_vgpu() {
        let hex = H200_PASSTHROUGH;
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(bytes.len(), 256);
        assert_eq!(vendor_capability(&bytes), Ok(None));
        assert_eq!(
            detect(&[function("0000:00:06.0", bytes.clone())]),
            Vgpu::Absent
        );
        // The same device read without privilege.
        assert_eq!(
            parse_config(&bytes[..64]),
            Err(ConfigError::Short { len: 64 })
        );
    }

    #[test]
    fn records_are_bounded_by_the_capability_length() {
        // Inside a capability cut short by its own length byte, a record that would reach past
        // it, or a header cut in half, is malformed even though the config space goes on.
        let cap = [VENDOR_SPECIFIC, 0x00, 7, b'V', b'F', 0x07, 0x09];
        assert_eq!(
            host_driver(&cap),
            Err(ConfigError::OutOfBounds {
                what: "record",
                offset: 5,
            })
        );
        let cap = [VENDOR_SPECIFIC, 0x00, 6, b'V', b'F', 0x07];
        assert_eq!(
            host_driver(&cap),
            Err(ConfigError::OutOfBounds {
                what: "record header",
                offset: 5,
            })
        );
        let cap = [VENDOR_SPECIFIC, 0x00, 5, b'V', b'F'];
        assert_eq!(host_driver(&cap), Err(ConfigError::NoHostDriver));
        let mut cap = vec![VENDOR_SPECIFIC, 0x00, 27, b'V', b'F'];
        cap.extend_from_slice(&host_record("550.90.05", "r550_00"));
        assert_eq!(host_driver(&cap), Ok(driver("550.90.05", "r550_00")));
        assert_eq!(
            host_driver(&cap[..26]),
            Err(ConfigError::OutOfBounds {
                what: "host driver record",
                offset: 5,
            })
        );
        assert!(is_vgpu(&cap));
        assert!(!is_vgpu(&cap[..4]));
    }

    fn function(address: &str, config: Vec<u8>) -> Function {
        Function {
            address: address.into(),
            config,
        }
    }

    #[test]
    fn node_verdict() {
        let plain = config(&[vendor(&[0x01, 0x00])]);
        let vgpu_550 = config(&[vgpu(&host_record("550.90.05", "r550_00"))]);
        let vgpu_580 = config(&[vgpu(&host_record("580.95.02", "r581_36"))]);
        assert_eq!(detect(&[]), Vgpu::Absent);
        assert_eq!(
            detect(&[function("0000:18:00.0", plain.clone())]),
            Vgpu::Absent
        );
        assert_eq!(
            detect(&[
                function("0000:18:00.0", plain.clone()),
                function("0000:19:00.0", vgpu_550.clone()),
            ]),
            Vgpu::Present(driver("550.90.05", "r550_00"))
        );
        // Several vGPUs: the last one's host driver, as GFD's loop leaves it.
        assert_eq!(
            detect(&[
                function("0000:18:00.0", vgpu_550.clone()),
                function("0000:19:00.0", vgpu_580),
            ]),
            Vgpu::Present(driver("580.95.02", "r581_36"))
        );
        // One unreadable function makes the answer unknown.
        assert_eq!(
            detect(&[
                function("0000:18:00.0", vgpu_550),
                function("0000:19:00.0", plain[..64].to_vec()),
            ]),
            Vgpu::Unknown(
                "PCI device 0000:19:00.0: only 64 bytes of PCI configuration space readable, 256 \
             needed (reading it takes privilege)"
                    .into()
            )
        );
    }
}
