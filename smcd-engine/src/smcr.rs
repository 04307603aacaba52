//! SMC-R between engines: an [`SmcrEndpoint`] owns a RoCE device bound to one local IPv4
//! address and the SMC-R link groups it has with its peers; [`SmcrEndpoint::connect`] and
//! [`SmcrListener::accept`] run the SMC-R v2 CLC handshake over the TCP connection and end
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
//!   other connection is plain TCP and no CLC byte is sent or read. [`Capability::Assume`]
//!   is for peers configured to be SMC-R endpoints.
//!
//! Each group has one link (`max_links` 1 in the v2.1 negotiation: the device has one port
//! and a second link on it would not survive what the first does not), its LLC runs on the
//! link's completion thread (received messages) and on a timer thread of the group (the
//! flow machine's deadlines: CONFIRM_LINK waits, TEST_LINK). Handshakes on one group never
//! wait for another's: the table of groups is locked only to look up and insert.

use crate::driver::conn::{ConnParams, SmcConn, SmcdInfo};
use crate::driver::handshake::Fallback;
use crate::layout::status::StatusArea;
use crate::settings::Settings;
use crate::sys::core_now;
use crate::transport::smcr::{PeerRmb, RECV_BUF, RECV_WRS, RoceLink, SmcrLink};
use smc_core::close::SmcState;
use smc_core::conn::Config;
use smc_core::handshake::decide::Refusal;
use smc_core::handshake::smcr::{
    self as hs, LinkOffer, MAX_CONNS_PER_LGR, RmbOffer, SmcrCaps, SmcrPeer,
};
use smc_core::handshake::{CLC_WAIT_TIME, ClcReader, LocalCaps};
use smc_core::llc::{
    FirstLink, LgrType, LinkIdx, Llc, LlcAction, LlcConfig, LocalPort, PeerQp, RmbId, RmbKey,
    StepFailed,
};
use smc_proto::clc::{
    ClcMessage, Decline, Eid, Hostname, ProposalBuilder, ReasonCode, SMC_V2, SMCR_MAX_BUFSIZE_CODE,
    compress_bufsize, uncompress_bufsize,
};
use smc_rdma::soft::{SoftConfig, SoftDevice, SoftMr};
use smc_rdma::verbs::{
    Access, Device, Gid, Memory, MemoryRegion, Mtu, Pd, QpCaps, QpInit, QueuePair, RcPath, bring_up,
};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
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
}

/// What an endpoint is made of.
#[derive(Debug)]
pub struct SmcrConfig {
    /// The local address: the device binds it (UDP 4791) and its GID is the IPv4-mapped
    /// form. Connections whose TCP source is another address are not offered SMC-R.
    pub addr: Ipv4Addr,
    /// The netdev holding `addr` (found with `ip` when `None`).
    pub netdev: Option<String>,
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
}

