//! The local flows as explicit states: where the kernel's worker would sleep in
//! `smc_llc_wait` (for a message) or in a verbs call (for the driver), a flow here returns
//! [`Next`] and resumes when the message, the driver's answer or the timeout comes.
//!
//! Waiting follows `smc_llc_wait`: the flow's one parked message (`qentry`) is taken first;
//! a message of another type than expected is dropped and ends the wait as a failure,
//! except that a DELETE_LINK request where ADD_LINK was expected is parked as the delayed
//! event; a wait bound to a link ends failed as soon as that link is unusable.

use super::*;
use smc_proto::llc::{AddLinkCont, AddLinkContRkey, Rtoken};

/// The local flow while it rests.
#[derive(Debug)]
pub(super) struct Flow {
    pub(super) kind: Kind,
    /// `flow->qentry`: a message for the flow's next wait.
    pub(super) qentry: Option<(LinkIdx, LlcMessage)>,
    /// What it waits for; `None` while the driver works.
    pub(super) wait: Option<MsgWait>,
}

/// A wait for the peer's next message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MsgWait {
    /// The base type expected (`exp_msg`); `None` takes any.
    expect: Option<u8>,
    pub(super) deadline: Instant,
    /// The link whose loss ends the wait (`lnk`).
    pub(super) bound: Option<LinkIdx>,
    /// The message this wait answers; its failed send ends the wait.
    pub(super) sent: Option<SendId>,
}

/// Which driver answer a resting flow waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Awaiting {
    Created(LinkIdx),
    Ready(LinkIdx),
    Registered(RmbId),
}

/// A driver answer.
#[derive(Debug)]
pub(super) enum StepResult {
    Created(Result<CreatedLink, StepFailed>),
    Ready(bool),
    Registered(Result<Vec<(LinkIdx, RmbKey)>, StepFailed>),
}

/// What a flow does after a step.
#[derive(Debug)]
pub(super) enum Next {
    Wait(Kind, MsgWait),
    Driver(Kind),
    Done,
}

#[derive(Debug)]
pub(super) enum Kind {
    /// `smcr_serv_conf_first_link`: waiting for the CONFIRM_LINK response.
    SrvFirst {
        link: LinkIdx,
    },
    SrvAdd(SrvAdd),
    /// `smc_llc_process_srv_delete_link`: waiting for the client's DELETE_LINK.
    SrvDel {
        del: LinkIdx,
    },
    CliFirst {
        link: LinkIdx,
        stage: CliFirstStage,
    },
    CliAdd(CliAdd),
    Rkey(RkeyFlow),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CliFirstStage {
    AwaitConfirm,
    Rts,
    AwaitAddLink,
}

/// `smc_llc_srv_add_link` (and `smc_llc_delete_asym_link` after it).
#[derive(Debug)]
pub(super) struct SrvAdd {
    /// The link the ADD_LINK and ADD_LINK_CONT go over.
    link: LinkIdx,
    new: LinkIdx,
    new_t: LgrType,
    stage: SrvAddStage,
    rkx: RkeyExchange,
    first_contact: bool,
    /// A REQUEST_ADD_LINK that started the flow, answered if no ADD_LINK went out.
    req: Option<(LinkIdx, LlcMessage)>,
    add_sent: bool,
    /// v2: the client's rkeys from its ADD_LINK response, applied once the link is ready.
    peer_rkeys: Vec<AddLinkContRkey>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SrvAddStage {
    Create,
    AwaitResp,
    Ready,
    Rkey,
    Confirm,
    AsymDel { asym: LinkIdx, to: LinkIdx },
}

/// `smc_llc_cli_add_link`.
#[derive(Debug)]
pub(super) struct CliAdd {
    link: LinkIdx,
    /// The server's request, sent back on a reject.
    req: AddLink,
    new: LinkIdx,
    new_t: LgrType,
    stage: CliAddStage,
    rkx: RkeyExchange,
    first_contact: bool,
    /// v2: the server's rkeys from its ADD_LINK request's extension.
    peer_rkeys: Vec<AddLinkContRkey>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CliAddStage {
    Create,
    Ready,
    Rkey,
    Confirm,
    Activate,
}

/// `smcr_lgr_reg_rmbs` / `smcr_buf_unuse`: the local RKEY flow.
#[derive(Debug)]
pub(super) struct RkeyFlow {
    rmb: RmbId,
    op: RkeyOp,
    registering: bool,
}

/// The ADD_LINK_CONT loop (`smc_llc_{srv,cli}_rkey_exchange`).
#[derive(Debug, Default)]
struct RkeyExchange {
    /// Our RMBs as {rkey on the old link, key on the new one}.
    pairs: Vec<AddLinkContRkey>,
    sent: usize,
    /// `num_rkeys_send`.
    send_left: u8,
    /// `num_rkeys_recv`: the peer's count minus what its last message carried.
    recv_left: u8,
    rounds: u32,
}

impl RkeyExchange {
    fn new(pairs: Vec<AddLinkContRkey>) -> RkeyExchange {
        let send_left = u8::try_from(pairs.len()).unwrap_or(u8::MAX);
        RkeyExchange {
            pairs,
            sent: 0,
            send_left,
            recv_left: 0,
            rounds: 0,
        }
    }

    /// The next message: `num_rkeys` is what is left including this message's entries.
    fn next_cont(&mut self, link_num: u8, resp: bool) -> LlcMessage {
        let mut rkeys = [AddLinkContRkey::default(); SMC_LLC_RKEYS_PER_CONT_MSG];
        let num = self.send_left;
        let n = usize::from(num).min(SMC_LLC_RKEYS_PER_CONT_MSG);
        for slot in rkeys.iter_mut().take(n) {
            if let Some(p) = self.pairs.get(self.sent) {
                *slot = *p;
                self.sent += 1;
            }
        }
        self.send_left -= n as u8;
        msgs::add_link_cont(link_num, num, rkeys, resp)
    }

    fn more(&self) -> bool {
        self.send_left > 0 || self.recv_left > 0
    }
}

impl Kind {
    pub(super) fn flow_type(&self) -> FlowType {
        match self {
            Kind::SrvDel { .. } => FlowType::DelLink,
            // "change flow type from ADD_LINK into DEL_LINK"
            Kind::SrvAdd(s) if matches!(s.stage, SrvAddStage::AsymDel { .. }) => FlowType::DelLink,
            Kind::Rkey(_) => FlowType::Rkey,
            _ => FlowType::AddLink,
        }
    }

