//! The C library's own functions, found once with `dlsym(RTLD_NEXT)` (the next object after
//! this library in the lookup order: libc, or another preload that comes after us) and kept in
//! atomics, so a hook that runs before our constructor (another library's constructor doing
//! I/O) or concurrently with another thread's first call still finds them.

use libc::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Looks `name` (NUL-terminated) up after this library; 0 if it is not there.
fn lookup(name: &[u8]) -> usize {
    debug_assert_eq!(name.last(), Some(&0));
    // SAFETY: `name` is NUL-terminated; RTLD_NEXT is a valid pseudo-handle.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast::<c_char>()) as usize }
}

/// One real function: its address, resolved at the first call (a racing second resolution
/// stores the same value).
pub(crate) struct Real {
    name: &'static [u8],
    addr: AtomicUsize,
}

impl Real {
    pub(crate) const fn new(name: &'static [u8]) -> Self {
        Self {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    /// The address; 0 when the C library has no such function.
    pub(crate) fn get(&self) -> usize {
        let a = self.addr.load(Ordering::Acquire);
        if a != 0 {
            return a;
        }
        let a = lookup(self.name);
        self.addr.store(a, Ordering::Release);
        a
    }
}

/// Defines `pub(crate) unsafe fn NAME(args) -> ret` calling the real function (`ENOSYS` when
/// the C library lacks it, which no supported libc does).
macro_rules! reals {
    ($( $name:ident : fn($($arg:ident : $ty:ty),*) -> $ret:ty; )*) => {
        $(
            #[allow(non_upper_case_globals)]
            pub(crate) unsafe fn $name($($arg: $ty),*) -> $ret {
                static R: Real = Real::new(concat!(stringify!($name), "\0").as_bytes());
                let a = R.get();
                if a == 0 {
                    crate::set_errno(libc::ENOSYS);
                    return -1 as $ret;
                }
                // SAFETY: `a` is the C library's function of this name, whose C signature is
                // the one declared here.
                unsafe {
                    let f: unsafe extern "C" fn($($ty),*) -> $ret = std::mem::transmute(a);
                    f($($arg),*)
                }
            }
        )*
    };
}

reals! {
    socket: fn(domain: c_int, ty: c_int, proto: c_int) -> c_int;
    connect: fn(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int;
    listen: fn(fd: c_int, backlog: c_int) -> c_int;
    accept: fn(fd: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int;
    accept4: fn(fd: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t, flags: c_int) -> c_int;
    read: fn(fd: c_int, buf: *mut c_void, n: usize) -> isize;
    write: fn(fd: c_int, buf: *const c_void, n: usize) -> isize;
    readv: fn(fd: c_int, iov: *const libc::iovec, n: c_int) -> isize;
    writev: fn(fd: c_int, iov: *const libc::iovec, n: c_int) -> isize;
    recv: fn(fd: c_int, buf: *mut c_void, n: usize, flags: c_int) -> isize;
    send: fn(fd: c_int, buf: *const c_void, n: usize, flags: c_int) -> isize;
    recvfrom: fn(fd: c_int, buf: *mut c_void, n: usize, flags: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> isize;
    sendto: fn(fd: c_int, buf: *const c_void, n: usize, flags: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> isize;
    recvmsg: fn(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize;
    sendmsg: fn(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> isize;
    recvmmsg: fn(fd: c_int, msgs: *mut libc::mmsghdr, vlen: libc::c_uint, flags: c_int, timeout: *mut libc::timespec) -> c_int;
    sendmmsg: fn(fd: c_int, msgs: *mut libc::mmsghdr, vlen: libc::c_uint, flags: c_int) -> c_int;
    close: fn(fd: c_int) -> c_int;
    close_range: fn(first: libc::c_uint, last: libc::c_uint, flags: c_int) -> c_int;
    shutdown: fn(fd: c_int, how: c_int) -> c_int;
    dup: fn(fd: c_int) -> c_int;
    dup2: fn(fd: c_int, new: c_int) -> c_int;
    dup3: fn(fd: c_int, new: c_int, flags: c_int) -> c_int;
    fcntl: fn(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int;
    fcntl64: fn(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int;
    ioctl: fn(fd: c_int, req: libc::c_ulong, arg: libc::c_ulong) -> c_int;
    getsockopt: fn(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut libc::socklen_t) -> c_int;
    setsockopt: fn(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: libc::socklen_t) -> c_int;
    getsockname: fn(fd: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int;
    getpeername: fn(fd: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int;
    sendfile: fn(out: c_int, inp: c_int, off: *mut libc::off_t, n: usize) -> isize;
    epoll_create: fn(size: c_int) -> c_int;
    epoll_create1: fn(flags: c_int) -> c_int;
    epoll_ctl: fn(epfd: c_int, op: c_int, fd: c_int, event: *mut libc::epoll_event) -> c_int;
    epoll_wait: fn(ep: c_int, events: *mut libc::epoll_event, max: c_int, timeout: c_int) -> c_int;
    epoll_pwait: fn(ep: c_int, events: *mut libc::epoll_event, max: c_int, timeout: c_int, mask: *const libc::sigset_t) -> c_int;
    epoll_pwait2: fn(ep: c_int, events: *mut libc::epoll_event, max: c_int, timeout: *const libc::timespec, mask: *const libc::sigset_t) -> c_int;
    poll: fn(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int;
    __poll_chk: fn(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int, fdslen: usize) -> c_int;
    ppoll: fn(fds: *mut libc::pollfd, n: libc::nfds_t, ts: *const libc::timespec, mask: *const libc::sigset_t) -> c_int;
    select: fn(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, tv: *mut libc::timeval) -> c_int;
    pselect: fn(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, ts: *const libc::timespec, mask: *const libc::sigset_t) -> c_int;
    sendfile64: fn(out: c_int, inp: c_int, off: *mut libc::off64_t, n: usize) -> isize;
    splice: fn(fd_in: c_int, off_in: *mut libc::loff_t, fd_out: c_int, off_out: *mut libc::loff_t, len: usize, flags: libc::c_uint) -> isize;
    __read_chk: fn(fd: c_int, buf: *mut c_void, n: usize, buflen: usize) -> isize;
    __recv_chk: fn(fd: c_int, buf: *mut c_void, n: usize, buflen: usize, flags: c_int) -> isize;
    execve: fn(path: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char) -> c_int;
    execv: fn(path: *const libc::c_char, argv: *const *const libc::c_char) -> c_int;
    execvp: fn(file: *const libc::c_char, argv: *const *const libc::c_char) -> c_int;
    execvpe: fn(file: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char) -> c_int;
    fexecve: fn(fd: c_int, argv: *const *const libc::c_char, envp: *const *const libc::c_char) -> c_int;
    posix_spawn: fn(pid: *mut libc::pid_t, path: *const libc::c_char, fa: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut libc::c_char, envp: *const *mut libc::c_char) -> c_int;
    posix_spawnp: fn(pid: *mut libc::pid_t, file: *const libc::c_char, fa: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut libc::c_char, envp: *const *mut libc::c_char) -> c_int;
    posix_spawn_file_actions_init: fn(fa: *mut libc::posix_spawn_file_actions_t) -> c_int;
    posix_spawn_file_actions_destroy: fn(fa: *mut libc::posix_spawn_file_actions_t) -> c_int;
    posix_spawn_file_actions_adddup2: fn(fa: *mut libc::posix_spawn_file_actions_t, fd: c_int, new: c_int) -> c_int;
    __recvfrom_chk: fn(fd: c_int, buf: *mut c_void, n: usize, buflen: usize, flags: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> isize;
    getrlimit: fn(resource: c_int, rlim: *mut libc::rlimit) -> c_int;
    setrlimit: fn(resource: c_int, rlim: *const libc::rlimit) -> c_int;
    prlimit: fn(pid: libc::pid_t, resource: c_int, new: *const libc::rlimit, old: *mut libc::rlimit) -> c_int;
    getdtablesize: fn() -> c_int;
    sysconf: fn(name: c_int) -> libc::c_long;
}
