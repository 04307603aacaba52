//! An engine's status area: its counters, sockets, link groups and listeners, written by the
//! engine and read by `smcd` when an operator asks (the kernel's per-cpu `smc_stats`, the
//! socket table sock_diag walks and the link-group list, which live in one address space
//! there).
//!
//! Counting stays off the data path's shared cache lines: every connection owns a slot (its
//! own cache lines) and its send and receive paths each bump their own words with a plain
//! load and store, no locked instruction. When a connection ends, its counters are folded
//! into the engine's totals under a sequence word, so a concurrent reader counts it exactly
//! once. `smcd` sums totals and live slots at dump time.
//!
//! # Layout
//!
//! ```text
//! 0      header: magic, version, pid, slot counts, fold sequence
//! 64     totals: TOTALS u64 counters (see the `T_*` indices)
//! 4096   CONN_SLOTS x 512 B connection slots
//! ...    LGR_SLOTS x 256 B link-group slots
//! ...    LST_SLOTS x 64 B listener slots
//! ```

use super::region::Region;
use super::{seq_read, seq_write};
use smc_proto::clc::ReasonCode;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

/// Whether the data path counts (on by default). Off only to measure what counting costs:
/// `smc-perf --no-stats`.
static COUNTING: AtomicBool = AtomicBool::new(true);

/// Turns per-connection data-path counting on or off for this process.
pub fn set_counting(on: bool) {
    COUNTING.store(on, Relaxed);
}

const MAGIC: u64 = u64::from_le_bytes(*b"SMCSTAT1");
/// The layout version in the header (smcd reads only areas of its own version).
/// 2: 16,384 link-group slots (1,024 before, which capped `linkgroup show` per engine).
/// 3: the capability-path totals (`T_*_PATH_*`) before the fallback reasons.
/// 4: 512-byte link-group slots, which also hold SMC-R link groups (with their links) and
/// SMC-R device ports ([`LgrSlot::publish_port`]).
pub const VERSION: u32 = 4;
const H_PID: usize = 12;
const H_FOLD_SEQ: usize = 32;
const TOTALS: usize = 64;

/// Connection slots.
pub const CONN_SLOTS: usize = 16384;
/// Bytes per connection slot.
pub const CONN_SLOT: usize = 512;
/// Link-group slots: as many as connections, since a link group outlives its connections
/// (for `lgr_idle_time`), and a server engine has one per client engine. Pages the engine
/// never writes cost nothing, to it or to smcd.
pub const LGR_SLOTS: usize = 16384;
/// Bytes per link-group slot.
pub const LGR_SLOT: usize = 512;
/// Listener slots.
pub const LST_SLOTS: usize = 256;
/// Bytes per listener slot.
pub const LST_SLOT: usize = 64;

const CONN_BASE: usize = 4096;
const LGR_BASE: usize = CONN_BASE + CONN_SLOTS * CONN_SLOT;
const LST_BASE: usize = LGR_BASE + LGR_SLOTS * LGR_SLOT;
/// Size of a status area.
pub const STATUS_LEN: usize = LST_BASE + LST_SLOTS * LST_SLOT;

/// Payload-size and buffer-size buckets (`SMC_BUF_MAX`).
pub const BUCKETS: usize = 9;
/// RMB statistics per direction (`SMC_NLA_STATS_RMB_*`).
pub const RMB_STATS: usize = 7;
/// Fallback reasons counted by index in [`ReasonCode::ALL`], plus one "other".
pub const FBACK_CODES: usize = ReasonCode::ALL.len() + 1;

// Totals, as word indices.
/// Client handshakes that ended in SMC v1.
pub const T_CLNT_V1_SUCC: usize = 0;
/// Client handshakes that ended in SMC v2.
pub const T_CLNT_V2_SUCC: usize = 1;
/// Server handshakes that ended in SMC v1.
pub const T_SRV_V1_SUCC: usize = 2;
/// Server handshakes that ended in SMC v2.
pub const T_SRV_V2_SUCC: usize = 3;
/// Client handshakes that failed without fallback.
pub const T_CLNT_HS_ERR: usize = 4;
/// Server handshakes that failed without fallback.
pub const T_SRV_HS_ERR: usize = 5;
/// sendmsg calls.
pub const T_TX_CNT: usize = 6;
/// Bytes sent.
pub const T_TX_BYTES: usize = 7;
/// recvmsg calls.
pub const T_RX_CNT: usize = 8;
/// Bytes received.
pub const T_RX_BYTES: usize = 9;
/// Cork pushes.
pub const T_CORK: usize = 10;
/// Nodelay pushes.
pub const T_NDLY: usize = 11;
/// Urgent data sends (never: no MSG_OOB yet).
pub const T_URG: usize = 12;
/// sendpage calls (always 0 in current kernels).
pub const T_SENDPAGE: usize = 13;
/// splice calls.
pub const T_SPLICE: usize = 14;
/// Send payload-size buckets.
pub const T_TX_PD: usize = 15;
/// Receive payload-size buckets.
pub const T_RX_PD: usize = T_TX_PD + BUCKETS;
/// Send-buffer size buckets.
pub const T_TX_RMB_SIZE: usize = T_RX_PD + BUCKETS;
/// Receive-buffer size buckets.
pub const T_RX_RMB_SIZE: usize = T_TX_RMB_SIZE + BUCKETS;
/// Send-side RMB statistics (size small peer, size small, full peer, full, reuse, alloc,
/// downgrade).
pub const T_TX_RMB: usize = T_RX_RMB_SIZE + BUCKETS;
/// Receive-side RMB statistics.
pub const T_RX_RMB: usize = T_TX_RMB + RMB_STATS;
/// Send buffer bytes in use (newer kernels' `TX_RMB_USAGE`).
pub const T_TX_RMB_USAGE: usize = T_RX_RMB + RMB_STATS;
/// Receive buffer bytes in use.
pub const T_RX_RMB_USAGE: usize = T_TX_RMB_USAGE + 1;
/// Client connections that learned from the SMC TCP option whether their peer speaks SMC
/// (the socket was marked before `connect`; echoed or not).
pub const T_CLNT_PATH_OPTION: usize = T_RX_RMB_USAGE + 1;
/// Client connections that learned it from smcd (its listener table or a connect intent).
pub const T_CLNT_PATH_INTENT: usize = T_CLNT_PATH_OPTION + 1;
/// Accepted connections whose client the SMC option announced.
pub const T_SRV_PATH_OPTION: usize = T_CLNT_PATH_INTENT + 1;
/// Accepted connections whose client smcd announced (an intent).
pub const T_SRV_PATH_INTENT: usize = T_SRV_PATH_OPTION + 1;
/// Client fallbacks by reason.
pub const T_CLNT_FBACK: usize = T_SRV_PATH_INTENT + 1;
/// Server fallbacks by reason.
pub const T_SRV_FBACK: usize = T_CLNT_FBACK + FBACK_CODES;
/// The per-technology counters (those below [`T_CLNT_FBACK`]) of SMC-R connections: counter
/// `t` of SMC-R is at `T_SMCR + t` (the kernel's `SMC_NLA_STATS_SMCR_TECH`); the indices
/// below [`T_CLNT_FBACK`] are SMC-D's. Fallbacks are not per technology.
pub const T_SMCR: usize = T_SRV_FBACK + FBACK_CODES;
/// Number of total counters.
pub const N_TOTALS: usize = T_SMCR + T_CLNT_FBACK;
const _: () = assert!(TOTALS + 8 * N_TOTALS <= CONN_BASE);

/// RMB statistic: peer's buffer too small for a send.
pub const RMB_SIZE_SM_PEER: usize = 0;
/// RMB statistic: own buffer too small.
pub const RMB_SIZE_SM: usize = 1;
/// RMB statistic: peer's buffer full.
pub const RMB_FULL_PEER: usize = 2;
/// RMB statistic: own buffer full.
pub const RMB_FULL: usize = 3;
/// RMB statistic: buffer reused.
pub const RMB_REUSE: usize = 4;
/// RMB statistic: buffer allocated.
pub const RMB_ALLOC: usize = 5;
/// RMB statistic: smaller buffer than asked for.
pub const RMB_DGRADE: usize = 6;

/// The size bucket of `len` bytes: `fls64((len - 1) >> 13)` capped at 8 (`smc_stats.h`).
pub fn bucket(len: u64) -> usize {
    if len == 0 {
        return 0;
    }
    let v = (len - 1) >> 13;
    let fls = (u64::BITS - v.leading_zeros()) as usize;
    fls.min(BUCKETS - 1)
}

/// The fallback index of a reason code.
pub fn fback_index(code: ReasonCode) -> usize {
    ReasonCode::ALL
        .iter()
        .position(|c| *c == code)
        .unwrap_or(FBACK_CODES - 1)
}

