//! The control families against a real [`Daemon`] in this process: requests built with
//! smc-proto, answered by [`handle`], replies split and parsed as a client would. Engine
//! state comes from real status areas registered with a real HELLO.

use super::*;
use crate::control::device::{ClientCtx, DeviceState};
use crate::layout::status::{
    ConnIdentity, Curs, LgrRecord, LstRecord, StatusArea, T_CLNT_FBACK, T_RX_BYTES, T_SRV_FBACK,
    T_SRV_V2_SUCC, T_TX_BYTES, T_TX_PD, fback_index,
};
use smc_proto::clc::ReasonCode;
use smc_proto::netlink::ctrl::{CtrlMessage, FamilyInfo};
use smc_proto::netlink::engine::{
    ENGINE_STATS_SCOPE_FBACK, EngineCmd, EngineMessage, NetnsSelector, SysctlValue,
};
use smc_proto::netlink::framing::{ReplyBatch, ReplyEnd, collect_replies, split_messages};
use smc_proto::netlink::loopback::{LoopbackAttr, LoopbackCmd, LoopbackMessage};
use smc_proto::netlink::smc::{SmcCmd, SmcGenlMessage, Ueid};
use std::sync::Arc;

fn daemon() -> Daemon {
    Daemon::new(DeviceState::new("SEID-TEST".into(), "testhost".into()).unwrap())
}

fn root() -> ClientCtx {
    ClientCtx {
        pid: std::process::id(),
        uid: 0,
        gid: 0,
        session: None,
        netns: 0,
    }
}

fn nobody() -> ClientCtx {
    ClientCtx {
        uid: 65534,
        gid: 65534,
        ..root()
    }
}

fn own_netns() -> u64 {
    crate::control::device::netns_of_pid(std::process::id()).unwrap()
}

/// Every message of every reply record, as bytes; checks the record size limit.
fn messages(records: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for r in records {
        assert!(r.len() <= MAX_RECORD, "record of {} bytes", r.len());
        assert!(!r.is_empty(), "an empty record reads as end of file");
        for m in split_messages(&r).expect("replies frame") {
            v.push(m.to_bytes());
        }
    }
    v
}

fn parse<T: GenlPayload>(msgs: &[Vec<u8>]) -> ReplyBatch<T> {
    collect_replies(msgs.iter().map(|m| {
        framing::parse_message::<T>(&split_messages(m).unwrap()[0]).expect("reply parses")
    }))
}

fn send<T: GenlPayload>(
    d: &mut Daemon,
    c: &ClientCtx,
    family: u16,
    p: T,
    flags: u16,
) -> Vec<Vec<u8>> {
    let bytes = framing::to_bytes(&framing::message(family, p, flags, 7, 0)).unwrap();
    messages(handle(d, c, &bytes))
}

fn dump<T: GenlPayload>(d: &mut Daemon, c: &ClientCtx, family: u16, p: T) -> ReplyBatch<T> {
    parse(&send(d, c, family, p, NLM_F_REQUEST | NLM_F_DUMP))
}

fn doit<T: GenlPayload>(d: &mut Daemon, c: &ClientCtx, family: u16, p: T) -> ReplyBatch<T> {
    parse(&send(d, c, family, p, NLM_F_REQUEST | NLM_F_ACK))
}

fn smc_dump(d: &mut Daemon, c: &ClientCtx, cmd: SmcCmd) -> ReplyBatch<SmcGenlMessage> {
    dump(d, c, SMC_FAMILY_ID, SmcGenlMessage::request(cmd))
}

fn smc_do(d: &mut Daemon, c: &ClientCtx, m: SmcGenlMessage) -> Option<ReplyEnd> {
    doit(d, c, SMC_FAMILY_ID, m).end
}

fn err(e: i32) -> Option<ReplyEnd> {
    Some(ReplyEnd::Error(-e))
}

const DONE: Option<ReplyEnd> = Some(ReplyEnd::Done(0));
const ACK: Option<ReplyEnd> = Some(ReplyEnd::Ack);

