//! The control families on smcd's socket: `nlctrl` (family id lookup), the kernel's
//! `SMC_GEN_NETLINK`, and the engine's `SMCD_ENGINE`. One function takes a request record and
//! returns the reply records.
//!
//! This is what `net/netlink/af_netlink.c` (`netlink_rcv_skb`, `netlink_ack`,
//! `netlink_dump_done`) and `net/netlink/genetlink.c` (`genl_family_rcv_msg`) do for a
//! `NETLINK_GENERIC` socket, applied to one seqpacket record:
//!
//! * a record may hold several messages; each is answered in order;
//! * a message without `NLM_F_REQUEST`, or of a netlink control type (< 16), is not
//!   processed; it is acknowledged if it asked for an ACK;
//! * an unknown family id gets `ENOENT`; a payload shorter than the genetlink header
//!   `EINVAL`; a command the family does not have (or not as a dump / not as a do, as the
//!   request's `NLM_F_DUMP` says) `EOPNOTSUPP`; a state-changing command from a caller that
//!   is neither root nor in the admin group `EPERM` (the kernel's `GENL_ADMIN_PERM`); then the
//!   family validates its attributes and runs the command;
//! * a dump is answered with `NLM_F_MULTI` messages and `NLMSG_DONE`, never with an ACK; a
//!   do request with its reply (if the command has one), then the ACK if `NLM_F_ACK` was set;
//!   a failure with `NLMSG_ERROR` carrying `-errno` and the request echoed.
//!
//! Replies are packed into records of at most [`MAX_RECORD`] bytes, each holding whole
//! messages on 4-byte boundaries (clients split them with `framing::split_messages`).
//!
//! The modules: [`nlctrl`] (`CTRL_CMD_GETFAMILY`), [`smc`] (`SMC_GEN_NETLINK`, the kernel's
//! `smc_netlink.c` and the `smc_nl_*` handlers it calls), [`engine`] (`SMCD_ENGINE`: sysctls,
//! namespaces, sockets, statistics reset) and [`netns`] (which namespace a request is about).

pub mod dump;
pub mod engine;
pub mod netns;
pub mod nlctrl;
pub mod smc;

use super::daemon::Daemon;
use super::device::ClientCtx;
use crate::ipc::channel::MAX_RECORD;
pub use dump::Job;
use netlink_packet_core::NetlinkHeader;
use smc_proto::netlink::attr::align4;
use smc_proto::netlink::framing::{
    self, GENL_HDRLEN, GenlPayload, Message, NLM_F_ACK, NLM_F_DUMP, NLM_F_MULTI, NLM_F_REQUEST,
    NLMSG_HDRLEN, NLMSG_MIN_TYPE, RawMessage,
};
use smc_proto::netlink::smc::SmcGenlMessage;

/// Family id smcd serves `SMC_GEN_NETLINK` under.
pub const SMC_FAMILY_ID: u16 = 0x20;
/// Family id smcd serves `SMCD_ENGINE` under.
pub const ENGINE_FAMILY_ID: u16 = 0x21;
/// The fixed id of `nlctrl`.
pub const NLCTRL_ID: u16 = 0x10;

/// A positive errno, as the handlers return it (negated on the wire).
pub type Errno = i32;

/// What a request record gets: the records to send now, and a dump still in progress
/// (whose [`Job::step`]s send the rest, then answer the messages that followed it).
#[derive(Debug, Default)]
pub struct Reply {
    /// Records to send, in order.
    pub records: Vec<Vec<u8>>,
    /// A dump that continues in pages.
    pub job: Option<Job>,
}

/// Handles one request record of a control family: the replies it gets now, and the dump
/// it started, if it did (the messages after a dump request are answered after the dump).
pub fn start(daemon: &mut Daemon, client: &ClientCtx, record: &[u8]) -> Reply {
    start_at(daemon, client, record, 0)
}

/// Handles one request record and runs any dump it starts to the end, in one go: every
/// reply record (tests, and callers that do not page).
pub fn handle(daemon: &mut Daemon, client: &ClientCtx, record: &[u8]) -> Vec<Vec<u8>> {
    let Reply {
        mut records,
        mut job,
    } = start(daemon, client, record);
    while let Some(j) = job {
        let (more, next) = j.step(daemon, client);
        records.extend(more);
        job = next;
    }
    records
}

/// [`start`] from byte `from` of the record (the messages after a finished dump).
pub(crate) fn start_at(
    daemon: &mut Daemon,
    client: &ClientCtx,
    record: &[u8],
    from: usize,
) -> Reply {
    let mut out = Out::default();
    let mut ctx = Ctx { daemon, client };
    let mut pos = from;
    while pos < record.len() {
        let rest = &record[pos..];
        if rest.len() < NLMSG_HDRLEN && pos > 0 && rest.iter().all(|&b| b == 0) {
            break; // padding after the last message
        }
        let header = match framing::peek_header(rest) {
            Ok(h) if (h.length as usize) <= rest.len() => h,
            _ => {
                // The kernel stops reading a buffer at the first message that does not frame;
                // here the client learns why.
                out.error_capped(&loose_header(rest), libc::EINVAL);
                break;
            }
        };
        let len = header.length as usize;
        let raw = RawMessage {
            header,
            payload: &rest[NLMSG_HDRLEN..len],
        };
        handle_message(&mut ctx, &raw, &mut out);
        pos = pos.saturating_add(align4(len));
        if let Some(job) = out.job.take() {
            return Reply {
                records: out.finish(),
                job: Some(job.then(record, pos)),
            };
        }
    }
    Reply {
        records: out.finish(),
        job: None,
    }
}

