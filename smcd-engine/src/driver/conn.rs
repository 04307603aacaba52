//! One established SMC-D connection: the send path (`smc_tx.c`), the receive path
//! (`smc_rx.c`), the CDC exchange through the DMB headers (`smc_cdc.c`) and the close
//! handling (`smc_close.c`), over two mapped DMBs.
//!
//! # Shared memory protocol
//!
//! Each side owns the DMB it receives into and has the peer's DMB attached. A writer copies
//! bytes into the peer's ring, then publishes its producer cursor (a release store of the
//! CDC's producer word in the peer's DMB). A reader copies bytes out of its own ring and, when
//! the kernel's window-update rule says so, publishes its consumer cursor together with its
//! producer and connection-state flags (the consumer word in the peer's DMB). Every
//! publication is followed by [`Dmb::notify`], which wakes the peer only if it announced that
//! it is about to sleep; a side that finds nothing to do spins for a bounded time and then
//! sleeps on a futex (blocking calls) or arms its doorbell eventfd (non-blocking calls driven
//! by `poll`/`epoll`).
//!
//! # Untrusted peer
//!
//! Cursors read from shared memory are turned into absolute positions relative to the last
//! accepted one and refused if they move backwards or further than the peer could have moved
//! them ([`cursor::from_cursor`]). A refused value aborts this connection only: its TCP
//! connection is reset, its DMB is not reused, and both calls return `ConnectionAborted`.
//!
//! # Liveness
//!
//! The TCP connection stays open for the life of the connection. A sleeper wakes at least
//! every [`LIVENESS_PERIOD`] and checks it: end of stream without a close flag from the peer
//! means the peer is gone, and the connection aborts with `ConnectionReset`.

use crate::core::close::{AbortKind, CloseActions, CloseMachine, ConnFlags, SmcState};
use crate::core::cursor;
use crate::core::window::{self, ConsumerView, WndUpdateRule};
use crate::device::{Dir, Dmb, WAIT_EVENTFD, WAIT_FUTEX};
use crate::layout::status::{self as st, ConnSlot, Curs};
use rustix::event::{PollFd, PollFlags};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use smc_proto::cdc::{ConnStateFlags, ProducerFlags, SmcdCursorWord};
use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Smallest piece a long read copies before it may publish its consumer cursor.
const RX_CHUNK_MIN: usize = 8 * 1024;

/// How often a sleeping side checks its TCP connection.
pub const LIVENESS_PERIOD: Duration = Duration::from_millis(200);

