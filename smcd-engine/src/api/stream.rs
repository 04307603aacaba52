//! [`SmcStream`]: a `std::net::TcpStream` look-alike whose bytes travel through shared memory
//! when both ends are SMC-capable, and through TCP otherwise.

use crate::driver::conn::{SmcConn, SmcdInfo, StateArea};
use crate::driver::connect::{self, Connecting};
use crate::driver::engine::Engine;
use crate::driver::handshake::{Fallback, Outcome};
use crate::driver::lgr::LinkGroup;
use crate::layout::status::{ConnIdentity, ConnSlot};
use crate::transport::smcd::SmcdLink;
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use smc_core::close::SmcState;
use smc_proto::clc::ReasonCode;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// `SIOCATMARK` (`linux/sockios.h`; the libc crate does not name it).
const SIOCATMARK: libc::c_ulong = 0x8905;

/// What a connection became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// SMC-D over the loopback device.
    SmcD(SmcdSummary),
    /// Plain TCP, with the fallback reasons.
    Tcp(Fallback),
}

/// The SMC-D facts of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmcdSummary {
    /// Link group id.
    pub lgr_id: u32,
    /// Our GID.
    pub local_gid: u128,
    /// The peer's GID.
    pub peer_gid: u128,
    /// Our DMB token.
    pub local_token: u64,
    /// The peer's DMB token.
    pub peer_token: u64,
    /// Our DMB size (receive buffer).
    pub rmbe_size: usize,
    /// The peer's DMB size (what we can send into).
    pub peer_rmbe_size: usize,
    /// The close state.
    pub state: SmcState,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mode::SmcD(s) => write!(
                f,
                "SMC-D (link group {:#010x}, token {:#018x}, DMB {} B, peer DMB {} B)",
                s.lgr_id, s.local_token, s.rmbe_size, s.peer_rmbe_size
            ),
            Mode::Tcp(fb) => {
                write!(f, "TCP fallback {:#010x} ({})", fb.local.0, fb.local)?;
                if fb.peer.0 != 0 {
                    write!(f, ", peer {:#010x} ({})", fb.peer.0, fb.peer)?;
                }
                Ok(())
            }
        }
    }
}

#[derive(Debug)]
enum Kind {
    Smc {
        conn: Arc<SmcConn<SmcdLink>>,
        lgr: Arc<LinkGroup>,
    },
    Tcp {
        sock: TcpStream,
        fallback: Fallback,
        _slot: ConnSlot,
    },
}

#[derive(Debug)]
struct Inner {
    kind: Kind,
    engine: Arc<Engine>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Kind::Smc { conn, lgr } = &self.kind {
            let reusable = conn.close_now() && conn.link().peer_closed();
            let aborted = conn.is_aborted();
            let poisoned = conn.is_poisoned();
            conn.retire();
            if let Some(a) = self.engine.attached_now() {
                lgr.put_dmb(
                    a.ism.as_ref(),
                    Arc::clone(conn.link().own()),
                    reusable,
                    aborted,
                );
            }
            if aborted {
                // The peer's DMB may still hold this connection's words: not reused for the
                // next connection (ours is unregistered above for the same reason).
                lgr.detach(conn.info.peer_token);
            }
            if poisoned {
                // The peer wrote garbage: nothing of it is to be trusted again.
                self.engine.lgrs.kill(lgr);
            }
            self.engine.lgrs.release(lgr);
        }
    }
}

/// A connected stream, SMC-D or TCP. Clones (by [`SmcStream::try_clone`]) share the
/// connection; it closes when the last one is dropped.
#[derive(Debug, Clone)]
pub struct SmcStream {
    inner: Arc<Inner>,
}

impl SmcStream {
    /// Connects to `addr` through the process-wide engine.
    pub fn connect<A: ToSocketAddrs>(addr: A) -> io::Result<SmcStream> {
        Self::connect_with(Engine::global(), addr)
    }

