//! `smc-perf`: a qperf/sockperf-like load generator for SMC and TCP.
//!
//! ```text
//! smc-perf server [--port P] [--bind ADDR] [--tcp] [--pin CPU] [--limit-hs BOOL] [--no-stats]
//!                 [--events]
//! smc-perf client HOST:PORT --test bw|lat|crr|idle --msg-size N --time SECONDS [--tcp]
//!                 [--concurrency C] [--count N] [--pin CPU] [--warmup SECONDS] [--no-stats]
//!                 [--events [--threads N]] [--smcr ADDR [--smcr-set NAME=VALUE]...]
//!                 [--also HOST:PORT]... [--setup-lock]
//! smc-perf drip HOST:PORT [--attackers N] [--time SECONDS]
//! ```
//!
//! The client prints one JSON object per run. Every byte received is checked against the
//! sender's pattern (a function of its position in the stream), so a fast wrong answer is
//! counted in `errors`, and a run with errors exits 1.
//!
//! * `bw`: one-way stream (qperf `tcp_bw`): the client writes `msg-size` messages for the
//!   given time, the server reads and checks them and reports what it received; `mbps` is
//!   MB/s (10^6 bytes) at the receiver.
//! * `lat`: ping-pong (qperf `tcp_lat`, sockperf `pp`): one-way latency = round trip / 2.
//! * `crr`: connect, one request/response of `msg-size`, close, in `concurrency` parallel
//!   loops; `conns_per_s`. The server closes first, as an HTTP server does after a
//!   `Connection: close` response (wrk's benchmark), so TIME_WAIT stays on the server and
//!   the client's ephemeral ports are free again at once. With `--count N` it makes exactly
//!   N connections (over the `concurrency` loops) and exits, reporting each one's connect
//!   time (`connect_us`) and what each became: the short-lived client process of a soak.
//!   With `--events` the client keeps the connections in `--threads` epoll loops (one by
//!   default) instead of a thread each, as wrk does, and `server --events` accepts and serves
//!   crr from one epoll loop, as nginx does (see `events.rs`). With `--also HOST:PORT` the
//!   loops are shared out among several servers (loop i drives target i mod n), all from
//!   this process and so through one SMC-R endpoint and its table of link groups; `targets`
//!   in the report gives each one's rate in the measured window (and, over SMC-R, the link
//!   groups its connections used). This is how the bench measures that a slow peer does not
//!   hold up connection setup to another (the kernel's lgr-pending lock).
//! * `idle`: opens `--count` connections, checks each with one echo, holds them open and
//!   silent for `--time` seconds, checks each with a second echo and closes them. The server
//!   keeps idle connections in one epoll loop, not a thread each.
//! * `drip`: an attacker, not a test (issue 10): announces itself through smcd as an SMC
//!   client must, connects, and sends a CLC Proposal one byte at a time, each byte well
//!   within `CLC_WAIT_TIME` of the last, on `--attackers` connections at once, reconnecting
//!   whenever the listener closes one. It reports how long the listener let each one live.
//!
//! The server prints `smc-perf: serving smc|tcp on ADDR:PORT` on stderr once it listens, with
//! the port actually bound, so `--port 0` picks a free one and a harness learns which.

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;
use smcd_engine::smcr::{SmcrConfig, SmcrEndpoint, SmcrListener, SmcrMode, SmcrStream};
use smcd_engine::{Mode, SmcListener, SmcStream};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

mod events;

#[derive(Debug, Parser)]
// clap names the program after the package: `--version` printed `smcd-engine 0.1.0` while the
// binary lived there, and still does.
#[command(
    name = "smcd-engine",
    version,
    about = "SMC vs TCP load generator (bw, lat, crr)"
)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Serve tests until killed.
    Server {
        /// Port to listen on.
        #[arg(long, default_value_t = 37373)]
        port: u16,
        /// Address to bind.
        #[arg(long, default_value = "0.0.0.0")]
        bind: String,
        /// Plain TCP listener.
        #[arg(long)]
        tcp: bool,
        /// Pin the server's threads to this CPU.
        #[arg(long)]
        pin: Option<usize>,
        /// Handshake limitation for this listener: on, off, or (unset) the namespace's
        /// limit_smc_hs.
        #[arg(long)]
        limit_hs: Option<bool>,
        /// Do not count in the data path (to measure what counting costs).
        #[arg(long)]
        no_stats: bool,
        /// One event loop (epoll) accepts and serves crr, as nginx does; other tests still get a
        /// thread each.
        #[arg(long)]
        events: bool,
        /// SMC-R instead of SMC-D: the soft RoCEv2 device on this local address (UDP 4791;
        /// the peer must be an `smc-perf --smcr` of its own, it is assumed SMC-R capable).
        #[arg(long)]
        smcr: Option<std::net::Ipv4Addr>,
        /// With --smcr: an engine setting of the SMC-R endpoint, `NAME=VALUE` (autocorking_size,
        /// autosplit_size, tx_chunk, rmem: the RMB size, inline: 0 or 1,
        /// smcr_max_conns_per_lgr: 16 to 255); repeatable.
        #[arg(long = "smcr-set", value_name = "NAME=VALUE")]
        smcr_set: Vec<String>,
    },
    /// Run one test against a server.
    Client {
        /// HOST:PORT of the server.
        target: String,
        /// Which test.
        #[arg(long, value_enum)]
        test: Test,
        /// Message size in bytes.
        #[arg(long, default_value_t = 64)]
        msg_size: usize,
        /// Measured seconds.
        #[arg(long, default_value_t = 5.0)]
        time: f64,
        /// Unmeasured seconds before measuring.
        #[arg(long, default_value_t = 0.2)]
        warmup: f64,
        /// Plain TCP.
        #[arg(long)]
        tcp: bool,
        /// Parallel connection loops (crr, idle).
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// crr: make exactly N connections, then exit (instead of --time); idle: the
        /// connections to hold open (default 1).
        #[arg(long)]
        count: Option<u64>,
        /// Pin the client's threads to this CPU.
        #[arg(long)]
        pin: Option<usize>,
        /// Do not count in the data path (to measure what counting costs; the server needs
        /// it too).
        #[arg(long)]
        no_stats: bool,
        /// crr: drive the connections from event loops (epoll), as wrk does, instead of a
        /// thread each.
        #[arg(long)]
        events: bool,
        /// With --events: how many event loops share the connections.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// SMC-R instead of SMC-D, over the soft RoCEv2 device on this local address.
        #[arg(long)]
        smcr: Option<std::net::Ipv4Addr>,
        /// With --smcr: an engine setting of the SMC-R endpoint, `NAME=VALUE` (autocorking_size,
        /// autosplit_size, tx_chunk, rmem: the RMB size, inline: 0 or 1,
        /// smcr_max_conns_per_lgr: 16 to 255); repeatable.
        #[arg(long = "smcr-set", value_name = "NAME=VALUE")]
        smcr_set: Vec<String>,
        /// crr: another server to drive at the same time, from this process and its SMC-R
        /// endpoint (repeatable). Loop i of `--concurrency` drives target i mod n, and the
        /// report gives each target's rate (`targets`).
        #[arg(long, value_name = "HOST:PORT")]
        also: Vec<String>,
        /// crr: hold one process-wide lock across every connect (TCP handshake, CLC, link
        /// setup), as the kernel's smc_client_lgr_pending serialises SMC-R setup. A control
        /// for the bench's lgr-pending suite: with it, a slow peer must hold up the others.
        #[arg(long)]
        setup_lock: bool,
    },
    /// Drip-feed CLC Proposals at an SMC listener (an attacker for soak tests; needs smcd).
    Drip {
        /// HOST:PORT of the SMC listener.
        target: String,
        /// Connections dripping at once.
        #[arg(long, default_value_t = 20)]
        attackers: usize,
        /// Seconds to attack (or until stdin closes), then report.
        #[arg(long, default_value_t = 30.0)]
        time: f64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Test {
    Bw,
    Lat,
    Crr,
    Idle,
}

impl Test {
    fn code(self) -> u8 {
        match self {
            Test::Bw => 1,
            Test::Lat => 2,
            Test::Crr => 3,
            Test::Idle => 4,
        }
    }
    fn from_code(c: u8) -> Option<Test> {
        match c {
            1 => Some(Test::Bw),
            2 => Some(Test::Lat),
            3 => Some(Test::Crr),
            4 => Some(Test::Idle),
            _ => None,
        }
    }
}

// ------------------------------------------------------------------------------------------
// The byte pattern: byte i of a stream is PATTERN[i % 251]. A prime period means no message
// size lines up with it, so a shifted, repeated or dropped chunk shows.

const PERIOD: usize = 251;
const MAX_MSG: usize = 16 << 20;

fn pattern() -> &'static [u8] {
    static P: OnceLock<Vec<u8>> = OnceLock::new();
    P.get_or_init(|| {
        (0..PERIOD + MAX_MSG)
            .map(|i| ((i % PERIOD) as u8).wrapping_mul(97).wrapping_add(13))
            .collect()
    })
}

