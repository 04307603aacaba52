//! Property tests: random valid messages of every family round-trip through bytes, and random
//! mutations and truncations of valid messages never panic; when they still parse, emitting
//! the result and parsing again gives the same value.

use netlink_packet_core::{NetlinkHeader, NetlinkPayload};
use proptest::prelude::*;
use smc_proto::netlink::ctrl::{CtrlMessage, FamilyInfo, FamilyOp, McastGroup};
use smc_proto::netlink::engine::*;
use smc_proto::netlink::framing::{self, GenlPayload, Message, NLM_F_MULTI};
use smc_proto::netlink::loopback::{
    LOOPBACK_FAMILY_ID, LoopbackAttr, LoopbackCmd, LoopbackMessage, Verdict,
};
use smc_proto::netlink::smc::*;

const SMC_ID: u16 = 0x1c;
const ENGINE_ID: u16 = 0x21;

fn text() -> impl Strategy<Value = String> {
    "[A-Za-z0-9 .:_-]{0,40}"
}

fn v2_common() -> impl Strategy<Value = LgrV2Common> {
    (any::<u8>(), any::<u8>(), any::<u8>(), text(), text()).prop_map(
        |(ver, rel, os, peer_host, neg_eid)| LgrV2Common {
            ver,
            rel,
            os,
            peer_host,
            neg_eid,
            other: vec![],
        },
    )
}

fn sys_info() -> impl Strategy<Value = SysInfo> {
    (
        any::<u8>(),
        any::<u8>(),
        any::<bool>(),
        proptest::option::of(any::<bool>()),
        proptest::option::of(text()),
        proptest::option::of(text()),
    )
        .prop_map(
            |(ver, rel, is_ism_v2, is_smcr_v2, local_host, seid)| SysInfo {
                ver,
                rel,
                is_ism_v2,
                is_smcr_v2,
                local_host,
                seid,
                other: vec![],
            },
        )
}

fn lgr_smcd() -> impl Strategy<Value = LgrSmcd> {
    (
        (
            any::<u32>(),
            any::<u64>(),
            proptest::option::of(any::<u64>()),
            any::<u64>(),
        ),
        (
            proptest::option::of(any::<u64>()),
            any::<u8>(),
            any::<u32>(),
            any::<u32>(),
        ),
        (
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u64>()),
            text(),
            proptest::option::of(v2_common()),
        ),
    )
        .prop_map(
            |(
                (id, gid, ext_gid, peer_gid),
                (peer_ext_gid, vlan_id, conns_num, chid),
                (s, d, pnetid, v2),
            )| {
                LgrSmcd {
                    id,
                    gid,
                    ext_gid,
                    peer_gid,
                    peer_ext_gid,
                    vlan_id,
                    conns_num,
                    chid,
                    sndbuf_alloc: s,
                    dmb_alloc: d,
                    pnetid,
                    v2_common: v2,
                    other: vec![],
                }
            },
        )
}

fn lgr_smcr() -> impl Strategy<Value = LgrSmcr> {
    (
        (
            any::<u32>(),
            any::<u32>(),
            any::<u8>(),
            any::<u8>(),
            proptest::option::of(any::<u8>()),
        ),
        (any::<u8>(), proptest::option::of(any::<u64>()), text()),
        (
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u64>()),
        ),
        proptest::option::of(v2_common()),
        proptest::option::of((
            any::<bool>(),
            proptest::option::of(any::<u8>()),
            proptest::option::of(any::<u8>()),
        )),
    )
        .prop_map(
            |(
                (id, conns_num, role, lgr_type, buf_type),
                (vlan_id, net_cookie, pnetid),
                (sa, ra),
                c,
                v2,
            )| {
                LgrSmcr {
                    id,
                    conns_num,
                    role,
                    lgr_type,
                    buf_type,
                    vlan_id,
                    net_cookie,
                    pnetid,
                    sndbuf_alloc: sa,
                    rmb_alloc: ra,
                    v2_common: c,
                    v2: v2.map(|(direct, max_conns, max_links)| LgrSmcrV2 {
                        direct,
                        max_conns,
                        max_links,
                        other: vec![],
                    }),
                    other: vec![],
                }
            },
        )
}

