//! A RoCEv2 device in user space: the kernel's rxe (`drivers/infiniband/sw/rxe/`) without the
//! kernel. Packets are real RoCEv2 ([`crate::wire`]) in UDP datagrams to port 4791; GIDs are
//! the IPv4-mapped addresses the device is bound to.
//!
//! # Who does what
//!
//! - The thread that posts a send segments it at the path MTU and transmits what the window
//!   allows at once (rxe's requester, `rxe_req.c`), from a copy of the data taken at post time.
//! - One thread per device receives every datagram: requests from peers (rxe's responder,
//!   `rxe_resp.c`: in-order execution, ACKs, NAKs), acknowledgements of our requests (rxe's
//!   completer, `rxe_comp.c`: completions, retransmission), and runs the retransmission and
//!   RNR timers.
//! - Except while a thread that waits for a completion *serves* the device
//!   ([`crate::verbs::CompletionQueue::serve`]): that thread then takes the socket (and may
//!   busy-poll it first) and does the receiving, so an arrival wakes one thread, the one that
//!   waits for it, as the kernel's softirq work is done by whoever it interrupts. The receive
//!   thread keeps the timers.
//!
//! # Reliability (as rxe)
//!
//! - The requester sets AckReq on the last packet of every message and after every
//!   [`PKTS_PER_ACK`] packets, and keeps at most [`MAX_UNACKED_PSNS`] unacknowledged.
//! - The responder executes only the expected PSN. An earlier PSN is a duplicate: acknowledged
//!   again (when it asks) and not executed. A later PSN is a gap: one PSN-sequence NAK per gap,
//!   then silence until the expected PSN arrives. A SEND with no posted receive gets an RNR NAK.
//! - ACKs are cumulative, and (unlike rxe, like RNICs) coalesced: the receive thread sends
//!   one per QP for the requests of a batch of datagrams that asked for one
//!   (`QpInner::flush_ack`), any other answer after the due ACK. A serving thread holds a
//!   batch's ACKs for at most 1 ms (`ACK_HOLD`) so the QP's next send takes them along
//!   (`Dev::hold_acks`): the peer then gets the ACK and the reply in one train.
//! - A sequence NAK or the local ACK timeout (4.096 µs × 2^timeout) rewinds
//!   the requester to the first unacknowledged PSN (go-back-N); after `retry_cnt` rewinds
//!   without progress the request fails with `RetryExcErr`, after `rnr_retry` RNR NAKs (7:
//!   never) with `RnrRetryExcErr`, and the QP goes to ERROR, flushing the rest.
//! - A send completes only when its ACK arrived: a completion means the peer has the data.
//!
//! # Addressing
//!
//! A device binds one UDP socket to its address and port 4791 (unconnected, DF set, so the
//! IPv4 header the ICRC covers is known: [`crate::wire`]). One device per address and network
//! namespace can exist this way; the rest is in `docs/smcr.md`.
//!
//! # RoCE v1
//!
//! [`SoftDevice::open_roce_v1`] opens the same device on a netdev instead of an address: its
//! packets are Ethernet frames of Ethertype 0x8915 with a GRH ([`crate::wire::v1`]) through an
//! `AF_PACKET` socket bound to the netdev, its one GID (index 0, type RoCE v1) is the
//! link-local EUI-64 GID of the netdev's MAC, and a peer's GID must be one too (its MAC is
//! read out of it). Transport and reliability are the same code. Devices on one netdev divide
//! the QPN space by slots (`eth.rs`), so several processes can each have one.

mod cq;
mod eth;
mod qp;
pub mod steer;
mod udp;

pub use cq::SoftCq;
pub use qp::SoftQp;
pub use steer::Steering;

use crate::verbs::{
    Access, Device, DeviceInfo, Gid, GidType, Memory, MemoryRegion, Mtu, Pd, PortInfo, PortState,
    QpInit, VerbsError,
};
use crate::wire::v1::{Frame, Grh};
use crate::wire::{IdSolver, Ipv4Udp, Packet, ROCEV2_UDP_PORT, WireError, icrc, solve_ip_id};
use rustix::fd::{AsFd, OwnedFd};
use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// AckReq at least every this many packets (rxe's `RXE_MAX_PKT_PER_ACK`).
pub const PKTS_PER_ACK: u32 = 64;
/// Unacknowledged PSNs a requester may have (rxe's `RXE_MAX_UNACKED_PSNS`).
pub const MAX_UNACKED_PSNS: u32 = 128;
/// The first QPN handed out (rxe starts at 16; 0 and 1 are the special QPs).
const FIRST_QPN: u32 = 16;
/// Largest inline payload the device takes.
pub const MAX_INLINE: u32 = 256;
/// Largest queue depths.
pub const MAX_WR: u32 = 16_384;

/// How a soft device is opened.
#[derive(Debug)]
pub struct SoftConfig {
    /// Device name (`sroce0`).
    pub name: String,
    /// The IPv4 address it is bound to; its GID is this address, mapped.
    pub addr: Ipv4Addr,
    /// The netdev that address is on (its MAC, MTU and state are asked through the device's
    /// socket, in its network namespace); `None` looks it up.
    pub netdev: Option<String>,
    /// Share the address with other devices (other processes) through this steering program
    /// ([`steer`]); `None` binds the address alone.
    pub steering: Option<Steering>,
}

/// Counters of a device.
#[derive(Debug, Default)]
pub struct SoftStats {
    /// Datagrams sent.
    pub tx_packets: AtomicU64,
    /// Datagrams received and accepted.
    pub rx_packets: AtomicU64,
    /// Datagrams dropped: malformed, bad ICRC, unknown QP, wrong source.
    pub rx_dropped: AtomicU64,
    /// Packets sent again (go-back-N).
    pub retransmits: AtomicU64,
    /// Local ACK timeouts.
    pub timeouts: AtomicU64,
    /// Sequence NAKs sent.
    pub seq_naks_sent: AtomicU64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: AtomicU64,
    /// Duplicates acknowledged again.
    pub duplicates: AtomicU64,
    /// Datagrams the kernel would not take (full socket buffer): recovered as losses.
    pub tx_dropped: AtomicU64,
    /// System calls that sent packets (one datagram, or a GSO run of several).
    pub tx_sends: AtomicU64,
    /// Received packets whose IPv4 identification was not the expected one and was solved for
    /// (a peer that is not this device, or a GSO run cut apart on the way).
    pub rx_id_solved: AtomicU64,
    /// Batches of received datagrams taken by a thread serving the device
    /// ([`crate::verbs::CompletionQueue::serve`]) rather than by its receive thread.
    pub rx_served: AtomicU64,
    /// Batches taken by the receive thread.
    pub rx_batches: AtomicU64,
}

impl SoftStats {
    fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// A user-space RoCEv2 device.
#[derive(Debug)]
pub struct SoftDevice {
    dev: Arc<Dev>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug)]