    pub(super) fn awaiting(&self) -> Option<Awaiting> {
        match self {
            Kind::SrvAdd(s) => match s.stage {
                SrvAddStage::Create => Some(Awaiting::Created(s.new)),
                SrvAddStage::Ready => Some(Awaiting::Ready(s.new)),
                _ => None,
            },
            Kind::CliFirst {
                link,
                stage: CliFirstStage::Rts,
            } => Some(Awaiting::Ready(*link)),
            Kind::CliAdd(s) => match s.stage {
                CliAddStage::Create => Some(Awaiting::Created(s.new)),
                CliAddStage::Ready | CliAddStage::Activate => Some(Awaiting::Ready(s.new)),
                _ => None,
            },
            Kind::Rkey(r) if r.registering => Some(Awaiting::Registered(r.rmb)),
            _ => None,
        }
    }
}

fn valid_mtu(mtu: u8) -> bool {
    // IB_MTU_256 (1) … IB_MTU_4096 (5); the kernel rejects 0 and fails later on others.
    (1..=5).contains(&mtu)
}

impl Llc {
    fn wait(
        &self,
        now: Instant,
        expect: Option<u8>,
        dur: Duration,
        bound: Option<LinkIdx>,
        sent: Option<SendId>,
    ) -> MsgWait {
        MsgWait {
            expect,
            deadline: now + dur,
            bound,
            sent,
        }
    }

    /// Stores what the flow waits for next, consuming its parked message first.
    pub(super) fn settle(&mut self, now: Instant, q: Option<(LinkIdx, LlcMessage)>, next: Next) {
        let mut q = q;
        let mut next = next;
        loop {
            if self.terminated.is_some() {
                if let Next::Wait(k, _) | Next::Driver(k) = next {
                    self.abort_flow(k);
                }
                return;
            }
            match next {
                Next::Done => return,
                Next::Driver(kind) => {
                    self.local = Some(Flow {
                        kind,
                        qentry: q,
                        wait: None,
                    });
                    return;
                }
                Next::Wait(kind, w) => {
                    let outer = self.running.replace(kind.flow_type());
                    if w.bound
                        .is_some_and(|b| !self.link(b).is_some_and(Link::usable))
                    {
                        next = self.flow_fail(now, kind);
                    } else if let Some((link, msg)) = q.take() {
                        next = self.consume(now, kind, w, link, msg);
                    } else {
                        self.running = outer;
                        self.local = Some(Flow {
                            kind,
                            qentry: None,
                            wait: Some(w),
                        });
                        return;
                    }
                    self.running = outer;
                }
            }
        }
    }

    /// A waiting flow gets a message (`smc_llc_wait` after its wake-up).
    pub(super) fn consume(
        &mut self,
        now: Instant,
        kind: Kind,
        w: MsgWait,
        link: LinkIdx,
        msg: LlcMessage,
    ) -> Next {
        let t = msg.llc_type().base();
        match w.expect {
            Some(e) if e != t => {
                if e == T_ADD_LINK && t == T_DELETE_LINK && self.delayed.is_none() {
                    // "flow_start will delay the unexpected msg"
                    self.delayed = Some(Event {
                        link,
                        msg,
                        local: false,
                    });
                }
                self.flow_fail(now, kind)
            }
            _ => self.flow_msg(now, kind, msg),
        }
    }

    pub(super) fn flow_msg(&mut self, now: Instant, kind: Kind, msg: LlcMessage) -> Next {
        match kind {
            Kind::SrvFirst { link } => self.srv_first_msg(now, link, msg),
            Kind::SrvAdd(st) => self.srv_add_msg(now, st, msg),
            Kind::SrvDel { del } => self.srv_del_finish(now, del),
            Kind::CliFirst { link, stage } => self.cli_first_msg(now, link, stage, msg),
            Kind::CliAdd(st) => self.cli_add_msg(now, st, msg),
            Kind::Rkey(st) => self.rkey_msg(st, msg),
        }
    }

    pub(super) fn flow_fail(&mut self, now: Instant, kind: Kind) -> Next {
        match kind {
            Kind::SrvFirst { .. } => self.first_contact_failed(now, FirstContactError::TimedOut),
            Kind::SrvAdd(st) => self.srv_add_fail(now, st),
            // The kernel clears the link whether or not the client answered.
            Kind::SrvDel { del } => self.srv_del_finish(now, del),
            Kind::CliFirst { stage, .. } => match stage {
                CliFirstStage::AwaitConfirm => {
                    self.first_contact_failed(now, FirstContactError::TimedOut)
                }
                CliFirstStage::AwaitAddLink => {
                    // "no DECLINE received, go with one link"
                    self.push(LlcAction::FirstContact(Ok(FirstContactDone {
                        add_link_timed_out: true,
                    })));
                    Next::Done
                }
                CliFirstStage::Rts => self.first_contact_failed(now, FirstContactError::LinkFailed),
            },
            Kind::CliAdd(st) => self.cli_add_fail(now, st),
            Kind::Rkey(st) => {
                self.rkey_result(st.rmb, st.op, Err(RkeyError::Timeout));
                Next::Done
            }
        }
    }

    pub(super) fn flow_step(&mut self, now: Instant, kind: Kind, r: StepResult) -> Next {
        match kind {
            Kind::SrvAdd(st) => self.srv_add_step(now, st, r),
            Kind::CliFirst { link, .. } => self.cli_first_step(now, link, r),
            Kind::CliAdd(st) => self.cli_add_step(now, st, r),
            Kind::Rkey(st) => self.rkey_step(now, st, r),
            other => Next::Driver(other),
        }
    }

    /// The group terminated under a resting flow: its requester hears of it.
    pub(super) fn abort_flow(&mut self, kind: Kind) {
        let first = match &kind {
            Kind::SrvFirst { .. } | Kind::CliFirst { .. } => true,
            Kind::SrvAdd(s) => s.first_contact,
            Kind::CliAdd(s) => s.first_contact,
            Kind::Rkey(r) => {
                self.rkey_result(r.rmb, r.op, Err(RkeyError::Terminated));
                false
            }
            Kind::SrvDel { .. } => false,
        };
        if first {
            self.push(LlcAction::FirstContact(Err(FirstContactError::Terminated)));
        }
    }

