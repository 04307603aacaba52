//! Typed views of the `SMC_GEN_NETLINK` nests, for servers that build replies and clients that
//! print them. `to_attrs` emits attributes in the order the kernel's `smc_nl_*` functions do
//! (so a reply built here is byte-identical to the kernel's on x86-64/arm64/s390, where no
//! PAD attributes are emitted); `from_attrs` never fails: missing attributes read as 0/empty
//! (or `None` for attributes newer kernels added), PAD attributes are dropped, and attributes
//! this crate does not know land in `other` and are re-emitted at the end.

use netlink_packet_core::DefaultNla;

use super::attrs::*;
use super::consts::SMC_MAX_EID_LEN;

fn push_other<T>(out: &mut Vec<T>, other: &[DefaultNla], wrap: fn(DefaultNla) -> T) {
    out.extend(other.iter().cloned().map(wrap));
}

/// `SMC_GEN_SYS_INFO`: what `smcd info` prints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SysInfo {
    /// SMC version (2).
    pub ver: u8,
    /// SMC release (1).
    pub rel: u8,
    /// ISMv2 (or loopback-ism) capable.
    pub is_ism_v2: bool,
    /// SMC-Rv2 capable (absent in older kernels).
    pub is_smcr_v2: Option<bool>,
    /// Host name.
    pub local_host: Option<String>,
    /// System EID (present only when ISMv2 capable).
    pub seid: Option<String>,
    /// Attributes this crate does not know.
    pub other: Vec<DefaultNla>,
}

impl SysInfo {
    /// The nest's attributes, in the kernel's order.
    pub fn to_attrs(&self) -> Vec<SysInfoAttr> {
        let mut v = vec![
            SysInfoAttr::Ver(self.ver),
            SysInfoAttr::Rel(self.rel),
            SysInfoAttr::IsIsmV2(self.is_ism_v2.into()),
        ];
        if let Some(x) = self.is_smcr_v2 {
            v.push(SysInfoAttr::IsSmcrV2(x.into()));
        }
        if let Some(x) = &self.local_host {
            v.push(SysInfoAttr::LocalHost(x.clone()));
        }
        if let Some(x) = &self.seid {
            v.push(SysInfoAttr::Seid(x.clone()));
        }
        push_other(&mut v, &self.other, SysInfoAttr::Other);
        v
    }

    /// Reads the nest.
    pub fn from_attrs(attrs: &[SysInfoAttr]) -> Self {
        let mut s = Self::default();
        for a in attrs {
            match a {
                SysInfoAttr::Ver(x) => s.ver = *x,
                SysInfoAttr::Rel(x) => s.rel = *x,
                SysInfoAttr::IsIsmV2(x) => s.is_ism_v2 = *x != 0,
                SysInfoAttr::IsSmcrV2(x) => s.is_smcr_v2 = Some(*x != 0),
                SysInfoAttr::LocalHost(x) => s.local_host = Some(x.clone()),
                SysInfoAttr::Seid(x) => s.seid = Some(x.clone()),
                SysInfoAttr::Other(o) => s.other.push(o.clone()),
            }
        }
        s
    }
}

/// `SMC_NLA_LGR_{R,D}_V2_COMMON`: SMCv2 details of a link group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LgrV2Common {
    /// Negotiated SMC version.
    pub ver: u8,
    /// Peer release.
    pub rel: u8,
    /// Peer OS (1 z/OS, 2 Linux, 3 AIX).
    pub os: u8,
    /// Peer host name.
    pub peer_host: String,
    /// Negotiated EID.
    pub neg_eid: String,
    /// Attributes this crate does not know.
    pub other: Vec<DefaultNla>,
}

impl LgrV2Common {
    /// The nest's attributes (kernel order: VER, REL, OS, PEER_HOST, NEG_EID).
    pub fn to_attrs(&self) -> Vec<LgrV2CommonAttr> {
        let mut v = vec![
            LgrV2CommonAttr::Ver(self.ver),
            LgrV2CommonAttr::Rel(self.rel),
            LgrV2CommonAttr::Os(self.os),
            LgrV2CommonAttr::PeerHost(self.peer_host.clone()),
            LgrV2CommonAttr::NegEid(self.neg_eid.clone()),
        ];
        push_other(&mut v, &self.other, LgrV2CommonAttr::Other);
        v
    }

    /// Reads the nest.
    pub fn from_attrs(attrs: &[LgrV2CommonAttr]) -> Self {
        let mut s = Self::default();
        for a in attrs {
            match a {
                LgrV2CommonAttr::Ver(x) => s.ver = *x,
                LgrV2CommonAttr::Rel(x) => s.rel = *x,
                LgrV2CommonAttr::Os(x) => s.os = *x,
                LgrV2CommonAttr::PeerHost(x) => s.peer_host = x.clone(),
                LgrV2CommonAttr::NegEid(x) => s.neg_eid = x.clone(),
                LgrV2CommonAttr::Other(o) => s.other.push(o.clone()),
            }
        }
        s
    }
}

