//! LLC (SMC-R Link Layer Control), mirroring the Linux kernel's `net/smc/smc_llc.[ch]`.
//!
//! LLC messages travel as RDMA SENDs on an SMC-R link, next to CDC messages; byte 0 tells them
//! apart ([`classify`]). A v1 message is always 44 bytes: type (1), length 44 (1), one byte that
//! is reserved except for ADD_LINK's reject-reason nibble, flags (1), 40 bytes of body. A v2
//! message (type byte `0x2N`, sent in SMC-Rv2 link groups) has a 16-bit length in bytes 1..3 in
//! **host byte order** (the kernel's `u16 length_v2`, not `__be16`), at least 44, up to 8192.
//!
//! [`LlcMessage`] parses and emits every v1 message type and every v2 type Linux sends in an
//! SMC-Rv2 link group (0x21 CONFIRM_LINK, 0x22 ADD_LINK with its rkey extension, 0x24
//! DELETE_LINK, 0x25 REQUEST_ADD_LINK, 0x26 CONFIRM_RKEY, 0x27 TEST_LINK, 0x29 DELETE_RKEY
//! with its variable rkey list). Unknown types and the v1-header 0x05 are kept as raw bytes
//! ([`RawLlc`]), so nothing fails to decode only because its type is new.
//! See `docs/llc.md` for the byte layouts and the kernel's quirks.
//!
//! # Panic contract
//!
//! [`LlcMessage::parse`] and the view's `new_checked` never panic and return a typed
//! [`LlcError`]; `emit` panics only if given a buffer shorter than `buffer_len()`.

mod msgs;

pub use msgs::{
    ADD_LINK_V2_MAX_RKEYS, AddLink, AddLinkCont, AddLinkContRkey, AddLinkV2, AddLinkV2Ext,
    ConfirmLink, ConfirmRkey, ConfirmRkeyCont, DeleteLink, DeleteRkey, DeleteRkeyV2, RawLlc,
    ReqAddLink, Rtoken, TestLink,
};

use crate::cdc::CDC_MSG_TYPE;
use crate::cdc::flags::flag_byte;
use thiserror::Error;

/// Length of a v1 LLC message, and the value of its length byte (`SMC_WR_TX_SIZE`).
pub const LLC_LEN: usize = 44;
/// Length of the LLC header (type, length, reserved/reject reason, flags).
pub const LLC_HEADER_LEN: usize = 4;
/// Largest v2 LLC message the kernel sends or receives (`SMC_WR_BUF_V2_SIZE`).
pub const LLC_V2_MAX_LEN: usize = 8192;
/// Size of a RoCE GID.
pub const GID_LEN: usize = 16;

/// What was wrong with an LLC message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum LlcError {
    /// The buffer is shorter than the message (44 bytes, or the v2 length).
    #[error("LLC message truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A v1 message whose length byte is not 44 (the kernel drops it).
    #[error("LLC v1 length byte is {found}, expected 44")]
    BadLength {
        /// The length byte found.
        found: u8,
    },
    /// A v2 message whose 16-bit length is below 44 (the kernel drops it).
    #[error("LLC v2 length is {found}, below the minimum of 44")]
    V2LengthTooShort {
        /// The host-order length found.
        found: u16,
    },
    /// A v2 message whose 16-bit length is above 8192 (`SMC_WR_BUF_V2_SIZE`, the most a
    /// Linux receive buffer holds).
    #[error("LLC v2 length is {found}, above the maximum of 8192")]
    V2LengthTooLong {
        /// The host-order length found.
        found: u16,
    },
    /// An ADD_LINK v2 longer than 44 bytes but too short for its rkey extension (72 bytes).
    #[error("ADD_LINK v2 of {length} bytes is too short for its extension (72)")]
    ExtensionTruncated {
        /// The message length.
        length: usize,
    },
    /// An ADD_LINK v2 extension or a DELETE_RKEY v2 whose rkey count does not fit its length.
    #[error("LLC message lists {count} rkeys but its length {length} holds fewer")]
    RkeyCountTooLarge {
        /// The rkey count.
        count: u16,
        /// The message length.
        length: usize,
    },
    /// Byte 0 is 0xFE: this is a CDC message, not LLC.
    #[error("type byte 0xfe is a CDC message, not LLC")]
    CdcMessage,
    /// A REQUEST_ADD_LINK whose GID count does not fit in its length.
    #[error("REQUEST_ADD_LINK lists {count} GIDs but its length {length} holds fewer")]
    GidCountTooLarge {
        /// The GID count byte.
        count: u8,
        /// The message length.
        length: usize,
    },
}

