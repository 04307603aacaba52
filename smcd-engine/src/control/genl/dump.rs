//! Dumps that walk the engines' status areas, answered in pages: the kernel's netlink dump
//! continuation (`netlink_dump` in `af_netlink.c` calls the family's `dumpit` again each
//! time the reader has made room, and the callback keeps its place in `cb->args`, as
//! `smc_diag_dump` and `smc_nl_get_lgr_smcd` do).
//!
//! A [`Job`] is one dump in progress: what it lists, where it stands (a [`Cursor`]: the
//! engine, the table, the slot), and the messages that followed the request in its record
//! (answered after it, in order). Each [`Job::step`] reads at most [`STEP_SLOTS`] slots and
//! produces at most one record of about [`PAGE`] bytes; the server sends it, and runs the
//! next step only when the client's socket has room and after it has served everyone
//! else's requests, so a dump costs one page of memory, never an unbounded reply, and a
//! connect, an intent or a DMB registration waits at most one step of someone's dump.
//!
//! Engines are visited in (pid, engine id) order and the cursor names the engine, not a
//! position in a list: an engine that ends mid-dump is skipped, one that starts is listed if
//! the dump has not passed it. Like the kernel's dumps, a dump is not a snapshot: an object
//! that moves while it runs may be missed or listed twice, every other one is listed once.

use super::{Out, Request};
use crate::control::daemon::Daemon;
use crate::control::device::{ClientCtx, Session};
use crate::layout::status::{Budget, N_TOTALS, StatusView, Table, Totals};
use netlink_packet_core::NetlinkHeader;
use smc_proto::netlink::engine::{EngineMessage, NetnsInfo};
use smc_proto::netlink::framing::{self, NLM_F_MULTI};
use smc_proto::netlink::smc::SmcGenlMessage;
use std::collections::{BTreeMap, BTreeSet};

/// Bytes of messages in one page of a dump (the kernel's dump skbs are 4 to 32 KiB).
pub const PAGE: usize = 32 * 1024;
/// Slots one step may examine (4096 connection slots are 2 MiB of status areas).
pub const STEP_SLOTS: usize = 4096;

/// What a dump lists.
#[derive(Debug)]
pub(crate) enum Walk {
    /// `SOCK_DUMP`: listeners, then connections, of engines in namespace `ns` whose state
    /// is in `states` (0: all).
    Socks { ns: u64, states: u32 },
    /// `GET_LGR_SMCD`: the link groups of namespace `ns`.
    Lgrs { ns: u64 },
    /// `GET_LGR_SMCR` (`links` false) or `GET_LINK_SMCR` (each group, then its links): the
    /// SMC-R link groups of namespace `ns`.
    LgrsSmcr { ns: u64, links: bool },
    /// `GET_DEV_SMCR`: the SMC-R device ports of the engines of namespace `ns` (`seen`: the
    /// names of their devices so far), then the host's RDMA devices no engine published.
    DevSmcr { ns: u64, seen: BTreeSet<String> },
    /// `GET_DEV_SMCD`: the device, with the number of link groups of all namespaces.
    Dev { lgrs: usize },
    /// `NETNS_LIST`: these namespaces, with what lives in each.
    Netns { list: BTreeMap<u64, NetnsInfo> },
    /// `GET_STATS` (`fback` false) or `GET_FBACK_STATS`: namespace `ns`'s counters.
    Totals { ns: u64, fback: bool, sum: Totals },
}

impl Walk {
    /// The statistics dumps start from zero.
    pub fn totals(ns: u64, fback: bool) -> Walk {
        Walk::Totals {
            ns,
            fback,
            sum: vec![0; N_TOTALS],
        }
    }

    /// Whether the walk visits engine `s`.
    fn visits(&self, s: &Session) -> bool {
        match self {
            Walk::Socks { ns, .. }
            | Walk::Lgrs { ns }
            | Walk::LgrsSmcr { ns, .. }
            | Walk::DevSmcr { ns, .. }
            | Walk::Totals { ns, .. } => s.netns == *ns,
            Walk::Dev { .. } => true,
            Walk::Netns { list } => list.contains_key(&s.netns),
        }
    }