/// `SMC_NLA_LGR_R_V2`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LgrSmcrV2 {
    /// Peer reached without a gateway.
    pub direct: bool,
    /// Negotiated max connections (newer kernels).
    pub max_conns: Option<u8>,
    /// Negotiated max links (newer kernels).
    pub max_links: Option<u8>,
    /// Attributes this crate does not know.
    pub other: Vec<DefaultNla>,
}

impl LgrSmcrV2 {
    /// The nest's attributes.
    pub fn to_attrs(&self) -> Vec<LgrSmcrV2Attr> {
        let mut v = vec![LgrSmcrV2Attr::Direct(self.direct.into())];
        v.extend(self.max_conns.map(LgrSmcrV2Attr::MaxConns));
        v.extend(self.max_links.map(LgrSmcrV2Attr::MaxLinks));
        push_other(&mut v, &self.other, LgrSmcrV2Attr::Other);
        v
    }

    /// Reads the nest.
    pub fn from_attrs(attrs: &[LgrSmcrV2Attr]) -> Self {
        let mut s = Self::default();
        for a in attrs {
            match a {
                LgrSmcrV2Attr::Direct(x) => s.direct = *x != 0,
                LgrSmcrV2Attr::MaxConns(x) => s.max_conns = Some(*x),
                LgrSmcrV2Attr::MaxLinks(x) => s.max_links = Some(*x),
                LgrSmcrV2Attr::Other(o) => s.other.push(o.clone()),
            }
        }
        s
    }
}

/// `SMC_GEN_LGR_SMCR`: one SMC-R link group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LgrSmcr {
    /// Link group id.
    pub id: u32,
    /// Connections.
    pub conns_num: u32,
    /// 0 client, 1 server.
    pub role: u8,
    /// Link group type (0 NONE, 1 SINGLE, 2 SYM, 3 ASYMP, 4 ASYML).
    pub lgr_type: u8,
    /// Buffer type (newer kernels).
    pub buf_type: Option<u8>,
    /// VLAN id.
    pub vlan_id: u8,
    /// Namespace cookie (newer kernels).
    pub net_cookie: Option<u64>,
    /// PNET id.
    pub pnetid: String,
    /// Send buffer bytes (newer kernels).
    pub sndbuf_alloc: Option<u64>,
    /// RMB bytes (newer kernels).
    pub rmb_alloc: Option<u64>,
    /// SMCv2 details (v2 link groups only).
    pub v2_common: Option<LgrV2Common>,
    /// SMC-Rv2 details (v2 link groups only).
    pub v2: Option<LgrSmcrV2>,
    /// Attributes this crate does not know.
    pub other: Vec<DefaultNla>,
}

impl LgrSmcr {
    /// The nest's attributes, in smc_nl_fill_lgr's order.
    pub fn to_attrs(&self) -> Vec<LgrSmcrAttr> {
        let mut v = vec![
            LgrSmcrAttr::Id(self.id),
            LgrSmcrAttr::ConnsNum(self.conns_num),
            LgrSmcrAttr::Role(self.role),
            LgrSmcrAttr::Type(self.lgr_type),
        ];
        v.extend(self.buf_type.map(LgrSmcrAttr::BufType));
        v.push(LgrSmcrAttr::VlanId(self.vlan_id));
        v.extend(self.net_cookie.map(LgrSmcrAttr::NetCookie));
        v.push(LgrSmcrAttr::Pnetid(self.pnetid.clone()));
        v.extend(self.sndbuf_alloc.map(LgrSmcrAttr::SndbufAlloc));
        v.extend(self.rmb_alloc.map(LgrSmcrAttr::RmbAlloc));
        if let Some(c) = &self.v2_common {
            v.push(LgrSmcrAttr::V2Common(c.to_attrs()));
        }
        if let Some(c) = &self.v2 {
            v.push(LgrSmcrAttr::V2(c.to_attrs()));
        }
        push_other(&mut v, &self.other, LgrSmcrAttr::Other);
        v
    }

    /// Reads the nest.
    pub fn from_attrs(attrs: &[LgrSmcrAttr]) -> Self {
        let mut s = Self::default();
        for a in attrs {
            match a {
                LgrSmcrAttr::Id(x) => s.id = *x,
                LgrSmcrAttr::Role(x) => s.role = *x,
                LgrSmcrAttr::Type(x) => s.lgr_type = *x,
                LgrSmcrAttr::Pnetid(x) => s.pnetid = x.clone(),
                LgrSmcrAttr::VlanId(x) => s.vlan_id = *x,
                LgrSmcrAttr::ConnsNum(x) => s.conns_num = *x,
                LgrSmcrAttr::V2Common(x) => s.v2_common = Some(LgrV2Common::from_attrs(x)),
                LgrSmcrAttr::V2(x) => s.v2 = Some(LgrSmcrV2::from_attrs(x)),
                LgrSmcrAttr::NetCookie(x) => s.net_cookie = Some(*x),
                LgrSmcrAttr::BufType(x) => s.buf_type = Some(*x),
                LgrSmcrAttr::SndbufAlloc(x) => s.sndbuf_alloc = Some(*x),
                LgrSmcrAttr::RmbAlloc(x) => s.rmb_alloc = Some(*x),
                LgrSmcrAttr::Pad => {}
                LgrSmcrAttr::Other(o) => s.other.push(o.clone()),
            }
        }
        s
    }
}

