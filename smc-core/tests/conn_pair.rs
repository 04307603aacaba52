//! Two connection cores against each other (the `Pair` harness in `common`): streams arrive
//! byte-exact for every buffer combination, nothing deadlocks, and the kernel's send and
//! receive rules hold.

mod common;

use common::{Pair, pattern, ring_read, ring_write, smcd_cfgs, smcr_cfgs};
use proptest::prelude::*;
use smc_core::close::{AbortKind, SmcState};
use smc_core::conn::{
    Config, Connection, Effects, HostCdc, OobError, RecvReady, SendFlags, TcpAction, Violation,
};
use smc_core::cursor::to_cursor;
use smc_core::time::Instant;
use smc_proto::cdc::{ConnStateFlags, Cursor, ProducerFlags};
use std::time::Duration;

/// The DMB/RMB sizes the kernel can pick: 16 KiB to 1 MiB.
const SIZES: [usize; 7] = [
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
];

/// SMC-D rings lose 32 bytes to the CDC header.
fn smcd_ring(dmb: usize) -> usize {
    dmb - 32
}

const BOUND: usize = 200_000;

/// An SMC-D connection's state owns no heap memory at any step (so processes that share it
/// after a fork can keep it in memory they share), and a state replaced by its copy after
/// every step streams byte-exact both ways and closes; an SMC-R state, with completions, is
/// not such plain data.
#[test]
fn smcd_states_own_no_heap_and_carry_over_as_copies() {
    let mut p = Pair::smcd(smcd_cfgs(smcd_ring(64 << 10), smcd_ring(16 << 10)));
    p.through_copies = true;
    p.s[0].to_write = 300_001;
    p.s[1].to_write = 100_003;
    p.write_size = 5000;
    p.read_size = 3000;
    p.finish(BOUND);
    assert_eq!(p.s[1].read, 300_001);
    assert_eq!(p.s[0].read, 100_003);
    assert!(p.both_closed() && p.s[0].freed && p.s[1].freed);
    assert!(p.copied > 100, "{} steps carried over as copies", p.copied);
    let r = Pair::smcr(smcr_cfgs(64 << 10, 64 << 10, 64 << 10, 64 << 10));
    assert!(!r.s[0].conn.owns_no_heap());
}

#[test]
fn every_smcd_buffer_pair_streams_both_ways() {
    for &a in &SIZES {
        for &b in &SIZES {
            let mut p = Pair::smcd(smcd_cfgs(smcd_ring(a), smcd_ring(b)));
            let total = 3 * a.max(b) as u64 + 12345;
            p.s[0].to_write = total;
            p.s[1].to_write = total / 2 + 7;
            p.write_size = 5000;
            p.read_size = 3000;
            p.finish(BOUND);
            assert_eq!(p.s[1].read, total, "a={a} b={b}");
            assert_eq!(p.s[0].read, total / 2 + 7, "a={a} b={b}");
            assert!(
                p.both_closed(),
                "a={a} b={b}: {:?} {:?}",
                p.s[0].conn.state(),
                p.s[1].conn.state()
            );
            assert!(p.s[0].freed && p.s[1].freed);
            // Both ways of finishing a write ran (the fast one is checked against the
            // general one on every call in debug builds).
            assert!(p.fast_sends > 0, "a={a} b={b}: the fast path never applied");
            assert!(
                p.whole_sends > 0,
                "a={a} b={b}: the whole-send fast path never applied"
            );
        }
    }
}

#[test]
fn every_smcr_wmem_rmem_pair_streams_both_ways() {
    for &wmem in &SIZES {
        for &rmem in &SIZES {
            // SMC-R buffers stop at 512 KiB in the kernel; the core does not care.
            let mut p = Pair::smcr(smcr_cfgs(rmem, wmem, rmem, wmem));
            let total = 2 * wmem.max(rmem) as u64 + 999;
            p.s[0].to_write = total;
            p.s[1].to_write = total / 3;
            p.write_size = 7000;
            p.read_size = 2500;
            p.finish(BOUND);
            assert_eq!(p.s[1].read, total, "wmem={wmem} rmem={rmem}");
            assert_eq!(p.s[0].read, total / 3, "wmem={wmem} rmem={rmem}");
            assert!(p.both_closed(), "wmem={wmem} rmem={rmem}");
        }
    }
}

