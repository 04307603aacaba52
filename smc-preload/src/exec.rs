//! `exec` with SMC descriptors that are not close-on-exec: the new program gets a working
//! connection, as the kernel's socket survives `exec`.
//!
//! An SMC connection here is the engine's state in this process's memory (cursors, the
//! buffers mapped, the peer's bell) behind a readiness socket at the program's number; `exec`
//! replaces the memory and keeps only the descriptors. The `exec` hooks therefore hand each
//! such connection to a *keeper*: a process forked just before the `exec` (and detached from
//! the new program, whose parent it is not: it is forked from a short-lived intermediate) that
//! holds the connection and copies bytes both ways between it and an `AF_UNIX` stream socket
//! whose other end the hook puts at every inheritable number of the connection. The keeper
//! waits on a close-on-exec pipe: end of file says the `exec` went through, a byte that it
//! failed (then the hook puts the connection back at its numbers, takes its process counts
//! back, and the keeper lets go and exits). Why a keeper and not a re-attach in the new image:
//! `docs/smc-run.md`, "exec".
//!
//! What the new program sees is the kernel's: a stream socket whose reads, writes, readiness,
//! `shutdown` and close are real. Its end of stream is the connection's (the keeper shuts down
//! the socket's write side when the peer's data ends, and the connection's write side when
//! the program's does), its close ends the connection once the keeper has passed on what was
//! in flight. It is `AF_UNIX` (names, TCP options and `SO_DOMAIN` say so), and each byte is
//! copied once more.
//!
//! Every other object the process holds is let go of before the `exec` (its process count
//! drops), so its last holder elsewhere still ends it; one that only this process held ends
//! when `exec` closes its descriptors (close-on-exec: its TCP socket closes, which the peer
//! sees). The keeper closes its copies of the program's descriptors and of the TCP sockets
//! under every object it was not given, so it keeps nothing else alive.
//!
//! A listener that survives the `exec` goes on as its listening socket
//! ([`hand_over_listeners`]). `posix_spawn`, whose `execve` runs inside the C library, gives
//! connections to the program it starts through a socket pair whose far end a keeper serves
//! once the spawner let go of the connection ([`spawn_before`], [`keep_spawned`]).

use crate::real;
use crate::table::{self, Obj, Stream};
use libc::c_int;
use rustix::fd::{AsRawFd, OwnedFd};
use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::sync::Arc;

/// What [`before`] did, for [`failed`].
#[derive(Debug, Default)]
pub(crate) struct Handover {
    /// Objects whose process count this process gave up.
    let_go: Vec<Obj>,
    /// Program descriptors now a keeper's socket, and what they were (a copy).
    moved: Vec<(c_int, OwnedFd)>,
    /// The write end of the keeper's pipe.
    go: Option<OwnedFd>,
}

/// One connection handed to the keeper: the stream, the program's numbers that survive the
/// `exec`.
struct Handed {
    st: Arc<Stream>,
    fds: Vec<c_int>,
}

fn cloexec(fd: c_int) -> bool {
    crate::hooks::fd_flags(fd).0
}

