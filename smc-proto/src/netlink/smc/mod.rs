//! The kernel's `SMC_GEN_NETLINK` generic netlink family (version 1, `hdrsize` 0, no
//! multicast groups, netns aware), numbered exactly as `include/uapi/linux/smc.h` of the
//! newest kernel ([`consts`]) and encoded as `net/smc/smc_netlink.c` and the `smc_nl_*`
//! functions of `smc_core.c`, `smc_ism.c`, `smc_ib.c`, `smc_stats.c`, `smc_clc.c` and
//! `af_smc.c` do.
//!
//! Quirks the types here take care of:
//!
//! * **Top-level attribute numbers depend on the command.** `GET_*` replies carry one nest
//!   from the `SMC_GEN_*` enum (SYS_INFO = 1 .. FBACK_STATS = 8); `DUMP_UEID`/`ADD_UEID`/
//!   `REMOVE_UEID` use `SMC_NLA_EID_TABLE_ENTRY` = 1; `DUMP_SEID` uses `SMC_NLA_SEID_ENTRY` = 1
//!   and `_ENABLED` = 2; `DUMP_HS_LIMITATION` uses `SMC_NLA_HS_LIMITATION_ENABLED` = 1. So
//!   [`SmcGenlMessage`] parses its attributes with the command in hand ([`AttrSpace`]).
//! * `GET_LINK_SMCR` answers with messages of *two* commands: per link group one
//!   `GET_LGR_SMCR` message, then one `GET_LINK_SMCR` message per link.
//! * The V2_COMMON nest numbers from 0; `LGR_D_CHID` is declared u16 but sent as u32;
//!   `*_ALLOC` and `*_RMB_USAGE` are `NLA_UINT` (4 or 8 bytes); nests carry `NLA_F_NESTED`
//!   (accepted without it too: older kernels opened DEV nests with `nla_nest_start_noflag`).
//! * u64 counters are written with `nla_put_u64_64bit`, which adds a zero-length PAD attribute
//!   only on architectures without efficient unaligned access. We emit none (as x86-64,
//!   arm64, s390 and ppc64 kernels do) and keep PAD attributes we receive.

pub mod attrs;
pub mod consts;
pub mod types;

use netlink_packet_core::{DefaultNla, Emitable, NLA_F_NESTED, NLA_TYPE_MASK, Nla};
use netlink_packet_generic::{GenlFamily, GenlHeader};

use super::NlError;
use super::attr::{self, AttrCodec, Nest, Str, U8, attrs_len, default_fits, flags_ok};
use super::framing::{GenlPayload, impl_parseable_via_genl};

pub use attrs::*;
use consts::*;
pub use types::*;

/// A `SMC_GEN_NETLINK` command (`genlmsghdr.cmd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SmcCmd {
    /// 1: dump, system info.
    GetSysInfo,
    /// 2: dump, SMC-R link groups.
    GetLgrSmcr,
    /// 3: dump, SMC-R link groups each followed by its links.
    GetLinkSmcr,
    /// 4: dump, SMC-D link groups.
    GetLgrSmcd,
    /// 5: dump, SMC-D devices.
    GetDevSmcd,
    /// 6: dump, SMC-R devices.
    GetDevSmcr,
    /// 7: dump, statistics.
    GetStats,
    /// 8: dump, fallback reasons.
    GetFbackStats,
    /// 9: dump, user EIDs.
    DumpUeid,
    /// 10: do (admin), add a user EID.
    AddUeid,
    /// 11: do (admin), remove a user EID.
    RemoveUeid,
    /// 12: do (admin), remove all user EIDs.
    FlushUeid,
    /// 13: dump, system EID.
    DumpSeid,
    /// 14: do (admin), enable the system EID (EOPNOTSUPP off s390).
    EnableSeid,
    /// 15: do (admin), disable the system EID.
    DisableSeid,
    /// 16: dump, handshake limitation flag.
    DumpHsLimitation,
    /// 17: do (admin), enable handshake limitation.
    EnableHsLimitation,
    /// 18: do (admin), disable handshake limitation.
    DisableHsLimitation,
    /// A command this crate does not know.
    Unknown(u8),
}

