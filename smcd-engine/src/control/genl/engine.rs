//! `SMCD_ENGINE`: what the kernel offers through `/proc/sys/net/smc` (`smc_sysctl.c`) and
//! sock_diag (`smc_diag.c`, read by `smcss`), plus a statistics reset, for one namespace at a
//! time (see [`super::netns`] for the selector). The commands and attributes are documented
//! in `smc_proto::netlink::engine`.
//!
//! Validation: a top-level attribute this family defines whose value does not decode (wrong
//! length or type) is `EINVAL`, as is a selector or sysctl nest holding such an attribute;
//! attributes with numbers this version does not know are ignored (the family is append
//! only). A missing sysctl name or value is `EINVAL`, an unknown sysctl `ENOENT`, a value out
//! of range or of the wrong type `EINVAL` (the old value is kept).

use super::dump::Walk;
use super::{Ctx, ENGINE_FAMILY_ID, Errno, Op, Out, Request, netns};
use crate::layout::status::{
    ConnRecord, Curs, LgrRecord, LstRecord, N_TOTALS, T_CLNT_FBACK, T_CLNT_PATH_INTENT,
    T_CLNT_PATH_OPTION, T_SMCR, T_SRV_PATH_INTENT, T_SRV_PATH_OPTION,
};
use crate::settings::{KNOBS, Kind, Knob, knob_index};
use netlink_packet_core::{NLA_TYPE_MASK, Nla};
use netlink_packet_generic::GenlHeader;
use smc_proto::netlink::GenlPayload;
use smc_proto::netlink::engine::{
    ConnInfo, Cursor, DiagMode, ENGINE_A_MAX, ENGINE_NETNS_SEL_NAME, ENGINE_STATS_SCOPE_COUNTERS,
    ENGINE_STATS_SCOPE_FBACK, ENGINE_SYSCTL_FLAGS, EngineAttr, EngineCmd, EngineMessage, NetnsInfo,
    NetnsSelAttr, NetnsSelector, PathCounts, SmcdSockInfo, SmcrSockInfo, SockInfo, SysctlAttr,
    SysctlInfo, SysctlType, SysctlValue,
};
use std::collections::BTreeMap;

/// `SMC_LISTEN` in `enum smc_state`.
pub const SMC_LISTEN: u8 = 10;
/// Bytes of a DMB the SMC-D CDC header takes before the ring.
pub const DMB_CDC_LEN: u64 = 32;

/// The family's operations.
pub fn op(cmd: u8) -> Option<Op> {
    let c = EngineCmd::from(cmd);
    match c {
        EngineCmd::Unknown(_) => None,
        c if c.is_dump() => Some(Op::DUMP),
        c if c.needs_admin() => Some(Op::ADMIN_DO),
        _ => Some(Op::DO),
    }
}

