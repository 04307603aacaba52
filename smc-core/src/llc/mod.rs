//! SMC-R link layer control (LLC) of one link group as a sans-IO flow machine: the kernel's
//! `net/smc/smc_llc.c` (with the link-down half of `smc_core.c` — `smcr_link_down`,
//! `smc_switch_conns`, the rtoken table — and the first-contact halves of `af_smc.c`,
//! `smcr_serv_conf_first_link` / `smcr_clnt_conf_first_link`) without threads, work queues,
//! completions or sleeps. See `docs/llc.md` ("The flow machine") for the sequences.
//!
//! # What it is
//!
//! One [`Llc`] per SMC-R link group. It owns what the kernel keeps in `struct
//! smc_link_group` for LLC: up to [`SMC_LINKS_PER_LGR_MAX`] link slots (`lgr->lnk[]`, here
//! addressed by [`LinkIdx`]; the wire's link id is [`Link::link_id`]), the group type
//! ([`LgrType`]), at most one *local* flow (`lgr->llc_flow_lcl`: ADD_LINK, DELETE_LINK or
//! RKEY) with its one parked message (`flow->qentry`), the one delayed event
//! (`lgr->delayed_event`), the peer's rtokens (`lgr->rtokens`) and the local RMBs' keys per
//! link. The *remote* flow (`llc_flow_rmt`: the peer's CONFIRM_RKEY / DELETE_RKEY) is answered
//! inside the call that delivers it, as the kernel's event worker does, so it never stays busy.
//!
//! Flows, each with the kernel's wait time as a timer:
//!
//! * first contact, server: CONFIRM_LINK request, wait for the response
//!   ([`LlcConfig::srv_confirm_link_timeout`]), link active, group SINGLE, then at once the
//!   server's ADD_LINK (as `smcr_serv_conf_first_link` does);
//! * first contact, client: wait for the CONFIRM_LINK request
//!   ([`LlcConfig::clnt_confirm_link_timeout`]), [`LlcAction::RtsAndRegister`], CONFIRM_LINK
//!   response (flags 0x83), then wait [`SMC_LLC_WAIT_TIME`] for the server's ADD_LINK;
//! * ADD_LINK as server (`smc_llc_srv_add_link`) and client (`smc_llc_cli_add_link`, with the
//!   reject 0x40 / reason 1 and the client's "invite"), the ADD_LINK_CONT rkey exchange of at
//!   most two rkeys a message until both sides are done (v1 groups; in an SMC-Rv2 group
//!   each side's ADD_LINK carries all its rkeys in the v2 extension, see
//!   [`LlcConfig::v2`]), CONFIRM_LINK over the new link, the
//!   symmetric/asymmetric decision and, on the server, the deletion of a link no longer needed
//!   (reason NO_ASYM_NEEDED);
//! * DELETE_LINK (`smc_llc_process_{srv,cli}_delete_link`), one link or ALL;
//! * CONFIRM_RKEY / DELETE_RKEY for an RMB registered or freed on an existing group
//!   (`smcr_lgr_reg_rmbs`, `smcr_buf_unuse`), local and remote;
//! * TEST_LINK keepalive (`smc_llc_testlink_work`) and the echo of the peer's;
//! * link down (`smcr_link_down`): which link the connections move to, and what the peer is
//!   told.
//!
//! # Contract with the driver
//!
//! Every method takes `now` and returns at once. The driver
//!
//! 1. feeds every LLC message received on a link to [`Llc::handle_message`] (the bytes of the
//!    SEND; the driver has already sent byte 0 = 0xFE to the CDC path), and reports any other
//!    received work request on a link with [`Llc::link_rx`] (that is the liveness TEST_LINK
//!    measures; once per completion-queue poll is enough);
//! 2. drains [`Llc::poll_action`] after every call and carries the actions out in order
//!    (see [`LlcAction`] for what each one asks);
//! 3. answers the steps it was asked to do: [`Llc::link_created`], [`Llc::link_ready`],
//!    [`Llc::rmb_registered`], and reports send completions with [`Llc::send_done`];
//! 4. calls [`Llc::handle_timeout`] at [`Llc::poll_timeout`];
//! 5. brings local decisions as calls: [`Llc::add_link`], [`Llc::delete_link`],
//!    [`Llc::link_down`], [`Llc::register_rmb`], [`Llc::unregister_rmb`],
//!    [`Llc::terminate`], [`Llc::set_ports`].
//!
//! | action | the driver |
//! |---|---|
//! | [`LlcAction::Send`] | posts the SEND (44 bytes; a v2 ADD_LINK or REQUEST_ADD_LINK may be up to 8192) on that link's QP; reports [`Llc::send_done`] |
//! | [`LlcAction::CreateLink`] | creates PD, QP (to INIT) and WR buffers on the port, maps the named RMBs; answers [`Llc::link_created`] with QPN, PSN and each RMB's key |
//! | [`LlcAction::ReadyLink`] | QP to RTR with the peer's QPN/GID/MAC/PSN/MTU, posts the receives, to RTS if asked, registers the RMBs if asked; answers [`Llc::link_ready`] |
//! | [`LlcAction::RtsAndRegister`] | client: QP to RTS, registers the RMBs; answers [`Llc::link_ready`] |
//! | [`LlcAction::RegisterRmb`] | registers one RMB on each named link; answers [`Llc::rmb_registered`] |
//! | [`LlcAction::SetRtoken`] / [`LlcAction::DeleteRtoken`] | updates its copy of the peer's RMB addresses (or reads [`Llc::rtoken`]) |
//! | [`LlcAction::LinkActive`] / [`LlcAction::LinkDown`] | places connections on the link / posts nothing new on it |
//! | [`LlcAction::LinkDeleted`] | lets posted sends finish, sets the QP to error and destroys it, unmaps the buffers |
//! | [`LlcAction::MoveConnections`] | moves every connection of one link to the other (below) |
//! | [`LlcAction::GroupType`] | records it (netlink shows it) |
//! | [`LlcAction::FirstContact`] | lets the first connection finish (or decline) and other connections join |
//! | [`LlcAction::RkeyConfirmed`] / [`LlcAction::RkeyDeleted`] | finishes the connection setup or buffer release that asked |
//! | [`LlcAction::Terminated`] | aborts the group's connections and frees it after the last send |
//!
//! Connection-level work stays with the connection driver: on
//! [`LlcAction::MoveConnections`] it switches every connection of the lost link to the new
//! one, rolls each one's send cursors back to the last completed CDC (`smc_switch_cursor`:
//! `tx_curs_sent = tx_curs_fin`, producer = `local_tx_ctrl_fin`, then forward by what the
//! peer already consumed) and sends the failover-validation CDC (flag 0x08, seqno of the last
//! completed CDC) on the new link before it rewrites the unacknowledged bytes. None of that is
//! decided here.
//!
//! # The peer is hostile
//!
//! Nothing here panics on input. A message whose length is wrong is dropped, as
//! `smc_llc_rx_handler` drops it; a type the LLC layer has no case for is a protocol
//! violation: the group terminates and the peer gets DELETE_LINK ALL with reason
//! [`DeleteLinkReason::ProtocolViolation`]. Responses that no local flow waits for are
//! dropped, link numbers that do not exist are answered as the kernel answers them
//! (`SMC_LLC_DEL_NOLNK`) or ignored, rkey counts are clamped to what a message holds, and a
//! request arriving while a local flow runs is parked once as the delayed event or dropped
//! (`smc_llc_flow_start` / `smc_llc_flow_parallel`). The few places where this module checks
//! more than the kernel are listed in `docs/llc.md` ("Departures from the kernel").

mod flows;
mod msgs;
#[cfg(test)]
mod tests;

use crate::lgr::Role;
use crate::time::Instant;
use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::fmt;
use core::time::Duration;
use smc_proto::llc::{
    AddLink, ConfirmRkey, DeleteLink, DeleteLinkReason, DeleteRkey, DeleteRkeyV2, LLC_LEN,
    LlcError, LlcFlags, LlcMessage, LlcType, ReqAddLink,
};

use flows::{Flow, Next, StepResult};

/// `SMC_LLC_WAIT_TIME`: how long a flow waits for the peer's next message.
pub const SMC_LLC_WAIT_TIME: Duration = Duration::from_secs(2);
/// `SMC_LLC_WAIT_FIRST_TIME`: how long both sides wait for CONFIRM_LINK on a new link.
pub const SMC_LLC_WAIT_FIRST_TIME: Duration = Duration::from_secs(5);
/// `SMC_LLC_TESTLINK_DEFAULT_TIME`: the default of sysctl `net.smc.smcr_testlink_time`.
pub const SMC_LLC_TESTLINK_DEFAULT_TIME: Duration = Duration::from_secs(30);
/// How long a local request waits for the local flow to be free (`smc_llc_flow_initiate`:
/// `SMC_LLC_WAIT_TIME * 10`).
pub const SMC_LLC_FLOW_INITIATE_WAIT: Duration = Duration::from_secs(20);
/// `SMC_LINKS_PER_LGR_MAX`: link slots of a group.
pub const SMC_LINKS_PER_LGR_MAX: usize = 3;
/// `SMC_LLC_ADD_LNK_MAX_LINKS`: the `max_links` a v1 CONFIRM_LINK announces.
pub const SMC_LLC_ADD_LNK_MAX_LINKS: u8 = 2;
/// `SMC_RMBS_PER_LGR_MAX`: rtokens (peer RMBs) per group.
pub const SMC_RMBS_PER_LGR_MAX: usize = 255;
/// `SMC_LLC_RKEYS_PER_CONT_MSG`: rkey pairs in one ADD_LINK_CONT.
pub const SMC_LLC_RKEYS_PER_CONT_MSG: usize = 2;
/// `SMC_LLC_RKEYS_PER_MSG`: rtokens in one CONFIRM_RKEY; a larger count is refused.
pub const SMC_LLC_RKEYS_PER_MSG: u8 = 3;
/// `SMC_LLC_DEL_RKEY_MAX`: rkeys in one DELETE_RKEY; a larger count is clamped.
pub const SMC_LLC_DEL_RKEY_MAX: usize = 8;
/// The most ADD_LINK_CONT rounds one rkey exchange may take: 255 rkeys at two a message,
/// plus one. The kernel trusts the peer's count each round; a peer that never says "done"
/// would keep it looping, so this bound fails the new link instead.
pub const MAX_RKEY_ROUNDS: u32 =
    SMC_RMBS_PER_LGR_MAX.div_ceil(SMC_LLC_RKEYS_PER_CONT_MSG) as u32 + 1;