impl SmcCmd {
    /// All known commands, in number order (the order of the kernel's `smc_gen_nl_ops`).
    pub const ALL: [SmcCmd; 18] = [
        SmcCmd::GetSysInfo,
        SmcCmd::GetLgrSmcr,
        SmcCmd::GetLinkSmcr,
        SmcCmd::GetLgrSmcd,
        SmcCmd::GetDevSmcd,
        SmcCmd::GetDevSmcr,
        SmcCmd::GetStats,
        SmcCmd::GetFbackStats,
        SmcCmd::DumpUeid,
        SmcCmd::AddUeid,
        SmcCmd::RemoveUeid,
        SmcCmd::FlushUeid,
        SmcCmd::DumpSeid,
        SmcCmd::EnableSeid,
        SmcCmd::DisableSeid,
        SmcCmd::DumpHsLimitation,
        SmcCmd::EnableHsLimitation,
        SmcCmd::DisableHsLimitation,
    ];

    /// Whether the kernel implements this command as a dump (`.dumpit`); the others are
    /// `.doit` operations that need `CAP_NET_ADMIN` (`GENL_ADMIN_PERM`).
    pub fn is_dump(self) -> bool {
        matches!(
            self,
            SmcCmd::GetSysInfo
                | SmcCmd::GetLgrSmcr
                | SmcCmd::GetLinkSmcr
                | SmcCmd::GetLgrSmcd
                | SmcCmd::GetDevSmcd
                | SmcCmd::GetDevSmcr
                | SmcCmd::GetStats
                | SmcCmd::GetFbackStats
                | SmcCmd::DumpUeid
                | SmcCmd::DumpSeid
                | SmcCmd::DumpHsLimitation
        )
    }

    /// Which top-level attribute numbering messages of this command use.
    pub fn attr_space(self) -> AttrSpace {
        match self {
            SmcCmd::GetSysInfo
            | SmcCmd::GetLgrSmcr
            | SmcCmd::GetLinkSmcr
            | SmcCmd::GetLgrSmcd
            | SmcCmd::GetDevSmcd
            | SmcCmd::GetDevSmcr
            | SmcCmd::GetStats
            | SmcCmd::GetFbackStats => AttrSpace::Gen,
            SmcCmd::DumpUeid | SmcCmd::AddUeid | SmcCmd::RemoveUeid | SmcCmd::FlushUeid => {
                AttrSpace::EidTable
            }
            SmcCmd::DumpSeid | SmcCmd::EnableSeid | SmcCmd::DisableSeid => AttrSpace::Seid,
            SmcCmd::DumpHsLimitation | SmcCmd::EnableHsLimitation | SmcCmd::DisableHsLimitation => {
                AttrSpace::HsLimitation
            }
            SmcCmd::Unknown(_) => AttrSpace::Unknown,
        }
    }
}

impl From<u8> for SmcCmd {
    fn from(v: u8) -> Self {
        match v {
            SMC_NETLINK_GET_SYS_INFO => SmcCmd::GetSysInfo,
            SMC_NETLINK_GET_LGR_SMCR => SmcCmd::GetLgrSmcr,
            SMC_NETLINK_GET_LINK_SMCR => SmcCmd::GetLinkSmcr,
            SMC_NETLINK_GET_LGR_SMCD => SmcCmd::GetLgrSmcd,
            SMC_NETLINK_GET_DEV_SMCD => SmcCmd::GetDevSmcd,
            SMC_NETLINK_GET_DEV_SMCR => SmcCmd::GetDevSmcr,
            SMC_NETLINK_GET_STATS => SmcCmd::GetStats,
            SMC_NETLINK_GET_FBACK_STATS => SmcCmd::GetFbackStats,
            SMC_NETLINK_DUMP_UEID => SmcCmd::DumpUeid,
            SMC_NETLINK_ADD_UEID => SmcCmd::AddUeid,
            SMC_NETLINK_REMOVE_UEID => SmcCmd::RemoveUeid,
            SMC_NETLINK_FLUSH_UEID => SmcCmd::FlushUeid,
            SMC_NETLINK_DUMP_SEID => SmcCmd::DumpSeid,
            SMC_NETLINK_ENABLE_SEID => SmcCmd::EnableSeid,
            SMC_NETLINK_DISABLE_SEID => SmcCmd::DisableSeid,
            SMC_NETLINK_DUMP_HS_LIMITATION => SmcCmd::DumpHsLimitation,
            SMC_NETLINK_ENABLE_HS_LIMITATION => SmcCmd::EnableHsLimitation,
            SMC_NETLINK_DISABLE_HS_LIMITATION => SmcCmd::DisableHsLimitation,
            x => SmcCmd::Unknown(x),
        }
    }
}

