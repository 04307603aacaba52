//! The LLC message bodies, one struct per type, with offsets from the kernel's
//! `struct smc_llc_msg_*` definitions in `net/smc/smc_llc.c`.
//!
//! `parse_body` gets a message that [`super::LlcPacket::check_len`] has accepted (at least 44
//! bytes), so its fixed offsets cannot go out of bounds. `emit_body` gets exactly
//! `buffer_len()` bytes and writes all of them (reserved bytes as zero).

use super::{
    AddLinkRejectReason, DeleteLinkReason, GID_LEN, LLC_LEN, LlcError, LlcFlags, LlcPacket, LlcType,
};
use crate::wire::{array, be24, be32, be64, put_be24, put_be32, put_be64};

/// Writes a v1 header and zeroes the body.
fn put_v1_header(b: &mut [u8], ty: LlcType, byte2: u8, flags: LlcFlags) {
    b.fill(0);
    b[0] = ty.code();
    b[1] = LLC_LEN as u8;
    b[2] = byte2;
    b[3] = flags.bits();
}

/// Turns a v1 message just emitted into its v2 form (`smc_llc_init_msg_hdr` in a v2 link
/// group): version nibble 2 in byte 0 and the host-order 16-bit length over bytes 1..3
/// (overwriting the v1 length and byte 2, as the kernel's union does).
fn to_v2_header(b: &mut [u8]) {
    let len = b.len() as u16;
    b[0] = (b[0] & 0x0F) | 0x20;
    b[1..3].copy_from_slice(&len.to_ne_bytes());
}

fn flags_of(b: &[u8]) -> LlcFlags {
    LlcFlags::from_bits_retain(b[3])
}

/// An RMB rtoken as carried in CONFIRM_RKEY(_CONT) (`struct smc_rmb_rtoken`, 13 packed bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Rtoken {
    /// Link id the rtoken is for.
    pub link_id: u8,
    /// RMB rkey on that link.
    pub rkey: u32,
    /// RMB virtual (DMA) address on that link.
    pub vaddr: u64,
}

impl Rtoken {
    const LEN: usize = 13;

    fn parse(b: &[u8], at: usize) -> Rtoken {
        Rtoken {
            link_id: b[at],
            rkey: be32(b, at + 1),
            vaddr: be64(b, at + 5),
        }
    }

    fn emit(&self, b: &mut [u8], at: usize) {
        b[at] = self.link_id;
        put_be32(b, at + 1, self.rkey);
        put_be64(b, at + 5, self.vaddr);
    }
}

/// CONFIRM_LINK (0x01, `struct smc_llc_msg_confirm_link`): sent by the server on a new link, the
/// client answers with the response flag. Linux sets [`LlcFlags::NO_RMBE_EYECATCHER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ConfirmLink {
    /// Flags (0x80 response, 0x03 no RMBE eyecatchers).
    pub flags: LlcFlags,
    /// Sender's MAC (byte 4).
    pub mac: [u8; 6],
    /// Sender's GID (byte 10).
    pub gid: [u8; GID_LEN],
    /// Sender's QP number, 24 bits (byte 26). Emit writes the low 24 bits.
    pub qpn: u32,
    /// Link id the server assigned (byte 29).
    pub link_num: u8,
    /// Link user id, big endian (byte 30): link group id + link id.
    pub link_uid: u32,
    /// Max links (byte 34): 2 from Linux, or the negotiated value in v2.1 link groups.
    pub max_links: u8,
    /// Max connections (byte 35): 0 unless SMC-Rv2.1 negotiated it.
    pub max_conns: u8,
}

impl ConfirmLink {
    pub(super) fn parse_body(b: &[u8]) -> ConfirmLink {
        ConfirmLink {
            flags: flags_of(b),
            mac: array(b, 4),
            gid: array(b, 10),
            qpn: be24(b, 26),
            link_num: b[29],
            link_uid: be32(b, 30),
            max_links: b[34],
            max_conns: b[35],
        }
    }