// Base LLC types (`llc_type`, the low nibble the kernel switches on).
const T_CONFIRM_LINK: u8 = 0x01;
const T_ADD_LINK: u8 = 0x02;
const T_ADD_LINK_CONT: u8 = 0x03;
const T_DELETE_LINK: u8 = 0x04;
const T_REQ_ADD_LINK: u8 = 0x05;
const T_CONFIRM_RKEY: u8 = 0x06;
const T_TEST_LINK: u8 = 0x07;
const T_CONFIRM_RKEY_CONT: u8 = 0x08;
const T_DELETE_RKEY: u8 = 0x09;

/// A link slot of the group (`link_idx`, 0..[`SMC_LINKS_PER_LGR_MAX`]). Stable for the life
/// of a link; the driver names QPs by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkIdx(u8);

impl LinkIdx {
    /// The slot of the first link (first contact).
    pub const FIRST: LinkIdx = LinkIdx(0);

    /// Slot `i`, if it exists.
    pub const fn new(i: u8) -> Option<LinkIdx> {
        if (i as usize) < SMC_LINKS_PER_LGR_MAX {
            Some(LinkIdx(i))
        } else {
            None
        }
    }

    /// The slot number.
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    fn all() -> impl Iterator<Item = LinkIdx> {
        (0..SMC_LINKS_PER_LGR_MAX as u8).map(LinkIdx)
    }
}

/// The driver's name for a local RMB (one per connection, `smc_buf_desc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RmbId(pub u32);

/// Names one posted LLC message, for [`Llc::send_done`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SendId(pub u64);

/// An RMB as one link sees it: its rkey and the address RDMA writes use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RmbKey {
    /// The memory region's rkey on that link.
    pub rkey: u32,
    /// The DMA (or virtual) address on that link.
    pub vaddr: u64,
}

/// A local RoCE device port a link can use (what `smc_pnet_find_alt_roce` searches).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocalPort {
    /// The device (`smcibdev`); an alternate path needs another device.
    pub dev: u32,
    /// The port on it (1-based, `ibport`).
    pub port: u8,
    /// The GID links on this port use.
    pub gid: [u8; 16],
    /// The port's MAC.
    pub mac: [u8; 6],
    /// The path MTU, IB enum (1 = 256 … 5 = 4096).
    pub path_mtu: u8,
}

/// What the peer told about its end of a link (`peer_qpn`, `peer_gid`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerQp {
    /// Its QP number.
    pub qpn: u32,
    /// Its GID.
    pub gid: [u8; 16],
    /// Its MAC.
    pub mac: [u8; 6],
    /// Its initial packet sequence number.
    pub psn: u32,
    /// The MTU it announced (IB enum).
    pub mtu: u8,
}

/// A link group's type (`enum smc_lgr_type`; [`LgrType::code`] is the kernel's value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LgrType {
    /// No link (the group is going).
    None,
    /// One link.
    Single,
    /// Two links over different devices on both sides.
    Symmetric,
    /// The peer has one device: both links end on it.
    AsymmetricPeer,
    /// We have one device: both links start on it.
    AsymmetricLocal,
}

impl LgrType {
    /// The kernel's value (netlink `SMC_NLA_LGR_R_TYPE`).
    pub const fn code(self) -> u8 {
        match self {
            LgrType::None => 0,
            LgrType::Single => 1,
            LgrType::Symmetric => 2,
            LgrType::AsymmetricPeer => 3,
            LgrType::AsymmetricLocal => 4,
        }
    }

    /// True for the two asymmetric types.
    pub const fn is_asymmetric(self) -> bool {
        matches!(self, LgrType::AsymmetricPeer | LgrType::AsymmetricLocal)
    }
}

/// The kind of the local flow (`enum smc_llc_flowtype`; [`FlowType::code`] is the kernel's
/// value, which is also the LLC type that starts it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlowType {
    /// ADD_LINK (also first contact).
    AddLink,
    /// DELETE_LINK.
    DelLink,
    /// CONFIRM_RKEY / DELETE_RKEY.
    Rkey,
}

impl FlowType {
    /// The kernel's value.
    pub const fn code(self) -> u8 {
        match self {
            FlowType::AddLink => T_ADD_LINK,
            FlowType::DelLink => T_DELETE_LINK,
            FlowType::Rkey => T_CONFIRM_RKEY,
        }
    }
}

/// A link's state (`enum smc_link_state`; an unused slot has no [`Link`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkState {
    /// Being set up: not yet for connections.
    Activating,
    /// Carries connections.
    Active,
    /// Down: no longer used, waiting to be cleared.
    Inactive,
}

/// One link of the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The wire's link id (`link_id`, chosen by the server; 0 on the client until the
    /// first CONFIRM_LINK names it).
    pub link_id: u8,
    /// Its state.
    pub state: LinkState,
    /// The local port it uses.
    pub port: LocalPort,
    /// Our QP number.
    pub qpn: u32,
    /// Our initial PSN.
    pub psn: u32,
    /// The peer's end, once known.
    pub peer: Option<PeerQp>,
    /// Our QP is in RTS (the link can send, `smc_link_sendable`).
    pub rts: bool,
    /// Tagged as the asymmetric link (`link_is_asym`): connections are not placed on it.
    pub asym: bool,
    /// `link_uid`: our group id plus the link id.
    pub link_uid: u32,
    /// The peer's `link_uid` from its CONFIRM_LINK.
    pub peer_link_uid: u32,
    last_rx: Instant,
    testlink: Testlink,
}

impl Link {
    fn new(link_id: u8, port: LocalPort, lgr_id: u32, now: Instant) -> Link {
        Link {
            link_id,
            state: LinkState::Activating,
            port,
            qpn: 0,
            psn: 0,
            peer: None,
            rts: false,
            asym: false,
            link_uid: link_uid(lgr_id, link_id),
            peer_link_uid: 0,
            last_rx: now,
            testlink: Testlink::Off,
        }
    }

    /// `smc_link_usable`: not down.
    pub fn usable(&self) -> bool {
        self.state != LinkState::Inactive
    }

    /// `smc_link_sendable`: usable and the QP in RTS.
    pub fn sendable(&self) -> bool {
        self.usable() && self.rts
    }

    /// When the last work request arrived on it.
    pub fn last_rx(&self) -> Instant {
        self.last_rx
    }

    /// A TEST_LINK is out and its echo due at this instant.
    pub fn testlink_pending(&self) -> Option<Instant> {
        match self.testlink {
            Testlink::AwaitEcho(d) => Some(d),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Testlink {
    Off,
    Idle,
    AwaitEcho(Instant),
}

/// `smc_llc_link_set_uid`: the group id (read as the host value of its four bytes) plus the
/// link id.
fn link_uid(lgr_id: u32, link_id: u8) -> u32 {
    lgr_id.wrapping_add(u32::from(link_id))
}

/// Settings of a group's LLC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlcConfig {
    /// Our link group id (`lgr->id` as a host `u32`), the base of every `link_uid`.
    pub lgr_id: u32,
    /// The local ports alternate links may use (`smc_pnet_find_alt_roce` picks one on
    /// another device). Update with [`Llc::set_ports`].
    pub ports: Vec<LocalPort>,
    /// `max_links` announced in CONFIRM_LINK (2, [`SMC_LLC_ADD_LNK_MAX_LINKS`]); 1 means
    /// this group never adds a link (the SMC-Rv2.1 negotiation's result).
    pub max_links: u8,
    /// `smcr_testlink_time`: TEST_LINK after this long without a received work request;
    /// zero turns it off.
    pub testlink_time: Duration,
    /// `SMC_LLC_WAIT_TIME`.
    pub wait_time: Duration,
    /// `SMC_LLC_WAIT_FIRST_TIME`.
    pub wait_first_time: Duration,
    /// The server's wait for the first CONFIRM_LINK response (`SMC_LLC_WAIT_TIME`; sysctl
    /// `smcr_srv_confirm_link_timeout` in newer kernels).
    pub srv_confirm_link_timeout: Duration,
    /// The client's wait for the first CONFIRM_LINK request: twice `SMC_LLC_WAIT_TIME`, as
    /// newer kernels wait ("double the client timeout") so a late server's DECLINE does not
    /// cross a CONFIRM_LINK.
    pub clnt_confirm_link_timeout: Duration,
    /// How long a local RKEY request waits for the flow (`SMC_LLC_WAIT_TIME * 10`).
    pub flow_initiate_wait: Duration,
    /// An SMC-Rv2 link group (`lgr->smc_version == SMC_V2`): every message goes out in its v2
    /// form (`smc_llc_init_msg_hdr`), ADD_LINK carries all rkeys of the new link in its
    /// extension (no ADD_LINK_CONT), DELETE_RKEY answers with a count of invalid rkeys, and a
    /// client asks for a second link with REQUEST_ADD_LINK.
    pub v2: bool,
    /// `max_conns` announced in CONFIRM_LINK: 0, or the negotiated value in an SMC-Rv2.1
    /// group (`lgr->max_conns` when the peer's release is 1 or later).
    pub max_conns: u8,
    /// `v2_direct` of the ADD_LINK v2 extension: no gateway between the peers
    /// (`!lgr->uses_gateway`).
    pub v2_direct: bool,
}

impl LlcConfig {
    /// The kernel's defaults.
    pub fn new(lgr_id: u32, ports: Vec<LocalPort>) -> LlcConfig {
        LlcConfig {
            lgr_id,
            ports,
            max_links: SMC_LLC_ADD_LNK_MAX_LINKS,
            testlink_time: SMC_LLC_TESTLINK_DEFAULT_TIME,
            wait_time: SMC_LLC_WAIT_TIME,
            wait_first_time: SMC_LLC_WAIT_FIRST_TIME,
            srv_confirm_link_timeout: SMC_LLC_WAIT_TIME,
            clnt_confirm_link_timeout: SMC_LLC_WAIT_TIME * 2,
            flow_initiate_wait: SMC_LLC_FLOW_INITIATE_WAIT,
            v2: false,
            max_conns: 0,
            v2_direct: true,
        }
    }
}

/// The first link, as the CLC handshake left it.
///
/// Server: the QP is in RTS (`smc_ib_ready_link` ran in `smc_listen_rdma_finish`) and the
/// first RMB is registered on it. Client: the QP is in RTR only; the RMB is mapped (its rkey
/// exists) and is registered in the [`LlcAction::RtsAndRegister`] step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirstLink {
    /// The local port.
    pub port: LocalPort,
    /// Our QP number.
    pub qpn: u32,
    /// Our initial PSN.
    pub psn: u32,
    /// The peer's end from its Accept (client) or Confirm (server).
    pub peer: PeerQp,
    /// The connection's RMB.
    pub rmb: RmbId,
    /// Its key on this link (CONFIRM_RKEY is implicit on first contact).
    pub rmb_key: RmbKey,
    /// The peer's RMB from its CLC message: rtoken 0 on this link.
    pub peer_rmb: RmbKey,
}

/// The driver's answer to [`LlcAction::CreateLink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedLink {
    /// The new QP's number.
    pub qpn: u32,
    /// Its initial PSN (24 random bits).
    pub psn: u32,
    /// The key of each RMB the action named, mapped on the new link.
    pub rmb_keys: Vec<(RmbId, RmbKey)>,
}

