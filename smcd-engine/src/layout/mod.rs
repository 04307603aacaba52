//! Pages shared between `smcd` and the engines, and their layouts.
//!
//! | page | writer | readers | what |
//! |---|---|---|---|
//! | [`SysctlPage`] | smcd | engines of one namespace | the namespace's knob values (a seqlock) |
//! | [`ListenerTable`] | smcd | all engines | which addresses have an SMC listener (the SYN option's information, readable without a round trip) |
//! | [`ListenerPage`] | a listener's engine | smcd, clients | whether the listener's handshake work is congested |
//! | [`status::StatusArea`] | an engine | smcd | the engine's counters, sockets and link groups, summed and listed at dump time |
//!
//! The kernel keeps all of this in one address space; here each page has exactly one writer,
//! readers map it read-only (see [`region`]), and every reader treats what it reads as
//! untrusted input.

pub mod region;
pub mod status;

use region::Region;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::fence;

/// Page size used for small pages.
pub const PAGE: usize = 4096;

/// Reads a seqlock-protected value: `f` runs until the sequence word is even and unchanged
/// across the read, at most `tries` times (the writer may be hostile or dead mid-write).
pub fn seq_read<T>(
    seq: &std::sync::atomic::AtomicU32,
    tries: usize,
    mut f: impl FnMut() -> T,
) -> Option<T> {
    for _ in 0..tries {
        let s1 = seq.load(Acquire);
        if s1 & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let v = f();
        fence(Acquire);
        if seq.load(Relaxed) == s1 {
            return Some(v);
        }
    }
    None
}

/// Writes under a seqlock. Writers may race (an engine's connections close on any thread and
/// fold their counters under one sequence word): each claims the odd value with a
/// compare-exchange, so two writers never interleave and the word's parity stays meaningful.
pub fn seq_write(seq: &std::sync::atomic::AtomicU32, f: impl FnOnce()) {
    let mut spins = 0u32;
    let s = loop {
        let s = seq.load(Relaxed);
        // Acquire: the previous writer's data stores happen before ours.
        if s & 1 == 0
            && seq
                .compare_exchange_weak(s, s.wrapping_add(1), Acquire, Relaxed)
                .is_ok()
        {
            break s;
        }
        // Another writer holds it: let it run rather than spin against it (on two vCPUs the
        // holder may be waiting for this very CPU).
        spins += 1;
        if spins.is_multiple_of(64) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    };
    fence(Release);
    f();
    seq.store(s.wrapping_add(2), Release);
}

// ------------------------------------------------------------------------------------------
// Sysctl page.

const SYSCTL_MAGIC: u64 = u64::from_le_bytes(*b"SMCSYSCT");
const SYSCTL_SEQ: usize = 16;
const SYSCTL_VALUES: usize = 64;
const SYSCTL_EIDS: usize = 2048;
/// Most knobs a page holds.
pub const SYSCTL_MAX: usize = (SYSCTL_EIDS - SYSCTL_VALUES) / 8;
/// Most user EIDs a page holds (the kernel's `SMC_MAX_UEID`).
pub const UEID_MAX: usize = 4;

/// What a sysctl page carries besides the knobs: the host's EID state, which the kernel
/// keeps globally and every engine needs for its proposals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EidState {
    /// User EIDs (32 bytes each, blank padded).
    pub ueids: Vec<[u8; 32]>,
    /// Whether the system EID is enabled.
    pub seid_enabled: bool,
}

/// One namespace's knob values, written by smcd and read by its engines.
#[derive(Debug)]
pub struct SysctlPage {
    r: Region,
}

impl SysctlPage {
    /// smcd: a new page holding `values`; returns it and the descriptor for engines.
    pub fn create(
        values: &[u64],
        eids: &EidState,
    ) -> io::Result<(SysctlPage, rustix::fd::OwnedFd)> {
        let (r, fd) = Region::create("smc-sysctl", PAGE)?;
        r.u64_at(0).store(SYSCTL_MAGIC, Relaxed);
        let p = SysctlPage { r };
        p.store(values, eids);
        Ok((p, fd))
    }

