//! SMC-R between engines: an [`SmcrEndpoint`] owns a RoCE device bound to one local IPv4
//! address (and, for SMC-R v1, a RoCE v1 device on its netdev) and the SMC-R link groups it has
//! with its peers; [`SmcrEndpoint::connect`] and [`SmcrListener::accept`] run the SMC-R v2 or
//! v1 CLC handshake over the TCP connection and end
//! with an [`SmcrStream`] whose bytes go by RDMA WRITE into the peer's RMB
//! ([`crate::transport::smcr`]), or with the TCP connection and the fallback's reason codes.
//!
//! What happens, as `af_smc.c` does it (`smc_connect_rdma`, `smc_listen_rdma_*`,
//! `smcr_serv_conf_first_link`, `smcr_clnt_conf_first_link`, `smcr_lgr_reg_rmbs`):
//!
//! - **First contact.** The server has no group with the client's GID: it creates an RC QP
//!   (RESET), offers its QPN, PSN, path MTU and the connection's RMB (rkey, address, size,
//!   token) in the Accept with the first-contact extension. The client creates its QP, takes
//!   it to RTS towards the server's, and confirms with its own; the server takes its QP up
//!   and the group's LLC flow machine ([`smc_core::llc::Llc`]) sends CONFIRM_LINK over the
//!   new link, the client answers it, and both sides' first contact ends. Only then does the
//!   connection carry data.
//! - **Reuse.** The server finds a group with the client's GID that has room
//!   (`smcr_max_conns_per_lgr`): it registers the connection's new RMB on the group (LLC
//!   CONFIRM_RKEY, answered by the client) and offers the group's link in its Accept; the
//!   client finds its group by the server's system id, GID and QPN (`smcr_lgr_match`: the
//!   Accept's QPN names the link), registers its RMB the same way and confirms. A client
//!   with no such group declines with `SYNCERR`.
//! - **Capability.** With the SYN option path ([`Capability::Option`], the maps of the BPF
//!   program smcd attaches), a client proposes only when the SYN-ACK carried the option and a
//!   server expects a Proposal only on a connection whose SYN had it and that it echoed; any
//!   other connection is plain TCP and no CLC byte is sent or read; [`Capability::Smcd`]
//!   takes those maps from the smcd the endpoint publishes to. [`Capability::Assume`] is for
//!   peers configured to be SMC-R endpoints.
//!
//! - **LLC versions.** A v2 group speaks the SMC-Rv2 LLC as the kernel's does
//!   (`smc_llc_init_msg_hdr`, `smc_llc_send_add_link`, `smc_wr_init_sge`): types 0x21..0x29
//!   with a 16-bit host-order length, CONFIRM_LINK with the negotiated `max_conns` when the
//!   peer is SMC-Rv2.1, ADD_LINK carrying all rkeys of the new link in its extension (no
//!   ADD_LINK_CONT), DELETE_RKEY v2, REQUEST_ADD_LINK from a client; its QPs receive into
//!   {44-byte slot, 8 KiB v2 buffer} and send long LLC messages from a v2 send buffer
//!   ([`crate::transport::smcr::RoceLink::start_in`]).
//! - **Links.** `max_links` comes from `smcr_max_links_per_lgr` (2 by default), not from
//!   the ports, as the kernel offers it. After the first contact the server's flow machine
//!   tries a second link (ADD_LINK): on its other port if it has one, else on the same one
//!   (a second QP on the device). Two ports on both sides make the group SYMMETRIC; one port
//!   on one side makes it asymmetric (ASYMMETRIC_LOCAL on the side with one port,
//!   ASYMMETRIC_PEER on the other), and no connection is placed on the asymmetric link
//!   (`smcr_lgr_conn_assign_link`); one port on both sides: the client rejects the ADD_LINK
//!   (`NO_ALT_PATH`) and the group keeps one link, as between two kernels.
//!
//! - **SMC-R v1.** An endpoint opened with [`SmcrConfig::roce_v1`] also has a RoCE v1 device
//!   on the netdev of its address (`SoftDevice::open_roce_v1`) and offers SMC-R v1 beside v2
//!   (or alone, with [`SmcrConfig::roce_v2`] off): its Proposal carries the v1 GID, MAC and
//!   system id in the base and the subnet of its address in the IP prefix area. A server offered
//!   both takes v2, as `smc_listen_find_device` tries RDMA v2 first, and v1 when only v1 is
//!   offered and the client is on its subnet (`smc_listen_prfx_check`, else `DIFFPREFIX`).
//!   Accept and Confirm are then the 68-byte v1 messages; the link runs over the RoCE v1
//!   devices, with the v1 LLC (44-byte messages, types 0x01..0x09, ADD_LINK_CONT for the
//!   rkeys of a new link). The v1 side of an endpoint is a second `Ep` with its
//!   own port and groups: a v1 group and a v2 group are never the same (`smcr_lgr_match`
//!   compares the version), and a v1 group has the kernel's v1 limits (255 connections, 2
//!   links); with [`SmcrConfig::alt`] the v1 side has a second RoCE v1 port on the second
//!   address's netdev, and its groups a second link there.
//!
//! A group's LLC runs on its links' completion threads (received messages) and on a timer
//! thread of the group (the flow machine's deadlines: CONFIRM_LINK waits, TEST_LINK).
//! Handshakes on one group never wait for another's: the table of groups is locked only to
//! look up and insert.

use crate::driver::conn::{ConnParams, SmcConn, SmcdInfo};
use crate::driver::handshake::Fallback;
use crate::layout::status::{
    ConnIdentity, LgrRecord, LgrSlot, LinkRecord, PortRecord, SmcrLgr, StatusArea,
};
use crate::settings::Settings;
use crate::sys::core_now;
use crate::transport::smcr::{
    Binding, ConnTable, PeerRmb, RECV_BUF, RoceLink, SmcrLink, V2_REGION,
};
use smc_core::close::SmcState;
use smc_core::conn::Config;
use smc_core::handshake::decide::Refusal;
use smc_core::handshake::smcr::{
    self as hs, LinkOffer, MAX_CONNS_PER_LGR, RmbOffer, SmcrCaps, SmcrPeer,
};
use smc_core::handshake::{CLC_WAIT_TIME, ClcReader, LocalCaps};
use smc_core::llc::{
    CreatedLink, FirstLink, LgrType, LinkIdx, Llc, LlcAction, LlcConfig, LocalPort, PeerQp, RmbId,
    RmbKey, StepFailed, Unregister,
};
use smc_proto::clc::{
    ClcMessage, Decline, Eid, Hostname, Proposal, ProposalBuilder, ReasonCode, SMC_V1, SMC_V2,
    SMCR_MAX_BUFSIZE_CODE, compress_bufsize, uncompress_bufsize,
};
use smc_rdma::soft::{SoftConfig, SoftDevice, SoftMr};
use smc_rdma::verbs::{
    Access, Device, Gid, Memory, MemoryRegion, Mtu, Pd, QpCaps, QpInit, QueuePair, RcPath, bring_up,
};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, Instant};

pub use crate::bpf::Maps;

/// How an endpoint knows that the peer of a TCP connection speaks SMC-R.
#[derive(Debug)]
pub enum Capability {
    /// The SMC TCP option in SYN and SYN-ACK, through the maps of smcd's BPF program.
    Option(Maps),
    /// Every peer is an SMC-R endpoint (configured so): a client always proposes, a server
    /// expects a Proposal on every connection.
    Assume,
    /// The SMC TCP option through the program of the smcd the endpoint publishes to
    /// ([`SmcrConfig::smcd`]): its maps come with the endpoint's registration, as an SMC-D
    /// engine's do, so each host's smcd serves the endpoints of its host. Opening fails when
    /// there is no such smcd or it has no option program attached.
    Smcd,
}

/// What an endpoint is made of.
#[derive(Debug)]
pub struct SmcrConfig {
    /// The local address: the device binds it (UDP 4791) and its GID is the IPv4-mapped
    /// form. Connections whose TCP source is another address are not offered SMC-R.
    pub addr: Ipv4Addr,
    /// The netdev holding `addr` (found with `ip` when `None`).
    pub netdev: Option<String>,
    /// A second RoCE port: its address and netdev (found with `ip` when `None`). A link
    /// group's second link (ADD_LINK) then goes over it, which makes the group symmetric
    /// with a two-port peer (without one, the second link is the asymmetric one, on the
    /// same port as the first), and the connections of a link that fails move to the other.
    pub alt: Option<(Ipv4Addr, Option<String>)>,
    /// The user EID both sides must share (SMC-Rv2 has no system EID).
    pub ueid: String,
    /// RMB and send-buffer size of each connection (rounded up to a power of two, at most
    /// 512 KiB: what the CLC's size code can name for SMC-R).
    pub ring: usize,
    /// `smcr_max_conns_per_lgr`.
    pub max_conns: u8,
    /// The engine settings (autocorking, autosplit, window rule, spin).
    pub settings: Settings,
    /// How peers are known to be SMC-R capable.
    pub capability: Capability,
    /// `smcr_testlink_time`: TEST_LINK after this long without an LLC message from the peer
    /// (zero: never). A link whose TEST_LINK goes unanswered ends its group.
    pub testlink_time: Duration,
    /// The smcd to publish to (its socket): its dumps then list this endpoint's devices,
    /// link groups, links and connections (`smcctl device show --smcr`, `linkgroup show
    /// --smcr`, `linkgroup links`, `ss`, `stats --smcr`), and its namespace's sysctls
    /// replace `settings`, `max_conns` and `testlink_time` (read for each new link group and
    /// connection, as the kernel reads them: `smcr_max_conns_per_lgr`,
    /// `smcr_max_links_per_lgr`, `smcr_testlink_time`, `smcr_max_send_wr`,
    /// `smcr_max_recv_wr`, `smcr_buf_type`, and the data path's). Without one, nobody sees
    /// them and the configuration here applies.
    pub smcd: Option<std::path::PathBuf>,
    /// CDCs and RDMA WRITEs up to the QP's inline limit go inline (the kernel's "send and
    /// write inline" optimization; on by default). Off: from registered memory, each
    /// connection with a ring of CDC slots (the ablation's baseline).
    pub inline: bool,
    /// Offer and accept SMC-R v2 over a RoCEv2 device on `addr` (on by default).
    pub roce_v2: bool,
    /// Offer and accept SMC-R v1 over a RoCE v1 device on the netdev of `addr` (off by
    /// default; needs `CAP_NET_RAW`). With `roce_v2` too, a server offered both takes v2.
    pub roce_v1: bool,
    /// The engine's pipeline chunk (`Settings::tx_chunk`) for SMC-R connections: 0 by default,
    /// so a write is pushed at the kernel's points only (autosplit cut, full window, end of
    /// the write), as `smc_tx_sendmsg` does. The engine's SMC-D default (8 KiB) pays there
    /// because an SMC-D publication is one store; on SMC-R each is an RDMA WRITE, a CDC
    /// SEND, their acknowledgement and a completion, and a 64 KiB write cut into eight
    /// pushes made the peer's window open 8 KiB at a time.
    pub tx_chunk: usize,
}

impl SmcrConfig {
    /// An endpoint on `addr` with the kernel's defaults: 64 KiB buffers (`smcr_buf_type`
    /// physically contiguous, the default RMB of a 64 KiB `tcp_rmem`), 255 connections a group.
    pub fn new(addr: Ipv4Addr, ueid: &str, capability: Capability) -> SmcrConfig {
        SmcrConfig {
            addr,
            netdev: None,
            alt: None,
            ueid: ueid.to_string(),
            ring: 64 << 10,
            max_conns: MAX_CONNS_PER_LGR,
            settings: Settings::default(),
            capability,
            testlink_time: smc_core::llc::SMC_LLC_TESTLINK_DEFAULT_TIME,
            smcd: None,
            inline: true,
            roce_v2: true,
            roce_v1: false,
            tx_chunk: 0,
        }
    }
}

/// Counters of an endpoint.
#[derive(Debug, Default)]
pub struct SmcrStats {
    /// Connections that created a link group.
    pub first_contacts: AtomicU64,
    /// Connections that joined an existing group.
    pub reused: AtomicU64,
    /// Connections that continued over TCP.
    pub fallbacks: AtomicU64,
    /// Connections whose buffers an ended connection of their group had before (the
    /// kernel's `SMC_STAT_RMB_REUSE`); the others' were made for them.
    pub bufs_reused: AtomicU64,
}

/// A local RoCE device and the SMC-R link groups over it.
#[derive(Debug, Clone)]
pub struct SmcrEndpoint(Arc<Ep>);

/// One RoCE port of an endpoint: a soft device on one local address.
#[derive(Debug)]
struct Port {
    dev: SoftDevice,
    pd: Pd,
    addr: Ipv4Addr,
    local: LocalPort,
    /// The device's name and its netdev's ifindex (in the namespace it was opened in).
    name: String,
    ifindex: u32,
    /// Links on the port (`lnk_cnt_by_port`).
    links: AtomicU32,
    /// Its record in the status area.
    slot: Option<LgrSlot>,
}

impl Port {
    fn open(i: usize, addr: Ipv4Addr, netdev: Option<String>) -> io::Result<Port> {
        let dev = SoftDevice::open(SoftConfig {
            name: format!("sroce-{addr}"),
            addr,
            netdev,
            steering: None,
        })?;
        Self::with_device(i, addr, dev)
    }

