//! Kernel log parsing for GPU health: `NVRM` lines in, [`KmsgEvent`]s out.
//!
//! This module owns the pure half of the kernel-log watcher: turning one
//! line of text into at most one event. Reading `/dev/kmsg` is
//! `health/sources/kmsg.rs`'s job, merging an XID seen here with NVML's report of
//! it `dedup.rs`'s, and the bus ids it finds are [`PciBusId`]s.
//!
//! Accepted input, one line at a time:
//!
//! * raw `/dev/kmsg` records, `<prio>,<seq>,<timestamp_us>,<flags>;<message>`,
//!   and the ` KEY=value` dictionary lines that may follow them (skipped);
//! * `dmesg` text, with or without a `[ 1234.567890]` timestamp, a `<3>`
//!   level prefix or a `dmesg -T` wall-clock prefix;
//! * journal/syslog text such as `Aug 09 13:32:56 host kernel: NVRM: ...`.
//!
//! Recognised `NVRM` messages (real lines from 535-series drivers):
//!
//! ```text
//! NVRM: Xid (PCI:0000:00:05): 43, pid=1045242, name=pt_main_thread, Ch 00000008
//! NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
//! NVRM: GPU 0000:a1:00.0: GPU has fallen off the bus.
//! NVRM: GPU at PCI:0000:a1:00: GPU-979426f2-893a-7cbb-c4cf-81472f89a462
//! ```
//!
//! plus older forms without the `PCI:` prefix or without `name=`, MIG
//! attribution inside the parentheses (`PCI:0000:3b:00 GPU-I:01 GPU-CI:00`)
//! and the three-line "The NVIDIA GPU ... has fallen off the bus" banner,
//! which needs [`KmsgParser`] to remember one line.
//!
//! Invariants: nothing here panics, allocates without bound, reads the clock
//! or performs I/O. Malformed or unknown input yields `None`, never an error:
//! the kernel log is shared with every other driver and some lines will
//! always be garbage to us. An XID line is only accepted when its code is
//! followed by a comma, so a record cut short after `): 7` is never read as
//! XID 7 when it was XID 79.

use crate::inventory::PciBusId;
use crate::inventory::pci_bus_id::PciAddress;

// === Events ===

/// A GPU-relevant fact extracted from one kernel log line.
///
/// `seq` is the `/dev/kmsg` sequence number and `timestamp_us` the kernel's
/// monotonic timestamp in microseconds; either is `None` when the input
/// format does not carry it (`dmesg -T` text, journal lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KmsgEvent {
    /// `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., <detail>`.
    Xid {
        /// The GPU's bus id (printed `PCI:0000:3b:00`, equal to NVML's `00000000:3B:00.0`).
        pci_bus_id: PciBusId,
        /// The XID code.
        code: u32,
        /// Process the driver attributed the error to, when known.
        pid: Option<u32>,
        /// Name of that process, when known.
        process_name: Option<String>,
        /// MIG GPU instance the driver attributed the error to (`GPU-I:`).
        gpu_instance_id: Option<u32>,
        /// MIG compute instance the driver attributed the error to
        /// (`GPU-CI:`).
        compute_instance_id: Option<u32>,
        /// The rest of the message after the code, pid and name.
        detail: String,
        /// `/dev/kmsg` sequence number.
        seq: Option<u64>,
        /// Kernel timestamp in microseconds since boot.
        timestamp_us: Option<u64>,
    },
    /// The driver lost the GPU: `NVRM: GPU 0000:3b:00.0: GPU has fallen off
    /// the bus.` or the "The NVIDIA GPU ..." banner. Usually printed next
    /// to XID 79, but it means the GPU is lost even when no XID line is
    /// seen (the XID record may have been dropped by a full ring buffer).
    FallenOffBus {
        /// The GPU's bus id.
        pci_bus_id: PciBusId,
        /// `/dev/kmsg` sequence number (of the first line, for the banner).
        seq: Option<u64>,
        /// Kernel timestamp in microseconds since boot.
        timestamp_us: Option<u64>,
    },
    /// `NVRM: GPU at PCI:0000:3b:00: GPU-<uuid>`: the driver names a GPU the
    /// first time it reports an error for it. This is not an error itself,
    /// but it maps a bus id to a UUID even when NVML can no longer reach
    /// the device.
    GpuIdentified {
        /// The GPU's bus id.
        pci_bus_id: PciBusId,
        /// The GPU UUID, `GPU-` followed by 36 characters.
        uuid: String,
        /// `/dev/kmsg` sequence number.
        seq: Option<u64>,
        /// Kernel timestamp in microseconds since boot.
        timestamp_us: Option<u64>,
    },
}

impl KmsgEvent {
    /// The bus id the event is about.
    pub fn pci_bus_id(&self) -> &PciBusId {
        match self {
            Self::Xid { pci_bus_id, .. }
            | Self::FallenOffBus { pci_bus_id, .. }
            | Self::GpuIdentified { pci_bus_id, .. } => pci_bus_id,
        }
    }

    /// The `/dev/kmsg` sequence number, when the input carried one.
    pub fn seq(&self) -> Option<u64> {
        match self {
            Self::Xid { seq, .. }
            | Self::FallenOffBus { seq, .. }
            | Self::GpuIdentified { seq, .. } => *seq,
        }
    }