impl From<SmcCmd> for u8 {
    fn from(c: SmcCmd) -> u8 {
        match c {
            SmcCmd::GetSysInfo => SMC_NETLINK_GET_SYS_INFO,
            SmcCmd::GetLgrSmcr => SMC_NETLINK_GET_LGR_SMCR,
            SmcCmd::GetLinkSmcr => SMC_NETLINK_GET_LINK_SMCR,
            SmcCmd::GetLgrSmcd => SMC_NETLINK_GET_LGR_SMCD,
            SmcCmd::GetDevSmcd => SMC_NETLINK_GET_DEV_SMCD,
            SmcCmd::GetDevSmcr => SMC_NETLINK_GET_DEV_SMCR,
            SmcCmd::GetStats => SMC_NETLINK_GET_STATS,
            SmcCmd::GetFbackStats => SMC_NETLINK_GET_FBACK_STATS,
            SmcCmd::DumpUeid => SMC_NETLINK_DUMP_UEID,
            SmcCmd::AddUeid => SMC_NETLINK_ADD_UEID,
            SmcCmd::RemoveUeid => SMC_NETLINK_REMOVE_UEID,
            SmcCmd::FlushUeid => SMC_NETLINK_FLUSH_UEID,
            SmcCmd::DumpSeid => SMC_NETLINK_DUMP_SEID,
            SmcCmd::EnableSeid => SMC_NETLINK_ENABLE_SEID,
            SmcCmd::DisableSeid => SMC_NETLINK_DISABLE_SEID,
            SmcCmd::DumpHsLimitation => SMC_NETLINK_DUMP_HS_LIMITATION,
            SmcCmd::EnableHsLimitation => SMC_NETLINK_ENABLE_HS_LIMITATION,
            SmcCmd::DisableHsLimitation => SMC_NETLINK_DISABLE_HS_LIMITATION,
            SmcCmd::Unknown(x) => x,
        }
    }
}

/// Which top-level attribute enum a message's attributes are numbered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttrSpace {
    /// `SMC_GEN_*` (commands 1..=8).
    Gen,
    /// `SMC_NLA_EID_TABLE_*` (commands 9..=12).
    EidTable,
    /// `SMC_NLA_SEID_*` (commands 13..=15).
    Seid,
    /// `SMC_NLA_HS_LIMITATION_*` (commands 16..=18).
    HsLimitation,
    /// Unknown command: every attribute is kept as `Other`.
    Unknown,
}

/// A top-level attribute of a `SMC_GEN_NETLINK` message. Which variants can appear depends on
/// the command (see [`AttrSpace`]); each variant emits its own number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SmcAttr {
    /// `SMC_GEN_SYS_INFO` (1).
    SysInfo(Vec<SysInfoAttr>),
    /// `SMC_GEN_LGR_SMCR` (2).
    LgrSmcr(Vec<LgrSmcrAttr>),
    /// `SMC_GEN_LINK_SMCR` (3).
    LinkSmcr(Vec<LinkSmcrAttr>),
    /// `SMC_GEN_LGR_SMCD` (4).
    LgrSmcd(Vec<LgrSmcdAttr>),
    /// `SMC_GEN_DEV_SMCD` (5).
    DevSmcd(Vec<DevAttr>),
    /// `SMC_GEN_DEV_SMCR` (6).
    DevSmcr(Vec<DevAttr>),
    /// `SMC_GEN_STATS` (7).
    Stats(Vec<StatsAttr>),
    /// `SMC_GEN_FBACK_STATS` (8).
    FbackStats(Vec<FbackStatsAttr>),
    /// `SMC_NLA_EID_TABLE_ENTRY` (1 in the EID commands): 32 blank-padded characters.
    EidTableEntry(String),
    /// `SMC_NLA_SEID_ENTRY` (1 in `DUMP_SEID`).
    SeidEntry(String),
    /// `SMC_NLA_SEID_ENABLED` (2 in `DUMP_SEID`).
    SeidEnabled(u8),
    /// `SMC_NLA_HS_LIMITATION_ENABLED` (1 in `DUMP_HS_LIMITATION`).
    HsLimitationEnabled(u8),
    /// Anything else, kept byte for byte.
    Other(DefaultNla),
}