    /// RoCE v1 port `i` on `netdev` (which holds `addr`).
    fn open_v1(i: usize, addr: Ipv4Addr, netdev: &str) -> io::Result<Port> {
        let dev = SoftDevice::open_roce_v1(format!("sroce1-{netdev}"), netdev)?;
        Self::with_device(i, addr, dev)
    }

    fn with_device(i: usize, addr: Ipv4Addr, dev: SoftDevice) -> io::Result<Port> {
        let info = dev.info();
        let p = info
            .ports
            .first()
            .ok_or_else(|| io::Error::other("device without a port"))?;
        let local = LocalPort {
            dev: i as u32,
            port: p.port,
            gid: dev.gid().0,
            mac: p.mac,
            path_mtu: p.active_mtu as u8,
        };
        let ifindex = std::ffi::CString::new(p.netdev.clone())
            // SAFETY: a NUL-terminated name; if_nametoindex only reads it.
            .map(|n| unsafe { libc::if_nametoindex(n.as_ptr()) })
            .unwrap_or(0);
        Ok(Port {
            pd: dev.alloc_pd(),
            name: info.name.clone(),
            dev,
            addr,
            local,
            ifindex,
            links: AtomicU32::new(0),
            slot: None,
        })
    }

    /// Writes the port's record (`GET_DEV_SMCR`).
    fn publish(&self) {
        let Some(slot) = &self.slot else { return };
        let active = self
            .dev
            .info()
            .ports
            .first()
            .is_none_or(|p| p.state == smc_rdma::verbs::PortState::Active);
        slot.publish_port(&PortRecord {
            ib_dev: self.name.clone(),
            ib_port: self.local.port,
            net_dev: self.ifindex,
            active,
            lnk_cnt: self.links.load(Ordering::Relaxed),
            gid: gid_u128(&self.local.gid),
        });
    }
}

/// A link's hold on its port: counted in the port's record while it lasts.
#[derive(Debug)]
struct PortUse {
    ep: Weak<Ep>,
    port: usize,
}

impl PortUse {
    fn new(ep: &Arc<Ep>, port: usize) -> Arc<PortUse> {
        if let Some(p) = ep.ports.get(port) {
            p.links.fetch_add(1, Ordering::Relaxed);
            p.publish();
        }
        Arc::new(PortUse {
            ep: Arc::downgrade(ep),
            port,
        })
    }
}

impl Drop for PortUse {
    fn drop(&mut self) {
        if let Some(ep) = self.ep.upgrade()
            && let Some(p) = ep.ports.get(self.port)
        {
            p.links.fetch_sub(1, Ordering::Relaxed);
            p.publish();
        }
    }
}

#[derive(Debug)]
struct Ep {
    /// The SMC-R version of this side's ports and groups: `SMC_V2` (RoCEv2) or `SMC_V1`
    /// (RoCE v1).
    version: u8,
    /// The v1 side of a v2 endpoint that speaks both (module docs); a v1-only endpoint is a
    /// v1 `Ep` itself.
    v1: Option<Arc<Ep>>,
    /// The prefix length of the ports' address on its netdev (the v1 Proposal's IP prefix
    /// area and the server's check of it).
    prefix_len: u8,
    /// The first is the one CLC names (the TCP connection's address); a second carries the
    /// groups' second links.
    ports: Vec<Port>,
    caps: LocalCaps,
    smcr: SmcrCaps,
    ring: usize,
    /// The settings without smcd (`SmcrConfig::settings` with its `max_conns` and
    /// `testlink_time`).
    settings: Settings,
    /// `SmcrConfig::inline`.
    inline: bool,
    /// `SmcrConfig::tx_chunk`.
    tx_chunk: usize,
    option: Option<Maps>,
    groups: Mutex<Vec<Arc<Group>>>,
    next_lgr: AtomicU32,
    next_token: AtomicU32,
    status: Arc<StatusArea>,
    /// The smcd it publishes to, if any (kept open: smcd forgets an engine that goes).
    _session: Option<Arc<crate::ipc::SmcdSession>>,
    /// Shared by the v1 and v2 sides.
    stats: Arc<SmcrStats>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    u32::from_ne_bytes(b)
}

fn hostname() -> Hostname {
    let u = rustix::system::uname();
    Hostname::new(&u.nodename().to_string_lossy())
}