fn link_smcr() -> impl Strategy<Value = LinkSmcr> {
    (
        (
            any::<u8>(),
            any::<u32>(),
            any::<u32>(),
            any::<u8>(),
            any::<u32>(),
        ),
        (text(), any::<u32>(), any::<u32>(), text(), text()),
    )
        .prop_map(
            |((id, state, conn_cnt, ib_port, net_dev), (ib_dev, uid, peer_uid, gid, peer_gid))| {
                LinkSmcr {
                    id,
                    state,
                    conn_cnt,
                    ib_port,
                    net_dev,
                    ib_dev,
                    uid,
                    peer_uid,
                    gid,
                    peer_gid,
                    other: vec![],
                }
            },
        )
}

fn dev_port() -> impl Strategy<Value = DevPort> {
    (
        any::<bool>(),
        text(),
        proptest::option::of(any::<u32>()),
        proptest::option::of(any::<bool>()),
        proptest::option::of(any::<u8>()),
        proptest::option::of(any::<u32>()),
    )
        .prop_map(
            |(pnet_usr, pnetid, netdev, valid, state, lnk_cnt)| DevPort {
                pnet_usr,
                pnetid,
                netdev,
                valid,
                state,
                lnk_cnt,
                other: vec![],
            },
        )
}

fn dev_info() -> impl Strategy<Value = DevInfo> {
    (
        (
            proptest::option::of(any::<u32>()),
            any::<bool>(),
            proptest::option::of(any::<u32>()),
        ),
        (
            proptest::option::of(any::<u16>()),
            proptest::option::of(any::<u16>()),
            proptest::option::of(any::<u16>()),
        ),
        (proptest::option::of(text()), proptest::option::of(text())),
        (
            proptest::option::of(dev_port()),
            proptest::option::of(dev_port()),
        ),
    )
        .prop_map(
            |(
                (use_cnt, is_crit, pci_fid),
                (pci_chid, pci_vendor, pci_device),
                (pci_id, ib_name),
                (port, port2),
            )| {
                DevInfo {
                    use_cnt,
                    is_crit,
                    pci_fid,
                    pci_chid,
                    pci_vendor,
                    pci_device,
                    pci_id,
                    ib_name,
                    port,
                    port2,
                    other: vec![],
                }
            },
        )
}

fn stats_tech() -> impl Strategy<Value = StatsTech> {
    (
        prop::array::uniform7(any::<u64>()),
        prop::array::uniform7(any::<u64>()),
        prop::array::uniform9(any::<u64>()),
        prop::array::uniform9(any::<u64>()),
        prop::array::uniform13(any::<u64>()),
        (
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u64>()),
        ),
    )
        .prop_map(|(t, r, p1, p2, c, (ru, tu))| {
            let rmb = |a: [u64; 7]| RmbStats {
                reuse_cnt: a[0],
                size_sm_peer_cnt: a[1],
                size_sm_cnt: a[2],
                full_peer_cnt: a[3],
                full_cnt: a[4],
                alloc_cnt: a[5],
                dgrade_cnt: a[6],
            };
            StatsTech {
                tx_rmb_stats: rmb(t),
                rx_rmb_stats: rmb(r),
                tx_pload: SizeBuckets(p1),
                rx_pload: SizeBuckets(p2),
                tx_rmb_size: SizeBuckets(p2),
                rx_rmb_size: SizeBuckets(p1),
                clnt_v1_succ: c[0],
                clnt_v2_succ: c[1],
                srv_v1_succ: c[2],
                srv_v2_succ: c[3],
                rx_bytes: c[4],
                tx_bytes: c[5],
                rx_rmb_usage: ru,
                tx_rmb_usage: tu,
                rx_cnt: c[6],
                tx_cnt: c[7],
                sendpage_cnt: c[8],
                cork_cnt: c[9],
                ndly_cnt: c[10],
                splice_cnt: c[11],
                urg_data_cnt: c[12],
                other: vec![],
            }
        })
}

fn stats() -> impl Strategy<Value = StatsReply> {
    (stats_tech(), stats_tech(), any::<u64>(), any::<u64>()).prop_map(|(smcd, smcr, c, s)| {
        StatsReply {
            smcd,
            smcr,
            clnt_hs_err_cnt: c,
            srv_hs_err_cnt: s,
            other: vec![],
        }
    })
}

fn fback() -> impl Strategy<Value = FbackStats> {
    (
        any::<bool>(),
        proptest::option::of(any::<u64>()),
        proptest::option::of(any::<u64>()),
        any::<u32>(),
        any::<u16>(),
    )
        .prop_map(
            |(is_server, srv_cnt, clnt_cnt, rsn_code, rsn_cnt)| FbackStats {
                is_server,
                srv_cnt,
                clnt_cnt,
                rsn_code,
                rsn_cnt,
                other: vec![],
            },
        )
}

