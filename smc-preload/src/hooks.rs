//! The functions the program calls instead of the C library's.
//!
//! Rules every hook keeps (docs/smc-run.md):
//! - a descriptor that is not ours goes to the C library at once, with nothing else done;
//! - a call made by the library itself (the engine, on its own thread or inside a hook) is
//!   not intercepted (`IN_LIB`);
//! - `errno` is only written when the call fails;
//! - no panic leaves a hook: it becomes `EIO` for that call.

use crate::ep;
use crate::pending;
use crate::real;
use crate::table::{self, CANDIDATE, CONNECTING, INHERITED, LISTENER, NONE, Obj, STREAM};
use libc::{c_int, c_void, size_t, sockaddr, socklen_t, ssize_t};
use smcd_engine::driver::listener::ListenOptions;
use smcd_engine::{Engine, SmcListener, SmcStream};
use std::cell::Cell;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

thread_local! {
    /// Set while this thread runs library code: its socket calls are the library's own.
    static IN_LIB: Cell<bool> = const { Cell::new(false) };
}

fn in_lib() -> bool {
    IN_LIB.try_with(Cell::get).unwrap_or(true)
}

/// Starts a thread of the library's own: every signal blocked (the program's `SIGALRM` or
/// `SIGCHLD` must not land there) and all its calls the library's.
pub(crate) fn spawn_quiet(name: &str, f: impl FnOnce() + Send + 'static) {
    // SAFETY: plain libc calls on sigset_t values we own; the old mask is restored below.
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    };
    let _ = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _ = IN_LIB.try_with(|c| c.set(true));
            f();
        });
    // SAFETY: restores this thread's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
}

/// Makes every later call of this thread the library's (a keeper process, `crate::exec`).
pub(crate) fn in_lib_for_good() {
    let _ = IN_LIB.try_with(|c| c.set(true));
}

/// Runs `f` as library code (its socket calls pass through), catching panics as `EIO`.
fn lib<R>(f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
    let was = IN_LIB.try_with(|c| c.replace(true)).unwrap_or(true);
    let r = std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        debug(format_args!("a panic in the library, reported as EIO"));
        Err(io::Error::from_raw_os_error(libc::EIO))
    });
    let _ = IN_LIB.try_with(|c| c.set(was));
    r
}

pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

fn errno() -> c_int {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() }
}

/// The errno a socket call reports for `e`.
pub(crate) fn errno_of(e: &io::Error) -> c_int {
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    match e.kind() {
        io::ErrorKind::WouldBlock => libc::EAGAIN,
        io::ErrorKind::BrokenPipe => libc::EPIPE,
        io::ErrorKind::ConnectionReset => libc::ECONNRESET,
        io::ErrorKind::ConnectionAborted => libc::ECONNABORTED,
        io::ErrorKind::ConnectionRefused => libc::ECONNREFUSED,
        io::ErrorKind::NotConnected => libc::ENOTCONN,
        io::ErrorKind::TimedOut => libc::ETIMEDOUT,
        io::ErrorKind::InvalidInput => libc::EINVAL,
        io::ErrorKind::Interrupted => libc::EINTR,
        io::ErrorKind::AddrInUse => libc::EADDRINUSE,
        io::ErrorKind::AddrNotAvailable => libc::EADDRNOTAVAIL,
        io::ErrorKind::Unsupported => libc::EOPNOTSUPP,
        _ => libc::EIO,
    }
}

/// `-1` with errno for `e`.
fn fail<T: From<i8>>(e: &io::Error) -> T {
    set_errno(errno_of(e));
    T::from(-1)
}

/// smcd's socket as the environment named it when the library was loaded: a program may
/// replace its environment before it forks its workers (nginx keeps only `TZ` for them), and
/// they still need it.
fn smcd_socket() -> &'static std::path::Path {
    static S: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    S.get_or_init(smcd_engine::ipc::socket_path)
}

/// Reads what the library takes from the environment while it is still the one `smc-run` set
/// (run as a constructor, before the program's `main`).
pub(crate) extern "C" fn init() {
    table::note_pid();
    table::watch_forks();
    crate::exec::find_vfork();
    debug_on();
    ep::init();
    env_size("SMC_SNDBUF");
    smcd_socket();
    let _ = std::panic::catch_unwind(find_inherited_listeners);
}

/// Marks the listening TCP sockets this image inherited (`exec`: nginx's binary upgrade,
/// socket activation, inetd) [`INHERITED`]: each becomes an SMC listener at its first
/// `accept`, `epoll_ctl` or `listen` here, registered by this image's engine (the image that
/// made it one withdrew it before its `exec`: `crate::exec`). Run once, when the library is
/// loaded, before the program can have made a socket of its own.
fn find_inherited_listeners() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let saved = errno();
    for fd in dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<c_int>().ok())
    {
        if table::in_range(fd) && table::kind(fd) == NONE && is_tcp_listener(fd) {
            table::set_kind(fd, INHERITED);
            debug(format_args!("fd {fd}: an inherited TCP listener"));
        }
    }
    set_errno(saved);
}

/// Whether `fd` is a listening TCP socket (`SO_ACCEPTCONN`).
fn is_tcp_listener(fd: c_int) -> bool {
    get_int_opt(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN) == Some(1)
        && matches!(
            get_int_opt(fd, libc::SOL_SOCKET, libc::SO_DOMAIN),
            Some(libc::AF_INET | libc::AF_INET6)
        )
        && get_int_opt(fd, libc::SOL_SOCKET, libc::SO_TYPE) == Some(libc::SOCK_STREAM)
        && get_int_opt(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL) == Some(libc::IPPROTO_TCP)
}

fn debug_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var_os("SMC_DEBUG")
            .is_some_and(|v| !v.is_empty() && v.as_encoded_bytes()[0] != b'0')
    })
}

/// A `SMC_DEBUG` line on stderr (written straight to descriptor 2: no buffering, no hooks).
pub(crate) fn debug(msg: std::fmt::Arguments<'_>) {
    if debug_on() {
        let line = format!("smc-preload[{}]: {msg}\n", std::process::id());
        let _ = rustix::io::write(std::io::stderr(), line.as_bytes());
    }
}

/// `SMC_SNDBUF`/`SMC_RCVBUF` (smc-tools' syntax: a number with an optional k/K/m/M).
fn env_size(name: &str) -> Option<c_int> {
    static CACHE: std::sync::OnceLock<(Option<c_int>, Option<c_int>)> = std::sync::OnceLock::new();
    let parse = |n: &str| -> Option<c_int> {
        let v = std::env::var(n).ok()?;
        let v = v.trim();
        let (num, mult) = match v.as_bytes().last()? {
            b'k' | b'K' => (&v[..v.len() - 1], 1024),
            b'm' | b'M' => (&v[..v.len() - 1], 1024 * 1024),
            _ => (v, 1),
        };
        num.parse::<i64>()
            .ok()
            .and_then(|n| c_int::try_from(n.checked_mul(mult)?).ok())
            .filter(|n| *n > 0)
    };
    let c = CACHE.get_or_init(|| (parse("SMC_SNDBUF"), parse("SMC_RCVBUF")));
    if name == "SMC_SNDBUF" { c.0 } else { c.1 }
}

fn set_int_opt(fd: c_int, level: c_int, name: c_int, v: c_int) {
    // SAFETY: `v` lives across the call and its size is passed.
    unsafe {
        real::setsockopt(
            fd,
            level,
            name,
            (&raw const v).cast(),
            size_of::<c_int>() as socklen_t,
        )
    };
}

fn get_int_opt(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    // SAFETY: `v` and `len` live across the call.
    let r = unsafe { real::getsockopt(fd, level, name, (&raw mut v).cast(), &mut len) };
    (r == 0).then_some(v)
}

/// Reads a socket address the program passed.
///
/// # Safety
/// `addr` points to `len` readable bytes (or is null).
unsafe fn read_addr(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if addr.is_null() {
        return None;
    }
    // SAFETY: the caller's contract; each arm checks the length before reading.
    unsafe {
        match c_int::from((*addr).sa_family) {
            libc::AF_INET if len as usize >= size_of::<libc::sockaddr_in>() => {
                let a = &*addr.cast::<libc::sockaddr_in>();
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                    u16::from_be(a.sin_port),
                )))
            }
            libc::AF_INET6 if len as usize >= size_of::<libc::sockaddr_in6>() => {
                let a = &*addr.cast::<libc::sockaddr_in6>();
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(a.sin6_addr.s6_addr),
                    u16::from_be(a.sin6_port),
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// Writes `a` as the kernel does for `accept`/`getpeername`: truncated to `*len`, with `*len`
/// set to the full size.
///
/// # Safety
/// `addr`/`len` are null or valid as for `accept(2)`.
unsafe fn write_addr(a: SocketAddr, addr: *mut sockaddr, len: *mut socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    // SAFETY: zeroed sockaddr_storage is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let size = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let s = unsafe { &mut *(&raw mut ss).cast::<libc::sockaddr_in>() };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = v4.port().to_be();
            s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above, for sockaddr_in6.
            let s = unsafe { &mut *(&raw mut ss).cast::<libc::sockaddr_in6>() };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = v6.port().to_be();
            s.sin6_addr.s6_addr = v6.ip().octets();
            s.sin6_flowinfo = v6.flowinfo();
            s.sin6_scope_id = v6.scope_id();
            size_of::<libc::sockaddr_in6>()
        }
    };
    // SAFETY: the caller's contract: `len` is readable and writable, `addr` has `*len` bytes.
    unsafe {
        let n = (*len as usize).min(size);
        std::ptr::copy_nonoverlapping((&raw const ss).cast::<u8>(), addr.cast::<u8>(), n);
        *len = size as socklen_t;
    }
}

