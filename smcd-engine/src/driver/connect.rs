//! The client's connect (`smc_connect` / `__smc_connect`): ask `smcd` whether an SMC
//! listener expects this connection (the SYN option's role), connect TCP, then run CLC or
//! fall back.
//!
//! The source address and port are fixed before `smcd` is asked, so the listener can match the
//! connection it accepts to the intent without reading a byte from it.

use super::engine::Engine;
use super::handshake::{self, Fallback, Outcome};
use crate::layout::Lookup;
use crate::layout::status as st;
use rustix::fd::OwnedFd;
use rustix::net::{AddressFamily, SocketFlags, SocketType};
use smc_proto::clc::ReasonCode;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// A socket bound to `src` and a random port of the kernel's ephemeral range, so the port is
/// known before `smcd` is told about the connection.
///
/// Why not `bind(src, 0)`: with many TIME_WAIT sockets around the kernel searches the whole
/// range for a free port (milliseconds per call under a connect/close load). A random port
/// with `SO_REUSEADDR` binds only where every other user of the port set `SO_REUSEADDR` too,
/// i.e. never next to a plain client's connection (so the listener can never mistake one for
/// ours); `smcd` refuses a second pending intent for the same address, and `connect()`
/// refuses a 4-tuple still in use. `None` means: that port is taken, try another.
fn bind_engine_port(src: IpAddr, fam: AddressFamily) -> io::Result<Option<(OwnedFd, SocketAddr)>> {
    let (lo, hi) = port_range();
    let port = lo + (crate::device::shm::random_u64() % u64::from(hi - lo + 1)) as u16;
    let sock = rustix::net::socket_with(fam, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    rustix::net::sockopt::set_socket_reuseaddr(&sock, true)?;
    match rustix::net::bind(&sock, &SocketAddr::new(src, port)) {
        Ok(()) => Ok(Some((sock, SocketAddr::new(src, port)))),
        Err(rustix::io::Errno::ADDRINUSE) => Ok(None),
        Err(e) => Err(e.into()),
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

/// Connects `sock` to `addr`, waiting at most `timeout`.
fn tcp_connect(
    sock: OwnedFd,
    addr: SocketAddr,
    timeout: Option<Duration>,
) -> io::Result<TcpStream> {
    let Some(timeout) = timeout else {
        loop {
            match rustix::net::connect(&sock, &addr) {
                Ok(()) => return Ok(TcpStream::from(sock)),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    };
    if timeout.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "zero connect timeout",
        ));
    }
    let stream = TcpStream::from(sock);
    stream.set_nonblocking(true)?;
    match rustix::net::connect(&stream, &addr) {
        Ok(()) => {}
        Err(rustix::io::Errno::INPROGRESS) => {
            let deadline = Instant::now() + timeout;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "connection timed out",
                    ));
                }
                let ts = rustix::time::Timespec {
                    tv_sec: left.as_secs() as i64,
                    tv_nsec: i64::from(left.subsec_nanos()),
                };
                let mut fds = [rustix::event::PollFd::new(
                    &stream,
                    rustix::event::PollFlags::OUT,
                )];
                match rustix::event::poll(&mut fds, Some(&ts)) {
                    Ok(0) => continue,
                    Ok(_) => break,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            if let Some(e) = stream.take_error()? {
                return Err(e);
            }
        }
        Err(e) => return Err(e.into()),
    }
    stream.set_nonblocking(false)?;
    Ok(stream)
}

fn plain(addr: SocketAddr, timeout: Option<Duration>) -> io::Result<TcpStream> {
    match timeout {
        Some(t) => TcpStream::connect_timeout(&addr, t),
        None => TcpStream::connect(addr),
    }
}

