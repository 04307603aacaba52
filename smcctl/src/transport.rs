//! How requests reach a server: smcd's Unix `SOCK_SEQPACKET` control socket (one netlink
//! message per record), or the kernel's `NETLINK_GENERIC` socket (`--kernel`). Both carry the
//! same bytes; everything above this module ([`crate::client`], the commands) is shared.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketFlags, SocketType};

use crate::error::Error;

/// How long to wait for a reply before giving up (a daemon that accepted the connection
/// but never answers must not hang the operator's shell).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Who answers the requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `smcd` at this socket path.
    Smcd(PathBuf),
    /// The running kernel.
    Kernel,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Smcd(p) => write!(f, "smcd at {}", p.display()),
            Endpoint::Kernel => f.write_str("the kernel"),
        }
    }
}

/// A datagram pipe to a netlink server.
pub trait Transport: std::fmt::Debug {
    /// Sends one request (one or more netlink messages).
    fn send(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Receives the next record (one or more netlink messages). Times out after
    /// [`REPLY_TIMEOUT`] with `ErrorKind::TimedOut`/`WouldBlock`.
    fn recv(&mut self) -> io::Result<Vec<u8>>;
    /// Who is at the other end.
    fn endpoint(&self) -> Endpoint;
}

/// `smcd`'s control socket.
#[derive(Debug)]
pub struct SmcdSocket {
    sock: OwnedFd,
    path: PathBuf,
}

impl SmcdSocket {
    /// Connects to `smcd` at `path`. The error names the path and says how to start smcd.
    pub fn connect(path: &Path) -> Result<Self, Error> {
        let fail = |e: io::Error| -> Error {
            let why = match e.raw_os_error() {
                Some(2) => "no such socket".to_owned(),
                Some(111) => "nobody listens on it".to_owned(),
                _ => crate::error::errno_text(e.raw_os_error().unwrap_or(0)),
            };
            match e.raw_os_error() {
                Some(13) | Some(1) => Error::failed(format!(
                    "cannot connect to smcd at {}: {why}; the socket's permissions refuse this user",
                    path.display()
                )),
                _ => Error::failed(format!(
                    "smcd is not running at {} ({why}); start it with `smcd --socket {} &` \
                     or point --socket / SMCD_SOCKET at a running smcd",
                    path.display(),
                    path.display()
                )),
            }
        };
        let sock = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| fail(e.into()))?;
        let addr = SocketAddrUnix::new(path).map_err(|e| fail(e.into()))?;
        rustix::net::connect(&sock, &addr).map_err(|e| fail(e.into()))?;
        rustix::net::sockopt::set_socket_timeout(
            &sock,
            rustix::net::sockopt::Timeout::Recv,
            Some(REPLY_TIMEOUT),
        )
        .map_err(|e| fail(e.into()))?;
        Ok(Self {
            sock,
            path: path.to_owned(),
        })
    }
}

impl Transport for SmcdSocket {
    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        let n = rustix::net::send(&self.sock, bytes, SendFlags::NOSIGNAL)?;
        if n != bytes.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
        }
        Ok(())
    }

    fn recv(&mut self) -> io::Result<Vec<u8>> {
        recv_record(self.sock.as_fd())
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::Smcd(self.path.clone())
    }
}

/// Reads one whole record: peeks its length first (`MSG_TRUNC` reports the full size on
/// Unix datagram and netlink sockets), so no reply is ever cut short.
fn recv_record(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    loop {
        let mut probe = [0u8; 0];
        let len = match rustix::net::recv(fd, &mut probe[..], RecvFlags::PEEK | RecvFlags::TRUNC) {
            Ok((_, len)) => len,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut buf = vec![0u8; len.max(1)];
        match rustix::net::recv(fd, &mut buf[..], RecvFlags::empty()) {
            Ok((n, _)) => {
                buf.truncate(n);
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    ));
                }
                return Ok(buf);
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The kernel's generic netlink socket.
#[derive(Debug)]
pub struct KernelSocket {
    sock: netlink_sys::Socket,
}

impl KernelSocket {
    /// Opens and binds a `NETLINK_GENERIC` socket in the current network namespace.
    pub fn open() -> Result<Self, Error> {
        let fail = |what: &str, e: io::Error| {
            Error::failed(format!(
                "cannot open the kernel's generic netlink socket ({what}): {}",
                crate::error::errno_text(e.raw_os_error().unwrap_or(0))
            ))
        };
        let mut sock = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_GENERIC)
            .map_err(|e| fail("socket", e))?;
        sock.bind_auto().map_err(|e| fail("bind", e))?;
        rustix::net::sockopt::set_socket_timeout(
            &sock,
            rustix::net::sockopt::Timeout::Recv,
            Some(REPLY_TIMEOUT),
        )
        .map_err(|e| fail("SO_RCVTIMEO", e.into()))?;
        Ok(Self { sock })
    }
}

impl Transport for KernelSocket {
    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        let n = self.sock.send(bytes, 0)?;
        if n != bytes.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
        }
        Ok(())
    }

    fn recv(&mut self) -> io::Result<Vec<u8>> {
        recv_record(self.sock.as_fd())
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::Kernel
    }
}
