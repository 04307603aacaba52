//! What `SmcStream::readiness_fd` promises, checked against a real smcd with two engines in
//! this process (and a child process where a peer has to die): a TCP socket's poll
//! semantics. Readable when a read would not block (data, end of stream, error), writable
//! when a write would not block, separately; `POLLRDHUP` once the peer is done writing;
//! `POLLHUP` once the connection is over. Level-triggered (`poll`, epoll) and edge-triggered
//! epoll both work because a call that returns `WouldBlock` is what clears the readiness it
//! could not use. And the non-blocking connect (`SmcConnecting`), to an SMC listener, to a
//! plain TCP listener, and to a closed port.
//!
//! Timing: every wait for something to happen has a generous bound ([`LIVENESS`]); the
//! checks that something does *not* happen look for [`QUIET`] (a busy machine can only make
//! them pass wrongly, never fail wrongly).

mod common;

use common::{BINS, Peer, Smcd, listen, pattern};
use rustix::event::{PollFd, PollFlags, epoll};
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use smc_proto::clc::ReasonCode;
use smcd_engine::{Engine, SmcConnecting, SmcStream};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long something that must happen may take (a busy machine, two cores shared).
const LIVENESS: Duration = Duration::from_secs(10);
/// How long we look for something that must not happen.
const QUIET: Duration = Duration::from_millis(200);

#[test]
#[ignore = "entry point of child processes"]
fn child_entry() {
    match std::env::var("SMC_TEST_ROLE").as_deref() {
        // Accept one connection, write "hello", then hold it without reading until killed.
        Ok("hold") => {
            let l = smcd_engine::SmcListener::bind("127.0.0.1:0").unwrap();
            common::say("PORT", l.local_addr().unwrap().port());
            let (s, _) = l.accept().unwrap();
            common::say("MODE", if s.is_smc() { "smcd" } else { "tcp" });
            (&s).write_all(b"hello").unwrap();
            common::say("WROTE", 5);
            common::wait_for_poke();
            drop(s);
        }
        // The body of `bells_of_one_link_group_share_its_channel`, alone in a process so
        // that its descriptors can be counted; smcd's pid is the argument.
        Ok("bells") => {
            let socket = std::path::PathBuf::from(std::env::var("SMCD_SOCKET").unwrap());
            let args = std::env::var("SMC_TEST_ARGS").unwrap();
            let mut args = args.split(' ').map(|a| a.parse::<u32>().unwrap());
            let (smcd_pid, n) = (args.next().unwrap(), args.next().unwrap() as usize);
            let engine = || {
                Engine::new(smcd_engine::EngineConfig {
                    socket: socket.clone(),
                    ..smcd_engine::EngineConfig::default()
                })
            };
            bells_body(engine(), engine(), smcd_pid, n);
            common::say("DONE", 1);
        }
        // Accept ARG0 connections one after the other, each served by an edge-triggered
        // epoll loop on its readiness descriptor: echo what comes until the end of stream.
        // With three more arguments (pid, descriptor, inode) the last connection's bell
        // locator names that socket instead of its bell, as a hostile peer could write it; that
        // connection then looks for data every 10 ms instead of waiting to be woken.
        Ok("event-echo") => {
            use std::sync::atomic::Ordering::Relaxed;
            let args = common::child_args();
            let n: usize = args[0].parse().unwrap();
            let lie: Option<(u32, u32, u64)> = (args.len() == 4).then(|| {
                (
                    args[1].parse().unwrap(),
                    args[2].parse().unwrap(),
                    args[3].parse().unwrap(),
                )
            });
            let l = smcd_engine::SmcListener::bind("127.0.0.1:0").unwrap();
            common::say("PORT", l.local_addr().unwrap().port());
            let mut smc = 0;
            for i in 0..n {
                let (s, _) = l.accept().unwrap();
                smc += usize::from(s.is_smc());
                s.set_nonblocking(true).unwrap();
                let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
                epoll::add(&ep, fd(&s), epoll::EventData::new_u64(0), Ev::IN | Ev::ET).unwrap();
                let lying = lie.filter(|_| i + 1 == n);
                if let Some((pid, victim, ino)) = lying {
                    let own = s.smc_conn().expect("SMC-D").link().own();
                    let (p, f) = own.map.bell_pid_fd();
                    p.store(pid, Relaxed);
                    f.store(victim, Relaxed);
                    own.map.bell_ino().store(ino, Relaxed);
                }
                let mut buf = [0u8; 64];
                loop {
                    match (&s).read(&mut buf) {
                        Ok(0) => break,
                        Ok(k) => (&s).write_all(&buf[..k]).unwrap(),
                        Err(e) if e.kind() == ErrorKind::WouldBlock && lying.is_some() => {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            assert!(wait_event(&ep, LIVENESS), "never woken for the client");
                        }
                        Err(e) => panic!("read: {e}"),
                    }
                }
            }
            common::say("SMC", smc);
        }
        // The counting half of `a_connect_in_flight_costs_its_socket_alone`, alone in a
        // process: the other tests of this binary open and close descriptors meanwhile.
        Ok("connects") => {
            let socket = std::path::PathBuf::from(std::env::var("SMCD_SOCKET").unwrap());
            let ce = Engine::new(smcd_engine::EngineConfig {
                socket,
                ..smcd_engine::EngineConfig::default()
            });
            connects_body(&ce);
            common::say("DONE", 1);
        }
        _ => common::child_main(),
    }
}

// ------------------------------------------------------------------------------------------
// Helpers.

fn ts(d: Duration) -> rustix::time::Timespec {
    rustix::time::Timespec {
        tv_sec: d.as_secs() as i64,
        tv_nsec: i64::from(d.subsec_nanos()),
    }
}

/// Everything `poll` says about `fd` right now (IN, OUT, RDHUP asked; HUP, ERR always).
fn poll_now(fd: BorrowedFd<'_>) -> PollFlags {
    let mut fds = [PollFd::from_borrowed_fd(
        fd,
        PollFlags::IN | PollFlags::OUT | PollFlags::RDHUP,
    )];
    rustix::event::poll(&mut fds, Some(&ts(Duration::ZERO))).unwrap();
    fds[0].revents()
}

/// Waits with `poll` until `fd` reports any of `want` (at most `within`); then everything it
/// reports.
fn poll_until(fd: BorrowedFd<'_>, want: PollFlags, within: Duration) -> PollFlags {
    let deadline = Instant::now() + within;
    loop {
        let now = poll_now(fd);
        if now.intersects(want) {
            return now;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return now;
        }
        let mut fds = [PollFd::from_borrowed_fd(fd, want)];
        let _ = rustix::event::poll(&mut fds, Some(&ts(left)));
    }
}

/// An epoll instance watching one descriptor.
struct Ep {
    ep: OwnedFd,
}

impl Ep {
    fn new(fd: BorrowedFd<'_>, flags: epoll::EventFlags) -> Ep {
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
        epoll::add(&ep, fd, epoll::EventData::new_u64(7), flags).unwrap();
        Ep { ep }
    }

    fn level(fd: BorrowedFd<'_>, flags: epoll::EventFlags) -> Ep {
        Self::new(fd, flags)
    }

    fn edge(fd: BorrowedFd<'_>, flags: epoll::EventFlags) -> Ep {
        Self::new(fd, flags | epoll::EventFlags::ET)
    }

    /// The event reported within `within`, if any.
    fn wait(&self, within: Duration) -> Option<epoll::EventFlags> {
        let deadline = Instant::now() + within;
        let mut events = Vec::with_capacity(4);
        loop {
            events.clear();
            let left = deadline.saturating_duration_since(Instant::now());
            match epoll::wait(
                &self.ep,
                rustix::buffer::spare_capacity(&mut events),
                Some(&ts(left)),
            ) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) if !left.is_zero() => continue,
                Err(e) => panic!("epoll_wait: {e}"),
            }
            return events.first().map(|e| e.flags);
        }
    }
}

