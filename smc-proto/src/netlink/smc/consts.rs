//! Every number of `include/uapi/linux/smc.h` (newest kernel), under the kernel's names, in
//! declaration order. `tests/uapi_header.rs` checks them against the installed header.
//! Attribute numbers are `u16` (the `nla_type` field), command numbers `u8` (`genlmsghdr.cmd`).
#![allow(missing_docs)]

/// `SMC_PNETID` family name.
pub const SMCR_GENL_FAMILY_NAME: &str = "SMC_PNETID";
/// `SMC_PNETID` family version.
pub const SMCR_GENL_FAMILY_VERSION: u8 = 1;
/// Generic netlink family name of the non-socket SMC interface.
pub const SMC_GENL_FAMILY_NAME: &str = "SMC_GEN_NETLINK";
/// Its version.
pub const SMC_GENL_FAMILY_VERSION: u8 = 1;
/// Maximum length of a PCI id string.
pub const SMC_PCI_ID_STR_LEN: usize = 16;
/// Maximum length of the host name.
pub const SMC_MAX_HOSTNAME_LEN: usize = 32;
/// Maximum number of user EIDs the kernel keeps.
pub const SMC_MAX_UEID: usize = 4;
/// Length of an EID (blank padded).
pub const SMC_MAX_EID_LEN: usize = 32;
/// `SMC_LIMIT_HS` socket option (level `SOL_SMC`).
pub const SMC_LIMIT_HS: u32 = 1;

// Netlink `SMC_PNETID` attributes (legacy PNET table family).
pub const SMC_PNETID_UNSPEC: u16 = 0;
pub const SMC_PNETID_NAME: u16 = 1;
pub const SMC_PNETID_ETHNAME: u16 = 2;
pub const SMC_PNETID_IBNAME: u16 = 3;
pub const SMC_PNETID_IBPORT: u16 = 4;

// `SMC_PNETID` family commands.
pub const SMC_PNETID_GET: u8 = 1;
pub const SMC_PNETID_ADD: u8 = 2;
pub const SMC_PNETID_DEL: u8 = 3;
pub const SMC_PNETID_FLUSH: u8 = 4;

// `SMC_GEN_NETLINK` commands.
pub const SMC_NETLINK_GET_SYS_INFO: u8 = 1;
pub const SMC_NETLINK_GET_LGR_SMCR: u8 = 2;
pub const SMC_NETLINK_GET_LINK_SMCR: u8 = 3;
pub const SMC_NETLINK_GET_LGR_SMCD: u8 = 4;
pub const SMC_NETLINK_GET_DEV_SMCD: u8 = 5;
pub const SMC_NETLINK_GET_DEV_SMCR: u8 = 6;
pub const SMC_NETLINK_GET_STATS: u8 = 7;
pub const SMC_NETLINK_GET_FBACK_STATS: u8 = 8;
pub const SMC_NETLINK_DUMP_UEID: u8 = 9;
pub const SMC_NETLINK_ADD_UEID: u8 = 10;
pub const SMC_NETLINK_REMOVE_UEID: u8 = 11;
pub const SMC_NETLINK_FLUSH_UEID: u8 = 12;
pub const SMC_NETLINK_DUMP_SEID: u8 = 13;
pub const SMC_NETLINK_ENABLE_SEID: u8 = 14;
pub const SMC_NETLINK_DISABLE_SEID: u8 = 15;
pub const SMC_NETLINK_DUMP_HS_LIMITATION: u8 = 16;
pub const SMC_NETLINK_ENABLE_HS_LIMITATION: u8 = 17;
pub const SMC_NETLINK_DISABLE_HS_LIMITATION: u8 = 18;

// Top-level attributes of the `GET_*` replies (all nests).
pub const SMC_GEN_UNSPEC: u16 = 0;
pub const SMC_GEN_SYS_INFO: u16 = 1;
pub const SMC_GEN_LGR_SMCR: u16 = 2;
pub const SMC_GEN_LINK_SMCR: u16 = 3;
pub const SMC_GEN_LGR_SMCD: u16 = 4;
pub const SMC_GEN_DEV_SMCD: u16 = 5;
pub const SMC_GEN_DEV_SMCR: u16 = 6;
pub const SMC_GEN_STATS: u16 = 7;
pub const SMC_GEN_FBACK_STATS: u16 = 8;

