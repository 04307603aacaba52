//! One SMC connection without IO: the send path (`smc_tx.c`), the receive path (`smc_rx.c`),
//! the CDC exchange (`smc_cdc.c`) and the close state machine (`smc_close.c`), for SMC-D and
//! SMC-R alike.
//!
//! # Positions
//!
//! Every cursor is an absolute `u64` byte count:
//!
//! ```text
//!  send side:  fin ≤ sent ≤ prepared            peer_consumed ≤ sent
//!              │     │      └ the application has handed this much over (tx_curs_prep)
//!              │     └ written into the peer's ring and announced in a CDC (tx_curs_sent)
//!              └ the CDC announcing it has completed (tx_curs_fin; SMC-D: = sent)
//!  receive side: confirmed ≤ consumed ≤ produced
//!              │           │          └ the peer's producer cursor (local_rx_ctrl.prod)
//!              │           └ the application has read this much (local_tx_ctrl.cons)
//!              └ the consumer cursor last sent to the peer (rx_curs_confirmed)
//! ```
//!
//! # How a driver uses it
//!
//! * **Send**: [`Connection::send_plan`] says where in the transmit buffer the next bytes go
//!   (for SMC-D loopback "DMB no-copy" that is the peer's ring itself, for a staged buffer the
//!   local send buffer); the driver copies and calls [`Connection::sent`]. When the plan is
//!   `None` the buffer is full: [`Connection::send_blocked`], then wait for writability.
//! * **Receive**: [`Connection::recv_plan`] says where the next readable bytes are; the driver
//!   copies and calls [`Connection::received`], which runs the window-update rule.
//! * **CDC**: every CDC from the peer goes to [`Connection::on_cdc`] as host values (the
//!   kernel's `smc_host_cdc_msg`). For SMC-D the driver builds it from the two cursor words in
//!   its DMB whenever they change; for SMC-R it is a parsed 44-byte SEND.
//! * Every call returns [`Effects`], one word of bits: RDMA writes to post (staged buffers
//!   only, [`Connection::take_writes`]), the CDC to publish after them
//!   ([`Connection::cdc_out`], and whether only its producer cursor moved), the urgent byte
//!   to copy, which local waiters to wake, what to do with the TCP connection, and whether the
//!   buffers may be freed. The driver carries them out in that order.
//! * Time: [`Connection::poll_timeout`] is the next deadline (the close drain); at it, call
//!   [`Connection::handle_timeout`].

mod cdc;
mod rx;
mod tx;

pub use cdc::{HostCdc, Violation};
pub use rx::{OobError, RecvReady};
pub use tx::{SendError, SendFlags};

use crate::close::{AbortKind, CloseActions, CloseMachine, ConnFlags, SmcState};
use crate::time::Instant;
use crate::window::WndUpdateRule;
use alloc::collections::VecDeque;
use core::fmt;
use core::time::Duration;
use smc_proto::cdc::{Cursor, ProducerFlags};

/// `SMC_MAX_STREAM_WAIT_TIMEOUT`: how long a close waits for queued data to be sent.
pub const CLOSE_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the application's bytes go before the peer sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxBuffer {
    /// Straight into the peer's ring (loopback-ism "DMB no-copy": the kernel's ghost sndbuf is
    /// the peer's DMB). Send space is returned only when the peer's consumer cursor advances.
    NoCopy,
    /// Into a local send buffer of this many bytes, then RDMA WRITEs into the peer's ring
    /// (SMC-R). Send space is returned when the CDC announcing the bytes completes.
    Staged {
        /// Length of the local send buffer.
        len: usize,
    },
}

