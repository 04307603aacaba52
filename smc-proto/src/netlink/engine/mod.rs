//! The `SMCD_ENGINE` generic netlink family (version 1): what the kernel offers through
//! `/proc/sys/net/smc/*` (sysctls, per network namespace) and through sock_diag
//! (`NETLINK_SOCK_DIAG` with `AF_SMC`, used by `smcss`), carried in the same netlink framing
//! as `SMC_GEN_NETLINK` on `smcd`'s control socket. It is a separate family so that the
//! kernel's numbering stays untouched.
//!
//! # Stability
//!
//! This is a stable API between `smcd` and its clients. Every enum here is **append only**:
//! numbers are never reused or renumbered, new commands and attributes go at the end, and a
//! receiver keeps attributes it does not know (`Other`). Attribute 0 of every enum is unused.
//!
//! # Commands
//!
//! | # | command | kind | request attributes | reply |
//! |---|---|---|---|---|
//! | 1 | `SYSCTL_LIST` | dump | `NETNS`? | one message per knob: `NETNS_INODE`, `SYSCTL` (full entry) |
//! | 2 | `SYSCTL_GET` | do | `NETNS`?, `SYSCTL` { `NAME` } | one message: `NETNS_INODE`, `SYSCTL` |
//! | 3 | `SYSCTL_SET` | do, admin | `NETNS`?, `SYSCTL` { `NAME`, `VALUE` or `VALUE_STR` } | one message with the entry as it now is; `EINVAL` (old value kept) if out of range or of the wrong type, `ENOENT` for an unknown name, `EPERM` when not allowed |
//! | 4 | `NETNS_LIST` | dump | none | one message per namespace: `NETNS_ENTRY` |
//! | 5 | `SOCK_DUMP` | dump | `NETNS`?, `SOCK_STATES`? | one message per socket: `SOCK` |
//! | 6 | `STATS_RESET` | do, admin | `NETNS`?, `STATS_SCOPE`? | no reply message: success is the `NLMSG_ERROR` 0 ACK when `NLM_F_ACK` was set (as for the kernel's do commands), failure an `NLMSG_ERROR` with `-errno` |
//! | 7 | `INFO` | do | `NETNS`? | one message: `SYN_OPTION` (1: the SMC TCP option program is attached, engines get its maps; 0: intents only), `SYN_OPTION_CGROUP`? (where it is attached), `SYN_OPTION_STATUS` (why, in words), and the namespace's connections by path since the last `STATS_RESET` of its counters: `PATH_OPTION_CLIENT`, `PATH_OPTION_SERVER`, `PATH_INTENT_CLIENT`, `PATH_INTENT_SERVER` |
//!
//! Without `NETNS` a request applies to the namespace of the process that sent it (the
//! daemon identifies it by the peer's `/proc/<pid>/ns/net` inode).
//!
//! Values are host byte order, without PAD attributes (readers must use unaligned reads).
//! Socket addresses are in network order, ports in host order.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use netlink_packet_core::{DefaultNla, Emitable};
use netlink_packet_generic::{GenlFamily, GenlHeader};

use super::NlError;
use super::attr::{self, Attr, Bytes, Nest, Str, U8, U16, U32, U64, attr_enum, attrs_len};
use super::framing::{GenlPayload, impl_parseable_via_genl};

/// Family name.
pub const SMCD_ENGINE_FAMILY_NAME: &str = "SMCD_ENGINE";
/// Family version.
pub const SMCD_ENGINE_FAMILY_VERSION: u8 = 1;

/// Commands.
pub const ENGINE_CMD_SYSCTL_LIST: u8 = 1;
#[allow(missing_docs)]
pub const ENGINE_CMD_SYSCTL_GET: u8 = 2;
#[allow(missing_docs)]
pub const ENGINE_CMD_SYSCTL_SET: u8 = 3;
#[allow(missing_docs)]
pub const ENGINE_CMD_NETNS_LIST: u8 = 4;
#[allow(missing_docs)]
pub const ENGINE_CMD_SOCK_DUMP: u8 = 5;
#[allow(missing_docs)]
pub const ENGINE_CMD_STATS_RESET: u8 = 6;
#[allow(missing_docs)]
pub const ENGINE_CMD_INFO: u8 = 7;

/// Top-level attributes.
pub const ENGINE_A_NETNS: u16 = 1;
/// u64: the namespace a reply is about (its `/proc/<pid>/ns/net` inode).
pub const ENGINE_A_NETNS_INODE: u16 = 2;
/// nest: a sysctl ([`ENGINE_SYSCTL_NAME`] ..).
pub const ENGINE_A_SYSCTL: u16 = 3;
/// nest: a namespace ([`ENGINE_NETNS_INODE`] ..).
pub const ENGINE_A_NETNS_ENTRY: u16 = 4;
/// nest: a socket ([`ENGINE_SOCK_STATE`] ..).
pub const ENGINE_A_SOCK: u16 = 5;
/// u32: `SOCK_DUMP` filter, bit n set = include sockets in state n (0 or absent = all).
pub const ENGINE_A_SOCK_STATES: u16 = 6;
/// u32: `STATS_RESET` scope, [`ENGINE_STATS_SCOPE_COUNTERS`] | [`ENGINE_STATS_SCOPE_FBACK`]
/// (0 or absent = both).
pub const ENGINE_A_STATS_SCOPE: u16 = 7;
/// u8: the SMC TCP option program is attached (`INFO`).
pub const ENGINE_A_SYN_OPTION: u16 = 8;
/// string: the cgroup it is attached to (`INFO`).
pub const ENGINE_A_SYN_OPTION_CGROUP: u16 = 9;
/// string: why it is or is not in effect (`INFO`).
pub const ENGINE_A_SYN_OPTION_STATUS: u16 = 10;
/// u64: client connections decided by the SMC TCP option (`INFO`, per namespace).
pub const ENGINE_A_PATH_OPTION_CLIENT: u16 = 11;
/// u64: accepted connections whose client the SMC TCP option announced (`INFO`).
pub const ENGINE_A_PATH_OPTION_SERVER: u16 = 12;
/// u64: client connections decided by smcd's listener table or a connect intent (`INFO`).
pub const ENGINE_A_PATH_INTENT_CLIENT: u16 = 13;
/// u64: accepted connections whose client smcd announced by an intent (`INFO`).
pub const ENGINE_A_PATH_INTENT_SERVER: u16 = 14;
/// The highest top-level attribute.
pub const ENGINE_A_MAX: u16 = ENGINE_A_PATH_INTENT_SERVER;

/// Namespace selector nest: u64 netns inode.
pub const ENGINE_NETNS_SEL_INODE: u16 = 1;
/// Namespace selector nest: string, a path to a netns file (`/run/netns/NAME`, `/proc/PID/ns/net`).
pub const ENGINE_NETNS_SEL_PATH: u16 = 2;
/// Namespace selector nest: u32, the namespace of this process.
pub const ENGINE_NETNS_SEL_PID: u16 = 3;
/// Namespace selector nest: string, a name under `/run/netns` (as `ip netns` uses).
pub const ENGINE_NETNS_SEL_NAME: u16 = 4;

