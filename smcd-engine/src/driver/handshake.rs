//! Running the CLC handshake over the TCP connection (`af_smc.c`: `__smc_connect`,
//! `smc_listen_work`) with the state machines of `smc_core::handshake`: this side reads and
//! writes the bytes, answers the machines' requests for buffers (link group, DMB, the peer's
//! DMB) and builds the connection when they end.
//!
//! A handshake runs step by step ([`ClientRun::step`], [`ServerRun::step`]: as far as the
//! socket allows without waiting) or to the end ([`ClientRun::run`]). Every failure before the
//! Confirm ends in a Decline with a reason and a TCP fallback that loses nothing: no
//! application byte has been read, CLC messages are read exactly. A failure on the server
//! after the Confirm (attaching the client's DMB) resets the connection instead: the client
//! already runs SMC and would not read a Decline.
//!
//! With each DMB offered, its owner writes a fresh connection id into the DMB's engine word
//! before the message that names the DMB; the peer reads it after attaching. A readiness bell
//! travels only if the application asks for the descriptor, tagged with that id
//! (`transport::smcd`): setting up a connection costs no system call beyond the handshake's.

use super::conn::{ConnParams, SmcConn, SmcdInfo};
use super::engine::Engine;
use super::lgr::{LinkGroup, PeerV2, Role};
use crate::device::{BufferProvider, Dmb, Gid};
use crate::layout::status::{self as st, ConnIdentity};
use crate::settings::Settings;
use crate::sys::{core_instant, core_now, std_instant};
use crate::transport::smcd::SmcdLink;
use rustix::event::{PollFd, PollFlags};
use rustix::fd::{AsFd, BorrowedFd};
use rustix::net::{RecvFlags, SendFlags};
use smc_core::conn::{CLOSE_DRAIN_TIMEOUT, Config, TxBuffer};
use smc_core::handshake::{
    ClientEvent, ClientHandshake, HandshakeError, LocalBuffer, ServerEvent, ServerHandshake,
    decide::{AcceptInfo, ConfirmInfo, ProposalInfo},
    starts_with_clc,
};
use smc_proto::clc::{FirstContactExt, ReasonCode, SMC_V2};
use std::io;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub use smc_core::handshake::CLC_WAIT_TIME;

/// Why a connection runs over TCP: (local reason, peer reason), as smcss shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallback {
    /// Our reason.
    pub local: ReasonCode,
    /// The peer's reason (from its Decline), or 0.
    pub peer: ReasonCode,
}

impl Fallback {
    /// A fallback with only a local reason.
    pub fn local(r: ReasonCode) -> Self {
        Self {
            local: r,
            peer: ReasonCode(0),
        }
    }
}

impl From<smc_core::handshake::Fallback> for Fallback {
    fn from(f: smc_core::handshake::Fallback) -> Self {
        Self {
            local: f.local,
            peer: f.peer,
        }
    }
}

/// The result of a handshake.
#[derive(Debug)]
pub enum Outcome {
    /// SMC-D is up.
    Smc {
        /// The connection.
        conn: Arc<SmcConn<SmcdLink>>,
        /// Its link group (one slot held).
        lgr: Arc<LinkGroup>,
    },
    /// The connection continues as plain TCP.
    Tcp(TcpStream, Fallback),
}

/// The core's configuration for a new SMC-D connection from the settings snapshot.
pub fn core_config(s: &Settings, rx_ring: usize, tx_ring: usize) -> Config {
    Config {
        rx_ring,
        tx_ring,
        tx_buffer: TxBuffer::NoCopy,
        completions: false,
        autocorking_size: s.autocorking_size as usize,
        autosplit_size: s.autosplit_size as usize,
        tx_chunk: s.tx_chunk as usize,
        wnd_rule: s.wnd_update_rule,
        linger: CLOSE_DRAIN_TIMEOUT,
        // An SMC-D CDC is two words in shared memory: the consumer cursor goes out when the
        // window rule says (see Config::piggyback_consumer).
        piggyback_consumer: false,
    }
}

fn peer_v2(fce: Option<FirstContactExt>, eid: smc_proto::clc::Eid) -> PeerV2 {
    PeerV2 {
        version: SMC_V2,
        release: fce.map_or(0, |f| f.release),
        os: fce.map_or(0, |f| f.os_type.nibble()),
        hostname: fce
            .map(|f| String::from_utf8_lossy(f.hostname.trimmed()).into_owned())
            .unwrap_or_default(),
        eid: String::from_utf8_lossy(eid.trimmed()).into_owned(),
    }
}

