//! Which descriptors of the program are ours, and what they are.
//!
//! Every hook first looks at [`kind`]: one relaxed atomic load from an array indexed by the
//! descriptor. A descriptor that is not ours (files, pipes, UDP, plain TCP, fallback
//! connections) goes straight to the C library with no lock and no allocation, which is also
//! what makes `write`/`close` from a signal handler safe for those. Only ours take the map's
//! lock, briefly: the object is cloned out and the call runs without it.

use smcd_engine::{SmcListener, SmcStream};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// Descriptors at or above this are never taken over (they stay plain TCP).
pub(crate) const MAX_FD: usize = 1 << 20;

/// Not ours.
pub(crate) const NONE: u8 = 0;
/// An AF_INET/AF_INET6 stream socket created by the program, not yet connected or listening:
/// `connect` or `listen` may make it SMC.
pub(crate) const CANDIDATE: u8 = 1;
/// An SMC connection: the descriptor is the connection's readiness socket.
pub(crate) const STREAM: u8 = 2;
/// An SMC listener: the descriptor is the listener's readiness (an epoll instance).
pub(crate) const LISTENER: u8 = 3;
/// A non-blocking connect under way (`crate::pending`): the descriptor is a waiting readiness
/// pair until it finishes.
pub(crate) const CONNECTING: u8 = 4;
/// A listening TCP socket this image has not made an SMC listener of: inherited across
/// `exec` (found when the library is loaded), or put back by an `exec` that failed. It is
/// the program's socket, untouched, until its first `accept`, `epoll_ctl` or `listen` makes
/// it one (`hooks::adopt_listener`).
pub(crate) const INHERITED: u8 = 5;

static KINDS: [AtomicU8; MAX_FD] = [const { AtomicU8::new(NONE) }; MAX_FD];

/// An SMC connection as the program's descriptors see it; `dup` shares it, like an open file
/// description (so `O_NONBLOCK` is shared as well).
#[derive(Debug)]
pub(crate) struct Stream {
    pub(crate) s: SmcStream,
    pub(crate) nonblocking: AtomicBool,
    pub(crate) hold: Hold,
    /// In [`DIRTY`] (its readiness waits to be settled).
    listed: AtomicBool,
    /// The `AF_UNIX` socket pair `posix_spawn` put at the connection's numbers for the new
    /// program (`crate::exec::spawn_before`): the near end, which programs it started hold,
    /// and the far end, which a keeper serves once the last process holding the connection
    /// let go of it (`crate::exec::keep_spawned`). -1 until then; plain integers, so a
    /// forked copy is never locked.
    pub(crate) spawn_near: AtomicI32,
    pub(crate) spawn_far: AtomicI32,
}

impl Stream {
    /// In the list of streams to settle ([`dirty`]).
    pub(crate) fn is_listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    pub(crate) fn new(s: SmcStream, nonblocking: bool) -> Arc<Self> {
        Arc::new(Self {
            s,
            nonblocking: nonblocking.into(),
            hold: Hold::new(),
            listed: AtomicBool::new(false),
            spawn_near: AtomicI32::new(-1),
            spawn_far: AtomicI32::new(-1),
        })
    }
}

/// Streams whose readiness a read left readable (`SmcStream::set_deferred_readiness`), to be
/// settled before the program next waits on descriptors; [`DIRTY_N`] says whether any is.
static DIRTY: std::sync::Mutex<Vec<Arc<Stream>>> = std::sync::Mutex::new(Vec::new());
static DIRTY_N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Notes that `st`'s readiness waits to be settled (once until it is).
pub(crate) fn dirty(st: &Arc<Stream>) {
    // A load first: a program that only reads (blocking) finds it listed every time.
    if st.listed.load(Ordering::Relaxed) || st.listed.swap(true, Ordering::AcqRel) {
        return;
    }
    DIRTY
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Arc::clone(st));
    DIRTY_N.fetch_add(1, Ordering::Release);
}

