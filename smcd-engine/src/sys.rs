//! Small operating-system helpers every layer may use: random values, eventfds, the
//! namespace of the calling thread. Nothing here knows SMC.

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use std::io;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where the engine keeps its own descriptors (0: wherever the kernel puts them).
static FD_BAND: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Keeps the engine's own descriptors (TCP sockets under SMC connections, readiness pairs,
/// bells, buffers) at or above `base` from now on, so that a program that gets its socket
/// descriptors through a preload library sees them numbered as it would without SMC (the
/// lowest free numbers: `select` sets, `fd`-indexed tables, event loops sized by the number of
/// connections). `None` turns it off.
pub fn set_fd_band(base: Option<i32>) {
    FD_BAND.store(
        base.filter(|b| *b > 0).unwrap_or(0),
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// The base of the engine's band ([`set_fd_band`]); 0 when there is none.
pub fn fd_band() -> i32 {
    FD_BAND.load(std::sync::atomic::Ordering::Relaxed)
}

/// `fd` moved into the engine's band ([`set_fd_band`]), or `fd` itself when there is no band
/// or no free number there.
pub fn banded(fd: OwnedFd) -> OwnedFd {
    let base = FD_BAND.load(std::sync::atomic::Ordering::Relaxed);
    if base <= 0 {
        return fd;
    }
    use rustix::fd::AsRawFd;
    if fd.as_raw_fd() >= base {
        return fd;
    }
    rustix::io::fcntl_dupfd_cloexec(&fd, base).unwrap_or(fd)
}

/// A copy of `fd` in the engine's band ([`set_fd_band`]; anywhere without one), close-on-exec.
pub fn dup_banded(fd: impl AsFd) -> io::Result<OwnedFd> {
    let base = FD_BAND.load(std::sync::atomic::Ordering::Relaxed).max(0);
    Ok(rustix::io::fcntl_dupfd_cloexec(fd, base)?)
}

/// A random non-zero 64-bit value (DMB tokens, session keys, epochs).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    loop {
        // getrandom with no flags blocks only before the pool is initialised at boot.
        if rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).is_ok() {
            let v = u64::from_ne_bytes(b);
            if v != 0 {
                return v;
            }
        }
    }
}

/// A value no other call in this process returns, unpredictable across processes (epochs,
/// source ports): a random base taken once, then a counter through a bijective mixer (no
/// system call after the first).
pub fn unique_u64() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static BASE: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = *BASE.get_or_init(random_u64);
    loop {
        // splitmix64's finaliser: a bijection, so distinct inputs give distinct outputs.
        let mut z = base.wrapping_add(
            NEXT.fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        if z != 0 {
            return z;
        }
    }
}

/// The inode of this thread's network namespace (0 if unknown).
pub fn current_netns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// `len` bytes of zeroed anonymous memory that every process forked from now on shares with
/// this one (`MAP_SHARED`; pages are allocated as they are first touched), never unmapped;
/// `None` if the kernel refuses.
pub fn shared_mapping(len: usize) -> Option<std::ptr::NonNull<u8>> {
    // SAFETY: a fresh anonymous mapping; nothing else refers to the range.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    std::ptr::NonNull::new(p.cast::<u8>())
}

/// Whether process `pid` still runs (a zombie does not: it holds no descriptors any more).
pub fn process_alive(pid: u32) -> bool {
    let Ok(p) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(p, 0) } != 0
        && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return false;
    }
    // It exists: a zombie has the state Z (or X) after the command's closing parenthesis.
    match std::fs::read(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let after = stat.iter().rposition(|&b| b == b')').map_or(0, |i| i + 2);
            !matches!(stat.get(after), Some(b'Z' | b'X'))
        }
        Err(_) => true,
    }
}

/// Whether process `pid` maps the page at `addr` from the same object as this process
/// (`/proc/PID/maps`: the range holding `addr`, its device and inode). A process that shared
/// a mapping with us through `fork` and has called `exec` since maps it no more, though its
/// pid lives on; nor does another process that got a dead one's pid. `None` when a listing
/// cannot be read (another user's process) or this process does not map `addr`.
pub fn maps_same(pid: u32, addr: usize) -> Option<bool> {
    let mine = mapping_at("self", addr).ok()??;
    let theirs = mapping_at(&pid.to_string(), addr).ok()?;
    Some(theirs == Some(mine))
}