/// Dispatches one operation over the codec of each variant.
macro_rules! with_codec {
    ($self:expr, |$v:ident, $c:ident, $k:ident| $body:expr, |$o:ident| $other:expr) => {
        match $self {
            SmcAttr::SysInfo($v) => {
                type $c = Nest<SysInfoAttr>;
                let $k = SMC_GEN_SYS_INFO;
                $body
            }
            SmcAttr::LgrSmcr($v) => {
                type $c = Nest<LgrSmcrAttr>;
                let $k = SMC_GEN_LGR_SMCR;
                $body
            }
            SmcAttr::LinkSmcr($v) => {
                type $c = Nest<LinkSmcrAttr>;
                let $k = SMC_GEN_LINK_SMCR;
                $body
            }
            SmcAttr::LgrSmcd($v) => {
                type $c = Nest<LgrSmcdAttr>;
                let $k = SMC_GEN_LGR_SMCD;
                $body
            }
            SmcAttr::DevSmcd($v) => {
                type $c = Nest<DevAttr>;
                let $k = SMC_GEN_DEV_SMCD;
                $body
            }
            SmcAttr::DevSmcr($v) => {
                type $c = Nest<DevAttr>;
                let $k = SMC_GEN_DEV_SMCR;
                $body
            }
            SmcAttr::Stats($v) => {
                type $c = Nest<StatsAttr>;
                let $k = SMC_GEN_STATS;
                $body
            }
            SmcAttr::FbackStats($v) => {
                type $c = Nest<FbackStatsAttr>;
                let $k = SMC_GEN_FBACK_STATS;
                $body
            }
            SmcAttr::EidTableEntry($v) => {
                type $c = Str;
                let $k = SMC_NLA_EID_TABLE_ENTRY;
                $body
            }
            SmcAttr::SeidEntry($v) => {
                type $c = Str;
                let $k = SMC_NLA_SEID_ENTRY;
                $body
            }
            SmcAttr::SeidEnabled($v) => {
                type $c = U8;
                let $k = SMC_NLA_SEID_ENABLED;
                $body
            }
            SmcAttr::HsLimitationEnabled($v) => {
                type $c = U8;
                let $k = SMC_NLA_HS_LIMITATION_ENABLED;
                $body
            }
            SmcAttr::Other($o) => $other,
        }
    };
}

impl Nla for SmcAttr {
    fn value_len(&self) -> usize {
        with_codec!(self, |v, C, _k| C::len(v), |o| o.value_len())
    }

    fn kind(&self) -> u16 {
        with_codec!(
            self,
            |_v, C, k| if C::NESTED { k | NLA_F_NESTED } else { k },
            |o| o.kind()
        )
    }

    fn emit_value(&self, buf: &mut [u8]) {
        with_codec!(self, |v, C, _k| C::emit(v, buf), |o| o.emit_value(buf))
    }
}

fn decode<C: AttrCodec>(flags: u16, value: &[u8]) -> Option<C::Value> {
    if flags_ok::<C>(flags) {
        C::parse(value)
    } else {
        None
    }
}

