//! The device's datagrams: runs of packets go out as one UDP GSO send (`UDP_SEGMENT`), and
//! the receive side takes what the kernel kept together (`UDP_GRO`) in one call.
//!
//! A GSO send is cut into datagrams by the kernel (`__udp_gso_segment`) where a device cannot
//! carry it whole, or reaches the receiving socket whole over loopback and veth; either way
//! each segment is one RoCEv2 packet with its own BTH and ICRC, as rxe would send it. What the
//! kernel gives each segment is the IPv4 identification `k` for segment `k` (the first 0:
//! `ip_select_ident_segs`, unconnected socket with DF; then `inet_gso_segment` counts up),
//! so each packet's ICRC is computed for that identification ([`crate::wire`]). A capture on a
//! veth shows a GSO send as one large datagram, as it shows a TCP stream's 64 KiB segments.

use crate::verbs::Gid;
use crate::wire::{Packet, ROCEV2_UDP_PORT};
use rustix::fd::{AsRawFd, BorrowedFd};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, SocketAddrV4};

/// The largest UDP payload of one send (an IPv4 datagram's 65,535 bytes less its headers).
const GSO_MAX_BYTES: usize = 65_535 - 20 - 8;
/// Segments per GSO send (`UDP_MAX_SEGMENTS` was 64 before Linux 6.3 and is 128 since).
const GSO_MAX_SEGS: usize = 64;

/// Runs one flush sends with one `sendmmsg` at most.
const MAX_RUNS: usize = 8;

/// One run of a [`TxBatch`]: `count` packets of `seg` bytes (the last may be shorter) at
/// `start..end` of its buffer, to `peer`.
#[derive(Debug, Clone, Copy)]
struct Run {
    start: usize,
    end: usize,
    seg: usize,
    count: usize,
    peer: Gid,
}

/// Packets of one queue pair on their way out: runs of packets to one peer, all of one size
/// except a shorter last one, which the kernel can send as one GSO datagram each; the runs of
/// one flush go out in one `sendmmsg` (a multi-packet RDMA WRITE is two runs, its first
/// packet carrying the RETH being longer than the rest; the CDC SEND after it joins the
/// second as its short last packet).
#[derive(Debug, Default)]
pub(super) struct TxBatch {
    buf: Vec<u8>,
    /// Runs complete before the current one.
    runs: Vec<Run>,
    peer: Option<Gid>,
    /// Where the current run starts in `buf`.
    start: usize,
    /// The size of every segment but the last.
    seg: usize,
    count: usize,
    /// A shorter packet ended the run.
    closed: bool,
}

impl TxBatch {
    /// Adds `p` for `peer`, ending the current run first when `p` cannot join it.
    /// (On a RoCE v1 device GSO is off: every run is one frame.)
    pub(super) fn push(&mut self, dev: &super::Dev, p: &Packet<'_>, peer: Gid) {
        let len = p.buffer_len();
        let joins = self.count > 0
            && self.peer == Some(peer)
            && !self.closed
            && len <= self.seg
            && self.count < GSO_MAX_SEGS
            && self.buf.len() - self.start + len <= GSO_MAX_BYTES
            && dev.gso();
        if self.count > 0 && !joins {
            self.end_run();
            if self.runs.len() >= MAX_RUNS {
                self.flush(dev);
            }
        }
        if self.count == 0 {
            self.start = self.buf.len();
            self.seg = len;
            self.peer = Some(peer);
        } else if len < self.seg {
            self.closed = true;
        }
        let n = dev.emit_to(p, &peer, self.count as u16, &mut self.buf);
        if self.count == 0 {
            self.seg = n;
        }
        self.count += 1;
    }

    fn end_run(&mut self) {
        if let Some(peer) = self.peer.filter(|_| self.count > 0) {
            self.runs.push(Run {
                start: self.start,
                end: self.buf.len(),
                seg: self.seg,
                count: self.count,
                peer,
            });
        }
        self.count = 0;
        self.closed = false;
    }

    /// Sends what is waiting: one run as one send, several with one `sendmmsg`.
    pub(super) fn flush(&mut self, dev: &super::Dev) {
        self.end_run();
        match self.runs.len() {
            0 => {}
            1 => {
                let r = self.runs[0];
                dev.send_run(&mut self.buf[r.start..r.end], r.seg, r.count, &r.peer);
            }
            // RoCE v1 frames go one by one (`Dev::send_run`).
            _ if dev.v1.is_some() => {
                for r in &self.runs {
                    dev.send_run(&mut self.buf[r.start..r.end], r.seg, r.count, &r.peer);
                }
            }
            _ => {
                let sent = send_many(dev.sock(), &self.buf, &self.runs).unwrap_or(0);
                for (i, r) in self.runs.iter().enumerate() {
                    if i < sent {
                        dev.count_sent(r.count, i == 0);
                    } else {
                        // What sendmmsg did not take goes as send_run sends it (its errors
                        // are handled there: GSO refused, a full buffer).
                        dev.send_run(&mut self.buf[r.start..r.end], r.seg, r.count, &r.peer);
                    }
                }
            }
        }
        self.runs.clear();
        self.buf.clear();
        self.start = 0;
    }
}