    /// Connects through `engine`.
    pub fn connect_with<A: ToSocketAddrs>(engine: &Arc<Engine>, addr: A) -> io::Result<SmcStream> {
        let mut last = None;
        for a in addr.to_socket_addrs()? {
            match connect::connect(engine, a, None) {
                Ok(o) => return Ok(Self::from_outcome(engine, o, false)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "could not resolve to any address",
            )
        }))
    }

    /// Starts a connect that does not wait (`EINPROGRESS`): wait until the returned
    /// [`SmcConnecting`] is ready for what it says, then [`SmcConnecting::try_finish`].
    pub fn connect_nonblocking(addr: SocketAddr) -> io::Result<SmcConnecting> {
        Self::connect_nonblocking_with(Engine::global(), addr)
    }

    /// [`SmcStream::connect_nonblocking`] through `engine`.
    pub fn connect_nonblocking_with(
        engine: &Arc<Engine>,
        addr: SocketAddr,
    ) -> io::Result<SmcConnecting> {
        // Made before the connect, so that a failed connect always has it (see `as_fd`).
        gone_fd()?;
        let c = Connecting::start(engine, addr)?;
        Ok(SmcConnecting {
            engine: Arc::clone(engine),
            c,
            done: None,
        })
    }

    /// [`SmcStream::connect_with`] on `sock`, an unconnected TCP socket of `addr`'s family
    /// not bound to a port, blocking (a preloaded program's own: the options it set before
    /// `connect` are the connection's, and a fallback is that very socket). See
    /// [`Connecting::start_on`] for where the engine still uses a socket of its own.
    pub fn connect_on(
        engine: &Arc<Engine>,
        sock: OwnedFd,
        addr: SocketAddr,
    ) -> io::Result<SmcStream> {
        let o = Connecting::start_on(engine, addr, sock, true)?.run(None)?;
        Ok(Self::from_outcome(engine, o, false))
    }

    /// [`SmcStream::connect_nonblocking_with`] on `sock`, as [`SmcStream::connect_on`] but
    /// non-blocking (`sock` is).
    pub fn connect_nonblocking_on(
        engine: &Arc<Engine>,
        sock: OwnedFd,
        addr: SocketAddr,
    ) -> io::Result<SmcConnecting> {
        gone_fd()?;
        let c = Connecting::start_on(engine, addr, sock, false)?;
        Ok(SmcConnecting {
            engine: Arc::clone(engine),
            c,
            done: None,
        })
    }

    /// Connects with a timeout (TCP connect and the CLC handshake each get at most this).
    pub fn connect_timeout(addr: &SocketAddr, timeout: Duration) -> io::Result<SmcStream> {
        Self::connect_timeout_with(Engine::global(), addr, timeout)
    }

    /// [`SmcStream::connect_timeout`] through `engine`.
    pub fn connect_timeout_with(
        engine: &Arc<Engine>,
        addr: &SocketAddr,
        timeout: Duration,
    ) -> io::Result<SmcStream> {
        connect::connect(engine, *addr, Some(timeout)).map(|o| Self::from_outcome(engine, o, false))
    }

    pub(crate) fn from_outcome(engine: &Arc<Engine>, o: Outcome, server: bool) -> SmcStream {
        let kind = match o {
            Outcome::Smc { conn, lgr } => Kind::Smc { conn, lgr },
            Outcome::Tcp(sock, fallback) => {
                // A fallback socket shows in socket dumps with its reasons (smcss "TCP 0x...").
                let slot = engine.status().conn_slot();
                slot.publish(&ConnIdentity {
                    state: SmcState::Active as u8,
                    mode: 1,
                    role: u8::from(server),
                    fallback: (fallback.local.0, fallback.peer.0),
                    local: sock.local_addr().ok(),
                    peer: sock.peer_addr().ok(),
                    inode: rustix::fs::fstat(&sock).map_or(0, |s| s.st_ino),
                    ..ConnIdentity::default()
                });
                Kind::Tcp {
                    sock,
                    fallback,
                    _slot: slot,
                }
            }
        };
        SmcStream {
            inner: Arc::new(Inner {
                kind,
                engine: Arc::clone(engine),
            }),
        }
    }

    fn tcp(&self) -> &TcpStream {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.clcsock(),
            Kind::Tcp { sock, .. } => sock,
        }
    }

    /// What this connection became.
    pub fn mode(&self) -> Mode {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => {
                let i: &SmcdInfo = &conn.info;
                Mode::SmcD(SmcdSummary {
                    lgr_id: i.lgr_id,
                    local_gid: i.local_gid,
                    peer_gid: i.peer_gid,
                    local_token: i.local_token,
                    peer_token: i.peer_token,
                    rmbe_size: i.rmbe_size,
                    peer_rmbe_size: i.peer_rmbe_size,
                    state: conn.state(),
                })
            }
            Kind::Tcp { fallback, .. } => Mode::Tcp(*fallback),
        }
    }

    /// Whether the bytes go through shared memory.
    pub fn is_smc(&self) -> bool {
        matches!(self.inner.kind, Kind::Smc { .. })
    }

    /// The fallback reasons, if this is TCP.
    pub fn fallback(&self) -> Option<Fallback> {
        match &self.inner.kind {
            Kind::Tcp { fallback, .. } => Some(*fallback),
            Kind::Smc { .. } => None,
        }
    }

    /// The SMC connection, if any (statistics, diagnostics).
    pub fn smc_conn(&self) -> Option<&SmcConn<SmcdLink>> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => Some(conn),
            Kind::Tcp { .. } => None,
        }
    }

    /// The SMC-D connection itself, kept alive past the stream as the liveness watcher may
    /// keep it (for tests of what such a holder may do).
    #[doc(hidden)]
    pub fn smc_conn_handle(&self) -> Option<Arc<SmcConn<SmcdLink>>> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => Some(Arc::clone(conn)),
            Kind::Tcp { .. } => None,
        }
    }

    /// Sends urgent data (`MSG_OOB`): the last byte of `buf` is the urgent byte.
    pub fn send_oob(&self, buf: &[u8]) -> io::Result<usize> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.write_with(buf, false, true),
            Kind::Tcp { sock, .. } => rustix::net::send(
                sock,
                buf,
                rustix::net::SendFlags::OOB | rustix::net::SendFlags::NOSIGNAL,
            )
            .map_err(io::Error::from),
        }
    }

    /// Receives the urgent byte (`recv(MSG_OOB)`, with `MSG_PEEK` if `peek`).
    pub fn recv_oob(&self, peek: bool) -> io::Result<u8> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.recv_oob(peek),
            Kind::Tcp { sock, .. } => {
                let mut b = [0u8; 1];
                let mut f = rustix::net::RecvFlags::OOB;
                if peek {
                    f |= rustix::net::RecvFlags::PEEK;
                }
                rustix::net::recv(sock, &mut b, f)
                    .map(|_| b[0])
                    .map_err(io::Error::from)
            }
        }
    }

    /// `SIOCATMARK`: whether the next byte to read is the urgent byte.
    pub fn at_mark(&self) -> io::Result<bool> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.at_mark(),
            Kind::Tcp { sock, .. } => {
                let mut v: libc::c_int = 0;
                // SAFETY: SIOCATMARK writes one int through the pointer we pass.
                let r = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCATMARK, &mut v) };
                if r < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(v != 0)
            }
        }
    }

    /// `SO_OOBINLINE`: the urgent byte stays in the stream.
    pub fn set_oob_inline(&self, on: bool) -> io::Result<()> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => {
                conn.set_oob_inline(on);
                Ok(())
            }
            Kind::Tcp { sock, .. } => {
                rustix::net::sockopt::set_socket_oobinline(sock, on).map_err(io::Error::from)
            }
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().peer_addr()
    }

    /// Our address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().local_addr()
    }

    /// Shuts down reading, writing or both, as `shutdown(2)`.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.shutdown(how),
            Kind::Tcp { sock, .. } => sock.shutdown(how),
        }
    }

    /// `TCP_NODELAY`. On SMC it pushes data held back by cork.
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => {
                conn.set_nodelay(on);
                Ok(())
            }
            Kind::Tcp { sock, .. } => sock.set_nodelay(on),
        }
    }

    /// Current `TCP_NODELAY`.
    pub fn nodelay(&self) -> io::Result<bool> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => Ok(conn.nodelay()),
            Kind::Tcp { sock, .. } => sock.nodelay(),
        }
    }

    /// `TCP_CORK`: while set, small writes are held back until the buffer fills or the cork
    /// is removed (which pushes them).
    pub fn set_cork(&self, on: bool) -> io::Result<()> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => {
                conn.set_cork(on);
                Ok(())
            }
            Kind::Tcp { sock, .. } => {
                rustix::net::sockopt::set_tcp_cork(sock, on).map_err(io::Error::from)
            }
        }
    }

    /// Current `TCP_CORK`.
    pub fn cork(&self) -> io::Result<bool> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => Ok(conn.cork()),
            Kind::Tcp { sock, .. } => rustix::net::sockopt::tcp_cork(sock).map_err(io::Error::from),
        }
    }

    /// Level readiness, as a socket's `poll` has it: after a read that took everything and a
    /// non-blocking write that filled the buffer the readiness descriptor says so at once
    /// (otherwise only the call that finds nothing to do clears it, which is all an event
    /// loop needs and saves a system call per read). For programs that look at readiness
    /// between calls (`select` then one blocking read); a preload library turns it on.
    pub fn set_level_readiness(&self, on: bool) {
        if let Kind::Smc { conn, .. } = &self.inner.kind {
            conn.set_level_readiness(on);
        }
    }

    /// Deferred level readiness: a read that empties the ring leaves the descriptor readable
    /// until [`SmcStream::settle_readiness`], which the caller makes before anything waits on
    /// descriptors (a preload library, in its `poll`/`select`/`epoll_wait`). Programs that
    /// never wait on the descriptor then cost no system call per message.
    pub fn set_deferred_readiness(&self, on: bool) {
        if let Kind::Smc { conn, .. } = &self.inner.kind {
            conn.set_deferred_readiness(on);
        }
    }

    /// An edge-triggered waiter (`EPOLLET`) may wait on the readiness descriptor: a settle
    /// ([`SmcStream::settle_readiness`]) that finds bytes which arrived after the read that
    /// noted it then makes a new edge (a level-triggered waiter needs none: the descriptor
    /// stays readable). A preload library turns it on when the program registers so.
    pub fn set_edge_readiness(&self, on: bool) {
        if let Kind::Smc { conn, .. } = &self.inner.kind {
            conn.set_edge_readiness(on);
        }
    }

    /// Whether a read left the readiness for [`SmcStream::settle_readiness`].
    pub fn readiness_dirty(&self) -> bool {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.readiness_dirty(),
            Kind::Tcp { .. } => false,
        }
    }

    /// Whether a read would return bytes and a write would take some, from the connection's
    /// own state and with no system call, when that is all there is to say (`None`
    /// otherwise, and always for a plain TCP stream): see `SmcConn::quick_poll`.
    pub fn quick_poll(&self) -> Option<(bool, bool)> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.quick_poll(),
            Kind::Tcp { .. } => None,
        }
    }

    /// [`SmcStream::quick_poll`] with the peer's producer cursor: see `SmcConn::quick_look`.
    pub fn quick_look(&self) -> Option<crate::driver::conn::QuickLook> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.quick_look(),
            Kind::Tcp { .. } => None,
        }
    }

    /// Settles the readiness now, noted or not (see `SmcConn::settle_readiness_now`).
    pub fn settle_readiness_now(&self) {
        if let Kind::Smc { conn, .. } = &self.inner.kind {
            conn.settle_readiness_now();
        }
    }

    /// Before a fork: the connection's state moves into `area` (memory the fork shares, all
    /// zeroes or left by [`StateArea::reset`]), and from then on the processes that hold the
    /// stream take turns at it, each starting from where the last one left it (a parent and
    /// its child writing one after the other, as they can with a TCP socket). False for a
    /// stream whose state cannot be shared (SMC-R) and for a fallback (the kernel's socket is
    /// shared anyway).
    pub fn share_state(&self, area: &'static StateArea) -> bool {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.share_state(area),
            _ => false,
        }
    }

    /// This process lets go of the stream while other processes hold it on (see
    /// [`SmcStream::share_state`]): nothing is sent, its watch of the TCP connection ends and
    /// its copy of the TCP socket goes (the number stays taken), so that the connection ends
    /// for the peer when the others end, with a close or without. Drop the stream with
    /// `std::mem::forget` afterwards: dropping it would close the connection for everyone.
    pub fn let_go(&self) {
        if let Kind::Smc { conn, .. } = &self.inner.kind {
            conn.let_go();
        }
    }

    /// The program's event loop is busy again after a wait on descriptors: the announcement
    /// of its wait is taken back if the peer has not taken it, so the peer's writes ring
    /// nobody meanwhile. `true`: taken back, and the stream must be settled
    /// ([`SmcStream::settle_readiness`]) before any thread of the process waits on its
    /// descriptor; call it only while none does (see `SmcConn::withdraw_readiness`).
    pub fn withdraw_readiness(&self) -> bool {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.withdraw_readiness(),
            Kind::Tcp { .. } => false,
        }
    }

    /// The process's only waiter on descriptors sleeps on this stream among others: its
    /// announcement is tagged with that sleep (`tag` unique to it), so the peer rings one of
    /// them, not each. See `SmcConn::tag_readiness`: the tag must go
    /// ([`SmcStream::untag_readiness`]) when the sleep ends and before another thread waits.
    pub fn tag_readiness(&self, tag: u64) {
        if let Kind::Smc { conn, .. } = &self.inner.kind {
            conn.tag_readiness(tag);
        }
    }

    /// The tagged sleep ended: `true` when the peer skipped this stream's ring, and the stream
    /// must then be settled before anyone waits on it.
    pub fn untag_readiness(&self) -> bool {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.untag_readiness(),
            Kind::Tcp { .. } => false,
        }
    }

    /// Makes the readiness what the stream's state is, after deferred reads.
    pub fn settle_readiness(&self) {
        if let Kind::Smc { conn, .. } = &self.inner.kind {
            conn.settle_readiness();
        }
    }

    /// Interruptible blocking reads and writes: a signal whose handler was installed without
    /// `SA_RESTART` makes them return `Interrupted` (`EINTR`), as a socket's do (qperf ends its
    /// tests with such a `SIGALRM`). Off, they wait on. A preload library turns it on.
    pub fn set_interruptible(&self, on: bool) {
        if let Kind::Smc { conn, .. } = &self.inner.kind {
            conn.set_interruptible(on);
        }
    }

    /// Non-blocking mode: calls that would wait return `WouldBlock`.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => {
                conn.set_nonblocking(on);
                Ok(())
            }
            Kind::Tcp { sock, .. } => sock.set_nonblocking(on),
        }
    }

    /// Whether the SMC connection is in non-blocking mode (a TCP connection: `false`, its
    /// socket's flags say).
    pub fn is_nonblocking(&self) -> bool {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.is_nonblocking(),
            Kind::Tcp { .. } => false,
        }
    }

    /// Read timeout (`None`: wait forever). A read that times out returns `WouldBlock`, as
    /// `std`'s sockets do.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero timeout"));
        }
        match &self.inner.kind {
            Kind::Smc { conn, .. } => {
                conn.set_read_timeout(t);
                Ok(())
            }
            Kind::Tcp { sock, .. } => sock.set_read_timeout(t),
        }
    }

    /// Write timeout.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero timeout"));
        }
        match &self.inner.kind {
            Kind::Smc { conn, .. } => {
                conn.set_write_timeout(t);
                Ok(())
            }
            Kind::Tcp { sock, .. } => sock.set_write_timeout(t),
        }
    }

    /// Read timeout.
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => Ok(conn.read_timeout()),
            Kind::Tcp { sock, .. } => sock.read_timeout(),
        }
    }

    /// Write timeout.
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => Ok(conn.write_timeout()),
            Kind::Tcp { sock, .. } => sock.write_timeout(),
        }
    }

    /// Another handle on the same connection.
    pub fn try_clone(&self) -> io::Result<SmcStream> {
        Ok(self.clone())
    }

    /// Sends with `MSG_MORE`: the data may be held back until a later write without it.
    pub fn write_more(&self, buf: &[u8]) -> io::Result<usize> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.write_with(buf, true, false),
            Kind::Tcp { sock, .. } => rustix::net::send(
                sock,
                buf,
                rustix::net::SendFlags::MORE | rustix::net::SendFlags::NOSIGNAL,
            )
            .map_err(io::Error::from),
        }
    }

    /// The descriptor to wait on with `poll`/`epoll`/tokio's `AsyncFd` for this stream, with
    /// the meaning a TCP socket's has: readable when a read would not wait (data, end of
    /// stream, an error), writable when a write would not wait, `POLLRDHUP` once the peer is
    /// done writing, `POLLHUP` once the connection is over (closed, aborted, the peer gone).
    /// Level- and edge-triggered both work: a call that returns `WouldBlock` is what clears
    /// the readiness it could not use.
    ///
    /// For TCP it is the socket itself.
    pub fn readiness_fd(&self) -> io::Result<BorrowedFd<'_>> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.readiness_fd(),
            Kind::Tcp { sock, .. } => Ok(sock.as_fd()),
        }
    }

    /// Makes `r` this stream's readiness: a pair from
    /// [`crate::transport::Readiness::waiting`] handed out as a non-blocking connect's
    /// descriptor before the stream existed, so that what waits on it (an epoll set) goes on
    /// waiting on the stream. Only before [`SmcStream::readiness_fd`] was called; an SMC stream
    /// only.
    pub fn adopt_readiness(&self, r: crate::transport::Readiness) -> io::Result<()> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.adopt_readiness(r),
            Kind::Tcp { .. } => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a TCP stream's readiness is its socket",
            )),
        }
    }

    fn read_impl(&self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.read(buf),
            Kind::Tcp { sock, .. } => (&*sock).read(buf),
        }
    }

    fn write_impl(&self, buf: &[u8]) -> io::Result<usize> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.write_with(buf, false, false),
            Kind::Tcp { sock, .. } => (&*sock).write(buf),
        }
    }

    fn flush_impl(&self) -> io::Result<()> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.flush(),
            Kind::Tcp { .. } => Ok(()),
        }
    }

    /// `recv(2)` with `MSG_PEEK` (`peek`) and `MSG_DONTWAIT` (`dontwait`: this call does not
    /// wait even on a blocking stream).
    pub fn recv_with(&self, buf: &mut [u8], peek: bool, dontwait: bool) -> io::Result<usize> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.read_opts(buf, peek, dontwait),
            Kind::Tcp { sock, .. } => {
                let mut f = rustix::net::RecvFlags::empty();
                if peek {
                    f |= rustix::net::RecvFlags::PEEK;
                }
                if dontwait {
                    f |= rustix::net::RecvFlags::DONTWAIT;
                }
                rustix::net::recv(sock, buf, f)
                    .map(|(n, _)| n)
                    .map_err(io::Error::from)
            }
        }
    }

    /// `send(2)` with `MSG_MORE` (`more`) and `MSG_DONTWAIT` (`dontwait`). A broken
    /// connection is `BrokenPipe`; no `SIGPIPE` is raised (the caller decides).
    pub fn send_with(&self, buf: &[u8], more: bool, dontwait: bool) -> io::Result<usize> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.write_opts(buf, more, false, dontwait),
            Kind::Tcp { sock, .. } => {
                let mut f = rustix::net::SendFlags::NOSIGNAL;
                if more {
                    f |= rustix::net::SendFlags::MORE;
                }
                if dontwait {
                    f |= rustix::net::SendFlags::DONTWAIT;
                }
                rustix::net::send(sock, buf, f).map_err(io::Error::from)
            }
        }
    }

    /// Bytes readable without waiting (`FIONREAD`).
    pub fn available(&self) -> io::Result<usize> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => conn.available(),
            Kind::Tcp { sock, .. } => {
                let mut v: libc::c_int = 0;
                // SAFETY: FIONREAD writes one int through the pointer we pass.
                let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::FIONREAD, &mut v) };
                if r < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(v.max(0) as usize)
            }
        }
    }

    /// Bytes a send takes now without waiting, for SMC; `None` for a TCP connection (its
    /// socket knows).
    pub fn send_space(&self) -> Option<io::Result<usize>> {
        match &self.inner.kind {
            Kind::Smc { conn, .. } => Some(conn.send_space()),
            Kind::Tcp { .. } => None,
        }
    }

    /// The TCP socket under the stream: the connection itself for TCP, the CLC socket for
    /// SMC (socket options the stream does not implement belong there, as the kernel
    /// forwards them to its `clcsock`).
    pub fn tcp_socket(&self) -> BorrowedFd<'_> {
        self.tcp().as_fd()
    }

    /// A fallback stream's TCP socket as a descriptor of its own (a duplicate: the stream's
    /// handle closes with it), for a program that takes the connection over; an SMC stream
    /// is given back.
    pub fn into_tcp(self) -> Result<TcpStream, SmcStream> {
        match &self.inner.kind {
            Kind::Tcp { sock, .. } => match rustix::io::fcntl_dupfd_cloexec(sock, 0) {
                Ok(fd) => Ok(TcpStream::from(fd)),
                Err(_) => Err(self),
            },
            Kind::Smc { .. } => Err(self),
        }
    }

    /// The local fallback reason a TCP stream records (`PEERNOSMC` etc.).
    pub fn fallback_reason(&self) -> Option<ReasonCode> {
        self.fallback().map(|f| f.local)
    }
}

