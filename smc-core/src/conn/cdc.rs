//! The CDC exchange (`smc_cdc.c`): what a received CDC changes, and the one CDC a call sends.

use super::{Connection, Effects, TxUrgent, conn_flags};
use crate::cursor::{CursorError, from_cursor_at};
use core::fmt;
use smc_proto::cdc::{ConnStateFlags, Cursor, ProducerFlags, seqno_before};

/// A CDC as host values (the kernel's `smc_host_cdc_msg`).
///
/// `prod` is the sender's producer cursor over the *receiver's* ring; `cons` is the sender's
/// consumer cursor over its *own* ring. SMC-D carries no sequence number (0 here); SMC-R's is
/// checked when the connection has [`super::Config::completions`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostCdc {
    /// Sequence number (SMC-R).
    pub seqno: u16,
    /// Producer cursor.
    pub prod: Cursor,
    /// Consumer cursor.
    pub cons: Cursor,
    /// Producer flags.
    pub pflags: ProducerFlags,
    /// Connection-state flags.
    pub cflags: ConnStateFlags,
}

/// A CDC that breaks the rules: the connection must be aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// The producer cursor is outside the ring or moved further than the window allows.
    ProducerCursor(CursorError),
    /// The consumer cursor is outside the ring or confirms bytes never sent.
    ConsumerCursor(CursorError),
    /// A failover-validation CDC names a sequence number this side never received: the two
    /// ends disagree about what arrived (`smc_cdc_msg_validate`'s `out_of_sync`).
    OutOfSync {
        /// The last sequence number received here.
        last: u16,
        /// The one the peer says completed.
        validated: u16,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ProducerCursor(e) => write!(f, "producer cursor: {e}"),
            Self::ConsumerCursor(e) => write!(f, "consumer cursor: {e}"),
            Self::OutOfSync { last, validated } => write!(
                f,
                "failover validation names CDC {validated}, the last received is {last}"
            ),
        }
    }
}

impl core::error::Error for Violation {}

impl Connection {
    /// A CDC arrived (`smc_cdc_msg_recv_action`): credit the peer's consumed bytes to our send
    /// window, take its produced bytes, note urgent data, feed its close flags to the close
    /// machine, and answer a blocked writer or an explicit request with our consumer cursor.
    ///
    /// Everything is validated before anything changes: a cursor outside the ring, moving
    /// backwards, confirming bytes we never sent or producing more than our ring holds is a
    /// [`Violation`] and leaves the connection as it was (the driver then aborts it). An SMC-R
    /// CDC older than the last one is ignored, as the kernel does.
    #[inline]
    pub fn on_cdc(&mut self, c: &HostCdc) -> Result<Effects, Violation> {
        if self.is_aborted() {
            return Ok(Effects::default());
        }
        if self.cfg.completions && c.pflags.failover_validation() {
            return self.validate(c.seqno);
        }
        if self.cfg.completions && self.rx_seq.is_some_and(|last| seqno_before(c.seqno, last)) {
            return Ok(Effects::default());
        }
        if self.only_new_data(c) {
            return self.on_new_data(c.prod);
        }
        self.on_cdc_slow(c)
    }

    /// The data path's CDC: only the producer cursor moved, no flag is or was set on either
    /// side, nothing of ours waits to go out and no drain runs. Then all [`Connection::on_cdc`]
    /// does is take the new bytes.
    #[inline]
    fn only_new_data(&self, c: &HostCdc) -> bool {
        !self.cfg.completions
            && c.cons == self.peer_consumed_cur
            && c.pflags.is_empty()
            && self.peer_pflags.is_empty()
            && c.cflags == self.rx_cflags
            && self.sent == self.cdc_sent
            && !self.flags_dirty
            && self.draining.is_none()
    }

