//! The verbs vocabulary (`include/rdma/ib_verbs.h`, libibverbs' `verbs.h`), reduced to what a
//! reliable-connected user such as SMC-R needs, and the traits a device implements.
//!
//! Differences from libibverbs, all for a safe Rust API:
//! - Memory is registered as a [`Memory`] the region keeps alive, not as a raw pointer.
//! - Inline data is a byte slice ([`Payload::Inline`]), copied when the request is posted,
//!   instead of scatter/gather entries whose keys are ignored.
//! - Errors are typed ([`VerbsError`]); a work request that cannot be posted is refused with
//!   one and leaves the queue as it was.

use std::net::Ipv4Addr;
use std::sync::Arc;

/// A 16-byte GID. RoCEv2 GIDs of IPv4 addresses are IPv4-mapped IPv6 addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The RoCEv2 GID of an IPv4 address (`::ffff:a.b.c.d`).
    pub fn from_ipv4(a: Ipv4Addr) -> Self {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&a.octets());
        Self(g)
    }

    /// The RoCE v1 default GID of a port with this MAC: `fe80::` and the modified EUI-64
    /// (`crate::wire::v1::gid_of_mac`).
    pub fn from_mac(mac: [u8; 6]) -> Self {
        Self(crate::wire::v1::gid_of_mac(mac))
    }

    /// The MAC of a link-local EUI-64 GID, the kind [`Gid::from_mac`] makes.
    pub fn to_mac(&self) -> Option<[u8; 6]> {
        crate::wire::v1::mac_of_gid(&self.0)
    }

    /// The IPv4 address of an IPv4-mapped GID.
    pub fn to_ipv4(&self) -> Option<Ipv4Addr> {
        (self.0[..10].iter().all(|&b| b == 0) && self.0[10] == 0xff && self.0[11] == 0xff)
            .then(|| Ipv4Addr::new(self.0[12], self.0[13], self.0[14], self.0[15]))
    }
}

impl std::fmt::Display for Gid {
    /// As `ibv_devinfo -v` / `show_gids` print it: eight groups of four hex digits.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, c) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", c[0], c[1])?;
        }
        Ok(())
    }
}

/// Path MTU (`enum ib_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes (1).
    M256 = 1,
    /// 512 bytes (2).
    M512 = 2,
    /// 1024 bytes (3).
    M1024 = 3,
    /// 2048 bytes (4).
    M2048 = 4,
    /// 4096 bytes (5).
    M4096 = 5,
}

impl Mtu {
    /// Payload bytes per packet.
    pub fn bytes(self) -> usize {
        128 << (self as u8)
    }

    /// From the IB enum value (as CLC and LLC carry it).
    pub fn from_ib(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::M256,
            2 => Self::M512,
            3 => Self::M1024,
            4 => Self::M2048,
            5 => Self::M4096,
            _ => return None,
        })
    }

    /// The largest MTU whose RoCEv2 packets fit a netdev MTU of `netdev_mtu` bytes (IPv4, UDP,
    /// BTH, RETH and ICRC; the kernel's `rdma_mtu_from_attr` / rxe's `eth_mtu_int_to_enum`).
    pub fn for_netdev(netdev_mtu: usize) -> Option<Self> {
        Self::fitting(netdev_mtu.checked_sub(20 + 8 + 12 + 16 + 4)?)
    }

    /// The largest MTU whose RoCE v1 packets (GRH, BTH, RETH, ICRC) fit a netdev MTU of
    /// `netdev_mtu` bytes.
    pub fn for_netdev_roce_v1(netdev_mtu: usize) -> Option<Self> {
        Self::fitting(netdev_mtu.checked_sub(40 + 12 + 16 + 4)?)
    }

    fn fitting(room: usize) -> Option<Self> {
        [
            Self::M4096,
            Self::M2048,
            Self::M1024,
            Self::M512,
            Self::M256,
        ]
        .into_iter()
        .find(|m| m.bytes() <= room)
    }
}

/// Memory-region and queue-pair access rights (`enum ib_access_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access(pub u32);

impl Access {
    /// The device may write it locally (receives land here).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may RDMA WRITE into it.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Peers may RDMA READ from it (not served by the soft device).
    pub const REMOTE_READ: Access = Access(4);

    /// Whether every right in `other` is here.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
}

/// Queue pair states (`enum ib_qp_state`, the ones an RC QP passes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Just created or reset: nothing is sent or received.
    Reset,
    /// Receives may be posted; nothing moves yet.
    Init,
    /// Ready to receive: requests from the peer are answered.
    Rtr,
    /// Ready to send.
    Rts,
    /// Failed (or moved there): outstanding work requests complete as flushed.
    Error,
}

