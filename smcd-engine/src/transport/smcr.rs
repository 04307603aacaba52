//! SMC-R: a connection's bytes go by RDMA WRITE from its send buffer into the peer's RMB, and
//! each CDC is a 44-byte SEND after them on the same RC queue pair (RC order makes the data
//! visible first), whose completion (the peer acknowledged it) frees the send buffer up to
//! its cursor (`smc_tx.c`, `smc_cdc.c`, `smc_wr.c`).
//!
//! Two layers:
//! - [`RoceLink`]: one link of a link group, an RC QP with its completion queues and the
//!   receive buffers posted on it, shared by the group's connections. Its completion thread
//!   waits on the CQs' channels, drains both queues fully, re-arms with report-missed-events
//!   and drains again if anything slipped in (the kernel's "don't req_notify until all CQEs
//!   drained"), and hands each received CDC and each completed CDC send to the connection
//!   its token names, waking it if it waits.
//! - [`SmcrLink`]: one connection on a [`RoceLink`], the [`Transport`] the connection driver
//!   runs. Waiting needs no descriptor: a thread sleeps on a futex word of the connection,
//!   an event loop on its [`Readiness`], which the completion thread rings itself (same
//!   process: no bell travels).
//!
//! LLC messages arriving on the link go to the link's LLC handler (the link group's flow
//! machine); without one they are dropped and counted.

use super::{Readiness, Transport, Waiter};
use crate::device::Dir;
use smc_core::conn::{HostCdc, RemoteWrite};
use smc_proto::cdc::SmcrCdcRepr;
use smc_rdma::verbs::{
    CompletionQueue, CqHandler, Device, Memory, MemoryRegion, Payload, QpModify, QueuePair, RecvWr,
    SendOp, SendWr, Served, Sge, Wc, WcOpcode, WcStatus,
};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

/// Receive buffers per link by default (`smcr_max_recv_wr`).
pub const RECV_WRS: u32 = 48;
/// Bytes per receive buffer (`SMC_WR_BUF_SIZE`).
pub const RECV_BUF: u32 = 48;
/// The first scatter entry of a receive in an SMC-Rv2 link (`SMC_WR_TX_SIZE`): a message's
/// first 44 bytes land in its own buffer, the rest in the link's v2 buffer.
pub const V2_FIRST_SGE: u32 = 44;
/// The v2 buffer (`SMC_WR_BUF_V2_SIZE`): the longest SMC-Rv2 LLC message sent or received.
pub const V2_BUF: u32 = 8192;
/// The region an SMC-Rv2 link needs besides its receive buffers ([`RoceLink::start_in`]):
/// the receive side's v2 buffer, then the send side's.
pub const V2_REGION: usize = 2 * V2_BUF as usize;
/// The longest RDMA WRITE sent inline (the QP's `max_inline_data` may be less).
const INLINE_MAX: usize = 64;
/// How long a sender waits for a free send slot before the link counts as failed
/// (`SMC_WR_TX_WAIT_FREE_SLOT_TIME`).
pub const SLOT_WAIT: Duration = Duration::from_secs(10);

/// What a work request id says: its kind in the top byte, the connection's token, the CDC's
/// sequence number.
const WR_CDC: u64 = 1 << 56;
const WR_WRITE: u64 = 2 << 56;
/// An LLC message sent from the v2 send buffer (longer than inline).
const WR_LLC_V2: u64 = 3 << 56;
const WR_KIND: u64 = 0xff << 56;

/// What the link hands a connection.
#[derive(Default)]
struct Side {
    /// Received CDCs, in order.
    cdcs: Mutex<VecDeque<HostCdc>>,
    /// Sequence numbers of our CDC sends that completed.
    done: Mutex<VecDeque<u16>>,
    /// Entries in `cdcs` + `done`: the data path's cheap look.
    pending: AtomicU32,
    /// Threads inside a blocking wait on the connection ([`Transport::wait_begin`]): each looks
    /// at what is pending before it returns, so an arrival needs no other thread to do it.
    in_wait: AtomicU32,
    /// The link failed under the connection: it sees an abort.
    failed: AtomicBool,
    /// The connection was moved to another link ([`SmcrLink::switch`]): it fails over.
    switched: AtomicBool,
    /// Per direction: who waits (0 nobody, else a `Waiter` bit set), and the futex word a
    /// sleeping thread waits on.
    armed: [AtomicU32; 2],
    wake_gen: [AtomicU32; 2],
    /// A thread waiting to read needs to see our sends complete
    /// ([`Transport::reader_needs_completions`]); otherwise completions alone leave it asleep.
    reader_needs_done: AtomicBool,
    /// Per direction: threads asleep on `wake_gen` (a wake without them makes no call).
    sleepers: [AtomicU32; 2],
    /// Per direction: the queue whose device a waiting thread serves
    /// ([`CompletionQueue::serve`]) instead of sleeping on `wake_gen`, while it does.
    server: [Mutex<Option<Arc<dyn CompletionQueue>>>; 2],
    serving: [AtomicBool; 2],
    ready: OnceLock<Readiness>,
    /// Runs the connection's CDC processing (see [`Transport::set_service`]).
    service: OnceLock<Box<dyn Fn() -> bool + Send + Sync>>,
}

impl std::fmt::Debug for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Side")
            .field("pending", &self.pending.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

const ARM_THREAD: u32 = 1;
const ARM_EVENT: u32 = 2;

fn di(d: Dir) -> usize {
    match d {
        Dir::Rx => 0,
        Dir::Tx => 1,
    }
}

impl Side {
    /// Wakes whoever waits for `dir` (called after publishing what they wait for); returns
    /// whether someone waited.
    fn wake(&self, dir: Dir) -> bool {
        let i = di(dir);
        // SeqCst with the waiter's announcement (store armed, then look): either it sees what
        // was published, or we see it armed.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.armed[i].load(Ordering::Relaxed) == 0 {
            return false;
        }
        let how = self.armed[i].swap(0, Ordering::SeqCst);
        if how & ARM_THREAD != 0 {
            // SeqCst with the sleeper's count (up, then the futex's look at `wake_gen`) and
            // with a server's announcement (`serving`, then its look at `armed`).
            self.wake_gen[i].fetch_add(1, Ordering::SeqCst);
            if self.sleepers[i].load(Ordering::SeqCst) > 0 {
                let _ = rustix::thread::futex::wake(
                    &self.wake_gen[i],
                    rustix::thread::futex::Flags::PRIVATE,
                    u32::MAX,
                );
            }
            if self.serving[i].load(Ordering::SeqCst)
                && let Some(cq) = lock(&self.server[i]).as_ref()
            {
                cq.wake_server();
            }
        }
        if how & ARM_EVENT != 0
            && let Some(r) = self.ready.get()
        {
            r.bell().ring(dir);
        }
        how != 0
    }

    /// Something arrived for the connection: wakes its waiters; `true` when nothing is left
    /// to process, or a thread inside a blocking wait will process it. An announcement alone
    /// is not trusted: it can outlive its waiter (a thread that found what it waited for
    /// before it slept goes on with its bit set, and may close the connection), and an event
    /// loop that is rung need not read at all; then nobody would. A thread counted in
    /// `in_wait` has not yet left its wait, and looks at the connection after it. Before it
    /// was counted, each arrival while a thread slept woke that thread and poked the
    /// completion thread too, which then raced it for the connection's lock: two wake-ups
    /// per CDC where one does.
    ///
    /// Without `cdc` only our sends completed (the peer's device acknowledged them): that
    /// wakes a thread waiting to read only if the connection said it needs them
    /// (`reader_needs_done`: autocork holds bytes back, a close waits for the last CDC); it
    /// processes them when it wakes. In a ping-pong the acknowledgement of each message would
    /// otherwise wake the reader once more.
    fn woken(&self, cdc: bool) -> bool {
        if cdc || self.reader_needs_done.load(Ordering::SeqCst) {
            self.wake(Dir::Rx);
        }
        self.wake(Dir::Tx);
        // SeqCst with the waiter's leaving (`in_wait` down, then its look at `pending`): a
        // waiter seen here sees what was pending before this look, and processes it.
        self.in_wait.load(Ordering::SeqCst) > 0 || self.pending.load(Ordering::SeqCst) == 0
    }

    /// Something arrived for the connection: wake its waiters, and run its processing here
    /// unless it is done already (whoever takes the connection's lock first processes what
    /// came; the other finds nothing left). Returns `false` if that must be tried again (a thread held the
    /// connection and may leave without looking).
    fn arrived(&self) -> bool {
        self.woken(true) || self.service.get().is_none_or(|f| f())
    }
}

