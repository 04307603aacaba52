//! CLC messages written out by hand from the layouts in `net/smc/smc_clc.h` (see
//! docs/clc.md): every vector is parsed into the expected value, and that value is emitted
//! back into the same bytes.

use std::net::{Ipv4Addr, Ipv6Addr};

use smc_proto::clc::*;

/// "SMC-LO-EID" blank-padded to 32 bytes.
const EID_BYTES: [u8; 32] = *b"SMC-LO-EID                      ";
/// "myhost" blank-padded to 32 bytes.
const HOST_BYTES: [u8; 32] = *b"myhost                          ";
/// A system EID as an s390 would send it.
const SEID_BYTES: [u8; 32] = *b"IBM-SYSZ-ISMSEID00000000DEADBEEF";

fn eid() -> Eid {
    Eid::new("SMC-LO-EID").unwrap()
}

/// Parse, compare, emit, compare, and check stream framing agrees.
fn both_ways(bytes: &[u8], expected: &ClcMessage) {
    assert_eq!(peek_message_len(&bytes[..8]).unwrap(), bytes.len());
    let parsed = ClcMessage::parse(bytes).unwrap();
    assert_eq!(&parsed, expected);
    expected.validate().unwrap();
    assert_eq!(expected.buffer_len(), bytes.len());
    assert_eq!(expected.to_vec(), bytes);
}

// ---------------------------------------------------------------------------------------
// Proposals
// ---------------------------------------------------------------------------------------

/// What Linux on a machine with only loopback-ism sends: version 2, typev1 N (no IP area),
/// typev2 D, one user EID, SEID off, two GID/CHID entries for the 128-bit loopback GID.
#[rustfmt::skip]
const PROPOSAL_SMCD_V2_LOOPBACK: [u8; 224] = {
    let mut b = [0u8; 224];
    // 0: header: SMCR, type 1, length 224, version 2 | typev2 D(1) | typev1 N(2)
    let h = [0xE2, 0xD4, 0xC3, 0xD9, 0x01, 0x00, 0xE0, 0x26];
    let mut i = 0; while i < 8 { b[i] = h[i]; i += 1; }
    // 8 peer id, 16 IB GID, 32 MAC, 38 iparea_offset: all zero (no v1 offer)
    // 40: SMC-D area: gid 0, chid 0, 50: v2_ext_offset = 28 (0x1c)
    b[51] = 0x1C;
    // 80: v2 extension: eid_cnt 1, ism_gid_cnt 2, rsvd, release 1 | seid 0
    b[80] = 0x01; b[81] = 0x02; b[83] = 0x10;
    // 86: smcd_v2_ext_offset = 32 + 32*1 = 64
    b[87] = 0x40;
    // 88 RoCEv2 GID 0, 104 max_conns 0, 105 max_links 0, 106 feature_mask 0x0001
    b[107] = 0x01;
    // 120: user EID
    let mut i = 0; while i < 32 { b[120 + i] = EID_BYTES[i]; i += 1; }
    // 152: SMC-Dv2 extension: system EID 0 (32), reserved (16)
    // 200: entry 0: gid 0x1122334455667788, chid 0xffff
    let e0 = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xFF, 0xFF];
    // 210: entry 1: gid_ext 0x99aabbccddeeff00, chid 0xffff (same CHID: emulated pair)
    let e1 = [0x99, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF, 0x00, 0xFF, 0xFF];
    let mut i = 0; while i < 10 { b[200 + i] = e0[i]; b[210 + i] = e1[i]; i += 1; }
    // 220: trailer
    let t = [0xE2, 0xD4, 0xC3, 0xD9];
    let mut i = 0; while i < 4 { b[220 + i] = t[i]; i += 1; }
    b
};

fn proposal_smcd_v2_loopback() -> Proposal {
    Proposal {
        version: 2,
        typev1: SmcType::None,
        typev2: SmcType::D,
        peer_id: [0; 8],
        ib_gid: [0; 16],
        ib_mac: [0; 6],
        smcd: Some(ProposalSmcd::default()),
        ip_prefix: None,
        v2: Some(ProposalV2Ext {
            release: 1,
            seid: false,
            roce_gid: [0; 16],
            max_conns: 0,
            max_links: 0,
            feature_mask: 1,
            user_eids: vec![eid()],
            smcd: Some(SmcdV2Ext {
                system_eid: Eid::ZERO,
                entries: vec![
                    GidChid {
                        gid: 0x1122_3344_5566_7788,
                        chid: 0xFFFF,
                    },
                    GidChid {
                        gid: 0x99AA_BBCC_DDEE_FF00,
                        chid: 0xFFFF,
                    },
                ],
            }),
        }),
    }
}

#[test]
fn proposal_smcd_v2_loopback_vector() {
    let p = proposal_smcd_v2_loopback();
    both_ways(&PROPOSAL_SMCD_V2_LOOPBACK, &ClcMessage::Proposal(p.clone()));
    // The builder path the engine uses produces exactly these bytes.
    let built = ProposalBuilder::smcd_v2_loopback(0x1122_3344_5566_7788, 0x99AA_BBCC_DDEE_FF00)
        .user_eid(eid())
        .build()
        .unwrap();
    assert_eq!(built, p);
    assert_eq!(built.to_vec(), PROPOSAL_SMCD_V2_LOOPBACK);
    assert_eq!(
        p.smcd_v2_devices(),
        vec![SmcdDevice::loopback(
            0x1122_3344_5566_7788,
            0x99AA_BBCC_DDEE_FF00
        )]
    );
}