/// The expected bytes at stream offset `off`, `len` long.
fn expected(off: u64, len: usize) -> &'static [u8] {
    let s = (off % PERIOD as u64) as usize;
    &pattern()[s..s + len]
}

/// Counts differing chunks (not bytes: one bad read is one error).
fn check(off: u64, got: &[u8]) -> u64 {
    let mut errors = 0;
    for (i, chunk) in got.chunks(MAX_MSG).enumerate() {
        if chunk != expected(off + (i * MAX_MSG) as u64, chunk.len()) {
            errors += 1;
        }
    }
    errors
}

// ------------------------------------------------------------------------------------------
// One connection, either kind.

enum Conn {
    Smc(SmcStream),
    Smcr(SmcrStream),
    Tcp(TcpStream),
}

/// The SMC-R endpoint of this process (`--smcr`), if any.
static SMCR: OnceLock<SmcrEndpoint> = OnceLock::new();

/// Opens the SMC-R endpoint on `addr` (once).
fn open_smcr(addr: std::net::Ipv4Addr, set: &[String]) -> anyhow::Result<()> {
    let mut cfg = SmcrConfig::new(addr, "SMC-PERF-SMCR", smcd_engine::smcr::Capability::Assume);
    for kv in set {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--smcr-set {kv}: not NAME=VALUE"))?;
        let v: u32 = v
            .parse()
            .with_context(|| format!("--smcr-set {kv}: not a number"))?;
        match k {
            "autocorking_size" => cfg.settings.autocorking_size = v,
            "autosplit_size" => cfg.settings.autosplit_size = v,
            "tx_chunk" => cfg.tx_chunk = v as usize,
            "rmem" => cfg.ring = v as usize,
            "inline" => cfg.inline = v != 0,
            // 16 is SMC-Rv2.1's least (SMC_CONN_PER_LGR_MIN): the endpoint would raise a
            // smaller value to it, so it is refused here rather than changed silently.
            "smcr_max_conns_per_lgr" => {
                cfg.max_conns = u8::try_from(v)
                    .ok()
                    .filter(|&n| n >= 16)
                    .with_context(|| format!("--smcr-set {kv}: 16 to 255"))?;
            }
            _ => bail!("--smcr-set: unknown setting {k}"),
        }
    }
    let ep =
        SmcrEndpoint::open(cfg).with_context(|| format!("opening the SMC-R device on {addr}"))?;
    let _ = SMCR.set(ep);
    Ok(())
}

impl Conn {
    /// Connects; `nodelay` as the test wants it (qperf's `tcp_bw` leaves Nagle on, the
    /// ping-pong tests turn it off).
    fn connect(addr: SocketAddr, tcp: bool, nodelay: bool) -> io::Result<Conn> {
        if tcp {
            let s = TcpStream::connect(addr)?;
            s.set_nodelay(nodelay)?;
            Ok(Conn::Tcp(s))
        } else if let Some(ep) = SMCR.get() {
            let s = ep.connect(addr)?;
            s.set_nodelay(nodelay)?;
            Ok(Conn::Smcr(s))
        } else {
            let s = SmcStream::connect(addr)?;
            if nodelay {
                s.set_nodelay(true)?;
            }
            Ok(Conn::Smc(s))
        }
    }
    fn transport(&self) -> &'static str {
        match self {
            Conn::Smc(s) if s.is_smc() => "smcd",
            Conn::Smcr(s) if matches!(s.mode(), SmcrMode::SmcR { .. }) => "smcr",
            _ => "tcp",
        }
    }
    fn mode(&self) -> String {
        match self {
            Conn::Smc(s) => match s.mode() {
                Mode::SmcD(_) => "smcd".into(),
                Mode::Tcp(fb) => format!("tcp-fallback {:#010x}", fb.local.0),
            },
            Conn::Smcr(s) => match s.mode() {
                SmcrMode::SmcR { lgr_id, .. } => format!("smcr lgr {lgr_id:#010x}"),
                SmcrMode::Tcp(fb) => format!("tcp-fallback {:#010x}", fb.local.0),
            },
            Conn::Tcp(_) => "tcp".into(),
        }
    }
    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Conn::Smc(s) => s.set_nonblocking(on),
            Conn::Smcr(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "SMC-R streams are blocking only",
            )),
            Conn::Tcp(s) => s.set_nonblocking(on),
        }
    }
    fn readiness_fd(&self) -> io::Result<rustix::fd::BorrowedFd<'_>> {
        use rustix::fd::AsFd;
        match self {
            Conn::Smc(s) => s.readiness_fd(),
            Conn::Smcr(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "SMC-R streams have no readiness descriptor",
            )),
            Conn::Tcp(s) => Ok(s.as_fd()),
        }
    }
    /// `Some(mode)` when an SMC stream fell back to TCP.
    fn fallback(&self) -> Option<String> {
        match self {
            Conn::Smc(s) if !s.is_smc() => Some(self.mode()),
            Conn::Smcr(s) if !matches!(s.mode(), SmcrMode::SmcR { .. }) => Some(self.mode()),
            _ => None,
        }
    }
    fn shutdown_write(&self) -> io::Result<()> {
        match self {
            Conn::Smc(s) => s.shutdown(Shutdown::Write),
            Conn::Smcr(s) => s.shutdown(Shutdown::Write),
            Conn::Tcp(s) => s.shutdown(Shutdown::Write),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Smc(s) => s.read(b),
            Conn::Smcr(s) => s.read(b),
            Conn::Tcp(s) => s.read(b),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Smc(s) => s.write(b),
            Conn::Smcr(s) => s.write(b),
            Conn::Tcp(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Smc(s) => s.flush(),
            Conn::Smcr(s) => s.flush(),
            Conn::Tcp(s) => s.flush(),
        }
    }
}