/// Defect 1 of the issue at core level: a reader with a 1 MiB ring and a writer that reads
/// tiny amounts on the other side must still stream (the writer is limited by the peer's ring,
/// and a blocked writer gets a consumer update as soon as anything was read).
#[test]
fn small_sender_buffer_large_receiver_ring() {
    let mut p = Pair::smcd(smcd_cfgs(smcd_ring(64 << 10), smcd_ring(1 << 20)));
    p.s[0].to_write = 64 << 20;
    p.write_size = 1 << 20;
    p.read_size = 65536;
    p.finish(BOUND);
    assert_eq!(p.s[1].read, 64 << 20);
}

/// A writer that fills the ring and blocks asks for an update; the reader answers as soon as it
/// sees the request, even if it read less than the update limit.
#[test]
fn blocked_writer_is_answered() {
    let ring = smcd_ring(64 << 10);
    let mut p = Pair::smcd(smcd_cfgs(ring, ring));
    // Side 1 reads 100 bytes before side 0 blocks: below the limit, nothing is confirmed.
    p.write(0, 1000, false);
    p.deliver(1);
    assert_eq!(p.read(1, 100), 100);
    assert_eq!(
        p.s[1].conn.positions().confirmed,
        0,
        "100 bytes are below the update limit"
    );
    // Side 0 fills the ring and blocks.
    p.write(0, ring, false);
    assert!(p.s[0].conn.send_plan(1).is_none());
    let cdc = p.s[1]
        .inbox
        .back()
        .copied()
        .expect("the block was published");
    assert!(cdc.pflags.write_blocked() && cdc.pflags.cons_curs_upd_req());
    p.deliver(1);
    assert_eq!(
        p.s[1].conn.positions().confirmed,
        100,
        "the request is answered at once"
    );
    p.deliver(0);
    assert_eq!(p.s[0].conn.send_space(), 100);
}

#[test]
fn autosplit_cuts_large_writes() {
    let ring = smcd_ring(1 << 20);
    let mut cfg = smcd_cfgs(ring, ring);
    cfg[0].autosplit_size = 128 << 10;
    let mut p = Pair::smcd(cfg);
    p.write(0, 1 << 19, false);
    assert_eq!(
        p.s[0].max_announce,
        128 << 10,
        "each CDC announces one autosplit piece"
    );
    assert_eq!(p.s[0].cdcs_sent, 4);
    // Below 4/3 of the size nothing is cut.
    let mut cfg = smcd_cfgs(ring, ring);
    cfg[0].autosplit_size = 128 << 10;
    let mut p = Pair::smcd(cfg);
    p.write(0, (128 << 10) * 4 / 3 - 1, false);
    assert_eq!(p.s[0].cdcs_sent, 1);
}

#[test]
fn autocork_holds_small_sends_while_a_cdc_is_in_flight() {
    let mut p = Pair::smcr(smcr_cfgs(65536, 65536, 65536, 65536));
    p.write(0, 10, false);
    assert_eq!(p.s[0].cdcs_sent, 1, "the first send is never corked");
    p.write(0, 10, false);
    p.write(0, 10, false);
    assert_eq!(
        p.s[0].cdcs_sent, 1,
        "held back while the first CDC is in flight"
    );
    assert_eq!(p.s[0].conn.unsent(), 20);
    p.complete(0);
    assert_eq!(p.s[0].cdcs_sent, 2, "the completion pushes what was held");
    assert_eq!(p.s[0].conn.unsent(), 0);
    // Large sends are not corked.
    p.write(0, 40000, false);
    assert_eq!(p.s[0].cdcs_sent, 3);
    // SMC-D never autocorks: its CDCs complete when they are made.
    let mut p = Pair::smcd(smcd_cfgs(65504, 65504));
    for _ in 0..3 {
        p.write(0, 10, false);
    }
    assert_eq!(p.s[0].cdcs_sent, 3);
}

