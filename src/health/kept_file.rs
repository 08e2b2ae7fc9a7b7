//! The format of the kept-verdicts file (`<state-dir>/health/<applet>.json`), read in both
//! directions across versions and checked for damage.
//!
//! ```json
//! { "version": 2, "generation": 7, "checksum": "crc32:1c291ca3",
//!   "verdicts": { "boot_id": "…", "gpus": { "GPU-…": { "xids": […], "reset_marks": … } },
//!                 "unproven": { "GPU-…": "why it is held" } } }
//! ```
//!
//! - **Checksum**: CRC-32 (IEEE) of the bytes of `verdicts` exactly as they stand in the file.
//!   A flipped bit, a truncation or an edit fails it, and the file is *damaged*: what it held
//!   is unknown, which never means "healthy" (the caller holds the GPUs it could have covered).
//! - **Newer versions** are read for what this gpud knows: unknown fields anywhere are ignored,
//!   so a field a later gpud adds never makes this one discard the rest. A later gpud adds
//!   fields and never changes what a known one means (it names a new field instead).
//! - **One GPU's entry** this gpud cannot read (a known field of another type) does not discard
//!   the others: that GPU alone is held until there is fresh evidence for it.
//! - **Version 1** (before the checksum) is read as it was written: atomically, by an earlier
//!   gpud; it is replaced by version 2 on the next write.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::tracker::{Kept, KeptXid, ResetMarks};

/// The version this gpud writes.
pub const VERSION: u32 = 2;
/// The version written before files had a checksum.
const LEGACY_VERSION: u32 = 1;
/// The checksum's algorithm, named in the file.
const CHECKSUM_PREFIX: &str = "crc32:";

/// What a file holds, as far as this gpud understands it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdicts {
    /// The boot the verdicts were kept in.
    pub boot_id: String,
    /// By GPU UUID: what only an event proves.
    pub gpus: BTreeMap<String, Kept>,
    /// By GPU UUID: GPUs held out of service until gpud has fresh evidence for them, and why.
    pub unproven: BTreeMap<String, String>,
}

/// A file read back.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The version that wrote it (higher than [`VERSION`] for a newer gpud).
    pub version: u32,
    /// Counts up with every write (0 in a version-1 file).
    pub generation: u64,
    pub verdicts: Verdicts,
}

/// The file's envelope as written.
#[derive(Serialize)]
struct Envelope<'a> {
    version: u32,
    generation: u64,
    checksum: String,
    verdicts: &'a RawValue,
}

/// The file's envelope as read: every field optional, so that a missing one is reported by
/// name; unknown fields ignored.
#[derive(Deserialize)]
struct ReadEnvelope<'a> {
    version: u32,
    #[serde(default)]
    generation: Option<u64>,
    #[serde(default)]
    checksum: Option<String>,
    #[serde(borrow, default)]
    verdicts: Option<&'a RawValue>,
}

/// What is written under `verdicts`.
#[derive(Serialize)]
struct WrittenVerdicts<'a> {
    boot_id: &'a str,
    gpus: &'a BTreeMap<String, Kept>,
    unproven: &'a BTreeMap<String, String>,
}

/// A version-1 file: the verdicts at the top level, no checksum.
#[derive(Deserialize)]
struct LegacyFile {
    boot_id: String,
    gpus: BTreeMap<String, Kept>,
}

/// The bytes of a file holding `verdicts` as `generation`.
pub fn encode(verdicts: &Verdicts, generation: u64) -> Result<Vec<u8>, serde_json::Error> {
    let inner = serde_json::to_string(&WrittenVerdicts {
        boot_id: &verdicts.boot_id,
        gpus: &verdicts.gpus,
        unproven: &verdicts.unproven,
    })?;
    let raw = RawValue::from_string(inner)?;
    let envelope = Envelope {
        version: VERSION,
        generation,
        checksum: format!("{CHECKSUM_PREFIX}{:08x}", crc32(raw.get().as_bytes())),
        verdicts: &raw,
    };
    let mut bytes = serde_json::to_vec_pretty(&envelope)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// What `bytes` hold, or why they are damaged (a sentence naming the field and what is wrong).
pub fn decode(bytes: &[u8]) -> Result<Decoded, String> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err("the file is empty".to_owned());
    }
    let envelope: ReadEnvelope<'_> =
        serde_json::from_slice(bytes).map_err(|err| format!("not a kept-verdicts file: {err}"))?;
    match envelope.version {
        LEGACY_VERSION => decode_legacy(bytes),
        version if version >= VERSION => decode_checked(version, &envelope),
        version => Err(format!(
            "\"version\": {version} is not a version any gpud wrote"
        )),
    }
}

