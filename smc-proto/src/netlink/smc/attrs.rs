//! The nested attribute enums of `SMC_GEN_NETLINK`, one per kernel enum, numbered as in
//! `include/uapi/linux/smc.h`. Each ends in `Other(DefaultNla)` (unknown or undecodable
//! attributes, kept byte for byte). Types follow what the kernel *emits*, which is not always
//! what the header comments say (see `LgrSmcdAttr::Chid`).

use crate::netlink::attr::{Nest, Str, U8, U16, U32, U32Or16, U64, Uint, attr_enum};

use super::consts::*;

attr_enum! {
    /// `SMC_GEN_SYS_INFO` nest (smc_nl_get_sys_info).
    pub enum SysInfoAttr {
        /// SMC version (2).
        Ver(u8) = SMC_NLA_SYS_VER => U8,
        /// SMC release (1 = "v2.1").
        Rel(u8) = SMC_NLA_SYS_REL => U8,
        /// Whether an ISMv2 (or loopback-ism) device exists.
        IsIsmV2(u8) = SMC_NLA_SYS_IS_ISM_V2 => U8,
        /// Host name (32 chars max).
        LocalHost(String) = SMC_NLA_SYS_LOCAL_HOST => Str,
        /// System EID (only when ISMv2 capable).
        Seid(String) = SMC_NLA_SYS_SEID => Str,
        /// SMC-Rv2 capable (always 1 in current kernels).
        IsSmcrV2(u8) = SMC_NLA_SYS_IS_SMCR_V2 => U8,
    }
}

attr_enum! {
    /// `SMC_NLA_LGR_{R,D}_V2_COMMON` nest. Its numbering starts at 0 (`SMC_NLA_LGR_V2_VER`
    /// is attribute type 0, which the kernel really emits).
    pub enum LgrV2CommonAttr {
        /// Negotiated SMC version.
        Ver(u8) = SMC_NLA_LGR_V2_VER => U8,
        /// Peer's SMC release.
        Rel(u8) = SMC_NLA_LGR_V2_REL => U8,
        /// Peer OS (1 z/OS, 2 Linux, 3 AIX).
        Os(u8) = SMC_NLA_LGR_V2_OS => U8,
        /// Negotiated EID (32 chars, blank padded).
        NegEid(String) = SMC_NLA_LGR_V2_NEG_EID => Str,
        /// Peer host name.
        PeerHost(String) = SMC_NLA_LGR_V2_PEER_HOST => Str,
    }
}

attr_enum! {
    /// `SMC_NLA_LGR_R_V2` nest.
    pub enum LgrSmcrV2Attr {
        /// 1 when the peer is reached without a gateway.
        Direct(u8) = SMC_NLA_LGR_R_V2_DIRECT => U8,
        /// Negotiated maximum connections per link group (newer kernels).
        MaxConns(u8) = SMC_NLA_LGR_R_V2_MAX_CONNS => U8,
        /// Negotiated maximum links per link group (newer kernels).
        MaxLinks(u8) = SMC_NLA_LGR_R_V2_MAX_LINKS => U8,
    }
}

