//! `smcd`'s side of the loopback device: engine sessions and their GIDs, the DMB registry,
//! SMC listeners and connect intents (the kernel's `smc_loopback.c` DMB table plus the part of
//! `af_smc.c` that decides, from the SYN option, whether a connection will run CLC).
//!
//! Everything here is plain state driven by the server loop: a handler takes a request from a
//! client and returns the reply plus any notifications for other clients; it does no IO
//! itself except creating memfds and eventfds for new DMBs.

use crate::device::shm::{create_dmb_memfd, random_u64};
use crate::device::{Gid, LOOPBACK_CHID};
use rustix::fd::OwnedFd;
use smc_proto::clc::ReasonCode;
use smc_proto::netlink::loopback::{LoopbackAttr, LoopbackCmd, LoopbackMessage, Verdict};
use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{IpAddr, SocketAddr};

/// Identifies one client connection of the server.
pub type ClientId = u64;

/// An engine session: all channels that said HELLO with the same key and pid.
#[derive(Debug)]
pub struct Session {
    /// The engine's GID.
    pub gid: Gid,
    /// smcd's small id for it.
    pub engine_id: u32,
    /// The engine's process.
    pub pid: u32,
    /// Its network namespace inode.
    pub netns: u64,
    channels: HashSet<ClientId>,
    dmbs: HashSet<u64>,
    intents: HashSet<u64>,
}

#[derive(Debug)]
struct DmbEntry {
    memfd: OwnedFd,
    bell: OwnedFd,
    len: usize,
    owner: (u64, u32),
    peer: Gid,
}

/// A registered SMC listener.
#[derive(Debug, Clone)]
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
    pub session: (u64, u32),
}

#[derive(Debug)]
struct Intent {
    listener: u32,
    session: (u64, u32),
}

/// Per-client state the device handler needs.
#[derive(Debug, Default, Clone, Copy)]
pub struct ClientCtx {
    /// The peer's process id from `SO_PEERCRED`.
    pub pid: u32,
    /// The session this client belongs to, after HELLO.
    pub session: Option<(u64, u32)>,
}

/// A message for another client (a listener channel).
#[derive(Debug)]
pub struct Notification {
    /// Where to send it.
    pub to: ClientId,
    /// What.
    pub msg: LoopbackMessage,
}

/// The outcome of a request: the reply (or an errno) with descriptors to pass along, and
/// notifications for other clients.
#[derive(Debug, Default)]
pub struct Outcome<'a> {
    /// `Ok(Some(reply))`, `Ok(None)` for one-way messages, or `Err(errno)`.
    pub reply: Option<Result<LoopbackMessage, i32>>,
    /// Descriptors to send with the reply.
    pub fds: Vec<rustix::fd::BorrowedFd<'a>>,
    /// Notifications; `deliver` is asked for each before the reply is sent, and a failed
    /// delivery of an intent turns the reply into a plain-TCP verdict.
    pub notes: Vec<Notification>,
}

/// The device state of one `smcd`.
#[derive(Debug)]
pub struct DeviceState {
    sessions: HashMap<(u64, u32), Session>,
    next_engine_id: u32,
    dmbs: HashMap<u64, DmbEntry>,
    listeners: HashMap<u32, Listener>,
    next_listener_id: u32,
    intents: HashMap<u64, Intent>,
    next_intent: u64,
    /// The host's system EID, as sent in proposals.
    pub seid: String,
    /// The host name.
    pub hostname: String,
    /// Most DMBs registered at once (the kernel's loopback device allows 5000).
    pub max_dmbs: usize,
}

/// The kernel's `SMC_LO_MAX_DMBS`.
pub const DEFAULT_MAX_DMBS: usize = 5000;

fn errno(e: rustix::io::Errno) -> i32 {
    e.raw_os_error()
}