/// Whether `ip` is an address of this host (network namespace): only there can an SMC-D peer
/// be. Answers are kept for a second (a UDP bind says, without sending anything).
fn is_local(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    if ip.is_loopback() {
        return true;
    }
    if ip.is_unspecified() || ip.is_multicast() {
        return false;
    }
    static CACHE: std::sync::Mutex<Vec<(IpAddr, bool, Instant)>> =
        std::sync::Mutex::new(Vec::new());
    let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    c.retain(|(_, _, at)| at.elapsed() < Duration::from_secs(1));
    if let Some((_, local, _)) = c.iter().find(|(a, _, _)| *a == ip) {
        return *local;
    }
    let fam = if ip.is_ipv4() {
        rustix::net::AddressFamily::INET
    } else {
        rustix::net::AddressFamily::INET6
    };
    let local = rustix::net::socket_with(
        fam,
        rustix::net::SocketType::DGRAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .is_ok_and(|s| rustix::net::bind(&s, &SocketAddr::new(ip, 0)).is_ok());
    if c.len() < 64 {
        c.push((ip, local, Instant::now()));
    }
    local
}

/// The process's engine. At first use the engine's own descriptors get a band of their own
/// above the numbers the program may use (its soft `RLIMIT_NOFILE`, which is raised to make
/// room when the hard limit allows), so the program's descriptors stay numbered as without
/// SMC: wrk sizes its event loop by its connections, select needs numbers below 1024.
fn engine() -> Arc<Engine> {
    static BAND: std::sync::Once = std::sync::Once::new();
    BAND.call_once(|| {
        table::watch_forks();
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let lim = getrlimit(Resource::Nofile);
        let (Some(soft), hard) = (lim.current, lim.maximum) else {
            return;
        };
        let room = 64 * 1024;
        let want = soft.saturating_add(room);
        let raised = hard.is_none_or(|h| h >= want)
            && setrlimit(
                Resource::Nofile,
                Rlimit {
                    current: Some(want),
                    maximum: hard,
                },
            )
            .is_ok();
        let base = if raised {
            Some(soft)
        } else if soft >= 2048 {
            // No room above: the upper half of what the program may use.
            Some((soft / 2).max(1024))
        } else {
            None
        };
        let base = base.and_then(|b| i32::try_from(b).ok());
        smcd_engine::sys::set_fd_band(base);
        if let Some(b) = base {
            // The program's numbers end where the band begins (`limits`).
            crate::limits::band_at(b as u64);
        }
    });
    // One engine per process: a forked child's copy of its parent's shares the parent's
    // registration with smcd (one control socket for two processes), so the child makes its
    // own and leaves the copy alone (its connections, inherited, keep using it).
    static ENGINE: std::sync::Mutex<Option<(u32, Arc<Engine>)>> = std::sync::Mutex::new(None);
    let pid = std::process::id();
    let mut g = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    match &*g {
        Some((p, e)) if *p == pid => Arc::clone(e),
        _ => {
            let e = Engine::new(smcd_engine::EngineConfig {
                socket: smcd_socket().to_path_buf(),
                ..smcd_engine::EngineConfig::default()
            });
            if let Some(old) = g.replace((pid, Arc::clone(&e))) {
                std::mem::forget(old);
            }
            e
        }
    }
}

/// The descriptor flags (`FD_CLOEXEC`) and status flags (`O_NONBLOCK`) of `fd`.
pub(crate) fn fd_flags(fd: c_int) -> (bool, bool) {
    // SAFETY: fcntl with F_GETFD/F_GETFL takes no argument.
    let (fdf, fl) = unsafe {
        (
            real::fcntl(fd, libc::F_GETFD, 0),
            real::fcntl(fd, libc::F_GETFL, 0),
        )
    };
    (
        fdf >= 0 && fdf & libc::FD_CLOEXEC != 0,
        fl >= 0 && fl & libc::O_NONBLOCK != 0,
    )
}

/// Puts `src` at descriptor `dst` (replacing what was there), keeping close-on-exec as asked.
pub(crate) fn place(src: c_int, dst: c_int, cloexec: bool) -> io::Result<()> {
    let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: both are descriptors; dup3 replaces `dst` atomically.
    if unsafe { real::dup3(src, dst, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new descriptor (the lowest free one, as `accept` gives) for `src`.
fn new_fd(src: c_int, cloexec: bool) -> io::Result<c_int> {
    let cmd = if cloexec {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    // SAFETY: F_DUPFD* takes an int.
    let fd = unsafe { real::fcntl(src, cmd, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

// ---------------------------------------------------------------------------------------
// Creation, connect, listen, accept.

/// `socket(2)`.
///
/// # Safety
/// As `socket(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: passed through.
    let fd = unsafe { real::socket(domain, ty, proto) };
    if fd < 0 || in_lib() || !table::in_range(fd) {
        return fd;
    }
    let eligible = (domain == libc::AF_INET || domain == libc::AF_INET6)
        && ty & 0xf == libc::SOCK_STREAM
        && (proto == 0 || proto == libc::IPPROTO_TCP);
    if eligible {
        let saved = errno();
        if let Some(n) = env_size("SMC_SNDBUF") {
            set_int_opt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, n);
        }
        if let Some(n) = env_size("SMC_RCVBUF") {
            set_int_opt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, n);
        }
        set_errno(saved);
    }
    table::set_kind(fd, if eligible { CANDIDATE } else { NONE });
    fd
}

/// `connect(2)`.
///
/// # Safety
/// As `connect(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // As TCP's: a connect under way, or a connection already.
    match table::kind(fd) {
        CONNECTING if !in_lib() => {
            set_errno(table::connecting(fd).map_or(libc::EISCONN, |p| p.connect_again()));
            return -1;
        }
        STREAM if !in_lib() => {
            set_errno(libc::EISCONN);
            return -1;
        }
        _ => {}
    }
    if table::kind(fd) != CANDIDATE || in_lib() {
        // SAFETY: passed through.
        return unsafe { real::connect(fd, addr, len) };
    }
    // SAFETY: the program's address, `len` bytes.
    let dst = unsafe { read_addr(addr, len) };
    let saved = errno();
    let Some(dst) = dst.filter(|d| is_local(d.ip())) else {
        // Another host (or not an IP address): plain TCP for good.
        table::set_kind(fd, NONE);
        // SAFETY: passed through.
        return unsafe { real::connect(fd, addr, len) };
    };
    // A socket the program bound to a port of its own is connected from it (the engine
    // connects on the program's socket, `own_socket`), except when corked, when the engine
    // would connect from a socket of its own: then plain TCP keeps the port.
    // SAFETY: zeroed sockaddr_storage is valid; the lengths are right.
    let bound = unsafe {
        let mut ss: libc::sockaddr_storage = std::mem::zeroed();
        let mut l = size_of::<libc::sockaddr_storage>() as socklen_t;
        real::getsockname(fd, (&raw mut ss).cast(), &mut l) == 0
            && read_addr((&raw const ss).cast(), l).is_some_and(|a| a.port() != 0)
    };
    if bound && corked(fd) {
        table::set_kind(fd, NONE);
        set_errno(saved);
        // SAFETY: passed through.
        return unsafe { real::connect(fd, addr, len) };
    }
    let (cloexec, nonblocking) = fd_flags(fd);
    let nodelay = get_int_opt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY).unwrap_or(0);
    if nonblocking {
        // EINPROGRESS while the handshake runs (crate::pending).
        let r = lib(|| {
            use crate::pending::Started;
            Ok(
                // The engine first: it sets up the band `own_socket` copies into.
                match pending::start(&engine(), fd, dst, cloexec, nodelay != 0, own_socket(fd))? {
                    Started::Now(s) => Some(adopt_connected(fd, s, cloexec, true, nodelay != 0)?),
                    Started::PlainInFlight | Started::InFlight => None,
                },
            )
        });
        return match r {
            Ok(Some(smc)) => {
                debug(format_args!(
                    "connect fd {fd} to {dst}: {}",
                    if smc { "SMC-D" } else { "TCP" }
                ));
                set_errno(saved);
                0
            }
            Ok(None) => {
                debug(format_args!("connect fd {fd} to {dst}: in progress"));
                set_errno(libc::EINPROGRESS);
                -1
            }
            Err(e) => {
                debug(format_args!("connect fd {fd} to {dst}: {e}"));
                fail(&e)
            }
        };
    }
    let r = lib(|| {
        let e = engine();
        let s = match own_socket(fd) {
            Some(sock) => SmcStream::connect_on(&e, sock, dst)?,
            None => SmcStream::connect_with(&e, dst)?,
        };
        adopt_connected(fd, s, cloexec, nonblocking, nodelay != 0)
    });
    match r {
        Ok(smc) => {
            debug(format_args!(
                "connect fd {fd} to {dst}: {}",
                if smc { "SMC-D" } else { "TCP" }
            ));
            set_errno(saved);
            0
        }
        Err(e) => {
            debug(format_args!("connect fd {fd} to {dst}: {e}"));
            fail(&e)
        }
    }
}

/// The program's own socket at `fd`, for the engine to connect on (a copy in the engine's
/// band, the same socket): the options the program set before `connect` (buffer sizes,
/// `SO_KEEPALIVE`, `IP_TOS`, `SO_MARK`, `SO_BINDTODEVICE`, ...) are the connection's, and a
/// fallback is the very socket it made, as under the kernel's SMC. `None` (the engine then
/// connects from a socket of its own, as before): no copy could be made, or the socket is
/// corked (`TCP_CORK` would hold the CLC Proposal back for 200 ms).
fn own_socket(fd: c_int) -> Option<rustix::fd::OwnedFd> {
    if corked(fd) {
        return None;
    }
    let band = smcd_engine::sys::fd_band().max(0);
    // SAFETY: F_DUPFD_CLOEXEC takes an int; a new descriptor is ours to own.
    let dup = unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, band as u64) };
    // SAFETY: `dup` is a new descriptor nobody else owns.
    (dup >= 0).then(|| unsafe { rustix::fd::OwnedFd::from_raw_fd(dup) })
}

/// Whether the program set `TCP_CORK` on its socket at `fd`.
fn corked(fd: c_int) -> bool {
    get_int_opt(fd, libc::IPPROTO_TCP, libc::TCP_CORK).unwrap_or(0) != 0
}

/// What every SMC stream the program gets is set to: its blocking mode, a socket's level
/// readiness (deferred: settled before the program waits), interruptible waits, and
/// `TCP_NODELAY` when the program asked for it before the stream existed.
pub(crate) fn prepare_stream(s: &SmcStream, nonblocking: bool, nodelay: bool) -> io::Result<()> {
    s.set_nonblocking(nonblocking)?;
    s.set_level_readiness(true);
    s.set_deferred_readiness(true);
    s.set_interruptible(true);
    if nodelay {
        s.set_nodelay(true)?;
    }
    Ok(())
}

/// Puts the connected stream `s` at the program's descriptor `fd`; whether it is SMC.
fn adopt_connected(
    fd: c_int,
    s: SmcStream,
    cloexec: bool,
    nonblocking: bool,
    nodelay: bool,
) -> io::Result<bool> {
    if s.is_smc() {
        prepare_stream(&s, nonblocking, nodelay)?;
        let r = s.readiness_fd()?.as_raw_fd();
        let obj = Obj::Stream(table::Stream::new(s.clone(), nonblocking));
        place(r, fd, cloexec)?;
        if let Some(old) = table::insert(fd, obj) {
            table::release(old);
        }
        return Ok(true);
    }
    let tcp = s
        .into_tcp()
        .map_err(|_| io::Error::other("fallback stream without its socket"))?;
    tcp.set_nonblocking(nonblocking)?;
    if nodelay {
        tcp.set_nodelay(true)?;
    }
    place(tcp.as_raw_fd(), fd, cloexec)?;
    table::set_kind(fd, NONE);
    Ok(false)
}

/// `listen(2)`.
///
/// # Safety
/// As `listen(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    match table::kind(fd) {
        // Listening again (a new backlog): the listener stays as it is.
        LISTENER if !in_lib() => return 0,
        CANDIDATE | INHERITED if !in_lib() => {}
        // SAFETY: passed through.
        _ => return unsafe { real::listen(fd, backlog) },
    }
    // SAFETY: passed through.
    let r = unsafe { real::listen(fd, backlog) };
    if r < 0 {
        return r;
    }
    let saved = errno();
    let backlog = if backlog <= 0 { 128 } else { backlog as u32 };
    make_listener(fd, backlog);
    set_errno(saved);
    0
}

/// Makes the program's listening socket at `fd` an SMC listener: the socket moves to a
/// descriptor of the library's (close-on-exec) and the number becomes the listener's
/// readiness. When that fails the number stays the program's plain TCP listener.
fn make_listener(fd: c_int, backlog: u32) {
    let (cloexec, nonblocking) = fd_flags(fd);
    let res = lib(|| {
        let engine = engine();
        // SAFETY: `new_fd` gives a fresh descriptor we own; it goes to the engine's band, so
        // the program's numbers stay as without SMC.
        let hidden = unsafe { std::os::fd::OwnedFd::from_raw_fd(new_fd(fd, true)?) };
        let tcp = std::net::TcpListener::from(smcd_engine::sys::banded(hidden));
        let l = SmcListener::from_listening(
            &engine,
            tcp,
            ListenOptions {
                backlog,
                limit_hs: None,
            },
        )?;
        l.set_nonblocking(nonblocking)?;
        let r = l.readiness_fd()?.as_raw_fd();
        place(r, fd, cloexec)?;
        let local = l.local_addr()?;
        if let Some(old) = table::insert(
            fd,
            Obj::Listener(Arc::new(table::Listener::new(l, nonblocking, backlog))),
        ) {
            table::release(old);
        }
        Ok(local)
    });
    match res {
        Ok(local) => debug(format_args!("listen fd {fd} on {local}: SMC listener")),
        Err(e) => {
            debug(format_args!(
                "listen fd {fd}: no SMC listener ({e}), plain TCP"
            ));
            table::set_kind(fd, NONE);
        }
    }
}

/// An [`INHERITED`] listening socket at `fd` becomes an SMC listener (at the program's first
/// `accept` or `epoll_ctl` of it), with the backlog it listens with; errno is kept.
fn adopt_listener(fd: c_int) {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    // Another thread may have made it one meanwhile, or the program closed it.
    if table::kind(fd) != INHERITED {
        return;
    }
    let saved = errno();
    if !is_tcp_listener(fd) {
        table::set_kind(fd, NONE);
        return set_errno(saved);
    }
    // A listener's TCP_INFO says its backlog in tcpi_sacked (the kernel's
    // sk_max_ack_backlog).
    // SAFETY: zeroed tcp_info is valid; its size is passed.
    let backlog = unsafe {
        let mut ti: libc::tcp_info = std::mem::zeroed();
        let mut len = size_of::<libc::tcp_info>() as socklen_t;
        let r = real::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut ti).cast(),
            &mut len,
        );
        if r == 0 && ti.tcpi_sacked > 0 {
            ti.tcpi_sacked
        } else {
            128
        }
    };
    make_listener(fd, backlog);
    set_errno(saved);
}