/// Per-connection tunables, fixed when the connection is created (as the kernel takes sysctl
/// values at socket creation).
#[derive(Debug, Clone, Copy)]
pub struct ConnParams {
    /// How long a blocking call spins before it sleeps.
    pub spin: Duration,
    /// Autosplit size (0: off).
    pub autosplit_size: usize,
    /// Which window-update limit the receive side uses.
    pub wnd_rule: WndUpdateRule,
    /// Autocork threshold (kept for the rule's sake; see [`window::should_autocork`]).
    pub autocorking_size: usize,
    /// Publish the producer cursor at least every this many bytes of a long write (0: only
    /// where the kernel would: autosplit cuts, a full ring, the end of the write).
    pub tx_chunk: usize,
    /// The send buffer size (`wmem`): bytes written and not yet consumed by the peer.
    pub sndbuf: usize,
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

#[derive(Debug)]
struct Rx {
    consumed: u64,
    produced: u64,
    /// Consumer position last published to the peer (`rx_curs_confirmed`).
    confirmed: u64,
    last_prod_word: u64,
    last_cons_word: u64,
    peer_pflags: ProducerFlags,
    read_shutdown: bool,
}

#[derive(Debug)]
struct Tx {
    produced: u64,
    published: u64,
    peer_consumed: u64,
    last_cons_word: u64,
    write_blocked: bool,
}

/// What we publish into the peer's consumer word.
#[derive(Debug, Clone, Copy)]
struct Out {
    confirmed: u64,
    pflags: ProducerFlags,
    cflags: ConnStateFlags,
}

/// An established SMC-D connection.
#[derive(Debug)]
pub struct SmcConn {
    clcsock: TcpStream,
    own: Arc<Dmb>,
    peer: Arc<Dmb>,
    rx: Mutex<Rx>,
    tx: Mutex<Tx>,
    out: Mutex<Out>,
    close: Mutex<CloseMachine>,
    /// Connection-state flag bits already fed to the close machine (fast path check).
    seen_cflags: AtomicU8,
    /// Set once the connection aborted locally; waiters check it.
    aborted: AtomicBool,
    /// The close state still allows sending (a lock-free copy for the send fast path).
    send_ok: AtomicBool,
    nonblocking: AtomicBool,
    nodelay: AtomicBool,
    cork: AtomicBool,
    /// Timeouts in nanoseconds, 0 = none (atomics: read on every call).
    read_timeout: AtomicU64,
    write_timeout: AtomicU64,
    readiness: OnceLock<OwnedFd>,
    params: ConnParams,
    /// Identity and sizes.
    pub info: SmcdInfo,
    /// This connection's slot in the engine's status area: counters, cursors, state.
    pub slot: ConnSlot,
    /// Whether the peer's ring was last seen full (to count the event once).
    rx_full: AtomicBool,
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

fn to_cstate(f: ConnFlags) -> ConnStateFlags {
    let mut c = ConnStateFlags::EMPTY;
    c.set(ConnStateFlags::PEER_DONE_WRITING, f.done_writing);
    c.set(ConnStateFlags::PEER_CONN_CLOSED, f.closed);
    c.set(ConnStateFlags::PEER_CONN_ABORT, f.abort);
    c
}

fn from_cstate(c: ConnStateFlags) -> ConnFlags {
    ConnFlags {
        done_writing: c.peer_done_writing(),
        closed: c.peer_conn_closed(),
        abort: c.peer_conn_abort(),
    }
}

fn aborted_error(kind: AbortKind) -> io::Error {
    match kind {
        AbortKind::Reset => io::Error::from(io::ErrorKind::ConnectionReset),
        AbortKind::Aborted => io::Error::from(io::ErrorKind::ConnectionAborted),
    }
}

impl SmcConn {
    /// Wraps a finished handshake: `own` is the DMB we receive into (already reset), `peer`
    /// the peer's attached DMB.
    pub fn new(
        clcsock: TcpStream,
        own: Arc<Dmb>,
        peer: Arc<Dmb>,
        params: ConnParams,
        info: SmcdInfo,
        slot: ConnSlot,
    ) -> Self {
        let _ = clcsock.set_nodelay(true);
        Self {
            clcsock,
            own,
            peer,
            rx: Mutex::new(Rx {
                consumed: 0,
                produced: 0,
                confirmed: 0,
                last_prod_word: 0,
                last_cons_word: 0,
                peer_pflags: ProducerFlags::EMPTY,
                read_shutdown: false,
            }),
            tx: Mutex::new(Tx {
                produced: 0,
                published: 0,
                peer_consumed: 0,
                last_cons_word: 0,
                write_blocked: false,
            }),
            out: Mutex::new(Out {
                confirmed: 0,
                pflags: ProducerFlags::EMPTY,
                cflags: ConnStateFlags::EMPTY,
            }),
            close: Mutex::new(CloseMachine::active()),
            seen_cflags: AtomicU8::new(0),
            aborted: AtomicBool::new(false),
            send_ok: AtomicBool::new(true),
            nonblocking: AtomicBool::new(false),
            nodelay: AtomicBool::new(false),
            cork: AtomicBool::new(false),
            read_timeout: AtomicU64::new(0),
            write_timeout: AtomicU64::new(0),
            readiness: OnceLock::new(),
            params,
            info,
            slot,
            rx_full: AtomicBool::new(false),
        }
    }

    fn rx_ring(&self) -> usize {
        self.own.map.ring_len()
    }

    fn tx_ring(&self) -> usize {
        self.peer.map.ring_len()
    }

    /// How many bytes may be written and unconsumed at once: the peer's ring, or less when the
    /// send buffer (`wmem`) is smaller.
    fn tx_window(&self) -> u64 {
        self.tx_ring().min(self.params.sndbuf.max(1)) as u64
    }

    /// The TCP connection underneath.
    pub fn clcsock(&self) -> &TcpStream {
        &self.clcsock
    }

    /// Our DMB.
    pub fn own_dmb(&self) -> &Arc<Dmb> {
        &self.own
    }

    /// The peer's DMB.
    pub fn peer_dmb(&self) -> &Arc<Dmb> {
        &self.peer
    }