fn pin(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        let mut set = rustix::thread::CpuSet::new();
        set.set(cpu);
        if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
            eprintln!("smc-perf: cannot pin to CPU {cpu}: {e}");
        }
    }
}

/// The request header: test code (1), message size (8, big endian).
fn write_header(c: &mut Conn, test: Test, msg: usize) -> io::Result<()> {
    let mut h = [0u8; 9];
    h[0] = test.code();
    h[1..].copy_from_slice(&(msg as u64).to_be_bytes());
    c.write_all(&h)
}

// ------------------------------------------------------------------------------------------
// Server.

fn serve_conn(mut c: Conn) -> anyhow::Result<()> {
    let mut h = [0u8; 9];
    c.read_exact(&mut h)?;
    let test = Test::from_code(h[0])
        .with_context(|| format!("unknown test code {h:02x?} {}", c.transport()))?;
    let msg = u64::from_be_bytes(h[1..].try_into().expect("8 bytes")) as usize;
    if msg == 0 || msg > MAX_MSG {
        bail!("message size {msg} out of range");
    }
    serve_test(c, test, msg)
}

/// Serves one connection whose header was read: `test` with messages of `msg` bytes.
fn serve_test(mut c: Conn, test: Test, msg: usize) -> anyhow::Result<()> {
    match test {
        Test::Bw => {
            // Read and check until end of stream; report (bytes, errors).
            let mut buf = vec![0u8; msg.max(64 * 1024)];
            let (mut off, mut errors) = (0u64, 0u64);
            loop {
                let n = c.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                errors += check(off, &buf[..n]);
                off += n as u64;
            }
            let mut r = [0u8; 16];
            r[..8].copy_from_slice(&off.to_be_bytes());
            r[8..].copy_from_slice(&errors.to_be_bytes());
            c.write_all(&r)?;
            c.flush()?;
        }
        Test::Crr => {
            // One request, one response, then close first (see the module doc).
            let mut buf = vec![0u8; msg];
            c.read_exact(&mut buf)?;
            c.write_all(&buf)?;
            c.flush()?;
        }
        Test::Lat => {
            // Echo messages back; each message is checked by the client.
            let mut buf = vec![0u8; msg];
            loop {
                match c.read_exact(&mut buf) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                    Err(e) => return Err(e.into()),
                }
                c.write_all(&buf)?;
            }
        }
        Test::Idle => IdleHolder::get().hold(c)?,
    }
    Ok(())
}

/// The server's idle connections: one epoll loop echoes what they send and closes them at
/// their end of stream, so ten thousand of them cost no thread each (edge-triggered, as
/// `smcd-engine`'s `epoll_echo` example drives streams).
struct IdleHolder {
    ep: rustix::fd::OwnedFd,
    conns: std::sync::Mutex<std::collections::HashMap<u64, (Conn, Vec<u8>)>>,
    next: AtomicU64,
}

impl IdleHolder {
    fn get() -> &'static IdleHolder {
        static H: OnceLock<IdleHolder> = OnceLock::new();
        let mut first = false;
        let h = H.get_or_init(|| {
            first = true;
            IdleHolder {
                ep: rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC)
                    .expect("epoll_create"),
                conns: std::sync::Mutex::new(std::collections::HashMap::new()),
                next: AtomicU64::new(0),
            }
        });
        if first {
            std::thread::spawn(move || h.run());
        }
        h
    }

    fn hold(&self, c: Conn) -> io::Result<()> {
        c.set_nonblocking(true)?;
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        use rustix::event::epoll;
        epoll::add(
            &self.ep,
            c.readiness_fd()?,
            epoll::EventData::new_u64(token),
            epoll::EventFlags::IN | epoll::EventFlags::OUT | epoll::EventFlags::ET,
        )?;
        conns.insert(token, (c, Vec::new()));
        Ok(())
    }

    fn run(&self) {
        use rustix::event::epoll;
        let mut events = Vec::with_capacity(256);
        loop {
            events.clear();
            if epoll::wait(&self.ep, rustix::buffer::spare_capacity(&mut events), None).is_err() {
                continue;
            }
            let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
            for ev in &events {
                let token = ev.data.u64();
                let Some((c, pending)) = conns.get_mut(&token) else {
                    continue;
                };
                if !echo_nonblocking(c, pending) {
                    let (c, _) = conns.remove(&token).expect("present");
                    if let Ok(fd) = c.readiness_fd() {
                        let _ = epoll::delete(&self.ep, fd);
                    }
                }
            }
        }
    }
}