use epoll::EventFlags as Ev;

/// A connected SMC-D pair between two engines of this process: (client, server). The smcd
/// comes first so that it is dropped last.
fn pair() -> (Smcd, SmcStream, SmcStream) {
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = listen(&se);
    let port = l.local_addr().unwrap().port();
    let c = SmcStream::connect_with(&ce, ("127.0.0.1", port)).expect("connect");
    let (s, _) = l.accept().expect("accept");
    assert!(c.is_smc(), "client: expected SMC-D, got {}", c.mode());
    assert!(s.is_smc(), "server: expected SMC-D, got {}", s.mode());
    (smcd, c, s)
}

/// Reads until `WouldBlock`; what was read (end of stream or an error panics).
fn drain(s: &SmcStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match (&*s).read(&mut buf) {
            Ok(0) => panic!("unexpected end of stream"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return got,
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// Writes pattern bytes from stream offset `off` until `WouldBlock`; how many it wrote.
fn fill(s: &SmcStream, off: u64) -> u64 {
    let mut n = 0u64;
    loop {
        match (&*s).write(pattern(off + n, 16 * 1024)) {
            Ok(0) => panic!("write returned 0"),
            Ok(k) => n += k as u64,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return n,
            Err(e) => panic!("write: {e}"),
        }
        assert!(n < 64 << 20, "a peer that does not read must fill the ring");
    }
}

/// Reads exactly `n` bytes (blocking stream) and checks them against the pattern at `off`.
fn read_pattern(s: &SmcStream, off: u64, n: u64) {
    let mut got = vec![0u8; n as usize];
    (&*s).read_exact(&mut got).unwrap();
    for (i, chunk) in got.chunks(1 << 20).enumerate() {
        let at = off + (i << 20) as u64;
        assert!(
            chunk == pattern(at, chunk.len()),
            "data mismatch near offset {at}"
        );
    }
}

fn fd(s: &SmcStream) -> BorrowedFd<'_> {
    s.readiness_fd().expect("readiness descriptor")
}

/// Waits at most `within` for an event in `ep`; whether one came.
fn wait_event(ep: &OwnedFd, within: Duration) -> bool {
    let mut events = Vec::with_capacity(4);
    match epoll::wait(
        ep,
        rustix::buffer::spare_capacity(&mut events),
        Some(&ts(within)),
    ) {
        Ok(n) => n > 0,
        Err(rustix::io::Errno::INTR) => true,
        Err(e) => panic!("epoll_wait: {e}"),
    }
}

// ------------------------------------------------------------------------------------------
// A fresh connection.

/// Both ends of a fresh connection: writable, not readable, no hang-up, for `poll`,
/// level-triggered epoll (every time) and edge-triggered epoll (once). `AsRawFd` is the
/// readiness descriptor.
#[test]
fn fresh_connection_is_writable_not_readable() {
    let (_smcd, c, s) = pair();
    for (name, st) in [("client", &c), ("server", &s)] {
        assert_eq!(st.as_raw_fd(), fd(st).as_raw_fd(), "{name}: AsRawFd");
        assert_eq!(poll_now(fd(st)), PollFlags::OUT, "{name}: poll");
        let lt = Ep::level(fd(st), Ev::IN | Ev::OUT | Ev::RDHUP);
        for _ in 0..3 {
            assert_eq!(lt.wait(Duration::ZERO), Some(Ev::OUT), "{name}: level");
        }
        let only_in = Ep::level(fd(st), Ev::IN | Ev::RDHUP);
        assert_eq!(only_in.wait(QUIET), None, "{name}: not readable");
        let et = Ep::edge(fd(st), Ev::IN | Ev::OUT | Ev::RDHUP);
        assert_eq!(et.wait(Duration::ZERO), Some(Ev::OUT), "{name}: edge");
        assert_eq!(et.wait(QUIET), None, "{name}: one edge");
    }
}

// ------------------------------------------------------------------------------------------
// Readable.

/// Level-triggered: the peer's bytes make the descriptor readable; it stays readable while
/// bytes remain (even after a read that did not take them all); a read that returns
/// `WouldBlock` makes it not readable; writable all along. Several rounds.
#[test]
fn level_readable_after_peer_writes_until_would_block() {
    let (_smcd, c, s) = pair();
    s.set_nonblocking(true).unwrap();
    let only_in = Ep::level(fd(&s), Ev::IN | Ev::RDHUP);
    let mut off = 0u64;
    for round in 0..4 {
        let n = 1000 + round * 3000;
        (&c).write_all(pattern(off, n)).unwrap();
        let r = poll_until(fd(&s), PollFlags::IN, LIVENESS);
        assert_eq!(r, PollFlags::IN | PollFlags::OUT, "round {round}: readable");
        assert_eq!(only_in.wait(LIVENESS), Some(Ev::IN), "round {round}");
        assert_eq!(only_in.wait(Duration::ZERO), Some(Ev::IN), "level repeats");
        // Part of it: the rest is still there, and the descriptor says so.
        let mut part = [0u8; 500];
        assert_eq!((&s).read(&mut part).unwrap(), 500);
        assert_eq!(&part[..], pattern(off, 500));
        assert!(poll_now(fd(&s)).contains(PollFlags::IN), "bytes remain");
        assert_eq!(only_in.wait(Duration::ZERO), Some(Ev::IN));
        let rest = drain(&s);
        assert_eq!(rest.len(), n - 500, "round {round}");
        assert!(rest == pattern(off + 500, n - 500));
        off += n as u64;
        assert_eq!(poll_now(fd(&s)), PollFlags::OUT, "round {round}: drained");
        assert_eq!(only_in.wait(QUIET), None, "round {round}: drained (epoll)");
    }
}

/// `SmcStream::withdraw_readiness` (a preload library's event loop, woken and busy): an
/// announcement the peer has not taken is taken back, once; the peer's writes then ring
/// nobody (the descriptor stays not readable while the bytes wait, which the loop finds in
/// shared memory); the settle makes the descriptor what the connection is: readable for bytes
/// that came meanwhile, announced again (no drain) when none did, so the next write rings.
/// An announcement the peer took (it rang) is not taken back.
#[test]
fn a_withdrawn_announcement_rings_nobody_until_the_settle() {
    let (_smcd, c, s) = pair();
    s.set_nonblocking(true).unwrap();
    s.set_level_readiness(true);
    s.set_deferred_readiness(true);
    let f = fd(&s);
    (&c).write_all(b"one").unwrap();
    assert_eq!(
        poll_until(f, PollFlags::IN, LIVENESS),
        PollFlags::IN | PollFlags::OUT
    );
    // The peer rang: nothing to take back.
    assert!(
        !s.withdraw_readiness(),
        "the announcement was taken by the ring"
    );
    // Read until WouldBlock: drained and announced again.
    assert_eq!(drain(&s), b"one");
    assert_eq!(poll_now(f), PollFlags::OUT);
    assert!(s.withdraw_readiness(), "announced, not rung: taken back");
    assert!(!s.withdraw_readiness(), "taken back once");
    // The writer rings (or not) within its write: the descriptor says at once.
    (&c).write_all(b"two").unwrap();
    assert_eq!(
        poll_now(f),
        PollFlags::OUT,
        "withdrawn: the write rang nobody"
    );
    assert_eq!(s.quick_poll(), Some((true, true)), "the bytes are there");
    s.settle_readiness();
    assert_eq!(
        poll_now(f),
        PollFlags::IN | PollFlags::OUT,
        "settled: readable"
    );
    assert_eq!(drain(&s), b"two");
    assert_eq!(poll_now(f), PollFlags::OUT);
    // Withdrawn with nothing arriving: the settle announces again, and the next write rings.
    assert!(s.withdraw_readiness());
    s.settle_readiness();
    assert_eq!(poll_now(f), PollFlags::OUT);
    (&c).write_all(b"three").unwrap();
    assert_eq!(
        poll_until(f, PollFlags::IN, LIVENESS),
        PollFlags::IN | PollFlags::OUT
    );
    assert_eq!(drain(&s), b"three");
    // Several rounds of withdraw, write, settle, read: every byte, in order.
    for round in 0..50u64 {
        assert!(s.withdraw_readiness(), "round {round}");
        let n = 100 + round as usize * 37;
        (&c).write_all(pattern(round << 20, n)).unwrap();
        assert_eq!(poll_now(f), PollFlags::OUT, "round {round}: rang nobody");
        s.settle_readiness();
        assert!(poll_now(f).contains(PollFlags::IN), "round {round}");
        assert!(drain(&s) == pattern(round << 20, n), "round {round}");
    }
}

/// `SmcStream::tag_readiness` (a preload library's only waiter, about to sleep on several
/// connections): the peer's thread rings the first tagged connection it writes to and skips
/// the others of the same sleep (their descriptors stay not readable); untagging tells which
/// were skipped, and their settle makes them readable. Another of the peer's threads, or a
/// new tag, rings again; untagged announcements ring each.
#[test]
fn one_ring_per_tagged_sleep() {
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = listen(&se);
    let port = l.local_addr().unwrap().port();
    let mut ends = Vec::new();
    for _ in 0..3 {
        let c = SmcStream::connect_with(&ce, ("127.0.0.1", port)).expect("connect");
        let (s, _) = l.accept().expect("accept");
        assert!(c.is_smc() && s.is_smc(), "{} / {}", c.mode(), s.mode());
        s.set_nonblocking(true).unwrap();
        s.set_level_readiness(true);
        s.set_deferred_readiness(true);
        // Read until WouldBlock: not readable, announced.
        assert_eq!(drain(&s), b"");
        assert_eq!(poll_now(fd(&s)), PollFlags::OUT);
        ends.push((c, s));
    }
    let readable = |s: &SmcStream| poll_now(fd(s)).contains(PollFlags::IN);
    for (round, tag) in [(0u64, 0x5eed_0001u64), (1, 0x5eed_0002)] {
        for (_, s) in &ends {
            s.tag_readiness(tag);
        }
        for (i, (c, s)) in ends.iter().enumerate() {
            (&*c).write_all(&[b'a' + i as u8; 3]).unwrap();
            // The writer rings (or not) within its write.
            assert_eq!(readable(s), i == 0, "round {round}: stream {i}");
        }
        let skipped: Vec<bool> = ends.iter().map(|(_, s)| s.untag_readiness()).collect();
        assert_eq!(skipped, [false, true, true], "round {round}");
        for (i, (_, s)) in ends.iter().enumerate() {
            s.settle_readiness();
            assert!(readable(s), "round {round}: stream {i} settled");
            assert_eq!(drain(s), [b'a' + i as u8; 3], "round {round}");
            assert!(!readable(s));
        }
    }
    // While a sleep is tagged, a read that says WouldBlock leaves the ring's byte (it may be
    // the sleep's one ring, the others skipped): the sleeper still finds the descriptor
    // readable. The untag reports the skipped one, and after it the drain takes the byte.
    for (_, s) in &ends {
        s.tag_readiness(0x5eed_00a0);
    }
    (&ends[0].0).write_all(b"r").unwrap();
    (&ends[1].0).write_all(b"s").unwrap();
    assert_eq!(drain(&ends[0].1), b"r");
    assert!(
        readable(&ends[0].1),
        "the tagged sleep's ring stays for the sleeper"
    );
    assert!(!readable(&ends[1].1), "skipped");
    let skipped: Vec<bool> = ends.iter().map(|(_, s)| s.untag_readiness()).collect();
    assert_eq!(skipped, [false, true, false]);
    assert_eq!(drain(&ends[0].1), b"");
    assert!(!readable(&ends[0].1), "untagged: the drain takes the byte");
    ends[1].1.settle_readiness();
    assert_eq!(drain(&ends[1].1), b"s");
    // A tag rung by one of the peer's threads is not skipped by another.
    for (_, s) in &ends {
        s.tag_readiness(0x5eed_0003);
    }
    (&ends[0].0).write_all(b"x").unwrap();
    std::thread::scope(|t| {
        t.spawn(|| (&ends[1].0).write_all(b"y").unwrap());
    });
    assert!(readable(&ends[0].1) && readable(&ends[1].1));
    let skipped: Vec<bool> = ends.iter().map(|(_, s)| s.untag_readiness()).collect();
    assert_eq!(skipped, [false, false, false]);
    // Untagged: every write rings.
    for (i, (c, s)) in ends.iter().enumerate() {
        drain(s);
        (&*c).write_all(b"z").unwrap();
        assert!(readable(s), "untagged stream {i}");
    }
}

/// Edge-triggered: after a read returned `WouldBlock`, the peer's next write gives an
/// `EPOLLIN` edge, once: no repeat while we do not read. More bytes arriving while we have
/// not drained may or may not give another edge (ET promises an edge per new readiness after
/// it was cleared, not per write), but they are all there when we read, and after the next
/// `WouldBlock` the next write gives an edge again.
#[test]
fn edge_readable_once_per_arrival_after_would_block() {
    let (_smcd, c, s) = pair();
    s.set_nonblocking(true).unwrap();
    let et = Ep::edge(fd(&s), Ev::IN | Ev::RDHUP);
    assert_eq!(et.wait(QUIET), None, "fresh: nothing to read");
    let mut off = 0u64;
    let mut extra_edges = 0;
    for round in 0..6 {
        let n = 700 + round * 1111;
        (&c).write_all(pattern(off, n)).unwrap();
        assert_eq!(et.wait(LIVENESS), Some(Ev::IN), "round {round}: an edge");
        assert_eq!(
            et.wait(QUIET),
            None,
            "round {round}: no repeat without a read"
        );
        // More while not drained.
        (&c).write_all(pattern(off + n as u64, 333)).unwrap();
        if et.wait(QUIET).is_some() {
            extra_edges += 1;
        }
        let got = drain(&s);
        assert_eq!(got.len(), n + 333, "round {round}: everything is there");
        assert!(got == pattern(off, n + 333));
        off += (n + 333) as u64;
        assert_eq!(poll_now(fd(&s)), PollFlags::OUT, "round {round}: drained");
    }
    eprintln!("edges for bytes that arrived while not drained: {extra_edges} of 6");
}

// ------------------------------------------------------------------------------------------
// Writable.

/// Writing until `WouldBlock` while the peer does not read makes the descriptor not
/// writable (and still not readable), for poll, level- and edge-triggered epoll; once the
/// peer has read everything (the window update comes when the reader has consumed more than
/// max(ring/10, 2304) bytes and the writer is blocked) it is writable again, with one edge.
/// Every byte arrives. Several rounds.
#[test]
fn writable_cleared_by_would_block_and_restored_by_peer_reading() {
    let (_smcd, c, s) = pair();
    c.set_nonblocking(true).unwrap();
    let lt_out = Ep::level(fd(&c), Ev::OUT);
    let et = Ep::edge(fd(&c), Ev::IN | Ev::OUT | Ev::RDHUP);
    assert_eq!(et.wait(Duration::ZERO), Some(Ev::OUT), "fresh: writable");
    let mut off = 0u64;
    for round in 0..4 {
        let n = fill(&c, off);
        assert!(n > 0, "round {round}: room at first");
        assert_eq!(poll_now(fd(&c)), PollFlags::empty(), "round {round}: full");
        assert_eq!(lt_out.wait(QUIET), None, "round {round}: full (level)");
        assert_eq!(et.wait(QUIET), None, "round {round}: full (edge)");
        assert_eq!(
            (&c).write(b"x").unwrap_err().kind(),
            ErrorKind::WouldBlock,
            "round {round}: still full"
        );
        read_pattern(&s, off, n);
        off += n;
        let ev = et.wait(LIVENESS);
        assert_eq!(ev, Some(Ev::OUT), "round {round}: writable again (edge)");
        assert_eq!(et.wait(QUIET), None, "round {round}: one edge");
        assert_eq!(poll_now(fd(&c)), PollFlags::OUT, "round {round}: writable");
        assert_eq!(lt_out.wait(Duration::ZERO), Some(Ev::OUT));
    }
    // And the room is real.
    let k = (&c).write(pattern(off, 1000)).unwrap();
    assert!(k > 0);
    read_pattern(&s, off, k as u64);
}

/// Reading and writing readiness are separate: a full send direction leaves the receive
/// direction's readiness alone and the other way round.
#[test]
fn read_and_write_readiness_are_separate() {
    let (_smcd, c, s) = pair();
    c.set_nonblocking(true).unwrap();
    let n = fill(&c, 0);
    assert_eq!(
        poll_now(fd(&c)),
        PollFlags::empty(),
        "full, nothing to read"
    );
    (&s).write_all(b"from the server").unwrap();
    let r = poll_until(fd(&c), PollFlags::IN, LIVENESS);
    assert_eq!(r, PollFlags::IN, "readable, still not writable");
    assert_eq!(drain(&c), b"from the server");
    assert_eq!(poll_now(fd(&c)), PollFlags::empty(), "neither");
    read_pattern(&s, 0, n);
    let r = poll_until(fd(&c), PollFlags::OUT, LIVENESS);
    assert_eq!(r, PollFlags::OUT, "writable, not readable");
}

// ------------------------------------------------------------------------------------------
// End of stream and the end of the connection.

/// The peer's `shutdown(Write)` makes the descriptor readable (level and edge) without a
/// call into the stream; a read returns 0, again and again; from then on the readiness shows
/// end of stream for good (`POLLIN | POLLRDHUP`); not hung up, still writable, and the other
/// direction still carries bytes.
#[test]
fn peer_shutdown_write_makes_readable_and_eof_stays() {
    let (_smcd, c, s) = pair();
    s.set_nonblocking(true).unwrap();
    assert_eq!(drain(&s), b"");
    let lt = Ep::level(fd(&s), Ev::IN | Ev::RDHUP);
    let et = Ep::edge(fd(&s), Ev::IN | Ev::RDHUP);
    c.shutdown(Shutdown::Write).unwrap();
    let r = poll_until(fd(&s), PollFlags::IN, LIVENESS);
    assert!(r.contains(PollFlags::IN | PollFlags::OUT), "{r:?}");
    assert!(!r.contains(PollFlags::HUP), "{r:?}");
    assert!(et.wait(LIVENESS).is_some_and(|e| e.contains(Ev::IN)));
    for _ in 0..3 {
        assert_eq!((&s).read(&mut [0u8; 8]).unwrap(), 0, "end of stream");
    }
    assert_eq!(
        poll_now(fd(&s)),
        PollFlags::IN | PollFlags::OUT | PollFlags::RDHUP,
        "end of stream stays"
    );
    assert_eq!(lt.wait(Duration::ZERO), Some(Ev::IN | Ev::RDHUP));
    (&s).write_all(b"after your FIN").unwrap();
    let mut back = [0u8; 14];
    (&c).read_exact(&mut back).unwrap();
    assert_eq!(&back, b"after your FIN");
}

/// `POLLRDHUP` once the peer shut down writing, before any read, as a TCP socket shows the
/// peer's FIN when it arrives (event loops that watch `EPOLLRDHUP`, or tokio's
/// `Ready::is_read_closed`, learn of the half-close without reading).
#[test]
fn peer_shutdown_write_gives_rdhup_before_a_read() {
    let (_smcd, c, s) = pair();
    s.set_nonblocking(true).unwrap();
    assert_eq!(drain(&s), b"");
    let et = Ep::edge(fd(&s), Ev::IN | Ev::RDHUP);
    c.shutdown(Shutdown::Write).unwrap();
    let r = poll_until(fd(&s), PollFlags::RDHUP, LIVENESS);
    assert_eq!(
        r,
        PollFlags::IN | PollFlags::OUT | PollFlags::RDHUP,
        "after the peer's shutdown(Write), before any read"
    );
    assert!(
        et.wait(LIVENESS)
            .is_some_and(|e| e.contains(Ev::IN | Ev::RDHUP))
    );
}

/// The same with bytes not read yet when the peer shuts down: TCP shows the FIN behind
/// unread data at once; the bytes come first, then 0.
#[test]
fn peer_shutdown_write_behind_unread_bytes_gives_rdhup() {
    let (_smcd, c, s) = pair();
    s.set_nonblocking(true).unwrap();
    (&c).write_all(b"last words").unwrap();
    assert!(poll_until(fd(&s), PollFlags::IN, LIVENESS).contains(PollFlags::IN));
    c.shutdown(Shutdown::Write).unwrap();
    let r = poll_until(fd(&s), PollFlags::RDHUP, LIVENESS);
    assert_eq!(
        r,
        PollFlags::IN | PollFlags::OUT | PollFlags::RDHUP,
        "FIN behind unread bytes, before any read"
    );
    let mut got = Vec::new();
    assert_eq!((&s).read_to_end(&mut got).unwrap(), 10);
    assert_eq!(got, b"last words");
}

/// The peer drops its stream (an orderly close, nothing unread): once its TCP connection has
/// ended, the descriptor is readable with `POLLRDHUP` without a call into the stream (level
/// and edge); a read returns 0, a write fails with `BrokenPipe`.
#[test]
fn peer_drop_gives_rdhup_and_eof() {
    let (_smcd, c, s) = pair();
    s.set_nonblocking(true).unwrap();
    assert_eq!(drain(&s), b"");
    let et = Ep::edge(fd(&s), Ev::IN | Ev::RDHUP);
    drop(c);
    let r = poll_until(fd(&s), PollFlags::RDHUP, LIVENESS);
    assert!(
        r.contains(PollFlags::IN | PollFlags::RDHUP),
        "after the peer's close: {r:?}"
    );
    let ev = et.wait(LIVENESS).expect("an edge for the close");
    assert!(ev.contains(Ev::IN), "{ev:?}");
    assert_eq!((&s).read(&mut [0u8; 8]).unwrap(), 0);
    assert_eq!((&s).write(b"x").unwrap_err().kind(), ErrorKind::BrokenPipe);
}

/// The peer drops its stream: our descriptor shows the end of stream (`IN | RDHUP`) without
/// a call into the stream, reads return 0 and writes fail; it is not hung up yet (TCP and the
/// kernel's `smc_poll` show `POLLHUP` only once both directions are shut down, see the next
/// test).
#[test]
fn peer_drop_gives_rdhup_then_hup_when_we_shut_down() {
    let (_smcd, c, s) = pair();
    s.set_nonblocking(true).unwrap();
    assert_eq!(drain(&s), b"");
    drop(c);
    let r = poll_until(fd(&s), PollFlags::RDHUP, LIVENESS);
    assert!(
        r.contains(PollFlags::IN | PollFlags::RDHUP),
        "after the peer's close: {r:?}"
    );
    assert!(
        !r.contains(PollFlags::HUP),
        "one direction is still open: {r:?}"
    );
    assert_eq!((&s).read(&mut [0u8; 8]).unwrap(), 0);
    assert_eq!((&s).write(b"x").unwrap_err().kind(), ErrorKind::BrokenPipe);
    s.shutdown(Shutdown::Write).unwrap();
    let r = poll_until(fd(&s), PollFlags::HUP, LIVENESS);
    assert!(r.contains(PollFlags::HUP), "both directions shut: {r:?}");
}

/// `POLLHUP` once both directions are shut down, as TCP (`sk_shutdown == SHUTDOWN_MASK`) and
/// the kernel's SMC (`smc_poll`) show it: the peer shut down writing (or closed), we read the
/// end of stream and shut down writing too.
#[test]
fn hup_once_both_directions_are_shut_down() {
    // Both ends half-close.
    let (_smcd, c, s) = pair();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!((&s).read(&mut [0u8; 8]).unwrap(), 0);
    s.shutdown(Shutdown::Write).unwrap();
    assert_eq!((&c).read(&mut [0u8; 8]).unwrap(), 0);
    for (name, st) in [("client", &c), ("server", &s)] {
        let r = poll_until(fd(st), PollFlags::HUP, LIVENESS);
        assert!(
            r.contains(PollFlags::HUP),
            "{name}: both directions shut: {r:?}"
        );
    }
    // The peer closes, we shut down writing.
    let (_smcd, c, s) = pair();
    drop(c);
    assert!(poll_until(fd(&s), PollFlags::IN, LIVENESS).contains(PollFlags::IN));
    assert_eq!((&s).read(&mut [0u8; 8]).unwrap(), 0);
    s.shutdown(Shutdown::Write).unwrap();
    let r = poll_until(fd(&s), PollFlags::HUP, LIVENESS);
    assert!(
        r.contains(PollFlags::HUP),
        "peer closed, we shut down writing: {r:?}"
    );
}

/// The peer drops its stream with bytes it never read (an abort): `POLLHUP`, and a read
/// fails with `ConnectionReset`.
#[test]
fn peer_abort_gives_hup_and_reset() {
    let (_smcd, c, s) = pair();
    s.set_nonblocking(true).unwrap();
    (&s).write_all(b"never read").unwrap();
    assert!(common::eventually(LIVENESS, || {
        c.smc_conn().unwrap().available().unwrap() == 10
    }));
    drop(c);
    let r = poll_until(fd(&s), PollFlags::HUP, LIVENESS);
    assert!(r.contains(PollFlags::HUP | PollFlags::IN), "{r:?}");
    let e = (&s).read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
}

/// A peer process holding an SMC-D connection is killed (SIGKILL: no close of any kind
/// reaches us but the kernel closing its TCP socket): a reader waiting on the descriptor
/// sees `POLLHUP` promptly, and a read fails with `ConnectionReset`/`ConnectionAborted`.
#[test]
fn killed_peer_process_hangs_up_a_waiting_reader() {
    let smcd = Smcd::start(BINS);
    let mut peer = Peer::spawn(&smcd.socket, "hold", &[]);
    let port: u16 = peer.expect("PORT").parse().unwrap();
    let engine = smcd.engine();
    let s = SmcStream::connect_with(&engine, ("127.0.0.1", port)).unwrap();
    assert!(s.is_smc(), "{}", s.mode());
    assert_eq!(peer.expect("MODE"), "smcd");
    s.set_nonblocking(true).unwrap();
    assert!(poll_until(fd(&s), PollFlags::IN, LIVENESS).contains(PollFlags::IN));
    assert_eq!(drain(&s), b"hello");
    let et = Ep::edge(fd(&s), Ev::IN | Ev::RDHUP);
    assert_eq!(poll_now(fd(&s)), PollFlags::OUT);
    let t0 = Instant::now();
    peer.kill();
    let r = poll_until(fd(&s), PollFlags::HUP, LIVENESS);
    let took = t0.elapsed();
    assert!(
        r.contains(PollFlags::HUP | PollFlags::IN),
        "no hang-up {took:?} after the peer was killed: {r:?}"
    );
    eprintln!("hang-up {took:?} after SIGKILL");
    assert!(et.wait(LIVENESS).is_some(), "an edge for the hang-up");
    let e = (&s).read(&mut [0u8; 8]).unwrap_err();
    assert!(SmcStream::is_reset(&e), "read after the peer died: {e:?}");
}

/// The same for a writer that found the ring full (the peer does not read) and waits for
/// writable: the hang-up makes it writable (a write would not block: it fails) and a write
/// fails with `ConnectionReset`/`ConnectionAborted`.
#[test]
fn killed_peer_process_hangs_up_a_blocked_writer() {
    let smcd = Smcd::start(BINS);
    let mut peer = Peer::spawn(&smcd.socket, "hold", &[]);
    let port: u16 = peer.expect("PORT").parse().unwrap();
    let engine = smcd.engine();
    let s = SmcStream::connect_with(&engine, ("127.0.0.1", port)).unwrap();
    assert!(s.is_smc(), "{}", s.mode());
    assert_eq!(peer.expect("WROTE"), "5");
    s.set_nonblocking(true).unwrap();
    let mut hello = [0u8; 5];
    assert!(poll_until(fd(&s), PollFlags::IN, LIVENESS).contains(PollFlags::IN));
    (&s).read_exact(&mut hello).unwrap();
    assert_eq!(drain(&s), b"");
    assert!(fill(&s, 0) > 0);
    assert_eq!(poll_now(fd(&s)), PollFlags::empty(), "full");
    let et = Ep::edge(fd(&s), Ev::OUT);
    assert_eq!(et.wait(QUIET), None);
    peer.kill();
    let r = poll_until(fd(&s), PollFlags::HUP, LIVENESS);
    assert!(
        r.contains(PollFlags::HUP | PollFlags::OUT),
        "a blocked writer after the peer was killed: {r:?}"
    );
    assert!(et.wait(LIVENESS).is_some(), "an edge for the hang-up");
    let e = (&s).write(b"x").unwrap_err();
    assert!(SmcStream::is_reset(&e), "write after the peer died: {e:?}");
}

// ------------------------------------------------------------------------------------------
// Under load: no lost wake-ups.

/// An edge-triggered event loop that reads until `WouldBlock` and waits for the next edge
/// receives 16 MiB that the peer writes in random pieces, every byte in order; and one that
/// writes until `WouldBlock` and waits for the next edge sends 16 MiB that the peer reads in
/// random pieces. A lost wake-up would stall either for [`LIVENESS`].
#[test]
fn edge_triggered_loops_lose_no_wakeups() {
    const TOTAL: u64 = 16 << 20;
    let (_smcd, c, s) = pair();
    let seed = common::Rng::seed();
    eprintln!("seed {seed}");
    // Server → client, the client's loop reading.
    let tx = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let mut rng = common::Rng::new(seed);
        common::send_pattern(&tx, TOTAL, &mut rng, 100 * 1024).unwrap();
    });
    c.set_nonblocking(true).unwrap();
    let et = Ep::edge(fd(&c), Ev::IN | Ev::RDHUP);
    let mut off = 0u64;
    let mut buf = vec![0u8; 48 * 1024];
    while off < TOTAL {
        match (&c).read(&mut buf) {
            Ok(0) => panic!("end of stream at {off}"),
            Ok(n) => {
                assert!(buf[..n] == *pattern(off, n), "mismatch at {off}");
                off += n as u64;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(
                    et.wait(LIVENESS).is_some(),
                    "no edge at {off}: lost wake-up"
                );
            }
            Err(e) => panic!("read at {off}: {e}"),
        }
    }
    sender.join().unwrap();
    // Client → server, the client's loop writing.
    let rx = s.try_clone().unwrap();
    let receiver = std::thread::spawn(move || {
        let mut rng = common::Rng::new(seed ^ 0x5555);
        let mut r = &rx;
        let mut buf = vec![0u8; 100 * 1024];
        let mut off = 0u64;
        while off < TOTAL {
            let want = rng.range(1, buf.len()).min((TOTAL - off) as usize);
            let n = r.read(&mut buf[..want]).unwrap();
            assert!(n > 0 && buf[..n] == *pattern(off, n), "mismatch at {off}");
            off += n as u64;
        }
    });
    let et = Ep::edge(fd(&c), Ev::OUT);
    let mut off = 0u64;
    while off < TOTAL {
        let n = (64 * 1024).min((TOTAL - off) as usize);
        match (&c).write(pattern(off, n)) {
            Ok(k) => off += k as u64,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(
                    et.wait(LIVENESS).is_some(),
                    "no edge at {off}: lost wake-up"
                );
            }
            Err(e) => panic!("write at {off}: {e}"),
        }
    }
    receiver.join().unwrap();
}