impl SmcAttr {
    /// Decodes one top-level attribute in the given numbering. Never fails.
    pub fn parse_in(space: AttrSpace, kind_raw: u16, value: &[u8]) -> Self {
        let kind = kind_raw & NLA_TYPE_MASK;
        let flags = kind_raw & !NLA_TYPE_MASK;
        let parsed = match (space, kind) {
            (AttrSpace::Gen, SMC_GEN_SYS_INFO) => {
                decode::<Nest<SysInfoAttr>>(flags, value).map(SmcAttr::SysInfo)
            }
            (AttrSpace::Gen, SMC_GEN_LGR_SMCR) => {
                decode::<Nest<LgrSmcrAttr>>(flags, value).map(SmcAttr::LgrSmcr)
            }
            (AttrSpace::Gen, SMC_GEN_LINK_SMCR) => {
                decode::<Nest<LinkSmcrAttr>>(flags, value).map(SmcAttr::LinkSmcr)
            }
            (AttrSpace::Gen, SMC_GEN_LGR_SMCD) => {
                decode::<Nest<LgrSmcdAttr>>(flags, value).map(SmcAttr::LgrSmcd)
            }
            (AttrSpace::Gen, SMC_GEN_DEV_SMCD) => {
                decode::<Nest<DevAttr>>(flags, value).map(SmcAttr::DevSmcd)
            }
            (AttrSpace::Gen, SMC_GEN_DEV_SMCR) => {
                decode::<Nest<DevAttr>>(flags, value).map(SmcAttr::DevSmcr)
            }
            (AttrSpace::Gen, SMC_GEN_STATS) => {
                decode::<Nest<StatsAttr>>(flags, value).map(SmcAttr::Stats)
            }
            (AttrSpace::Gen, SMC_GEN_FBACK_STATS) => {
                decode::<Nest<FbackStatsAttr>>(flags, value).map(SmcAttr::FbackStats)
            }
            (AttrSpace::EidTable, SMC_NLA_EID_TABLE_ENTRY) => {
                decode::<Str>(flags, value).map(SmcAttr::EidTableEntry)
            }
            (AttrSpace::Seid, SMC_NLA_SEID_ENTRY) => {
                decode::<Str>(flags, value).map(SmcAttr::SeidEntry)
            }
            (AttrSpace::Seid, SMC_NLA_SEID_ENABLED) => {
                decode::<U8>(flags, value).map(SmcAttr::SeidEnabled)
            }
            (AttrSpace::HsLimitation, SMC_NLA_HS_LIMITATION_ENABLED) => {
                decode::<U8>(flags, value).map(SmcAttr::HsLimitationEnabled)
            }
            _ => None,
        };
        parsed.unwrap_or_else(|| SmcAttr::Other(DefaultNla::new(kind_raw, value.to_vec())))
    }

    /// Whether the attribute fits netlink's 16-bit attribute length (recursively).
    pub fn fits(&self) -> bool {
        with_codec!(self, |v, C, _k| C::fits(v), |o| default_fits(o))
    }
}

/// A `SMC_GEN_NETLINK` message: the command and its top-level attributes.
///
/// Requests from smc-tools carry no attributes except `ADD_UEID`/`REMOVE_UEID`; replies carry
/// one nest (or the EID/SEID/limitation attributes). Build them with the constructors below
/// and read them with the accessors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmcGenlMessage {
    /// The command.
    pub cmd: SmcCmd,
    /// Top-level attributes, in order.
    pub attrs: Vec<SmcAttr>,
}

impl SmcGenlMessage {
    /// A message with the given command and attributes.
    pub fn new(cmd: SmcCmd, attrs: Vec<SmcAttr>) -> Self {
        Self { cmd, attrs }
    }

    /// A request without attributes (every dump, `FLUSH_UEID`, `ENABLE_*`, `DISABLE_*`).
    pub fn request(cmd: SmcCmd) -> Self {
        Self::new(cmd, Vec::new())
    }

    /// `ADD_UEID` with the 32-character entry (33 bytes with the NUL, as the kernel requires).
    pub fn add_ueid(ueid: &Ueid) -> Self {
        Self::new(
            SmcCmd::AddUeid,
            vec![SmcAttr::EidTableEntry(ueid.as_padded().to_owned())],
        )
    }

    /// `REMOVE_UEID` with the 32-character entry.
    pub fn remove_ueid(ueid: &Ueid) -> Self {
        Self::new(
            SmcCmd::RemoveUeid,
            vec![SmcAttr::EidTableEntry(ueid.as_padded().to_owned())],
        )
    }

