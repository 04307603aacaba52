//! SMC-D devices: where DMBs come from and how the two ends of a connection signal each other
//! (the kernel's `smcd_ops` in `smc_ism.h`, implemented by `smc_loopback.c`).
//!
//! A device registers DMBs (memory the owner receives into), lets the one permitted peer attach
//! them, and unregisters them. Data moves by plain copies into the attached mapping (the
//! kernel's loopback "DMB no-copy" mode); the signal that the kernel's `move_data(sf=1)` raises
//! is [`Dmb::notify`] here: a futex wake or an eventfd write, only when the owner said it is
//! about to sleep.
//!
//! Implementations: [`loopback::LoopbackDevice`] (DMBs owned by `smcd`, shared across
//! processes) and [`local::LocalDevice`] (DMBs in this process only, for tests and benchmarks
//! of the data path without a daemon). Both pass the same conformance suite
//! (`device::conformance`).

pub mod local;
pub mod loopback;
pub mod shm;

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use shm::DmbMap;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering, fence};
use std::time::Duration;

/// The loopback device's CHID (emulated ISM range 0xFF00..=0xFFFF).
pub const LOOPBACK_CHID: u16 = 0xFFFF;

/// Waiting-word bit: the owner sleeps in `futex_wait` on the word.
pub const WAIT_FUTEX: u32 = 1;
/// Waiting-word bit: the owner waits for its doorbell eventfd (epoll users).
pub const WAIT_EVENTFD: u32 = 2;

/// Which of a DMB's two waiting words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// The owner's reader waits for data or a close (the producer word changes).
    Rx,
    /// The owner's writer waits for space (the consumer word changes).
    Tx,
}

/// An eventfd the peer writes to wake an owner that waits in `poll`/`epoll`.
#[derive(Debug)]
pub struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    /// A new non-blocking eventfd.
    pub fn new() -> io::Result<Self> {
        let fd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        Ok(Self { fd })
    }

    /// Wraps a received eventfd.
    pub fn from_fd(fd: OwnedFd) -> Self {
        Self { fd }
    }

    /// Makes the eventfd readable.
    pub fn ring(&self) {
        // EAGAIN means the counter is saturated, i.e. already readable: nothing to do.
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// Resets the eventfd to not readable.
    pub fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut b);
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// One mapped DMB with its doorbell: either owned (we receive into it) or attached (we send
/// into it).
#[derive(Debug)]
pub struct Dmb {
    /// The token that names it on the device (sent in CLC Accept/Confirm).
    pub token: u64,
    /// The mapping.
    pub map: DmbMap,
    /// The owner's doorbell.
    pub bell: Doorbell,
}

impl Dmb {
    fn waiting(&self, dir: Dir) -> &AtomicU32 {
        match dir {
            Dir::Rx => self.map.rx_waiting(),
            Dir::Tx => self.map.tx_waiting(),
        }
    }

    /// Peer side, after publishing into this DMB's header: wakes the owner if it said it is
    /// about to sleep on `dir`.
    ///
    /// The full fence orders the publishing store before the load of the waiting word; the
    /// owner's `fetch_or` in [`Dmb::arm`] is the other half of this Dekker pair, so either the
    /// owner sees the new header value or we see its waiting bit.
    #[inline]
    pub fn notify(&self, dir: Dir) {
        fence(Ordering::SeqCst);
        let w = self.waiting(dir);
        if w.load(Ordering::Relaxed) == 0 {
            return;
        }
        let old = w.swap(0, Ordering::AcqRel);
        if old & WAIT_FUTEX != 0 {
            let _ = rustix::thread::futex::wake(w, rustix::thread::futex::Flags::empty(), u32::MAX);
        }
        if old & WAIT_EVENTFD != 0 {
            self.bell.ring();
        }
    }

    /// Owner side: announces that the owner is about to wait on `dir` in the way `how` says.
    /// The caller must re-check its condition after this and only then sleep.
    #[inline]
    pub fn arm(&self, dir: Dir, how: u32) -> u32 {
        // SeqCst RMW: a full barrier between this store and the condition re-check.
        self.waiting(dir).fetch_or(how, Ordering::SeqCst) | how
    }

    /// Owner side: withdraws the waiting announcement (the condition became true).
    #[inline]
    pub fn disarm(&self, dir: Dir, how: u32) {
        self.waiting(dir).fetch_and(!how, Ordering::Relaxed);
    }

