//! The `nlctrl` generic netlink family (id 16, version 2): `CTRL_CMD_GETFAMILY` resolves a
//! family name to its id. Clients (smc-tools via libnl's `genl_ctrl_resolve`, `smcctl`) send
//! it first; `smcd` answers it for the families it serves, with the attributes and order of
//! the kernel's `ctrl_fill_info` (net/netlink/genetlink.c): `FAMILY_NAME`, `FAMILY_ID` (u16),
//! `VERSION`, `HDRSIZE`, `MAXATTR` (u32), then `OPS` (only if the family has operations: a
//! nest of nests numbered 1.., each `OP_ID` and `OP_FLAGS` u32, opened *without*
//! `NLA_F_NESTED`) and `MCAST_GROUPS` (only if it has multicast groups). The reply's command is
//! `CTRL_CMD_NEWFAMILY`, flags 0; an unknown name gets `NLMSG_ERROR` `-ENOENT`.
//!
//! Attribute values reuse `netlink-packet-generic`'s [`GenlCtrlAttrs`]; anything it does not
//! model (or would reject) is kept as [`CtrlAttr::Other`]. `CTRL_ATTR_POLICY` and
//! `CTRL_ATTR_OP_POLICY` are always kept raw: that crate's parser for them indexes short
//! values without checking.

use netlink_packet_core::{
    DefaultNla, Emitable, NLA_F_NESTED, NLA_TYPE_MASK, Nla, NlaBuffer, Parseable,
};
use netlink_packet_generic::ctrl::nlas::{GenlCtrlAttrs, McastGrpAttrs, OpAttrs};
use netlink_packet_generic::{GenlFamily, GenlHeader};

use super::NlError;
use super::attr::{self, MAX_ATTR_VALUE_LEN, NLA_HDRLEN, attrs_len, default_fits};
use super::framing::{GenlPayload, impl_parseable_via_genl};

pub use netlink_packet_generic::constants::{
    CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME, CTRL_ATTR_HDRSIZE, CTRL_ATTR_MAXATTR,
    CTRL_ATTR_MCAST_GROUPS, CTRL_ATTR_OP, CTRL_ATTR_OP_POLICY, CTRL_ATTR_OPS, CTRL_ATTR_POLICY,
    CTRL_ATTR_VERSION, CTRL_CMD_DELFAMILY, CTRL_CMD_GETFAMILY, CTRL_CMD_NEWFAMILY, GENL_ID_CTRL,
};

/// nlctrl's family name.
pub const NLCTRL_NAME: &str = "nlctrl";
/// nlctrl's version (`genl_ctrl.version`).
pub const NLCTRL_VERSION: u8 = 2;

/// `GENL_ADMIN_PERM`: the operation needs `CAP_NET_ADMIN`.
pub const GENL_ADMIN_PERM: u32 = 0x01;
/// `GENL_CMD_CAP_DO`: the operation has a do handler.
pub const GENL_CMD_CAP_DO: u32 = 0x02;
/// `GENL_CMD_CAP_DUMP`: the operation has a dump handler.
pub const GENL_CMD_CAP_DUMP: u32 = 0x04;
/// `GENL_CMD_CAP_HASPOL`: the operation validates attributes with a policy.
pub const GENL_CMD_CAP_HASPOL: u32 = 0x08;
/// `GENL_UNS_ADMIN_PERM`: needs `CAP_NET_ADMIN` in the namespace's user namespace.
pub const GENL_UNS_ADMIN_PERM: u32 = 0x10;

/// One nlctrl attribute: a value `netlink-packet-generic` decodes, or raw bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CtrlAttr {
    /// Decoded by `netlink-packet-generic`.
    Known(GenlCtrlAttrs),
    /// Kept byte for byte.
    Other(DefaultNla),
}

