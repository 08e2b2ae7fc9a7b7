//! A PCI bus id: where a GPU (or an NVSwitch) sits on the PCI bus, parsed once and spelled
//! back the way each consumer needs it.
//!
//! The same address has several spellings: NVML writes `00000000:3B:00.0` (eight-digit domain,
//! upper-case hex), sysfs names the device `0000:3b:00.0` (four-digit domain, lower case), and
//! the driver's kernel-log lines say `PCI:0000:3b:00` (no function) or `3b:00.0` (no domain).
//! [`PciBusId`] is the one type for all of them: comparing and hashing use the parsed address,
//! so two spellings of one device are equal, and named methods give each consumer its form —
//! [`PciBusId::nvml`] for the inventory JSON and the exporter's `pci_bus_id` label,
//! [`PciBusId::sysfs`] for paths under `/sys/bus/pci/devices`.
//!
//! Text that is not a bus id (an empty string for a GPU lost before discovery read it, or a
//! spelling a future driver invents) is kept as given rather than dropped, so the inventory
//! still shows what NVML said; such an id equals only the same text.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A parsed PCI address: domain, bus, device (0-31) and function (0-7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl PciAddress {
    /// Parses any spelling NVML, sysfs or the kernel log uses: an optional `PCI:` prefix, an
    /// optional domain of up to eight hex digits (0 when absent), two-digit bus and device,
    /// and an optional one-digit function (0 when absent). Hex digits in either case.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text
            .strip_prefix("PCI:")
            .or_else(|| text.strip_prefix("pci:"))
            .unwrap_or(text);
        let (main, function) = match text.split_once('.') {
            Some((main, function)) => (main, parse_hex(function, 1)?),
            None => (text, 0),
        };
        let mut parts = main.split(':');
        let (first, second, third) = (parts.next()?, parts.next()?, parts.next());
        if parts.next().is_some() {
            return None;
        }
        let (domain, bus, device) = match third {
            Some(device) => (parse_hex(first, 8)?, second, device),
            None => (0, first, second),
        };
        let address = Self {
            domain,
            bus: u8::try_from(parse_hex(bus, 2)?).ok()?,
            device: u8::try_from(parse_hex(device, 2)?).ok()?,
            function: u8::try_from(function).ok()?,
        };
        (address.device < 32 && address.function < 8).then_some(address)
    }
}

/// 1 to `max_digits` hex digits, nothing else.
fn parse_hex(text: &str, max_digits: usize) -> Option<u32> {
    if text.is_empty() || text.len() > max_digits || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(text, 16).ok()
}

/// A device's PCI bus id; see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciBusId(Repr);

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Repr {
    Address(PciAddress),
    /// Not a bus id; the text as given (empty when the id is unknown).
    Unparsed(String),
}

impl PciBusId {
    /// A bus id from any of its spellings (surrounding whitespace ignored); `None` for text
    /// that is not one.
    pub fn parse(text: &str) -> Option<Self> {
        PciAddress::parse(text.trim()).map(Self::from)
    }

    /// The bus id as NVML (or a file written from it) gave it: parsed when it is one, kept as
    /// given otherwise.
    pub fn from_nvml(text: &str) -> Self {
        Self::parse(text).unwrap_or_else(|| Self(Repr::Unparsed(text.to_owned())))
    }

    /// The id of a device whose bus id is not known (NVML refused even its handle); spelled
    /// as an empty string.
    pub fn unknown() -> Self {
        Self(Repr::Unparsed(String::new()))
    }

    /// Whether nothing is known (see [`PciBusId::unknown`]).
    pub fn is_unknown(&self) -> bool {
        matches!(&self.0, Repr::Unparsed(text) if text.is_empty())
    }

    /// The parsed address, when the id is one.
    pub fn address(&self) -> Option<PciAddress> {
        match &self.0 {
            Repr::Address(address) => Some(*address),
            Repr::Unparsed(_) => None,
        }
    }

    /// NVML's spelling, `00000000:3B:00.0` (the format of `nvmlPciInfo_t.busId`): what the
    /// inventory JSON and the exporter's `pci_bus_id` label carry. Unparsed text as given.
    pub fn nvml(&self) -> Cow<'_, str> {
        match &self.0 {
            Repr::Address(a) => Cow::Owned(format!(
                "{:08X}:{:02X}:{:02X}.{:X}",
                a.domain, a.bus, a.device, a.function
            )),
            Repr::Unparsed(text) => Cow::Borrowed(text),
        }
    }

    /// The device's name under `/sys/bus/pci/devices`, `0000:3b:00.0` (four-digit domain,
    /// lower case); `None` when the id is not a parsed address.
    pub fn sysfs(&self) -> Option<String> {
        self.address().map(|a| {
            format!(
                "{:04x}:{:02x}:{:02x}.{:x}",
                a.domain, a.bus, a.device, a.function
            )
        })
    }
}

impl From<PciAddress> for PciBusId {
    fn from(address: PciAddress) -> Self {
        Self(Repr::Address(address))
    }
}

impl Default for PciBusId {
    fn default() -> Self {
        Self::unknown()
    }
}

impl From<&str> for PciBusId {
    fn from(text: &str) -> Self {
        Self::from_nvml(text)
    }
}