/// A driver step failed (the kernel's `rc != 0` from `smcr_link_init`, `smc_ib_ready_link`,
/// `smcr_buf_map_lgr`, `smcr_buf_reg_lgr`, `smcr_link_reg_buf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StepFailed;

/// How a first contact went (after its optional second link).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FirstContactDone {
    /// Client: the server's ADD_LINK did not come within [`SMC_LLC_WAIT_TIME`]. The kernel
    /// then waits up to `CLC_WAIT_TIME_SHORT` for a CLC DECLINE before it goes on with one
    /// link; that wait is the driver's.
    pub add_link_timed_out: bool,
}

/// Why a first contact failed; the CLC reason code the kernel declines with is in the docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FirstContactError {
    /// No CONFIRM_LINK in time (`SMC_CLC_DECL_TIMEOUT_CL`, after the driver waited
    /// `CLC_WAIT_TIME_SHORT` for a DECLINE).
    TimedOut,
    /// The CONFIRM_LINK lacks the no-RMBE-eyecatcher flags (`SMC_CLC_DECL_RMBE_EC`).
    RmbeEyecatcher,
    /// The QP or the RMB registration failed, or the link could not send
    /// (`SMC_CLC_DECL_ERR_RDYLNK` / `SMC_CLC_DECL_ERR_REGBUF`).
    LinkFailed,
    /// The server's CONFIRM_LINK named link id 0.
    BadLinkId,
    /// The group terminated meanwhile.
    Terminated,
}

/// Why a local CONFIRM_RKEY / DELETE_RKEY failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RkeyError {
    /// No response within [`SMC_LLC_WAIT_TIME`] (or an unexpected message ended the wait).
    Timeout,
    /// The peer answered with the negative flag (0x20); `retry` is flag 0x10, `err_mask` the
    /// DELETE_RKEY error mask.
    Negative {
        /// `SMC_LLC_FLAG_RKEY_RETRY`.
        retry: bool,
        /// DELETE_RKEY: bit `7 - i` for each rkey the peer did not know.
        err_mask: u8,
    },
    /// The flow stayed busy for [`SMC_LLC_FLOW_INITIATE_WAIT`].
    FlowBusy,
    /// Registering the RMB on the links failed.
    RegisterFailed,
    /// No usable link to send on.
    NoLink,
    /// The group terminated.
    Terminated,
}

/// Why the group terminated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TermReason {
    /// The peer broke the protocol (the LLC type byte given).
    ProtocolViolation {
        /// Byte 0 of the offending message.
        llc_type: u8,
    },
    /// The peer sent DELETE_LINK ALL with this reason.
    PeerDeleteAll(DeleteLinkReason),
    /// [`Llc::terminate`] with this reason.
    Local(DeleteLinkReason),
    /// The last link went down or was deleted.
    NoLinkLeft,
    /// The first contact failed.
    FirstContactFailed(FirstContactError),
}

impl TermReason {
    /// The reason the DELETE_LINK ALL sent on termination carries (`llc_termination_rsn`,
    /// else `SMC_LLC_DEL_PROG_INIT_TERM`, as `smc_lgr_cleanup`).
    pub const fn sent_code(self) -> DeleteLinkReason {
        match self {
            TermReason::ProtocolViolation { .. } => DeleteLinkReason::ProtocolViolation,
            TermReason::Local(r) => r,
            _ => DeleteLinkReason::ProgramInitiated,
        }
    }
}

/// What the driver must do. Carry them out in the order they come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LlcAction {
    /// Post `msg` as a SEND on link `link` (`LlcMessage::to_bytes`: 44 bytes, or more for a
    /// v2 ADD_LINK with its rkeys or a REQUEST_ADD_LINK; at most 8192). Report its
    /// completion with [`Llc::send_done`] (a failed post counts as a failed completion).
    Send {
        /// The link.
        link: LinkIdx,
        /// Names the send for [`Llc::send_done`].
        id: SendId,
        /// The message.
        msg: LlcMessage,
    },
    /// `smcr_link_init` + `smcr_buf_map_lgr`: create the new link's PD, QP (RESET→INIT) and
    /// work-request buffers on `port`, map each RMB of `rmbs` (and the send buffers) on it
    /// and create their memory regions. Answer with [`Llc::link_created`].
    CreateLink {
        /// The slot.
        link: LinkIdx,
        /// Its wire id.
        link_id: u8,
        /// The port.
        port: LocalPort,
        /// The RMBs in use, to map.
        rmbs: Vec<RmbId>,
    },
    /// `smc_ib_ready_link`: QP to RTR with the peer's `qpn`/`gid`/`mac`/`psn` and `mtu`
    /// (post the receive buffers), then to RTS if `rts` (server), then register every mapped
    /// RMB on the link if `register_rmbs` (`smcr_buf_reg_lgr`). Answer with
    /// [`Llc::link_ready`].
    ReadyLink {
        /// The link.
        link: LinkIdx,
        /// The peer's end.
        peer: PeerQp,
        /// `min(path_mtu, peer mtu)`.
        mtu: u8,
        /// Go on to RTS.
        rts: bool,
        /// Register the RMBs.
        register_rmbs: bool,
    },
    /// Client: a packet from the server arrived on the link, so its QP goes to RTS now
    /// (`smc_ib_modify_qp_rts`), then register the RMBs on it (`smcr_buf_reg_lgr` /
    /// `smcr_link_reg_buf`). Answer with [`Llc::link_ready`].
    RtsAndRegister {
        /// The link.
        link: LinkIdx,
    },
    /// `smcr_lgr_reg_rmbs`: register RMB `rmb` on each of `links` and answer with
    /// [`Llc::rmb_registered`], giving its key on each.
    RegisterRmb {
        /// The RMB.
        rmb: RmbId,
        /// The active links.
        links: Vec<LinkIdx>,
    },
    /// The peer's RMB `idx` is at `key` on link `link` (its rtoken; writes to that RMB over
    /// that link use it). [`Llc::rtoken`] has the table.
    SetRtoken {
        /// The rtoken index.
        idx: u8,
        /// The link.
        link: LinkIdx,
        /// Where the RMB is.
        key: RmbKey,
    },
    /// The peer's RMB `idx` is gone on every link.
    DeleteRtoken {
        /// The rtoken index.
        idx: u8,
    },
    /// The link carries connections now (`SMC_LNK_ACTIVE`).
    LinkActive {
        /// The link.
        link: LinkIdx,
    },
    /// The link is down (`SMC_LNK_INACTIVE`): post nothing new on it; it is cleared later.
    LinkDown {
        /// The link.
        link: LinkIdx,
    },
    /// `smcr_link_clear`: set the QP to error, destroy it and its PD, unmap the buffers; the
    /// slot is free and the link's rtokens are gone.
    LinkDeleted {
        /// The link.
        link: LinkIdx,
    },
    /// `smc_switch_conns`: every connection on `from` moves to `to`; each in an active state
    /// rolls its cursors back and sends the failover-validation CDC on `to` (see the module
    /// docs). If no work-request slot can be had on `to`, report `to` with
    /// [`Llc::link_down`].
    MoveConnections {
        /// The lost link.
        from: LinkIdx,
        /// The surviving one.
        to: LinkIdx,
    },
    /// The group's type changed.
    GroupType(LgrType),
    /// The first-contact flow ended. On success other connections may join the group (the
    /// kernel held `smc_*_lgr_pending` until here); on failure the connection declines.
    FirstContact(Result<FirstContactDone, FirstContactError>),
    /// The result of [`Llc::register_rmb`]: on success the peer knows the RMB on every
    /// active link.
    RkeyConfirmed {
        /// The RMB.
        rmb: RmbId,
        /// The outcome.
        result: Result<(), RkeyError>,
    },
    /// The result of [`Llc::unregister_rmb`].
    RkeyDeleted {
        /// The RMB.
        rmb: RmbId,
        /// The outcome.
        result: Result<(), RkeyError>,
    },
    /// The group is gone: abort its connections and free it once the DELETE_LINK ALL just
    /// sent has completed (if it fails, [`Llc::send_done`] moves it to the next link).
    /// Nothing but those retries and the results of requests in progress follows.
    Terminated {
        /// Why.
        reason: TermReason,
        /// The reason the DELETE_LINK ALL carried.
        sent: DeleteLinkReason,
    },
}

/// What became of a received message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Taken by a flow, answered, or parked for the waiting flow.
    Handled,
    /// Parked as the delayed event, replayed when the local flow ends.
    Delayed,
    /// Dropped, as the kernel drops it.
    Dropped(DropReason),
    /// A protocol violation: the group terminated.
    ProtocolViolation,
}

/// Why a message was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Its length was wrong (`smc_llc_rx_handler`).
    Malformed(LlcError),
    /// A request on a link that is down (`smc_link_usable`).
    LinkNotUsable,
    /// A response, or a flow's message, that no flow waits for.
    OutOfFlow,
    /// A request while a flow of the same kind runs, or with the delayed slot taken.
    Parallel,
    /// A type Linux receives and ignores (CONFIRM_RKEY_CONT; REQUEST_ADD_LINK at a client).
    Ignored,
    /// The group has terminated.
    Terminated,
}

