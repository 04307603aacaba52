//! A wire with a delay: two TAP devices joined by the bench, which holds every frame going
//! from the first to the second for a set time. It stands in for `tc qdisc ... netem delay`
//! where the kernel has no netem (`CONFIG_NET_SCH_NETEM` unset, as on this project's VMs,
//! which have no `fq` qdisc for an EDT delay from BPF either).
//!
//! Each device is made here (`/dev/net/tun`, `IFF_TAP | IFF_NO_PI`) and moved by the caller
//! into its namespace; the descriptors stay ours wherever the devices go. Three threads move
//! frames: one reads the first device and stamps each frame with its due time, one writes
//! them to the second device when due (the delay is the same for every frame, so a queue
//! keeps their order), one copies the other way at once. A device exists while its
//! descriptor is open: dropping the wire stops the threads and removes both.

use anyhow::{Context, bail};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Two TAP devices and the threads between them.
#[derive(Debug)]
pub(super) struct Wire {
    /// Microseconds every frame from the first device to the second waits.
    delay_us: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// Largest frame: MTU 9000 and an Ethernet header, with room to spare.
const FRAME: usize = 9216;

/// How often a blocked thread looks at the stop flag.
const TICK: Duration = Duration::from_millis(50);

/// Opens TAP device `name` (made, not persistent: it goes when the descriptor closes).
fn tap(name: &str) -> anyhow::Result<OwnedFd> {
    if name.len() >= libc::IFNAMSIZ {
        bail!("interface name {name} is too long");
    }
    // SAFETY: open with a NUL-terminated path; the descriptor returned is owned below.
    let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("open /dev/net/tun");
    }
    // SAFETY: fd was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data (a name and a union of integers and pointers); zeroed is a
    // valid value, and TUNSETIFF reads the name and the flags from it.
    let r = unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
        libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &req)
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("TUNSETIFF {name}"));
    }
    Ok(fd)
}

/// Waits up to [`TICK`] for `fd` to be readable.
fn readable(fd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, TICK.as_millis() as libc::c_int) };
    n > 0 && p.revents & libc::POLLIN != 0
}

/// One frame from `fd`; `None` when the device is gone.
fn read_frame(fd: &OwnedFd, buf: &mut [u8]) -> Option<usize> {
    // SAFETY: buf is valid for buf.len() bytes.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n >= 0 {
        return Some(n as usize);
    }
    match std::io::Error::last_os_error().kind() {
        std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock => Some(0),
        _ => None,
    }
}

/// Hands one frame to the kernel as received on `fd`'s device (a frame it refuses, say
/// while the device is down, is lost as on a wire).
fn write_frame(fd: &OwnedFd, frame: &[u8]) {
    // SAFETY: frame is valid for frame.len() bytes.
    let _ = unsafe { libc::write(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
}

impl Wire {
    /// Makes TAP devices `first` and `second` (in the bench's namespace; move them with
    /// `ip link set NAME netns NS`) and starts moving frames between them.
    pub(super) fn create(first: &str, second: &str) -> anyhow::Result<Wire> {
        let a = Arc::new(tap(first)?);
        let b = Arc::new(tap(second)?);
        let delay_us = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
        let mut threads = Vec::new();
        {
            let (a, stop, delay_us) = (a.clone(), stop.clone(), delay_us.clone());
            threads.push(spawn("wire-delay-in", move || {
                let mut buf = vec![0u8; FRAME];
                while !stop.load(Ordering::Relaxed) {
                    if !readable(&a) {
                        continue;
                    }
                    let Some(n) = read_frame(&a, &mut buf) else {
                        return;
                    };
                    let due =
                        Instant::now() + Duration::from_micros(delay_us.load(Ordering::Relaxed));
                    if n > 0 && tx.send((due, buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            })?);
        }
        {
            let (b, stop) = (b.clone(), stop.clone());
            threads.push(spawn("wire-delay-out", move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((due, frame)) = rx.recv_timeout(TICK) else {
                        continue;
                    };
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    write_frame(&b, &frame);
                }
            })?);
        }
        {
            let stop = stop.clone();
            threads.push(spawn("wire-back", move || {
                let mut buf = vec![0u8; FRAME];
                while !stop.load(Ordering::Relaxed) {
                    if !readable(&b) {
                        continue;
                    }
                    match read_frame(&b, &mut buf) {
                        Some(0) => {}
                        Some(n) => write_frame(&a, &buf[..n]),
                        None => return,
                    }
                }
            })?);
        }
        Ok(Wire {
            delay_us,
            stop,
            threads,
        })
    }

    /// Every frame from the first device to the second read from now on waits `d`
    /// (none at first).
    pub(super) fn set_delay(&self, d: Duration) {
        self.delay_us.store(d.as_micros() as u64, Ordering::Relaxed);
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> anyhow::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .with_context(|| format!("thread {name}"))
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
