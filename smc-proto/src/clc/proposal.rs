//! The CLC Proposal (client → server), v1 and v2, for SMC-R, SMC-D and both: `struct
//! smc_clc_msg_proposal` and the areas that follow it (`smc_clc_msg_smcd`,
//! `smc_clc_msg_proposal_prefix`, `smc_clc_v2_extension`, `smc_clc_smcd_v2_extension`) in
//! `net/smc/smc_clc.h`; validity rules of `smc_clc_msg_prop_valid()` in `smc_clc.c`.
//!
//! Parsing follows the three offsets the peer sent rather than assuming Linux's order, and
//! rejects offsets the kernel rejects (zero where an area is required, above the kernel's
//! limits of 40 / 172 / 288) or whose area would run into the trailer. The total length must
//! equal the sum of the parts, exactly as the kernel computes it. Emitting always writes
//! Linux's order with offsets computed from the parts.

use core::net::{Ipv4Addr, Ipv6Addr};

use super::error::{ClcError, Entries, OffsetField};
use super::header::{
    ClcHeader, ClcType, Eyecatcher, HEADER_LEN, SMC_V1, SMC_V2, SmcType, TRAILER_LEN, emit_frame,
    len16, parse_frame,
};
use super::types::{
    Eid, PeerId, RoceGid, SMC_FEATURE_MASK, SMC_RELEASE_1, SmcdDevice, is_emulated_chid,
};
use crate::wire::{array, be16, be64, put_be16, put_be64};

/// Fixed base: header, peer id, GID, MAC, `iparea_offset`.
pub const PROPOSAL_BASE_LEN: usize = 40;
/// SMC-D area (`struct smc_clc_msg_smcd`).
pub const SMCD_AREA_LEN: usize = 40;
/// IP prefix area header (`struct smc_clc_msg_proposal_prefix`).
pub const IP_AREA_LEN: usize = 8;
/// One IPv6 prefix entry (`struct smc_clc_ipv6_prefix`, packed).
pub const IPV6_PREFIX_LEN: usize = 17;
/// Fixed part of the v2 extension (`struct smc_clc_v2_extension_fixed`).
pub const V2_EXT_LEN: usize = 40;
/// Fixed part of the SMC-Dv2 extension (`struct smc_clc_smcd_v2_extension_fixed`).
pub const SMCD_V2_EXT_LEN: usize = 48;
/// One GID/CHID entry (`struct smc_clc_smcd_gid_chid`, packed).
pub const GID_CHID_LEN: usize = 10;
/// `SMC_CLC_MAX_V6_PREFIX`.
pub const MAX_IPV6_PREFIXES: usize = 8;
/// `SMC_CLC_MAX_UEID`.
pub const MAX_USER_EIDS: usize = 8;
/// `SMCD_CLC_MAX_V2_GID_ENTRIES` (an emulated device takes two).
pub const MAX_ISM_GID_ENTRIES: usize = 8;
/// Shortest v1 Proposal: base, no SMC-D area, IPv4 prefix area, trailer.
pub const MIN_PROPOSAL_V1_LEN: usize = PROPOSAL_BASE_LEN + IP_AREA_LEN + TRAILER_LEN;
/// Longest v1 Proposal: base, SMC-D area, 8 IPv6 prefixes, trailer.
pub const MAX_PROPOSAL_V1_LEN: usize = PROPOSAL_BASE_LEN
    + SMCD_AREA_LEN
    + IP_AREA_LEN
    + MAX_IPV6_PREFIXES * IPV6_PREFIX_LEN
    + TRAILER_LEN;
/// Shortest v2 Proposal: base, SMC-D area, trailer (typev1 = typev2 = N).
pub const MIN_PROPOSAL_V2_LEN: usize = PROPOSAL_BASE_LEN + SMCD_AREA_LEN + TRAILER_LEN;

/// `v2_ext_offset` counts from the byte after itself: proposal offset 52.
const V2_EXT_OFFSET_BASE: usize = PROPOSAL_BASE_LEN + 12;
/// Kernel limit on `v2_ext_offset` (`smc_get_clc_v2_ext()`): 28 + 8 + 8 × 17.
const MAX_V2_EXT_OFFSET: u16 = (SMCD_AREA_LEN - 12 + IP_AREA_LEN + 8 * IPV6_PREFIX_LEN) as u16;
/// Kernel limit on `smcd_v2_ext_offset` (`smc_get_clc_smcd_v2_ext()`): 32 + 8 × 32.
const MAX_SMCD_V2_EXT_OFFSET: u16 = (V2_EXT_LEN - 8 + MAX_USER_EIDS * 32) as u16;