/// Handles LLC messages received on a link (the link group's flow machine).
pub type LlcHandler = Box<dyn Fn(&[u8]) + Send + Sync>;

/// Told that a link failed (an error completion, a post that failed); it must not block.
pub type FailHandler = Box<dyn Fn() + Send + Sync>;

/// The connections of a link group by token, shared by its links: a CDC or a completion is
/// the connection's whichever link it came on (the kernel looks connections up in the group).
#[derive(Clone, Default)]
pub struct ConnTable(Arc<RwLock<HashMap<u32, Arc<Side>>>>);

impl std::fmt::Debug for ConnTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnTable")
            .field("conns", &read(&self.0).len())
            .finish()
    }
}

/// A wait for what completion queues' handlers signal, made without serving their devices
/// ([`CompletionQueue::unserved_wait_begin`]); over when dropped.
pub(crate) struct UnservedWait(Vec<Arc<dyn CompletionQueue>>);

impl UnservedWait {
    pub(crate) fn on(cqs: impl Iterator<Item = Arc<dyn CompletionQueue>>) -> Self {
        let cqs: Vec<_> = cqs.collect();
        for c in &cqs {
            c.unserved_wait_begin();
        }
        Self(cqs)
    }
}

impl Drop for UnservedWait {
    fn drop(&mut self) {
        for c in &self.0 {
            c.unserved_wait_over();
        }
    }
}

/// One RoCE link: an RC QP in RTS with its completion queues, shared by connections.
pub struct RoceLink<D: Device> {
    qp: D::Qp,
    /// The QP's `max_inline_data`.
    inline_max: u32,
    scq: Arc<D::Cq>,
    rcq: Arc<D::Cq>,
    recv_mr: D::Mr,
    /// SMC-Rv2 links: [`V2_REGION`] bytes, the receive spill buffer (bytes 0..8192) and the
    /// send buffer of LLC messages longer than inline (8192..16384), as the kernel's
    /// `wr_rx_buf_v2` / `wr_tx_v2_buf`.
    v2: Option<D::Mr>,
    /// The v2 send buffer is posted and not completed yet (`smc_wr_tx_get_v2_slot`: one
    /// message at a time).
    v2_tx_busy: AtomicBool,
    conns: ConnTable,
    llc: OnceLock<LlcHandler>,
    on_fail: OnceLock<FailHandler>,
    stop: AtomicBool,
    failed: AtomicBool,
    /// Receives that were neither a CDC for a known connection nor LLC.
    dropped: AtomicU64,
    /// Connections whose processing could not run when their CDC or completion arrived: the
    /// completion thread tries again (soon) until it ran or nothing is pending.
    retry: Mutex<Vec<Arc<Side>>>,
    /// Held while receive completions are polled and handed on: whoever takes it next sees
    /// every receive polled before as its connection's (see [`RoceLink::drain_rx`]).
    rx_drain: Mutex<()>,
    /// The device runs [`RoceLink::on_device`] on its own thread when completions arrive
    /// ([`CompletionQueue::set_handler`]); the completion thread then only serves what that
    /// may not do (LLC messages, connections nobody waits in) when poked.
    on_device: AtomicBool,
    /// LLC messages received while `on_device`, for the completion thread, in order.
    llc_queue: Mutex<VecDeque<Vec<u8>>>,
    /// Wakes the completion thread (an eventfd).
    poke: Arc<rustix::fd::OwnedFd>,
    /// Bumped when the device's thread drained send completions while senders wait for a
    /// slot ([`RoceLink::post`]); the futex word they sleep on.
    slot_gen: AtomicU32,
    slot_waiters: AtomicU32,
}

/// Who hands completions on ([`RoceLink::drain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drainer {
    /// The completion thread: a connection nobody waits in is processed here.
    Thread,
    /// A sender polling for a slot (maybe holding a connection): such a connection is left to
    /// the completion thread.
    Poster,
    /// The device's thread ([`RoceLink::on_device`]): waiters are woken; what must not run
    /// there is left to the completion thread, which is poked.
    Device,
}

