//! `SMC_GEN_NETLINK`, answered as the kernel does (`net/smc/smc_netlink.c` and the handlers
//! it registers: `smc_nl_get_sys_info` and `smc_nl_fill_smcd_lgr` in `smc_core.c`,
//! `smc_nl_handle_smcd_dev` in `smc_ism.c`, `smc_nl_get_stats` and `smc_nl_get_fback_stats`
//! in `smc_stats.c`, the UEID/SEID handlers in `smc_clc.c`, the handshake-limitation handlers
//! in `af_smc.c`), from smcd's state instead of the kernel's.
//!
//! Everything is about the caller's network namespace, as the kernel's `sock_net(skb->sk)`;
//! the EID table and the device are host-wide, as in the kernel.
//!
//! Attribute policy, as the kernel's strict validation applies it: every command except
//! `ADD_UEID`/`REMOVE_UEID` uses the family policy (`maxattr` 1, attribute 1 `NLA_REJECT`), so
//! any attribute at all is `EINVAL`; the two UEID commands accept only
//! `SMC_NLA_EID_TABLE_ENTRY`, an `NLA_STRING` of at most 32 characters (`ERANGE` when empty or
//! longer), and then insist on exactly 33 bytes (`EINVAL`).
//!
//! Where smcd is not the kernel:
//! * the system EID: smcd derives one (see the `smcd` binary) and behaves as the s390 kernel,
//!   where a SEID exists: `ENABLE_SEID` works, `DISABLE_SEID` is `ENOENT` while no user EID is
//!   defined, and removing the last user EID re-enables the SEID and reports it with `EAGAIN`
//!   (which smc-tools prints as "the System EID was activated");
//! * `GET_DEV_SMCD` lists the loopback device as kernels of the loopback-ism series did
//!   (PCI-ID `loopback-ism`, PCHID 0xffff); the newest kernels skip loopback-ism there;
//! * `GET_LGR_SMCD` lists the link groups of the caller's namespace (the kernel lists all);
//! * fallback reasons are listed in `ReasonCode::ALL` order rather than first-seen order, and
//!   reasons the table has no slot for count in the totals only (as the kernel's 31st code).

use super::dump::Walk;
use super::{Ctx, Errno, Op, Out, Request, SMC_FAMILY_ID};
use crate::device::LOOPBACK_CHID;
use crate::layout::UEID_MAX;
use crate::layout::status::{
    BUCKETS, FBACK_CODES, LgrRecord, LinkRecord, PortRecord, RMB_ALLOC, RMB_DGRADE, RMB_FULL,
    RMB_FULL_PEER, RMB_REUSE, RMB_SIZE_SM, RMB_SIZE_SM_PEER, SmcrLgr, T_CLNT_FBACK, T_CLNT_HS_ERR,
    T_CLNT_V1_SUCC, T_CLNT_V2_SUCC, T_CORK, T_NDLY, T_RX_BYTES, T_RX_CNT, T_RX_PD, T_RX_RMB,
    T_RX_RMB_SIZE, T_RX_RMB_USAGE, T_SMCR, T_SPLICE, T_SRV_FBACK, T_SRV_HS_ERR, T_SRV_V1_SUCC,
    T_SRV_V2_SUCC, T_TX_BYTES, T_TX_CNT, T_TX_PD, T_TX_RMB, T_TX_RMB_SIZE, T_TX_RMB_USAGE, T_URG,
};
use crate::settings::{KNOBS, knob_index};
use smc_proto::clc::ReasonCode;
use smc_proto::netlink::smc::consts::{
    SMC_MAX_EID_LEN, SMC_MAX_HOSTNAME_LEN, SMC_NLA_EID_TABLE_ENTRY,
};
use smc_proto::netlink::smc::{
    DevInfo, DevPort, FbackStats, LgrSmcd, LgrSmcr, LgrSmcrV2, LgrV2Common, LinkSmcr, RmbStats,
    SeidInfo, SizeBuckets, SmcAttr, SmcCmd, SmcGenlMessage, StatsReply, StatsTech, SysInfo,
};