#[test]
fn cork_and_more_hold_until_pushed() {
    let mut p = Pair::smcd(smcd_cfgs(65504, 65504));
    p.write(0, 10, true);
    assert_eq!(p.s[0].cdcs_sent, 0, "MSG_MORE holds while there is room");
    p.write(0, 10, false);
    assert_eq!(p.s[0].cdcs_sent, 1);
    let eff = p.s[0].conn.set_cork(true);
    p.apply(0, eff);
    p.write(0, 10, false);
    assert_eq!(p.s[0].cdcs_sent, 1, "TCP_CORK holds");
    let eff = p.s[0].conn.set_cork(false);
    p.apply(0, eff);
    assert_eq!(p.s[0].cdcs_sent, 2, "uncork pushes");
    // A corked write that fills the buffer goes out.
    let eff = p.s[0].conn.set_cork(true);
    p.apply(0, eff);
    p.write(0, 65504 - 30, false);
    assert_eq!(p.s[0].conn.unsent(), 0, "a full buffer is never held back");
}

/// nginx's way: TCP_CORK on, headers and body written, close with the cork still on. The
/// close pushes everything and closes at once (an SMC-D CDC completes when it is made, so
/// nothing is left to wait for); it once waited for a completion that never comes, and the
/// peer saw a reset after the bytes.
#[test]
fn close_while_corked_pushes_and_closes() {
    let mut p = Pair::smcd(smcd_cfgs(65504, 65504));
    let eff = p.s[0].conn.set_cork(true);
    p.apply(0, eff);
    p.write(0, 200, false);
    p.write(0, 4096, false);
    assert_eq!(p.s[0].cdcs_sent, 0, "TCP_CORK holds");
    p.close(0);
    assert!(!p.s[0].conn.is_draining(), "the close waits for nothing");
    p.deliver(1);
    assert_eq!(p.read(1, 8192), 4296, "every byte arrives");
    p.close(1);
    p.finish(64);
    assert!(p.both_closed());
    assert!(!p.s[1].conn.is_aborted(), "an orderly close, not an abort");
}

#[test]
fn window_update_rule_is_the_kernels() {
    // A reader that consumes in small pieces confirms only past max(ring/10, 2304) and only
    // when the writer's view of free space is at most half.
    let ring = smcd_ring(64 << 10);
    let limit = ring / 10;
    let mut p = Pair::smcd(smcd_cfgs(ring, ring));
    p.write(0, ring / 4, false);
    p.deliver(1);
    p.read(1, limit + 1);
    assert_eq!(
        p.s[1].conn.positions().confirmed,
        0,
        "the writer still sees 3/4 free"
    );
    p.write(0, ring / 2, false);
    p.deliver(1);
    p.read(1, 1);
    assert_eq!(
        p.s[1].conn.positions().confirmed,
        limit as u64 + 2,
        "beyond the limit with at most half free: confirmed"
    );
}

fn oob_pair(inline: bool) -> Pair {
    let mut p = Pair::smcd(smcd_cfgs(65504, 65504));
    p.s[1].conn.set_oob_inline(inline);
    p
}

/// Writes `data` as side 0's stream bytes (overriding the pattern), `oob` marking urgent data.
fn send_bytes(p: &mut Pair, data: &[u8], oob: bool) {
    let plan = p.s[0].conn.send_plan(data.len()).expect("room");
    assert_eq!(plan.len, data.len());
    ring_write(&mut p.s[1].rx, plan.offset, data);
    p.s[0].written += data.len() as u64;
    let eff = p.s[0].conn.sent(
        data.len(),
        SendFlags {
            more: false,
            oob,
            last: true,
        },
    );
    p.apply(0, eff);
}

fn recv_bytes(p: &mut Pair, max: usize) -> Vec<u8> {
    let Some(plan) = p.s[1].conn.recv_plan(max) else {
        return vec![];
    };
    let mut buf = vec![0; plan.len];
    ring_read(&p.s[1].rx, plan.offset, &mut buf);
    let eff = p.s[1].conn.received(plan.len);
    p.apply(1, eff);
    buf
}

