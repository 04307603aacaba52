//! ICRC test vectors from an independent implementation: scapy's RoCEv2 layer
//! (`scapy.contrib.roce`, whose `BTH.compute_icrc` builds the masked pseudo header from the
//! real IPv4/UDP headers and runs zlib's CRC-32 over it). Each vector is a complete IPv4/UDP/
//! RoCEv2 packet as scapy serialised it; the test takes the addresses and ports from its IP and
//! UDP headers, parses the UDP payload with the crate, compares every field with the values the
//! Python below was given (written out here by hand, not derived from the crate), checks the
//! ICRC, and emits the same packet from a hand-built repr, which must be the scapy bytes.
//!
//! The IPv4 headers have identification 0 and DF set: the crate reconstructs exactly that
//! header for the ICRC (module docs of `smc_rdma::wire`); the test asserts it of each vector.
//!
//! Produced with scapy 2.8.0 (`pip install scapy` in a venv, Python 3.11) by this script; its
//! output is pasted below unchanged:
//!
//! ```python
//! import struct, scapy
//! from scapy.layers.inet import IP, UDP
//! from scapy.contrib.roce import BTH, AETH
//! from scapy.packet import Raw
//! from scapy.compat import raw
//!
//! def ip(sport):
//!     return (IP(src="192.168.1.10", dst="192.168.1.20", id=0, flags="DF", ttl=64, tos=0)
//!             / UDP(sport=sport, dport=4791))
//!
//! vectors = [
//!     ("SEND_ONLY_44", ip(0xC011)
//!      / BTH(opcode=0x04, solicited=1, pkey=0xFFFF, dqpn=0x000011, ackreq=1, psn=0x123456)
//!      / Raw(bytes(range(0x40, 0x40 + 44)))),
//!     ("WRITE_FIRST_RETH", ip(0xC012)
//!      / BTH(opcode=0x06, pkey=0xFFFF, dqpn=0xABCDEF, psn=0xFFFFFE)
//!      / Raw(struct.pack("!QII", 0x00007F1234560000, 0x1A2B3C4D, 0x1000)
//!            + bytes((i * 7) & 0xFF for i in range(256)))),
//!     ("ACK_AETH", ip(0xC013)
//!      / BTH(opcode=0x11, pkey=0xFFFF, dqpn=0x000012, psn=0x000100)
//!      / AETH(syndrome=0x1F, msn=0x000042)),
//!     ("NAK_INVALID_REQUEST", ip(0xC013)
//!      / BTH(opcode=0x11, pkey=0xFFFF, dqpn=0x000012, psn=0x000101)
//!      / AETH(syndrome=0x61, msn=0x000042)),
//!     ("SEND_LAST_PAD3", ip(0xC014)
//!      / BTH(opcode=0x02, padcount=3, fecn=1, pkey=0x8001, dqpn=0x000013, ackreq=1, psn=0x000007)
//!      / Raw(b"hello, world!" + b"\x00" * 3)),
//! ]
//! print("// scapy", scapy.__version__)
//! for name, p in vectors:
//!     h = raw(p).hex()
//!     print(f"const {name}: &str = concat!(")
//!     for i in range(0, len(h), 64):
//!         print(f'    "{h[i:i + 64]}",')
//!     print(");")
//! ```
//!
//! scapy has no RETH layer, so the WRITE FIRST's RETH is packed by hand (`!QII`: VA, R_Key,
//! DMA length, big endian) in front of the payload; scapy does not pad either, so the SEND
//! LAST carries `padcount=3` and its three zero pad bytes explicitly. `fecn=1` there sets BTH
//! byte 4 to 0x80, which the ICRC masks: the crate must accept it and report it in `resv8a`.
//! The ICRC agrees with the kernel's `drivers/infiniband/sw/rxe/rxe_icrc.c`: `crc32_le` seeded
//! with 0xdebb20e3 (the state after 0xffffffff and eight 0xff bytes), final inversion, stored
//! in CPU (little-endian) order, which is scapy's zlib CRC-32 over `ff×8 ‖ masked headers ‖
//! payload` packed little endian.

use std::net::Ipv4Addr;

use smc_rdma::wire::{
    Aeth, Bth, Ipv4Udp, NakCode, Opcode, Packet, Reth, Syndrome, WireError, icrc,
};

