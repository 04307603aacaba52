//! Peers that die or misbehave: SIGKILL of either end mid-transfer (the survivor gets an error
//! within a second, nothing hangs, nothing leaks), a peer scribbling over shared memory (only
//! its connection breaks), and `smcd` going away under established connections.

mod common;

use common::{BINS, Peer, Smcd, dmb_resources, eventually, listen};
use smc_proto::clc::ReasonCode;
use smcd_engine::{Fallback, Mode, SmcStream};
use std::io::{ErrorKind, Read, Write};
use std::time::Duration;

#[test]
#[ignore = "entry point of child processes"]
fn child_entry() {
    common::child_main();
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Kills `victim` mid-transfer and checks what `survivor` saw: an error of the reset kind,
/// noticed within a second, and no DMB memory or descriptor left afterwards (in the survivor
/// and, once it has gone, in smcd).
fn kill_and_check(smcd: &Smcd, mut victim: Peer, mut survivor: Peer) {
    std::thread::sleep(Duration::from_millis(200));
    let killed_at = unix_ms();
    victim.kill();
    let err = survivor.expect("ERROR");
    let (kind, at) = err.split_once(' ').unwrap();
    let noticed_after = at.parse::<u128>().unwrap().saturating_sub(killed_at);
    eprintln!("survivor saw {kind} {noticed_after} ms after SIGKILL");
    assert!(
        kind == "ConnectionReset" || kind == "ConnectionAborted",
        "unexpected error kind {kind}"
    );
    assert!(noticed_after < 1000, "noticed after {noticed_after} ms");
    assert_eq!(
        survivor.expect("LEAKS"),
        "0 0",
        "memfds and mappings released"
    );
    assert!(survivor.wait(Duration::from_secs(10)).success());
    assert!(
        eventually(Duration::from_secs(5), || dmb_resources(smcd.pid())
            == (0, 0)),
        "smcd still holds {:?}",
        dmb_resources(smcd.pid())
    );
}

#[test]
fn sigkill_of_the_server_mid_transfer() {
    let smcd = Smcd::start(BINS);
    let mut server = Peer::spawn(&smcd.socket, "stream-server", &[]);
    let port = server.expect("PORT");
    let mut client = Peer::spawn(&smcd.socket, "sink-client", &[port]);
    assert_eq!(client.expect("MODE"), "smcd");
    assert_eq!(server.expect("MODE"), "smcd");
    kill_and_check(&smcd, server, client);
}

#[test]
fn sigkill_of_the_client_mid_transfer() {
    let smcd = Smcd::start(BINS);
    let mut server = Peer::spawn(&smcd.socket, "stream-server", &[]);
    let port = server.expect("PORT");
    let mut client = Peer::spawn(&smcd.socket, "sink-client", &[port]);
    assert_eq!(client.expect("MODE"), "smcd");
    assert_eq!(server.expect("MODE"), "smcd");
    kill_and_check(&smcd, client, server);
}

#[test]
fn sigkill_of_a_writing_client() {
    let smcd = Smcd::start(BINS);
    let mut server = Peer::spawn(&smcd.socket, "sink-server", &[]);
    let port = server.expect("PORT");
    let mut client = Peer::spawn(&smcd.socket, "source-client", &[port]);
    assert_eq!(client.expect("MODE"), "smcd");
    assert_eq!(server.expect("MODE"), "smcd");
    kill_and_check(&smcd, client, server);
}

/// A peer that writes garbage over the header of one connection's DMB breaks that connection
/// (with an error, on both ends) and no other.
#[test]
fn scribbling_peer_breaks_only_its_connection() {
    let smcd = Smcd::start(BINS);
    let mut server = Peer::spawn(&smcd.socket, "scribble-target", &[]);
    let port: u16 = server.expect("PORT").parse().unwrap();
    let engine = smcd.engine();
    let a = SmcStream::connect_with(&engine, ("127.0.0.1", port)).unwrap();
    let b = SmcStream::connect_with(&engine, ("127.0.0.1", port)).unwrap();
    assert_eq!(server.expect("MODES"), "smcd smcd");
    let (ia, ib) = (a.smc_conn().unwrap(), b.smc_conn().unwrap());
    assert_eq!(ia.info.lgr_id, ib.info.lgr_id, "both share one link group");
    let mut rng = common::Rng::new(common::Rng::seed());
    // Garbage over the producer and consumer words of the server's DMB of connection a: random
    // bytes, with the producer count forced outside the ring so the damage is always visible.
    let target = ia.link().peer();
    let mut junk: Vec<u8> = (0..16).map(|_| rng.next() as u8).collect();
    junk[2..6].copy_from_slice(&u32::MAX.to_ne_bytes());
    target.map.scribble(8, &junk);
    ia.link().ring_peer(smcd_engine::device::Dir::Rx);
    let noticed = server.expect("A");
    assert_eq!(noticed, "ConnectionAborted", "the server's read on a fails");
    // Our end of a sees the reset (the server aborted its TCP connection).
    let mut buf = [0u8; 16];
    assert!(eventually(Duration::from_secs(2), || {
        matches!((&a).read(&mut buf), Err(e) if e.kind() == ErrorKind::ConnectionReset || e.kind() == ErrorKind::ConnectionAborted)
    }));
    // b still works.
    (&b).write_all(b"still fine").unwrap();
    let mut got = [0u8; 10];
    (&b).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"still fine");
    b.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(server.expect("B"), "done");
    assert!(server.wait(Duration::from_secs(10)).success());
}

