//! The client-to-server byte stream of one HTTP/2 connection, with every `:authority` that is
//! not a valid URI authority replaced by `localhost` before h2 parses it.
//!
//! h2 answers a request whose `:authority` does not parse as a URI authority with RST_STREAM
//! PROTOCOL_ERROR, and has no option to relax that. Yet the kubelet before 1.26 sends the
//! socket path there, grpcio a percent-encoded path, grpcurl over unix sockets something
//! similar. No gpud service looks at the authority, so any value is as good as `localhost`.
//!
//! Only HEADERS and CONTINUATION frames are touched; the preface and every other frame pass
//! byte for byte. Each header block is decoded with an HPACK decoder that mirrors the
//! client's dynamic table. As long as no authority needed replacing, the block is forwarded
//! exactly as received, so h2's table stays in step with the client's on its own. From the
//! first replacement on, every block is re-encoded without indexing: h2's dynamic table then
//! never changes again and cannot disagree with anything the client refers to, because every
//! reference is resolved here first.
//!
//! Re-encoded blocks go out in frames of at most 16 384 bytes, the smallest maximum frame size
//! HTTP/2 allows a peer to advertise and h2's default, so they fit whatever h2 advertised.
//! Malformed input is a connection error; a header block is buffered up to 64 KiB at most.

use std::ops::Range;

use tracing::debug;

use super::hpack::{DecodeError, Decoder, Field, encode_field};

/// What every HTTP/2 client sends first (RFC 9113, section 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Largest frame written: HTTP/2's minimum SETTINGS_MAX_FRAME_SIZE, which h2 keeps by default.
pub const MAX_FRAME_SIZE: usize = 16_384;
/// Most bytes of frames (headers, padding and all) one header block may arrive in.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// Most bytes a decoded header list may count (HPACK's accounting). The server refuses lists
/// above 16 KiB anyway; this only bounds the work a tiny block of references can cause.
pub const MAX_HEADER_LIST: usize = 64 * 1024;
/// h2's SETTINGS_HEADER_TABLE_SIZE (the protocol default, which tonic keeps): the most the
/// client's encoder may use.
pub const HEADER_TABLE_SIZE: usize = 4096;
/// What replaces an `:authority` that is not a valid URI authority.
pub const FALLBACK_AUTHORITY: &[u8] = b"localhost";

const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
const PRIORITY_LEN: usize = 5;

/// Why a connection's input was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    #[error("the client did not start with the HTTP/2 connection preface")]
    Preface,
    #[error(
        "stream {stream}: a header block must continue with CONTINUATION on the same stream, \
         got frame type {frame_type:#x} on stream {got}"
    )]
    ExpectedContinuation {
        stream: u32,
        frame_type: u8,
        got: u32,
    },
    #[error("stream {stream}: header block exceeds {MAX_HEADER_BLOCK} bytes")]
    BlockTooLarge { stream: u32 },
    #[error("stream {stream}: HEADERS frame too short for its padding and priority fields")]
    ShortFrame { stream: u32 },
    #[error("stream {stream}: {source}")]
    Hpack {
        stream: u32,
        #[source]
        source: DecodeError,
    },
}

/// Where in the input the rewriter is.
#[derive(Debug, Clone, Copy)]
enum State {
    /// Inside the preface, this many bytes matched.
    Preface(usize),
    /// Collecting a 9-byte frame header.
    FrameHeader,
    /// Passing this many payload bytes of a frame that is not part of a header block.
    Forward(usize),
    /// Buffering this many payload bytes of a HEADERS or CONTINUATION frame.
    HeaderPayload(usize),
}

/// The header block being received.
#[derive(Debug, Default)]
struct Block {
    active: bool,
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; PRIORITY_LEN]>,
    /// The frames carrying the block, exactly as received.
    raw: Vec<u8>,
    /// Where each frame's fragment of the block lies in `raw`.
    fragments: Vec<Range<usize>>,
    /// Start in `raw` of the frame being received.
    frame_start: usize,
}

