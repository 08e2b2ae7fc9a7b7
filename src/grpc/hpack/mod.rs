//! A compact HPACK (RFC 7541) decoder and a non-indexing encoder: just what re-writing a
//! client's header blocks needs. The decoder mirrors the client's dynamic table; the encoder
//! never adds to the server's.

mod decoder;
mod encoder;
mod huffman;
mod table;

pub use decoder::{DecodeError, Decoder, Field};
pub use encoder::encode_field;
pub use huffman::HuffmanError;