    /// The close state.
    pub fn state(&self) -> SmcState {
        lock(&self.close).state()
    }

    // ----------------------------------------------------------------------------------
    // Publishing into the peer's DMB.

    /// Updates what we publish in the peer's consumer word and stores it.
    fn publish_out(&self, f: impl FnOnce(&mut Out)) -> Out {
        let mut out = lock(&self.out);
        f(&mut out);
        let word = cursor::cons_word(out.confirmed, self.rx_ring(), out.pflags, out.cflags);
        // Release: the reader may use the space we confirm; everything we read before is done.
        self.peer.map.cons_word().store(word, Ordering::Release);
        self.slot.set_cursor(Curs::TxCons, out.confirmed);
        *out
    }

    /// Publishes our producer cursor if it moved and wakes the peer's reader if it sleeps.
    fn publish_prod(&self, tx: &mut Tx) {
        if tx.produced == tx.published {
            return;
        }
        let word = cursor::prod_word(tx.produced, self.tx_ring());
        // Release: the bytes copied into the ring become visible with the cursor.
        self.peer.map.prod_word().store(word, Ordering::Release);
        tx.published = tx.produced;
        self.peer.notify(Dir::Rx);
        // With the loopback device a published byte is also sent and finished at once: the
        // reader of the slot takes tx_sent and tx_fin from tx_prod.
        self.slot.set_cursor(Curs::TxProd, tx.published);
    }

    // ----------------------------------------------------------------------------------
    // Reading the peer's words from our DMB.

    /// Feeds connection-state flags to the close machine (once per change).
    fn observe_cflags(&self, c: ConnStateFlags) {
        let bits = c.bits() & ConnStateFlags::KNOWN.bits();
        let seen = self.seen_cflags.load(Ordering::Relaxed);
        if bits & !seen == 0 {
            return;
        }
        self.seen_cflags.fetch_or(bits, Ordering::Relaxed);
        let acts = lock(&self.close).peer_flags(from_cstate(c));
        self.apply(acts);
    }

    /// Loads the peer's words for the receive side; returns the bytes available.
    fn rx_refresh(&self, rx: &mut Rx) -> io::Result<u64> {
        // Flags first, then the producer word: the peer stores them in the opposite order, so
        // a close flag seen here comes with every byte written before it.
        let cw = self.own.map.cons_word().load(Ordering::Acquire);
        let pw = self.own.map.prod_word().load(Ordering::Acquire);
        if cw != rx.last_cons_word {
            rx.last_cons_word = cw;
            let w = SmcdCursorWord::decode(cw);
            rx.peer_pflags = w.prod_flags;
            self.observe_cflags(w.conn_flags);
        }
        if pw != rx.last_prod_word {
            let w = SmcdCursorWord::decode(pw);
            let ring = self.rx_ring();
            match cursor::from_cursor(w.cursor, ring, rx.produced, rx.consumed + ring as u64) {
                Ok(p) => {
                    rx.produced = p;
                    rx.last_prod_word = pw;
                    self.slot.set_cursor(Curs::RxProd, p);
                    // SMC_STAT_RMB_RX_FULL: the peer filled our buffer.
                    let full = p - rx.consumed == ring as u64;
                    if full != self.rx_full.swap(full, Ordering::Relaxed) && full {
                        self.slot.total(st::T_RX_RMB + st::RMB_FULL, 1);
                    }
                }
                Err(e) => return Err(self.violation(&format!("producer cursor: {e}"))),
            }
        }
        Ok(rx.produced - rx.consumed)
    }

    /// Loads the peer's consumer cursor for the send side.
    fn tx_refresh(&self, tx: &mut Tx) -> io::Result<()> {
        let cw = self.own.map.cons_word().load(Ordering::Acquire);
        if cw == tx.last_cons_word {
            return Ok(());
        }
        let w = SmcdCursorWord::decode(cw);
        match cursor::from_cursor(w.cursor, self.tx_ring(), tx.peer_consumed, tx.published) {
            Ok(p) => {
                tx.peer_consumed = p;
                tx.last_cons_word = cw;
                self.slot.set_cursor(Curs::RxCons, p);
            }
            Err(e) => return Err(self.violation(&format!("consumer cursor: {e}"))),
        }
        self.observe_cflags(w.conn_flags);
        Ok(())
    }