    fn first_contact_failed(&mut self, now: Instant, e: FirstContactError) -> Next {
        self.push(LlcAction::FirstContact(Err(e)));
        self.terminate_with(now, TermReason::FirstContactFailed(e), false);
        Next::Done
    }

    fn used_rmbs(&self) -> Vec<RmbId> {
        self.rmbs.iter().filter(|r| r.used).map(|r| r.id).collect()
    }

    /// The RMBs to exchange for a new link: in use, with a key on both links (at most 255,
    /// the count is one byte).
    fn rkey_pairs(&self, old: LinkIdx, new: LinkIdx) -> Vec<AddLinkContRkey> {
        self.rmbs
            .iter()
            .filter(|r| r.used)
            .filter_map(|r| match (r.keys[old.index()], r.keys[new.index()]) {
                (Some(ko), Some(kn)) => Some(AddLinkContRkey {
                    rkey: ko.rkey,
                    rkey_new: kn.rkey,
                    vaddr_new: kn.vaddr,
                }),
                _ => None,
            })
            .take(SMC_RMBS_PER_LGR_MAX)
            .collect()
    }

    /// Applies the peer's ADD_LINK_CONT; returns `num_rkeys_recv` after it.
    fn apply_cont(&mut self, old: LinkIdx, new: LinkIdx, c: &AddLinkCont) -> u8 {
        let n = usize::from(c.num_rkeys).min(SMC_LLC_RKEYS_PER_CONT_MSG);
        for rt in &c.rkeys[..n] {
            let key = RmbKey {
                rkey: rt.rkey_new,
                vaddr: rt.vaddr_new,
            };
            self.rtoken_set(old, new, rt.rkey, key);
        }
        c.num_rkeys - n as u8
    }

    fn record_created(&mut self, new: LinkIdx, c: &CreatedLink) {
        if let Some(l) = self.link_mut(new) {
            l.qpn = c.qpn;
            l.psn = c.psn;
        }
        for (id, key) in &c.rmb_keys {
            if let Some(r) = self.rmbs.iter_mut().find(|r| r.id == *id) {
                r.keys[new.index()] = Some(*key);
            }
        }
    }

    fn link_id_of(&self, link: LinkIdx) -> u8 {
        self.link(link).map_or(0, |l| l.link_id)
    }

    /// `smc_link_downing`: an active link becomes inactive, once.
    pub(super) fn link_going_down(&mut self, link: LinkIdx) -> bool {
        match self.link_mut(link) {
            Some(l) if l.state == LinkState::Active => {
                l.state = LinkState::Inactive;
                l.testlink = Testlink::Off;
                self.push(LlcAction::LinkDown { link });
                true
            }
            _ => false,
        }
    }

    pub(super) fn queue_add_link_local(&mut self, via: LinkIdx) {
        if self
            .local_events
            .iter()
            .any(|e| e.msg.llc_type() == LlcType::AddLink)
        {
            return;
        }
        self.local_events.push_back(Event {
            link: via,
            msg: LlcMessage::AddLink(AddLink::default()),
            local: true,
        });
    }

    // ------------------------------------------------------------ first contact, server

    pub(super) fn srv_first_begin(&mut self, now: Instant) -> Next {
        let link = LinkIdx::FIRST;
        let Some(l) = self.link(link) else {
            return self.first_contact_failed(now, FirstContactError::LinkFailed);
        };
        let msg = msgs::confirm_link(l, false, self.cfg.max_links, self.announced_max_conns());
        match self.send(link, msg) {
            Some(id) => Next::Wait(
                Kind::SrvFirst { link },
                self.wait(
                    now,
                    Some(T_CONFIRM_LINK),
                    self.cfg.srv_confirm_link_timeout,
                    Some(link),
                    Some(id),
                ),
            ),
            None => self.first_contact_failed(now, FirstContactError::LinkFailed),
        }
    }

    fn srv_first_msg(&mut self, now: Instant, link: LinkIdx, msg: LlcMessage) -> Next {
        let LlcMessage::ConfirmLink(c) = msg else {
            return self.first_contact_failed(now, FirstContactError::TimedOut);
        };
        if let Some(l) = self.link_mut(link) {
            l.peer_link_uid = c.link_uid;
        }
        if !c.flags.no_rmbe_eyecatcher() {
            return self.first_contact_failed(now, FirstContactError::RmbeEyecatcher);
        }
        self.activate_link(now, link);
        self.set_type(LgrType::Single);
        // "initial contact - try to establish second link"
        self.srv_add_start(now, link, true, None)
    }

    // ------------------------------------------------------------ first contact, client

    pub(super) fn cli_first_begin(&mut self, now: Instant) -> Next {
        Next::Wait(
            Kind::CliFirst {
                link: LinkIdx::FIRST,
                stage: CliFirstStage::AwaitConfirm,
            },
            self.wait(
                now,
                Some(T_CONFIRM_LINK),
                self.cfg.clnt_confirm_link_timeout,
                None,
                None,
            ),
        )
    }

    fn cli_first_msg(
        &mut self,
        now: Instant,
        link: LinkIdx,
        stage: CliFirstStage,
        msg: LlcMessage,
    ) -> Next {
        match (stage, msg) {
            (CliFirstStage::AwaitConfirm, LlcMessage::ConfirmLink(c)) => {
                // smc_llc_eval_conf_link: the server assigns the link id.
                if c.link_num == 0 {
                    return self.first_contact_failed(now, FirstContactError::BadLinkId);
                }
                let lgr_id = self.cfg.lgr_id;
                if let Some(l) = self.link_mut(link) {
                    l.link_id = c.link_num;
                    l.link_uid = link_uid(lgr_id, c.link_num);
                    l.peer_link_uid = c.link_uid;
                }
                if !c.flags.no_rmbe_eyecatcher() {
                    return self.first_contact_failed(now, FirstContactError::RmbeEyecatcher);
                }
                self.push(LlcAction::RtsAndRegister { link });
                Next::Driver(Kind::CliFirst {
                    link,
                    stage: CliFirstStage::Rts,
                })
            }
            (
                CliFirstStage::AwaitAddLink,
                ref m @ (LlcMessage::AddLink(_) | LlcMessage::AddLinkV2(_)),
            ) => match msgs::add_link_parts(m) {
                Some((a, rkeys)) => self.cli_add_start(now, link, a, rkeys, true),
                None => self.flow_fail(now, Kind::CliFirst { link, stage }),
            },
            (stage, _) => self.flow_fail(now, Kind::CliFirst { link, stage }),
        }
    }

