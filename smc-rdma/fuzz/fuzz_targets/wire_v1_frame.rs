#![no_main]
//! Fuzz target for the RoCE v1 decoder (`smc_rdma::wire::v1::Frame::parse`).
//!
//! Input: byte 0 is a mode, the rest an Ethernet frame. With mode bit 0 set the target first
//! makes the frame look like RoCE v1 (Ethertype 0x8915, GRH version 6, next header BTH, the
//! GRH's payload length the bytes after it) and writes the right ICRC into its last four bytes
//! (with the crate's `wire::v1::icrc`), so that the fuzzer reaches the transport parsing behind
//! the ICRC check without having to forge a CRC-32.
//!
//! Oracle: `parse` never panics; a frame that parses has its transport where the GRH ends, a
//! `buffer_len` no longer than the input (the rest is Ethernet padding), and re-emits to bytes
//! that parse to the same frame. `mac_of_gid` of its GIDs never panics either, and a MAC it
//! finds maps back to the GID.
use libfuzzer_sys::fuzz_target;
use smc_rdma::wire::v1::{Frame, GRH_LEN, HEADERS_LEN, gid_of_mac, icrc, mac_of_gid};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, frame)) = data.split_first() else {
        return;
    };
    let mut input = frame.to_vec();
    if mode & 1 != 0 && input.len() >= HEADERS_LEN + 4 {
        input[12] = 0x89;
        input[13] = 0x15;
        input[14] = 0x60 | (input[14] & 0x0f);
        input[20] = 0x1b;
        let plen = (input.len() - HEADERS_LEN).min(usize::from(u16::MAX));
        input[18..20].copy_from_slice(&(plen as u16).to_be_bytes());
        let end = HEADERS_LEN + plen;
        let grh: [u8; GRH_LEN] = input[14..HEADERS_LEN].try_into().unwrap();
        let crc = icrc(&grh, &input[HEADERS_LEN..end - 4]);
        input[end - 4..end].copy_from_slice(&crc.to_le_bytes());
    }
    let Ok(f) = Frame::parse(&input) else {
        return;
    };
    assert!(f.buffer_len() <= input.len());
    let mut out = vec![0u8; f.buffer_len()];
    assert_eq!(f.emit(&mut out), f.buffer_len());
    assert_eq!(Frame::parse(&out), Ok(f));
    for g in [f.grh.sgid, f.grh.dgid] {
        if let Some(mac) = mac_of_gid(&g) {
            assert_eq!(gid_of_mac(mac), g);
        }
    }
});
