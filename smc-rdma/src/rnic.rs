//! Real RNICs (and rxe) through libibverbs, behind the Cargo feature `rnic`.
//!
//! The verbs come from [sideway] on rdma-mummy-sys, which compiles a small C stub that
//! `dlopen()`s `libibverbs.so.1` when the process starts: the build needs cmake and libclang but
//! no rdma-core headers or libraries, a binary built with the feature starts on machines without
//! libibverbs, and there [`RnicDevice::open`] says so ([`RnicError::NoLibibverbs`]) instead of
//! the loader refusing the binary. Why sideway and not the `ibverbs` crate: `docs/smcr.md`,
//! "Real RNICs".
//!
//! What maps to what:
//!
//! | [`crate::verbs`] | here |
//! |---|---|
//! | [`Device::alloc_pd`] | `ibv_alloc_pd` (a failure shows at the first use of the domain) |
//! | [`Device::reg_mr`] | `ibv_reg_mr` of the whole [`Memory`]; the region keeps the `Arc` and deregisters first |
//! | [`Device::create_cq`] | `ibv_create_cq` with its own completion channel (non-blocking): [`CompletionQueue::event_fd`] is the channel's fd |
//! | [`CompletionQueue::req_notify`] | `ibv_req_notify_cq`, then a poll into a buffer the next [`CompletionQueue::poll`] drains first: what it found is reported as missed (`IB_CQ_REPORT_MISSED_EVENTS`, which libibverbs lacks) |
//! | [`CompletionQueue::take_event`] | `ibv_get_cq_event` + `ibv_ack_cq_events` |
//! | [`Device::create_qp`] | `ibv_create_qp`, RC; `sq_sig_all` is applied per request (sideway does not pass it) |
//! | [`QpModify::Init`] | pkey index 0, the port, the remote rights |
//! | [`QpModify::Rtr`] | GRH with the peer's GID, hop limit 1 and our source GID index (RoCE needs no LID); path MTU; dest QPN; RQ PSN; `max_dest_rd_atomic` 1; min RNR timer |
//! | [`QpModify::Rts`] | SQ PSN, timeout, retry count, RNR retry, `max_rd_atomic` 1 |
//! | [`QueuePair::post_send`] | `ibv_post_send` of one SEND or RDMA WRITE, up to `max_send_sge` SGEs or `IBV_SEND_INLINE` data (copied into a buffer the post owns), `IBV_SEND_SIGNALED`/`IBV_SEND_SOLICITED` |
//! | [`QueuePair::post_recv`] | `ibv_post_recv` of one SGE |
//! | [`QueuePair::state`] | `ibv_query_qp`: the device's state, so an RC failure shows as [`QpState::Error`] |
//!
//! As the trait asks, and hardware does not check at post time, this module refuses before
//! posting: a request in a state that takes none ([`VerbsError::State`]), an SGE outside a region
//! of the QP's domain or with a wrong key ([`VerbsError::Protection`]), too much inline data or
//! too many SGEs ([`VerbsError::Invalid`]); a full queue (`ENOMEM`) is [`VerbsError::Full`]. A
//! request posted to a QP the device moved to ERROR is flushed by the device, or, where the
//! provider refuses it instead, completed here as [`WcStatus::WrFlushErr`].
//!
//! Completions: libibverbs defines `opcode` only for successful completions, so for error
//! completions the opcode comes from what was posted (the QP remembers its outstanding sends in
//! order; RC completes them in order). Statuses map one to one where [`WcStatus`] has the value;
//! the rest by who failed: local ones (`LOC_QP_OP_ERR`, `LOC_ACCESS_ERR`, `MW_BIND_ERR`,
//! `LOC_EEC_OP_ERR`, `LOC_RDD_VIOL_ERR`, `FATAL_ERR`, `GENERAL_ERR`, ...) to
//! [`WcStatus::LocProtErr`], the responder's (`BAD_RESP_ERR`, `REM_ABORT_ERR`,
//! `REM_INV_RD_REQ_ERR`, `RESP_TIMEOUT_ERR`, `INV_EECN_ERR`, `INV_EEC_STATE_ERR`) to
//! [`WcStatus::RemOpErr`]. [`Wc::solicited`] is always false: a `struct ibv_wc` has no solicited
//! flag (the kernel's `ib_wc` neither), the bit only decides whether a solicited-only armed queue
//! signals its channel, which works as the trait documents.
//!
//! Only RoCE ports (Ethernet link layer) are listed with GIDs: SMC-R runs on RoCE, and an
//! InfiniBand path needs LIDs the trait does not carry.

