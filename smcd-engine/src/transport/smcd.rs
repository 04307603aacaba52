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
//! Everything read from the local DMB is the peer's to write: the words go to the connection
//! core as a [`HostCdc`] and are validated there.

use super::{Bell, Readiness, Transport};
use crate::device::{Dir, Dmb};
use smc_core::conn::{HostCdc, RemoteWrite};
use smc_proto::cdc::{ConnStateFlags, ProducerFlags, SmcdCursorWord};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
    ready: Readiness,
    peer_bell: Bell,
    /// The words of our DMB last handed to the connection.
    seen_prod: AtomicU64,
    seen_cons: AtomicU64,
    /// The words last stored into the peer's DMB.
    out_prod: AtomicU64,
    out_cons: AtomicU64,
    /// The peer's readiness already shows that we are done writing.
    told_done: std::sync::atomic::AtomicBool,
}

impl SmcdLink {
    /// A link over `own` (reset for this connection) and the peer's `peer`, with this
    /// connection's readiness and the peer's bell.
    pub fn new(own: Arc<Dmb>, peer: Arc<Dmb>, ready: Readiness, peer_bell: Bell) -> Self {
        Self {
            own,
            peer,
            ready,
            peer_bell,
            seen_prod: AtomicU64::new(0),
            seen_cons: AtomicU64::new(0),
            out_prod: AtomicU64::new(0),
            out_cons: AtomicU64::new(0),
            told_done: std::sync::atomic::AtomicBool::new(false),
        }
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
        if self.peer.take_waiter(dir) {
            self.peer_bell.ring(dir);
        }
    }
}

impl Transport for SmcdLink {
    fn write_tx(&self, offset: usize, data: &[u8]) {
        self.peer.map.write_ring(offset, data);
    }

    fn read_rx(&self, offset: usize, out: &mut [u8]) {
        self.own.map.read_ring(offset, out);
    }

    fn write_remote(&self, _w: &RemoteWrite) -> io::Result<()> {
        // No-copy: the bytes are in the peer's ring already; the core never asks.
        Ok(())
    }

    fn send_cdc(&self, cdc: &HostCdc, cons_changed: bool) -> io::Result<()> {
        let pw = SmcdCursorWord::encode(cdc.prod, ProducerFlags::EMPTY, ConnStateFlags::EMPTY);
        if !cons_changed {
            // The data path: one word, and the reader woken if it sleeps.
            if pw != self.out_prod.load(Ordering::Relaxed) {
                self.out_prod.store(pw, Ordering::Relaxed);
                // Release: the bytes copied into the ring become visible with the cursor.
                self.peer.map.prod_word().store(pw, Ordering::Release);
                if self.peer.take_waiters(true, false).0 {
                    self.peer_bell.ring(Dir::Rx);
                }
            }
            return Ok(());
        }
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
        if rx {
            self.peer_bell.ring(Dir::Rx);
        }
        if tx {
            self.peer_bell.ring(Dir::Tx);
        }
        if flags_changed && !cdc.cflags.is_empty() && !self.told_done.swap(true, Ordering::Relaxed)
        {
            // We are done writing (done-writing, close or abort): the peer's descriptor shows
            // the end of stream at once, as a FIN would, even if nobody there calls in.
            self.peer_bell.shut_write();
        }
        Ok(())
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

    fn arm(&self, dir: Dir) {
        self.own.arm(dir);
    }

    fn wake_local(&self, dir: Dir) {
        // Called under the connection's lock after a change of its state; a waiter announces
        // itself before it takes the lock to look, so the lock orders the two and no fence is
        // needed here (unlike a publication into shared memory, `ring_peer`).
        if self.own.is_armed(dir) && self.own.take_waiter_local(dir) {
            self.ready.bell().ring(dir);
        }
    }

    fn readiness(&self) -> &Readiness {
        &self.ready
    }
}