    /// Engine: maps a received page.
    pub fn open(fd: impl rustix::fd::AsFd) -> io::Result<SysctlPage> {
        let r = Region::open_read_only(fd, PAGE)?;
        if r.u64_at(0).load(Relaxed) != SYSCTL_MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a sysctl page",
            ));
        }
        Ok(SysctlPage { r })
    }

    /// smcd: publishes new values.
    pub fn store(&self, values: &[u64], eids: &EidState) {
        seq_write(self.r.u32_at(SYSCTL_SEQ), || {
            for (i, v) in values.iter().take(SYSCTL_MAX).enumerate() {
                self.r.u64_at(SYSCTL_VALUES + 8 * i).store(*v, Relaxed);
            }
            self.r
                .u32_at(8)
                .store(values.len().min(SYSCTL_MAX) as u32, Relaxed);
            let n = eids.ueids.len().min(UEID_MAX);
            self.r.u32_at(SYSCTL_EIDS).store(n as u32, Relaxed);
            self.r
                .u32_at(SYSCTL_EIDS + 4)
                .store(u32::from(eids.seid_enabled), Relaxed);
            for (i, e) in eids.ueids.iter().take(n).enumerate() {
                for w in 0..4 {
                    let b: [u8; 8] = e[8 * w..8 * w + 8].try_into().expect("8");
                    self.r
                        .u64_at(SYSCTL_EIDS + 8 + 32 * i + 8 * w)
                        .store(u64::from_ne_bytes(b), Relaxed);
                }
            }
        });
    }

    /// Engine: a consistent copy of the values and EID state (`None` if the writer never
    /// finished a write).
    pub fn load(&self) -> Option<(Vec<u64>, EidState)> {
        seq_read(self.r.u32_at(SYSCTL_SEQ), 1000, || {
            let n = (self.r.u32_at(8).load(Relaxed) as usize).min(SYSCTL_MAX);
            let values = (0..n)
                .map(|i| self.r.u64_at(SYSCTL_VALUES + 8 * i).load(Relaxed))
                .collect::<Vec<_>>();
            let m = (self.r.u32_at(SYSCTL_EIDS).load(Relaxed) as usize).min(UEID_MAX);
            let ueids = (0..m)
                .map(|i| {
                    let mut e = [0u8; 32];
                    for w in 0..4 {
                        let v = self
                            .r
                            .u64_at(SYSCTL_EIDS + 8 + 32 * i + 8 * w)
                            .load(Relaxed);
                        e[8 * w..8 * w + 8].copy_from_slice(&v.to_ne_bytes());
                    }
                    e
                })
                .collect();
            let seid_enabled = self.r.u32_at(SYSCTL_EIDS + 4).load(Relaxed) != 0;
            (
                values,
                EidState {
                    ueids,
                    seid_enabled,
                },
            )
        })
    }
}

// ------------------------------------------------------------------------------------------
// Listener table.

const LT_MAGIC: u64 = u64::from_le_bytes(*b"SMCLSTNR");
/// Buckets of the listener table (by port).
pub const LT_BUCKETS: usize = 1024;
/// Entries per bucket.
pub const LT_WAYS: usize = 4;
const LT_ENTRY: usize = 64;
const LT_OVERFLOW: usize = 64;
const LT_ENTRIES: usize = LT_OVERFLOW + 4 * LT_BUCKETS;
/// Size of the listener table.
pub const LT_LEN: usize = LT_ENTRIES + LT_BUCKETS * LT_WAYS * LT_ENTRY;

const E_SEQ: usize = 0;
const E_FLAGS: usize = 4;
const E_NETNS: usize = 8;
const E_PORT: usize = 16;
const E_ID: usize = 20;
const E_ADDR: usize = 24;