/// Before an `exec`: hands the connections that survive it to a keeper, lets go of every
/// object. `None` when the process has none.
pub(crate) fn before() -> Option<Handover> {
    if table::all().is_empty() {
        return None;
    }
    // First, so that a keeper forked below holds nothing of theirs.
    hand_over_listeners();
    let all = table::all();
    let mut handed: Vec<Handed> = Vec::new();
    for (fd, o) in &all {
        if let Obj::Stream(st) = o
            && !cloexec(*fd)
        {
            match handed.iter_mut().find(|h| Arc::ptr_eq(&h.st, st)) {
                Some(h) => h.fds.push(*fd),
                None => handed.push(Handed {
                    st: Arc::clone(st),
                    fds: vec![*fd],
                }),
            }
        }
    }
    // Nothing of this frame may hold a stream when the keeper forks (it never returns here,
    // and a stream ends with the last reference in a process).
    drop(all);
    let mut h = Handover::default();
    if !handed.is_empty() {
        let keeper = pairs(handed.len()).and_then(|(near, far)| {
            let raw: Vec<c_int> = near.iter().map(AsRawFd::as_raw_fd).collect();
            Ok((spawn_keeper(&handed, far, &raw)?, near))
        });
        match keeper {
            Ok((go, near)) => {
                h.go = Some(go);
                for (x, a) in handed.iter().zip(near) {
                    // O_NONBLOCK belongs to the open file, which exec keeps: so does this one.
                    let nb = x.st.nonblocking.load(std::sync::atomic::Ordering::Relaxed);
                    let _ = rustix::io::ioctl_fionbio(&a, nb);
                    for &fd in &x.fds {
                        let Ok(saved) = rustix::io::fcntl_dupfd_cloexec(
                            // SAFETY: the program's descriptor, ours (a stream).
                            unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) },
                            smcd_engine::sys::fd_band().max(0),
                        ) else {
                            continue;
                        };
                        if crate::hooks::place(a.as_raw_fd(), fd, false).is_ok() {
                            h.moved.push((fd, saved));
                        }
                    }
                }
                crate::hooks::debug(format_args!(
                    "exec: {} SMC connection(s) handed to a keeper",
                    handed.len()
                ));
            }
            Err(e) => crate::hooks::debug(format_args!("exec: no keeper ({e}): connections end")),
        }
    }
    let mut seen = BTreeSet::new();
    for (_, o) in table::all() {
        if seen.insert(table::id(&o)) {
            table::let_go(&o);
            h.let_go.push(o);
        }
    }
    Some(h)
}

/// Listeners with a descriptor that is not close-on-exec: the new program gets the listening
/// socket itself at their numbers (as the kernel's survives `exec`), so it can accept from it
/// whether or not it loads the library. Each is withdrawn first (smcd answers intents for it
/// with plain TCP, its keys leave the SMC option program's map), since the new program may
/// take a Proposal for data; a new image that loads the library finds it at load time and
/// makes it an SMC listener again at its first `accept` or `epoll_ctl` (`table::INHERITED`).
/// This process's own listener on it (or its view, a forked worker's) stops, without shutting
/// the socket down; what it had accepted and the program had not is closed. The listener is
/// this process's no longer: if the `exec` fails, the numbers stay the plain listening socket,
/// made an SMC listener again in the same way.
fn hand_over_listeners() {
    let mut handed: Vec<(Arc<table::Listener>, Vec<c_int>)> = Vec::new();
    let mut inheritable = BTreeSet::new();
    for (fd, o) in table::all() {
        if let Obj::Listener(l) = o {
            if !cloexec(fd) {
                inheritable.insert(Arc::as_ptr(&l) as usize);
            }
            match handed.iter_mut().find(|(x, _)| Arc::ptr_eq(x, &l)) {
                Some((_, fds)) => fds.push(fd),
                None => handed.push((l, vec![fd])),
            }
        }
    }
    handed.retain(|(l, _)| inheritable.contains(&(Arc::as_ptr(l) as usize)));
    for (l, fds) in handed {
        l.l.withdraw();
        // Whoever holds it last here leaves the socket (and the option map) alone.
        l.set_handed_on();
        let tcp = l.l.tcp_socket().as_raw_fd();
        // Not released: that would end the listener (its last descriptor).
        let mut refs = vec![Obj::Listener(Arc::clone(&l))];
        for &fd in &fds {
            let keep_cloexec = cloexec(fd);
            if crate::hooks::place(tcp, fd, keep_cloexec).is_ok()
                && let Some(o) = table::remove(fd)
            {
                refs.push(o);
                table::set_kind(fd, table::INHERITED);
            }
        }
        let obj = &refs[0];
        let last = table::let_go(obj);
        if last {
            // O_NONBLOCK is the socket's, which the engine set: the program's own again. (Not
            // while other processes accept from it: their engines need it.)
            let nb = l.nonblocking.load(std::sync::atomic::Ordering::Relaxed);
            let _ = rustix::io::ioctl_fionbio(l.l.tcp_socket(), nb);
        }
        if let Some(v) = l.own_view() {
            v.detach();
        }
        crate::hooks::debug(format_args!(
            "exec: listener on fd {fds:?} goes on as its listening socket"
        ));
        if l.pid == std::process::id() {
            // Detached: its end (the last reference) leaves the socket alone.
            l.l.detach();
        } else {
            // Another process's listener, copied by fork: its state here is not ours to end
            // (dropping it would shut the socket down).
            std::mem::forget(refs);
            std::mem::forget(l);
        }
    }
}