// `SMC_GEN_SYS_INFO` nest.
pub const SMC_NLA_SYS_UNSPEC: u16 = 0;
pub const SMC_NLA_SYS_VER: u16 = 1;
pub const SMC_NLA_SYS_REL: u16 = 2;
pub const SMC_NLA_SYS_IS_ISM_V2: u16 = 3;
pub const SMC_NLA_SYS_LOCAL_HOST: u16 = 4;
pub const SMC_NLA_SYS_SEID: u16 = 5;
pub const SMC_NLA_SYS_IS_SMCR_V2: u16 = 6;

// `SMC_NLA_LGR_D_V2_COMMON` / `SMC_NLA_LGR_R_V2_COMMON` nest. Numbering starts at **0**, not 1.
pub const SMC_NLA_LGR_V2_VER: u16 = 0;
pub const SMC_NLA_LGR_V2_REL: u16 = 1;
pub const SMC_NLA_LGR_V2_OS: u16 = 2;
pub const SMC_NLA_LGR_V2_NEG_EID: u16 = 3;
pub const SMC_NLA_LGR_V2_PEER_HOST: u16 = 4;

// `SMC_NLA_LGR_R_V2` nest (MAX_CONNS and MAX_LINKS are newer than some installed headers).
pub const SMC_NLA_LGR_R_V2_UNSPEC: u16 = 0;
pub const SMC_NLA_LGR_R_V2_DIRECT: u16 = 1;
pub const SMC_NLA_LGR_R_V2_MAX_CONNS: u16 = 2;
pub const SMC_NLA_LGR_R_V2_MAX_LINKS: u16 = 3;

// `SMC_GEN_LGR_SMCR` nest (SNDBUF_ALLOC and RMB_ALLOC are newer, `NLA_UINT`).
pub const SMC_NLA_LGR_R_UNSPEC: u16 = 0;
pub const SMC_NLA_LGR_R_ID: u16 = 1;
pub const SMC_NLA_LGR_R_ROLE: u16 = 2;
pub const SMC_NLA_LGR_R_TYPE: u16 = 3;
pub const SMC_NLA_LGR_R_PNETID: u16 = 4;
pub const SMC_NLA_LGR_R_VLAN_ID: u16 = 5;
pub const SMC_NLA_LGR_R_CONNS_NUM: u16 = 6;
pub const SMC_NLA_LGR_R_V2_COMMON: u16 = 7;
pub const SMC_NLA_LGR_R_V2: u16 = 8;
pub const SMC_NLA_LGR_R_NET_COOKIE: u16 = 9;
pub const SMC_NLA_LGR_R_PAD: u16 = 10;
pub const SMC_NLA_LGR_R_BUF_TYPE: u16 = 11;
pub const SMC_NLA_LGR_R_SNDBUF_ALLOC: u16 = 12;
pub const SMC_NLA_LGR_R_RMB_ALLOC: u16 = 13;

// `SMC_GEN_LINK_SMCR` nest.
pub const SMC_NLA_LINK_UNSPEC: u16 = 0;
pub const SMC_NLA_LINK_ID: u16 = 1;
pub const SMC_NLA_LINK_IB_DEV: u16 = 2;
pub const SMC_NLA_LINK_IB_PORT: u16 = 3;
pub const SMC_NLA_LINK_GID: u16 = 4;
pub const SMC_NLA_LINK_PEER_GID: u16 = 5;
pub const SMC_NLA_LINK_CONN_CNT: u16 = 6;
pub const SMC_NLA_LINK_NET_DEV: u16 = 7;
pub const SMC_NLA_LINK_UID: u16 = 8;
pub const SMC_NLA_LINK_PEER_UID: u16 = 9;
pub const SMC_NLA_LINK_STATE: u16 = 10;