    /// [`Connection::on_cdc`] for [`Connection::only_new_data`]; in debug builds checked
    /// against the general path.
    #[inline]
    fn on_new_data(&mut self, prod: Cursor) -> Result<Effects, Violation> {
        #[cfg(debug_assertions)]
        let slow = {
            let mut c = self.clone();
            let cdc = HostCdc {
                prod,
                cons: self.peer_consumed_cur,
                cflags: self.rx_cflags,
                ..HostCdc::default()
            };
            let eff = c.on_cdc_slow(&cdc);
            (c, eff)
        };
        let rx_ring = self.cfg.rx_ring;
        let r = from_cursor_at(
            prod,
            rx_ring,
            self.produced,
            self.produced_cur,
            self.consumed + rx_ring as u64,
        )
        .map_err(Violation::ProducerCursor)
        .map(|produced| {
            let mut eff = Effects::default();
            if produced > self.produced {
                self.produced = produced;
                self.produced_cur = prod;
                eff.add(Effects::WAKE_READER);
            }
            eff
        });
        #[cfg(debug_assertions)]
        {
            let (c, eff) = slow;
            debug_assert!(
                r == eff && (r.is_err() || *self == c),
                "the fast path left another state than on_cdc()"
            );
        }
        r
    }

    fn on_cdc_slow(&mut self, c: &HostCdc) -> Result<Effects, Violation> {
        let mut eff = Effects::default();
        let rx_ring = self.cfg.rx_ring;
        let peer_consumed = from_cursor_at(
            c.cons,
            self.cfg.tx_ring,
            self.peer_consumed,
            self.peer_consumed_cur,
            self.sent,
        )
        .map_err(Violation::ConsumerCursor)?;
        let produced = from_cursor_at(
            c.prod,
            rx_ring,
            self.produced,
            self.produced_cur,
            self.consumed + rx_ring as u64,
        )
        .map_err(Violation::ProducerCursor)?;
        if self.cfg.completions {
            self.rx_seq = Some(c.seqno);
        }

        let space_freed = peer_consumed > self.peer_consumed;
        let new_data = produced > self.produced;
        if space_freed {
            self.peer_consumed = peer_consumed;
            self.peer_consumed_cur = c.cons;
            // Our request for an update has been answered.
            if self.upd_req {
                self.upd_req = false;
                self.flags_dirty = true;
            }
            eff.add(Effects::WAKE_WRITER);
            // The peer has read up to our urgent byte: its flags may go.
            if self.tx_urg.mark.is_some_and(|m| peer_consumed + 1 >= m) {
                self.tx_urg = Default::default();
                self.flags_dirty = true;
            }
        }
        if new_data {
            self.produced = produced;
            self.produced_cur = c.prod;
            eff.add(Effects::WAKE_READER);
        }
        self.peer_pflags = c.pflags;
        if c.pflags.urg_data_present() {
            // The flag stays in the peer's CDCs until we read to the mark; only new data
            // carries a new urgent byte.
            if new_data {
                self.urgent_arrived(&mut eff);
            }
        } else if c.pflags.urg_data_pending() {
            self.urgent_announced();
        }

        if c.cflags != self.rx_cflags {
            self.rx_cflags = c.cflags;
            let before = self.close.received();
            let act = self.close.peer_flags(conn_flags(c.cflags));
            eff.close(act);
            if self.close.received() != before {
                // End of stream, a close or an abort must reach a sleeping reader and writer.
                eff.wake_both();
            }
        }

        // Space in the peer's ring lets queued bytes go (a staged buffer holds them).
        if space_freed && self.prepared > self.sent {
            self.push_data(&mut eff);
        }
        self.drained(&mut eff);
        // smc_cdc_msg_recv_action: a request or pending urgent data makes the consumer
        // cursor go out now, but only if there is something to confirm. SMC-D also answers
        // a blocked writer at once (its CDC is two stores); with completions (SMC-R) a blocked
        // writer is answered by the window rule when the reader reads, as in the kernel, where
        // `write_blocked` enters only `smc_tx_consumer_update`.
        let answer = ((c.pflags.write_blocked() && !self.cfg.completions)
            || c.pflags.cons_curs_upd_req()
            || c.pflags.urg_data_pending())
            && self.consumed > self.confirmed
            && !self.close.received().abort;
        self.flush_cdc(&mut eff, answer);
        Ok(eff)
    }

