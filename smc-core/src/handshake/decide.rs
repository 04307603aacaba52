//! The CLC handshake decisions for SMC-D v2 over an emulated ISM device such as loopback-ism,
//! as `af_smc.c` (`smc_connect_ism`, `smc_listen_work`, `smc_find_ism_v2_device_serv`) and
//! `smc_clc.c` (`smc_clc_match_eid`, the v2.1 feature checks) make them.
//!
//! Each function takes the message received and what this side knows, and returns either the
//! facts the next step needs or the reason code to decline with. The state machines in
//! [`super::client`] and [`super::server`] put them in order.

use crate::gid::{Gid, gid_hi, gid_join, gid_lo};
use alloc::vec::Vec;
use smc_proto::clc::{
    AcceptConfirm, AcceptConfirmBody, ClcMessage, Eid, FirstContactExt, Hostname, Proposal,
    ProposalBuilder, ReasonCode, SMC_FEATURE_MASK, SMC_RELEASE_1, SMC_V2, SMCD_MAX_BUFSIZE_CODE,
    SmcdAcceptConfirm, compress_bufsize, uncompress_bufsize,
};

/// The highest release this engine speaks (v2.1).
pub const RELEASE: u8 = SMC_RELEASE_1;

/// What one side brings to a handshake.
#[derive(Debug, Clone)]
pub struct LocalCaps {
    /// The engine's 128-bit GID.
    pub gid: Gid,
    /// The device CHID (0xFFFF).
    pub chid: u16,
    /// The system EID, if SEID is enabled.
    pub seid: Option<Eid>,
    /// The user EID table.
    pub ueids: Vec<Eid>,
    /// Host name for the first contact extension.
    pub hostname: Hostname,
}

/// Why a handshake did not produce an SMC connection, from one side's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// We decline with this reason (and send a Decline).
    Decline(ReasonCode),
    /// The peer declined with this reason (local reason is PEERDECL).
    PeerDeclined {
        /// The peer's code.
        peer: ReasonCode,
        /// The peer said its link group is out of sync.
        out_of_sync: bool,
    },
}

impl Refusal {
    /// The peer's Decline.
    pub fn declined(d: &smc_proto::clc::Decline) -> Self {
        Refusal::PeerDeclined {
            peer: d.reason,
            out_of_sync: d.out_of_sync,
        }
    }

    /// The (local, peer) reason pair a fallback records.
    pub fn reasons(self) -> (ReasonCode, ReasonCode) {
        match self {
            Refusal::Decline(r) => (r, ReasonCode(0)),
            Refusal::PeerDeclined { peer, .. } => (ReasonCode::PEERDECL, peer),
        }
    }
}

/// `smc_clc_match_eid`: the SEID when both have it enabled and they are equal, else the first
/// of the peer's user EIDs that is also in ours.
pub fn match_eid(local: &LocalCaps, peer_seid: Option<&Eid>, peer_ueids: &[Eid]) -> Option<Eid> {
    if let (Some(mine), Some(theirs)) = (&local.seid, peer_seid)
        && mine == theirs
    {
        return Some(*mine);
    }
    peer_ueids.iter().find(|e| local.ueids.contains(e)).copied()
}

// ---------------------------------------------------------------------------------------
// Client side.

/// The Proposal a client sends: version 2, SMC-D v2 with the loopback device (two GID/CHID
/// entries for the 128-bit GID), its user EIDs and, if enabled, its system EID.
pub fn client_proposal(caps: &LocalCaps) -> Proposal {
    let mut b = ProposalBuilder::smcd_v2_loopback(gid_hi(caps.gid), gid_lo(caps.gid));
    for e in &caps.ueids {
        b = b.user_eid(*e);
    }
    if let Some(seid) = caps.seid {
        b = b.system_eid(seid);
    }
    b.build()
        .expect("a loopback SMC-D v2 proposal is always valid")
}

/// What the client learned from an Accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptInfo {
    /// The server's GID.
    pub peer_gid: Gid,
    /// The server's DMB token.
    pub token: u64,
    /// The server's DMB size.
    pub dmb_len: usize,
    /// The server's link group id (each side names its link group with its own id, as the
    /// kernel's `smc_clc_send_confirm_accept` copies the sender's `lgr->id`).
    pub lgr_id: u32,
    /// A new link group.
    pub first_contact: bool,
    /// Negotiated EID.
    pub eid: Eid,
    /// Negotiated release.
    pub release: u8,
    /// The server's first contact extension.
    pub fce: Option<FirstContactExt>,
}

