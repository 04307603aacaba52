//! Link-group bookkeeping (`smc_core.c`): which group a new connection joins, when a group may
//! be reused, and when an idle one is freed. Buffers and devices stay with the driver; this
//! keeps the counts and the rules, and takes `now` as an argument.
//!
//! The kernel's rules (`smc_conn_create`, `smcd_lgr_match`): a connection joins a group with
//! the same peer (for SMC-D: the peer GID and VLAN on the same device) and the same role (a
//! client's connections join client groups, a server's join server groups), that is not being
//! freed or out of sync, and is below the connection limit. A server's group takes further
//! connections only once its first-contact handshake has finished; until then they wait for
//! it (the kernel's `smc_server_lgr_pending`, here per group, so setup of one group never waits
//! for another's). An idle group is freed after `smc_lgr_idle_time` (600 s on the server side,
//! the client keeps its side 10 s longer so a server never reuses a group the client freed).

use crate::time::Instant;
use alloc::vec::Vec;
use core::time::Duration;

/// How much longer a client keeps an idle group than a server (`SMC_LGR_FREE_DELAY_CLNT` -
/// `SMC_LGR_FREE_DELAY_SERV`).
pub const CLIENT_EXTRA_IDLE: Duration = Duration::from_secs(10);

/// Which side created the group (`lgr->role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// We sent the first-contact Confirm.
    Client,
    /// We sent the first-contact Accept.
    Server,
}

/// Where a group is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    /// First contact in progress (server): other connections wait.
    Pending,
    /// Takes connections.
    Ready,
    /// Takes no new connections (peer lost, out of sync, device gone); freed when empty.
    Dead,
}

/// What a new connection should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    /// It joined this group (a slot is taken).
    Joined(u32),
    /// This group's first contact is still running: wait for it, then ask again.
    Wait(u32),
    /// No group fits: make a new one (first contact) with [`LgrBook::create`].
    New,
}

/// One group's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group<K> {
    /// The group id.
    pub id: u32,
    /// Who the peer is.
    pub key: K,
    /// Who created it.
    pub role: Role,
    /// Connections in it.
    pub conns: u32,
    /// Its state.
    pub state: GroupState,
    /// Since when it has had no connection.
    pub idle_since: Option<Instant>,
}

/// The link groups of one engine (or one device), keyed by the peer `K`.
#[derive(Debug, Clone)]
pub struct LgrBook<K> {
    groups: Vec<Group<K>>,
}

impl<K> Default for LgrBook<K> {
    fn default() -> Self {
        Self { groups: Vec::new() }
    }
}

impl<K: Copy + PartialEq> LgrBook<K> {
    /// No groups.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new connection with `role` to `key`: join a fitting group, wait for one being set up,
    /// or make a new one. Joining takes a slot.
    pub fn join(&mut self, key: K, role: Role, max_conns: u32) -> Join {
        let mut wait = None;
        for g in self
            .groups
            .iter_mut()
            .filter(|g| g.key == key && g.role == role)
        {
            match g.state {
                GroupState::Ready if g.conns < max_conns => {
                    g.conns += 1;
                    g.idle_since = None;
                    return Join::Joined(g.id);
                }
                GroupState::Pending => wait = wait.or(Some(g.id)),
                _ => {}
            }
        }
        wait.map_or(Join::New, Join::Wait)
    }

    /// Joins the group `id` if it is ready and below `max_conns` (a client told by the
    /// server's Accept that a group exists looks for its own counterpart this way).
    pub fn join_existing(&mut self, key: K, role: Role, max_conns: u32) -> Option<u32> {
        match self.join(key, role, max_conns) {
            Join::Joined(id) => Some(id),
            _ => None,
        }
    }

    /// Joins group `id` if it exists with `role` and is ready (a client told by the server's
    /// Accept which group the connection is in joins its counterpart of exactly that group).
    pub fn join_id(&mut self, id: u32, role: Role) -> bool {
        match self.get_mut(id) {
            Some(g) if g.role == role && g.state == GroupState::Ready => {
                g.conns += 1;
                g.idle_since = None;
                true
            }
            _ => false,
        }
    }

