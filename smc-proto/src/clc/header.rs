//! The 8-byte common header and 4-byte trailer every CLC message carries
//! (`struct smc_clc_msg_hdr` / `struct smc_clc_msg_trail` in `net/smc/smc_clc.h`), and the
//! stream-framing rule built on them ([`peek_message_len`]).

use super::error::ClcError;
use crate::wire::{array, be16, put_be16};

/// Length of the common header.
pub const HEADER_LEN: usize = 8;
/// Length of the trailer (a repeated eyecatcher).
pub const TRAILER_LEN: usize = 4;

/// "SMCR" in EBCDIC: header and trailer of Proposals, SMC-R Accept/Confirm and (on Linux) every
/// Decline.
pub const EYECATCHER_SMCR: [u8; 4] = [0xE2, 0xD4, 0xC3, 0xD9];
/// "SMCD" in EBCDIC: header and trailer of SMC-D Accept/Confirm.
pub const EYECATCHER_SMCD: [u8; 4] = [0xE2, 0xD4, 0xC3, 0xC4];

/// Protocol version 1 (`SMC_V1`).
pub const SMC_V1: u8 = 1;
/// Protocol version 2 (`SMC_V2`). Any version above 1 uses the v2 layouts, as in the kernel.
pub const SMC_V2: u8 = 2;

/// The largest CLC message this module accepts: `sizeof(struct smc_clc_msg_proposal_area)`,
/// the biggest Proposal a kernel can send or will accept (8 IPv6 prefixes, 8 user EIDs, 8
/// GID/CHID entries). Linux sends no Accept/Confirm above 196 bytes (SMC-R v2 Confirm with
/// first-contact extension and two GIDs), and its receivers accept v2 Accept/Confirm "≥" the
/// base size and drain any excess; we allow that slack up to this same cap, so a stream reader
/// never allocates more than 652 bytes for one message.
pub const MAX_MESSAGE_LEN: usize = 652;

/// Which eyecatcher a message carries. Receivers accept either, in header and trailer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Eyecatcher {
    /// `E2 D4 C3 D9`.
    Smcr,
    /// `E2 D4 C3 C4`.
    Smcd,
}

impl Eyecatcher {
    /// The four wire bytes.
    pub const fn bytes(self) -> [u8; 4] {
        match self {
            Eyecatcher::Smcr => EYECATCHER_SMCR,
            Eyecatcher::Smcd => EYECATCHER_SMCD,
        }
    }

    /// Recognises either eyecatcher.
    pub fn from_bytes(b: [u8; 4]) -> Option<Self> {
        match b {
            EYECATCHER_SMCR => Some(Eyecatcher::Smcr),
            EYECATCHER_SMCD => Some(Eyecatcher::Smcd),
            _ => None,
        }
    }
}

/// CLC message type (header byte 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClcType {
    /// 1, client → server.
    Proposal,
    /// 2, server → client.
    Accept,
    /// 3, client → server.
    Confirm,
    /// 4, either direction, at any point of the handshake.
    Decline,
    /// Any other value; never accepted by a receiver.
    Unknown(u8),
}

impl From<u8> for ClcType {
    fn from(v: u8) -> Self {
        match v {
            1 => ClcType::Proposal,
            2 => ClcType::Accept,
            3 => ClcType::Confirm,
            4 => ClcType::Decline,
            x => ClcType::Unknown(x),
        }
    }
}

impl From<ClcType> for u8 {
    fn from(t: ClcType) -> u8 {
        match t {
            ClcType::Proposal => 1,
            ClcType::Accept => 2,
            ClcType::Confirm => 3,
            ClcType::Decline => 4,
            ClcType::Unknown(x) => x,
        }
    }
}

impl core::fmt::Display for ClcType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ClcType::Proposal => f.write_str("Proposal"),
            ClcType::Accept => f.write_str("Accept"),
            ClcType::Confirm => f.write_str("Confirm"),
            ClcType::Decline => f.write_str("Decline"),
            ClcType::Unknown(x) => write!(f, "type {x}"),
        }
    }
}

/// The 2-bit SMC type in `typev1`/`typev2` (`SMC_TYPE_R/D/N/B`). All four values are defined,
/// so there is no unknown arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SmcType {
    /// 0: SMC-R only.
    R,
    /// 1: SMC-D only.
    D,
    /// 2: neither.
    #[default]
    None,
    /// 3: both SMC-R and SMC-D.
    Both,
}