/// The device and inode of the mapping of `/proc/WHO/maps` that holds `addr`, if one does.
fn mapping_at(who: &str, addr: usize) -> io::Result<Option<(String, u64)>> {
    let maps = std::fs::read_to_string(format!("/proc/{who}/maps"))?;
    for line in maps.lines() {
        let mut f = line.split_ascii_whitespace();
        let (Some(range), Some(_perms), Some(_off), Some(dev), Some(inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        else {
            continue;
        };
        if (lo..hi).contains(&addr) {
            return Ok(Some((dev.to_string(), inode.parse().unwrap_or(0))));
        }
    }
    Ok(None)
}

/// The process's clock as the sans-IO core takes it: nanoseconds since the first call.
pub fn core_now() -> smc_core::Instant {
    smc_core::Instant::from_nanos(Instant::now().duration_since(epoch()).as_nanos() as u64)
}

/// The core instant a process-clock instant stands for (an instant before the first
/// [`core_now`] maps to its start).
pub fn core_instant(t: Instant) -> smc_core::Instant {
    smc_core::Instant::from_nanos(t.saturating_duration_since(epoch()).as_nanos() as u64)
}

/// The wall-clock instant a core instant stands for.
pub fn std_instant(t: smc_core::Instant) -> Instant {
    epoch() + Duration::from_nanos(t.as_nanos())
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// A non-blocking eventfd used as a level-triggered "something is there" flag.
#[derive(Debug)]
pub struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    /// A new non-blocking eventfd.
    pub fn new() -> io::Result<Self> {
        let fd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        Ok(Self { fd: banded(fd) })
    }

    /// Makes the eventfd readable.
    pub fn ring(&self) {
        // EAGAIN means the counter is saturated, i.e. already readable: nothing to do.
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// Resets the eventfd to not readable.
    pub fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut b);
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Waits until `fd` is readable, at most `timeout` (for ever with `None`); whether it is.
/// A signal that interrupts the wait does not end it.
pub fn wait_readable(fd: impl AsFd, timeout: Option<std::time::Duration>) -> io::Result<bool> {
    use rustix::event::{PollFd, PollFlags, poll};
    let ts = timeout.map(|t| rustix::time::Timespec {
        tv_sec: t.as_secs() as i64,
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    loop {
        match poll(&mut fds, ts.as_ref()) {
            Ok(n) => return Ok(n > 0),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// This process's context switches so far, exited threads included (`getrusage`,
/// `RUSAGE_SELF`): `(voluntary, involuntary)`. A voluntary switch is a thread going to sleep,
/// so it stands for one wake-up.
pub fn context_switches() -> (u64, u64) {
    // SAFETY: getrusage fills the zeroed struct we own.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return (0, 0);
        }
        (ru.ru_nvcsw as u64, ru.ru_nivcsw as u64)
    }
}

/// Starts a thread that prints `{tag}: rusage {"voluntary":V,"involuntary":I}` (this
/// process's [`context_switches`]) to stderr at every `SIGUSR1`, so a benchmark can count a
/// long-running process's wake-ups around a run. It blocks `SIGUSR1` in the calling thread:
/// call it before other threads start, so they inherit the mask and the signal reaches only
/// the reporter.
pub fn report_context_switches_on_sigusr1(tag: &'static str) -> io::Result<()> {
    // SAFETY: plain libc calls on a zeroed sigset_t we own.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        set
    };
    std::thread::Builder::new()
        .name("rusage-report".into())
        .spawn(move || {
            loop {
                let mut sig = 0;
                // SAFETY: `set` is a valid sigset_t; sigwait writes the signal number.
                if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                    return;
                }
                let (v, i) = context_switches();
                eprintln!("{tag}: rusage {{\"voluntary\":{v},\"involuntary\":{i}}}");
            }
        })?;
    Ok(())
}
