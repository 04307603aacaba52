//! Property tests for the RoCEv2 codec (`smc_rdma::wire`).
//!
//! The expectations come from the specification, not from the crate: header sizes, offsets
//! and bit positions are written out here from IBTA vol. 1 ch. 9 (as in the kernel's
//! `rxe_hdr.h` and `include/rdma/ib_pack.h`), and the ICRC is recomputed by [`model_icrc`], a
//! bitwise CRC-32 over the real IPv4/UDP headers masked the way `rxe_icrc.c` masks them (the
//! crate instead builds a pseudo header and uses crc32fast). The scapy vectors in
//! `wire_vectors.rs` pin that model to a third implementation.
//!
//! * `parse` never panics: arbitrary bytes and addresses, arbitrary bytes given a correct ICRC
//!   (so that the header parsing past the ICRC check is reached), and lengths up to and past
//!   the largest UDP datagram.
//! * Round trip: valid packets of every opcode (SEND and RDMA WRITE first/middle/last/only,
//!   ACK with every syndrome class, opcodes the device does not speak), payloads 0..=4096:
//!   the emitted bytes are laid out as the spec says, carry the model's ICRC, and parse back to
//!   the same packet.
//! * Any single bit flip fails (CRC-32 detects every burst of up to 32 bits), except in BTH
//!   byte 4, which the ICRC masks: that packet parses with only `resv8a` changed. A different
//!   address or port fails the ICRC.
//! * Truncation at every length is a typed error, never a panic: `Truncated` below the
//!   headers, pad and ICRC, `Unaligned` off a multiple of four; past the headers an aligned
//!   prefix is indistinguishable from a shorter datagram and fails the ICRC.
//! * PSN arithmetic against an i64 model: wrap at 2^24, `psn_diff` in [-2^23, 2^23),
//!   antisymmetry of `psn_cmp` (everywhere but at exactly 2^23 apart, where rxe's
//!   `psn_compare`, and so the crate, calls each PSN earlier than the other).

use std::cmp::Ordering;
use std::net::Ipv4Addr;

use proptest::collection::vec;
use proptest::prelude::*;
use smc_rdma::wire::{
    Aeth, Bth, IdSolver, Ipv4Udp, NakCode, Opcode, Packet, Reth, Syndrome, WireError, psn_add,
    psn_cmp, psn_diff, solve_ip_id,
};

const P24: u32 = 1 << 24;
const HALF: u32 = 1 << 23;

// ---------------------------------------------------------------------------------------------
// The independent model: spec sizes and the rxe ICRC.

/// The opcode bytes of IBTA table 35 (RC) the crate names, with their extended headers:
/// (byte, RETH, AETH).
const RC_OPCODES: [(u8, bool, bool); 9] = [
    (0x00, false, false), // SEND First
    (0x01, false, false), // SEND Middle
    (0x02, false, false), // SEND Last
    (0x04, false, false), // SEND Only
    (0x06, true, false),  // RDMA WRITE First
    (0x07, false, false), // RDMA WRITE Middle
    (0x08, false, false), // RDMA WRITE Last
    (0x0a, true, false),  // RDMA WRITE Only
    (0x11, false, true),  // Acknowledge
];

/// Header bytes before the payload for an opcode byte: BTH 12, RETH 16, AETH 4.
fn spec_header_len(op: u8) -> usize {
    let (reth, aeth) = RC_OPCODES
        .iter()
        .find(|(b, _, _)| *b == op)
        .map_or((false, false), |&(_, r, a)| (r, a));
    12 + if reth { 16 } else { 0 } + if aeth { 4 } else { 0 }
}

fn spec_pad(n: usize) -> usize {
    n.next_multiple_of(4) - n
}

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xedb88320), bit by bit.
fn crc32_bitwise(chunks: &[&[u8]]) -> u32 {
    let mut c: u32 = 0xffff_ffff;
    for chunk in chunks {
        for &b in *chunk {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0xedb8_8320
                } else {
                    c >> 1
                };
            }
        }
    }
    !c
}