    fn cli_first_step(&mut self, now: Instant, link: LinkIdx, r: StepResult) -> Next {
        if !matches!(r, StepResult::Ready(true)) {
            return self.first_contact_failed(now, FirstContactError::LinkFailed);
        }
        let max_links = self.cfg.max_links;
        let max_conns = self.announced_max_conns();
        let Some(l) = self.link_mut(link) else {
            return self.first_contact_failed(now, FirstContactError::LinkFailed);
        };
        l.rts = true;
        let msg = msgs::confirm_link(l, true, max_links, max_conns);
        if self.send(link, msg).is_none() {
            return self.first_contact_failed(now, FirstContactError::LinkFailed);
        }
        self.activate_link(now, link);
        self.set_type(LgrType::Single);
        if max_links <= 1 {
            // `smcr_clnt_conf_first_link` waits for the server's ADD_LINK only when the
            // group may have a second link (`lgr->max_links > 1`, SMC-Rv2.1).
            return self.cli_add_end(true);
        }
        // "optional 2nd link, receive ADD LINK request from server"
        Next::Wait(
            Kind::CliFirst {
                link,
                stage: CliFirstStage::AwaitAddLink,
            },
            self.wait(now, Some(T_ADD_LINK), self.cfg.wait_time, None, None),
        )
    }

    // ------------------------------------------------------------ ADD_LINK, server

    /// `smc_llc_srv_add_link`: an alternate port on another device makes the group
    /// symmetric, none makes it asymmetric on the same port.
    pub(super) fn srv_add_start(
        &mut self,
        now: Instant,
        link: LinkIdx,
        first_contact: bool,
        req: Option<(LinkIdx, LlcMessage)>,
    ) -> Next {
        let Some(old) = self.link(link).filter(|l| l.usable()) else {
            return self.srv_add_end(first_contact, req, false);
        };
        let old_port = old.port;
        let (port, new_t) = match self.find_alt_port(old_port.dev) {
            Some(p) => (p, LgrType::Symmetric),
            None => (old_port, LgrType::AsymmetricLocal),
        };
        let Some(new) = self.alloc_alt_link(new_t) else {
            return self.srv_add_end(first_contact, req, false);
        };
        let link_id = self.alloc_link_id();
        self.links[new.index()] = Some(Link::new(link_id, port, self.cfg.lgr_id, now));
        let rmbs = self.used_rmbs();
        self.push(LlcAction::CreateLink {
            link: new,
            link_id,
            port,
            rmbs,
        });
        Next::Driver(Kind::SrvAdd(SrvAdd {
            link,
            new,
            new_t,
            stage: SrvAddStage::Create,
            rkx: RkeyExchange::default(),
            first_contact,
            req,
            add_sent: false,
            peer_rkeys: Vec::new(),
        }))
    }

    fn srv_add_end(
        &mut self,
        first_contact: bool,
        req: Option<(LinkIdx, LlcMessage)>,
        add_sent: bool,
    ) -> Next {
        if let Some((l, m)) = req
            && !add_sent
        {
            // smc_llc_send_req_add_link_response: the request back with the response flag
            // and its body zeroed.
            let flags = m.flags() | LlcFlags::RESPONSE;
            let _ = self.send(
                l,
                LlcMessage::ReqAddLink(ReqAddLink {
                    flags,
                    gids: Vec::new(),
                }),
            );
        }
        if first_contact {
            self.push(LlcAction::FirstContact(Ok(FirstContactDone {
                add_link_timed_out: false,
            })));
        }
        Next::Done
    }

    /// `out_err`: the new link goes.
    fn srv_add_abandon(&mut self, now: Instant, st: SrvAdd) -> Next {
        self.clear_link(now, st.new);
        self.srv_add_end(st.first_contact, st.req, st.add_sent)
    }

    /// `smc_llc_srv_conf_link` without its CONFIRM_LINK response: DELETE_LINK (not
    /// orderly, LOST_PATH) for the new link over the old one.
    fn srv_conf_failed(&mut self, now: Instant, st: SrvAdd) -> Next {
        let id = self.link_id_of(st.new);
        let _ = self.send(
            st.link,
            msgs::delete_link(id, false, false, DeleteLinkReason::LostPath),
        );
        self.srv_add_abandon(now, st)
    }

    fn srv_add_step(&mut self, now: Instant, mut st: SrvAdd, r: StepResult) -> Next {
        match (st.stage, r) {
            (SrvAddStage::Create, StepResult::Created(Ok(c))) => {
                self.record_created(st.new, &c);
                let Some(msg) = self.add_link_msg(st.link, st.new, false) else {
                    return self.srv_add_abandon(now, st);
                };
                match self.send(st.link, msg) {
                    Some(id) => {
                        st.add_sent = true;
                        st.stage = SrvAddStage::AwaitResp;
                        let w = self.wait(
                            now,
                            Some(T_ADD_LINK),
                            self.cfg.wait_time,
                            Some(st.link),
                            Some(id),
                        );
                        Next::Wait(Kind::SrvAdd(st), w)
                    }
                    None => self.srv_add_abandon(now, st),
                }
            }
            (SrvAddStage::Ready, StepResult::Ready(true)) => {
                if let Some(l) = self.link_mut(st.new) {
                    l.rts = true;
                }
                if self.cfg.v2 {
                    // The rkeys came with the ADD_LINK response: no ADD_LINK_CONT.
                    let rkeys = core::mem::take(&mut st.peer_rkeys);
                    self.save_add_link_rkeys(st.link, st.new, &rkeys);
                    return self.srv_conf_link(now, st);
                }
                st.rkx = RkeyExchange::new(self.rkey_pairs(st.link, st.new));
                self.srv_send_cont(now, st)
            }
            _ => self.srv_add_abandon(now, st),
        }
    }

