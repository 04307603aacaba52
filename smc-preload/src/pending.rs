//! Non-blocking connects: `connect` on an `O_NONBLOCK` socket returns `EINPROGRESS` while the
//! TCP connect or the CLC handshake is under way, as the kernel's `smc_connect` hands a
//! non-blocking connect to its `connect_work` and reports the end through the socket's poll.
//!
//! The program's descriptor is meanwhile a readiness pair made for the connection that does
//! not exist yet ([`Readiness::waiting`]): neither readable nor writable, as a TCP socket in
//! `SYN_SENT`. One thread per process (the *connector*, an epoll loop over the connects in
//! flight) steps each handshake as its socket becomes ready and finishes it:
//!
//! - **SMC-D**: the stream takes that very pair as its readiness
//!   ([`SmcStream::adopt_readiness`]), so whatever waits on the descriptor (an epoll set, a
//!   `poll`) sees it become writable and goes on with the stream;
//! - **fallback** (no SMC option in the SYN-ACK, a Decline): the TCP socket is put at the
//!   descriptor number. Registrations the program made with `epoll_ctl` meanwhile are moved to
//!   it (the hook records them for descriptors in this state): deleted for the old file,
//!   added again with the same events and data for the socket. The old pair is then made
//!   writable, so a `poll` that was waiting on it returns and the program looks again;
//! - **error**: the pair shows the end (readable, writable, hung up) and `SO_ERROR` reports
//!   the connect's error once, as TCP's does.
//!
//! A connect known to be plain TCP before its TCP connect finished (no SMC device, no SMC
//! listener there) never gets here: the TCP socket itself goes to the program, connect in
//! flight, `SO_ERROR` untouched.
//!
//! Calls on the descriptor meanwhile: names and options go to the TCP socket under the connect
//! (`TCP_NODELAY` and `TCP_CORK` are also kept for the stream); data calls, `shutdown` and
//! `dup*` wait for the end (a program calls them once the descriptor is writable, as for TCP);
//! `close` abandons the connect (when no other process holds it).
//!
//! **fork.** A connect in flight is shared with a forked child as the TCP socket under it is
//! (the object's process count, `table::Hold`). Only one process can run the handshake (its
//! bytes are read from the one socket), and an SMC connection set up in one process after the
//! fork could not be used by the other, while a TCP socket can. So at the fork (its prepare
//! handler, with the connect's state locked across it, `ForkGuard`) the connect is told to
//! end in TCP (`SmcConnecting::decline_smc`: an Accept gets a Decline, `SMC_CLC_DECL_INTERR`,
//! and both ends fall back, as when the kernel's client declines), the process that started it
//! (its connector) keeps running it whether or not it still holds a descriptor of it, and
//! writes the outcome into a word every holder shares (`Hold::word`): TCP, SMC (only when SMC
//! was decided before the fork), or the errno. The other processes catch up on their next call
//! on the descriptor (`Pending::catch_up`): the TCP socket, which they inherited at the number
//! the connect used, goes to the program's descriptor number and their epoll registrations
//! move to it, as in the starting process; a failure is reported as there. Their `poll`s and
//! epoll waits return because the starting process rings (or hangs up) the pair, which is one
//! open file in all of them. Until then data calls wait for the end, as in the starting
//! process.

use crate::real;
use crate::table::{self, Obj};
use libc::c_int;
use rustix::event::epoll;
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use smcd_engine::transport::Readiness;
use smcd_engine::{SmcConnecting, SmcStream};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// An `epoll_ctl` registration of the program's descriptor made while the connect ran.
#[derive(Debug, Clone, Copy)]
struct Reg {
    epfd: c_int,
    events: u32,
    data: u64,
}

/// Where a connect in flight stands.
#[derive(Debug)]
pub(crate) enum State {
    /// Under way: the connect, the pair at the program's descriptor, what the program asked
    /// for meanwhile.
    Running(Box<Running>),
    /// Finished: the descriptor is the stream's (or the TCP socket) now.
    Done,
    /// Failed with this errno, which `SO_ERROR` has not reported yet (0: it has).
    Failed(c_int),
    /// The program closed its descriptor.
    Closed,
}

