//! `nlctrl` (family id 16): `CTRL_CMD_GETFAMILY` for the families smcd serves, as
//! `ctrl_getfamily` / `ctrl_dumpfamily` in `net/netlink/genetlink.c` answer it.
//!
//! A do request names the family by `CTRL_ATTR_FAMILY_ID` or `CTRL_ATTR_FAMILY_NAME` (the
//! name wins when both are given, as in the kernel); neither is `EINVAL`, an unknown one
//! `ENOENT`. A dump lists every family. The reply is `CTRL_CMD_NEWFAMILY` with the
//! attributes of `ctrl_fill_info`. nlctrl's own policy is not strict: unknown attributes
//! are ignored, a `FAMILY_ID` shorter than two bytes is `ERANGE`, a `FAMILY_NAME` without a
//! NUL in its first 16 bytes `EINVAL`.

use super::{Ctx, ENGINE_FAMILY_ID, Errno, NLCTRL_ID, Op, Out, Request, SMC_FAMILY_ID};
use smc_proto::netlink::ctrl::{
    CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME, CTRL_CMD_GETFAMILY, FamilyInfo, FamilyOp,
    GENL_CMD_CAP_DO, GENL_CMD_CAP_DUMP, GENL_CMD_CAP_HASPOL, McastGroup, NLCTRL_NAME,
    NLCTRL_VERSION,
};
use smc_proto::netlink::loopback::{
    LOOPBACK_FAMILY_ID, LOOPBACK_FAMILY_NAME, LOOPBACK_FAMILY_VERSION, LoopbackCmd,
};

/// `GENL_NAMSIZ`: family names are at most 15 characters and a NUL.
const GENL_NAMSIZ: usize = 16;
/// `CTRL_ATTR_MAX` (`CTRL_ATTR_OP`).
const CTRL_ATTR_MAX: u32 = 10;
/// The highest `SMCD_LOOPBACK` attribute (`SYN_OPTION`).
const LOOPBACK_ATTR_MAX: u32 = 22;

/// nlctrl's operations: only `GETFAMILY` (do and dump).
pub fn op(cmd: u8) -> Option<Op> {
    (cmd == CTRL_CMD_GETFAMILY).then_some(Op {
        dump: true,
        doit: true,
        admin: false,
    })
}

/// Every family smcd serves, in id order.
pub fn families() -> Vec<FamilyInfo> {
    vec![
        nlctrl(),
        FamilyInfo::smc_gen_netlink(SMC_FAMILY_ID),
        FamilyInfo::smcd_engine(ENGINE_FAMILY_ID),
        loopback(),
    ]
}

/// nlctrl itself, as the kernel registers it (`genl_ctrl`: version 2, the `notify` group).
fn nlctrl() -> FamilyInfo {
    FamilyInfo {
        id: NLCTRL_ID,
        name: NLCTRL_NAME.to_owned(),
        version: NLCTRL_VERSION.into(),
        hdrsize: 0,
        maxattr: CTRL_ATTR_MAX,
        ops: vec![FamilyOp {
            id: CTRL_CMD_GETFAMILY.into(),
            flags: GENL_CMD_CAP_DO | GENL_CMD_CAP_DUMP | GENL_CMD_CAP_HASPOL,
        }],
        mcast_groups: vec![McastGroup {
            name: "notify".to_owned(),
            id: NLCTRL_ID.into(),
        }],
    }
}

/// `SMCD_LOOPBACK`: the engine-to-smcd device channel. Its operations are the requests an
/// engine sends; `INTENT`, `INTENT_CANCEL` and `PEER_GONE` travel the other way and are not
/// operations.
fn loopback() -> FamilyInfo {
    let ops = [
        LoopbackCmd::Hello,
        LoopbackCmd::Listen,
        LoopbackCmd::Connect,
        LoopbackCmd::IntentDone,
        LoopbackCmd::DmbRegister,
        LoopbackCmd::DmbAttach,
        LoopbackCmd::DmbUnregister,
        LoopbackCmd::ListenerPage,
        LoopbackCmd::Events,
        LoopbackCmd::LgrIds,
    ];
    FamilyInfo {
        id: LOOPBACK_FAMILY_ID,
        name: LOOPBACK_FAMILY_NAME.to_owned(),
        version: LOOPBACK_FAMILY_VERSION.into(),
        hdrsize: 0,
        maxattr: LOOPBACK_ATTR_MAX,
        ops: ops
            .iter()
            .map(|c| FamilyOp {
                id: c.number().into(),
                flags: GENL_CMD_CAP_DO,
            })
            .collect(),
        mcast_groups: Vec::new(),
    }
}

pub(crate) fn handle(_ctx: &mut Ctx<'_>, req: &Request<'_>, out: &mut Out) -> Result<(), Errno> {
    let mut by_id = None;
    let mut by_name = None;
    for a in super::split_attrs(req.attrs, false)? {
        match a.kind {
            CTRL_ATTR_FAMILY_ID => {
                let v = a.value.get(..2).ok_or(libc::ERANGE)?;
                by_id = Some(u16::from_ne_bytes([v[0], v[1]]));
            }
            CTRL_ATTR_FAMILY_NAME => {
                let head = &a.value[..a.value.len().min(GENL_NAMSIZ)];
                let end = head.iter().position(|&b| b == 0).ok_or(libc::EINVAL)?;
                by_name = Some(&a.value[..end]);
            }
            _ => {}
        }
    }
    let all = families();
    if req.dump {
        out.dump(NLCTRL_ID, &req.header, all.iter().map(FamilyInfo::to_reply));
        return Ok(());
    }
    let found = match (by_name, by_id) {
        (Some(n), _) => all.iter().find(|f| f.name.as_bytes() == n),
        (None, Some(id)) => all.iter().find(|f| f.id == id),
        (None, None) => return Err(libc::EINVAL),
    };
    let f = found.ok_or(libc::ENOENT)?;
    out.reply(NLCTRL_ID, &req.header, f.to_reply());
    Ok(())
}
