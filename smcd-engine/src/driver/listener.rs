//! The listening side (`smc_listen`, `smc_tcp_listen_work`, `smc_listen_work`).
//!
//! `accept()` takes TCP connections itself and sorts them without reading from them: a
//! connection `smcd` announced (its client registered an intent before it connected), or,
//! where smcd's SMC option program is in effect, one whose SYN carried the option and was
//! echoed (the listener is registered in the program's map, its handshake-limitation state is
//! the map's congested flag), starts a handshake; any other is returned at once as a plain TCP
//! connection. Handshakes run in
//! parallel and their results queue for the next `accept()`; a plain connection never waits
//! behind them and costs no thread hand-off.
//!
//! As in the kernel, an SMC client's `connect()` must complete even while the application is
//! not in `accept()` (the kernel's listen work runs the handshake): while intents are pending,
//! an acceptor thread takes connections from the kernel's queue too. It sleeps on the intent
//! channel otherwise, so a listener that sees only plain clients has no thread in the way.
//! On the option path no intent warns of an SMC client, so the acceptor takes every new
//! connection while nobody is in `accept()`.
//!
//! After a fork, the acceptor leaves the kernel's queue to the processes whose programs
//! accept (another process may be the one that accepts). If none takes a connection for
//! `UNSERVED_AFTER` (a second), a holder declines the queued clients' Proposals and hands their TCP
//! sockets to whichever holder accepts next ([`Handoff`]), so no client's connect waits for an
//! `accept` until its CLC wait runs out.
//!
//! **Where a handshake waits.** A handshake spends nearly all its life waiting for the peer's
//! next CLC message; that costs no thread. The listener's reactor (one thread and one epoll
//! instance, started with the first handshake) holds every handshake that waits for bytes,
//! each a small record with its deadline: the whole Proposal within `CLC_WAIT_TIME` of the
//! accept, the whole Confirm within `CLC_WAIT_TIME` of the Accept, however the bytes trickle
//! in. At the deadline the connection is closed (the kernel's `smc_listen_out_err`). Threads
//! (at most [`max_workers`]) do only the bounded work between messages: the link group and DMB
//! (requests to smcd, which time out; a first contact of the same peer, which ends by its own
//! deadline) and attaching the client's DMB. A client that holds N connections half-way costs
//! N records, not N threads.
//!
//! **An event loop drives its own handshakes.** Once the application made the listener
//! non-blocking and asked for its readiness descriptor (an epoll server: nginx, tokio), the
//! handshakes that wait for bytes wait in a second epoll instance nested in that descriptor,
//! with a timer for their deadlines, instead of in the reactor: the application's loop wakes
//! when a Proposal or a Confirm arrives, and its next `accept()` runs that step on its own
//! thread, so an SMC connection costs the server no other thread's wake-up (the reactor and
//! the acceptor woke 2 times per connection for such a loop). The acceptor then leaves the
//! kernel's queue to the loop. In this mode a handshake advances only while the application
//! calls `accept()` when the descriptor says so, as any event-driven server does; a blocking
//! `accept()` hands the handshakes back to the reactor.
//!
//! In-progress handshakes plus ready connections are bounded by the backlog: at the bound no
//! further connection is taken from the kernel's queue (the kernel drops the child instead;
//! for the client the effect is the same, its SYN waits). With handshake limitation on, the
//! listener publishes on its page whether its handshake work is congested: work is queued and
//! no worker is free to take it (the kernel's `workqueue_congested` on `smc_hs_wq`: work not
//! yet served, not handshakes merely waiting for bytes). While it is, clients connect plain
//! TCP without any CLC (the kernel's `smc_hs_congested` making the SYN-ACK go out without the
//! SMC option). A Proposal whose work cannot start within `SERVE_WITHIN` of the accept is
//! declined (both ends go TCP), so a client is never left to time out.

use super::engine::Engine;
use super::handshake::{CLC_WAIT_TIME, DeclineRun, Fallback, Outcome, ServerRun, ServerStep};
use crate::device::Gid;
use crate::ipc::Channel;
use crate::layout::ListenerPage;
use crate::layout::status::{self as st, LstRecord, LstSlot};
use crate::sys::Doorbell;
use rustix::event::{PollFd, PollFlags};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use smc_proto::clc::ReasonCode;
use smc_proto::netlink::loopback::LoopbackCmd;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long the acceptor keeps taking connections for an intent that has not been matched
/// (its client connects right after registering; this only bounds the helper's activity).
const INTENT_ATTENTION: Duration = Duration::from_secs(2);

/// Most intents remembered (a bound against clients that registered and never connected).
const MAX_INTENTS: usize = 65536;

/// How long a worker that has just answered waits for the client's next message before it
/// hands the handshake to the reactor, when no other work is queued: bounded (an attacker
/// that never answers holds an otherwise idle worker this long per Proposal). With work
/// queued it does not wait at all: at 512 concurrent clients a 2 ms linger per handshake made
/// the four workers the bottleneck (crr fell from 3,674 to 1,469 conn/s).
const WORKER_LINGER: Duration = Duration::from_millis(2);

/// Most a blocking `accept` waits in all for one handshake's messages before the reactor
/// takes it ([`ListenerCore::drive`]): the Proposal and the Confirm, a linger each.
const ACCEPT_LINGER: Duration = Duration::from_millis(4);

/// How long the kernel's queue may hold connections while no process holding the listener
/// takes any, before a holder whose own program is not accepting takes them: declined (plain
/// TCP) and handed to whichever process accepts next ([`Handoff`]). The kernel's listen work
/// answers a client whoever accepts later; after a fork the acceptor here leaves the queue to
/// the processes that accept ([`ListenerCore::acceptor_needed`]), and with none accepting an
/// SMC client would wait for its Accept until its CLC wait ended in `ETIMEDOUT`, where a TCP
/// client is queued. Well inside that wait.
const UNSERVED_AFTER: Duration = Duration::from_secs(1);

/// How often a holder whose program does not accept looks at the kernel's queue.
const UNSERVED_LOOK: Duration = Duration::from_millis(250);

/// Most a holder waits for an unserved client's Proposal before it gives up on that client.
const UNSERVED_PROPOSAL: Duration = Duration::from_secs(1);

/// What the processes holding a listener share, made with the listener (a fork copies it): how
/// many connections any of them took off the kernel's queue, whether an `exec` passed the
/// socket on to another program, and a queue of connections one of them took for whichever
/// accepts next (a unix `SOCK_SEQPACKET` pair: each record carries one socket as
/// `SCM_RIGHTS`).
#[derive(Debug)]
pub struct Handoff {
    /// The shared words, at `HO_*`.
    page: crate::layout::region::Region,
    tx: OwnedFd,
    rx: OwnedFd,
}

/// In a [`Handoff`]'s page: connections taken off the kernel's queue by any holder.
const HO_TAKEN: usize = 0;
/// 1 once an `exec` passed the socket on.
const HO_STOPPED: usize = 8;
/// Connections in the hand-off queue.
const HO_QUEUED: usize = 16;

impl Handoff {
    fn new() -> io::Result<Self> {
        use rustix::net::{AddressFamily, SocketFlags, SocketType};
        let (page, _fd) = crate::layout::region::Region::create("smc-listener-handoff", 4096)?;
        let (tx, rx) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )?;
        Ok(Self {
            page,
            tx: crate::sys::banded(tx),
            rx: crate::sys::banded(rx),
        })
    }

    /// One more connection taken off the kernel's queue, by any holder.
    fn note_taken(&self) {
        self.page.u64_at(HO_TAKEN).fetch_add(1, Ordering::Relaxed);
    }

    /// The socket went on to another program ([`ListenerCore::withdraw`]), whose takes are
    /// not counted here: no holder hands connections on from now on.
    fn stop(&self) {
        self.page.u64_at(HO_STOPPED).store(1, Ordering::Release);
    }

    fn stopped(&self) -> bool {
        self.page.u64_at(HO_STOPPED).load(Ordering::Acquire) != 0
    }

    fn taken(&self) -> u64 {
        self.page.u64_at(HO_TAKEN).load(Ordering::Relaxed)
    }

    /// Connections in the queue, as the holders counted them, so that an `accept` makes no
    /// system call for an empty queue. Counted before the send: a taker that looks between
    /// the count and the send finds nothing, and the send's readiness wakes it again.
    fn queued(&self) -> &std::sync::atomic::AtomicU64 {
        self.page.u64_at(HO_QUEUED)
    }

    /// Queues `sock`, a plain TCP connection for `why`, for whichever holder accepts next; a
    /// full queue closes it.
    fn give(&self, sock: TcpStream, why: ReasonCode) {
        self.queued().fetch_add(1, Ordering::AcqRel);
        let rec = why.0.to_ne_bytes();
        if let Err(e) = crate::ipc::channel::send_record(self.tx.as_fd(), &rec, &[sock.as_fd()]) {
            self.queued().fetch_sub(1, Ordering::AcqRel);
            tracing::debug!("connection not handed over: {e}");
        }
    }

    /// A connection another holder (or this one) queued, and why it is plain TCP.
    fn take(&self) -> Option<(TcpStream, ReasonCode)> {
        if self.queued().load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut rec = [0u8; 4];
        match crate::ipc::channel::recv_record(
            self.rx.as_fd(),
            &mut rec,
            rustix::net::RecvFlags::DONTWAIT,
        ) {
            Ok((_, fds)) => {
                self.queued().fetch_sub(1, Ordering::AcqRel);
                let sock = TcpStream::from(fds.into_iter().next()?);
                Some((sock, ReasonCode(u32::from_ne_bytes(rec))))
            }
            Err(_) => None,
        }
    }
}

