//! `smcd`'s side of the loopback device: engine sessions and their GIDs, the DMB registry,
//! SMC listeners and connect intents (the kernel's `smc_loopback.c` DMB table plus the part of
//! `af_smc.c` that decides, from the SYN option, whether a connection will run CLC).
//!
//! Everything here is plain state driven by the server loop: a handler takes a request from a
//! client and returns the reply (with references to descriptors the server attaches) plus
//! notifications for other clients; it does no IO itself except creating memfds for new DMBs
//! and mapping pages engines hand in.

use crate::device::shm::{create_dmb_memfd, random_u64};
use crate::device::{Gid, LOOPBACK_CHID};
use crate::layout::status::StatusView;
use crate::layout::{ListenerPage, ListenerTable, TableEntry};
use rustix::fd::OwnedFd;
use smc_proto::clc::ReasonCode;
use smc_proto::netlink::loopback::{LoopbackAttr, LoopbackCmd, LoopbackMessage, Verdict};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::net::SocketAddr;

/// Identifies one client connection of the server.
pub type ClientId = u64;

/// A session key: the engine's random key and its pid.
pub type SessionKey = (u64, u32);

/// Intents remembered per session for cancellation when the engine dies.
const INTENTS_PER_SESSION: usize = 4096;

/// The kernel's `SMC_LO_MAX_DMBS`.
pub const DEFAULT_MAX_DMBS: usize = 5000;

/// An engine session: all channels that said HELLO with the same key and pid.
#[derive(Debug)]
pub struct Session {
    /// The engine's GID.
    pub gid: Gid,
    /// smcd's small id for it: its first block of link-group ids (see `LgrIds`).
    pub engine_id: u32,
    /// Every block of link-group ids it holds (the first is `engine_id`).
    blocks: Vec<u16>,
    /// The engine's process.
    pub pid: u32,
    /// Its user.
    pub uid: u32,
    /// Its network namespace inode (as `/proc/<pid>/ns/net` says).
    pub netns: u64,
    /// Its status area, if it sent one.
    pub status: Option<StatusView>,
    channels: HashSet<ClientId>,
    /// The channel it takes device events on (`EVENTS`), if it subscribed.
    events: Option<ClientId>,
    dmbs: HashSet<u64>,
    intents: VecDeque<u64>,
}

#[derive(Debug)]
struct DmbEntry {
    memfd: OwnedFd,
    /// The end of a new link group's bell channel its owner handed over with it, kept only
    /// until the peer's first attach takes it.
    handover: Option<OwnedFd>,
    len: usize,
    owner: SessionKey,
    peer: Gid,
}

/// A registered SMC listener.
#[derive(Debug)]
pub struct Listener {
    /// smcd's id.
    pub id: u32,
    /// The channel intents are sent on.
    pub client: ClientId,
    /// The bound address.
    pub addr: SocketAddr,
    /// The namespace it listens in.
    pub netns: u64,
    /// Its backlog.
    pub backlog: u32,
    /// Handshake limitation as evaluated at listen time.
    pub hs_limit: bool,
    /// The owning engine session.
    pub session: SessionKey,
    /// The listener's congestion page.
    pub page: Option<ListenerPage>,
    page_fd: Option<OwnedFd>,
    in_table: bool,
}

impl Listener {
    /// Whether an SMC handshake would be refused now: limitation on and congested, or the
    /// socket shared by processes that cannot see intents (`ListenerPage::set_shared`).
    pub fn refuses_smc(&self) -> bool {
        self.page
            .as_ref()
            .is_some_and(|p| p.shared() || (self.hs_limit && p.congested()))
    }
}

#[derive(Debug)]
struct Intent {
    listener: u32,
    client: SocketAddr,
}

/// Per-client state the device handler needs.
#[derive(Debug, Default, Clone, Copy)]
pub struct ClientCtx {
    /// The peer's process id from `SO_PEERCRED`.
    pub pid: u32,
    /// Its user id.
    pub uid: u32,
    /// Its group id.
    pub gid: u32,
    /// The session this client belongs to, after HELLO.
    pub session: Option<SessionKey>,
    /// The peer's network namespace when it connected (0: unknown, read from `pid` when
    /// needed). Control requests are about it, as a netlink socket's requests are about the
    /// namespace the socket was created in.
    pub netns: u64,
}