/// The rewriting state of one connection (sans I/O: bytes in, bytes out).
#[derive(Debug)]
pub struct Rewriter {
    state: State,
    header: [u8; FRAME_HEADER_LEN],
    header_len: usize,
    block: Block,
    decoder: Decoder,
    /// Fragments joined, for a block that spans several frames.
    joined: Vec<u8>,
    /// The block re-encoded.
    encoded: Vec<u8>,
    /// The block's fields while it may still be forwarded as received.
    held: HeldFields,
    authorities: AuthorityCheck,
    /// Set at the first replaced authority; from then on every block is re-encoded.
    rewriting: bool,
}

impl Default for Rewriter {
    fn default() -> Self {
        Rewriter::new()
    }
}

impl Rewriter {
    /// A rewriter for a new connection, expecting the client preface.
    pub fn new() -> Rewriter {
        Rewriter {
            state: State::Preface(0),
            header: [0; FRAME_HEADER_LEN],
            header_len: 0,
            block: Block::default(),
            decoder: Decoder::new(HEADER_TABLE_SIZE, MAX_HEADER_LIST),
            joined: Vec::new(),
            encoded: Vec::new(),
            held: HeldFields::default(),
            authorities: AuthorityCheck::default(),
            rewriting: false,
        }
    }

    /// Whether header blocks are being re-encoded (an authority has been replaced).
    pub fn is_rewriting(&self) -> bool {
        self.rewriting
    }

    /// Consumes `input`, appending what h2 should read to `out`. Bytes of an incomplete
    /// header block are held back until the block is complete. After an error the connection
    /// must be closed.
    pub fn push(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        while !input.is_empty() {
            match self.state {
                State::Preface(seen) => {
                    let n = (PREFACE.len() - seen).min(input.len());
                    if input[..n] != PREFACE[seen..seen + n] {
                        return Err(RewriteError::Preface);
                    }
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.state = if seen + n == PREFACE.len() {
                        State::FrameHeader
                    } else {
                        State::Preface(seen + n)
                    };
                }
                State::FrameHeader => {
                    let n = (FRAME_HEADER_LEN - self.header_len).min(input.len());
                    self.header[self.header_len..self.header_len + n].copy_from_slice(&input[..n]);
                    self.header_len += n;
                    input = &input[n..];
                    if self.header_len == FRAME_HEADER_LEN {
                        self.header_len = 0;
                        self.frame_header(out)?;
                    }
                }
                State::Forward(remaining) => {
                    let n = remaining.min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.state = match remaining - n {
                        0 => State::FrameHeader,
                        left => State::Forward(left),
                    };
                }
                State::HeaderPayload(remaining) => {
                    let n = remaining.min(input.len());
                    self.block.raw.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    match remaining - n {
                        0 => self.header_frame_done(out)?,
                        left => self.state = State::HeaderPayload(left),
                    }
                }
            }
        }
        Ok(())
    }

    /// A complete frame header is in `self.header`.
    fn frame_header(&mut self, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let [l0, l1, l2, kind, flags, s0, s1, s2, s3] = self.header;
        let len = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
        let stream = u32::from_be_bytes([s0, s1, s2, s3]) & 0x7fff_ffff;
        let block = &mut self.block;
        if block.active {
            if kind != CONTINUATION || stream != block.stream {
                return Err(RewriteError::ExpectedContinuation {
                    stream: block.stream,
                    frame_type: kind,
                    got: stream,
                });
            }
        } else if kind == HEADERS {
            block.active = true;
            block.stream = stream;
            block.end_stream = flags & END_STREAM != 0;
            block.priority = None;
            block.raw.clear();
            block.fragments.clear();
        } else {
            // Everything else, a stray CONTINUATION included, is h2's to judge.
            out.extend_from_slice(&self.header);
            self.state = if len == 0 {
                State::FrameHeader
            } else {
                State::Forward(len)
            };
            return Ok(());
        }
        if block.raw.len() + FRAME_HEADER_LEN + len > MAX_HEADER_BLOCK {
            return Err(RewriteError::BlockTooLarge { stream });
        }
        block.frame_start = block.raw.len();
        block.raw.extend_from_slice(&self.header);
        if len == 0 {
            self.header_frame_done(out)
        } else {
            self.state = State::HeaderPayload(len);
            Ok(())
        }
    }

