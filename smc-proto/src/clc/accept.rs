//! CLC Accept (server → client) and Confirm (client → server), v1 and v2, SMC-R and SMC-D:
//! `struct smc_clc_msg_accept_confirm`, `smc_clc_first_contact_ext[_v2x]` and
//! `smc_clc_fce_gid_ext` in `net/smc/smc_clc.h`; lengths and builders of
//! `smc_clc_msg_acc_conf_valid()` and `smc[rd]_clc_prep_confirm_accept()` in `smc_clc.c`.
//!
//! Both messages share one layout; the header's type says which it is.
//!
//! | | SMC-R | SMC-D |
//! |---|---|---|
//! | v1 length | exactly 68 | exactly 48 |
//! | v2 length | ≥ 108 | ≥ 78 |
//! | v2 + first contact | + FCE (52) [+ Confirm GID list] | + FCE (52, or 36 at release 0) |
//!
//! Like the kernel, a v2 receiver accepts messages longer than it understands and ignores the
//! excess; unlike the kernel (which then reads the trailer as FCE bytes), a v2 first-contact
//! message too short for the 36-byte FCE is an error.

use super::error::{ClcError, Entries};
use super::header::{
    ClcHeader, ClcType, Eyecatcher, SMC_V1, SMC_V2, SmcType, TRAILER_LEN, emit_frame, len16,
    parse_frame,
};
use super::types::{
    Eid, Hostname, OsType, PeerId, RoceGid, SMC_RELEASE_0, SMC_RELEASE_1, SmcdDevice,
    is_emulated_chid,
};
use crate::wire::{array, be16, be24, be32, be64, put_be16, put_be24, put_be32, put_be64};

/// SMC-R v1 Accept/Confirm length (`SMCR_CLC_ACCEPT_CONFIRM_LEN`).
pub const SMCR_LEN_V1: usize = 68;
/// SMC-D v1 Accept/Confirm length (`SMCD_CLC_ACCEPT_CONFIRM_LEN`).
pub const SMCD_LEN_V1: usize = 48;
/// SMC-R v2 Accept/Confirm base length (`SMCR_CLC_ACCEPT_CONFIRM_LEN_V2`).
pub const SMCR_LEN_V2: usize = 108;
/// SMC-D v2 Accept/Confirm base length (`SMCD_CLC_ACCEPT_CONFIRM_LEN_V2`).
pub const SMCD_LEN_V2: usize = 78;
/// Full first contact extension (`struct smc_clc_first_contact_ext_v2x`).
pub const FCE_LEN: usize = 52;
/// Short first contact extension (`struct smc_clc_first_contact_ext`), sent by Linux for
/// SMC-D at release 0.
pub const FCE_BASE_LEN: usize = 36;
/// Header of the SMC-R Confirm GID list (`struct smc_clc_fce_gid_ext`).
pub const GID_LIST_HDR_LEN: usize = 4;
/// Most GIDs in the SMC-R Confirm GID list (one per link, two links per link group).
pub const MAX_CONFIRM_GIDS: usize = 2;

/// Byte where the v2 part ends and the FCE starts.
const SMCR_FCE_AT: usize = SMCR_LEN_V2 - TRAILER_LEN;
const SMCD_FCE_AT: usize = SMCD_LEN_V2 - TRAILER_LEN;

/// Which of the two messages sharing this layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AcceptOrConfirm {
    /// Type 2.
    Accept,
    /// Type 3.
    Confirm,
}

impl From<AcceptOrConfirm> for ClcType {
    fn from(k: AcceptOrConfirm) -> ClcType {
        match k {
            AcceptOrConfirm::Accept => ClcType::Accept,
            AcceptOrConfirm::Confirm => ClcType::Confirm,
        }
    }
}

/// SMC-R part (`struct smcr_clc_msg_accept_confirm` + v2 `r1`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SmcrAcceptConfirm {
    /// Sender's system id.
    pub peer_id: PeerId,
    /// GID of the sending link.
    pub gid: RoceGid,
    /// MAC of the sending link's port.
    pub mac: [u8; 6],
    /// QP number (24 bits).
    pub qpn: u32,
    /// RMB rkey.
    pub rmb_rkey: u32,
    /// RMBE index, 1-based (Linux always 1).
    pub rmbe_idx: u8,
    /// RMBE alert token = local connection id (never 0).
    pub rmbe_alert_token: u32,
    /// Compressed RMBE size (nibble; see [`compress_bufsize`](super::compress_bufsize)).
    pub rmbe_size: u8,
    /// QP MTU (IB enum, nibble). Accept: own path MTU; Confirm: min(own, peer).
    pub qp_mtu: u8,
    /// RMB DMA/virtual address.
    pub rmb_dma_addr: u64,
    /// Initial PSN (24 bits).
    pub psn: u32,
    /// v2: negotiated EID (zero when none; ignored in v1).
    pub eid: Eid,
    /// v2 Confirm with first contact: the GID list after the FCE (max 2). Linux always sends
    /// it there; it never appears in an Accept.
    pub gid_list: Option<Vec<RoceGid>>,
}

