//! Decoding header blocks (RFC 7541, sections 5 and 6), with the dynamic table mirrored from
//! the peer's encoder.
//!
//! Every limit the peer could stretch is bounded: integers (28 bits), table size updates (the
//! size the server advertised), and the decoded header list (so a small block of indexed
//! references cannot expand without end).

use super::huffman::{self, HuffmanError};
use super::table::{DynamicTable, STATIC, entry_size};

/// One decoded header field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    pub name: &'a [u8],
    pub value: &'a [u8],
    /// Sent as "never indexed" (section 6.2.3): whoever re-encodes it must keep it so.
    pub sensitive: bool,
}

/// Why a header block could not be decoded; each one is a connection error in HTTP/2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("header block ends inside a field")]
    Truncated,
    #[error("HPACK integer longer than 28 bits")]
    IntegerTooLong,
    #[error("HPACK index {index} is not in the tables (dynamic table holds {entries} entries)")]
    BadIndex { index: usize, entries: usize },
    #[error("dynamic table size update to {requested} bytes exceeds the advertised {limit}")]
    TableTooLarge { requested: usize, limit: usize },
    #[error("dynamic table size update after a header field")]
    LateTableSizeUpdate,
    #[error("decoded header list exceeds {limit} bytes")]
    ListTooLarge { limit: usize },
    #[error(transparent)]
    Huffman(#[from] HuffmanError),
}

/// A header-block decoder for one direction of one connection.
#[derive(Debug)]
pub struct Decoder {
    table: DynamicTable,
    /// The table size the receiver advertised: size updates may not exceed it.
    table_limit: usize,
    /// Most bytes a decoded header list may count (name + value + 32 per field).
    list_limit: usize,
    name: Vec<u8>,
    value: Vec<u8>,
}

/// A string just read: a slice of the block, or Huffman-decoded into a scratch buffer.
enum Str<'a> {
    Raw(&'a [u8]),
    Decoded,
}

impl Decoder {
    /// A decoder whose dynamic table may grow to `table_limit` bytes (the receiver's
    /// SETTINGS_HEADER_TABLE_SIZE) and whose header lists may count `list_limit` bytes.
    pub fn new(table_limit: usize, list_limit: usize) -> Decoder {
        Decoder {
            table: DynamicTable::new(table_limit),
            table_limit,
            list_limit,
            name: Vec::new(),
            value: Vec::new(),
        }
    }

    /// Decodes one complete header block, calling `field` for each field in order, and
    /// applies its dynamic-table changes. After an error the table is no longer in step with
    /// the peer's, so the connection must end.
    pub fn decode(
        &mut self,
        block: &[u8],
        mut field: impl FnMut(Field<'_>),
    ) -> Result<(), DecodeError> {
        let mut rest = block;
        let mut list_size = 0usize;
        let mut fields_seen = false;
        while let Some(&first) = rest.first() {
            if first & 0xe0 == 0x20 {
                // 001xxxxx: dynamic table size update, only before the first field.
                if fields_seen {
                    return Err(DecodeError::LateTableSizeUpdate);
                }
                let requested = read_int(&mut rest, 5)?;
                if requested > self.table_limit {
                    return Err(DecodeError::TableTooLarge {
                        requested,
                        limit: self.table_limit,
                    });
                }
                self.table.set_max_size(requested);
                continue;
            }
            fields_seen = true;
            let decoded = if first & 0x80 != 0 {
                // 1xxxxxxx: indexed field.
                let index = read_int(&mut rest, 7)?;
                let (name, value) = lookup(&self.table, index)?;
                field(Field {
                    name,
                    value,
                    sensitive: false,
                });
                entry_size(name, value)
            } else {
                // 01xxxxxx: literal with incremental indexing; 0000xxxx: without indexing;
                // 0001xxxx: never indexed.
                let (prefix, indexing, sensitive) = match first & 0xf0 {
                    0x00 => (4, false, false),
                    0x10 => (4, false, true),
                    _ => (6, true, false),
                };
                let name_index = read_int(&mut rest, prefix)?;
                let name: &[u8] = if name_index == 0 {
                    match read_string(&mut rest, &mut self.name)? {
                        Str::Raw(raw) => raw,
                        Str::Decoded => &self.name,
                    }
                } else {
                    // Copied: inserting below may evict the entry the name came from.
                    let (name, _) = lookup(&self.table, name_index)?;
                    self.name.clear();
                    self.name.extend_from_slice(name);
                    &self.name
                };
                let value: &[u8] = match read_string(&mut rest, &mut self.value)? {
                    Str::Raw(raw) => raw,
                    Str::Decoded => &self.value,
                };
                field(Field {
                    name,
                    value,
                    sensitive,
                });
                if indexing {
                    self.table.insert(name, value);
                }
                entry_size(name, value)
            };
            list_size += decoded;
            if list_size > self.list_limit {
                return Err(DecodeError::ListTooLarge {
                    limit: self.list_limit,
                });
            }
        }
        Ok(())
    }
}

/// The entry at HPACK `index`: 1 to 61 in the static table, 62 onwards in the dynamic one.
fn lookup(table: &DynamicTable, index: usize) -> Result<(&[u8], &[u8]), DecodeError> {
    let found = match index {
        0 => None,
        1..=61 => STATIC.get(index - 1).copied(),
        _ => table.get(index - 62),
    };
    found.ok_or(DecodeError::BadIndex {
        index,
        entries: table.len(),
    })
}

/// Reads an integer with an N-bit prefix (section 5.1), advancing `rest` past it.
fn read_int(rest: &mut &[u8], prefix_bits: u32) -> Result<usize, DecodeError> {
    let (&first, mut tail) = rest.split_first().ok_or(DecodeError::Truncated)?;
    let max_prefix = (1usize << prefix_bits) - 1;
    let mut value = usize::from(first) & max_prefix;
    if value == max_prefix {
        let mut shift = 0;
        loop {
            let (&byte, next) = tail.split_first().ok_or(DecodeError::Truncated)?;
            tail = next;
            if shift > 21 {
                return Err(DecodeError::IntegerTooLong);
            }
            value += usize::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                break;
            }
        }
    }
    *rest = tail;
    Ok(value)
}