#[test]
fn urgent_data_out_of_band() {
    let mut p = oob_pair(false);
    send_bytes(&mut p, b"abc", false);
    send_bytes(&mut p, b"deX", true);
    assert_eq!(
        p.s[0].conn.send_space(),
        0,
        "nothing more until the peer reached the mark"
    );
    p.deliver(1);
    assert!(p.s[1].conn.urgent_pending());
    assert_eq!(
        p.s[1].conn.recv_oob(false),
        Ok(b'X'),
        "readable before the stream reaches it"
    );
    assert_eq!(
        recv_bytes(&mut p, 100),
        b"abcde",
        "a read stops before the urgent byte"
    );
    assert!(p.s[1].conn.at_mark());
    assert_eq!(
        p.s[1].conn.recv_oob(false),
        Err(OobError::Invalid),
        "only once"
    );
    // Reaching the mark is reported at once, which lets the sender go on.
    p.deliver(0);
    assert!(p.s[0].conn.send_space() > 0);
    send_bytes(&mut p, b"fgh", false);
    p.deliver(1);
    assert_eq!(
        recv_bytes(&mut p, 100),
        b"fgh",
        "the urgent byte is not in the stream"
    );
    assert!(!p.s[1].conn.at_mark());
    assert!(!p.s[1].conn.urgent_pending());

    // The same with a peek first and the stream read before the urgent byte is taken.
    let mut p = oob_pair(false);
    send_bytes(&mut p, b"X", true);
    p.deliver(1);
    assert!(p.s[1].conn.at_mark());
    assert_eq!(p.s[1].conn.recv_oob(true), Ok(b'X'), "peek leaves it");
    assert_eq!(p.s[1].conn.recv_oob(false), Ok(b'X'));
    assert_eq!(
        p.s[1].conn.readable(),
        0,
        "the urgent byte alone is not stream data"
    );
}

#[test]
fn urgent_data_inline() {
    let mut p = oob_pair(true);
    send_bytes(&mut p, b"abc", false);
    send_bytes(&mut p, b"X", true);
    p.deliver(1);
    assert_eq!(recv_bytes(&mut p, 100), b"abc");
    assert!(p.s[1].conn.at_mark());
    assert_eq!(
        p.s[1].conn.recv_oob(false),
        Err(OobError::Invalid),
        "SO_OOBINLINE"
    );
    p.deliver(0);
    send_bytes(&mut p, b"def", false);
    p.deliver(1);
    assert_eq!(recv_bytes(&mut p, 100), b"Xdef");
}

#[test]
fn staged_close_drains_then_times_out() {
    let mut p = Pair::smcr(smcr_cfgs(16384, 65536, 16384, 65536));
    // Side 1 does not read: side 0's bytes beyond side 1's ring stay in its send buffer.
    p.write(0, 30000, false);
    p.deliver(1);
    p.complete(0);
    assert!(p.s[0].conn.unsent() > 0);
    p.close(0);
    assert!(
        p.s[0].conn.is_draining(),
        "the close waits for queued bytes"
    );
    assert_eq!(p.s[0].conn.state(), SmcState::Active);
    // The reader reads: space opens, the rest is sent and completes, the close goes out.
    p.drive(BOUND);
    assert!(!p.s[0].conn.is_draining());
    assert_eq!(p.s[1].read, 30000);
    assert!(p.s[1].eof);

    // Again, with a reader that never reads: the linger time ends the wait.
    let mut p = Pair::smcr(smcr_cfgs(16384, 65536, 16384, 65536));
    p.write(0, 30000, false);
    p.deliver(1);
    p.complete(0);
    p.close(0);
    let deadline = p.next_timeout().expect("a drain deadline");
    assert_eq!(deadline, Instant::ZERO + Duration::from_secs(2));
    p.tick(Duration::from_secs(2));
    assert!(!p.s[0].conn.is_draining());
    assert_eq!(p.s[0].conn.state(), SmcState::PeerCloseWait1);
}

#[test]
fn close_with_unread_data_resets_the_peer() {
    let mut p = Pair::smcd(smcd_cfgs(65504, 65504));
    p.write(0, 100, false);
    p.deliver(1);
    p.close(1);
    assert_eq!(p.s[1].tcp, TcpAction::Abort);
    p.deliver(0);
    assert_eq!(p.s[0].conn.error(), Some(AbortKind::Reset));
    assert_eq!(p.s[0].conn.recv_ready(), Err(AbortKind::Reset));
}

/// `SO_LINGER` `{1, 0}`: the close is an abort even with nothing unread; the peer's reads fail
/// with `ECONNRESET`.
#[test]
fn close_with_linger_zero_resets_the_peer() {
    let mut p = Pair::smcd(smcd_cfgs(65504, 65504));
    p.s[1].closed = true;
    let eff = p.s[1].conn.close_reset();
    p.apply(1, eff);
    assert_eq!(p.s[1].tcp, TcpAction::Abort);
    p.deliver(0);
    assert_eq!(p.s[0].conn.error(), Some(AbortKind::Reset));
    assert_eq!(p.s[0].conn.recv_ready(), Err(AbortKind::Reset));
}

