//! SMC-D devices: where DMBs come from (the kernel's `smcd_ops` in `smc_ism.h`, implemented by
//! `smc_loopback.c`).
//!
//! A [`BufferProvider`] registers DMBs (memory the owner receives into), lets the one
//! permitted peer attach them, and unregisters them. Data moves by plain copies into the
//! attached mapping (the kernel's loopback "DMB no-copy" mode). Each DMB also has a channel
//! between its owner and its attacher (a Unix socket pair made by the device): the owner of a
//! DMB sends through it the readiness bell of every connection that uses the DMB, so the peer
//! can wake that connection's waiters directly (see `transport::smcd`).
//!
//! Implementations: [`loopback`] (DMBs owned by `smcd`, shared across processes) and
//! [`local`] (DMBs in this process only, for tests without a daemon). Both pass the same
//! conformance suite (`device::conformance`).

pub mod local;
pub mod loopback;
pub mod shm;

use rustix::fd::OwnedFd;
use shm::DmbMap;
pub use smc_core::gid::{Gid, gid_hi, gid_join, gid_lo};
use std::io;
use std::sync::atomic::{AtomicU32, Ordering, fence};

/// The loopback device's CHID (emulated ISM range 0xFF00..=0xFFFF).
pub const LOOPBACK_CHID: u16 = 0xFFFF;

/// Waiting-word value: the owner waits on its readiness descriptor; wake it.
pub const WAITING: u32 = 1;

/// Which of a DMB's two waiting words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// The owner's reader waits for data or a close (the producer word changes).
    Rx,
    /// The owner's writer waits for space (the consumer word changes).
    Tx,
}

/// One mapped DMB and this side's end of its channel: either owned (we receive into it) or
/// attached (we send into it).
#[derive(Debug)]
pub struct Dmb {
    /// The token that names it on the device (sent in CLC Accept/Confirm).
    pub token: u64,
    /// The mapping.
    pub map: DmbMap,
    /// The owner's or the attacher's end of the DMB's channel.
    pub chan: OwnedFd,
}

impl Dmb {
    fn waiting(&self, dir: Dir) -> &AtomicU32 {
        match dir {
            Dir::Rx => self.map.rx_waiting(),
            Dir::Tx => self.map.tx_waiting(),
        }
    }

    /// Owner side: announces that it is about to wait for `dir`. The caller must re-check its
    /// condition after this (the SeqCst read-modify-write is one half of a Dekker pair with
    /// [`Dmb::take_waiter`]: either the owner sees the new header value, or the peer sees the
    /// announcement).
    #[inline]
    pub fn arm(&self, dir: Dir) {
        self.waiting(dir).fetch_or(WAITING, Ordering::SeqCst);
    }

    /// Whether the peer has put its close or abort flag into this DMB's header: it will not
    /// write into it again, so the DMB may serve another connection.
    pub fn peer_done(&self) -> bool {
        let w =
            smc_proto::cdc::SmcdCursorWord::decode(self.map.cons_word().load(Ordering::Acquire));
        w.conn_flags.peer_conn_closed() || w.conn_flags.peer_conn_abort()
    }

    /// Whether the owner announced waiting for `dir`.
    #[inline]
    pub fn is_armed(&self, dir: Dir) -> bool {
        self.waiting(dir).load(Ordering::Relaxed) != 0
    }

    /// After publishing into this DMB's header (or changing what the owner waits for): takes
    /// the owner's announcement if there is one. True means: wake it, exactly once. The full
    /// fence orders the publishing stores before the load of the waiting word.
    #[inline]
    pub fn take_waiter(&self, dir: Dir) -> bool {
        fence(Ordering::SeqCst);
        let w = self.waiting(dir);
        w.load(Ordering::Relaxed) != 0 && w.swap(0, Ordering::AcqRel) != 0
    }
}

impl Dmb {
    /// [`Dmb::take_waiter`] for both directions with one fence: `(reader, writer)`.
    #[inline]
    pub fn take_waiters(&self, rx: bool, tx: bool) -> (bool, bool) {
        fence(Ordering::SeqCst);
        let take = |dir| {
            let w = self.waiting(dir);
            w.load(Ordering::Relaxed) != 0 && w.swap(0, Ordering::AcqRel) != 0
        };
        (rx && take(Dir::Rx), tx && take(Dir::Tx))
    }

    /// [`Dmb::take_waiter`] without the fence, for wake-ups whose ordering a lock provides.
    #[inline]
    pub fn take_waiter_local(&self, dir: Dir) -> bool {
        self.waiting(dir).swap(0, Ordering::AcqRel) != 0
    }
}

/// Where SMC-D buffers come from: an ISM device as the data plane sees it.
pub trait BufferProvider: Send + Sync + std::fmt::Debug {
    /// This device instance's GID.
    fn gid(&self) -> Gid;
    /// The device's CHID.
    fn chid(&self) -> u16;
    /// Registers a DMB of `len` bytes (a power of two, 16 KiB..1 MiB) that only `peer` may
    /// attach. The header and metadata are reset.
    fn register_dmb(&self, len: usize, peer: Gid) -> io::Result<Dmb>;
    /// Attaches the peer's DMB `token` for sending into it.
    fn attach_dmb(&self, token: u64) -> io::Result<Dmb>;
    /// Tells the device the owner no longer uses `token` (its memory lives on while mapped).
    fn unregister_dmb(&self, token: u64);
}

/// A DMB channel: a Unix `SOCK_SEQPACKET` pair, the owner's end and the attacher's.
pub fn dmb_channel() -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    Ok(rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?)
}

#[cfg(test)]
pub(crate) mod conformance {
    //! Behaviour every device must show.
    use super::*;
    use std::sync::atomic::Ordering;

    /// `a` and `b` are two instances (two engines) of the same device type.
    pub fn run(a: &dyn BufferProvider, b: &dyn BufferProvider, stranger: &dyn BufferProvider) {
        assert_ne!(a.gid(), b.gid(), "instances have distinct GIDs");
        let owned = a.register_dmb(shm::DMB_MIN_LEN, b.gid()).expect("register");
        assert_ne!(owned.token, 0);
        assert_eq!(owned.map.prod_word().load(Ordering::Relaxed), 0, "reset");
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
        // The waiting words: an announcement is taken once.
        assert!(!attached.take_waiter(Dir::Rx));
        owned.arm(Dir::Rx);
        assert!(attached.is_armed(Dir::Rx));
        assert!(attached.take_waiter(Dir::Rx));
        assert!(!attached.take_waiter(Dir::Rx), "taken once");
        // The channel connects owner and attacher.
        rustix::io::write(&owned.chan, b"x").unwrap();
        let mut b1 = [0u8; 1];
        assert_eq!(rustix::io::read(&attached.chan, &mut b1).unwrap(), 1);
        a.unregister_dmb(owned.token);
        // Our mappings stay valid after unregister.
        assert_eq!(owned.map.prod_word().load(Ordering::Acquire), 5);
    }
}
