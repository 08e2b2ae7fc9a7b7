//! PCI class of each GPU, read from sysfs (`<root>/bus/pci/devices/<bus id>/class`).
//!
//! NVML does not report a device's PCI class, which is what tells a compute-only board
//! (3D controller, `0x030200`) from one with a display engine (VGA controller, `0x030000`);
//! GFD reads sysfs too. The root is configurable so tests can lay out a fake tree; a GPU
//! whose file is missing or unreadable is simply absent from the result.

use std::collections::BTreeMap;
use std::path::Path;

use crate::inventory::Snapshot;

/// Default sysfs mount point.
pub const DEFAULT_SYSFS_ROOT: &str = "/sys";

/// The sysfs name of a PCI device from NVML's bus id: NVML writes an 8-digit domain in upper
/// case (`00000000:18:00.0`), sysfs a 4-digit one in lower case (`0000:18:00.0`).
pub fn sysfs_address(nvml_bus_id: &str) -> Option<String> {
    let (domain, rest) = nvml_bus_id.split_once(':')?;
    let domain = domain.get(domain.len().checked_sub(4)?..)?;
    Some(format!("{domain}:{rest}").to_ascii_lowercase())
}

/// Parses a sysfs `class` file (`0x030200`).
pub fn parse_class(text: &str) -> Option<u32> {
    let text = text.trim();
    let hex = text.strip_prefix("0x").unwrap_or(text);
    u32::from_str_radix(hex, 16).ok()
}

/// Reads the class of every GPU of the snapshot that has one.
pub fn read_classes(sysfs_root: &Path, snapshot: &Snapshot) -> BTreeMap<String, u32> {
    snapshot
        .gpus
        .iter()
        .filter_map(|gpu| {
            let address = sysfs_address(&gpu.pci.bus_id)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            sysfs_address("00000000:18:00.0").as_deref(),
            Some("0000:18:00.0")
        );
        assert_eq!(
            sysfs_address("00000001:AB:00.0").as_deref(),
            Some("0001:ab:00.0")
        );
        assert_eq!(
            sysfs_address("0000:af:00.0").as_deref(),
            Some("0000:af:00.0")
        );
        assert_eq!(sysfs_address(""), None);
        assert_eq!(sysfs_address("12:00.0"), None);
    }

    #[test]
    fn classes() {
        assert_eq!(parse_class("0x030200\n"), Some(0x030200));
        assert_eq!(parse_class("0x030000"), Some(0x030000));
        assert_eq!(parse_class("junk"), None);
    }
}
