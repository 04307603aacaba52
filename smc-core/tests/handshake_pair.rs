//! The client and server handshake machines against each other: bytes from one go to the
//! other (in pieces of any size), the "device" is a counter, link groups are a `LgrBook` per
//! side, and the clock jumps.

use proptest::prelude::*;
use smc_core::handshake::{
    CLC_WAIT_TIME, ClcReader, ClientEvent, ClientHandshake, HandshakeError, LocalBuffer, LocalCaps,
    ServerEvent, ServerHandshake, starts_with_clc,
};
use smc_core::lgr::{Join, LgrBook, Role};
use smc_core::time::Instant;
use smc_proto::clc::{ClcMessage, Decline, Eid, Hostname, ReasonCode};
use std::time::Duration;

fn caps(gid: u128) -> LocalCaps {
    LocalCaps {
        gid,
        chid: 0xffff,
        seid: Eid::new("SMCD-USERSPACE-SEID-0123456789AB"),
        ueids: vec![],
        hostname: Hostname::new("host"),
    }
}

const C: u128 = 0x1111_2222_3333_4444_5555_6666_7777_8888;
const S: u128 = 0x9999_0000_0000_0000_0000_0000_0000_0007;

/// One side's link groups and buffer tokens.
struct Host {
    book: LgrBook<u128>,
    next_id: u32,
    next_token: u64,
}

impl Host {
    fn new(base: u32) -> Host {
        Host {
            book: LgrBook::new(),
            next_id: base,
            next_token: u64::from(base) << 32,
        }
    }
    fn token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }
}

/// Result of one handshake.
#[derive(Debug, PartialEq)]
enum End {
    Smc {
        client_lgr: u32,
        server_lgr: u32,
        first_contact: bool,
    },
    Fallback(ReasonCode, ReasonCode),
    Failed(HandshakeError),
}

/// Runs one handshake; bytes move in pieces of `piece` bytes.
fn run(
    ch: &mut Host,
    sh: &mut Host,
    client_caps: LocalCaps,
    server_caps: LocalCaps,
    piece: usize,
) -> (End, End) {
    let now = Instant::ZERO;
    let mut c = ClientHandshake::new(client_caps.clone(), Some(server_caps.gid), now);
    let mut s: Option<ServerHandshake> = None;
    let (mut to_server, mut to_client) = (Vec::<u8>::new(), Vec::<u8>::new());
    let (mut c_end, mut s_end) = (None, None);
    for _ in 0..10_000 {
        if let Some(b) = c.poll_transmit() {
            to_server.extend(b);
        }
        if let Some(srv) = &mut s
            && let Some(b) = srv.poll_transmit()
        {
            to_client.extend(b);
        }
        if s.is_none() && !to_server.is_empty() {
            assert_eq!(
                starts_with_clc(&to_server),
                if to_server.len() >= 4 {
                    Some(true)
                } else {
                    None
                }
            );
            s = Some(ServerHandshake::new(
                server_caps.clone(),
                client_caps.gid,
                now,
            ));
        }
        let mut progress = false;
        // Server reads.
        if let Some(srv) = &mut s
            && s_end.is_none()
        {
            let n = srv.wants().min(piece).min(to_server.len());
            if n > 0 {
                progress = true;
                let bytes: Vec<u8> = to_server.drain(..n).collect();
                if let Some(ev) = srv.on_bytes(&bytes) {
                    match ev {
                        ServerEvent::NeedBuffers(info) => {
                            let (id, fc) = match sh.book.join(info.peer_gid, Role::Server, 255) {
                                Join::Joined(id) => (id, false),
                                Join::Wait(_) => panic!("nothing runs concurrently here"),
                                Join::New => {
                                    sh.next_id += 0x100;
                                    sh.book.create(sh.next_id, info.peer_gid, Role::Server);
                                    (sh.next_id, true)
                                }
                            };
                            let own = LocalBuffer {
                                token: sh.token(),
                                len: 65536,
                                lgr_id: id,
                            };
                            assert!(srv.buffers(Ok((own, fc)), now).is_none());
                        }
                        ServerEvent::Fallback(f) => s_end = Some(End::Fallback(f.local, f.peer)),
                        ServerEvent::Failed(e) => s_end = Some(End::Failed(e)),
                        ServerEvent::NeedAttach(ci) => {
                            assert_eq!(ci.dmb_len, 16384);
                            match srv.attached(true) {
                                ServerEvent::Established {
                                    own, first_contact, ..
                                } => {
                                    if first_contact {
                                        sh.book.ready(own.lgr_id);
                                    }
                                    s_end = Some(End::Smc {
                                        client_lgr: 0,
                                        server_lgr: own.lgr_id,
                                        first_contact,
                                    })
                                }
                                other => panic!("{other:?}"),
                            }
                        }
                        other => panic!("{other:?}"),
                    }
                }
            }
        }
        // Client reads.
        if c_end.is_none() {
            let n = c.wants().min(piece).min(to_client.len());
            if n > 0 {
                progress = true;
                let bytes: Vec<u8> = to_client.drain(..n).collect();
                if let Some(ev) = c.on_bytes(&bytes) {
                    match ev {
                        ClientEvent::NeedBuffers(acc) => {
                            let lgr = if acc.first_contact {
                                ch.next_id += 0x100;
                                ch.book.create(ch.next_id, acc.peer_gid, Role::Client);
                                Ok(ch.next_id)
                            } else {
                                ch.book
                                    .join_existing(acc.peer_gid, Role::Client, 255)
                                    .ok_or(ReasonCode::SYNCERR)
                            };
                            let r = lgr.map(|id| LocalBuffer {
                                token: ch.token(),
                                len: 16384,
                                lgr_id: id,
                            });
                            match c.buffers(r) {
                                ClientEvent::Established { own, accept } => {
                                    c_end = Some(End::Smc {
                                        client_lgr: own.lgr_id,
                                        server_lgr: accept.lgr_id,
                                        first_contact: accept.first_contact,
                                    })
                                }
                                ClientEvent::Fallback(f) => {
                                    c_end = Some(End::Fallback(f.local, f.peer))
                                }
                                other => panic!("{other:?}"),
                            }
                        }
                        ClientEvent::Fallback(f) => c_end = Some(End::Fallback(f.local, f.peer)),
                        ClientEvent::Failed(e) => c_end = Some(End::Failed(e)),
                        other => panic!("{other:?}"),
                    }
                }
            }
        }
        if c_end.is_some() && s_end.is_some() && to_server.is_empty() && to_client.is_empty() {
            break;
        }
        if !progress && c.poll_transmit().is_none() {
            // Deliver a leftover Decline/Confirm to a side that already ended: nothing to do.
            if (s_end.is_some() || s.is_none()) && c_end.is_some() {
                break;
            }
            if let Some(srv) = &s
                && s_end.is_none()
                && srv.wants() > 0
                && to_server.is_empty()
                && c_end.is_some()
            {
                // The client ended (declined) and its Decline is consumed as the next message.
                break;
            }
            if to_server.is_empty() && to_client.is_empty() {
                break;
            }
        }
    }
    (
        c_end.expect("client ended"),
        s_end.unwrap_or(End::Failed(HandshakeError::PeerClosed)),
    )
}