// scapy 2.8.0
const SEND_ONLY_44: &str = concat!(
    "45000058000040004011b726c0a8010ac0a80114c01112b70044c0290480ffff",
    "0000001180123456404142434445464748494a4b4c4d4e4f5051525354555657",
    "58595a5b5c5d5e5f606162636465666768696a6b4be98eb6",
);
const WRITE_FIRST_RETH: &str = concat!(
    "4500013c000040004011b642c0a8010ac0a80114c01212b70128ebd50600ffff",
    "00abcdef00fffffe00007f12345600001a2b3c4d0000100000070e151c232a31",
    "383f464d545b626970777e858c939aa1a8afb6bdc4cbd2d9e0e7eef5fc030a11",
    "181f262d343b424950575e656c737a81888f969da4abb2b9c0c7ced5dce3eaf1",
    "f8ff060d141b222930373e454c535a61686f767d848b9299a0a7aeb5bcc3cad1",
    "d8dfe6edf4fb020910171e252c333a41484f565d646b727980878e959ca3aab1",
    "b8bfc6cdd4dbe2e9f0f7fe050c131a21282f363d444b525960676e757c838a91",
    "989fa6adb4bbc2c9d0d7dee5ecf3fa01080f161d242b323940474e555c636a71",
    "787f868d949ba2a9b0b7bec5ccd3dae1e8eff6fd040b121920272e353c434a51",
    "585f666d747b828990979ea5acb3bac1c8cfd6dde4ebf2f98bce8007",
);
const ACK_AETH: &str = concat!(
    "45000030000040004011b74ec0a8010ac0a80114c01312b7001c7f241100ffff",
    "00000012000001001f000042ac394cca",
);
const NAK_INVALID_REQUEST: &str = concat!(
    "45000030000040004011b74ec0a8010ac0a80114c01312b7001cb5e21100ffff",
    "000000120000010161000042b3c7cc7c",
);
const SEND_LAST_PAD3: &str = concat!(
    "4500003c000040004011b742c0a8010ac0a80114c01412b70028c74002308001",
    "800000138000000768656c6c6f2c20776f726c64210000005df9a090",
);

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2));
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// A vector split at its IPv4 and UDP headers: the addresses the crate needs and the UDP
/// payload (the RoCEv2 packet).
struct Datagram {
    hdr: Ipv4Udp,
    payload: Vec<u8>,
}

fn split(name: &str, hex: &str) -> Datagram {
    let b = unhex(hex);
    assert_eq!(b[0], 0x45, "{name}: IPv4 without options");
    assert_eq!(
        usize::from(u16::from_be_bytes([b[2], b[3]])),
        b.len(),
        "{name}: IPv4 total length"
    );
    assert_eq!(
        u16::from_be_bytes([b[4], b[5]]),
        0,
        "{name}: identification 0"
    );
    assert_eq!(
        u16::from_be_bytes([b[6], b[7]]),
        0x4000,
        "{name}: DF, offset 0"
    );
    assert_eq!(b[9], 17, "{name}: UDP");
    let udp = &b[20..];
    let udp_len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    assert_eq!(udp_len, udp.len(), "{name}: UDP length");
    Datagram {
        hdr: Ipv4Udp {
            src: Ipv4Addr::new(b[12], b[13], b[14], b[15]),
            dst: Ipv4Addr::new(b[16], b[17], b[18], b[19]),
            src_port: u16::from_be_bytes([udp[0], udp[1]]),
            dst_port: u16::from_be_bytes([udp[2], udp[3]]),
            id: u16::from_be_bytes([b[4], b[5]]),
        },
        payload: udp[8..].to_vec(),
    }
}

fn hdr(src_port: u16) -> Ipv4Udp {
    Ipv4Udp {
        src: Ipv4Addr::new(192, 168, 1, 10),
        dst: Ipv4Addr::new(192, 168, 1, 20),
        src_port,
        dst_port: 4791,
        id: 0,
    }
}

