//! RC queue pairs: requester (`rxe_req.c`), completer (`rxe_comp.c`) and responder
//! (`rxe_resp.c`) of one QP, under one lock.

use super::{Dev, MAX_UNACKED_PSNS, MrInner, PKTS_PER_ACK, SoftCq, SoftStats, lock, write};
use crate::verbs::{
    Access, Gid, Payload, Pd, QpCaps, QpInit, QpModify, QpState, QueuePair, RecvWr, SendOp, SendWr,
    VerbsError, Wc, WcOpcode, WcStatus,
};
use crate::wire::{
    Aeth, Bth, MASK24, NakCode, Opcode, Packet, Reth, Syndrome, psn_add, psn_cmp, psn_diff,
};
use std::cmp::Ordering;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A queue pair of a [`super::SoftDevice`].
#[derive(Debug)]
pub struct SoftQp {
    dev: Arc<Dev>,
    inner: Arc<QpInner>,
}

impl SoftQp {
    pub(super) fn new(dev: Arc<Dev>, inner: Arc<QpInner>) -> Self {
        Self { dev, inner }
    }

    /// Takes one send into the send queue (its data copied now); [`QpInner::pump`] sends it.
    fn queue_send(&self, s: &mut S, wr: &SendWr<'_>) -> Result<(), VerbsError> {
        let q = &self.inner;
        match s.state {
            QpState::Rts => {}
            // As on hardware: accepted, and completed at once as flushed.
            QpState::Error => {
                let op = match wr.op {
                    SendOp::Send => WcOpcode::Send,
                    SendOp::Write { .. } => WcOpcode::RdmaWrite,
                };
                q.send_cq.push(q.wc(wr.wr_id, WcStatus::WrFlushErr, op));
                return Ok(());
            }
            st => return Err(VerbsError::State(st)),
        }
        if s.sq.len() >= q.caps.max_send_wr as usize {
            return Err(VerbsError::Full("send"));
        }
        let data = match wr.data {
            Payload::Inline(d) => {
                if d.len() > q.caps.max_inline_data as usize {
                    return Err(VerbsError::Invalid(
                        "inline data longer than max_inline_data",
                    ));
                }
                d.to_vec()
            }
            Payload::Sges(sges) => {
                if sges.len() > q.caps.max_send_sge as usize {
                    return Err(VerbsError::Invalid("more SGEs than max_send_sge"));
                }
                let total: usize = sges.iter().map(|g| g.len as usize).sum();
                if total > 1 << 31 {
                    return Err(VerbsError::Invalid("message longer than 2 GiB"));
                }
                let mut v = vec![0u8; total];
                let mut at = 0;
                for g in sges {
                    let (mr, off) = self.dev.resolve(q.pd, g.addr, g.len, g.lkey).ok_or(
                        VerbsError::Protection("SGE outside its region or wrong key"),
                    )?;
                    mr.mem.read(off, &mut v[at..at + g.len as usize]);
                    at += g.len as usize;
                }
                v
            }
        };
        let npkts = data.len().div_ceil(s.mtu).max(1) as u32;
        let first_psn = s.post_psn;
        s.post_psn = psn_add(first_psn, npkts);
        s.sq.push_back(Wqe {
            wr_id: wr.wr_id,
            write: match wr.op {
                SendOp::Send => None,
                SendOp::Write { remote_addr, rkey } => Some((remote_addr, rkey)),
            },
            data,
            signaled: wr.signaled || q.sig_all,
            solicited: wr.solicited,
            first_psn,
            npkts,
        });
        Ok(())
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        write(&self.dev.qps).remove(&self.inner.num);
        super::lock(&self.dev.qpns).free.push(self.inner.num);
    }
}

#[derive(Debug)]
pub(super) struct QpInner {
    pub(super) num: u32,
    pd: Pd,
    send_cq: Arc<SoftCq>,
    recv_cq: Arc<SoftCq>,
    caps: QpCaps,
    sig_all: bool,
    s: Mutex<S>,
}

/// A posted send: its data copied at post time, its PSN range.
#[derive(Debug)]
struct Wqe {
    wr_id: u64,
    write: Option<(u64, u32)>,
    data: Vec<u8>,
    signaled: bool,
    solicited: bool,
    first_psn: u32,
    npkts: u32,
}

impl Wqe {
    fn last_psn(&self) -> u32 {
        psn_add(self.first_psn, self.npkts - 1)
    }

