//! What an established link does for one connection: move bytes into the peer's buffer,
//! publish CDCs, hand over the peer's CDCs and completed sends, and wake waiters. The
//! connection driver (`driver::conn`) is generic over [`Transport`]; SMC-D loopback is the
//! first implementation ([`smcd::SmcdLink`]); SMC-R (RDMA WRITE plus a CDC SEND whose completion
//! comes later) is the second the trait is shaped for.
//!
//! # Waiting
//!
//! A thread that blocks in a call sleeps on the link itself ([`Transport::sleep`]; SMC-D: a
//! futex on the waiting word in the shared metadata page), after announcing that it waits
//! ([`Transport::arm`] with [`Waiter::Thread`]) and looking once more; whoever then changes
//! what it waits for takes the announcement and wakes it. No descriptor is needed for that,
//! so a connection that only blocking calls use makes none.
//!
//! # Readiness
//!
//! For event loops a connection has a [`Readiness`], made when the application first asks for
//! the descriptor ([`Transport::make_readiness`]): a Unix socket pair whose end `A` is the
//! descriptor an event loop waits on, and whose end `B` is the bell that moves `A` between
//! states:
//!
//! | `A` is | because |
//! |---|---|
//! | readable | a byte written into `B` is waiting (the peer or we rang the reader), or `B` was shut down for writing (end of stream, for good) |
//! | not writable | a filler written into `A` is waiting in `B` (a writer found no space); reading it out of `B` (ringing the writer) makes `A` writable again |
//! | hung up | `B` was shut down both ways: the connection ended or was aborted |
//!
//! A non-blocking call that finds nothing to do first clears that readiness, then announces
//! the wait ([`Waiter::Event`]), then checks its condition again; whoever then changes the
//! condition takes the announcement and rings the bell once. That is the kernel's
//! `sk_data_ready` / `sk_write_space`, for descriptors that `poll`, `epoll` (level or edge
//! triggered) and tokio's `AsyncFd` understand, with a system call only on the transitions.

pub mod smcd;
pub mod smcr;

use crate::device::Dir;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{RecvFlags, SendFlags, Shutdown};
use smc_core::conn::{HostCdc, RemoteWrite};
use std::io;
use std::time::Duration;

/// Who waits for a direction of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiter {
    /// An event loop, on the readiness descriptor: ring its bell.
    Event,
    /// A thread in [`Transport::sleep`]: wake it.
    Thread,
}

