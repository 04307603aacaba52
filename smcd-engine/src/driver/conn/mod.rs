//! One established SMC connection: the connection core (`smc_core::conn`) behind a lock, a
//! [`Transport`] that carries out its effects, and the waits, timeouts and options around
//! them. Split as the kernel splits `smc_tx.c`, `smc_rx.c` and `smc_cdc.c`: the send path in
//! [`tx`], the receive path in [`rx`], CDCs in and effects out in [`cdc`]; close and the
//! waits are here (`smc_close.c`).
//!
//! # Locking
//!
//! One mutex holds the core, as the kernel's socket lock does: reads and writes copy under it
//! (so two readers or two writers never interleave within a chunk), and nothing sleeps under
//! it. A call that must wait releases it, sleeps on the link ([`Transport::sleep`]), and takes
//! it again, so `shutdown`/`close` from another thread, or the other direction, never wait
//! behind a sleeper. A sleep longer than [`UNWATCHED_LOOK`] hands the TCP connection to the
//! process's liveness watcher, so a vanished peer ends it.
//!
//! # Untrusted peer
//!
//! The peer's CDCs are validated by the core; a violation aborts this connection only (its
//! TCP connection is reset, its buffer is not reused) and every call returns
//! `ConnectionAborted`. A peer that rings our bell without changing anything costs a bounded
//! number of wake-ups: after a run of them the wait backs off.

mod cdc;
mod rx;
mod shared;
mod tx;

pub use shared::StateArea;

use super::watcher::{WatchGuard, Watched, Watcher};
use crate::device::Dir;
use crate::layout::status::ConnSlot;
use crate::transport::{Transport, Waiter};
use rustix::event::{PollFd, PollFlags};
use rustix::fd::{AsFd, BorrowedFd};
use smc_core::close::{AbortKind, SmcState};
use smc_core::conn::{Config, Connection};
use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Consecutive wake-ups that changed nothing before a wait starts to back off.
const SPURIOUS_RUN: u32 = 32;
/// How long a wait pauses per wake-up beyond that run.
const SPURIOUS_PAUSE: Duration = Duration::from_millis(1);
/// How long a sleeper sleeps before it looks at its TCP connection and has the liveness
/// watcher watch it: short waits (a request and its answer) cost no registration, and a
/// vanished peer ends a wait within this much of the watcher's own delay.
const UNWATCHED_LOOK: Duration = Duration::from_millis(10);

/// A turn to spin: only while no other thread of the process sleeps in a wait, at most
/// [`max_spinners`] threads at once, and only while spinning pays.
///
/// Spinning pays only while the thread that will answer has a CPU of its own and answers
/// sooner than a sleep and a wake-up would cost: a ping-pong on one connection. With more
/// runnable threads than CPUs (a server with a thread per connection, crr with many
/// connections) a spinner takes its budget from the threads that would end the waits, even
/// when it is answered within it: on two cores, crr at 8 connections spent 116 µs of the
/// client's CPU per connection with every wait spinning up to 50 µs, 72 µs with no spin, and
/// one spinner at a time still spent 100. So a wait spins only when no other thread of ours
/// is asleep in one, and only while recent spins were answered within [`SPIN_WORTH`] on
/// average (a moving average over the process's spins, each counted at most twice the worth,
/// a spin that ran out too); otherwise one wait in [`SPIN_SAMPLE`] spins, to notice when it
/// pays again.
struct SpinSlot;

/// About what sleeping and being woken costs the two threads involved (a futex wait and
/// wake, two context switches): a spin answered later than this on average costs more
/// than it saves.
const SPIN_WORTH: Duration = Duration::from_micros(10);
/// While spinning does not pay, one wait in this many spins anyway.
const SPIN_SAMPLE: u32 = 64;

static SPINNERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Threads of the process asleep in a wait.
static SLEEPERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Moving average (1/8 weight) of how long the process's spins took, in nanoseconds.
static SPIN_AVG_NS: AtomicU64 = AtomicU64::new(0);
/// Waits that could have spun while spinning does not pay, to pick one in [`SPIN_SAMPLE`].
static SPIN_TICK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A thread asleep in a wait, counted in [`SLEEPERS`] while it lives.
struct Asleep;

impl Asleep {
    fn enter() -> Self {
        SLEEPERS.fetch_add(1, Ordering::Relaxed);
        Asleep
    }
}

impl Drop for Asleep {
    fn drop(&mut self) {
        SLEEPERS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A wait without an answer due whose last spin did not find what it waited for (or that
/// never spun) spins in every this many waits, to find out whether it is a stream's
/// ([`SmcConn::stream_spins`]).
const STREAM_PROBE: u32 = 8;

/// Threads of the process that may spin at once: one CPU is left to the rest.
fn max_spinners() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .saturating_sub(1)
            .max(1)
    })
}

impl SpinSlot {
    /// A turn to spin, if spinning pays.
    fn take() -> Option<Self> {
        Self::take_if(true)
    }

    /// A turn for a transport that spins in its sleep (busy polling a soft device: an answer,
    /// or a stream's next step, [`SmcConn::stream_spins`]), whatever recent spins took (its
    /// waits are one-way trips, longer than the average allows): one process's spinners
    /// only, and none while another thread of ours sleeps.
    fn take_for_busy_poll() -> Option<Self> {
        Self::take_if(false)
    }

    fn take_if(only_if_paying: bool) -> Option<Self> {
        // Another thread of ours asleep in a wait: the process runs several connections at
        // once, and a spin would take the CPU their answers need.
        if SLEEPERS.load(Ordering::Relaxed) > 0 {
            return None;
        }
        if only_if_paying
            && SPIN_AVG_NS.load(Ordering::Relaxed) > SPIN_WORTH.as_nanos() as u64
            && !SPIN_TICK
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(SPIN_SAMPLE)
        {
            return None;
        }
        if SPINNERS.fetch_add(1, Ordering::AcqRel) < max_spinners() {
            Some(SpinSlot)
        } else {
            SPINNERS.fetch_sub(1, Ordering::AcqRel);
            None
        }
    }

