#![no_main]
//! Fuzz target for the RoCEv2 decoder (`smc_rdma::wire::Packet::parse`).
//!
//! Input: byte 0 is a mode, bytes 1..13 the addresses and ports the datagram arrived with,
//! the rest the UDP payload. With mode bit 0 set the target first writes the right ICRC into
//! the payload's last four bytes (with the crate's `icrc`), so that the fuzzer reaches the
//! header parsing behind the ICRC check without having to forge a CRC-32.
//!
//! Oracle: `parse` never panics; a packet that parses has the input's length as its
//! `buffer_len`, its payload where its opcode's headers end, and re-emits to bytes that parse
//! to the same packet; and when the input's reserved bits (BTH byte 8 below AckReq) and pad
//! bytes are zero, as a sender writes them, the re-emitted bytes are the input. (A receiver
//! ignores those bits, as IBTA says and rxe does: the crate does not keep them, so an input
//! with them set re-emits with them cleared and another ICRC.)
//!
//! Mode bit 1 stamps the ICRC for an identification made of bytes 1..3 of the addresses
//! instead of 0; `solve_ip_id` (what a receiver does when the expected identification fails)
//! must never panic on any input, and must find that identification for a stamped one.
use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use smc_rdma::wire::{ICRC_LEN, IdSolver, Ipv4Udp, Packet, icrc, solve_ip_id};

fuzz_target!(|data: &[u8]| {
    if data.len() < 13 {
        return;
    }
    let mode = data[0];
    let a = &data[1..13];
    let hdr = Ipv4Udp {
        src: Ipv4Addr::new(a[0], a[1], a[2], a[3]),
        dst: Ipv4Addr::new(a[4], a[5], a[6], a[7]),
        src_port: u16::from_be_bytes([a[8], a[9]]),
        dst_port: u16::from_be_bytes([a[10], a[11]]),
        id: 0,
    };
    let mut input = data[13..].to_vec();
    let stamp = Ipv4Udp {
        id: if mode & 2 != 0 {
            u16::from_be_bytes([a[1], a[2]])
        } else {
            0
        },
        ..hdr
    };
    if mode & 1 != 0 && input.len() >= ICRC_LEN {
        let body = input.len() - ICRC_LEN;
        let crc = icrc(&stamp, &input[..body]);
        input[body..].copy_from_slice(&crc.to_le_bytes());
    }
    let solved = solve_ip_id(&hdr, &input, &mut IdSolver::default());
    if mode & 1 != 0 && input.len() >= ICRC_LEN && input.len() <= 65_507 {
        assert_eq!(solved, Some(stamp.id));
    }
    let hdr = stamp;

    let Ok(p) = Packet::parse(&input, &hdr) else {
        return;
    };
    assert_eq!(p.buffer_len(), input.len());
    let pad = usize::from(p.bth.pad);
    let payload_at = input.len() - ICRC_LEN - pad - p.payload.len();
    assert_eq!(p.payload, &input[payload_at..input.len() - ICRC_LEN - pad]);

    let mut out = vec![0u8; p.buffer_len()];
    assert_eq!(p.emit(&hdr, &mut out), input.len());
    assert_eq!(Packet::parse(&out, &hdr), Ok(p));
    let body = input.len() - ICRC_LEN;
    let canonical = input[8] & 0x7f == 0 && input[body - pad..body].iter().all(|&b| b == 0);
    if canonical {
        assert_eq!(out, input);
    }
});