/// `SMC_GEN_LINK_SMCR`: one SMC-R link (a `GET_LINK_SMCR` dump sends it after its link
/// group's `LGR_SMCR` message; the nest does not name its link group).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkSmcr {
    /// Link id.
    pub id: u8,
    /// Link state (0 UNUSED, 1 INACTIVE, 2 ACTIVATING, 3 ACTIVE).
    pub state: u32,
    /// Connections.
    pub conn_cnt: u32,
    /// RDMA port.
    pub ib_port: u8,
    /// Net device ifindex.
    pub net_dev: u32,
    /// RDMA device name.
    pub ib_dev: String,
    /// Link user id.
    pub uid: u32,
    /// Peer link user id.
    pub peer_uid: u32,
    /// Local GID text.
    pub gid: String,
    /// Peer GID text.
    pub peer_gid: String,
    /// Attributes this crate does not know.
    pub other: Vec<DefaultNla>,
}

impl LinkSmcr {
    /// The nest's attributes, in smc_nl_fill_lgr_link's order.
    pub fn to_attrs(&self) -> Vec<LinkSmcrAttr> {
        let mut v = vec![
            LinkSmcrAttr::Id(self.id),
            LinkSmcrAttr::State(self.state),
            LinkSmcrAttr::ConnCnt(self.conn_cnt),
            LinkSmcrAttr::IbPort(self.ib_port),
            LinkSmcrAttr::NetDev(self.net_dev),
            LinkSmcrAttr::IbDev(self.ib_dev.clone()),
            LinkSmcrAttr::Uid(self.uid),
            LinkSmcrAttr::PeerUid(self.peer_uid),
            LinkSmcrAttr::Gid(self.gid.clone()),
            LinkSmcrAttr::PeerGid(self.peer_gid.clone()),
        ];
        push_other(&mut v, &self.other, LinkSmcrAttr::Other);
        v
    }

    /// Reads the nest.
    pub fn from_attrs(attrs: &[LinkSmcrAttr]) -> Self {
        let mut s = Self::default();
        for a in attrs {
            match a {
                LinkSmcrAttr::Id(x) => s.id = *x,
                LinkSmcrAttr::IbDev(x) => s.ib_dev = x.clone(),
                LinkSmcrAttr::IbPort(x) => s.ib_port = *x,
                LinkSmcrAttr::Gid(x) => s.gid = x.clone(),
                LinkSmcrAttr::PeerGid(x) => s.peer_gid = x.clone(),
                LinkSmcrAttr::ConnCnt(x) => s.conn_cnt = *x,
                LinkSmcrAttr::NetDev(x) => s.net_dev = *x,
                LinkSmcrAttr::Uid(x) => s.uid = *x,
                LinkSmcrAttr::PeerUid(x) => s.peer_uid = *x,
                LinkSmcrAttr::State(x) => s.state = *x,
                LinkSmcrAttr::Other(o) => s.other.push(o.clone()),
            }
        }
        s
    }
}

/// `SMC_GEN_LGR_SMCD`: one SMC-D link group (what `smcd linkgroup` prints).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LgrSmcd {
    /// Link group id.
    pub id: u32,
    /// Local GID.
    pub gid: u64,
    /// Local GID extension (128-bit emulated-ISM GIDs; newer kernels).
    pub ext_gid: Option<u64>,
    /// Peer GID.
    pub peer_gid: u64,
    /// Peer GID extension (newer kernels).
    pub peer_ext_gid: Option<u64>,
    /// VLAN id.
    pub vlan_id: u8,
    /// Connections.
    pub conns_num: u32,
    /// CHID (0xFFFF for loopback-ism).
    pub chid: u32,
    /// Send buffer bytes (newer kernels).
    pub sndbuf_alloc: Option<u64>,
    /// DMB bytes (newer kernels).
    pub dmb_alloc: Option<u64>,
    /// PNET id.
    pub pnetid: String,
    /// SMCv2 details (v2 link groups only).
    pub v2_common: Option<LgrV2Common>,
    /// Attributes this crate does not know.
    pub other: Vec<DefaultNla>,
}

impl LgrSmcd {
    /// The nest's attributes, in smc_nl_fill_smcd_lgr's order.
    pub fn to_attrs(&self) -> Vec<LgrSmcdAttr> {
        let mut v = vec![LgrSmcdAttr::Id(self.id), LgrSmcdAttr::Gid(self.gid)];
        v.extend(self.ext_gid.map(LgrSmcdAttr::ExtGid));
        v.push(LgrSmcdAttr::PeerGid(self.peer_gid));
        v.extend(self.peer_ext_gid.map(LgrSmcdAttr::PeerExtGid));
        v.push(LgrSmcdAttr::VlanId(self.vlan_id));
        v.push(LgrSmcdAttr::ConnsNum(self.conns_num));
        v.push(LgrSmcdAttr::Chid(self.chid));
        v.extend(self.sndbuf_alloc.map(LgrSmcdAttr::SndbufAlloc));
        v.extend(self.dmb_alloc.map(LgrSmcdAttr::DmbAlloc));
        v.push(LgrSmcdAttr::Pnetid(self.pnetid.clone()));
        if let Some(c) = &self.v2_common {
            v.push(LgrSmcdAttr::V2Common(c.to_attrs()));
        }
        push_other(&mut v, &self.other, LgrSmcdAttr::Other);
        v
    }

