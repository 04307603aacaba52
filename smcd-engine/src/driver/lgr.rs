//! SMC-D link groups of one engine (the kernel's `smc_core.c` for SMC-D): which group a
//! connection joins and when a group is freed are decided by `smc_core::lgr::LgrBook`; this
//! keeps each group's buffers: DMBs of closed connections are reused, peer DMBs stay attached
//! for reuse, and an expired group gives its buffers back to the device.
//!
//! Locking: the book's lock is held only to decide; a group's lock only for its buffer lists.
//! Device round trips (registering or attaching a DMB through `smcd`) happen with no lock
//! held, and a server connection waits only for the first contact of the one group it would
//! join (the lesson of the kernel's `smc_server_lgr_pending` / `smc_client_lgr_pending`
//! patches).

use crate::device::{BufferProvider, Dmb, Gid};
use crate::layout::status::{LgrRecord, LgrSlot, StatusArea};
use crate::transport::smcd::Bells;
use rustix::event::epoll;
use rustix::fd::{AsFd, OwnedFd};
pub use smc_core::lgr::Role;
use smc_core::lgr::{Join, LgrBook};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// What the peer told us in the first-contact exchange (CLC v2).
#[derive(Debug, Clone, Default)]
pub struct PeerV2 {
    /// SMC version of the link group (1 or 2).
    pub version: u8,
    /// Peer's release.
    pub release: u8,
    /// Peer's OS type.
    pub os: u8,
    /// Peer's host name.
    pub hostname: String,
    /// The negotiated EID.
    pub eid: String,
}

#[derive(Debug, Default)]
struct Pool {
    free: Vec<Arc<Dmb>>,
    /// DMBs of connections closed locally whose peer had not closed yet.
    draining: Vec<Arc<Dmb>>,
    attached: HashMap<u64, Arc<Dmb>>,
    dmb_bytes: usize,
    sndbuf_bytes: usize,
}

/// One SMC-D link group's buffers and identity.
#[derive(Debug)]
pub struct LinkGroup {
    /// The 4-byte link group id (the CLC "link id").
    pub id: u32,
    /// The peer's GID.
    pub peer_gid: Gid,
    /// Our GID when the group was made.
    pub local_gid: Gid,
    /// Who created it.
    pub role: Role,
    /// The id the server gave the group (in its Accept), on the client side: a client may
    /// have several groups with one server (at most `max_conns` connections each), and a
    /// connection must join the counterpart of the group the server put it in, whose bell
    /// channel the server uses for it. On the server side, 0.
    pub peer_lgr_id: u32,
    peer: Mutex<PeerV2>,
    pool: Mutex<Pool>,
    slot: LgrSlot,
    /// Bytes of free (idle, reusable) DMBs in all groups of the engine.
    idle: Arc<AtomicUsize>,
    /// The group's bell channel (see `transport::smcd`).
    pub bells: Arc<Bells>,
    /// The peer's end of the bell channel, until the group's first DMB carried it over.
    handover: Mutex<Option<OwnedFd>>,
    /// The engine's epoll set of bell channels (drained by the housekeeping thread).
    bell_ep: Arc<OnceLock<OwnedFd>>,
}