fn ueid() -> impl Strategy<Value = Ueid> {
    "[A-Z0-9][A-Z0-9.-]{0,31}".prop_map(|s| Ueid::new(&s).unwrap())
}

fn smc_message() -> impl Strategy<Value = SmcGenlMessage> {
    prop_oneof![
        sys_info().prop_map(|x| SmcGenlMessage::sys_info_reply(&x)),
        lgr_smcd().prop_map(|x| SmcGenlMessage::lgr_smcd_reply(&x)),
        lgr_smcr().prop_map(|x| SmcGenlMessage::lgr_smcr_reply(&x)),
        link_smcr().prop_map(|x| SmcGenlMessage::link_smcr_reply(&x)),
        dev_info().prop_map(|x| SmcGenlMessage::dev_smcd_reply(&x)),
        dev_info().prop_map(|x| SmcGenlMessage::dev_smcr_reply(&x)),
        stats().prop_map(|x| SmcGenlMessage::stats_reply(&x)),
        fback().prop_map(|x| SmcGenlMessage::fback_stats_reply(&x)),
        ueid().prop_map(|x| SmcGenlMessage::ueid_reply(&x)),
        ueid().prop_map(|x| SmcGenlMessage::add_ueid(&x)),
        proptest::option::of((text(), any::<bool>())).prop_map(|s| SmcGenlMessage::seid_reply(
            s.map(|(seid, enabled)| SeidInfo { seid, enabled }).as_ref()
        )),
        any::<bool>().prop_map(SmcGenlMessage::hs_limitation_reply),
        (1u8..=18).prop_map(|c| SmcGenlMessage::request(c.into())),
    ]
}

fn selector() -> impl Strategy<Value = Option<NetnsSelector>> {
    proptest::option::of(prop_oneof![
        any::<u64>().prop_map(NetnsSelector::Inode),
        text().prop_map(NetnsSelector::Path),
        any::<u32>().prop_map(NetnsSelector::Pid),
        text().prop_map(NetnsSelector::Name),
    ])
}

fn sysctl_value() -> impl Strategy<Value = SysctlValue> {
    prop_oneof![
        any::<u64>().prop_map(SysctlValue::Num),
        text().prop_map(SysctlValue::Str)
    ]
}

fn sysctl_info() -> impl Strategy<Value = SysctlInfo> {
    (
        (
            text(),
            proptest::option::of(any::<u8>()),
            proptest::option::of(sysctl_value()),
        ),
        (
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u64>()),
        ),
        (
            proptest::option::of(sysctl_value()),
            proptest::option::of(text()),
        ),
        (
            proptest::option::of(text()),
            proptest::option::of(any::<u32>()),
        ),
    )
        .prop_map(
            |((name, kind, value), (min, max), (default, description), (unit, flags))| SysctlInfo {
                name,
                kind: kind.map(Into::into),
                value,
                min,
                max,
                default,
                description,
                unit,
                flags,
                other: vec![],
            },
        )
}

fn cursor() -> impl Strategy<Value = Cursor> {
    (any::<u16>(), any::<u32>()).prop_map(|(wrap, count)| Cursor { wrap, count })
}

