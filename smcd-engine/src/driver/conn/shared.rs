//! A connection that several processes hold after a fork, each taking turns at it.
//!
//! `fork` copies the connection's state (cursors, flags, the close machine: `State::core`)
//! into the child; from then on each process's copy moved on its own, and a process that used
//! the connection after another had wrote at its own stale producer cursor over the other's
//! bytes (a parent that sent 10 bytes, a child 5, then the parent 6: the peer read the child's
//! 5 overwritten). The kernel has one socket for all of them. So before the first fork the
//! state moves into memory the fork shares (a [`StateArea`], which the preload library keeps
//! per shared object), and from then on every use of the connection, in any of its processes,
//! is a *turn*: it takes the area (a lock across processes), starts from the state the last
//! turn left there if another process moved it since this one's last turn, and puts its state
//! back at the end. A process's state is plain data for this (SMC-D: no CDC in flight is
//! tracked, `Connection::owns_no_heap`); SMC-R connections are not shared this way.
//!
//! The lock is a word holding the process id of the turn's holder, waited on with a futex
//! shared between processes; a process that died in its turn is found by a waiter whose wait
//! timed out (its id no longer names a live process) and its turn is taken over: what it did
//! in that turn is lost, as the state it had not put back (bytes written into the peer's ring
//! without the CDC that would have shown them; the next turn writes over them). So is the
//! turn of a thread that vanished when another thread of its process called `exec`: the pid
//! lives on, but the new image no longer maps this area (`sys::maps_same`, looked at every
//! [`MAPS_LOOK`] of waiting, as is a pid taken over by an unrelated process).

use smc_core::conn::Connection;
use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// How long a process waits for another's turn before it looks whether that one still lives.
const TURN_WAIT: Duration = Duration::from_millis(5);

/// Every this many waits of [`TURN_WAIT`] a waiter also looks whether the holder still maps
/// the area (a read of its `/proc/PID/maps`).
const MAPS_LOOK: u32 = 20;

/// Where processes that share a connection keep its state between their turns. All zeroes is
/// an empty area ([`StateArea::region`] makes them so).
#[repr(C)]
pub struct StateArea {
    /// The process whose turn it is (0: nobody's).
    owner: AtomicU32,
    /// Processes waiting for a turn.
    waiting: AtomicU32,
    /// Bumped at the end of every turn; 0 while the area holds no state.
    turns: AtomicU64,
    /// The state the last turn left (valid while `turns` is not 0). It owns no heap memory
    /// (`Connection::owns_no_heap`), so the bytes one process wrote are a valid value in
    /// every process running the same program image.
    state: UnsafeCell<MaybeUninit<Connection>>,
}

// SAFETY: `state` is read and written only by the holder of the turn (`owner`), which the
// compare-exchange in `enter` gives to one thread of one process at a time; the turn's
// Acquire/Release orders those accesses.
unsafe impl Sync for StateArea {}

impl std::fmt::Debug for StateArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateArea")
            .field("owner", &self.owner.load(Ordering::Relaxed))
            .field("turns", &self.turns.load(Ordering::Relaxed))
            .finish()
    }
}