/// SMC-D part (`struct smcd_clc_msg_accept_confirm_common` + v2 `d1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmcdAcceptConfirm {
    /// Sender's ISM GID.
    pub gid: u64,
    /// Token of the sender's DMB.
    pub token: u64,
    /// DMBE index, 0-based (Linux 0).
    pub dmbe_idx: u8,
    /// Compressed DMB size (nibble); the whole DMB, including the 32-byte CDC header.
    pub dmbe_size: u8,
    /// Link id: the 4-byte link group id, opaque (Linux copies its `lgr->id` bytes).
    pub link_id: [u8; 4],
    /// v2: CHID of the chosen device (12 reserved bytes in v1 start here).
    pub chid: u16,
    /// v2: negotiated EID.
    pub eid: Eid,
    /// v2: upper 64 bits of an emulated device's 128-bit GID (0 otherwise).
    pub gid_ext: u64,
}

impl SmcdAcceptConfirm {
    /// The sender's device as (gid, gid_ext, chid): `gid_ext` is `Some` for an emulated CHID.
    pub fn device(&self) -> SmcdDevice {
        SmcdDevice {
            gid: self.gid,
            gid_ext: is_emulated_chid(self.chid).then_some(self.gid_ext),
            chid: self.chid,
        }
    }
}

/// The SMC-R or SMC-D body (`typev1` R or D).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcceptConfirmBody {
    /// `typev1` = R, SMCR eyecatchers.
    SmcR(SmcrAcceptConfirm),
    /// `typev1` = D, SMCD eyecatchers.
    SmcD(SmcdAcceptConfirm),
}

/// The v2.1 tail of the first contact extension (bytes 36-51).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FceV2x {
    /// SMC-R: max connections per link group (0 for SMC-D).
    pub max_conns: u8,
    /// SMC-R: max links per link group (0 for SMC-D).
    pub max_links: u8,
    /// Supplemental features (Accept: what the server supports; Confirm: the common set).
    pub feature_mask: u16,
    /// Vendor experimental options.
    pub vendor_options: [u8; 4],
}

/// First Contact Extension: v2 Accept/Confirm with the first-contact bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FirstContactExt {
    /// SMC-R v2: the peer is reachable without a gateway (bit 7 of byte 0).
    pub v2_direct: bool,
    /// Sender's OS.
    pub os_type: OsType,
    /// SMC release (nibble).
    pub release: u8,
    /// Sender's hostname.
    pub hostname: Hostname,
    /// Bytes 36-51; `None` for the 36-byte form (SMC-D at release 0).
    pub v2x: Option<FceV2x>,
}

impl FirstContactExt {
    /// What Linux sends for SMC-D: OS Linux, the given release; at release 0 the 36-byte form,
    /// otherwise the 52-byte form with `feature_mask` (max_conns/max_links 0).
    pub fn linux_smcd(release: u8, hostname: Hostname, feature_mask: u16) -> Self {
        FirstContactExt {
            v2_direct: false,
            os_type: OsType::Linux,
            release,
            hostname,
            v2x: (release > SMC_RELEASE_0).then_some(FceV2x {
                feature_mask,
                ..FceV2x::default()
            }),
        }
    }

    /// What Linux sends for SMC-R: always the 52-byte form; `max_conns`, `max_links` and
    /// `feature_mask` are filled only from release 1 on.
    pub fn linux_smcr(
        release: u8,
        hostname: Hostname,
        v2_direct: bool,
        max_conns: u8,
        max_links: u8,
        feature_mask: u16,
    ) -> Self {
        let v2x = if release >= SMC_RELEASE_1 {
            FceV2x {
                max_conns,
                max_links,
                feature_mask,
                vendor_options: [0; 4],
            }
        } else {
            FceV2x::default()
        };
        FirstContactExt {
            v2_direct,
            os_type: OsType::Linux,
            release,
            hostname,
            v2x: Some(v2x),
        }
    }

    fn wire_len(&self) -> usize {
        if self.v2x.is_some() {
            FCE_LEN
        } else {
            FCE_BASE_LEN
        }
    }
}