impl SmcrConfig {
    /// An endpoint on `addr` with the kernel's defaults: 64 KiB buffers (`smcr_buf_type`
    /// physically contiguous, the default RMB of a 64 KiB `tcp_rmem`), 255 connections a group.
    pub fn new(addr: Ipv4Addr, ueid: &str, capability: Capability) -> SmcrConfig {
        SmcrConfig {
            addr,
            netdev: None,
            ueid: ueid.to_string(),
            ring: 64 << 10,
            max_conns: MAX_CONNS_PER_LGR,
            settings: Settings::default(),
            capability,
            testlink_time: smc_core::llc::SMC_LLC_TESTLINK_DEFAULT_TIME,
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
}

/// A local RoCE device and the SMC-R link groups over it.
#[derive(Debug, Clone)]
pub struct SmcrEndpoint(Arc<Ep>);

#[derive(Debug)]
struct Ep {
    dev: SoftDevice,
    pd: Pd,
    addr: Ipv4Addr,
    caps: LocalCaps,
    smcr: SmcrCaps,
    port: LocalPort,
    ring: usize,
    settings: Settings,
    testlink_time: Duration,
    option: Option<Maps>,
    groups: Mutex<Vec<Arc<Group>>>,
    next_lgr: AtomicU32,
    next_token: AtomicU32,
    status: Arc<StatusArea>,
    stats: SmcrStats,
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
    psn: u32,
}

/// A connection's buffers: its RMB (the peer writes into it) and its send buffer.
struct Bufs {
    token: u32,
    rmb: SoftMr,
    sndbuf: SoftMr,
}

impl Bufs {
    fn offer(&self) -> RmbOffer {
        RmbOffer {
            token: self.token,
            rkey: self.rmb.rkey(),
            addr: self.rmb.addr(),
            len: self.rmb.len(),
        }
    }

    fn key(&self) -> RmbKey {
        RmbKey {
            rkey: self.rmb.rkey(),
            vaddr: self.rmb.addr(),
        }
    }
}

/// A connection made known to a link before its handshake ends (see
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
    /// Opens the device on `cfg.addr`.
    pub fn open(cfg: SmcrConfig) -> io::Result<SmcrEndpoint> {
        let ueid = Eid::new(&cfg.ueid)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a valid user EID"))?;
        let dev = SoftDevice::open(SoftConfig {
            name: format!("sroce-{}", cfg.addr),
            addr: cfg.addr,
            netdev: cfg.netdev.clone(),
            steering: None,
        })?;
        let info = dev.info();
        let p = info
            .ports
            .first()
            .ok_or_else(|| io::Error::other("device without a port"))?;
        let gid = dev.gid().0;
        let r = random_u32().to_ne_bytes();
        let mut peer_id = [0u8; 8];
        peer_id[..2].copy_from_slice(&r[..2]);
        peer_id[2..].copy_from_slice(&p.mac);
        let max_conns = cfg
            .max_conns
            .clamp(hs::MIN_CONNS_PER_LGR, MAX_CONNS_PER_LGR);
        let port = LocalPort {
            dev: 0,
            port: p.port,
            gid,
            mac: p.mac,
            path_mtu: p.active_mtu as u8,
        };
        let option = match cfg.capability {
            Capability::Option(m) => Some(m),
            Capability::Assume => None,
        };
        Ok(SmcrEndpoint(Arc::new(Ep {
            pd: dev.alloc_pd(),
            dev,
            addr: cfg.addr,
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
                mac: p.mac,
                max_conns,
                // One link a group: see the module docs.
                max_links: 1,
            },
            port,
            // A size the CLC's size code names exactly: a power of two, 16 KiB to 512 KiB.
            ring: uncompress_bufsize(compress_bufsize(cfg.ring, SMCR_MAX_BUFSIZE_CODE)),
            settings: cfg.settings,
            testlink_time: cfg.testlink_time,
            option,
            groups: Mutex::new(Vec::new()),
            next_lgr: AtomicU32::new(random_u32() & 0xffff_ff00 | 1),
            next_token: AtomicU32::new(random_u32() | 1),
            status: StatusArea::private()?,
            stats: SmcrStats::default(),
        })))
    }

    /// The device's GID.
    pub fn gid(&self) -> Gid {
        self.0.dev.gid()
    }

    /// The device (its counters; `smcctl device show --smcr` material).
    pub fn device(&self) -> &SoftDevice {
        &self.0.dev
    }

    /// The endpoint's counters.
    pub fn stats(&self) -> &SmcrStats {
        &self.0.stats
    }