use crate::verbs::{
    Access, CompletionQueue, Device, DeviceInfo, Gid, GidType, Memory, MemoryRegion, Mtu, Pd,
    PortInfo, PortState, QpCaps, QpInit, QpModify, QpState, QueuePair, RecvWr, SendOp, SendWr,
    VerbsError, Wc, WcOpcode, WcStatus,
};
use rdma_mummy_sys as sys;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid as IbvGid, GidType as IbvGidType};
use sideway::ibverbs::completion::{
    BasicCompletionQueue, CompletionChannel, CompletionQueue as _, GenericCompletionQueue,
};
use sideway::ibverbs::device::{DeviceInfo as _, DeviceList};
use sideway::ibverbs::device_context::{
    DeviceContext, LinkLayer, Mtu as IbvMtu, PortState as IbvPortState,
};
use sideway::ibverbs::memory_region::MemoryRegion as IbvMr;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostRecvError, PostSendError, PostSendGuard as _, QueuePair as _,
    QueuePairAttribute, QueuePairAttributeMask, QueuePairState, SetInlineData as _,
    SetScatterGatherEntry as _, WorkRequestFlags,
};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// PSNs and QPNs are 24 bits.
const MASK24: u32 = 0x00ff_ffff;
/// The hop limit of our GRHs: SMC-R peers share a LAN (the kernel's `smc_ib_modify_qp_rtr`).
const HOP_LIMIT: u8 = 1;
/// Completions taken from the device per `ibv_poll_cq` call.
const POLL_BATCH: usize = 16;

/// Why no RNIC could be opened.
#[derive(Debug, thiserror::Error)]
pub enum RnicError {
    /// The `dlopen("libibverbs.so.1")` at start-up found nothing.
    #[error(
        "libibverbs.so.1 could not be loaded: install rdma-core's libibverbs1 and \
         ibverbs-providers (the feature loads it at run time)"
    )]
    NoLibibverbs,
    /// libibverbs is there, the kernel's verbs are not.
    #[error("the kernel offers no RDMA verbs (is ib_uverbs loaded?): {0}")]
    NoKernelVerbs(io::Error),
    /// libibverbs lists no device.
    #[error(
        "no RDMA device: no RNIC here, and no rxe (`rdma link add rxe0 type rxe netdev IFACE` \
         makes one)"
    )]
    NoDevices,
    /// No device has the name asked for.
    #[error("no RDMA device named {name:?}; there are: {available}")]
    NotFound {
        /// The name asked for.
        name: String,
        /// The devices there are, comma-separated.
        available: String,
    },
    /// No device has a RoCE port.
    #[error("no RDMA device with a RoCE (Ethernet) port; there are: {0}")]
    NoRoce(String),
    /// A verb failed.
    #[error("{source}")]
    Verbs {
        /// Which.
        what: &'static str,
        /// The error it gave, its message starting with `what`.
        source: io::Error,
    },
}

/// The errno somewhere in an error's source chain. sideway's error kinds are
/// `#[error(transparent)]` over an `io::Error`, which hides it from downcasting (the chain goes
/// from the kind straight to the `io::Error`'s own source), so the `(os error N)` its message
/// ends with is read as well.
fn os_error(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return io.raw_os_error();
        }
        let msg = err.to_string();
        if let Some(n) = msg
            .strip_suffix(')')
            .and_then(|m| m.rsplit_once("(os error "))
            .and_then(|(_, n)| n.parse().ok())
        {
            return Some(n);
        }
        cur = err.source();
    }
    None
}

/// `what` and the error's message chain, as an `io::Error` of its errno.
fn flatten(what: &str, e: &(dyn std::error::Error + 'static)) -> io::Error {
    let mut msg = format!("{what}: {e}");
    let mut cur = e.source();
    while let Some(s) = cur {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        cur = s.source();
    }
    match os_error(e) {
        Some(errno) => io::Error::new(io::Error::from_raw_os_error(errno).kind(), msg),
        None => io::Error::other(msg),
    }
}

fn verbs_err(what: &'static str, e: &(dyn std::error::Error + 'static)) -> RnicError {
    RnicError::Verbs {
        what,
        source: flatten(what, e),
    }
}

fn device_list() -> Result<DeviceList, RnicError> {
    DeviceList::new().map_err(|e| match os_error(&e) {
        // rdma-mummy-sys' stubs answer EOPNOTSUPP when the dlopen found nothing.
        Some(libc::EOPNOTSUPP) => RnicError::NoLibibverbs,
        Some(libc::ENOSYS) => RnicError::NoKernelVerbs(io::Error::from_raw_os_error(libc::ENOSYS)),
        _ => verbs_err("ibv_get_device_list", &e),
    })
}

/// The names of the RDMA devices libibverbs lists (`ibv_devices`).
pub fn device_names() -> Result<Vec<String>, RnicError> {
    let list = device_list()?;
    let names: Vec<String> = list.iter().map(|d| d.name()).collect();
    if names.is_empty() {
        return Err(RnicError::NoDevices);
    }
    Ok(names)
}