/// An SMC-R v1-only peer of the first generation: version 1, iparea_offset 0 (no SMC-D
/// area), IPv4 subnet 10.1.2.0/24.
#[rustfmt::skip]
const PROPOSAL_SMCR_V1_OLD: [u8; 52] = [
    // 0: header: SMCR, type 1, length 52, version 1 | typev2 R(0) | typev1 R(0)
    0xE2, 0xD4, 0xC3, 0xD9, 0x01, 0x00, 0x34, 0x10,
    // 8: peer id
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
    // 16: IB GID fe80::1
    0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01,
    // 32: MAC
    0x02, 0x00, 0x00, 0xAA, 0xBB, 0xCC,
    // 38: iparea_offset 0
    0x00, 0x00,
    // 40: IPv4 subnet 10.1.2.0, prefix len 24, 2 reserved, 0 IPv6 prefixes
    0x0A, 0x01, 0x02, 0x00, 0x18, 0x00, 0x00, 0x00,
    // 48: trailer
    0xE2, 0xD4, 0xC3, 0xD9,
];

#[test]
fn proposal_smcr_v1_old_vector() {
    let p = Proposal {
        version: 1,
        typev1: SmcType::R,
        typev2: SmcType::R,
        peer_id: [1, 2, 3, 4, 5, 6, 7, 8],
        ib_gid: [0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        ib_mac: [0x02, 0, 0, 0xAA, 0xBB, 0xCC],
        smcd: None,
        ip_prefix: Some(IpPrefixArea::ipv4(Ipv4Addr::new(10, 1, 2, 0), 24)),
        v2: None,
    };
    both_ways(&PROPOSAL_SMCR_V1_OLD, &ClcMessage::Proposal(p));
}

/// Everything at once: version 2, typev1 B and typev2 B over IPv6 with two prefixes, a native
/// ISM device in the SMC-D area, SEID on, one UEID, SMC-R v2 with max_conns 255 / max_links 2,
/// and a loopback pair in the SMC-Dv2 extension.
#[rustfmt::skip]
const PROPOSAL_BOTH_V2: [u8; 266] = {
    let mut b = [0u8; 266];
    // 0: header: SMCR, type 1, length 266 (0x010a), version 2 | typev2 B(3) | typev1 B(3)
    let h = [0xE2, 0xD4, 0xC3, 0xD9, 0x01, 0x01, 0x0A, 0x2F];
    let mut i = 0; while i < 8 { b[i] = h[i]; i += 1; }
    // 8: peer id
    let mut i = 0; while i < 8 { b[8 + i] = 0xA0 + i as u8; i += 1; }
    // 16: IB GID (v1) 0xfe80..02, 32: MAC 02:00:00:00:00:02
    b[16] = 0xFE; b[17] = 0x80; b[31] = 0x02;
    b[32] = 0x02; b[37] = 0x02;
    // 38: iparea_offset = 40
    b[39] = 0x28;
    // 40: SMC-D area: native ISM gid 0x0000000000001234, chid 0x0123
    b[46] = 0x12; b[47] = 0x34; b[48] = 0x01; b[49] = 0x23;
    // 50: v2_ext_offset = 28 + 8 + 2*17 = 70 (0x46)
    b[51] = 0x46;
    // 80: IP area: IPv4 subnet 0, prefix len 0, reserved, 2 IPv6 prefixes
    b[87] = 0x02;
    // 88: 2001:db8:1::/64
    b[88] = 0x20; b[89] = 0x01; b[90] = 0x0D; b[91] = 0xB8; b[93] = 0x01; b[104] = 64;
    // 105: 2001:db8:2::/48
    b[105] = 0x20; b[106] = 0x01; b[107] = 0x0D; b[108] = 0xB8; b[110] = 0x02; b[121] = 48;
    // 122: v2 extension: eid_cnt 1, ism_gid_cnt 2, rsvd, release 1 | seid 1
    b[122] = 0x01; b[123] = 0x02; b[125] = 0x11;
    // 128: smcd_v2_ext_offset = 64
    b[129] = 0x40;
    // 130: RoCEv2 GID ::ffff:10.0.0.1
    b[140] = 0xFF; b[141] = 0xFF; b[142] = 10; b[145] = 1;
    // 146: max_conns 255, max_links 2, 148: feature mask 0x0001
    b[146] = 0xFF; b[147] = 0x02; b[149] = 0x01;
    // 150: 12 reserved; 162: user EID
    let mut i = 0; while i < 32 { b[162 + i] = EID_BYTES[i]; i += 1; }
    // 194: SMC-Dv2 extension: system EID, 16 reserved
    let mut i = 0; while i < 32 { b[194 + i] = SEID_BYTES[i]; i += 1; }
    // 242: loopback pair
    let e = [
        0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xFF, 0xFF,
        0x99, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF, 0x00, 0xFF, 0xFF,
    ];
    let mut i = 0; while i < 20 { b[242 + i] = e[i]; i += 1; }
    // 262: trailer
    let t = [0xE2, 0xD4, 0xC3, 0xD9];
    let mut i = 0; while i < 4 { b[262 + i] = t[i]; i += 1; }
    b
};

fn proposal_both_v2() -> Proposal {
    let mut gid = [0u8; 16];
    gid[0] = 0xFE;
    gid[1] = 0x80;
    gid[15] = 0x02;
    let mut roce = [0u8; 16];
    roce[10..16].copy_from_slice(&[0xFF, 0xFF, 10, 0, 0, 1]);
    Proposal {
        version: 2,
        typev1: SmcType::Both,
        typev2: SmcType::Both,
        peer_id: [0xA0, 0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7],
        ib_gid: gid,
        ib_mac: [0x02, 0, 0, 0, 0, 0x02],
        smcd: Some(ProposalSmcd {
            gid: 0x1234,
            chid: 0x0123,
            ..ProposalSmcd::default()
        }),
        ip_prefix: Some(IpPrefixArea {
            ipv4_subnet: Ipv4Addr::UNSPECIFIED,
            ipv4_prefix_len: 0,
            ipv6_prefixes: vec![
                Ipv6Prefix {
                    prefix: Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0),
                    prefix_len: 64,
                },
                Ipv6Prefix {
                    prefix: Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0),
                    prefix_len: 48,
                },
            ],
        }),
        v2: Some(ProposalV2Ext {
            release: 1,
            seid: true,
            roce_gid: roce,
            max_conns: 255,
            max_links: 2,
            feature_mask: 1,
            user_eids: vec![eid()],
            smcd: Some(SmcdV2Ext {
                system_eid: Eid(SEID_BYTES),
                entries: vec![
                    GidChid {
                        gid: 0x1122_3344_5566_7788,
                        chid: 0xFFFF,
                    },
                    GidChid {
                        gid: 0x99AA_BBCC_DDEE_FF00,
                        chid: 0xFFFF,
                    },
                ],
            }),
        }),
    }
}

