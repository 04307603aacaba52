//! `smc-perf`: a qperf/sockperf-like load generator for SMC and TCP.
//!
//! ```text
//! smc-perf server [--port P] [--bind ADDR] [--tcp] [--pin CPU] [--limit-hs BOOL] [--no-stats]
//! smc-perf client HOST:PORT --test bw|lat|crr --msg-size N --time SECONDS [--tcp]
//!                 [--concurrency C] [--pin CPU] [--warmup SECONDS] [--no-stats]
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
//!   the client's ephemeral ports are free again at once.
//!
//! The server prints `smc-perf: serving smc|tcp on ADDR:PORT` on stderr once it listens, with
//! the port actually bound, so `--port 0` picks a free one and a harness learns which.

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use serde::Serialize;
use smcd_engine::{Mode, SmcListener, SmcStream};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

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
        /// Parallel connection loops (crr).
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// Pin the client's threads to this CPU.
        #[arg(long)]
        pin: Option<usize>,
        /// Do not count in the data path (to measure what counting costs; the server needs
        /// it too).
        #[arg(long)]
        no_stats: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Test {
    Bw,
    Lat,
    Crr,
}

impl Test {
    fn code(self) -> u8 {
        match self {
            Test::Bw => 1,
            Test::Lat => 2,
            Test::Crr => 3,
        }
    }
    fn from_code(c: u8) -> Option<Test> {
        match c {
            1 => Some(Test::Bw),
            2 => Some(Test::Lat),
            3 => Some(Test::Crr),
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
    Tcp(TcpStream),
}

impl Conn {
    /// Connects; `nodelay` as the test wants it (qperf's `tcp_bw` leaves Nagle on, the
    /// ping-pong tests turn it off).
    fn connect(addr: SocketAddr, tcp: bool, nodelay: bool) -> io::Result<Conn> {
        if tcp {
            let s = TcpStream::connect(addr)?;
            s.set_nodelay(nodelay)?;
            Ok(Conn::Tcp(s))
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
            _ => "tcp",
        }
    }
    fn mode(&self) -> String {
        match self {
            Conn::Smc(s) => match s.mode() {
                Mode::SmcD(_) => "smcd".into(),
                Mode::Tcp(fb) => format!("tcp-fallback {:#010x}", fb.local.0),
            },
            Conn::Tcp(_) => "tcp".into(),
        }
    }
    fn shutdown_write(&self) -> io::Result<()> {
        match self {
            Conn::Smc(s) => s.shutdown(Shutdown::Write),
            Conn::Tcp(s) => s.shutdown(Shutdown::Write),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Smc(s) => s.read(b),
            Conn::Tcp(s) => s.read(b),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Smc(s) => s.write(b),
            Conn::Tcp(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Smc(s) => s.flush(),
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
    let test = Test::from_code(h[0]).context("unknown test code")?;
    let msg = u64::from_be_bytes(h[1..].try_into().expect("8 bytes")) as usize;
    if msg == 0 || msg > MAX_MSG {
        bail!("message size {msg} out of range");
    }
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
    }
    Ok(())
}

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
) -> anyhow::Result<()> {
    pin(cpu);
    let addr: SocketAddr = format!("{bind}:{port}")
        .parse()
        .context("bad bind address")?;
    enum L {
        Smc(SmcListener),
        Tcp(TcpListener),
    }
    let l = Arc::new(if tcp {
        L::Tcp(tcp_listener(addr, BACKLOG)?)
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
        L::Tcp(l) => l.local_addr()?,
    };
    eprintln!(
        "smc-perf: serving {} on {bound}",
        if tcp { "tcp" } else { "smc" }
    );
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
                    L::Tcp(l) => l.accept().map(|(s, _)| {
                        let _ = s.set_nodelay(true);
                        Conn::Tcp(s)
                    }),
                };
                let Ok(c) = c else { continue };
                let now_busy = busy.fetch_add(1, Ordering::SeqCst) + 1;
                if now_busy >= total.load(Ordering::SeqCst) && total.load(Ordering::SeqCst) < 4096 {
                    spawn(Arc::clone(&l), Arc::clone(&busy), Arc::clone(&total), cpu);
                }
                if let Err(e) = serve_conn(c)
                    && !matches!(
                        e.downcast_ref::<io::Error>().map(io::Error::kind),
                        Some(
                            io::ErrorKind::UnexpectedEof
                                | io::ErrorKind::ConnectionReset
                                | io::ErrorKind::BrokenPipe
                        )
                    )
                {
                    eprintln!("smc-perf: connection: {e:#}");
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
            errors: 0,
        }
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

fn client_crr(
    addr: SocketAddr,
    tcp: bool,
    msg: usize,
    time: Duration,
    warmup: Duration,
    concurrency: usize,
    cpu: Option<usize>,
) -> anyhow::Result<Report> {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let smc = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (done, errors, smc, stop) =
                (done.clone(), errors.clone(), smc.clone(), stop.clone());
            std::thread::spawn(move || {
                pin(cpu);
                let mut buf = vec![0u8; msg];
                while !stop.load(Ordering::Relaxed) {
                    let r = (|| -> io::Result<bool> {
                        let mut c = Conn::connect(addr, tcp, true)?;
                        let is_smc = c.transport() == "smcd";
                        write_header(&mut c, Test::Crr, msg)?;
                        c.write_all(expected(0, msg))?;
                        c.read_exact(&mut buf)?;
                        if check(0, &buf) != 0 {
                            return Err(io::Error::other("bad response"));
                        }
                        // Wait for the server's close before closing (it closes first).
                        let mut end = [0u8; 1];
                        if c.read(&mut end)? != 0 {
                            return Err(io::Error::other("data after the response"));
                        }
                        Ok(is_smc)
                    })();
                    match r {
                        Ok(is_smc) => {
                            done.fetch_add(1, Ordering::Relaxed);
                            if is_smc {
                                smc.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(e) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            if errors.load(Ordering::Relaxed) <= 3 {
                                eprintln!("smc-perf: crr: {e}");
                            }
                        }
                    }
                }
            })
        })
        .collect();
    // The warm-up takes the first connections' one-time costs (link group, buffers) out of
    // the rate; errors count from the start.
    std::thread::sleep(warmup);
    let start = Instant::now();
    let (n0, smc0) = (done.load(Ordering::Relaxed), smc.load(Ordering::Relaxed));
    std::thread::sleep(time);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    // Read the counters after every loop has stopped, so the connections that finished while
    // stopping are in both counts, and time until then.
    let secs = start.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed) - n0;
    let n_smc = smc.load(Ordering::Relaxed) - smc0;
    Ok(Report {
        test: Test::Crr,
        transport: if tcp { "tcp".into() } else { "smcd".into() },
        mode: format!("{n_smc} of {n} connections SMC-D"),
        msg_size: msg,
        seconds: secs,
        mbps: None,
        msgs_per_s: None,
        lat_us_mean: None,
        lat_us_p50: None,
        lat_us_p99: None,
        conns_per_s: Some(n as f64 / secs),
        concurrency: Some(concurrency),
        errors: errors.load(Ordering::Relaxed),
    })
}

fn main() -> anyhow::Result<()> {
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
        } => {
            smcd_engine::layout::status::set_counting(!no_stats);
            server(port, &bind, tcp, cpu, limit_hs)
        }
        Cmd::Client {
            target,
            test,
            msg_size,
            time,
            warmup,
            tcp,
            concurrency,
            pin: cpu,
            no_stats,
        } => {
            smcd_engine::layout::status::set_counting(!no_stats);
            if msg_size == 0 || msg_size > MAX_MSG {
                bail!("--msg-size must be 1..={MAX_MSG}");
            }
            let addr = target
                .to_socket_addrs()?
                .next()
                .with_context(|| format!("cannot resolve {target}"))?;
            pin(cpu);
            let time = Duration::from_secs_f64(time);
            let warmup = Duration::from_secs_f64(warmup);
            let rep = match test {
                Test::Bw => client_bw(addr, tcp, msg_size, time, warmup)?,
                Test::Lat => client_lat(addr, tcp, msg_size, time, warmup)?,
                Test::Crr => client_crr(addr, tcp, msg_size, time, warmup, concurrency, cpu)?,
            };
            println!("{}", serde_json::to_string(&rep)?);
            if rep.errors > 0 {
                std::process::exit(1);
            }
            Ok(())
        }
    }
}