/// What a connection is made with (the kernel copies sysctls into a socket at creation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Data bytes of the local receive ring (SMC-D: the DMB minus its 32-byte header).
    pub rx_ring: usize,
    /// Data bytes of the peer's receive ring.
    pub tx_ring: usize,
    /// Where written bytes go first.
    pub tx_buffer: TxBuffer,
    /// CDC sends complete later (SMC-R work requests): sequence numbers are checked, in-flight
    /// CDCs are counted (autocork) and send space comes back on completion.
    pub completions: bool,
    /// `autocorking_size` (0: off).
    pub autocorking_size: usize,
    /// `autosplit_size` (0: off).
    pub autosplit_size: usize,
    /// Publish at least every this many bytes of a long write (0: only at the kernel's points).
    pub tx_chunk: usize,
    /// The window-update rule.
    pub wnd_rule: WndUpdateRule,
    /// How long a close waits for queued bytes to be sent (`SO_LINGER`, else 2 s).
    pub linger: Duration,
    /// Every CDC carries the current consumer cursor, as the kernel's do. Right where a CDC
    /// costs a send anyway (SMC-R); for SMC-D, whose CDC is two words in shared memory, a
    /// consumer cursor that moves with every data CDC costs the peer a cache line and a
    /// credit per message for nothing, so there it goes out when the window rule says.
    pub piggyback_consumer: bool,
}

impl Config {
    /// A connection over SMC-D "DMB no-copy" with the kernel's defaults.
    pub fn smcd(rx_ring: usize, tx_ring: usize) -> Self {
        Self {
            rx_ring,
            tx_ring,
            tx_buffer: TxBuffer::NoCopy,
            completions: false,
            autocorking_size: 64 * 1024,
            autosplit_size: 128 * 1024,
            tx_chunk: 0,
            wnd_rule: WndUpdateRule::Max,
            linger: CLOSE_DRAIN_TIMEOUT,
            piggyback_consumer: false,
        }
    }

    /// A connection over SMC-R (a staged send buffer of `sndbuf` bytes, completions).
    pub fn smcr(rx_ring: usize, tx_ring: usize, sndbuf: usize) -> Self {
        Self {
            tx_buffer: TxBuffer::Staged { len: sndbuf },
            completions: true,
            piggyback_consumer: true,
            ..Self::smcd(rx_ring, tx_ring)
        }
    }
}

/// A contiguous piece of a ring buffer: where to copy and how many bytes. The piece may run
/// past the end of the ring, where it continues at offset 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Offset in the ring.
    pub offset: usize,
    /// Bytes.
    pub len: usize,
}

/// What the TCP connection underneath must do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TcpAction {
    /// Nothing.
    #[default]
    None,
    /// Orderly shutdown in both directions.
    Shutdown,
    /// Reset (the kernel's `tcp_abort`).
    Abort,
}

/// One RDMA WRITE of the local send buffer into the peer's ring (staged buffers only). The
/// kernel posts at most two per CDC: one per contiguous piece of the peer's ring, each gathered
/// from at most two pieces of the send buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteWrite {
    /// Offset in the peer's ring.
    pub dst: usize,
    /// Pieces of the send buffer, `(offset, len)`; the second may have length 0.
    pub src: [(usize, usize); 2],
}

impl RemoteWrite {
    /// Bytes written.
    pub fn len(&self) -> usize {
        self.src[0].1 + self.src[1].1
    }

    /// Whether it writes nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the driver must do after a call, in this order: the writes, then the CDC, then the
/// urgent byte and the TCP action; wake-ups and freeing after that. One word, returned in a
/// register and tested bit by bit: what goes with an effect waits in the connection (the
/// writes in [`Connection::take_writes`], the CDC in [`Connection::cdc_out`], the urgent
/// byte's offset in [`Connection::urgent_offset`]). Effects of several calls combine with `|`.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
#[must_use = "effects must be carried out"]
pub struct Effects(u16);

impl Effects {
    const WRITES: u16 = 1;
    const CDC: u16 = 1 << 1;
    const CDC_CONS: u16 = 1 << 2;
    const WAKE_READER: u16 = 1 << 3;
    const WAKE_WRITER: u16 = 1 << 4;
    const TCP_SHUTDOWN: u16 = 1 << 5;
    const TCP_ABORT: u16 = 1 << 6;
    const FREE: u16 = 1 << 7;
    const URGENT: u16 = 1 << 8;
    const CLOSE_CHANGED: u16 = 1 << 9;

    /// Nothing to do.
    pub const NONE: Effects = Effects(0);