pub(crate) fn handle(ctx: &mut Ctx<'_>, req: &Request<'_>, out: &mut Out) -> Result<(), Errno> {
    let msg = EngineMessage::parse_genl(
        &GenlHeader {
            cmd: req.cmd,
            version: 0,
        },
        req.attrs,
    )
    .map_err(|_| libc::EINVAL)?;
    validate(&msg)?;
    let sel = selector(&msg)?;
    let h = &req.header;
    match msg.cmd {
        EngineCmd::SysctlList => {
            let ns = netns::resolve(ctx, sel.as_ref())?;
            let items: Vec<_> = KNOBS
                .iter()
                .map(|k| EngineMessage::sysctl_reply(msg.cmd, ns, &sysctl_info(ctx, ns, k)))
                .collect();
            out.dump(ENGINE_FAMILY_ID, h, items);
        }
        EngineCmd::SysctlGet => {
            let ns = netns::resolve(ctx, sel.as_ref())?;
            let name = msg.sysctl().map(|s| s.name).unwrap_or_default();
            if name.is_empty() {
                return Err(libc::EINVAL);
            }
            let k = knob(&name)?;
            let info = sysctl_info(ctx, ns, k);
            out.reply(
                ENGINE_FAMILY_ID,
                h,
                EngineMessage::sysctl_reply(msg.cmd, ns, &info),
            );
        }
        EngineCmd::SysctlSet => {
            let ns = netns::resolve(ctx, sel.as_ref())?;
            let s = msg.sysctl().ok_or(libc::EINVAL)?;
            if s.name.is_empty() {
                return Err(libc::EINVAL);
            }
            let k = knob(&s.name)?;
            match (k.kind, s.value) {
                (Kind::Str, Some(SysctlValue::Str(v))) => {
                    ctx.daemon.set_hs_ctrl(ns, &v).map_err(|_| libc::EINVAL)?
                }
                (Kind::Str, _) | (_, Some(SysctlValue::Str(_))) | (_, None) => {
                    return Err(libc::EINVAL);
                }
                (_, Some(SysctlValue::Num(v))) => ctx
                    .daemon
                    .set_knob(ns, k.name, v)
                    .map_err(|_| libc::EINVAL)?,
            }
            let info = sysctl_info(ctx, ns, k);
            out.reply(
                ENGINE_FAMILY_ID,
                h,
                EngineMessage::sysctl_reply(msg.cmd, ns, &info),
            );
        }
        EngineCmd::NetnsList => {
            let only = match &sel {
                Some(s) => Some(netns::resolve(ctx, Some(s))?),
                None => None,
            };
            // The counts come from the status areas, in pages (see `dump`).
            let list = netns_list(ctx, only);
            out.walk(ENGINE_FAMILY_ID, req, Walk::Netns { list });
        }
        EngineCmd::SockDump => {
            let ns = netns::resolve(ctx, sel.as_ref())?;
            let states = msg.sock_states().unwrap_or(0);
            out.walk(ENGINE_FAMILY_ID, req, Walk::Socks { ns, states });
        }
        EngineCmd::StatsReset => {
            let ns = netns::resolve(ctx, sel.as_ref())?;
            let scope = match msg.stats_scope().unwrap_or(0) {
                0 => ENGINE_STATS_SCOPE_COUNTERS | ENGINE_STATS_SCOPE_FBACK,
                s if s & !(ENGINE_STATS_SCOPE_COUNTERS | ENGINE_STATS_SCOPE_FBACK) != 0 => {
                    return Err(libc::EINVAL);
                }
                s => s,
            };
            reset_stats(ctx, ns, scope)?;
        }
        EngineCmd::Info => {
            let i = &ctx.daemon.syn_option;
            let mut attrs = vec![EngineAttr::SynOption(u8::from(i.attached))];
            attrs.extend(i.cgroup.clone().map(EngineAttr::SynOptionCgroup));
            attrs.push(EngineAttr::SynOptionStatus(i.status.clone()));
            let ns = netns::resolve(ctx, sel.as_ref())?;
            let t = ctx.daemon.totals(ns);
            attrs.extend(EngineMessage::path_attrs(&PathCounts {
                option_client: t[T_CLNT_PATH_OPTION],
                option_server: t[T_SRV_PATH_OPTION],
                intent_client: t[T_CLNT_PATH_INTENT],
                intent_server: t[T_SRV_PATH_INTENT],
            }));
            out.reply(ENGINE_FAMILY_ID, h, EngineMessage::new(msg.cmd, attrs));
        }
        EngineCmd::Unknown(_) => return Err(libc::EOPNOTSUPP),
    }
    Ok(())
}

/// `EINVAL` for an attribute this family defines that did not decode.
fn validate(msg: &EngineMessage) -> Result<(), Errno> {
    let bad = |kind: u16, max: u16| (1..=max).contains(&(kind & NLA_TYPE_MASK));
    let bad_sel = |x: &NetnsSelAttr| matches!(x, NetnsSelAttr::Other(o) if bad(o.kind(), ENGINE_NETNS_SEL_NAME));
    let bad_sysctl =
        |x: &SysctlAttr| matches!(x, SysctlAttr::Other(o) if bad(o.kind(), ENGINE_SYSCTL_FLAGS));
    for a in &msg.attrs {
        let broken = match a {
            EngineAttr::Other(o) => bad(o.kind(), ENGINE_A_MAX),
            EngineAttr::Netns(v) => v.iter().any(bad_sel),
            EngineAttr::Sysctl(v) => v.iter().any(bad_sysctl),
            _ => false,
        };
        if broken {
            return Err(libc::EINVAL);
        }
    }
    Ok(())
}