/// A CLC Accept or Confirm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptConfirm {
    /// Negotiated version (1, or 2 and above for the v2 layout).
    pub version: u8,
    /// First contact (header bit 0x08): a new link group.
    pub first_contact: bool,
    /// SMC-R or SMC-D fields.
    pub body: AcceptConfirmBody,
    /// Present exactly when `version >= 2` and `first_contact`.
    pub fce: Option<FirstContactExt>,
}

impl AcceptConfirm {
    /// SMC-D v2 Accept/Confirm; first contact when `fce` is given.
    pub fn smcd_v2(body: SmcdAcceptConfirm, fce: Option<FirstContactExt>) -> Self {
        AcceptConfirm {
            version: SMC_V2,
            first_contact: fce.is_some(),
            body: AcceptConfirmBody::SmcD(body),
            fce,
        }
    }

    /// SMC-D v1 Accept/Confirm (the v2-only fields of `body` must be zero).
    pub fn smcd_v1(body: SmcdAcceptConfirm, first_contact: bool) -> Self {
        AcceptConfirm {
            version: SMC_V1,
            first_contact,
            body: AcceptConfirmBody::SmcD(body),
            fce: None,
        }
    }

    /// SMC-R Accept/Confirm of `version`; first contact when `fce` is given in v2.
    pub fn smcr(
        version: u8,
        first_contact: bool,
        body: SmcrAcceptConfirm,
        fce: Option<FirstContactExt>,
    ) -> Self {
        AcceptConfirm {
            version,
            first_contact,
            body: AcceptConfirmBody::SmcR(body),
            fce,
        }
    }

    /// `typev1` of this message.
    pub fn smc_type(&self) -> SmcType {
        match self.body {
            AcceptConfirmBody::SmcR(_) => SmcType::R,
            AcceptConfirmBody::SmcD(_) => SmcType::D,
        }
    }

    fn is_v2(&self) -> bool {
        self.version >= SMC_V2
    }

    /// Parses a complete Accept or Confirm (`buf` is exactly the message).
    pub fn parse(buf: &[u8]) -> Result<(AcceptOrConfirm, AcceptConfirm), ClcError> {
        let (hdr, len) = parse_frame(buf)?;
        let kind = match hdr.msg_type {
            ClcType::Accept => AcceptOrConfirm::Accept,
            ClcType::Confirm => AcceptOrConfirm::Confirm,
            t => return Err(ClcError::UnknownType(t.into())),
        };
        Ok((kind, Self::parse_body(buf, &hdr, len, kind)?))
    }

    pub(crate) fn parse_body(
        buf: &[u8],
        hdr: &ClcHeader,
        len: usize,
        kind: AcceptOrConfirm,
    ) -> Result<AcceptConfirm, ClcError> {
        let v2 = hdr.is_v2();
        let first_contact = hdr.flag();
        let end = len - TRAILER_LEN;
        let (mut body, fce_at) = match hdr.typev1 {
            SmcType::R => {
                let mut r = SmcrAcceptConfirm {
                    peer_id: array(buf, 8),
                    gid: array(buf, 16),
                    mac: array(buf, 32),
                    qpn: be24(buf, 38),
                    rmb_rkey: be32(buf, 41),
                    rmbe_idx: buf[45],
                    rmbe_alert_token: be32(buf, 46),
                    rmbe_size: buf[50] >> 4,
                    qp_mtu: buf[50] & 0x0f,
                    rmb_dma_addr: be64(buf, 52),
                    psn: be24(buf, 61),
                    ..SmcrAcceptConfirm::default()
                };
                if v2 {
                    r.eid = Eid(array(buf, 64));
                }
                (AcceptConfirmBody::SmcR(r), SMCR_FCE_AT)
            }
            SmcType::D => {
                let mut d = SmcdAcceptConfirm {
                    gid: be64(buf, 8),
                    token: be64(buf, 16),
                    dmbe_idx: buf[24],
                    dmbe_size: buf[25] >> 4,
                    link_id: array(buf, 28),
                    ..SmcdAcceptConfirm::default()
                };
                if v2 {
                    d.chid = be16(buf, 32);
                    d.eid = Eid(array(buf, 34));
                    d.gid_ext = be64(buf, 66);
                }
                (AcceptConfirmBody::SmcD(d), SMCD_FCE_AT)
            }
            // parse_frame's length rule already refused these.
            typev1 => {
                return Err(ClcError::BadSmcType {
                    msg: kind.into(),
                    typev1,
                });
            }
        };
        let mut fce = None;
        if v2 && first_contact {
            let room = end - fce_at;
            if room < FCE_BASE_LEN {
                return Err(ClcError::MissingFirstContactExt {
                    msg: kind.into(),
                    room,
                });
            }
            let f = parse_fce(buf, fce_at, room >= FCE_LEN);
            let after = fce_at + f.wire_len();
            // The GID list follows only the full FCE of an SMC-R Confirm (Linux builds it only
            // there); anything else after the FCE is future extension and ignored.
            if let (AcceptConfirmBody::SmcR(r), AcceptOrConfirm::Confirm, Some(_)) =
                (&mut body, kind, f.v2x)
                && end - after >= GID_LIST_HDR_LEN
            {
                r.gid_list = Some(parse_gid_list(buf, after, end, len)?);
            }
            fce = Some(f);
        }
        Ok(AcceptConfirm {
            version: hdr.version,
            first_contact,
            body,
            fce,
        })
    }

