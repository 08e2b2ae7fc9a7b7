//! PCI facts NVML does not give, read from sysfs (`<root>/bus/pci/devices/<address>/…`).
//!
//! - The class of each GPU: what tells a compute-only board (3D controller, `0x030200`) from
//!   one with a display engine (VGA controller, `0x030000`). A GPU whose file is missing or
//!   unreadable is simply absent from the result.
//! - The configuration space of every NVIDIA function, where a vGPU shows itself
//!   ([`super::vgpu`]).
//!
//! GFD reads the same files. The root is configurable so tests can lay out a fake tree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::inventory::{PciBusId, Snapshot};

/// Default sysfs mount point.
pub const DEFAULT_SYSFS_ROOT: &str = "/sys";

/// Parses a sysfs `class` file (`0x030200`).
pub fn parse_class(text: &str) -> Option<u32> {
    let text = text.trim();
    let hex = text.strip_prefix("0x").unwrap_or(text);
    u32::from_str_radix(hex, 16).ok()
}

/// Reads the class of every GPU of the snapshot that has one.
pub fn read_classes(sysfs_root: &Path, snapshot: &Snapshot) -> BTreeMap<PciBusId, u32> {
    snapshot
        .gpus
        .iter()
        .filter_map(|gpu| {
            let address = gpu.pci.bus_id.sysfs()?;
            let path = sysfs_root
                .join("bus/pci/devices")
                .join(address)
                .join("class");
            let class = std::fs::read_to_string(path)
                .ok()
                .and_then(|t| parse_class(&t))?;
            Some((gpu.pci.bus_id.clone(), class))
        })
        .collect()
}

/// PCI vendor id of NVIDIA, as sysfs writes it.
pub const NVIDIA_VENDOR: &str = "0x10de";

/// One NVIDIA PCI function and its configuration space as sysfs returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    /// sysfs name, e.g. `0000:18:00.0`.
    pub address: String,
    /// The bytes of `config` (64 when read without privilege, 256 or 4096 with it).
    pub config: Vec<u8>,
}

/// A sysfs file that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {path}: {source}")]
pub struct SysfsError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

fn read(path: PathBuf) -> Result<Vec<u8>, SysfsError> {
    std::fs::read(&path).map_err(|source| SysfsError { path, source })
}

/// Every NVIDIA function (vendor `0x10de`) under `<root>/bus/pci/devices`, in address order,
/// with its configuration space. Any unreadable directory, `vendor` or `config` file is an
/// error, as it is for GFD: the answer would otherwise depend on what could be read.
pub fn nvidia_functions(sysfs_root: &Path) -> Result<Vec<Function>, SysfsError> {
    let dir = sysfs_root.join("bus/pci/devices");
    let entries = std::fs::read_dir(&dir).map_err(|source| SysfsError {
        path: dir.clone(),
        source,
    })?;
    let mut addresses: Vec<String> = entries
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    addresses.sort();
    let mut functions = Vec::new();
    for address in addresses {
        let device = dir.join(&address);
        let vendor = read(device.join("vendor"))?;
        if String::from_utf8_lossy(&vendor).trim() != NVIDIA_VENDOR {
            continue;
        }
        let config = read(device.join("config"))?;
        functions.push(Function { address, config });
    }
    Ok(functions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(parse_class("0x030200\n"), Some(0x030200));
        assert_eq!(parse_class("0x030000"), Some(0x030000));
        assert_eq!(parse_class("junk"), None);
    }

    #[test]
    fn nvidia_functions_in_address_order_skipping_other_vendors() {
        let root = std::env::temp_dir().join(format!("gpud-pci-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let devices = root.join("bus/pci/devices");
        for (address, vendor, config) in [
            ("0000:9a:00.0", "0x10de\n", &[2u8; 256][..]),
            ("0000:00:1f.0", "0x8086\n", &[9u8; 64][..]),
            ("0000:18:00.0", "0x10de\n", &[1u8; 64][..]),
        ] {
            std::fs::create_dir_all(devices.join(address)).unwrap();
            std::fs::write(devices.join(address).join("vendor"), vendor).unwrap();
            std::fs::write(devices.join(address).join("config"), config).unwrap();
        }
        let found = nvidia_functions(&root).unwrap();
        assert_eq!(
            found,
            vec![
                Function {
                    address: "0000:18:00.0".into(),
                    config: vec![1; 64],
                },
                Function {
                    address: "0000:9a:00.0".into(),
                    config: vec![2; 256],
                },
            ]
        );
        std::fs::remove_file(devices.join("0000:9a:00.0/config")).unwrap();
        let err = nvidia_functions(&root).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "cannot read {}: ",
                devices.join("0000:9a:00.0/config").display()
            )),
            "{err}"
        );
        std::fs::remove_dir_all(&root).unwrap();
        let err = nvidia_functions(&root).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("cannot read {}: ", devices.display())),
            "{err}"
        );
    }
}
