//! Readiness of the program's epoll sets answered from user space, while the program is busy.
//!
//! The kernel's `epoll_wait` sees an SMC connection through its readiness socket, and keeping
//! that socket exact costs system calls per message: before the program waits again, every
//! stream a read emptied is settled (its readiness drained and the wait announced, a `recv`),
//! and the peer that then writes rings the bell (a `send`), as TCP costs a read and a write.
//! So the `epoll_wait` hooks first look at the connections themselves: this module keeps, per
//! epoll set the program made, the SMC streams it registered (from the `epoll_ctl` hook), and
//! [`collect`] reports the ones that a read or a write would serve now, from the cursors in
//! shared memory (`SmcStream::quick_poll`), without entering the kernel. While that finds
//! something the program's event loop makes no system call for its SMC connections: nothing
//! is settled, so nothing is announced, so the peer rings nobody.
//!
//! # When the kernel answers instead
//!
//! The kernel's own `epoll_wait` (after the settle, as before) runs when:
//! - no registered stream is ready in user space (the program is about to sleep: only the
//!   settle's announcement makes the peers ring, and it is made only then);
//! - [`KERNEL_EVERY`] calls in a row were answered here (then the kernel is asked without
//!   waiting, and this module answers if it has nothing: see [`Answer::Probe`]): the set's
//!   other descriptors (listeners, plain TCP, pipes, timers, nested sets), one-shot streams
//!   and streams whose connect is still under way are seen at least that often, and the
//!   kernel keeps what they report (level-triggered, or an edge queued in its item), so
//!   nothing is lost, only later by at most that many turns of the loop;
//! - a registered stream has anything but bytes and room to say (end of stream, shutdown,
//!   error, the end): its readiness socket shows that, with `EPOLLRDHUP`/`EPOLLHUP` (when
//!   others are ready here, such a stream is skipped and the kernel's turn is the next
//!   call);
//! - any SMC stream of the set is registered `EPOLLEXCLUSIVE`, `EPOLLWAKEUP` or with events
//!   beyond `IN|OUT|RDHUP|ET|ONESHOT` (`EPOLLPRI`): those states live in the kernel's item,
//!   which only the kernel can keep;
//! - the set existed when the process forked (the other process may change it; a set made
//!   after the fork, as nginx's workers make theirs, is answered here again), or its
//!   descriptor was duplicated (a change through the other number would not be seen here).
//!
//! # Edge-triggered and one-shot registrations
//!
//! An `EPOLLET` stream (nginx registers its connections `IN|OUT|RDHUP|ET`) is answered here
//! with the kernel's edge semantics for a socket: reported when bytes arrived since the last
//! report (the peer's producer cursor moved) or room came after a write found none, and then
//! with what a read and a write would do; the first look after `EPOLL_CTL_ADD`/`MOD` reports
//! what is ready ([`edge`]). The kernel's item keeps its own edges (the bells rung), so an
//! arrival reported here may be reported by the kernel again later: [`filter`] takes such an
//! event out when the cursors show nothing new since (anything they do not show, an end or an
//! error, stays). A one-shot entry disables itself in the kernel when it is reported, a state
//! only the kernel keeps: such a stream is left to the kernel as a descriptor of another
//! kind is (seen at least every [`KERNEL_EVERY`] calls), without sending the whole set there.
//!
//! # Why no wake-up is lost
//!
//! Answering here never changes what the kernel would report: nothing is drained, nothing is
//! announced, nothing is taken from the peer. A stream's readiness socket stays readable while
//! bytes are in its ring (a read that empties it only notes the stream for the settle), and a
//! stream the program read from is settled before the next kernel wait exactly as before. The
//! only thing that sleeps is the kernel's `epoll_wait`, reached through the unchanged path
//! (settle: clear, announce with a `SeqCst` `fetch_or`, look at the cursors again, ring
//! ourselves if they moved; the peer publishes its cursor, then a `SeqCst` fence, then takes the
//! announcement and rings): so the argument in `docs/architecture.md` (readiness) holds
//! unchanged. What is reported here is what a read or a write would do now: a level-triggered
//! report of a socket, which the kernel could have made at the same moment. An edge reported
//! here takes no edge from the kernel's item either; the settle keeps the kernel's edges for
//! an edge-triggered waiter (`SmcStream::set_edge_readiness`: a settle that finds bytes which
//! arrived after the read rings once more, since the peer was not asked to); and the only
//! kernel events [`filter`] takes out of an edge-triggered stream's are those whose bytes and
//! room this module reported already (the cursors and the count of writes that found no room
//! unchanged since), which the program was told of.
//!
//! # Identity
//!
//! An entry is the descriptor number the program registered. Every change of what a number of
//! ours refers to (`table::insert`, `table::remove`) bumps the number's generation
//! ([`fd_changed`]); an entry whose generation moved is not answered for here (the kernel
//! has the truth: a closed descriptor's item is gone, or lives on through a duplicate). The
//! one change that keeps the generation is a connect under way becoming its stream: it is the
//! same open file (the readiness pair made for the connect is the stream's).

