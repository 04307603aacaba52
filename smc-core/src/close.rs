//! The SMC close state machine, as `net/smc/smc_close.c` runs it (facts §4.4).
//!
//! Sans-IO: [`CloseMachine`] takes an event (the application closed, shut down its write side,
//! the peer's CDC carried done-writing / closed / abort, the link was lost) and returns the new
//! state plus what the driver must do (publish which connection-state flag, shut or abort the
//! TCP connection). It never waits: where the kernel first waits up to two seconds for queued
//! send data to drain (`smc_close_stream_wait`), the engine has nothing queued: with the
//! loopback device every written byte already lies in the peer's DMB, so the driver only
//! publishes its producer cursor before it calls [`CloseMachine::app_close`].
//!
//! One deliberate difference from the kernel: `shutdown(SHUT_WR)` does not shut down the write
//! side of the TCP connection. The kernel forwards the shutdown to the clcsock, but here the
//! TCP connection is the only way a survivor notices that its peer died (ARCHITECTURE rule 5),
//! so it stays open in both directions until the connection is closed.

/// Socket states with the kernel's numbers (`enum smc_state` in `smc.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SmcState {
    /// Connected.
    Active = 1,
    /// Created, handshake not finished.
    Init = 2,
    /// Done.
    Closed = 7,
    /// Listening.
    Listen = 10,
    /// Closed or shut down locally; waiting for the peer's close.
    PeerCloseWait1 = 20,
    /// Locally closed and the peer shut down its write side; waiting for its close.
    PeerCloseWait2 = 21,
    /// The peer closed or shut down writing; waiting for the application.
    AppCloseWait1 = 22,
    /// As AppCloseWait1, and the application shut down its write side.
    AppCloseWait2 = 23,
    /// The peer closed after a local shutdown(SHUT_WR); waiting for the application's close.
    AppFinCloseWait = 24,
    /// Closed locally after the peer's shutdown(SHUT_WR); waiting for the peer's close.
    PeerFinCloseWait = 25,
    /// Aborted locally; waiting for the peer.
    PeerAbortWait = 26,
    /// The peer aborted; waiting for the application's close.
    ProcessAbort = 27,
}

impl SmcState {
    /// The kernel's name, as `smcss` prints it (state 24 prints as "APPFINCLOSEWAIT1" there).
    pub fn name(self) -> &'static str {
        match self {
            Self::Active => "ACTIVE",
            Self::Init => "INIT",
            Self::Closed => "CLOSED",
            Self::Listen => "LISTEN",
            Self::PeerCloseWait1 => "PEERCLOSEWAIT1",
            Self::PeerCloseWait2 => "PEERCLOSEWAIT2",
            Self::AppCloseWait1 => "APPCLOSEWAIT1",
            Self::AppCloseWait2 => "APPCLOSEWAIT2",
            Self::AppFinCloseWait => "APPFINCLOSEWAIT",
            Self::PeerFinCloseWait => "PEERFINCLOSEWAIT",
            Self::PeerAbortWait => "PEERABORTWAIT",
            Self::ProcessAbort => "PROCESSABORT",
        }
    }

    /// Whether the application may still send (`smc_tx_sendmsg`: ACTIVE, APPCLOSEWAIT1, INIT).
    pub fn can_send(self) -> bool {
        matches!(self, Self::Active | Self::AppCloseWait1 | Self::Init)
    }
}

/// The connection-state flags of a CDC (facts §2.2), as sent or received.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnFlags {
    /// `peer_done_writing`: shutdown(SHUT_WR).
    pub done_writing: bool,
    /// `peer_conn_closed`: orderly close.
    pub closed: bool,
    /// `peer_conn_abort`: abnormal close; unread data was discarded.
    pub abort: bool,
}

impl ConnFlags {
    /// `smc_cdc_rxed_any_close` / `smc_close_sent_any_close`.
    pub fn any_close(self) -> bool {
        self.closed || self.abort
    }

    /// Any of the three flags.
    pub fn any(self) -> bool {
        self.done_writing || self.closed || self.abort
    }
}

/// What the driver must do after an event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CloseActions {
    /// Publish these flags to the peer (a CDC with the new connection-state flags).
    pub send: Option<ConnFlags>,
    /// Shut down the TCP connection in both directions (after the CDC).
    pub shutdown_tcp: bool,
    /// Abort the TCP connection (RST) instead.
    pub abort_tcp: bool,
    /// Release the connection's buffers (it is fully closed on both sides).
    pub free: bool,
}