    /// The spin ended, answered or run out; `until` is the end of its budget `spin` as set
    /// at its first look at the clock (none: answered before that, at once). Its time goes
    /// into the average.
    fn ended(&self, until: Option<Instant>, spin: Duration) {
        // Since the first look at the clock, one round after the spin began: near enough.
        self.ended_after(until.map_or(Duration::ZERO, |u| (u - spin).elapsed()));
    }

    /// The spin ended after `took` (a spin that ran out: the budget or more).
    fn ended_after(&self, took: Duration) {
        // Clamped at twice the worth: a rare long wait (the peer preempted) among quick
        // answers must not stop a ping-pong's spinning; a steady run of slow answers does.
        let took = took.min(2 * SPIN_WORTH).as_nanos() as u64;
        let avg = SPIN_AVG_NS.load(Ordering::Relaxed);
        SPIN_AVG_NS.store(avg - avg / 8 + took / 8, Ordering::Relaxed);
    }
}

impl Drop for SpinSlot {
    fn drop(&mut self) {
        SPINNERS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the driver adds to the core's configuration.
#[derive(Debug, Clone, Copy)]
pub struct ConnParams {
    /// How long a blocking call spins before it sleeps.
    pub spin: Duration,
}

/// What the connection is, for `smcss`-like reports.
#[derive(Debug, Clone)]
pub struct SmcdInfo {
    /// Link group id.
    pub lgr_id: u32,
    /// Our GID.
    pub local_gid: u128,
    /// The peer's GID.
    pub peer_gid: u128,
    /// Token of the DMB we receive into.
    pub local_token: u64,
    /// Token of the peer's DMB we send into.
    pub peer_token: u64,
    /// Size of our DMB.
    pub rmbe_size: usize,
    /// Size of the peer's DMB.
    pub peer_rmbe_size: usize,
    /// CLC version negotiated (1 or 2).
    pub version: u8,
    /// Whether this side was the client.
    pub client: bool,
}

/// The state under the connection's lock.
#[derive(Debug)]
struct State {
    core: Connection,
    /// The readiness already shows end of stream / the end of the connection.
    shown_eof: bool,
    shown_end: bool,
    /// The application closed its last handle: nobody looks at the readiness any more.
    released: bool,
    /// The peer's ring was last seen full (to count the event once).
    rx_full: bool,
    /// The buffers went back to the link group ([`SmcConn::retire`]): nothing is read from
    /// or written to them any more.
    retired: bool,
    /// The close asked for the TCP shutdown while CDCs were in flight (SMC-R): it waits for
    /// their completions, so the peer has our close before our FIN.
    tcp_shutdown_pending: bool,
    /// Writes that found the send buffer full ([`QuickLook::tx_full`]).
    tx_full: u64,
    /// The number of the shared state's turn this process last saw (see
    /// [`SmcConn::share_state`]).
    area_gen: u64,
}

/// The connection's state, locked; for a connection processes share after a fork, also this
/// process's turn at it ([`shared`]), which ends with the guard after the state was put back.
struct StateGuard<'a> {
    g: MutexGuard<'a, State>,
    area: Option<&'static StateArea>,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.g
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.g
    }
}

impl Drop for StateGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(a) = self.area {
            end_turn(&mut self.g, a);
        }
    }
}

/// The start of a turn at a shared connection: from the state another process's turn left.
#[cold]
#[inline(never)]
fn begin_turn<'a>(mut g: MutexGuard<'a, State>, a: &'static StateArea) -> StateGuard<'a> {
    a.enter();
    if let Some((turn_no, core)) = a.take_newer(g.area_gen) {
        g.core = core;
        g.area_gen = turn_no;
    }
    StateGuard { g, area: Some(a) }
}

/// The end of a turn at a shared connection: the state goes back to the area.
#[cold]
#[inline(never)]
fn end_turn(st: &mut State, a: &StateArea) {
    if let Some(turn_no) = a.put(&st.core) {
        st.area_gen = turn_no;
    }
    a.leave();
}

/// What [`SmcConn::quick_look`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuickLook {
    /// A read would return bytes.
    pub readable: bool,
    /// A write would take some.
    pub writable: bool,
    /// The peer's producer cursor (bytes it ever wrote to us): moves with each arrival.
    pub produced: u64,
    /// How many writes found the send buffer full: room after one of those is an event for
    /// an edge-triggered writer (a socket's write space after `SOCK_NOSPACE`).
    pub tx_full: u64,
}