/// Takes `st` off the list of streams to settle: its last descriptor is gone, and the list's
/// reference would keep the connection from ending until the program next waits on
/// descriptors, which a program that closes and exits never does (its peer then saw the TCP
/// connection end under an SMC connection never closed, and read `ECONNRESET` instead of the
/// end of the stream).
fn unlist(st: &Arc<Stream>) {
    if !st.listed.load(Ordering::Acquire) {
        return;
    }
    let mut list = DIRTY.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = list.iter().position(|x| Arc::ptr_eq(x, st)) {
        list.swap_remove(i);
        st.listed.store(false, Ordering::Release);
        DIRTY_N.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether some stream's readiness waits to be settled (or is being settled).
#[inline]
pub(crate) fn any_dirty() -> bool {
    DIRTY_N.load(Ordering::Acquire) != 0
}

/// Settles every listed stream's readiness. The list's lock is held until every one is
/// settled, and the count drops only then: another thread about to wait must not go into
/// its `epoll_wait` while a stream it may be told about still shows the readability a read
/// left (wrk counts a readable descriptor whose read says `EAGAIN` as an error).
pub(crate) fn settle_dirty() {
    let mut list = DIRTY.lock().unwrap_or_else(|e| e.into_inner());
    for st in list.iter() {
        st.listed.store(false, Ordering::Release);
        st.s.settle_readiness();
    }
    DIRTY_N.fetch_sub(list.len(), Ordering::AcqRel);
    list.clear();
}

/// The program's event loop woke from a kernel wait on a set and is busy: the streams it
/// registered there that its `epoll_wait` answers from shared memory take back the
/// announcements their settle made (`SmcStream::withdraw_readiness`), so their peers' writes
/// ring nobody while the loop finds the bytes itself. Only while no thread of the process
/// waits in the kernel (a withdrawn stream's descriptor is not readable and not announced),
/// and each stream is listed to be settled first: the listing, then the look at the waiters,
/// against `crate::ep::wait_begin`'s count, then [`any_dirty`] (both sequentially
/// consistent), so a thread that starts to wait meanwhile settles the list, under its lock,
/// which is held here until every withdrawal is made.
pub(crate) fn withdraw(streams: &[Arc<Stream>]) {
    if streams.is_empty() {
        return;
    }
    let mut list = DIRTY.lock().unwrap_or_else(|e| e.into_inner());
    for st in streams {
        if !st.listed.swap(true, Ordering::AcqRel) {
            list.push(Arc::clone(st));
            DIRTY_N.fetch_add(1, Ordering::SeqCst);
        }
    }
    if crate::ep::kernel_waiter_count() != 0 {
        return;
    }
    for st in streams {
        st.s.withdraw_readiness();
    }
}

/// The streams of the tagged sleep (see [`tag_sleep`]), weakly: a stream the program closes
/// meanwhile is not kept alive. Only touched under [`DIRTY`]'s lock.
static TAGGED: std::sync::Mutex<Vec<std::sync::Weak<Stream>>> = std::sync::Mutex::new(Vec::new());
/// Sleeps tagged by this process (with its pid, a tag no other sleep has).
static SLEEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The calling thread, the process's only waiter on descriptors, is about to sleep on the set
/// whose answerable streams are `streams` (`crate::ep::withdrawable`): their announcements
/// are tagged with this sleep (`SmcStream::tag_readiness`), so that a peer thread that
/// writes to several of them rings one bell, which wakes this thread, and skips the others
/// (redis-server answers its clients in one burst per turn of its loop, and rang a sleeping
/// redis-benchmark's bell for each). Only while no other thread waits on descriptors: the
/// count is read under the list's lock, which a thread that starts to wait takes to untag
/// ([`untag_all`]) after it counted itself. `false`: nothing tagged. The caller untags when
/// the sleep ends, before it stops counting itself.
pub(crate) fn tag_sleep(streams: &[Arc<Stream>]) -> bool {
    if streams.len() < 2 {
        return false;
    }
    let mut list = DIRTY.lock().unwrap_or_else(|e| e.into_inner());
    untag_locked(&mut list);
    if crate::ep::kernel_waiter_count() != 1 {
        return false;
    }
    let n = SLEEPS.fetch_add(1, Ordering::Relaxed) + 1;
    let tag = (u64::from(std::process::id()) << 32) | (n & 0xFFFF_FFFF);
    let mut tagged = TAGGED.lock().unwrap_or_else(|e| e.into_inner());
    for st in streams {
        st.s.tag_readiness(tag);
        tagged.push(Arc::downgrade(st));
    }
    true
}

/// Ends the tagged sleep, if there is one: each of its streams whose ring the peer skipped is
/// not readable and not announced, and is listed to be settled before the next wait.
pub(crate) fn untag_all() {
    let mut list = DIRTY.lock().unwrap_or_else(|e| e.into_inner());
    untag_locked(&mut list);
}

fn untag_locked(list: &mut Vec<Arc<Stream>>) {
    let mut tagged = TAGGED.lock().unwrap_or_else(|e| e.into_inner());
    for w in tagged.drain(..) {
        let Some(st) = w.upgrade() else {
            continue;
        };
        if st.s.untag_readiness() && !st.listed.swap(true, Ordering::AcqRel) {
            list.push(st);
            DIRTY_N.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Empties the list of streams to settle (a keeper process, `crate::exec`, never settles).
pub(crate) fn take_dirty() -> Vec<Arc<Stream>> {
    let mut list = DIRTY.lock().unwrap_or_else(|e| e.into_inner());
    DIRTY_N.fetch_sub(list.len(), Ordering::AcqRel);
    for st in list.iter() {
        st.listed.store(false, Ordering::Release);
    }
    std::mem::take(&mut *list)
}

/// An SMC listener.
#[derive(Debug)]
pub(crate) struct Listener {
    pub(crate) l: SmcListener,
    pub(crate) nonblocking: AtomicBool,
    pub(crate) hold: Hold,
    /// The process that made it (the one whose engine registered it).
    pub(crate) pid: u32,
    /// This process's view of the socket when it is not that process (a forked worker):
    /// see `hooks::local_listener`. A view of another process (copied by `fork`) is never
    /// used or freed here.
    pub(crate) view: std::sync::atomic::AtomicPtr<View>,
    /// The backlog the program asked for.
    pub(crate) backlog: u32,
}

/// A process's own listener on a socket another process made an SMC listener of.
#[derive(Debug)]
pub(crate) struct View {
    pub(crate) pid: u32,
    pub(crate) l: SmcListener,
}

impl Listener {
    pub(crate) fn new(l: SmcListener, nonblocking: bool, backlog: u32) -> Self {
        Self {
            l,
            nonblocking: nonblocking.into(),
            hold: Hold::new(),
            pid: std::process::id(),
            view: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
            backlog,
        }
    }

    /// An `exec` passed the socket on to another program (`crate::exec`); every process
    /// holding the listener sees it (the object's shared word).
    pub(crate) fn handed_on(&self) -> bool {
        self.hold
            .word()
            .is_some_and(|w| w.load(Ordering::Acquire) == 1)
    }

    /// Says that an `exec` passed the socket on.
    pub(crate) fn set_handed_on(&self) {
        if let Some(w) = self.hold.word() {
            w.store(1, Ordering::Release);
        }
    }

    /// This process's view, if it made one.
    pub(crate) fn own_view(&self) -> Option<&SmcListener> {
        let v = self.view.load(Ordering::Acquire);
        // SAFETY: a published view is never freed (a process's view lives as long as the
        // listener; another process's, copied by fork, is leaked).
        let v = unsafe { v.as_ref() }?;
        (v.pid == std::process::id()).then_some(&v.l)
    }
}

/// Who holds an object: descriptors of this process, and processes (`fork` shares every
/// object with the child, as it shares open file descriptions). The object ends (an SMC close,
/// a listener's deregistration and shutdown) only when the last descriptor of the last process
/// goes; a process that closes its last descriptor while another process still holds the
/// object lets go of its own copy without telling anyone (the TCP socket under it stays open
/// in that process: its descriptors are leaked until it exits).
#[derive(Debug)]
pub(crate) struct Hold {
    /// Descriptors of this process.
    fds: std::sync::atomic::AtomicUsize,
    /// The slot of the process count in the shared page (`None`: no slot free; the object
    /// then ends with this process's last descriptor).
    slot: Option<usize>,
}

impl Hold {
    pub(crate) fn new() -> Self {
        Self {
            fds: std::sync::atomic::AtomicUsize::new(0),
            slot: holders::take(),
        }
    }

    /// Whether some process holds the object (after this one let go of it: another).
    pub(crate) fn held(&self) -> bool {
        self.slot.is_some_and(holders::count_nonzero)
    }

    /// Where the processes holding the object keep a connection's state between their turns
    /// (`SmcStream::share_state`), or `None` without a slot.
    pub(crate) fn area(&self) -> Option<&'static smcd_engine::StateArea> {
        self.slot.and_then(holders::area)
    }

    /// The word every process holding the object shares (0 when it is made), or `None`
    /// without a slot.
    pub(crate) fn word(&self) -> Option<&'static std::sync::atomic::AtomicU32> {
        self.slot.and_then(holders::word)
    }
}

/// Process counts in memory that `fork` shares (an anonymous shared mapping made before the
/// first object, so every later child shares it with its parent), with the process ids of
/// the holders beside each count: a process that exits (or is killed) without closing its
/// copies never lets go of them, and a count that only went down at a `close` kept an object
/// alive for good after any forked child had ended (a connection whose last `close` then sent
/// nothing: its peer waited forever). Before an object is found still held, the holders that
/// have ended are taken out ([`reap`]).
mod holders {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

    const SLOTS: usize = 1 << 16;
    /// Process ids kept per slot; further holders are only counted (and never reaped).
    const PIDS: usize = 6;

    /// The process counts, one word per slot for its object's own use ([`word`]), then
    /// `PIDS` process ids per slot (0: free).
    fn page() -> Option<&'static [AtomicU32]> {
        static PAGE: OnceLock<Option<&'static [AtomicU32]>> = OnceLock::new();
        *PAGE.get_or_init(|| {
            let n = (2 + PIDS) * SLOTS;
            let p = smcd_engine::sys::shared_mapping(n * size_of::<AtomicU32>())?;
            // SAFETY: a fresh mapping of exactly `n` words, never unmapped; zeroed memory is a
            // valid AtomicU32 array (pages are touched only when a slot is used).
            Some(unsafe { std::slice::from_raw_parts(p.as_ptr().cast::<AtomicU32>(), n) })
        })
    }

    fn pids(page: &'static [AtomicU32], slot: usize) -> &'static [AtomicU32] {
        let at = 2 * SLOTS + slot * PIDS;
        &page[at..at + PIDS]
    }

    fn me() -> u32 {
        std::process::id()
    }

    /// Notes this process among the slot's holders (where there is room).
    fn note(page: &'static [AtomicU32], slot: usize) {
        let me = me();
        let ids = pids(page, slot);
        if ids.iter().any(|p| p.load(Ordering::Acquire) == me) {
            return;
        }
        for p in ids {
            if p.compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    /// A free slot, counting one process: this one.
    pub(super) fn take() -> Option<usize> {
        static HINT: AtomicUsize = AtomicUsize::new(0);
        let page = page()?;
        let start = HINT.load(Ordering::Relaxed);
        (0..SLOTS).map(|i| (start + i) % SLOTS).find(|&i| {
            let ok = page[i]
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
            if ok {
                HINT.store(i + 1, Ordering::Relaxed);
                // A slot nobody holds: its word, ids and state area are ours to reset.
                page[SLOTS + i].store(0, Ordering::Release);
                if let Some(a) = areas() {
                    a[i].reset();
                }
                for p in pids(page, i) {
                    p.store(0, Ordering::Release);
                }
                note(page, i);
            }
            ok
        })
    }

    /// One more process holds the slot's object (before a fork: the child, which notes its
    /// id with [`noted`]; or this process again, an `exec` that failed).
    pub(super) fn add(slot: usize) {
        if let Some(p) = page() {
            p[slot].fetch_add(1, Ordering::AcqRel);
        }
    }

    /// This process (a forked child, or a process whose `exec` failed) is a holder.
    pub(super) fn noted(slot: usize) {
        if let Some(p) = page() {
            note(p, slot);
        }
    }

    /// Whether some process holds the slot's object.
    pub(super) fn count_nonzero(slot: usize) -> bool {
        page().is_some_and(|p| p[slot].load(Ordering::Acquire) != 0)
    }

    /// The slot's state area (see `Hold::area`).
    pub(super) fn area(slot: usize) -> Option<&'static smcd_engine::StateArea> {
        areas().map(|a| &a[slot])
    }

    /// One state area per slot, in memory every later child shares (made with the first
    /// slot taken, before any fork that could share its object).
    fn areas() -> Option<&'static [smcd_engine::StateArea]> {
        static AREAS: OnceLock<Option<&'static [smcd_engine::StateArea]>> = OnceLock::new();
        *AREAS.get_or_init(|| smcd_engine::StateArea::region(SLOTS))
    }

    /// The slot's word (see `Hold::word`).
    pub(super) fn word(slot: usize) -> Option<&'static AtomicU32> {
        page().map(|p| &p[SLOTS + slot])
    }

    /// Whether exactly one process holds the slot's object (after taking out the holders that
    /// ended).
    pub(super) fn sole(slot: usize) -> bool {
        page().is_some_and(|p| {
            let n = p[slot].load(Ordering::Acquire);
            n == 1
                || (n > 1 && {
                    let _ = reap(slot);
                    p[slot].load(Ordering::Acquire) == 1
                })
        })
    }

    /// One process fewer (this one); whether it was the last, holders that ended without
    /// letting go not counted.
    pub(super) fn drop_one(slot: usize) -> bool {
        let Some(p) = page() else {
            return true;
        };
        let me = me();
        for id in pids(p, slot) {
            if id
                .compare_exchange(me, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                break;
            }
        }
        // The last is whoever takes the count to 0: by its own decrement or by taking out a
        // holder that ended (so two processes letting go at once never both end it).
        p[slot].fetch_sub(1, Ordering::AcqRel) <= 1 || reap(slot)
    }

    /// Takes the holders that have ended (exited, killed, or zombies) out of the slot's count.
    /// Each id is taken out by one process only (its exchange to 0), so each ended holder
    /// lowers the count once. A child counted before the fork and not yet noted is never
    /// taken out here (it lives). Whether this took the count to 0.
    pub(super) fn reap(slot: usize) -> bool {
        let Some(p) = page() else { return false };
        let me = me();
        let mut zeroed = false;
        for id in pids(p, slot) {
            let pid = id.load(Ordering::Acquire);
            if pid == 0 || pid == me || smcd_engine::sys::process_alive(pid) {
                continue;
            }
            if id
                .compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                let was =
                    p[slot].fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
                zeroed |= was == Ok(1);
            }
        }
        zeroed
    }
}

/// What one of our descriptors refers to.
#[derive(Debug, Clone)]
pub(crate) enum Obj {
    Stream(Arc<Stream>),
    Listener(Arc<Listener>),
    Connecting(Arc<crate::pending::Pending>),
}

impl Obj {
    fn kind(&self) -> u8 {
        match self {
            Obj::Stream(_) => STREAM,
            Obj::Listener(_) => LISTENER,
            Obj::Connecting(_) => CONNECTING,
        }
    }

    fn hold(&self) -> &Hold {
        match self {
            Obj::Stream(s) => &s.hold,
            Obj::Listener(l) => &l.hold,
            Obj::Connecting(p) => &p.hold,
        }
    }

    fn ptr(&self) -> usize {
        match self {
            Obj::Stream(s) => Arc::as_ptr(s) as usize,
            Obj::Listener(l) => Arc::as_ptr(l) as usize,
            Obj::Connecting(p) => Arc::as_ptr(p) as usize,
        }
    }
}

/// Lets go of one descriptor's reference to `obj` (taken out of the table): the last
/// descriptor of the last process ends it; the last of a process whose object another
/// process still holds forgets it (see [`Hold`]). Call outside the table's lock.
pub(crate) fn release(obj: Obj) {
    let hold = obj.hold();
    if hold.fds.fetch_sub(1, Ordering::AcqRel) != 1 {
        return drop(obj);
    }
    if let Obj::Stream(st) = &obj {
        unlist(st);
    }
    if let Obj::Stream(st) = &obj
        && st.spawn_far.load(Ordering::Acquire) >= 0
        && hold.slot.is_none_or(holders::sole)
    {
        // The last holder, and programs this process started with `posix_spawn` may hold
        // the connection: a keeper carries it for them now (or ends it if none does), with
        // this process's count.
        match crate::exec::keep_spawned(st) {
            Ok(()) => return std::mem::forget(obj),
            Err(e) => crate::hooks::debug(format_args!("no keeper for a spawned program ({e})")),
        }
    }
    match hold.slot {
        Some(slot) if !holders::drop_one(slot) => {
            match &obj {
                // Other processes hold the listener on: this one stops accepting from the
                // socket (its threads, its queue) and leaves the socket and its SMC option
                // registration to them. If it made the listener, smcd answers intents for it
                // with plain TCP first (only this process could tell an announced client's
                // Proposal from data). Another process's listener, copied by fork, is not
                // touched: its doorbells are that process's too.
                Obj::Listener(l) => {
                    if l.pid == std::process::id() {
                        l.l.set_shared();
                        l.l.abandon();
                    }
                    if let Some(v) = l.own_view() {
                        v.abandon();
                    }
                }
                // Other processes hold the connection on: this one's copy of the TCP socket
                // under it goes (its number stays taken, by /dev/null, for the engine's
                // sake), so that when the last of them ends, exiting without a `close`
                // included, the TCP connection ends and the peer's engine sees the
                // connection end (an abort) instead of waiting for ever.
                Obj::Stream(st) => st.s.let_go(),
                Obj::Connecting(_) => {}
            }
            std::mem::forget(obj)
        }
        _ => {
            // A listener an `exec` passed on (`crate::exec`): the socket lives on in another
            // program, which may have made it an SMC listener of its own.
            if let Obj::Listener(l) = &obj
                && l.handed_on()
            {
                l.l.abandon();
                if let Some(v) = l.own_view() {
                    v.abandon();
                }
            }
            // A connect in flight is held by the connector too: it ends it now.
            if let Obj::Connecting(p) = &obj {
                p.close();
            }
            drop(obj)
        }
    }
}

thread_local! {
    /// The table's lock, held by the forking thread from `fork`'s prepare handler to its
    /// parent or child handler (so the child's copy is never locked by a thread it lacks).
    static HELD: std::cell::RefCell<Option<std::sync::RwLockWriteGuard<'static, BTreeMap<i32, Obj>>>> =
        const { std::cell::RefCell::new(None) };
    /// The states of the connects in flight, locked across the fork (`crate::pending`).
    static HELD_CONNECTS: std::cell::RefCell<Vec<crate::pending::ForkGuard>> =
        const { std::cell::RefCell::new(Vec::new()) };
    /// The same for the list of streams to settle.
    static HELD_DIRTY: std::cell::RefCell<Option<std::sync::MutexGuard<'static, Vec<Arc<Stream>>>>> =
        const { std::cell::RefCell::new(None) };
}

/// Counts the child in before it exists: the parent may close its descriptors as soon as
/// `fork` returns, before the child ran a line (a fork that fails leaves the objects
/// counted once too often: they are never ended, only leaked).
extern "C" fn fork_prepare() {
    // First the engine's own threads out of their work (`smcd_engine::fork`: a lock one of
    // them held at the fork stayed locked in the child for good), then the table: those
    // threads never wait for the table inside their sections.
    smcd_engine::fork::prepare();
    let g = OBJS.write().unwrap_or_else(|e| e.into_inner());
    let mut seen = std::collections::BTreeSet::new();
    let mut seen_connects = std::collections::BTreeSet::new();
    let mut connects = Vec::new();
    for o in g.values() {
        if seen.insert(o.ptr())
            && let Some(slot) = o.hold().slot
        {
            holders::add(slot);
        }
        if let Obj::Stream(st) = o
            && let Some(area) = st.hold.area()
        {
            // Both processes will hold the connection: its state goes where both see it, and
            // each use is a turn that starts from where the last one left it.
            st.s.share_state(area);
        }
        if let Obj::Listener(l) = o {
            // The child may accept from the socket: this process's engine stops taking
            // connections its program does not ask for (in the listener it made, or in its
            // view of another process's; that process's copy is not ours to change).
            if l.pid == std::process::id() {
                l.l.note_fork();
            }
            if let Some(v) = l.own_view() {
                v.note_fork();
            }
        }
        if let Obj::Connecting(p) = o
            && seen_connects.insert(o.ptr())
        {
            // Each connect in flight is shared from here on: it ends in TCP, and its state
            // is copied while no thread is in the middle of changing it.
            connects.push(crate::pending::ForkGuard::take(p));
        }
    }
    let _ = HELD_CONNECTS.try_with(|h| *h.borrow_mut() = connects);
    let _ = HELD.try_with(|h| *h.borrow_mut() = Some(g));
    let mut d = DIRTY.lock().unwrap_or_else(|e| e.into_inner());
    // The child may wait on the connections a sleep of ours tagged: the tags go (a sleep
    // cannot be tagged again while the lock is held, nor once the connections are shared).
    untag_locked(&mut d);
    let _ = HELD_DIRTY.try_with(|h| *h.borrow_mut() = Some(d));
}

extern "C" fn fork_parent() {
    let _ = HELD_DIRTY.try_with(|h| h.borrow_mut().take());
    let _ = HELD_CONNECTS.try_with(|h| h.borrow_mut().clear());
    let _ = HELD.try_with(|h| h.borrow_mut().take());
    smcd_engine::fork::parent();
}

extern "C" fn fork_child() {
    note_pid();
    // This process holds every object its parent did (counted in by the prepare handler):
    // its id goes beside each count, so that its end is seen even if it never closes them.
    let _ = HELD.try_with(|h| {
        if let Some(g) = h.borrow().as_ref() {
            for o in g.values() {
                if let Some(slot) = o.hold().slot {
                    holders::noted(slot);
                }
            }
        }
    });
    let _ = HELD_DIRTY.try_with(|h| h.borrow_mut().take());
    let _ = HELD_CONNECTS.try_with(|h| h.borrow_mut().clear());
    let _ = HELD.try_with(|h| h.borrow_mut().take());
    smcd_engine::fork::child();
}

/// The process whose memory this is: set when the library is loaded and by `fork`'s child
/// handler (0 before).
static MEM_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Notes that this memory is this process's.
pub(crate) fn note_pid() {
    MEM_PID.store(std::process::id(), Ordering::Release);
}

/// Whether this process runs in another process's memory: a `vfork` child (CPython's
/// `subprocess` makes one, which closes descriptors, `dup2`s and execs through the hooks) or a
/// `clone(CLONE_VM)`. Its descriptor table is its own, but the table of objects, their
/// reference counts and everything else here are the parent's: such a process must change
/// nothing of ours (the parent's descriptors are unchanged), so its hooks pass through.
pub(crate) fn borrowed_memory() -> bool {
    let p = MEM_PID.load(Ordering::Acquire);
    p != 0 && p != std::process::id()
}

/// Registers the fork handlers (once, before the first object exists).
pub(crate) fn watch_forks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handlers are plain functions that live as long as the library.
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    });
}