// ------------------------------------------------------------------------------------------
// Non-blocking connect.

/// Drives a connect with `poll` on its descriptor (what `wants_read` says, until its deadline
/// or [`LIVENESS`]).
fn finish_with_poll(mut c: SmcConnecting) -> std::io::Result<SmcStream> {
    finish_with_poll_ref(&mut c)
}

/// Drives a connect with edge-triggered epoll on its descriptor: `try_finish` returning
/// `None` must have gone as far as the socket allows, or the next edge never comes.
fn finish_with_edges(mut c: SmcConnecting) -> std::io::Result<SmcStream> {
    let et = Ep::edge(c.as_fd(), Ev::IN | Ev::OUT | Ev::RDHUP);
    let give_up = Instant::now() + LIVENESS;
    loop {
        if let Some(s) = c.try_finish()? {
            // The epoll instance goes first: it watches a socket the stream now owns.
            drop(et);
            return Ok(s);
        }
        let until = c.deadline().map_or(give_up, |d| d.min(give_up));
        let ev = et.wait(until.saturating_duration_since(Instant::now()));
        assert!(
            ev.is_some() || c.deadline().is_some_and(|d| Instant::now() >= d),
            "no edge while the connect waits for {}: lost wake-up",
            if c.wants_read() {
                "readable"
            } else {
                "writable"
            }
        );
    }
}