    /// The frame started at `block.frame_start` is complete in `block.raw`.
    fn header_frame_done(&mut self, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let block = &mut self.block;
        let start = block.frame_start;
        let (kind, flags) = (block.raw[start + 3], block.raw[start + 4]);
        let mut lo = start + FRAME_HEADER_LEN;
        let mut hi = block.raw.len();
        if kind == HEADERS {
            let short = RewriteError::ShortFrame {
                stream: block.stream,
            };
            if flags & PADDED != 0 {
                let padding = usize::from(*block.raw.get(lo).ok_or(short.clone())?);
                lo += 1;
                hi = hi.checked_sub(padding).ok_or(short.clone())?;
            }
            if flags & PRIORITY != 0 {
                let fields = block.raw.get(lo..lo + PRIORITY_LEN).ok_or(short.clone())?;
                let mut priority = [0; PRIORITY_LEN];
                priority.copy_from_slice(fields);
                block.priority = Some(priority);
                lo += PRIORITY_LEN;
            }
            if lo > hi {
                return Err(short);
            }
        }
        block.fragments.push(lo..hi);
        if flags & END_HEADERS != 0 {
            self.finish_block(out)
        } else {
            self.state = State::FrameHeader;
            Ok(())
        }
    }

    /// The block is complete: decode it, then forward it as it came or re-encoded.
    fn finish_block(&mut self, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        self.state = State::FrameHeader;
        let Rewriter {
            block,
            decoder,
            joined,
            encoded,
            held,
            authorities,
            rewriting,
            ..
        } = self;
        block.active = false;
        let fragment: &[u8] = match block.fragments.as_slice() {
            [only] => &block.raw[only.clone()],
            several => {
                joined.clear();
                for range in several {
                    joined.extend_from_slice(&block.raw[range.clone()]);
                }
                joined
            }
        };
        encoded.clear();
        held.clear();
        let mut rewrite = *rewriting;
        decoder
            .decode(fragment, |field| {
                let replace = field.name == b":authority" && !authorities.is_valid(field.value);
                if !rewrite {
                    if !replace {
                        // Likely forwarded as received: keep the field, do not encode it yet.
                        held.push(field);
                        return;
                    }
                    debug!(
                        authority = %String::from_utf8_lossy(field.value),
                        "Client sent an :authority that is not a URI authority; using localhost"
                    );
                    rewrite = true;
                    held.encode_into(encoded);
                }
                let value = if replace {
                    FALLBACK_AUTHORITY
                } else {
                    field.value
                };
                encode_field(encoded, Field { value, ..field });
            })
            .map_err(|source| RewriteError::Hpack {
                stream: block.stream,
                source,
            })?;
        *rewriting = rewrite;
        if *rewriting {
            write_frames(out, block, encoded);
        } else {
            out.extend_from_slice(&block.raw);
        }
        Ok(())
    }
}

/// Whether h2 accepts `value` as a request's `:authority` (it parses it exactly so).
pub fn valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// [`valid_authority`], remembering the last valid value: a client sends the same authority
/// on every request, and parsing it costs an allocation.
#[derive(Debug, Default)]
struct AuthorityCheck {
    last_valid: Vec<u8>,
}

impl AuthorityCheck {
    fn is_valid(&mut self, value: &[u8]) -> bool {
        if value == self.last_valid.as_slice() && !value.is_empty() {
            return true;
        }
        let valid = valid_authority(value);
        if valid {
            self.last_valid.clear();
            self.last_valid.extend_from_slice(value);
        }
        valid
    }
}

/// Decoded fields of the block being read, copied so they can still be encoded if a later
/// field of the same block turns out to need replacing. Copying is cheaper than encoding, which
/// most blocks never need.
#[derive(Debug, Default)]
struct HeldFields {
    bytes: Vec<u8>,
    /// Per field: name length, value length, sensitive.
    fields: Vec<(usize, usize, bool)>,
}

impl HeldFields {
    fn clear(&mut self) {
        self.bytes.clear();
        self.fields.clear();
    }

    fn push(&mut self, field: Field<'_>) {
        self.bytes.extend_from_slice(field.name);
        self.bytes.extend_from_slice(field.value);
        self.fields
            .push((field.name.len(), field.value.len(), field.sensitive));
    }

    /// Encodes every held field, in order, and forgets them.
    fn encode_into(&mut self, out: &mut Vec<u8>) {
        let mut rest = self.bytes.as_slice();
        for &(name_len, value_len, sensitive) in &self.fields {
            let (name, tail) = rest.split_at(name_len);
            let (value, tail) = tail.split_at(value_len);
            rest = tail;
            encode_field(
                out,
                Field {
                    name,
                    value,
                    sensitive,
                },
            );
        }
        self.clear();
    }
}