/// A raw request: header, genetlink header, attribute bytes as given.
fn raw_request(family: u16, cmd: u8, flags: u16, attrs: &[u8]) -> Vec<u8> {
    let len = 20 + attrs.len();
    let mut b = Vec::new();
    b.extend_from_slice(&(len as u32).to_ne_bytes());
    b.extend_from_slice(&family.to_ne_bytes());
    b.extend_from_slice(&flags.to_ne_bytes());
    b.extend_from_slice(&9u32.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(&[cmd, 1, 0, 0]);
    b.extend_from_slice(attrs);
    b
}

fn raw_attr(kind: u16, value: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
    b.extend_from_slice(&kind.to_ne_bytes());
    b.extend_from_slice(value);
    while b.len() % 4 != 0 {
        b.push(0);
    }
    b
}

fn raw_end(d: &mut Daemon, c: &ClientCtx, bytes: &[u8]) -> Option<ReplyEnd> {
    parse::<SmcGenlMessage>(&messages(handle(d, c, bytes))).end
}

#[test]
fn nlctrl_resolves_every_family() {
    let mut d = daemon();
    for (name, id) in [
        ("nlctrl", NLCTRL_ID),
        ("SMC_GEN_NETLINK", SMC_FAMILY_ID),
        ("SMCD_ENGINE", ENGINE_FAMILY_ID),
        ("SMCD_LOOPBACK", 0x22),
    ] {
        let r = doit(
            &mut d,
            &nobody(),
            NLCTRL_ID,
            CtrlMessage::get_family_by_name(name),
        );
        assert_eq!(r.end, ACK, "{name}");
        let f = FamilyInfo::from_reply(&r.payloads[0]).unwrap();
        assert_eq!((f.name.as_str(), f.id), (name, id));
        let r = doit(
            &mut d,
            &nobody(),
            NLCTRL_ID,
            CtrlMessage::get_family_by_id(id),
        );
        assert_eq!(FamilyInfo::from_reply(&r.payloads[0]).unwrap().name, name);
    }
    let f = FamilyInfo::from_reply(
        &doit(
            &mut d,
            &root(),
            NLCTRL_ID,
            CtrlMessage::get_family_by_name("SMC_GEN_NETLINK"),
        )
        .payloads[0],
    )
    .unwrap();
    assert_eq!(f, FamilyInfo::smc_gen_netlink(SMC_FAMILY_ID));
    let r = doit(
        &mut d,
        &root(),
        NLCTRL_ID,
        CtrlMessage::get_family_by_name("SMC_PNETID"),
    );
    assert_eq!(r.end, err(libc::ENOENT));
    let r = doit(
        &mut d,
        &root(),
        NLCTRL_ID,
        CtrlMessage {
            cmd: smc_proto::netlink::ctrl::CTRL_CMD_GETFAMILY,
            attrs: vec![],
        },
    );
    assert_eq!(r.end, err(libc::EINVAL));
    let all = dump(
        &mut d,
        &root(),
        NLCTRL_ID,
        CtrlMessage::get_family_by_name("x"),
    );
    assert_eq!((all.payloads.len(), all.end), (4, DONE));
}

#[test]
fn sys_info_and_device() {
    let mut d = daemon();
    let r = smc_dump(&mut d, &nobody(), SmcCmd::GetSysInfo);
    assert_eq!(r.end, DONE);
    let info = r.payloads[0].sys_info().unwrap();
    assert_eq!((info.ver, info.rel, info.is_ism_v2), (2, 1, true));
    assert_eq!(info.is_smcr_v2, Some(true));
    assert_eq!(info.local_host.as_deref(), Some("testhost"));
    assert_eq!(info.seid.as_deref(), Some("SEID-TEST"));
    let r = smc_dump(&mut d, &nobody(), SmcCmd::GetDevSmcd);
    let dev = r.payloads[0].dev_smcd().unwrap();
    assert_eq!(dev.pci_id.as_deref(), Some("loopback-ism"));
    assert_eq!(dev.pci_chid, Some(0xffff));
    assert_eq!((dev.use_cnt, dev.is_crit), (Some(0), false));
    for cmd in [SmcCmd::GetLgrSmcr, SmcCmd::GetLinkSmcr, SmcCmd::GetDevSmcr] {
        let r = smc_dump(&mut d, &nobody(), cmd);
        assert!(r.payloads.is_empty());
        assert_eq!(r.end, DONE);
    }
    let r = smc_dump(&mut d, &nobody(), SmcCmd::GetStats);
    assert_eq!(r.payloads[0].stats().unwrap().smcd.tx_bytes, 0);
    let r = smc_dump(&mut d, &nobody(), SmcCmd::GetFbackStats);
    assert!(r.payloads.is_empty());
}

fn entry(s: &str) -> Vec<u8> {
    let mut v = format!("{s:<32}").into_bytes();
    v.push(0);
    v
}

#[test]
fn ueid_and_seid_as_the_s390_kernel() {
    let mut d = daemon();
    let u = nobody();
    let r = root();
    let add = |s: &str| SmcGenlMessage::add_ueid(&Ueid::new(s).unwrap());
    // Unprivileged callers may look, not change.
    assert_eq!(smc_do(&mut d, &u, add("A")), err(libc::EPERM));
    assert_eq!(
        smc_do(&mut d, &u, SmcGenlMessage::request(SmcCmd::FlushUeid)),
        err(libc::EPERM)
    );
    // SEID on, and cannot be disabled without a user EID.
    let seid = smc_dump(&mut d, &u, SmcCmd::DumpSeid).payloads[0]
        .seid()
        .unwrap();
    assert!(seid.enabled);
    assert_eq!(
        smc_do(&mut d, &r, SmcGenlMessage::request(SmcCmd::DisableSeid)),
        err(libc::ENOENT)
    );
    for s in ["A", "B.C", "D-1", "E9"] {
        assert_eq!(smc_do(&mut d, &r, add(s)), ACK, "{s}");
    }
    assert_eq!(smc_do(&mut d, &r, add("A")), err(libc::ERANGE));
    let list = smc_dump(&mut d, &u, SmcCmd::DumpUeid);
    let got: Vec<_> = list
        .payloads
        .iter()
        .map(|m| m.ueid().unwrap().unwrap().to_string())
        .collect();
    assert_eq!(got, ["A", "B.C", "D-1", "E9"]);
    assert_eq!(
        smc_do(
            &mut d,
            &r,
            SmcGenlMessage::remove_ueid(&Ueid::new("E9").unwrap())
        ),
        ACK
    );
    assert_eq!(smc_do(&mut d, &r, add("A")), err(libc::EEXIST));
    assert_eq!(
        smc_do(
            &mut d,
            &r,
            SmcGenlMessage::remove_ueid(&Ueid::new("ZZ").unwrap())
        ),
        err(libc::ENOENT)
    );
    assert_eq!(
        smc_do(&mut d, &r, SmcGenlMessage::request(SmcCmd::DisableSeid)),
        ACK
    );
    assert!(!d.eids.seid_enabled);
    // Engines see the table through their sysctl page.
    assert_eq!(d.eids.ueids.len(), 3);
    for s in ["A", "B.C"] {
        assert_eq!(
            smc_do(
                &mut d,
                &r,
                SmcGenlMessage::remove_ueid(&Ueid::new(s).unwrap())
            ),
            ACK
        );
    }
    // The last one: removed, SEID back on, and EAGAIN tells so (smc_clc_ueid_remove on s390).
    assert_eq!(
        smc_do(
            &mut d,
            &r,
            SmcGenlMessage::remove_ueid(&Ueid::new("D-1").unwrap())
        ),
        err(libc::EAGAIN)
    );
    assert!(d.eids.ueids.is_empty() && d.eids.seid_enabled);
    assert_eq!(smc_do(&mut d, &r, add("X")), ACK);
    assert_eq!(
        smc_do(&mut d, &r, SmcGenlMessage::request(SmcCmd::DisableSeid)),
        ACK
    );
    assert_eq!(
        smc_do(&mut d, &r, SmcGenlMessage::request(SmcCmd::FlushUeid)),
        ACK
    );
    assert!(d.eids.ueids.is_empty() && d.eids.seid_enabled);
    assert_eq!(
        smc_do(&mut d, &r, SmcGenlMessage::request(SmcCmd::EnableSeid)),
        ACK
    );
    // The kernel's validation of the entry attribute.
    let add_raw = |attrs: &[u8]| raw_request(SMC_FAMILY_ID, 10, NLM_F_REQUEST | NLM_F_ACK, attrs);
    let cases: Vec<(Vec<u8>, Option<ReplyEnd>)> = vec![
        (raw_attr(1, &entry("GOOD")), ACK),
        // 32 characters without the NUL: passes the policy, not the length check.
        (raw_attr(1, &entry("NONUL")[..32]), err(libc::EINVAL)),
        // 33 characters and a NUL.
        (raw_attr(1, &[b'A'; 34][..]), err(libc::ERANGE)),
        (raw_attr(1, &[]), err(libc::ERANGE)),
        (raw_attr(1, &entry("lower")), err(libc::EINVAL)),
        (raw_attr(1, &entry(".DOT")), err(libc::EINVAL)),
        (raw_attr(1, &entry("")), err(libc::EINVAL)),
        (raw_attr(2, &entry("OTHER")), err(libc::EINVAL)),
        (raw_attr(1 | 0x8000, &entry("NESTED")), err(libc::EINVAL)),
        (Vec::new(), err(libc::EINVAL)),
        (vec![1, 2], err(libc::EINVAL)),
    ];
    for (attrs, want) in cases {
        assert_eq!(raw_end(&mut d, &r, &add_raw(&attrs)), want, "{attrs:?}");
    }
    assert_eq!(d.eids.ueids, vec![*b"GOOD                            "]);
}

#[test]
fn generic_netlink_errors() {
    let mut d = daemon();
    let r = root();
    let df = NLM_F_REQUEST | NLM_F_DUMP;
    // Unknown family, unknown command, dump of a do command, do of a dump command.
    assert_eq!(
        raw_end(&mut d, &r, &raw_request(0x33, 1, df, &[])),
        err(libc::ENOENT)
    );
    assert_eq!(
        raw_end(&mut d, &r, &raw_request(SMC_FAMILY_ID, 99, df, &[])),
        err(libc::EOPNOTSUPP)
    );
    assert_eq!(
        raw_end(&mut d, &r, &raw_request(SMC_FAMILY_ID, 12, df, &[])),
        err(libc::EOPNOTSUPP)
    );
    assert_eq!(
        raw_end(
            &mut d,
            &r,
            &raw_request(SMC_FAMILY_ID, 1, NLM_F_REQUEST, &[])
        ),
        err(libc::EOPNOTSUPP)
    );
    // Attributes where the policy allows none.
    assert_eq!(
        raw_end(
            &mut d,
            &r,
            &raw_request(SMC_FAMILY_ID, 1, df, &raw_attr(1, &[0]))
        ),
        err(libc::EINVAL)
    );
    assert_eq!(
        raw_end(&mut d, &r, &raw_request(SMC_FAMILY_ID, 1, df, &[0, 0])),
        err(libc::EINVAL)
    );
    // No room for the genetlink header.
    let mut short = raw_request(SMC_FAMILY_ID, 1, df, &[]);
    short.truncate(18);
    short[0..4].copy_from_slice(&18u32.to_ne_bytes());
    assert_eq!(raw_end(&mut d, &r, &short), err(libc::EINVAL));
    // A length beyond the record.
    let mut long = raw_request(SMC_FAMILY_ID, 1, df, &[]);
    long[0..4].copy_from_slice(&4000u32.to_ne_bytes());
    assert_eq!(raw_end(&mut d, &r, &long), err(libc::EINVAL));
    assert_eq!(raw_end(&mut d, &r, &[1, 2, 3]), err(libc::EINVAL));
    // Not a request: ignored, acknowledged only if asked.
    assert!(handle(&mut d, &r, &raw_request(SMC_FAMILY_ID, 1, 0, &[])).is_empty());
    assert_eq!(
        raw_end(&mut d, &r, &raw_request(SMC_FAMILY_ID, 1, NLM_F_ACK, &[])),
        ACK
    );
    assert_eq!(
        raw_end(
            &mut d,
            &r,
            &raw_request(3, 0, NLM_F_REQUEST | NLM_F_ACK, &[])
        ),
        ACK
    );
    // The error echoes the request.
    let req = raw_request(SMC_FAMILY_ID, 99, df, &[]);
    let m = messages(handle(&mut d, &r, &req));
    assert_eq!(&m[0][20..], &req[..]);
    // Two requests in one record: two answers, in order.
    let mut two = raw_request(SMC_FAMILY_ID, 1, df, &[]);
    two.extend(raw_request(SMC_FAMILY_ID, 16, df, &[]));
    let m = messages(handle(&mut d, &r, &two));
    assert_eq!(m.len(), 4);
    let b = parse::<SmcGenlMessage>(&m[2..]);
    assert_eq!(b.payloads[0].hs_limitation(), Some(false));
}

#[test]
fn handshake_limitation_is_the_namespace_knob() {
    let mut d = daemon();
    let ns = own_netns();
    assert_eq!(
        smc_do(
            &mut d,
            &nobody(),
            SmcGenlMessage::request(SmcCmd::EnableHsLimitation)
        ),
        err(libc::EPERM)
    );
    assert_eq!(
        smc_do(
            &mut d,
            &root(),
            SmcGenlMessage::request(SmcCmd::EnableHsLimitation)
        ),
        ACK
    );
    assert_eq!(d.namespaces[&ns].get("limit_smc_hs"), Some(1));
    let r = smc_dump(&mut d, &nobody(), SmcCmd::DumpHsLimitation);
    assert_eq!(r.payloads[0].hs_limitation(), Some(true));
    let r = doit(
        &mut d,
        &nobody(),
        ENGINE_FAMILY_ID,
        EngineMessage::sysctl_get(None, "limit_smc_hs"),
    );
    assert_eq!(
        r.payloads[0].sysctl().unwrap().value,
        Some(SysctlValue::Num(1))
    );
    assert_eq!(
        smc_do(
            &mut d,
            &root(),
            SmcGenlMessage::request(SmcCmd::DisableHsLimitation)
        ),
        ACK
    );
    assert_eq!(d.namespaces[&ns].get("limit_smc_hs"), Some(0));
}

#[test]
fn sysctls() {
    let mut d = daemon();
    let ns = own_netns();
    let list = dump(
        &mut d,
        &nobody(),
        ENGINE_FAMILY_ID,
        EngineMessage::sysctl_list(None),
    );
    assert_eq!(list.end, DONE);
    assert_eq!(list.payloads.len(), crate::settings::KNOBS.len());
    let wmem = list
        .payloads
        .iter()
        .map(|m| m.sysctl().unwrap())
        .find(|s| s.name == "wmem")
        .unwrap();
    assert_eq!(wmem.value, Some(SysctlValue::Num(65536)));
    assert_eq!(
        (wmem.min, wmem.max),
        (Some(16384), Some((i32::MAX / 2) as u64))
    );
    assert_eq!(wmem.unit.as_deref(), Some("bytes"));
    assert_eq!(list.payloads[0].netns_inode(), Some(ns));
    let set = |v| EngineMessage::sysctl_set(None, "rmem", SysctlValue::Num(v));
    assert_eq!(
        doit(&mut d, &nobody(), ENGINE_FAMILY_ID, set(32768)).end,
        err(libc::EPERM)
    );
    let r = doit(&mut d, &root(), ENGINE_FAMILY_ID, set(32768));
    assert_eq!(r.end, ACK);
    assert_eq!(
        r.payloads[0].sysctl().unwrap().value,
        Some(SysctlValue::Num(32768))
    );
    // Out of range: EINVAL, old value kept.
    assert_eq!(
        doit(&mut d, &root(), ENGINE_FAMILY_ID, set(100)).end,
        err(libc::EINVAL)
    );
    assert_eq!(d.namespaces[&ns].get("rmem"), Some(32768));
    let r = doit(
        &mut d,
        &root(),
        ENGINE_FAMILY_ID,
        EngineMessage::sysctl_get(None, "nope"),
    );
    assert_eq!(r.end, err(libc::ENOENT));
    // hs_ctrl: a string, and only the empty one.
    let hs = |v: &str| EngineMessage::sysctl_set(None, "hs_ctrl", SysctlValue::Str(v.into()));
    assert_eq!(
        doit(&mut d, &root(), ENGINE_FAMILY_ID, hs("bpf")).end,
        err(libc::EINVAL)
    );
    assert_eq!(doit(&mut d, &root(), ENGINE_FAMILY_ID, hs("")).end, ACK);
    let num_for_str = EngineMessage::sysctl_set(None, "hs_ctrl", SysctlValue::Num(1));
    assert_eq!(
        doit(&mut d, &root(), ENGINE_FAMILY_ID, num_for_str).end,
        err(libc::EINVAL)
    );
    let str_for_num = EngineMessage::sysctl_set(None, "wmem", SysctlValue::Str("1".into()));
    assert_eq!(
        doit(&mut d, &root(), ENGINE_FAMILY_ID, str_for_num).end,
        err(libc::EINVAL)
    );
    // Selectors: a missing namespace, a process, a path.
    let gone = NetnsSelector::Name("smcd-no-such-ns".into());
    let r = doit(
        &mut d,
        &root(),
        ENGINE_FAMILY_ID,
        EngineMessage::sysctl_get(Some(&gone), "wmem"),
    );
    assert_eq!(r.end, err(libc::ENOENT));
    let bad = NetnsSelector::Name("../x".into());
    let r = doit(
        &mut d,
        &root(),
        ENGINE_FAMILY_ID,
        EngineMessage::sysctl_get(Some(&bad), "wmem"),
    );
    assert_eq!(r.end, err(libc::EINVAL));
    for sel in [
        NetnsSelector::Pid(std::process::id()),
        NetnsSelector::Path("/proc/self/ns/net".into()),
        NetnsSelector::Inode(ns),
    ] {
        let r = doit(
            &mut d,
            &root(),
            ENGINE_FAMILY_ID,
            EngineMessage::sysctl_get(Some(&sel), "rmem"),
        );
        assert_eq!(
            r.payloads[0].sysctl().unwrap().value,
            Some(SysctlValue::Num(32768)),
            "{sel:?}"
        );
    }
    let r = doit(
        &mut d,
        &root(),
        ENGINE_FAMILY_ID,
        EngineMessage::sysctl_get(Some(&NetnsSelector::Inode(1)), "rmem"),
    );
    assert_eq!(r.end, err(libc::ENOENT));
}

/// An engine registered with the daemon the way the device channel does it, with a status
/// area the test writes.
fn engine(d: &mut Daemon) -> Arc<StatusArea> {
    let (area, fd) = StatusArea::shared().unwrap();
    let mut ctx = root();
    let out = d.device.handle(
        1,
        &mut ctx,
        LoopbackMessage::new(
            LoopbackCmd::Hello,
            vec![
                LoopbackAttr::Version(1),
                LoopbackAttr::Pid(std::process::id()),
                LoopbackAttr::SessionKey(42),
                LoopbackAttr::Netns(own_netns()),
            ],
        ),
        vec![fd],
    );
    assert!(matches!(out.reply, Some(Ok(_))));
    area
}

/// `n` live sockets in `area`, inodes `0..n`, each bound to `127.0.0.1` ports 1 and 2.
fn live_sockets(area: &Arc<StatusArea>, n: u64) -> Vec<crate::layout::status::ConnSlot> {
    (0..n)
        .map(|i| {
            let c = area.conn_slot();
            c.publish(&ConnIdentity {
                state: 1,
                mode: 2,
                inode: i,
                local: Some("127.0.0.1:1".parse().unwrap()),
                peer: Some("127.0.0.1:2".parse().unwrap()),
                ..ConnIdentity::default()
            });
            c
        })
        .collect()
}

/// One `SOCK_DUMP` request of the engine family, as a record.
fn sock_dump_request() -> Vec<u8> {
    framing::to_bytes(&framing::message(
        ENGINE_FAMILY_ID,
        EngineMessage::sock_dump(None, None),
        NLM_F_REQUEST | NLM_F_DUMP,
        1,
        0,
    ))
    .unwrap()
}

#[test]
fn live_state_from_status_areas() {
    let mut d = daemon();
    let area = engine(&mut d);
    let gid = (0x1111u128 << 64) | 0x2222;
    let peer = (0x3333u128 << 64) | 0x4444;
    let g = area.lgr_slot();
    g.publish(&LgrRecord {
        id: 0x100,
        role: 0,
        version: 2,
        release: 1,
        os: 2,
        conns: 1,
        peer_gid: peer,
        gid,
        sndbuf: 65536,
        dmb: 65536,
        peer_host: "peerhost".into(),
        eid: "SEID-TEST".into(),
        smcr: None,
    });
    let c = area.conn_slot();
    c.publish(&ConnIdentity {
        state: 1,
        mode: 2,
        role: 0,
        local: Some("127.0.0.1:4000".parse().unwrap()),
        peer: Some("127.0.0.1:5000".parse().unwrap()),
        inode: 777,
        lgr: 0x100,
        token: 0xabcdef,
        peer_token: 0x123456,
        gid,
        peer_gid: peer,
        rmbe: 65536,
        peer_rmbe: 16384,
        sndbuf: 16384 - 32,
        ..ConnIdentity::default()
    });
    // 3 wraps of our 65504-byte ring plus 10; the peer's ring is 16352 bytes.
    c.set_cursor(Curs::RxProd, 3 * 65504 + 10);
    c.set_cursor(Curs::TxProd, 16352 + 5);
    c.set_cursor(Curs::TxPrep, 2 * 16352);
    c.set_flags(1, 2, 3, 4);
    let l = area.listener_slot();
    l.publish(&LstRecord {
        addr: "0.0.0.0:5000".parse().unwrap(),
        inode: 888,
        backlog: 128,
        hs_limit: false,
    });
    area.add(T_SRV_V2_SUCC, 2);
    area.add(T_TX_BYTES, 1000);
    area.add(T_RX_BYTES, 500);
    area.add(T_TX_PD + 1, 4);
    area.add(T_SRV_FBACK + fback_index(ReasonCode::PEERNOSMC), 3);
    area.add(T_CLNT_FBACK + fback_index(ReasonCode::PEERNOSMC), 1);
    area.add(T_CLNT_FBACK + fback_index(ReasonCode::IPSEC), 2);

    let u = nobody();
    let r = smc_dump(&mut d, &u, SmcCmd::GetLgrSmcd);
    let lgr = r.payloads[0].lgr_smcd().unwrap();
    assert_eq!(
        (lgr.id, lgr.gid, lgr.ext_gid),
        (0x100, 0x1111, Some(0x2222))
    );
    assert_eq!((lgr.peer_gid, lgr.peer_ext_gid), (0x3333, Some(0x4444)));
    assert_eq!((lgr.chid, lgr.conns_num), (0xffff, 1));
    let v2 = lgr.v2_common.unwrap();
    assert_eq!((v2.ver, v2.rel, v2.os), (2, 1, 2));
    assert_eq!(
        (v2.peer_host.as_str(), v2.neg_eid.as_str()),
        ("peerhost", "SEID-TEST")
    );
    let dev = smc_dump(&mut d, &u, SmcCmd::GetDevSmcd).payloads[0]
        .dev_smcd()
        .unwrap();
    assert_eq!((dev.use_cnt, dev.is_crit), (Some(1), true));

    let st = smc_dump(&mut d, &u, SmcCmd::GetStats).payloads[0]
        .stats()
        .unwrap();
    assert_eq!(
        (st.smcd.srv_v2_succ, st.smcd.tx_bytes, st.smcd.rx_bytes),
        (2, 1000, 500)
    );
    assert_eq!(st.smcd.tx_pload.0[1], 4);
    assert_eq!(st.smcr.tx_bytes, 0);
    let fb = smc_dump(&mut d, &u, SmcCmd::GetFbackStats);
    let fb: Vec<_> = fb
        .payloads
        .iter()
        .map(|m| m.fback_stats().unwrap())
        .collect();
    assert_eq!(fb.len(), 3);
    assert_eq!((fb[0].srv_cnt, fb[0].clnt_cnt), (Some(3), Some(3)));
    assert!(fb[0].is_server && !fb[1].is_server && !fb[2].is_server);
    assert_eq!(
        (fb[0].rsn_code, fb[0].rsn_cnt),
        (ReasonCode::PEERNOSMC.0, 3)
    );
    assert!(fb[1].srv_cnt.is_none());

    let socks = dump(
        &mut d,
        &u,
        ENGINE_FAMILY_ID,
        EngineMessage::sock_dump(None, None),
    );
    let socks: Vec<_> = socks.payloads.iter().map(|m| m.sock().unwrap()).collect();
    assert_eq!(socks.len(), 2);
    let lst = &socks[0];
    assert_eq!((lst.state, lst.inode), (10, 888));
    let s = &socks[1];
    assert_eq!((s.state, s.inode, s.uid), (1, 777, 0));
    assert_eq!(s.pid, Some(std::process::id()));
    assert_eq!(s.mode, smc_proto::netlink::engine::DiagMode::Smcd);
    let ci = s.conn.unwrap();
    assert_eq!(
        (ci.rmbe_size, ci.peer_rmbe_size, ci.sndbuf_size),
        (65504, 16352, 16352)
    );
    assert_eq!((ci.rx_prod.wrap, ci.rx_prod.count), (3, 10));
    assert_eq!((ci.tx_prod.wrap, ci.tx_prod.count), (1, 5));
    assert_eq!((ci.tx_prep.wrap, ci.tx_prep.count), (2, 0));
    assert_eq!((ci.tx_sent, ci.tx_fin), (ci.tx_prod, ci.tx_prod));
    assert_eq!((ci.rx_prod_flags, ci.tx_conn_state_flags), (1, 4));
    let sd = s.smcd.unwrap();
    assert_eq!(
        (sd.gid, sd.gid_ext, sd.token, sd.peer_token),
        (0x1111, 0x2222, 0xabcdef, 0x123456)
    );
    // A state filter: only LISTEN.
    let only = dump(
        &mut d,
        &u,
        ENGINE_FAMILY_ID,
        EngineMessage::sock_dump(None, Some(1 << 10)),
    );
    assert_eq!(only.payloads.len(), 1);

    let nslist = dump(&mut d, &u, ENGINE_FAMILY_ID, EngineMessage::netns_list());
    let me = nslist
        .payloads
        .iter()
        .map(|m| m.netns_entry().unwrap())
        .find(|n| n.inode == own_netns())
        .unwrap();
    assert_eq!((me.sock_cnt, me.lgr_cnt, me.listen_cnt), (2, 1, 1));

    // STATS_RESET: fallback table only, then everything.
    let reset = |scope| EngineMessage::stats_reset(None, scope);
    assert_eq!(
        doit(&mut d, &u, ENGINE_FAMILY_ID, reset(None)).end,
        err(libc::EPERM)
    );
    assert_eq!(
        doit(
            &mut d,
            &root(),
            ENGINE_FAMILY_ID,
            reset(Some(ENGINE_STATS_SCOPE_FBACK))
        )
        .end,
        ACK
    );
    assert!(
        smc_dump(&mut d, &u, SmcCmd::GetFbackStats)
            .payloads
            .is_empty()
    );
    let st = smc_dump(&mut d, &u, SmcCmd::GetStats).payloads[0]
        .stats()
        .unwrap();
    assert_eq!(st.smcd.tx_bytes, 1000);
    assert_eq!(
        doit(&mut d, &root(), ENGINE_FAMILY_ID, reset(None)).end,
        ACK
    );
    let st = smc_dump(&mut d, &u, SmcCmd::GetStats).payloads[0]
        .stats()
        .unwrap();
    assert_eq!(st.smcd.tx_bytes, 0);
    area.add(T_TX_BYTES, 7);
    let st = smc_dump(&mut d, &u, SmcCmd::GetStats).payloads[0]
        .stats()
        .unwrap();
    assert_eq!(st.smcd.tx_bytes, 7);
    drop((c, g, l));
    assert!(smc_dump(&mut d, &u, SmcCmd::GetLgrSmcd).payloads.is_empty());
}

#[test]
fn big_dumps_are_split_into_records() {
    let mut d = daemon();
    let area = engine(&mut d);
    let slots = live_sockets(&area, 2000);
    let bytes = sock_dump_request();
    let records = handle(&mut d, &nobody(), &bytes);
    assert!(records.len() > 1);
    let b = parse::<EngineMessage>(&messages(records));
    assert_eq!((b.payloads.len(), b.end), (2000, DONE));
    drop(slots);
    let _ = EngineCmd::SockDump;
}

/// Issue 10, item 2: a dump that walks status areas answers in pages, one per step, each
/// step bounded; every object once; the messages after the dump request in its record are
/// answered after its `NLMSG_DONE`.
#[test]
fn dumps_go_in_pages_and_keep_their_place() {
    let mut d = daemon();
    let area = engine(&mut d);
    let slots = live_sockets(&area, 3000);
    let groups: Vec<_> = (0..3000u32)
        .map(|i| {
            let g = area.lgr_slot();
            g.publish(&LgrRecord {
                id: i,
                ..LgrRecord::default()
            });
            g
        })
        .collect();
    let mut record = sock_dump_request();
    // A second request in the same record: answered once the dump is done.
    record.extend(raw_request(
        SMC_FAMILY_ID,
        16,
        NLM_F_REQUEST | NLM_F_DUMP,
        &[],
    ));
    let c = nobody();
    let first = start(&mut d, &c, &record);
    assert!(
        first.records.is_empty(),
        "nothing is read before the first step"
    );
    let mut job = first.job.expect("a paged dump");
    let mut pages = Vec::new();
    loop {
        let (records, next) = job.step(&mut d, &c);
        pages.extend(records);
        match next {
            Some(j) => job = j,
            None => break,
        }
    }
    assert!(pages.len() > 10, "{} pages", pages.len());
    for p in &pages[..pages.len() - 2] {
        assert!(p.len() <= dump::PAGE, "page of {} bytes", p.len());
    }
    let msgs = messages(pages);
    let done = msgs
        .iter()
        .position(|m| u16::from_ne_bytes([m[4], m[5]]) == 3)
        .expect("NLMSG_DONE");
    let b = parse::<EngineMessage>(&msgs[..=done]);
    let mut inodes: Vec<u64> = b.payloads.iter().map(|m| m.sock().unwrap().inode).collect();
    inodes.sort_unstable();
    assert_eq!(inodes, (0..3000).collect::<Vec<_>>(), "each socket once");
    let hs = parse::<SmcGenlMessage>(&msgs[done + 1..]);
    assert_eq!(
        (hs.payloads.len(), hs.end),
        (1, DONE),
        "then the second request"
    );
    // Link groups too, every one of the 3000 (more than the 1024 slots areas had).
    let lg = smc_dump(&mut d, &c, SmcCmd::GetLgrSmcd);
    assert_eq!((lg.payloads.len(), lg.end), (3000, DONE));
    let dev = smc_dump(&mut d, &c, SmcCmd::GetDevSmcd).payloads[0]
        .dev_smcd()
        .unwrap();
    assert_eq!(dev.use_cnt, Some(3000));
    drop((slots, groups));
}

/// Thousands of slots that were used and are free again: steps that find nothing send
/// nothing (no empty record), and the one live socket is listed.
#[test]
fn steps_over_freed_slots_send_no_empty_page() {
    let mut d = daemon();
    let area = engine(&mut d);
    let many: Vec<_> = (0..3 * dump::STEP_SLOTS)
        .map(|_| {
            let c = area.conn_slot();
            c.publish(&ConnIdentity::default());
            c
        })
        .collect();
    let live = area.conn_slot();
    live.publish(&ConnIdentity {
        inode: 5,
        ..ConnIdentity::default()
    });
    drop(many);
    let b = dump(
        &mut d,
        &nobody(),
        ENGINE_FAMILY_ID,
        EngineMessage::sock_dump(None, None),
    );
    assert_eq!(b.end, DONE);
    assert_eq!(b.payloads.len(), 1);
    assert_eq!(b.payloads[0].sock().unwrap().inode, 5);
}

/// An engine that registers while a dump is in progress and sorts after its cursor is
/// listed; the dump is not a snapshot taken at the request.
#[test]
fn engines_that_come_during_a_dump_are_listed() {
    let mut d = daemon();
    let area = engine(&mut d);
    let slots = live_sockets(&area, 2000);
    let req = sock_dump_request();
    let c = nobody();
    let job = start(&mut d, &c, &req).job.unwrap();
    let (mut records, next) = job.step(&mut d, &c);
    // A later engine (same pid, a higher engine id).
    let (late, fd) = StatusArea::shared().unwrap();
    let mut ctx = root();
    let out = d.device.handle(
        2,
        &mut ctx,
        LoopbackMessage::new(
            LoopbackCmd::Hello,
            vec![
                LoopbackAttr::Version(1),
                LoopbackAttr::Pid(std::process::id()),
                LoopbackAttr::SessionKey(43),
                LoopbackAttr::Netns(own_netns()),
            ],
        ),
        vec![fd],
    );
    assert!(matches!(out.reply, Some(Ok(_))));
    let s = late.conn_slot();
    s.publish(&ConnIdentity {
        state: 1,
        mode: 2,
        inode: 99_999,
        ..ConnIdentity::default()
    });
    let mut job = next;
    while let Some(j) = job {
        let (r, n) = j.step(&mut d, &c);
        records.extend(r);
        job = n;
    }
    let b = parse::<EngineMessage>(&messages(records));
    assert_eq!(b.end, DONE);
    assert_eq!(b.payloads.len(), 2001);
    assert_eq!(b.payloads.last().unwrap().sock().unwrap().inode, 99_999);
    drop((slots, s));
}

#[test]
fn admin_group_members_may_change_state() {
    let mut d = daemon();
    d.admin_gid = Some(4242);
    let member = ClientCtx {
        gid: 4242,
        ..nobody()
    };
    assert_eq!(
        smc_do(
            &mut d,
            &member,
            SmcGenlMessage::request(SmcCmd::EnableHsLimitation)
        ),
        ACK
    );
    assert!(is_admin(&root(), None));
    assert!(!is_admin(&nobody(), Some(4242)));
}

mod fuzz {
    //! Whatever arrives, `handle` answers with well-formed records and never panics.
    use super::*;
    use proptest::prelude::*;

    fn any_request() -> impl Strategy<Value = Vec<u8>> {
        let family = prop_oneof![
            Just(NLCTRL_ID),
            Just(SMC_FAMILY_ID),
            Just(ENGINE_FAMILY_ID),
            Just(smc_proto::netlink::loopback::LOOPBACK_FAMILY_ID),
            any::<u16>()
        ];
        let flags = prop_oneof![
            Just(NLM_F_REQUEST | NLM_F_DUMP),
            Just(NLM_F_REQUEST | NLM_F_ACK),
            any::<u16>()
        ];
        (
            family,
            0u8..24,
            flags,
            proptest::collection::vec(any::<u8>(), 0..200),
        )
            .prop_map(|(f, cmd, fl, attrs)| raw_request(f, cmd, fl, &attrs))
    }

    /// What the server does with a record: the loopback family to the device handler
    /// (without descriptors), everything else to `genl::handle`.
    fn dispatch_like_server(d: &mut Daemon, id: u64, c: &mut ClientCtx, record: &[u8]) {
        use crate::ipc::channel;
        use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
        use netlink_packet_generic::GenlMessage;
        use smc_proto::netlink::loopback::LOOPBACK_FAMILY_ID;
        let loopback =
            channel::peek_header(record).is_some_and(|h| h.message_type == LOOPBACK_FAMILY_ID);
        if !loopback {
            let _ = messages(handle(d, c, record));
            return;
        }
        if let Ok(NetlinkMessage {
            payload: NetlinkPayload::InnerMessage(g),
            ..
        }) = channel::decode::<GenlMessage<LoopbackMessage>>(record)
        {
            let out = d.device.handle(id, c, g.payload, Vec::new());
            for r in out.fds {
                let _ = d.device.fd(r);
            }
            for n in out.notes {
                d.device.undeliverable(&n.msg);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// A fresh daemon, two clients (root and nobody), records of every family in any
        /// order, then both clients leave.
        #[test]
        fn record_sequences(
            recs in proptest::collection::vec(
                (any::<bool>(), prop_oneof![
                    any_request(),
                    proptest::collection::vec(any::<u8>(), 0..120)
                ]),
                1..12,
            )
        ) {
            let mut d = daemon();
            let mut clients = [root(), nobody()];
            for (who, r) in &recs {
                let i = usize::from(*who);
                dispatch_like_server(&mut d, i as u64 + 1, &mut clients[i], r);
            }
            for (i, c) in clients.iter().enumerate() {
                let (_, session) = d.device.client_gone(i as u64 + 1, c);
                if let Some(s) = session {
                    d.session_gone(s);
                }
            }
        }

        #[test]
        fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let mut d = daemon();
            for c in [root(), nobody()] {
                let _ = messages(handle(&mut d, &c, &bytes));
            }
        }

        #[test]
        fn arbitrary_requests(reqs in proptest::collection::vec(any_request(), 1..4)) {
            let mut d = daemon();
            let record: Vec<u8> = reqs.concat();
            for c in [root(), nobody()] {
                let m = messages(handle(&mut d, &c, &record));
                // Every reply parses as a netlink message of some family.
                for x in &m {
                    let raw = split_messages(x).unwrap();
                    prop_assert_eq!(raw.len(), 1);
                }
            }
        }
    }
}

#[test]
fn info_reports_the_syn_option_path() {
    use crate::control::daemon::SynOptionInfo;
    use smc_proto::netlink::engine::EngineCmd;
    let mut d = daemon();
    let ask = |d: &mut Daemon| {
        let r = doit(
            d,
            &nobody(),
            ENGINE_FAMILY_ID,
            EngineMessage::new(EngineCmd::Info, vec![]),
        );
        assert_eq!(r.end, ACK);
        assert_eq!(r.payloads.len(), 1);
        r.payloads[0].syn_option().expect("SYN_OPTION")
    };
    assert_eq!(ask(&mut d), (false, None, Some("not loaded".into())));
    d.syn_option = SynOptionInfo {
        attached: true,
        cgroup: Some("/sys/fs/cgroup".into()),
        status: "BPF sock_ops program attached".into(),
    };
    assert_eq!(
        ask(&mut d),
        (
            true,
            Some("/sys/fs/cgroup".into()),
            Some("BPF sock_ops program attached".into())
        )
    );
    // HELLO without an attached program hands out the two pages only.
    assert!(!d.device.syn_option());
}
