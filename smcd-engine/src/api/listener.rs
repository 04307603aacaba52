//! [`SmcListener`]: a `std::net::TcpListener` look-alike that accepts SMC-D connections from
//! SMC-capable clients and plain TCP connections from everyone else.

use super::stream::SmcStream;
use crate::driver::engine::Engine;
use crate::driver::listener::{ListenOptions, ListenerCore};
use rustix::fd::{AsRawFd, BorrowedFd, RawFd};
use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;

/// The backlog `std`'s `TcpListener::bind` uses.
pub const DEFAULT_BACKLOG: u32 = 128;

/// A listening socket.
#[derive(Debug)]
pub struct SmcListener {
    core: Arc<ListenerCore>,
}

impl SmcListener {
    /// Binds and listens through the process-wide engine.
    pub fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<SmcListener> {
        Self::bind_with(Engine::global(), addr)
    }

    /// Binds and listens through `engine`.
    pub fn bind_with<A: ToSocketAddrs>(engine: &Arc<Engine>, addr: A) -> io::Result<SmcListener> {
        Self::bind_with_backlog(engine, addr, DEFAULT_BACKLOG)
    }

    /// Binds and listens with an explicit backlog: it bounds in-progress handshakes plus
    /// connections waiting for `accept`.
    pub fn bind_with_backlog<A: ToSocketAddrs>(
        engine: &Arc<Engine>,
        addr: A,
        backlog: u32,
    ) -> io::Result<SmcListener> {
        Self::bind_with_options(
            engine,
            addr,
            ListenOptions {
                backlog,
                limit_hs: None,
            },
        )
    }

