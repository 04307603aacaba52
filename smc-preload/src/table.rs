//! Which descriptors of the program are ours, and what they are.
//!
//! Every hook first looks at [`kind`]: one relaxed atomic load from an array indexed by the
//! descriptor. A descriptor that is not ours (files, pipes, UDP, plain TCP, fallback
//! connections) goes straight to the C library with no lock and no allocation, which is also
//! what makes `write`/`close` from a signal handler safe for those. Only ours take the map's
//! lock, briefly: the object is cloned out and the call runs without it.

use smcd_engine::{SmcListener, SmcStream};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

/// Descriptors at or above this are never taken over (they stay plain TCP).
pub(crate) const MAX_FD: usize = 1 << 20;

/// Not ours.
pub(crate) const NONE: u8 = 0;
/// An AF_INET/AF_INET6 stream socket created by the program, not yet connected or listening:
/// `connect` or `listen` may make it SMC.
pub(crate) const CANDIDATE: u8 = 1;
/// An SMC connection: the descriptor is the connection's readiness socket.
pub(crate) const STREAM: u8 = 2;
/// An SMC listener: the descriptor is the listener's readiness (an epoll instance).
pub(crate) const LISTENER: u8 = 3;

static KINDS: [AtomicU8; MAX_FD] = [const { AtomicU8::new(NONE) }; MAX_FD];

/// An SMC connection as the program's descriptors see it; `dup` shares it, like an open file
/// description (so `O_NONBLOCK` is shared as well).
#[derive(Debug)]
pub(crate) struct Stream {
    pub(crate) s: SmcStream,
    pub(crate) nonblocking: AtomicBool,
}

/// An SMC listener.
#[derive(Debug)]
pub(crate) struct Listener {
    pub(crate) l: SmcListener,
    pub(crate) nonblocking: AtomicBool,
}

/// What one of our descriptors refers to.
#[derive(Debug, Clone)]
pub(crate) enum Obj {
    Stream(Arc<Stream>),
    Listener(Arc<Listener>),
}

impl Obj {
    fn kind(&self) -> u8 {
        match self {
            Obj::Stream(_) => STREAM,
            Obj::Listener(_) => LISTENER,
        }
    }
}

static OBJS: RwLock<BTreeMap<i32, Obj>> = RwLock::new(BTreeMap::new());

/// The kind of `fd` ([`NONE`] for anything out of range).
#[inline]
pub(crate) fn kind(fd: i32) -> u8 {
    usize::try_from(fd)
        .ok()
        .and_then(|i| KINDS.get(i))
        .map_or(NONE, |k| k.load(Ordering::Relaxed))
}

/// Sets the kind of `fd` (ignored out of range).
pub(crate) fn set_kind(fd: i32, k: u8) {
    if let Some(slot) = usize::try_from(fd).ok().and_then(|i| KINDS.get(i)) {
        slot.store(k, Ordering::Release);
    }
}

/// Whether `fd` can be ours at all.
pub(crate) fn in_range(fd: i32) -> bool {
    usize::try_from(fd).is_ok_and(|i| i < MAX_FD)
}

/// The object behind `fd`, if it is ours.
pub(crate) fn get(fd: i32) -> Option<Obj> {
    OBJS.read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&fd)
        .cloned()
}

/// The stream behind `fd`.
pub(crate) fn stream(fd: i32) -> Option<Arc<Stream>> {
    match get(fd)? {
        Obj::Stream(s) => Some(s),
        Obj::Listener(_) => None,
    }
}

/// The listener behind `fd`.
pub(crate) fn listener(fd: i32) -> Option<Arc<Listener>> {
    match get(fd)? {
        Obj::Listener(l) => Some(l),
        Obj::Stream(_) => None,
    }
}

/// Makes `fd` refer to `obj`; returns what it referred to before (for the caller to drop
/// after it released the descriptor).
pub(crate) fn insert(fd: i32, obj: Obj) -> Option<Obj> {
    let k = obj.kind();
    let old = OBJS
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(fd, obj);
    set_kind(fd, k);
    old
}

/// Forgets `fd`; returns its object (dropped by the caller, outside any lock).
pub(crate) fn remove(fd: i32) -> Option<Obj> {
    set_kind(fd, NONE);
    OBJS.write().unwrap_or_else(|e| e.into_inner()).remove(&fd)
}

/// Forgets every descriptor in `first..=last` (`close_range`).
pub(crate) fn remove_range(first: u32, last: u32) -> Vec<Obj> {
    let mut m = OBJS.write().unwrap_or_else(|e| e.into_inner());
    let keys: Vec<i32> = m
        .range(i32::try_from(first).unwrap_or(i32::MAX)..)
        .map(|(k, _)| *k)
        .take_while(|k| u32::try_from(*k).is_ok_and(|k| k <= last))
        .collect();
    let top = usize::try_from(last).unwrap_or(MAX_FD).min(MAX_FD - 1);
    if let Some(band) = KINDS.get(first as usize..=top) {
        for k in band {
            if k.load(Ordering::Relaxed) == CANDIDATE {
                k.store(NONE, Ordering::Relaxed);
            }
        }
    }
    keys.iter()
        .filter_map(|k| {
            set_kind(*k, NONE);
            m.remove(k)
        })
        .collect()
}