impl StateArea {
    /// `n` empty areas in an anonymous shared mapping (never unmapped; pages are allocated as
    /// they are first touched), which every process forked from now on shares with this one.
    pub fn region(n: usize) -> Option<&'static [StateArea]> {
        let p = crate::sys::shared_mapping(n.checked_mul(size_of::<StateArea>())?)?;
        // SAFETY: a fresh mapping of exactly `n` areas (page-aligned, so aligned for them);
        // zeroed bytes are empty areas (atomics at 0, an uninitialised state); it is never
        // unmapped, so the slice lives as long as the process.
        Some(unsafe { std::slice::from_raw_parts(p.as_ptr().cast::<StateArea>(), n) })
    }

    /// Empties the area for a new connection (no process may use it for the old one any
    /// more: the caller took its slot as free).
    pub fn reset(&self) {
        self.turns.store(0, Ordering::Release);
        self.owner.store(0, Ordering::Release);
    }

    /// Takes the turn: waits while another process has it.
    pub(super) fn enter(&self) {
        let me = crate::fork::pid();
        let mut waits = 0u32;
        loop {
            let held =
                match self
                    .owner
                    .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                {
                    Ok(_) => return,
                    Err(h) => h,
                };
            if held == me {
                // No thread of ours can hold it (a turn is taken under the connection's lock,
                // which this thread holds): a turn left unended by a thread that died here.
                return;
            }
            self.waiting.fetch_add(1, Ordering::SeqCst);
            let ts = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: TURN_WAIT.as_nanos() as i64,
            };
            let r = rustix::thread::futex::wait(
                &self.owner,
                rustix::thread::futex::Flags::empty(),
                held,
                Some(&ts),
            );
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            if r != Err(rustix::io::Errno::TIMEDOUT) {
                continue;
            }
            waits = waits.wrapping_add(1);
            let gone = !crate::sys::process_alive(held)
                || (waits.is_multiple_of(MAPS_LOOK)
                    && crate::sys::maps_same(held, self as *const StateArea as usize)
                        == Some(false));
            if gone
                && self
                    .owner
                    .compare_exchange(held, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
        }
    }

    /// Ends the turn.
    pub(super) fn leave(&self) {
        self.owner.store(0, Ordering::Release);
        if self.waiting.load(Ordering::SeqCst) != 0 {
            let _ =
                rustix::thread::futex::wake(&self.owner, rustix::thread::futex::Flags::empty(), 1);
        }
    }

    /// The state the last turn left, when it is not the one whose number `seen` is.
    pub(super) fn take_newer(&self, seen: u64) -> Option<(u64, Connection)> {
        let turns = self.turns.load(Ordering::Acquire);
        if turns == 0 || turns == seen {
            return None;
        }
        // SAFETY: in our turn (`enter`); `turns != 0` says a state was put there, which owns
        // no heap memory (`put`), so a copy of it is a valid value here.
        let c = unsafe { (*self.state.get()).assume_init_ref().clone() };
        Some((turns, c))
    }

    /// Puts `core` back at the end of a turn; its number. `None` (nothing put) when the state
    /// owns heap memory.
    pub(super) fn put(&self, core: &Connection) -> Option<u64> {
        if !core.owns_no_heap() {
            return None;
        }
        // SAFETY: in our turn; the value written owns no heap memory, so the one it replaces
        // (not dropped) leaks nothing.
        unsafe { (*self.state.get()).write(core.clone()) };
        Some(self.turns.fetch_add(1, Ordering::AcqRel) + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process that took the turn and then called `exec` (as when another thread of it
    /// does, and the holder thread vanishes) holds the turn no more: a waiter takes it over
    /// while that process still runs (its new image, `sleep`), not only once it has ended.
    #[test]
    fn a_turn_held_across_an_exec_is_taken_over() {
        let area = &StateArea::region(1).expect("a shared mapping")[0];
        let sleep = c"/bin/sleep";
        let secs = c"60";
        let argv = [sleep.as_ptr(), secs.as_ptr(), std::ptr::null()];
        // SAFETY: the child only stores into the shared area and calls execv and _exit,
        // which is what a child of a threaded process may do.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: as above.
            unsafe {
                area.owner.store(libc::getpid() as u32, Ordering::SeqCst);
                libc::execv(sleep.as_ptr(), argv.as_ptr());
                libc::_exit(127);
            }
        }
        assert!(child > 0, "fork");
        let comm = format!("/proc/{child}/comm");
        // The child has the turn and runs its new image.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !(area.owner.load(Ordering::SeqCst) == child as u32
            && std::fs::read_to_string(&comm).is_ok_and(|c| c.trim() == "sleep"))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the child did not exec"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        area.enter();
        let mut status = 0;
        // SAFETY: our child; WNOHANG only looks.
        let ended = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) } == child;
        // SAFETY: as above.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, &mut status, 0);
        }
        assert!(
            !ended,
            "the turn was taken only once the exec'd process had ended"
        );
        assert_eq!(area.owner.load(Ordering::SeqCst), crate::fork::pid());
        area.leave();
    }
}