/// The header of a message that does not frame, from whatever bytes there are.
fn loose_header(bytes: &[u8]) -> NetlinkHeader {
    let mut b = [0u8; NLMSG_HDRLEN];
    let n = bytes.len().min(NLMSG_HDRLEN);
    b[..n].copy_from_slice(&bytes[..n]);
    let mut h = NetlinkHeader::default();
    h.length = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
    h.message_type = u16::from_ne_bytes([b[4], b[5]]);
    h.flags = u16::from_ne_bytes([b[6], b[7]]);
    h.sequence_number = u32::from_ne_bytes([b[8], b[9], b[10], b[11]]);
    h.port_number = u32::from_ne_bytes([b[12], b[13], b[14], b[15]]);
    h
}

fn handle_message(ctx: &mut Ctx<'_>, raw: &RawMessage<'_>, out: &mut Out) {
    let h = raw.header;
    if h.flags & NLM_F_REQUEST == 0 || h.message_type < NLMSG_MIN_TYPE {
        // netlink_rcv_skb: not a request, or a control message: skipped, acked if asked.
        if h.flags & NLM_F_ACK != 0 {
            out.ack(&h);
        }
        return;
    }
    let dump = h.flags & NLM_F_DUMP == NLM_F_DUMP;
    match dispatch(ctx, raw, dump, out) {
        Ok(()) => {
            if !dump && h.flags & NLM_F_ACK != 0 {
                out.ack(&h);
            }
        }
        Err(e) => out.error(raw, e),
    }
}

fn dispatch(
    ctx: &mut Ctx<'_>,
    raw: &RawMessage<'_>,
    dump: bool,
    out: &mut Out,
) -> Result<(), Errno> {
    let ops: fn(u8) -> Option<Op> = match raw.header.message_type {
        NLCTRL_ID => nlctrl::op,
        SMC_FAMILY_ID => smc::op,
        ENGINE_FAMILY_ID => engine::op,
        // genl_rcv_msg: no family with that id.
        _ => return Err(libc::ENOENT),
    };
    if raw.payload.len() < GENL_HDRLEN {
        return Err(libc::EINVAL);
    }
    let cmd = raw.payload[0];
    let op = ops(cmd)
        .filter(|o| if dump { o.dump } else { o.doit })
        .ok_or(libc::EOPNOTSUPP)?;
    if op.admin {
        ctx.require_admin()?;
    }
    let req = Request {
        header: raw.header,
        cmd,
        dump,
        attrs: &raw.payload[GENL_HDRLEN..],
    };
    match raw.header.message_type {
        NLCTRL_ID => nlctrl::handle(ctx, &req, out),
        SMC_FAMILY_ID => smc::handle(ctx, &req, out),
        _ => engine::handle(ctx, &req, out),
    }
}

/// What a family offers for one command (the kernel's `genl_ops` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    /// Has a dump handler.
    pub dump: bool,
    /// Has a do handler.
    pub doit: bool,
    /// Needs the admin permission.
    pub admin: bool,
}

impl Op {
    /// A dump anyone may run.
    pub const DUMP: Op = Op {
        dump: true,
        doit: false,
        admin: false,
    };
    /// A do command anyone may run.
    pub const DO: Op = Op {
        dump: false,
        doit: true,
        admin: false,
    };
    /// A do command that changes state.
    pub const ADMIN_DO: Op = Op {
        dump: false,
        doit: true,
        admin: true,
    };
}

/// One request message, split up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    /// Its netlink header.
    pub header: NetlinkHeader,
    /// The genetlink command.
    pub cmd: u8,
    /// Whether it is a dump request.
    pub dump: bool,
    /// The attribute stream after the genetlink header.
    pub attrs: &'a [u8],
}

/// What a handler works with: the daemon and who is asking.
#[derive(Debug)]
pub(crate) struct Ctx<'a> {
    pub daemon: &'a mut Daemon,
    pub client: &'a ClientCtx,
}

impl Ctx<'_> {
    /// The caller's network namespace (the kernel's `sock_net(skb->sk)`): the one it was in
    /// when it connected, else the one its process is in now.
    pub fn caller_netns(&self) -> Result<u64, Errno> {
        if self.client.netns != 0 {
            return Ok(self.client.netns);
        }
        super::device::netns_of_pid(self.client.pid).map_err(|_| libc::ESRCH)
    }

    /// `EPERM` unless the caller is root or in the admin group (primary or supplementary).
    pub fn require_admin(&self) -> Result<(), Errno> {
        if is_admin(self.client, self.daemon.admin_gid) {
            Ok(())
        } else {
            Err(libc::EPERM)
        }
    }
}