/// Every device with its ports and GID tables (`ibv_devinfo` and `show_gids` in one).
pub fn list() -> Result<Vec<DeviceInfo>, RnicError> {
    device_names()?
        .iter()
        .map(|n| RnicDevice::open(n).map(|d| d.info()))
        .collect()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An RDMA device opened through libibverbs.
#[derive(Debug, Clone)]
pub struct RnicDevice {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: String,
    ctx: Arc<DeviceContext>,
    ports: u8,
    next_pd: AtomicU32,
    pds: Mutex<HashMap<u32, Arc<ProtectionDomain>>>,
    /// Registered regions by lkey, for the checks at post time.
    mrs: RwLock<HashMap<u32, Span>>,
    /// Live QPs by number, for the opcodes of their error completions.
    qps: RwLock<HashMap<u32, Arc<Track>>>,
    next_cq: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Span {
    pd: Pd,
    addr: u64,
    len: u64,
}

impl Inner {
    /// Whether `[addr, addr+len)` lies in a region of `pd` with `lkey`.
    fn covers(&self, pd: Pd, addr: u64, len: u32, lkey: u32) -> bool {
        let mrs = self.mrs.read().unwrap_or_else(|e| e.into_inner());
        mrs.get(&lkey).is_some_and(|s| {
            s.pd == pd
                && addr >= s.addr
                && (addr - s.addr)
                    .checked_add(u64::from(len))
                    .is_some_and(|end| end <= s.len)
        })
    }

    fn pd(&self, pd: Pd) -> Result<Arc<ProtectionDomain>, VerbsError> {
        lock(&self.pds)
            .get(&pd.0)
            .cloned()
            .ok_or(VerbsError::Invalid(
                "protection domain (unknown, or ibv_alloc_pd failed)",
            ))
    }
}

impl RnicDevice {
    /// Opens the device named `name` (as `ibv_devices` lists it: `mlx5_0`, `rxe0`).
    pub fn open(name: &str) -> Result<Self, RnicError> {
        let list = device_list()?;
        let dev = list.iter().find(|d| d.name() == name).ok_or_else(|| {
            let names: Vec<String> = list.iter().map(|d| d.name()).collect();
            if names.is_empty() {
                RnicError::NoDevices
            } else {
                RnicError::NotFound {
                    name: name.to_string(),
                    available: names.join(", "),
                }
            }
        })?;
        let ctx = dev.open().map_err(|e| verbs_err("ibv_open_device", &e))?;
        let ports = ctx
            .query_device()
            .map_err(|e| verbs_err("ibv_query_device", &e))?
            .phys_port_cnt();
        Ok(Self {
            inner: Arc::new(Inner {
                name: name.to_string(),
                ctx,
                ports,
                next_pd: AtomicU32::new(1),
                pds: Mutex::new(HashMap::new()),
                mrs: RwLock::new(HashMap::new()),
                qps: RwLock::new(HashMap::new()),
                next_cq: AtomicU64::new(1),
            }),
        })
    }

    /// Opens the first device libibverbs lists that has a RoCE port.
    pub fn open_first() -> Result<Self, RnicError> {
        let names = device_names()?;
        for n in &names {
            let d = Self::open(n)?;
            if d.info().ports.iter().any(|p| !p.gids.is_empty()) {
                return Ok(d);
            }
        }
        Err(RnicError::NoRoce(names.join(", ")))
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    fn port_info(&self, port: u8) -> Option<PortInfo> {
        let ctx = &self.inner.ctx;
        let attr = ctx.query_port(port).ok()?;
        let state = match attr.port_state() {
            IbvPortState::Active => PortState::Active,
            _ => PortState::Down,
        };
        let active_mtu = Mtu::from_ib(attr.active_mtu() as u8).unwrap_or(Mtu::M1024);
        let mut info = PortInfo {
            port,
            state,
            active_mtu,
            netdev: String::new(),
            mac: [0; 6],
            gids: Vec::new(),
        };
        if attr.link_layer() != LinkLayer::Ethernet {
            return Some(info);
        }
        for index in 0..attr.gid_tbl_len().clamp(0, 256) as u32 {
            let Some((gid, ty, netdev)) = self.gid_entry(port, index) else {
                continue;
            };
            if info.netdev.is_empty() && !netdev.is_empty() {
                info.netdev = netdev;
            }
            info.gids.push((index as u8, gid, ty));
        }
        if !info.netdev.is_empty() {
            info.mac = read_mac(&info.netdev).unwrap_or([0; 6]);
        }
        Some(info)
    }

    /// GID, type and netdev of one GID table entry; `None` when it is empty.
    fn gid_entry(&self, port: u8, index: u32) -> Option<(Gid, GidType, String)> {
        let ctx = &self.inner.ctx;
        match ctx.query_gid_ex(port, index) {
            Ok(e) => {
                let ty = match e.gid_type() {
                    IbvGidType::RoceV2 => GidType::RoceV2,
                    IbvGidType::RoceV1 => GidType::RoceV1,
                    IbvGidType::InfiniBand => return None,
                };
                let gid = e.gid();
                (!gid.is_zero()).then(|| (Gid(gid.raw), ty, e.netdev_name().unwrap_or_default()))
            }
            // A libibverbs older than rdma-core 32 has no ibv_query_gid_ex: sysfs, as it reads.
            Err(e) if matches!(os_error(&e), Some(libc::EOPNOTSUPP | libc::ENOSYS)) => {
                let gid = ctx.query_gid(port, index).ok()?;
                if gid.is_zero() {
                    return None;
                }
                // The sysfs type: 0 is IB / RoCE v1, 1 is RoCE v2.
                let ty = match ctx.query_gid_type(port, index).ok()? {
                    1 => GidType::RoceV2,
                    _ => GidType::RoceV1,
                };
                let netdev = std::fs::read_to_string(format!(
                    "/sys/class/infiniband/{}/ports/{port}/gid_attrs/ndevs/{index}",
                    self.inner.name
                ))
                .map(|s| s.trim().to_string())
                .unwrap_or_default();
                Some((Gid(gid.raw), ty, netdev))
            }
            Err(_) => None, // ENODATA: an empty entry
        }
    }
}

/// The GID index SMC-R would use on `port`: the RoCE v2 entry of `addr` (an IPv4-mapped GID),
/// else the first RoCE v2 IPv4 entry, else the first RoCE v2 entry, else the first RoCE v1 one
/// (the kernel's `smc_ib_determine_gid` prefers v2 the same way).
pub fn select_gid(port: &PortInfo, addr: Option<Ipv4Addr>) -> Option<(u8, Gid, GidType)> {
    let v2 = |g: &&(u8, Gid, GidType)| g.2 == GidType::RoceV2;
    let gids = &port.gids;
    addr.and_then(|a| gids.iter().filter(v2).find(|g| g.1.to_ipv4() == Some(a)))
        .or_else(|| gids.iter().filter(v2).find(|g| g.1.to_ipv4().is_some()))
        .or_else(|| gids.iter().find(v2))
        .or_else(|| gids.first())
        .copied()
}

fn read_mac(netdev: &str) -> Option<[u8; 6]> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{netdev}/address")).ok()?;
    let mut mac = [0u8; 6];
    let mut parts = s.trim().split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    Some(mac)
}

fn mr_access(a: Access) -> AccessFlags {
    let mut f = AccessFlags::none();
    if a.contains(Access::LOCAL_WRITE) {
        f |= AccessFlags::LocalWrite;
    }
    if a.contains(Access::REMOTE_WRITE) {
        f |= AccessFlags::RemoteWrite;
    }
    if a.contains(Access::REMOTE_READ) {
        f |= AccessFlags::RemoteRead;
    }
    f
}

/// A QP's access flags are the remote rights only.
fn qp_access(a: Access) -> AccessFlags {
    mr_access(Access(a.0 & !Access::LOCAL_WRITE.0))
}

fn ibv_mtu(m: Mtu) -> IbvMtu {
    match m {
        Mtu::M256 => IbvMtu::Mtu256,
        Mtu::M512 => IbvMtu::Mtu512,
        Mtu::M1024 => IbvMtu::Mtu1024,
        Mtu::M2048 => IbvMtu::Mtu2048,
        Mtu::M4096 => IbvMtu::Mtu4096,
    }
}

fn qp_state(s: QueuePairState) -> QpState {
    match s {
        QueuePairState::Reset => QpState::Reset,
        QueuePairState::Init => QpState::Init,
        QueuePairState::ReadyToReceive => QpState::Rtr,
        // SQD still sends what it had; SQE is a send queue error.
        QueuePairState::ReadyToSend | QueuePairState::SendQueueDrain => QpState::Rts,
        QueuePairState::SendQueueError | QueuePairState::Error | QueuePairState::Unknown => {
            QpState::Error
        }
    }
}

/// `enum ibv_wc_status` → [`WcStatus`] (the module docs say how the rest fold).
fn wc_status(s: u32) -> WcStatus {
    use sys::ibv_wc_status as st;
    match s {
        st::IBV_WC_SUCCESS => WcStatus::Success,
        st::IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        st::IBV_WC_LOC_PROT_ERR => WcStatus::LocProtErr,
        st::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        st::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemInvReqErr,
        st::IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
        st::IBV_WC_REM_OP_ERR => WcStatus::RemOpErr,
        st::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExcErr,
        st::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExcErr,
        st::IBV_WC_BAD_RESP_ERR
        | st::IBV_WC_REM_ABORT_ERR
        | st::IBV_WC_REM_INV_RD_REQ_ERR
        | st::IBV_WC_RESP_TIMEOUT_ERR
        | st::IBV_WC_INV_EECN_ERR
        | st::IBV_WC_INV_EEC_STATE_ERR => WcStatus::RemOpErr,
        _ => WcStatus::LocProtErr,
    }
}

impl Device for RnicDevice {
    type Mr = RnicMr;
    type Cq = RnicCq;
    type Qp = RnicQp;

    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            name: self.inner.name.clone(),
            ports: (1..=self.inner.ports)
                .filter_map(|p| self.port_info(p))
                .collect(),
        }
    }

    fn alloc_pd(&self) -> Pd {
        let pd = Pd(self.inner.next_pd.fetch_add(1, Ordering::Relaxed));
        if let Ok(p) = self.inner.ctx.alloc_pd() {
            lock(&self.inner.pds).insert(pd.0, p);
        }
        pd
    }

    fn reg_mr(&self, pd: Pd, mem: Arc<Memory>, access: Access) -> Result<RnicMr, VerbsError> {
        if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
            return Err(VerbsError::Invalid(
                "REMOTE_WRITE needs LOCAL_WRITE (ibv_reg_mr)",
            ));
        }
        let p = self.inner.pd(pd)?;
        // SAFETY: `mem` is a live mapping of `mem.len()` bytes that the region keeps alive
        // (the Arc is held by RnicMr and dropped after the registration); `Memory` is made for a
        // device writing it at any time.
        let mr = unsafe { p.reg_mr(mem.addr() as usize, mem.len(), mr_access(access)) }
            .map_err(|e| VerbsError::Io(flatten("ibv_reg_mr", &e)))?;
        self.inner
            .mrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                mr.lkey(),
                Span {
                    pd,
                    addr: mem.addr(),
                    len: mem.len() as u64,
                },
            );
        Ok(RnicMr {
            dev: Arc::clone(&self.inner),
            mr,
            mem,
        })
    }

    fn create_cq(&self, cqe: u32) -> Result<Arc<RnicCq>, VerbsError> {
        let ctx = &self.inner.ctx;
        let channel = ctx
            .create_comp_channel()
            .map_err(|e| VerbsError::Io(flatten("ibv_create_comp_channel", &e)))?;
        channel.set_nonblocking(true)?;
        let cq = ctx
            .create_cq_builder()
            .setup_cqe(cqe.max(1))
            .setup_comp_channel(&channel, 0)
            .build()
            .map_err(|e| VerbsError::Io(flatten("ibv_create_cq", &e)))?;
        Ok(Arc::new(RnicCq {
            id: self.inner.next_cq.fetch_add(1, Ordering::Relaxed),
            dev: Arc::clone(&self.inner),
            cq,
            channel,
            pending: Mutex::new(VecDeque::new()),
        }))
    }

    fn create_qp(&self, pd: Pd, init: QpInit<RnicCq>) -> Result<RnicQp, VerbsError> {
        let p = self.inner.pd(pd)?;
        let c = init.caps;
        let qp = p
            .create_qp_builder()
            .setup_max_send_wr(c.max_send_wr)
            .setup_max_recv_wr(c.max_recv_wr)
            .setup_max_send_sge(c.max_send_sge)
            .setup_max_recv_sge(c.max_recv_sge)
            .setup_max_inline_data(c.max_inline_data)
            .setup_send_cq(GenericCompletionQueue::from(Arc::clone(&init.send_cq.cq)))
            .setup_recv_cq(GenericCompletionQueue::from(Arc::clone(&init.recv_cq.cq)))
            .build()
            .map_err(|e| VerbsError::Io(flatten("ibv_create_qp", &e)))?;
        // What the device gave (at least what was asked).
        let caps = qp
            .query(QueuePairAttributeMask::Capabilities)
            .map(|(_, i)| QpCaps {
                max_send_wr: i.max_send_wr(),
                max_recv_wr: i.max_recv_wr(),
                max_send_sge: i.max_send_sge(),
                max_recv_sge: i.max_recv_sge(),
                max_inline_data: i.max_inline_data(),
            })
            .unwrap_or(c);
        let qpn = qp.qp_number();
        let track = Arc::new(Track {
            send_cq: init.send_cq.id,
            recv_cq: init.recv_cq.id,
            cap: (caps.max_send_wr as usize).max(1) * 2,
            sends: Mutex::new(VecDeque::new()),
        });
        self.inner
            .qps
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(qpn, Arc::clone(&track));
        Ok(RnicQp {
            dev: Arc::clone(&self.inner),
            qp: Mutex::new(qp),
            qpn,
            pd,
            caps,
            sq_sig_all: init.sq_sig_all,
            st: Mutex::new(St {
                state: QpState::Reset,
                port: 1,
            }),
            track,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
        })
    }
}