    /// The tables it walks in each engine, in order (`None`: the engine's totals, read in
    /// one go).
    fn tables(&self) -> &'static [Option<Table>] {
        match self {
            Walk::Socks { .. } => &[Some(Table::Listeners), Some(Table::Conns)],
            Walk::Lgrs { .. } | Walk::LgrsSmcr { .. } | Walk::DevSmcr { .. } | Walk::Dev { .. } => {
                &[Some(Table::Lgrs)]
            }
            Walk::Netns { .. } => &[
                Some(Table::Listeners),
                Some(Table::Conns),
                Some(Table::Lgrs),
            ],
            Walk::Totals { .. } => &[None],
        }
    }
}

/// Where a dump stands: in engine `engine` ((pid, engine id)), table `table` of
/// [`Walk::tables`], at slot `slot`; `engine` None before the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cursor {
    engine: Option<(u32, u32)>,
    table: usize,
    slot: usize,
}

/// One dump in progress.
#[derive(Debug)]
pub struct Job {
    family: u16,
    header: NetlinkHeader,
    walk: Walk,
    cursor: Cursor,
    /// The request record and where in it the messages after the dump request start.
    record: Vec<u8>,
    rest: usize,
}

/// Builds the `NLM_F_MULTI` messages of one dump.
#[derive(Clone, Copy)]
struct Multi(u16, NetlinkHeader);

impl Multi {
    fn of<T: framing::GenlPayload>(&self, p: T) -> framing::Message<T> {
        framing::message(
            self.0,
            p,
            NLM_F_MULTI,
            self.1.sequence_number,
            self.1.port_number,
        )
    }
}

/// A page being filled.
struct Page {
    bytes: Vec<u8>,
}

impl Page {
    /// Appends `m` unless the page already holds something and `m` would take it past
    /// [`PAGE`].
    /// Appends all of `ms` or, if they would take a page that holds something past
    /// [`PAGE`], none (a link group and its links stay together).
    fn offer_all<T: framing::GenlPayload>(&mut self, ms: &[framing::Message<T>]) -> bool {
        let bytes: Vec<Vec<u8>> = ms
            .iter()
            .filter_map(|m| framing::to_bytes(m).ok())
            .collect();
        let total: usize = bytes
            .iter()
            .map(|b| smc_proto::netlink::attr::align4(b.len()))
            .sum();
        let start = smc_proto::netlink::attr::align4(self.bytes.len());
        if !self.bytes.is_empty() && start + total > PAGE {
            return false;
        }
        for b in bytes {
            let start = smc_proto::netlink::attr::align4(self.bytes.len());
            self.bytes.resize(start, 0);
            self.bytes.extend_from_slice(&b);
        }
        true
    }

    fn offer<T: framing::GenlPayload>(&mut self, m: &framing::Message<T>) -> bool {
        let Ok(b) = framing::to_bytes(m) else {
            return true; // not encodable (none of ours): skipped
        };
        let start = smc_proto::netlink::attr::align4(self.bytes.len());
        if !self.bytes.is_empty() && start + b.len() > PAGE {
            return false;
        }
        self.bytes.resize(start, 0);
        self.bytes.extend_from_slice(&b);
        true
    }
}

impl Job {
    /// A dump answering `req`; `record[rest..]` is answered when it is done.
    pub(crate) fn new(family: u16, req: &Request<'_>, walk: Walk) -> Job {
        Job {
            family,
            header: req.header,
            walk,
            cursor: Cursor::default(),
            record: Vec::new(),
            rest: 0,
        }
    }

    /// Keeps the request record, whose messages from `rest` on come after this dump.
    pub(crate) fn then(mut self, record: &[u8], rest: usize) -> Job {
        if rest < record.len() {
            self.record = record.to_vec();
            self.rest = rest;
        }
        self
    }