impl Read for SmcStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_impl(buf)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let buf = bufs
            .iter_mut()
            .find(|b| !b.is_empty())
            .map_or(&mut [][..], |b| &mut **b);
        self.read_impl(buf)
    }
}

impl Read for &SmcStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_impl(buf)
    }
}

impl Write for SmcStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_impl(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let buf = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &**b);
        self.write_impl(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_impl()
    }
}

impl Write for &SmcStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_impl(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_impl()
    }
}

impl AsRawFd for SmcStream {
    /// The readiness descriptor ([`SmcStream::readiness_fd`]); `-1` if it cannot be created.
    fn as_raw_fd(&self) -> RawFd {
        self.readiness_fd().map_or(-1, |fd| fd.as_raw_fd())
    }
}

impl SmcStream {
    /// Whether `e` on this stream means the SMC peer is gone for good.
    pub fn is_reset(e: &io::Error) -> bool {
        matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
        )
    }

    /// Waits for the stream to be readable, at most `timeout` (a helper for simple loops).
    pub fn wait_readable(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let fd = self.readiness_fd()?;
        let ts = timeout.map(|t| rustix::time::Timespec {
            tv_sec: t.as_secs() as i64,
            tv_nsec: i64::from(t.subsec_nanos()),
        });
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        Ok(rustix::event::poll(&mut fds, ts.as_ref())? > 0)
    }
}

