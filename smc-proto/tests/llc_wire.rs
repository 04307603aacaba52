//! Every LLC message both ways from bytes written out by hand from the kernel's struct
//! layouts (`net/smc/smc_llc.c`), plus the receive checks.

use smc_proto::llc::{
    ADD_LINK_V2_MAX_RKEYS, AddLink, AddLinkCont, AddLinkContRkey, AddLinkRejectReason, AddLinkV2,
    AddLinkV2Ext, ConfirmLink, ConfirmRkey, ConfirmRkeyCont, DeleteLink, DeleteLinkReason,
    DeleteRkey, DeleteRkeyV2, LlcError, LlcFlags, LlcMessage, LlcPacket, LlcType, RawLlc,
    ReqAddLink, Rtoken, TestLink,
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

/// A v2 header: type, host-order length (`u16 length_v2`), flags.
fn v2_header(ty: u8, len: u16, flags: u8) -> Vec<u8> {
    let mut b = vec![ty];
    b.extend_from_slice(&len.to_ne_bytes());
    b.push(flags);
    b
}

#[test]
fn v2_same_body_types() {
    // CONFIRM_LINK v2 as a v2.1 kernel sends it: 0x21, length 44, max_links and max_conns.
    let mut b = v2_header(0x21, 44, 0x03);
    b.extend_from_slice(&MAC);
    b.extend_from_slice(&GID);
    b.extend_from_slice(&[0x00, 0x01, 0x09, 0x01, 0x11, 0x22, 0x33, 0x45, 0x02, 0xff]);
    b.resize(44, 0);
    #[cfg(target_endian = "little")]
    assert_eq!(b[..4], [0x21, 0x2c, 0x00, 0x03]);
    let c = ConfirmLink {
        flags: LlcFlags::NO_RMBE_EYECATCHER,
        mac: MAC,
        gid: GID,
        qpn: 0x109,
        link_num: 1,
        link_uid: 0x1122_3345,
        max_links: 2,
        max_conns: 255,
    };
    both_ways(&b, LlcMessage::ConfirmLinkV2(c));
    assert_eq!(
        LlcMessage::ConfirmLink(c).into_v2(),
        LlcMessage::ConfirmLinkV2(c)
    );
    assert_eq!(
        LlcMessage::ConfirmLinkV2(c).into_v1(),
        LlcMessage::ConfirmLink(c)
    );

    // DELETE_LINK v2: link 2, LOST_PATH, orderly.
    let mut b = v2_header(0x24, 44, 0x20);
    b.extend_from_slice(&[0x02, 0x00, 0x01, 0x00, 0x00]);
    b.resize(44, 0);
    both_ways(
        &b,
        LlcMessage::DeleteLinkV2(DeleteLink {
            flags: LlcFlags::DELETE_LINK_ORDERLY,
            link_num: 2,
            reason: DeleteLinkReason::LostPath,
        }),
    );

    // CONFIRM_RKEY v2: num_others 1, own rkey/vaddr, one other rtoken.
    let mut b = v2_header(0x26, 44, 0x00);
    b.push(1);
    b.extend_from_slice(&0x1234_5678u32.to_be_bytes());
    b.extend_from_slice(&0x1000u64.to_be_bytes());
    b.push(2);
    b.extend_from_slice(&0x9abc_def0u32.to_be_bytes());
    b.extend_from_slice(&0x2000u64.to_be_bytes());
    b.resize(44, 0);
    both_ways(
        &b,
        LlcMessage::ConfirmRkeyV2(ConfirmRkey {
            flags: LlcFlags::EMPTY,
            num_others: 1,
            rkey: 0x1234_5678,
            vaddr: 0x1000,
            others: [
                Rtoken {
                    link_id: 2,
                    rkey: 0x9abc_def0,
                    vaddr: 0x2000,
                },
                Rtoken::default(),
            ],
        }),
    );

    // TEST_LINK v2 response with user data.
    let mut b = v2_header(0x27, 44, 0x80);
    b.extend_from_slice(&[7; 16]);
    b.resize(44, 0);
    both_ways(
        &b,
        LlcMessage::TestLinkV2(TestLink {
            flags: LlcFlags::RESPONSE,
            user_data: [7; 16],
        }),
    );
}

const GID_NEW: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 9];

