//! `SMCD_ENGINE` messages: bytes -> parse -> expected value and value -> emit -> same bytes,
//! written out by hand from the numbering in `netlink::engine`.
#![cfg(target_endian = "little")]

use std::net::SocketAddr;

use netlink_packet_core::NetlinkPayload;
use smc_proto::netlink::ctrl::FamilyInfo;
use smc_proto::netlink::engine::*;
use smc_proto::netlink::framing::{self, NLM_F_ACK, NLM_F_DUMP, NLM_F_MULTI, NLM_F_REQUEST};

const FAMILY: u16 = 0x21;

fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&((4 + value.len()) as u16).to_le_bytes());
    v.extend_from_slice(&kind.to_le_bytes());
    v.extend_from_slice(value);
    while v.len() % 4 != 0 {
        v.push(0);
    }
    v
}
fn nest(kind: u16, parts: &[Vec<u8>]) -> Vec<u8> {
    nla(kind | 0x8000, &parts.concat())
}
fn s(kind: u16, x: &str) -> Vec<u8> {
    let mut b = x.as_bytes().to_vec();
    b.push(0);
    nla(kind, &b)
}
fn u8a(k: u16, x: u8) -> Vec<u8> {
    nla(k, &[x])
}
fn u16a(k: u16, x: u16) -> Vec<u8> {
    nla(k, &x.to_le_bytes())
}
fn u32a(k: u16, x: u32) -> Vec<u8> {
    nla(k, &x.to_le_bytes())
}
fn u64a(k: u16, x: u64) -> Vec<u8> {
    nla(k, &x.to_le_bytes())
}
fn msg(flags: u16, seq: u32, cmd: u8, attrs: &[Vec<u8>]) -> Vec<u8> {
    let body = attrs.concat();
    let mut v = Vec::new();
    v.extend_from_slice(&((20 + body.len()) as u32).to_le_bytes());
    v.extend_from_slice(&FAMILY.to_le_bytes());
    v.extend_from_slice(&flags.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&[cmd, 1, 0, 0]);
    v.extend_from_slice(&body);
    v
}

fn parse(bytes: &[u8]) -> EngineMessage {
    let m = framing::parse_family_messages::<EngineMessage>(bytes, FAMILY)
        .unwrap()
        .remove(0);
    match m.payload {
        NetlinkPayload::InnerMessage(g) => g.payload,
        _ => panic!(),
    }
}

fn emit(p: EngineMessage, flags: u16, seq: u32) -> Vec<u8> {
    framing::to_bytes(&framing::message(FAMILY, p, flags, seq, 0)).unwrap()
}

#[test]
fn sysctl_requests_both_ways() {
    let sel = NetnsSelector::Name("blue".into());
    let get = msg(
        NLM_F_REQUEST,
        1,
        ENGINE_CMD_SYSCTL_GET,
        &[
            nest(ENGINE_A_NETNS, &[s(ENGINE_NETNS_SEL_NAME, "blue")]),
            nest(ENGINE_A_SYSCTL, &[s(ENGINE_SYSCTL_NAME, "wmem")]),
        ],
    );
    let m = parse(&get);
    assert_eq!(m.cmd, EngineCmd::SysctlGet);
    assert_eq!(m.netns_selector(), Some(sel.clone()));
    assert_eq!(m.sysctl().unwrap().name, "wmem");
    assert_eq!(
        emit(
            EngineMessage::sysctl_get(Some(&sel), "wmem"),
            NLM_F_REQUEST,
            1
        ),
        get
    );

    let set = msg(
        NLM_F_REQUEST | NLM_F_ACK,
        2,
        ENGINE_CMD_SYSCTL_SET,
        &[
            nest(ENGINE_A_NETNS, &[u64a(ENGINE_NETNS_SEL_INODE, 4026531840)]),
            nest(
                ENGINE_A_SYSCTL,
                &[
                    s(ENGINE_SYSCTL_NAME, "autocorking_size"),
                    u64a(ENGINE_SYSCTL_VALUE, 0),
                ],
            ),
        ],
    );
    let m = parse(&set);
    assert_eq!(m.netns_selector(), Some(NetnsSelector::Inode(4026531840)));
    assert_eq!(m.sysctl().unwrap().value, Some(SysctlValue::Num(0)));
    let built = EngineMessage::sysctl_set(
        Some(&NetnsSelector::Inode(4026531840)),
        "autocorking_size",
        SysctlValue::Num(0),
    );
    assert_eq!(emit(built, NLM_F_REQUEST | NLM_F_ACK, 2), set);

    let hs = EngineMessage::sysctl_set(
        Some(&NetnsSelector::Path("/run/netns/red".into())),
        "hs_ctrl",
        SysctlValue::Str("prio".into()),
    );
    let b = emit(hs.clone(), NLM_F_REQUEST, 3);
    assert_eq!(parse(&b), hs);
    assert_eq!(
        EngineMessage::sysctl_list(Some(&NetnsSelector::Pid(1))).netns_selector(),
        Some(NetnsSelector::Pid(1))
    );
}