/// A call the machine could not take (a driver mistake, not the peer's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputError {
    /// No link in that slot.
    UnknownLink,
    /// Byte 0 is 0xFE: a CDC message.
    NotLlc,
    /// No flow waits for this answer.
    NotAwaited,
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InputError::UnknownLink => "no link in that slot",
            InputError::NotLlc => "a CDC message given to LLC",
            InputError::NotAwaited => "no LLC flow waits for this answer",
        })
    }
}

/// What [`Llc::unregister_rmb`] started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unregister {
    /// The peer never knew the RMB: nothing to tell it, the RMB is forgotten.
    Done,
    /// DELETE_RKEY will go out; [`LlcAction::RkeyDeleted`] follows.
    Pending,
}

/// A request for the local flow: a received message, or one the group made itself
/// (`smc_llc_add_link_local`, `smc_llc_srv_delete_link_local` enqueue such messages).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Event {
    link: LinkIdx,
    msg: LlcMessage,
    local: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RkeyOp {
    Confirm { via: LinkIdx },
    Delete,
}

/// A local request waiting for the flow (`smc_llc_flow_initiate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Initiator {
    rmb: RmbId,
    op: RkeyOp,
    deadline: Instant,
}

/// A client's link down waiting for the local flow to end (`smcr_link_down`, client side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CliDelPending {
    del: LinkIdx,
    link_id: u8,
    to: LinkIdx,
    deadline: Instant,
}

/// A DELETE_LINK ALL being sent on one sendable link after another
/// (`smc_llc_send_link_delete_all`, which waits for each send's completion).
#[derive(Debug, Clone, PartialEq, Eq)]
struct DeleteAll {
    msg: LlcMessage,
    tried: [bool; SMC_LINKS_PER_LGR_MAX],
    current: Option<SendId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LocalRmb {
    id: RmbId,
    keys: [Option<RmbKey>; SMC_LINKS_PER_LGR_MAX],
    used: bool,
    confirmed: bool,
}

type RtokenRow = [Option<RmbKey>; SMC_LINKS_PER_LGR_MAX];

/// The LLC of one SMC-R link group.
#[derive(Debug)]
pub struct Llc {
    cfg: LlcConfig,
    role: Role,
    links: [Option<Link>; SMC_LINKS_PER_LGR_MAX],
    lgr_type: LgrType,
    next_link_id: u8,
    /// `llc_flow_lcl` while it rests (waiting for a message or the driver).
    local: Option<Flow>,
    /// The flow type while a flow's step runs (it is out of `local` then).
    running: Option<FlowType>,
    delayed: Option<Event>,
    local_events: VecDeque<Event>,
    initiators: VecDeque<Initiator>,
    cli_dels: Vec<CliDelPending>,
    rtokens: Vec<Option<RtokenRow>>,
    rmbs: Vec<LocalRmb>,
    del_all: Vec<DeleteAll>,
    actions: VecDeque<LlcAction>,
    next_send: u64,
    terminated: Option<TermReason>,
}

impl Llc {
    fn blank(cfg: LlcConfig, role: Role) -> Llc {
        Llc {
            cfg,
            role,
            links: [None, None, None],
            lgr_type: LgrType::None,
            next_link_id: 0,
            local: None,
            running: None,
            delayed: None,
            local_events: VecDeque::new(),
            initiators: VecDeque::new(),
            cli_dels: Vec::new(),
            rtokens: Vec::new(),
            rmbs: Vec::new(),
            del_all: Vec::new(),
            actions: VecDeque::new(),
            next_send: 0,
            terminated: None,
        }
    }

    fn install_first(&mut self, now: Instant, first: &FirstLink, link_id: u8, rts: bool) {
        let mut l = Link::new(link_id, first.port, self.cfg.lgr_id, now);
        l.qpn = first.qpn;
        l.psn = first.psn;
        l.peer = Some(first.peer);
        l.rts = rts;
        self.links[0] = Some(l);
        let mut keys = [None; SMC_LINKS_PER_LGR_MAX];
        keys[0] = Some(first.rmb_key);
        self.rmbs.push(LocalRmb {
            id: first.rmb,
            keys,
            used: true,
            confirmed: true,
        });
        let mut row = [None; SMC_LINKS_PER_LGR_MAX];
        row[0] = Some(first.peer_rmb);
        self.rtokens.push(Some(row));
    }

    /// A server's group after the CLC Confirm of its first contact: sends the CONFIRM_LINK
    /// request on [`LinkIdx::FIRST`] and holds the ADD_LINK flow until the first contact,
    /// including the server's attempt at a second link, is over
    /// ([`LlcAction::FirstContact`]).
    pub fn server(cfg: LlcConfig, now: Instant, first: FirstLink) -> Llc {
        let mut llc = Llc::blank(cfg, Role::Server);
        let id = llc.alloc_link_id();
        llc.install_first(now, &first, id, true);
        llc.run_flow(now, FlowType::AddLink, None, |s| s.srv_first_begin(now));
        llc
    }

    /// A client's group after it sent the CLC Confirm of a first contact: waits for the
    /// server's CONFIRM_LINK on [`LinkIdx::FIRST`].
    pub fn client(cfg: LlcConfig, now: Instant, first: FirstLink) -> Llc {
        let mut llc = Llc::blank(cfg, Role::Client);
        llc.install_first(now, &first, 0, false);
        llc.run_flow(now, FlowType::AddLink, None, |s| s.cli_first_begin(now));
        llc
    }

    // ------------------------------------------------------------------ queries

    /// Client or server.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The settings.
    pub fn config(&self) -> &LlcConfig {
        &self.cfg
    }

    /// The group's type.
    pub fn lgr_type(&self) -> LgrType {
        self.lgr_type
    }

    /// The link in slot `idx`.
    pub fn link(&self, idx: LinkIdx) -> Option<&Link> {
        self.links.get(idx.index())?.as_ref()
    }

    /// The links in use.
    pub fn links(&self) -> impl Iterator<Item = (LinkIdx, &Link)> {
        LinkIdx::all().filter_map(|i| self.link(i).map(|l| (i, l)))
    }

    /// The number of active links.
    pub fn active_links(&self) -> usize {
        self.links()
            .filter(|(_, l)| l.state == LinkState::Active)
            .count()
    }

    /// The local flow's type, if one runs.
    pub fn flow(&self) -> Option<FlowType> {
        self.local
            .as_ref()
            .map(|f| f.kind.flow_type())
            .or(self.running)
    }

    /// A request is parked as the delayed event.
    pub fn has_delayed_event(&self) -> bool {
        self.delayed.is_some()
    }

    /// Why the group terminated, once it has.
    pub fn terminated(&self) -> Option<TermReason> {
        self.terminated
    }

    /// The peer's RMB `idx` on link `link`.
    pub fn rtoken(&self, idx: u8, link: LinkIdx) -> Option<RmbKey> {
        self.rtokens.get(usize::from(idx))?.as_ref()?[link.index()]
    }

    /// The rtoken indexes in use.
    pub fn rtoken_count(&self) -> usize {
        self.rtokens.iter().filter(|r| r.is_some()).count()
    }

    /// `smc_rtoken_add` for the CLC path (`smc_rmb_rtoken_handling`): the index of the
    /// peer's RMB at `key` on `link`, added if new; `None` if all
    /// [`SMC_RMBS_PER_LGR_MAX`] are taken or there is no such link.
    pub fn rtoken_add(&mut self, link: LinkIdx, key: RmbKey) -> Option<u8> {
        self.link(link)?;
        let (idx, _) = self.rtoken_add_inner(link, key)?;
        Some(idx)
    }

    /// The next action for the driver.
    pub fn poll_action(&mut self) -> Option<LlcAction> {
        self.actions.pop_front()
    }

