//! The daemon's whole state: the loopback device, the network namespaces (each with its
//! knobs, its sysctl page and its statistics baseline), and the host's EID table. The socket
//! server hands every request to it; the netlink command handlers read and change it.

use super::device::{DeviceState, Session};
use crate::layout::status::{N_TOTALS, Totals};
use crate::layout::{EidState, SysctlPage};
use crate::settings::{KNOBS, Kind, KnobError, Settings, knob_index};
use rustix::fd::OwnedFd;
use std::collections::HashMap;
use std::io;

/// One network namespace as smcd sees it (the kernel's `struct netns_smc`).
#[derive(Debug)]
pub struct Namespace {
    /// The inode of the namespace.
    pub inode: u64,
    /// Knob values, in [`KNOBS`] order.
    pub values: Vec<u64>,
    /// The string knob `hs_ctrl`.
    pub hs_ctrl: String,
    page: SysctlPage,
    page_fd: OwnedFd,
    /// Counters of engines of this namespace that have ended (their status areas are gone,
    /// their connections were counted; the kernel's counters survive sockets the same way).
    pub departed: Totals,
    /// What `STATS_RESET` subtracts.
    pub baseline: Totals,
}

impl Namespace {
    fn new(inode: u64, eids: &EidState) -> io::Result<Namespace> {
        let values = Settings::default_values();
        let (page, page_fd) = SysctlPage::create(&values, eids)?;
        Ok(Namespace {
            inode,
            values,
            hs_ctrl: String::new(),
            page,
            page_fd,
            departed: vec![0; N_TOTALS],
            baseline: vec![0; N_TOTALS],
        })
    }

    /// The descriptor engines of this namespace map.
    pub fn page_fd(&self) -> rustix::fd::BorrowedFd<'_> {
        rustix::fd::AsFd::as_fd(&self.page_fd)
    }

    /// The value of knob `name` (numeric knobs).
    pub fn get(&self, name: &str) -> Option<u64> {
        knob_index(name).map(|i| self.values[i])
    }

    /// The settings new connections in this namespace get.
    pub fn settings(&self) -> Settings {
        Settings::from_values(&self.values)
    }
}

/// The daemon state.
#[derive(Debug)]
pub struct Daemon {
    /// The loopback device.
    pub device: DeviceState,
    /// Namespaces seen so far.
    pub namespaces: HashMap<u64, Namespace>,
    /// The host's EID table (global, as in the kernel).
    pub eids: EidState,
    /// A group whose members may change state besides root (`--admin-group`).
    pub admin_gid: Option<u32>,
    /// Whether the SMC TCP option program is in effect, as `INFO` reports it.
    pub syn_option: SynOptionInfo,
    /// The host's RDMA devices, listed with the engines' ports in `GET_DEV_SMCR`: looked up
    /// at start and for each dump (`control::rnic`).
    pub rnics: super::rnic::Rnics,
}

/// Whether the SMC TCP option program is in effect (`SMCD_ENGINE` `INFO`, `smcctl info`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SynOptionInfo {
    /// Attached, and HELLO hands engines its maps.
    pub attached: bool,
    /// The cgroup it is attached to.
    pub cgroup: Option<String>,
    /// Why it is or is not in effect, in words.
    pub status: String,
}

impl Daemon {
    /// A daemon around `device`.
    pub fn new(device: DeviceState) -> Self {
        let mut rnics = super::rnic::Rnics::default();
        rnics.refresh();
        Self {
            device,
            namespaces: HashMap::new(),
            // smcd serves one host and derives its SEID from it (see the smcd binary), so the
            // SEID starts enabled.
            eids: EidState {
                ueids: Vec::new(),
                seid_enabled: true,
            },
            admin_gid: None,
            syn_option: SynOptionInfo {
                attached: false,
                cgroup: None,
                status: "not loaded".into(),
            },
            rnics,
        }
    }