#[test]
fn sysctl_list_reply_both_ways() {
    let bytes = msg(
        NLM_F_MULTI,
        4,
        ENGINE_CMD_SYSCTL_LIST,
        &[
            u64a(ENGINE_A_NETNS_INODE, 4026531840),
            nest(
                ENGINE_A_SYSCTL,
                &[
                    s(ENGINE_SYSCTL_NAME, "wmem"),
                    u8a(ENGINE_SYSCTL_TYPE, 0),
                    u64a(ENGINE_SYSCTL_VALUE, 65536),
                    u64a(ENGINE_SYSCTL_MIN, 16384),
                    u64a(ENGINE_SYSCTL_MAX, 0x3fff_ffff),
                    u64a(ENGINE_SYSCTL_DEFAULT, 65536),
                    s(ENGINE_SYSCTL_DESC, "initial send buffer size"),
                    s(ENGINE_SYSCTL_UNIT, "bytes"),
                    u32a(ENGINE_SYSCTL_FLAGS, 0),
                ],
            ),
        ],
    );
    let info = SysctlInfo {
        name: "wmem".into(),
        kind: Some(SysctlType::Int),
        value: Some(SysctlValue::Num(65536)),
        min: Some(16384),
        max: Some(0x3fff_ffff),
        default: Some(SysctlValue::Num(65536)),
        description: Some("initial send buffer size".into()),
        unit: Some("bytes".into()),
        flags: Some(0),
        other: vec![],
    };
    let m = parse(&bytes);
    assert_eq!(m.netns_inode(), Some(4026531840));
    assert_eq!(m.sysctl(), Some(info.clone()));
    assert_eq!(
        emit(
            EngineMessage::sysctl_reply(EngineCmd::SysctlList, 4026531840, &info),
            NLM_F_MULTI,
            4
        ),
        bytes
    );
}

#[test]
fn netns_list_both_ways() {
    let req = msg(NLM_F_REQUEST | NLM_F_DUMP, 5, ENGINE_CMD_NETNS_LIST, &[]);
    assert_eq!(parse(&req), EngineMessage::netns_list());
    let reply = msg(
        NLM_F_MULTI,
        5,
        ENGINE_CMD_NETNS_LIST,
        &[nest(
            ENGINE_A_NETNS_ENTRY,
            &[
                u64a(ENGINE_NETNS_INODE, 4026532000),
                s(ENGINE_NETNS_NAME, "blue"),
                u32a(ENGINE_NETNS_SOCK_CNT, 3),
                u32a(ENGINE_NETNS_LGR_CNT, 1),
                u32a(ENGINE_NETNS_LISTEN_CNT, 1),
            ],
        )],
    );
    let ns = NetnsInfo {
        inode: 4026532000,
        name: Some("blue".into()),
        sock_cnt: 3,
        lgr_cnt: 1,
        listen_cnt: 1,
        other: vec![],
    };
    assert_eq!(parse(&reply).netns_entry(), Some(ns.clone()));
    assert_eq!(emit(EngineMessage::netns_reply(&ns), NLM_F_MULTI, 5), reply);
}

fn smcd_sock() -> SockInfo {
    SockInfo {
        state: 1,
        uid: 1000,
        inode: 123456,
        local: Some("127.0.0.1:5000".parse::<SocketAddr>().unwrap()),
        peer: Some("127.0.0.1:40000".parse::<SocketAddr>().unwrap()),
        ifindex: 1,
        mode: DiagMode::Smcd,
        fallback_reason: 0,
        peer_diagnosis: 0,
        shutdown: 0,
        netns_inode: 4026531840,
        pid: Some(4242),
        role: Some(1),
        lgr_id: Some(0x100),
        conn: Some(ConnInfo {
            token: 7,
            sndbuf_size: 65536,
            rmbe_size: 65504,
            peer_rmbe_size: 65504,
            rx_prod: Cursor { wrap: 1, count: 10 },
            rx_cons: Cursor { wrap: 1, count: 10 },
            tx_prod: Cursor { wrap: 0, count: 20 },
            tx_cons: Cursor { wrap: 0, count: 5 },
            tx_prep: Cursor { wrap: 0, count: 20 },
            tx_sent: Cursor { wrap: 0, count: 20 },
            tx_fin: Cursor { wrap: 0, count: 20 },
            rx_prod_flags: 0,
            rx_conn_state_flags: 0,
            tx_prod_flags: 0,
            tx_conn_state_flags: 0,
        }),
        smcd: Some(SmcdSockInfo {
            gid: 0x1122,
            gid_ext: 0x3344,
            peer_gid: 0x1122,
            peer_gid_ext: 0x3344,
            token: 0xaaaa,
            peer_token: 0xbbbb,
        }),
        smcr: None,
        other: vec![],
    }
}