/// A state change with its attributes (`ibv_modify_qp` with the mask RC needs per step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpModify {
    /// RESET → INIT.
    Init {
        /// Device port (1-based).
        port: u8,
        /// What peers may do to our memory through this QP.
        access: Access,
    },
    /// INIT → RTR: the peer's address and the receive side.
    Rtr {
        /// Payload bytes per packet.
        path_mtu: Mtu,
        /// The peer's queue pair number.
        dest_qpn: u32,
        /// The PSN of the first request the peer sends.
        rq_psn: u32,
        /// The peer's GID.
        dgid: Gid,
        /// Our GID index the peer is reached from.
        sgid_index: u8,
        /// RNR timer code we ask the peer to wait after an RNR NAK (IBTA table 45).
        min_rnr_timer: u8,
    },
    /// RTR → RTS: the send side.
    Rts {
        /// The PSN of our first request.
        sq_psn: u32,
        /// Local ACK timeout code: 4.096 µs × 2^timeout (0: wait forever).
        timeout: u8,
        /// Retransmissions after a timeout or sequence NAK before the request fails.
        retry_cnt: u8,
        /// Retries after an RNR NAK (7: without limit).
        rnr_retry: u8,
    },
    /// Any state → ERROR.
    Error,
    /// Any state → RESET.
    Reset,
}

/// Queue sizes a QP is created with (and, as returned, got).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive.
    pub max_recv_sge: u32,
    /// Largest inline payload.
    pub max_inline_data: u32,
}

/// A scatter/gather entry: `len` bytes at `addr` of the region with `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address (inside the region).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// The region's local key.
    pub lkey: u32,
}

/// What a send work request carries.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'a> {
    /// Gathered from registered memory.
    Sges(&'a [Sge]),
    /// Copied now (`IBV_SEND_INLINE`); at most `max_inline_data` bytes.
    Inline(&'a [u8]),
}

/// The operation of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// A SEND into the peer's next posted receive.
    Send,
    /// An RDMA WRITE to `remote_addr` in the peer's region with `rkey`.
    Write {
        /// Peer virtual address.
        remote_addr: u64,
        /// Peer region's remote key.
        rkey: u32,
    },
}

/// A send work request.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// SEND or RDMA WRITE.
    pub op: SendOp,
    /// The bytes.
    pub data: Payload<'a>,
    /// Whether its success makes a completion (failures always do).
    pub signaled: bool,
    /// Solicited event: wakes a peer waiting for solicited completions only.
    pub solicited: bool,
}

/// A receive work request: one buffer, or two (a QP with `max_recv_sge` 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where the SEND lands (its first `sge.len` bytes).
    pub sge: Sge,
    /// A second scatter entry: the bytes past `sge.len` land here. The kernel's SMC-Rv2 links
    /// post every receive as {44 bytes of the WR's own buffer, the rest of the group's 8 KiB
    /// v2 buffer} (`smc_wr_init_sge`).
    pub spill: Option<Sge>,
}

impl RecvWr {
    /// A receive into one buffer.
    pub const fn one(wr_id: u64, sge: Sge) -> RecvWr {
        RecvWr {
            wr_id,
            sge,
            spill: None,
        }
    }

    /// The bytes both scatter entries hold.
    pub fn capacity(&self) -> usize {
        self.sge.len as usize + self.spill.map_or(0, |g| g.len as usize)
    }
}

/// Completion status (`enum ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    /// Done.
    Success,
    /// A received SEND longer than the posted buffer.
    LocLenErr,
    /// An SGE outside its region or with a wrong key.
    LocProtErr,
    /// Flushed: the QP went to ERROR before this request finished.
    WrFlushErr,
    /// The responder found the request invalid.
    RemInvReqErr,
    /// The responder refused the rkey, bounds or rights.
    RemAccessErr,
    /// The responder failed.
    RemOpErr,
    /// No ACK after `retry_cnt` retransmissions.
    RetryExcErr,
    /// RNR NAKs beyond `rnr_retry`.
    RnrRetryExcErr,
}

/// What completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    /// A SEND we posted.
    Send,
    /// An RDMA WRITE we posted.
    RdmaWrite,
    /// A SEND from the peer landed in a posted receive.
    Recv,
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Kind.
    pub opcode: WcOpcode,
    /// Received bytes (receives only).
    pub byte_len: u32,
    /// The local QP.
    pub qp_num: u32,
    /// A received SEND had the solicited-event bit.
    pub solicited: bool,
}

