//! The CLC decisions for SMC-R v2 over RoCEv2 (`af_smc.c`: `smc_find_rdma_v2_device_serv`,
//! `smc_connect_rdma_v2_prepare`, `smcr_conn_save_peer_info`; `smc_clc.c`:
//! `smcr_clc_prep_confirm_accept`, the v2.1 feature checks), as pure functions in the style of
//! [`super::decide`]: the message and what this side knows in, the facts of the next step or
//! a reason code out. The state machines do not call them yet (issue 12): this is the part
//! of the handshake that must match the kernel byte for byte, tested on its own.
//!
//! What SMC-R v2 needs that SMC-D does not: the client's RoCEv2 GID (an IPv4-mapped address,
//! in the Proposal's v2 extension) and a user EID both sides share (the system EID is an
//! SMC-D thing: `smc_clc_match_eid` is called without it for RDMA); in the Accept and the
//! Confirm each side's link (QPN, initial PSN, path MTU) and RMB (rkey, address, size, the
//! token CDCs name it by); on first contact the extension with the release, `v2_direct`
//! (this engine supports only peers on the same subnet: no gateway) and the v2.1 limits
//! `max_conns` / `max_links`; and in the first-contact Confirm the client's GID list (the
//! server's ADD_LINK candidates).
//!
//! **SMC-R v1** (RoCE v1, `smc_find_rdma_v1_device_serv`, `smc_listen_prfx_check`,
//! `smc_connect_rdma` with a v1 Accept): the client's v1 GID, MAC and system id in the
//! Proposal's base, beside an IP prefix area naming its subnet; the server takes it when that
//! subnet and prefix length are its own (else `DIFFPREFIX`). Accept and Confirm are the 68-byte
//! v1 messages: no EID, no first-contact extension (the group's limits are the kernel's v1
//! defaults, 255 connections and 2 links), no GID list. A server offered both takes v2, as
//! `smc_listen_find_device` tries RDMA v2 before v1; a client reads the version the Accept
//! names.

use super::decide::{LocalCaps, RELEASE, Refusal, match_eid};
use alloc::vec::Vec;
use core::net::Ipv4Addr;
pub use smc_proto::clc::types::{PeerId, RoceGid};
use smc_proto::clc::{
    AcceptConfirm, AcceptConfirmBody, ClcMessage, Eid, FirstContactExt, Hostname, IpPrefixArea,
    Proposal, ProposalBuilder, ReasonCode, SMC_FEATURE_MASK, SMC_RELEASE_1, SMC_V1, SMC_V2,
    SMCR_MAX_BUFSIZE_CODE, SmcrAcceptConfirm, SmcrV1Offer, SmcrV2Offer, compress_bufsize,
    uncompress_bufsize,
};

/// `SMC_CONN_PER_LGR_MIN`: the least `max_conns` a v2.1 peer may ask for.
pub const MIN_CONNS_PER_LGR: u8 = 16;
/// `SMC_CONN_PER_LGR_MAX` / the default of `smcr_max_conns_per_lgr`.
pub const MAX_CONNS_PER_LGR: u8 = 255;
/// The default of `smcr_max_links_per_lgr`.
pub const MAX_LINKS_PER_LGR: u8 = 2;
/// The largest RMB size code a peer may name (`SMCR_RMBE_SIZES`: 15 since 6.x; we offer at
/// most [`SMCR_MAX_BUFSIZE_CODE`]).
pub const PEER_MAX_BUFSIZE_CODE: u8 = 15;
/// The most GIDs a first-contact Confirm lists (what smc-proto's Accept/Confirm carries).
pub const MAX_GID_LIST: usize = 2;

/// What this side brings for SMC-R.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmcrCaps {
    /// System id: two random bytes and the first RoCE port's MAC (`local_systemid`).
    pub peer_id: PeerId,
    /// The RoCEv2 GID of the device on the TCP connection's subnet (IPv4-mapped).
    pub gid: RoceGid,
    /// That port's MAC.
    pub mac: [u8; 6],
    /// `smcr_max_conns_per_lgr`.
    pub max_conns: u8,
    /// `smcr_max_links_per_lgr`.
    pub max_links: u8,
}

/// This side's link as the CLC names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkOffer {
    /// QP number (24 bits).
    pub qpn: u32,
    /// Initial send PSN (24 bits).
    pub psn: u32,
    /// Path MTU, IB enum (1 = 256 … 5 = 4096).
    pub mtu: u8,
}