/// The namespace selector, if the request has one (a nest without a selector is `EINVAL`).
fn selector(msg: &EngineMessage) -> Result<Option<NetnsSelector>, Errno> {
    match msg.attrs.iter().find_map(|a| match a {
        EngineAttr::Netns(v) => Some(v),
        _ => None,
    }) {
        None => Ok(None),
        Some(v) => NetnsSelector::from_attrs(v).map(Some).ok_or(libc::EINVAL),
    }
}

fn knob(name: &str) -> Result<&'static Knob, Errno> {
    knob_index(name).map(|i| &KNOBS[i]).ok_or(libc::ENOENT)
}

fn sysctl_type(k: Kind) -> SysctlType {
    match k {
        Kind::Int => SysctlType::Int,
        Kind::Uint => SysctlType::Uint,
        Kind::Seconds => SysctlType::Seconds,
        Kind::Str => SysctlType::Str,
    }
}

fn unit(name: &str) -> Option<&'static str> {
    Some(match name {
        "autocorking_size" | "wmem" | "rmem" | "autosplit_size" | "tx_chunk" => "bytes",
        "smcr_testlink_time" | "lgr_idle_time" => "seconds",
        "busy_poll_us" => "microseconds",
        _ => return None,
    })
}

/// A knob as `SYSCTL_LIST`/`GET`/`SET` describe it, with its value in namespace `ns` (the
/// default while smcd has no state for that namespace).
fn sysctl_info(ctx: &Ctx<'_>, ns: u64, k: &Knob) -> SysctlInfo {
    let state = ctx.daemon.namespaces.get(&ns);
    let numeric = k.kind != Kind::Str;
    let value = if numeric {
        let i = knob_index(k.name).expect("listed knob");
        SysctlValue::Num(state.map_or(k.default, |n| n.values[i]))
    } else {
        SysctlValue::Str(state.map(|n| n.hs_ctrl.clone()).unwrap_or_default())
    };
    SysctlInfo {
        name: k.name.to_owned(),
        kind: Some(sysctl_type(k.kind)),
        value: Some(value),
        min: numeric.then_some(k.min),
        max: numeric.then_some(k.max),
        default: Some(if numeric {
            SysctlValue::Num(k.default)
        } else {
            SysctlValue::Str(String::new())
        }),
        description: Some(k.description.to_owned()),
        unit: unit(k.name).map(str::to_owned),
        flags: Some(0),
        other: Vec::new(),
    }
}

/// Every namespace smcd knows and the caller's (or only `only`), with nothing counted yet.
fn netns_list(ctx: &Ctx<'_>, only: Option<u64>) -> BTreeMap<u64, NetnsInfo> {
    let names = netns::names();
    let mut set = netns::known(ctx.daemon);
    // The caller's own namespace, even before smcd has state for it.
    set.extend(ctx.caller_netns().ok());
    if let Some(o) = only {
        set.retain(|&i| i == o);
        set.insert(o);
    }
    set.into_iter()
        .map(|inode| {
            let info = NetnsInfo {
                inode,
                name: names.get(&inode).cloned(),
                sock_cnt: 0,
                lgr_cnt: 0,
                listen_cnt: 0,
                other: Vec::new(),
            };
            (inode, info)
        })
        .collect()
}

/// The ring of a DMB of `len` bytes (the CDC header comes first).
fn ring(dmb_len: u64) -> u64 {
    if dmb_len > DMB_CDC_LEN {
        dmb_len - DMB_CDC_LEN
    } else {
        dmb_len
    }
}

/// An absolute byte position as the kernel's `(wrap, count)` cursor in a ring of `size`.
pub fn cursor(pos: u64, size: u64) -> Cursor {
    if size == 0 {
        return Cursor {
            wrap: 0,
            count: pos as u32,
        };
    }
    Cursor {
        wrap: (pos / size) as u16,
        count: (pos % size) as u32,
    }
}