#[test]
fn proposal_both_v2_vector() {
    let p = proposal_both_v2();
    both_ways(&PROPOSAL_BOTH_V2, &ClcMessage::Proposal(p.clone()));
    assert_eq!(
        p.smcd_v2_devices(),
        vec![
            SmcdDevice {
                gid: 0x1234,
                gid_ext: None,
                chid: 0x0123
            },
            SmcdDevice::loopback(0x1122_3344_5566_7788, 0x99AA_BBCC_DDEE_FF00),
        ]
    );
    // The builder reproduces it.
    let built = ProposalBuilder::new()
        .smcr_v1(SmcrV1Offer {
            peer_id: p.peer_id,
            gid: p.ib_gid,
            mac: p.ib_mac,
        })
        .smcd_v1(0x1234, 0x0123)
        .ip_prefix(p.ip_prefix.clone().unwrap())
        .smcr_v2(SmcrV2Offer {
            roce_gid: p.v2.as_ref().unwrap().roce_gid,
            max_conns: 255,
            max_links: 2,
        })
        .smcd_v2_device(SmcdDevice::loopback(
            0x1122_3344_5566_7788,
            0x99AA_BBCC_DDEE_FF00,
        ))
        .user_eid(eid())
        .system_eid(Eid(SEID_BYTES))
        .build()
        .unwrap();
    assert_eq!(built, p);
}

/// The parser follows the offsets the peer sent instead of assuming Linux's order. The
/// kernel's exact-length rule leaves room only for placements that overlap, so this one moves
/// the v2 extension 8 bytes later (v2_ext_offset 36, a gap at 80..88) and lets the SMC-Dv2
/// extension start inside the v2 extension's 12 reserved bytes (smcd_v2_ext_offset 24).
/// The kernel accepts this too; re-emitting gives Linux's layout and the same value.
#[test]
fn proposal_follows_offsets() {
    let canonical = ProposalBuilder::smcd_v2_loopback(0x1122_3344_5566_7788, 0x99AA_BBCC_DDEE_FF00)
        .build()
        .unwrap();
    let c = canonical.to_vec();
    assert_eq!(c.len(), 192);
    // canonical: v2 ext 80..120, SMC-Dv2 ext 120..168, entries 168..188, trailer 188..192
    let mut b = vec![0u8; 192];
    b[..80].copy_from_slice(&c[..80]);
    b[51] = 36; // v2_ext_offset: v2 ext at 52 + 36 = 88
    b[88..120].copy_from_slice(&c[80..112]); // v2 ext bytes 0..32 (its last 8 reserved overlap)
    b[95] = 24; // smcd_v2_ext_offset: SMC-Dv2 ext at 88 + 8 + 24 = 120
    b[120..188].copy_from_slice(&c[120..188]); // SMC-Dv2 ext + entries
    b[188..].copy_from_slice(&EYECATCHER_SMCR);
    let p = Proposal::parse(&b).unwrap();
    assert_eq!(p, canonical);
    assert_eq!(p.to_vec(), c);

    // An offset that makes the area run into the trailer is refused.
    let mut d = b.clone();
    d[95] = 25;
    let e = Proposal::parse(&d).unwrap_err();
    assert_eq!(
        e,
        ClcError::BadOffset {
            field: OffsetField::SmcdV2Ext,
            value: 25
        }
    );
    assert_eq!(e.decline_reason(), ReasonCode::NOV2DEXT);
    // v2_ext_offset 0 with typev2 != N: the kernel finds no v2 extension.
    let mut d = c.clone();
    d[51] = 0;
    let e = Proposal::parse(&d).unwrap_err();
    assert_eq!(
        e,
        ClcError::BadOffset {
            field: OffsetField::V2Ext,
            value: 0
        }
    );
    assert_eq!(e.decline_reason(), ReasonCode::NOV2EXT);
    // smcd_v2_ext_offset 0 likewise.
    let mut d = c.clone();
    d[87] = 0;
    assert_eq!(
        Proposal::parse(&d),
        Err(ClcError::BadOffset {
            field: OffsetField::SmcdV2Ext,
            value: 0
        })
    );
}