/// The SMC-D area (`struct smc_clc_msg_smcd`) minus its offset field, which is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProposalSmcd {
    /// Native ISM GID (filled by Linux only when SMC-D is in `typev1`).
    pub gid: u64,
    /// Native ISM CHID; a server treats a non-zero CHID as "native device offered".
    pub chid: u16,
    /// Vendor OUI.
    pub vendor_oui: [u8; 3],
    /// Vendor experimental options.
    pub vendor_options: [u8; 5],
}

/// One IPv6 prefix of the IP prefix area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Prefix {
    /// Prefix (address with host bits cleared).
    pub prefix: Ipv6Addr,
    /// Prefix length in bits.
    pub prefix_len: u8,
}

/// The IP prefix area (`struct smc_clc_msg_proposal_prefix` + IPv6 entries): what the server
/// compares with its own interface to decide whether v1 is possible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpPrefixArea {
    /// IPv4 subnet (address & mask) for IPv4 connections, else 0.0.0.0.
    pub ipv4_subnet: Ipv4Addr,
    /// IPv4 prefix length.
    pub ipv4_prefix_len: u8,
    /// IPv6 prefixes (max 8); empty for IPv4 connections.
    pub ipv6_prefixes: Vec<Ipv6Prefix>,
}

impl Default for IpPrefixArea {
    fn default() -> Self {
        IpPrefixArea {
            ipv4_subnet: Ipv4Addr::UNSPECIFIED,
            ipv4_prefix_len: 0,
            ipv6_prefixes: Vec::new(),
        }
    }
}

impl IpPrefixArea {
    /// An IPv4 area.
    pub fn ipv4(subnet: Ipv4Addr, prefix_len: u8) -> Self {
        IpPrefixArea {
            ipv4_subnet: subnet,
            ipv4_prefix_len: prefix_len,
            ipv6_prefixes: Vec::new(),
        }
    }

    fn wire_len(&self) -> usize {
        IP_AREA_LEN + self.ipv6_prefixes.len() * IPV6_PREFIX_LEN
    }
}

/// One GID/CHID entry of the SMC-Dv2 extension, as on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct GidChid {
    /// GID, or `gid_ext` in the second entry of an emulated device.
    pub gid: u64,
    /// CHID.
    pub chid: u16,
}

/// The SMC-Dv2 extension (`struct smc_clc_smcd_v2_extension`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SmcdV2Ext {
    /// System EID (copied by Linux only when the SEID flag is set).
    pub system_eid: Eid,
    /// GID/CHID entries, max 8. The native device of the SMC-D area is not repeated here.
    pub entries: Vec<GidChid>,
}

impl SmcdV2Ext {
    /// Appends a device the way `smc_clc_send_proposal()` does: one entry, or two for an
    /// emulated CHID (gid, then `gid_ext` — 0 if the device has none).
    pub fn push_device(&mut self, dev: SmcdDevice) {
        self.entries.push(GidChid {
            gid: dev.gid,
            chid: dev.chid,
        });
        if dev.is_emulated() {
            self.entries.push(GidChid {
                gid: dev.gid_ext.unwrap_or(0),
                chid: dev.chid,
            });
        }
    }

    /// The devices these entries describe, paired as the kernel's server does
    /// (`smc_find_ism_v2_device_serv()`): an emulated CHID takes the next entry as `gid_ext`
    /// if that entry has the same CHID; otherwise the lone emulated entry is skipped.
    pub fn devices(&self) -> Vec<SmcdDevice> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.entries.len() {
            let e = self.entries[i];
            if is_emulated_chid(e.chid) {
                match self.entries.get(i + 1) {
                    Some(next) if next.chid == e.chid => {
                        out.push(SmcdDevice {
                            gid: e.gid,
                            gid_ext: Some(next.gid),
                            chid: e.chid,
                        });
                        i += 2;
                    }
                    _ => i += 1,
                }
            } else {
                out.push(SmcdDevice {
                    gid: e.gid,
                    gid_ext: None,
                    chid: e.chid,
                });
                i += 1;
            }
        }
        out
    }

    fn wire_len(&self) -> usize {
        SMCD_V2_EXT_LEN + self.entries.len() * GID_CHID_LEN
    }
}

