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
pub use smc_core::lgr::Role;
use smc_core::lgr::{Join, LgrBook};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
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
    peer: Mutex<PeerV2>,
    pool: Mutex<Pool>,
    slot: LgrSlot,
}

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
        {
            let mut p = lock(&self.pool);
            let mut i = 0;
            while i < p.draining.len() {
                if p.draining[i].peer_done() {
                    let d = p.draining.swap_remove(i);
                    p.free.push(d);
                } else {
                    i += 1;
                }
            }
            if let Some(pos) = p.free.iter().position(|d| d.map.dmb_len() == len) {
                let d = p.free.swap_remove(pos);
                d.map.reset();
                return Ok((d, true));
            }
        }
        let d = Arc::new(dev.register_dmb(len, self.peer_gid)?);
        lock(&self.pool).dmb_bytes += len;
        Ok((d, false))
    }

    /// The peer's DMB `token`, attached once and kept for reuse; the flag says it was
    /// already attached.
    pub fn attach(&self, dev: &dyn BufferProvider, token: u64) -> io::Result<(Arc<Dmb>, bool)> {
        if let Some(d) = lock(&self.pool).attached.get(&token) {
            return Ok((Arc::clone(d), true));
        }
        let d = Arc::new(dev.attach_dmb(token)?);
        let mut p = lock(&self.pool);
        let d = Arc::clone(p.attached.entry(token).or_insert_with(|| d));
        p.sndbuf_bytes = p.attached.values().map(|d| d.map.dmb_len()).sum();
        Ok((d, false))
    }

    /// Returns a connection's DMB: `reusable` when the peer has closed too, else it waits in
    /// the draining list; a DMB of an aborted connection is dropped (and unregistered).
    pub fn put_dmb(&self, dev: &dyn BufferProvider, dmb: Arc<Dmb>, reusable: bool, aborted: bool) {
        let mut p = lock(&self.pool);
        if aborted {
            p.dmb_bytes = p.dmb_bytes.saturating_sub(dmb.map.dmb_len());
            drop(p);
            dev.unregister_dmb(dmb.token);
            return;
        }
        if reusable {
            p.free.push(dmb);
        } else {
            p.draining.push(dmb);
        }
    }

    /// Forgets a cached attachment (the peer's DMB turned out bad).
    pub fn detach(&self, token: u64) {
        let mut p = lock(&self.pool);
        p.attached.remove(&token);
        p.sndbuf_bytes = p.attached.values().map(|d| d.map.dmb_len()).sum();
    }

    /// Frees the group's buffers (it expired).
    fn free_all(&self, dev: &dyn BufferProvider) {
        let mut p = lock(&self.pool);
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
    next: AtomicU32,
}

impl LgrTable {
    /// An empty table whose ids start from `base`.
    pub fn new(base: u32) -> Self {
        Self {
            next: AtomicU32::new(base),
            ..Self::default()
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

    /// A client connection to `peer` whose server reused a group: our counterpart, if we
    /// still have it (else the server is out of sync with us).
    pub fn join_client(&self, peer: Gid, local: Gid) -> Option<Arc<LinkGroup>> {
        let id = lock(&self.book).join_existing((peer, local), Role::Client, u32::MAX)?;
        let g = self.group(id)?;
        self.publish(&g);
        Some(g)
    }

    /// A fresh id for a group this engine creates. Ids are unique on the host as the kernel's
    /// (one counter there): smcd's engine id in the high half, a counter above the low byte,
    /// which is left for link ids as the kernel's ids step by 256.
    pub fn next_id(&self, engine_id: u32) -> u32 {
        let n = self.next.fetch_add(1, Ordering::Relaxed) & 0xff;
        ((engine_id & 0xffff) << 16 | n << 8).max(0x100)
    }

    /// Creates a group with one connection. A server's group takes no other connection until
    /// [`Self::ready`].
    pub fn create(
        &self,
        id: u32,
        peer: Gid,
        local: Gid,
        role: Role,
        v2: PeerV2,
        status: &Arc<StatusArea>,
    ) -> Arc<LinkGroup> {
        let g = Arc::new(LinkGroup {
            id,
            peer_gid: peer,
            local_gid: local,
            role,
            peer: Mutex::new(v2),
            pool: Mutex::new(Pool::default()),
            slot: status.lgr_slot(),
        });
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

    /// Every group takes no more connections (the device went away).
    pub fn kill_all(&self) {
        lock(&self.book).kill_all();
        self.settled.notify_all();
    }

    /// A connection of `g` ended (or its handshake failed).
    pub fn release(&self, g: &LinkGroup) {
        lock(&self.book).release(g.id, crate::sys::core_now());
        self.publish(g);
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