/// Sysctl nest: string, the knob's name as under `/proc/sys/net/smc` (`wmem`).
pub const ENGINE_SYSCTL_NAME: u16 = 1;
/// u8: [`SysctlType`].
pub const ENGINE_SYSCTL_TYPE: u16 = 2;
/// u64: value of a numeric knob (the kernel's int knobs are never negative).
pub const ENGINE_SYSCTL_VALUE: u16 = 3;
/// string: value of a string knob.
pub const ENGINE_SYSCTL_VALUE_STR: u16 = 4;
/// u64: smallest accepted value.
pub const ENGINE_SYSCTL_MIN: u16 = 5;
/// u64: largest accepted value.
pub const ENGINE_SYSCTL_MAX: u16 = 6;
/// u64: default of a numeric knob.
pub const ENGINE_SYSCTL_DEFAULT: u16 = 7;
/// string: default of a string knob.
pub const ENGINE_SYSCTL_DEFAULT_STR: u16 = 8;
/// string: one-line description.
pub const ENGINE_SYSCTL_DESC: u16 = 9;
/// string: unit ("bytes", "seconds", ..).
pub const ENGINE_SYSCTL_UNIT: u16 = 10;
/// u32: [`ENGINE_SYSCTL_F_READONLY`] ..
pub const ENGINE_SYSCTL_FLAGS: u16 = 11;

/// Sysctl flag: cannot be set through `SYSCTL_SET`.
pub const ENGINE_SYSCTL_F_READONLY: u32 = 1;

/// `STATS_RESET` scope bit: the `GET_STATS` counters.
pub const ENGINE_STATS_SCOPE_COUNTERS: u32 = 1;
/// `STATS_RESET` scope bit: the `GET_FBACK_STATS` reason table.
pub const ENGINE_STATS_SCOPE_FBACK: u32 = 2;

/// Namespace nest: u64 inode.
pub const ENGINE_NETNS_INODE: u16 = 1;
/// string: name under `/run/netns`, if the daemon knows one.
pub const ENGINE_NETNS_NAME: u16 = 2;
/// u32: SMC sockets.
pub const ENGINE_NETNS_SOCK_CNT: u16 = 3;
/// u32: link groups.
pub const ENGINE_NETNS_LGR_CNT: u16 = 4;
/// u32: SMC listeners.
pub const ENGINE_NETNS_LISTEN_CNT: u16 = 5;

/// Socket nest: u8 state (the kernel's `enum smc_state`: 1 ACTIVE, 2 INIT, 7 CLOSED,
/// 10 LISTEN, 20.. the closing states).
pub const ENGINE_SOCK_STATE: u16 = 1;
/// u32: owner uid.
pub const ENGINE_SOCK_UID: u16 = 2;
/// u64: socket inode (or the engine's socket id).
pub const ENGINE_SOCK_INODE: u16 = 3;
/// u8: address family (2 AF_INET, 10 AF_INET6).
pub const ENGINE_SOCK_FAMILY: u16 = 4;
/// binary: local address, 4 or 16 bytes, network order.
pub const ENGINE_SOCK_LOCAL_ADDR: u16 = 5;
/// u16: local port, host order.
pub const ENGINE_SOCK_LOCAL_PORT: u16 = 6;
/// binary: peer address.
pub const ENGINE_SOCK_PEER_ADDR: u16 = 7;
/// u16: peer port, host order.
pub const ENGINE_SOCK_PEER_PORT: u16 = 8;
/// u32: interface index.
pub const ENGINE_SOCK_IFINDEX: u16 = 9;
/// u8: [`DiagMode`] (smc_diag's 0 SMCR, 1 TCP, 2 SMCD).
pub const ENGINE_SOCK_MODE: u16 = 10;
/// u32: local fallback reason (SMC_CLC_DECL_*), 0 if none.
pub const ENGINE_SOCK_FALLBACK: u16 = 11;
/// u32: the peer's decline reason, 0 if none.
pub const ENGINE_SOCK_PEER_DIAGNOSIS: u16 = 12;
/// u8: shutdown bits (1 receive, 2 send; `sk_shutdown`).
pub const ENGINE_SOCK_SHUTDOWN: u16 = 13;
/// u32: connection token.
pub const ENGINE_SOCK_TOKEN: u16 = 14;
/// u32: send buffer size.
pub const ENGINE_SOCK_SNDBUF_SIZE: u16 = 15;
/// u32: own RMB (DMB) element size.
pub const ENGINE_SOCK_RMBE_SIZE: u16 = 16;
/// u32: peer RMB element size.
pub const ENGINE_SOCK_PEER_RMBE_SIZE: u16 = 17;
/// u64 cursor (`wrap << 32 | count`): received producer cursor.
pub const ENGINE_SOCK_RX_PROD: u16 = 18;
/// u64 cursor: received consumer cursor.
pub const ENGINE_SOCK_RX_CONS: u16 = 19;
/// u64 cursor: sent producer cursor.
pub const ENGINE_SOCK_TX_PROD: u16 = 20;
/// u64 cursor: sent consumer cursor.
pub const ENGINE_SOCK_TX_CONS: u16 = 21;
/// u64 cursor: send buffer, prepared.
pub const ENGINE_SOCK_TX_PREP: u16 = 22;
/// u64 cursor: send buffer, sent.
pub const ENGINE_SOCK_TX_SENT: u16 = 23;
/// u64 cursor: send buffer, confirmed.
pub const ENGINE_SOCK_TX_FIN: u16 = 24;
/// u8: received producer flags.
pub const ENGINE_SOCK_RX_PROD_FLAGS: u16 = 25;
/// u8: received connection state flags.
pub const ENGINE_SOCK_RX_CONN_STATE_FLAGS: u16 = 26;
/// u8: sent producer flags.
pub const ENGINE_SOCK_TX_PROD_FLAGS: u16 = 27;
/// u8: sent connection state flags.
pub const ENGINE_SOCK_TX_CONN_STATE_FLAGS: u16 = 28;
/// u32: link group id.
pub const ENGINE_SOCK_LGR_ID: u16 = 29;
/// u64: SMC-D local GID (first 64 bits).
pub const ENGINE_SOCK_LOCAL_GID: u16 = 30;
/// u64: SMC-D local GID extension (second 64 bits).
pub const ENGINE_SOCK_LOCAL_GID_EXT: u16 = 31;
/// u64: SMC-D peer GID.
pub const ENGINE_SOCK_PEER_GID: u16 = 32;
/// u64: SMC-D peer GID extension.
pub const ENGINE_SOCK_PEER_GID_EXT: u16 = 33;
/// u64: own DMB token.
pub const ENGINE_SOCK_DMB_TOKEN: u16 = 34;
/// u64: peer DMB token.
pub const ENGINE_SOCK_PEER_DMB_TOKEN: u16 = 35;
/// u8: 0 client, 1 server.
pub const ENGINE_SOCK_ROLE: u16 = 36;
/// u32: owning process.
pub const ENGINE_SOCK_PID: u16 = 37;
/// u64: network namespace inode.
pub const ENGINE_SOCK_NETNS_INODE: u16 = 38;
/// u8: SMC-R link id.
pub const ENGINE_SOCK_LINK_ID: u16 = 39;
/// string: SMC-R RDMA device.
pub const ENGINE_SOCK_IB_DEV: u16 = 40;
/// u8: SMC-R RDMA port.
pub const ENGINE_SOCK_IB_PORT: u16 = 41;
/// string: SMC-R local GID text.
pub const ENGINE_SOCK_R_GID: u16 = 42;
/// string: SMC-R peer GID text.
pub const ENGINE_SOCK_R_PEER_GID: u16 = 43;