    pub(super) fn emit_body(&self, b: &mut [u8]) {
        put_v1_header(b, LlcType::ConfirmLink, 0, self.flags);
        b[4..10].copy_from_slice(&self.mac);
        b[10..26].copy_from_slice(&self.gid);
        put_be24(b, 26, self.qpn);
        b[29] = self.link_num;
        put_be32(b, 30, self.link_uid);
        b[34] = self.max_links;
        b[35] = self.max_conns;
    }
}

/// ADD_LINK (0x02, `struct smc_llc_msg_add_link`). A response may carry the reject flag (0x40)
/// and a reject reason in the low nibble of header byte 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddLink {
    /// Flags (0x80 response, 0x40 rejected).
    pub flags: LlcFlags,
    /// Reject reason (header byte 2, low nibble).
    pub reject_reason: AddLinkRejectReason,
    /// Sender's MAC (byte 4).
    pub mac: [u8; 6],
    /// Sender's GID (byte 12, after 2 reserved bytes).
    pub gid: [u8; GID_LEN],
    /// QP number of the new link, 24 bits (byte 28).
    pub qpn: u32,
    /// Link id of the new link (byte 31).
    pub link_num: u8,
    /// QP MTU, IB enum, low nibble of byte 32 (request: own path MTU; response: the minimum).
    /// Emit writes the low 4 bits.
    pub qp_mtu: u8,
    /// Initial packet sequence number, 24 bits (byte 33).
    pub initial_psn: u32,
}

impl Default for AddLink {
    fn default() -> Self {
        AddLink {
            flags: LlcFlags::EMPTY,
            reject_reason: AddLinkRejectReason::NoReason,
            mac: [0; 6],
            gid: [0; GID_LEN],
            qpn: 0,
            link_num: 0,
            qp_mtu: 0,
            initial_psn: 0,
        }
    }
}

impl AddLink {
    pub(super) fn parse_body(b: &[u8]) -> AddLink {
        AddLink {
            flags: flags_of(b),
            reject_reason: AddLinkRejectReason::from_code(b[2]),
            mac: array(b, 4),
            gid: array(b, 12),
            qpn: be24(b, 28),
            link_num: b[31],
            qp_mtu: b[32] & 0x0F,
            initial_psn: be24(b, 33),
        }
    }

    pub(super) fn emit_body(&self, b: &mut [u8]) {
        put_v1_header(b, LlcType::AddLink, self.reject_reason.code(), self.flags);
        b[4..10].copy_from_slice(&self.mac);
        b[12..28].copy_from_slice(&self.gid);
        put_be24(b, 28, self.qpn);
        b[31] = self.link_num;
        b[32] = self.qp_mtu & 0x0F;
        put_be24(b, 33, self.initial_psn);
    }
}

/// One rkey pair of ADD_LINK_CONT (`struct smc_llc_msg_add_link_cont_rt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AddLinkContRkey {
    /// The RMB's rkey on the existing link.
    pub rkey: u32,
    /// The same RMB's rkey on the new link.
    pub rkey_new: u32,
    /// The RMB's virtual address on the new link.
    pub vaddr_new: u64,
}

impl AddLinkContRkey {
    /// The 16 bytes at `at` (ADD_LINK_CONT's slots and ADD_LINK v2's extension entries,
    /// `struct smc_llc_msg_add_link_v2_rkey`, have the same layout).
    fn parse_at(b: &[u8], at: usize) -> AddLinkContRkey {
        AddLinkContRkey {
            rkey: be32(b, at),
            rkey_new: be32(b, at + 4),
            vaddr_new: be64(b, at + 8),
        }
    }

    fn emit_at(&self, b: &mut [u8], at: usize) {
        put_be32(b, at, self.rkey);
        put_be32(b, at + 4, self.rkey_new);
        put_be64(b, at + 8, self.vaddr_new);
    }
}