    /// Whether there is nothing to do.
    #[inline]
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    #[inline]
    fn has(self, bit: u16) -> bool {
        self.0 & bit != 0
    }

    #[inline]
    fn add(&mut self, bit: u16) {
        self.0 |= bit;
    }

    /// RDMA WRITEs wait to be posted before the CDC ([`Connection::take_writes`]; staged
    /// buffers only).
    #[inline]
    pub fn writes(self) -> bool {
        self.has(Self::WRITES)
    }

    /// A CDC is to be published ([`Connection::cdc_out`]; SMC-D: store its words into the
    /// peer's DMB; SMC-R: post the SEND).
    #[inline]
    pub fn cdc(self) -> bool {
        self.has(Self::CDC)
    }

    /// The CDC's consumer cursor or flags differ from those of the CDC published before it.
    /// When not, only its producer cursor moved (SMC-D stores one word).
    #[inline]
    pub fn cdc_cons_changed(self) -> bool {
        self.has(Self::CDC_CONS)
    }

    /// Nothing but wake-ups: `(reader, writer)`, or `None` if anything else is asked for (the
    /// data path's common case, carried out without the general dispatch).
    #[inline]
    pub fn only_wakes(self) -> Option<(bool, bool)> {
        (self.0 & !(Self::WAKE_READER | Self::WAKE_WRITER) == 0)
            .then_some((self.wake_reader(), self.wake_writer()))
    }

    /// Wake local threads waiting to read (data, end of stream or an error is there).
    #[inline]
    pub fn wake_reader(self) -> bool {
        self.has(Self::WAKE_READER)
    }

    /// Wake local threads waiting to write (space, or writing became impossible).
    #[inline]
    pub fn wake_writer(self) -> bool {
        self.has(Self::WAKE_WRITER)
    }

    /// What to do with the TCP connection.
    #[inline]
    pub fn tcp(self) -> TcpAction {
        if self.has(Self::TCP_ABORT) {
            TcpAction::Abort
        } else if self.has(Self::TCP_SHUTDOWN) {
            TcpAction::Shutdown
        } else {
            TcpAction::None
        }
    }

    /// The connection is closed on both sides and released: free its buffers.
    #[inline]
    pub fn free(self) -> bool {
        self.has(Self::FREE)
    }

    /// Urgent data arrived: copy the byte at [`Connection::urgent_offset`] of the receive ring
    /// into [`Connection::set_urgent_byte`] before the peer can overwrite it.
    #[inline]
    pub fn urgent(self) -> bool {
        self.has(Self::URGENT)
    }

    /// The close state or the shutdown of either direction changed (a driver shows it on its
    /// readiness; nothing else changes it).
    #[inline]
    pub fn close_changed(self) -> bool {
        self.has(Self::CLOSE_CHANGED)
    }

    fn close(&mut self, a: CloseActions) {
        self.add(Self::CLOSE_CHANGED);
        if a.abort_tcp {
            self.add(Self::TCP_ABORT);
        } else if a.shutdown_tcp {
            self.add(Self::TCP_SHUTDOWN);
        }
        if a.free {
            self.add(Self::FREE);
        }
    }

    fn wake_both(&mut self) {
        self.add(Self::WAKE_READER | Self::WAKE_WRITER | Self::CLOSE_CHANGED);
    }
}

impl core::ops::BitOr for Effects {
    type Output = Effects;
    #[inline]
    fn bitor(self, o: Effects) -> Effects {
        Effects(self.0 | o.0)
    }
}

impl core::ops::BitOrAssign for Effects {
    #[inline]
    fn bitor_assign(&mut self, o: Effects) {
        self.0 |= o.0;
    }
}

impl fmt::Debug for Effects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 10] = [
            "writes",
            "cdc",
            "cdc_cons",
            "wake_reader",
            "wake_writer",
            "tcp_shutdown",
            "tcp_abort",
            "free",
            "urgent",
            "close_changed",
        ];
        let mut l = f.debug_set();
        for (i, n) in NAMES.iter().enumerate() {
            if self.0 & (1 << i) != 0 {
                l.entry(&format_args!("{n}"));
            }
        }
        l.finish()
    }
}