impl Wc {
    /// A slot to poll into (`[Wc::EMPTY; N]`); [`CompletionQueue::poll`] overwrites it.
    pub const EMPTY: Wc = Wc {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        qp_num: 0,
        solicited: false,
    };
}

/// Why a verb failed.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// The QP is not in a state that allows this (posting a send before RTS, a modify that is
    /// not the next step).
    #[error("queue pair is in state {0:?}")]
    State(QpState),
    /// An argument the device cannot take.
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    /// The queue is full (`ENOMEM` from `ibv_post_send`).
    #[error("{0} queue is full")]
    Full(&'static str),
    /// An SGE or key that does not name registered memory.
    #[error("local protection error: {0}")]
    Protection(&'static str),
    /// The operating system refused.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Port state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// The netdev is up.
    Active,
    /// The netdev is down.
    Down,
}

/// What the GID table says an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidType {
    /// RoCE v1 (Ethertype 0x8915).
    RoceV1,
    /// RoCE v2 (UDP 4791).
    RoceV2,
}

/// A port of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// 1-based port number.
    pub port: u8,
    /// Up or down.
    pub state: PortState,
    /// The largest path MTU the port's netdev carries.
    pub active_mtu: Mtu,
    /// The netdev it is bound to.
    pub netdev: String,
    /// That netdev's MAC.
    pub mac: [u8; 6],
    /// GID table: (index, GID, type).
    pub gids: Vec<(u8, Gid, GidType)>,
}

/// A device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Name (`ibv_get_device_name`: `rxe0`, `mlx5_0`, ours `sroce0`).
    pub name: String,
    /// Its ports.
    pub ports: Vec<PortInfo>,
}

/// A protection domain: regions and QPs of one domain only reach each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pd(pub u32);

