//! Running the CLC handshake over the TCP connection (`af_smc.c`: `__smc_connect`,
//! `smc_listen_work`), with the decisions from [`crate::core::handshake`].
//!
//! Every failure before the Confirm ends in a Decline with a reason and a TCP fallback that
//! loses nothing: no application byte has been sent yet, and CLC messages are read exactly
//! (header first, then the length it announces). A failure on the server after the Confirm
//! (attaching the client's DMB) aborts the connection instead: the client already runs SMC
//! and would not read a Decline (the kernel sends one there that nobody reads).

use super::conn::{ConnParams, SmcConn, SmcdInfo};
use super::engine::Engine;
use super::lgr::{LinkGroup, PeerV2, Role};
use crate::core::handshake::{self as hs, Refusal};
use crate::device::loopback::LoopbackDevice;
use crate::device::{Dmb, Gid};
use crate::layout::status::{self as st, ConnIdentity};
use crate::settings::Settings;
use smc_proto::clc::{
    ClcError, ClcMessage, Decline, HEADER_LEN, ReasonCode, SMC_V2, peek_message_len,
};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

/// `CLC_WAIT_TIME`: how long either side waits for the next CLC message.
pub const CLC_WAIT_TIME: Duration = Duration::from_secs(6);

/// Why a connection runs over TCP: (local reason, peer reason), as smcss shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallback {
    /// Our reason.
    pub local: ReasonCode,
    /// The peer's reason (from its Decline), or 0.
    pub peer: ReasonCode,
}

impl Fallback {
    /// A fallback with only a local reason.
    pub fn local(r: ReasonCode) -> Self {
        Self {
            local: r,
            peer: ReasonCode(0),
        }
    }
}

/// The result of a handshake.
#[derive(Debug)]
pub enum Outcome {
    /// SMC-D is up.
    Smc {
        /// The connection.
        conn: Box<SmcConn>,
        /// Its link group (one slot held).
        lgr: Arc<LinkGroup>,
    },
    /// The connection continues as plain TCP.
    Tcp(TcpStream, Fallback),
}

/// Reads one CLC message: the 8-byte header, then exactly the rest of the length it gives.
/// `Ok(Err(..))` is a malformed message (to be declined); `Err` is a TCP failure.
pub fn read_clc(sock: &TcpStream) -> io::Result<Result<ClcMessage, ClcError>> {
    let mut s = sock;
    let mut hdr = [0u8; HEADER_LEN];
    s.read_exact(&mut hdr)?;
    let len = match peek_message_len(&hdr) {
        Ok(l) => l,
        Err(e) => return Ok(Err(e)),
    };
    let mut buf = vec![0u8; len];
    buf[..HEADER_LEN].copy_from_slice(&hdr);
    s.read_exact(&mut buf[HEADER_LEN..])?;
    Ok(ClcMessage::parse(&buf))
}

/// Whether the next bytes on the stream start a CLC message, without consuming them
/// (waits for 8 bytes, at most [`CLC_WAIT_TIME`]). The server asks this before its first read:
/// a connection taken for an announced SMC client but not carrying CLC (which only a stale
/// announcement could cause) then stays plain TCP with every byte intact.
pub fn peek_is_clc(sock: &TcpStream) -> io::Result<bool> {
    let mut hdr = [0u8; HEADER_LEN];
    let n = loop {
        match rustix::net::recv(
            sock,
            &mut hdr,
            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::WAITALL,
        ) {
            Ok((n, _)) => break n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    Ok(
        n >= 4
            && smc_proto::clc::Eyecatcher::from_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]).is_some(),
    )
}

/// Writes one CLC message.
pub fn write_clc(sock: &TcpStream, msg: &ClcMessage) -> io::Result<()> {
    let mut s = sock;
    s.write_all(&msg.to_vec())
}

fn decline(sock: &TcpStream, reason: ReasonCode, version: u8) {
    let _ = write_clc(sock, &ClcMessage::Decline(Decline::new(reason, version)));
}

fn timeout_err(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(io::ErrorKind::TimedOut, "CLC handshake timed out")
    } else {
        e
    }
}