fn ip_checksum(h: &[u8]) -> u16 {
    let mut s: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// The IPv4 and UDP headers a datagram with `udp_payload_len` bytes of payload travels in
/// (`h`'s identification and DF; `tos` and `ttl` as given; a real header checksum; UDP
/// checksum 0).
fn real_headers(h: &Ipv4Udp, udp_payload_len: usize, tos: u8, ttl: u8) -> [u8; 28] {
    let udp_len = (8 + udp_payload_len) as u16;
    let mut b = [0u8; 28];
    b[0] = 0x45;
    b[1] = tos;
    b[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
    b[4..6].copy_from_slice(&h.id.to_be_bytes());
    b[6] = 0x40; // DF
    b[8] = ttl;
    b[9] = 17;
    b[12..16].copy_from_slice(&h.src.octets());
    b[16..20].copy_from_slice(&h.dst.octets());
    let c = ip_checksum(&b[..20]);
    b[10..12].copy_from_slice(&c.to_be_bytes());
    b[20..22].copy_from_slice(&h.src_port.to_be_bytes());
    b[22..24].copy_from_slice(&h.dst_port.to_be_bytes());
    b[24..26].copy_from_slice(&udp_len.to_be_bytes());
    b
}

/// The ICRC of a RoCEv2 UDP payload (`datagram`, ICRC included; its last four bytes are not
/// read) as `rxe_icrc.c` computes it: copy the IP and UDP headers, set TOS, TTL, the IP and
/// UDP checksums to all ones, set BTH byte 4 to all ones, CRC-32 after eight 0xff bytes.
fn model_icrc(h: &Ipv4Udp, datagram: &[u8], tos: u8, ttl: u8) -> [u8; 4] {
    let mut hdrs = real_headers(h, datagram.len(), tos, ttl);
    hdrs[1] = 0xff;
    hdrs[8] = 0xff;
    hdrs[10] = 0xff;
    hdrs[11] = 0xff;
    hdrs[26] = 0xff;
    hdrs[27] = 0xff;
    let body = &datagram[..datagram.len() - 4];
    let mut bth = [0u8; 12];
    bth.copy_from_slice(&body[..12]);
    bth[4] = 0xff;
    crc32_bitwise(&[&[0xff; 8], &hdrs, &bth, &body[12..]]).to_le_bytes()
}

// ---------------------------------------------------------------------------------------------
// Strategies.

fn addr() -> impl Strategy<Value = Ipv4Udp> {
    (
        any::<[u8; 4]>(),
        any::<[u8; 4]>(),
        any::<u16>(),
        any::<u16>(),
        prop_oneof![Just(0u16), any::<u16>()],
    )
        .prop_map(|(s, d, sp, dp, id)| Ipv4Udp {
            src: Ipv4Addr::from(s),
            dst: Ipv4Addr::from(d),
            src_port: sp,
            dst_port: dp,
            id,
        })
}

/// Every syndrome class of IBTA table 44: ACK, RNR NAK, the NAK codes (the five defined and
/// the reserved ones), and the reserved class 0b10 and bit 7.
fn syndrome() -> impl Strategy<Value = Syndrome> {
    prop_oneof![
        (0u8..32).prop_map(|credits| Syndrome::Ack { credits }),
        (0u8..32).prop_map(|timer| Syndrome::RnrNak { timer }),
        prop_oneof![
            Just(NakCode::PsnSequence),
            Just(NakCode::InvalidRequest),
            Just(NakCode::RemoteAccess),
            Just(NakCode::RemoteOperational),
            Just(NakCode::InvalidRdRequest),
            (5u8..32).prop_map(NakCode::Other),
        ]
        .prop_map(Syndrome::Nak),
        prop_oneof![0x40u8..0x60, 0x80u8..=0xff].prop_map(Syndrome::Reserved),
    ]
}

/// The byte IBTA gives a syndrome (written from table 44, not from the crate).
fn spec_syndrome_byte(s: Syndrome) -> u8 {
    match s {
        Syndrome::Ack { credits } => credits,
        Syndrome::RnrNak { timer } => 0b001_00000 | timer,
        Syndrome::Nak(c) => {
            0b011_00000
                | match c {
                    NakCode::PsnSequence => 0,
                    NakCode::InvalidRequest => 1,
                    NakCode::RemoteAccess => 2,
                    NakCode::RemoteOperational => 3,
                    NakCode::InvalidRdRequest => 4,
                    NakCode::Other(o) => o,
                }
        }
        Syndrome::Reserved(b) => b,
    }
}

fn opcode() -> impl Strategy<Value = Opcode> {
    prop_oneof![
        8 => prop::sample::select(vec![
            Opcode::SendFirst,
            Opcode::SendMiddle,
            Opcode::SendLast,
            Opcode::SendOnly,
            Opcode::WriteFirst,
            Opcode::WriteMiddle,
            Opcode::WriteLast,
            Opcode::WriteOnly,
            Opcode::Ack,
        ]),
        1 => any::<u8>()
            .prop_filter("an opcode the crate names", |b| {
                !RC_OPCODES.iter().any(|(k, _, _)| k == b)
            })
            .prop_map(Opcode::Other),
    ]
}

/// A packet to emit, owning its payload.
#[derive(Debug, Clone)]
struct Spec {
    hdr: Ipv4Udp,
    bth: Bth,
    reth: Option<Reth>,
    aeth: Option<Aeth>,
    payload: Vec<u8>,
}

impl Spec {
    fn packet(&self) -> Packet<'_> {
        Packet::new(self.bth, self.reth, self.aeth, &self.payload)
    }

    fn emit(&self) -> Vec<u8> {
        let p = self.packet();
        let mut buf = vec![0xa5; p.buffer_len() + 7];
        let n = p.emit(&self.hdr, &mut buf);
        assert_eq!(n, p.buffer_len());
        buf.truncate(n);
        buf
    }
}

/// Valid packets: every field in range, the extended header the opcode carries and no other,
/// the pad count the payload needs, transport version 0.
fn spec(max_payload: usize) -> impl Strategy<Value = Spec> {
    (
        addr(),
        opcode(),
        (any::<bool>(), any::<bool>(), any::<u16>(), any::<u8>()),
        (0..P24, any::<bool>(), 0..P24),
        (any::<u64>(), any::<u32>(), any::<u32>()),
        (syndrome(), 0..P24),
        vec(any::<u8>(), 0..=max_payload),
    )
        .prop_map(
            |(hdr, op, (se, m, pkey, resv8a), (qpn, a, psn), (va, rkey, len), (syn, msn), pl)| {
                let code = op.to_u8();
                let (_, has_reth, has_aeth) = RC_OPCODES
                    .iter()
                    .copied()
                    .find(|(b, _, _)| *b == code)
                    .unwrap_or((code, false, false));
                Spec {
                    hdr,
                    bth: Bth {
                        opcode: op,
                        solicited: se,
                        mig_req: m,
                        pad: spec_pad(pl.len()) as u8,
                        tver: 0,
                        pkey,
                        resv8a,
                        dest_qpn: qpn,
                        ack_req: a,
                        psn,
                    },
                    reth: has_reth.then_some(Reth { va, rkey, len }),
                    aeth: has_aeth.then_some(Aeth { syndrome: syn, msn }),
                    payload: pl,
                }
            },
        )
}

/// Checks the emitted bytes against the layout of IBTA ch. 9, field by field.
fn assert_layout(s: &Spec, b: &[u8]) {
    let op = s.bth.opcode.to_u8();
    let hl = spec_header_len(op);
    let pad = spec_pad(s.payload.len());
    assert_eq!(b.len(), hl + s.payload.len() + pad + 4, "length");
    assert_eq!(b[0], op);
    assert_eq!(b[1] >> 7, u8::from(s.bth.solicited), "SE");
    assert_eq!((b[1] >> 6) & 1, u8::from(s.bth.mig_req), "M");
    assert_eq!(usize::from((b[1] >> 4) & 3), pad, "PadCnt");
    assert_eq!(b[1] & 0xf, 0, "TVer");
    assert_eq!(b[2..4], s.bth.pkey.to_be_bytes(), "P_Key");
    assert_eq!(b[4], s.bth.resv8a, "FECN/BECN/reserved");
    assert_eq!(b[5..8], s.bth.dest_qpn.to_be_bytes()[1..], "DestQP");
    assert_eq!(b[8], u8::from(s.bth.ack_req) << 7, "A and reserved 7");
    assert_eq!(b[9..12], s.bth.psn.to_be_bytes()[1..], "PSN");
    let mut at = 12;
    if let Some(r) = s.reth {
        assert_eq!(b[12..20], r.va.to_be_bytes(), "RETH VA");
        assert_eq!(b[20..24], r.rkey.to_be_bytes(), "RETH R_Key");
        assert_eq!(b[24..28], r.len.to_be_bytes(), "RETH DMA length");
        at = 28;
    }
    if let Some(a) = s.aeth {
        assert_eq!(b[12], spec_syndrome_byte(a.syndrome), "AETH syndrome");
        assert_eq!(b[13..16], a.msn.to_be_bytes()[1..], "AETH MSN");
        at = 16;
    }
    assert_eq!(at, hl);
    assert_eq!(&b[hl..hl + s.payload.len()], &s.payload[..], "payload");
    let pad_at = hl + s.payload.len();
    assert!(b[pad_at..pad_at + pad].iter().all(|&x| x == 0), "pad bytes");
    assert_eq!(
        b[b.len() - 4..],
        model_icrc(&s.hdr, b, 0, 64),
        "ICRC (rxe's algorithm over the real headers)"
    );
}

// ---------------------------------------------------------------------------------------------
// Properties.

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn parse_never_panics_on_arbitrary_bytes(
        hdr in addr(),
        bytes in prop_oneof![vec(any::<u8>(), 0..64), vec(any::<u8>(), 0..2048)],
    ) {
        let _ = Packet::parse(&bytes, &hdr).map(|p| p.buffer_len());
    }

    /// Arbitrary bytes made to pass the length, version and ICRC checks (with the model's
    /// ICRC): they parse, and the packet re-emits to bytes that parse to it; when the
    /// reserved bits of BTH byte 8 and the pad bytes are zero (what a sender writes; a
    /// receiver ignores them), it re-emits to the input exactly.
    #[test]
    fn arbitrary_bytes_with_a_good_icrc_parse_and_re_emit(
        hdr in addr(),
        mut bytes in vec(any::<u8>(), 16..600),
        canonical in any::<bool>(),
        (tos, ttl) in (any::<u8>(), any::<u8>()),
    ) {
        let len = bytes.len() / 4 * 4;
        bytes.truncate(len);
        bytes[1] &= 0xf0; // TVer 0
        let hl = spec_header_len(bytes[0]);
        let pad = usize::from((bytes[1] >> 4) & 3);
        if canonical {
            bytes[8] &= 0x80;
            if hl + pad + 4 <= len {
                bytes[len - 4 - pad..len - 4].fill(0);
            }
        }
        let icrc = model_icrc(&hdr, &bytes, tos, ttl);
        bytes[len - 4..].copy_from_slice(&icrc);
        let parsed = Packet::parse(&bytes, &hdr);
        if hl + pad + 4 > len {
            prop_assert_eq!(parsed, Err(WireError::Truncated { need: hl + pad + 4, have: len }));
            return Ok(());
        }
        let p = parsed.expect("a long enough packet with a good ICRC parses");
        prop_assert_eq!(p.bth.opcode.to_u8(), bytes[0]);
        prop_assert_eq!(usize::from(p.bth.pad), pad);
        prop_assert_eq!(p.payload, &bytes[hl..len - 4 - pad]);
        let mut out = vec![0u8; p.buffer_len()];
        prop_assert_eq!(p.emit(&hdr, &mut out), len);
        prop_assert_eq!(Packet::parse(&out, &hdr), Ok(p));
        let reserved_zero = bytes[8] & 0x7f == 0
            && bytes[len - 4 - pad..len - 4].iter().all(|&b| b == 0);
        if reserved_zero {
            prop_assert_eq!(out, bytes);
        }
    }

    #[test]
    fn valid_packets_round_trip(s in spec(4096)) {
        let b = s.emit();
        assert_layout(&s, &b);
        let p = Packet::parse(&b, &s.hdr);
        prop_assert_eq!(p, Ok(s.packet()));
    }

    /// The pad count is the emitter's business: whatever the repr says, the emitted one is
    /// what the payload needs.
    #[test]
    fn emit_sets_the_pad_count(mut s in spec(64), pad in 0u8..=255) {
        let want = s.bth.pad;
        s.bth.pad = pad;
        let b = s.emit();
        prop_assert_eq!(usize::from((b[1] >> 4) & 3), spec_pad(s.payload.len()));
        prop_assert_eq!(Packet::parse(&b, &s.hdr).map(|p| p.bth.pad), Ok(want));
    }

    #[test]
    fn a_bit_flip_fails_unless_in_bth_byte_4(s in spec(4096), bit in any::<prop::sample::Index>()) {
        let b = s.emit();
        check_flip(&s, &b, bit.index(b.len() * 8));
    }

    /// Every bit of smaller packets, one flip at a time.
    #[test]
    fn every_single_bit_flip(s in spec(40)) {
        let b = s.emit();
        for i in 0..b.len() * 8 {
            check_flip(&s, &b, i);
        }
    }

    #[test]
    fn another_address_or_port_fails_the_icrc(
        s in spec(512),
        which in 0..4usize,
        x in any::<u32>(),
    ) {
        let b = s.emit();
        let mut h = s.hdr;
        // One field at a time: each is at most 32 contiguous bits, a burst CRC-32 always
        // detects.
        match which {
            0 => h.src = Ipv4Addr::from(u32::from(h.src) ^ x.max(1)),
            1 => h.dst = Ipv4Addr::from(u32::from(h.dst) ^ x.max(1)),
            2 => h.src_port ^= (x as u16).max(1),
            _ => h.dst_port ^= (x as u16).max(1),
        }
        prop_assert!(
            matches!(Packet::parse(&b, &h), Err(WireError::Icrc { .. })),
            "{:?} accepted with {:?}", s.hdr, h
        );
    }

    /// A receiver that does not see the IPv4 identification finds the one the packet was
    /// sent with (`solve_ip_id`), whatever the packet; another identification fails the ICRC.
    #[test]
    fn the_ip_identification_is_solved_for(s in spec(1100), other in any::<u16>()) {
        let b = s.emit();
        let mut solver = IdSolver::default();
        prop_assert_eq!(solve_ip_id(&s.hdr, &b, &mut solver), Some(s.hdr.id));
        let guess = Ipv4Udp { id: 0, ..s.hdr };
        prop_assert_eq!(solve_ip_id(&guess, &b, &mut solver), Some(s.hdr.id));
        if other != s.hdr.id {
            let wrong = Ipv4Udp { id: other, ..s.hdr };
            prop_assert!(matches!(Packet::parse(&b, &wrong), Err(WireError::Icrc { .. })), "id {} accepted for {}", other, s.hdr.id);
        }
    }

    /// The masked IPv4 fields (TOS, TTL, checksum) do not enter the ICRC: the model computed
    /// with any TOS and TTL is the ICRC the crate emits.
    #[test]
    fn tos_and_ttl_are_masked(s in spec(128), tos in any::<u8>(), ttl in any::<u8>()) {
        let b = s.emit();
        prop_assert_eq!(&b[b.len() - 4..], &model_icrc(&s.hdr, &b, tos, ttl)[..]);
    }

    #[test]
    fn truncation_is_a_typed_error_at_every_length(s in spec(256)) {
        let b = s.emit();
        let need = spec_header_len(s.bth.opcode.to_u8()) + spec_pad(s.payload.len()) + 4;
        for l in 0..b.len() {
            let r = Packet::parse(&b[..l], &s.hdr);
            if l < 16 {
                prop_assert_eq!(r, Err(WireError::Truncated { need: 16, have: l }));
            } else if l % 4 != 0 {
                prop_assert_eq!(r, Err(WireError::Unaligned { len: l }));
            } else if l < need {
                prop_assert_eq!(r, Err(WireError::Truncated { need, have: l }));
            } else {
                prop_assert!(matches!(r, Err(WireError::Icrc { .. })), "prefix {} of {}: {:?}", l, b.len(), r);
            }
        }
    }

    #[test]
    fn psn_add_wraps_at_2_pow_24(a in any::<u32>(), n in any::<u32>(), m in any::<u32>()) {
        let model = ((u64::from(a) + u64::from(n)) % u64::from(P24)) as u32;
        prop_assert_eq!(psn_add(a, n), model);
        prop_assert!(psn_add(a, n) < P24);
        prop_assert_eq!(psn_add(a, P24), a % P24);
        prop_assert_eq!(psn_add(psn_add(a, n), m), psn_add(a, n.wrapping_add(m)));
    }

    #[test]
    fn psn_diff_and_cmp_follow_the_window(a in any::<u32>(), b in any::<u32>()) {
        // The distance from b to a in the 24-bit ring, then folded into [-2^23, 2^23).
        let ring = (i64::from(a) - i64::from(b)).rem_euclid(i64::from(P24));
        let model = if ring >= i64::from(HALF) { ring - i64::from(P24) } else { ring };
        let d = psn_diff(a, b);
        prop_assert_eq!(i64::from(d), model);
        prop_assert!((-(HALF as i32)..HALF as i32).contains(&d));
        prop_assert_eq!(psn_cmp(a, b), model.cmp(&0));
        // Only the low 24 bits count.
        prop_assert_eq!(psn_diff(a & 0xff_ffff, b | 0xff00_0000), d);
        prop_assert_eq!(psn_cmp(a | 0xab00_0000, b & 0xff_ffff), psn_cmp(a, b));
        // Antisymmetry, except at exactly half the ring apart.
        if ring != i64::from(HALF) {
            prop_assert_eq!(psn_cmp(b, a), psn_cmp(a, b).reverse());
            prop_assert_eq!(psn_diff(b, a), -d);
        }
        // b + diff(a, b) is a.
        prop_assert_eq!(psn_add(b, d as u32), a & 0xff_ffff);
    }

    #[test]
    fn psn_diff_inverts_psn_add(b in any::<u32>(), d in -(HALF as i32)..HALF as i32) {
        let a = psn_add(b, d as u32);
        prop_assert_eq!(psn_diff(a, b), d);
        prop_assert_eq!(psn_cmp(a, b), d.cmp(&0));
    }
}