    /// A CDC that carries our real consumer cursor answers the peer's request, and a blocked
    /// peer whose bytes we have all read is not blocked by us any more
    /// (`smc_tx_consumer_update`).
    #[inline]
    pub(super) fn forget_answered(&mut self) {
        if self.confirmed == self.consumed {
            self.peer_pflags
                .set(ProducerFlags::CONS_CURS_UPD_REQ, false);
            if self.produced == self.consumed {
                self.peer_pflags.set(ProducerFlags::WRITE_BLOCKED, false);
            }
        }
    }

    /// A CDC this side sent has completed (SMC-R: its work request; completions arrive in
    /// order). The bytes it announced no longer occupy the send buffer (`smc_cdc_tx_handler`),
    /// and bytes held back by autocork go now.
    pub fn on_cdc_complete(&mut self, seqno: u16) -> Effects {
        let mut eff = Effects::default();
        let mut any = false;
        while let Some(&(s, sent)) = self.inflight.front() {
            if seqno_before(seqno, s) {
                break;
            }
            self.inflight.pop_front();
            self.fin = sent;
            self.tx_seq_fin = s;
            any = true;
        }
        if !any || self.is_aborted() {
            return eff;
        }
        eff.add(Effects::WAKE_WRITER);
        if self.prepared > self.sent {
            self.push_data(&mut eff);
        }
        self.drained(&mut eff);
        self.flush_cdc(&mut eff, false);
        eff
    }

    /// The peer moved the connection to another link and names the last CDC of its own
    /// that completed (`smc_cdc_msg_validate`). Having received it, this side ignores the
    /// message (the peer now rewrites what followed, which the cursors of its next CDC
    /// announce again); a sequence number never received means the two sides disagree about
    /// the stream, and the connection must be aborted.
    fn validate(&self, seqno: u16) -> Result<Effects, Violation> {
        let last = self.rx_seq.unwrap_or(0);
        if seqno_before(last, seqno) {
            return Err(Violation::OutOfSync {
                last,
                validated: seqno,
            });
        }
        Ok(Effects::default())
    }

    /// The connection moved to another link of its link group because its link went down
    /// (`smc_switch_conns` → `smc_switch_cursor`). What was sent on the old link and not
    /// confirmed by a completion may never have arrived, so the send side goes back to the
    /// last completed CDC (or further, to what the peer has already consumed), the CDCs in
    /// flight are forgotten (their completions will not come), and the bytes from there on
    /// are written again. Rewriting is harmless: the peer reads only up to the producer
    /// cursor of a CDC it received, and the bytes at each position are the same.
    ///
    /// Returns the failover-validation CDC to send first on the new link (the sequence
    /// number of the last completed CDC, flag `failover_validation`, no cursors), and the
    /// effects to carry out after it: the RDMA WRITEs of the rewritten bytes and a CDC with
    /// the current cursors and flags, which goes out even when nothing is rewritten (the
    /// last consumer cursor or close flags sent may have been lost with the link).
    pub fn failover(&mut self) -> (HostCdc, Effects) {
        let mut pflags = ProducerFlags::EMPTY;
        pflags.set(ProducerFlags::FAILOVER_VALIDATION, true);
        let validation = HostCdc {
            seqno: self.tx_seq_fin,
            pflags,
            ..HostCdc::default()
        };
        let mut eff = Effects::default();
        if self.is_aborted() || !self.cfg.completions {
            return (validation, eff);
        }
        self.inflight.clear();
        let base = self.fin.max(self.peer_consumed);
        self.fin = base;
        self.sent = base;
        self.sent_cur = crate::cursor::to_cursor(base, self.cfg.tx_ring);
        self.cdc_sent = base;
        self.writes = [None, None];
        self.push_data(&mut eff);
        // Whatever our flags are now, the peer hears them again.
        let pflags = self.own_pflags();
        let confirm = self.consumed != self.confirmed;
        self.emit_cdc(&mut eff, confirm, pflags, self.cflags_out);
        eff.add(Effects::CDC_CONS | Effects::WAKE_WRITER);
        (validation, eff)
    }