/// This side's RMB for the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RmbOffer {
    /// The connection's token: the peer puts it into every CDC (`rmbe_alert_token`).
    pub token: u32,
    /// The RMB's rkey on the link.
    pub rkey: u32,
    /// Its address as RETHs name it.
    pub addr: u64,
    /// Its size (what the compressed size code describes).
    pub len: usize,
}

/// Whether `g` is an IPv4-mapped GID (`::ffff:a.b.c.d`), what RoCEv2 needs for SMC-Rv2.
pub fn is_ipv4_mapped(g: &RoceGid) -> bool {
    g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff
}

/// Adds the SMC-R v2 offer to a Proposal being built.
pub fn propose(b: ProposalBuilder, caps: &SmcrCaps) -> ProposalBuilder {
    b.smcr_v2(SmcrV2Offer {
        roce_gid: caps.gid,
        max_conns: caps.max_conns,
        max_links: caps.max_links,
    })
}

/// Adds the SMC-R v1 offer to a Proposal being built (`smc_clc_send_proposal` with R in
/// `typev1`): the v1 GID, MAC and system id of `caps`, and the IP prefix area of the TCP
/// connection's subnet (`smc_clc_prfx_set`: the local address masked to `prefix_len`).
pub fn propose_v1(
    b: ProposalBuilder,
    caps: &SmcrCaps,
    local: Ipv4Addr,
    prefix_len: u8,
) -> ProposalBuilder {
    b.smcr_v1(SmcrV1Offer {
        peer_id: caps.peer_id,
        gid: caps.gid,
        mac: caps.mac,
    })
    .ip_prefix(IpPrefixArea::ipv4(subnet(local, prefix_len), prefix_len))
}

/// `local` masked to its first `prefix_len` bits.
pub fn subnet(local: Ipv4Addr, prefix_len: u8) -> Ipv4Addr {
    let mask = u32::MAX
        .checked_shl(32 - u32::from(prefix_len.min(32)))
        .unwrap_or(0);
    Ipv4Addr::from(u32::from(local) & mask)
}

/// `smc_listen_prfx_check` + `smc_find_rdma_v1_device_serv`: whether the Proposal offers SMC-R
/// v1 that this server can take, its address on the TCP connection's netdev being `local` with
/// `prefix_len` (`smc_clc_prfx_match`: same prefix length, same subnet).
pub fn server_check_v1(
    p: &Proposal,
    local: Ipv4Addr,
    prefix_len: u8,
) -> Result<SmcrProposalInfo, ReasonCode> {
    if !p.typev1.smcr() {
        return Err(ReasonCode::NOSMCRDEV);
    }
    let Some(area) = &p.ip_prefix else {
        return Err(ReasonCode::DIFFPREFIX);
    };
    if area.ipv4_prefix_len != prefix_len || area.ipv4_subnet != subnet(local, prefix_len) {
        return Err(ReasonCode::DIFFPREFIX);
    }
    if p.ib_gid == [0; 16] {
        return Err(ReasonCode::NOSMCRDEV);
    }
    Ok(SmcrProposalInfo {
        version: SMC_V1,
        peer_gid: p.ib_gid,
        eid: Eid([0; 32]),
        release: 0,
        // A v1 group has the kernel's fixed limits (`smc_lgr_create`).
        max_conns: MAX_CONNS_PER_LGR,
        max_links: MAX_LINKS_PER_LGR,
        feature_mask: 0,
    })
}

/// What a server learned from a Proposal's SMC-R offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmcrProposalInfo {
    /// The version chosen: [`SMC_V2`] or [`SMC_V1`].
    pub version: u8,
    /// The client's RoCEv2 GID.
    pub peer_gid: RoceGid,
    /// Negotiated user EID.
    pub eid: Eid,
    /// Negotiated release.
    pub release: u8,
    /// Negotiated limits (release 1 and later; else the defaults).
    pub max_conns: u8,
    /// Negotiated links per group.
    pub max_links: u8,
    /// Common feature mask.
    pub feature_mask: u16,
}