    /// Reads the nest.
    pub fn from_attrs(attrs: &[LgrSmcdAttr]) -> Self {
        let mut s = Self::default();
        for a in attrs {
            match a {
                LgrSmcdAttr::Id(x) => s.id = *x,
                LgrSmcdAttr::Gid(x) => s.gid = *x,
                LgrSmcdAttr::PeerGid(x) => s.peer_gid = *x,
                LgrSmcdAttr::VlanId(x) => s.vlan_id = *x,
                LgrSmcdAttr::ConnsNum(x) => s.conns_num = *x,
                LgrSmcdAttr::Pnetid(x) => s.pnetid = x.clone(),
                LgrSmcdAttr::Chid(x) => s.chid = *x,
                LgrSmcdAttr::V2Common(x) => s.v2_common = Some(LgrV2Common::from_attrs(x)),
                LgrSmcdAttr::ExtGid(x) => s.ext_gid = Some(*x),
                LgrSmcdAttr::PeerExtGid(x) => s.peer_ext_gid = Some(*x),
                LgrSmcdAttr::SndbufAlloc(x) => s.sndbuf_alloc = Some(*x),
                LgrSmcdAttr::DmbAlloc(x) => s.dmb_alloc = Some(*x),
                LgrSmcdAttr::Pad => {}
                LgrSmcdAttr::Other(o) => s.other.push(o.clone()),
            }
        }
        s
    }
}

/// `SMC_NLA_DEV_PORT` / `SMC_NLA_DEV_PORT2`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DevPort {
    /// PNET id set by the user.
    pub pnet_usr: bool,
    /// PNET id.
    pub pnetid: String,
    /// Net device ifindex (SMC-R).
    pub netdev: Option<u32>,
    /// Port valid (SMC-R).
    pub valid: Option<bool>,
    /// Port active (SMC-R).
    pub state: Option<u8>,
    /// Links on the port (SMC-R).
    pub lnk_cnt: Option<u32>,
    /// Attributes this crate does not know.
    pub other: Vec<DefaultNla>,
}

impl DevPort {
    /// The nest's attributes (kernel order: PNET_USR, PNETID, NETDEV, VALID, STATE, LNK_CNT).
    pub fn to_attrs(&self) -> Vec<DevPortAttr> {
        let mut v = vec![
            DevPortAttr::PnetUsr(self.pnet_usr.into()),
            DevPortAttr::Pnetid(self.pnetid.clone()),
        ];
        v.extend(self.netdev.map(DevPortAttr::Netdev));
        v.extend(self.valid.map(|x| DevPortAttr::Valid(x.into())));
        v.extend(self.state.map(DevPortAttr::State));
        v.extend(self.lnk_cnt.map(DevPortAttr::LnkCnt));
        push_other(&mut v, &self.other, DevPortAttr::Other);
        v
    }

    /// Reads the nest.
    pub fn from_attrs(attrs: &[DevPortAttr]) -> Self {
        let mut s = Self::default();
        for a in attrs {
            match a {
                DevPortAttr::PnetUsr(x) => s.pnet_usr = *x != 0,
                DevPortAttr::Pnetid(x) => s.pnetid = x.clone(),
                DevPortAttr::Netdev(x) => s.netdev = Some(*x),
                DevPortAttr::State(x) => s.state = Some(*x),
                DevPortAttr::Valid(x) => s.valid = Some(*x != 0),
                DevPortAttr::LnkCnt(x) => s.lnk_cnt = Some(*x),
                DevPortAttr::Other(o) => s.other.push(o.clone()),
            }
        }
        s
    }
}

/// `SMC_GEN_DEV_SMCD` / `SMC_GEN_DEV_SMCR`: one device (what `smcd device` prints).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DevInfo {
    /// SMC-D: number of link groups.
    pub use_cnt: Option<u32>,
    /// In use.
    pub is_crit: bool,
    /// PCI function id.
    pub pci_fid: Option<u32>,
    /// Physical channel id (CHID; 0xFFFF for loopback-ism).
    pub pci_chid: Option<u16>,
    /// PCI vendor.
    pub pci_vendor: Option<u16>,
    /// PCI device (0x04ed ISM, 0x1004/0x1016/0x101e RoCE Express 1/2/3).
    pub pci_device: Option<u16>,
    /// PCI id string.
    pub pci_id: Option<String>,
    /// RDMA device name (SMC-R).
    pub ib_name: Option<String>,
    /// First port.
    pub port: Option<DevPort>,
    /// Second port (SMC-R).
    pub port2: Option<DevPort>,
    /// Attributes this crate does not know.
    pub other: Vec<DefaultNla>,
}