    /// The peer broke the shared-memory protocol: abort this connection.
    fn violation(&self, what: &str) -> io::Error {
        tracing::warn!(
            lgr = self.info.lgr_id,
            "SMC-D peer protocol violation: {what}"
        );
        self.abort(AbortKind::Aborted);
        io::Error::new(
            io::ErrorKind::ConnectionAborted,
            format!("SMC-D peer wrote an invalid {what}"),
        )
    }

    /// Aborts the connection locally (`smc_close_active_abort`).
    pub fn abort(&self, kind: AbortKind) {
        let acts = lock(&self.close).local_abort(kind);
        self.aborted.store(true, Ordering::Release);
        self.apply(acts);
        // Wake our own sleepers: nobody else will.
        self.own.map.rx_waiting().store(0, Ordering::Release);
        self.own.map.tx_waiting().store(0, Ordering::Release);
        let _ = rustix::thread::futex::wake(
            self.own.map.rx_waiting(),
            rustix::thread::futex::Flags::empty(),
            u32::MAX,
        );
        let _ = rustix::thread::futex::wake(
            self.own.map.tx_waiting(),
            rustix::thread::futex::Flags::empty(),
            u32::MAX,
        );
        self.own.bell.ring();
    }

    /// Carries out what the close machine asked for.
    fn apply(&self, acts: CloseActions) {
        let (can_send, state, shut) = {
            let c = lock(&self.close);
            let shut = u8::from(c.rcv_shutdown()) | u8::from(c.sent().any()) << 1;
            (c.can_send(), c.state(), shut)
        };
        self.send_ok.store(can_send, Ordering::Release);
        self.slot.set_state(state as u8, shut);
        if let Some(flags) = acts.send {
            self.publish_out(|o| o.cflags = to_cstate(flags));
            self.peer.notify(Dir::Rx);
            self.peer.notify(Dir::Tx);
        }
        if acts.abort_tcp {
            // RST instead of FIN, as tcp_abort() in the kernel.
            let _ = rustix::net::sockopt::set_socket_linger(&self.clcsock, Some(Duration::ZERO));
            let _ = self.clcsock.shutdown(Shutdown::Both);
        } else if acts.shutdown_tcp {
            let _ = self.clcsock.shutdown(Shutdown::Both);
        }
    }

    // ----------------------------------------------------------------------------------
    // Waiting.

    /// Checks the TCP connection: true if the peer is gone (end of stream without a close,
    /// reset, or unexpected bytes).
    fn clcsock_dead(&self) -> bool {
        let mut fds = [PollFd::new(&self.clcsock, PollFlags::IN | PollFlags::RDHUP)];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut fds, Some(&zero)) {
            Ok(0) => false,
            Ok(_) => {
                let mut b = [0u8; 1];
                !matches!(
                    rustix::net::recv(
                        &self.clcsock,
                        &mut b,
                        rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT
                    ),
                    Err(rustix::io::Errno::AGAIN)
                )
            }
            Err(_) => false,
        }
    }

    /// The TCP connection ended: a close from the peer may already be in shared memory (it is
    /// written before the TCP shutdown); otherwise the peer vanished.
    fn tcp_gone(&self) {
        let cw = self.own.map.cons_word().load(Ordering::Acquire);
        self.observe_cflags(SmcdCursorWord::decode(cw).conn_flags);
        let graceful = lock(&self.close).received().any_close();
        if !graceful {
            self.abort(AbortKind::Reset);
        }
    }