/// `smc_find_rdma_v2_device_serv` + `smc_clc_srv_v2x_features_validate`: whether the
/// Proposal offers SMC-R v2 that this server can take.
pub fn server_check(
    p: &Proposal,
    caps: &LocalCaps,
    smcr: &SmcrCaps,
) -> Result<SmcrProposalInfo, ReasonCode> {
    if p.version < SMC_V2 || !p.typev2.smcr() {
        return Err(ReasonCode::NOSMCRDEV);
    }
    let Some(v2) = &p.v2 else {
        return Err(ReasonCode::NOV2EXT);
    };
    if !is_ipv4_mapped(&v2.roce_gid) || v2.roce_gid[12..] == [0; 4] {
        return Err(ReasonCode::NOSMCRDEV);
    }
    // RDMA has no system EID: only the user EIDs count.
    let Some(eid) = match_eid(caps, None, &v2.user_eids) else {
        return Err(ReasonCode::NOUEID);
    };
    let release = v2.release.min(RELEASE);
    let (mut max_conns, mut max_links) = (smcr.max_conns, smcr.max_links);
    if release >= SMC_RELEASE_1 {
        if v2.max_conns < MIN_CONNS_PER_LGR {
            return Err(ReasonCode::MAXCONNERR);
        }
        if v2.max_links == 0 {
            return Err(ReasonCode::MAXLINKERR);
        }
        max_conns = max_conns.min(v2.max_conns);
        max_links = max_links.min(v2.max_links);
    }
    Ok(SmcrProposalInfo {
        version: SMC_V2,
        peer_gid: v2.roce_gid,
        eid,
        release,
        max_conns,
        max_links,
        feature_mask: v2.feature_mask & SMC_FEATURE_MASK,
    })
}

fn body(smcr: &SmcrCaps, link: &LinkOffer, rmb: &RmbOffer, eid: Eid) -> SmcrAcceptConfirm {
    SmcrAcceptConfirm {
        peer_id: smcr.peer_id,
        gid: smcr.gid,
        mac: smcr.mac,
        qpn: link.qpn & 0x00ff_ffff,
        rmb_rkey: rmb.rkey,
        rmbe_idx: 1,
        rmbe_alert_token: rmb.token,
        rmbe_size: compress_bufsize(rmb.len, SMCR_MAX_BUFSIZE_CODE),
        qp_mtu: link.mtu,
        rmb_dma_addr: rmb.addr,
        psn: link.psn & 0x00ff_ffff,
        eid,
        gid_list: None,
    }
}

/// The server's Accept in the version `info` chose: [`server_accept`] for v2, the 68-byte v1
/// Accept (its v1 GID in `smcr`, no EID, no extension) for v1.
pub fn server_accept_any(
    smcr: &SmcrCaps,
    info: &SmcrProposalInfo,
    link: &LinkOffer,
    rmb: &RmbOffer,
    first_contact: bool,
    hostname: Hostname,
) -> AcceptConfirm {
    if info.version >= SMC_V2 {
        return server_accept(smcr, info, link, rmb, first_contact, hostname);
    }
    AcceptConfirm::smcr(SMC_V1, first_contact, body(smcr, link, rmb, info.eid), None)
}

/// The server's SMC-R v2 Accept (`smcr_clc_prep_confirm_accept`): its link and RMB, and on
/// first contact the extension with the negotiated release and limits.
pub fn server_accept(
    smcr: &SmcrCaps,
    info: &SmcrProposalInfo,
    link: &LinkOffer,
    rmb: &RmbOffer,
    first_contact: bool,
    hostname: Hostname,
) -> AcceptConfirm {
    let fce = first_contact.then(|| {
        FirstContactExt::linux_smcr(
            info.release,
            hostname,
            true,
            info.max_conns,
            info.max_links,
            info.feature_mask,
        )
    });
    AcceptConfirm::smcr(SMC_V2, first_contact, body(smcr, link, rmb, info.eid), fce)
}

/// The peer's side of an SMC-R connection, from its Accept or Confirm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmcrPeer {
    /// The version of its message: [`SMC_V2`] or [`SMC_V1`].
    pub version: u8,
    /// Its system id.
    pub peer_id: PeerId,
    /// The GID of its link.
    pub gid: RoceGid,
    /// Its port's MAC.
    pub mac: [u8; 6],
    /// Its QP.
    pub qpn: u32,
    /// Its initial send PSN: our receive side starts there.
    pub psn: u32,
    /// Path MTU it names (Accept: its own; Confirm: the minimum of both).
    pub mtu: u8,
    /// Its RMB: rkey, address, size and the token our CDCs carry.
    pub rmb: RmbOffer,
    /// A new link group.
    pub first_contact: bool,
    /// The negotiated EID it names.
    pub eid: Eid,
    /// Its first-contact extension.
    pub fce: Option<FirstContactExt>,
    /// A first-contact Confirm's GID list.
    pub gid_list: Vec<RoceGid>,
}