/// `SMC_V2`.
const SMC_VERSION: u8 = 2;
/// `SMC_RELEASE` (2.1).
const SMC_RELEASE: u8 = 1;
/// `SMC_MAX_FBACK_RSN_CNT`: slots per side of the fallback table.
pub const SMC_MAX_FBACK_RSN_CNT: usize = 30;
/// What the loopback device shows as its PCI id (`dev_name` of the loopback-ism device).
pub const LOOPBACK_PCI_ID: &str = "loopback-ism";

/// The kernel's `smc_gen_nl_ops`.
pub fn op(cmd: u8) -> Option<Op> {
    match SmcCmd::from(cmd) {
        SmcCmd::Unknown(_) => None,
        c if c.is_dump() => Some(Op::DUMP),
        _ => Some(Op::ADMIN_DO),
    }
}

pub(crate) fn handle(ctx: &mut Ctx<'_>, req: &Request<'_>, out: &mut Out) -> Result<(), Errno> {
    let cmd = SmcCmd::from(req.cmd);
    let entry = match cmd {
        SmcCmd::AddUeid | SmcCmd::RemoveUeid => Some(eid_entry(req.attrs)?),
        _ => {
            // Family policy: attribute 1 is NLA_REJECT, everything else beyond maxattr.
            if !super::split_attrs(req.attrs, true)?.is_empty() {
                return Err(libc::EINVAL);
            }
            None
        }
    };
    let h = &req.header;
    match cmd {
        SmcCmd::GetSysInfo => {
            let info = sys_info(ctx);
            out.dump(SMC_FAMILY_ID, h, [SmcGenlMessage::sys_info_reply(&info)]);
        }
        // The dumps that read the engines' status areas go in pages (see `dump`).
        SmcCmd::GetLgrSmcd => {
            let ns = ctx.caller_netns()?;
            out.walk(SMC_FAMILY_ID, req, Walk::Lgrs { ns });
        }
        SmcCmd::GetDevSmcd => out.walk(SMC_FAMILY_ID, req, Walk::Dev { lgrs: 0 }),
        // SMC-R: what the engines' SMC-R endpoints publish (link groups with their links,
        // device ports).
        SmcCmd::GetLgrSmcr | SmcCmd::GetLinkSmcr => {
            let ns = ctx.caller_netns()?;
            let links = cmd == SmcCmd::GetLinkSmcr;
            out.walk(SMC_FAMILY_ID, req, Walk::LgrsSmcr { ns, links });
        }
        // ... and the host's RDMA devices, looked up again for each dump (`control::rnic`).
        SmcCmd::GetDevSmcr => {
            let ns = ctx.caller_netns()?;
            ctx.daemon.rnics.refresh();
            let seen = Default::default();
            out.walk(SMC_FAMILY_ID, req, Walk::DevSmcr { ns, seen });
        }
        SmcCmd::GetStats => {
            let ns = ctx.caller_netns()?;
            out.walk(SMC_FAMILY_ID, req, Walk::totals(ns, false));
        }
        SmcCmd::GetFbackStats => {
            let ns = ctx.caller_netns()?;
            out.walk(SMC_FAMILY_ID, req, Walk::totals(ns, true));
        }
        SmcCmd::DumpUeid => {
            let items: Vec<_> = ctx
                .daemon
                .eids
                .ueids
                .iter()
                .map(|e| {
                    SmcGenlMessage::new(
                        SmcCmd::DumpUeid,
                        vec![SmcAttr::EidTableEntry(
                            String::from_utf8_lossy(e).into_owned(),
                        )],
                    )
                })
                .collect();
            out.dump(SMC_FAMILY_ID, h, items);
        }
        SmcCmd::AddUeid => add_ueid(ctx, entry.unwrap_or_default())?,
        SmcCmd::RemoveUeid => remove_ueid(ctx, Some(entry.unwrap_or_default()))?,
        SmcCmd::FlushUeid => {
            // smc_nl_flush_ueid ignores what the removal returns.
            let _ = remove_ueid(ctx, None);
        }
        SmcCmd::DumpSeid => {
            let seid = SeidInfo {
                seid: ctx.daemon.device.seid.clone(),
                enabled: ctx.daemon.eids.seid_enabled,
            };
            out.dump(SMC_FAMILY_ID, h, [SmcGenlMessage::seid_reply(Some(&seid))]);
        }
        SmcCmd::EnableSeid => {
            ctx.daemon.eids.seid_enabled = true;
            ctx.daemon.publish_eids();
        }
        SmcCmd::DisableSeid => {
            if ctx.daemon.eids.ueids.is_empty() {
                return Err(libc::ENOENT);
            }
            ctx.daemon.eids.seid_enabled = false;
            ctx.daemon.publish_eids();
        }
        SmcCmd::DumpHsLimitation => {
            let ns = ctx.caller_netns()?;
            let on = knob(ctx, ns, "limit_smc_hs") != 0;
            out.dump(SMC_FAMILY_ID, h, [SmcGenlMessage::hs_limitation_reply(on)]);
        }
        SmcCmd::EnableHsLimitation | SmcCmd::DisableHsLimitation => {
            let ns = ctx.caller_netns()?;
            let v = u64::from(cmd == SmcCmd::EnableHsLimitation);
            ctx.daemon
                .set_knob(ns, "limit_smc_hs", v)
                .map_err(|_| libc::ENOMEM)?;
        }
        SmcCmd::Unknown(_) => return Err(libc::EOPNOTSUPP),
    }
    Ok(())
}