    fn srv_send_cont(&mut self, now: Instant, mut st: SrvAdd) -> Next {
        let msg = st.rkx.next_cont(self.link_id_of(st.new), false);
        match self.send(st.link, msg) {
            Some(id) => {
                st.stage = SrvAddStage::Rkey;
                let w = self.wait(
                    now,
                    Some(T_ADD_LINK_CONT),
                    self.cfg.wait_time,
                    Some(st.link),
                    Some(id),
                );
                Next::Wait(Kind::SrvAdd(st), w)
            }
            None => self.srv_add_abandon(now, st),
        }
    }

    fn srv_add_msg(&mut self, now: Instant, mut st: SrvAdd, msg: LlcMessage) -> Next {
        match (st.stage, msg) {
            (
                SrvAddStage::AwaitResp,
                ref m @ (LlcMessage::AddLink(_) | LlcMessage::AddLinkV2(_)),
            ) => {
                let Some((a, rkeys)) = msgs::add_link_parts(m) else {
                    return self.srv_add_abandon(now, st);
                };
                if a.flags.add_link_reject() || !valid_mtu(a.qp_mtu) {
                    return self.srv_add_abandon(now, st);
                }
                let Some(old_peer) = self.link(st.link).and_then(|l| l.peer) else {
                    return self.srv_add_abandon(now, st);
                };
                if self.lgr_type == LgrType::Single && self.same_peer_port(&old_peer, &a) {
                    st.new_t = LgrType::AsymmetricPeer;
                }
                st.peer_rkeys = rkeys.unwrap_or_default();
                let peer = PeerQp {
                    qpn: a.qpn,
                    gid: a.gid,
                    mac: a.mac,
                    psn: a.initial_psn,
                    mtu: a.qp_mtu,
                };
                let Some(l) = self.link_mut(st.new) else {
                    return self.srv_add_abandon(now, st);
                };
                l.peer = Some(peer);
                let mtu = l.port.path_mtu.min(a.qp_mtu);
                self.push(LlcAction::ReadyLink {
                    link: st.new,
                    peer,
                    mtu,
                    rts: true,
                    register_rmbs: true,
                });
                st.stage = SrvAddStage::Ready;
                Next::Driver(Kind::SrvAdd(st))
            }
            (SrvAddStage::Rkey, LlcMessage::AddLinkCont(c)) => {
                st.rkx.recv_left = self.apply_cont(st.link, st.new, &c);
                st.rkx.rounds += 1;
                if st.rkx.rounds > MAX_RKEY_ROUNDS {
                    return self.srv_add_abandon(now, st);
                }
                if st.rkx.more() {
                    return self.srv_send_cont(now, st);
                }
                self.srv_conf_link(now, st)
            }
            (SrvAddStage::Confirm, LlcMessage::ConfirmLink(c)) => {
                if let Some(l) = self.link_mut(st.new) {
                    l.peer_link_uid = c.link_uid;
                }
                self.activate_link(now, st.new);
                self.set_type_for(st.new_t, st.new);
                // smc_llc_process_srv_add_link: "delete any asymmetric link"
                if !st.first_contact && self.lgr_type == LgrType::Symmetric {
                    return self.srv_asym_delete_start(now, st);
                }
                self.srv_add_end(st.first_contact, st.req, st.add_sent)
            }
            (SrvAddStage::Confirm, _) => self.srv_conf_failed(now, st),
            (SrvAddStage::AsymDel { asym, .. }, _) => {
                self.clear_link(now, asym);
                self.srv_add_end(st.first_contact, st.req, st.add_sent)
            }
            _ => self.srv_add_abandon(now, st),
        }
    }

    /// `smc_llc_srv_conf_link`: CONFIRM_LINK goes over the new link; the wait is bound to
    /// the old one.
    fn srv_conf_link(&mut self, now: Instant, mut st: SrvAdd) -> Next {
        let Some(l) = self.link(st.new) else {
            return self.srv_add_abandon(now, st);
        };
        let msg = msgs::confirm_link(l, false, self.cfg.max_links, self.announced_max_conns());
        match self.send(st.new, msg) {
            Some(id) => {
                st.stage = SrvAddStage::Confirm;
                let w = self.wait(now, None, self.cfg.wait_first_time, Some(st.link), Some(id));
                Next::Wait(Kind::SrvAdd(st), w)
            }
            None => self.srv_add_abandon(now, st),
        }
    }

    /// `smc_llc_save_add_link_rkeys`: the peer's RMBs on the new link, from its ADD_LINK v2
    /// extension (the kernel reads at most 255).
    fn save_add_link_rkeys(&mut self, old: LinkIdx, new: LinkIdx, rkeys: &[AddLinkContRkey]) {
        for rt in rkeys.iter().take(SMC_RMBS_PER_LGR_MAX) {
            let key = RmbKey {
                rkey: rt.rkey_new,
                vaddr: rt.vaddr_new,
            };
            self.rtoken_set(old, new, rt.rkey, key);
        }
    }

    /// The ADD_LINK a side sends for its new link: in a v2 group with the extension holding
    /// all its RMBs' keys (`smc_llc_fill_ext_v2`).
    fn add_link_msg(&self, old: LinkIdx, new: LinkIdx, resp: bool) -> Option<LlcMessage> {
        let l = self.link(new)?;
        Some(if self.cfg.v2 {
            msgs::add_link_v2(l, resp, self.cfg.v2_direct, self.rkey_pairs(old, new))
        } else {
            msgs::add_link(l, resp)
        })
    }

    /// `max_conns` of CONFIRM_LINK: only a v2 group announces one.
    fn announced_max_conns(&self) -> u8 {
        if self.cfg.v2 { self.cfg.max_conns } else { 0 }
    }

    /// The peer's ADD_LINK names the GID (and, in a v1 group, the MAC) of the link we have:
    /// the peer has no second device (`smc_llc_srv_add_link` / `smc_llc_cli_add_link`; a v2
    /// group compares the GID only).
    fn same_peer_port(&self, peer: &PeerQp, a: &AddLink) -> bool {
        a.gid == peer.gid && (self.cfg.v2 || a.mac == peer.mac)
    }

    fn srv_add_fail(&mut self, now: Instant, st: SrvAdd) -> Next {
        match st.stage {
            SrvAddStage::Confirm => self.srv_conf_failed(now, st),
            SrvAddStage::AsymDel { asym, to } => {
                // smc_llc_delete_asym_link: no answer takes the surviving link down too.
                self.link_down_cond(now, to, true);
                self.clear_link(now, asym);
                self.srv_add_end(st.first_contact, st.req, st.add_sent)
            }
            _ => self.srv_add_abandon(now, st),
        }
    }