static OBJS: RwLock<BTreeMap<i32, Obj>> = RwLock::new(BTreeMap::new());
/// How many descriptors [`OBJS`] has (changed under its write lock; read without it by the
/// `vfork` hook, which makes a `fork` of a `vfork` while there is any: `exec::vfork_hook`).
pub(crate) static N_OBJS: AtomicUsize = AtomicUsize::new(0);

/// The kind of `fd` ([`NONE`] for anything out of range).
#[inline]
pub(crate) fn kind(fd: i32) -> u8 {
    usize::try_from(fd)
        .ok()
        .and_then(|i| KINDS.get(i))
        .map_or(NONE, |k| k.load(Ordering::Relaxed))
}

/// Sets the kind of `fd` (ignored out of range).
pub(crate) fn set_kind(fd: i32, k: u8) {
    if let Some(slot) = usize::try_from(fd).ok().and_then(|i| KINDS.get(i)) {
        slot.store(k, Ordering::Release);
    }
    if k == NONE {
        // No longer ours: epoll entries made for what it was are stale (`crate::ep`).
        crate::ep::fd_changed(fd);
    }
}

/// Whether `fd` can be ours at all.
pub(crate) fn in_range(fd: i32) -> bool {
    usize::try_from(fd).is_ok_and(|i| i < MAX_FD)
}