#[derive(Debug)]
pub(crate) struct Running {
    conn: SmcConnecting,
    ready: Readiness,
    regs: Vec<Reg>,
    cloexec: bool,
    nodelay: bool,
    cork: bool,
}

/// A connect in flight behind one of the program's descriptors.
#[derive(Debug)]
pub(crate) struct Pending {
    /// The program's descriptor number.
    fd: c_int,
    /// The process that started it, whose connector runs it (a forked child has none).
    pid: u32,
    /// The number of the TCP socket under the connect, in the starting process and (until it
    /// caught up) in every process forked from it.
    tcp: c_int,
    pub(crate) hold: table::Hold,
    state: Mutex<State>,
}

/// The outcome in the holders' shared word ([`Pending::publish`]): 0 while under way.
const OUT_TCP: u32 = 1;
const OUT_SMC: u32 = 2;
/// Plus the errno.
const OUT_FAILED: u32 = 0x100;

/// A connect's state, locked by the forking thread from `fork`'s prepare handler to its parent
/// and child handlers (`table`), so the child's copy is never locked by a thread it lacks and
/// is never a copy of a half-done step.
pub(crate) struct ForkGuard {
    // Dropped before the Arc it borrows from (fields drop in order).
    _g: MutexGuard<'static, State>,
    _p: Arc<Pending>,
}

impl std::fmt::Debug for ForkGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ForkGuard")
    }
}

