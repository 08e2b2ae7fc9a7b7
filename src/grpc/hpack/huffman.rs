//! HPACK's Huffman code (RFC 7541, Appendix B), decoding only.
//!
//! The code is canonical: codes are handed out in order of length and, within one length, in
//! order of symbol. So the lengths alone define it, and decoding needs no tree: a code of
//! length `n`, read left-aligned in a 32-bit window, lies below the first code of length
//! `n + 1` (likewise left-aligned) and at or above its own length's first code. Decoding one
//! symbol is a short scan over the lengths, which is cheap because the common characters
//! have codes of 5 to 8 bits.

/// Code length of every symbol: the 256 byte values, then EOS (256).
const LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, // 0..=15
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, // 16..=31
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, // 32..=47
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, // 48..=63
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, // 64..=79
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, // 80..=95
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, // 96..=111
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, // 112..=127
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, // 128..=143
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, // 144..=159
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, // 160..=175
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, // 176..=191
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, // 192..=207
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, // 208..=223
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, // 224..=239
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, // 240..=255
    30, // EOS
];

const EOS: u16 = 256;
const MIN_LEN: usize = 5;
const MAX_LEN: usize = 30;

/// The canonical code laid out for decoding, indexed by code length.
struct Canonical {
    /// First code of each length.
    first: [u32; MAX_LEN + 1],
    /// One past the last code of each length, left-aligned in 32 bits (so `1 << 32` at most).
    limit: [u64; MAX_LEN + 1],
    /// Position in `symbols` of each length's first symbol.
    offset: [u16; MAX_LEN + 1],
    /// Symbols ordered by (code length, symbol).
    symbols: [u16; 257],
}

const fn canonical() -> Canonical {
    let mut count = [0u32; MAX_LEN + 1];
    let mut sym = 0;
    while sym < LENGTHS.len() {
        count[LENGTHS[sym] as usize] += 1;
        sym += 1;
    }
    let mut table = Canonical {
        first: [0; MAX_LEN + 1],
        limit: [0; MAX_LEN + 1],
        offset: [0; MAX_LEN + 1],
        symbols: [0; 257],
    };
    let mut next_code = 0u32;
    let mut placed = 0usize;
    let mut len = 1;
    while len <= MAX_LEN {
        table.first[len] = next_code;
        table.limit[len] = ((next_code + count[len]) as u64) << (32 - len);
        table.offset[len] = placed as u16;
        let mut sym = 0;
        while sym < LENGTHS.len() {
            if LENGTHS[sym] as usize == len {
                table.symbols[placed] = sym as u16;
                placed += 1;
            }
            sym += 1;
        }
        next_code = (next_code + count[len]) << 1;
        len += 1;
    }
    table
}

static CODE: Canonical = canonical();

/// Why a Huffman-coded string was refused (RFC 7541, section 5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HuffmanError {
    #[error("a Huffman-coded string contains the EOS symbol")]
    Eos,
    #[error("a Huffman-coded string ends in padding that is not 0 to 7 one-bits")]
    Padding,
}