/// The `exec` failed (it returned): everything as it was, the keeper told to go.
pub(crate) fn failed(h: Handover) {
    for o in &h.let_go {
        table::hold_again(o);
    }
    for (fd, saved) in &h.moved {
        let _ = crate::hooks::place(saved.as_raw_fd(), *fd, false);
    }
    if let Some(go) = &h.go {
        let _ = rustix::io::write(go, b"x");
    }
}

/// `n` socket pairs (close-on-exec): the program's ends, the keeper's ends.
fn pairs(n: usize) -> io::Result<(Vec<OwnedFd>, Vec<OwnedFd>)> {
    let mut near = Vec::new();
    let mut far = Vec::new();
    for _ in 0..n {
        let (a, b) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        near.push(a);
        far.push(b);
    }
    Ok((near, far))
}

/// What [`spawn_before`] did, for [`spawn_after`]: program descriptors that are the spawned
/// program's socket for the call, what they were (a copy), close-on-exec.
#[derive(Debug)]
pub(crate) struct SpawnHandover {
    moved: Vec<(c_int, OwnedFd, bool)>,
}

/// Before `posix_spawn`, whose `execve` runs inside the C library where no hook sees it: the
/// connections the new program can see (descriptors that are not close-on-exec, and `extra`:
/// the ones its file actions `dup2`) get an `AF_UNIX` socket pair each (made at the first
/// such call, kept with the stream), and for the call their numbers are the pair's near end,
/// which the new program inherits or copies with its file actions; [`spawn_after`] puts the
/// connections back. This process goes on holding them and is the only one to use their
/// engine state (which lives in its memory), so the far end waits, unread, until the last
/// process holding the connection lets go of it: then a keeper carries it for the programs
/// started ([`keep_spawned`]). Until then their writes wait in the socket, and they read
/// nothing.
pub(crate) fn spawn_before(extra: &[c_int]) -> Option<SpawnHandover> {
    use std::sync::atomic::Ordering;
    let mut moved = Vec::new();
    for (fd, o) in table::all() {
        let Obj::Stream(st) = o else { continue };
        let ce = cloexec(fd);
        if ce && !extra.contains(&fd) {
            continue;
        }
        if st.spawn_near.load(Ordering::Acquire) < 0 {
            let Ok((mut near, mut far)) = pairs(1) else {
                continue;
            };
            let (Some(near), Some(far)) = (near.pop(), far.pop()) else {
                continue;
            };
            let near = smcd_engine::sys::banded(near);
            let far = smcd_engine::sys::banded(far);
            // O_NONBLOCK belongs to the open file, which the new program shares.
            let nb = st.nonblocking.load(Ordering::Relaxed);
            let _ = rustix::io::ioctl_fionbio(&near, nb);
            use rustix::fd::IntoRawFd;
            st.spawn_far.store(far.into_raw_fd(), Ordering::Release);
            st.spawn_near.store(near.into_raw_fd(), Ordering::Release);
        }
        let near = st.spawn_near.load(Ordering::Acquire);
        let Ok(saved) = rustix::io::fcntl_dupfd_cloexec(
            // SAFETY: the program's descriptor, ours (a stream).
            unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) },
            smcd_engine::sys::fd_band().max(0),
        ) else {
            continue;
        };
        if crate::hooks::place(near, fd, ce).is_ok() {
            moved.push((fd, saved, ce));
        }
    }
    if moved.is_empty() {
        return None;
    }
    crate::hooks::debug(format_args!(
        "posix_spawn: SMC connection(s) on fd {:?} go to the new program through a socket",
        moved.iter().map(|m| m.0).collect::<Vec<_>>()
    ));
    Some(SpawnHandover { moved })
}