const F_VALID: u32 = 1;
const F_HS_LIMIT: u32 = 2;
const F_V6: u32 = 4;

/// A listener as the table describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableEntry {
    /// smcd's listener id.
    pub id: u32,
    /// Namespace inode.
    pub netns: u64,
    /// Bound address.
    pub addr: SocketAddr,
    /// Handshake limitation on.
    pub hs_limit: bool,
}

/// Where every SMC listener of the host is: written by smcd, read by every engine before it
/// connects, so a connection to an address without an SMC listener costs no round trip.
#[derive(Debug)]
pub struct ListenerTable {
    r: Region,
}

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// No SMC listener there: plain TCP.
    None,
    /// This listener.
    Found(TableEntry),
    /// The bucket overflowed: ask smcd.
    Ask,
}

fn ip_words(ip: IpAddr) -> ([u32; 4], bool) {
    match ip {
        IpAddr::V4(v4) => ([u32::from_ne_bytes(v4.octets()), 0, 0, 0], false),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            ([w(0), w(4), w(8), w(12)], true)
        }
    }
}

fn words_ip(w: [u32; 4], v6: bool) -> IpAddr {
    if v6 {
        let mut o = [0u8; 16];
        for i in 0..4 {
            o[4 * i..4 * i + 4].copy_from_slice(&w[i].to_ne_bytes());
        }
        IpAddr::from(o)
    } else {
        IpAddr::from(w[0].to_ne_bytes())
    }
}

impl ListenerTable {
    /// smcd: an empty table and the descriptor for engines.
    pub fn create() -> io::Result<(ListenerTable, rustix::fd::OwnedFd)> {
        let (r, fd) = Region::create("smc-listeners", LT_LEN)?;
        r.u64_at(0).store(LT_MAGIC, Release);
        Ok((ListenerTable { r }, fd))
    }