    /// `smc_llc_delete_asym_link`: with a symmetric pair up, the asymmetric link goes
    /// (DELETE_LINK orderly, NO_ASYM_NEEDED) after its connections moved.
    fn srv_asym_delete_start(&mut self, now: Instant, mut st: SrvAdd) -> Next {
        let Some(asym) = self.find_asym_link() else {
            return self.srv_add_end(st.first_contact, st.req, st.add_sent);
        };
        if !self.link_going_down(asym) {
            return self.srv_add_end(st.first_contact, st.req, st.add_sent);
        }
        let Some(to) = self.switch_conns(now, asym, false) else {
            self.clear_link(now, asym);
            return self.srv_add_end(st.first_contact, st.req, st.add_sent);
        };
        let id = self.link_id_of(asym);
        let msg = msgs::delete_link(id, false, true, DeleteLinkReason::NoAsymmetricNeeded);
        match self.send(to, msg) {
            Some(sid) => {
                st.stage = SrvAddStage::AsymDel { asym, to };
                let w = self.wait(
                    now,
                    Some(T_DELETE_LINK),
                    self.cfg.wait_time,
                    Some(to),
                    Some(sid),
                );
                Next::Wait(Kind::SrvAdd(st), w)
            }
            None => {
                self.link_down_cond(now, to, true);
                self.clear_link(now, asym);
                self.srv_add_end(st.first_contact, st.req, st.add_sent)
            }
        }
    }

    // ------------------------------------------------------------ ADD_LINK, client

    /// `smc_llc_cli_add_link`: the server's request on `link`.
    pub(super) fn cli_add_start(
        &mut self,
        now: Instant,
        link: LinkIdx,
        a: AddLink,
        peer_rkeys: Option<Vec<AddLinkContRkey>>,
        first_contact: bool,
    ) -> Next {
        if !valid_mtu(a.qp_mtu) {
            return self.cli_add_reject(link, &a, first_contact);
        }
        let Some(old) = self.link(link).filter(|l| l.usable()) else {
            return self.cli_add_reject(link, &a, first_contact);
        };
        let (old_port, old_peer) = (old.port, old.peer);
        let alt = self.find_alt_port(old_port.dev);
        let mut new_t = LgrType::Symmetric;
        if old_peer.is_some_and(|p| self.same_peer_port(&p, &a)) {
            // The server uses the same device again: only an alternate device of ours can
            // make a second path.
            if alt.is_none() {
                return self.cli_add_reject(link, &a, first_contact);
            }
            new_t = LgrType::AsymmetricPeer;
        }
        let port = match alt {
            Some(p) => p,
            None => {
                new_t = LgrType::AsymmetricLocal;
                old_port
            }
        };
        let Some(new) = self.alloc_alt_link(new_t) else {
            return self.cli_add_reject(link, &a, first_contact);
        };
        // The server assigns the id; one we cannot tell from an existing link's is refused.
        if a.link_num == 0 || self.find_link_by_id(a.link_num).is_some() {
            return self.cli_add_reject(link, &a, first_contact);
        }
        let mut l = Link::new(a.link_num, port, self.cfg.lgr_id, now);
        l.peer = Some(PeerQp {
            qpn: a.qpn,
            gid: a.gid,
            mac: a.mac,
            psn: a.initial_psn,
            mtu: a.qp_mtu,
        });
        self.links[new.index()] = Some(l);
        let rmbs = self.used_rmbs();
        self.push(LlcAction::CreateLink {
            link: new,
            link_id: a.link_num,
            port,
            rmbs,
        });
        Next::Driver(Kind::CliAdd(CliAdd {
            link,
            req: a,
            new,
            new_t,
            stage: CliAddStage::Create,
            rkx: RkeyExchange::default(),
            first_contact,
            peer_rkeys: peer_rkeys.unwrap_or_default(),
        }))
    }

    fn cli_add_end(&mut self, first_contact: bool) -> Next {
        if first_contact {
            self.push(LlcAction::FirstContact(Ok(FirstContactDone {
                add_link_timed_out: false,
            })));
        }
        Next::Done
    }

    fn cli_add_reject(&mut self, link: LinkIdx, req: &AddLink, first_contact: bool) -> Next {
        let _ = self.send(link, msgs::add_link_reject(req));
        self.cli_add_end(first_contact)
    }

    /// `out_clear_lnk` then `out_reject`.
    fn cli_add_abandon(&mut self, now: Instant, st: CliAdd) -> Next {
        self.clear_link(now, st.new);
        self.cli_add_reject(st.link, &st.req, st.first_contact)
    }

    /// `smc_llc_cli_conf_link` failing: DELETE_LINK (not orderly, LOST_PATH) for the new
    /// link over the old one, then the reject as well.
    fn cli_add_lost(&mut self, now: Instant, st: CliAdd) -> Next {
        let msg = msgs::delete_link(st.req.link_num, false, false, DeleteLinkReason::LostPath);
        let _ = self.send(st.link, msg);
        self.cli_add_abandon(now, st)
    }