#[test]
fn proposal_offset_and_count_errors() {
    // iparea_offset above 40.
    let mut b = PROPOSAL_SMCR_V1_OLD;
    b[39] = 41;
    assert_eq!(
        Proposal::parse(&b),
        Err(ClcError::BadOffset {
            field: OffsetField::IpArea,
            value: 41
        })
    );
    // 9 IPv6 prefixes.
    let mut b = PROPOSAL_SMCR_V1_OLD;
    b[47] = 9;
    assert_eq!(
        Proposal::parse(&b),
        Err(ClcError::TooMany {
            what: Entries::Ipv6Prefixes,
            count: 9,
            max: 8
        })
    );
    // 1 IPv6 prefix announced, none sent: length rule.
    let mut b = PROPOSAL_SMCR_V1_OLD;
    b[47] = 1;
    assert_eq!(
        Proposal::parse(&b),
        Err(ClcError::LengthMismatch {
            msg: ClcType::Proposal,
            header: 52,
            expected: 69
        })
    );
    // v1 with typev1 N.
    let mut b = PROPOSAL_SMCR_V1_OLD;
    b[7] = 0x12;
    assert!(matches!(
        Proposal::parse(&b),
        Err(ClcError::BadSmcType { .. })
    ));
    // v2_ext_offset above the kernel's 172.
    let mut b = PROPOSAL_SMCD_V2_LOOPBACK;
    b[51] = 173;
    assert_eq!(
        Proposal::parse(&b),
        Err(ClcError::BadOffset {
            field: OffsetField::V2Ext,
            value: 173
        })
    );
    // 9 user EIDs / 9 GID entries.
    let mut b = PROPOSAL_SMCD_V2_LOOPBACK;
    b[80] = 9;
    assert!(matches!(
        Proposal::parse(&b),
        Err(ClcError::TooMany {
            what: Entries::UserEids,
            count: 9,
            ..
        })
    ));
    let mut b = PROPOSAL_SMCD_V2_LOOPBACK;
    b[81] = 9;
    assert!(matches!(
        Proposal::parse(&b),
        Err(ClcError::TooMany {
            what: Entries::IsmGids,
            count: 9,
            ..
        })
    ));
    // One GID entry fewer announced: exact length rule.
    let mut b = PROPOSAL_SMCD_V2_LOOPBACK;
    b[81] = 1;
    assert!(matches!(
        Proposal::parse(&b),
        Err(ClcError::LengthMismatch {
            header: 224,
            expected: 214,
            ..
        })
    ));
    // SMC-D in typev1 requires iparea_offset 40 in v2.
    let mut b = PROPOSAL_BOTH_V2;
    b[39] = 0;
    assert_eq!(
        Proposal::parse(&b),
        Err(ClcError::BadOffset {
            field: OffsetField::IpArea,
            value: 0
        })
    );
}

#[test]
fn lone_emulated_entry_is_ignored() {
    // Entries: loopback gid (chid ffff), then a native entry (chid 0x0042): the emulated
    // entry has no partner and is skipped, as smc_find_ism_v2_device_serv() does.
    let ext = SmcdV2Ext {
        system_eid: Eid::ZERO,
        entries: vec![
            GidChid {
                gid: 1,
                chid: 0xFFFF,
            },
            GidChid {
                gid: 2,
                chid: 0x0042,
            },
            GidChid {
                gid: 3,
                chid: 0xFF01,
            },
            GidChid {
                gid: 4,
                chid: 0xFF01,
            },
            GidChid {
                gid: 5,
                chid: 0xFF02,
            },
        ],
    };
    assert_eq!(
        ext.devices(),
        vec![
            SmcdDevice {
                gid: 2,
                gid_ext: None,
                chid: 0x0042
            },
            SmcdDevice {
                gid: 3,
                gid_ext: Some(4),
                chid: 0xFF01
            },
        ]
    );
    let mut e = SmcdV2Ext::default();
    e.push_device(SmcdDevice {
        gid: 9,
        gid_ext: None,
        chid: 0xFF05,
    });
    assert_eq!(
        e.entries,
        vec![
            GidChid {
                gid: 9,
                chid: 0xFF05
            },
            GidChid {
                gid: 0,
                chid: 0xFF05
            }
        ]
    );
}

// ---------------------------------------------------------------------------------------
// Accept / Confirm
// ---------------------------------------------------------------------------------------

/// Loopback SMC-D v2 Accept with first contact, release 1: 78 + 52-byte FCE = 130.
#[rustfmt::skip]
const ACCEPT_SMCD_V2_FC: [u8; 130] = {
    let mut b = [0u8; 130];
    // 0: header: SMCD, type 2, length 130, version 2 | first contact (0x08) | typev1 D
    let h = [0xE2, 0xD4, 0xC3, 0xC4, 0x02, 0x00, 0x82, 0x29];
    let mut i = 0; while i < 8 { b[i] = h[i]; i += 1; }
    // 8: GID, 16: DMB token
    let g = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88,
             0x00, 0x00, 0x00, 0x00, 0x00, 0xAB, 0xCD, 0xEF];
    let mut i = 0; while i < 16 { b[8 + i] = g[i]; i += 1; }
    // 24: DMBE idx 0, 25: DMBE size code 2 (64 KiB) in the high nibble, 26: reserved
    b[25] = 0x20;
    // 28: link id
    b[28] = 0x00; b[29] = 0x01; b[30] = 0x00; b[31] = 0x00;
    // 32: CHID 0xffff
    b[32] = 0xFF; b[33] = 0xFF;
    // 34: negotiated EID
    let mut i = 0; while i < 32 { b[34 + i] = EID_BYTES[i]; i += 1; }
    // 66: gid_ext
    let x = [0x99, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF, 0x00];
    let mut i = 0; while i < 8 { b[66 + i] = x[i]; i += 1; }
    // 74: FCE: v2_direct 0, OS Linux(2) | release 1, 2 reserved, hostname
    b[75] = 0x21;
    let mut i = 0; while i < 32 { b[78 + i] = HOST_BYTES[i]; i += 1; }
    // 110: max_conns 0, max_links 0, 112: feature mask 1, 114: vendor options, 118: 8 rsvd
    b[113] = 0x01;
    // 126: trailer
    let t = [0xE2, 0xD4, 0xC3, 0xC4];
    let mut i = 0; while i < 4 { b[126 + i] = t[i]; i += 1; }
    b
};