/// After `posix_spawn`: the connections back at their numbers.
pub(crate) fn spawn_after(h: SpawnHandover) {
    for (fd, saved, ce) in &h.moved {
        let _ = crate::hooks::place(saved.as_raw_fd(), *fd, *ce);
    }
}

/// The last process holding a connection that programs started with `posix_spawn` may hold
/// let go of it: a keeper (forked now, so it has the connection's state as it is) copies
/// bytes between the connection and the socket pair's far end, as for `exec`; when none of
/// those programs holds its end any more, the keeper finds end of stream there at once and
/// the connection ends as it would have here.
pub(crate) fn keep_spawned(st: &Arc<Stream>) -> io::Result<()> {
    use std::sync::atomic::Ordering;
    let take = |a: &std::sync::atomic::AtomicI32| {
        let fd = a.swap(-1, Ordering::AcqRel);
        // SAFETY: ours, taken out of the field.
        (fd >= 0).then(|| unsafe { <OwnedFd as rustix::fd::FromRawFd>::from_raw_fd(fd) })
    };
    // This process's copy of the near end goes first (only the programs started hold it).
    drop(take(&st.spawn_near));
    let Some(far) = take(&st.spawn_far) else {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    };
    let handed = vec![Handed {
        st: Arc::clone(st),
        fds: Vec::new(),
    }];
    // The keeper takes this process's count over (the caller keeps it: it holds no
    // descriptor, and the object is not in the table, so the fork does not count it again).
    let go = spawn_keeper(&handed, vec![far], &[])?;
    // End of file: go on at once.
    drop(go);
    crate::hooks::debug(format_args!(
        "a connection given to a spawned program: handed to a keeper"
    ));
    Ok(())
}

/// Forks the keeper (through an intermediate that exits at once, so the keeper is not the new
/// program's child) for the streams `handed`, each served through the socket `far`; the write
/// end of the pipe it waits on (end of file: go on; a byte: let go). `near`: the program's ends,
/// which the keeper must not hold (it would never see their end of stream).
fn spawn_keeper(handed: &[Handed], far: Vec<OwnedFd>, near: &[c_int]) -> io::Result<OwnedFd> {
    let (rd, wr) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    // SAFETY: fork; the child runs only the code below and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // The intermediate: its fork's prepare handler counted it in for every object, as
        // the keeper's counts the keeper.
        // SAFETY: as above.
        let k = unsafe { libc::fork() };
        if k == 0 {
            drop(wr);
            for &fd in near {
                // SAFETY: this process's copies of the caller's descriptors; the caller's
                // frame never runs here.
                unsafe { real::close(fd) };
            }
            // A panic must not unwind into the hook that forked this process (it would go
            // on to the program's exec).
            let _ =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| keeper(rd, far, handed)));
            // SAFETY: leaves the keeper.
            unsafe { libc::_exit(1) };
        }
        let _ = std::panic::catch_unwind(|| {
            let mut seen = BTreeSet::new();
            for (_, o) in table::all() {
                if seen.insert(table::id(&o)) {
                    table::let_go(&o);
                }
            }
        });
        // SAFETY: leaves the intermediate without running the program's exit handlers.
        unsafe { libc::_exit(i32::from(k < 0)) };
    }
    drop(rd);
    drop(far);
    let mut status = 0;
    // SAFETY: waits for the intermediate we forked.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    if r != pid || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(io::Error::other("the keeper could not be forked"));
    }
    Ok(wr)
}

