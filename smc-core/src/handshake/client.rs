//! The client's side of the CLC handshake (`__smc_connect`, `smc_connect_ism`): Proposal,
//! then the server's Accept or Decline, then buffers, then the Confirm.

use super::decide::{self, AcceptInfo, LocalCaps};
use super::{CLC_WAIT_TIME, ClcReader, Fallback, HandshakeError, LocalBuffer, decline_bytes};
use crate::gid::Gid;
use crate::time::Instant;
use alloc::vec::Vec;
use smc_proto::clc::{ClcMessage, ReasonCode, SMC_V2};

/// What the driver must do next.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientEvent {
    /// The server accepted: find the link group (`first_contact`: a new one; else the existing
    /// one to the server's GID, or decline with `SYNCERR`), take a buffer of our own in it and
    /// attach the server's, then answer with [`ClientHandshake::buffers`].
    NeedBuffers(AcceptInfo),
    /// SMC is up (the Confirm is queued): these are the facts.
    Established {
        /// What the server's Accept said.
        accept: AcceptInfo,
        /// Our buffer.
        own: LocalBuffer,
    },
    /// Continue over TCP (a Decline may be queued to send first).
    Fallback(Fallback),
    /// The connection fails.
    Failed(HandshakeError),
}

#[derive(Debug, Clone)]
enum State {
    AwaitAccept,
    NeedBuffers(AcceptInfo),
    Done,
}

/// The client's handshake.
#[derive(Debug, Clone)]
pub struct ClientHandshake {
    caps: LocalCaps,
    expected: Option<Gid>,
    state: State,
    reader: ClcReader,
    out: Vec<u8>,
    deadline: Option<Instant>,
}

impl ClientHandshake {
    /// Starts a handshake on a connected TCP socket: the Proposal is queued. `expected` is the
    /// server's GID when it is known in advance (then an Accept from another GID is declined).
    pub fn new(caps: LocalCaps, expected: Option<Gid>, now: Instant) -> Self {
        let out = ClcMessage::from(decide::client_proposal(&caps)).to_vec();
        Self {
            caps,
            expected,
            state: State::AwaitAccept,
            reader: ClcReader::new(),
            out,
            deadline: Some(now + CLC_WAIT_TIME),
        }
    }

    /// What this side brings.
    pub fn caps(&self) -> &LocalCaps {
        &self.caps
    }

    /// Bytes to write to the TCP connection now.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        (!self.out.is_empty()).then(|| core::mem::take(&mut self.out))
    }

    /// How many bytes to read next (0: none now).
    pub fn wants(&self) -> usize {
        match self.state {
            State::AwaitAccept => self.reader.wants(),
            _ => 0,
        }
    }

    /// Bytes read from the TCP connection (at most [`Self::wants`]).
    pub fn on_bytes(&mut self, data: &[u8]) -> Option<ClientEvent> {
        if !matches!(self.state, State::AwaitAccept) {
            return None;
        }
        let msg = match self.reader.push(data)? {
            Ok(m) => m,
            Err(e) => return Some(self.decline(e.decline_reason())),
        };
        self.deadline = None;
        Some(
            match decide::client_check_accept(msg, &self.caps, self.expected) {
                Ok(info) => {
                    self.state = State::NeedBuffers(info.clone());
                    ClientEvent::NeedBuffers(info)
                }
                Err(decide::Refusal::Decline(r)) => self.decline(r),
                Err(refusal) => {
                    self.state = State::Done;
                    ClientEvent::Fallback(Fallback::from_refusal(refusal))
                }
            },
        )
    }

    /// The TCP connection ended before the handshake did.
    pub fn on_eof(&mut self) -> ClientEvent {
        self.state = State::Done;
        self.deadline = None;
        ClientEvent::Failed(HandshakeError::PeerClosed)
    }

    /// The answer to [`ClientEvent::NeedBuffers`]: our buffer (the Confirm is queued and SMC
    /// is up), or the reason to decline with.
    pub fn buffers(&mut self, r: Result<LocalBuffer, ReasonCode>) -> ClientEvent {
        let State::NeedBuffers(info) = core::mem::replace(&mut self.state, State::Done) else {
            return ClientEvent::Failed(HandshakeError::PeerClosed);
        };
        match r {
            Ok(own) => {
                let confirm =
                    decide::client_confirm(&self.caps, &info, own.lgr_id, own.token, own.len);
                self.out
                    .extend_from_slice(&ClcMessage::Confirm(confirm).to_vec());
                ClientEvent::Established { accept: info, own }
            }
            Err(r) => self.decline(r),
        }
    }

    fn decline(&mut self, r: ReasonCode) -> ClientEvent {
        self.state = State::Done;
        self.deadline = None;
        self.out.extend_from_slice(&decline_bytes(r, SMC_V2));
        ClientEvent::Fallback(Fallback::local(r))
    }

    /// When the wait for the server's answer ends.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    /// Time passed: at the deadline the handshake fails (`CLC_WAIT_TIME`).
    pub fn handle_timeout(&mut self, now: Instant) -> Option<ClientEvent> {
        if self.deadline.is_some_and(|d| now >= d) {
            self.state = State::Done;
            self.deadline = None;
            return Some(ClientEvent::Failed(HandshakeError::TimedOut));
        }
        None
    }
}