/// The netdev holding `addr` and the address's prefix length there (`getifaddrs`, in the
/// calling thread's network namespace).
fn netdev_of(addr: Ipv4Addr) -> Option<(String, u8)> {
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifap` with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return None;
    }
    let mut found = None;
    let mut at = ifap;
    while !at.is_null() {
        // SAFETY: a node of the list getifaddrs returned, alive until freeifaddrs; its
        // addresses are sockaddr_in when the family says AF_INET.
        unsafe {
            let i = &*at;
            if !i.ifa_addr.is_null()
                && i32::from((*i.ifa_addr).sa_family) == libc::AF_INET
                && !i.ifa_netmask.is_null()
            {
                let a = &*(i.ifa_addr as *const libc::sockaddr_in);
                let m = &*(i.ifa_netmask as *const libc::sockaddr_in);
                if Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)) == addr {
                    let name = std::ffi::CStr::from_ptr(i.ifa_name)
                        .to_string_lossy()
                        .into_owned();
                    found = Some((name, u32::from_be(m.sin_addr.s_addr).count_ones() as u8));
                    break;
                }
            }
            at = i.ifa_next;
        }
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(ifap) };
    found
}

fn gid_u128(g: &[u8; 16]) -> u128 {
    u128::from_be_bytes(*g)
}

fn proto_err(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// Reads exactly one CLC message (never a byte more: what follows is the application's).
fn read_clc(sock: &mut TcpStream) -> io::Result<Result<ClcMessage, ReasonCode>> {
    let mut r = ClcReader::new();
    let mut buf = [0u8; 1024];
    loop {
        let want = r.wants().min(buf.len());
        let n = match sock.read(&mut buf[..want]) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed during the CLC handshake",
                ));
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "CLC handshake timed out",
                ));
            }
            Err(e) => return Err(e),
        };
        if let Some(m) = r.push(&buf[..n]) {
            return Ok(m.map_err(|e| e.decline_reason()));
        }
    }
}

/// The local half of a link before it is up.
struct NewQp {
    qp: <SoftDevice as Device>::Qp,
    scq: Arc<<SoftDevice as Device>::Cq>,
    rcq: Arc<<SoftDevice as Device>::Cq>,
    recv: SoftMr,
    /// SMC-Rv2: the receive spill and send buffer of long LLC messages.
    v2: Option<SoftMr>,
    psn: u32,
    /// The endpoint's port it is on.
    port: usize,
    /// Receive buffers to post.
    recv_wrs: u32,
}

impl std::fmt::Debug for NewQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewQp")
            .field("qpn", &self.qp.qp_num())
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl NewQp {
    /// How a CLC message names it.
    fn offer(&self, mtu: u8) -> LinkOffer {
        LinkOffer {
            qpn: self.qp.qp_num(),
            psn: self.psn,
            mtu,
        }
    }
}

/// A connection's buffers: its RMB (the peer writes into it) and its send buffer, each
/// registered on every port's device, and without inline sends its CDC slots. The link group
/// keeps them when the connection ends, for its next one (the kernel's `smc_buf_get_slot`).
#[derive(Debug)]
struct Regs {
    /// Per port: (RMB, send buffer).
    mrs: Vec<(SoftMr, SoftMr)>,
    /// Without inline sends, per port: the CDC slots.
    cdc: Vec<SoftMr>,
}

impl Regs {
    /// The RMB's and the send buffer's size (the same memory is registered on every port).
    fn sizes(&self) -> (usize, usize) {
        self.mrs
            .first()
            .map_or((0, 0), |(rmb, snd)| (rmb.len(), snd.len()))
    }

    /// Clears the RMB and the send buffer for their next connection (`smcr_buf_unuse` and
    /// `smc_buf_unuse` zero them).
    fn clear(&self) {
        if let Some((rmb, snd)) = self.mrs.first() {
            rmb.memory().zero();
            snd.memory().zero();
        }
    }
}

/// A connection's buffers under the connection's token.
struct Bufs {
    token: u32,
    regs: Arc<Regs>,
    /// Taken from its group's spares rather than made (`SMC_STAT_RMB_REUSE`, not `_ALLOC`).
    reused: bool,
}

impl Bufs {
    fn offer(&self, port: usize) -> RmbOffer {
        let rmb = &self.regs.mrs[port].0;
        RmbOffer {
            token: self.token,
            rkey: rmb.rkey(),
            addr: rmb.addr(),
            len: rmb.len(),
        }
    }

    /// The RMB's key on each port.
    fn keys(&self) -> Vec<RmbKey> {
        self.regs
            .mrs
            .iter()
            .map(|(rmb, _)| RmbKey {
                rkey: rmb.rkey(),
                vaddr: rmb.addr(),
            })
            .collect()
    }

    /// The send buffer's and the CDC slots' (address, lkey) on each port (the CDC slots'
    /// (0, 0) with inline sends).
    fn sndbufs(&self) -> Vec<((u64, u32), (u64, u32))> {
        self.regs
            .mrs
            .iter()
            .enumerate()
            .map(|(i, (_, snd))| {
                let cdc = self
                    .regs
                    .cdc
                    .get(i)
                    .map_or((0, 0), |m| (m.addr(), m.lkey()));
                ((snd.addr(), snd.lkey()), cdc)
            })
            .collect()
    }
}

/// A connection made known to its group before its handshake ends (see
/// [`RoceLink::reserve`]); forgotten again unless kept.
struct Reservation {
    link: Arc<RoceLink<SoftDevice>>,
    token: u32,
    keep: bool,
}

impl Reservation {
    fn new(link: &Arc<RoceLink<SoftDevice>>, token: u32) -> Reservation {
        link.reserve(token);
        Reservation {
            link: Arc::clone(link),
            token,
            keep: false,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.keep {
            self.link.unreserve(self.token);
        }
    }
}

impl SmcrEndpoint {
    /// Opens the device on `cfg.addr` (RoCEv2), and with `cfg.roce_v1` the RoCE v1 device on
    /// its netdev.
    pub fn open(cfg: SmcrConfig) -> io::Result<SmcrEndpoint> {
        let ueid = Eid::new(&cfg.ueid)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a valid user EID"))?;
        if !cfg.roce_v2 && !cfg.roce_v1 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an SMC-R endpoint needs SMC-R v2 or v1",
            ));
        }
        let (found_netdev, prefix_len) = netdev_of(cfg.addr).unwrap_or((String::new(), 32));
        let mut ports = Vec::new();
        if cfg.roce_v2 {
            ports.push(Port::open(0, cfg.addr, cfg.netdev.clone())?);
            if let Some((addr, netdev)) = cfg.alt.clone() {
                if addr == cfg.addr {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "the second port needs another address",
                    ));
                }
                ports.push(Port::open(1, addr, netdev)?);
            }
        }
        let mut v1_ports = Vec::new();
        if cfg.roce_v1 {
            let netdev = cfg.netdev.clone().unwrap_or(found_netdev);
            v1_ports.push(Port::open_v1(0, cfg.addr, &netdev)?);
            // The second port's netdev carries a RoCE v1 device too.
            if let Some((addr, netdev)) = cfg.alt.clone() {
                let netdev = match netdev {
                    Some(n) => n,
                    None => netdev_of(addr).map(|(n, _)| n).ok_or_else(|| {
                        io::Error::new(io::ErrorKind::NotFound, format!("no netdev holds {addr}"))
                    })?,
                };
                v1_ports.push(Port::open_v1(1, addr, &netdev)?);
            }
        }
        let session = match &cfg.smcd {
            Some(path) => Some(Arc::new(crate::ipc::SmcdSession::open(path)?)),
            None => None,
        };
        let status = match &session {
            Some(s) => Arc::clone(&s.status),
            None => StatusArea::private()?,
        };
        for p in ports.iter_mut().chain(v1_ports.iter_mut()) {
            p.slot = Some(status.lgr_slot());
            p.publish();
        }
        // The system id: two random bytes and the MAC of the first RoCE port
        // (`smc_ib_define_local_systemid`), the same for both versions.
        let mac = ports
            .first()
            .or(v1_ports.first())
            .map_or([0; 6], |p| p.local.mac);
        let r = random_u32().to_ne_bytes();
        let mut peer_id = [0u8; 8];
        peer_id[..2].copy_from_slice(&r[..2]);
        peer_id[2..].copy_from_slice(&mac);
        let max_conns = cfg
            .max_conns
            .clamp(hs::MIN_CONNS_PER_LGR, MAX_CONNS_PER_LGR);
        let stats = Arc::new(SmcrStats::default());
        let option = match cfg.capability {
            Capability::Option(m) => Some(m),
            Capability::Assume => None,
            Capability::Smcd => Some(
                session
                    .as_ref()
                    .and_then(|s| s.syn_option.as_ref())
                    .ok_or_else(|| {
                        io::Error::new(
                            io::ErrorKind::Unsupported,
                            "Capability::Smcd needs SmcrConfig::smcd naming an smcd with the SMC option program attached",
                        )
                    })?
                    .try_clone()?,
            ),
        };
        let side = |version: u8, ports: Vec<Port>, v1: Option<Arc<Ep>>, option: Option<Maps>| {
            let gid = ports[0].local.gid;
            Ep {
                version,
                v1,
                prefix_len,
                ports,
                caps: LocalCaps {
                    gid: Default::default(),
                    chid: 0xffff,
                    seid: None,
                    ueids: vec![ueid],
                    hostname: hostname(),
                },
                smcr: SmcrCaps {
                    peer_id,
                    gid,
                    mac,
                    max_conns,
                    // The most `smcr_max_links_per_lgr` may be; `smcr_caps` applies the sysctl.
                    max_links: hs::MAX_LINKS_PER_LGR,
                },
                // A size the CLC's size code names exactly: a power of two, 16 KiB to 512 KiB.
                ring: uncompress_bufsize(compress_bufsize(cfg.ring, SMCR_MAX_BUFSIZE_CODE)),
                settings: Settings {
                    max_conns_per_lgr: u32::from(max_conns),
                    smcr_testlink_time: cfg.testlink_time,
                    ..cfg.settings.clone()
                },
                inline: cfg.inline,
                tx_chunk: cfg.tx_chunk,
                option,
                groups: Mutex::new(Vec::new()),
                next_lgr: AtomicU32::new(random_u32() & 0xffff_ff00 | 1),
                next_token: AtomicU32::new(random_u32() | 1),
                status: Arc::clone(&status),
                _session: session.clone(),
                stats: Arc::clone(&stats),
            }
        };
        let ep = if ports.is_empty() {
            side(SMC_V1, v1_ports, None, option)
        } else {
            let v1 = (!v1_ports.is_empty()).then(|| Arc::new(side(SMC_V1, v1_ports, None, None)));
            side(SMC_V2, ports, v1, option)
        };
        Ok(SmcrEndpoint(Arc::new(ep)))
    }

    /// The RoCE v1 side's GID, if the endpoint speaks SMC-R v1.
    pub fn v1_gid(&self) -> Option<Gid> {
        self.0.v1_side().map(|e| e.ports[0].dev.gid())
    }

    /// The first device's GID (the one CLC names).
    pub fn gid(&self) -> Gid {
        self.0.ports[0].dev.gid()
    }

    /// The first device (its counters; `smcctl device show --smcr` material).
    pub fn device(&self) -> &SoftDevice {
        &self.0.ports[0].dev
    }

    /// Every device: the first, the second port's if there is one, the RoCE v1 side's.
    pub fn devices(&self) -> impl Iterator<Item = &SoftDevice> {
        let v1 = self.0.v1.iter().flat_map(|e| e.ports.iter());
        self.0.ports.iter().chain(v1).map(|p| &p.dev)
    }

    /// The endpoint's counters.
    pub fn stats(&self) -> &SmcrStats {
        &self.0.stats
    }

    /// The link groups that are up: (our id, client role, connections, LLC group type).
    pub fn link_groups(&self) -> Vec<LinkGroupInfo> {
        let mut groups = lock(&self.0.groups).clone();
        if let Some(e) = &self.0.v1 {
            groups.extend(lock(&e.groups).iter().cloned());
        }
        groups
            .iter()
            .map(|g| {
                let sh = lock(&g.sh);
                let slots = read(&g.links);
                let links = sh
                    .llc
                    .links()
                    .filter_map(|(i, l)| {
                        let s = slots.get(i.index())?.as_ref()?;
                        Some(LinkInfo {
                            idx: i.index() as u8,
                            link_id: l.link_id,
                            active: l.state == smc_core::llc::LinkState::Active,
                            asym: l.asym,
                            failed: s.link.failed(),
                            qpn: s.link.qp_num(),
                            peer_qpn: s.peer_qpn,
                            gid: Gid(l.port.gid),
                            peer_gid: Gid(l.peer.map_or([0; 16], |p| p.gid)),
                            conns: sh.members.values().filter(|m| m.link == i).count() as u32,
                            queue_sizes: {
                                let c = s.link.caps();
                                (c.max_send_wr, c.max_recv_wr)
                            },
                        })
                    })
                    .collect();
                LinkGroupInfo {
                    lgr_id: g.lgr_id,
                    version: g.version,
                    client: g.client,
                    conns: sh.conns,
                    lgr_type: sh.lgr_type,
                    peer_gid: Gid(g.peer_gid),
                    up: sh.first == Some(Ok(())) && sh.dead.is_none(),
                    max_conns: g.max_conns,
                    max_links: sh.llc.config().max_links,
                    buf_type: g.buf_type,
                    spare_bufs: sh.spare.len(),
                    links,
                }
            })
            .collect()
    }

    /// Connects to `addr`: SMC-R if the peer takes it, else TCP.
    pub fn connect(&self, addr: SocketAddr) -> io::Result<SmcrStream> {
        use rustix::net::{AddressFamily, SocketFlags, SocketType, ipproto};
        let ep = &self.0;
        let SocketAddr::V4(_) = addr else {
            // The device has an IPv4 GID only.
            let sock = TcpStream::connect(addr)?;
            return ep.counted(
                Ok(ep.plain(sock, Fallback::local(ReasonCode::NOSMCRDEV))),
                true,
            );
        };
        let fd = rustix::net::socket_with(
            AddressFamily::INET,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            Some(ipproto::TCP),
        )?;
        // From the device's address: the GID the CLC names is the TCP connection's source,
        // as the kernel's device is the one of the route's netdev. The port is left to
        // connect (IP_BIND_ADDRESS_NO_PORT), which picks it for the four-tuple as a plain
        // connect does: bind would need a port free towards every peer, and a client that
        // closes many short connections first holds its ports in TIME_WAIT for a minute
        // (crr at 2,000 connections a second from one address ran out of them and slowed
        // to a tenth).
        let on: libc::c_int = 1;
        // SAFETY: setsockopt reads an int of the size given from a live local; fd is an open
        // socket we own.
        let r = unsafe {
            libc::setsockopt(
                rustix::fd::AsRawFd::as_raw_fd(&fd),
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                (&raw const on).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            tracing::debug!("IP_BIND_ADDRESS_NO_PORT: {}", io::Error::last_os_error());
        }
        rustix::net::bind(&fd, &SocketAddr::from((ep.ports[0].addr, 0)))?;
        if let Some(maps) = &ep.option {
            maps.mark_client(&fd)?;
        }
        rustix::net::connect(&fd, &addr)?;
        let sock = TcpStream::from(fd);
        ep.counted(Ep::connected(ep, sock), true)
    }

    /// [`SmcrEndpoint::connect`] for an event loop: returns at once, the TCP connect and the
    /// handshake run on a worker (the kernel's `connect_work` for a non-blocking socket), and
    /// the returned [`SmcrConnecting`] turns readable when they have ended.
    pub fn connect_nonblocking(&self, addr: SocketAddr) -> io::Result<SmcrConnecting> {
        let out = Outcomes::new()?;
        let (me, o) = (self.clone(), Arc::clone(&out));
        std::thread::Builder::new()
            .name("smcr-connect".into())
            .spawn(move || o.push(me.connect(addr).map(|s| (s, addr))))?;
        Ok(SmcrConnecting { out })
    }

    /// Listens on `addr`.
    pub fn listen(&self, addr: SocketAddr) -> io::Result<SmcrListener> {
        let sock = TcpListener::bind(addr)?;
        let keys = match &self.0.option {
            Some(maps) => maps.register_listening_socket(&sock)?,
            None => Vec::new(),
        };
        Ok(SmcrListener {
            ep: Arc::clone(&self.0),
            sock,
            keys,
            acceptor: std::sync::OnceLock::new(),
            starting: Mutex::new(()),
            nonblocking: AtomicBool::new(false),
        })
    }
}

/// What `smcctl linkgroup show --smcr` would show of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkGroupInfo {
    /// Our id of the group.
    pub lgr_id: u32,
    /// Its SMC-R version (2: over RoCEv2, 1: over RoCE v1).
    pub version: u8,
    /// We are its client.
    pub client: bool,
    /// Connections in it.
    pub conns: u32,
    /// Its type.
    pub lgr_type: LgrType,
    /// The peer's GID (its first port's, as CLC named it).
    pub peer_gid: Gid,
    /// First contact done and not terminated.
    pub up: bool,
    /// `max_conns` and `max_links` as negotiated.
    pub max_conns: u8,
    /// See [`LinkGroupInfo::max_conns`].
    pub max_links: u8,
    /// `smcr_buf_type` when it was made.
    pub buf_type: u8,
    /// Buffers of ended connections it keeps for its next ones.
    pub spare_bufs: usize,
    /// Its links.
    pub links: Vec<LinkInfo>,
}

/// What `smcctl linkgroup links` would show of one link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    /// The slot (`link_idx`).
    pub idx: u8,
    /// The wire's link id.
    pub link_id: u8,
    /// It carries connections (`SMC_LNK_ACTIVE`).
    pub active: bool,
    /// The asymmetric link of an asymmetric group (`link_is_asym`): no connection is placed
    /// on it. The kernel's netlink has no attribute for it; `linkgroup links` shows it by
    /// its GIDs (both links of the group share the GID of the side with one port).
    pub asym: bool,
    /// Its QP failed or was taken down.
    pub failed: bool,
    /// Our QP.
    pub qpn: u32,
    /// The peer's.
    pub peer_qpn: u32,
    /// Our GID on it.
    pub gid: Gid,
    /// The peer's.
    pub peer_gid: Gid,
    /// Connections sending on it.
    pub conns: u32,
    /// Its QP's send and receive queue sizes (`smcr_max_send_wr` × 3, `smcr_max_recv_wr`).
    pub queue_sizes: (u32, u32),
}

impl Ep {
    /// The side that speaks SMC-R v1: this one, or the v1 side of a v2 endpoint.
    fn v1_side(self: &Arc<Self>) -> Option<Arc<Ep>> {
        if self.version < SMC_V2 {
            Some(Arc::clone(self))
        } else {
            self.v1.clone()
        }
    }

    /// The server's side of a connection its listener took: SMC-R when the client offers
    /// it, else TCP with the reason.
    fn accepted(
        self: &Arc<Self>,
        sock: TcpStream,
        from: SocketAddr,
    ) -> io::Result<(SmcrStream, SocketAddr)> {
        if let Some(maps) = &self.option {
            // The SYN's option and our echo say whether a Proposal follows: nothing is read
            // from a connection that will not carry one.
            let runs = maps.sock_option(&sock).ok().and_then(|o| o.clc_runs());
            if runs != Some(true) {
                let plain = self.plain(sock, Fallback::local(ReasonCode::PEERNOSMC));
                return Ok((self.counted(Ok(plain), false)?, from));
            }
        }
        Ok((self.counted(Ep::server(self, sock), false)?, from))
    }

    /// The client once its TCP connection is up: SMC-R if the peer takes it, else TCP.
    fn connected(self: &Arc<Self>, sock: TcpStream) -> io::Result<SmcrStream> {
        if let Some(maps) = &self.option
            && maps.sock_option(&sock).ok().and_then(|o| o.clc_runs()) != Some(true)
        {
            return Ok(self.plain(sock, Fallback::local(ReasonCode::PEERNOSMC)));
        }
        if sock.local_addr()?.ip() != IpAddr::V4(self.ports[0].addr) {
            // The peer expects CLC now: a Decline tells it (smc_connect_decline_fallback).
            return self.decline(sock, ReasonCode::NOSMCRDEV);
        }
        Ep::client(self, sock)
    }

    /// Counts how a handshake on a TCP connection ended, as the kernel's statistics do: a
    /// fallback by its reason (`smc_stat_fallback`; not per technology, so SMC-D's and
    /// SMC-R's share the table), an error as a handshake error (`hshake_err_cnt`).
    fn counted(&self, r: io::Result<SmcrStream>, client: bool) -> io::Result<SmcrStream> {
        use crate::layout::status as st;
        match &r {
            Ok(SmcrStream {
                kind: Kind::Tcp { fallback, .. },
            }) => {
                let base = if client {
                    st::T_CLNT_FBACK
                } else {
                    st::T_SRV_FBACK
                };
                self.status.add(base + st::fback_index(fallback.local), 1);
            }
            Ok(_) => {}
            Err(_) => self.status.add(
                if client {
                    st::T_CLNT_HS_ERR
                } else {
                    st::T_SRV_HS_ERR
                },
                1,
            ),
        }
        r
    }

    fn plain(&self, sock: TcpStream, fallback: Fallback) -> SmcrStream {
        let _ = sock.set_read_timeout(None);
        self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        SmcrStream {
            kind: Kind::Tcp { sock, fallback },
        }
    }

    /// Declines with `r` (the peer falls back too) and continues over TCP.
    fn decline(&self, mut sock: TcpStream, r: ReasonCode) -> io::Result<SmcrStream> {
        sock.write_all(&ClcMessage::Decline(Decline::new(r, self.version)).to_vec())?;
        Ok(self.plain(sock, Fallback::local(r)))
    }

    fn refused(&self, sock: TcpStream, r: Refusal) -> io::Result<SmcrStream> {
        match r {
            Refusal::Decline(r) => self.decline(sock, r),
            Refusal::PeerDeclined { peer, .. } => Ok(self.plain(
                sock,
                Fallback {
                    local: ReasonCode::PEERDECL,
                    peer,
                },
            )),
        }
    }

    /// The RMB and send-buffer sizes of a new connection: the namespace's `net.smc.rmem` and
    /// `net.smc.wmem` when the endpoint publishes to smcd (read for each connection, as the
    /// kernel's `__smc_buf_create` reads them), else [`SmcrConfig::ring`] for both. A size
    /// the CLC's size code names (a power of two, 16 KiB to 512 KiB for SMC-R).
    fn buf_sizes(&self) -> (usize, usize) {
        let sysctl = self
            ._session
            .as_ref()
            .and_then(|s| s.sysctl.as_ref())
            .and_then(|p| p.load());
        match sysctl {
            Some((v, _)) => {
                let s = Settings::from_values(&v);
                let len = |n: u32| {
                    uncompress_bufsize(compress_bufsize(n as usize, SMCR_MAX_BUFSIZE_CODE))
                };
                (len(s.rmem), len(s.wmem))
            }
            None => (self.ring, self.ring),
        }
    }

    /// A new connection's buffers: the spares of `group` if it has some of the sizes it
    /// needs (as the kernel reuses a group's free buffers of a size class), else new ones;
    /// under a new token either way.
    fn bufs(&self, group: Option<&Group>) -> io::Result<Bufs> {
        let mut token = 0;
        while token == 0 {
            token = self.next_token.fetch_add(1, Ordering::Relaxed);
        }
        let (rmb_len, snd_len) = self.buf_sizes();
        if let Some(regs) = group.and_then(|g| g.take_spare((rmb_len, snd_len))) {
            return Ok(Bufs {
                token,
                regs,
                reused: true,
            });
        }
        let (rmb, snd) = (Memory::new(rmb_len)?, Memory::new(snd_len)?);
        // One CDC slot per send-queue entry a link of this endpoint may have.
        let cdc_mem = if self.inline {
            None
        } else {
            let s = self.settings();
            let sq = s.smcr_max_send_wr.saturating_mul(3) as usize;
            Some(Memory::new(sq.max(6) * crate::transport::smcr::CDC_SLOT)?)
        };
        let mut mrs = Vec::with_capacity(self.ports.len());
        let mut cdc = Vec::new();
        for p in &self.ports {
            let mr = |m: &Arc<Memory>, acc| {
                p.dev
                    .reg_mr(p.pd, Arc::clone(m), acc)
                    .map_err(io::Error::other)
            };
            mrs.push((
                mr(&rmb, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?,
                mr(&snd, Access::LOCAL_WRITE)?,
            ));
            if let Some(m) = &cdc_mem {
                cdc.push(mr(m, Access::LOCAL_WRITE)?);
            }
        }
        Ok(Bufs {
            token,
            regs: Arc::new(Regs { mrs, cdc }),
            reused: false,
        })
    }

    fn new_qp(&self, port: usize) -> io::Result<NewQp> {
        let e = io::Error::other;
        // smcr_max_send_wr slots, three work requests each (a CDC and up to two RDMA
        // WRITEs: smc_ib_create_queue_pair); smcr_max_recv_wr receive buffers.
        let s = self.settings();
        let max = smc_rdma::soft::MAX_WR;
        let send_wrs = s.smcr_max_send_wr.saturating_mul(3).clamp(6, max);
        let recv_wrs = s.smcr_max_recv_wr.clamp(2, max);
        let p = self
            .ports
            .get(port)
            .ok_or_else(|| io::Error::other("no such port"))?;
        let v2 = self.version >= SMC_V2;
        let scq = p.dev.create_cq(1024).map_err(e)?;
        let rcq = p.dev.create_cq(1024).map_err(e)?;
        let qp = p
            .dev
            .create_qp(
                p.pd,
                QpInit {
                    send_cq: Arc::clone(&scq),
                    recv_cq: Arc::clone(&rcq),
                    caps: QpCaps {
                        max_send_wr: send_wrs,
                        max_recv_wr: recv_wrs,
                        max_send_sge: 2,
                        // SMC-Rv2 receives scatter over two entries (`smc_ib_create_queue_pair`).
                        max_recv_sge: if v2 { 2 } else { 1 },
                        max_inline_data: 64,
                    },
                    sq_sig_all: false,
                },
            )
            .map_err(e)?;
        let recv = p
            .dev
            .reg_mr(
                p.pd,
                Memory::new(recv_wrs as usize * RECV_BUF as usize)?,
                Access::LOCAL_WRITE,
            )
            .map_err(e)?;
        let v2 = if v2 {
            Some(
                p.dev
                    .reg_mr(p.pd, Memory::new(V2_REGION)?, Access::LOCAL_WRITE)
                    .map_err(e)?,
            )
        } else {
            None
        };
        Ok(NewQp {
            qp,
            scq,
            rcq,
            recv,
            v2,
            psn: random_u32() & 0x00ff_ffff,
            port,
            recv_wrs,
        })
    }

    /// Takes `q` up towards the peer's QP and starts the link in the group of `table`.
    fn start_link(
        &self,
        q: NewQp,
        peer: &PeerQp,
        table: &ConnTable,
    ) -> io::Result<Arc<RoceLink<SoftDevice>>> {
        let own = self.ports[q.port].local.path_mtu;
        let mtu = Mtu::from_ib(peer.mtu.min(own)).unwrap_or(Mtu::M1024);
        let path = RcPath {
            mtu,
            ..RcPath::default()
        };
        bring_up(&q.qp, &path, peer.qpn, Gid(peer.gid), peer.psn, q.psn)
            .map_err(io::Error::other)?;
        RoceLink::start_in(q.qp, q.scq, q.rcq, q.recv, table.clone(), q.recv_wrs, q.v2)
    }

    /// The settings now: the namespace's sysctls with smcd, else the configuration's.
    fn settings(&self) -> Settings {
        self._session
            .as_ref()
            .and_then(|s| s.sysctl.as_ref())
            .and_then(|p| p.load())
            .map_or_else(|| self.settings.clone(), |(v, _)| Settings::from_values(&v))
    }

    /// What CLC offers now: `max_conns` and `max_links` from the settings. The kernel offers
    /// `smcr_max_links_per_lgr` whatever devices it has (`smc_clc_send_proposal`,
    /// `smc_clc_srv_v2x_features_validate`): a group with one port on a side gets its
    /// second link on that port (asymmetric).
    fn smcr_caps(&self) -> SmcrCaps {
        let s = self.settings();
        SmcrCaps {
            max_conns: (s.max_conns_per_lgr.min(255) as u8)
                .clamp(hs::MIN_CONNS_PER_LGR, MAX_CONNS_PER_LGR),
            max_links: s.max_links_per_lgr.clamp(1, self.smcr.max_links),
            ..self.smcr
        }
    }

    /// [`Ep::smcr_caps`] as a CLC Accept or Confirm names the link on `port`: that port's GID
    /// and MAC beside the link's QPN, as the kernel's `smc_clc_send_confirm_accept` takes them
    /// from the connection's link.
    fn caps_on(&self, port: usize) -> SmcrCaps {
        let p = &self.ports[port].local;
        SmcrCaps {
            gid: p.gid,
            mac: p.mac,
            ..self.smcr_caps()
        }
    }

    /// The core's configuration, receiving into an RMB of `rmb` bytes, writing into the
    /// peer's of `peer_rmb`, from a send buffer of `sndbuf`.
    fn conn_config(&self, rmb: usize, peer_rmb: usize, sndbuf: usize) -> Config {
        let s = &self.settings();
        Config {
            autocorking_size: s.autocorking_size as usize,
            autosplit_size: s.autosplit_size as usize,
            tx_chunk: self.tx_chunk,
            wnd_rule: s.wnd_update_rule,
            ..Config::smcr(rmb, peer_rmb, sndbuf)
        }
    }

    /// The connection joins `group`: it sends on our link `via`, and the peer's RMB is the
    /// one its CLC message named for the peer's end of our link `named`.
    #[allow(clippy::too_many_arguments)]
    fn established(
        self: &Arc<Self>,
        sock: TcpStream,
        group: Arc<Group>,
        bufs: Bufs,
        peer: &SmcrPeer,
        mut resv: Reservation,
        named: LinkIdx,
        via: LinkIdx,
    ) -> io::Result<SmcrStream> {
        let clc_key = RmbKey {
            rkey: peer.rmb.rkey,
            vaddr: peer.rmb.addr,
        };
        let mut sh = lock(&group.sh);
        let found = sh.llc.rtoken_add(named, clc_key).and_then(|idx| {
            let key = sh.llc.rtoken(idx, via)?;
            let slot = group.slot(via)?;
            Some((idx, key, slot))
        });
        let Some((rtoken, key, slot)) = found else {
            drop(sh);
            tracing::debug!("SMC-R: no rtoken for the peer's RMB on our link");
            return self.decline(sock, ReasonCode::ERR_RTOK);
        };
        let _ = sock.set_read_timeout(None);
        resv.keep = true;
        let sndbufs = bufs.sndbufs();
        let (rmb_len, snd_len) = bufs.regs.sizes();
        let (rmb, snd) = &bufs.regs.mrs[slot.port];
        // The connection keeps its buffers registered (on every port) while it lives; the
        // group has them back for its next connection when this one has ended.
        let link = SmcrLink::sharing(
            Arc::clone(&slot.link),
            bufs.token,
            snd,
            rmb,
            PeerRmb {
                addr: key.vaddr,
                rkey: key.rkey,
                len: peer.rmb.len,
                token: peer.rmb.token,
            },
            Box::new(Arc::clone(&bufs.regs)),
        );
        let link = match bufs.regs.cdc.get(slot.port) {
            Some(own) => link.without_inline(own),
            None => link,
        };
        // SMC_NLA_STATS_SMCR_TECH: the handshake and the buffers (`SMC_STAT_RMB_REUSE` when
        // the group had them from an ended connection, `_ALLOC` when they are new).
        {
            use crate::layout::status as st;
            let t = |i| st::T_SMCR + i;
            let st = &self.status;
            st.add(
                t(match (group.client, self.version >= SMC_V2) {
                    (true, true) => st::T_CLNT_V2_SUCC,
                    (false, true) => st::T_SRV_V2_SUCC,
                    (true, false) => st::T_CLNT_V1_SUCC,
                    (false, false) => st::T_SRV_V1_SUCC,
                }),
                1,
            );
            st.add(t(st::T_RX_RMB_SIZE + st::bucket(rmb_len as u64)), 1);
            st.add(t(st::T_TX_RMB_SIZE + st::bucket(snd_len as u64)), 1);
            if bufs.reused {
                self.stats.bufs_reused.fetch_add(1, Ordering::Relaxed);
            }
            let how = if bufs.reused {
                st::RMB_REUSE
            } else {
                st::RMB_ALLOC
            };
            st.add(t(st::T_RX_RMB + how), 1);
            st.add(t(st::T_TX_RMB + how), 1);
        }
        let slot = self.status.conn_slot();
        slot.publish(&ConnIdentity {
            state: SmcState::Active as u8,
            // smc_diag's SMCR mode.
            mode: 0,
            role: u8::from(!group.client),
            fallback: (0, 0),
            local: sock.local_addr().ok(),
            peer: sock.peer_addr().ok(),
            inode: rustix::fs::fstat(&sock).map_or(0, |s| s.st_ino),
            lgr: group.lgr_id,
            token: u64::from(bufs.token),
            peer_token: u64::from(peer.rmb.token),
            gid: gid_u128(&self.smcr.gid),
            peer_gid: gid_u128(&peer.gid),
            rmbe: rmb_len as u64,
            peer_rmbe: peer.rmb.len as u64,
            sndbuf: snd_len as u64,
        });
        // Marks the slot SMC-R (its counters are SMC-R's) and names its link.
        slot.set_link(sh.llc.link(via).map_or(0, |l| l.link_id));
        let conn = SmcConn::new(
            sock,
            link,
            self.conn_config(rmb_len, peer.rmb.len, snd_len),
            ConnParams {
                spin: self.settings().spin,
            },
            SmcdInfo {
                lgr_id: group.lgr_id,
                local_gid: gid_u128(&self.smcr.gid),
                peer_gid: gid_u128(&peer.gid),
                local_token: u64::from(bufs.token),
                peer_token: u64::from(peer.rmb.token),
                rmbe_size: rmb_len,
                peer_rmbe_size: peer.rmb.len,
                version: self.version,
                client: group.client,
            },
            slot,
        );
        sh.members.insert(
            bufs.token,
            Member {
                conn: Arc::downgrade(&conn),
                rtoken,
                link: via,
                sndbufs,
                regs: Arc::clone(&bufs.regs),
            },
        );
        sh.conns += 1;
        group.publish(&sh);
        drop(sh);
        Ok(SmcrStream {
            kind: Kind::Smc(Arc::new(Handle { conn, group })),
        })
    }

    fn new_lgr_id(&self) -> u32 {
        self.next_lgr.fetch_add(0x100, Ordering::Relaxed)
    }

    fn insert(&self, g: &Arc<Group>) {
        let mut groups = lock(&self.groups);
        groups.retain(|g| lock(&g.sh).dead.is_none());
        if !groups.iter().any(|x| Arc::ptr_eq(x, g)) {
            groups.push(Arc::clone(g));
        }
    }

    /// A group whose first contact failed leaves the table.
    fn forget(&self, g: &Arc<Group>) {
        lock(&self.groups).retain(|x| !Arc::ptr_eq(x, g));
    }

    /// The group's LLC settings, with the `max_links` the CLC negotiated. A v2 group speaks
    /// the v2 LLC (`lgr->smc_version`); its CONFIRM_LINK announces `max_conns` when the peer
    /// is at release 1 or later (SMC-Rv2.1), as `smc_llc_send_confirm_link` does. The peers
    /// always reach each other directly (no gateway), so the ADD_LINK extension says
    /// `v2_direct`.
    fn llc_config(&self, lgr_id: u32, max_links: u8, peer: &SmcrPeer, max_conns: u8) -> LlcConfig {
        let v2 = self.version >= SMC_V2 && peer.version >= SMC_V2;
        let release = peer.fce.map_or(0, |f| f.release);
        LlcConfig {
            max_links: max_links.clamp(1, self.smcr_caps().max_links),
            testlink_time: self.settings().smcr_testlink_time,
            v2,
            max_conns: if v2 && release >= 1 { max_conns } else { 0 },
            v2_direct: true,
            ..LlcConfig::new(lgr_id, self.ports.iter().map(|p| p.local).collect())
        }
    }

    fn first_link(&self, q: &NewQp, peer: &SmcrPeer, bufs: &Bufs) -> FirstLink {
        FirstLink {
            port: self.ports[0].local,
            qpn: q.qp.qp_num(),
            psn: q.psn,
            peer: PeerQp {
                qpn: peer.qpn,
                gid: peer.gid,
                mac: peer.mac,
                psn: peer.psn,
                mtu: peer.mtu,
            },
            rmb: RmbId(bufs.token),
            rmb_key: bufs.keys()[0],
            peer_rmb: RmbKey {
                rkey: peer.rmb.rkey,
                vaddr: peer.rmb.addr,
            },
        }
    }

    /// The end of a first contact: once the LLC's CONFIRM_LINK exchange is over (its wait
    /// times bound this), the group takes connections and this one is established.
    fn finish_first(
        self: &Arc<Self>,
        sock: TcpStream,
        group: Arc<Group>,
        bufs: Bufs,
        peer: &SmcrPeer,
        resv: Reservation,
    ) -> io::Result<SmcrStream> {
        // The peer's RMB joins the group's rtokens now, on the first link, as
        // `smc_rmb_rtoken_handling` does before the first link is confirmed: the ADD_LINK
        // that may follow at once gives it its key on the new link (`rtoken_set` fills only
        // rows that exist), and the connection may be placed there.
        let clc_key = RmbKey {
            rkey: peer.rmb.rkey,
            vaddr: peer.rmb.addr,
        };
        let _ = lock(&group.sh).llc.rtoken_add(LinkIdx::FIRST, clc_key);
        match group.first_contact(Duration::from_secs(10)) {
            Ok(()) => {
                self.insert(&group);
                self.stats.first_contacts.fetch_add(1, Ordering::Relaxed);
                let via = group.place();
                self.established(sock, group, bufs, peer, resv, LinkIdx::FIRST, via)
            }
            Err(why) => {
                tracing::debug!("SMC-R first contact failed: {why}");
                group.kill();
                self.forget(&group);
                self.decline(sock, ReasonCode::TIMEOUT_CL)
            }
        }
    }

    /// Server: sends the Accept and reads the client's Confirm (or why not).
    fn accept_confirm(
        &self,
        sock: &mut TcpStream,
        info: &hs::SmcrProposalInfo,
        offer: &LinkOffer,
        bufs: &Bufs,
        port: usize,
        first_contact: bool,
    ) -> io::Result<Result<SmcrPeer, Refusal>> {
        let accept = hs::server_accept_any(
            &self.caps_on(port),
            info,
            offer,
            &bufs.offer(port),
            first_contact,
            self.caps.hostname,
        );
        sock.write_all(&ClcMessage::Accept(accept).to_vec())?;
        Ok(match read_clc(sock)? {
            Ok(m) => hs::server_check_confirm_any(m, first_contact, info.version),
            Err(r) => Err(Refusal::Decline(r)),
        })
    }

    // ------------------------------------------------------------------------ client

    /// The client's handshake (`smc_find_proposal_devices` + `__smc_connect`): proposes
    /// SMC-R v2 and/or v1, whatever this endpoint has, then goes on in the version the
    /// server's Accept names, on that version's side.
    fn client(self: &Arc<Self>, mut sock: TcpStream) -> io::Result<SmcrStream> {
        sock.set_read_timeout(Some(CLC_WAIT_TIME))?;
        let v2 = self.version >= SMC_V2;
        let v1 = self.v1_side();
        let mut b = ProposalBuilder::new();
        for e in &self.caps.ueids {
            b = b.user_eid(*e);
        }
        if v2 {
            b = hs::propose(b, &self.smcr_caps());
        }
        if let Some(e) = &v1 {
            b = hs::propose_v1(b, &e.smcr_caps(), e.ports[0].addr, e.prefix_len);
        }
        let mut proposal = b
            .build()
            .map_err(|e| proto_err(format!("building the Proposal: {e:?}")))?;
        // Our system id, so that a server can tell a restarted peer on the same address (a
        // new endpoint, with groups of its own) from the one its groups are with. Linux fills
        // it only beside an SMC-Rv1 offer; a server that ignores it loses nothing.
        proposal.peer_id = self.smcr.peer_id;
        sock.write_all(&ClcMessage::Proposal(proposal).to_vec())?;
        let msg = match read_clc(&mut sock)? {
            Ok(m) => m,
            Err(r) => return self.decline(sock, r),
        };
        let peer = match hs::client_check_accept_any(msg, &self.smcr_caps(), v1.is_some(), v2) {
            Ok(p) => p,
            Err(r) => return self.refused(sock, r),
        };
        match v1 {
            Some(e) if peer.version < SMC_V2 => e.client_accepted(sock, peer),
            _ => self.client_accepted(sock, peer),
        }
    }

    /// The client after the Accept, on the side of its version.
    fn client_accepted(
        self: &Arc<Self>,
        sock: TcpStream,
        peer: SmcrPeer,
    ) -> io::Result<SmcrStream> {
        if !peer.first_contact {
            return self.client_reuse(sock, peer);
        }
        let bufs = match self.bufs(None) {
            Ok(b) => b,
            Err(_) => return self.decline(sock, ReasonCode::MEM),
        };
        self.client_first(sock, peer, bufs)
    }

    fn client_first(
        self: &Arc<Self>,
        mut sock: TcpStream,
        peer: SmcrPeer,
        bufs: Bufs,
    ) -> io::Result<SmcrStream> {
        let Ok(q) = self.new_qp(0) else {
            return self.decline(sock, ReasonCode::MEM);
        };
        let offer = q.offer(self.ports[0].local.path_mtu);
        let lgr_id = self.new_lgr_id();
        let first = self.first_link(&q, &peer, &bufs);
        let table = ConnTable::default();
        let (qpn, psn) = (q.qp.qp_num(), q.psn);
        let link = match self.start_link(q, &first.peer, &table) {
            Ok(l) => l,
            Err(_) => return self.decline(sock, ReasonCode::ERR_RDYLNK),
        };
        let resv = Reservation::new(&link, bufs.token);
        // A v1 group has the kernel's v1 limits (`smc_lgr_create`): 255 connections, 2 links.
        let max_links = if peer.version < SMC_V2 {
            hs::MAX_LINKS_PER_LGR
        } else {
            peer.fce.and_then(|f| f.v2x).map_or(1, |x| x.max_links)
        };
        let max_conns = if peer.version < SMC_V2 {
            MAX_CONNS_PER_LGR
        } else {
            peer.fce
                .and_then(|f| f.v2x)
                .map_or(self.smcr_caps().max_conns, |x| x.max_conns)
        };
        let cfg = self.llc_config(lgr_id, max_links, &peer, max_conns);
        let llc = Llc::client(cfg, core_now(), first);
        let slot = Slot::first(self, link, (qpn, psn), peer.qpn);
        let group = Group::start(
            self,
            lgr_id,
            (true, max_conns),
            &peer,
            table,
            slot,
            llc,
            (bufs.token, bufs.keys()),
        );
        // In the table at once: the server may answer our next connection with a reuse
        // Accept as soon as its own first contact is over, which can be before this thread
        // has seen ours end; that connection waits for it (`client_reuse`), as the kernel's
        // waits for `smc_client_lgr_pending`, instead of declining with SYNCERR.
        self.insert(&group);
        let gids: Vec<_> = self.ports.iter().map(|p| p.local.gid).collect();
        let confirm = hs::client_confirm_any(
            &self.smcr_caps(),
            &peer,
            &offer,
            &bufs.offer(0),
            self.caps.hostname,
            &gids,
        );
        sock.write_all(&ClcMessage::Confirm(confirm).to_vec())?;
        // The server's CONFIRM_LINK, our response, its ADD_LINK if there is a second port:
        // the LLC's wait times bound this.
        self.finish_first(sock, group, bufs, &peer, resv)
    }

    fn client_reuse(
        self: &Arc<Self>,
        mut sock: TcpStream,
        peer: SmcrPeer,
    ) -> io::Result<SmcrStream> {
        // smcr_lgr_match: the server's system id, and one of the group's links is the one
        // the Accept names (the QPN and the GID of the link's port: QPNs alone do not tell
        // links apart when two devices number their QPs alike).
        let found = lock(&self.groups).iter().find_map(|g| {
            let named = g.link_named(peer.qpn, peer.gid)?;
            (g.client && g.peer_id == peer.peer_id && lock(&g.sh).dead.is_none())
                .then(|| (Arc::clone(g), named))
        });
        let Some((group, named)) = found else {
            return self.decline(sock, ReasonCode::SYNCERR);
        };
        // The group's first contact may still be ending (see `client_first`); only this
        // group is waited for.
        if let Err(why) = group.first_contact(Duration::from_secs(10)) {
            tracing::debug!("SMC-R group to reuse failed its first contact: {why}");
            return self.decline(sock, ReasonCode::SYNCERR);
        }
        let via = group.place();
        let Some(slot) = group.slot(via) else {
            return self.decline(sock, ReasonCode::SYNCERR);
        };
        let bufs = match self.bufs(Some(&group)) {
            Ok(b) => b,
            Err(_) => return self.decline(sock, ReasonCode::MEM),
        };
        let resv = Reservation::new(&slot.link, bufs.token);
        if let Err(why) = group.register(bufs.token, bufs.keys(), via) {
            tracing::debug!("SMC-R CONFIRM_RKEY failed: {why}");
            return self.decline(sock, ReasonCode::ERR_REGBUF);
        }
        let offer = slot.offer(self.ports[slot.port].local.path_mtu);
        let confirm = hs::client_confirm_any(
            &self.caps_on(slot.port),
            &peer,
            &offer,
            &bufs.offer(slot.port),
            self.caps.hostname,
            &[],
        );
        sock.write_all(&ClcMessage::Confirm(confirm).to_vec())?;
        self.stats.reused.fetch_add(1, Ordering::Relaxed);
        self.established(sock, group, bufs, &peer, resv, named, via)
    }

    // ------------------------------------------------------------------------ server

    fn server(self: &Arc<Self>, mut sock: TcpStream) -> io::Result<SmcrStream> {
        sock.set_read_timeout(Some(CLC_WAIT_TIME))?;
        let p = match read_clc(&mut sock)? {
            Ok(ClcMessage::Proposal(p)) => p,
            // A client that could not propose after all says so (and reads no answer).
            Ok(ClcMessage::Decline(d)) => {
                return self.refused(sock, Refusal::declined(&d));
            }
            Ok(_) => return self.decline(sock, ReasonCode::CNFERR),
            Err(r) => return self.decline(sock, r),
        };
        if sock.local_addr()?.ip() != IpAddr::V4(self.ports[0].addr) {
            return self.decline(sock, ReasonCode::NOSMCRDEV);
        }
        // `smc_listen_find_device`: RDMA v2 first, then v1 (on the client's subnet only).
        let mut why = ReasonCode::NOSMCRDEV;
        if self.version >= SMC_V2 {
            match hs::server_check(&p, &self.caps, &self.smcr_caps()) {
                Ok(info) => return self.server_chosen(sock, &p, info),
                Err(r) => why = r,
            }
        }
        if let Some(e) = self.v1_side() {
            match hs::server_check_v1(&p, e.ports[0].addr, e.prefix_len) {
                Ok(info) => return e.server_chosen(sock, &p, info),
                // The v2 reason stands when v2 was offered.
                Err(r) if self.version < SMC_V2 || !p.typev2.smcr() => why = r,
                Err(_) => {}
            }
        }
        self.decline(sock, why)
    }

    /// The server once the version is chosen, on that version's side: a group to reuse or a
    /// first contact.
    fn server_chosen(
        self: &Arc<Self>,
        sock: TcpStream,
        p: &Proposal,
        info: hs::SmcrProposalInfo,
    ) -> io::Result<SmcrStream> {
        // smcr_lgr_match for the server: the client's system id (when it names one) and GID,
        // a group with room.
        let group = lock(&self.groups)
            .iter()
            .find(|g| {
                let sh = lock(&g.sh);
                !g.client
                    && (p.peer_id == [0; 8] || p.peer_id == g.peer_id)
                    && g.peer_gid == info.peer_gid
                    && sh.dead.is_none()
                    && sh.conns < u32::from(info.max_conns)
            })
            .cloned();
        let bufs = match self.bufs(group.as_deref()) {
            Ok(b) => b,
            Err(_) => return self.decline(sock, ReasonCode::MEM),
        };
        match group {
            Some(g) => self.server_reuse(sock, &info, g, bufs),
            None => self.server_first(sock, &info, bufs),
        }
    }

    fn server_first(
        self: &Arc<Self>,
        mut sock: TcpStream,
        info: &hs::SmcrProposalInfo,
        bufs: Bufs,
    ) -> io::Result<SmcrStream> {
        let Ok(q) = self.new_qp(0) else {
            return self.decline(sock, ReasonCode::MEM);
        };
        let offer = q.offer(self.ports[0].local.path_mtu);
        let peer = match self.accept_confirm(&mut sock, info, &offer, &bufs, 0, true)? {
            Ok(p) if p.gid == info.peer_gid => p,
            Ok(_) => return self.decline(sock, ReasonCode::CNFERR),
            Err(r) => return self.refused(sock, r),
        };
        let lgr_id = self.new_lgr_id();
        let first = self.first_link(&q, &peer, &bufs);
        let table = ConnTable::default();
        let (qpn, psn) = (q.qp.qp_num(), q.psn);
        let link = match self.start_link(q, &first.peer, &table) {
            Ok(l) => l,
            Err(_) => return self.decline(sock, ReasonCode::ERR_RDYLNK),
        };
        let resv = Reservation::new(&link, bufs.token);
        // Sends CONFIRM_LINK at once (and ADD_LINK after it when both have a second port).
        let cfg = self.llc_config(lgr_id, info.max_links, &peer, info.max_conns);
        let llc = Llc::server(cfg, core_now(), first);
        let slot = Slot::first(self, link, (qpn, psn), peer.qpn);
        let group = Group::start(
            self,
            lgr_id,
            (false, info.max_conns),
            &peer,
            table,
            slot,
            llc,
            (bufs.token, bufs.keys()),
        );
        self.finish_first(sock, group, bufs, &peer, resv)
    }

    fn server_reuse(
        self: &Arc<Self>,
        mut sock: TcpStream,
        info: &hs::SmcrProposalInfo,
        group: Arc<Group>,
        bufs: Bufs,
    ) -> io::Result<SmcrStream> {
        let via = group.place();
        let Some(slot) = group.slot(via) else {
            return self.decline(sock, ReasonCode::SYNCERR);
        };
        let resv = Reservation::new(&slot.link, bufs.token);
        // smc_listen_rdma_reg: the new RMB is confirmed before the Accept names it.
        if let Err(why) = group.register(bufs.token, bufs.keys(), via) {
            tracing::debug!("SMC-R CONFIRM_RKEY failed: {why}");
            return self.decline(sock, ReasonCode::ERR_REGBUF);
        }
        let offer = slot.offer(self.ports[slot.port].local.path_mtu);
        let peer = match self.accept_confirm(&mut sock, info, &offer, &bufs, slot.port, false)? {
            Ok(p) => p,
            Err(r) => return self.refused(sock, r),
        };
        // The Confirm must name one of the group's links (its QPN and the GID of its port).
        let Some(named) = group.link_named(peer.qpn, peer.gid) else {
            return self.decline(sock, ReasonCode::SYNCERR);
        };
        self.stats.reused.fetch_add(1, Ordering::Relaxed);
        self.established(sock, group, bufs, &peer, resv, named, via)
    }
}

/// A listening socket whose accepted connections run SMC-R when the client offers it.
#[derive(Debug)]
pub struct SmcrListener {
    ep: Arc<Ep>,
    sock: TcpListener,
    keys: Vec<crate::bpf::ListenerKey>,
    /// Once non-blocking: the thread that accepts TCP connections and runs their handshakes
    /// on workers, and the connections whose handshake ended.
    acceptor: std::sync::OnceLock<Arc<Acceptor>>,
    /// Held while the acceptor is made (one thread, however many ask at once).
    starting: Mutex<()>,
    nonblocking: AtomicBool,
}

/// Handshakes run on workers (the kernel's `smc_hs_wq`: `connect_work` for a non-blocking
/// connect, `smc_listen_work` for each connection a listener takes), and a descriptor that is
/// readable while an outcome waits, so `poll`, `select` and `epoll` wait for a handshake's
/// end, not for the TCP connection under it.
#[derive(Debug)]
struct Outcomes {
    queue: Mutex<std::collections::VecDeque<io::Result<(SmcrStream, SocketAddr)>>>,
    /// Rung with each outcome, drained when the queue empties (under the queue's lock, so
    /// the two agree).
    ready: crate::sys::Doorbell,
}

impl Outcomes {
    fn new() -> io::Result<Arc<Outcomes>> {
        Ok(Arc::new(Outcomes {
            queue: Mutex::new(std::collections::VecDeque::new()),
            ready: crate::sys::Doorbell::new()?,
        }))
    }

    /// One more outcome.
    fn push(&self, r: io::Result<(SmcrStream, SocketAddr)>) {
        let mut q = lock(&self.queue);
        q.push_back(r);
        self.ready.ring();
    }

    /// The oldest outcome, if one is there.
    fn pop(&self) -> Option<io::Result<(SmcrStream, SocketAddr)>> {
        let mut q = lock(&self.queue);
        let r = q.pop_front()?;
        if q.is_empty() {
            self.ready.drain();
        }
        Some(r)
    }

    /// Waits until an outcome is there (or `timeout` passed).
    fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        crate::sys::wait_readable(&self.ready, timeout)
    }
}

/// The thread of a non-blocking [`SmcrListener`] (the kernel's `smc_tcp_listen_work`).
#[derive(Debug)]
struct Acceptor {
    out: Arc<Outcomes>,
    stop: AtomicBool,
}

/// A connect under way ([`SmcrEndpoint::connect_nonblocking`]): the TCP connect and the
/// handshake run on a worker, as the kernel's `connect_work` runs them for a non-blocking
/// socket. Its descriptor ([`AsFd`](std::os::fd::AsFd)) turns readable when they have ended.
#[derive(Debug)]
pub struct SmcrConnecting {
    out: Arc<Outcomes>,
}

impl SmcrConnecting {
    /// The outcome once it is there: the stream (SMC-R, or TCP with its fallback reasons), or
    /// the connect's error (what `SO_ERROR` would say: refused, unreachable, timed out);
    /// `Ok(None)` while it runs. The outcome is given once.
    pub fn try_finish(&self) -> io::Result<Option<SmcrStream>> {
        match self.out.pop() {
            Some(r) => r.map(|(s, _)| Some(s)),
            None => Ok(None),
        }
    }

    /// Waits up to `timeout` (for ever with `None`) for the outcome; `Ok(None)` if it did
    /// not come in time.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<Option<SmcrStream>> {
        self.out.wait(timeout)?;
        self.try_finish()
    }
}

impl std::os::fd::AsFd for SmcrConnecting {
    fn as_fd(&self) -> rustix::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.out.ready)
    }
}

impl SmcrListener {
    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Accepts the next connection and runs its handshake: SMC-R, or TCP with the reason.
    /// Non-blocking ([`SmcrListener::set_nonblocking`]): the next connection whose handshake
    /// has ended, or `WouldBlock`.
    pub fn accept(&self) -> io::Result<(SmcrStream, SocketAddr)> {
        let Some(a) = self.acceptor.get() else {
            let (sock, from) = self.sock.accept()?;
            return Ep::accepted(&self.ep, sock, from);
        };
        loop {
            match a.out.pop() {
                Some(Ok(c)) => return Ok(c),
                // A handshake that failed takes its connection with it (`smc_listen_out_err`):
                // the program never sees it.
                Some(Err(_)) => continue,
                None if self.nonblocking.load(Ordering::Relaxed) => {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                None => {
                    a.out.wait(None)?;
                }
            }
        }
    }

    /// `O_NONBLOCK`: from the first `true` on, a thread accepts the TCP connections and runs
    /// each handshake on a worker (the kernel's `smc_tcp_listen_work` and `smc_listen_work`),
    /// so one slow client holds up no other; [`SmcrListener::accept`] takes the connections
    /// whose handshake ended, and [`SmcrListener::readiness`] is readable while one waits.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        let _one = lock(&self.starting);
        if on && self.acceptor.get().is_none() {
            let a = Arc::new(Acceptor {
                out: Outcomes::new()?,
                stop: AtomicBool::new(false),
            });
            let (ep, sock, t) = (Arc::clone(&self.ep), self.sock.try_clone()?, Arc::clone(&a));
            std::thread::Builder::new()
                .name("smcr-listen".into())
                .spawn(move || Acceptor::run(&t, &ep, &sock))?;
            let _ = self.acceptor.set(a);
        }
        self.nonblocking.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Readable while a connection whose handshake ended waits for [`SmcrListener::accept`];
    /// there once the listener was made non-blocking.
    pub fn readiness(&self) -> Option<rustix::fd::BorrowedFd<'_>> {
        self.acceptor
            .get()
            .map(|a| std::os::fd::AsFd::as_fd(&a.out.ready))
    }
}

impl Acceptor {
    fn run(me: &Acceptor, ep: &Arc<Ep>, sock: &TcpListener) {
        loop {
            let r = sock.accept();
            if me.stop.load(Ordering::SeqCst) {
                return;
            }
            match r {
                Ok((s, from)) => {
                    let (ep, out) = (Arc::clone(ep), Arc::clone(&me.out));
                    let worker = std::thread::Builder::new()
                        .name("smcr-hs".into())
                        .spawn(move || out.push(Ep::accepted(&ep, s, from)));
                    if worker.is_err() {
                        // No thread for it: the connection goes, as one whose handshake failed.
                        tracing::debug!("SMC-R: no worker for a handshake");
                    }
                }
                // Out of descriptors or memory for a moment: try again shortly.
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

impl Drop for SmcrListener {
    fn drop(&mut self) {
        if let Some(maps) = &self.ep.option {
            let _ = maps.unregister_listener(&self.keys);
        }
        if let Some(a) = self.acceptor.get() {
            a.stop.store(true, Ordering::SeqCst);
            // Wakes the thread in accept (the listening socket stops listening).
            let _ = rustix::net::shutdown(&self.sock, rustix::net::Shutdown::Read);
        }
    }
}

// ---------------------------------------------------------------------------- link group

/// One SMC-R link group: its links, its LLC flow machine and what the machine decided.
#[derive(Debug)]
struct Group {
    lgr_id: u32,
    /// `SMC_V2` or `SMC_V1`: its endpoint side's.
    version: u8,
    client: bool,
    peer_id: [u8; 8],
    peer_gid: [u8; 16],
    me: Weak<Group>,
    ep: Weak<Ep>,
    /// Its record in the status area (`GET_LGR_SMCR`, `GET_LINK_SMCR`).
    record: LgrSlot,
    /// What the record shows of the peer and the negotiation.
    peer_v2: (u8, u8, String, String),
    /// The peer's RoCE ports as far as we know: the GIDs a client lists in its first-contact
    /// Confirm (a server's Accept lists none: 1).
    peer_ports: usize,
    max_conns: u8,
    /// `smcr_buf_type` when it was made.
    buf_type: u8,
    /// The group's connections by token, shared by its links.
    table: ConnTable,
    /// The links by slot ([`LinkIdx`]); a slot is filled once its QP is up.
    links: RwLock<Vec<Option<Slot>>>,
    sh: Mutex<Shared>,
    cv: Condvar,
    /// Connections closed by their application that still finish their close (the kernel
    /// keeps the socket until the close handshake ends or its timer fires).
    lingering: Mutex<Vec<(Conn, Instant)>>,
}

/// One link of a group.
#[derive(Debug, Clone)]
struct Slot {
    link: Arc<RoceLink<SoftDevice>>,
    /// The endpoint's port it is on (counted there while the slot lives).
    port: usize,
    _use: Arc<PortUse>,
    qpn: u32,
    psn: u32,
    peer_qpn: u32,
}

impl Slot {
    /// The first link of a new group, on the endpoint's first port.
    fn first(
        ep: &Arc<Ep>,
        link: Arc<RoceLink<SoftDevice>>,
        (qpn, psn): (u32, u32),
        peer_qpn: u32,
    ) -> Slot {
        Slot {
            link,
            port: 0,
            _use: PortUse::new(ep, 0),
            qpn,
            psn,
            peer_qpn,
        }
    }

    /// How a CLC message names the link.
    fn offer(&self, mtu: u8) -> LinkOffer {
        LinkOffer {
            qpn: self.qpn,
            psn: self.psn,
            mtu,
        }
    }
}

/// A connection of the group, as the group moves it between links.
#[derive(Debug)]
struct Member {
    conn: Weak<SmcConn<SmcrLink<SoftDevice>>>,
    /// The peer's RMB in the rtoken table.
    rtoken: u8,
    /// The link it sends on.
    link: LinkIdx,
    /// Its send buffer's and CDC slots' (address, lkey) on each port.
    sndbufs: Vec<((u64, u32), (u64, u32))>,
    /// Its buffers, which the group keeps for its next connection once this one ended.
    regs: Arc<Regs>,
}

#[derive(Debug)]
struct Shared {
    llc: Llc,
    first: Option<Result<(), String>>,
    rkeys: HashMap<u32, Result<(), String>>,
    /// Each RMB's key on each port.
    keys: HashMap<u32, Vec<RmbKey>>,
    dead: Option<String>,
    conns: u32,
    lgr_type: LgrType,
    members: HashMap<u32, Member>,
    /// QPs the flow machine had created for a new link, until it is readied.
    pending: HashMap<usize, NewQp>,
    /// When the server last tried to add a second link.
    add_tried: Instant,
    /// Buffers of ended connections, cleared, for the next connection (the kernel's unused
    /// `rmbs` and `sndbufs` of a group; freed with the group).
    spare: Vec<Arc<Regs>>,
    /// Buffers of ended connections whose DELETE_RKEY is under way, by the token they had:
    /// spare once the peer answered (`smcr_buf_unuse` reuses a buffer after its delete).
    deleting: HashMap<u32, Arc<Regs>>,
}

/// An SMC-R connection of this module.
type Conn = Arc<SmcConn<SmcrLink<SoftDevice>>>;

/// How long a closed connection may take to finish its close.
const LINGER: Duration = Duration::from_secs(10);

/// How often a server whose group lacks its second link tries to add it again (the kernel
/// does on a port event; the soft device has none, so the path is tried).
const ADD_LINK_RETRY: Duration = Duration::from_secs(5);

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

impl Group {
    #[allow(clippy::too_many_arguments)]
    fn start(
        ep: &Arc<Ep>,
        lgr_id: u32,
        (client, max_conns): (bool, u8),
        peer: &SmcrPeer,
        table: ConnTable,
        first: Slot,
        llc: Llc,
        (token, keys): (u32, Vec<RmbKey>),
    ) -> Arc<Group> {
        let link = Arc::clone(&first.link);
        let mut links = vec![None; smc_core::llc::SMC_LINKS_PER_LGR_MAX];
        links[0] = Some(first);
        let g = Arc::new_cyclic(|me| Group {
            lgr_id,
            version: ep.version,
            client,
            peer_id: peer.peer_id,
            peer_gid: peer.gid,
            peer_ports: {
                let mut gids = peer.gid_list.clone();
                gids.sort_unstable();
                gids.dedup();
                gids.len().max(1)
            },
            me: me.clone(),
            ep: Arc::downgrade(ep),
            record: ep.status.lgr_slot(),
            peer_v2: (
                peer.fce.map_or(0, |f| f.release),
                peer.fce.map_or(0, |f| f.os_type.nibble()),
                peer.fce
                    .map(|f| String::from_utf8_lossy(f.hostname.trimmed()).into_owned())
                    .unwrap_or_default(),
                if peer.eid.is_zero() {
                    String::new()
                } else {
                    String::from_utf8_lossy(peer.eid.trimmed()).into_owned()
                },
            ),
            max_conns,
            buf_type: ep.settings().smcr_buf_type,
            table,
            links: RwLock::new(links),
            sh: Mutex::new(Shared {
                llc,
                first: None,
                rkeys: HashMap::new(),
                keys: HashMap::from([(token, keys)]),
                dead: None,
                conns: 0,
                lgr_type: LgrType::None,
                members: HashMap::new(),
                pending: HashMap::new(),
                add_tried: Instant::now(),
                spare: Vec::new(),
                deleting: HashMap::new(),
            }),
            cv: Condvar::new(),
            lingering: Mutex::new(Vec::new()),
        });
        g.attach(LinkIdx::FIRST, &link);
        // What the constructor queued (the server's CONFIRM_LINK).
        {
            let mut sh = lock(&g.sh);
            g.run(&mut sh, core_now());
        }
        let w = Arc::downgrade(&g);
        let _ = std::thread::Builder::new()
            .name(format!("smcr-lgr-{lgr_id:08x}"))
            .spawn(move || Group::timer(w));
        g
    }

    /// Hooks link `idx` up to the flow machine: its LLC messages, and its failure.
    fn attach(&self, idx: LinkIdx, link: &RoceLink<SoftDevice>) {
        let w = self.me.clone();
        link.set_llc_handler(Box::new(move |bytes| {
            if let Some(g) = w.upgrade() {
                let mut sh = lock(&g.sh);
                let now = core_now();
                let r = sh.llc.handle_message(now, idx, bytes);
                tracing::debug!(
                    lgr = g.lgr_id,
                    link = idx.index(),
                    llc_type = bytes.first().copied().unwrap_or(0),
                    len = bytes.len(),
                    "LLC received: {r:?}"
                );
                g.run(&mut sh, now);
            }
        }));
        let w = self.me.clone();
        link.set_fail_handler(Box::new(move || {
            // Told from a completion thread or a sender's post, maybe holding a connection:
            // the group's work runs elsewhere.
            let w = w.clone();
            let _ = std::thread::Builder::new()
                .name("smcr-link-down".into())
                .spawn(move || {
                    if let Some(g) = w.upgrade() {
                        g.link_failed(idx);
                    }
                });
        }));
    }

    fn slot(&self, idx: LinkIdx) -> Option<Slot> {
        read(&self.links).get(idx.index())?.clone()
    }

    /// Our link whose peer end is QP `qpn` on the port with `gid` (what a CLC message names:
    /// `smcr_lgr_match` compares both).
    fn link_named(&self, qpn: u32, gid: [u8; 16]) -> Option<LinkIdx> {
        let sh = lock(&self.sh);
        let links = read(&self.links);
        let i = links.iter().enumerate().position(|(i, s)| {
            s.as_ref().is_some_and(|s| {
                s.peer_qpn == qpn
                    && !s.link.failed()
                    && LinkIdx::new(i as u8)
                        .and_then(|l| sh.llc.link(l))
                        .and_then(|l| l.peer)
                        .is_some_and(|p| p.gid == gid)
            })
        })?;
        LinkIdx::new(i as u8)
    }

    /// `smcr_lgr_conn_assign_link`: the active link (not the asymmetric one) with the fewest
    /// connections.
    fn place(&self) -> LinkIdx {
        let sh = lock(&self.sh);
        let links = read(&self.links);
        sh.llc
            .links()
            .filter(|(i, l)| {
                l.state == smc_core::llc::LinkState::Active
                    && !l.asym
                    && links
                        .get(i.index())
                        .is_some_and(|s| s.as_ref().is_some_and(|s| !s.link.failed()))
            })
            .min_by_key(|(i, _)| sh.members.values().filter(|m| m.link == *i).count())
            .map_or(LinkIdx::FIRST, |(i, _)| i)
    }

    /// A link's QP failed: the flow machine moves its connections to another link (and
    /// tells the peer) or ends the group.
    fn link_failed(&self, idx: LinkIdx) {
        let mut sh = lock(&self.sh);
        if sh.dead.is_some() {
            return;
        }
        tracing::info!(lgr = self.lgr_id, link = idx.index(), "SMC-R link down");
        let now = core_now();
        sh.llc.link_down(now, idx);
        self.run(&mut sh, now);
        self.orphans(&mut sh);
    }

    /// Connections left on a link that is gone (nothing could take them) end.
    fn orphans(&self, sh: &mut Shared) {
        let links = read(&self.links);
        for m in sh.members.values() {
            let alive = links
                .get(m.link.index())
                .and_then(|s| s.as_ref())
                .is_some_and(|s| !s.link.failed());
            if !alive && let Some(c) = m.conn.upgrade() {
                c.link().fail();
            }
        }
    }

    /// Carries out what the flow machine asks, answering each step at once.
    fn run(&self, sh: &mut Shared, now: smc_core::Instant) {
        while let Some(a) = sh.llc.poll_action() {
            match a {
                LlcAction::Send { link, id, msg } => {
                    let ok = self
                        .slot(link)
                        .is_some_and(|s| s.link.send_llc(&msg.to_bytes()).is_ok());
                    tracing::debug!(
                        lgr = self.lgr_id,
                        link = link.index(),
                        ok,
                        "LLC sent: {msg:?}"
                    );
                    sh.llc.send_done(now, id, ok);
                }
                // The QP went to RTS when it was brought up (the soft device needs no wait
                // for the server's first packet) and the RMBs are registered on every port.
                LlcAction::RtsAndRegister { link } => {
                    let _ = sh.llc.link_ready(now, link, true);
                }
                LlcAction::CreateLink {
                    link, port, rmbs, ..
                } => {
                    let r = self.create_link(sh, link, port.dev as usize, &rmbs);
                    let _ = sh.llc.link_created(now, link, r);
                }
                LlcAction::ReadyLink { link, peer, .. } => {
                    let ok = self.ready_link(sh, link, &peer);
                    let _ = sh.llc.link_ready(now, link, ok);
                }
                LlcAction::RegisterRmb { rmb, links } => {
                    let r = links
                        .iter()
                        .map(|l| {
                            let port = self.slot(*l).map(|s| s.port)?;
                            Some((*l, *sh.keys.get(&rmb.0)?.get(port)?))
                        })
                        .collect::<Option<Vec<_>>>()
                        .ok_or(StepFailed);
                    let _ = sh.llc.rmb_registered(now, rmb, r);
                }
                LlcAction::GroupType(t) => sh.lgr_type = t,
                LlcAction::FirstContact(r) => {
                    sh.first = Some(r.map(|_| ()).map_err(|e| format!("{e:?}")));
                }
                LlcAction::RkeyConfirmed { rmb, result } => {
                    sh.rkeys.insert(rmb.0, result.map_err(|e| format!("{e:?}")));
                }
                LlcAction::LinkDown { link } => {
                    if let Some(s) = self.slot(link) {
                        s.link.take_down();
                    }
                }
                LlcAction::LinkDeleted { link } => {
                    sh.pending.remove(&link.index());
                    let gone = write(&self.links)
                        .get_mut(link.index())
                        .and_then(Option::take);
                    if let Some(s) = gone {
                        tracing::info!(
                            lgr = self.lgr_id,
                            link = link.index(),
                            "SMC-R link deleted"
                        );
                        s.link.take_down();
                    }
                }
                LlcAction::MoveConnections { from, to } => self.move_conns(sh, from, to),
                LlcAction::Terminated { reason, .. } => {
                    sh.dead = Some(format!("{reason:?}"));
                    for s in read(&self.links).iter().flatten() {
                        s.link.abort();
                    }
                }
                // The LLC keeps the rtoken table (read when a connection is placed or
                // moved); placing reads the links' states.
                LlcAction::SetRtoken { .. }
                | LlcAction::DeleteRtoken { .. }
                | LlcAction::LinkActive { .. } => {}
                // The peer forgot the buffer's key: it may serve the next connection. A
                // delete that failed frees it (the peer may still hold the key).
                LlcAction::RkeyDeleted { rmb, result } => {
                    if let Some(regs) = sh.deleting.remove(&rmb.0)
                        && result.is_ok()
                    {
                        self.spare(sh, regs);
                    }
                }
            }
        }
        self.publish(sh);
        self.cv.notify_all();
    }

    /// Writes the group's record: its type and links as the flow machine has them, the
    /// connections on each (`smc_nl_fill_lgr`, `smc_nl_fill_lgr_link`).
    fn publish(&self, sh: &Shared) {
        if sh.dead.is_some() {
            self.record.withdraw();
            return;
        }
        if sh.first != Some(Ok(())) {
            return;
        }
        let Some(ep) = self.ep.upgrade() else { return };
        let slots = read(&self.links);
        let links = sh
            .llc
            .links()
            .filter_map(|(i, l)| {
                let s = slots.get(i.index())?.as_ref()?;
                let port = ep.ports.get(s.port)?;
                Some(LinkRecord {
                    id: l.link_id,
                    state: match l.state {
                        smc_core::llc::LinkState::Inactive => 1,
                        smc_core::llc::LinkState::Activating => 2,
                        smc_core::llc::LinkState::Active => 3,
                    },
                    ib_port: l.port.port,
                    conn_cnt: sh.members.values().filter(|m| m.link == i).count() as u32,
                    uid: l.link_uid,
                    peer_uid: l.peer_link_uid,
                    net_dev: port.ifindex,
                    gid: l.port.gid,
                    peer_gid: l.peer.map_or([0; 16], |p| p.gid),
                    ib_dev: port.name.clone(),
                })
            })
            .collect();
        let cfg = sh.llc.config();
        let (release, os, host, eid) = self.peer_v2.clone();
        // What the group has allocated (`alloc_rmbs`, `alloc_sndbufs`): its connections'
        // buffers and those it keeps for later ones.
        let (rmbs, sndbufs) = sh
            .members
            .values()
            .map(|m| &m.regs)
            .chain(&sh.spare)
            .chain(sh.deleting.values())
            .fold((0u64, 0u64), |(r, t), regs| {
                let (a, b) = regs.sizes();
                (r + a as u64, t + b as u64)
            });
        self.record.publish(&LgrRecord {
            id: self.lgr_id,
            role: u8::from(!self.client),
            version: self.version,
            release,
            os,
            conns: sh.conns,
            peer_gid: gid_u128(&self.peer_gid),
            gid: gid_u128(&ep.smcr.gid),
            sndbuf: sndbufs,
            dmb: rmbs,
            peer_host: host,
            eid,
            smcr: Some(SmcrLgr {
                lgr_type: sh.lgr_type.code(),
                max_conns: self.max_conns,
                max_links: cfg.max_links,
                buf_type: self.buf_type,
                links,
            }),
        });
    }

    /// `smcr_link_init` + `smcr_buf_map_lgr` for a new link on our port `port`: its QP, and
    /// the keys of the RMBs (registered on every port when they were made).
    fn create_link(
        &self,
        sh: &mut Shared,
        link: LinkIdx,
        port: usize,
        rmbs: &[RmbId],
    ) -> Result<CreatedLink, StepFailed> {
        let ep = self.ep.upgrade().ok_or(StepFailed)?;
        let q = ep.new_qp(port).map_err(|_| StepFailed)?;
        let rmb_keys = rmbs
            .iter()
            .map(|r| Some((*r, *sh.keys.get(&r.0)?.get(port)?)))
            .collect::<Option<Vec<_>>>()
            .ok_or(StepFailed)?;
        let created = CreatedLink {
            qpn: q.qp.qp_num(),
            psn: q.psn,
            rmb_keys,
        };
        sh.pending.insert(link.index(), q);
        Ok(created)
    }

    /// `smc_ib_ready_link`: the new link's QP up towards the peer's, its completion thread
    /// started, its messages to the flow machine.
    fn ready_link(&self, sh: &mut Shared, link: LinkIdx, peer: &PeerQp) -> bool {
        let (Some(q), Some(ep)) = (sh.pending.remove(&link.index()), self.ep.upgrade()) else {
            return false;
        };
        let (port, qpn, psn) = (q.port, q.qp.qp_num(), q.psn);
        let Ok(l) = ep.start_link(q, peer, &self.table) else {
            return false;
        };
        self.attach(link, &l);
        if let Some(s) = write(&self.links).get_mut(link.index()) {
            *s = Some(Slot {
                link: l,
                port,
                _use: PortUse::new(&ep, port),
                qpn,
                psn,
                peer_qpn: peer.qpn,
            });
        }
        true
    }

    /// `smc_switch_conns`: every connection sending on `from` goes to `to`, with the
    /// peer's RMB as `to` reaches it; one that cannot ends.
    fn move_conns(&self, sh: &mut Shared, from: LinkIdx, to: LinkIdx) {
        let Some(slot) = self.slot(to) else {
            return;
        };
        let link_id = sh.llc.link(to).map_or(0, |l| l.link_id);
        let mut moved = 0;
        for m in sh.members.values_mut().filter(|m| m.link == from) {
            let Some(conn) = m.conn.upgrade() else {
                continue;
            };
            let key = sh.llc.rtoken(m.rtoken, to);
            match (key, m.sndbufs.get(slot.port)) {
                (Some(key), Some(&(sndbuf, cdc))) => {
                    m.link = to;
                    moved += 1;
                    conn.slot.set_link(link_id);
                    conn.link().switch(Binding {
                        link: Arc::clone(&slot.link),
                        sndbuf,
                        peer: (key.vaddr, key.rkey),
                        cdc,
                    });
                }
                _ => conn.link().fail(),
            }
        }
        tracing::info!(
            lgr = self.lgr_id,
            from = from.index(),
            to = to.index(),
            moved,
            "SMC-R connections moved"
        );
    }

    /// The group's timer: the flow machine's deadlines, closed connections' lingering, and
    /// (server) the second link when it is missing.
    fn timer(w: Weak<Group>) {
        loop {
            let Some(g) = w.upgrade() else { return };
            g.sweep();
            let sh = lock(&g.sh);
            if sh.dead.is_some() {
                return;
            }
            let now = core_now();
            let wait = match sh.llc.poll_timeout() {
                Some(t) if t <= now => Duration::ZERO,
                Some(t) => t.saturating_duration_since(now).min(Duration::from_secs(1)),
                None => Duration::from_secs(1),
            };
            let mut sh = if wait.is_zero() {
                sh
            } else {
                g.cv.wait_timeout(sh, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            };
            let now = core_now();
            if sh.llc.poll_timeout().is_some_and(|t| t <= now) {
                sh.llc.handle_timeout(now);
                g.run(&mut sh, now);
            }
            g.retry_add_link(&mut sh, now);
        }
    }

    /// A server whose group has fewer links than it may have (the second path failed, or
    /// its ADD_LINK did) tries ADD_LINK again now and then: once the path is back, the
    /// link is. A second link needs a second port on one side at least (symmetric, or
    /// asymmetric on the side with one); between two one-port ends the client would only
    /// reject it again, so the server does not ask.
    fn retry_add_link(&self, sh: &mut Shared, now: smc_core::Instant) {
        let cfg = sh.llc.config();
        let paths = cfg.ports.len().max(self.peer_ports);
        let want = if paths > 1 {
            usize::from(cfg.max_links)
        } else {
            1
        };
        if self.client
            || sh.first != Some(Ok(()))
            || sh.llc.active_links() >= want
            || sh.llc.flow().is_some()
            || sh.add_tried.elapsed() < ADD_LINK_RETRY
        {
            return;
        }
        sh.add_tried = Instant::now();
        sh.llc.add_link(now);
        self.run(sh, now);
    }

    /// Lets go of connections whose close finished: their RMBs leave the group, and the peer
    /// is told with DELETE_RKEY (`smcr_buf_unuse`) once the RKEY flow is ours.
    ///
    /// The buffers of a connection that closed in order (both sides' close, so the peer
    /// writes no more) stay with the group for its next connection once the peer forgot
    /// their key; those of an aborted connection, or one whose close did not finish in
    /// time, are freed.
    fn sweep(&self) {
        let now = Instant::now();
        let mut l = lock(&self.lingering);
        let mut gone = Vec::new();
        l.retain(|(c, since)| {
            let closed = c.state() == SmcState::Closed && !c.is_aborted();
            let done = closed || c.is_aborted() || now - *since > LINGER;
            if done {
                gone.push((c.info.local_token as u32, closed));
            }
            !done
        });
        drop(l);
        if gone.is_empty() {
            return;
        }
        let mut sh = lock(&self.sh);
        let now = core_now();
        for (token, closed) in gone {
            let member = sh.members.remove(&token);
            if member.is_some() {
                sh.conns = sh.conns.saturating_sub(1);
            }
            sh.keys.remove(&token);
            let unreg = sh.llc.unregister_rmb(now, RmbId(token));
            match (member, unreg) {
                (Some(m), Unregister::Done) if closed => self.spare(&mut sh, m.regs),
                (Some(m), Unregister::Pending) if closed => {
                    sh.deleting.insert(token, m.regs);
                }
                _ => {}
            }
        }
        self.run(&mut sh, now);
    }

    /// Keeps `regs` for a later connection, cleared; at most as many as the group may have
    /// connections (the kernel keeps every buffer until the group goes).
    fn spare(&self, sh: &mut Shared, regs: Arc<Regs>) {
        if sh.spare.len() < usize::from(self.max_conns) {
            regs.clear();
            sh.spare.push(regs);
        }
    }

    /// Spare buffers of these (RMB, send buffer) sizes, if the group has some.
    fn take_spare(&self, sizes: (usize, usize)) -> Option<Arc<Regs>> {
        let mut sh = lock(&self.sh);
        let i = sh.spare.iter().position(|r| r.sizes() == sizes)?;
        Some(sh.spare.swap_remove(i))
    }

    /// Waits until `result` gives the outcome of what the flow machine was asked (its own
    /// timers end every flow; `within` is a backstop), or the group ends.
    fn wait_for(
        &self,
        mut sh: MutexGuard<'_, Shared>,
        within: Duration,
        what: &str,
        mut result: impl FnMut(&mut Shared) -> Option<Result<(), String>>,
    ) -> Result<(), String> {
        let deadline = Instant::now() + within;
        // The result comes from a completion's handler: the links' devices must not leave
        // their input for a serve meanwhile.
        let mut unserved = None;
        loop {
            if let Some(r) = result(&mut sh) {
                return r;
            }
            unserved.get_or_insert_with(|| {
                crate::transport::smcr::UnservedWait::on(
                    read(&self.links).iter().flatten().map(|s| s.link.recv_cq()),
                )
            });
            if let Some(d) = &sh.dead {
                return Err(d.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("no {what} result in time"));
            }
            sh = self
                .cv
                .wait_timeout(sh, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn first_contact(&self, within: Duration) -> Result<(), String> {
        self.wait_for(lock(&self.sh), within, "first-contact", |sh| {
            sh.first.clone()
        })
    }

    /// `smcr_lgr_reg_rmbs`: the RMB `token` (`keys`: on each port) joins the group,
    /// announced on link `via`; returns once the peer confirmed its rkeys (CONFIRM_RKEY), or
    /// why not.
    fn register(&self, token: u32, keys: Vec<RmbKey>, via: LinkIdx) -> Result<(), String> {
        let mut sh = lock(&self.sh);
        sh.keys.insert(token, keys);
        let now = core_now();
        sh.llc.register_rmb(now, RmbId(token), via);
        self.run(&mut sh, now);
        // The flow waits SMC_LLC_WAIT_TIME for the answer, and up to ten times that for the
        // flow to be ours.
        self.wait_for(sh, Duration::from_secs(25), "CONFIRM_RKEY", |sh| {
            sh.rkeys.remove(&token)
        })
    }

    fn closed(&self, conn: Conn) {
        lock(&self.lingering).push((conn, Instant::now()));
        self.sweep();
    }

    /// Ends a group that never carried a connection.
    fn kill(&self) {
        let mut sh = lock(&self.sh);
        if sh.dead.is_none() {
            sh.dead = Some("first contact failed".into());
        }
        for s in read(&self.links).iter().flatten() {
            s.link.abort();
        }
        self.cv.notify_all();
    }
}

// ---------------------------------------------------------------------------- stream

/// What a connection became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SmcrMode {
    /// SMC-R in link group `lgr_id`.
    SmcR {
        /// Our id of the link group.
        lgr_id: u32,
        /// Our token (the peer's CDCs name it).
        local_token: u32,
        /// The peer's.
        peer_token: u32,
    },
    /// Plain TCP, with the fallback reasons.
    Tcp(Fallback),
}

/// A connection from [`SmcrEndpoint::connect`] or [`SmcrListener::accept`].
#[derive(Debug)]
pub struct SmcrStream {
    kind: Kind,
}

/// An SMC-R connection held by one or more [`SmcrStream`]s: closed when the last goes.
#[derive(Debug)]
struct Handle {
    conn: Conn,
    group: Arc<Group>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.conn.close_now();
        // The close finishes on the link's completion thread; the group keeps the
        // connection until it has (or LINGER passed). That thread waits for the device's
        // own: input kept for this thread's next serve goes there now.
        self.conn.link().stop_serving();
        self.group.closed(Arc::clone(&self.conn));
    }
}

#[derive(Debug)]
enum Kind {
    Smc(Arc<Handle>),
    Tcp { sock: TcpStream, fallback: Fallback },
}

impl SmcrStream {
    /// SMC-R or TCP.
    pub fn mode(&self) -> SmcrMode {
        match &self.kind {
            Kind::Smc(h) => {
                let i = &h.conn.info;
                SmcrMode::SmcR {
                    lgr_id: h.group.lgr_id,
                    local_token: i.local_token as u32,
                    peer_token: i.peer_token as u32,
                }
            }
            Kind::Tcp { fallback, .. } => SmcrMode::Tcp(*fallback),
        }
    }

    /// Another handle on the same connection (as `dup(2)`, or `TcpStream::try_clone`): one
    /// thread may read while another writes. The connection closes when the last handle goes.
    pub fn try_clone(&self) -> io::Result<SmcrStream> {
        Ok(SmcrStream {
            kind: match &self.kind {
                Kind::Smc(h) => Kind::Smc(Arc::clone(h)),
                Kind::Tcp { sock, fallback } => Kind::Tcp {
                    sock: sock.try_clone()?,
                    fallback: *fallback,
                },
            },
        })
    }

    /// `shutdown(2)`.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match &self.kind {
            Kind::Smc(h) => h.conn.shutdown(how),
            Kind::Tcp { sock, .. } => sock.shutdown(how),
        }
    }

    /// `SO_RCVTIMEO`.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match &self.kind {
            Kind::Smc(h) => {
                h.conn.set_read_timeout(t);
                Ok(())
            }
            Kind::Tcp { sock, .. } => sock.set_read_timeout(t),
        }
    }

    /// `TCP_NODELAY`.
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        match &self.kind {
            Kind::Smc(h) => {
                h.conn.set_nodelay(on);
                Ok(())
            }
            Kind::Tcp { sock, .. } => sock.set_nodelay(on),
        }
    }
}

impl Read for SmcrStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.kind {
            Kind::Smc(h) => h.conn.read(buf),
            Kind::Tcp { sock, .. } => sock.read(buf),
        }
    }
}

impl Write for SmcrStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.kind {
            Kind::Smc(h) => h.conn.write_with(buf, false, false),
            Kind::Tcp { sock, .. } => sock.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.kind {
            Kind::Smc(h) => h.conn.flush(),
            Kind::Tcp { sock, .. } => sock.flush(),
        }
    }
}