/// At most this many bytes of idle DMBs an engine keeps for reuse, over all its link groups;
/// a DMB closed beyond it is given back to the device (the kernel keeps every group's buffers
/// until the group is freed; with one group per peer process that pinned memory without
/// bound).
pub const IDLE_DMB_BYTES_MAX: usize = 32 << 20;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LinkGroup {
    /// Writes the group's current state into its status slot (for `GET_LGR_SMCD`).
    fn publish(&self, conns: u32) {
        // Held across the write: two threads publishing at once must not leave the older
        // snapshot in the slot.
        let p = lock(&self.pool);
        let peer = self.peer();
        self.slot.publish(&LgrRecord {
            id: self.id,
            role: match self.role {
                Role::Client => 0,
                Role::Server => 1,
            },
            version: peer.version,
            release: peer.release,
            os: peer.os,
            conns,
            peer_gid: self.peer_gid,
            gid: self.local_gid,
            sndbuf: p.sndbuf_bytes as u64,
            dmb: p.dmb_bytes as u64,
            peer_host: peer.hostname,
            eid: peer.eid,
            smcr: None,
        });
    }

    /// What the peer said in the first-contact exchange.
    pub fn peer(&self) -> PeerV2 {
        lock(&self.peer).clone()
    }

    /// Bytes of attached peer DMBs (our send buffers) and of our DMBs.
    pub fn buffer_totals(&self) -> (usize, usize) {
        let p = lock(&self.pool);
        (p.sndbuf_bytes, p.dmb_bytes)
    }

    /// A DMB of exactly `len` bytes for a new connection: a free one, a drained one whose
    /// peer has closed, or a new registration. The header is reset. The flag says it was
    /// reused.
    pub fn get_dmb(&self, dev: &dyn BufferProvider, len: usize) -> io::Result<(Arc<Dmb>, bool)> {
        if let Some(d) = self.pooled_dmb(dev, len) {
            return Ok((d, true));
        }
        // The group's first DMB carries the peer's end of the bell channel.
        let handover = lock(&self.handover).take();
        let d = match dev.register_dmb(len, self.peer_gid, handover.as_ref().map(AsFd::as_fd)) {
            Ok(d) => Arc::new(d),
            Err(e) => {
                if handover.is_some() {
                    *lock(&self.handover) = handover;
                }
                return Err(e);
            }
        };
        lock(&self.pool).dmb_bytes += len;
        Ok((d, false))
    }

    /// A freed DMB of `len` bytes from the group's pool, reset for its next connection; `None`
    /// if there is none (then only [`Self::get_dmb`] has one, by asking the device). Never
    /// waits: a DMB the pool has to give up over its bound leaves with a notice to the device.
    pub fn pooled_dmb(&self, dev: &dyn BufferProvider, len: usize) -> Option<Arc<Dmb>> {
        let mut evict = Vec::new();
        let reused = {
            let mut p = lock(&self.pool);
            let mut i = 0;
            while i < p.draining.len() {
                if p.draining[i].peer_done() {
                    let d = p.draining.swap_remove(i);
                    let n = d.map.dmb_len();
                    if self.idle.load(Ordering::Relaxed) + n > IDLE_DMB_BYTES_MAX {
                        p.dmb_bytes = p.dmb_bytes.saturating_sub(n);
                        evict.push(d.token);
                        continue;
                    }
                    self.idle.fetch_add(n, Ordering::Relaxed);
                    p.free.push(d);
                } else {
                    i += 1;
                }
            }
            p.free
                .iter()
                .position(|d| d.map.dmb_len() == len)
                .map(|pos| p.free.swap_remove(pos))
        };
        for t in evict {
            dev.unregister_dmb(t);
        }
        let d = reused?;
        self.idle.fetch_sub(len, Ordering::Relaxed);
        d.map.reset();
        Some(d)
    }

    /// Installs the group's bell channel and has the housekeeping thread drain it.
    fn install_bells(&self, fd: OwnedFd) {
        self.bells.install(fd);
        if let (Some(ep), Some(fd)) = (self.bell_ep.get(), self.bells.fd()) {
            let _ = epoll::add(
                ep,
                fd,
                epoll::EventData::new_u64(u64::from(self.id)),
                epoll::EventFlags::IN,
            );
        }
    }

    /// The peer's DMB `token`, attached once and kept for reuse; the flag says it was
    /// already attached.
    pub fn attach(&self, dev: &dyn BufferProvider, token: u64) -> io::Result<(Arc<Dmb>, bool)> {
        if let Some(d) = self.attached(token) {
            return Ok((d, true));
        }
        let (d, chan) = dev.attach_dmb(token)?;
        if let Some(fd) = chan {
            self.install_bells(fd);
        }
        if let Some(uid) = d.owner_uid {
            self.bells.learn_peer_uid(uid);
        }
        Ok((self.keep_attached(token, Arc::new(d)), false))
    }

    /// Keeps the peer's DMB `token` attached for reuse (the one kept already, if another
    /// thread was first) and counts it in the group's send buffers.
    fn keep_attached(&self, token: u64, d: Arc<Dmb>) -> Arc<Dmb> {
        let mut p = lock(&self.pool);
        let d = Arc::clone(p.attached.entry(token).or_insert(d));
        p.sndbuf_bytes = p.attached.values().map(|d| d.map.dmb_len()).sum();
        d
    }

    /// Returns a connection's DMB: `reusable` when the peer has closed too, else it waits in
    /// the draining list; a DMB of an aborted connection is dropped (and unregistered).
    pub fn put_dmb(&self, dev: &dyn BufferProvider, dmb: Arc<Dmb>, reusable: bool, aborted: bool) {
        let mut p = lock(&self.pool);
        let len = dmb.map.dmb_len();
        let over = reusable && self.idle.load(Ordering::Relaxed) + len > IDLE_DMB_BYTES_MAX;
        if aborted || over {
            p.dmb_bytes = p.dmb_bytes.saturating_sub(len);
            drop(p);
            dev.unregister_dmb(dmb.token);
            return;
        }
        if reusable {
            self.idle.fetch_add(len, Ordering::Relaxed);
            p.free.push(dmb);
        } else {
            p.draining.push(dmb);
        }
    }

    /// A pooled DMB moved here from `from`, a group with the same peer and role: its bytes
    /// count here from now on. `None` if `from` has none of `len` bytes, or this group still
    /// has its bell channel to hand over (that goes with a DMB registered for it).
    fn adopt_from(
        &self,
        from: &LinkGroup,
        dev: &dyn BufferProvider,
        len: usize,
    ) -> Option<Arc<Dmb>> {
        if lock(&self.handover).is_some() {
            return None;
        }
        let d = from.pooled_dmb(dev, len)?;
        {
            let mut p = lock(&from.pool);
            p.dmb_bytes = p.dmb_bytes.saturating_sub(len);
        }
        lock(&self.pool).dmb_bytes += len;
        Some(d)
    }

    /// The peer's DMB `token` if it is attached already (a DMB the peer reuses); never waits.
    pub fn attached(&self, token: u64) -> Option<Arc<Dmb>> {
        lock(&self.pool).attached.get(&token).cloned()
    }

    /// Forgets a cached attachment (the peer's DMB turned out bad).
    pub fn detach(&self, token: u64) {
        let mut p = lock(&self.pool);
        p.attached.remove(&token);
        p.sndbuf_bytes = p.attached.values().map(|d| d.map.dmb_len()).sum();
    }

    /// Frees the group's buffers (it expired).
    fn free_all(&self, dev: &dyn BufferProvider) {
        // Links of connections not yet dropped may hold the channel a little longer; the
        // housekeeping thread stops looking at it now.
        if let (Some(ep), Some(fd)) = (self.bell_ep.get(), self.bells.fd()) {
            let _ = epoll::delete(ep, fd);
        }
        let mut p = lock(&self.pool);
        let free: usize = p.free.iter().map(|d| d.map.dmb_len()).sum();
        self.idle.fetch_sub(free, Ordering::Relaxed);
        let mut all: Vec<_> = p.free.drain(..).collect();
        all.append(&mut p.draining);
        for d in all {
            dev.unregister_dmb(d.token);
        }
        p.attached.clear();
        p.dmb_bytes = 0;
        p.sndbuf_bytes = 0;
    }
}

