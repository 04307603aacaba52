//! The program's view of `RLIMIT_NOFILE`. The engine's descriptors live in a band at the top
//! of the numbers the process may use (`hooks::engine`): above the program's soft limit,
//! which the library raises to make room, or in the upper half of it when the hard limit
//! leaves none. A program that closes every number up to its limit one `close` at a time
//! (daemons, an inetd child before its `exec`) would close the band with it, and the
//! connections the `exec` hands on with it. So the program is told the limit below the band:
//! `getrlimit`, `prlimit` (for itself), `getdtablesize` and `sysconf(_SC_OPEN_MAX)` say at
//! most the band's base, or what the program set itself since; a `setrlimit` of its own sets
//! that and keeps the real soft limit where the band still fits. `close_range` and
//! `closefrom` stop below the band already (`hooks`).

use crate::real;
use libc::{c_int, c_long};
use std::sync::atomic::{AtomicU64, Ordering};

/// The soft limit the program sees; 0 while there is no band.
static VIEW: AtomicU64 = AtomicU64::new(0);

/// The band starts at `base`: from now on the program sees that as its soft limit.
pub(crate) fn band_at(base: u64) {
    VIEW.store(base, Ordering::Relaxed);
}

fn view() -> Option<u64> {
    Some(VIEW.load(Ordering::Relaxed)).filter(|v| *v > 0)
}

/// `RLIMIT_NOFILE` as the C library types the resource.
fn is_nofile(resource: c_int) -> bool {
    resource == libc::RLIMIT_NOFILE as c_int
}

/// What the program reads of a limit the kernel gave: its soft limit no higher than the view.
fn shown(r: &mut libc::rlimit) {
    if let Some(v) = view() {
        r.rlim_cur = r.rlim_cur.min(v);
    }
}

/// The program sets `want`: it gets that as its view; the real soft limit stays at least
/// where it is (the band above the program's numbers), within `want`'s hard limit.
///
/// # Safety
/// `pid` and the pointers as `prlimit(2)`'s.
unsafe fn set_own(pid: libc::pid_t, want: &libc::rlimit) -> c_int {
    let mut now = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-pointer; reading only.
    if unsafe {
        real::prlimit(
            pid,
            libc::RLIMIT_NOFILE as c_int,
            std::ptr::null(),
            &mut now,
        )
    } != 0
    {
        return -1;
    }
    let real_want = libc::rlimit {
        rlim_cur: want.rlim_cur.max(now.rlim_cur).min(want.rlim_max),
        rlim_max: want.rlim_max,
    };
    // SAFETY: a valid in-pointer.
    let r = unsafe {
        real::prlimit(
            pid,
            libc::RLIMIT_NOFILE as c_int,
            &real_want,
            std::ptr::null_mut(),
        )
    };
    if r == 0 {
        VIEW.store(want.rlim_cur.max(1), Ordering::Relaxed);
    }
    r
}

/// `getrlimit(2)`.
///
/// # Safety
/// As `getrlimit(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getrlimit(resource: c_int, rlim: *mut libc::rlimit) -> c_int {
    // SAFETY: passed through.
    let r = unsafe { real::getrlimit(resource, rlim) };
    if r == 0 && is_nofile(resource) && !rlim.is_null() {
        // SAFETY: the kernel just filled it.
        shown(unsafe { &mut *rlim });
    }
    r
}

/// `getrlimit64` (the same on 64-bit targets).
///
/// # Safety
/// As `getrlimit(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getrlimit64(resource: c_int, rlim: *mut libc::rlimit) -> c_int {
    // SAFETY: as above.
    unsafe { getrlimit(resource, rlim) }
}

/// `setrlimit(2)`.
///
/// # Safety
/// As `setrlimit(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setrlimit(resource: c_int, rlim: *const libc::rlimit) -> c_int {
    if is_nofile(resource) && !rlim.is_null() && view().is_some() {
        // SAFETY: the caller's valid pointer.
        return unsafe { set_own(0, &*rlim) };
    }
    // SAFETY: passed through.
    unsafe { real::setrlimit(resource, rlim) }
}

/// `setrlimit64`.
///
/// # Safety
/// As `setrlimit(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setrlimit64(resource: c_int, rlim: *const libc::rlimit) -> c_int {
    // SAFETY: as above.
    unsafe { setrlimit(resource, rlim) }
}

/// `prlimit(2)`: for this process, as `getrlimit` and `setrlimit` above; another's as it is.
///
/// # Safety
/// As `prlimit(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn prlimit(
    pid: libc::pid_t,
    resource: c_int,
    new: *const libc::rlimit,
    old: *mut libc::rlimit,
) -> c_int {
    let own = pid == 0 || pid == std::process::id() as libc::pid_t;
    if !(own && is_nofile(resource) && view().is_some()) {
        // SAFETY: passed through.
        return unsafe { real::prlimit(pid, resource, new, old) };
    }
    if !old.is_null() {
        // SAFETY: the caller's valid out-pointer.
        if unsafe { real::prlimit(pid, resource, std::ptr::null(), old) } != 0 {
            return -1;
        }
        // SAFETY: just filled.
        shown(unsafe { &mut *old });
    }
    if new.is_null() {
        return 0;
    }
    // SAFETY: the caller's valid pointer.
    unsafe { set_own(pid, &*new) }
}

/// `prlimit64`.
///
/// # Safety
/// As `prlimit(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn prlimit64(
    pid: libc::pid_t,
    resource: c_int,
    new: *const libc::rlimit,
    old: *mut libc::rlimit,
) -> c_int {
    // SAFETY: as above.
    unsafe { prlimit(pid, resource, new, old) }
}

/// `getdtablesize(3)`: the soft limit the program sees.
///
/// # Safety
/// None beyond the C library's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getdtablesize() -> c_int {
    // SAFETY: passed through.
    let n = unsafe { real::getdtablesize() };
    match view() {
        Some(v) if n > 0 => n.min(c_int::try_from(v).unwrap_or(c_int::MAX)),
        _ => n,
    }
}

/// `sysconf(3)`: `_SC_OPEN_MAX` is the soft limit the program sees.
///
/// # Safety
/// None beyond the C library's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sysconf(name: c_int) -> c_long {
    // SAFETY: passed through.
    let n = unsafe { real::sysconf(name) };
    match view() {
        Some(v) if name == libc::_SC_OPEN_MAX && n > 0 => {
            n.min(c_long::try_from(v).unwrap_or(c_long::MAX))
        }
        _ => n,
    }
}