/// The keeper: waits for the `exec`'s outcome, then copies bytes until both directions end.
fn keeper(go: OwnedFd, far: Vec<OwnedFd>, handed: &[Handed]) -> ! {
    crate::hooks::in_lib_for_good();
    // The program's handlers are not for this process; a closed socket is an error here.
    for sig in 1..32 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            let how = if sig == libc::SIGPIPE {
                libc::SIG_IGN
            } else {
                libc::SIG_DFL
            };
            // SAFETY: resetting a disposition.
            unsafe { libc::signal(sig, how) };
        }
    }
    let mut one = [0u8; 1];
    let aborted = loop {
        match rustix::io::read(&go, &mut one) {
            Ok(0) => break false,
            Ok(_) => break true,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break true,
        }
    };
    drop(go);
    let mine: BTreeSet<usize> = handed.iter().map(|h| Arc::as_ptr(&h.st) as usize).collect();
    // Everything else this process inherited stays out of it: the program's descriptors and
    // the TCP sockets under the objects it was not given (their last holder ends them).
    let far: Vec<OwnedFd> = far.into_iter().map(smcd_engine::sys::banded).collect();
    let band = smcd_engine::sys::fd_band();
    // References to streams elsewhere in this copy of the library: the list of readiness to
    // settle (the program will not wait here).
    drop(table::take_dirty());
    let objs = table::remove_range(0, u32::MAX);
    let mut seen = BTreeSet::new();
    for o in objs {
        if let Obj::Stream(s) = &o {
            // Sockets for programs started with posix_spawn: their keepers' (or their last
            // holder's) to serve, and an end of file there must not wait for this process.
            for end in [&s.spawn_near, &s.spawn_far] {
                let fd = end.swap(-1, std::sync::atomic::Ordering::AcqRel);
                if fd >= 0 {
                    // SAFETY: this process's copy, out of the field.
                    unsafe { real::close(fd) };
                }
            }
        }
        let ours = matches!(&o, Obj::Stream(s) if mine.contains(&(Arc::as_ptr(s) as usize)));
        if ours {
            drop(o);
            continue;
        }
        if seen.insert(table::id(&o)) {
            table::let_go(&o);
            let fd = match &o {
                Obj::Connecting(p) => p.tcp_fd(),
                o => crate::hooks::tcp_fd(o),
            };
            if fd >= 0 {
                // SAFETY: this process's copy of the number, which nothing here uses.
                unsafe { real::close(fd) };
            }
        }
        // Not ended from here: other processes hold them.
        std::mem::forget(o);
    }
    if band > 0 {
        // SAFETY: closes this process's copies of the program's numbers (raw, past the hooks).
        unsafe { libc::syscall(libc::SYS_close_range, 0u32, (band - 1) as u32, 0u32) };
    }
    if aborted {
        for h in handed {
            table::let_go(&Obj::Stream(Arc::clone(&h.st)));
        }
        // SAFETY: leaves without ending anything: the program keeps its connections.
        unsafe { libc::_exit(0) };
    }
    let mut threads = Vec::new();
    for (h, b) in handed.iter().zip(far) {
        let st = Arc::clone(&h.st);
        // SAFETY: `handed` belongs to the frame of the hook that forked this process, which
        // never runs again here (this function leaves with _exit): its references are dead,
        // and the stream must end with the last one this process really uses.
        unsafe { Arc::decrement_strong_count(Arc::as_ptr(&h.st)) };
        threads.push(std::thread::spawn(move || splice(st, b)));
    }
    for t in threads {
        let _ = t.join();
    }
    // SAFETY: the keeper ends here.
    unsafe { libc::_exit(0) }
}

