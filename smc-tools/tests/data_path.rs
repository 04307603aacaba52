//! The SMC-D data path between processes: bulk transfer, half-close, abort, server-speaks-first,
//! many connections, interop with plain TCP peers that are not ours.

mod common;

use common::{BINS, Peer, Rng, Smcd, listen, pattern, raise_nofile, skip_unless_tool};
use smc_proto::clc::ReasonCode;
use smcd_engine::{Mode, SmcStream};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
#[ignore = "entry point of child processes"]
fn child_entry() {
    common::child_main();
}

fn connect(engine: &std::sync::Arc<smcd_engine::Engine>, port: u16) -> SmcStream {
    SmcStream::connect_with(engine, ("127.0.0.1", port)).expect("connect")
}

/// 256 MiB each way at once, random write and read sizes, every byte checked on both ends.
#[test]
fn bulk_transfer_both_directions_byte_exact() {
    const TOTAL: u64 = 256 << 20;
    let smcd = Smcd::start(BINS);
    let seed = Rng::seed();
    eprintln!("seed {seed}");
    let mut server = Peer::spawn(
        &smcd.socket,
        "duplex-server",
        &[TOTAL.to_string(), seed.to_string()],
    );
    let port: u16 = server.expect("PORT").parse().unwrap();
    let engine = smcd.engine();
    let s = connect(&engine, port);
    assert!(s.is_smc(), "expected SMC-D, got {}", s.mode());
    assert_eq!(server.expect("MODE"), "smcd");
    let tx = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let mut rng = Rng::new(seed ^ 0x123456);
        common::send_pattern(&tx, TOTAL, &mut rng, 300 * 1024).unwrap();
        tx.shutdown(Shutdown::Write).unwrap();
    });
    let mut rng = Rng::new(seed ^ 0xabcdef);
    let got = common::recv_pattern(&s, &mut rng, 128 * 1024).expect("client receives");
    sender.join().unwrap();
    assert_eq!(got, TOTAL);
    assert_eq!(server.expect("RECEIVED"), TOTAL.to_string());
    assert!(server.wait(Duration::from_secs(30)).success());
    let c = s.smc_conn().unwrap();
    use smcd_engine::layout::status::Cnt;
    let (rx, tx) = (c.slot.counter(Cnt::RxBytes), c.slot.counter(Cnt::TxBytes));
    assert_eq!((rx, tx), (TOTAL, TOTAL), "per-connection counters");
}

/// shutdown(Write) gives the peer end of stream after every byte; the peer can still answer.
#[test]
fn half_close() {
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = listen(&se);
    let port = l.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        assert!(s.is_smc());
        let mut got = Vec::new();
        (&s).read_to_end(&mut got).unwrap();
        assert_eq!(got, pattern(0, 100_000));
        (&s).write_all(b"answer after your EOF").unwrap();
    });
    let c = connect(&ce, port);
    assert!(c.is_smc());
    (&c).write_all(pattern(0, 100_000)).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(
        (&c).write(b"x").unwrap_err().kind(),
        ErrorKind::BrokenPipe,
        "no writing after shutdown(Write)"
    );
    let mut answer = Vec::new();
    (&c).read_to_end(&mut answer).unwrap();
    assert_eq!(answer, b"answer after your EOF");
    server.join().unwrap();
}

/// Closing with unread data aborts: the peer gets ConnectionReset.
#[test]
fn close_with_unread_data_resets_peer() {
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = listen(&se);
    let port = l.local_addr().unwrap().port();
    let c = connect(&ce, port);
    let (s, _) = l.accept().unwrap();
    assert!(c.is_smc() && s.is_smc());
    (&c).write_all(b"never read").unwrap();
    // Let the bytes land, then close without reading them.
    assert!(common::eventually(Duration::from_secs(2), || {
        s.smc_conn().unwrap().available().unwrap() == 10
    }));
    drop(s);
    let mut buf = [0u8; 16];
    let err = (&c).read(&mut buf).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionReset);
    assert_eq!(
        (&c).write(b"more").unwrap_err().kind(),
        ErrorKind::ConnectionReset
    );
}