/// Connection parameters from the settings snapshot.
pub fn params(s: &Settings) -> ConnParams {
    ConnParams {
        spin: s.spin,
        autosplit_size: s.autosplit_size as usize,
        wnd_rule: s.wnd_update_rule,
        autocorking_size: s.autocorking_size as usize,
        tx_chunk: s.tx_chunk as usize,
        sndbuf: s.sndbuf_len(),
    }
}

fn peer_v2(fce: Option<smc_proto::clc::FirstContactExt>, eid: smc_proto::clc::Eid) -> PeerV2 {
    PeerV2 {
        version: SMC_V2,
        release: fce.map_or(0, |f| f.release),
        os: fce.map_or(0, |f| f.os_type.nibble()),
        hostname: fce
            .map(|f| String::from_utf8_lossy(f.hostname.trimmed()).into_owned())
            .unwrap_or_default(),
        eid: String::from_utf8_lossy(eid.trimmed()).into_owned(),
    }
}

/// The end of either side's handshake: the connection with its status slot, published with
/// its identity, and the buffer statistics (`SMC_STAT_RMB_SIZE`, `_REUSE`, `_ALLOC`) counted
/// for both buffers.
fn established(
    engine: &Engine,
    settings: &Settings,
    sock: TcpStream,
    (own, peer): (Arc<Dmb>, Arc<Dmb>),
    info: SmcdInfo,
    lgr: Arc<LinkGroup>,
    (own_reused, peer_cached): (bool, bool),
) -> io::Result<Outcome> {
    sock.set_read_timeout(None)?;
    // The send buffer is the peer's ring, or less when wmem is smaller.
    let sndbuf = settings.sndbuf_len().min(peer.map.ring_len());
    let status = engine.status();
    status.add(st::T_RX_RMB_SIZE + st::bucket(info.rmbe_size as u64), 1);
    status.add(
        st::T_RX_RMB
            + if own_reused {
                st::RMB_REUSE
            } else {
                st::RMB_ALLOC
            },
        1,
    );
    status.add(
        st::T_TX_RMB_SIZE + st::bucket(info.peer_rmbe_size as u64),
        1,
    );
    status.add(
        st::T_TX_RMB
            + if peer_cached {
                st::RMB_REUSE
            } else {
                st::RMB_ALLOC
            },
        1,
    );
    let slot = status.conn_slot();
    slot.publish(&ConnIdentity {
        state: crate::core::close::SmcState::Active as u8,
        mode: 2,
        role: u8::from(!info.client),
        fallback: (0, 0),
        local: sock.local_addr().ok(),
        peer: sock.peer_addr().ok(),
        inode: rustix::fs::fstat(&sock).map_or(0, |s| s.st_ino),
        lgr: info.lgr_id,
        token: info.local_token,
        peer_token: info.peer_token,
        gid: info.local_gid,
        peer_gid: info.peer_gid,
        rmbe: info.rmbe_size as u64,
        peer_rmbe: info.peer_rmbe_size as u64,
        sndbuf: sndbuf as u64,
    });
    Ok(Outcome::Smc {
        conn: Box::new(SmcConn::new(sock, own, peer, params(settings), info, slot)),
        lgr,
    })
}