fn decode_legacy(bytes: &[u8]) -> Result<Decoded, String> {
    let file: LegacyFile = serde_json::from_slice(bytes)
        .map_err(|err| format!("not a version-1 kept-verdicts file: {err}"))?;
    Ok(Decoded {
        version: LEGACY_VERSION,
        generation: 0,
        verdicts: Verdicts {
            boot_id: file.boot_id,
            gpus: file.gpus,
            unproven: BTreeMap::new(),
        },
    })
}

fn decode_checked(version: u32, envelope: &ReadEnvelope<'_>) -> Result<Decoded, String> {
    let missing = |field: &str| format!("\"{field}\" is missing");
    let raw = envelope.verdicts.ok_or_else(|| missing("verdicts"))?;
    let checksum = envelope
        .checksum
        .as_deref()
        .ok_or_else(|| missing("checksum"))?;
    let computed = format!("{CHECKSUM_PREFIX}{:08x}", crc32(raw.get().as_bytes()));
    if checksum != computed {
        return Err(format!(
            "\"checksum\" is {checksum:?} but the verdicts hash to {computed:?} (changed on disk)"
        ));
    }
    let generation = envelope.generation.ok_or_else(|| missing("generation"))?;
    let value: serde_json::Value =
        serde_json::from_str(raw.get()).map_err(|err| format!("\"verdicts\": {err}"))?;
    Ok(Decoded {
        version,
        generation,
        verdicts: read_verdicts(&value)?,
    })
}

/// The verdicts this gpud understands of `value`; a GPU entry it cannot read is held.
fn read_verdicts(value: &serde_json::Value) -> Result<Verdicts, String> {
    let boot_id = value
        .get("boot_id")
        .and_then(serde_json::Value::as_str)
        .ok_or("\"verdicts.boot_id\" is missing or not a string")?
        .to_owned();
    let entries = value
        .get("gpus")
        .and_then(serde_json::Value::as_object)
        .ok_or("\"verdicts.gpus\" is missing or not an object")?;
    let mut unproven = match value.get("unproven") {
        None | Some(serde_json::Value::Null) => BTreeMap::new(),
        Some(held) => serde_json::from_value::<BTreeMap<String, String>>(held.clone())
            .map_err(|err| format!("\"verdicts.unproven\": {err}"))?,
    };
    let mut gpus = BTreeMap::new();
    for (uuid, entry) in entries {
        match read_gpu(entry) {
            Ok(kept) => {
                gpus.insert(uuid.clone(), kept);
            }
            Err(why) => {
                unproven.insert(
                    uuid.clone(),
                    format!("its kept verdicts could not be read ({why})"),
                );
            }
        }
    }
    Ok(Verdicts {
        boot_id,
        gpus,
        unproven,
    })
}

