//! The engine: one per process by default (the role the kernel's SMC module plays for one
//! host), holding its registration with `smcd`, the devices smcd provides, the link groups,
//! the status area smcd reads, and the settings new connections get (the namespace's knobs as
//! `smcd` publishes them). Tests may create several engines in one process; each has its own
//! GID, so they talk SMC-D to each other as two processes would.

use super::lgr::LgrTable;
use crate::device::BufferProvider;
use crate::ipc::SmcdSession;
use crate::layout::status::StatusArea;
use crate::settings::Settings;
use smc_core::handshake::LocalCaps;
use smc_proto::clc::{Eid, Hostname};
use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How often an engine without `smcd` tries to reach it again.
const RECONNECT_INTERVAL: Duration = Duration::from_secs(1);
/// How long a looked-up source address is reused.
const SOURCE_TTL: Duration = Duration::from_secs(10);

/// How an engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// `smcd`'s socket.
    pub socket: PathBuf,
    /// Fixed settings; `None` (the default) takes the namespace's knobs from `smcd`.
    pub settings: Option<Settings>,
    /// Fixed user EIDs; `None` takes smcd's EID table.
    pub ueids: Option<Vec<String>>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            socket: crate::ipc::socket_path(),
            settings: None,
            ueids: None,
        }
    }
}

/// The engine's registration with smcd and the ISM device it provides.
#[derive(Debug, Clone)]
pub struct Attached {
    /// The registration.
    pub session: Arc<SmcdSession>,
    /// The SMC-D device.
    pub ism: Arc<dyn BufferProvider>,
}

#[derive(Debug)]
struct Slot {
    attached: Option<Attached>,
    last_try: Option<Instant>,
    /// A thread is registering with smcd (the lock is not held meanwhile).
    opening: bool,
    /// A registration existed or was tried: callers no longer wait for one in progress.
    tried: bool,
}

/// One engine instance.
#[derive(Debug)]
pub struct Engine {
    socket: PathBuf,
    slot: Mutex<Slot>,
    /// Signalled when a registration attempt ends.
    opened: std::sync::Condvar,
    overrides: Option<Settings>,
    ueids: Option<Vec<Eid>>,
    /// This engine's link groups.
    pub lgrs: LgrTable,
    housekeeping: OnceLock<()>,
    private_status: OnceLock<Arc<StatusArea>>,
    sources: Mutex<HashMap<IpAddr, (IpAddr, Instant)>>,
}

