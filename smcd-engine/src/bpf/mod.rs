//! The kernel's SMC TCP option (kind 254, length 6, magic `E2 D4 C3 D9`), written and read by
//! a BPF `sock_ops` program (`smcd-engine/bpf/smc_option.bpf.c`) that `smcd` attaches to a
//! cgroup: the role `tp->syn_smc`, `ireq->smc_ok` and `smc_hs_congested` play in
//! `net/ipv4/tcp_output.c`, `tcp_input.c` and `net/smc/af_smc.c`. See `docs/syn-option.md`.
//!
//! This module is what smcd and engines share: the maps' layouts and the operations on them,
//! through plain `bpf(2)` calls on the map descriptors smcd hands out (no bpffs, no
//! privilege: a map descriptor is the capability). Loading and attaching is
//! [`loader`] (feature `loader`, smcd only).
//!
//! | map | key | what |
//! |---|---|---|
//! | `smc_sk` (`SK_STORAGE`) | a socket's descriptor | per-socket [`SockOption`] flags: "propose SMC" (set by user space before `connect`), what the SYN / SYN-ACK carried, whether we echoed |
//! | `smc_listeners` (`HASH`) | [`ListenerKey`]: netns cookie, local address (or wildcard), port | a registered SMC listener and its congested flag |
//! | `smc_reqs` (`LRU_HASH`) | a connection request's tuple and ISN | the echo decision of its first SYN-ACK, until the handshake ends (program-private) |
//!
//! Every function returns an [`io::Error`] that says what failed; none panics on any input.

#[cfg(feature = "loader")]
pub mod loader;

use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// User space: propose SMC on this socket's SYN (the kernel's `tp->syn_smc`).
pub const SK_CLIENT: u32 = 0x01;
/// Our SYN carried the option.
pub const SK_SYN_OPT_SENT: u32 = 0x02;
/// Client: the SYN-ACK carried the option. Server: the SYN carried it.
pub const SK_PEER_OPT: u32 = 0x04;
/// Server: our SYN-ACK carried the option.
pub const SK_ECHOED: u32 = 0x08;
/// The program saw the handshake end: the flags are final.
pub const SK_ESTABLISHED: u32 = 0x10;
/// An accepted connection of a registered listener.
pub const SK_PASSIVE: u32 = 0x20;
/// Listener value: handshake limitation says the listener is congested (no echo).
pub const LISTENER_CONGESTED: u32 = 0x01;

/// The object `bpf/build.sh` makes from `bpf/smc_option.bpf.c` (committed; CI checks that
/// rebuilding gives the same bytes).
pub const OBJECT: &[u8] = include_bytes!("../../bpf/smc_option.bpf.o");
/// The program's name in [`OBJECT`].
pub const PROGRAM: &str = "smc_option";
/// The socket-storage map's name.
pub const MAP_SK: &str = "smc_sk";
/// The listener map's name.
pub const MAP_LISTENERS: &str = "smc_listeners";

/// What the option path recorded for one socket (`smc_sk`'s value).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SockOption {
    /// The raw flags (`SK_*`).
    pub flags: u32,
}

impl SockOption {
    fn has(self, f: u32) -> bool {
        self.flags & f != 0
    }
    /// User space marked the socket as an SMC client.
    pub fn marked_client(self) -> bool {
        self.has(SK_CLIENT)
    }
    /// Our SYN carried the option.
    pub fn syn_sent(self) -> bool {
        self.has(SK_SYN_OPT_SENT)
    }
    /// The peer's handshake segment carried it: the SYN-ACK for a client, the SYN for an
    /// accepted connection.
    pub fn peer_had(self) -> bool {
        self.has(SK_PEER_OPT)
    }
    /// Accepted connection: our SYN-ACK echoed the option.
    pub fn echoed(self) -> bool {
        self.has(SK_ECHOED)
    }
    /// The program saw the three-way handshake end on this socket.
    pub fn established(self) -> bool {
        self.has(SK_ESTABLISHED)
    }
    /// An accepted connection of a registered SMC listener.
    pub fn passive(self) -> bool {
        self.has(SK_PASSIVE)
    }
    /// Whether CLC runs on this connection, as both ends know it from the option:
    /// `Some(true)` SMC (a Proposal follows), `Some(false)` plain TCP (PEERNOSMC), `None`
    /// when the program did not see this socket's handshake (not attached, or a socket of
    /// another cgroup): then the option path cannot decide and the caller must not guess.
    pub fn clc_runs(self) -> Option<bool> {
        if !self.established() {
            return None;
        }
        if self.passive() {
            Some(self.peer_had() && self.echoed())
        } else if self.marked_client() && self.syn_sent() {
            Some(self.peer_had())
        } else {
            None
        }
    }
}

