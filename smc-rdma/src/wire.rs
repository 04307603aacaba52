//! RoCEv2 packets as they travel in a UDP datagram to port 4791: the base transport header
//! (BTH), the RDMA extended transport header (RETH) of a WRITE's first packet, the ACK extended
//! transport header (AETH) of an acknowledgement, the payload padded to four bytes, and the
//! invariant CRC (ICRC) over all of it plus the masked IP and UDP headers.
//!
//! The layouts are the InfiniBand Architecture Specification's (vol. 1, ch. 9, annex A17 for
//! RoCEv2) as the kernel's rxe implements them (`drivers/infiniband/sw/rxe/rxe_hdr.h`,
//! `rxe_icrc.c`, `include/rdma/ib_pack.h`); Wireshark's `packet-infiniband.c` decodes them.
//!
//! **Panic contract:** [`Packet::parse`] accepts any byte slice and returns a typed error for
//! anything it cannot use; [`Packet::emit`] panics only when the buffer it is given is shorter
//! than [`Packet::buffer_len`], which is a caller bug.
//!
//! **The IPv4 header in the ICRC.** A UDP socket does not see the IP header, so both directions
//! reconstruct it: version 4, no options, DF set, protocol UDP, and the identification the
//! sender knows the kernel gives the datagram ([`Ipv4Udp::id`]). Linux gives a datagram of an
//! unconnected UDP socket with `IP_PMTUDISC_DO` identification 0 (`ip_select_ident_segs`: no
//! destination on the socket and DF ⇒ id 0), and the segments of a UDP GSO send 0, 1, 2, …
//! (`inet_gso_segment` counts up from the first), so a receiver that sees the real header
//! (rxe, an RNIC, a capture) checks our packets correctly. A receiver behind a UDP socket does
//! not see the identification: it tries the one it expects and otherwise solves for it
//! ([`solve_ip_id`]; the identification enters the CRC linearly), which is also how rxe's
//! packets (a hashed identification, `prepare_ipv4_hdr` calls `__ip_select_ident`) pass. Such
//! a check still catches what the 16 unknown bits cannot explain.

use std::cmp::Ordering;
use std::net::Ipv4Addr;

pub mod v1;

/// The UDP destination port of RoCEv2 (IANA).
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// Base transport header.
pub const BTH_LEN: usize = 12;
/// RDMA extended transport header.
pub const RETH_LEN: usize = 16;
/// ACK extended transport header.
pub const AETH_LEN: usize = 4;
/// Invariant CRC.
pub const ICRC_LEN: usize = 4;
/// The default partition key (full member of the default partition).
pub const DEFAULT_PKEY: u16 = 0xffff;
/// PSNs and QPNs are 24 bits wide.
pub const MASK24: u32 = 0x00ff_ffff;

/// The RC opcodes this device speaks, and any other value as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// RC SEND First (0x00).
    SendFirst,
    /// RC SEND Middle (0x01).
    SendMiddle,
    /// RC SEND Last (0x02).
    SendLast,
    /// RC SEND Only (0x04).
    SendOnly,
    /// RC RDMA WRITE First (0x06), carries a RETH.
    WriteFirst,
    /// RC RDMA WRITE Middle (0x07).
    WriteMiddle,
    /// RC RDMA WRITE Last (0x08).
    WriteLast,
    /// RC RDMA WRITE Only (0x0a), carries a RETH.
    WriteOnly,
    /// RC Acknowledge (0x11), carries an AETH.
    Ack,
    /// Anything else (immediate data, READ, atomics, UC/UD/XRC): a responder answers it with
    /// an invalid-request NAK.
    Other(u8),
}

impl Opcode {
    /// The opcode of a byte.
    pub fn from_u8(b: u8) -> Self {
        match b {
            0x00 => Self::SendFirst,
            0x01 => Self::SendMiddle,
            0x02 => Self::SendLast,
            0x04 => Self::SendOnly,
            0x06 => Self::WriteFirst,
            0x07 => Self::WriteMiddle,
            0x08 => Self::WriteLast,
            0x0a => Self::WriteOnly,
            0x11 => Self::Ack,
            b => Self::Other(b),
        }
    }

    /// The byte of an opcode.
    pub fn to_u8(self) -> u8 {
        match self {
            Self::SendFirst => 0x00,
            Self::SendMiddle => 0x01,
            Self::SendLast => 0x02,
            Self::SendOnly => 0x04,
            Self::WriteFirst => 0x06,
            Self::WriteMiddle => 0x07,
            Self::WriteLast => 0x08,
            Self::WriteOnly => 0x0a,
            Self::Ack => 0x11,
            Self::Other(b) => b,
        }
    }

