//! The engine: one per process by default (the role the kernel's SMC module plays for one
//! host), holding the device handle, the link groups and the settings. Tests may create
//! several in one process; each has its own GID, so they talk SMC-D to each other as two
//! processes would.

use super::lgr::LgrTable;
use crate::core::handshake::LocalCaps;
use crate::device::SmcdDevice;
use crate::device::loopback::LoopbackDevice;
use crate::settings::Settings;
use smc_proto::clc::{Eid, Hostname};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

/// How often an engine without `smcd` tries to reach it again.
const RECONNECT_INTERVAL: Duration = Duration::from_secs(1);

/// How an engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// `smcd`'s socket.
    pub socket: PathBuf,
    /// Settings for new connections.
    pub settings: Settings,
    /// User EIDs to propose and accept.
    pub ueids: Vec<String>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            socket: super::channel::socket_path(),
            settings: Settings::default(),
            ueids: Vec::new(),
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
    settings: RwLock<Settings>,
    ueids: RwLock<Vec<Eid>>,
    /// This engine's link groups.
    pub lgrs: LgrTable,
    housekeeping: OnceLock<()>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Engine {
    /// A new engine; it reaches `smcd` on first use.
    pub fn new(cfg: EngineConfig) -> Arc<Self> {
        let ueids = cfg.ueids.iter().filter_map(|s| Eid::new(s)).collect();
        Arc::new(Self {
            socket: cfg.socket,
            device: Mutex::new(DeviceSlot {
                dev: None,
                last_try: None,
            }),
            settings: RwLock::new(cfg.settings),
            ueids: RwLock::new(ueids),
            lgrs: LgrTable::new(1),
            housekeeping: OnceLock::new(),
        })
    }

    /// The process-wide engine (socket from `$SMCD_SOCKET`).
    pub fn global() -> &'static Arc<Engine> {
        static GLOBAL: OnceLock<Arc<Engine>> = OnceLock::new();
        GLOBAL.get_or_init(|| Engine::new(EngineConfig::default()))
    }

    /// The settings new connections get.
    pub fn settings(&self) -> Settings {
        self.settings
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the settings for connections created afterwards.
    pub fn set_settings(&self, s: Settings) {
        *self.settings.write().unwrap_or_else(|e| e.into_inner()) = s;
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

    /// What this engine brings to a handshake on `dev`.
    pub fn caps(&self, dev: &LoopbackDevice) -> LocalCaps {
        let info = dev.info();
        let seid = Eid::new(&info.seid).filter(|e| !e.is_zero() && !info.seid.is_empty());
        LocalCaps {
            gid: dev.gid(),
            chid: dev.chid(),
            seid,
            ueids: self.ueids.read().unwrap_or_else(|e| e.into_inner()).clone(),
            hostname: Hostname::new(&info.hostname),
        }
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
                            e.lgrs.sweep(dev.as_ref(), idle);
                        }
                    }
                });
        });
    }
}