/// The statistics counter of the path an announced client came by ([`ListenerCore::announced`]).
fn path_stat(gid: Option<Gid>) -> usize {
    if gid.is_none() {
        st::T_SRV_PATH_OPTION
    } else {
        st::T_SRV_PATH_INTENT
    }
}

/// How many connections wait in the kernel's queue of the listening socket `l`.
fn queued(l: &TcpListener) -> u32 {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed tcp_info is valid and its size is passed; the kernel writes at most that.
    unsafe {
        let mut ti: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let r = libc::getsockopt(
            l.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut ti).cast(),
            &mut len,
        );
        // A listener's TCP_INFO says its accept queue's length in tcpi_unacked.
        if r == 0 { ti.tcpi_unacked } else { 0 }
    }
}

/// Whether the handshake's socket becomes readable within `t`.
fn readable_within(hs: &Hs, t: Duration) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let Some(fd) = hs.fd() else {
        return false;
    };
    let ts = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: t.as_nanos() as i64,
    };
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    matches!(poll(&mut fds, Some(&ts)), Ok(n) if n > 0)
}

/// Takes a connection from the kernel's queue with the client's address (no getpeername).
fn accept_from(l: &TcpListener) -> rustix::io::Result<(TcpStream, SocketAddr)> {
    let (fd, addr) = rustix::net::acceptfrom_with(l, rustix::net::SocketFlags::CLOEXEC)?;
    let sock = TcpStream::from(crate::sys::banded(fd));
    let peer = match addr.and_then(|a| SocketAddr::try_from(a).ok()) {
        Some(p) => p,
        None => sock
            .peer_addr()
            .map_err(|_| rustix::io::Errno::CONNABORTED)?,
    };
    Ok((sock, peer))
}

/// Handshake workers per listener: threads for the bounded work of handshakes (requests to
/// smcd, a first contact's wait), never for waiting on the peer's bytes. Enough to overlap
/// those waits, few enough that handshake CPU does not starve the connections already running.
/// Asked once: `available_parallelism` reads the cgroup's CPU quota files on every call
/// (five system calls per file), and the data path of the accept asks often.
pub fn max_workers() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(2, 8)
            * 2
    })
}

/// An accepted connection: what its handshake made of it, and the client's address.
#[derive(Debug)]
pub struct Accepted {
    /// The connection, SMC-D or TCP.
    pub outcome: Outcome,
    /// The client's address.
    pub peer: SocketAddr,
}

/// An announced client: its GID, smcd's intent id, and when the announcement arrived.
type Announced = (Gid, u64, Instant);

/// A handshake in progress and its client's address.
#[derive(Debug)]
struct Hs {
    run: Run,
    peer: SocketAddr,
    /// Its socket is registered in the readiness descriptor's nested set ([`Inline`]): a
    /// one-shot registration that stays, disabled, between its waits (re-armed with
    /// `EPOLL_CTL_MOD`), and goes when the socket closes.
    parked: bool,
}

#[derive(Debug)]
enum Run {
    Smc(Box<ServerRun>),
    /// No device: decline and read the Proposal away.
    Decline(DeclineRun),
}

impl Hs {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.run {
            Run::Smc(r) => r.fd(),
            Run::Decline(r) => r.fd(),
        }
    }

    fn step(&mut self) -> io::Result<ServerStep> {
        match &mut self.run {
            Run::Smc(r) => r.step(),
            Run::Decline(r) => r.step(),
        }
    }

    /// The due work if nothing in it waits ([`ServerRun::work_now`]).
    fn work_now(&mut self) -> bool {
        match &mut self.run {
            Run::Smc(r) => r.work_now(),
            Run::Decline(_) => true,
        }
    }

    /// Whether it waits for the peer's bytes (not for room to write).
    fn waits_to_read(&self) -> bool {
        match &self.run {
            Run::Smc(r) => r.interest() == PollFlags::IN,
            Run::Decline(_) => false,
        }
    }

    /// When the reactor gives up on it: the handshake's deadline; while it has none (a
    /// Decline the peer does not read), a cap from the accept past any deadline it can have.
    fn deadline(&self) -> Instant {
        match &self.run {
            Run::Smc(r) => r
                .deadline()
                .unwrap_or_else(|| r.accepted() + 3 * CLC_WAIT_TIME),
            Run::Decline(r) => r.deadline(),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    ready: VecDeque<Accepted>,
    /// Handshakes whose bounded work waits for a worker.
    jobs: VecDeque<Hs>,
    in_progress: usize,
    workers: usize,
    idle_workers: usize,
    /// Workers blocked for another connection's first contact with the same peer. They do
    /// not count against [`max_workers`]: the work that ends their wait (that connection's
    /// attach) needs a thread too.
    waiting_workers: usize,
}

impl State {
    /// Workers free to take new work now or soon (not blocked for a first contact).
    fn active_workers(&self) -> usize {
        self.workers - self.waiting_workers
    }

    /// Whether a worker should be started for the queued work.
    fn needs_worker(&self) -> bool {
        self.idle_workers < self.jobs.len() && self.active_workers() < max_workers()
    }
}

/// The hand-over into the reactor (which owns the handshakes waiting for bytes).
#[derive(Debug)]
struct ReactorInbox {
    /// Handshakes to wait on (new ones, and ones a worker is done with for now).
    queue: Mutex<Vec<Hs>>,
    /// Rung when `queue` has something or the listener closes.
    bell: Doorbell,
    /// The reactor thread is running.
    started: AtomicBool,
}

/// Listen-time options (`setsockopt(SOL_SMC, SMC_LIMIT_HS)` before `listen()`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ListenOptions {
    /// The backlog: bounds handshakes in progress plus connections ready for `accept`.
    pub backlog: u32,
    /// Handshake limitation for this listener; `None` takes the namespace's `limit_smc_hs`.
    pub limit_hs: Option<bool>,
}

/// Shared state of one listener.
#[derive(Debug)]
pub struct ListenerCore {
    tcp: TcpListener,
    engine: Arc<Engine>,
    local: SocketAddr,
    backlog: usize,
    hs_limit: bool,
    state: Mutex<State>,
    /// Signalled when a job arrives for the workers (only they wait on it) or the listener
    /// closes.
    cond: Condvar,
    reactor: ReactorInbox,
    /// Readable while `ready` is not empty.
    bell: Doorbell,
    chan: Mutex<Option<Channel>>,
    /// The listener page's descriptor, kept to register again after smcd restarts.
    page_fd: Option<OwnedFd>,
    /// When registration was last tried (to try again at most once a second); held while
    /// registering, so there is never more than one registration (and one acceptor).
    last_register: Mutex<Option<Instant>>,
    /// Rung by `close` to stop the acceptor.
    stop: Doorbell,
    /// Rung when the acceptor should look again: room in the backlog, no thread in `accept`.
    kick: Doorbell,
    /// The acceptor sleeps for want of room in the backlog: a finished handshake kicks it
    /// (otherwise a handshake costs no wake-up of the acceptor).
    wants_room: AtomicBool,
    /// Announced clients by address. Several may wait for one address (an engine whose
    /// connect failed because the 4-tuple was still in use leaves one until its cancel
    /// arrives), oldest first: none is ever lost to a later one.
    intents: Mutex<HashMap<SocketAddr, VecDeque<Announced>>>,
    page: Option<ListenerPage>,
    _slot: LstSlot,
    /// Another process's view of a listening socket it shares with the process that made the
    /// listener (`ListenerCore::start_view`): no registration of its own, and closing it
    /// leaves the socket listening.
    view: bool,
    closed: AtomicBool,
    nonblocking: AtomicBool,
    readiness: OnceLock<OwnedFd>,
    /// Shared by every process holding the socket: the maker's, a view's from its maker.
    handoff: Option<Arc<Handoff>>,
    /// The buffer sizes the program set on the listening socket, read when it became an SMC
    /// listener: its connections' DMB and send buffer (as the kernel's accepted SMC socket
    /// takes its listener's, `smc_adjust_sock_bufsizes`).
    bufs: crate::driver::connect::UserBufs,
    /// Application threads waiting in `accept` (they take new connections themselves, so the
    /// acceptor stays out of their way).
    waiters: AtomicUsize,
    /// The process forked since the listener was made ([`ListenerCore::note_fork`]): other
    /// processes may accept from the socket.
    forked: AtomicBool,
    /// The application called `accept` since the last fork.
    accepting: AtomicBool,
    /// Rung when the backlog has room again while threads in `accept` wait for that
    /// (`starved`): in the readiness set, so it wakes one waiter.
    room: Doorbell,
    /// Threads in `accept` that found the backlog full and wait for room.
    starved: AtomicUsize,
    /// `room` was rung and not drained since (it must not stay readable: an event loop
    /// polling the readiness would spin on it).
    room_rung: AtomicBool,
    /// Where the SMC option program is in effect: its maps and the keys this listener is
    /// registered under (renewed when smcd is registered with again).
    option: Mutex<Option<OptionReg>>,
    /// The congested flag last written to the option program's map.
    option_congested: AtomicBool,
    /// Handshakes the application's event loop drives (see the module docs).
    inline: Mutex<Inline>,
    /// How many are in `inline` (read without its lock on every `accept`).
    inline_count: AtomicUsize,
}