/// Positions, for diagnostics (`smcss -d` cursors) and statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Positions {
    /// The peer's producer cursor.
    pub produced: u64,
    /// Bytes the application read (plus a skipped urgent byte).
    pub consumed: u64,
    /// Consumer cursor last sent.
    pub confirmed: u64,
    /// Bytes handed over by the application.
    pub prepared: u64,
    /// Bytes written into the peer's ring and announced.
    pub sent: u64,
    /// Bytes whose CDC completed.
    pub fin: u64,
    /// The peer's consumer cursor.
    pub peer_consumed: u64,
}

/// Urgent data on the receive side (`conn->urg_state`, `urg_curs`, `urg_rx_byte`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RxUrgent {
    None,
    /// The peer announced urgent data that has not arrived yet (`SMC_URG_NOTYET`).
    NotYet,
    /// The urgent byte is at `mark - 1` (`SMC_URG_VALID`); `read` once taken with `MSG_OOB`
    /// (`SMC_URG_READ`).
    Valid {
        mark: u64,
        byte: u8,
        read: bool,
    },
}

/// Urgent data on the send side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct TxUrgent {
    /// `urg_data_pending`: an urgent send is being queued.
    pending: bool,
    /// `urg_tx_pend`: its last byte (the urgent byte) is queued and not yet announced.
    pend: bool,
    /// Announced: the position just after the urgent byte, until the peer has read to it.
    mark: Option<u64>,
}

/// A shutdown or close waiting for queued bytes to be sent (`smc_close_stream_wait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Draining {
    /// When to give up (a close after its linger time; a shutdown never gives up).
    deadline: Option<Instant>,
    /// Close at the end (else: shut down writing).
    close: bool,
}

/// One connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Connection {
    cfg: Config,
    /// The configuration allows the producer-only fast path (SMC-D: no-copy, no completions,
    /// no consumer piggyback), decided once.
    fast_cfg: bool,
    // Receive side.
    produced: u64,
    consumed: u64,
    confirmed: u64,
    /// The peer's producer flags from its last CDC, as the kernel keeps them in
    /// `local_rx_ctrl.prod_flags` (a request is forgotten once answered).
    peer_pflags: ProducerFlags,
    read_shut: bool,
    /// `rmbe_update_limit` of the receive ring under the configured rule.
    update_limit: usize,
    /// The peer's connection-state flags as last seen (the close machine hears only changes).
    rx_cflags: smc_proto::cdc::ConnStateFlags,
    /// The application shut down writing or closed: nothing more is taken.
    write_shut: bool,
    oob_inline: bool,
    rx_urg: RxUrgent,
    // Send side.
    prepared: u64,
    sent: u64,
    fin: u64,
    peer_consumed: u64,
    write_blocked: bool,
    upd_req: bool,
    cork: bool,
    tx_urg: TxUrgent,
    /// CDCs sent and not completed: (sequence number, `sent` they announced).
    inflight: VecDeque<(u16, u64)>,
    /// RDMA WRITEs decided and not yet taken by the driver.
    writes: [Option<RemoteWrite>; 2],
    /// The connection-state flags our CDCs carry (what the close machine has sent).
    cflags_out: smc_proto::cdc::ConnStateFlags,
    // The wire cursors of four positions, moved with them (no division on the data path).
    sent_cur: Cursor,
    consumed_cur: Cursor,
    confirmed_cur: Cursor,
    produced_cur: Cursor,
    peer_consumed_cur: Cursor,
    /// `sent` as the last CDC announced it.
    cdc_sent: u64,
    /// Something our producer or connection-state flags depend on changed since the last CDC.
    flags_dirty: bool,
    /// `prepared` modulo the transmit buffer's length (where the next byte goes).
    prep_off: usize,
    // CDC exchange.
    tx_seq: u16,
    /// The sequence number of the last CDC whose send completed (`tx_cdc_seq_fin`).
    tx_seq_fin: u16,
    rx_seq: Option<u16>,
    /// The CDC last built: the one to publish after a call, and what the peer was told.
    out: HostCdc,
    // Close.
    close: CloseMachine,
    draining: Option<Draining>,
    /// Ended by [`Connection::abort`]: the peer broke the rules or vanished.
    aborted_locally: bool,
}