/// A memory region registered with an [`RnicDevice`].
#[derive(Debug)]
pub struct RnicMr {
    dev: Arc<Inner>,
    // Declared before `mem`: deregistered before the memory can go.
    mr: Arc<IbvMr>,
    mem: Arc<Memory>,
}

impl Drop for RnicMr {
    fn drop(&mut self) {
        self.dev
            .mrs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.mr.lkey());
    }
}

impl MemoryRegion for RnicMr {
    fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
    fn rkey(&self) -> u32 {
        self.mr.rkey()
    }
    fn addr(&self) -> u64 {
        self.mem.addr()
    }
    fn len(&self) -> usize {
        self.mem.len()
    }
    fn memory(&self) -> &Arc<Memory> {
        &self.mem
    }
}

/// What a QP posted and its completion queues have not yet reported.
#[derive(Debug)]
struct Track {
    send_cq: u64,
    recv_cq: u64,
    /// Sends in posting order (signaled or not): (wr_id, opcode).
    sends: Mutex<VecDeque<(u64, WcOpcode)>>,
    /// Kept at most (a user who never signals overflows the send queue first).
    cap: usize,
}

impl Track {
    fn posted(&self, wr_id: u64, op: WcOpcode) {
        let mut s = lock(&self.sends);
        if s.len() >= self.cap {
            s.pop_front();
        }
        s.push_back((wr_id, op));
    }

