//! Typed CLC parse/validation errors and the Decline reason each one maps to.

use super::header::{ClcType, SmcType};
use super::reason::ReasonCode;

/// Which offset field of a Proposal was out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OffsetField {
    /// `iparea_offset` (base, bytes 38-39): from byte 40 to the IP prefix area.
    IpArea,
    /// `v2_ext_offset` (SMC-D area, bytes 50-51): from byte 52 to the v2 extension.
    V2Ext,
    /// `smcd_v2_ext_offset` (v2 extension bytes 6-7): from its byte 8 to the SMC-Dv2 extension.
    SmcdV2Ext,
}

impl core::fmt::Display for OffsetField {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            OffsetField::IpArea => "iparea_offset",
            OffsetField::V2Ext => "v2_ext_offset",
            OffsetField::SmcdV2Ext => "smcd_v2_ext_offset",
        })
    }
}

/// A counted list with a protocol maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Entries {
    /// IPv6 prefixes in a Proposal (max 8).
    Ipv6Prefixes,
    /// User EIDs in the v2 extension (max 8).
    UserEids,
    /// GID/CHID entries in the SMC-Dv2 extension (max 8).
    IsmGids,
    /// GIDs in the SMC-R v2 Confirm GID list (max 2).
    ConfirmGids,
}

impl core::fmt::Display for Entries {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Entries::Ipv6Prefixes => "IPv6 prefixes",
            Entries::UserEids => "user EIDs",
            Entries::IsmGids => "ISM GID/CHID entries",
            Entries::ConfirmGids => "Confirm GID list entries",
        })
    }
}

/// Why a CLC message could not be parsed, or why a value cannot be emitted as a valid one.
///
/// The Linux kernel answers every malformed CLC message with `-EPROTO` (the connection fails,
/// no Decline, no fallback). This project's rule is "malformed CLC → Decline with a reason and
/// fallback", so each error also names the reason to put in that Decline
/// ([`decline_reason`](Self::decline_reason)); [`KERNEL_ERRNO`](Self::KERNEL_ERRNO) is what the
/// kernel would record instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClcError {
    /// The buffer ends before the message does.
    #[error("truncated CLC message: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// The buffer holds more bytes than the header's length.
    #[error("buffer holds {buffer} bytes but the CLC header says {header}")]
    TrailingBytes {
        /// Length from the header.
        header: usize,
        /// Length of the buffer handed to the parser.
        buffer: usize,
    },
    /// The header does not start with "SMCR" or "SMCD" (EBCDIC).
    #[error("bad CLC eyecatcher {0:02x?} (want SMCR e2d4c3d9 or SMCD e2d4c3c4)")]
    BadEyecatcher([u8; 4]),
    /// The last four bytes are not an eyecatcher.
    #[error("bad CLC trailer {0:02x?} (want SMCR e2d4c3d9 or SMCD e2d4c3c4)")]
    BadTrailer([u8; 4]),
    /// Header byte 4 is not 1-4.
    #[error("unknown CLC message type {0}")]
    UnknownType(u8),
    /// Version 0 (the kernel rejects versions below 1), or above 15 when emitting.
    #[error("bad CLC version {0}")]
    BadVersion(u8),
    /// An exactly-sized message (v1 Accept/Confirm, Decline, Proposal by its own layout) has
    /// another length.
    #[error("{msg} length {header} does not match the {expected} its layout needs")]
    LengthMismatch {
        /// Message type.
        msg: ClcType,
        /// Length from the header.
        header: usize,
        /// Length the layout needs.
        expected: usize,
    },
    /// Shorter than the minimum for this type and version.
    #[error("{msg} length {len} is below the minimum {min}")]
    TooShort {
        /// Message type.
        msg: ClcType,
        /// Length from the header.
        len: usize,
        /// Minimum.
        min: usize,
    },
    /// Longer than the maximum for this type and version.
    #[error("{msg} length {len} is above the maximum {max}")]
    TooLong {
        /// Message type.
        msg: ClcType,
        /// Length from the header.
        len: usize,
        /// Maximum (see [`MAX_MESSAGE_LEN`](super::MAX_MESSAGE_LEN)).
        max: usize,
    },
    /// An offset is zero where an area must exist, above the kernel's limit, or makes its
    /// area run past the trailer.
    #[error(
        "{field} {value} is invalid: zero, beyond the kernel's limit, or its area runs past the message end"
    )]
    BadOffset {
        /// Which field.
        field: OffsetField,
        /// Its value.
        value: u16,
    },
    /// A count above its protocol maximum.
    #[error("too many {what}: {count} (max {max})")]
    TooMany {
        /// Which list.
        what: Entries,
        /// Count from the message (or the value).
        count: usize,
        /// Protocol maximum.
        max: usize,
    },
    /// An SMC type the message cannot carry: an Accept/Confirm must be R or D, a v1 Proposal
    /// must propose something.
    #[error("{msg} cannot have typev1 {typev1:?}")]
    BadSmcType {
        /// Message type.
        msg: ClcType,
        /// The offending `typev1`.
        typev1: SmcType,
    },
    /// A v2 Accept/Confirm with the first-contact bit set has no room for the 36-byte first
    /// contact extension.
    #[error(
        "v2 first-contact {msg} lacks the first contact extension ({room} bytes before the trailer, need 36)"
    )]
    MissingFirstContactExt {
        /// Message type.
        msg: ClcType,
        /// Bytes available.
        room: usize,
    },
    /// Emit-side only: a value whose fields disagree with each other (e.g. an IP area on a
    /// Proposal whose `typev1` is N). Such a value would not parse back to itself.
    #[error("inconsistent CLC value: {0}")]
    Inconsistent(&'static str),
}

impl ClcError {
    /// What the Linux kernel does with any malformed CLC message: `smc_clc_wait_msg()` returns
    /// `-EPROTO` (71) and the handshake fails without a Decline or fallback.
    pub const KERNEL_ERRNO: i32 = 71;

    /// The reason code to send in the Decline that answers this error.
    ///
    /// The kernel never declines a malformed message (see [`KERNEL_ERRNO`](Self::KERNEL_ERRNO)),
    /// so these are our choices, picked so a peer's `smcss` shows something meaningful:
    /// a bad version → `VERSMISMAT`; an Accept/Confirm of neither R nor D → `MODEUNSUPP`;
    /// a missing/broken v2 extension → `NOV2EXT`; a missing/broken SMC-Dv2 extension →
    /// `NOV2DEXT` (what the kernel's server decides when `smc_get_clc_smcd_v2_ext()` finds no
    /// extension); everything else (framing, lengths, counts) → `CNFERR`, the generic
    /// "configuration error".
    pub fn decline_reason(&self) -> ReasonCode {
        match self {
            ClcError::BadVersion(_) => ReasonCode::VERSMISMAT,
            ClcError::BadSmcType { msg, .. } if *msg != ClcType::Proposal => ReasonCode::MODEUNSUPP,
            ClcError::BadOffset {
                field: OffsetField::V2Ext,
                ..
            }
            | ClcError::TooMany {
                what: Entries::UserEids,
                ..
            } => ReasonCode::NOV2EXT,
            ClcError::BadOffset {
                field: OffsetField::SmcdV2Ext,
                ..
            }
            | ClcError::TooMany {
                what: Entries::IsmGids,
                ..
            } => ReasonCode::NOV2DEXT,
            _ => ReasonCode::CNFERR,
        }
    }
}