fn smc_server(engine: &Arc<Engine>) -> (smcd_engine::SmcListener, SocketAddr) {
    let l = listen(engine);
    let a = l.local_addr().unwrap();
    (l, a)
}

/// A non-blocking connect to an SMC listener finishes as SMC-D, driven by `poll` or by
/// edge-triggered epoll; the stream carries bytes and its readiness starts as a fresh one.
#[test]
fn nonblocking_connect_to_smc_listener() {
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let (l, addr) = smc_server(&se);
    let server = std::thread::spawn(move || {
        for _ in 0..2 {
            let (s, _) = l.accept().unwrap();
            assert!(s.is_smc(), "server side: {}", s.mode());
            let mut b = [0u8; 4];
            (&s).read_exact(&mut b).unwrap();
            (&s).write_all(&b).unwrap();
        }
    });
    for edges in [false, true] {
        let c = SmcStream::connect_nonblocking_with(&ce, addr).unwrap();
        let s = if edges {
            finish_with_edges(c)
        } else {
            finish_with_poll(c)
        }
        .expect("connect");
        assert!(s.is_smc(), "edges {edges}: {}", s.mode());
        assert_eq!(poll_now(fd(&s)), PollFlags::OUT, "edges {edges}: fresh");
        (&s).write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        (&s).read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
    }
    server.join().unwrap();
}