impl ForkGuard {
    /// Locks `p`'s state and, if it is under way, makes it end in TCP.
    pub(crate) fn take(p: &Arc<Pending>) -> Self {
        let p = Arc::clone(p);
        let mut g = lock(&p.state);
        if let State::Running(r) = &mut *g
            && !r.conn.decline_smc()
        {
            crate::hooks::debug(format_args!(
                "fork: connect fd {} was SMC already; the other process cannot use it",
                p.fd
            ));
        }
        // SAFETY: the guard borrows the mutex inside the Arc's allocation, which `_p` keeps
        // alive for as long as the guard, and the guard is dropped first.
        let g =
            unsafe { std::mem::transmute::<MutexGuard<'_, State>, MutexGuard<'static, State>>(g) };
        ForkGuard { _g: g, _p: p }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What [`start`] did.
pub(crate) enum Started {
    /// The connect finished at once: the stream, for the caller to put at the descriptor.
    Now(SmcStream),
    /// The descriptor is the TCP socket with its connect in flight (plain TCP for good).
    PlainInFlight,
    /// The descriptor is a waiting readiness pair; the connector finishes the connect.
    InFlight,
}

/// Starts a non-blocking connect of the program's descriptor `fd` (`cloexec` as it was,
/// `nodelay` as the program set it) to `dst`.
pub(crate) fn start(
    engine: &Arc<smcd_engine::Engine>,
    fd: c_int,
    dst: std::net::SocketAddr,
    cloexec: bool,
    nodelay: bool,
    own: Option<rustix::fd::OwnedFd>,
) -> io::Result<Started> {
    // On the program's own socket where it can be (`hooks::own_socket`).
    let mut conn = match own {
        Some(sock) => SmcStream::connect_nonblocking_on(engine, sock, dst)?,
        None => SmcStream::connect_nonblocking_with(engine, dst)?,
    };
    // On this host the TCP connect is usually done already, and the Proposal goes out here.
    if let Some(s) = conn.try_finish()? {
        return Ok(Started::Now(s));
    }
    if let Some((tcp, _)) = conn.take_plain() {
        crate::hooks::place(tcp.as_raw_fd(), fd, cloexec)?;
        table::set_kind(fd, table::NONE);
        return Ok(Started::PlainInFlight);
    }
    let ready = Readiness::waiting()?;
    // The program's descriptor is non-blocking: so is the pair's near end (one open file).
    rustix::io::ioctl_fionbio(ready.fd(), true)?;
    crate::hooks::place(ready.fd().as_raw_fd(), fd, cloexec)?;
    let p = Arc::new(Pending {
        fd,
        pid: std::process::id(),
        tcp: conn.as_raw_fd(),
        hold: table::Hold::new(),
        state: Mutex::new(State::Running(Box::new(Running {
            conn,
            ready,
            regs: Vec::new(),
            cloexec,
            nodelay,
            cork: false,
        }))),
    });
    if let Some(old) = table::insert(fd, Obj::Connecting(Arc::clone(&p))) {
        table::release(old);
    }
    if let Err(e) = connector().add(Arc::clone(&p)) {
        // Nobody would finish it: it failed, as the descriptor and SO_ERROR will say.
        fail_connect(&p, &mut lock(&p.state), e);
    }
    Ok(Started::InFlight)
}

impl Pending {
    /// The number of the TCP socket under the connect (see the field).
    pub(crate) fn tcp_fd(&self) -> c_int {
        self.tcp
    }

    /// Writes the outcome for the processes that share the connect (the starting one, under
    /// the state's lock, when the connect ends).
    fn publish(&self, out: u32) {
        if let Some(w) = self.hold.word() {
            // Read by other processes' catch_up (Acquire) after the state they act on.
            w.store(out, Ordering::Release);
        }
    }

    /// The outcome the starting process wrote, 0 while under way (or when there is no shared
    /// word: then only the starting process ever finishes it).
    fn outcome(&self) -> u32 {
        self.hold.word().map_or(0, |w| w.load(Ordering::Acquire))
    }

    /// In a process that did not start the connect (a forked one): takes on what the starting
    /// process made of it, once it has ended (see the module docs). A no-op elsewhere and
    /// while it runs.
    pub(crate) fn catch_up(&self) {
        if self.pid == std::process::id() {
            return;
        }
        let out = self.outcome();
        if out == 0 {
            return;
        }
        let mut st = lock(&self.state);
        let run = match std::mem::replace(&mut *st, State::Done) {
            State::Running(r) => Some(r),
            // The starting process was between its last step and taking the descriptor over
            // when it forked: the connect's TCP socket is still at its number here.
            State::Done => None,
            other => {
                *st = other;
                return;
            }
        };
        if out & OUT_FAILED != 0 {
            *st = State::Failed((out & 0xff) as c_int);
            drop(st);
            // This process's copy of the connect is not closed here: its socket is the others'.
            std::mem::forget(run);
            return;
        }
        if out == OUT_SMC {
            // SMC was decided before the fork (the Confirm queued): the connection is the
            // starting process's alone.
            *st = State::Failed(libc::ECONNABORTED);
            drop(st);
            std::mem::forget(run);
            return;
        }
        drop(st);
        self.adopt_tcp(run);
    }

    /// [`Pending::catch_up`] to a fallback: the inherited TCP socket at the program's number.
    fn adopt_tcp(&self, run: Option<Box<Running>>) {
        let (nonblocking, cloexec_now) = {
            let (c, n) = crate::hooks::fd_flags(self.fd);
            (n, c)
        };
        let (regs, cloexec, ready) = match run {
            Some(r) => {
                let Running {
                    conn,
                    ready,
                    regs,
                    cloexec,
                    ..
                } = *r;
                // Its sockets are the starting process's too: nothing of it is closed or
                // sent from here.
                std::mem::forget(conn);
                (regs, cloexec, Some(ready))
            }
            None => (Vec::new(), cloexec_now, None),
        };
        for g in &regs {
            // SAFETY: deleting our descriptor from the program's set.
            unsafe { real::epoll_ctl(g.epfd, libc::EPOLL_CTL_DEL, self.fd, std::ptr::null_mut()) };
        }
        if let Err(e) = crate::hooks::place(self.tcp, self.fd, cloexec) {
            *lock(&self.state) = State::Failed(crate::hooks::errno_of(&e));
            return;
        }
        // SAFETY: the connect's own number for the socket, which this process no longer uses.
        unsafe { real::close(self.tcp) };
        // SAFETY: the program's descriptor, now the TCP socket (one open file with the
        // others': O_NONBLOCK is shared, as for any inherited socket).
        let b = unsafe { BorrowedFd::borrow_raw(self.fd) };
        let _ = rustix::io::ioctl_fionbio(b, nonblocking);
        let _ = table::remove(self.fd);
        for g in &regs {
            let mut ev = libc::epoll_event {
                events: g.events,
                u64: g.data,
            };
            // SAFETY: the program's registration, for the socket now at its number (EEXIST
            // when the set is shared with the starting process, which moved it already).
            unsafe { real::epoll_ctl(g.epfd, libc::EPOLL_CTL_ADD, self.fd, &mut ev) };
        }
        drop(ready);
        crate::hooks::debug(format_args!(
            "connect fd {}: TCP (finished by pid {})",
            self.fd, self.pid
        ));
    }

    /// The program's descriptor is gone for good (its last copy closed): the connect is
    /// abandoned (its TCP socket closed).
    pub(crate) fn close(&self) {
        let was = std::mem::replace(&mut *lock(&self.state), State::Closed);
        drop(was);
    }

    /// The errno of a second `connect` on the descriptor, as TCP's: `EALREADY` while under
    /// way, the failure once after a failed connect, else `EISCONN`.
    pub(crate) fn connect_again(&self) -> c_int {
        self.catch_up();
        match &mut *lock(&self.state) {
            State::Running(_) => libc::EALREADY,
            State::Failed(e) if *e > 0 => std::mem::take(e),
            _ => libc::EISCONN,
        }
    }

    /// `SO_ERROR`: 0 while under way or after success, the connect's error once after a
    /// failure.
    pub(crate) fn take_error(&self) -> c_int {
        self.catch_up();
        match &mut *lock(&self.state) {
            State::Failed(e) => std::mem::take(e),
            _ => 0,
        }
    }

    /// Runs `f` on the TCP socket under the connect while it is under way (names, options);
    /// `None` once it is not.
    pub(crate) fn with_tcp<R>(
        &self,
        f: impl FnOnce(BorrowedFd<'_>, &mut Running) -> R,
    ) -> Option<R> {
        self.catch_up();
        match &mut *lock(&self.state) {
            State::Running(r) => {
                // The connect's socket is the TCP socket in every phase.
                let fd = r.conn.as_fd().as_raw_fd();
                // SAFETY: the socket lives as long as the connect, which the lock keeps.
                let b = unsafe { BorrowedFd::borrow_raw(fd) };
                Some(f(b, r))
            }
            _ => None,
        }
    }

    /// Records an `epoll_ctl` the program made on the descriptor while the connect runs, and
    /// makes it (under the lock, so a fallback moves exactly what was registered). `None`:
    /// the connect is over, the call is the caller's to make.
    pub(crate) fn epoll_ctl(
        &self,
        epfd: c_int,
        op: c_int,
        event: *mut libc::epoll_event,
    ) -> Option<c_int> {
        self.catch_up();
        let mut st = lock(&self.state);
        let State::Running(r) = &mut *st else {
            return None;
        };
        // SAFETY: passed through, as the program asked.
        let rc = unsafe { real::epoll_ctl(epfd, op, self.fd, event) };
        if rc == 0 {
            r.regs.retain(|g| g.epfd != epfd);
            if op != libc::EPOLL_CTL_DEL && !event.is_null() {
                // SAFETY: the program's event, valid for ADD and MOD.
                let ev = unsafe { std::ptr::read_unaligned(event) };
                r.regs.push(Reg {
                    epfd,
                    events: ev.events,
                    data: ev.u64,
                });
            }
        }
        Some(rc)
    }

    /// `TCP_NODELAY` / `TCP_CORK` set by the program meanwhile, for the stream.
    pub(crate) fn note_option(r: &mut Running, level: c_int, name: c_int, on: bool) {
        match (level, name) {
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => r.nodelay = on,
            (libc::IPPROTO_TCP, libc::TCP_CORK) => r.cork = on,
            _ => {}
        }
    }
}

/// Waits until the connect behind `fd`, if there is one, is over and the descriptor is what
/// it became (data calls, `shutdown`, `dup` made while it runs). A failed connect stays (its
/// calls fail as TCP's do). In a forked process, the starting process ends it; if that one
/// is gone before it did, the connect fails here with `ECONNABORTED`.
pub(crate) fn settle(fd: c_int) {
    loop {
        let Some(Obj::Connecting(p)) = table::get(fd) else {
            return;
        };
        p.catch_up();
        if matches!(*lock(&p.state), State::Failed(_) | State::Closed) {
            return;
        }
        // The outcome is read again after the starter was found gone: it may have written it
        // just before it ended.
        if p.pid != std::process::id() && p.outcome() == 0 && !alive(p.pid) && p.outcome() == 0 {
            let mut st = lock(&p.state);
            if let State::Running(r) =
                std::mem::replace(&mut *st, State::Failed(libc::ECONNABORTED))
            {
                r.ready.hang_up();
                std::mem::forget(r.conn);
            }
            return;
        }
        // Under way, or finished and about to take the descriptor over.
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Whether process `pid` is still there (it may have started a connect this one shares).
fn alive(pid: u32) -> bool {
    rustix::process::Pid::from_raw(pid as i32)
        .is_some_and(|p| rustix::process::test_kill_process(p) != Err(rustix::io::Errno::SRCH))
}

/// The process's connector: one thread, one epoll set of the connects in flight (one-shot,
/// each re-armed for what its next step waits for), woken also by the earliest handshake
/// deadline.
struct Connector {
    ep: OwnedFd,
    inflight: Mutex<HashMap<u64, Arc<Pending>>>,
    next: AtomicU64,
    /// Pairs a fallback replaced, closed after [`RETIRE_AFTER`].
    retired: Mutex<Vec<(Instant, Readiness)>>,
}

/// How long a replaced pair stays open (see [`finish`]).
const RETIRE_AFTER: Duration = Duration::from_secs(1);

/// This process's connector, started on first use (again in a forked child, whose copy of
/// its parent's has no thread and shares the parent's epoll instance).
fn connector() -> &'static Connector {
    static C: smcd_engine::fork::PerProcess<Connector> = smcd_engine::fork::PerProcess::new();
    let mut started = false;
    let c = C.get(|| {
        started = true;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC).expect("epoll_create");
        Connector {
            ep: smcd_engine::sys::banded(ep),
            inflight: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            retired: Mutex::new(Vec::new()),
        }
    });
    if started {
        crate::hooks::spawn_quiet("smc-connect", move || c.run());
    }
    c
}

impl Connector {
    fn add(&self, p: Arc<Pending>) -> io::Result<()> {
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        // In the map before it is armed: the answer may wake the connector at once.
        lock(&self.inflight).insert(token, Arc::clone(&p));
        let armed = p.with_tcp(|fd, r| {
            epoll::add(
                &self.ep,
                fd,
                epoll::EventData::new_u64(token),
                interest(&r.conn),
            )
        });
        if let Some(Err(e)) = armed {
            self.forget(token);
            return Err(e.into());
        }
        Ok(())
    }

    fn retire(&self, r: Readiness) {
        lock(&self.retired).push((Instant::now() + RETIRE_AFTER, r));
    }

    fn run(&self) {
        let mut events = Vec::with_capacity(64);
        let mut next = None;
        loop {
            let left = next.map_or(Duration::from_secs(1), |d: Instant| {
                d.saturating_duration_since(Instant::now())
            });
            let timeout = rustix::time::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            events.clear();
            let woken = match epoll::wait(
                &self.ep,
                rustix::buffer::spare_capacity(&mut events),
                Some(&timeout),
            ) {
                Ok(_) => events.iter().map(|e| e.data.u64()).collect::<Vec<_>>(),
                Err(rustix::io::Errno::INTR) => Vec::new(),
                Err(_) => {
                    // The set is gone (a program closed a descriptor of ours): no spinning on
                    // the error; the deadlines below still end what is under way.
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    Vec::new()
                }
            };
            for token in woken {
                self.step_caught(token);
            }
            // Handshakes past their deadline, and connects the program abandoned; the
            // earliest deadline still ahead bounds the next wait.
            let now = Instant::now();
            next = None;
            let mut due = Vec::new();
            for (t, p) in lock(&self.inflight).iter() {
                match &*lock(&p.state) {
                    State::Running(r) => match r.conn.deadline() {
                        Some(d) if d <= now => due.push(*t),
                        Some(d) => next = Some(next.map_or(d, |n: Instant| n.min(d))),
                        None => {}
                    },
                    _ => due.push(*t),
                }
            }
            for token in due {
                self.step_caught(token);
            }
            lock(&self.retired).retain(|(until, _)| *until > now);
        }
    }

    /// [`Connector::step`]; a panic there fails that connect instead of ending the thread
    /// every connect in flight needs.
    fn step_caught(&self, token: u64) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step(token)));
        if r.is_err() {
            let p = lock(&self.inflight).remove(&token);
            if let Some(p) = p {
                fail_connect(
                    &p,
                    &mut lock(&p.state),
                    io::Error::from_raw_os_error(libc::EIO),
                );
            }
        }
    }