impl Nla for CtrlAttr {
    fn value_len(&self) -> usize {
        match self {
            CtrlAttr::Known(a) => a.value_len(),
            CtrlAttr::Other(o) => o.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            CtrlAttr::Known(a) => a.kind(),
            CtrlAttr::Other(o) => o.kind(),
        }
    }

    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            CtrlAttr::Known(a) => a.emit_value(buf),
            CtrlAttr::Other(o) => o.emit_value(buf),
        }
    }
}

impl CtrlAttr {
    /// Decodes one attribute. Never fails.
    pub fn parse_raw(kind_raw: u16, value: &[u8]) -> Self {
        let kind = kind_raw & NLA_TYPE_MASK;
        let flags = kind_raw & !NLA_TYPE_MASK;
        let nest = matches!(kind, CTRL_ATTR_OPS | CTRL_ATTR_MCAST_GROUPS);
        let delegate = matches!(
            kind,
            CTRL_ATTR_FAMILY_ID
                | CTRL_ATTR_FAMILY_NAME
                | CTRL_ATTR_VERSION
                | CTRL_ATTR_HDRSIZE
                | CTRL_ATTR_MAXATTR
                | CTRL_ATTR_OPS
                | CTRL_ATTR_MCAST_GROUPS
                | CTRL_ATTR_OP
        ) && (flags == 0 || (nest && flags == NLA_F_NESTED))
            // As for every nest in this module: an unaligned one is kept raw, so that
            // re-emitting it can never grow it past the 16-bit attribute length.
            && (!nest || value.len().is_multiple_of(4));
        if delegate {
            let mut buf = Vec::with_capacity(NLA_HDRLEN + value.len());
            // The value came out of an attribute, so its length fits the 16-bit field.
            let len = u16::try_from(NLA_HDRLEN + value.len()).unwrap_or(u16::MAX);
            buf.extend_from_slice(&len.to_ne_bytes());
            buf.extend_from_slice(&kind_raw.to_ne_bytes());
            buf.extend_from_slice(value);
            if let Ok(nla) = NlaBuffer::new_checked(&buf[..])
                && let Ok(a) = GenlCtrlAttrs::parse(&nla)
            {
                return CtrlAttr::Known(a);
            }
        }
        CtrlAttr::Other(DefaultNla::new(kind_raw, value.to_vec()))
    }

    fn fits(&self) -> bool {
        match self {
            CtrlAttr::Known(a) => a.value_len() <= MAX_ATTR_VALUE_LEN,
            CtrlAttr::Other(o) => default_fits(o),
        }
    }
}

/// An nlctrl message: a command (`CTRL_CMD_*`) and attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtrlMessage {
    /// `CTRL_CMD_*`.
    pub cmd: u8,
    /// Attributes in order.
    pub attrs: Vec<CtrlAttr>,
}

impl CtrlMessage {
    /// `CTRL_CMD_GETFAMILY` by name (send as a do request; the reply is a
    /// `CTRL_CMD_NEWFAMILY` message, see [`FamilyInfo::from_reply`]).
    pub fn get_family_by_name(name: &str) -> Self {
        Self {
            cmd: CTRL_CMD_GETFAMILY,
            attrs: vec![CtrlAttr::Known(GenlCtrlAttrs::FamilyName(name.to_owned()))],
        }
    }

    /// `CTRL_CMD_GETFAMILY` by id.
    pub fn get_family_by_id(id: u16) -> Self {
        Self {
            cmd: CTRL_CMD_GETFAMILY,
            attrs: vec![CtrlAttr::Known(GenlCtrlAttrs::FamilyId(id))],
        }
    }

    /// The family name a `GETFAMILY` request asks for.
    pub fn requested_name(&self) -> Option<&str> {
        self.attrs.iter().find_map(|a| match a {
            CtrlAttr::Known(GenlCtrlAttrs::FamilyName(n)) => Some(n.as_str()),
            _ => None,
        })
    }

    /// The family id a `GETFAMILY` request asks for (the kernel looks at the id first).
    pub fn requested_id(&self) -> Option<u16> {
        self.attrs.iter().find_map(|a| match a {
            CtrlAttr::Known(GenlCtrlAttrs::FamilyId(id)) => Some(*id),
            _ => None,
        })
    }
}