    /// The link groups that are up: (our id, client role, connections, LLC group type).
    pub fn link_groups(&self) -> Vec<LinkGroupInfo> {
        lock(&self.0.groups)
            .iter()
            .map(|g| {
                let sh = lock(&g.sh);
                LinkGroupInfo {
                    lgr_id: g.lgr_id,
                    client: g.client,
                    conns: sh.conns,
                    lgr_type: sh.lgr_type,
                    peer_gid: Gid(g.peer_gid),
                    qpn: g.link.qp_num(),
                    peer_qpn: g.peer_qpn,
                    up: sh.first == Some(Ok(())) && sh.dead.is_none(),
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
            return Ok(ep.plain(
                TcpStream::connect(addr)?,
                Fallback::local(ReasonCode::NOSMCRDEV),
            ));
        };
        let fd = rustix::net::socket_with(
            AddressFamily::INET,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            Some(ipproto::TCP),
        )?;
        // From the device's address: the GID the CLC names is the TCP connection's source,
        // as the kernel's device is the one of the route's netdev.
        rustix::net::bind(&fd, &SocketAddr::from((ep.addr, 0)))?;
        if let Some(maps) = &ep.option {
            maps.mark_client(&fd)?;
        }
        rustix::net::connect(&fd, &addr)?;
        let sock = TcpStream::from(fd);
        if let Some(maps) = &ep.option
            && maps.sock_option(&sock).ok().and_then(|o| o.clc_runs()) != Some(true)
        {
            return Ok(ep.plain(sock, Fallback::local(ReasonCode::PEERNOSMC)));
        }
        if sock.local_addr()?.ip() != IpAddr::V4(ep.addr) {
            // The peer expects CLC now: a Decline tells it (smc_connect_decline_fallback).
            return ep.decline(sock, ReasonCode::NOSMCRDEV);
        }
        Ep::client(ep, sock)
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
        })
    }
}

/// What `smcctl linkgroup show --smcr` would show of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkGroupInfo {
    /// Our id of the group.
    pub lgr_id: u32,
    /// We are its client.
    pub client: bool,
    /// Connections in it.
    pub conns: u32,
    /// Its type.
    pub lgr_type: LgrType,
    /// The peer's GID.
    pub peer_gid: Gid,
    /// Our QP of its link.
    pub qpn: u32,
    /// The peer's.
    pub peer_qpn: u32,
    /// First contact done and not terminated.
    pub up: bool,
}

impl Ep {
    fn plain(&self, sock: TcpStream, fallback: Fallback) -> SmcrStream {
        let _ = sock.set_read_timeout(None);
        self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        SmcrStream {
            kind: Kind::Tcp { sock, fallback },
        }
    }

