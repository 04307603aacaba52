//! The processes the bench starts, and the guarantee that none outlives it.
//!
//! Every child is spawned through [`spawn`], which registers its pid. Three paths stop them:
//! the normal end of a run ([`stop`] per process, then [`cleanup`]), an error or panic in
//! the main thread (the [`Guard`] runs [`cleanup`] when it is dropped), and a signal (SIGINT,
//! SIGTERM, SIGHUP are blocked in every thread and read from a signalfd by one thread, which
//! runs [`cleanup`] and exits with 128 + the signal). As a last resort, if the bench itself
//! is killed with SIGKILL, each child has `PR_SET_PDEATHSIG` = SIGTERM.
//!
//! Children run in their own process group, so a Ctrl-C at the terminal reaches only the
//! bench, which then stops clients, servers and `smcd` in that order.
//!
//! The network namespaces of the SMC-R suites are registered too ([`delete_netns_at_exit`])
//! and deleted on each of those paths, after the processes in them have stopped.
//!
//! A pid is unregistered before it is reaped (the exit is observed with `waitid(WNOWAIT)`
//! first), so the cleanup path can never signal a pid the kernel has given to someone else.

use anyhow::{Context, bail};
use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

struct Registry {
    /// Children not yet reaped, in start order.
    pids: Vec<i32>,
    /// Directories to remove at cleanup.
    dirs: Vec<PathBuf>,
    /// Network namespaces to delete at cleanup (after the processes in them are stopped).
    netns: Vec<String>,
    /// Cleanup has begun: no new child may start.
    closing: bool,
}

static REG: Mutex<Registry> = Mutex::new(Registry {
    pids: Vec::new(),
    dirs: Vec::new(),
    netns: Vec::new(),
    closing: false,
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REG.lock().unwrap_or_else(|e| e.into_inner())
}

/// Blocks SIGINT, SIGTERM and SIGHUP and starts the thread that turns them into a cleanup.
/// Call first in `main`, before any other thread exists, so every thread inherits the mask.
/// (Children do not: [`spawn`] clears the mask in the child before exec.)
pub fn install_signal_handler() -> anyhow::Result<()> {
    // SAFETY: sigset_t is plain data that sigemptyset initialises; pthread_sigmask and
    // signalfd only read it. The descriptor returned is owned by the thread below alone.
    let fd = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            bail!("pthread_sigmask failed");
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error()).context("signalfd");
        }
        fd
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            // SAFETY: signalfd_siginfo is plain data; read() writes at most its size into it.
            let signo = unsafe {
                let mut info: libc::signalfd_siginfo = std::mem::zeroed();
                let size = std::mem::size_of::<libc::signalfd_siginfo>();
                loop {
                    let n = libc::read(fd, (&raw mut info).cast(), size);
                    if n == size as isize {
                        break info.ssi_signo as i32;
                    }
                    if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    // The descriptor broke: keep the default of stopping on SIGTERM.
                    break libc::SIGTERM;
                }
            };
            INTERRUPTED.store(true, Ordering::SeqCst);
            eprintln!("\nbench: signal {signo}, stopping everything it started");
            cleanup();
            std::process::exit(128 + signo);
        })
        .context("signal thread")?;
    Ok(())
}

/// Set by the signal thread before it stops everything.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// A signal arrived: the signal thread is stopping everything and will exit the process.
/// The main thread should report nothing more (its children are dying on purpose).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Spawns `cmd` as a registered child: own process group, SIGTERM when the bench dies.
pub fn spawn(cmd: &mut Command) -> anyhow::Result<Child> {
    spawn_in(cmd, true)
}

/// As [`spawn`], but in the bench's process group (for `cargo build`, which should see the
/// terminal's Ctrl-C itself).
pub fn spawn_foreground(cmd: &mut Command) -> anyhow::Result<Child> {
    spawn_in(cmd, false)
}

