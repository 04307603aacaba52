//! Every LLC message both ways from bytes written out by hand from the kernel's struct
//! layouts (`net/smc/smc_llc.c`), plus the receive checks.

use smc_proto::llc::{
    AddLink, AddLinkCont, AddLinkContRkey, AddLinkRejectReason, ConfirmLink, ConfirmRkey,
    ConfirmRkeyCont, DeleteLink, DeleteLinkReason, DeleteRkey, LlcError, LlcFlags, LlcMessage,
    LlcPacket, LlcType, RawLlc, ReqAddLink, Rtoken, TestLink,
};

fn both_ways(bytes: &[u8], msg: LlcMessage) {
    assert_eq!(LlcMessage::parse(bytes), Ok(msg.clone()), "parse");
    assert_eq!(msg.to_bytes(), bytes, "emit");
    assert_eq!(msg.buffer_len(), bytes.len());
}

const MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x02];
const GID: [u8; 16] = [
    0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xfe, 0, 0, 0x02,
];

#[test]
#[rustfmt::skip]
fn confirm_link() {
    let bytes = [
        0x01, 0x2c, 0x00, 0x83,                         // type, len, rsvd, flags resp|no_rmbe_eyec
        0x02, 0x00, 0x00, 0x00, 0x00, 0x02,             // sender_mac
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xfe, 0, 0, 0x02, // sender_gid
        0x00, 0x01, 0x09,                               // sender_qp_num
        0x01,                                           // link_num
        0x11, 0x22, 0x33, 0x45,                         // link_uid
        0x02,                                           // max_links
        0x10,                                           // max_conns
        0, 0, 0, 0, 0, 0, 0, 0,                         // reserved[8]
    ];
    both_ways(&bytes, LlcMessage::ConfirmLink(ConfirmLink {
        flags: LlcFlags::RESPONSE | LlcFlags::NO_RMBE_EYECATCHER,
        mac: MAC,
        gid: GID,
        qpn: 0x109,
        link_num: 1,
        link_uid: 0x1122_3345,
        max_links: 2,
        max_conns: 16,
    }));
}

fn add_link_bytes() -> [u8; 44] {
    #[rustfmt::skip]
    let b = [
        0x02, 0x2c, 0x01, 0xc0,                         // type, len, reject reason 1, resp|reject
        0x02, 0x00, 0x00, 0x00, 0x00, 0x02,             // sender_mac
        0x00, 0x00,                                     // reserved2
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xfe, 0, 0, 0x02, // sender_gid
        0x00, 0x02, 0x0a,                               // sender_qp_num
        0x02,                                           // link_num
        0x05,                                           // qp_mtu (low nibble)
        0xab, 0xcd, 0xef,                               // initial_psn
        0, 0, 0, 0, 0, 0, 0, 0,                         // reserved[8]
    ];
    b
}

fn add_link_msg() -> LlcMessage {
    LlcMessage::AddLink(AddLink {
        flags: LlcFlags::RESPONSE | LlcFlags::ADD_LINK_REJECT,
        reject_reason: AddLinkRejectReason::NoAlternatePath,
        mac: MAC,
        gid: GID,
        qpn: 0x20a,
        link_num: 2,
        qp_mtu: 5,
        initial_psn: 0xab_cdef,
    })
}

#[test]
fn add_link() {
    both_ways(&add_link_bytes(), add_link_msg());
}

#[test]
fn add_link_reserved_nibbles_are_ignored() {
    let mut b = add_link_bytes();
    b[2] |= 0xf0; // reserved high nibble of the reject-reason byte
    b[32] |= 0xf0; // reserved high nibble of the MTU byte
    b[10] = 0x77; // reserved2
    assert_eq!(LlcMessage::parse(&b), Ok(add_link_msg()));
}

