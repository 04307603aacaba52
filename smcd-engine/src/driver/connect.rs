//! The client's connect (`smc_connect` / `__smc_connect`): find out whether an SMC listener
//! expects this connection, connect TCP, then run CLC or fall back. Where smcd's SMC option
//! program is in effect this is the kernel's way: the socket is marked (`tp->syn_smc`), its
//! SYN carries the option, and the SYN-ACK says whether CLC runs (no option: plain TCP with
//! PEERNOSMC, no CLC byte, no delay). Otherwise smcd's listener table, then a connect intent.
//!
//! [`Connecting`] does all of it step by step without waiting, so a connect can return at once
//! and finish as the socket becomes ready (`EINPROGRESS` semantics: wait for [`Connecting::fd`]
//! to become ready for [`Connecting::interest`], then [`Connecting::step`] again); a blocking
//! connect is the same machine driven by `poll`.
//!
//! The source address and port are fixed before `smcd` is asked, so the listener can match the
//! connection it accepts to the intent without reading a byte from it.

use super::engine::{Attached, Engine};
use super::handshake::{ClientRun, Fallback, Outcome};
use crate::ipc::ConnectVerdict;
use crate::layout::Lookup;
use crate::layout::status as st;
use rustix::event::{PollFd, PollFlags};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{AddressFamily, SocketFlags, SocketType};
use smc_proto::clc::ReasonCode;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Instant;

fn family(a: &SocketAddr) -> AddressFamily {
    if a.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    }
}

fn to_std(a: rustix::net::SocketAddrAny) -> io::Result<SocketAddr> {
    SocketAddr::try_from(a).map_err(|_| io::Error::other("not an IP socket address"))
}

/// How many source ports a connect tries before it gives up on SMC.
const PORT_TRIES: usize = 64;

/// A TCP socket; `blocking` for a connect that waits in the kernel (as `TcpStream::connect`),
/// else its connect returns at once. The CLC exchange never blocks either way (it passes
/// `MSG_DONTWAIT`).
fn tcp_socket(addr: &SocketAddr, blocking: bool) -> io::Result<OwnedFd> {
    let flags = if blocking {
        SocketFlags::CLOEXEC
    } else {
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK
    };
    Ok(crate::sys::banded(rustix::net::socket_with(
        family(addr),
        SocketType::STREAM,
        flags,
        None,
    )?))
}

/// A socket bound to `src` and a random port of the kernel's ephemeral range, so the port is
/// known before `smcd` is told about the connection.
///
/// Why not `bind(src, 0)`: with many TIME_WAIT sockets around the kernel searches the whole
/// range for a free port (milliseconds per call under a connect/close load). A random port
/// with `SO_REUSEADDR` binds only where every other user of the port set `SO_REUSEADDR` too,
/// i.e. never next to a plain client's connection (so the listener can never mistake one for
/// ours; the engine's own plain connections do not use it either, see [`Connecting::open`]);
/// `smcd` refuses a second pending intent for the same address, and `connect()` refuses a
/// 4-tuple still in use. `None` means: that port is taken, try another.
///
/// The socket is `given` when there is one (taken only when the bind succeeds: a failed bind
/// leaves it unbound for the next try); then the third value is its own `SO_REUSEADDR`, which
/// [`restore_reuseaddr`] puts back once it is connected.
fn bind_engine_port(
    src: IpAddr,
    dst: &SocketAddr,
    blocking: bool,
    given: &mut Option<OwnedFd>,
) -> io::Result<Option<(OwnedFd, SocketAddr, Option<bool>)>> {
    let (lo, hi) = port_range();
    let port = lo + (crate::sys::unique_u64() % u64::from(hi - lo + 1)) as u16;
    let (sock, own) = match given.take() {
        Some(s) => {
            let own = rustix::net::sockopt::socket_reuseaddr(&s)?;
            (s, Some(own))
        }
        None => (tcp_socket(dst, blocking)?, None),
    };
    rustix::net::sockopt::set_socket_reuseaddr(&sock, true)?;
    match rustix::net::bind(&sock, &SocketAddr::new(src, port)) {
        Ok(()) => Ok(Some((sock, SocketAddr::new(src, port), own))),
        Err(rustix::io::Errno::ADDRINUSE) => {
            if let Some(own) = own {
                rustix::net::sockopt::set_socket_reuseaddr(&sock, own)?;
                *given = Some(sock);
            }
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// A given socket connected from the engine's port gets the program's `SO_REUSEADDR` back
/// (off, mostly): the port stays the connection's alone, as the engine's own sockets' is
/// (no engine can bind next to it without the option on both).
fn restore_reuseaddr(sock: &OwnedFd, own: Option<bool>) -> io::Result<()> {
    match own {
        Some(false) => Ok(rustix::net::sockopt::set_socket_reuseaddr(sock, false)?),
        _ => Ok(()),
    }
}

/// The kernel's ephemeral port range (`net.ipv4.ip_local_port_range`), read once.
fn port_range() -> (u16, u16) {
    static RANGE: std::sync::OnceLock<(u16, u16)> = std::sync::OnceLock::new();
    *RANGE.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| {
                let mut it = s.split_whitespace().filter_map(|x| x.parse::<u16>().ok());
                Some((it.next()?, it.next()?))
            })
            .filter(|(lo, hi)| lo <= hi && *lo > 0)
            .unwrap_or((32768, 60999))
    })
}