/// A message for another client (a listener channel).
#[derive(Debug)]
pub struct Notification {
    /// Where to send it.
    pub to: ClientId,
    /// What.
    pub msg: LoopbackMessage,
}

/// A descriptor the server attaches to a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdRef {
    /// A DMB's memfd.
    DmbMem(u64),
    /// The sysctl page of a namespace.
    SysctlPage(u64),
    /// The listener table.
    Table,
    /// A listener's page.
    ListenerPage(u32),
    /// The SMC option program's socket-storage map.
    BpfSkMap,
    /// The SMC option program's listener map.
    BpfListenerMap,
}

/// The outcome of a request.
#[derive(Debug, Default)]
pub struct Outcome {
    /// `Some(Ok(reply))`, `None` for one-way messages, or `Some(Err(errno))`.
    pub reply: Option<Result<LoopbackMessage, i32>>,
    /// Descriptors to send with the reply.
    pub fds: Vec<FdRef>,
    /// Descriptors to send after those, given away with the reply (smcd keeps no copy).
    pub give: Vec<OwnedFd>,
    /// Notifications, delivered before the reply; a failed delivery of an intent turns the
    /// reply into a plain-TCP verdict.
    pub notes: Vec<Notification>,
}

/// The device state of one `smcd`.
#[derive(Debug)]
pub struct DeviceState {
    sessions: HashMap<SessionKey, Session>,
    next_engine_id: u32,
    /// Link-group id blocks held by live sessions.
    held_blocks: HashSet<u16>,
    dmbs: HashMap<u64, DmbEntry>,
    listeners: HashMap<u32, Listener>,
    next_listener_id: u32,
    intents: HashMap<u64, Intent>,
    /// Pending intents by (listener, client address): two may never be pending at once.
    pending: HashMap<(u32, SocketAddr), u64>,
    next_intent: u64,
    table: ListenerTable,
    table_fd: OwnedFd,
    /// The host's system EID, as sent in proposals.
    pub seid: String,
    /// The host name.
    pub hostname: String,
    /// Most DMBs registered at once.
    pub max_dmbs: usize,
    /// The maps of the SMC option program, while it is attached (`bpf`): HELLO hands them to
    /// engines.
    syn_option: Option<crate::bpf::Maps>,
}

fn errno(e: rustix::io::Errno) -> i32 {
    e.raw_os_error()
}

/// The inode of the network namespace of process `pid`.
pub fn netns_of_pid(pid: u32) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata(format!("/proc/{pid}/ns/net"))?.ino())
}

impl DeviceState {
    /// Empty state for a host with this SEID and host name.
    pub fn new(seid: String, hostname: String) -> io::Result<Self> {
        let (table, table_fd) = ListenerTable::create()?;
        Ok(Self {
            sessions: HashMap::new(),
            next_engine_id: 1,
            held_blocks: HashSet::new(),
            dmbs: HashMap::new(),
            listeners: HashMap::new(),
            next_listener_id: 1,
            intents: HashMap::new(),
            pending: HashMap::new(),
            next_intent: 1,
            table,
            table_fd,
            seid,
            hostname,
            max_dmbs: DEFAULT_MAX_DMBS,
            syn_option: None,
        })
    }

    /// The SMC option program is attached with these maps: from now on HELLO gives them to
    /// engines (smcd keeps the program attached for as long as it runs).
    pub fn set_syn_option(&mut self, maps: crate::bpf::Maps) {
        self.syn_option = Some(maps);
    }

    /// Whether HELLO hands out the SMC option program's maps.
    pub fn syn_option(&self) -> bool {
        self.syn_option.is_some()
    }

    /// Live sessions.
    pub fn sessions(&self) -> impl Iterator<Item = &Session> {
        self.sessions.values()
    }

    /// Live listeners.
    pub fn listeners(&self) -> impl Iterator<Item = &Listener> {
        self.listeners.values()
    }

    /// Registered DMBs.
    pub fn dmb_count(&self) -> usize {
        self.dmbs.len()
    }