/// An engine command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineCmd {
    /// 1, dump.
    SysctlList,
    /// 2, do.
    SysctlGet,
    /// 3, do, admin.
    SysctlSet,
    /// 4, dump.
    NetnsList,
    /// 5, dump.
    SockDump,
    /// 6, do, admin.
    StatsReset,
    /// 7, do.
    Info,
    /// Not known to this version.
    Unknown(u8),
}

impl EngineCmd {
    /// Every known command in number order.
    pub const ALL: [EngineCmd; 7] = [
        EngineCmd::SysctlList,
        EngineCmd::SysctlGet,
        EngineCmd::SysctlSet,
        EngineCmd::NetnsList,
        EngineCmd::SockDump,
        EngineCmd::StatsReset,
        EngineCmd::Info,
    ];

    /// Whether the command is a dump.
    pub fn is_dump(self) -> bool {
        matches!(
            self,
            EngineCmd::SysctlList | EngineCmd::NetnsList | EngineCmd::SockDump
        )
    }

    /// Whether the command changes state and needs `CAP_NET_ADMIN` (or the daemon's admin
    /// group).
    pub fn needs_admin(self) -> bool {
        matches!(self, EngineCmd::SysctlSet | EngineCmd::StatsReset)
    }
}

impl From<u8> for EngineCmd {
    fn from(v: u8) -> Self {
        match v {
            ENGINE_CMD_SYSCTL_LIST => EngineCmd::SysctlList,
            ENGINE_CMD_SYSCTL_GET => EngineCmd::SysctlGet,
            ENGINE_CMD_SYSCTL_SET => EngineCmd::SysctlSet,
            ENGINE_CMD_NETNS_LIST => EngineCmd::NetnsList,
            ENGINE_CMD_SOCK_DUMP => EngineCmd::SockDump,
            ENGINE_CMD_STATS_RESET => EngineCmd::StatsReset,
            ENGINE_CMD_INFO => EngineCmd::Info,
            x => EngineCmd::Unknown(x),
        }
    }
}

impl From<EngineCmd> for u8 {
    fn from(c: EngineCmd) -> u8 {
        match c {
            EngineCmd::SysctlList => ENGINE_CMD_SYSCTL_LIST,
            EngineCmd::SysctlGet => ENGINE_CMD_SYSCTL_GET,
            EngineCmd::SysctlSet => ENGINE_CMD_SYSCTL_SET,
            EngineCmd::NetnsList => ENGINE_CMD_NETNS_LIST,
            EngineCmd::SockDump => ENGINE_CMD_SOCK_DUMP,
            EngineCmd::StatsReset => ENGINE_CMD_STATS_RESET,
            EngineCmd::Info => ENGINE_CMD_INFO,
            EngineCmd::Unknown(x) => x,
        }
    }
}

attr_enum! {
    /// Namespace selector nest (one attribute).
    pub enum NetnsSelAttr {
        /// Netns inode.
        Inode(u64) = ENGINE_NETNS_SEL_INODE => U64,
        /// Path to a netns file.
        Path(String) = ENGINE_NETNS_SEL_PATH => Str,
        /// A process whose namespace is meant.
        Pid(u32) = ENGINE_NETNS_SEL_PID => U32,
        /// Name under `/run/netns`.
        Name(String) = ENGINE_NETNS_SEL_NAME => Str,
    }
}

attr_enum! {
    /// Sysctl nest.
    pub enum SysctlAttr {
        /// Knob name.
        Name(String) = ENGINE_SYSCTL_NAME => Str,
        /// [`SysctlType`] number.
        Type(u8) = ENGINE_SYSCTL_TYPE => U8,
        /// Numeric value.
        Value(u64) = ENGINE_SYSCTL_VALUE => U64,
        /// String value.
        ValueStr(String) = ENGINE_SYSCTL_VALUE_STR => Str,
        /// Minimum.
        Min(u64) = ENGINE_SYSCTL_MIN => U64,
        /// Maximum.
        Max(u64) = ENGINE_SYSCTL_MAX => U64,
        /// Numeric default.
        Default(u64) = ENGINE_SYSCTL_DEFAULT => U64,
        /// String default.
        DefaultStr(String) = ENGINE_SYSCTL_DEFAULT_STR => Str,
        /// Description.
        Desc(String) = ENGINE_SYSCTL_DESC => Str,
        /// Unit.
        Unit(String) = ENGINE_SYSCTL_UNIT => Str,
        /// Flags.
        Flags(u32) = ENGINE_SYSCTL_FLAGS => U32,
    }
}

attr_enum! {
    /// Namespace nest.
    pub enum NetnsAttr {
        /// Inode.
        Inode(u64) = ENGINE_NETNS_INODE => U64,
        /// Name.
        Name(String) = ENGINE_NETNS_NAME => Str,
        /// SMC sockets.
        SockCnt(u32) = ENGINE_NETNS_SOCK_CNT => U32,
        /// Link groups.
        LgrCnt(u32) = ENGINE_NETNS_LGR_CNT => U32,
        /// Listeners.
        ListenCnt(u32) = ENGINE_NETNS_LISTEN_CNT => U32,
    }
}