/// The error an application sees after the connection was aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortKind {
    /// The peer aborted (`ECONNRESET`).
    Reset,
    /// Aborted locally, e.g. the link or the peer process was lost (`ECONNABORTED`).
    Aborted,
}

/// One connection's close state: `sk_state`, the flags sent and received, and the socket's
/// shutdown and error bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseMachine {
    state: SmcState,
    sent: ConnFlags,
    rcvd: ConnFlags,
    /// `SOCK_DEAD`: the application has released the socket.
    released: bool,
    error: Option<AbortKind>,
}

impl CloseMachine {
    /// A connection whose handshake has just finished.
    pub fn active() -> Self {
        Self {
            state: SmcState::Active,
            sent: ConnFlags::default(),
            rcvd: ConnFlags::default(),
            released: false,
            error: None,
        }
    }

    /// The current state.
    pub fn state(&self) -> SmcState {
        self.state
    }

    /// Flags sent so far.
    pub fn sent(&self) -> ConnFlags {
        self.sent
    }

    /// Flags received so far.
    pub fn received(&self) -> ConnFlags {
        self.rcvd
    }

    /// The pending socket error, if the connection was aborted.
    pub fn error(&self) -> Option<AbortKind> {
        self.error
    }

    /// Reads return end of stream once the peer sent any of done-writing, closed or abort
    /// (`RCV_SHUTDOWN`), after the data before it has been read.
    pub fn rcv_shutdown(&self) -> bool {
        self.rcvd.any()
    }

    /// Whether the application may still send.
    ///
    /// Also false once the peer closed or aborted: the kernel would still copy into the
    /// peer's buffer in APPCLOSEWAIT1, but nobody will read it, and a TCP programmer expects
    /// `BrokenPipe` for a write after the peer closed.
    pub fn can_send(&self) -> bool {
        self.state.can_send() && !self.sent.any() && self.error.is_none() && !self.rcvd.any_close()
    }

    fn send(&mut self, flags: ConnFlags) -> Option<ConnFlags> {
        self.sent.done_writing |= flags.done_writing;
        self.sent.closed |= flags.closed;
        self.sent.abort |= flags.abort;
        Some(self.sent)
    }

    /// `smc_close_final`: closed, or abort when unread data is discarded.
    fn close_final(&mut self, unread: bool) -> Option<ConnFlags> {
        if unread {
            self.send(ConnFlags {
                abort: true,
                ..ConnFlags::default()
            })
        } else {
            self.send(ConnFlags {
                closed: true,
                ..ConnFlags::default()
            })
        }
    }

    /// The application closes the socket (`smc_close_active`). `unread` says whether received
    /// data is still unread (then the peer gets an abort and an `ECONNRESET`).
    pub fn app_close(&mut self, unread: bool) -> CloseActions {
        let mut act = CloseActions::default();
        self.released = true;
        match self.state {
            SmcState::Init | SmcState::Listen => self.state = SmcState::Closed,
            SmcState::Active => {
                act.send = self.close_final(unread);
                self.state = SmcState::PeerCloseWait1;
                act.shutdown_tcp = true;
            }
            SmcState::AppFinCloseWait => {
                if self.sent.done_writing && !self.sent.any_close() {
                    act.send = self.close_final(unread);
                }
                self.state = SmcState::Closed;
            }
            SmcState::AppCloseWait1 | SmcState::AppCloseWait2 => {
                act.send = self.close_final(unread);
                if self.rcvd.any_close() {
                    self.state = SmcState::Closed;
                } else {
                    self.state = SmcState::PeerFinCloseWait;
                }
            }
            SmcState::PeerCloseWait1 | SmcState::PeerCloseWait2 => {
                if self.sent.done_writing && !self.sent.any_close() {
                    act.send = self.close_final(unread);
                }
            }
            SmcState::ProcessAbort => {
                act.send = self.send(ConnFlags {
                    abort: true,
                    ..ConnFlags::default()
                });
                self.state = SmcState::Closed;
            }
            SmcState::PeerAbortWait => self.state = SmcState::Closed,
            // The peer aborted while we were half-way through an orderly close: the kernel
            // sends nothing here and a peer waiting in PEERCLOSEWAIT would wait until its link
            // group goes. Telling it we closed lets it finish and reuse its buffer.
            SmcState::Closed if self.rcvd.abort && !self.sent.any_close() => {
                act.send = self.send(ConnFlags {
                    closed: true,
                    ..ConnFlags::default()
                });
            }
            SmcState::PeerFinCloseWait | SmcState::Closed => {}
        }
        if unread && act.send.is_some_and(|f| f.abort) {
            act.abort_tcp = true;
            act.shutdown_tcp = false;
        } else if act.send.is_some() || self.state == SmcState::Closed {
            act.shutdown_tcp = true;
        }
        act.free = self.state == SmcState::Closed;
        act
    }

