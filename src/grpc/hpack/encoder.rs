//! Encoding header fields without touching the receiver's dynamic table.
//!
//! A field goes out as a static-table index when name and value both match, else as a literal
//! "without indexing" (or "never indexed" when it arrived so), with the name as a static index
//! where it has one. Strings are sent raw, not Huffman-coded: the receiver decodes them for
//! free and the block stays within a frame for any header list the server accepts anyway.
//! Nothing is ever inserted into the receiver's table, so its state does not depend on ours.

use super::decoder::Field;
use super::table::{StaticMatch, find_static};

/// Appends `field` to a header block.
pub fn encode_field(out: &mut Vec<u8>, field: Field<'_>) {
    let found = find_static(field.name, field.value);
    if !field.sensitive
        && let Some(StaticMatch::Field(index)) = found
    {
        write_int(out, 0x80, 7, index);
        return;
    }
    // 0000xxxx: literal without indexing; 0001xxxx: never indexed.
    let pattern = if field.sensitive { 0x10 } else { 0x00 };
    match found {
        Some(StaticMatch::Field(index) | StaticMatch::Name(index)) => {
            write_int(out, pattern, 4, index);
        }
        None => {
            out.push(pattern);
            write_string(out, field.name);
        }
    }
    write_string(out, field.value);
}

/// Appends an integer with an N-bit prefix (section 5.1); `pattern` holds the bits above it.
fn write_int(out: &mut Vec<u8>, pattern: u8, prefix_bits: u32, value: usize) {
    let max_prefix = (1usize << prefix_bits) - 1;
    if value < max_prefix {
        out.push(pattern | value as u8);
        return;
    }
    out.push(pattern | max_prefix as u8);
    let mut rest = value - max_prefix;
    while rest >= 0x80 {
        out.push((rest & 0x7f) as u8 | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Appends a raw (not Huffman-coded) string literal.
fn write_string(out: &mut Vec<u8>, text: &[u8]) {
    write_int(out, 0x00, 7, text.len());
    out.extend_from_slice(text);
}

#[cfg(test)]
mod tests {
    use super::super::decoder::Decoder;
    use super::*;

    fn field<'a>(name: &'a [u8], value: &'a [u8], sensitive: bool) -> Field<'a> {
        Field {
            name,
            value,
            sensitive,
        }
    }

    #[test]
    fn exact_bytes_for_each_representation() {
        let mut out = Vec::new();
        encode_field(&mut out, field(b":method", b"POST", false));
        assert_eq!(out, [0x83]);
        out.clear();
        encode_field(&mut out, field(b":authority", b"localhost", false));
        assert_eq!(out, b"\x01\x09localhost");
        out.clear();
        encode_field(&mut out, field(b"te", b"trailers", false));
        assert_eq!(out, b"\x00\x02te\x08trailers");
        out.clear();
        encode_field(&mut out, field(b"authorization", b"secret", true));
        assert_eq!(out, b"\x1f\x08\x06secret");
        out.clear();
        // A sensitive field stays a literal even when the static table has it whole.
        encode_field(&mut out, field(b":method", b"POST", true));
        assert_eq!(out, b"\x13\x04POST");
    }

    #[test]
    fn long_values_use_multi_byte_lengths_and_round_trip() {
        let long = vec![b'v'; 1000];
        let fields = [
            field(b":path", b"/v1beta1.DevicePlugin/Allocate", false),
            field(b"x-long", &long, false),
            field(b"cookie", b"a=b", true),
            field(b":scheme", b"http", false),
        ];
        let mut block = Vec::new();
        for f in fields {
            encode_field(&mut block, f);
        }
        let mut decoder = Decoder::new(4096, 65536);
        let mut decoded = Vec::new();
        decoder
            .decode(&block, |f| {
                decoded.push((f.name.to_vec(), f.value.to_vec(), f.sensitive))
            })
            .unwrap();
        let expected: Vec<_> = fields
            .iter()
            .map(|f| (f.name.to_vec(), f.value.to_vec(), f.sensitive))
            .collect();
        assert_eq!(decoded, expected);
    }
}