/// The v2 extension (`struct smc_clc_v2_extension`), present when `typev2` is not N.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProposalV2Ext {
    /// SMC release (high nibble of byte 3); Linux sends [`SMC_RELEASE_1`].
    pub release: u8,
    /// SEID flag (bit 0 of byte 3): the system EID is valid.
    pub seid: bool,
    /// RoCEv2 GID (SMC-R v2).
    pub roce_gid: RoceGid,
    /// SMC-R v2.1: max connections per link group (Linux: `smcr_max_conns_per_lgr`).
    pub max_conns: u8,
    /// SMC-R v2.1: max links per link group (Linux: `smcr_max_links_per_lgr`).
    pub max_links: u8,
    /// Supplemental features; Linux sends [`SMC_FEATURE_MASK`].
    pub feature_mask: u16,
    /// User EIDs, max 8.
    pub user_eids: Vec<Eid>,
    /// SMC-Dv2 extension; present exactly when `typev2` indicates SMC-D.
    pub smcd: Option<SmcdV2Ext>,
}

impl Default for ProposalV2Ext {
    /// What Linux fills in before adding devices: release 1, feature mask 1, nothing else.
    fn default() -> Self {
        ProposalV2Ext {
            release: SMC_RELEASE_1,
            seid: false,
            roce_gid: [0; 16],
            max_conns: 0,
            max_links: 0,
            feature_mask: SMC_FEATURE_MASK,
            user_eids: Vec::new(),
            smcd: None,
        }
    }
}

impl ProposalV2Ext {
    fn fixed_and_eids_len(&self) -> usize {
        V2_EXT_LEN + self.user_eids.len() * 32
    }
}

/// A CLC Proposal.
///
/// Which parts exist follows the header: a v2 Proposal always has the SMC-D area, has the IP
/// prefix area exactly when `typev1` is not N, the v2 extension exactly when `typev2` is not N,
/// and the SMC-Dv2 extension exactly when `typev2` indicates SMC-D. A v1 Proposal always has
/// the IP area (`typev1` ≠ N), and the SMC-D area only when `iparea_offset` was 40 (old SMC-R
/// v1 peers send 0). [`validate`](Self::validate) checks this; [`ProposalBuilder`] builds
/// valid values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// Header version; Linux always sends 2, even when it offers only v1 capabilities.
    pub version: u8,
    /// v1 capabilities.
    pub typev1: SmcType,
    /// v2 capabilities (ignored by the v1 layout; kept as received).
    pub typev2: SmcType,
    /// SMC-R system id (filled by Linux only when SMC-R is in `typev1`).
    pub peer_id: PeerId,
    /// RoCE GID for SMC-R v1.
    pub ib_gid: RoceGid,
    /// MAC of the RoCE port.
    pub ib_mac: [u8; 6],
    /// SMC-D area.
    pub smcd: Option<ProposalSmcd>,
    /// IP prefix area.
    pub ip_prefix: Option<IpPrefixArea>,
    /// v2 extension.
    pub v2: Option<ProposalV2Ext>,
}

impl Proposal {
    /// Parses a complete Proposal (`buf` is exactly the message).
    pub fn parse(buf: &[u8]) -> Result<Proposal, ClcError> {
        let (hdr, len) = parse_frame(buf)?;
        if hdr.msg_type != ClcType::Proposal {
            return Err(ClcError::UnknownType(hdr.msg_type.into()));
        }
        Self::parse_body(buf, &hdr, len)
    }

