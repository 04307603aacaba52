//! The send path (`smc_tx.c`): how much the application may hand over, where it goes, when it
//! is pushed to the peer (cork, autocork, autosplit) and how.

use super::{Chunk, Connection, Effects, RemoteWrite, TxBuffer, TxUrgent};
use crate::close::AbortKind;
use crate::window;
use core::fmt;

/// How a piece of a send call is to be treated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendFlags {
    /// `MSG_MORE`: more data follows, the piece may be held back while there is room.
    pub more: bool,
    /// `MSG_OOB`: the call sends urgent data; its last byte is the urgent byte.
    pub oob: bool,
    /// This is the last piece of the call.
    pub last: bool,
}

/// Why the application cannot send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// Writing was shut down locally, or the peer closed (`EPIPE`).
    Pipe,
    /// The peer aborted (`ECONNRESET`).
    Reset,
    /// The connection was aborted locally (`ECONNABORTED`).
    Aborted,
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pipe => "broken pipe",
            Self::Reset => "connection reset by peer",
            Self::Aborted => "connection aborted",
        })
    }
}

impl Connection {
    /// Whether the application may send now (`smc_tx_sendmsg`'s checks).
    #[inline]
    pub fn send_check(&self) -> Result<(), SendError> {
        match self.close.error() {
            Some(AbortKind::Reset) => Err(SendError::Reset),
            Some(AbortKind::Aborted) => Err(SendError::Aborted),
            None if self.write_shut || !self.close.can_send() => Err(SendError::Pipe),
            None => Ok(()),
        }
    }

    /// The transmit buffer's length: the peer's ring for no-copy, else the local send buffer.
    #[inline]
    pub fn sndbuf_len(&self) -> usize {
        match self.cfg.tx_buffer {
            TxBuffer::NoCopy => self.cfg.tx_ring,
            TxBuffer::Staged { len } => len,
        }
    }

    /// Bytes the application may hand over now (`sndbuf_space`). With no-copy the limit is the
    /// peer's ring: space comes back when the peer's consumer cursor advances. With a staged
    /// buffer it is the local buffer: space comes back when the CDC announcing the bytes
    /// completes. After urgent data nothing more is taken until the peer has read up to the
    /// urgent byte: an SMC-D CDC is a pair of words the next one overwrites, so the urgent
    /// flags stay in every CDC until then (the kernel blocks further sends the same way).
    #[inline]
    pub fn send_space(&self) -> usize {
        if self.tx_urg.pend || self.tx_urg.mark.is_some() {
            return 0;
        }
        let used = match self.cfg.tx_buffer {
            TxBuffer::NoCopy => self.prepared - self.peer_consumed,
            TxBuffer::Staged { .. } => self.prepared - self.fin,
        };
        (self.sndbuf_len() as u64).saturating_sub(used) as usize
    }

    /// Where the next at most `len` bytes of a send go: an offset into the transmit buffer
    /// (wrapping at its end) and how many bytes to copy now. The length is cut by the space,
    /// by autosplit (a piece of at least 4/3 × `autosplit_size` becomes `autosplit_size` and
    /// is pushed at once) and by `tx_chunk`. `None`: no space (or `len` is 0).
    #[inline]
    pub fn send_plan(&self, len: usize) -> Option<Chunk> {
        let space = self.send_space();
        if space == 0 || len == 0 {
            return None;
        }
        let mut n = window::autosplit_chunk(len.min(space), self.cfg.autosplit_size);
        if self.cfg.tx_chunk > 0 {
            n = n.min(self.cfg.tx_chunk);
        }
        Some(Chunk {
            offset: self.prep_off,
            len: n,
        })
    }

    /// The driver copied `n` bytes where [`Connection::send_plan`] said. A piece that is not
    /// the last of its call was cut (space, autosplit, `tx_chunk`) and is pushed at once; the
    /// last is pushed unless the socket corks it (`MSG_MORE` or `TCP_CORK` while there is
    /// room, or autocork while a CDC is in flight).
    #[inline]
    pub fn sent(&mut self, n: usize, f: SendFlags) -> Effects {
        debug_assert!(n <= self.send_space());
        self.prepared += n as u64;
        self.prep_off += n;
        let len = self.sndbuf_len();
        if self.prep_off >= len {
            self.prep_off -= len;
        }
        if f.oob {
            self.tx_urg.pending = true;
            if f.last {
                self.tx_urg.pend = true;
            }
            self.flags_dirty = true;
        }
        let mut eff = Effects::default();
        if !f.last || f.oob || !self.should_cork(f.more) {
            self.push_data(&mut eff);
        }
        self.flush_cdc(&mut eff, false);
        eff
    }