/// `accept4(2)`.
///
/// # Safety
/// As `accept4(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    if table::kind(fd) == INHERITED && !in_lib() {
        adopt_listener(fd);
    }
    let l = if table::kind(fd) == LISTENER && !in_lib() {
        table::listener(fd)
    } else {
        None
    };
    let Some(l) = l else {
        // SAFETY: passed through.
        return unsafe { real::accept4(fd, addr, len, flags) };
    };
    if flags & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    let saved = errno();
    let cloexec = flags & libc::SOCK_CLOEXEC != 0;
    let nonblocking = flags & libc::SOCK_NONBLOCK != 0;
    let r = lib(|| {
        let (s, peer) = local_listener(&l, fd)?.accept()?;
        let fd = if s.is_smc() {
            prepare_stream(&s, nonblocking, false)?;
            let new = new_fd(s.readiness_fd()?.as_raw_fd(), cloexec)?;
            if let Some(old) = table::insert(new, Obj::Stream(table::Stream::new(s, nonblocking))) {
                table::release(old);
            }
            new
        } else {
            let tcp = s
                .into_tcp()
                .map_err(|_| io::Error::other("fallback stream without its socket"))?;
            tcp.set_nonblocking(nonblocking)?;
            let new = tcp.into_raw_fd();
            if !cloexec {
                // SAFETY: F_SETFD takes an int.
                unsafe { real::fcntl(new, libc::F_SETFD, 0) };
            }
            table::set_kind(new, NONE);
            new
        };
        Ok((fd, peer))
    });
    match r {
        Ok((new, peer)) => {
            // SAFETY: the program's buffers, as for accept(2).
            unsafe { write_addr(peer, addr, len) };
            set_errno(saved);
            new
        }
        Err(e) => fail(&e),
    }
}

/// The listener this process accepts with: the one it made, or (a forked worker of a server
/// whose master listened) a view of the shared socket with this process's own engine, made
/// at the first use here. The view's readiness then takes the program's descriptor number
/// (`dup3`: its parked handshakes must wake this process's loop, not the other processes'),
/// and the maker's listener tells smcd to announce no more clients to it (this process cannot
/// see its intents; the SMC option program still tells its connections apart). Made before
/// the program registers the number with epoll in this process (`epoll_ctl` comes here
/// first), so no registration is left on the old file.
fn local_listener(l: &table::Listener, fd: c_int) -> io::Result<&SmcListener> {
    if l.pid == std::process::id() {
        return Ok(&l.l);
    }
    if let Some(v) = l.own_view() {
        return Ok(v);
    }
    let tcp = rustix::io::fcntl_dupfd_cloexec(l.l.tcp_socket(), 0)?;
    let view = SmcListener::view_of(
        &engine(),
        std::net::TcpListener::from(smcd_engine::sys::banded(tcp)),
        ListenOptions {
            backlog: l.backlog,
            limit_hs: None,
        },
        &l.l,
    )?;
    view.set_nonblocking(l.nonblocking.load(Ordering::Relaxed))?;
    let (cloexec, _) = fd_flags(fd);
    place(view.readiness_fd()?.as_raw_fd(), fd, cloexec)?;
    l.l.set_shared();
    let new = Box::into_raw(Box::new(table::View {
        pid: std::process::id(),
        l: view,
    }));
    let old = l.view.load(Ordering::Acquire);
    match l
        .view
        .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
    {
        // The old one, if any, is another process's (copied by fork): left alone.
        Ok(_) => {}
        Err(_) => {
            // Another thread of ours made one first.
            // SAFETY: ours, never published.
            drop(unsafe { Box::from_raw(new) });
        }
    }
    l.own_view()
        .ok_or_else(|| io::Error::other("no listener view"))
}

/// `accept(2)`.
///
/// # Safety
/// As `accept(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if !matches!(table::kind(fd), LISTENER | INHERITED) || in_lib() {
        // SAFETY: passed through.
        return unsafe { real::accept(fd, addr, len) };
    }
    // SAFETY: the same call with no flags.
    unsafe { accept4(fd, addr, len, 0) }
}

// ---------------------------------------------------------------------------------------
// Data.

/// The stream behind `fd` if the program's call is for us.
fn ours(fd: c_int) -> Option<Arc<table::Stream>> {
    match table::kind(fd) {
        _ if in_lib() => None,
        STREAM => table::stream(fd),
        CONNECTING => {
            // Data before the connect finished: as TCP's, it waits for the end.
            pending::settle(fd);
            table::stream(fd)
        }
        _ => None,
    }
}

/// Waits for a connect under way behind `fd` (calls that need the connection).
fn settle(fd: c_int) {
    if table::kind(fd) == CONNECTING && !in_lib() {
        pending::settle(fd);
    }
}

fn raise_sigpipe() {
    // SAFETY: raise(3) sends to the calling thread, as the kernel's EPIPE does.
    unsafe { libc::raise(libc::SIGPIPE) };
}

/// Receives into `buf` with `recv(2)` flags.
fn do_recv(st: &Arc<table::Stream>, buf: &mut [u8], flags: c_int) -> io::Result<usize> {
    let r = do_recv_inner(st, buf, flags);
    if debug_on() {
        match &r {
            Ok(0) if !buf.is_empty() => debug(format_args!("recv: end of stream")),
            Err(e) if errno_of(e) != libc::EAGAIN => debug(format_args!("recv: {e}")),
            _ => {}
        }
    }
    if r.is_ok() && st.s.readiness_dirty() {
        table::dirty(st);
    }
    r
}

fn do_recv_inner(st: &table::Stream, buf: &mut [u8], flags: c_int) -> io::Result<usize> {
    let peek = flags & libc::MSG_PEEK != 0;
    let dontwait = flags & libc::MSG_DONTWAIT != 0;
    if flags & libc::MSG_OOB != 0 {
        if buf.is_empty() {
            return Ok(0);
        }
        buf[0] = st.s.recv_oob(peek)?;
        return Ok(1);
    }
    let n = st.s.recv_with(buf, peek, dontwait)?;
    if flags & libc::MSG_WAITALL == 0 || peek || dontwait || n == 0 || n == buf.len() {
        return Ok(n);
    }
    // MSG_WAITALL: until the buffer is full, the end of stream, or an error after some bytes.
    let mut done = n;
    while done < buf.len() {
        match st.s.recv_with(&mut buf[done..], false, false) {
            Ok(0) => break,
            Ok(k) => done += k,
            Err(_) => break,
        }
    }
    Ok(done)
}

/// TCP's `MSG_TRUNC`: up to `n` bytes are taken (with `MSG_PEEK` only counted) and not
/// copied to the program's buffer, which may be null; how many. At most 1 MiB a call, as a
/// read may return less than asked.
fn recv_trunc(st: &Arc<table::Stream>, n: usize, flags: c_int) -> io::Result<usize> {
    let mut scratch = vec![0u8; n.min(1 << 20)];
    do_recv(st, &mut scratch, flags & !libc::MSG_TRUNC)
}

/// Sends `buf` with `send(2)` flags; `EPIPE` raises `SIGPIPE` unless `MSG_NOSIGNAL`.
fn do_send(st: &table::Stream, buf: &[u8], flags: c_int) -> io::Result<usize> {
    let r = if flags & libc::MSG_OOB != 0 {
        st.s.send_oob(buf)
    } else {
        st.s.send_with(
            buf,
            flags & libc::MSG_MORE != 0,
            flags & libc::MSG_DONTWAIT != 0,
        )
    };
    if let Err(e) = &r
        && errno_of(e) == libc::EPIPE
        && flags & libc::MSG_NOSIGNAL == 0
    {
        raise_sigpipe();
    }
    r
}

/// Gathers `iov` and sends it: one send when it fits 256 KiB (one write, one CDC), else piece
/// by piece with `MSG_MORE` on all but the last.
///
/// # Safety
/// `iov` has `n` valid entries.
unsafe fn send_iov(
    st: &table::Stream,
    iov: *const libc::iovec,
    n: c_int,
    flags: c_int,
) -> io::Result<usize> {
    if !(0..=libc::UIO_MAXIOV).contains(&n) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let v: &[libc::iovec] = if n == 0 || iov.is_null() {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(iov, n as usize) }
    };
    let total: usize = v.iter().map(|e| e.iov_len).sum();
    let piece = |e: &libc::iovec| -> &[u8] {
        if e.iov_len == 0 {
            &[]
        } else {
            // SAFETY: the program's buffer of iov_len bytes.
            unsafe { std::slice::from_raw_parts(e.iov_base.cast::<u8>(), e.iov_len) }
        }
    };
    if total <= 256 * 1024 {
        let nonempty: Vec<&[u8]> = v.iter().map(piece).filter(|p| !p.is_empty()).collect();
        if nonempty.len() == 1 {
            return do_send(st, nonempty[0], flags);
        }
        let mut all = Vec::with_capacity(total);
        for p in nonempty {
            all.extend_from_slice(p);
        }
        return do_send(st, &all, flags);
    }
    let mut done = 0;
    let last = v.iter().rposition(|e| e.iov_len > 0).unwrap_or(0);
    for (i, e) in v.iter().enumerate() {
        let p = piece(e);
        if p.is_empty() {
            continue;
        }
        let f = if i < last {
            flags | libc::MSG_MORE
        } else {
            flags
        };
        match do_send(st, p, f) {
            Ok(k) => {
                done += k;
                if k < p.len() {
                    break;
                }
            }
            Err(e) if done == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(done)
}

/// Scatters what one receive gives over `iov`: the first non-empty piece waits as the flags
/// say, the rest takes what is there without waiting.
///
/// # Safety
/// `iov` has `n` valid entries.
unsafe fn recv_iov(
    st: &Arc<table::Stream>,
    iov: *const libc::iovec,
    n: c_int,
    flags: c_int,
) -> io::Result<usize> {
    if !(0..=libc::UIO_MAXIOV).contains(&n) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let v: &[libc::iovec] = if n == 0 || iov.is_null() {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(iov, n as usize) }
    };
    if flags & libc::MSG_TRUNC != 0 {
        return recv_trunc(st, v.iter().map(|e| e.iov_len).sum(), flags);
    }
    if flags & libc::MSG_PEEK != 0 {
        // A peek fills the pieces from one look.
        let total: usize = v.iter().map(|e| e.iov_len).sum();
        let mut tmp = vec![0u8; total];
        let got = do_recv(st, &mut tmp, flags)?;
        let mut off = 0;
        for e in v {
            let k = e.iov_len.min(got - off);
            if k == 0 {
                continue;
            }
            // SAFETY: the program's buffer of iov_len >= k bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(tmp[off..].as_ptr(), e.iov_base.cast::<u8>(), k)
            };
            off += k;
        }
        return Ok(got);
    }
    let mut done = 0;
    for e in v {
        if e.iov_len == 0 {
            continue;
        }
        // SAFETY: the program's buffer of iov_len bytes.
        let buf = unsafe { std::slice::from_raw_parts_mut(e.iov_base.cast::<u8>(), e.iov_len) };
        let f = if done == 0 {
            flags
        } else {
            flags | libc::MSG_DONTWAIT
        };
        match do_recv(st, buf, f) {
            Ok(0) => break,
            Ok(k) => {
                done += k;
                if k < buf.len() {
                    break;
                }
            }
            Err(e) if done == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(done)
}

fn ret_len(r: io::Result<usize>, saved: c_int) -> ssize_t {
    match r {
        Ok(n) => {
            set_errno(saved);
            n as ssize_t
        }
        Err(e) => fail(&e),
    }
}

/// # Safety
/// `buf` has `n` writable bytes.
unsafe fn recv_impl(st: &Arc<table::Stream>, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    let saved = errno();
    if flags & libc::MSG_TRUNC != 0 {
        return ret_len(lib(|| recv_trunc(st, n, flags)), saved);
    }
    let b: &mut [u8] = if n == 0 || buf.is_null() {
        &mut []
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) }
    };
    ret_len(lib(|| do_recv(st, b, flags)), saved)
}

/// # Safety
/// `buf` has `n` readable bytes.
unsafe fn send_impl(st: &table::Stream, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    let saved = errno();
    let b: &[u8] = if n == 0 || buf.is_null() {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) }
    };
    ret_len(lib(|| do_send(st, b, flags)), saved)
}

/// `read(2)`.
///
/// # Safety
/// As `read(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    match ours(fd) {
        // SAFETY: the program's buffer.
        Some(st) => unsafe { recv_impl(&st, buf, n, 0) },
        // SAFETY: passed through.
        None => unsafe { real::read(fd, buf, n) },
    }
}

/// `__read_chk` (`_FORTIFY_SOURCE`).
///
/// # Safety
/// As `read(2)`, with `buflen` the buffer's real size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    match ours(fd) {
        // SAFETY: the program's buffer; the check the C library would make comes first.
        Some(st) => unsafe {
            if n > buflen {
                libc::abort();
            }
            recv_impl(&st, buf, n, 0)
        },
        // SAFETY: passed through.
        None => unsafe { real::__read_chk(fd, buf, n, buflen) },
    }
}

/// `write(2)`.
///
/// # Safety
/// As `write(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    match ours(fd) {
        // SAFETY: the program's buffer.
        Some(st) => unsafe { send_impl(&st, buf, n, 0) },
        // SAFETY: passed through.
        None => unsafe { real::write(fd, buf, n) },
    }
}