#[test]
fn half_close_delivers_everything_then_eof() {
    let mut p = Pair::smcd(smcd_cfgs(16352, 16352));
    p.s[0].to_write = 100_000;
    p.s[1].to_write = 50_000;
    p.drive(BOUND);
    p.shutdown_write(0);
    p.drive(BOUND);
    assert!(p.s[1].eof);
    assert_eq!(p.s[1].read, 100_000);
    // Side 1 can still send after side 0's shutdown(SHUT_WR).
    assert_eq!(p.s[0].read, 50_000);
    p.finish(BOUND);
    assert!(p.both_closed());
}

fn cdc(prod: Cursor, cons: Cursor) -> HostCdc {
    HostCdc {
        seqno: 0,
        prod,
        cons,
        pflags: ProducerFlags::EMPTY,
        cflags: ConnStateFlags::EMPTY,
    }
}

#[test]
fn hostile_cdcs_are_refused_and_change_nothing() {
    let ring = 16352;
    let mut c = Connection::new(Config::smcd(ring, ring));
    let before = c.positions();
    // More than the ring.
    let e = c.on_cdc(&cdc(to_cursor(ring as u64 + 1, ring), Cursor::ZERO));
    assert!(matches!(e, Err(Violation::ProducerCursor(_))));
    // Outside the ring.
    let e = c.on_cdc(&cdc(
        Cursor {
            wrap: 0,
            count: ring as u32,
        },
        Cursor::ZERO,
    ));
    assert!(matches!(e, Err(Violation::ProducerCursor(_))));
    // Confirming bytes we never sent.
    let e = c.on_cdc(&cdc(Cursor::ZERO, to_cursor(1, ring)));
    assert!(matches!(e, Err(Violation::ConsumerCursor(_))));
    // An urgent flag without data marks nothing.
    let mut bad = cdc(Cursor::ZERO, Cursor::ZERO);
    bad.pflags = ProducerFlags::URG_DATA_PRESENT;
    let _ = c.on_cdc(&bad).unwrap();
    assert!(!c.urgent_pending());
    assert_eq!(c.positions(), before);
    // A legal one still works, and going backwards afterwards is refused.
    let _ = c.on_cdc(&cdc(to_cursor(100, ring), Cursor::ZERO)).unwrap();
    let e = c.on_cdc(&cdc(to_cursor(50, ring), Cursor::ZERO));
    assert!(e.is_err());
    assert_eq!(c.readable(), 100);
}

#[test]
fn smcr_old_sequence_numbers_are_ignored() {
    let mut c = Connection::new(Config::smcr(16384, 16384, 16384));
    let mut m = cdc(to_cursor(10, 16384), Cursor::ZERO);
    m.seqno = 5;
    let _ = c.on_cdc(&m).unwrap();
    let mut old = cdc(to_cursor(20, 16384), Cursor::ZERO);
    old.seqno = 4;
    let _ = c.on_cdc(&old).unwrap();
    assert_eq!(c.readable(), 10, "an older CDC changes nothing");
    old.seqno = 6;
    let _ = c.on_cdc(&old).unwrap();
    assert_eq!(c.readable(), 20);
}

/// A link goes down mid-stream with CDCs and their completions lost both ways, and the bytes
/// of the lost RDMA WRITEs garbage: after the failover (validation CDC, rollback to the last
/// completed CDC, rewrite) both streams arrive byte-exact and the connection closes.
#[test]
fn smcr_failover_rewrites_what_the_lost_link_carried() {
    for keep in [[0, 0], [1, 0], [0, 3], [2, 2], [usize::MAX, 0]] {
        let mut p = Pair::smcr(smcr_cfgs(64 << 10, 32 << 10, 16 << 10, 64 << 10));
        p.s[0].to_write = 1 << 20;
        p.s[1].to_write = 300_000;
        p.write_size = 9000;
        p.read_size = 7000;
        // Traffic in both directions, some of it delivered and completed.
        for _ in 0..5 {
            p.deliver(1);
            p.deliver(0);
            p.read(1, 7000);
            p.complete(0);
            p.write(0, 9000, false);
            p.write(1, 9000, false);
        }
        assert!(!p.s[1].inbox.is_empty() || !p.s[0].completions.is_empty());
        p.link_down(keep);
        p.check();
        p.finish(BOUND);
        assert_eq!(p.s[1].read, 1 << 20, "keep {keep:?}");
        assert_eq!(p.s[0].read, 300_000, "keep {keep:?}");
        assert!(p.both_closed(), "keep {keep:?}");
        assert_eq!(p.s[0].conn.error(), None);
    }
}