/// The value of a numeric knob in a namespace (its default if smcd has no state for it yet).
pub(crate) fn knob(ctx: &Ctx<'_>, ns: u64, name: &str) -> u64 {
    let i = knob_index(name).expect("known knob");
    ctx.daemon
        .namespaces
        .get(&ns)
        .map_or(KNOBS[i].default, |n| n.values[i])
}

/// The `SMC_NLA_EID_TABLE_ENTRY` of an `ADD_UEID`/`REMOVE_UEID` request, checked as the
/// kernel's `smc_gen_ueid_policy` and `smc_nl_add_ueid` do: 32 bytes (the NUL dropped).
fn eid_entry(attrs: &[u8]) -> Result<[u8; SMC_MAX_EID_LEN], Errno> {
    let mut entry = None;
    for a in super::split_attrs(attrs, true)? {
        if a.kind != SMC_NLA_EID_TABLE_ENTRY {
            return Err(libc::EINVAL);
        }
        if a.nested {
            return Err(libc::EINVAL); // NLA_F_NESTED on a string
        }
        // NLA_STRING, .len = 32: an optional trailing NUL is not counted.
        let v = a.value;
        let len = match v.last() {
            None => return Err(libc::ERANGE),
            Some(0) => v.len() - 1,
            Some(_) => v.len(),
        };
        if len > SMC_MAX_EID_LEN {
            return Err(libc::ERANGE);
        }
        entry = Some(v);
    }
    let v = entry.ok_or(libc::EINVAL)?;
    if v.len() != SMC_MAX_EID_LEN + 1 {
        return Err(libc::EINVAL);
    }
    let mut e = [0u8; SMC_MAX_EID_LEN];
    e.copy_from_slice(&v[..SMC_MAX_EID_LEN]);
    Ok(e)
}

/// smc_clc_ueid_valid: A-Z, 0-9, '.', '-', the first alphanumeric, blank padded.
fn ueid_valid(e: &[u8; SMC_MAX_EID_LEN]) -> bool {
    core::str::from_utf8(e).is_ok_and(|s| smc_proto::netlink::smc::Ueid::from_entry(s).is_ok())
}