attr_enum! {
    /// `SMC_GEN_LGR_SMCR` nest (smc_nl_fill_lgr).
    pub enum LgrSmcrAttr {
        /// Link group id (the 4 id bytes read as a host-order u32).
        Id(u32) = SMC_NLA_LGR_R_ID => U32,
        /// 0 client, 1 server.
        Role(u8) = SMC_NLA_LGR_R_ROLE => U8,
        /// 0 NONE, 1 SINGLE, 2 SYMMETRIC, 3 ASYMMETRIC_PEER, 4 ASYMMETRIC_LOCAL.
        Type(u8) = SMC_NLA_LGR_R_TYPE => U8,
        /// PNET id.
        Pnetid(String) = SMC_NLA_LGR_R_PNETID => Str,
        /// VLAN id.
        VlanId(u8) = SMC_NLA_LGR_R_VLAN_ID => U8,
        /// Number of connections.
        ConnsNum(u32) = SMC_NLA_LGR_R_CONNS_NUM => U32,
        /// V2 details shared with SMC-D.
        V2Common(Vec<LgrV2CommonAttr>) = SMC_NLA_LGR_R_V2_COMMON => Nest<LgrV2CommonAttr>,
        /// SMC-R v2 details.
        V2(Vec<LgrSmcrV2Attr>) = SMC_NLA_LGR_R_V2 => Nest<LgrSmcrV2Attr>,
        /// Network namespace cookie.
        NetCookie(u64) = SMC_NLA_LGR_R_NET_COOKIE => U64,
        /// Buffer type (0 physically, 1 virtually contiguous, 2 mixed).
        BufType(u8) = SMC_NLA_LGR_R_BUF_TYPE => U8,
        /// Bytes of send buffers allocated (`NLA_UINT`, newer kernels).
        SndbufAlloc(u64) = SMC_NLA_LGR_R_SNDBUF_ALLOC => Uint,
        /// Bytes of RMBs allocated (`NLA_UINT`, newer kernels).
        RmbAlloc(u64) = SMC_NLA_LGR_R_RMB_ALLOC => Uint,
    }
    units {
        /// Alignment padding before a u64 (only on architectures that need it).
        Pad = SMC_NLA_LGR_R_PAD,
    }
}

attr_enum! {
    /// `SMC_GEN_LINK_SMCR` nest (smc_nl_fill_lgr_link).
    pub enum LinkSmcrAttr {
        /// Link id.
        Id(u8) = SMC_NLA_LINK_ID => U8,
        /// RDMA device name.
        IbDev(String) = SMC_NLA_LINK_IB_DEV => Str,
        /// RDMA port.
        IbPort(u8) = SMC_NLA_LINK_IB_PORT => U8,
        /// Local GID as text.
        Gid(String) = SMC_NLA_LINK_GID => Str,
        /// Peer GID as text.
        PeerGid(String) = SMC_NLA_LINK_PEER_GID => Str,
        /// Connections on the link.
        ConnCnt(u32) = SMC_NLA_LINK_CONN_CNT => U32,
        /// Net device ifindex.
        NetDev(u32) = SMC_NLA_LINK_NET_DEV => U32,
        /// Link user id (4 bytes as a host-order u32).
        Uid(u32) = SMC_NLA_LINK_UID => U32,
        /// Peer link user id.
        PeerUid(u32) = SMC_NLA_LINK_PEER_UID => U32,
        /// 0 UNUSED, 1 INACTIVE, 2 ACTIVATING, 3 ACTIVE.
        State(u32) = SMC_NLA_LINK_STATE => U32,
    }
}

attr_enum! {
    /// `SMC_GEN_LGR_SMCD` nest (smc_nl_fill_smcd_lgr).
    pub enum LgrSmcdAttr {
        /// Link group id.
        Id(u32) = SMC_NLA_LGR_D_ID => U32,
        /// Local GID (first 64 bits).
        Gid(u64) = SMC_NLA_LGR_D_GID => U64,
        /// Peer GID (first 64 bits).
        PeerGid(u64) = SMC_NLA_LGR_D_PEER_GID => U64,
        /// VLAN id.
        VlanId(u8) = SMC_NLA_LGR_D_VLAN_ID => U8,
        /// Number of connections.
        ConnsNum(u32) = SMC_NLA_LGR_D_CONNS_NUM => U32,
        /// PNET id.
        Pnetid(String) = SMC_NLA_LGR_D_PNETID => Str,
        /// CHID: the header says u16, the kernel emits `nla_put_u32`; emitted as 4 bytes,
        /// accepted as 2 or 4.
        Chid(u32) = SMC_NLA_LGR_D_CHID => U32Or16,
        /// V2 details.
        V2Common(Vec<LgrV2CommonAttr>) = SMC_NLA_LGR_D_V2_COMMON => Nest<LgrV2CommonAttr>,
        /// Local GID extension (second 64 bits of a 128-bit emulated-ISM GID; newer kernels).
        ExtGid(u64) = SMC_NLA_LGR_D_EXT_GID => U64,
        /// Peer GID extension (newer kernels).
        PeerExtGid(u64) = SMC_NLA_LGR_D_PEER_EXT_GID => U64,
        /// Bytes of send buffers allocated (`NLA_UINT`, newer kernels).
        SndbufAlloc(u64) = SMC_NLA_LGR_D_SNDBUF_ALLOC => Uint,
        /// Bytes of DMBs allocated, CDC headers included (`NLA_UINT`, newer kernels).
        DmbAlloc(u64) = SMC_NLA_LGR_D_DMB_ALLOC => Uint,
    }
    units {
        /// Alignment padding before a u64 (only on architectures that need it).
        Pad = SMC_NLA_LGR_D_PAD,
    }
}