impl DevInfo {
    /// The nest's attributes: USE_CNT, IS_CRIT, PCI_FID, PCI_CHID, PCI_VENDOR, PCI_DEVICE,
    /// PCI_ID, IB_NAME, PORT, PORT2, which is the order of both smc_nl_handle_smcd_dev and
    /// smc_nl_handle_smcr_dev (each emits a subset).
    pub fn to_attrs(&self) -> Vec<DevAttr> {
        let mut v = Vec::new();
        v.extend(self.use_cnt.map(DevAttr::UseCnt));
        v.push(DevAttr::IsCrit(self.is_crit.into()));
        v.extend(self.pci_fid.map(DevAttr::PciFid));
        v.extend(self.pci_chid.map(DevAttr::PciChid));
        v.extend(self.pci_vendor.map(DevAttr::PciVendor));
        v.extend(self.pci_device.map(DevAttr::PciDevice));
        v.extend(self.pci_id.clone().map(DevAttr::PciId));
        v.extend(self.ib_name.clone().map(DevAttr::IbName));
        if let Some(p) = &self.port {
            v.push(DevAttr::Port(p.to_attrs()));
        }
        if let Some(p) = &self.port2 {
            v.push(DevAttr::Port2(p.to_attrs()));
        }
        push_other(&mut v, &self.other, DevAttr::Other);
        v
    }

    /// Reads the nest.
    pub fn from_attrs(attrs: &[DevAttr]) -> Self {
        let mut s = Self::default();
        for a in attrs {
            match a {
                DevAttr::UseCnt(x) => s.use_cnt = Some(*x),
                DevAttr::IsCrit(x) => s.is_crit = *x != 0,
                DevAttr::PciFid(x) => s.pci_fid = Some(*x),
                DevAttr::PciChid(x) => s.pci_chid = Some(*x),
                DevAttr::PciVendor(x) => s.pci_vendor = Some(*x),
                DevAttr::PciDevice(x) => s.pci_device = Some(*x),
                DevAttr::PciId(x) => s.pci_id = Some(x.clone()),
                DevAttr::Port(x) => s.port = Some(DevPort::from_attrs(x)),
                DevAttr::Port2(x) => s.port2 = Some(DevPort::from_attrs(x)),
                DevAttr::IbName(x) => s.ib_name = Some(x.clone()),
                DevAttr::Other(o) => s.other.push(o.clone()),
            }
        }
        s
    }
}

/// Nine size buckets: 8K, 16K, 32K, 64K, 128K, 256K, 512K, 1024K, >1024K. The kernel picks
/// the bucket as `min(fls((len - 1) >> 13), 8)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SizeBuckets(pub [u64; 9]);

impl SizeBuckets {
    /// The nest's attributes (PLOAD_8K .. PLOAD_G_1024K).
    pub fn to_attrs(&self) -> Vec<SizeBucketAttr> {
        let b = self.0;
        vec![
            SizeBucketAttr::K8(b[0]),
            SizeBucketAttr::K16(b[1]),
            SizeBucketAttr::K32(b[2]),
            SizeBucketAttr::K64(b[3]),
            SizeBucketAttr::K128(b[4]),
            SizeBucketAttr::K256(b[5]),
            SizeBucketAttr::K512(b[6]),
            SizeBucketAttr::K1024(b[7]),
            SizeBucketAttr::G1024(b[8]),
        ]
    }

    /// Reads the nest (unknown attributes are dropped).
    pub fn from_attrs(attrs: &[SizeBucketAttr]) -> Self {
        let mut b = [0u64; 9];
        for a in attrs {
            let (i, x) = match a {
                SizeBucketAttr::K8(x) => (0, x),
                SizeBucketAttr::K16(x) => (1, x),
                SizeBucketAttr::K32(x) => (2, x),
                SizeBucketAttr::K64(x) => (3, x),
                SizeBucketAttr::K128(x) => (4, x),
                SizeBucketAttr::K256(x) => (5, x),
                SizeBucketAttr::K512(x) => (6, x),
                SizeBucketAttr::K1024(x) => (7, x),
                SizeBucketAttr::G1024(x) => (8, x),
                SizeBucketAttr::Pad | SizeBucketAttr::Other(_) => continue,
            };
            b[i] = *x;
        }
        Self(b)
    }

    /// The bucket index the kernel uses for a length (`SMC_STAT_PAYLOAD_SUB`).
    pub fn index_for(len: u64) -> usize {
        let v = len.saturating_sub(1) >> 13;
        let fls = (u64::BITS - v.leading_zeros()) as usize;
        fls.min(8)
    }
}

/// RMB statistics (`SMC_NLA_STATS_T_{TX,RX}_RMB_STATS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RmbStats {
    /// Buffers reused.
    pub reuse_cnt: u64,
    /// Peer buffer too small.
    pub size_sm_peer_cnt: u64,
    /// Own buffer too small.
    pub size_sm_cnt: u64,
    /// Peer buffer full.
    pub full_peer_cnt: u64,
    /// Own buffer full.
    pub full_cnt: u64,
    /// Buffers allocated.
    pub alloc_cnt: u64,
    /// Downgraded allocations.
    pub dgrade_cnt: u64,
}