    fn unpost(&self) {
        lock(&self.sends).pop_back();
    }

    /// A send completed: it and everything posted before it are done. Its opcode, if known.
    fn completed(&self, wr_id: u64) -> Option<WcOpcode> {
        let mut s = lock(&self.sends);
        let i = s.iter().position(|&(id, _)| id == wr_id)?;
        let op = s[i].1;
        s.drain(..=i);
        Some(op)
    }
}

/// A completion queue of an [`RnicDevice`], with its own completion channel.
#[derive(Debug)]
pub struct RnicCq {
    id: u64,
    dev: Arc<Inner>,
    // Holds the channel too; destroyed before it.
    cq: Arc<BasicCompletionQueue>,
    channel: Arc<CompletionChannel>,
    /// Completions taken from the device by `req_notify` (or a post refused in ERROR), not yet
    /// polled.
    pending: Mutex<VecDeque<Wc>>,
}

impl RnicCq {
    /// Moves what the device has into `pending`.
    fn drain_device(&self, pending: &mut VecDeque<Wc>, max: usize) {
        // SAFETY: `ibv_wc` is plain old data (integers and a union of integers): zero is valid.
        let mut buf: [sys::ibv_wc; POLL_BATCH] = unsafe { std::mem::zeroed() };
        let mut left = max;
        while left > 0 {
            let want = left.min(POLL_BATCH);
            // SAFETY: the CQ is alive (held by self.cq); `buf` has room for `want` entries.
            let n =
                unsafe { sys::ibv_poll_cq(self.cq.cq().as_ptr(), want as i32, buf.as_mut_ptr()) };
            if n <= 0 {
                break;
            }
            let n = n as usize;
            pending.extend(buf[..n].iter().map(|w| self.convert(w)));
            left -= n;
            if n < want {
                break;
            }
        }
    }