/// `recv(2)`.
///
/// # Safety
/// As `recv(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    match ours(fd) {
        // SAFETY: the program's buffer.
        Some(st) => unsafe { recv_impl(&st, buf, n, flags) },
        // SAFETY: passed through.
        None => unsafe { real::recv(fd, buf, n, flags) },
    }
}

/// `__recv_chk`.
///
/// # Safety
/// As `recv(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    match ours(fd) {
        // SAFETY: as __read_chk.
        Some(st) => unsafe {
            if n > buflen {
                libc::abort();
            }
            recv_impl(&st, buf, n, flags)
        },
        // SAFETY: passed through.
        None => unsafe { real::__recv_chk(fd, buf, n, buflen, flags) },
    }
}

/// `send(2)`.
///
/// # Safety
/// As `send(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    match ours(fd) {
        // SAFETY: the program's buffer.
        Some(st) => unsafe { send_impl(&st, buf, n, flags) },
        // SAFETY: passed through.
        None => unsafe { real::send(fd, buf, n, flags) },
    }
}

/// `recvfrom(2)`: a connected stream reports no source address.
///
/// # Safety
/// As `recvfrom(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    match ours(fd) {
        // SAFETY: the program's buffers.
        Some(st) => unsafe {
            let r = recv_impl(&st, buf, n, flags);
            if r >= 0 && !addr.is_null() && !len.is_null() {
                len.write_unaligned(0);
            }
            r
        },
        // SAFETY: passed through.
        None => unsafe { real::recvfrom(fd, buf, n, flags, addr, len) },
    }
}

/// `__recvfrom_chk`.
///
/// # Safety
/// As `recvfrom(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    if ours(fd).is_none() {
        // SAFETY: passed through.
        return unsafe { real::__recvfrom_chk(fd, buf, n, buflen, flags, addr, len) };
    }
    if n > buflen {
        // SAFETY: what the C library's check does.
        unsafe { libc::abort() };
    }
    // SAFETY: the program's buffers.
    unsafe { recvfrom(fd, buf, n, flags, addr, len) }
}

/// `sendto(2)`: the address is ignored on a connected stream, as TCP does.
///
/// # Safety
/// As `sendto(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    match ours(fd) {
        // SAFETY: the program's buffer.
        Some(st) => unsafe { send_impl(&st, buf, n, flags) },
        // SAFETY: passed through.
        None => unsafe { real::sendto(fd, buf, n, flags, addr, len) },
    }
}

/// `readv(2)`.
///
/// # Safety
/// As `readv(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    match ours(fd) {
        Some(st) => {
            let saved = errno();
            // SAFETY: the program's vector.
            ret_len(lib(|| unsafe { recv_iov(&st, iov, n, 0) }), saved)
        }
        // SAFETY: passed through.
        None => unsafe { real::readv(fd, iov, n) },
    }
}

/// `writev(2)`.
///
/// # Safety
/// As `writev(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    match ours(fd) {
        Some(st) => {
            let saved = errno();
            // SAFETY: the program's vector.
            ret_len(lib(|| unsafe { send_iov(&st, iov, n, 0) }), saved)
        }
        // SAFETY: passed through.
        None => unsafe { real::writev(fd, iov, n) },
    }
}

/// `recvmsg(2)`: no address, no control messages.
///
/// # Safety
/// As `recvmsg(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t {
    let Some(st) = ours(fd) else {
        // SAFETY: passed through.
        return unsafe { real::recvmsg(fd, msg, flags) };
    };
    if msg.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    let saved = errno();
    // SAFETY: the program's message header.
    let (iov, n) = unsafe { ((*msg).msg_iov, (*msg).msg_iovlen as c_int) };
    // SAFETY: the program's vector.
    let r = ret_len(lib(|| unsafe { recv_iov(&st, iov, n, flags) }), saved);
    if r >= 0 {
        // SAFETY: the program's message header.
        unsafe {
            (*msg).msg_namelen = 0;
            (*msg).msg_controllen = 0;
            (*msg).msg_flags = 0;
        }
    }
    r
}

/// `sendmsg(2)`: control messages are not carried (SMC has none to carry).
///
/// # Safety
/// As `sendmsg(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    let Some(st) = ours(fd) else {
        // SAFETY: passed through.
        return unsafe { real::sendmsg(fd, msg, flags) };
    };
    if msg.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    let saved = errno();
    // SAFETY: the program's message header.
    let (iov, n) = unsafe { ((*msg).msg_iov, (*msg).msg_iovlen as c_int) };
    // SAFETY: the program's vector.
    ret_len(lib(|| unsafe { send_iov(&st, iov, n, flags) }), saved)
}

/// `recvmmsg(2)`: as the kernel's for a stream socket, one `recvmsg` per entry, each
/// blocking unless `MSG_DONTWAIT` (or, after the first, `MSG_WAITFORONE`); `timeout` is looked
/// at after each entry and gets what is left of it; an end of stream is an entry of 0 bytes;
/// an error after the first entry ends the call with the count (the next call meets the
/// condition again).
///
/// # Safety
/// As `recvmmsg(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    vlen: libc::c_uint,
    flags: c_int,
    timeout: *mut libc::timespec,
) -> c_int {
    let Some(st) = ours(fd) else {
        // SAFETY: passed through.
        return unsafe { real::recvmmsg(fd, msgs, vlen, flags, timeout) };
    };
    if msgs.is_null() && vlen > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    let saved = errno();
    // SAFETY: the program's timespec, null or valid.
    let end = match unsafe { timeout.as_ref() } {
        None => None,
        Some(t) if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) => {
            set_errno(libc::EINVAL);
            return -1;
        }
        Some(t) => Some(
            std::time::Instant::now() + std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32),
        ),
    };
    let vlen = vlen.min(libc::UIO_MAXIOV as libc::c_uint) as usize;
    let mut fl = flags & !libc::MSG_WAITFORONE;
    let mut done = 0usize;
    while done < vlen {
        // SAFETY: the program's vector of `vlen` entries.
        let m = unsafe { &mut *msgs.add(done) };
        let (iov, n) = (m.msg_hdr.msg_iov, m.msg_hdr.msg_iovlen as c_int);
        // SAFETY: the program's vector.
        match lib(|| unsafe { recv_iov(&st, iov, n, fl) }) {
            Ok(k) => {
                m.msg_len = k as libc::c_uint;
                m.msg_hdr.msg_namelen = 0;
                m.msg_hdr.msg_controllen = 0;
                m.msg_hdr.msg_flags = 0;
                done += 1;
            }
            Err(e) if done == 0 => return fail(&e),
            Err(_) => break,
        }
        if flags & libc::MSG_WAITFORONE != 0 {
            fl |= libc::MSG_DONTWAIT;
        }
        if let Some(end) = end {
            let left = end.saturating_duration_since(std::time::Instant::now());
            // SAFETY: the program's timespec (non-null: `end` is set).
            unsafe {
                (*timeout).tv_sec = left.as_secs() as libc::time_t;
                (*timeout).tv_nsec = libc::c_long::from(left.subsec_nanos() as i32);
            }
            if left.is_zero() {
                break;
            }
        }
    }
    set_errno(saved);
    done as c_int
}

/// `sendmmsg(2)`: as the kernel's for a stream socket, one `sendmsg` per entry, stopping after
/// one that went out only in part; an error after the first entry ends the call with the
/// count.
///
/// # Safety
/// As `sendmmsg(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    vlen: libc::c_uint,
    flags: c_int,
) -> c_int {
    let Some(st) = ours(fd) else {
        // SAFETY: passed through.
        return unsafe { real::sendmmsg(fd, msgs, vlen, flags) };
    };
    if msgs.is_null() && vlen > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    let saved = errno();
    let vlen = vlen.min(libc::UIO_MAXIOV as libc::c_uint) as usize;
    let mut done = 0usize;
    while done < vlen {
        // SAFETY: the program's vector of `vlen` entries.
        let m = unsafe { &mut *msgs.add(done) };
        let (iov, n) = (m.msg_hdr.msg_iov, m.msg_hdr.msg_iovlen as c_int);
        let want: usize = if iov.is_null() || n <= 0 {
            0
        } else {
            // SAFETY: the program's vector of `n` entries (send_iov checks `n` too).
            unsafe { std::slice::from_raw_parts(iov, n.min(libc::UIO_MAXIOV) as usize) }
                .iter()
                .map(|e| e.iov_len)
                .sum()
        };
        // SAFETY: the program's vector.
        match lib(|| unsafe { send_iov(&st, iov, n, flags) }) {
            Ok(k) => {
                m.msg_len = k as libc::c_uint;
                done += 1;
                if k < want {
                    break;
                }
            }
            Err(e) if done == 0 => return fail(&e),
            Err(_) => break,
        }
    }
    set_errno(saved);
    done as c_int
}

/// Copies up to `count` bytes from `inp` (at `*off` when given, which then moves) into the
/// stream.
///
/// # Safety
/// `off` is null or valid.
unsafe fn sendfile_impl(
    st: &table::Stream,
    inp: c_int,
    off: *mut i64,
    count: usize,
) -> io::Result<usize> {
    let mut buf = vec![0u8; count.clamp(1, 256 * 1024)];
    let mut done = 0;
    while done < count {
        let want = (count - done).min(buf.len());
        let got = if off.is_null() {
            // SAFETY: `buf` has `want` bytes.
            unsafe { real::read(inp, buf.as_mut_ptr().cast(), want) }
        } else {
            // SAFETY: `buf` has `want` bytes; `off` is the caller's.
            unsafe { libc::pread64(inp, buf.as_mut_ptr().cast(), want, *off) }
        };
        if got < 0 {
            let e = io::Error::last_os_error();
            return if done == 0 { Err(e) } else { Ok(done) };
        }
        if got == 0 {
            break;
        }
        let got = got as usize;
        let sent = match do_send(st, &buf[..got], libc::MSG_NOSIGNAL) {
            Ok(k) => k,
            Err(e) if done == 0 => {
                if errno_of(&e) == libc::EPIPE {
                    raise_sigpipe();
                }
                return Err(e);
            }
            Err(_) => 0,
        };
        done += sent;
        if !off.is_null() {
            // SAFETY: the caller's offset.
            unsafe { *off += sent as i64 };
        } else if sent < got {
            // Read too much from a file position: give the rest back.
            // SAFETY: lseek on the caller's descriptor.
            unsafe { libc::lseek64(inp, sent as i64 - got as i64, libc::SEEK_CUR) };
        }
        if sent < got {
            break;
        }
    }
    Ok(done)
}

/// `sendfile(2)`.
///
/// # Safety
/// As `sendfile(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile(
    out: c_int,
    inp: c_int,
    off: *mut libc::off_t,
    n: size_t,
) -> ssize_t {
    match ours(out) {
        Some(st) => {
            let saved = errno();
            // SAFETY: off_t is i64 on the 64-bit targets this builds for.
            ret_len(
                lib(|| unsafe { sendfile_impl(&st, inp, off.cast(), n) }),
                saved,
            )
        }
        // SAFETY: passed through.
        None => unsafe { real::sendfile(out, inp, off, n) },
    }
}

/// `sendfile64`.
///
/// # Safety
/// As `sendfile(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    inp: c_int,
    off: *mut libc::off64_t,
    n: size_t,
) -> ssize_t {
    match ours(out) {
        Some(st) => {
            let saved = errno();
            // SAFETY: the caller's offset.
            ret_len(lib(|| unsafe { sendfile_impl(&st, inp, off, n) }), saved)
        }
        // SAFETY: passed through.
        None => unsafe { real::sendfile64(out, inp, off, n) },
    }
}

/// Whether `fd` is a pipe (or FIFO).
fn is_pipe(fd: c_int) -> bool {
    // SAFETY: fstat fills the zeroed struct we pass.
    let mut sb: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::fstat64(fd, &mut sb) == 0 && sb.st_mode & libc::S_IFMT == libc::S_IFIFO }
}