attr_enum! {
    /// Socket nest (modelled on `linux/smc_diag.h` and the columns of `smcss`).
    pub enum SockAttr {
        /// State.
        State(u8) = ENGINE_SOCK_STATE => U8,
        /// Uid.
        Uid(u32) = ENGINE_SOCK_UID => U32,
        /// Inode.
        Inode(u64) = ENGINE_SOCK_INODE => U64,
        /// Address family.
        Family(u8) = ENGINE_SOCK_FAMILY => U8,
        /// Local address bytes.
        LocalAddr(Vec<u8>) = ENGINE_SOCK_LOCAL_ADDR => Bytes,
        /// Local port.
        LocalPort(u16) = ENGINE_SOCK_LOCAL_PORT => U16,
        /// Peer address bytes.
        PeerAddr(Vec<u8>) = ENGINE_SOCK_PEER_ADDR => Bytes,
        /// Peer port.
        PeerPort(u16) = ENGINE_SOCK_PEER_PORT => U16,
        /// Interface index.
        Ifindex(u32) = ENGINE_SOCK_IFINDEX => U32,
        /// Mode.
        Mode(u8) = ENGINE_SOCK_MODE => U8,
        /// Local fallback reason.
        Fallback(u32) = ENGINE_SOCK_FALLBACK => U32,
        /// Peer's reason.
        PeerDiagnosis(u32) = ENGINE_SOCK_PEER_DIAGNOSIS => U32,
        /// Shutdown bits.
        Shutdown(u8) = ENGINE_SOCK_SHUTDOWN => U8,
        /// Token.
        Token(u32) = ENGINE_SOCK_TOKEN => U32,
        /// Send buffer size.
        SndbufSize(u32) = ENGINE_SOCK_SNDBUF_SIZE => U32,
        /// RMBE size.
        RmbeSize(u32) = ENGINE_SOCK_RMBE_SIZE => U32,
        /// Peer RMBE size.
        PeerRmbeSize(u32) = ENGINE_SOCK_PEER_RMBE_SIZE => U32,
        /// Cursor.
        RxProd(u64) = ENGINE_SOCK_RX_PROD => U64,
        /// Cursor.
        RxCons(u64) = ENGINE_SOCK_RX_CONS => U64,
        /// Cursor.
        TxProd(u64) = ENGINE_SOCK_TX_PROD => U64,
        /// Cursor.
        TxCons(u64) = ENGINE_SOCK_TX_CONS => U64,
        /// Cursor.
        TxPrep(u64) = ENGINE_SOCK_TX_PREP => U64,
        /// Cursor.
        TxSent(u64) = ENGINE_SOCK_TX_SENT => U64,
        /// Cursor.
        TxFin(u64) = ENGINE_SOCK_TX_FIN => U64,
        /// Flags.
        RxProdFlags(u8) = ENGINE_SOCK_RX_PROD_FLAGS => U8,
        /// Flags.
        RxConnStateFlags(u8) = ENGINE_SOCK_RX_CONN_STATE_FLAGS => U8,
        /// Flags.
        TxProdFlags(u8) = ENGINE_SOCK_TX_PROD_FLAGS => U8,
        /// Flags.
        TxConnStateFlags(u8) = ENGINE_SOCK_TX_CONN_STATE_FLAGS => U8,
        /// Link group id.
        LgrId(u32) = ENGINE_SOCK_LGR_ID => U32,
        /// SMC-D local GID.
        LocalGid(u64) = ENGINE_SOCK_LOCAL_GID => U64,
        /// SMC-D local GID extension.
        LocalGidExt(u64) = ENGINE_SOCK_LOCAL_GID_EXT => U64,
        /// SMC-D peer GID.
        PeerGid(u64) = ENGINE_SOCK_PEER_GID => U64,
        /// SMC-D peer GID extension.
        PeerGidExt(u64) = ENGINE_SOCK_PEER_GID_EXT => U64,
        /// Own DMB token.
        DmbToken(u64) = ENGINE_SOCK_DMB_TOKEN => U64,
        /// Peer DMB token.
        PeerDmbToken(u64) = ENGINE_SOCK_PEER_DMB_TOKEN => U64,
        /// Role.
        Role(u8) = ENGINE_SOCK_ROLE => U8,
        /// Pid.
        Pid(u32) = ENGINE_SOCK_PID => U32,
        /// Netns inode.
        NetnsInode(u64) = ENGINE_SOCK_NETNS_INODE => U64,
        /// SMC-R link id.
        LinkId(u8) = ENGINE_SOCK_LINK_ID => U8,
        /// SMC-R device.
        IbDev(String) = ENGINE_SOCK_IB_DEV => Str,
        /// SMC-R port.
        IbPort(u8) = ENGINE_SOCK_IB_PORT => U8,
        /// SMC-R local GID text.
        RGid(String) = ENGINE_SOCK_R_GID => Str,
        /// SMC-R peer GID text.
        RPeerGid(String) = ENGINE_SOCK_R_PEER_GID => Str,
    }
}

attr_enum! {
    /// Top-level attribute of an engine message.
    pub enum EngineAttr {
        /// Namespace selector (requests).
        Netns(Vec<NetnsSelAttr>) = ENGINE_A_NETNS => Nest<NetnsSelAttr>,
        /// Namespace a reply is about.
        NetnsInode(u64) = ENGINE_A_NETNS_INODE => U64,
        /// A sysctl.
        Sysctl(Vec<SysctlAttr>) = ENGINE_A_SYSCTL => Nest<SysctlAttr>,
        /// A namespace.
        NetnsEntry(Vec<NetnsAttr>) = ENGINE_A_NETNS_ENTRY => Nest<NetnsAttr>,
        /// A socket.
        Sock(Vec<SockAttr>) = ENGINE_A_SOCK => Nest<SockAttr>,
        /// Socket state filter.
        SockStates(u32) = ENGINE_A_SOCK_STATES => U32,
        /// Statistics reset scope.
        StatsScope(u32) = ENGINE_A_STATS_SCOPE => U32,
        /// The SMC TCP option program is attached (1) or not (0).
        SynOption(u8) = ENGINE_A_SYN_OPTION => U8,
        /// The cgroup it is attached to.
        SynOptionCgroup(String) = ENGINE_A_SYN_OPTION_CGROUP => Str,
        /// Why it is or is not in effect.
        SynOptionStatus(String) = ENGINE_A_SYN_OPTION_STATUS => Str,
        /// Client connections decided by the option.
        PathOptionClient(u64) = ENGINE_A_PATH_OPTION_CLIENT => U64,
        /// Accepted connections announced by the option.
        PathOptionServer(u64) = ENGINE_A_PATH_OPTION_SERVER => U64,
        /// Client connections decided by smcd.
        PathIntentClient(u64) = ENGINE_A_PATH_INTENT_CLIENT => U64,
        /// Accepted connections announced by smcd.
        PathIntentServer(u64) = ENGINE_A_PATH_INTENT_SERVER => U64,
    }
}

/// Which namespace a request is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NetnsSelector {
    /// By inode of its netns file.
    Inode(u64),
    /// By path (`/run/netns/NAME`, `/proc/PID/ns/net`).
    Path(String),
    /// The namespace of a process.
    Pid(u32),
    /// By name under `/run/netns`.
    Name(String),
}

impl NetnsSelector {
    /// The selector nest.
    pub fn to_attrs(&self) -> Vec<NetnsSelAttr> {
        vec![match self {
            NetnsSelector::Inode(x) => NetnsSelAttr::Inode(*x),
            NetnsSelector::Path(x) => NetnsSelAttr::Path(x.clone()),
            NetnsSelector::Pid(x) => NetnsSelAttr::Pid(*x),
            NetnsSelector::Name(x) => NetnsSelAttr::Name(x.clone()),
        }]
    }

    /// The first selector in the nest (`None` if it holds none this version knows).
    pub fn from_attrs(attrs: &[NetnsSelAttr]) -> Option<Self> {
        attrs.iter().find_map(|a| match a {
            NetnsSelAttr::Inode(x) => Some(NetnsSelector::Inode(*x)),
            NetnsSelAttr::Path(x) => Some(NetnsSelector::Path(x.clone())),
            NetnsSelAttr::Pid(x) => Some(NetnsSelector::Pid(*x)),
            NetnsSelAttr::Name(x) => Some(NetnsSelector::Name(x.clone())),
            NetnsSelAttr::Other(_) => None,
        })
    }
}