/// smc_clc_ueid_add.
fn add_ueid(ctx: &mut Ctx<'_>, e: [u8; SMC_MAX_EID_LEN]) -> Result<(), Errno> {
    if !ueid_valid(&e) {
        return Err(libc::EINVAL);
    }
    let eids = &mut ctx.daemon.eids;
    if eids.ueids.len() >= UEID_MAX {
        return Err(libc::ERANGE);
    }
    if eids.ueids.contains(&e) {
        return Err(libc::EEXIST);
    }
    eids.ueids.push(e);
    ctx.daemon.publish_eids();
    Ok(())
}

/// smc_clc_ueid_remove (`None`: all), with the s390 rule: when the last user EID goes, the
/// system EID is enabled again and `EAGAIN` says so.
fn remove_ueid(ctx: &mut Ctx<'_>, e: Option<[u8; SMC_MAX_EID_LEN]>) -> Result<(), Errno> {
    let eids = &mut ctx.daemon.eids;
    let before = eids.ueids.len();
    eids.ueids.retain(|u| e.is_some_and(|e| *u != e));
    if eids.ueids.len() == before {
        return Err(libc::ENOENT);
    }
    let reenabled = eids.ueids.is_empty();
    if reenabled {
        eids.seid_enabled = true;
    }
    ctx.daemon.publish_eids();
    if reenabled { Err(libc::EAGAIN) } else { Ok(()) }
}

/// smc_nl_get_sys_info.
fn sys_info(ctx: &Ctx<'_>) -> SysInfo {
    let dev = &ctx.daemon.device;
    SysInfo {
        ver: SMC_VERSION,
        rel: SMC_RELEASE,
        // The loopback device is ISMv2 (as loopback-ism makes a kernel v2 capable).
        is_ism_v2: true,
        // SMC-R v2 is what the engines' SMC-R endpoints speak.
        is_smcr_v2: Some(true),
        local_host: Some(truncate(&dev.hostname, SMC_MAX_HOSTNAME_LEN)),
        seid: Some(dev.seid.clone()),
        other: Vec::new(),
    }
}

/// The first `max` bytes of `s`, cut at a character boundary.
fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// smc_nl_fill_smcd_lgr: a 128-bit loopback GID is GID (first 64 bits) + EXT_GID.
pub(crate) fn lgr_smcd(g: &LgrRecord) -> LgrSmcd {
    LgrSmcd {
        id: g.id,
        gid: (g.gid >> 64) as u64,
        ext_gid: Some(g.gid as u64),
        peer_gid: (g.peer_gid >> 64) as u64,
        peer_ext_gid: Some(g.peer_gid as u64),
        vlan_id: 0,
        conns_num: g.conns,
        chid: u32::from(LOOPBACK_CHID),
        sndbuf_alloc: Some(g.sndbuf),
        dmb_alloc: Some(g.dmb),
        pnetid: String::new(),
        v2_common: v2_common(g),
        other: Vec::new(),
    }
}

/// The v2 nest of a link group (v2 groups only).
fn v2_common(g: &LgrRecord) -> Option<LgrV2Common> {
    (g.version >= 2).then(|| LgrV2Common {
        ver: g.version,
        rel: g.release,
        os: g.os,
        peer_host: g.peer_host.clone(),
        neg_eid: g.eid.clone(),
        other: Vec::new(),
    })
}

/// `smc_nl_fill_lgr` for an SMC-R link group an engine published.
pub(crate) fn lgr_smcr(g: &LgrRecord, x: &SmcrLgr) -> LgrSmcr {
    LgrSmcr {
        id: g.id,
        conns_num: g.conns,
        role: g.role,
        lgr_type: x.lgr_type,
        buf_type: Some(x.buf_type),
        vlan_id: 0,
        net_cookie: None,
        pnetid: String::new(),
        sndbuf_alloc: Some(g.sndbuf),
        rmb_alloc: Some(g.dmb),
        v2_common: v2_common(g),
        v2: (g.version >= 2).then(|| LgrSmcrV2 {
            direct: true,
            max_conns: Some(x.max_conns),
            max_links: Some(x.max_links),
            other: Vec::new(),
        }),
        other: Vec::new(),
    }
}