    /// The next instant [`Llc::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.terminated.is_some() {
            return None;
        }
        let flow = self
            .local
            .as_ref()
            .and_then(|f| f.wait.as_ref())
            .map(|w| w.deadline);
        let inits = self.initiators.iter().map(|i| i.deadline).min();
        let dels = self.cli_dels.iter().map(|d| d.deadline).min();
        let tests = self
            .links()
            .filter_map(|(_, l)| self.testlink_deadline(l))
            .min();
        [flow, inits, dels, tests].into_iter().flatten().min()
    }

    fn testlink_deadline(&self, l: &Link) -> Option<Instant> {
        match l.testlink {
            Testlink::Idle if l.state == LinkState::Active => {
                Some(l.last_rx + self.cfg.testlink_time)
            }
            Testlink::AwaitEcho(d) => Some(d),
            _ => None,
        }
    }

    // ------------------------------------------------------------------ inputs

    /// An LLC message arrived on link `link` (the bytes of the SEND; bytes past the message
    /// are ignored).
    pub fn handle_message(
        &mut self,
        now: Instant,
        link: LinkIdx,
        bytes: &[u8],
    ) -> Result<Received, InputError> {
        if bytes.first() == Some(&smc_proto::cdc::CDC_MSG_TYPE) {
            return Err(InputError::NotLlc);
        }
        self.check_rx(now, link)?;
        if self.terminated.is_some() {
            return Ok(Received::Dropped(DropReason::Terminated));
        }
        let msg = match LlcMessage::parse(bytes) {
            Ok(m) => m,
            // smc_llc_rx_handler: short or wrong-length messages are dropped.
            Err(
                e @ (LlcError::Truncated { .. }
                | LlcError::BadLength { .. }
                | LlcError::V2LengthTooShort { .. }
                | LlcError::V2LengthTooLong { .. }),
            ) => return Ok(Received::Dropped(DropReason::Malformed(e))),
            Err(LlcError::CdcMessage) => return Err(InputError::NotLlc),
            // A body that does not fit its own count (REQUEST_ADD_LINK's GID list, the rkeys
            // of an ADD_LINK v2 extension or a DELETE_RKEY v2) or an extension cut short.
            Err(
                LlcError::GidCountTooLarge { .. }
                | LlcError::RkeyCountTooLarge { .. }
                | LlcError::ExtensionTruncated { .. },
            ) => {
                self.protocol_violation(now, bytes.first().copied().unwrap_or(0));
                return Ok(Received::ProtocolViolation);
            }
        };
        Ok(self.dispatch(now, link, msg))
    }

    /// [`Llc::handle_message`] for a message already parsed.
    pub fn handle_llc(
        &mut self,
        now: Instant,
        link: LinkIdx,
        msg: LlcMessage,
    ) -> Result<Received, InputError> {
        self.check_rx(now, link)?;
        if self.terminated.is_some() {
            return Ok(Received::Dropped(DropReason::Terminated));
        }
        Ok(self.dispatch(now, link, msg))
    }

    fn check_rx(&mut self, now: Instant, link: LinkIdx) -> Result<(), InputError> {
        let l = self
            .links
            .get_mut(link.index())
            .and_then(Option::as_mut)
            .ok_or(InputError::UnknownLink)?;
        // smc_wr_rx_process_cqes: every good receive completion stamps wr_rx_tstamp.
        l.last_rx = l.last_rx.max(now);
        Ok(())
    }

    /// A work request other than LLC (a CDC) arrived on `link`: the link is alive.
    pub fn link_rx(&mut self, now: Instant, link: LinkIdx) {
        let _ = self.check_rx(now, link);
    }

    fn dispatch(&mut self, now: Instant, link: LinkIdx, msg: LlcMessage) -> Received {
        let r = match normalize(msg, self.cfg.v2) {
            Ok(msg) => {
                // smc_llc_enqueue: responses are processed at once, requests queued as events
                // (a REQUEST_ADD_LINK response too).
                if msg.is_response() && msg.llc_type().base() != T_REQ_ADD_LINK {
                    self.rx_response(now, link, msg)
                } else {
                    self.rx_request(
                        now,
                        Event {
                            link,
                            msg,
                            local: false,
                        },
                    )
                }
            }
            Err(ty) => {
                self.protocol_violation(now, ty);
                Received::ProtocolViolation
            }
        };
        self.pump(now);
        r
    }

    /// The driver's answer to [`LlcAction::CreateLink`].
    pub fn link_created(
        &mut self,
        now: Instant,
        link: LinkIdx,
        result: Result<CreatedLink, StepFailed>,
    ) -> Result<(), InputError> {
        self.step(
            now,
            flows::Awaiting::Created(link),
            StepResult::Created(result),
        )
    }

    /// The driver's answer to [`LlcAction::ReadyLink`] or [`LlcAction::RtsAndRegister`].
    pub fn link_ready(&mut self, now: Instant, link: LinkIdx, ok: bool) -> Result<(), InputError> {
        self.step(now, flows::Awaiting::Ready(link), StepResult::Ready(ok))
    }

    /// The driver's answer to [`LlcAction::RegisterRmb`]: the RMB's key on each link.
    pub fn rmb_registered(
        &mut self,
        now: Instant,
        rmb: RmbId,
        result: Result<Vec<(LinkIdx, RmbKey)>, StepFailed>,
    ) -> Result<(), InputError> {
        self.step(
            now,
            flows::Awaiting::Registered(rmb),
            StepResult::Registered(result),
        )
    }

    fn step(
        &mut self,
        now: Instant,
        want: flows::Awaiting,
        r: StepResult,
    ) -> Result<(), InputError> {
        match &self.local {
            Some(f) if f.wait.is_none() && f.kind.awaiting() == Some(want) => {}
            _ => return Err(InputError::NotAwaited),
        }
        let Some(flow) = self.local.take() else {
            return Err(InputError::NotAwaited);
        };
        let ft = flow.kind.flow_type();
        let q = flow.qentry;
        let kind = flow.kind;
        self.run_flow(now, ft, q, |s| s.flow_step(now, kind, r));
        self.pump(now);
        Ok(())
    }

    /// A posted message completed (`ok`) or failed. A failure ends the wait of the flow that
    /// sent it, as the kernel's failed post does, and moves a DELETE_LINK ALL to the next
    /// link.
    pub fn send_done(&mut self, now: Instant, id: SendId, ok: bool) {
        if let Some(pos) = self.del_all.iter().position(|d| d.current == Some(id)) {
            if ok {
                self.del_all.remove(pos);
            } else {
                let mut chain = self.del_all.remove(pos);
                if self.delete_all_next(&mut chain) {
                    self.del_all.push(chain);
                }
            }
            return;
        }
        if ok || self.terminated.is_some() {
            return;
        }
        if self
            .local
            .as_ref()
            .and_then(|f| f.wait.as_ref())
            .is_some_and(|w| w.sent == Some(id))
        {
            self.fail_wait(now);
        }
        self.pump(now);
    }

    /// Time passed: flow waits, local requests waiting for the flow, a client's deferred
    /// DELETE_LINK, TEST_LINK.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.terminated.is_some() {
            return;
        }
        if self
            .local
            .as_ref()
            .and_then(|f| f.wait.as_ref())
            .is_some_and(|w| now >= w.deadline)
        {
            self.fail_wait(now);
        }
        let mut i = 0;
        while i < self.initiators.len() {
            if now >= self.initiators[i].deadline {
                if let Some(init) = self.initiators.remove(i) {
                    self.rkey_result(init.rmb, init.op, Err(RkeyError::FlowBusy));
                }
            } else {
                i += 1;
            }
        }
        // smcr_link_down (client): the wait for the running flow lasts SMC_LLC_WAIT_TIME.
        let due: Vec<CliDelPending> = self
            .cli_dels
            .iter()
            .copied()
            .filter(|d| now >= d.deadline)
            .collect();
        self.cli_dels.retain(|d| now < d.deadline);
        for d in due {
            self.cli_send_delete(now, d);
        }
        for idx in LinkIdx::all() {
            self.testlink_tick(now, idx);
        }
        self.pump(now);
    }

    fn testlink_tick(&mut self, now: Instant, idx: LinkIdx) {
        if self.terminated.is_some() || self.cfg.testlink_time.is_zero() {
            return;
        }
        let Some(l) = self.link(idx) else { return };
        if l.state != LinkState::Active {
            return;
        }
        match l.testlink {
            Testlink::Idle if now >= l.last_rx + self.cfg.testlink_time => {
                // The kernel sends zeros as user data and waits SMC_LLC_WAIT_TIME for the
                // echo; a failed post is not looked at (the wait times out the same).
                let _ = self.send(idx, msgs::test_link(LlcFlags::EMPTY, [0; 16]));
                let due = now + self.cfg.wait_time;
                if let Some(l) = self.link_mut(idx) {
                    l.testlink = Testlink::AwaitEcho(due);
                }
            }
            Testlink::AwaitEcho(d) if now >= d => self.link_down_cond(now, idx, true),
            _ => {}
        }
    }

    // ------------------------------------------------------------------ local requests

    /// Try to add a link (`smc_llc_add_link_local`, e.g. after a port came up): the server
    /// runs its ADD_LINK flow, the client invites the server with an ADD_LINK request that
    /// names only its alternate port. Ignored while an ADD_LINK flow runs or is queued.
    pub fn add_link(&mut self, now: Instant) {
        if self.terminated.is_some()
            || self.flow() == Some(FlowType::AddLink)
            || self
                .local_events
                .iter()
                .any(|e| e.msg.llc_type() == LlcType::AddLink)
        {
            return;
        }
        let Some(link) = self.first_usable() else {
            return;
        };
        self.local_events.push_back(Event {
            link,
            msg: LlcMessage::AddLink(AddLink::default()),
            local: true,
        });
        self.pump(now);
    }

    /// Take an active link out of service in order (an operator, a port going away): the
    /// same steps as [`Llc::link_down`] except that the connections may move to a link on
    /// the same device port.
    pub fn delete_link(&mut self, now: Instant, link: LinkIdx) {
        self.link_down_cond(now, link, false);
        self.pump(now);
    }

    /// The link failed (QP error, port error: `smcr_link_down_cond_sched`). Its connections
    /// move to a link on another device port, and the peer is told; with no such link the
    /// group terminates.
    pub fn link_down(&mut self, now: Instant, link: LinkIdx) {
        self.link_down_cond(now, link, true);
        self.pump(now);
    }

    /// A new RMB joins the group (`smcr_lgr_reg_rmbs`): once the RKEY flow is ours
    /// ([`SMC_LLC_FLOW_INITIATE_WAIT`] at most) it is registered on every active link and
    /// announced with CONFIRM_RKEY on `via` (the connection's link); the result comes as
    /// [`LlcAction::RkeyConfirmed`].
    pub fn register_rmb(&mut self, now: Instant, rmb: RmbId, via: LinkIdx) {
        if self.terminated.is_some() {
            self.rkey_result(rmb, RkeyOp::Confirm { via }, Err(RkeyError::Terminated));
            return;
        }
        match self.rmbs.iter_mut().find(|r| r.id == rmb) {
            Some(r) => r.used = true,
            None => self.rmbs.push(LocalRmb {
                id: rmb,
                keys: [None; SMC_LINKS_PER_LGR_MAX],
                used: true,
                confirmed: false,
            }),
        }
        self.initiators.push_back(Initiator {
            rmb,
            op: RkeyOp::Confirm { via },
            deadline: now + self.cfg.flow_initiate_wait,
        });
        self.pump(now);
    }

    /// An RMB leaves the group (`smcr_buf_unuse`). If the peer knew it, DELETE_RKEY goes out
    /// once the RKEY flow is ours and [`LlcAction::RkeyDeleted`] follows.
    pub fn unregister_rmb(&mut self, now: Instant, rmb: RmbId) -> Unregister {
        let Some(pos) = self.rmbs.iter().position(|r| r.id == rmb) else {
            return Unregister::Done;
        };
        self.rmbs[pos].used = false;
        if !self.rmbs[pos].confirmed || self.terminated.is_some() {
            self.rmbs.remove(pos);
            return Unregister::Done;
        }
        self.initiators.push_back(Initiator {
            rmb,
            op: RkeyOp::Delete,
            deadline: now + self.cfg.flow_initiate_wait,
        });
        self.pump(now);
        Unregister::Pending
    }

    /// End the group: DELETE_LINK ALL (`orderly`: flag 0x20, as the idle-group free does)
    /// with `reason` on the first link that can send, then [`LlcAction::Terminated`]. The
    /// kernel uses [`DeleteLinkReason::OperatorInitiated`] when a device goes away and
    /// [`DeleteLinkReason::ProgramInitiated`] otherwise.
    pub fn terminate(&mut self, now: Instant, reason: DeleteLinkReason, orderly: bool) {
        if self.terminated.is_some() {
            return;
        }
        self.terminate_with(now, TermReason::Local(reason), orderly);
    }

    /// The local ports alternate links may use changed.
    pub fn set_ports(&mut self, ports: Vec<LocalPort>) {
        self.cfg.ports = ports;
    }

    // ------------------------------------------------------------------ receive paths

    /// `smc_llc_rx_response`.
    fn rx_response(&mut self, now: Instant, link: LinkIdx, msg: LlcMessage) -> Received {
        match msg.llc_type().base() {
            T_TEST_LINK => {
                let Some(l) = self.link_mut(link) else {
                    return Received::Dropped(DropReason::OutOfFlow);
                };
                if l.state == LinkState::Active && matches!(l.testlink, Testlink::AwaitEcho(_)) {
                    l.testlink = Testlink::Idle;
                    Received::Handled
                } else {
                    Received::Dropped(DropReason::OutOfFlow)
                }
            }
            T_ADD_LINK | T_ADD_LINK_CONT | T_CONFIRM_LINK => {
                self.assign_if(now, FlowType::AddLink, link, msg)
            }
            T_DELETE_LINK => self.assign_if(now, FlowType::DelLink, link, msg),
            T_CONFIRM_RKEY | T_DELETE_RKEY => self.assign_if(now, FlowType::Rkey, link, msg),
            T_CONFIRM_RKEY_CONT => Received::Dropped(DropReason::Ignored),
            _ => {
                self.protocol_violation(now, msg.llc_type().code());
                Received::ProtocolViolation
            }
        }
    }

    /// "assign responses to the local flow, we requested them": only to a flow of the right
    /// kind whose message slot is free.
    fn assign_if(
        &mut self,
        now: Instant,
        ft: FlowType,
        link: LinkIdx,
        msg: LlcMessage,
    ) -> Received {
        match &self.local {
            Some(f) if f.kind.flow_type() == ft && f.qentry.is_none() => {
                self.assign(now, link, msg);
                Received::Handled
            }
            _ => Received::Dropped(DropReason::OutOfFlow),
        }
    }

    /// `smc_llc_event_handler` for a request (received or local).
    fn rx_request(&mut self, now: Instant, ev: Event) -> Received {
        if !self.link(ev.link).is_some_and(Link::usable) {
            return Received::Dropped(DropReason::LinkNotUsable);
        }
        let lcl = self.flow();
        let slot_free = self.local.as_ref().is_some_and(|f| f.qentry.is_none());
        match ev.msg.llc_type().base() {
            T_TEST_LINK => {
                let echo = msgs::with_response(ev.msg);
                let _ = self.send(ev.link, echo);
                Received::Handled
            }
            T_ADD_LINK => {
                let Some((a, ext_rkeys)) = msgs::add_link_parts(&ev.msg) else {
                    return Received::Dropped(DropReason::Ignored);
                };
                match self.role {
                    Role::Client if ev.local || msgs::is_empty_add_link(&a) => {
                        if lcl == Some(FlowType::AddLink) {
                            return Received::Dropped(DropReason::Parallel); // in progress
                        }
                        match self.flow_start(&ev) {
                            Some(r) => r,
                            None => {
                                let link = ev.link;
                                self.run_flow(now, FlowType::AddLink, None, |s| {
                                    s.cli_invite(link);
                                    Next::Done
                                });
                                Received::Handled
                            }
                        }
                    }
                    Role::Client if lcl == Some(FlowType::AddLink) && slot_free => {
                        self.assign(now, ev.link, ev.msg);
                        Received::Handled
                    }
                    Role::Client => match self.flow_start(&ev) {
                        Some(r) => r,
                        None => {
                            let link = ev.link;
                            self.run_flow(now, FlowType::AddLink, None, |s| {
                                s.cli_add_start(now, link, a, ext_rkeys, false)
                            });
                            Received::Handled
                        }
                    },
                    // The server ignores the client's suggestion and starts its own flow.
                    Role::Server => match self.flow_start(&ev) {
                        Some(r) => r,
                        None => {
                            let link = ev.link;
                            self.run_flow(now, FlowType::AddLink, None, |s| {
                                s.srv_add_start(now, link, false, None)
                            });
                            Received::Handled
                        }
                    },
                }
            }
            T_CONFIRM_LINK | T_ADD_LINK_CONT => {
                // "a flow is waiting for this message": any local flow with a free slot.
                if slot_free {
                    self.assign(now, ev.link, ev.msg);
                    Received::Handled
                } else {
                    Received::Dropped(DropReason::OutOfFlow)
                }
            }
            T_DELETE_LINK => {
                if lcl == Some(FlowType::AddLink) && slot_free && !ev.local {
                    // DELETE_LINK request during an ADD_LINK sequence.
                    self.assign(now, ev.link, ev.msg);
                    return Received::Handled;
                }
                if let Some(r) = self.flow_start(&ev) {
                    return r;
                }
                let LlcMessage::DeleteLink(d) = ev.msg else {
                    return Received::Dropped(DropReason::Ignored);
                };
                let link = ev.link;
                match self.role {
                    Role::Client => self.run_flow(now, FlowType::DelLink, None, |s| {
                        s.cli_delete(now, link, d);
                        Next::Done
                    }),
                    Role::Server => self.run_flow(now, FlowType::DelLink, None, |s| {
                        s.srv_del_start(now, link, d)
                    }),
                }
                Received::Handled
            }
            T_CONFIRM_RKEY => {
                if let LlcMessage::ConfirmRkey(c) = ev.msg {
                    self.rmt_confirm_rkey(ev.link, c);
                }
                Received::Handled
            }
            T_DELETE_RKEY => {
                match ev.msg {
                    LlcMessage::DeleteRkey(d) => self.rmt_delete_rkey(ev.link, d),
                    LlcMessage::DeleteRkeyV2(d) => self.rmt_delete_rkey_v2(ev.link, d),
                    _ => {}
                }
                Received::Handled
            }
            // "not used because max links is 3, and 3 rkeys fit into one CONFIRM_RKEY".
            T_CONFIRM_RKEY_CONT => Received::Dropped(DropReason::Ignored),
            T_REQ_ADD_LINK => match self.role {
                Role::Server => match self.flow_start(&ev) {
                    Some(r) => r,
                    None => {
                        let link = ev.link;
                        let req = Some((ev.link, ev.msg));
                        self.run_flow(now, FlowType::AddLink, None, |s| {
                            s.srv_add_start(now, link, false, req)
                        });
                        Received::Handled
                    }
                },
                // Only a client that sent REQUEST_ADD_LINK (SMC-Rv2) waits for its answer.
                Role::Client => Received::Dropped(DropReason::Ignored),
            },
            _ => {
                self.protocol_violation(now, ev.msg.llc_type().code());
                Received::ProtocolViolation
            }
        }
    }

    /// `smc_llc_flow_start` for the local flow: `None` if the flow is free (the caller
    /// starts it), else what `smc_llc_flow_parallel` did with the event.
    fn flow_start(&mut self, ev: &Event) -> Option<Received> {
        let ft = self.flow()?;
        let ty = ev.msg.llc_type().base();
        if (ty == T_ADD_LINK || ty == T_DELETE_LINK) && ft.code() != ty && self.delayed.is_none() {
            self.delayed = Some(ev.clone());
            return Some(Received::Delayed);
        }
        // "drop parallel or already-in-progress llc requests"
        Some(Received::Dropped(DropReason::Parallel))
    }

    /// Gives a message to the local flow: consumed at once if the flow waits, else parked in
    /// its slot for its next wait.
    fn assign(&mut self, now: Instant, link: LinkIdx, msg: LlcMessage) {
        let Some(mut flow) = self.local.take() else {
            return;
        };
        match flow.wait.take() {
            Some(w) => {
                let ft = flow.kind.flow_type();
                let kind = flow.kind;
                self.run_flow(now, ft, None, |s| s.consume(now, kind, w, link, msg));
            }
            None => {
                flow.qentry = Some((link, msg));
                self.local = Some(flow);
            }
        }
    }

    /// The waiting flow's wait ends without its message (timeout, failed send, its link
    /// went down).
    fn fail_wait(&mut self, now: Instant) {
        let Some(flow) = self.local.take() else {
            return;
        };
        let ft = flow.kind.flow_type();
        let (kind, q) = (flow.kind, flow.qentry);
        self.run_flow(now, ft, q, |s| s.flow_fail(now, kind));
    }

    /// A link became unusable: a flow waiting on it wakes up failed (`smc_llc_wait` with
    /// `lnk`).
    fn fail_waits_on(&mut self, now: Instant, link: LinkIdx) {
        if self
            .local
            .as_ref()
            .and_then(|f| f.wait.as_ref())
            .is_some_and(|w| w.bound == Some(link))
        {
            self.fail_wait(now);
        }
    }

    /// Runs one step of the local flow (`f` holds it while it runs) and stores what it waits
    /// for next.
    fn run_flow(
        &mut self,
        now: Instant,
        ft: FlowType,
        q: Option<(LinkIdx, LlcMessage)>,
        f: impl FnOnce(&mut Self) -> Next,
    ) {
        let outer = self.running.replace(ft);
        let next = f(self);
        self.running = outer;
        self.settle(now, q, next);
    }

    /// What runs when the local flow is free: the delayed event (`smc_llc_flow_stop`
    /// schedules it first), then a client's deferred DELETE_LINK, then the group's own
    /// events, then the local requests in the order they came.
    fn pump(&mut self, now: Instant) {
        // Every step below either starts a flow (then the loop stops) or consumes an item.
        loop {
            if self.terminated.is_some() || self.flow().is_some() {
                return;
            }
            if let Some(ev) = self.delayed.take() {
                if self.link(ev.link).is_some_and(Link::usable) {
                    self.rx_request(now, ev);
                }
                continue;
            }
            if !self.cli_dels.is_empty() {
                let d = self.cli_dels.remove(0);
                self.cli_send_delete(now, d);
                continue;
            }
            if let Some(mut ev) = self.local_events.pop_front() {
                // The link the event named may be gone: any usable one does.
                if !self.link(ev.link).is_some_and(Link::usable) {
                    match self.first_usable() {
                        Some(l) => ev.link = l,
                        None => continue,
                    }
                }
                self.rx_request(now, ev);
                continue;
            }
            if let Some(init) = self.initiators.pop_front() {
                let (rmb, op) = (init.rmb, init.op);
                self.run_flow(now, FlowType::Rkey, None, |s| s.rkey_start(now, rmb, op));
                continue;
            }
            return;
        }
    }

    // ------------------------------------------------------------------ helpers

    fn link_mut(&mut self, idx: LinkIdx) -> Option<&mut Link> {
        self.links.get_mut(idx.index())?.as_mut()
    }

    fn sendable(&self, idx: LinkIdx) -> bool {
        self.link(idx).is_some_and(Link::sendable)
    }

    /// `smc_llc_usable_link`.
    fn first_usable(&self) -> Option<LinkIdx> {
        self.links().find(|(_, l)| l.usable()).map(|(i, _)| i)
    }

    fn find_link_by_id(&self, link_id: u8) -> Option<LinkIdx> {
        if link_id == 0 {
            return None;
        }
        self.links()
            .find(|(_, l)| l.link_id == link_id)
            .map(|(i, _)| i)
    }

    fn push(&mut self, a: LlcAction) {
        // After termination only results of requests in progress go out.
        if self.terminated.is_some()
            && !matches!(
                a,
                LlcAction::FirstContact(_)
                    | LlcAction::RkeyConfirmed { .. }
                    | LlcAction::RkeyDeleted { .. }
            )
        {
            return;
        }
        self.actions.push_back(a);
    }

    /// Posts `msg` on `link` if it can send (`smc_wr_tx_link_hold`); `None` is the
    /// kernel's `-ENOLINK`.
    fn send(&mut self, link: LinkIdx, msg: LlcMessage) -> Option<SendId> {
        if self.terminated.is_some() || !self.sendable(link) {
            return None;
        }
        Some(self.send_raw(link, msg))
    }

    fn send_raw(&mut self, link: LinkIdx, msg: LlcMessage) -> SendId {
        // smc_llc_init_msg_hdr: the group's version decides the header of every message.
        let msg = if self.cfg.v2 {
            msg.into_v2()
        } else {
            msg.into_v1()
        };
        let id = SendId(self.next_send);
        self.next_send += 1;
        self.actions.push_back(LlcAction::Send { link, id, msg });
        id
    }

    /// `smcr_next_link_id`: the next non-zero id no link uses.
    fn alloc_link_id(&mut self) -> u8 {
        loop {
            self.next_link_id = self.next_link_id.wrapping_add(1);
            let id = self.next_link_id;
            if id != 0 && self.find_link_by_id(id).is_none() {
                return id;
            }
        }
    }

    /// `smc_llc_alloc_alt_link`: a free slot for a link that makes the group `new_t`.
    fn alloc_alt_link(&self, new_t: LgrType) -> Option<LinkIdx> {
        if self.lgr_type == LgrType::Symmetric
            || (self.lgr_type != LgrType::Single && new_t.is_asymmetric())
        {
            return None;
        }
        if self.lgr_type == LgrType::Single && self.cfg.max_links <= 1 {
            return None;
        }
        let mut free = LinkIdx::all().filter(|i| self.link(*i).is_none());
        if new_t.is_asymmetric() {
            free.last()
        } else {
            free.next()
        }
    }

    /// `smc_pnet_find_alt_roce`: a port on a device other than `dev`.
    fn find_alt_port(&self, dev: u32) -> Option<LocalPort> {
        self.cfg.ports.iter().find(|p| p.dev != dev).copied()
    }

    /// `smcr_lgr_set_type`: also clears every usable link's asymmetric tag.
    fn set_type(&mut self, t: LgrType) {
        for l in self.links.iter_mut().flatten() {
            if l.usable() {
                l.asym = false;
            }
        }
        if self.lgr_type != t {
            self.lgr_type = t;
            self.push(LlcAction::GroupType(t));
        }
    }

    /// `smcr_lgr_set_type_asym` for asymmetric types, else `smcr_lgr_set_type`.
    fn set_type_for(&mut self, t: LgrType, link: LinkIdx) {
        self.set_type(t);
        if t.is_asymmetric()
            && let Some(l) = self.link_mut(link)
        {
            l.asym = true;
        }
    }

    /// `smc_llc_link_active`: the link carries connections; TEST_LINK starts.
    fn activate_link(&mut self, now: Instant, link: LinkIdx) {
        let testlink = !self.cfg.testlink_time.is_zero();
        let Some(l) = self.link_mut(link) else {
            return;
        };
        l.state = LinkState::Active;
        l.last_rx = l.last_rx.max(now);
        l.testlink = if testlink {
            Testlink::Idle
        } else {
            Testlink::Off
        };
        self.push(LlcAction::LinkActive { link });
    }

    /// `smcr_link_clear`: the slot is free, its rtokens and RMB keys gone.
    fn clear_link(&mut self, now: Instant, link: LinkIdx) {
        if self.link(link).is_none() {
            return;
        }
        self.links[link.index()] = None;
        for row in self.rtokens.iter_mut().flatten() {
            row[link.index()] = None;
        }
        for r in &mut self.rmbs {
            r.keys[link.index()] = None;
        }
        self.push(LlcAction::LinkDeleted { link });
        self.fail_waits_on(now, link);
    }

    /// `smc_llc_find_asym_link`: when two usable links share a local GID, the one of them
    /// whose peer GID another link also has.
    fn find_asym_link(&self) -> Option<LinkIdx> {
        let usable: Vec<(LinkIdx, &Link)> = self.links().filter(|(_, l)| l.usable()).collect();
        let n = usable.len();
        let (a, b) = (0..n)
            .flat_map(|a| (a + 1..n).map(move |b| (a, b)))
            .find(|&(a, b)| usable[a].1.port.gid == usable[b].1.port.gid)?;
        let peer_gid = |x: usize| usable[x].1.peer.map(|p| p.gid);
        for k in 0..n {
            if k != a && peer_gid(a) == peer_gid(k) {
                return Some(usable[a].0);
            }
            if k != b && peer_gid(b) == peer_gid(k) {
                return Some(usable[b].0);
            }
        }
        None
    }

    // ------------------------------------------------------------------ link down

    /// `smcr_link_down_cond` + `smcr_link_down`: only an active link goes down, once.
    fn link_down_cond(&mut self, now: Instant, link: LinkIdx, is_dev_err: bool) {
        if self.terminated.is_some() {
            return;
        }
        let Some(l) = self.link_mut(link) else { return };
        if l.state != LinkState::Active {
            return;
        }
        l.state = LinkState::Inactive;
        l.testlink = Testlink::Off;
        let link_id = l.link_id;
        self.push(LlcAction::LinkDown { link });
        let Some(to) = self.switch_conns(now, link, is_dev_err) else {
            // No backup link: the group terminated.
            return;
        };
        self.set_type(LgrType::Single);
        match self.role {
            // smc_llc_srv_delete_link_local: a DELETE_LINK flow of our own, forwarded to the
            // client over the surviving link.
            Role::Server => self.local_events.push_back(Event {
                link: to,
                msg: msgs::delete_link(link_id, false, true, DeleteLinkReason::LostPath),
                local: true,
            }),
            // The client tells the server and clears the link, after the running flow (at
            // most SMC_LLC_WAIT_TIME).
            Role::Client => {
                let d = CliDelPending {
                    del: link,
                    link_id,
                    to,
                    deadline: now + self.cfg.wait_time,
                };
                if self.flow().is_some() {
                    self.cli_dels.push(d);
                } else {
                    self.cli_send_delete(now, d);
                }
            }
        }
        self.fail_waits_on(now, link);
    }

    /// `smc_switch_conns`: the first active link other than `from` (on a device error not
    /// on the same device port); none terminates the group.
    fn switch_conns(&mut self, now: Instant, from: LinkIdx, is_dev_err: bool) -> Option<LinkIdx> {
        let from_port = self.link(from).map(|l| (l.port.dev, l.port.port));
        let to = self
            .links()
            .filter(|(i, l)| *i != from && l.state == LinkState::Active)
            .find(|(_, l)| !(is_dev_err && Some((l.port.dev, l.port.port)) == from_port))
            .map(|(i, _)| i);
        match to {
            Some(to) => {
                self.push(LlcAction::MoveConnections { from, to });
                Some(to)
            }
            None => {
                self.terminate_with(now, TermReason::NoLinkLeft, false);
                None
            }
        }
    }

    fn cli_send_delete(&mut self, now: Instant, d: CliDelPending) {
        if self.terminated.is_some() {
            return;
        }
        // The slot may have been cleared (the server's DELETE_LINK came first) or reused.
        if !self
            .link(d.del)
            .is_some_and(|l| l.link_id == d.link_id && l.state == LinkState::Inactive)
        {
            return;
        }
        let msg = msgs::delete_link(d.link_id, false, true, DeleteLinkReason::LostPath);
        let _ = self.send(d.to, msg);
        self.clear_link(now, d.del);
    }

    // ------------------------------------------------------------------ termination

    /// `smc_llc_protocol_violation`.
    fn protocol_violation(&mut self, now: Instant, llc_type: u8) {
        self.terminate_with(now, TermReason::ProtocolViolation { llc_type }, false);
    }

    /// `__smc_lgr_terminate` / `smc_lgr_cleanup`: DELETE_LINK ALL on a sendable link, then
    /// the group is gone.
    fn terminate_with(&mut self, _now: Instant, reason: TermReason, orderly: bool) {
        if self.terminated.is_some() {
            return;
        }
        if let Some(f) = self.local.take() {
            self.abort_flow(f.kind);
        }
        while let Some(init) = self.initiators.pop_front() {
            self.rkey_result(init.rmb, init.op, Err(RkeyError::Terminated));
        }
        self.delayed = None;
        self.local_events.clear();
        self.cli_dels.clear();
        let code = reason.sent_code();
        self.start_delete_all(orderly, code);
        self.terminated = Some(reason);
        self.actions
            .push_back(LlcAction::Terminated { reason, sent: code });
    }

    /// `smc_llc_send_link_delete_all`.
    fn start_delete_all(&mut self, orderly: bool, reason: DeleteLinkReason) {
        let mut chain = DeleteAll {
            msg: msgs::delete_link(0, false, orderly, reason),
            tried: [false; SMC_LINKS_PER_LGR_MAX],
            current: None,
        };
        if self.delete_all_next(&mut chain) {
            self.del_all.push(chain);
        }
    }

    fn delete_all_next(&mut self, chain: &mut DeleteAll) -> bool {
        for i in LinkIdx::all() {
            if !chain.tried[i.index()] && self.sendable(i) {
                chain.tried[i.index()] = true;
                chain.current = Some(self.send_raw(i, chain.msg.clone()));
                return true;
            }
        }
        false
    }

    fn rkey_result(&mut self, rmb: RmbId, op: RkeyOp, result: Result<(), RkeyError>) {
        match op {
            RkeyOp::Confirm { .. } => {
                if result.is_ok()
                    && let Some(r) = self.rmbs.iter_mut().find(|r| r.id == rmb)
                {
                    r.confirmed = true;
                }
                self.push(LlcAction::RkeyConfirmed { rmb, result });
            }
            RkeyOp::Delete => {
                // smcr_buf_unuse: is_conf_rkey = false whatever the peer said.
                if let Some(pos) = self.rmbs.iter().position(|r| r.id == rmb && !r.used) {
                    self.rmbs.remove(pos);
                }
                self.push(LlcAction::RkeyDeleted { rmb, result });
            }
        }
    }

    // ------------------------------------------------------------------ rtokens

    /// `smc_rtoken_add`: an existing index with the same key on `link`, else the first free
    /// one; `true` if new.
    fn rtoken_add_inner(&mut self, link: LinkIdx, key: RmbKey) -> Option<(u8, bool)> {
        let li = link.index();
        if let Some(i) = self
            .rtokens
            .iter()
            .position(|r| r.is_some_and(|row| row[li] == Some(key)))
        {
            return Some((i as u8, false));
        }
        let i = match self.rtokens.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.rtokens.len() < SMC_RMBS_PER_LGR_MAX => {
                self.rtokens.push(None);
                self.rtokens.len() - 1
            }
            None => return None,
        };
        let mut row = [None; SMC_LINKS_PER_LGR_MAX];
        row[li] = Some(key);
        self.rtokens[i] = Some(row);
        self.push(LlcAction::SetRtoken {
            idx: i as u8,
            link,
            key,
        });
        Some((i as u8, true))
    }

    /// `smc_rtoken_set`: the RMB the peer knows as `rkey_known` on `link` is at `key` on
    /// `link_new`; an rkey we do not know is ignored.
    fn rtoken_set(&mut self, link: LinkIdx, link_new: LinkIdx, rkey_known: u32, key: RmbKey) {
        let Some(i) = self.rtokens.iter().position(|r| {
            r.is_some_and(|row| row[link.index()].is_some_and(|k| k.rkey == rkey_known))
        }) else {
            return;
        };
        if let Some(row) = self.rtokens[i].as_mut() {
            row[link_new.index()] = Some(key);
        }
        self.push(LlcAction::SetRtoken {
            idx: i as u8,
            link: link_new,
            key,
        });
    }

    /// `smc_rtoken_delete`: the RMB the peer knows as `rkey` on `link` goes on every link.
    fn rtoken_delete(&mut self, link: LinkIdx, rkey: u32) -> bool {
        let Some(i) = self
            .rtokens
            .iter()
            .position(|r| r.is_some_and(|row| row[link.index()].is_some_and(|k| k.rkey == rkey)))
        else {
            return false;
        };
        self.rtokens[i] = None;
        while self.rtokens.last() == Some(&None) {
            self.rtokens.pop();
        }
        self.push(LlcAction::DeleteRtoken { idx: i as u8 });
        true
    }

    /// `smc_llc_rmt_conf_rkey`: the remote RKEY flow, answered at once.
    fn rmt_confirm_rkey(&mut self, link: LinkIdx, c: ConfirmRkey) {
        let mut resp = c;
        resp.flags |= LlcFlags::RESPONSE;
        let ok = c.num_others <= SMC_LLC_RKEYS_PER_MSG
            && match self.rtoken_add_inner(
                link,
                RmbKey {
                    rkey: c.rkey,
                    vaddr: c.vaddr,
                },
            ) {
                Some((idx, _)) => {
                    let n = usize::from(c.num_others.min(SMC_LLC_RKEYS_PER_MSG - 1));
                    for o in &c.others[..n] {
                        // smc_rtoken_set2: a link id we do not have is ignored.
                        if let Some(l2) = self.find_link_by_id(o.link_id) {
                            let key = RmbKey {
                                rkey: o.rkey,
                                vaddr: o.vaddr,
                            };
                            if let Some(row) = self.rtokens[usize::from(idx)].as_mut() {
                                row[l2.index()] = Some(key);
                            }
                            self.push(LlcAction::SetRtoken { idx, link: l2, key });
                        }
                    }
                    true
                }
                None => false,
            };
        if !ok {
            resp.flags |= LlcFlags::RKEY_NEGATIVE | LlcFlags::RKEY_RETRY;
        }
        let _ = self.send(link, LlcMessage::ConfirmRkey(resp));
    }

    /// `smc_llc_rmt_delete_rkey`: at most [`SMC_LLC_DEL_RKEY_MAX`] rkeys; bit `7 - i` of
    /// the error mask for each one we do not know.
    fn rmt_delete_rkey(&mut self, link: LinkIdx, d: DeleteRkey) {
        let mut resp = d;
        let n = usize::from(d.num_rkeys).min(SMC_LLC_DEL_RKEY_MAX);
        let mut mask = 0u8;
        for (i, rkey) in d.rkeys[..n].iter().enumerate() {
            if !self.rtoken_delete(link, *rkey) {
                mask |= 1 << (SMC_LLC_DEL_RKEY_MAX - 1 - i);
            }
        }
        if mask != 0 {
            resp.flags |= LlcFlags::RKEY_NEGATIVE;
            resp.err_mask = mask;
        }
        resp.flags |= LlcFlags::RESPONSE;
        let _ = self.send(link, LlcMessage::DeleteRkey(resp));
    }

    /// `smc_llc_rmt_delete_rkey` in a v2 group: up to 255 rkeys
    /// (`SMC_LLC_RKEYS_PER_MSG_V2`); the response keeps the count, zeroes the rkeys and says
    /// how many were unknown (`num_inval_rkeys`, with the negative flag when not zero).
    fn rmt_delete_rkey_v2(&mut self, link: LinkIdx, d: DeleteRkeyV2) {
        let mut inval = 0u8;
        for rkey in &d.rkeys {
            if !self.rtoken_delete(link, *rkey) {
                inval = inval.saturating_add(1);
            }
        }
        let mut flags = d.flags | LlcFlags::RESPONSE;
        if inval != 0 {
            flags |= LlcFlags::RKEY_NEGATIVE;
        }
        let resp = DeleteRkeyV2 {
            flags,
            num_inval_rkeys: inval,
            rkeys: alloc::vec![0; d.rkeys.len()],
        };
        let _ = self.send(link, LlcMessage::DeleteRkeyV2(resp));
    }

    /// Invariants a test may check after any input.
    #[cfg(test)]
    fn check_invariants(&self) -> Result<(), &'static str> {
        let used: Vec<&Link> = self.links.iter().flatten().collect();
        if used.len() > SMC_LINKS_PER_LGR_MAX {
            return Err("more links than slots");
        }
        for (a, la) in used.iter().enumerate() {
            if la.link_id == 0 && !(self.role == Role::Client && la.state == LinkState::Activating)
            {
                return Err("link id 0 on a confirmed link");
            }
            if used[a + 1..]
                .iter()
                .any(|lb| la.link_id != 0 && lb.link_id == la.link_id)
            {
                return Err("two links with one id");
            }
        }
        if self.rtokens.len() > SMC_RMBS_PER_LGR_MAX {
            return Err("too many rtokens");
        }
        if self.running.is_some() {
            return Err("a flow step is still running");
        }
        if self.terminated.is_none() {
            if self.local.is_none() && self.delayed.is_some() {
                return Err("a delayed event with no flow to wait for");
            }
            if self
                .local
                .as_ref()
                .is_some_and(|f| f.wait.is_some() && f.qentry.is_some())
            {
                return Err("a waiting flow with an unconsumed message");
            }
            if self.lgr_type != LgrType::None && self.active_links() == 0 {
                return Err("a group type without an active link");
            }
        }
        Ok(())
    }
}