    fn cli_add_step(&mut self, now: Instant, mut st: CliAdd, r: StepResult) -> Next {
        match (st.stage, r) {
            (CliAddStage::Create, StepResult::Created(Ok(c))) => {
                self.record_created(st.new, &c);
                let Some((peer, mtu)) = self
                    .link(st.new)
                    .and_then(|l| l.peer.map(|p| (p, l.port.path_mtu.min(p.mtu))))
                else {
                    return self.cli_add_abandon(now, st);
                };
                // RTR only: the QP goes to RTS when CONFIRM_LINK arrives on it.
                self.push(LlcAction::ReadyLink {
                    link: st.new,
                    peer,
                    mtu,
                    rts: false,
                    register_rmbs: false,
                });
                st.stage = CliAddStage::Ready;
                Next::Driver(Kind::CliAdd(st))
            }
            (CliAddStage::Ready, StepResult::Ready(true)) => {
                let Some(msg) = self.add_link_msg(st.link, st.new, true) else {
                    return self.cli_add_abandon(now, st);
                };
                let Some(id) = self.send(st.link, msg) else {
                    return self.cli_add_abandon(now, st);
                };
                if self.cfg.v2 {
                    // Both sides' rkeys travelled in the ADD_LINK pair: no ADD_LINK_CONT;
                    // "receive CONFIRM LINK request over RoCE fabric".
                    let rkeys = core::mem::take(&mut st.peer_rkeys);
                    self.save_add_link_rkeys(st.link, st.new, &rkeys);
                    st.stage = CliAddStage::Confirm;
                    let w = self.wait(now, None, self.cfg.wait_first_time, None, Some(id));
                    return Next::Wait(Kind::CliAdd(st), w);
                }
                st.rkx = RkeyExchange::new(self.rkey_pairs(st.link, st.new));
                st.stage = CliAddStage::Rkey;
                let w = self.wait(
                    now,
                    Some(T_ADD_LINK_CONT),
                    self.cfg.wait_time,
                    None,
                    Some(id),
                );
                Next::Wait(Kind::CliAdd(st), w)
            }
            (CliAddStage::Activate, StepResult::Ready(true)) => {
                let max_links = self.cfg.max_links;
                let max_conns = self.announced_max_conns();
                let Some(l) = self.link_mut(st.new) else {
                    return self.cli_add_abandon(now, st);
                };
                l.rts = true;
                let msg = msgs::confirm_link(l, true, max_links, max_conns);
                if self.send(st.new, msg).is_none() {
                    return self.cli_add_lost(now, st);
                }
                self.activate_link(now, st.new);
                self.set_type_for(st.new_t, st.new);
                self.cli_add_end(st.first_contact)
            }
            (CliAddStage::Activate, _) => self.cli_add_lost(now, st),
            _ => self.cli_add_abandon(now, st),
        }
    }

    fn cli_add_msg(&mut self, now: Instant, mut st: CliAdd, msg: LlcMessage) -> Next {
        match (st.stage, msg) {
            (CliAddStage::Rkey, LlcMessage::AddLinkCont(c)) => {
                st.rkx.recv_left = self.apply_cont(st.link, st.new, &c);
                st.rkx.rounds += 1;
                if st.rkx.rounds > MAX_RKEY_ROUNDS {
                    return self.cli_add_abandon(now, st);
                }
                let msg = st.rkx.next_cont(st.req.link_num, true);
                let Some(id) = self.send(st.link, msg) else {
                    return self.cli_add_abandon(now, st);
                };
                let w = if st.rkx.more() {
                    self.wait(
                        now,
                        Some(T_ADD_LINK_CONT),
                        self.cfg.wait_time,
                        None,
                        Some(id),
                    )
                } else {
                    // "receive CONFIRM LINK request over RoCE fabric"
                    st.stage = CliAddStage::Confirm;
                    self.wait(now, None, self.cfg.wait_first_time, None, Some(id))
                };
                Next::Wait(Kind::CliAdd(st), w)
            }
            (CliAddStage::Confirm, LlcMessage::ConfirmLink(c)) => {
                if let Some(l) = self.link_mut(st.new) {
                    l.peer_link_uid = c.link_uid;
                }
                self.push(LlcAction::RtsAndRegister { link: st.new });
                st.stage = CliAddStage::Activate;
                Next::Driver(Kind::CliAdd(st))
            }
            (CliAddStage::Confirm, other) => {
                // "received DELETE_LINK instead": it is answered, and the new link goes.
                let _ = self.send(st.link, msgs::with_response(other));
                self.cli_add_abandon(now, st)
            }
            _ => self.cli_add_abandon(now, st),
        }
    }

    fn cli_add_fail(&mut self, now: Instant, st: CliAdd) -> Next {
        match st.stage {
            CliAddStage::Confirm => self.cli_add_lost(now, st),
            _ => self.cli_add_abandon(now, st),
        }
    }

    /// `smc_llc_cli_add_link_invite`: ask the server to add a link when we have a port on
    /// another device and the group is not already using both of the peer's.
    pub(super) fn cli_invite(&mut self, via: LinkIdx) {
        if matches!(self.lgr_type, LgrType::Symmetric | LgrType::AsymmetricPeer) {
            return;
        }
        let Some(dev) = self.link(via).map(|l| l.port.dev) else {
            return;
        };
        let Some(port) = self.find_alt_port(dev) else {
            return;
        };
        if self.cfg.v2 {
            // smc_llc_send_request_add_link: the GIDs we could use, ours on this link first;
            // sent only with two or more.
            let Some(own) = self.link(via).map(|l| l.port.gid) else {
                return;
            };
            let mut gids = alloc::vec![own];
            for p in &self.cfg.ports {
                if p.dev != dev && !gids.contains(&p.gid) && gids.len() < 255 {
                    gids.push(p.gid);
                }
            }
            if gids.len() > 1 {
                let _ = self.send(via, msgs::req_add_link(gids));
            }
            return;
        }
        let _ = self.send(via, msgs::add_link_invite(&port));
    }

    // ------------------------------------------------------------ DELETE_LINK

    /// `smc_llc_process_srv_delete_link`: a client's request (sent back to start the
    /// exchange) or our own (forwarded), then wait for the client's answer.
    pub(super) fn srv_del_start(&mut self, now: Instant, via: LinkIdx, d: DeleteLink) -> Next {
        if d.flags.delete_link_all() {
            // "delete entire lgr": an orderly DELETE_LINK ALL with the peer's reason, then
            // the termination's own.
            self.start_delete_all(true, d.reason);
            self.terminate_with(now, TermReason::PeerDeleteAll(d.reason), false);
            return Next::Done;
        }
        let Some(del) = self.find_link_by_id(d.link_num) else {
            // "asymmetric link already deleted"
            return Next::Done;
        };
        if self.link_going_down(del) {
            let _ = self.switch_conns(now, del, false);
        }
        if self.terminated.is_none()
            && let Some(id) = self.send(via, LlcMessage::DeleteLink(d))
        {
            let w = self.wait(
                now,
                Some(T_DELETE_LINK),
                self.cfg.wait_time,
                Some(via),
                Some(id),
            );
            return Next::Wait(Kind::SrvDel { del }, w);
        }
        self.srv_del_finish(now, del)
    }