    /// Engine: maps a received table.
    pub fn open(fd: impl rustix::fd::AsFd) -> io::Result<ListenerTable> {
        let r = Region::open_read_only(fd, LT_LEN)?;
        if r.u64_at(0).load(Relaxed) != LT_MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a listener table",
            ));
        }
        Ok(ListenerTable { r })
    }

    fn bucket(port: u16) -> usize {
        port as usize % LT_BUCKETS
    }

    fn entry(b: usize, way: usize) -> usize {
        LT_ENTRIES + (b * LT_WAYS + way) * LT_ENTRY
    }

    fn read_entry(&self, off: usize) -> Option<Option<TableEntry>> {
        seq_read(self.r.u32_at(off + E_SEQ), 100, || {
            let flags = self.r.u32_at(off + E_FLAGS).load(Relaxed);
            if flags & F_VALID == 0 {
                return None;
            }
            let w = [0, 1, 2, 3].map(|i| self.r.u32_at(off + E_ADDR + 4 * i).load(Relaxed));
            let port = self.r.u32_at(off + E_PORT).load(Relaxed) as u16;
            Some(TableEntry {
                id: self.r.u32_at(off + E_ID).load(Relaxed),
                netns: self.r.u64_at(off + E_NETNS).load(Relaxed),
                addr: SocketAddr::new(words_ip(w, flags & F_V6 != 0), port),
                hs_limit: flags & F_HS_LIMIT != 0,
            })
        })
    }

    /// smcd: adds a listener; false if its bucket is full (the bucket is then marked so
    /// engines ask smcd for that port).
    pub fn insert(&self, e: TableEntry) -> bool {
        let b = Self::bucket(e.addr.port());
        for way in 0..LT_WAYS {
            let off = Self::entry(b, way);
            if self.r.u32_at(off + E_FLAGS).load(Relaxed) & F_VALID == 0 {
                let (w, v6) = ip_words(e.addr.ip());
                seq_write(self.r.u32_at(off + E_SEQ), || {
                    self.r.u64_at(off + E_NETNS).store(e.netns, Relaxed);
                    self.r
                        .u32_at(off + E_PORT)
                        .store(u32::from(e.addr.port()), Relaxed);
                    self.r.u32_at(off + E_ID).store(e.id, Relaxed);
                    for (i, x) in w.iter().enumerate() {
                        self.r.u32_at(off + E_ADDR + 4 * i).store(*x, Relaxed);
                    }
                    let flags = F_VALID
                        | if e.hs_limit { F_HS_LIMIT } else { 0 }
                        | if v6 { F_V6 } else { 0 };
                    self.r.u32_at(off + E_FLAGS).store(flags, Relaxed);
                });
                return true;
            }
        }
        self.r.u32_at(LT_OVERFLOW + 4 * b).fetch_add(1, Release);
        false
    }

    /// smcd: removes listener `id` (bound to `port`); `overflowed` says it was not in the
    /// table but counted in its bucket's overflow.
    pub fn remove(&self, id: u32, port: u16, overflowed: bool) {
        let b = Self::bucket(port);
        if overflowed {
            self.r.u32_at(LT_OVERFLOW + 4 * b).fetch_sub(1, Release);
            return;
        }
        for way in 0..LT_WAYS {
            let off = Self::entry(b, way);
            let flags = self.r.u32_at(off + E_FLAGS).load(Relaxed);
            if flags & F_VALID != 0 && self.r.u32_at(off + E_ID).load(Relaxed) == id {
                seq_write(self.r.u32_at(off + E_SEQ), || {
                    self.r.u32_at(off + E_FLAGS).store(0, Relaxed);
                });
            }
        }
    }

    /// Engine: the listener a connection from namespace `netns` to `dst` reaches, with the
    /// same rules smcd applies (same namespace: exact address, then wildcard; other namespaces:
    /// exact address only).
    pub fn lookup(&self, dst: SocketAddr, netns: u64) -> Lookup {
        let b = Self::bucket(dst.port());
        let dip = dst.ip().to_canonical();
        let mut exact_same = None;
        let mut wildcard_same = None;
        let mut wildcard_dual = None;
        let mut exact_other = None;
        for way in 0..LT_WAYS {
            let Some(Some(e)) = self.read_entry(Self::entry(b, way)) else {
                continue;
            };
            if e.addr.port() != dst.port() {
                continue;
            }
            let lip = e.addr.ip().to_canonical();
            let exact = lip == dip;
            // A wildcard of the destination's family first; an IPv6 one also takes IPv4
            // (dual stack) only when no IPv4 wildcard does: with both bound (redis listens
            // on 0.0.0.0 and on [::] with IPV6_V6ONLY), the kernel gives IPv4 to 0.0.0.0.
            let unspecified = e.addr.ip().is_unspecified();
            let wild = unspecified && e.addr.is_ipv4() == dip.is_ipv4();
            let dual = unspecified && e.addr.is_ipv6() && dip.is_ipv4();
            if e.netns == netns {
                if exact {
                    exact_same = Some(e);
                } else if wild {
                    wildcard_same = Some(e);
                } else if dual {
                    wildcard_dual = Some(e);
                }
            } else if exact {
                exact_other = Some(e);
            }
        }
        if let Some(e) = exact_same
            .or(wildcard_same)
            .or(wildcard_dual)
            .or(exact_other)
        {
            return Lookup::Found(e);
        }
        if self.r.u32_at(LT_OVERFLOW + 4 * b).load(Acquire) > 0 {
            Lookup::Ask
        } else {
            Lookup::None
        }
    }
}

// ------------------------------------------------------------------------------------------
// Listener page.

/// Size of a listener page.
pub const LP_LEN: usize = PAGE;
const LP_CONGESTED: usize = 0;
const LP_IN_PROGRESS: usize = 4;
const LP_SHARED: usize = 8;