/// `SmcConnecting::decline_smc` (what the preload library asks when the program forks with
/// the connect in flight): the client answers the SMC listener's Accept with a Decline
/// (`SMC_CLC_DECL_INTERR`), both ends fall back to TCP with that reason (ours local, the
/// server's from its peer), and the bytes go through TCP exactly.
#[test]
fn nonblocking_connect_told_to_decline_ends_in_tcp() {
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let (l, addr) = smc_server(&se);
    let server = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut b = [0u8; 4];
        (&s).read_exact(&mut b).unwrap();
        (&s).write_all(&b).unwrap();
        (s.is_smc(), s.fallback())
    });
    let mut c = SmcStream::connect_nonblocking_with(&ce, addr).unwrap();
    assert!(c.decline_smc(), "SMC is not decided before the Accept");
    let s = finish_with_poll(c).expect("connect");
    assert!(!s.is_smc(), "{}", s.mode());
    assert_eq!(s.fallback_reason(), Some(ReasonCode::INTERR));
    s.set_nonblocking(false).unwrap();
    (&s).write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    (&s).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
    let (smc, fb) = server.join().unwrap();
    assert!(!smc, "the server fell back too");
    assert_eq!(fb.map(|f| f.peer), Some(ReasonCode::INTERR), "{fb:?}");
}