/// The object behind `fd`, if it is ours.
pub(crate) fn get(fd: i32) -> Option<Obj> {
    OBJS.read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&fd)
        .cloned()
}

/// The stream behind `fd`.
pub(crate) fn stream(fd: i32) -> Option<Arc<Stream>> {
    match get(fd)? {
        Obj::Stream(s) => Some(s),
        _ => None,
    }
}

/// The listener behind `fd`.
pub(crate) fn listener(fd: i32) -> Option<Arc<Listener>> {
    match get(fd)? {
        Obj::Listener(l) => Some(l),
        _ => None,
    }
}

/// The connect in flight behind `fd`.
pub(crate) fn connecting(fd: i32) -> Option<Arc<crate::pending::Pending>> {
    match get(fd)? {
        Obj::Connecting(p) => Some(p),
        _ => None,
    }
}

/// Makes `fd` refer to `obj`; returns what it referred to before (for the caller to
/// [`release`] after it released the descriptor).
pub(crate) fn insert(fd: i32, obj: Obj) -> Option<Obj> {
    let k = obj.kind();
    obj.hold().fds.fetch_add(1, Ordering::AcqRel);
    let old = {
        let mut m = OBJS.write().unwrap_or_else(|e| e.into_inner());
        let old = m.insert(fd, obj);
        N_OBJS.store(m.len(), Ordering::Release);
        old
    };
    set_kind(fd, k);
    // A connect under way that became its stream is the same open file (`crate::ep`).
    if old
        .as_ref()
        .is_some_and(|o| !(matches!(o, Obj::Connecting(_)) && k == STREAM))
    {
        crate::ep::fd_changed(fd);
    }
    old
}