/// One `preadv2`/`pwritev2` on a pipe, `RWF_NOWAIT` when `nowait` (`SPLICE_F_NONBLOCK`: the
/// pipe side does not block, whatever the pipe's own mode).
///
/// # Safety
/// `buf` is valid for `len` bytes (written to when `read`).
unsafe fn pipe_io(
    fd: c_int,
    buf: *mut u8,
    len: usize,
    read: bool,
    nowait: bool,
) -> io::Result<usize> {
    let iov = libc::iovec {
        iov_base: buf.cast(),
        iov_len: len,
    };
    let flags = if nowait { libc::RWF_NOWAIT } else { 0 };
    // SAFETY: one iovec over the caller's buffer; offset -1 is the pipe's (none).
    let n = unsafe {
        if read {
            libc::preadv2(fd, &iov, 1, -1, flags)
        } else {
            libc::pwritev2(fd, &iov, 1, -1, flags)
        }
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// The most a `splice` moves through our buffer in one call (the kernel's is a pipe's worth).
const SPLICE_MAX: usize = 1 << 20;

/// `splice` from the stream into the pipe `out`: the bytes are looked at (`MSG_PEEK`, waiting
/// as the stream's mode says), written into the pipe, and only what the pipe took is taken
/// from the stream, so a full pipe loses nothing.
fn splice_from(st: &Arc<table::Stream>, out: c_int, len: usize, flags: u32) -> io::Result<usize> {
    let mut buf = vec![0u8; len.min(SPLICE_MAX)];
    let n = do_recv(st, &mut buf, libc::MSG_PEEK)?;
    if n == 0 {
        return Ok(0);
    }
    let nowait = flags & libc::SPLICE_F_NONBLOCK != 0;
    // SAFETY: `buf` holds `n` bytes.
    let k = unsafe { pipe_io(out, buf.as_mut_ptr(), n, false, nowait)? };
    let mut taken = 0;
    while taken < k {
        // They are there (looked at above): no wait.
        match do_recv(st, &mut buf[taken..k], 0)? {
            0 => break,
            m => taken += m,
        }
    }
    Ok(k)
}

/// `splice` from the pipe `inp` into the stream: no more is taken from the pipe than the
/// stream takes, so a stream with no room (non-blocking: `EAGAIN`) leaves the bytes in the
/// pipe. A blocking stream gets all that was read, waiting for room as a write does.
fn splice_to(st: &Arc<table::Stream>, inp: c_int, len: usize, flags: u32) -> io::Result<usize> {
    let mut want = len.min(SPLICE_MAX);
    if st.s.is_nonblocking()
        && let Some(space) = st.s.send_space()
    {
        want = want.min(space?);
        if want == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
    }
    let mut buf = vec![0u8; want];
    let nowait = flags & libc::SPLICE_F_NONBLOCK != 0;
    // SAFETY: `buf` has `want` bytes.
    let n = unsafe { pipe_io(inp, buf.as_mut_ptr(), want, true, nowait)? };
    let more = if flags & libc::SPLICE_F_MORE != 0 {
        libc::MSG_MORE
    } else {
        0
    };
    let mut sent = 0;
    while sent < n {
        // Room was there for all of it (non-blocking) or the send waits for it (blocking).
        match st.s.send_with(&buf[sent..n], more != 0, false) {
            Ok(k) => sent += k,
            Err(e) if sent == 0 => {
                if errno_of(&e) == libc::EPIPE {
                    raise_sigpipe();
                }
                return Err(e);
            }
            Err(_) => break,
        }
    }
    Ok(sent)
}

/// `splice(2)`. With an SMC stream on one side (the other must be a pipe, as the kernel
/// requires) the bytes go through the stream's calls; a fallback stream's TCP socket, and
/// everything else, goes to the C library.
///
/// # Safety
/// As `splice(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut libc::loff_t,
    fd_out: c_int,
    off_out: *mut libc::loff_t,
    len: size_t,
    flags: libc::c_uint,
) -> ssize_t {
    let (from, to) = (ours(fd_in), ours(fd_out));
    let (st, into_pipe) = match (from, to) {
        (Some(st), None) if st.s.is_smc() => (st, true),
        (None, Some(st)) if st.s.is_smc() => (st, false),
        // SAFETY: passed through.
        _ => return unsafe { real::splice(fd_in, off_in, fd_out, off_out, len, flags) },
    };
    let saved = errno();
    // The kernel's checks (`do_splice`): the other side must be a pipe, a pipe has no
    // offset (ESPIPE), nor has a socket (no FMODE_PREAD/PWRITE: EINVAL).
    let (pipe, off_pipe, off_sock) = if into_pipe {
        (fd_out, off_out, off_in)
    } else {
        (fd_in, off_in, off_out)
    };
    if !is_pipe(pipe) {
        return fail(&io::Error::from_raw_os_error(libc::EINVAL));
    }
    if !off_pipe.is_null() {
        return fail(&io::Error::from_raw_os_error(libc::ESPIPE));
    }
    if !off_sock.is_null() {
        return fail(&io::Error::from_raw_os_error(libc::EINVAL));
    }
    if len == 0 {
        return 0;
    }
    let r = if into_pipe {
        lib(|| splice_from(&st, pipe, len, flags))
    } else {
        lib(|| splice_to(&st, pipe, len, flags))
    };
    ret_len(r, saved)
}

// ---------------------------------------------------------------------------------------
// Descriptors.

/// `close(2)`.
///
/// # Safety
/// As `close(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    // The cheap tests first: `borrowed_memory` asks the kernel for the process id, which a
    // program that closes a file per request (nginx) would otherwise pay at every close.
    if ep::any_sets() && !in_lib() {
        // The kernel drops a closed descriptor's items: the ones kept from it go first (a
        // duplicate would keep an item the program deleted).
        ep::flush();
        if ep::is_set(fd) && !table::borrowed_memory() {
            ep::closed(fd);
        }
    }
    if table::kind(fd) == NONE || in_lib() || table::borrowed_memory() {
        // SAFETY: passed through.
        return unsafe { real::close(fd) };
    }
    let obj = table::remove(fd);
    // SAFETY: passed through.
    let r = unsafe { real::close(fd) };
    if let Some(obj) = obj {
        let saved = errno();
        let _ = lib(|| {
            table::release(obj);
            Ok(())
        });
        set_errno(saved);
    }
    r
}

/// `close_range(2)`.
///
/// # Safety
/// As `close_range(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close_range(
    first: libc::c_uint,
    last: libc::c_uint,
    flags: c_int,
) -> c_int {
    // As in `close`: what was kept from the kernel goes there before its items may.
    ep::flush();
    // A range from below the engine's band into it ends below it: the program closes every
    // descriptor it did not open (CPython's child before its `exec`, daemons), and the band
    // holds the engine's (`engine()`), which the connections handed on at the `exec` need.
    let band = smcd_engine::sys::fd_band();
    let last = match u32::try_from(band) {
        Ok(b) if b > 0 && first < b && last >= b => b - 1,
        _ => last,
    };
    // SAFETY: passed through.
    let r = unsafe { real::close_range(first, last, flags) };
    if r == 0
        && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0
        && !in_lib()
        && !table::borrowed_memory()
    {
        ep::closed_range(first, last);
        let saved = errno();
        let objs = table::remove_range(first, last);
        let _ = lib(|| {
            objs.into_iter().for_each(table::release);
            Ok(())
        });
        set_errno(saved);
    }
    r
}

/// `closefrom(3)` (glibc 2.34): the C library's closes through its internal `close_range`,
/// which no hook sees, so a program that called it closed the engine's band and left the
/// table naming closed descriptors. Here it is the `close_range` hook from `lowfd` on (which
/// stops below the band); where that fails, each open descriptor from `lowfd` below the band
/// through the `close` hook, as the C library's fallback closes them.
///
/// # Safety
/// As `closefrom(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    let saved = errno();
    let first = libc::c_uint::try_from(lowfd).unwrap_or(0);
    // SAFETY: the hook above, with valid arguments.
    if unsafe { close_range(first, libc::c_uint::MAX, 0) } != 0 {
        let band = smcd_engine::sys::fd_band();
        // The listing's own descriptor is left out (and closed when the listing is done).
        let open: Vec<c_int> = rustix::fs::open(
            "/proc/self/fd",
            rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .and_then(|dir| {
            let own = dir.as_raw_fd();
            Ok(rustix::fs::Dir::read_from(&dir)?
                .flatten()
                .filter_map(|e| e.file_name().to_str().ok()?.parse::<c_int>().ok())
                .filter(|&fd| fd >= lowfd && fd != own && (band <= 0 || fd < band))
                .collect())
        })
        .unwrap_or_default();
        for fd in open {
            // SAFETY: the hook above; a descriptor that is gone by now says EBADF.
            unsafe { close(fd) };
        }
    }
    set_errno(saved);
}

/// After `new` was made a copy of `old` by the C library: `new` is what `old` is, and what
/// `new` was before is dropped.
fn copied(old: c_int, new: c_int) {
    let k = table::kind(old);
    let after = match k {
        STREAM | LISTENER | CONNECTING => table::get(old),
        _ => None,
    };
    let prev = match after {
        Some(o) => table::insert(new, o),
        None => {
            // A copy of a candidate is a candidate (dup before connect), of an inherited
            // listener an inherited listener.
            let prev = table::remove(new);
            table::set_kind(
                new,
                if matches!(k, CANDIDATE | INHERITED) {
                    k
                } else {
                    NONE
                },
            );
            prev
        }
    };
    let saved = errno();
    let _ = lib(|| {
        prev.into_iter().for_each(table::release);
        Ok(())
    });
    set_errno(saved);
}

/// `dup(2)`.
///
/// # Safety
/// As `dup(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    settle(fd);
    // SAFETY: passed through.
    let new = unsafe { real::dup(fd) };
    if new >= 0 && ep::any_sets() && !in_lib() && !table::borrowed_memory() {
        ep::copied(fd, new);
    }
    if new >= 0
        && !in_lib()
        && (table::kind(fd) != NONE || table::kind(new) != NONE)
        && !table::borrowed_memory()
    {
        copied(fd, new);
    }
    new
}

/// `dup2(2)`.
///
/// # Safety
/// As `dup2(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(fd: c_int, new: c_int) -> c_int {
    settle(fd);
    // SAFETY: passed through.
    let r = unsafe { real::dup2(fd, new) };
    if r >= 0 && fd != new && ep::any_sets() && !in_lib() && !table::borrowed_memory() {
        ep::copied(fd, new);
    }
    if r >= 0
        && fd != new
        && !in_lib()
        && (table::kind(fd) != NONE || table::kind(new) != NONE)
        && !table::borrowed_memory()
    {
        copied(fd, new);
    }
    r
}

/// `dup3(2)`.
///
/// # Safety
/// As `dup3(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(fd: c_int, new: c_int, flags: c_int) -> c_int {
    settle(fd);
    // SAFETY: passed through.
    let r = unsafe { real::dup3(fd, new, flags) };
    if r >= 0 && ep::any_sets() && !in_lib() && !table::borrowed_memory() {
        ep::copied(fd, new);
    }
    if r >= 0
        && !in_lib()
        && (table::kind(fd) != NONE || table::kind(new) != NONE)
        && !table::borrowed_memory()
    {
        copied(fd, new);
    }
    r
}

/// `fd` (not ours) was copied to `new`: if it is an epoll set, the set is no longer
/// answered for in user space (`crate::ep::copied`).
fn epoll_set_copied(fd: c_int, new: c_int) {
    if ep::any_sets() && !in_lib() {
        ep::copied(fd, new);
    }
}

/// Whether `fd` is ours and the program asked for something we emulate.
fn fcntl_ours(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> Option<c_int> {
    if in_lib() || table::borrowed_memory() {
        return None;
    }
    if matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC | libc::F_SETFL) {
        // (F_SETFL: hiredis makes its socket blocking as soon as the connect's descriptor is
        // writable; the stream must get the mode, not only the pair it is finishing with.)
        settle(fd);
    }
    match (table::kind(fd), cmd) {
        (STREAM | LISTENER, libc::F_GETFL) => {
            // SAFETY: F_GETFL takes no argument.
            let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
            if fl < 0 {
                return Some(fl);
            }
            let nb = match table::get(fd)? {
                Obj::Stream(s) => s.nonblocking.load(Ordering::Relaxed),
                Obj::Listener(l) => l.nonblocking.load(Ordering::Relaxed),
                Obj::Connecting(_) => return None,
            };
            Some((fl & !libc::O_NONBLOCK) | if nb { libc::O_NONBLOCK } else { 0 })
        }
        (STREAM | LISTENER, libc::F_SETFL) => {
            let nb = arg as c_int & libc::O_NONBLOCK != 0;
            let saved = errno();
            let r = lib(|| set_nonblocking(fd, nb));
            Some(match r {
                Ok(()) => {
                    set_errno(saved);
                    0
                }
                Err(e) => fail(&e),
            })
        }
        (STREAM | LISTENER | CANDIDATE | INHERITED, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) => {
            // SAFETY: F_DUPFD* takes an int.
            let new = unsafe { real::fcntl(fd, cmd, arg) };
            if new >= 0 {
                copied(fd, new);
            }
            Some(new)
        }
        _ => None,
    }
}