    /// One page: the records to send, and what is still to do (this dump, or the next one
    /// the rest of its request record started).
    pub fn step(mut self, daemon: &mut Daemon, client: &ClientCtx) -> (Vec<Vec<u8>>, Option<Job>) {
        let mut page = Page { bytes: Vec::new() };
        let done = self.fill(daemon, &mut page);
        if !done {
            // A step may spend its budget on slots no longer in use and fill nothing; an
            // empty record would read as end of file to a seqpacket client.
            let records = if page.bytes.is_empty() {
                Vec::new()
            } else {
                vec![page.bytes]
            };
            return (records, Some(self));
        }
        let mut out = Out::default();
        if !page.bytes.is_empty() {
            out.bytes(&page.bytes);
        }
        self.finish(daemon, &mut out);
        out.msg(&framing::done::<SmcGenlMessage>(&self.header));
        let mut records = out.finish();
        if self.record.is_empty() {
            return (records, None);
        }
        let after = super::start_at(daemon, client, &self.record, self.rest);
        records.extend(after.records);
        (records, after.job)
    }

    /// Walks until the page is full or the step's budget is spent (false) or every engine
    /// has been visited (true).
    fn fill(&mut self, daemon: &mut Daemon, page: &mut Page) -> bool {
        let mut budget = Budget::new(STEP_SLOTS);
        let tables = self.walk.tables();
        let mut engines: Vec<&Session> = daemon
            .device
            .sessions()
            .filter(|s| self.walk.visits(s))
            .filter(|s| self.cursor.engine.is_none_or(|c| (s.pid, s.engine_id) >= c))
            .collect();
        engines.sort_by_key(|s| (s.pid, s.engine_id));
        for s in engines {
            let key = (s.pid, s.engine_id);
            if self.cursor.engine != Some(key) {
                self.cursor = Cursor {
                    engine: Some(key),
                    table: 0,
                    slot: 1,
                };
            }
            if let Some(view) = &s.status {
                while self.cursor.table < tables.len() {
                    if budget.exhausted() {
                        return false;
                    }
                    let at = self.cursor.slot;
                    let next = match tables[self.cursor.table] {
                        Some(t) => self.walk_table(s, view, t, at, &mut budget, page),
                        None => {
                            self.add_totals(view.totals_charged(&mut budget));
                            None
                        }
                    };
                    match next {
                        Some(slot) => {
                            self.cursor.slot = slot;
                            return false;
                        }
                        None => {
                            self.cursor.table += 1;
                            self.cursor.slot = 1;
                        }
                    }
                }
            }
            self.cursor.table = tables.len();
        }
        true
    }