// `SMC_GEN_LGR_SMCD` nest (EXT_GID, PEER_EXT_GID, SNDBUF_ALLOC, DMB_ALLOC are newer).
pub const SMC_NLA_LGR_D_UNSPEC: u16 = 0;
pub const SMC_NLA_LGR_D_ID: u16 = 1;
pub const SMC_NLA_LGR_D_GID: u16 = 2;
pub const SMC_NLA_LGR_D_PEER_GID: u16 = 3;
pub const SMC_NLA_LGR_D_VLAN_ID: u16 = 4;
pub const SMC_NLA_LGR_D_CONNS_NUM: u16 = 5;
pub const SMC_NLA_LGR_D_PNETID: u16 = 6;
pub const SMC_NLA_LGR_D_CHID: u16 = 7;
pub const SMC_NLA_LGR_D_PAD: u16 = 8;
pub const SMC_NLA_LGR_D_V2_COMMON: u16 = 9;
pub const SMC_NLA_LGR_D_EXT_GID: u16 = 10;
pub const SMC_NLA_LGR_D_PEER_EXT_GID: u16 = 11;
pub const SMC_NLA_LGR_D_SNDBUF_ALLOC: u16 = 12;
pub const SMC_NLA_LGR_D_DMB_ALLOC: u16 = 13;

// `SMC_NLA_DEV_PORT` / `SMC_NLA_DEV_PORT2` nest.
pub const SMC_NLA_DEV_PORT_UNSPEC: u16 = 0;
pub const SMC_NLA_DEV_PORT_PNET_USR: u16 = 1;
pub const SMC_NLA_DEV_PORT_PNETID: u16 = 2;
pub const SMC_NLA_DEV_PORT_NETDEV: u16 = 3;
pub const SMC_NLA_DEV_PORT_STATE: u16 = 4;
pub const SMC_NLA_DEV_PORT_VALID: u16 = 5;
pub const SMC_NLA_DEV_PORT_LNK_CNT: u16 = 6;

// `SMC_GEN_DEV_SMCD` / `SMC_GEN_DEV_SMCR` nest.
pub const SMC_NLA_DEV_UNSPEC: u16 = 0;
pub const SMC_NLA_DEV_USE_CNT: u16 = 1;
pub const SMC_NLA_DEV_IS_CRIT: u16 = 2;
pub const SMC_NLA_DEV_PCI_FID: u16 = 3;
pub const SMC_NLA_DEV_PCI_CHID: u16 = 4;
pub const SMC_NLA_DEV_PCI_VENDOR: u16 = 5;
pub const SMC_NLA_DEV_PCI_DEVICE: u16 = 6;
pub const SMC_NLA_DEV_PCI_ID: u16 = 7;
pub const SMC_NLA_DEV_PORT: u16 = 8;
pub const SMC_NLA_DEV_PORT2: u16 = 9;
pub const SMC_NLA_DEV_IB_NAME: u16 = 10;

// Size-bucket nests (`SMC_NLA_STATS_T_{TX,RX}_RMB_SIZE`, `SMC_NLA_STATS_T_{TX,RX}PLOAD_SIZE`).
pub const SMC_NLA_STATS_PLOAD_PAD: u16 = 0;
pub const SMC_NLA_STATS_PLOAD_8K: u16 = 1;
pub const SMC_NLA_STATS_PLOAD_16K: u16 = 2;
pub const SMC_NLA_STATS_PLOAD_32K: u16 = 3;
pub const SMC_NLA_STATS_PLOAD_64K: u16 = 4;
pub const SMC_NLA_STATS_PLOAD_128K: u16 = 5;
pub const SMC_NLA_STATS_PLOAD_256K: u16 = 6;
pub const SMC_NLA_STATS_PLOAD_512K: u16 = 7;
pub const SMC_NLA_STATS_PLOAD_1024K: u16 = 8;
pub const SMC_NLA_STATS_PLOAD_G_1024K: u16 = 9;

// `SMC_NLA_STATS_T_{TX,RX}_RMB_STATS` nests.
pub const SMC_NLA_STATS_RMB_PAD: u16 = 0;
pub const SMC_NLA_STATS_RMB_SIZE_SM_PEER_CNT: u16 = 1;
pub const SMC_NLA_STATS_RMB_SIZE_SM_CNT: u16 = 2;
pub const SMC_NLA_STATS_RMB_FULL_PEER_CNT: u16 = 3;
pub const SMC_NLA_STATS_RMB_FULL_CNT: u16 = 4;
pub const SMC_NLA_STATS_RMB_REUSE_CNT: u16 = 5;
pub const SMC_NLA_STATS_RMB_ALLOC_CNT: u16 = 6;
pub const SMC_NLA_STATS_RMB_DGRADE_CNT: u16 = 7;

