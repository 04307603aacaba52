//! The server's side of the CLC handshake (`smc_listen_work`, `smc_listen_find_device`,
//! `smc_listen_ism_init`): the client's Proposal, buffers, the Accept, the client's Confirm,
//! then the client's buffer attached.

use super::decide::{self, ConfirmInfo, LocalCaps, ProposalInfo};
use super::{CLC_WAIT_TIME, ClcReader, Fallback, HandshakeError, LocalBuffer, decline_bytes};
use crate::gid::Gid;
use crate::time::Instant;
use alloc::vec::Vec;
use smc_proto::clc::{ClcMessage, ReasonCode, SMC_V2};

/// What the driver must do next.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerEvent {
    /// The Proposal is acceptable: pick the link group (an existing one with the client below
    /// its connection limit, else a new one: first contact), take a buffer in it, and answer
    /// with [`ServerHandshake::buffers`].
    NeedBuffers(ProposalInfo),
    /// The client confirmed: attach its buffer and answer with [`ServerHandshake::attached`].
    NeedAttach(ConfirmInfo),
    /// SMC is up.
    Established {
        /// What the Proposal said.
        proposal: ProposalInfo,
        /// What the Confirm said.
        confirm: ConfirmInfo,
        /// Our buffer.
        own: LocalBuffer,
        /// The link group is new.
        first_contact: bool,
    },
    /// Continue over TCP (a Decline may be queued to send first). Buffers taken for this
    /// handshake go back.
    Fallback(Fallback),
    /// The connection fails.
    Failed(HandshakeError),
}

#[derive(Debug, Clone)]
enum State {
    AwaitProposal,
    NeedBuffers(ProposalInfo),
    AwaitConfirm(ProposalInfo, LocalBuffer, bool),
    NeedAttach(ProposalInfo, LocalBuffer, bool, ConfirmInfo),
    Done,
}

/// The server's handshake.
#[derive(Debug, Clone)]
pub struct ServerHandshake {
    caps: LocalCaps,
    client: Option<Gid>,
    state: State,
    reader: ClcReader,
    out: Vec<u8>,
    deadline: Option<Instant>,
    version: u8,
}

impl ServerHandshake {
    /// Starts a handshake on an accepted TCP connection known to carry a Proposal from the
    /// client with GID `client` (the driver checks [`super::starts_with_clc`] first). The
    /// whole Proposal is due [`CLC_WAIT_TIME`] after `now`: a driver that peeked before it made
    /// the machine passes the accept's instant, so the peek does not extend the deadline.
    pub fn new(caps: LocalCaps, client: Gid, now: Instant) -> Self {
        Self::with_client(caps, Some(client), now)
    }

    /// [`Self::new`] for a client smcd did not announce (it said "SMC" with the TCP option,
    /// as the kernel's clients do): its GID is the one its Proposal offers.
    pub fn unannounced(caps: LocalCaps, now: Instant) -> Self {
        Self::with_client(caps, None, now)
    }

    fn with_client(caps: LocalCaps, client: Option<Gid>, now: Instant) -> Self {
        Self {
            caps,
            client,
            state: State::AwaitProposal,
            reader: ClcReader::new(),
            out: Vec::new(),
            deadline: Some(now + CLC_WAIT_TIME),
            version: SMC_V2,
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
            State::AwaitProposal | State::AwaitConfirm(..) => self.reader.wants(),
            _ => 0,
        }
    }