fn check_flip(s: &Spec, b: &[u8], bit: usize) {
    let mut f = b.to_vec();
    let (byte, mask) = (bit / 8, 1u8 << (bit % 8));
    f[byte] ^= mask;
    let r = Packet::parse(&f, &s.hdr);
    if byte == 4 {
        let mut want = s.packet();
        want.bth.resv8a ^= mask;
        assert_eq!(
            r,
            Ok(want),
            "flip of bit {bit} (BTH byte 4, masked) must parse"
        );
        return;
    }
    let len = b.len();
    match byte {
        // The opcode: another header length, so maybe too short, else the ICRC.
        0 => assert!(
            matches!(r, Err(WireError::Icrc { .. } | WireError::Truncated { .. })),
            "bit {bit}: {r:?}"
        ),
        // TVer.
        1 if mask & 0x0f != 0 => {
            assert_eq!(r, Err(WireError::Version(mask)), "bit {bit}")
        }
        // PadCnt: maybe longer than the packet holds, else the ICRC.
        1 if mask & 0x30 != 0 => {
            let op = s.bth.opcode.to_u8();
            let pad = usize::from((f[1] >> 4) & 3);
            let need = spec_header_len(op) + pad + 4;
            if need > len {
                assert_eq!(
                    r,
                    Err(WireError::Truncated { need, have: len }),
                    "bit {bit}"
                );
            } else {
                assert!(matches!(r, Err(WireError::Icrc { .. })), "bit {bit}: {r:?}");
            }
        }
        _ => assert!(
            matches!(r, Err(WireError::Icrc { .. })),
            "bit {bit} (byte {byte} of {len}): {r:?}"
        ),
    }
}