fn sock_info() -> impl Strategy<Value = SockInfo> {
    let addr = proptest::option::of(any::<std::net::SocketAddr>());
    (
        (
            any::<u8>(),
            any::<u32>(),
            any::<u64>(),
            any::<bool>(),
            addr.clone(),
            addr,
        ),
        (
            any::<u32>(),
            any::<u8>(),
            any::<u32>(),
            any::<u32>(),
            any::<u8>(),
            any::<u64>(),
        ),
        (
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u8>()),
            proptest::option::of(any::<u32>()),
        ),
        proptest::option::of((
            prop::array::uniform4(any::<u32>()),
            prop::array::uniform7(cursor()),
            prop::array::uniform4(any::<u8>()),
        )),
        proptest::option::of(prop::array::uniform6(any::<u64>())),
        proptest::option::of((any::<u8>(), text(), any::<u8>(), text(), text())),
    )
        .prop_map(
            |(
                (state, uid, inode, v6, local, peer),
                (ifindex, mode, fb, pd, shutdown, ns),
                (pid, role, lgr_id),
                conn,
                d,
                r,
            )| {
                // Both addresses of a socket share one family.
                let fix = |a: Option<std::net::SocketAddr>| {
                    a.map(|a| match (v6, a) {
                        (true, std::net::SocketAddr::V4(x)) => {
                            std::net::SocketAddr::new(x.ip().to_ipv6_mapped().into(), x.port())
                        }
                        (false, std::net::SocketAddr::V6(x)) => std::net::SocketAddr::new(
                            std::net::Ipv4Addr::from(
                                x.ip().octets()[12..16]
                                    .try_into()
                                    .map(u32::from_be_bytes)
                                    .unwrap(),
                            )
                            .into(),
                            x.port(),
                        ),
                        (_, a) => a,
                    })
                    // Neither smc_diag nor the engine family carries IPv6 flow info or scope ids.
                    .map(|a| std::net::SocketAddr::new(a.ip(), a.port()))
                };
                SockInfo {
                    state,
                    uid,
                    inode,
                    local: fix(local),
                    peer: fix(peer),
                    ifindex,
                    mode: mode.into(),
                    fallback_reason: fb,
                    peer_diagnosis: pd,
                    shutdown,
                    netns_inode: ns,
                    pid,
                    role,
                    lgr_id,
                    conn: conn.map(|(s, c, f)| ConnInfo {
                        token: s[0],
                        sndbuf_size: s[1],
                        rmbe_size: s[2],
                        peer_rmbe_size: s[3],
                        rx_prod: c[0],
                        rx_cons: c[1],
                        tx_prod: c[2],
                        tx_cons: c[3],
                        tx_prep: c[4],
                        tx_sent: c[5],
                        tx_fin: c[6],
                        rx_prod_flags: f[0],
                        rx_conn_state_flags: f[1],
                        tx_prod_flags: f[2],
                        tx_conn_state_flags: f[3],
                    }),
                    smcd: d.map(|g| SmcdSockInfo {
                        gid: g[0],
                        gid_ext: g[1],
                        peer_gid: g[2],
                        peer_gid_ext: g[3],
                        token: g[4],
                        peer_token: g[5],
                    }),
                    smcr: r.map(|(link_id, ib_dev, ib_port, gid, peer_gid)| SmcrSockInfo {
                        link_id,
                        ib_dev,
                        ib_port,
                        gid,
                        peer_gid,
                    }),
                    other: vec![],
                }
            },
        )
}

fn engine_message() -> impl Strategy<Value = EngineMessage> {
    prop_oneof![
        selector().prop_map(|s| EngineMessage::sysctl_list(s.as_ref())),
        (selector(), text()).prop_map(|(s, n)| EngineMessage::sysctl_get(s.as_ref(), &n)),
        (selector(), text(), sysctl_value()).prop_map(|(s, n, v)| EngineMessage::sysctl_set(
            s.as_ref(),
            &n,
            v
        )),
        Just(EngineMessage::netns_list()),
        (selector(), proptest::option::of(any::<u32>()))
            .prop_map(|(s, m)| EngineMessage::sock_dump(s.as_ref(), m)),
        (selector(), proptest::option::of(any::<u32>()))
            .prop_map(|(s, m)| EngineMessage::stats_reset(s.as_ref(), m)),
        (any::<u64>(), sysctl_info()).prop_map(|(ns, i)| EngineMessage::sysctl_reply(
            EngineCmd::SysctlGet,
            ns,
            &i
        )),
        (
            any::<u64>(),
            proptest::option::of(text()),
            any::<u32>(),
            any::<u32>(),
            any::<u32>()
        )
            .prop_map(|(inode, name, sock_cnt, lgr_cnt, listen_cnt)| {
                EngineMessage::netns_reply(&NetnsInfo {
                    inode,
                    name,
                    sock_cnt,
                    lgr_cnt,
                    listen_cnt,
                    other: vec![],
                })
            }),
        sock_info().prop_map(|s| EngineMessage::sock_reply(&s)),
    ]
}

