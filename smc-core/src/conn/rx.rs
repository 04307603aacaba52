//! The receive path (`smc_rx.c`): what is readable, where, the window-update rule after a
//! read, and urgent data (`MSG_OOB`, `SO_OOBINLINE`, `SIOCATMARK`).

use super::{Chunk, Connection, Effects, RxUrgent};
use crate::close::AbortKind;
use crate::window::{self, ConsumerView};

/// What a read would find now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvReady {
    /// This many bytes can be read without waiting.
    Data(usize),
    /// End of stream (the peer shut down or closed, or reading was shut down locally).
    Eof,
    /// Nothing yet: wait.
    Empty,
}

/// Why `recv(MSG_OOB)` returns no byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OobError {
    /// No urgent byte to return (none sent, already read, or `SO_OOBINLINE`): `EINVAL`.
    Invalid,
    /// Urgent data is announced but has not arrived: `EAGAIN`.
    WouldBlock,
}

impl Connection {
    /// Where reading continues: past the urgent byte when it is next and not inline.
    #[inline]
    fn rx_start(&self) -> u64 {
        match self.rx_urg {
            RxUrgent::Valid { mark, .. } if !self.oob_inline && self.consumed + 1 == mark => mark,
            _ => self.consumed,
        }
    }

    /// Bytes readable now. A read stops just before an urgent byte (so `SIOCATMARK` can be
    /// seen); the urgent byte itself is skipped unless `SO_OOBINLINE`.
    #[inline]
    pub fn readable(&self) -> usize {
        let start = self.rx_start();
        let avail = self.produced.saturating_sub(start);
        let n = match self.rx_urg {
            RxUrgent::Valid { mark, .. } if start + 1 < mark => avail.min(mark - 1 - start),
            _ => avail,
        };
        n as usize
    }

    /// What a read finds: data first, then end of stream or the error of an abort.
    #[inline]
    pub fn recv_ready(&self) -> Result<RecvReady, AbortKind> {
        let n = self.readable();
        if n > 0 {
            return Ok(RecvReady::Data(n));
        }
        if self.read_shut {
            return Ok(RecvReady::Eof);
        }
        if let Some(e) = self.close.error() {
            return Err(e);
        }
        if self.close.rcv_shutdown() {
            return Ok(RecvReady::Eof);
        }
        Ok(RecvReady::Empty)
    }

    /// Where the next at most `len` readable bytes are: an offset into the receive ring
    /// (wrapping at its end) and how many to copy.
    #[inline]
    pub fn recv_plan(&self, len: usize) -> Option<Chunk> {
        let n = self.readable().min(len);
        (n > 0).then(|| {
            // The consumer cursor's count is the offset of `consumed`; a skipped urgent byte
            // moves it by one.
            let mut offset = self.consumed_cur.count as usize;
            if self.rx_start() != self.consumed {
                offset += 1;
                if offset == self.cfg.rx_ring {
                    offset = 0;
                }
            }
            Chunk { offset, len: n }
        })
    }

    /// The data path's read: where the readable bytes are when there is no urgent data, they
    /// are at most `limit`, and all of them fit `len` — one copy takes them all. Then copy
    /// and call [`Connection::received`]. `None`: take the general path
    /// ([`Connection::recv_ready`], [`Connection::recv_plan`]).
    #[inline]
    pub fn recv_fast(&self, len: usize, limit: usize) -> Option<Chunk> {
        let avail = self.produced - self.consumed;
        (matches!(self.rx_urg, RxUrgent::None)
            && avail > 0
            && avail <= len as u64
            && avail <= limit as u64)
            .then_some(Chunk {
                offset: self.consumed_cur.count as usize,
                len: avail as usize,
            })
    }

