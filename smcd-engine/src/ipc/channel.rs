//! Netlink messages over a Unix `SOCK_SEQPACKET` socket, with file descriptors passed as
//! `SCM_RIGHTS`: the transport of `smcd`'s socket for both the engines' device channel and the
//! operators' control requests. One seqpacket record carries one netlink message (or, for
//! dump replies, a batch), so a peer can never leave half a message behind.

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    NetlinkSerializable,
};
use netlink_packet_generic::GenlMessage;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use smc_proto::netlink::loopback::LoopbackMessage;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::path::Path;

/// Largest record we accept (a dump batch).
pub const MAX_RECORD: usize = 64 * 1024;
/// Most file descriptors one record may carry.
pub const MAX_FDS: usize = 4;

/// Default path of `smcd`'s socket.
pub const DEFAULT_SOCKET: &str = "/run/smcd/smcd.sock";

/// The socket path: `$SMCD_SOCKET` if set, else [`DEFAULT_SOCKET`].
pub fn socket_path() -> std::path::PathBuf {
    std::env::var_os("SMCD_SOCKET")
        .map(Into::into)
        .unwrap_or_else(|| DEFAULT_SOCKET.into())
}

/// Sends one record with optional file descriptors. Never blocks on a non-blocking socket.
pub fn send_record(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(fds.len() <= MAX_FDS);
        control.push(SendAncillaryMessage::ScmRights(fds));
    }
    let n = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if n != bytes.len() {
        return Err(io::Error::other("short seqpacket send"));
    }
    Ok(())
}

/// Receives one record into `buf`; returns its length (0 = the peer closed) and the file
/// descriptors that came with it. A record longer than `buf` is an error (it was cut).
pub fn recv_record(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: RecvFlags,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        flags | RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights.map(crate::sys::banded));
        }
    }
    if msg.flags.contains(rustix::net::ReturnFlags::TRUNC)
        || msg.flags.contains(rustix::net::ReturnFlags::CTRUNC)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "record truncated",
        ));
    }
    Ok((msg.bytes, fds))
}

/// Serialises a netlink message.
pub fn encode<I: NetlinkSerializable>(mut msg: NetlinkMessage<I>) -> Vec<u8> {
    msg.finalize();
    let mut buf = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut buf);
    buf
}

/// A client connection to `smcd` speaking the `SMCD_LOOPBACK` family.
#[derive(Debug)]
pub struct Channel {
    sock: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

/// A reply: the message and the descriptors that came with it.
pub type Reply = (LoopbackMessage, Vec<OwnedFd>);

/// How long a request waits for smcd's answer (and for room to send it): smcd answers in
/// microseconds, so one that does not within this is stopped or wedged, and the connection
/// that asked falls back to TCP instead of waiting for it.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl Channel {
    /// Connects to the socket at `path`. Requests on it give up after [`REQUEST_TIMEOUT`].
    pub fn connect(path: &Path) -> io::Result<Self> {
        use rustix::net::sockopt::{Timeout, set_socket_timeout};
        let sock = crate::sys::banded(rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?);
        set_socket_timeout(&sock, Timeout::Recv, Some(REQUEST_TIMEOUT))?;
        set_socket_timeout(&sock, Timeout::Send, Some(REQUEST_TIMEOUT))?;
        rustix::net::connect(&sock, &SocketAddrUnix::new(path)?)?;
        Ok(Self {
            sock,
            seq: 0,
            buf: vec![0u8; MAX_RECORD],
        })
    }