    /// Adds a group with one connection. A server's group is [`GroupState::Pending`] until
    /// [`Self::ready`]; a client's is ready at once (its first contact ends with the Confirm).
    pub fn create(&mut self, id: u32, key: K, role: Role) {
        self.groups.push(Group {
            id,
            key,
            role,
            conns: 1,
            state: match role {
                Role::Client => GroupState::Ready,
                Role::Server => GroupState::Pending,
            },
            idle_since: None,
        });
    }

    /// The group's first contact finished: others may join.
    pub fn ready(&mut self, id: u32) {
        if let Some(g) = self.get_mut(id)
            && g.state == GroupState::Pending
        {
            g.state = GroupState::Ready;
        }
    }

    /// The group takes no more connections.
    pub fn kill(&mut self, id: u32) {
        if let Some(g) = self.get_mut(id) {
            g.state = GroupState::Dead;
        }
    }

    /// Every group to `key` takes no more connections (the peer said we are out of sync).
    pub fn kill_peer(&mut self, key: K) {
        for g in self.groups.iter_mut().filter(|g| g.key == key) {
            g.state = GroupState::Dead;
        }
    }

    /// Every group whose peer `f` picks takes no more connections; returns how many there
    /// were (the peer ended, `smc_smcd_terminate`).
    pub fn kill_matching(&mut self, f: impl Fn(&K) -> bool) -> usize {
        let mut n = 0;
        for g in self.groups.iter_mut().filter(|g| f(&g.key)) {
            g.state = GroupState::Dead;
            n += 1;
        }
        n
    }

    /// Every group takes no more connections (the device went away).
    pub fn kill_all(&mut self) {
        for g in &mut self.groups {
            g.state = GroupState::Dead;
        }
    }

    /// A connection of group `id` ended (or its handshake failed).
    pub fn release(&mut self, id: u32, now: Instant) {
        if let Some(g) = self.get_mut(id) {
            g.conns = g.conns.saturating_sub(1);
            if g.conns == 0 {
                g.idle_since = Some(now);
            }
        }
    }

    /// The group `id`.
    pub fn get(&self, id: u32) -> Option<&Group<K>> {
        self.groups.iter().find(|g| g.id == id)
    }

    fn get_mut(&mut self, id: u32) -> Option<&mut Group<K>> {
        self.groups.iter_mut().find(|g| g.id == id)
    }

    /// All groups.
    pub fn groups(&self) -> &[Group<K>] {
        &self.groups
    }

    fn idle_limit(role: Role, idle: Duration) -> Duration {
        match role {
            Role::Client => idle + CLIENT_EXTRA_IDLE,
            Role::Server => idle,
        }
    }

    /// When the next group expires (an empty dead group: now).
    pub fn poll_timeout(&self, idle: Duration) -> Option<Instant> {
        self.groups
            .iter()
            .filter(|g| g.conns == 0)
            .filter_map(|g| match (g.state, g.idle_since) {
                (GroupState::Dead, Some(t)) => Some(t),
                (_, Some(t)) => Some(t + Self::idle_limit(g.role, idle)),
                _ => None,
            })
            .min()
    }