    pub(crate) fn parse_body(
        buf: &[u8],
        hdr: &ClcHeader,
        len: usize,
    ) -> Result<Proposal, ClcError> {
        // Content ends where the trailer starts; no area may reach into it.
        let end = len - TRAILER_LEN;
        let iparea_offset = be16(buf, 38);
        if usize::from(iparea_offset) > SMCD_AREA_LEN {
            return Err(ClcError::BadOffset {
                field: OffsetField::IpArea,
                value: iparea_offset,
            });
        }
        let ip_start = PROPOSAL_BASE_LEN + usize::from(iparea_offset);
        let mut p = Proposal {
            version: hdr.version,
            typev1: hdr.typev1,
            typev2: hdr.typev2,
            peer_id: array(buf, 8),
            ib_gid: array(buf, 16),
            ib_mac: array(buf, 32),
            smcd: None,
            ip_prefix: None,
            v2: None,
        };

        if !hdr.is_v2() {
            if hdr.typev1 == SmcType::None {
                return Err(ClcError::BadSmcType {
                    msg: ClcType::Proposal,
                    typev1: hdr.typev1,
                });
            }
            // v1: len == 40 + iparea_offset + 8 + 17n + 4 (smc_clc_msg_prop_valid).
            let min = ip_start + IP_AREA_LEN + TRAILER_LEN;
            if len < min {
                return Err(ClcError::LengthMismatch {
                    msg: ClcType::Proposal,
                    header: len,
                    expected: min,
                });
            }
            let count = usize::from(buf[ip_start + 7]);
            check_count(Entries::Ipv6Prefixes, count, MAX_IPV6_PREFIXES)?;
            let expected = min + count * IPV6_PREFIX_LEN;
            if len != expected {
                return Err(ClcError::LengthMismatch {
                    msg: ClcType::Proposal,
                    header: len,
                    expected,
                });
            }
            let ip = parse_ip_area(buf, ip_start, end)?;
            // Only an offset of exactly 40 means "SMC-D area present" (smc_get_clc_msg_smcd);
            // bytes of a shorter gap are ignored, as the kernel ignores them.
            if usize::from(iparea_offset) == SMCD_AREA_LEN {
                p.smcd = Some(parse_smcd_area(buf));
            }
            p.ip_prefix = Some(ip);
            return Ok(p);
        }

        // v2: the SMC-D area is always there (the length check below counts it).
        p.smcd = Some(parse_smcd_area(buf));
        let mut expected = PROPOSAL_BASE_LEN + SMCD_AREA_LEN + TRAILER_LEN;
        if hdr.typev1 != SmcType::None {
            // smc_get_clc_msg_smcd() insists on 40 when SMC-D is proposed in v1 terms.
            if hdr.typev1.smcd() && usize::from(iparea_offset) != SMCD_AREA_LEN {
                return Err(ClcError::BadOffset {
                    field: OffsetField::IpArea,
                    value: iparea_offset,
                });
            }
            let ip = parse_ip_area(buf, ip_start, end).map_err(|e| match e {
                ClcError::TooMany { .. } => e,
                _ => ClcError::BadOffset {
                    field: OffsetField::IpArea,
                    value: iparea_offset,
                },
            })?;
            expected += ip.wire_len();
            p.ip_prefix = Some(ip);
        }
        if hdr.typev2 != SmcType::None {
            let v2 = parse_v2_ext(buf, end, hdr.typev2.smcd())?;
            expected += v2.fixed_and_eids_len() + v2.smcd.as_ref().map_or(0, SmcdV2Ext::wire_len);
            p.v2 = Some(v2);
        }
        if len != expected {
            return Err(ClcError::LengthMismatch {
                msg: ClcType::Proposal,
                header: len,
                expected,
            });
        }
        Ok(p)
    }

    /// Checks that the parts agree with the header (see the type docs) and that every count
    /// and nibble fits, so that [`emit`](Self::emit) produces a message that parses back to
    /// `self`.
    pub fn validate(&self) -> Result<(), ClcError> {
        if self.version < SMC_V1 || self.version > 15 {
            return Err(ClcError::BadVersion(self.version));
        }
        if let Some(ip) = &self.ip_prefix {
            check_count(
                Entries::Ipv6Prefixes,
                ip.ipv6_prefixes.len(),
                MAX_IPV6_PREFIXES,
            )?;
        }
        if self.version == SMC_V1 {
            if self.typev1 == SmcType::None {
                return Err(ClcError::BadSmcType {
                    msg: ClcType::Proposal,
                    typev1: self.typev1,
                });
            }
            if self.ip_prefix.is_none() {
                return Err(ClcError::Inconsistent(
                    "a v1 Proposal needs the IP prefix area",
                ));
            }
            if self.v2.is_some() {
                return Err(ClcError::Inconsistent(
                    "a v1 Proposal cannot carry the v2 extension",
                ));
            }
            return Ok(());
        }
        if self.smcd.is_none() {
            return Err(ClcError::Inconsistent(
                "a v2 Proposal always carries the SMC-D area",
            ));
        }
        if self.ip_prefix.is_some() != (self.typev1 != SmcType::None) {
            return Err(ClcError::Inconsistent(
                "a v2 Proposal has the IP prefix area exactly when typev1 is not N",
            ));
        }
        match (&self.v2, self.typev2) {
            (None, SmcType::None) => {}
            (Some(_), SmcType::None) | (None, _) => {
                return Err(ClcError::Inconsistent(
                    "a v2 Proposal has the v2 extension exactly when typev2 is not N",
                ));
            }
            (Some(v2), t) => {
                check_count(Entries::UserEids, v2.user_eids.len(), MAX_USER_EIDS)?;
                if v2.release > 15 {
                    return Err(ClcError::Inconsistent("release must fit in a nibble"));
                }
                if v2.smcd.is_some() != t.smcd() {
                    return Err(ClcError::Inconsistent(
                        "the SMC-Dv2 extension is present exactly when typev2 indicates SMC-D",
                    ));
                }
                if let Some(d) = &v2.smcd {
                    check_count(Entries::IsmGids, d.entries.len(), MAX_ISM_GID_ENTRIES)?;
                }
            }
        }
        Ok(())
    }