/// Forgets `fd`; returns its object (for the caller to [`release`], outside any lock).
pub(crate) fn remove(fd: i32) -> Option<Obj> {
    set_kind(fd, NONE);
    let mut m = OBJS.write().unwrap_or_else(|e| e.into_inner());
    let old = m.remove(&fd);
    N_OBJS.store(m.len(), Ordering::Release);
    old
}

/// Every descriptor of ours with its object.
pub(crate) fn all() -> Vec<(i32, Obj)> {
    OBJS.read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(k, o)| (*k, o.clone()))
        .collect()
}

/// A descriptor stopped referring to `obj` and nothing is to be ended (a connect that fell
/// back: the TCP socket at the number is the program's now): its descriptor count drops, and
/// with its last descriptor this process's count in the shared slot.
pub(crate) fn forget(obj: Obj) {
    if obj.hold().fds.fetch_sub(1, Ordering::AcqRel) == 1 {
        let_go(&obj);
    }
}

/// This process stops holding `obj` without ending it (an `exec` is about to replace it, or
/// a helper process holds only some objects): its process count drops. Whether it was the
/// last.
pub(crate) fn let_go(obj: &Obj) -> bool {
    obj.hold().slot.is_none_or(holders::drop_one)
}

/// Undoes [`let_go`] (the `exec` failed).
pub(crate) fn hold_again(obj: &Obj) {
    if let Some(slot) = obj.hold().slot {
        holders::add(slot);
        holders::noted(slot);
    }
}

/// The identity of an object (the same for every descriptor of it).
pub(crate) fn id(obj: &Obj) -> usize {
    obj.ptr()
}

/// Forgets every descriptor in `first..=last` (`close_range`).
pub(crate) fn remove_range(first: u32, last: u32) -> Vec<Obj> {
    let mut m = OBJS.write().unwrap_or_else(|e| e.into_inner());
    let keys: Vec<i32> = m
        .range(i32::try_from(first).unwrap_or(i32::MAX)..)
        .map(|(k, _)| *k)
        .take_while(|k| u32::try_from(*k).is_ok_and(|k| k <= last))
        .collect();
    let top = usize::try_from(last).unwrap_or(MAX_FD).min(MAX_FD - 1);
    if let Some(band) = KINDS.get(first as usize..=top) {
        for k in band {
            if matches!(k.load(Ordering::Relaxed), CANDIDATE | INHERITED) {
                k.store(NONE, Ordering::Relaxed);
            }
        }
    }
    let gone = keys
        .iter()
        .filter_map(|k| {
            set_kind(*k, NONE);
            m.remove(k)
        })
        .collect();
    N_OBJS.store(m.len(), Ordering::Release);
    gone
}