    fn opcode(&self) -> WcOpcode {
        if self.write.is_some() {
            WcOpcode::RdmaWrite
        } else {
            WcOpcode::Send
        }
    }
}

/// A request message being received.
#[derive(Debug)]
enum InMsg {
    Send {
        wr: RecvWr,
        mr: Arc<MrInner>,
        off: usize,
        /// The second scatter entry's region and offset.
        spill: Option<(Arc<MrInner>, usize)>,
        got: usize,
    },
    Write {
        mr: Option<Arc<MrInner>>,
        off: usize,
        left: usize,
    },
}

/// Why the responder did not execute a request.
enum Refuse {
    /// No receive posted: RNR NAK, the requester retries.
    Rnr,
    /// A NAK; the responder goes to ERROR.
    Nak(NakCode),
}

#[derive(Debug)]
struct S {
    state: QpState,
    access: Access,
    mtu: usize,
    dest_qpn: u32,
    peer: Option<Gid>,
    min_rnr_timer: u8,
    // Requester.
    timeout: Option<Duration>,
    retry_cnt: u8,
    rnr_retry: u8,
    retries: u8,
    rnr_retries: u8,
    sq: VecDeque<Wqe>,
    /// The next packet to transmit: message index in `sq` and packet index in it.
    next_wqe: usize,
    next_pkt: u32,
    /// The PSN the next posted message starts at.
    post_psn: u32,
    /// One after the highest PSN transmitted.
    sent_end: u32,
    /// The first PSN not acknowledged.
    una: u32,
    /// Packets since the last AckReq.
    noack: u32,
    deadline: Option<Instant>,
    rnr_until: Option<Instant>,
    /// The PSN the responder last refused with an RNR NAK, until something past it is
    /// acknowledged: a sequence NAK naming it is that refusal's echo (the packets behind the
    /// refused one arrived out of sequence), not a loss, and starts no retry.
    rnr_psn: Option<u32>,
    // Responder.
    epsn: u32,
    msn: u32,
    nak_sent: bool,
    /// The PSN of the last request executed with AckReq whose ACK has not gone out yet: the
    /// receive thread sends one ACK for the datagrams it took in one go
    /// ([`QpInner::flush_ack`]).
    ack_due: Option<u32>,
    rq: VecDeque<RecvWr>,
    cur: Option<InMsg>,
    /// Packets `pump` is about to send.
    tx: super::udp::TxBatch,
}

/// IBTA table 45: RNR NAK timer codes.
fn rnr_time(code: u8) -> Duration {
    const US: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    Duration::from_micros(u64::from(US[usize::from(code & 0x1f)]))
}

/// The local ACK timeout of code `t`: 4.096 µs × 2^t; 0 waits forever.
fn ack_timeout(t: u8) -> Option<Duration> {
    (t != 0).then(|| Duration::from_nanos(4096u64 << t.min(31)))
}

impl QpInner {
    pub(super) fn new(num: u32, pd: Pd, init: QpInit<SoftCq>) -> Self {
        Self {
            num,
            pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            caps: init.caps,
            sig_all: init.sq_sig_all,
            s: Mutex::new(S {
                state: QpState::Reset,
                access: Access::default(),
                mtu: 1024,
                dest_qpn: 0,
                peer: None,
                min_rnr_timer: 0,
                timeout: None,
                retry_cnt: 0,
                rnr_retry: 0,
                retries: 0,
                rnr_retries: 0,
                sq: VecDeque::new(),
                next_wqe: 0,
                next_pkt: 0,
                post_psn: 0,
                sent_end: 0,
                una: 0,
                noack: 0,
                deadline: None,
                rnr_until: None,
                rnr_psn: None,
                epsn: 0,
                msn: 0,
                nak_sent: false,
                ack_due: None,
                rq: VecDeque::new(),
                cur: None,
                tx: Default::default(),
            }),
        }
    }

    fn wc(&self, wr_id: u64, status: WcStatus, opcode: WcOpcode) -> Wc {
        Wc {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            qp_num: self.num,
            solicited: false,
        }
    }