impl<D: Device> std::fmt::Debug for RoceLink<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceLink")
            .field("qp", &self.qp.qp_num())
            .field("failed", &self.failed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<D: Device> RoceLink<D> {
    /// Its receive completion queue (the device's input arrives through it).
    pub(crate) fn recv_cq(&self) -> Arc<dyn CompletionQueue> {
        self.rcq.clone()
    }

    /// Takes a QP that reached RTS (or RTR: it may send once RTS), posts its receive buffers
    /// from `recv_mr` (at least [`RECV_WRS`] × [`RECV_BUF`] bytes) and starts the completion
    /// thread.
    pub fn start(
        qp: D::Qp,
        scq: Arc<D::Cq>,
        rcq: Arc<D::Cq>,
        recv_mr: D::Mr,
    ) -> io::Result<Arc<Self>> {
        Self::start_in(qp, scq, rcq, recv_mr, ConnTable::default(), RECV_WRS, None)
    }

    /// [`RoceLink::start`] for a link of a group whose connections are `conns`, posting
    /// `recv_wrs` receive buffers (`smcr_max_recv_wr`) from `recv_mr`.
    ///
    /// With `v2` (an SMC-Rv2 link group; [`V2_REGION`] bytes, the QP made with
    /// `max_recv_sge` 2) the receives are posted as the kernel's v2 links post them
    /// (`smc_wr_init_sge`): {the first 44 bytes in the buffer's own slot, the rest in one
    /// 8148-byte v2 buffer shared by all receives}, so messages up to 8192 bytes arrive; and
    /// [`RoceLink::send_llc`] sends messages longer than inline from the v2 send buffer.
    /// Like the kernel's, the shared receive spill holds one long message at a time: the
    /// completion is copied out when polled, and a second long message arriving before that
    /// overwrites it (Linux sends one long LLC message per flow step and waits for the
    /// answer, so that only a misbehaving peer does, garbling its own group's LLC).
    pub fn start_in(
        qp: D::Qp,
        scq: Arc<D::Cq>,
        rcq: Arc<D::Cq>,
        recv_mr: D::Mr,
        conns: ConnTable,
        recv_wrs: u32,
        v2: Option<D::Mr>,
    ) -> io::Result<Arc<Self>> {
        if recv_wrs == 0 || recv_mr.len() < recv_wrs as usize * RECV_BUF as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "receive region too small",
            ));
        }
        if v2.as_ref().is_some_and(|m| m.len() < V2_REGION) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "v2 region too small",
            ));
        }
        let link = Arc::new(Self {
            inline_max: qp.caps().max_inline_data,
            qp,
            scq,
            rcq,
            recv_mr,
            v2,
            v2_tx_busy: AtomicBool::new(false),
            conns,
            llc: OnceLock::new(),
            on_fail: OnceLock::new(),
            stop: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            retry: Mutex::new(Vec::new()),
            rx_drain: Mutex::new(()),
            on_device: AtomicBool::new(false),
            slot_gen: AtomicU32::new(0),
            slot_waiters: AtomicU32::new(0),
            llc_queue: Mutex::new(VecDeque::new()),
            poke: Arc::new(rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
            )?),
        });
        // Before the receives are posted: completions for them find the handler.
        let weak = Arc::downgrade(&link);
        let h: CqHandler = Arc::new(move || {
            if let Some(l) = weak.upgrade() {
                l.on_device();
            }
        });
        let on_device = link.rcq.set_handler(Arc::clone(&h)) && link.scq.set_handler(h);
        link.on_device.store(on_device, Ordering::Release);
        for i in 0..recv_wrs {
            link.post_recv(u64::from(i)).map_err(io::Error::other)?;
        }
        let l = Arc::downgrade(&link);
        std::thread::Builder::new()
            .name(format!("smcr-cq-{}", link.qp.qp_num()))
            .spawn(move || Self::completions(l))?;
        Ok(link)
    }

    /// The handler for LLC messages (set once).
    pub fn set_llc_handler(&self, h: LlcHandler) {
        let _ = self.llc.set(h);
    }

    /// The QP's number.
    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// The QP's work-request and scatter limits.
    pub fn caps(&self) -> smc_rdma::verbs::QpCaps {
        self.qp.caps()
    }

    /// Whether the link failed (an error completion): its connections were aborted.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// What to do when the link fails (set once): a link of a group with another link
    /// leaves its connections to the group, which moves them ([`SmcrLink::switch`]) or ends
    /// them ([`RoceLink::abort`]); without a handler they see an abort at once.
    pub fn set_fail_handler(&self, h: FailHandler) {
        let _ = self.on_fail.set(h);
    }

    /// Whether a failure is the group's to handle: posts on the failed link are then dropped
    /// (what they carried is written again after the failover).
    fn managed(&self) -> bool {
        self.on_fail.get().is_some()
    }

    /// Fails the link from above (the link group ended): every connection of the group sees
    /// an abort.
    pub fn abort(&self) {
        self.failed.store(true, Ordering::Release);
        let _ = self.qp.modify(&QpModify::Error);
        self.abort_conns();
    }

    /// Takes the link out of service without touching its connections (the group moves
    /// them): nothing more is sent on it, and what is queued on its QP is flushed.
    pub fn take_down(&self) {
        if !self.failed.swap(true, Ordering::AcqRel) {
            let _ = self.qp.modify(&QpModify::Error);
        }
    }

    /// Receives that were dropped: too short, an unknown connection, LLC without a handler.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn post_recv(&self, slot: u64) -> Result<(), smc_rdma::verbs::VerbsError> {
        let addr = self.recv_mr.addr() + slot * u64::from(RECV_BUF);
        let lkey = self.recv_mr.lkey();
        self.qp.post_recv(&match &self.v2 {
            Some(v2) => RecvWr {
                wr_id: slot,
                sge: Sge {
                    addr,
                    len: V2_FIRST_SGE,
                    lkey,
                },
                spill: Some(Sge {
                    addr: v2.addr() + u64::from(V2_FIRST_SGE),
                    len: V2_BUF - V2_FIRST_SGE,
                    lkey: v2.lkey(),
                }),
            },
            None => RecvWr::one(
                slot,
                Sge {
                    addr,
                    len: RECV_BUF,
                    lkey,
                },
            ),
        })
    }

    /// Posts an LLC message (or any control SEND) on the link, inline, signaled.
    ///
    /// A message longer than the QP's inline limit (an SMC-Rv2 ADD_LINK with its rkeys, a
    /// REQUEST_ADD_LINK) goes from the link's v2 send buffer, one at a time, as
    /// `smc_wr_tx_v2_send` sends it: a second one waits for the first one's completion (at
    /// most [`SLOT_WAIT`]). Without a v2 buffer, or longer than 8192 bytes: `InvalidInput`.
    pub fn send_llc(&self, msg: &[u8]) -> io::Result<()> {
        if msg.len() <= self.inline_max as usize {
            return self.post(&SendWr {
                wr_id: 0,
                op: SendOp::Send,
                data: Payload::Inline(msg),
                signaled: true,
                solicited: true,
            });
        }
        let Some(v2) = self.v2.as_ref().filter(|_| msg.len() <= V2_BUF as usize) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "LLC message longer than this link sends",
            ));
        };
        let deadline = Instant::now() + SLOT_WAIT;
        while self.v2_tx_busy.swap(true, Ordering::AcqRel) {
            if self.failed() || Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the v2 send buffer stays busy",
                ));
            }
            // Its completion frees it: poll here as `post` does for a slot.
            if self.drain(&*self.scq, Drainer::Poster) == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        v2.memory().write(V2_BUF as usize, msg);
        let r = self.post(&SendWr {
            wr_id: WR_LLC_V2,
            op: SendOp::Send,
            data: Payload::Sges(&[Sge {
                addr: v2.addr() + u64::from(V2_BUF),
                len: msg.len() as u32,
                lkey: v2.lkey(),
            }]),
            signaled: true,
            solicited: true,
        });
        if r.is_err() {
            self.v2_tx_busy.store(false, Ordering::Release);
        }
        r
    }

    /// Posts a send, waiting for a free slot at most [`SLOT_WAIT`] (the send queue frees as
    /// the peer acknowledges).
    fn post(&self, wr: &SendWr<'_>) -> io::Result<()> {
        self.post_list(std::slice::from_ref(wr))
    }

    /// Posts sends in order with one doorbell ([`QueuePair::post_send_list`]), waiting for
    /// free slots as [`RoceLink::post`] does when the queue is full part way.
    fn post_list(&self, wrs: &[SendWr<'_>]) -> io::Result<()> {
        let deadline = Instant::now() + SLOT_WAIT;
        let mut done = 0;
        loop {
            let gen_before = self.slot_gen.load(Ordering::SeqCst);
            match self.qp.post_send_list(&wrs[done..]) {
                Ok(()) => return Ok(()),
                Err((k, smc_rdma::verbs::VerbsError::Full(_))) if Instant::now() < deadline => {
                    done += k;
                    // A device frees send slots as their completions are polled: poll here
                    // rather than wait for the completion thread (which may be the caller).
                    if self.drain(&*self.scq, Drainer::Poster) > 0 {
                        continue;
                    }
                    if !self.on_device.load(Ordering::Acquire) {
                        std::thread::yield_now();
                        continue;
                    }
                    // The device's thread frees slots as the peer acknowledges and says so
                    // after draining send completions (`smc_wr_tx_get_free_slot` sleeps too).
                    // At most 1 ms: a slot freed by an unsignaled request is not announced.
                    self.slot_waiters.fetch_add(1, Ordering::SeqCst);
                    // The ACKs come in through the device without this thread serving it.
                    let _unserved = UnservedWait::on(std::iter::once(self.recv_cq()));
                    let _ = rustix::thread::futex::wait(
                        &self.slot_gen,
                        rustix::thread::futex::Flags::PRIVATE,
                        gen_before,
                        Some(&rustix::time::Timespec {
                            tv_sec: 0,
                            tv_nsec: 1_000_000,
                        }),
                    );
                    self.slot_waiters.fetch_sub(1, Ordering::SeqCst);
                }
                Err((_, e)) => return Err(io::Error::other(e)),
            }
        }
    }

    fn attach(&self, token: u32) -> Arc<Side> {
        Arc::clone(write(&self.conns.0).entry(token).or_default())
    }

    /// Makes the connection `token` known before its [`SmcrLink`] exists, so that CDCs the
    /// peer sends once it has our CLC message are kept for it rather than dropped (the kernel
    /// registers a connection with its link group before the handshake names it). Undo with
    /// [`RoceLink::unreserve`] if the connection does not come.
    pub fn reserve(&self, token: u32) {
        self.attach(token);
    }

    /// Forgets a reservation (and anything kept for it).
    pub fn unreserve(&self, token: u32) {
        self.detach(token);
    }

    fn detach(&self, token: u32) {
        write(&self.conns.0).remove(&token);
    }

    fn side(&self, token: u32) -> Option<Arc<Side>> {
        read(&self.conns.0).get(&token).cloned()
    }

    /// The completion thread: sleep on the channels, drain, re-arm, drain again.
    fn completions(me: std::sync::Weak<Self>) {
        use rustix::event::{PollFd, PollFlags, poll};
        loop {
            let Some(link) = me.upgrade() else { return };
            if link.stop.load(Ordering::Acquire) {
                return;
            }
            let _ = link.drain_and_arm(Drainer::Thread);
            link.run_llc();
            // Connections that could not be served: again now; while some remain, sleep
            // briefly only.
            let again: Vec<_> = std::mem::take(&mut *lock(&link.retry));
            let mut left = Vec::new();
            for side in again {
                if !side.arrived() {
                    left.push(side);
                }
            }
            let busy = !left.is_empty();
            lock(&link.retry).extend(left);
            let (rcq, scq) = (Arc::clone(&link.rcq), Arc::clone(&link.scq));
            let poke = Arc::clone(&link.poke);
            drop(link);
            let (rfd, sfd) = (rcq.event_fd(), scq.event_fd());
            let mut fds = [
                PollFd::new(&rfd, PollFlags::IN),
                PollFd::new(&sfd, PollFlags::IN),
                PollFd::new(&*poke, PollFlags::IN),
            ];
            // A bounded sleep: the thread notices a dropped link within it.
            let ts = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: if busy { 200_000 } else { 100_000_000 },
            };
            let _ = poll(&mut fds, Some(&ts));
            rcq.take_event();
            scq.take_event();
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&*poke, &mut b);
        }
    }

    /// Drains both queues until empty, then arms them; if completions slipped in between,
    /// drains again (the kernel's "don't req_notify until all CQEs drained").
    /// Returns how many send completions there were.
    fn drain_and_arm(&self, by: Drainer) -> usize {
        let mut sent = 0;
        loop {
            let s = self.drain(&*self.scq, by);
            sent += s;
            if self.drain_rx(by) + s > 0 {
                continue;
            }
            let missed = self.rcq.req_notify(false) | self.scq.req_notify(false);
            if !missed {
                return sent;
            }
        }
    }

    /// The completion queues' handler, on the device's thread (the kernel's tasklet after
    /// `comp_handler`): hands completions on and wakes the connections' waiters, which saves
    /// the waiter the completion thread's wake-up on every CDC. What must not run there
    /// (LLC messages, whose handler may wait for the link; the processing of a connection
    /// that still has something pending after its waiters were woken, which may post and
    /// wait for a slot) goes to the completion thread, which is poked.
    fn on_device(&self) {
        if self.stop.load(Ordering::Acquire) {
            return;
        }
        let sent = self.drain_and_arm(Drainer::Device);
        if sent > 0 && self.slot_waiters.load(Ordering::SeqCst) > 0 {
            self.slot_gen.fetch_add(1, Ordering::SeqCst);
            let _ = rustix::thread::futex::wake(
                &self.slot_gen,
                rustix::thread::futex::Flags::PRIVATE,
                u32::MAX,
            );
        }
    }

    /// Runs the LLC messages [`RoceLink::on_device`] left, in the order they arrived.
    fn run_llc(&self) {
        loop {
            let Some(m) = lock(&self.llc_queue).pop_front() else {
                return;
            };
            self.llc(&m);
        }
    }

    fn llc(&self, m: &[u8]) {
        match self.llc.get() {
            Some(h) => h(m),
            None => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Polls the receive queue empty under `rx_drain`: a receive the completion thread has
    /// polled but not yet handed to its connection is handed on before this returns. The
    /// connections are woken or served after the lock is let go: serving one may post and
    /// wait for a send slot, which the device's thread frees, and that thread may be waiting
    /// for `rx_drain` in [`RoceLink::on_device`].
    fn drain_rx(&self, by: Drainer) -> usize {
        let (n, sides) = {
            let _g = lock(&self.rx_drain);
            self.poll_all(&*self.rcq)
        };
        self.hand_on(sides, by);
        n
    }

    /// Polls `cq` empty, handing each completion on; returns how many there were.
    fn drain(&self, cq: &D::Cq, by: Drainer) -> usize {
        let (n, sides) = self.poll_all(cq);
        self.hand_on(sides, by);
        n
    }

    /// Polls `cq` empty, handing each completion to its connection; returns how many there
    /// were and the connections they were for, each with whether a CDC came for it (else only
    /// completions of its sends).
    fn poll_all(&self, cq: &D::Cq) -> (usize, Vec<(Arc<Side>, bool)>) {
        let mut wcs = [Wc::EMPTY; 16];
        let mut n = 0;
        let mut sides: Vec<(Arc<Side>, bool)> = Vec::new();
        loop {
            let k = cq.poll(&mut wcs);
            for w in &wcs[..k] {
                let Some(side) = self.completion(w) else {
                    continue;
                };
                let cdc = w.opcode != WcOpcode::Send;
                match sides.iter_mut().find(|(x, _)| Arc::ptr_eq(x, &side)) {
                    Some((_, c)) => *c |= cdc,
                    None => sides.push((side, cdc)),
                }
            }
            n += k;
            if k < wcs.len() {
                return (n, sides);
            }
        }
    }

    /// Tells the connections something arrived: a connection nobody waits in is processed
    /// here by the completion thread, and left to it by the others ([`Drainer`]).
    fn hand_on(&self, sides: Vec<(Arc<Side>, bool)>, by: Drainer) {
        for (side, cdc) in sides {
            let done = match by {
                Drainer::Thread => side.arrived(),
                Drainer::Poster => false,
                Drainer::Device => side.woken(cdc),
            };
            if !done {
                self.retry_later(&side);
            }
        }
    }

    /// Hands one completion on; returns the connection it brought something for.
    fn completion(&self, w: &Wc) -> Option<Arc<Side>> {
        if w.wr_id & WR_KIND == WR_LLC_V2 {
            // Done with the v2 send buffer, whatever the status.
            self.v2_tx_busy.store(false, Ordering::Release);
        }
        if w.status != WcStatus::Success {
            if w.status != WcStatus::WrFlushErr || !self.failed.load(Ordering::Relaxed) {
                tracing::warn!(qp = self.qp.qp_num(), "SMC-R link failed: {:?}", w.status);
            }
            self.fail();
            return None;
        }
        match w.opcode {
            WcOpcode::Recv => {
                let slot = w.wr_id;
                let off = (slot * u64::from(RECV_BUF)) as usize;
                let mut buf = [0u8; RECV_BUF as usize];
                let side = match &self.v2 {
                    // v2: the first 44 bytes in the slot, the rest in the spill buffer.
                    Some(v2) if w.byte_len > V2_FIRST_SGE => {
                        let n = (w.byte_len as usize).min(V2_BUF as usize);
                        let first = V2_FIRST_SGE as usize;
                        let mut long = vec![0u8; n];
                        self.recv_mr.memory().read(off, &mut long[..first]);
                        v2.memory().read(first, &mut long[first..]);
                        self.received(&long)
                    }
                    _ => {
                        let n = (w.byte_len as usize).min(buf.len());
                        self.recv_mr.memory().read(off, &mut buf[..n]);
                        self.received(&buf[..n])
                    }
                };
                if let Err(e) = self.post_recv(slot) {
                    tracing::warn!("SMC-R receive repost failed: {e}");
                    self.fail();
                }
                side
            }
            WcOpcode::Send if w.wr_id & WR_KIND == WR_CDC => {
                let token = ((w.wr_id >> 16) & 0xffff_ffff) as u32;
                let s = self.side(token)?;
                lock(&s.done).push_back(w.wr_id as u16);
                s.pending.fetch_add(1, Ordering::SeqCst);
                Some(s)
            }
            _ => None,
        }
    }

    fn received(&self, m: &[u8]) -> Option<Arc<Side>> {
        if m.first() == Some(&smc_proto::cdc::CDC_MSG_TYPE) {
            let Ok(cdc) = SmcrCdcRepr::parse_bytes(m) else {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            let Some(s) = self.side(cdc.token) else {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            lock(&s.cdcs).push_back(HostCdc {
                seqno: cdc.seqno,
                prod: cdc.prod,
                cons: cdc.cons,
                pflags: cdc.prod_flags,
                cflags: cdc.conn_flags,
            });
            s.pending.fetch_add(1, Ordering::SeqCst);
            return Some(s);
        }
        if self.on_device.load(Ordering::Acquire) {
            // Whoever drains: in arrival order through the completion thread.
            lock(&self.llc_queue).push_back(m.to_vec());
            let _ = rustix::io::write(&*self.poke, &1u64.to_ne_bytes());
        } else {
            self.llc(m);
        }
        None
    }

    /// Leaves `side`'s processing to the completion thread (once in its list).
    fn retry_later(&self, side: &Arc<Side>) {
        let mut r = lock(&self.retry);
        if !r.iter().any(|x| Arc::ptr_eq(x, side)) {
            // The first entry pokes the thread: a sender that polled completions itself, or
            // the device's thread, leaves connections here, and the completion thread,
            // asleep on channels those completions never rang, would see them only at its
            // next timeout.
            if r.is_empty() {
                let _ = rustix::io::write(&*self.poke, &1u64.to_ne_bytes());
            }
            r.push(Arc::clone(side));
        }
    }

    /// The link is down: its group is told, or, without one, every connection on it sees an
    /// abort.
    fn fail(&self) {
        if self.failed.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self.qp.modify(&QpModify::Error);
        match self.on_fail.get() {
            Some(h) => h(),
            None => self.abort_conns(),
        }
    }

    fn abort_conns(&self) {
        let sides: Vec<_> = read(&self.conns.0).values().cloned().collect();
        // Woken here; the completion thread serves those nobody waits in (this may run in a
        // sender's post, holding a connection).
        let mut r = lock(&self.retry);
        for s in sides {
            // Counted once: the links of a group share their connections, and each of them
            // may abort them.
            if !s.failed.swap(true, Ordering::SeqCst) {
                s.pending.fetch_add(1, Ordering::SeqCst);
            }
            s.wake(Dir::Rx);
            s.wake(Dir::Tx);
            r.push(s);
        }
    }
}

impl<D: Device> Drop for RoceLink<D> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// Where the peer's RMB is (from its CLC Accept/Confirm and rkey exchange).
#[derive(Debug, Clone, Copy)]
pub struct PeerRmb {
    /// Virtual address of its first byte (`rmb_dma_addr`).
    pub addr: u64,
    /// Its rkey on this link.
    pub rkey: u32,
    /// Its length (the peer's ring).
    pub len: usize,
    /// The peer's token for this connection (`rmbe_alert_token`): every CDC we send carries it.
    pub token: u32,
}

/// Where a connection's bytes go over one link: the link, its send buffer's registration on
/// that link's device and the peer's RMB as that link reaches it (its rtoken).
#[derive(Debug)]
pub struct Binding<D: Device> {
    /// The link.
    pub link: Arc<RoceLink<D>>,
    /// The send buffer's address and lkey on the link's device.
    pub sndbuf: (u64, u32),
    /// The peer's RMB on that link: address and rkey.
    pub peer: (u64, u32),
    /// Without inline sends: the connection's CDC slots on the link's device (address,
    /// lkey); unused with inline sends.
    pub cdc: (u64, u32),
}

/// Bytes of one CDC slot of a connection that does not send inline.
pub const CDC_SLOT: usize = 48;

/// One SMC-R connection on a [`RoceLink`] of its group (moved to another with
/// [`SmcrLink::switch`]).
pub struct SmcrLink<D: Device> {
    bind: RwLock<Arc<Binding<D>>>,
    /// The binding a switch moves to, taken under the connection's lock
    /// ([`Transport::take_switch`]).
    next: Mutex<Option<Arc<Binding<D>>>>,
    side: Arc<Side>,
    token: u32,
    sndbuf: Arc<Memory>,
    rmb: Arc<Memory>,
    /// What keeps the buffers registered (on every device of the group) while the
    /// connection lives: its own registrations, or a share of its owner's.
    _keep: Vec<Box<dyn std::any::Any + Send + Sync>>,
    peer_len: usize,
    peer_token: u32,
    /// CDCs and small RDMA WRITEs go inline (the kernel's "send and write inline"), or from
    /// registered memory: the CDC slots (`cdc_slots` of [`CDC_SLOT`] bytes, one per send
    /// queue entry, so a slot is not rewritten while its send may still read it).
    inline: bool,
    cdc_mem: Option<Arc<Memory>>,
    cdc_slots: usize,
    /// Once the connection has a readiness pair (an event loop waits on it, not in a serve
    /// of the device), it counts as waiting unserved on its link's receive queue for the
    /// rest of its life ([`CompletionQueue::unserved_wait_begin`]): that device does not
    /// keep its input for a serving thread while an event loop may wait for it.
    event_loop: Mutex<Option<Arc<dyn CompletionQueue>>>,
}

impl<D: Device> std::fmt::Debug for SmcrLink<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmcrLink")
            .field("token", &self.token)
            .field("peer_token", &self.peer_token)
            .finish_non_exhaustive()
    }
}

impl<D: Device> SmcrLink<D> {
    /// A connection on `link` receiving into `rmb` under our `token`, sending from `sndbuf`
    /// into the peer's RMB.
    pub fn new(link: Arc<RoceLink<D>>, token: u32, sndbuf: D::Mr, rmb: D::Mr, peer: PeerRmb) -> Self
    where
        D::Mr: 'static,
    {
        let mut c = Self::sharing(link, token, &sndbuf, &rmb, peer, Box::new(()));
        c._keep = vec![Box::new(sndbuf), Box::new(rmb)];
        c
    }

    /// [`SmcrLink::new`] on registrations someone else owns (a link group that pools its
    /// buffers, as the kernel's do): `keep` holds them registered for as long as the
    /// connection lives.
    pub fn sharing(
        link: Arc<RoceLink<D>>,
        token: u32,
        sndbuf: &D::Mr,
        rmb: &D::Mr,
        peer: PeerRmb,
        keep: Box<dyn std::any::Any + Send + Sync>,
    ) -> Self {
        let side = link.attach(token);
        let bind = Binding {
            sndbuf: (sndbuf.addr(), sndbuf.lkey()),
            peer: (peer.addr, peer.rkey),
            cdc: (0, 0),
            link,
        };
        let (snd_mem, rmb_mem) = (Arc::clone(sndbuf.memory()), Arc::clone(rmb.memory()));
        Self {
            bind: RwLock::new(Arc::new(bind)),
            next: Mutex::new(None),
            side,
            token,
            sndbuf: snd_mem,
            rmb: rmb_mem,
            _keep: vec![keep],
            peer_len: peer.len,
            peer_token: peer.token,
            inline: true,
            cdc_mem: None,
            cdc_slots: 0,
            event_loop: Mutex::new(None),
        }
    }

    /// The receive queue the connection counts itself on as an event loop's
    /// ([`SmcrLink::event_loop`]) follows its binding.
    fn recount_event_loop(&self) {
        let mut e = lock(&self.event_loop);
        let Some(old) = e.as_ref() else { return };
        let now = self.binding().link.recv_cq();
        if !std::ptr::addr_eq(Arc::as_ptr(old), Arc::as_ptr(&now)) {
            now.unserved_wait_begin();
            old.unserved_wait_over();
            *e = Some(now);
        }
    }

    /// Sends CDCs and small writes from registered memory instead of inline: `cdc` holds the
    /// CDC slots (registered on the current link's device, and kept registered, on the
    /// group's other devices too, by what the connection keeps; [`Binding::cdc`] names the
    /// one of each link).
    pub fn without_inline(mut self, cdc: &D::Mr) -> Self {
        let slots = cdc.len() / CDC_SLOT;
        {
            let mut b = write(&self.bind);
            *b = Arc::new(Binding {
                link: Arc::clone(&b.link),
                sndbuf: b.sndbuf,
                peer: b.peer,
                cdc: (cdc.addr(), cdc.lkey()),
            });
        }
        self.inline = slots == 0;
        self.cdc_mem = Some(Arc::clone(cdc.memory()));
        self.cdc_slots = slots;
        self
    }

    /// Our token.
    pub fn token(&self) -> u32 {
        self.token
    }

    /// The link the connection sends on.
    pub fn link(&self) -> Arc<RoceLink<D>> {
        Arc::clone(&self.binding().link)
    }

    /// Moves the connection to another link of its group (`smc_switch_conns`). The next
    /// time the connection's lock is held ([`Transport::take_switch`], run at once by the
    /// link's completion thread when no thread is in the connection) it changes links,
    /// rolls its send side back and writes again what the old link may have lost; until
    /// then what it posts on the old link is dropped.
    pub fn switch(&self, to: Binding<D>) {
        let link = Arc::clone(&to.link);
        *lock(&self.next) = Some(Arc::new(to));
        self.signal(&self.side.switched, &link);
    }

    /// Raises `flag` (counted as pending once) and has the connection look at it now, or
    /// soon on `link`'s completion thread.
    fn signal(&self, flag: &AtomicBool, link: &RoceLink<D>) {
        if !flag.swap(true, Ordering::SeqCst) {
            self.side.pending.fetch_add(1, Ordering::SeqCst);
        }
        if !self.side.arrived() {
            link.retry_later(&self.side);
        }
    }

    /// The connection closes: its thread does not serve the link's device again soon
    /// ([`CompletionQueue::stop_serving`]).
    pub fn stop_serving(&self) {
        self.binding().link.rcq.stop_serving();
    }

    /// Ends the connection as a failed link would (the group has no link to move it to).
    pub fn fail(&self) {
        self.signal(&self.side.failed, &self.link());
    }

    /// [`Transport::sleep`], serving the device meanwhile, after up to `spin` of busy
    /// polling ([`CompletionQueue::serve`]); also how long the spin took when it was answered.
    fn sleep_with(
        &self,
        dir: Dir,
        timeout: Option<Duration>,
        spin: Duration,
    ) -> io::Result<(bool, Option<Duration>)> {
        let i = di(dir);
        let side = &*self.side;
        let g = side.wake_gen[i].load(Ordering::SeqCst);
        // A reader that does not need our sends' completions is not woken for them
        // (`Side::woken`), and does not leave its wait for them.
        let needs_done = dir == Dir::Tx || side.reader_needs_done.load(Ordering::SeqCst);
        let done = || {
            side.armed[i].load(Ordering::SeqCst) & ARM_THREAD == 0
                || (needs_done && side.pending.load(Ordering::SeqCst) != 0)
        };
        if done() {
            return Ok((true, None)); // taken or something arrived meanwhile
        }
        // Serve the link's device while waiting, if no other thread does: what arrives then
        // wakes this thread only, not the device's thread and then this one. Announced before
        // `done` looks again (`Side::wake`).
        let cq: Arc<dyn CompletionQueue> = self.binding().link.rcq.clone();
        *lock(&side.server[i]) = Some(Arc::clone(&cq));
        side.serving[i].store(true, Ordering::SeqCst);
        let served = cq.serve(&done, timeout, spin);
        side.serving[i].store(false, Ordering::SeqCst);
        *lock(&side.server[i]) = None;
        match served {
            Served::Spun(t) => return Ok((true, Some(t))),
            Served::Woken => return Ok((true, None)),
            Served::TimedOut => {
                side.armed[i].fetch_and(!ARM_THREAD, Ordering::SeqCst);
                return Ok((false, None));
            }
            Served::Declined => {}
        }
        let ts = timeout.map(|t| rustix::time::Timespec {
            tv_sec: t.as_secs() as i64,
            tv_nsec: i64::from(t.subsec_nanos()),
        });
        side.sleepers[i].fetch_add(1, Ordering::SeqCst);
        let slept = rustix::thread::futex::wait(
            &side.wake_gen[i],
            rustix::thread::futex::Flags::PRIVATE,
            g,
            ts.as_ref(),
        );
        side.sleepers[i].fetch_sub(1, Ordering::SeqCst);
        cq.unserved_wait_over();
        match slept {
            Ok(()) => Ok((true, None)),
            Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => Ok((true, None)),
            Err(rustix::io::Errno::TIMEDOUT) => {
                self.side.armed[i].fetch_and(!ARM_THREAD, Ordering::SeqCst);
                Ok((false, None))
            }
            Err(e) => Err(e.into()),
        }
    }

    fn binding(&self) -> Arc<Binding<D>> {
        Arc::clone(&read(&self.bind))
    }

    /// A post on `b`'s link failed or the link is out of service: a group moves the
    /// connection (the post is redone after the failover), a lone link aborts it.
    fn dead_link(&self, b: &Binding<D>) -> io::Result<()> {
        if b.link.managed() {
            b.link.fail();
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the SMC-R link failed",
        ))
    }

    /// Posts up to two RDMA WRITEs and then a CDC SEND with one doorbell (their packets go
    /// out together); a failed post on a managed link is the group's to handle.
    fn post_step(&self, writes: &[RemoteWrite], cdc: Option<&HostCdc>) -> io::Result<()> {
        let b = self.binding();
        if b.link.failed() {
            return self.dead_link(&b);
        }
        let mut sges = [[Sge {
            addr: 0,
            len: 0,
            lkey: 0,
        }; 2]; 2];
        let mut small = [[0u8; INLINE_MAX]; 2];
        let mut wrs: [Option<SendWr<'_>>; 3] = [None, None, None];
        let mut n = 0;
        for ((w, sg), sm) in writes.iter().zip(&mut sges).zip(&mut small) {
            wrs[n] = Some(self.write_wr(&b, w, sg, sm)?);
            n += 1;
        }
        let mut bytes = [0u8; smc_proto::cdc::SMCR_CDC_LEN];
        let mut cdc_sge = [Sge {
            addr: 0,
            len: 0,
            lkey: 0,
        }];
        if let Some(c) = cdc {
            wrs[n] = Some(self.cdc_wr(&b, c, &mut bytes, &mut cdc_sge));
            n += 1;
        }
        let list: Vec<SendWr<'_>> = wrs.into_iter().flatten().collect();
        debug_assert_eq!(list.len(), n);
        match b.link.post_list(&list) {
            Err(_) if b.link.managed() => self.dead_link(&b),
            r => r,
        }
    }

    /// The RDMA WRITE of `w` into the peer's RMB: from the send buffer (`sges`), or inline
    /// (copied into `small`) when it is no longer than the QP's inline limit
    /// (`smc_tx_rdma_write`'s IB_SEND_INLINE for small writes).
    fn write_wr<'a>(
        &self,
        b: &Binding<D>,
        w: &RemoteWrite,
        sges: &'a mut [Sge; 2],
        small: &'a mut [u8; INLINE_MAX],
    ) -> io::Result<SendWr<'a>> {
        if w.dst + w.len() > self.peer_len {
            return Err(io::Error::other("RDMA WRITE past the peer's buffer"));
        }
        let (addr, lkey) = b.sndbuf;
        let inline = self.inline && w.len() <= INLINE_MAX && w.len() as u32 <= b.link.inline_max;
        let data = if inline {
            let mut at = 0;
            for (off, n) in w.src {
                self.sndbuf.read(off, &mut small[at..at + n]);
                at += n;
            }
            Payload::Inline(&small[..at])
        } else {
            let mut k = 0;
            for (off, n) in w.src {
                if n > 0 {
                    sges[k] = Sge {
                        addr: addr + off as u64,
                        len: n as u32,
                        lkey,
                    };
                    k += 1;
                }
            }
            Payload::Sges(&sges[..k])
        };
        Ok(SendWr {
            wr_id: WR_WRITE | (u64::from(self.token) << 16),
            op: SendOp::Write {
                remote_addr: b.peer.0 + w.dst as u64,
                rkey: b.peer.1,
            },
            data,
            signaled: false,
            solicited: false,
        })
    }

    /// The CDC SEND: inline, or from the connection's CDC slot for its sequence number.
    fn cdc_wr<'a>(
        &self,
        b: &Binding<D>,
        cdc: &HostCdc,
        bytes: &'a mut [u8; smc_proto::cdc::SMCR_CDC_LEN],
        sge: &'a mut [Sge; 1],
    ) -> SendWr<'a> {
        *bytes = SmcrCdcRepr {
            seqno: cdc.seqno,
            token: self.peer_token,
            prod: cdc.prod,
            cons: cdc.cons,
            prod_flags: cdc.pflags,
            conn_flags: cdc.cflags,
        }
        .to_bytes();
        let data = match &self.cdc_mem {
            Some(mem) if !self.inline => {
                let off = usize::from(cdc.seqno) % self.cdc_slots * CDC_SLOT;
                mem.write(off, &bytes[..]);
                sge[0] = Sge {
                    addr: b.cdc.0 + off as u64,
                    len: bytes.len() as u32,
                    lkey: b.cdc.1,
                };
                Payload::Sges(&sge[..])
            }
            _ => Payload::Inline(&bytes[..]),
        };
        SendWr {
            wr_id: WR_CDC | (u64::from(self.token) << 16) | u64::from(cdc.seqno),
            op: SendOp::Send,
            data,
            signaled: true,
            solicited: true,
        }
    }

    fn wrapped(len: usize, offset: usize, n: usize) -> [(usize, usize); 2] {
        let first = n.min(len - offset % len);
        [(offset % len, first), (0, n - first)]
    }
}

