//! The CLC handshake (`af_smc.c`: `__smc_connect`, `smc_listen_work`; `smc_clc.c`) as two state
//! machines that take bytes and return bytes, decisions and reason codes.
//!
//! A driver runs them blocking or non-blocking alike: it writes what
//! [`ClientHandshake::poll_transmit`] / [`ServerHandshake::poll_transmit`] return, reads
//! exactly `wants()` bytes when they are available (never more: what follows the last CLC
//! message belongs to the application) and feeds them to `on_bytes`, answers `NeedBuffers`
//! and `NeedAttach` with what the device gave, and calls `handle_timeout` at the deadline. The
//! outcome is SMC with the facts of the peer, a fallback to TCP with the kernel's reason codes
//! (nothing of the application's stream has been read), or a failure.
//!
//! SMC-R continues after the Confirm with LLC CONFIRM_LINK over the new link; that is its own
//! flow ([`crate::llc`]) and begins where these machines end (`Established`). The SMC-R v2
//! CLC decisions are in [`smcr`]; the machines do not offer SMC-R yet.

pub mod client;
pub mod decide;
pub mod server;
pub mod smcr;

pub use client::{ClientEvent, ClientHandshake};
pub use decide::{LocalCaps, RELEASE, Refusal};
pub use server::{ServerEvent, ServerHandshake};

use alloc::vec::Vec;
use core::fmt;
use core::time::Duration;
use smc_proto::clc::{
    ClcError, ClcMessage, Decline, Eyecatcher, HEADER_LEN, ReasonCode, peek_message_len,
};

/// `CLC_WAIT_TIME`: how long either side waits for the next CLC message, all of it.
pub const CLC_WAIT_TIME: Duration = Duration::from_secs(6);

/// Why a handshake ends without a connection (no fallback is possible).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeError {
    /// The next message did not arrive within [`CLC_WAIT_TIME`].
    TimedOut,
    /// The peer ended the TCP connection during the handshake.
    PeerClosed,
    /// After the Confirm the server could not use the client's buffer: the client already runs
    /// SMC and would not read a Decline, so the connection is reset.
    AttachFailed,
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::TimedOut => "CLC handshake timed out",
            Self::PeerClosed => "peer closed the connection during the CLC handshake",
            Self::AttachFailed => "the peer's buffer could not be attached after its Confirm",
        })
    }
}

/// A fallback to TCP: the local reason, the peer's (from its Decline, or 0), and whether the
/// peer said its link group with us is out of sync (then ours must go).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallback {
    /// Our reason.
    pub local: ReasonCode,
    /// The peer's reason.
    pub peer: ReasonCode,
    /// The peer's Decline had the out-of-sync flag.
    pub out_of_sync: bool,
}

impl Fallback {
    /// A fallback with only a local reason.
    pub const fn local(r: ReasonCode) -> Self {
        Self {
            local: r,
            peer: ReasonCode(0),
            out_of_sync: false,
        }
    }

    fn from_refusal(r: Refusal) -> Self {
        match r {
            Refusal::Decline(r) => Self::local(r),
            Refusal::PeerDeclined { peer, out_of_sync } => Self {
                local: ReasonCode::PEERDECL,
                peer,
                out_of_sync,
            },
        }
    }
}

/// A buffer this side offers: the token (DMB) or key the peer names it by, and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalBuffer {
    /// The DMB token.
    pub token: u64,
    /// The DMB size (what the compressed size code describes).
    pub len: usize,
    /// This side's id of the link group the connection is in.
    pub lgr_id: u32,
}

/// Whether a stream whose first bytes are `peeked` starts with a CLC message: `Some(false)`
/// means plain TCP (an application that speaks first, or a client that is not SMC), `None`
/// that fewer than four bytes have arrived.
pub fn starts_with_clc(peeked: &[u8]) -> Option<bool> {
    let b: [u8; 4] = peeked.get(..4)?.try_into().ok()?;
    Some(Eyecatcher::from_bytes(b).is_some())
}

/// Stream framing of CLC messages: the 8-byte header, then exactly the rest of the length it
/// gives (the kernel's `smc_clc_wait_msg` peeks the header the same way).
#[derive(Debug, Clone, Default)]
pub struct ClcReader {
    buf: Vec<u8>,
    need: usize,
}

impl ClcReader {
    /// A reader waiting for a message.
    pub fn new() -> Self {
        Self {
            buf: Vec::with_capacity(64),
            need: HEADER_LEN,
        }
    }

    /// How many more bytes the current message needs. Read at most this many.
    pub fn wants(&self) -> usize {
        self.need - self.buf.len()
    }

    /// Takes bytes (at most [`Self::wants`]; the rest is ignored). Returns the message once it
    /// is complete, or the error of a malformed one (which is to be declined).
    pub fn push(&mut self, data: &[u8]) -> Option<Result<ClcMessage, ClcError>> {
        let take = data.len().min(self.wants());
        self.buf.extend_from_slice(&data[..take]);
        if self.wants() > 0 {
            return None;
        }
        if self.need == HEADER_LEN {
            match peek_message_len(&self.buf) {
                Ok(len) if len > HEADER_LEN => {
                    self.need = len;
                    return None;
                }
                Ok(_) => {}
                Err(e) => {
                    self.reset();
                    return Some(Err(e));
                }
            }
        }
        let msg = ClcMessage::parse(&self.buf);
        self.reset();
        Some(msg)
    }

    fn reset(&mut self) {
        self.buf.clear();
        self.need = HEADER_LEN;
    }
}

fn decline_bytes(reason: ReasonCode, version: u8) -> Vec<u8> {
    ClcMessage::Decline(Decline::new(reason, version)).to_vec()
}