// `SMC_NLA_STATS_SMCD_TECH` / `SMC_NLA_STATS_SMCR_TECH` nests (RX/TX_RMB_USAGE are newer, `NLA_UINT`).
pub const SMC_NLA_STATS_T_PAD: u16 = 0;
pub const SMC_NLA_STATS_T_TX_RMB_SIZE: u16 = 1;
pub const SMC_NLA_STATS_T_RX_RMB_SIZE: u16 = 2;
pub const SMC_NLA_STATS_T_TXPLOAD_SIZE: u16 = 3;
pub const SMC_NLA_STATS_T_RXPLOAD_SIZE: u16 = 4;
pub const SMC_NLA_STATS_T_TX_RMB_STATS: u16 = 5;
pub const SMC_NLA_STATS_T_RX_RMB_STATS: u16 = 6;
pub const SMC_NLA_STATS_T_CLNT_V1_SUCC: u16 = 7;
pub const SMC_NLA_STATS_T_CLNT_V2_SUCC: u16 = 8;
pub const SMC_NLA_STATS_T_SRV_V1_SUCC: u16 = 9;
pub const SMC_NLA_STATS_T_SRV_V2_SUCC: u16 = 10;
pub const SMC_NLA_STATS_T_SENDPAGE_CNT: u16 = 11;
pub const SMC_NLA_STATS_T_SPLICE_CNT: u16 = 12;
pub const SMC_NLA_STATS_T_CORK_CNT: u16 = 13;
pub const SMC_NLA_STATS_T_NDLY_CNT: u16 = 14;
pub const SMC_NLA_STATS_T_URG_DATA_CNT: u16 = 15;
pub const SMC_NLA_STATS_T_RX_BYTES: u16 = 16;
pub const SMC_NLA_STATS_T_TX_BYTES: u16 = 17;
pub const SMC_NLA_STATS_T_RX_CNT: u16 = 18;
pub const SMC_NLA_STATS_T_TX_CNT: u16 = 19;
pub const SMC_NLA_STATS_T_RX_RMB_USAGE: u16 = 20;
pub const SMC_NLA_STATS_T_TX_RMB_USAGE: u16 = 21;

// `SMC_GEN_STATS` nest.
pub const SMC_NLA_STATS_PAD: u16 = 0;
pub const SMC_NLA_STATS_SMCD_TECH: u16 = 1;
pub const SMC_NLA_STATS_SMCR_TECH: u16 = 2;
pub const SMC_NLA_STATS_CLNT_HS_ERR_CNT: u16 = 3;
pub const SMC_NLA_STATS_SRV_HS_ERR_CNT: u16 = 4;

// `SMC_GEN_FBACK_STATS` nest.
pub const SMC_NLA_FBACK_STATS_PAD: u16 = 0;
pub const SMC_NLA_FBACK_STATS_TYPE: u16 = 1;
pub const SMC_NLA_FBACK_STATS_SRV_CNT: u16 = 2;
pub const SMC_NLA_FBACK_STATS_CLNT_CNT: u16 = 3;
pub const SMC_NLA_FBACK_STATS_RSN_CODE: u16 = 4;
pub const SMC_NLA_FBACK_STATS_RSN_CNT: u16 = 5;

// Top-level attributes of `DUMP_UEID`, `ADD_UEID`, `REMOVE_UEID`.
pub const SMC_NLA_EID_TABLE_UNSPEC: u16 = 0;
pub const SMC_NLA_EID_TABLE_ENTRY: u16 = 1;

// Top-level attributes of `DUMP_SEID`.
pub const SMC_NLA_SEID_UNSPEC: u16 = 0;
pub const SMC_NLA_SEID_ENTRY: u16 = 1;
pub const SMC_NLA_SEID_ENABLED: u16 = 2;

// Top-level attributes of `DUMP_HS_LIMITATION`.
pub const SMC_NLA_HS_LIMITATION_UNSPEC: u16 = 0;
pub const SMC_NLA_HS_LIMITATION_ENABLED: u16 = 1;