/// Checks one vector: its headers are the ones the Python asked for, the crate parses it to
/// `want`, its ICRC is the crate's, and emitting `want` gives scapy's bytes.
fn check(name: &str, hex: &str, want_hdr: Ipv4Udp, want: Packet<'_>) {
    let d = split(name, hex);
    assert_eq!(d.hdr, want_hdr, "{name}: addresses and ports");
    let got = Packet::parse(&d.payload, &d.hdr)
        .unwrap_or_else(|e| panic!("{name}: the crate rejects scapy's packet: {e}"));
    assert_eq!(got, want, "{name}: parsed fields");

    let n = d.payload.len();
    assert_eq!(
        icrc(&d.hdr, &d.payload[..n - 4]).to_le_bytes(),
        d.payload[n - 4..],
        "{name}: the crate's ICRC of scapy's packet is scapy's"
    );

    let mut buf = vec![0u8; want.buffer_len()];
    assert_eq!(want.buffer_len(), n, "{name}: buffer_len");
    assert_eq!(want.emit(&d.hdr, &mut buf), n, "{name}: emitted length");
    assert_eq!(buf, d.payload, "{name}: emitted bytes are scapy's");

    // The addresses are in the ICRC: scapy's packet with another source no longer checks.
    let mut other = d.hdr;
    other.src = Ipv4Addr::new(192, 168, 1, 11);
    assert!(
        matches!(
            Packet::parse(&d.payload, &other),
            Err(WireError::Icrc { .. })
        ),
        "{name}: another source address must fail the ICRC"
    );
}

#[test]
fn send_only_with_a_44_byte_payload() {
    let payload: Vec<u8> = (0x40..0x40 + 44).collect();
    let mut bth = Bth::new(Opcode::SendOnly, 0x11, 0x12_3456);
    bth.solicited = true;
    bth.ack_req = true;
    check(
        "SEND_ONLY_44",
        SEND_ONLY_44,
        hdr(0xc011),
        Packet::new(bth, None, None, &payload),
    );
}

#[test]
fn rdma_write_first_with_a_reth() {
    let payload: Vec<u8> = (0..256u32).map(|i| (i * 7) as u8).collect();
    let bth = Bth::new(Opcode::WriteFirst, 0xab_cdef, 0xff_fffe);
    let reth = Reth {
        va: 0x0000_7f12_3456_0000,
        rkey: 0x1a2b_3c4d,
        len: 0x1000,
    };
    check(
        "WRITE_FIRST_RETH",
        WRITE_FIRST_RETH,
        hdr(0xc012),
        Packet::new(bth, Some(reth), None, &payload),
    );
}

#[test]
fn ack_with_an_aeth() {
    let aeth = Aeth {
        syndrome: Syndrome::Ack { credits: 0x1f },
        msn: 0x42,
    };
    check(
        "ACK_AETH",
        ACK_AETH,
        hdr(0xc013),
        Packet::new(Bth::new(Opcode::Ack, 0x12, 0x100), None, Some(aeth), &[]),
    );
}

#[test]
fn nak_invalid_request() {
    let aeth = Aeth {
        syndrome: Syndrome::Nak(NakCode::InvalidRequest),
        msn: 0x42,
    };
    check(
        "NAK_INVALID_REQUEST",
        NAK_INVALID_REQUEST,
        hdr(0xc013),
        Packet::new(Bth::new(Opcode::Ack, 0x12, 0x101), None, Some(aeth), &[]),
    );
}

#[test]
fn send_last_with_three_pad_bytes_and_fecn() {
    let mut bth = Bth::new(Opcode::SendLast, 0x13, 7);
    bth.pad = 3;
    bth.pkey = 0x8001;
    bth.resv8a = 0x80; // FECN
    bth.ack_req = true;
    check(
        "SEND_LAST_PAD3",
        SEND_LAST_PAD3,
        hdr(0xc014),
        Packet::new(bth, None, None, b"hello, world!"),
    );
}

/// rxe's seed for the ICRC, 0xdebb20e3, is CRC-32's state after eight 0xff bytes: the crate's
/// "CRC-32 over eight 0xff bytes, then the rest" is the kernel's seeded `crc32_le`. Checked
/// here with a bitwise CRC written from the polynomial, independent of crc32fast.
#[test]
fn rxe_seed_is_crc32_state_after_the_masked_lrh() {
    let mut c: u32 = 0xffff_ffff;
    for _ in 0..8 {
        c ^= 0xff;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
        }
    }
    assert_eq!(c, 0xdebb_20e3);
}