// Connection slot words (byte offsets).
const C_SEQ: usize = 0;
const C_USE: usize = 4;
/// state u8, mode u8, role u8, family u8, shutdown u8.
const C_KIND: usize = 8;
const C_FBACK: usize = 16;
const C_PORTS: usize = 24;
const C_LADDR: usize = 32;
const C_PADDR: usize = 48;
const C_INODE: usize = 64;
const C_LGR: usize = 72;
const C_TOKEN: usize = 80;
const C_PTOKEN: usize = 88;
const C_GID: usize = 96;
const C_PGID: usize = 112;
const C_RMBE: usize = 128;
const C_PRMBE: usize = 136;
const C_SNDBUF: usize = 144;
/// rx_prod, rx_cons, tx_prod, tx_cons, tx_prep, tx_sent, tx_fin (absolute positions).
const C_CURS: usize = 152;
const C_FLAGS: usize = 208;
/// tx_cnt, tx_bytes, rx_cnt, rx_bytes, cork, ndly, tx_pd[9], rx_pd[9].
const C_CNT: usize = 216;
/// Buffer events of the data path (tx too small, tx full, rx full), counted per connection
/// and folded into the totals when it ends, like the other counters: the data path never
/// writes a cache line it shares with other connections.
const C_RMB: usize = C_CNT + 8 * (6 + 2 * BUCKETS);
/// SMC-R: [`LINK_SMCR`] and the id of the link the connection sends on (low byte); 0 for
/// other connections.
const C_LINK: usize = CONN_SLOT - 8;
/// In [`C_LINK`]: an SMC-R connection (its counters fold into the SMC-R totals).
const LINK_SMCR: u64 = 0x100;
const _: () = assert!(C_RMB + 8 * RMB_STATS <= C_LINK);
const _: () = assert!(C_RMB + 8 * 3 <= CONN_SLOT);

/// A buffer event of the data path (`SMC_STAT_RMB_TX_SIZE_SMALL`, `_TX_FULL`, `_RX_FULL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RmbEvent {
    /// A send asked for more than the send buffer holds (the kernel counts it for the local
    /// and the peer's buffer alike: with DMB no-copy they are one).
    TxSizeSmall = 0,
    /// A send found the peer's buffer full.
    TxFull = 1,
    /// The peer filled our buffer.
    RxFull = 2,
}

/// Where each event is folded: (totals, the same event counted again for the peer's buffer).
const RMB_FOLD: [(usize, Option<usize>); 3] = [
    (T_TX_RMB + RMB_SIZE_SM, Some(T_TX_RMB + RMB_SIZE_SM_PEER)),
    (T_TX_RMB + RMB_FULL, Some(T_TX_RMB + RMB_FULL_PEER)),
    (T_RX_RMB + RMB_FULL, None),
];

/// Index of a connection counter word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cnt {
    /// sendmsg calls.
    TxCnt = 0,
    /// Bytes sent.
    TxBytes = 1,
    /// recvmsg calls.
    RxCnt = 2,
    /// Bytes received.
    RxBytes = 3,
    /// Cork pushes.
    Cork = 4,
    /// Nodelay pushes.
    Ndly = 5,
}

/// The cursor words of a connection slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Curs {
    /// The peer's producer cursor as last seen (`local_rx_ctrl.prod`).
    RxProd = 0,
    /// The peer's consumer cursor as last seen (`local_rx_ctrl.cons`).
    RxCons = 1,
    /// Our producer cursor as last sent (`local_tx_ctrl.prod`).
    TxProd = 2,
    /// Our consumer cursor as last sent (`local_tx_ctrl.cons`).
    TxCons = 3,
    /// Bytes prepared for sending (`tx_curs_prep`).
    TxPrep = 4,
    /// Bytes sent (`tx_curs_sent`).
    TxSent = 5,
    /// Bytes whose sending finished (`tx_curs_fin`).
    TxFin = 6,
}

// Link-group slot words.
const G_SEQ: usize = 0;
const G_USE: usize = 4;
/// id u32, role u8, version u8, release u8, os u8.
const G_ID: usize = 8;
const G_CONNS: usize = 16;
const G_PGID: usize = 24;
const G_GID: usize = 40;
const G_SNDBUF: usize = 56;
const G_DMB: usize = 64;
const G_HOST: usize = 72;
const G_EID: usize = 104;
/// kind u8 (0 SMC-D group, 1 SMC-R group, 2 SMC-R device port), then for an SMC-R group its
/// type u8, max_conns u8, max_links u8, number of links u8 and buffer type u8.
const G_KIND: usize = 136;
/// SMC-R: up to [`SMCR_LINKS`] link records of [`LINK_REC`] bytes.
const G_LINKS: usize = 144;
const LINK_REC: usize = 96;
/// Links a slot holds (`SMC_LINKS_PER_LGR_MAX`).
pub const SMCR_LINKS: usize = 3;
// Link record words: id u8, state u8, ib_port u8, conn_cnt u32 (at bit 32); uid u32, peer
// uid u32; netdev ifindex u32; gid 16; peer gid 16; ib_dev 32.
const K_INFO: usize = 0;
const K_UID: usize = 8;
const K_NETDEV: usize = 16;
const K_GID: usize = 24;
const K_PGID: usize = 40;
const K_IBDEV: usize = 56;
// Device port records reuse the group words: ib_dev name at G_HOST, netdev ifindex | ib_port
// << 32 | active << 40 at G_CONNS, links on the port at G_SNDBUF, the port's GID at G_GID.
const _: () = assert!(G_LINKS + SMCR_LINKS * LINK_REC <= LGR_SLOT);
const KIND_SMCD: u8 = 0;
const KIND_SMCR: u8 = 1;
const KIND_PORT: u8 = 2;

// Listener slot words.
const L_SEQ: usize = 0;
const L_USE: usize = 4;
const L_PORT: usize = 8;
const L_ADDR: usize = 16;
const L_INODE: usize = 32;
const L_INFO: usize = 40;

fn put_addr(r: &Region, off: usize, ip: IpAddr) {
    let o = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    r.u64_at(off)
        .store(u64::from_ne_bytes(o[..8].try_into().expect("8")), Relaxed);
    r.u64_at(off + 8)
        .store(u64::from_ne_bytes(o[8..].try_into().expect("8")), Relaxed);
}