/// The type of a sysctl knob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SysctlType {
    /// 0: `proc_dointvec` family (a C int).
    Int,
    /// 1: `proc_douintvec` family.
    Uint,
    /// 2: a string (`hs_ctrl`).
    Str,
    /// 3: jiffies shown as seconds (`proc_dointvec_jiffies`: `smcr_testlink_time`).
    Seconds,
    /// Not known to this version.
    Unknown(u8),
}

impl From<u8> for SysctlType {
    fn from(v: u8) -> Self {
        match v {
            0 => SysctlType::Int,
            1 => SysctlType::Uint,
            2 => SysctlType::Str,
            3 => SysctlType::Seconds,
            x => SysctlType::Unknown(x),
        }
    }
}

impl From<SysctlType> for u8 {
    fn from(t: SysctlType) -> u8 {
        match t {
            SysctlType::Int => 0,
            SysctlType::Uint => 1,
            SysctlType::Str => 2,
            SysctlType::Seconds => 3,
            SysctlType::Unknown(x) => x,
        }
    }
}

/// A sysctl value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SysctlValue {
    /// Numeric knobs.
    Num(u64),
    /// String knobs.
    Str(String),
}

/// A sysctl: everything `SYSCTL_LIST`/`SYSCTL_GET` answer, and the subset `SYSCTL_GET`
/// (name) and `SYSCTL_SET` (name, value) send. Absent attributes are `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SysctlInfo {
    /// Name under `/proc/sys/net/smc`.
    pub name: String,
    /// Type.
    pub kind: Option<SysctlType>,
    /// Current (or requested) value.
    pub value: Option<SysctlValue>,
    /// Minimum.
    pub min: Option<u64>,
    /// Maximum.
    pub max: Option<u64>,
    /// Default.
    pub default: Option<SysctlValue>,
    /// Description.
    pub description: Option<String>,
    /// Unit.
    pub unit: Option<String>,
    /// Flags ([`ENGINE_SYSCTL_F_READONLY`]).
    pub flags: Option<u32>,
    /// Attributes this version does not know.
    pub other: Vec<DefaultNla>,
}

impl SysctlInfo {
    /// The nest, in attribute-number order.
    pub fn to_attrs(&self) -> Vec<SysctlAttr> {
        let mut v = vec![SysctlAttr::Name(self.name.clone())];
        v.extend(self.kind.map(|k| SysctlAttr::Type(k.into())));
        match &self.value {
            Some(SysctlValue::Num(x)) => v.push(SysctlAttr::Value(*x)),
            Some(SysctlValue::Str(x)) => v.push(SysctlAttr::ValueStr(x.clone())),
            None => {}
        }
        v.extend(self.min.map(SysctlAttr::Min));
        v.extend(self.max.map(SysctlAttr::Max));
        match &self.default {
            Some(SysctlValue::Num(x)) => v.push(SysctlAttr::Default(*x)),
            Some(SysctlValue::Str(x)) => v.push(SysctlAttr::DefaultStr(x.clone())),
            None => {}
        }
        v.extend(self.description.clone().map(SysctlAttr::Desc));
        v.extend(self.unit.clone().map(SysctlAttr::Unit));
        v.extend(self.flags.map(SysctlAttr::Flags));
        v.extend(self.other.iter().cloned().map(SysctlAttr::Other));
        v
    }

    /// Reads the nest.
    pub fn from_attrs(attrs: &[SysctlAttr]) -> Self {
        let mut s = Self::default();
        for a in attrs {
            match a {
                SysctlAttr::Name(x) => s.name = x.clone(),
                SysctlAttr::Type(x) => s.kind = Some((*x).into()),
                SysctlAttr::Value(x) => s.value = Some(SysctlValue::Num(*x)),
                SysctlAttr::ValueStr(x) => s.value = Some(SysctlValue::Str(x.clone())),
                SysctlAttr::Min(x) => s.min = Some(*x),
                SysctlAttr::Max(x) => s.max = Some(*x),
                SysctlAttr::Default(x) => s.default = Some(SysctlValue::Num(*x)),
                SysctlAttr::DefaultStr(x) => s.default = Some(SysctlValue::Str(x.clone())),
                SysctlAttr::Desc(x) => s.description = Some(x.clone()),
                SysctlAttr::Unit(x) => s.unit = Some(x.clone()),
                SysctlAttr::Flags(x) => s.flags = Some(*x),
                SysctlAttr::Other(o) => s.other.push(o.clone()),
            }
        }
        s
    }
}

/// A network namespace known to the daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetnsInfo {
    /// Inode.
    pub inode: u64,
    /// Name under `/run/netns`, if known.
    pub name: Option<String>,
    /// SMC sockets.
    pub sock_cnt: u32,
    /// Link groups.
    pub lgr_cnt: u32,
    /// Listeners.
    pub listen_cnt: u32,
    /// Attributes this version does not know.
    pub other: Vec<DefaultNla>,
}

impl NetnsInfo {
    /// The nest.
    pub fn to_attrs(&self) -> Vec<NetnsAttr> {
        let mut v = vec![NetnsAttr::Inode(self.inode)];
        v.extend(self.name.clone().map(NetnsAttr::Name));
        v.extend([
            NetnsAttr::SockCnt(self.sock_cnt),
            NetnsAttr::LgrCnt(self.lgr_cnt),
            NetnsAttr::ListenCnt(self.listen_cnt),
        ]);
        v.extend(self.other.iter().cloned().map(NetnsAttr::Other));
        v
    }

    /// Reads the nest.
    pub fn from_attrs(attrs: &[NetnsAttr]) -> Self {
        let mut s = Self::default();
        for a in attrs {
            match a {
                NetnsAttr::Inode(x) => s.inode = *x,
                NetnsAttr::Name(x) => s.name = Some(x.clone()),
                NetnsAttr::SockCnt(x) => s.sock_cnt = *x,
                NetnsAttr::LgrCnt(x) => s.lgr_cnt = *x,
                NetnsAttr::ListenCnt(x) => s.listen_cnt = *x,
                NetnsAttr::Other(o) => s.other.push(o.clone()),
            }
        }
        s
    }
}

/// smc_diag's connection mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DiagMode {
    /// 0: SMC-R.
    #[default]
    Smcr,
    /// 1: fell back to TCP.
    Tcp,
    /// 2: SMC-D.
    Smcd,
    /// Not known to this version.
    Unknown(u8),
}

impl From<u8> for DiagMode {
    fn from(v: u8) -> Self {
        match v {
            0 => DiagMode::Smcr,
            1 => DiagMode::Tcp,
            2 => DiagMode::Smcd,
            x => DiagMode::Unknown(x),
        }
    }
}