attr_enum! {
    /// `SMC_NLA_DEV_PORT` / `SMC_NLA_DEV_PORT2` nest.
    pub enum DevPortAttr {
        /// 1 when the PNET id was set by the user.
        PnetUsr(u8) = SMC_NLA_DEV_PORT_PNET_USR => U8,
        /// PNET id.
        Pnetid(String) = SMC_NLA_DEV_PORT_PNETID => Str,
        /// Net device ifindex (SMC-R).
        Netdev(u32) = SMC_NLA_DEV_PORT_NETDEV => U32,
        /// Port active (SMC-R).
        State(u8) = SMC_NLA_DEV_PORT_STATE => U8,
        /// Port valid (SMC-R).
        Valid(u8) = SMC_NLA_DEV_PORT_VALID => U8,
        /// Links on the port (SMC-R).
        LnkCnt(u32) = SMC_NLA_DEV_PORT_LNK_CNT => U32,
    }
}

attr_enum! {
    /// `SMC_GEN_DEV_SMCD` / `SMC_GEN_DEV_SMCR` nest (smc_nl_handle_smcd_dev,
    /// smc_nl_handle_smcr_dev).
    pub enum DevAttr {
        /// SMC-D: number of link groups.
        UseCnt(u32) = SMC_NLA_DEV_USE_CNT => U32,
        /// In use by a link group.
        IsCrit(u8) = SMC_NLA_DEV_IS_CRIT => U8,
        /// PCI function id.
        PciFid(u32) = SMC_NLA_DEV_PCI_FID => U32,
        /// Physical channel id.
        PciChid(u16) = SMC_NLA_DEV_PCI_CHID => U16,
        /// PCI vendor.
        PciVendor(u16) = SMC_NLA_DEV_PCI_VENDOR => U16,
        /// PCI device.
        PciDevice(u16) = SMC_NLA_DEV_PCI_DEVICE => U16,
        /// PCI id string ("0000:00:00.0", or the device name for loopback-ism).
        PciId(String) = SMC_NLA_DEV_PCI_ID => Str,
        /// First port.
        Port(Vec<DevPortAttr>) = SMC_NLA_DEV_PORT => Nest<DevPortAttr>,
        /// Second port (SMC-R).
        Port2(Vec<DevPortAttr>) = SMC_NLA_DEV_PORT2 => Nest<DevPortAttr>,
        /// RDMA device name (SMC-R).
        IbName(String) = SMC_NLA_DEV_IB_NAME => Str,
    }
}

