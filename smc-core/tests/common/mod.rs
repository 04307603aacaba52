//! A two-sided harness in the manner of quinn-proto's `Pair`: two [`Connection`]s, their
//! receive rings (and, for staged buffers, send buffers) as plain byte vectors, CDCs in flight
//! in each direction, completions, and a clock that jumps to the next timer when nothing else
//! can happen. No threads, no shared memory, no daemon: every interleaving is reproducible.
//!
//! SMC-D is modelled as the DMB header is: the reader sees only the latest CDC the writer
//! stored (a slot, overwritten), and a CDC is complete when it is made. SMC-R as a reliable
//! connection is: CDC SENDs arrive in order, RDMA WRITEs land before the SEND that follows them,
//! and each send completes later at the sender.
#![allow(dead_code)]

use smc_core::close::SmcState;
use smc_core::conn::{
    Config, Connection, Effects, HostCdc, RecvReady, SendFlags, TcpAction, TxBuffer,
};
use smc_core::time::Instant;
use std::collections::VecDeque;
use std::time::Duration;

/// The byte at position `pos` of the stream sent by side `from`.
pub fn pattern(from: usize, pos: u64) -> u8 {
    let x = pos.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (from as u64) << 61;
    (x >> 56) as u8 ^ pos as u8
}

/// Copies `data` into `ring` at `off`, wrapping.
pub fn ring_write(ring: &mut [u8], off: usize, data: &[u8]) {
    let first = data.len().min(ring.len() - off);
    ring[off..off + first].copy_from_slice(&data[..first]);
    ring[..data.len() - first].copy_from_slice(&data[first..]);
}

/// Copies out of `ring` at `off`, wrapping.
pub fn ring_read(ring: &[u8], off: usize, out: &mut [u8]) {
    let first = out.len().min(ring.len() - off);
    out[..first].copy_from_slice(&ring[off..off + first]);
    let n = out.len();
    out[first..].copy_from_slice(&ring[..n - first]);
}

/// One side: its connection, its buffers, what its application has done.
#[derive(Debug)]
pub struct Side {
    /// The connection.
    pub conn: Connection,
    /// The ring the peer writes into.
    pub rx: Vec<u8>,
    /// The local send buffer (staged only).
    pub sndbuf: Vec<u8>,
    /// CDCs from the peer not yet delivered.
    pub inbox: VecDeque<HostCdc>,
    /// Sequence numbers of our CDCs whose completion is not yet delivered.
    pub completions: VecDeque<u16>,
    /// Application bytes written.
    pub written: u64,
    /// Application bytes the application wants to write in all.
    pub to_write: u64,
    /// Application bytes read (all checked against the pattern).
    pub read: u64,
    /// The application saw end of stream.
    pub eof: bool,
    /// The application saw an error.
    pub error: bool,
    /// The application closed.
    pub closed: bool,
    /// The TCP connection was shut down / aborted by this side.
    pub tcp: TcpAction,
    /// The buffers were freed.
    pub freed: bool,
    /// CDCs this side sent.
    pub cdcs_sent: usize,
    /// SMC-D: the two words this side stored last in the peer's DMB header.
    pub header: HostCdc,
    /// Largest number of new bytes one CDC announced.
    pub max_announce: u64,
    /// The sequence number of our CDC whose completion was delivered last.
    pub done_seq: u16,
    last_prod: u64,
}

impl Side {
    fn new(cfg: Config) -> Self {
        let sndbuf = match cfg.tx_buffer {
            TxBuffer::NoCopy => 0,
            TxBuffer::Staged { len } => len,
        };
        Side {
            rx: vec![0; cfg.rx_ring],
            sndbuf: vec![0; sndbuf],
            conn: Connection::new(cfg),
            inbox: VecDeque::new(),
            completions: VecDeque::new(),
            written: 0,
            to_write: 0,
            read: 0,
            eof: false,
            error: false,
            closed: false,
            tcp: TcpAction::None,
            freed: false,
            cdcs_sent: 0,
            header: HostCdc::default(),
            max_announce: 0,
            done_seq: 0,
            last_prod: 0,
        }
    }
}