/// Checks the server's answer to our Proposal. `expected_gid` is the listener's GID as
/// `smcd` reported it.
pub fn client_check_accept(
    msg: ClcMessage,
    caps: &LocalCaps,
    expected_gid: Option<Gid>,
) -> Result<AcceptInfo, Refusal> {
    let a = match msg {
        ClcMessage::Accept(a) => a,
        ClcMessage::Decline(d) => return Err(Refusal::declined(&d)),
        // Anything else here breaks the protocol (smc_clc_wait_msg: unexpected type).
        _ => return Err(Refusal::Decline(ReasonCode::CNFERR)),
    };
    let AcceptConfirmBody::SmcD(d) = a.body else {
        // We proposed SMC-D only.
        return Err(Refusal::Decline(ReasonCode::MODEUNSUPP));
    };
    if a.version < SMC_V2 {
        // Loopback is an ISMv2 device: a v1 Accept names a mode we did not propose.
        return Err(Refusal::Decline(ReasonCode::MODEUNSUPP));
    }
    if d.chid != caps.chid {
        return Err(Refusal::Decline(ReasonCode::MODEUNSUPP));
    }
    let peer_gid = gid_join(d.gid, d.gid_ext);
    if expected_gid.is_some_and(|g| g != peer_gid) {
        return Err(Refusal::Decline(ReasonCode::NOSMCD2DEV));
    }
    if d.dmbe_size > SMCD_MAX_BUFSIZE_CODE {
        return Err(Refusal::Decline(ReasonCode::CNFERR));
    }
    let mut release = 0;
    if let Some(fce) = &a.fce {
        // smc_clc_clnt_v2x_features_validate: the server may not pick a newer release.
        if fce.release > RELEASE {
            return Err(Refusal::Decline(ReasonCode::RELEASEERR));
        }
        release = fce.release;
    } else if a.first_contact {
        return Err(Refusal::Decline(ReasonCode::CNFERR));
    }
    Ok(AcceptInfo {
        peer_gid,
        token: d.token,
        dmb_len: uncompress_bufsize(d.dmbe_size),
        lgr_id: u32::from_ne_bytes(d.link_id),
        first_contact: a.first_contact,
        eid: d.eid,
        release,
        fce: a.fce,
    })
}

/// The Confirm a client sends: its GID, its DMB, the link group, the negotiated EID, and the
/// first contact extension echoing the release and the common feature mask.
pub fn client_confirm(
    caps: &LocalCaps,
    acc: &AcceptInfo,
    lgr_id: u32,
    token: u64,
    dmb_len: usize,
) -> AcceptConfirm {
    let body = SmcdAcceptConfirm {
        gid: gid_hi(caps.gid),
        token,
        dmbe_idx: 0,
        dmbe_size: compress_bufsize(dmb_len, SMCD_MAX_BUFSIZE_CODE),
        link_id: lgr_id.to_ne_bytes(),
        chid: caps.chid,
        eid: acc.eid,
        gid_ext: gid_lo(caps.gid),
    };
    let fce = acc.first_contact.then(|| {
        let mask = acc
            .fce
            .and_then(|f| f.v2x)
            .map_or(0, |x| x.feature_mask & SMC_FEATURE_MASK);
        FirstContactExt::linux_smcd(acc.release, caps.hostname, mask)
    });
    AcceptConfirm::smcd_v2(body, fce)
}

// ---------------------------------------------------------------------------------------
// Server side.

/// What the server learned from a Proposal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProposalInfo {
    /// The client's GID (from its loopback device entry).
    pub peer_gid: Gid,
    /// Negotiated EID.
    pub eid: Eid,
    /// Negotiated release: min(client's, ours).
    pub release: u8,
    /// Common feature mask.
    pub feature_mask: u16,
    /// The Proposal's version (Declines are sent with it).
    pub version: u8,
}