/// A non-blocking connect to a plain TCP listener (not ours) finishes as TCP with
/// `PEERNOSMC`, and the stream's readiness is the socket's.
#[test]
fn nonblocking_connect_to_plain_tcp_listener_falls_back() {
    let smcd = Smcd::start(BINS);
    let ce = smcd.engine();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        for _ in 0..2 {
            let (mut t, _) = l.accept().unwrap();
            let mut b = [0u8; 4];
            t.read_exact(&mut b).unwrap();
            t.write_all(b"pong").unwrap();
        }
    });
    for edges in [false, true] {
        let c = SmcStream::connect_nonblocking_with(&ce, addr).unwrap();
        let s = if edges {
            finish_with_edges(c)
        } else {
            finish_with_poll(c)
        }
        .expect("connect");
        assert!(!s.is_smc());
        assert_eq!(s.fallback_reason(), Some(ReasonCode::PEERNOSMC));
        s.set_nonblocking(true).unwrap();
        assert_eq!(poll_now(fd(&s)), PollFlags::OUT, "fresh TCP");
        (&s).write_all(b"ping").unwrap();
        assert!(poll_until(fd(&s), PollFlags::IN, LIVENESS).contains(PollFlags::IN));
        // The server closes after its answer: "pong", then end of stream.
        let mut got = Vec::new();
        let mut buf = [0u8; 16];
        loop {
            match (&s).read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    assert!(poll_until(fd(&s), PollFlags::IN, LIVENESS).contains(PollFlags::IN));
                }
                Err(e) => panic!("read: {e}"),
            }
        }
        assert_eq!(got, b"pong");
    }
    server.join().unwrap();
}

/// A non-blocking connect to a port nobody listens on fails with `ConnectionRefused`: from
/// `try_finish` (what `SO_ERROR` says), or at once if the kernel already knew.
#[test]
fn nonblocking_connect_to_closed_port_is_refused() {
    let smcd = Smcd::start(BINS);
    let ce = smcd.engine();
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    for edges in [false, true] {
        let r = SmcStream::connect_nonblocking_with(&ce, addr).and_then(|c| {
            if edges {
                finish_with_edges(c)
            } else {
                finish_with_poll(c)
            }
        });
        let e = r.map(|s| s.mode()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "edges {edges}: {e}");
    }
}

/// After `try_finish` gave the connect's error, it keeps failing: the socket is not
/// connected, so no stream may come out of it (a loop that looks once more must not get a
/// "connected" TCP stream on a refused socket).
#[test]
fn try_finish_after_refused_keeps_failing() {
    let smcd = Smcd::start(BINS);
    let ce = smcd.engine();
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let Ok(mut c) = SmcStream::connect_nonblocking_with(&ce, addr) else {
        return; // refused at once: nothing to finish
    };
    let e = finish_with_poll_ref(&mut c).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
    match c.try_finish() {
        Err(_) => {}
        Ok(None) => {}
        Ok(Some(s)) => panic!("a stream out of a refused connect: {}", s.mode()),
    }
}