use crate::table::{self, CONNECTING, MAX_FD, STREAM, Stream};
use smcd_engine::driver::conn::QuickLook;
use std::cell::UnsafeCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// After this many calls in a row answered here, the next one goes to the kernel.
pub(crate) const KERNEL_EVERY: u32 = 8;

/// Events a level-triggered registration may ask for and still be answered here.
const PLAIN: u32 = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP) as u32;
/// Edge-triggered.
const ET: u32 = libc::EPOLLET as u32;
/// One-shot: left to the kernel (see the module docs).
const ONESHOT: u32 = libc::EPOLLONESHOT as u32;

/// What an edge-triggered entry was last answered with (see [`Entry::seen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    /// The peer's producer cursor: an arrival moves it.
    produced: u64,
    /// Whether a write would have taken bytes.
    writable: bool,
    /// Writes that had found the send buffer full by then.
    tx_full: u64,
}

#[derive(Debug)]
struct Entry {
    fd: i32,
    events: u32,
    data: u64,
    gen_: u32,
    /// Taken when the descriptor is a stream (at registration, or when its connect ended).
    /// Weak: a program may close a registered descriptor without deleting it from the set
    /// (nginx does), and the entry must not keep the connection alive.
    stream: Option<Weak<Stream>>,
    /// Edge-triggered entries: what the last look here saw (`None` since the registration:
    /// as the kernel's `EPOLL_CTL_ADD`/`MOD`, the first look reports what is ready).
    seen: Option<Seen>,
    /// A change of the program's is not in the kernel's item yet ([`defer`]).
    stale: bool,
    /// The program deleted it ([`defer`]): never reported; the kernel's item goes at the
    /// next [`flush`].
    deleted: bool,
    /// The events and data word of the kernel's item: a [`flush`] leaves an item alone that
    /// the program changed and changed back (redis-benchmark, waiting for replies at every
    /// sleep, has each connection registered for them then as at the sleep before).
    kernel: (u32, u64),
}

#[derive(Debug)]
struct Set {
    /// [`FORKS`] when the set was made.
    forks: u64,
    /// Its descriptor was duplicated: never answered here.
    shared: bool,
    entries: Vec<Entry>,
    /// The data words of the set's other registrations (made through the hook), by
    /// descriptor: an event is taken for an SMC stream's only when no other has its word.
    others: BTreeMap<i32, u64>,
    /// Where the next look starts (round robin, so every ready stream gets its turn when more
    /// are ready than the program takes).
    next: usize,
    /// Calls in a row answered here.
    run: u32,
    /// What the edge-triggered entries looked at in this call saw, by index: kept only when
    /// the call is answered here (a call sent to the kernel reported nothing of it).
    looks: Vec<(usize, Seen)>,
    /// Some entry is [`Entry::stale`].
    stale: bool,
}

/// The sets, behind a lock of our own (a spin lock, so that a forked child can make a fresh
/// one: see `fork_child`).
struct Sets {
    locked: AtomicBool,
    map: UnsafeCell<BTreeMap<i32, Set>>,
}

// SAFETY: `map` is only reached through `Guard`, which holds `locked`.
unsafe impl Sync for Sets {}

static SETS: Sets = Sets {
    locked: AtomicBool::new(false),
    map: UnsafeCell::new(BTreeMap::new()),
};
/// How many sets exist (a program without epoll pays one load per hooked call).
static N_SETS: AtomicUsize = AtomicUsize::new(0);
/// How many entries exist in all sets (`epoll_wait` looks only when there is one).
static N_ENTRIES: AtomicUsize = AtomicUsize::new(0);
/// Forks this process made or came from (both sides count).
static FORKS: AtomicU64 = AtomicU64::new(0);
/// Each descriptor number's generation (see the module docs).
static GEN: [AtomicU32; MAX_FD] = [const { AtomicU32::new(0) }; MAX_FD];

struct Guard;

impl Guard {
    fn lock() -> Guard {
        let mut spins = 0u32;
        while SETS
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Guard
    }

    fn map(&mut self) -> &mut BTreeMap<i32, Set> {
        // SAFETY: we hold the lock; the borrow ends with the guard's.
        unsafe { &mut *SETS.map.get() }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        SETS.locked.store(false, Ordering::Release);
    }
}

extern "C" fn fork_prepare() {
    // The child shares the kernel's sets: it should find the program's registrations there.
    // Only if the lock is free now: the table's handler may hold its lock already (it takes
    // it for the fork), and a thread in `collect` holds ours and waits for that one. When it
    // is not, the parent makes them before its next wait in the kernel (a set from before a
    // fork is the kernel's to answer in the child).
    if STALE.load(Ordering::SeqCst)
        && SETS
            .locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    {
        let saved = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let mut g = Guard;
        STALE.store(false, Ordering::Relaxed);
        for (ep, set) in g.map().iter_mut() {
            apply(*ep, set);
        }
        drop(g);
        crate::hooks::set_errno(saved);
    }
}

extern "C" fn fork_parent() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