    /// Bytes read from the TCP connection (at most [`Self::wants`]).
    pub fn on_bytes(&mut self, data: &[u8]) -> Option<ServerEvent> {
        if self.wants() == 0 {
            return None;
        }
        let msg = match self.reader.push(data)? {
            Ok(m) => m,
            Err(e) => return Some(self.decline(e.decline_reason())),
        };
        self.deadline = None;
        match core::mem::replace(&mut self.state, State::Done) {
            State::AwaitProposal => {
                if let ClcMessage::Proposal(p) = &msg {
                    self.version = p.version;
                }
                Some(
                    match decide::server_check_proposal(msg, &self.caps, self.client) {
                        Ok(info) => {
                            self.state = State::NeedBuffers(info.clone());
                            ServerEvent::NeedBuffers(info)
                        }
                        Err(r) => self.refuse(r),
                    },
                )
            }
            State::AwaitConfirm(info, own, first_contact) => Some(
                match decide::server_check_confirm(msg, &info, first_contact) {
                    Ok(ci) => {
                        self.state = State::NeedAttach(info, own, first_contact, ci.clone());
                        ServerEvent::NeedAttach(ci)
                    }
                    Err(r) => self.refuse(r),
                },
            ),
            other => {
                self.state = other;
                None
            }
        }
    }

    /// The TCP connection ended before the handshake did.
    pub fn on_eof(&mut self) -> ServerEvent {
        self.state = State::Done;
        self.deadline = None;
        ServerEvent::Failed(HandshakeError::PeerClosed)
    }

    /// The answer to [`ServerEvent::NeedBuffers`]: our buffer and whether its link group is
    /// new (the Accept is queued; the Confirm is awaited from `now`), or the reason to decline.
    pub fn buffers(
        &mut self,
        r: Result<(LocalBuffer, bool), ReasonCode>,
        now: Instant,
    ) -> Option<ServerEvent> {
        let State::NeedBuffers(info) = core::mem::replace(&mut self.state, State::Done) else {
            return None;
        };
        match r {
            Ok((own, first_contact)) => {
                let accept = decide::server_accept(
                    &self.caps,
                    &info,
                    own.token,
                    own.len,
                    own.lgr_id,
                    first_contact,
                );
                self.out
                    .extend_from_slice(&ClcMessage::Accept(accept).to_vec());
                self.state = State::AwaitConfirm(info, own, first_contact);
                self.deadline = Some(now + CLC_WAIT_TIME);
                None
            }
            Err(r) => Some(self.decline(r)),
        }
    }

    /// The answer to [`ServerEvent::NeedAttach`]. After the Confirm there is no way back to
    /// TCP: a buffer that cannot be attached fails the connection.
    pub fn attached(&mut self, ok: bool) -> ServerEvent {
        let State::NeedAttach(proposal, own, first_contact, confirm) =
            core::mem::replace(&mut self.state, State::Done)
        else {
            return ServerEvent::Failed(HandshakeError::AttachFailed);
        };
        if !ok {
            return ServerEvent::Failed(HandshakeError::AttachFailed);
        }
        ServerEvent::Established {
            proposal,
            confirm,
            own,
            first_contact,
        }
    }

    /// Our buffer, once [`Self::buffers`] gave one and until the handshake ends.
    pub fn own_buffer(&self) -> Option<(LocalBuffer, bool)> {
        match &self.state {
            State::AwaitConfirm(_, own, fc) | State::NeedAttach(_, own, fc, _) => Some((*own, *fc)),
            _ => None,
        }
    }

    fn refuse(&mut self, r: decide::Refusal) -> ServerEvent {
        match r {
            decide::Refusal::Decline(reason) => self.decline(reason),
            other => {
                self.state = State::Done;
                ServerEvent::Fallback(Fallback::from_refusal(other))
            }
        }
    }

    fn decline(&mut self, r: ReasonCode) -> ServerEvent {
        self.state = State::Done;
        self.deadline = None;
        self.out.extend_from_slice(&decline_bytes(r, self.version));
        ServerEvent::Fallback(Fallback::local(r))
    }

    /// When the wait for the client's next message ends.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    /// Time passed: at the deadline the handshake fails (`CLC_WAIT_TIME`, for the whole
    /// message however it trickles in).
    pub fn handle_timeout(&mut self, now: Instant) -> Option<ServerEvent> {
        if self.deadline.is_some_and(|d| now >= d) {
            self.state = State::Done;
            self.deadline = None;
            return Some(ServerEvent::Failed(HandshakeError::TimedOut));
        }
        None
    }
}