impl Connection {
    /// A connection whose handshake has just finished.
    pub fn new(cfg: Config) -> Self {
        Self {
            cfg,
            fast_cfg: !cfg.completions
                && !cfg.piggyback_consumer
                && cfg.tx_buffer == TxBuffer::NoCopy,
            produced: 0,
            consumed: 0,
            confirmed: 0,
            peer_pflags: ProducerFlags::EMPTY,
            read_shut: false,
            update_limit: crate::window::rmbe_update_limit(cfg.rx_ring, cfg.wnd_rule),
            rx_cflags: smc_proto::cdc::ConnStateFlags::EMPTY,
            write_shut: false,
            oob_inline: false,
            rx_urg: RxUrgent::None,
            prepared: 0,
            sent: 0,
            fin: 0,
            peer_consumed: 0,
            write_blocked: false,
            upd_req: false,
            cork: false,
            tx_urg: TxUrgent::default(),
            inflight: VecDeque::new(),
            writes: [None, None],
            cflags_out: smc_proto::cdc::ConnStateFlags::EMPTY,
            sent_cur: Cursor::ZERO,
            consumed_cur: Cursor::ZERO,
            confirmed_cur: Cursor::ZERO,
            produced_cur: Cursor::ZERO,
            peer_consumed_cur: Cursor::ZERO,
            cdc_sent: 0,
            flags_dirty: false,
            prep_off: 0,
            tx_seq: 0,
            tx_seq_fin: 0,
            rx_seq: None,
            out: HostCdc::default(),
            close: CloseMachine::active(),
            draining: None,
            aborted_locally: false,
        }
    }