impl<D: Device> Drop for SmcrLink<D> {
    fn drop(&mut self) {
        if let Some(cq) = lock(&self.event_loop).take() {
            cq.unserved_wait_over();
        }
        self.binding().link.detach(self.token);
    }
}

impl<D: Device> Transport for SmcrLink<D> {
    const SPINS_IN_SLEEP: bool = true;
    const RX_PIECES: usize = 2;

    fn write_tx(&self, offset: usize, data: &[u8]) {
        let mem = &self.sndbuf;
        let mut at = 0;
        for (off, n) in Self::wrapped(mem.len(), offset, data.len()) {
            mem.write(off, &data[at..at + n]);
            at += n;
        }
    }

    fn read_rx(&self, offset: usize, out: &mut [u8]) {
        let mem = &self.rmb;
        let mut at = 0;
        let n = out.len();
        for (off, k) in Self::wrapped(mem.len(), offset, n) {
            mem.read(off, &mut out[at..at + k]);
            at += k;
        }
    }

    fn write_remote(&self, w: &RemoteWrite) -> io::Result<()> {
        self.post_step(std::slice::from_ref(w), None)
    }

    fn send_cdc(&self, cdc: &HostCdc, _cons_changed: bool) -> io::Result<()> {
        self.post_step(&[], Some(cdc))
    }