/// An LLC message type (byte 0). For v2 types the high nibble is the LLC version (2) and the low
/// nibble the base type, as the kernel's `llc_version:4, llc_type:4` bitfield.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LlcType {
    /// 0x01 CONFIRM_LINK.
    ConfirmLink,
    /// 0x02 ADD_LINK.
    AddLink,
    /// 0x03 ADD_LINK_CONT.
    AddLinkCont,
    /// 0x04 DELETE_LINK.
    DeleteLink,
    /// 0x05 REQUEST_ADD_LINK with a v1 header. Linux defines the code but sends and accepts it
    /// only as the v2 type 0x25.
    ReqAddLink,
    /// 0x06 CONFIRM_RKEY.
    ConfirmRkey,
    /// 0x07 TEST_LINK.
    TestLink,
    /// 0x08 CONFIRM_RKEY_CONT (not sent by Linux: 3 links fit one CONFIRM_RKEY).
    ConfirmRkeyCont,
    /// 0x09 DELETE_RKEY.
    DeleteRkey,
    /// 0x21 CONFIRM_LINK v2.
    ConfirmLinkV2,
    /// 0x22 ADD_LINK v2 (with the rkey extension after byte 44).
    AddLinkV2,
    /// 0x24 DELETE_LINK v2.
    DeleteLinkV2,
    /// 0x25 REQUEST_ADD_LINK v2.
    ReqAddLinkV2,
    /// 0x26 CONFIRM_RKEY v2.
    ConfirmRkeyV2,
    /// 0x27 TEST_LINK v2.
    TestLinkV2,
    /// 0x29 DELETE_RKEY v2.
    DeleteRkeyV2,
    /// Any other byte (0xFE is CDC, see [`classify`]).
    Unknown(u8),
}

impl LlcType {
    /// The type byte.
    pub const fn code(self) -> u8 {
        match self {
            LlcType::ConfirmLink => 0x01,
            LlcType::AddLink => 0x02,
            LlcType::AddLinkCont => 0x03,
            LlcType::DeleteLink => 0x04,
            LlcType::ReqAddLink => 0x05,
            LlcType::ConfirmRkey => 0x06,
            LlcType::TestLink => 0x07,
            LlcType::ConfirmRkeyCont => 0x08,
            LlcType::DeleteRkey => 0x09,
            LlcType::ConfirmLinkV2 => 0x21,
            LlcType::AddLinkV2 => 0x22,
            LlcType::DeleteLinkV2 => 0x24,
            LlcType::ReqAddLinkV2 => 0x25,
            LlcType::ConfirmRkeyV2 => 0x26,
            LlcType::TestLinkV2 => 0x27,
            LlcType::DeleteRkeyV2 => 0x29,
            LlcType::Unknown(b) => b,
        }
    }

    /// The type for a byte.
    pub const fn from_code(b: u8) -> LlcType {
        match b {
            0x01 => LlcType::ConfirmLink,
            0x02 => LlcType::AddLink,
            0x03 => LlcType::AddLinkCont,
            0x04 => LlcType::DeleteLink,
            0x05 => LlcType::ReqAddLink,
            0x06 => LlcType::ConfirmRkey,
            0x07 => LlcType::TestLink,
            0x08 => LlcType::ConfirmRkeyCont,
            0x09 => LlcType::DeleteRkey,
            0x21 => LlcType::ConfirmLinkV2,
            0x22 => LlcType::AddLinkV2,
            0x24 => LlcType::DeleteLinkV2,
            0x25 => LlcType::ReqAddLinkV2,
            0x26 => LlcType::ConfirmRkeyV2,
            0x27 => LlcType::TestLinkV2,
            0x29 => LlcType::DeleteRkeyV2,
            b => LlcType::Unknown(b),
        }
    }

    /// The LLC version nibble (high nibble of the type byte): 0 for v1, 2 for v2.
    pub const fn version(self) -> u8 {
        self.code() >> 4
    }

    /// The base type (low nibble), which the kernel's flow logic switches on.
    pub const fn base(self) -> u8 {
        self.code() & 0x0F
    }

    /// True for a type Linux defines.
    pub const fn is_known(self) -> bool {
        !matches!(self, LlcType::Unknown(_))
    }
}