    /// Binds and listens with explicit options: the backlog, and handshake limitation for this
    /// listener (the kernel's `setsockopt(SOL_SMC, SMC_LIMIT_HS)` before `listen()`; by
    /// default the namespace's `limit_smc_hs` at the time of listening).
    pub fn bind_with_options<A: ToSocketAddrs>(
        engine: &Arc<Engine>,
        addr: A,
        opts: ListenOptions,
    ) -> io::Result<SmcListener> {
        let mut last = None;
        for a in addr.to_socket_addrs()? {
            match Self::bind_one(engine, a, opts) {
                Ok(l) => return Ok(l),
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

    /// Takes over `tcp`, a socket that is bound and listening already (a program's own
    /// listener that a preload library makes an SMC listener).
    pub fn from_listening(
        engine: &Arc<Engine>,
        tcp: TcpListener,
        opts: ListenOptions,
    ) -> io::Result<SmcListener> {
        Ok(SmcListener {
            core: ListenerCore::start(Arc::clone(engine), tcp, opts)?,
        })
    }

    /// A view of `tcp`, a listening socket shared with the process that made it an SMC
    /// listener (a forked worker): this process accepts from it with `engine`, and nothing is
    /// registered (see `ListenerCore::start_view`).
    pub fn view_of(
        engine: &Arc<Engine>,
        tcp: TcpListener,
        opts: ListenOptions,
        of: &SmcListener,
    ) -> io::Result<SmcListener> {
        Ok(SmcListener {
            core: ListenerCore::start_view(Arc::clone(engine), tcp, opts, &of.core)?,
        })
    }

    /// Another process accepts from this listener's socket too (it has a
    /// [`SmcListener::view_of`]): smcd stops announcing clients to this listener, whose
    /// intents that process cannot see. Connections keep being told apart by the SMC option.
    pub fn set_shared(&self) {
        self.core.set_shared();
    }

    /// The process is about to fork with this listener: its socket becomes shared with the
    /// child. Until this process's program accepts again, connections the program is not
    /// waiting for are left in the kernel's queue for whichever process accepts (a server
    /// whose master listens and whose forked workers accept; with the SMC option program).
    pub fn note_fork(&self) {
        self.core.note_fork();
    }

    /// Stops being an SMC listener while the socket listens on (a program `exec`s with it
    /// inherited): deregistered from smcd and the SMC option program, threads stopped,
    /// connections accepted but not yet taken closed; the socket itself is left alone, and
    /// dropping this afterwards does not shut it down.
    pub fn detach(&self) {
        self.core.detach();
    }

    /// Stops without touching the socket or its SMC option registration: another program got
    /// the socket across an `exec` (withdrawn there with [`SmcListener::withdraw`]) and may
    /// have registered it again. Dropping this afterwards does not shut the socket down.
    pub fn abandon(&self) {
        self.core.abandon();
    }

    /// Clients stop being told this socket is an SMC listener (smcd answers its intents with
    /// plain TCP, its SMC option registration is deleted), in every process that holds it;
    /// connections already accepted are told apart as before. See [`SmcListener::detach`].
    pub fn withdraw(&self) {
        self.core.withdraw();
    }

    /// The TCP listener itself (for its socket options and names).
    pub fn tcp_socket(&self) -> BorrowedFd<'_> {
        self.core.tcp_socket()
    }

    fn bind_one(
        engine: &Arc<Engine>,
        addr: SocketAddr,
        opts: ListenOptions,
    ) -> io::Result<SmcListener> {
        let backlog = opts.backlog.max(1);
        use rustix::net::{AddressFamily, SocketFlags, SocketType};
        let fam = if addr.is_ipv4() {
            AddressFamily::INET
        } else {
            AddressFamily::INET6
        };
        let sock = rustix::net::socket_with(fam, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
        rustix::net::sockopt::set_socket_reuseaddr(&sock, true)?;
        rustix::net::bind(&sock, &addr)?;
        rustix::net::listen(&sock, backlog.clamp(1, i32::MAX as u32) as i32)?;
        let tcp = TcpListener::from(sock);
        Ok(SmcListener {
            core: ListenerCore::start(Arc::clone(engine), tcp, opts)?,
        })
    }

    /// Accepts a connection (SMC-D or TCP) and the client's address.
    pub fn accept(&self) -> io::Result<(SmcStream, SocketAddr)> {
        self.core.accept().map(|a| {
            (
                SmcStream::from_outcome(&self.core.engine(), a.outcome, true),
                a.peer,
            )
        })
    }

    /// An endless iterator over accepted connections.
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { listener: self }
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.core.local_addr())
    }

    /// Non-blocking `accept`.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.core.set_nonblocking(on);
        Ok(())
    }

    /// A descriptor `poll`/`epoll` can wait on: readable when [`SmcListener::accept`] has
    /// something (a new TCP connection, or a finished handshake).
    pub fn readiness_fd(&self) -> io::Result<BorrowedFd<'_>> {
        self.core.readiness_fd()
    }

    /// Whether handshake limitation is on for this listener.
    pub fn limit_hs(&self) -> bool {
        self.core.hs_limit()
    }

    /// Handshakes queued or running (for tests and diagnostics).
    pub fn handshakes_in_progress(&self) -> usize {
        self.core.handshakes_in_progress()
    }

    /// Of those, the ones waiting for bytes in the application's own readiness descriptor
    /// (an event loop drives them, see `docs/engine.md`); for tests and diagnostics.
    pub fn handshakes_parked(&self) -> usize {
        self.core.handshakes_parked()
    }
}

impl AsRawFd for SmcListener {
    /// The readiness descriptor; `-1` if it cannot be created.
    fn as_raw_fd(&self) -> RawFd {
        self.core.readiness_fd().map_or(-1, |fd| fd.as_raw_fd())
    }
}

impl Drop for SmcListener {
    fn drop(&mut self) {
        self.core.close();
    }
}

/// Iterator returned by [`SmcListener::incoming`].
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a SmcListener,
}

impl Iterator for Incoming<'_> {
    type Item = io::Result<SmcStream>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(self.listener.accept().map(|(s, _)| s))
    }
}