/// A listener's own page: written by the listener's engine, read by smcd and by clients that
/// want to know, without asking, whether the listener would take an SMC handshake now.
#[derive(Debug)]
pub struct ListenerPage {
    r: Region,
}

impl ListenerPage {
    /// Listener engine: a new page and the descriptor for smcd.
    pub fn create() -> io::Result<(ListenerPage, rustix::fd::OwnedFd)> {
        let (r, fd) = Region::create("smc-listener", LP_LEN)?;
        Ok((ListenerPage { r }, fd))
    }

    /// Reader: maps a received page.
    pub fn open(fd: impl rustix::fd::AsFd) -> io::Result<ListenerPage> {
        Ok(ListenerPage {
            r: Region::open_read_only(fd, LP_LEN)?,
        })
    }

    /// Listener: publishes its state.
    pub fn set(&self, congested: bool, in_progress: u32) {
        self.r.u32_at(LP_IN_PROGRESS).store(in_progress, Relaxed);
        self.r
            .u32_at(LP_CONGESTED)
            .store(u32::from(congested), Release);
    }

    /// Listener: processes other than its own accept from its socket (forked workers), and
    /// only the SMC option tells their connections apart: smcd must not announce clients to
    /// it any more (for good).
    pub fn set_shared(&self) {
        self.r.u32_at(LP_SHARED).store(1, Release);
    }

    /// Whether the listener's socket is shared by processes that do not read its intents.
    pub fn shared(&self) -> bool {
        self.r.u32_at(LP_SHARED).load(Acquire) != 0
    }

    /// Whether the handshake work is congested.
    pub fn congested(&self) -> bool {
        self.r.u32_at(LP_CONGESTED).load(Acquire) != 0
    }

