//! The device conformance checks: what every [`Device`] must do, each a function generic over
//! the device and run on two devices that reach each other. `conformance.rs` runs them on the
//! soft RoCEv2 device, `rnic.rs` (feature `rnic`) on a real RNIC where one exists.

use smc_rdma::verbs::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CAPS: QpCaps = QpCaps {
    max_send_wr: 64,
    max_recv_wr: 64,
    max_send_sge: 2,
    // Two for the SMC-Rv2 receive layout (a 44-byte slot, then the 8 KiB v2 buffer).
    max_recv_sge: 2,
    max_inline_data: 64,
};

/// One end of a connected RC pair.
struct End<D: Device> {
    qp: D::Qp,
    scq: Arc<D::Cq>,
    rcq: Arc<D::Cq>,
    mr: D::Mr,
}

struct Link {
    mtu: Mtu,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    mem: usize,
    access: Access,
}

impl Default for Link {
    fn default() -> Self {
        Self {
            mtu: Mtu::M1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            mem: 1 << 20,
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        }
    }
}

fn gid_of<D: Device>(d: &D) -> Gid {
    d.info().ports[0].gids[0].1
}

fn end<D: Device>(d: &D, l: &Link) -> End<D> {
    let pd = d.alloc_pd();
    let scq = d.create_cq(256).unwrap();
    let rcq = d.create_cq(256).unwrap();
    let qp = d
        .create_qp(
            pd,
            QpInit {
                send_cq: Arc::clone(&scq),
                recv_cq: Arc::clone(&rcq),
                caps: CAPS,
                sq_sig_all: false,
            },
        )
        .unwrap();
    let mr = d.reg_mr(pd, Memory::new(l.mem).unwrap(), l.access).unwrap();
    End { qp, scq, rcq, mr }
}

/// Connects two QPs the way SMC-R does: INIT, RTR with the peer's QPN/PSN/GID, RTS.
fn connect<D: Device>(a: &D, b: &D, l: &Link) -> (End<D>, End<D>) {
    let (ea, eb) = (end(a, l), end(b, l));
    let (psn_a, psn_b) = (0x00ff_fff0, 0x0012_3456); // one wraps the 24-bit space soon
    for (e, peer, peer_gid, rq_psn, sq_psn) in [
        (&ea, &eb, gid_of(b), psn_b, psn_a),
        (&eb, &ea, gid_of(a), psn_a, psn_b),
    ] {
        e.qp.modify(&QpModify::Init {
            port: 1,
            access: l.access,
        })
        .unwrap();
        e.qp.modify(&QpModify::Rtr {
            path_mtu: l.mtu,
            dest_qpn: peer.qp.qp_num(),
            rq_psn,
            dgid: peer_gid,
            sgid_index: 0,
            min_rnr_timer: l.min_rnr_timer,
        })
        .unwrap();
        e.qp.modify(&QpModify::Rts {
            sq_psn,
            timeout: l.timeout,
            retry_cnt: l.retry_cnt,
            rnr_retry: l.rnr_retry,
        })
        .unwrap();
    }
    (ea, eb)
}

/// Waits for `n` completions on `cq`, by the completion channel (arm, poll, sleep).
fn wait_wcs<C: CompletionQueue>(cq: &C, n: usize, within: Duration) -> Vec<Wc> {
    use rustix::event::{PollFd, PollFlags, poll};
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [Wc::EMPTY; 16];
    while got.len() < n {
        let k = cq.poll(&mut buf);
        got.extend_from_slice(&buf[..k]);
        if k > 0 {
            continue;
        }
        if cq.req_notify(false) {
            continue; // completions arrived between poll and arm
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "{} of {n} completions within {within:?}: {got:?}",
            got.len()
        );
        let ts = rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let fd = cq.event_fd();
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        let _ = poll(&mut fds, Some(&ts));
        cq.take_event();
    }
    got
}

fn recv_all<D: Device>(e: &End<D>, slots: u64, slot_len: u32) {
    for i in 0..slots {
        e.qp.post_recv(&RecvWr {
            wr_id: 1000 + i,
            sge: Sge {
                addr: e.mr.addr() + i * u64::from(slot_len),
                len: slot_len,
                lkey: e.mr.lkey(),
            },
            spill: None,
        })
        .unwrap();
    }
}

/// Posts an inline SEND of `m` on `e`'s QP (unsolicited).
fn send_inline<D: Device>(e: &End<D>, wr_id: u64, m: &[u8], signaled: bool) {
    e.qp.post_send(&SendWr {
        wr_id,
        op: SendOp::Send,
        data: Payload::Inline(m),
        signaled,
        solicited: false,
    })
    .unwrap();
}

