//! The engine's own threads and `fork`.
//!
//! `fork` copies one thread. A mutex that another thread of the engine (housekeeping, the
//! acceptor, the handshake reactor and workers, the liveness watcher) held at that instant
//! stays locked in the child for good, and the child's first use of it hangs: a qperf server's
//! per-test child hung in `Bells::take` on the stash lock the parent's housekeeping thread
//! held while draining bell channels (about one qperf run in four on a loaded machine).
//!
//! So those threads do their work inside [`busy`] sections and wait outside them (in `poll`,
//! `epoll_wait`, a condition variable), and a program that forks calls [`prepare`] before the
//! fork (the preload's `pthread_atfork` handler does): it waits for the sections in progress
//! to end and holds off new ones until [`parent`] / [`child`] after the fork. What the
//! program's own threads hold at a fork is the program's business, as POSIX says.
//!
//! A `busy` section must not block for long (a fork waits for it) and must not nest in one
//! thread (a nested read behind a waiting `prepare` deadlocks).

use std::cell::RefCell;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static GATE: RwLock<()> = RwLock::new(());

thread_local! {
    static HELD: RefCell<Option<RwLockWriteGuard<'static, ()>>> = const { RefCell::new(None) };
}

/// A section of an engine thread's work that a fork must not cut in two.
pub(crate) fn busy() -> RwLockReadGuard<'static, ()> {
    GATE.read().unwrap_or_else(|e| e.into_inner())
}

/// Before `fork`: waits until no engine thread is inside a [`busy`] section and keeps new
/// ones from starting until [`parent`] or [`child`] on this thread.
pub fn prepare() {
    let g = GATE.write().unwrap_or_else(|e| e.into_inner());
    let _ = HELD.try_with(|h| *h.borrow_mut() = Some(g));
}

/// After `fork`, in the parent: the engine's threads go on.
pub fn parent() {
    let _ = HELD.try_with(|h| h.borrow_mut().take());
}

/// After `fork`, in the child (which has none of the engine's threads; any it starts may
/// enter sections again).
pub fn child() {
    PID.store(0, std::sync::atomic::Ordering::Relaxed);
    let _ = HELD.try_with(|h| h.borrow_mut().take());
}

/// This process's id as [`pid`] last read it (0: to be read again; [`child`] resets it).
static PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// This process's id without a system call each time (the C library reads it from the kernel
/// at every `getpid`): kept here, and read again in a child once [`child`] ran (a program's
/// `fork` through a preload library; a process made by a raw `clone` that uses the engine
/// without it would see its parent's id, as programs did when the C library cached it).
pub fn pid() -> u32 {
    match PID.load(std::sync::atomic::Ordering::Relaxed) {
        0 => {
            let p = std::process::id();
            PID.store(p, std::sync::atomic::Ordering::Relaxed);
            p
        }
        p => p,
    }
}

/// A process-wide object with a thread of its own (the liveness watcher, a preload's
/// connector), made once per process: a forked child has the parent's object in its memory
/// but not its thread, and an epoll instance it would share with the parent (whose thread
/// would then take the child's events, and the child's waits would never end: a forked child's
/// non-blocking connect hung when its parent had made one before the fork). Made again in a
/// process that finds its parent's. No lock the child could inherit locked: a thread of this
/// process that finds another making it waits for that one (a stale mark from the parent,
/// copied by the fork, is another process's and taken over).
#[derive(Debug)]
pub struct PerProcess<T: 'static> {
    /// The process the object was made for (0: none yet).
    ready: std::sync::atomic::AtomicU32,
    obj: std::sync::atomic::AtomicPtr<T>,
    /// The process one of whose threads is making it.
    making: std::sync::atomic::AtomicU32,
}

impl<T: Send + Sync + 'static> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + Sync + 'static> PerProcess<T> {
    /// None made yet.
    pub const fn new() -> Self {
        Self {
            ready: std::sync::atomic::AtomicU32::new(0),
            obj: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
            making: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// This process's object, made by `make` (leaked: it lives as long as the process) at the
    /// first call in each process.
    pub fn get(&self, make: impl FnOnce() -> T) -> &'static T {
        use std::sync::atomic::Ordering;
        let me = std::process::id();
        loop {
            if self.ready.load(Ordering::Acquire) == me {
                // SAFETY: published with `ready == me` below, never freed.
                return unsafe { &*self.obj.load(Ordering::Acquire) };
            }
            let m = self.making.load(Ordering::Acquire);
            if m == me {
                std::thread::yield_now();
                continue;
            }
            if self
                .making
                .compare_exchange(m, me, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                break;
            }
        }
        if self.ready.load(Ordering::Acquire) != me {
            let obj: &'static T = Box::leak(Box::new(make()));
            self.obj
                .store(std::ptr::from_ref(obj).cast_mut(), Ordering::Release);
            self.ready.store(me, Ordering::Release);
        }
        self.making.store(0, Ordering::Release);
        // SAFETY: as above.
        unsafe { &*self.obj.load(Ordering::Acquire) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Barrier};

    /// `prepare` waits for a section in progress and holds off new ones until `parent`.
    #[test]
    fn prepare_waits_for_sections_and_holds_off_new_ones() {
        let inside = Arc::new(Barrier::new(2));
        let leave = Arc::new(Barrier::new(2));
        let prepared = Arc::new(AtomicBool::new(false));
        let t = {
            let (inside, leave) = (Arc::clone(&inside), Arc::clone(&leave));
            std::thread::spawn(move || {
                let g = busy();
                inside.wait();
                leave.wait();
                drop(g);
            })
        };
        inside.wait();
        let p = {
            let prepared = Arc::clone(&prepared);
            std::thread::spawn(move || {
                prepare();
                prepared.store(true, Ordering::SeqCst);
                // A new section cannot start while the fork is prepared.
                assert!(GATE.try_read().is_err());
                parent();
            })
        };
        // The section is still open: prepare has not returned.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!prepared.load(Ordering::SeqCst));
        leave.wait();
        t.join().unwrap();
        p.join().unwrap();
        assert!(prepared.load(Ordering::SeqCst));
        drop(busy());
    }
}