/// `smc_listen_work` / `smc_find_ism_v2_device_serv` for the loopback device: the Proposal
/// must offer SMC-D v2 with a loopback device (whose GID is the one `smcd` announced for this
/// client, when it announced one: `expected_gid` is `None` for a client that announced itself
/// with the SMC TCP option only, as the kernel's clients do), and an EID both sides share.
pub fn server_check_proposal(
    msg: ClcMessage,
    caps: &LocalCaps,
    expected_gid: impl Into<Option<Gid>>,
) -> Result<ProposalInfo, Refusal> {
    let expected_gid = expected_gid.into();
    let p = match msg {
        ClcMessage::Proposal(p) => p,
        ClcMessage::Decline(d) => return Err(Refusal::declined(&d)),
        _ => return Err(Refusal::Decline(ReasonCode::CNFERR)),
    };
    let version = p.version;
    if version < SMC_V2 || !p.typev2.smcd() {
        // No ISMv1 device, no RDMA device here: nothing else to offer.
        return Err(Refusal::Decline(ReasonCode::NOSMCDEV));
    }
    let Some(v2) = &p.v2 else {
        return Err(Refusal::Decline(ReasonCode::NOV2EXT));
    };
    if v2.smcd.is_none() {
        return Err(Refusal::Decline(ReasonCode::NOV2DEXT));
    }
    // Emulated devices need the peer to understand 128-bit GIDs.
    let feature_mask = v2.feature_mask & SMC_FEATURE_MASK;
    let loopback = p
        .smcd_v2_devices()
        .into_iter()
        .filter(|d| d.chid == caps.chid && d.gid_ext.is_some())
        .find(|d| expected_gid.is_none_or(|g| gid_join(d.gid, d.gid_ext.unwrap_or(0)) == g));
    let Some(loopback) = loopback.filter(|_| feature_mask != 0) else {
        return Err(Refusal::Decline(ReasonCode::NOSMCD2DEV));
    };
    let peer_gid = gid_join(loopback.gid, loopback.gid_ext.unwrap_or(0));
    let peer_seid = v2.smcd.as_ref().filter(|_| v2.seid).map(|s| &s.system_eid);
    let Some(eid) = match_eid(caps, peer_seid, &v2.user_eids) else {
        return Err(Refusal::Decline(ReasonCode::NOSMCD2DEV));
    };
    Ok(ProposalInfo {
        peer_gid,
        eid,
        release: v2.release.min(RELEASE),
        feature_mask,
        version,
    })
}

/// The Accept a server sends.
pub fn server_accept(
    caps: &LocalCaps,
    info: &ProposalInfo,
    token: u64,
    dmb_len: usize,
    lgr_id: u32,
    first_contact: bool,
) -> AcceptConfirm {
    let body = SmcdAcceptConfirm {
        gid: gid_hi(caps.gid),
        token,
        dmbe_idx: 0,
        dmbe_size: compress_bufsize(dmb_len, SMCD_MAX_BUFSIZE_CODE),
        link_id: lgr_id.to_ne_bytes(),
        chid: caps.chid,
        eid: info.eid,
        gid_ext: gid_lo(caps.gid),
    };
    let fce = first_contact
        .then(|| FirstContactExt::linux_smcd(info.release, caps.hostname, info.feature_mask));
    AcceptConfirm::smcd_v2(body, fce)
}

/// What the server learned from a Confirm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmInfo {
    /// The client's DMB token.
    pub token: u64,
    /// The client's DMB size.
    pub dmb_len: usize,
    /// The client's first contact extension.
    pub fce: Option<FirstContactExt>,
}