/// Waits until a thread serves `cq` ([`CompletionQueue::serve`]): while one does, a probe
/// that asks is declined.
fn until_served<C: CompletionQueue>(cq: &C, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while cq.serve(&|| true, Some(Duration::ZERO), Duration::ZERO) != Served::Declined {
        assert!(
            Instant::now() < deadline,
            "{what}: the thread never served the device"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    cq.unserved_wait_over();
}

/// Sets a handler on `cq` that counts its runs and wakes the thread serving the device, as
/// the engine's does; `None` for a device that cannot be served (no thread of its own).
fn served_counter<C: CompletionQueue + 'static>(
    cq: &Arc<C>,
) -> Option<Arc<std::sync::atomic::AtomicUsize>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let ran = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&ran);
    let w = Arc::downgrade(cq);
    let h: CqHandler = Arc::new(move || {
        r.fetch_add(1, Ordering::SeqCst);
        if let Some(cq) = w.upgrade() {
            cq.wake_server();
        }
    });
    (cq.set_handler(h)
        && cq.serve(&|| true, Some(Duration::ZERO), Duration::ZERO) != Served::Declined)
        .then_some(ran)
}

/// Serves `cq`'s device until the counter of [`served_counter`] reaches `k`; a decline (a
/// probe of another thread held the device for a moment) is asked again.
fn serve_until<C: CompletionQueue + ?Sized>(
    cq: &C,
    ran: &std::sync::atomic::AtomicUsize,
    k: usize,
    what: &str,
) {
    let done = || ran.load(std::sync::atomic::Ordering::SeqCst) >= k;
    loop {
        match cq.serve(&done, Some(Duration::from_secs(20)), Duration::ZERO) {
            Served::Declined => {
                cq.unserved_wait_over();
                std::thread::sleep(Duration::from_millis(1));
            }
            r => {
                assert_eq!(r, Served::Woken, "{what} {k}");
                return;
            }
        }
    }
}

/// Whether `cq`'s completion channel becomes readable within `ms` milliseconds.
fn channel_readable<C: CompletionQueue>(cq: &C, ms: i64) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let ts = rustix::time::Timespec {
        tv_sec: ms / 1000,
        tv_nsec: (ms % 1000) * 1_000_000,
    };
    let fd = cq.event_fd();
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    matches!(poll(&mut fds, Some(&ts)), Ok(1))
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

// ---- the checks, generic over the device ----

