//! gRPC servers on unix sockets, as every gpud service the kubelet talks to runs them (the
//! device plugins now). Two things tonic does not do:
//!
//! - [`bind`]: the socket gets exactly [`SOCKET_MODE`] (0600: only root, i.e. the kubelet,
//!   talks to these sockets), whatever the umask, and is never reachable with a wider mode.
//! - [`incoming`]: accepted connections are wrapped in [`AuthorityFix`], so that requests
//!   whose HTTP/2 `:authority` is not a valid URI authority (the socket path the kubelet sent
//!   before 1.26, grpcio's percent-encoded path, grpcurl's) are served instead of reset.
//!
//! ```ignore
//! let listener = grpc::bind(&socket, grpc::SOCKET_MODE)?;
//! Server::builder().add_service(service).serve_with_incoming(grpc::incoming(listener)).await
//! ```

pub mod hpack;
pub mod rewrite;
pub mod serve;
pub mod socket;
pub mod stream;

pub use socket::{BindError, SOCKET_MODE, bind, bind_or_inherit};
pub use stream::{AuthorityFix, incoming};

/// Helpers for this module's unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    /// Bytes from hex digits; whitespace between them is ignored.
    pub fn hex(text: &str) -> Vec<u8> {
        let digits: String = text.split_whitespace().collect();
        (0..digits.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
            .collect()
    }
}