impl RmbStats {
    /// The nest's attributes, in smc_nl_fill_stats_rmb_data's order.
    pub fn to_attrs(&self) -> Vec<RmbStatsAttr> {
        vec![
            RmbStatsAttr::ReuseCnt(self.reuse_cnt),
            RmbStatsAttr::SizeSmPeerCnt(self.size_sm_peer_cnt),
            RmbStatsAttr::SizeSmCnt(self.size_sm_cnt),
            RmbStatsAttr::FullPeerCnt(self.full_peer_cnt),
            RmbStatsAttr::FullCnt(self.full_cnt),
            RmbStatsAttr::AllocCnt(self.alloc_cnt),
            RmbStatsAttr::DgradeCnt(self.dgrade_cnt),
        ]
    }

    /// Reads the nest (unknown attributes are dropped).
    pub fn from_attrs(attrs: &[RmbStatsAttr]) -> Self {
        let mut s = Self::default();
        for a in attrs {
            match a {
                RmbStatsAttr::SizeSmPeerCnt(x) => s.size_sm_peer_cnt = *x,
                RmbStatsAttr::SizeSmCnt(x) => s.size_sm_cnt = *x,
                RmbStatsAttr::FullPeerCnt(x) => s.full_peer_cnt = *x,
                RmbStatsAttr::FullCnt(x) => s.full_cnt = *x,
                RmbStatsAttr::ReuseCnt(x) => s.reuse_cnt = *x,
                RmbStatsAttr::AllocCnt(x) => s.alloc_cnt = *x,
                RmbStatsAttr::DgradeCnt(x) => s.dgrade_cnt = *x,
                RmbStatsAttr::Pad | RmbStatsAttr::Other(_) => {}
            }
        }
        s
    }
}

/// Counters of one technology (SMC-D or SMC-R).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsTech {
    /// TX buffer statistics.
    pub tx_rmb_stats: RmbStats,
    /// RX buffer statistics.
    pub rx_rmb_stats: RmbStats,
    /// TX request sizes.
    pub tx_pload: SizeBuckets,
    /// RX request sizes.
    pub rx_pload: SizeBuckets,
    /// TX buffer sizes.
    pub tx_rmb_size: SizeBuckets,
    /// RX buffer sizes.
    pub rx_rmb_size: SizeBuckets,
    /// Client v1 successes.
    pub clnt_v1_succ: u64,
    /// Client v2 successes.
    pub clnt_v2_succ: u64,
    /// Server v1 successes.
    pub srv_v1_succ: u64,
    /// Server v2 successes.
    pub srv_v2_succ: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// RX buffer bytes in use (newer kernels).
    pub rx_rmb_usage: Option<u64>,
    /// TX buffer bytes in use (newer kernels).
    pub tx_rmb_usage: Option<u64>,
    /// Receive calls.
    pub rx_cnt: u64,
    /// Send calls.
    pub tx_cnt: u64,
    /// sendpage calls (always 0).
    pub sendpage_cnt: u64,
    /// TCP_CORK uses.
    pub cork_cnt: u64,
    /// TCP_NODELAY uses.
    pub ndly_cnt: u64,
    /// splice calls.
    pub splice_cnt: u64,
    /// Urgent data sends.
    pub urg_data_cnt: u64,
    /// Attributes this crate does not know.
    pub other: Vec<DefaultNla>,
}

impl StatsTech {
    /// The nest's attributes, in smc_nl_fill_stats_tech_data's order.
    pub fn to_attrs(&self) -> Vec<StatsTechAttr> {
        let mut v = vec![
            StatsTechAttr::TxRmbStats(self.tx_rmb_stats.to_attrs()),
            StatsTechAttr::RxRmbStats(self.rx_rmb_stats.to_attrs()),
            StatsTechAttr::TxploadSize(self.tx_pload.to_attrs()),
            StatsTechAttr::RxploadSize(self.rx_pload.to_attrs()),
            StatsTechAttr::TxRmbSize(self.tx_rmb_size.to_attrs()),
            StatsTechAttr::RxRmbSize(self.rx_rmb_size.to_attrs()),
            StatsTechAttr::ClntV1Succ(self.clnt_v1_succ),
            StatsTechAttr::ClntV2Succ(self.clnt_v2_succ),
            StatsTechAttr::SrvV1Succ(self.srv_v1_succ),
            StatsTechAttr::SrvV2Succ(self.srv_v2_succ),
            StatsTechAttr::RxBytes(self.rx_bytes),
            StatsTechAttr::TxBytes(self.tx_bytes),
        ];
        v.extend(self.rx_rmb_usage.map(StatsTechAttr::RxRmbUsage));
        v.extend(self.tx_rmb_usage.map(StatsTechAttr::TxRmbUsage));
        v.extend([
            StatsTechAttr::RxCnt(self.rx_cnt),
            StatsTechAttr::TxCnt(self.tx_cnt),
            StatsTechAttr::SendpageCnt(self.sendpage_cnt),
            StatsTechAttr::CorkCnt(self.cork_cnt),
            StatsTechAttr::NdlyCnt(self.ndly_cnt),
            StatsTechAttr::SpliceCnt(self.splice_cnt),
            StatsTechAttr::UrgDataCnt(self.urg_data_cnt),
        ]);
        push_other(&mut v, &self.other, StatsTechAttr::Other);
        v
    }