#[test]
fn first_contact_then_reuse() {
    let (mut ch, mut sh) = (Host::new(0x1_0000), Host::new(0x2_0000));
    let (c, s) = run(&mut ch, &mut sh, caps(C), caps(S), usize::MAX);
    let End::Smc {
        client_lgr,
        server_lgr,
        first_contact: true,
    } = c
    else {
        panic!("{c:?}")
    };
    assert_eq!(
        s,
        End::Smc {
            client_lgr: 0,
            server_lgr,
            first_contact: true
        }
    );
    // The second connection joins both groups.
    let (c2, s2) = run(&mut ch, &mut sh, caps(C), caps(S), usize::MAX);
    assert_eq!(
        c2,
        End::Smc {
            client_lgr,
            server_lgr,
            first_contact: false
        }
    );
    assert_eq!(
        s2,
        End::Smc {
            client_lgr: 0,
            server_lgr,
            first_contact: false
        }
    );
    assert_eq!(ch.book.get(client_lgr).unwrap().conns, 2);
    assert_eq!(sh.book.get(server_lgr).unwrap().conns, 2);
}

#[test]
fn client_without_its_group_declines_syncerr() {
    let (mut ch, mut sh) = (Host::new(0x1_0000), Host::new(0x2_0000));
    let _ = run(&mut ch, &mut sh, caps(C), caps(S), usize::MAX);
    // The client forgot its group (its idle timer ran out first): the server's reuse is out
    // of sync, the client declines and both fall back.
    ch.book = LgrBook::new();
    let (c, s) = run(&mut ch, &mut sh, caps(C), caps(S), usize::MAX);
    assert_eq!(c, End::Fallback(ReasonCode::SYNCERR, ReasonCode(0)));
    assert_eq!(s, End::Fallback(ReasonCode::PEERDECL, ReasonCode::SYNCERR));
}

#[test]
fn eid_mismatch_falls_back_on_both_sides() {
    let (mut ch, mut sh) = (Host::new(0x1_0000), Host::new(0x2_0000));
    let mut s = caps(S);
    s.seid = Eid::new("ANOTHER-SYSTEM");
    let (c, srv) = run(&mut ch, &mut sh, caps(C), s, usize::MAX);
    assert_eq!(srv, End::Fallback(ReasonCode::NOSMCD2DEV, ReasonCode(0)));
    assert_eq!(
        c,
        End::Fallback(ReasonCode::PEERDECL, ReasonCode::NOSMCD2DEV)
    );
}

#[test]
fn byte_at_a_time_is_the_same() {
    let (mut ch, mut sh) = (Host::new(0x1_0000), Host::new(0x2_0000));
    let (c, s) = run(&mut ch, &mut sh, caps(C), caps(S), 1);
    assert!(
        matches!(
            c,
            End::Smc {
                first_contact: true,
                ..
            }
        ),
        "{c:?}"
    );
    assert!(
        matches!(
            s,
            End::Smc {
                first_contact: true,
                ..
            }
        ),
        "{s:?}"
    );
}