/// An established link endpoint for one connection.
///
/// All methods take `&self`: the connection calls the data-path ones under its own lock, and
/// [`Transport::arm`] / [`Transport::sleep`] / [`Transport::readiness`] from waiting threads
/// without it.
pub trait Transport: Send + Sync + std::fmt::Debug + 'static {
    /// Whether [`Transport::recv_cdc`] returns the peer's current state rather than the next
    /// of a queue (SMC-D: the two words; SMC-R: a queue of SENDs): then one call per look is
    /// enough.
    const CDC_IS_STATE: bool = false;
    /// Copies application bytes into the transmit buffer at `offset` (wrapping at its end):
    /// for SMC-D "DMB no-copy" the peer's ring, for a staged transport the local send buffer.
    fn write_tx(&self, offset: usize, data: &[u8]);
    /// Copies received bytes out of the local receive ring at `offset` (wrapping).
    fn read_rx(&self, offset: usize, out: &mut [u8]);
    /// Writes part of the send buffer into the peer's ring (RDMA WRITE; staged transports
    /// only).
    fn write_remote(&self, w: &RemoteWrite) -> io::Result<()>;
    /// Publishes a CDC and wakes the peer if it waits for what it announces. Without
    /// `cons_changed` only its producer cursor differs from the CDC before
    /// ([`smc_core::conn::Effects::cdc_cons_changed`]).
    fn send_cdc(&self, cdc: &HostCdc, cons_changed: bool) -> io::Result<()>;
    /// The RDMA WRITEs of one push, then its CDC: what [`Transport::write_remote`] for each
    /// and [`Transport::send_cdc`] do, in that order; a transport may post them together (one
    /// doorbell for the chain).
    fn post_writes_and_cdc(
        &self,
        writes: &[RemoteWrite],
        cdc: &HostCdc,
        cons_changed: bool,
    ) -> io::Result<()> {
        for w in writes {
            self.write_remote(w)?;
        }
        self.send_cdc(cdc, cons_changed)
    }
    /// The peer's next CDC, if there is one the connection has not seen (SMC-D: the words in
    /// the local DMB changed).
    fn recv_cdc(&self) -> Option<HostCdc>;
    /// Whether [`Transport::recv_cdc`] would return something: a cheap check for spinning.
    fn cdc_pending(&self) -> bool;
    /// Whether the transport spins in [`Transport::sleep_spinning`] rather than be spun on
    /// ([`Transport::cdc_pending`]): its arrivals need work in the waiting thread (SMC-R over
    /// a soft device: busy polling). A constant, so the bookkeeping for it
    /// ([`crate::driver::conn::SmcConn`]'s "an answer is due") is not even compiled for the
    /// others.
    const SPINS_IN_SLEEP: bool = false;
    /// How many pieces a read that takes a whole receive ring copies it in, the window rule
    /// running after each (so a writer waiting for room refills the ring while the rest is
    /// copied). Each consumer update the rule then sends costs what a CDC costs: on SMC-D a
    /// store, so quarters (measured: halves cost 256 KiB streams about 10 %); on SMC-R a
    /// SEND and the peer's wake-up, so halves (measured: quarters cost 64 KiB streams about
    /// a quarter of their rate).
    const RX_PIECES: usize = 4;
    /// [`Transport::sleep`] after up to `spin` of busy polling; also how long the spin took
    /// when it was answered.
    fn sleep_spinning(
        &self,
        dir: Dir,
        timeout: Option<Duration>,
        spin: Duration,
    ) -> io::Result<(bool, Option<Duration>)> {
        let _ = spin;
        Ok((self.sleep(dir, timeout)?, None))
    }
    /// The sequence number of a CDC send that completed since the last call (staged
    /// transports; SMC-D sends complete when they are made).
    fn poll_completion(&self) -> Option<u16>;
    /// Whether a completion or a CDC may be waiting: `false` only when neither
    /// [`Transport::poll_completion`] nor [`Transport::recv_cdc`] would return anything (the
    /// data path's check before it calls them).
    fn events_pending(&self) -> bool {
        true
    }
    /// Hands on whatever the device has received for the link but nobody has taken yet
    /// (SMC-R: completions still in the receive queue), so that [`Transport::recv_cdc`] sees
    /// every CDC that arrived before now. Called before the end of the TCP connection is
    /// taken for the peer's disappearance: the peer's close CDC arrived before its FIN.
    fn settle(&self) {}
    /// Whether the link under the connection failed since the last call (SMC-R: an error
    /// completion or the link group's end); the connection is then reset, as the kernel's
    /// `smc_conn_kill` does.
    /// Whether the connection was moved to another link of its group since the last call
    /// (SMC-R failover): the connection then rolls its send side back to the last completed
    /// CDC, sends the failover-validation CDC and writes the rest again
    /// ([`smc_core::conn::Connection::failover`]). Called under the connection's lock before
    /// anything else is posted.
    fn take_switch(&self) -> bool {
        false
    }
    fn take_failure(&self) -> bool {
        false
    }
    /// Announces that `who` waits for `dir`: the next change wakes it.
    fn arm(&self, dir: Dir, who: Waiter);
    /// After [`Transport::arm`] with [`Waiter::Thread`] and a second look: sleeps until woken,
    /// a signal, or `timeout` (then `Ok(false)`). Returns at once if the announcement was
    /// taken meanwhile.
    fn sleep(&self, dir: Dir, timeout: Option<Duration>) -> io::Result<bool>;
    /// A thread starts a blocking wait on the connection. Until [`Transport::wait_end`] it
    /// looks at whatever arrives before it returns (the callers of a wait look at the
    /// connection next), so a transport that would have the connection's processing run
    /// elsewhere for an arrival ([`Transport::set_service`]) may leave it to that thread.
    fn wait_begin(&self) {}
    /// Whether a thread about to wait to read needs to see our CDC sends complete: only when
    /// a completion lets the connection do something (send what autocork held back, end the
    /// TCP connection after the last CDC, move a close on). A transport whose completions
    /// arrive apart from the peer's CDCs (SMC-R: ACKs) then leaves such a reader asleep.
    fn reader_needs_completions(&self, needs: bool) {
        let _ = needs;
    }
    /// The wait begun by [`Transport::wait_begin`] ends; returns whether anything is pending
    /// now (then the caller must look at the connection, even when its wait timed out).
    fn wait_end(&self) -> bool {
        false
    }
    /// Takes back an event waiter's announcement for `dir` ([`Transport::arm`] with
    /// [`Waiter::Event`]) that the peer has not taken yet: `true` when it was still there, so
    /// no ring for it will come. A transport that cannot says `false`.
    fn withdraw(&self, _dir: Dir) -> bool {
        false
    }
    /// Before an event waiter's announcement of the reader: the owner's sleep it belongs to
    /// (0: none), so that the peer rings once per sleep (SMC-D's `Dmb::set_rx_tag`). A
    /// transport without it ignores it.
    fn set_rx_tag(&self, _tag: u64) {}
    /// The reader's announcement no longer belongs to a sleep; `true` when the peer took it
    /// without ringing (SMC-D's `Dmb::untag_rx`).
    fn untag_rx(&self) -> bool {
        false
    }
    /// Whether the reader's announcement belongs to a tagged sleep now (SMC-D's
    /// `Dmb::rx_tagged`).
    fn rx_tagged(&self) -> bool {
        false
    }
    /// After a local change: wakes the local waiters for `dir` if they announced waiting.
    fn wake_local(&self, dir: Dir);
    /// Before the readiness for `dir` is cleared: waits for bells still being rung for
    /// announcements already taken, so none lands after the clear (SMC-D's
    /// `Dmb::await_rings`).
    fn await_rings(&self, _dir: Dir) {}
    /// The connection's readiness, if the application asked for it.
    fn readiness(&self) -> Option<&Readiness>;
    /// The connection's readiness, made now if it does not exist yet (then `true`: the caller
    /// makes it show the connection's state), or `given`: a pair made before the connection
    /// existed (a non-blocking connect's descriptor), which must be the first. The peer can
    /// ring it from then on.
    fn make_readiness(&self, given: Option<Readiness>) -> io::Result<(&Readiness, bool)>;
    /// Gives the transport a way to run the connection's CDC processing when no application
    /// thread is in the connection (the kernel does it in the CDC receive tasklet): a staged
    /// transport's send buffer is pushed when the peer's window opens, whoever is there.
    /// `service` returns `false` when it could not run now (a thread holds the connection and
    /// will look itself, or the transport retries). SMC-D needs none: its bytes are in the
    /// peer's buffer when `write` returns.
    fn set_service(&self, _service: Box<dyn Fn() -> bool + Send + Sync>) {}
}