impl From<String> for PciBusId {
    fn from(text: String) -> Self {
        Self::from_nvml(&text)
    }
}

/// NVML's spelling, as [`PciBusId::nvml`].
impl fmt::Display for PciBusId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.nvml())
    }
}

/// As NVML's spelling, so the inventory JSON reads as NVML wrote it.
impl Serialize for PciBusId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.nvml())
    }
}

impl<'de> Deserialize<'de> for PciBusId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = Cow::<'de, str>::deserialize(deserializer)?;
        Ok(Self::from_nvml(&text))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn every_spelling_parses_to_nvmls_form() {
        let cases = [
            ("PCI:0000:3b:00", "00000000:3B:00.0"),
            ("pci:0000:3b:00", "00000000:3B:00.0"),
            ("0000:3b:00", "00000000:3B:00.0"),
            ("PCI:0000:3b:00.0", "00000000:3B:00.0"),
            ("0000:3b:00.1", "00000000:3B:00.1"),
            ("3b:00.0", "00000000:3B:00.0"),
            ("00000000:3B:00.0", "00000000:3B:00.0"),
            ("0018:01:00", "00000018:01:00.0"),
            ("PCI:0000:10:1c", "00000000:10:1C.0"),
            (" 0000:3b:00.0 ", "00000000:3B:00.0"),
        ];
        for (raw, want) in cases {
            let id = PciBusId::parse(raw);
            assert_eq!(
                id.as_ref().map(|id| id.nvml()),
                Some(want.into()),
                "{raw:?}"
            );
        }
    }

    #[test]
    fn what_is_not_a_bus_id_does_not_parse() {
        for raw in [
            "",
            "PCI:",
            "3b",
            "0000:3b:20",
            "0000:3b:00.8",
            "0000:3b:00.",
            "000000000:3b:00",
            "0000:3bb:00",
            "0000:3b:00:00",
            "zz:00.0",
            "0000:3b:00.0.0",
            "GPU-3b:00",
        ] {
            assert_eq!(PciBusId::parse(raw), None, "{raw:?}");
        }
    }

    #[test]
    fn spellings_of_one_device_are_equal_and_hash_alike() {
        let nvml = PciBusId::from_nvml("00000000:3B:00.0");
        let kernel = PciBusId::from_nvml("PCI:0000:3b:00");
        let sysfs = PciBusId::from_nvml("0000:3b:00.0");
        assert_eq!(nvml, kernel);
        assert_eq!(nvml, sysfs);
        let set: HashSet<_> = [nvml, kernel, sysfs].into_iter().collect();
        assert_eq!(set.len(), 1);
        assert_ne!(
            PciBusId::from_nvml("00000000:3B:00.0"),
            PciBusId::from_nvml("00000000:3B:00.1")
        );
    }

    #[test]
    fn sysfs_names_have_a_four_digit_lower_case_domain() {
        let cases = [
            ("00000000:18:00.0", "0000:18:00.0"),
            ("00000001:AB:00.0", "0001:ab:00.0"),
            ("0000:af:00.0", "0000:af:00.0"),
        ];
        for (raw, want) in cases {
            assert_eq!(
                PciBusId::from_nvml(raw).sysfs().as_deref(),
                Some(want),
                "{raw}"
            );
        }
        assert_eq!(PciBusId::unknown().sysfs(), None);
        assert_eq!(
            PciBusId::from_nvml("12:00").sysfs().as_deref(),
            Some("0000:12:00.0")
        );
        assert_eq!(PciBusId::from_nvml("not a bus id").sysfs(), None);
    }

    #[test]
    fn unknown_and_unparsed_ids_keep_their_text() {
        let unknown = PciBusId::unknown();
        assert!(unknown.is_unknown());
        assert_eq!(unknown.nvml(), "");
        assert_eq!(unknown.address(), None);
        let odd = PciBusId::from_nvml("bus-7");
        assert!(!odd.is_unknown());
        assert_eq!(odd.to_string(), "bus-7");
        assert_eq!(odd, PciBusId::from("bus-7"));
        assert_ne!(odd, unknown);
    }

    #[test]
    fn serde_writes_nvmls_spelling_and_reads_any() {
        let id = PciBusId::from_nvml("0000:3b:00.0");
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"00000000:3B:00.0\"");
        let back: PciBusId = serde_json::from_str("\"00000000:3B:00.0\"").unwrap();
        assert_eq!(back, id);
        let unknown: PciBusId = serde_json::from_str("\"\"").unwrap();
        assert!(unknown.is_unknown());
        assert_eq!(serde_json::to_string(&unknown).unwrap(), "\"\"");
    }

    #[test]
    fn ordering_follows_the_bus() {
        let mut ids: Vec<PciBusId> = ["00000000:9A:00.0", "00000000:18:00.0", "00000001:01:00.0"]
            .into_iter()
            .map(PciBusId::from)
            .collect();
        ids.sort();
        let spelled: Vec<String> = ids.iter().map(ToString::to_string).collect();
        assert_eq!(
            spelled,
            ["00000000:18:00.0", "00000000:9A:00.0", "00000001:01:00.0"]
        );
    }
}