    /// Total length of the emitted message.
    pub fn buffer_len(&self) -> usize {
        let v2 = self.v2.as_ref().map_or(0, |v| {
            v.fixed_and_eids_len() + v.smcd.as_ref().map_or(0, SmcdV2Ext::wire_len)
        });
        PROPOSAL_BASE_LEN
            + self.smcd.map_or(0, |_| SMCD_AREA_LEN)
            + self.ip_prefix.as_ref().map_or(0, IpPrefixArea::wire_len)
            + v2
            + TRAILER_LEN
    }

    /// Writes the message into `buf[..self.buffer_len()]` in Linux's order (base, SMC-D area,
    /// IP area, v2 extension, user EIDs, SMC-Dv2 extension, trailer) with SMCR eyecatchers.
    /// Writes the parts that are present; call [`validate`](Self::validate) first for values
    /// that did not come from [`parse`](Self::parse) or [`ProposalBuilder`].
    ///
    /// # Panics
    /// If `buf` is shorter than [`buffer_len`](Self::buffer_len).
    pub fn emit(&self, buf: &mut [u8]) {
        let total = self.buffer_len();
        let buf = &mut buf[..total];
        buf.fill(0);
        emit_frame(
            buf,
            &ClcHeader {
                eyecatcher: Eyecatcher::Smcr,
                msg_type: ClcType::Proposal,
                length: len16(total),
                version: self.version,
                typev2: self.typev2,
                typev1: self.typev1,
            },
            total,
        );
        buf[8..16].copy_from_slice(&self.peer_id);
        buf[16..32].copy_from_slice(&self.ib_gid);
        buf[32..38].copy_from_slice(&self.ib_mac);
        let mut pos = PROPOSAL_BASE_LEN;
        if let Some(smcd) = &self.smcd {
            put_be64(buf, pos, smcd.gid);
            put_be16(buf, pos + 8, smcd.chid);
            buf[pos + 12..pos + 15].copy_from_slice(&smcd.vendor_oui);
            buf[pos + 15..pos + 20].copy_from_slice(&smcd.vendor_options);
            pos += SMCD_AREA_LEN;
        }
        let ip_len = self.ip_prefix.as_ref().map_or(0, IpPrefixArea::wire_len);
        if let Some(ip) = &self.ip_prefix {
            // Linux: iparea_offset = sizeof(smc_clc_msg_smcd) when the IP area follows it.
            if self.smcd.is_some() {
                put_be16(buf, 38, SMCD_AREA_LEN as u16);
            }
            buf[pos..pos + 4].copy_from_slice(&ip.ipv4_subnet.octets());
            buf[pos + 4] = ip.ipv4_prefix_len;
            buf[pos + 7] = ip.ipv6_prefixes.len() as u8;
            let mut at = pos + IP_AREA_LEN;
            for p in &ip.ipv6_prefixes {
                buf[at..at + 16].copy_from_slice(&p.prefix.octets());
                buf[at + 16] = p.prefix_len;
                at += IPV6_PREFIX_LEN;
            }
            pos += ip_len;
        }
        if let Some(v2) = &self.v2 {
            if self.smcd.is_some() {
                let off = (SMCD_AREA_LEN - 12 + ip_len) as u16;
                put_be16(buf, V2_EXT_OFFSET_BASE - 2, off);
            }
            buf[pos] = v2.user_eids.len() as u8;
            buf[pos + 1] = v2.smcd.as_ref().map_or(0, |d| d.entries.len() as u8);
            buf[pos + 3] = (v2.release << 4) | u8::from(v2.seid);
            if v2.smcd.is_some() {
                let off = (V2_EXT_LEN - 8 + v2.user_eids.len() * 32) as u16;
                put_be16(buf, pos + 6, off);
            }
            buf[pos + 8..pos + 24].copy_from_slice(&v2.roce_gid);
            buf[pos + 24] = v2.max_conns;
            buf[pos + 25] = v2.max_links;
            put_be16(buf, pos + 26, v2.feature_mask);
            let mut at = pos + V2_EXT_LEN;
            for eid in &v2.user_eids {
                buf[at..at + 32].copy_from_slice(&eid.0);
                at += 32;
            }
            if let Some(d) = &v2.smcd {
                buf[at..at + 32].copy_from_slice(&d.system_eid.0);
                at += SMCD_V2_EXT_LEN;
                for e in &d.entries {
                    put_be64(buf, at, e.gid);
                    put_be16(buf, at + 8, e.chid);
                    at += GID_CHID_LEN;
                }
            }
        }
    }

