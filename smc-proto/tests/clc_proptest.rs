//! Property tests for the CLC codecs: random valid messages round-trip through emit/parse,
//! and random mutations, truncations and garbage never panic and either fail with a typed
//! error or give a value that re-emits consistently.

use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::collection::vec;
use proptest::prelude::*;
use smc_proto::clc::*;

fn smc_type() -> impl Strategy<Value = SmcType> {
    (0u8..4).prop_map(SmcType::from_bits)
}

fn eid() -> impl Strategy<Value = Eid> {
    prop_oneof![
        any::<[u8; 32]>().prop_map(Eid),
        "[A-Z0-9][A-Z0-9.-]{0,31}".prop_map(|s| Eid::new(&s).unwrap()),
    ]
}

fn ip_area() -> impl Strategy<Value = IpPrefixArea> {
    (
        any::<[u8; 4]>(),
        any::<u8>(),
        vec((any::<[u8; 16]>(), any::<u8>()), 0..=8),
    )
        .prop_map(|(v4, len, v6)| IpPrefixArea {
            ipv4_subnet: Ipv4Addr::from(v4),
            ipv4_prefix_len: len,
            ipv6_prefixes: v6
                .into_iter()
                .map(|(p, l)| Ipv6Prefix {
                    prefix: Ipv6Addr::from(p),
                    prefix_len: l,
                })
                .collect(),
        })
}

fn smcd_area() -> impl Strategy<Value = ProposalSmcd> {
    (
        any::<u64>(),
        any::<u16>(),
        any::<[u8; 3]>(),
        any::<[u8; 5]>(),
    )
        .prop_map(|(gid, chid, vendor_oui, vendor_options)| ProposalSmcd {
            gid,
            chid,
            vendor_oui,
            vendor_options,
        })
}

/// Devices (native or emulated, as the kernel lays them out) plus, sometimes, raw entries
/// (lone emulated halves included), capped at 8 entries.
fn smcd_v2_ext() -> impl Strategy<Value = SmcdV2Ext> {
    let device = prop_oneof![
        (any::<u64>(), 1u16..0xFF00).prop_map(|(gid, chid)| SmcdDevice {
            gid,
            gid_ext: None,
            chid
        }),
        (any::<u64>(), any::<u64>(), 0xFF00u16..=0xFFFF).prop_map(|(gid, x, chid)| SmcdDevice {
            gid,
            gid_ext: Some(x),
            chid
        }),
    ];
    (
        eid(),
        vec(device, 0..=5),
        vec((any::<u64>(), any::<u16>()), 0..=3),
        any::<bool>(),
    )
        .prop_map(|(system_eid, devs, raw, use_raw)| {
            let mut ext = SmcdV2Ext {
                system_eid,
                entries: Vec::new(),
            };
            for d in devs {
                let need = if d.is_emulated() { 2 } else { 1 };
                if ext.entries.len() + need <= 8 {
                    ext.push_device(d);
                }
            }
            if use_raw {
                for (gid, chid) in raw {
                    if ext.entries.len() < 8 {
                        ext.entries.push(GidChid { gid, chid });
                    }
                }
            }
            ext
        })
}

fn v2_ext(smcd: bool) -> impl Strategy<Value = ProposalV2Ext> {
    (
        0u8..16,
        any::<bool>(),
        any::<[u8; 16]>(),
        any::<u8>(),
        any::<u8>(),
        any::<u16>(),
        vec(eid(), 0..=8),
        smcd_v2_ext(),
    )
        .prop_map(
            move |(release, seid, roce_gid, max_conns, max_links, feature_mask, user_eids, d)| {
                ProposalV2Ext {
                    release,
                    seid,
                    roce_gid,
                    max_conns,
                    max_links,
                    feature_mask,
                    user_eids,
                    smcd: smcd.then_some(d),
                }
            },
        )
}