/// A validation CDC naming a sequence number the receiver never saw: the sides disagree
/// about the stream, and the receiver refuses it (the driver aborts the connection).
#[test]
fn smcr_failover_validation_of_an_unseen_cdc_is_out_of_sync() {
    let mut c = Connection::new(Config::smcr(16384, 16384, 16384));
    let mut m = cdc(to_cursor(10, 16384), Cursor::ZERO);
    m.seqno = 5;
    let _ = c.on_cdc(&m).unwrap();
    let mut v = HostCdc {
        seqno: 5,
        pflags: ProducerFlags::FAILOVER_VALIDATION,
        ..HostCdc::default()
    };
    assert_eq!(c.on_cdc(&v), Ok(Effects::NONE), "CDC 5 arrived: ignored");
    assert_eq!(c.readable(), 10, "its zero cursors change nothing");
    v.seqno = 4;
    assert_eq!(c.on_cdc(&v), Ok(Effects::NONE));
    v.seqno = 6;
    assert_eq!(
        c.on_cdc(&v),
        Err(Violation::OutOfSync {
            last: 5,
            validated: 6
        })
    );
}

#[test]
fn peer_abort_wakes_and_errors() {
    let mut p = Pair::smcd(smcd_cfgs(16352, 16352));
    let eff = p.s[0].conn.abort(AbortKind::Aborted);
    assert!(eff.wake_reader() && eff.wake_writer());
    assert_eq!(eff.tcp(), TcpAction::Abort);
    let eff = p.s[1].conn.tcp_gone();
    assert!(eff.wake_reader());
    assert_eq!(p.s[1].conn.recv_ready(), Err(AbortKind::Reset));
    assert!(p.s[1].conn.send_check().is_err());
}

#[test]
fn an_active_closer_is_not_aborted_by_its_own_tcp_shutdown() {
    // crr with an event-loop server: it closes first and shuts its TCP connection down both
    // ways, so its liveness watch sees the socket hung up before the client's close arrives.
    let mut p = Pair::smcd(smcd_cfgs(16352, 16352));
    p.close(0);
    assert_eq!(p.s[0].tcp, TcpAction::Shutdown);
    assert_eq!(p.s[0].conn.state(), SmcState::PeerCloseWait1);
    let eff = p.s[0].conn.tcp_gone();
    assert_eq!(eff.tcp(), TcpAction::None);
    assert!(!p.s[0].conn.aborted_locally());
    assert_eq!(p.s[0].conn.state(), SmcState::PeerCloseWait1);
    // The peer's close still ends it in order.
    p.deliver(1);
    p.close(1);
    p.deliver(0);
    assert_eq!(p.s[0].conn.state(), SmcState::Closed);
    assert_eq!(p.s[0].conn.error(), None);
    assert!(!p.s[0].conn.aborted_locally());
}

// ----------------------------------------------------------------------------------------
// Random sequences.