    /// `GET_SYS_INFO` reply.
    pub fn sys_info_reply(info: &SysInfo) -> Self {
        Self::new(SmcCmd::GetSysInfo, vec![SmcAttr::SysInfo(info.to_attrs())])
    }

    /// One `GET_LGR_SMCR` reply message (also sent inside `GET_LINK_SMCR` dumps).
    pub fn lgr_smcr_reply(lgr: &LgrSmcr) -> Self {
        Self::new(SmcCmd::GetLgrSmcr, vec![SmcAttr::LgrSmcr(lgr.to_attrs())])
    }

    /// One `GET_LINK_SMCR` link message.
    pub fn link_smcr_reply(link: &LinkSmcr) -> Self {
        Self::new(
            SmcCmd::GetLinkSmcr,
            vec![SmcAttr::LinkSmcr(link.to_attrs())],
        )
    }

    /// One `GET_LGR_SMCD` reply message.
    pub fn lgr_smcd_reply(lgr: &LgrSmcd) -> Self {
        Self::new(SmcCmd::GetLgrSmcd, vec![SmcAttr::LgrSmcd(lgr.to_attrs())])
    }

    /// One `GET_DEV_SMCD` reply message.
    pub fn dev_smcd_reply(dev: &DevInfo) -> Self {
        Self::new(SmcCmd::GetDevSmcd, vec![SmcAttr::DevSmcd(dev.to_attrs())])
    }

    /// One `GET_DEV_SMCR` reply message.
    pub fn dev_smcr_reply(dev: &DevInfo) -> Self {
        Self::new(SmcCmd::GetDevSmcr, vec![SmcAttr::DevSmcr(dev.to_attrs())])
    }

    /// The `GET_STATS` reply.
    pub fn stats_reply(stats: &StatsReply) -> Self {
        Self::new(SmcCmd::GetStats, vec![SmcAttr::Stats(stats.to_attrs())])
    }

    /// One `GET_FBACK_STATS` reply message.
    pub fn fback_stats_reply(f: &FbackStats) -> Self {
        Self::new(
            SmcCmd::GetFbackStats,
            vec![SmcAttr::FbackStats(f.to_attrs())],
        )
    }

    /// One `DUMP_UEID` reply message.
    pub fn ueid_reply(ueid: &Ueid) -> Self {
        Self::new(
            SmcCmd::DumpUeid,
            vec![SmcAttr::EidTableEntry(ueid.as_padded().to_owned())],
        )
    }

    /// The `DUMP_SEID` reply: empty when not ISMv2 capable, as the kernel does.
    pub fn seid_reply(seid: Option<&SeidInfo>) -> Self {
        let attrs = match seid {
            Some(s) => vec![
                SmcAttr::SeidEntry(s.seid.clone()),
                SmcAttr::SeidEnabled(s.enabled.into()),
            ],
            None => Vec::new(),
        };
        Self::new(SmcCmd::DumpSeid, attrs)
    }

    /// The `DUMP_HS_LIMITATION` reply.
    pub fn hs_limitation_reply(enabled: bool) -> Self {
        Self::new(
            SmcCmd::DumpHsLimitation,
            vec![SmcAttr::HsLimitationEnabled(enabled.into())],
        )
    }

    /// The system info nest, if present.
    pub fn sys_info(&self) -> Option<SysInfo> {
        self.attrs.iter().find_map(|a| match a {
            SmcAttr::SysInfo(v) => Some(SysInfo::from_attrs(v)),
            _ => None,
        })
    }

    /// The SMC-R link group nest, if present.
    pub fn lgr_smcr(&self) -> Option<LgrSmcr> {
        self.attrs.iter().find_map(|a| match a {
            SmcAttr::LgrSmcr(v) => Some(LgrSmcr::from_attrs(v)),
            _ => None,
        })
    }

    /// The SMC-R link nest, if present.
    pub fn link_smcr(&self) -> Option<LinkSmcr> {
        self.attrs.iter().find_map(|a| match a {
            SmcAttr::LinkSmcr(v) => Some(LinkSmcr::from_attrs(v)),
            _ => None,
        })
    }