fn proposal() -> impl Strategy<Value = Proposal> {
    let base = (any::<[u8; 8]>(), any::<[u8; 16]>(), any::<[u8; 6]>());
    let v1 = (
        base,
        prop_oneof![Just(SmcType::R), Just(SmcType::D), Just(SmcType::Both)],
        smc_type(),
        proptest::option::of(smcd_area()),
        ip_area(),
    )
        .prop_map(
            |((peer_id, ib_gid, ib_mac), typev1, typev2, smcd, ip)| Proposal {
                version: 1,
                typev1,
                typev2,
                peer_id,
                ib_gid,
                ib_mac,
                smcd,
                ip_prefix: Some(ip),
                v2: None,
            },
        );
    let v2 = (
        base,
        2u8..16,
        smc_type(),
        smc_type(),
        smcd_area(),
        ip_area(),
    )
        .prop_flat_map(|(b, version, typev1, typev2, smcd, ip)| {
            let ext = if typev2 == SmcType::None {
                Just(None).boxed()
            } else {
                v2_ext(typev2.smcd()).prop_map(Some).boxed()
            };
            ext.prop_map(move |v2| Proposal {
                version,
                typev1,
                typev2,
                peer_id: b.0,
                ib_gid: b.1,
                ib_mac: b.2,
                smcd: Some(smcd),
                ip_prefix: (typev1 != SmcType::None).then(|| ip.clone()),
                v2,
            })
        });
    prop_oneof![1 => v1, 3 => v2]
}

fn fce(full: bool) -> impl Strategy<Value = FirstContactExt> {
    (
        any::<bool>(),
        0u8..16,
        0u8..16,
        any::<[u8; 32]>(),
        any::<(u8, u8, u16, [u8; 4])>(),
    )
        .prop_map(
            move |(v2_direct, os, release, host, (mc, ml, fm, vo))| FirstContactExt {
                v2_direct,
                os_type: OsType::from_nibble(os),
                release,
                hostname: Hostname(host),
                v2x: full.then_some(FceV2x {
                    max_conns: mc,
                    max_links: ml,
                    feature_mask: fm,
                    vendor_options: vo,
                }),
            },
        )
}

fn accept_confirm() -> impl Strategy<Value = ClcMessage> {
    let smcr = (
        any::<([u8; 8], [u8; 16], [u8; 6])>(),
        (0u32..=0xFF_FFFF, any::<u32>(), any::<u8>(), any::<u32>()),
        (0u8..16, 0u8..16, any::<u64>(), 0u32..=0xFF_FFFF),
        eid(),
        vec(any::<[u8; 16]>(), 0..=2),
    )
        .prop_map(
            |((peer_id, gid, mac), (qpn, rkey, idx, tok), (sz, mtu, addr, psn), eid, gl)| {
                (
                    SmcrAcceptConfirm {
                        peer_id,
                        gid,
                        mac,
                        qpn,
                        rmb_rkey: rkey,
                        rmbe_idx: idx,
                        rmbe_alert_token: tok,
                        rmbe_size: sz,
                        qp_mtu: mtu,
                        rmb_dma_addr: addr,
                        psn,
                        eid,
                        gid_list: None,
                    },
                    gl,
                )
            },
        );
    let smcd = (
        any::<(u64, u64, u8)>(),
        0u8..16,
        any::<[u8; 4]>(),
        any::<u16>(),
        eid(),
        any::<u64>(),
    )
        .prop_map(
            |((gid, token, dmbe_idx), dmbe_size, link_id, chid, eid, gid_ext)| SmcdAcceptConfirm {
                gid,
                token,
                dmbe_idx,
                dmbe_size,
                link_id,
                chid,
                eid,
                gid_ext,
            },
        );
    (
        any::<bool>(), // confirm?
        prop_oneof![Just(1u8), 2u8..16],
        any::<bool>(), // first contact
        any::<bool>(), // full FCE
        any::<bool>(), // GID list
        prop_oneof![
            smcr.prop_map(|(r, gl)| (Some((r, gl)), None)),
            smcd.prop_map(|d| (None, Some(d)))
        ],
    )
        .prop_flat_map(|(confirm, version, fc, full, with_gids, body)| {
            let v2 = version >= 2;
            let smcr = body.0.is_some();
            // Linux always sends the full FCE for SMC-R; the short one only for SMC-D, but
            // parsing accepts both, so generate both.
            fce(full || (smcr && with_gids && confirm)).prop_map(move |f| {
                let fce = (v2 && fc).then_some(f);
                let body = match body.clone() {
                    (Some((mut r, gl)), _) => {
                        if !v2 {
                            r.eid = Eid::ZERO;
                        }
                        if confirm && with_gids && fce.is_some_and(|f| f.v2x.is_some()) {
                            r.gid_list = Some(gl);
                        }
                        AcceptConfirmBody::SmcR(r)
                    }
                    (None, Some(mut d)) => {
                        if !v2 {
                            d.chid = 0;
                            d.eid = Eid::ZERO;
                            d.gid_ext = 0;
                        }
                        AcceptConfirmBody::SmcD(d)
                    }
                    (None, None) => unreachable!(),
                };
                let a = AcceptConfirm {
                    version,
                    first_contact: fc,
                    body,
                    fce,
                };
                if confirm {
                    ClcMessage::Confirm(a)
                } else {
                    ClcMessage::Accept(a)
                }
            })
        })
}