impl From<u8> for LlcType {
    fn from(b: u8) -> Self {
        LlcType::from_code(b)
    }
}

impl From<LlcType> for u8 {
    fn from(t: LlcType) -> u8 {
        t.code()
    }
}

/// What byte 0 of a message received on an SMC-R link is (the kernel's `smc_wr_rx_demultiplex`
/// keys its handlers on this byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MsgKind {
    /// 0xFE: a CDC message ([`crate::cdc::SmcrCdcRepr`]).
    Cdc,
    /// A known LLC message type.
    Llc(LlcType),
    /// Neither: Linux has no handler for it and drops the message.
    Unknown(u8),
}

/// Demultiplexes on byte 0: 0xFE is CDC, a known LLC type is LLC, anything else unknown.
pub const fn classify(first_byte: u8) -> MsgKind {
    if first_byte == CDC_MSG_TYPE {
        return MsgKind::Cdc;
    }
    match LlcType::from_code(first_byte) {
        LlcType::Unknown(b) => MsgKind::Unknown(b),
        t => MsgKind::Llc(t),
    }
}

bitflags::bitflags! {
    /// The LLC header's flags byte (byte 3). The meaning of a bit depends on the message type,
    /// so several names share a value; bits with no name are kept (see `cdc::flags`).
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct LlcFlags: u8 {
        /// 0x80, every type: this is a response (`SMC_LLC_FLAG_RESP`).
        const RESPONSE = 0x80;
        /// 0x40, ADD_LINK response: the request is rejected (`SMC_LLC_FLAG_ADD_LNK_REJ`).
        const ADD_LINK_REJECT = 0x40;
        /// 0x40, DELETE_LINK: delete all links, i.e. the link group (`SMC_LLC_FLAG_DEL_LINK_ALL`).
        const DELETE_LINK_ALL = 0x40;
        /// 0x20, DELETE_LINK: orderly (`SMC_LLC_FLAG_DEL_LINK_ORDERLY`).
        const DELETE_LINK_ORDERLY = 0x20;
        /// 0x20, CONFIRM_RKEY / DELETE_RKEY response: negative (`SMC_LLC_FLAG_RKEY_NEG`).
        const RKEY_NEGATIVE = 0x20;
        /// 0x10, CONFIRM_RKEY response: retry the rkey set (`SMC_LLC_FLAG_RKEY_RETRY`).
        const RKEY_RETRY = 0x10;
        /// 0x03, CONFIRM_LINK: no RMBE eyecatchers (`SMC_LLC_FLAG_NO_RMBE_EYEC`); Linux always
        /// sets it and rejects a CONFIRM_LINK without either bit.
        const NO_RMBE_EYECATCHER = 0x03;
        // Bits no message type defines: kept, so they survive a parse/emit round trip.
        const _ = !0;
    }
}

flag_byte!(LlcFlags);

impl LlcFlags {
    /// True if [`Self::RESPONSE`] is set.
    #[inline]
    pub const fn response(self) -> bool {
        self.contains(Self::RESPONSE)
    }

    /// True if [`Self::ADD_LINK_REJECT`] is set.
    #[inline]
    pub const fn add_link_reject(self) -> bool {
        self.contains(Self::ADD_LINK_REJECT)
    }

    /// True if [`Self::DELETE_LINK_ALL`] is set.
    #[inline]
    pub const fn delete_link_all(self) -> bool {
        self.contains(Self::DELETE_LINK_ALL)
    }

    /// True if [`Self::DELETE_LINK_ORDERLY`] is set.
    #[inline]
    pub const fn delete_link_orderly(self) -> bool {
        self.contains(Self::DELETE_LINK_ORDERLY)
    }

    /// True if [`Self::RKEY_NEGATIVE`] is set.
    #[inline]
    pub const fn rkey_negative(self) -> bool {
        self.contains(Self::RKEY_NEGATIVE)
    }

    /// True if [`Self::RKEY_RETRY`] is set.
    #[inline]
    pub const fn rkey_retry(self) -> bool {
        self.contains(Self::RKEY_RETRY)
    }

    /// True if *either* bit of [`Self::NO_RMBE_EYECATCHER`] is set: that is what the kernel's
    /// CONFIRM_LINK check accepts (`contains` would ask for both).
    #[inline]
    pub const fn no_rmbe_eyecatcher(self) -> bool {
        self.intersects(Self::NO_RMBE_EYECATCHER)
    }
}