    /// Handshakes in progress.
    pub fn in_progress(&self) -> u32 {
        self.r.u32_at(LP_IN_PROGRESS).load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Racing writers take turns: no update is lost, the word ends even, and a reader never
    /// sees the two values apart.
    #[test]
    fn seq_write_with_racing_writers() {
        use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
        const THREADS: u64 = 4;
        const WRITES: u64 = 200_000;
        let start = std::sync::Barrier::new(THREADS as usize);
        let seq = AtomicU32::new(0);
        let (a, b) = (AtomicU64::new(0), AtomicU64::new(0));
        let done = AtomicBool::new(false);
        std::thread::scope(|sc| {
            let reader = sc.spawn(|| {
                let mut reads = 0u64;
                while !done.load(Relaxed) {
                    if let Some((x, y)) =
                        seq_read(&seq, 1000, || (a.load(Relaxed), b.load(Relaxed)))
                    {
                        assert_eq!(x, y, "a torn read");
                        reads += 1;
                    }
                }
                reads
            });
            let writers: Vec<_> = (0..THREADS)
                .map(|_| {
                    sc.spawn(|| {
                        start.wait();
                        for _ in 0..WRITES {
                            // Plain load-then-store: only exclusion keeps these exact.
                            seq_write(&seq, || {
                                a.store(a.load(Relaxed) + 1, Relaxed);
                                b.store(b.load(Relaxed) + 1, Relaxed);
                            });
                        }
                    })
                })
                .collect();
            for w in writers {
                w.join().unwrap();
            }
            done.store(true, Relaxed);
            assert!(reader.join().unwrap() > 0);
        });
        assert_eq!(a.load(Relaxed), THREADS * WRITES);
        assert_eq!(b.load(Relaxed), THREADS * WRITES);
        assert_eq!(u64::from(seq.load(Relaxed)), 2 * THREADS * WRITES);
    }

    #[test]
    fn sysctl_page_round_trip() {
        let eids = EidState::default();
        let (w, fd) = SysctlPage::create(&[1, 2, 3], &eids).unwrap();
        let r = SysctlPage::open(&fd).unwrap();
        assert_eq!(r.load().unwrap(), (vec![1, 2, 3], eids));
        let eids = EidState {
            ueids: vec![[b'A'; 32], [b'B'; 32]],
            seid_enabled: true,
        };
        w.store(&[4, 5], &eids);
        assert_eq!(r.load().unwrap(), (vec![4, 5], eids));
    }

    #[test]
    fn listener_table_lookup_rules() {
        let (t, fd) = ListenerTable::create().unwrap();
        let r = ListenerTable::open(&fd).unwrap();
        let a: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        assert_eq!(r.lookup(a, 1), Lookup::None);
        let wild = TableEntry {
            id: 1,
            netns: 1,
            addr: "0.0.0.0:5000".parse().unwrap(),
            hs_limit: false,
        };
        assert!(t.insert(wild));
        assert_eq!(r.lookup(a, 1), Lookup::Found(wild));
        // Another namespace's wildcard listener is not reachable by address alone.
        assert_eq!(r.lookup(a, 2), Lookup::None);
        let exact = TableEntry {
            id: 2,
            netns: 1,
            addr: a,
            hs_limit: true,
        };
        assert!(t.insert(exact));
        assert_eq!(r.lookup(a, 1), Lookup::Found(exact));
        assert_eq!(r.lookup(a, 2), Lookup::Found(exact));
        // v4-mapped destination finds the v4 listener; v6 wildcard takes v4 too.
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:5000".parse().unwrap();
        assert_eq!(r.lookup(mapped, 1), Lookup::Found(exact));
        t.remove(2, 5000, false);
        assert_eq!(r.lookup(a, 1), Lookup::Found(wild));
        // An IPv6 wildcard beside the IPv4 one (redis: 0.0.0.0 and [::] with IPV6_V6ONLY):
        // IPv4 reaches the IPv4 wildcard whatever the order, IPv6 the IPv6 one; with the IPv4
        // wildcard gone the IPv6 one takes IPv4 too (dual stack).
        let wild6 = TableEntry {
            id: 3,
            netns: 1,
            addr: "[::]:5000".parse().unwrap(),
            hs_limit: false,
        };
        assert!(t.insert(wild6));
        assert_eq!(r.lookup(a, 1), Lookup::Found(wild));
        assert_eq!(
            r.lookup("[::1]:5000".parse().unwrap(), 1),
            Lookup::Found(wild6)
        );
        t.remove(1, 5000, false);
        assert_eq!(r.lookup(a, 1), Lookup::Found(wild6));
        assert!(t.insert(wild));
        assert_eq!(
            r.lookup(a, 1),
            Lookup::Found(wild),
            "inserted after the IPv6 one"
        );
        t.remove(3, 5000, false);
        // Fill the bucket: the fifth listener overflows and makes its port "ask smcd".
        for id in 10..13 {
            assert!(t.insert(TableEntry {
                id,
                netns: 9,
                addr: "10.0.0.1:6024".parse().unwrap(),
                hs_limit: false
            }));
        }
        assert!(!t.insert(TableEntry {
            id: 20,
            netns: 9,
            addr: "10.0.0.2:6024".parse().unwrap(),
            hs_limit: false
        }));
        assert_eq!(r.lookup("10.0.0.2:6024".parse().unwrap(), 9), Lookup::Ask);
        t.remove(20, 6024, true);
        assert_eq!(r.lookup("10.0.0.2:6024".parse().unwrap(), 9), Lookup::None);
        let v6 = TableEntry {
            id: 30,
            netns: 1,
            addr: "[::1]:7000".parse().unwrap(),
            hs_limit: false,
        };
        assert!(t.insert(v6));
        assert_eq!(
            r.lookup("[::1]:7000".parse().unwrap(), 1),
            Lookup::Found(v6)
        );
    }

    #[test]
    fn listener_page() {
        let (w, fd) = ListenerPage::create().unwrap();
        let r = ListenerPage::open(&fd).unwrap();
        assert!(!r.congested());
        w.set(true, 7);
        assert!(r.congested());
        assert_eq!(r.in_progress(), 7);
    }
}