attr_enum! {
    /// Size-bucket nest: nine u64 counters for 8K, 16K, .., 1024K and >1024K.
    pub enum SizeBucketAttr {
        /// <= 8 KiB.
        K8(u64) = SMC_NLA_STATS_PLOAD_8K => U64,
        /// <= 16 KiB.
        K16(u64) = SMC_NLA_STATS_PLOAD_16K => U64,
        /// <= 32 KiB.
        K32(u64) = SMC_NLA_STATS_PLOAD_32K => U64,
        /// <= 64 KiB.
        K64(u64) = SMC_NLA_STATS_PLOAD_64K => U64,
        /// <= 128 KiB.
        K128(u64) = SMC_NLA_STATS_PLOAD_128K => U64,
        /// <= 256 KiB.
        K256(u64) = SMC_NLA_STATS_PLOAD_256K => U64,
        /// <= 512 KiB.
        K512(u64) = SMC_NLA_STATS_PLOAD_512K => U64,
        /// <= 1024 KiB.
        K1024(u64) = SMC_NLA_STATS_PLOAD_1024K => U64,
        /// > 1024 KiB.
        G1024(u64) = SMC_NLA_STATS_PLOAD_G_1024K => U64,
    }
    units {
        /// Alignment padding (type 0).
        Pad = SMC_NLA_STATS_PLOAD_PAD,
    }
}

attr_enum! {
    /// RMB statistics nest.
    pub enum RmbStatsAttr {
        /// Peer's buffer too small.
        SizeSmPeerCnt(u64) = SMC_NLA_STATS_RMB_SIZE_SM_PEER_CNT => U64,
        /// Own buffer too small.
        SizeSmCnt(u64) = SMC_NLA_STATS_RMB_SIZE_SM_CNT => U64,
        /// Peer's buffer full.
        FullPeerCnt(u64) = SMC_NLA_STATS_RMB_FULL_PEER_CNT => U64,
        /// Own buffer full.
        FullCnt(u64) = SMC_NLA_STATS_RMB_FULL_CNT => U64,
        /// Buffers reused.
        ReuseCnt(u64) = SMC_NLA_STATS_RMB_REUSE_CNT => U64,
        /// Buffers allocated.
        AllocCnt(u64) = SMC_NLA_STATS_RMB_ALLOC_CNT => U64,
        /// Allocations downgraded to a smaller size.
        DgradeCnt(u64) = SMC_NLA_STATS_RMB_DGRADE_CNT => U64,
    }
    units {
        /// Alignment padding (type 0).
        Pad = SMC_NLA_STATS_RMB_PAD,
    }
}

