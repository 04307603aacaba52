//! Completion queues (rxe's `rxe_cq.c`): a bounded queue, an armed flag, and an eventfd as the
//! completion channel.

use super::{Dev, lock};
use crate::verbs::{CompletionQueue, CqHandler, Served, VerbsError, Wc, WcStatus};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, Weak};
use std::time::Duration;

/// A completion queue of a [`super::SoftDevice`].
pub struct SoftCq {
    q: Mutex<State>,
    cap: usize,
    channel: OwnedFd,
    overflowed: AtomicBool,
    /// Run on the device's thread instead of signalling the channel
    /// ([`CompletionQueue::set_handler`]).
    handler: OnceLock<CqHandler>,
    dev: Weak<Dev>,
}

impl std::fmt::Debug for SoftCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftCq")
            .field("cap", &self.cap)
            .field("handler", &self.handler.get().is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct State {
    wcs: VecDeque<Wc>,
    /// `Some(solicited_only)` while armed.
    armed: Option<bool>,
}

impl SoftCq {
    pub(super) fn new(cap: usize, dev: Weak<Dev>) -> Result<Self, VerbsError> {
        let channel = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(std::io::Error::from)?;
        Ok(Self {
            q: Mutex::new(State::default()),
            cap,
            channel,
            overflowed: AtomicBool::new(false),
            handler: OnceLock::new(),
            dev,
        })
    }

    /// Adds a completion; an armed queue signals its channel if the completion is one it was
    /// armed for. A full queue drops it and records the overflow (a real CQ would raise an
    /// asynchronous error; the QP's owner sized it wrongly).
    pub(super) fn push(&self, wc: Wc) {
        let mut s = lock(&self.q);
        if s.wcs.len() >= self.cap {
            self.overflowed.store(true, Ordering::Relaxed);
            return;
        }
        s.wcs.push_back(wc);
        let wake = match s.armed {
            Some(false) => true,
            Some(true) => wc.solicited || wc.status != WcStatus::Success,
            None => false,
        };
        if wake {
            s.armed = None;
            drop(s);
            match (self.handler.get(), self.dev.upgrade()) {
                (Some(h), Some(dev)) => dev.schedule(h),
                _ => {
                    let _ = rustix::io::write(&self.channel, &1u64.to_ne_bytes());
                }
            }
        }
    }

    /// Whether a completion was ever dropped because the queue was full.
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Relaxed)
    }
}

impl CompletionQueue for SoftCq {
    fn poll(&self, out: &mut [Wc]) -> usize {
        let mut s = lock(&self.q);
        let n = out.len().min(s.wcs.len());
        for (o, wc) in out.iter_mut().zip(s.wcs.drain(..n)) {
            *o = wc;
        }
        n
    }

    fn req_notify(&self, solicited_only: bool) -> bool {
        let mut s = lock(&self.q);
        s.armed = Some(solicited_only);
        !s.wcs.is_empty()
    }

    fn event_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }

    fn take_event(&self) -> bool {
        let mut b = [0u8; 8];
        matches!(rustix::io::read(&self.channel, &mut b), Ok(8))
    }

    fn set_handler(&self, handler: CqHandler) -> bool {
        self.handler.set(handler).is_ok()
    }

    fn serve(&self, done: &dyn Fn() -> bool, timeout: Option<Duration>, spin: Duration) -> Served {
        match self.dev.upgrade() {
            Some(dev) => dev.serve(done, timeout, spin),
            None => Served::Declined,
        }
    }

    fn wake_server(&self) {
        if let Some(dev) = self.dev.upgrade() {
            dev.wake_server();
        }
    }

    fn unserved_wait_over(&self) {
        if let Some(dev) = self.dev.upgrade() {
            dev.unserved_wait_over();
        }
    }

    fn stop_serving(&self) {
        if let Some(dev) = self.dev.upgrade() {
            dev.end_lease();
        }
    }

    fn unserved_wait_begin(&self) {
        if let Some(dev) = self.dev.upgrade() {
            dev.unserved_wait_begin();
        }
    }
}