    /// Reads the nest.
    pub fn from_attrs(attrs: &[StatsTechAttr]) -> Self {
        let mut s = Self::default();
        for a in attrs {
            match a {
                StatsTechAttr::TxRmbSize(x) => s.tx_rmb_size = SizeBuckets::from_attrs(x),
                StatsTechAttr::RxRmbSize(x) => s.rx_rmb_size = SizeBuckets::from_attrs(x),
                StatsTechAttr::TxploadSize(x) => s.tx_pload = SizeBuckets::from_attrs(x),
                StatsTechAttr::RxploadSize(x) => s.rx_pload = SizeBuckets::from_attrs(x),
                StatsTechAttr::TxRmbStats(x) => s.tx_rmb_stats = RmbStats::from_attrs(x),
                StatsTechAttr::RxRmbStats(x) => s.rx_rmb_stats = RmbStats::from_attrs(x),
                StatsTechAttr::ClntV1Succ(x) => s.clnt_v1_succ = *x,
                StatsTechAttr::ClntV2Succ(x) => s.clnt_v2_succ = *x,
                StatsTechAttr::SrvV1Succ(x) => s.srv_v1_succ = *x,
                StatsTechAttr::SrvV2Succ(x) => s.srv_v2_succ = *x,
                StatsTechAttr::SendpageCnt(x) => s.sendpage_cnt = *x,
                StatsTechAttr::SpliceCnt(x) => s.splice_cnt = *x,
                StatsTechAttr::CorkCnt(x) => s.cork_cnt = *x,
                StatsTechAttr::NdlyCnt(x) => s.ndly_cnt = *x,
                StatsTechAttr::UrgDataCnt(x) => s.urg_data_cnt = *x,
                StatsTechAttr::RxBytes(x) => s.rx_bytes = *x,
                StatsTechAttr::TxBytes(x) => s.tx_bytes = *x,
                StatsTechAttr::RxCnt(x) => s.rx_cnt = *x,
                StatsTechAttr::TxCnt(x) => s.tx_cnt = *x,
                StatsTechAttr::RxRmbUsage(x) => s.rx_rmb_usage = Some(*x),
                StatsTechAttr::TxRmbUsage(x) => s.tx_rmb_usage = Some(*x),
                StatsTechAttr::Pad => {}
                StatsTechAttr::Other(o) => s.other.push(o.clone()),
            }
        }
        s
    }
}

/// `SMC_GEN_STATS`: the reply to `GET_STATS` (one message per namespace).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsReply {
    /// SMC-D counters.
    pub smcd: StatsTech,
    /// SMC-R counters.
    pub smcr: StatsTech,
    /// Client handshake errors.
    pub clnt_hs_err_cnt: u64,
    /// Server handshake errors.
    pub srv_hs_err_cnt: u64,
    /// Attributes this crate does not know.
    pub other: Vec<DefaultNla>,
}

impl StatsReply {
    /// The nest's attributes (SMCD_TECH, SMCR_TECH, CLNT_HS_ERR_CNT, SRV_HS_ERR_CNT).
    pub fn to_attrs(&self) -> Vec<StatsAttr> {
        let mut v = vec![
            StatsAttr::SmcdTech(self.smcd.to_attrs()),
            StatsAttr::SmcrTech(self.smcr.to_attrs()),
            StatsAttr::ClntHsErrCnt(self.clnt_hs_err_cnt),
            StatsAttr::SrvHsErrCnt(self.srv_hs_err_cnt),
        ];
        push_other(&mut v, &self.other, StatsAttr::Other);
        v
    }

    /// Reads the nest.
    pub fn from_attrs(attrs: &[StatsAttr]) -> Self {
        let mut s = Self::default();
        for a in attrs {
            match a {
                StatsAttr::SmcdTech(x) => s.smcd = StatsTech::from_attrs(x),
                StatsAttr::SmcrTech(x) => s.smcr = StatsTech::from_attrs(x),
                StatsAttr::ClntHsErrCnt(x) => s.clnt_hs_err_cnt = *x,
                StatsAttr::SrvHsErrCnt(x) => s.srv_hs_err_cnt = *x,
                StatsAttr::Pad => {}
                StatsAttr::Other(o) => s.other.push(o.clone()),
            }
        }
        s
    }
}

/// `SMC_GEN_FBACK_STATS`: one fallback reason slot. A `GET_FBACK_STATS` dump sends one message
/// per non-empty slot, server and client interleaved; only the first carries the totals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FbackStats {
    /// Server-side list (TYPE 1) or client-side (TYPE 0).
    pub is_server: bool,
    /// Total server fallbacks (first message only).
    pub srv_cnt: Option<u64>,
    /// Total client fallbacks (first message only).
    pub clnt_cnt: Option<u64>,
    /// Reason code.
    pub rsn_code: u32,
    /// How often (u16 in the kernel).
    pub rsn_cnt: u16,
    /// Attributes this crate does not know.
    pub other: Vec<DefaultNla>,
}

