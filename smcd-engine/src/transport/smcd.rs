//! SMC-D over two DMBs (the kernel's `smcd_cdc_msg_send`, `smcd_tx_ism_write` and the
//! loopback device's "DMB no-copy" mode).
//!
//! Each side owns the DMB it receives into and has the peer's attached. Writing copies the
//! application's bytes straight into the peer's ring; a CDC is the two 8-byte words at the
//! head of the peer's DMB (the producer cursor; the consumer cursor with the producer and
//! connection-state flags), stored with release semantics in that order, so a reader that loads
//! them in the opposite order sees a close flag only with every byte written before it. After
//! a store the peer's waiting word for what changed is checked and, if it announced waiting,
//! its bell is rung: one system call on the peer's idle-to-busy transition, none otherwise.
//!
//! A waiter announces itself in one of two ways (bits of the waiting word): a sleeping thread
//! is woken with a futex wake on the word, an event loop by ringing the bell of the
//! connection's readiness pair. The pair exists only once the application asked for the
//! descriptor; its bell reaches the peer lazily:
//!
//! - at set-up the owner of each DMB writes the connection's id into the DMB's engine word (the
//!   CDC's reserved bytes 24..32), before the CLC message that names the DMB; the peer reads
//!   it after attaching. No system call.
//! - when the readiness is made, the owner writes the bell's locator (its pid, the far end's
//!   descriptor number and inode) into its DMB's metadata page and sets [`BELL_LOCATED`] in
//!   the engine word. Unless the peer said it takes bells that way (the `owner_fetches` word
//!   of the peer's DMB, which the peer stamps with the connection's epoch from what it learnt
//!   of this link group), the owner also sends the bell through its link group's bell channel
//!   ([`Bells`]) tagged with the id, and sets [`BELL_SENT`] too. Then it announces the event
//!   loop.
//! - the peer, the first time it must ring the bell (it took an announcement with the bell
//!   bit, or it is done writing and the word says there is a bell), takes it straight from the
//!   owner's process with `pidfd_getfd` and checks its inode; where that is not allowed (another
//!   user, a ptrace policy) or fails, from the group's channel by the id (bells of other
//!   connections found on the way are kept for them).
//!
//! Why two ways: passing a Unix socket with `SCM_RIGHTS` marks the kernel's graph of in-flight
//! Unix sockets "maybe cyclic", and while it is, every close of any Unix socket on the host
//! queues the garbage collector: one bell per connection taxed the whole machine
//! (docs/benchmarks.md). A bell taken with `pidfd_getfd` is never in flight. It also reaches
//! the process that holds the connection after a fork, where a channel shared by parent and
//! child hands a record to whichever reads first.
//!
//! Everything read from the local DMB is the peer's to write: the words go to the connection
//! core as a [`HostCdc`] and are validated there.

use super::{Bell, Readiness, Transport, Waiter, already_ready};
use crate::device::{Dir, Dmb, WAIT_BELL, WAIT_FUTEX};
use crate::ipc::channel::{recv_record, send_record};
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use rustix::net::RecvFlags;
use smc_core::conn::{HostCdc, RemoteWrite};
use smc_proto::cdc::{ConnStateFlags, ProducerFlags, SmcdCursorWord};
use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Engine-word bit: the owner sent the bell of this connection's readiness through the link
/// group's bell channel.
pub const BELL_SENT: u64 = 1 << 63;
/// Engine-word bit: the owner wrote the bell's locator into the DMB's metadata page.
pub const BELL_LOCATED: u64 = 1 << 62;
/// The connection id part of an engine word.
const ID_MASK: u64 = !(BELL_SENT | BELL_LOCATED);