impl From<DiagMode> for u8 {
    fn from(m: DiagMode) -> u8 {
        match m {
            DiagMode::Smcr => 0,
            DiagMode::Tcp => 1,
            DiagMode::Smcd => 2,
            DiagMode::Unknown(x) => x,
        }
    }
}

/// A cursor as smcss prints it (`wrap:count`), carried as `wrap << 32 | count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Cursor {
    /// Wrap count.
    pub wrap: u16,
    /// Offset.
    pub count: u32,
}

impl Cursor {
    /// The attribute value.
    pub fn to_u64(self) -> u64 {
        (u64::from(self.wrap) << 32) | u64::from(self.count)
    }

    /// From the attribute value (bits 48..64 are ignored).
    pub fn from_u64(v: u64) -> Self {
        Cursor {
            wrap: (v >> 32) as u16,
            count: v as u32,
        }
    }
}

/// Connection details (smc_diag's `SMC_DIAG_CONNINFO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnInfo {
    /// Token.
    pub token: u32,
    /// Send buffer size.
    pub sndbuf_size: u32,
    /// Own RMBE size.
    pub rmbe_size: u32,
    /// Peer RMBE size.
    pub peer_rmbe_size: u32,
    /// Received producer cursor.
    pub rx_prod: Cursor,
    /// Received consumer cursor.
    pub rx_cons: Cursor,
    /// Sent producer cursor.
    pub tx_prod: Cursor,
    /// Sent consumer cursor.
    pub tx_cons: Cursor,
    /// Send buffer prepared cursor.
    pub tx_prep: Cursor,
    /// Send buffer sent cursor.
    pub tx_sent: Cursor,
    /// Send buffer confirmed cursor.
    pub tx_fin: Cursor,
    /// Received producer flags.
    pub rx_prod_flags: u8,
    /// Received connection state flags.
    pub rx_conn_state_flags: u8,
    /// Sent producer flags.
    pub tx_prod_flags: u8,
    /// Sent connection state flags.
    pub tx_conn_state_flags: u8,
}

/// SMC-D details (smc_diag's `SMC_DIAG_DMBINFO`, with 128-bit GIDs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmcdSockInfo {
    /// Local GID.
    pub gid: u64,
    /// Local GID extension.
    pub gid_ext: u64,
    /// Peer GID.
    pub peer_gid: u64,
    /// Peer GID extension.
    pub peer_gid_ext: u64,
    /// Own DMB token.
    pub token: u64,
    /// Peer DMB token.
    pub peer_token: u64,
}

/// SMC-R details (smc_diag's `SMC_DIAG_LGRINFO`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SmcrSockInfo {
    /// Link id.
    pub link_id: u8,
    /// RDMA device.
    pub ib_dev: String,
    /// RDMA port.
    pub ib_port: u8,
    /// Local GID text.
    pub gid: String,
    /// Peer GID text.
    pub peer_gid: String,
}

/// One socket of a `SOCK_DUMP`, with what `smcss` prints (plain, `-d`, `-D`, `-R`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SockInfo {
    /// State (`enum smc_state`).
    pub state: u8,
    /// Owner uid.
    pub uid: u32,
    /// Inode.
    pub inode: u64,
    /// Local address and port.
    pub local: Option<SocketAddr>,
    /// Peer address and port.
    pub peer: Option<SocketAddr>,
    /// Interface index.
    pub ifindex: u32,
    /// Mode.
    pub mode: DiagMode,
    /// Local fallback reason (0 none).
    pub fallback_reason: u32,
    /// Peer's reason (0 none).
    pub peer_diagnosis: u32,
    /// Shutdown bits.
    pub shutdown: u8,
    /// Network namespace inode.
    pub netns_inode: u64,
    /// Owning process.
    pub pid: Option<u32>,
    /// 0 client, 1 server.
    pub role: Option<u8>,
    /// Link group id.
    pub lgr_id: Option<u32>,
    /// Connection details (SMC modes).
    pub conn: Option<ConnInfo>,
    /// SMC-D details.
    pub smcd: Option<SmcdSockInfo>,
    /// SMC-R details.
    pub smcr: Option<SmcrSockInfo>,
    /// Attributes this version does not know.
    pub other: Vec<DefaultNla>,
}

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

fn addr_bytes(a: &IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

fn sockaddr(family: u8, bytes: Option<&[u8]>, port: Option<u16>) -> Option<SocketAddr> {
    let ip = match (family, bytes?.len()) {
        (AF_INET, 4) => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes?).ok()?)),
        (AF_INET6, 16) => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes?).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port.unwrap_or(0)))
}

impl SockInfo {
    /// The nest, in attribute-number order.
    pub fn to_attrs(&self) -> Vec<SockAttr> {
        let mut v = vec![
            SockAttr::State(self.state),
            SockAttr::Uid(self.uid),
            SockAttr::Inode(self.inode),
        ];
        let family = match self.local.or(self.peer) {
            Some(SocketAddr::V4(_)) => Some(AF_INET),
            Some(SocketAddr::V6(_)) => Some(AF_INET6),
            None => None,
        };
        v.extend(family.map(SockAttr::Family));
        if let Some(a) = &self.local {
            v.push(SockAttr::LocalAddr(addr_bytes(&a.ip())));
            v.push(SockAttr::LocalPort(a.port()));
        }
        if let Some(a) = &self.peer {
            v.push(SockAttr::PeerAddr(addr_bytes(&a.ip())));
            v.push(SockAttr::PeerPort(a.port()));
        }
        v.extend([
            SockAttr::Ifindex(self.ifindex),
            SockAttr::Mode(self.mode.into()),
            SockAttr::Fallback(self.fallback_reason),
            SockAttr::PeerDiagnosis(self.peer_diagnosis),
            SockAttr::Shutdown(self.shutdown),
        ]);
        if let Some(c) = &self.conn {
            v.extend([
                SockAttr::Token(c.token),
                SockAttr::SndbufSize(c.sndbuf_size),
                SockAttr::RmbeSize(c.rmbe_size),
                SockAttr::PeerRmbeSize(c.peer_rmbe_size),
                SockAttr::RxProd(c.rx_prod.to_u64()),
                SockAttr::RxCons(c.rx_cons.to_u64()),
                SockAttr::TxProd(c.tx_prod.to_u64()),
                SockAttr::TxCons(c.tx_cons.to_u64()),
                SockAttr::TxPrep(c.tx_prep.to_u64()),
                SockAttr::TxSent(c.tx_sent.to_u64()),
                SockAttr::TxFin(c.tx_fin.to_u64()),
                SockAttr::RxProdFlags(c.rx_prod_flags),
                SockAttr::RxConnStateFlags(c.rx_conn_state_flags),
                SockAttr::TxProdFlags(c.tx_prod_flags),
                SockAttr::TxConnStateFlags(c.tx_conn_state_flags),
            ]);
        }
        v.extend(self.lgr_id.map(SockAttr::LgrId));
        if let Some(d) = &self.smcd {
            v.extend([
                SockAttr::LocalGid(d.gid),
                SockAttr::LocalGidExt(d.gid_ext),
                SockAttr::PeerGid(d.peer_gid),
                SockAttr::PeerGidExt(d.peer_gid_ext),
                SockAttr::DmbToken(d.token),
                SockAttr::PeerDmbToken(d.peer_token),
            ]);
        }
        v.extend(self.role.map(SockAttr::Role));
        v.extend(self.pid.map(SockAttr::Pid));
        v.push(SockAttr::NetnsInode(self.netns_inode));
        if let Some(r) = &self.smcr {
            v.extend([
                SockAttr::LinkId(r.link_id),
                SockAttr::IbDev(r.ib_dev.clone()),
                SockAttr::IbPort(r.ib_port),
                SockAttr::RGid(r.gid.clone()),
                SockAttr::RPeerGid(r.peer_gid.clone()),
            ]);
        }
        v.extend(self.other.iter().cloned().map(SockAttr::Other));
        v
    }