/// smcd stops: it exits cleanly and removes its socket; established SMC-D connections keep
/// working (the data plane is peer to peer); new connections fall back with NOSMCDEV.
#[test]
fn established_connections_survive_smcd() {
    let mut smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = listen(&se);
    let port = l.local_addr().unwrap().port();
    let c = SmcStream::connect_with(&ce, ("127.0.0.1", port)).unwrap();
    let (s, _) = l.accept().unwrap();
    assert!(c.is_smc() && s.is_smc());
    assert!(smcd.stop(), "smcd exits 0 on SIGTERM");
    assert!(!smcd.socket.exists(), "smcd removed its socket");
    for i in 0..100u32 {
        (&c).write_all(&i.to_be_bytes()).unwrap();
        let mut b = [0u8; 4];
        (&s).read_exact(&mut b).unwrap();
        assert_eq!(u32::from_be_bytes(b), i);
    }
    let c2 = SmcStream::connect_with(&ce, ("127.0.0.1", port)).unwrap();
    assert_eq!(c2.mode(), Mode::Tcp(Fallback::local(ReasonCode::NOSMCDEV)));
    let (s2, _) = l.accept().unwrap();
    (&c2).write_all(b"tcp now").unwrap();
    let mut b = [0u8; 7];
    (&s2).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"tcp now");
}

/// smcd restarts: a listener registers again by itself, and new connections are SMC-D again.
#[test]
fn listener_registers_again_after_smcd_restarts() {
    let mut smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = listen(&se);
    let port = l.local_addr().unwrap().port();
    let c = SmcStream::connect_with(&ce, ("127.0.0.1", port)).unwrap();
    let (s, _) = l.accept().unwrap();
    assert!(c.is_smc() && s.is_smc());
    assert!(smcd.stop());
    let again = Smcd::start_at(BINS, &smcd.socket);
    // The listener notices within a couple of seconds; the client engine reconnects on its
    // next connect (at most once a second).
    assert!(
        eventually(Duration::from_secs(10), || {
            let c2 = SmcStream::connect_with(&ce, ("127.0.0.1", port)).unwrap();
            let (s2, _) = l.accept().unwrap();
            c2.is_smc() && s2.is_smc()
        }),
        "new connections never went SMC-D again"
    );
    drop(again);
}

/// Issue 10, item 4: a stopped smcd (SIGSTOP) does not hang connections. Requests to smcd
/// had no receive timeout and the registration ran under the engine's lock, so every
/// `connect` of a process waited forever. Now a request gives up after the channel's timeout
/// and the connection falls back to TCP; an engine that was registered and one that was not
/// both connect, several times, and move bytes.
#[test]
fn stopped_smcd_does_not_hang_connections() {
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = listen(&se);
    let port = l.local_addr().unwrap().port();
    let c = SmcStream::connect_with(&ce, ("127.0.0.1", port)).unwrap();
    let (s, _) = l.accept().unwrap();
    assert!(c.is_smc() && s.is_smc());
    let pid = rustix::process::Pid::from_raw(smcd.pid() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    let fresh = smcd.engine();
    let client = std::thread::spawn(move || {
        let mut modes = Vec::new();
        for engine in [&ce, &fresh, &ce, &fresh, &ce] {
            let c2 = SmcStream::connect_with(engine, ("127.0.0.1", port))?;
            (&c2).write_all(b"ping")?;
            let mut b = [0u8; 4];
            (&c2).read_exact(&mut b)?;
            assert_eq!(&b, b"pong");
            modes.push(c2.mode());
        }
        Ok::<_, std::io::Error>(modes)
    });
    // The established SMC-D connection keeps working meanwhile (the data plane is peer to
    // peer), and the server answers the new connections (over TCP).
    (&c).write_all(b"still here").unwrap();
    let mut b = [0u8; 10];
    (&s).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"still here");
    let server = std::thread::spawn(move || {
        for _ in 0..5 {
            let (s2, _) = l.accept()?;
            let mut b = [0u8; 4];
            (&s2).read_exact(&mut b)?;
            (&s2).write_all(b"pong")?;
        }
        Ok::<_, std::io::Error>(())
    });
    let modes = common::within(Duration::from_secs(60), move || client.join().unwrap());
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
    let modes = modes.expect("connects hung behind a stopped smcd").unwrap();
    server.join().unwrap().unwrap();
    assert!(
        modes.iter().all(|m| matches!(m, Mode::Tcp(_))),
        "with smcd stopped nothing can be SMC-D: {modes:?}"
    );
}