struct Dev {
    name: String,
    /// The RoCEv2 mode's address (unspecified in RoCE v1 mode).
    addr: Ipv4Addr,
    /// RoCE v1 mode: our GID and the QPN slot's claim.
    v1: Option<V1Port>,
    netdev: String,
    mac: [u8; 6],
    mtu: Mtu,
    sock: OwnedFd,
    bell: OwnedFd,
    /// How the receive thread and a serving thread wait for the socket ([`Waits`]).
    waits: Waits,
    /// Who receives ([`Receiving`]).
    recv: Receiving,
    stop: AtomicBool,
    next_pd: AtomicU32,
    qpns: Mutex<Qpns>,
    next_key: AtomicU32,
    mrs: RwLock<HashMap<u32, Arc<MrInner>>>,
    qps: RwLock<HashMap<u32, Arc<qp::QpInner>>>,
    stats: SoftStats,
    /// Runs of packets go out as GSO sends (cleared when the kernel refuses one).
    gso: AtomicBool,
    /// The receive thread's solver for IPv4 identifications ([`solve_ip_id`]).
    ids: Mutex<IdSolver>,
    /// Completion handlers to run on the receive thread ([`Dev::schedule`]).
    tasks: Tasks,
    /// The receive thread.
    rx_thread: std::sync::OnceLock<std::thread::ThreadId>,
    /// When the receive thread wakes for its timers, as it announced before sleeping
    /// ([`RX_AWAKE`] while it runs, [`RX_NO_TIMER`] when it sleeps until a datagram), in
    /// nanoseconds after `epoch` plus one: a post that starts a retransmission timer rings
    /// the bell only when the thread would otherwise sleep past it ([`Dev::timer_started`]).
    rx_sleep: AtomicU64,
    /// Bumped by every post that started a timer: the receive thread looks at the timers
    /// again if it moved while it announced its sleep.
    timer_gen: AtomicU64,
    epoch: Instant,
}

/// The two ways to wait for the device's socket, one epoll instance each. The socket is in
/// both as `EPOLLEXCLUSIVE`, the serving thread's first: an arrival walks the socket's
/// exclusive waiters in the order they were added and wakes the first instance that has a
/// thread in `epoll_wait`, and only it (`ep_poll_callback`). So while a thread serves the
/// device ([`Dev::serve`]) datagrams wake that thread alone, and otherwise the receive thread.
#[derive(Debug)]
struct Waits {
    /// The serving thread's: the socket, then `bell`.
    serve: OwnedFd,
    /// The receive thread's: the socket, then the device's bell.
    rx: OwnedFd,
    /// Wakes the serving thread ([`Dev::wake_server`]).
    bell: OwnedFd,
}

/// [`Waits`]' event data.
const EV_SOCK: u64 = 0;
const EV_BELL: u64 = 1;
/// The socket in both instances. Edge-triggered: a thread woken for datagrams takes all
/// there are, or leaves them to the one taking them already (`Dev::receive`), which then
/// takes all there are.
const SOCK_EVENTS: rustix::event::epoll::EventFlags = rustix::event::epoll::EventFlags::IN
    .union(rustix::event::epoll::EventFlags::EXCLUSIVE)
    .union(rustix::event::epoll::EventFlags::ET);

impl Waits {
    fn new(sock: &OwnedFd, dev_bell: &OwnedFd) -> io::Result<Self> {
        use rustix::event::epoll::{self, CreateFlags, EventData, EventFlags};
        let serve = epoll::create(CreateFlags::CLOEXEC)?;
        let rx = epoll::create(CreateFlags::CLOEXEC)?;
        let bell = SoftDevice::bell()?;
        // The order matters (type docs): the serving instance first.
        epoll::add(&serve, sock, EventData::new_u64(EV_SOCK), SOCK_EVENTS)?;
        epoll::add(&serve, &bell, EventData::new_u64(EV_BELL), EventFlags::IN)?;
        epoll::add(&rx, dev_bell, EventData::new_u64(EV_BELL), EventFlags::IN)?;
        let w = Self { serve, rx, bell };
        w.watch(sock, true)?;
        Ok(w)
    }

    /// Puts the socket into the receive thread's instance, or takes it out. Put back with
    /// datagrams waiting, the instance reports it at once (`EPOLL_CTL_ADD` looks).
    fn watch(&self, sock: &OwnedFd, on: bool) -> io::Result<()> {
        use rustix::event::epoll::{self, EventData};
        if on {
            epoll::add(&self.rx, sock, EventData::new_u64(EV_SOCK), SOCK_EVENTS)?;
        } else {
            epoll::delete(&self.rx, sock)?;
        }
        Ok(())
    }
}