    /// The message as a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.buffer_len()];
        self.emit(&mut v);
        v
    }

    /// The SMC-Dv2 devices this Proposal offers, in the order a Linux server tries them: the
    /// native ISM device of the SMC-D area if its CHID is non-zero, then the paired entries of
    /// the SMC-Dv2 extension ([`SmcdV2Ext::devices`]). Empty unless `typev2` indicates SMC-D.
    pub fn smcd_v2_devices(&self) -> Vec<SmcdDevice> {
        let Some(ext) = self.v2.as_ref().and_then(|v| v.smcd.as_ref()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let Some(smcd) = self.smcd.filter(|s| s.chid != 0) {
            out.push(SmcdDevice {
                gid: smcd.gid,
                gid_ext: None,
                chid: smcd.chid,
            });
        }
        out.extend(ext.devices());
        out
    }
}

fn check_count(what: Entries, count: usize, max: usize) -> Result<(), ClcError> {
    if count > max {
        return Err(ClcError::TooMany { what, count, max });
    }
    Ok(())
}

fn parse_smcd_area(buf: &[u8]) -> ProposalSmcd {
    let at = PROPOSAL_BASE_LEN;
    ProposalSmcd {
        gid: be64(buf, at),
        chid: be16(buf, at + 8),
        vendor_oui: array(buf, at + 12),
        vendor_options: array(buf, at + 15),
    }
}

/// The IP area at `start`, which must end by `end`. The caller maps "runs past the end" to
/// the error it wants.
fn parse_ip_area(buf: &[u8], start: usize, end: usize) -> Result<IpPrefixArea, ClcError> {
    let past_end = || ClcError::Truncated {
        need: start + IP_AREA_LEN,
        have: end,
    };
    if start + IP_AREA_LEN > end {
        return Err(past_end());
    }
    let count = usize::from(buf[start + 7]);
    check_count(Entries::Ipv6Prefixes, count, MAX_IPV6_PREFIXES)?;
    let area_end = start + IP_AREA_LEN + count * IPV6_PREFIX_LEN;
    if area_end > end {
        return Err(ClcError::Truncated {
            need: area_end,
            have: end,
        });
    }
    let ipv6_prefixes = (0..count)
        .map(|i| {
            let at = start + IP_AREA_LEN + i * IPV6_PREFIX_LEN;
            Ipv6Prefix {
                prefix: Ipv6Addr::from(array::<16>(buf, at)),
                prefix_len: buf[at + 16],
            }
        })
        .collect();
    Ok(IpPrefixArea {
        ipv4_subnet: Ipv4Addr::from(array::<4>(buf, start)),
        ipv4_prefix_len: buf[start + 4],
        ipv6_prefixes,
    })
}