/// The checks both directions make on an SMC-R Accept/Confirm body (what
/// `smcr_conn_save_peer_info` and the link setup would otherwise trip over): a real QPN, a
/// path MTU the IB enum has, one RMBE per RMB, a size code the kernel can have sent, a token.
///
/// A v2 message must name an IPv4-mapped GID (RoCEv2), a v1 message any GID but zero.
fn peer_of(a: AcceptConfirm) -> Result<SmcrPeer, ReasonCode> {
    let AcceptConfirmBody::SmcR(r) = a.body else {
        return Err(ReasonCode::MODEUNSUPP);
    };
    let gid_ok = if a.version >= SMC_V2 {
        is_ipv4_mapped(&r.gid)
    } else {
        r.gid != [0; 16]
    };
    if !gid_ok {
        return Err(ReasonCode::MODEUNSUPP);
    }
    let valid = r.qpn != 0
        && r.qpn <= 0x00ff_ffff
        && (1..=5).contains(&r.qp_mtu)
        && r.rmbe_idx == 1
        && r.rmbe_size <= PEER_MAX_BUFSIZE_CODE
        && r.rmbe_alert_token != 0
        && r.psn <= 0x00ff_ffff;
    if !valid {
        return Err(ReasonCode::CNFERR);
    }
    Ok(SmcrPeer {
        version: a.version.min(SMC_V2),
        peer_id: r.peer_id,
        gid: r.gid,
        mac: r.mac,
        qpn: r.qpn,
        psn: r.psn,
        mtu: r.qp_mtu,
        rmb: RmbOffer {
            token: r.rmbe_alert_token,
            rkey: r.rmb_rkey,
            addr: r.rmb_dma_addr,
            len: uncompress_bufsize(r.rmbe_size),
        },
        first_contact: a.first_contact,
        eid: r.eid,
        fce: a.fce,
        gid_list: r.gid_list.unwrap_or_default(),
    })
}

/// `smc_connect_rdma_v2_prepare` + `smc_clc_clnt_v2x_features_validate`: checks the server's
/// answer to our SMC-R v2 offer.
pub fn client_check_accept(msg: ClcMessage, caps: &SmcrCaps) -> Result<SmcrPeer, Refusal> {
    let a = match msg {
        ClcMessage::Accept(a) => a,
        ClcMessage::Decline(d) => return Err(Refusal::declined(&d)),
        _ => return Err(Refusal::Decline(ReasonCode::CNFERR)),
    };
    let peer = peer_of(a).map_err(Refusal::Decline)?;
    if peer.version < SMC_V2 {
        return Err(Refusal::Decline(ReasonCode::MODEUNSUPP));
    }
    if peer.first_contact {
        let Some(fce) = &peer.fce else {
            return Err(Refusal::Decline(ReasonCode::CNFERR));
        };
        if fce.release > RELEASE {
            return Err(Refusal::Decline(ReasonCode::RELEASEERR));
        }
        if !fce.v2_direct {
            // A peer behind a gateway: this engine does not route RoCE.
            return Err(Refusal::Decline(ReasonCode::NOINDIRECT));
        }
        if fce.release >= SMC_RELEASE_1
            && let Some(x) = fce.v2x
        {
            if x.max_conns < MIN_CONNS_PER_LGR || x.max_conns > caps.max_conns {
                return Err(Refusal::Decline(ReasonCode::MAXCONNERR));
            }
            if x.max_links == 0 || x.max_links > caps.max_links {
                return Err(Refusal::Decline(ReasonCode::MAXLINKERR));
            }
        }
    }
    Ok(peer)
}