/// After an orderly close by the peer, reads see end of stream and writes fail with BrokenPipe.
#[test]
fn write_after_peer_closed_is_broken_pipe() {
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = listen(&se);
    let port = l.local_addr().unwrap().port();
    let c = connect(&ce, port);
    let (s, _) = l.accept().unwrap();
    (&s).write_all(b"bye").unwrap();
    drop(s);
    let mut got = Vec::new();
    (&c).read_to_end(&mut got).unwrap();
    assert_eq!(got, b"bye");
    assert_eq!((&c).write(b"x").unwrap_err().kind(), ErrorKind::BrokenPipe);
}

/// The server writes first; nothing waits for the client to speak.
#[test]
fn server_speaks_first() {
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = listen(&se);
    let port = l.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        (&s).write_all(b"220 banner\r\n").unwrap();
        let mut line = [0u8; 6];
        (&s).read_exact(&mut line).unwrap();
        assert_eq!(&line, b"QUIT\r\n");
        s.is_smc()
    });
    let c = connect(&ce, port);
    let mut banner = [0u8; 12];
    (&c).read_exact(&mut banner).unwrap();
    assert_eq!(&banner, b"220 banner\r\n");
    (&c).write_all(b"QUIT\r\n").unwrap();
    assert!(server.join().unwrap() && c.is_smc());
}

