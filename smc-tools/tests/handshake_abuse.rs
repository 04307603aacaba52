//! Hostile local clients against a listener's handshakes (issue 10, item 3): processes that
//! announce themselves through `smcd` as an SMC client must, connect, and then drip a CLC
//! Proposal one byte at a time. Each byte comes well within `CLC_WAIT_TIME` of the last, so a
//! timeout that restarted on every byte would never fire, and there are more of them than a
//! listener has handshake workers.
//!
//! What must hold: every legitimate client beside them connects (SMC-D, or plain TCP with a
//! reason when handshake limitation refuses it at admission) and none errors; and the listener
//! closes every attacker's connection at the whole-message deadline: not before
//! `CLC_WAIT_TIME`, and long before the drip would have finished.
//!
//! No timing threshold decides anything here: the lower bound is the protocol's (a deadline
//! never fires early, however slow the machine), the upper bounds are many times what any
//! step needs.

mod common;

use common::{BINS, Smcd, within};
use rustix::event::{PollFd, PollFlags};
use smc_proto::clc::{ClcMessage, ReasonCode};
use smcd_engine::driver::handshake::CLC_WAIT_TIME;
use smcd_engine::ipc::SmcdSession;
use smcd_engine::{Fallback, Mode, SmcListener, SmcStream};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
#[ignore = "entry point of child processes"]
fn child_entry() {
    common::child_main();
}

/// Attackers: more than the most handshake workers a listener has on any machine (16), and
/// more than twice what it has on this one.
fn attackers() -> usize {
    (2 * smcd_engine::driver::listener::max_workers() + 2).max(17)
}

/// Legitimate clients connecting while the attackers drip.
const CLIENTS: usize = 6;

/// A Proposal-shaped byte string (it never completes, so its content does not matter).
fn proposal() -> Vec<u8> {
    let p = smc_proto::clc::ProposalBuilder::smcd_v2_loopback(0x1234, 0x5678)
        .system_eid(smc_proto::clc::Eid::new("DRIP").unwrap())
        .build()
        .unwrap();
    ClcMessage::Proposal(p).to_vec()
}

/// One attacker: announced through smcd (as the intent path requires), connected; the drip
/// runs on a thread. Returns when the listener closed the connection, measured from before
/// the connect, or `None` if the whole Proposal went out without the listener closing it.
/// `drip: None` is a silent attacker: it sends nothing and waits for the close (at most five
/// `CLC_WAIT_TIME`s).
fn attacker(
    dev: &SmcdSession,
    to: SocketAddr,
    drip: Option<Duration>,
) -> std::thread::JoinHandle<Option<Duration>> {
    let (s, _, v) = common::announced_socket(dev, to);
    assert!(v.smc, "smcd knows the listener: {v:?}");
    let start = Instant::now();
    rustix::net::connect(&s, &to).unwrap();
    dev.intent_done(v.intent, true);
    let mut s = TcpStream::from(s);
    std::thread::spawn(move || {
        let Some(drip) = drip else {
            let t = rustix::time::Timespec {
                tv_sec: (CLC_WAIT_TIME * 5).as_secs() as i64,
                tv_nsec: 0,
            };
            let mut fds = [PollFd::new(&s, PollFlags::IN)];
            if rustix::event::poll(&mut fds, Some(&t)).unwrap_or(0) == 0 {
                return None;
            }
            let mut buf = [0u8; 256];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => return Some(start.elapsed()),
                    Ok(_) => {}
                }
            }
        };
        for b in proposal() {
            // A write into a connection the listener closed fails at the latest on the
            // second try; the read below sees the close first.
            if s.write_all(&[b]).is_err() {
                return Some(start.elapsed());
            }
            let t = rustix::time::Timespec {
                tv_sec: drip.as_secs() as i64,
                tv_nsec: i64::from(drip.subsec_nanos()),
            };
            let mut fds = [PollFd::new(&s, PollFlags::IN)];
            if rustix::event::poll(&mut fds, Some(&t)).unwrap_or(0) > 0 {
                // The listener closed (EOF or reset); anything before the end (it sends no
                // Decline on a timeout, as the kernel's smc_listen_out_err) is read away.
                let mut buf = [0u8; 256];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return Some(start.elapsed()),
                        Ok(_) => {}
                    }
                }
            }
        }
        None
    })
}

/// Accepts forever; answers each connection's "ping" with "pong".
fn serve(l: SmcListener) {
    std::thread::spawn(move || {
        loop {
            let Ok((s, _)) = l.accept() else { return };
            std::thread::spawn(move || {
                let mut b = [0u8; 4];
                if (&s).read_exact(&mut b).is_ok() && &b == b"ping" {
                    let _ = (&s).write_all(b"pong");
                }
            });
        }
    });
}

/// Legitimate client `i`: connects, sends "ping", expects "pong" (within a minute, or the
/// test fails as hung); what its connection became.
fn ping(ce: &Arc<smcd_engine::Engine>, to: SocketAddr, i: usize) -> std::io::Result<Mode> {
    let ce = Arc::clone(ce);
    within(Duration::from_secs(60), move || -> std::io::Result<Mode> {
        let c = SmcStream::connect_with(&ce, to)?;
        (&c).write_all(b"ping")?;
        let mut b = [0u8; 4];
        (&c).read_exact(&mut b)?;
        assert_eq!(&b, b"pong");
        Ok(c.mode())
    })
    .unwrap_or_else(|| panic!("legitimate client {i} hung"))
}