fn set_nonblocking(fd: c_int, nb: bool) -> io::Result<()> {
    match table::get(fd) {
        Some(Obj::Stream(s)) => {
            s.s.set_nonblocking(nb)?;
            s.nonblocking.store(nb, Ordering::Relaxed);
        }
        Some(Obj::Listener(l)) => {
            l.l.set_nonblocking(nb)?;
            if let Some(v) = l.own_view() {
                v.set_nonblocking(nb)?;
            }
            l.nonblocking.store(nb, Ordering::Relaxed);
        }
        // The pair's near end is the descriptor: the kernel keeps its flag.
        Some(Obj::Connecting(_)) => rustix::io::ioctl_fionbio(
            // SAFETY: the program's descriptor, for this call.
            unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
            nb,
        )?,
        None => return Err(io::Error::from_raw_os_error(libc::EBADF)),
    }
    Ok(())
}

/// `fcntl(2)` (its third argument read as a word: every command passes an int, a pointer or
/// nothing, all in the same register on the 64-bit ABIs).
///
/// # Safety
/// As `fcntl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    if table::kind(fd) == NONE {
        // SAFETY: passed through.
        let r = unsafe { real::fcntl(fd, cmd, arg) };
        if r >= 0 && matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) {
            epoll_set_copied(fd, r);
        }
        return r;
    }
    // SAFETY: passed through.
    fcntl_ours(fd, cmd, arg).unwrap_or_else(|| unsafe { real::fcntl(fd, cmd, arg) })
}

/// `fcntl64` (what `fcntl` is with `_FILE_OFFSET_BITS=64`).
///
/// # Safety
/// As `fcntl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    if table::kind(fd) == NONE {
        // SAFETY: passed through.
        let r = unsafe { real::fcntl64(fd, cmd, arg) };
        if r >= 0 && matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) {
            epoll_set_copied(fd, r);
        }
        return r;
    }
    // SAFETY: passed through.
    fcntl_ours(fd, cmd, arg).unwrap_or_else(|| unsafe { real::fcntl64(fd, cmd, arg) })
}

/// `ioctl(2)`: `FIONBIO`, `FIONREAD`, `SIOCATMARK` on ours; the rest goes to the TCP socket.
///
/// # Safety
/// As `ioctl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: libc::c_ulong, arg: libc::c_ulong) -> c_int {
    settle(fd);
    let k = table::kind(fd);
    // FIOCLEX/FIONCLEX (Python's os.set_inheritable) are the number's own flag, not the
    // socket's: the program's descriptor takes them.
    if (k != STREAM && k != LISTENER) || in_lib() || matches!(req, libc::FIOCLEX | libc::FIONCLEX) {
        // SAFETY: passed through.
        return unsafe { real::ioctl(fd, req, arg) };
    }
    let saved = errno();
    let p = arg as *mut c_int;
    let r: io::Result<()> = lib(|| match req {
        libc::FIONBIO => {
            if p.is_null() {
                return Err(io::Error::from_raw_os_error(libc::EFAULT));
            }
            // SAFETY: FIONBIO passes an int pointer.
            set_nonblocking(fd, unsafe { p.read_unaligned() } != 0)
        }
        libc::FIONREAD | 0x8905 /* SIOCATMARK */ if k == STREAM => {
            let st = table::stream(fd).ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
            if p.is_null() {
                return Err(io::Error::from_raw_os_error(libc::EFAULT));
            }
            let v = if req == libc::FIONREAD {
                st.s.available()?.min(c_int::MAX as usize) as c_int
            } else {
                c_int::from(st.s.at_mark()?)
            };
            // SAFETY: these pass an int pointer.
            unsafe { p.write_unaligned(v) };
            Ok(())
        }
        _ => {
            let tcp = tcp_of(fd)?;
            // SAFETY: the program's request, on the TCP socket.
            if unsafe { real::ioctl(tcp, req, arg) } < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        }
    });
    match r {
        Ok(()) => {
            set_errno(saved);
            0
        }
        Err(e) => fail(&e),
    }
}

/// The TCP socket under one of our descriptors (valid while the object lives: callers hold
/// it through the table only for the one call, as the program holds its descriptor).
fn tcp_of(fd: c_int) -> io::Result<c_int> {
    match table::get(fd) {
        Some(Obj::Stream(s)) => Ok(s.s.tcp_socket().as_raw_fd()),
        Some(Obj::Listener(l)) => Ok(l.l.tcp_socket().as_raw_fd()),
        Some(Obj::Connecting(_)) | None => Err(io::Error::from_raw_os_error(libc::EBADF)),
    }
}

// ---------------------------------------------------------------------------------------
// Names, options, shutdown.

/// `getsockname(2)`.
///
/// # Safety
/// As `getsockname(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(r) = on_connecting(fd, |tcp, _| {
        // SAFETY: the TCP socket under the connect, as the program asked.
        unsafe { real::getsockname(tcp, addr, len) }
    }) {
        return r;
    }
    let k = table::kind(fd);
    if (k == STREAM || k == LISTENER)
        && !in_lib()
        && let Some(o) = table::get(fd)
    {
        // SAFETY: the TCP socket's name, as the program asked (the object is held meanwhile).
        return unsafe { real::getsockname(tcp_fd(&o), addr, len) };
    }
    // SAFETY: passed through.
    unsafe { real::getsockname(fd, addr, len) }
}

/// `getpeername(2)`.
///
/// # Safety
/// As `getpeername(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(r) = on_connecting(fd, |tcp, _| {
        // SAFETY: as getsockname (ENOTCONN until the TCP connect is done, as TCP says).
        unsafe { real::getpeername(tcp, addr, len) }
    }) {
        return r;
    }
    let k = table::kind(fd);
    if (k == STREAM || k == LISTENER)
        && !in_lib()
        && let Some(o) = table::get(fd)
    {
        // SAFETY: as getsockname.
        return unsafe { real::getpeername(tcp_fd(&o), addr, len) };
    }
    // SAFETY: passed through.
    unsafe { real::getpeername(fd, addr, len) }
}

pub(crate) fn tcp_fd(o: &Obj) -> c_int {
    match o {
        Obj::Stream(s) => s.s.tcp_socket().as_raw_fd(),
        Obj::Listener(l) => l.l.tcp_socket().as_raw_fd(),
        // Never asked: callers look at connects under way first (on_connecting).
        Obj::Connecting(_) => -1,
    }
}

/// `f` on the TCP socket under a connect that is under way behind `fd` (names and options
/// need not wait for it); `None` when there is none.
fn on_connecting(
    fd: c_int,
    f: impl FnOnce(c_int, &mut pending::Running) -> c_int,
) -> Option<c_int> {
    if table::kind(fd) != CONNECTING || in_lib() {
        return None;
    }
    let p = table::connecting(fd)?;
    if let Some(r) = p.with_tcp(|tcp, r| f(tcp.as_raw_fd(), r)) {
        return Some(r);
    }
    // It has just finished (its descriptor became writable a moment ago, which is when
    // programs set options): once the descriptor is what it became, the caller goes on.
    pending::settle(fd);
    None
}

fn timeval_of(d: Option<Duration>) -> libc::timeval {
    let d = d.unwrap_or_default();
    libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: libc::suseconds_t::from(d.subsec_micros()),
    }
}

/// `getsockopt(2)`: what the stream implements comes from it; the rest from the TCP socket.
///
/// # Safety
/// As `getsockopt(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    if table::kind(fd) == CONNECTING && !in_lib() {
        if (level, name) == (libc::SOL_SOCKET, libc::SO_ERROR) && !val.is_null() && !len.is_null() {
            // A connect under way has no error yet; a failed one says its error once.
            let e = table::connecting(fd).map_or(0, |p| p.take_error());
            // SAFETY: the program's buffer of *len bytes.
            unsafe {
                let n = (*len as usize).min(size_of::<c_int>());
                std::ptr::copy_nonoverlapping((&raw const e).cast::<u8>(), val.cast::<u8>(), n);
                *len = n as socklen_t;
            }
            return 0;
        }
        if let Some(r) = on_connecting(fd, |tcp, _| {
            // SAFETY: the TCP socket under the connect answers.
            unsafe { real::getsockopt(tcp, level, name, val, len) }
        }) {
            return r;
        }
    }
    let k = table::kind(fd);
    let o = if (k == STREAM || k == LISTENER) && !in_lib() {
        table::get(fd)
    } else {
        None
    };
    let Some(o) = o else {
        // SAFETY: passed through.
        return unsafe { real::getsockopt(fd, level, name, val, len) };
    };
    let tcp = tcp_fd(&o);
    let Obj::Stream(st) = &o else {
        // SAFETY: the listener's TCP socket answers.
        return unsafe { real::getsockopt(tcp, level, name, val, len) };
    };
    if val.is_null() || len.is_null() {
        // SAFETY: passed on for the kernel's EFAULT.
        return unsafe { real::getsockopt(tcp, level, name, val, len) };
    }
    let saved = errno();
    let int = |v: c_int| -> c_int {
        // SAFETY: the program's buffer of *len bytes.
        unsafe {
            let n = (*len as usize).min(size_of::<c_int>());
            std::ptr::copy_nonoverlapping((&raw const v).cast::<u8>(), val.cast::<u8>(), n);
            *len = n as socklen_t;
        }
        set_errno(saved);
        0
    };
    let tv = |t: Option<Duration>| -> c_int {
        let v = timeval_of(t);
        // SAFETY: the program's buffer of *len bytes.
        unsafe {
            let n = (*len as usize).min(size_of::<libc::timeval>());
            std::ptr::copy_nonoverlapping((&raw const v).cast::<u8>(), val.cast::<u8>(), n);
            *len = n as socklen_t;
        }
        set_errno(saved);
        0
    };
    match (level, name) {
        // The connection's own error was reported by the call that met it.
        (libc::SOL_SOCKET, libc::SO_ERROR) => int(0),
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => int(c_int::from(st.s.nodelay().unwrap_or(false))),
        (libc::IPPROTO_TCP, libc::TCP_CORK) => int(c_int::from(st.s.cork().unwrap_or(false))),
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO) => tv(st.s.read_timeout().ok().flatten()),
        (libc::SOL_SOCKET, libc::SO_SNDTIMEO) => tv(st.s.write_timeout().ok().flatten()),
        // SAFETY: the TCP socket answers the rest.
        _ => unsafe { real::getsockopt(tcp, level, name, val, len) },
    }
}

/// `setsockopt(2)`: the options the stream implements go to it, and every option to the TCP
/// socket as well (so it reads back as set).
///
/// # Safety
/// As `setsockopt(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    if let Some(r) = on_connecting(fd, |tcp, run| {
        // SAFETY: the program's option, on the TCP socket under the connect.
        let r = unsafe { real::setsockopt(tcp, level, name, val, len) };
        if r == 0 && !val.is_null() && len as usize >= size_of::<c_int>() {
            // SAFETY: at least an int's bytes.
            let on = unsafe { std::ptr::read_unaligned(val.cast::<c_int>()) } != 0;
            pending::Pending::note_option(run, level, name, on);
        }
        r
    }) {
        return r;
    }
    let k = table::kind(fd);
    let o = if (k == STREAM || k == LISTENER) && !in_lib() {
        table::get(fd)
    } else {
        None
    };
    let Some(o) = o else {
        // SAFETY: passed through.
        return unsafe { real::setsockopt(fd, level, name, val, len) };
    };
    let tcp = tcp_fd(&o);
    // An SMC stream's TCP socket carries no byte after the handshake: its cork and Nagle
    // setting change nothing there, and `getsockopt` reads them back from the stream. Not
    // asking the kernel saves nginx two calls per response (`tcp_nopush` corks around it).
    let stream_only = matches!(&o, Obj::Stream(st) if st.s.is_smc())
        && level == libc::IPPROTO_TCP
        && (name == libc::TCP_CORK || name == libc::TCP_NODELAY)
        && !val.is_null()
        && len as usize >= size_of::<c_int>();
    let r = if stream_only {
        0
    } else {
        // SAFETY: the program's option, on the TCP socket.
        unsafe { real::setsockopt(tcp, level, name, val, len) }
    };
    let Obj::Stream(st) = &o else { return r };
    if r < 0 || val.is_null() {
        return r;
    }
    let saved = errno();
    let int = || -> c_int {
        if (len as usize) < size_of::<c_int>() {
            return 0;
        }
        // SAFETY: at least an int's bytes.
        unsafe { std::ptr::read_unaligned(val.cast::<c_int>()) }
    };
    let dur = || -> Option<Duration> {
        if (len as usize) < size_of::<libc::timeval>() {
            return None;
        }
        // SAFETY: at least a timeval's bytes.
        let t = unsafe { std::ptr::read_unaligned(val.cast::<libc::timeval>()) };
        let d = Duration::from_secs(t.tv_sec.max(0) as u64)
            + Duration::from_micros(t.tv_usec.max(0) as u64);
        (!d.is_zero()).then_some(d)
    };
    let res = lib(|| match (level, name) {
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => st.s.set_nodelay(int() != 0),
        (libc::IPPROTO_TCP, libc::TCP_CORK) => st.s.set_cork(int() != 0),
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO) => st.s.set_read_timeout(dur()),
        (libc::SOL_SOCKET, libc::SO_SNDTIMEO) => st.s.set_write_timeout(dur()),
        (libc::SOL_SOCKET, libc::SO_OOBINLINE) => st.s.set_oob_inline(int() != 0),
        _ => Ok(()),
    });
    match res {
        Ok(()) => {
            set_errno(saved);
            0
        }
        Err(e) => fail(&e),
    }
}