/// A plain TCP client of an SMC listener (plain TCP for the listener with PEERNOSMC), and an SMC
/// client of a plain TCP server that is not ours (python3), also PEERNOSMC.
#[test]
fn interop_with_plain_tcp_peers() {
    let smcd = Smcd::start(BINS);
    let se = smcd.engine();
    let l = listen(&se);
    let port = l.local_addr().unwrap().port();
    if !skip_unless_tool("interop_with_plain_tcp_peers (the nc half)", "nc") {
        let mut nc = Command::new("nc")
            .args(["-q", "1", "127.0.0.1", &port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("nc");
        nc.stdin.take().unwrap().write_all(b"from nc\n").unwrap();
        let (s, _) = l.accept().unwrap();
        assert_eq!(
            s.mode(),
            Mode::Tcp(smcd_engine::Fallback::local(ReasonCode::PEERNOSMC))
        );
        let mut got = [0u8; 8];
        (&s).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"from nc\n");
        (&s).write_all(b"to nc\n").unwrap();
        drop(s);
        let out = nc.wait_with_output().unwrap();
        assert_eq!(out.stdout, b"to nc\n");
    }

    let mut py = Command::new("python3")
        .args([
            "-c",
            "import socket\n\
             l=socket.socket(); l.bind(('127.0.0.1',0)); l.listen(1)\n\
             print(l.getsockname()[1], flush=True)\n\
             c,_=l.accept(); d=b''\n\
             while not d.endswith(b'\\n'): d+=c.recv(100)\n\
             c.sendall(d.upper()); c.close()",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut out = std::io::BufReader::new(py.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let pyport: u16 = line.trim().parse().unwrap();
    let ce = smcd.engine();
    let c = connect(&ce, pyport);
    assert_eq!(c.fallback_reason(), Some(ReasonCode::PEERNOSMC));
    (&c).write_all(b"hello python\n").unwrap();
    let mut got = Vec::new();
    (&c).read_to_end(&mut got).unwrap();
    assert_eq!(got, b"HELLO PYTHON\n");
    assert!(py.wait().unwrap().success());
}

/// 1000 SMC-D connections open at once between two processes (several link groups: 255
/// connections each at most), each carrying its own bytes.
#[test]
fn thousand_concurrent_connections() {
    const N: usize = 1000;
    raise_nofile();
    let smcd = Smcd::start(BINS);
    let mut server = Peer::spawn(&smcd.socket, "echo-server", &[N.to_string()]);
    let port: u16 = server.expect("PORT").parse().unwrap();
    let engine = smcd.engine();
    let streams: Vec<SmcStream> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..8)
            .map(|_| {
                sc.spawn(|| {
                    (0..N / 8)
                        .map(|_| connect(&engine, port))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(streams.len(), N);
    let fell_back: Vec<_> = streams.iter().filter_map(SmcStream::fallback).collect();
    assert!(
        fell_back.is_empty(),
        "all SMC-D, but {} fell back: {:?}",
        fell_back.len(),
        &fell_back[..fell_back.len().min(3)]
    );
    let lgrs: std::collections::HashSet<u32> = streams
        .iter()
        .map(|s| s.smc_conn().unwrap().info.lgr_id)
        .collect();
    assert!(
        lgrs.len() >= N.div_ceil(255),
        "link groups hold at most 255 connections"
    );
    for (i, s) in streams.iter().enumerate() {
        (&*s).write_all(&(i as u64).to_be_bytes()).unwrap();
    }
    for (i, s) in streams.iter().enumerate() {
        let mut b = [0u8; 8];
        (&*s).read_exact(&mut b).unwrap();
        assert_eq!(u64::from_be_bytes(b), i as u64);
    }
    drop(streams);
    assert_eq!(server.expect("SMC"), N.to_string());
    assert!(server.wait(Duration::from_secs(30)).success());
}

/// An SMC stream and a plain TCP stream are interchangeable in code that uses io traits.
#[test]
fn timeouts_and_options_behave_like_tcp() {
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = listen(&se);
    let port = l.local_addr().unwrap().port();
    let c = connect(&ce, port);
    let (s, _) = l.accept().unwrap();
    c.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    assert_eq!(c.read_timeout().unwrap(), Some(Duration::from_millis(100)));
    let mut b = [0u8; 1];
    assert_eq!((&c).read(&mut b).unwrap_err().kind(), ErrorKind::WouldBlock);
    c.set_nonblocking(true).unwrap();
    assert_eq!((&c).read(&mut b).unwrap_err().kind(), ErrorKind::WouldBlock);
    c.set_nodelay(true).unwrap();
    assert!(c.nodelay().unwrap());
    // Cork: held back until uncorked.
    s.set_cork(true).unwrap();
    (&s).write_all(b"corked").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!((&c).read(&mut b).unwrap_err().kind(), ErrorKind::WouldBlock);
    s.set_cork(false).unwrap();
    c.set_nonblocking(false).unwrap();
    let mut got = [0u8; 6];
    (&c).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"corked");
    assert_eq!(c.peer_addr().unwrap(), s.local_addr().unwrap());
    // A plain TCP socket for comparison behaves the same way on the timeout.
    let tl = TcpListener::bind("127.0.0.1:0").unwrap();
    let t = TcpStream::connect(tl.local_addr().unwrap()).unwrap();
    t.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    assert_eq!((&t).read(&mut b).unwrap_err().kind(), ErrorKind::WouldBlock);
}

/// IPv6 works like IPv4, and a dual-stack listener on `[::]` takes IPv4 clients over SMC-D.
#[test]
fn ipv6_and_dual_stack() {
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l6 = smcd_engine::SmcListener::bind_with(&se, "[::1]:0").expect("bind [::1]");
    let c6 = SmcStream::connect_with(&ce, l6.local_addr().unwrap()).unwrap();
    let (s6, peer) = l6.accept().unwrap();
    assert!(peer.is_ipv6());
    assert!(c6.is_smc() && s6.is_smc(), "{}", c6.mode());
    (&c6).write_all(b"v6").unwrap();
    let mut b = [0u8; 2];
    (&s6).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"v6");

    let dual = smcd_engine::SmcListener::bind_with(&se, "[::]:0").expect("bind [::]");
    let port = dual.local_addr().unwrap().port();
    let c4 = connect(&ce, port);
    let (s4, peer) = dual.accept().unwrap();
    assert!(c4.is_smc() && s4.is_smc(), "{}", c4.mode());
    assert_eq!(peer.ip().to_canonical(), c4.local_addr().unwrap().ip());
}
