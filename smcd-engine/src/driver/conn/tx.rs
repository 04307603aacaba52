//! The send path (`smc_tx.c`): copy into the transmit buffer as the core says, push, and wait
//! for space.

use super::{SmcConn, State, Woken};
use crate::device::Dir;
use crate::layout::status::RmbEvent;
use crate::transport::Transport;
use smc_core::conn::{SendError, SendFlags};
use std::io;
use std::sync::atomic::Ordering;

fn send_error(e: SendError) -> io::Error {
    io::Error::from(match e {
        SendError::Pipe => io::ErrorKind::BrokenPipe,
        SendError::Reset => io::ErrorKind::ConnectionReset,
        SendError::Aborted => io::ErrorKind::ConnectionAborted,
    })
}

impl<T: Transport> SmcConn<T> {
    /// Writes all of `buf` (blocking) or as much as fits (non-blocking). `more` is
    /// `MSG_MORE`, `oob` is `MSG_OOB` (the last byte is urgent).
    pub fn write_with(&self, buf: &[u8], more: bool, oob: bool) -> io::Result<usize> {
        self.write_opts(buf, more, oob, false)
    }

    /// [`SmcConn::write_with`], and `dontwait` is `MSG_DONTWAIT` (this call does not wait even
    /// on a blocking connection).
    pub fn write_opts(
        &self,
        buf: &[u8],
        more: bool,
        oob: bool,
        dontwait: bool,
    ) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if T::SPINS_IN_SLEEP && !self.answer_due.load(Ordering::Relaxed) {
            self.answer_due.store(true, Ordering::Relaxed);
        }
        let deadline = self.deadline(&self.write_timeout);
        let nonblocking = dontwait || self.nonblocking.load(Ordering::Relaxed);
        let mut written = 0;
        let mut counted_small = false;
        loop {
            let mut st = self.lock();
            self.observe(&mut st)?;
            if written == 0
                && !more
                && !oob
                && let Some(offset) = st.core.send_fast(buf.len())
            {
                // The whole send fits and nothing stands in the way: one copy, one word.
                self.link.write_tx(offset, buf);
                st.core.commit_fast(buf.len());
                let r = self.publish_prod(&mut st);
                drop(st);
                let n = if r.is_ok() { buf.len() } else { 0 };
                return self.finish_write(buf.len(), n, r);
            }
            if let Err(e) = st.core.send_check() {
                drop(st);
                return self.finish_write(buf.len(), written, Err(send_error(e)));
            }
            if !counted_small && buf.len() > st.core.sndbuf_len() {
                // SMC_STAT_RMB_TX_SIZE_SMALL: the send is larger than the send buffer.
                self.slot.rmb_event(RmbEvent::TxSizeSmall);
                counted_small = true;
            }
            while written < buf.len() {
                let Some(plan) = st.core.send_plan(buf.len() - written) else {
                    break;
                };
                self.link
                    .write_tx(plan.offset, &buf[written..written + plan.len]);
                written += plan.len;
                let f = SendFlags {
                    more,
                    oob,
                    last: written == buf.len(),
                };
                if st.core.sent_fast(plan.len, f) {
                    if let Err(e) = self.publish_prod(&mut st) {
                        drop(st);
                        return self.finish_write(buf.len(), written, Err(e));
                    }
                    continue;
                }
                let eff = st.core.sent(plan.len, f);
                self.apply(&mut st, eff);
            }
            if written == buf.len() {
                let p = st.core.positions();
                if p.prepared != p.sent {
                    self.slot
                        .set_cursors(&[(crate::layout::status::Curs::TxPrep, p.prepared)]);
                }
                drop(st);
                return self.finish_write(buf.len(), written, Ok(()));
            }
            // The buffer is full: everything written goes out, and the peer is asked for an
            // update (it answers as soon as it has read anything).
            let eff = st.core.send_blocked();
            self.apply(&mut st, eff);
            st.tx_full = st.tx_full.wrapping_add(1);
            self.slot.rmb_event(RmbEvent::TxFull);
            drop(st);
            if nonblocking {
                if written > 0 {
                    if self.level.load(Ordering::Relaxed) {
                        // Full: not writable until the peer makes room.
                        self.rearm_readiness(Dir::Tx);
                    }
                    return self.finish_write(buf.len(), written, Ok(()));
                }
                return self.would_block(Dir::Tx);
            }
            match self.wait(Dir::Tx, deadline) {
                Woken::TimedOut => {
                    let r = Err(io::ErrorKind::WouldBlock.into());
                    return self.finish_write(buf.len(), written, r);
                }
                Woken::Interrupted => {
                    let r = Err(io::ErrorKind::Interrupted.into());
                    return self.finish_write(buf.len(), written, r);
                }
                Woken::Again => {}
            }
        }
    }

    /// After a fast-path send ([`smc_core::conn::Connection::commit_fast`]): the CDC in which
    /// only the producer cursor moved goes to the peer (SMC-D: one word) and smcss's txprod
    /// follows. A failed link aborts the connection; the error is the caller's to return.
    fn publish_prod(&self, st: &mut State) -> io::Result<()> {
        if let Err(e) = self.link.send_cdc(st.core.cdc_out(), false) {
            self.link_failed(st, "CDC send", &e);
            return Err(e);
        }
        self.slot
            .set_cursor(crate::layout::status::Curs::TxProd, st.core.sent_position());
        Ok(())
    }

    /// Counts a send and turns a late error into the partial count, as `sendmsg` does.
    fn finish_write(
        &self,
        requested: usize,
        written: usize,
        r: io::Result<()>,
    ) -> io::Result<usize> {
        self.slot.tx(requested, written);
        match r {
            Err(e) if written == 0 => Err(e),
            _ => Ok(written),
        }
    }

    /// Pushes anything written but held back by cork.
    pub fn flush(&self) -> io::Result<()> {
        let mut st = self.lock();
        self.observe(&mut st)?;
        let eff = st.core.push();
        self.apply(&mut st, eff);
        Ok(())
    }
}