    /// Whether a RETH follows the BTH.
    pub fn has_reth(self) -> bool {
        matches!(self, Self::WriteFirst | Self::WriteOnly)
    }

    /// Whether an AETH follows the BTH.
    pub fn has_aeth(self) -> bool {
        matches!(self, Self::Ack)
    }

    /// Whether the packet belongs to a SEND.
    pub fn is_send(self) -> bool {
        matches!(
            self,
            Self::SendFirst | Self::SendMiddle | Self::SendLast | Self::SendOnly
        )
    }

    /// Whether the packet belongs to an RDMA WRITE.
    pub fn is_write(self) -> bool {
        matches!(
            self,
            Self::WriteFirst | Self::WriteMiddle | Self::WriteLast | Self::WriteOnly
        )
    }

    /// Whether the packet starts a message.
    pub fn is_first(self) -> bool {
        matches!(
            self,
            Self::SendFirst | Self::SendOnly | Self::WriteFirst | Self::WriteOnly
        )
    }

    /// Whether the packet ends a message.
    pub fn is_last(self) -> bool {
        matches!(
            self,
            Self::SendLast | Self::SendOnly | Self::WriteLast | Self::WriteOnly
        )
    }

    /// The opcode of packet `index` of `count` of a SEND (`write == false`) or an RDMA WRITE.
    pub fn for_segment(write: bool, index: usize, count: usize) -> Self {
        match (write, index == 0, index + 1 == count) {
            (false, true, true) => Self::SendOnly,
            (false, true, false) => Self::SendFirst,
            (false, false, true) => Self::SendLast,
            (false, false, false) => Self::SendMiddle,
            (true, true, true) => Self::WriteOnly,
            (true, true, false) => Self::WriteFirst,
            (true, false, true) => Self::WriteLast,
            (true, false, false) => Self::WriteMiddle,
        }
    }
}