/// Two connected sides.
#[derive(Debug)]
pub struct Pair {
    /// Side 0 (the client) and side 1.
    pub s: [Side; 2],
    /// The clock.
    pub now: Instant,
    /// SMC-R semantics (queue of CDCs, completions) instead of SMC-D (latest word wins).
    pub smcr: bool,
    /// Steps taken by `drive`.
    pub steps: usize,
    /// Application write size used by `drive` (bytes per write call).
    pub write_size: usize,
    /// Application read size used by `drive`.
    pub read_size: usize,
    /// Which way the next piece of a write finishes (alternates).
    fast_toggle: bool,
    /// Pieces that took [`Connection::sent_fast`] or [`Connection::send_fast`].
    pub fast_sends: usize,
    whole_toggle: u8,
    /// Sends that took [`Connection::send_fast`].
    pub whole_sends: usize,
    /// After every step of `drive`, each side's state is checked to own no heap memory
    /// ([`Connection::owns_no_heap`]) and replaced by a copy, as processes that take turns at
    /// a shared connection do.
    pub through_copies: bool,
    /// Steps whose states were carried over as copies.
    pub copied: usize,
}

/// A connection config for side `i` given each side's receive ring and send buffer.
pub fn smcd_cfgs(rx0: usize, rx1: usize) -> [Config; 2] {
    [Config::smcd(rx0, rx1), Config::smcd(rx1, rx0)]
}

/// SMC-R configs: each side's RMB and send buffer.
pub fn smcr_cfgs(rx0: usize, snd0: usize, rx1: usize, snd1: usize) -> [Config; 2] {
    [Config::smcr(rx0, rx1, snd0), Config::smcr(rx1, rx0, snd1)]
}

impl Pair {
    /// A pair over SMC-D.
    pub fn smcd(cfg: [Config; 2]) -> Pair {
        Self::new(cfg, false)
    }

    /// A pair over SMC-R.
    pub fn smcr(cfg: [Config; 2]) -> Pair {
        Self::new(cfg, true)
    }

    fn new(cfg: [Config; 2], smcr: bool) -> Pair {
        Pair {
            s: [Side::new(cfg[0]), Side::new(cfg[1])],
            now: Instant::ZERO,
            smcr,
            steps: 0,
            write_size: 4096,
            read_size: 4096,
            fast_toggle: false,
            fast_sends: 0,
            whole_toggle: 0,
            whole_sends: 0,
            through_copies: false,
            copied: 0,
        }
    }

    /// Carries out effects produced by side `i`.
    pub fn apply(&mut self, i: usize, eff: Effects) {
        let j = 1 - i;
        let writes = if eff.writes() {
            self.s[i].conn.take_writes()
        } else {
            [None, None]
        };
        for w in writes.into_iter().flatten() {
            // RDMA WRITE: gather from our send buffer, place into the peer's ring.
            let mut data = Vec::with_capacity(w.len());
            for (off, len) in w.src {
                if len > 0 {
                    data.extend_from_slice(&self.s[i].sndbuf[off..off + len]);
                }
            }
            let (a, b) = self.s.split_at_mut(1);
            let peer = if j == 0 { &mut a[0] } else { &mut b[0] };
            ring_write(&mut peer.rx, w.dst, &data);
        }
        if eff.cdc() {
            self.deliver_cdc(i, eff.cdc_cons_changed());
        }
        let tcp = eff.tcp();
        if tcp != TcpAction::None && self.s[i].tcp != TcpAction::Abort {
            self.s[i].tcp = tcp;
        }
        self.s[i].freed |= eff.free();
        if eff.urgent() {
            let off = self.s[i]
                .conn
                .urgent_offset()
                .expect("urgent data announced");
            let b = self.s[i].rx[off];
            self.s[i].conn.set_urgent_byte(b);
        }
    }