/// One GPU's entry: its XIDs must all be read; reset marks that cannot be are left out (the
/// GPU then waits for a reset seen from now on, never the other way round).
fn read_gpu(entry: &serde_json::Value) -> Result<Kept, String> {
    let xids = entry
        .get("xids")
        .and_then(serde_json::Value::as_array)
        .ok_or("\"xids\" is missing or not a list")?
        .iter()
        .map(|xid| {
            serde_json::from_value::<KeptXid>(xid.clone()).map_err(|err| format!("an XID: {err}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let reset_marks = entry
        .get("reset_marks")
        .cloned()
        .and_then(|marks| serde_json::from_value::<Option<ResetMarks>>(marks).ok())
        .flatten();
    Ok(Kept { xids, reset_marks })
}

/// CRC-32 (IEEE 802.3, as zlib computes it) of `bytes`: the file is a few KiB, written a few
/// times per fault, so a bitwise loop is fast enough and needs no table.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFF_u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    fn verdicts() -> Verdicts {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let kept = Kept {
            xids: vec![KeptXid {
                code: 79,
                mig: None,
                since: at,
                last_seen: at,
                occurrences: 2,
            }],
            reset_marks: None,
        };
        Verdicts {
            boot_id: "boot-a".into(),
            gpus: BTreeMap::from([("GPU-2".to_owned(), kept)]),
            unproven: BTreeMap::from([("GPU-3".to_owned(), "why".to_owned())]),
        }
    }

    #[test]
    fn crc32_is_zlibs() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn what_is_written_is_read_back() {
        let bytes = encode(&verdicts(), 7).unwrap();
        let decoded = decode(&bytes).unwrap();
        assert_eq!(decoded.generation, 7);
        assert_eq!(decoded.version, VERSION);
        assert_eq!(decoded.verdicts, verdicts());
    }

    #[test]
    fn every_single_bit_flip_is_caught() {
        let bytes = encode(&verdicts(), 7).unwrap();
        for at in 0..bytes.len() {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[at] ^= 1 << bit;
                if let Ok(read) = decode(&damaged) {
                    // Only the envelope's own fields outside the checksum may change unseen
                    // (whitespace, a digit of the generation); the verdicts never do.
                    assert_eq!(read.verdicts, verdicts(), "bit {bit} of byte {at}");
                }
            }
        }
    }

    #[test]
    fn truncations_empty_and_garbage_are_damage() {
        let bytes = encode(&verdicts(), 7).unwrap();
        for len in 0..bytes.len() - 1 {
            assert!(decode(&bytes[..len]).is_err(), "truncated to {len}");
        }
        assert_eq!(decode(b"").unwrap_err(), "the file is empty");
        assert!(decode(b"\x00\xffgarbage").is_err());
        assert!(decode(b"{\"version\": \"2\"}").is_err());
        assert!(decode(b"{\"version\": 0}").is_err());
    }

    /// A newer gpud's file: a higher version and fields this one does not know, at every
    /// level; one GPU entry with a known field of another type is held, the others are kept.
    #[test]
    fn a_newer_file_is_read_for_what_this_gpud_knows() {
        let mut inner = serde_json::to_value(WrittenVerdicts {
            boot_id: "boot-a",
            gpus: &verdicts().gpus,
            unproven: &BTreeMap::new(),
        })
        .unwrap();
        inner["future"] = serde_json::json!({"a": 1});
        inner["gpus"]["GPU-2"]["future"] = serde_json::json!([1, 2]);
        inner["gpus"]["GPU-2"]["xids"][0]["future"] = serde_json::json!("x");
        inner["gpus"]["GPU-4"] = serde_json::json!({"xids": [{"code": "48"}]});
        let inner = inner.to_string();
        let file = serde_json::json!({
            "version": 99,
            "generation": 12,
            "checksum": format!("crc32:{:08x}", crc32(inner.as_bytes())),
            "verdicts": serde_json::from_str::<serde_json::Value>(&inner).unwrap(),
            "written_by": "gpud 9.9",
        });
        // serde_json keeps the inner text as written only through a raw value: write it so.
        let text = file.to_string().replace(
            &serde_json::from_str::<serde_json::Value>(&inner)
                .unwrap()
                .to_string(),
            &inner,
        );
        let read = decode(text.as_bytes()).unwrap();
        assert_eq!(read.version, 99);
        assert_eq!(read.verdicts.gpus, verdicts().gpus);
        assert!(read.verdicts.unproven["GPU-4"].contains("could not be read"));
    }

    /// The file keeps each XID's code; its typed remedy is the catalog's for that code, so a
    /// restart brings the verdict back with the remedy it had (files of every version,
    /// written before verdicts carried a remedy, included: nothing in them is text).
    #[test]
    fn a_kept_verdict_comes_back_with_its_typed_remedy() {
        use crate::health::tracker::{Tracker, TrackerConfig};
        use crate::inventory::Remedy;
        use crate::xid::catalog::XidPolicy;
        let restored = |kept: &Kept| {
            let mut tracker = Tracker::new(XidPolicy::default(), TrackerConfig::default());
            tracker.restore(2, kept, SystemTime::now());
            tracker.verdict(2).remedy
        };
        let mut written = verdicts();
        written.gpus.get_mut("GPU-2").unwrap().xids[0].code = 95;
        let read = decode(&encode(&written, 1).unwrap()).unwrap();
        assert_eq!(
            restored(&read.verdicts.gpus["GPU-2"]),
            Some(Remedy::ResetGpu)
        );
        let legacy = r#"{"version": 1, "boot_id": "b", "gpus": {"GPU-1": {"xids": [
            {"code": 79, "mig": null, "since": {"secs_since_epoch": 1800000000, "nanos_since_epoch": 0},
             "last_seen": {"secs_since_epoch": 1800000000, "nanos_since_epoch": 0},
             "occurrences": 1}], "reset_marks": null}}}"#;
        let read = decode(legacy.as_bytes()).unwrap();
        assert_eq!(
            restored(&read.verdicts.gpus["GPU-1"]),
            Some(Remedy::RebootNode)
        );
    }

    #[test]
    fn a_version_1_file_is_read() {
        let text = r#"{"version": 1, "boot_id": "b", "gpus": {"GPU-1": {"xids": [], "reset_marks": null}}}"#;
        let read = decode(text.as_bytes()).unwrap();
        assert_eq!(read.generation, 0);
        assert_eq!(read.verdicts.boot_id, "b");
        assert!(read.verdicts.gpus.contains_key("GPU-1"));
    }
}