/// Base transport header (12 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth {
    /// The packet's opcode.
    pub opcode: Opcode,
    /// Solicited event: the responder's completion should wake a solicited-only waiter.
    pub solicited: bool,
    /// Migration request (APM; always false here).
    pub mig_req: bool,
    /// Pad bytes after the payload (0..=3). [`Packet::emit`] sets it from the payload length.
    pub pad: u8,
    /// Transport header version (0).
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// FECN/BECN bits of the byte after the partition key (RoCEv2 congestion marks).
    pub resv8a: u8,
    /// Destination queue pair (24 bits).
    pub dest_qpn: u32,
    /// Acknowledge request: the responder must answer this packet.
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl Bth {
    /// A header with the defaults this device sends: version 0, the default partition, no
    /// flags.
    pub fn new(opcode: Opcode, dest_qpn: u32, psn: u32) -> Self {
        Self {
            opcode,
            solicited: false,
            mig_req: false,
            pad: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            resv8a: 0,
            dest_qpn: dest_qpn & MASK24,
            ack_req: false,
            psn: psn & MASK24,
        }
    }

    fn parse(b: &[u8; BTH_LEN]) -> Self {
        Self {
            opcode: Opcode::from_u8(b[0]),
            solicited: b[1] & 0x80 != 0,
            mig_req: b[1] & 0x40 != 0,
            pad: (b[1] >> 4) & 0x3,
            tver: b[1] & 0x0f,
            pkey: u16::from_be_bytes([b[2], b[3]]),
            resv8a: b[4],
            dest_qpn: u32::from_be_bytes([0, b[5], b[6], b[7]]),
            ack_req: b[8] & 0x80 != 0,
            psn: u32::from_be_bytes([0, b[9], b[10], b[11]]),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        b[0] = self.opcode.to_u8();
        b[1] = (u8::from(self.solicited) << 7)
            | (u8::from(self.mig_req) << 6)
            | ((self.pad & 0x3) << 4)
            | (self.tver & 0x0f);
        b[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        b[4] = self.resv8a;
        b[5..8].copy_from_slice(&(self.dest_qpn & MASK24).to_be_bytes()[1..]);
        b[8] = u8::from(self.ack_req) << 7;
        b[9..12].copy_from_slice(&(self.psn & MASK24).to_be_bytes()[1..]);
    }
}

/// RDMA extended transport header (16 bytes): where a WRITE goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reth {
    /// Remote virtual address of the first byte.
    pub va: u64,
    /// The memory region's remote key.
    pub rkey: u32,
    /// Length of the whole message (not of this packet).
    pub len: u32,
}

impl Reth {
    fn parse(b: &[u8]) -> Self {
        Self {
            va: u64::from_be_bytes(b[0..8].try_into().expect("8")),
            rkey: u32::from_be_bytes(b[8..12].try_into().expect("4")),
            len: u32::from_be_bytes(b[12..16].try_into().expect("4")),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
    }
}

/// Why a responder refused a request (the low five bits of a NAK syndrome).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NakCode {
    /// PSN sequence error: a packet is missing; resend from the ACK's PSN (0).
    PsnSequence,
    /// Invalid request: an opcode or length the responder does not take (1).
    InvalidRequest,
    /// Remote access error: rkey, bounds or permission (2).
    RemoteAccess,
    /// Remote operational error (3).
    RemoteOperational,
    /// Invalid RD request (4).
    InvalidRdRequest,
    /// A reserved value.
    Other(u8),
}

/// The syndrome byte of an AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syndrome {
    /// Positive acknowledgement with an end-to-end credit count (0x1f: no flow control).
    Ack {
        /// Credits (5 bits).
        credits: u8,
    },
    /// Receiver not ready: no receive was posted; retry after the encoded time.
    RnrNak {
        /// The RNR timer code (5 bits, IBTA table 45).
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// The reserved class (0x40).
    Reserved(u8),
}

impl Syndrome {
    /// The syndrome of a byte.
    pub fn from_u8(b: u8) -> Self {
        let low = b & 0x1f;
        match b >> 5 {
            0 => Self::Ack { credits: low },
            1 => Self::RnrNak { timer: low },
            3 => Self::Nak(match low {
                0 => NakCode::PsnSequence,
                1 => NakCode::InvalidRequest,
                2 => NakCode::RemoteAccess,
                3 => NakCode::RemoteOperational,
                4 => NakCode::InvalidRdRequest,
                other => NakCode::Other(other),
            }),
            _ => Self::Reserved(b),
        }
    }

    /// The byte of a syndrome.
    pub fn to_u8(self) -> u8 {
        match self {
            Self::Ack { credits } => credits & 0x1f,
            Self::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Self::Nak(c) => {
                0x60 | match c {
                    NakCode::PsnSequence => 0,
                    NakCode::InvalidRequest => 1,
                    NakCode::RemoteAccess => 2,
                    NakCode::RemoteOperational => 3,
                    NakCode::InvalidRdRequest => 4,
                    NakCode::Other(o) => o & 0x1f,
                }
            }
            Self::Reserved(b) => b,
        }
    }
}

/// ACK extended transport header (4 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aeth {
    /// ACK, RNR NAK or NAK.
    pub syndrome: Syndrome,
    /// Message sequence number: messages the responder completed (24 bits).
    pub msn: u32,
}

impl Aeth {
    fn parse(b: &[u8]) -> Self {
        Self {
            syndrome: Syndrome::from_u8(b[0]),
            msn: u32::from_be_bytes([0, b[1], b[2], b[3]]),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        b[0] = self.syndrome.to_u8();
        b[1..4].copy_from_slice(&(self.msn & MASK24).to_be_bytes()[1..]);
    }
}

/// The IPv4 and UDP header fields the ICRC covers that a UDP socket does not see in the
/// datagram: addresses, ports and the IPv4 identification. The rest is reconstructed (module
/// docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Udp {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port ([`ROCEV2_UDP_PORT`]).
    pub dst_port: u16,
    /// IPv4 identification: 0 for a lone datagram of a device's socket, `k` for segment `k`
    /// of a GSO send (module docs).
    pub id: u16,
}

/// A RoCEv2 packet, borrowed from the datagram it was parsed from or to be emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    /// Base transport header.
    pub bth: Bth,
    /// Present exactly when the opcode carries one ([`Opcode::has_reth`]).
    pub reth: Option<Reth>,
    /// Present exactly when the opcode carries one ([`Opcode::has_aeth`]).
    pub aeth: Option<Aeth>,
    /// The payload without its pad.
    pub payload: &'a [u8],
}