    /// ERROR: the failing send (if any) completes with `status`, the rest of both queues as
    /// flushed.
    fn fail(&self, s: &mut S, status: Option<WcStatus>) {
        if let Some(st) = status
            && let Some(w) = s.sq.pop_front()
        {
            self.send_cq.push(self.wc(w.wr_id, st, w.opcode()));
        }
        for w in s.sq.drain(..) {
            self.send_cq
                .push(self.wc(w.wr_id, WcStatus::WrFlushErr, w.opcode()));
        }
        if let Some(InMsg::Send { wr, .. }) = s.cur.take() {
            self.recv_cq
                .push(self.wc(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv));
        }
        for r in s.rq.drain(..) {
            self.recv_cq
                .push(self.wc(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv));
        }
        s.state = QpState::Error;
        s.ack_due = None;
        s.deadline = None;
        s.rnr_until = None;
        s.rnr_psn = None;
        s.next_wqe = 0;
        s.next_pkt = 0;
    }

    // ---- requester ----

    /// The PSN of the next packet to transmit.
    fn pos_psn(s: &S) -> u32 {
        match s.sq.get(s.next_wqe) {
            Some(w) => psn_add(w.first_psn, s.next_pkt),
            None => s.post_psn,
        }
    }

    /// Moves the transmit position to the packet with `psn`.
    fn seek(s: &mut S, psn: u32) {
        for (i, w) in s.sq.iter().enumerate() {
            let d = psn_diff(psn, w.first_psn);
            if d >= 0 && (d as u32) < w.npkts {
                s.next_wqe = i;
                s.next_pkt = d as u32;
                return;
            }
        }
        s.next_wqe = s.sq.len();
        s.next_pkt = 0;
    }

    /// Transmits what the window allows.
    fn pump(&self, dev: &Dev, s: &mut S) {
        if s.state != QpState::Rts || s.rnr_until.is_some() {
            return;
        }
        let Some(peer) = s.peer else { return };
        while s.next_wqe < s.sq.len() {
            let w = &s.sq[s.next_wqe];
            let i = s.next_pkt;
            let psn = psn_add(w.first_psn, i);
            if psn_diff(psn, s.una) >= MAX_UNACKED_PSNS as i32 {
                break;
            }
            let off = i as usize * s.mtu;
            let end = (off + s.mtu).min(w.data.len());
            let last = i + 1 == w.npkts;
            let opcode = Opcode::for_segment(w.write.is_some(), i as usize, w.npkts as usize);
            let mut bth = Bth::new(opcode, s.dest_qpn, psn);
            bth.solicited = w.solicited && last;
            s.noack += 1;
            bth.ack_req = last || s.noack >= PKTS_PER_ACK;
            if bth.ack_req {
                s.noack = 0;
            }
            let reth = match w.write {
                Some((va, rkey)) if i == 0 => Some(Reth {
                    va,
                    rkey,
                    len: w.data.len() as u32,
                }),
                _ => None,
            };
            s.tx.push(dev, &Packet::new(bth, reth, None, &w.data[off..end]), peer);
            let after = psn_add(psn, 1);
            if psn_cmp(after, s.sent_end) == Ordering::Greater {
                s.sent_end = after;
            } else {
                SoftStats::inc(&dev.stats.retransmits);
            }
            s.next_pkt += 1;
            if s.next_pkt == w.npkts {
                s.next_wqe += 1;
                s.next_pkt = 0;
            }
            if s.deadline.is_none() {
                s.deadline = s.timeout.map(|t| Instant::now() + t);
            }
        }
        s.tx.flush(dev);
    }

    /// Everything through `psn` arrived: completes the messages it covers.
    fn ack_through(&self, s: &mut S, psn: u32) {
        // Not beyond what was sent (a ghost ACK), and something new.
        if psn_cmp(psn, s.sent_end) != Ordering::Less || psn_cmp(psn, s.una) == Ordering::Less {
            return;
        }
        while let Some(w) = s.sq.front() {
            if psn_cmp(w.last_psn(), psn) == Ordering::Greater {
                break;
            }
            let w = s.sq.pop_front().expect("front");
            if s.next_wqe > 0 {
                s.next_wqe -= 1;
            } else {
                s.next_pkt = 0;
            }
            if w.signaled {
                self.send_cq
                    .push(self.wc(w.wr_id, WcStatus::Success, w.opcode()));
            }
        }
        s.una = psn_add(psn, 1);
        s.rnr_psn = None;
        s.retries = s.retry_cnt;
        s.rnr_retries = s.rnr_retry;
        if psn_diff(Self::pos_psn(s), s.una) < 0 {
            let una = s.una;
            Self::seek(s, una);
        }
        s.deadline = (psn_cmp(s.sent_end, s.una) == Ordering::Greater)
            .then(|| s.timeout.map(|t| Instant::now() + t))
            .flatten();
    }