    pub(super) fn srv_del_finish(&mut self, now: Instant, del: LinkIdx) -> Next {
        self.clear_link(now, del);
        match self.active_links() {
            1 => self.set_type(LgrType::Single),
            0 => {
                self.set_type(LgrType::None);
                self.terminate_with(now, TermReason::NoLinkLeft, false);
            }
            _ => {}
        }
        if self.lgr_type == LgrType::Single
            && self.terminated.is_none()
            && let Some(via) = self.first_usable()
        {
            // "trigger setup of asymm alt link"
            self.queue_add_link_local(via);
        }
        Next::Done
    }

    /// `smc_llc_process_cli_delete_link`: the server's request, answered at once.
    pub(super) fn cli_delete(&mut self, now: Instant, via: LinkIdx, d: DeleteLink) {
        if d.flags.delete_link_all() {
            self.terminate_with(now, TermReason::PeerDeleteAll(d.reason), false);
            return;
        }
        let del = self.find_link_by_id(d.link_num);
        let mut resp = d;
        resp.flags |= LlcFlags::RESPONSE;
        resp.reason = match del {
            Some(_) => DeleteLinkReason::NoReason,
            None => DeleteLinkReason::UnknownLink,
        };
        let _ = self.send(via, LlcMessage::DeleteLink(resp));
        let Some(del) = del else {
            return;
        };
        let asym = self.find_asym_link();
        if self.link_going_down(del) {
            let _ = self.switch_conns(now, del, false);
        }
        self.clear_link(now, del);
        if self.terminated.is_some() || asym == Some(del) {
            // "expected deletion of asym link, don't change lgr state"
            return;
        }
        match self.active_links() {
            1 => self.set_type(LgrType::Single),
            0 => {
                self.set_type(LgrType::None);
                self.terminate_with(now, TermReason::NoLinkLeft, false);
            }
            _ => {}
        }
    }

    // ------------------------------------------------------------ RKEY, local

    pub(super) fn rkey_start(&mut self, now: Instant, rmb: RmbId, op: RkeyOp) -> Next {
        if !self.rmbs.iter().any(|r| r.id == rmb) {
            self.rkey_result(rmb, op, Err(RkeyError::RegisterFailed));
            return Next::Done;
        }
        match op {
            RkeyOp::Confirm { via } => {
                if !self.sendable(via) {
                    self.rkey_result(rmb, op, Err(RkeyError::NoLink));
                    return Next::Done;
                }
                let links = self
                    .links()
                    .filter(|(_, l)| l.state == LinkState::Active)
                    .map(|(i, _)| i)
                    .collect();
                self.push(LlcAction::RegisterRmb { rmb, links });
                Next::Driver(Kind::Rkey(RkeyFlow {
                    rmb,
                    op,
                    registering: true,
                }))
            }
            RkeyOp::Delete => {
                let key = self.first_usable().and_then(|via| {
                    let r = self.rmbs.iter().find(|r| r.id == rmb)?;
                    r.keys[via.index()].map(|k| (via, k))
                });
                let Some((via, key)) = key else {
                    self.rkey_result(rmb, op, Err(RkeyError::NoLink));
                    return Next::Done;
                };
                match self.send(via, msgs::delete_rkey(key.rkey)) {
                    Some(id) => {
                        let w = self.wait(
                            now,
                            Some(T_DELETE_RKEY),
                            self.cfg.wait_time,
                            Some(via),
                            Some(id),
                        );
                        Next::Wait(
                            Kind::Rkey(RkeyFlow {
                                rmb,
                                op,
                                registering: false,
                            }),
                            w,
                        )
                    }
                    None => {
                        self.rkey_result(rmb, op, Err(RkeyError::NoLink));
                        Next::Done
                    }
                }
            }
        }
    }

    fn rkey_step(&mut self, now: Instant, mut st: RkeyFlow, r: StepResult) -> Next {
        let (StepResult::Registered(Ok(keys)), RkeyOp::Confirm { via }) = (r, st.op) else {
            self.rkey_result(st.rmb, st.op, Err(RkeyError::RegisterFailed));
            return Next::Done;
        };
        let present: Vec<bool> = LinkIdx::all().map(|i| self.link(i).is_some()).collect();
        if let Some(rmb) = self.rmbs.iter_mut().find(|r| r.id == st.rmb) {
            for (l, k) in keys {
                if present[l.index()] {
                    rmb.keys[l.index()] = Some(k);
                }
            }
        }
        let Some(rmb) = self.rmbs.iter().find(|r| r.id == st.rmb).copied() else {
            self.rkey_result(st.rmb, st.op, Err(RkeyError::RegisterFailed));
            return Next::Done;
        };
        let Some(own) = rmb.keys[via.index()] else {
            self.rkey_result(st.rmb, st.op, Err(RkeyError::RegisterFailed));
            return Next::Done;
        };
        let others: Vec<Rtoken> = self
            .links()
            .filter(|(i, l)| *i != via && l.state == LinkState::Active)
            .filter_map(|(i, l)| {
                rmb.keys[i.index()].map(|k| Rtoken {
                    link_id: l.link_id,
                    rkey: k.rkey,
                    vaddr: k.vaddr,
                })
            })
            .take(2)
            .collect();
        match self.send(via, msgs::confirm_rkey(own, &others)) {
            Some(id) => {
                st.registering = false;
                let w = self.wait(
                    now,
                    Some(T_CONFIRM_RKEY),
                    self.cfg.wait_time,
                    Some(via),
                    Some(id),
                );
                Next::Wait(Kind::Rkey(st), w)
            }
            None => {
                self.rkey_result(st.rmb, st.op, Err(RkeyError::NoLink));
                Next::Done
            }
        }
    }

    fn rkey_msg(&mut self, st: RkeyFlow, msg: LlcMessage) -> Next {
        let result = match msg {
            LlcMessage::ConfirmRkey(c) if c.flags.rkey_negative() => Err(RkeyError::Negative {
                retry: c.flags.rkey_retry(),
                err_mask: 0,
            }),
            LlcMessage::DeleteRkey(d) if d.flags.rkey_negative() => Err(RkeyError::Negative {
                retry: false,
                err_mask: d.err_mask,
            }),
            // v2: the count of rkeys the peer did not know, where v1 has the mask.
            LlcMessage::DeleteRkeyV2(d) if d.flags.rkey_negative() => Err(RkeyError::Negative {
                retry: false,
                err_mask: d.num_inval_rkeys,
            }),
            _ => Ok(()),
        };
        self.rkey_result(st.rmb, st.op, result);
        Next::Done
    }
}