    /// The namespace `inode`, created with default knobs on first sight.
    pub fn namespace(&mut self, inode: u64) -> io::Result<&mut Namespace> {
        if !self.namespaces.contains_key(&inode) {
            let ns = Namespace::new(inode, &self.eids)?;
            self.namespaces.insert(inode, ns);
        }
        Ok(self.namespaces.get_mut(&inode).expect("inserted"))
    }

    /// Sets a numeric knob in a namespace (`EINVAL`-style error and the old value kept when
    /// out of range); engines see it for connections they create afterwards.
    pub fn set_knob(&mut self, inode: u64, name: &str, value: u64) -> Result<(), KnobError> {
        let i = knob_index(name).ok_or_else(|| KnobError::Unknown(name.to_string()))?;
        let k = &KNOBS[i];
        if k.kind == Kind::Str {
            return Err(KnobError::Unknown(name.to_string()));
        }
        let v = k.check(value)?;
        let eids = self.eids.clone();
        let ns = self
            .namespace(inode)
            .map_err(|_| KnobError::Unknown(name.to_string()))?;
        ns.values[i] = v;
        ns.page.store(&ns.values, &eids);
        Ok(())
    }

    /// Sets the string knob `hs_ctrl`: only the empty value (no BPF profiles in user space).
    pub fn set_hs_ctrl(&mut self, inode: u64, value: &str) -> Result<(), KnobError> {
        if !value.is_empty() {
            return Err(KnobError::Unsupported("hs_ctrl"));
        }
        self.namespace(inode)
            .map_err(|_| KnobError::Unknown("hs_ctrl".into()))?
            .hs_ctrl
            .clear();
        Ok(())
    }

    /// Republishes the EID table to every namespace's page.
    pub fn publish_eids(&mut self) {
        for ns in self.namespaces.values() {
            ns.page.store(&ns.values, &self.eids);
        }
    }

    /// An engine session ended: keep its final counters in its namespace.
    pub fn session_gone(&mut self, s: Session) {
        let Some(view) = &s.status else { return };
        let t = view.totals();
        if let Ok(ns) = self.namespace(s.netns) {
            for (d, v) in ns.departed.iter_mut().zip(t) {
                *d = d.wrapping_add(v);
            }
        }
    }

    /// The counters of namespace `inode`: departed engines plus live ones, minus the reset
    /// baseline.
    pub fn totals(&mut self, inode: u64) -> Totals {
        let mut live = vec![0; N_TOTALS];
        for s in self.device.sessions().filter(|s| s.netns == inode) {
            if let Some(v) = &s.status {
                for (a, b) in live.iter_mut().zip(v.totals()) {
                    *a = u64::wrapping_add(*a, b);
                }
            }
        }
        self.totals_from_live(inode, &live)
    }

    /// The counters of namespace `inode`, given the sum of its live engines' (a dump adds
    /// them up in pages): plus departed engines, minus the reset baseline.
    pub fn totals_from_live(&self, inode: u64, live: &[u64]) -> Totals {
        let mut t = self
            .namespaces
            .get(&inode)
            .map_or_else(|| vec![0; N_TOTALS], |ns| ns.departed.clone());
        for (a, b) in t.iter_mut().zip(live) {
            *a = a.wrapping_add(*b);
        }
        if let Some(ns) = self.namespaces.get(&inode) {
            for (a, b) in t.iter_mut().zip(&ns.baseline) {
                *a = a.wrapping_sub(*b);
            }
        }
        t
    }

    /// `STATS_RESET`: the namespace's counters read zero from now on.
    pub fn reset_stats(&mut self, inode: u64) -> io::Result<()> {
        let mut raw = self.totals(inode);
        if let Some(ns) = self.namespaces.get(&inode) {
            // totals() subtracted the old baseline; the new one is the raw sum.
            for (a, b) in raw.iter_mut().zip(&ns.baseline) {
                *a = a.wrapping_add(*b);
            }
        }
        self.namespace(inode)?.baseline = raw;
        Ok(())
    }
}