fn std_until(t: smc_core::Instant) -> Duration {
    crate::sys::std_instant(t).saturating_duration_since(Instant::now())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Engine {
    /// A new engine; it reaches `smcd` on first use.
    pub fn new(cfg: EngineConfig) -> Arc<Self> {
        Arc::new(Self {
            socket: cfg.socket,
            slot: Mutex::new(Slot {
                attached: None,
                last_try: None,
                opening: false,
                tried: false,
            }),
            opened: std::sync::Condvar::new(),
            overrides: cfg.settings,
            ueids: cfg
                .ueids
                .map(|v| v.iter().filter_map(|s| Eid::new(s)).collect()),
            lgrs: LgrTable::new(),
            housekeeping: OnceLock::new(),
            private_status: OnceLock::new(),
            sources: Mutex::new(HashMap::new()),
        })
    }

    /// The process-wide engine (socket from `$SMCD_SOCKET`).
    pub fn global() -> &'static Arc<Engine> {
        static GLOBAL: OnceLock<Arc<Engine>> = OnceLock::new();
        GLOBAL.get_or_init(|| Engine::new(EngineConfig::default()))
    }

    /// The registration with smcd, connecting if needed (at most once per second while it is
    /// missing). `None` means: no SMC-D device, fall back with NOSMCDEV.
    ///
    /// Registering is a round trip to smcd (bounded by the channel's request timeout) made
    /// without the engine's lock. While one is in progress, the first connections of the
    /// process wait for it (so a burst at start-up is all SMC); after that, when smcd went
    /// away or never answered, connections do not wait: they fall back at once.
    pub fn attached(&self) -> Option<Attached> {
        let mut slot = lock(&self.slot);
        loop {
            if let Some(a) = &slot.attached {
                return Some(a.clone());
            }
            if !slot.opening {
                break;
            }
            if slot.tried {
                return None;
            }
            slot = self.opened.wait(slot).unwrap_or_else(|e| e.into_inner());
        }
        if slot
            .last_try
            .is_some_and(|t| t.elapsed() < RECONNECT_INTERVAL)
        {
            return None;
        }
        slot.last_try = Some(Instant::now());
        slot.opening = true;
        drop(slot);
        // Whatever happens below (a panic included), the attempt ends and waiters go on.
        struct Ending<'a>(&'a Engine);
        impl Drop for Ending<'_> {
            fn drop(&mut self) {
                let mut slot = lock(&self.0.slot);
                slot.opening = false;
                slot.tried = true;
                self.0.opened.notify_all();
            }
        }
        let ending = Ending(self);
        let got = SmcdSession::open(&self.socket).and_then(|s| {
            let session = Arc::new(s);
            let ism = crate::device::loopback::smcd_devices(&session)
                .into_iter()
                .next()
                .ok_or_else(|| io::Error::other("smcd offers no loopback device"))?;
            Ok(Attached { session, ism })
        });
        let mut slot = lock(&self.slot);
        let r = match got {
            Ok(a) => {
                // Link groups made under an earlier registration carry another GID.
                self.lgrs.kill_all();
                slot.attached = Some(a.clone());
                Some(a)
            }
            Err(e) => {
                tracing::debug!("smcd at {} unreachable: {e}", self.socket.display());
                None
            }
        };
        drop(slot);
        drop(ending);
        r
    }

    /// The registration, only if there is one already (no attempt to connect).
    pub fn attached_now(&self) -> Option<Attached> {
        lock(&self.slot).attached.clone()
    }

    /// Forgets the registration after `smcd` went away; the next connection tries again.
    pub fn smcd_failed(&self, session: &Arc<SmcdSession>) {
        let mut slot = lock(&self.slot);
        if slot
            .attached
            .as_ref()
            .is_some_and(|a| Arc::ptr_eq(&a.session, session))
        {
            slot.attached = None;
            slot.last_try = None;
        }
    }

    /// The settings a new connection gets: fixed ones if configured, else the namespace's
    /// knobs as `smcd` publishes them (defaults without `smcd`).
    pub fn settings(&self) -> Settings {
        if let Some(s) = &self.overrides {
            return s.clone();
        }
        self.attached_now()
            .and_then(|a| a.session.sysctl.as_ref().and_then(|p| p.load()))
            .map_or_else(Settings::default, |(v, _)| Settings::from_values(&v))
    }

    /// The status area connections and listeners report into: the session's (read by smcd),
    /// or a private one without smcd.
    pub fn status(&self) -> Arc<StatusArea> {
        if let Some(a) = &lock(&self.slot).attached {
            return Arc::clone(&a.session.status);
        }
        Arc::clone(
            self.private_status
                .get_or_init(|| StatusArea::private().expect("anonymous memory for counters")),
        )
    }

    /// An id for a new link group (see [`LgrTable::next_id`]).
    pub fn next_lgr_id(&self) -> u32 {
        self.lgrs.next_id(self.engine_id(), || {
            self.attached_now()?.session.lgr_ids().ok()
        })
    }

    /// smcd's id for this engine (its first block of link-group ids), 0 without smcd.
    pub fn engine_id(&self) -> u32 {
        self.attached_now()
            .map_or(0, |a| a.session.info().engine_id)
    }

    /// What this engine brings to a handshake on `dev`.
    pub fn caps(&self, dev: &dyn BufferProvider) -> LocalCaps {
        let attached = self.attached_now();
        let info = attached.as_ref().map(|a| a.session.info().clone());
        let published = attached
            .as_ref()
            .and_then(|a| a.session.sysctl.as_ref().and_then(|p| p.load()))
            .map(|(_, e)| e);
        let seid_enabled = published.as_ref().is_none_or(|e| e.seid_enabled);
        let seid_text = info.as_ref().map_or("", |i| i.seid.as_str());
        let seid =
            Eid::new(seid_text).filter(|e| seid_enabled && !e.is_zero() && !seid_text.is_empty());
        let ueids = match &self.ueids {
            Some(u) => u.clone(),
            None => published
                .map(|e| e.ueids.iter().map(|b| Eid(*b)).collect())
                .unwrap_or_default(),
        };
        LocalCaps {
            gid: dev.gid(),
            chid: dev.chid(),
            seid,
            ueids,
            hostname: Hostname::new(info.as_ref().map_or("", |i| i.hostname.as_str())),
        }
    }

    /// The source address the kernel would pick for `dst`, remembered for a few seconds so
    /// a connect does not pay a route lookup each time.
    pub fn source_for(
        &self,
        dst: IpAddr,
        lookup: impl FnOnce() -> std::io::Result<IpAddr>,
    ) -> std::io::Result<IpAddr> {
        if let Some((src, at)) = lock(&self.sources).get(&dst)
            && at.elapsed() < SOURCE_TTL
        {
            return Ok(*src);
        }
        let src = lookup()?;
        let mut m = lock(&self.sources);
        if m.len() > 1024 {
            m.clear();
        }
        m.insert(dst, (src, Instant::now()));
        Ok(src)
    }

    /// Starts the thread that frees link groups (once). It sleeps until the next group can
    /// expire (at most a minute, so a changed `lgr_idle_time` takes effect), until a group
    /// becomes dead and empty, or until `smcd` says on the engine's events channel that a
    /// peer engine has ended (`PeerGone`, the ISM device's `ISM_EVENT_GID`): that peer's
    /// groups are freed at once instead of pinning their buffers for `lgr_idle_time`. Nothing
    /// wakes it in fixed small steps; it ends with the engine.
    pub fn start_housekeeping(self: &Arc<Self>) {
        self.housekeeping.get_or_init(|| {
            use rustix::pipe::{PipeFlags, pipe_with};
            let Ok((rx, tx)) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK) else {
                return;
            };
            let (rx, tx) = (crate::sys::banded(rx), crate::sys::banded(tx));
            self.lgrs.set_kick(tx);
            let weak: Weak<Engine> = Arc::downgrade(self);
            let _ = std::thread::Builder::new()
                .name("smc-lgr-sweep".into())
                .spawn(move || housekeeping(&weak, &rx));
        });
    }
}