fn clamp32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// What `smcss` shows of one connection (smc_diag's `__smc_diag_dump`).
pub(crate) fn conn_sock(c: &ConnRecord, uid: u32, pid: u32, ns: u64) -> SockInfo {
    let id = &c.id;
    let mode = DiagMode::from(id.mode);
    let smc = matches!(mode, DiagMode::Smcd | DiagMode::Smcr);
    // Our ring takes the peer's data (rx_prod, tx_cons); the peer's ring ours (rx_cons,
    // tx_prod), and with the loopback device the send buffer is the peer's ring, so the tx
    // cursors wrap there too. A byte published is also sent and finished at once: tx_sent and
    // tx_fin are tx_prod (the engine does not write them).
    let (own, peer) = (ring(id.rmbe), ring(id.peer_rmbe));
    let k = |x: Curs| c.cursors[x as usize];
    let conn = smc.then(|| ConnInfo {
        token: id.token as u32,
        sndbuf_size: clamp32(id.sndbuf),
        rmbe_size: clamp32(own),
        peer_rmbe_size: clamp32(peer),
        rx_prod: cursor(k(Curs::RxProd), own),
        rx_cons: cursor(k(Curs::RxCons), peer),
        tx_prod: cursor(k(Curs::TxProd), peer),
        tx_cons: cursor(k(Curs::TxCons), own),
        tx_prep: cursor(k(Curs::TxPrep), peer),
        tx_sent: cursor(k(Curs::TxProd), peer),
        tx_fin: cursor(k(Curs::TxProd), peer),
        rx_prod_flags: c.flags[0],
        rx_conn_state_flags: c.flags[1],
        tx_prod_flags: c.flags[2],
        tx_conn_state_flags: c.flags[3],
    });
    let smcd = (mode == DiagMode::Smcd).then_some(SmcdSockInfo {
        gid: (id.gid >> 64) as u64,
        gid_ext: id.gid as u64,
        peer_gid: (id.peer_gid >> 64) as u64,
        peer_gid_ext: id.peer_gid as u64,
        token: id.token,
        peer_token: id.peer_token,
    });
    SockInfo {
        state: id.state,
        uid,
        inode: id.inode,
        local: id.local,
        peer: id.peer,
        ifindex: 0,
        mode,
        fallback_reason: id.fallback.0,
        peer_diagnosis: id.fallback.1,
        shutdown: c.shutdown,
        netns_inode: ns,
        pid: Some(pid),
        role: Some(id.role),
        lgr_id: smc.then_some(id.lgr),
        conn,
        smcd,
        smcr: None,
        other: Vec::new(),
    }
}

/// `smc_diag_fill_lgrinfo`: the link an SMC-R connection sends on, from its engine's
/// link-group records.
pub(crate) fn conn_link(c: &ConnRecord, lgrs: &[LgrRecord]) -> Option<SmcrSockInfo> {
    let g = lgrs.iter().find(|g| g.id == c.id.lgr && g.smcr.is_some())?;
    let l = g.smcr.as_ref()?.links.iter().find(|l| l.id == c.link)?;
    let link = super::smc::link_smcr(l);
    Some(SmcrSockInfo {
        link_id: l.id,
        ib_dev: link.ib_dev,
        ib_port: l.ib_port,
        gid: link.gid,
        peer_gid: link.peer_gid,
    })
}

/// A listening socket (no connection yet, so smc_diag's default mode).
pub(crate) fn listen_sock(l: &LstRecord, uid: u32, pid: u32, ns: u64) -> SockInfo {
    SockInfo {
        state: SMC_LISTEN,
        uid,
        inode: l.inode,
        local: Some(l.addr),
        mode: DiagMode::Smcr,
        netns_inode: ns,
        pid: Some(pid),
        ..SockInfo::default()
    }
}

/// `STATS_RESET`: the counters in `scope` read zero from now on.
fn reset_stats(ctx: &mut Ctx<'_>, ns: u64, scope: u32) -> Result<(), Errno> {
    let cur = ctx.daemon.totals(ns);
    let n = ctx.daemon.namespace(ns).map_err(|_| libc::ENOMEM)?;
    for (i, (b, c)) in n.baseline.iter_mut().zip(&cur).enumerate().take(N_TOTALS) {
        let fback = (T_CLNT_FBACK..T_SMCR).contains(&i);
        let wanted = if fback {
            scope & ENGINE_STATS_SCOPE_FBACK != 0
        } else {
            scope & ENGINE_STATS_SCOPE_COUNTERS != 0
        };
        if wanted {
            // totals() is raw - baseline, so the new baseline is the raw sum.
            *b = b.wrapping_add(*c);
        }
    }
    Ok(())
}