/// ADD_LINK_CONT (0x03, `struct smc_llc_msg_add_link_cont`): two rkey pairs per message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AddLinkCont {
    /// Flags (0x80 when sent by the client).
    pub flags: LlcFlags,
    /// Link id of the new link (byte 4).
    pub link_num: u8,
    /// Rkeys still to send *including* this message's (byte 5); Linux fills
    /// `min(num_rkeys, 2)` of the slots below.
    pub num_rkeys: u8,
    /// The two slots (bytes 8 and 24, after 2 reserved bytes), kept even when unused.
    pub rkeys: [AddLinkContRkey; 2],
}

impl AddLinkCont {
    pub(super) fn parse_body(b: &[u8]) -> AddLinkCont {
        let rt = |at: usize| AddLinkContRkey::parse_at(b, at);
        AddLinkCont {
            flags: flags_of(b),
            link_num: b[4],
            num_rkeys: b[5],
            rkeys: [rt(8), rt(24)],
        }
    }

    pub(super) fn emit_body(&self, b: &mut [u8]) {
        put_v1_header(b, LlcType::AddLinkCont, 0, self.flags);
        b[4] = self.link_num;
        b[5] = self.num_rkeys;
        for (i, rt) in self.rkeys.iter().enumerate() {
            rt.emit_at(b, 8 + 16 * i);
        }
    }
}

/// DELETE_LINK (0x04, `struct smc_llc_msg_del_link`, packed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeleteLink {
    /// Flags (0x80 response, 0x40 all links, 0x20 orderly).
    pub flags: LlcFlags,
    /// Link id to delete (byte 4); 0 with the "all" flag.
    pub link_num: u8,
    /// Reason, big-endian u32 at byte 5 (unaligned).
    pub reason: DeleteLinkReason,
}

impl Default for DeleteLink {
    fn default() -> Self {
        DeleteLink {
            flags: LlcFlags::EMPTY,
            link_num: 0,
            reason: DeleteLinkReason::NoReason,
        }
    }
}

impl DeleteLink {
    pub(super) fn parse_body(b: &[u8]) -> DeleteLink {
        DeleteLink {
            flags: flags_of(b),
            link_num: b[4],
            reason: DeleteLinkReason::from_code(be32(b, 5)),
        }
    }

    pub(super) fn emit_body(&self, b: &mut [u8]) {
        put_v1_header(b, LlcType::DeleteLink, 0, self.flags);
        b[4] = self.link_num;
        put_be32(b, 5, self.reason.code());
    }
}

/// CONFIRM_RKEY (0x06, `struct smc_llc_msg_confirm_rkey`): three packed rtokens; the first is
/// for the sending link and its first byte counts the other entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ConfirmRkey {
    /// Flags (0x80 response, 0x20 negative, 0x10 retry).
    pub flags: LlcFlags,
    /// Number of entries in `others` that are used (byte 4; Linux rejects more than 3).
    pub num_others: u8,
    /// RMB rkey on the sending link (byte 5).
    pub rkey: u32,
    /// RMB virtual address on the sending link (byte 9).
    pub vaddr: u64,
    /// Rtokens for the other links (bytes 17 and 30), kept even when unused.
    pub others: [Rtoken; 2],
}

impl ConfirmRkey {
    pub(super) fn parse_body(b: &[u8]) -> ConfirmRkey {
        ConfirmRkey {
            flags: flags_of(b),
            num_others: b[4],
            rkey: be32(b, 5),
            vaddr: be64(b, 9),
            others: [
                Rtoken::parse(b, 4 + Rtoken::LEN),
                Rtoken::parse(b, 4 + 2 * Rtoken::LEN),
            ],
        }
    }

    pub(super) fn emit_body(&self, b: &mut [u8]) {
        put_v1_header(b, LlcType::ConfirmRkey, 0, self.flags);
        Rtoken {
            link_id: self.num_others,
            rkey: self.rkey,
            vaddr: self.vaddr,
        }
        .emit(b, 4);
        self.others[0].emit(b, 4 + Rtoken::LEN);
        self.others[1].emit(b, 4 + 2 * Rtoken::LEN);
    }
}