/// Waits on `ep` (a [`Waits`] instance) until an event or `timeout`; returns whether the
/// socket and whether the bell were among the events, `None` when a signal interrupted.
fn wait_on(ep: &OwnedFd, timeout: Option<Duration>) -> io::Result<Option<(bool, bool)>> {
    use rustix::event::epoll;
    let ts = timeout.map(|d| rustix::time::Timespec {
        tv_sec: d.as_secs() as i64,
        tv_nsec: i64::from(d.subsec_nanos()),
    });
    let mut evs = [epoll::Event {
        flags: epoll::EventFlags::empty(),
        data: epoll::EventData::new_u64(0),
    }; 2];
    match epoll::wait(ep, &mut evs[..], ts.as_ref()) {
        Ok(n) => {
            let got = |d: u64| evs[..n].iter().any(|e| e.data.u64() == d);
            Ok(Some((got(EV_SOCK), got(EV_BELL))))
        }
        Err(rustix::io::Errno::INTR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// What receiving needs between batches: the datagram buffer and the QPs whose ACK may be due.
#[derive(Debug)]
struct RxState {
    buf: Vec<u8>,
    acks: Vec<Arc<qp::QpInner>>,
}

impl Default for RxState {
    fn default() -> Self {
        Self {
            buf: vec![0u8; 65536],
            acks: Vec::new(),
        }
    }
}

/// Datagrams handled per batch (then the ACKs of the batch go out).
const BATCH: usize = 256;

/// How long a thread serving the device may hold the ACKs of a batch back for a send of the
/// same QP to take along ([`Dev::hold_acks`]).
const ACK_HOLD: Duration = Duration::from_millis(1);
/// After ACKs were held back, the receive thread sleeps no longer than [`ACK_HOLD`] for this
/// long, so that holding one back needs no ring.
const ACK_HOLDING: Duration = Duration::from_millis(50);

/// Work that one thread at a time does for all ([`Turn::take`]).
#[derive(Debug, Default)]
struct Turn<T> {
    state: Mutex<T>,
    /// A thread found the turn taken and left its work to the taker.
    again: AtomicBool,
}

impl<T> Turn<T> {
    /// Runs `f` with the state unless another thread has the turn, again while someone asked
    /// meanwhile, until `f` says stop (`Some`). A thread that finds the turn taken never
    /// waits: it asks the taker to look once more and leaves (`None`). The taker clears the
    /// ask when it starts and reads it after it let go, so every ask is followed by a look
    /// that began after it.
    fn take<R>(&self, mut f: impl FnMut(&mut T) -> Option<R>) -> Option<R> {
        loop {
            self.again.store(true, Ordering::SeqCst);
            let Ok(mut state) = self.state.try_lock() else {
                return None;
            };
            self.again.store(false, Ordering::SeqCst);
            if let Some(r) = f(&mut state) {
                return Some(r);
            }
            drop(state);
            if !self.again.load(Ordering::SeqCst) {
                return None;
            }
        }
    }
}

/// Who receives: the receive thread, or a thread serving the device ([`Dev::serve`]).
#[derive(Debug)]
struct Receiving {
    /// Receiving and handling datagrams: one thread at a time, so a QP sees its packets in
    /// the order the socket had them.
    rx: Turn<RxState>,
    /// Held by the thread in [`Dev::serve`].
    server: Mutex<()>,
    /// A thread is in [`Dev::serve`].
    serving: AtomicBool,
    /// Whether the socket is in the receive thread's instance ([`Waits::watch`]); changed
    /// under this lock only.
    watched: Mutex<WatchState>,
    /// [`SERVE_LEASE`], or what [`SoftDevice::set_serve_lease`] set, in nanoseconds.
    lease: AtomicU64,
    /// Threads told [`Served::Declined`](crate::verbs::Served) that wait without serving
    /// (until [`CompletionQueue::unserved_wait_over`](crate::verbs::CompletionQueue)):
    /// while there are any, a serving thread gives the socket back when it leaves, for the
    /// datagrams they wait for.
    unserved: AtomicUsize,
    /// QPs whose ACK is held back for a send of theirs to take along ([`Dev::hold_acks`]).
    held: Mutex<Held>,
}

impl Default for Receiving {
    fn default() -> Self {
        Self {
            rx: Turn::default(),
            server: Mutex::new(()),
            serving: AtomicBool::new(false),
            watched: Mutex::default(),
            lease: AtomicU64::new(SERVE_LEASE.as_nanos() as u64),
            unserved: AtomicUsize::new(0),
            held: Mutex::default(),
        }
    }
}

/// Where the socket is between serves ([`Dev::serve`], [`Dev::lease_check`]).
#[derive(Debug)]
struct WatchState {
    /// In the receive thread's instance: datagrams wake that thread.
    watched: bool,
    /// Out of it, kept for the thread that served last until then ([`SERVE_LEASE`]).
    lease_until: Option<Instant>,
}

impl Default for WatchState {
    fn default() -> Self {
        Self {
            watched: true,
            lease_until: None,
        }
    }
}

/// How long the socket stays out of the receive thread's instance after a thread that
/// served the device left [`Dev::serve`] with the socket drained, for that thread (or
/// another) to serve again. A thread that just served usually comes back within
/// microseconds (a stream's next window, a ping-pong's next answer); what arrives meanwhile
/// waits in the socket for it instead of waking the receive thread, and the socket does not
/// leave and rejoin that thread's set around every wait. As long as [`ACK_HOLD`]: a
/// datagram waits no longer than a held ACK may, and the receive thread, which ticks at
/// that pace while ACKs are held, needs no ring to end a lease.
const SERVE_LEASE: Duration = ACK_HOLD;

/// ACKs held back ([`Dev::hold_acks`]).
#[derive(Debug, Default)]
struct Held {
    qps: Vec<Arc<qp::QpInner>>,
    /// When the oldest of `qps` was held back.
    since: Option<Instant>,
    /// When ACKs were last held back.
    last: Option<Instant>,
}

std::thread_local! {
    /// The device ([`Dev`]'s address) the current thread serves ([`Dev::serve`]), or 0.
    static SERVING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// What a RoCE v1 device adds (module docs).
#[derive(Debug)]
struct V1Port {
    gid: Gid,
    /// Held for the device's life: the QPN slot is ours while it is bound (`eth.rs`).
    _slot: std::os::unix::net::UnixDatagram,
}

/// [`Dev::rx_sleep`]: the receive thread runs and looks at the timers before it sleeps.
const RX_AWAKE: u64 = 0;
/// [`Dev::rx_sleep`]: the receive thread sleeps with no timer.
const RX_NO_TIMER: u64 = u64::MAX;

/// QPN allocation: from 16 up in the whole 24-bit space alone; `slot << 12 | n` with
/// steering, numbers of destroyed QPs reused.
#[derive(Debug)]
struct Qpns {
    base: u32,
    next: u32,
    end: u32,
    free: Vec<u32>,
}

impl Qpns {
    fn take(&mut self) -> Option<u32> {
        if self.next < self.end {
            self.next += 1;
            return Some(self.base + self.next - 1);
        }
        self.free.pop()
    }
}

#[derive(Debug)]
struct MrInner {
    key: u32,
    pd: Pd,
    access: Access,
    mem: Arc<Memory>,
}

impl MrInner {
    /// Offset of `[va, va+len)` in the memory, if it lies inside.
    fn offset(&self, va: u64, len: u64) -> Option<usize> {
        let off = va.checked_sub(self.mem.addr())?;
        (off.checked_add(len)? <= self.mem.len() as u64).then_some(off as usize)
    }
}

/// A region registered with a [`SoftDevice`].
#[derive(Debug)]
pub struct SoftMr {
    dev: Arc<Dev>,
    inner: Arc<MrInner>,
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        write(&self.dev.mrs).remove(&self.inner.key);
    }
}

impl MemoryRegion for SoftMr {
    fn lkey(&self) -> u32 {
        self.inner.key
    }
    fn rkey(&self) -> u32 {
        self.inner.key
    }
    fn addr(&self) -> u64 {
        self.inner.mem.addr()
    }
    fn len(&self) -> usize {
        self.inner.mem.len()
    }
    fn memory(&self) -> &Arc<Memory> {
        &self.inner.mem
    }
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    u32::from_ne_bytes(b)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

/// The netdev holding `addr` (`ip -o -4 addr show` lines: `2: eth0    inet 10.0.0.1/24 ...`).
fn netdev_of(addr: Ipv4Addr) -> Option<String> {
    if addr.is_loopback() {
        return Some("lo".into());
    }
    let out = std::process::Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        let at = w.iter().position(|x| *x == "inet")?;
        let ip: Ipv4Addr = w.get(at + 1)?.split('/').next()?.parse().ok()?;
        (ip == addr).then(|| w.get(1).map(|d| d.trim_end_matches(':').to_string()))?
    })
}

fn sysfs(netdev: &str, file: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/net/{netdev}/{file}"))
        .ok()
        .map(|s| s.trim().to_string())
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let v: Vec<u8> = s
        .split(':')
        .map(|h| u8::from_str_radix(h, 16))
        .collect::<Result<_, _>>()
        .ok()?;
    v.try_into().ok()
}

impl SoftDevice {
    /// Opens a device bound to `cfg.addr`, UDP port 4791, and starts its receive thread.
    pub fn open(cfg: SoftConfig) -> io::Result<Self> {
        use rustix::net::{AddressFamily, SocketType, ipproto, sockopt};
        let netdev = match cfg.netdev {
            Some(n) => n,
            None => netdev_of(cfg.addr).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::AddrNotAvailable,
                    format!("no interface has address {}", cfg.addr),
                )
            })?,
        };
        let sock = rustix::net::socket_with(
            AddressFamily::INET,
            SocketType::DGRAM,
            rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
            Some(ipproto::UDP),
        )?;
        // MAC and MTU asked through the socket, in its network namespace: `/sys/class/net`
        // is the mount's, and a thread that entered another namespace does not find its
        // netdevs there (it read MTU 1500 and a zero MAC for a namespace's 9000-byte veth).
        // sysfs remains for what is not Ethernet (loopback is the same in every namespace).
        let (mac, netdev_mtu) = match eth::netdev(sock.as_fd(), &netdev) {
            Ok(nd) => (nd.mac, nd.mtu),
            Err(_) => (
                sysfs(&netdev, "address")
                    .and_then(|m| parse_mac(&m))
                    .unwrap_or_default(),
                sysfs(&netdev, "mtu")
                    .and_then(|m| m.parse().ok())
                    .unwrap_or(1500),
            ),
        };
        let mtu = Mtu::for_netdev(netdev_mtu).unwrap_or(Mtu::M256);
        // DF and no fragmentation: the IPv4 header the ICRC covers is the one this device
        // assumes (wire module docs), and a packet too large for the path is dropped, not cut.
        sockopt::set_ip_mtu_discover(&sock, sockopt::Ipv4PathMtuDiscovery::DO)?;
        let _ = sockopt::set_socket_send_buffer_size(&sock, 4 << 20);
        let _ = sockopt::set_socket_recv_buffer_size(&sock, 4 << 20);
        if cfg.steering.is_some() {
            sockopt::set_socket_reuseport(&sock, true)?;
        }
        udp::enable_gro(sock.as_fd());
        rustix::net::bind(&sock, &SocketAddrV4::new(cfg.addr, ROCEV2_UDP_PORT))?;
        let qpns = match &cfg.steering {
            Some(st) => {
                let hint = std::process::id() % steer::SLOTS;
                let slot = st.join(sock.as_fd(), hint)?;
                Qpns {
                    base: slot << steer::SLOT_SHIFT,
                    next: 0,
                    end: 1 << steer::SLOT_SHIFT,
                    free: Vec::new(),
                }
            }
            None => Qpns {
                base: 0,
                // A random start (rxe starts at 16 after each boot): a device of a process
                // that restarts does not reuse the QPNs its predecessor's peers may still
                // send to.
                next: FIRST_QPN + random_u32() % (1 << 20),
                end: crate::wire::MASK24 + 1,
                free: Vec::new(),
            },
        };
        let bell = Self::bell()?;
        Self::start(Dev {
            name: cfg.name,
            addr: cfg.addr,
            v1: None,
            netdev,
            mac,
            mtu,
            waits: Waits::new(&sock, &bell)?,
            sock,
            bell,
            recv: Receiving::default(),
            stop: AtomicBool::new(false),
            next_pd: AtomicU32::new(1),
            qpns: Mutex::new(qpns),
            next_key: AtomicU32::new(1),
            mrs: RwLock::default(),
            qps: RwLock::default(),
            stats: SoftStats::default(),
            gso: AtomicBool::new(true),
            ids: Mutex::default(),
            tasks: Tasks::default(),
            rx_thread: std::sync::OnceLock::new(),
            rx_sleep: AtomicU64::new(RX_AWAKE),
            timer_gen: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    /// Opens a RoCE v1 device on the Ethernet netdev `netdev` (in the calling thread's network
    /// namespace) and starts its receive thread. Needs `CAP_NET_RAW`. Its GID (index 0, RoCE
    /// v1) is the link-local EUI-64 GID of the netdev's MAC; its active MTU the largest whose
    /// packets, GRH included, fit the netdev's MTU.
    pub fn open_roce_v1(name: String, netdev: &str) -> io::Result<Self> {
        let sock = eth::socket()?;
        let nd = eth::netdev(sock.as_fd(), netdev)?;
        let (slot, claim) = eth::claim_slot(nd.ifindex, std::process::id())?;
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(&sock, 4 << 20);
        let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&sock, 4 << 20);
        eth::bind(sock.as_fd(), nd.ifindex, slot)?;
        let bell = Self::bell()?;
        Self::start(Dev {
            name,
            addr: Ipv4Addr::UNSPECIFIED,
            v1: Some(V1Port {
                gid: Gid::from_mac(nd.mac),
                _slot: claim,
            }),
            netdev: netdev.to_string(),
            mac: nd.mac,
            mtu: Mtu::for_netdev_roce_v1(nd.mtu).unwrap_or(Mtu::M256),
            waits: Waits::new(&sock, &bell)?,
            sock,
            bell,
            recv: Receiving::default(),
            stop: AtomicBool::new(false),
            next_pd: AtomicU32::new(1),
            qpns: Mutex::new(Qpns {
                base: slot << eth::SLOT_SHIFT,
                next: 0,
                end: 1 << eth::SLOT_SHIFT,
                free: Vec::new(),
            }),
            next_key: AtomicU32::new(1),
            mrs: RwLock::default(),
            qps: RwLock::default(),
            stats: SoftStats::default(),
            gso: AtomicBool::new(false),
            ids: Mutex::default(),
            tasks: Tasks::default(),
            rx_thread: std::sync::OnceLock::new(),
            rx_sleep: AtomicU64::new(RX_AWAKE),
            timer_gen: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    fn bell() -> io::Result<OwnedFd> {
        Ok(rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?)
    }

    fn start(dev: Dev) -> io::Result<Self> {
        let dev = Arc::new(dev);
        let d = Arc::clone(&dev);
        let thread = std::thread::Builder::new()
            .name(format!("{}-rx", dev.name))
            .spawn(move || d.run())?;
        Ok(Self {
            dev,
            thread: Some(thread),
        })
    }

    /// Its GID (index 0).
    pub fn gid(&self) -> Gid {
        self.dev.gid()
    }

    /// Whether it speaks RoCE v1 ([`SoftDevice::open_roce_v1`]) rather than RoCEv2.
    pub fn is_roce_v1(&self) -> bool {
        self.dev.v1.is_some()
    }

    /// Its counters.
    pub fn stats(&self) -> &SoftStats {
        &self.dev.stats
    }

    /// How long the socket waits for the next serve after a thread that served the device
    /// left ([`CompletionQueue::serve`](crate::verbs::CompletionQueue::serve)) before the
    /// receive thread takes it back; [`SERVE_LEASE`] (1 ms) unless set. Zero gives it back at
    /// once. For leases that start after the call. A lease longer than the peers' ACK
    /// timeout holds back the ACKs they wait for: they retransmit, and fail their QPs once
    /// the retries are used up (tests use long leases to see what waits for a serve).
    pub fn set_serve_lease(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.dev.recv.lease.store(ns, Ordering::Relaxed);
    }
}

impl Drop for SoftDevice {
    fn drop(&mut self) {
        self.dev.stop.store(true, Ordering::Release);
        self.dev.ring();
        // A thread serving the device leaves it (and waits the usual way).
        self.dev.wake_server();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Device for SoftDevice {
    type Mr = SoftMr;
    type Cq = SoftCq;
    type Qp = SoftQp;

    fn info(&self) -> DeviceInfo {
        // Through the socket, in its namespace (see `open`).
        let up = eth::is_up(self.dev.sock.as_fd(), &self.dev.netdev);
        let gid_type = if self.dev.v1.is_some() {
            GidType::RoceV1
        } else {
            GidType::RoceV2
        };
        DeviceInfo {
            name: self.dev.name.clone(),
            ports: vec![PortInfo {
                port: 1,
                state: if up {
                    PortState::Active
                } else {
                    PortState::Down
                },
                active_mtu: self.dev.mtu,
                netdev: self.dev.netdev.clone(),
                mac: self.dev.mac,
                gids: vec![(0, self.gid(), gid_type)],
            }],
        }
    }

    fn alloc_pd(&self) -> Pd {
        Pd(self.dev.next_pd.fetch_add(1, Ordering::Relaxed))
    }

    fn reg_mr(&self, pd: Pd, mem: Arc<Memory>, access: Access) -> Result<SoftMr, VerbsError> {
        // Index in the high 24 bits, 8 random-ish bits below (rxe: index << 8 | key).
        let idx = self.dev.next_key.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
        // The low byte is random (as rxe's key byte), so a key is not the index alone.
        let mut salt = [0u8; 1];
        let _ = rustix::rand::getrandom(&mut salt, rustix::rand::GetRandomFlags::empty());
        let key = (idx << 8) | u32::from(salt[0]);
        let inner = Arc::new(MrInner {
            key,
            pd,
            access,
            mem,
        });
        write(&self.dev.mrs).insert(key, Arc::clone(&inner));
        Ok(SoftMr {
            dev: Arc::clone(&self.dev),
            inner,
        })
    }

    fn create_cq(&self, cqe: u32) -> Result<Arc<SoftCq>, VerbsError> {
        if cqe == 0 || cqe > 1 << 20 {
            return Err(VerbsError::Invalid("completion queue size"));
        }
        Ok(Arc::new(SoftCq::new(
            cqe as usize,
            Arc::downgrade(&self.dev),
        )?))
    }

    fn create_qp(&self, pd: Pd, init: QpInit<SoftCq>) -> Result<SoftQp, VerbsError> {
        let c = init.caps;
        if c.max_send_wr == 0
            || c.max_send_wr > MAX_WR
            || c.max_recv_wr > MAX_WR
            || c.max_send_sge > 2
            || c.max_recv_sge > 2
            || c.max_inline_data > MAX_INLINE
        {
            return Err(VerbsError::Invalid("queue pair capabilities"));
        }
        let num = lock(&self.dev.qpns)
            .take()
            .ok_or(VerbsError::Full("queue pair number"))?;
        let inner = Arc::new(qp::QpInner::new(num, pd, init));
        write(&self.dev.qps).insert(num, Arc::clone(&inner));
        Ok(SoftQp::new(Arc::clone(&self.dev), inner))
    }
}

/// Completion handlers waiting for the receive thread (or a serving one).
#[derive(Default)]
struct Tasks {
    list: Mutex<Vec<crate::verbs::CqHandler>>,
    /// Running them ([`Dev::run_tasks`]).
    running: Turn<()>,
}

impl std::fmt::Debug for Tasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tasks({})", lock(&self.list).len())
    }
}

impl Dev {
    fn ring(&self) {
        let _ = rustix::io::write(&self.bell, &1u64.to_ne_bytes());
    }

    /// `t` as [`Dev::rx_sleep`] holds it.
    fn rx_time(&self, t: Instant) -> u64 {
        (t.saturating_duration_since(self.epoch).as_nanos() as u64).saturating_add(1)
    }

    /// A post started a retransmission timer due at `t` (the QP's lock let go): the receive
    /// thread, which runs the timers, is rung only if it sleeps and would wake after `t`.
    /// Ringing at every post that found no timer running cost a wake-up of the receive
    /// thread per window of a bulk stream, for a timer that the ACK arriving on that thread
    /// anyway stops long before it is due.
    ///
    /// No timer is lost: the receive thread announces its sleep (`rx_sleep`) between two looks
    /// at `timer_gen` around its look at the timers (see [`Dev::run`]). Both are `SeqCst`, so
    /// if this reads the thread awake or asleep with an earlier wake-up, the thread's next
    /// announcement comes after our bump and it looks again, or its look at the timers came
    /// after the bump, which follows the timer set under the QP's lock.
    fn timer_started(&self, t: Instant) {
        self.timer_gen.fetch_add(1, Ordering::SeqCst);
        let at = self.rx_sleep.load(Ordering::SeqCst);
        if at != RX_AWAKE && at > self.rx_time(t) {
            self.ring();
        }
    }

    /// Has the receive thread run `h` (a completion queue's handler) once it holds no lock:
    /// after the datagrams it is handling, or at once if it sleeps. Scheduled twice before it
    /// runs, it runs once (it drains its queues).
    fn schedule(&self, h: &crate::verbs::CqHandler) {
        {
            let mut t = lock(&self.tasks.list);
            if t.iter().any(|x| Arc::ptr_eq(x, h)) {
                return;
            }
            t.push(Arc::clone(h));
        }
        // The receive thread and a serving thread run the tasks after their batch.
        if self.rx_thread.get() != Some(&std::thread::current().id()) && !self.served_here() {
            self.ring();
        }
    }

    /// Runs the scheduled handlers (on the receive thread or a serving one, no lock held). A
    /// handler that panics loses its run, not the device.
    ///
    /// One thread at a time ([`Turn`]): a handler drains its queues and re-arms them, and two
    /// runs at once would hand the completions on out of order.
    fn run_tasks(&self) {
        self.tasks.running.take(|()| {
            loop {
                let tasks = std::mem::take(&mut *lock(&self.tasks.list));
                if tasks.is_empty() {
                    return None::<()>;
                }
                for h in tasks {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h()));
                }
            }
        });
    }

    fn gid(&self) -> Gid {
        match &self.v1 {
            Some(v) => v.gid,
            None => Gid::from_ipv4(self.addr),
        }
    }

    /// Whether a QP of this device can send to `gid`: an IPv4-mapped GID for RoCEv2, a
    /// link-local EUI-64 one for RoCE v1.
    fn reaches(&self, gid: &Gid) -> bool {
        match self.v1 {
            Some(_) => gid.to_mac().is_some(),
            None => gid.to_ipv4().is_some(),
        }
    }

    /// Writes packet `p` to `peer` at the end of `buf`, as the device sends it: a RoCE v1
    /// frame, or a RoCEv2 UDP payload stamped for IPv4 identification `id`.
    fn emit_to(&self, p: &Packet<'_>, peer: &Gid, id: u16, buf: &mut Vec<u8>) -> usize {
        let at = buf.len();
        match &self.v1 {
            Some(v) => {
                let f = Frame {
                    dst_mac: peer.to_mac().unwrap_or_default(),
                    src_mac: self.mac,
                    grh: Grh {
                        tclass: 0,
                        flow_label: 0,
                        // Link-local: the frame does not leave the L2 segment.
                        hop_limit: 1,
                        sgid: v.gid.0,
                        dgid: peer.0,
                    },
                    packet: *p,
                };
                buf.resize(at + f.buffer_len(), 0);
                f.emit(&mut buf[at..])
            }
            None => {
                let hdr = Ipv4Udp {
                    id,
                    ..self.hdr_to(peer.to_ipv4().unwrap_or(Ipv4Addr::UNSPECIFIED))
                };
                buf.resize(at + p.buffer_len(), 0);
                p.emit(&hdr, &mut buf[at..])
            }
        }
    }

    fn hdr_to(&self, peer: Ipv4Addr) -> Ipv4Udp {
        Ipv4Udp {
            src: self.addr,
            dst: peer,
            src_port: ROCEV2_UDP_PORT,
            dst_port: ROCEV2_UDP_PORT,
            id: 0,
        }
    }

    /// Sends one packet to `peer`. A full socket buffer drops it (as a wire would; the
    /// requester's timer recovers it).
    fn send(&self, p: &Packet<'_>, peer: &Gid) {
        let mut buf = Vec::with_capacity(4096 + 128);
        let n = self.emit_to(p, peer, 0, &mut buf);
        self.send_run(&mut buf, n, 1, peer);
    }

    fn gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    fn sock(&self) -> rustix::fd::BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Counts `count` packets sent, by a system call of their own (`call`) or with others.
    fn count_sent(&self, count: usize, call: bool) {
        self.stats
            .tx_packets
            .fetch_add(count as u64, Ordering::Relaxed);
        if call {
            SoftStats::inc(&self.stats.tx_sends);
        }
    }

    /// Sends `count` packets of `seg` bytes (the last may be shorter) that lie back to back
    /// in `buf`, packet `k` stamped for IPv4 identification `k`: one GSO send. A kernel that
    /// refuses GSO here gets them one datagram each, stamped again for identification 0, and
    /// no GSO from then on.
    fn send_run(&self, buf: &mut [u8], seg: usize, count: usize, peer: &Gid) {
        if self.v1.is_some() {
            // One frame a call (`gso` is off in this mode, so runs are of one packet).
            for frame in buf.chunks(seg) {
                match eth::send(self.sock.as_fd(), frame) {
                    Ok(_) => {
                        SoftStats::inc(&self.stats.tx_packets);
                        SoftStats::inc(&self.stats.tx_sends);
                    }
                    Err(_) => SoftStats::inc(&self.stats.tx_dropped),
                }
            }
            return;
        }
        let ip = peer.to_ipv4().unwrap_or(Ipv4Addr::UNSPECIFIED);
        let gso = (count > 1).then_some(seg as u16);
        match udp::send(self.sock.as_fd(), buf, gso, ip) {
            Ok(_) => self.count_sent(count, true),
            // What udp_send_skb answers when it cannot segment here (EINVAL: the segment
            // size against the path, EIO: no checksum offload); a full buffer (EAGAIN,
            // ENOBUFS) is a loss like any other.
            Err(e)
                if count > 1
                    && matches!(
                        e.raw_os_error(),
                        Some(libc::EINVAL | libc::EIO | libc::EOPNOTSUPP)
                    ) =>
            {
                self.gso.store(false, Ordering::Relaxed);
                let hdr = self.hdr_to(ip);
                for pkt in buf.chunks_mut(seg) {
                    let body = pkt.len() - crate::wire::ICRC_LEN;
                    let crc = icrc(&hdr, &pkt[..body]);
                    pkt[body..].copy_from_slice(&crc.to_le_bytes());
                    self.send_run(pkt, pkt.len(), 1, peer);
                }
            }
            Err(_) => {
                self.stats
                    .tx_dropped
                    .fetch_add(count as u64, Ordering::Relaxed);
            }
        }
    }

    /// Resolves an SGE of `pd` to its region and offset.
    fn resolve(&self, pd: Pd, addr: u64, len: u32, lkey: u32) -> Option<(Arc<MrInner>, usize)> {
        let mr = read(&self.mrs).get(&lkey).cloned()?;
        if mr.pd != pd {
            return None;
        }
        let off = mr.offset(addr, u64::from(len))?;
        Some((mr, off))
    }

    fn run(self: Arc<Self>) {
        let _ = self.rx_thread.set(std::thread::current().id());
        let (mut gen_seen, mut busy_until) = (0, None::<Instant>);
        while !self.stop.load(Ordering::Acquire) {
            let gen_before = self.timer_gen.load(Ordering::SeqCst);
            let now = Instant::now();
            let (mut next, shortest) = self.timers(now);
            let acks = self.release_acks(Some(now));
            let lease = self.lease_check(now);
            // Handlers the timers scheduled (a retry that failed a QP completes its requests
            // with errors) run before the thread sleeps.
            self.run_tasks();
            // While posts keep starting timers (a stream whose every window is acknowledged
            // before the next is posted), sleep no longer than the shortest ACK timeout after
            // the last one seen, even with no timer running: a timer a post starts later is
            // due after that, and the post need not ring. Idle for that long, the thread
            // sleeps until a datagram (the next post rings).
            if gen_before != gen_seen {
                gen_seen = gen_before;
                busy_until = shortest.map(|t| now + t);
            }
            if next.is_none() {
                next = busy_until.filter(|&t| t > now);
            }
            next = next.into_iter().chain(acks).chain(lease).min();
            // Announce the sleep, then make sure no post started a timer since the look above
            // (see `timer_started`).
            let until = next.map_or(RX_NO_TIMER, |t| self.rx_time(t));
            self.rx_sleep.store(until, Ordering::SeqCst);
            if self.timer_gen.load(Ordering::SeqCst) != gen_before {
                self.rx_sleep.store(RX_AWAKE, Ordering::SeqCst);
                continue;
            }
            let timeout = next.map(|t| t.saturating_duration_since(Instant::now()));
            let waited = wait_on(&self.waits.rx, timeout);
            self.rx_sleep.store(RX_AWAKE, Ordering::SeqCst);
            let Ok(Some((_, bell))) = waited else {
                continue;
            };
            if bell {
                let mut b = [0u8; 8];
                let _ = rustix::io::read(&self.bell, &mut b);
            }
            // A bounded batch, then the timers again; the wait is edge-triggered, so the bell
            // brings the thread back for what is left. While a thread serves the device the
            // socket is that thread's (it takes all there is before it gives it back), and
            // on lease it waits for the next serve.
            if !self.recv.serving.load(Ordering::SeqCst)
                && lock(&self.recv.watched).watched
                && self.receive(1)
            {
                self.ring();
            }
        }
    }

    /// Receives and handles what waits on the socket, at most `batches` batches of
    /// [`BATCH`] datagrams, each batch's ACKs sent at its end (held back by a serving thread),
    /// then runs the scheduled handlers; returns whether the socket may hold more. A thread
    /// that finds another receiving leaves the datagrams to it ([`Turn`]).
    fn receive(&self, batches: usize) -> bool {
        let served = self.served_here();
        let more = self
            .recv
            .rx
            .take(|rx| {
                let RxState { buf, acks } = rx;
                for _ in 0..batches {
                    let n = self.batch(buf, acks);
                    if n > 0 {
                        SoftStats::inc(if served {
                            &self.stats.rx_served
                        } else {
                            &self.stats.rx_batches
                        });
                    }
                    // One ACK per QP for the requests of the batch (`QpInner::flush_ack`),
                    // before the completions' handlers run.
                    if served {
                        self.hold_acks(acks);
                    }
                    for q in acks.drain(..) {
                        q.flush_ack(self);
                    }
                    if n < BATCH {
                        return None;
                    }
                }
                Some(())
            })
            .is_some();
        self.run_tasks();
        more
    }

    /// Up to [`BATCH`] datagrams (or frames) from the socket; returns how many were taken.
    fn batch(&self, buf: &mut [u8], acks: &mut Vec<Arc<qp::QpInner>>) -> usize {
        for k in 0..BATCH {
            if self.v1.is_some() {
                match eth::recv(self.sock.as_fd(), buf) {
                    Ok(Some(n)) => self.frame(&buf[..n], acks),
                    Ok(None) => {}
                    Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                        SoftStats::inc(&self.stats.rx_dropped)
                    }
                    Err(_) => return k,
                }
                continue;
            }
            match udp::recv(self.sock.as_fd(), buf) {
                Ok(r) => {
                    let d = &buf[..r.len.min(buf.len())];
                    match r.seg {
                        // A GSO run kept whole: segment k had identification k.
                        Some(seg) => {
                            for (k, pkt) in d.chunks(seg).enumerate() {
                                self.datagram(pkt, r.from, k as u16, acks);
                            }
                        }
                        None => self.datagram(d, r.from, 0, acks),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    SoftStats::inc(&self.stats.rx_dropped)
                }
                Err(_) => return k,
            }
        }
        BATCH
    }

    /// Whether the current thread is in [`Dev::serve`] on this device.
    fn served_here(&self) -> bool {
        SERVING.with(|s| s.get()) == self as *const Dev as usize
    }

    /// [`CompletionQueue::serve`] for the queues of this device: the calling thread takes the
    /// socket from the receive thread ([`Waits`]), polls it for up to `spin`, then waits on it
    /// and handles what arrives, its ACKs and its completions' handlers, until `done`.
    ///
    /// Nothing is left behind: each look takes what the socket holds until it is empty (else
    /// the receive thread is rung for the rest), and the socket goes back to the receive
    /// thread after a last look; what comes between the two is reported to it at once.
    fn serve(
        &self,
        done: &dyn Fn() -> bool,
        timeout: Option<Duration>,
        spin: Duration,
    ) -> crate::verbs::Served {
        use crate::verbs::Served;
        // Counted before the look at the role: a thread that leaves the role after this
        // finds the count, or this thread finds the role free (see the end).
        self.recv.unserved.fetch_add(1, Ordering::SeqCst);
        if self.stop.load(Ordering::Acquire) {
            return Served::Declined;
        }
        let Ok(role) = self.recv.server.try_lock() else {
            // The server may have left with a lease just now.
            self.end_lease_soon();
            return Served::Declined;
        };
        self.recv.unserved.fetch_sub(1, Ordering::SeqCst);
        let deadline = timeout.map(|t| Instant::now() + t);
        SERVING.with(|s| s.set(self as *const Dev as usize));
        self.recv.serving.store(true, Ordering::SeqCst);
        // The receive thread stops waiting for the socket meanwhile: a datagram that comes
        // while this thread is not in its wait (it was just woken by the one before, or is
        // busy with it) waits for this thread instead of waking that one. After a serve
        // that left it on lease it is out already.
        {
            let mut w = lock(&self.recv.watched);
            w.lease_until = None;
            if w.watched {
                let _ = self.waits.watch(&self.sock, false);
                w.watched = false;
            }
        }
        let spun = (!spin.is_zero())
            .then(|| self.busy_poll(done, spin))
            .flatten();
        // The last look left datagrams in the socket (a bounded batch): look again before
        // waiting, as no new edge comes for them.
        let mut more = false;
        // The last thing done was a receive that found the socket empty: the look before
        // the socket goes back would find it so too (and what came since wakes the receive
        // thread when the socket rejoins its set).
        let mut drained = false;
        let out = loop {
            if let Some(t) = spun {
                break Served::Spun(t);
            }
            // Handlers scheduled by this thread's own rounds, or left for it.
            self.run_tasks();
            if self.stop.load(Ordering::Acquire) {
                break Served::Declined;
            }
            if done() {
                break Served::Woken;
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                break Served::TimedOut;
            }
            if more {
                more = self.receive(4);
                drained = !more;
                continue;
            }
            // Nothing was sent to take them along: the held ACKs go before the thread sleeps.
            self.release_acks(None);
            match wait_on(&self.waits.serve, left) {
                Ok(Some((sock, bell))) => {
                    if bell {
                        let mut b = [0u8; 8];
                        let _ = rustix::io::read(&self.waits.bell, &mut b);
                    }
                    drained = false;
                    if sock {
                        more = self.receive(4);
                        drained = !more;
                    }
                }
                // A signal: the caller looks (and may return EINTR).
                Ok(None) => break Served::Woken,
                Err(_) => break Served::Declined,
            }
        };
        // Take what came since the last look. Found empty, the socket stays out of the
        // receive thread's set for a while ([`SERVE_LEASE`]): the next serve (this thread's
        // next wait, usually) takes what comes meanwhile. Otherwise, or while other threads
        // wait unserved, it goes back to the receive thread: what comes between the look and
        // then (or is left of a long train) is there when it is watched again, which wakes
        // that thread at once.
        if !drained {
            drained = !self.receive(4);
        }
        self.recv.serving.store(false, Ordering::SeqCst);
        SERVING.with(|s| s.set(0));
        drop(role);
        if out == Served::Declined {
            // The caller waits unserved now (and says when it is over).
            self.recv.unserved.fetch_add(1, Ordering::SeqCst);
        }
        let lease = {
            let mut w = lock(&self.recv.watched);
            // Another thread took the role meanwhile: the socket is its.
            if self.recv.serving.load(Ordering::SeqCst) || w.watched {
                None
            } else if let Some(lease) = (drained
                && self.recv.unserved.load(Ordering::SeqCst) == 0
                && !self.stop.load(Ordering::Acquire))
            .then(|| Duration::from_nanos(self.recv.lease.load(Ordering::Relaxed)))
            .filter(|l| !l.is_zero())
            {
                let until = Instant::now() + lease;
                w.lease_until = Some(until);
                Some(until)
            } else {
                let _ = self.waits.watch(&self.sock, true);
                w.watched = true;
                None
            }
        };
        // The receive thread ends the lease ([`Dev::lease_check`]); rung only if it would
        // sleep past it.
        if let Some(until) = lease {
            self.timer_started(until);
        }
        out
    }

    /// [`CompletionQueue::unserved_wait_begin`] for this device's queues.
    fn unserved_wait_begin(&self) {
        self.recv.unserved.fetch_add(1, Ordering::SeqCst);
        self.end_lease_soon();
    }

    /// A thread waits unserved: a lease running now ends at the receive thread's next look,
    /// which it is rung for ([`Dev::lease_check`]), so that thread takes the socket back for
    /// the waiter's datagrams.
    fn end_lease_soon(&self) {
        if lock(&self.recv.watched).lease_until.is_some() {
            self.ring();
        }
    }

    /// Ends a lease now, if one runs ([`CompletionQueue::stop_serving`]): the socket goes back
    /// to the receive thread, which is woken at once if datagrams wait.
    fn end_lease(&self) {
        let mut w = lock(&self.recv.watched);
        if w.lease_until.take().is_some() && !w.watched && !self.recv.serving.load(Ordering::SeqCst)
        {
            let _ = self.waits.watch(&self.sock, true);
            w.watched = true;
        }
    }

    /// [`CompletionQueue::unserved_wait_over`] for this device's queues.
    fn unserved_wait_over(&self) {
        let _ = self
            .recv
            .unserved
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// The receive thread's look at a lease ([`SERVE_LEASE`]): ended (the socket back in
    /// its set, which reports datagrams waiting at once) when it ran out, when threads wait
    /// unserved, or when the device stops; otherwise when it runs out. `None` while a thread
    /// serves: that one leases or gives back when it leaves.
    fn lease_check(&self, now: Instant) -> Option<Instant> {
        let mut w = lock(&self.recv.watched);
        let until = w.lease_until?;
        if self.recv.serving.load(Ordering::SeqCst) || w.watched {
            return None;
        }
        if now < until
            && self.recv.unserved.load(Ordering::SeqCst) == 0
            && !self.stop.load(Ordering::Acquire)
        {
            return Some(until);
        }
        w.lease_until = None;
        let _ = self.waits.watch(&self.sock, true);
        w.watched = true;
        None
    }

    /// Holds the due ACKs of `acks` back (taking them out of it): the thread serving the
    /// device goes back to its program next, which usually answers at once (a ping-pong's
    /// reply, a stream's window update), and a send on the QP takes its due ACK along
    /// ([`qp::QpInner::send_due_ack`] before the requests), so the peer gets both in one
    /// train and wakes once. Sent at the latest when the thread waits again ([`Dev::serve`])
    /// or [`ACK_HOLD`] after (the receive thread), far below the requester's ACK timeout.
    /// The wire carries the same packets: an ACK is only later, as an RNIC's coalesced one.
    fn hold_acks(&self, acks: &mut Vec<Arc<qp::QpInner>>) {
        let now = Instant::now();
        {
            let mut h = lock(&self.recv.held);
            for q in acks.drain(..) {
                if !h.qps.iter().any(|x| Arc::ptr_eq(x, &q)) {
                    h.qps.push(q);
                }
            }
            h.since.get_or_insert(now);
            h.last = Some(now);
        }
        // As a post that starts a timer (`Dev::timer_started`): rung only if it would sleep
        // past the hold, which it does not while ACKs keep being held (`Dev::run`).
        self.timer_started(now + ACK_HOLD);
    }

    /// Sends the held ACKs: all of them, or (`due`) only if the oldest was held for
    /// [`ACK_HOLD`] by `due`'s time. Returns when the receive thread must look next: the
    /// oldest's end, or a tick while ACKs are being held ([`ACK_HOLDING`]).
    fn release_acks(&self, due: Option<Instant>) -> Option<Instant> {
        let (qps, next) = {
            let mut h = lock(&self.recv.held);
            let expired = match (due, h.since) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some(now), Some(t)) => now >= t + ACK_HOLD,
            };
            let qps = if expired {
                h.since = None;
                std::mem::take(&mut h.qps)
            } else {
                Vec::new()
            };
            let next = match (due, h.since, h.last) {
                (Some(_), Some(t), _) => Some(t + ACK_HOLD),
                (Some(now), None, Some(l)) if now < l + ACK_HOLDING => Some(now + ACK_HOLD),
                _ => None,
            };
            (qps, next)
        };
        for q in qps {
            q.flush_ack(self);
        }
        next
    }

    /// Polls the socket without sleeping until `done` or `spin` passed; how long it took
    /// when `done` came true. A `recvmsg` per round (the kernel's busy polling costs a look
    /// at the NIC's queue per round as well); the clock is read every 16.
    fn busy_poll(&self, done: &dyn Fn() -> bool, spin: Duration) -> Option<Duration> {
        let start = Instant::now();
        let mut round = 0u32;
        loop {
            // What a bounded look leaves, the next round takes.
            let _ = self.receive(4);
            self.run_tasks();
            if done() {
                return Some(start.elapsed());
            }
            round += 1;
            if round.is_multiple_of(16) && start.elapsed() >= spin {
                return None;
            }
            std::hint::spin_loop();
        }
    }

    /// [`CompletionQueue::wake_server`].
    fn wake_server(&self) {
        if self.recv.serving.load(Ordering::SeqCst) && !self.served_here() {
            let _ = rustix::io::write(&self.waits.bell, &1u64.to_ne_bytes());
        }
    }

    /// One packet from `from`, expected with IPv4 identification `id` (wire module docs).
    fn datagram(&self, d: &[u8], from: SocketAddrV4, id: u16, acks: &mut Vec<Arc<qp::QpInner>>) {
        let hdr = Ipv4Udp {
            src: *from.ip(),
            dst: self.addr,
            src_port: from.port(),
            dst_port: ROCEV2_UDP_PORT,
            id,
        };
        let p = match Packet::parse(d, &hdr) {
            Ok(p) => p,
            Err(WireError::Icrc { .. }) => {
                let solved = solve_ip_id(&hdr, d, &mut lock(&self.ids));
                let Some(Ok(p)) = solved.map(|id| Packet::parse(d, &Ipv4Udp { id, ..hdr })) else {
                    return SoftStats::inc(&self.stats.rx_dropped);
                };
                SoftStats::inc(&self.stats.rx_id_solved);
                p
            }
            Err(_) => return SoftStats::inc(&self.stats.rx_dropped),
        };
        self.deliver(&p, Gid::from_ipv4(*from.ip()), acks);
    }

    /// One RoCE v1 frame for this host: it must be addressed to our GID, and its source MAC
    /// must be the one its source GID names (a link-local GID says which MAC sent it).
    fn frame(&self, d: &[u8], acks: &mut Vec<Arc<qp::QpInner>>) {
        let Ok(f) = Frame::parse(d) else {
            return SoftStats::inc(&self.stats.rx_dropped);
        };
        let sgid = Gid(f.grh.sgid);
        if Gid(f.grh.dgid) != self.gid() || sgid.to_mac() != Some(f.src_mac) {
            return SoftStats::inc(&self.stats.rx_dropped);
        }
        self.deliver(&f.packet, sgid, acks);
    }

    /// A packet from the port with GID `from`, to the QP it names, which joins `acks` (its
    /// ACK may be due at the end of the batch).
    fn deliver(&self, p: &Packet<'_>, from: Gid, acks: &mut Vec<Arc<qp::QpInner>>) {
        let Some(qp) = read(&self.qps).get(&p.bth.dest_qpn).cloned() else {
            return SoftStats::inc(&self.stats.rx_dropped);
        };
        if qp.receive(self, p, from) {
            SoftStats::inc(&self.stats.rx_packets);
        } else {
            SoftStats::inc(&self.stats.rx_dropped);
        }
        if !acks.iter().any(|q| Arc::ptr_eq(q, &qp)) {
            acks.push(qp);
        }
    }

    /// Runs the timers that are due; returns the next one, and the shortest local ACK
    /// timeout of the QPs that can send.
    ///
    /// Runs under the QP table's read lock, with no copy of the table: this is called after
    /// every batch of datagrams. Nothing that holds a QP's lock takes the table's lock (a QP is
    /// removed from it only when its last handle drops), so the order table → QP is the only one.
    fn timers(&self, now: Instant) -> (Option<Instant>, Option<Duration>) {
        let (mut next, mut shortest) = (None::<Instant>, None::<Duration>);
        for q in read(&self.qps).values() {
            let (n, t) = q.on_timer(self, now);
            next = next.into_iter().chain(n).min();
            shortest = shortest.into_iter().chain(t).min();
        }
        (next, shortest)
    }
}

/// Lets a caller hold the device's socket (tests look at its address).
impl AsFd for SoftDevice {
    fn as_fd(&self) -> rustix::fd::BorrowedFd<'_> {
        self.dev.sock.as_fd()
    }
}