fn smcd_body() -> SmcdAcceptConfirm {
    SmcdAcceptConfirm {
        gid: 0x1122_3344_5566_7788,
        token: 0xAB_CDEF,
        dmbe_idx: 0,
        dmbe_size: compress_bufsize(65536, SMCD_MAX_BUFSIZE_CODE),
        link_id: [0, 1, 0, 0],
        chid: LOOPBACK_CHID,
        eid: eid(),
        gid_ext: 0x99AA_BBCC_DDEE_FF00,
    }
}

#[test]
fn accept_smcd_v2_first_contact_vector() {
    let a = AcceptConfirm::smcd_v2(
        smcd_body(),
        Some(FirstContactExt::linux_smcd(
            SMC_RELEASE_1,
            Hostname::new("myhost"),
            SMC_FEATURE_MASK,
        )),
    );
    both_ways(&ACCEPT_SMCD_V2_FC, &ClcMessage::Accept(a.clone()));
    let AcceptConfirmBody::SmcD(d) = &a.body else {
        unreachable!()
    };
    assert_eq!(
        d.device(),
        SmcdDevice::loopback(0x1122_3344_5566_7788, 0x99AA_BBCC_DDEE_FF00)
    );
    // The same bytes with type 3 are a Confirm.
    let mut c = ACCEPT_SMCD_V2_FC;
    c[4] = 3;
    both_ways(&c, &ClcMessage::Confirm(a));
}

/// SMC-D v2 Confirm at release 0: Linux sends only the 36-byte FCE (78 + 36 = 114), and
/// no first contact on the Confirm side means just 78 bytes.
#[test]
fn confirm_smcd_v2_release0_vector() {
    let mut b = [0u8; 114];
    b[..74].copy_from_slice(&ACCEPT_SMCD_V2_FC[..74]);
    b[4] = 0x03; // Confirm
    b[6] = 114; // length
    b[74] = 0x00; // v2_direct 0
    b[75] = 0x20; // Linux, release 0
    b[78..110].copy_from_slice(&HOST_BYTES);
    b[110..114].copy_from_slice(&EYECATCHER_SMCD);
    let c = AcceptConfirm::smcd_v2(
        smcd_body(),
        Some(FirstContactExt::linux_smcd(
            SMC_RELEASE_0,
            Hostname::new("myhost"),
            0,
        )),
    );
    assert_eq!(c.fce.unwrap().v2x, None);
    both_ways(&b, &ClcMessage::Confirm(c));

    // Not first contact: 78 bytes, flag clear.
    let mut n = [0u8; 78];
    n[..74].copy_from_slice(&ACCEPT_SMCD_V2_FC[..74]);
    n[4] = 0x03;
    n[6] = 78;
    n[7] = 0x21;
    n[74..78].copy_from_slice(&EYECATCHER_SMCD);
    both_ways(
        &n,
        &ClcMessage::Confirm(AcceptConfirm::smcd_v2(smcd_body(), None)),
    );

    // v2 receivers accept longer messages ("≥"): 8 bytes of future extension are ignored.
    let mut long = n[..74].to_vec();
    long.extend_from_slice(&[0xEE; 8]);
    long.extend_from_slice(&EYECATCHER_SMCD);
    long[6] = 86;
    assert_eq!(
        ClcMessage::parse(&long).unwrap(),
        ClcMessage::Confirm(AcceptConfirm::smcd_v2(smcd_body(), None))
    );
    // First contact but no room for the FCE is refused.
    let mut short = n;
    short[7] = 0x29;
    assert_eq!(
        ClcMessage::parse(&short),
        Err(ClcError::MissingFirstContactExt {
            msg: ClcType::Confirm,
            room: 0
        })
    );
}

/// SMC-D v1 Accept, not first contact: 48 bytes, bytes 32-43 reserved.
#[rustfmt::skip]
const ACCEPT_SMCD_V1: [u8; 48] = [
    // 0: header: SMCD, type 2, length 48, version 1 | typev1 D
    0xE2, 0xD4, 0xC3, 0xC4, 0x02, 0x00, 0x30, 0x11,
    // 8: GID
    0x00, 0x00, 0x00, 0x00, 0xCA, 0xFE, 0x00, 0x01,
    // 16: DMB token
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00,
    // 24: DMBE idx 0, size code 6 (1 MiB), 2 reserved
    0x00, 0x60, 0x00, 0x00,
    // 28: link id
    0xDE, 0xAD, 0xBE, 0xEF,
    // 32: 12 reserved
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    // 44: trailer
    0xE2, 0xD4, 0xC3, 0xC4,
];