    fn post_writes_and_cdc(
        &self,
        writes: &[RemoteWrite],
        cdc: &HostCdc,
        _cons_changed: bool,
    ) -> io::Result<()> {
        self.post_step(writes, Some(cdc))
    }

    fn recv_cdc(&self) -> Option<HostCdc> {
        let c = lock(&self.side.cdcs).pop_front();
        if c.is_some() {
            self.side.pending.fetch_sub(1, Ordering::SeqCst);
            return c;
        }
        None
    }

    fn take_failure(&self) -> bool {
        // Once: the connection is reset from now on.
        let failed = self.side.failed.swap(false, Ordering::SeqCst);
        if failed {
            self.side.pending.fetch_sub(1, Ordering::SeqCst);
        }
        failed
    }

    fn take_switch(&self) -> bool {
        if !self.side.switched.swap(false, Ordering::SeqCst) {
            return false;
        }
        self.side.pending.fetch_sub(1, Ordering::SeqCst);
        if let Some(b) = lock(&self.next).take() {
            *write(&self.bind) = b;
            self.recount_event_loop();
        }
        true
    }

    fn cdc_pending(&self) -> bool {
        self.side.pending.load(Ordering::Relaxed) != 0
    }

    fn poll_completion(&self) -> Option<u16> {
        let s = lock(&self.side.done).pop_front();
        if s.is_some() {
            self.side.pending.fetch_sub(1, Ordering::SeqCst);
        }
        s
    }