/// What is wrong with a datagram.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than its headers, pad and ICRC.
    #[error("RoCEv2 packet truncated: {need} bytes needed, {have} present")]
    Truncated {
        /// Bytes the headers, pad and ICRC need.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// Header plus payload is not a multiple of four bytes (the pad makes it one).
    #[error("RoCEv2 packet of {len} bytes is not padded to four")]
    Unaligned {
        /// The datagram's length.
        len: usize,
    },
    /// A transport header version other than 0.
    #[error("unknown BTH transport version {0}")]
    Version(u8),
    /// The invariant CRC does not match (a corrupted packet, or another IPv4 identification).
    #[error("ICRC mismatch: packet has {got:#010x}, computed {want:#010x}")]
    Icrc {
        /// The CRC in the packet.
        got: u32,
        /// The CRC of its contents.
        want: u32,
    },
}

impl<'a> Packet<'a> {
    /// A packet with the headers its opcode needs filled from `reth`/`aeth`.
    pub fn new(bth: Bth, reth: Option<Reth>, aeth: Option<Aeth>, payload: &'a [u8]) -> Self {
        Self {
            bth,
            reth,
            aeth,
            payload,
        }
    }

    fn header_len(opcode: Opcode) -> usize {
        BTH_LEN
            + if opcode.has_reth() { RETH_LEN } else { 0 }
            + if opcode.has_aeth() { AETH_LEN } else { 0 }
    }

    fn pad_len(payload: usize) -> usize {
        (4 - payload % 4) % 4
    }

    /// The UDP payload this packet needs: headers, payload, pad, ICRC.
    pub fn buffer_len(&self) -> usize {
        Self::header_len(self.bth.opcode)
            + self.payload.len()
            + Self::pad_len(self.payload.len())
            + ICRC_LEN
    }

    /// Parses a UDP payload that arrived with the addresses in `hdr`, checking its length,
    /// pad and ICRC.
    pub fn parse(buf: &'a [u8], hdr: &Ipv4Udp) -> Result<Self, WireError> {
        Self::parse_with(buf, |body| icrc(hdr, body))
    }

    /// [`Packet::parse`] with the ICRC of the headers before the BTH computed by `crc` over
    /// the packet without its ICRC (RoCEv2: the masked IPv4 and UDP headers; RoCE v1 the
    /// masked GRH, [`v1`]).
    fn parse_with(buf: &'a [u8], crc: impl FnOnce(&[u8]) -> u32) -> Result<Self, WireError> {
        if buf.len() < BTH_LEN + ICRC_LEN {
            return Err(WireError::Truncated {
                need: BTH_LEN + ICRC_LEN,
                have: buf.len(),
            });
        }
        if !buf.len().is_multiple_of(4) {
            return Err(WireError::Unaligned { len: buf.len() });
        }
        let bth = Bth::parse(buf[..BTH_LEN].try_into().expect("12"));
        if bth.tver != 0 {
            return Err(WireError::Version(bth.tver));
        }
        let hl = Self::header_len(bth.opcode);
        let need = hl + usize::from(bth.pad) + ICRC_LEN;
        if buf.len() < need {
            return Err(WireError::Truncated {
                need,
                have: buf.len(),
            });
        }
        let body = buf.len() - ICRC_LEN;
        let got = u32::from_le_bytes(buf[body..].try_into().expect("4"));
        let want = crc(&buf[..body]);
        if got != want {
            return Err(WireError::Icrc { got, want });
        }
        let mut at = BTH_LEN;
        let reth = bth.opcode.has_reth().then(|| {
            let r = Reth::parse(&buf[at..at + RETH_LEN]);
            at += RETH_LEN;
            r
        });
        let aeth = bth.opcode.has_aeth().then(|| {
            let a = Aeth::parse(&buf[at..at + AETH_LEN]);
            at += AETH_LEN;
            a
        });
        Ok(Self {
            bth,
            reth,
            aeth,
            payload: &buf[at..body - usize::from(bth.pad)],
        })
    }

    /// Writes the packet into `buf` (at least [`Self::buffer_len`] bytes) for a datagram with
    /// the addresses in `hdr`, setting the pad count and the ICRC; returns the length written.
    /// A RETH or AETH its opcode does not carry is not written; one it carries but that is
    /// `None` is written as zeros.
    pub fn emit(&self, hdr: &Ipv4Udp, buf: &mut [u8]) -> usize {
        self.emit_with(buf, |body| icrc(hdr, body))
    }