/// DELETE_LINK reason codes (`SMC_LLC_DEL_*`), a big-endian u32 at byte 5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeleteLinkReason {
    /// 0: no reason (Linux sends it in a successful DELETE_LINK response).
    NoReason,
    /// 0x00010000 lost path.
    LostPath,
    /// 0x00020000 operator-initiated termination.
    OperatorInitiated,
    /// 0x00030000 program-initiated termination.
    ProgramInitiated,
    /// 0x00040000 LLC protocol violation.
    ProtocolViolation,
    /// 0x00050000 asymmetric link no longer needed.
    NoAsymmetricNeeded,
    /// 0x00100000 (response) unknown link id.
    UnknownLink,
    /// 0x00200000 (response) unknown link group.
    UnknownLinkGroup,
    /// Any other code, kept.
    Unknown(u32),
}

impl DeleteLinkReason {
    /// The code.
    pub const fn code(self) -> u32 {
        match self {
            DeleteLinkReason::NoReason => 0,
            DeleteLinkReason::LostPath => 0x0001_0000,
            DeleteLinkReason::OperatorInitiated => 0x0002_0000,
            DeleteLinkReason::ProgramInitiated => 0x0003_0000,
            DeleteLinkReason::ProtocolViolation => 0x0004_0000,
            DeleteLinkReason::NoAsymmetricNeeded => 0x0005_0000,
            DeleteLinkReason::UnknownLink => 0x0010_0000,
            DeleteLinkReason::UnknownLinkGroup => 0x0020_0000,
            DeleteLinkReason::Unknown(c) => c,
        }
    }

    /// The reason for a code.
    pub const fn from_code(c: u32) -> DeleteLinkReason {
        match c {
            0 => DeleteLinkReason::NoReason,
            0x0001_0000 => DeleteLinkReason::LostPath,
            0x0002_0000 => DeleteLinkReason::OperatorInitiated,
            0x0003_0000 => DeleteLinkReason::ProgramInitiated,
            0x0004_0000 => DeleteLinkReason::ProtocolViolation,
            0x0005_0000 => DeleteLinkReason::NoAsymmetricNeeded,
            0x0010_0000 => DeleteLinkReason::UnknownLink,
            0x0020_0000 => DeleteLinkReason::UnknownLinkGroup,
            c => DeleteLinkReason::Unknown(c),
        }
    }
}

/// The ADD_LINK reject reason: the low nibble of byte 2 of a v1 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddLinkRejectReason {
    /// 0: not rejected / no reason.
    NoReason,
    /// 1: no alternate path (`SMC_LLC_REJ_RSN_NO_ALT_PATH`), the only reason Linux sends.
    NoAlternatePath,
    /// Any other nibble value (0..=15), kept. Emit writes only the low 4 bits.
    Unknown(u8),
}

impl AddLinkRejectReason {
    /// The 4-bit code.
    pub const fn code(self) -> u8 {
        match self {
            AddLinkRejectReason::NoReason => 0,
            AddLinkRejectReason::NoAlternatePath => 1,
            AddLinkRejectReason::Unknown(c) => c & 0x0F,
        }
    }

    /// The reason for a code (only the low 4 bits are used).
    pub const fn from_code(c: u8) -> AddLinkRejectReason {
        match c & 0x0F {
            0 => AddLinkRejectReason::NoReason,
            1 => AddLinkRejectReason::NoAlternatePath,
            c => AddLinkRejectReason::Unknown(c),
        }
    }
}