    /// Side `i` publishes its [`Connection::cdc_out`]; without `cons_changed` only its
    /// producer word is stored (SMC-D).
    pub fn deliver_cdc(&mut self, i: usize, cons_changed: bool) {
        let j = 1 - i;
        let side = &mut self.s[i];
        let mut cdc = *side.conn.cdc_out();
        side.cdcs_sent += 1;
        let prod = side.conn.positions().sent;
        side.max_announce = side.max_announce.max(prod - side.last_prod);
        side.last_prod = prod;
        if self.smcr {
            self.s[i].completions.push_back(cdc.seqno);
            self.s[j].inbox.push_back(cdc);
        } else {
            // The DMB header holds the latest two words only, and a CDC whose consumer
            // word did not change stores just the producer word: the peer sees the
            // consumer cursor and flags stored before.
            if !cons_changed {
                let before = self.s[i].header;
                assert_eq!(
                    (cdc.cons, cdc.pflags, cdc.cflags),
                    (before.cons, before.pflags, before.cflags),
                    "a CDC said to move only the producer cursor changed the consumer word"
                );
                cdc = HostCdc {
                    prod: cdc.prod,
                    ..before
                };
            }
            self.s[i].header = cdc;
            self.s[j].inbox.clear();
            self.s[j].inbox.push_back(cdc);
        }
    }

    /// Side `i`'s application writes up to `len` more bytes of its stream (non-blocking).
    /// Returns bytes written.
    pub fn write(&mut self, i: usize, len: usize, more: bool) -> usize {
        let j = 1 - i;
        let mut done = 0;
        if self.s[i].conn.send_check().is_err() {
            return 0;
        }
        // Every third call tries the whole-send fast path first; where it applies, the
        // general path must have planned the same copy.
        self.whole_toggle = (self.whole_toggle + 1) % 3;
        if self.whole_toggle == 0
            && !more
            && let Some(offset) = self.s[i].conn.send_fast(len)
        {
            let plan = self.s[i]
                .conn
                .send_plan(len)
                .expect("the fast path found room");
            assert_eq!(
                (plan.offset, plan.len),
                (offset, len),
                "fast and general plans differ"
            );
            let start = self.s[i].written;
            let data: Vec<u8> = (0..len as u64).map(|k| pattern(i, start + k)).collect();
            ring_write(&mut self.s[j].rx, offset, &data);
            self.s[i].written += len as u64;
            self.s[i].conn.commit_fast(len);
            self.fast_sends += 1;
            self.whole_sends += 1;
            self.deliver_cdc(i, false);
            return len;
        }
        while done < len {
            let Some(plan) = self.s[i].conn.send_plan(len - done) else {
                let eff = self.s[i].conn.send_blocked();
                self.apply(i, eff);
                break;
            };
            let start = self.s[i].written;
            let data: Vec<u8> = (0..plan.len as u64)
                .map(|k| pattern(i, start + k))
                .collect();
            match self.s[i].conn.config().tx_buffer {
                TxBuffer::NoCopy => ring_write(&mut self.s[j].rx, plan.offset, &data),
                TxBuffer::Staged { .. } => ring_write(&mut self.s[i].sndbuf, plan.offset, &data),
            }
            self.s[i].written += plan.len as u64;
            done += plan.len;
            let f = SendFlags {
                more,
                oob: false,
                last: done == len,
            };
            // Both ways of finishing a piece: the data path's fast one where it applies
            // (every other piece), and the general one.
            self.fast_toggle = !self.fast_toggle;
            if self.fast_toggle && self.s[i].conn.sent_fast(plan.len, f) {
                self.fast_sends += 1;
                self.deliver_cdc(i, false);
                continue;
            }
            let eff = self.s[i].conn.sent(plan.len, f);
            self.apply(i, eff);
        }
        done
    }