/// `smc_gid_be16_convert`: eight groups of four hex digits.
fn gid_text(g: &[u8; 16]) -> String {
    let w: Vec<String> = g
        .chunks(2)
        .map(|c| format!("{:04x}", u16::from_be_bytes([c[0], c[1]])))
        .collect();
    w.join(":")
}

/// `smc_nl_fill_lgr_link`.
pub(crate) fn link_smcr(l: &LinkRecord) -> LinkSmcr {
    LinkSmcr {
        id: l.id,
        state: u32::from(l.state),
        conn_cnt: l.conn_cnt,
        ib_port: l.ib_port,
        net_dev: l.net_dev,
        ib_dev: l.ib_dev.clone(),
        // The kernel copies the uid's four bytes (network order) into the u32.
        uid: u32::from_ne_bytes(l.uid.to_be_bytes()),
        peer_uid: u32::from_ne_bytes(l.peer_uid.to_be_bytes()),
        gid: gid_text(&l.gid),
        peer_gid: gid_text(&l.peer_gid),
        other: Vec::new(),
    }
}

/// `smc_nl_handle_smcr_dev` for one port of a soft RoCE device: no PCI device behind it
/// (so no PCI attributes, as the kernel leaves them out for a non-PCI parent), its name and
/// the port.
pub(crate) fn dev_smcr(p: &PortRecord) -> DevInfo {
    let port = DevPort {
        pnet_usr: false,
        pnetid: String::new(),
        netdev: Some(p.net_dev),
        valid: Some(true),
        state: Some(u8::from(p.active)),
        lnk_cnt: Some(p.lnk_cnt),
        other: Vec::new(),
    };
    let (port, port2) = if p.ib_port == 2 {
        (None, Some(port))
    } else {
        (Some(port), None)
    };
    DevInfo {
        is_crit: p.lnk_cnt > 0,
        ib_name: Some(p.ib_dev.clone()),
        port,
        port2,
        ..DevInfo::default()
    }
}

/// smc_nl_handle_smcd_dev for loopback-ism: no PCI device behind it, so FID, vendor and
/// device are 0, the CHID is the reserved 0xffff and the PCI id its device name.
pub(crate) fn loopback_dev(lgr_cnt: usize) -> DevInfo {
    let use_cnt = u32::try_from(lgr_cnt).unwrap_or(u32::MAX);
    DevInfo {
        use_cnt: Some(use_cnt),
        is_crit: use_cnt > 0,
        pci_fid: Some(0),
        pci_chid: Some(LOOPBACK_CHID),
        pci_vendor: Some(0),
        pci_device: Some(0),
        pci_id: Some(LOOPBACK_PCI_ID.to_owned()),
        ib_name: None,
        port: Some(DevPort {
            pnet_usr: false,
            pnetid: String::new(),
            ..DevPort::default()
        }),
        port2: None,
        other: Vec::new(),
    }
}

fn buckets(t: &[u64], base: usize) -> SizeBuckets {
    let mut b = [0u64; 9];
    b.copy_from_slice(&t[base..base + BUCKETS]);
    SizeBuckets(b)
}

fn rmb(t: &[u64], base: usize) -> RmbStats {
    RmbStats {
        reuse_cnt: t[base + RMB_REUSE],
        size_sm_peer_cnt: t[base + RMB_SIZE_SM_PEER],
        size_sm_cnt: t[base + RMB_SIZE_SM],
        full_peer_cnt: t[base + RMB_FULL_PEER],
        full_cnt: t[base + RMB_FULL],
        alloc_cnt: t[base + RMB_ALLOC],
        dgrade_cnt: t[base + RMB_DGRADE],
    }
}