    /// [`Connection::sent`] for the data path's common case, decided in a few comparisons: a
    /// no-copy buffer without completions (SMC-D), the last piece of a plain send, nothing
    /// held back, corked, urgent or blocked, and no flag to change. The piece goes out at
    /// once and only the producer cursor of the CDC moves: `true` means publish
    /// [`Connection::cdc_out`] as a producer-only CDC ([`Effects::cdc`] without
    /// [`Effects::cdc_cons_changed`]). `false`: not that case, nothing changed; call
    /// [`Connection::sent`].
    #[inline]
    pub fn sent_fast(&mut self, n: usize, f: SendFlags) -> bool {
        if !f.last || f.more || f.oob || !self.fast_state(n) {
            return false;
        }
        self.commit_fast(n);
        true
    }

    /// The whole of a plain send of `len` bytes (no `MSG_MORE`, no `MSG_OOB`) in one step,
    /// when it fits and nothing stands in the way ([`Connection::sent_fast`]'s conditions, the
    /// send checks, no autosplit or `tx_chunk` cut): where to copy it. After copying, call
    /// [`Connection::commit_fast`] and publish [`Connection::cdc_out`] as a producer-only CDC.
    /// `None`: take the general path ([`Connection::send_plan`], [`Connection::sent`]).
    #[inline]
    pub fn send_fast(&self, len: usize) -> Option<usize> {
        let fits = len > 0
            && (self.cfg.autosplit_size == 0 || len < self.cfg.autosplit_size)
            && (self.cfg.tx_chunk == 0 || len <= self.cfg.tx_chunk);
        (fits && !self.write_shut && self.close.can_send() && self.fast_state(len))
            .then_some(self.prep_off)
    }

    /// Whether the fast path may take `n` more bytes now (see [`Connection::sent_fast`]).
    #[inline]
    fn fast_state(&self, n: usize) -> bool {
        let space = self.cfg.tx_ring as u64 - (self.sent - self.peer_consumed);
        self.fast_cfg
            && !self.cork
            && !self.flags_dirty
            && !self.write_blocked
            && self.prepared == self.sent
            && (n as u64) < space
            && self.tx_urg == TxUrgent::default()
            && self.draining.is_none()
            && !self.is_aborted()
    }

    /// The driver copied `n` bytes where [`Connection::send_fast`] said (or
    /// [`Connection::sent_fast`] accepted them): they go out with a producer-only CDC. In
    /// debug builds the state is checked against what [`Connection::sent`] leaves.
    #[inline]
    pub fn commit_fast(&mut self, n: usize) {
        debug_assert!(self.fast_state(n));
        #[cfg(debug_assertions)]
        let slow = {
            let mut c = self.clone();
            let f = SendFlags {
                last: true,
                ..SendFlags::default()
            };
            let eff = c.sent(n, f);
            (c, eff)
        };
        self.prepared += n as u64;
        self.prep_off += n;
        if self.prep_off >= self.cfg.tx_ring {
            self.prep_off -= self.cfg.tx_ring;
        }
        self.sent = self.prepared;
        self.sent_cur = crate::cursor::advance(self.sent_cur, n as u64, self.cfg.tx_ring);
        self.tx_seq = self.tx_seq.wrapping_add(1);
        self.out.seqno = self.tx_seq;
        self.out.prod = self.sent_cur;
        self.cdc_sent = self.sent;
        self.fin = self.sent;
        self.forget_answered();
        #[cfg(debug_assertions)]
        {
            let (c, eff) = slow;
            debug_assert!(*self == c, "the fast path left another state than sent()");
            debug_assert!(eff.cdc() && !eff.cdc_cons_changed() && !eff.writes());
        }
    }

    /// Where the data path's sent position is (what smcss shows as the producer cursor).
    #[inline]
    pub fn sent_position(&self) -> u64 {
        self.sent
    }

