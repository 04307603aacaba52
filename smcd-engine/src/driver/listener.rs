//! The listening side (`smc_listen`, `smc_tcp_listen_work`, `smc_listen_work`): an acceptor
//! thread takes TCP connections as soon as they arrive and sorts them without reading from
//! them: a connection `smcd` announced (the client registered an intent before it
//! connected) goes to a handshake worker, any other is a plain TCP connection at once.
//! Handshakes run in parallel on workers; plain connections never wait behind them.
//!
//! In-progress handshakes plus ready connections are bounded by the backlog: at the bound the
//! acceptor stops taking connections from the kernel's queue (the kernel drops the child
//! instead; the effect on the client is the same, its SYN waits).

use super::channel::Channel;
use super::engine::Engine;
use super::handshake::{self, Fallback, Outcome};
use crate::api::SmcStream;
use crate::control::device::canonical;
use crate::device::{Doorbell, Gid};
use smc_proto::clc::ReasonCode;
use smc_proto::netlink::loopback::LoopbackCmd;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Handshake workers kept ready.
const MIN_WORKERS: usize = 2;
/// Most handshake workers per listener.
const MAX_WORKERS: usize = 32;

/// An accepted connection waiting for `accept()`.
#[derive(Debug)]
pub struct Accepted {
    /// The connection, SMC-D or TCP.
    pub stream: SmcStream,
    /// The client's address.
    pub peer: SocketAddr,
}

#[derive(Debug)]
struct Job {
    sock: TcpStream,
    peer: SocketAddr,
    gid: Gid,
}

#[derive(Debug, Default)]
struct State {
    ready: VecDeque<Accepted>,
    jobs: VecDeque<Job>,
    in_progress: usize,
    workers: usize,
    idle_workers: usize,
    intents: HashMap<SocketAddr, (Gid, u64)>,
}