/// The handshakes waiting for bytes in the application's readiness descriptor: a nested epoll
/// instance (one-shot per wait: a handshake is taken out while a thread steps it), and a
/// timer for the earliest deadline, both in the readiness set.
#[derive(Debug, Default)]
struct Inline {
    ep: Option<OwnedFd>,
    timer: Option<OwnedFd>,
    /// When the timer goes off (`None`: disarmed).
    armed: Option<Instant>,
    table: HashMap<u64, (Hs, Instant)>,
    timers: BTreeSet<(Instant, u64)>,
    next: u64,
}

impl Inline {
    /// Takes `hs`'s socket out of the nested set, if it is in it.
    fn unregister(&self, hs: &mut Hs) {
        if let (true, Some(ep), Some(fd)) = (hs.parked, self.ep.as_ref(), hs.fd()) {
            let _ = rustix::event::epoll::delete(ep, fd);
        }
        hs.parked = false;
    }

    /// Arms the timer for the earliest deadline, or disarms it when there is none. An armed
    /// timer is left alone while it goes off no later than `TIMER_SLACK` after the earliest
    /// deadline: deadlines come in order, so the earliest mostly moves later as handshakes
    /// finish, and a timer that goes off early only makes the next `accept()` look and arm it
    /// again (one `timerfd_settime` per connection before).
    fn rearm(&mut self) {
        const TIMER_SLACK: Duration = Duration::from_millis(100);
        let first = self.timers.first().map(|(at, _)| *at);
        match (first, self.armed) {
            (None, None) => return,
            (Some(at), Some(armed)) if armed <= at + TIMER_SLACK => return,
            _ => {}
        }
        let Some(timer) = &self.timer else { return };
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let value = match first {
            // Relative, at least a microsecond: zero would disarm it.
            Some(at) => {
                let left = at
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_micros(1));
                rustix::time::Timespec {
                    tv_sec: left.as_secs() as i64,
                    tv_nsec: i64::from(left.subsec_nanos()),
                }
            }
            None => zero,
        };
        let spec = rustix::time::Itimerspec {
            it_interval: zero,
            it_value: value,
        };
        if rustix::time::timerfd_settime(timer, rustix::time::TimerfdTimerFlags::empty(), &spec)
            .is_ok()
        {
            self.armed = first;
        }
    }
}

/// A listener's registration with the SMC option program.
#[derive(Debug)]
struct OptionReg {
    maps: crate::bpf::Maps,
    keys: Vec<crate::bpf::ListenerKey>,
}

