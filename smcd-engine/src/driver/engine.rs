//! The engine: one per process by default (the role the kernel's SMC module plays for one
//! host), holding the device handle, the link groups, the status area `smcd` reads, and the
//! settings new connections get (the namespace's knobs as `smcd` publishes them). Tests may
//! create several engines in one process; each has its own GID, so they talk SMC-D to each
//! other as two processes would.

use super::lgr::LgrTable;
use crate::core::handshake::LocalCaps;
use crate::device::SmcdDevice;
use crate::device::loopback::LoopbackDevice;
use crate::layout::status::StatusArea;
use crate::settings::Settings;
use smc_proto::clc::{Eid, Hostname};
use std::collections::HashMap;
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
            socket: super::channel::socket_path(),
            settings: None,
            ueids: None,
        }
    }
}

#[derive(Debug)]
struct DeviceSlot {
    dev: Option<Arc<LoopbackDevice>>,
    last_try: Option<Instant>,
}

/// One engine instance.
#[derive(Debug)]
pub struct Engine {
    socket: PathBuf,
    device: Mutex<DeviceSlot>,
    overrides: Option<Settings>,
    ueids: Option<Vec<Eid>>,
    /// This engine's link groups.
    pub lgrs: LgrTable,
    housekeeping: OnceLock<()>,
    private_status: OnceLock<Arc<StatusArea>>,
    sources: Mutex<HashMap<IpAddr, (IpAddr, Instant)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Engine {
    /// A new engine; it reaches `smcd` on first use.
    pub fn new(cfg: EngineConfig) -> Arc<Self> {
        Arc::new(Self {
            socket: cfg.socket,
            device: Mutex::new(DeviceSlot {
                dev: None,
                last_try: None,
            }),
            overrides: cfg.settings,
            ueids: cfg
                .ueids
                .map(|v| v.iter().filter_map(|s| Eid::new(s)).collect()),
            lgrs: LgrTable::new(1),
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

    /// The settings a new connection gets: fixed ones if configured, else the namespace's
    /// knobs as `smcd` publishes them (defaults without `smcd`).
    pub fn settings(&self) -> Settings {
        if let Some(s) = &self.overrides {
            return s.clone();
        }
        let dev = lock(&self.device).dev.clone();
        dev.and_then(|d| d.sysctl.as_ref().and_then(|p| p.load()))
            .map_or_else(Settings::default, |(v, _)| Settings::from_values(&v))
    }

    /// The device, connecting to `smcd` if needed (at most once per second while it is
    /// missing). `None` means: no SMC-D device, fall back with NOSMCDEV.
    pub fn device(&self) -> Option<Arc<LoopbackDevice>> {
        let mut slot = lock(&self.device);
        if let Some(d) = &slot.dev {
            return Some(Arc::clone(d));
        }
        if slot
            .last_try
            .is_some_and(|t| t.elapsed() < RECONNECT_INTERVAL)
        {
            return None;
        }
        slot.last_try = Some(Instant::now());
        match LoopbackDevice::open(&self.socket) {
            Ok(d) => {
                let d = Arc::new(d);
                // Link groups made under an earlier registration carry another GID.
                self.lgrs.kill_all();
                slot.dev = Some(Arc::clone(&d));
                Some(d)
            }
            Err(e) => {
                tracing::debug!("smcd at {} unreachable: {e}", self.socket.display());
                None
            }
        }
    }

    /// Forgets the device after `smcd` went away; the next connection tries again.
    pub fn device_failed(&self, dev: &Arc<LoopbackDevice>) {
        let mut slot = lock(&self.device);
        if slot.dev.as_ref().is_some_and(|d| Arc::ptr_eq(d, dev)) {
            slot.dev = None;
            slot.last_try = None;
        }
    }

    /// The status area connections and listeners report into: the device's (read by smcd),
    /// or a private one without smcd.
    pub fn status(&self) -> Arc<StatusArea> {
        if let Some(d) = &lock(&self.device).dev {
            return Arc::clone(&d.status);
        }
        Arc::clone(
            self.private_status
                .get_or_init(|| StatusArea::private().expect("anonymous memory for counters")),
        )
    }

    /// What this engine brings to a handshake on `dev`.
    pub fn caps(&self, dev: &LoopbackDevice) -> LocalCaps {
        let info = dev.info();
        let published = dev.sysctl.as_ref().and_then(|p| p.load()).map(|(_, e)| e);
        let seid_enabled = published.as_ref().is_none_or(|e| e.seid_enabled);
        let seid =
            Eid::new(&info.seid).filter(|e| seid_enabled && !e.is_zero() && !info.seid.is_empty());
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
            hostname: Hostname::new(&info.hostname),
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

    /// Starts the thread that frees idle link groups (once).
    pub fn start_housekeeping(self: &Arc<Self>) {
        self.housekeeping.get_or_init(|| {
            let weak: Weak<Engine> = Arc::downgrade(self);
            let _ = std::thread::Builder::new()
                .name("smc-lgr-sweep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(Duration::from_secs(1));
                        let Some(e) = weak.upgrade() else { return };
                        let idle = e.settings().lgr_idle;
                        let dev = lock(&e.device).dev.clone();
                        if let Some(dev) = dev {
                            e.lgrs.sweep(dev.as_ref() as &dyn SmcdDevice, idle);
                        }
                    }
                });
        });
    }
}