    /// The kernel timestamp in microseconds, when the input carried one.
    pub fn timestamp_us(&self) -> Option<u64> {
        match self {
            Self::Xid { timestamp_us, .. }
            | Self::FallenOffBus { timestamp_us, .. }
            | Self::GpuIdentified { timestamp_us, .. } => *timestamp_us,
        }
    }
}

// === Parsing entry points ===

/// Parses one line without context.
///
/// Handles every single-line form; the three-line fallen-off-the-bus banner
/// needs [`KmsgParser`].
pub fn parse_line(line: &str) -> Option<KmsgEvent> {
    let record = Record::split(line)?;
    match classify(nvrm_message(record.message)?)? {
        Nvrm::Event(event) => Some(event.into_event(&record)),
        Nvrm::Banner(_) | Nvrm::FallenPhrase => None,
    }
}

/// Parses a whole log, e.g. the output of `dmesg` or a replay fixture.
pub fn parse_text(text: &str) -> Vec<KmsgEvent> {
    let mut parser = KmsgParser::new();
    text.lines().filter_map(|line| parser.feed(line)).collect()
}

/// How many `NVRM` lines after `The NVIDIA GPU <bus id>` may carry its
/// "fallen off the bus" phrase; the driver prints it two lines later.
pub const BANNER_LOOKAHEAD: u8 = 3;

/// Line parser with just enough memory for multi-line driver messages.
///
/// The driver prints its fallen-off-the-bus banner as three records:
///
/// ```text
/// NVRM: The NVIDIA GPU 0000:18:00.0
/// NVRM: (PCI ID: 10de:2901) installed in this system has
/// NVRM: fallen off the bus and is not responding to commands.
/// ```
///
/// The parser keeps the bus id of the last banner (one `String`) until the
/// phrase arrives or [`BANNER_LOOKAHEAD`] further `NVRM` lines have passed
/// without it.
#[derive(Debug, Default)]
pub struct KmsgParser {
    pending: Option<PendingBanner>,
}

/// A banner waiting for its "fallen off the bus" line.
#[derive(Debug)]
struct PendingBanner {
    pci_bus_id: PciBusId,
    seq: Option<u64>,
    timestamp_us: Option<u64>,
    lines_left: u8,
}

impl KmsgParser {
    /// A parser with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the next line of the log.
    pub fn feed(&mut self, line: &str) -> Option<KmsgEvent> {
        let record = Record::split(line)?;
        // Lines from other drivers interleave freely; only NVRM lines count
        // towards the banner's lookahead.
        let message = nvrm_message(record.message)?;
        match classify(message) {
            Some(Nvrm::Event(event)) => {
                self.tick();
                Some(event.into_event(&record))
            }
            Some(Nvrm::Banner(addr)) => {
                self.pending = Some(PendingBanner {
                    pci_bus_id: PciBusId::from(addr),
                    seq: record.seq,
                    timestamp_us: record.timestamp_us,
                    lines_left: BANNER_LOOKAHEAD,
                });
                None
            }
            Some(Nvrm::FallenPhrase) => self.pending.take().map(|banner| KmsgEvent::FallenOffBus {
                pci_bus_id: banner.pci_bus_id,
                seq: banner.seq,
                timestamp_us: banner.timestamp_us,
            }),
            None => {
                self.tick();
                None
            }
        }
    }

    /// Counts one NVRM line against the pending banner.
    fn tick(&mut self) {
        if let Some(banner) = &mut self.pending {
            banner.lines_left = banner.lines_left.saturating_sub(1);
            if banner.lines_left == 0 {
                self.pending = None;
            }
        }
    }
}

// === Records: kmsg framing and text prefixes ===

/// One log line with its framing removed.
#[derive(Debug)]
struct Record<'a> {
    message: &'a str,
    seq: Option<u64>,
    timestamp_us: Option<u64>,
}

impl<'a> Record<'a> {
    /// Splits a line into metadata and message; `None` for dictionary lines
    /// and records whose kmsg header is malformed.
    fn split(line: &'a str) -> Option<Self> {
        let line = line.trim_end_matches(['\n', '\r']);
        if is_dictionary_line(line) {
            return None;
        }
        match line.split_once(';') {
            Some((header, message)) if looks_like_kmsg_header(header) => {
                let (seq, timestamp_us) = parse_kmsg_header(header)?;
                Some(Self {
                    message,
                    seq: Some(seq),
                    timestamp_us: Some(timestamp_us),
                })
            }
            _ => Some(Self {
                message: line,
                seq: None,
                timestamp_us: text_timestamp_us(line),
            }),
        }
    }
}