#[test]
#[rustfmt::skip]
fn add_link_cont() {
    let bytes = [
        0x03, 0x2c, 0x00, 0x80,                         // type, len, rsvd, flags resp
        0x02,                                           // link_num
        0x03,                                           // num_rkeys
        0x00, 0x00,                                     // reserved2
        0x00, 0x00, 0x10, 0x01,                         // rt[0].rmb_key
        0x00, 0x00, 0x20, 0x01,                         // rt[0].rmb_key_new
        0x00, 0x00, 0x7f, 0x00, 0x10, 0x00, 0x00, 0x00, // rt[0].rmb_vaddr_new
        0x00, 0x00, 0x10, 0x02,                         // rt[1].rmb_key
        0x00, 0x00, 0x20, 0x02,                         // rt[1].rmb_key_new
        0x00, 0x00, 0x7f, 0x00, 0x20, 0x00, 0x00, 0x00, // rt[1].rmb_vaddr_new
        0, 0, 0, 0,                                     // reserved[4]
    ];
    both_ways(&bytes, LlcMessage::AddLinkCont(AddLinkCont {
        flags: LlcFlags::RESPONSE,
        link_num: 2,
        num_rkeys: 3,
        rkeys: [
            AddLinkContRkey { rkey: 0x1001, rkey_new: 0x2001, vaddr_new: 0x7f00_1000_0000 },
            AddLinkContRkey { rkey: 0x1002, rkey_new: 0x2002, vaddr_new: 0x7f00_2000_0000 },
        ],
    }));
}