/// Appends the decoded bytes of `input` to `out`.
pub fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), HuffmanError> {
    // `acc` holds `bits` not yet decoded bits, right-aligned.
    let mut acc: u64 = 0;
    let mut bits: usize = 0;
    let mut rest = input;
    loop {
        while bits <= 56
            && let Some((&byte, tail)) = rest.split_first()
        {
            acc = (acc << 8) | u64::from(byte);
            bits += 8;
            rest = tail;
        }
        if bits == 0 {
            return Ok(());
        }
        // The next 32 bits, zero-filled past the end of the input.
        let window = if bits >= 32 {
            (acc >> (bits - 32)) & 0xffff_ffff
        } else {
            (acc << (32 - bits)) & 0xffff_ffff
        };
        let mut len = MIN_LEN;
        while len < MAX_LEN && window >= CODE.limit[len] {
            len += 1;
        }
        if len > bits {
            // What is left is shorter than any code it starts: it must be padding, i.e. at most
            // seven bits of EOS's prefix (all ones).
            let all_ones = (1u64 << bits) - 1;
            return if bits <= 7 && acc & all_ones == all_ones {
                Ok(())
            } else {
                Err(HuffmanError::Padding)
            };
        }
        // Codes of `len` bits are consecutive from `first[len]`, so the rank is a difference.
        let code = (window >> (32 - len)) as u32;
        let rank = code - CODE.first[len];
        let symbol = CODE.symbols[usize::from(CODE.offset[len]) + rank as usize];
        if symbol == EOS {
            return Err(HuffmanError::Eos);
        }
        out.push(symbol as u8);
        bits -= len;
        acc &= (1u64 << bits) - 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::test_support::hex;

    fn decoded(input: &[u8]) -> Result<Vec<u8>, HuffmanError> {
        let mut out = Vec::new();
        decode(input, &mut out).map(|()| out)
    }

    /// The code of `symbol` as the canonical layout assigns it.
    fn code_of(symbol: u16) -> (u32, usize) {
        let len = usize::from(LENGTHS[usize::from(symbol)]);
        let start = usize::from(CODE.offset[len]);
        let rank = CODE.symbols[start..]
            .iter()
            .position(|&s| s == symbol)
            .unwrap();
        (CODE.first[len] + rank as u32, len)
    }

    #[test]
    fn canonical_layout_reproduces_the_rfc_codes() {
        // Spot checks against RFC 7541 Appendix B, across the lengths.
        assert_eq!(code_of(0), (0x1ff8, 13));
        assert_eq!(code_of(1), (0x7f_ffd8, 23));
        assert_eq!(code_of(10), (0x3fff_fffc, 30));
        assert_eq!(code_of(u16::from(b' ')), (0x14, 6));
        assert_eq!(code_of(u16::from(b'0')), (0x0, 5));
        assert_eq!(code_of(u16::from(b'a')), (0x3, 5));
        assert_eq!(code_of(u16::from(b'z')), (0x7b, 7));
        assert_eq!(code_of(u16::from(b'~')), (0x1ffd, 13));
        assert_eq!(code_of(255), (0x3ff_ffee, 26));
        assert_eq!(code_of(EOS), (0x3fff_ffff, 30));
        // A complete prefix code: the Kraft sum is exactly one.
        let kraft: u64 = LENGTHS
            .iter()
            .map(|&l| 1u64 << (MAX_LEN - usize::from(l)))
            .sum();
        assert_eq!(kraft, 1 << MAX_LEN);
    }

    #[test]
    fn decodes_the_rfc_examples() {
        // RFC 7541 C.4 and C.6.
        assert_eq!(
            decoded(&hex("f1e3c2e5f23a6ba0ab90f4ff")).unwrap(),
            b"www.example.com"
        );
        assert_eq!(decoded(&hex("a8eb10649cbf")).unwrap(), b"no-cache");
        assert_eq!(decoded(&hex("25a849e95ba97d7f")).unwrap(), b"custom-key");
        assert_eq!(
            decoded(&hex("25a849e95bb8e8b4bf")).unwrap(),
            b"custom-value"
        );
        assert_eq!(decoded(&hex("6402")).unwrap(), b"302");
        assert_eq!(decoded(&hex("aec3771a4b")).unwrap(), b"private");
        assert_eq!(decoded(&[]).unwrap(), b"");
    }

    #[test]
    fn decodes_every_byte_value() {
        // The 256 byte values in order, as an independent HPACK encoder codes them.
        let coded = hex(concat!(
            "ffc7fffd8fffffe2fffffe3fffffe4fffffe5fffffe6fffffe7fffffe8ffffeafffffff3fffffa7fff",
            "ffabffffffdfffffebfffffecfffffedfffffeefffffefffffff0ffffff1ffffff2fffffffbfffffc",
            "ffffffd3fffffd7fffffdbfffffdffffffe3fffffe7fffffebfffffed4fe3f9ffaffcabf1febfafe",
            "fe7fdfd2cbb00089969b71d79fb9f7fff20ffbff3ff50ddbd7f061c58f265cd9f469d5af66dddbf8",
            "71e5f9cff7ff7fffc3ff9ffe45fff4719242cb34e6e9d68a6a3d7dac426defe3cfaf7fffbfe7ffbf",
            "fdffffffcfffe6ffff4bfff9ffffa3fffd3ffff53fffd5ffffb3fffeb7fffdaffffb7ffff73fffee",
            "ffffdeffffebffffbfffffd9ffffdbfffebffffe0ffffeeffffc3ffff8bffff1ffffe4fffee7fffb",
            "1ffff97fffd9ffffcdffff9fffffbffffdafffeeffff4ffffb7fffee7fffe8ffffd3fffdeffffd5f",
            "ffeeffffbdffffe1fffdfffff7fffff5ffffecffff07fff87fffe0ffff17fffedffff87ffff77fff",
            "effffeaffff8bfffe3ffff93ffff87fffcbffff37ffff1fffff83ffffe1fffebfffe3ffff3fffff2",
            "ffffa3ffffd9fffff17ffffc7fffff27ffffdefffffbffffff2fffff8fffffb7fff97fff8fffffe6",
            "fffffc1fffff87ffffe7fffffc5ffffe5fffe4ffff2fffffd1fffff4ffffffefffffe3fffffc9fff",
            "ff97fffb3ffffcffffb7fffcdffff4ffff9ffffd1ffffcffffeaffffafffffddffffeffffff4ffff",
            "f5fffffabffffa7ffffd7fffff9bffffecfffffb7fffff3fffffe8fffffd3fffffabfffff5ffffff",
            "f7ffffecfffffdbfffffbbfffff7ffffff0fffffbbf",
        ));
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decoded(&coded).unwrap(), all);
    }

    #[test]
    fn refuses_bad_padding_and_eos() {
        // 'a' (00011) followed by three zero bits: padding must be ones.
        assert_eq!(decoded(&[0b0001_1000]), Err(HuffmanError::Padding));
        // 'a' then a full byte of ones: padding longer than seven bits.
        assert_eq!(decoded(&[0b0001_1111, 0xff]), Err(HuffmanError::Padding));
        // Only padding, eight bits of it.
        assert_eq!(decoded(&[0xff]), Err(HuffmanError::Padding));
        // EOS (30 ones) then two ones of padding.
        assert_eq!(decoded(&[0xff, 0xff, 0xff, 0xff]), Err(HuffmanError::Eos));
        // 'a' then five ones of padding is fine.
        assert_eq!(decoded(&[0b0001_1111]).unwrap(), b"a");
    }
}