/// The source address the kernel picks for `dst` (a connected UDP socket says, without
/// sending anything).
fn source_for(dst: SocketAddr) -> io::Result<IpAddr> {
    let udp =
        rustix::net::socket_with(family(&dst), SocketType::DGRAM, SocketFlags::CLOEXEC, None)?;
    rustix::net::connect(&udp, &dst)?;
    Ok(to_std(rustix::net::getsockname(&udp)?)?.ip())
}

/// Starts the TCP connect: `Some(true)` when it is done (a blocking socket, or one that
/// connected at once), `Some(false)` when it is under way, `None` when this 4-tuple is still
/// in use (a TIME_WAIT of an earlier connection).
fn start_connect(sock: &OwnedFd, addr: &SocketAddr) -> io::Result<Option<bool>> {
    match rustix::net::connect(sock, addr) {
        Ok(()) => Ok(Some(true)),
        // Interrupted, the kernel carries on with it: wait for it as for a non-blocking one.
        Err(rustix::io::Errno::INPROGRESS | rustix::io::Errno::INTR) => Ok(Some(false)),
        Err(rustix::io::Errno::ADDRNOTAVAIL | rustix::io::Errno::ADDRINUSE) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// What the connection will be once TCP is up.
#[derive(Debug)]
enum Plan {
    /// Plain TCP with this reason.
    Plain(ReasonCode),
    /// A CLC Proposal to a listener smcd announced us to.
    Smc(Attached, ConnectVerdict),
    /// The SYN carries the SMC option: the SYN-ACK decides.
    Option(Attached),
}

#[derive(Debug)]
enum Phase {
    /// The TCP connect, under way (`false`) or done by a blocking connect (`true`).
    Tcp(TcpStream, Plan, bool),
    Clc(Box<ClientRun>),
    /// The connect failed: it keeps saying so.
    Failed(io::ErrorKind, String),
    Done,
}

/// How a connection learned whether its peer speaks SMC (`smcctl -d stats` counts both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// The SMC TCP option: the socket was marked, the SYN-ACK answered.
    Option,
    /// smcd: its listener table, or a connect intent.
    Intent,
}

/// The socket, what it will be, whether its TCP connect is done, and by which path it was
/// decided (`None`: neither was asked, no device).
type Opened = (OwnedFd, Plan, bool, Option<Path>);

/// A connect under way.
#[derive(Debug)]
pub struct Connecting {
    engine: Arc<Engine>,
    phase: Phase,
    path: Option<Path>,
    /// End in TCP whatever the peer answers ([`Connecting::decline_smc`]).
    decline: bool,
    /// The buffer sizes the program set on the socket it gave ([`user_bufsizes`]).
    bufs: UserBufs,
}

/// `SO_RCVBUF` and `SO_SNDBUF` a program set on its socket, as it set them (the kernel keeps
/// twice the value): they size the connection's DMB and send buffer instead of `rmem` and
/// `wmem`, as the kernel's SMC socket takes what `setsockopt` set (`SOCK_RCVBUF_LOCK`,
/// `smc_adjust_sock_bufsizes`) and otherwise the sysctls.
#[derive(Debug, Clone, Copy, Default)]
pub struct UserBufs {
    /// The receive buffer (DMB) size asked for.
    pub rcv: Option<u32>,
    /// The send buffer size asked for.
    pub snd: Option<u32>,
}

impl UserBufs {
    /// `settings` with these sizes instead of `rmem`/`wmem`.
    pub fn apply(self, mut settings: crate::settings::Settings) -> crate::settings::Settings {
        if let Some(r) = self.rcv {
            settings.rmem = r;
        }
        if let Some(w) = self.snd {
            settings.wmem = w;
        }
        settings
    }
}

/// What the program set on `sock`, an unconnected TCP socket, by its buffer sizes against a
/// fresh socket's (`tcp_rmem[1]`/`tcp_wmem[1]`, read once): user space cannot read the
/// kernel's lock flags, so a size set to exactly the default reads as not set (and then the
/// sysctl's, which by default is the same 64 KiB for the receive side).
pub fn user_bufsizes(sock: impl AsFd) -> UserBufs {
    use rustix::net::sockopt::{socket_recv_buffer_size, socket_send_buffer_size};
    static DEFAULTS: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    let &(rcv0, snd0) = DEFAULTS.get_or_init(|| {
        rustix::net::socket_with(
            AddressFamily::INET,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .ok()
        .and_then(|s| {
            Some((
                socket_recv_buffer_size(&s).ok()?,
                socket_send_buffer_size(&s).ok()?,
            ))
        })
        .unwrap_or((0, 0))
    });
    let set = |v: io::Result<usize>, default: usize| {
        v.ok()
            .filter(|&v| default != 0 && v != default)
            .and_then(|v| u32::try_from(v / 2).ok())
    };
    UserBufs {
        rcv: set(socket_recv_buffer_size(&sock).map_err(Into::into), rcv0),
        snd: set(socket_send_buffer_size(&sock).map_err(Into::into), snd0),
    }
}

impl Connecting {
    /// Decides SMC or TCP and starts the TCP connect; returns at once (apart from one round
    /// trip to smcd when the destination has an SMC listener).
    pub fn start(engine: &Arc<Engine>, addr: SocketAddr) -> io::Result<Self> {
        Self::begin(engine, addr, false, None)
    }

    /// [`Connecting::start`] from `sock`, an unconnected TCP socket of `addr`'s family (a
    /// preloaded program's own, with the options it set, bound or not): the connection is
    /// made on it, as the kernel's on its clcsock. On the option path and every plain connect
    /// decided before smcd is asked it is connected as it is; on the intent path a socket
    /// bound to a port announces that address, any other is first bound to the engine's port
    /// (on the address the program bound it to without a port, if it did), and only when
    /// that intent fails after the bind (smcd refused, or the address was announced by
    /// another engine) does a socket of the engine's take over, `sock` being dropped. `blocking` says how `sock` is: a blocking socket's TCP connect
    /// waits in the kernel. Its `SO_RCVBUF`/`SO_SNDBUF`, if the program set them, size the
    /// connection's buffers ([`user_bufsizes`]).
    pub fn start_on(
        engine: &Arc<Engine>,
        addr: SocketAddr,
        sock: OwnedFd,
        blocking: bool,
    ) -> io::Result<Self> {
        let bufs = user_bufsizes(&sock);
        let mut c = Self::begin(engine, addr, blocking, Some(sock))?;
        c.bufs = bufs;
        Ok(c)
    }

    /// [`Connecting::start`] whose TCP connect waits in the kernel: a blocking connect needs
    /// no `poll` and no `SO_ERROR` for it.
    fn start_blocking(engine: &Arc<Engine>, addr: SocketAddr) -> io::Result<Self> {
        Self::begin(engine, addr, true, None)
    }

    fn begin(
        engine: &Arc<Engine>,
        addr: SocketAddr,
        blocking: bool,
        given: Option<OwnedFd>,
    ) -> io::Result<Self> {
        let (sock, plan, connected, path) = Self::open(engine, addr, blocking, given)?;
        Ok(Self {
            engine: Arc::clone(engine),
            phase: Phase::Tcp(TcpStream::from(sock), plan, connected),
            path,
            decline: false,
            bufs: UserBufs::default(),
        })
    }

    fn plain(
        addr: &SocketAddr,
        reason: ReasonCode,
        blocking: bool,
        path: Option<Path>,
        given: Option<OwnedFd>,
    ) -> io::Result<Opened> {
        let sock = match given {
            Some(s) => s,
            None => tcp_socket(addr, blocking)?,
        };
        let Some(connected) = start_connect(&sock, addr)? else {
            return Err(io::Error::from(io::ErrorKind::AddrNotAvailable));
        };
        Ok((sock, Plan::Plain(reason), connected, path))
    }

    /// The socket, what it will be, and whether its TCP connect is done already.
    fn open(
        engine: &Arc<Engine>,
        addr: SocketAddr,
        blocking: bool,
        mut given: Option<OwnedFd>,
    ) -> io::Result<Opened> {
        let Some(attached) = engine.attached() else {
            // No SMC-D device (smcd not running): the kernel falls back with NOSMCDEV before
            // it proposes anything.
            return Self::plain(&addr, ReasonCode::NOSMCDEV, blocking, None, given);
        };
        let session = &attached.session;
        if let Some(maps) = session.option_path() {
            // The kernel's way: mark the socket, connect from a port of its own; the SYN-ACK
            // answers. A socket that cannot be marked goes the intent way below.
            let sock = match given.take() {
                Some(s) => s,
                None => tcp_socket(&addr, blocking)?,
            };
            match maps.mark_client(&sock) {
                Ok(()) => {
                    let Some(connected) = start_connect(&sock, &addr)? else {
                        return Err(io::Error::from(io::ErrorKind::AddrNotAvailable));
                    };
                    return Ok((
                        sock,
                        Plan::Option(attached.clone()),
                        connected,
                        Some(Path::Option),
                    ));
                }
                Err(e) => {
                    tracing::debug!("SMC option path unavailable: {e}");
                    given = Some(sock);
                }
            }
        }
        // The listener table answers "is there an SMC listener at that address?" without a
        // round trip: most connections to plain TCP servers and to congested listeners with
        // handshake limitation never talk to smcd (the kernel's SYN-ACK without the option).
        if let Some(table) = &session.table {
            let no_smc = match table.lookup(addr, session.netns()) {
                Lookup::None => true,
                Lookup::Found(e) if e.hs_limit => {
                    session.listener_page(e.id).is_ok_and(|p| p.congested())
                }
                Lookup::Found(_) | Lookup::Ask => false,
            };
            if no_smc {
                return Self::plain(
                    &addr,
                    ReasonCode::PEERNOSMC,
                    blocking,
                    Some(Path::Intent),
                    given,
                );
            }
        }
        let bound = given
            .as_ref()
            .and_then(|s| to_std(rustix::net::getsockname(s).ok()?).ok());
        // A given socket the program bound to a port of its own: that address is the one
        // smcd is told, and the connection's either way (plain from the program's own port is
        // what its TCP connect would be).
        if let Some(local) = bound.filter(|a| a.port() != 0)
            && let Some(sock) = given.take()
        {
            let v = match session.connect_intent(local, addr) {
                Ok(v) if v.smc => v,
                Ok(v) => {
                    let reason = ReasonCode(v.reason);
                    return Self::plain(&addr, reason, blocking, Some(Path::Intent), Some(sock));
                }
                Err(e) => {
                    tracing::debug!("smcd connect intent for a bound socket failed: {e}");
                    let reason =
                        if e.raw_os_error() == Some(rustix::io::Errno::ADDRINUSE.raw_os_error()) {
                            ReasonCode::INTERR
                        } else {
                            engine.smcd_failed(session);
                            ReasonCode::NOSMCDEV
                        };
                    return Self::plain(&addr, reason, blocking, None, Some(sock));
                }
            };
            let started = start_connect(&sock, &addr);
            if !matches!(started, Ok(Some(_))) {
                session.intent_done(v.intent, false);
            }
            let Some(connected) = started? else {
                return Err(io::Error::from(io::ErrorKind::AddrNotAvailable));
            };
            return Ok((
                sock,
                Plan::Smc(attached.clone(), v),
                connected,
                Some(Path::Intent),
            ));
        }
        // Bound to an address without a port (`IP_BIND_ADDRESS_NO_PORT`): the connection
        // comes from that address, on the engine's port (a second bind is allowed while the
        // socket has no port).
        let src = match bound.map(|a| a.ip()).filter(|ip| !ip.is_unspecified()) {
            Some(ip) => ip,
            None => engine.source_for(addr.ip(), || source_for(addr))?,
        };
        for _ in 0..PORT_TRIES {
            let Some((sock, local, own)) = bind_engine_port(src, &addr, blocking, &mut given)?
            else {
                continue;
            };
            let verdict = match session.connect_intent(local, addr) {
                Ok(v) => v,
                // Another engine announced the same source port to this listener.
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::ADDRINUSE.raw_os_error()) => {
                    continue;
                }
                Err(e) => {
                    tracing::debug!("smcd connect intent failed: {e}");
                    engine.smcd_failed(session);
                    // Not on the engine's port (see below).
                    drop(sock);
                    return Self::plain(&addr, ReasonCode::NOSMCDEV, blocking, None, given);
                }
            };
            if !verdict.smc {
                // Refused (handshake limitation, an intent the listener could not take): a
                // plain connection, and never from the engine's port. That port was bound with
                // SO_REUSEADDR, so another engine connect could bind it again while this
                // connection waits in the listener's queue, announce an intent for the same
                // address, and (if this connection is accepted and closed before that connect
                // starts) the listener would give that intent to this connection and take the
                // announced one, which carries a Proposal, for plain TCP. From a port of its
                // own (autobind, no SO_REUSEADDR) no engine can bind the same address while
                // this connection lives, so an intent for an address always belongs to the
                // connection the listener takes next from it, or to none.
                drop(sock);
                return Self::plain(
                    &addr,
                    ReasonCode(verdict.reason),
                    blocking,
                    Some(Path::Intent),
                    given,
                );
            }
            let started = start_connect(&sock, &addr);
            if !matches!(started, Ok(Some(_))) {
                // The listener must forget the intent it was told about.
                session.intent_done(verdict.intent, false);
            }
            let Some(connected) = started? else {
                continue;
            };
            restore_reuseaddr(&sock, own)?;
            return Ok((
                sock,
                Plan::Smc(attached.clone(), verdict),
                connected,
                Some(Path::Intent),
            ));
        }
        // No usable port after many tries: go plain TCP rather than fail.
        Self::plain(&addr, ReasonCode::INTERR, blocking, None, given)
    }

    /// After the TCP connect of a marked socket: what the SYN-ACK said. Echoed: CLC runs
    /// (`Plan::Option`). Not echoed, or nothing recorded: plain TCP with PEERNOSMC, as the
    /// kernel's client without the option in the SYN-ACK. A SYN that went out without the
    /// option means the program does not cover this process: later connects use intents.
    fn option_verdict(a: Attached, sock: &TcpStream) -> Plan {
        let seen = a.session.option_path().map(|m| m.sock_option(sock));
        match seen {
            Some(Ok(o)) if o.clc_runs() == Some(true) => Plan::Option(a),
            Some(Ok(o)) => {
                if o.marked_client() && !o.syn_sent() {
                    a.session.option_not_covering();
                }
                Plan::Plain(ReasonCode::PEERNOSMC)
            }
            _ => Plan::Plain(ReasonCode::PEERNOSMC),
        }
    }

    /// The socket to wait on.
    ///
    /// # Panics
    ///
    /// Once the connect has finished or failed there is no socket any more; callers that must
    /// keep a descriptor (an event loop's registration) keep a duplicate
    /// (`api::SmcConnecting` does).
    pub fn fd(&self) -> BorrowedFd<'_> {
        match &self.phase {
            Phase::Tcp(s, ..) => s.as_fd(),
            Phase::Clc(run) => run.fd(),
            Phase::Failed(..) | Phase::Done => panic!("a finished connect has no socket"),
        }
    }

    /// From now on the connect ends in TCP (a Proposal still goes out if the plan is SMC, and
    /// the Accept is answered with a Decline: `ClientRun::decline_smc`). `false` when it is
    /// too late: SMC is decided already.
    pub fn decline_smc(&mut self) -> bool {
        self.decline = true;
        match &mut self.phase {
            Phase::Clc(run) => {
                run.decline_smc();
                !run.smc_decided()
            }
            _ => true,
        }
    }

    /// Whether it still has its socket (neither finished nor failed).
    pub fn in_progress(&self) -> bool {
        matches!(self.phase, Phase::Tcp(..) | Phase::Clc(_))
    }

    /// What to wait for before the next [`Self::step`].
    pub fn interest(&self) -> PollFlags {
        match &self.phase {
            Phase::Tcp(..) | Phase::Failed(..) | Phase::Done => PollFlags::OUT,
            Phase::Clc(run) => run.interest(),
        }
    }

    /// When the CLC handshake gives up (the TCP connect has the kernel's timeouts).
    pub fn deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Clc(run) => run.deadline(),
            _ => None,
        }
    }

    /// Makes what progress the socket allows without waiting: `Ok(None)` means wait for
    /// [`Self::interest`] on [`Self::fd`] and call again; `Ok(Some)` is the connection (SMC or
    /// TCP with its fallback reason); an error is the connect's error (`SO_ERROR`).
    pub fn step(&mut self) -> io::Result<Option<Outcome>> {
        if let Phase::Failed(kind, msg) = &self.phase {
            return Err(io::Error::new(*kind, msg.clone()));
        }
        let r = self.step_inner();
        if let Err(e) = &r {
            // Whatever failed, a later call says so again (SO_ERROR is read only once).
            let counted = matches!(self.phase, Phase::Done);
            self.phase = Phase::Failed(e.kind(), e.to_string());
            if counted {
                self.engine.status().add(st::T_CLNT_HS_ERR, 1);
            }
        }
        if let Ok(Some(o)) = &r {
            self.count(match o {
                Outcome::Smc { .. } => None,
                Outcome::Tcp(_, fb) => Some(fb.local),
            });
        }
        r
    }

    /// Counts the finished connect: its path, and SMC or the fallback's reason.
    fn count(&self, fallback: Option<ReasonCode>) {
        let status = self.engine.status();
        match self.path {
            Some(Path::Option) => status.add(st::T_CLNT_PATH_OPTION, 1),
            Some(Path::Intent) => status.add(st::T_CLNT_PATH_INTENT, 1),
            None => {}
        }
        match fallback {
            None => status.add(st::T_CLNT_V2_SUCC, 1),
            Some(r) => status.add(st::T_CLNT_FBACK + st::fback_index(r), 1),
        }
    }

    /// A connect that is plain TCP whatever its TCP connect does (no SMC device, no SMC
    /// listener at the destination, a refusal), still in the TCP connect: its socket with the
    /// connect in flight and `SO_ERROR` untouched, for a caller that hands it to the
    /// application as the TCP socket it is, and the fallback's reason. Counted as that
    /// fallback. `None` (nothing taken) in any other state.
    pub fn take_plain(&mut self) -> Option<(TcpStream, ReasonCode)> {
        if !matches!(&self.phase, Phase::Tcp(_, Plan::Plain(_), _)) {
            return None;
        }
        let Phase::Tcp(sock, Plan::Plain(reason), _) =
            std::mem::replace(&mut self.phase, Phase::Done)
        else {
            unreachable!("matched above")
        };
        self.count(Some(reason));
        Some((sock, reason))
    }

    fn step_inner(&mut self) -> io::Result<Option<Outcome>> {
        loop {
            match std::mem::replace(&mut self.phase, Phase::Done) {
                Phase::Tcp(sock, plan, connected) => {
                    let err = if connected {
                        None
                    } else {
                        let mut fds = [PollFd::new(&sock, PollFlags::OUT)];
                        let zero = rustix::time::Timespec {
                            tv_sec: 0,
                            tv_nsec: 0,
                        };
                        if rustix::event::poll(&mut fds, Some(&zero))? == 0 {
                            self.phase = Phase::Tcp(sock, plan, connected);
                            return Ok(None);
                        }
                        sock.take_error()?
                    };
                    if let Plan::Smc(a, v) = &plan {
                        a.session.intent_done(v.intent, err.is_none());
                    }
                    if let Some(e) = err {
                        // A TCP error: nothing to count, nothing to fall back to.
                        self.phase = Phase::Failed(e.kind(), e.to_string());
                        return Err(e);
                    }
                    let plan = match plan {
                        Plan::Option(a) => Self::option_verdict(a, &sock),
                        p => p,
                    };
                    match plan {
                        Plan::Plain(reason) => {
                            sock.set_nonblocking(false)?;
                            return Ok(Some(Outcome::Tcp(sock, Fallback::local(reason))));
                        }
                        Plan::Option(a) => {
                            // The SYN-ACK echoed the option: a Proposal, to a listener whose
                            // GID only its Accept will tell.
                            let settings = self.bufs.apply(self.engine.settings());
                            let mut run =
                                ClientRun::new(&self.engine, &a.ism, sock, None, &settings);
                            if self.decline {
                                run.decline_smc();
                            }
                            self.phase = Phase::Clc(Box::new(run));
                        }
                        Plan::Smc(a, v) => {
                            let settings = self.bufs.apply(self.engine.settings());
                            let mut run =
                                ClientRun::new(&self.engine, &a.ism, sock, v.peer_gid, &settings);
                            if self.decline {
                                run.decline_smc();
                            }
                            self.phase = Phase::Clc(Box::new(run));
                        }
                    }
                }
                Phase::Clc(mut run) => match run.step() {
                    Ok(Some(o)) => {
                        if let Outcome::Tcp(s, _) = &o {
                            s.set_nonblocking(false)?;
                        }
                        return Ok(Some(o));
                    }
                    Ok(None) => {
                        self.phase = Phase::Clc(run);
                        return Ok(None);
                    }
                    // A handshake error: the phase stays Done, so it is counted.
                    Err(e) => return Err(e),
                },
                Phase::Failed(kind, msg) => {
                    self.phase = Phase::Failed(kind, msg.clone());
                    return Err(io::Error::new(kind, msg));
                }
                Phase::Done => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "the connect already finished",
                    ));
                }
            }
        }
    }

    /// Runs to the end, waiting on the socket; the TCP connect waits at most `timeout`.
    pub fn run(mut self, timeout: Option<std::time::Duration>) -> io::Result<Outcome> {
        let tcp_deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(o) = self.step()? {
                return Ok(o);
            }
            let deadline = match self.phase {
                Phase::Tcp(..) => tcp_deadline,
                _ => self.deadline(),
            };
            if deadline.is_some_and(|d| Instant::now() >= d) && matches!(self.phase, Phase::Tcp(..))
            {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection timed out",
                ));
            }
            let timeout = deadline.map(|d| {
                let left = d.saturating_duration_since(Instant::now());
                rustix::time::Timespec {
                    tv_sec: left.as_secs() as i64,
                    tv_nsec: i64::from(left.subsec_nanos()),
                }
            });
            let mut fds = [PollFd::from_borrowed_fd(self.fd(), self.interest())];
            match rustix::event::poll(&mut fds, timeout.as_ref()) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Connects to `addr` with `engine`, waiting: SMC-D when the listener is ours, else TCP with
/// the reason.
pub fn connect(
    engine: &Arc<Engine>,
    addr: SocketAddr,
    timeout: Option<std::time::Duration>,
) -> io::Result<Outcome> {
    if timeout.is_some_and(|t| t.is_zero()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "zero connect timeout",
        ));
    }
    // Without a timeout the TCP connect waits in the kernel, as TcpStream::connect's does.
    let c = if timeout.is_none() {
        Connecting::start_blocking(engine, addr)?
    } else {
        Connecting::start(engine, addr)?
    };
    c.run(timeout)
}