/// smc_nl_get_stats: the SMC-D technology from the namespace's counters, SMC-R all zero.
pub fn stats_reply(t: &[u64]) -> StatsReply {
    StatsReply {
        smcd: stats_tech(t, 0),
        smcr: stats_tech(t, T_SMCR),
        clnt_hs_err_cnt: t[T_CLNT_HS_ERR],
        srv_hs_err_cnt: t[T_SRV_HS_ERR],
        other: Vec::new(),
    }
}

/// One technology's counters, those at `base + t` of the totals.
fn stats_tech(all: &[u64], base: usize) -> StatsTech {
    let t = &all[base..];
    StatsTech {
        tx_rmb_stats: rmb(t, T_TX_RMB),
        rx_rmb_stats: rmb(t, T_RX_RMB),
        tx_pload: buckets(t, T_TX_PD),
        rx_pload: buckets(t, T_RX_PD),
        tx_rmb_size: buckets(t, T_TX_RMB_SIZE),
        rx_rmb_size: buckets(t, T_RX_RMB_SIZE),
        clnt_v1_succ: t[T_CLNT_V1_SUCC],
        clnt_v2_succ: t[T_CLNT_V2_SUCC],
        srv_v1_succ: t[T_SRV_V1_SUCC],
        srv_v2_succ: t[T_SRV_V2_SUCC],
        rx_bytes: t[T_RX_BYTES],
        tx_bytes: t[T_TX_BYTES],
        rx_rmb_usage: Some(t[T_RX_RMB_USAGE]),
        tx_rmb_usage: Some(t[T_TX_RMB_USAGE]),
        rx_cnt: t[T_RX_CNT],
        tx_cnt: t[T_TX_CNT],
        // smc_nl_fill_stats_tech_data always sends 0 (sendpage is gone).
        sendpage_cnt: 0,
        cork_cnt: t[T_CORK],
        ndly_cnt: t[T_NDLY],
        splice_cnt: t[T_SPLICE],
        urg_data_cnt: t[T_URG],
        other: Vec::new(),
    }
}

/// One side of the fallback table: up to 30 `{code, count}` slots with a non-zero count
/// (the kernel's `struct smc_stats_fback`, u16 counts), and the side's total.
fn fback_side(t: &[u64], base: usize) -> (Vec<(u32, u16)>, u64) {
    let counts = &t[base..base + FBACK_CODES];
    let total = counts.iter().fold(0u64, |a, &c| a.wrapping_add(c));
    let slots = ReasonCode::ALL
        .iter()
        .zip(counts)
        .filter(|&(_, &n)| n != 0)
        .map(|(code, &n)| (code.0, n as u16))
        .take(SMC_MAX_FBACK_RSN_CNT)
        .collect();
    (slots, total)
}

/// smc_nl_get_fback_stats: slot k of the server list, then slot k of the client list, for
/// k = 0.. until both are empty; the first message carries both totals.
pub fn fback_stats(t: &[u64]) -> Vec<FbackStats> {
    let (srv, srv_cnt) = fback_side(t, T_SRV_FBACK);
    let (clnt, clnt_cnt) = fback_side(t, T_CLNT_FBACK);
    let mut v = Vec::new();
    for k in 0..SMC_MAX_FBACK_RSN_CNT {
        if k >= srv.len() && k >= clnt.len() {
            break;
        }
        for (is_server, side) in [(true, &srv), (false, &clnt)] {
            if let Some(&(code, count)) = side.get(k) {
                let first = v.is_empty();
                v.push(FbackStats {
                    is_server,
                    srv_cnt: first.then_some(srv_cnt),
                    clnt_cnt: first.then_some(clnt_cnt),
                    rsn_code: code,
                    rsn_cnt: count,
                    other: Vec::new(),
                });
            }
        }
    }
    v
}