/// Wakes the waiters of `dmb`'s owner for `dir` whose announcement `how` was taken: sleeping
/// threads with a futex wake on the word, an event loop by ringing its bell (looked up only
/// then).
/// A reader's bell is rung once per tagged sleep of its owner (`Dmb::take_ring`).
#[inline]
fn wake<'a>(dmb: &Dmb, dir: Dir, how: u32, bell: impl FnOnce() -> Option<&'a Bell>) {
    if how & WAIT_FUTEX != 0 {
        dmb.wake_sleepers(dir);
    }
    if how & WAIT_BELL != 0 {
        // The tag is looked at only with a bell to ring: a tag counts as rung only when it was.
        if let Some(b) = bell()
            && (dir == Dir::Tx || LAST_RUNG.with(|l| dmb.take_ring(l)))
        {
            b.ring(dir);
        }
        dmb.rung(dir);
    }
}

thread_local! {
    /// The sleep tag this thread last rang a reader's bell for (`Dmb::take_ring`).
    static LAST_RUNG: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How long a connection that clears its readiness waits for a ring under way (see
/// `Dmb::await_rings`).
const RING_WAIT_LIMIT: Duration = Duration::from_millis(5);

/// A fresh connection id for a DMB's engine word.
pub fn new_conn_id() -> u64 {
    loop {
        let id = crate::sys::unique_u64() & ID_MASK;
        if id != 0 {
            return id;
        }
    }
}

/// Most bells a link group keeps for connections that have not asked for them: far more than
/// its connections (at most 255), so only a peer sending bells for nothing reaches it.
const STASHED_MAX: usize = 1024;

/// A link group's bell channel: one Unix seqpacket pair between the group's two engines (made
/// by the engine that created the group, its other end handed over with the group's first
/// DMB). Each record is a connection id and the bell of that connection's readiness. Records
/// arrive for any of the group's connections; the ones not asked for yet are kept here by id,
/// and the engine's housekeeping thread drains the channel as records arrive, so the sender's
/// queue never fills with bells nobody asked for.
#[derive(Debug, Default)]
pub struct Bells {
    chan: OnceLock<OwnedFd>,
    stash: Mutex<Stash>,
    /// Whether `pidfd_getfd` takes bells from the peer's processes: 0 (not known yet),
    /// [`FETCH_YES`] or [`FETCH_NO`].
    fetch: AtomicU8,
    /// The peer process last opened (a forked peer's connections name another pid).
    pidfd: Mutex<Option<(u32, OwnedFd)>>,
    /// The peer engine's user, as smcd learnt it from the kernel (it comes with every DMB
    /// attach): only bells made by a process of that user are taken from a locator.
    peer_uid: OnceLock<u32>,
}

const FETCH_YES: u8 = 1;
const FETCH_NO: u8 = 2;

#[derive(Debug, Default)]
struct Stash {
    bells: HashMap<u64, OwnedFd>,
    /// Ids of the peer's connections our links exist for.
    live: HashSet<u64>,
}

impl Bells {
    /// A group's bells with no channel yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the channel (once; a second one is dropped). It is made non-blocking: an end
    /// that came from the peer is ours alone to set.
    pub fn install(&self, fd: OwnedFd) {
        let _ = rustix::io::ioctl_fionbio(&fd, true);
        let _ = self.chan.set(fd);
    }

    /// The peer engine's user, from smcd's answer to a DMB attach (the first one counts: a
    /// group has one peer engine). Learnt during the handshake, so a process forked later
    /// has it too.
    pub fn learn_peer_uid(&self, uid: u32) {
        let _ = self.peer_uid.set(uid);
    }

    /// The channel, once installed (the housekeeping thread waits on it).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.chan.get().map(AsFd::as_fd)
    }

    /// Sends the bell of our connection `id`. Never blocks: a full channel (the peer drains
    /// it from its housekeeping thread) is waited for a bounded time, then an error.
    fn send(&self, id: u64, bell: BorrowedFd<'_>) -> io::Result<()> {
        use rustix::event::{PollFd, PollFlags, poll};
        let ch = self.chan.get().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotConnected,
                "the link group has no bell channel",
            )
        })?;
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        loop {
            match send_record(ch.as_fd(), &id.to_ne_bytes(), &[bell]) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the peer does not take its bells",
                        ));
                    }
                    let ts = rustix::time::Timespec {
                        tv_sec: 0,
                        tv_nsec: left.as_nanos().min(100_000_000) as i64,
                    };
                    let _ = poll(&mut [PollFd::new(ch, PollFlags::OUT)], Some(&ts));
                }
                r => return r,
            }
        }
    }

    /// Whether bells were taken from the peer's processes with `pidfd_getfd` (then our DMBs
    /// say so, and the peer need not send its bells through the channel).
    pub fn can_fetch(&self) -> bool {
        self.fetch.load(Ordering::Relaxed) == FETCH_YES
    }

    /// Whether no bell was tried with `pidfd_getfd` yet.
    fn fetch_unknown(&self) -> bool {
        self.fetch.load(Ordering::Relaxed) == 0
    }

    /// Takes the bell the peer's process `pid` holds as descriptor `fd`, if it is still the
    /// socket whose inode is `ino`, made by that process (`SO_PEERCRED` of a socket pair's
    /// end: its maker) as a process of the peer engine's user. The numbers come from shared
    /// memory: a peer that lies, or a descriptor closed and reused since, gives us nothing,
    /// and a peer cannot make us ring a socket of a user other than its own.
    fn fetch(&self, pid: u32, fd: u32, ino: u64) -> Option<OwnedFd> {
        use rustix::process::{Pid, PidfdFlags, PidfdGetfdFlags, pidfd_getfd, pidfd_open};
        if self.fetch.load(Ordering::Relaxed) == FETCH_NO {
            return None;
        }
        // Until the kernel told us who the peer is, only the channel.
        let peer_uid = *self.peer_uid.get()?;
        let pid_t = Pid::from_raw(i32::try_from(pid).ok()?)?;
        let fd = i32::try_from(fd).ok()?;
        let mut cached = lock(&self.pidfd);
        let mut fresh = false;
        let got = loop {
            if cached.as_ref().is_none_or(|(p, _)| *p != pid) {
                let pfd = match pidfd_open(pid_t, PidfdFlags::empty()) {
                    Ok(f) => crate::sys::banded(f),
                    Err(e) => break Err(e),
                };
                *cached = Some((pid, pfd));
                fresh = true;
            }
            let (_, pfd) = cached.as_ref()?;
            match pidfd_getfd(pfd, fd, PidfdGetfdFlags::empty()) {
                // The process we kept has ended; a new one may have its pid: open it again.
                Err(rustix::io::Errno::SRCH) if !fresh => *cached = None,
                r => break r,
            }
        };
        drop(cached);
        match got {
            Ok(b) => {
                let st = rustix::fs::fstat(&b).ok()?;
                let sock =
                    rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Socket;
                if !sock || st.st_ino != ino {
                    return None;
                }
                let maker = rustix::net::sockopt::socket_peercred(&b).ok()?;
                if maker.uid.as_raw() != peer_uid
                    || i32::try_from(pid).ok() != Some(maker.pid.as_raw_nonzero().get())
                {
                    return None;
                }
                self.fetch.store(FETCH_YES, Ordering::Relaxed);
                Some(crate::sys::banded(b))
            }
            // Not allowed (another user, a ptrace policy, no pidfd_getfd): the channel, for
            // good.
            Err(rustix::io::Errno::PERM | rustix::io::Errno::ACCESS | rustix::io::Errno::NOSYS) => {
                self.fetch.store(FETCH_NO, Ordering::Relaxed);
                None
            }
            Err(_) => None,
        }
    }

    /// Takes the bell of the peer's connection `id`, looking in the channel if it is not kept
    /// yet.
    fn take(&self, id: u64) -> Option<OwnedFd> {
        let mut st = lock(&self.stash);
        if let Some(b) = st.bells.remove(&id) {
            return Some(b);
        }
        self.drain_into(&mut st);
        st.bells.remove(&id)
    }

    /// Moves every record waiting in the channel into the stash (the housekeeping thread
    /// calls this when the channel is readable); returns `true` when the peer's end is closed
    /// (nothing will come again, and the channel stays readable for good).
    pub fn drain(&self) -> bool {
        self.drain_into(&mut lock(&self.stash))
    }

    fn drain_into(&self, st: &mut Stash) -> bool {
        let Some(ch) = self.chan.get() else {
            return false;
        };
        let mut closed = false;
        let mut buf = [0u8; 8];
        // A bounded number per call: a peer flooding the channel cannot hold us here.
        for _ in 0..4 * STASHED_MAX {
            match recv_record(ch.as_fd(), &mut buf, RecvFlags::DONTWAIT) {
                Ok((8, mut fds)) if fds.len() == 1 => {
                    // A newer bell for the same connection replaces the older one.
                    st.bells
                        .insert(u64::from_ne_bytes(buf), fds.pop().expect("one"));
                }
                // Not a bell (a hostile peer's record): dropped with its descriptors.
                Ok((n, _)) if n > 0 => {}
                // The end of a SOCK_SEQPACKET pair: the peer closed its end.
                Ok(_) => {
                    closed = true;
                    break;
                }
                // Empty or failing.
                Err(_) => break,
            }
        }
        if st.bells.len() > STASHED_MAX {
            let Stash { bells, live } = st;
            bells.retain(|id, _| live.contains(id));
        }
        closed
    }

    /// A link to the peer's connection `id` exists: its bell is kept when it arrives.
    fn opened(&self, id: u64) {
        lock(&self.stash).live.insert(id);
    }

    /// The link to the peer's connection `id` is gone: its bell is not needed.
    fn closed(&self, id: u64) {
        let mut st = lock(&self.stash);
        st.live.remove(&id);
        st.bells.remove(&id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The flag bytes of a consumer word (whatever the host's byte order).
const FLAG_BYTES: u64 = SmcdCursorWord::encode(
    smc_proto::cdc::Cursor::ZERO,
    ProducerFlags::from_bits_retain(0xff),
    ConnStateFlags::from_bits_retain(0xff),
);

/// One SMC-D connection's link: our DMB, the peer's, and the bells.
#[derive(Debug)]
pub struct SmcdLink {
    own: Arc<Dmb>,
    peer: Arc<Dmb>,
    /// The link group's bell channel.
    bells: Arc<Bells>,
    /// The id in our DMB's engine word, and the one the peer wrote into its DMB.
    own_id: u64,
    peer_id: u64,
    ready: OnceLock<Readiness>,
    peer_bell: OnceLock<Bell>,
    /// The words of our DMB last handed to the connection.
    seen_prod: AtomicU64,
    seen_cons: AtomicU64,
    /// The words last stored into the peer's DMB.
    out_prod: AtomicU64,
    out_cons: AtomicU64,
    /// We are done writing and have told the peer's readiness (if it has one).
    told_done: AtomicBool,
}

impl SmcdLink {
    /// A link over `own` (reset for this connection, with `own_id` in its engine word) and
    /// the peer's `peer` (its engine word read after attaching), in the link group whose bell
    /// channel is `bells`.
    pub fn new(own: Arc<Dmb>, peer: Arc<Dmb>, own_id: u64, bells: Arc<Bells>) -> Self {
        let peer_id = peer.map.epoch_word().load(Ordering::Acquire) & ID_MASK;
        bells.opened(peer_id);
        Self {
            own,
            peer,
            bells,
            own_id,
            peer_id,
            ready: OnceLock::new(),
            peer_bell: OnceLock::new(),
            seen_prod: AtomicU64::new(0),
            seen_cons: AtomicU64::new(0),
            out_prod: AtomicU64::new(0),
            out_cons: AtomicU64::new(0),
            told_done: AtomicBool::new(false),
        }
    }

    /// The peer's bell, taken from the group's bell channel the first time it is needed (see
    /// the module docs); `None` while the peer has sent none (then nobody waits on its readiness).
    fn peer_bell(&self) -> Option<&Bell> {
        if let Some(b) = self.peer_bell.get() {
            return Some(b);
        }
        let word = self.peer.map.epoch_word().load(Ordering::Acquire);
        if word & ID_MASK != self.peer_id {
            return None;
        }
        let located = word & BELL_LOCATED != 0;
        let mut got = None;
        if word & BELL_SENT != 0 {
            // A bell in the channel is taken from there, so the channel holds no record nobody
            // wants.
            got = self.bells.take(self.peer_id).map(crate::sys::banded);
            if got.is_some() && located && self.bells.fetch_unknown() {
                // Learn once whether the peer's processes give bells by pidfd_getfd: then our
                // DMBs say so, and the peer stops sending its bells through the channel.
                drop(self.fetch_located());
            }
        }
        if got.is_none() && located {
            // Not in the channel (another process of ours that shares it took the record,
            // or it was never sent): from the owner's process.
            got = self.fetch_located();
        }
        // None: no bell, or the peer broke its promise; its waiters stay asleep, ours are
        // unaffected.
        let bell = Bell::from_fd(got?);
        Some(self.peer_bell.get_or_init(|| bell))
    }

    /// The peer's bell from the locator in its DMB (see the module docs).
    fn fetch_located(&self) -> Option<OwnedFd> {
        // The caller loaded the engine word with Acquire: the locator was written before it.
        let (pid, fd) = self.peer.map.bell_pid_fd();
        self.bells.fetch(
            pid.load(Ordering::Relaxed),
            fd.load(Ordering::Relaxed),
            self.peer.map.bell_ino().load(Ordering::Relaxed),
        )
    }

    /// Wakes the peer's waiters for `dir` in the ways `how` says.
    #[inline]
    fn wake_peer(&self, dir: Dir, how: u32) {
        wake(&self.peer, dir, how, || self.peer_bell());
    }

    /// Our DMB.
    pub fn own(&self) -> &Arc<Dmb> {
        &self.own
    }

    /// The peer's DMB.
    pub fn peer(&self) -> &Arc<Dmb> {
        &self.peer
    }

    /// Whether the peer has put its close or abort flag into our DMB: it will not write into
    /// it again.
    pub fn peer_closed(&self) -> bool {
        self.own.peer_done()
    }

    /// Wakes the peer if it announced waiting for `dir` (after a publication; tests that play
    /// a hostile peer use it after scribbling).
    pub fn ring_peer(&self, dir: Dir) {
        let how = self.peer.take_waiter(dir);
        self.wake_peer(dir, how);
    }
    /// [`Transport::send_cdc`] when the consumer word (or the flags) may have changed too.
    #[inline(never)]
    fn send_cdc_words(&self, cdc: &HostCdc, pw: u64) -> io::Result<()> {
        let cw = SmcdCursorWord::encode(cdc.cons, cdc.pflags, cdc.cflags);
        // The connection calls this under its lock: plain loads and stores suffice for our own
        // record of what we stored (no read-modify-write on the data path).
        let old_pw = self.out_prod.load(Ordering::Relaxed);
        let old_cw = self.out_cons.load(Ordering::Relaxed);
        if pw == old_pw && cw == old_cw {
            return Ok(());
        }
        self.out_prod.store(pw, Ordering::Relaxed);
        self.out_cons.store(cw, Ordering::Relaxed);
        if pw != old_pw {
            // Release: the bytes copied into the ring become visible with the cursor.
            self.peer.map.prod_word().store(pw, Ordering::Release);
        }
        if cw != old_cw {
            // Release: the space we confirm is free; a close flag follows every byte before it.
            self.peer.map.cons_word().store(cw, Ordering::Release);
        }
        let flags_changed = (cw ^ old_cw) & FLAG_BYTES != 0;
        let cons_moved = (cw ^ old_cw) & !FLAG_BYTES != 0;
        let (rx, tx) = self
            .peer
            .take_waiters(pw != old_pw || flags_changed, cons_moved || flags_changed);
        if rx != 0 {
            self.wake_peer(Dir::Rx, rx);
        }
        if tx != 0 {
            self.wake_peer(Dir::Tx, tx);
        }
        // A peer that closed already (its close or abort is in our DMB) waits on nothing.
        if flags_changed
            && !cdc.cflags.is_empty()
            && !self.told_done.load(Ordering::Relaxed)
            && !self.own.peer_done()
        {
            // We are done writing (done-writing, close or abort): the peer's descriptor shows
            // the end of stream at once, as a FIN would, even if nobody there calls in. The
            // engine word is read after the flags were stored and the fence of take_waiters:
            // a peer that makes its readiness later sees the flags itself.
            if let Some(b) = self.peer_bell() {
                self.told_done.store(true, Ordering::Relaxed);
                b.shut_write();
            }
        }
        Ok(())
    }
}

impl Drop for SmcdLink {
    fn drop(&mut self) {
        self.bells.closed(self.peer_id);
    }
}

impl Transport for SmcdLink {
    const CDC_IS_STATE: bool = true;

    #[inline]
    fn write_tx(&self, offset: usize, data: &[u8]) {
        self.peer.map.write_ring(offset, data);
    }

    #[inline]
    fn read_rx(&self, offset: usize, out: &mut [u8]) {
        self.own.map.read_ring(offset, out);
    }

    fn write_remote(&self, _w: &RemoteWrite) -> io::Result<()> {
        // No-copy: the bytes are in the peer's ring already; the core never asks.
        Ok(())
    }

    #[inline]
    fn send_cdc(&self, cdc: &HostCdc, cons_changed: bool) -> io::Result<()> {
        let pw = SmcdCursorWord::encode(cdc.prod, ProducerFlags::EMPTY, ConnStateFlags::EMPTY);
        if !cons_changed {
            // The data path: one word, and the reader woken if it sleeps.
            if pw != self.out_prod.load(Ordering::Relaxed) {
                self.out_prod.store(pw, Ordering::Relaxed);
                // Release: the bytes copied into the ring become visible with the cursor.
                self.peer.map.prod_word().store(pw, Ordering::Release);
                let how = self.peer.take_waiters(true, false).0;
                if how != 0 {
                    self.wake_peer(Dir::Rx, how);
                }
            }
            return Ok(());
        }
        self.send_cdc_words(cdc, pw)
    }

    fn recv_cdc(&self) -> Option<HostCdc> {
        // Flags first, then the producer word: the peer stores them in the opposite order.
        let cw = self.own.map.cons_word().load(Ordering::Acquire);
        let pw = self.own.map.prod_word().load(Ordering::Acquire);
        // Called under the connection's lock: the record of what we saw needs no
        // read-modify-write.
        if cw == self.seen_cons.load(Ordering::Relaxed)
            && pw == self.seen_prod.load(Ordering::Relaxed)
        {
            return None;
        }
        self.seen_cons.store(cw, Ordering::Relaxed);
        self.seen_prod.store(pw, Ordering::Relaxed);
        let (c, p) = (SmcdCursorWord::decode(cw), SmcdCursorWord::decode(pw));
        Some(HostCdc {
            seqno: 0,
            prod: p.cursor,
            cons: c.cursor,
            pflags: c.prod_flags,
            cflags: c.conn_flags,
        })
    }

    fn cdc_pending(&self) -> bool {
        self.own.map.cons_word().load(Ordering::Relaxed) != self.seen_cons.load(Ordering::Relaxed)
            || self.own.map.prod_word().load(Ordering::Relaxed)
                != self.seen_prod.load(Ordering::Relaxed)
    }

    fn poll_completion(&self) -> Option<u16> {
        None
    }

    #[inline]
    fn events_pending(&self) -> bool {
        // Sends complete when they are made: only the words can bring something.
        self.cdc_pending()
    }

    fn arm(&self, dir: Dir, who: Waiter) {
        self.own.arm(
            dir,
            match who {
                Waiter::Event => WAIT_BELL,
                Waiter::Thread => WAIT_FUTEX,
            },
        );
    }

    fn withdraw(&self, dir: Dir) -> bool {
        self.own.withdraw(dir, WAIT_BELL)
    }

    fn set_rx_tag(&self, tag: u64) {
        self.own.set_rx_tag(tag);
    }

    fn untag_rx(&self) -> bool {
        self.own.untag_rx()
    }

    fn rx_tagged(&self) -> bool {
        self.own.rx_tagged()
    }

    fn sleep(&self, dir: Dir, timeout: Option<Duration>) -> io::Result<bool> {
        let ts = timeout.map(|t| rustix::time::Timespec {
            tv_sec: t.as_secs() as i64,
            tv_nsec: i64::from(t.subsec_nanos()),
        });
        self.own.sleep(dir, ts.as_ref())
    }

    fn wake_local(&self, dir: Dir) {
        // Called under the connection's lock after a change of its state; a waiter announces
        // itself before it takes the lock to look, so the lock orders the two and no fence is
        // needed here (unlike a publication into shared memory, `ring_peer`).
        if !self.own.is_armed(dir) {
            return;
        }
        let how = self.own.take_waiter_local(dir);
        wake(&self.own, dir, how, || {
            self.ready.get().map(Readiness::bell)
        });
    }

    fn await_rings(&self, dir: Dir) {
        self.own.await_rings(dir, RING_WAIT_LIMIT);
    }

    fn readiness(&self) -> Option<&Readiness> {
        self.ready.get()
    }

    fn make_readiness(&self, given: Option<Readiness>) -> io::Result<(&Readiness, bool)> {
        if let Some(r) = self.ready.get() {
            return match given {
                None => Ok((r, false)),
                Some(_) => Err(already_ready()),
            };
        }
        let r = match given {
            Some(r) => r,
            None => Readiness::new()?,
        };
        let far = r.far_end();
        let ino = rustix::fs::fstat(far)?.st_ino;
        let (pid, fd) = self.own.map.bell_pid_fd();
        pid.store(std::process::id(), Ordering::Relaxed);
        fd.store(far.as_raw_fd() as u32, Ordering::Relaxed);
        self.own.map.bell_ino().store(ino, Ordering::Relaxed);
        let mut word = self.own_id | BELL_LOCATED;
        // The peer wrote it before the CLC message that named its DMB.
        if self.peer.map.owner_fetches().load(Ordering::Relaxed) == 0 {
            match self.bells.send(self.own_id, far) {
                Ok(()) => word |= BELL_SENT,
                // The peer's engine is gone: nobody will ring, the readiness shows the end
                // once the connection sees it.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    return Ok((self.ready.get_or_init(|| r), true));
                }
                // No channel (yet): the locator alone.
                Err(e) if e.kind() == io::ErrorKind::NotConnected => {}
                Err(e) => return Err(e),
            }
        }
        // After the locator is written and the bell is in the channel, before anyone announces
        // an event loop: a peer that takes the announcement finds the bell. SeqCst: the caller
        // then looks at the peer's flags (the other half of the pair in send_cdc).
        self.own.map.epoch_word().store(word, Ordering::SeqCst);
        // The connection's lock serialises callers: this is the only set.
        let r = self.ready.get_or_init(|| r);
        Ok((r, true))
    }
}