attr_enum! {
    /// Per-technology statistics nest (`SMC_NLA_STATS_SMCD_TECH` / `_SMCR_TECH`).
    pub enum StatsTechAttr {
        /// TX buffer sizes.
        TxRmbSize(Vec<SizeBucketAttr>) = SMC_NLA_STATS_T_TX_RMB_SIZE => Nest<SizeBucketAttr>,
        /// RX buffer sizes.
        RxRmbSize(Vec<SizeBucketAttr>) = SMC_NLA_STATS_T_RX_RMB_SIZE => Nest<SizeBucketAttr>,
        /// TX request sizes.
        TxploadSize(Vec<SizeBucketAttr>) = SMC_NLA_STATS_T_TXPLOAD_SIZE => Nest<SizeBucketAttr>,
        /// RX request sizes.
        RxploadSize(Vec<SizeBucketAttr>) = SMC_NLA_STATS_T_RXPLOAD_SIZE => Nest<SizeBucketAttr>,
        /// TX buffer statistics.
        TxRmbStats(Vec<RmbStatsAttr>) = SMC_NLA_STATS_T_TX_RMB_STATS => Nest<RmbStatsAttr>,
        /// RX buffer statistics.
        RxRmbStats(Vec<RmbStatsAttr>) = SMC_NLA_STATS_T_RX_RMB_STATS => Nest<RmbStatsAttr>,
        /// Client v1 successes.
        ClntV1Succ(u64) = SMC_NLA_STATS_T_CLNT_V1_SUCC => U64,
        /// Client v2 successes.
        ClntV2Succ(u64) = SMC_NLA_STATS_T_CLNT_V2_SUCC => U64,
        /// Server v1 successes.
        SrvV1Succ(u64) = SMC_NLA_STATS_T_SRV_V1_SUCC => U64,
        /// Server v2 successes.
        SrvV2Succ(u64) = SMC_NLA_STATS_T_SRV_V2_SUCC => U64,
        /// sendpage calls (always 0 in current kernels).
        SendpageCnt(u64) = SMC_NLA_STATS_T_SENDPAGE_CNT => U64,
        /// splice calls.
        SpliceCnt(u64) = SMC_NLA_STATS_T_SPLICE_CNT => U64,
        /// TCP_CORK uses.
        CorkCnt(u64) = SMC_NLA_STATS_T_CORK_CNT => U64,
        /// TCP_NODELAY uses.
        NdlyCnt(u64) = SMC_NLA_STATS_T_NDLY_CNT => U64,
        /// Urgent data sends.
        UrgDataCnt(u64) = SMC_NLA_STATS_T_URG_DATA_CNT => U64,
        /// Bytes received.
        RxBytes(u64) = SMC_NLA_STATS_T_RX_BYTES => U64,
        /// Bytes sent.
        TxBytes(u64) = SMC_NLA_STATS_T_TX_BYTES => U64,
        /// Receive calls.
        RxCnt(u64) = SMC_NLA_STATS_T_RX_CNT => U64,
        /// Send calls.
        TxCnt(u64) = SMC_NLA_STATS_T_TX_CNT => U64,
        /// RX buffer bytes in use (`NLA_UINT`, newer kernels).
        RxRmbUsage(u64) = SMC_NLA_STATS_T_RX_RMB_USAGE => Uint,
        /// TX buffer bytes in use (`NLA_UINT`, newer kernels).
        TxRmbUsage(u64) = SMC_NLA_STATS_T_TX_RMB_USAGE => Uint,
    }
    units {
        /// Alignment padding (type 0).
        Pad = SMC_NLA_STATS_T_PAD,
    }
}

attr_enum! {
    /// `SMC_GEN_STATS` nest (smc_nl_get_stats).
    pub enum StatsAttr {
        /// SMC-D counters.
        SmcdTech(Vec<StatsTechAttr>) = SMC_NLA_STATS_SMCD_TECH => Nest<StatsTechAttr>,
        /// SMC-R counters.
        SmcrTech(Vec<StatsTechAttr>) = SMC_NLA_STATS_SMCR_TECH => Nest<StatsTechAttr>,
        /// Client handshake errors.
        ClntHsErrCnt(u64) = SMC_NLA_STATS_CLNT_HS_ERR_CNT => U64,
        /// Server handshake errors.
        SrvHsErrCnt(u64) = SMC_NLA_STATS_SRV_HS_ERR_CNT => U64,
    }
    units {
        /// Alignment padding (type 0).
        Pad = SMC_NLA_STATS_PAD,
    }
}

attr_enum! {
    /// `SMC_GEN_FBACK_STATS` nest (smc_nl_get_fback_details).
    pub enum FbackStatsAttr {
        /// 1 server list, 0 client list.
        Type(u8) = SMC_NLA_FBACK_STATS_TYPE => U8,
        /// Total server fallbacks (first message of a dump only).
        SrvCnt(u64) = SMC_NLA_FBACK_STATS_SRV_CNT => U64,
        /// Total client fallbacks (first message of a dump only).
        ClntCnt(u64) = SMC_NLA_FBACK_STATS_CLNT_CNT => U64,
        /// Reason code (SMC_CLC_DECL_*).
        RsnCode(u32) = SMC_NLA_FBACK_STATS_RSN_CODE => U32,
        /// How often.
        RsnCnt(u16) = SMC_NLA_FBACK_STATS_RSN_CNT => U16,
    }
    units {
        /// Alignment padding (type 0).
        Pad = SMC_NLA_FBACK_STATS_PAD,
    }
}