    /// Side `i`'s application reads up to `len` bytes; every byte is checked. Returns bytes
    /// read.
    pub fn read(&mut self, i: usize, len: usize) -> usize {
        let j = 1 - i;
        let mut done = 0;
        while done < len {
            match self.s[i].conn.recv_ready() {
                Ok(RecvReady::Data(_)) => {}
                Ok(RecvReady::Eof) => {
                    self.s[i].eof = true;
                    break;
                }
                Ok(RecvReady::Empty) => break,
                Err(_) => {
                    self.s[i].error = true;
                    break;
                }
            }
            let Some(plan) = self.s[i].conn.recv_plan(len - done) else {
                break;
            };
            let mut buf = vec![0u8; plan.len];
            ring_read(&self.s[i].rx, plan.offset, &mut buf);
            for (k, b) in buf.iter().enumerate() {
                let pos = self.s[i].read + k as u64;
                assert_eq!(
                    *b,
                    pattern(j, pos),
                    "side {i} read a wrong byte at stream position {pos}"
                );
            }
            self.s[i].read += plan.len as u64;
            done += plan.len;
            let eff = self.s[i].conn.received(plan.len);
            self.apply(i, eff);
        }
        done
    }

    /// Delivers the next CDC to side `i`. Returns whether there was one.
    pub fn deliver(&mut self, i: usize) -> bool {
        let Some(cdc) = self.s[i].inbox.pop_front() else {
            return false;
        };
        match self.s[i].conn.on_cdc(&cdc) {
            Ok(eff) => self.apply(i, eff),
            Err(v) => panic!("side {i}: an honest peer's CDC was refused: {v} ({cdc:?})"),
        }
        true
    }

    /// Delivers the next send completion to side `i`.
    pub fn complete(&mut self, i: usize) -> bool {
        let Some(seq) = self.s[i].completions.pop_front() else {
            return false;
        };
        self.s[i].done_seq = seq;
        let eff = self.s[i].conn.on_cdc_complete(seq);
        self.apply(i, eff);
        true
    }

    /// The application of side `i` closes.
    pub fn close(&mut self, i: usize) {
        self.s[i].closed = true;
        let eff = self.s[i].conn.close(self.now);
        self.apply(i, eff);
    }

    /// The application of side `i` shuts down writing; it writes nothing more.
    pub fn shutdown_write(&mut self, i: usize) {
        self.s[i].to_write = self.s[i].written;
        let eff = self.s[i].conn.shutdown_write();
        self.apply(i, eff);
    }