fn decline() -> impl Strategy<Value = Decline> {
    (
        prop_oneof![Just(1u8), 2u8..16],
        any::<bool>(),
        any::<[u8; 8]>(),
        any::<u32>(),
        0u8..16,
        any::<[u32; 4]>(),
    )
        .prop_map(|(version, oos, peer_id, reason, os, diag)| Decline {
            version,
            out_of_sync: oos,
            peer_id,
            reason: ReasonCode(reason),
            os_type: OsType::from_nibble(os),
            diag_v2: if version >= 2 {
                diag.map(ReasonCode)
            } else {
                [ReasonCode(0); 4]
            },
        })
}

fn message() -> impl Strategy<Value = ClcMessage> {
    prop_oneof![
        proposal().prop_map(ClcMessage::Proposal),
        accept_confirm(),
        decline().prop_map(ClcMessage::Decline),
    ]
}

/// The oracle for anything that parsed: it is valid, and emit → parse gives it back.
fn reemits_consistently(m: &ClcMessage) {
    m.validate().unwrap();
    let bytes = m.to_vec();
    assert_eq!(peek_message_len(&bytes).unwrap(), bytes.len());
    assert_eq!(&ClcMessage::parse(&bytes).unwrap(), m);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn valid_messages_round_trip(m in message()) {
        m.validate().unwrap();
        let bytes = m.to_vec();
        prop_assert_eq!(bytes.len(), m.buffer_len());
        prop_assert!(bytes.len() <= MAX_MESSAGE_LEN);
        prop_assert_eq!(peek_message_len(&bytes[..HEADER_LEN]).unwrap(), bytes.len());
        prop_assert_eq!(ClcMessage::parse(&bytes).unwrap(), m);
    }

    #[test]
    fn mutations_never_panic(
        m in message(),
        flips in vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let mut bytes = m.to_vec();
        for (i, x) in flips {
            let at = i.index(bytes.len());
            bytes[at] ^= x;
        }
        let _ = peek_message_len(&bytes);
        if let Ok(v) = ClcMessage::parse(&bytes) {
            reemits_consistently(&v);
        }
    }

    #[test]
    fn truncations_and_extensions_never_panic(
        m in message(),
        cut in any::<prop::sample::Index>(),
        extra in vec(any::<u8>(), 0..16),
        fix_len in any::<bool>(),
    ) {
        let bytes = m.to_vec();
        let n = cut.index(bytes.len() + 1);
        let mut b = bytes[..n].to_vec();
        b.extend_from_slice(&extra);
        if fix_len && b.len() >= 8 {
            // Keep the header consistent with the new length so deeper checks run.
            let len = b.len() as u16;
            b[5..7].copy_from_slice(&len.to_be_bytes());
        }
        let _ = peek_message_len(&b);
        match ClcMessage::parse(&b) {
            Ok(v) => reemits_consistently(&v),
            Err(e) => { let _ = (e.to_string(), e.decline_reason()); }
        }
    }

    #[test]
    fn garbage_never_panics(data in vec(any::<u8>(), 0..700)) {
        let _ = peek_message_len(&data);
        if let Ok(v) = ClcMessage::parse(&data) {
            reemits_consistently(&v);
        }
    }

    /// Garbage behind a plausible header, so the body parsers see random input.
    #[test]
    fn garbage_bodies_never_panic(
        t in 1u8..=4,
        b7 in any::<u8>(),
        eye in any::<bool>(),
        body in vec(any::<u8>(), 0..660),
    ) {
        let mut data = if eye { EYECATCHER_SMCR } else { EYECATCHER_SMCD }.to_vec();
        let len = (body.len() + 12) as u16;
        data.push(t);
        data.extend_from_slice(&len.to_be_bytes());
        data.push(b7);
        data.extend_from_slice(&body);
        data.extend_from_slice(&EYECATCHER_SMCR);
        let _ = peek_message_len(&data);
        if let Ok(v) = ClcMessage::parse(&data) {
            reemits_consistently(&v);
        }
    }

    #[test]
    fn bufsize_round_trip(code in 0u8..=6, size in 1usize..(2 << 20)) {
        prop_assert_eq!(compress_bufsize(uncompress_bufsize(code), 6), code);
        let c = compress_bufsize(size, 15);
        prop_assert!(uncompress_bufsize(c) >= size);
    }
}