    /// One step of the connect `token`; it leaves the set once it is over.
    fn step(&self, token: u64) {
        let Some(p) = lock(&self.inflight).get(&token).cloned() else {
            return;
        };
        let mut st = lock(&p.state);
        let over = match &mut *st {
            State::Running(r) => match r.conn.try_finish() {
                Ok(None) => match epoll::modify(
                    &self.ep,
                    r.conn.as_fd(),
                    epoll::EventData::new_u64(token),
                    interest(&r.conn),
                ) {
                    Ok(()) => false,
                    Err(e) => {
                        fail_connect(&p, &mut st, e.into());
                        true
                    }
                },
                Ok(Some(s)) => {
                    p.publish(if s.is_smc() { OUT_SMC } else { OUT_TCP });
                    let State::Running(r) = std::mem::replace(&mut *st, State::Done) else {
                        unreachable!("matched above")
                    };
                    let _ = epoll::delete(&self.ep, r.conn.as_fd());
                    // Not under the lock: the table lets go of this connect (Pending::close).
                    drop(st);
                    finish(&p, *r, s);
                    self.forget(token);
                    return;
                }
                Err(e) => {
                    let _ = epoll::delete(&self.ep, r.conn.as_fd());
                    fail_connect(&p, &mut st, e);
                    true
                }
            },
            State::Done | State::Failed(_) | State::Closed => true,
        };
        drop(st);
        if over {
            self.forget(token);
        }
    }

