//! Every case that must fall back to TCP rather than fail, with the kernel's reason codes, and
//! without losing a byte: after the fallback both ends exchange application data and see
//! exactly what the other wrote.
//!
//! The misbehaving peers here are real: a client or server that registers with the real `smcd`
//! like an engine and then speaks broken CLC over a real TCP connection.

mod common;

use common::{BINS, Smcd, listen, read_clc};
use rustix::net::{AddressFamily, SocketFlags, SocketType};
use smc_proto::clc::{AcceptConfirm, ClcMessage, Decline, ReasonCode, SMC_V2, SmcdAcceptConfirm};
use smcd_engine::ipc::SmcdSession as LoopbackDevice;

use smcd_engine::{Engine, EngineConfig, Fallback, Mode, SmcStream};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

#[test]
#[ignore = "entry point of child processes"]
fn child_entry() {
    common::child_main();
}

/// Application bytes go both ways and arrive intact.
fn exchange(a: &SmcStream, b: &mut TcpStream) {
    (&*a).write_all(b"app bytes from the engine").unwrap();
    let mut got = [0u8; 25];
    b.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"app bytes from the engine");
    b.write_all(b"and back").unwrap();
    let mut got = [0u8; 8];
    (&*a).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"and back");
}

fn fallback(local: ReasonCode, peer: ReasonCode) -> Mode {
    Mode::Tcp(Fallback { local, peer })
}

/// `smcd` not running: the client has no SMC-D device (NOSMCDEV) and never proposes; a
/// listener without `smcd` sees plain clients (PEERNOSMC).
#[test]
fn smcd_not_running() {
    let nowhere = std::env::temp_dir().join(format!("no-smcd-{}.sock", std::process::id()));
    let engine = Engine::new(EngineConfig {
        socket: nowhere,
        ..EngineConfig::default()
    });
    let l = listen(&engine);
    let port = l.local_addr().unwrap().port();
    let c = SmcStream::connect_with(&engine, ("127.0.0.1", port)).unwrap();
    let (s, _) = l.accept().unwrap();
    assert_eq!(c.mode(), Mode::Tcp(Fallback::local(ReasonCode::NOSMCDEV)));
    assert_eq!(s.mode(), Mode::Tcp(Fallback::local(ReasonCode::PEERNOSMC)));
    (&c).write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    (&s).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
}

/// An SMC client of a plain TCP server: PEERNOSMC, no CLC byte on the wire.
#[test]
fn peer_not_smc_capable() {
    let smcd = Smcd::start(BINS);
    let engine = smcd.engine();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = SmcStream::connect_with(&engine, l.local_addr().unwrap()).unwrap();
    let (mut s, _) = l.accept().unwrap();
    assert_eq!(c.mode(), Mode::Tcp(Fallback::local(ReasonCode::PEERNOSMC)));
    exchange(&c, &mut s);
}

/// The server cannot get a DMB: it declines with MEM; the client records PEERDECL/MEM.
#[test]
fn buffer_allocation_failure() {
    let smcd = Smcd::start_with(BINS, &["--max-dmbs", "0"]);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = listen(&se);
    let port = l.local_addr().unwrap().port();
    let c = SmcStream::connect_with(&ce, ("127.0.0.1", port)).unwrap();
    let (s, _) = l.accept().unwrap();
    assert_eq!(s.mode(), Mode::Tcp(Fallback::local(ReasonCode::MEM)));
    assert_eq!(c.mode(), fallback(ReasonCode::PEERDECL, ReasonCode::MEM));
    (&s).write_all(b"over tcp").unwrap();
    let mut b = [0u8; 8];
    (&c).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"over tcp");
}

/// A fake SMC server: registered with `smcd` like a listener, it answers the Proposal with
/// `reply` (raw bytes), then reads what the client sends back (a Decline, when the client
/// declines) and hands over the TCP stream.
fn fake_server(
    smcd: &Smcd,
    expect_answer: bool,
    reply: impl FnOnce(&ClcMessage) -> Vec<u8> + Send + 'static,
) -> (
    SocketAddr,
    std::thread::JoinHandle<(TcpStream, ClcMessage, Option<ClcMessage>)>,
) {
    let dev = LoopbackDevice::open(&smcd.socket).unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let (chan, _) = dev.listen(addr, 16, false, None).unwrap();
    let h = std::thread::spawn(move || {
        let _registration = (chan, dev);
        let (mut s, _) = tcp.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let proposal = read_clc(&s).unwrap().expect("a well-formed proposal");
        s.write_all(&reply(&proposal)).unwrap();
        // The client's answer, when it declines.
        let answer = if expect_answer {
            read_clc(&s).ok().and_then(Result::ok)
        } else {
            None
        };
        (s, proposal, answer)
    });
    (addr, h)
}