#[derive(Debug, Clone)]
enum Op {
    Write(usize, usize, bool),
    Read(usize, usize),
    Deliver(usize),
    Complete(usize),
    ShutWr(usize),
    Tick,
    LinkDown(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    let side = 0usize..2;
    prop_oneof![
        4 => (side.clone(), 1usize..200_000, any::<bool>()).prop_map(|(s, n, m)| Op::Write(s, n, m)),
        4 => (side.clone(), 1usize..200_000).prop_map(|(s, n)| Op::Read(s, n)),
        4 => side.clone().prop_map(Op::Deliver),
        2 => side.clone().prop_map(Op::Complete),
        1 => side.prop_map(Op::ShutWr),
        1 => Just(Op::Tick),
        1 => (0usize..4, 0usize..4).prop_map(|(a, b)| Op::LinkDown(a, b)),
    ]
}

fn size() -> impl Strategy<Value = usize> {
    proptest::sample::select(SIZES.to_vec())
}

fn run_ops(mut p: Pair, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut shut = [false, false];
    for o in ops {
        match o {
            Op::Write(i, n, more) if !shut[i] => {
                p.s[i].to_write = p.s[i].to_write.max(p.s[i].written + n as u64);
                p.write(i, n, more);
            }
            Op::Write(..) => {}
            Op::Read(i, n) => {
                p.read(i, n);
            }
            Op::Deliver(i) => {
                p.deliver(i);
            }
            Op::Complete(i) => {
                p.complete(i);
            }
            Op::ShutWr(i) => {
                shut[i] = true;
                p.shutdown_write(i);
            }
            Op::Tick => p.tick(Duration::from_millis(500)),
            Op::LinkDown(a, b) if p.smcr => p.link_down([a, b]),
            Op::LinkDown(..) => {}
        }
        p.check();
    }
    // Whatever happened so far, both applications now write what they meant to and read to
    // the end: everything arrives, byte-exact, and both sides close.
    for i in 0..2 {
        // A write held back by MSG_MORE is pushed by the next write or by the close.
        let eff = p.s[i].conn.push();
        p.apply(i, eff);
    }
    p.write_size = 20_000;
    p.read_size = 30_000;
    p.finish(BOUND);
    for i in 0..2 {
        prop_assert_eq!(
            p.s[1 - i].read,
            p.s[i].written,
            "side {} to side {}",
            i,
            1 - i
        );
        prop_assert!(p.s[1 - i].eof);
        prop_assert_eq!(p.s[i].conn.error(), None);
    }
    prop_assert!(p.both_closed());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn smcd_random_operations(a in size(), b in size(), split in proptest::option::of(32usize << 10..256 << 10),
                              ops in proptest::collection::vec(op(), 0..60)) {
        let mut cfg = smcd_cfgs(smcd_ring(a), smcd_ring(b));
        for c in &mut cfg {
            c.autosplit_size = split.unwrap_or(0);
        }
        run_ops(Pair::smcd(cfg), ops)?;
    }

    #[test]
    fn smcr_random_operations(r0 in size(), w0 in size(), r1 in size(), w1 in size(),
                              ops in proptest::collection::vec(op(), 0..60)) {
        run_ops(Pair::smcr(smcr_cfgs(r0, w0, r1, w1)), ops)?;
    }

    /// Whatever a hostile peer puts in a CDC, the connection either refuses it or stays within
    /// its rules; it never panics.
    #[test]
    fn hostile_cdcs_never_panic(cdcs in proptest::collection::vec(
        (any::<u16>(), any::<u16>(), any::<u32>(), any::<u16>(), any::<u32>(), any::<u8>(), any::<u8>()), 1..40),
        smcr in any::<bool>(), writes in 0usize..70_000) {
        let mut c = if smcr {
            Connection::new(Config::smcr(65536, 65536, 65536))
        } else {
            Connection::new(Config::smcd(65504, 65504))
        };
        if let Some(plan) = c.send_plan(writes) {
            let _ = c.sent(plan.len, SendFlags { last: true, ..SendFlags::default() });
        }
        for (seq, pw, pc, cw, cc, pf, cf) in cdcs {
            let m = HostCdc {
                seqno: seq,
                prod: Cursor { wrap: pw, count: pc % 70_000 },
                cons: Cursor { wrap: cw, count: cc % 70_000 },
                pflags: ProducerFlags::from(pf),
                cflags: ConnStateFlags::from(cf),
            };
            let before = c.positions();
            if c.on_cdc(&m).is_err() {
                prop_assert_eq!(c.positions(), before);
            }
            let p = c.positions();
            prop_assert!(p.consumed <= p.produced && p.produced - p.consumed <= 65536);
            prop_assert!(p.peer_consumed <= p.sent);
            if let Ok(RecvReady::Data(n)) = c.recv_ready() {
                let plan = c.recv_plan(n).unwrap();
                let _ = c.received(plan.len);
            }
        }
    }
}

#[test]
fn pattern_differs_by_direction() {
    assert_ne!(
        (0..64).map(|p| pattern(0, p)).collect::<Vec<_>>(),
        (0..64).map(|p| pattern(1, p)).collect::<Vec<_>>()
    );
}