    /// [`Packet::emit`] with the ICRC computed by `crc` (see [`Packet::parse_with`]).
    fn emit_with(&self, buf: &mut [u8], crc: impl FnOnce(&[u8]) -> u32) -> usize {
        let len = self.buffer_len();
        let buf = &mut buf[..len];
        let pad = Self::pad_len(self.payload.len());
        let mut bth = self.bth;
        bth.pad = pad as u8;
        bth.emit(&mut buf[..BTH_LEN]);
        let mut at = BTH_LEN;
        if bth.opcode.has_reth() {
            let r = self.reth.unwrap_or(Reth {
                va: 0,
                rkey: 0,
                len: 0,
            });
            r.emit(&mut buf[at..at + RETH_LEN]);
            at += RETH_LEN;
        }
        if bth.opcode.has_aeth() {
            let a = self.aeth.unwrap_or(Aeth {
                syndrome: Syndrome::Ack { credits: 0x1f },
                msn: 0,
            });
            a.emit(&mut buf[at..at + AETH_LEN]);
            at += AETH_LEN;
        }
        buf[at..at + self.payload.len()].copy_from_slice(self.payload);
        at += self.payload.len();
        buf[at..at + pad].fill(0);
        at += pad;
        let crc = crc(&buf[..at]);
        buf[at..at + ICRC_LEN].copy_from_slice(&crc.to_le_bytes());
        len
    }
}

/// CRC-32 over `pseudo` (the masked headers before the BTH), then `body` with BTH byte 4 (FECN,
/// BECN and reserved bits) masked: the part of the ICRC RoCEv2 and RoCE v1 share.
fn icrc_over(pseudo: &[u8], body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(pseudo);
    if body.len() >= BTH_LEN {
        let mut bth = [0u8; BTH_LEN];
        bth.copy_from_slice(&body[..BTH_LEN]);
        bth[4] = 0xff; // FECN/BECN and reserved, masked
        h.update(&bth);
        h.update(&body[BTH_LEN..]);
    } else {
        h.update(body);
    }
    h.finalize()
}