impl DeviceState {
    /// Empty state for a host with this SEID and host name.
    pub fn new(seid: String, hostname: String) -> Self {
        Self {
            sessions: HashMap::new(),
            next_engine_id: 1,
            dmbs: HashMap::new(),
            listeners: HashMap::new(),
            next_listener_id: 1,
            intents: HashMap::new(),
            next_intent: 1,
            seid,
            hostname,
            max_dmbs: DEFAULT_MAX_DMBS,
        }
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

    /// Handles one request of the `SMCD_LOOPBACK` family from `client`.
    pub fn handle<'s>(
        &'s mut self,
        client: ClientId,
        ctx: &mut ClientCtx,
        req: LoopbackMessage,
        listener_ok: &mut dyn FnMut(&Listener) -> bool,
    ) -> Outcome<'s> {
        let mut out = Outcome::default();
        let reply = |cmd, attrs| Some(Ok(LoopbackMessage::new(cmd, attrs)));
        if req.cmd != LoopbackCmd::Hello && ctx.session.is_none() {
            out.reply = Some(Err(errno(rustix::io::Errno::PROTO)));
            return out;
        }
        match req.cmd {
            LoopbackCmd::Hello => {
                out.reply = Some(self.hello(client, ctx, &req));
            }
            LoopbackCmd::Listen => {
                let session = ctx.session.expect("checked");
                let Some(addr) = req.local_addr() else {
                    out.reply = Some(Err(errno(rustix::io::Errno::INVAL)));
                    return out;
                };
                let netns = self.sessions.get(&session).map_or(0, |s| s.netns);
                let id = self.next_listener_id;
                self.next_listener_id = self.next_listener_id.wrapping_add(1).max(1);
                self.listeners.insert(
                    id,
                    Listener {
                        id,
                        client,
                        addr,
                        netns,
                        backlog: req.backlog().unwrap_or(128),
                        hs_limit: req.hs_limit().unwrap_or(false),
                        session,
                    },
                );
                out.reply = reply(LoopbackCmd::Listen, vec![LoopbackAttr::ListenerId(id)]);
            }
            LoopbackCmd::Connect => {
                let session = ctx.session.expect("checked");
                let (Some(local), Some(remote)) = (req.local_addr(), req.remote_addr()) else {
                    out.reply = Some(Err(errno(rustix::io::Errno::INVAL)));
                    return out;
                };
                let (gid, netns) = match self.sessions.get(&session) {
                    Some(s) => (s.gid, s.netns),
                    None => {
                        out.reply = Some(Err(errno(rustix::io::Errno::PROTO)));
                        return out;
                    }
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
                let Some(l) = self.find_listener(remote, netns).cloned() else {
                    out.reply = tcp(ReasonCode::PEERNOSMC);
                    return out;
                };
                if !listener_ok(&l) {
                    // Handshake limitation: the listener is congested, so this connection
                    // is answered "without the SMC option".
                    out.reply = tcp(ReasonCode::PEERNOSMC);
                    return out;
                }
                let intent = self.next_intent;
                self.next_intent += 1;
                out.notes.push(Notification {
                    to: l.client,
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
                        listener: l.id,
                        session,
                    },
                );
                if let Some(s) = self.sessions.get_mut(&session) {
                    s.intents.insert(intent);
                }
                out.reply = reply(
                    LoopbackCmd::Connect,
                    vec![
                        LoopbackAttr::Verdict(Verdict::Smc),
                        LoopbackAttr::Reason(0),
                        LoopbackAttr::IntentId(intent),
                        LoopbackAttr::Gid(self.sessions.get(&l.session).map_or(0, |s| s.gid)),
                    ],
                );
            }
            LoopbackCmd::IntentDone => {
                if let Some(id) = req.intent_id() {
                    let ok = req.ok().unwrap_or(false);
                    if let Some(note) = self.finish_intent(id, ok) {
                        out.notes.push(note);
                    }
                }
            }
            LoopbackCmd::DmbRegister => {
                let session = ctx.session.expect("checked");
                let (Some(size), Some(peer)) = (req.size(), req.peer_gid()) else {
                    out.reply = Some(Err(errno(rustix::io::Errno::INVAL)));
                    return out;
                };
                match self.register(session, size as usize, peer) {
                    Ok(token) => {
                        let e = &self.dmbs[&token];
                        out.fds = vec![
                            rustix::fd::AsFd::as_fd(&e.memfd),
                            rustix::fd::AsFd::as_fd(&e.bell),
                        ];
                        out.reply = reply(
                            LoopbackCmd::DmbRegister,
                            vec![LoopbackAttr::Token(token), LoopbackAttr::Size(size)],
                        );
                    }
                    Err(e) => out.reply = Some(Err(e.raw_os_error().unwrap_or(libc_enomem()))),
                }
            }
            LoopbackCmd::DmbAttach => {
                let session = ctx.session.expect("checked");
                let gid = self.sessions.get(&session).map(|s| s.gid);
                let Some(token) = req.token() else {
                    out.reply = Some(Err(errno(rustix::io::Errno::INVAL)));
                    return out;
                };
                match self.dmbs.get(&token) {
                    None => out.reply = Some(Err(errno(rustix::io::Errno::NOENT))),
                    Some(e) if Some(e.peer) != gid => {
                        out.reply = Some(Err(errno(rustix::io::Errno::PERM)))
                    }
                    Some(e) => {
                        let owner_gid = self.sessions.get(&e.owner).map_or(0, |s| s.gid);
                        out.fds = vec![
                            rustix::fd::AsFd::as_fd(&e.memfd),
                            rustix::fd::AsFd::as_fd(&e.bell),
                        ];
                        out.reply = reply(
                            LoopbackCmd::DmbAttach,
                            vec![
                                LoopbackAttr::Size(e.len as u32),
                                LoopbackAttr::Gid(owner_gid),
                            ],
                        );
                    }
                }
            }
            LoopbackCmd::DmbUnregister => {
                let session = ctx.session.expect("checked");
                if let Some(token) = req.token()
                    && self.dmbs.get(&token).is_some_and(|e| e.owner == session)
                {
                    self.dmbs.remove(&token);
                    if let Some(s) = self.sessions.get_mut(&session) {
                        s.dmbs.remove(&token);
                    }
                }
            }
            LoopbackCmd::Intent | LoopbackCmd::IntentCancel | LoopbackCmd::Unknown(_) => {
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
    ) -> Result<LoopbackMessage, i32> {
        let (Some(key), Some(pid)) = (req.session_key(), req.pid()) else {
            return Err(errno(rustix::io::Errno::INVAL));
        };
        if pid != ctx.pid {
            // A process may only speak for itself.
            return Err(errno(rustix::io::Errno::PERM));
        }
        if let Some(old) = ctx.session
            && old != (key, pid)
        {
            return Err(errno(rustix::io::Errno::INVAL));
        }
        let next_id = &mut self.next_engine_id;
        let s = self.sessions.entry((key, pid)).or_insert_with(|| {
            let id = *next_id;
            *next_id = next_id.wrapping_add(1).max(1);
            Session {
                gid: (u128::from(random_u64()) << 64) | u128::from(random_u64()),
                engine_id: id,
                pid,
                netns: req.netns().unwrap_or(0),
                channels: HashSet::new(),
                dmbs: HashSet::new(),
                intents: HashSet::new(),
            }
        });
        s.channels.insert(client);
        ctx.session = Some((key, pid));
        Ok(LoopbackMessage::new(
            LoopbackCmd::Hello,
            vec![
                LoopbackAttr::Gid(s.gid),
                LoopbackAttr::EngineId(s.engine_id),
                LoopbackAttr::Seid(self.seid.clone()),
                LoopbackAttr::Hostname(self.hostname.clone()),
                LoopbackAttr::Chid(LOOPBACK_CHID),
            ],
        ))
    }

    fn register(&mut self, session: (u64, u32), len: usize, peer: Gid) -> io::Result<u64> {
        if self.dmbs.len() >= self.max_dmbs {
            // smc_lo_register_dmb: no free DMB slot.
            return Err(io::Error::from_raw_os_error(
                rustix::io::Errno::NOSPC.raw_os_error(),
            ));
        }
        let memfd = create_dmb_memfd(len)?;
        let bell = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
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
                bell,
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
    /// that address.
    fn find_listener(&self, remote: SocketAddr, netns: u64) -> Option<&Listener> {
        let rip = canonical(remote.ip());
        let port_match = |l: &&Listener| l.addr.port() == remote.port();
        let same_ns = self
            .listeners
            .values()
            .filter(port_match)
            .filter(|l| l.netns == netns);
        let exact = |l: &&Listener| canonical(l.addr.ip()) == rip;
        let wildcard =
            |l: &&Listener| l.addr.ip().is_unspecified() && (l.addr.is_ipv6() || rip.is_ipv4());
        same_ns
            .clone()
            .find(exact)
            .or_else(|| same_ns.clone().find(wildcard))
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
        if let Some(s) = self.sessions.get_mut(&intent.session) {
            s.intents.remove(&id);
        }
        if ok {
            return None;
        }
        let l = self.listeners.get(&intent.listener)?;
        Some(Notification {
            to: l.client,
            msg: LoopbackMessage::new(LoopbackCmd::IntentCancel, vec![LoopbackAttr::IntentId(id)]),
        })
    }

    /// A notification for `to` could not be delivered (the listener does not keep up):
    /// forget the intent it announced.
    pub fn undeliverable(&mut self, msg: &LoopbackMessage) {
        if let (LoopbackCmd::Intent, Some(id)) = (msg.cmd, msg.intent_id())
            && let Some(i) = self.intents.remove(&id)
            && let Some(s) = self.sessions.get_mut(&i.session)
        {
            s.intents.remove(&id);
        }
    }

    /// A client went away: drop its listener, and when it was the last channel of its
    /// session, the session's DMBs and pending intents. Returns notifications to send.
    pub fn client_gone(&mut self, client: ClientId, ctx: &ClientCtx) -> Vec<Notification> {
        let mut notes = Vec::new();
        let gone_listeners: Vec<u32> = self
            .listeners
            .values()
            .filter(|l| l.client == client)
            .map(|l| l.id)
            .collect();
        for id in gone_listeners {
            self.listeners.remove(&id);
            self.intents.retain(|_, i| i.listener != id);
        }
        let Some(key) = ctx.session else {
            return notes;
        };
        let last = match self.sessions.get_mut(&key) {
            Some(s) => {
                s.channels.remove(&client);
                s.channels.is_empty()
            }
            None => false,
        };
        if last {
            let s = self.sessions.remove(&key).expect("present");
            for t in s.dmbs {
                self.dmbs.remove(&t);
            }
            for id in s.intents {
                if let Some(n) = self.finish_intent(id, false) {
                    notes.push(n);
                }
            }
            // Listeners of this engine on other channels are gone with their channels.
        }
        notes
    }
}

fn libc_enomem() -> i32 {
    rustix::io::Errno::NOMEM.raw_os_error()
}

/// IPv4-mapped IPv6 addresses compare as IPv4.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}