fn get_addr(r: &Region, off: usize) -> IpAddr {
    let mut o = [0u8; 16];
    o[..8].copy_from_slice(&r.u64_at(off).load(Relaxed).to_ne_bytes());
    o[8..].copy_from_slice(&r.u64_at(off + 8).load(Relaxed).to_ne_bytes());
    let v6 = Ipv6Addr::from(o);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

fn put_str32(r: &Region, off: usize, s: &str) {
    let mut b = [0u8; 32];
    let n = s.len().min(32);
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
    for i in 0..4 {
        r.u64_at(off + 8 * i).store(
            u64::from_ne_bytes(b[8 * i..8 * i + 8].try_into().expect("8")),
            Relaxed,
        );
    }
}

fn get_str32(r: &Region, off: usize) -> String {
    let mut b = [0u8; 32];
    for i in 0..4 {
        b[8 * i..8 * i + 8].copy_from_slice(&r.u64_at(off + 8 * i).load(Relaxed).to_ne_bytes());
    }
    let end = b.iter().position(|&c| c == 0).unwrap_or(32);
    String::from_utf8_lossy(&b[..end]).trim_end().to_string()
}

// ------------------------------------------------------------------------------------------
// Writer side (the engine).

/// An engine's status area.
#[derive(Debug)]
pub struct StatusArea {
    r: Region,
    free_conns: Mutex<Vec<u32>>,
    free_lgrs: Mutex<Vec<u32>>,
    free_lsts: Mutex<Vec<u32>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl StatusArea {
    fn init(r: Region) -> Arc<StatusArea> {
        r.u64_at(0).store(MAGIC, Relaxed);
        r.u32_at(8).store(VERSION, Relaxed);
        r.u32_at(H_PID).store(std::process::id(), Relaxed);
        r.u32_at(16).store(CONN_SLOTS as u32, Relaxed);
        r.u32_at(20).store(LGR_SLOTS as u32, Relaxed);
        r.u32_at(24).store(LST_SLOTS as u32, Release);
        Arc::new(StatusArea {
            r,
            // Slot 0 of each kind is kept as the sink for objects that find the area full.
            free_conns: Mutex::new((1..CONN_SLOTS as u32).rev().collect()),
            free_lgrs: Mutex::new((1..LGR_SLOTS as u32).rev().collect()),
            free_lsts: Mutex::new((1..LST_SLOTS as u32).rev().collect()),
        })
    }

    /// A shared area and the descriptor to hand to smcd.
    pub fn shared() -> io::Result<(Arc<StatusArea>, rustix::fd::OwnedFd)> {
        let (r, fd) = Region::create("smc-status", STATUS_LEN)?;
        Ok((Self::init(r), fd))
    }

    /// An area nobody else reads (no smcd).
    pub fn private() -> io::Result<Arc<StatusArea>> {
        Ok(Self::init(super::region::private(STATUS_LEN)?))
    }

    /// Adds `n` to total counter `t` (events, not bytes: a locked add is fine here).
    pub fn add(&self, t: usize, n: u64) {
        debug_assert!(t < N_TOTALS);
        self.r.u64_at(TOTALS + 8 * t).fetch_add(n, Relaxed);
    }

    /// A slot for a new connection.
    pub fn conn_slot(self: &Arc<Self>) -> ConnSlot {
        let idx = lock(&self.free_conns).pop().unwrap_or(0);
        let base = CONN_BASE + idx as usize * CONN_SLOT;
        // Bounds of the whole slot, checked once: its first and last words.
        let first = self.r.u64_at(base);
        let _ = self.r.u64_at(base + CONN_SLOT - 8);
        let s = ConnSlot {
            area: Arc::clone(self),
            base,
            idx,
            words: std::ptr::NonNull::from(first),
        };
        if idx != 0 {
            for w in (8..CONN_SLOT).step_by(8) {
                self.r.u64_at(s.base + w).store(0, Relaxed);
            }
        }
        s
    }

    /// A slot for a new link group.
    pub fn lgr_slot(self: &Arc<Self>) -> LgrSlot {
        let idx = lock(&self.free_lgrs).pop().unwrap_or(0);
        LgrSlot {
            area: Arc::clone(self),
            base: LGR_BASE + idx as usize * LGR_SLOT,
            idx,
        }
    }

    /// A slot for a new listener.
    pub fn listener_slot(self: &Arc<Self>) -> LstSlot {
        let idx = lock(&self.free_lsts).pop().unwrap_or(0);
        LstSlot {
            area: Arc::clone(self),
            base: LST_BASE + idx as usize * LST_SLOT,
            idx,
        }
    }
}

/// Identity of a connection, written once when its slot is published.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnIdentity {
    /// `smc_state`.
    pub state: u8,
    /// smc_diag mode: 0 SMCR, 1 TCP, 2 SMCD.
    pub mode: u8,
    /// 0 client, 1 server.
    pub role: u8,
    /// Fallback reasons (local, peer).
    pub fallback: (u32, u32),
    /// Our address.
    pub local: Option<SocketAddr>,
    /// The peer's address.
    pub peer: Option<SocketAddr>,
    /// Inode of the TCP socket.
    pub inode: u64,
    /// Link group id.
    pub lgr: u32,
    /// Our DMB token.
    pub token: u64,
    /// The peer's DMB token.
    pub peer_token: u64,
    /// Our GID.
    pub gid: u128,
    /// The peer's GID.
    pub peer_gid: u128,
    /// Our DMB size.
    pub rmbe: u64,
    /// The peer's DMB size.
    pub peer_rmbe: u64,
    /// Our send buffer size (with the loopback device, the peer's ring).
    pub sndbuf: u64,
}

/// A connection's slot; freed (counters folded into the totals) when dropped.
#[derive(Debug)]
pub struct ConnSlot {
    area: Arc<StatusArea>,
    base: usize,
    idx: u32,
    /// The slot's first word (checked to lie inside the area when the slot was made).
    words: std::ptr::NonNull<AtomicU64>,
}

// SAFETY: `words` points into the status area that `area` keeps mapped; only atomics are
// accessed through it.
unsafe impl Send for ConnSlot {}
// SAFETY: as above.
unsafe impl Sync for ConnSlot {}

impl ConnSlot {
    /// The word at byte offset `off` of the slot. The data path calls this on every send and
    /// receive, so the bound is a compile-time layout fact (debug-checked), not a run-time
    /// check.
    #[inline]
    fn w(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= CONN_SLOT);
        // SAFETY: the slot [base, base + CONN_SLOT) lies inside the mapped area (checked in
        // `conn_slot`), the area outlives `self`, and `off` is one of the layout's offsets.
        unsafe { &*self.words.as_ptr().add(off / 8) }
    }

    /// Writes the identity and makes the slot visible.
    pub fn publish(&self, id: &ConnIdentity) {
        if self.idx == 0 {
            return;
        }
        let r = &self.area.r;
        seq_write(r.u32_at(self.base + C_SEQ), || {
            let fam = match id.local {
                Some(SocketAddr::V6(_)) => 10,
                _ => 2,
            };
            self.w(C_KIND).store(
                u64::from(id.state)
                    | u64::from(id.mode) << 8
                    | u64::from(id.role) << 16
                    | fam << 24,
                Relaxed,
            );
            self.w(C_FBACK).store(
                u64::from(id.fallback.0) | u64::from(id.fallback.1) << 32,
                Relaxed,
            );
            let (lp, pp) = (
                id.local.map_or(0, |a| a.port()),
                id.peer.map_or(0, |a| a.port()),
            );
            self.w(C_PORTS)
                .store(u64::from(lp) | u64::from(pp) << 16, Relaxed);
            if let Some(a) = id.local {
                put_addr(r, self.base + C_LADDR, a.ip());
            }
            if let Some(a) = id.peer {
                put_addr(r, self.base + C_PADDR, a.ip());
            }
            self.w(C_INODE).store(id.inode, Relaxed);
            self.w(C_LGR).store(u64::from(id.lgr), Relaxed);
            self.w(C_TOKEN).store(id.token, Relaxed);
            self.w(C_PTOKEN).store(id.peer_token, Relaxed);
            self.w(C_GID).store((id.gid >> 64) as u64, Relaxed);
            self.w(C_GID + 8).store(id.gid as u64, Relaxed);
            self.w(C_PGID).store((id.peer_gid >> 64) as u64, Relaxed);
            self.w(C_PGID + 8).store(id.peer_gid as u64, Relaxed);
            self.w(C_RMBE).store(id.rmbe, Relaxed);
            self.w(C_PRMBE).store(id.peer_rmbe, Relaxed);
            self.w(C_SNDBUF).store(id.sndbuf, Relaxed);
            r.u32_at(self.base + C_USE).store(1, Relaxed);
        });
    }

    /// Updates the state byte (and shutdown bits: bit 0 RCV, bit 1 SEND).
    pub fn set_state(&self, state: u8, shutdown: u8) {
        let w = self.w(C_KIND);
        let v = w.load(Relaxed) & !0xff_0000_00ff;
        w.store(v | u64::from(state) | u64::from(shutdown) << 32, Relaxed);
    }

    /// Bumps counter `c` by `n` (single writer per counter: a plain load and store).
    #[inline]
    pub fn bump(&self, c: Cnt, n: u64) {
        let w = self.w(C_CNT + 8 * c as usize);
        w.store(w.load(Relaxed).wrapping_add(n), Relaxed);
    }

    /// Bumps payload bucket `b` of the send (`tx`) or receive side.
    #[inline]
    pub fn bump_pd(&self, tx: bool, b: usize) {
        let w = self.w(C_CNT + 8 * (6 + if tx { 0 } else { BUCKETS } + b.min(BUCKETS - 1)));
        w.store(w.load(Relaxed).wrapping_add(1), Relaxed);
    }

    /// Sets a cursor word.
    #[inline]
    pub fn set_cursor(&self, c: Curs, pos: u64) {
        if !COUNTING.load(Relaxed) {
            return;
        }
        self.w(C_CURS + 8 * c as usize).store(pos, Relaxed);
    }

    /// Sets several cursor words (one check of whether counting is on).
    #[inline]
    pub fn set_cursors(&self, c: &[(Curs, u64)]) {
        if !COUNTING.load(Relaxed) {
            return;
        }
        for (c, pos) in c {
            self.w(C_CURS + 8 * *c as usize).store(*pos, Relaxed);
        }
    }

    /// SMC-R: the connection sends on the link with this id (`conn->lnk`, for `smcss -R`).
    pub fn set_link(&self, link_id: u8) {
        self.w(C_LINK)
            .store(LINK_SMCR | u64::from(link_id), Relaxed);
    }

    /// Where this connection's counters fold: SMC-R's block or SMC-D's.
    fn tech(&self) -> usize {
        if self.w(C_LINK).load(Relaxed) & LINK_SMCR != 0 {
            T_SMCR
        } else {
            0
        }
    }

    /// Sets the flag bytes: rx producer, rx conn state, tx producer, tx conn state.
    pub fn set_flags(&self, rx_p: u8, rx_c: u8, tx_p: u8, tx_c: u8) {
        self.w(C_FLAGS).store(
            u64::from_le_bytes([rx_p, rx_c, tx_p, tx_c, 0, 0, 0, 0]),
            Relaxed,
        );
    }

    /// Counts a buffer event (single writer: a plain load and store in the slot's own line).
    #[inline]
    pub fn rmb_event(&self, e: RmbEvent) {
        if !COUNTING.load(Relaxed) {
            return;
        }
        let w = self.w(C_RMB + 8 * e as usize);
        w.store(w.load(Relaxed).wrapping_add(1), Relaxed);
    }

    /// A buffer event count (tests, diagnostics).
    pub fn rmb_events(&self, e: RmbEvent) -> u64 {
        self.w(C_RMB + 8 * e as usize).load(Relaxed)
    }

    /// One send of `requested` bytes that sent `sent` (the kernel's `SMC_STAT_PAYLOAD` rules:
    /// every call counts, bucket by request size, bytes by what was sent).
    #[inline]
    pub fn tx(&self, requested: usize, sent: usize) {
        if !COUNTING.load(Relaxed) {
            return;
        }
        self.bump(Cnt::TxCnt, 1);
        if requested > 0 && sent > 0 {
            self.bump_pd(true, bucket(requested as u64));
            self.bump(Cnt::TxBytes, sent as u64);
        }
    }

    /// One receive that returned `got` bytes.
    #[inline]
    pub fn rx(&self, requested: usize, got: usize) {
        if !COUNTING.load(Relaxed) {
            return;
        }
        self.bump(Cnt::RxCnt, 1);
        if requested > 0 && got > 0 {
            self.bump_pd(false, bucket(got as u64));
            self.bump(Cnt::RxBytes, got as u64);
        }
    }

    /// Reads a counter back (tests, diagnostics).
    pub fn counter(&self, c: Cnt) -> u64 {
        self.w(C_CNT + 8 * c as usize).load(Relaxed)
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        if self.idx == 0 {
            return;
        }
        let r = &self.area.r;
        // Fold under the sequence word: a reader that overlaps retries, so it counts this
        // connection either in its slot or in the totals, never both or neither.
        let off = self.tech();
        seq_write(r.u32_at(H_FOLD_SEQ), || {
            let map = [
                (Cnt::TxCnt, T_TX_CNT),
                (Cnt::TxBytes, T_TX_BYTES),
                (Cnt::RxCnt, T_RX_CNT),
                (Cnt::RxBytes, T_RX_BYTES),
                (Cnt::Cork, T_CORK),
                (Cnt::Ndly, T_NDLY),
            ];
            for (c, t) in map {
                let v = self.counter(c);
                if v != 0 {
                    self.area.add(off + t, v);
                }
            }
            for (k, (t, peer)) in RMB_FOLD.iter().enumerate() {
                let v = self.w(C_RMB + 8 * k).load(Relaxed);
                if v != 0 {
                    self.area.add(off + *t, v);
                    if let Some(p) = peer {
                        self.area.add(off + *p, v);
                    }
                }
            }
            for b in 0..BUCKETS {
                let tx = self.w(C_CNT + 8 * (6 + b)).load(Relaxed);
                let rx = self.w(C_CNT + 8 * (6 + BUCKETS + b)).load(Relaxed);
                if tx != 0 {
                    self.area.add(off + T_TX_PD + b, tx);
                }
                if rx != 0 {
                    self.area.add(off + T_RX_PD + b, rx);
                }
            }
            r.u32_at(self.base + C_USE).store(0, Relaxed);
        });
        lock(&self.area.free_conns).push(self.idx);
    }
}

