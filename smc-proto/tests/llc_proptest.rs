//! LLC proptests: random valid messages round-trip; random mutations and truncations of valid
//! messages never panic and give either a typed error or a value that re-emits consistently.

use proptest::prelude::*;
use smc_proto::llc::{
    AddLink, AddLinkCont, AddLinkContRkey, AddLinkRejectReason, AddLinkV2, AddLinkV2Ext,
    ConfirmLink, ConfirmRkey, ConfirmRkeyCont, DeleteLink, DeleteLinkReason, DeleteRkey,
    DeleteRkeyV2, LlcError, LlcFlags, LlcMessage, MsgKind, RawLlc, ReqAddLink, Rtoken, TestLink,
    classify,
};

fn flags() -> impl Strategy<Value = LlcFlags> {
    any::<u8>().prop_map(LlcFlags::from_bits_retain)
}

fn u24() -> impl Strategy<Value = u32> {
    0u32..=0xff_ffff
}

fn rtoken() -> impl Strategy<Value = Rtoken> {
    (any::<u8>(), any::<u32>(), any::<u64>()).prop_map(|(link_id, rkey, vaddr)| Rtoken {
        link_id,
        rkey,
        vaddr,
    })
}

fn cont_rkey() -> impl Strategy<Value = AddLinkContRkey> {
    (any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(rkey, rkey_new, vaddr_new)| {
        AddLinkContRkey {
            rkey,
            rkey_new,
            vaddr_new,
        }
    })
}

fn raw() -> impl Strategy<Value = RawLlc> {
    // Types Linux does not define with a host-order length, or unknown v1-header types.
    let v2 = (
        prop::sample::select(vec![0x20u8, 0x23, 0x28, 0x2a, 0x2f, 0x3f]),
        44usize..200,
    )
        .prop_flat_map(|(t, len)| (Just(t), prop::collection::vec(any::<u8>(), len)))
        .prop_map(|(t, mut b)| {
            b[0] = t;
            let len = b.len() as u16;
            b[1..3].copy_from_slice(&len.to_ne_bytes());
            RawLlc::new(&b).unwrap()
        });
    let v1 = (
        prop::sample::select(vec![0x05u8, 0x00, 0x0a, 0x0f]),
        prop::collection::vec(any::<u8>(), 44),
    )
        .prop_map(|(t, mut b)| {
            b[0] = t;
            b[1] = 44;
            RawLlc::new(&b).unwrap()
        });
    prop_oneof![v2, v1]
}

fn v1_message() -> impl Strategy<Value = LlcMessage> {
    prop_oneof![
        (
            flags(),
            any::<[u8; 6]>(),
            any::<[u8; 16]>(),
            u24(),
            any::<u8>(),
            any::<u32>(),
            any::<u8>(),
            any::<u8>()
        )
            .prop_map(
                |(flags, mac, gid, qpn, link_num, link_uid, max_links, max_conns)| {
                    LlcMessage::ConfirmLink(ConfirmLink {
                        flags,
                        mac,
                        gid,
                        qpn,
                        link_num,
                        link_uid,
                        max_links,
                        max_conns,
                    })
                }
            ),
        (
            flags(),
            0u8..16,
            any::<[u8; 6]>(),
            any::<[u8; 16]>(),
            u24(),
            any::<u8>(),
            0u8..16,
            u24()
        )
            .prop_map(
                |(flags, rr, mac, gid, qpn, link_num, qp_mtu, initial_psn)| {
                    LlcMessage::AddLink(AddLink {
                        flags,
                        reject_reason: AddLinkRejectReason::from_code(rr),
                        mac,
                        gid,
                        qpn,
                        link_num,
                        qp_mtu,
                        initial_psn,
                    })
                }
            ),
        (flags(), any::<u8>(), any::<u8>(), cont_rkey(), cont_rkey()).prop_map(
            |(flags, link_num, num_rkeys, a, b)| LlcMessage::AddLinkCont(AddLinkCont {
                flags,
                link_num,
                num_rkeys,
                rkeys: [a, b],
            })
        ),
        (flags(), any::<u8>(), any::<u32>()).prop_map(|(flags, link_num, r)| {
            LlcMessage::DeleteLink(DeleteLink {
                flags,
                link_num,
                reason: DeleteLinkReason::from_code(r),
            })
        }),
        (flags(), prop::collection::vec(any::<[u8; 16]>(), 0..20))
            .prop_map(|(flags, gids)| { LlcMessage::ReqAddLink(ReqAddLink { flags, gids }) }),
        (
            flags(),
            any::<u8>(),
            any::<u32>(),
            any::<u64>(),
            rtoken(),
            rtoken()
        )
            .prop_map(|(flags, num_others, rkey, vaddr, a, b)| {
                LlcMessage::ConfirmRkey(ConfirmRkey {
                    flags,
                    num_others,
                    rkey,
                    vaddr,
                    others: [a, b],
                })
            }),
        (flags(), any::<[u8; 16]>())
            .prop_map(|(flags, user_data)| LlcMessage::TestLink(TestLink { flags, user_data })),
        (flags(), any::<u8>(), rtoken(), rtoken(), rtoken()).prop_map(
            |(flags, num_rkeys, a, b, c)| LlcMessage::ConfirmRkeyCont(ConfirmRkeyCont {
                flags,
                num_rkeys,
                rtokens: [a, b, c],
            })
        ),
        (flags(), any::<u8>(), any::<u8>(), any::<[u32; 8]>()).prop_map(
            |(flags, num_rkeys, err_mask, rkeys)| LlcMessage::DeleteRkey(DeleteRkey {
                flags,
                num_rkeys,
                err_mask,
                rkeys,
            })
        ),
    ]
}