/// An ADD_LINK v2 request as `smc_llc_send_add_link` builds it in a v2 group with two
/// connections: the base message, then the extension with v2_direct, the new link's GID,
/// num_rkeys 2 (host order) and two rkey entries.
fn add_link_v2_bytes() -> Vec<u8> {
    let mut b = v2_header(0x22, 72 + 32, 0x00);
    b.extend_from_slice(&MAC); // sender_mac
    b.extend_from_slice(&[0, 0]); // reserved2
    b.extend_from_slice(&GID_NEW); // sender_gid
    b.extend_from_slice(&[0x00, 0x02, 0x0a, 0x02, 0x05, 0xab, 0xcd, 0xef]); // qpn, link, mtu, psn
    b.resize(44, 0); // reserved[8]
    b.push(0x80); // v2_direct
    b.push(0); // reserved2
    b.extend_from_slice(&GID_NEW); // client_target_gid
    b.extend_from_slice(&[0; 8]); // reserved3
    b.extend_from_slice(&2u16.to_ne_bytes()); // num_rkeys
    for (k, kn, va) in [(0x11u32, 0x21u32, 0x1000u64), (0x12, 0x22, 0x2000)] {
        b.extend_from_slice(&k.to_be_bytes());
        b.extend_from_slice(&kn.to_be_bytes());
        b.extend_from_slice(&va.to_be_bytes());
    }
    assert_eq!(b.len(), 104);
    b
}

fn add_link_v2_msg() -> AddLinkV2 {
    AddLinkV2 {
        link: AddLink {
            flags: LlcFlags::EMPTY,
            reject_reason: AddLinkRejectReason::NoReason,
            mac: MAC,
            gid: GID_NEW,
            qpn: 0x20a,
            link_num: 2,
            qp_mtu: 5,
            initial_psn: 0xabcdef,
        },
        ext: Some(AddLinkV2Ext {
            v2_direct: true,
            client_target_gid: GID_NEW,
            rkeys: vec![
                AddLinkContRkey {
                    rkey: 0x11,
                    rkey_new: 0x21,
                    vaddr_new: 0x1000,
                },
                AddLinkContRkey {
                    rkey: 0x12,
                    rkey_new: 0x22,
                    vaddr_new: 0x2000,
                },
            ],
        }),
    }
}

#[test]
fn add_link_v2_with_extension() {
    let b = add_link_v2_bytes();
    both_ways(&b, LlcMessage::AddLinkV2(add_link_v2_msg()));
    // Bytes of the receive buffer after the message are not part of it.
    let mut buf = b.clone();
    buf.extend_from_slice(&[0xcd; 20]);
    assert_eq!(
        LlcMessage::parse(&buf),
        Ok(LlcMessage::AddLinkV2(add_link_v2_msg()))
    );
    // No connections: the extension with num_rkeys 0, 72 bytes.
    let mut empty = add_link_v2_msg();
    empty.ext.as_mut().unwrap().rkeys.clear();
    let wire = LlcMessage::AddLinkV2(empty.clone()).to_bytes();
    assert_eq!(wire.len(), 72);
    assert_eq!(wire[70..72], 0u16.to_ne_bytes());
    assert_eq!(LlcMessage::parse(&wire), Ok(LlcMessage::AddLinkV2(empty)));
}

#[test]
fn add_link_v2_reject_is_44_bytes() {
    // The client's reject: the request's base sent back with 0xc0 and length 44. The reject
    // reason nibble is lost under the v2 length, as in the kernel.
    let mut b = add_link_v2_bytes();
    b.truncate(44);
    b[1..3].copy_from_slice(&44u16.to_ne_bytes());
    b[3] = 0xc0;
    let mut base = add_link_v2_msg().link;
    base.flags = LlcFlags::RESPONSE | LlcFlags::ADD_LINK_REJECT;
    let m = AddLinkV2 {
        link: base,
        ext: None,
    };
    both_ways(&b, LlcMessage::AddLinkV2(m.clone()));
    // A reject reason given to emit is not written (byte 2 is the length's).
    let mut with_reason = m.clone();
    with_reason.link.reject_reason = AddLinkRejectReason::NoAlternatePath;
    assert_eq!(LlcMessage::AddLinkV2(with_reason).to_bytes(), b);
    assert_eq!(
        LlcMessage::AddLink(base).into_v2(),
        LlcMessage::AddLinkV2(AddLinkV2 {
            link: base,
            ext: None
        })
    );
}

#[test]
fn add_link_v2_malformed() {
    let b = add_link_v2_bytes();
    // A length between 44 and 72 cuts the extension.
    let mut short = b.clone();
    short.truncate(60);
    short[1..3].copy_from_slice(&60u16.to_ne_bytes());
    assert_eq!(
        LlcMessage::parse(&short),
        Err(LlcError::ExtensionTruncated { length: 60 })
    );
    // num_rkeys beyond the length.
    let mut many = b.clone();
    many[70..72].copy_from_slice(&3u16.to_ne_bytes());
    assert_eq!(
        LlcMessage::parse(&many),
        Err(LlcError::RkeyCountTooLarge {
            count: 3,
            length: 104
        })
    );
    // A length beyond the buffer.
    assert_eq!(
        LlcMessage::parse(&b[..100]),
        Err(LlcError::Truncated {
            need: 104,
            have: 100
        })
    );
    // A length above the kernel's v2 buffer.
    let mut huge = b.clone();
    huge[1..3].copy_from_slice(&8193u16.to_ne_bytes());
    huge.resize(8193, 0);
    assert_eq!(
        LlcMessage::parse(&huge),
        Err(LlcError::V2LengthTooLong { found: 8193 })
    );
}

