//! Messages on the handover socket: a 4-byte big-endian length, then the JSON message; listening
//! sockets travel as `SCM_RIGHTS` with a message's first bytes.
//!
//! The calls block (with the stream's timeouts); the handover runs them on blocking threads.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};

use super::message::Message;

/// The largest message accepted: the state of a node is a few KiB; anything near this is not
/// a gpud talking.
pub const MAX_MESSAGE: usize = 16 << 20;
/// The most descriptors one message carries (a daemon listens on a handful of sockets).
pub const MAX_FDS: usize = 64;

/// Why a message could not be sent or received.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the other side closed the connection")]
    Closed,
    #[error("no answer within the deadline")]
    TimedOut,
    #[error("{0}")]
    Io(std::io::Error),
    #[error("a message of {0} bytes is larger than any gpud sends")]
    TooLarge(usize),
    #[error("not a handover message: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("{0} descriptors with one message; at most {MAX_FDS}")]
    TooManyFds(usize),
}

impl From<std::io::Error> for WireError {
    fn from(err: std::io::Error) -> Self {
        match err.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => WireError::TimedOut,
            std::io::ErrorKind::UnexpectedEof => WireError::Closed,
            _ => WireError::Io(err),
        }
    }
}

/// Sends `message` with `fds` attached.
pub fn send(stream: &mut UnixStream, message: &Message, fds: &[OwnedFd]) -> Result<(), WireError> {
    if fds.len() > MAX_FDS {
        return Err(WireError::TooManyFds(fds.len()));
    }
    let body = serde_json::to_vec(message)?;
    let length = u32::try_from(body.len()).map_err(|_| WireError::TooLarge(body.len()))?;
    let header = length.to_be_bytes();
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !borrowed.is_empty() {
        control.push(SendAncillaryMessage::ScmRights(&borrowed));
    }
    let sent = sendmsg(
        stream.as_fd(),
        &[IoSlice::new(&header), IoSlice::new(&body)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .map_err(std::io::Error::from)?;
    // A large body may go out in parts; the descriptors went with the first.
    let whole: Vec<u8> = header.iter().chain(body.iter()).copied().collect();
    if sent < whole.len() {
        stream.write_all(&whole[sent..])?;
    }
    Ok(())
}

/// Receives one message and the descriptors that came with it.
pub fn receive(stream: &mut UnixStream) -> Result<(Message, Vec<OwnedFd>), WireError> {
    let mut header = [0u8; 4];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        stream.as_fd(),
        &mut [IoSliceMut::new(&mut header)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?
    .bytes;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if got == 0 {
        return Err(WireError::Closed);
    }
    stream.read_exact(&mut header[got..])?;
    let length = u32::from_be_bytes(header) as usize;
    if length > MAX_MESSAGE {
        return Err(WireError::TooLarge(length));
    }
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body)?;
    Ok((serde_json::from_slice(&body)?, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_carries_its_listening_sockets_across() {
        let (mut old, mut new) = UnixStream::pair().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let offer = Message::Offer {
            version: 1,
            pid: 1,
            sockets: vec!["tcp::9400".into()],
            state: [("x".to_owned(), serde_json::json!({"n": 1}))].into(),
            host: None,
        };
        send(
            &mut old,
            &offer,
            &[listener.as_fd().try_clone_to_owned().unwrap()],
        )
        .unwrap();
        let (message, fds) = receive(&mut new).unwrap();
        assert_eq!(message, offer);
        let received = std::net::TcpListener::from(fds.into_iter().next().unwrap());
        assert_eq!(received.local_addr().unwrap(), address);
        // The same socket: a connection made now is accepted through the received one.
        let _client = std::net::TcpStream::connect(address).unwrap();
        received.accept().unwrap();
    }

    #[test]
    fn garbage_a_closed_peer_and_an_oversized_length_are_errors() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&5u32.to_be_bytes()).unwrap();
        a.write_all(b"hello").unwrap();
        assert!(matches!(receive(&mut b), Err(WireError::Malformed(_))));
        a.write_all(&u32::MAX.to_be_bytes()).unwrap();
        assert!(matches!(receive(&mut b), Err(WireError::TooLarge(_))));
        drop(a);
        assert!(matches!(receive(&mut b), Err(WireError::Closed)));
    }
}