/// TEST_LINK (0x07, `struct smc_llc_msg_test_link`): echoed with the response flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TestLink {
    /// Flags (0x80 response).
    pub flags: LlcFlags,
    /// Opaque user data (byte 4), echoed by the responder (Linux sends zeros).
    pub user_data: [u8; 16],
}

impl TestLink {
    pub(super) fn parse_body(b: &[u8]) -> TestLink {
        TestLink {
            flags: flags_of(b),
            user_data: array(b, 4),
        }
    }

    pub(super) fn emit_body(&self, b: &mut [u8]) {
        put_v1_header(b, LlcType::TestLink, 0, self.flags);
        b[4..20].copy_from_slice(&self.user_data);
    }
}

/// CONFIRM_RKEY_CONT (0x08, `struct smc_llc_msg_confirm_rkey_cont` as in the kernels that
/// still defined it): a count and three rtokens. Current Linux never sends it (three links fit
/// one CONFIRM_RKEY) and ignores it on receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ConfirmRkeyCont {
    /// Flags (0x80 response, 0x20 negative, 0x10 retry).
    pub flags: LlcFlags,
    /// Number of rtokens (byte 4).
    pub num_rkeys: u8,
    /// Three rtokens (bytes 5, 18, 31).
    pub rtokens: [Rtoken; 3],
}

impl ConfirmRkeyCont {
    pub(super) fn parse_body(b: &[u8]) -> ConfirmRkeyCont {
        ConfirmRkeyCont {
            flags: flags_of(b),
            num_rkeys: b[4],
            rtokens: [
                Rtoken::parse(b, 5),
                Rtoken::parse(b, 5 + Rtoken::LEN),
                Rtoken::parse(b, 5 + 2 * Rtoken::LEN),
            ],
        }
    }

    pub(super) fn emit_body(&self, b: &mut [u8]) {
        put_v1_header(b, LlcType::ConfirmRkeyCont, 0, self.flags);
        b[4] = self.num_rkeys;
        for (i, rt) in self.rtokens.iter().enumerate() {
            rt.emit(b, 5 + i * Rtoken::LEN);
        }
    }
}

/// DELETE_RKEY (0x09, `struct smc_llc_msg_delete_rkey`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DeleteRkey {
    /// Flags (0x80 response, 0x20 negative).
    pub flags: LlcFlags,
    /// Number of rkeys used (byte 4; at most 8 are read).
    pub num_rkeys: u8,
    /// Response: bit `7 - i` set when `rkeys[i]` could not be deleted (byte 5).
    pub err_mask: u8,
    /// Rkeys to delete (byte 8, after 2 reserved bytes), all 8 slots kept.
    pub rkeys: [u32; 8],
}

impl DeleteRkey {
    pub(super) fn parse_body(b: &[u8]) -> DeleteRkey {
        let mut rkeys = [0u32; 8];
        for (i, k) in rkeys.iter_mut().enumerate() {
            *k = be32(b, 8 + 4 * i);
        }
        DeleteRkey {
            flags: flags_of(b),
            num_rkeys: b[4],
            err_mask: b[5],
            rkeys,
        }
    }

    pub(super) fn emit_body(&self, b: &mut [u8]) {
        put_v1_header(b, LlcType::DeleteRkey, 0, self.flags);
        b[4] = self.num_rkeys;
        b[5] = self.err_mask;
        for (i, k) in self.rkeys.iter().enumerate() {
            put_be32(b, 8 + 4 * i, *k);
        }
    }
}

/// REQUEST_ADD_LINK (type byte 0x25: llc_type 5 with a v2 header,
/// `struct smc_llc_msg_req_add_link_v2`). An SMC-Rv2 client sends it with the list of its
/// usable GIDs to ask the server to start ADD_LINK; the server answers with the response flag
/// and a zeroed 44-byte body.
///
/// The length in bytes 1..3 is host byte order, as the kernel writes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ReqAddLink {
    /// Flags (0x80 response).
    pub flags: LlcFlags,
    /// GIDs (count at byte 24, list at byte 28). Linux sends the request only with 2 or more
    /// and the response with none. At most 255.
    pub gids: Vec<[u8; GID_LEN]>,
}

