//! crr the way the kernel team measured short-lived connections (`wrk -c N` against nginx):
//! a few event loops, each driving many connections, instead of a thread per connection.
//!
//! * Client ([`client_crr`]): `--threads` loops (one by default), each keeping its share of
//!   `--concurrency` connections in flight: a non-blocking connect (for SMC
//!   [`SmcStream::connect_nonblocking_with`], which also runs the CLC handshake without
//!   waiting), the request, the response, the server's close, and a new connect at once.
//! * Server ([`serve`]): one loop accepts from the non-blocking listener, reads each
//!   connection's test header and serves crr in the loop; a connection of another test is handed
//!   to a thread of its own, as the threaded server would run it.
//!
//! Both sides wait in level-triggered epoll on the descriptor a TCP program would use (for an
//! SMC stream its readiness descriptor), so SMC and TCP run the same loop.

use super::{Conn, Listen, MAX_MSG, Report, Tally, Test, check, expected, pin};
use rustix::event::epoll;
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use smcd_engine::{Engine, SmcConnecting, SmcStream};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A connection that has not answered within this long is an error (a lost wake-up would
/// otherwise stall its slot, and the run, silently).
const STUCK: Duration = Duration::from_secs(10);

/// How long an out-of-descriptors error keeps a loop from trying again.
const BACK_OFF: Duration = Duration::from_millis(10);

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

fn interest(read: bool) -> epoll::EventFlags {
    if read {
        epoll::EventFlags::IN
    } else {
        epoll::EventFlags::OUT
    }
}

// ------------------------------------------------------------------------------------------
// Client.

/// Where one of a loop's connection slots is.
enum Phase {
    /// Waiting to connect again (after an out-of-descriptors error).
    Idle { until: Instant },
    /// An SMC connect (TCP connect, then the CLC handshake).
    SmcConnecting(SmcConnecting),
    /// A TCP connect in progress.
    TcpConnecting(TcpStream),
    /// Connected: the request goes out, the response and the server's close come in.
    Talking { c: Conn, sent: usize, got: usize },
}

struct Slot {
    phase: Phase,
    /// The descriptor registered for this slot and for what, if any.
    fd: Option<(i32, epoll::EventFlags)>,
    since: Instant,
}

/// What the loops of one run share.
#[derive(Default)]
struct Counters {
    /// Finished connections (low 32 bits) and how many of them were SMC-D (high 32 bits), in
    /// one word so that a look at both is of the same connections.
    done: AtomicU64,
    errors: AtomicU64,
    stop: AtomicBool,
}

impl Counters {
    fn error(&self, what: &str, e: &dyn std::fmt::Display) {
        if self.errors.fetch_add(1, Ordering::Relaxed) < 3 {
            eprintln!("smc-perf: crr: {what}: {e}");
        }
    }
}

struct ClientLoop {
    ep: OwnedFd,
    engine: Arc<Engine>,
    addr: SocketAddr,
    tcp: bool,
    /// Header and request, as one write.
    request: Vec<u8>,
    msg: usize,
    slots: Vec<Slot>,
    buf: Vec<u8>,
    n: Arc<Counters>,
}

impl ClientLoop {
    fn register(
        &mut self,
        i: usize,
        fd: BorrowedFd<'_>,
        flags: epoll::EventFlags,
    ) -> io::Result<()> {
        let raw = fd.as_raw_fd();
        match self.slots[i].fd {
            // Registered as wanted already: no system call (a wait per message).
            Some((old, had)) if old == raw && had == flags => return Ok(()),
            Some((old, _)) if old == raw => {
                epoll::modify(&self.ep, fd, epoll::EventData::new_u64(i as u64), flags)?
            }
            Some((old, _)) => {
                // SAFETY: `old` is registered and still open: its owner is dropped only
                // after `deregister`.
                let _ = epoll::delete(&self.ep, unsafe { BorrowedFd::borrow_raw(old) });
                epoll::add(&self.ep, fd, epoll::EventData::new_u64(i as u64), flags)?;
            }
            None => epoll::add(&self.ep, fd, epoll::EventData::new_u64(i as u64), flags)?,
        }
        self.slots[i].fd = Some((raw, flags));
        Ok(())
    }

    /// Takes the slot's descriptor out of the set (before its owner is dropped).
    fn deregister(&mut self, i: usize) {
        if let Some((old, _)) = self.slots[i].fd.take() {
            // SAFETY: as in `register`: the owner is still in the slot.
            let _ = epoll::delete(&self.ep, unsafe { BorrowedFd::borrow_raw(old) });
        }
    }

    /// Ends what the slot holds and starts a new connection in it.
    fn restart(&mut self, i: usize) {
        self.deregister(i);
        let now = Instant::now();
        self.slots[i].phase = Phase::Idle { until: now };
        if self.n.stop.load(Ordering::Relaxed) {
            return;
        }
        self.slots[i].since = now;
        let r = if self.tcp {
            self.start_tcp(i)
        } else {
            self.start_smc(i)
        };
        if let Err(e) = r {
            self.deregister(i);
            self.slots[i].phase = Phase::Idle {
                until: Instant::now() + BACK_OFF,
            };
            self.n.error("connect", &e);
        }
    }

    fn start_smc(&mut self, i: usize) -> io::Result<()> {
        let mut c = SmcStream::connect_nonblocking_with(&self.engine, self.addr)?;
        if let Some(s) = c.try_finish_nonblocking()? {
            return self.connected(i, Conn::Smc(s));
        }
        self.register(i, c.as_fd(), interest(c.wants_read()))?;
        self.slots[i].phase = Phase::SmcConnecting(c);
        Ok(())
    }

    fn start_tcp(&mut self, i: usize) -> io::Result<()> {
        use rustix::net::{AddressFamily, SocketFlags, SocketType};
        let fam = if self.addr.is_ipv4() {
            AddressFamily::INET
        } else {
            AddressFamily::INET6
        };
        let sock = rustix::net::socket_with(
            fam,
            SocketType::STREAM,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )?;
        rustix::net::sockopt::set_tcp_nodelay(&sock, true)?;
        match rustix::net::connect(&sock, &self.addr) {
            Ok(()) => self.connected(i, Conn::Tcp(TcpStream::from(sock))),
            Err(rustix::io::Errno::INPROGRESS) => {
                self.register(i, sock.as_fd(), epoll::EventFlags::OUT)?;
                self.slots[i].phase = Phase::TcpConnecting(TcpStream::from(sock));
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The connect finished: send the request and wait for the answer.
    fn connected(&mut self, i: usize, c: Conn) -> io::Result<()> {
        if let Conn::Smc(s) = &c {
            s.set_nodelay(true)?;
        }
        // The descriptor first, as an event loop registers a socket before it reads: a
        // read that finds nothing then only announces the wait.
        c.readiness_fd()?;
        self.slots[i].since = Instant::now();
        self.slots[i].phase = Phase::Talking { c, sent: 0, got: 0 };
        self.talk(i)
    }

    /// Moves a connected slot on: `Ok` whether or not it finished.
    fn talk(&mut self, i: usize) -> io::Result<()> {
        let idle = Phase::Idle {
            until: Instant::now(),
        };
        let Phase::Talking {
            mut c,
            mut sent,
            mut got,
        } = std::mem::replace(&mut self.slots[i].phase, idle)
        else {
            return Ok(());
        };
        match exchange(
            &self.request,
            &mut self.buf,
            self.msg,
            &mut c,
            &mut sent,
            &mut got,
        ) {
            Ok(true) => {
                self.deregister(i);
                let smc = u64::from(c.transport() == "smcd");
                drop(c);
                self.n.done.fetch_add(1 | smc << 32, Ordering::Relaxed);
                self.restart(i);
                Ok(())
            }
            Ok(false) => {
                let flags = if sent < self.request.len() {
                    epoll::EventFlags::IN | epoll::EventFlags::OUT
                } else {
                    epoll::EventFlags::IN
                };
                let r = c.readiness_fd().map(|fd| fd.as_raw_fd()).and_then(|raw| {
                    // SAFETY: `c` owns the descriptor and goes into the slot below; it is
                    // taken out of the set before the slot lets go of it.
                    self.register(i, unsafe { BorrowedFd::borrow_raw(raw) }, flags)
                });
                self.slots[i].phase = Phase::Talking { c, sent, got };
                r
            }
            Err(e) => {
                self.deregister(i);
                drop(c);
                Err(e)
            }
        }
    }

    /// A registered descriptor of slot `i` is ready.
    fn ready(&mut self, i: usize) {
        let r = match std::mem::replace(
            &mut self.slots[i].phase,
            Phase::Idle {
                until: Instant::now(),
            },
        ) {
            Phase::SmcConnecting(mut c) => match c.try_finish_nonblocking() {
                Ok(Some(s)) => {
                    // The connect's socket is the stream's now; the loop waits on the stream's
                    // readiness descriptor instead.
                    self.deregister(i);
                    drop(c);
                    self.connected(i, Conn::Smc(s))
                }
                Ok(None) => {
                    let r = self.register(i, c.as_fd(), interest(c.wants_read()));
                    self.slots[i].phase = Phase::SmcConnecting(c);
                    r
                }
                Err(e) => {
                    // The failed connect closed its socket, which left the set with it.
                    self.deregister(i);
                    drop(c);
                    Err(e)
                }
            },
            Phase::TcpConnecting(s) => match s.take_error() {
                Ok(None) => self.connected(i, Conn::Tcp(s)),
                Ok(Some(e)) | Err(e) => {
                    self.deregister(i);
                    drop(s);
                    Err(e)
                }
            },
            p @ Phase::Talking { .. } => {
                self.slots[i].phase = p;
                self.talk(i)
            }
            p @ Phase::Idle { .. } => {
                self.slots[i].phase = p;
                Ok(())
            }
        };
        if let Err(e) = r {
            self.n.error("connection", &e);
            self.restart(i);
        }
    }

    /// Handshake deadlines, stuck connections and slots waiting to connect again.
    fn timers(&mut self) {
        let now = Instant::now();
        for i in 0..self.slots.len() {
            let s = &mut self.slots[i];
            match &mut s.phase {
                Phase::Idle { until } if *until <= now => self.restart(i),
                Phase::SmcConnecting(c) if c.deadline().is_some_and(|d| d <= now) => self.ready(i),
                Phase::Idle { .. } => {}
                _ if now.duration_since(s.since) > STUCK => {
                    self.n.error("connection", &"no progress for 10 s");
                    self.restart(i);
                }
                _ => {}
            }
        }
    }

    fn busy(&self) -> bool {
        self.slots
            .iter()
            .any(|s| !matches!(s.phase, Phase::Idle { .. }))
    }

    fn run(mut self) {
        for i in 0..self.slots.len() {
            self.restart(i);
        }
        let mut events = Vec::with_capacity(1024);
        let mut last_timers = Instant::now();
        let mut stop_at = None;
        loop {
            if self.n.stop.load(Ordering::Relaxed) {
                let at = *stop_at.get_or_insert_with(Instant::now);
                // Connections in flight finish (and count); a stuck one gives up with the run.
                if !self.busy() || at.elapsed() > STUCK {
                    return;
                }
            }
            events.clear();
            let timeout = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 20_000_000,
            };
            match epoll::wait(
                &self.ep,
                rustix::buffer::spare_capacity(&mut events),
                Some(&timeout),
            ) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    self.n.error("epoll_wait", &e);
                    return;
                }
            }
            for ev in events.iter() {
                self.ready(ev.data.u64() as usize);
            }
            if last_timers.elapsed() >= Duration::from_millis(20) {
                last_timers = Instant::now();
                self.timers();
            }
        }
    }
}

/// Writes what is left of the request, reads what has come of the response: `Ok(true)` once
/// the response was checked and the server closed.
fn exchange(
    request: &[u8],
    buf: &mut [u8],
    msg: usize,
    c: &mut Conn,
    sent: &mut usize,
    got: &mut usize,
) -> io::Result<bool> {
    while *sent < request.len() {
        match c.write(&request[*sent..]) {
            Ok(n) => *sent += n,
            Err(e) if would_block(&e) => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    loop {
        // One byte more than the response: the server's close must come next, nothing else.
        match c.read(&mut buf[*got..=msg]) {
            Ok(0) if *got == msg => return Ok(true),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) if *got + n > msg => return Err(io::Error::other("data after the response")),
            Ok(n) => {
                *got += n;
                if *got == msg && check(0, &buf[..msg]) != 0 {
                    return Err(io::Error::other("bad response"));
                }
            }
            Err(e) if would_block(&e) => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// crr over `threads` event loops: the report of the threaded client, from the same counters.
#[allow(clippy::too_many_arguments)]
pub fn client_crr(
    addr: SocketAddr,
    tcp: bool,
    msg: usize,
    time: Duration,
    warmup: Duration,
    concurrency: usize,
    threads: usize,
    cpu: Option<usize>,
) -> anyhow::Result<Report> {
    let n = Arc::new(Counters::default());
    let concurrency = concurrency.max(1);
    let threads = threads.clamp(1, concurrency);
    let engine = Arc::clone(Engine::global());
    let mut request = Vec::with_capacity(9 + msg);
    request.push(Test::Crr.code());
    request.extend_from_slice(&(msg as u64).to_be_bytes());
    request.extend_from_slice(expected(0, msg));
    let mut loops = Vec::new();
    for t in 0..threads {
        let share = concurrency / threads + usize::from(t < concurrency % threads);
        let now = Instant::now();
        let l = ClientLoop {
            ep: epoll::create(epoll::CreateFlags::CLOEXEC)?,
            engine: Arc::clone(&engine),
            addr,
            tcp,
            request: request.clone(),
            msg,
            slots: (0..share)
                .map(|_| Slot {
                    phase: Phase::Idle { until: now },
                    fd: None,
                    since: now,
                })
                .collect(),
            buf: vec![0u8; msg + 1],
            n: Arc::clone(&n),
        };
        loops.push(std::thread::spawn(move || {
            pin(cpu);
            l.run()
        }));
    }
    std::thread::sleep(warmup);
    let start = Instant::now();
    let at_start = n.done.load(Ordering::Relaxed);
    std::thread::sleep(time);
    n.stop.store(true, Ordering::Relaxed);
    for l in loops {
        let _ = l.join();
    }
    let secs = start.elapsed().as_secs_f64();
    let all = n.done.load(Ordering::Relaxed);
    let split = |v: u64| (v & 0xffff_ffff, v >> 32);
    let ((done0, smc0), (done1, smc1)) = (split(at_start), split(all));
    let (done, n_smc) = (done1 - done0, smc1 - smc0);
    let mut r = Tally::default().into_report(Test::Crr, tcp, msg, secs);
    r.mode = format!("{n_smc} of {done} connections SMC-D");
    r.conns_per_s = Some(done as f64 / secs);
    r.concurrency = Some(concurrency);
    r.errors = n.errors.load(Ordering::Relaxed);
    (r.connections, r.smc_connections, r.fallbacks, r.connect_us) = (None, None, None, None);
    let (v, i) = smcd_engine::sys::context_switches();
    r.total_connections = Some(done1);
    (r.csw_voluntary, r.csw_involuntary) = (Some(v), Some(i));
    Ok(r)
}

// ------------------------------------------------------------------------------------------
// Server.

/// An accepted connection the loop serves.
struct Served {
    c: Conn,
    fd: i32,
    header: [u8; 9],
    have: usize,
    /// The request (crr), once the header named its size.
    buf: Vec<u8>,
    got: usize,
    sent: usize,
    since: Instant,
    /// Registered for writability too.
    out: bool,
}

enum Step {
    /// Wait for the descriptor again (with OUT too while a response is unsent).
    Wait { out: bool },
    /// Done: close it.
    Close,
    /// Not crr: serve it on a thread of its own.
    HandOff(Test, usize),
}

impl Served {
    fn step(&mut self) -> io::Result<Step> {
        while self.have < self.header.len() {
            match self.c.read(&mut self.header[self.have..]) {
                Ok(0) => return Ok(Step::Close),
                Ok(n) => self.have += n,
                Err(e) if would_block(&e) => return Ok(Step::Wait { out: false }),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let msg = u64::from_be_bytes(self.header[1..].try_into().expect("8 bytes")) as usize;
        let test = Test::from_code(self.header[0])
            .ok_or_else(|| io::Error::other(format!("unknown test code {:02x?}", self.header)))?;
        if msg == 0 || msg > MAX_MSG {
            return Err(io::Error::other(format!("message size {msg} out of range")));
        }
        if test != Test::Crr {
            return Ok(Step::HandOff(test, msg));
        }
        if self.buf.len() != msg {
            self.buf = vec![0u8; msg];
        }
        while self.got < msg {
            match self.c.read(&mut self.buf[self.got..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.got += n,
                Err(e) if would_block(&e) => return Ok(Step::Wait { out: false }),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        while self.sent < msg {
            match self.c.write(&self.buf[self.sent..]) {
                Ok(n) => self.sent += n,
                Err(e) if would_block(&e) => return Ok(Step::Wait { out: true }),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.c.flush()?;
        Ok(Step::Close)
    }
}

/// The event-loop server: accepts, serves crr in the loop, hands other tests to threads.
pub fn serve(l: Listen, cpu: Option<usize>) -> anyhow::Result<()> {
    let l = Arc::new(l);
    match &*l {
        Listen::Smc(s) => s.set_nonblocking(true)?,
        Listen::Smcr(_) => anyhow::bail!("--events does not run over SMC-R"),
        Listen::Tcp(t) => t.set_nonblocking(true)?,
    }
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    const LISTENER: u64 = u64::MAX;
    let lfd = match &*l {
        Listen::Smc(s) => s.readiness_fd()?,
        Listen::Smcr(_) => anyhow::bail!("--events does not run over SMC-R"),
        Listen::Tcp(t) => t.as_fd(),
    };
    epoll::add(
        &ep,
        lfd,
        epoll::EventData::new_u64(LISTENER),
        epoll::EventFlags::IN,
    )?;
    let mut conns: Vec<Option<Served>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut events = Vec::with_capacity(1024);
    let mut paused_until: Option<Instant> = None;
    let mut last_sweep = Instant::now();
    let close = |ep: &OwnedFd, conns: &mut Vec<Option<Served>>, free: &mut Vec<usize>, i: usize| {
        let s = conns[i].take().expect("closing a slot in use");
        // SAFETY: the stream in `s` owns the descriptor and is dropped after this.
        let _ = epoll::delete(ep, unsafe { BorrowedFd::borrow_raw(s.fd) });
        free.push(i);
        s
    };
    let mut fresh = Vec::new();
    loop {
        events.clear();
        let timeout = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        match epoll::wait(
            &ep,
            rustix::buffer::spare_capacity(&mut events),
            Some(&timeout),
        ) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        if paused_until.is_some_and(|t| t <= Instant::now()) {
            paused_until = None;
            epoll::modify(
                &ep,
                lfd,
                epoll::EventData::new_u64(LISTENER),
                epoll::EventFlags::IN,
            )?;
        }
        fresh.clear();
        for ev in events.iter() {
            let token = ev.data.u64();
            if token != LISTENER {
                fresh.push(token as usize);
                continue;
            }
            // A bounded batch, so the served connections are not starved by a flood.
            for _ in 0..64 {
                let c = match &*l {
                    Listen::Smc(s) => s.accept().map(|(s, _)| Conn::Smc(s)),
                    Listen::Smcr(s) => s.accept().map(|(s, _)| Conn::Smcr(s)),
                    Listen::Tcp(t) => t.accept().map(|(s, _)| Conn::Tcp(s)),
                };
                let c = match c {
                    Ok(c) => c,
                    Err(e) if would_block(&e) => break,
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                        // The listener stays readable: stop looking at it for a moment.
                        paused_until = Some(Instant::now() + BACK_OFF);
                        epoll::modify(
                            &ep,
                            lfd,
                            epoll::EventData::new_u64(LISTENER),
                            epoll::EventFlags::empty(),
                        )?;
                        break;
                    }
                    Err(_) => continue,
                };
                let setup = c.set_nonblocking(true).and_then(|()| match &c {
                    Conn::Smc(s) => s.set_nodelay(true),
                    Conn::Smcr(s) => s.set_nodelay(true),
                    Conn::Tcp(s) => s.set_nodelay(true),
                });
                if setup.is_err() {
                    continue;
                }
                let Ok(fd) = c.readiness_fd().map(|f| f.as_raw_fd()) else {
                    continue;
                };
                let i = free.pop().unwrap_or_else(|| {
                    conns.push(None);
                    conns.len() - 1
                });
                conns[i] = Some(Served {
                    c,
                    fd,
                    header: [0; 9],
                    have: 0,
                    buf: Vec::new(),
                    got: 0,
                    sent: 0,
                    since: Instant::now(),
                    out: false,
                });
                // SAFETY: the stream just stored owns `fd`.
                let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
                if epoll::add(
                    &ep,
                    bfd,
                    epoll::EventData::new_u64(i as u64),
                    epoll::EventFlags::IN,
                )
                .is_err()
                {
                    drop(close(&ep, &mut conns, &mut free, i));
                    continue;
                }
                // The request is often there already.
                fresh.push(i);
            }
        }
        for &i in &fresh {
            let Some(s) = conns.get_mut(i).and_then(Option::as_mut) else {
                continue;
            };
            match s.step() {
                // Registered as wanted already: no system call (a wait per message).
                Ok(Step::Wait { out }) if out == s.out => {}
                Ok(Step::Wait { out }) => {
                    let flags = if out {
                        epoll::EventFlags::IN | epoll::EventFlags::OUT
                    } else {
                        epoll::EventFlags::IN
                    };
                    // SAFETY: as above.
                    let bfd = unsafe { BorrowedFd::borrow_raw(s.fd) };
                    if epoll::modify(&ep, bfd, epoll::EventData::new_u64(i as u64), flags).is_ok() {
                        s.out = out;
                    }
                }
                Ok(Step::Close) => drop(close(&ep, &mut conns, &mut free, i)),
                Ok(Step::HandOff(test, msg)) => {
                    let s = close(&ep, &mut conns, &mut free, i);
                    let c = s.c;
                    std::thread::spawn(move || {
                        pin(cpu);
                        if let Err(e) = c
                            .set_nonblocking(false)
                            .map_err(anyhow::Error::from)
                            .and_then(|()| super::serve_test(c, test, msg))
                        {
                            super::report_conn_error(&e);
                        }
                    });
                }
                Err(e) => {
                    super::report_conn_error(&anyhow::Error::from(e));
                    drop(close(&ep, &mut conns, &mut free, i));
                }
            }
        }
        if last_sweep.elapsed() >= Duration::from_secs(1) {
            // A client that never sends its request loses its connection, as nginx's
            // client_header_timeout would close it.
            last_sweep = Instant::now();
            for i in 0..conns.len() {
                if conns[i].as_ref().is_some_and(|s| s.since.elapsed() > STUCK) {
                    drop(close(&ep, &mut conns, &mut free, i));
                }
            }
        }
    }
}
