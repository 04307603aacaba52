//! The receive path (`smc_rx.c`): copy out of the local ring as the core says, wait when
//! there is nothing, and urgent data.

use super::{SmcConn, Woken, aborted_error};
use crate::device::Dir;
use crate::transport::{Transport, Waiter};
use smc_core::conn::{OobError, RecvReady};
use std::io;
use std::sync::atomic::Ordering;

/// Smallest piece a long read copies before the window rule runs again.
const RX_CHUNK_MIN: usize = 8 * 1024;

impl<T: Transport> SmcConn<T> {
    /// Reads into `buf`; 0 at end of stream.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_opts(buf, false, false)
    }

    /// [`SmcConn::read`] with `recv(2)`'s `MSG_PEEK` (the bytes stay where they are, and the
    /// peer sees no window update) and `MSG_DONTWAIT`.
    pub fn read_opts(&self, buf: &mut [u8], peek: bool, dontwait: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let deadline = self.deadline(&self.read_timeout);
        let nonblocking = dontwait || self.nonblocking.load(Ordering::Relaxed);
        let answer_due = T::SPINS_IN_SLEEP && self.answer_due.load(Ordering::Relaxed);
        loop {
            let got = if peek {
                self.try_peek(buf)?
            } else {
                self.try_read(buf)?
            };
            match got {
                Some(n) => {
                    if !peek {
                        if answer_due && n > 0 {
                            // The answer came: more reads are a stream's until the next send.
                            self.answer_due.store(false, Ordering::Relaxed);
                        }
                        self.slot.rx(buf.len(), n);
                        if n > 0
                            && self.level.load(Ordering::Relaxed)
                            && self.link.readiness().is_some()
                        {
                            if self.deferred.load(Ordering::Relaxed) {
                                // Deferred: noted only (no lock, no system call); the settle
                                // looks at the ring itself.
                                self.rx_dirty.store(true, Ordering::Release);
                            } else if !self.local_change(Dir::Rx) {
                                // The ring is empty now: not readable until the next CDC.
                                self.rearm_readiness(Dir::Rx);
                            }
                        }
                    }
                    return Ok(n);
                }
                None if nonblocking => return self.would_block(Dir::Rx),
                None => match self.wait(Dir::Rx, deadline) {
                    Woken::TimedOut => return Err(io::ErrorKind::WouldBlock.into()),
                    Woken::Interrupted => return Err(io::ErrorKind::Interrupted.into()),
                    Woken::Again => {}
                },
            }
        }
    }

    /// One attempt: `Some(n)` (data or, as 0, the end of stream), an error, or `None` when
    /// a read would wait.
    fn try_read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let mut st = self.lock();
        self.observe(&mut st)?;
        let chunk = (st.core.config().rx_ring / T::RX_PIECES).max(RX_CHUNK_MIN);
        if let Some(plan) = st.core.recv_fast(buf.len(), chunk) {
            // Everything readable fits: one copy, and the window rule once.
            debug_assert_eq!(st.core.recv_plan(plan.len), Some(plan));
            self.link.read_rx(plan.offset, &mut buf[..plan.len]);
            let eff = st.core.received(plan.len);
            self.apply(&mut st, eff);
            return Ok(Some(plan.len));
        }
        match st.core.recv_ready() {
            Ok(RecvReady::Data(_)) => {}
            Ok(RecvReady::Eof) => return Ok(Some(0)),
            Ok(RecvReady::Empty) => return Ok(None),
            Err(kind) => return Err(aborted_error(kind)),
        }
        // Copy out in pieces and let the window rule run after each, so a writer waiting for
        // space refills the ring while we copy the rest (the kernel runs it once per loop).
        let mut done = 0;
        while done < buf.len() {
            let Some(plan) = st.core.recv_plan((buf.len() - done).min(chunk)) else {
                break;
            };
            self.link
                .read_rx(plan.offset, &mut buf[done..done + plan.len]);
            done += plan.len;
            let eff = st.core.received(plan.len);
            self.apply(&mut st, eff);
        }
        Ok(Some(done))
    }

    /// One look without taking anything: `Some(n)` bytes copied (0 at the end of stream).
    fn try_peek(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let mut st = self.lock();
        self.observe(&mut st)?;
        match st.core.recv_ready() {
            Ok(RecvReady::Data(_)) => {}
            Ok(RecvReady::Eof) => return Ok(Some(0)),
            Ok(RecvReady::Empty) => return Ok(None),
            Err(kind) => return Err(aborted_error(kind)),
        }
        let Some(plan) = st.core.recv_plan(buf.len()) else {
            return Ok(None);
        };
        self.link.read_rx(plan.offset, &mut buf[..plan.len]);
        Ok(Some(plan.len))
    }

    /// A non-blocking call found nothing to do. If an event loop may wait on the readiness:
    /// clear it for `dir`, announce the wait, and look once more; if something arrived
    /// meanwhile the readiness is set again so that it never says "nothing" while there is
    /// something. If the TCP connection ended (and nothing watches it) the connection ends
    /// here.
    pub(super) fn would_block<R>(&self, dir: Dir) -> io::Result<R> {
        if self.rearm_readiness(dir) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        if !self.watched() && self.clcsock_dead() {
            self.tcp_gone();
        }
        Err(io::ErrorKind::WouldBlock.into())
    }

    /// Clears the readiness for `dir`, announces an event loop's wait, and looks once more;
    /// `true` when something arrived meanwhile (the readiness was set again).
    pub(super) fn rearm_readiness(&self, dir: Dir) -> bool {
        let Some(ready) = self.link.readiness() else {
            return false;
        };
        if dir == Dir::Rx {
            self.rx_dirty.store(false, Ordering::Release);
        }
        self.clear_and_announce(ready, dir);
        if self.link.cdc_pending() || self.local_change(dir) {
            // The state moved between our look and the announcement: ring ourselves.
            self.link.wake_local(dir);
            return true;
        }
        false
    }

    /// Makes `ready` not ready for `dir` and announces an event loop's wait for it; the
    /// caller looks again after.
    pub(super) fn clear_and_announce(&self, ready: &crate::transport::Readiness, dir: Dir) {
        if dir == Dir::Rx && self.withdrawn.swap(false, Ordering::AcqRel) {
            // Taken back before anyone rang it (`withdraw_readiness`): nothing to drain.
            self.link.arm(dir, Waiter::Event);
            return;
        }
        if dir == Dir::Rx && self.link.rx_tagged() {
            // A tagged sleep is under way (`tag_readiness`): a byte here may be the one ring
            // of the sleep, for which the peer skipped the others; drained now (a thread
            // reading this connection until EAGAIN while the sleeper has not yet run) it would
            // leave the sleeper asleep. It stays until the settle after the untag; meanwhile
            // the descriptor may say readable over an empty ring, as after a late bell.
            self.link.arm(dir, Waiter::Event);
            return;
        }
        // A ring for an earlier announcement still under way would land after the clear.
        self.link.await_rings(dir);
        match dir {
            Dir::Rx => ready.clear_readable(),
            Dir::Tx => ready.clear_writable(),
        }
        self.link.arm(dir, Waiter::Event);
    }

    /// Bytes readable right now without waiting.
    pub fn available(&self) -> io::Result<usize> {
        let mut st = self.lock();
        self.observe(&mut st)?;
        Ok(st.core.readable())
    }

    /// Bytes a send takes now without waiting (0 also when sending is over).
    pub fn send_space(&self) -> io::Result<usize> {
        let mut st = self.lock();
        self.observe(&mut st)?;
        Ok(if st.core.send_check().is_ok() {
            st.core.send_space()
        } else {
            0
        })
    }

    /// `recv(MSG_OOB)`: the urgent byte, once (unless `peek`).
    pub fn recv_oob(&self, peek: bool) -> io::Result<u8> {
        let mut st = self.lock();
        self.observe(&mut st)?;
        match st.core.recv_oob(peek) {
            Ok(b) => Ok(b),
            Err(OobError::WouldBlock) => Err(io::ErrorKind::WouldBlock.into()),
            Err(OobError::Invalid) => Err(io::ErrorKind::InvalidInput.into()),
        }
    }

    /// `SIOCATMARK`: whether the next byte to read is the urgent byte.
    pub fn at_mark(&self) -> io::Result<bool> {
        let mut st = self.lock();
        self.observe(&mut st)?;
        Ok(st.core.at_mark())
    }

    /// `SO_OOBINLINE`.
    pub fn set_oob_inline(&self, on: bool) {
        self.lock().core.set_oob_inline(on);
    }
}