pub fn send_inline_and_write_two_sges<D: Device>(a: &D, b: &D) {
    let l = Link::default();
    let (ea, eb) = connect(a, b, &l);
    recv_all(&eb, 4, 64);
    // A 44-byte inline SEND, solicited, as a CDC is.
    let cdc = pattern(44, 7);
    ea.qp
        .post_send(&SendWr {
            wr_id: 1,
            op: SendOp::Send,
            data: Payload::Inline(&cdc),
            signaled: true,
            solicited: true,
        })
        .unwrap();
    let r = wait_wcs(&*eb.rcq, 1, Duration::from_secs(5));
    assert_eq!(r[0].status, WcStatus::Success);
    assert_eq!(r[0].opcode, WcOpcode::Recv);
    assert_eq!(
        (r[0].wr_id, r[0].byte_len, r[0].solicited),
        (1000, 44, true)
    );
    let mut got = vec![0; 44];
    eb.mr.memory().read(0, &mut got);
    assert_eq!(got, cdc);
    let s = wait_wcs(&*ea.scq, 1, Duration::from_secs(5));
    assert_eq!(
        (s[0].wr_id, s[0].status, s[0].opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );

    // An RDMA WRITE of two SGEs (a wrapped send buffer) into the peer's region at an offset,
    // many packets long.
    let part1 = pattern(70_000, 1);
    let part2 = pattern(33_333, 2);
    ea.mr.memory().write(4096, &part1);
    ea.mr.memory().write(300_000, &part2);
    let sges = [
        Sge {
            addr: ea.mr.addr() + 4096,
            len: part1.len() as u32,
            lkey: ea.mr.lkey(),
        },
        Sge {
            addr: ea.mr.addr() + 300_000,
            len: part2.len() as u32,
            lkey: ea.mr.lkey(),
        },
    ];
    ea.qp
        .post_send(&SendWr {
            wr_id: 2,
            op: SendOp::Write {
                remote_addr: eb.mr.addr() + 500_001,
                rkey: eb.mr.rkey(),
            },
            data: Payload::Sges(&sges),
            signaled: true,
            solicited: false,
        })
        .unwrap();
    let s = wait_wcs(&*ea.scq, 1, Duration::from_secs(5));
    assert_eq!(
        (s[0].wr_id, s[0].status, s[0].opcode),
        (2, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    // The completion means the peer has it all.
    let mut got = vec![0; part1.len() + part2.len()];
    eb.mr.memory().read(500_001, &mut got);
    assert_eq!(&got[..part1.len()], &part1[..]);
    assert_eq!(&got[part1.len()..], &part2[..]);
}

pub fn unsignaled_writes_complete_silently_and_in_order<D: Device>(a: &D, b: &D) {
    let l = Link::default();
    let (ea, eb) = connect(a, b, &l);
    recv_all(&eb, 1, 64); // at offset 0, clear of the writes
    for i in 0..20u64 {
        let d = pattern(3000, i as u8);
        ea.qp
            .post_send(&SendWr {
                wr_id: i,
                op: SendOp::Write {
                    remote_addr: eb.mr.addr() + 100_000 + i * 3000,
                    rkey: eb.mr.rkey(),
                },
                data: Payload::Inline(&d[..64]),
                signaled: false,
                solicited: false,
            })
            .unwrap();
    }
    ea.qp
        .post_send(&SendWr {
            wr_id: 99,
            op: SendOp::Send,
            data: Payload::Inline(b"done"),
            signaled: true,
            solicited: false,
        })
        .unwrap();
    // RC order: when the SEND lands, every WRITE before it did.
    let r = wait_wcs(&*eb.rcq, 1, Duration::from_secs(5));
    assert_eq!(r[0].byte_len, 4);
    for i in 0..20u64 {
        let mut got = [0u8; 64];
        eb.mr.memory().read(100_000 + (i * 3000) as usize, &mut got);
        assert_eq!(&got[..], &pattern(3000, i as u8)[..64], "write {i}");
    }
    let s = wait_wcs(&*ea.scq, 1, Duration::from_secs(5));
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].wr_id, 99, "only the signaled request completes");
    std::thread::sleep(Duration::from_millis(20));
    let mut more = [s[0]; 4];
    assert_eq!(ea.scq.poll(&mut more), 0);
}

pub fn remote_access_errors_fail_the_request_and_flush_the_rest<D: Device>(a: &D, b: &D) {
    for case in ["bounds", "rkey", "rights"] {
        let mut l = Link::default();
        if case == "rights" {
            l.access = Access::LOCAL_WRITE;
        }
        let (ea, eb) = connect(a, b, &l);
        let (addr, rkey) = match case {
            "bounds" => (eb.mr.addr() + eb.mr.len() as u64 - 10, eb.mr.rkey()),
            "rkey" => (eb.mr.addr(), eb.mr.rkey() ^ 0x5500),
            _ => (eb.mr.addr(), eb.mr.rkey()),
        };
        let wr = |id| SendWr {
            wr_id: id,
            op: SendOp::Write {
                remote_addr: addr,
                rkey,
            },
            data: Payload::Inline(&[0xab; 20]),
            signaled: false,
            solicited: false,
        };
        // The second is posted before or after the first failed: flushed either way.
        ea.qp.post_send(&wr(1)).unwrap();
        ea.qp.post_send(&wr(2)).unwrap();
        let s = wait_wcs(&*ea.scq, 2, Duration::from_secs(5));
        assert_eq!(
            (s[0].wr_id, s[0].status),
            (1, WcStatus::RemAccessErr),
            "{case}"
        );
        assert_eq!(
            (s[1].wr_id, s[1].status),
            (2, WcStatus::WrFlushErr),
            "{case}"
        );
        assert_eq!(ea.qp.state(), QpState::Error, "{case}");
        ea.qp.post_send(&wr(3)).unwrap();
        let s = wait_wcs(&*ea.scq, 1, Duration::from_secs(5));
        assert_eq!(
            (s[0].wr_id, s[0].status),
            (3, WcStatus::WrFlushErr),
            "{case}"
        );
        // Nothing was written.
        let mut got = [0u8; 10];
        eb.mr.memory().read(eb.mr.len() - 10, &mut got);
        assert_eq!(got, [0; 10], "{case}");
    }
}

pub fn a_send_without_a_receive_waits_for_one<D: Device>(a: &D, b: &D) {
    let l = Link::default();
    let (ea, eb) = connect(a, b, &l);
    ea.qp
        .post_send(&SendWr {
            wr_id: 5,
            op: SendOp::Send,
            data: Payload::Inline(b"early"),
            signaled: true,
            solicited: false,
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut none = [Wc::EMPTY; 1];
    assert_eq!(
        ea.scq.poll(&mut none),
        0,
        "a send completes only once received"
    );
    recv_all(&eb, 1, 64);
    let r = wait_wcs(&*eb.rcq, 1, Duration::from_secs(5));
    assert_eq!(r[0].byte_len, 5);
    let s = wait_wcs(&*ea.scq, 1, Duration::from_secs(5));
    assert_eq!(s[0].status, WcStatus::Success);

    // With no RNR retries left the request fails instead.
    let l = Link {
        rnr_retry: 1,
        ..Link::default()
    };
    let (ea, _eb) = connect(a, b, &l);
    ea.qp
        .post_send(&SendWr {
            wr_id: 6,
            op: SendOp::Send,
            data: Payload::Inline(b"never"),
            signaled: true,
            solicited: false,
        })
        .unwrap();
    let s = wait_wcs(&*ea.scq, 1, Duration::from_secs(5));
    assert_eq!(s[0].status, WcStatus::RnrRetryExcErr);
}

/// Several SENDs into an empty receive queue: the first is refused with an RNR NAK and the
/// ones behind it arrive out of sequence and are NAKed too; that is the receiver not being
/// ready, not a lossy path, so none of it may use up the retry count (one retry here). Once
/// receives are posted every SEND completes, in order.
pub fn a_burst_into_an_empty_receive_queue_waits_without_using_up_retries<D: Device>(a: &D, b: &D) {
    let l = Link {
        retry_cnt: 1,
        ..Link::default()
    };
    let (ea, eb) = connect(a, b, &l);
    for i in 0..10u64 {
        ea.qp
            .post_send(&SendWr {
                wr_id: i,
                op: SendOp::Send,
                data: Payload::Inline(&[i as u8; 8]),
                signaled: true,
                solicited: false,
            })
            .unwrap();
    }
    // Many RNR rounds (the timer asked for is 0.01 ms).
    std::thread::sleep(Duration::from_millis(300));
    recv_all(&eb, 10, 64);
    let s = wait_wcs(&*ea.scq, 10, Duration::from_secs(10));
    for (i, w) in s.iter().enumerate() {
        assert_eq!((w.wr_id, w.status), (i as u64, WcStatus::Success), "{s:?}");
    }
    let r = wait_wcs(&*eb.rcq, 10, Duration::from_secs(5));
    assert_eq!(r.len(), 10);
}

pub fn a_send_longer_than_the_receive_fails_both_ends<D: Device>(a: &D, b: &D) {
    let l = Link::default();
    let (ea, eb) = connect(a, b, &l);
    recv_all(&eb, 1, 16);
    ea.qp
        .post_send(&SendWr {
            wr_id: 7,
            op: SendOp::Send,
            data: Payload::Inline(&[1; 40]),
            signaled: true,
            solicited: false,
        })
        .unwrap();
    let s = wait_wcs(&*ea.scq, 1, Duration::from_secs(5));
    assert_eq!(s[0].status, WcStatus::RemInvReqErr);
    let r = wait_wcs(&*eb.rcq, 1, Duration::from_secs(5));
    assert_eq!(r[0].status, WcStatus::LocLenErr);
}

/// SMC-Rv2's receive layout (`smc_wr_init_sge`): each receive is {44 bytes of its own slot,
/// the rest of one 8 KiB buffer}. A 44-byte SEND fills the slot only; a longer one (here 3000
/// bytes over three packets) continues in the second entry; one longer than both fails.
pub fn a_send_scatters_over_two_receive_sges<D: Device>(a: &D, b: &D) {
    let l = Link::default();
    let (ea, eb) = connect(a, b, &l);
    const V2: u64 = 1 << 16; // the spill buffer's offset in the region
    for i in 0..3u64 {
        eb.qp
            .post_recv(&RecvWr {
                wr_id: 10 + i,
                sge: Sge {
                    addr: eb.mr.addr() + i * 48,
                    len: 44,
                    lkey: eb.mr.lkey(),
                },
                spill: Some(Sge {
                    addr: eb.mr.addr() + V2 + 44,
                    len: 8192 - 44,
                    lkey: eb.mr.lkey(),
                }),
            })
            .unwrap();
    }
    let small = pattern(44, 3);
    let big = pattern(3000, 5);
    ea.mr.memory().write(0, &big);
    let sends = [
        SendWr {
            wr_id: 1,
            op: SendOp::Send,
            data: Payload::Inline(&small),
            signaled: true,
            solicited: false,
        },
        SendWr {
            wr_id: 2,
            op: SendOp::Send,
            data: Payload::Sges(&[Sge {
                addr: ea.mr.addr(),
                len: 3000,
                lkey: ea.mr.lkey(),
            }]),
            signaled: true,
            solicited: false,
        },
    ];
    for w in &sends {
        ea.qp.post_send(w).unwrap();
    }
    let r = wait_wcs(&*eb.rcq, 2, Duration::from_secs(5));
    assert!(r.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!((r[0].wr_id, r[0].byte_len), (10, 44));
    assert_eq!((r[1].wr_id, r[1].byte_len), (11, 3000));
    let mut got = vec![0u8; 44];
    eb.mr.memory().read(0, &mut got);
    assert_eq!(got, small);
    eb.mr.memory().read(48, &mut got);
    assert_eq!(got, big[..44]);
    let mut rest = vec![0u8; 3000 - 44];
    eb.mr.memory().read(V2 as usize + 44, &mut rest);
    assert_eq!(rest, big[44..]);
    let s = wait_wcs(&*ea.scq, 2, Duration::from_secs(5));
    assert!(s.iter().all(|w| w.status == WcStatus::Success));

    // 8193 bytes do not fit 44 + 8148.
    let huge = pattern(8193, 9);
    ea.mr.memory().write(0, &huge);
    ea.qp
        .post_send(&SendWr {
            wr_id: 3,
            op: SendOp::Send,
            data: Payload::Sges(&[Sge {
                addr: ea.mr.addr(),
                len: 8193,
                lkey: ea.mr.lkey(),
            }]),
            signaled: true,
            solicited: false,
        })
        .unwrap();
    let r = wait_wcs(&*eb.rcq, 1, Duration::from_secs(5));
    assert_eq!(r[0].status, WcStatus::LocLenErr);
}

pub fn a_silent_peer_exhausts_the_retries<D: Device>(a: &D, b: &D) {
    // timeout 10: 4.096 µs × 2^10 ≈ 4 ms; 2 retries.
    let l = Link {
        timeout: 10,
        retry_cnt: 2,
        ..Link::default()
    };
    let (ea, eb) = connect(a, b, &l);
    drop(eb); // the peer QP is gone: nobody answers
    let t = Instant::now();
    ea.qp
        .post_send(&SendWr {
            wr_id: 8,
            op: SendOp::Send,
            data: Payload::Inline(b"hello?"),
            signaled: true,
            solicited: false,
        })
        .unwrap();
    let s = wait_wcs(&*ea.scq, 1, Duration::from_secs(5));
    assert_eq!(s[0].status, WcStatus::RetryExcErr);
    // Three transmissions, each waited for at least the timeout.
    assert!(
        t.elapsed() >= Duration::from_millis(12),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(ea.qp.state(), QpState::Error);
}

pub fn the_state_machine_refuses_out_of_order_steps<D: Device>(a: &D, _b: &D) {
    let l = Link::default();
    let e = end(a, &l);
    let send = SendWr {
        wr_id: 1,
        op: SendOp::Send,
        data: Payload::Inline(b"x"),
        signaled: true,
        solicited: false,
    };
    assert!(matches!(
        e.qp.post_send(&send),
        Err(VerbsError::State(QpState::Reset))
    ));
    let rts = QpModify::Rts {
        sq_psn: 0,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
    };
    assert!(matches!(
        e.qp.modify(&rts),
        Err(VerbsError::State(QpState::Reset))
    ));
    e.qp.modify(&QpModify::Init {
        port: 1,
        access: l.access,
    })
    .unwrap();
    recv_all(&e, 2, 64);
    assert!(matches!(
        e.qp.post_send(&send),
        Err(VerbsError::State(QpState::Init))
    ));
    // ERROR flushes the posted receives.
    e.qp.modify(&QpModify::Error).unwrap();
    let r = wait_wcs(&*e.rcq, 2, Duration::from_secs(1));
    assert!(r.iter().all(|w| w.status == WcStatus::WrFlushErr));
    e.qp.modify(&QpModify::Reset).unwrap();
    assert_eq!(e.qp.state(), QpState::Reset);
    // Bad SGEs and oversized inline data are refused at post time.
    let bad = Sge {
        addr: e.mr.addr() + e.mr.len() as u64,
        len: 1,
        lkey: e.mr.lkey(),
    };
    e.qp.modify(&QpModify::Init {
        port: 1,
        access: l.access,
    })
    .unwrap();
    assert!(matches!(
        e.qp.post_recv(&RecvWr::one(1, bad)),
        Err(VerbsError::Protection(_))
    ));
}

pub fn solicited_only_notification_skips_unsolicited_receives<D: Device>(a: &D, b: &D) {
    let l = Link::default();
    let (ea, eb) = connect(a, b, &l);
    recv_all(&eb, 3, 64);
    let readable = channel_readable::<D::Cq>;
    assert!(!eb.rcq.req_notify(true), "nothing is waiting yet");
    for (id, sol) in [(1, false), (2, true)] {
        ea.qp
            .post_send(&SendWr {
                wr_id: id,
                op: SendOp::Send,
                data: Payload::Inline(b"m"),
                signaled: true,
                solicited: sol,
            })
            .unwrap();
        wait_wcs(&*ea.scq, 1, Duration::from_secs(5));
        if sol {
            assert!(readable(&eb.rcq, 2000), "a solicited receive signals");
            assert!(eb.rcq.take_event());
        } else {
            assert!(!readable(&eb.rcq, 50), "an unsolicited one does not");
        }
    }
    let mut wcs = [Wc::EMPTY; 4];
    assert_eq!(eb.rcq.poll(&mut wcs), 2);
    assert_eq!((wcs[0].solicited, wcs[1].solicited), (false, true));
    // Armed with completions already there: reported as missed.
    ea.qp
        .post_send(&SendWr {
            wr_id: 3,
            op: SendOp::Send,
            data: Payload::Inline(b"m"),
            signaled: true,
            solicited: false,
        })
        .unwrap();
    // Its send completed, so the receive completion is queued: arming reports it.
    wait_wcs(&*ea.scq, 1, Duration::from_secs(5));
    assert!(
        eb.rcq.req_notify(false),
        "a waiting completion is reported when arming"
    );
    assert_eq!(eb.rcq.poll(&mut wcs), 1);
}

/// A completion queue with a handler ([`CompletionQueue::set_handler`]): an armed completion
/// runs the handler on a thread of the device (not the poster's), once, and leaves the
/// channel silent; an unarmed one runs nothing. A device without such a thread says so
/// (`false`) and the check ends there.
pub fn an_armed_completion_runs_the_handler_instead_of_the_channel<D: Device>(a: &D, b: &D) {
    use std::sync::Mutex;
    let l = Link::default();
    let (ea, eb) = connect(a, b, &l);
    recv_all(&eb, 4, 64);
    let ran: Arc<Mutex<Vec<std::thread::ThreadId>>> = Arc::default();
    let r = Arc::clone(&ran);
    let h: CqHandler = Arc::new(move || r.lock().unwrap().push(std::thread::current().id()));
    if !eb.rcq.set_handler(h) {
        eprintln!("this device runs no completion handlers (the channel is the way to wait)");
        return;
    }
    let send = |id: u64| {
        send_inline(&ea, id, b"m", true);
        wait_wcs(&*ea.scq, 1, Duration::from_secs(5));
    };
    let silent = |cq: &D::Cq| !channel_readable(cq, 50);
    // Not armed: the completion waits in the queue, nothing runs.
    send(1);
    std::thread::sleep(Duration::from_millis(50));
    assert!(ran.lock().unwrap().is_empty(), "unarmed: no handler");
    assert!(
        eb.rcq.req_notify(false),
        "the waiting completion is reported"
    );
    let got = wait_wcs(&*eb.rcq, 1, Duration::from_secs(5));
    assert_eq!(got[0].opcode, WcOpcode::Recv);
    // Armed: the handler runs once, on the device's thread, and the channel stays silent.
    assert!(!eb.rcq.req_notify(false));
    send(2);
    let deadline = Instant::now() + Duration::from_secs(10);
    while ran.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the handler never ran");
        std::thread::sleep(Duration::from_millis(1));
    }
    send(3);
    std::thread::sleep(Duration::from_millis(50));
    let threads = ran.lock().unwrap().clone();
    assert_eq!(threads.len(), 1, "one run per arming: {threads:?}");
    assert_ne!(threads[0], std::thread::current().id());
    assert!(silent(&eb.rcq), "the channel was not signalled");
    let got = wait_wcs(&*eb.rcq, 2, Duration::from_secs(5));
    assert!(got.iter().all(|w| w.opcode == WcOpcode::Recv));
}

/// A thread that waits for a completion may serve the device meanwhile
/// ([`CompletionQueue::serve`]): the arrival wakes it and the armed handler runs, and another
/// thread that asks meanwhile is declined; with a spin
/// budget the completion comes while it polls; with nothing coming it times out. A device that
/// cannot be served (no thread of its own to relieve) declines.
pub fn a_waiting_thread_serves_the_device<D: Device>(a: &D, b: &D) {
    use std::sync::Mutex;
    let l = Link::default();
    let (ea, eb) = connect(a, b, &l);
    recv_all(&eb, 4, 64);
    let ran: Arc<Mutex<Vec<std::thread::ThreadId>>> = Arc::default();
    let r = Arc::clone(&ran);
    // As the engine's handler does: what it changes wakes the serving thread, whichever
    // thread runs it (the one that took the datagram, or the one running handlers then).
    let cq = Arc::downgrade(&eb.rcq);
    let h: CqHandler = Arc::new(move || {
        r.lock().unwrap().push(std::thread::current().id());
        if let Some(cq) = cq.upgrade() {
            cq.wake_server();
        }
    });
    if !eb.rcq.set_handler(h) {
        let r = eb
            .rcq
            .serve(&|| false, Some(Duration::ZERO), Duration::ZERO);
        assert_eq!(r, Served::Declined, "a device without a thread of its own");
        return;
    }
    let send = |id: u64| send_inline(&ea, id, b"m", true);
    // Serves until the handler has run `n` times; a decline (the probe below holding the
    // device for a moment) is asked again.
    let serve = |n: usize, spin: Duration| {
        let (cq, ran) = (Arc::clone(&eb.rcq), Arc::clone(&ran));
        std::thread::spawn(move || {
            let done = || ran.lock().unwrap().len() >= n;
            loop {
                match cq.serve(&done, Some(Duration::from_secs(20)), spin) {
                    Served::Declined => {
                        cq.unserved_wait_over();
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    r => return (r, std::thread::current().id()),
                }
            }
        })
    };
    let until_served = || until_served(&*eb.rcq, "serve");
    assert!(!eb.rcq.req_notify(false));
    let t = serve(1, Duration::ZERO);
    until_served();
    send(1);
    let (r, server) = t.join().unwrap();
    assert_eq!(r, Served::Woken);
    // Usually on the serving thread; the receive thread may be running handlers just then.
    assert_eq!(ran.lock().unwrap().len(), 1, "the handler ran once");
    let _ = server;
    let got = wait_wcs(&*eb.rcq, 1, Duration::from_secs(5));
    assert_eq!(got[0].opcode, WcOpcode::Recv);
    wait_wcs(&*ea.scq, 1, Duration::from_secs(5));
    // With a spin budget longer than the wait: the completion comes while it polls.
    assert!(!eb.rcq.req_notify(false));
    let t = serve(2, Duration::from_secs(20));
    until_served();
    send(2);
    let (r, server) = t.join().unwrap();
    assert!(matches!(r, Served::Spun(_)), "{r:?}");
    assert_eq!(ran.lock().unwrap().len(), 2);
    let _ = server;
    wait_wcs(&*eb.rcq, 1, Duration::from_secs(5));
    wait_wcs(&*ea.scq, 1, Duration::from_secs(5));
    // Nothing comes: the timeout.
    let r = eb
        .rcq
        .serve(&|| false, Some(Duration::from_millis(50)), Duration::ZERO);
    assert_eq!(r, Served::TimedOut);
}

/// A request taken by a thread serving the device is answered from that thread as soon as
/// the serve returns (as the engine's reader answers a ping-pong): `rounds` requests from
/// `a`, each read in `b`'s receive buffer and answered, each answer arriving whole. A device
/// without a thread of its own declines the serve and is not asked.
pub fn served_requests_are_answered<D: Device>(a: &D, b: &D) {
    let rounds: u64 = 20;
    let l = Link::default();
    let (ea, eb) = connect(a, b, &l);
    recv_all(&ea, rounds, 64);
    recv_all(&eb, rounds, 64);
    let Some(ran) = served_counter(&eb.rcq) else {
        return;
    };
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let mut wc = [Wc::EMPTY; 4];
            for k in 1..=rounds as usize {
                assert!(!eb.rcq.req_notify(false), "round {k}: nothing came yet");
                serve_until(&*eb.rcq, &ran, k, "round");
                // The answer first, as a program does; then the request's completion.
                send_inline(&eb, 500 + k as u64, b"answer", false);
                let n = eb.rcq.poll(&mut wc);
                assert_eq!(n, 1, "round {k}: one request");
                assert_eq!((wc[0].opcode, wc[0].byte_len), (WcOpcode::Recv, 7));
                let mut got = [0u8; 7];
                eb.mr
                    .memory()
                    .read((wc[0].wr_id - 1000) as usize * 64, &mut got);
                assert_eq!(&got, b"request");
            }
        });
        for k in 1..=rounds {
            until_served(&*eb.rcq, &format!("round {k}"));
            send_inline(&ea, k, b"request", true);
            let got = wait_wcs(&*ea.rcq, 1, Duration::from_secs(10));
            assert_eq!((got[0].opcode, got[0].byte_len), (WcOpcode::Recv, 6));
            let mut answer = [0u8; 6];
            ea.mr
                .memory()
                .read((got[0].wr_id - 1000) as usize * 64, &mut answer);
            assert_eq!(&answer, b"answer");
            wait_wcs(&*ea.scq, 1, Duration::from_secs(10));
        }
        server.join().unwrap();
    });
}

/// After a thread served the device and left with its socket empty, what arrives waits for
/// the next serve instead of waking the device's own thread, for as long as the lease
/// (`set_lease`) lasts; then the device's thread takes it. While a thread waits unserved
/// (declined, and not over yet), a serving thread that leaves gives the socket back at once.
/// A device that cannot be served is not asked.
pub fn datagrams_between_two_serves_wait_for_the_next<D: Device>(
    a: &D,
    b: &D,
    set_lease: &dyn Fn(Duration),
) {
    use std::sync::atomic::Ordering;
    let l = Link::default();
    let (ea, eb) = connect(a, b, &l);
    recv_all(&eb, 8, 64);
    let Some(ran) = served_counter(&eb.rcq) else {
        return;
    };
    let serve_until = |k: usize| serve_until(&*eb.rcq, &ran, k, "request");
    // The handler runs for an armed queue only: each request is sent to an armed, empty one.
    let got = std::cell::RefCell::new(Vec::new());
    let arm = || {
        let mut wc = [Wc::EMPTY; 8];
        loop {
            let n = eb.rcq.poll(&mut wc);
            got.borrow_mut().extend_from_slice(&wc[..n]);
            if n == 0 {
                break;
            }
        }
        assert!(!eb.rcq.req_notify(false), "nothing came yet");
    };
    let handled_within = |k: usize, within: Duration| {
        let deadline = Instant::now() + within;
        while ran.load(Ordering::SeqCst) < k {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    };
    // A serve takes request 1 and leaves with a long lease.
    set_lease(Duration::from_secs(60));
    std::thread::scope(|s| {
        arm();
        let t = s.spawn(|| serve_until(1));
        until_served(&*eb.rcq, "request 1");
        send_inline(&ea, 1, b"one", false);
        t.join().unwrap();
    });
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    // Request 2 comes while nobody serves: it waits (well within the sender's ACK timeout,
    // 67 ms × 8 tries), and the next serve takes it.
    arm();
    send_inline(&ea, 2, b"two", false);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "request 2 was handled though nobody served during the lease"
    );
    set_lease(Duration::from_millis(20));
    serve_until(2);
    // A short lease runs out: the device's thread takes request 3 with nobody serving.
    arm();
    send_inline(&ea, 3, b"three", false);
    assert!(
        handled_within(3, Duration::from_secs(10)),
        "request 3 waited past the end of the lease"
    );
    // A thread declined while another serves, and waiting still: the serving thread gives the
    // socket back when it leaves, long lease or not.
    set_lease(Duration::from_secs(60));
    std::thread::scope(|s| {
        arm();
        let t = s.spawn(|| serve_until(4));
        let deadline = Instant::now() + Duration::from_secs(10);
        while eb.rcq.serve(&|| true, Some(Duration::ZERO), Duration::ZERO) != Served::Declined {
            assert!(Instant::now() < deadline, "the thread never served");
            std::thread::sleep(Duration::from_millis(1));
        }
        send_inline(&ea, 4, b"four", false);
        t.join().unwrap();
    });
    arm();
    send_inline(&ea, 5, b"five", false);
    let prompt = handled_within(5, Duration::from_secs(10));
    eb.rcq.unserved_wait_over();
    assert!(
        prompt,
        "request 5 waited for a lease while a declined thread waited"
    );
    arm();
    let got = got.into_inner();
    assert_eq!(got.len(), 5, "{got:?}");
    assert!(got.iter().all(|w| w.status == WcStatus::Success), "{got:?}");
}