    /// Go back to the first unacknowledged PSN, or fail after `retry_cnt` times.
    fn retry(&self, dev: &Dev, s: &mut S, from: u32) {
        if s.retries == 0 {
            return self.fail(s, Some(WcStatus::RetryExcErr));
        }
        s.retries -= 1;
        Self::seek(s, from);
        s.deadline = None;
        self.pump(dev, s);
    }

    fn on_ack(&self, dev: &Dev, s: &mut S, bth: &Bth, aeth: &Aeth) {
        if s.state != QpState::Rts {
            return;
        }
        let psn = bth.psn;
        match aeth.syndrome {
            Syndrome::Ack { .. } => {
                self.ack_through(s, psn);
                self.pump(dev, s);
            }
            Syndrome::Nak(NakCode::PsnSequence) => {
                // The responder expects `psn`: all before it arrived.
                self.ack_through(s, psn_add(psn, MASK24));
                if psn_cmp(psn, s.una) == Ordering::Equal
                    && psn_cmp(psn, s.sent_end) == Ordering::Less
                    && s.rnr_psn != Some(psn)
                {
                    self.retry(dev, s, psn);
                }
            }
            Syndrome::RnrNak { timer } => {
                self.ack_through(s, psn_add(psn, MASK24));
                if psn_cmp(psn, s.una) != Ordering::Equal {
                    return;
                }
                if s.rnr_retry != 7 {
                    if s.rnr_retries == 0 {
                        return self.fail(s, Some(WcStatus::RnrRetryExcErr));
                    }
                    s.rnr_retries -= 1;
                }
                Self::seek(s, psn);
                s.deadline = None;
                s.rnr_until = Some(Instant::now() + rnr_time(timer));
                s.rnr_psn = Some(psn);
            }
            Syndrome::Nak(code) => {
                self.ack_through(s, psn_add(psn, MASK24));
                let st = match code {
                    NakCode::RemoteAccess => WcStatus::RemAccessErr,
                    NakCode::RemoteOperational => WcStatus::RemOpErr,
                    _ => WcStatus::RemInvReqErr,
                };
                self.fail(s, Some(st));
            }
            Syndrome::Reserved(_) => {}
        }
    }

    /// Due timers; returns the next, and the local ACK timeout of a QP that can send (the
    /// longest a retransmission timer started later can be ahead of its post).
    pub(super) fn on_timer(&self, dev: &Dev, now: Instant) -> (Option<Instant>, Option<Duration>) {
        let mut s = lock(&self.s);
        if s.rnr_until.is_some_and(|t| t <= now) {
            s.rnr_until = None;
            self.pump(dev, &mut s);
        }
        if s.deadline.is_some_and(|t| t <= now) {
            s.deadline = None;
            if psn_cmp(s.sent_end, s.una) == Ordering::Greater {
                SoftStats::inc(&dev.stats.timeouts);
                let una = s.una;
                self.retry(dev, &mut s, una);
            }
        }
        let next = [s.deadline, s.rnr_until].into_iter().flatten().min();
        (next, s.timeout.filter(|_| s.state == QpState::Rts))
    }

    // ---- responder ----

    /// Sends the ACK of the requests executed since the last one, if any asked for it.
    ///
    /// ACKs are coalesced per batch of received datagrams: ACKs are cumulative (an ACK
    /// acknowledges every request up to its PSN, IBA 9.7.5.1.2, and rxe's completer treats
    /// it so), so the ACK of the last request that asked for one in a batch answers the
    /// earlier ones too, as RNICs coalesce ACKs. rxe itself sends one per AckReq packet; here
    /// that cost a `sendmsg` per message (an RDMA WRITE and the CDC SEND behind it, arriving
    /// together, got two ACKs). Any other answer (a NAK, a duplicate's ACK) sends the due ACK
    /// first, so the requester sees the same sequence of PSNs, only fewer ACKs.
    pub(super) fn flush_ack(&self, dev: &Dev) {
        let mut s = lock(&self.s);
        self.send_due_ack(dev, &mut s);
    }

    fn send_due_ack(&self, dev: &Dev, s: &mut S) {
        if let Some(psn) = s.ack_due.take() {
            self.send_answer(dev, s, Syndrome::Ack { credits: 0x1f }, psn);
        }
    }