#[test]
fn sock_dump_both_ways() {
    let req = msg(
        NLM_F_REQUEST | NLM_F_DUMP,
        6,
        ENGINE_CMD_SOCK_DUMP,
        &[
            nest(ENGINE_A_NETNS, &[u32a(ENGINE_NETNS_SEL_PID, 4242)]),
            u32a(ENGINE_A_SOCK_STATES, 1 << 1 | 1 << 10),
        ],
    );
    let m = parse(&req);
    assert_eq!(m.sock_states(), Some(0x402));
    assert_eq!(
        emit(
            EngineMessage::sock_dump(Some(&NetnsSelector::Pid(4242)), Some(0x402)),
            NLM_F_REQUEST | NLM_F_DUMP,
            6
        ),
        req
    );

    let cur = |w: u16, c: u32| (u64::from(w) << 32) | u64::from(c);
    let reply = msg(
        NLM_F_MULTI,
        6,
        ENGINE_CMD_SOCK_DUMP,
        &[nest(
            ENGINE_A_SOCK,
            &[
                u8a(ENGINE_SOCK_STATE, 1),
                u32a(ENGINE_SOCK_UID, 1000),
                u64a(ENGINE_SOCK_INODE, 123456),
                u8a(ENGINE_SOCK_FAMILY, 2),
                nla(ENGINE_SOCK_LOCAL_ADDR, &[127, 0, 0, 1]),
                u16a(ENGINE_SOCK_LOCAL_PORT, 5000),
                nla(ENGINE_SOCK_PEER_ADDR, &[127, 0, 0, 1]),
                u16a(ENGINE_SOCK_PEER_PORT, 40000),
                u32a(ENGINE_SOCK_IFINDEX, 1),
                u8a(ENGINE_SOCK_MODE, 2),
                u32a(ENGINE_SOCK_FALLBACK, 0),
                u32a(ENGINE_SOCK_PEER_DIAGNOSIS, 0),
                u8a(ENGINE_SOCK_SHUTDOWN, 0),
                u32a(ENGINE_SOCK_TOKEN, 7),
                u32a(ENGINE_SOCK_SNDBUF_SIZE, 65536),
                u32a(ENGINE_SOCK_RMBE_SIZE, 65504),
                u32a(ENGINE_SOCK_PEER_RMBE_SIZE, 65504),
                u64a(ENGINE_SOCK_RX_PROD, cur(1, 10)),
                u64a(ENGINE_SOCK_RX_CONS, cur(1, 10)),
                u64a(ENGINE_SOCK_TX_PROD, cur(0, 20)),
                u64a(ENGINE_SOCK_TX_CONS, cur(0, 5)),
                u64a(ENGINE_SOCK_TX_PREP, cur(0, 20)),
                u64a(ENGINE_SOCK_TX_SENT, cur(0, 20)),
                u64a(ENGINE_SOCK_TX_FIN, cur(0, 20)),
                u8a(ENGINE_SOCK_RX_PROD_FLAGS, 0),
                u8a(ENGINE_SOCK_RX_CONN_STATE_FLAGS, 0),
                u8a(ENGINE_SOCK_TX_PROD_FLAGS, 0),
                u8a(ENGINE_SOCK_TX_CONN_STATE_FLAGS, 0),
                u32a(ENGINE_SOCK_LGR_ID, 0x100),
                u64a(ENGINE_SOCK_LOCAL_GID, 0x1122),
                u64a(ENGINE_SOCK_LOCAL_GID_EXT, 0x3344),
                u64a(ENGINE_SOCK_PEER_GID, 0x1122),
                u64a(ENGINE_SOCK_PEER_GID_EXT, 0x3344),
                u64a(ENGINE_SOCK_DMB_TOKEN, 0xaaaa),
                u64a(ENGINE_SOCK_PEER_DMB_TOKEN, 0xbbbb),
                u8a(ENGINE_SOCK_ROLE, 1),
                u32a(ENGINE_SOCK_PID, 4242),
                u64a(ENGINE_SOCK_NETNS_INODE, 4026531840),
            ],
        )],
    );
    assert_eq!(parse(&reply).sock(), Some(smcd_sock()));
    assert_eq!(
        emit(EngineMessage::sock_reply(&smcd_sock()), NLM_F_MULTI, 6),
        reply
    );
}