/// A connection that has its readiness already was given another.
pub(crate) fn already_ready() -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        "the connection has its readiness descriptor already",
    )
}

/// The far end of a readiness pair: ringing it changes what the near end reports.
#[derive(Debug)]
pub struct Bell {
    b: OwnedFd,
}

/// One filler's worth of bytes: with the near end's send buffer at its minimum, one filler
/// makes it unwritable (`unix_writable`: queued bytes × 4 ≤ sndbuf).
const FILLER: [u8; 2048] = [0; 2048];

impl Bell {
    /// The far end of a peer's readiness pair, as it arrived.
    pub fn from_fd(b: OwnedFd) -> Self {
        Self { b }
    }

    /// The near end's peer is done writing: the near end shows end of stream (`POLLIN`,
    /// `POLLRDHUP`) for good, whoever waits on it, without a call into the connection.
    pub fn shut_write(&self) {
        let _ = rustix::net::shutdown(&self.b, Shutdown::Write);
    }

    /// Wakes the waiter for `dir`: a reader by making the near end readable, a writer by taking
    /// the filler out so the near end is writable. Never blocks; a bell whose near end is gone
    /// rings nobody.
    #[cold]
    #[inline(never)]
    pub fn ring(&self, dir: Dir) {
        match dir {
            Dir::Rx => {
                let _ = rustix::net::send(&self.b, &[1], SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
            }
            Dir::Tx => drain(self.b.as_fd()),
        }
    }
}

#[cold]
#[inline(never)]
fn drain(fd: BorrowedFd<'_>) {
    let mut buf = [0u8; 4096];
    while let Ok((n, _)) = rustix::net::recv(fd, &mut buf, RecvFlags::DONTWAIT) {
        if n < buf.len() {
            break;
        }
    }
}

/// A connection's readiness pair (see the module docs).
#[derive(Debug)]
pub struct Readiness {
    a: OwnedFd,
    bell: Bell,
}

impl Readiness {
    /// A pair for a connection that does not exist yet (a non-blocking connect's
    /// descriptor, as a TCP socket whose connect is under way): neither readable nor writable
    /// until the connection, given this pair ([`crate::SmcStream::adopt_readiness`]), shows
    /// its state.
    pub fn waiting() -> io::Result<Self> {
        let r = Self::new()?;
        r.clear_writable();
        Ok(r)
    }