/// `shutdown(2)`.
///
/// # Safety
/// As `shutdown(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    settle(fd);
    let k = table::kind(fd);
    let o = if (k == STREAM || k == LISTENER) && !in_lib() {
        table::get(fd)
    } else {
        None
    };
    match o {
        Some(Obj::Stream(st)) => {
            let h = match how {
                libc::SHUT_RD => Shutdown::Read,
                libc::SHUT_WR => Shutdown::Write,
                libc::SHUT_RDWR => Shutdown::Both,
                _ => {
                    set_errno(libc::EINVAL);
                    return -1;
                }
            };
            let saved = errno();
            match lib(|| st.s.shutdown(h)) {
                Ok(()) => {
                    set_errno(saved);
                    0
                }
                Err(e) => fail(&e),
            }
        }
        // SAFETY: the listener's TCP socket.
        Some(o @ Obj::Listener(_)) => unsafe { real::shutdown(tcp_fd(&o), how) },
        // A failed connect (or one of a forked child): nothing to shut down.
        Some(Obj::Connecting(_)) => {
            set_errno(libc::ENOTCONN);
            -1
        }
        // SAFETY: passed through.
        None => unsafe { real::shutdown(fd, how) },
    }
}

/// `epoll_ctl(2)`: registrations of a descriptor whose connect is under way are recorded, so a
/// fallback can move them to the TCP socket (`crate::pending`).
///
/// # Safety
/// As `epoll_ctl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    event: *mut libc::epoll_event,
) -> c_int {
    if ep::any_sets() && !in_lib() {
        if op != libc::EPOLL_CTL_DEL {
            // SAFETY: the program's event, valid for ADD and MOD.
            unsafe { note_edge(fd, event) };
        }
        let saved = errno();
        // SAFETY: as above.
        let kept = lib(|| Ok(unsafe { ep::defer(epfd, op, fd, event) })).unwrap_or(false);
        if kept {
            set_errno(saved);
            return 0;
        }
        // The kernel's items are the program's before it changes one there.
        ep::flush();
        set_errno(saved);
    }
    // SAFETY: the caller's arguments.
    let r = unsafe { epoll_ctl_inner(epfd, op, fd, event) };
    if r == 0 && ep::any_sets() && !in_lib() {
        let saved = errno();
        // SAFETY: the event the kernel just read.
        let _ = lib(|| unsafe {
            ep::ctl(epfd, op, fd, event);
            Ok(())
        });
        set_errno(saved);
    }
    r
}

/// `epoll_create(2)`: the set is followed for the user-space answers of `epoll_wait`
/// (`crate::ep`).
///
/// # Safety
/// As `epoll_create(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    // SAFETY: passed through.
    let ep = unsafe { real::epoll_create(size) };
    epoll_created(ep)
}

/// `epoll_create1(2)`, as [`epoll_create`].
///
/// # Safety
/// As `epoll_create1(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    // SAFETY: passed through.
    let ep = unsafe { real::epoll_create1(flags) };
    epoll_created(ep)
}

fn epoll_created(ep: c_int) -> c_int {
    if ep >= 0 && !in_lib() {
        let saved = errno();
        let _ = lib(|| {
            ep::created(ep);
            Ok(())
        });
        set_errno(saved);
    }
    ep
}

/// An edge-triggered registration of the stream `fd` with `event`: from now on a settle
/// keeps its edges (`SmcStream::set_edge_readiness`). Before the kernel has the item.
///
/// # Safety
/// `event` is null or valid for reading.
unsafe fn note_edge(fd: c_int, event: *const libc::epoll_event) {
    if table::kind(fd) != STREAM || event.is_null() || in_lib() {
        return;
    }
    // SAFETY: the caller's promise.
    let ev = unsafe { std::ptr::read_unaligned(event) };
    if ev.events & libc::EPOLLET as u32 != 0
        && let Some(st) = table::stream(fd)
    {
        st.s.set_edge_readiness(true);
    }
}

/// The program's `epoll_ctl`, before the set is followed.
///
/// # Safety
/// As `epoll_ctl(2)`.
unsafe fn epoll_ctl_inner(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    event: *mut libc::epoll_event,
) -> c_int {
    if table::kind(fd) == INHERITED && op != libc::EPOLL_CTL_DEL && !in_lib() {
        adopt_listener(fd);
    }
    if op != libc::EPOLL_CTL_DEL {
        // SAFETY: the program's event, valid for ADD and MOD.
        unsafe { note_edge(fd, event) };
    }
    match table::kind(fd) {
        _ if in_lib() => {}
        // Registered or re-armed (EPOLLONESHOT) while another thread may be in epoll_wait on
        // the set already: what a read left readable is settled first. Not for a
        // level-triggered registration in a set followed in user space: a waiter there takes
        // such readability out of what the kernel reports (`crate::ep::filter`), and an
        // event loop that changes its registrations per request (redis-benchmark, wrk) would
        // otherwise drain and announce, and have the peer ring, each time.
        // SAFETY: the program's event, valid for ADD and MOD.
        STREAM if op != libc::EPOLL_CTL_DEL && !unsafe { ep::filtered(epfd, fd, event) } => {
            settle_all()
        }
        CONNECTING => {
            if let Some(r) = table::connecting(fd).and_then(|p| p.epoll_ctl(epfd, op, event)) {
                return r;
            }
        }
        LISTENER if op != libc::EPOLL_CTL_DEL => {
            if let Some(l) = table::listener(fd) {
                let saved = errno();
                if let Err(e) = lib(|| local_listener(&l, fd).map(drop)) {
                    return fail(&e);
                }
                set_errno(saved);
            }
            if !event.is_null() {
                // A listener's readiness is an epoll set, for which the kernel refuses
                // EPOLLEXCLUSIVE (nginx's workers ask for it): every waiter is woken, and
                // the ones that find nothing get EAGAIN from accept.
                // SAFETY: the program's event, valid for ADD and MOD.
                unsafe {
                    let mut ev = std::ptr::read_unaligned(event);
                    ev.events &= !(libc::EPOLLEXCLUSIVE as u32);
                    return real::epoll_ctl(epfd, op, fd, &mut ev);
                }
            }
        }
        _ => {}
    }
    // SAFETY: passed through.
    unsafe { real::epoll_ctl(epfd, op, fd, event) }
}

// ---------------------------------------------------------------------------------------
// Waiting on descriptors: readiness left readable by reads is settled first (see
// `SmcStream::set_deferred_readiness`); otherwise these are the C library's.

/// `poll(2)`.
///
/// # Safety
/// As `poll(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    // SAFETY: passed through.
    kernel_wait(|| unsafe { real::poll(fds, n, timeout) })
}

/// `__poll_chk` (`_FORTIFY_SOURCE`).
///
/// # Safety
/// As `poll(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    // SAFETY: passed through.
    kernel_wait(|| unsafe { real::__poll_chk(fds, n, timeout, fdslen) })
}

/// `ppoll(2)`.
///
/// # Safety
/// As `ppoll(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: passed through.
    kernel_wait(|| unsafe { real::ppoll(fds, n, ts, mask) })
}

/// `select(2)`.
///
/// # Safety
/// As `select(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    // SAFETY: passed through.
    kernel_wait(|| unsafe { real::select(n, r, w, e, tv) })
}

/// `pselect(2)`.
///
/// # Safety
/// As `pselect(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pselect(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: passed through.
    kernel_wait(|| unsafe { real::pselect(n, r, w, e, ts, mask) })
}

/// `epoll_wait(2)`.
///
/// # Safety
/// As `epoll_wait(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_wait(
    ep: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    let wait = |t: Timeout| {
        // SAFETY: the program's arguments, passed through.
        unsafe { real::epoll_wait(ep, events, max, t.ms()) }
    };
    // SAFETY: the program's buffer of `max` events.
    if let Some(n) = unsafe { epoll_ready(ep, events, max, wait) } {
        return n;
    }
    // SAFETY: the program's buffer.
    unsafe { epoll_kernel(ep, events, Timeout::Ms(timeout), true, wait) }
}

/// `epoll_pwait(2)`.
///
/// # Safety
/// As `epoll_pwait(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_pwait(
    ep: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    let wait = |t: Timeout| {
        // SAFETY: the program's arguments, passed through.
        unsafe { real::epoll_pwait(ep, events, max, t.ms(), mask) }
    };
    // SAFETY: the program's buffer of `max` events.
    if let Some(n) = unsafe { epoll_ready(ep, events, max, wait) } {
        return n;
    }
    // SAFETY: the program's buffer.
    unsafe { epoll_kernel(ep, events, Timeout::Ms(timeout), true, wait) }
}

/// `epoll_pwait2(2)`.
///
/// # Safety
/// As `epoll_pwait2(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_pwait2(
    ep: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    timeout: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let wait0 = |_: Timeout| {
        // SAFETY: the program's arguments, with a zero timeout.
        unsafe { real::epoll_pwait2(ep, events, max, &zero, mask) }
    };
    // SAFETY: the program's buffer of `max` events.
    if let Some(n) = unsafe { epoll_ready(ep, events, max, wait0) } {
        return n;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: the program's arguments, passed through.
    unsafe {
        let mut first = true;
        epoll_kernel(ep, events, Timeout::of_ts(timeout), true, |t| {
            // The program's own timeout the first time (an invalid one gets the kernel's
            // EINVAL); what is left of it after a wait whose events were all taken out.
            let p = if first { timeout } else { t.ts_ptr(&mut ts) };
            first = false;
            real::epoll_pwait2(ep, events, max, p, mask)
        })
    }
}

/// What an `epoll_wait` on `ep` can answer without the kernel (`crate::ep`): the SMC
/// streams of the set that are ready in shared memory, while the program is busy. A pending
/// signal is then not delivered by this call, as the kernel's `epoll_pwait` delivers none
/// when it has events to return. When it is the kernel's turn (`ep::Answer::Probe`), the
/// kernel is asked without waiting first (`wait0`, the real call with a zero timeout): what
/// it reports is the answer, and only when it has nothing is the answer made here.
///
/// # Safety
/// `events` is the program's buffer for `max` events.
unsafe fn epoll_ready(
    ep: c_int,
    events: *mut libc::epoll_event,
    max: c_int,
    wait0: impl FnMut(Timeout) -> c_int,
) -> Option<c_int> {
    if !ep::any_sets() || max <= 0 || events.is_null() || in_lib() {
        return None;
    }
    let collect = || {
        let saved = errno();
        // SAFETY: the caller's buffer.
        let a = lib(|| Ok(unsafe { ep::collect(ep, events, max as usize) }))
            .unwrap_or(ep::Answer::Kernel);
        set_errno(saved);
        a
    };
    match collect() {
        ep::Answer::Here(n) => Some(n as c_int),
        ep::Answer::Kernel => None,
        ep::Answer::Probe(_) => {
            // SAFETY: the caller's buffer; the real call. It does not sleep: changes kept from
            // the kernel stay kept (`crate::ep::filter` reads the kernel's reports by them).
            let r = unsafe { epoll_kernel(ep, events, Timeout::Ms(0), false, wait0) };
            if r != 0 {
                return Some(r);
            }
            // Not the kernel's turn now: answered here, unless nothing is ready any more
            // (another thread took it), when the kernel answers as usual.
            match collect() {
                ep::Answer::Here(n) | ep::Answer::Probe(n) => Some(n as c_int),
                ep::Answer::Kernel => None,
            }
        }
    }
}

/// An `epoll_wait` timeout: milliseconds (negative: none) or a `timespec` (null: none).
#[derive(Clone, Copy)]
enum Timeout {
    Ms(c_int),
    Ts(Option<std::time::Duration>),
}

impl Timeout {
    /// # Safety
    /// `ts` is null or valid for reading.
    unsafe fn of_ts(ts: *const libc::timespec) -> Timeout {
        if ts.is_null() {
            return Timeout::Ts(None);
        }
        // SAFETY: the caller's.
        let t = unsafe { std::ptr::read(ts) };
        match (u64::try_from(t.tv_sec), u32::try_from(t.tv_nsec)) {
            (Ok(s), Ok(ns)) if ns < 1_000_000_000 => {
                Timeout::Ts(Some(std::time::Duration::new(s, ns)))
            }
            // Invalid: the first wait passes the program's own, and the kernel says EINVAL.
            _ => Timeout::Ts(Some(std::time::Duration::ZERO)),
        }
    }