    /// Reads the nest. Connection, SMC-D and SMC-R details are present when their first
    /// attribute (`TOKEN`, `LOCAL_GID`, `IB_DEV`) is.
    pub fn from_attrs(attrs: &[SockAttr]) -> Self {
        let mut s = Self::default();
        let (mut family, mut laddr, mut lport, mut paddr, mut pport) =
            (0u8, None, None, None, None);
        let mut c = ConnInfo::default();
        let mut d = SmcdSockInfo::default();
        let mut r = SmcrSockInfo::default();
        let (mut have_c, mut have_d, mut have_r) = (false, false, false);
        for a in attrs {
            match a {
                SockAttr::State(x) => s.state = *x,
                SockAttr::Uid(x) => s.uid = *x,
                SockAttr::Inode(x) => s.inode = *x,
                SockAttr::Family(x) => family = *x,
                SockAttr::LocalAddr(x) => laddr = Some(x.as_slice()),
                SockAttr::LocalPort(x) => lport = Some(*x),
                SockAttr::PeerAddr(x) => paddr = Some(x.as_slice()),
                SockAttr::PeerPort(x) => pport = Some(*x),
                SockAttr::Ifindex(x) => s.ifindex = *x,
                SockAttr::Mode(x) => s.mode = (*x).into(),
                SockAttr::Fallback(x) => s.fallback_reason = *x,
                SockAttr::PeerDiagnosis(x) => s.peer_diagnosis = *x,
                SockAttr::Shutdown(x) => s.shutdown = *x,
                SockAttr::Token(x) => {
                    c.token = *x;
                    have_c = true;
                }
                SockAttr::SndbufSize(x) => c.sndbuf_size = *x,
                SockAttr::RmbeSize(x) => c.rmbe_size = *x,
                SockAttr::PeerRmbeSize(x) => c.peer_rmbe_size = *x,
                SockAttr::RxProd(x) => c.rx_prod = Cursor::from_u64(*x),
                SockAttr::RxCons(x) => c.rx_cons = Cursor::from_u64(*x),
                SockAttr::TxProd(x) => c.tx_prod = Cursor::from_u64(*x),
                SockAttr::TxCons(x) => c.tx_cons = Cursor::from_u64(*x),
                SockAttr::TxPrep(x) => c.tx_prep = Cursor::from_u64(*x),
                SockAttr::TxSent(x) => c.tx_sent = Cursor::from_u64(*x),
                SockAttr::TxFin(x) => c.tx_fin = Cursor::from_u64(*x),
                SockAttr::RxProdFlags(x) => c.rx_prod_flags = *x,
                SockAttr::RxConnStateFlags(x) => c.rx_conn_state_flags = *x,
                SockAttr::TxProdFlags(x) => c.tx_prod_flags = *x,
                SockAttr::TxConnStateFlags(x) => c.tx_conn_state_flags = *x,
                SockAttr::LgrId(x) => s.lgr_id = Some(*x),
                SockAttr::LocalGid(x) => {
                    d.gid = *x;
                    have_d = true;
                }
                SockAttr::LocalGidExt(x) => d.gid_ext = *x,
                SockAttr::PeerGid(x) => d.peer_gid = *x,
                SockAttr::PeerGidExt(x) => d.peer_gid_ext = *x,
                SockAttr::DmbToken(x) => d.token = *x,
                SockAttr::PeerDmbToken(x) => d.peer_token = *x,
                SockAttr::Role(x) => s.role = Some(*x),
                SockAttr::Pid(x) => s.pid = Some(*x),
                SockAttr::NetnsInode(x) => s.netns_inode = *x,
                SockAttr::LinkId(x) => r.link_id = *x,
                SockAttr::IbDev(x) => {
                    r.ib_dev = x.clone();
                    have_r = true;
                }
                SockAttr::IbPort(x) => r.ib_port = *x,
                SockAttr::RGid(x) => r.gid = x.clone(),
                SockAttr::RPeerGid(x) => r.peer_gid = x.clone(),
                SockAttr::Other(o) => s.other.push(o.clone()),
            }
        }
        s.local = sockaddr(family, laddr, lport);
        s.peer = sockaddr(family, paddr, pport);
        s.conn = have_c.then_some(c);
        s.smcd = have_d.then_some(d);
        s.smcr = have_r.then_some(r);
        s
    }
}

/// An `SMCD_ENGINE` message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineMessage {
    /// The command.
    pub cmd: EngineCmd,
    /// Top-level attributes.
    pub attrs: Vec<EngineAttr>,
}

fn with_netns(sel: Option<&NetnsSelector>, mut rest: Vec<EngineAttr>) -> Vec<EngineAttr> {
    let mut v: Vec<EngineAttr> = sel
        .map(|s| EngineAttr::Netns(s.to_attrs()))
        .into_iter()
        .collect();
    v.append(&mut rest);
    v
}

impl EngineMessage {
    /// A message with the given command and attributes.
    pub fn new(cmd: EngineCmd, attrs: Vec<EngineAttr>) -> Self {
        Self { cmd, attrs }
    }

    /// `SYSCTL_LIST` request.
    pub fn sysctl_list(netns: Option<&NetnsSelector>) -> Self {
        Self::new(EngineCmd::SysctlList, with_netns(netns, Vec::new()))
    }

    /// `SYSCTL_GET` request.
    pub fn sysctl_get(netns: Option<&NetnsSelector>, name: &str) -> Self {
        let s = SysctlInfo {
            name: name.to_owned(),
            ..Default::default()
        };
        Self::new(
            EngineCmd::SysctlGet,
            with_netns(netns, vec![EngineAttr::Sysctl(s.to_attrs())]),
        )
    }

    /// `SYSCTL_SET` request.
    pub fn sysctl_set(netns: Option<&NetnsSelector>, name: &str, value: SysctlValue) -> Self {
        let s = SysctlInfo {
            name: name.to_owned(),
            value: Some(value),
            ..Default::default()
        };
        Self::new(
            EngineCmd::SysctlSet,
            with_netns(netns, vec![EngineAttr::Sysctl(s.to_attrs())]),
        )
    }

    /// `NETNS_LIST` request.
    pub fn netns_list() -> Self {
        Self::new(EngineCmd::NetnsList, Vec::new())
    }