    fn convert(&self, w: &sys::ibv_wc) -> Wc {
        use sys::ibv_wc_opcode as op;
        let status = wc_status(w.status);
        let track = self
            .dev
            .qps
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&w.qp_num)
            .cloned();
        // libibverbs defines `opcode` for successful completions only.
        let from_device = (status == WcStatus::Success).then_some(match w.opcode {
            op::IBV_WC_RECV | op::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::Recv,
            op::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            _ => WcOpcode::Send,
        });
        let opcode = match &track {
            Some(t) => {
                let send_side = match (t.send_cq == self.id, t.recv_cq == self.id) {
                    (true, false) => true,
                    (false, true) => false,
                    // One CQ for both queues: by the device's opcode, else by what was posted.
                    _ => match from_device {
                        Some(o) => o != WcOpcode::Recv,
                        None => lock(&t.sends).iter().any(|&(id, _)| id == w.wr_id),
                    },
                };
                if send_side {
                    let posted = t.completed(w.wr_id);
                    from_device.or(posted).unwrap_or(WcOpcode::Send)
                } else {
                    WcOpcode::Recv
                }
            }
            None => from_device.unwrap_or(WcOpcode::Send),
        };
        Wc {
            wr_id: w.wr_id,
            status,
            opcode,
            byte_len: if opcode == WcOpcode::Recv {
                w.byte_len
            } else {
                0
            },
            qp_num: w.qp_num,
            solicited: false,
        }
    }
}

impl CompletionQueue for RnicCq {
    fn poll(&self, out: &mut [Wc]) -> usize {
        let mut pending = lock(&self.pending);
        let want = out.len();
        if pending.len() < want {
            let more = want - pending.len();
            self.drain_device(&mut pending, more);
        }
        let n = want.min(pending.len());
        for (o, wc) in out.iter_mut().zip(pending.drain(..n)) {
            *o = wc;
        }
        n
    }

    fn req_notify(&self, solicited_only: bool) -> bool {
        let mut pending = lock(&self.pending);
        // SAFETY: the CQ is alive (held by self.cq).
        let rc =
            unsafe { sys::ibv_req_notify_cq(self.cq.cq().as_ptr(), i32::from(solicited_only)) };
        // Completions that arrived before the arm raise no event: find them now. Also when the
        // arm failed, so a caller polls instead of sleeping.
        self.drain_device(&mut pending, usize::MAX);
        rc != 0 || !pending.is_empty()
    }