/// The client's handshake on a connected TCP socket whose listener `smcd` said expects SMC.
pub fn client(
    engine: &Arc<Engine>,
    dev: &Arc<LoopbackDevice>,
    sock: TcpStream,
    expected_gid: Option<Gid>,
    settings: &Settings,
) -> io::Result<Outcome> {
    sock.set_read_timeout(Some(CLC_WAIT_TIME))?;
    let caps = engine.caps(dev);
    let proposal = hs::client_proposal(&caps);
    write_clc(&sock, &proposal.into())?;
    let msg = match read_clc(&sock).map_err(timeout_err)? {
        Ok(m) => m,
        Err(e) => {
            let r = e.decline_reason();
            decline(&sock, r, SMC_V2);
            sock.set_read_timeout(None)?;
            return Ok(Outcome::Tcp(sock, Fallback::local(r)));
        }
    };
    let fall = |sock: TcpStream, refusal: Refusal| -> io::Result<Outcome> {
        if let Refusal::Decline(r) = refusal {
            decline(&sock, r, SMC_V2);
        }
        sock.set_read_timeout(None)?;
        let (local, peer) = refusal.reasons();
        Ok(Outcome::Tcp(sock, Fallback { local, peer }))
    };
    let acc = match hs::client_check_accept(msg, &caps, expected_gid) {
        Ok(a) => a,
        Err(refusal) => {
            if let Refusal::PeerDeclined {
                out_of_sync: true, ..
            } = refusal
            {
                // The server's link group with us is broken: ours must not be reused.
                for g in engine.lgrs.list() {
                    if g.local_gid == caps.gid {
                        g.kill();
                    }
                }
            }
            return fall(sock, refusal);
        }
    };
    // The client names its link group itself (the kernel's lgr->id from its own counter) and
    // on reuse picks one to the same peer: the server's first-contact flag must agree with
    // whether it has one (smc_connect_ism: SYNCERR otherwise).
    let lgr = if acc.first_contact {
        engine.lgrs.create(
            engine.lgrs.next_id(dev.info().engine_id),
            acc.peer_gid,
            caps.gid,
            Role::Client,
            peer_v2(acc.fce, acc.eid),
            &engine.status(),
        )
    } else {
        match engine.lgrs.reuse(acc.peer_gid, caps.gid, u32::MAX) {
            Some(g) => g,
            None => return fall(sock, Refusal::Decline(ReasonCode::SYNCERR)),
        }
    };
    engine.start_housekeeping();
    let (own, own_reused) = match lgr.get_dmb(dev.as_ref(), settings.dmb_len()) {
        Ok(x) => x,
        Err(e) => {
            tracing::debug!("DMB registration failed: {e}");
            lgr.release_slot();
            return fall(sock, Refusal::Decline(ReasonCode::MEM));
        }
    };
    let (peer, peer_cached) = match lgr.attach(dev.as_ref(), acc.token) {
        Ok((d, c)) if d.map.dmb_len() == acc.dmb_len => (d, c),
        Ok(_) => {
            lgr.detach(acc.token);
            lgr.put_dmb(dev.as_ref(), own, true, false);
            lgr.release_slot();
            return fall(sock, Refusal::Decline(ReasonCode::CNFERR));
        }
        Err(e) => {
            tracing::debug!("attaching the server's DMB failed: {e}");
            lgr.put_dmb(dev.as_ref(), own, true, false);
            lgr.release_slot();
            return fall(sock, Refusal::Decline(ReasonCode::ERR_REGBUF));
        }
    };
    let confirm = hs::client_confirm(&caps, &acc, lgr.id, own.token, own.map.dmb_len());
    if let Err(e) = write_clc(&sock, &smc_proto::clc::ClcMessage::Confirm(confirm)) {
        lgr.put_dmb(dev.as_ref(), own, true, false);
        lgr.release_slot();
        return Err(e);
    }
    let info = SmcdInfo {
        lgr_id: lgr.id,
        local_gid: caps.gid,
        peer_gid: acc.peer_gid,
        local_token: own.token,
        peer_token: acc.token,
        rmbe_size: own.map.dmb_len(),
        peer_rmbe_size: peer.map.dmb_len(),
        version: SMC_V2,
        client: true,
    };
    established(
        engine,
        settings,
        sock,
        (own, peer),
        info,
        lgr,
        (own_reused, peer_cached),
    )
}