    fn settle(&self) {
        self.binding().link.drain_rx(Drainer::Poster);
    }

    fn events_pending(&self) -> bool {
        self.side.pending.load(Ordering::Relaxed) != 0
    }

    fn arm(&self, dir: Dir, who: Waiter) {
        let bit = match who {
            Waiter::Thread => ARM_THREAD,
            Waiter::Event => ARM_EVENT,
        };
        self.side.armed[di(dir)].fetch_or(bit, Ordering::SeqCst);
    }

    fn sleep(&self, dir: Dir, timeout: Option<Duration>) -> io::Result<bool> {
        Ok(self.sleep_with(dir, timeout, Duration::ZERO)?.0)
    }

    fn wait_begin(&self) {
        self.side.in_wait.fetch_add(1, Ordering::SeqCst);
    }

    fn sleep_spinning(
        &self,
        dir: Dir,
        timeout: Option<Duration>,
        spin: Duration,
    ) -> io::Result<(bool, Option<Duration>)> {
        self.sleep_with(dir, timeout, spin)
    }

    fn reader_needs_completions(&self, needs: bool) {
        self.side.reader_needs_done.store(needs, Ordering::SeqCst);
    }

    fn wait_end(&self) -> bool {
        self.side.in_wait.fetch_sub(1, Ordering::SeqCst);
        // SeqCst after the decrement (see `Side::woken`).
        self.side.pending.load(Ordering::SeqCst) != 0
    }