    /// Removes and returns the groups to free: empty and dead, or idle for longer than `idle`
    /// (the client side 10 s longer).
    pub fn expire(&mut self, now: Instant, idle: Duration) -> Vec<Group<K>> {
        let mut gone = Vec::new();
        self.groups.retain(|g| {
            let expired = g.conns == 0
                && g.idle_since.is_some_and(|t| {
                    g.state == GroupState::Dead || now >= t + Self::idle_limit(g.role, idle)
                });
            if expired {
                gone.push(*g);
            }
            !expired
        });
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn join_rules() {
        let mut b = LgrBook::new();
        assert_eq!(b.join(7u128, Role::Server, 2), Join::New);
        b.create(0x100, 7, Role::Server);
        // First contact running: wait.
        assert_eq!(b.join(7, Role::Server, 2), Join::Wait(0x100));
        b.ready(0x100);
        assert_eq!(b.join(7, Role::Server, 2), Join::Joined(0x100));
        // Full at two connections.
        assert_eq!(b.join(7, Role::Server, 2), Join::New);
        // Another peer, or the other role, never shares the group.
        assert_eq!(b.join(8, Role::Server, 255), Join::New);
        assert_eq!(b.join(7, Role::Client, 255), Join::New);
        b.kill(0x100);
        assert_eq!(
            b.join(7, Role::Server, 255),
            Join::New,
            "a dead group takes no one"
        );
    }

    #[test]
    fn client_groups_are_ready_at_once() {
        let mut b = LgrBook::new();
        b.create(0x200, 1u128, Role::Client);
        assert_eq!(b.join_existing(1, Role::Client, 255), Some(0x200));
        assert_eq!(b.join_existing(2, Role::Client, 255), None);
        // By id: only that group, only with its role, only while it is ready.
        assert!(b.join_id(0x200, Role::Client));
        assert!(!b.join_id(0x200, Role::Server));
        assert!(!b.join_id(0x999, Role::Client));
        b.kill(0x200);
        assert!(!b.join_id(0x200, Role::Client));
    }

    #[test]
    fn idle_expiry_with_now() {
        let mut b = LgrBook::new();
        let t0 = Instant::ZERO;
        b.create(1, 1u128, Role::Server);
        b.ready(1);
        b.create(2, 1u128, Role::Client);
        b.release(1, t0);
        b.release(2, t0);
        let idle = 600 * S;
        assert_eq!(b.poll_timeout(idle), Some(t0 + idle));
        assert!(b.expire(t0 + (idle - S), idle).is_empty());
        let gone = b.expire(t0 + idle, idle);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].id, 1, "the server side goes first");
        assert_eq!(b.poll_timeout(idle), Some(t0 + idle + CLIENT_EXTRA_IDLE));
        assert_eq!(b.expire(t0 + idle + CLIENT_EXTRA_IDLE, idle)[0].id, 2);
        assert!(b.groups().is_empty());
    }

    #[test]
    fn a_connection_keeps_its_group_alive() {
        let mut b = LgrBook::new();
        b.create(1, 1u128, Role::Client);
        b.release(1, Instant::ZERO);
        assert_eq!(b.join(1, Role::Client, 255), Join::Joined(1));
        assert!(b.expire(Instant::ZERO + 10_000 * S, 600 * S).is_empty());
        b.kill(1);
        assert!(
            b.expire(Instant::ZERO + 10_000 * S, 600 * S).is_empty(),
            "still used"
        );
        b.release(1, Instant::ZERO + 10_000 * S);
        assert_eq!(b.poll_timeout(600 * S), Some(Instant::ZERO + 10_000 * S));
        assert_eq!(
            b.expire(Instant::ZERO + 10_000 * S, 600 * S).len(),
            1,
            "dead and empty: at once"
        );
    }

    #[test]
    fn a_gone_peer_frees_its_groups_at_once() {
        let mut b = LgrBook::new();
        let key = |peer: u128, local: u128| (peer, local);
        b.create(1, key(7, 1), Role::Server);
        b.create(2, key(7, 2), Role::Client);
        b.create(3, key(8, 1), Role::Server);
        for id in 1..=3 {
            b.ready(id);
        }
        b.release(1, Instant::ZERO);
        b.release(3, Instant::ZERO);
        assert_eq!(
            b.kill_matching(|k| k.0 == 7),
            2,
            "both roles, every local GID"
        );
        let gone = b.expire(Instant::ZERO, 600 * S);
        assert_eq!(
            gone.iter().map(|g| g.id).collect::<Vec<_>>(),
            [1],
            "empty: at once"
        );
        assert_eq!(
            b.join(key(7, 2), Role::Client, 255),
            Join::New,
            "dead takes no one"
        );
        b.release(2, Instant::ZERO + S);
        assert_eq!(
            b.expire(Instant::ZERO + S, 600 * S)[0].id,
            2,
            "freed at its last close"
        );
        assert_eq!(b.groups().len(), 1, "another peer's idle group stays");
    }
}