/// Every byte names an opcode and gives it back; the nine the device speaks are IBTA's
/// values.
#[test]
fn opcode_bytes_round_trip() {
    for b in 0..=255u8 {
        let op = Opcode::from_u8(b);
        assert_eq!(op.to_u8(), b);
        let known = RC_OPCODES.iter().find(|(k, _, _)| *k == b);
        assert_eq!(!matches!(op, Opcode::Other(_)), known.is_some(), "{b:#04x}");
        if let Some(&(_, reth, aeth)) = known {
            assert_eq!(op.has_reth(), reth, "{b:#04x}");
            assert_eq!(op.has_aeth(), aeth, "{b:#04x}");
        }
    }
}

/// Every syndrome byte decodes to its IBTA class and gives the byte back.
#[test]
fn syndrome_bytes_round_trip() {
    for b in 0..=255u8 {
        let s = Syndrome::from_u8(b);
        assert_eq!(s.to_u8(), b);
        assert_eq!(spec_syndrome_byte(s), b);
        let class_ok = match b {
            0x00..=0x1f => matches!(s, Syndrome::Ack { credits } if credits == b),
            0x20..=0x3f => matches!(s, Syndrome::RnrNak { timer } if timer == b & 0x1f),
            0x60..=0x7f => matches!(s, Syndrome::Nak(_)),
            _ => matches!(s, Syndrome::Reserved(x) if x == b),
        };
        assert!(class_ok, "{b:#04x} decoded as {s:?}");
    }
}