/// Shared state of one listener.
#[derive(Debug)]
pub struct ListenerCore {
    tcp: TcpListener,
    engine: Arc<Engine>,
    local: SocketAddr,
    backlog: usize,
    hs_limit: bool,
    state: Mutex<State>,
    /// Signalled when `ready` gains an entry, `jobs` gains a job, or room opens up.
    cond: Condvar,
    /// Readable while `ready` is not empty (for poll/epoll users).
    bell: Doorbell,
    closed: AtomicBool,
    nonblocking: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ListenerCore {
    /// Listens on `tcp` (already bound and listening) and starts the acceptor.
    pub fn start(engine: Arc<Engine>, tcp: TcpListener, backlog: usize) -> io::Result<Arc<Self>> {
        let local = tcp.local_addr()?;
        let hs_limit = engine.settings().limit_smc_hs;
        let core = Arc::new(Self {
            tcp,
            engine,
            local,
            backlog: backlog.max(1),
            hs_limit,
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            bell: Doorbell::new()?,
            closed: AtomicBool::new(false),
            nonblocking: AtomicBool::new(false),
        });
        let chan = core.register();
        let c = Arc::clone(&core);
        std::thread::Builder::new()
            .name("smc-accept".into())
            .spawn(move || c.acceptor(chan))?;
        Ok(core)
    }

    /// Registers with `smcd`; `None` when it is not running (then every client is plain TCP).
    fn register(&self) -> Option<Channel> {
        let dev = self.engine.device()?;
        match dev.listen(self.local, self.backlog as u32, self.hs_limit) {
            Ok((ch, _id)) => Some(ch),
            Err(e) => {
                tracing::debug!("listener registration with smcd failed: {e}");
                self.engine.device_failed(&dev);
                None
            }
        }
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Handshakes queued or running.
    pub fn handshakes_in_progress(&self) -> usize {
        lock(&self.state).in_progress
    }

    /// Whether handshake work is congested: jobs wait and no worker is free (the kernel's
    /// `workqueue_congested` on its handshake workqueue).
    pub fn is_congested(&self) -> bool {
        let s = lock(&self.state);
        s.jobs.len() > s.idle_workers && s.workers >= MAX_WORKERS
    }

    fn drain_intents(&self, chan: &mut Option<Channel>) {
        let Some(ch) = chan else { return };
        loop {
            match ch.try_receive() {
                Ok(Some((Ok(msg), _, _))) => {
                    let mut st = lock(&self.state);
                    match msg.cmd {
                        LoopbackCmd::Intent => {
                            if let (Some(addr), Some(gid), Some(id)) =
                                (msg.remote_addr(), msg.gid(), msg.intent_id())
                            {
                                st.intents.insert(canon(addr), (gid, id));
                            }
                        }
                        LoopbackCmd::IntentCancel => {
                            if let Some(id) = msg.intent_id() {
                                st.intents.retain(|_, v| v.1 != id);
                            }
                        }
                        _ => {}
                    }
                }
                Ok(Some((Err(_), _, _))) => {}
                Ok(None) => return,
                Err(_) => {
                    // smcd went away: no more intents; clients cannot register either.
                    *chan = None;
                    lock(&self.state).intents.clear();
                    return;
                }
            }
        }
    }

    fn acceptor(self: Arc<Self>, mut chan: Option<Channel>) {
        let mut last_register = Instant::now();
        loop {
            {
                let mut st = lock(&self.state);
                while st.in_progress + st.ready.len() >= self.backlog
                    && !self.closed.load(Ordering::Acquire)
                {
                    st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            }
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            let (sock, peer) = match self.tcp.accept() {
                Ok(x) => x,
                Err(e) => {
                    if self.closed.load(Ordering::Acquire) {
                        return;
                    }
                    if e.kind() != io::ErrorKind::Interrupted {
                        tracing::warn!("accept on {}: {e}", self.local);
                        // EMFILE and the like: do not spin.
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    continue;
                }
            };
            if chan.is_none() && last_register.elapsed() >= Duration::from_secs(1) {
                last_register = Instant::now();
                chan = self.register();
            }
            // smcd wrote the intent before it answered the client, and the client connected
            // only after that answer: the intent is already in our socket buffer.
            self.drain_intents(&mut chan);
            let intent = lock(&self.state).intents.remove(&canon(peer));
            match intent {
                Some((gid, _)) => self.submit(Job { sock, peer, gid }),
                None => self.push_ready(
                    Outcome::Tcp(sock, Fallback::local(ReasonCode::PEERNOSMC)),
                    peer,
                ),
            }
        }
    }

    fn submit(self: &Arc<Self>, job: Job) {
        let mut st = lock(&self.state);
        st.in_progress += 1;
        st.jobs.push_back(job);
        if st.idle_workers < st.jobs.len() && st.workers < MAX_WORKERS {
            st.workers += 1;
            drop(st);
            let c = Arc::clone(self);
            if std::thread::Builder::new()
                .name("smc-handshake".into())
                .spawn(move || c.worker())
                .is_err()
            {
                lock(&self.state).workers -= 1;
            }
        } else {
            drop(st);
        }
        self.cond.notify_all();
    }

    fn worker(self: Arc<Self>) {
        loop {
            let job = {
                let mut st = lock(&self.state);
                loop {
                    if let Some(j) = st.jobs.pop_front() {
                        break Some(j);
                    }
                    if self.closed.load(Ordering::Acquire)
                        || st.workers > MIN_WORKERS && st.idle_workers > 0
                    {
                        break None;
                    }
                    st.idle_workers += 1;
                    st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
                    st.idle_workers -= 1;
                }
            };
            let Some(job) = job else {
                lock(&self.state).workers -= 1;
                return;
            };
            let result = self.handshake(job.sock, job.gid);
            let mut st = lock(&self.state);
            st.in_progress -= 1;
            match result {
                Ok(outcome) => {
                    drop(st);
                    self.push_ready(outcome, job.peer);
                }
                Err(e) => {
                    // The client went away or broke the protocol after Confirm: nothing to
                    // hand to the application.
                    tracing::debug!("handshake with {} failed: {e}", job.peer);
                    drop(st);
                    self.cond.notify_all();
                }
            }
        }
    }

    fn handshake(&self, sock: TcpStream, gid: Gid) -> io::Result<Outcome> {
        let settings = self.engine.settings();
        match self.engine.device() {
            Some(dev) => handshake::server(&self.engine, &dev, sock, gid, &settings),
            // The device vanished between intent and accept: decline, both go TCP.
            None => {
                let _ = handshake::write_clc(
                    &sock,
                    &smc_proto::clc::ClcMessage::Decline(smc_proto::clc::Decline::new(
                        ReasonCode::NOSMCDEV,
                        smc_proto::clc::SMC_V2,
                    )),
                );
                // The client's Proposal is still unread; read it so no byte of it reaches the
                // application.
                let _ = sock.set_read_timeout(Some(handshake::CLC_WAIT_TIME));
                let _ = handshake::read_clc(&sock);
                let _ = sock.set_read_timeout(None);
                Ok(Outcome::Tcp(sock, Fallback::local(ReasonCode::NOSMCDEV)))
            }
        }
    }

    fn push_ready(&self, outcome: Outcome, peer: SocketAddr) {
        let stream = SmcStream::from_outcome(&self.engine, outcome);
        let mut st = lock(&self.state);
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        st.ready.push_back(Accepted { stream, peer });
        drop(st);
        self.bell.ring();
        self.cond.notify_all();
    }

    /// Takes the next ready connection, waiting for one unless non-blocking.
    pub fn accept(&self) -> io::Result<Accepted> {
        let mut st = lock(&self.state);
        loop {
            if let Some(a) = st.ready.pop_front() {
                if st.ready.is_empty() {
                    self.bell.drain();
                }
                drop(st);
                // Room for the acceptor again.
                self.cond.notify_all();
                return Ok(a);
            }
            if self.closed.load(Ordering::Acquire) {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    "listener closed",
                ));
            }
            if self.nonblocking.load(Ordering::Relaxed) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Non-blocking accept.
    pub fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Ordering::Relaxed);
    }

    /// The descriptor that is readable while a connection is ready.
    pub fn ready_fd(&self) -> rustix::fd::BorrowedFd<'_> {
        rustix::fd::AsFd::as_fd(&self.bell)
    }

    /// Stops listening: the TCP listener stops taking connections, queued connections are
    /// closed, workers finish what they started and exit.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _ = rustix::net::shutdown(&self.tcp, rustix::net::Shutdown::Read);
        let ready: Vec<_> = lock(&self.state).ready.drain(..).collect();
        drop(ready);
        self.cond.notify_all();
    }
}

fn canon(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(canonical(a.ip()), a.port())
}