/// A link group's slot.
#[derive(Debug)]
pub struct LgrSlot {
    area: Arc<StatusArea>,
    base: usize,
    idx: u32,
}

/// What a link-group slot shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LgrRecord {
    /// Link group id.
    pub id: u32,
    /// 0 client, 1 server.
    pub role: u8,
    /// SMC version.
    pub version: u8,
    /// Peer release.
    pub release: u8,
    /// Peer OS.
    pub os: u8,
    /// Connections.
    pub conns: u32,
    /// Peer GID.
    pub peer_gid: u128,
    /// Our GID.
    pub gid: u128,
    /// Send buffer bytes (attached peer DMBs).
    pub sndbuf: u64,
    /// DMB bytes (ours).
    pub dmb: u64,
    /// Peer host name.
    pub peer_host: String,
    /// Negotiated EID.
    pub eid: String,
    /// An SMC-R link group: what SMC-D has not (for SMC-R `sndbuf` and `dmb` are the send
    /// buffers' and RMBs' bytes).
    pub smcr: Option<SmcrLgr>,
}

/// The SMC-R part of a link-group record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmcrLgr {
    /// `enum smc_lgr_type` (0 NONE, 1 SINGLE, 2 SYMMETRIC, 3 ASYMMETRIC_PEER, 4
    /// ASYMMETRIC_LOCAL).
    pub lgr_type: u8,
    /// Negotiated `max_conns`.
    pub max_conns: u8,
    /// Negotiated `max_links`.
    pub max_links: u8,
    /// `smcr_buf_type` when it was made.
    pub buf_type: u8,
    /// Its links (at most [`SMCR_LINKS`]).
    pub links: Vec<LinkRecord>,
}

/// One SMC-R link of a group record (what `SMC_GEN_LINK_SMCR` shows).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkRecord {
    /// The wire's link id.
    pub id: u8,
    /// `enum smc_link_state` (0 UNUSED, 1 INACTIVE, 2 ACTIVATING, 3 ACTIVE).
    pub state: u8,
    /// The RoCE device port (1-based).
    pub ib_port: u8,
    /// Connections sending on it.
    pub conn_cnt: u32,
    /// `link_uid`.
    pub uid: u32,
    /// The peer's `link_uid`.
    pub peer_uid: u32,
    /// The netdev's ifindex.
    pub net_dev: u32,
    /// Our GID on it.
    pub gid: [u8; 16],
    /// The peer's.
    pub peer_gid: [u8; 16],
    /// The RoCE device's name.
    pub ib_dev: String,
}

/// One port of an SMC-R device (what `SMC_GEN_DEV_SMCR` shows).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortRecord {
    /// The device's name.
    pub ib_dev: String,
    /// The port (1-based).
    pub ib_port: u8,
    /// Its netdev's ifindex.
    pub net_dev: u32,
    /// The port is up.
    pub active: bool,
    /// Links on it.
    pub lnk_cnt: u32,
    /// Its GID.
    pub gid: u128,
}

impl LgrSlot {
    /// Writes the whole record and makes the slot visible.
    pub fn publish(&self, g: &LgrRecord) {
        if self.idx == 0 {
            return;
        }
        let r = &self.area.r;
        seq_write(r.u32_at(self.base + G_SEQ), || {
            r.u64_at(self.base + G_ID).store(
                u64::from(g.id)
                    | u64::from(g.role) << 32
                    | u64::from(g.version) << 40
                    | u64::from(g.release) << 48
                    | u64::from(g.os) << 56,
                Relaxed,
            );
            r.u64_at(self.base + G_CONNS)
                .store(u64::from(g.conns), Relaxed);
            r.u64_at(self.base + G_PGID)
                .store((g.peer_gid >> 64) as u64, Relaxed);
            r.u64_at(self.base + G_PGID + 8)
                .store(g.peer_gid as u64, Relaxed);
            r.u64_at(self.base + G_GID)
                .store((g.gid >> 64) as u64, Relaxed);
            r.u64_at(self.base + G_GID + 8).store(g.gid as u64, Relaxed);
            r.u64_at(self.base + G_SNDBUF).store(g.sndbuf, Relaxed);
            r.u64_at(self.base + G_DMB).store(g.dmb, Relaxed);
            put_str32(r, self.base + G_HOST, &g.peer_host);
            put_str32(r, self.base + G_EID, &g.eid);
            match &g.smcr {
                None => r
                    .u64_at(self.base + G_KIND)
                    .store(u64::from(KIND_SMCD), Relaxed),
                Some(x) => {
                    let n = x.links.len().min(SMCR_LINKS);
                    r.u64_at(self.base + G_KIND).store(
                        u64::from(KIND_SMCR)
                            | u64::from(x.lgr_type) << 8
                            | u64::from(x.max_conns) << 16
                            | u64::from(x.max_links) << 24
                            | (n as u64) << 32
                            | u64::from(x.buf_type) << 40,
                        Relaxed,
                    );
                    for (k, l) in x.links.iter().take(n).enumerate() {
                        let b = self.base + G_LINKS + k * LINK_REC;
                        r.u64_at(b + K_INFO).store(
                            u64::from(l.id)
                                | u64::from(l.state) << 8
                                | u64::from(l.ib_port) << 16
                                | u64::from(l.conn_cnt) << 32,
                            Relaxed,
                        );
                        r.u64_at(b + K_UID)
                            .store(u64::from(l.uid) | u64::from(l.peer_uid) << 32, Relaxed);
                        r.u64_at(b + K_NETDEV).store(u64::from(l.net_dev), Relaxed);
                        put_addr(r, b + K_GID, IpAddr::V6(Ipv6Addr::from(l.gid)));
                        put_addr(r, b + K_PGID, IpAddr::V6(Ipv6Addr::from(l.peer_gid)));
                        put_str32(r, b + K_IBDEV, &l.ib_dev);
                    }
                }
            }
            r.u32_at(self.base + G_USE).store(1, Relaxed);
        });
    }