    /// Checks that the value emits as a message that parses back to itself: version 1-15,
    /// FCE present exactly for v2 first contact, nibbles and 24-bit fields in range, v2-only
    /// fields zero in v1, GID list only in an SMC-R v2 Confirm after a full FCE, max 2 GIDs.
    pub fn validate(&self, kind: AcceptOrConfirm) -> Result<(), ClcError> {
        if self.version < SMC_V1 || self.version > 15 {
            return Err(ClcError::BadVersion(self.version));
        }
        let want_fce = self.is_v2() && self.first_contact;
        if self.fce.is_some() != want_fce {
            return Err(ClcError::Inconsistent(
                "the first contact extension is present exactly in v2 first-contact messages",
            ));
        }
        if self.fce.is_some_and(|f| f.release > 15) {
            return Err(ClcError::Inconsistent("FCE release must fit in a nibble"));
        }
        match &self.body {
            AcceptConfirmBody::SmcR(r) => {
                if r.rmbe_size > 15 || r.qp_mtu > 15 {
                    return Err(ClcError::Inconsistent(
                        "rmbe_size and qp_mtu must fit in a nibble",
                    ));
                }
                if r.qpn > 0x00ff_ffff || r.psn > 0x00ff_ffff {
                    return Err(ClcError::Inconsistent("qpn and psn are 24-bit"));
                }
                if !self.is_v2() && !r.eid.is_zero() {
                    return Err(ClcError::Inconsistent("a v1 SMC-R message has no EID"));
                }
                if let Some(gids) = &r.gid_list {
                    if kind != AcceptOrConfirm::Confirm || self.fce.and_then(|f| f.v2x).is_none() {
                        return Err(ClcError::Inconsistent(
                            "the GID list only follows the 52-byte FCE of a v2 SMC-R Confirm",
                        ));
                    }
                    if gids.len() > MAX_CONFIRM_GIDS {
                        return Err(ClcError::TooMany {
                            what: Entries::ConfirmGids,
                            count: gids.len(),
                            max: MAX_CONFIRM_GIDS,
                        });
                    }
                }
            }
            AcceptConfirmBody::SmcD(d) => {
                if d.dmbe_size > 15 {
                    return Err(ClcError::Inconsistent("dmbe_size must fit in a nibble"));
                }
                if !self.is_v2() && (d.chid != 0 || !d.eid.is_zero() || d.gid_ext != 0) {
                    return Err(ClcError::Inconsistent(
                        "a v1 SMC-D message has no CHID, EID or gid_ext",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Total length of the emitted message.
    pub fn buffer_len(&self) -> usize {
        let (base_v1, base_v2) = match self.body {
            AcceptConfirmBody::SmcR(_) => (SMCR_LEN_V1, SMCR_LEN_V2),
            AcceptConfirmBody::SmcD(_) => (SMCD_LEN_V1, SMCD_LEN_V2),
        };
        if !self.is_v2() {
            return base_v1;
        }
        let gids = match &self.body {
            AcceptConfirmBody::SmcR(r) => r
                .gid_list
                .as_ref()
                .map_or(0, |g| GID_LIST_HDR_LEN + 16 * g.len()),
            AcceptConfirmBody::SmcD(_) => 0,
        };
        base_v2 + self.fce.map_or(0, |f| f.wire_len()) + gids
    }

    /// Writes the message into `buf[..self.buffer_len()]`: SMCR eyecatchers for SMC-R, SMCD
    /// for SMC-D, first-contact bit from `first_contact`. In v1 the v2-only fields are not
    /// written. Call [`validate`](Self::validate) first for hand-built values.
    ///
    /// # Panics
    /// If `buf` is shorter than [`buffer_len`](Self::buffer_len).
    pub fn emit(&self, kind: AcceptOrConfirm, buf: &mut [u8]) {
        let total = self.buffer_len();
        let buf = &mut buf[..total];
        buf.fill(0);
        let (eyecatcher, fce_at) = match self.body {
            AcceptConfirmBody::SmcR(_) => (Eyecatcher::Smcr, SMCR_FCE_AT),
            AcceptConfirmBody::SmcD(_) => (Eyecatcher::Smcd, SMCD_FCE_AT),
        };
        emit_frame(
            buf,
            &ClcHeader {
                eyecatcher,
                msg_type: kind.into(),
                length: len16(total),
                version: self.version,
                typev2: if self.first_contact {
                    SmcType::None // 0b10: SMC_FIRST_CONTACT_MASK
                } else {
                    SmcType::R
                },
                typev1: self.smc_type(),
            },
            total,
        );
        let v2 = self.is_v2();
        match &self.body {
            AcceptConfirmBody::SmcR(r) => {
                buf[8..16].copy_from_slice(&r.peer_id);
                buf[16..32].copy_from_slice(&r.gid);
                buf[32..38].copy_from_slice(&r.mac);
                put_be24(buf, 38, r.qpn);
                put_be32(buf, 41, r.rmb_rkey);
                buf[45] = r.rmbe_idx;
                put_be32(buf, 46, r.rmbe_alert_token);
                buf[50] = (r.rmbe_size << 4) | (r.qp_mtu & 0x0f);
                put_be64(buf, 52, r.rmb_dma_addr);
                put_be24(buf, 61, r.psn);
                if v2 {
                    buf[64..96].copy_from_slice(&r.eid.0);
                }
            }
            AcceptConfirmBody::SmcD(d) => {
                put_be64(buf, 8, d.gid);
                put_be64(buf, 16, d.token);
                buf[24] = d.dmbe_idx;
                buf[25] = d.dmbe_size << 4;
                buf[28..32].copy_from_slice(&d.link_id);
                if v2 {
                    put_be16(buf, 32, d.chid);
                    buf[34..66].copy_from_slice(&d.eid.0);
                    put_be64(buf, 66, d.gid_ext);
                }
            }
        }
        if !v2 {
            return;
        }
        let mut at = fce_at;
        if let Some(f) = &self.fce {
            buf[at] = u8::from(f.v2_direct) << 7;
            buf[at + 1] = (f.os_type.nibble() << 4) | (f.release & 0x0f);
            buf[at + 4..at + 36].copy_from_slice(&f.hostname.0);
            if let Some(x) = &f.v2x {
                buf[at + 36] = x.max_conns;
                buf[at + 37] = x.max_links;
                put_be16(buf, at + 38, x.feature_mask);
                buf[at + 40..at + 44].copy_from_slice(&x.vendor_options);
            }
            at += f.wire_len();
        }
        if let AcceptConfirmBody::SmcR(SmcrAcceptConfirm {
            gid_list: Some(gids),
            ..
        }) = &self.body
        {
            buf[at] = gids.len() as u8;
            at += GID_LIST_HDR_LEN;
            for g in gids {
                buf[at..at + 16].copy_from_slice(g);
                at += 16;
            }
        }
    }

    /// The message as a new vector.
    pub fn to_vec(&self, kind: AcceptOrConfirm) -> Vec<u8> {
        let mut v = vec![0; self.buffer_len()];
        self.emit(kind, &mut v);
        v
    }
}

fn parse_fce(buf: &[u8], at: usize, full: bool) -> FirstContactExt {
    FirstContactExt {
        v2_direct: buf[at] & 0x80 != 0,
        os_type: OsType::from_nibble(buf[at + 1] >> 4),
        release: buf[at + 1] & 0x0f,
        hostname: Hostname(array(buf, at + 4)),
        v2x: full.then(|| FceV2x {
            max_conns: buf[at + 36],
            max_links: buf[at + 37],
            feature_mask: be16(buf, at + 38),
            vendor_options: array(buf, at + 40),
        }),
    }
}

fn parse_gid_list(buf: &[u8], at: usize, end: usize, len: usize) -> Result<Vec<RoceGid>, ClcError> {
    let count = usize::from(buf[at]);
    if count > MAX_CONFIRM_GIDS {
        return Err(ClcError::TooMany {
            what: Entries::ConfirmGids,
            count,
            max: MAX_CONFIRM_GIDS,
        });
    }
    let list_end = at + GID_LIST_HDR_LEN + 16 * count;
    if list_end > end {
        return Err(ClcError::TooShort {
            msg: ClcType::Confirm,
            len,
            min: list_end + TRAILER_LEN,
        });
    }
    Ok((0..count)
        .map(|i| array(buf, at + GID_LIST_HDR_LEN + 16 * i))
        .collect())
}