/// A checked view over one LLC message's header.
///
/// `new_checked` applies the kernel's receive checks (`smc_llc_rx_handler`): at least 44 bytes;
/// a v1 message (version nibble 0) has length byte 44; any other version has a host-order
/// 16-bit length of at least 44, and the buffer must hold that many bytes. A length above
/// 8192 is refused as well (a Linux receive buffer ends there, so it cannot be sent to one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlcPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> LlcPacket<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> LlcPacket<T> {
        LlcPacket { buffer }
    }

    /// Wraps a buffer and applies the kernel's receive checks.
    pub fn new_checked(buffer: T) -> Result<LlcPacket<T>, LlcError> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// The kernel's receive checks; see the type's doc.
    pub fn check_len(&self) -> Result<(), LlcError> {
        let b = self.buffer.as_ref();
        if b.len() < LLC_LEN {
            return Err(LlcError::Truncated {
                need: LLC_LEN,
                have: b.len(),
            });
        }
        if self.is_v1() {
            if b[1] as usize != LLC_LEN {
                return Err(LlcError::BadLength { found: b[1] });
            }
        } else {
            let len = self.length_v2();
            if (len as usize) < LLC_LEN {
                return Err(LlcError::V2LengthTooShort { found: len });
            }
            if len as usize > LLC_V2_MAX_LEN {
                return Err(LlcError::V2LengthTooLong { found: len });
            }
            if b.len() < len as usize {
                return Err(LlcError::Truncated {
                    need: len as usize,
                    have: b.len(),
                });
            }
        }
        Ok(())
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Byte 0.
    pub fn type_byte(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    /// Byte 0 as a type.
    pub fn llc_type(&self) -> LlcType {
        LlcType::from_code(self.type_byte())
    }

    /// True if the version nibble is 0 (a v1 header with a one-byte length).
    pub fn is_v1(&self) -> bool {
        self.type_byte() >> 4 == 0
    }

    /// Byte 1: the v1 length.
    pub fn length(&self) -> u8 {
        self.buffer.as_ref()[1]
    }

    /// Bytes 1..3 as the v2 length, host byte order as the kernel's `u16 length_v2`.
    pub fn length_v2(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_ne_bytes([b[1], b[2]])
    }

    /// The message length: 44 for v1, the v2 length otherwise. Valid after `check_len`.
    pub fn message_len(&self) -> usize {
        if self.is_v1() {
            LLC_LEN
        } else {
            self.length_v2() as usize
        }
    }

    /// Byte 2 of a v1 header: reserved, except that its low nibble is ADD_LINK's reject reason.
    pub fn v1_byte2(&self) -> u8 {
        self.buffer.as_ref()[2]
    }

    /// Byte 3: flags.
    pub fn flags(&self) -> LlcFlags {
        LlcFlags::from_bits_retain(self.buffer.as_ref()[3])
    }

    /// The whole message (`message_len()` bytes). Valid after `check_len`.
    pub fn message(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.message_len()]
    }
}

/// One LLC message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LlcMessage {
    /// 0x01 CONFIRM_LINK.
    ConfirmLink(ConfirmLink),
    /// 0x02 ADD_LINK.
    AddLink(AddLink),
    /// 0x03 ADD_LINK_CONT.
    AddLinkCont(AddLinkCont),
    /// 0x04 DELETE_LINK.
    DeleteLink(DeleteLink),
    /// 0x25 REQUEST_ADD_LINK (v2 header).
    ReqAddLink(ReqAddLink),
    /// 0x06 CONFIRM_RKEY.
    ConfirmRkey(ConfirmRkey),
    /// 0x07 TEST_LINK.
    TestLink(TestLink),
    /// 0x08 CONFIRM_RKEY_CONT.
    ConfirmRkeyCont(ConfirmRkeyCont),
    /// 0x09 DELETE_RKEY.
    DeleteRkey(DeleteRkey),
    /// 0x21 CONFIRM_LINK v2: the v1 body behind a v2 header, 44 bytes.
    ConfirmLinkV2(ConfirmLink),
    /// 0x22 ADD_LINK v2, with the rkey extension.
    AddLinkV2(AddLinkV2),
    /// 0x24 DELETE_LINK v2: the v1 body behind a v2 header, 44 bytes.
    DeleteLinkV2(DeleteLink),
    /// 0x26 CONFIRM_RKEY v2: the v1 body behind a v2 header, 44 bytes.
    ConfirmRkeyV2(ConfirmRkey),
    /// 0x27 TEST_LINK v2: the v1 body behind a v2 header, 44 bytes.
    TestLinkV2(TestLink),
    /// 0x29 DELETE_RKEY v2, with a variable rkey list.
    DeleteRkeyV2(DeleteRkeyV2),
    /// Any other type, kept byte for byte: the v1-header 0x05 and unknown types.
    Raw(RawLlc),
}

impl LlcMessage {
    /// Parses one message with the kernel's receive checks (see [`LlcPacket`]). Bytes past the
    /// message length are ignored (receive buffers are larger than the message).
    pub fn parse(bytes: &[u8]) -> Result<LlcMessage, LlcError> {
        Self::parse_packet(&LlcPacket::new_checked(bytes)?)
    }