/// Issue 10, item 1: every client process is a new engine and so a new link group on the
/// server; a group whose peer engine has ended is freed at once (smcd tells the server's
/// engine, as an ISM device reports a GID that went away), not kept with its DMB and
/// descriptors for `lgr_idle_time` (600 s), which let a few thousand short-lived clients
/// exhaust the host's DMBs.
#[test]
fn link_groups_of_exited_client_processes_are_freed_at_once() {
    let smcd = Smcd::start(BINS);
    let engine = smcd.engine();
    let l = listen(&engine);
    let port = l.local_addr().unwrap().port();
    const CLIENTS: usize = 24;
    let server = std::thread::spawn(move || {
        for _ in 0..CLIENTS {
            let (s, _) = l.accept().unwrap();
            assert!(s.is_smc(), "SMC-D");
            let mut got = Vec::new();
            (&s).read_to_end(&mut got).unwrap();
            (&s).write_all(&got).unwrap();
        }
    });
    for _ in 0..CLIENTS {
        let mut c = Peer::spawn(&smcd.socket, "hello-client", &[port.to_string()]);
        assert_eq!(c.expect("MODE"), "smcd");
        assert!(c.wait(Duration::from_secs(30)).success());
    }
    server.join().unwrap();
    // The idle time is 600 s: only the peers' ends can free the groups within the test.
    assert_eq!(engine.settings().lgr_idle, Duration::from_secs(600));
    assert!(
        eventually(Duration::from_secs(20), || engine.lgrs.list().is_empty()),
        "{} link groups of exited clients still held",
        engine.lgrs.list().len()
    );
    // smcd holds a memfd for every registered DMB: none is left (this process's own mappings
    // are not checked, other tests' engines share it).
    assert!(
        eventually(Duration::from_secs(10), || dmb_resources(smcd.pid())
            == (0, 0)),
        "smcd still holds DMB memfds and mappings {:?}",
        dmb_resources(smcd.pid())
    );
    assert_eq!(engine.lgrs.idle_dmb_bytes(), 0);
    // The listener's engine is not wedged: a new client still gets SMC-D.
    let l = listen(&engine);
    let port = l.local_addr().unwrap().port();
    let mut c = Peer::spawn(&smcd.socket, "hello-client", &[port.to_string()]);
    let (s, _) = l.accept().unwrap();
    let mut got = Vec::new();
    (&s).read_to_end(&mut got).unwrap();
    (&s).write_all(&got).unwrap();
    drop(s);
    assert_eq!(c.expect("MODE"), "smcd");
    assert!(c.wait(Duration::from_secs(30)).success());
}

/// Issue 10, item 6: link-group ids repeated after 256 groups of one engine (an 8-bit
/// counter); smcd now hands out blocks of ids, so a server with more peers than that still
/// names every group uniquely, as the kernel's one host-wide counter does.
#[test]
fn link_group_ids_do_not_repeat_after_256_groups() {
    common::raise_nofile();
    let smcd = Smcd::start(BINS);
    let server = smcd.engine();
    let l = listen(&server);
    let port = l.local_addr().unwrap().port();
    const PEERS: usize = 300;
    let acceptor = std::thread::spawn(move || {
        (0..PEERS)
            .map(|_| l.accept().unwrap().0)
            .collect::<Vec<_>>()
    });
    // Each client engine is a new peer, so a new group on the server; all stay open.
    let clients: Vec<_> = (0..PEERS)
        .map(|_| {
            let e = smcd.engine();
            let s = SmcStream::connect_with(&e, ("127.0.0.1", port)).unwrap();
            assert!(s.is_smc(), "SMC-D");
            (e, s)
        })
        .collect();
    let accepted = acceptor.join().unwrap();
    let ids: Vec<u32> = server.lgrs.list().iter().map(|g| g.id).collect();
    assert_eq!(ids.len(), PEERS, "one group per peer");
    let unique: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(
        unique.len(),
        PEERS,
        "ids repeated: {} distinct",
        unique.len()
    );
    assert!(
        ids.iter().all(|id| id & 0xff == 0),
        "the low byte is the link id's"
    );
    // The client side names its groups from its own blocks: none collides with the server's.
    for (e, _) in &clients {
        for g in e.lgrs.list() {
            assert!(
                !unique.contains(&g.id),
                "client group {:#x} reuses a server id",
                g.id
            );
        }
    }
    drop(accepted);
}