/// Connects to `addr` with `engine`: SMC-D when the listener is ours, else TCP with the reason.
/// Counts the outcome in the engine's statistics (client successes, fallbacks, handshake
/// errors).
pub fn connect(
    engine: &Arc<Engine>,
    addr: SocketAddr,
    timeout: Option<Duration>,
) -> io::Result<Outcome> {
    let result = connect_inner(engine, addr, timeout);
    // Asked after the connect: a process's first connect opens the device, and only then is
    // the status area the one smcd reads.
    let status = engine.status();
    match &result {
        Ok(Outcome::Smc { .. }) => status.add(st::T_CLNT_V2_SUCC, 1),
        Ok(Outcome::Tcp(_, fb)) => status.add(st::T_CLNT_FBACK + st::fback_index(fb.local), 1),
        Err(_) => {}
    }
    result
}

fn plain_fallback(
    addr: SocketAddr,
    timeout: Option<Duration>,
    reason: ReasonCode,
) -> io::Result<Outcome> {
    let s = plain(addr, timeout)?;
    Ok(Outcome::Tcp(s, Fallback::local(reason)))
}

fn connect_inner(
    engine: &Arc<Engine>,
    addr: SocketAddr,
    timeout: Option<Duration>,
) -> io::Result<Outcome> {
    let Some(dev) = engine.device() else {
        // No SMC-D device (smcd not running): the kernel falls back with NOSMCDEV before it
        // proposes anything.
        return plain_fallback(addr, timeout, ReasonCode::NOSMCDEV);
    };
    // The listener table answers "is there an SMC listener at that address?" without a round
    // trip: most connections to plain TCP servers and to congested listeners with handshake
    // limitation never talk to smcd (the kernel's SYN-ACK without the SMC option).
    if let Some(table) = &dev.table {
        match table.lookup(addr, dev.netns()) {
            Lookup::None => return plain_fallback(addr, timeout, ReasonCode::PEERNOSMC),
            Lookup::Found(e) if e.hs_limit => {
                if dev.listener_page(e.id).is_ok_and(|p| p.congested()) {
                    return plain_fallback(addr, timeout, ReasonCode::PEERNOSMC);
                }
            }
            Lookup::Found(_) | Lookup::Ask => {}
        }
    }
    let settings = engine.settings();
    let src = engine.source_for(addr.ip(), || source_for(addr))?;
    let mut tries = 0;
    let (stream, verdict) = loop {
        tries += 1;
        if tries > PORT_TRIES {
            // No usable port after many tries: go plain TCP rather than fail.
            return plain_fallback(addr, timeout, ReasonCode::INTERR);
        }
        let Some((sock, local)) = bind_engine_port(src, family(&addr))? else {
            continue;
        };
        let verdict = match dev.connect_intent(local, addr) {
            Ok(v) => v,
            // Another engine announced the same source port to this listener: pick another.
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::ADDRINUSE.raw_os_error()) => {
                continue;
            }
            Err(e) => {
                tracing::debug!("smcd connect intent failed: {e}");
                engine.device_failed(&dev);
                let s = tcp_connect(sock, addr, timeout)?;
                return Ok(Outcome::Tcp(s, Fallback::local(ReasonCode::NOSMCDEV)));
            }
        };
        match tcp_connect(sock, addr, timeout) {
            Ok(s) => {
                if verdict.smc {
                    dev.intent_done(verdict.intent, true);
                }
                break (s, verdict);
            }
            Err(e) => {
                if verdict.smc {
                    // The listener must forget the intent it was told about.
                    dev.intent_done(verdict.intent, false);
                }
                // This 4-tuple is still in use (a TIME_WAIT of an earlier connection).
                if matches!(
                    e.raw_os_error(),
                    Some(x) if x == rustix::io::Errno::ADDRNOTAVAIL.raw_os_error()
                        || x == rustix::io::Errno::ADDRINUSE.raw_os_error()
                ) {
                    continue;
                }
                return Err(e);
            }
        }
    };
    if !verdict.smc {
        return Ok(Outcome::Tcp(
            stream,
            Fallback::local(ReasonCode(verdict.reason)),
        ));
    }
    match handshake::client(engine, &dev, stream, verdict.peer_gid, &settings) {
        Err(e) => {
            engine.status().add(st::T_CLNT_HS_ERR, 1);
            Err(e)
        }
        ok => ok,
    }
}