#[test]
fn psn_wraps_at_the_edges() {
    let m = P24 - 1;
    assert_eq!(psn_add(m, 1), 0);
    assert_eq!(psn_cmp(0, m), Ordering::Greater);
    assert_eq!(psn_cmp(m, 0), Ordering::Less);
    assert_eq!(psn_diff(0, m), 1);
    assert_eq!(psn_diff(m, 0), -1);
    assert_eq!(psn_diff(HALF - 1, 0), (HALF - 1) as i32);
    assert_eq!(psn_diff(HALF + 1, 0), -((HALF - 1) as i32));
    // Exactly half the ring apart: the window is [-2^23, 2^23), so each PSN is 2^23 *before*
    // the other (rxe's psn_compare does the same).
    assert_eq!(psn_diff(HALF, 0), -(HALF as i32));
    assert_eq!(psn_diff(0, HALF), -(HALF as i32));
    assert_eq!(psn_cmp(HALF, 0), Ordering::Less);
    assert_eq!(psn_cmp(0, HALF), Ordering::Less);
}

/// Solving for the identification costs the ICRC 16 of its 32 bits against arbitrary damage,
/// not against small damage: for every SEND of 0 to 300 payload bytes, no single flipped bit
/// (outside BTH byte 4, which the ICRC does not cover) is explained by some identification.
#[test]
fn a_flipped_bit_is_never_explained_by_an_identification() {
    let hdr = Ipv4Udp {
        src: Ipv4Addr::new(10, 0, 0, 1),
        dst: Ipv4Addr::new(10, 0, 0, 2),
        src_port: 49152,
        dst_port: 4791,
        id: 0,
    };
    let mut solver = IdSolver::default();
    let mut explained = Vec::new();
    for len in 0..=300usize {
        let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let p = Packet::new(Bth::new(Opcode::SendOnly, 0x11, 7), None, None, &payload);
        let mut b = vec![0u8; p.buffer_len()];
        p.emit(&hdr, &mut b);
        for bit in 0..b.len() * 8 {
            if bit / 8 == 4 {
                continue;
            }
            let mut f = b.clone();
            f[bit / 8] ^= 1 << (bit % 8);
            if solve_ip_id(&hdr, &f, &mut solver).is_some() {
                explained.push((len, bit));
            }
        }
    }
    assert!(explained.is_empty(), "{explained:?}");
}

