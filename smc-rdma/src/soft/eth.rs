//! The RoCE v1 mode's frames: an `AF_PACKET` socket bound to one netdev and Ethertype 0x8915,
//! sending and receiving whole Ethernet frames ([`crate::wire::v1`]).
//!
//! **Who gets a frame.** Every packet socket bound to a netdev and Ethertype gets a copy of
//! every frame of that type, so devices (in one process or several) on one netdev divide the
//! QPN space as the RoCEv2 mode's steering does (`steer.rs`): a device claims a slot `s` in
//! 1..4096 and numbers its QPs `s << 12 | n`, and a classic BPF filter on its socket keeps
//! only frames whose BTH destination QPN is in its slot. The claim is an abstract Unix socket
//! named after the netdev's index and the slot (abstract names belong to the network namespace,
//! as the index does): binding it fails while another device holds the slot, and the kernel
//! frees it when that device's process ends, however it ends. The filter is attached before
//! the socket is bound, so no other device's frame is ever queued on it.

use rustix::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::io;
use std::mem::{size_of, zeroed};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

use crate::wire::v1::{ETHERTYPE_ROCE, HEADERS_LEN};

/// QPNs per slot and slots per netdev (as `steer.rs`).
pub(super) const SLOT_SHIFT: u32 = 12;
const SLOTS: u32 = 1 << (24 - SLOT_SHIFT);

/// What the device needs to know of its netdev.
pub(super) struct Netdev {
    pub ifindex: i32,
    pub mac: [u8; 6],
    pub mtu: usize,
}

fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    // SAFETY: an all-zero ifreq is a valid empty one.
    let mut r: libc::ifreq = unsafe { zeroed() };
    let b = name.as_bytes();
    if b.is_empty() || b.len() >= r.ifr_name.len() || b.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {name:?}"),
        ));
    }
    for (d, s) in r.ifr_name.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    Ok(r)
}

fn ioctl(sock: BorrowedFd<'_>, req: libc::Ioctl, r: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: the requests used here read and write one ifreq, which `r` is.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), req, r as *mut libc::ifreq) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Index, MAC and MTU of `name`, asked through `sock` (so in the socket's network namespace,
/// which `/sys/class/net` of the host's mount may not show).
pub(super) fn netdev(sock: BorrowedFd<'_>, name: &str) -> io::Result<Netdev> {
    let mut r = ifreq(name)?;
    ioctl(sock, libc::SIOCGIFINDEX as _, &mut r)?;
    // SAFETY: SIOCGIFINDEX filled the index member.
    let ifindex = unsafe { r.ifr_ifru.ifru_ifindex };
    let mut r = ifreq(name)?;
    ioctl(sock, libc::SIOCGIFHWADDR as _, &mut r)?;
    // SAFETY: SIOCGIFHWADDR filled the address member.
    let hw = unsafe { r.ifr_ifru.ifru_hwaddr };
    if hw.sa_family != libc::ARPHRD_ETHER {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{name} is not an Ethernet device (ARPHRD {})", hw.sa_family),
        ));
    }
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *d = *s as u8;
    }
    let mut r = ifreq(name)?;
    ioctl(sock, libc::SIOCGIFMTU as _, &mut r)?;
    // SAFETY: SIOCGIFMTU filled the MTU member.
    let mtu = unsafe { r.ifr_ifru.ifru_mtu };
    Ok(Netdev {
        ifindex,
        mac,
        mtu: usize::try_from(mtu).unwrap_or(1500),
    })
}

/// Whether `name` is up and has a carrier (`IFF_UP | IFF_RUNNING`).
pub(super) fn is_up(sock: BorrowedFd<'_>, name: &str) -> bool {
    let Ok(mut r) = ifreq(name) else { return false };
    if ioctl(sock, libc::SIOCGIFFLAGS as _, &mut r).is_err() {
        return false;
    }
    // SAFETY: SIOCGIFFLAGS filled the flags member.
    let f = i32::from(unsafe { r.ifr_ifru.ifru_flags });
    f & libc::IFF_UP != 0 && f & libc::IFF_RUNNING != 0
}

/// A packet socket of Ethertype 0 (it receives nothing until bound), to ask about the netdev
/// and then to bind.
pub(super) fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2).
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just made and own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Claims a slot on `ifindex`, trying `hint` first; returns it and the claim (held for the
/// device's life).
pub(super) fn claim_slot(ifindex: i32, hint: u32) -> io::Result<(u32, UnixDatagram)> {
    for k in 0..SLOTS - 1 {
        let slot = 1 + (hint + k) % (SLOTS - 1);
        let name = format!("smc-rdma/roce1/{ifindex}/{slot}");
        let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
        match UnixDatagram::bind_addr(&addr) {
            Ok(s) => return Ok((slot, s)),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "every RoCE v1 QPN slot of this netdev is taken",
    ))
}

/// Keeps only frames whose BTH destination QPN (bytes 59..62 of the frame) is in `slot`, then
/// binds `sock` to Ethertype 0x8915 on `ifindex`.
pub(super) fn bind(sock: BorrowedFd<'_>, ifindex: i32, slot: u32) -> io::Result<()> {
    let qpn_at = (HEADERS_LEN + 5) as u32;
    let prog = [
        // A = the destination QPN's top 16 bits (a frame too short for it: dropped).
        bpf(libc::BPF_LD | libc::BPF_H | libc::BPF_ABS, 0, 0, qpn_at),
        // A >>= 4: the slot (the QPN's top 12 bits).
        bpf(libc::BPF_ALU | libc::BPF_RSH | libc::BPF_K, 0, 0, 4),
        bpf(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 1, slot),
        bpf(libc::BPF_RET | libc::BPF_K, 0, 0, u32::MAX),
        bpf(libc::BPF_RET | libc::BPF_K, 0, 0, 0),
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: a valid socket and a sock_fprog pointing at `prog`, alive for the call.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&fprog as *const libc::sock_fprog).cast(),
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let sll = sockaddr(ifindex);
    // SAFETY: a valid socket and a sockaddr_ll of the right size.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn bpf(code: u32, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

fn sockaddr(ifindex: i32) -> libc::sockaddr_ll {
    // SAFETY: an all-zero sockaddr_ll is a valid empty one.
    let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = ETHERTYPE_ROCE.to_be();
    sll.sll_ifindex = ifindex;
    sll
}

/// Sends one whole frame on the bound netdev.
pub(super) fn send(sock: BorrowedFd<'_>, frame: &[u8]) -> io::Result<usize> {
    // SAFETY: a valid socket and buffer.
    let n = unsafe {
        libc::send(
            sock.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Receives one frame without waiting; `Ok(None)` for a frame that is not for this host (one
/// we sent, or another host's seen in promiscuous mode, as while a capture runs).
pub(super) fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: an all-zero sockaddr_ll is a valid empty one.
    let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: a valid socket, buffer and address buffer of the given sizes.
    let n = unsafe {
        libc::recvfrom(
            sock.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            (&mut sll as *mut libc::sockaddr_ll).cast(),
            &mut len,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize > buf.len() {
        return Err(io::Error::from(io::ErrorKind::InvalidData));
    }
    Ok((sll.sll_pkttype == libc::PACKET_HOST).then_some(n as usize))
}