    /// The application shuts down its write side (`smc_close_shutdown_write`).
    pub fn app_shutdown_write(&mut self) -> CloseActions {
        let mut act = CloseActions::default();
        match self.state {
            SmcState::Active => {
                act.send = self.send(ConnFlags {
                    done_writing: true,
                    ..ConnFlags::default()
                });
                self.state = SmcState::PeerCloseWait1;
            }
            SmcState::AppCloseWait1 => {
                act.send = self.send(ConnFlags {
                    done_writing: true,
                    ..ConnFlags::default()
                });
                self.state = SmcState::AppCloseWait2;
            }
            _ => {}
        }
        act
    }

    /// The peer's CDC carried connection-state flags (`smc_cdc_msg_recv_action` +
    /// `smc_close_passive_work`). Flags already seen are ignored; returns what changed.
    pub fn peer_flags(&mut self, flags: ConnFlags) -> CloseActions {
        let new = ConnFlags {
            done_writing: flags.done_writing && !self.rcvd.done_writing,
            closed: flags.closed && !self.rcvd.closed,
            abort: flags.abort && !self.rcvd.abort,
        };
        if !new.any() {
            return CloseActions::default();
        }
        self.rcvd.done_writing |= flags.done_writing;
        self.rcvd.closed |= flags.closed;
        self.rcvd.abort |= flags.abort;
        let mut act = CloseActions::default();
        if new.abort {
            self.error.get_or_insert(AbortKind::Reset);
            self.passive_abort_received();
        } else {
            match self.state {
                SmcState::Init | SmcState::Active => self.state = SmcState::AppCloseWait1,
                SmcState::PeerCloseWait1 | SmcState::PeerCloseWait2 => {
                    if self.state == SmcState::PeerCloseWait1 && self.rcvd.done_writing {
                        self.state = SmcState::PeerCloseWait2;
                    }
                    if self.rcvd.any_close() {
                        if self.released && self.sent.any_close() {
                            self.state = SmcState::Closed;
                        } else {
                            self.state = SmcState::AppFinCloseWait;
                        }
                    }
                }
                SmcState::PeerFinCloseWait if self.rcvd.any_close() => {
                    self.state = SmcState::Closed;
                }
                _ => {}
            }
        }
        act.free = self.state == SmcState::Closed && self.released;
        act
    }

    /// `smc_close_passive_abort_received`.
    fn passive_abort_received(&mut self) {
        self.state = match self.state {
            SmcState::Init | SmcState::Active | SmcState::AppCloseWait1 => SmcState::ProcessAbort,
            SmcState::AppFinCloseWait => SmcState::ProcessAbort,
            SmcState::PeerCloseWait1 | SmcState::PeerCloseWait2 => {
                if self.sent.done_writing && !self.sent.any_close() {
                    SmcState::ProcessAbort
                } else {
                    SmcState::Closed
                }
            }
            SmcState::AppCloseWait2 | SmcState::PeerFinCloseWait => SmcState::Closed,
            SmcState::PeerAbortWait => SmcState::Closed,
            s => s,
        };
    }