impl SmcType {
    /// Decodes the low two bits of `v`.
    pub const fn from_bits(v: u8) -> Self {
        match v & 0b11 {
            0 => SmcType::R,
            1 => SmcType::D,
            2 => SmcType::None,
            _ => SmcType::Both,
        }
    }

    /// The 2-bit wire value.
    pub const fn bits(self) -> u8 {
        match self {
            SmcType::R => 0,
            SmcType::D => 1,
            SmcType::None => 2,
            SmcType::Both => 3,
        }
    }

    /// The kernel's `smc_indicated_type(is_smcd, is_smcr)`.
    pub const fn from_flags(smcr: bool, smcd: bool) -> Self {
        match (smcr, smcd) {
            (true, true) => SmcType::Both,
            (false, true) => SmcType::D,
            (true, false) => SmcType::R,
            (false, false) => SmcType::None,
        }
    }

    /// `smcr_indicated()`: R or B.
    pub const fn smcr(self) -> bool {
        matches!(self, SmcType::R | SmcType::Both)
    }

    /// `smcd_indicated()`: D or B.
    pub const fn smcd(self) -> bool {
        matches!(self, SmcType::D | SmcType::Both)
    }
}

/// Bit 3 of header byte 7 (`SMC_FIRST_CONTACT_MASK` within `typev2`): *first contact* in
/// Accept/Confirm, *out of sync* in Decline.
pub const FLAG_MASK: u8 = 0x08;

/// The common header, decoded. It does not check the type, version or length against each
/// other; [`peek_message_len`] and the message parsers do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClcHeader {
    /// Header eyecatcher.
    pub eyecatcher: Eyecatcher,
    /// Byte 4.
    pub msg_type: ClcType,
    /// Bytes 5-6: total length including header and trailer.
    pub length: u16,
    /// High nibble of byte 7.
    pub version: u8,
    /// Bits 3-2 of byte 7. In Accept/Confirm/Decline only bit 3 ([`FLAG_MASK`]) is used.
    pub typev2: SmcType,
    /// Bits 1-0 of byte 7.
    pub typev1: SmcType,
}

impl ClcHeader {
    /// Decodes the first [`HEADER_LEN`] bytes; fails only on a short buffer or an unknown
    /// eyecatcher.
    pub fn parse(buf: &[u8]) -> Result<Self, ClcError> {
        if buf.len() < HEADER_LEN {
            return Err(ClcError::Truncated {
                need: HEADER_LEN,
                have: buf.len(),
            });
        }
        let eye = array::<4>(buf, 0);
        let eyecatcher = Eyecatcher::from_bytes(eye).ok_or(ClcError::BadEyecatcher(eye))?;
        Ok(ClcHeader {
            eyecatcher,
            msg_type: ClcType::from(buf[4]),
            length: be16(buf, 5),
            version: buf[7] >> 4,
            typev2: SmcType::from_bits(buf[7] >> 2),
            typev1: SmcType::from_bits(buf[7]),
        })
    }