fn ctrl_message() -> impl Strategy<Value = CtrlMessage> {
    prop_oneof![
        text().prop_map(|n| CtrlMessage::get_family_by_name(&n)),
        any::<u16>().prop_map(CtrlMessage::get_family_by_id),
        (
            any::<u16>(),
            text(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            prop::collection::vec((any::<u32>(), any::<u32>()), 0..20),
            prop::collection::vec((text(), any::<u32>()), 0..3),
        )
            .prop_map(
                |(id, name, version, hdrsize, maxattr, ops, groups)| FamilyInfo {
                    id,
                    name,
                    version,
                    hdrsize,
                    maxattr,
                    ops: ops
                        .into_iter()
                        .map(|(id, flags)| FamilyOp { id, flags })
                        .collect(),
                    mcast_groups: groups
                        .into_iter()
                        .map(|(name, id)| McastGroup { name, id })
                        .collect(),
                }
                .to_reply()
            ),
    ]
}

fn payload_of<T: GenlPayload + Clone>(m: &Message<T>) -> T {
    match &m.payload {
        NetlinkPayload::InnerMessage(g) => g.payload.clone(),
        other => panic!("not a family message: {other:?}"),
    }
}

fn socket_addr() -> impl Strategy<Value = std::net::SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| (ip, port).into()),
        (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, port)| (ip, port).into()),
    ]
}

fn loopback_attr() -> impl Strategy<Value = LoopbackAttr> {
    use LoopbackAttr as A;
    prop_oneof![
        any::<u32>().prop_map(A::Version),
        any::<u32>().prop_map(A::Pid),
        any::<u64>().prop_map(A::SessionKey),
        any::<u64>().prop_map(A::Netns),
        any::<u128>().prop_map(A::Gid),
        any::<u32>().prop_map(A::EngineId),
        text().prop_map(A::Seid),
        text().prop_map(A::Hostname),
        any::<u16>().prop_map(A::Chid),
        socket_addr().prop_map(A::LocalAddr),
        socket_addr().prop_map(A::RemoteAddr),
        any::<u32>().prop_map(A::Backlog),
        any::<bool>().prop_map(A::HsLimit),
        any::<u32>().prop_map(A::ListenerId),
        any::<u8>().prop_map(|v| A::Verdict(Verdict::from(v))),
        any::<u32>().prop_map(A::Reason),
        any::<u64>().prop_map(A::IntentId),
        any::<bool>().prop_map(A::Ok),
        any::<u64>().prop_map(A::Token),
        any::<u32>().prop_map(A::Size),
        any::<u128>().prop_map(A::PeerGid),
        any::<bool>().prop_map(A::SynOption),
        (100u16..0x3fff, prop::collection::vec(any::<u8>(), 0..12))
            .prop_map(|(k, v)| A::Other(netlink_packet_core::DefaultNla::new(k, v))),
    ]
}

fn loopback_message() -> impl Strategy<Value = LoopbackMessage> {
    (any::<u8>(), prop::collection::vec(loopback_attr(), 0..8))
        .prop_map(|(cmd, attrs)| LoopbackMessage::new(LoopbackCmd::from(cmd), attrs))
}

fn round_trip<T: GenlPayload + Clone + PartialEq>(family: u16, p: T) -> T {
    let bytes = framing::to_bytes(&framing::message(family, p, NLM_F_MULTI, 1, 2)).unwrap();
    let msgs = framing::parse_family_messages::<T>(&bytes, family).unwrap();
    assert_eq!(msgs.len(), 1);
    payload_of(&msgs[0])
}

/// The header fields that survive re-encoding (the length is recomputed).
fn headers_sans_len<T>(msgs: &[Message<T>]) -> Vec<NetlinkHeader> {
    msgs.iter()
        .map(|m| {
            let mut h = m.header;
            h.length = 0;
            h
        })
        .collect()
}

/// Parses `bytes` as family `T`; when that works, re-emits and re-parses and checks the value.
fn check_consistent<T: GenlPayload + Clone + PartialEq>(bytes: &[u8]) {
    let Ok(first) = framing::parse_messages::<T>(bytes) else {
        return;
    };
    let again = framing::to_bytes_many(&first).expect("a parsed message re-emits");
    let second = framing::parse_messages::<T>(&again).expect("re-emitted bytes parse");
    assert_eq!(headers_sans_len(&first), headers_sans_len(&second));
    let p1: Vec<_> = first.into_iter().map(|m| m.payload).collect();
    let p2: Vec<_> = second.into_iter().map(|m| m.payload).collect();
    assert_eq!(p1, p2);
}

fn check_all(bytes: &[u8]) {
    check_consistent::<SmcGenlMessage>(bytes);
    check_consistent::<EngineMessage>(bytes);
    check_consistent::<CtrlMessage>(bytes);
    check_consistent::<LoopbackMessage>(bytes);
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        (any::<usize>(), 1usize..8).prop_map(|(i, n)| Mutation::Remove(i, n)),
    ]
}