impl FbackStats {
    /// The nest's attributes (TYPE, [SRV_CNT, CLNT_CNT], RSN_CODE, RSN_CNT).
    pub fn to_attrs(&self) -> Vec<FbackStatsAttr> {
        let mut v = vec![FbackStatsAttr::Type(self.is_server.into())];
        v.extend(self.srv_cnt.map(FbackStatsAttr::SrvCnt));
        v.extend(self.clnt_cnt.map(FbackStatsAttr::ClntCnt));
        v.push(FbackStatsAttr::RsnCode(self.rsn_code));
        v.push(FbackStatsAttr::RsnCnt(self.rsn_cnt));
        push_other(&mut v, &self.other, FbackStatsAttr::Other);
        v
    }

    /// Reads the nest.
    pub fn from_attrs(attrs: &[FbackStatsAttr]) -> Self {
        let mut s = Self::default();
        for a in attrs {
            match a {
                FbackStatsAttr::Type(x) => s.is_server = *x != 0,
                FbackStatsAttr::SrvCnt(x) => s.srv_cnt = Some(*x),
                FbackStatsAttr::ClntCnt(x) => s.clnt_cnt = Some(*x),
                FbackStatsAttr::RsnCode(x) => s.rsn_code = *x,
                FbackStatsAttr::RsnCnt(x) => s.rsn_cnt = *x,
                FbackStatsAttr::Pad => {}
                FbackStatsAttr::Other(o) => s.other.push(o.clone()),
            }
        }
        s
    }
}

/// The `DUMP_SEID` reply's content (absent when the system is not ISMv2 capable).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeidInfo {
    /// System EID.
    pub seid: String,
    /// Whether the SEID is used in CLC proposals.
    pub enabled: bool,
}

/// Why a string is not a valid user EID (smc_clc_ueid_valid).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UeidError {
    /// Only blanks.
    #[error("user EID is empty")]
    Empty,
    /// More than 32 characters.
    #[error("user EID is {len} bytes long, the maximum is 32")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// A table entry must be exactly 32 characters (blank padded) plus the NUL.
    #[error("user EID table entry is {len} characters, expected 32")]
    NotPadded {
        /// Its length.
        len: usize,
    },
    /// The first character must be A-Z or 0-9.
    #[error("user EID must start with A-Z or 0-9")]
    BadFirstChar,
    /// Allowed: A-Z, 0-9, '.', '-' (blanks only as trailing padding).
    #[error("user EID contains {ch:?} at {at}; allowed are A-Z, 0-9, '.' and '-'")]
    BadChar {
        /// The character.
        ch: char,
        /// Its byte offset.
        at: usize,
    },
}

/// A user EID: 32 bytes, blank padded, validated as the kernel does (smc_clc_ueid_valid:
/// upper-case letters, digits, '.', '-', first character alphanumeric, blanks only as trailing
/// padding). smc-tools additionally refuses "..", the kernel does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ueid([u8; SMC_MAX_EID_LEN]);

impl Ueid {
    /// Pads `s` with blanks to 32 bytes and validates it.
    pub fn new(s: &str) -> Result<Self, UeidError> {
        if s.len() > SMC_MAX_EID_LEN {
            return Err(UeidError::TooLong { len: s.len() });
        }
        let mut b = [b' '; SMC_MAX_EID_LEN];
        b[..s.len()].copy_from_slice(s.as_bytes());
        Self::validate(&b)?;
        Ok(Self(b))
    }

    /// Reads an `SMC_NLA_EID_TABLE_ENTRY` string, which must be the full 32 padded
    /// characters (the kernel insists on a 33-byte attribute).
    pub fn from_entry(s: &str) -> Result<Self, UeidError> {
        let b: [u8; SMC_MAX_EID_LEN] = s
            .as_bytes()
            .try_into()
            .map_err(|_| UeidError::NotPadded { len: s.len() })?;
        Self::validate(&b)?;
        Ok(Self(b))
    }

    fn validate(b: &[u8; SMC_MAX_EID_LEN]) -> Result<(), UeidError> {
        // C isspace: blank, \t, \n, \v, \f, \r.
        let is_space = |c: u8| matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
        let end = b
            .iter()
            .rposition(|&c| !is_space(c))
            .ok_or(UeidError::Empty)?;
        let ok = |c: u8| c.is_ascii_uppercase() || c.is_ascii_digit();
        if !ok(b[0]) {
            return Err(UeidError::BadFirstChar);
        }
        for (at, &c) in b[..=end].iter().enumerate() {
            if !(ok(c) || c == b'.' || c == b'-') {
                return Err(UeidError::BadChar {
                    ch: char::from(c),
                    at,
                });
            }
        }
        Ok(())
    }

    /// The 32 padded characters, as the kernel stores and dumps them.
    pub fn as_padded(&self) -> &str {
        // Validation admits only ASCII.
        core::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// Without the trailing blanks, as smc-tools prints it.
    pub fn as_str(&self) -> &str {
        self.as_padded().trim_end()
    }
}

impl core::fmt::Display for Ueid {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}