/// The server declines: the client falls back with PEERDECL and the server's code.
#[test]
fn peer_declines() {
    let smcd = Smcd::start(BINS);
    let (addr, server) = fake_server(&smcd, false, |_| {
        ClcMessage::Decline(Decline::new(ReasonCode::NOV2DEXT, SMC_V2)).to_vec()
    });
    let engine = smcd.engine();
    let c = SmcStream::connect_with(&engine, addr).unwrap();
    assert_eq!(
        c.mode(),
        fallback(ReasonCode::PEERDECL, ReasonCode::NOV2DEXT)
    );
    let (mut s, proposal, _) = server.join().unwrap();
    assert!(matches!(proposal, ClcMessage::Proposal(_)));
    exchange(&c, &mut s);
}

/// A malformed Accept (broken lengths) is declined with a reason, and both go TCP.
#[test]
fn malformed_accept() {
    let smcd = Smcd::start(BINS);
    let (addr, server) = fake_server(&smcd, true, |_| {
        let body = SmcdAcceptConfirm {
            gid: 1,
            token: 2,
            dmbe_size: 2,
            chid: 0xffff,
            ..SmcdAcceptConfirm::default()
        };
        let mut bytes = ClcMessage::Accept(AcceptConfirm::smcd_v2(body, None)).to_vec();
        // Break the trailer: the eyecatcher at the end no longer matches.
        let n = bytes.len();
        bytes[n - 1] ^= 0xff;
        bytes
    });
    let engine = smcd.engine();
    let c = SmcStream::connect_with(&engine, addr).unwrap();
    let Mode::Tcp(fb) = c.mode() else {
        panic!("expected a fallback")
    };
    assert_ne!(fb.local, ReasonCode(0));
    assert_eq!(fb.peer, ReasonCode(0));
    let (mut s, _, answer) = server.join().unwrap();
    match answer {
        Some(ClcMessage::Decline(d)) => {
            assert_eq!(d.reason, fb.local, "the Decline carries our reason")
        }
        other => panic!("expected a Decline, got {other:?}"),
    }
    exchange(&c, &mut s);
}

/// An unexpected message (a Confirm where an Accept belongs) is declined (CNFERR).
#[test]
fn unexpected_clc_message() {
    let smcd = Smcd::start(BINS);
    let (addr, server) = fake_server(&smcd, true, |_| {
        let body = SmcdAcceptConfirm {
            gid: 1,
            token: 2,
            dmbe_size: 2,
            chid: 0xffff,
            ..SmcdAcceptConfirm::default()
        };
        ClcMessage::Confirm(AcceptConfirm::smcd_v2(body, None)).to_vec()
    });
    let engine = smcd.engine();
    let c = SmcStream::connect_with(&engine, addr).unwrap();
    assert_eq!(c.mode(), Mode::Tcp(Fallback::local(ReasonCode::CNFERR)));
    let (mut s, _, answer) = server.join().unwrap();
    assert!(matches!(answer, Some(ClcMessage::Decline(d)) if d.reason == ReasonCode::CNFERR));
    exchange(&c, &mut s);
}

/// An Accept naming an SMC-D device other than the listener's (a GID smcd did not announce) is
/// declined.
#[test]
fn accept_from_an_unexpected_device() {
    let smcd = Smcd::start(BINS);
    let (addr, server) = fake_server(&smcd, true, |_| {
        let body = SmcdAcceptConfirm {
            gid: 0xdead,
            gid_ext: 0xbeef,
            token: 2,
            dmbe_size: 2,
            chid: 0xffff,
            link_id: 7u32.to_ne_bytes(),
            ..SmcdAcceptConfirm::default()
        };
        let fce = smc_proto::clc::FirstContactExt::linux_smcd(
            1,
            smc_proto::clc::Hostname::new("fake"),
            1,
        );
        ClcMessage::Accept(AcceptConfirm::smcd_v2(body, Some(fce))).to_vec()
    });
    let engine = smcd.engine();
    let c = SmcStream::connect_with(&engine, addr).unwrap();
    assert_eq!(c.mode(), Mode::Tcp(Fallback::local(ReasonCode::NOSMCD2DEV)));
    let (mut s, _, answer) = server.join().unwrap();
    assert!(matches!(answer, Some(ClcMessage::Decline(_))));
    exchange(&c, &mut s);
}