/// Writes a re-encoded block as HEADERS (keeping END_STREAM and the priority fields, dropping
/// padding) and as many CONTINUATION frames as the frame size requires.
fn write_frames(out: &mut Vec<u8>, block: &Block, encoded: &[u8]) {
    let priority_len = if block.priority.is_some() {
        PRIORITY_LEN
    } else {
        0
    };
    let (first, mut rest) = encoded.split_at(encoded.len().min(MAX_FRAME_SIZE - priority_len));
    let mut flags = 0;
    if block.end_stream {
        flags |= END_STREAM;
    }
    if block.priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    frame_header(
        out,
        priority_len + first.len(),
        HEADERS,
        flags,
        block.stream,
    );
    if let Some(priority) = &block.priority {
        out.extend_from_slice(priority);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME_SIZE));
        let flags = if tail.is_empty() { END_HEADERS } else { 0 };
        frame_header(out, chunk.len(), CONTINUATION, flags, block.stream);
        out.extend_from_slice(chunk);
        rest = tail;
    }
}

fn frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    // `len` is at most MAX_FRAME_SIZE, so it fits the 24-bit field.
    let len = (len as u32).to_be_bytes();
    out.extend_from_slice(&[len[1], len[2], len[3], kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::test_support::hex;

    /// A frame as a client would send it.
    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let len = (payload.len() as u32).to_be_bytes();
        out.extend_from_slice(&[len[1], len[2], len[3], kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// A literal field with incremental indexing and a new name, as some clients send.
    fn indexed_literal(name: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = vec![0x40, name.len() as u8];
        out.extend_from_slice(name);
        out.push(value.len() as u8);
        out.extend_from_slice(value);
        out
    }

    /// `:authority` as a literal with incremental indexing (name: static index 1).
    fn authority(value: &[u8]) -> Vec<u8> {
        let mut out = vec![0x41];
        assert!(value.len() < 127);
        out.push(value.len() as u8);
        out.extend_from_slice(value);
        out
    }

    /// POST, http, the Allocate path: static and literal without indexing.
    fn request_start() -> Vec<u8> {
        let mut out = vec![0x83, 0x86, 0x04, 30];
        out.extend_from_slice(b"/v1beta1.DevicePlugin/Allocate");
        out
    }

    const SETTINGS: [u8; 9] = [0, 0, 0, 0x4, 0, 0, 0, 0, 0];

    fn connection(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut out = PREFACE.to_vec();
        out.extend_from_slice(&SETTINGS);
        for f in frames {
            out.extend_from_slice(f);
        }
        out
    }

    /// Runs `input` through a rewriter, `chunk` bytes at a time.
    fn rewrite(input: &[u8], chunk: usize) -> Result<(Vec<u8>, bool), RewriteError> {
        let mut rewriter = Rewriter::new();
        let mut out = Vec::new();
        for piece in input.chunks(chunk) {
            rewriter.push(piece, &mut out)?;
        }
        Ok((out, rewriter.is_rewriting()))
    }

    /// What h2 sees: the frames after the preface, header blocks decoded with a fresh
    /// decoder in order (as h2's own would), other frames kept whole.
    #[derive(Debug, PartialEq)]
    enum Seen {
        Headers {
            stream: u32,
            flags: u8,
            priority: Option<Vec<u8>>,
            fields: Vec<(String, String, bool)>,
            frames: usize,
        },
        Other(Vec<u8>),
    }

    /// A header block being reassembled by `parse`.
    struct Pending {
        stream: u32,
        flags: u8,
        priority: Option<Vec<u8>>,
        block: Vec<u8>,
        frames: usize,
    }

    fn parse(output: &[u8]) -> Vec<Seen> {
        assert_eq!(&output[..24], PREFACE);
        let mut rest = &output[24..];
        let mut decoder = Decoder::new(HEADER_TABLE_SIZE, MAX_HEADER_LIST);
        let mut seen = Vec::new();
        let mut pending: Option<Pending> = None;
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            assert!(len <= MAX_FRAME_SIZE, "frame of {len} bytes");
            let (kind, flags) = (rest[3], rest[4]);
            let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
            let payload = &rest[9..9 + len];
            let whole = rest[..9 + len].to_vec();
            rest = &rest[9 + len..];
            let (fragment, done) = match kind {
                HEADERS => {
                    assert!(pending.is_none());
                    let mut lo = 0;
                    let mut hi = payload.len();
                    if flags & PADDED != 0 {
                        hi -= usize::from(payload[0]);
                        lo = 1;
                    }
                    let priority = (flags & PRIORITY != 0).then(|| {
                        lo += 5;
                        payload[lo - 5..lo].to_vec()
                    });
                    pending = Some(Pending {
                        stream,
                        flags,
                        priority,
                        block: Vec::new(),
                        frames: 0,
                    });
                    (&payload[lo..hi], flags & END_HEADERS != 0)
                }
                CONTINUATION => (payload, flags & END_HEADERS != 0),
                _ => {
                    assert!(pending.is_none());
                    seen.push(Seen::Other(whole));
                    continue;
                }
            };
            let entry = pending.as_mut().unwrap();
            assert_eq!(entry.stream, stream);
            entry.block.extend_from_slice(fragment);
            entry.frames += 1;
            if done {
                let Pending {
                    stream,
                    flags,
                    priority,
                    block,
                    frames,
                } = pending.take().unwrap();
                let mut fields = Vec::new();
                decoder
                    .decode(&block, |f| {
                        fields.push((
                            String::from_utf8(f.name.to_vec()).unwrap(),
                            String::from_utf8(f.value.to_vec()).unwrap(),
                            f.sensitive,
                        ))
                    })
                    .unwrap();
                seen.push(Seen::Headers {
                    stream,
                    flags: flags & !(END_HEADERS | PADDED),
                    priority,
                    fields,
                    frames,
                });
            }
        }
        assert!(pending.is_none());
        seen
    }

    fn fields_of(seen: &Seen) -> Vec<(&str, &str)> {
        match seen {
            Seen::Headers { fields, .. } => fields
                .iter()
                .map(|(n, v, _)| (n.as_str(), v.as_str()))
                .collect(),
            Seen::Other(_) => panic!("not a header block: {seen:?}"),
        }
    }

    const ALLOCATE: [(&str, &str); 4] = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/v1beta1.DevicePlugin/Allocate"),
        (":authority", "localhost"),
    ];

    #[test]
    fn valid_authorities_pass_byte_for_byte() {
        for value in [
            &b"localhost"[..],
            b"nvidia-gpu.sock",
            b"127.0.0.1:5000",
            b"[::1]:80",
        ] {
            let mut block = request_start();
            block.extend(authority(value));
            block.extend(indexed_literal(b"te", b"trailers"));
            let input = connection(&[
                frame(HEADERS, END_HEADERS, 1, &block),
                frame(0x0, END_STREAM, 1, b"\0\0\0\0\x02\x0a\x00"),
                frame(0x8, 0, 0, &[0, 0, 0, 1]),
            ]);
            for chunk in [1, 7, input.len()] {
                let (out, rewriting) = rewrite(&input, chunk).unwrap();
                assert_eq!(out, input, "{value:?} in chunks of {chunk}");
                assert!(!rewriting);
            }
        }
    }

    #[test]
    fn paths_and_percent_encoded_paths_become_localhost() {
        let huffman_percent = hex(
            "54587b8ec545868346a8b0f5b632d054aa2c3217b98855aba2d98d5215161abb9a430d69abb5741c9d7f",
        );
        let mut blocks = Vec::new();
        for value in [
            &b"var/lib/kubelet/device-plugins/nvidia-gpu.sock"[..],
            b"/var/lib/kubelet/device-plugins/nvidia-gpu.sock",
            b"%2Fvar%2Flib%2Fkubelet%2Fdevice-plugins%2Fnvidia-gpu.sock",
            b"",
        ] {
            let mut block = request_start();
            block.extend(authority(value));
            blocks.push(block);
        }
        // The percent-encoded path Huffman-coded, as grpcio sends it.
        let mut block = request_start();
        block.extend([0x41, 0x80 | huffman_percent.len() as u8]);
        block.extend(&huffman_percent);
        blocks.push(block);
        for block in blocks {
            let input = connection(&[frame(HEADERS, END_HEADERS | END_STREAM, 1, &block)]);
            let (out, rewriting) = rewrite(&input, 5).unwrap();
            assert!(rewriting);
            let seen = parse(&out);
            assert_eq!(seen.len(), 2);
            assert_eq!(seen[0], Seen::Other(SETTINGS.to_vec()));
            assert_eq!(fields_of(&seen[1]), ALLOCATE);
            let Seen::Headers { flags, frames, .. } = &seen[1] else {
                unreachable!()
            };
            assert_eq!((*flags, *frames), (END_STREAM, 1));
        }
    }

    #[test]
    fn authority_check_remembers_only_valid_values() {
        let mut check = AuthorityCheck::default();
        assert!(!check.is_valid(b""));
        assert!(check.is_valid(b"localhost"));
        assert!(check.is_valid(b"localhost"));
        assert!(!check.is_valid(b"/x.sock"));
        assert!(!check.is_valid(b"/x.sock"));
        assert!(check.is_valid(b"localhost"));
        assert!(!check.is_valid(b""));
        assert_eq!(check.last_valid, b"localhost");
    }

    #[test]
    fn dynamic_table_references_survive_the_switch_to_rewriting() {
        // 1: valid authority, inserts user-agent and the authority into the client's table
        //    (and h2's, since it passes unchanged).
        let mut first = request_start();
        first.extend(authority(b"localhost"));
        first.extend(indexed_literal(b"user-agent", b"kubelet"));
        // 2: an invalid authority (inserted too), user-agent by reference (62 = newest = the
        //    one inserted last in block 1).
        let mut second = request_start();
        second.extend(authority(
            b"/var/lib/kubelet/device-plugins/nvidia-gpu.sock",
        ));
        second.push(0x80 | 63); // user-agent: kubelet, now second newest
        // 3: a table size update that evicts everything, then a fresh insert and a reference.
        let mut third = vec![0x20, 0x3f, 0xe1, 0x1f]; // 0 then back to 4096
        third.extend(request_start());
        third.extend(indexed_literal(b"x-a", b"1"));
        third.push(0x80 | 62); // x-a: 1
        let input = connection(&[
            frame(HEADERS, END_HEADERS, 1, &first),
            frame(HEADERS, END_HEADERS, 3, &second),
            frame(HEADERS, END_HEADERS, 5, &third),
        ]);
        let (out, rewriting) = rewrite(&input, 3).unwrap();
        assert!(rewriting);
        let seen = parse(&out);
        assert_eq!(seen.len(), 4);
        let start = &ALLOCATE[..3];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut all = start.to_vec();
            all.extend_from_slice(extra);
            all
        };
        assert_eq!(
            fields_of(&seen[1]),
            with(&[(":authority", "localhost"), ("user-agent", "kubelet")])
        );
        assert_eq!(
            fields_of(&seen[2]),
            with(&[(":authority", "localhost"), ("user-agent", "kubelet")])
        );
        assert_eq!(fields_of(&seen[3]), with(&[("x-a", "1"), ("x-a", "1")]));
    }

    #[test]
    fn padding_priority_and_continuation_frames() {
        let mut block = request_start();
        block.extend(authority(b"/run/x.sock"));
        block.extend(indexed_literal(b"te", b"trailers"));
        let (a, rest) = block.split_at(10);
        let (b, c) = rest.split_at(20);
        let mut headers = vec![3]; // pad length
        headers.extend([0x80, 0, 0, 0, 15]); // exclusive, depends on 0, weight 16
        headers.extend(a);
        headers.extend([0; 3]);
        let input = connection(&[
            frame(HEADERS, PADDED | PRIORITY | END_STREAM, 7, &headers),
            frame(CONTINUATION, 0, 7, b),
            frame(CONTINUATION, END_HEADERS, 7, c),
            frame(0x6, 0, 0, &[0; 8]),
        ]);
        let (out, _) = rewrite(&input, 4).unwrap();
        let seen = parse(&out);
        assert_eq!(
            seen[1],
            Seen::Headers {
                stream: 7,
                flags: END_STREAM | PRIORITY,
                priority: Some(vec![0x80, 0, 0, 0, 15]),
                fields: ALLOCATE
                    .iter()
                    .chain(&[("te", "trailers")])
                    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned(), false))
                    .collect(),
                frames: 1,
            }
        );
        assert_eq!(seen[2], Seen::Other(frame(0x6, 0, 0, &[0; 8])));
    }

    #[test]
    fn large_rewritten_blocks_split_into_continuation_frames() {
        // One 40 000-byte value, Huffman-coded by the client (all '0', 5 bits each: 25 000
        // bytes), sent in two frames; re-encoded raw it needs three.
        let value_len = 40_000;
        let coded = vec![0u8; value_len * 5 / 8];
        let mut block = request_start();
        block.extend(authority(b"/x.sock"));
        block.extend([0x00, 0x03]);
        block.extend(b"x-b");
        // Huffman flag, length 25 000: 127 in the prefix, then 24 873 in 7-bit groups.
        block.extend([0xff, 0xa9, 0xc2, 0x01]);
        block.extend(&coded);
        let (a, b) = block.split_at(16_000);
        let input = connection(&[
            frame(HEADERS, 0, 1, a),
            frame(CONTINUATION, END_HEADERS, 1, b),
        ]);
        let (out, _) = rewrite(&input, 1000).unwrap();
        let seen = parse(&out);
        let Seen::Headers { frames, fields, .. } = &seen[1] else {
            panic!("{:?}", seen[1]);
        };
        assert_eq!(*frames, 3);
        assert_eq!(fields[3].1, "localhost");
        assert_eq!(fields[4].1, "0".repeat(value_len));
    }

    #[test]
    fn malformed_input_is_an_error() {
        let ok_block = {
            let mut b = request_start();
            b.extend(authority(b"localhost"));
            b
        };
        let cases: Vec<(Vec<u8>, RewriteError)> = vec![
            (b"GET / HTTP/1.1\r\n\r\n".to_vec(), RewriteError::Preface),
            (
                connection(&[frame(HEADERS, 0, 1, &ok_block), frame(0x0, 0, 1, b"x")]),
                RewriteError::ExpectedContinuation {
                    stream: 1,
                    frame_type: 0,
                    got: 1,
                },
            ),
            (
                connection(&[
                    frame(HEADERS, 0, 1, &ok_block),
                    frame(CONTINUATION, END_HEADERS, 3, b""),
                ]),
                RewriteError::ExpectedContinuation {
                    stream: 1,
                    frame_type: CONTINUATION,
                    got: 3,
                },
            ),
            (
                connection(&[frame(HEADERS, END_HEADERS | PADDED, 1, &[200, 0x82])]),
                RewriteError::ShortFrame { stream: 1 },
            ),
            (
                connection(&[frame(HEADERS, END_HEADERS | PRIORITY, 1, &[0, 0])]),
                RewriteError::ShortFrame { stream: 1 },
            ),
            (
                connection(&[frame(HEADERS, END_HEADERS, 1, &[0x80])]),
                RewriteError::Hpack {
                    stream: 1,
                    source: DecodeError::BadIndex {
                        index: 0,
                        entries: 0,
                    },
                },
            ),
        ];
        for (input, error) in cases {
            assert_eq!(rewrite(&input, 3), Err(error));
        }
    }

    #[test]
    fn header_blocks_are_buffered_up_to_the_limit_only() {
        // Empty CONTINUATION frames never end the block; the 64 KiB cap does.
        let mut rewriter = Rewriter::new();
        let mut out = Vec::new();
        rewriter
            .push(&connection(&[frame(HEADERS, 0, 1, &[0x82])]), &mut out)
            .unwrap();
        let empty = frame(CONTINUATION, 0, 1, b"");
        let mut sent = 0;
        let error = loop {
            match rewriter.push(&empty, &mut out) {
                Ok(()) => sent += 1,
                Err(error) => break error,
            }
            assert!(sent < MAX_HEADER_BLOCK);
        };
        assert_eq!(error, RewriteError::BlockTooLarge { stream: 1 });
        // HEADERS took 10 bytes, each CONTINUATION 9: the first that would pass 64 KiB fails.
        assert!(10 + 9 * sent <= MAX_HEADER_BLOCK && 10 + 9 * (sent + 1) > MAX_HEADER_BLOCK);
        assert!(rewriter.block.raw.len() <= MAX_HEADER_BLOCK);
        // Nothing of the unfinished block reached h2.
        assert_eq!(out.len(), 24 + 9);
    }
}