extern "C" fn fork_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
    // The only thread now. A thread of the parent may have held the lock in the middle of a
    // change: the sets from before the fork are of no use here anyway (see `collect`), so the
    // map is replaced without looking at it (the old one is leaked) and the lock is free.
    // SAFETY: no other thread exists to hold a reference into the map.
    unsafe { std::ptr::write(SETS.map.get(), BTreeMap::new()) };
    N_SETS.store(0, Ordering::Relaxed);
    N_ENTRIES.store(0, Ordering::Relaxed);
    // The parent's waiters are not here; what it kept from the kernel it makes there itself.
    KERNEL_WAITERS.store(0, Ordering::SeqCst);
    STALE.store(false, Ordering::SeqCst);
    SETS.locked.store(false, Ordering::Release);
}

fn watch_forks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: plain functions that live as long as the library. No lock is held across
        // the fork (the table's handlers hold its own, which `collect` takes under ours).
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    });
}

/// `SMC_EPOLL_FAST=0` in the environment when the library is loaded: no set is followed,
/// every `epoll_wait` goes to the kernel as before (for comparisons, and a way out).
static OFF: AtomicBool = AtomicBool::new(false);

/// Reads the environment (the library's constructor).
pub(crate) fn init() {
    OFF.store(
        std::env::var_os("SMC_EPOLL_FAST").is_some_and(|v| v == "0"),
        Ordering::Relaxed,
    );
}

/// What `fd` refers to changed (called by the table).
#[inline]
pub(crate) fn fd_changed(fd: i32) {
    if let Some(g) = usize::try_from(fd).ok().and_then(|i| GEN.get(i)) {
        g.fetch_add(1, Ordering::Release);
    }
}

fn gen_of(fd: i32) -> u32 {
    usize::try_from(fd)
        .ok()
        .and_then(|i| GEN.get(i))
        .map_or(u32::MAX, |g| g.load(Ordering::Acquire))
}

/// Whether the program made an epoll set (one relaxed load).
#[inline]
pub(crate) fn any_sets() -> bool {
    N_SETS.load(Ordering::Relaxed) != 0
}