/// A connect in flight costs its process one descriptor, the socket (an event loop at 10,000
/// connects used to pay a duplicate each as well), and that socket is what an event loop
/// registers. Once the connect failed, the socket is closed and the descriptor is a
/// placeholder that is valid and never ready.
#[test]
fn a_connect_in_flight_costs_its_socket_alone() {
    let smcd = Smcd::start(BINS);
    let mut child = Peer::spawn(&smcd.socket, "connects", &[]);
    assert_eq!(child.expect("DONE"), "1");
    assert!(child.wait(LIVENESS * 3).success());

    let ce = smcd.engine();
    let refused = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let Ok(mut c) = SmcStream::connect_nonblocking_with(&ce, refused) else {
        return; // refused at once: no descriptor to look at
    };
    let e = finish_with_poll_ref(&mut c).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
    let fd = c.as_fd();
    rustix::io::fcntl_getfd(fd).expect("a valid descriptor after the failure");
    assert!(poll_now(fd).is_empty(), "the placeholder is never ready");
}

/// 16 connects in flight to a listener that never accepts: 16 descriptors more (the sockets),
/// each of them the socket itself.
fn connects_body(ce: &Arc<Engine>) {
    // A listener that never accepts: the TCP connects complete in its backlog.
    let quiet = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = quiet.local_addr().unwrap();
    // The engine's own descriptors (smcd's session, status area) come with its first connect.
    drop(finish_with_poll(
        SmcStream::connect_nonblocking_with(ce, addr).unwrap(),
    ));
    let pid = std::process::id();
    let before = open_fds(pid);
    let n = 16;
    let cs: Vec<_> = (0..n)
        .map(|_| SmcStream::connect_nonblocking_with(ce, addr).unwrap())
        .collect();
    let grew = open_fds(pid) - before;
    // The engine's own threads may open one or two meanwhile; a duplicate each would be n
    // more.
    assert!(
        (n..n + 4).contains(&grew),
        "{n} connects opened {grew} descriptors"
    );
    for c in &cs {
        let kind = rustix::fs::fstat(c.as_fd()).unwrap().st_mode & libc::S_IFMT;
        assert_eq!(kind, libc::S_IFSOCK, "the descriptor is the socket");
    }
    drop(cs);
    drop(quiet);
}

/// The descriptor of an `SmcConnecting` can still be asked for after `try_finish` gave the
/// stream: `AsyncFd` (and any owner that deregisters on drop) asks its inner value for the
/// descriptor again when it is dropped, and tokio's `AsyncFd::register` requires the same
/// descriptor from every `as_raw_fd` call.
#[test]
fn connecting_descriptor_after_finish() {
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let (l, addr) = smc_server(&se);
    let server = std::thread::spawn(move || l.accept().map(|(s, _)| s.is_smc()));
    let mut c = SmcStream::connect_nonblocking_with(&ce, addr).unwrap();
    let raw = c.as_raw_fd();
    let s = finish_with_poll_ref(&mut c).expect("connect");
    assert!(s.is_smc());
    let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.as_raw_fd()));
    assert_eq!(again.ok(), Some(raw), "as_raw_fd after try_finish");
    assert!(server.join().unwrap().unwrap());
}

/// [`finish_with_poll`] on a borrowed connect.
fn finish_with_poll_ref(c: &mut SmcConnecting) -> std::io::Result<SmcStream> {
    let give_up = Instant::now() + LIVENESS;
    loop {
        if let Some(s) = c.try_finish()? {
            return Ok(s);
        }
        assert!(Instant::now() < give_up, "the connect did not finish");
        let ev = if c.wants_read() {
            PollFlags::IN
        } else {
            PollFlags::OUT
        };
        let until = c.deadline().map_or(give_up, |d| d.min(give_up));
        let left = until.saturating_duration_since(Instant::now());
        let mut fds = [PollFd::new(&*c, ev)];
        let _ = rustix::event::poll(&mut fds, Some(&ts(left)));
    }
}

// ------------------------------------------------------------------------------------------
// Many connections of one link group, and what they cost.

/// Descriptors open in process `pid`.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/PID/fd")
        .count()
}

/// Many connections in one link group, each with a readiness descriptor made before its peer
/// writes: their bells share the group's one channel, are taken by id in any order, and every
/// event loop is woken. An idle connection costs each engine its TCP socket, plus the
/// readiness pair where one is asked for and the peer's bell where the peer's event loop was
/// rung; smcd only the two DMBs' memfds (it used to cost the server six descriptors, the
/// client four and smcd six: a channel per DMB, kept at both ends and in smcd, and a
/// duplicate of the TCP socket for the liveness watcher).
#[test]
fn bells_of_one_link_group_share_its_channel() {
    bells(64);
}

/// As [`bells_of_one_link_group_share_its_channel`] with more connections than a link group
/// takes (`smcr_max_conns_per_lgr`, 255): the server makes a second group with the same
/// client engine, and each connection joins the client's counterpart of the group the server
/// put it in, whose bell channel carries its bell. (Joining any group to the same peer, as
/// the kernel's client does, lost the bells of the second group: its event loops were never
/// woken.)
#[test]
fn bells_reach_connections_of_a_second_link_group() {
    bells(300);
}

fn bells(n: usize) {
    let smcd = Smcd::start(BINS);
    let args = [smcd.pid().to_string(), n.to_string()];
    let mut child = Peer::spawn(&smcd.socket, "bells", &args);
    assert_eq!(child.expect("DONE"), "1");
    assert!(child.wait(LIVENESS * 3).success());
}