    /// Parses from a checked view.
    pub fn parse_packet<T: AsRef<[u8]>>(p: &LlcPacket<T>) -> Result<LlcMessage, LlcError> {
        p.check_len()?;
        let m = p.message();
        Ok(match p.llc_type() {
            LlcType::ConfirmLink => LlcMessage::ConfirmLink(ConfirmLink::parse_body(m)),
            LlcType::AddLink => LlcMessage::AddLink(AddLink::parse_body(m)),
            LlcType::AddLinkCont => LlcMessage::AddLinkCont(AddLinkCont::parse_body(m)),
            LlcType::DeleteLink => LlcMessage::DeleteLink(DeleteLink::parse_body(m)),
            LlcType::ConfirmRkey => LlcMessage::ConfirmRkey(ConfirmRkey::parse_body(m)),
            LlcType::TestLink => LlcMessage::TestLink(TestLink::parse_body(m)),
            LlcType::ConfirmRkeyCont => LlcMessage::ConfirmRkeyCont(ConfirmRkeyCont::parse_body(m)),
            LlcType::DeleteRkey => LlcMessage::DeleteRkey(DeleteRkey::parse_body(m)),
            LlcType::ReqAddLinkV2 => LlcMessage::ReqAddLink(ReqAddLink::parse_body(m)?),
            LlcType::ConfirmLinkV2 => LlcMessage::ConfirmLinkV2(ConfirmLink::parse_body(m)),
            LlcType::AddLinkV2 => LlcMessage::AddLinkV2(AddLinkV2::parse_body(m)?),
            LlcType::DeleteLinkV2 => LlcMessage::DeleteLinkV2(DeleteLink::parse_body(m)),
            LlcType::ConfirmRkeyV2 => LlcMessage::ConfirmRkeyV2(ConfirmRkey::parse_body(m)),
            LlcType::TestLinkV2 => LlcMessage::TestLinkV2(TestLink::parse_body(m)),
            LlcType::DeleteRkeyV2 => LlcMessage::DeleteRkeyV2(DeleteRkeyV2::parse_body(m)?),
            LlcType::Unknown(CDC_MSG_TYPE) => return Err(LlcError::CdcMessage),
            _ => LlcMessage::Raw(RawLlc::from_checked(m)),
        })
    }

    /// The message type.
    pub fn llc_type(&self) -> LlcType {
        match self {
            LlcMessage::ConfirmLink(_) => LlcType::ConfirmLink,
            LlcMessage::AddLink(_) => LlcType::AddLink,
            LlcMessage::AddLinkCont(_) => LlcType::AddLinkCont,
            LlcMessage::DeleteLink(_) => LlcType::DeleteLink,
            LlcMessage::ReqAddLink(_) => LlcType::ReqAddLinkV2,
            LlcMessage::ConfirmRkey(_) => LlcType::ConfirmRkey,
            LlcMessage::TestLink(_) => LlcType::TestLink,
            LlcMessage::ConfirmRkeyCont(_) => LlcType::ConfirmRkeyCont,
            LlcMessage::DeleteRkey(_) => LlcType::DeleteRkey,
            LlcMessage::ConfirmLinkV2(_) => LlcType::ConfirmLinkV2,
            LlcMessage::AddLinkV2(_) => LlcType::AddLinkV2,
            LlcMessage::DeleteLinkV2(_) => LlcType::DeleteLinkV2,
            LlcMessage::ConfirmRkeyV2(_) => LlcType::ConfirmRkeyV2,
            LlcMessage::TestLinkV2(_) => LlcType::TestLinkV2,
            LlcMessage::DeleteRkeyV2(_) => LlcType::DeleteRkeyV2,
            LlcMessage::Raw(r) => r.llc_type(),
        }
    }

    /// The flags byte.
    pub fn flags(&self) -> LlcFlags {
        match self {
            LlcMessage::ConfirmLink(m) | LlcMessage::ConfirmLinkV2(m) => m.flags,
            LlcMessage::AddLink(m) => m.flags,
            LlcMessage::AddLinkV2(m) => m.link.flags,
            LlcMessage::DeleteRkeyV2(m) => m.flags,
            LlcMessage::AddLinkCont(m) => m.flags,
            LlcMessage::DeleteLink(m) | LlcMessage::DeleteLinkV2(m) => m.flags,
            LlcMessage::ReqAddLink(m) => m.flags,
            LlcMessage::ConfirmRkey(m) | LlcMessage::ConfirmRkeyV2(m) => m.flags,
            LlcMessage::TestLink(m) | LlcMessage::TestLinkV2(m) => m.flags,
            LlcMessage::ConfirmRkeyCont(m) => m.flags,
            LlcMessage::DeleteRkey(m) => m.flags,
            LlcMessage::Raw(r) => r.flags(),
        }
    }