/// Accepts from an epoll loop on the listener's readiness descriptor, as nginx does (no
/// timeout: only the descriptor wakes it, so the handshakes' deadlines must too); answers each
/// connection's "ping" with "pong" on a thread.
fn serve_from_epoll(l: Arc<SmcListener>) {
    use rustix::event::epoll;
    l.set_nonblocking(true).unwrap();
    // Before the caller goes on: from now on the loop drives the handshakes (a thread that
    // starts late on a busy machine would leave the first ones to the reactor).
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
    epoll::add(
        &ep,
        l.readiness_fd().unwrap(),
        epoll::EventData::new_u64(0),
        epoll::EventFlags::IN,
    )
    .unwrap();
    std::thread::spawn(move || {
        let mut events = Vec::with_capacity(4);
        loop {
            events.clear();
            let _ = epoll::wait(&ep, rustix::buffer::spare_capacity(&mut events), None);
            loop {
                match l.accept() {
                    Ok((s, _)) => {
                        std::thread::spawn(move || {
                            s.set_nonblocking(false).unwrap();
                            let mut b = [0u8; 4];
                            if (&s).read_exact(&mut b).is_ok() && &b == b"ping" {
                                let _ = (&s).write_all(b"pong");
                            }
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => return,
                }
            }
        }
    });
}

/// An event-loop listener drives its own handshakes: drip-feeding and silent attackers wait
/// in the loop's set (not the reactor's), the loop's wake-ups come from the descriptor alone,
/// and yet every attacker is closed at its deadline (a silent one only by the deadline's
/// timer), while legitimate clients beside them get SMC-D.
#[test]
fn an_event_loop_listener_keeps_the_deadlines_of_the_handshakes_it_drives() {
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = smc_tests::local_listener(&se, 128, false);
    let to = l.local_addr().unwrap();
    let l = Arc::new(l);
    let p = proposal().len();
    let drip = CLC_WAIT_TIME * 5 / p as u32;
    let dev = SmcdSession::open(&smcd.socket).unwrap();
    serve_from_epoll(Arc::clone(&l));
    let n = 4;
    let mut attackers: Vec<_> = (0..n).map(|_| attacker(&dev, to, Some(drip))).collect();
    attackers.extend((0..n).map(|_| attacker(&dev, to, None)));
    assert!(
        common::eventually(Duration::from_secs(30), || l.handshakes_parked() >= 2 * n),
        "{} handshakes parked in the loop's set, {} attackers",
        l.handshakes_parked(),
        2 * n
    );
    for i in 0..CLIENTS {
        let m = ping(&ce, to, i).unwrap_or_else(|e| panic!("legitimate client {i}: {e}"));
        assert!(matches!(m, Mode::SmcD(_)), "legitimate client {i}: {m:?}");
    }
    for (i, a) in attackers.into_iter().enumerate() {
        let kind = if i < n { "dripping" } else { "silent" };
        let Some(at) = a.join().unwrap() else {
            panic!("{kind} attacker {i}: never closed")
        };
        assert!(
            at >= CLC_WAIT_TIME,
            "{kind} attacker {i} closed after {at:?}, before CLC_WAIT_TIME"
        );
    }
    assert_eq!(l.handshakes_parked(), 0, "nothing left parked");
}

/// Drip-feeding attackers beside legitimate clients; `limit_hs` is the listener's handshake
/// limitation. Returns the legitimate clients' modes.
fn drip_beside_clients(limit_hs: bool) -> Vec<Mode> {
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = smc_tests::local_listener(&se, 128, limit_hs);
    let to = l.local_addr().unwrap();
    let n = attackers();
    let p = proposal().len();
    // The whole Proposal would take five CLC_WAIT_TIMEs; each byte comes after a fraction of
    // one.
    let drip = CLC_WAIT_TIME * 5 / p as u32;
    assert!(drip * 4 < CLC_WAIT_TIME, "{p}-byte Proposal");
    let dev = SmcdSession::open(&smcd.socket).unwrap();
    let drips: Vec<_> = (0..n).map(|_| attacker(&dev, to, Some(drip))).collect();
    // The listener takes them (its acceptor does, for announced clients) before the
    // legitimate clients come.
    assert!(
        common::eventually(Duration::from_secs(30), || l.handshakes_in_progress() >= n),
        "{} handshakes in progress, {n} attackers",
        l.handshakes_in_progress()
    );
    serve(l);
    let mut modes = Vec::new();
    for i in 0..CLIENTS {
        match ping(&ce, to, i) {
            Ok(m) => modes.push(m),
            Err(e) => panic!("legitimate client {i} failed beside {n} drip-feeding attackers: {e}"),
        }
    }
    for (i, d) in drips.into_iter().enumerate() {
        let closed = d.join().unwrap();
        let Some(at) = closed else {
            panic!("attacker {i}: its whole Proposal dripped in and the listener never closed it")
        };
        assert!(
            at >= CLC_WAIT_TIME,
            "attacker {i} closed after {at:?}, before CLC_WAIT_TIME"
        );
    }
    modes
}

/// Without handshake limitation, every legitimate client gets SMC-D beside the attackers:
/// their handshakes wait for bytes and cost the listener no worker.
#[test]
fn drip_fed_proposals_do_not_pin_the_listener() {
    for (i, m) in drip_beside_clients(false).into_iter().enumerate() {
        assert!(matches!(m, Mode::SmcD(_)), "legitimate client {i}: {m:?}");
    }
}

/// With handshake limitation, a legitimate client is SMC-D or refused at admission (plain TCP,
/// PEERNOSMC), never an error; attackers waiting for bytes are no congestion, so here they are
/// all SMC-D too.
#[test]
fn drip_fed_proposals_with_handshake_limitation() {
    for (i, m) in drip_beside_clients(true).into_iter().enumerate() {
        assert!(
            matches!(m, Mode::SmcD(_)) || m == Mode::Tcp(Fallback::local(ReasonCode::PEERNOSMC)),
            "legitimate client {i}: {m:?}"
        );
    }
}