/// Reads what is there and writes it back; false when the connection is done.
fn echo_nonblocking(c: &mut Conn, pending: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 4096];
    let mut open = true;
    loop {
        match c.read(&mut buf) {
            Ok(0) => {
                open = false;
                break;
            }
            Ok(n) => pending.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    while !pending.is_empty() {
        match c.write(pending) {
            Ok(n) => {
                pending.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    open
}

/// Prints a served connection's error, unless it is the client going away.
fn report_conn_error(e: &anyhow::Error) {
    if !matches!(
        e.downcast_ref::<io::Error>().map(io::Error::kind),
        Some(
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::BrokenPipe
        )
    ) {
        eprintln!("smc-perf: connection: {e:#}");
    }
}

/// The server's listener, either kind.
enum Listen {
    Smc(SmcListener),
    Smcr(SmcrListener),
    Tcp(TcpListener),
}
use Listen as L;

/// Listen backlog of both servers. The same for TCP and SMC so crr compares transports, not
/// queue lengths (`std`'s `TcpListener::bind` uses 128, which overflows at 512 concurrent
/// connects and turns into resets).
const BACKLOG: u32 = 1024;

/// A TCP listener with an explicit backlog, bound as `SmcListener` binds (`SO_REUSEADDR`).
fn tcp_listener(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let fam = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let sock = rustix::net::socket_with(fam, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    rustix::net::sockopt::set_socket_reuseaddr(&sock, true)?;
    rustix::net::bind(&sock, &addr)?;
    rustix::net::listen(&sock, backlog as i32)?;
    Ok(TcpListener::from(sock))
}

fn server(
    port: u16,
    bind: &str,
    tcp: bool,
    cpu: Option<usize>,
    limit_hs: Option<bool>,
    events: bool,
) -> anyhow::Result<()> {
    // Before any thread starts: `cargo xtask bench` counts the server's wake-ups with it.
    smcd_engine::sys::report_context_switches_on_sigusr1("smc-perf")?;
    pin(cpu);
    let addr: SocketAddr = format!("{bind}:{port}")
        .parse()
        .context("bad bind address")?;
    let l = Arc::new(if tcp {
        L::Tcp(tcp_listener(addr, BACKLOG)?)
    } else if let Some(ep) = SMCR.get() {
        if events {
            bail!("--events does not run over SMC-R");
        }
        L::Smcr(ep.listen(addr)?)
    } else {
        L::Smc(SmcListener::bind_with_options(
            smcd_engine::Engine::global(),
            addr,
            smcd_engine::driver::listener::ListenOptions {
                backlog: BACKLOG,
                limit_hs,
            },
        )?)
    });
    let bound = match &*l {
        L::Smc(l) => l.local_addr()?,
        L::Smcr(l) => l.local_addr()?,
        L::Tcp(l) => l.local_addr()?,
    };
    eprintln!(
        "smc-perf: serving {} on {bound}",
        match &*l {
            L::Smc(_) => "smc",
            L::Smcr(_) => "smcr",
            L::Tcp(_) => "tcp",
        }
    );
    if events {
        let l = Arc::into_inner(l).expect("not shared yet");
        return events::serve(l, cpu);
    }
    // A pool of accepting threads that grows when all are busy, so short connections do not
    // pay a thread creation each.
    let busy = Arc::new(AtomicUsize::new(0));
    let total = Arc::new(AtomicUsize::new(0));
    fn spawn(l: Arc<L>, busy: Arc<AtomicUsize>, total: Arc<AtomicUsize>, cpu: Option<usize>) {
        total.fetch_add(1, Ordering::SeqCst);
        std::thread::spawn(move || {
            pin(cpu);
            loop {
                let c = match &*l {
                    L::Smc(l) => l.accept().map(|(s, _)| {
                        let _ = s.set_nodelay(true);
                        Conn::Smc(s)
                    }),
                    L::Smcr(l) => l.accept().map(|(s, _)| {
                        let _ = s.set_nodelay(true);
                        Conn::Smcr(s)
                    }),
                    L::Tcp(l) => l.accept().map(|(s, _)| {
                        let _ = s.set_nodelay(true);
                        Conn::Tcp(s)
                    }),
                };
                let c = match c {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of descriptors (EMFILE/ENFILE) the listener stays readable:
                        // retrying at once would spin every accepting thread.
                        if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        continue;
                    }
                };
                let now_busy = busy.fetch_add(1, Ordering::SeqCst) + 1;
                if now_busy >= total.load(Ordering::SeqCst) && total.load(Ordering::SeqCst) < 4096 {
                    spawn(Arc::clone(&l), Arc::clone(&busy), Arc::clone(&total), cpu);
                }
                if let Err(e) = serve_conn(c) {
                    report_conn_error(&e);
                }
                busy.fetch_sub(1, Ordering::SeqCst);
            }
        });
    }
    for _ in 0..8 {
        spawn(Arc::clone(&l), Arc::clone(&busy), Arc::clone(&total), cpu);
    }
    loop {
        std::thread::park();
    }
}

// ------------------------------------------------------------------------------------------
// Client.

#[derive(Debug, Serialize)]
struct Report {
    test: Test,
    transport: String,
    mode: String,
    msg_size: usize,
    seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    mbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    msgs_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lat_us_mean: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lat_us_p50: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lat_us_p99: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    conns_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    concurrency: Option<usize>,
    /// With `--count`: the connections that completed, and how many were SMC-D.
    #[serde(skip_serializing_if = "Option::is_none")]
    connections: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    smc_connections: Option<u64>,
    /// With `--count`: SMC streams that fell back to TCP, by mode (with the reason code).
    #[serde(skip_serializing_if = "Option::is_none")]
    fallbacks: Option<std::collections::BTreeMap<String, u64>>,
    /// With `--count`: each connection's connect time (handshake included), microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    connect_us: Option<Vec<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    connect_us_p99: Option<f64>,
    /// crr: every connection of the run, warm-up included, and this process's context
    /// switches over the whole run (voluntary ones are sleeps, so wake-ups).
    #[serde(skip_serializing_if = "Option::is_none")]
    total_connections: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    csw_voluntary: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    csw_involuntary: Option<u64>,
    /// crr with `--time`: each target's share of the loops and its rate in the measured
    /// window (one entry, or one per `--also`).
    #[serde(skip_serializing_if = "Option::is_none")]
    targets: Option<Vec<TargetReport>>,
    /// SMC-R: connections of this process that made a link group (first contacts) and that
    /// joined one, over the whole run.
    #[serde(skip_serializing_if = "Option::is_none")]
    smcr_first_contacts: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    smcr_reused: Option<u64>,
    errors: u64,
}

impl Report {
    fn new(test: Test, c: &Conn, msg_size: usize) -> Self {
        Report {
            test,
            transport: c.transport().into(),
            mode: c.mode(),
            msg_size,
            seconds: 0.0,
            mbps: None,
            msgs_per_s: None,
            lat_us_mean: None,
            lat_us_p50: None,
            lat_us_p99: None,
            conns_per_s: None,
            concurrency: None,
            connections: None,
            smc_connections: None,
            fallbacks: None,
            connect_us: None,
            connect_us_p99: None,
            total_connections: None,
            csw_voluntary: None,
            csw_involuntary: None,
            targets: None,
            smcr_first_contacts: None,
            smcr_reused: None,
            errors: 0,
        }
    }
}

/// The 99th percentile of `v` (nearest rank), `None` when empty.
fn p99(v: &[u64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_unstable();
    let i = (s.len() * 99).div_ceil(100).checked_sub(1)?;
    Some(s[i] as f64)
}

/// What the connection loops of one run saw, merged.
#[derive(Default)]
struct Tally {
    done: u64,
    smc: u64,
    errors: u64,
    connect_us: Vec<u64>,
    fallbacks: std::collections::BTreeMap<String, u64>,
}

impl Tally {
    fn merge(&mut self, o: Tally) {
        self.done += o.done;
        self.smc += o.smc;
        self.errors += o.errors;
        self.connect_us.extend(o.connect_us);
        for (k, v) in o.fallbacks {
            *self.fallbacks.entry(k).or_default() += v;
        }
    }

    /// A connection that opened: its connect time and what it became.
    fn opened(&mut self, c: &Conn, took: Duration) {
        self.connect_us.push(took.as_micros() as u64);
        if c.transport() == "smcd" {
            self.smc += 1;
        }
        if let Some(m) = c.fallback() {
            *self.fallbacks.entry(m).or_default() += 1;
        }
    }

    fn error(&mut self, what: &str, e: &dyn std::fmt::Display) {
        self.errors += 1;
        if self.errors <= 3 {
            eprintln!("smc-perf: {what}: {e}");
        }
    }

    fn into_report(self, test: Test, tcp: bool, msg: usize, secs: f64) -> Report {
        let mut r = Report {
            test,
            transport: if tcp { "tcp".into() } else { "smcd".into() },
            mode: format!("{} of {} connections SMC-D", self.smc, self.done),
            msg_size: msg,
            seconds: secs,
            mbps: None,
            msgs_per_s: None,
            lat_us_mean: None,
            lat_us_p50: None,
            lat_us_p99: None,
            conns_per_s: Some(self.done as f64 / secs.max(1e-9)),
            concurrency: None,
            connections: Some(self.done),
            smc_connections: Some(self.smc),
            fallbacks: Some(self.fallbacks),
            connect_us_p99: p99(&self.connect_us),
            connect_us: Some(self.connect_us),
            total_connections: None,
            csw_voluntary: None,
            csw_involuntary: None,
            targets: None,
            smcr_first_contacts: None,
            smcr_reused: None,
            errors: self.errors,
        };
        if tcp {
            r.smc_connections = None;
        }
        r
    }
}

fn client_bw(
    addr: SocketAddr,
    tcp: bool,
    msg: usize,
    time: Duration,
    warmup: Duration,
) -> anyhow::Result<Report> {
    let mut c = Conn::connect(addr, tcp, false)?;
    write_header(&mut c, Test::Bw, msg)?;
    let mut rep = Report::new(Test::Bw, &c, msg);
    let mut off = 0u64;
    let start = Instant::now();
    let warm_end = start + warmup;
    let mut at_warm: Option<(Instant, u64, u64)> = None;
    let mut msgs = 0u64;
    loop {
        let now_check = msgs.is_multiple_of(64);
        if now_check {
            let now = Instant::now();
            if at_warm.is_none() && now >= warm_end {
                at_warm = Some((now, off, msgs));
            }
            // Measure `time` from when the warm-up was seen to end (the clock is read every
            // 64 messages, which can take longer than a short warm-up when the peer is slow).
            if at_warm.is_some_and(|(t0, _, _)| now >= t0 + time) {
                break;
            }
        }
        c.write_all(expected(off, msg))?;
        off += msg as u64;
        msgs += 1;
    }
    c.flush()?;
    let stop = Instant::now();
    c.shutdown_write()?;
    let mut r = [0u8; 16];
    c.read_exact(&mut r)?;
    let got = u64::from_be_bytes(r[..8].try_into().expect("8"));
    rep.errors = u64::from_be_bytes(r[8..].try_into().expect("8"));
    if got != off {
        rep.errors += 1;
        eprintln!("smc-perf: sent {off} bytes, server received {got}");
    }
    let (t0, off0, msgs0) = at_warm.unwrap_or((start, 0, 0));
    let secs = stop.duration_since(t0).as_secs_f64();
    rep.seconds = secs;
    rep.mbps = Some((off - off0) as f64 / secs / 1e6);
    rep.msgs_per_s = Some((msgs - msgs0) as f64 / secs);
    Ok(rep)
}

fn client_lat(
    addr: SocketAddr,
    tcp: bool,
    msg: usize,
    time: Duration,
    warmup: Duration,
) -> anyhow::Result<Report> {
    let mut c = Conn::connect(addr, tcp, true)?;
    write_header(&mut c, Test::Lat, msg)?;
    let mut rep = Report::new(Test::Lat, &c, msg);
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut buf = vec![0u8; msg];
    let mut off = 0u64;
    let start = Instant::now();
    let warm_end = start + warmup;
    let end = warm_end + time;
    let mut measured_from = None;
    loop {
        let t = Instant::now();
        if t >= end {
            break;
        }
        c.write_all(expected(off, msg))?;
        c.read_exact(&mut buf)?;
        let rtt = t.elapsed();
        rep.errors += check(off, &buf);
        off += msg as u64;
        if t >= warm_end {
            measured_from.get_or_insert(t);
            hist.record((rtt.as_nanos() as u64).max(1))?;
        }
    }
    c.shutdown_write()?;
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    rep.seconds = measured_from.map_or(0.0, |t| t.elapsed().as_secs_f64());
    // One way = round trip / 2, as qperf reports latency.
    rep.lat_us_mean = Some(hist.mean() / 2000.0);
    rep.lat_us_p50 = Some(hist.value_at_quantile(0.5) as f64 / 2000.0);
    rep.lat_us_p99 = Some(hist.value_at_quantile(0.99) as f64 / 2000.0);
    rep.msgs_per_s = Some(hist.len() as f64 / rep.seconds.max(1e-9));
    Ok(rep)
}

/// One target of a crr run, as the report gives it.
#[derive(Debug, Serialize)]
struct TargetReport {
    target: String,
    /// Connection loops driving it.
    concurrency: usize,
    /// Connections finished in the measured window.
    connections: u64,
    conns_per_s: f64,
    /// Of those, over SMC (SMC-D or SMC-R).
    smc_connections: u64,
    /// SMC-R: the link groups its connections used over the whole run (warm-up included);
    /// each group is with one peer, so these are the groups made with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    link_groups: Option<usize>,
    /// How long the slowest of its loops took to connect the first time (handshake and, over
    /// SMC-R, the link group's setup: every loop starts at once and finds no group), ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    first_connect_ms_max: Option<f64>,
    errors: u64,
    /// Loop-seconds inside the measured window spent in exchanges that failed (what the
    /// errors cost the rate: an exchange stuck when the run stopped costs almost nothing).
    error_s_in_window: f64,
}

/// The counters of one crr target, shared by its loops.
#[derive(Default)]
struct TargetCounts {
    done: AtomicU64,
    smc: AtomicU64,
    errors: AtomicU64,
}

fn client_crr(
    targets: &[SocketAddr],
    tcp: bool,
    msg: usize,
    time: Duration,
    warmup: Duration,
    concurrency: usize,
    cpu: Option<usize>,
) -> anyhow::Result<Report> {
    let counts: Arc<Vec<TargetCounts>> =
        Arc::new(targets.iter().map(|_| TargetCounts::default()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    // Loop i drives target i mod n: each target gets its share of the loops, at least one.
    let loops = concurrency.max(targets.len()).max(1);
    let threads: Vec<_> = (0..loops)
        .map(|i| {
            let (counts, stop) = (counts.clone(), stop.clone());
            let (t, addr) = (i % targets.len(), targets[i % targets.len()]);
            std::thread::spawn(move || {
                pin(cpu);
                let mut buf = vec![0u8; msg];
                let mut groups = std::collections::HashSet::new();
                let mut first = None;
                let mut failed = Vec::new();
                let c = &counts[t];
                while !stop.load(Ordering::Relaxed) {
                    let began = Instant::now();
                    match crr_once(addr, tcp, msg, &mut buf) {
                        Ok((conn, took)) => {
                            first.get_or_insert(took);
                            if let Conn::Smcr(s) = &conn
                                && let SmcrMode::SmcR { lgr_id, .. } = s.mode()
                            {
                                groups.insert(lgr_id);
                            }
                            if conn.transport() != "tcp" {
                                c.smc.fetch_add(1, Ordering::Relaxed);
                            }
                            c.done.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            failed.push((began, Instant::now()));
                            let n = c.errors.fetch_add(1, Ordering::Relaxed) + 1;
                            if n <= 3 {
                                eprintln!("smc-perf: crr {addr}: {e}");
                            }
                        }
                    }
                }
                (t, groups, first, failed)
            })
        })
        .collect();
    let snapshot = || -> Vec<(u64, u64)> {
        counts
            .iter()
            .map(|c| {
                (
                    c.done.load(Ordering::Relaxed),
                    c.smc.load(Ordering::Relaxed),
                )
            })
            .collect()
    };
    // The warm-up takes the first connections' one-time costs (link group, buffers) out of
    // the rate; errors count from the start.
    std::thread::sleep(warmup);
    let start = Instant::now();
    let at_start = snapshot();
    std::thread::sleep(time);
    // Each target's rate counts what finished inside the window, so a target whose loops
    // take long to stop (a slow peer) does not lengthen another's window.
    let at_stop = snapshot();
    let stopped = Instant::now();
    let window = stopped.duration_since(start).as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut groups = vec![std::collections::HashSet::new(); targets.len()];
    let mut first: Vec<Option<Duration>> = vec![None; targets.len()];
    // Per target: seconds its loops spent inside the window in exchanges that failed.
    let mut lost = vec![0.0f64; targets.len()];
    for th in threads {
        if let Ok((t, g, f, failed)) = th.join() {
            groups[t].extend(g);
            first[t] = first[t].max(f);
            for (b, e) in failed {
                let (b, e) = (b.max(start), e.min(stopped));
                lost[t] += e.saturating_duration_since(b).as_secs_f64();
            }
        }
    }
    // The totals count after every loop has stopped, so the connections that finished while
    // stopping are in both counts, and time until then.
    let secs = start.elapsed().as_secs_f64();
    let at_end = snapshot();
    let (n, n_smc) = at_end
        .iter()
        .zip(&at_start)
        .fold((0, 0), |(n, s), (e, b)| (n + e.0 - b.0, s + e.1 - b.1));
    let mut r = Tally::default().into_report(Test::Crr, tcp, msg, secs);
    let kind = if SMCR.get().is_some() {
        "SMC-R"
    } else {
        "SMC-D"
    };
    r.mode = format!("{n_smc} of {n} connections {kind}");
    r.conns_per_s = Some(n as f64 / secs);
    r.concurrency = Some(concurrency);
    r.errors = counts
        .iter()
        .map(|c| c.errors.load(Ordering::Relaxed))
        .sum();
    (r.connections, r.smc_connections, r.fallbacks, r.connect_us) = (None, None, None, None);
    let (v, i) = smcd_engine::sys::context_switches();
    r.total_connections = Some(at_end.iter().map(|x| x.0).sum());
    (r.csw_voluntary, r.csw_involuntary) = (Some(v), Some(i));
    r.targets = Some(
        targets
            .iter()
            .enumerate()
            .map(|(t, a)| {
                let done = at_stop[t].0 - at_start[t].0;
                TargetReport {
                    target: a.to_string(),
                    concurrency: (0..loops).filter(|i| i % targets.len() == t).count(),
                    connections: done,
                    conns_per_s: done as f64 / window,
                    smc_connections: at_stop[t].1 - at_start[t].1,
                    link_groups: SMCR.get().map(|_| groups[t].len()),
                    first_connect_ms_max: first[t].map(|d| d.as_secs_f64() * 1e3),
                    error_s_in_window: lost[t],
                    errors: counts[t].errors.load(Ordering::Relaxed),
                }
            })
            .collect(),
    );
    if let Some(ep) = SMCR.get() {
        let s = ep.stats();
        r.smcr_first_contacts = Some(s.first_contacts.load(Ordering::Relaxed));
        r.smcr_reused = Some(s.reused.load(Ordering::Relaxed));
    }
    Ok(r)
}

/// With `--setup-lock`: the lock every crr connect holds (see [`Cmd::Client`]).
static SETUP_LOCK: OnceLock<std::sync::Mutex<()>> = OnceLock::new();

/// One crr exchange: connect, request, response, the server's close. Returns the connection
/// (closed by the peer) and how long the connect took.
fn crr_once(
    addr: SocketAddr,
    tcp: bool,
    msg: usize,
    buf: &mut [u8],
) -> io::Result<(Conn, Duration)> {
    let t0 = Instant::now();
    let serial = SETUP_LOCK
        .get()
        .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()));
    let mut c = Conn::connect(addr, tcp, true)?;
    drop(serial);
    let took = t0.elapsed();
    write_header(&mut c, Test::Crr, msg)?;
    c.write_all(expected(0, msg))?;
    c.read_exact(buf)?;
    if check(0, buf) != 0 {
        return Err(io::Error::other("bad response"));
    }
    // Wait for the server's close before closing (it closes first).
    let mut end = [0u8; 1];
    if c.read(&mut end)? != 0 {
        return Err(io::Error::other("data after the response"));
    }
    Ok((c, took))
}

/// crr with `--count`: exactly `count` connections over the loops, then the report with each
/// connection's connect time.
fn client_crr_count(
    addr: SocketAddr,
    tcp: bool,
    msg: usize,
    count: u64,
    concurrency: usize,
    cpu: Option<usize>,
) -> anyhow::Result<Report> {
    let tickets = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..concurrency.clamp(1, count.max(1) as usize))
        .map(|_| {
            let tickets = tickets.clone();
            std::thread::spawn(move || {
                pin(cpu);
                let mut t = Tally::default();
                let mut buf = vec![0u8; msg];
                while tickets.fetch_add(1, Ordering::Relaxed) < count {
                    match crr_once(addr, tcp, msg, &mut buf) {
                        Ok((c, took)) => {
                            t.done += 1;
                            t.opened(&c, took);
                        }
                        Err(e) => t.error("crr", &e),
                    }
                }
                t
            })
        })
        .collect();
    let mut all = Tally::default();
    for th in threads {
        all.merge(th.join().unwrap_or_default());
    }
    let mut r = all.into_report(Test::Crr, tcp, msg, start.elapsed().as_secs_f64());
    r.concurrency = Some(concurrency);
    Ok(r)
}

/// idle: `count` connections checked with one echo each, held silent for `hold`, checked with
/// a second echo, closed.
fn client_idle(
    addr: SocketAddr,
    tcp: bool,
    msg: usize,
    hold: Duration,
    count: u64,
    concurrency: usize,
) -> anyhow::Result<Report> {
    let tickets = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let open = move |c: &mut Conn| -> io::Result<()> {
        write_header(c, Test::Idle, msg)?;
        echo_check(c, 0, msg)
    };
    let threads: Vec<_> = (0..concurrency.clamp(1, count.max(1) as usize))
        .map(|_| {
            let tickets = tickets.clone();
            std::thread::spawn(move || {
                let mut t = Tally::default();
                let mut held = Vec::new();
                while tickets.fetch_add(1, Ordering::Relaxed) < count {
                    let t0 = Instant::now();
                    match Conn::connect(addr, tcp, true) {
                        Ok(mut c) => {
                            let took = t0.elapsed();
                            match open(&mut c) {
                                Ok(()) => {
                                    t.opened(&c, took);
                                    held.push(c);
                                }
                                Err(e) => t.error("idle: first echo", &e),
                            }
                        }
                        Err(e) => t.error("idle: connect", &e),
                    }
                }
                (t, held)
            })
        })
        .collect();
    let mut all = Tally::default();
    let mut held = Vec::new();
    for th in threads {
        let (t, h) = th.join().unwrap_or_default();
        all.merge(t);
        held.extend(h);
    }
    eprintln!("smc-perf: idle: {} connections open", held.len());
    std::thread::sleep(hold);
    for mut c in held {
        match echo_check(&mut c, msg as u64, msg) {
            Ok(()) => all.done += 1,
            Err(e) => all.error("idle: echo after holding", &e),
        }
    }
    let mut r = all.into_report(Test::Idle, tcp, msg, start.elapsed().as_secs_f64());
    r.concurrency = Some(concurrency);
    Ok(r)
}

/// Writes `msg` bytes of the pattern at `off` and checks the echo.
fn echo_check(c: &mut Conn, off: u64, msg: usize) -> io::Result<()> {
    c.write_all(expected(off, msg))?;
    c.flush()?;
    let mut buf = vec![0u8; msg];
    c.read_exact(&mut buf)?;
    if check(off, &buf) != 0 {
        return Err(io::Error::other("bad echo"));
    }
    Ok(())
}

/// What the drip-feeding attackers saw.
#[derive(Debug, Default, Serialize)]
struct DripReport {
    test: &'static str,
    /// Connections the attackers opened (each announced through smcd first).
    attempts: u64,
    /// Closed by the listener mid-Proposal.
    closed: u64,
    /// Of those, closed before `CLC_WAIT_TIME` had passed (the deadline fired early).
    closed_early: u64,
    /// Shortest and longest life of a closed one, seconds.
    closed_s_min: Option<f64>,
    closed_s_max: Option<f64>,
    /// Whole Proposals dripped in without the listener closing the connection.
    never_closed: u64,
    /// Announcements smcd did not answer with SMC (no SMC listener there).
    not_smc: u64,
    /// Sockets or announcements that failed.
    errors: u64,
    clc_wait_time_s: f64,
}

/// The attacker of `smc-perf drip` (see the module doc); as `smc-tools/tests/handshake_abuse.rs`
/// does it, with reconnects, for `time`.
fn drip(to: SocketAddr, attackers: usize, time: Duration) -> anyhow::Result<DripReport> {
    use rustix::event::{PollFd, PollFlags};
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    use smcd_engine::driver::handshake::CLC_WAIT_TIME;
    let socket = smcd_engine::EngineConfig::default().socket;
    let dev = Arc::new(
        smcd_engine::ipc::SmcdSession::open(&socket)
            .with_context(|| format!("cannot register with smcd at {}", socket.display()))?,
    );
    let p = smc_proto::clc::ProposalBuilder::smcd_v2_loopback(0x1234, 0x5678)
        .system_eid(smc_proto::clc::Eid::new("DRIP").context("EID")?)
        .build()
        .map_err(|e| anyhow::anyhow!("proposal: {e:?}"))?;
    let proposal = Arc::new(smc_proto::clc::ClcMessage::Proposal(p).to_vec());
    // The whole Proposal would take five CLC_WAIT_TIMEs; each byte comes after a fraction of
    // one, so a timeout that restarted on every byte would never fire.
    let gap = CLC_WAIT_TIME * 5 / proposal.len() as u32;
    let end = Instant::now() + time;
    // A harness stops the attack early by closing stdin; each loop notices between bytes.
    let stopped = Arc::new(AtomicBool::new(false));
    {
        let stopped = stopped.clone();
        std::thread::spawn(move || {
            let _ = io::copy(&mut io::stdin(), &mut io::sink());
            stopped.store(true, Ordering::Relaxed);
        });
    }
    let over = move || stopped.load(Ordering::Relaxed) || Instant::now() >= end;
    let one = {
        let over = over.clone();
        let (dev, proposal) = (dev.clone(), proposal.clone());
        move |r: &mut DripReport| -> io::Result<()> {
            let s = rustix::net::socket_with(
                AddressFamily::INET,
                SocketType::STREAM,
                SocketFlags::CLOEXEC,
                None,
            )?;
            let any = SocketAddr::new(
                if to.is_ipv4() {
                    std::net::Ipv4Addr::LOCALHOST.into()
                } else {
                    std::net::Ipv6Addr::LOCALHOST.into()
                },
                0,
            );
            rustix::net::bind(&s, &any)?;
            let local = rustix::net::getsockname(&s)?;
            let local = SocketAddr::try_from(local).map_err(|_| io::Error::other("not inet"))?;
            let v = dev.connect_intent(local, to)?;
            if !v.smc {
                r.not_smc += 1;
                std::thread::sleep(Duration::from_millis(500));
                return Ok(());
            }
            let start = Instant::now();
            let c = rustix::net::connect(&s, &to);
            dev.intent_done(v.intent, c.is_ok());
            c?;
            r.attempts += 1;
            let mut s = TcpStream::from(s);
            let closed = |r: &mut DripReport, at: Duration| {
                r.closed += 1;
                let at = at.as_secs_f64();
                r.closed_early += u64::from(at < CLC_WAIT_TIME.as_secs_f64());
                r.closed_s_min = Some(r.closed_s_min.map_or(at, |m| m.min(at)));
                r.closed_s_max = Some(r.closed_s_max.map_or(at, |m| m.max(at)));
            };
            for &b in proposal.iter() {
                if over() {
                    return Ok(());
                }
                if s.write_all(&[b]).is_err() {
                    closed(r, start.elapsed());
                    return Ok(());
                }
                let t = rustix::time::Timespec {
                    tv_sec: gap.as_secs() as i64,
                    tv_nsec: i64::from(gap.subsec_nanos()),
                };
                let mut fds = [PollFd::new(&s, PollFlags::IN)];
                if rustix::event::poll(&mut fds, Some(&t)).unwrap_or(0) > 0 {
                    // The listener closed (EOF or reset); what came before is read away.
                    let mut buf = [0u8; 256];
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(_) => {}
                        }
                    }
                    closed(r, start.elapsed());
                    return Ok(());
                }
            }
            r.never_closed += 1;
            Ok(())
        }
    };
    let threads: Vec<_> = (0..attackers.max(1))
        .map(|_| {
            let (one, over) = (one.clone(), over.clone());
            std::thread::spawn(move || {
                let mut r = DripReport::default();
                while !over() {
                    if let Err(e) = one(&mut r) {
                        r.errors += 1;
                        if r.errors <= 3 {
                            eprintln!("smc-perf: drip: {e}");
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
                r
            })
        })
        .collect();
    let mut all = DripReport {
        test: "drip",
        clc_wait_time_s: CLC_WAIT_TIME.as_secs_f64(),
        ..DripReport::default()
    };
    for t in threads {
        let r = t.join().unwrap_or_default();
        all.attempts += r.attempts;
        all.closed += r.closed;
        all.closed_early += r.closed_early;
        all.never_closed += r.never_closed;
        all.not_smc += r.not_smc;
        all.errors += r.errors;
        if let Some(x) = r.closed_s_min {
            all.closed_s_min = Some(all.closed_s_min.map_or(x, |m| m.min(x)));
        }
        if let Some(x) = r.closed_s_max {
            all.closed_s_max = Some(all.closed_s_max.map_or(x, |m| m.max(x)));
        }
    }
    Ok(all)
}

fn main() -> anyhow::Result<()> {
    // The engine's warnings (a failed SMC-R link, a peer's protocol violation) on stderr;
    // RUST_LOG changes the level.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    // The byte pattern (16 MiB) is made now, before a server says it serves and before a
    // client's clock starts: made by the first exchange, it took a debug build beside two
    // busy loops 0.5-0.7 s, inside the warm-up and the window of a short crr run.
    let _ = pattern();
    // crr at high concurrency needs many descriptors.
    if let Ok(lim) = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .ok_or(())
    {
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(lim),
                maximum: Some(lim),
            },
        );
    }
    match Args::parse().cmd {
        Cmd::Server {
            port,
            bind,
            tcp,
            pin: cpu,
            limit_hs,
            no_stats,
            events,
            smcr,
            smcr_set,
        } => {
            smcd_engine::layout::status::set_counting(!no_stats);
            if let Some(a) = smcr {
                open_smcr(a, &smcr_set)?;
            }
            server(port, &bind, tcp, cpu, limit_hs, events)
        }
        Cmd::Client {
            target,
            test,
            msg_size,
            time,
            warmup,
            tcp,
            concurrency,
            count,
            pin: cpu,
            no_stats,
            events,
            threads,
            smcr,
            smcr_set,
            also,
            setup_lock,
        } => {
            if setup_lock {
                let _ = SETUP_LOCK.set(std::sync::Mutex::new(()));
            }
            smcd_engine::layout::status::set_counting(!no_stats);
            if let Some(a) = smcr {
                if events {
                    bail!("--events does not run over SMC-R");
                }
                open_smcr(a, &smcr_set)?;
            }
            if msg_size == 0 || msg_size > MAX_MSG {
                bail!("--msg-size must be 1..={MAX_MSG}");
            }
            let resolve = |t: &String| -> anyhow::Result<SocketAddr> {
                t.to_socket_addrs()?
                    .next()
                    .with_context(|| format!("cannot resolve {t}"))
            };
            let addr = resolve(&target)?;
            let mut targets = vec![addr];
            for t in &also {
                targets.push(resolve(t)?);
            }
            if !also.is_empty() && (test != Test::Crr || count.is_some() || events) {
                bail!("--also: crr with threads and --time only");
            }
            pin(cpu);
            let time = Duration::from_secs_f64(time);
            let warmup = Duration::from_secs_f64(warmup);
            let rep = match test {
                Test::Bw => client_bw(addr, tcp, msg_size, time, warmup)?,
                Test::Lat => client_lat(addr, tcp, msg_size, time, warmup)?,
                Test::Crr => match count {
                    None if events => events::client_crr(
                        addr,
                        tcp,
                        msg_size,
                        time,
                        warmup,
                        concurrency,
                        threads,
                        cpu,
                    )?,
                    Some(n) => client_crr_count(addr, tcp, msg_size, n, concurrency, cpu)?,
                    None => client_crr(&targets, tcp, msg_size, time, warmup, concurrency, cpu)?,
                },
                Test::Idle => {
                    client_idle(addr, tcp, msg_size, time, count.unwrap_or(1), concurrency)?
                }
            };
            println!("{}", serde_json::to_string(&rep)?);
            if rep.errors > 0 {
                std::process::exit(1);
            }
            Ok(())
        }
        Cmd::Drip {
            target,
            attackers,
            time,
        } => {
            let addr = target
                .to_socket_addrs()?
                .next()
                .with_context(|| format!("cannot resolve {target}"))?;
            let rep = drip(addr, attackers, Duration::from_secs_f64(time))?;
            println!("{}", serde_json::to_string(&rep)?);
            Ok(())
        }
    }
}