/// An established SMC connection over the transport `T`.
#[derive(Debug)]
pub struct SmcConn<T: Transport> {
    link: T,
    /// Declared before `clcsock`, so dropped while it is open (see [`WatchGuard`]).
    watch: OnceLock<WatchGuard>,
    /// The watch was asked for (it starts after [`super::watcher::WATCH_DELAY`], see
    /// [`Watcher::watch_later`]).
    watch_asked: AtomicBool,
    /// The connection's end is known: no watch is needed from now on ([`Self::unwatch`]).
    unwatched: AtomicBool,
    clcsock: TcpStream,
    st: Mutex<State>,
    /// Set once the connection is over (aborted or closed): waits end.
    over: AtomicBool,
    /// The peer broke the protocol in shared memory, or writing into its DMB failed: what
    /// it shares with us is not to be trusted again (see [`SmcConn::is_poisoned`]).
    poisoned: AtomicBool,
    nonblocking: AtomicBool,
    /// The readiness is a level, as a socket's: a read that empties the ring, and a
    /// non-blocking write that fills the buffer, clear it (not only a call that finds nothing
    /// to do). For programs that look at readiness between calls (a preloaded `select` loop).
    level: AtomicBool,
    /// With `level`: a read that empties the ring leaves the readiness as it is and only notes
    /// that (`rx_dirty`); whoever is about to wait on descriptors calls
    /// [`SmcConn::settle_readiness`] first (a preload library, from its `poll`, `select` and
    /// `epoll_wait`). A program that never waits on the descriptor (blocking reads, as qperf
    /// and sockperf make) then costs no system call per message at either end: no drain here,
    /// and, since nothing re-announces the event loop, no bell rung by the peer.
    ///
    /// Sound because the readiness is never "not readable and not announced" while anyone
    /// may wait on it: the announcement is only ever taken by a ringer (who rings) or by us
    /// (when we ring ourselves), and a ring's byte stays until a drain, which re-announces.
    /// The one exception is [`SmcConn::withdraw_readiness`], made only while no thread of the
    /// process waits on descriptors, and settled before one does.
    deferred: AtomicBool,
    /// [`SmcConn::withdraw_readiness`] took the announcement back: the readiness is not
    /// readable (nothing to drain) and not announced until the next settle.
    withdrawn: AtomicBool,
    /// An edge-triggered waiter may wait on the readiness ([`SmcConn::set_edge_readiness`]):
    /// a settle that finds bytes which arrived after a read rings once more for it.
    edge: AtomicBool,
    /// A read emptied the ring and the readiness was left readable (see `deferred`).
    rx_dirty: AtomicBool,
    /// A blocking call a signal interrupts returns `Interrupted` (`EINTR`), as a socket's does
    /// when the handler was installed without `SA_RESTART`; otherwise it waits on.
    interruptible: AtomicBool,
    nodelay: AtomicBool,
    /// Timeouts in nanoseconds, 0 = none.
    read_timeout: AtomicU64,
    write_timeout: AtomicU64,
    params: ConnParams,
    /// Wake-ups that found nothing changed (a hostile peer's bell, or a race).
    spurious: AtomicU64,
    /// The last call was a send: a read that waits next waits for an answer (a request and
    /// its reply), which a transport that spins in its sleep spins for.
    answer_due: AtomicBool,
    /// By direction ([`Dir`] as index): the last spin of a wait that was not for an answer
    /// found what it waited for within the budget (a stream: the reader's next data, or the
    /// writer's room, comes a one-way trip after what the other end sent last), so such
    /// waits spin again. Otherwise (a connection's first read, a reader waiting for a close,
    /// a writer whose reader is slow) only every [`STREAM_PROBE`]th such wait spins, to find
    /// a stream.
    stream_spins: [AtomicBool; 2],
    /// Waits without an answer due, by direction, counted for [`STREAM_PROBE`].
    stream_waits: [AtomicU32; 2],
    me: OnceLock<Weak<Self>>,
    /// Where the processes that share the connection after a fork keep its state
    /// ([`SmcConn::share_state`]).
    shared: OnceLock<&'static StateArea>,
    /// Identity and sizes.
    pub info: SmcdInfo,
    /// This connection's slot in the engine's status area: counters, cursors, state.
    pub slot: ConnSlot,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn to_nanos(t: Option<Duration>) -> u64 {
    t.map_or(0, |d| d.as_nanos().clamp(1, u128::from(u64::MAX)) as u64)
}

fn from_nanos(ns: u64) -> Option<Duration> {
    (ns != 0).then(|| Duration::from_nanos(ns))
}

/// Whether `sock` has `SO_LINGER` on with a zero timeout (its close sends a reset).
fn linger_zero(sock: &TcpStream) -> bool {
    rustix::net::sockopt::socket_linger(sock).is_ok_and(|l| l == Some(Duration::ZERO))
}

fn aborted_error(kind: AbortKind) -> io::Error {
    match kind {
        AbortKind::Reset => io::Error::from(io::ErrorKind::ConnectionReset),
        AbortKind::Aborted => io::Error::from(io::ErrorKind::ConnectionAborted),
    }
}

/// What a wait ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woken {
    /// Something may have changed: look again.
    Again,
    /// The deadline passed.
    TimedOut,
    /// A signal interrupted the wait (only for an interruptible connection).
    Interrupted,
}

impl<T: Transport> SmcConn<T> {
    /// Wraps a finished handshake. Anything the peer sent before this is seen at the first
    /// call. No readiness exists yet ([`SmcConn::readiness_fd`] makes it).
    pub fn new(
        clcsock: TcpStream,
        link: T,
        cfg: Config,
        params: ConnParams,
        info: SmcdInfo,
        slot: ConnSlot,
    ) -> Arc<Self> {
        let _ = clcsock.set_nodelay(true);
        let conn = Arc::new(Self {
            link,
            clcsock,
            st: Mutex::new(State {
                core: Connection::new(cfg),
                shown_eof: false,
                shown_end: false,
                released: false,
                rx_full: false,
                retired: false,
                tcp_shutdown_pending: false,
                tx_full: 0,
                area_gen: 0,
            }),
            over: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            nonblocking: AtomicBool::new(false),
            level: AtomicBool::new(false),
            deferred: AtomicBool::new(false),
            edge: AtomicBool::new(false),
            rx_dirty: AtomicBool::new(false),
            withdrawn: AtomicBool::new(false),
            interruptible: AtomicBool::new(false),
            nodelay: AtomicBool::new(false),
            read_timeout: AtomicU64::new(0),
            write_timeout: AtomicU64::new(0),
            params,
            spurious: AtomicU64::new(0),
            answer_due: AtomicBool::new(false),
            stream_spins: [AtomicBool::new(false), AtomicBool::new(false)],
            stream_waits: [AtomicU32::new(0), AtomicU32::new(0)],
            watch: OnceLock::new(),
            watch_asked: AtomicBool::new(false),
            unwatched: AtomicBool::new(false),
            me: OnceLock::new(),
            shared: OnceLock::new(),
            info,
            slot,
        });
        let _ = conn.me.set(Arc::downgrade(&conn));
        let me = Arc::downgrade(&conn);
        conn.link
            .set_service(Box::new(move || me.upgrade().is_none_or(|c| c.service())));
        conn
    }