    fn event_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel's fd is open while the channel lives, and self holds it.
        unsafe { BorrowedFd::borrow_raw(self.channel.as_raw_fd()) }
    }

    fn take_event(&self) -> bool {
        let mut cq: *mut sys::ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: the channel is alive (held by self); it is non-blocking, so this returns -1
        // when no event is there; out-pointers are valid locals.
        let rc = unsafe {
            sys::ibv_get_cq_event(self.channel.comp_channel().as_ptr(), &mut cq, &mut ctx)
        };
        if rc != 0 {
            return false;
        }
        // SAFETY: `cq` is the CQ the event was for (ours: the channel is only ours), alive;
        // every event taken is acknowledged at once, so destroying the CQ never waits.
        unsafe { sys::ibv_ack_cq_events(cq, 1) };
        true
    }
}

#[derive(Debug)]
struct St {
    /// As last modified here (the device may since have moved it to ERROR).
    state: QpState,
    port: u8,
}

/// A reliable-connected queue pair of an [`RnicDevice`].
#[derive(Debug)]
pub struct RnicQp {
    dev: Arc<Inner>,
    // Declared before the CQs: destroyed before them.
    qp: Mutex<BasicQueuePair>,
    qpn: u32,
    pd: Pd,
    caps: QpCaps,
    sq_sig_all: bool,
    st: Mutex<St>,
    track: Arc<Track>,
    send_cq: Arc<RnicCq>,
    recv_cq: Arc<RnicCq>,
}

impl Drop for RnicQp {
    fn drop(&mut self) {
        self.dev
            .qps
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.qpn);
    }
}

impl RnicQp {
    /// The device's state of the QP (`ibv_query_qp`), or `cached` (the last one set here).
    fn device_state(qp: &BasicQueuePair, cached: QpState) -> QpState {
        qp.query(QueuePairAttributeMask::State)
            .map_or(cached, |(a, _)| qp_state(a.state()))
    }

    /// A post the device refused: flushed here if the QP is in ERROR (as hardware does), the
    /// error otherwise.
    fn refused(
        &self,
        qp: &BasicQueuePair,
        wc: Wc,
        cq: &RnicCq,
        err: VerbsError,
    ) -> Result<(), VerbsError> {
        let cached = lock(&self.st).state;
        if Self::device_state(qp, cached) == QpState::Error {
            lock(&cq.pending).push_back(wc);
            return Ok(());
        }
        Err(err)
    }
}