#[test]
fn accept_smcd_v1_vector() {
    let a = AcceptConfirm::smcd_v1(
        SmcdAcceptConfirm {
            gid: 0xCAFE_0001,
            token: 0x1000,
            dmbe_idx: 0,
            dmbe_size: 6,
            link_id: [0xDE, 0xAD, 0xBE, 0xEF],
            ..SmcdAcceptConfirm::default()
        },
        false,
    );
    both_ways(&ACCEPT_SMCD_V1, &ClcMessage::Accept(a));
    // v1 lengths are exact.
    let mut b = ACCEPT_SMCD_V1.to_vec();
    b.splice(44..44, [0u8; 4]);
    b[6] = 52;
    assert_eq!(
        ClcMessage::parse(&b),
        Err(ClcError::LengthMismatch {
            msg: ClcType::Accept,
            header: 52,
            expected: 48
        })
    );
}

/// SMC-R v1 Accept with first contact: 68 bytes.
#[rustfmt::skip]
const ACCEPT_SMCR_V1_FC: [u8; 68] = [
    // 0: header: SMCR, type 2, length 68, version 1 | first contact | typev1 R
    0xE2, 0xD4, 0xC3, 0xD9, 0x02, 0x00, 0x44, 0x18,
    // 8: peer id
    0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11,
    // 16: GID
    0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0xFF, 0xFE, 0, 0, 0x01,
    // 32: MAC
    0x02, 0x00, 0x00, 0x00, 0x00, 0x01,
    // 38: QPN 0x000123
    0x00, 0x01, 0x23,
    // 41: rkey
    0x00, 0x00, 0x56, 0x78,
    // 45: RMBE idx 1
    0x01,
    // 46: alert token 7
    0x00, 0x00, 0x00, 0x07,
    // 50: RMBE size code 1 | QP MTU 3 (1024), 51: reserved
    0x13, 0x00,
    // 52: RMB address
    0x00, 0x00, 0x7F, 0x00, 0x12, 0x34, 0x50, 0x00,
    // 60: reserved, 61: PSN 0xabcdef
    0x00, 0xAB, 0xCD, 0xEF,
    // 64: trailer
    0xE2, 0xD4, 0xC3, 0xD9,
];

fn smcr_body() -> SmcrAcceptConfirm {
    SmcrAcceptConfirm {
        peer_id: [0x11; 8],
        gid: [
            0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0xFF, 0xFE, 0, 0, 0x01,
        ],
        mac: [0x02, 0, 0, 0, 0, 0x01],
        qpn: 0x123,
        rmb_rkey: 0x5678,
        rmbe_idx: 1,
        rmbe_alert_token: 7,
        rmbe_size: 1,
        qp_mtu: 3,
        rmb_dma_addr: 0x7F00_1234_5000,
        psn: 0xAB_CDEF,
        eid: Eid::ZERO,
        gid_list: None,
    }
}

#[test]
fn accept_smcr_v1_vector() {
    let a = AcceptConfirm::smcr(1, true, smcr_body(), None);
    both_ways(&ACCEPT_SMCR_V1_FC, &ClcMessage::Accept(a));
}

/// SMC-R v2 Confirm, first contact, release 1: 108 + 52 (FCE) + 4 + 2×16 (GID list) = 196,
/// the longest message Linux sends after a Proposal.
#[test]
fn confirm_smcr_v2_gid_list_vector() {
    let mut b = vec![0u8; 196];
    b[..64].copy_from_slice(&ACCEPT_SMCR_V1_FC[..64]);
    b[4] = 0x03; // Confirm
    b[5] = 0x00;
    b[6] = 0xC4; // 196
    b[7] = 0x28; // version 2 | first contact | R
    b[64..96].copy_from_slice(&EID_BYTES); // 64: EID, 96: 8 reserved
    // 104: FCE: v2_direct, Linux | release 1, hostname, max_conns 255, max_links 2, mask 1
    b[104] = 0x80;
    b[105] = 0x21;
    b[108..140].copy_from_slice(&HOST_BYTES);
    b[140] = 0xFF;
    b[141] = 0x02;
    b[143] = 0x01;
    // 156: GID list: count 2, 3 reserved, two GIDs
    b[156] = 0x02;
    b[160..176].copy_from_slice(&[0xAA; 16]);
    b[176..192].copy_from_slice(&[0xBB; 16]);
    b[192..196].copy_from_slice(&EYECATCHER_SMCR);
    let mut body = smcr_body();
    body.eid = eid();
    body.gid_list = Some(vec![[0xAA; 16], [0xBB; 16]]);
    let fce = FirstContactExt::linux_smcr(1, Hostname::new("myhost"), true, 255, 2, 1);
    let c = AcceptConfirm::smcr(2, true, body, Some(fce));
    both_ways(&b, &ClcMessage::Confirm(c.clone()));
    // The same tail in an Accept is ignored (no GID list in Accepts).
    b[4] = 0x02;
    let ClcMessage::Accept(a) = ClcMessage::parse(&b).unwrap() else {
        panic!()
    };
    let AcceptConfirmBody::SmcR(r) = &a.body else {
        panic!()
    };
    assert_eq!(r.gid_list, None);
    // A GID list entry count of 3 is refused.
    b[4] = 0x03;
    b[156] = 3;
    assert!(matches!(
        ClcMessage::parse(&b),
        Err(ClcError::TooMany {
            what: Entries::ConfirmGids,
            count: 3,
            max: 2
        })
    ));
}

// ---------------------------------------------------------------------------------------
// Declines
// ---------------------------------------------------------------------------------------