    fn walk_table(
        &mut self,
        s: &Session,
        view: &StatusView,
        t: Table,
        from: usize,
        budget: &mut Budget,
        page: &mut Page,
    ) -> Option<usize> {
        let (family, h) = (self.family, self.header);
        let multi = Multi(family, h);
        match &mut self.walk {
            Walk::Socks { ns, states } => {
                let (ns, states) = (*ns, *states);
                let wanted = |state: u8| states == 0 || (state < 32 && states & (1 << state) != 0);
                match t {
                    Table::Listeners => view.walk_listeners(from, budget, |l| {
                        let info = super::engine::listen_sock(&l, s.uid, s.pid, ns);
                        !wanted(info.state)
                            || page.offer(&multi.of(EngineMessage::sock_reply(&info)))
                    }),
                    _ => {
                        // SMC-R connections name their link; its device and GIDs are in
                        // the engine's link-group records (read once, when one is seen).
                        let mut lgrs: Option<Vec<crate::layout::status::LgrRecord>> = None;
                        view.walk_conns(from, budget, |c| {
                            let mut info = super::engine::conn_sock(&c, s.uid, s.pid, ns);
                            if c.id.mode == 0 && c.link != 0 {
                                let lgrs = lgrs.get_or_insert_with(|| view.lgrs());
                                info.smcr = super::engine::conn_link(&c, lgrs);
                            }
                            !wanted(info.state)
                                || page.offer(&multi.of(EngineMessage::sock_reply(&info)))
                        })
                    }
                }
            }
            Walk::Lgrs { .. } => view.walk_lgrs(from, budget, |g| {
                g.smcr.is_some()
                    || page
                        .offer(&multi.of(SmcGenlMessage::lgr_smcd_reply(&super::smc::lgr_smcd(&g))))
            }),
            Walk::LgrsSmcr { links, .. } => {
                let links = *links;
                view.walk_lgrs(from, budget, |g| {
                    let Some(x) = &g.smcr else {
                        return true;
                    };
                    let mut ms = vec![
                        multi.of(SmcGenlMessage::lgr_smcr_reply(&super::smc::lgr_smcr(&g, x))),
                    ];
                    if links {
                        ms.extend(x.links.iter().map(|l| {
                            multi.of(SmcGenlMessage::link_smcr_reply(&super::smc::link_smcr(l)))
                        }));
                    }
                    page.offer_all(&ms)
                })
            }
            Walk::DevSmcr { seen, .. } => view.walk_ports(from, budget, |p| {
                let taken = page
                    .offer(&multi.of(SmcGenlMessage::dev_smcr_reply(&super::smc::dev_smcr(&p))));
                if taken && !seen.contains(&p.ib_dev) {
                    seen.insert(p.ib_dev.clone());
                }
                taken
            }),
            Walk::Dev { lgrs } => view.walk_lgrs(from, budget, |g| {
                *lgrs += usize::from(g.smcr.is_none());
                true
            }),
            Walk::Netns { list } => {
                let info = list.get_mut(&s.netns)?;
                let mut n = 0usize;
                let next = match t {
                    // Link groups of either kind; not SMC-R device ports.
                    Table::Lgrs => view.walk_lgrs(from, budget, |_| {
                        n += 1;
                        true
                    }),
                    _ => view.count(t, from, budget, &mut n),
                };
                let n32 = u32::try_from(n).unwrap_or(u32::MAX);
                match t {
                    Table::Listeners => {
                        info.listen_cnt = info.listen_cnt.saturating_add(n32);
                        info.sock_cnt = info.sock_cnt.saturating_add(n32);
                    }
                    Table::Conns => info.sock_cnt = info.sock_cnt.saturating_add(n32),
                    Table::Lgrs => info.lgr_cnt = info.lgr_cnt.saturating_add(n32),
                }
                next
            }
            Walk::Totals { .. } => None,
        }
    }

    fn add_totals(&mut self, t: Totals) {
        if let Walk::Totals { sum, .. } = &mut self.walk {
            for (a, b) in sum.iter_mut().zip(t) {
                *a = a.wrapping_add(b);
            }
        }
    }

    /// The messages a dump sends once it has seen every engine.
    fn finish(&mut self, daemon: &mut Daemon, out: &mut Out) {
        let (family, h) = (self.family, self.header);
        let multi = Multi(family, h);
        match &mut self.walk {
            Walk::Socks { .. } | Walk::Lgrs { .. } | Walk::LgrsSmcr { .. } => {}
            Walk::DevSmcr { seen, .. } => {
                for r in &daemon.rnics.list {
                    if !seen.contains(&r.info.name) {
                        let dev = crate::control::rnic::dev_smcr(r, &crate::control::rnic::ifindex);
                        out.msg(&multi.of(SmcGenlMessage::dev_smcr_reply(&dev)));
                    }
                }
            }
            Walk::Dev { lgrs } => {
                let dev = super::smc::loopback_dev(*lgrs);
                out.msg(&multi.of(SmcGenlMessage::dev_smcd_reply(&dev)));
            }
            Walk::Netns { list } => {
                for info in list.values() {
                    out.msg(&multi.of(EngineMessage::netns_reply(info)));
                }
            }
            Walk::Totals { ns, fback, sum } => {
                let t = daemon.totals_from_live(*ns, sum);
                if *fback {
                    for f in super::smc::fback_stats(&t) {
                        out.msg(&multi.of(SmcGenlMessage::fback_stats_reply(&f)));
                    }
                } else {
                    let st = super::smc::stats_reply(&t);
                    out.msg(&multi.of(SmcGenlMessage::stats_reply(&st)));
                }
            }
        }
    }
}

impl Out {
    /// Answers the current request with a dump in pages (see [`Job`]).
    pub(crate) fn walk(&mut self, family: u16, req: &Request<'_>, walk: Walk) {
        self.job = Some(Job::new(family, req, walk));
    }
}