#[test]
fn add_link_v2_largest() {
    let mut m = add_link_v2_msg();
    let rt = AddLinkContRkey {
        rkey: 1,
        rkey_new: 2,
        vaddr_new: 3,
    };
    m.ext.as_mut().unwrap().rkeys = vec![rt; ADD_LINK_V2_MAX_RKEYS];
    let wire = LlcMessage::AddLinkV2(m.clone()).to_bytes();
    assert!(wire.len() <= 8192);
    assert!(wire.len() + 16 > 8192);
    assert_eq!(LlcMessage::parse(&wire), Ok(LlcMessage::AddLinkV2(m)));
}

#[test]
fn delete_rkey_v2() {
    // The kernel's request: one rkey in a 44-byte message.
    let mut b = v2_header(0x29, 44, 0x00);
    b.extend_from_slice(&[1, 0, 0, 0]);
    b.extend_from_slice(&0xdead_beefu32.to_be_bytes());
    b.resize(44, 0);
    let req = DeleteRkeyV2 {
        flags: LlcFlags::EMPTY,
        num_inval_rkeys: 0,
        rkeys: vec![0xdead_beef],
    };
    both_ways(&b, LlcMessage::DeleteRkeyV2(req.clone()));
    // Its negative response: count kept, rkeys zeroed, one invalid.
    let mut r = v2_header(0x29, 44, 0xa0);
    r.extend_from_slice(&[1, 1, 0, 0]);
    r.resize(44, 0);
    both_ways(
        &r,
        LlcMessage::DeleteRkeyV2(DeleteRkeyV2 {
            flags: LlcFlags::RESPONSE | LlcFlags::RKEY_NEGATIVE,
            num_inval_rkeys: 1,
            rkeys: vec![0],
        }),
    );
    // 20 rkeys: 8 + 80 = 88 bytes.
    let many = DeleteRkeyV2 {
        flags: LlcFlags::EMPTY,
        num_inval_rkeys: 0,
        rkeys: (1..=20).collect(),
    };
    let wire = LlcMessage::DeleteRkeyV2(many.clone()).to_bytes();
    assert_eq!(wire.len(), 88);
    assert_eq!(u16::from_ne_bytes([wire[1], wire[2]]), 88);
    assert_eq!(wire[4], 20);
    assert_eq!(wire[84..88], 20u32.to_be_bytes());
    assert_eq!(LlcMessage::parse(&wire), Ok(LlcMessage::DeleteRkeyV2(many)));
    // A count beyond the length.
    let mut bad = b.clone();
    bad[4] = 10; // 8 + 40 = 48 > 44
    assert_eq!(
        LlcMessage::parse(&bad),
        Err(LlcError::RkeyCountTooLarge {
            count: 10,
            length: 44
        })
    );
    // v1 <-> v2
    let v1 = LlcMessage::DeleteRkeyV2(req.clone()).into_v1();
    let LlcMessage::DeleteRkey(d) = &v1 else {
        panic!("{v1:?}")
    };
    assert_eq!((d.num_rkeys, d.rkeys[0]), (1, 0xdead_beef));
    assert_eq!(v1.into_v2(), LlcMessage::DeleteRkeyV2(req));
}

#[test]
fn raw_types_are_kept_byte_for_byte() {
    // v1-header 0x05, unknown types, and a v2 header of a type Linux does not define.
    for t in [0x05u8, 0x0a, 0x80] {
        let mut b = vec![t, 44, 0, 0x80];
        b.resize(44, 0x11);
        let m = LlcMessage::parse(&b).unwrap();
        assert_eq!(m.llc_type(), LlcType::from_code(t));
        assert_eq!(m, LlcMessage::Raw(RawLlc::new(&b).unwrap()));
        assert_eq!(m.to_bytes(), b);
    }
    let mut v2 = v2_header(0x23, 100, 0);
    v2.resize(100, 0xab);
    let mut buf = v2.clone();
    buf.extend_from_slice(&[0xcd; 20]); // receive buffer tail
    let m = LlcMessage::parse(&buf).unwrap();
    assert_eq!(m.llc_type(), LlcType::Unknown(0x23));
    assert_eq!(m.to_bytes(), v2);
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