impl ReqAddLink {
    const FIXED: usize = 28;

    /// The message length: `28 + 16 * gids`, but at least 44 (the kernel's minimum).
    pub fn buffer_len(&self) -> usize {
        (Self::FIXED + GID_LEN * self.gids.len().min(255)).max(LLC_LEN)
    }

    pub(super) fn parse_body(b: &[u8]) -> Result<ReqAddLink, LlcError> {
        let count = b[24];
        let need = Self::FIXED + GID_LEN * count as usize;
        if need > b.len() {
            return Err(LlcError::GidCountTooLarge {
                count,
                length: b.len(),
            });
        }
        let gids = (0..count as usize)
            .map(|i| array(b, Self::FIXED + GID_LEN * i))
            .collect();
        Ok(ReqAddLink {
            flags: flags_of(b),
            gids,
        })
    }

    /// # Panics
    /// If `b` is not `buffer_len()` bytes long or more than 255 GIDs are listed.
    pub(super) fn emit_body(&self, b: &mut [u8]) {
        assert!(
            self.gids.len() <= 255,
            "REQUEST_ADD_LINK holds at most 255 GIDs"
        );
        let len = self.buffer_len();
        b.fill(0);
        b[0] = LlcType::ReqAddLinkV2.code();
        b[1..3].copy_from_slice(&(len as u16).to_ne_bytes());
        b[3] = self.flags.bits();
        b[24] = self.gids.len() as u8;
        for (i, g) in self.gids.iter().enumerate() {
            let at = Self::FIXED + GID_LEN * i;
            b[at..at + GID_LEN].copy_from_slice(g);
        }
    }
}

/// Where the ADD_LINK v2 extension starts: right after the 44-byte base message.
const EXT_AT: usize = LLC_LEN;
/// `sizeof(struct smc_llc_msg_add_link_v2_ext)` without its rkey array.
const EXT_FIXED: usize = 28;
/// One `struct smc_llc_msg_add_link_cont_rt` in the extension's array.
const EXT_RT_LEN: usize = 16;

/// The most rkey entries an ADD_LINK v2 can carry in [`super::LLC_V2_MAX_LEN`] bytes. Linux
/// sends one per connection of the group (at most 255) and reads at most 255.
pub const ADD_LINK_V2_MAX_RKEYS: usize = (super::LLC_V2_MAX_LEN - EXT_AT - EXT_FIXED) / EXT_RT_LEN;

/// The rkey extension of an SMC-Rv2 ADD_LINK (`struct smc_llc_msg_add_link_v2_ext`, packed,
/// at byte 44): in a v2 link group each side sends all its RMBs' keys for the new link in its
/// ADD_LINK request or response, and ADD_LINK_CONT is not used.
///
/// | Off | Size | Field |
/// |---|---|---|
/// | 44 | 1 | bit 0x80 `v2_direct` (no gateway between the peers), other bits reserved |
/// | 45 | 1 | reserved |
/// | 46 | 16 | `client_target_gid`: the sender's GID of the new link |
/// | 62 | 8 | reserved |
/// | 70 | 2 | `num_rkeys`, **host byte order** (`u16`, not `__be16`) |
/// | 72 | 16 × n | {rkey on the old link BE32, rkey on the new link BE32, vaddr on the new link BE64} |
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct AddLinkV2Ext {
    /// `v2_direct`: Linux sets it when the group uses no gateway (`!lgr->uses_gateway`).
    pub v2_direct: bool,
    /// `client_target_gid`: the GID of the sender's end of the new link.
    pub client_target_gid: [u8; GID_LEN],
    /// The rkey entries; `num_rkeys` on the wire is their count. At most
    /// [`ADD_LINK_V2_MAX_RKEYS`].
    pub rkeys: Vec<AddLinkContRkey>,
}