    /// The ACK held back for this QP's next send ([`Dev::hold_acks`]), put first into that
    /// send's batch: the ACK and the requests leave in one system call.
    fn batch_due_ack(&self, dev: &Dev, s: &mut S) {
        let (Some(psn), Some(peer)) = (s.ack_due.take(), s.peer) else {
            return;
        };
        let bth = Bth::new(Opcode::Ack, s.dest_qpn, psn);
        let aeth = Aeth {
            syndrome: Syndrome::Ack { credits: 0x1f },
            msn: s.msn,
        };
        s.tx.push(dev, &Packet::new(bth, None, Some(aeth), &[]), peer);
    }

    /// An answer to the requester, after the ACK that is due.
    fn answer(&self, dev: &Dev, s: &mut S, syndrome: Syndrome, psn: u32) {
        self.send_due_ack(dev, s);
        self.send_answer(dev, s, syndrome, psn);
    }

    fn send_answer(&self, dev: &Dev, s: &S, syndrome: Syndrome, psn: u32) {
        let Some(peer) = s.peer else { return };
        let bth = Bth::new(Opcode::Ack, s.dest_qpn, psn);
        let aeth = Aeth {
            syndrome,
            msn: s.msn,
        };
        dev.send(&Packet::new(bth, None, Some(aeth), &[]), &peer);
    }

    /// A datagram for this QP from `from`; returns whether it was taken.
    pub(super) fn receive(&self, dev: &Dev, p: &Packet<'_>, from: Gid) -> bool {
        let mut s = lock(&self.s);
        if s.peer != Some(from) {
            return false;
        }
        if p.bth.opcode == Opcode::Ack {
            if let Some(aeth) = &p.aeth {
                self.on_ack(dev, &mut s, &p.bth, aeth);
            }
            return true;
        }
        if !matches!(s.state, QpState::Rtr | QpState::Rts) {
            return false;
        }
        let psn = p.bth.psn;
        let d = psn_diff(psn, s.epsn);
        if d < 0 {
            // Executed already: say again how far we are, do nothing else.
            SoftStats::inc(&dev.stats.duplicates);
            if p.bth.ack_req {
                let prev = psn_add(s.epsn, MASK24);
                self.answer(dev, &mut s, Syndrome::Ack { credits: 0x1f }, prev);
            }
            return true;
        }
        if d > 0 {
            // A gap: one NAK per gap, then drop until the expected PSN comes.
            if !s.nak_sent {
                s.nak_sent = true;
                SoftStats::inc(&dev.stats.seq_naks_sent);
                let e = s.epsn;
                self.answer(dev, &mut s, Syndrome::Nak(NakCode::PsnSequence), e);
            }
            return true;
        }
        s.nak_sent = false;
        match self.execute(dev, &mut s, p) {
            Ok(()) => {
                s.epsn = psn_add(psn, 1);
                if p.bth.ack_req {
                    // Sent when the receive thread has taken the datagrams that are here.
                    s.ack_due = Some(psn);
                }
            }
            Err(Refuse::Rnr) => {
                SoftStats::inc(&dev.stats.rnr_naks_sent);
                let t = s.min_rnr_timer;
                self.answer(dev, &mut s, Syndrome::RnrNak { timer: t }, psn);
            }
            Err(Refuse::Nak(code)) => {
                self.answer(dev, &mut s, Syndrome::Nak(code), psn);
                self.fail(&mut s, None);
            }
        }
        true
    }