#[test]
fn fallback_sock_v6_and_smcr_round_trip() {
    let tcp = SockInfo {
        state: 10,
        local: Some("[::1]:7000".parse().unwrap()),
        mode: DiagMode::Tcp,
        fallback_reason: 0x0301_0000,
        peer_diagnosis: 0x0301_0000,
        ..Default::default()
    };
    let b = emit(EngineMessage::sock_reply(&tcp), NLM_F_MULTI, 1);
    assert_eq!(parse(&b).sock(), Some(tcp));
    let r = SockInfo {
        mode: DiagMode::Smcr,
        smcr: Some(SmcrSockInfo {
            link_id: 1,
            ib_dev: "mlx5_0".into(),
            ib_port: 1,
            gid: "fe80::1".into(),
            peer_gid: "fe80::2".into(),
        }),
        ..Default::default()
    };
    let b = emit(EngineMessage::sock_reply(&r), NLM_F_MULTI, 1);
    assert_eq!(parse(&b).sock(), Some(r));
}

#[test]
fn stats_reset_request_and_ack() {
    let req = msg(
        NLM_F_REQUEST | NLM_F_ACK,
        8,
        ENGINE_CMD_STATS_RESET,
        &[u32a(
            ENGINE_A_STATS_SCOPE,
            ENGINE_STATS_SCOPE_COUNTERS | ENGINE_STATS_SCOPE_FBACK,
        )],
    );
    let m = parse(&req);
    assert_eq!(m.stats_scope(), Some(3));
    assert_eq!(
        emit(
            EngineMessage::stats_reset(None, Some(3)),
            NLM_F_REQUEST | NLM_F_ACK,
            8
        ),
        req
    );
    let raw = framing::split_messages(&req).unwrap()[0];
    let ack = framing::to_bytes(&framing::ack::<EngineMessage>(&raw.header)).unwrap();
    assert_eq!(&ack[16..20], &[0, 0, 0, 0]);
}

#[test]
fn unknown_attributes_survive() {
    let bytes = msg(
        NLM_F_MULTI,
        1,
        ENGINE_CMD_NETNS_LIST,
        &[
            nest(
                ENGINE_A_NETNS_ENTRY,
                &[u64a(ENGINE_NETNS_INODE, 5), u8a(200, 1)],
            ),
            u8a(300, 2),
        ],
    );
    let m = parse(&bytes);
    assert_eq!(m.netns_entry().unwrap().other.len(), 1);
    assert_eq!(emit(m, NLM_F_MULTI, 1), bytes);
}

#[test]
fn nlctrl_preset_for_the_engine() {
    let f = FamilyInfo::smcd_engine(FAMILY);
    assert_eq!(f.name, "SMCD_ENGINE");
    assert_eq!(f.ops.len(), 7);
    assert_eq!(f.ops[1].flags, 0x0a); // SYSCTL_GET: do, readable by anyone
    assert_eq!(f.ops[2].flags, 0x0b); // SYSCTL_SET: admin do
    assert_eq!(f.ops[4].flags, 0x0c); // SOCK_DUMP
    assert_eq!(f.ops[6].flags, 0x0a); // INFO: do, readable by anyone
    assert_eq!(f.maxattr, 14);
}

#[test]
fn info_reply_with_path_counts_both_ways() {
    let bytes = msg(
        0,
        3,
        7,
        &[
            u8a(ENGINE_A_SYN_OPTION, 1),
            s(ENGINE_A_SYN_OPTION_CGROUP, "/sys/fs/cgroup"),
            s(ENGINE_A_SYN_OPTION_STATUS, "attached"),
            u64a(11, 5),
            u64a(12, 4),
            u64a(13, 3),
            u64a(14, 2),
        ],
    );
    let m = parse(&bytes);
    assert_eq!(
        m.path_counts(),
        Some(PathCounts {
            option_client: 5,
            option_server: 4,
            intent_client: 3,
            intent_server: 2,
        })
    );
    let mut attrs = vec![
        EngineAttr::SynOption(1),
        EngineAttr::SynOptionCgroup("/sys/fs/cgroup".into()),
        EngineAttr::SynOptionStatus("attached".into()),
    ];
    attrs.extend(EngineMessage::path_attrs(&m.path_counts().unwrap()));
    assert_eq!(
        emit(EngineMessage::new(EngineCmd::Info, attrs), 0, 3),
        bytes
    );
    // An smcd that does not count: no counts, not zeros.
    let old = parse(&msg(0, 3, 7, &[u8a(ENGINE_A_SYN_OPTION, 0)]));
    assert_eq!(old.path_counts(), None);
    // The request names the namespace.
    let req = EngineMessage::info(Some(&NetnsSelector::Name("a".into())));
    assert_eq!(
        emit(req, NLM_F_REQUEST, 4),
        msg(
            NLM_F_REQUEST,
            4,
            7,
            &[nest(ENGINE_A_NETNS, &[s(ENGINE_NETNS_SEL_NAME, "a")])]
        )
    );
}
