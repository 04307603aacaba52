//! SMC-D link groups of one engine (the kernel's `smc_core.c` for SMC-D): connections between
//! the same two GIDs share a link group up to its connection limit; each connection has one
//! DMB (RMBE) from the group's pool; DMBs of closed connections are reused, peer DMBs stay
//! attached for reuse; an idle group is freed after the idle time.
//!
//! Locking: the table lock is held only to look up or insert a group; a group's lock only for
//! its bookkeeping. Device round trips (registering or attaching a DMB through `smcd`) happen
//! with no lock held, so a slow first contact never holds up other connections (the lesson
//! of the kernel's `smc_server_lgr_pending` / `smc_client_lgr_pending` patches).

use crate::device::{Dmb, Gid, SmcdDevice};
use crate::layout::status::{LgrRecord, LgrSlot, StatusArea};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Which side created the link group (the kernel's `lgr->role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// We sent the first-contact Confirm.
    Client,
    /// We sent the first-contact Accept.
    Server,
}

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

#[derive(Debug)]
struct Pool {
    conns: u32,
    free: Vec<Arc<Dmb>>,
    /// DMBs of connections closed locally whose peer had not closed yet.
    draining: Vec<Arc<Dmb>>,
    attached: HashMap<u64, Arc<Dmb>>,
    idle_since: Option<Instant>,
    dead: bool,
    /// The first-contact handshake has finished (server side); until then reuse waits.
    ready: bool,
    dmb_bytes: usize,
    sndbuf_bytes: usize,
}

/// One SMC-D link group.
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
    /// First-contact information.
    peer: Mutex<PeerV2>,
    pool: Mutex<Pool>,
    ready_cv: Condvar,
    slot: LgrSlot,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether the peer has put its close or abort flag into this DMB: it will not write again.
pub fn peer_done_with(dmb: &Dmb) -> bool {
    let w = smc_proto::cdc::SmcdCursorWord::decode(dmb.map.cons_word().load(Ordering::Acquire));
    w.conn_flags.peer_conn_closed() || w.conn_flags.peer_conn_abort()
}

impl LinkGroup {
    fn new(
        id: u32,
        peer_gid: Gid,
        local_gid: Gid,
        role: Role,
        peer: PeerV2,
        slot: LgrSlot,
    ) -> Self {
        Self {
            id,
            peer_gid,
            local_gid,
            role,
            peer: Mutex::new(peer),
            slot,
            ready_cv: Condvar::new(),
            pool: Mutex::new(Pool {
                conns: 0,
                free: Vec::new(),
                draining: Vec::new(),
                attached: HashMap::new(),
                idle_since: None,
                dead: false,
                ready: role == Role::Client,
                dmb_bytes: 0,
                sndbuf_bytes: 0,
            }),
        }
    }