    /// Waits until `changed()` or the deadline: spins for the configured budget, then sleeps
    /// on the futex word for `dir`, checking the TCP connection every [`LIVENESS_PERIOD`].
    /// Returns `Err(WouldBlock)` at the deadline (as std's socket timeouts do).
    fn wait(
        &self,
        dir: Dir,
        deadline: Option<Instant>,
        changed: &dyn Fn() -> bool,
    ) -> io::Result<()> {
        if !self.params.spin.is_zero() {
            let until = Instant::now() + self.params.spin;
            loop {
                for _ in 0..64 {
                    if changed() {
                        return Ok(());
                    }
                    std::hint::spin_loop();
                }
                if Instant::now() >= until {
                    break;
                }
            }
        }
        loop {
            let armed = self.own.arm(dir, WAIT_FUTEX);
            if changed() || self.aborted.load(Ordering::Acquire) {
                self.own.disarm(dir, WAIT_FUTEX);
                return Ok(());
            }
            let mut t = LIVENESS_PERIOD;
            if let Some(d) = deadline {
                let now = Instant::now();
                if now >= d {
                    self.own.disarm(dir, WAIT_FUTEX);
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                t = t.min(d - now);
            }
            self.own.sleep(dir, armed, t);
            self.own.disarm(dir, WAIT_FUTEX);
            if changed() || self.aborted.load(Ordering::Acquire) {
                return Ok(());
            }
            if self.clcsock_dead() {
                self.tcp_gone();
                return Ok(());
            }
        }
    }

    /// For non-blocking calls: announce on the doorbell that we wait for `dir`, so the peer
    /// rings it (and the readiness descriptor becomes readable).
    fn arm_doorbell(&self, dir: Dir) {
        self.own.arm(dir, WAIT_EVENTFD);
    }

    /// A non-blocking call found nothing to do: reset the doorbell (the event loop has seen
    /// what rang it) and arm it for `dir`. The caller re-checks its condition afterwards, so
    /// a ring between the two is never lost. Only here, not on every call: a call that moves
    /// data costs no system call on the doorbell.
    fn rearm_doorbell(&self, dir: Dir) {
        self.own.bell.drain();
        self.arm_doorbell(dir);
    }

    fn deadline(&self, t: &AtomicU64) -> Option<Instant> {
        match t.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Instant::now() + Duration::from_nanos(ns)),
        }
    }

    // ----------------------------------------------------------------------------------
    // The receive path (smc_rx_recvmsg).

    /// Reads into `buf`. Returns 0 at end of stream.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut rx = lock(&self.rx);
        let nonblocking = self.nonblocking.load(Ordering::Relaxed);
        if nonblocking {
            self.own.disarm(Dir::Rx, WAIT_EVENTFD);
        }
        let deadline = self.deadline(&self.read_timeout);
        loop {
            let avail = self.rx_refresh(&mut rx)?;
            if avail > 0 {
                let n = (avail as usize).min(buf.len());
                // Copy out in chunks and let the window rule run after each, so a writer
                // waiting for space refills the ring while we copy the rest (the receive-side
                // half of the copy pipeline; the kernel runs the rule once per loop).
                let chunk = (self.rx_ring() / 4).max(RX_CHUNK_MIN);
                let mut done = 0;
                while done < n {
                    let k = chunk.min(n - done);
                    let at = (rx.consumed % self.rx_ring() as u64) as usize;
                    self.own.map.read_ring(at, &mut buf[done..done + k]);
                    rx.consumed += k as u64;
                    done += k;
                    self.consumer_update(&mut rx, false);
                }
                self.slot.rx(buf.len(), n);
                return Ok(n);
            }
            if rx.read_shutdown {
                return Ok(0);
            }
            {
                let close = lock(&self.close);
                if let Some(kind) = close.error() {
                    return Err(aborted_error(kind));
                }
                if close.rcv_shutdown() {
                    return Ok(0);
                }
            }
            if nonblocking {
                self.rearm_doorbell(Dir::Rx);
                if self.rx_refresh(&mut rx)? > 0 || self.seen_cflags.load(Ordering::Relaxed) != 0 {
                    continue;
                }
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let (pw, cw) = (rx.last_prod_word, rx.last_cons_word);
            let own = &self.own;
            self.wait(Dir::Rx, deadline, &|| {
                own.map.prod_word().load(Ordering::Acquire) != pw
                    || own.map.cons_word().load(Ordering::Acquire) != cw
            })?;
        }
    }

    /// Bytes readable right now without blocking.
    pub fn available(&self) -> io::Result<usize> {
        let mut rx = lock(&self.rx);
        Ok(self.rx_refresh(&mut rx)? as usize)
    }

    /// Publishes our consumer cursor if the kernel's rule says so (`smc_tx_consumer_update`).
    fn consumer_update(&self, rx: &mut Rx, force: bool) {
        let ring = self.rx_ring();
        let view = ConsumerView {
            ring_len: ring,
            confirmed: rx.confirmed,
            consumed: rx.consumed,
            produced: rx.produced,
            peer_write_blocked: rx.peer_pflags.write_blocked(),
            peer_requested: rx.peer_pflags.cons_curs_upd_req(),
        };
        let limit = window::rmbe_update_limit(ring, self.params.wnd_rule);
        if window::should_update_consumer(&view, limit, force) {
            let consumed = rx.consumed;
            rx.confirmed = consumed;
            self.publish_out(|o| o.confirmed = consumed);
            self.peer.notify(Dir::Tx);
        }
    }