impl AddLinkV2Ext {
    fn buffer_len(&self) -> usize {
        EXT_FIXED + EXT_RT_LEN * self.rkeys.len()
    }

    /// Parses the extension of a message of `b.len()` bytes (> 44).
    fn parse(b: &[u8]) -> Result<AddLinkV2Ext, LlcError> {
        if b.len() < EXT_AT + EXT_FIXED {
            return Err(LlcError::ExtensionTruncated { length: b.len() });
        }
        let count = u16::from_ne_bytes([b[EXT_AT + 26], b[EXT_AT + 27]]);
        let need = EXT_AT + EXT_FIXED + EXT_RT_LEN * usize::from(count);
        if need > b.len() {
            return Err(LlcError::RkeyCountTooLarge {
                count,
                length: b.len(),
            });
        }
        let rkeys = (0..usize::from(count))
            .map(|i| AddLinkContRkey::parse_at(b, EXT_AT + EXT_FIXED + EXT_RT_LEN * i))
            .collect();
        Ok(AddLinkV2Ext {
            v2_direct: b[EXT_AT] & 0x80 != 0,
            client_target_gid: array(b, EXT_AT + 2),
            rkeys,
        })
    }

    fn emit(&self, b: &mut [u8]) {
        assert!(
            self.rkeys.len() <= ADD_LINK_V2_MAX_RKEYS,
            "ADD_LINK v2 holds at most {ADD_LINK_V2_MAX_RKEYS} rkeys"
        );
        b[EXT_AT] = if self.v2_direct { 0x80 } else { 0 };
        b[EXT_AT + 2..EXT_AT + 18].copy_from_slice(&self.client_target_gid);
        b[EXT_AT + 26..EXT_AT + 28].copy_from_slice(&(self.rkeys.len() as u16).to_ne_bytes());
        for (i, rt) in self.rkeys.iter().enumerate() {
            rt.emit_at(b, EXT_AT + EXT_FIXED + EXT_RT_LEN * i);
        }
    }
}

/// ADD_LINK v2 (type byte 0x22): the 44-byte ADD_LINK body behind a v2 header, followed by
/// the rkey extension when the message names a new link (Linux's request and positive
/// response). Linux sends it without the extension (length 44) when no new link exists,
/// i.e. its client's reject, which is the server's request sent back.
///
/// The v1 reject-reason nibble shares byte 2 with the v2 length, so a v2 ADD_LINK carries
/// no reject reason: [`AddLink::reject_reason`] parses as `NoReason` and is not emitted
/// (Linux's `smc_llc_cli_add_link_reject` sets it and then overwrites it with the length).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct AddLinkV2 {
    /// The base message (bytes 0..44).
    pub link: AddLink,
    /// The extension (bytes 44..), absent when the length is 44.
    pub ext: Option<AddLinkV2Ext>,
}

impl AddLinkV2 {
    /// The message length: 44, or 72 + 16 × rkeys with the extension.
    pub fn buffer_len(&self) -> usize {
        LLC_LEN + self.ext.as_ref().map_or(0, AddLinkV2Ext::buffer_len)
    }

    pub(super) fn parse_body(b: &[u8]) -> Result<AddLinkV2, LlcError> {
        let mut link = AddLink::parse_body(b);
        link.reject_reason = AddLinkRejectReason::NoReason;
        let ext = if b.len() > LLC_LEN {
            Some(AddLinkV2Ext::parse(b)?)
        } else {
            None
        };
        Ok(AddLinkV2 { link, ext })
    }

    /// # Panics
    /// If `b` is not `buffer_len()` bytes long or the extension lists more than
    /// [`ADD_LINK_V2_MAX_RKEYS`] rkeys.
    pub(super) fn emit_body(&self, b: &mut [u8]) {
        AddLink {
            reject_reason: AddLinkRejectReason::NoReason,
            ..self.link
        }
        .emit_body(&mut b[..LLC_LEN]);
        b[LLC_LEN..].fill(0);
        if let Some(ext) = &self.ext {
            ext.emit(b);
        }
        to_v2_header(b);
    }
}