    /// The descriptor behind `r`, if it still exists (the server resolves [`FdRef`]s).
    pub fn fd(&self, r: FdRef) -> Option<rustix::fd::BorrowedFd<'_>> {
        use rustix::fd::AsFd;
        match r {
            FdRef::DmbMem(t) => self.dmbs.get(&t).map(|e| e.memfd.as_fd()),
            FdRef::Table => Some(self.table_fd.as_fd()),
            FdRef::ListenerPage(id) => self.listeners.get(&id)?.page_fd.as_ref().map(|f| f.as_fd()),
            FdRef::SysctlPage(_) => None,
            FdRef::BpfSkMap => self.syn_option.as_ref().map(|m| m.sk_fd()),
            FdRef::BpfListenerMap => self.syn_option.as_ref().map(|m| m.listeners_fd()),
        }
    }

    /// Handles one request of the `SMCD_LOOPBACK` family from `client`, with the descriptors
    /// that came with it.
    pub fn handle(
        &mut self,
        client: ClientId,
        ctx: &mut ClientCtx,
        req: LoopbackMessage,
        fds: Vec<OwnedFd>,
    ) -> Outcome {
        let mut out = Outcome::default();
        let reply = |cmd, attrs| Some(Ok(LoopbackMessage::new(cmd, attrs)));
        let Some(session) = ctx.session.or(if req.cmd == LoopbackCmd::Hello {
            Some((0, 0))
        } else {
            None
        }) else {
            out.reply = Some(Err(errno(rustix::io::Errno::PROTO)));
            return out;
        };
        let inval = Some(Err(errno(rustix::io::Errno::INVAL)));
        match req.cmd {
            LoopbackCmd::Hello => {
                out = self.hello(client, ctx, &req, fds);
            }
            LoopbackCmd::Listen => {
                let Some(addr) = req.local_addr() else {
                    out.reply = inval;
                    return out;
                };
                let netns = self.sessions.get(&session).map_or(0, |s| s.netns);
                let (page, page_fd) = match fds.into_iter().next() {
                    Some(fd) => match ListenerPage::open(&fd) {
                        Ok(p) => (Some(p), Some(fd)),
                        Err(_) => {
                            out.reply = inval;
                            return out;
                        }
                    },
                    None => (None, None),
                };
                let id = self.next_listener_id;
                self.next_listener_id = self.next_listener_id.wrapping_add(1).max(1);
                let hs_limit = req.hs_limit().unwrap_or(false);
                let in_table = self.table.insert(TableEntry {
                    id,
                    netns,
                    addr,
                    hs_limit,
                });
                self.listeners.insert(
                    id,
                    Listener {
                        id,
                        client,
                        addr,
                        netns,
                        backlog: req.backlog().unwrap_or(128),
                        hs_limit,
                        session,
                        page,
                        page_fd,
                        in_table,
                    },
                );
                out.reply = reply(LoopbackCmd::Listen, vec![LoopbackAttr::ListenerId(id)]);
            }
            LoopbackCmd::ListenerPage => {
                let Some(id) = req.listener_id() else {
                    out.reply = inval;
                    return out;
                };
                match self.listeners.get(&id) {
                    Some(l) if l.page_fd.is_some() => {
                        out.fds = vec![FdRef::ListenerPage(id)];
                        out.reply = reply(
                            LoopbackCmd::ListenerPage,
                            vec![LoopbackAttr::ListenerId(id)],
                        );
                    }
                    _ => out.reply = Some(Err(errno(rustix::io::Errno::NOENT))),
                }
            }
            LoopbackCmd::Connect => {
                let (Some(local), Some(remote)) = (req.local_addr(), req.remote_addr()) else {
                    out.reply = inval;
                    return out;
                };
                let Some((gid, netns)) = self.sessions.get(&session).map(|s| (s.gid, s.netns))
                else {
                    out.reply = Some(Err(errno(rustix::io::Errno::PROTO)));
                    return out;
                };
                let tcp = |reason: ReasonCode| {
                    reply(
                        LoopbackCmd::Connect,
                        vec![
                            LoopbackAttr::Verdict(Verdict::Tcp),
                            LoopbackAttr::Reason(reason.0),
                        ],
                    )
                };
                let Some(l) = self.find_listener(remote, netns) else {
                    out.reply = tcp(ReasonCode::PEERNOSMC);
                    return out;
                };
                if l.refuses_smc() {
                    // Handshake limitation: the listener is congested, so this connection is
                    // answered "without the SMC option".
                    out.reply = tcp(ReasonCode::PEERNOSMC);
                    return out;
                }
                let (lid, lclient, lsession) = (l.id, l.client, l.session);
                let key = (lid, canonical_addr(local));
                if self.pending.contains_key(&key) {
                    // Another engine announced the same source address to this listener and
                    // has not connected yet: the client must pick another port.
                    out.reply = Some(Err(errno(rustix::io::Errno::ADDRINUSE)));
                    return out;
                }
                let intent = self.next_intent;
                self.next_intent += 1;
                out.notes.push(Notification {
                    to: lclient,
                    msg: LoopbackMessage::new(
                        LoopbackCmd::Intent,
                        vec![
                            LoopbackAttr::RemoteAddr(local),
                            LoopbackAttr::Gid(gid),
                            LoopbackAttr::IntentId(intent),
                        ],
                    ),
                });
                self.intents.insert(
                    intent,
                    Intent {
                        listener: lid,
                        client: key.1,
                    },
                );
                self.pending.insert(key, intent);
                if let Some(s) = self.sessions.get_mut(&session) {
                    s.intents.push_back(intent);
                    if s.intents.len() > INTENTS_PER_SESSION
                        && let Some(old) = s.intents.pop_front()
                        && let Some(i) = self.intents.remove(&old)
                    {
                        self.pending.remove(&(i.listener, i.client));
                    }
                }
                out.reply = reply(
                    LoopbackCmd::Connect,
                    vec![
                        LoopbackAttr::Verdict(Verdict::Smc),
                        LoopbackAttr::Reason(0),
                        LoopbackAttr::IntentId(intent),
                        LoopbackAttr::Gid(self.sessions.get(&lsession).map_or(0, |s| s.gid)),
                    ],
                );
            }
            LoopbackCmd::IntentDone => {
                if let Some(id) = req.intent_id()
                    && let Some(note) = self.finish_intent(id, req.ok().unwrap_or(false))
                {
                    out.notes.push(note);
                }
            }
            LoopbackCmd::DmbRegister => {
                let (Some(size), Some(peer)) = (req.size(), req.peer_gid()) else {
                    out.reply = inval;
                    return out;
                };
                // At most one descriptor: the peer's end of a new group's bell channel, which
                // must be what engines make (a Unix seqpacket socket), since the peer will use
                // it as one.
                let mut fds = fds.into_iter();
                let handover = fds.next();
                if fds.next().is_some() || handover.as_ref().is_some_and(|f| !is_seqpacket(f)) {
                    out.reply = inval;
                    return out;
                }
                match self.register(session, size as usize, peer, handover) {
                    Ok(token) => {
                        // A DMB for an engine that has ended already (it went away while
                        // this request was on its way): its group is to be freed too.
                        if !self.sessions.values().any(|s| s.gid == peer) {
                            out.notes.extend(self.peer_gone(peer));
                        }
                        out.fds = vec![FdRef::DmbMem(token)];
                        out.reply = reply(
                            LoopbackCmd::DmbRegister,
                            vec![LoopbackAttr::Token(token), LoopbackAttr::Size(size)],
                        );
                    }
                    Err(e) => {
                        out.reply = Some(Err(e
                            .raw_os_error()
                            .unwrap_or(errno(rustix::io::Errno::NOMEM))))
                    }
                }
            }
            LoopbackCmd::DmbAttach => {
                let gid = self.sessions.get(&session).map(|s| s.gid);
                let Some(token) = req.token() else {
                    out.reply = inval;
                    return out;
                };
                match self.dmbs.get_mut(&token) {
                    None => out.reply = Some(Err(errno(rustix::io::Errno::NOENT))),
                    Some(e) if Some(e.peer) != gid => {
                        out.reply = Some(Err(errno(rustix::io::Errno::PERM)))
                    }
                    Some(e) => {
                        let owner = self.sessions.get(&e.owner);
                        let owner_gid = owner.map_or(0, |s| s.gid);
                        out.fds = vec![FdRef::DmbMem(token)];
                        out.give.extend(e.handover.take());
                        let mut attrs = vec![
                            LoopbackAttr::Size(e.len as u32),
                            LoopbackAttr::Gid(owner_gid),
                        ];
                        // Whose bells the attacher may take from the owner's processes
                        // (transport::smcd): the kernel's word, not the engine's.
                        if let Some(o) = owner {
                            attrs.push(LoopbackAttr::OwnerUid(o.uid));
                        }
                        out.reply = reply(LoopbackCmd::DmbAttach, attrs);
                    }
                }
            }
            LoopbackCmd::DmbUnregister => {
                if let Some(token) = req.token()
                    && self.dmbs.get(&token).is_some_and(|e| e.owner == session)
                {
                    self.dmbs.remove(&token);
                    if let Some(s) = self.sessions.get_mut(&session) {
                        s.dmbs.remove(&token);
                    }
                }
            }
            LoopbackCmd::Events => match self.sessions.get_mut(&session) {
                Some(s) => {
                    s.events = Some(client);
                    out.reply = reply(LoopbackCmd::Events, vec![]);
                    // Peers that ended before the engine subscribed: said now, after the
                    // reply, so nothing is missed in between.
                    out.notes.extend(self.gone_peers_of(session));
                }
                None => out.reply = Some(Err(errno(rustix::io::Errno::PROTO))),
            },
            LoopbackCmd::LgrIds => {
                if !self.sessions.contains_key(&session) {
                    out.reply = Some(Err(errno(rustix::io::Errno::PROTO)));
                    return out;
                }
                // A session holding more than this has made 4 M groups: it recycles its own.
                const MAX_BLOCKS_PER_SESSION: usize = 64;
                let held = self.sessions.get(&session).map_or(0, |s| s.blocks.len());
                let block = if held < MAX_BLOCKS_PER_SESSION {
                    self.alloc_block()
                } else {
                    None
                };
                match block {
                    Some(b) => {
                        if let Some(s) = self.sessions.get_mut(&session) {
                            s.blocks.push(b);
                        }
                        out.reply = reply(
                            LoopbackCmd::LgrIds,
                            vec![LoopbackAttr::EngineId(u32::from(b))],
                        );
                    }
                    None => out.reply = Some(Err(errno(rustix::io::Errno::NOSPC))),
                }
            }
            LoopbackCmd::Intent
            | LoopbackCmd::IntentCancel
            | LoopbackCmd::PeerGone
            | LoopbackCmd::Unknown(_) => {
                out.reply = Some(Err(errno(rustix::io::Errno::OPNOTSUPP)));
            }
        }
        out
    }

    fn hello(
        &mut self,
        client: ClientId,
        ctx: &mut ClientCtx,
        req: &LoopbackMessage,
        fds: Vec<OwnedFd>,
    ) -> Outcome {
        let mut out = Outcome::default();
        let (Some(key), Some(pid)) = (req.session_key(), req.pid()) else {
            out.reply = Some(Err(errno(rustix::io::Errno::INVAL)));
            return out;
        };
        if pid != ctx.pid {
            // A process may only speak for itself.
            out.reply = Some(Err(errno(rustix::io::Errno::PERM)));
            return out;
        }
        if let Some(old) = ctx.session
            && old != (key, pid)
        {
            out.reply = Some(Err(errno(rustix::io::Errno::INVAL)));
            return out;
        }
        // The namespace as the kernel reports it for that process, not as it claims.
        let netns = netns_of_pid(pid).unwrap_or(0);
        if !self.sessions.contains_key(&(key, pid)) {
            let Some(block) = self.alloc_block() else {
                out.reply = Some(Err(errno(rustix::io::Errno::NOSPC)));
                return out;
            };
            self.sessions.insert(
                (key, pid),
                Session {
                    gid: (u128::from(random_u64()) << 64) | u128::from(random_u64()),
                    engine_id: u32::from(block),
                    blocks: vec![block],
                    pid,
                    uid: ctx.uid,
                    netns,
                    status: None,
                    channels: HashSet::new(),
                    events: None,
                    dmbs: HashSet::new(),
                    intents: VecDeque::new(),
                },
            );
        }
        let s = self.sessions.get_mut(&(key, pid)).expect("present");
        if s.status.is_none()
            && let Some(fd) = fds.into_iter().next()
        {
            match StatusView::open(fd) {
                Ok(v) => s.status = Some(v),
                Err(e) => tracing::debug!(pid, "status area refused: {e}"),
            }
        }
        s.channels.insert(client);
        ctx.session = Some((key, pid));
        out.fds = vec![FdRef::SysctlPage(s.netns), FdRef::Table];
        let mut attrs = vec![
            LoopbackAttr::Gid(s.gid),
            LoopbackAttr::EngineId(s.engine_id),
            LoopbackAttr::Seid(self.seid.clone()),
            LoopbackAttr::Hostname(self.hostname.clone()),
            LoopbackAttr::Chid(LOOPBACK_CHID),
            LoopbackAttr::Netns(s.netns),
        ];
        if self.syn_option.is_some() {
            // The map descriptors are the capability: an engine needs no privilege and no
            // bpffs to mark its sockets and read what the option said.
            out.fds.extend([FdRef::BpfSkMap, FdRef::BpfListenerMap]);
            attrs.push(LoopbackAttr::SynOption(true));
        }
        out.reply = Some(Ok(LoopbackMessage::new(LoopbackCmd::Hello, attrs)));
        out
    }

    fn register(
        &mut self,
        session: SessionKey,
        len: usize,
        peer: Gid,
        handover: Option<OwnedFd>,
    ) -> io::Result<u64> {
        if self.dmbs.len() >= self.max_dmbs {
            // smc_lo_register_dmb: no free DMB slot.
            return Err(io::Error::from_raw_os_error(errno(
                rustix::io::Errno::NOSPC,
            )));
        }
        let memfd = create_dmb_memfd(len)?;
        let token = loop {
            let t = random_u64();
            if !self.dmbs.contains_key(&t) {
                break t;
            }
        };
        self.dmbs.insert(
            token,
            DmbEntry {
                memfd,
                handover,
                len,
                owner: session,
                peer,
            },
        );
        if let Some(s) = self.sessions.get_mut(&session) {
            s.dmbs.insert(token);
        }
        Ok(token)
    }

    /// The listener a connection from namespace `netns` to `remote` reaches: one in the same
    /// namespace bound to that address or the wildcard, else one elsewhere bound to exactly
    /// that address (the same rule engines apply to the listener table).
    pub fn find_listener(&self, remote: SocketAddr, netns: u64) -> Option<&Listener> {
        // A socket that went on to another program (`exec`) keeps its old registration,
        // marked shared, as long as some process holds its channel: a registration the new
        // program made for the same socket comes first.
        self.find_listener_among(remote, netns, true)
            .or_else(|| self.find_listener_among(remote, netns, false))
    }

    fn find_listener_among(
        &self,
        remote: SocketAddr,
        netns: u64,
        unshared_only: bool,
    ) -> Option<&Listener> {
        let rip = remote.ip().to_canonical();
        let port_match = |l: &&Listener| {
            l.addr.port() == remote.port()
                && !(unshared_only && l.page.as_ref().is_some_and(ListenerPage::shared))
        };
        let same_ns = self
            .listeners
            .values()
            .filter(port_match)
            .filter(|l| l.netns == netns);
        let exact = |l: &&Listener| l.addr.ip().to_canonical() == rip;
        // A wildcard of the remote's family first; an IPv6 one takes IPv4 (dual stack) only
        // when no IPv4 wildcard does: with both bound (redis: 0.0.0.0 and [::] with
        // IPV6_V6ONLY) the kernel gives IPv4 to 0.0.0.0, and an intent given to the other
        // listener left the one that got the connection to take the client for plain TCP and
        // hand its Proposal to the program as data.
        let wildcard = |l: &&Listener| {
            l.addr.ip().is_unspecified() && l.addr.ip().to_canonical().is_ipv4() == rip.is_ipv4()
        };
        let dual = |l: &&Listener| l.addr.ip().is_unspecified() && l.addr.is_ipv6();
        same_ns
            .clone()
            .find(exact)
            .or_else(|| same_ns.clone().find(wildcard))
            .or_else(|| same_ns.clone().find(dual))
            .or_else(|| {
                self.listeners
                    .values()
                    .filter(port_match)
                    .filter(|l| l.netns != netns)
                    .find(exact)
            })
    }

    fn finish_intent(&mut self, id: u64, ok: bool) -> Option<Notification> {
        let intent = self.intents.remove(&id)?;
        self.pending.remove(&(intent.listener, intent.client));
        if ok {
            return None;
        }
        let l = self.listeners.get(&intent.listener)?;
        Some(Notification {
            to: l.client,
            msg: LoopbackMessage::new(LoopbackCmd::IntentCancel, vec![LoopbackAttr::IntentId(id)]),
        })
    }

    /// A notification could not be delivered (the listener does not keep up): forget the
    /// intent it announced.
    pub fn undeliverable(&mut self, msg: &LoopbackMessage) {
        if let (LoopbackCmd::Intent, Some(id)) = (msg.cmd, msg.intent_id())
            && let Some(i) = self.intents.remove(&id)
        {
            self.pending.remove(&(i.listener, i.client));
        }
    }

    /// A client went away: drop its listener, and when it was the last channel of its
    /// session, the session (returned, so its final counters can be kept) with its DMBs and
    /// pending intents. Also returns notifications to send.
    pub fn client_gone(
        &mut self,
        client: ClientId,
        ctx: &ClientCtx,
    ) -> (Vec<Notification>, Option<Session>) {
        let mut notes = Vec::new();
        let gone: Vec<u32> = self
            .listeners
            .values()
            .filter(|l| l.client == client)
            .map(|l| l.id)
            .collect();
        for id in gone {
            if let Some(l) = self.listeners.remove(&id) {
                self.table.remove(id, l.addr.port(), !l.in_table);
            }
            self.intents.retain(|_, i| i.listener != id);
            self.pending.retain(|k, _| k.0 != id);
        }
        let Some(key) = ctx.session else {
            return (notes, None);
        };
        let last = match self.sessions.get_mut(&key) {
            Some(s) => {
                s.channels.remove(&client);
                if s.events == Some(client) {
                    s.events = None;
                }
                s.channels.is_empty()
            }
            None => false,
        };
        if !last {
            return (notes, None);
        }
        let mut s = self.sessions.remove(&key).expect("present");
        for t in s.dmbs.drain() {
            self.dmbs.remove(&t);
        }
        for b in &s.blocks {
            self.held_blocks.remove(b);
        }
        notes.extend(self.peer_gone(s.gid));
        for id in std::mem::take(&mut s.intents) {
            if let Some(n) = self.finish_intent(id, false) {
                notes.push(n);
            }
        }
        (notes, Some(s))
    }
}

