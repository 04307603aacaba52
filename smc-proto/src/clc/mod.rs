//! CLC, the SMC handshake carried over the TCP connection (the kernel's "clcsock"):
//! Proposal, Accept, Confirm and Decline, byte-compatible with Linux `net/smc/smc_clc.[ch]`.
//!
//! | submodule | kernel | what |
//! |---|---|---|
//! | [`header`] | `struct smc_clc_msg_hdr`, `smc_clc_wait_msg()` | eyecatchers, common header, trailer, [`peek_message_len`] |
//! | [`proposal`] | `struct smc_clc_msg_proposal` + areas, `smc_clc_msg_prop_valid()` | [`Proposal`], [`ProposalBuilder`] |
//! | [`accept`] | `struct smc_clc_msg_accept_confirm`, first contact extension | [`AcceptConfirm`] |
//! | [`decline`] | `struct smc_clc_msg_decline[_v2]` | [`Decline`] |
//! | [`reason`] | `SMC_CLC_DECL_*` | [`ReasonCode`] |
//! | [`bufsize`] | `smc_compress_bufsize()` in `smc_core.c` | [`compress_bufsize`], [`uncompress_bufsize`] |
//! | [`types`] | `smc.h`, `smc_ism.h` | [`Eid`], [`Hostname`], [`OsType`], [`SmcdDevice`], constants |
//!
//! # Reading from a stream
//!
//! Peek [`HEADER_LEN`] bytes, call [`peek_message_len`] (never more than
//! [`MAX_MESSAGE_LEN`]), read exactly that many bytes, and hand them to
//! [`ClcMessage::parse`]. Whether the type is the one the handshake expects is the caller's
//! business (a Decline is always acceptable).
//!
//! # Shape
//!
//! Messages have variable layouts located by offsets, so there is no zero-copy view beyond the
//! header ([`ClcHeader`]); each message is a plain repr with `parse(&[u8])`, `validate()`,
//! `buffer_len()` and `emit(&mut [u8])`. Parsers check every length and offset before
//! reading. Emitters write Linux's layout (order, eyecatchers, computed offsets); values that
//! came from `parse` or the constructors are valid, hand-built ones should go through
//! `validate()`, after which `parse(emit(x)) == x`.
//!
//! # Panic contract
//!
//! No function here panics on any input bytes; parsers return a [`ClcError`] that says what
//! was wrong and which Decline reason answers it ([`ClcError::decline_reason`]). `emit`
//! panics only when given a buffer shorter than `buffer_len()`.

pub mod accept;
pub mod bufsize;
pub mod decline;
pub mod error;
pub mod header;
pub mod proposal;
pub mod reason;
pub mod types;

pub use accept::{
    AcceptConfirm, AcceptConfirmBody, AcceptOrConfirm, FceV2x, FirstContactExt, SmcdAcceptConfirm,
    SmcrAcceptConfirm,
};
pub use bufsize::{
    SMCD_DMB_HEADER_LEN, SMCD_MAX_BUFSIZE_CODE, SMCR_MAX_BUFSIZE_CODE, compress_bufsize,
    smcd_dmb_data_len, uncompress_bufsize,
};
pub use decline::Decline;
pub use error::{ClcError, Entries, OffsetField};
pub use header::{
    ClcHeader, ClcType, EYECATCHER_SMCD, EYECATCHER_SMCR, Eyecatcher, HEADER_LEN, MAX_MESSAGE_LEN,
    SMC_V1, SMC_V2, SmcType, TRAILER_LEN, peek_message_len,
};
pub use proposal::{
    GidChid, IpPrefixArea, Ipv6Prefix, Proposal, ProposalBuilder, ProposalSmcd, ProposalV2Ext,
    SmcdV2Ext, SmcrV1Offer, SmcrV2Offer,
};
pub use reason::ReasonCode;
pub use types::{
    Eid, Hostname, LOOPBACK_CHID, OsType, SMC_FEATURE_MASK, SMC_RELEASE_0, SMC_RELEASE_1,
    SmcdDevice, is_emulated_chid,
};

use header::parse_frame;

/// Any CLC message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClcMessage {
    /// Type 1.
    Proposal(Proposal),
    /// Type 2.
    Accept(AcceptConfirm),
    /// Type 3.
    Confirm(AcceptConfirm),
    /// Type 4.
    Decline(Decline),
}

impl ClcMessage {
    /// Parses one complete message; `buf` must be exactly the message (see
    /// [`peek_message_len`]).
    pub fn parse(buf: &[u8]) -> Result<ClcMessage, ClcError> {
        let (hdr, len) = parse_frame(buf)?;
        Ok(match hdr.msg_type {
            ClcType::Proposal => ClcMessage::Proposal(Proposal::parse_body(buf, &hdr, len)?),
            ClcType::Accept => ClcMessage::Accept(AcceptConfirm::parse_body(
                buf,
                &hdr,
                len,
                AcceptOrConfirm::Accept,
            )?),
            ClcType::Confirm => ClcMessage::Confirm(AcceptConfirm::parse_body(
                buf,
                &hdr,
                len,
                AcceptOrConfirm::Confirm,
            )?),
            ClcType::Decline => ClcMessage::Decline(Decline::parse_body(buf, &hdr)),
            // parse_frame's length rule refuses unknown types.
            ClcType::Unknown(t) => return Err(ClcError::UnknownType(t)),
        })
    }

    /// The message type.
    pub fn msg_type(&self) -> ClcType {
        match self {
            ClcMessage::Proposal(_) => ClcType::Proposal,
            ClcMessage::Accept(_) => ClcType::Accept,
            ClcMessage::Confirm(_) => ClcType::Confirm,
            ClcMessage::Decline(_) => ClcType::Decline,
        }
    }

    /// The header version.
    pub fn version(&self) -> u8 {
        match self {
            ClcMessage::Proposal(p) => p.version,
            ClcMessage::Accept(a) | ClcMessage::Confirm(a) => a.version,
            ClcMessage::Decline(d) => d.version,
        }
    }

    /// See the `validate()` of each message.
    pub fn validate(&self) -> Result<(), ClcError> {
        match self {
            ClcMessage::Proposal(p) => p.validate(),
            ClcMessage::Accept(a) => a.validate(AcceptOrConfirm::Accept),
            ClcMessage::Confirm(a) => a.validate(AcceptOrConfirm::Confirm),
            ClcMessage::Decline(d) => d.validate(),
        }
    }

    /// Total length of the emitted message.
    pub fn buffer_len(&self) -> usize {
        match self {
            ClcMessage::Proposal(p) => p.buffer_len(),
            ClcMessage::Accept(a) | ClcMessage::Confirm(a) => a.buffer_len(),
            ClcMessage::Decline(d) => d.buffer_len(),
        }
    }

    /// Writes the message into `buf[..self.buffer_len()]`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`buffer_len`](Self::buffer_len).
    pub fn emit(&self, buf: &mut [u8]) {
        match self {
            ClcMessage::Proposal(p) => p.emit(buf),
            ClcMessage::Accept(a) => a.emit(AcceptOrConfirm::Accept, buf),
            ClcMessage::Confirm(a) => a.emit(AcceptOrConfirm::Confirm, buf),
            ClcMessage::Decline(d) => d.emit(buf),
        }
    }

    /// The message as a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.buffer_len()];
        self.emit(&mut v);
        v
    }
}

impl From<Proposal> for ClcMessage {
    fn from(p: Proposal) -> Self {
        ClcMessage::Proposal(p)
    }
}

impl From<Decline> for ClcMessage {
    fn from(d: Decline) -> Self {
        ClcMessage::Decline(d)
    }
}