/// Whether a client may change state: uid 0, or a member of `admin_gid`.
pub fn is_admin(client: &ClientCtx, admin_gid: Option<u32>) -> bool {
    if client.uid == 0 {
        return true;
    }
    let Some(g) = admin_gid else { return false };
    if client.gid == g {
        return true;
    }
    supplementary_groups(client.pid).is_some_and(|gs| gs.contains(&g))
}

/// The supplementary groups of a process (`Groups:` in `/proc/PID/status`).
fn supplementary_groups(pid: u32) -> Option<Vec<u32>> {
    if pid == 0 {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Groups:"))?;
    Some(
        line.split_whitespace()
            .filter_map(|g| g.parse().ok())
            .collect(),
    )
}

/// Reply records under construction.
#[derive(Debug, Default)]
pub(crate) struct Out {
    records: Vec<Vec<u8>>,
    cur: Vec<u8>,
    /// A dump the current request started, to be continued in pages.
    job: Option<Job>,
}

impl Out {
    /// Appends one encoded message, starting a new record when this one would grow past
    /// [`MAX_RECORD`].
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        let start = align4(self.cur.len());
        if !self.cur.is_empty() && start + b.len() > MAX_RECORD {
            self.records.push(std::mem::take(&mut self.cur));
        }
        let start = align4(self.cur.len());
        self.cur.resize(start, 0);
        self.cur.extend_from_slice(b);
    }

    /// Appends a message.
    pub fn msg<T: GenlPayload>(&mut self, m: &Message<T>) {
        match framing::to_bytes(m) {
            Ok(b) => self.bytes(&b),
            // Only a value longer than an attribute can carry fails; none of ours can.
            Err(e) => tracing::warn!("control reply not encodable: {e}"),
        }
    }

    /// The reply to a do request.
    pub fn reply<T: GenlPayload>(&mut self, family: u16, req: &NetlinkHeader, payload: T) {
        self.msg(&framing::do_reply(family, req, payload));
    }

    /// A whole dump: one `NLM_F_MULTI` message per item, then `NLMSG_DONE`.
    pub fn dump<T: GenlPayload>(
        &mut self,
        family: u16,
        req: &NetlinkHeader,
        items: impl IntoIterator<Item = T>,
    ) {
        for p in items {
            let m = framing::message(family, p, NLM_F_MULTI, req.sequence_number, req.port_number);
            self.msg(&m);
        }
        self.msg(&framing::done::<SmcGenlMessage>(req));
    }

    fn ack(&mut self, req: &NetlinkHeader) {
        self.msg(&framing::ack::<SmcGenlMessage>(req));
    }

    /// `NLMSG_ERROR` with the whole request echoed, or only its header when the echo would
    /// not fit a record.
    fn error(&mut self, raw: &RawMessage<'_>, errno: Errno) {
        if NLMSG_HDRLEN + 4 + NLMSG_HDRLEN + raw.payload.len() <= MAX_RECORD {
            self.msg(&framing::error_reply::<SmcGenlMessage>(raw, errno));
        } else {
            self.error_capped(&raw.header, errno);
        }
    }

    fn error_capped(&mut self, h: &NetlinkHeader, errno: Errno) {
        self.msg(&framing::error_reply_capped::<SmcGenlMessage>(h, errno));
    }

    pub(crate) fn finish(mut self) -> Vec<Vec<u8>> {
        if !self.cur.is_empty() {
            self.records.push(self.cur);
        }
        self.records
    }
}

/// One attribute of a request, as the kernel's policy checks see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawAttr<'a> {
    /// The type field without `NLA_F_NESTED` / `NLA_F_NET_BYTEORDER`.
    pub kind: u16,
    /// Whether `NLA_F_NESTED` was set.
    pub nested: bool,
    /// The value.
    pub value: &'a [u8],
}

/// Splits a request's attribute stream as `__nla_validate_parse` does (`nla_ok` loop): with
/// `strict` (the kernel's `NL_VALIDATE_TRAILING`), a header that does not fit or bytes left
/// after the last attribute are `EINVAL`; without, the stream simply ends there.
pub(crate) fn split_attrs(buf: &[u8], strict: bool) -> Result<Vec<RawAttr<'_>>, Errno> {
    // The one walker of the workspace (smc-proto's, the kernel's nla_for_each_attr); what it
    // cannot walk ends the list, or fails the request under a strict policy.
    let mut out = Vec::new();
    for a in smc_proto::netlink::attr::attrs(buf) {
        match a {
            Ok(a) => out.push(RawAttr {
                kind: a.kind(),
                nested: a.is_nested(),
                value: a.value,
            }),
            Err(_) if !strict => break,
            Err(_) => return Err(libc::EINVAL),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