/// A connect that has not finished ([`SmcStream::connect_nonblocking`]): the socket to wait on
/// and what to wait for change as it goes (the TCP connect, then the CLC handshake).
///
/// Its descriptor is the connect's socket itself (no duplicate: at 10,000 connects in flight
/// a duplicate each was half the process's descriptors). After the finish it is still that
/// socket, now the stream's, whose clone this object keeps, so an event loop can take its
/// registration out; drop this object once the connect finished, since the clone keeps the
/// connection open. After a failed connect the socket is closed, which took it out of every
/// epoll set, and the descriptor is a placeholder that is never ready.
#[derive(Debug)]
pub struct SmcConnecting {
    engine: Arc<Engine>,
    c: Connecting,
    /// The finished stream (a clone of what `try_finish` returned).
    done: Option<SmcStream>,
}

/// The process's placeholder for the descriptor of a failed connect: an empty epoll
/// instance, neither readable nor writable, ever (an eventfd would be writable).
fn gone_fd() -> io::Result<BorrowedFd<'static>> {
    static GONE: OnceLock<rustix::fd::OwnedFd> = OnceLock::new();
    if let Some(fd) = GONE.get() {
        return Ok(fd.as_fd());
    }
    let fd = crate::sys::banded(rustix::event::epoll::create(
        rustix::event::epoll::CreateFlags::CLOEXEC,
    )?);
    Ok(GONE.get_or_init(|| fd).as_fd())
}