/// A registered SMC listener as the program looks it up: the namespace's cookie
/// (`SO_NETNS_COOKIE`), the local address (IPv4 as `::ffff:a.b.c.d`; wildcards
/// `::ffff:0.0.0.0` and `::`) and the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListenerKey {
    /// The network namespace's cookie.
    pub netns_cookie: u64,
    /// The local address, IPv4 mapped.
    pub addr: Ipv6Addr,
    /// The port.
    pub port: u16,
}

impl ListenerKey {
    /// `struct smc_listener_key`: u64 cookie (host order), 16 address bytes, u32 port (host
    /// order, as `skops->local_port`), u32 reserved.
    fn bytes(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&self.netns_cookie.to_ne_bytes());
        b[8..24].copy_from_slice(&self.addr.octets());
        b[24..28].copy_from_slice(&u32::from(self.port).to_ne_bytes());
        b
    }

    /// The keys a listener bound to `addr` answers under: one, or for a dual-stack `[::]`
    /// both wildcards (IPv4 connections to it arrive as IPv4 requests).
    pub fn for_addr(netns_cookie: u64, addr: SocketAddr, v6only: bool) -> Vec<ListenerKey> {
        let key = |a: Ipv6Addr| ListenerKey {
            netns_cookie,
            addr: a,
            port: addr.port(),
        };
        match addr.ip() {
            IpAddr::V4(a) => vec![key(a.to_ipv6_mapped())],
            IpAddr::V6(a) if a.is_unspecified() && !v6only => {
                vec![
                    key(a),
                    key(std::net::Ipv4Addr::UNSPECIFIED.to_ipv6_mapped()),
                ]
            }
            IpAddr::V6(a) => vec![key(a)],
        }
    }
}

/// The maps of a loaded option program, as descriptors (smcd's own, or the ones smcd handed
/// an engine).
#[derive(Debug)]
pub struct Maps {
    sk: OwnedFd,
    listeners: OwnedFd,
}

/// `BPF_MAP_TYPE_HASH`, `BPF_MAP_TYPE_SK_STORAGE`.
const MAP_TYPE_HASH: u32 = 1;
const MAP_TYPE_SK_STORAGE: u32 = 24;