/// How often the housekeeping thread drains the link groups' bell channels, at most.
const BELL_DRAIN_EVERY: Duration = Duration::from_millis(20);

/// The housekeeping thread (see [`Engine::start_housekeeping`]). `kick` is the read end of
/// the table's doorbell; its hang-up means the engine is gone. It also drains the link
/// groups' bell channels as records arrive (`transport::smcd::Bells`).
fn housekeeping(weak: &Weak<Engine>, kick: &rustix::fd::OwnedFd) {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut events: Option<(Arc<SmcdSession>, crate::ipc::channel::Channel)> = None;
    let mut subscribed_at: Option<Instant> = None;
    let mut bell_ep: Option<rustix::fd::OwnedFd> = None;
    let mut drained_at: Option<Instant> = None;
    loop {
        // Work in fork-safe sections (`crate::fork`), the wait in `poll` outside them.
        let busy = crate::fork::busy();
        let nap = {
            let Some(e) = weak.upgrade() else { return };
            let idle = e.settings().lgr_idle;
            if let Some(a) = e.attached_now() {
                let current = events
                    .as_ref()
                    .is_some_and(|(s, _)| Arc::ptr_eq(s, &a.session));
                if !current && subscribed_at.is_none_or(|t| t.elapsed() >= RECONNECT_INTERVAL) {
                    subscribed_at = Some(Instant::now());
                    events = match a.session.events() {
                        Ok((ch, gone)) => {
                            for g in gone {
                                e.lgrs.peer_gone(a.ism.as_ref(), g, idle);
                            }
                            Some((Arc::clone(&a.session), ch))
                        }
                        Err(err) => {
                            tracing::debug!("no device events from smcd: {err}");
                            None
                        }
                    };
                }
                e.lgrs.sweep(a.ism.as_ref(), idle);
            }
            e.lgrs
                .next_expiry(idle)
                .map_or(Duration::from_secs(60), |t| {
                    std_until(t).clamp(Duration::from_millis(10), Duration::from_secs(60))
                })
        };
        // The bell channels at most every BELL_DRAIN_EVERY: a connection that rings a bell
        // takes it from the channel itself, so this drain only keeps bells nobody asked for
        // from filling the sender's queue. Drained as each record arrived, it cost a wake-up
        // of this thread per connection an event loop served.
        let drain_in = drained_at.map_or(Duration::ZERO, |t| {
            BELL_DRAIN_EVERY.saturating_sub(t.elapsed())
        });
        let nap = if drain_in.is_zero() {
            nap
        } else {
            nap.min(drain_in)
        };
        let ts = rustix::time::Timespec {
            tv_sec: nap.as_secs() as i64,
            tv_nsec: i64::from(nap.subsec_nanos()),
        };
        if bell_ep.is_none()
            && let Some(e) = weak.upgrade()
        {
            // A copy of the epoll set of bell channels: polled without holding the engine.
            bell_ep = e
                .lgrs
                .bell_ep()
                .and_then(|ep| crate::sys::dup_banded(ep).ok());
        }
        let mut fds = vec![PollFd::new(kick, PollFlags::IN)];
        if let Some(ep) = bell_ep.as_ref().filter(|_| drain_in.is_zero()) {
            fds.push(PollFd::new(ep, PollFlags::IN));
        }
        let at_events = fds.len();
        if let Some((_, ch)) = &events {
            fds.push(PollFd::new(ch, PollFlags::IN));
        }
        drop(busy);
        match poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => std::thread::sleep(nap),
        }
        let _busy = crate::fork::busy();
        let rev = |i: usize| fds.get(i).map_or(PollFlags::empty(), |f| f.revents());
        let (kicked, rung, heard) = (
            rev(0),
            if at_events == 2 {
                rev(1)
            } else {
                PollFlags::empty()
            },
            rev(at_events),
        );
        drop(fds);
        // A descriptor of ours closed under us (a program closed it): the kick pipe ends the
        // thread (nothing could wake it any more), the bell set is dropped (made again when
        // it can be); neither may turn this loop into a spin.
        if kicked.contains(PollFlags::NVAL) {
            return;
        }
        if rung.contains(PollFlags::NVAL) {
            bell_ep = None;
        }
        if !rung.is_empty()
            && let Some(e) = weak.upgrade()
        {
            e.lgrs.drain_bells();
            drained_at = Some(Instant::now());
        }
        if !kicked.is_empty() {
            let mut b = [0u8; 64];
            if let Ok(0) = rustix::io::read(kick, &mut b) {
                return;
            }
        }
        if !heard.is_empty() {
            let mut gone = Vec::new();
            if let Some((_, ch)) = &mut events {
                loop {
                    match ch.try_receive() {
                        Ok(Some((Ok(m), _, _))) => {
                            if m.cmd == smc_proto::netlink::loopback::LoopbackCmd::PeerGone
                                && let Some(g) = m.gid()
                            {
                                gone.push(g);
                            }
                        }
                        Ok(Some((Err(_), _, _))) => {}
                        Ok(None) => break,
                        Err(_) => {
                            // smcd went away: subscribe again once it is back.
                            events = None;
                            break;
                        }
                    }
                }
            }
            let Some(e) = weak.upgrade() else { return };
            if let Some(a) = e.attached_now() {
                let idle = e.settings().lgr_idle;
                for g in gone {
                    let n = e.lgrs.peer_gone(a.ism.as_ref(), g, idle);
                    tracing::debug!("peer engine {g:#x} ended: {n} link groups freed or dying");
                }
            }
        }
    }
}