    /// Our producer flags as the next CDC carries them.
    fn own_pflags(&self) -> ProducerFlags {
        let mut p = ProducerFlags::EMPTY;
        p.set(ProducerFlags::WRITE_BLOCKED, self.write_blocked);
        p.set(ProducerFlags::CONS_CURS_UPD_REQ, self.upd_req);
        let present =
            self.tx_urg.mark.is_some() || (self.tx_urg.pend && self.sent == self.prepared);
        p.set(ProducerFlags::URG_DATA_PENDING, self.tx_urg.pending);
        p.set(ProducerFlags::URG_DATA_PRESENT, present);
        p
    }

    /// The end of every call that may send: one CDC goes out if it would tell the peer
    /// anything new (data, flags), or if the consumer cursor is to be reported
    /// (`cons_update`). With [`super::Config::piggyback_consumer`] any CDC carries the current
    /// consumer cursor, as the kernel's does, and so confirms every byte read so far; without
    /// it a CDC repeats the last confirmed one unless the rule asked for an update. Deciding
    /// costs a few comparisons: the cursors are kept next to the positions.
    #[inline]
    pub(super) fn flush_cdc(&mut self, eff: &mut Effects, cons_update: bool) {
        // The common case, decided with three comparisons: nothing new for the peer.
        if !cons_update && self.sent == self.cdc_sent && !self.flags_dirty {
            return;
        }
        self.flush_cdc_slow(eff, cons_update);
    }

    fn flush_cdc_slow(&mut self, eff: &mut Effects, cons_update: bool) {
        debug_assert!(
            !eff.cdc() || !self.cfg.completions,
            "one call builds at most one SMC-R CDC"
        );
        if self.is_aborted() {
            self.flags_dirty = false;
            return;
        }
        let confirm =
            (cons_update || self.cfg.piggyback_consumer) && self.consumed != self.confirmed;
        // Nothing our flags depend on changed: only cursors move (the data path).
        let (pflags, cflags) = if self.flags_dirty || self.tx_urg != TxUrgent::default() {
            (self.own_pflags(), self.cflags_out)
        } else {
            (self.out.pflags, self.out.cflags)
        };
        self.flags_dirty = false;
        let flags_changed = pflags != self.out.pflags || cflags != self.out.cflags;
        if !confirm && !flags_changed && self.sent == self.cdc_sent {
            return;
        }
        self.emit_cdc(eff, confirm, pflags, cflags);
        if confirm || flags_changed {
            eff.add(Effects::CDC_CONS);
        }
    }

    /// Builds the next CDC: the current producer cursor, the consumer cursor (confirmed now
    /// if `confirm`), these flags.
    fn emit_cdc(
        &mut self,
        eff: &mut Effects,
        confirm: bool,
        pflags: ProducerFlags,
        cflags: ConnStateFlags,
    ) {
        if confirm {
            self.confirmed = self.consumed;
            self.confirmed_cur = self.consumed_cur;
        }
        self.tx_seq = self.tx_seq.wrapping_add(1);
        self.out = HostCdc {
            seqno: self.tx_seq,
            prod: self.sent_cur,
            cons: self.confirmed_cur,
            pflags,
            cflags,
        };
        self.cdc_sent = self.sent;
        if self.cfg.completions {
            self.inflight.push_back((self.tx_seq, self.sent));
        } else {
            self.fin = self.sent;
        }
        self.forget_answered();
        if pflags.urg_data_present() && self.tx_urg.pend {
            self.tx_urg.pend = false;
            self.tx_urg.mark = Some(self.sent);
            self.flags_dirty = true;
        }
        eff.add(Effects::CDC);
    }
}