impl GenlFamily for CtrlMessage {
    fn family_name() -> &'static str {
        NLCTRL_NAME
    }

    fn family_id(&self) -> u16 {
        GENL_ID_CTRL
    }

    fn command(&self) -> u8 {
        self.cmd
    }

    fn version(&self) -> u8 {
        NLCTRL_VERSION
    }
}

impl Emitable for CtrlMessage {
    fn buffer_len(&self) -> usize {
        attrs_len(&self.attrs)
    }

    fn emit(&self, buffer: &mut [u8]) {
        attr::emit_attrs(&self.attrs, buffer)
    }
}

impl GenlPayload for CtrlMessage {
    fn parse_genl(header: &GenlHeader, attrs: &[u8]) -> Result<Self, NlError> {
        Ok(Self {
            cmd: header.cmd,
            attrs: attr::parse_top(attrs, CtrlAttr::parse_raw)?,
        })
    }

    fn fits(&self) -> bool {
        self.attrs.iter().all(CtrlAttr::fits)
    }
}

impl_parseable_via_genl!(CtrlMessage);

/// One operation of a family, as listed in `CTRL_ATTR_OPS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilyOp {
    /// The command number.
    pub id: u32,
    /// `GENL_*` flags.
    pub flags: u32,
}

/// One multicast group, as listed in `CTRL_ATTR_MCAST_GROUPS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McastGroup {
    /// Group name.
    pub name: String,
    /// Group id.
    pub id: u32,
}

/// What `CTRL_CMD_GETFAMILY` answers about a family.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FamilyInfo {
    /// Family id (`nlmsg_type` of its messages).
    pub id: u16,
    /// Family name.
    pub name: String,
    /// Family version.
    pub version: u32,
    /// Size of the family-specific header after `genlmsghdr`.
    pub hdrsize: u32,
    /// Highest attribute number of the family-wide policy.
    pub maxattr: u32,
    /// Operations (omitted from the reply when empty).
    pub ops: Vec<FamilyOp>,
    /// Multicast groups (omitted from the reply when empty).
    pub mcast_groups: Vec<McastGroup>,
}

impl FamilyInfo {
    /// Reads a `CTRL_CMD_NEWFAMILY` reply. The family id is required; the other fields
    /// default to 0/empty when absent.
    pub fn from_reply(msg: &CtrlMessage) -> Result<Self, NlError> {
        let mut info = FamilyInfo::default();
        let mut have_id = false;
        for a in &msg.attrs {
            let CtrlAttr::Known(a) = a else { continue };
            match a {
                GenlCtrlAttrs::FamilyId(x) => {
                    info.id = *x;
                    have_id = true;
                }
                GenlCtrlAttrs::FamilyName(x) => info.name = x.clone(),
                GenlCtrlAttrs::Version(x) => info.version = *x,
                GenlCtrlAttrs::HdrSize(x) => info.hdrsize = *x,
                GenlCtrlAttrs::MaxAttr(x) => info.maxattr = *x,
                GenlCtrlAttrs::Ops(ops) => {
                    info.ops = ops
                        .iter()
                        .map(|op| {
                            let mut o = FamilyOp { id: 0, flags: 0 };
                            for x in op {
                                match x {
                                    OpAttrs::Id(v) => o.id = *v,
                                    OpAttrs::Flags(v) => o.flags = *v,
                                }
                            }
                            o
                        })
                        .collect();
                }
                GenlCtrlAttrs::McastGroups(groups) => {
                    info.mcast_groups = groups
                        .iter()
                        .map(|g| {
                            let mut m = McastGroup {
                                name: String::new(),
                                id: 0,
                            };
                            for x in g {
                                match x {
                                    McastGrpAttrs::Name(v) => m.name = v.clone(),
                                    McastGrpAttrs::Id(v) => m.id = *v,
                                }
                            }
                            m
                        })
                        .collect();
                }
                _ => {}
            }
        }
        if !have_id {
            return Err(NlError::MissingAttribute("CTRL_ATTR_FAMILY_ID"));
        }
        Ok(info)
    }