    // ----------------------------------------------------------------------------------
    // The send path (smc_tx_sendmsg).

    fn check_send(&self) -> io::Result<()> {
        if self.send_ok.load(Ordering::Acquire) {
            return Ok(());
        }
        let close = lock(&self.close);
        if let Some(kind) = close.error() {
            return Err(aborted_error(kind));
        }
        if !close.can_send() {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        Ok(())
    }

    fn set_write_blocked(&self, tx: &mut Tx, on: bool) {
        if tx.write_blocked != on {
            tx.write_blocked = on;
            self.publish_out(|o| o.pflags.set(ProducerFlags::WRITE_BLOCKED, on));
            // The reader may be asleep with unconfirmed consumption: it must look again.
            self.peer.notify(Dir::Rx);
        }
    }

    /// Writes all of `buf` (blocking) or as much as fits (non-blocking). `more` is
    /// `MSG_MORE`: leave the data unpublished while the ring has room.
    pub fn write_with(&self, buf: &[u8], more: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut tx = lock(&self.tx);
        self.check_send()?;
        let nonblocking = self.nonblocking.load(Ordering::Relaxed);
        if nonblocking {
            self.own.disarm(Dir::Tx, WAIT_EVENTFD);
        }
        let deadline = self.deadline(&self.write_timeout);
        let ring = self.tx_ring() as u64;
        let window = self.tx_window();
        if buf.len() as u64 > window {
            // SMC_STAT_RMB_TX_SIZE_SMALL / _PEER_SIZE_SMALL: the send buffer is the peer's ring.
            self.slot.total(st::T_TX_RMB + st::RMB_SIZE_SM, 1);
            self.slot.total(st::T_TX_RMB + st::RMB_SIZE_SM_PEER, 1);
        }
        let mut written = 0usize;
        while written < buf.len() {
            let mut free = window.saturating_sub(tx.produced - tx.peer_consumed);
            if free == 0 {
                self.tx_refresh(&mut tx)?;
                free = window.saturating_sub(tx.produced - tx.peer_consumed);
            }
            if free > 0 {
                let want = (buf.len() - written).min(free as usize);
                let mut n = window::autosplit_chunk(want, self.params.autosplit_size);
                if self.params.tx_chunk > 0 {
                    n = n.min(self.params.tx_chunk);
                }
                let at = (tx.produced % ring) as usize;
                self.peer.map.write_ring(at, &buf[written..written + n]);
                tx.produced += n as u64;
                written += n;
                if n < want {
                    // Autosplit (or the engine's finer pipeline chunk): publish this chunk now
                    // so the reader copies it out while we copy the next one in.
                    self.publish_prod(&mut tx);
                }
                continue;
            }
            // The peer's ring is full: everything written must be visible before we wait.
            self.publish_prod(&mut tx);
            self.slot.total(st::T_TX_RMB + st::RMB_FULL, 1);
            self.slot.total(st::T_TX_RMB + st::RMB_FULL_PEER, 1);
            if let Err(e) = self.check_send() {
                return if written > 0 { Ok(written) } else { Err(e) };
            }
            if nonblocking {
                if written > 0 {
                    break;
                }
                self.set_write_blocked(&mut tx, true);
                self.rearm_doorbell(Dir::Tx);
                self.tx_refresh(&mut tx)?;
                if window.saturating_sub(tx.produced - tx.peer_consumed) > 0 {
                    continue;
                }
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.set_write_blocked(&mut tx, true);
            let cw = tx.last_cons_word;
            let own = &self.own;
            match self.wait(Dir::Tx, deadline, &|| {
                own.map.cons_word().load(Ordering::Acquire) != cw
            }) {
                Ok(()) => {}
                Err(e) if written > 0 && e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
            if let Err(e) = self.check_send() {
                return if written > 0 { Ok(written) } else { Err(e) };
            }
        }
        let free = window.saturating_sub(tx.produced - tx.peer_consumed);
        let corked = (more || self.cork.load(Ordering::Relaxed)) && free > 0;
        if !corked {
            self.publish_prod(&mut tx);
        }
        if tx.write_blocked && free > 0 {
            self.set_write_blocked(&mut tx, false);
        }
        self.slot.set_cursor(Curs::TxPrep, tx.produced);
        self.slot.tx(buf.len(), written);
        Ok(written)
    }

    /// Publishes anything written but held back by cork.
    pub fn flush(&self) -> io::Result<()> {
        let mut tx = lock(&self.tx);
        self.publish_prod(&mut tx);
        Ok(())
    }

    // ----------------------------------------------------------------------------------
    // Options.

    /// `TCP_NODELAY`: setting it pushes held-back data at once.
    pub fn set_nodelay(&self, on: bool) {
        self.nodelay.store(on, Ordering::Relaxed);
        if on {
            self.slot.bump(st::Cnt::Ndly, 1);
            let _ = self.flush();
        }
    }

    /// Current `TCP_NODELAY`.
    pub fn nodelay(&self) -> bool {
        self.nodelay.load(Ordering::Relaxed)
    }

    /// `TCP_CORK`: while set, writes are not published until the ring fills; clearing it
    /// pushes them.
    pub fn set_cork(&self, on: bool) {
        self.cork.store(on, Ordering::Relaxed);
        if !on {
            self.slot.bump(st::Cnt::Cork, 1);
            let _ = self.flush();
        }
    }

    /// Current cork.
    pub fn cork(&self) -> bool {
        self.cork.load(Ordering::Relaxed)
    }

    /// Non-blocking mode.
    pub fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Ordering::Relaxed);
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

    /// A descriptor `poll`/`epoll` can wait on: readable when the peer published data, freed
    /// space or closed, or the TCP connection ended. After it fires, call read and write until
    /// they return `WouldBlock` (each call re-arms the notification it needs).
    pub fn readiness_fd(&self) -> io::Result<BorrowedFd<'_>> {
        if let Some(fd) = self.readiness.get() {
            return Ok(fd.as_fd());
        }
        use rustix::event::epoll;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(
            &ep,
            &self.own.bell,
            epoll::EventData::new_u64(0),
            epoll::EventFlags::IN,
        )?;
        epoll::add(
            &ep,
            &self.clcsock,
            epoll::EventData::new_u64(1),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        )?;
        let _ = self.readiness.set(ep);
        Ok(self.readiness.get().expect("just set").as_fd())
    }

    /// Arms both directions for an event loop that is about to wait on [`Self::readiness_fd`]
    /// without having seen `WouldBlock` (e.g. right after connect).
    pub fn arm_readiness(&self) {
        self.arm_doorbell(Dir::Rx);
        self.arm_doorbell(Dir::Tx);
        // Anything that arrived before arming would otherwise be missed.
        if self.available().unwrap_or(1) > 0 {
            self.own.bell.ring();
        }
    }

    // ----------------------------------------------------------------------------------
    // Shutdown and close.

    /// `shutdown(how)`.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match how {
            Shutdown::Read => {
                lock(&self.rx).read_shutdown = true;
                Ok(())
            }
            Shutdown::Write => {
                self.flush()?;
                let acts = lock(&self.close).app_shutdown_write();
                self.apply(acts);
                Ok(())
            }
            Shutdown::Both => {
                lock(&self.rx).read_shutdown = true;
                self.close_now();
                Ok(())
            }
        }
    }

    /// The application closes: publish what is written, then the close (or an abort when
    /// received data is left unread). Returns whether the DMB may be reused at once (the peer
    /// has closed too); otherwise it may be reused once the peer's close arrives.
    pub fn close_now(&self) -> bool {
        let _ = self.flush();
        let unread = {
            let mut rx = lock(&self.rx);
            self.rx_refresh(&mut rx).map(|n| n > 0).unwrap_or(false)
        };
        let acts = lock(&self.close).app_close(unread);
        self.apply(acts);
        let close = lock(&self.close);
        close.state() == SmcState::Closed && !self.aborted.load(Ordering::Acquire)
    }

    /// Whether the peer has closed (its close or abort flag is in our DMB): after that it
    /// never writes into our DMB again.
    pub fn peer_closed(&self) -> bool {
        let cw = self.own.map.cons_word().load(Ordering::Acquire);
        from_cstate(SmcdCursorWord::decode(cw).conn_flags).any_close()
    }

    /// Whether this connection aborted (its DMB must not be reused).
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }
}