/// A fake client: registers an intent with `smcd` like an engine, connects, and sends `clc`
/// instead of a proper Proposal. Returns the TCP stream.
fn fake_client(smcd: &Smcd, to: SocketAddr, clc: &[u8]) -> (TcpStream, Arc<LoopbackDevice>) {
    let dev = Arc::new(LoopbackDevice::open(&smcd.socket).unwrap());
    let sock = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::net::bind(&sock, &SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let local = SocketAddr::try_from(rustix::net::getsockname(&sock).unwrap()).unwrap();
    let v = dev.connect_intent(local, to).unwrap();
    assert!(v.smc, "smcd knows the listener");
    rustix::net::connect(&sock, &to).unwrap();
    dev.intent_done(v.intent, true);
    let mut s = TcpStream::from(sock);
    s.write_all(clc).unwrap();
    (s, dev)
}

/// A malformed Proposal is declined with a reason; the server's application then reads
/// exactly the bytes the client sends after the Decline.
#[test]
fn malformed_proposal() {
    let smcd = Smcd::start(BINS);
    let engine = smcd.engine();
    let l = listen(&engine);
    let to = l.local_addr().unwrap();
    // A v2 Proposal header and length with garbage inside (offsets pointing nowhere).
    let mut bad = vec![0u8; 92];
    bad[..4].copy_from_slice(&[0xE2, 0xD4, 0xC3, 0xD9]);
    bad[4] = 1;
    bad[5..7].copy_from_slice(&92u16.to_be_bytes());
    bad[7] = 0x20 | (2 << 2) | 1; // version 2, typev2 N... typev1 D (no IP area): malformed
    bad[38..40].copy_from_slice(&0xffffu16.to_be_bytes());
    bad[88..92].copy_from_slice(&[0xE2, 0xD4, 0xC3, 0xD9]);
    let (mut c, _dev) = fake_client(&smcd, to, &bad);
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let answer = read_clc(&c).unwrap().expect("a Decline");
    let ClcMessage::Decline(d) = answer else {
        panic!("expected a Decline, got {answer:?}")
    };
    let (s, _) = l.accept().unwrap();
    assert_eq!(s.mode(), Mode::Tcp(Fallback::local(d.reason)));
    c.write_all(b"first app bytes").unwrap();
    let mut got = [0u8; 15];
    (&s).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"first app bytes");
    (&s).write_all(b"reply").unwrap();
    let mut got = [0u8; 5];
    c.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"reply");
}

/// A client whose Proposal names a GID other than the one smcd announced for it is declined.
#[test]
fn proposal_from_an_impostor_gid() {
    let smcd = Smcd::start(BINS);
    let engine = smcd.engine();
    let l = listen(&engine);
    let to = l.local_addr().unwrap();
    let p = smc_proto::clc::ProposalBuilder::smcd_v2_loopback(0x1234, 0x5678)
        .system_eid(smc_proto::clc::Eid::new("X").unwrap())
        .build()
        .unwrap();
    let (c, _dev) = fake_client(&smcd, to, &ClcMessage::Proposal(p).to_vec());
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let answer = read_clc(&c).unwrap().unwrap();
    assert!(
        matches!(answer, ClcMessage::Decline(d) if d.reason == ReasonCode::NOSMCD2DEV),
        "{answer:?}"
    );
    let (s, _) = l.accept().unwrap();
    assert_eq!(s.mode(), Mode::Tcp(Fallback::local(ReasonCode::NOSMCD2DEV)));
}