/// The program made the epoll set `ep` (`epoll_create*`): a set at that number before is
/// gone.
pub(crate) fn created(ep: i32) {
    if OFF.load(Ordering::Relaxed) {
        return;
    }
    watch_forks();
    let mut g = Guard::lock();
    let old = g.map().insert(
        ep,
        Set {
            forks: FORKS.load(Ordering::Relaxed),
            shared: false,
            entries: Vec::new(),
            others: BTreeMap::new(),
            next: 0,
            run: 0,
            looks: Vec::new(),
            stale: false,
        },
    );
    match old {
        Some(s) => {
            N_ENTRIES.fetch_sub(s.entries.len(), Ordering::Relaxed);
        }
        None => {
            N_SETS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Whether `fd` is one of the program's sets (a look under the lock, no system call).
pub(crate) fn is_set(fd: i32) -> bool {
    if !any_sets() {
        return false;
    }
    let mut g = Guard::lock();
    g.map().contains_key(&fd)
}

/// `fd` was closed: if it was a set, the set is forgotten (the number may be reused).
pub(crate) fn closed(fd: i32) {
    if !any_sets() {
        return;
    }
    let mut g = Guard::lock();
    if let Some(mut s) = g.map().remove(&fd) {
        // A duplicate may keep the kernel's set: it has the program's registrations.
        apply(fd, &mut s);
        N_SETS.fetch_sub(1, Ordering::Relaxed);
        N_ENTRIES.fetch_sub(s.entries.len(), Ordering::Relaxed);
    }
}

/// `close_range(first, last)` closed these.
pub(crate) fn closed_range(first: u32, last: u32) {
    if !any_sets() {
        return;
    }
    let mut g = Guard::lock();
    let gone: Vec<i32> = g
        .map()
        .range(i32::try_from(first).unwrap_or(i32::MAX)..)
        .map(|(k, _)| *k)
        .take_while(|k| u32::try_from(*k).is_ok_and(|k| k <= last))
        .collect();
    for k in gone {
        // (Closed already: nothing is left to apply.)
        if let Some(s) = g.map().remove(&k) {
            N_SETS.fetch_sub(1, Ordering::Relaxed);
            N_ENTRIES.fetch_sub(s.entries.len(), Ordering::Relaxed);
        }
    }
}

/// `new` became a copy of `old` (`dup*`, `F_DUPFD*`): a set at `new` is gone, and a set at
/// `old` can now be changed through another number, which is not followed: it is not
/// answered for here again.
pub(crate) fn copied(old: i32, new: i32) {
    if !any_sets() {
        return;
    }
    closed(new);
    let mut g = Guard::lock();
    if let Some(s) = g.map().get_mut(&old) {
        // Changed through the other number from now on, which must find what we deferred.
        apply(old, s);
        s.shared = true;
    }
}

/// After a successful `epoll_ctl(ep, op, fd, ev)` of the program.
///
/// # Safety
/// `ev` is null or the program's event, valid for reading (it was for the kernel).
pub(crate) unsafe fn ctl(ep: i32, op: i32, fd: i32, ev: *const libc::epoll_event) {
    if !any_sets() {
        return;
    }
    let k = table::kind(fd);
    let smc = k == STREAM || k == CONNECTING;
    if !smc {
        // A descriptor of another kind matters here only beside SMC streams of its set (its
        // data word): while no set has any, it is not followed (the bookkeeping was 5 % of a
        // preloaded redis-benchmark's time against a plain server: it changes its
        // registrations around every batch), and the set's first SMC stream reads the
        // others from the kernel (`others_from_kernel`). Noted before the look at the count,
        // which the first stream raises before it looks at the note.
        if !OTHERS_SKIPPED.load(Ordering::Relaxed) {
            OTHERS_SKIPPED.store(true, Ordering::SeqCst);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        if N_ENTRIES.load(Ordering::SeqCst) == 0 {
            return;
        }
    }
    let stream = if k == STREAM {
        table::stream(fd).map(|s| Arc::downgrade(&s))
    } else {
        None
    };
    let gen_ = gen_of(fd);
    let mut g = Guard::lock();
    let Some(set) = g.map().get_mut(&ep) else {
        return;
    };
    let before = set.entries.len();
    set.entries.retain(|e| e.fd != fd);
    set.others.remove(&fd);
    if op != libc::EPOLL_CTL_DEL && !ev.is_null() {
        // SAFETY: the caller's promise; the struct is packed on some targets.
        let ev = unsafe { std::ptr::read_unaligned(ev) };
        if smc {
            if set.entries.is_empty() {
                // The set's first SMC stream: raised first (see above), then the others read
                // from the kernel if any registration went unfollowed.
                N_ENTRIES.fetch_add(1, Ordering::SeqCst);
                if OTHERS_SKIPPED.load(Ordering::SeqCst) {
                    set.others = others_from_kernel(ep, fd);
                }
                N_ENTRIES.fetch_sub(1, Ordering::SeqCst);
            }
            set.entries.push(Entry {
                fd,
                events: ev.events,
                data: ev.u64,
                gen_,
                stream,
                seen: None,
                stale: false,
                deleted: false,
                kernel: (ev.events, ev.u64),
            });
        } else {
            set.others.insert(fd, ev.u64);
        }
    }
    let after = set.entries.len();
    if after > before {
        N_ENTRIES.fetch_add(after - before, Ordering::Relaxed);
    } else {
        N_ENTRIES.fetch_sub(before - after, Ordering::Relaxed);
    }
}

/// Some `epoll_ctl` of a descriptor that is not an SMC stream was not followed (see [`ctl`]).
static OTHERS_SKIPPED: AtomicBool = AtomicBool::new(false);

/// The set `ep`'s registrations in the kernel but `but`'s, by descriptor, with their data
/// words (`/proc/self/fdinfo/EP`: a line `tfd: N events: E data: D ...` per item).
fn others_from_kernel(ep: i32, but: i32) -> BTreeMap<i32, u64> {
    let mut out = BTreeMap::new();
    let Ok(text) = std::fs::read_to_string(format!("/proc/self/fdinfo/{ep}")) else {
        return out;
    };
    for line in text.lines() {
        let mut it = line.split_whitespace();
        if it.next() != Some("tfd:") {
            continue;
        }
        let Some(fd) = it.next().and_then(|v| v.parse::<i32>().ok()) else {
            continue;
        };
        let mut data = None;
        while let Some(w) = it.next() {
            if w == "data:" {
                data = it.next().and_then(|v| u64::from_str_radix(v, 16).ok());
                break;
            }
        }
        if let Some(d) = data
            && fd != but
        {
            out.insert(fd, d);
        }
    }
    out
}

/// Threads of the program in a wait of the kernel's on descriptors (`epoll_wait`, `poll`,
/// `select`), entered through the hooks ([`wait_begin`]).
static KERNEL_WAITERS: AtomicUsize = AtomicUsize::new(0);
/// Some set has a [`Entry::stale`] entry.
static STALE: AtomicBool = AtomicBool::new(false);

/// The program's `epoll_ctl(ep, op, fd, ev)`, kept here without the kernel when that
/// changes nothing anybody can see: `true` when it was (the call returns 0).
///
/// Event loops of the `ae` kind (redis, redis-benchmark, wrk) register `EPOLLOUT` before
/// every write and take it out after, redis-benchmark even deletes and adds the descriptor
/// each time: two to four calls per request, most of what such a client asks the kernel for
/// under SMC. A stream's entry is what this module reports from (at once: the entry changes
/// here), and the kernel's item matters only to a wait of the kernel's. So the change is
/// kept in the entry and made in the kernel ([`flush`]) before any thread waits there
/// ([`wait_begin`]), before any other `epoll_ctl`, a `close`, a fork (the child shares the
/// set), an exec, and when the set's number is closed or duplicated.
///
/// Kept: `MOD` and `DEL` of a stream registered through the hooks in a set followed here,
/// level- or edge-triggered without one-shot, and the `ADD` that brings a deleted one back
/// (in the kernel a `MOD`): then the kernel's call cannot fail, and what it would report is
/// what this module does. Only while no thread waits in the kernel: a waiter sleeping there
/// would not be woken by a change it cannot see. The test of that and a waiter's
/// announcement ([`wait_begin`]) are a load and a store each way, `SeqCst`, so one of them
/// sees the other.
///
/// # Safety
/// `ev` is null or valid for reading.
pub(crate) unsafe fn defer(ep: i32, op: i32, fd: i32, ev: *const libc::epoll_event) -> bool {
    if !any_sets() || OFF.load(Ordering::Relaxed) || table::kind(fd) != STREAM {
        return false;
    }
    let ev = if op == libc::EPOLL_CTL_DEL {
        None
    } else if ev.is_null() {
        return false;
    } else {
        // SAFETY: the caller's promise; the struct is packed on some targets.
        let ev = unsafe { std::ptr::read_unaligned(ev) };
        if ev.events & !(PLAIN | ET) != 0 {
            return false;
        }
        Some(ev)
    };
    let gen_ = gen_of(fd);
    let mut g = Guard::lock();
    let Some(set) = g.map().get_mut(&ep) else {
        return false;
    };
    if set.shared || set.forks != FORKS.load(Ordering::Relaxed) {
        return false;
    }
    // Pairs with `wait_begin` (see above).
    if KERNEL_WAITERS.load(Ordering::SeqCst) != 0 {
        return false;
    }
    // The data word the kernel's item would carry after the change, and the one it carries
    // now, name this entry alone (`filter` tells the kernel's reports of a kept item by it).
    let Some(old) = set.entries.iter().find(|e| e.fd == fd).map(|e| e.data) else {
        return false;
    };
    let new = ev.map_or(old, |ev| ev.u64);
    if set
        .entries
        .iter()
        .any(|e| e.fd != fd && (e.data == old || e.data == new))
        || set.others.values().any(|d| *d == old || *d == new)
    {
        return false;
    }
    let Some(e) = set.entries.iter_mut().find(|e| e.fd == fd) else {
        return false;
    };
    if e.gen_ != gen_ || e.events & !(PLAIN | ET) != 0 {
        return false;
    }
    match (op, ev) {
        (libc::EPOLL_CTL_MOD, Some(ev)) if !e.deleted => {
            e.events = ev.events;
            e.data = ev.u64;
        }
        (libc::EPOLL_CTL_ADD, Some(ev)) if e.deleted => {
            e.events = ev.events;
            e.data = ev.u64;
            e.deleted = false;
        }
        (libc::EPOLL_CTL_DEL, None) if !e.deleted => e.deleted = true,
        _ => return false,
    }
    // As the kernel's `ADD`/`MOD`: the first look reports what is ready.
    e.seen = None;
    e.stale = true;
    set.stale = true;
    STALE.store(true, Ordering::SeqCst);
    true
}

/// Makes the kernel's items of `set` (the set `ep`) what [`defer`] kept.
fn apply(ep: i32, set: &mut Set) {
    if !set.stale {
        return;
    }
    set.stale = false;
    let before = set.entries.len();
    set.entries.retain_mut(|e| {
        if !e.stale {
            return true;
        }
        e.stale = false;
        if gen_of(e.fd) != e.gen_ {
            // Closed since: the kernel dropped the item with it.
            return !e.deleted;
        }
        let op = if e.deleted {
            libc::EPOLL_CTL_DEL
        } else if e.kernel != (e.events, e.data) {
            e.kernel = (e.events, e.data);
            libc::EPOLL_CTL_MOD
        } else {
            return true;
        };
        let mut ev = libc::epoll_event {
            events: e.events,
            u64: e.data,
        };
        // SAFETY: a plain call; an error (the set or descriptor gone) leaves nothing to do.
        unsafe { crate::real::epoll_ctl(ep, op, e.fd, &mut ev) };
        !e.deleted
    });
    N_ENTRIES.fetch_sub(before - set.entries.len(), Ordering::Relaxed);
}

/// Makes every change [`defer`] kept in the kernel; errno is kept.
pub(crate) fn flush() {
    // Pairs with the store in `defer_mod` (see there).
    if !STALE.load(Ordering::SeqCst) {
        return;
    }
    let saved = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    let mut g = Guard::lock();
    STALE.store(false, Ordering::Relaxed);
    for (ep, set) in g.map().iter_mut() {
        apply(*ep, set);
    }
    drop(g);
    crate::hooks::set_errno(saved);
}

/// A thread is about to wait in the kernel on descriptors: from now on no change is kept
/// from the kernel, and what was kept is made there first.
pub(crate) fn wait_begin() -> bool {
    let sole = KERNEL_WAITERS.fetch_add(1, Ordering::SeqCst) == 0;
    flush();
    sole
}

/// How many threads of the process are in a kernel wait on descriptors; sequentially
/// consistent.
pub(crate) fn kernel_waiter_count() -> usize {
    KERNEL_WAITERS.load(Ordering::SeqCst)
}

/// The wait of [`wait_begin`] returned.
pub(crate) fn wait_end() {
    KERNEL_WAITERS.fetch_sub(1, Ordering::Release);
}

/// What [`collect`] says of an `epoll_wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// This many events were written (answered here).
    Here(usize),
    /// The kernel answers, with the program's timeout (nothing is ready here, or the set is
    /// not answered here).
    Kernel,
    /// Ready here, but it is the kernel's turn ([`KERNEL_EVERY`], or a stream with more to
    /// say than bytes and room): this many events were written, nothing of them is kept
    /// (the looks of edge-triggered entries), and the kernel is asked without waiting
    /// first. If it has nothing, the caller asks here again (the kernel's call may have
    /// written events the filter then took out). Never a sleep in the kernel while something
    /// is ready here: an edge-triggered stream's arrival may be known only here (the peer
    /// rang nobody for it), and a signal handled during a call that does not sleep would not
    /// end the sleep after it (nginx's `SIGTERM` while it is busy).
    Probe(usize),
}

/// `epoll_wait` on `ep` answered from user space (the module docs say when it is not).
///
/// # Safety
/// `out` is valid for writing `max` events (the program's buffer for the kernel).
pub(crate) unsafe fn collect(ep: i32, out: *mut libc::epoll_event, max: usize) -> Answer {
    if N_ENTRIES.load(Ordering::Relaxed) == 0 || max == 0 {
        return Answer::Kernel;
    }
    let mut g = Guard::lock();
    let Some(set) = g.map().get_mut(&ep) else {
        return Answer::Kernel;
    };
    if set.shared || set.forks != FORKS.load(Ordering::Relaxed) || set.entries.is_empty() {
        return Answer::Kernel;
    }
    let due = set.run >= KERNEL_EVERY;
    let n = set.entries.len();
    let start = set.next % n;
    let mut got = 0;
    let mut looked = 0;
    let mut other = false;
    set.looks.clear();
    while looked < n && got < max {
        let i = (start + looked) % n;
        let e = &mut set.entries[i];
        looked += 1;
        if e.events & !(PLAIN | ET | ONESHOT) != 0 {
            set.run = 0;
            return Answer::Kernel;
        }
        if e.events & ONESHOT != 0 || e.deleted {
            // The kernel's item disables itself when it reports: only the kernel can keep
            // that state, so such an entry is the kernel's to report, as a descriptor that is
            // not ours. (A deleted one is reported by nobody.)
            continue;
        }
        if table::kind(e.fd) != STREAM || gen_of(e.fd) != e.gen_ {
            // A connect under way (the kernel reports its end), or no longer what was
            // registered (the kernel knows what became of the item).
            continue;
        }
        if e.stream.is_none() {
            // The connect ended in a stream: the same open file.
            e.stream = table::stream(e.fd).map(|s| Arc::downgrade(&s));
        }
        let Some(st) = e.stream.as_ref().and_then(Weak::upgrade) else {
            continue;
        };
        let Some(look) = st.s.quick_look() else {
            // More to say than bytes and room: the readiness socket says it. The kernel is
            // asked at the next call at the latest (at once when nothing is ready here).
            other = true;
            continue;
        };
        let mut ev = 0;
        if look.readable {
            ev |= e.events & libc::EPOLLIN as u32;
        }
        if look.writable {
            ev |= e.events & libc::EPOLLOUT as u32;
        }
        if e.events & ET != 0 {
            let mut seen = e.seen;
            if !edge(&mut seen, &look) {
                ev = 0;
            }
            if let Some(now) = seen {
                set.looks.push((i, now));
            }
        }
        if ev != 0 {
            // SAFETY: got < max, the caller's buffer.
            unsafe {
                out.add(got).write_unaligned(libc::epoll_event {
                    events: ev,
                    u64: e.data,
                })
            };
            got += 1;
        }
    }
    set.next = start + looked;
    if got == 0 {
        set.run = 0;
        return Answer::Kernel;
    }
    if due {
        set.run = 0;
        return Answer::Probe(got);
    }
    for &(i, now) in &set.looks {
        set.entries[i].seen = Some(now);
    }
    set.run = if other { KERNEL_EVERY } else { set.run + 1 };
    Answer::Here(got)
}

/// Whether an edge-triggered entry that last saw `seen` has an edge in `look`; `seen`
/// becomes `look`.
///
/// The kernel's `EPOLLET` reports a socket when it is woken (bytes arrived, room was made for
/// a writer that found none) and then what its `poll` says: so an arrival (the peer's
/// producer cursor moved) reports whatever is ready (`EPOLLOUT` too when there is room), and
/// room after a write found none (or after a look saw none) reports again; nothing else does,
/// however long the stream stays ready. The first look after the registration reports what
/// is ready, as `EPOLL_CTL_ADD`/`MOD` do.
fn edge(seen: &mut Option<Seen>, look: &QuickLook) -> bool {
    let new = match *seen {
        None => true,
        Some(s) => {
            s.produced != look.produced
                || (look.writable && (!s.writable || s.tx_full != look.tx_full))
        }
    };
    *seen = Some(Seen {
        produced: look.produced,
        writable: look.writable,
        tx_full: look.tx_full,
    });
    new
}

/// After a kernel wait on `ep` that woke the program: the SMC streams registered there that
/// [`collect`] answers for and [`filter`] keeps exact (level- or edge-triggered, not one-shot,
/// their data word their own), in a set answered here; their announcements may be taken back
/// (`table::withdraw`).
pub(crate) fn withdrawable(ep: i32) -> Vec<Arc<Stream>> {
    let mut out = Vec::new();
    if N_ENTRIES.load(Ordering::Relaxed) == 0 {
        return out;
    }
    let mut g = Guard::lock();
    let Some(set) = g.map().get_mut(&ep) else {
        return out;
    };
    if !followed(set) {
        return out;
    }
    let words = word_counts(set);
    out.extend(
        set.entries
            .iter()
            .filter(|e| exact(e, &words))
            .filter_map(|e| e.stream.as_ref().and_then(Weak::upgrade)),
    );
    out
}

/// Whether the set is answered here at all: not duplicated, and made in this process since
/// its last fork (see the module docs).
fn followed(set: &Set) -> bool {
    !set.shared && set.forks == FORKS.load(Ordering::Relaxed)
}

/// Whether `e` is a registration [`filter`] keeps exact and [`collect`] answers for: a
/// level- or edge-triggered one (not one-shot) of a stream that is still what was registered,
/// whose data word is its alone (`words`: [`word_counts`]).
fn exact(e: &Entry, words: &BTreeMap<u64, u32>) -> bool {
    !e.deleted
        && matches!(e.events & !PLAIN, 0 | ET)
        && table::kind(e.fd) == STREAM
        && gen_of(e.fd) == e.gen_
        && words.get(&e.data) == Some(&1)
}

/// How many of the set's registrations carry each data word (a stream's events are taken
/// for it only when its word is its own).
fn word_counts(set: &Set) -> BTreeMap<u64, u32> {
    let mut words = BTreeMap::new();
    for e in set.entries.iter().filter(|e| !e.deleted) {
        *words.entry(e.data).or_insert(0) += 1;
    }
    // Descriptors of other kinds (an entry and an other never share a descriptor).
    for d in set.others.values() {
        *words.entry(*d).or_insert(0) += 1;
    }
    words
}

/// Before the kernel is asked about `ep` without waiting ([`Answer::Probe`]): whether the
/// streams reads left readable must be settled first. Not when every such stream that `ep`
/// holds is registered there as [`filter`] keeps exact (level- or edge-triggered, not
/// one-shot, its data word its alone): the kernel may then report it readable over an empty
/// ring, and the filter takes that out. A settle is a `recv` and an announcement per stream,
/// and the announcement has the peer ring (a `send`) at its next write; before a call that
/// does not sleep it is of no use, since only a sleeper needs the peers to ring. With it,
/// redis-benchmark's probes (one call in [`KERNEL_EVERY`]) announced its 50 connections, and
/// redis-server rang a bell for nearly every reply it wrote: a quarter of its time. Nothing is
/// lost by leaving them: a stream is announced or has a bell's byte queued (only a ring takes
/// the announcement, only a settle drains the byte, and it announces again), so a thread
/// asleep in the kernel meanwhile is woken as before, and the next wait that sleeps settles
/// every listed stream first.
pub(crate) fn probe_needs_settle(ep: i32) -> bool {
    if !table::any_dirty() {
        return false;
    }
    let mut g = Guard::lock();
    let Some(set) = g.map().get_mut(&ep) else {
        return true;
    };
    if !followed(set) {
        return true;
    }
    let mut words = None;
    for e in set.entries.iter().filter(|e| !e.deleted) {
        let st = match &e.stream {
            Some(w) => w.upgrade(),
            None => table::stream(e.fd),
        };
        if st.is_some_and(|st| st.is_listed())
            && !exact(e, words.get_or_insert_with(|| word_counts(set)))
        {
            return true;
        }
    }
    false
}

/// After the kernel's `epoll_wait` on `ep` wrote `n` events to `out`: takes out the
/// readability it reported for an SMC stream that a read would not serve, edges of an
/// edge-triggered one reported here already, and what an item whose change was kept from the
/// kernel ([`defer`]) no longer asks for; returns how many events are left (moved to the
/// front), and when none is, how many edge-triggered ones it took out as reported already
/// (written back to the front: the caller gives them to the program rather than sleep on).
///
/// That happens when the peer's bell lands late: the peer publishes its cursor, takes the
/// announcement and rings; the program, answered in user space, read the bytes and settled the
/// stream (drained, announced again) before the ring's byte arrived, which then leaves the
/// descriptor readable over an empty ring. The kernel cannot tell; a TCP socket would not be
/// readable, and some programs count a read that says `EAGAIN` as an error (wrk). Such a
/// stream is settled again here (the byte drained, the wait announced, the ring looked at once
/// more), or after a call that did not sleep (`probe`, see [`probe_needs_settle`]) listed to
/// be settled before the next that does. Only level-triggered entries whose data word no other
/// registration of the set shares are looked at (for an edge-triggered or one-shot one the
/// kernel's item has moved on, and an event must not be lost).
///
/// # Safety
/// `out` holds `n` events.
pub(crate) unsafe fn filter(
    ep: i32,
    out: *mut libc::epoll_event,
    n: usize,
    probe: bool,
) -> (usize, usize) {
    if N_ENTRIES.load(Ordering::Relaxed) == 0 {
        return (n, 0);
    }
    let mut stale: Vec<Arc<Stream>> = Vec::new();
    let mut kept = 0;
    // Edge-triggered events taken out as reported already: given back when nothing else is
    // left (see below).
    let mut again: Vec<libc::epoll_event> = Vec::new();
    {
        let mut g = Guard::lock();
        let Some(set) = g.map().get_mut(&ep) else {
            return (n, 0);
        };
        if set.shared || set.forks != FORKS.load(Ordering::Relaxed) {
            return (n, 0);
        }
        for i in 0..n {
            // SAFETY: i < n, written by the kernel.
            let mut ev = unsafe { out.add(i).read_unaligned() };
            if set.stale
                && let Some(e) = set.entries.iter().find(|e| e.data == ev.u64 && e.stale)
            {
                // An item whose change was kept from the kernel (asked without waiting, see
                // `Answer::Probe`): what the program registered says what is reported
                // (its data word is its alone: see `defer`).
                if e.deleted {
                    ev.events = 0;
                } else {
                    ev.events &= e.events | (libc::EPOLLERR | libc::EPOLLHUP) as u32;
                }
            }
            match sole_stream(set, ev.u64) {
                Some((st, None))
                    if ev.events & libc::EPOLLIN as u32 != 0
                        && matches!(st.s.quick_poll(), Some((false, _))) =>
                {
                    ev.events &= !(libc::EPOLLIN as u32);
                    stale.push(st);
                }
                Some((st, Some(seen))) => {
                    // Edge-triggered: an edge this module reported already (a bell rung for
                    // bytes or room it saw) is not reported twice; anything the cursors do
                    // not show (end of stream, errors) is the kernel's to say.
                    if ev.events & !((libc::EPOLLIN | libc::EPOLLOUT) as u32) == 0
                        && let Some(look) = st.s.quick_look()
                        && !edge(seen, &look)
                    {
                        again.push(ev);
                        ev.events = 0;
                    }
                }
                _ => {}
            }
            if ev.events != 0 {
                // SAFETY: kept <= i < n.
                unsafe { out.add(kept).write_unaligned(ev) };
                kept += 1;
            }
        }
    }
    for st in stale {
        if probe {
            table::dirty(&st);
        } else {
            st.s.settle_readiness_now();
        }
    }
    if kept == 0 && !again.is_empty() {
        // Nothing else: the edges are written back, for the caller to give the program once
        // more rather than wait on (an edge-triggered program reads until EAGAIN and takes a
        // spare event). A wait that went on would sleep through a signal the program's
        // handler took when this wait returned (nginx's SIGTERM, with `master_process off`).
        for (i, ev) in again.iter().take(n).enumerate() {
            // SAFETY: i < again.len() <= n.
            unsafe { out.add(i).write_unaligned(*ev) };
        }
        return (0, again.len().min(n));
    }
    (kept, 0)
}

/// The stream of the set's only registration with the data word `data`, if that is an SMC
/// stream that is still what was registered, level-triggered (then `None` with it) or
/// edge-triggered and not one-shot (then its [`Entry::seen`]).
fn sole_stream(set: &mut Set, data: u64) -> Option<(Arc<Stream>, Option<&mut Option<Seen>>)> {
    if set.others.values().any(|d| *d == data) {
        return None;
    }
    let mut found = set
        .entries
        .iter_mut()
        .filter(|e| e.data == data && !e.deleted);
    let e = found.next()?;
    if found.next().is_some() {
        return None;
    }
    let et = match e.events & !PLAIN {
        0 => false,
        ET => true,
        _ => return None,
    };
    if table::kind(e.fd) != STREAM || gen_of(e.fd) != e.gen_ {
        return None;
    }
    let st = match &e.stream {
        Some(s) => s.upgrade(),
        None => table::stream(e.fd),
    }?;
    Some((st, et.then_some(&mut e.seen)))
}

/// Whether a registration of `fd` with `ev` in `ep` is one [`filter`] keeps exact: a
/// level-triggered one (not one-shot) in a set followed here, with a data word no other
/// registration of the set has (so the settle before it can wait for the program's next
/// wait).
///
/// # Safety
/// `ev` is null or valid for reading.
pub(crate) unsafe fn filtered(ep: i32, fd: i32, ev: *const libc::epoll_event) -> bool {
    if ev.is_null() || !any_sets() {
        return false;
    }
    // SAFETY: the caller's promise.
    let ev = unsafe { std::ptr::read_unaligned(ev) };
    if ev.events & !PLAIN != 0 {
        return false;
    }
    let data = ev.u64;
    let mut g = Guard::lock();
    g.map().get(&ep).is_some_and(|s| {
        !s.shared
            && s.forks == FORKS.load(Ordering::Relaxed)
            && !s.entries.iter().any(|e| e.fd != fd && e.data == data)
            && !s.others.iter().any(|(f, d)| *f != fd && *d == data)
    })
}