/// The server's handshake on an accepted TCP connection whose client `smcd` announced with
/// GID `client_gid`.
pub fn server(
    engine: &Arc<Engine>,
    dev: &Arc<LoopbackDevice>,
    sock: TcpStream,
    client_gid: Gid,
    settings: &Settings,
) -> io::Result<Outcome> {
    sock.set_read_timeout(Some(CLC_WAIT_TIME))?;
    if !peek_is_clc(&sock).map_err(timeout_err)? {
        sock.set_read_timeout(None)?;
        return Ok(Outcome::Tcp(sock, Fallback::local(ReasonCode::PEERNOSMC)));
    }
    let caps = engine.caps(dev);
    let fall = |sock: TcpStream, refusal: Refusal, version: u8| -> io::Result<Outcome> {
        if let Refusal::Decline(r) = refusal {
            decline(&sock, r, version);
        }
        sock.set_read_timeout(None)?;
        let (local, peer) = refusal.reasons();
        Ok(Outcome::Tcp(sock, Fallback { local, peer }))
    };
    let msg = match read_clc(&sock).map_err(timeout_err)? {
        Ok(m) => m,
        Err(e) => return fall(sock, Refusal::Decline(e.decline_reason()), SMC_V2),
    };
    let version = match &msg {
        ClcMessage::Proposal(p) => p.version,
        _ => SMC_V2,
    };
    let info = match hs::server_check_proposal(msg, &caps, client_gid) {
        Ok(i) => i,
        Err(r) => return fall(sock, r, version),
    };
    let max_conns = settings.max_conns_per_lgr.clamp(16, 255);
    let (lgr, first_contact) = match engine.lgrs.reuse(info.peer_gid, caps.gid, max_conns) {
        Some(g) => (g, false),
        None => {
            let id = engine.lgrs.next_id(dev.info().engine_id);
            let g = engine.lgrs.create(
                id,
                info.peer_gid,
                caps.gid,
                Role::Server,
                peer_v2(None, info.eid),
                &engine.status(),
            );
            (g, true)
        }
    };
    engine.start_housekeeping();
    let (own, own_reused) = match lgr.get_dmb(dev.as_ref(), settings.dmb_len()) {
        Ok(x) => x,
        Err(e) => {
            tracing::debug!("DMB registration failed: {e}");
            lgr.release_slot();
            if first_contact {
                lgr.kill();
            }
            return fall(sock, Refusal::Decline(ReasonCode::MEM), version);
        }
    };
    let accept = hs::server_accept(
        &caps,
        &info,
        own.token,
        own.map.dmb_len(),
        lgr.id,
        first_contact,
    );
    let give_back = |lgr: &Arc<LinkGroup>, own| {
        lgr.put_dmb(dev.as_ref(), own, true, false);
        lgr.release_slot();
        if first_contact {
            // The client may not have the group: nobody else may join it.
            lgr.kill();
        }
    };
    if let Err(e) = write_clc(&sock, &ClcMessage::Accept(accept)) {
        give_back(&lgr, own);
        return Err(e);
    }
    let msg = match read_clc(&sock).map_err(timeout_err) {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => {
            give_back(&lgr, own);
            return fall(sock, Refusal::Decline(e.decline_reason()), version);
        }
        Err(e) => {
            give_back(&lgr, own);
            return Err(e);
        }
    };
    let conf = match hs::server_check_confirm(msg, &info, first_contact) {
        Ok(c) => c,
        Err(r) => {
            give_back(&lgr, own);
            return fall(sock, r, version);
        }
    };
    let (peer, peer_cached) = match lgr.attach(dev.as_ref(), conf.token) {
        Ok((d, c)) if d.map.dmb_len() == conf.dmb_len => (d, c),
        other => {
            if other.is_ok() {
                lgr.detach(conf.token);
            }
            give_back(&lgr, own);
            let _ = rustix::net::sockopt::set_socket_linger(&sock, Some(Duration::ZERO));
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "client's DMB could not be attached after Confirm",
            ));
        }
    };
    if first_contact {
        lgr.set_peer(peer_v2(conf.fce, info.eid));
        lgr.set_ready();
    }
    let info = SmcdInfo {
        lgr_id: lgr.id,
        local_gid: caps.gid,
        peer_gid: info.peer_gid,
        local_token: own.token,
        peer_token: conf.token,
        rmbe_size: own.map.dmb_len(),
        peer_rmbe_size: peer.map.dmb_len(),
        version: SMC_V2,
        client: false,
    };
    established(
        engine,
        settings,
        sock,
        (own, peer),
        info,
        lgr,
        (own_reused, peer_cached),
    )
}