#[rustfmt::skip]
const DECLINE_V1: [u8; 28] = [
    // 0: header: SMCR, type 4, length 28, version 1
    0xE2, 0xD4, 0xC3, 0xD9, 0x04, 0x00, 0x1C, 0x10,
    // 8: peer id (none)
    0, 0, 0, 0, 0, 0, 0, 0,
    // 16: peer diagnosis NOSMCD2DEV
    0x03, 0x03, 0x00, 0x07,
    // 20: OS type 0 (v1), 3 reserved
    0x00, 0x00, 0x00, 0x00,
    // 24: trailer
    0xE2, 0xD4, 0xC3, 0xD9,
];

#[rustfmt::skip]
const DECLINE_V2_SYNCERR: [u8; 44] = [
    // 0: header: SMCR, type 4, length 44, version 2 | out of sync (0x08)
    0xE2, 0xD4, 0xC3, 0xD9, 0x04, 0x00, 0x2C, 0x28,
    // 8: peer id
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2A,
    // 16: peer diagnosis SYNCERR
    0x04, 0x00, 0x00, 0x00,
    // 20: OS type Linux (2) in the high nibble, 3 reserved
    0x20, 0x00, 0x00, 0x00,
    // 24: four more diagnosis codes (Linux: zeros)
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    // 40: trailer
    0xE2, 0xD4, 0xC3, 0xD9,
];

#[test]
fn decline_vectors() {
    both_ways(
        &DECLINE_V1,
        &ClcMessage::Decline(Decline::new(ReasonCode::NOSMCD2DEV, 1)),
    );
    let mut d = Decline::new(ReasonCode::SYNCERR, 2);
    assert!(d.out_of_sync);
    d.peer_id = [0x02, 0, 0, 0, 0, 0, 0, 0x2A];
    both_ways(&DECLINE_V2_SYNCERR, &ClcMessage::Decline(d));
    // A server answers a Proposal with its version (anything above 1 → 2).
    let mut p = proposal_smcd_v2_loopback();
    p.version = 3;
    assert_eq!(
        Decline::reply_to(ReasonCode::NOSMCD2DEV, &p).to_vec().len(),
        44
    );
    let v1 = Proposal::parse(&PROPOSAL_SMCR_V1_OLD).unwrap();
    assert_eq!(
        Decline::reply_to(ReasonCode::NOSMCD2DEV, &v1).to_vec(),
        DECLINE_V1
    );
    // Declines must have the exact length for their version.
    let mut b = DECLINE_V2_SYNCERR;
    b[7] = 0x18; // version 1 with 44 bytes
    assert_eq!(
        ClcMessage::parse(&b),
        Err(ClcError::LengthMismatch {
            msg: ClcType::Decline,
            header: 44,
            expected: 28
        })
    );
    // The kernel does not check a Decline's trailer; neither do we.
    let mut b = DECLINE_V1;
    b[24..28].copy_from_slice(b"junk");
    assert!(ClcMessage::parse(&b).is_ok());
    // An SMCD eyecatcher is accepted in the header too.
    let mut b = DECLINE_V1;
    b[3] = 0xC4;
    assert!(ClcMessage::parse(&b).is_ok());
}

// ---------------------------------------------------------------------------------------
// Framing errors
// ---------------------------------------------------------------------------------------

#[test]
fn framing_errors() {
    let good = ACCEPT_SMCD_V1;
    assert_eq!(
        ClcMessage::parse(&good[..7]),
        Err(ClcError::Truncated { need: 8, have: 7 })
    );
    assert_eq!(
        ClcMessage::parse(&good[..47]),
        Err(ClcError::Truncated { need: 48, have: 47 })
    );
    let mut longer = good.to_vec();
    longer.push(0);
    assert_eq!(
        ClcMessage::parse(&longer),
        Err(ClcError::TrailingBytes {
            header: 48,
            buffer: 49
        })
    );
    let mut b = good;
    b[0] = 0x00;
    assert_eq!(
        ClcMessage::parse(&b),
        Err(ClcError::BadEyecatcher([0, 0xD4, 0xC3, 0xC4]))
    );
    let mut b = good;
    b[47] = 0x00;
    assert_eq!(
        ClcMessage::parse(&b),
        Err(ClcError::BadTrailer([0xE2, 0xD4, 0xC3, 0]))
    );
    // Mixed eyecatchers are fine: SMCR header, SMCD trailer.
    let mut b = good;
    b[3] = 0xD9;
    assert!(ClcMessage::parse(&b).is_ok());
    let mut b = good;
    b[4] = 9;
    assert_eq!(ClcMessage::parse(&b), Err(ClcError::UnknownType(9)));
    let mut b = good;
    b[7] = 0x01;
    let e = ClcMessage::parse(&b).unwrap_err();
    assert_eq!(e, ClcError::BadVersion(0));
    assert_eq!(e.decline_reason(), ReasonCode::VERSMISMAT);
    // Accept with typev1 N.
    let mut b = good;
    b[7] = 0x12;
    let e = ClcMessage::parse(&b).unwrap_err();
    assert_eq!(
        e,
        ClcError::BadSmcType {
            msg: ClcType::Accept,
            typev1: SmcType::None
        }
    );
    assert_eq!(e.decline_reason(), ReasonCode::MODEUNSUPP);
    assert_eq!(
        ClcError::BadTrailer([0; 4]).decline_reason(),
        ReasonCode::CNFERR
    );
}