    /// The next timer of either side.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.s.iter().filter_map(|s| s.conn.poll_timeout()).min()
    }

    /// Checks the invariants both sides must keep after every step.
    pub fn check(&self) {
        for (i, side) in self.s.iter().enumerate() {
            let p = side.conn.positions();
            let c = side.conn.config();
            assert!(
                p.confirmed <= p.consumed && p.consumed <= p.produced,
                "side {i}: {p:?}"
            );
            assert!(p.fin <= p.sent && p.sent <= p.prepared, "side {i}: {p:?}");
            assert!(p.peer_consumed <= p.sent, "side {i}: {p:?}");
            assert!(
                p.sent - p.peer_consumed <= c.tx_ring as u64,
                "side {i} overran the peer's ring: {p:?}"
            );
            assert!(
                p.produced - p.consumed <= c.rx_ring as u64,
                "side {i}: {p:?}"
            );
            if let TxBuffer::Staged { len } = c.tx_buffer {
                assert!(
                    p.prepared - p.fin <= len as u64,
                    "side {i} overran its sndbuf: {p:?}"
                );
            }
        }
    }

    /// Runs both applications and the network until nothing more can happen: each side writes
    /// what it still wants to write and reads what it can; CDCs and completions are delivered;
    /// when everything is quiet the clock jumps to the next timer. Panics (a livelock) after
    /// `bound` steps.
    pub fn drive(&mut self, bound: usize) {
        loop {
            self.steps += 1;
            assert!(
                self.steps < bound,
                "livelock: no end after {bound} steps: {self:#?}"
            );
            let mut progress = false;
            for i in 0..2 {
                let want = self.s[i]
                    .to_write
                    .saturating_sub(self.s[i].written)
                    .min(self.write_size as u64);
                if want > 0 && !self.s[i].closed {
                    progress |= self.write(i, want as usize, false) > 0;
                }
                if !self.s[i].closed && !self.s[i].eof && !self.s[i].error {
                    progress |= self.read(i, self.read_size) > 0;
                    // End of stream or an error is progress too.
                    if let Ok(RecvReady::Eof) | Err(_) = self.s[i].conn.recv_ready()
                        && !self.s[i].eof
                        && !self.s[i].error
                    {
                        self.read(i, 1);
                        progress = true;
                    }
                }
            }
            for i in 0..2 {
                progress |= self.deliver(i);
                progress |= self.complete(i);
            }
            self.check();
            if self.through_copies {
                for i in 0..2 {
                    assert!(
                        self.s[i].conn.owns_no_heap(),
                        "an SMC-D state owns heap memory"
                    );
                    // What a turn at a shared connection does: the next holder starts from a
                    // copy of the state the last one left.
                    self.s[i].conn = self.s[i].conn.clone();
                }
                self.copied += 1;
            }
            if progress {
                continue;
            }
            match self.next_timeout() {
                Some(t) if t > self.now => {
                    self.now = t;
                    for i in 0..2 {
                        let eff = self.s[i].conn.handle_timeout(self.now);
                        self.apply(i, eff);
                    }
                }
                Some(_) => {
                    for i in 0..2 {
                        let eff = self.s[i].conn.handle_timeout(self.now);
                        self.apply(i, eff);
                    }
                    if self.next_timeout().is_some_and(|t| t <= self.now) {
                        panic!("a timer that does not go away: {self:#?}");
                    }
                }
                None => return,
            }
        }
    }

    /// Both applications write everything, shut down writing (so each reads to the end of the
    /// other's stream), then close; the pair is driven to the end.
    pub fn finish(&mut self, bound: usize) {
        self.drive(bound);
        for i in 0..2 {
            if !self.s[i].closed && self.s[i].conn.send_check().is_ok() {
                self.shutdown_write(i);
            }
        }
        self.drive(bound);
        for i in 0..2 {
            if !self.s[i].closed {
                self.close(i);
            }
        }
        self.drive(bound);
        // The TCP connections go away after the close flags were written.
        for i in 0..2 {
            if self.s[1 - i].tcp != TcpAction::None {
                let eff = self.s[i].conn.tcp_gone();
                self.apply(i, eff);
            }
        }
        self.drive(bound);
    }

    /// Both sides are closed.
    pub fn both_closed(&self) -> bool {
        self.s.iter().all(|s| s.conn.state() == SmcState::Closed)
    }

    /// The link under both connections goes down and they move to another one: of the CDCs
    /// in flight towards side `i` the first `keep[i]` had arrived and the rest are lost, no
    /// send completion comes any more, and whatever the lost RDMA WRITEs would have put into
    /// a ring is garbage (every byte not yet announced to its reader). Then each side fails
    /// over: its validation CDC and its rewrite go out on the new link.
    pub fn link_down(&mut self, keep: [usize; 2]) {
        for (i, keep) in keep.into_iter().enumerate() {
            // A CDC whose completion the sender has seen has arrived.
            let done = self.s[1 - i].done_seq;
            let arrived = self.s[i]
                .inbox
                .iter()
                .take_while(|c| !smc_proto::cdc::seqno_before(done, c.seqno))
                .count();
            for _ in 0..keep.max(arrived).min(self.s[i].inbox.len()) {
                self.deliver(i);
            }
        }
        for i in 0..2 {
            self.s[i].inbox.clear();
            self.s[i].completions.clear();
            let p = self.s[i].conn.positions();
            let ring = self.s[i].rx.len() as u64;
            for pos in p.produced..p.consumed + ring {
                self.s[i].rx[(pos % ring) as usize] = 0xee;
            }
        }
        for i in 0..2 {
            let (validation, eff) = self.s[i].conn.failover();
            assert!(
                validation.pflags.failover_validation(),
                "the validation CDC carries its flag"
            );
            self.s[1 - i].inbox.push_back(validation);
            self.s[i].completions.push_back(validation.seqno);
            self.apply(i, eff);
        }
    }

    /// Advances the clock by `d` and runs timers.
    pub fn tick(&mut self, d: Duration) {
        self.now = self.now + d;
        for i in 0..2 {
            let eff = self.s[i].conn.handle_timeout(self.now);
            self.apply(i, eff);
        }
    }
}
