//! CLC Decline, v1 (28 bytes) and v2 (44 bytes): `struct smc_clc_msg_decline[_v2]` in
//! `net/smc/smc_clc.h`; `smc_clc_send_decline()` and `smc_clc_msg_decl_valid()` in
//! `smc_clc.c`.
//!
//! Linux sends a Decline with the version of the Proposal it answers, always with SMCR
//! eyecatchers, sets the header's 0x08 bit (*out of sync*) exactly when the reason is
//! `SYNCERR`, and fills the peer id only when it has an SMC-R system id and the link group is
//! not SMC-D. The receiver does not check a Decline's trailer, and neither do we.

use super::error::ClcError;
use super::header::{
    ClcHeader, ClcType, Eyecatcher, SMC_V1, SMC_V2, SmcType, emit_frame, parse_frame,
};
use super::proposal::Proposal;
use super::reason::ReasonCode;
use super::types::{OsType, PeerId};
use crate::wire::{array, be32, put_be32};

/// v1 Decline length.
pub const DECLINE_LEN_V1: usize = 28;
/// v2 Decline length.
pub const DECLINE_LEN_V2: usize = 44;
/// Number of extra v2 diagnosis codes (`SMC_DECL_DIAG_COUNT_V2`).
pub const DECL_DIAG_COUNT_V2: usize = 4;

/// A CLC Decline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decline {
    /// Version (Linux: the Proposal's).
    pub version: u8,
    /// Header bit 0x08: the sender's link group is out of sync; the receiver must mark its
    /// link group `sync_err` and terminate it.
    pub out_of_sync: bool,
    /// Sender's SMC-R system id (zero for SMC-D link groups and hosts without RoCE).
    pub peer_id: PeerId,
    /// Peer diagnosis: why the sender declines.
    pub reason: ReasonCode,
    /// Sender's OS (Linux: [`OsType::Linux`] in v2, [`OsType::Unset`] in v1).
    pub os_type: OsType,
    /// v2: four more diagnosis codes (Linux sends zeros; ignored in v1).
    pub diag_v2: [ReasonCode; DECL_DIAG_COUNT_V2],
}

impl Decline {
    /// The Decline Linux would send for `reason` with `version` (use the Proposal's version,
    /// or 1 if none was received): out-of-sync iff `SYNCERR`, OS type Linux in v2, no peer id.
    pub fn new(reason: ReasonCode, version: u8) -> Decline {
        Decline {
            version,
            out_of_sync: reason == ReasonCode::SYNCERR,
            peer_id: [0; 8],
            reason,
            os_type: if version >= SMC_V2 {
                OsType::Linux
            } else {
                OsType::Unset
            },
            diag_v2: [ReasonCode(0); DECL_DIAG_COUNT_V2],
        }
    }

    /// The Decline a Linux server sends in answer to `proposal`: version 2 if the Proposal's
    /// version is above 1 (`smc_listen_work()`), else 1; see [`new`](Self::new).
    pub fn reply_to(reason: ReasonCode, proposal: &Proposal) -> Decline {
        let version = if proposal.version > SMC_V1 {
            SMC_V2
        } else {
            SMC_V1
        };
        Decline::new(reason, version)
    }

    /// Parses a complete Decline (`buf` is exactly the message).
    pub fn parse(buf: &[u8]) -> Result<Decline, ClcError> {
        let (hdr, _len) = parse_frame(buf)?;
        if hdr.msg_type != ClcType::Decline {
            return Err(ClcError::UnknownType(hdr.msg_type.into()));
        }
        Ok(Self::parse_body(buf, &hdr))
    }

    pub(crate) fn parse_body(buf: &[u8], hdr: &ClcHeader) -> Decline {
        let mut diag_v2 = [ReasonCode(0); DECL_DIAG_COUNT_V2];
        if hdr.is_v2() {
            for (i, d) in diag_v2.iter_mut().enumerate() {
                *d = ReasonCode(be32(buf, 24 + 4 * i));
            }
        }
        Decline {
            version: hdr.version,
            out_of_sync: hdr.flag(),
            peer_id: array(buf, 8),
            reason: ReasonCode(be32(buf, 16)),
            os_type: OsType::from_nibble(buf[20] >> 4),
            diag_v2,
        }
    }

    /// Checks version 1-15 and that a v1 value has no v2 diagnosis codes.
    pub fn validate(&self) -> Result<(), ClcError> {
        if self.version < SMC_V1 || self.version > 15 {
            return Err(ClcError::BadVersion(self.version));
        }
        if self.version == SMC_V1 && self.diag_v2.iter().any(|d| d.0 != 0) {
            return Err(ClcError::Inconsistent(
                "a v1 Decline has no extra diagnosis codes",
            ));
        }
        Ok(())
    }

    /// 28 for v1, 44 for v2.
    pub fn buffer_len(&self) -> usize {
        if self.version >= SMC_V2 {
            DECLINE_LEN_V2
        } else {
            DECLINE_LEN_V1
        }
    }

    /// Writes the message into `buf[..self.buffer_len()]` with SMCR eyecatchers.
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
                msg_type: ClcType::Decline,
                length: total as u16,
                version: self.version,
                typev2: if self.out_of_sync {
                    SmcType::None // 0b10: SMC_FIRST_CONTACT_MASK
                } else {
                    SmcType::R
                },
                typev1: SmcType::R,
            },
            total,
        );
        buf[8..16].copy_from_slice(&self.peer_id);
        put_be32(buf, 16, self.reason.0);
        buf[20] = self.os_type.nibble() << 4;
        if self.version >= SMC_V2 {
            for (i, d) in self.diag_v2.iter().enumerate() {
                put_be32(buf, 24 + 4 * i, d.0);
            }
        }
    }

    /// The message as a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.buffer_len()];
        self.emit(&mut v);
        v
    }
}