/// `smc_connect_check_aclc` + the checks of the version the Accept names: a client that
/// offered SMC-R v2 (`v2`) and/or v1 (`v1`) takes an Accept of either version it offered
/// (`MODEUNSUPP` for another), a v2 one as [`client_check_accept`] does.
pub fn client_check_accept_any(
    msg: ClcMessage,
    caps: &SmcrCaps,
    v1: bool,
    v2: bool,
) -> Result<SmcrPeer, Refusal> {
    let version = match &msg {
        ClcMessage::Accept(a) => a.version,
        _ => return client_check_accept(msg, caps),
    };
    if version >= SMC_V2 {
        if !v2 {
            return Err(Refusal::Decline(ReasonCode::MODEUNSUPP));
        }
        return client_check_accept(msg, caps);
    }
    if !v1 {
        return Err(Refusal::Decline(ReasonCode::MODEUNSUPP));
    }
    let ClcMessage::Accept(a) = msg else {
        unreachable!("matched above")
    };
    peer_of(a).map_err(Refusal::Decline)
}

/// The client's Confirm in the version of the server's Accept: [`client_confirm`] for v2; for
/// v1 the 68-byte Confirm with its link (the smaller path MTU) and RMB, no EID, no extension,
/// no GID list.
pub fn client_confirm_any(
    smcr: &SmcrCaps,
    peer: &SmcrPeer,
    link: &LinkOffer,
    rmb: &RmbOffer,
    hostname: Hostname,
    gids: &[RoceGid],
) -> AcceptConfirm {
    if peer.version >= SMC_V2 {
        return client_confirm(smcr, peer, link, rmb, hostname, gids);
    }
    let link = LinkOffer {
        mtu: link.mtu.min(peer.mtu),
        ..*link
    };
    AcceptConfirm::smcr(
        SMC_V1,
        peer.first_contact,
        body(smcr, &link, rmb, Eid([0; 32])),
        None,
    )
}

/// The client's SMC-R v2 Confirm: its link (with the path MTU both can use) and RMB, and on
/// first contact the extension echoing what the server chose and the client's GID list.
pub fn client_confirm(
    smcr: &SmcrCaps,
    peer: &SmcrPeer,
    link: &LinkOffer,
    rmb: &RmbOffer,
    hostname: Hostname,
    gids: &[RoceGid],
) -> AcceptConfirm {
    let link = LinkOffer {
        mtu: link.mtu.min(peer.mtu),
        ..*link
    };
    let mut b = body(smcr, &link, rmb, peer.eid);
    let fce = peer.fce.filter(|_| peer.first_contact).map(|f| {
        let (max_conns, max_links, mask) = f
            .v2x
            .map_or((0, 0, 0), |x| (x.max_conns, x.max_links, x.feature_mask));
        FirstContactExt::linux_smcr(f.release, hostname, true, max_conns, max_links, mask)
    });
    if peer.first_contact {
        b.gid_list = Some(gids.iter().take(MAX_GID_LIST).copied().collect());
    }
    AcceptConfirm::smcr(SMC_V2, peer.first_contact, b, fce)
}

/// Checks the client's SMC-R v2 Confirm against what we accepted.
pub fn server_check_confirm(msg: ClcMessage, first_contact: bool) -> Result<SmcrPeer, Refusal> {
    server_check_confirm_any(msg, first_contact, SMC_V2)
}

