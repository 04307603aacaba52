//! Property tests for the RoCE v1 framing (`smc_rdma::wire::v1`).
//!
//! The expectations are written out here from IBTA vol. 1 (GRH, ch. 8.3; BTH, ch. 9) and annex
//! A16 (RoCE: Ethertype 0x8915, no LRH), not taken from the crate: [`model_icrc`] is a
//! bitwise CRC-32 over eight bytes of ones (the absent LRH), the GRH as it is on the wire with
//! traffic class, flow label and hop limit set to ones, the BTH with byte 4 set to ones, and the
//! rest of the packet.
//!
//! * `parse` never panics: arbitrary bytes, and arbitrary bytes behind a valid Ethernet header
//!   and GRH with a correct ICRC (so the transport parsing behind it is reached).
//! * Round trip: frames with every transport opcode, random GRH fields and GIDs, payloads up
//!   to 4096 bytes: the bytes are laid out as the spec says, carry the model's ICRC, and parse
//!   back to the same frame.
//! * The variant fields (traffic class, flow label, hop limit) may change and the frame still
//!   parses; the MACs (not in the ICRC) likewise; any other bit flipped is a typed error.
//! * Truncation at every length is a typed error; Ethernet padding after the packet is ignored.
//! * `gid_of_mac` and `mac_of_gid` are inverse, and `mac_of_gid` refuses what is not a
//!   link-local EUI-64 GID.

use proptest::collection::vec;
use proptest::prelude::*;
use smc_rdma::wire::v1::{Frame, FrameError, Grh, gid_of_mac, mac_of_gid};
use smc_rdma::wire::{Aeth, Bth, Opcode, Packet, Reth, Syndrome};

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

/// The ICRC of a whole frame (its last four bytes excluded), by the rule in the module docs.
fn model_icrc(frame: &[u8]) -> [u8; 4] {
    let mut grh = frame[14..54].to_vec();
    // Version (4 bits) kept; traffic class (8) and flow label (20) all ones.
    grh[0] |= 0x0f;
    grh[1] = 0xff;
    grh[2] = 0xff;
    grh[3] = 0xff;
    grh[7] = 0xff; // hop limit
    let mut bth = frame[54..66].to_vec();
    bth[4] = 0xff;
    let end = frame.len() - 4;
    crc32_bitwise(&[&[0xff; 8], &grh, &bth, &frame[66..end]]).to_le_bytes()
}

const OPCODES: [Opcode; 10] = [
    Opcode::SendFirst,
    Opcode::SendMiddle,
    Opcode::SendLast,
    Opcode::SendOnly,
    Opcode::WriteFirst,
    Opcode::WriteMiddle,
    Opcode::WriteLast,
    Opcode::WriteOnly,
    Opcode::Ack,
    Opcode::Other(0x0c),
];

#[derive(Debug, Clone)]
struct Spec {
    dst: [u8; 6],
    src: [u8; 6],
    grh: Grh,
    bth: Bth,
    reth: Option<Reth>,
    aeth: Option<Aeth>,
    payload: Vec<u8>,
}

impl Spec {
    fn frame(&self) -> Frame<'_> {
        Frame {
            dst_mac: self.dst,
            src_mac: self.src,
            grh: self.grh,
            packet: Packet::new(self.bth, self.reth, self.aeth, &self.payload),
        }
    }

    fn emit(&self) -> Vec<u8> {
        let f = self.frame();
        let mut buf = vec![0xa5; f.buffer_len() + 5];
        let n = f.emit(&mut buf);
        assert_eq!(n, f.buffer_len());
        buf.truncate(n);
        buf
    }
}

fn spec(max_payload: usize) -> impl Strategy<Value = Spec> {
    (
        (any::<[u8; 6]>(), any::<[u8; 6]>()),
        (
            any::<u8>(),
            0u32..1 << 20,
            any::<u8>(),
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
        ),
        prop::sample::select(OPCODES.to_vec()),
        (
            any::<bool>(),
            any::<u16>(),
            0u32..1 << 24,
            any::<bool>(),
            0u32..1 << 24,
        ),
        (
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u8>(),
            0u32..1 << 24,
        ),
        vec(any::<u8>(), 0..=max_payload),
    )
        .prop_map(
            |((dst, src), (tc, fl, hl, sgid, dgid), op, (se, pkey, qpn, a, psn), r, payload)| {
                let mut bth = Bth::new(op, qpn, psn);
                bth.solicited = se;
                bth.pkey = pkey;
                bth.ack_req = a;
                bth.pad = ((4 - payload.len() % 4) % 4) as u8;
                Spec {
                    dst,
                    src,
                    grh: Grh {
                        tclass: tc,
                        flow_label: fl,
                        hop_limit: hl,
                        sgid,
                        dgid,
                    },
                    bth,
                    reth: op.has_reth().then_some(Reth {
                        va: r.0,
                        rkey: r.1,
                        len: r.2,
                    }),
                    aeth: op.has_aeth().then_some(Aeth {
                        syndrome: Syndrome::from_u8(r.3),
                        msn: r.4,
                    }),
                    payload,
                }
            },
        )
}