    /// True if the response flag (0x80) is set.
    pub fn is_response(&self) -> bool {
        self.flags().response()
    }

    /// Bytes [`LlcMessage::emit`] writes: 44 for v1 messages and the fixed-size v2 ones.
    pub fn buffer_len(&self) -> usize {
        match self {
            LlcMessage::ReqAddLink(m) => m.buffer_len(),
            LlcMessage::AddLinkV2(m) => m.buffer_len(),
            LlcMessage::DeleteRkeyV2(m) => m.buffer_len(),
            LlcMessage::Raw(r) => r.as_bytes().len(),
            _ => LLC_LEN,
        }
    }

    /// Writes the message into the first `buffer_len()` bytes of `buf`; reserved bytes are
    /// zeroed.
    ///
    /// # Panics
    /// If `buf` is shorter than `buffer_len()`, a [`ReqAddLink`] lists more than 255 GIDs or
    /// a [`DeleteRkeyV2`] more than 255 rkeys (their counts are one byte), or an
    /// [`AddLinkV2Ext`] more than [`ADD_LINK_V2_MAX_RKEYS`]; all are caller bugs, never
    /// input.
    pub fn emit(&self, buf: &mut [u8]) {
        let len = self.buffer_len();
        assert!(buf.len() >= len, "LLC emit needs {len} bytes");
        let b = &mut buf[..len];
        match self {
            LlcMessage::ConfirmLink(m) => m.emit_body(b),
            LlcMessage::AddLink(m) => m.emit_body(b),
            LlcMessage::AddLinkCont(m) => m.emit_body(b),
            LlcMessage::DeleteLink(m) => m.emit_body(b),
            LlcMessage::ReqAddLink(m) => m.emit_body(b),
            LlcMessage::ConfirmRkey(m) => m.emit_body(b),
            LlcMessage::TestLink(m) => m.emit_body(b),
            LlcMessage::ConfirmRkeyCont(m) => m.emit_body(b),
            LlcMessage::DeleteRkey(m) => m.emit_body(b),
            LlcMessage::ConfirmLinkV2(m) => msgs::emit_v2_same_body(b, |b| m.emit_body(b)),
            LlcMessage::AddLinkV2(m) => m.emit_body(b),
            LlcMessage::DeleteLinkV2(m) => msgs::emit_v2_same_body(b, |b| m.emit_body(b)),
            LlcMessage::ConfirmRkeyV2(m) => msgs::emit_v2_same_body(b, |b| m.emit_body(b)),
            LlcMessage::TestLinkV2(m) => msgs::emit_v2_same_body(b, |b| m.emit_body(b)),
            LlcMessage::DeleteRkeyV2(m) => m.emit_body(b),
            LlcMessage::Raw(r) => b.copy_from_slice(r.as_bytes()),
        }
    }

    /// The LLC version of the header: 0 (v1) or 2 (v2); other nibbles only for [`RawLlc`].
    pub fn version(&self) -> u8 {
        self.llc_type().version()
    }

    /// The message as a v2 link group sends it (`smc_llc_init_msg_hdr` with
    /// `lgr->smc_version == SMC_V2`): a v1 message of a type with a v2 form becomes that form.
    /// ADD_LINK gets no extension (add one with [`AddLinkV2::ext`]); DELETE_RKEY keeps its
    /// first `num_rkeys` (at most 8) keys and its error mask as `num_inval_rkeys`. Types with
    /// no v2 form (ADD_LINK_CONT, CONFIRM_RKEY_CONT), v2 messages and raw ones are returned
    /// as they are.
    pub fn into_v2(self) -> LlcMessage {
        match self {
            LlcMessage::ConfirmLink(m) => LlcMessage::ConfirmLinkV2(m),
            LlcMessage::AddLink(m) => LlcMessage::AddLinkV2(AddLinkV2 { link: m, ext: None }),
            LlcMessage::DeleteLink(m) => LlcMessage::DeleteLinkV2(m),
            LlcMessage::ConfirmRkey(m) => LlcMessage::ConfirmRkeyV2(m),
            LlcMessage::TestLink(m) => LlcMessage::TestLinkV2(m),
            LlcMessage::DeleteRkey(m) => {
                let n = usize::from(m.num_rkeys).min(m.rkeys.len());
                LlcMessage::DeleteRkeyV2(DeleteRkeyV2 {
                    flags: m.flags,
                    num_inval_rkeys: m.err_mask,
                    rkeys: m.rkeys[..n].to_vec(),
                })
            }
            other => other,
        }
    }