/// Checks the client's Confirm against what we accepted. Its link id names the client's own
/// link group and is not checked (the kernel does not either).
pub fn server_check_confirm(
    msg: ClcMessage,
    info: &ProposalInfo,
    first_contact: bool,
) -> Result<ConfirmInfo, Refusal> {
    let c = match msg {
        ClcMessage::Confirm(c) => c,
        ClcMessage::Decline(d) => return Err(Refusal::declined(&d)),
        _ => return Err(Refusal::Decline(ReasonCode::CNFERR)),
    };
    let AcceptConfirmBody::SmcD(d) = c.body else {
        return Err(Refusal::Decline(ReasonCode::MODEUNSUPP));
    };
    if c.version < SMC_V2 || gid_join(d.gid, d.gid_ext) != info.peer_gid {
        return Err(Refusal::Decline(ReasonCode::MODEUNSUPP));
    }
    if c.first_contact != first_contact {
        return Err(Refusal::Decline(ReasonCode::SYNCERR));
    }
    if d.dmbe_size > SMCD_MAX_BUFSIZE_CODE {
        return Err(Refusal::Decline(ReasonCode::CNFERR));
    }
    if let Some(fce) = &c.fce {
        // smc_clc_v2x_features_confirm_check: the release must be echoed.
        if fce.release != info.release {
            return Err(Refusal::Decline(ReasonCode::RELEASEERR));
        }
    }
    Ok(ConfirmInfo {
        token: d.token,
        dmb_len: uncompress_bufsize(d.dmbe_size),
        fce: c.fce,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use smc_proto::clc::Decline;

    fn caps(gid: Gid) -> LocalCaps {
        LocalCaps {
            gid,
            chid: 0xffff,
            seid: Eid::new("SMCD-USERSPACE-SEID-0123456789AB"),
            ueids: vec![],
            hostname: Hostname::new("host"),
        }
    }

    fn reparse(m: ClcMessage) -> ClcMessage {
        ClcMessage::parse(&m.to_vec()).expect("own messages parse")
    }

    #[test]
    fn full_exchange_first_contact() {
        let (c, s) = (
            caps(0x1111_2222_3333_4444_5555_6666_7777_8888),
            caps(0x9999 << 64 | 7),
        );
        let prop = reparse(client_proposal(&c).into());
        let info = server_check_proposal(prop, &s, c.gid).unwrap();
        assert_eq!(info.release, RELEASE);
        assert_eq!(info.eid, c.seid.unwrap());
        let acc = server_accept(&s, &info, 0xabc, 65536, 0x100, true);
        let acc = reparse(ClcMessage::Accept(acc));
        let ai = client_check_accept(acc, &c, Some(s.gid)).unwrap();
        assert_eq!(ai.peer_gid, s.gid);
        assert_eq!(ai.token, 0xabc);
        assert_eq!(ai.dmb_len, 65536);
        assert_eq!(ai.lgr_id, 0x100);
        assert!(ai.first_contact);
        let conf = reparse(ClcMessage::Confirm(client_confirm(
            &c, &ai, 0x700, 0xdef, 16384,
        )));
        let ci = server_check_confirm(conf, &info, true).unwrap();
        assert_eq!(ci.token, 0xdef);
        assert_eq!(ci.dmb_len, 16384);
    }

    #[test]
    fn eid_mismatch_declines() {
        let c = caps(1 << 64 | 1);
        let mut s = caps(2 << 64 | 2);
        s.seid = Eid::new("OTHER");
        let prop = reparse(client_proposal(&c).into());
        assert_eq!(
            server_check_proposal(prop, &s, c.gid).unwrap_err(),
            Refusal::Decline(ReasonCode::NOSMCD2DEV)
        );
        // A shared user EID rescues it.
        let mut c = c;
        let ueid = Eid::new("SHARED.EID").unwrap();
        c.ueids.push(ueid);
        s.ueids.push(ueid);
        let prop = reparse(client_proposal(&c).into());
        assert_eq!(server_check_proposal(prop, &s, c.gid).unwrap().eid, ueid);
    }

    /// A client announced by the SMC TCP option only: its GID is the one its Proposal offers.
    #[test]
    fn unannounced_client_gid_comes_from_the_proposal() {
        let (c, s) = (caps(0x1234 << 64 | 0x5678), caps(2 << 64 | 2));
        let prop = reparse(client_proposal(&c).into());
        let info = server_check_proposal(prop, &s, None).unwrap();
        assert_eq!(info.peer_gid, c.gid);
    }

    #[test]
    fn wrong_gid_and_declines() {
        let (c, s) = (caps(1 << 64 | 1), caps(2 << 64 | 2));
        let prop = reparse(client_proposal(&c).into());
        assert_eq!(
            server_check_proposal(prop, &s, 5).unwrap_err(),
            Refusal::Decline(ReasonCode::NOSMCD2DEV)
        );
        let d = ClcMessage::Decline(Decline::new(ReasonCode::MEM, 2));
        assert_eq!(
            client_check_accept(d, &c, None).unwrap_err(),
            Refusal::PeerDeclined {
                peer: ReasonCode::MEM,
                out_of_sync: false
            }
        );
        assert_eq!(
            Refusal::PeerDeclined {
                peer: ReasonCode::MEM,
                out_of_sync: false
            }
            .reasons(),
            (ReasonCode::PEERDECL, ReasonCode::MEM)
        );
    }

    #[test]
    fn confirm_must_agree_on_first_contact() {
        let (c, s) = (caps(1 << 64 | 1), caps(2 << 64 | 2));
        let info = server_check_proposal(reparse(client_proposal(&c).into()), &s, c.gid).unwrap();
        let acc = server_accept(&s, &info, 1, 65536, 0x200, false);
        let ai = client_check_accept(reparse(ClcMessage::Accept(acc)), &c, None).unwrap();
        assert_eq!(ai.lgr_id, 0x200);
        let conf = reparse(ClcMessage::Confirm(client_confirm(
            &c, &ai, 0x300, 2, 65536,
        )));
        assert_eq!(
            server_check_confirm(conf, &info, true).unwrap_err(),
            Refusal::Decline(ReasonCode::SYNCERR)
        );
    }
}