fn apply(bytes: &mut Vec<u8>, muts: &[Mutation]) {
    for m in muts {
        if bytes.is_empty() {
            return;
        }
        let n = bytes.len();
        match m {
            Mutation::Flip(i, b) => bytes[i % n] ^= b | 1,
            Mutation::Truncate(i) => bytes.truncate(i % n),
            Mutation::Insert(i, v) => {
                let at = i % (n + 1);
                bytes.splice(at..at, v.iter().copied());
            }
            Mutation::Remove(i, k) => {
                let at = i % n;
                let end = (at + k).min(n);
                bytes.drain(at..end);
            }
        }
    }
}

proptest! {
    #[test]
    fn smc_messages_round_trip(m in smc_message()) {
        prop_assert_eq!(round_trip(SMC_ID, m.clone()), m);
    }

    #[test]
    fn smc_structs_round_trip(l in lgr_smcd(), r in lgr_smcr(), d in dev_info(), s in stats(), i in sys_info()) {
        prop_assert_eq!(round_trip(SMC_ID, SmcGenlMessage::lgr_smcd_reply(&l)).lgr_smcd(), Some(l));
        prop_assert_eq!(round_trip(SMC_ID, SmcGenlMessage::lgr_smcr_reply(&r)).lgr_smcr(), Some(r));
        prop_assert_eq!(round_trip(SMC_ID, SmcGenlMessage::dev_smcr_reply(&d)).dev_smcr(), Some(d));
        prop_assert_eq!(round_trip(SMC_ID, SmcGenlMessage::stats_reply(&s)).stats(), Some(s));
        prop_assert_eq!(round_trip(SMC_ID, SmcGenlMessage::sys_info_reply(&i)).sys_info(), Some(i));
    }

    #[test]
    fn engine_messages_round_trip(m in engine_message()) {
        prop_assert_eq!(round_trip(ENGINE_ID, m.clone()), m);
    }

    #[test]
    fn engine_structs_round_trip(s in sock_info(), c in sysctl_info()) {
        prop_assert_eq!(round_trip(ENGINE_ID, EngineMessage::sock_reply(&s)).sock(), Some(s));
        prop_assert_eq!(round_trip(ENGINE_ID, EngineMessage::sysctl_reply(EngineCmd::SysctlList, 1, &c)).sysctl(), Some(c));
    }

    #[test]
    fn ctrl_messages_round_trip(m in ctrl_message()) {
        prop_assert_eq!(round_trip(16, m.clone()), m);
    }

    #[test]
    fn loopback_messages_round_trip(m in loopback_message()) {
        prop_assert_eq!(round_trip(LOOPBACK_FAMILY_ID, m.clone()), m);
    }

    #[test]
    fn mutated_messages_never_panic(
        smc in smc_message(),
        eng in engine_message(),
        ctl in ctrl_message(),
        lo in loopback_message(),
        which in 0usize..5,
        muts in prop::collection::vec(mutation(), 1..6),
    ) {
        let req = framing::split_messages(&framing::to_bytes(&framing::dump_request(SMC_ID, SmcGenlMessage::request(SmcCmd::GetStats), 1, false)).unwrap()).unwrap()[0].header;
        let mut bytes = match which {
            0 => framing::to_bytes(&framing::message(SMC_ID, smc, 0, 1, 2)).unwrap(),
            1 => framing::to_bytes(&framing::message(ENGINE_ID, eng, 0, 1, 2)).unwrap(),
            2 => framing::to_bytes(&framing::message(16, ctl, 0, 1, 2)).unwrap(),
            3 => framing::to_bytes(&framing::message(LOOPBACK_FAMILY_ID, lo, 0, 1, 2)).unwrap(),
            _ => framing::to_bytes_many(&framing::dump_reply(SMC_ID, &req, [smc])).unwrap(),
        };
        apply(&mut bytes, &muts);
        check_all(&bytes);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        check_all(&bytes);
    }

    #[test]
    fn bucket_index_matches_kernel(len in 1u64..(1 << 24)) {
        // fls((len - 1) >> 13), capped at 8.
        let v = (len - 1) >> 13;
        let fls = if v == 0 { 0 } else { 64 - v.leading_zeros() as usize };
        prop_assert_eq!(SizeBuckets::index_for(len), fls.min(8));
    }
}