    fn ms(self) -> c_int {
        match self {
            Timeout::Ms(ms) => ms,
            Timeout::Ts(_) => -1,
        }
    }

    fn ts_ptr(self, buf: &mut libc::timespec) -> *const libc::timespec {
        match self {
            Timeout::Ts(Some(d)) => {
                buf.tv_sec = d.as_secs() as libc::time_t;
                buf.tv_nsec = libc::c_long::from(d.subsec_nanos() as i32);
                buf
            }
            _ => std::ptr::null(),
        }
    }

    /// What is left of it at `started` + the time gone; `None` when it ran out.
    fn left(self, started: std::time::Instant) -> Option<Timeout> {
        let gone = started.elapsed();
        match self {
            Timeout::Ms(ms) if ms < 0 => Some(self),
            Timeout::Ms(ms) => {
                let left = u128::try_from(ms)
                    .unwrap_or(0)
                    .checked_sub(gone.as_millis())?;
                (left > 0).then_some(Timeout::Ms(left as c_int))
            }
            Timeout::Ts(None) => Some(self),
            Timeout::Ts(Some(d)) => {
                let left = d.checked_sub(gone)?;
                (!left.is_zero()).then_some(Timeout::Ts(Some(left)))
            }
        }
    }
}

/// The kernel's wait, after the settle; then, for a set followed in user space, events the
/// kernel reported for an SMC stream that a read would not serve (the peer's ring of a bell
/// landed after the program had read what it rang for: `crate::ep::filter`) are taken out,
/// and when nothing is left the wait goes on for the rest of the timeout. A wait that
/// `sleeps` (any timeout but zero) is announced first (`kernel_wait`).
///
/// # Safety
/// `events` is the program's buffer; `wait` is the real call with the program's arguments.
unsafe fn epoll_kernel(
    ep: c_int,
    events: *mut libc::epoll_event,
    timeout: Timeout,
    sleeps: bool,
    mut wait: impl FnMut(Timeout) -> c_int,
) -> c_int {
    let started = std::time::Instant::now();
    let mut t = timeout;
    loop {
        let r = if sleeps {
            kernel_wait_on(Some(ep), || wait(t))
        } else {
            // Only what the filter could not take out is settled (`crate::ep::probe_needs_settle`).
            if lib(|| Ok(ep::probe_needs_settle(ep))).unwrap_or(true) {
                settle_all();
            }
            wait(t)
        };
        if r <= 0 || !ep::any_sets() || in_lib() {
            return r;
        }
        let saved = errno();
        // SAFETY: the kernel wrote `r` events there.
        let (n, again) = lib(|| Ok(unsafe { ep::filter(ep, events, r as usize, !sleeps) }))
            .unwrap_or((r as usize, 0));
        if sleeps && n > 0 {
            // Woken, and busy now: the set's streams take back what their settle announced,
            // so their peers ring nobody until this loop waits again (`crate::table::withdraw`).
            let _ = lib(|| {
                table::withdraw(&ep::withdrawable(ep));
                Ok(())
            });
        }
        set_errno(saved);
        if n > 0 {
            return n as c_int;
        }
        match t.left(started) {
            // Edges reported already, and time left: given once more rather than slept on
            // (a signal the program's handler took as this wait returned must end it).
            Some(_) if again > 0 => return again as c_int,
            Some(rest) => t = rest,
            None => return 0,
        }
    }
}

/// A wait of the kernel's on descriptors (`wait`, the real call): announced first, so that
/// no `EPOLL_CTL_MOD` is kept from the kernel meanwhile and what was kept is made there
/// (`crate::ep::wait_begin`), then every stream a read left readable is settled.
fn kernel_wait<R>(wait: impl FnOnce() -> R) -> R {
    kernel_wait_on(None, wait)
}

/// [`kernel_wait`], for a wait on the epoll set `ep` when given: the process's only waiter
/// tags its sleep on the set's streams, so their peers ring it once (`crate::table::tag_sleep`),
/// and untags them when it wakes, while it still counts as waiting. A thread that is not the
/// only waiter ends a tagged sleep of another first (its stream may be one whose ring was
/// skipped), before its settle.
fn kernel_wait_on<R>(ep: Option<c_int>, wait: impl FnOnce() -> R) -> R {
    let sole = ep::wait_begin();
    if !sole && !in_lib() {
        let saved = errno();
        let _ = lib(|| {
            table::untag_all();
            Ok(())
        });
        set_errno(saved);
    }
    settle_all();
    let tagged = match ep {
        Some(ep) if sole && !in_lib() => {
            let saved = errno();
            let t = lib(|| Ok(table::tag_sleep(&ep::withdrawable(ep)))).unwrap_or(false);
            set_errno(saved);
            t
        }
        _ => false,
    };
    let r = wait();
    if tagged {
        let saved = errno();
        let _ = lib(|| {
            table::untag_all();
            Ok(())
        });
        set_errno(saved);
    }
    ep::wait_end();
    r
}

/// Settles every stream a read left readable (one atomic load when there is none, as for a
/// program that uses no SMC connection); errno is kept.
fn settle_all() {
    if !table::any_dirty() || in_lib() {
        return;
    }
    let saved = errno();
    let _ = lib(|| {
        table::settle_dirty();
        Ok(())
    });
    set_errno(saved);
}

// ---------------------------------------------------------------------------------------
// exec: connections that survive it go to a keeper (`crate::exec`).

/// Runs `exec` (the real call) with the connections that survive it handed over first, and
/// everything put back if it returns (it failed; its errno stays).
fn exec_with(call: impl FnOnce() -> c_int) -> c_int {
    // A vfork child (CPython's subprocess) execs in its parent's memory, which holds the
    // connections on: nothing is handed over (the new program's copies of them are dead).
    if in_lib() || table::borrowed_memory() {
        return call();
    }
    // The new program shares the kernel's sets it inherits.
    ep::flush();
    around(crate::exec::before, call, crate::exec::failed)
}

/// Runs `call` (a real `exec` or spawn) between the library's `before`, whose hand-over
/// `after` takes back once `call` returned; errno is the program's before and `call`'s after.
fn around<H>(
    before: impl FnOnce() -> Option<H>,
    call: impl FnOnce() -> c_int,
    after: impl FnOnce(H),
) -> c_int {
    let saved = errno();
    let h = lib(|| Ok(before())).ok().flatten();
    set_errno(saved);
    let r = call();
    if let Some(h) = h {
        let e = errno();
        let _ = lib(|| {
            after(h);
            Ok(())
        });
        set_errno(e);
    }
    r
}

/// `execve(2)`.
///
/// # Safety
/// As `execve(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execve(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    // SAFETY: passed through.
    exec_with(|| unsafe { real::execve(path, argv, envp) })
}

/// `execv(3)`.
///
/// # Safety
/// As `execv(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execv(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
) -> c_int {
    // SAFETY: passed through.
    exec_with(|| unsafe { real::execv(path, argv) })
}

/// `execvp(3)`.
///
/// # Safety
/// As `execvp(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvp(
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
) -> c_int {
    // SAFETY: passed through.
    exec_with(|| unsafe { real::execvp(file, argv) })
}

/// `execvpe(3)`.
///
/// # Safety
/// As `execvpe(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvpe(
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    // SAFETY: passed through.
    exec_with(|| unsafe { real::execvpe(file, argv, envp) })
}

/// `fexecve(3)`.
///
/// # Safety
/// As `fexecve(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    // SAFETY: passed through.
    exec_with(|| unsafe { real::fexecve(fd, argv, envp) })
}

// ---------------------------------------------------------------------------------------
// posix_spawn: its `execve` runs inside the C library, unseen; the connections the new
// program can see go to a keeper around the call (`crate::exec::spawn_before`).

/// Descriptors of ours that file actions (by their address) `dup2` for a spawned program:
/// they reach it even when close-on-exec.
static SPAWN_DUP2: std::sync::Mutex<Vec<(usize, c_int)>> = std::sync::Mutex::new(Vec::new());

fn forget_file_actions(fa: *const libc::posix_spawn_file_actions_t) {
    SPAWN_DUP2
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(a, _)| *a != fa as usize);
}

/// `posix_spawn_file_actions_init(3)`.
///
/// # Safety
/// As `posix_spawn_file_actions_init(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_init(
    fa: *mut libc::posix_spawn_file_actions_t,
) -> c_int {
    if !in_lib() {
        forget_file_actions(fa);
    }
    // SAFETY: passed through.
    unsafe { real::posix_spawn_file_actions_init(fa) }
}

/// `posix_spawn_file_actions_destroy(3)`.
///
/// # Safety
/// As `posix_spawn_file_actions_destroy(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_destroy(
    fa: *mut libc::posix_spawn_file_actions_t,
) -> c_int {
    if !in_lib() {
        forget_file_actions(fa);
    }
    // SAFETY: passed through.
    unsafe { real::posix_spawn_file_actions_destroy(fa) }
}

/// `posix_spawn_file_actions_adddup2(3)`: a `dup2` of one of our connections is noted.
///
/// # Safety
/// As `posix_spawn_file_actions_adddup2(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_adddup2(
    fa: *mut libc::posix_spawn_file_actions_t,
    fd: c_int,
    new: c_int,
) -> c_int {
    // SAFETY: passed through.
    let r = unsafe { real::posix_spawn_file_actions_adddup2(fa, fd, new) };
    if r == 0 && table::kind(fd) == STREAM && !in_lib() {
        SPAWN_DUP2
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((fa as usize, fd));
    }
    r
}

/// Runs `posix_spawn` (the real call, which returns an error number) with the connections the
/// new program can see handed to a keeper around it; errno is kept.
fn spawn_with(fa: *const libc::posix_spawn_file_actions_t, call: impl FnOnce() -> c_int) -> c_int {
    if in_lib() || table::borrowed_memory() {
        return call();
    }
    // The new program shares the kernel's sets it inherits.
    ep::flush();
    if table::all().is_empty() {
        return call();
    }
    let extra: Vec<c_int> = if fa.is_null() {
        Vec::new()
    } else {
        SPAWN_DUP2
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(a, _)| *a == fa as usize)
            .map(|(_, fd)| *fd)
            .collect()
    };
    around(
        || crate::exec::spawn_before(&extra),
        call,
        crate::exec::spawn_after,
    )
}

/// `posix_spawn(3)`.
///
/// # Safety
/// As `posix_spawn(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const libc::c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    // SAFETY: passed through.
    spawn_with(fa, || unsafe {
        real::posix_spawn(pid, path, fa, attr, argv, envp)
    })
}

/// `posix_spawnp(3)`.
///
/// # Safety
/// As `posix_spawnp(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const libc::c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    // SAFETY: passed through.
    spawn_with(fa, || unsafe {
        real::posix_spawnp(pid, file, fa, attr, argv, envp)
    })
}

// The variadic `execl`, `execle`, `execlp`: the C library's call `execve` inside it, where
// no hook sees the call. Stable Rust cannot define a C-variadic function, so each exported
// name is a naked function that jumps, registers and stack untouched, to a C function
// (`csrc/execl.c`) that gathers the arguments as the C library does and calls `execv`,
// `execve` or `execvp`: the hooks above. (A cdylib exports only Rust's symbols, so the C
// functions cannot be the exported names themselves.) On other architectures these are not
// hooked (docs/smc-run.md).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod variadic_exec {
    use libc::{c_char, c_int};

    unsafe extern "C" {
        fn smc_preload_execl(path: *const c_char, arg: *const c_char, ...) -> c_int;
        fn smc_preload_execle(path: *const c_char, arg: *const c_char, ...) -> c_int;
        fn smc_preload_execlp(file: *const c_char, arg: *const c_char, ...) -> c_int;
    }

    /// Defines the exported `$name` as a jump to `$target`.
    macro_rules! jump_to {
        ($name:ident, $target:ident) => {
            /// The variadic exec function of this name (see the module comment).
            ///
            /// # Safety
            /// As the C library's.
            #[unsafe(no_mangle)]
            #[unsafe(naked)]
            pub unsafe extern "C" fn $name() {
                #[cfg(target_arch = "x86_64")]
                std::arch::naked_asm!("jmp {}", sym $target);
                #[cfg(target_arch = "aarch64")]
                std::arch::naked_asm!("b {}", sym $target);
            }
        };
    }

    jump_to!(execl, smc_preload_execl);
    jump_to!(execle, smc_preload_execle);
    jump_to!(execlp, smc_preload_execlp);
}