/// ` KEY=value` lines follow a `/dev/kmsg` record with its device
/// dictionary (e.g. ` SUBSYSTEM=pci`, ` DEVICE=+pci:0000:3b:00.0`).
fn is_dictionary_line(line: &str) -> bool {
    if !line.starts_with(' ') {
        return false;
    }
    let Some((key, _)) = line.trim_start().split_once('=') else {
        return false;
    };
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// A kmsg header is comma-separated and free of spaces, starting with the
/// numeric priority. Anything that looks like one but does not parse is
/// dropped rather than reread as text: it is a damaged record.
fn looks_like_kmsg_header(header: &str) -> bool {
    header.starts_with(|c: char| c.is_ascii_digit())
        && header.contains(',')
        && !header.contains(char::is_whitespace)
}

/// `<prio>,<seq>,<timestamp_us>,<flags>[,...]` → (seq, timestamp_us).
/// Later kernels may append fields, so extra ones are allowed.
fn parse_kmsg_header(header: &str) -> Option<(u64, u64)> {
    let mut fields = header.split(',');
    let _priority: u32 = parse_decimal(fields.next()?)?;
    let seq = parse_decimal(fields.next()?)?;
    let timestamp_us = parse_decimal(fields.next()?)?;
    let _flags = fields.next()?;
    Some((seq, timestamp_us))
}

/// An unsigned decimal made of ASCII digits only (no sign, no spaces).
fn parse_decimal<T: std::str::FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The `[ 1234.567890]` timestamp of a dmesg line, in microseconds: the
/// last bracketed `seconds.fraction` before the `NVRM:` marker. `dmesg -T`
/// and journal prefixes carry wall-clock times, which are not kernel
/// timestamps and are ignored.
fn text_timestamp_us(line: &str) -> Option<u64> {
    let prefix = match find_marker(line) {
        Some(index) => line.get(..index)?,
        None => line,
    };
    let open = prefix.rfind('[')?;
    let inside = prefix.get(open + 1..)?;
    let close = inside.find(']')?;
    parse_seconds_us(inside.get(..close)?.trim())
}

/// `1234.567890` → 1_234_567_890 µs; fractions shorter than six digits are
/// padded, longer ones truncated.
fn parse_seconds_us(text: &str) -> Option<u64> {
    let (seconds, fraction) = text.split_once('.')?;
    let seconds: u64 = parse_decimal(seconds)?;
    if fraction.is_empty() || fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut micros: u64 = 0;
    for index in 0..6 {
        let digit = fraction
            .as_bytes()
            .get(index)
            .map_or(0, |b| u64::from(b - b'0'));
        micros = micros * 10 + digit;
    }
    seconds.checked_mul(1_000_000)?.checked_add(micros)
}

// === NVRM messages ===

const MARKER: &str = "NVRM:";

/// Byte offset of the first `NVRM:` that starts a word.
fn find_marker(text: &str) -> Option<usize> {
    text.match_indices(MARKER)
        .map(|(index, _)| index)
        .find(|&index| {
            text.get(..index)
                .and_then(|before| before.chars().next_back())
                .is_none_or(|c| !c.is_alphanumeric())
        })
}

/// The text after `NVRM: `, if the message is from the NVIDIA driver.
fn nvrm_message(message: &str) -> Option<&str> {
    let index = find_marker(message)?;
    Some(message.get(index + MARKER.len()..)?.trim_start())
}

/// What an NVRM message means to us.
#[derive(Debug)]
enum Nvrm {
    /// A complete event.
    Event(Parsed),
    /// `The NVIDIA GPU <bus id>`: the first line of a banner.
    Banner(PciAddress),
    /// A line saying "fallen off the bus" without a bus id of its own.
    FallenPhrase,
}

/// An event before the record's metadata is attached.
#[derive(Debug)]
enum Parsed {
    Xid {
        addr: PciAddress,
        code: u32,
        pid: Option<u32>,
        process_name: Option<String>,
        gpu_instance_id: Option<u32>,
        compute_instance_id: Option<u32>,
        detail: String,
    },
    FallenOffBus(PciAddress),
    GpuIdentified(PciAddress, String),
}

impl Parsed {
    fn into_event(self, record: &Record<'_>) -> KmsgEvent {
        let (seq, timestamp_us) = (record.seq, record.timestamp_us);
        match self {
            Self::Xid {
                addr,
                code,
                pid,
                process_name,
                gpu_instance_id,
                compute_instance_id,
                detail,
            } => KmsgEvent::Xid {
                pci_bus_id: PciBusId::from(addr),
                code,
                pid,
                process_name,
                gpu_instance_id,
                compute_instance_id,
                detail,
                seq,
                timestamp_us,
            },
            Self::FallenOffBus(addr) => KmsgEvent::FallenOffBus {
                pci_bus_id: PciBusId::from(addr),
                seq,
                timestamp_us,
            },
            Self::GpuIdentified(addr, uuid) => KmsgEvent::GpuIdentified {
                pci_bus_id: PciBusId::from(addr),
                uuid,
                seq,
                timestamp_us,
            },
        }
    }
}

const FALLEN_PHRASE: &str = "fallen off the bus";

/// Recognises one NVRM message; `None` for everything else the driver says.
fn classify(message: &str) -> Option<Nvrm> {
    if let Some(rest) = message.strip_prefix("Xid ") {
        return parse_xid(rest).map(Nvrm::Event);
    }
    if let Some(rest) = message.strip_prefix("GPU at ") {
        return parse_identity(rest).map(Nvrm::Event);
    }
    if let Some(parsed) = message.strip_prefix("GPU ").and_then(parse_gpu_fallen) {
        return Some(Nvrm::Event(parsed));
    }
    if let Some(rest) = message.strip_prefix("The NVIDIA GPU ") {
        let (addr, tail) = take_pci(rest)?;
        return Some(if tail.contains(FALLEN_PHRASE) {
            Nvrm::Event(Parsed::FallenOffBus(addr))
        } else {
            Nvrm::Banner(addr)
        });
    }
    message
        .contains(FALLEN_PHRASE)
        .then_some(Nvrm::FallenPhrase)
}

/// `(PCI:0000:3b:00[ GPU-I:01[ GPU-CI:00]]): 79, [pid=..., ][name=..., ]detail`
fn parse_xid(rest: &str) -> Option<Parsed> {
    let inside_and_tail = rest.trim_start().strip_prefix('(')?;
    let (inside, tail) = inside_and_tail.split_once(')')?;
    let (addr, gpu_instance_id, compute_instance_id) = parse_xid_source(inside)?;

    let tail = tail.strip_prefix(':')?.trim_start();
    let digits_len = tail.bytes().take_while(u8::is_ascii_digit).count();
    let code = parse_decimal(tail.get(..digits_len)?)?;
    // The driver always prints "<code>, "; requiring the comma rejects
    // records truncated inside the number.
    let fields = tail.get(digits_len..)?.strip_prefix(',')?.trim_start();

    let (pid, fields) = match fields.strip_prefix("pid=") {
        Some(value) => {
            let (value, rest) = split_field(value);
            (parse_decimal(value), rest)
        }
        None => (None, fields),
    };
    let (process_name, fields) = match fields.strip_prefix("name=") {
        Some(value) => {
            let (value, rest) = split_field(value);
            (known_value(value).map(str::to_owned), rest)
        }
        None => (None, fields),
    };

    Some(Parsed::Xid {
        addr,
        code,
        pid,
        process_name,
        gpu_instance_id,
        compute_instance_id,
        detail: fields.trim().to_owned(),
    })
}

/// The parenthesised source of an XID: a bus id, then optional MIG
/// attribution. Unknown extra tokens are tolerated so that a future driver
/// adding one does not hide XIDs.
fn parse_xid_source(inside: &str) -> Option<(PciAddress, Option<u32>, Option<u32>)> {
    let mut tokens = inside.split_whitespace();
    let addr = PciAddress::parse(tokens.next()?)?;
    let (mut gi, mut ci) = (None, None);
    for token in tokens {
        if let Some(id) = token.strip_prefix("GPU-I:") {
            gi = parse_decimal(id);
        } else if let Some(id) = token
            .strip_prefix("GPU-CI:")
            .or_else(|| token.strip_prefix("GPU-C:"))
        {
            ci = parse_decimal(id);
        }
    }
    Some((addr, gi, ci))
}

/// Splits `value, rest` at the first comma that ends a field (followed by a
/// space or the end of the message).
fn split_field(text: &str) -> (&str, &str) {
    let bytes = text.as_bytes();
    let end = bytes.iter().enumerate().find_map(|(index, &b)| {
        let ends_field = b == b',' && bytes.get(index + 1).is_none_or(|&next| next == b' ');
        ends_field.then_some(index)
    });
    match end {
        Some(index) => (
            text.get(..index).unwrap_or_default(),
            text.get(index + 1..).unwrap_or_default().trim_start(),
        ),
        None => (text.trim_end(), ""),
    }
}

/// `None` for the driver's placeholders for an unknown pid or name.
fn known_value(value: &str) -> Option<&str> {
    let value = value.trim();
    match value {
        "" | "<unknown>" | "'<unknown>'" => None,
        _ => Some(value),
    }
}

/// `PCI:0000:3b:00: GPU-<uuid>`
fn parse_identity(rest: &str) -> Option<Parsed> {
    let (addr, tail) = take_pci(rest)?;
    let uuid = tail.split_whitespace().next()?;
    is_gpu_uuid(uuid).then(|| Parsed::GpuIdentified(addr, uuid.to_owned()))
}

/// `0000:3b:00.0: GPU has fallen off the bus.`
fn parse_gpu_fallen(rest: &str) -> Option<Parsed> {
    let (addr, tail) = take_pci(rest)?;
    tail.starts_with("GPU has fallen off the bus")
        .then_some(Parsed::FallenOffBus(addr))
}

/// Reads a bus id up to the next whitespace (dropping a trailing `:`) and
/// returns it with the rest of the text.
fn take_pci(text: &str) -> Option<(PciAddress, &str)> {
    let end = text.find(char::is_whitespace).unwrap_or(text.len());
    let token = text.get(..end)?;
    let token = token.strip_suffix(':').unwrap_or(token);
    Some((PciAddress::parse(token)?, text.get(end..)?.trim_start()))
}

/// `GPU-` followed by a canonical 8-4-4-4-12 hex UUID.
fn is_gpu_uuid(text: &str) -> bool {
    let Some(uuid) = text.strip_prefix("GPU-") else {
        return false;
    };
    uuid.len() == 36
        && uuid.char_indices().all(|(index, c)| match index {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEGACY_KMSG: &str = include_str!("../../tests/fixtures/kmsg/legacy.kmsg.log");
    const LEGACY_DMESG: &str = include_str!("../../tests/fixtures/kmsg/legacy.dmesg.log");
    const R535_KMSG: &str = include_str!("../../tests/fixtures/kmsg/r535.kmsg.log");
    const R535_DMESG: &str = include_str!("../../tests/fixtures/kmsg/r535.dmesg.log");
    const R535_DMESG_T: &str = include_str!("../../tests/fixtures/kmsg/r535.dmesg-T.log");
    const GSP_NVLINK5_KMSG: &str = include_str!("../../tests/fixtures/kmsg/gsp-nvlink5.kmsg.log");
    const GSP_NVLINK5_DMESG: &str = include_str!("../../tests/fixtures/kmsg/gsp-nvlink5.dmesg.log");
    const R590_KMSG: &str = include_str!("../../tests/fixtures/kmsg/r590.kmsg.log");
    const R590_DMESG: &str = include_str!("../../tests/fixtures/kmsg/r590.dmesg.log");
    const MIG_KMSG: &str = include_str!("../../tests/fixtures/kmsg/mig.kmsg.log");
    const MIG_DMESG: &str = include_str!("../../tests/fixtures/kmsg/mig.dmesg.log");
    const BANNER_KMSG: &str = include_str!("../../tests/fixtures/kmsg/banner.kmsg.log");
    const BANNER_DMESG: &str = include_str!("../../tests/fixtures/kmsg/banner.dmesg.log");
    const JOURNAL: &str = include_str!("../../tests/fixtures/kmsg/journal.log");
    const GARBAGE: &str = include_str!("../../tests/fixtures/kmsg/garbage.log");

    // --- helpers ---

    fn xid(bus: &str, code: u32, pid: Option<u32>, name: Option<&str>, detail: &str) -> KmsgEvent {
        KmsgEvent::Xid {
            pci_bus_id: PciBusId::from(bus),
            code,
            pid,
            process_name: name.map(str::to_owned),
            gpu_instance_id: None,
            compute_instance_id: None,
            detail: detail.to_owned(),
            seq: None,
            timestamp_us: None,
        }
    }

    fn mig_xid(
        bus: &str,
        code: u32,
        gi: Option<u32>,
        ci: Option<u32>,
        pid: Option<u32>,
        name: Option<&str>,
        detail: &str,
    ) -> KmsgEvent {
        match xid(bus, code, pid, name, detail) {
            KmsgEvent::Xid {
                pci_bus_id,
                code,
                pid,
                process_name,
                detail,
                ..
            } => KmsgEvent::Xid {
                pci_bus_id,
                code,
                pid,
                process_name,
                gpu_instance_id: gi,
                compute_instance_id: ci,
                detail,
                seq: None,
                timestamp_us: None,
            },
            other => other,
        }
    }

    fn fallen(bus: &str) -> KmsgEvent {
        KmsgEvent::FallenOffBus {
            pci_bus_id: PciBusId::from(bus),
            seq: None,
            timestamp_us: None,
        }
    }

    fn identified(bus: &str, uuid: &str) -> KmsgEvent {
        KmsgEvent::GpuIdentified {
            pci_bus_id: PciBusId::from(bus),
            uuid: uuid.to_owned(),
            seq: None,
            timestamp_us: None,
        }
    }

    /// The event with its record metadata cleared.
    fn without_meta(event: &KmsgEvent) -> KmsgEvent {
        let mut event = event.clone();
        match &mut event {
            KmsgEvent::Xid {
                seq, timestamp_us, ..
            }
            | KmsgEvent::FallenOffBus {
                seq, timestamp_us, ..
            }
            | KmsgEvent::GpuIdentified {
                seq, timestamp_us, ..
            } => {
                *seq = None;
                *timestamp_us = None;
            }
        }
        event
    }

    fn meta(events: &[KmsgEvent]) -> Vec<(Option<u64>, Option<u64>)> {
        events
            .iter()
            .map(|event| (event.seq(), event.timestamp_us()))
            .collect()
    }

    /// Checks a raw kmsg fixture and its dmesg twin: same events, the kmsg
    /// one with the given (seq, timestamp) pairs, the dmesg one with the
    /// same timestamps and no sequence numbers.
    fn check_pair(kmsg: &str, dmesg: &str, expected: &[KmsgEvent], kmsg_meta: &[(u64, u64)]) {
        let from_kmsg = parse_text(kmsg);
        let from_dmesg = parse_text(dmesg);
        let stripped: Vec<_> = from_kmsg.iter().map(without_meta).collect();
        assert_eq!(stripped, expected, "kmsg events");
        let stripped: Vec<_> = from_dmesg.iter().map(without_meta).collect();
        assert_eq!(stripped, expected, "dmesg events");

        let want: Vec<_> = kmsg_meta
            .iter()
            .map(|&(seq, ts)| (Some(seq), Some(ts)))
            .collect();
        assert_eq!(meta(&from_kmsg), want, "kmsg metadata");
        let want: Vec<_> = kmsg_meta.iter().map(|&(_, ts)| (None, Some(ts))).collect();
        assert_eq!(meta(&from_dmesg), want, "dmesg metadata");
    }

    // --- fixtures ---

    #[test]
    fn legacy_formats() {
        let expected = [
            xid("00000000:03:00.0", 14, None, None, "Channel 00000001"),
            xid(
                "00000000:01:00.0",
                79,
                Some(1122),
                None,
                "GPU has fallen off the bus.",
            ),
            fallen("00000000:01:00.0"),
            xid(
                "00000000:10:1C.0",
                63,
                Some(1850),
                None,
                "Row Remapper: New row marked for remapping, reset gpu to activate",
            ),
            xid(
                "00000000:02:00.0",
                13,
                None,
                None,
                "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
            ),
        ];
        check_pair(
            LEGACY_KMSG,
            LEGACY_DMESG,
            &expected,
            &[
                (512, 95_317_004_211),
                (520, 95_317_004_310),
                (523, 95_317_004_355),
                (1066, 680_111_646_286),
                (1190, 681_002_117_090),
            ],
        );
    }

    #[test]
    fn r535_formats() {
        let expected = r535_expected();
        check_pair(
            R535_KMSG,
            R535_DMESG,
            &expected,
            &[
                (1893, 284_337_101_004),
                (1895, 284_337_101_377),
                (1901, 284_405_440_012),
                (2330, 646_732_101_550),
                (2333, 646_732_102_002),
                (2871, 1_027_055_033_113),
                (2874, 1_027_055_033_529),
                (3310, 1_160_022_907_001),
                (3311, 1_160_022_907_090),
                (3312, 1_160_022_907_166),
            ],
        );
    }

    fn r535_expected() -> Vec<KmsgEvent> {
        vec![
            identified(
                "00000000:00:05.0",
                "GPU-efbdfde9-5798-a6e7-4c46-12518fa15375",
            ),
            xid(
                "00000000:00:05.0",
                43,
                Some(1_045_242),
                Some("pt_main_thread"),
                "Ch 00000008",
            ),
            xid(
                "00000000:00:05.0",
                43,
                Some(1_084_984),
                Some("pt_main_thread"),
                "Ch 00000008",
            ),
            identified(
                "00000000:00:07.0",
                "GPU-3b6ec030-5adc-1847-e155-79f635584b4e",
            ),
            xid(
                "00000000:00:07.0",
                31,
                Some(2_512_125),
                Some("python3.10"),
                "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 \
                 faulted @ 0x73ac_1c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE",
            ),
            identified(
                "00000000:00:08.0",
                "GPU-c24840ec-8de1-83d5-b126-08000173ae32",
            ),
            xid(
                "00000000:00:08.0",
                94,
                None,
                None,
                "Contained: SM (0x1). RST: No, D-RST: No",
            ),
            identified(
                "00000000:A1:00.0",
                "GPU-979426f2-893a-7cbb-c4cf-81472f89a462",
            ),
            xid(
                "00000000:A1:00.0",
                79,
                None,
                None,
                "GPU has fallen off the bus.",
            ),
            fallen("00000000:A1:00.0"),
        ]
    }

    #[test]
    fn r535_dmesg_wall_clock_text() {
        let events = parse_text(R535_DMESG_T);
        assert_eq!(events, r535_expected());
    }

    #[test]
    fn gsp_and_nvlink5_formats() {
        let expected = [
            xid(
                "00000000:9B:00.0",
                119,
                Some(2_024_380),
                Some("nvidia-smi"),
                "Timeout after 6s of waiting for RPC response from GPU4 GSP!",
            ),
            xid(
                "00000002:00:00.0",
                119,
                Some(1_582_259),
                Some("nvc:[driver]"),
                "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function \
                 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
            ),
            xid(
                "00000000:01:00.0",
                119,
                None,
                None,
                "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function \
                 76 (GSP_RM_CONTROL) sequence 1321",
            ),
            xid(
                "00000018:01:00.0",
                145,
                Some(876_767),
                Some("ray::WorkerDict"),
                "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 \
                 0x00000000 0x00100000 0x00000004)",
            ),
            xid(
                "00000009:01:00.0",
                149,
                None,
                None,
                "NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 \
                 0x00000000 0x00000000 0x00000000)",
            ),
            xid(
                "00000009:01:00.0",
                154,
                None,
                None,
                "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
            ),
            xid(
                "00000019:01:00.0",
                149,
                None,
                None,
                "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 \
                 0x00000000 0x00000000)",
            ),
            xid(
                "00000019:01:00.0",
                154,
                None,
                None,
                "GPU recovery action changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset \
                 Required)",
            ),
            xid("00000000:02:00.0", 154, None, None, "Node Reboot Required"),
        ];
        check_pair(
            GSP_NVLINK5_KMSG,
            GSP_NVLINK5_DMESG,
            &expected,
            &[
                (40_211, 170_912_448_551),
                (40_212, 170_950_002_001),
                (40_213, 170_990_100_450),
                (52_877, 171_167_500_114),
                (52_880, 171_167_620_236),
                (52_881, 171_167_621_162),
                (52_990, 171_167_897_001),
                (52_991, 171_167_897_562),
                (53_010, 171_170_000_321),
            ],
        );
    }

    #[test]
    fn r590_preemptive_cleanup() {
        let py = Some("python3");
        let expected = [
            xid(
                "00000000:DC:00.0",
                45,
                Some(1_818_990),
                py,
                "Ch 00000001 caused by previous Xid 149",
            ),
            xid(
                "00000000:ED:00.0",
                45,
                Some(1_818_992),
                py,
                "Ch 0000000c caused by previous Xid 145",
            ),
            xid(
                "00000000:BA:00.0",
                45,
                Some(1_818_989),
                py,
                "Ch 00000002 caused by previous Xid 145",
            ),
            xid(
                "00000000:97:00.0",
                45,
                Some(1_818_987),
                py,
                "Ch 00000003 caused by previous Xid 145",
            ),
        ];
        check_pair(
            R590_KMSG,
            R590_DMESG,
            &expected,
            &[
                (88_101, 600_412_003_118),
                (88_102, 600_412_003_377),
                (88_103, 600_412_003_560),
                (88_104, 600_412_003_781),
            ],
        );
    }

    #[test]
    fn mig_attribution() {
        let expected = [
            mig_xid(
                "00000000:3B:00.0",
                43,
                Some(1),
                Some(0),
                Some(40_112),
                Some("python3"),
                "Ch 00000008",
            ),
            mig_xid(
                "00000000:3B:00.0",
                31,
                Some(2),
                None,
                Some(40_377),
                Some("pt_main_thread"),
                "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_2 \
                 faulted @ 0x7f3a_d2000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
            ),
            mig_xid(
                "00000000:3B:00.0",
                94,
                Some(13),
                Some(0),
                None,
                None,
                "Contained: SM (0x1). RST: No, D-RST: No",
            ),
            mig_xid(
                "00000000:3B:00.0",
                13,
                None,
                None,
                Some(40_911),
                Some("python3"),
                "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Illegal Instruction \
                 Encoding",
            ),
        ];
        check_pair(
            MIG_KMSG,
            MIG_DMESG,
            &expected,
            &[
                (7_001, 88_213_440_101),
                (7_004, 88_290_117_345),
                (7_010, 88_355_000_912),
                (7_012, 88_360_250_000),
            ],
        );
    }

    #[test]
    fn fallen_off_the_bus_banner() {
        let expected = [
            fallen("00000000:18:00.0"),
            fallen("00000000:3B:00.0"),
            fallen("00000000:29:00.0"),
            fallen("00000000:18:00.0"),
        ];
        check_pair(
            BANNER_KMSG,
            BANNER_DMESG,
            &expected,
            &[
                (901, 52_003_118_210),
                (910, 52_101_000_004),
                (915, 52_200_411_777),
                (916, 52_200_411_801),
            ],
        );
    }

    #[test]
    fn journal_and_syslog_prefixes() {
        let events = parse_text(JOURNAL);
        let stripped: Vec<_> = events.iter().map(without_meta).collect();
        assert_eq!(
            stripped,
            [
                xid(
                    "00000000:01:00.0",
                    79,
                    Some(1122),
                    None,
                    "GPU has fallen off the bus.",
                ),
                fallen("00000000:01:00.0"),
                xid(
                    "00000000:10:1C.0",
                    63,
                    Some(1850),
                    None,
                    "Row Remapper: New row marked for remapping, reset gpu to activate",
                ),
                xid(
                    "00000000:DC:00.0",
                    45,
                    Some(1_818_990),
                    Some("python3"),
                    "Ch 00000001 caused by previous Xid 149",
                ),
                xid(
                    "00000000:00:06.0",
                    31,
                    Some(79_749),
                    Some("exe"),
                    "Ch 0000000a, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 \
                     GPCCLIENT_T1_7 faulted @ 0x2b57_b3000000. Fault is of type FAULT_PDE \
                     ACCESS_TYPE_VIRT_WRITE",
                ),
            ]
        );
        // Only the bracketed kernel time is a timestamp; wall-clock
        // prefixes are not.
        assert_eq!(
            meta(&events),
            [
                (None, None),
                (None, None),
                (None, Some(680_111_646_286)),
                (None, None),
                (None, None),
            ]
        );
    }

    #[test]
    fn garbage_yields_nothing() {
        assert!(GARBAGE.lines().count() > 40);
        assert_eq!(parse_text(GARBAGE), []);
        for line in GARBAGE.lines() {
            assert_eq!(parse_line(line), None, "{line:?}");
        }
    }

    #[test]
    fn every_fixture_line_is_parsed_without_panicking() {
        for text in [
            LEGACY_KMSG,
            LEGACY_DMESG,
            R535_KMSG,
            R535_DMESG,
            R535_DMESG_T,
            GSP_NVLINK5_KMSG,
            GSP_NVLINK5_DMESG,
            R590_KMSG,
            R590_DMESG,
            MIG_KMSG,
            MIG_DMESG,
            BANNER_KMSG,
            BANNER_DMESG,
            JOURNAL,
            GARBAGE,
        ] {
            for line in text.lines() {
                // Every prefix and suffix, to shake out slicing at odd
                // boundaries (multi-byte characters included).
                for (index, _) in line.char_indices() {
                    let _ = parse_line(line.get(..index).unwrap_or_default());
                    let _ = parse_line(line.get(index..).unwrap_or_default());
                }
            }
        }
    }

    // --- single lines ---

    #[test]
    fn kmsg_record_with_extra_header_fields() {
        let line = "4,77,123456789,-,caller=T1234;NVRM: Xid (PCI:0000:3b:00): 48, pid=7, \
                    name=train, DBE (0x1) detected";
        let Some(event) = parse_line(line) else {
            panic!("no event for {line:?}");
        };
        assert_eq!(event.seq(), Some(77));
        assert_eq!(event.timestamp_us(), Some(123_456_789));
        assert_eq!(
            without_meta(&event),
            xid(
                "00000000:3B:00.0",
                48,
                Some(7),
                Some("train"),
                "DBE (0x1) detected"
            )
        );
    }

    #[test]
    fn pid_and_name_variants() {
        let cases: &[(&str, Option<u32>, Option<&str>, &str)] = &[
            (
                "79, pid='<unknown>', name=<unknown>, lost",
                None,
                None,
                "lost",
            ),
            (
                "79, pid=<unknown>, name=<unknown>, lost",
                None,
                None,
                "lost",
            ),
            ("79, pid=12, lost", Some(12), None, "lost"),
            ("79, pid=12, name=a b, lost", Some(12), Some("a b"), "lost"),
            ("79, pid=12, name=x,y, lost", Some(12), Some("x,y"), "lost"),
            ("79, pid=12, name=train, ", Some(12), Some("train"), ""),
            ("79, pid=12, name=train,", Some(12), Some("train"), ""),
            ("79, pid=12", Some(12), None, ""),
            ("79, ", None, None, ""),
            ("79,lost", None, None, "lost"),
        ];
        for &(tail, pid, name, detail) in cases {
            let line = format!("NVRM: Xid (PCI:0000:3b:00): {tail}");
            assert_eq!(
                parse_line(&line),
                Some(xid("00000000:3B:00.0", 79, pid, name, detail)),
                "{line:?}"
            );
        }
    }

    #[test]
    fn dmesg_timestamps() {
        let cases = [
            (
                "[ 1234.567890] NVRM: Xid (0000:3b:00): 79, x",
                Some(1_234_567_890),
            ),
            (
                "[111111111.111] NVRM: Xid (0000:3b:00): 79, x",
                Some(111_111_111_111_000),
            ),
            (
                "<3>[    5.000001] NVRM: Xid (0000:3b:00): 79, x",
                Some(5_000_001),
            ),
            ("[1.1234567] NVRM: Xid (0000:3b:00): 79, x", Some(1_123_456)),
            (
                "[Fri Aug  9 13:32:56 2024] NVRM: Xid (0000:3b:00): 79, x",
                None,
            ),
            ("NVRM: Xid (0000:3b:00): 79, x [1.5]", None),
        ];
        for (line, want) in cases {
            let event = parse_line(line);
            assert_eq!(event.and_then(|e| e.timestamp_us()), want, "{line:?}");
        }
    }

    #[test]
    fn dictionary_lines_are_skipped() {
        let mut parser = KmsgParser::new();
        for line in [" SUBSYSTEM=pci", " DEVICE=+pci:0000:3b:00.0", " K_2=v"] {
            assert_eq!(parser.feed(line), None);
        }
        // An indented dmesg continuation is text, not a dictionary line.
        assert_eq!(
            parse_line("                 NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."),
            Some(fallen("00000000:3B:00.0"))
        );
    }

    #[test]
    fn banner_expires() {
        let mut parser = KmsgParser::new();
        assert_eq!(parser.feed("NVRM: The NVIDIA GPU 0000:18:00.0"), None);
        for _ in 0..BANNER_LOOKAHEAD {
            assert_eq!(parser.feed("NVRM: something else"), None);
        }
        assert_eq!(
            parser.feed("NVRM: fallen off the bus and is not responding to commands."),
            None
        );
    }

    #[test]
    fn banner_ignores_other_drivers_in_between() {
        let mut parser = KmsgParser::new();
        assert_eq!(parser.feed("NVRM: The NVIDIA GPU 0000:18:00.0"), None);
        for _ in 0..10 {
            assert_eq!(parser.feed("eth0: link up"), None);
        }
        assert_eq!(
            parser.feed("NVRM: fallen off the bus and is not responding to commands."),
            Some(fallen("00000000:18:00.0"))
        );
        // Consumed: a second phrase line has no banner left.
        assert_eq!(parser.feed("NVRM: fallen off the bus."), None);
    }

    #[test]
    fn sxid_lines_are_not_xids() {
        let line = "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 \
                    egress non-posted PRIV error (First)";
        assert_eq!(parse_line(line), None);
    }

    #[test]
    fn accessors() {
        let event = KmsgEvent::GpuIdentified {
            pci_bus_id: PciBusId::from("00000000:3B:00.0"),
            uuid: "GPU-979426f2-893a-7cbb-c4cf-81472f89a462".to_owned(),
            seq: Some(3),
            timestamp_us: Some(4),
        };
        assert_eq!(event.pci_bus_id().to_string(), "00000000:3B:00.0");
        assert_eq!(event.seq(), Some(3));
        assert_eq!(event.timestamp_us(), Some(4));
    }
}