    fn wake_local(&self, dir: Dir) {
        self.side.wake(dir);
    }

    fn readiness(&self) -> Option<&Readiness> {
        self.side.ready.get()
    }

    fn set_service(&self, service: Box<dyn Fn() -> bool + Send + Sync>) {
        let _ = self.side.service.set(service);
    }

    fn make_readiness(&self, given: Option<Readiness>) -> io::Result<(&Readiness, bool)> {
        if let Some(r) = self.side.ready.get() {
            return match given {
                None => Ok((r, false)),
                Some(_) => Err(super::already_ready()),
            };
        }
        let r = match given {
            Some(r) => r,
            None => Readiness::new()?,
        };
        let mut e = lock(&self.event_loop);
        if e.is_none() {
            let cq = self.binding().link.recv_cq();
            cq.unserved_wait_begin();
            *e = Some(cq);
        }
        Ok((self.side.ready.get_or_init(|| r), true))
    }
}

#[cfg(test)]
mod tests {
    //! The connection core over SMC-R, in one process: two soft RoCEv2 devices on loopback
    //! addresses, one RC link between them, and an `SmcConn` on each end, exactly as the SMC-D
    //! handshake builds them (minus the handshake and LLC, which set up the same objects).
    use super::*;
    use crate::driver::conn::{ConnParams, SmcConn, SmcdInfo};
    use crate::layout::status::StatusArea;
    use smc_core::conn::Config;
    use smc_rdma::soft::{SoftConfig, SoftDevice};
    use smc_rdma::verbs::{Access, Gid, Memory, QpCaps, QpInit, RcPath, bring_up};
    use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};

    type Conn = Arc<SmcConn<SmcrLink<SoftDevice>>>;

    fn device(net: u8, host: u8) -> SoftDevice {
        SoftDevice::open(SoftConfig {
            name: format!("sroce{net}.{host}"),
            addr: Ipv4Addr::new(127, 0, net, host),
            netdev: Some("lo".into()),
            steering: None,
        })
        .expect("open soft device")
    }

    type SoftCq = Arc<<SoftDevice as Device>::Cq>;

    /// A protection domain and an RC QP with its own completion queues on `d`.
    fn test_qp(
        d: &SoftDevice,
        caps: QpCaps,
    ) -> (
        smc_rdma::verbs::Pd,
        <SoftDevice as Device>::Qp,
        SoftCq,
        SoftCq,
    ) {
        let pd = d.alloc_pd();
        let (scq, rcq) = (d.create_cq(1024).unwrap(), d.create_cq(1024).unwrap());
        let qp = d
            .create_qp(
                pd,
                QpInit {
                    send_cq: Arc::clone(&scq),
                    recv_cq: Arc::clone(&rcq),
                    caps,
                    sq_sig_all: false,
                },
            )
            .unwrap();
        (pd, qp, scq, rcq)
    }

    fn tcp_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    /// Devices, links and the two connections (rings of `ring` bytes, send buffers the same).
    fn pair(net: u8, ring: usize) -> (SoftDevice, SoftDevice, Conn, Conn) {
        let (da, db) = (device(net, 1), device(net, 2));
        let caps = QpCaps {
            max_send_wr: 48,
            max_recv_wr: RECV_WRS,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let mk = |d: &SoftDevice| {
            let (pd, qp, scq, rcq) = test_qp(d, caps);
            let mr = |n| d.reg_mr(pd, Memory::new(n).unwrap(), acc).unwrap();
            (qp, scq, rcq, mr(4096), mr(ring), mr(ring))
        };
        let (qa, sa, ra, recv_a, snd_a, rmb_a) = mk(&da);
        let (qb, sb, rb, recv_b, snd_b, rmb_b) = mk(&db);
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        let path = RcPath {
            timeout: 14,
            min_rnr_timer: 1,
            access: acc,
            ..RcPath::default()
        };
        for (qp, peer_qpn, peer) in [(&qa, nb, 2u8), (&qb, na, 1u8)] {
            let g = Gid::from_ipv4(Ipv4Addr::new(127, 0, net, peer));
            let (rq, sq) = (u32::from(peer) * 1000, u32::from(3 - peer) * 1000);
            bring_up(qp, &path, peer_qpn, g, rq, sq).unwrap();
        }
        let peer_of = |mr: &smc_rdma::soft::SoftMr, token| PeerRmb {
            addr: mr.addr(),
            rkey: mr.rkey(),
            len: mr.len(),
            token,
        };
        let (pa, pb) = (peer_of(&rmb_b, 0xb0b), peer_of(&rmb_a, 0xa1a));
        let la = RoceLink::<SoftDevice>::start(qa, sa, ra, recv_a).unwrap();
        let lb = RoceLink::<SoftDevice>::start(qb, sb, rb, recv_b).unwrap();
        let (ca, cb) = tcp_pair();
        let status = StatusArea::private().unwrap();
        let conn = |sock, link, token: u32, peer_token: u32, client| {
            SmcConn::new(
                sock,
                link,
                Config::smcr(ring, ring, ring),
                ConnParams {
                    spin: Duration::from_micros(20),
                },
                SmcdInfo {
                    lgr_id: 1,
                    local_gid: 0,
                    peer_gid: 0,
                    local_token: u64::from(token),
                    peer_token: u64::from(peer_token),
                    rmbe_size: ring,
                    peer_rmbe_size: ring,
                    version: 1,
                    client,
                },
                status.conn_slot(),
            )
        };
        let a = conn(
            ca,
            SmcrLink::new(la, 0xa1a, snd_a, rmb_a, pa),
            0xa1a,
            0xb0b,
            true,
        );
        let b = conn(
            cb,
            SmcrLink::new(lb, 0xb0b, snd_b, rmb_b, pb),
            0xb0b,
            0xa1a,
            false,
        );
        (da, db, a, b)
    }

    fn pattern(i: usize, seed: u8) -> u8 {
        (i as u8).wrapping_mul(7) ^ (i >> 11) as u8 ^ seed
    }

    /// Writes `total` bytes in pieces of up to 50 KiB, then shuts writing down.
    fn send(c: &Conn, total: usize, seed: u8) {
        let mut at = 0;
        while at < total {
            let n = (total - at).min(50_000 - at % 777);
            let buf: Vec<u8> = (at..at + n).map(|i| pattern(i, seed)).collect();
            let mut off = 0;
            while off < n {
                off += c.write_with(&buf[off..], false, false).unwrap();
            }
            at += n;
        }
        c.shutdown(Shutdown::Write).unwrap();
    }

    /// Reads to end of stream, checking every byte.
    fn recv(c: &Conn, seed: u8) -> usize {
        let mut buf = vec![0u8; 64 << 10];
        let mut at = 0;
        loop {
            let n = c.read(&mut buf).unwrap();
            if n == 0 {
                return at;
            }
            for (k, &b) in buf[..n].iter().enumerate() {
                assert_eq!(b, pattern(at + k, seed), "byte {}", at + k);
            }
            at += n;
        }
    }

    /// Two SMC-Rv2 links (`max_recv_sge` 2, a v2 region each): LLC messages of 44 bytes,
    /// 3000 bytes (from the v2 send buffer, in three packets, received over the slot and the
    /// spill buffer) and 8192 bytes arrive whole and in order; 8193 bytes are refused.
    #[test]
    fn v2_links_carry_llc_messages_up_to_8192_bytes() {
        let (da, db) = (device(202, 1), device(202, 2));
        let caps = QpCaps {
            max_send_wr: 48,
            max_recv_wr: RECV_WRS,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        };
        let mk = |d: &SoftDevice| {
            let (pd, qp, scq, rcq) = test_qp(d, caps);
            let mr = |n| {
                d.reg_mr(pd, Memory::new(n).unwrap(), Access::LOCAL_WRITE)
                    .unwrap()
            };
            (
                qp,
                scq,
                rcq,
                mr(RECV_WRS as usize * RECV_BUF as usize),
                mr(V2_REGION),
            )
        };
        let (qa, sa, ra, recv_a, v2_a) = mk(&da);
        let (qb, sb, rb, recv_b, v2_b) = mk(&db);
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        let path = RcPath {
            timeout: 14,
            min_rnr_timer: 1,
            ..RcPath::default()
        };
        for (qp, peer_qpn, peer) in [(&qa, nb, 2u8), (&qb, na, 1u8)] {
            let g = Gid::from_ipv4(Ipv4Addr::new(127, 0, 202, peer));
            let (rq, sq) = (u32::from(peer) * 1000, u32::from(3 - peer) * 1000);
            bring_up(qp, &path, peer_qpn, g, rq, sq).unwrap();
        }
        let start = |q, s, r, recv, v2| {
            RoceLink::<SoftDevice>::start_in(
                q,
                s,
                r,
                recv,
                ConnTable::default(),
                RECV_WRS,
                Some(v2),
            )
            .unwrap()
        };
        let la = start(qa, sa, ra, recv_a, v2_a);
        let lb = start(qb, sb, rb, recv_b, v2_b);
        let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let tx = Mutex::new(tx);
        lb.set_llc_handler(Box::new(move |m| {
            let _ = lock(&tx).send(m.to_vec());
        }));
        let msg = |n: usize, seed: u8| -> Vec<u8> {
            let mut v: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(13) ^ seed).collect();
            v[0] = 0x22; // an LLC type byte, so the link hands it to the LLC handler
            v
        };
        // One at a time, as LLC flows send them (a request, then its answer): a link has one
        // v2 receive buffer (the kernel's `wr_rx_buf_v2`), and the ACK that lets the sender
        // reuse its v2 send buffer comes before the receiver handed the message on. Sent back
        // to back, a second long message overwrote the first under load (one CI run beside
        // two CPU hogs: "3000 bytes differ").
        let sent = [msg(44, 1), msg(3000, 2), msg(8192, 3), msg(100, 4)];
        for m in &sent {
            la.send_llc(m).unwrap();
            let got = rx.recv_timeout(Duration::from_secs(20)).unwrap();
            assert_eq!(got.len(), m.len());
            assert!(got == *m, "{} bytes differ", m.len());
        }
        let e = la.send_llc(&msg(8193, 5)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(!la.failed() && !lb.failed());
        la.take_down();
        lb.take_down();
    }

    /// Bytes staged in the send buffer when the writer left (the peer's ring was full) go out
    /// when the peer's window opens, with no thread of the writer's in the connection: the
    /// completion thread runs the connection's CDC processing (the kernel's tasklet).
    #[test]
    fn staged_bytes_go_out_after_the_writer_left() {
        let (_da, _db, a, b) = pair(201, 64 << 10);
        const TOTAL: usize = 100 << 10;
        // Returns at once: 64 KiB fill b's ring, 36 KiB wait in a's send buffer.
        send(&a, TOTAL, 3);
        b.set_read_timeout(Some(Duration::from_secs(20)));
        assert_eq!(recv(&b, 3), TOTAL);
        a.close_now();
        b.close_now();
    }

    /// A connection an event loop waits on (it has a readiness descriptor) gets its data
    /// although a thread that served the device left it keeping the device's input for its
    /// next serve (a lease, here 60 s): the readiness ends the lease, and no later serve
    /// takes one while the connection lives.
    #[test]
    fn an_event_loop_connection_is_not_left_waiting_for_a_serve() {
        use rustix::event::{PollFd, PollFlags, poll};
        let (_da, db, a, b) = pair(203, 64 << 10);
        db.set_serve_lease(Duration::from_secs(60));
        b.set_read_timeout(Some(Duration::from_secs(20)));
        let readable_within = |secs: i64| {
            let fd = b.readiness_fd().unwrap();
            let mut fds = [PollFd::new(&fd, PollFlags::IN)];
            let ts = rustix::time::Timespec {
                tv_sec: secs,
                tv_nsec: 0,
            };
            matches!(poll(&mut fds, Some(&ts)), Ok(n) if n > 0)
        };
        // A read in a thread of its own, blocking: it serves the device and leaves with the
        // lease.
        let blocking_read = || {
            let b = Arc::clone(&b);
            std::thread::spawn(move || {
                let mut buf = [0u8; 16];
                b.read(&mut buf).unwrap()
            })
        };
        let mut buf = [0u8; 16];
        let reader = blocking_read();
        std::thread::sleep(Duration::from_millis(50));
        a.write_with(b"one", false, false).unwrap();
        assert_eq!(reader.join().unwrap(), 3);
        // Now an event loop: the next bytes come through the device's own thread.
        let _ = b.readiness_fd().unwrap();
        a.write_with(b"two", false, false).unwrap();
        assert!(
            readable_within(10),
            "the event loop's data waited for a serve"
        );
        assert_eq!(b.read(&mut buf).unwrap(), 3);
        // A blocking read once more (it serves), then the event loop again.
        let reader = blocking_read();
        std::thread::sleep(Duration::from_millis(50));
        a.write_with(b"three", false, false).unwrap();
        assert_eq!(reader.join().unwrap(), 5);
        a.write_with(b"four", false, false).unwrap();
        assert!(
            readable_within(10),
            "the event loop's data waited for a serve"
        );
        assert_eq!(b.read(&mut buf).unwrap(), 4);
        a.close_now();
        b.close_now();
    }

    #[test]
    fn streams_both_ways_are_byte_exact_over_rdma_writes_and_cdc_sends() {
        // A 64 KiB ring: 32 MiB go round it 512 times, wrapping in both the send buffer and
        // the peer's RMB (two SGEs, two WRITEs).
        let (_da, db, a, b) = pair(200, 64 << 10);
        const TOTAL: usize = 32 << 20;
        let (a2, b2) = (Arc::clone(&a), Arc::clone(&b));
        let t1 = std::thread::spawn(move || send(&a2, TOTAL, 1));
        let t2 = std::thread::spawn(move || recv(&b2, 1));
        let (a3, b3) = (Arc::clone(&a), Arc::clone(&b));
        let t3 = std::thread::spawn(move || send(&b3, TOTAL, 2));
        let t4 = std::thread::spawn(move || recv(&a3, 2));
        t1.join().unwrap();
        t3.join().unwrap();
        assert_eq!(t2.join().unwrap(), TOTAL);
        assert_eq!(t4.join().unwrap(), TOTAL);
        // The link carried it (RDMA WRITEs and CDC SENDs), nothing was lost or dropped.
        let st = db.stats();
        assert!(st.rx_packets.load(Ordering::Relaxed) > (TOTAL / 1024) as u64);
        assert_eq!(st.rx_dropped.load(Ordering::Relaxed), 0);
        assert!(!a.is_poisoned() && !b.is_poisoned());
        a.close_now();
        b.close_now();
    }
}