    /// The connection is lost underneath (the TCP connection ended without a close from the
    /// peer, the peer wrote garbage into shared memory, the link group went away):
    /// `smc_close_active_abort`. The application sees `ECONNABORTED` (or `ECONNRESET` when
    /// `kind` says so) and the TCP connection is aborted.
    pub fn local_abort(&mut self, kind: AbortKind) -> CloseActions {
        let mut act = CloseActions::default();
        if !matches!(self.state, SmcState::Init | SmcState::Closed) {
            self.error.get_or_insert(kind);
            act.abort_tcp = true;
        }
        match self.state {
            SmcState::Active
            | SmcState::AppCloseWait1
            | SmcState::AppCloseWait2
            | SmcState::PeerCloseWait1
            | SmcState::PeerCloseWait2
            | SmcState::PeerFinCloseWait
            | SmcState::ProcessAbort
            | SmcState::AppFinCloseWait => {
                // The kernel passes through PEERABORTWAIT on its way to CLOSED once the work
                // items are cancelled; nothing is pending here, so it goes straight through.
                self.state = SmcState::Closed;
            }
            _ => {}
        }
        // The peer's flags can no longer arrive: treat the receive side as shut down.
        self.rcvd.abort = true;
        act.free = self.state == SmcState::Closed && self.released;
        act
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DONE: ConnFlags = ConnFlags {
        done_writing: true,
        closed: false,
        abort: false,
    };
    const CLOSED: ConnFlags = ConnFlags {
        done_writing: false,
        closed: true,
        abort: false,
    };
    const ABORT: ConnFlags = ConnFlags {
        done_writing: false,
        closed: false,
        abort: true,
    };

    /// Drives two machines against each other: whatever one sends, the other receives.
    struct Pair {
        a: CloseMachine,
        b: CloseMachine,
    }

    impl Pair {
        fn new() -> Self {
            Self {
                a: CloseMachine::active(),
                b: CloseMachine::active(),
            }
        }
        fn deliver_to_b(&mut self, act: CloseActions) -> CloseActions {
            act.send.map(|f| self.b.peer_flags(f)).unwrap_or_default()
        }
        fn deliver_to_a(&mut self, act: CloseActions) -> CloseActions {
            act.send.map(|f| self.a.peer_flags(f)).unwrap_or_default()
        }
    }

    #[test]
    fn orderly_close_both_sides() {
        let mut p = Pair::new();
        let act = p.a.app_close(false);
        assert_eq!(act.send, Some(CLOSED));
        assert!(act.shutdown_tcp && !act.abort_tcp && !act.free);
        assert_eq!(p.a.state(), SmcState::PeerCloseWait1);
        p.deliver_to_b(act);
        assert_eq!(p.b.state(), SmcState::AppCloseWait1);
        assert!(p.b.rcv_shutdown());
        let act = p.b.app_close(false);
        assert_eq!(p.b.state(), SmcState::Closed);
        assert!(act.free);
        let back = p.deliver_to_a(act);
        assert_eq!(p.a.state(), SmcState::Closed);
        assert!(back.free);
        assert_eq!(p.a.error(), None);
        assert_eq!(p.b.error(), None);
    }

    #[test]
    fn half_close_then_close() {
        let mut p = Pair::new();
        let act = p.a.app_shutdown_write();
        assert_eq!(act.send, Some(DONE));
        assert_eq!(p.a.state(), SmcState::PeerCloseWait1);
        assert!(!p.a.can_send());
        p.deliver_to_b(act);
        assert_eq!(p.b.state(), SmcState::AppCloseWait1);
        // b can still send in APPCLOSEWAIT1, and a can still receive.
        assert!(p.b.can_send());
        assert!(!p.a.rcv_shutdown());
        let act = p.b.app_close(false);
        // Peer (a) has only shut down writing: b waits for a's close.
        assert_eq!(p.b.state(), SmcState::PeerFinCloseWait);
        p.deliver_to_a(act);
        assert_eq!(p.a.state(), SmcState::AppFinCloseWait);
        assert!(p.a.rcv_shutdown());
        let act = p.a.app_close(false);
        assert_eq!(act.send.map(|f| f.closed), Some(true));
        assert_eq!(p.a.state(), SmcState::Closed);
        let back = p.deliver_to_b(act);
        assert_eq!(p.b.state(), SmcState::Closed);
        assert!(back.free);
    }

    #[test]
    fn both_shutdown_write_then_close() {
        let mut p = Pair::new();
        let a1 = p.a.app_shutdown_write();
        let b1 = p.b.app_shutdown_write();
        p.deliver_to_b(a1);
        p.deliver_to_a(b1);
        assert_eq!(p.a.state(), SmcState::PeerCloseWait2);
        assert_eq!(p.b.state(), SmcState::PeerCloseWait2);
        let a2 = p.a.app_close(false);
        assert_eq!(a2.send.map(|f| f.closed), Some(true));
        p.deliver_to_b(a2);
        assert_eq!(p.b.state(), SmcState::AppFinCloseWait);
        let b2 = p.b.app_close(false);
        assert_eq!(p.b.state(), SmcState::Closed);
        p.deliver_to_a(b2);
        assert_eq!(p.a.state(), SmcState::Closed);
    }

    #[test]
    fn close_with_unread_data_aborts_peer() {
        let mut p = Pair::new();
        let act = p.a.app_close(true);
        assert_eq!(act.send, Some(ABORT));
        assert!(act.abort_tcp && !act.shutdown_tcp);
        p.deliver_to_b(act);
        assert_eq!(p.b.state(), SmcState::ProcessAbort);
        assert_eq!(p.b.error(), Some(AbortKind::Reset));
        assert!(!p.b.can_send());
        let act = p.b.app_close(false);
        assert_eq!(act.send.map(|f| f.abort), Some(true));
        assert_eq!(p.b.state(), SmcState::Closed);
        assert!(act.free);
    }

    #[test]
    fn local_abort_from_every_state_ends_closed_with_error() {
        let states: [fn(&mut CloseMachine); 5] = [
            |_| {},
            |m| {
                m.app_shutdown_write();
            },
            |m| {
                m.peer_flags(DONE);
            },
            |m| {
                m.peer_flags(CLOSED);
            },
            |m| {
                m.app_close(false);
            },
        ];
        for setup in states {
            let mut m = CloseMachine::active();
            setup(&mut m);
            let act = m.local_abort(AbortKind::Aborted);
            assert!(act.abort_tcp);
            assert_eq!(m.state(), SmcState::Closed, "{m:?}");
            assert!(m.error().is_some());
            assert!(m.rcv_shutdown());
        }
    }

    #[test]
    fn repeated_flags_are_idempotent() {
        let mut m = CloseMachine::active();
        m.peer_flags(DONE);
        let s = m.state();
        assert_eq!(m.peer_flags(DONE), CloseActions::default());
        assert_eq!(m.state(), s);
    }

    #[test]
    fn abort_after_local_close_finishes() {
        let mut m = CloseMachine::active();
        m.app_close(false);
        let act = m.peer_flags(ABORT);
        assert_eq!(m.state(), SmcState::Closed);
        assert!(act.free);
    }
}

#[cfg(test)]
mod pair_harness {
    //! Two machines, a queue of CDCs in each direction, and random interleavings of application
    //! calls and deliveries. Whatever the order, once both sides have closed and every CDC is
    //! delivered, both are CLOSED, nobody reports an error after an orderly close, and a side
    //! that closed with unread data makes the other see a reset.
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[derive(Debug, Clone, Copy)]
    enum Step {
        Close(bool, bool),
        ShutWr(bool),
        Deliver(bool),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (any::<bool>(), any::<bool>()).prop_map(|(side, unread)| Step::Close(side, unread)),
            any::<bool>().prop_map(Step::ShutWr),
            any::<bool>().prop_map(Step::Deliver),
            any::<bool>().prop_map(Step::Deliver),
        ]
    }