    /// The `CTRL_CMD_NEWFAMILY` reply `ctrl_fill_info` would build for this family.
    pub fn to_reply(&self) -> CtrlMessage {
        let mut attrs = vec![
            CtrlAttr::Known(GenlCtrlAttrs::FamilyName(self.name.clone())),
            CtrlAttr::Known(GenlCtrlAttrs::FamilyId(self.id)),
            CtrlAttr::Known(GenlCtrlAttrs::Version(self.version)),
            CtrlAttr::Known(GenlCtrlAttrs::HdrSize(self.hdrsize)),
            CtrlAttr::Known(GenlCtrlAttrs::MaxAttr(self.maxattr)),
        ];
        if !self.ops.is_empty() {
            attrs.push(CtrlAttr::Known(GenlCtrlAttrs::Ops(
                self.ops
                    .iter()
                    .map(|o| vec![OpAttrs::Id(o.id), OpAttrs::Flags(o.flags)])
                    .collect(),
            )));
        }
        if !self.mcast_groups.is_empty() {
            attrs.push(CtrlAttr::Known(GenlCtrlAttrs::McastGroups(
                self.mcast_groups
                    .iter()
                    .map(|g| vec![McastGrpAttrs::Id(g.id), McastGrpAttrs::Name(g.name.clone())])
                    .collect(),
            )));
        }
        CtrlMessage {
            cmd: CTRL_CMD_NEWFAMILY,
            attrs,
        }
    }

    /// `SMC_GEN_NETLINK` as the kernel registers it: version 1, hdrsize 0, maxattr 1
    /// (`SMC_CMD_MAX_ATTR`, with a family policy), the 18 operations with the flags the
    /// kernel reports (dumps `CAP_DUMP|HASPOL` = 0x0c, admin do operations
    /// `ADMIN_PERM|CAP_DO|HASPOL` = 0x0b), no multicast groups. `id` is the daemon's choice.
    pub fn smc_gen_netlink(id: u16) -> Self {
        use super::smc::{SmcCmd, consts};
        FamilyInfo {
            id,
            name: consts::SMC_GENL_FAMILY_NAME.to_owned(),
            version: consts::SMC_GENL_FAMILY_VERSION.into(),
            hdrsize: 0,
            maxattr: 1,
            ops: SmcCmd::ALL
                .iter()
                .map(|&c| FamilyOp {
                    id: u8::from(c).into(),
                    flags: op_flags(c.is_dump(), !c.is_dump()),
                })
                .collect(),
            mcast_groups: Vec::new(),
        }
    }

    /// `SMCD_ENGINE`, as `smcd` registers it (see [`super::engine`]).
    pub fn smcd_engine(id: u16) -> Self {
        use super::engine::{self, EngineCmd};
        FamilyInfo {
            id,
            name: engine::SMCD_ENGINE_FAMILY_NAME.to_owned(),
            version: engine::SMCD_ENGINE_FAMILY_VERSION.into(),
            hdrsize: 0,
            maxattr: engine::ENGINE_A_MAX.into(),
            ops: EngineCmd::ALL
                .iter()
                .map(|&c| FamilyOp {
                    id: u8::from(c).into(),
                    flags: op_flags(c.is_dump(), c.needs_admin()),
                })
                .collect(),
            mcast_groups: Vec::new(),
        }
    }
}

/// Flags the kernel reports for an operation of a family with a policy (every operation of
/// such a family reports `HASPOL`).
fn op_flags(dump: bool, admin: bool) -> u32 {
    let cap = if dump {
        GENL_CMD_CAP_DUMP
    } else {
        GENL_CMD_CAP_DO
    };
    let perm = if admin { GENL_ADMIN_PERM } else { 0 };
    cap | perm | GENL_CMD_CAP_HASPOL
}