/// [`server_check_confirm`] for the version the server accepted in: a Confirm of another
/// version is refused (`VERSMISMAT`).
pub fn server_check_confirm_any(
    msg: ClcMessage,
    first_contact: bool,
    version: u8,
) -> Result<SmcrPeer, Refusal> {
    let c = match msg {
        ClcMessage::Confirm(c) => c,
        ClcMessage::Decline(d) => return Err(Refusal::declined(&d)),
        _ => return Err(Refusal::Decline(ReasonCode::CNFERR)),
    };
    let peer = peer_of(c).map_err(Refusal::Decline)?;
    if (peer.version >= SMC_V2) != (version >= SMC_V2) {
        return Err(Refusal::Decline(ReasonCode::VERSMISMAT));
    }
    if peer.first_contact != first_contact {
        return Err(Refusal::Decline(ReasonCode::SYNCERR));
    }
    Ok(peer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gid::Gid;
    use smc_proto::clc::{ClcMessage, ProposalBuilder};

    fn gid4(a: [u8; 4]) -> RoceGid {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&a);
        g
    }

    fn eid() -> Eid {
        Eid::new("SMCR-TEST-EID").unwrap()
    }

    fn caps() -> LocalCaps {
        LocalCaps {
            gid: Gid::default(),
            chid: 0xffff,
            seid: None,
            ueids: alloc::vec![eid()],
            hostname: Hostname::new("host"),
        }
    }

    fn smcr(last: u8) -> SmcrCaps {
        SmcrCaps {
            peer_id: [1, 2, 2, 0, 0, 0, 0, last],
            gid: gid4([10, 0, 0, last]),
            mac: [2, 0, 0, 0, 0, last],
            max_conns: MAX_CONNS_PER_LGR,
            max_links: MAX_LINKS_PER_LGR,
        }
    }

    /// Emit and parse, as the wire does.
    fn wire(m: ClcMessage) -> ClcMessage {
        ClcMessage::parse(&m.to_vec()).expect("parses")
    }

    fn proposal(c: &SmcrCaps) -> Proposal {
        let p = propose(ProposalBuilder::new().user_eid(eid()), c)
            .build()
            .expect("valid");
        match wire(ClcMessage::Proposal(p)) {
            ClcMessage::Proposal(p) => p,
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn a_first_contact_goes_through_with_every_field_carried() {
        let (cl, sv) = (smcr(1), smcr(2));
        let info = server_check(&proposal(&cl), &caps(), &sv).expect("server takes it");
        assert_eq!(info.peer_gid, cl.gid);
        assert_eq!(info.eid, eid());
        assert_eq!((info.max_conns, info.max_links), (255, 2));
        let s_link = LinkOffer {
            qpn: 0x1234,
            psn: 0xabcdef,
            mtu: 5,
        };
        let s_rmb = RmbOffer {
            token: 0x77,
            rkey: 0x1122_3344,
            addr: 0x7f00_0000_1000,
            len: 64 << 10,
        };
        let acc = server_accept(&sv, &info, &s_link, &s_rmb, true, caps().hostname);
        let peer =
            client_check_accept(wire(ClcMessage::Accept(acc)), &cl).expect("client takes it");
        assert_eq!(
            (peer.qpn, peer.psn, peer.mtu, peer.rmb, peer.gid, peer.mac),
            (0x1234, 0xabcdef, 5, s_rmb, sv.gid, sv.mac)
        );
        assert!(peer.first_contact && peer.fce.is_some_and(|f| f.v2_direct));
        let c_link = LinkOffer {
            qpn: 0x99,
            psn: 7,
            mtu: 3,
        };
        let c_rmb = RmbOffer {
            token: 0x55,
            rkey: 9,
            addr: 0x1000,
            len: 16 << 10,
        };
        let conf = client_confirm(&cl, &peer, &c_link, &c_rmb, caps().hostname, &[cl.gid]);
        let back = server_check_confirm(wire(ClcMessage::Confirm(conf)), true).expect("confirm");
        assert_eq!(
            (back.qpn, back.psn, back.rmb, back.gid),
            (0x99, 7, c_rmb, cl.gid)
        );
        assert_eq!(back.mtu, 3, "the Confirm names the smaller MTU");
        assert_eq!(back.gid_list, alloc::vec![cl.gid]);
    }

    #[test]
    fn what_a_server_refuses_in_a_proposal() {
        let cl = smcr(1);
        // No shared user EID.
        let p = propose(
            ProposalBuilder::new().user_eid(Eid::new("OTHER").unwrap()),
            &cl,
        )
        .build()
        .unwrap();
        assert_eq!(server_check(&p, &caps(), &smcr(2)), Err(ReasonCode::NOUEID));
        // A GID that is not IPv4-mapped (RoCEv1 style, link-local).
        let mut bad = cl;
        bad.gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xfe, 0, 0, 1];
        assert_eq!(
            server_check(&proposal(&bad), &caps(), &smcr(2)),
            Err(ReasonCode::NOSMCRDEV)
        );
        // v2.1 limits out of range.
        let mut few = cl;
        few.max_conns = 8;
        assert_eq!(
            server_check(&proposal(&few), &caps(), &smcr(2)),
            Err(ReasonCode::MAXCONNERR)
        );
        let mut none = cl;
        none.max_links = 0;
        assert_eq!(
            server_check(&proposal(&none), &caps(), &smcr(2)),
            Err(ReasonCode::MAXLINKERR)
        );
        // Limits are the smaller of both.
        let mut one = cl;
        one.max_links = 1;
        one.max_conns = 32;
        let i = server_check(&proposal(&one), &caps(), &smcr(2)).unwrap();
        assert_eq!((i.max_conns, i.max_links), (32, 1));
    }

    #[test]
    fn what_a_client_refuses_in_an_accept() {
        let (cl, sv) = (smcr(1), smcr(2));
        let info = server_check(&proposal(&cl), &caps(), &sv).unwrap();
        let link = LinkOffer {
            qpn: 0x1234,
            psn: 1,
            mtu: 3,
        };
        let rmb = RmbOffer {
            token: 1,
            rkey: 2,
            addr: 3,
            len: 16 << 10,
        };
        let refuse = |f: &dyn Fn(&mut AcceptConfirm)| {
            let mut a = server_accept(&sv, &info, &link, &rmb, true, caps().hostname);
            f(&mut a);
            client_check_accept(ClcMessage::Accept(a), &cl).unwrap_err()
        };
        let set = |f: fn(&mut SmcrAcceptConfirm)| {
            move |a: &mut AcceptConfirm| {
                if let AcceptConfirmBody::SmcR(r) = &mut a.body {
                    f(r)
                }
            }
        };
        let cnf = Refusal::Decline(ReasonCode::CNFERR);
        assert_eq!(refuse(&set(|r| r.qpn = 0)), cnf);
        assert_eq!(refuse(&set(|r| r.qp_mtu = 6)), cnf);
        assert_eq!(refuse(&set(|r| r.rmbe_alert_token = 0)), cnf);
        assert_eq!(refuse(&set(|r| r.rmbe_idx = 0)), cnf);
        assert_eq!(
            refuse(&|a| a.fce.as_mut().unwrap().v2_direct = false),
            Refusal::Decline(ReasonCode::NOINDIRECT)
        );
        assert_eq!(
            refuse(&|a| a.fce.as_mut().unwrap().release = RELEASE + 1),
            Refusal::Decline(ReasonCode::RELEASEERR)
        );
        assert_eq!(refuse(&|a| a.fce = None), cnf);
        assert_eq!(
            refuse(&|a| a.version = 1),
            Refusal::Decline(ReasonCode::MODEUNSUPP)
        );
        // A Confirm whose first-contact bit disagrees: out of sync.
        let acc = server_accept(&sv, &info, &link, &rmb, true, caps().hostname);
        let peer = client_check_accept(ClcMessage::Accept(acc), &cl).unwrap();
        let conf = client_confirm(&cl, &peer, &link, &rmb, caps().hostname, &[]);
        assert_eq!(
            server_check_confirm(ClcMessage::Confirm(conf), false),
            Err(Refusal::Decline(ReasonCode::SYNCERR))
        );
    }

    fn v1_gid(last: u8) -> RoceGid {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[8..].copy_from_slice(&[0, 0, 0, 0xff, 0xfe, 0, 0, last]);
        g
    }

    fn smcr_v1(last: u8) -> SmcrCaps {
        SmcrCaps {
            gid: v1_gid(last),
            ..smcr(last)
        }
    }

    /// A Linux-style Proposal (version 2 header) offering v1 only, or v1 and v2.
    fn proposal_v1(c: &SmcrCaps, v2: Option<&SmcrCaps>, local: Ipv4Addr, len: u8) -> Proposal {
        let mut b = propose_v1(ProposalBuilder::new().user_eid(eid()), c, local, len);
        if let Some(v2) = v2 {
            b = propose(b, v2);
        }
        match wire(ClcMessage::Proposal(b.build().expect("valid"))) {
            ClcMessage::Proposal(p) => p,
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn a_v1_first_contact_goes_through_in_68_byte_messages() {
        let (cl, sv) = (smcr_v1(1), smcr_v1(2));
        let p = proposal_v1(&cl, None, Ipv4Addr::new(10, 0, 0, 1), 24);
        assert!(p.typev1.smcr() && !p.typev2.smcr());
        assert_eq!(p.ib_gid, cl.gid);
        assert_eq!(p.ib_mac, cl.mac);
        assert_eq!(p.peer_id, cl.peer_id);
        let area = p.ip_prefix.as_ref().unwrap();
        assert_eq!(
            (area.ipv4_subnet, area.ipv4_prefix_len),
            (Ipv4Addr::new(10, 0, 0, 0), 24)
        );
        // v2 is not offered: the v2 check refuses, the v1 check takes it.
        assert_eq!(server_check(&p, &caps(), &sv), Err(ReasonCode::NOSMCRDEV));
        let info = server_check_v1(&p, Ipv4Addr::new(10, 0, 0, 2), 24).expect("v1");
        assert_eq!(info.version, SMC_V1);
        assert_eq!(info.peer_gid, cl.gid);
        assert_eq!((info.max_conns, info.max_links), (255, 2));
        let s_link = LinkOffer {
            qpn: 0x1234,
            psn: 0xabcdef,
            mtu: 5,
        };
        let s_rmb = RmbOffer {
            token: 0x77,
            rkey: 0x1122_3344,
            addr: 0xdead_0000,
            len: 64 << 10,
        };
        let acc = server_accept_any(&sv, &info, &s_link, &s_rmb, true, caps().hostname);
        assert_eq!(ClcMessage::Accept(acc.clone()).to_vec().len(), 68);
        let acc = wire(ClcMessage::Accept(acc));
        // A v2-only client does not take it; one that offered v1 does.
        assert_eq!(
            client_check_accept(acc.clone(), &cl),
            Err(Refusal::Decline(ReasonCode::MODEUNSUPP))
        );
        assert_eq!(
            client_check_accept_any(acc.clone(), &cl, false, true),
            Err(Refusal::Decline(ReasonCode::MODEUNSUPP))
        );
        let peer = client_check_accept_any(acc, &cl, true, true).expect("v1 Accept");
        assert_eq!(peer.version, SMC_V1);
        assert_eq!(
            (peer.gid, peer.mac, peer.peer_id),
            (sv.gid, sv.mac, sv.peer_id)
        );
        assert_eq!((peer.qpn, peer.psn, peer.mtu), (0x1234, 0xabcdef, 5));
        assert_eq!(peer.rmb, s_rmb);
        assert!(peer.first_contact && peer.fce.is_none());
        let c_link = LinkOffer {
            qpn: 0x5678,
            psn: 7,
            mtu: 3,
        };
        let c_rmb = RmbOffer {
            token: 0x99,
            rkey: 5,
            addr: 0xbeef_0000,
            len: 16 << 10,
        };
        let conf = client_confirm_any(&cl, &peer, &c_link, &c_rmb, caps().hostname, &[cl.gid]);
        assert_eq!(
            ClcMessage::Confirm(conf.clone()).to_vec().len(),
            68,
            "no GID list in v1"
        );
        let conf = wire(ClcMessage::Confirm(conf));
        assert_eq!(
            server_check_confirm(conf.clone(), true),
            Err(Refusal::Decline(ReasonCode::VERSMISMAT))
        );
        let got = server_check_confirm_any(conf, true, SMC_V1).expect("v1 Confirm");
        assert_eq!((got.gid, got.qpn, got.mtu), (cl.gid, 0x5678, 3));
        assert_eq!(got.rmb, c_rmb);
    }

    #[test]
    fn a_v1_offer_needs_the_servers_subnet_and_v2_is_there_beside_it() {
        let cl = smcr_v1(1);
        let p = proposal_v1(&cl, Some(&smcr(1)), Ipv4Addr::new(10, 1, 2, 3), 16);
        // Both offered: both checks pass (the engine takes v2 first, as the kernel does).
        assert!(server_check(&p, &caps(), &smcr(2)).is_ok());
        assert!(server_check_v1(&p, Ipv4Addr::new(10, 1, 200, 9), 16).is_ok());
        // Another subnet, another prefix length.
        assert_eq!(
            server_check_v1(&p, Ipv4Addr::new(10, 2, 0, 9), 16),
            Err(ReasonCode::DIFFPREFIX)
        );
        assert_eq!(
            server_check_v1(&p, Ipv4Addr::new(10, 1, 2, 9), 24),
            Err(ReasonCode::DIFFPREFIX)
        );
        // v2 only: nothing for v1.
        assert_eq!(
            server_check_v1(&proposal(&smcr(1)), Ipv4Addr::new(10, 0, 0, 2), 24),
            Err(ReasonCode::NOSMCRDEV)
        );
        assert_eq!(
            subnet(Ipv4Addr::new(192, 168, 7, 9), 0),
            Ipv4Addr::UNSPECIFIED
        );
        assert_eq!(
            subnet(Ipv4Addr::new(192, 168, 7, 9), 32),
            Ipv4Addr::new(192, 168, 7, 9)
        );
    }
}