    /// `SOCK_DUMP` request; `states` is a bit mask of `smc_state` numbers (`None` = all).
    pub fn sock_dump(netns: Option<&NetnsSelector>, states: Option<u32>) -> Self {
        Self::new(
            EngineCmd::SockDump,
            with_netns(
                netns,
                states.map(EngineAttr::SockStates).into_iter().collect(),
            ),
        )
    }

    /// `STATS_RESET` request; `scope` as [`ENGINE_A_STATS_SCOPE`] (`None` = everything).
    pub fn stats_reset(netns: Option<&NetnsSelector>, scope: Option<u32>) -> Self {
        Self::new(
            EngineCmd::StatsReset,
            with_netns(
                netns,
                scope.map(EngineAttr::StatsScope).into_iter().collect(),
            ),
        )
    }

    /// `INFO` request, about `netns` (`None`: the sender's namespace).
    pub fn info(netns: Option<&NetnsSelector>) -> Self {
        Self::new(EngineCmd::Info, with_netns(netns, Vec::new()))
    }

    /// A sysctl reply message (`cmd` is the request's: list, get or set).
    pub fn sysctl_reply(cmd: EngineCmd, netns_inode: u64, sysctl: &SysctlInfo) -> Self {
        Self::new(
            cmd,
            vec![
                EngineAttr::NetnsInode(netns_inode),
                EngineAttr::Sysctl(sysctl.to_attrs()),
            ],
        )
    }

    /// A `NETNS_LIST` reply message.
    pub fn netns_reply(ns: &NetnsInfo) -> Self {
        Self::new(
            EngineCmd::NetnsList,
            vec![EngineAttr::NetnsEntry(ns.to_attrs())],
        )
    }

    /// A `SOCK_DUMP` reply message.
    pub fn sock_reply(sock: &SockInfo) -> Self {
        Self::new(EngineCmd::SockDump, vec![EngineAttr::Sock(sock.to_attrs())])
    }

    /// The namespace selector of a request (`None`: the sender's own namespace, or a
    /// selector this version does not understand).
    pub fn netns_selector(&self) -> Option<NetnsSelector> {
        self.attrs.iter().find_map(|a| match a {
            EngineAttr::Netns(v) => NetnsSelector::from_attrs(v),
            _ => None,
        })
    }

    /// The namespace a reply is about.
    pub fn netns_inode(&self) -> Option<u64> {
        self.attrs.iter().find_map(|a| match a {
            EngineAttr::NetnsInode(x) => Some(*x),
            _ => None,
        })
    }

    /// The sysctl nest.
    pub fn sysctl(&self) -> Option<SysctlInfo> {
        self.attrs.iter().find_map(|a| match a {
            EngineAttr::Sysctl(v) => Some(SysctlInfo::from_attrs(v)),
            _ => None,
        })
    }

    /// The namespace nest.
    pub fn netns_entry(&self) -> Option<NetnsInfo> {
        self.attrs.iter().find_map(|a| match a {
            EngineAttr::NetnsEntry(v) => Some(NetnsInfo::from_attrs(v)),
            _ => None,
        })
    }

    /// The socket nest.
    pub fn sock(&self) -> Option<SockInfo> {
        self.attrs.iter().find_map(|a| match a {
            EngineAttr::Sock(v) => Some(SockInfo::from_attrs(v)),
            _ => None,
        })
    }

    /// The `SOCK_DUMP` state filter.
    pub fn sock_states(&self) -> Option<u32> {
        self.attrs.iter().find_map(|a| match a {
            EngineAttr::SockStates(x) => Some(*x),
            _ => None,
        })
    }

    /// The `STATS_RESET` scope.
    pub fn stats_scope(&self) -> Option<u32> {
        self.attrs.iter().find_map(|a| match a {
            EngineAttr::StatsScope(x) => Some(*x),
            _ => None,
        })
    }

    /// `INFO` reply: whether the option program is attached, where, and why (or why not).
    pub fn syn_option(&self) -> Option<(bool, Option<String>, Option<String>)> {
        let on = self.attrs.iter().find_map(|a| match a {
            EngineAttr::SynOption(x) => Some(*x != 0),
            _ => None,
        })?;
        let cgroup = self.attrs.iter().find_map(|a| match a {
            EngineAttr::SynOptionCgroup(x) => Some(x.clone()),
            _ => None,
        });
        let status = self.attrs.iter().find_map(|a| match a {
            EngineAttr::SynOptionStatus(x) => Some(x.clone()),
            _ => None,
        });
        Some((on, cgroup, status))
    }

    /// `INFO`: connections counted by capability path, `None` from an smcd that does not
    /// count them.
    pub fn path_counts(&self) -> Option<PathCounts> {
        let mut c = PathCounts::default();
        let mut any = false;
        for a in &self.attrs {
            let (slot, v) = match a {
                EngineAttr::PathOptionClient(v) => (&mut c.option_client, v),
                EngineAttr::PathOptionServer(v) => (&mut c.option_server, v),
                EngineAttr::PathIntentClient(v) => (&mut c.intent_client, v),
                EngineAttr::PathIntentServer(v) => (&mut c.intent_server, v),
                _ => continue,
            };
            *slot = *v;
            any = true;
        }
        any.then_some(c)
    }

    /// `INFO` attributes of `c`.
    pub fn path_attrs(c: &PathCounts) -> [EngineAttr; 4] {
        [
            EngineAttr::PathOptionClient(c.option_client),
            EngineAttr::PathOptionServer(c.option_server),
            EngineAttr::PathIntentClient(c.intent_client),
            EngineAttr::PathIntentServer(c.intent_server),
        ]
    }
}

/// Connections by how they learned whether the peer speaks SMC (`INFO`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathCounts {
    /// Client connections decided by the SMC TCP option.
    pub option_client: u64,
    /// Accepted connections announced by the option.
    pub option_server: u64,
    /// Client connections decided by smcd (listener table or intent).
    pub intent_client: u64,
    /// Accepted connections announced by an intent.
    pub intent_server: u64,
}

impl GenlFamily for EngineMessage {
    fn family_name() -> &'static str {
        SMCD_ENGINE_FAMILY_NAME
    }

    fn command(&self) -> u8 {
        self.cmd.into()
    }

    fn version(&self) -> u8 {
        SMCD_ENGINE_FAMILY_VERSION
    }
}

impl Emitable for EngineMessage {
    fn buffer_len(&self) -> usize {
        attrs_len(&self.attrs)
    }

    fn emit(&self, buffer: &mut [u8]) {
        attr::emit_attrs(&self.attrs, buffer)
    }
}

impl GenlPayload for EngineMessage {
    fn parse_genl(header: &GenlHeader, attrs: &[u8]) -> Result<Self, NlError> {
        Ok(Self {
            cmd: header.cmd.into(),
            attrs: attr::parse_top(attrs, EngineAttr::parse_raw)?,
        })
    }

    fn fits(&self) -> bool {
        self.attrs.iter().all(Attr::fits)
    }
}

impl_parseable_via_genl!(EngineMessage);