    /// Writes the group's current state into its status slot (for `GET_LGR_SMCD`).
    pub fn publish(&self) {
        // Held across the write: two threads publishing at once must not leave the older
        // snapshot in the slot.
        let p = lock(&self.pool);
        let (conns, sndbuf, dmb) = (p.conns, p.sndbuf_bytes, p.dmb_bytes);
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
            sndbuf: sndbuf as u64,
            dmb: dmb as u64,
            peer_host: peer.hostname,
            eid: peer.eid,
        });
        drop(p);
    }

    /// What the peer said in the first-contact exchange.
    pub fn peer(&self) -> PeerV2 {
        lock(&self.peer).clone()
    }

    /// Records the peer's first-contact extension (the server learns it from the Confirm).
    pub fn set_peer(&self, p: PeerV2) {
        *lock(&self.peer) = p;
        self.publish();
    }

    /// Live connections.
    pub fn conns(&self) -> u32 {
        lock(&self.pool).conns
    }

    /// Bytes of DMBs this group holds (ours) and of attached peer DMBs (our send buffers).
    pub fn buffer_totals(&self) -> (usize, usize) {
        let p = lock(&self.pool);
        (p.sndbuf_bytes, p.dmb_bytes)
    }

    /// Whether the group still takes new connections.
    pub fn is_dead(&self) -> bool {
        lock(&self.pool).dead
    }

    /// Stops new connections from using this group (peer lost, device restarted).
    pub fn kill(&self) {
        let mut p = lock(&self.pool);
        p.dead = true;
        p.ready = true;
        self.ready_cv.notify_all();
    }

    /// The server's first-contact handshake finished: the client has the group, so other
    /// connections may now be accepted into it.
    pub fn set_ready(&self) {
        lock(&self.pool).ready = true;
        self.ready_cv.notify_all();
    }

    /// Takes a connection slot if the group is alive and below `max_conns`, first waiting
    /// for its first-contact handshake to finish (only connections to this peer wait, and only
    /// while this group is being set up: the kernel's lgr-pending lock, narrowed to one group).
    fn try_reserve(&self, max_conns: u32) -> bool {
        let mut p = lock(&self.pool);
        while !p.ready {
            p = self.ready_cv.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        if p.dead || p.conns >= max_conns {
            return false;
        }
        p.conns += 1;
        p.idle_since = None;
        drop(p);
        self.publish();
        true
    }

    /// Gives back a connection slot (connection freed or handshake failed).
    pub fn release_slot(&self) {
        let mut p = lock(&self.pool);
        p.conns = p.conns.saturating_sub(1);
        if p.conns == 0 {
            p.idle_since = Some(Instant::now());
        }
        drop(p);
        self.publish();
    }

    /// A DMB of exactly `len` bytes for a new connection: a free one, a drained one whose
    /// peer has closed, or a new registration. The header is reset.
    pub fn get_dmb(&self, dev: &dyn SmcdDevice, len: usize) -> io::Result<(Arc<Dmb>, bool)> {
        {
            let mut p = lock(&self.pool);
            let mut i = 0;
            while i < p.draining.len() {
                if peer_done_with(&p.draining[i]) {
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
        self.publish();
        Ok((d, false))
    }

    /// The peer's DMB `token`, attached once and kept for reuse; the flag says it was
    /// already attached.
    pub fn attach(&self, dev: &dyn SmcdDevice, token: u64) -> io::Result<(Arc<Dmb>, bool)> {
        if let Some(d) = lock(&self.pool).attached.get(&token) {
            return Ok((Arc::clone(d), true));
        }
        let d = Arc::new(dev.attach_dmb(token)?);
        let mut p = lock(&self.pool);
        let d = Arc::clone(p.attached.entry(token).or_insert_with(|| d));
        p.sndbuf_bytes = p.attached.values().map(|d| d.map.dmb_len()).sum();
        drop(p);
        self.publish();
        Ok((d, false))
    }

    /// Returns a connection's DMB: `reusable` when the peer has closed too, else it waits in
    /// the draining list; a DMB of an aborted connection is dropped (and unregistered).
    pub fn put_dmb(&self, dev: &dyn SmcdDevice, dmb: Arc<Dmb>, reusable: bool, aborted: bool) {
        if aborted {
            let mut p = lock(&self.pool);
            p.dmb_bytes = p.dmb_bytes.saturating_sub(dmb.map.dmb_len());
            drop(p);
            dev.unregister_dmb(dmb.token);
            return;
        }
        let mut p = lock(&self.pool);
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

    /// Frees the group's buffers (it is idle or dead and has no connections).
    fn free_all(&self, dev: &dyn SmcdDevice) {
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

/// All link groups of one engine.
#[derive(Debug, Default)]
pub struct LgrTable {
    groups: Mutex<Vec<Arc<LinkGroup>>>,
    next: AtomicU32,
}

impl LgrTable {
    /// An empty table whose ids start from `base`.
    pub fn new(base: u32) -> Self {
        Self {
            groups: Mutex::new(Vec::new()),
            next: AtomicU32::new(base),
        }
    }

    /// A link group to `peer` with room for one more connection, with the slot taken
    /// (`smc_conn_create` looking for an existing group).
    pub fn reuse(&self, peer: Gid, local: Gid, max_conns: u32) -> Option<Arc<LinkGroup>> {
        // Candidates are collected first: waiting for a group's setup never holds the table.
        let candidates: Vec<_> = lock(&self.groups)
            .iter()
            .filter(|g| g.peer_gid == peer && g.local_gid == local)
            .cloned()
            .collect();
        candidates.into_iter().find(|g| g.try_reserve(max_conns))
    }

    /// A fresh id for a group this engine creates. Ids are unique on the host as the kernel's
    /// (one counter there): smcd's engine id in the high half, a counter above the low byte,
    /// which is left for link ids as the kernel's ids step by 256.
    pub fn next_id(&self, engine_id: u32) -> u32 {
        let n = self.next.fetch_add(1, Ordering::Relaxed) & 0xff;
        ((engine_id & 0xffff) << 16 | n << 8).max(0x100)
    }

    /// Creates and inserts a group with one slot taken. A server's group is not ready for
    /// other connections until [`LinkGroup::set_ready`].
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        id: u32,
        peer: Gid,
        local: Gid,
        role: Role,
        v2: PeerV2,
        status: &Arc<StatusArea>,
    ) -> Arc<LinkGroup> {
        let g = Arc::new(LinkGroup::new(id, peer, local, role, v2, status.lgr_slot()));
        lock(&g.pool).conns = 1;
        g.publish();
        lock(&self.groups).push(Arc::clone(&g));
        g
    }

    /// A snapshot of the groups.
    pub fn list(&self) -> Vec<Arc<LinkGroup>> {
        lock(&self.groups).clone()
    }

    /// Frees groups idle longer than `idle` (or dead) with no connections.
    pub fn sweep(&self, dev: &dyn SmcdDevice, idle: Duration) {
        let now = Instant::now();
        let mut gone = Vec::new();
        lock(&self.groups).retain(|g| {
            let p = lock(&g.pool);
            // The client keeps its side 10 s longer (the kernel's 600 s / 610 s), so a server
            // never reuses a group the client already freed.
            let idle = match g.role {
                Role::Client => idle + Duration::from_secs(10),
                Role::Server => idle,
            };
            let expired = p.conns == 0
                && (p.dead || p.idle_since.is_some_and(|t| now.duration_since(t) >= idle));
            drop(p);
            if expired {
                gone.push(Arc::clone(g));
            }
            !expired
        });
        for g in gone {
            g.free_all(dev);
        }
    }

    /// Kills every group (the device went away).
    pub fn kill_all(&self) {
        for g in lock(&self.groups).iter() {
            g.kill();
        }
    }
}