    /// What it was made with.
    #[inline]
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Whether the state owns no heap memory: a connection without completions (SMC-D: a CDC
    /// completes when it is written), whose queue of CDCs in flight was never allocated. Such
    /// a state is plain data, which a driver may keep in memory other processes running the
    /// same program image share (processes that take turns at one connection after a fork).
    pub fn owns_no_heap(&self) -> bool {
        !self.cfg.completions && self.inflight.capacity() == 0
    }

    /// The close state.
    pub fn state(&self) -> SmcState {
        self.close.state()
    }

    /// The close machine (flags sent and received, error).
    pub fn close_machine(&self) -> &CloseMachine {
        &self.close
    }

    /// The pending error, if the connection was aborted.
    pub fn error(&self) -> Option<AbortKind> {
        self.close.error()
    }

    /// Whether the connection was aborted, by either side: nothing more is sent or taken.
    #[inline]
    pub fn is_aborted(&self) -> bool {
        self.close.error().is_some()
    }

    /// Whether this side aborted it ([`Connection::abort`], [`Connection::tcp_gone`]): the
    /// peer broke the rules or vanished, so its buffers and its link group are not to be
    /// trusted again. A peer that aborted (a close with unread data) is not that.
    pub fn aborted_locally(&self) -> bool {
        self.aborted_locally
    }

    /// Whether our receive ring is full (the peer produced a whole ring we have not read).
    #[inline]
    pub fn rx_full(&self) -> bool {
        self.produced - self.consumed == self.cfg.rx_ring as u64
    }

    /// The peer's producer position and the consumer position it last saw from us (what
    /// smcss shows as rxprod and rxcons).
    #[inline]
    pub fn rx_cursors(&self) -> (u64, u64) {
        (self.produced, self.peer_consumed)
    }

    /// The positions.
    #[inline]
    pub fn positions(&self) -> Positions {
        Positions {
            produced: self.produced,
            consumed: self.consumed,
            confirmed: self.confirmed,
            prepared: self.prepared,
            sent: self.sent,
            fin: self.fin,
            peer_consumed: self.peer_consumed,
        }
    }

    /// The CDC [`Effects::cdc`] announced; afterwards the last one this side published (the
    /// cursors and flags as the peer sees them; all zero before the first).
    #[inline]
    pub fn cdc_out(&self) -> &HostCdc {
        &self.out
    }

    /// The peer's producer flags as last received.
    pub fn peer_pflags(&self) -> ProducerFlags {
        self.peer_pflags
    }

    /// CDCs sent and not completed.
    pub fn inflight_cdcs(&self) -> usize {
        self.inflight.len()
    }

    /// The RDMA WRITEs [`Effects::writes`] announced, to post before the CDC.
    #[inline]
    pub fn take_writes(&mut self) -> [Option<RemoteWrite>; 2] {
        core::mem::take(&mut self.writes)
    }

    // ------------------------------------------------------------------------------------
    // Close (smc_close.c).

    /// `shutdown(SHUT_RD)`: reads return what is there, then end of stream.
    pub fn shutdown_read(&mut self) -> Effects {
        self.read_shut = true;
        Effects(Effects::WAKE_READER | Effects::CLOSE_CHANGED)
    }

    /// Whether the application shut down its read side.
    pub fn read_is_shut(&self) -> bool {
        self.read_shut
    }

    /// Whether the application shut down its write side (or closed).
    pub fn write_is_shut(&self) -> bool {
        self.write_shut
    }

    /// `shutdown(SHUT_WR)` (`smc_close_shutdown_write`): nothing more is taken; what is
    /// written goes out, and once it has been sent the peer is told we are done writing. With
    /// a staged buffer whose bytes wait for the peer's window that takes until they are sent:
    /// unlike a close, a shutdown loses nothing, however long the peer takes.
    pub fn shutdown_write(&mut self) -> Effects {
        let mut eff = Effects::default();
        self.write_shut = true;
        eff.add(Effects::WAKE_WRITER | Effects::CLOSE_CHANGED);
        if self.draining.is_none() {
            self.push_data(&mut eff);
            if self.prepared > self.sent {
                self.draining = Some(Draining {
                    deadline: None,
                    close: false,
                });
            } else {
                self.finish_shutdown(&mut eff);
            }
        }
        self.flush_cdc(&mut eff, false);
        eff
    }

    /// The application closes (`smc_close_active`). Everything written is pushed first; with a
    /// staged buffer whose bytes are not all sent and completed the close waits for them, at
    /// most [`Config::linger`]. Received bytes left unread make it an abort, as the kernel's
    /// `smc_close_final`.
    pub fn close(&mut self, now: Instant) -> Effects {
        let mut eff = Effects::default();
        self.write_shut = true;
        if self.close.error().is_none() && self.close.state().can_send() {
            self.push_data(&mut eff);
            if self.unfinished_sends() && !self.cfg.linger.is_zero() {
                self.draining = Some(Draining {
                    deadline: Some(now + self.cfg.linger),
                    close: true,
                });
                self.flush_cdc(&mut eff, false);
                return eff;
            }
        }
        self.finish_close(&mut eff);
        self.flush_cdc(&mut eff, false);
        eff
    }

    /// The application closes with `SO_LINGER` `{1, 0}`: nothing more is sent and the peer
    /// gets an abnormal close (`peer_conn_abort`, so its reads fail with `ECONNRESET`), as
    /// TCP's close then sends a reset instead of a FIN; the close machine goes on as for a
    /// close that discards unread data (`smc_close_final`).
    pub fn close_reset(&mut self) -> Effects {
        let mut eff = Effects::default();
        self.write_shut = true;
        self.draining = None;
        let act = self.close.app_close(true);
        eff.close(act);
        self.cflags_out = cflags_of(self.close.sent());
        self.flags_dirty = true;
        eff.wake_both();
        self.flush_cdc(&mut eff, false);
        eff
    }

    /// Whether a shutdown or close is waiting for queued bytes.
    pub fn is_draining(&self) -> bool {
        self.draining.is_some()
    }

    /// Bytes not yet sent, or (with completions) sent in CDCs that have not completed. Without
    /// completions (SMC-D) a CDC completes when it is made, so bytes pushed but not yet in a
    /// CDC are not unfinished: the CDC the caller flushes next takes them.
    fn unfinished_sends(&self) -> bool {
        self.prepared > self.sent || (self.cfg.completions && self.fin < self.sent)
    }

    /// The end of a shutdown: done-writing goes out with the caller's CDC.
    fn finish_shutdown(&mut self, eff: &mut Effects) {
        let act = self.close.app_shutdown_write();
        eff.close(act);
        self.cflags_out = cflags_of(self.close.sent());
        self.flags_dirty = true;
        eff.add(Effects::WAKE_WRITER);
    }

    /// The second half of a close: the close machine's transition; its flags go out with the
    /// caller's CDC.
    fn finish_close(&mut self, eff: &mut Effects) {
        self.draining = None;
        let unread = self.produced > self.consumed;
        let act = self.close.app_close(unread);
        eff.close(act);
        self.cflags_out = cflags_of(self.close.sent());
        self.flags_dirty = true;
        eff.wake_both();
    }

    /// Ends a drain whose bytes went out (or whose time is up when `expired`).
    fn drained_or(&mut self, eff: &mut Effects, expired: bool) {
        let Some(d) = self.draining else { return };
        let done = if d.close {
            !self.unfinished_sends()
        } else {
            self.prepared == self.sent
        };
        if !done && !expired {
            return;
        }
        self.draining = None;
        if d.close {
            self.finish_close(eff);
        } else {
            self.finish_shutdown(eff);
        }
    }

    /// A drain whose bytes went out finishes.
    #[inline]
    fn drained(&mut self, eff: &mut Effects) {
        self.drained_or(eff, false);
    }

    /// The connection is lost underneath: the peer broke the protocol, its process or link went
    /// away (`smc_close_active_abort`). Local calls fail with `kind`, the TCP connection is
    /// reset; nothing more is sent.
    pub fn abort(&mut self, kind: AbortKind) -> Effects {
        let mut eff = Effects::default();
        self.draining = None;
        self.aborted_locally = true;
        let act = self.close.local_abort(kind);
        eff.close(act);
        eff.wake_both();
        eff
    }

    /// The TCP connection ended (EOF or reset). A peer that closed wrote its close flags first;
    /// if they are here this is the orderly end, otherwise the peer vanished. Once this side
    /// sent its close it shut the TCP connection down itself (`smc_close_active` does, so the
    /// peer does not enter TIME_WAIT), and what the socket shows then says nothing about the
    /// peer: an active closer waiting for the peer's close is not aborted by its own shutdown.
    pub fn tcp_gone(&mut self) -> Effects {
        if self.close.received().any_close()
            || self.close.error().is_some()
            || self.close.sent().any_close()
        {
            return Effects::default();
        }
        self.abort(AbortKind::Reset)
    }

    // ------------------------------------------------------------------------------------
    // Timers.

    /// The next deadline, if any: when it passes, call [`Connection::handle_timeout`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.draining.and_then(|d| d.deadline)
    }

