//! The `smcd` socket server: one thread, one epoll set, non-blocking everything.
//!
//! Clients connect to a Unix `SOCK_SEQPACKET` socket and send netlink messages, one per
//! record. The server dispatches on the netlink message type (the family id): the loopback
//! device family goes to [`DeviceState`](super::device::DeviceState); other families are
//! added by the control-plane modules. A client that sends garbage gets an `NLMSG_ERROR`; a
//! client that does not read its replies is dropped once its queue is full, so no client can
//! stall the others.
//!
//! Dumps that read the engines' status areas (`ss`, `stats`, `linkgroup show`, ...) run as
//! [`Job`]s, one page per step, as the kernel's netlink dumps do: a step runs only when the
//! client's socket has room for its page, at most one step per dump and `STEPS_PER_TURN`
//! in all per turn of the loop, and every turn first serves whatever requests arrived
//! (`epoll_wait` without waiting while a dump is runnable). So connection setup (intents, DMB
//! registration and attach) waits at most a few bounded steps, however many dumps run, and a dump whose client stops reading costs one
//! queued page until it reads again. While its dump runs, a client's further requests stay
//! in its socket (netlink answers a socket's requests in order too).

use super::daemon::Daemon;
use super::device::{ClientCtx, ClientId, FdRef};
use super::genl::Job;
use crate::ipc::channel::{self, MAX_RECORD};
use netlink_packet_core::{ErrorMessage, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_generic::GenlMessage;
use rustix::event::epoll;
use rustix::fd::{AsFd, OwnedFd};
use rustix::net::{AddressFamily, RecvFlags, SocketAddrUnix, SocketFlags, SocketType};
use smc_proto::netlink::loopback::{LOOPBACK_FAMILY_ID, LoopbackCmd, LoopbackMessage, Verdict};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::num::NonZeroI32;
use std::path::{Path, PathBuf};

/// Replies queued for a slow client before it is dropped.
const MAX_QUEUED: usize = 256;
/// Dump steps per turn of the loop: however many dumps run, a request waits at most this
/// many steps (each bounded, see `genl::dump`).
const STEPS_PER_TURN: usize = 8;
/// Token of the listening socket in the epoll set.
const LISTEN_TOKEN: u64 = u64::MAX;
/// Token of the wake-up descriptor (signals, shutdown).
const WAKE_TOKEN: u64 = u64::MAX - 1;

#[derive(Debug)]
struct Client {
    sock: OwnedFd,
    ctx: ClientCtx,
    /// Replies that could not be sent yet (without descriptors: those are only sent in
    /// direct replies, which are never queued behind others).
    queue: VecDeque<Vec<u8>>,
    /// A dump in progress.
    job: Option<Job>,
    /// Whether the client is in the run queue.
    runnable: bool,
}

/// The server: socket, clients and the daemon state.
#[derive(Debug)]
pub struct Server {
    path: PathBuf,
    listen: OwnedFd,
    epoll: OwnedFd,
    clients: HashMap<ClientId, Client>,
    next_id: ClientId,
    buf: Vec<u8>,
    /// The listening socket is out of the epoll set because we ran out of descriptors; it
    /// goes back when a client leaves.
    accept_paused: bool,
    /// Clients whose dump may take its next step (their socket has room).
    runnable: VecDeque<ClientId>,
    /// The daemon state.
    pub daemon: Daemon,
}

impl Server {
    /// Binds the socket at `path` (replacing a stale socket file) and creates the epoll set.
    /// `wake` (if any) is a descriptor whose readability ends [`Server::run`].
    ///
    /// The socket is bound to a temporary name beside `path`, made connectable for everyone
    /// and listening, and only then renamed to `path`: whoever sees the file can connect.
    pub fn bind(path: &Path, daemon: Daemon, wake: Option<&OwnedFd>) -> io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let listen = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".{}.tmp", std::process::id()));
        let tmp = PathBuf::from(tmp);
        match std::fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let ready = (|| {
            rustix::net::bind(&listen, &SocketAddrUnix::new(&tmp)?)?;
            // Everyone may connect; what they may do is checked per request (SO_PEERCRED).
            std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o666))?;
            rustix::net::listen(&listen, 1024)?;
            // Replaces a stale socket file in one step.
            std::fs::rename(&tmp, path)
        })();
        if let Err(e) = ready {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(
            &epoll,
            &listen,
            epoll::EventData::new_u64(LISTEN_TOKEN),
            epoll::EventFlags::IN,
        )?;
        if let Some(w) = wake {
            epoll::add(
                &epoll,
                w,
                epoll::EventData::new_u64(WAKE_TOKEN),
                epoll::EventFlags::IN,
            )?;
        }
        Ok(Self {
            path: path.to_owned(),
            listen,
            epoll,
            clients: HashMap::new(),
            next_id: 1,
            buf: vec![0u8; MAX_RECORD],
            accept_paused: false,
            runnable: VecDeque::new(),
            daemon,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves until the wake descriptor becomes readable.
    pub fn run(&mut self) -> io::Result<()> {
        let mut events = Vec::with_capacity(256);
        let now = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        loop {
            events.clear();
            // A dump with its next page to make: look for requests, but do not wait.
            let timeout = (!self.runnable.is_empty()).then_some(&now);
            match epoll::wait(
                &self.epoll,
                rustix::buffer::spare_capacity(&mut events),
                timeout,
            ) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            for ev in &events {
                let (flags, data) = (ev.flags, ev.data);
                match data.u64() {
                    LISTEN_TOKEN => self.accept_all(),
                    WAKE_TOKEN => return Ok(()),
                    id => {
                        let gone = epoll::EventFlags::HUP | epoll::EventFlags::ERR;
                        let dumping = self.clients.get(&id).is_some_and(|c| c.job.is_some());
                        if dumping && flags.intersects(gone) {
                            // Its requests are not read while it dumps; nobody reads the rest.
                            self.drop_client(id);
                            continue;
                        }
                        if flags.contains(epoll::EventFlags::OUT) {
                            self.flush(id);
                        }
                        if !dumping && flags.intersects(epoll::EventFlags::IN | gone) {
                            self.read_client(id);
                        }
                    }
                }
            }
            self.run_jobs();
        }
    }

    /// One step of each runnable dump, in turn, at most `STEPS_PER_TURN` of them before
    /// the loop looks for requests again (the rest go first next turn).
    fn run_jobs(&mut self) {
        for _ in 0..self.runnable.len().min(STEPS_PER_TURN) {
            let Some(id) = self.runnable.pop_front() else {
                return;
            };
            let Some(c) = self.clients.get_mut(&id) else {
                continue;
            };
            c.runnable = false;
            let Some(job) = c.job.take() else {
                continue;
            };
            let ctx = c.ctx;
            let (records, next) = job.step(&mut self.daemon, &ctx);
            c_job(&mut self.clients, id, next);
            for r in records {
                self.send(id, r, &[]);
            }
            self.schedule(id);
        }
    }

    /// After a client's state changed: its dump goes on if its socket has room, and epoll
    /// watches what matters now (requests only without a dump, room only with a queue).
    fn schedule(&mut self, id: ClientId) {
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        if c.job.is_some() && c.queue.is_empty() && !c.runnable {
            c.runnable = true;
            self.runnable.push_back(id);
        }
        let mut flags = epoll::EventFlags::empty();
        if c.job.is_none() {
            flags |= epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
        }
        if !c.queue.is_empty() {
            flags |= epoll::EventFlags::OUT;
        }
        let _ = epoll::modify(&self.epoll, &c.sock, epoll::EventData::new_u64(id), flags);
    }

    fn accept_all(&mut self) {
        loop {
            let sock = match rustix::net::accept_with(
                &self.listen,
                SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            ) {
                Ok(s) => s,
                Err(rustix::io::Errno::AGAIN) => return,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e @ (rustix::io::Errno::MFILE | rustix::io::Errno::NFILE)) => {
                    // Out of descriptors: the rest wait in the backlog. The listening socket
                    // stays readable, so take it out of the epoll set until a client leaves
                    // rather than spin on it.
                    tracing::warn!("accept: {e}; pausing until a client leaves");
                    if epoll::delete(&self.epoll, &self.listen).is_ok() {
                        self.accept_paused = true;
                    }
                    return;
                }
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    return;
                }
            };
            let (pid, uid, gid) = match rustix::net::sockopt::socket_peercred(&sock) {
                Ok(c) => (
                    c.pid.as_raw_nonzero().get() as u32,
                    c.uid.as_raw(),
                    c.gid.as_raw(),
                ),
                Err(_) => (0, u32::MAX, u32::MAX),
            };
            let id = self.next_id;
            self.next_id += 1;
            if epoll::add(
                &self.epoll,
                &sock,
                epoll::EventData::new_u64(id),
                epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
            )
            .is_err()
            {
                continue;
            }
            self.clients.insert(
                id,
                Client {
                    sock,
                    ctx: ClientCtx {
                        pid,
                        uid,
                        gid,
                        session: None,
                        netns: if pid == 0 {
                            0
                        } else {
                            super::device::netns_of_pid(pid).unwrap_or(0)
                        },
                    },
                    queue: VecDeque::new(),
                    job: None,
                    runnable: false,
                },
            );
        }
    }

    fn read_client(&mut self, id: ClientId) {
        // Bounded per wake so one chatty client cannot starve the others.
        for _ in 0..64 {
            let Some(c) = self.clients.get(&id) else {
                return;
            };
            if c.job.is_some() {
                return; // the rest waits for the dump (see `schedule`)
            }
            match channel::recv_record(c.sock.as_fd(), &mut self.buf, RecvFlags::DONTWAIT) {
                Ok((0, _)) => return self.drop_client(id),
                Ok((n, fds)) => {
                    let record = self.buf[..n].to_vec();
                    self.dispatch(id, &record, fds);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    // A truncated record: say so and carry on.
                    self.send_error(id, &[0u8; 16], rustix::io::Errno::MSGSIZE.raw_os_error());
                }
                Err(_) => return self.drop_client(id),
            }
        }
    }

    fn drop_client(&mut self, id: ClientId) {
        if let Some(c) = self.clients.remove(&id) {
            let _ = epoll::delete(&self.epoll, &c.sock);
            if self.accept_paused
                && epoll::add(
                    &self.epoll,
                    &self.listen,
                    epoll::EventData::new_u64(LISTEN_TOKEN),
                    epoll::EventFlags::IN,
                )
                .is_ok()
            {
                self.accept_paused = false;
            }
            let (notes, session) = self.daemon.device.client_gone(id, &c.ctx);
            if let Some(s) = session {
                self.daemon.session_gone(s);
            }
            for n in notes {
                self.deliver(n.to, &n.msg);
            }
        }
    }

    fn dispatch(&mut self, id: ClientId, record: &[u8], fds: Vec<OwnedFd>) {
        let Some(header) = channel::peek_header(record) else {
            return self.send_error(id, record, rustix::io::Errno::INVAL.raw_os_error());
        };
        if header.message_type == LOOPBACK_FAMILY_ID {
            return self.dispatch_loopback(id, header, record, fds);
        }
        // Descriptors are only ever expected with the loopback family.
        drop(fds);
        let Some(ctx) = self.clients.get(&id).map(|c| c.ctx) else {
            return;
        };
        let reply = super::genl::start(&mut self.daemon, &ctx, record);
        for r in reply.records {
            self.send(id, r, &[]);
        }
        if reply.job.is_some() {
            c_job(&mut self.clients, id, reply.job);
            self.schedule(id);
        }
    }

    fn dispatch_loopback(
        &mut self,
        id: ClientId,
        header: NetlinkHeader,
        record: &[u8],
        fds: Vec<OwnedFd>,
    ) {
        let msg = match channel::decode::<GenlMessage<LoopbackMessage>>(record) {
            Ok(NetlinkMessage {
                payload: NetlinkPayload::InnerMessage(g),
                ..
            }) => g.payload,
            _ => return self.send_error(id, record, rustix::io::Errno::INVAL.raw_os_error()),
        };
        let Some(client) = self.clients.get_mut(&id) else {
            return;
        };
        let mut ctx = client.ctx;
        let out = self.daemon.device.handle(id, &mut ctx, msg, fds);
        if let Some(c) = self.clients.get_mut(&id) {
            c.ctx = ctx;
        }
        // Notifications first: a client's CONNECT is answered only after the listener has the
        // intent in its socket buffer, so its accept() can never see the connection first.
        let mut reply = out.reply;
        let mut fds: Vec<OwnedFd> = Vec::new();
        for &r in &out.fds {
            let dup = match r {
                FdRef::SysctlPage(netns) => self
                    .daemon
                    .namespace(netns)
                    .ok()
                    .and_then(|ns| rustix::io::fcntl_dupfd_cloexec(ns.page_fd(), 0).ok()),
                r => self
                    .daemon
                    .device
                    .fd(r)
                    .and_then(|fd| rustix::io::fcntl_dupfd_cloexec(fd, 0).ok()),
            };
            fds.extend(dup);
        }
        fds.extend(out.give);
        let mut failed = Vec::new();
        for n in out.notes {
            if !self.deliver(n.to, &n.msg) {
                failed.push(n.msg);
            }
        }
        for msg in failed {
            self.daemon.device.undeliverable(&msg);
            if msg.cmd == LoopbackCmd::Intent {
                reply = Some(Ok(LoopbackMessage::new(
                    LoopbackCmd::Connect,
                    vec![
                        smc_proto::netlink::loopback::LoopbackAttr::Verdict(Verdict::Tcp),
                        smc_proto::netlink::loopback::LoopbackAttr::Reason(
                            smc_proto::clc::ReasonCode::PEERNOSMC.0,
                        ),
                    ],
                )));
            }
        }
        match reply {
            None => {}
            Some(Ok(m)) => {
                let mut h = NetlinkHeader::default();
                h.sequence_number = header.sequence_number;
                let bytes = channel::encode(NetlinkMessage::new(
                    h,
                    NetlinkPayload::from(GenlMessage::from_payload(m)),
                ));
                let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
                self.send(id, bytes, &borrowed);
            }
            Some(Err(errno)) => self.send_error(id, record, errno),
        }
    }

    /// Sends a notification to a listener channel without ever blocking; false if it could not
    /// be queued.
    fn deliver(&mut self, to: ClientId, msg: &LoopbackMessage) -> bool {
        let Some(c) = self.clients.get(&to) else {
            return false;
        };
        if !c.queue.is_empty() {
            return false;
        }
        let bytes = channel::encode(NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::from(GenlMessage::from_payload(msg.clone())),
        ));
        channel::send_record(c.sock.as_fd(), &bytes, &[]).is_ok()
    }

    /// Sends an `NLMSG_ERROR` carrying `-errno` and the request's header.
    pub fn send_error(&mut self, id: ClientId, request: &[u8], errno: i32) {
        let mut h = NetlinkHeader::default();
        h.sequence_number = channel::peek_header(request).map_or(0, |h| h.sequence_number);
        let mut e = ErrorMessage::default();
        e.code = NonZeroI32::new(-errno.abs());
        e.header = request[..request.len().min(16)].to_vec();
        let bytes = channel::encode(NetlinkMessage::<GenlMessage<LoopbackMessage>>::new(
            h,
            NetlinkPayload::Error(e),
        ));
        self.send(id, bytes, &[]);
    }

    /// Sends a record to a client, queueing it if the socket is full (then without fds: a
    /// reply carrying descriptors to a client that does not read is dropped with the client).
    pub fn send(&mut self, id: ClientId, bytes: Vec<u8>, fds: &[rustix::fd::BorrowedFd<'_>]) {
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        if c.queue.is_empty() {
            match channel::send_record(c.sock.as_fd(), &bytes, fds) {
                Ok(()) => return,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && fds.is_empty() => {}
                Err(_) => return self.drop_client(id),
            }
        }
        if c.queue.len() >= MAX_QUEUED {
            return self.drop_client(id);
        }
        c.queue.push_back(bytes);
        if c.queue.len() == 1 {
            self.schedule(id);
        }
    }

    fn flush(&mut self, id: ClientId) {
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        while let Some(b) = c.queue.front() {
            match channel::send_record(c.sock.as_fd(), b, &[]) {
                Ok(()) => {
                    c.queue.pop_front();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => return self.drop_client(id),
            }
        }
        // Room again: requests are read, and a dump in progress makes its next page.
        self.schedule(id);
    }
}

/// Gives client `id` its dump (or takes it away).
fn c_job(clients: &mut HashMap<ClientId, Client>, id: ClientId, job: Option<Job>) {
    if let Some(c) = clients.get_mut(&id) {
        c.job = job;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
