//! A generic netlink client over any [`Transport`]: resolves family names with nlctrl
//! (`CTRL_CMD_GETFAMILY`, family id 16) before first use, sends dump and do requests built by
//! `smc_proto::netlink`, and collects replies until the message that ends them: `NLMSG_DONE`
//! for a dump; for a do request with a reply message (`GETFAMILY`, `SYSCTL_GET`/`SET`) that
//! message, for one without (`STATS_RESET`, `ADD_UEID`, ...) the ACK it asks for
//! (`NLM_F_ACK`); an `NLMSG_ERROR` ends any of them. This is what the kernel sends, so no
//! reply is awaited that the server has no reason to send.

use std::collections::HashMap;
use std::io;

use smc_proto::netlink::NlError;
use smc_proto::netlink::ctrl::{CtrlMessage, FamilyInfo, GENL_ID_CTRL};
use smc_proto::netlink::framing::{
    self, GenlPayload, ReplyEnd, collect_replies, parse_family_messages,
};

use crate::error::{self, Error};
use crate::transport::{Endpoint, Transport};

/// Why a request did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The server answered `NLMSG_ERROR` with this errno (positive).
    Errno(i32),
    /// Anything else (transport, malformed reply), already phrased.
    Other(Error),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Other(e)
    }
}

/// The three request shapes and how each one ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `NLM_F_DUMP`: messages, then `NLMSG_DONE`.
    Dump,
    /// A do request answered by one message.
    DoWithReply,
    /// A do request without a reply message: `NLM_F_ACK`, then the ACK.
    DoAck,
}

/// A connection to one netlink server.
#[derive(Debug)]
pub struct Client {
    transport: Box<dyn Transport>,
    seq: u32,
    families: HashMap<String, u16>,
}

impl Client {
    /// Wraps a connected transport.
    pub fn new(transport: Box<dyn Transport>) -> Self {
        Self {
            transport,
            // Any start value works; a recognisable one helps when reading captures.
            seq: 0x5c00_0000,
            families: HashMap::new(),
        }
    }

    /// Who answers.
    pub fn endpoint(&self) -> Endpoint {
        self.transport.endpoint()
    }

    /// The id of family `name`, asked of nlctrl once and remembered.
    pub fn family_id(&mut self, name: &str) -> Result<u16, Failure> {
        if let Some(id) = self.families.get(name) {
            return Ok(*id);
        }
        let replies = self.request(
            GENL_ID_CTRL,
            CtrlMessage::get_family_by_name(name),
            Kind::DoWithReply,
        )?;
        let info = replies
            .iter()
            .find_map(|m| FamilyInfo::from_reply(m).ok())
            .ok_or_else(|| {
                Failure::Other(Error::failed(format!(
                    "{} answered the family lookup for {name} without a family id",
                    self.endpoint()
                )))
            })?;
        self.families.insert(name.to_owned(), info.id);
        Ok(info.id)
    }

    /// Sends a dump request (`NLM_F_REQUEST | NLM_F_DUMP`) and returns every payload up to
    /// `NLMSG_DONE`.
    pub fn dump<T: GenlPayload>(&mut self, family: u16, payload: T) -> Result<Vec<T>, Failure> {
        self.request(family, payload, Kind::Dump)
    }

    /// Sends a do request whose success is one reply message, and returns it.
    pub fn query<T: GenlPayload>(&mut self, family: u16, payload: T) -> Result<Vec<T>, Failure> {
        self.request(family, payload, Kind::DoWithReply)
    }

    /// Sends a do request whose success is only acknowledged (`NLM_F_ACK`).
    pub fn execute<T: GenlPayload>(&mut self, family: u16, payload: T) -> Result<(), Failure> {
        self.request(family, payload, Kind::DoAck).map(|_| ())
    }

    fn request<T: GenlPayload>(
        &mut self,
        family: u16,
        payload: T,
        kind: Kind,
    ) -> Result<Vec<T>, Failure> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let msg = match kind {
            Kind::Dump => framing::dump_request(family, payload, seq, false),
            Kind::DoWithReply => framing::do_request(family, payload, seq, false),
            Kind::DoAck => framing::do_request(family, payload, seq, true),
        };
        let bytes = framing::to_bytes(&msg).map_err(|e| self.malformed("request", &e))?;
        self.transport
            .send(&bytes)
            .map_err(|e| self.io_failure("send", &e))?;
        let mut out = Vec::new();
        loop {
            let record = self
                .transport
                .recv()
                .map_err(|e| self.io_failure("receive", &e))?;
            let msgs = parse_family_messages::<T>(&record, family)
                .map_err(|e| self.malformed("reply", &e))?;
            // Replies to an earlier request (a late ACK) carry another sequence number.
            let ours = msgs.into_iter().filter(|m| m.header.sequence_number == seq);
            let batch = collect_replies(ours);
            out.extend(batch.payloads);
            match batch.end {
                None if kind == Kind::DoWithReply && !out.is_empty() => return Ok(out),
                None => continue,
                Some(ReplyEnd::Done(0)) | Some(ReplyEnd::Ack) => return Ok(out),
                Some(ReplyEnd::Done(code)) | Some(ReplyEnd::Error(code)) => {
                    return Err(Failure::Errno(code.abs()));
                }
            }
        }
    }

    fn io_failure(&self, what: &str, e: &io::Error) -> Failure {
        let msg = match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
                "{} did not answer within {} s",
                self.endpoint(),
                crate::transport::REPLY_TIMEOUT.as_secs()
            ),
            io::ErrorKind::UnexpectedEof => {
                format!("{} closed the connection before answering", self.endpoint())
            }
            _ => format!(
                "{what} to {} failed: {}",
                self.endpoint(),
                e.raw_os_error()
                    .map_or_else(|| e.to_string(), error::errno_text)
            ),
        };
        Failure::Other(Error::failed(msg))
    }

    fn malformed(&self, what: &str, e: &NlError) -> Failure {
        Failure::Other(Error::failed(format!(
            "malformed netlink {what} ({}): {e}",
            self.endpoint()
        )))
    }
}