    /// Writes the header into `buf[..8]`. The version is truncated to its nibble.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0..4].copy_from_slice(&self.eyecatcher.bytes());
        buf[4] = self.msg_type.into();
        put_be16(buf, 5, self.length);
        buf[7] = (self.version << 4) | (self.typev2.bits() << 2) | self.typev1.bits();
    }

    /// The 0x08 flag bit: first contact (Accept/Confirm) or out of sync (Decline).
    pub fn flag(&self) -> bool {
        self.typev2.bits() & (FLAG_MASK >> 2) != 0
    }

    /// Whether this message uses the v2 layouts (any version above 1, as the kernel reads it).
    pub fn is_v2(&self) -> bool {
        self.version >= SMC_V2
    }

    /// The `(min, max)` total length this header's type and version allow (the kernel's
    /// `smc_clc_msg_*_valid` rules, with [`MAX_MESSAGE_LEN`] as the ceiling where the kernel
    /// accepts "≥"). Errors for an unknown type, version 0, or an Accept/Confirm whose
    /// `typev1` is neither R nor D.
    pub fn length_bounds(&self) -> Result<(usize, usize), ClcError> {
        if self.version < SMC_V1 {
            return Err(ClcError::BadVersion(self.version));
        }
        let v2 = self.is_v2();
        Ok(match self.msg_type {
            ClcType::Proposal if v2 => (super::proposal::MIN_PROPOSAL_V2_LEN, MAX_MESSAGE_LEN),
            ClcType::Proposal => (
                super::proposal::MIN_PROPOSAL_V1_LEN,
                super::proposal::MAX_PROPOSAL_V1_LEN,
            ),
            ClcType::Accept | ClcType::Confirm => {
                use super::accept::{SMCD_LEN_V1, SMCD_LEN_V2, SMCR_LEN_V1, SMCR_LEN_V2};
                match (self.typev1, v2) {
                    (SmcType::R, false) => (SMCR_LEN_V1, SMCR_LEN_V1),
                    (SmcType::D, false) => (SMCD_LEN_V1, SMCD_LEN_V1),
                    (SmcType::R, true) => (SMCR_LEN_V2, MAX_MESSAGE_LEN),
                    (SmcType::D, true) => (SMCD_LEN_V2, MAX_MESSAGE_LEN),
                    (typev1, _) => {
                        return Err(ClcError::BadSmcType {
                            msg: self.msg_type,
                            typev1,
                        });
                    }
                }
            }
            ClcType::Decline if v2 => (
                super::decline::DECLINE_LEN_V2,
                super::decline::DECLINE_LEN_V2,
            ),
            ClcType::Decline => (
                super::decline::DECLINE_LEN_V1,
                super::decline::DECLINE_LEN_V1,
            ),
            ClcType::Unknown(t) => return Err(ClcError::UnknownType(t)),
        })
    }

    /// Checks `self.length` against [`length_bounds`](Self::length_bounds).
    pub fn check_length(&self) -> Result<usize, ClcError> {
        let (min, max) = self.length_bounds()?;
        let len = usize::from(self.length);
        if min == max && len != min {
            return Err(ClcError::LengthMismatch {
                msg: self.msg_type,
                header: len,
                expected: min,
            });
        }
        if len < min {
            return Err(ClcError::TooShort {
                msg: self.msg_type,
                len,
                min,
            });
        }
        if len > max {
            return Err(ClcError::TooLong {
                msg: self.msg_type,
                len,
                max,
            });
        }
        Ok(len)
    }
}

/// Stream framing: given at least the first [`HEADER_LEN`] bytes of a CLC message, returns its
/// total length (header, body and trailer), after checking the eyecatcher, the type (1-4),
/// the version (≥ 1) and that the length is within the bounds for that type and version (see
/// [`ClcHeader::length_bounds`]; never above [`MAX_MESSAGE_LEN`]).
///
/// A reader peeks 8 bytes, calls this, reads exactly that many bytes and hands them to
/// [`ClcMessage::parse`](super::ClcMessage::parse). It mirrors the kernel's
/// `smc_clc_wait_msg()`, which peeks the header before receiving the rest, except that the
/// kernel leaves the "is this the type I expect" check to the caller's state (so does this).
pub fn peek_message_len(first_bytes: &[u8]) -> Result<usize, ClcError> {
    ClcHeader::parse(first_bytes)?.check_length()
}

/// Everything the message parsers share: header, length bounds, exact buffer length, trailer.
/// Returns the header and the checked length.
pub(crate) fn parse_frame(buf: &[u8]) -> Result<(ClcHeader, usize), ClcError> {
    let hdr = ClcHeader::parse(buf)?;
    let len = hdr.check_length()?;
    if buf.len() < len {
        return Err(ClcError::Truncated {
            need: len,
            have: buf.len(),
        });
    }
    if buf.len() > len {
        return Err(ClcError::TrailingBytes {
            header: len,
            buffer: buf.len(),
        });
    }
    // The kernel skips the trailer check for Declines (smc_clc_msg_hdr_valid sets
    // check_trl = false), so we do too.
    if hdr.msg_type != ClcType::Decline {
        let trl = array::<4>(buf, len - TRAILER_LEN);
        if Eyecatcher::from_bytes(trl).is_none() {
            return Err(ClcError::BadTrailer(trl));
        }
    }
    Ok((hdr, len))
}

/// Writes header and trailer of a message of `total_len` bytes (the repr's `buffer_len()`,
/// which is at least header + trailer). `hdr.length` is written as given; the trailer goes at
/// the real end so an oversized value never makes this index out of range.
pub(crate) fn emit_frame(buf: &mut [u8], hdr: &ClcHeader, total_len: usize) {
    hdr.emit(buf);
    buf[total_len - TRAILER_LEN..total_len].copy_from_slice(&hdr.eyecatcher.bytes());
}

/// A length as the 16-bit header field carries it. Values that cannot be emitted validly
/// are rejected by the reprs' `validate()`; here we only avoid a panic.
pub(crate) fn len16(len: usize) -> u16 {
    u16::try_from(len).unwrap_or(u16::MAX)
}
