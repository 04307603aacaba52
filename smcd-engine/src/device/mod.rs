//! SMC-D devices: where DMBs come from (the kernel's `smcd_ops` in `smc_ism.h`, implemented by
//! `smc_loopback.c`).
//!
//! A [`BufferProvider`] registers DMBs (memory the owner receives into), lets the one
//! permitted peer attach them, and unregisters them. Data moves by plain copies into the
//! attached mapping (the kernel's loopback "DMB no-copy" mode). A link group's first DMB also
//! carries the group's bell channel to the peer (a Unix socket pair made by the engine that
//! created the group, one end handed over with the registration, given to the attacher once):
//! when an application asks for a connection's readiness descriptor, its engine sends the
//! descriptor's bell through the group's channel, so the peer can wake that connection's event
//! loop directly (see `transport::smcd`). One channel per group rather than one per DMB: an
//! idle connection then costs each engine no descriptor beyond its TCP socket.
//!
//! Implementations: [`loopback`] (DMBs owned by `smcd`, shared across processes) and
//! [`local`] (DMBs in this process only, for tests without a daemon). Both pass the same
//! conformance suite (`device::conformance`).

pub mod local;
pub mod loopback;
pub mod shm;

use rustix::fd::{BorrowedFd, OwnedFd};
use shm::DmbMap;
pub use smc_core::gid::{Gid, gid_hi, gid_join, gid_lo};
use std::io;
use std::sync::atomic::{AtomicU32, Ordering, fence};

/// The loopback device's CHID (emulated ISM range 0xFF00..=0xFFFF).
pub const LOOPBACK_CHID: u16 = 0xFFFF;

/// Waiting-word bit: the owner's event loop waits on the connection's readiness descriptor;
/// ring its bell.
pub const WAIT_BELL: u32 = 1;
/// Waiting-word bit: a thread of the owner sleeps in `futex_wait` on the word; wake it.
pub const WAIT_FUTEX: u32 = 2;
/// The announcement bits of a waiting word.
const ANNOUNCED: u32 = WAIT_BELL | WAIT_FUTEX;
/// Waiting-word count (bits 8 and up): bells whose announcement was taken and whose ring is
/// not done yet. The owner waits for them before it clears its readiness
/// ([`Dmb::await_rings`]): a ring that lands after the clear would show the descriptor
/// readable with nothing to read, and wrk counts a readable descriptor whose read says
/// `EAGAIN` as an error.
const RINGING: u32 = 1 << 8;
/// A reader's sleep tag after the writer took the announcement and did not ring it
/// ([`Dmb::take_ring`]).
const SKIPPED: u64 = u64::MAX;

/// Which of a DMB's two waiting words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// The owner's reader waits for data or a close (the producer word changes).
    Rx,
    /// The owner's writer waits for space (the consumer word changes).
    Tx,
}

/// One mapped DMB: either owned (we receive into it) or attached (we send into it).
#[derive(Debug)]
pub struct Dmb {
    /// The token that names it on the device (sent in CLC Accept/Confirm).
    pub token: u64,
    /// The mapping.
    pub map: DmbMap,
    /// An attached DMB: the user of the engine that owns it, as smcd learnt it from the
    /// kernel (`None`: our own, or a device that does not say).
    pub owner_uid: Option<u32>,
}

impl Dmb {
    fn waiting(&self, dir: Dir) -> &AtomicU32 {
        match dir {
            Dir::Rx => self.map.rx_waiting(),
            Dir::Tx => self.map.tx_waiting(),
        }
    }

    /// Owner side: announces that it is about to wait for `dir`, in the ways `how`
    /// ([`WAIT_BELL`], [`WAIT_FUTEX`]). The caller must re-check its condition after this (the
    /// SeqCst read-modify-write is one half of a Dekker pair with [`Dmb::take_waiter`]: either
    /// the owner sees the new header value, or the peer sees the announcement).
    #[inline]
    pub fn arm(&self, dir: Dir, how: u32) {
        self.waiting(dir).fetch_or(how, Ordering::SeqCst);
    }