/// Writes a fresh connection id into our DMB's engine word (before the CLC message that names
/// the DMB: the peer reads it after attaching), and whether we take the peer's bells with
/// `pidfd_getfd` (`transport::smcd`).
fn stamp(own: &Dmb, lgr: &LinkGroup) -> u64 {
    let id = crate::transport::smcd::new_conn_id();
    own.map
        .owner_fetches()
        .store(u32::from(lgr.bells.can_fetch()), Ordering::Relaxed);
    // Release: the peer reads it after the CLC message that names the DMB.
    own.map.epoch_word().store(id, Ordering::Release);
    id
}

/// What a handshake holds while it runs: given back if it does not finish.
#[derive(Debug)]
struct Held {
    lgr: Arc<LinkGroup>,
    first_contact: bool,
    own: Arc<Dmb>,
    own_reused: bool,
    /// The id stamped into our DMB.
    own_id: u64,
    peer: Option<(Arc<Dmb>, bool)>,
}

impl Held {
    fn give_back(self, engine: &Engine, dev: &dyn BufferProvider) {
        self.lgr.put_dmb(dev, self.own, true, false);
        engine.lgrs.release(&self.lgr);
        if self.first_contact {
            // The peer may not have the group: nobody else may join it.
            engine.lgrs.kill(&self.lgr);
        }
    }
}

/// The end of either side's handshake: the connection with its status slot, published with
/// its identity, and the buffer statistics (`SMC_STAT_RMB_SIZE`, `_REUSE`, `_ALLOC`).
fn established(
    engine: &Engine,
    settings: &Settings,
    sock: TcpStream,
    held: Held,
    client: bool,
) -> io::Result<Outcome> {
    let Held {
        lgr,
        own,
        own_reused,
        own_id,
        peer,
        ..
    } = held;
    let (peer, peer_cached) = peer.expect("attached before the end");
    let info = SmcdInfo {
        lgr_id: lgr.id,
        local_gid: lgr.local_gid,
        peer_gid: lgr.peer_gid,
        local_token: own.token,
        peer_token: peer.token,
        rmbe_size: own.map.dmb_len(),
        peer_rmbe_size: peer.map.dmb_len(),
        version: SMC_V2,
        client,
    };
    let status = engine.status();
    status.add(st::T_RX_RMB_SIZE + st::bucket(info.rmbe_size as u64), 1);
    status.add(
        st::T_RX_RMB
            + if own_reused {
                st::RMB_REUSE
            } else {
                st::RMB_ALLOC
            },
        1,
    );
    status.add(
        st::T_TX_RMB_SIZE + st::bucket(info.peer_rmbe_size as u64),
        1,
    );
    status.add(
        st::T_TX_RMB
            + if peer_cached {
                st::RMB_REUSE
            } else {
                st::RMB_ALLOC
            },
        1,
    );
    let cfg = core_config(settings, own.map.ring_len(), peer.map.ring_len());
    let slot = status.conn_slot();
    slot.publish(&ConnIdentity {
        state: smc_core::close::SmcState::Active as u8,
        mode: 2,
        role: u8::from(!client),
        fallback: (0, 0),
        local: sock.local_addr().ok(),
        peer: sock.peer_addr().ok(),
        inode: rustix::fs::fstat(&sock).map_or(0, |s| s.st_ino),
        lgr: info.lgr_id,
        token: info.local_token,
        peer_token: info.peer_token,
        gid: info.local_gid,
        peer_gid: info.peer_gid,
        rmbe: info.rmbe_size as u64,
        peer_rmbe: info.peer_rmbe_size as u64,
        // With DMB no-copy the send buffer is the peer's ring.
        sndbuf: peer.map.ring_len() as u64,
    });
    let link = SmcdLink::new(own, peer, own_id, Arc::clone(&lgr.bells));
    let params = ConnParams {
        spin: settings.spin,
    };
    Ok(Outcome::Smc {
        conn: SmcConn::new(sock, link, cfg, params, info, slot),
        lgr,
    })
}

fn handshake_error(e: HandshakeError) -> io::Error {
    let kind = match e {
        HandshakeError::TimedOut => io::ErrorKind::TimedOut,
        HandshakeError::PeerClosed => io::ErrorKind::ConnectionReset,
        HandshakeError::AttachFailed => io::ErrorKind::ConnectionAborted,
    };
    io::Error::new(kind, e.to_string())
}

/// Bytes queued for the TCP connection, written as it takes them.
#[derive(Debug, Default)]
struct Out {
    buf: Vec<u8>,
    sent: usize,
}