fn assert_layout(s: &Spec, b: &[u8]) {
    let transport = b.len() - 54;
    assert_eq!(b[0..6], s.dst, "destination MAC");
    assert_eq!(b[6..12], s.src, "source MAC");
    assert_eq!(b[12..14], [0x89, 0x15], "Ethertype");
    assert_eq!(b[14] >> 4, 6, "GRH IPVer");
    let w = u32::from_be_bytes([b[14], b[15], b[16], b[17]]);
    assert_eq!((w >> 20) & 0xff, u32::from(s.grh.tclass), "TClass");
    assert_eq!(w & 0xf_ffff, s.grh.flow_label, "FlowLabel");
    assert_eq!(
        usize::from(u16::from_be_bytes([b[18], b[19]])),
        transport,
        "PayLen: BTH to ICRC"
    );
    assert_eq!(b[20], 0x1b, "NxtHdr: BTH");
    assert_eq!(b[21], s.grh.hop_limit, "HopLmt");
    assert_eq!(b[22..38], s.grh.sgid, "SGID");
    assert_eq!(b[38..54], s.grh.dgid, "DGID");
    assert_eq!(b[54], s.bth.opcode.to_u8(), "BTH opcode");
    assert_eq!(b[59..62], s.bth.dest_qpn.to_be_bytes()[1..], "DestQP");
    assert_eq!(b[b.len() - 4..], model_icrc(b), "ICRC");
}

/// Whether bit `bit` of a frame lies where a change is allowed to parse: the MACs (outside the
/// ICRC), the GRH's traffic class, flow label and hop limit, BTH byte 4 (masked).
fn variant(bit: usize) -> bool {
    let byte = bit / 8;
    byte < 12
        || (byte == 14 && bit % 8 >= 4)
        || (15..18).contains(&byte)
        || byte == 21
        || byte == 58
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn parse_never_panics_on_arbitrary_bytes(b in vec(any::<u8>(), 0..2200)) {
        let _ = Frame::parse(&b);
    }

    #[test]
    fn arbitrary_transport_bytes_with_a_good_icrc_never_panic(
        s in spec(16),
        tail in vec(any::<u8>(), 0..200),
        paylen in any::<Option<u16>>(),
    ) {
        // A real header and GRH, then arbitrary transport bytes with the right ICRC.
        let mut b = s.emit();
        b.truncate(54);
        b.extend_from_slice(&tail);
        let plen = paylen.map_or(tail.len(), usize::from);
        b[18..20].copy_from_slice(&(plen as u16).to_be_bytes());
        if b.len() >= 54 + 12 + 4 && plen == tail.len() {
            let crc = model_icrc(&b);
            let n = b.len();
            b[n - 4..].copy_from_slice(&crc);
        }
        if let Ok(f) = Frame::parse(&b) {
            prop_assert_eq!(f.buffer_len(), 54 + usize::from(u16::from_be_bytes([b[18], b[19]])));
            let mut out = vec![0; f.buffer_len()];
            f.emit(&mut out);
            prop_assert_eq!(Frame::parse(&out), Ok(f));
        }
    }

    #[test]
    fn valid_frames_round_trip(s in spec(4096)) {
        let b = s.emit();
        assert_layout(&s, &b);
        prop_assert_eq!(Frame::parse(&b), Ok(s.frame()));
    }

    #[test]
    fn a_bit_flip_is_caught_unless_in_a_variant_field(s in spec(300), bit in any::<prop::sample::Index>()) {
        let b = s.emit();
        let bit = bit.index(b.len() * 8);
        let mut v = b.clone();
        v[bit / 8] ^= 1 << (7 - bit % 8);
        let r = Frame::parse(&v);
        if variant(bit) {
            let f = r.expect("a variant field changed: still valid");
            prop_assert_eq!(f.packet.payload, &s.payload[..]);
        } else {
            prop_assert!(r.is_err(), "bit {} flipped and the frame parsed", bit);
        }
    }

    #[test]
    fn truncation_is_a_typed_error_and_padding_is_ignored(s in spec(128), pad in 1usize..40) {
        let b = s.emit();
        for n in 0..b.len() {
            let r = Frame::parse(&b[..n]);
            prop_assert!(
                matches!(r, Err(FrameError::Truncated { .. })),
                "{} of {} bytes: {:?}", n, b.len(), r
            );
        }
        let mut padded = b.clone();
        padded.extend(std::iter::repeat_n(0, pad));
        prop_assert_eq!(Frame::parse(&padded), Ok(s.frame()));
    }

    #[test]
    fn eui64_gids_and_macs_are_inverse(mac in any::<[u8; 6]>(), g in any::<[u8; 16]>()) {
        prop_assert_eq!(mac_of_gid(&gid_of_mac(mac)), Some(mac));
        let ll_eui = g[0] == 0xfe && g[1] == 0x80 && g[2..8].iter().all(|&x| x == 0)
            && g[11] == 0xff && g[12] == 0xfe;
        prop_assert_eq!(mac_of_gid(&g).is_some(), ll_eui);
        if let Some(m) = mac_of_gid(&g) {
            prop_assert_eq!(gid_of_mac(m), g);
        }
    }
}

#[test]
fn another_ethertype_version_or_next_header_is_refused() {
    let s = Spec {
        dst: [2, 0, 0, 0, 0, 2],
        src: [2, 0, 0, 0, 0, 1],
        grh: Grh {
            tclass: 0,
            flow_label: 0,
            hop_limit: 1,
            sgid: gid_of_mac([2, 0, 0, 0, 0, 1]),
            dgid: gid_of_mac([2, 0, 0, 0, 0, 2]),
        },
        bth: Bth::new(Opcode::SendOnly, 17, 0),
        reth: None,
        aeth: None,
        payload: vec![1; 44],
    };
    let b = s.emit();
    let mut v = b.clone();
    v[13] = 0x00;
    assert_eq!(Frame::parse(&v), Err(FrameError::EtherType(0x8900)));
    let mut v = b.clone();
    v[14] = 0x40 | (v[14] & 0x0f);
    assert_eq!(Frame::parse(&v), Err(FrameError::Version(4)));
    let mut v = b.clone();
    v[20] = 17;
    assert_eq!(Frame::parse(&v), Err(FrameError::NextHeader(17)));
}