/// Copies bytes between the connection and the program's socket both ways until both ends
/// are done, then lets go of the connection (ending it if this was its last holder).
fn splice(st: Arc<Stream>, b: OwnedFd) {
    let _ = st.s.set_nonblocking(false);
    let b = Arc::new(b);
    let down = {
        let (st, b) = (Arc::clone(&st), Arc::clone(&b));
        std::thread::spawn(move || {
            crate::hooks::in_lib_for_good();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match (&st.s).read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if send_all(&b, &buf[..n]).is_err() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = rustix::net::shutdown(&*b, rustix::net::Shutdown::Write);
        })
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match rustix::io::read(&*b, &mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if (&st.s).write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
    }
    let _ = st.s.shutdown(std::net::Shutdown::Write);
    let _ = down.join();
    drop(b);
    let obj = Obj::Stream(st);
    if table::let_go(&obj) {
        drop(obj);
    } else {
        std::mem::forget(obj);
    }
}

fn send_all(b: &OwnedFd, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match rustix::net::send(b, data, rustix::net::SendFlags::NOSIGNAL) {
            Ok(n) => data = &data[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The C library's `vfork`, found when the library is loaded (0: not found, or not yet).
pub(crate) static REAL_VFORK: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Finds the C library's `vfork` (the library's constructor, before the program runs).
pub(crate) fn find_vfork() {
    // SAFETY: dlsym with a NUL-terminated name; the address is only jumped to as `vfork`.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"vfork".as_ptr()) };
    REAL_VFORK.store(f as usize, std::sync::atomic::Ordering::Release);
}

// `vfork` while this process holds SMC objects is a `fork`.
//
// A `vfork` child runs in its parent's memory, which holds the SMC connections on: it can
// hand none of them to the program it execs (`table::borrowed_memory`), so a connection
// CPython's `subprocess` gives a child (`stdin=sock`, `pass_fds`) was a dead socket there.
// A `fork` child has a copy of the memory and the fork handlers' process counts, so its
// `exec` hands each inheritable connection to a keeper as any forked child's does. POSIX
// allows `vfork` to be `fork` (a child that does more than `exec` or `_exit` is undefined
// behaviour either way), and the C library's `posix_spawn`, which does not call `vfork`, is
// handled by its own hooks. What it costs: a `fork` copies the page tables (the parent runs
// on while the child starts instead of waiting for its `exec`), so only a process with SMC
// descriptors pays it; the others get the C library's `vfork` itself.
//
// The hook must not be an ordinary function: a `vfork` child returns through its parent's
// stack, so the frame of a wrapper would be the parent's too. It is a naked function that
// looks at the count of objects and jumps, stack and registers as the caller left them
// (`rax` or `x16`/`x17` are scratch at a call), to the C library's `vfork` or `fork`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod vfork_hook {
    /// `vfork(2)`: the C library's when this process has no SMC descriptor, else `fork`
    /// (see above).
    ///
    /// # Safety
    /// As the C library's.
    #[unsafe(no_mangle)]
    #[unsafe(naked)]
    pub unsafe extern "C" fn vfork() -> libc::pid_t {
        #[cfg(target_arch = "x86_64")]
        std::arch::naked_asm!(
            "mov rax, qword ptr [rip + {n}]",
            "test rax, rax",
            "jnz 2f",
            "mov rax, qword ptr [rip + {real}]",
            "test rax, rax",
            "jz 2f",
            "jmp rax",
            "2:",
            "jmp {fork}",
            n = sym crate::table::N_OBJS,
            real = sym super::REAL_VFORK,
            fork = sym libc::fork,
        );
        #[cfg(target_arch = "aarch64")]
        std::arch::naked_asm!(
            "adrp x16, {n}",
            "ldr x16, [x16, :lo12:{n}]",
            "cbnz x16, 2f",
            "adrp x17, {real}",
            "ldr x17, [x17, :lo12:{real}]",
            "cbz x17, 2f",
            "br x17",
            "2:",
            "b {fork}",
            n = sym crate::table::N_OBJS,
            real = sym super::REAL_VFORK,
            fork = sym libc::fork,
        );
    }
}