/// Sends `runs` of `buf` with one `sendmmsg` (each a datagram, or a GSO send of several);
/// returns how many the kernel took.
fn send_many(sock: BorrowedFd<'_>, buf: &[u8], runs: &[Run]) -> io::Result<usize> {
    let n = runs.len().min(MAX_RUNS);
    let mut addrs = [sockaddr(Ipv4Addr::UNSPECIFIED); MAX_RUNS];
    // SAFETY: all-zero iovecs and mmsghdrs are valid empty ones.
    let mut iovs: [libc::iovec; MAX_RUNS] = unsafe { zeroed() };
    let mut cbufs = [[0u64; 4]; MAX_RUNS];
    // SAFETY: as above.
    let mut msgs: [libc::mmsghdr; MAX_RUNS] = unsafe { zeroed() };
    for (i, r) in runs[..n].iter().enumerate() {
        addrs[i] = sockaddr(r.peer.to_ipv4().unwrap_or(Ipv4Addr::UNSPECIFIED));
        iovs[i] = libc::iovec {
            iov_base: buf[r.start..].as_ptr() as *mut libc::c_void,
            iov_len: r.end - r.start,
        };
    }
    for i in 0..n {
        let m = &mut msgs[i].msg_hdr;
        m.msg_name = (&addrs[i] as *const libc::sockaddr_in).cast_mut().cast();
        m.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        m.msg_iov = &mut iovs[i];
        m.msg_iovlen = 1;
        if runs[i].count > 1 {
            set_segment(m, &mut cbufs[i], runs[i].seg as u16);
        }
    }
    // SAFETY: every pointer in `msgs` points at a live local or at `buf` for the call.
    let r = unsafe {
        libc::sendmmsg(
            sock.as_raw_fd(),
            msgs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Puts a `UDP_SEGMENT` control message of `seg` into `msg`, in `cbuf`.
fn set_segment(msg: &mut libc::msghdr, cbuf: &mut [u64; 4], seg: u16) {
    msg.msg_control = cbuf.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
    // SAFETY: msg_control points at `cbuf`, which is at least CMSG_SPACE(2) bytes and
    // aligned for cmsghdr, so the first header and its data are inside it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(msg);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = libc::UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg);
    }
}

/// One datagram to `peer` (`seg` = None), or a GSO send of segments of `seg` bytes.
pub(super) fn send(
    sock: BorrowedFd<'_>,
    buf: &[u8],
    seg: Option<u16>,
    peer: Ipv4Addr,
) -> io::Result<usize> {
    let addr = sockaddr(peer);
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // CMSG_SPACE(2) is 24 bytes on 64-bit Linux; u64s keep the buffer aligned for cmsghdr.
    let mut cbuf = [0u64; 4];
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_name = (&addr as *const libc::sockaddr_in).cast_mut().cast();
    msg.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(seg) = seg {
        set_segment(&mut msg, &mut cbuf, seg);
    }
    // SAFETY: every pointer in `msg` points at a live local or at `buf` for the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// A received datagram: its length in `buf`, its source, and the segment size when the kernel
/// kept several segments together (`UDP_GRO`).
pub(super) struct Received {
    pub len: usize,
    pub from: SocketAddrV4,
    pub seg: Option<usize>,
}

/// Receives one datagram (or one GRO train of them) without waiting.
pub(super) fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    // SAFETY: an all-zero sockaddr_in and msghdr are valid empty ones.
    let mut addr: libc::sockaddr_in = unsafe { zeroed() };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: as above.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_name = (&mut addr as *mut libc::sockaddr_in).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&cbuf);
    // SAFETY: every pointer in `msg` points at a live local or at `buf` for the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 || i32::from(addr.sin_family) != libc::AF_INET {
        return Err(io::Error::from(io::ErrorKind::InvalidData));
    }
    let mut seg = None;
    // SAFETY: the kernel filled msg_control up to msg_controllen; CMSG_FIRSTHDR/NXTHDR stay
    // within it and return null at its end.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP
                && (*c).cmsg_type == libc::UDP_GRO
                && (*c).cmsg_len >= libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as usize
            {
                let s = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                seg = usize::try_from(s).ok().filter(|&s| s > 0);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Received {
        len: n as usize,
        from: SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
            u16::from_be(addr.sin_port),
        ),
        seg,
    })
}

/// Asks the kernel to keep GSO trains together on the way in (Linux 5.0); without it the
/// device receives them one datagram at a time, which works too.
pub(super) fn enable_gro(sock: BorrowedFd<'_>) {
    let one: libc::c_int = 1;
    // SAFETY: a valid socket, an int option of the right size.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_GRO,
            (&one as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

fn sockaddr(peer: Ipv4Addr) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: ROCEV2_UDP_PORT.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(peer).to_be(),
        },
        sin_zero: [0; 8],
    }
}