    /// The driver copied `n` bytes where [`Connection::recv_plan`] said. The consumer cursor
    /// goes to the peer when the kernel's rule says so (`smc_rx_update_consumer` +
    /// `smc_tx_consumer_update`): more than `max(ring/10, 2304)` bytes unconfirmed and the
    /// peer sees at most half the ring free or said it is blocked; always when it asked, or
    /// when an urgent byte was reached or skipped.
    #[inline]
    pub fn received(&mut self, n: usize) -> Effects {
        let start = self.rx_start();
        debug_assert!(start + n as u64 <= self.produced);
        let skipped = start != self.consumed;
        let step = start - self.consumed + n as u64;
        self.consumed += step;
        self.consumed_cur = crate::cursor::advance(self.consumed_cur, step, self.cfg.rx_ring);
        // Reaching the urgent byte is reported at once: the sender waits for it.
        let at_urgent = self.at_mark();
        let view = ConsumerView {
            ring_len: self.cfg.rx_ring,
            confirmed: self.confirmed,
            consumed: self.consumed,
            produced: self.produced,
            peer_write_blocked: self.peer_pflags.write_blocked(),
            peer_requested: self.peer_pflags.cons_curs_upd_req(),
        };
        let update = window::should_update_consumer(&view, self.update_limit, skipped || at_urgent)
            && !self.close.received().abort;
        let mut eff = Effects::default();
        self.flush_cdc(&mut eff, update);
        eff
    }

    // ------------------------------------------------------------------------------------
    // Urgent data.

    /// `SO_OOBINLINE`: the urgent byte stays in the stream.
    pub fn set_oob_inline(&mut self, on: bool) {
        self.oob_inline = on;
    }

    /// Whether `SO_OOBINLINE` is set.
    pub fn oob_inline(&self) -> bool {
        self.oob_inline
    }

    /// `smc_cdc_handle_urg_data_arrival`: the last new byte is urgent.
    pub(super) fn urgent_arrived(&mut self, eff: &mut Effects) {
        let mark = self.produced;
        self.rx_urg = RxUrgent::Valid {
            mark,
            byte: 0,
            read: false,
        };
        eff.add(Effects::URGENT);
    }

    /// Urgent data was announced (`SMC_URG_NOTYET`).
    pub(super) fn urgent_announced(&mut self) {
        if !matches!(self.rx_urg, RxUrgent::Valid { read: false, .. }) {
            self.rx_urg = RxUrgent::NotYet;
        }
    }

    /// Where in the receive ring the urgent byte [`Effects::urgent`] announced is.
    pub fn urgent_offset(&self) -> Option<usize> {
        match self.rx_urg {
            RxUrgent::Valid { mark, .. } => Some(((mark - 1) % self.cfg.rx_ring as u64) as usize),
            _ => None,
        }
    }

    /// The driver copied the urgent byte out of the ring ([`Effects::urgent`]).
    pub fn set_urgent_byte(&mut self, b: u8) {
        if let RxUrgent::Valid { byte, .. } = &mut self.rx_urg {
            *byte = b;
        }
    }

    /// `recv(MSG_OOB)` (`smc_rx_recv_urg`): the urgent byte, once (unless `peek`).
    pub fn recv_oob(&mut self, peek: bool) -> Result<u8, OobError> {
        if self.oob_inline {
            return Err(OobError::Invalid);
        }
        match &mut self.rx_urg {
            RxUrgent::Valid { byte, read, .. } if !*read => {
                if !peek {
                    *read = true;
                }
                Ok(*byte)
            }
            RxUrgent::NotYet => Err(OobError::WouldBlock),
            _ => Err(OobError::Invalid),
        }
    }

    /// `SIOCATMARK`: the next byte of the stream is the urgent byte.
    pub fn at_mark(&self) -> bool {
        matches!(self.rx_urg, RxUrgent::Valid { mark, .. } if self.consumed + 1 == mark)
    }

    /// Whether urgent data is waiting to be read with `MSG_OOB` (`EPOLLPRI`).
    pub fn urgent_pending(&self) -> bool {
        !self.oob_inline && matches!(self.rx_urg, RxUrgent::Valid { read: false, .. })
    }
}