#[test]
fn peek_bounds() {
    let hdr = |t: u8, len: u16, b7: u8| {
        let mut h = [0xE2, 0xD4, 0xC3, 0xD9, t, 0, 0, b7];
        h[5..7].copy_from_slice(&len.to_be_bytes());
        h
    };
    assert_eq!(peek_message_len(&hdr(1, 652, 0x2A)), Ok(652));
    assert_eq!(
        peek_message_len(&hdr(1, 653, 0x2A)),
        Err(ClcError::TooLong {
            msg: ClcType::Proposal,
            len: 653,
            max: 652
        })
    );
    assert_eq!(
        peek_message_len(&hdr(1, 83, 0x2A)),
        Err(ClcError::TooShort {
            msg: ClcType::Proposal,
            len: 83,
            min: 84
        })
    );
    assert_eq!(
        peek_message_len(&hdr(1, 229, 0x10)),
        Err(ClcError::TooLong {
            msg: ClcType::Proposal,
            len: 229,
            max: 228
        })
    );
    assert_eq!(peek_message_len(&hdr(2, 652, 0x21)), Ok(652));
    assert_eq!(peek_message_len(&hdr(3, 108, 0x20)), Ok(108));
    assert!(peek_message_len(&hdr(3, 107, 0x20)).is_err());
    assert!(peek_message_len(&hdr(3, 65535, 0x20)).is_err());
    assert_eq!(peek_message_len(&hdr(4, 44, 0x30)), Ok(44)); // version 3 uses v2 sizes
    assert!(peek_message_len(&hdr(4, 0, 0x10)).is_err());
    assert!(peek_message_len(&hdr(0, 44, 0x20)).is_err());
    assert!(peek_message_len(b"GET / HTTP/1.1\r\n").is_err());
    assert!(peek_message_len(&[]).is_err());
    for v in [
        &PROPOSAL_SMCD_V2_LOOPBACK[..],
        &PROPOSAL_SMCR_V1_OLD,
        &PROPOSAL_BOTH_V2,
        &ACCEPT_SMCD_V2_FC,
        &ACCEPT_SMCD_V1,
        &ACCEPT_SMCR_V1_FC,
        &DECLINE_V1,
        &DECLINE_V2_SYNCERR,
    ] {
        assert_eq!(peek_message_len(v), Ok(v.len()));
    }
}

#[test]
fn validate_catches_inconsistent_values() {
    let mut p = proposal_smcd_v2_loopback();
    p.ip_prefix = Some(IpPrefixArea::default());
    assert!(matches!(p.validate(), Err(ClcError::Inconsistent(_))));
    let mut p = proposal_smcd_v2_loopback();
    p.typev2 = SmcType::R;
    assert!(p.validate().is_err());
    let mut a = AcceptConfirm::smcd_v2(smcd_body(), None);
    a.first_contact = true;
    assert!(a.validate(AcceptOrConfirm::Accept).is_err());
    let mut body = smcr_body();
    body.gid_list = Some(vec![]);
    let a = AcceptConfirm::smcr(2, true, body, Some(FirstContactExt::default()));
    assert!(a.validate(AcceptOrConfirm::Confirm).is_err()); // short FCE before a GID list
    let mut d = Decline::new(ReasonCode::MEM, 1);
    d.diag_v2[0] = ReasonCode::MEM;
    assert!(d.validate().is_err());
    assert!(ProposalBuilder::new().smcd_v1(1, 2).build().is_err()); // v1 without IP area
}

/// Writes every vector above into `$CLC_SEED_DIR` as a fuzz seed:
/// `CLC_SEED_DIR=/tmp/seeds cargo test -p smc-proto --test clc_vectors -- --ignored`.
#[test]
#[ignore]
fn dump_fuzz_seeds() {
    let Ok(dir) = std::env::var("CLC_SEED_DIR") else {
        return;
    };
    std::fs::create_dir_all(&dir).unwrap();
    let mut seeds: Vec<(&str, Vec<u8>)> = vec![
        (
            "proposal_smcd_v2_loopback",
            PROPOSAL_SMCD_V2_LOOPBACK.to_vec(),
        ),
        ("proposal_smcr_v1_old", PROPOSAL_SMCR_V1_OLD.to_vec()),
        ("proposal_both_v2", PROPOSAL_BOTH_V2.to_vec()),
        ("accept_smcd_v2_fc", ACCEPT_SMCD_V2_FC.to_vec()),
        ("accept_smcd_v1", ACCEPT_SMCD_V1.to_vec()),
        ("accept_smcr_v1_fc", ACCEPT_SMCR_V1_FC.to_vec()),
        ("decline_v1", DECLINE_V1.to_vec()),
        ("decline_v2_syncerr", DECLINE_V2_SYNCERR.to_vec()),
    ];
    let mut body = smcr_body();
    body.eid = eid();
    body.gid_list = Some(vec![[0xAA; 16], [0xBB; 16]]);
    let fce = FirstContactExt::linux_smcr(1, Hostname::new("myhost"), true, 255, 2, 1);
    seeds.push((
        "confirm_smcr_v2_gids",
        ClcMessage::Confirm(AcceptConfirm::smcr(2, true, body, Some(fce))).to_vec(),
    ));
    let c = AcceptConfirm::smcd_v2(
        smcd_body(),
        Some(FirstContactExt::linux_smcd(0, Hostname::new("myhost"), 0)),
    );
    seeds.push(("confirm_smcd_v2_rel0", ClcMessage::Confirm(c).to_vec()));
    for (name, bytes) in seeds {
        std::fs::write(format!("{dir}/{name}"), bytes).unwrap();
    }
}