    /// Declines with `r` (the peer falls back too) and continues over TCP.
    fn decline(&self, mut sock: TcpStream, r: ReasonCode) -> io::Result<SmcrStream> {
        sock.write_all(&ClcMessage::Decline(Decline::new(r, SMC_V2)).to_vec())?;
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

    fn bufs(&self) -> io::Result<Bufs> {
        let mr = |acc| {
            self.dev
                .reg_mr(self.pd, Memory::new(self.ring)?, acc)
                .map_err(io::Error::other)
        };
        let mut token = 0;
        while token == 0 {
            token = self.next_token.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Bufs {
            token,
            rmb: mr(Access::LOCAL_WRITE | Access::REMOTE_WRITE)?,
            sndbuf: mr(Access::LOCAL_WRITE)?,
        })
    }

    fn new_qp(&self) -> io::Result<NewQp> {
        let e = io::Error::other;
        let scq = self.dev.create_cq(1024).map_err(e)?;
        let rcq = self.dev.create_cq(1024).map_err(e)?;
        let qp = self
            .dev
            .create_qp(
                self.pd,
                QpInit {
                    send_cq: Arc::clone(&scq),
                    recv_cq: Arc::clone(&rcq),
                    caps: QpCaps {
                        max_send_wr: 48,
                        max_recv_wr: RECV_WRS,
                        max_send_sge: 2,
                        max_recv_sge: 1,
                        max_inline_data: 64,
                    },
                    sq_sig_all: false,
                },
            )
            .map_err(e)?;
        let recv = self
            .dev
            .reg_mr(
                self.pd,
                Memory::new((RECV_WRS * RECV_BUF) as usize)?,
                Access::LOCAL_WRITE,
            )
            .map_err(e)?;
        Ok(NewQp {
            qp,
            scq,
            rcq,
            recv,
            psn: random_u32() & 0x00ff_ffff,
        })
    }

    /// Takes `q` up towards the peer's QP and starts the link.
    fn start_link(&self, q: NewQp, peer: &SmcrPeer) -> io::Result<Arc<RoceLink<SoftDevice>>> {
        let mtu = Mtu::from_ib(peer.mtu.min(self.port.path_mtu)).unwrap_or(Mtu::M1024);
        let path = RcPath {
            mtu,
            ..RcPath::default()
        };
        bring_up(&q.qp, &path, peer.qpn, Gid(peer.gid), peer.psn, q.psn)
            .map_err(io::Error::other)?;
        RoceLink::start(q.qp, q.scq, q.rcq, q.recv)
    }

    /// The core's configuration: our RMB receives, the peer's (`peer_rmb` bytes) is where
    /// our bytes go, the send buffer is as large as our RMB.
    fn conn_config(&self, peer_rmb: usize) -> Config {
        let s = &self.settings;
        Config {
            autocorking_size: s.autocorking_size as usize,
            autosplit_size: s.autosplit_size as usize,
            tx_chunk: s.tx_chunk as usize,
            wnd_rule: s.wnd_update_rule,
            ..Config::smcr(self.ring, peer_rmb, self.ring)
        }
    }

    fn established(
        self: &Arc<Self>,
        sock: TcpStream,
        group: Arc<Group>,
        bufs: Bufs,
        peer: &SmcrPeer,
        mut resv: Reservation,
    ) -> SmcrStream {
        let _ = sock.set_read_timeout(None);
        resv.keep = true;
        let link = SmcrLink::new(
            Arc::clone(&group.link),
            bufs.token,
            bufs.sndbuf,
            bufs.rmb,
            PeerRmb {
                addr: peer.rmb.addr,
                rkey: peer.rmb.rkey,
                len: peer.rmb.len,
                token: peer.rmb.token,
            },
        );
        let conn = SmcConn::new(
            sock,
            link,
            self.conn_config(peer.rmb.len),
            ConnParams {
                spin: self.settings.spin,
            },
            SmcdInfo {
                lgr_id: group.lgr_id,
                local_gid: gid_u128(&self.smcr.gid),
                peer_gid: gid_u128(&peer.gid),
                local_token: u64::from(bufs.token),
                peer_token: u64::from(peer.rmb.token),
                rmbe_size: self.ring,
                peer_rmbe_size: peer.rmb.len,
                version: SMC_V2,
                client: group.client,
            },
            self.status.conn_slot(),
        );
        SmcrStream {
            kind: Kind::Smc { conn, group },
        }
    }

    fn new_lgr_id(&self) -> u32 {
        self.next_lgr.fetch_add(0x100, Ordering::Relaxed)
    }

    fn insert(&self, g: &Arc<Group>) {
        let mut groups = lock(&self.groups);
        groups.retain(|g| lock(&g.sh).dead.is_none());
        groups.push(Arc::clone(g));
    }

    fn llc_config(&self, lgr_id: u32) -> LlcConfig {
        LlcConfig {
            max_links: self.smcr.max_links,
            testlink_time: self.testlink_time,
            ..LlcConfig::new(lgr_id, vec![self.port])
        }
    }

    fn first_link(&self, q: &NewQp, peer: &SmcrPeer, bufs: &Bufs) -> FirstLink {
        FirstLink {
            port: self.port,
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
            rmb_key: bufs.key(),
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
        match group.first_contact(Duration::from_secs(10)) {
            Ok(()) => {
                self.insert(&group);
                self.stats.first_contacts.fetch_add(1, Ordering::Relaxed);
                group.joined();
                Ok(self.established(sock, group, bufs, peer, resv))
            }
            Err(why) => {
                tracing::debug!("SMC-R first contact failed: {why}");
                group.kill();
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
        first_contact: bool,
    ) -> io::Result<Result<SmcrPeer, Refusal>> {
        let accept = hs::server_accept(
            &self.smcr,
            info,
            offer,
            &bufs.offer(),
            first_contact,
            self.caps.hostname,
        );
        sock.write_all(&ClcMessage::Accept(accept).to_vec())?;
        Ok(match read_clc(sock)? {
            Ok(m) => hs::server_check_confirm(m, first_contact),
            Err(r) => Err(Refusal::Decline(r)),
        })
    }

    // ------------------------------------------------------------------------ client

    fn client(self: &Arc<Self>, mut sock: TcpStream) -> io::Result<SmcrStream> {
        sock.set_read_timeout(Some(CLC_WAIT_TIME))?;
        let mut b = ProposalBuilder::new();
        for e in &self.caps.ueids {
            b = b.user_eid(*e);
        }
        let mut proposal = hs::propose(b, &self.smcr)
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
        let peer = match hs::client_check_accept(msg, &self.smcr) {
            Ok(p) => p,
            Err(r) => return self.refused(sock, r),
        };
        let bufs = match self.bufs() {
            Ok(b) => b,
            Err(_) => return self.decline(sock, ReasonCode::MEM),
        };
        if peer.first_contact {
            self.client_first(sock, peer, bufs)
        } else {
            self.client_reuse(sock, peer, bufs)
        }
    }

    fn client_first(
        self: &Arc<Self>,
        mut sock: TcpStream,
        peer: SmcrPeer,
        bufs: Bufs,
    ) -> io::Result<SmcrStream> {
        let Ok(q) = self.new_qp() else {
            return self.decline(sock, ReasonCode::MEM);
        };
        let offer = LinkOffer {
            qpn: q.qp.qp_num(),
            psn: q.psn,
            mtu: self.port.path_mtu,
        };
        let lgr_id = self.new_lgr_id();
        let first = self.first_link(&q, &peer, &bufs);
        let link = match self.start_link(q, &peer) {
            Ok(l) => l,
            Err(_) => return self.decline(sock, ReasonCode::ERR_RDYLNK),
        };
        let resv = Reservation::new(&link, bufs.token);
        let llc = Llc::client(self.llc_config(lgr_id), core_now(), first);
        let group = Group::start(lgr_id, true, &peer, link, llc, first);
        let confirm = hs::client_confirm(
            &self.smcr,
            &peer,
            &offer,
            &bufs.offer(),
            self.caps.hostname,
            &[self.smcr.gid],
        );
        sock.write_all(&ClcMessage::Confirm(confirm).to_vec())?;
        // The server's CONFIRM_LINK, our response: the LLC's wait times bound this.
        self.finish_first(sock, group, bufs, &peer, resv)
    }

    fn client_reuse(
        self: &Arc<Self>,
        mut sock: TcpStream,
        peer: SmcrPeer,
        bufs: Bufs,
    ) -> io::Result<SmcrStream> {
        // smcr_lgr_match: the server's system id and GID, and its QPN names the link.
        let group = lock(&self.groups)
            .iter()
            .find(|g| {
                g.client
                    && g.peer_id == peer.peer_id
                    && g.peer_gid == peer.gid
                    && g.peer_qpn == peer.qpn
                    && lock(&g.sh).dead.is_none()
            })
            .cloned();
        let Some(group) = group else {
            return self.decline(sock, ReasonCode::SYNCERR);
        };
        let resv = Reservation::new(&group.link, bufs.token);
        if let Err(why) = group.register(bufs.token, bufs.key()) {
            tracing::debug!("SMC-R CONFIRM_RKEY failed: {why}");
            return self.decline(sock, ReasonCode::ERR_REGBUF);
        }
        let offer = group.offer(self.port.path_mtu);
        let confirm = hs::client_confirm(
            &self.smcr,
            &peer,
            &offer,
            &bufs.offer(),
            self.caps.hostname,
            &[],
        );
        sock.write_all(&ClcMessage::Confirm(confirm).to_vec())?;
        self.stats.reused.fetch_add(1, Ordering::Relaxed);
        group.joined();
        Ok(self.established(sock, group, bufs, &peer, resv))
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
        if sock.local_addr()?.ip() != IpAddr::V4(self.addr) {
            return self.decline(sock, ReasonCode::NOSMCRDEV);
        }
        let info = match hs::server_check(&p, &self.caps, &self.smcr) {
            Ok(i) => i,
            Err(r) => return self.decline(sock, r),
        };
        let bufs = match self.bufs() {
            Ok(b) => b,
            Err(_) => return self.decline(sock, ReasonCode::MEM),
        };
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
        let Ok(q) = self.new_qp() else {
            return self.decline(sock, ReasonCode::MEM);
        };
        let offer = LinkOffer {
            qpn: q.qp.qp_num(),
            psn: q.psn,
            mtu: self.port.path_mtu,
        };
        let peer = match self.accept_confirm(&mut sock, info, &offer, &bufs, true)? {
            Ok(p) if p.gid == info.peer_gid => p,
            Ok(_) => return self.decline(sock, ReasonCode::CNFERR),
            Err(r) => return self.refused(sock, r),
        };
        let lgr_id = self.new_lgr_id();
        let first = self.first_link(&q, &peer, &bufs);
        let link = match self.start_link(q, &peer) {
            Ok(l) => l,
            Err(_) => return self.decline(sock, ReasonCode::ERR_RDYLNK),
        };
        let resv = Reservation::new(&link, bufs.token);
        // Sends CONFIRM_LINK at once.
        let llc = Llc::server(self.llc_config(lgr_id), core_now(), first);
        let group = Group::start(lgr_id, false, &peer, link, llc, first);
        self.finish_first(sock, group, bufs, &peer, resv)
    }

    fn server_reuse(
        self: &Arc<Self>,
        mut sock: TcpStream,
        info: &hs::SmcrProposalInfo,
        group: Arc<Group>,
        bufs: Bufs,
    ) -> io::Result<SmcrStream> {
        let resv = Reservation::new(&group.link, bufs.token);
        // smc_listen_rdma_reg: the new RMB is confirmed before the Accept names it.
        if let Err(why) = group.register(bufs.token, bufs.key()) {
            tracing::debug!("SMC-R CONFIRM_RKEY failed: {why}");
            return self.decline(sock, ReasonCode::ERR_REGBUF);
        }
        let offer = group.offer(self.port.path_mtu);
        let peer = match self.accept_confirm(&mut sock, info, &offer, &bufs, false)? {
            // The Confirm must name the group's link.
            Ok(p) if p.qpn == group.peer_qpn && p.gid == group.peer_gid => p,
            Ok(_) => return self.decline(sock, ReasonCode::SYNCERR),
            Err(r) => return self.refused(sock, r),
        };
        self.stats.reused.fetch_add(1, Ordering::Relaxed);
        group.joined();
        Ok(self.established(sock, group, bufs, &peer, resv))
    }
}

/// A listening socket whose accepted connections run SMC-R when the client offers it.
#[derive(Debug)]
pub struct SmcrListener {
    ep: Arc<Ep>,
    sock: TcpListener,
    keys: Vec<crate::bpf::ListenerKey>,
}

impl SmcrListener {
    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Accepts the next connection and runs its handshake: SMC-R, or TCP with the reason.
    pub fn accept(&self) -> io::Result<(SmcrStream, SocketAddr)> {
        let (sock, from) = self.sock.accept()?;
        if let Some(maps) = &self.ep.option {
            // The SYN's option and our echo say whether a Proposal follows: nothing is read
            // from a connection that will not carry one.
            let runs = maps.sock_option(&sock).ok().and_then(|o| o.clc_runs());
            if runs != Some(true) {
                return Ok((
                    self.ep.plain(sock, Fallback::local(ReasonCode::PEERNOSMC)),
                    from,
                ));
            }
        }
        Ok((Ep::server(&self.ep, sock)?, from))
    }
}

impl Drop for SmcrListener {
    fn drop(&mut self) {
        if let Some(maps) = &self.ep.option {
            let _ = maps.unregister_listener(&self.keys);
        }
    }
}

// ---------------------------------------------------------------------------- link group

/// One SMC-R link group: its link, its LLC flow machine and what the machine decided.
#[derive(Debug)]
struct Group {
    lgr_id: u32,
    client: bool,
    peer_id: [u8; 8],
    peer_gid: [u8; 16],
    peer_qpn: u32,
    psn: u32,
    link: Arc<RoceLink<SoftDevice>>,
    sh: Mutex<Shared>,
    cv: Condvar,
    /// Connections closed by their application that still finish their close (the kernel
    /// keeps the socket until the close handshake ends or its timer fires).
    lingering: Mutex<Vec<(Conn, Instant)>>,
}

#[derive(Debug)]
struct Shared {
    llc: Llc,
    first: Option<Result<(), String>>,
    rkeys: HashMap<u32, Result<(), String>>,
    keys: HashMap<u32, RmbKey>,
    dead: Option<String>,
    conns: u32,
    lgr_type: LgrType,
}

/// An SMC-R connection of this module.
type Conn = Arc<SmcConn<SmcrLink<SoftDevice>>>;

/// How long a closed connection may take to finish its close.
const LINGER: Duration = Duration::from_secs(10);

impl Group {
    fn start(
        lgr_id: u32,
        client: bool,
        peer: &SmcrPeer,
        link: Arc<RoceLink<SoftDevice>>,
        llc: Llc,
        first: FirstLink,
    ) -> Arc<Group> {
        let (psn, token, key) = (first.psn, first.rmb.0, first.rmb_key);
        let g = Arc::new(Group {
            lgr_id,
            client,
            peer_id: peer.peer_id,
            peer_gid: peer.gid,
            peer_qpn: peer.qpn,
            psn,
            link,
            sh: Mutex::new(Shared {
                llc,
                first: None,
                rkeys: HashMap::new(),
                keys: HashMap::from([(token, key)]),
                dead: None,
                conns: 0,
                lgr_type: LgrType::None,
            }),
            cv: Condvar::new(),
            lingering: Mutex::new(Vec::new()),
        });
        let w = Arc::downgrade(&g);
        g.link.set_llc_handler(Box::new(move |bytes| {
            if let Some(g) = w.upgrade() {
                let mut sh = lock(&g.sh);
                let now = core_now();
                let _ = sh.llc.handle_message(now, LinkIdx::FIRST, bytes);
                g.run(&mut sh, now);
            }
        }));
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

    /// Carries out what the flow machine asks, answering each step at once.
    fn run(&self, sh: &mut Shared, now: smc_core::Instant) {
        while let Some(a) = sh.llc.poll_action() {
            match a {
                LlcAction::Send { id, msg, .. } => {
                    let ok = self.link.send_llc(&msg.to_bytes()).is_ok();
                    sh.llc.send_done(now, id, ok);
                }
                // The QP went to RTS with the Confirm (the soft device needs no wait for the
                // server's first packet) and the RMB is registered on the only link.
                LlcAction::RtsAndRegister { link } => {
                    let _ = sh.llc.link_ready(now, link, true);
                }
                // One port and max_links 1: no second link is created.
                LlcAction::CreateLink { link, .. } => {
                    let _ = sh.llc.link_created(now, link, Err(StepFailed));
                }
                LlcAction::ReadyLink { link, .. } => {
                    let _ = sh.llc.link_ready(now, link, false);
                }
                LlcAction::RegisterRmb { rmb, links } => {
                    let r = match sh.keys.get(&rmb.0) {
                        Some(k) => Ok(links.iter().map(|l| (*l, *k)).collect()),
                        None => Err(StepFailed),
                    };
                    let _ = sh.llc.rmb_registered(now, rmb, r);
                }
                LlcAction::GroupType(t) => sh.lgr_type = t,
                LlcAction::FirstContact(r) => {
                    sh.first = Some(r.map(|_| ()).map_err(|e| format!("{e:?}")));
                }
                LlcAction::RkeyConfirmed { rmb, result } => {
                    sh.rkeys.insert(rmb.0, result.map_err(|e| format!("{e:?}")));
                }
                LlcAction::Terminated { reason, .. } => {
                    sh.dead = Some(format!("{reason:?}"));
                    self.link.abort();
                }
                // One link: the peer's rtokens are the ones its CLC messages named, and
                // there is no link to move connections to.
                LlcAction::SetRtoken { .. }
                | LlcAction::DeleteRtoken { .. }
                | LlcAction::LinkActive { .. }
                | LlcAction::LinkDown { .. }
                | LlcAction::LinkDeleted { .. }
                | LlcAction::MoveConnections { .. }
                | LlcAction::RkeyDeleted { .. } => {}
            }
        }
        self.cv.notify_all();
    }

    /// The group's timer: the flow machine's deadlines, and closed connections' lingering.
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
        }
    }

    /// Lets go of connections whose close finished: their RMBs leave the group, and the peer
    /// is told with DELETE_RKEY (`smcr_buf_unuse`) once the RKEY flow is ours.
    fn sweep(&self) {
        let now = Instant::now();
        let mut l = lock(&self.lingering);
        let mut gone = Vec::new();
        l.retain(|(c, since)| {
            let done = c.state() == SmcState::Closed || c.is_aborted() || now - *since > LINGER;
            if done {
                gone.push(c.info.local_token as u32);
            }
            !done
        });
        drop(l);
        if gone.is_empty() {
            return;
        }
        let mut sh = lock(&self.sh);
        sh.conns = sh.conns.saturating_sub(gone.len() as u32);
        let now = core_now();
        for token in gone {
            sh.keys.remove(&token);
            let _ = sh.llc.unregister_rmb(now, RmbId(token));
        }
        self.run(&mut sh, now);
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
        loop {
            if let Some(r) = result(&mut sh) {
                return r;
            }
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

    /// `smcr_lgr_reg_rmbs`: the RMB `token` joins the group; returns once the peer
    /// confirmed its rkey (CONFIRM_RKEY), or why not.
    fn register(&self, token: u32, key: RmbKey) -> Result<(), String> {
        let mut sh = lock(&self.sh);
        sh.keys.insert(token, key);
        let now = core_now();
        sh.llc.register_rmb(now, RmbId(token), LinkIdx::FIRST);
        self.run(&mut sh, now);
        // The flow waits SMC_LLC_WAIT_TIME for the answer, and up to ten times that for the
        // flow to be ours.
        self.wait_for(sh, Duration::from_secs(25), "CONFIRM_RKEY", |sh| {
            sh.rkeys.remove(&token)
        })
    }

    /// The group's link as a CLC message names it.
    fn offer(&self, mtu: u8) -> LinkOffer {
        LinkOffer {
            qpn: self.link.qp_num(),
            psn: self.psn,
            mtu,
        }
    }

    fn joined(&self) {
        lock(&self.sh).conns += 1;
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
        self.link.abort();
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

#[derive(Debug)]
enum Kind {
    Smc {
        conn: Arc<SmcConn<SmcrLink<SoftDevice>>>,
        group: Arc<Group>,
    },
    Tcp {
        sock: TcpStream,
        fallback: Fallback,
    },
}

impl SmcrStream {
    /// SMC-R or TCP.
    pub fn mode(&self) -> SmcrMode {
        match &self.kind {
            Kind::Smc { conn, group } => {
                let i = &conn.info;
                SmcrMode::SmcR {
                    lgr_id: group.lgr_id,
                    local_token: i.local_token as u32,
                    peer_token: i.peer_token as u32,
                }
            }
            Kind::Tcp { fallback, .. } => SmcrMode::Tcp(*fallback),
        }
    }

    /// `shutdown(2)`.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match &self.kind {
            Kind::Smc { conn, .. } => conn.shutdown(how),
            Kind::Tcp { sock, .. } => sock.shutdown(how),
        }
    }

    /// `SO_RCVTIMEO`.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match &self.kind {
            Kind::Smc { conn, .. } => {
                conn.set_read_timeout(t);
                Ok(())
            }
            Kind::Tcp { sock, .. } => sock.set_read_timeout(t),
        }
    }

    /// `TCP_NODELAY`.
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        match &self.kind {
            Kind::Smc { conn, .. } => {
                conn.set_nodelay(on);
                Ok(())
            }
            Kind::Tcp { sock, .. } => sock.set_nodelay(on),
        }
    }
}

impl Read for SmcrStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.kind {
            Kind::Smc { conn, .. } => conn.read(buf),
            Kind::Tcp { sock, .. } => sock.read(buf),
        }
    }
}

impl Write for SmcrStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.kind {
            Kind::Smc { conn, .. } => conn.write_with(buf, false, false),
            Kind::Tcp { sock, .. } => sock.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.kind {
            Kind::Smc { conn, .. } => conn.flush(),
            Kind::Tcp { sock, .. } => sock.flush(),
        }
    }
}

impl Drop for SmcrStream {
    fn drop(&mut self) {
        if let Kind::Smc { conn, group } = &self.kind {
            conn.close_now();
            // The close finishes on the link's completion thread; the group keeps the
            // connection until it has (or LINGER passed).
            group.closed(Arc::clone(conn));
        }
    }
}