#[test]
fn delete_link() {
    let mut bytes = vec![
        0x04, 0x2c, 0x00, 0x60, // type, len, rsvd, flags all|orderly
        0x00, // link_num
        0x00, 0x03, 0x00, 0x00, // reason (BE, unaligned): program initiated
    ];
    bytes.resize(44, 0); // reserved[35]
    both_ways(
        &bytes,
        LlcMessage::DeleteLink(DeleteLink {
            flags: LlcFlags::DELETE_LINK_ALL | LlcFlags::DELETE_LINK_ORDERLY,
            link_num: 0,
            reason: DeleteLinkReason::ProgramInitiated,
        }),
    );
    bytes[5..9].copy_from_slice(&0x0007_0000u32.to_be_bytes());
    match LlcMessage::parse(&bytes) {
        Ok(LlcMessage::DeleteLink(d)) => {
            assert_eq!(d.reason, DeleteLinkReason::Unknown(0x0007_0000))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
#[rustfmt::skip]
fn confirm_rkey() {
    let bytes = [
        0x06, 0x2c, 0x00, 0xb0,                         // type, len, rsvd, resp|negative|retry
        0x02,                                           // rtoken[0].num_rkeys
        0x00, 0x00, 0x30, 0x03,                         // rtoken[0].rmb_key
        0x00, 0x00, 0x7f, 0x00, 0x30, 0x00, 0x00, 0x00, // rtoken[0].rmb_vaddr
        0x02,                                           // rtoken[1].link_id
        0x00, 0x00, 0x40, 0x04,                         // rtoken[1].rmb_key
        0x00, 0x00, 0x7f, 0x00, 0x40, 0x00, 0x00, 0x00, // rtoken[1].rmb_vaddr
        0x03,                                           // rtoken[2].link_id
        0x00, 0x00, 0x50, 0x05,                         // rtoken[2].rmb_key
        0x00, 0x00, 0x7f, 0x00, 0x50, 0x00, 0x00, 0x00, // rtoken[2].rmb_vaddr
        0x00,                                           // reserved
    ];
    both_ways(&bytes, LlcMessage::ConfirmRkey(ConfirmRkey {
        flags: LlcFlags::RESPONSE | LlcFlags::RKEY_NEGATIVE | LlcFlags::RKEY_RETRY,
        num_others: 2,
        rkey: 0x3003,
        vaddr: 0x7f00_3000_0000,
        others: [
            Rtoken { link_id: 2, rkey: 0x4004, vaddr: 0x7f00_4000_0000 },
            Rtoken { link_id: 3, rkey: 0x5005, vaddr: 0x7f00_5000_0000 },
        ],
    }));
}

#[test]
fn test_link() {
    let mut bytes = vec![0x07, 0x2c, 0x00, 0x00];
    bytes.extend_from_slice(b"0123456789abcdef"); // user_data[16]
    bytes.resize(44, 0); // reserved[24]
    both_ways(
        &bytes,
        LlcMessage::TestLink(TestLink {
            flags: LlcFlags::EMPTY,
            user_data: *b"0123456789abcdef",
        }),
    );
}

#[test]
#[rustfmt::skip]
fn confirm_rkey_cont() {
    let bytes = [
        0x08, 0x2c, 0x00, 0x80,                         // type, len, rsvd, flags resp
        0x03,                                           // num_rkeys
        0x01, 0x00, 0x00, 0x50, 0x05,                   // rtoken[0] link_id, rmb_key
        0x00, 0x00, 0x7f, 0x00, 0x50, 0x00, 0x00, 0x00, //   rmb_vaddr
        0x02, 0x00, 0x00, 0x60, 0x06,                   // rtoken[1]
        0x00, 0x00, 0x7f, 0x00, 0x60, 0x00, 0x00, 0x00,
        0x03, 0x00, 0x00, 0x70, 0x07,                   // rtoken[2]
        0x00, 0x00, 0x7f, 0x00, 0x70, 0x00, 0x00, 0x00,
    ];
    both_ways(&bytes, LlcMessage::ConfirmRkeyCont(ConfirmRkeyCont {
        flags: LlcFlags::RESPONSE,
        num_rkeys: 3,
        rtokens: [
            Rtoken { link_id: 1, rkey: 0x5005, vaddr: 0x7f00_5000_0000 },
            Rtoken { link_id: 2, rkey: 0x6006, vaddr: 0x7f00_6000_0000 },
            Rtoken { link_id: 3, rkey: 0x7007, vaddr: 0x7f00_7000_0000 },
        ],
    }));
}

#[test]
#[rustfmt::skip]
fn delete_rkey() {
    let bytes = [
        0x09, 0x2c, 0x00, 0xa0,                         // type, len, rsvd, resp|negative
        0x08,                                           // num_rkeys
        0x41,                                           // err_mask: rkey[1] and rkey[7] failed
        0x00, 0x00,                                     // reserved[2]
        0, 0, 0, 1,  0, 0, 0, 2,  0, 0, 0, 3,  0, 0, 0, 4, // rkey[0..4]
        0, 0, 0, 5,  0, 0, 0, 6,  0, 0, 0, 7,  0, 0, 0, 8, // rkey[4..8]
        0, 0, 0, 0,                                     // reserved2[4]
    ];
    both_ways(&bytes, LlcMessage::DeleteRkey(DeleteRkey {
        flags: LlcFlags::RESPONSE | LlcFlags::RKEY_NEGATIVE,
        num_rkeys: 8,
        err_mask: 0x41,
        rkeys: [1, 2, 3, 4, 5, 6, 7, 8],
    }));
}

const GID_A: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2];
const GID_B: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 1, 2];

fn req_add_link_bytes() -> Vec<u8> {
    let mut b = vec![0x25]; // llc_version 2, llc_type 5
    b.extend_from_slice(&60u16.to_ne_bytes()); // length_v2, host order
    b.push(0x00); // flags
    b.extend_from_slice(&[0; 20]); // reserved[20]
    b.push(2); // gid_cnt
    b.extend_from_slice(&[0; 3]); // reserved2[3]
    b.extend_from_slice(&GID_A);
    b.extend_from_slice(&GID_B);
    b
}

#[test]
fn req_add_link() {
    let b = req_add_link_bytes();
    #[cfg(target_endian = "little")]
    assert_eq!(b[..4], [0x25, 0x3c, 0x00, 0x00]);
    both_ways(
        &b,
        LlcMessage::ReqAddLink(ReqAddLink {
            flags: LlcFlags::EMPTY,
            gids: vec![GID_A, GID_B],
        }),
    );
}

#[test]
fn req_add_link_response() {
    // The server's answer: response flag, header length 44, zeroed body.
    let mut b = vec![0x25];
    b.extend_from_slice(&44u16.to_ne_bytes());
    b.push(0x80);
    b.resize(44, 0);
    both_ways(
        &b,
        LlcMessage::ReqAddLink(ReqAddLink {
            flags: LlcFlags::RESPONSE,
            gids: vec![],
        }),
    );
}

#[test]
fn req_add_link_gid_count_must_fit() {
    let mut b = req_add_link_bytes();
    b[24] = 3; // 28 + 48 = 76 > 60
    assert_eq!(
        LlcMessage::parse(&b),
        Err(LlcError::GidCountTooLarge {
            count: 3,
            length: 60
        })
    );
}

#[test]
fn raw_types_are_kept_byte_for_byte() {
    // A v2 CONFIRM_LINK (0x21): recognised, kept raw.
    let mut v2 = vec![0x21];
    v2.extend_from_slice(&44u16.to_ne_bytes());
    v2.push(0x83);
    v2.extend((0u8..40).map(|i| i.wrapping_mul(7)));
    let m = LlcMessage::parse(&v2).unwrap();
    assert_eq!(m.llc_type(), LlcType::ConfirmLinkV2);
    assert!(m.is_response());
    assert_eq!(m.to_bytes(), v2);
    // A longer v2 message keeps all of its bytes, and only those.
    let mut long = vec![0x22];
    long.extend_from_slice(&100u16.to_ne_bytes());
    long.push(0);
    long.resize(100, 0xab);
    let mut buf = long.clone();
    buf.extend_from_slice(&[0xcd; 20]); // receive buffer tail
    let m = LlcMessage::parse(&buf).unwrap();
    assert_eq!(m.llc_type(), LlcType::AddLinkV2);
    assert_eq!(m.to_bytes(), long);
    // v1-header 0x05 and an unknown type.
    for t in [0x05u8, 0x0a, 0x80] {
        let mut b = vec![t, 44, 0, 0x80];
        b.resize(44, 0x11);
        let m = LlcMessage::parse(&b).unwrap();
        assert_eq!(m.llc_type(), LlcType::from_code(t));
        assert_eq!(m, LlcMessage::Raw(RawLlc::new(&b).unwrap()));
        assert_eq!(m.to_bytes(), b);
    }
}

#[test]
fn receive_checks() {
    let good = add_link_bytes();
    assert_eq!(
        LlcMessage::parse(&good[..43]),
        Err(LlcError::Truncated { need: 44, have: 43 })
    );
    let mut b = good;
    b[1] = 45;
    assert_eq!(
        LlcMessage::parse(&b),
        Err(LlcError::BadLength { found: 45 })
    );
    // v1 messages ignore the bytes after 44
    let mut long = good.to_vec();
    long.extend_from_slice(&[0xee; 8]);
    assert_eq!(LlcMessage::parse(&long), Ok(add_link_msg()));

    let mut v2 = vec![0x27];
    v2.extend_from_slice(&43u16.to_ne_bytes());
    v2.resize(44, 0);
    assert_eq!(
        LlcMessage::parse(&v2),
        Err(LlcError::V2LengthTooShort { found: 43 })
    );
    v2[1..3].copy_from_slice(&60u16.to_ne_bytes());
    assert_eq!(
        LlcMessage::parse(&v2),
        Err(LlcError::Truncated { need: 60, have: 44 })
    );

    let mut cdc = vec![0xfe, 44];
    cdc.resize(44, 0);
    assert_eq!(LlcMessage::parse(&cdc), Err(LlcError::CdcMessage));
}

#[test]
fn packet_view() {
    let b = add_link_bytes();
    let p = LlcPacket::new_checked(&b[..]).unwrap();
    assert!(p.is_v1());
    assert_eq!(p.llc_type(), LlcType::AddLink);
    assert_eq!(p.length(), 44);
    assert_eq!(p.v1_byte2() & 0x0f, 1);
    assert!(p.flags().add_link_reject());
    assert_eq!(p.message_len(), 44);
    let r = req_add_link_bytes();
    let p = LlcPacket::new_checked(&r[..]).unwrap();
    assert!(!p.is_v1());
    assert_eq!(p.length_v2(), 60);
}