    /// The SMC-D link group nest, if present.
    pub fn lgr_smcd(&self) -> Option<LgrSmcd> {
        self.attrs.iter().find_map(|a| match a {
            SmcAttr::LgrSmcd(v) => Some(LgrSmcd::from_attrs(v)),
            _ => None,
        })
    }

    /// The SMC-D device nest, if present.
    pub fn dev_smcd(&self) -> Option<DevInfo> {
        self.attrs.iter().find_map(|a| match a {
            SmcAttr::DevSmcd(v) => Some(DevInfo::from_attrs(v)),
            _ => None,
        })
    }

    /// The SMC-R device nest, if present.
    pub fn dev_smcr(&self) -> Option<DevInfo> {
        self.attrs.iter().find_map(|a| match a {
            SmcAttr::DevSmcr(v) => Some(DevInfo::from_attrs(v)),
            _ => None,
        })
    }

    /// The statistics nest, if present.
    pub fn stats(&self) -> Option<StatsReply> {
        self.attrs.iter().find_map(|a| match a {
            SmcAttr::Stats(v) => Some(StatsReply::from_attrs(v)),
            _ => None,
        })
    }

    /// The fallback statistics nest, if present.
    pub fn fback_stats(&self) -> Option<FbackStats> {
        self.attrs.iter().find_map(|a| match a {
            SmcAttr::FbackStats(v) => Some(FbackStats::from_attrs(v)),
            _ => None,
        })
    }

    /// The raw `SMC_NLA_EID_TABLE_ENTRY` string, if present.
    pub fn eid_entry(&self) -> Option<&str> {
        self.attrs.iter().find_map(|a| match a {
            SmcAttr::EidTableEntry(s) => Some(s.as_str()),
            _ => None,
        })
    }

    /// The user EID of an `ADD_UEID`/`REMOVE_UEID` request or `DUMP_UEID` reply, validated
    /// as the kernel does (`None` if the attribute is absent).
    pub fn ueid(&self) -> Option<Result<Ueid, UeidError>> {
        self.eid_entry().map(Ueid::from_entry)
    }

    /// The `DUMP_SEID` content (`None` for the empty reply of a non-ISMv2 system).
    pub fn seid(&self) -> Option<SeidInfo> {
        let mut entry = None;
        let mut enabled = false;
        for a in &self.attrs {
            match a {
                SmcAttr::SeidEntry(s) => entry = Some(s.clone()),
                SmcAttr::SeidEnabled(e) => enabled = *e != 0,
                _ => {}
            }
        }
        entry.map(|seid| SeidInfo { seid, enabled })
    }

    /// The handshake limitation flag, if present.
    pub fn hs_limitation(&self) -> Option<bool> {
        self.attrs.iter().find_map(|a| match a {
            SmcAttr::HsLimitationEnabled(e) => Some(*e != 0),
            _ => None,
        })
    }
}

impl GenlFamily for SmcGenlMessage {
    fn family_name() -> &'static str {
        SMC_GENL_FAMILY_NAME
    }

    fn command(&self) -> u8 {
        self.cmd.into()
    }

    fn version(&self) -> u8 {
        SMC_GENL_FAMILY_VERSION
    }
}

impl Emitable for SmcGenlMessage {
    fn buffer_len(&self) -> usize {
        attrs_len(&self.attrs)
    }

    fn emit(&self, buffer: &mut [u8]) {
        attr::emit_attrs(&self.attrs, buffer)
    }
}

impl GenlPayload for SmcGenlMessage {
    fn parse_genl(header: &GenlHeader, attrs: &[u8]) -> Result<Self, NlError> {
        let cmd = SmcCmd::from(header.cmd);
        let space = cmd.attr_space();
        let attrs = attr::parse_top(attrs, |k, v| SmcAttr::parse_in(space, k, v))?;
        Ok(Self { cmd, attrs })
    }

    fn fits(&self) -> bool {
        self.attrs.iter().all(SmcAttr::fits)
    }
}

impl_parseable_via_genl!(SmcGenlMessage);
