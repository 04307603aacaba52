//! Liveness for connections an event loop waits on (ARCHITECTURE rule 5: the TCP connection
//! stays open for the life of an SMC connection, and its end aborts it).
//!
//! A blocking wait watches its TCP connection itself (it polls it beside its readiness). An
//! event loop waits on the readiness descriptor alone, so one thread per process sleeps in
//! `epoll` on the TCP connections of the connections whose readiness descriptor was handed
//! out. After the handshake nothing travels over TCP, so the thread wakes only when one of
//! them ends: it tells the connection, which finishes an orderly close or aborts, and its
//! readiness hangs up, so the loop sees the end at once. Nothing wakes periodically.

use rustix::event::epoll;
use rustix::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, Weak};

/// A connection the watcher watches.
pub trait Watched: Send + Sync {
    /// Its TCP connection signalled something (end of stream, reset, unexpected bytes).
    fn tcp_event(&self);
    /// [`Watcher::watch_later`]'s delay is over: register the watch now (unless it is no
    /// longer needed).
    fn start_watch(&self);
}

/// How long [`Watcher::watch_later`] waits before the connection is registered: an event
/// loop's short connections (crr) end before that and cost the watcher's set nothing.
pub const WATCH_DELAY: std::time::Duration = std::time::Duration::from_millis(10);

/// The process's liveness watcher.
#[derive(Debug)]
pub struct Watcher {
    ep: OwnedFd,
    targets: Mutex<HashMap<u64, WeakTarget>>,
    next: AtomicU64,
    /// Connections to register once their time comes, oldest first.
    later: Mutex<std::collections::VecDeque<(WeakTarget, std::time::Instant)>>,
    /// In `ep` (key 0): rung when `later` gets its first entry, so the thread starts its timer.
    kick: crate::sys::Doorbell,
}

struct WeakTarget(Weak<dyn Watched>);

impl std::fmt::Debug for WeakTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WeakTarget")
    }
}

/// Keeps a registration; dropping it ends it.
///
/// The registration is of the TCP socket itself, not of a duplicate (a duplicate would cost
/// every watched connection a second descriptor): the guard must be dropped while the socket
/// is still open, which its owner ensures by declaring the guard before the socket (fields
/// drop in declaration order). Dropped later, the delete could find another socket that got
/// the same number and was watched since, and that connection would lose its watch.
#[derive(Debug)]
pub struct WatchGuard {
    key: u64,
    /// The watched socket's number, open for as long as the guard lives.
    fd: RawFd,
    /// Still registered ([`WatchGuard::disarm`] ends the watch before the guard goes).
    armed: AtomicBool,
}

impl WatchGuard {
    /// Ends the watch now (once; the guard's drop then does nothing): for a connection whose
    /// end is already known, so that the TCP connection's end, which follows, wakes no one.
    pub fn disarm(&self) {
        if !self.armed.swap(false, Ordering::AcqRel) {
            return;
        }
        let w = Watcher::get();
        // SAFETY: the owner keeps the socket open until the guard is gone (see above).
        let fd = unsafe { BorrowedFd::borrow_raw(self.fd) };
        let _ = epoll::delete(&w.ep, fd);
        w.targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.disarm();
    }
}

impl Watcher {
    /// This process's watcher, started on first use (again in a forked child: see
    /// [`crate::fork::PerProcess`]).
    pub fn get() -> &'static Watcher {
        static W: crate::fork::PerProcess<Watcher> = crate::fork::PerProcess::new();
        let mut started = false;
        let w = W.get(|| {
            started = true;
            let w = Watcher {
                ep: crate::sys::banded(
                    epoll::create(epoll::CreateFlags::CLOEXEC).expect("an epoll instance"),
                ),
                targets: Mutex::new(HashMap::new()),
                next: AtomicU64::new(1),
                later: Mutex::new(std::collections::VecDeque::new()),
                kick: crate::sys::Doorbell::new().expect("an eventfd"),
            };
            epoll::add(
                &w.ep,
                &w.kick,
                epoll::EventData::new_u64(0),
                epoll::EventFlags::IN,
            )
            .expect("the watcher's doorbell in its set");
            w
        });
        if started {
            std::thread::Builder::new()
                .name("smc-liveness".into())
                .spawn(move || w.run())
                .expect("the liveness thread");
        }
        w
    }

    /// Watches `tcp` for `target` until the guard is dropped, which must happen before `tcp`
    /// is closed (see [`WatchGuard`]).
    pub fn watch(&self, tcp: BorrowedFd<'_>, target: Weak<dyn Watched>) -> io::Result<WatchGuard> {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, WeakTarget(target));
        // One shot: a connection that ended does not wake the thread again.
        let guard = WatchGuard {
            key,
            fd: tcp.as_raw_fd(),
            armed: AtomicBool::new(true),
        };
        epoll::add(
            &self.ep,
            tcp,
            epoll::EventData::new_u64(key),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP | epoll::EventFlags::ONESHOT,
        )?;
        Ok(guard)
    }

    /// Registers `target` with [`Watched::start_watch`] after [`WATCH_DELAY`].
    pub fn watch_later(&self, target: Weak<dyn Watched>) {
        let mut later = self.later.lock().unwrap_or_else(|e| e.into_inner());
        let first = later.is_empty();
        later.push_back((WeakTarget(target), std::time::Instant::now() + WATCH_DELAY));
        drop(later);
        if first {
            self.kick.ring();
        }
    }

    /// The delayed registrations that are due; how long until the next one.
    fn start_due(&self) -> Option<std::time::Duration> {
        let now = std::time::Instant::now();
        let mut due = Vec::new();
        let next = {
            let mut later = self.later.lock().unwrap_or_else(|e| e.into_inner());
            while later.front().is_some_and(|(_, at)| *at <= now) {
                due.push(later.pop_front().expect("looked").0);
            }
            later
                .front()
                .map(|(_, at)| at.saturating_duration_since(now))
        };
        for t in due {
            if let Some(t) = t.0.upgrade() {
                t.start_watch();
            }
        }
        next
    }

    fn run(&self) {
        let mut events = Vec::with_capacity(64);
        loop {
            // Work in fork-safe sections (`crate::fork`), the wait in `epoll_wait` outside.
            let busy = crate::fork::busy();
            let timeout = self.start_due().map(|d| {
                // Rounded up to the millisecond: waking before the time would only loop.
                let d = d + std::time::Duration::from_micros(999);
                rustix::time::Timespec {
                    tv_sec: d.as_secs() as i64,
                    tv_nsec: i64::from(d.subsec_millis()) * 1_000_000,
                }
            });
            events.clear();
            drop(busy);
            match epoll::wait(
                &self.ep,
                rustix::buffer::spare_capacity(&mut events),
                timeout.as_ref(),
            ) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(_) => return,
            }
            let _busy = crate::fork::busy();
            for ev in &events {
                let key = ev.data.u64();
                if key == 0 {
                    self.kick.drain();
                    continue;
                }
                let target = self
                    .targets
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&key)
                    .and_then(|t| t.0.upgrade());
                if let Some(t) = target {
                    t.tcp_event();
                }
            }
        }
    }
}