    /// Owner side, after [`Dmb::arm`] with [`WAIT_FUTEX`] and a second look: sleeps until the
    /// announcement is taken (and the word woken), a signal, or `timeout`. Returns at once if
    /// it was taken already. `Ok(false)` means the timeout passed.
    pub fn sleep(&self, dir: Dir, timeout: Option<&rustix::time::Timespec>) -> io::Result<bool> {
        use rustix::thread::futex;
        let w = self.waiting(dir);
        let v = w.load(Ordering::Acquire);
        if v & WAIT_FUTEX == 0 {
            return Ok(true);
        }
        // Not PRIVATE: the word is in memory shared with the peer's process.
        match futex::wait(w, futex::Flags::empty(), v, timeout) {
            Ok(()) | Err(rustix::io::Errno::AGAIN) => Ok(true),
            // A signal whose handler does not restart calls (with SA_RESTART the kernel
            // restarts the wait itself): the caller decides (SmcConn::set_interruptible).
            Err(rustix::io::Errno::INTR) => Err(io::ErrorKind::Interrupted.into()),
            Err(rustix::io::Errno::TIMEDOUT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Wakes every thread sleeping in [`Dmb::sleep`] for `dir` (after taking an announcement
    /// with [`WAIT_FUTEX`] in it).
    #[cold]
    #[inline(never)]
    pub fn wake_sleepers(&self, dir: Dir) {
        use rustix::thread::futex;
        let _ = futex::wake(self.waiting(dir), futex::Flags::empty(), u32::MAX);
    }

    /// Whether the peer has put its close or abort flag into this DMB's header: it will not
    /// write into it again, so the DMB may serve another connection.
    pub fn peer_done(&self) -> bool {
        let w =
            smc_proto::cdc::SmcdCursorWord::decode(self.map.cons_word().load(Ordering::Acquire));
        w.conn_flags.peer_conn_closed() || w.conn_flags.peer_conn_abort()
    }

    /// Owner side, before it announces its reader ([`Dmb::arm`]): which of its waits on
    /// descriptors the announcement belongs to (0: none in particular). A tagged announcement
    /// is one of several the owner made for one sleeping thread, and one ring per tag wakes it
    /// ([`Dmb::take_ring`]).
    pub fn set_rx_tag(&self, tag: u64) {
        self.map.rx_sleep_tag().store(tag, Ordering::Relaxed);
    }

    /// Owner side: the reader's announcement no longer belongs to a tagged sleep; `true` when
    /// the peer took it and did not ring it (the owner's thread was rung for another
    /// connection of the same sleep): then the readiness is not readable and not announced,
    /// and bytes may be there. The swap races [`Dmb::take_ring`]'s compare-exchange: exactly
    /// one of them gets the tag.
    pub fn untag_rx(&self) -> bool {
        self.map.rx_sleep_tag().swap(0, Ordering::AcqRel) == SKIPPED
    }

    /// Owner side: whether the reader's announcement belongs to a tagged sleep now (or the
    /// peer skipped it and the owner has not untagged yet).
    pub fn rx_tagged(&self) -> bool {
        self.map.rx_sleep_tag().load(Ordering::Acquire) != 0
    }

    /// Writer side, after it took the owner's reader announcement with [`WAIT_BELL`] in it:
    /// whether to ring. Not when the announcement carries the tag of a sleep this thread
    /// rang already for another connection (`last`, this thread's record of the last tag it
    /// rang), and the tag is marked skipped (compare-exchange, against the owner's
    /// [`Dmb::untag_rx`]); `last` is updated when it rings a tagged one. An owner that writes
    /// garbage here only has its own connections rung or not.
    pub fn take_ring(&self, last: &std::cell::Cell<u64>) -> bool {
        let w = self.map.rx_sleep_tag();
        let tag = w.load(Ordering::Acquire);
        if tag == 0 || tag == SKIPPED {
            return true;
        }
        if last.get() == tag
            && w.compare_exchange(tag, SKIPPED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            return false;
        }
        last.set(tag);
        true
    }

    /// Owner side: takes back the part `how` of its announcement for `dir` if the peer has
    /// not taken the announcement yet; `true` when it was still there (no ring or wake for it
    /// will come). The read-modify-write races [`Dmb::take_waiter`]'s: exactly one of the two
    /// gets it.
    pub fn withdraw(&self, dir: Dir, how: u32) -> bool {
        let w = self.waiting(dir);
        let mut old = w.load(Ordering::Relaxed);
        loop {
            if old & how == 0 {
                return false;
            }
            match w.compare_exchange_weak(old, old & !how, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(v) => old = v,
            }
        }
    }

    /// Whether the owner announced waiting for `dir`.
    #[inline]
    pub fn is_armed(&self, dir: Dir) -> bool {
        self.waiting(dir).load(Ordering::Relaxed) & ANNOUNCED != 0
    }

    /// After the ring of an announcement taken with [`WAIT_BELL`] in it (or the decision not
    /// to ring it): that ring is no longer under way.
    #[inline]
    pub fn rung(&self, dir: Dir) {
        self.waiting(dir).fetch_sub(RINGING, Ordering::Release);
    }

    /// Whether a ring taken from an announcement for `dir` is under way.
    pub fn rings_under_way(&self, dir: Dir) -> bool {
        self.waiting(dir).load(Ordering::Acquire) >= RINGING
    }

    /// Owner side, before it clears its readiness for `dir`: waits until no ring taken from
    /// an earlier announcement is under way (see [`RINGING`]), at most `limit` (the word is
    /// also the peer's to write: a peer that never finishes only makes its own connection's
    /// readiness wrong). A ring is a system call away once taken, so this almost never waits.
    pub fn await_rings(&self, dir: Dir, limit: std::time::Duration) {
        let w = self.waiting(dir);
        if w.load(Ordering::Acquire) < RINGING {
            return;
        }
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        while w.load(Ordering::Acquire) >= RINGING && start.elapsed() < limit {
            if spins < 64 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// After publishing into this DMB's header (or changing what the owner waits for): takes
    /// the owner's announcement if there is one. Non-zero means: wake it in the ways the bits
    /// say, exactly once. The full fence orders the publishing stores before the load of the
    /// waiting word.
    #[inline]
    pub fn take_waiter(&self, dir: Dir) -> u32 {
        fence(Ordering::SeqCst);
        self.take(dir)
    }

    #[inline]
    fn take(&self, dir: Dir) -> u32 {
        let w = self.waiting(dir);
        let mut old = w.load(Ordering::Relaxed);
        loop {
            if old & ANNOUNCED == 0 {
                return 0;
            }
            // The announcement goes; a bell to ring is counted under way until `rung`.
            let ringing = if old & WAIT_BELL != 0 { RINGING } else { 0 };
            let new = (old & !ANNOUNCED).wrapping_add(ringing);
            match w.compare_exchange_weak(old, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return old & ANNOUNCED,
                Err(v) => old = v,
            }
        }
    }

    /// [`Dmb::take_waiter`] for both directions with one fence: `(reader, writer)`.
    #[inline]
    pub fn take_waiters(&self, rx: bool, tx: bool) -> (u32, u32) {
        fence(Ordering::SeqCst);
        (
            if rx { self.take(Dir::Rx) } else { 0 },
            if tx { self.take(Dir::Tx) } else { 0 },
        )
    }

    /// [`Dmb::take_waiter`] without the fence, for wake-ups whose ordering a lock provides.
    #[inline]
    pub fn take_waiter_local(&self, dir: Dir) -> u32 {
        self.take(dir)
    }
}

/// Where SMC-D buffers come from: an ISM device as the data plane sees it.
pub trait BufferProvider: Send + Sync + std::fmt::Debug {
    /// This device instance's GID.
    fn gid(&self) -> Gid;
    /// The device's CHID.
    fn chid(&self) -> u16;
    /// Registers a DMB of `len` bytes (a power of two, 16 KiB..1 MiB) that only `peer` may
    /// attach. The header and metadata are reset. `handover` (the peer's end of a new link
    /// group's [`bell_channel`]) goes to the peer with its first attach of this DMB; the
    /// device keeps its own copy only until then.
    fn register_dmb(
        &self,
        len: usize,
        peer: Gid,
        handover: Option<BorrowedFd<'_>>,
    ) -> io::Result<Dmb>;
    /// Attaches the peer's DMB `token` for sending into it, with the bell channel end the
    /// owner handed over with it, if this is the first attach of a DMB that carries one.
    fn attach_dmb(&self, token: u64) -> io::Result<(Dmb, Option<OwnedFd>)>;
    /// Tells the device the owner no longer uses `token` (its memory lives on while mapped).
    fn unregister_dmb(&self, token: u64);
}

/// A link group's bell channel: a Unix `SOCK_SEQPACKET` pair, the creator's end and the one
/// it hands over with the group's first DMB.
pub fn bell_channel() -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let (a, b) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    Ok((crate::sys::banded(a), crate::sys::banded(b)))
}

#[cfg(test)]
pub(crate) mod conformance {
    //! Behaviour every device must show.
    use super::*;
    use rustix::fd::AsFd;
    use std::sync::atomic::Ordering;

    /// `a` and `b` are two instances (two engines) of the same device type.
    pub fn run(a: &dyn BufferProvider, b: &dyn BufferProvider, stranger: &dyn BufferProvider) {
        assert_ne!(a.gid(), b.gid(), "instances have distinct GIDs");
        let (kept, handed) = bell_channel().expect("a bell channel");
        let owned = a
            .register_dmb(shm::DMB_MIN_LEN, b.gid(), Some(handed.as_fd()))
            .expect("register");
        drop(handed);
        assert_ne!(owned.token, 0);
        assert_eq!(owned.map.prod_word().load(Ordering::Relaxed), 0, "reset");
        let (attached, chan) = b
            .attach_dmb(owned.token)
            .expect("the named peer may attach");
        let chan = chan.expect("the first attach brings the handed-over channel end");
        // The channel connects the group's two engines; the device keeps no copy.
        rustix::io::write(&kept, b"x").unwrap();
        let mut b1 = [0u8; 1];
        assert_eq!(rustix::io::read(&chan, &mut b1).unwrap(), 1);
        let (again, none) = b.attach_dmb(owned.token).expect("attach again");
        assert!(none.is_none(), "the channel end is given once");
        drop(again);
        drop(chan);
        assert_eq!(
            rustix::io::read(&kept, &mut b1).unwrap(),
            0,
            "the device held no copy of the handed-over end"
        );
        let plain = a
            .register_dmb(shm::DMB_MIN_LEN, b.gid(), None)
            .expect("register without a channel");
        assert!(b.attach_dmb(plain.token).unwrap().1.is_none());
        a.unregister_dmb(plain.token);
        assert_eq!(attached.map.dmb_len(), shm::DMB_MIN_LEN);
        // Bytes written by the peer appear in the owner's mapping.
        attached.map.write_ring(5, b"hello");
        attached.map.prod_word().store(5, Ordering::Release);
        let mut out = [0u8; 5];
        assert_eq!(owned.map.prod_word().load(Ordering::Acquire), 5);
        owned.map.read_ring(5, &mut out);
        assert_eq!(&out, b"hello");
        // Someone else may not attach, nor may an unknown token.
        assert!(stranger.attach_dmb(owned.token).is_err());
        assert!(b.attach_dmb(owned.token ^ 0x5a5a).is_err());
        assert!(
            a.register_dmb(1000, b.gid(), None).is_err(),
            "bad size refused"
        );
        // The waiting words: an announcement is taken once.
        assert_eq!(attached.take_waiter(Dir::Rx), 0);
        owned.arm(Dir::Rx, WAIT_BELL);
        owned.arm(Dir::Rx, WAIT_FUTEX);
        assert!(attached.is_armed(Dir::Rx));
        assert_eq!(attached.take_waiter(Dir::Rx), WAIT_BELL | WAIT_FUTEX);
        assert_eq!(attached.take_waiter(Dir::Rx), 0, "taken once");
        // The bell taken is under way until it is rung; a new announcement is apart from it,
        // and the owner's await_rings returns once every ring is done.
        assert!(owned.rings_under_way(Dir::Rx));
        assert!(!attached.is_armed(Dir::Rx));
        owned.arm(Dir::Rx, WAIT_BELL);
        assert!(attached.is_armed(Dir::Rx));
        assert_eq!(attached.take_waiter(Dir::Rx), WAIT_BELL);
        attached.rung(Dir::Rx);
        assert!(owned.rings_under_way(Dir::Rx), "one ring still under way");
        std::thread::scope(|s| {
            let waiter =
                s.spawn(|| owned.await_rings(Dir::Rx, std::time::Duration::from_secs(600)));
            attached.rung(Dir::Rx);
            waiter.join().unwrap();
        });
        assert!(!owned.rings_under_way(Dir::Rx));
        // A sleeper on the owner's side is woken through the peer's mapping (a shared futex):
        // the peer takes the announcement only once the sleeper is blocked in futex_wait
        // (its /proc syscall file says 202), so without the wake it would sleep for ever.
        owned.arm(Dir::Tx, WAIT_FUTEX);
        std::thread::scope(|s| {
            let (tid_tx, tid_rx) = std::sync::mpsc::channel();
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            let sleeper = &owned;
            s.spawn(move || {
                tid_tx
                    .send(rustix::thread::gettid().as_raw_nonzero())
                    .unwrap();
                sleeper.sleep(Dir::Tx, None).unwrap();
                done_tx.send(()).unwrap();
            });
            let tid = tid_rx.recv().unwrap();
            let in_futex = || {
                std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
                    .is_ok_and(|s| s.starts_with("202 "))
            };
            while !in_futex() {
                std::thread::yield_now();
            }
            assert_ne!(attached.take_waiter(Dir::Tx), 0);
            attached.wake_sleepers(Dir::Tx);
            let woken = done_rx
                .recv_timeout(std::time::Duration::from_secs(20))
                .is_ok();
            if !woken {
                // Let the scope end, then fail.
                owned.wake_sleepers(Dir::Tx);
            }
            assert!(
                woken,
                "the peer's futex wake did not reach the owner's sleeper"
            );
        });
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        owned.arm(Dir::Tx, WAIT_FUTEX);
        assert!(!owned.sleep(Dir::Tx, Some(&zero)).unwrap(), "times out");
        a.unregister_dmb(owned.token);
        // Our mappings stay valid after unregister.
        assert_eq!(owned.map.prod_word().load(Ordering::Acquire), 5);
    }
}