    /// A new pair: not readable, writable.
    pub fn new() -> io::Result<Self> {
        use rustix::net::{AddressFamily, SocketFlags, SocketType};
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )?;
        // The kernel raises this to its minimum (SOCK_MIN_SNDBUF): one filler then fills it.
        rustix::net::sockopt::set_socket_send_buffer_size(&a, 1)?;
        Ok(Self {
            a: crate::sys::banded(a),
            bell: Bell {
                b: crate::sys::banded(b),
            },
        })
    }

    /// The descriptor to wait on.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.a.as_fd()
    }

    /// The local bell.
    pub fn bell(&self) -> &Bell {
        &self.bell
    }

    /// The far end, to pass to the peer (`SCM_RIGHTS` gives it its own copy) so it can
    /// ring the bell itself.
    pub fn far_end(&self) -> BorrowedFd<'_> {
        self.bell.b.as_fd()
    }

    /// A copy of the far end (for a peer in the same process).
    pub fn bell_for_peer(&self) -> io::Result<OwnedFd> {
        Ok(crate::sys::banded(rustix::io::fcntl_dupfd_cloexec(
            &self.bell.b,
            0,
        )?))
    }

    /// Makes the near end not readable (drains the bytes rung into it). End of stream or a
    /// hang-up stays readable.
    pub fn clear_readable(&self) {
        drain(self.a.as_fd());
    }

    /// Makes the near end not writable (one filler; if it is already not writable the send
    /// fails with `EAGAIN`, which is what we want).
    pub fn clear_writable(&self) {
        let _ = rustix::net::send(&self.a, &FILLER, SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
    }

    /// The peer is done writing (its done-writing, close or abort arrived): readable for good,
    /// with `POLLRDHUP`, as a TCP socket after the peer's FIN. (The peer does this itself when
    /// it publishes the flag; this is for a peer that did not.)
    pub fn peer_done(&self) {
        self.bell.shut_write();
    }

    /// The application shut down reading: readable for good.
    pub fn shut_read(&self) {
        let _ = rustix::net::shutdown(&self.a, Shutdown::Read);
    }

    /// The application shut down writing: writable for good (writes fail at once).
    pub fn shut_write(&self) {
        drain(self.bell.b.as_fd());
    }

    /// The connection is over (closed, aborted, the peer vanished): readable, writable and
    /// hung up for good.
    pub fn hang_up(&self) {
        drain(self.bell.b.as_fd());
        let _ = rustix::net::shutdown(&self.bell.b, Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::event::{PollFd, PollFlags, poll};

    fn events(r: &Readiness) -> PollFlags {
        let mut fds = [PollFd::new(
            &r.a,
            PollFlags::IN | PollFlags::OUT | PollFlags::RDHUP,
        )];
        poll(
            &mut fds,
            Some(&rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            }),
        )
        .unwrap();
        fds[0].revents()
    }

    #[test]
    fn readable_and_writable_separately() {
        let r = Readiness::new().unwrap();
        assert_eq!(events(&r), PollFlags::OUT, "fresh: writable only");
        let peer = Bell::from_fd(r.bell_for_peer().unwrap());
        peer.ring(Dir::Rx);
        assert_eq!(events(&r), PollFlags::IN | PollFlags::OUT);
        r.clear_readable();
        r.clear_writable();
        assert_eq!(
            events(&r),
            PollFlags::empty(),
            "neither: what a waiting writer sees"
        );
        peer.ring(Dir::Tx);
        assert_eq!(events(&r), PollFlags::OUT);
        r.clear_writable();
        r.bell().ring(Dir::Tx);
        assert_eq!(events(&r), PollFlags::OUT, "the local bell rings too");
    }

    #[test]
    fn terminal_states() {
        let r = Readiness::new().unwrap();
        r.clear_writable();
        r.peer_done();
        r.clear_readable();
        assert!(
            events(&r).contains(PollFlags::IN | PollFlags::RDHUP),
            "end of stream stays"
        );
        r.hang_up();
        let e = events(&r);
        assert!(
            e.contains(PollFlags::IN | PollFlags::OUT | PollFlags::HUP),
            "{e:?}"
        );
        // The peer's bell rings nobody now, and does not fail.
        let r = Readiness::new().unwrap();
        let peer = Bell::from_fd(r.bell_for_peer().unwrap());
        r.hang_up();
        peer.ring(Dir::Rx);
        peer.ring(Dir::Tx);
    }

    #[test]
    fn local_shutdowns() {
        let r = Readiness::new().unwrap();
        r.shut_read();
        r.clear_readable();
        assert!(events(&r).contains(PollFlags::IN));
        let r = Readiness::new().unwrap();
        r.clear_writable();
        assert!(!events(&r).contains(PollFlags::OUT));
        r.shut_write();
        assert!(events(&r).contains(PollFlags::OUT));
    }
}