    /// Runs the CDC processing for the transport when no thread is in the connection (see
    /// [`Transport::set_service`]); `false` when a thread holds the connection now.
    fn service(&self) -> bool {
        let g = match self.st.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        let mut st = self.turn(g);
        let _ = self.observe(&mut st);
        true
    }

    #[inline]
    fn lock(&self) -> StateGuard<'_> {
        self.turn(lock(&self.st))
    }

    /// The locked state, and for a shared connection this process's turn at it, starting from
    /// the state another process's turn left.
    #[inline]
    fn turn<'a>(&self, g: MutexGuard<'a, State>) -> StateGuard<'a> {
        match self.shared.get() {
            None => StateGuard { g, area: None },
            Some(a) => begin_turn(g, a),
        }
    }

    /// Before a fork that shares the connection with another process: its state moves into
    /// `area`, memory the fork shares, and every use from now on, in either process, is a turn
    /// that starts from the state the last one left ([`shared`]). False (nothing changes) for
    /// a state that cannot be shared so (SMC-R); true if it already is.
    pub fn share_state(&self, area: &'static StateArea) -> bool {
        if self.shared.get().is_some() {
            return true;
        }
        let mut g = lock(&self.st);
        if !g.core.owns_no_heap() {
            return false;
        }
        area.enter();
        match area.put(&g.core) {
            Some(turn_no) => g.area_gen = turn_no,
            None => {
                area.leave();
                return false;
            }
        }
        area.leave();
        let _ = self.shared.set(area);
        true
    }

    /// This process lets go of the connection while other processes hold it on: its watch
    /// of the TCP connection ends, and its copy of the TCP socket is replaced by `/dev/null`
    /// (the number stays taken, for whatever of the engine still looks at it), so that the
    /// TCP connection ends when the last of the others ends, even without a close, and the
    /// peer's engine sees the connection end.
    pub fn let_go(&self) {
        self.unwatch();
        if let Ok(null) = std::fs::File::open("/dev/null") {
            use std::os::fd::{AsRawFd, FromRawFd};
            // SAFETY: the connection's descriptor of the TCP socket, replaced in place and
            // never closed here (the connection still owns the number).
            let mut tcp = std::mem::ManuallyDrop::new(unsafe {
                rustix::fd::OwnedFd::from_raw_fd(self.clcsock.as_raw_fd())
            });
            let _ = rustix::io::dup3(&null, &mut tcp, rustix::io::DupFlags::CLOEXEC);
        }
    }

    /// The transport.
    pub fn link(&self) -> &T {
        &self.link
    }

    /// The TCP connection underneath.
    pub fn clcsock(&self) -> &TcpStream {
        &self.clcsock
    }

    /// The close state.
    pub fn state(&self) -> SmcState {
        self.lock().core.state()
    }

    /// Whether this side aborted the connection because the peer broke the protocol or
    /// vanished: its buffers and link group are not to be trusted again.
    pub fn is_aborted(&self) -> bool {
        self.lock().core.aborted_locally()
    }

    /// Whether the connection ended because the peer wrote what the protocol forbids (an
    /// invalid CDC) or its DMB could not be written. Only then is the link group given up:
    /// an abort for any other reason (a reset, a vanished TCP connection, a close with data
    /// unread) ends this connection alone, as in the kernel, whose `smc_conn_kill` leaves
    /// the group to its other connections.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// Marks the connection as ended by the peer's fault or the link's ([`Self::is_poisoned`]).
    fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    /// Wake-ups that found nothing changed so far.
    pub fn spurious_wakeups(&self) -> u64 {
        self.spurious.load(Ordering::Relaxed)
    }

    /// A snapshot of the core's positions (diagnostics).
    pub fn positions(&self) -> smc_core::conn::Positions {
        self.lock().core.positions()
    }

    // ----------------------------------------------------------------------------------
    // Options.

    /// `TCP_NODELAY`: setting it pushes held-back data at once.
    pub fn set_nodelay(&self, on: bool) {
        self.nodelay.store(on, Ordering::Relaxed);
        if on {
            self.slot.bump(crate::layout::status::Cnt::Ndly, 1);
            let _ = self.flush();
        }
    }

    /// Current `TCP_NODELAY`.
    pub fn nodelay(&self) -> bool {
        self.nodelay.load(Ordering::Relaxed)
    }

    /// `TCP_CORK`: while set, writes are held back while there is room; clearing it pushes.
    pub fn set_cork(&self, on: bool) {
        let mut st = self.lock();
        let eff = st.core.set_cork(on);
        self.apply(&mut st, eff);
        if !on {
            self.slot.bump(crate::layout::status::Cnt::Cork, 1);
        }
    }

    /// Current cork.
    pub fn cork(&self) -> bool {
        self.lock().core.cork()
    }

    /// Level readiness (see the field): what a socket's `poll` says after every call.
    pub fn set_level_readiness(&self, on: bool) {
        self.level.store(on, Ordering::Relaxed);
    }

    /// Deferred level readiness (see the field `deferred`).
    pub fn set_deferred_readiness(&self, on: bool) {
        self.deferred.store(on, Ordering::Relaxed);
    }

    /// Whether an edge-triggered waiter (`EPOLLET`) may wait on the readiness (see the field).
    pub fn set_edge_readiness(&self, on: bool) {
        self.edge.store(on, Ordering::Relaxed);
    }

    /// Whether a read left the readiness readable for [`SmcConn::settle_readiness`].
    pub fn readiness_dirty(&self) -> bool {
        self.rx_dirty.load(Ordering::Acquire)
    }

    /// Before a wait on descriptors: the readiness a deferred read left readable becomes what
    /// the connection's state is (not readable, announced, if the ring is still empty). A
    /// connection the application closed is left alone: its buffers may be another
    /// connection's already (see [`SmcConn::retire`]).
    pub fn settle_readiness(&self) {
        if !self.rx_dirty.swap(false, Ordering::AcqRel) || self.over.load(Ordering::Acquire) {
            return;
        }
        // Under the lock throughout: nothing of ours reads or closes meanwhile.
        let st = self.lock();
        if st.released || st.retired {
            return;
        }
        let Some(ready) = self.link.readiness() else {
            return;
        };
        // The peer's CDC first, as a read takes it: when its bytes arrived since the read
        // (an event loop with many connections finds the next request there by now), the
        // descriptor stays readable as it is, with no drain and no announcement (never "not
        // readable and not announced": see `deferred`). For an edge-triggered waiter it is
        // rung once more: its last edge came before that read, and the peer, not asked to,
        // rang nobody for the new bytes. An error there shows on the descriptor as a read's
        // would.
        let mut st = st;
        let _ = self.observe(&mut st);
        if st.retired {
            return;
        }
        match st.core.recv_ready() {
            Ok(smc_core::conn::RecvReady::Empty) => {}
            r => {
                // Withdrawn, the descriptor is not readable: made so, as the peer would have.
                let bytes = matches!(r, Ok(smc_core::conn::RecvReady::Data(n)) if n > 0);
                if self.withdrawn.swap(false, Ordering::AcqRel)
                    || (bytes && self.edge.load(Ordering::Relaxed))
                {
                    ready.bell().ring(Dir::Rx);
                }
                return;
            }
        }
        self.clear_and_announce(ready, Dir::Rx);
        if self.link.cdc_pending() {
            // The peer wrote between our look and the announcement: ring ourselves.
            self.link.wake_local(Dir::Rx);
        }
    }

    /// An event loop that waited on descriptors is busy again: the announcement the last
    /// settle made for its readiness is taken back if the peer has not taken it (then it has
    /// not rung), so that the peer's writes ring nobody while the loop finds their bytes
    /// itself (the preload library's `epoll_wait` answered from shared memory). A loop
    /// waiting on fifty connections announced each of them, and woken by the first ring, it
    /// had its peer ring most of the others too: a `send` each, a quarter of redis-server's
    /// time under redis-benchmark. `true`: taken back, and the readiness is then "not
    /// readable and not announced", so the caller must have it settled
    /// ([`SmcConn::settle_readiness`], which announces without a drain) before any thread of
    /// the process waits on the descriptor, and must not call this while one does. Nothing
    /// is taken back from a connection other processes share (they may wait on it), or
    /// without deferred readiness.
    pub fn withdraw_readiness(&self) -> bool {
        if !self.deferred.load(Ordering::Relaxed)
            || self.shared.get().is_some()
            || self.over.load(Ordering::Acquire)
        {
            return false;
        }
        let st = self.lock();
        if st.released || st.retired || self.link.readiness().is_none() {
            return false;
        }
        if !self.link.withdraw(Dir::Rx) {
            return false;
        }
        self.mark_withdrawn();
        drop(st);
        true
    }

    /// The readiness is "not readable and not announced" (nothing to drain): the next settle
    /// announces it, or rings it when bytes came. Under the connection's lock.
    fn mark_withdrawn(&self) {
        self.withdrawn.store(true, Ordering::Release);
        self.rx_dirty.store(true, Ordering::Release);
    }

    /// The process's one waiter on descriptors is about to sleep on this connection's
    /// readiness among others: the reader's announcement is tagged with that sleep, and the
    /// peer rings once per tag (`Dmb::take_ring`), not once per connection (a server that
    /// answers fifty connections of a sleeping client in one burst rang fifty bells). Call
    /// [`SmcConn::untag_readiness`] when the sleep ends, or before any other thread of the
    /// process waits on descriptors (its connection may be one whose ring was skipped). Not
    /// for a connection other processes share (they may wait on it), nor SMC-R (ignored).
    pub fn tag_readiness(&self, tag: u64) {
        if self.shared.get().is_some() || self.over.load(Ordering::Acquire) {
            return;
        }
        self.link.set_rx_tag(tag);
    }

    /// The sleep that tagged the announcement ([`SmcConn::tag_readiness`]) ended: the tag goes,
    /// and `true` when the peer took the announcement without ringing; the readiness is then
    /// "not readable and not announced", as after [`SmcConn::withdraw_readiness`], and must be
    /// settled before anyone waits on the descriptor.
    pub fn untag_readiness(&self) -> bool {
        let st = self.lock();
        if !self.link.untag_rx() || st.released || st.retired {
            return false;
        }
        self.mark_withdrawn();
        drop(st);
        true
    }

    /// [`SmcConn::settle_readiness`] whether or not a read noted the connection: its
    /// readiness said readable while the ring is empty (a bell rung for bytes already read).
    pub fn settle_readiness_now(&self) {
        self.rx_dirty.store(true, Ordering::Release);
        self.settle_readiness();
    }

    /// What an event loop's wait done without the readiness descriptor may report (the
    /// preload library's `epoll_wait`, which looks here before it enters the kernel): whether
    /// a read would return bytes and a write would take some, when that is all there is to
    /// say. `None` when anything else is (end of stream, a shutdown, an error, the end of the
    /// connection): then only the descriptor, where the engine shows it, tells it right.
    /// Processes the peer's CDC first, as a read does; never makes a system call.
    pub fn quick_poll(&self) -> Option<(bool, bool)> {
        self.quick_look().map(|l| (l.readable, l.writable))
    }

    /// [`SmcConn::quick_poll`] with the peer's producer cursor, which moves with every arrival
    /// of bytes: an edge-triggered wait done without the descriptor reports a stream again
    /// only when that moved since it last did (what the kernel's `EPOLLET` reports for a
    /// socket: the arrivals, not the state).
    pub fn quick_look(&self) -> Option<QuickLook> {
        if self.over.load(Ordering::Acquire) {
            return None;
        }
        let mut st = self.lock();
        if st.released || st.retired {
            return None;
        }
        self.observe(&mut st).ok()?;
        if st.shown_eof || st.shown_end || st.core.read_is_shut() || st.core.write_is_shut() {
            return None;
        }
        let readable = match st.core.recv_ready() {
            Ok(smc_core::conn::RecvReady::Data(n)) => n > 0,
            Ok(smc_core::conn::RecvReady::Empty) => false,
            _ => return None,
        };
        st.core.send_check().ok()?;
        Some(QuickLook {
            readable,
            writable: st.core.send_space() > 0,
            produced: st.core.positions().produced,
            tx_full: st.tx_full,
        })
    }

    /// Interruptible blocking calls (see the field).
    pub fn set_interruptible(&self, on: bool) {
        self.interruptible.store(on, Ordering::Relaxed);
    }

    /// Non-blocking mode.
    pub fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Ordering::Relaxed);
    }

    /// Whether calls that would wait return `WouldBlock`.
    pub fn is_nonblocking(&self) -> bool {
        self.nonblocking.load(Ordering::Relaxed)
    }

    /// Read timeout.
    pub fn set_read_timeout(&self, t: Option<Duration>) {
        self.read_timeout.store(to_nanos(t), Ordering::Relaxed);
    }

    /// Write timeout.
    pub fn set_write_timeout(&self, t: Option<Duration>) {
        self.write_timeout.store(to_nanos(t), Ordering::Relaxed);
    }

    /// Read timeout.
    pub fn read_timeout(&self) -> Option<Duration> {
        from_nanos(self.read_timeout.load(Ordering::Relaxed))
    }

    /// Write timeout.
    pub fn write_timeout(&self) -> Option<Duration> {
        from_nanos(self.write_timeout.load(Ordering::Relaxed))
    }

    fn deadline(&self, t: &AtomicU64) -> Option<Instant> {
        match t.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Instant::now() + Duration::from_nanos(ns)),
        }
    }

    /// The descriptor `poll`/`epoll` wait on: readable when a read would not block (data, end
    /// of stream, an error), writable when a write would not block, hung up when the
    /// connection is over. Made at the first call, showing the connection's state and with
    /// both directions announced, so an event loop that waits at once is woken by the first
    /// change. From then on the connection's TCP connection is watched so that its end shows
    /// here even while nobody calls into the connection.
    pub fn readiness_fd(&self) -> io::Result<BorrowedFd<'_>> {
        self.watch_tcp(false)?;
        if let Some(r) = self.link.readiness() {
            return Ok(r.fd());
        }
        let mut st = self.lock();
        let (r, new) = self.link.make_readiness(None)?;
        if new {
            self.show_state(&mut st, r);
        }
        Ok(r.fd())
    }

    /// Makes `r` (a pair from [`crate::transport::Readiness::waiting`] whose near end the
    /// application already waits on) the connection's readiness, showing its state: the
    /// first readiness of the connection, or an error.
    pub fn adopt_readiness(&self, r: crate::transport::Readiness) -> io::Result<()> {
        self.watch_tcp(false)?;
        let mut st = self.lock();
        // Writable from here unless the look below finds no space (it puts the filler back).
        r.bell().ring(Dir::Tx);
        let (r, _) = self.link.make_readiness(Some(r))?;
        self.show_state(&mut st, r);
        Ok(())
    }

    /// A new readiness shows what the connection's state is now; both directions are
    /// announced first, so what changes after the look rings it.
    #[cold]
    fn show_state(&self, st: &mut State, r: &crate::transport::Readiness) {
        self.link.arm(Dir::Rx, Waiter::Event);
        self.link.arm(Dir::Tx, Waiter::Event);
        // After the bell was published (make_readiness): the peer's flags from before it are
        // seen here, the later ones make the peer ring or shut the bell itself.
        let _ = self.observe(st);
        if st.released {
            return;
        }
        if st.shown_end {
            r.hang_up();
            return;
        }
        if st.shown_eof {
            r.peer_done();
        }
        if st.core.read_is_shut() {
            r.shut_read();
        }
        if !matches!(st.core.recv_ready(), Ok(smc_core::conn::RecvReady::Empty)) {
            r.bell().ring(Dir::Rx);
        }
        if st.core.write_is_shut() {
            r.shut_write();
        } else if st.core.send_check().is_ok() && st.core.send_space() == 0 {
            r.clear_writable();
            // Space freed by an observe between our look and the filler rings the writer:
            // look again now that the filler is in.
            let _ = self.observe(st);
            if st.core.send_space() > 0 {
                r.bell().ring(Dir::Tx);
            }
        }
    }

    /// Has the TCP connection watched (once): its end then ends the connection even while
    /// nobody calls in. `now` registers it at once (a blocking wait that has slept long);
    /// otherwise the watcher registers it after [`super::watcher::WATCH_DELAY`], so a short
    /// connection an event loop serves ends before it costs a registration (two `epoll_ctl`
    /// per connection and side). A peer that vanishes meanwhile is seen when the registration
    /// is made (it reports a socket that is already ready).
    fn watch_tcp(&self, now: bool) -> io::Result<()> {
        if self.watch.get().is_some() || self.unwatched.load(Ordering::Acquire) {
            return Ok(());
        }
        if now {
            return self.watch_now();
        }
        if !self.watch_asked.swap(true, Ordering::AcqRel) {
            let me: Weak<dyn Watched> = self.me.get().expect("set at creation").clone();
            Watcher::get().watch_later(me);
        }
        Ok(())
    }

    /// Registers the watch (under the connection's lock: one registration per socket, never
    /// two racing for its number).
    fn watch_now(&self) -> io::Result<()> {
        let _st = self.lock();
        if self.watch.get().is_some() || self.unwatched.load(Ordering::Acquire) {
            return Ok(());
        }
        let me: Weak<dyn Watched> = self.me.get().expect("set at creation").clone();
        // A TCP connection that ended before it was watched is reported by the watch at
        // once (a registration added while its socket is ready reports it): no look here.
        let guard = Watcher::get().watch(self.clcsock.as_fd(), me)?;
        let _ = self.watch.set(guard);
        self.watch_asked.store(true, Ordering::Release);
        Ok(())
    }

    /// Whether the liveness watcher watches this connection, or will shortly (then
    /// non-blocking calls need not look at the TCP connection themselves).
    fn watched(&self) -> bool {
        // A registered watch was asked for too (`watch_now`); only `unwatch` disarms it.
        !self.unwatched.load(Ordering::Acquire) && self.watch_asked.load(Ordering::Acquire)
    }

    /// The connection's end is known (the application closed it, or the peer's close or abort
    /// arrived): the TCP connection's end, which follows, need not wake the watcher. Without
    /// this every connection an event loop used woke the watcher thread once more at its end
    /// (crr from an epoll server: 1.5 wake-ups per connection).
    pub(super) fn unwatch(&self) {
        self.unwatched.store(true, Ordering::Release);
        if let Some(w) = self.watch.get() {
            w.disarm();
        }
    }

    // ----------------------------------------------------------------------------------
    // Shutdown and close (smc_close.c).

    /// `shutdown(how)`.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let mut st = self.lock();
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            let eff = st.core.shutdown_read();
            self.apply(&mut st, eff);
            if let Some(r) = self.link.readiness() {
                r.shut_read();
            }
        }
        match how {
            Shutdown::Write => {
                let eff = st.core.shutdown_write();
                self.apply(&mut st, eff);
                if let Some(r) = self.link.readiness() {
                    r.shut_write();
                }
            }
            Shutdown::Both => {
                let eff = st.core.close(crate::sys::core_now());
                self.apply(&mut st, eff);
            }
            Shutdown::Read => {}
        }
        Ok(())
    }

    /// The application closes: what is written goes out, then the close (or an abort when
    /// received data is left unread). Returns whether the buffer may be reused at once (the
    /// peer has closed too and nothing was aborted).
    ///
    /// With `SO_LINGER` `{1, 0}` on the TCP socket (a program's `setsockopt` reaches it) the
    /// close is an abort: the peer gets `peer_conn_abort` and `ECONNRESET`, and the TCP socket
    /// sends its reset when it closes, as a TCP connection closed so would.
    pub fn close_now(&self) -> bool {
        // Before the close shuts the TCP connection down (see `unwatch`).
        self.unwatch();
        let reset = linger_zero(&self.clcsock);
        let mut st = self.lock();
        st.released = true;
        let _ = self.observe(&mut st);
        let eff = if reset {
            st.core.close_reset()
        } else {
            st.core.close(crate::sys::core_now())
        };
        self.apply(&mut st, eff);
        st.core.state() == SmcState::Closed && !st.core.aborted_locally()
    }

    /// The application's last handle is gone and the connection's buffers go back to the link
    /// group, where the next connection may take them at once: from now on nothing of this
    /// connection reads or writes them. A thread that still holds the connection (the
    /// liveness watcher, looking at the TCP connection just then) would otherwise read the
    /// next connection's CDCs as this one's, take them for a protocol violation, and write
    /// an abort into the peer's DMB, which may be another connection's by then too (crr at
    /// 512 connections saw one such violation a second).
    pub fn retire(&self) {
        let mut st = self.lock();
        st.retired = true;
        self.over.store(true, Ordering::Release);
    }

    /// Aborts the connection locally (`smc_close_active_abort`).
    pub fn abort(&self, kind: AbortKind) {
        let mut st = self.lock();
        let eff = st.core.abort(kind);
        self.apply(&mut st, eff);
    }

    // ----------------------------------------------------------------------------------
    // Waiting.

    /// Checks the TCP connection: true if the peer is gone (end of stream without a close,
    /// reset, or unexpected bytes: nothing travels over TCP after the handshake).
    fn clcsock_dead(&self) -> bool {
        let mut fds = [PollFd::new(&self.clcsock, PollFlags::IN | PollFlags::RDHUP)];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
    }

    /// The TCP connection ended: an orderly end if the peer's close is here, else an abort.
    fn tcp_gone(&self) {
        let mut st = self.lock();
        self.link.settle();
        let _ = self.observe(&mut st);
        let eff = st.core.tcp_gone();
        self.apply(&mut st, eff);
    }

    /// Blocking wait for `dir` until something changes or `deadline`: spin for the configured
    /// budget, then announce the wait, check again, and sleep on the link until the peer or
    /// another thread of ours changes something, or the TCP connection ends (looked at after
    /// [`UNWATCHED_LOOK`], then seen by the watcher). No lock is held.
    fn wait(&self, dir: Dir, deadline: Option<Instant>) -> Woken {
        // Counted as waiting until it returns: what arrives meanwhile is this thread's to
        // look at (both callers look at the connection after `Woken::Again`), so the transport
        // need not have another thread do it. A wait that ends otherwise looks here.
        self.link.wait_begin();
        let woken = self.wait_counted(dir, deadline);
        if self.link.wait_end() && woken != Woken::Again {
            let mut st = self.lock();
            let _ = self.observe(&mut st);
        }
        woken
    }

    fn wait_counted(&self, dir: Dir, deadline: Option<Instant>) -> Woken {
        let spins_in_sleep = T::SPINS_IN_SLEEP;
        if !self.params.spin.is_zero()
            && !spins_in_sleep
            && let Some(slot) = SpinSlot::take()
        {
            // The first round looks before reading the clock: in a ping-pong the answer is
            // usually there within it, and a clock read costs as much as the rest of a read.
            let mut until = None;
            loop {
                for _ in 0..64 {
                    if self.link.cdc_pending() || self.over.load(Ordering::Acquire) {
                        slot.ended(until, self.params.spin);
                        return Woken::Again;
                    }
                    std::hint::spin_loop();
                }
                let now = Instant::now();
                if now >= *until.get_or_insert(now + self.params.spin) {
                    break;
                }
            }
            slot.ended(until, self.params.spin);
        }
        let mut run = 0u32;
        loop {
            self.link.arm(dir, Waiter::Thread);
            // Look again after announcing: at the words (a CDC nobody took yet) and at the
            // core (another thread of ours may have taken the CDC that brought what we wait
            // for, and found us not yet announced).
            if self.link.cdc_pending()
                || self.over.load(Ordering::Acquire)
                || self.local_change(dir)
            {
                return Woken::Again;
            }
            let mut timeout = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Woken::TimedOut;
                    }
                    Some(left)
                }
                None => None,
            };
            let watched = self.watched();
            if !watched {
                timeout = Some(timeout.map_or(UNWATCHED_LOOK, |t| t.min(UNWATCHED_LOOK)));
            }
            // A transport that spins in its sleep (busy polling a soft device): a read for an
            // answer spins; other waits, readers and writers, spin while they are a stream's.
            let answer = dir == Dir::Rx && self.answer_due.load(Ordering::Relaxed);
            let d = usize::from(dir == Dir::Tx);
            let spin_here = spins_in_sleep
                && run == 0
                && !self.params.spin.is_zero()
                && (answer
                    || self.stream_spins[d].load(Ordering::Relaxed)
                    || (self.stream_waits[d].fetch_add(1, Ordering::Relaxed) + 1)
                        .is_multiple_of(STREAM_PROBE));
            let slept = match spin_here.then(SpinSlot::take_for_busy_poll).flatten() {
                // The transport spins in its sleep (busy polling): the same policy.
                Some(slot) => {
                    let r = self.link.sleep_spinning(dir, timeout, self.params.spin);
                    let took = r.as_ref().ok().and_then(|(_, t)| *t);
                    if !answer {
                        self.stream_spins[d].store(took.is_some(), Ordering::Relaxed);
                    }
                    slot.ended_after(took.unwrap_or(2 * SPIN_WORTH));
                    drop(slot);
                    r.map(|(woken, _)| woken)
                }
                None => {
                    let _asleep = Asleep::enter();
                    self.link.sleep(dir, timeout)
                }
            };
            match slept {
                Ok(true) => {}
                Ok(false) if watched || deadline.is_some_and(|d| Instant::now() >= d) => {
                    return Woken::TimedOut;
                }
                Ok(false) => {
                    // A long sleep: is the peer still there? From now on the watcher looks
                    // (it could not take the connection: we look every so often).
                    if self.clcsock_dead() {
                        self.tcp_gone();
                        return Woken::Again;
                    }
                    let _ = self.watch_tcp(true);
                    continue;
                }
                Err(e)
                    if e.kind() == io::ErrorKind::Interrupted
                        && self.interruptible.load(Ordering::Relaxed) =>
                {
                    return Woken::Interrupted;
                }
                Err(_) => return Woken::Again,
            }
            if self.link.cdc_pending() || self.over.load(Ordering::Acquire) {
                return Woken::Again;
            }
            // Woken, and nothing changed here: the local side changed (another thread's
            // shutdown), or the peer woke us for nothing. A run of those is paced.
            self.spurious.fetch_add(1, Ordering::Relaxed);
            run += 1;
            if run > SPURIOUS_RUN {
                std::thread::sleep(SPURIOUS_PAUSE);
            }
            if self.local_change(dir) {
                return Woken::Again;
            }
        }
    }

    /// Whether a local change (a shutdown, an abort) ended what `dir` waits for.
    fn local_change(&self, dir: Dir) -> bool {
        let st = self.lock();
        if dir == Dir::Rx {
            self.link.reader_needs_completions(
                st.core.unsent() > 0
                    || st.tcp_shutdown_pending
                    || st.core.state() != SmcState::Active,
            );
        }
        match dir {
            Dir::Rx => !matches!(st.core.recv_ready(), Ok(smc_core::conn::RecvReady::Empty)),
            Dir::Tx => st.core.send_check().is_err() || st.core.send_space() > 0,
        }
    }
}

impl<T: Transport> Watched for SmcConn<T> {
    fn tcp_event(&self) {
        if self.clcsock_dead() {
            self.tcp_gone();
        }
    }

    fn start_watch(&self) {
        if self.watch_now().is_err() {
            // No registration (out of descriptors for the watcher's set): look now, and
            // non-blocking calls look themselves from now on.
            self.watch_asked.store(false, Ordering::Release);
            if self.clcsock_dead() {
                self.tcp_gone();
            }
        }
    }
}