/// The v2 extension (and, if `smcd`, the SMC-Dv2 extension) via the two offsets.
fn parse_v2_ext(buf: &[u8], end: usize, smcd: bool) -> Result<ProposalV2Ext, ClcError> {
    let off = be16(buf, V2_EXT_OFFSET_BASE - 2);
    let bad = ClcError::BadOffset {
        field: OffsetField::V2Ext,
        value: off,
    };
    if off == 0 || off > MAX_V2_EXT_OFFSET {
        return Err(bad);
    }
    let s = V2_EXT_OFFSET_BASE + usize::from(off);
    if s + V2_EXT_LEN > end {
        return Err(bad);
    }
    let eid_cnt = usize::from(buf[s]);
    check_count(Entries::UserEids, eid_cnt, MAX_USER_EIDS)?;
    let eids_end = s + V2_EXT_LEN + eid_cnt * 32;
    if eids_end > end {
        return Err(bad);
    }
    let user_eids = (0..eid_cnt)
        .map(|i| Eid(array(buf, s + V2_EXT_LEN + i * 32)))
        .collect();
    let mut v2 = ProposalV2Ext {
        release: buf[s + 3] >> 4,
        seid: buf[s + 3] & 0x01 != 0,
        roce_gid: array(buf, s + 8),
        max_conns: buf[s + 24],
        max_links: buf[s + 25],
        feature_mask: be16(buf, s + 26),
        user_eids,
        smcd: None,
    };
    if smcd {
        let gid_cnt = usize::from(buf[s + 1]);
        check_count(Entries::IsmGids, gid_cnt, MAX_ISM_GID_ENTRIES)?;
        let off2 = be16(buf, s + 6);
        let bad2 = ClcError::BadOffset {
            field: OffsetField::SmcdV2Ext,
            value: off2,
        };
        if off2 == 0 || off2 > MAX_SMCD_V2_EXT_OFFSET {
            return Err(bad2);
        }
        let d = s + 8 + usize::from(off2);
        if d + SMCD_V2_EXT_LEN + gid_cnt * GID_CHID_LEN > end {
            return Err(bad2);
        }
        let entries = (0..gid_cnt)
            .map(|i| {
                let at = d + SMCD_V2_EXT_LEN + i * GID_CHID_LEN;
                GidChid {
                    gid: be64(buf, at),
                    chid: be16(buf, at + 8),
                }
            })
            .collect();
        v2.smcd = Some(SmcdV2Ext {
            system_eid: Eid(array(buf, d)),
            entries,
        });
    }
    Ok(v2)
}

/// What a Proposal offers for SMC-R v1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmcrV1Offer {
    /// System id.
    pub peer_id: PeerId,
    /// RoCE GID.
    pub gid: RoceGid,
    /// RoCE port MAC.
    pub mac: [u8; 6],
}

/// What a Proposal offers for SMC-R v2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmcrV2Offer {
    /// RoCEv2 GID.
    pub roce_gid: RoceGid,
    /// Linux: sysctl `smcr_max_conns_per_lgr` (default 255).
    pub max_conns: u8,
    /// Linux: sysctl `smcr_max_links_per_lgr` (default 2).
    pub max_links: u8,
}

/// Builds a Proposal the way `smc_clc_send_proposal()` does: version 2, types derived from
/// what is offered, SMC-D area always present, offsets computed on emit.
///
/// ```
/// use smc_proto::clc::{ProposalBuilder, SmcdDevice, Eid};
/// let p = ProposalBuilder::new()
///     .smcd_v2_device(SmcdDevice::loopback(0x1122_3344_5566_7788, 0x99aa_bbcc_ddee_ff00))
///     .user_eid(Eid::new("SMC-LO-EID").unwrap())
///     .build()
///     .unwrap();
/// assert_eq!(p.to_vec().len(), 224);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ProposalBuilder {
    smcr_v1: Option<SmcrV1Offer>,
    smcd_v1: Option<(u64, u16)>,
    ip_prefix: Option<IpPrefixArea>,
    smcr_v2: Option<SmcrV2Offer>,
    smcd_v2: Vec<SmcdDevice>,
    user_eids: Vec<Eid>,
    system_eid: Option<Eid>,
    release: Option<u8>,
    feature_mask: Option<u16>,
}

impl ProposalBuilder {
    /// Nothing offered yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Shortcut: an SMC-D v2 Proposal offering one loopback-ism device.
    pub fn smcd_v2_loopback(gid: u64, gid_ext: u64) -> Self {
        Self::new().smcd_v2_device(SmcdDevice::loopback(gid, gid_ext))
    }