    fn forget(&self, token: u64) {
        lock(&self.inflight).remove(&token);
    }
}

/// What the connect's next step waits for, one-shot.
fn interest(c: &SmcConnecting) -> epoll::EventFlags {
    let dir = if c.wants_read() {
        epoll::EventFlags::IN
    } else {
        epoll::EventFlags::OUT
    };
    dir | epoll::EventFlags::ONESHOT
}

/// The connect failed: the pair shows the end (the program's descriptor is a copy of its near
/// end, which stays), `SO_ERROR` will say why.
fn fail_connect(p: &Pending, st: &mut State, e: io::Error) {
    let errno = crate::hooks::errno_of(&e);
    p.publish(OUT_FAILED | (errno as u32 & 0xff));
    if let State::Running(r) = std::mem::replace(st, State::Failed(errno)) {
        r.ready.hang_up();
    }
    crate::hooks::debug(format_args!("connect fd {}: {e}", p.fd));
}

/// The connect finished with `s`: the stream takes the descriptor's pair, or the TCP socket
/// takes the descriptor (see the module docs). Nothing changes if the program's descriptor is
/// no longer this connect's (it closed it meanwhile).
fn finish(p: &Arc<Pending>, r: Running, s: SmcStream) {
    let Running {
        ready,
        regs,
        cloexec,
        nodelay,
        cork,
        ..
    } = r;
    let mine = matches!(table::get(p.fd), Some(Obj::Connecting(q)) if Arc::ptr_eq(&q, p));
    if !mine {
        if p.hold.held() {
            // This process closed its descriptor, a forked one still holds the connect: it
            // takes the TCP socket from its own copy (Pending::catch_up), and a poll waiting
            // on the pair there returns.
            ready.bell().ring(smcd_engine::device::Dir::Tx);
            match s.into_tcp() {
                Ok(tcp) => drop(tcp),
                Err(s) => std::mem::forget(s),
            }
        }
        return;
    }
    // What the program set on its descriptor meanwhile (one open file with the pair).
    let nonblocking = crate::hooks::fd_flags(p.fd).1;
    if s.is_smc() {
        let ok = (|| -> io::Result<()> {
            crate::hooks::prepare_stream(&s, nonblocking, nodelay)?;
            if regs.iter().any(|g| g.events & libc::EPOLLET as u32 != 0) {
                s.set_edge_readiness(true);
            }
            s.set_cork(cork)?;
            s.adopt_readiness(ready)
        })();
        if let Err(e) = ok {
            crate::hooks::debug(format_args!("connect fd {}: {e}", p.fd));
        }
        if !matches!(*lock(&p.state), State::Done) {
            // The program closed its descriptor meanwhile: the stream ends here.
            return;
        }
        let stream = Obj::Stream(table::Stream::new(s, nonblocking));
        if let Some(old) = table::insert(p.fd, stream) {
            table::release(old);
        }
        crate::hooks::debug(format_args!("connect fd {}: SMC-D", p.fd));
        return;
    }
    let Ok(tcp) = s.into_tcp() else {
        *lock(&p.state) = State::Failed(libc::EIO);
        ready.hang_up();
        return;
    };
    let _ = tcp.set_nonblocking(nonblocking);
    if nodelay {
        let _ = tcp.set_nodelay(true);
    }
    // Out of every epoll set with the old file, the socket at the number, back in with the
    // program's events and data.
    for g in &regs {
        // SAFETY: deleting our descriptor from the program's set.
        unsafe { real::epoll_ctl(g.epfd, libc::EPOLL_CTL_DEL, p.fd, std::ptr::null_mut()) };
    }
    if let Err(e) = crate::hooks::place(tcp.as_raw_fd(), p.fd, cloexec) {
        *lock(&p.state) = State::Failed(crate::hooks::errno_of(&e));
        ready.hang_up();
        return;
    }
    // The table's reference to this connect (nothing else to end: it is over), and its
    // process count (before, one slot of the shared page leaked per fallback connect).
    if let Some(old) = table::remove(p.fd) {
        table::forget(old);
    }
    for g in &regs {
        let mut ev = libc::epoll_event {
            events: g.events,
            u64: g.data,
        };
        // SAFETY: the program's registration, for the socket now at its number.
        unsafe { real::epoll_ctl(g.epfd, libc::EPOLL_CTL_ADD, p.fd, &mut ev) };
    }
    // A poll still waiting on the old file returns, and the program looks at the number
    // again. The pair is closed a while later: closed now, such a poll could find it hung up.
    ready.bell().ring(smcd_engine::device::Dir::Tx);
    connector().retire(ready);
    crate::hooks::debug(format_args!("connect fd {}: TCP", p.fd));
}