fn spawn_in(cmd: &mut Command, own_group: bool) -> anyhow::Result<Child> {
    if own_group {
        cmd.process_group(0);
    }
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and calls only sigemptyset,
    // sigprocmask, prctl, getppid and _exit, which are async-signal-safe; the sigset_t is a
    // local the closure owns.
    unsafe {
        cmd.pre_exec(move || {
            // The bench blocks SIGINT/SIGTERM/SIGHUP for its signalfd, and a blocked mask is
            // inherited across exec: unblock them, or a child ignores the SIGTERM that stops
            // it (and needs SIGKILL 2 s later).
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            if libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The bench died between fork and prctl: do not run unsupervised.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let mut reg = registry();
    if reg.closing {
        bail!("stopping: not starting {:?}", cmd.get_program());
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
    reg.pids.push(child.id() as i32);
    Ok(child)
}

/// Registers a directory to remove at cleanup.
pub fn remove_at_exit(dir: PathBuf) {
    registry().dirs.push(dir);
}

/// Registers a network namespace (`ip netns add` name) to delete at cleanup: a signal ends
/// the bench without running destructors.
pub fn delete_netns_at_exit(name: &str) {
    registry().netns.push(name.to_string());
}

/// Deletes a registered network namespace now (`ip netns del`) and forgets it.
pub fn delete_netns(name: &str) {
    registry().netns.retain(|n| n != name);
    netns_del(name);
}

fn netns_del(name: &str) {
    let _ = Command::new("ip")
        .args(["netns", "del", name])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// Has `pid` exited? Leaves it a zombie (`WNOWAIT`), so the pid stays ours.
fn exited(pid: i32) -> bool {
    // SAFETY: siginfo_t is plain data that waitid fills in; si_pid reads the field waitid set
    // (0 when no child changed state, because WNOHANG and the zeroed struct).
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let r = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        // ECHILD: already reaped (should not happen); treat as gone.
        r != 0 || info.si_pid() != 0
    }
}

/// Waits until `child` exits or `deadline` passes; reaps it if it exited.
pub fn wait_until(child: &mut Child, deadline: Option<Instant>) -> io::Result<Option<ExitStatus>> {
    let pid = child.id() as i32;
    let mut nap = Duration::from_micros(200);
    loop {
        if exited(pid) {
            registry().pids.retain(|&p| p != pid);
            return child.wait().map(Some);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(5));
    }
}

/// Stops `child`: SIGTERM, then SIGKILL after `grace`. Returns its exit status.
pub fn stop(child: &mut Child, grace: Duration) -> io::Result<ExitStatus> {
    let pid = child.id() as i32;
    if !exited(pid) {
        // SAFETY: pid is our unreaped child (registered, not yet waited for).
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    if let Some(st) = wait_until(child, Some(Instant::now() + grace))? {
        return Ok(st);
    }
    // SAFETY: as above; it has not exited, so it is still ours.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    Ok(wait_until(child, None)?.expect("no deadline"))
}

/// Stops every registered child (newest first: clients, then servers, then `smcd`),
/// removes the registered directories and deletes the registered network namespaces. Safe to
/// call more than once and from any thread.
pub fn cleanup() {
    let (pids, dirs, netns) = {
        let mut reg = registry();
        reg.closing = true;
        (
            reg.pids.clone(),
            std::mem::take(&mut reg.dirs),
            std::mem::take(&mut reg.netns),
        )
    };
    for &pid in pids.iter().rev() {
        // SAFETY: registered pids are unreaped children (see the module doc), so the pid
        // cannot belong to another process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && !pids.iter().all(|&p| exited(p)) {
        std::thread::sleep(Duration::from_millis(10));
    }
    for &pid in &pids {
        if !exited(pid) {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    for n in netns {
        netns_del(&n);
    }
}

/// Runs [`cleanup`] when dropped (errors and panics in the main thread).
#[derive(Debug)]
pub struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        cleanup();
    }
}

/// Has `child` exited (without reaping it)?
pub fn has_exited(child: &mut Child) -> bool {
    exited(child.id() as i32)
}
