//! Listen addresses in Go's `[host]:port` form (dcgm-exporter's `-a :9400`) and the listening
//! socket.

use std::net::SocketAddr;
use std::os::fd::AsFd;

use tokio::net::TcpListener;

use crate::listeners;

/// Where a listen address failed.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Not `[host]:port`.
    #[error("invalid listen address {0:?}: expected [HOST]:PORT, e.g. :9400 or 127.0.0.1:9400")]
    Invalid(String),
    /// The socket could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: String,
        #[source]
        source: std::io::Error,
    },
}

/// Splits `[host]:port` (Go's form: `:9400` means every address).
pub fn parse_address(text: &str) -> Result<(Option<String>, u16), ListenError> {
    let invalid = || ListenError::Invalid(text.to_owned());
    let (host, port) = text.rsplit_once(':').ok_or_else(invalid)?;
    let port: u16 = port.parse().map_err(|_| invalid())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok(((!host.is_empty()).then(|| host.to_owned()), port))
}

/// Send buffer of every connection: a large body (a MIG node's metrics are a few hundred KiB)
/// leaves in one write instead of trickling out as the kernel's small default buffer drains.
/// The kernel caps it at `net.core.wmem_max`, and uses it only for bytes not yet acknowledged.
const SEND_BUFFER: u32 = 4 << 20;

/// Pending connections the kernel queues before the server accepts them.
const BACKLOG: u32 = 1024;

/// Binds `[host]:port`. Without a host it listens on every address, IPv6 and IPv4, or IPv4 only
/// where IPv6 is disabled. A socket the gpud this one took over from listened on for the same
/// address is served instead ([`crate::listeners`]); either way it can be handed on.
pub async fn bind(text: &str) -> Result<TcpListener, ListenError> {
    let key = listeners::tcp_key(text);
    let bind_error = |source| ListenError::Bind {
        address: text.to_owned(),
        source,
    };
    let listener = match listeners::take(&key) {
        Some(inherited) => {
            let std = std::net::TcpListener::from(inherited);
            std.set_nonblocking(true).map_err(bind_error)?;
            TcpListener::from_std(std).map_err(bind_error)?
        }
        None => bind_new(text).await?,
    };
    listeners::serve(&key, listener.as_fd());
    Ok(listener)
}

async fn bind_new(text: &str) -> Result<TcpListener, ListenError> {
    let (host, port) = parse_address(text)?;
    let bind_error = |source| ListenError::Bind {
        address: text.to_owned(),
        source,
    };
    let addresses: Vec<SocketAddr> = match host {
        Some(host) => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(bind_error)?
            .collect(),
        None => vec![
            SocketAddr::from(([0u16; 8], port)),
            SocketAddr::from(([0u8; 4], port)),
        ],
    };
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address to bind");
    for address in addresses {
        match listen(address) {
            Ok(listener) => return Ok(listener),
            Err(err) => last = err,
        }
    }
    Err(bind_error(last))
}

fn listen(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    // Accepted connections inherit it.
    let _ = socket.set_send_buffer_size(SEND_BUFFER);
    socket.bind(address)?;
    socket.listen(BACKLOG)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_in_go_form() {
        assert_eq!(parse_address(":9400").unwrap(), (None, 9400));
        assert_eq!(
            parse_address("127.0.0.1:9401").unwrap(),
            (Some("127.0.0.1".into()), 9401)
        );
        assert_eq!(
            parse_address("[::1]:9400").unwrap(),
            (Some("::1".into()), 9400)
        );
        assert_eq!(
            parse_address("localhost:0").unwrap(),
            (Some("localhost".into()), 0)
        );
        for bad in ["9400", ":http", "host:", ":70000"] {
            assert_eq!(
                parse_address(bad).unwrap_err().to_string(),
                format!(
                    "invalid listen address {bad:?}: expected [HOST]:PORT, e.g. :9400 or 127.0.0.1:9400"
                )
            );
        }
    }

    #[tokio::test]
    async fn binds_loopback_and_names_the_address_it_could_not_bind() {
        let listener = bind("127.0.0.1:0").await.unwrap();
        let taken = listener.local_addr().unwrap();
        let err = bind(&taken.to_string()).await.unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("cannot listen on {taken}: ")),
            "{err}"
        );
    }
}