    /// Executes the expected request packet.
    fn execute(&self, dev: &Dev, s: &mut S, p: &Packet<'_>) -> Result<(), Refuse> {
        let op = p.bth.opcode;
        let (first, last) = (op.is_first(), op.is_last());
        let n = p.payload.len();
        let in_send = matches!(s.cur, Some(InMsg::Send { .. }));
        let in_write = matches!(s.cur, Some(InMsg::Write { .. }));
        let order_ok = if first {
            s.cur.is_none()
        } else {
            (op.is_send() && in_send) || (op.is_write() && in_write)
        };
        if !(op.is_send() || op.is_write()) || !order_ok || n > s.mtu || (!last && n != s.mtu) {
            return Err(Refuse::Nak(NakCode::InvalidRequest));
        }
        if op.is_send() {
            if first {
                let Some(wr) = s.rq.front().copied() else {
                    return Err(Refuse::Rnr);
                };
                let writable = |g: &crate::verbs::Sge| {
                    dev.resolve(self.pd, g.addr, g.len, g.lkey)
                        .filter(|(mr, _)| mr.access.contains(Access::LOCAL_WRITE))
                };
                let first = writable(&wr.sge);
                let spill = wr.spill.map(|g| writable(&g));
                let (Some((mr, off)), None | Some(Some(_))) = (first, &spill) else {
                    s.rq.pop_front();
                    self.recv_cq
                        .push(self.wc(wr.wr_id, WcStatus::LocProtErr, WcOpcode::Recv));
                    return Err(Refuse::Nak(NakCode::RemoteOperational));
                };
                s.rq.pop_front();
                s.cur = Some(InMsg::Send {
                    wr,
                    mr,
                    off,
                    spill: spill.flatten(),
                    got: 0,
                });
            }
            let Some(InMsg::Send {
                wr,
                mr,
                off,
                spill,
                got,
            }) = &mut s.cur
            else {
                unreachable!("checked above")
            };
            if *got + n > wr.capacity() {
                let id = wr.wr_id;
                s.cur = None;
                self.recv_cq
                    .push(self.wc(id, WcStatus::LocLenErr, WcOpcode::Recv));
                return Err(Refuse::Nak(NakCode::InvalidRequest));
            }
            // Scatter: the first entry's bytes, then the second's.
            let first_len = wr.sge.len as usize;
            let head = first_len.saturating_sub(*got).min(n);
            if head > 0 {
                mr.mem.write(*off + *got, &p.payload[..head]);
            }
            if head < n
                && let Some((smr, soff)) = spill
            {
                smr.mem
                    .write(*soff + (*got + head - first_len), &p.payload[head..]);
            }
            *got += n;
            if last {
                let mut wc = self.wc(wr.wr_id, WcStatus::Success, WcOpcode::Recv);
                wc.byte_len = *got as u32;
                wc.solicited = p.bth.solicited;
                s.cur = None;
                s.msn = psn_add(s.msn, 1);
                self.recv_cq.push(wc);
            }
        } else {
            if first {
                let Some(reth) = p.reth else {
                    return Err(Refuse::Nak(NakCode::InvalidRequest));
                };
                let len = reth.len as usize;
                let target = if len == 0 {
                    None
                } else {
                    let mr = super::read(&dev.mrs).get(&reth.rkey).cloned();
                    let ok = mr.filter(|m| {
                        m.pd == self.pd
                            && m.access.contains(Access::REMOTE_WRITE)
                            && s.access.contains(Access::REMOTE_WRITE)
                    });
                    let Some((mr, off)) =
                        ok.and_then(|m| m.offset(reth.va, reth.len.into()).map(|o| (m, o)))
                    else {
                        return Err(Refuse::Nak(NakCode::RemoteAccess));
                    };
                    Some((mr, off))
                };
                s.cur = Some(match target {
                    Some((mr, off)) => InMsg::Write {
                        mr: Some(mr),
                        off,
                        left: len,
                    },
                    None => InMsg::Write {
                        mr: None,
                        off: 0,
                        left: 0,
                    },
                });
            }
            let Some(InMsg::Write { mr, off, left }) = &mut s.cur else {
                unreachable!("checked above")
            };
            if n > *left || (last && n != *left) {
                return Err(Refuse::Nak(NakCode::InvalidRequest));
            }
            if let Some(mr) = mr {
                mr.mem.write(*off, p.payload);
            }
            *off += n;
            *left -= n;
            if last {
                s.cur = None;
                s.msn = psn_add(s.msn, 1);
            }
        }
        Ok(())
    }
}

impl QueuePair for SoftQp {
    fn qp_num(&self) -> u32 {
        self.inner.num
    }

    fn state(&self) -> QpState {
        lock(&self.inner.s).state
    }

    fn caps(&self) -> QpCaps {
        self.inner.caps
    }