/// A UDP payload cannot be longer than 65507 bytes behind an IPv4 header, but `parse` takes any
/// slice: at and past that size (where the 16-bit lengths of the reconstructed headers
/// overflow) it must return an error, not panic.
#[test]
fn parse_never_panics_at_or_past_the_largest_datagram() {
    let hdr = Ipv4Udp {
        src: Ipv4Addr::new(10, 0, 0, 1),
        dst: Ipv4Addr::new(10, 0, 0, 2),
        src_port: 49152,
        dst_port: 4791,
        id: 0,
    };
    let buf = vec![0u8; 65536 * 2 + 64];
    for len in (65480..65600).chain(131_040..131_136).step_by(4) {
        // Opcode 0 (SEND First), TVer 0: it reaches the ICRC check.
        assert!(
            matches!(
                Packet::parse(&buf[..len], &hdr),
                Err(WireError::Icrc { .. })
            ),
            "{len}"
        );
    }
}

/// Emitting a payload too big for a datagram is the caller's mistake, but must not panic
/// either; the bytes still parse back with the same addresses.
#[test]
fn emit_never_panics_on_an_oversized_payload() {
    let hdr = Ipv4Udp {
        src: Ipv4Addr::new(10, 0, 0, 1),
        dst: Ipv4Addr::new(10, 0, 0, 2),
        src_port: 49152,
        dst_port: 4791,
        id: 0,
    };
    for len in [65503, 65504, 65505, 65506, 65510, 65535, 65536, 70000] {
        let payload = vec![0x5au8; len];
        let mut bth = Bth::new(Opcode::SendOnly, 0x11, 1);
        bth.pad = spec_pad(len) as u8;
        let p = Packet::new(bth, None, None, &payload);
        let mut buf = vec![0u8; p.buffer_len()];
        let n = p.emit(&hdr, &mut buf);
        assert_eq!(n, 12 + len + spec_pad(len) + 4);
        // Not assert_eq: a mismatch would print 64 KiB of payload.
        assert!(Packet::parse(&buf[..n], &hdr) == Ok(p), "{len}");
    }
}