impl Maps {
    /// Takes the two map descriptors and checks that they are what the program made (type,
    /// key and value sizes), so a wrong descriptor fails here and not at the first update.
    pub fn from_fds(sk: OwnedFd, listeners: OwnedFd) -> io::Result<Self> {
        let check = |fd: BorrowedFd<'_>, what: &str, ty: u32, key: u32, value: u32| {
            let info = sys::map_info(fd)
                .map_err(|e| io::Error::new(e.kind(), format!("{what} map: {e}")))?;
            if (info.map_type, info.key_size, info.value_size) != (ty, key, value) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{what} map: type {} key {} value {}, expected type {ty} key {key} value {value}",
                        info.map_type, info.key_size, info.value_size
                    ),
                ));
            }
            Ok(())
        };
        check(sk.as_fd(), MAP_SK, MAP_TYPE_SK_STORAGE, 4, 8)?;
        check(listeners.as_fd(), MAP_LISTENERS, MAP_TYPE_HASH, 32, 8)?;
        Ok(Self { sk, listeners })
    }

    /// The socket-storage map's descriptor (to hand to an engine).
    pub fn sk_fd(&self) -> BorrowedFd<'_> {
        self.sk.as_fd()
    }

    /// The listener map's descriptor (to hand to an engine).
    pub fn listeners_fd(&self) -> BorrowedFd<'_> {
        self.listeners.as_fd()
    }

    /// Duplicates both descriptors.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self {
            sk: crate::sys::dup_banded(&self.sk)?,
            listeners: crate::sys::dup_banded(&self.listeners)?,
        })
    }

    /// Marks a TCP socket, before `connect`, as an SMC client: its SYN will carry the option
    /// (the kernel's `tp->syn_smc`).
    pub fn mark_client(&self, sock: impl AsFd) -> io::Result<()> {
        self.set_sock_flags(sock.as_fd(), SK_CLIENT)
            .map_err(|e| io::Error::new(e.kind(), format!("marking the socket as SMC client: {e}")))
    }

    /// Takes the mark away again (before `connect`).
    pub fn unmark_client(&self, sock: impl AsFd) -> io::Result<()> {
        let fd = sock.as_fd().as_raw_fd();
        match sys::delete(self.sk.as_fd(), &fd.to_ne_bytes()) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r => r.map_err(|e| io::Error::new(e.kind(), format!("unmarking the socket: {e}"))),
        }
    }

    fn set_sock_flags(&self, sock: BorrowedFd<'_>, flags: u32) -> io::Result<()> {
        let fd = sock.as_raw_fd();
        let mut v = [0u8; 8];
        v[..4].copy_from_slice(&flags.to_ne_bytes());
        sys::update(self.sk.as_fd(), &fd.to_ne_bytes(), &v, 0)
    }

    /// What the option path recorded for `sock` (a client after `connect`, an accepted
    /// connection after `accept`): all flags clear when it recorded nothing.
    pub fn sock_option(&self, sock: impl AsFd) -> io::Result<SockOption> {
        let fd = sock.as_fd().as_raw_fd();
        let mut v = [0u8; 8];
        match sys::lookup(self.sk.as_fd(), &fd.to_ne_bytes(), &mut v) {
            Ok(()) => Ok(SockOption {
                flags: u32::from_ne_bytes([v[0], v[1], v[2], v[3]]),
            }),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(SockOption::default()),
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!("reading the socket's option state: {e}"),
            )),
        }
    }

    /// Registers an SMC listener (not congested): SYNs that carry the option and arrive at
    /// one of `keys` are answered with it.
    pub fn register_listener(&self, keys: &[ListenerKey]) -> io::Result<()> {
        for k in keys {
            self.put_listener(k, 0)?;
        }
        Ok(())
    }

    /// Registers the listening socket `sock` (its address, namespace and `IPV6_V6ONLY`) and
    /// returns the keys it was registered under.
    pub fn register_listening_socket(&self, sock: impl AsFd) -> io::Result<Vec<ListenerKey>> {
        let keys = listener_keys(sock.as_fd())?;
        self.register_listener(&keys)?;
        Ok(keys)
    }

    /// Sets or clears the congested flag of a registered listener (handshake limitation: a
    /// congested listener's SYN-ACKs go out without the option). `NotFound` when the
    /// listener is not registered.
    pub fn set_congested(&self, keys: &[ListenerKey], congested: bool) -> io::Result<()> {
        let flags = if congested { LISTENER_CONGESTED } else { 0 };
        for k in keys {
            let mut v = [0u8; 8];
            v[..4].copy_from_slice(&flags.to_ne_bytes());
            // BPF_EXIST: never registers a listener by the way.
            sys::update(self.listeners.as_fd(), &k.bytes(), &v, 2).map_err(|e| {
                if e.raw_os_error() == Some(libc::ENOENT) {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("listener {k:?} is not registered"),
                    )
                } else {
                    io::Error::new(e.kind(), format!("setting congestion of {k:?}: {e}"))
                }
            })?;
        }
        Ok(())
    }

    fn put_listener(&self, k: &ListenerKey, flags: u32) -> io::Result<()> {
        let mut v = [0u8; 8];
        v[..4].copy_from_slice(&flags.to_ne_bytes());
        sys::update(self.listeners.as_fd(), &k.bytes(), &v, 0)
            .map_err(|e| io::Error::new(e.kind(), format!("registering listener {k:?}: {e}")))
    }

    /// Whether `key` is registered, and congested.
    pub fn listener(&self, k: &ListenerKey) -> io::Result<Option<bool>> {
        let mut v = [0u8; 8];
        match sys::lookup(self.listeners.as_fd(), &k.bytes(), &mut v) {
            Ok(()) => Ok(Some(
                u32::from_ne_bytes([v[0], v[1], v[2], v[3]]) & LISTENER_CONGESTED != 0,
            )),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(io::Error::new(e.kind(), format!("looking up {k:?}: {e}"))),
        }
    }

    /// Unregisters a listener (keys that are not registered are skipped).
    pub fn unregister_listener(&self, keys: &[ListenerKey]) -> io::Result<()> {
        for k in keys {
            match sys::delete(self.listeners.as_fd(), &k.bytes()) {
                Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("unregistering listener {k:?}: {e}"),
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// The network namespace cookie of the namespace `sock` lives in (`SO_NETNS_COOKIE`, what
/// the program's `bpf_get_netns_cookie` returns).
pub fn netns_cookie(sock: impl AsFd) -> io::Result<u64> {
    let mut v = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v`, which is that large; the
    // descriptor is borrowed for the call.
    let r = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut v).cast(),
            &mut len,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("SO_NETNS_COOKIE: {e}")));
    }
    Ok(v)
}

/// The keys a listening socket is registered under: its bound address, its namespace, and
/// for `[::]` whether it also takes IPv4 (`IPV6_V6ONLY`).
pub fn listener_keys(sock: BorrowedFd<'_>) -> io::Result<Vec<ListenerKey>> {
    let cookie = netns_cookie(sock)?;
    let addr = rustix::net::getsockname(sock)
        .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("getsockname: {e}")))?;
    let addr: SocketAddr = match addr.try_into() {
        Ok(a) => a,
        Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not an IP socket",
            ));
        }
    };
    let v6only = addr.is_ipv6() && rustix::net::sockopt::ipv6_v6only(sock).unwrap_or(false);
    Ok(ListenerKey::for_addr(cookie, addr, v6only))
}

/// The `bpf(2)` map commands this module needs.
mod sys {
    use rustix::fd::{AsRawFd, BorrowedFd};
    use std::io;

    const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

    /// The map-element part of `union bpf_attr`.
    #[repr(C)]
    #[derive(Default)]
    struct ElemAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }

    /// The `info` part of `union bpf_attr`.
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }

    /// The first fields of `struct bpf_map_info`.
    #[repr(C)]
    #[derive(Debug, Default, Clone, Copy)]
    pub struct MapInfo {
        pub map_type: u32,
        pub id: u32,
        pub key_size: u32,
        pub value_size: u32,
        pub max_entries: u32,
        pub map_flags: u32,
    }

    fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<()> {
        // SAFETY: `attr` is a live, properly sized `repr(C)` prefix of `union bpf_attr` for
        // `cmd`; the pointers in it point at buffers the caller keeps alive and sized as the
        // map's key and value (checked by the kernel against the map, which fails with
        // EINVAL rather than overrunning: the sizes come from `from_fds`' check).
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                (attr as *mut T).cast::<libc::c_void>(),
                std::mem::size_of::<T>() as libc::c_uint,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    pub fn lookup(map: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<()> {
        let mut a = ElemAttr {
            map_fd: map.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            value: value.as_mut_ptr() as u64,
            ..Default::default()
        };
        bpf(BPF_MAP_LOOKUP_ELEM, &mut a)
    }

    pub fn update(map: BorrowedFd<'_>, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
        let mut a = ElemAttr {
            map_fd: map.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            value: value.as_ptr() as u64,
            flags,
            ..Default::default()
        };
        bpf(BPF_MAP_UPDATE_ELEM, &mut a)
    }

    pub fn delete(map: BorrowedFd<'_>, key: &[u8]) -> io::Result<()> {
        let mut a = ElemAttr {
            map_fd: map.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            ..Default::default()
        };
        bpf(BPF_MAP_DELETE_ELEM, &mut a)
    }

    pub fn map_info(fd: BorrowedFd<'_>) -> io::Result<MapInfo> {
        let mut info = MapInfo::default();
        let mut a = InfoAttr {
            bpf_fd: fd.as_raw_fd() as u32,
            info_len: std::mem::size_of::<MapInfo>() as u32,
            info: (&raw mut info) as u64,
        };
        bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listener_key_layout() {
        let k = ListenerKey {
            netns_cookie: 0x0102030405060708,
            addr: std::net::Ipv4Addr::new(127, 0, 0, 1).to_ipv6_mapped(),
            port: 5000,
        };
        let b = k.bytes();
        assert_eq!(&b[..8], &0x0102030405060708u64.to_ne_bytes());
        assert_eq!(
            &b[8..24],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1]
        );
        assert_eq!(&b[24..28], &5000u32.to_ne_bytes());
        assert_eq!(&b[28..], &[0; 4]);
    }

    #[test]
    fn dual_stack_wildcard_has_both_keys() {
        let a: SocketAddr = "[::]:80".parse().unwrap();
        assert_eq!(ListenerKey::for_addr(1, a, false).len(), 2);
        assert_eq!(ListenerKey::for_addr(1, a, true).len(), 1);
        let a: SocketAddr = "0.0.0.0:80".parse().unwrap();
        let k = ListenerKey::for_addr(1, a, false);
        assert_eq!(k[0].addr, "::ffff:0.0.0.0".parse::<Ipv6Addr>().unwrap());
    }

    #[test]
    fn verdicts() {
        let v = |flags| SockOption { flags }.clc_runs();
        assert_eq!(v(0), None);
        assert_eq!(v(SK_CLIENT), None, "connect not done");
        assert_eq!(
            v(SK_CLIENT | SK_ESTABLISHED),
            None,
            "program did not write the SYN"
        );
        assert_eq!(v(SK_CLIENT | SK_SYN_OPT_SENT | SK_ESTABLISHED), Some(false));
        assert_eq!(
            v(SK_CLIENT | SK_SYN_OPT_SENT | SK_PEER_OPT | SK_ESTABLISHED),
            Some(true)
        );
        assert_eq!(v(SK_PASSIVE | SK_ESTABLISHED), Some(false));
        assert_eq!(v(SK_PASSIVE | SK_ESTABLISHED | SK_PEER_OPT), Some(false));
        assert_eq!(
            v(SK_PASSIVE | SK_ESTABLISHED | SK_PEER_OPT | SK_ECHOED),
            Some(true)
        );
    }

    #[test]
    fn garbage_descriptors_are_refused() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let e = Maps::from_fds(a.into(), b.into()).unwrap_err();
        assert!(e.to_string().contains("smc_sk map"), "{e}");
    }
}