/// DELETE_RKEY v2 (type byte 0x29, `struct smc_llc_msg_delete_rkey_v2`): a count, the
/// count of keys the responder could not delete, and a variable array of rkeys from byte 8.
/// Linux sends the request with one rkey in a 44-byte message; its response keeps the count,
/// zeroes the rkeys and puts the number of invalid rkeys at byte 5 (with the negative flag
/// when it is not zero).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DeleteRkeyV2 {
    /// Flags (0x80 response, 0x20 negative).
    pub flags: LlcFlags,
    /// Response: how many rkeys could not be deleted (byte 5, `num_inval_rkeys`).
    pub num_inval_rkeys: u8,
    /// The rkeys (`num_rkeys` at byte 4 is their count, at most 255; BE32 each from byte 8).
    pub rkeys: Vec<u32>,
}

impl DeleteRkeyV2 {
    const FIXED: usize = 8;

    /// The message length: `8 + 4 × rkeys`, but at least 44.
    pub fn buffer_len(&self) -> usize {
        (Self::FIXED + 4 * self.rkeys.len().min(255)).max(LLC_LEN)
    }

    pub(super) fn parse_body(b: &[u8]) -> Result<DeleteRkeyV2, LlcError> {
        let count = b[4];
        if Self::FIXED + 4 * usize::from(count) > b.len() {
            return Err(LlcError::RkeyCountTooLarge {
                count: u16::from(count),
                length: b.len(),
            });
        }
        let rkeys = (0..usize::from(count))
            .map(|i| be32(b, Self::FIXED + 4 * i))
            .collect();
        Ok(DeleteRkeyV2 {
            flags: flags_of(b),
            num_inval_rkeys: b[5],
            rkeys,
        })
    }

    /// # Panics
    /// If `b` is not `buffer_len()` bytes long or more than 255 rkeys are listed.
    pub(super) fn emit_body(&self, b: &mut [u8]) {
        assert!(
            self.rkeys.len() <= 255,
            "DELETE_RKEY v2 holds at most 255 rkeys"
        );
        b.fill(0);
        b[0] = LlcType::DeleteRkey.code();
        b[3] = self.flags.bits();
        b[4] = self.rkeys.len() as u8;
        b[5] = self.num_inval_rkeys;
        for (i, k) in self.rkeys.iter().enumerate() {
            put_be32(b, Self::FIXED + 4 * i, *k);
        }
        to_v2_header(b);
    }
}

/// Emits a v1 body and turns it into the 44-byte v2 message of the same base type (the
/// types whose v2 body is the v1 body: CONFIRM_LINK, DELETE_LINK, CONFIRM_RKEY, TEST_LINK).
pub(super) fn emit_v2_same_body(b: &mut [u8], emit_v1: impl FnOnce(&mut [u8])) {
    emit_v1(b);
    to_v2_header(b);
}

/// An LLC message kept as bytes: the v1-header 0x05 and unknown types. It always holds a
/// message that passed the kernel's length checks, so its type, flags and length can be read
/// back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RawLlc {
    bytes: Vec<u8>,
}

impl RawLlc {
    /// Keeps a message, after the same checks as [`super::LlcMessage::parse`]; bytes past the
    /// message length are dropped.
    pub fn new(bytes: &[u8]) -> Result<RawLlc, LlcError> {
        let p = LlcPacket::new_checked(bytes)?;
        Ok(Self::from_checked(p.message()))
    }

    pub(super) fn from_checked(message: &[u8]) -> RawLlc {
        RawLlc {
            bytes: message.to_vec(),
        }
    }

    /// The message bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The type (byte 0).
    pub fn llc_type(&self) -> LlcType {
        LlcType::from_code(self.bytes[0])
    }

    /// The flags (byte 3).
    pub fn flags(&self) -> LlcFlags {
        flags_of(&self.bytes)
    }
}
