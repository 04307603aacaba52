//! Threads blocked in `accept` while the listener's backlog runs full (handshakes in progress
//! plus connections ready count against it). They wait on one shared epoll set, so each event
//! wakes one of them, not all; a finished handshake makes room and wakes one of them, and a
//! thread that takes a connection while others wait for room passes the turn on. What must
//! hold: no connection is left in the kernel's queue with room in the backlog and a thread
//! in `accept`, however the arrivals and the handshakes interleave.
//!
//! No timing threshold decides anything: the one bound (a read timeout that turns a connection
//! left behind into a failure rather than a hang) is thousands of times what an exchange needs.

mod common;

use common::{BINS, Smcd};
use smcd_engine::SmcStream;
use smcd_engine::driver::handshake::CLC_WAIT_TIME;
use smcd_engine::ipc::SmcdSession;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A connection not answered within this is one left behind (the exchange takes
/// milliseconds).
const STUCK: Duration = Duration::from_secs(30);

#[test]
fn a_full_backlog_leaves_no_connection_behind() {
    const CLIENTS: usize = 16;
    const EACH: usize = 25;
    let smcd = Smcd::start(BINS);
    let l = Arc::new(smc_tests::local_listener(&smcd.engine(), 2, false));
    let addr = l.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    for _ in 0..8 {
        let (l, served) = (Arc::clone(&l), Arc::clone(&served));
        std::thread::spawn(move || {
            while let Ok((s, _)) = l.accept() {
                let mut b = [0u8; 1];
                if (&s).read_exact(&mut b).is_ok() {
                    // Counted before the answer: a client that has its answer has been
                    // counted, so the count is complete once every client has returned.
                    served.fetch_add(1, Ordering::SeqCst);
                    let _ = (&s).write_all(&b);
                }
            }
        });
    }
    let client = smcd.engine();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let client = Arc::clone(&client);
            std::thread::spawn(move || {
                let mut smc = 0;
                for j in 0..EACH {
                    let s = SmcStream::connect_with(&client, addr).unwrap();
                    // A connection left in the kernel's queue fails here instead of hanging.
                    s.set_read_timeout(Some(STUCK)).unwrap();
                    // SMC-D, or (a busy machine may make a handshake miss its time) a
                    // fallback with its reason: never a connection that is neither.
                    assert!(s.is_smc() || s.fallback().is_some());
                    smc += usize::from(s.is_smc());
                    let byte = [(i * EACH + j) as u8];
                    (&s).write_all(&byte).unwrap();
                    let mut b = [0u8; 1];
                    (&s).read_exact(&mut b)
                        .expect("answered: accepted and served");
                    assert_eq!(b, byte);
                }
                smc
            })
        })
        .collect();
    let smc: usize = clients.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(served.load(Ordering::SeqCst), CLIENTS * EACH);
    assert!(smc > 0, "the listener ran SMC-D at all");
}

/// The backlog's one place is held by a handshake whose client never sends its Proposal, so
/// the thread in `accept` waits for room; a plain TCP client connects meanwhile (its arrival
/// wakes that thread, which finds no room and waits again). When the silent handshake reaches
/// its deadline and ends, the room it leaves must wake the thread: nothing else will, since
/// no further connection arrives.
#[test]
fn room_left_by_an_ending_handshake_wakes_a_waiting_accept() {
    let smcd = Smcd::start(BINS);
    let l = Arc::new(smc_tests::local_listener(&smcd.engine(), 1, false));
    let addr = l.local_addr().unwrap();
    {
        let l = Arc::clone(&l);
        std::thread::spawn(move || {
            while let Ok((s, _)) = l.accept() {
                let mut b = [0u8; 1];
                if (&s).read_exact(&mut b).is_ok() {
                    let _ = (&s).write_all(&b);
                }
            }
        });
    }
    // The silent client: announced through smcd as an SMC client, connected, and mute.
    let dev = SmcdSession::open(&smcd.socket).unwrap();
    let (silent, _, v) = common::announced_socket(&dev, addr);
    assert!(v.smc, "smcd knows the listener: {v:?}");
    rustix::net::connect(&silent, &addr).unwrap();
    dev.intent_done(v.intent, true);
    assert!(common::eventually(Duration::from_secs(10), || l
        .handshakes_in_progress()
        == 1));
    // The backlog is full: the plain client waits in the kernel's queue.
    let mut plain = TcpStream::connect(addr).unwrap();
    plain
        .set_read_timeout(Some(CLC_WAIT_TIME * 3 + STUCK))
        .unwrap();
    plain.write_all(b"x").unwrap();
    let mut b = [0u8; 1];
    plain
        .read_exact(&mut b)
        .expect("accepted once the silent handshake ended");
    assert_eq!(&b, b"x");
    drop(silent);
}