impl Drop for OptionReg {
    fn drop(&mut self) {
        let _ = self.maps.unregister_listener(&self.keys);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn canon(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

impl ListenerCore {
    /// Listens on `tcp` (bound and listening) and registers with `smcd`.
    pub fn start(
        engine: Arc<Engine>,
        tcp: TcpListener,
        opts: ListenOptions,
    ) -> io::Result<Arc<Self>> {
        let handoff = match Handoff::new() {
            Ok(h) => Some(Arc::new(h)),
            Err(e) => {
                tracing::debug!("listener without a hand-off queue: {e}");
                None
            }
        };
        Self::start_inner(engine, tcp, opts, false, handoff)
    }

    /// Accepts from `tcp`, a listening socket another process made an SMC listener of and
    /// this process shares with it (a forked worker of a server whose master listened), with
    /// this process's `engine`: nothing is registered (the maker's registration stands for
    /// the socket); the SMC option program's map says which accepted connections carry a
    /// Proposal. Intents go to the maker's channel, which this process does not read: the
    /// maker's listener must say so to smcd ([`ListenerCore::set_shared`]).
    /// `of` is the maker's listener as this process has it (a fork's copy): the view shares
    /// its hand-off queue.
    pub fn start_view(
        engine: Arc<Engine>,
        tcp: TcpListener,
        opts: ListenOptions,
        of: &ListenerCore,
    ) -> io::Result<Arc<Self>> {
        Self::start_inner(engine, tcp, opts, true, of.handoff.clone())
    }

    /// Another process accepts from this listener's socket too: smcd answers intents for it
    /// with plain TCP from now on (only the SMC option tells those processes' connections
    /// apart).
    pub fn set_shared(&self) {
        if let Some(p) = &self.page {
            p.set_shared();
        }
    }

    fn start_inner(
        engine: Arc<Engine>,
        tcp: TcpListener,
        opts: ListenOptions,
        view: bool,
        handoff: Option<Arc<Handoff>>,
    ) -> io::Result<Arc<Self>> {
        tcp.set_nonblocking(true)?;
        let local = tcp.local_addr()?;
        let bufs = crate::driver::connect::user_bufsizes(&tcp);
        // Register first: the namespace's sysctls come from smcd, and the slot below must
        // land in the status area smcd reads.
        let _ = engine.attached();
        let hs_limit = opts
            .limit_hs
            .unwrap_or_else(|| engine.settings().limit_smc_hs);
        let backlog = opts.backlog.max(1) as usize;
        let (page, page_fd) = match ListenerPage::create() {
            Ok((p, fd)) => (Some(p), Some(fd)),
            Err(_) => (None, None),
        };
        let slot = engine.status().listener_slot();
        slot.publish(&LstRecord {
            addr: local,
            inode: rustix::fs::fstat(&tcp).map_or(0, |s| s.st_ino),
            backlog: backlog as u32,
            hs_limit,
        });
        let core = Arc::new(Self {
            bufs,
            tcp,
            engine,
            local,
            backlog,
            hs_limit,
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            reactor: ReactorInbox {
                queue: Mutex::new(Vec::new()),
                bell: Doorbell::new()?,
                started: AtomicBool::new(false),
            },
            bell: Doorbell::new()?,
            chan: Mutex::new(None),
            page_fd,
            last_register: Mutex::new(None),
            stop: Doorbell::new()?,
            kick: Doorbell::new()?,
            wants_room: AtomicBool::new(false),
            intents: Mutex::new(HashMap::new()),
            page,
            _slot: slot,
            view,
            closed: AtomicBool::new(false),
            nonblocking: AtomicBool::new(false),
            readiness: OnceLock::new(),
            handoff,
            waiters: AtomicUsize::new(0),
            forked: AtomicBool::new(false),
            accepting: AtomicBool::new(false),
            room: Doorbell::new()?,
            starved: AtomicUsize::new(0),
            room_rung: AtomicBool::new(false),
            option: Mutex::new(None),
            option_congested: AtomicBool::new(false),
            inline: Mutex::new(Inline::default()),
            inline_count: AtomicUsize::new(0),
        });
        if view {
            // The option program's map, for looking up accepted connections only.
            let lookup = core.engine.attached().and_then(|a| {
                let maps = a.session.option_path()?.try_clone().ok()?;
                Some(OptionReg {
                    maps,
                    keys: Vec::new(),
                })
            });
            *lock(&core.option) = lookup;
        } else {
            core.register();
        }
        Ok(core)
    }

    /// Registers with smcd (again, after a restart) and starts the acceptor that watches the
    /// intent channel. Without smcd every client is plain TCP, which works too.
    fn register(self: &Arc<Self>) {
        // Held throughout: one registration at a time, and none while one is live.
        let mut last = lock(&self.last_register);
        if lock(&self.chan).is_some() {
            return;
        }
        *last = Some(Instant::now());
        let Some(a) = self.engine.attached() else {
            return;
        };
        self.register_option(&a.session);
        let page = self.page_fd.as_ref().map(|f| f.as_fd());
        match a
            .session
            .listen(self.local, self.backlog as u32, self.hs_limit, page)
        {
            Ok((ch, _id)) => {
                let Ok(fd) = crate::sys::dup_banded(&ch) else {
                    return;
                };
                *lock(&self.chan) = Some(ch);
                let c = Arc::clone(self);
                let _ = std::thread::Builder::new()
                    .name("smc-accept".into())
                    .spawn(move || c.acceptor(fd));
            }
            Err(e) => {
                tracing::debug!("listener registration with smcd failed: {e}");
                self.engine.smcd_failed(&a.session);
            }
        }
    }

    /// Registers in the SMC option program's listener map of this smcd session (the maps of an
    /// earlier smcd went with it; the old registration is dropped). Without the program,
    /// or when registering fails, the listener takes intents only.
    fn register_option(&self, session: &crate::ipc::SmcdSession) {
        let reg = session.option_path().and_then(|m| {
            let maps = m.try_clone().ok()?;
            match maps.register_listening_socket(&self.tcp) {
                Ok(keys) => Some(OptionReg { maps, keys }),
                Err(e) => {
                    tracing::debug!("listener not registered with the SMC option program: {e}");
                    None
                }
            }
        });
        if let Some(r) = &reg
            && self.hs_limit
            && self.option_congested.load(Ordering::Relaxed)
        {
            let _ = r.maps.set_congested(&r.keys, true);
        }
        *lock(&self.option) = reg;
    }

    /// Whether the option program says this accepted connection carries a Proposal: its SYN
    /// had the option and our SYN-ACK echoed it.
    fn option_says_smc(&self, sock: &TcpStream) -> bool {
        lock(&self.option).as_ref().is_some_and(|r| {
            r.maps
                .sock_option(sock)
                .is_ok_and(|o| o.clc_runs() == Some(true))
        })
    }

    /// After smcd went away, tries to register again (at most once a second).
    fn reregister_if_needed(self: &Arc<Self>) {
        if self.view || lock(&self.chan).is_some() || self.closed.load(Ordering::Acquire) {
            return;
        }
        if lock(&self.last_register).is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        self.register();
    }

    /// Whether the acceptor should take connections while nobody accepts: an intent waits for
    /// its connection, or (with the option program) any new connection may be an SMC client
    /// whose connect must finish meanwhile (the kernel's listen work).
    ///
    /// On the option path after a fork, only while this process's program accepts from the
    /// socket: the connections the acceptor takes queue for this process alone, and a server
    /// whose master listens and never accepts (its forked workers do, or a child it left the
    /// socket to) would otherwise take clients into a queue nobody reads (the kernel has one
    /// queue, served by whichever process accepts). An intent is this process's to serve
    /// whatever it does: smcd announced the client here, and only here is it known to send a
    /// Proposal (a view's first accept marks the socket shared, which ends intents for it;
    /// until then a client announced to a master that never accepts waits in its queue, as
    /// before: the SMC option path has no such window).
    fn acceptor_needed(&self) -> bool {
        self.intents_pending()
            || ((!self.forked.load(Ordering::Acquire) || self.accepting.load(Ordering::Acquire))
                && lock(&self.option).is_some())
    }

    /// The process is about to fork: from now on the socket is shared with a process that
    /// may accept from it, and on the option path the acceptor takes connections for this
    /// process only once its program accepts again ([`ListenerCore::acceptor_needed`]).
    pub fn note_fork(&self) {
        self.accepting.store(false, Ordering::Release);
        self.forked.store(true, Ordering::Release);
        self.kick.ring();
    }

    /// Takes a connection off the kernel's queue, counted where every holder counts its takes
    /// (so that a holder that does not take can tell the queue is served).
    fn take_queued(&self) -> rustix::io::Result<(TcpStream, SocketAddr)> {
        let taken = accept_from(&self.tcp)?;
        if let Some(h) = &self.handoff {
            h.note_taken();
        }
        Ok(taken)
    }

    /// A connection another holder took off the kernel's queue for whoever accepts next
    /// ([`ListenerCore::serve_unserved`]): plain TCP, its Proposal (if it had one) declined.
    fn take_handed(&self) -> Option<Accepted> {
        let (sock, why) = self.handoff.as_ref()?.take()?;
        let peer = sock.peer_addr().ok()?;
        Some(Accepted {
            outcome: Outcome::Tcp(sock, Fallback::local(why)),
            peer,
        })
    }

    /// Forked, and this process's program does not accept ([`ListenerCore::acceptor_needed`]):
    /// when the kernel's queue has held connections for [`UNSERVED_AFTER`] while no holder took
    /// any, takes them all. An SMC client's Proposal is declined (NOSMCDEV, as when no device
    /// serves: both ends go TCP) and the connection is handed to whichever holder accepts next
    /// ([`Handoff`]), so nobody's connect waits for an `accept`: the kernel's listen work
    /// answers too, whoever accepts later. Other connections are handed on as they are.
    fn serve_unserved(self: &Arc<Self>, seen: &mut Option<(Instant, u64)>) {
        let Some(h) = self.handoff.clone() else {
            return;
        };
        if h.stopped() || queued(&self.tcp) == 0 {
            *seen = None;
            return;
        }
        let taken = h.taken();
        match *seen {
            Some((since, n)) if n == taken && since.elapsed() >= UNSERVED_AFTER => {}
            Some((_, n)) if n == taken => return,
            _ => {
                *seen = Some((Instant::now(), taken));
                return;
            }
        }
        *seen = None;
        let status = self.engine.status();
        while let Ok((sock, peer)) = self.take_queued() {
            let Some(gid) = self.announced(&sock, peer) else {
                // As `sort` counts a client that sends no Proposal.
                status.add(st::T_SRV_FBACK + st::fback_index(ReasonCode::PEERNOSMC), 1);
                h.give(sock, ReasonCode::PEERNOSMC);
                continue;
            };
            let mut run = DeclineRun::new(sock, Instant::now());
            let until = Instant::now() + UNSERVED_PROPOSAL;
            loop {
                match run.step() {
                    Ok(ServerStep::Done(Outcome::Tcp(sock, fb))) => {
                        status.add(path_stat(gid), 1);
                        status.add(st::T_SRV_FBACK + st::fback_index(fb.local), 1);
                        h.give(sock, fb.local);
                        break;
                    }
                    Ok(ServerStep::Wait) if Instant::now() < until => {
                        if let Some(fd) = run.fd() {
                            let _ = crate::sys::wait_readable(fd, Some(UNSERVED_LOOK));
                        }
                    }
                    other => {
                        // No Proposal in time, or the client went away: it is closed, as a
                        // handshake that failed.
                        tracing::debug!("unserved client {peer} dropped: {other:?}");
                        status.add(st::T_SRV_HS_ERR, 1);
                        break;
                    }
                }
            }
        }
    }

    /// Whether an intent is waiting for its connection.
    fn intents_pending(&self) -> bool {
        lock(&self.intents)
            .values()
            .flatten()
            .any(|(_, _, at)| at.elapsed() < INTENT_ATTENTION)
    }

    /// The acceptor: sleeps on the intent channel; while intents are pending, takes
    /// connections from the kernel's queue so SMC clients finish their handshake even when
    /// the application is not accepting. It sleeps without a timeout: whatever changes what
    /// it should watch (room in the backlog, the last thread leaving `accept`) kicks it.
    fn acceptor(self: Arc<Self>, chan_fd: OwnedFd) {
        let chan_fd = &chan_fd;
        // The kernel's queue as last seen non-empty while nobody here took from it: since
        // when, and the holders' count of connections taken then.
        let mut unserved: Option<(Instant, u64)> = None;
        let look = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: UNSERVED_LOOK.as_nanos() as i64,
        };
        loop {
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            // Work in fork-safe sections (`crate::fork`), the wait in `poll` outside them.
            let busy = crate::fork::busy();
            if lock(&self.chan).is_none() {
                // smcd went away (seen by `sort`): register again below.
                break;
            }
            let pending = self.acceptor_needed();
            // Announced before looking at the backlog: a handshake that finishes after the
            // look sees the flag and kicks.
            self.wants_room.store(pending, Ordering::SeqCst);
            let room = {
                let st = lock(&self.state);
                st.in_progress + st.ready.len() < self.backlog
            };
            if room {
                self.wants_room.store(false, Ordering::Relaxed);
            }
            self.kick.drain();
            let mut fds = vec![
                PollFd::new(&self.stop, PollFlags::IN),
                PollFd::new(chan_fd, PollFlags::IN),
                PollFd::new(&self.kick, PollFlags::IN),
            ];
            // Threads in accept() take the connections themselves (one woken per connection);
            // the acceptor joins in only while nobody accepts.
            // An event loop that drives its handshakes takes its connections itself too.
            if pending && room && self.waiters.load(Ordering::Acquire) == 0 && !self.driven() {
                fds.push(PollFd::new(&self.tcp, PollFlags::IN));
            }
            // Forked, and this process's program does not accept: the other holders take
            // connections, or, if none does for UNSERVED_AFTER, this one hands them on.
            let watch = !pending && self.forked.load(Ordering::Acquire) && self.handoff.is_some();
            if !watch {
                unserved = None;
            }
            drop(busy);
            if let Err(e) = rustix::event::poll(&mut fds, watch.then_some(&look))
                && e != rustix::io::Errno::INTR
            {
                return;
            }
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            let _busy = crate::fork::busy();
            if watch && room {
                self.serve_unserved(&mut unserved);
            }
            let chan_event = !fds[1].revents().is_empty();
            let tcp_ready = fds.get(3).is_some_and(|f| !f.revents().is_empty());
            if chan_event {
                self.drain_intents();
                if lock(&self.chan).is_none() {
                    break;
                }
            }
            if tcp_ready {
                match self.take_queued() {
                    Ok((sock, peer)) => {
                        if let Some(a) = self.sort(sock, peer, false) {
                            let mut st = lock(&self.state);
                            st.ready.push_back(a);
                            self.bell.ring();
                        }
                    }
                    Err(_) => continue,
                }
            }
        }
        // smcd went away: register again once it is back (a new acceptor takes over then);
        // meanwhile every client is plain TCP.
        loop {
            std::thread::sleep(Duration::from_secs(1));
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            self.register();
            if lock(&self.chan).is_some() {
                return;
            }
        }
    }

    /// The engine the listener belongs to.
    pub fn engine(&self) -> Arc<Engine> {
        Arc::clone(&self.engine)
    }

    /// The TCP listener.
    pub fn tcp_socket(&self) -> BorrowedFd<'_> {
        self.tcp.as_fd()
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Whether handshake limitation is on for this listener.
    pub fn hs_limit(&self) -> bool {
        self.hs_limit
    }

    /// Handshakes in progress: waiting for bytes, queued for a worker, or being worked on.
    pub fn handshakes_in_progress(&self) -> usize {
        lock(&self.state).in_progress
    }

    /// Publishes the congestion state: work is queued and no worker is free for it.
    /// Handshakes that wait for their peer's bytes are not congestion, however many.
    fn publish_load(&self, st: &State) {
        if let Some(p) = &self.page {
            // Work queued with every worker busy, or more handshakes held up behind first
            // contacts than there are workers: handshakes not yet served.
            let congested = (st.jobs.len() > st.idle_workers
                && st.active_workers() >= max_workers())
                || st.waiting_workers > max_workers();
            p.set(congested, st.in_progress as u32);
            // The option program's flag follows transitions only (one map update each): a
            // congested listener's SYN-ACKs go out without the option (`smc_hs_congested`).
            if self.hs_limit
                && self.option_congested.swap(congested, Ordering::Relaxed) != congested
                && let Some(r) = lock(&self.option).as_ref()
            {
                let _ = r.maps.set_congested(&r.keys, congested);
            }
        }
    }

    /// Moves the intents smcd announced into the table (non-blocking).
    fn drain_intents(&self) {
        let mut chan = lock(&self.chan);
        let Some(ch) = chan.as_mut() else { return };
        loop {
            match ch.try_receive() {
                Ok(Some((Ok(msg), _, _))) => {
                    let mut t = lock(&self.intents);
                    match msg.cmd {
                        LoopbackCmd::Intent => {
                            if let (Some(addr), Some(gid), Some(id)) =
                                (msg.remote_addr(), msg.gid(), msg.intent_id())
                            {
                                if t.len() >= MAX_INTENTS {
                                    t.clear();
                                }
                                t.entry(canon(addr)).or_default().push_back((
                                    gid,
                                    id,
                                    Instant::now(),
                                ));
                            }
                        }
                        LoopbackCmd::IntentCancel => {
                            // A client that registered and then did not connect (rare).
                            if let Some(id) = msg.intent_id() {
                                t.retain(|_, q| {
                                    q.retain(|e| e.1 != id);
                                    !q.is_empty()
                                });
                            }
                        }
                        _ => {}
                    }
                }
                Ok(Some((Err(_), _, _))) => {}
                Ok(None) => return,
                Err(_) => {
                    // smcd went away: no more intents; clients cannot register either. The
                    // engine opens its device anew on next use, and accept() registers again.
                    *chan = None;
                    lock(&self.intents).clear();
                    if let Some(a) = self.engine.attached_now() {
                        self.engine.smcd_failed(&a.session);
                    }
                    return;
                }
            }
        }
    }

    /// Sorts one accepted TCP connection: plain now, or a handshake, which runs here as far as
    /// it can without waiting (or, with `linger`, waiting briefly for the client's next
    /// message: see [`Self::drive`]). Returns the connection if it is done: plain, or its
    /// handshake ended here.
    fn sort(self: &Arc<Self>, sock: TcpStream, peer: SocketAddr, linger: bool) -> Option<Accepted> {
        // (Accepted sockets are blocking: accept4 without SOCK_NONBLOCK.)
        match self.announced(&sock, peer) {
            Some(gid) => {
                self.engine.status().add(path_stat(gid), 1);
                self.start_handshake(sock, peer, gid, linger)
            }
            None => {
                let status = self.engine.status();
                status.add(st::T_SRV_FBACK + st::fback_index(ReasonCode::PEERNOSMC), 1);
                Some(Accepted {
                    outcome: Outcome::Tcp(sock, Fallback::local(ReasonCode::PEERNOSMC)),
                    peer,
                })
            }
        }
    }

    /// Whether the client of an accepted connection sends a Proposal: by the SMC option
    /// (`Some(None)`) or announced by smcd with its GID (`Some(Some(gid))`, the intent taken).
    fn announced(&self, sock: &TcpStream, peer: SocketAddr) -> Option<Option<Gid>> {
        // The SMC option first (a client that marked its socket, and asked smcd nothing): one
        // map lookup. A client of the intent path sent no option (the engine uses one path
        // per connection), so only without it is the intent table looked at.
        if self.option_says_smc(sock) {
            Some(None)
        } else {
            // smcd wrote the intent before it answered the client, and the client connected
            // only after that answer: if there is one, it is in our socket buffer now.
            self.drain_intents();
            let mut t = lock(&self.intents);
            let key = canon(peer);
            let g = t
                .get_mut(&key)
                .and_then(VecDeque::pop_front)
                .map(|(g, _, _)| g);
            if t.get(&key).is_some_and(VecDeque::is_empty) {
                t.remove(&key);
            }
            g.map(Some)
        }
    }

    /// Starts the handshake of an announced client (by smcd with its GID, or by the SMC option
    /// with `None`) and drives it here as far as it goes ([`Self::drive`]). Nothing here
    /// blocks beyond `linger`'s bound (the accept path runs it).
    fn start_handshake(
        self: &Arc<Self>,
        sock: TcpStream,
        peer: SocketAddr,
        gid: Option<Gid>,
        linger: bool,
    ) -> Option<Accepted> {
        let accepted = Instant::now();
        // The socket stays blocking (as the outcome's must be): the handshake's reads and
        // writes pass MSG_DONTWAIT.
        let run = match self.engine.attached_now() {
            Some(a) => Run::Smc(Box::new(ServerRun::new(
                &self.engine,
                &a.ism,
                sock,
                gid,
                &self.bufs.apply(self.engine.settings()),
                accepted,
            ))),
            // The device vanished between intent and accept: decline, both go TCP.
            None => Run::Decline(DeclineRun::new(sock, accepted)),
        };
        {
            let mut st = lock(&self.state);
            st.in_progress += 1;
            self.publish_load(&st);
        }
        self.drive(
            Hs {
                run,
                peer,
                parked: false,
            },
            linger,
            false,
        )
    }

    /// Runs a handshake on the accepting thread as far as it goes without a hand-over: its
    /// steps, and its work where nothing in it waits ([`ServerRun::work_now`]: a ready group
    /// with a pooled DMB, an attached client DMB). In the steady state that is the whole
    /// handshake, and the connection comes back to the caller with no other thread woken;
    /// what would wait goes to a worker, what waits for bytes to the reactor.
    ///
    /// With `linger` (a blocking `accept`), a handshake that waits for the client's next
    /// message waits here for it, at most [`WORKER_LINGER`] per wait and [`ACCEPT_LINGER`] in
    /// all, and only while nothing else needs this thread: with no other thread in `accept`,
    /// a new connection in the kernel's queue or a finished handshake ends the wait at once,
    /// so a client that does not answer delays nobody (it goes to the reactor). A client
    /// answers in a round trip, and the hand-overs it saves (reactor, worker, the `accept`
    /// waiter woken for the result) cost more than that.
    ///
    /// `expired`: the handshake's deadline had passed when it was taken up; if it still
    /// waits, it ends as a timeout.
    fn drive(self: &Arc<Self>, mut hs: Hs, linger: bool, expired: bool) -> Option<Accepted> {
        let until = Instant::now() + ACCEPT_LINGER;
        loop {
            match hs.step() {
                Ok(ServerStep::Work) => {
                    if !hs.work_now() {
                        self.submit(hs);
                        return None;
                    }
                }
                Ok(ServerStep::Wait) if expired && Instant::now() >= hs.deadline() => {
                    let peer = hs.peer;
                    drop(hs);
                    let e = io::Error::new(io::ErrorKind::TimedOut, "CLC handshake timed out");
                    return self.finished(peer, Err(e));
                }
                Ok(ServerStep::Wait) => {
                    if !(linger && hs.waits_to_read() && self.linger(&hs, until)) {
                        self.to_reactor(hs);
                        return None;
                    }
                }
                Ok(ServerStep::Done(o)) => return self.finished(hs.peer, Ok(o)),
                Err(e) => {
                    let peer = hs.peer;
                    drop(hs);
                    return self.finished(peer, Err(e));
                }
            }
        }
    }

    /// Waits until `hs`'s socket is readable, at most [`WORKER_LINGER`] and not past `until`;
    /// with no other thread in `accept`, a new connection or a finished handshake ends the
    /// wait too. Returns whether the socket is readable.
    fn linger(&self, hs: &Hs, until: Instant) -> bool {
        let left = until
            .saturating_duration_since(Instant::now())
            .min(WORKER_LINGER);
        let Some(fd) = hs.fd() else { return false };
        if left.is_zero() || self.closed.load(Ordering::Acquire) {
            return false;
        }
        let ts = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: left.as_nanos() as i64,
        };
        let alone = self.waiters.load(Ordering::Acquire) == 0;
        let mut fds = vec![
            PollFd::new(&fd, PollFlags::IN),
            PollFd::new(&self.stop, PollFlags::IN),
        ];
        if alone {
            fds.push(PollFd::new(&self.tcp, PollFlags::IN));
            fds.push(PollFd::new(&self.bell, PollFlags::IN));
        }
        matches!(rustix::event::poll(&mut fds, Some(&ts)), Ok(n) if n > 0)
            && !fds[0].revents().is_empty()
            && fds[1..].iter().all(|f| f.revents().is_empty())
    }

    /// Hands a handshake to the reactor (starting it with the first one).
    fn to_reactor(self: &Arc<Self>, hs: Hs) {
        if self.closed.load(Ordering::Acquire) {
            return self.finish(hs.peer, Err(io::Error::other("listener closed")));
        }
        let hs = if self.driven() {
            match self.park(hs) {
                None => return,
                // It could not be parked: the reactor takes it.
                Some(hs) => hs,
            }
        } else {
            hs
        };
        lock(&self.reactor.queue).push(hs);
        self.start_reactor_and_ring();
    }

    /// Tells the reactor about its queue, starting it with the first handshake.
    fn start_reactor_and_ring(self: &Arc<Self>) {
        if !self.reactor.started.swap(true, Ordering::AcqRel) {
            let c = Arc::clone(self);
            if let Err(e) = std::thread::Builder::new()
                .name("smc-hs-reactor".into())
                .spawn(move || c.reactor())
            {
                // Without a reactor no handshake can wait: they end here (their clients
                // see the connection close).
                tracing::warn!("no handshake reactor: {e}");
                self.reactor.started.store(false, Ordering::Release);
                let lost: Vec<_> = lock(&self.reactor.queue).drain(..).collect();
                for hs in lost {
                    self.finish(hs.peer, Err(io::Error::other("no handshake reactor")));
                }
                return;
            }
        }
        self.reactor.bell.ring();
    }

    /// Handshakes parked in the readiness descriptor's nested set (see [`Inline`]).
    pub fn handshakes_parked(&self) -> usize {
        self.inline_count.load(Ordering::Acquire)
    }

    /// Whether the application's event loop drives the handshakes: a non-blocking listener
    /// whose readiness descriptor was handed out.
    fn driven(&self) -> bool {
        self.nonblocking.load(Ordering::Relaxed) && self.readiness.get().is_some()
    }

    /// Parks a handshake that waits for bytes in the readiness descriptor's nested set
    /// ([`Inline`]); gives it back if that cannot be done.
    fn park(&self, hs: Hs) -> Option<Hs> {
        use rustix::event::epoll;
        let mut inl = lock(&self.inline);
        let (Some(ep), Some(fd)) = (inl.ep.as_ref(), hs.fd()) else {
            drop(inl);
            return Some(hs);
        };
        let id = inl.next;
        // One shot: the event takes it out of the set (a registration added while its socket
        // is ready reports at once, so nothing that came before is missed). Writability only
        // when it waits for room: a connected socket is always writable, and each new
        // registration would report it again.
        let mut flags = epoll::EventFlags::IN
            | epoll::EventFlags::RDHUP
            | epoll::EventFlags::ET
            | epoll::EventFlags::ONESHOT;
        if !hs.waits_to_read() {
            flags |= epoll::EventFlags::OUT;
        }
        let data = epoll::EventData::new_u64(id);
        let r = if hs.parked {
            epoll::modify(ep, fd, data, flags)
        } else {
            epoll::add(ep, fd, data, flags)
        };
        if r.is_err() {
            drop(inl);
            return Some(hs);
        }
        let mut hs = hs;
        hs.parked = true;
        inl.next += 1;
        let at = hs.deadline();
        inl.timers.insert((at, id));
        inl.table.insert(id, (hs, at));
        self.inline_count.store(inl.table.len(), Ordering::Release);
        inl.rearm();
        None
    }

    /// Runs the parked handshakes whose sockets are ready or whose deadlines passed, on the
    /// calling thread (an `accept()` of the event loop); what finishes joins the ready queue.
    fn step_inline(self: &Arc<Self>) {
        use rustix::event::epoll;
        if self.inline_count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut due = Vec::new();
        {
            let mut inl = lock(&self.inline);
            let Some(ep) = inl.ep.as_ref() else { return };
            let mut events = Vec::with_capacity(64);
            let zero = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            let _ = epoll::wait(ep, rustix::buffer::spare_capacity(&mut events), Some(&zero));
            let now = Instant::now();
            // A one-shot registration that fired is disabled already. One taken for its
            // deadline is still armed and leaves the set: if the handshake then finished,
            // its socket's next event (the connection's end) would make the set ready with
            // nothing parked, and `accept()` looks into the set only while something is.
            let mut take = |inl: &mut Inline, id: u64, expired: bool| {
                if let Some((mut hs, at)) = inl.table.remove(&id) {
                    inl.timers.remove(&(at, id));
                    if expired {
                        inl.unregister(&mut hs);
                    }
                    due.push((hs, expired));
                }
            };
            for ev in &events {
                take(&mut inl, ev.data.u64(), false);
            }
            while let Some(&(at, id)) = inl.timers.first() {
                if at > now {
                    break;
                }
                take(&mut inl, id, true);
            }
            if inl.armed.is_some_and(|t| t <= now)
                && let Some(timer) = &inl.timer
            {
                let mut b = [0u8; 8];
                let _ = rustix::io::read(timer, &mut b);
                inl.armed = None;
            }
            inl.rearm();
            self.inline_count.store(inl.table.len(), Ordering::Release);
        }
        let mut done = Vec::new();
        for (hs, expired) in due {
            if let Some(a) = self.drive(hs, false, expired) {
                done.push(a);
            }
        }
        if !done.is_empty() {
            let mut st = lock(&self.state);
            st.ready.extend(done);
            self.bell.ring();
        }
    }

    /// Every parked handshake, out of the nested set (the timer disarmed).
    fn take_parked(&self) -> Vec<Hs> {
        let mut inl = lock(&self.inline);
        inl.timers.clear();
        let mut all: Vec<Hs> = inl.table.drain().map(|(_, (hs, _))| hs).collect();
        for hs in &mut all {
            inl.unregister(hs);
        }
        inl.rearm();
        self.inline_count.store(0, Ordering::Release);
        all
    }

    /// The parked handshakes go to the reactor (the listener became blocking, or closes).
    fn unpark_all(self: &Arc<Self>) {
        for hs in self.take_parked() {
            if self.closed.load(Ordering::Acquire) {
                let peer = hs.peer;
                drop(hs);
                self.finish(peer, Err(io::Error::other("listener closed")));
            } else {
                lock(&self.reactor.queue).push(hs);
                self.start_reactor_and_ring();
            }
        }
    }

    /// The reactor: every handshake that waits for its peer's bytes (or room to write) is
    /// registered edge-triggered on one epoll instance, with its deadline in a timer set. A
    /// handshake whose step asks for work goes to a worker and comes back through the inbox.
    fn reactor(self: Arc<Self>) {
        use rustix::event::epoll;
        let Ok(ep) = epoll::create(epoll::CreateFlags::CLOEXEC).map(crate::sys::banded) else {
            return self.reactor_failed();
        };
        const BELL: u64 = u64::MAX;
        if epoll::add(
            &ep,
            &self.reactor.bell,
            epoll::EventData::new_u64(BELL),
            epoll::EventFlags::IN,
        )
        .is_err()
        {
            return self.reactor_failed();
        }
        let mut table: HashMap<u64, (Hs, Instant)> = HashMap::new();
        let mut timers: BTreeSet<(Instant, u64)> = BTreeSet::new();
        let mut next_id = 0u64;
        let mut events = Vec::with_capacity(64);
        loop {
            if self.closed.load(Ordering::Acquire) {
                break;
            }
            // Work in fork-safe sections (`crate::fork`), the wait in `epoll_wait` outside.
            let busy = crate::fork::busy();
            self.reactor.bell.drain();
            let arrived: Vec<_> = lock(&self.reactor.queue).drain(..).collect();
            for hs in arrived {
                let id = next_id;
                next_id += 1;
                // Edge-triggered: a handshake with a few bytes that cannot be consumed yet
                // (fewer than the four that show CLC) waits for the next bytes, not spins.
                let flags = epoll::EventFlags::IN
                    | epoll::EventFlags::OUT
                    | epoll::EventFlags::RDHUP
                    | epoll::EventFlags::ET;
                let Some(fd) = hs.fd() else { continue };
                if let Err(e) = epoll::add(&ep, fd, epoll::EventData::new_u64(id), flags) {
                    self.finish(hs.peer, Err(e.into()));
                    continue;
                }
                let at = hs.deadline();
                timers.insert((at, id));
                table.insert(id, (hs, at));
                // Bytes that came before it was registered raise no edge: look now.
                self.advance(&ep, &mut table, &mut timers, id, false);
            }
            let timeout = timers.first().map(|(at, _)| {
                let left = at.saturating_duration_since(Instant::now());
                // Rounded up: waking before the deadline would only loop.
                let left = left + Duration::from_micros(999);
                rustix::time::Timespec {
                    tv_sec: left.as_secs() as i64,
                    tv_nsec: i64::from(left.subsec_millis()) * 1_000_000,
                }
            });
            events.clear();
            drop(busy);
            match epoll::wait(
                &ep,
                rustix::buffer::spare_capacity(&mut events),
                timeout.as_ref(),
            ) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    tracing::warn!("handshake reactor: {e}");
                    break;
                }
            }
            let _busy = crate::fork::busy();
            for ev in &events {
                let id = ev.data.u64();
                if id != BELL {
                    self.advance(&ep, &mut table, &mut timers, id, false);
                }
            }
            let now = Instant::now();
            let expired: Vec<u64> = timers
                .iter()
                .take_while(|(at, _)| *at <= now)
                .map(|(_, id)| *id)
                .collect();
            for id in expired {
                self.advance(&ep, &mut table, &mut timers, id, true);
            }
        }
        // Closed (or the epoll instance failed): the handshakes end here, their clients see
        // the close. A later handshake starts a new reactor.
        let lost: Vec<_> = table.into_values().map(|(hs, _)| hs).collect();
        for hs in lost {
            let peer = hs.peer;
            drop(hs);
            self.finish(peer, Err(io::Error::other("listener closed")));
        }
        self.reactor_failed();
    }

    fn reactor_failed(&self) {
        self.reactor.started.store(false, Ordering::Release);
        let lost: Vec<_> = lock(&self.reactor.queue).drain(..).collect();
        for hs in lost {
            self.finish(hs.peer, Err(io::Error::other("no handshake reactor")));
        }
    }

    /// Steps one handshake of the reactor: it waits on (with its deadline renewed), goes to
    /// a worker, or ends. `expired`: its deadline passed; if it still waits (for room to
    /// write), it has timed out.
    fn advance(
        self: &Arc<Self>,
        ep: &OwnedFd,
        table: &mut HashMap<u64, (Hs, Instant)>,
        timers: &mut BTreeSet<(Instant, u64)>,
        id: u64,
        expired: bool,
    ) {
        let Some((mut hs, at)) = table.remove(&id) else {
            // An event of a handshake that has left (a worker has it, or it ended).
            return;
        };
        timers.remove(&(at, id));
        // An outcome takes the socket with it: it leaves the epoll instance by its number.
        let Some(raw) = hs.fd().map(|f| rustix::fd::AsRawFd::as_raw_fd(&f)) else {
            return;
        };
        let r = hs.step();
        match r {
            Ok(ServerStep::Wait) if !expired || Instant::now() < hs.deadline() => {
                let at = hs.deadline();
                timers.insert((at, id));
                table.insert(id, (hs, at));
            }
            Ok(ServerStep::Wait) => {
                // Its deadline passed while it could not even write: it ends as a timeout.
                let peer = hs.peer;
                if let Some(fd) = hs.fd() {
                    let _ = rustix::event::epoll::delete(ep, fd);
                }
                drop(hs);
                let e = io::Error::new(io::ErrorKind::TimedOut, "CLC handshake timed out");
                self.finish(peer, Err(e));
            }
            Ok(ServerStep::Work) if hs.work_now() => {
                // Done here (nothing in it waited): on with the next step.
                timers.insert((at, id));
                table.insert(id, (hs, at));
                self.advance(ep, table, timers, id, expired);
            }
            Ok(ServerStep::Work) => {
                if let Some(fd) = hs.fd() {
                    let _ = rustix::event::epoll::delete(ep, fd);
                }
                self.submit(hs);
            }
            Ok(ServerStep::Done(o)) => {
                // SAFETY: `raw` is open: the outcome in `o` owns it, and it is not closed
                // before the call returns.
                let fd = unsafe { BorrowedFd::borrow_raw(raw) };
                let _ = rustix::event::epoll::delete(ep, fd);
                self.finish(hs.peer, Ok(o));
            }
            Err(e) => {
                // Failed (the deadline passed, the peer closed): the socket closes with it (if
                // it has not already, which took it out of the epoll instance).
                let peer = hs.peer;
                if let Some(fd) = hs.fd() {
                    let _ = rustix::event::epoll::delete(ep, fd);
                }
                drop(hs);
                self.finish(peer, Err(e));
            }
        }
    }

    /// Queues a handshake's bounded work for a worker (starting one if all are busy and
    /// there are fewer than [`max_workers`]).
    fn submit(self: &Arc<Self>, hs: Hs) {
        let mut st = lock(&self.state);
        st.jobs.push_back(hs);
        self.spawn_worker_if_needed(&mut st);
        self.publish_load(&st);
        drop(st);
        // One job, one worker (only workers wait on the condition variable).
        self.cond.notify_one();
    }

    fn spawn_worker_if_needed(self: &Arc<Self>, st: &mut State) {
        if st.needs_worker() {
            st.workers += 1;
            let c = Arc::clone(self);
            if std::thread::Builder::new()
                .name("smc-handshake".into())
                .spawn(move || c.worker())
                .is_err()
            {
                st.workers -= 1;
            }
        }
    }

    /// A worker starts (`true`) or stops (`false`) waiting for a first contact.
    fn first_contact_wait(self: &Arc<Self>, waiting: bool) {
        let mut st = lock(&self.state);
        if waiting {
            st.waiting_workers += 1;
            self.spawn_worker_if_needed(&mut st);
        } else {
            st.waiting_workers -= 1;
        }
        self.publish_load(&st);
    }

    fn worker(self: Arc<Self>) {
        loop {
            let job = {
                let mut st = lock(&self.state);
                loop {
                    if let Some(j) = st.jobs.pop_front() {
                        self.publish_load(&st);
                        break Some(j);
                    }
                    if self.closed.load(Ordering::Acquire) {
                        break None;
                    }
                    st.idle_workers += 1;
                    let (g, timeout) = self
                        .cond
                        .wait_timeout(st, Duration::from_secs(30))
                        .unwrap_or_else(|e| e.into_inner());
                    st = g;
                    st.idle_workers -= 1;
                    if timeout.timed_out() && st.jobs.is_empty() && st.workers > 1 {
                        // An idle worker beyond the first goes away.
                        break None;
                    }
                }
            };
            let Some(mut hs) = job else {
                lock(&self.state).workers -= 1;
                return;
            };
            // Work, then as far as the socket allows; what waits for bytes again goes back
            // to the reactor, unless they come within a brief linger: a client answers the
            // Accept in a round trip, and two hand-overs (to the reactor and back to a
            // worker) would cost a connection more than that wait.
            let mut lingered = false;
            loop {
                // Each step in a fork-safe section (`crate::fork`); the linger outside it.
                let busy = crate::fork::busy();
                if let Run::Smc(r) = &mut hs.run {
                    r.work(&|w| self.first_contact_wait(w));
                }
                let step = hs.step();
                let idle = lock(&self.state).jobs.is_empty();
                drop(busy);
                let _busy;
                match step {
                    Ok(ServerStep::Work) => continue,
                    Ok(ServerStep::Wait)
                        if !lingered && idle && readable_within(&hs, WORKER_LINGER) =>
                    {
                        lingered = true;
                        continue;
                    }
                    Ok(ServerStep::Wait) => {
                        _busy = crate::fork::busy();
                        self.to_reactor(hs);
                        break;
                    }
                    Ok(ServerStep::Done(o)) => {
                        _busy = crate::fork::busy();
                        self.finish(hs.peer, Ok(o));
                        break;
                    }
                    Err(e) => {
                        _busy = crate::fork::busy();
                        let peer = hs.peer;
                        drop(hs);
                        self.finish(peer, Err(e));
                        break;
                    }
                }
            }
        }
    }

    /// A handshake ended: counted, and its connection queued for `accept`.
    fn finish(&self, peer: SocketAddr, result: io::Result<Outcome>) {
        let accepted = self.count(peer, result);
        let mut st = lock(&self.state);
        st.in_progress -= 1;
        if let Some(a) = accepted
            && !self.closed.load(Ordering::Acquire)
        {
            st.ready.push_back(a);
            self.bell.ring();
        }
        self.publish_load(&st);
        drop(st);
        self.room_again();
    }

    /// A handshake ended on the thread that takes its connection: counted, and returned.
    fn finished(&self, peer: SocketAddr, result: io::Result<Outcome>) -> Option<Accepted> {
        let accepted = self.count(peer, result);
        let mut st = lock(&self.state);
        st.in_progress -= 1;
        self.publish_load(&st);
        drop(st);
        self.room_again();
        accepted
    }

    /// Room in the backlog again: the acceptor may take connections, and a thread in `accept`
    /// that waits for room is woken (one: the room goes to one connection), if they wait for
    /// that.
    fn room_again(&self) {
        if self.wants_room.swap(false, Ordering::SeqCst) {
            self.kick.ring();
        }
        if self.starved.load(Ordering::SeqCst) > 0 {
            self.ring_room();
        }
    }

    fn ring_room(&self) {
        self.room_rung.store(true, Ordering::SeqCst);
        self.room.ring();
    }

    fn drain_room(&self) {
        if self.room_rung.swap(false, Ordering::SeqCst) {
            self.room.drain();
        }
    }

    /// Counts a handshake's end; the connection, if it has one.
    fn count(&self, peer: SocketAddr, result: io::Result<Outcome>) -> Option<Accepted> {
        let status = self.engine.status();
        match result {
            Ok(outcome) => {
                match &outcome {
                    Outcome::Smc { .. } => status.add(st::T_SRV_V2_SUCC, 1),
                    Outcome::Tcp(_, fb) => {
                        status.add(st::T_SRV_FBACK + st::fback_index(fb.local), 1)
                    }
                }
                Some(Accepted { outcome, peer })
            }
            Err(e) => {
                // The client went away, broke the protocol after Confirm, or ran out of time.
                tracing::debug!("handshake with {peer} failed: {e}");
                status.add(st::T_SRV_HS_ERR, 1);
                None
            }
        }
    }

    /// Takes the next connection: a finished handshake, or a new TCP connection (plain ones
    /// are returned at once), waiting unless non-blocking.
    pub fn accept(self: &Arc<Self>) -> io::Result<Accepted> {
        self.reregister_if_needed();
        if !self.accepting.load(Ordering::Relaxed) {
            self.accepting.store(true, Ordering::Release);
        }
        if self.inline_count.load(Ordering::Acquire) > 0 {
            if self.driven() {
                self.step_inline();
            } else {
                self.unpark_all();
            }
        }
        loop {
            let room = {
                let mut st = lock(&self.state);
                if let Some(a) = st.ready.pop_front() {
                    if st.ready.is_empty() {
                        self.bell.drain();
                    }
                    drop(st);
                    self.room_again();
                    return Ok(a);
                }
                st.in_progress + st.ready.len() < self.backlog
            };
            if self.closed.load(Ordering::Acquire) {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    "listener closed",
                ));
            }
            if let Some(a) = self.take_handed() {
                return Ok(a);
            }
            if room {
                match self.take_queued() {
                    Ok((sock, peer)) => {
                        // While threads wait for room, the new connections that came meanwhile
                        // woke nobody who could take them: pass the turn on (one wake-up
                        // each, only while the backlog runs full).
                        if self.starved.load(Ordering::SeqCst) > 0 {
                            self.ring_room();
                        }
                        let linger = !self.nonblocking.load(Ordering::Relaxed);
                        if let Some(a) = self.sort(sock, peer, linger) {
                            return Ok(a);
                        }
                        continue;
                    }
                    Err(rustix::io::Errno::AGAIN) => {}
                    Err(rustix::io::Errno::INTR | rustix::io::Errno::CONNABORTED) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            if self.nonblocking.load(Ordering::Relaxed) {
                self.drain_room();
                return Err(io::ErrorKind::WouldBlock.into());
            }
            // Wait for a new TCP connection, a finished handshake, or (when the backlog is
            // full) room. All waiting threads share one epoll instance, whose waiters the
            // kernel wakes one at a time (as it wakes one thread blocked in accept(2)); a
            // poll(2) per thread woke every one of them for every finished handshake: at
            // 2,048 concurrent crr connections, 26 wake-ups per connection in the server.
            if !room {
                self.starved.fetch_add(1, Ordering::SeqCst);
                // Room made between the look above and the count: look again instead.
                let st = lock(&self.state);
                if st.in_progress + st.ready.len() < self.backlog || !st.ready.is_empty() {
                    drop(st);
                    self.starved.fetch_sub(1, Ordering::SeqCst);
                    continue;
                }
            }
            self.waiters.fetch_add(1, Ordering::AcqRel);
            let mut events = Vec::with_capacity(1);
            let r = self.readiness_fd().and_then(|ep| {
                rustix::event::epoll::wait(ep, rustix::buffer::spare_capacity(&mut events), None)?;
                Ok(())
            });
            if !room {
                self.starved.fetch_sub(1, Ordering::SeqCst);
            }
            self.drain_room();
            if self.waiters.fetch_sub(1, Ordering::AcqRel) == 1 && self.acceptor_needed() {
                // Nobody accepts now and an announced client may wait: the acceptor takes over.
                self.kick.ring();
            }
            match r {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Non-blocking accept.
    pub fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Ordering::Relaxed);
        // Whether the acceptor takes connections depends on it (`driven`).
        self.kick.ring();
    }

    /// A descriptor `poll`/`epoll` can wait on: readable when `accept` has something (a new
    /// TCP connection or a finished handshake).
    pub fn readiness_fd(&self) -> io::Result<BorrowedFd<'_>> {
        if let Some(fd) = self.readiness.get() {
            return Ok(fd.as_fd());
        }
        use rustix::event::epoll;
        let ep = crate::sys::banded(epoll::create(epoll::CreateFlags::CLOEXEC)?);
        // Edge-triggered: each new connection and each ring wakes one waiting thread, as
        // the kernel wakes one thread blocked in accept(2) per connection. Level-triggered,
        // a woken thread's epoll_wait put the still-ready descriptor back and woke the next
        // waiter, and so on through all of them, for every connection. (Polled through the
        // epoll descriptor, as an event loop does, readiness still shows what is ready now.)
        let mut sources = vec![
            (self.bell.as_fd(), 0),
            (self.tcp.as_fd(), 1),
            (self.room.as_fd(), 2),
        ];
        // Connections another holder handed on (see `Handoff`).
        if let Some(h) = &self.handoff {
            sources.push((h.rx.as_fd(), 5));
        }
        for (fd, tag) in sources {
            epoll::add(
                &ep,
                fd,
                epoll::EventData::new_u64(tag),
                epoll::EventFlags::IN | epoll::EventFlags::ET,
            )?;
        }
        // The handshakes an event loop drives, and their deadlines (level-triggered: the set
        // shows ready while one of them is).
        {
            let mut inl = lock(&self.inline);
            if inl.ep.is_none() {
                let hs_ep = crate::sys::banded(epoll::create(epoll::CreateFlags::CLOEXEC)?);
                let timer = crate::sys::banded(rustix::time::timerfd_create(
                    rustix::time::TimerfdClockId::Monotonic,
                    rustix::time::TimerfdFlags::NONBLOCK | rustix::time::TimerfdFlags::CLOEXEC,
                )?);
                epoll::add(
                    &ep,
                    &hs_ep,
                    epoll::EventData::new_u64(3),
                    epoll::EventFlags::IN,
                )?;
                epoll::add(
                    &ep,
                    &timer,
                    epoll::EventData::new_u64(4),
                    epoll::EventFlags::IN,
                )?;
                inl.ep = Some(hs_ep);
                inl.timer = Some(timer);
            }
        }
        let _ = self.readiness.set(ep);
        self.kick.ring();
        Ok(self.readiness.get().expect("just set").as_fd())
    }

    /// Stops listening: the TCP listener stops taking connections, queued connections are
    /// closed, handshakes waiting for bytes are closed, workers finish what they started and
    /// exit.
    pub fn close(&self) {
        self.close_inner(true);
    }

    /// Stops being an SMC listener without stopping the socket: as [`ListenerCore::close`]
    /// (registration, option map, threads, queued connections), but the TCP socket keeps
    /// listening for whoever else holds it (a program `exec`s with it inherited). A later
    /// `close` does nothing.
    pub fn detach(&self) {
        self.withdraw();
        self.close_inner(false);
    }

    /// Clients stop being told this listener is SMC-capable, for this process and every other
    /// one that holds the socket: smcd answers intents for it with plain TCP (the page says
    /// shared) and its keys leave the SMC option program's map (SYN-ACKs go out without the
    /// option), while accepted connections are still told apart by the option (the map is
    /// kept for lookups). For a socket that goes on to a program that may not load the
    /// library: it registers again if it does.
    pub fn withdraw(&self) {
        self.set_shared();
        // Whoever serves the socket from now on does not count its takes where this
        // listener's holders look: none of them may take the queue for unserved.
        if let Some(h) = &self.handoff {
            h.stop();
        }
        if let Some(r) = lock(&self.option).as_mut() {
            let _ = r.maps.unregister_listener(&r.keys);
            r.keys.clear();
        }
    }

    /// The socket went on to another program (an `exec` elsewhere passed it on, and
    /// [`ListenerCore::withdraw`] was done there): stops as [`ListenerCore::detach`] does, and
    /// leaves the SMC option program's map alone, since the keys there may be the new
    /// program's registration of the same socket now.
    pub fn abandon(&self) {
        if let Some(r) = lock(&self.option).as_mut() {
            r.keys.clear();
        }
        self.close_inner(false);
    }

    fn close_inner(&self, shut: bool) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if shut && !self.view {
            // (A view's socket listens on for the processes that share it.)
            let _ = rustix::net::shutdown(&self.tcp, rustix::net::Shutdown::Read);
        }
        let ready: Vec<_> = lock(&self.state).ready.drain(..).collect();
        drop(ready);
        *lock(&self.chan) = None;
        // Unregistered from the option program's map (OptionReg's drop).
        lock(&self.option).take();
        self.stop.ring();
        self.reactor.bell.ring();
        self.cond.notify_all();
        // Parked handshakes end with the listener (their clients see the close).
        for hs in self.take_parked() {
            let peer = hs.peer;
            drop(hs);
            self.finish(peer, Err(io::Error::other("listener closed")));
        }
    }
}
