//! CDCs in, effects out (`smc_cdc.c`): the peer's CDCs and completed sends go to the core,
//! and what the core asks for is carried out through the transport.

use super::{SmcConn, State};
use crate::device::Dir;
use crate::layout::status::{Curs, RmbEvent};
use crate::transport::Transport;
use smc_core::close::{AbortKind, SmcState};
use smc_core::conn::{Effects, RemoteWrite, TcpAction};
use std::io;
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Fills an unused slot of the writes array.
const EMPTY_WRITE: RemoteWrite = RemoteWrite {
    dst: 0,
    src: [(0, 0), (0, 0)],
};

impl<T: Transport> SmcConn<T> {
    /// Feeds the core what arrived: completed sends, then the peer's CDCs. A CDC that breaks
    /// the rules aborts this connection.
    #[inline]
    pub(super) fn observe(&self, st: &mut State) -> io::Result<()> {
        if !self.link.events_pending() || st.retired {
            return Ok(());
        }
        self.observe_events(st)
    }

    fn observe_events(&self, st: &mut State) -> io::Result<()> {
        if self.link.take_failure() {
            let eff = st.core.abort(AbortKind::Reset);
            self.apply(st, eff);
            return Ok(());
        }
        if self.link.take_switch() {
            let (validation, eff) = st.core.failover();
            tracing::debug!(
                token = self.info.local_token,
                seq = validation.seqno,
                "SMC-R connection moved to another link"
            );
            if let Err(e) = self.link.send_cdc(&validation, true) {
                self.link_failed(st, "CDC send", &e);
                return Ok(());
            }
            self.apply(st, eff);
        }
        while let Some(seq) = self.link.poll_completion() {
            let eff = st.core.on_cdc_complete(seq);
            self.apply(st, eff);
        }
        if st.tcp_shutdown_pending && st.core.inflight_cdcs() == 0 {
            st.tcp_shutdown_pending = false;
            let _ = self.clcsock.shutdown(Shutdown::Both);
        }
        while let Some(cdc) = self.link.recv_cdc() {
            match st.core.on_cdc(&cdc) {
                Ok(eff) => {
                    self.apply(st, eff);
                    self.note_rx_full(st);
                    if T::CDC_IS_STATE {
                        // The CDC is the peer's current words, not a queue: one look per
                        // call; what changes after it is seen at the next.
                        break;
                    }
                }
                Err(v) => {
                    tracing::warn!(lgr = self.info.lgr_id, "SMC peer protocol violation: {v}");
                    self.poison();
                    let eff = st.core.abort(AbortKind::Aborted);
                    self.apply(st, eff);
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        format!("the SMC peer sent an invalid CDC: {v}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `SMC_STAT_RMB_RX_FULL`: the peer filled our buffer (counted once per time).
    #[inline]
    fn note_rx_full(&self, st: &mut State) {
        let full = st.core.rx_full();
        if full && !st.rx_full {
            self.slot.rmb_event(RmbEvent::RxFull);
        }
        st.rx_full = full;
        let (prod, cons) = st.core.rx_cursors();
        self.slot
            .set_cursors(&[(Curs::RxProd, prod), (Curs::RxCons, cons)]);
    }

    /// Carries out the core's effects: the writes, then the CDC, then the TCP action, then the
    /// end of stream or of the connection on the readiness, then the wake-ups.
    #[inline(always)]
    pub(super) fn apply(&self, st: &mut State, eff: Effects) {
        match eff.only_wakes() {
            // The data path: nothing, or a wake-up (a local waiter is rare: one load each).
            Some((reader, writer)) => {
                if reader {
                    self.link.wake_local(Dir::Rx);
                }
                if writer {
                    self.link.wake_local(Dir::Tx);
                }
            }
            None => self.apply_some(st, eff),
        }
    }

    #[inline(never)]
    fn apply_some(&self, st: &mut State, eff: Effects) {
        if st.retired {
            // The buffers are another connection's now (see `SmcConn::retire`).
            return;
        }
        if eff.writes() && !eff.cdc() && !self.post_writes(st) {
            return;
        }
        if eff.cdc() {
            // The writes of this push and its CDC go to the link together (one doorbell:
            // the soft device sends their packets in one system call).
            let writes = if eff.writes() {
                st.core.take_writes()
            } else {
                [None, None]
            };
            let (mut ws, mut n) = ([EMPTY_WRITE; 2], 0);
            for w in writes.iter().flatten() {
                ws[n] = *w;
                n += 1;
            }
            if let Err(e) =
                self.link
                    .post_writes_and_cdc(&ws[..n], st.core.cdc_out(), eff.cdc_cons_changed())
            {
                return self.link_failed(st, "RDMA WRITE or CDC send", &e);
            }
            // What smcss shows as txprod and rxcons; the sent and finished cursors are the
            // producer's with a no-copy transport, and prepared differs only while corked (the
            // write path publishes it then).
            let p = st.core.positions();
            self.slot
                .set_cursors(&[(Curs::TxProd, p.sent), (Curs::TxCons, p.confirmed)]);
            if p.fin != p.sent {
                self.slot
                    .set_cursors(&[(Curs::TxSent, p.sent), (Curs::TxFin, p.fin)]);
            }
        }
        if eff.urgent() || eff.tcp() != TcpAction::None {
            self.apply_rare(st, eff);
        }
        // The end first, then the wake-ups: an event loop woken by the bell must already see
        // the hang-up or end of stream with the readability (poll reports what it finds when
        // it wakes).
        if eff.close_changed() {
            self.show_end(st);
        }
        if eff.wake_reader() {
            self.link.wake_local(Dir::Rx);
        }
        if eff.wake_writer() {
            self.link.wake_local(Dir::Tx);
        }
    }

    /// The RDMA WRITEs before a CDC (staged buffers); false when the link failed.
    #[cold]
    fn post_writes(&self, st: &mut State) -> bool {
        for w in st.core.take_writes().iter().flatten() {
            if let Err(e) = self.link.write_remote(w) {
                self.link_failed(st, "RDMA WRITE", &e);
                return false;
            }
        }
        true
    }

    /// The link under the connection failed: it is aborted.
    #[cold]
    pub(super) fn link_failed(&self, st: &mut State, what: &str, e: &io::Error) {
        tracing::warn!("{what} failed: {e}");
        self.poison();
        let a = st.core.abort(AbortKind::Aborted);
        self.apply(st, a);
    }

    /// The urgent byte and the TCP actions: rare, so out of the data path's way.
    #[cold]
    fn apply_rare(&self, st: &mut State, eff: Effects) {
        if let Some(off) = st.core.urgent_offset().filter(|_| eff.urgent()) {
            let mut b = [0u8; 1];
            self.link.read_rx(off, &mut b);
            st.core.set_urgent_byte(b[0]);
        }
        match eff.tcp() {
            TcpAction::None => {}
            TcpAction::Shutdown if st.core.inflight_cdcs() > 0 => {
                // SMC-R: the close CDC travels on the link and the FIN on TCP; the FIN waits
                // until the peer has acknowledged every CDC (observe_events sends it).
                st.tcp_shutdown_pending = true;
            }
            TcpAction::Shutdown => {
                let _ = self.clcsock.shutdown(Shutdown::Both);
            }
            TcpAction::Abort => {
                // RST instead of FIN, as tcp_abort() in the kernel.
                let _ =
                    rustix::net::sockopt::set_socket_linger(&self.clcsock, Some(Duration::ZERO));
                let _ = self.clcsock.shutdown(Shutdown::Both);
            }
        }
    }

    /// End of stream and the end of the connection are for good: the readiness shows them
    /// permanently (readable with `POLLRDHUP`; hung up), once. Hung up means what it means
    /// for TCP and the kernel's `smc_poll`: both directions shut down, or the connection
    /// closed or aborted.
    #[cold]
    fn show_end(&self, st: &mut State) {
        let ready = self.link.readiness().filter(|_| !st.released);
        let cm = st.core.close_machine();
        let over = st.core.is_aborted()
            || st.core.state() == SmcState::Closed
            || (cm.rcv_shutdown() && st.core.write_is_shut());
        if over && !st.shown_end {
            st.shown_end = true;
            self.over.store(true, Ordering::Release);
            if let Some(r) = ready {
                r.hang_up();
            }
        } else if !st.shown_eof && st.core.close_machine().rcv_shutdown() {
            st.shown_eof = true;
            if let Some(r) = ready {
                r.peer_done();
            }
        }
        let cm = st.core.close_machine();
        if cm.received().any_close() {
            // The peer's close or abort is here: its TCP end, next, tells nothing new.
            self.unwatch();
        }
        let shut = u8::from(cm.rcv_shutdown() || st.core.read_is_shut())
            | u8::from(st.core.send_check().is_err()) << 1;
        self.slot.set_state(st.core.state() as u8, shut);
    }
}