/// The deadline covers the whole message: bytes that trickle in do not move it.
#[test]
fn drip_fed_proposal_times_out_once() {
    let t0 = Instant::ZERO;
    let mut s = ServerHandshake::new(caps(S), C, t0);
    let proposal =
        ClcMessage::from(smc_core::handshake::decide::client_proposal(&caps(C))).to_vec();
    let mut now = t0;
    for b in &proposal[..proposal.len() - 1] {
        now = now + Duration::from_millis(500);
        assert_eq!(s.handle_timeout(now).is_some(), now >= t0 + CLC_WAIT_TIME);
        if now >= t0 + CLC_WAIT_TIME {
            return;
        }
        assert!(s.on_bytes(std::slice::from_ref(b)).is_none());
        assert_eq!(
            s.poll_timeout(),
            Some(t0 + CLC_WAIT_TIME),
            "not restarted by a byte"
        );
    }
    panic!("the proposal is long enough to outlast the deadline");
}

#[test]
fn client_times_out_without_an_answer() {
    let t0 = Instant::ZERO;
    let mut c = ClientHandshake::new(caps(C), None, t0);
    assert!(c.poll_transmit().is_some());
    assert!(c.handle_timeout(t0 + Duration::from_secs(5)).is_none());
    assert_eq!(
        c.handle_timeout(t0 + CLC_WAIT_TIME),
        Some(ClientEvent::Failed(HandshakeError::TimedOut))
    );
}

#[test]
fn out_of_sync_decline_is_reported() {
    let mut c = ClientHandshake::new(caps(C), None, Instant::ZERO);
    let _ = c.poll_transmit();
    let mut d = Decline::new(ReasonCode::SYNCERR, 2);
    d.out_of_sync = true;
    let bytes = ClcMessage::Decline(d).to_vec();
    let mut ev = None;
    let mut off = 0;
    while ev.is_none() {
        let n = c.wants();
        ev = c.on_bytes(&bytes[off..off + n]);
        off += n;
    }
    assert_eq!(off, bytes.len());
    match ev {
        Some(ClientEvent::Fallback(f)) => {
            assert!(f.out_of_sync);
            assert_eq!(
                (f.local, f.peer),
                (ReasonCode::PEERDECL, ReasonCode::SYNCERR)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(c.poll_transmit().is_none(), "a Decline is not answered");
}

#[test]
fn plain_streams_are_not_clc() {
    assert_eq!(starts_with_clc(b"GET / HTTP/1.1"), Some(false));
    assert_eq!(starts_with_clc(b"GE"), None);
    assert_eq!(starts_with_clc(&[0xE2, 0xD4, 0xC3, 0xD9, 1]), Some(true));
}

proptest! {
    /// Whatever bytes arrive, neither machine panics, and each answers a malformed message
    /// with a Decline and a fallback.
    #[test]
    fn garbage_never_panics(junk in proptest::collection::vec(any::<u8>(), 0..700), piece in 1usize..64) {
        let mut header = vec![0xE2, 0xD4, 0xC3, 0xD9];
        header.extend(junk);
        let mut s = ServerHandshake::new(caps(S), C, Instant::ZERO);
        let mut c = ClientHandshake::new(caps(C), None, Instant::ZERO);
        let _ = c.poll_transmit();
        for chunk in header.chunks(piece) {
            let mut off = 0;
            while off < chunk.len() && s.wants() > 0 {
                let n = s.wants().min(chunk.len() - off);
                if let Some(ServerEvent::Fallback(_)) = s.on_bytes(&chunk[off..off + n]) {
                    let out = s.poll_transmit().expect("a Decline");
                    prop_assert!(matches!(ClcMessage::parse(&out), Ok(ClcMessage::Decline(_))));
                }
                off += n;
            }
            let mut off = 0;
            while off < chunk.len() && c.wants() > 0 {
                let n = c.wants().min(chunk.len() - off);
                let _ = c.on_bytes(&chunk[off..off + n]);
                off += n;
            }
        }
    }

    /// The reader frames any split of a valid message the same way.
    #[test]
    fn reader_frames_any_split(cuts in proptest::collection::vec(1usize..40, 1..30)) {
        let msg = ClcMessage::from(smc_core::handshake::decide::client_proposal(&caps(C)));
        let bytes = msg.to_vec();
        let mut r = ClcReader::new();
        let mut off = 0;
        let mut cuts = cuts.into_iter().cycle();
        loop {
            let n = r.wants().min(cuts.next().unwrap()).min(bytes.len() - off);
            let got = r.push(&bytes[off..off + n]);
            off += n;
            if let Some(m) = got {
                prop_assert_eq!(m.unwrap(), msg.clone());
                prop_assert_eq!(off, bytes.len());
                break;
            }
        }
    }
}