impl SmcConnecting {
    /// Whether to wait for the descriptor to be readable (else writable).
    pub fn wants_read(&self) -> bool {
        self.c.interest().contains(rustix::event::PollFlags::IN)
    }

    /// Goes on as far as possible without waiting and, when the stream is there, makes it
    /// non-blocking (what an event loop wants).
    pub fn try_finish_nonblocking(&mut self) -> io::Result<Option<SmcStream>> {
        let s = self.try_finish()?;
        if let Some(s) = &s {
            s.set_nonblocking(true)?;
        }
        Ok(s)
    }

    /// From now on the connect ends in TCP whatever the peer answers (an Accept gets a
    /// Decline with `SMC_CLC_DECL_INTERR`); `false` when SMC is decided already. For a caller
    /// whose connect in flight is shared by another process (a `fork`), which could not use
    /// an SMC connection set up after it.
    pub fn decline_smc(&mut self) -> bool {
        self.done.is_none() && self.c.decline_smc()
    }

    /// When the handshake gives up, if it has begun.
    pub fn deadline(&self) -> Option<std::time::Instant> {
        self.c.deadline()
    }

    /// A connect already known to end as plain TCP (no SMC device, no SMC listener at the
    /// destination), its TCP connect still under way: the TCP socket as it is (non-blocking,
    /// `SO_ERROR` untouched) and the fallback's reason, for a caller that hands the socket
    /// itself to the application. `None`, taking nothing, otherwise.
    pub fn take_plain(&mut self) -> Option<(TcpStream, ReasonCode)> {
        self.c.take_plain()
    }

    /// Goes on as far as possible without waiting: `Ok(Some)` is the connected stream (SMC or
    /// TCP), `Ok(None)` means wait again, an error is the connect's error (what `SO_ERROR`
    /// would say).
    pub fn try_finish(&mut self) -> io::Result<Option<SmcStream>> {
        if self.done.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the connect already finished",
            ));
        }
        let s = self
            .c
            .step()?
            .map(|o| SmcStream::from_outcome(&self.engine, o, false));
        self.done.clone_from(&s);
        Ok(s)
    }
}

impl AsFd for SmcConnecting {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.done {
            Some(s) => s.tcp().as_fd(),
            None if self.c.in_progress() => self.c.fd(),
            // Made before the connect started, so it exists.
            None => gone_fd().expect("made at the start of the connect"),
        }
    }
}

impl AsRawFd for SmcConnecting {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}