/// Page-aligned memory a device may write at any time, as a NIC writes by DMA: readers copy
/// out of it, and only what a completion or a peer's control message says is complete is
/// meaningful. Zeroed when made.
#[derive(Debug)]
pub struct Memory {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the memory is a private anonymous mapping owned by this value; every access goes
// through raw-pointer copies of bounds-checked ranges (`read`, `write`), never through
// references, so sharing it between threads creates no aliasing `&mut`.
unsafe impl Send for Memory {}
// SAFETY: as for Send.
unsafe impl Sync for Memory {}

impl Memory {
    /// `len` bytes (rounded up to pages), zeroed.
    pub fn new(len: usize) -> std::io::Result<Arc<Self>> {
        if len == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "empty memory",
            ));
        }
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )
        }?;
        Ok(Arc::new(Self {
            ptr: std::ptr::NonNull::new(p.cast()).expect("mmap returns non-null"),
            len,
        }))
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (empty memory cannot be made).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its virtual address, as regions and RETHs name it.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    fn check(&self, off: usize, n: usize) {
        assert!(
            off.checked_add(n).is_some_and(|e| e <= self.len),
            "memory access {off}+{n} outside {} bytes",
            self.len
        );
    }

    /// Copies `out.len()` bytes at `off` out. Panics outside the memory (a caller bug).
    pub fn read(&self, off: usize, out: &mut [u8]) {
        self.check(off, out.len());
        // SAFETY: in bounds (checked); the source is our mapping, the destination a distinct
        // caller buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), out.as_mut_ptr(), out.len())
        }
    }

    /// Sets every byte to 0 (`memzero_explicit` of a buffer the kernel gives to its next
    /// connection).
    pub fn zero(&self) {
        // SAFETY: our mapping, exactly `len` bytes of it.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), 0, self.len) }
    }

    /// Copies `data` in at `off`. Panics outside the memory (a caller bug).
    pub fn write(&self, off: usize, data: &[u8]) {
        self.check(off, data.len());
        // SAFETY: in bounds (checked); distinct buffers.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len())
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: our own mapping, of this length; nothing refers to it any more (regions hold
        // an Arc).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A registered memory region.
pub trait MemoryRegion: Send + Sync + std::fmt::Debug {
    /// Key for local SGEs.
    fn lkey(&self) -> u32;
    /// Key peers put into RETHs.
    fn rkey(&self) -> u32;
    /// Virtual address of its first byte.
    fn addr(&self) -> u64;
    /// Its length.
    fn len(&self) -> usize;
    /// Never true (empty memory cannot be made).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The memory.
    fn memory(&self) -> &Arc<Memory>;
}

/// A completion queue.
pub trait CompletionQueue: Send + Sync + std::fmt::Debug {
    /// Moves up to `out.len()` completions into `out`; returns how many.
    fn poll(&self, out: &mut [Wc]) -> usize;
    /// Arms the queue: the next completion (with `solicited_only`, the next received SEND
    /// with the solicited bit, or any error) makes [`CompletionQueue::event_fd`] readable once.
    /// Returns whether completions were already waiting
    /// (`IB_CQ_REPORT_MISSED_EVENTS`): then poll before sleeping.
    fn req_notify(&self, solicited_only: bool) -> bool;
    /// The completion channel: readable after an armed completion.
    fn event_fd(&self) -> std::os::fd::BorrowedFd<'_>;
    /// Takes the channel's event (`ibv_get_cq_event` + ack); returns whether there was one.
    fn take_event(&self) -> bool;
    /// Asks the device to run `handler` on its own thread when an armed completion arrives,
    /// instead of making [`CompletionQueue::event_fd`] readable: the kernel's `comp_handler`,
    /// which runs where the completion was made (rxe: its tasklets) and saves waking a thread
    /// that waits on the channel. The handler runs with no lock of the device held; it must
    /// not block, and must never wait for the device (it runs on the thread that would make
    /// the progress). Set once. Returns `false` where the device has no thread of its own
    /// (an RNIC: the channel stays the way to wait).
    fn set_handler(&self, handler: CqHandler) -> bool {
        let _ = handler;
        false
    }
    /// Lets a thread that would otherwise sleep until a completion arrives do the device's
    /// receive work itself while it waits: it sleeps on the device's input, handles what
    /// arrives (completions and their handlers included) and asks `done` after each round,
    /// until `done` says so, [`CompletionQueue::wake_server`] is called, a signal arrives
    /// ([`Served::Woken`] for all three: look again) or `timeout` passes. What arrives while
    /// such a thread waits wakes only that thread: one wake-up per arrival instead of the
    /// device's thread's and then the waiter's (the kernel's softirq, run by the one it wakes).
    /// [`Served::Declined`] at once when another thread serves the device, or the device has
    /// no thread of its own to relieve (an RNIC): wait the usual way then, and call
    /// [`CompletionQueue::unserved_wait_over`] when that wait is over (also after a decline
    /// that stands for no wait). A thread that served may leave the device's input to the
    /// next serve for a moment after it returns; while threads wait unserved it does not.
    ///
    /// With a `spin` budget the thread first polls the device without sleeping for up to that
    /// long (the kernel's busy polling); [`Served::Spun`] says `done` came true within it.
    fn serve(
        &self,
        done: &dyn Fn() -> bool,
        timeout: Option<std::time::Duration>,
        spin: std::time::Duration,
    ) -> Served {
        let _ = (done, timeout, spin);
        Served::Declined
    }
    /// Wakes the thread in [`CompletionQueue::serve`] on this queue's device, if any (it asks
    /// `done` again). Cheap when none serves or the caller is that thread.
    fn wake_server(&self) {}
    /// Ends a wait made after [`CompletionQueue::serve`] said [`Served::Declined`], or begun
    /// with [`CompletionQueue::unserved_wait_begin`].
    fn unserved_wait_over(&self) {}
    /// The calling thread will not serve this queue's device again soon (its connection
    /// closes, and what finishes the close runs elsewhere): input the device kept for the
    /// next serve goes to the device's own thread now.
    fn stop_serving(&self) {}
    /// A thread begins to wait for something this queue's device will deliver without
    /// serving it (a condition another thread signals from a completion's handler): the
    /// device's input is not left waiting for a serve meanwhile. Ended with
    /// [`CompletionQueue::unserved_wait_over`].
    fn unserved_wait_begin(&self) {}
}

/// How [`CompletionQueue::serve`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// `done` came true while the thread polled, after this long.
    Spun(std::time::Duration),
    /// `done` said so, the thread was woken, or a signal interrupted the wait.
    Woken,
    /// The timeout passed.
    TimedOut,
    /// Not served: another thread does, or the device cannot be served this way.
    Declined,
}

/// What [`CompletionQueue::set_handler`] runs.
pub type CqHandler = Arc<dyn Fn() + Send + Sync>;

/// A reliable-connected queue pair.
pub trait QueuePair: Send + Sync + std::fmt::Debug {
    /// Its number.
    fn qp_num(&self) -> u32;
    /// Its state.
    fn state(&self) -> QpState;
    /// What it was created with.
    fn caps(&self) -> QpCaps;
    /// The next state.
    fn modify(&self, m: &QpModify) -> Result<(), VerbsError>;
    /// Posts a send (RTS only). The data is taken now; the request completes when the peer
    /// acknowledged it.
    fn post_send(&self, wr: &SendWr<'_>) -> Result<(), VerbsError>;
    /// Posts several sends in order, as `ibv_post_send` takes a chain of work requests (one
    /// doorbell). On an error, the requests before the failing one are posted: its index
    /// comes with the error (`bad_wr`). A device may send the chain's packets together;
    /// what goes on the wire is what posting them one by one would send.
    fn post_send_list(&self, wrs: &[SendWr<'_>]) -> Result<(), (usize, VerbsError)> {
        for (i, wr) in wrs.iter().enumerate() {
            self.post_send(wr).map_err(|e| (i, e))?;
        }
        Ok(())
    }
    /// Posts a receive (from INIT on).
    fn post_recv(&self, wr: &RecvWr) -> Result<(), VerbsError>;
}

/// What a QP is created with.
#[derive(Debug, Clone)]
pub struct QpInit<C> {
    /// Where send completions go.
    pub send_cq: Arc<C>,
    /// Where receive completions go.
    pub recv_cq: Arc<C>,
    /// Queue sizes.
    pub caps: QpCaps,
    /// Every send is signaled (`sq_sig_type` ALL_WR).
    pub sq_sig_all: bool,
}

/// A device: the factory of the rest.
pub trait Device: Send + Sync + std::fmt::Debug + 'static {
    /// Its regions.
    type Mr: MemoryRegion + 'static;
    /// Its completion queues.
    type Cq: CompletionQueue + 'static;
    /// Its queue pairs.
    type Qp: QueuePair + 'static;
    /// Name, ports, GIDs.
    fn info(&self) -> DeviceInfo;
    /// A new protection domain.
    fn alloc_pd(&self) -> Pd;
    /// Registers `mem` in `pd` with `access`.
    fn reg_mr(&self, pd: Pd, mem: Arc<Memory>, access: Access) -> Result<Self::Mr, VerbsError>;
    /// A completion queue of `cqe` entries.
    fn create_cq(&self, cqe: u32) -> Result<Arc<Self::Cq>, VerbsError>;
    /// A queue pair in RESET.
    fn create_qp(&self, pd: Pd, init: QpInit<Self::Cq>) -> Result<Self::Qp, VerbsError>;
}

/// The attributes of an RC connection between two QPs, for [`bring_up`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcPath {
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout code (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Retransmissions before a request fails.
    pub retry_cnt: u8,
    /// RNR retries (7: without limit).
    pub rnr_retry: u8,
    /// RNR timer code asked of the peer.
    pub min_rnr_timer: u8,
    /// What the peer may do to our memory.
    pub access: Access,
}

impl Default for RcPath {
    /// SMC-R's QP attributes (`smc_ib_modify_qp_rtr`/`_rts`: timeout 15, retry 7, RNR retry
    /// 7, min RNR timer 5) with a 1024-byte MTU and local and remote writes allowed.
    fn default() -> Self {
        Self {
            mtu: Mtu::M1024,
            timeout: 15,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 5,
            access: Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0),
        }
    }
}

/// Walks `qp` RESET → INIT → RTR → RTS towards the peer QP `peer_qpn` at `peer_gid`: it
/// receives from `rq_psn` (the peer's first send PSN) and sends from `sq_psn`. Receives may be
/// posted before (from INIT) or after.
pub fn bring_up<Q: QueuePair + ?Sized>(
    qp: &Q,
    path: &RcPath,
    peer_qpn: u32,
    peer_gid: Gid,
    rq_psn: u32,
    sq_psn: u32,
) -> Result<(), VerbsError> {
    qp.modify(&QpModify::Init {
        port: 1,
        access: path.access,
    })?;
    qp.modify(&QpModify::Rtr {
        path_mtu: path.mtu,
        dest_qpn: peer_qpn,
        rq_psn,
        dgid: peer_gid,
        sgid_index: 0,
        min_rnr_timer: path.min_rnr_timer,
    })?;
    qp.modify(&QpModify::Rts {
        sq_psn,
        timeout: path.timeout,
        retry_cnt: path.retry_cnt,
        rnr_retry: path.rnr_retry,
    })
}

#[cfg(test)]
mod tests {
    use super::Memory;

    #[test]
    fn zero_clears_every_byte_written() {
        let m = Memory::new(3 * 4096 + 17).expect("memory");
        m.write(0, &[0xaa; 100]);
        let end = m.len() - 5;
        m.write(end, &[1, 2, 3, 4, 5]);
        m.zero();
        let mut all = vec![0xff; m.len()];
        m.read(0, &mut all);
        assert!(all.iter().all(|&b| b == 0));
    }
}