    /// The v1 reading of a v2 message, as the kernel's LLC layer switches on the base type:
    /// the same body under the v1 type. Lossy where the v2 body is larger: ADD_LINK drops its
    /// extension, DELETE_RKEY keeps its first 8 keys (and `num_inval_rkeys` as the error
    /// mask). v1 messages, REQUEST_ADD_LINK and raw ones are returned as they are.
    pub fn into_v1(self) -> LlcMessage {
        match self {
            LlcMessage::ConfirmLinkV2(m) => LlcMessage::ConfirmLink(m),
            LlcMessage::AddLinkV2(m) => LlcMessage::AddLink(m.link),
            LlcMessage::DeleteLinkV2(m) => LlcMessage::DeleteLink(m),
            LlcMessage::ConfirmRkeyV2(m) => LlcMessage::ConfirmRkey(m),
            LlcMessage::TestLinkV2(m) => LlcMessage::TestLink(m),
            LlcMessage::DeleteRkeyV2(m) => {
                let mut rkeys = [0u32; 8];
                for (slot, k) in rkeys.iter_mut().zip(&m.rkeys) {
                    *slot = *k;
                }
                LlcMessage::DeleteRkey(DeleteRkey {
                    flags: m.flags,
                    num_rkeys: m.rkeys.len() as u8,
                    err_mask: m.num_inval_rkeys,
                    rkeys,
                })
            }
            other => other,
        }
    }

    /// The message's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.buffer_len()];
        self.emit(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_byte0() {
        assert_eq!(classify(0xFE), MsgKind::Cdc);
        assert_eq!(classify(0x01), MsgKind::Llc(LlcType::ConfirmLink));
        assert_eq!(classify(0x25), MsgKind::Llc(LlcType::ReqAddLinkV2));
        assert_eq!(classify(0x0A), MsgKind::Unknown(0x0A));
        assert_eq!(classify(0x23), MsgKind::Unknown(0x23));
        for b in 0..=255u8 {
            assert_eq!(LlcType::from_code(b).code(), b);
        }
    }

    #[test]
    fn type_nibbles() {
        assert_eq!(LlcType::ReqAddLinkV2.version(), 2);
        assert_eq!(LlcType::ReqAddLinkV2.base(), LlcType::ReqAddLink.code());
        assert_eq!(LlcType::DeleteRkey.version(), 0);
    }

    #[test]
    fn reason_codes_round_trip() {
        for c in [
            0, 0x10000, 0x20000, 0x30000, 0x40000, 0x50000, 0x100000, 0x200000, 7,
        ] {
            assert_eq!(DeleteLinkReason::from_code(c).code(), c);
        }
        for c in 0..16 {
            assert_eq!(AddLinkRejectReason::from_code(c).code(), c);
        }
    }

    #[test]
    fn flags_keep_unknown_bits_and_name_aliases() {
        let f = LlcFlags::from_bits_retain(0xcc);
        assert_eq!(LlcFlags::KNOWN.bits(), 0xf3);
        assert_eq!(f.unknown_bits(), 0x0c);
        assert_eq!(
            format!("{f:?}"),
            "LlcFlags(0xcc: RESPONSE | ADD_LINK_REJECT | DELETE_LINK_ALL | unknown 0x0c)"
        );
        // Either bit of the two-bit CONFIRM_LINK flag counts, as in the kernel.
        assert!(LlcFlags::from_bits_retain(0x01).no_rmbe_eyecatcher());
        assert!(!LlcFlags::from_bits_retain(0x01).contains(LlcFlags::NO_RMBE_EYECATCHER));

        let msg = LlcMessage::TestLink(TestLink {
            flags: f,
            user_data: [7; 16],
        });
        let wire = msg.to_bytes();
        assert_eq!(wire[3], 0xcc);
        let back = LlcMessage::parse(&wire).unwrap();
        assert_eq!(back.flags().bits(), 0xcc);
        assert_eq!(back.to_bytes(), wire);
    }
}