/// The invariant CRC of a RoCEv2 packet whose UDP payload without the ICRC is `body`, sent
/// with the addresses in `hdr` (rxe's `rxe_icrc_hdr` + `rxe_icrc_generate`): CRC-32 over eight
/// 0xff bytes (the masked LRH of InfiniBand), the IPv4 header with TOS, TTL and checksum all
/// ones, the UDP header with its checksum all ones, the BTH with its reserved byte all ones,
/// and the rest of `body`.
///
/// A `body` too long for a datagram (over 65503 bytes) gets the lengths modulo 2^16, as the
/// 16-bit header fields would hold them: no panic, and no such datagram exists to match.
pub fn icrc(hdr: &Ipv4Udp, body: &[u8]) -> u32 {
    let udp_len = (8 + body.len() + ICRC_LEN) as u16;
    let ip_len = udp_len.wrapping_add(20);
    let mut pseudo = [0u8; 8 + 20 + 8];
    pseudo[..8].fill(0xff);
    let ip = &mut pseudo[8..28];
    ip[0] = 0x45;
    ip[1] = 0xff; // TOS, masked
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    // identification, flags DF, fragment offset 0 (module docs)
    ip[4..6].copy_from_slice(&hdr.id.to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 0xff; // TTL, masked
    ip[9] = 17;
    ip[10] = 0xff; // header checksum, masked
    ip[11] = 0xff;
    ip[12..16].copy_from_slice(&hdr.src.octets());
    ip[16..20].copy_from_slice(&hdr.dst.octets());
    let udp = &mut pseudo[28..36];
    udp[0..2].copy_from_slice(&hdr.src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&hdr.dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    udp[6] = 0xff; // UDP checksum, masked
    udp[7] = 0xff;
    icrc_over(&pseudo, body)
}

/// The IPv4 identification that makes `packet` (a whole RoCEv2 packet, ICRC included) check
/// for the addresses and ports in `hdr` (whose `id` is ignored); `None` when none does.
///
/// The ICRC is affine in the packet's bits, so changing the identification from 0 to `id`
/// changes it by `M·id` for a 32×16 matrix `M` over GF(2) that depends only on the packet's
/// length; `M` has full rank (its columns are distinct powers of x modulo the CRC-32
/// polynomial, which has a constant term), so at most one identification fits. `basis` caches
/// the reduced `M` for one length (see [`IdSolver`]).
pub fn solve_ip_id(hdr: &Ipv4Udp, packet: &[u8], basis: &mut IdSolver) -> Option<u16> {
    let body = packet.len().checked_sub(ICRC_LEN)?;
    let got = u32::from_le_bytes(packet[body..].try_into().ok()?);
    let zero = Ipv4Udp { id: 0, ..*hdr };
    let delta = got ^ icrc(&zero, &packet[..body]);
    basis.solve(body, delta)
}

/// The reduced matrix of [`solve_ip_id`] for the last length asked (packets of one stream have
/// a few lengths; a device keeps one per receive thread).
#[derive(Debug, Default, Clone)]
pub struct IdSolver {
    body: Option<usize>,
    /// (vector, identification bits it is the sum of), in insertion order; each vector's
    /// highest bit is absent from every later one.
    rows: Vec<(u32, u16)>,
}

impl IdSolver {
    fn solve(&mut self, body: usize, delta: u32) -> Option<u16> {
        if self.body != Some(body) {
            self.build(body);
        }
        let mut d = delta;
        let mut id = 0u16;
        for &(v, m) in &self.rows {
            let top = 31 - v.leading_zeros();
            if d & (1 << top) != 0 {
                d ^= v;
                id ^= m;
            }
        }
        (d == 0).then_some(id)
    }

    fn build(&mut self, body: usize) {
        let zeros = vec![0u8; body];
        let hdr = Ipv4Udp {
            src: Ipv4Addr::UNSPECIFIED,
            dst: Ipv4Addr::UNSPECIFIED,
            src_port: 0,
            dst_port: 0,
            id: 0,
        };
        let base = icrc(&hdr, &zeros);
        self.rows.clear();
        for bit in 0..16 {
            let mut v = icrc(
                &Ipv4Udp {
                    id: 1 << bit,
                    ..hdr
                },
                &zeros,
            ) ^ base;
            let mut m = 1u16 << bit;
            for &(r, rm) in &self.rows {
                let top = 31 - r.leading_zeros();
                if v & (1 << top) != 0 {
                    v ^= r;
                    m ^= rm;
                }
            }
            if v != 0 {
                self.rows.push((v, m));
            }
        }
        self.body = Some(body);
    }
}

/// `a + n` in the 24-bit PSN space.
pub fn psn_add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & MASK24
}

/// How `a` relates to `b` in the 24-bit PSN space, where a PSN up to 2^23 ahead is later
/// (IBTA 9.7.1; rxe's `psn_compare`).
pub fn psn_cmp(a: u32, b: u32) -> Ordering {
    let d = (a.wrapping_sub(b) << 8) as i32;
    d.cmp(&0)
}

/// How many PSNs `a` is after `b` (negative: before), within the 2^23 window.
pub fn psn_diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr() -> Ipv4Udp {
        Ipv4Udp {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            src_port: ROCEV2_UDP_PORT,
            dst_port: ROCEV2_UDP_PORT,
            id: 0,
        }
    }

    #[test]
    fn a_write_round_trips_with_its_reth_and_pad() {
        let mut bth = Bth::new(Opcode::WriteOnly, 0x11, 0x123456);
        bth.ack_req = true;
        let p = Packet::new(
            bth,
            Some(Reth {
                va: 0xdead_beef_0000,
                rkey: 7,
                len: 5,
            }),
            None,
            b"hello",
        );
        let mut buf = vec![0; p.buffer_len()];
        assert_eq!(p.emit(&hdr(), &mut buf), 12 + 16 + 5 + 3 + 4);
        let q = Packet::parse(&buf, &hdr()).unwrap();
        assert_eq!(q.payload, b"hello");
        assert_eq!(q.bth.pad, 3);
        assert_eq!(q.reth, p.reth);
        assert!(q.bth.ack_req);
        // Another address: the ICRC no longer matches.
        let mut other = hdr();
        other.src = Ipv4Addr::new(10, 0, 0, 3);
        assert!(matches!(
            Packet::parse(&buf, &other),
            Err(WireError::Icrc { .. })
        ));
    }

    #[test]
    fn psn_arithmetic_wraps_at_24_bits() {
        assert_eq!(psn_add(MASK24, 1), 0);
        assert_eq!(psn_cmp(0, MASK24), Ordering::Greater);
        assert_eq!(psn_cmp(5, 5), Ordering::Equal);
        assert_eq!(psn_diff(2, MASK24), 3);
        assert_eq!(psn_diff(MASK24, 2), -3);
    }
}
