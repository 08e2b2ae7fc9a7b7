//! A raw HTTP/2 client for gRPC over a unix socket, built from frames by hand, so a test can
//! send any `:authority` — the socket path older kubelets send, grpcio's percent-encoded path,
//! grpcurl's — which every Rust HTTP/2 client refuses to send. Response headers are decoded
//! with gpud's HPACK decoder (h2's encoder uses Huffman coding and its dynamic table).

#![allow(dead_code)]

use std::time::Duration;

use gpud::grpc::hpack::Decoder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// How a request carries its `:authority`.
#[derive(Clone, Copy)]
pub enum Authority<'a> {
    /// A literal with incremental indexing (name: static index 1), so it enters the
    /// connection's header table, newest first (index 62).
    Indexed(&'a str),
    /// A reference to the header table (e.g. 62 for the newest entry).
    Reference(u8),
}

/// What came back for one call.
#[derive(Debug, PartialEq)]
pub struct Reply {
    pub headers: Vec<(String, String)>,
    /// The gRPC messages' bytes, each without its 5-byte prefix.
    pub messages: Vec<Vec<u8>>,
    pub trailers: Vec<(String, String)>,
}

/// An HTTP/2 client built from frames by hand; response headers are decoded with gpud's
/// HPACK decoder (h2's encoder uses Huffman coding and its dynamic table).
pub struct RawClient {
    /// The gRPC service `call` names, e.g. `v1beta1.DevicePlugin`.
    service: String,
    socket: UnixStream,
    next_stream: u32,
    decoder: Decoder,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A literal string field value: raw, with a one-byte length.
fn literal(out: &mut Vec<u8>, text: &[u8]) {
    out.push(u8::try_from(text.len()).unwrap());
    out.extend_from_slice(text);
}

impl RawClient {
    /// A client of the device plugin service (`v1beta1.DevicePlugin`).
    pub async fn connect(path: &std::path::Path) -> RawClient {
        RawClient::connect_to(path, "v1beta1.DevicePlugin").await
    }

    /// A client of `service` (`<proto package>.<service>`).
    pub async fn connect_to(path: &std::path::Path, service: &str) -> RawClient {
        let mut socket = UnixStream::connect(path).await.unwrap();
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, b""));
        socket.write_all(&hello).await.unwrap();
        RawClient {
            service: service.to_owned(),
            socket,
            next_stream: 1,
            decoder: Decoder::new(4096, 1 << 20),
        }
    }

    /// One unary gRPC call: HEADERS with literal fields, one DATA frame, then the response
    /// up to its trailers. Panics on RST_STREAM or GOAWAY, naming the error code.
    pub async fn call(&mut self, method: &str, authority: Authority<'_>, message: &[u8]) -> Reply {
        let stream = self.next_stream;
        self.next_stream += 2;
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
        block.push(0x04); // :path, literal without indexing
        literal(&mut block, format!("/{}/{method}", self.service).as_bytes());
        match authority {
            Authority::Indexed(value) => {
                block.push(0x41);
                literal(&mut block, value.as_bytes());
            }
            Authority::Reference(index) => block.push(0x80 | index),
        }
        block.extend([0x0f, 0x10]); // content-type (static 31), literal without indexing
        literal(&mut block, b"application/grpc");
        block.push(0x00); // te: trailers, new name
        literal(&mut block, b"te");
        literal(&mut block, b"trailers");
        let mut body = vec![0];
        body.extend(u32::try_from(message.len()).unwrap().to_be_bytes());
        body.extend_from_slice(message);
        let mut out = frame(HEADERS, END_HEADERS, stream, &block);
        out.extend(frame(DATA, END_STREAM, stream, &body));
        self.socket.write_all(&out).await.unwrap();
        // Longer than any answer gpud should take (an API read in a DRA prepare is bounded at
        // 10 s), so a test times a slow answer itself instead of seeing a hang here.
        tokio::time::timeout(Duration::from_secs(30), self.response(stream))
            .await
            .expect("no response within 30 s")
    }

    async fn response(&mut self, stream: u32) -> Reply {
        let mut blocks = Vec::new();
        let mut data = Vec::new();
        loop {
            let mut head = [0u8; 9];
            self.socket.read_exact(&mut head).await.unwrap();
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let (kind, flags) = (head[3], head[4]);
            let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let mut payload = vec![0; len];
            self.socket.read_exact(&mut payload).await.unwrap();
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    self.socket
                        .write_all(&frame(SETTINGS, ACK, 0, b""))
                        .await
                        .unwrap();
                }
                PING if flags & ACK == 0 => {
                    self.socket
                        .write_all(&frame(PING, ACK, 0, &payload))
                        .await
                        .unwrap();
                }
                RST_STREAM | GOAWAY => panic!(
                    "frame type {kind} on stream {id}: error code {:?}",
                    &payload[payload.len() - 4..]
                ),
                HEADERS if id == stream => {
                    // h2 sends neither padding nor priority, and small blocks in one frame.
                    assert_eq!(flags & 0x28, 0, "unexpected HEADERS flags {flags:#x}");
                    assert_ne!(flags & END_HEADERS, 0, "CONTINUATION not expected");
                    let mut fields = Vec::new();
                    self.decoder
                        .decode(&payload, |f| {
                            fields.push((
                                String::from_utf8(f.name.to_vec()).unwrap(),
                                String::from_utf8(f.value.to_vec()).unwrap(),
                            ))
                        })
                        .unwrap();
                    blocks.push(fields);
                    if flags & END_STREAM != 0 {
                        break;
                    }
                }
                DATA if id == stream => data.extend(payload),
                _ => {}
            }
        }
        let mut messages = Vec::new();
        let mut rest = data.as_slice();
        while !rest.is_empty() {
            assert_eq!(rest[0], 0, "compressed message");
            let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            messages.push(rest[5..5 + len].to_vec());
            rest = &rest[5 + len..];
        }
        let trailers = blocks.pop().unwrap();
        let mut headers = blocks.pop().unwrap_or_default();
        // hyper adds the time of day; it says nothing about the call.
        headers.retain(|(name, _)| name != "date");
        Reply {
            headers,
            messages,
            trailers,
        }
    }
}