    /// Hides the slot's record (the object is gone; the slot is freed when dropped).
    pub fn withdraw(&self) {
        if self.idx == 0 {
            return;
        }
        let r = &self.area.r;
        seq_write(r.u32_at(self.base + G_SEQ), || {
            r.u32_at(self.base + G_USE).store(0, Relaxed)
        });
    }

    /// Writes an SMC-R device port's record into the slot and makes it visible.
    pub fn publish_port(&self, p: &PortRecord) {
        if self.idx == 0 {
            return;
        }
        let r = &self.area.r;
        seq_write(r.u32_at(self.base + G_SEQ), || {
            r.u64_at(self.base + G_KIND)
                .store(u64::from(KIND_PORT), Relaxed);
            put_str32(r, self.base + G_HOST, &p.ib_dev);
            r.u64_at(self.base + G_CONNS).store(
                u64::from(p.net_dev) | u64::from(p.ib_port) << 32 | u64::from(p.active) << 40,
                Relaxed,
            );
            r.u64_at(self.base + G_SNDBUF)
                .store(u64::from(p.lnk_cnt), Relaxed);
            r.u64_at(self.base + G_GID)
                .store((p.gid >> 64) as u64, Relaxed);
            r.u64_at(self.base + G_GID + 8).store(p.gid as u64, Relaxed);
            r.u32_at(self.base + G_USE).store(1, Relaxed);
        });
    }
}

impl Drop for LgrSlot {
    fn drop(&mut self) {
        if self.idx == 0 {
            return;
        }
        let r = &self.area.r;
        seq_write(r.u32_at(self.base + G_SEQ), || {
            r.u32_at(self.base + G_USE).store(0, Relaxed)
        });
        lock(&self.area.free_lgrs).push(self.idx);
    }
}

/// A listener's slot.
#[derive(Debug)]
pub struct LstSlot {
    area: Arc<StatusArea>,
    base: usize,
    idx: u32,
}

/// What a listener slot shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LstRecord {
    /// Bound address.
    pub addr: SocketAddr,
    /// Inode of the TCP listening socket.
    pub inode: u64,
    /// Backlog.
    pub backlog: u32,
    /// Handshake limitation on.
    pub hs_limit: bool,
}

impl LstSlot {
    /// Writes the record and makes the slot visible.
    pub fn publish(&self, l: &LstRecord) {
        if self.idx == 0 {
            return;
        }
        let r = &self.area.r;
        seq_write(r.u32_at(self.base + L_SEQ), || {
            let fam: u64 = if l.addr.is_ipv6() { 10 } else { 2 };
            r.u64_at(self.base + L_PORT)
                .store(u64::from(l.addr.port()) | fam << 16, Relaxed);
            put_addr(r, self.base + L_ADDR, l.addr.ip());
            r.u64_at(self.base + L_INODE).store(l.inode, Relaxed);
            r.u64_at(self.base + L_INFO)
                .store(u64::from(l.backlog) | u64::from(l.hs_limit) << 32, Relaxed);
            r.u32_at(self.base + L_USE).store(1, Relaxed);
        });
    }
}

impl Drop for LstSlot {
    fn drop(&mut self) {
        if self.idx == 0 {
            return;
        }
        let r = &self.area.r;
        seq_write(r.u32_at(self.base + L_SEQ), || {
            r.u32_at(self.base + L_USE).store(0, Relaxed)
        });
        lock(&self.area.free_lsts).push(self.idx);
    }
}

// ------------------------------------------------------------------------------------------
// Reader side (smcd).
//
// The area is the engine's memory and the engine is not trusted. Two rules keep a dump's
// cost the engine's, and in proportion to what it uses:
//
// * smcd never reads a page the engine has not written. The area is a memfd, and a read
//   fault on a hole of a shmem mapping allocates a page (unlike anonymous memory, where it
//   maps the zero page): reading all 16,384 connection slots of an idle engine used to cost
//   smcd 8 MiB per engine. `lseek(SEEK_DATA)`/`SEEK_HOLE` on the memfd find the pages that
//   exist without allocating any; slots on holes were never used (the engine writes a slot
//   when it hands it out). The descriptor is sealed against writes through new mappings
//   (`F_SEAL_FUTURE_WRITE`), which also forbids punching holes, so a page found present
//   stays present.
// * Every walk is bounded: slot indices come from the layout, never from the area, and a
//   [`Budget`] caps the slots and seeks one step of a dump may spend, so a dump of a huge or
//   hostile area goes in pages and smcd serves other requests in between.

/// A connection as smcd reads it from an engine's status area.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnRecord {
    /// What the engine published when the connection was set up.
    pub id: ConnIdentity,
    /// Shutdown bits (1 RCV, 2 SEND).
    pub shutdown: u8,
    /// Cursors (absolute positions, in [`Curs`] order).
    pub cursors: [u64; 7],
    /// Flag bytes.
    pub flags: [u8; 4],
    /// SMC-R: the id of the link it sends on (0: none).
    pub link: u8,
}

/// The counters a reader sums.
pub type Totals = Vec<u64>;

/// The three tables of slots in an area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// Connection slots.
    Conns,
    /// Link-group slots.
    Lgrs,
    /// Listener slots.
    Listeners,
}

impl Table {
    /// (byte offset of slot 0, bytes per slot, slots).
    const fn geometry(self) -> (usize, usize, usize) {
        match self {
            Table::Conns => (CONN_BASE, CONN_SLOT, CONN_SLOTS),
            Table::Lgrs => (LGR_BASE, LGR_SLOT, LGR_SLOTS),
            Table::Listeners => (LST_BASE, LST_SLOT, LST_SLOTS),
        }
    }

    /// Byte offset of the use word of slot `i`.
    const fn use_word(self, i: usize) -> usize {
        let (base, size, _) = self.geometry();
        base + i * size + 4
    }
}

// A slot never straddles a page boundary, so "the page of a slot exists" is one question.
const _: () = assert!(
    CONN_BASE.is_multiple_of(4096)
        && LGR_BASE.is_multiple_of(4096)
        && LST_BASE.is_multiple_of(4096)
);
const _: () = assert!(4096 % CONN_SLOT == 0 && 4096 % LGR_SLOT == 0 && 4096 % LST_SLOT == 0);

/// What one step of a dump may spend reading status areas: slots examined, with a seek
/// counted as [`Budget::SEEK`] slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget(usize);

impl Budget {
    /// What a `lseek` costs, in slots.
    pub const SEEK: usize = 8;

    /// A budget of `slots` slots.
    pub fn new(slots: usize) -> Budget {
        Budget(slots)
    }

    /// No limit (a caller that reads one area in one go).
    pub fn unlimited() -> Budget {
        Budget(usize::MAX)
    }

    /// Whether nothing is left.
    pub fn exhausted(&self) -> bool {
        self.0 == 0
    }

    /// Spends `n`.
    pub fn charge(&mut self, n: usize) {
        self.0 = self.0.saturating_sub(n);
    }
}

/// smcd's read-only view of one engine's status area.
#[derive(Debug)]
pub struct StatusView {
    r: Region,
    /// The memfd, asked where its pages are.
    fd: rustix::fd::OwnedFd,
}