fn bells_body(se: Arc<Engine>, ce: Arc<Engine>, smcd_pid: u32, n: usize) {
    let l = listen(&se);
    let port = l.local_addr().unwrap().port();
    // A first connection makes the link group, so what follows is per connection only.
    let first = SmcStream::connect_with(&ce, ("127.0.0.1", port)).expect("connect");
    let (first_s, _) = l.accept().expect("accept");
    let _ = fd(&first_s);
    let me = std::process::id();
    let (mine0, smcd0) = (open_fds(me), open_fds(smcd_pid));
    let mut pairs = Vec::new();
    for _ in 0..n {
        let c = SmcStream::connect_with(&ce, ("127.0.0.1", port)).expect("connect");
        let (s, _) = l.accept().expect("accept");
        assert!(
            c.is_smc() && s.is_smc(),
            "SMC-D: {} / {}",
            c.mode(),
            s.mode()
        );
        pairs.push((c, s));
    }
    // The first connection and these, at most 255 in a group.
    assert_eq!(
        se.lgrs.list().len(),
        (n + 1).div_ceil(255),
        "link groups for {n} connections"
    );
    // Every server connection waits in one epoll set, edge-triggered, before any byte.
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
    for (i, (_, s)) in pairs.iter().enumerate() {
        s.set_nonblocking(true).unwrap();
        assert!(drain(s).is_empty());
        epoll::add(
            &ep,
            fd(s),
            epoll::EventData::new_u64(i as u64),
            Ev::IN | Ev::ET,
        )
        .unwrap();
    }
    // The clients write in the reverse order: each bell is found behind the others.
    for (i, (c, _)) in pairs.iter().enumerate().rev() {
        (&*c).write_all(&[i as u8]).unwrap();
    }
    let mut woken = vec![false; n];
    let deadline = Instant::now() + LIVENESS;
    let mut events = Vec::with_capacity(n);
    while woken.iter().any(|w| !w) && Instant::now() < deadline {
        events.clear();
        epoll::wait(
            &ep,
            rustix::buffer::spare_capacity(&mut events),
            Some(&ts(Duration::from_millis(100))),
        )
        .or_else(|e| {
            if e == rustix::io::Errno::INTR {
                Ok(0)
            } else {
                Err(e)
            }
        })
        .unwrap();
        for ev in &events {
            let i = ev.data.u64() as usize;
            let got = drain(&pairs[i].1);
            if !got.is_empty() {
                assert_eq!(got, [i as u8], "connection {i} read another's byte");
                woken[i] = true;
            }
        }
    }
    let missed: Vec<_> = (0..n).filter(|&i| !woken[i]).collect();
    assert!(missed.is_empty(), "event loops never woken: {missed:?}");
    let (mine, smcd_fds) = (open_fds(me), open_fds(smcd_pid));
    // Per connection here: the server's TCP socket and readiness pair, the client's TCP
    // socket and the server's bell: 5 (and 10 before); per further link group its bell
    // channel's two ends; and the few process-wide ones of the note below.
    assert!(
        mine <= mine0 + 5 * n + 2 * n.div_ceil(255) + 12,
        "this process went from {mine0} to {mine} descriptors for {n} connections"
    );
    assert!(
        smcd_fds <= smcd0 + 2 * n + 8,
        "smcd went from {smcd0} to {smcd_fds} descriptors for {n} connections"
    );
    // Closed, they give back every descriptor; smcd keeps the memfds of the DMBs waiting for
    // reuse in the group (registered, as the kernel keeps a group's buffers).
    drop(ep);
    drop(pairs);
    let settled = |what: &str, pid: u32, base: usize| {
        let deadline = Instant::now() + LIVENESS;
        loop {
            let n = open_fds(pid);
            if n <= base {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {n} descriptors after closing, {base} before"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // A few process-wide descriptors may appear after the first count, when the threads that
    // make them get there (the liveness watcher's epoll set, each engine's events channel
    // and housekeeping copy of its bell set): 12, against 64 or 300 if a connection leaked
    // one (8 was one short once in CI beside two hogs).
    settled("this process", me, mine0 + 12);
    settled("smcd", smcd_pid, smcd0 + 2 * n + 4);
    drop((first, first_s));
}

// ------------------------------------------------------------------------------------------
// How bells travel: `pidfd_getfd` from the owner's process where allowed, else the channel.

/// Connections one after the other between this process's engine and an `event-echo` child
/// (run through `prefix`), each side waiting in an edge-triggered epoll loop, so each rings
/// the other's bell. Returns, per connection, our DMB's engine word and the child's.
fn echo_bells(prefix: &[&str], n: usize, lie: &[String]) -> Vec<(u64, u64)> {
    let smcd = Smcd::start(BINS);
    let mut args = vec![n.to_string()];
    args.extend_from_slice(lie);
    let mut child = Peer::spawn_with(prefix, &smcd.socket, "event-echo", &args);
    let port: u16 = child.expect("PORT").parse().unwrap();
    let ce = Engine::new(smcd_engine::EngineConfig {
        socket: smcd.socket.clone(),
        ..smcd_engine::EngineConfig::default()
    });
    let mut words = Vec::new();
    for i in 0..n {
        let c = SmcStream::connect_with(&ce, ("127.0.0.1", port)).expect("connect");
        assert!(c.is_smc(), "connection {i}: {}", c.mode());
        c.set_nonblocking(true).unwrap();
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
        epoll::add(&ep, fd(&c), epoll::EventData::new_u64(0), Ev::IN | Ev::ET).unwrap();
        assert!(drain(&c).is_empty());
        // The child's loop sleeps in epoll by now or soon: our byte must ring its bell, its
        // echo ours.
        std::thread::sleep(Duration::from_millis(5));
        (&c).write_all(&[i as u8]).unwrap();
        let deadline = Instant::now() + LIVENESS;
        let mut got = drain(&c);
        while got.is_empty() {
            assert!(
                Instant::now() < deadline,
                "connection {i}: never woken for the echo"
            );
            wait_event(&ep, Duration::from_millis(100));
            got = drain(&c);
        }
        assert_eq!(got, [i as u8], "connection {i}");
        let link = c.smc_conn().expect("SMC-D").link();
        words.push((
            link.own()
                .map
                .epoch_word()
                .load(std::sync::atomic::Ordering::Acquire),
            link.peer()
                .map
                .epoch_word()
                .load(std::sync::atomic::Ordering::Acquire),
        ));
    }
    assert_eq!(child.expect("SMC"), n.to_string());
    assert!(child.wait(LIVENESS).success());
    words
}

/// Whether a child can run as nobody here (root and `setpriv`); otherwise the test is skipped
/// (and fails under CI).
fn can_run_as_nobody(test: &str) -> bool {
    !common::skip_unless_root(test) && !common::skip_unless_tool(test, "setpriv")
}

/// Between processes of one user the bells are taken with `pidfd_getfd`: after the first
/// connection has shown it works (each side tried it once), neither side sends its bell
/// through the link group's channel any more (no `SCM_RIGHTS` of a Unix socket, which makes the
/// kernel queue its garbage collector at every Unix socket close on the host), and every event
/// loop is still woken.
#[test]
fn bells_are_taken_from_the_owners_process() {
    use smcd_engine::transport::smcd::{BELL_LOCATED, BELL_SENT};
    let words = echo_bells(&[], 6, &[]);
    for (i, (own, peer)) in words.iter().enumerate() {
        assert!(
            own & BELL_LOCATED != 0 && peer & BELL_LOCATED != 0,
            "connection {i}"
        );
    }
    for (i, (own, peer)) in words.iter().enumerate().skip(2) {
        assert_eq!(
            own & BELL_SENT,
            0,
            "connection {i}: our bell went through the channel"
        );
        assert_eq!(
            peer & BELL_SENT,
            0,
            "connection {i}: the peer's went through the channel"
        );
    }
}

/// A peer of another user may not take our bells from our process (`pidfd_getfd` needs
/// ptrace rights over it): it learns that once, says so in its DMBs, and our bells keep going
/// through the channel, while root takes its bells directly. Every event loop is woken.
#[test]
fn bells_to_another_user_go_through_the_channel() {
    use smcd_engine::transport::smcd::{BELL_LOCATED, BELL_SENT};
    if !can_run_as_nobody("bells_to_another_user_go_through_the_channel") {
        return;
    }
    let words = echo_bells(common::AS_NOBODY, 6, &[]);
    for (i, (own, peer)) in words.iter().enumerate().skip(2) {
        assert!(
            own & BELL_SENT != 0,
            "connection {i}: nobody cannot take root's bells"
        );
        assert_eq!(
            peer & BELL_SENT,
            0,
            "connection {i}: root takes nobody's bells itself"
        );
        assert!(peer & BELL_LOCATED != 0, "connection {i}");
    }
}

/// A bell locator is only numbers in shared memory: a peer could name any socket of any
/// process we may ptrace. We take a bell only if the kernel says it was made by that process as
/// a process of the peer engine's user: a peer of another user that names one of our sockets
/// gets nothing rung, shut down or read there.
#[test]
fn a_peer_cannot_make_us_ring_a_socket_of_another_user() {
    use smcd_engine::transport::smcd::BELL_SENT;
    if !can_run_as_nobody("a_peer_cannot_make_us_ring_a_socket_of_another_user") {
        return;
    }
    // The socket the peer names: the far end of a pair of ours, as a bell would be.
    let (near, victim) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    let ino = rustix::fs::fstat(&victim).unwrap().st_ino;
    let lie = [
        std::process::id().to_string(),
        victim.as_raw_fd().to_string(),
        ino.to_string(),
    ];
    let words = echo_bells(common::AS_NOBODY, 4, &lie);
    // The lying connection's bell was only to be had from its locator.
    assert_eq!(
        words[3].1 & BELL_SENT,
        0,
        "the channel carried the last bell"
    );
    let seen = poll_now(near.as_fd());
    assert!(
        !seen.intersects(PollFlags::IN | PollFlags::RDHUP | PollFlags::HUP),
        "our socket was rung: {seen:?}"
    );
}