/// A connection that ends in an abort of its own ends alone: here its TCP connection goes
/// away under it without an SMC close (the server sees the end of the stream and aborts, as
/// the kernel does). The link group stays, and the next connections join it: the kernel's
/// `smc_conn_kill` leaves the group to its other connections, and only a peer that breaks the
/// protocol (or one smcd reports gone) ends a group. Before, every local abort killed the
/// group: at 512 concurrent crr connections that made a new group, with its first contact
/// and fresh DMBs, every few hundred connections.
#[test]
fn an_aborted_connection_leaves_its_link_group_alone() {
    let smcd = Smcd::start(BINS);
    let (srv, cli) = (smcd.engine(), smcd.engine());
    let l = smcd_engine::SmcListener::bind_with(&srv, "127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let a = SmcStream::connect_with(&cli, addr).unwrap();
    let (sa, _) = l.accept().unwrap();
    let b = SmcStream::connect_with(&cli, addr).unwrap();
    let (sb, _) = l.accept().unwrap();
    let server_group = sa.smc_conn().expect("SMC-D").info.lgr_id;
    assert_eq!(sb.smc_conn().expect("SMC-D").info.lgr_id, server_group);
    // a's TCP connection ends without an SMC close: the server's read fails (reset).
    rustix::net::shutdown(a.smc_conn().unwrap().clcsock(), rustix::net::Shutdown::Both).unwrap();
    let mut buf = [0u8; 16];
    let e = (&sa).read(&mut buf).unwrap_err();
    assert!(SmcStream::is_reset(&e), "{e}");
    assert!(sa.smc_conn().unwrap().is_aborted());
    drop(sa);
    drop(a);
    // b goes on, and a new connection joins the same group.
    (&b).write_all(b"ping").unwrap();
    let mut got = [0u8; 4];
    (&sb).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    let c = SmcStream::connect_with(&cli, addr).unwrap();
    let (sc, _) = l.accept().unwrap();
    assert!(c.is_smc());
    assert_eq!(sc.smc_conn().expect("SMC-D").info.lgr_id, server_group);
    assert_eq!(
        c.smc_conn().unwrap().info.lgr_id,
        b.smc_conn().unwrap().info.lgr_id
    );
    (&c).write_all(b"pong").unwrap();
    (&sc).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"pong");
}

/// A closed connection whose buffers went back to the link group touches them no more, even
/// while something still holds it (the liveness watcher does, when the TCP connection ends
/// just then). Before, such a holder read the next connection's CDCs in the reused DMB as
/// its own, took them for a protocol violation and wrote an abort into the peer's DMB, which
/// the peer had reused too: crr at 512 connections broke a correct connection about once a
/// second that way.
#[test]
fn a_closed_connection_leaves_its_reused_buffers_alone() {
    let smcd = Smcd::start(BINS);
    let (srv, cli) = (smcd.engine(), smcd.engine());
    let l = smcd_engine::SmcListener::bind_with(&srv, "127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let a = SmcStream::connect_with(&cli, addr).unwrap();
    let (sa, _) = l.accept().unwrap();
    let old = a.smc_conn_handle().expect("SMC-D");
    let (a_token, a_peer) = (old.info.local_token, old.info.peer_token);
    // Both close (the server first, as in crr): both DMBs are free for reuse at once.
    drop(sa);
    let mut buf = [0u8; 16];
    assert_eq!((&a).read(&mut buf).unwrap(), 0);
    drop(a);
    let b = SmcStream::connect_with(&cli, addr).unwrap();
    let (sb, _) = l.accept().unwrap();
    let ib = b.smc_conn().expect("SMC-D");
    assert_eq!(ib.info.local_token, a_token, "the client reused a's DMB");
    assert_eq!(ib.info.peer_token, a_peer, "the server reused its DMB of a");
    (&sb).write_all(b"for b").unwrap();
    (&b).write_all(b"from b").unwrap();
    assert!(eventually(Duration::from_secs(2), || ib
        .available()
        .is_ok_and(|n| n == 5)));
    // The old connection, still held, is asked to look at its (reused) buffers.
    assert_eq!(old.available().unwrap_or(0), 0);
    assert!(
        !old.is_poisoned(),
        "b's words are not a's protocol violation"
    );
    drop(old);
    // b is intact on both ends.
    let mut got = [0u8; 6];
    (&b).read_exact(&mut got[..5]).unwrap();
    assert_eq!(&got[..5], b"for b");
    (&sb).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"from b");
    (&b).write_all(b"more").unwrap();
    (&sb).read_exact(&mut got[..4]).unwrap();
    assert_eq!(&got[..4], b"more");
}