/// The key a group is found by: the peer's GID and ours.
type Key = (Gid, Gid);

/// All link groups of one engine.
#[derive(Debug, Default)]
pub struct LgrTable {
    book: Mutex<LgrBook<Key>>,
    /// Signalled when a group's first contact ends (ready or dead).
    settled: Condvar,
    groups: Mutex<HashMap<u32, Arc<LinkGroup>>>,
    ids: Mutex<IdBlock>,
    idle: Arc<AtomicUsize>,
    /// The housekeeping thread's doorbell (the write end of its pipe): rung when a group
    /// becomes dead and empty, so it is freed now rather than at the next expiry. Dropping
    /// the table closes it, which ends the thread.
    kick: OnceLock<OwnedFd>,
    /// The epoll set of the groups' bell channels, by group id.
    bell_ep: Arc<OnceLock<OwnedFd>>,
}

/// Where the next link-group id comes from: a block of 256 ids from smcd.
#[derive(Debug, Default)]
struct IdBlock {
    /// The engine's first block (its engine id) these came with; a new one (smcd restarted)
    /// starts over.
    first: u32,
    block: u32,
    /// The next id's index in the block; past 255 the block is used up.
    n: u32,
}

impl LgrTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The epoll set of the groups' bell channels (readable when one has records), made on
    /// first use.
    pub fn bell_ep(&self) -> Option<rustix::fd::BorrowedFd<'_>> {
        if self.bell_ep.get().is_none()
            && let Ok(ep) = epoll::create(epoll::CreateFlags::CLOEXEC)
        {
            let _ = self.bell_ep.set(crate::sys::banded(ep));
        }
        self.bell_ep.get().map(AsFd::as_fd)
    }

    /// Drains the bell channels the epoll set says are readable.
    pub fn drain_bells(&self) {
        let Some(ep) = self.bell_ep.get() else { return };
        let mut events = Vec::with_capacity(64);
        if epoll::wait(
            ep,
            rustix::buffer::spare_capacity(&mut events),
            Some(&rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            }),
        )
        .is_err()
        {
            return;
        }
        for ev in &events {
            if let Some(g) = self.group(ev.data.u64() as u32)
                && g.bells.drain()
                && let Some(fd) = g.bells.fd()
            {
                // The peer closed its end: readable (end of file) for good, so the
                // housekeeping thread would wake for it every BELL_DRAIN_EVERY until the
                // group is freed. Bells the peer sent before are in the stash.
                let _ = epoll::delete(ep, fd);
            }
        }
    }

    fn group(&self, id: u32) -> Option<Arc<LinkGroup>> {
        lock(&self.groups).get(&id).cloned()
    }

    fn publish(&self, g: &LinkGroup) {
        let conns = lock(&self.book).get(g.id).map_or(0, |x| x.conns);
        g.publish(conns);
    }

    /// A server connection from `peer` (`smc_conn_create` on the listen side): a slot in a
    /// ready group below `max_conns`, waiting if the one that fits is still in its first
    /// contact; `None` means make a new group ([`Self::create`]). `waiting(true)` is called
    /// before the thread blocks for a first contact, `waiting(false)` once it stops.
    pub fn join_server(
        &self,
        peer: Gid,
        local: Gid,
        max_conns: u32,
        waiting: &dyn Fn(bool),
    ) -> Option<Arc<LinkGroup>> {
        struct Waiting<'a>(&'a dyn Fn(bool), bool);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                if self.1 {
                    (self.0)(false);
                }
            }
        }
        let mut w = Waiting(waiting, false);
        let mut book = lock(&self.book);
        loop {
            match book.join((peer, local), Role::Server, max_conns) {
                Join::Joined(id) => {
                    drop(book);
                    let g = self.group(id)?;
                    self.publish(&g);
                    return Some(g);
                }
                Join::Wait(_) => {
                    if !w.1 {
                        w.1 = true;
                        drop(book);
                        waiting(true);
                        book = lock(&self.book);
                        continue;
                    }
                    book = self.settled.wait(book).unwrap_or_else(|e| e.into_inner());
                }
                Join::New => return None,
            }
        }
    }

    /// A DMB of `len` bytes for a new connection in `g`: from its pool, else from the pool of
    /// another of our groups with the same peer and role (smcd lets the peer attach it from
    /// any of its groups: a DMB belongs to the peer GID, not to a group), else a new
    /// registration ([`LinkGroup::get_dmb`]). The flag says it was reused.
    ///
    /// Which group a connection joins is the server's choice, so a client's free DMBs pile
    /// up in the groups the server is not picking just then while the one it picks has none:
    /// at 2,048 concurrent crr connections over nine groups the client registered a new DMB
    /// for one connection in nine and gave another back (the idle bound was held by the
    /// other groups' pools).
    pub fn dmb(
        &self,
        g: &Arc<LinkGroup>,
        dev: &dyn BufferProvider,
        len: usize,
    ) -> io::Result<(Arc<Dmb>, bool)> {
        if let Some(d) = self.pooled(g, dev, len) {
            return Ok((d, true));
        }
        g.get_dmb(dev, len)
    }

    /// The peer's DMB `token` attached for `g`: from `g`'s cache, else from a sibling group's
    /// (same peer and role: the peer may hand a DMB from one of its groups to another, see
    /// [`Self::dmb`]), else attached through the device. The flag says it was cached.
    pub fn attach(
        &self,
        g: &Arc<LinkGroup>,
        dev: &dyn BufferProvider,
        token: u64,
    ) -> io::Result<(Arc<Dmb>, bool)> {
        match self.attached(g, token) {
            Some(d) => Ok((d, true)),
            None => g.attach(dev, token),
        }
    }

    /// [`Self::attach`] without asking the device: `None` if no group has it attached.
    pub fn attached(&self, g: &Arc<LinkGroup>, token: u64) -> Option<Arc<Dmb>> {
        if let Some(d) = g.attached(token) {
            return Some(d);
        }
        let found = self.siblings(g).iter().find_map(|o| o.attached(token))?;
        Some(g.keep_attached(token, found))
    }

    /// Our other groups with `g`'s peer and role.
    fn siblings(&self, g: &LinkGroup) -> Vec<Arc<LinkGroup>> {
        lock(&self.groups)
            .values()
            .filter(|o| {
                o.id != g.id
                    && o.role == g.role
                    && o.peer_gid == g.peer_gid
                    && o.local_gid == g.local_gid
            })
            .cloned()
            .collect()
    }

    /// [`Self::dmb`] without a registration: `None` when no pool has one (never waits).
    pub fn pooled(
        &self,
        g: &Arc<LinkGroup>,
        dev: &dyn BufferProvider,
        len: usize,
    ) -> Option<Arc<Dmb>> {
        if let Some(d) = g.pooled_dmb(dev, len) {
            return Some(d);
        }
        self.siblings(g)
            .iter()
            .find_map(|o| g.adopt_from(o, dev, len))
    }

    /// [`Self::join_server`] without waiting: a slot in a ready group below `max_conns`, or
    /// `None` (no such group now: the caller goes the way that may wait or make one).
    pub fn join_server_now(&self, peer: Gid, local: Gid, max_conns: u32) -> Option<Arc<LinkGroup>> {
        let id = lock(&self.book).join_existing((peer, local), Role::Server, max_conns)?;
        match self.group(id) {
            Some(g) => {
                self.publish(&g);
                Some(g)
            }
            None => None,
        }
    }

    /// A client connection to `peer` whose server put it into its existing group
    /// `server_lgr_id`: our counterpart of that group, if we still have it (else the server
    /// is out of sync with us).
    pub fn join_client(&self, peer: Gid, local: Gid, server_lgr_id: u32) -> Option<Arc<LinkGroup>> {
        let g = lock(&self.groups)
            .values()
            .find(|g| {
                g.role == Role::Client
                    && g.peer_gid == peer
                    && g.local_gid == local
                    && g.peer_lgr_id == server_lgr_id
            })
            .cloned()?;
        if !lock(&self.book).join_id(g.id, Role::Client) {
            return None;
        }
        self.publish(&g);
        Some(g)
    }

    /// A fresh id for a group this engine creates. Ids are unique on the host as the kernel's
    /// (one counter there, stepping by 256: the low byte is left for link ids): smcd hands
    /// each engine blocks of 256 (`first_block`, its engine id, is the first), and `more`
    /// asks for the next when one is used up (a round trip once per 256 groups; if smcd
    /// cannot give one, the engine's current block is used again).
    pub fn next_id(&self, first_block: u32, more: impl FnOnce() -> Option<u32>) -> u32 {
        let mut b = lock(&self.ids);
        if b.first != first_block || b.block == 0 {
            *b = IdBlock {
                first: first_block,
                block: first_block,
                n: 0,
            };
        }
        if b.n > 0xff {
            if let Some(next) = more() {
                b.block = next;
            }
            b.n = 0;
        }
        let id = (b.block & 0xffff) << 16 | b.n << 8;
        b.n += 1;
        id.max(0x100)
    }

    /// Creates a group with one connection. A server's group takes no other connection until
    /// [`Self::ready`]. `peer_lgr_id`: see [`LinkGroup::peer_lgr_id`].
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        id: u32,
        peer: Gid,
        local: Gid,
        role: Role,
        peer_lgr_id: u32,
        v2: PeerV2,
        status: &Arc<StatusArea>,
    ) -> Arc<LinkGroup> {
        // The epoll set exists before any group's channel is added to it.
        let _ = self.bell_ep();
        let g = Arc::new(LinkGroup {
            id,
            peer_gid: peer,
            local_gid: local,
            role,
            peer_lgr_id,
            peer: Mutex::new(v2),
            pool: Mutex::new(Pool::default()),
            slot: status.lgr_slot(),
            idle: Arc::clone(&self.idle),
            bells: Arc::new(Bells::new()),
            handover: Mutex::new(None),
            bell_ep: Arc::clone(&self.bell_ep),
        });
        // The server makes the group, so it makes the bell channel: one end for itself, the
        // other for the client with the group's first DMB. (Without one the group still
        // works; only readiness descriptors fail in it.)
        if role == Role::Server {
            match crate::device::bell_channel() {
                Ok((kept, handed)) => {
                    g.install_bells(kept);
                    *lock(&g.handover) = Some(handed);
                }
                Err(e) => tracing::debug!("no bell channel for link group {id:#x}: {e}"),
            }
        }
        lock(&self.groups).insert(id, Arc::clone(&g));
        lock(&self.book).create(id, (peer, local), role);
        g.publish(1);
        g
    }

    /// The server's first contact finished: the client has the group, others may join. The
    /// peer's first-contact extension is recorded.
    pub fn ready(&self, g: &LinkGroup, peer: PeerV2) {
        *lock(&g.peer) = peer;
        lock(&self.book).ready(g.id);
        self.settled.notify_all();
        self.publish(g);
    }

    /// The group takes no more connections (its first contact failed, the peer is gone or
    /// out of sync).
    pub fn kill(&self, g: &LinkGroup) {
        lock(&self.book).kill(g.id);
        self.settled.notify_all();
    }

    /// Every group to `peer` takes no more connections (it said we are out of sync).
    pub fn kill_peer(&self, peer: Gid, local: Gid) {
        lock(&self.book).kill_peer((peer, local));
        self.settled.notify_all();
    }

    /// The engine with GID `peer` has ended (`smcd` said so): every group with it takes no
    /// more connections, and those without connections are freed at once; the others when
    /// their last connection ends. Returns how many groups it had.
    pub fn peer_gone(&self, dev: &dyn BufferProvider, peer: Gid, idle: Duration) -> usize {
        let n = lock(&self.book).kill_matching(|k| k.0 == peer);
        if n > 0 {
            self.settled.notify_all();
            self.sweep(dev, idle);
        }
        n
    }

    /// Gives the housekeeping thread the write end of its doorbell (once).
    pub fn set_kick(&self, fd: rustix::fd::OwnedFd) {
        let _ = self.kick.set(fd);
    }

    fn ring_kick(&self) {
        if let Some(fd) = self.kick.get() {
            // Non-blocking: a full pipe has a wake-up pending already.
            let _ = rustix::io::write(fd, &[1]);
        }
    }

    /// Every group takes no more connections (the device went away).
    pub fn kill_all(&self) {
        lock(&self.book).kill_all();
        self.settled.notify_all();
    }

    /// A connection of `g` ended (or its handshake failed).
    pub fn release(&self, g: &LinkGroup) {
        let dead_and_empty = {
            let mut book = lock(&self.book);
            book.release(g.id, crate::sys::core_now());
            book.get(g.id)
                .is_some_and(|x| x.conns == 0 && x.state == smc_core::lgr::GroupState::Dead)
        };
        self.publish(g);
        if dead_and_empty {
            self.ring_kick();
        }
    }

    /// Bytes of idle DMBs kept for reuse (at most [`IDLE_DMB_BYTES_MAX`]).
    pub fn idle_dmb_bytes(&self) -> usize {
        self.idle.load(Ordering::Relaxed)
    }

    /// A snapshot of the groups.
    pub fn list(&self) -> Vec<Arc<LinkGroup>> {
        lock(&self.groups).values().cloned().collect()
    }

    /// Connections in group `id`.
    pub fn conns(&self, id: u32) -> u32 {
        lock(&self.book).get(id).map_or(0, |g| g.conns)
    }

    /// When the next group can expire.
    pub fn next_expiry(&self, idle: Duration) -> Option<smc_core::Instant> {
        lock(&self.book).poll_timeout(idle)
    }

    /// Frees groups idle longer than `idle` (the client side 10 s longer), or dead and empty.
    pub fn sweep(&self, dev: &dyn BufferProvider, idle: Duration) {
        let gone = lock(&self.book).expire(crate::sys::core_now(), idle);
        for g in gone {
            if let Some(lg) = lock(&self.groups).remove(&g.id) {
                lg.free_all(dev);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::local::LocalFabric;

    /// Closed DMBs are kept for reuse only up to the engine-wide bound, over all groups;
    /// the rest go back to the device.
    #[test]
    fn idle_buffers_are_bounded_per_engine() {
        let fabric = LocalFabric::new();
        let dev = fabric.device();
        let status = StatusArea::private().unwrap();
        let table = LgrTable::new();
        const LEN: usize = 1024 * 1024;
        let per_group = 24;
        let groups: Vec<_> = (0..3u128)
            .map(|i| {
                let id = table.next_id(1, || None);
                table.create(
                    id,
                    100 + i,
                    dev.gid(),
                    Role::Server,
                    0,
                    PeerV2::default(),
                    &status,
                )
            })
            .collect();
        let mut held = Vec::new();
        for g in &groups {
            for _ in 0..per_group {
                let (d, reused) = g.get_dmb(&dev, LEN).unwrap();
                assert!(!reused);
                held.push((Arc::clone(g), d));
            }
        }
        assert_eq!(fabric.registered(), 3 * per_group);
        for (g, d) in held {
            g.put_dmb(&dev, d, true, false);
            assert!(table.idle_dmb_bytes() <= IDLE_DMB_BYTES_MAX);
        }
        assert_eq!(table.idle_dmb_bytes(), IDLE_DMB_BYTES_MAX);
        assert_eq!(
            fabric.registered(),
            IDLE_DMB_BYTES_MAX / LEN,
            "the rest unregistered"
        );
        // Reuse takes from the pool and gives the bytes back to the bound.
        let (d, reused) = groups[0].get_dmb(&dev, LEN).unwrap();
        assert!(reused);
        assert_eq!(table.idle_dmb_bytes(), IDLE_DMB_BYTES_MAX - LEN);
        groups[0].put_dmb(&dev, d, true, false);
        // A freed group's idle buffers leave the count.
        for g in &groups {
            table.kill(g);
            table.release(g);
        }
        table.sweep(&dev, Duration::from_secs(600));
        assert_eq!(table.idle_dmb_bytes(), 0);
        assert_eq!(fabric.registered(), 0);
    }

    /// Ids do not repeat within an engine while smcd hands out blocks, and never take the
    /// low byte.
    #[test]
    fn group_ids_come_in_blocks_from_smcd() {
        let table = LgrTable::new();
        let mut next_block = 7u32;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let id = table.next_id(5, || {
                next_block += 1;
                Some(next_block)
            });
            assert_eq!(id & 0xff, 0);
            assert!(seen.insert(id), "id {id:#x} repeated");
        }
        assert_eq!(next_block, 7 + 3, "a block per 256 groups after the first");
        // smcd gave no block: the engine's current one is used again.
        let t = LgrTable::new();
        let first: Vec<u32> = (0..256).map(|_| t.next_id(9, || None)).collect();
        assert_eq!(t.next_id(9, || None), first[0].max(0x100));
        // A new registration (smcd restarted) starts from its own first block.
        assert_eq!(t.next_id(11, || None), 11 << 16);
    }
}