fn add_link_v2() -> impl Strategy<Value = AddLinkV2> {
    let ext = (
        any::<bool>(),
        any::<[u8; 16]>(),
        prop::collection::vec(cont_rkey(), 0..40),
    )
        .prop_map(|(v2_direct, client_target_gid, rkeys)| AddLinkV2Ext {
            v2_direct,
            client_target_gid,
            rkeys,
        });
    (v1_message(), prop::option::of(ext)).prop_filter_map("an ADD_LINK base", |(m, ext)| match m {
        LlcMessage::AddLink(mut link) => {
            link.reject_reason = AddLinkRejectReason::NoReason;
            Some(AddLinkV2 { link, ext })
        }
        _ => None,
    })
}

fn v2_message() -> impl Strategy<Value = LlcMessage> {
    prop_oneof![
        // The types whose v2 body is the v1 body.
        v1_message().prop_filter_map("a type with the same v2 body", |m| match m {
            LlcMessage::ConfirmLink(_)
            | LlcMessage::DeleteLink(_)
            | LlcMessage::ConfirmRkey(_)
            | LlcMessage::TestLink(_) => Some(m.into_v2()),
            _ => None,
        }),
        add_link_v2().prop_map(LlcMessage::AddLinkV2),
        (
            flags(),
            any::<u8>(),
            prop::collection::vec(any::<u32>(), 0..=255)
        )
            .prop_map(|(flags, num_inval_rkeys, rkeys)| {
                LlcMessage::DeleteRkeyV2(DeleteRkeyV2 {
                    flags,
                    num_inval_rkeys,
                    rkeys,
                })
            }),
    ]
}

fn message() -> impl Strategy<Value = LlcMessage> {
    prop_oneof![
        4 => v1_message(),
        3 => v2_message(),
        1 => raw().prop_map(LlcMessage::Raw),
    ]
}

proptest! {
    #[test]
    fn valid_messages_round_trip(m in message()) {
        let bytes = m.to_bytes();
        prop_assert_eq!(bytes.len(), m.buffer_len());
        prop_assert_eq!(LlcMessage::parse(&bytes), Ok(m.clone()));
        prop_assert_eq!(classify(bytes[0]), if m.llc_type().is_known() {
            MsgKind::Llc(m.llc_type())
        } else {
            MsgKind::Unknown(bytes[0])
        });
    }

    #[test]
    fn v2_headers_say_their_length(m in v2_message()) {
        let b = m.to_bytes();
        prop_assert_eq!(b[0] >> 4, 2);
        prop_assert_eq!(usize::from(u16::from_ne_bytes([b[1], b[2]])), b.len());
        prop_assert!(b.len() >= 44 && b.len() <= 8192);
        // The kernel's LLC switch reads the base type: the v1 reading has the same flags,
        // and the same-body types convert back and forth without loss.
        let v1 = m.clone().into_v1();
        prop_assert_eq!(v1.flags(), m.flags());
        prop_assert_eq!(v1.llc_type().base(), m.llc_type().base());
        if b.len() == 44 && !matches!(m, LlcMessage::DeleteRkeyV2(_)) {
            prop_assert_eq!(v1.into_v2(), m);
        }
    }

    #[test]
    fn v2_length_field_is_checked(m in v2_message(), len in any::<u16>()) {
        let mut b = m.to_bytes();
        b[1..3].copy_from_slice(&len.to_ne_bytes());
        let r = LlcMessage::parse(&b);
        let l = usize::from(len);
        if l < 44 {
            prop_assert_eq!(r, Err(LlcError::V2LengthTooShort { found: len }));
        } else if l > 8192 {
            prop_assert_eq!(r, Err(LlcError::V2LengthTooLong { found: len }));
        } else if l > b.len() {
            prop_assert_eq!(r, Err(LlcError::Truncated { need: l, have: b.len() }));
        } else if let Ok(v) = r {
            prop_assert!(v.buffer_len() <= l);
            prop_assert_eq!(LlcMessage::parse(&v.to_bytes()), Ok(v));
        } else {
            let typed = matches!(
                r,
                Err(LlcError::ExtensionTruncated { .. } | LlcError::RkeyCountTooLarge { .. })
            );
            prop_assert!(typed, "{:?}", r);
        }
    }

    #[test]
    fn mutations_never_panic_and_reemit_consistently(
        m in message(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in any::<prop::sample::Index>(),
        keep_all in any::<bool>(),
    ) {
        let mut b = m.to_bytes();
        for (i, x) in flips {
            let i = i.index(b.len());
            b[i] ^= x;
        }
        if !keep_all {
            let n = cut.index(b.len() + 1);
            b.truncate(n);
        }
        if let Ok(v) = LlcMessage::parse(&b) {
            let again = v.to_bytes();
            prop_assert_eq!(LlcMessage::parse(&again), Ok(v));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(v) = LlcMessage::parse(&b) {
            prop_assert_eq!(LlcMessage::parse(&v.to_bytes()), Ok(v));
        }
        let _ = classify(b.first().copied().unwrap_or(0));
    }
}