impl DeviceState {
    /// The engine with `gid` ended: every engine that still holds a DMB for it (a link group
    /// with it, in either role: each side receives into its own DMBs) hears so on its events
    /// channel, once, and frees that group's buffers at once instead of keeping them for
    /// `lgr_idle_time` (the kernel's `ISM_EVENT_GID` → `smc_smcd_terminate`).
    fn peer_gone(&self, gid: Gid) -> Vec<Notification> {
        let owners: HashSet<SessionKey> = self
            .dmbs
            .values()
            .filter(|e| e.peer == gid)
            .map(|e| e.owner)
            .collect();
        owners
            .iter()
            .filter_map(|k| self.sessions.get(k)?.events)
            .map(|to| peer_gone_note(to, gid))
            .collect()
    }

    /// A block of link-group ids no live session holds (never 0), round robin.
    fn alloc_block(&mut self) -> Option<u16> {
        for _ in 0..=u16::MAX {
            let b = (self.next_engine_id & 0xffff) as u16;
            self.next_engine_id = (self.next_engine_id + 1) & 0xffff;
            if b != 0 && self.held_blocks.insert(b) {
                return Some(b);
            }
        }
        None
    }

    /// `PeerGone` for every peer of `session`'s DMBs that is no longer a live engine.
    fn gone_peers_of(&self, session: SessionKey) -> Vec<Notification> {
        let Some(s) = self.sessions.get(&session) else {
            return Vec::new();
        };
        let Some(to) = s.events else {
            return Vec::new();
        };
        let live: HashSet<Gid> = self.sessions.values().map(|x| x.gid).collect();
        let gone: HashSet<Gid> = s
            .dmbs
            .iter()
            .filter_map(|t| self.dmbs.get(t))
            .map(|e| e.peer)
            .filter(|p| !live.contains(p))
            .collect();
        gone.into_iter()
            .map(|gid| peer_gone_note(to, gid))
            .collect()
    }
}

/// Whether `fd` is a Unix `SOCK_SEQPACKET` socket.
fn is_seqpacket(fd: &OwnedFd) -> bool {
    use rustix::net::{AddressFamily, SocketType, sockopt};
    sockopt::socket_type(fd).is_ok_and(|t| t == SocketType::SEQPACKET)
        && sockopt::socket_domain(fd).is_ok_and(|d| d == AddressFamily::UNIX)
}

/// `PEER_GONE(gid)` for the events channel `to`.
fn peer_gone_note(to: ClientId, gid: Gid) -> Notification {
    Notification {
        to,
        msg: LoopbackMessage::new(LoopbackCmd::PeerGone, vec![LoopbackAttr::Gid(gid)]),
    }
}

/// IPv4-mapped IPv6 addresses compare as IPv4 (`IpAddr::to_canonical`).
fn canonical_addr(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}