impl StatusView {
    /// Maps a status area received from an engine, checking its header and that it is
    /// sealed against new writable mappings (which also forbids punching holes into it).
    pub fn open(fd: rustix::fd::OwnedFd) -> io::Result<StatusView> {
        let seals = rustix::fs::fcntl_get_seals(&fd)?;
        if !seals.intersects(rustix::fs::SealFlags::FUTURE_WRITE | rustix::fs::SealFlags::WRITE) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "status area not sealed against writes",
            ));
        }
        let r = Region::open_read_only(&fd, STATUS_LEN)?;
        // The header page: the engine wrote it when it made the area; a hostile one that did
        // not costs smcd this one page.
        if r.u64_at(0).load(Acquire) != MAGIC || r.u32_at(8).load(Relaxed) != VERSION {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a status area",
            ));
        }
        Ok(StatusView { r, fd })
    }

    /// The first run of slots of `t`, at or after slot `from`, whose page the engine has
    /// written; `None` when only holes are left.
    fn present(
        &self,
        t: Table,
        from: usize,
        budget: &mut Budget,
    ) -> Option<std::ops::Range<usize>> {
        use rustix::fs::SeekFrom;
        let (base, size, count) = t.geometry();
        if from >= count {
            return None;
        }
        let start = (base + from * size) as u64;
        let end = (base + count * size) as u64;
        budget.charge(2 * Budget::SEEK);
        // ENXIO: nothing but holes up to the end of the file.
        let data = rustix::fs::seek(&self.fd, SeekFrom::Data(start))
            .ok()?
            .max(start);
        if data >= end {
            return None;
        }
        let hole = rustix::fs::seek(&self.fd, SeekFrom::Hole(data))
            .unwrap_or(end)
            .clamp(data + 1, end);
        let first = (data as usize - base) / size;
        let last = (hole as usize - base).div_ceil(size);
        Some(first.max(from)..last.min(count))
    }

    /// Walks the slots of `t` from slot `from` (slot 0 is the engine's sink and never
    /// shown), reading each slot on a present page with `read` and handing what it gives
    /// to `take`, until `take` says no (that slot is read again next time), the table ends
    /// (`None`) or the budget does (`Some(slot to resume at)`).
    fn walk<R>(
        &self,
        t: Table,
        from: usize,
        budget: &mut Budget,
        read: impl Fn(&Self, usize) -> Option<R>,
        mut take: impl FnMut(R) -> bool,
    ) -> Option<usize> {
        let mut i = from.max(1);
        while let Some(run) = self.present(t, i, budget) {
            for j in run.clone() {
                if budget.exhausted() {
                    return Some(j);
                }
                budget.charge(1);
                if let Some(rec) = read(self, j)
                    && !take(rec)
                {
                    return Some(j);
                }
            }
            i = run.end;
        }
        None
    }

    /// Whether slot `i` of `t` is in use (the page must be present).
    fn live(&self, t: Table, i: usize) -> bool {
        self.r.u32_at(t.use_word(i)).load(Relaxed) != 0
    }

    /// Walks the live connections (see [`StatusView::walk_lgrs`] for the contract).
    pub fn walk_conns(
        &self,
        from: usize,
        budget: &mut Budget,
        take: impl FnMut(ConnRecord) -> bool,
    ) -> Option<usize> {
        self.walk(Table::Conns, from, budget, Self::read_conn, take)
    }

    /// Walks the live link groups from slot `from`, handing each to `take` until it
    /// returns false (that one is handed again on the next call), the table ends (`None`)
    /// or `budget` does; `Some(slot)` is where to go on.
    pub fn walk_lgrs(
        &self,
        from: usize,
        budget: &mut Budget,
        take: impl FnMut(LgrRecord) -> bool,
    ) -> Option<usize> {
        self.walk(Table::Lgrs, from, budget, Self::read_lgr, take)
    }

    /// Walks the live SMC-R device ports (see [`StatusView::walk_lgrs`]).
    pub fn walk_ports(
        &self,
        from: usize,
        budget: &mut Budget,
        take: impl FnMut(PortRecord) -> bool,
    ) -> Option<usize> {
        self.walk(Table::Lgrs, from, budget, Self::read_port, take)
    }

    /// Walks the live listeners (see [`StatusView::walk_lgrs`]).
    pub fn walk_listeners(
        &self,
        from: usize,
        budget: &mut Budget,
        take: impl FnMut(LstRecord) -> bool,
    ) -> Option<usize> {
        self.walk(Table::Listeners, from, budget, Self::read_lst, take)
    }

    /// Counts the live slots of `t` from slot `from` into `n` (see
    /// [`StatusView::walk_lgrs`] for what the result means).
    pub fn count(
        &self,
        t: Table,
        from: usize,
        budget: &mut Budget,
        n: &mut usize,
    ) -> Option<usize> {
        self.walk(
            t,
            from,
            budget,
            |v, i| v.live(t, i).then_some(()),
            |()| {
                *n += 1;
                true
            },
        )
    }

    /// The live connections.
    pub fn conns(&self) -> Vec<ConnRecord> {
        let mut v = Vec::new();
        self.walk_conns(1, &mut Budget::unlimited(), |c| {
            v.push(c);
            true
        });
        v
    }

    /// The live link groups.
    pub fn lgrs(&self) -> Vec<LgrRecord> {
        let mut v = Vec::new();
        self.walk_lgrs(1, &mut Budget::unlimited(), |g| {
            v.push(g);
            true
        });
        v
    }

    /// The live listeners.
    pub fn listeners(&self) -> Vec<LstRecord> {
        let mut v = Vec::new();
        self.walk_listeners(1, &mut Budget::unlimited(), |l| {
            v.push(l);
            true
        });
        v
    }

    /// The engine's totals plus its live connections' counters, counted once each. Reads
    /// the connection slots on present pages only; charges what it read to `budget` (it
    /// does not stop: the sum is one consistent read).
    pub fn totals_charged(&self, budget: &mut Budget) -> Totals {
        let mut spent = Budget::unlimited();
        let sum = |spent: &mut Budget| {
            let mut t: Totals = (0..N_TOTALS)
                .map(|i| self.r.u64_at(TOTALS + 8 * i).load(Relaxed))
                .collect();
            self.walk(
                Table::Conns,
                1,
                spent,
                |v, i| v.live(Table::Conns, i).then_some(i),
                |i| {
                    self.add_conn_counters(&mut t, CONN_BASE + i * CONN_SLOT);
                    true
                },
            );
            t
        };
        // A writer that keeps the sequence moving (hostile, or closing connections all the
        // time) gets a few tries, then an unsynchronized sum: counters, not invariants.
        let t = seq_read(self.r.u32_at(H_FOLD_SEQ), 16, || sum(&mut spent))
            .unwrap_or_else(|| sum(&mut spent));
        budget.charge(usize::MAX - spent.0);
        t
    }

    /// The engine's totals plus its live connections' counters, counted once each.
    pub fn totals(&self) -> Totals {
        self.totals_charged(&mut Budget::unlimited())
    }

    fn add_conn_counters(&self, t: &mut Totals, base: usize) {
        let c = |k: usize| self.r.u64_at(base + C_CNT + 8 * k).load(Relaxed);
        let off = if self.r.u64_at(base + C_LINK).load(Relaxed) & LINK_SMCR != 0 {
            T_SMCR
        } else {
            0
        };
        let mut add = |i: usize, v: u64| t[off + i] = t[off + i].wrapping_add(v);
        add(T_TX_CNT, c(0));
        add(T_TX_BYTES, c(1));
        add(T_RX_CNT, c(2));
        add(T_RX_BYTES, c(3));
        add(T_CORK, c(4));
        add(T_NDLY, c(5));
        for b in 0..BUCKETS {
            add(T_TX_PD + b, c(6 + b));
            add(T_RX_PD + b, c(6 + BUCKETS + b));
        }
        for (k, (i, peer)) in RMB_FOLD.iter().enumerate() {
            let v = c(6 + 2 * BUCKETS + k);
            add(*i, v);
            if let Some(p) = peer {
                add(*p, v);
            }
        }
    }

    fn read_conn(&self, i: usize) -> Option<ConnRecord> {
        if !self.live(Table::Conns, i) {
            return None;
        }
        let base = CONN_BASE + i * CONN_SLOT;
        seq_read(self.r.u32_at(base + C_SEQ), 100, || self.conn_at(base)).flatten()
    }

    fn conn_at(&self, base: usize) -> Option<ConnRecord> {
        let w = |off: usize| self.r.u64_at(base + off).load(Relaxed);
        if self.r.u32_at(base + C_USE).load(Relaxed) == 0 {
            return None;
        }
        let kind = w(C_KIND).to_le_bytes();
        let fam = kind[3];
        let ports = w(C_PORTS);
        let fb = w(C_FBACK);
        let addr = |off: usize, port: u16| {
            let ip = get_addr(&self.r, base + off);
            let ip = match (fam, ip) {
                (10, IpAddr::V4(v4)) => IpAddr::V6(v4.to_ipv6_mapped()),
                (_, ip) => ip,
            };
            Some(SocketAddr::new(ip, port))
        };
        let g = |off: usize| u128::from(w(off)) << 64 | u128::from(w(off + 8));
        let fl = w(C_FLAGS).to_le_bytes();
        Some(ConnRecord {
            id: ConnIdentity {
                state: kind[0],
                mode: kind[1],
                role: kind[2],
                fallback: (fb as u32, (fb >> 32) as u32),
                local: addr(C_LADDR, ports as u16),
                peer: addr(C_PADDR, (ports >> 16) as u16),
                inode: w(C_INODE),
                lgr: w(C_LGR) as u32,
                token: w(C_TOKEN),
                peer_token: w(C_PTOKEN),
                gid: g(C_GID),
                peer_gid: g(C_PGID),
                rmbe: w(C_RMBE),
                peer_rmbe: w(C_PRMBE),
                sndbuf: w(C_SNDBUF),
            },
            shutdown: kind[4],
            cursors: [0, 1, 2, 3, 4, 5, 6].map(|k| w(C_CURS + 8 * k)),
            flags: [fl[0], fl[1], fl[2], fl[3]],
            link: w(C_LINK) as u8,
        })
    }

    fn read_lgr(&self, i: usize) -> Option<LgrRecord> {
        if !self.live(Table::Lgrs, i) {
            return None;
        }
        let base = LGR_BASE + i * LGR_SLOT;
        seq_read(self.r.u32_at(base + G_SEQ), 100, || {
            let w = |off: usize| self.r.u64_at(base + off).load(Relaxed);
            let id = w(G_ID);
            let g = |off: usize| u128::from(w(off)) << 64 | u128::from(w(off + 8));
            let kind = w(G_KIND);
            let smcr = match kind as u8 {
                KIND_SMCD => None,
                KIND_SMCR => {
                    // The count is the engine's: at most the slot's.
                    let n = ((kind >> 32) as u8 as usize).min(SMCR_LINKS);
                    let links = (0..n)
                        .map(|k| {
                            let b = G_LINKS + k * LINK_REC;
                            let (info, uid) = (w(b + K_INFO), w(b + K_UID));
                            let gid = |off| match get_addr(&self.r, base + off) {
                                IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
                                IpAddr::V6(a) => a.octets(),
                            };
                            LinkRecord {
                                id: info as u8,
                                state: (info >> 8) as u8,
                                ib_port: (info >> 16) as u8,
                                conn_cnt: (info >> 32) as u32,
                                uid: uid as u32,
                                peer_uid: (uid >> 32) as u32,
                                net_dev: w(b + K_NETDEV) as u32,
                                gid: gid(b + K_GID),
                                peer_gid: gid(b + K_PGID),
                                ib_dev: get_str32(&self.r, base + b + K_IBDEV),
                            }
                        })
                        .collect();
                    Some(SmcrLgr {
                        lgr_type: (kind >> 8) as u8,
                        max_conns: (kind >> 16) as u8,
                        max_links: (kind >> 24) as u8,
                        buf_type: (kind >> 40) as u8,
                        links,
                    })
                }
                _ => return None,
            };
            (self.r.u32_at(base + G_USE).load(Relaxed) != 0).then(|| LgrRecord {
                id: id as u32,
                role: (id >> 32) as u8,
                version: (id >> 40) as u8,
                release: (id >> 48) as u8,
                os: (id >> 56) as u8,
                conns: w(G_CONNS) as u32,
                peer_gid: g(G_PGID),
                gid: g(G_GID),
                sndbuf: w(G_SNDBUF),
                dmb: w(G_DMB),
                peer_host: get_str32(&self.r, base + G_HOST),
                eid: get_str32(&self.r, base + G_EID),
                smcr,
            })
        })
        .flatten()
    }

    fn read_port(&self, i: usize) -> Option<PortRecord> {
        if !self.live(Table::Lgrs, i) {
            return None;
        }
        let base = LGR_BASE + i * LGR_SLOT;
        seq_read(self.r.u32_at(base + G_SEQ), 100, || {
            let w = |off: usize| self.r.u64_at(base + off).load(Relaxed);
            if w(G_KIND) as u8 != KIND_PORT || self.r.u32_at(base + G_USE).load(Relaxed) == 0 {
                return None;
            }
            let info = w(G_CONNS);
            Some(PortRecord {
                ib_dev: get_str32(&self.r, base + G_HOST),
                net_dev: info as u32,
                ib_port: (info >> 32) as u8,
                active: (info >> 40) as u8 != 0,
                lnk_cnt: w(G_SNDBUF) as u32,
                gid: u128::from(w(G_GID)) << 64 | u128::from(w(G_GID + 8)),
            })
        })
        .flatten()
    }

    fn read_lst(&self, i: usize) -> Option<LstRecord> {
        if !self.live(Table::Listeners, i) {
            return None;
        }
        let base = LST_BASE + i * LST_SLOT;
        seq_read(self.r.u32_at(base + L_SEQ), 100, || {
            let w = |off: usize| self.r.u64_at(base + off).load(Relaxed);
            let port = w(L_PORT);
            let ip = get_addr(&self.r, base + L_ADDR);
            let ip = match ((port >> 16) as u16, ip) {
                (10, IpAddr::V4(v4)) => IpAddr::V6(v4.to_ipv6_mapped()),
                (_, ip) => ip,
            };
            let info = w(L_INFO);
            (self.r.u32_at(base + L_USE).load(Relaxed) != 0).then(|| LstRecord {
                addr: SocketAddr::new(ip, port as u16),
                inode: w(L_INODE),
                backlog: info as u32,
                hs_limit: (info >> 32) & 1 == 1,
            })
        })
        .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Defect 6 of issue 9: buffer events of the data path (a send larger than the buffer, a
    /// full ring) were `fetch_add`s on the engine-wide totals, a cache line every connection
    /// wrote. They are counted in the connection's own slot and folded when it ends; a dump
    /// counts them once either way.
    #[test]
    fn data_path_events_stay_in_the_slot_until_it_ends() {
        let (area, fd) = StatusArea::shared().unwrap();
        let view = StatusView::open(fd.try_clone().unwrap()).unwrap();
        let raw = |t: usize| area.r.u64_at(TOTALS + 8 * t).load(Relaxed);
        let slot = area.conn_slot();
        slot.publish(&ConnIdentity::default());
        for _ in 0..5 {
            slot.rmb_event(RmbEvent::TxFull);
        }
        slot.rmb_event(RmbEvent::TxSizeSmall);
        slot.rmb_event(RmbEvent::RxFull);
        for t in [RMB_FULL, RMB_FULL_PEER, RMB_SIZE_SM, RMB_SIZE_SM_PEER] {
            assert_eq!(raw(T_TX_RMB + t), 0, "the shared totals are not written");
        }
        let t = view.totals();
        assert_eq!(t[T_TX_RMB + RMB_FULL], 5);
        assert_eq!(t[T_TX_RMB + RMB_FULL_PEER], 5);
        assert_eq!(t[T_TX_RMB + RMB_SIZE_SM], 1);
        assert_eq!(t[T_TX_RMB + RMB_SIZE_SM_PEER], 1);
        assert_eq!(t[T_RX_RMB + RMB_FULL], 1);
        drop(slot);
        assert_eq!(
            raw(T_TX_RMB + RMB_FULL),
            5,
            "folded when the connection ends"
        );
        let t = view.totals();
        assert_eq!(t[T_TX_RMB + RMB_FULL], 5, "counted once");
        assert_eq!(t[T_RX_RMB + RMB_FULL], 1);
    }

    #[test]
    fn engine_writes_smcd_reads() {
        let (area, fd) = StatusArea::shared().unwrap();
        let view = StatusView::open(fd.try_clone().unwrap()).unwrap();
        area.add(T_SRV_V2_SUCC, 1);
        area.add(T_SRV_FBACK + fback_index(ReasonCode::PEERNOSMC), 3);
        let slot = area.conn_slot();
        let id = ConnIdentity {
            state: 1,
            mode: 2,
            role: 1,
            fallback: (0, 0x0301_0000),
            local: Some("127.0.0.1:5000".parse().unwrap()),
            peer: Some("[::1]:6000".parse().unwrap()),
            inode: 42,
            lgr: 0x100,
            token: 7,
            peer_token: 8,
            gid: 1 << 70 | 5,
            peer_gid: 1 << 90 | 6,
            rmbe: 65536,
            peer_rmbe: 16384,
            sndbuf: 16384,
        };
        slot.publish(&id);
        slot.bump(Cnt::TxCnt, 2);
        slot.bump(Cnt::TxBytes, 100);
        slot.bump_pd(true, 0);
        slot.set_cursor(Curs::TxPrep, 100);
        let conns = view.conns();
        assert_eq!(conns.len(), 1);
        let c = &conns[0];
        assert_eq!(c.id, id, "every identity field round-trips");
        assert_eq!(c.cursors[Curs::TxPrep as usize], 100);
        let t = view.totals();
        assert_eq!((t[T_TX_CNT], t[T_TX_BYTES], t[T_TX_PD]), (2, 100, 1));
        assert_eq!(t[T_SRV_V2_SUCC], 1);
        assert_eq!(t[T_SRV_FBACK + fback_index(ReasonCode::PEERNOSMC)], 3);
        // Closing folds the counters into the totals: counted once, slot gone.
        drop(slot);
        assert!(view.conns().is_empty());
        let t = view.totals();
        assert_eq!((t[T_TX_CNT], t[T_TX_BYTES], t[T_TX_PD]), (2, 100, 1));
        // Link groups and listeners.
        let g = area.lgr_slot();
        let rec = LgrRecord {
            id: 0x200,
            role: 1,
            version: 2,
            release: 1,
            os: 2,
            conns: 3,
            peer_gid: 9,
            gid: 8,
            sndbuf: 65536,
            dmb: 131072,
            peer_host: "peer".into(),
            eid: "SEID".into(),
            smcr: None,
        };
        g.publish(&rec);
        assert_eq!(view.lgrs(), vec![rec.clone()]);
        drop(g);
        assert!(view.lgrs().is_empty());
        // An SMC-R group with two links, and a device port beside it: each walk sees its own.
        let (g, port) = (area.lgr_slot(), area.lgr_slot());
        let link = |id: u8, n: u8| LinkRecord {
            id,
            state: 3,
            ib_port: 1,
            conn_cnt: u32::from(n),
            uid: 0x0102_0300 + u32::from(id),
            peer_uid: 0x0a0b_0c00 + u32::from(id),
            net_dev: 7 + u32::from(id),
            gid: std::net::Ipv4Addr::new(10, 1, 0, id)
                .to_ipv6_mapped()
                .octets(),
            peer_gid: std::net::Ipv4Addr::new(10, 1, 0, 10 + id)
                .to_ipv6_mapped()
                .octets(),
            ib_dev: format!("sroce-10.1.0.{id}"),
        };
        let smcr = LgrRecord {
            smcr: Some(SmcrLgr {
                lgr_type: 2,
                max_conns: 255,
                max_links: 2,
                buf_type: 1,
                links: vec![link(1, 2), link(2, 1)],
            }),
            ..rec.clone()
        };
        g.publish(&smcr);
        let pr = PortRecord {
            ib_dev: "sroce-10.1.0.1".into(),
            ib_port: 1,
            net_dev: 7,
            active: true,
            lnk_cnt: 1,
            gid: 0xffff_0a01_0001,
        };
        port.publish_port(&pr);
        assert_eq!(view.lgrs(), vec![smcr]);
        let mut ports = Vec::new();
        view.walk_ports(1, &mut Budget::unlimited(), |p| {
            ports.push(p);
            true
        });
        assert_eq!(ports, vec![pr]);
        g.withdraw();
        assert!(view.lgrs().is_empty());
        drop((g, port));
        let l = area.listener_slot();
        let lr = LstRecord {
            addr: "0.0.0.0:80".parse().unwrap(),
            inode: 5,
            backlog: 128,
            hs_limit: true,
        };
        l.publish(&lr);
        assert_eq!(view.listeners(), vec![lr]);
    }

    #[test]
    fn buckets_as_the_kernel() {
        assert_eq!(bucket(1), 0);
        assert_eq!(bucket(8192), 0);
        assert_eq!(bucket(8193), 1);
        assert_eq!(bucket(16384), 1);
        assert_eq!(bucket(16385), 2);
        assert_eq!(bucket(1 << 20), 7);
        assert_eq!(bucket((1 << 20) + 1), 8);
        assert_eq!(bucket(u64::MAX), 8);
    }

    /// Bytes of the memfd that exist (pages allocated), as `fstat` counts them.
    fn allocated(fd: &rustix::fd::OwnedFd) -> u64 {
        rustix::fs::fstat(fd).unwrap().st_blocks as u64 * 512
    }

    /// Issue 10, item 2: a dump read every slot, and a read fault on a hole of a memfd
    /// allocates a page: 8 MiB per idle engine. Reading an area now allocates nothing.
    #[test]
    fn reading_allocates_no_page_of_the_area() {
        let (area, fd) = StatusArea::shared().unwrap();
        let view = StatusView::open(fd.try_clone().unwrap()).unwrap();
        let conns: Vec<_> = (0..3).map(|_| area.conn_slot()).collect();
        for c in &conns {
            c.publish(&ConnIdentity {
                mode: 2,
                ..ConnIdentity::default()
            });
        }
        let g = area.lgr_slot();
        g.publish(&LgrRecord::default());
        let l = area.listener_slot();
        l.publish(&LstRecord {
            addr: "127.0.0.1:1".parse().unwrap(),
            inode: 1,
            backlog: 1,
            hs_limit: false,
        });
        let before = allocated(&fd);
        assert!(before <= 4 * 4096, "the engine wrote {before} bytes");
        for _ in 0..3 {
            assert_eq!(view.conns().len(), 3);
            assert_eq!(view.lgrs().len(), 1);
            assert_eq!(view.listeners().len(), 1);
            let _ = view.totals();
            let mut n = 0;
            view.count(Table::Conns, 1, &mut Budget::unlimited(), &mut n);
            assert_eq!(n, 3);
        }
        assert_eq!(allocated(&fd), before, "smcd's reads allocated pages");
    }

    /// A walk in small steps hands every record exactly once and resumes where it stopped,
    /// also when the taker refuses one (a full reply page).
    #[test]
    fn walks_resume_where_they_stopped() {
        let (area, fd) = StatusArea::shared().unwrap();
        let view = StatusView::open(fd).unwrap();
        let slots: Vec<_> = (0..1000u64)
            .map(|i| {
                let c = area.conn_slot();
                c.publish(&ConnIdentity {
                    inode: i,
                    ..ConnIdentity::default()
                });
                c
            })
            .collect();
        // Free every third: holes in the middle of the table.
        let kept: Vec<_> = slots
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i % 3 != 0)
            .map(|(_, s)| s)
            .collect();
        let mut seen = Vec::new();
        let mut at = Some(1);
        let mut steps = 0;
        while let Some(from) = at {
            steps += 1;
            assert!(steps < 10_000, "no progress");
            let mut room = 7;
            at = view.walk_conns(from, &mut Budget::new(50), |c| {
                if room == 0 {
                    return false;
                }
                room -= 1;
                seen.push(c.id.inode);
                true
            });
        }
        let want: Vec<u64> = (0..1000).filter(|i| i % 3 != 0).collect();
        assert_eq!(seen, want);
        assert!(steps >= want.len() / 7, "pages of 7: {steps} steps");
        drop(kept);
    }

    /// An area written by a hostile engine: garbage in the header and in slots, pages
    /// written far apart. smcd reads what is there, without panicking and without
    /// allocating the holes, and hands out what the garbage decodes to.
    #[test]
    fn hostile_area_costs_only_its_own_pages() {
        let (r, fd) = Region::create("hostile", STATUS_LEN).unwrap();
        r.u64_at(0).store(MAGIC, Relaxed);
        r.u32_at(8).store(VERSION, Relaxed);
        for off in (12..64).step_by(4) {
            r.u32_at(off).store(u32::MAX, Relaxed); // slot counts, pid, sequence
        }
        r.u32_at(H_FOLD_SEQ).store(1, Relaxed); // a fold that never ends
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        // The last connection slot, one in the middle, and the last link-group slot.
        let bases = [
            CONN_BASE + (CONN_SLOTS - 1) * CONN_SLOT,
            CONN_BASE + 5000 * CONN_SLOT,
            LGR_BASE + (LGR_SLOTS - 1) * LGR_SLOT,
        ];
        for (k, &base) in bases.iter().enumerate() {
            let len = if k < 2 { CONN_SLOT } else { LGR_SLOT };
            for w in (0..len).step_by(8) {
                r.u64_at(base + w).store(next(), Relaxed);
            }
            r.u32_at(base).store(2, Relaxed); // an even sequence: readable
            r.u32_at(base + 4).store(1, Relaxed);
        }
        // The link group's kind says SMC-R, with a garbage link count and garbage links.
        let g = bases[2] + G_KIND;
        r.u64_at(g)
            .store(r.u64_at(g).load(Relaxed) & !0xff | 1, Relaxed);
        let view = StatusView::open(fd.try_clone().unwrap()).unwrap();
        let before = allocated(&fd);
        assert!(before <= 4 * 4096, "{before}");
        assert_eq!(view.conns().len(), 2);
        let lgrs = view.lgrs();
        assert_eq!(lgrs.len(), 1);
        assert!(
            lgrs[0]
                .smcr
                .as_ref()
                .is_some_and(|x| x.links.len() <= SMCR_LINKS)
        );
        assert!(view.listeners().is_empty());
        let t = view.totals();
        assert_eq!(t.len(), N_TOTALS);
        assert_eq!(allocated(&fd), before, "reading the holes allocated them");
        // A sequence word that stays odd: the record is skipped, not waited for.
        r.u32_at(bases[0]).store(3, Relaxed);
        assert_eq!(view.conns().len(), 1);
        drop(r);
    }

    /// An area that is not sealed against writes could have holes punched into it under
    /// smcd's reads: refused.
    #[test]
    fn unsealed_area_is_refused() {
        let fd = rustix::fs::memfd_create(
            "x",
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )
        .unwrap();
        rustix::fs::ftruncate(&fd, STATUS_LEN as u64).unwrap();
        rustix::fs::fcntl_add_seals(
            &fd,
            rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW,
        )
        .unwrap();
        let err = StatusView::open(fd).unwrap_err();
        assert!(err.to_string().contains("sealed"), "{err}");
    }

    #[test]
    fn garbage_area_is_refused() {
        let (r, fd) = Region::create("x", STATUS_LEN).unwrap();
        drop(r);
        assert!(StatusView::open(fd).is_err());
    }
}