    /// Owner side: sleeps until notified on `dir`, at most `timeout`, if the waiting word
    /// still holds `armed` (the value [`Dmb::arm`] returned).
    pub fn sleep(&self, dir: Dir, armed: u32, timeout: Duration) {
        let ts = rustix::time::Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        // EAGAIN (already notified), EINTR and ETIMEDOUT all mean: re-check and carry on.
        let _ = rustix::thread::futex::wait(
            self.waiting(dir),
            rustix::thread::futex::Flags::empty(),
            armed,
            Some(&ts),
        );
    }
}

/// A 128-bit SMC-D GID: `gid` (first 8 bytes on the wire) and `gid_ext` (emulated ISM only).
pub type Gid = u128;

/// The first 64 bits of a GID (what the CLC GID fields and the SMC-D area carry).
pub fn gid_hi(g: Gid) -> u64 {
    (g >> 64) as u64
}

/// The last 64 bits of a GID (`gid_ext` in CLC v2).
pub fn gid_lo(g: Gid) -> u64 {
    g as u64
}

/// Joins `gid` and `gid_ext` into a 128-bit GID.
pub fn gid_join(hi: u64, lo: u64) -> Gid {
    (u128::from(hi) << 64) | u128::from(lo)
}

/// An SMC-D device as the data plane sees it.
pub trait SmcdDevice: Send + Sync + std::fmt::Debug {
    /// This device instance's GID.
    fn gid(&self) -> Gid;
    /// The device's CHID.
    fn chid(&self) -> u16;
    /// Registers a DMB of `len` bytes (a power of two, 16 KiB..1 MiB) that only `peer` may
    /// attach.
    fn register_dmb(&self, len: usize, peer: Gid) -> io::Result<Dmb>;
    /// Attaches the peer's DMB `token` for sending into it.
    fn attach_dmb(&self, token: u64) -> io::Result<Dmb>;
    /// Tells the device the owner no longer uses `token` (its memory lives on while mapped).
    fn unregister_dmb(&self, token: u64);
}

#[cfg(test)]
pub(crate) mod conformance {
    //! Behaviour every device must show.
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    /// `a` and `b` are two instances (two engines) of the same device type.
    pub fn run(a: &dyn SmcdDevice, b: &dyn SmcdDevice, stranger: &dyn SmcdDevice) {
        assert_ne!(a.gid(), b.gid(), "instances have distinct GIDs");
        let owned = a.register_dmb(shm::DMB_MIN_LEN, b.gid()).expect("register");
        owned.map.reset();
        assert_ne!(owned.token, 0);
        let attached = b
            .attach_dmb(owned.token)
            .expect("the named peer may attach");
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
        assert!(a.register_dmb(1000, b.gid()).is_err(), "bad size refused");
        // Notify wakes a futex sleeper exactly when armed.
        let owned = Arc::new(owned);
        let o2 = Arc::clone(&owned);
        let t = std::thread::spawn(move || {
            let armed = o2.arm(Dir::Rx, WAIT_FUTEX);
            let start = std::time::Instant::now();
            while o2.map.prod_word().load(Ordering::Acquire) != 9 {
                o2.sleep(Dir::Rx, armed, Duration::from_secs(5));
            }
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        attached.map.prod_word().store(9, Ordering::Release);
        attached.notify(Dir::Rx);
        let waited = t.join().unwrap();
        assert!(
            waited < Duration::from_secs(4),
            "woken by notify, not by timeout"
        );
        // Eventfd mode: the doorbell becomes readable.
        owned.arm(Dir::Tx, WAIT_EVENTFD);
        attached.notify(Dir::Tx);
        let mut fds = [rustix::event::PollFd::new(
            &owned.bell,
            rustix::event::PollFlags::IN,
        )];
        let n = rustix::event::poll(
            &mut fds,
            Some(&rustix::time::Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            }),
        )
        .unwrap();
        assert_eq!(n, 1);
        owned.bell.drain();
        let n = rustix::event::poll(
            &mut fds,
            Some(&rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            }),
        )
        .unwrap();
        assert_eq!(n, 0, "drained");
        a.unregister_dmb(owned.token);
        // Our mappings stay valid after unregister.
        assert_eq!(owned.map.prod_word().load(Ordering::Acquire), 9);
    }
}