impl QueuePair for RnicQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn state(&self) -> QpState {
        let qp = lock(&self.qp);
        let cached = lock(&self.st).state;
        Self::device_state(&qp, cached)
    }

    fn caps(&self) -> QpCaps {
        self.caps
    }

    fn modify(&self, m: &QpModify) -> Result<(), VerbsError> {
        let mut qp = lock(&self.qp);
        let mut st = lock(&self.st);
        let cur = Self::device_state(&qp, st.state);
        let mut attr = QueuePairAttribute::new();
        let (next, port) = match (cur, *m) {
            (QpState::Reset, QpModify::Init { port, access }) => {
                if port == 0 || port > self.dev.ports {
                    return Err(VerbsError::Invalid("port"));
                }
                attr.setup_state(QueuePairState::Init)
                    .setup_pkey_index(0)
                    .setup_port(port)
                    .setup_access_flags(qp_access(access));
                (QpState::Init, port)
            }
            (
                QpState::Init,
                QpModify::Rtr {
                    path_mtu,
                    dest_qpn,
                    rq_psn,
                    dgid,
                    sgid_index,
                    min_rnr_timer,
                },
            ) => {
                let mut ah = AddressHandleAttribute::new();
                ah.setup_port(st.port).setup_grh(
                    &IbvGid { raw: dgid.0 },
                    0,
                    sgid_index,
                    HOP_LIMIT,
                    0,
                );
                attr.setup_state(QueuePairState::ReadyToReceive)
                    .setup_path_mtu(ibv_mtu(path_mtu))
                    .setup_dest_qp_num(dest_qpn & MASK24)
                    .setup_rq_psn(rq_psn & MASK24)
                    .setup_max_dest_read_atomic(1)
                    .setup_min_rnr_timer(min_rnr_timer & 0x1f)
                    .setup_address_vector(&ah);
                (QpState::Rtr, st.port)
            }
            (
                QpState::Rtr,
                QpModify::Rts {
                    sq_psn,
                    timeout,
                    retry_cnt,
                    rnr_retry,
                },
            ) => {
                attr.setup_state(QueuePairState::ReadyToSend)
                    .setup_sq_psn(sq_psn & MASK24)
                    .setup_timeout(timeout & 0x1f)
                    .setup_retry_cnt(retry_cnt.min(7))
                    .setup_rnr_retry(rnr_retry.min(7))
                    .setup_max_read_atomic(1);
                (QpState::Rts, st.port)
            }
            (_, QpModify::Error) => {
                attr.setup_state(QueuePairState::Error);
                (QpState::Error, st.port)
            }
            (_, QpModify::Reset) => {
                attr.setup_state(QueuePairState::Reset);
                (QpState::Reset, st.port)
            }
            (s, _) => return Err(VerbsError::State(s)),
        };
        qp.modify(&attr)
            .map_err(|e| VerbsError::Io(flatten("ibv_modify_qp", &e)))?;
        if next == QpState::Reset {
            lock(&self.track.sends).clear();
        }
        st.state = next;
        st.port = port;
        Ok(())
    }

    fn post_send(&self, wr: &SendWr<'_>) -> Result<(), VerbsError> {
        match lock(&self.st).state {
            QpState::Rts | QpState::Error => {}
            s => return Err(VerbsError::State(s)),
        }
        let op = match wr.op {
            SendOp::Send => WcOpcode::Send,
            SendOp::Write { .. } => WcOpcode::RdmaWrite,
        };
        let sges: Vec<sys::ibv_sge> = match wr.data {
            crate::verbs::Payload::Inline(d) => {
                if d.len() > self.caps.max_inline_data as usize {
                    return Err(VerbsError::Invalid(
                        "inline data longer than max_inline_data",
                    ));
                }
                Vec::new()
            }
            crate::verbs::Payload::Sges(s) => {
                if s.len() > self.caps.max_send_sge as usize {
                    return Err(VerbsError::Invalid("more SGEs than max_send_sge"));
                }
                if s.iter().map(|g| u64::from(g.len)).sum::<u64>() > 1 << 31 {
                    return Err(VerbsError::Invalid("message longer than 2 GiB"));
                }
                if !s
                    .iter()
                    .all(|g| self.dev.covers(self.pd, g.addr, g.len, g.lkey))
                {
                    return Err(VerbsError::Protection(
                        "SGE outside its region or wrong key",
                    ));
                }
                s.iter()
                    .map(|g| sys::ibv_sge {
                        addr: g.addr,
                        length: g.len,
                        lkey: g.lkey,
                    })
                    .collect()
            }
        };
        let mut flags = WorkRequestFlags::none();
        if wr.signaled || self.sq_sig_all {
            flags |= WorkRequestFlags::Signaled;
        }
        if wr.solicited {
            flags |= WorkRequestFlags::Solicited;
        }
        let mut qp = lock(&self.qp);
        // Before the post: its completion may be polled before post returns.
        self.track.posted(wr.wr_id, op);
        let mut guard = qp.start_post_send();
        let h = guard.construct_wr(wr.wr_id, flags);
        let h = match wr.op {
            SendOp::Send => h.setup_send(),
            SendOp::Write { remote_addr, rkey } => h.setup_write(rkey, remote_addr),
        };
        match wr.data {
            // sideway copies the bytes into a buffer the guard owns until the post returned,
            // and sets IBV_SEND_INLINE (libibverbs copies them into the WQE).
            crate::verbs::Payload::Inline(d) => h.setup_inline_data(d),
            // SAFETY: every SGE lies in a region registered here (checked above), alive while
            // registered; the device reads it until the request completes, which the caller
            // waits for before reusing the memory (the verbs contract).
            crate::verbs::Payload::Sges(_) => unsafe { h.setup_sge_list(&sges) },
        }
        let Err(e) = guard.post() else {
            return Ok(());
        };
        self.track.unpost();
        let err = match e {
            PostSendError::NotEnoughResources(_) => VerbsError::Full("send"),
            e => VerbsError::Io(flatten("ibv_post_send", &e)),
        };
        let wc = Wc {
            wr_id: wr.wr_id,
            status: WcStatus::WrFlushErr,
            opcode: op,
            byte_len: 0,
            qp_num: self.qpn,
            solicited: false,
        };
        self.refused(&qp, wc, &self.send_cq, err)
    }

    fn post_recv(&self, wr: &RecvWr) -> Result<(), VerbsError> {
        if lock(&self.st).state == QpState::Reset {
            return Err(VerbsError::State(QpState::Reset));
        }
        let sges: Vec<sys::ibv_sge> = std::iter::once(wr.sge)
            .chain(wr.spill)
            .map(|g| sys::ibv_sge {
                addr: g.addr,
                length: g.len,
                lkey: g.lkey,
            })
            .collect();
        for g in std::iter::once(wr.sge).chain(wr.spill) {
            if !self.dev.covers(self.pd, g.addr, g.len, g.lkey) {
                return Err(VerbsError::Protection(
                    "receive SGE outside its region or wrong key",
                ));
            }
        }
        let mut qp = lock(&self.qp);
        let mut guard = qp.start_post_recv();
        // SAFETY: the SGEs lie in regions registered here (checked above); the device writes
        // them until the receive completes.
        unsafe { guard.construct_wr(wr.wr_id).setup_sge_list(&sges) };
        let Err(e) = guard.post() else {
            return Ok(());
        };
        let err = match e {
            PostRecvError::NotEnoughResources(_) => VerbsError::Full("receive"),
            e => VerbsError::Io(flatten("ibv_post_recv", &e)),
        };
        let wc = Wc {
            wr_id: wr.wr_id,
            status: WcStatus::WrFlushErr,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            qp_num: self.qpn,
            solicited: false,
        };
        self.refused(&qp, wc, &self.recv_cq, err)
    }
}