    fn message(
        &mut self,
        msg: LoopbackMessage,
        flags: u16,
    ) -> NetlinkMessage<GenlMessage<LoopbackMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        NetlinkMessage::new(header, NetlinkPayload::from(GenlMessage::from_payload(msg)))
    }

    /// Sends a message that expects no reply.
    pub fn notify(&mut self, msg: LoopbackMessage, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let nl = self.message(msg, NLM_F_REQUEST);
        send_record(self.sock.as_fd(), &encode(nl), fds)
    }

    /// Sends a request and waits for its reply; an `NLMSG_ERROR` with an errno becomes that
    /// `io::Error`.
    pub fn request(&mut self, msg: LoopbackMessage, fds: &[BorrowedFd<'_>]) -> io::Result<Reply> {
        self.request_seeing(msg, fds, |_| {})
    }

    /// As [`Channel::request`]; notifications that arrive before the reply go to `seen`.
    pub fn request_seeing(
        &mut self,
        msg: LoopbackMessage,
        fds: &[BorrowedFd<'_>],
        mut seen: impl FnMut(LoopbackMessage),
    ) -> io::Result<Reply> {
        let nl = self.message(msg, NLM_F_REQUEST | NLM_F_ACK);
        let seq = self.seq;
        send_record(self.sock.as_fd(), &encode(nl), fds)?;
        loop {
            let (msg, fds, got_seq) = self.receive()?;
            if got_seq != seq {
                // A stale reply (a previous request that timed out) or a notification.
                if let Ok(m) = msg {
                    seen(m);
                }
                continue;
            }
            return msg.map(|m| (m, fds));
        }
    }

    /// Receives the next message (blocking, at most [`REQUEST_TIMEOUT`]):
    /// `(Ok(message) | Err(errno), fds, sequence)`.
    #[allow(clippy::type_complexity)]
    pub fn receive(&mut self) -> io::Result<(io::Result<LoopbackMessage>, Vec<OwnedFd>, u32)> {
        let (n, fds) =
            recv_record(self.sock.as_fd(), &mut self.buf, RecvFlags::empty()).map_err(|e| {
                if e.kind() == io::ErrorKind::WouldBlock {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("smcd did not answer within {REQUEST_TIMEOUT:?}"),
                    )
                } else {
                    e
                }
            })?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "smcd closed the channel",
            ));
        }
        decode_reply(&self.buf[..n]).map(|(m, seq)| (m, fds, seq))
    }

    /// Receives the next message if one is queued.
    #[allow(clippy::type_complexity)]
    pub fn try_receive(
        &mut self,
    ) -> io::Result<Option<(io::Result<LoopbackMessage>, Vec<OwnedFd>, u32)>> {
        match recv_record(self.sock.as_fd(), &mut self.buf, RecvFlags::DONTWAIT) {
            Ok((0, _)) => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "smcd closed the channel",
            )),
            Ok((n, fds)) => decode_reply(&self.buf[..n]).map(|(m, seq)| Some((m, fds, seq))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

fn decode_reply(bytes: &[u8]) -> io::Result<(io::Result<LoopbackMessage>, u32)> {
    let nl = NetlinkMessage::<GenlMessage<LoopbackMessage>>::deserialize(bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("bad reply: {e}")))?;
    let seq = nl.header.sequence_number;
    Ok((
        match nl.payload {
            NetlinkPayload::InnerMessage(g) => Ok(g.payload),
            NetlinkPayload::Error(e) => match e.code {
                Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                None => Err(io::Error::new(io::ErrorKind::InvalidData, "unexpected ack")),
            },
            other => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected reply {other:?}"),
            )),
        },
        seq,
    ))
}

/// Decodes a request of any family served by smcd: the raw header and payload bytes. Used by
/// the server to dispatch on the family id before parsing.
pub fn peek_header(bytes: &[u8]) -> Option<NetlinkHeader> {
    use netlink_packet_core::{NetlinkBuffer, Parseable};
    let buf = NetlinkBuffer::new_checked(bytes).ok()?;
    NetlinkHeader::parse(&buf).ok()
}

/// Helper for implementations of [`NetlinkDeserializable`] users: parses a full message.
pub fn decode<I: NetlinkDeserializable>(bytes: &[u8]) -> io::Result<NetlinkMessage<I>> {
    NetlinkMessage::<I>::deserialize(bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}