    fn modify(&self, m: &QpModify) -> Result<(), VerbsError> {
        let q = &self.inner;
        let mut s = lock(&q.s);
        match (s.state, *m) {
            (QpState::Reset, QpModify::Init { port, access }) => {
                if port != 1 {
                    return Err(VerbsError::Invalid("port"));
                }
                s.access = access;
                s.state = QpState::Init;
            }
            (
                QpState::Init,
                QpModify::Rtr {
                    path_mtu,
                    dest_qpn,
                    rq_psn,
                    dgid,
                    sgid_index,
                    min_rnr_timer,
                },
            ) => {
                if !self.dev.reaches(&dgid) {
                    return Err(VerbsError::Invalid(if self.dev.v1.is_some() {
                        "destination GID (link-local EUI-64 RoCE v1 GIDs only)"
                    } else {
                        "destination GID (IPv4-mapped RoCEv2 GIDs only)"
                    }));
                }
                let peer = dgid;
                if sgid_index != 0 {
                    return Err(VerbsError::Invalid("source GID index"));
                }
                s.mtu = path_mtu.bytes().min(self.dev.mtu.bytes());
                s.dest_qpn = dest_qpn & MASK24;
                s.peer = Some(peer);
                s.epsn = rq_psn & MASK24;
                s.min_rnr_timer = min_rnr_timer & 0x1f;
                s.state = QpState::Rtr;
            }
            (
                QpState::Rtr,
                QpModify::Rts {
                    sq_psn,
                    timeout,
                    retry_cnt,
                    rnr_retry,
                },
            ) => {
                let psn = sq_psn & MASK24;
                s.post_psn = psn;
                s.sent_end = psn;
                s.una = psn;
                s.timeout = ack_timeout(timeout);
                s.retry_cnt = retry_cnt.min(7);
                s.rnr_retry = rnr_retry.min(7);
                s.retries = s.retry_cnt;
                s.rnr_retries = s.rnr_retry;
                s.state = QpState::Rts;
            }
            (_, QpModify::Error) => q.fail(&mut s, None),
            (_, QpModify::Reset) => {
                s.sq.clear();
                s.rq.clear();
                s.cur = None;
                s.deadline = None;
                s.rnr_until = None;
                s.rnr_psn = None;
                s.next_wqe = 0;
                s.next_pkt = 0;
                s.peer = None;
                s.ack_due = None;
                s.state = QpState::Reset;
            }
            (st, _) => return Err(VerbsError::State(st)),
        }
        Ok(())
    }

    fn post_send(&self, wr: &SendWr<'_>) -> Result<(), VerbsError> {
        self.post_send_list(std::slice::from_ref(wr))
            .map_err(|(_, e)| e)
    }

    /// One lock and one transmission for the chain: the packets of its requests go out
    /// together (a WRITE run and the CDC SEND after it in one GSO send when they fit), as an
    /// RNIC sends a chain posted with one doorbell. The packets are those of posting the
    /// requests one by one.
    fn post_send_list(&self, wrs: &[SendWr<'_>]) -> Result<(), (usize, VerbsError)> {
        let q = &self.inner;
        let mut s = lock(&q.s);
        // An ACK held back for this send goes first, in the same system call
        // (`Dev::hold_acks`).
        q.batch_due_ack(&self.dev, &mut s);
        let had_timer = s.deadline.is_some();
        let mut r = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = self.queue_send(&mut s, wr) {
                r = Err((i, e));
                break;
            }
        }
        q.pump(&self.dev, &mut s);
        // The ACK, when `pump` sent nothing (not in RTS, or waiting out an RNR NAK).
        s.tx.flush(&self.dev);
        let started = s.deadline.filter(|_| !had_timer);
        drop(s);
        if let Some(t) = started {
            // The receive thread may be sleeping without a timeout, or a longer one.
            self.dev.timer_started(t);
        }
        r
    }

    fn post_recv(&self, wr: &RecvWr) -> Result<(), VerbsError> {
        let q = &self.inner;
        let mut s = lock(&q.s);
        match s.state {
            QpState::Reset => return Err(VerbsError::State(QpState::Reset)),
            QpState::Error => {
                q.recv_cq
                    .push(q.wc(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv));
                return Ok(());
            }
            _ => {}
        }
        if s.rq.len() >= q.caps.max_recv_wr as usize {
            return Err(VerbsError::Full("receive"));
        }
        let sges = 1 + u32::from(wr.spill.is_some());
        if sges > q.caps.max_recv_sge.max(1) {
            return Err(VerbsError::Invalid("more SGEs than max_recv_sge"));
        }
        for g in std::iter::once(wr.sge).chain(wr.spill) {
            if self.dev.resolve(q.pd, g.addr, g.len, g.lkey).is_none() {
                return Err(VerbsError::Protection(
                    "receive SGE outside its region or wrong key",
                ));
            }
        }
        s.rq.push_back(*wr);
        Ok(())
    }
}