    /// Time passed: a drain whose deadline passed ends now (what was not sent is lost, as in
    /// the kernel).
    pub fn handle_timeout(&mut self, now: Instant) -> Effects {
        let mut eff = Effects::default();
        if self
            .draining
            .is_some_and(|d| d.deadline.is_some_and(|t| now >= t))
        {
            self.drained_or(&mut eff, true);
            self.flush_cdc(&mut eff, false);
        }
        eff
    }
}

/// The connection-state flags a [`ConnFlags`] value stands for on the wire.
pub fn cflags_of(f: ConnFlags) -> smc_proto::cdc::ConnStateFlags {
    use smc_proto::cdc::ConnStateFlags;
    let mut c = ConnStateFlags::EMPTY;
    c.set(ConnStateFlags::PEER_DONE_WRITING, f.done_writing);
    c.set(ConnStateFlags::PEER_CONN_CLOSED, f.closed);
    c.set(ConnStateFlags::PEER_CONN_ABORT, f.abort);
    c
}

/// The [`ConnFlags`] a received connection-state byte carries.
pub fn conn_flags(c: smc_proto::cdc::ConnStateFlags) -> ConnFlags {
    ConnFlags {
        done_writing: c.peer_done_writing(),
        closed: c.peer_conn_closed(),
        abort: c.peer_conn_abort(),
    }
}