/// Handshake limitation: while a listener's handshake work is queued with every worker busy,
/// a new client goes plain TCP at once with PEERNOSMC and no CLC byte on the wire, and
/// `accept` hands it over without waiting for the handshakes in progress. Once they are gone,
/// clients get SMC-D again.
#[test]
fn congested_listener_with_handshake_limitation() {
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    // The stalled handshakes' work ends SERVE_WITHIN after their accept at the latest; on a
    // loaded machine the set-up can take longer, and then the listener is no longer congested
    // when the client comes. Such an attempt proves nothing and is made again (with a fresh
    // listener).
    let (l, stalled, c, stalled_n) =
        common::retry_set_up(5, "the set-up never finished within SERVE_WITHIN", || {
            congest(&smcd, &se, &ce)
        });
    let to = l.local_addr().unwrap();
    assert_eq!(c.mode(), Mode::Tcp(Fallback::local(ReasonCode::PEERNOSMC)));
    let (s, _) = l.accept().unwrap();
    assert_eq!(s.mode(), Mode::Tcp(Fallback::local(ReasonCode::PEERNOSMC)));
    assert_eq!(l.handshakes_in_progress(), stalled_n, "accept did not wait");
    // No CLC on the wire: each side reads exactly what the other's application wrote.
    (&c).write_all(b"plain request").unwrap();
    let mut got = [0u8; 13];
    (&s).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"plain request");
    (&s).write_all(b"plain reply").unwrap();
    let mut got = [0u8; 11];
    (&c).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"plain reply");
    // The stalled clients leave; their handshakes end and the listener is not congested.
    drop(stalled);
    assert!(
        common::eventually(Duration::from_secs(10), || l.handshakes_in_progress() == 0),
        "{} handshakes in progress",
        l.handshakes_in_progress()
    );
    let c2 = SmcStream::connect_with(&ce, to).unwrap();
    assert!(c2.is_smc(), "{:?}", c2.mode());
    let s2 = common::accept_from(&l, c2.local_addr().unwrap(), |_| {});
    assert!(s2.is_smc());
    (&c2).write_all(b"smc again").unwrap();
    let mut got = [0u8; 9];
    (&s2).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"smc again");
}

/// Makes `se`'s new listener congested with stalled handshakes and connects a client of `ce`:
/// the listener, the stalled clients, the client and their number; `None` when the set-up
/// outlasted the stalled handshakes' work (the congestion may have ended).
///
/// Handshakes that merely wait for bytes are no congestion (they cost no worker), so the stall
/// is real work: one client of a fake engine proposes properly and never confirms, so its link
/// group stays in its first contact until the Confirm's deadline; every further Proposal from
/// the same engine waits for that first contact on a worker, and once all workers wait, the
/// next one queues.
#[allow(clippy::type_complexity)]
fn congest(
    smcd: &Smcd,
    se: &Arc<smcd_engine::Engine>,
    ce: &Arc<smcd_engine::Engine>,
) -> Option<(smcd_engine::SmcListener, Vec<TcpStream>, SmcStream, usize)> {
    let l = smc_tests::local_listener(se, 128, true);
    let to = l.local_addr().unwrap();
    // The fake engine: registered with smcd (a GID, intents) but its CLC is written here.
    let fake = smcd.engine();
    let a = fake.attached().expect("smcd is up");
    let proposal = ClcMessage::from(smc_core::handshake::decide::client_proposal(
        &fake.caps(a.ism.as_ref()),
    ))
    .to_vec();
    let mut stalled = Vec::new();
    let mut first: Option<std::time::Instant> = None;
    let refused = loop {
        assert!(
            stalled.len() <= 2 * smcd_engine::driver::listener::max_workers() + 4,
            "never congested"
        );
        let (s, _, v) = common::announced_socket(&a.session, to);
        if !v.smc {
            break v;
        }
        first.get_or_insert_with(std::time::Instant::now);
        rustix::net::connect(&s, &to).unwrap();
        a.session.intent_done(v.intent, true);
        let mut s = TcpStream::from(s);
        s.write_all(&proposal).unwrap();
        if stalled.is_empty() {
            // The first contact: its Accept comes, its Confirm never does.
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let answer = read_clc(&s).unwrap().unwrap();
            assert!(matches!(answer, ClcMessage::Accept(_)), "{answer:?}");
        }
        stalled.push(s);
        // Let the listener take it before the next (the acceptor takes announced ones).
        let n = stalled.len();
        assert!(
            common::eventually(Duration::from_secs(5), || l.handshakes_in_progress() >= n),
            "{} handshakes in progress, {n} clients",
            l.handshakes_in_progress()
        );
    };
    assert_eq!(refused.reason, ReasonCode::PEERNOSMC.0);
    let stalled_n = stalled.len();
    assert!(stalled_n >= 2, "congested after {stalled_n} handshakes");
    let c = SmcStream::connect_with(ce, to).unwrap();
    if first.is_some_and(|t| t.elapsed() >= smcd_engine::driver::handshake::SERVE_WITHIN) {
        return None;
    }
    Some((l, stalled, c, stalled_n))
}