/// The LLC layer switches on the low nibble of byte 0 for v1 and v2 headers alike
/// (`llc_type`). The flows see the v1 variants, except that a v2 group keeps what only the v2
/// bodies hold: ADD_LINK as [`LlcMessage::AddLinkV2`] (its rkey extension) and DELETE_RKEY as
/// [`LlcMessage::DeleteRkeyV2`] (up to 255 rkeys). A v1 group reads a v2 message over its
/// first 44 bytes, as the kernel's v1 group does. A message the codec kept raw (the v1-header
/// 0x05, or one built by hand) is read as its base type over the first 44 bytes.
/// `Err(byte0)` is a type the switch has no case for.
fn normalize(msg: LlcMessage, v2: bool) -> Result<LlcMessage, u8> {
    let raw = match msg {
        LlcMessage::Raw(raw) => raw,
        m @ (LlcMessage::AddLink(_)
        | LlcMessage::AddLinkV2(_)
        | LlcMessage::DeleteRkey(_)
        | LlcMessage::DeleteRkeyV2(_))
            if v2 =>
        {
            return Ok(m.into_v2());
        }
        m => return Ok(m.into_v1()),
    };
    let b = raw.as_bytes();
    let ty = b.first().copied().unwrap_or(0);
    let (version, base) = (ty >> 4, ty & 0x0F);
    if version != 0 && version != 2 {
        return Err(ty);
    }
    match base {
        T_REQ_ADD_LINK => Ok(LlcMessage::ReqAddLink(ReqAddLink {
            flags: LlcFlags::from_bits_retain(b.get(3).copied().unwrap_or(0)),
            gids: Vec::new(),
        })),
        T_CONFIRM_LINK..=T_DELETE_LINK | T_CONFIRM_RKEY..=T_DELETE_RKEY => {
            let mut v1 = [0u8; LLC_LEN];
            v1.copy_from_slice(b.get(..LLC_LEN).ok_or(ty)?);
            v1[0] = base;
            v1[1] = LLC_LEN as u8;
            if version == 2 {
                v1[2] = 0; // the high byte of the v2 length
            }
            LlcMessage::parse(&v1)
                .map(|m| if v2 { m.into_v2() } else { m })
                .map_err(|_| ty)
        }
        _ => Err(ty),
    }
}

impl fmt::Display for TermReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TermReason::ProtocolViolation { llc_type } => {
                write!(f, "LLC protocol violation (type {llc_type:#04x})")
            }
            TermReason::PeerDeleteAll(r) => {
                write!(f, "peer deleted the link group ({:#x})", r.code())
            }
            TermReason::Local(r) => write!(f, "terminated locally ({:#x})", r.code()),
            TermReason::NoLinkLeft => f.write_str("no link left"),
            TermReason::FirstContactFailed(e) => write!(f, "first contact failed: {e:?}"),
        }
    }
}