    /// Offers SMC-R v1 (sets R in `typev1`; needs [`ip_prefix`](Self::ip_prefix)).
    pub fn smcr_v1(mut self, offer: SmcrV1Offer) -> Self {
        self.smcr_v1 = Some(offer);
        self
    }

    /// Offers SMC-D v1 with the native ISM device `gid`/`chid` (sets D in `typev1`; needs
    /// [`ip_prefix`](Self::ip_prefix)). On Linux this device is also the native SMC-Dv2
    /// device.
    pub fn smcd_v1(mut self, gid: u64, chid: u16) -> Self {
        self.smcd_v1 = Some((gid, chid));
        self
    }

    /// The IP prefix area for v1 offers.
    pub fn ip_prefix(mut self, area: IpPrefixArea) -> Self {
        self.ip_prefix = Some(area);
        self
    }

    /// Offers SMC-R v2.
    pub fn smcr_v2(mut self, offer: SmcrV2Offer) -> Self {
        self.smcr_v2 = Some(offer);
        self
    }

    /// Offers an SMC-Dv2 device (sets D in `typev2`); emulated devices take two entries.
    pub fn smcd_v2_device(mut self, dev: SmcdDevice) -> Self {
        self.smcd_v2.push(dev);
        self
    }

    /// Adds a user EID.
    pub fn user_eid(mut self, eid: Eid) -> Self {
        self.user_eids.push(eid);
        self
    }

    /// Sets the system EID and the SEID flag (used only with SMC-D v2).
    pub fn system_eid(mut self, eid: Eid) -> Self {
        self.system_eid = Some(eid);
        self
    }

    /// Overrides the release (default [`SMC_RELEASE_1`]).
    pub fn release(mut self, release: u8) -> Self {
        self.release = Some(release);
        self
    }

    /// Overrides the feature mask (default [`SMC_FEATURE_MASK`]).
    pub fn feature_mask(mut self, mask: u16) -> Self {
        self.feature_mask = Some(mask);
        self
    }

    /// The Proposal, validated.
    pub fn build(self) -> Result<Proposal, ClcError> {
        let typev1 = SmcType::from_flags(self.smcr_v1.is_some(), self.smcd_v1.is_some());
        let typev2 = SmcType::from_flags(self.smcr_v2.is_some(), !self.smcd_v2.is_empty());
        if typev1 != SmcType::None && self.ip_prefix.is_none() {
            return Err(ClcError::Inconsistent(
                "v1 offers need an IP prefix area (Linux falls back to CNFERR or v2-only)",
            ));
        }
        let r1 = self.smcr_v1.unwrap_or_default();
        let (gid, chid) = self.smcd_v1.unwrap_or((0, 0));
        let v2 = (typev2 != SmcType::None).then(|| {
            let r2 = self.smcr_v2.unwrap_or_default();
            let smcd = typev2.smcd().then(|| {
                let mut ext = SmcdV2Ext {
                    system_eid: self.system_eid.unwrap_or_default(),
                    entries: Vec::new(),
                };
                for d in &self.smcd_v2 {
                    ext.push_device(*d);
                }
                ext
            });
            ProposalV2Ext {
                release: self.release.unwrap_or(SMC_RELEASE_1),
                seid: typev2.smcd() && self.system_eid.is_some(),
                roce_gid: r2.roce_gid,
                max_conns: r2.max_conns,
                max_links: r2.max_links,
                feature_mask: self.feature_mask.unwrap_or(SMC_FEATURE_MASK),
                user_eids: self.user_eids,
                smcd,
            }
        });
        let p = Proposal {
            version: SMC_V2,
            typev1,
            typev2,
            peer_id: r1.peer_id,
            ib_gid: r1.gid,
            ib_mac: r1.mac,
            smcd: Some(ProposalSmcd {
                gid,
                chid,
                ..ProposalSmcd::default()
            }),
            ip_prefix: if typev1 != SmcType::None {
                self.ip_prefix
            } else {
                None
            },
            v2,
        };
        p.validate()?;
        Ok(p)
    }
}

// Keep HEADER_LEN referenced for readers of the layout: the base starts after it.
const _: () = assert!(HEADER_LEN + 8 + 16 + 6 + 2 == PROPOSAL_BASE_LEN);
const _: () = assert!(MAX_PROPOSAL_V1_LEN == 228);
const _: () = assert!(MAX_V2_EXT_OFFSET == 172 && MAX_SMCD_V2_EXT_OFFSET == 288);