    /// `smc_tx_should_cork`.
    #[inline]
    fn should_cork(&self, more: bool) -> bool {
        let unsent = (self.prepared - self.sent) as usize;
        if self.cfg.completions
            && window::should_autocork(
                self.inflight.len() as u32,
                unsent,
                self.sndbuf_len(),
                self.cfg.autocorking_size,
            )
        {
            return true;
        }
        (more || self.cork) && self.send_space() > 0
    }

    /// The transmit buffer is full and the writer is about to wait: everything written goes
    /// out. Without completions (SMC-D) the peer is also asked for its consumer cursor
    /// (`write_blocked` and `cons_curs_upd_req`), which it answers as soon as it has read
    /// anything: there a CDC is two stores. With completions (SMC-R) this side does what
    /// the kernel's `smc_tx_sendmsg` does, which never sets `cons_curs_upd_req` and sends
    /// nothing when it blocks: the push that filled the peer's window carried
    /// `write_blocked`, and the peer's window rule (`smc_tx_consumer_update`) answers it.
    /// The request cost a CDC SEND, its ACK and a wake-up of the peer per blocked write,
    /// and made the peer answer every read, however small.
    pub fn send_blocked(&mut self) -> Effects {
        let mut eff = Effects::default();
        if self.send_check().is_ok() {
            if !self.cfg.completions {
                self.flags_dirty |= !self.upd_req;
                self.upd_req = true;
            }
            self.push_data(&mut eff);
        }
        self.flush_cdc(&mut eff, false);
        eff
    }

    /// Pushes whatever is held back (`flush`, setting `TCP_NODELAY`, clearing `TCP_CORK`).
    pub fn push(&mut self) -> Effects {
        let mut eff = Effects::default();
        self.push_data(&mut eff);
        self.flush_cdc(&mut eff, false);
        eff
    }

    /// `TCP_CORK`: while set, sends are held back while there is room; clearing it pushes.
    pub fn set_cork(&mut self, on: bool) -> Effects {
        self.cork = on;
        if on { Effects::default() } else { self.push() }
    }

    /// Whether `TCP_CORK` is set.
    pub fn cork(&self) -> bool {
        self.cork
    }

    /// Bytes handed over but not yet sent (`smc_tx_prepared_sends`).
    pub fn unsent(&self) -> usize {
        (self.prepared - self.sent) as usize
    }

    /// `smc_tx_rdma_writes`: moves prepared bytes into the peer's ring as far as its window
    /// allows. With no-copy they are there already and only the producer cursor moves; a
    /// staged buffer gets up to two RDMA WRITEs. `write_blocked` says whether this push used
    /// up the peer's window. The CDC goes out in the caller's [`Connection::flush_cdc`].
    #[inline]
    pub(super) fn push_data(&mut self, eff: &mut Effects) {
        if self.is_aborted() {
            return;
        }
        let to_send = self.prepared - self.sent;
        if to_send == 0 {
            return;
        }
        let space = self.cfg.tx_ring as u64 - (self.sent - self.peer_consumed);
        let blocked = to_send >= space;
        if blocked != self.write_blocked {
            self.write_blocked = blocked;
            self.flags_dirty = true;
        }
        let n = to_send.min(space);
        if n == 0 {
            return;
        }
        if let TxBuffer::Staged { len } = self.cfg.tx_buffer {
            self.writes = self.remote_writes(self.sent, n as usize, len);
            eff.add(Effects::WRITES);
        }
        self.sent += n;
        self.sent_cur = crate::cursor::advance(self.sent_cur, n, self.cfg.tx_ring);
    }

    /// The RDMA WRITEs for `n` bytes from absolute position `from`: one per contiguous piece
    /// of the peer's ring, each gathered from at most two pieces of the send buffer.
    fn remote_writes(&self, from: u64, n: usize, sndbuf: usize) -> [Option<RemoteWrite>; 2] {
        let ring = self.cfg.tx_ring;
        let dst0 = (from % ring as u64) as usize;
        let len0 = n.min(ring - dst0);
        let piece = |pos: u64, len: usize| {
            let s0 = (pos % sndbuf as u64) as usize;
            let l0 = len.min(sndbuf - s0);
            [(s0, l0), (0, len - l0)]
        };
        let first = RemoteWrite {
            dst: dst0,
            src: piece(from, len0),
        };
        let second = (len0 < n).then(|| RemoteWrite {
            dst: 0,
            src: piece(from + len0 as u64, n - len0),
        });
        [Some(first), second]
    }
}
