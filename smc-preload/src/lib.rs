//! `libsmc_preload.so`: loaded into an unmodified program with `LD_PRELOAD` (`smc-run`), it
//! makes the program's TCP sockets SMC-capable, as smc-tools' `smc_run` does with the kernel's
//! `AF_SMC`. There is no kernel socket to hand the work to here, so the library emulates the
//! socket API over the engine for the descriptors it takes over:
//!
//! - `socket(AF_INET/AF_INET6, SOCK_STREAM, 0|IPPROTO_TCP)` gives the program a real TCP
//!   socket, marked as a candidate. Everything the program does before `connect`/`listen`
//!   (bind, options) happens to that socket.
//! - `connect` to an address of this host runs the engine's connect (TCP, then CLC or the
//!   kernel's fallback); on a non-blocking socket it returns `EINPROGRESS` and a thread of the
//!   library finishes the handshake (`pending`). An SMC-D connection puts its readiness
//!   socket at the program's descriptor number (`dup3`); a fallback connection puts its TCP
//!   socket there, and from then on the descriptor is plain TCP that the library no longer
//!   looks at. Destinations on other hosts stay plain TCP with no cost beyond one table look.
//! - `listen` makes the program's socket an engine listener; the descriptor becomes the
//!   listener's readiness (readable when `accept` has something), and `accept`/`accept4`
//!   hand out SMC-D connections (readiness sockets) or plain TCP sockets.
//! - The readiness socket shows what a TCP socket would (readable, writable, `POLLRDHUP`,
//!   `POLLHUP`), so `poll`, `select` and every form of `epoll` do their work on it in the
//!   kernel, with edge triggering, one-shot and exclusive wake-ups; the library's hooks for
//!   them settle first what reads left readable (`SmcStream::set_deferred_readiness`), and
//!   `epoll_wait` first reports the level-triggered SMC streams of the set that are ready in
//!   shared memory, without entering the kernel (`ep`).
//! - Data calls (`read`, `write`, `recv*`, `send*`, vectors, `sendfile`, the `_chk` forms),
//!   `shutdown`, `close`, `dup*`, `fcntl`, `ioctl` and the socket options and names are
//!   intercepted for our descriptors and go to the engine (or to the TCP socket under it).
//!
//! - `fork` shares every object with the child (process counts in a shared mapping), a connect
//!   under way included (`pending`); `exec` (the variadic `execl*` too) hands connections
//!   that survive it to a keeper process and passes listeners on as their sockets, and
//!   `posix_spawn` gives connections to the program it starts through a keeper (`exec`).
//!
//! Not done yet (docs/smc-run.md): SMC-R.

mod ep;
mod exec;
mod hooks;
mod limits;
mod pending;
mod real;
mod table;

pub(crate) use hooks::set_errno;

/// The environment is read before the program runs (see `hooks::init`).
#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = hooks::init;