    proptest! {
        #[test]
        fn any_interleaving_ends_closed(steps in proptest::collection::vec(step(), 0..24)) {
            let mut m = [CloseMachine::active(), CloseMachine::active()];
            let mut q: [VecDeque<ConnFlags>; 2] = [VecDeque::new(), VecDeque::new()];
            let mut aborted_by = [false, false];
            let mut closed = [false, false];
            let send = |q: &mut [VecDeque<ConnFlags>; 2], from: usize, act: CloseActions| {
                if let Some(f) = act.send {
                    q[1 - from].push_back(f);
                }
            };
            for s in steps {
                match s {
                    Step::Close(side, unread) => {
                        let i = usize::from(side);
                        if closed[i] { continue; }
                        closed[i] = true;
                        let act = m[i].app_close(unread);
                        if act.send.is_some_and(|f| f.abort) { aborted_by[i] = true; }
                        send(&mut q, i, act);
                    }
                    Step::ShutWr(side) => {
                        let i = usize::from(side);
                        if closed[i] { continue; }
                        let act = m[i].app_shutdown_write();
                        send(&mut q, i, act);
                    }
                    Step::Deliver(side) => {
                        let i = usize::from(side);
                        if let Some(f) = q[i].pop_front() {
                            let act = m[i].peer_flags(f);
                            send(&mut q, i, act);
                        }
                    }
                }
            }
            // Finish: both close, then deliver everything.
            for i in 0..2 {
                if !closed[i] {
                    let act = m[i].app_close(false);
                    send(&mut q, i, act);
                }
            }
            let mut guard = 0;
            while !q[0].is_empty() || !q[1].is_empty() {
                for i in 0..2 {
                    if let Some(f) = q[i].pop_front() {
                        let act = m[i].peer_flags(f);
                        send(&mut q, i, act);
                    }
                }
                guard += 1;
                prop_assert!(guard < 100, "livelock");
            }
            for i in 0..2 {
                prop_assert_eq!(m[i].state(), SmcState::Closed, "side {} {:?}", i, m[i]);
                if aborted_by[1 - i] {
                    prop_assert_eq!(m[i].error(), Some(AbortKind::Reset));
                }
                if !aborted_by[0] && !aborted_by[1] {
                    prop_assert_eq!(m[i].error(), None);
                }
            }
        }
    }
}