/// Reads a string literal (section 5.2): raw bytes are borrowed from the block, Huffman-coded
/// ones are decoded into `scratch`.
fn read_string<'a>(rest: &mut &'a [u8], scratch: &mut Vec<u8>) -> Result<Str<'a>, DecodeError> {
    let huffman = rest.first().is_some_and(|b| b & 0x80 != 0);
    let len = read_int(rest, 7)?;
    if len > rest.len() {
        return Err(DecodeError::Truncated);
    }
    let (text, tail) = rest.split_at(len);
    *rest = tail;
    if huffman {
        scratch.clear();
        huffman::decode(text, scratch)?;
        Ok(Str::Decoded)
    } else {
        Ok(Str::Raw(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::test_support::hex;

    type Owned = Vec<(String, String, bool)>;

    fn decode(decoder: &mut Decoder, block: &[u8]) -> Result<Owned, DecodeError> {
        let mut out = Vec::new();
        decoder
            .decode(block, |f| {
                out.push((
                    String::from_utf8(f.name.to_vec()).unwrap(),
                    String::from_utf8(f.value.to_vec()).unwrap(),
                    f.sensitive,
                ))
            })
            .map(|()| out)
    }

    fn fields(list: &[(&str, &str)]) -> Owned {
        list.iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned(), false))
            .collect()
    }

    #[test]
    fn rfc_requests_with_huffman_and_dynamic_table_references() {
        // RFC 7541 C.4: three requests on one connection; the second and third refer to
        // entries the first inserted.
        let mut decoder = Decoder::new(4096, 65536);
        let first = decode(&mut decoder, &hex("828684418cf1e3c2e5f23a6ba0ab90f4ff")).unwrap();
        assert_eq!(
            first,
            fields(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ])
        );
        assert_eq!(decoder.table.size(), 57);
        let second = decode(&mut decoder, &hex("828684be5886a8eb10649cbf")).unwrap();
        assert_eq!(second[3], fields(&[(":authority", "www.example.com")])[0]);
        assert_eq!(second[4], fields(&[("cache-control", "no-cache")])[0]);
        let third = decode(
            &mut decoder,
            &hex("828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"),
        )
        .unwrap();
        assert_eq!(
            third,
            fields(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ])
        );
        assert_eq!(decoder.table.len(), 3);
        assert_eq!(decoder.table.size(), 164);
    }

    #[test]
    fn rfc_responses_evict_under_a_small_table() {
        // RFC 7541 C.5: a 256-byte table; the third response evicts two entries. The table is
        // shrunk to 256 with a size update at the start of the first block.
        let mut decoder = Decoder::new(4096, 65536);
        let mut first = hex("3fe101");
        first.extend(hex(
            "4803333032 5807707269766174 65611d4d6f6e2c203231204f637420323031332032303a31333a
             323120474d54 6e1768747470733a2f2f7777772e6578616d706c652e636f6d",
        ));
        let decoded = decode(&mut decoder, &first).unwrap();
        assert_eq!(decoded[0], fields(&[(":status", "302")])[0]);
        assert_eq!(decoder.table.size(), 222);
        let second = decode(&mut decoder, &hex("4803333037c1c0bf")).unwrap();
        assert_eq!(
            second,
            fields(&[
                (":status", "307"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
                ("location", "https://www.example.com"),
            ])
        );
        assert_eq!(decoder.table.size(), 222);
        let cookie = b"foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";
        let mut block = vec![0x88, 0xc1, 0x61, 0x1d];
        block.extend(b"Mon, 21 Oct 2013 20:13:22 GMT");
        block.extend([0xc0, 0x5a, 0x04]);
        block.extend(b"gzip");
        block.extend([0x77, 56]);
        block.extend(cookie);
        let third = decode(&mut decoder, &block).unwrap();
        assert_eq!(third[0], fields(&[(":status", "200")])[0]);
        assert_eq!(third[4], fields(&[("content-encoding", "gzip")])[0]);
        assert_eq!(third[5].1.as_bytes(), cookie);
        assert_eq!(decoder.table.len(), 3);
        assert_eq!(decoder.table.size(), 215);
    }

    #[test]
    fn never_indexed_fields_are_marked_and_not_stored() {
        // 0x10: never indexed, new name "password", value "secret".
        let mut decoder = Decoder::new(4096, 65536);
        let block = hex("1008 70617373776f7264 06 736563726574");
        assert_eq!(
            decode(&mut decoder, &block).unwrap(),
            vec![("password".to_owned(), "secret".to_owned(), true)]
        );
        assert!(decoder.table.is_empty());
    }

    #[test]
    fn table_size_updates_are_bounded_and_come_first() {
        let mut decoder = Decoder::new(4096, 65536);
        // Two updates before the first field are allowed (shrink then grow back).
        decode(&mut decoder, &hex("20 3fe11f 82")).unwrap();
        // 4097 is above the advertised 4096.
        assert_eq!(
            decode(&mut decoder, &hex("3fe21f")),
            Err(DecodeError::TableTooLarge {
                requested: 4097,
                limit: 4096
            })
        );
        assert_eq!(
            decode(&mut decoder, &hex("82 20")),
            Err(DecodeError::LateTableSizeUpdate)
        );
        // Shrinking to zero evicts everything; references to old entries then fail.
        let mut decoder = Decoder::new(4096, 65536);
        decode(&mut decoder, &hex("4001 61 01 62")).unwrap();
        assert_eq!(decoder.table.len(), 1);
        assert_eq!(
            decode(&mut decoder, &hex("20 be")),
            Err(DecodeError::BadIndex {
                index: 62,
                entries: 0
            })
        );
    }

    #[test]
    fn malformed_blocks_are_errors() {
        let mut decoder = Decoder::new(4096, 65536);
        for (block, error) in [
            (
                "80",
                DecodeError::BadIndex {
                    index: 0,
                    entries: 0,
                },
            ),
            (
                "c0",
                DecodeError::BadIndex {
                    index: 64,
                    entries: 0,
                },
            ),
            ("ff", DecodeError::Truncated),
            ("ffffffffff7f", DecodeError::IntegerTooLong),
            ("0003 6162", DecodeError::Truncated),
            ("00", DecodeError::Truncated),
            ("0081 00", DecodeError::Huffman(HuffmanError::Padding)),
            ("0084 ffffffff", DecodeError::Huffman(HuffmanError::Eos)),
        ] {
            assert_eq!(decode(&mut decoder, &hex(block)), Err(error), "{block}");
        }
    }

    #[test]
    fn indexed_references_cannot_expand_past_the_list_limit() {
        let mut decoder = Decoder::new(4096, 2048);
        // One entry counting 1033 bytes; two references to it exceed 2048.
        let mut block = vec![0x40, 0x01, b'x', 0x7f, 0xe9, 0x06]; // value length 1000
        block.extend([b'v'; 1000]);
        decode(&mut decoder, &block).unwrap();
        assert_eq!(
            decode(&mut decoder, &[0xbe]),
            Ok(vec![("x".to_owned(), "v".repeat(1000), false)])
        );
        assert_eq!(
            decode(&mut decoder, &[0xbe, 0xbe]),
            Err(DecodeError::ListTooLarge { limit: 2048 })
        );
    }
}