impl Out {
    /// Writes what it can; `Ok(false)` while bytes remain.
    fn flush(&mut self, sock: &TcpStream) -> io::Result<bool> {
        while self.sent < self.buf.len() {
            match rustix::net::send(
                sock,
                &self.buf[self.sent..],
                SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
            ) {
                Ok(n) => self.sent += n,
                Err(rustix::io::Errno::AGAIN) => return Ok(false),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.buf.clear();
        self.sent = 0;
        Ok(true)
    }

    fn pending(&self) -> bool {
        self.sent < self.buf.len()
    }
}

/// Reads at most `want` bytes without waiting: `Ok(None)` if none are there, `Ok(Some(0))`
/// at end of stream.
fn read_some(sock: &TcpStream, buf: &mut [u8], want: usize) -> io::Result<Option<usize>> {
    let n = want.min(buf.len());
    loop {
        match rustix::net::recv(sock, &mut buf[..n], RecvFlags::DONTWAIT) {
            Ok((n, _)) => return Ok(Some(n)),
            Err(rustix::io::Errno::AGAIN) => return Ok(None),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits until `fd` is ready for `ev` or `deadline` passes.
fn wait_for(fd: BorrowedFd<'_>, ev: PollFlags, deadline: Option<Instant>) -> io::Result<()> {
    let timeout = deadline.map(|d| {
        let left = d.saturating_duration_since(Instant::now());
        rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        }
    });
    let mut fds = [PollFd::from_borrowed_fd(fd, ev)];
    match rustix::event::poll(&mut fds, timeout.as_ref()) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// How a handshake ended, before the socket is handed over.
#[derive(Debug)]
enum Done {
    Smc(Box<Held>),
    Tcp(Fallback),
    Failed(io::Error),
}

// -------------------------------------------------------------------------------------------
// Client.

/// The client's handshake on a connected TCP socket whose listener is known to expect SMC.
///
/// **When the server's answer does not come.** The client waits `CLC_WAIT_TIME` for the whole
/// Accept (or Decline) and then fails the connect with `TimedOut`, as the kernel's client does
/// (`ETIMEDOUT`). It does not fall back to TCP there: its Proposal is on the wire, and a server
/// that is slow but alive reads it and answers later, so the two ends would disagree on where
/// the application's stream starts (an Accept read as application bytes, application bytes
/// read as a Confirm). A Decline from the client would not settle it either: the client could
/// not know whether an answer is still coming without waiting for it, which is the timeout
/// again. A fallback is lossless only when both ends agree, so it is the server's to give in
/// time: it declines a Proposal it cannot serve within `SERVE_WITHIN` of the accept, and with
/// handshake limitation refuses clients at admission (`driver::listener`); handshakes that wait
/// for other clients' bytes never hold its workers, so a legitimate client is answered.
#[derive(Debug)]
pub struct ClientRun {
    engine: Arc<Engine>,
    dev: Arc<dyn BufferProvider>,
    sock: Option<TcpStream>,
    hs: ClientHandshake,
    out: Out,
    settings: Settings,
    expected: Option<Gid>,
    held: Option<Held>,
    done: Option<Done>,
    /// Answer an Accept with a Decline (see [`ClientRun::decline_smc`]).
    decline: bool,
}

impl ClientRun {
    /// From now on the handshake ends in TCP: an Accept is answered with a Decline
    /// (`SMC_CLC_DECL_INTERR`), as the kernel's client declines what it cannot take. The
    /// preload library asks for it when the program forks with the connect in flight: an SMC
    /// connection set up in one process after the fork could not be used by the other, a TCP
    /// socket can. Too late once the Confirm is queued; [`ClientRun::smc_decided`] says so.
    pub fn decline_smc(&mut self) {
        self.decline = true;
    }

    /// Whether SMC is decided (the Confirm is queued or sent).
    pub fn smc_decided(&self) -> bool {
        matches!(self.done, Some(Done::Smc(_)))
    }

    /// Starts: the Proposal is queued. `expected` is the listener's GID as smcd reported it.
    pub fn new(
        engine: &Arc<Engine>,
        dev: &Arc<dyn BufferProvider>,
        sock: TcpStream,
        expected: Option<Gid>,
        settings: &Settings,
    ) -> Self {
        let caps = engine.caps(dev.as_ref());
        Self {
            engine: Arc::clone(engine),
            dev: Arc::clone(dev),
            sock: Some(sock),
            hs: ClientHandshake::new(caps, expected, core_now()),
            out: Out::default(),
            settings: settings.clone(),
            expected,
            held: None,
            done: None,
            decline: false,
        }
    }

    /// The socket to wait on.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_ref().expect("until the end").as_fd()
    }

    /// What to wait for before the next [`Self::step`].
    pub fn interest(&self) -> PollFlags {
        if self.out.pending() {
            PollFlags::OUT
        } else {
            PollFlags::IN
        }
    }

    /// When the handshake gives up.
    pub fn deadline(&self) -> Option<Instant> {
        self.hs.poll_timeout().map(std_instant)
    }

    /// Runs to the end, waiting on the socket.
    pub fn run(mut self) -> io::Result<Outcome> {
        loop {
            if let Some(o) = self.step()? {
                return Ok(o);
            }
            let deadline = self.deadline();
            wait_for(self.fd(), self.interest(), deadline)?;
        }
    }

    /// Makes what progress the socket allows without waiting. `Ok(None)`: wait for
    /// [`Self::interest`] on [`Self::fd`] (or the deadline) and call again.
    pub fn step(&mut self) -> io::Result<Option<Outcome>> {
        let mut buf = [0u8; 1024];
        loop {
            let sent = if let Some(b) = self.hs.poll_transmit() {
                self.out.buf.extend_from_slice(&b);
                true
            } else {
                false
            };
            let sock = self.sock.as_ref().expect("until the end");
            if !self.out.flush(sock)? {
                return Ok(None);
            }
            if let Some(done) = self.done.take() {
                return self.finish(done).map(Some);
            }
            // Bytes first, the timer only when none are there: a thread that runs late (a
            // busy machine) must not time out an answer that came in time.
            let want = self.hs.wants();
            if sent && want > 0 {
                // The answer to what just went out cannot be here yet: wait for it rather
                // than read (a read now fails with EAGAIN, one system call per message).
                return Ok(None);
            }
            match read_some(sock, &mut buf, want)? {
                None => {
                    if let Some(ev) = self.hs.handle_timeout(core_now()) {
                        self.on_event(ev);
                        continue;
                    }
                    return Ok(None);
                }
                Some(0) => {
                    let ev = self.hs.on_eof();
                    self.on_event(ev);
                }
                Some(n) => {
                    if let Some(ev) = self.hs.on_bytes(&buf[..n]) {
                        self.on_event(ev);
                    }
                }
            }
        }
    }

    fn on_event(&mut self, ev: ClientEvent) {
        match ev {
            ClientEvent::NeedBuffers(acc) => {
                let r = if self.decline {
                    Err(ReasonCode::INTERR)
                } else {
                    self.prepare(&acc)
                };
                let ev = self.hs.buffers(r);
                self.on_event(ev);
            }
            ClientEvent::Established { .. } => {
                let held = self.held.take().expect("buffers were given");
                self.done = Some(Done::Smc(Box::new(held)));
            }
            ClientEvent::Fallback(f) => {
                if f.out_of_sync {
                    // The server's link group with us is broken: ours must not be reused.
                    let local = self.hs.caps().gid;
                    match self.expected {
                        Some(peer) => self.engine.lgrs.kill_peer(peer, local),
                        None => self.engine.lgrs.kill_all(),
                    }
                }
                self.give_back();
                self.done = Some(Done::Tcp(f.into()));
            }
            ClientEvent::Failed(e) => {
                self.give_back();
                self.done = Some(Done::Failed(handshake_error(e)));
            }
        }
    }

    fn give_back(&mut self) {
        if let Some(h) = self.held.take() {
            h.give_back(&self.engine, self.dev.as_ref());
        }
    }

    /// The client names its link group itself (the kernel's `lgr->id` from its own
    /// counter), remembers the id the server's Accept gave it, and on reuse joins the
    /// counterpart of the group the Accept names (the kernel takes any group to the same
    /// peer; here each group has its own bell channel, so it must be the same one): the
    /// server's first-contact flag must agree with whether it has one (`smc_connect_ism`:
    /// SYNCERR otherwise).
    fn prepare(&mut self, acc: &AcceptInfo) -> Result<LocalBuffer, ReasonCode> {
        let e = &self.engine;
        let local = self.hs.caps().gid;
        let lgr = if acc.first_contact {
            e.lgrs.create(
                e.next_lgr_id(),
                acc.peer_gid,
                local,
                Role::Client,
                acc.lgr_id,
                peer_v2(acc.fce, acc.eid),
                &e.status(),
            )
        } else {
            e.lgrs
                .join_client(acc.peer_gid, local, acc.lgr_id)
                .ok_or(ReasonCode::SYNCERR)?
        };
        e.start_housekeeping();
        let dev = self.dev.as_ref();
        let (own, own_reused) = match e.lgrs.dmb(&lgr, dev, self.settings.dmb_len()) {
            Ok(x) => x,
            Err(err) => {
                tracing::debug!("DMB registration failed: {err}");
                e.lgrs.release(&lgr);
                return Err(ReasonCode::MEM);
            }
        };
        let own_id = stamp(&own, &lgr);
        let mut held = Held {
            lgr: Arc::clone(&lgr),
            first_contact: acc.first_contact,
            own,
            own_reused,
            own_id,
            peer: None,
        };
        let reason = (|| {
            let (peer, cached) = e.lgrs.attach(&lgr, dev, acc.token).map_err(|err| {
                tracing::debug!("attaching the server's DMB failed: {err}");
                ReasonCode::ERR_REGBUF
            })?;
            if peer.map.dmb_len() != acc.dmb_len {
                lgr.detach(acc.token);
                return Err(ReasonCode::CNFERR);
            }
            held.peer = Some((peer, cached));
            Ok(())
        })();
        match reason {
            Ok(()) => {
                let buf = LocalBuffer {
                    token: held.own.token,
                    len: held.own.map.dmb_len(),
                    lgr_id: lgr.id,
                };
                self.held = Some(held);
                Ok(buf)
            }
            Err(r) => {
                held.give_back(e, dev);
                Err(r)
            }
        }
    }

    fn finish(&mut self, done: Done) -> io::Result<Outcome> {
        let sock = self.sock.take().expect("until the end");
        match done {
            Done::Smc(held) => established(&self.engine, &self.settings, sock, *held, true),
            Done::Tcp(fb) => Ok(Outcome::Tcp(sock, fb)),
            Done::Failed(e) => Err(e),
        }
    }
}

// -------------------------------------------------------------------------------------------
// Server.

/// How long after the connection was accepted a server still starts the buffers for a
/// Proposal. Later, it declines instead (both ends go TCP): the client started its own
/// `CLC_WAIT_TIME` no later than the accept, and an answer it cannot get in time would end
/// its connect in an error, which a fallback never does.
pub const SERVE_WITHIN: Duration = Duration::from_secs(CLC_WAIT_TIME.as_secs() / 2);

/// What a server handshake needs next (see [`ServerRun::step`]).
#[derive(Debug)]
pub enum ServerStep {
    /// Wait until the socket has news (new bytes; room to write when [`ServerRun::interest`]
    /// says so) or [`ServerRun::deadline`] passes, then step again.
    Wait,
    /// Bounded work is due (link group and DMB, or attaching the client's DMB): call
    /// [`ServerRun::work`] on a thread that may block for it, then step again.
    Work,
    /// The handshake ended.
    Done(Outcome),
}

/// The server's handshake on an accepted TCP connection whose client was announced with GID
/// `client` (by smcd's intent), or, with `None`, by the SMC TCP option (its GID is then the
/// one its Proposal offers; smcd lets only that GID attach the DMB offered to it).
///
/// It is driven by [`Self::step`], which never waits, and [`Self::work`], which does what may
/// block (requests to smcd, which time out; the first contact of a link group with the same
/// peer). A listener keeps handshakes that wait for bytes in its reactor, where they cost no
/// thread, and runs only the work on threads (`driver::listener`).
#[derive(Debug)]
pub struct ServerRun {
    engine: Arc<Engine>,
    dev: Arc<dyn BufferProvider>,
    sock: Option<TcpStream>,
    client: Option<Gid>,
    /// Until the first bytes show a CLC message, there is no machine yet.
    hs: Option<ServerHandshake>,
    /// When the connection was accepted: the Proposal's deadline runs from here.
    started: Instant,
    out: Out,
    settings: Settings,
    held: Option<Held>,
    /// A request of the machine that waits for [`Self::work`].
    work: Option<ServerEvent>,
    done: Option<Done>,
    eid: Option<smc_proto::clc::Eid>,
}

impl ServerRun {
    /// Starts on a connection accepted at `accepted`.
    pub fn new(
        engine: &Arc<Engine>,
        dev: &Arc<dyn BufferProvider>,
        sock: TcpStream,
        client: Option<Gid>,
        settings: &Settings,
        accepted: Instant,
    ) -> Self {
        Self {
            engine: Arc::clone(engine),
            dev: Arc::clone(dev),
            sock: Some(sock),
            client,
            hs: None,
            started: accepted,
            out: Out::default(),
            settings: settings.clone(),
            held: None,
            work: None,
            done: None,
            eid: None,
        }
    }

    /// The socket to wait on; `None` once the handshake has ended (the socket went with the
    /// outcome, or closed with a failure).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.sock.as_ref().map(AsFd::as_fd)
    }

    /// What to wait for before the next [`Self::step`].
    pub fn interest(&self) -> PollFlags {
        if self.out.pending() {
            PollFlags::OUT
        } else {
            PollFlags::IN
        }
    }

    /// When the handshake gives up: `CLC_WAIT_TIME` after the accept for the whole Proposal
    /// (the first bytes included), `CLC_WAIT_TIME` after the Accept for the whole Confirm.
    /// Bytes that trickle in move neither.
    pub fn deadline(&self) -> Option<Instant> {
        match &self.hs {
            Some(hs) => hs.poll_timeout().map(std_instant),
            None => Some(self.started + CLC_WAIT_TIME),
        }
    }

    /// When the connection was accepted.
    pub fn accepted(&self) -> Instant {
        self.started
    }

    /// Makes what progress the socket allows without waiting or blocking.
    ///
    /// Until four bytes have come, the stream is only peeked (a connection that does not
    /// start with CLC stays plain TCP with every byte intact): with one to three bytes there,
    /// the socket stays readable, so a driver waits for the *next* bytes (edge-triggered) or
    /// the deadline, not for readability.
    pub fn step(&mut self) -> io::Result<ServerStep> {
        if self.work.is_some() {
            return Ok(ServerStep::Work);
        }
        let mut buf = [0u8; 1024];
        if self.hs.is_none() {
            // Whether the stream starts with CLC, without consuming it: a connection taken
            // for an announced SMC client but not carrying CLC (which only a stale
            // announcement could cause) stays plain TCP with every byte intact. The deadline
            // counts only when the bytes are not there (a late thread, not a late client).
            let late = Instant::now() >= self.started + CLC_WAIT_TIME;
            let sock = self.sock.as_ref().expect("until the end");
            let mut peek = [0u8; 4];
            let n = match rustix::net::recv(sock, &mut peek, RecvFlags::PEEK | RecvFlags::DONTWAIT)
            {
                Ok((n, _)) => n,
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) if late => {
                    return Err(handshake_error(HandshakeError::TimedOut));
                }
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {
                    return Ok(ServerStep::Wait);
                }
                Err(e) => return Err(e.into()),
            };
            match starts_with_clc(&peek[..n]) {
                Some(true) => {
                    let caps = self.engine.caps(self.dev.as_ref());
                    // The machine's deadline for the Proposal runs from the accept, not from
                    // the first four bytes.
                    let at = core_instant(self.started);
                    self.hs = Some(match self.client {
                        Some(gid) => ServerHandshake::new(caps, gid, at),
                        None => ServerHandshake::unannounced(caps, at),
                    });
                }
                None if n > 0 && late => return Err(handshake_error(HandshakeError::TimedOut)),
                None if n > 0 => return Ok(ServerStep::Wait),
                _ => {
                    let sock = self.sock.take().expect("until the end");
                    return Ok(ServerStep::Done(Outcome::Tcp(
                        sock,
                        Fallback::local(ReasonCode::PEERNOSMC),
                    )));
                }
            }
        }
        loop {
            let hs = self.hs.as_mut().expect("made above");
            let sent = if let Some(b) = hs.poll_transmit() {
                self.out.buf.extend_from_slice(&b);
                true
            } else {
                false
            };
            let sock = self.sock.as_ref().expect("until the end");
            if !self.out.flush(sock)? {
                return Ok(ServerStep::Wait);
            }
            if let Some(done) = self.done.take() {
                return self.finish(done).map(ServerStep::Done);
            }
            if self.work.is_some() {
                return Ok(ServerStep::Work);
            }
            // Bytes first, the timer only when none are there (see the client's step).
            let want = hs.wants();
            if sent && want > 0 {
                // As in the client's step: the answer cannot be here yet.
                return Ok(ServerStep::Wait);
            }
            match read_some(sock, &mut buf, want)? {
                None => match hs.handle_timeout(core_now()) {
                    Some(ev) => self.on_event(ev),
                    None => return Ok(ServerStep::Wait),
                },
                Some(0) => {
                    let ev = hs.on_eof();
                    self.on_event(ev);
                }
                Some(n) => {
                    if let Some(ev) = hs.on_bytes(&buf[..n]) {
                        self.on_event(ev);
                    }
                }
            }
        }
    }

    /// Does the work [`ServerStep::Work`] asked for; it may block (a request to smcd, which
    /// times out; a first contact of the same peer, which ends by its own deadline). A
    /// Proposal that waited for it past [`SERVE_WITHIN`] is declined instead: the client goes
    /// TCP in time rather than time out. `waiting(true)` is called before the thread blocks for
    /// another connection's first contact, `waiting(false)` once it stops: that wait ends only
    /// when other work is done, which must find a thread meanwhile.
    pub fn work(&mut self, waiting: &dyn Fn(bool)) {
        match self.work.take() {
            Some(ServerEvent::NeedBuffers(info)) => {
                let r = if Instant::now() >= self.started + SERVE_WITHIN {
                    // The kernel has no code for a server that cannot start in time.
                    Err(ReasonCode::INTERR)
                } else {
                    self.prepare(&info, waiting)
                };
                let hs = self.hs.as_mut().expect("running");
                if let Some(ev) = hs.buffers(r, core_now()) {
                    self.on_event(ev);
                }
            }
            Some(ServerEvent::NeedAttach(ci)) => {
                let ok = self.attach(&ci);
                let ev = self.hs.as_mut().expect("running").attached(ok);
                self.on_event(ev);
            }
            Some(other) => self.on_event(other),
            None => {}
        }
    }

    /// Does the work [`ServerStep::Work`] asked for if nothing in it can wait: a slot in a
    /// ready link group and a DMB from its pool, or the client's DMB attached already (it
    /// reuses one). Returns `false`, with the work still due, where [`Self::work`] is needed
    /// (a first contact, a DMB or attachment to ask smcd for, a group still being set up):
    /// a thread that must not block (an event loop's `accept`, the listener's reactor) runs
    /// this, and hands the rest to a worker.
    pub fn work_now(&mut self) -> bool {
        match self.work.take() {
            Some(ServerEvent::NeedBuffers(info)) => {
                let r = if Instant::now() >= self.started + SERVE_WITHIN {
                    Err(ReasonCode::INTERR)
                } else {
                    match self.prepare_now(&info) {
                        Some(b) => Ok(b),
                        None => {
                            self.work = Some(ServerEvent::NeedBuffers(info));
                            return false;
                        }
                    }
                };
                let hs = self.hs.as_mut().expect("running");
                if let Some(ev) = hs.buffers(r, core_now()) {
                    self.on_event(ev);
                }
                true
            }
            Some(ServerEvent::NeedAttach(ci)) => {
                let ok = match self.held.as_mut() {
                    None => false,
                    Some(held) => match self.engine.lgrs.attached(&held.lgr, ci.token) {
                        None => {
                            self.work = Some(ServerEvent::NeedAttach(ci));
                            return false;
                        }
                        Some(peer) if peer.map.dmb_len() != ci.dmb_len => {
                            held.lgr.detach(ci.token);
                            false
                        }
                        Some(peer) => {
                            held.peer = Some((peer, true));
                            true
                        }
                    },
                };
                let ev = self.hs.as_mut().expect("running").attached(ok);
                self.on_event(ev);
                true
            }
            Some(other) => {
                self.on_event(other);
                true
            }
            None => true,
        }
    }

    fn on_event(&mut self, ev: ServerEvent) {
        match ev {
            ServerEvent::NeedBuffers(_) | ServerEvent::NeedAttach(_) => {
                self.work = Some(ev);
            }
            ServerEvent::Established { confirm, .. } => {
                let held = self.held.take().expect("buffers were given");
                if held.first_contact {
                    let eid = self.eid.unwrap_or_default();
                    self.engine.lgrs.ready(&held.lgr, peer_v2(confirm.fce, eid));
                }
                self.done = Some(Done::Smc(Box::new(held)));
            }
            ServerEvent::Fallback(f) => {
                self.give_back();
                self.done = Some(Done::Tcp(f.into()));
            }
            ServerEvent::Failed(e) => {
                self.give_back();
                if e == HandshakeError::AttachFailed
                    && let Some(sock) = &self.sock
                {
                    let _ = rustix::net::sockopt::set_socket_linger(sock, Some(Duration::ZERO));
                }
                self.done = Some(Done::Failed(handshake_error(e)));
            }
        }
    }

    fn give_back(&mut self) {
        if let Some(h) = self.held.take() {
            h.give_back(&self.engine, self.dev.as_ref());
        }
    }

    fn prepare(
        &mut self,
        info: &ProposalInfo,
        waiting: &dyn Fn(bool),
    ) -> Result<(LocalBuffer, bool), ReasonCode> {
        let e = &self.engine;
        let local = self.dev.gid();
        self.eid = Some(info.eid);
        let max_conns = self.settings.max_conns_per_lgr.clamp(16, 255);
        let joined = e.lgrs.join_server(info.peer_gid, local, max_conns, waiting);
        // The join may have waited for another connection's first contact with the same peer:
        // if that took too long, this one goes TCP rather than leave its client to time out.
        if Instant::now() >= self.started + SERVE_WITHIN {
            if let Some(g) = joined {
                e.lgrs.release(&g);
            }
            return Err(ReasonCode::INTERR);
        }
        let (lgr, first_contact) = match joined {
            Some(g) => (g, false),
            None => {
                let id = e.next_lgr_id();
                let g = e.lgrs.create(
                    id,
                    info.peer_gid,
                    local,
                    Role::Server,
                    0,
                    peer_v2(None, info.eid),
                    &e.status(),
                );
                (g, true)
            }
        };
        e.start_housekeeping();
        let dev = self.dev.as_ref();
        let fail = |lgr: &Arc<LinkGroup>| {
            e.lgrs.release(lgr);
            if first_contact {
                e.lgrs.kill(lgr);
            }
        };
        let (own, own_reused) = match e.lgrs.dmb(&lgr, dev, self.settings.dmb_len()) {
            Ok(x) => x,
            Err(err) => {
                tracing::debug!("DMB registration failed: {err}");
                fail(&lgr);
                return Err(ReasonCode::MEM);
            }
        };
        Ok((
            self.hold(lgr, first_contact, own, own_reused),
            first_contact,
        ))
    }

    /// Holds `own` in `lgr` for this handshake (stamped with a fresh connection id) and
    /// returns what the Accept offers of it.
    fn hold(
        &mut self,
        lgr: Arc<LinkGroup>,
        first_contact: bool,
        own: Arc<Dmb>,
        own_reused: bool,
    ) -> LocalBuffer {
        let own_id = stamp(&own, &lgr);
        let buf = LocalBuffer {
            token: own.token,
            len: own.map.dmb_len(),
            lgr_id: lgr.id,
        };
        self.held = Some(Held {
            lgr,
            first_contact,
            own,
            own_reused,
            own_id,
            peer: None,
        });
        buf
    }

    /// [`Self::prepare`] where nothing waits: a ready group with room and a pooled DMB, or
    /// `None` (nothing taken).
    fn prepare_now(&mut self, info: &ProposalInfo) -> Option<(LocalBuffer, bool)> {
        let e = &self.engine;
        let max_conns = self.settings.max_conns_per_lgr.clamp(16, 255);
        let lgr = e
            .lgrs
            .join_server_now(info.peer_gid, self.dev.gid(), max_conns)?;
        let Some(own) = e
            .lgrs
            .pooled(&lgr, self.dev.as_ref(), self.settings.dmb_len())
        else {
            e.lgrs.release(&lgr);
            return None;
        };
        self.eid = Some(info.eid);
        Some((self.hold(lgr, false, own, true), false))
    }

    fn attach(&mut self, ci: &ConfirmInfo) -> bool {
        let Some(held) = self.held.as_mut() else {
            return false;
        };
        let dev = self.dev.as_ref();
        let (peer, cached) = match self.engine.lgrs.attach(&held.lgr, dev, ci.token) {
            Ok(x) => x,
            Err(err) => {
                tracing::debug!("attaching the client's DMB failed: {err}");
                return false;
            }
        };
        if peer.map.dmb_len() != ci.dmb_len {
            held.lgr.detach(ci.token);
            return false;
        }
        held.peer = Some((peer, cached));
        true
    }

    fn finish(&mut self, done: Done) -> io::Result<Outcome> {
        let sock = self.sock.take().expect("until the end");
        match done {
            Done::Smc(held) => established(&self.engine, &self.settings, sock, *held, false),
            Done::Tcp(fb) => Ok(Outcome::Tcp(sock, fb)),
            Done::Failed(e) => Err(e),
        }
    }
}

/// A server handshake without a device (smcd went away between the announcement and the
/// accept): the Decline goes out at once, the client's Proposal is read away so no byte of it
/// reaches the application, and the connection continues as TCP (NOSMCDEV). Driven like
/// [`ServerRun`], without work.
#[derive(Debug)]
pub struct DeclineRun {
    sock: Option<TcpStream>,
    out: Out,
    reader: smc_core::handshake::ClcReader,
    started: Instant,
}

impl DeclineRun {
    /// Starts on a connection accepted at `accepted`.
    pub fn new(sock: TcpStream, accepted: Instant) -> Self {
        use smc_proto::clc::{ClcMessage, Decline};
        let d = ClcMessage::Decline(Decline::new(ReasonCode::NOSMCDEV, SMC_V2)).to_vec();
        Self {
            sock: Some(sock),
            out: Out { buf: d, sent: 0 },
            reader: smc_core::handshake::ClcReader::new(),
            started: accepted,
        }
    }

    /// The socket to wait on; `None` once the handshake has ended (the socket went with the
    /// outcome, or closed with a failure).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.sock.as_ref().map(AsFd::as_fd)
    }

    /// `CLC_WAIT_TIME` after the accept for the whole Proposal.
    pub fn deadline(&self) -> Instant {
        self.started + CLC_WAIT_TIME
    }

    /// Makes what progress the socket allows without waiting (never [`ServerStep::Work`]).
    pub fn step(&mut self) -> io::Result<ServerStep> {
        let late = Instant::now() >= self.deadline();
        let sock = self.sock.as_ref().expect("until the end");
        if !self.out.flush(sock)? {
            return if late {
                Err(handshake_error(HandshakeError::TimedOut))
            } else {
                Ok(ServerStep::Wait)
            };
        }
        let mut buf = [0u8; 1024];
        loop {
            match read_some(sock, &mut buf, self.reader.wants())? {
                // Bytes first, the deadline only when none are there.
                None if late => return Err(handshake_error(HandshakeError::TimedOut)),
                None => return Ok(ServerStep::Wait),
                Some(0) => break,
                Some(n) => {
                    if self.reader.push(&buf[..n]).is_some() {
                        break;
                    }
                }
            }
        }
        let sock = self.sock.take().expect("until the end");
        Ok(ServerStep::Done(Outcome::Tcp(
            sock,
            Fallback::local(ReasonCode::NOSMCDEV),
        )))
    }
}
