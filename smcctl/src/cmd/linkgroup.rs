//! `smcctl linkgroup`: smc-tools' `linkgroup.c` — `GET_LGR_SMCD`, `GET_LGR_SMCR` and
//! `GET_LINK_SMCR` as tables, or a key/value block per link group with `-d`.

use serde::Serialize;
use smc_proto::netlink::smc::{LgrSmcd, LgrSmcr, LgrV2Common, LinkSmcr, SmcCmd};

use crate::cli::parse_lgr_id;
use crate::error::Error;
use crate::fmt::{Align, alt_hex, gid128, json, kv, table, vlan, yes_no};
use crate::session::Session;

/// smc-tools compares SMC-R link group ids without their low byte (the link id part).
const SMCR_LGR_ID_MASK: u32 = 0xffff_ff00;

/// `all` or one id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Every link group.
    All,
    /// One link group.
    Id(u32),
}

impl Target {
    /// Reads `[all|LG-ID]` (hexadecimal, as listed).
    pub fn parse(arg: Option<&str>) -> Result<Self, Error> {
        match arg {
            None | Some("all") => Ok(Target::All),
            Some(s) => parse_lgr_id(s).map(Target::Id).ok_or_else(|| {
                Error::usage(format!(
                    "\"{s}\" is not a link group id (hexadecimal, as `smcctl linkgroup` lists it)"
                ))
            }),
        }
    }
}

/// The SMCv2 part of a link group (`V2_COMMON`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PeerV2 {
    /// Negotiated SMC version.
    pub version: u8,
    /// The peer's release.
    pub peer_release: u8,
    /// The peer's host name.
    pub peer_host: String,
    /// The peer's OS (`LINUX`, `ZOS`, `AIX`, or the number).
    pub peer_os: String,
    /// The negotiated EID.
    pub eid: String,
}

impl PeerV2 {
    fn from(c: &LgrV2Common) -> Self {
        PeerV2 {
            version: c.ver,
            peer_release: c.rel,
            peer_host: c.peer_host.trim_end().to_owned(),
            peer_os: os_name(c.os),
            eid: c.neg_eid.trim_end().to_owned(),
        }
    }
}

/// smc-tools' names of the CLC peer OS codes.
pub fn os_name(os: u8) -> String {
    match os {
        1 => "ZOS".to_owned(),
        2 => "LINUX".to_owned(),
        3 => "AIX".to_owned(),
        x => x.to_string(),
    }
}

/// One SMC-D link group (`--json` element).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SmcdLinkGroup {
    /// Link group id (the table prints it as 8 hex digits).
    pub id: u32,
    /// VLAN id.
    pub vlan_id: u8,
    /// Connections.
    pub conns: u32,
    /// PNET id (empty if none).
    pub pnet_id: String,
    /// SMC version of the link group: 1, or the v2 version.
    pub version: u8,
    /// Local GID, 16 hex digits (32 with the emulated-ISM extension).
    pub gid: String,
    /// Peer GID, same format.
    pub peer_gid: String,
    /// CHID of the device (0xffff for loopback-ism).
    pub chid: u32,
    /// Send buffer bytes (absent from older kernels).
    pub sndbuf_bytes: Option<u64>,
    /// DMB bytes (absent from older kernels).
    pub dmb_bytes: Option<u64>,
    /// SMCv2 details (v2 link groups only).
    pub v2: Option<PeerV2>,
}

impl SmcdLinkGroup {
    /// From the reply nest.
    pub fn from(l: &LgrSmcd) -> Self {
        let v2 = l.v2_common.as_ref().map(PeerV2::from);
        SmcdLinkGroup {
            id: l.id,
            vlan_id: l.vlan_id,
            conns: l.conns_num,
            pnet_id: l.pnetid.trim().to_owned(),
            version: v2.as_ref().map_or(1, |v| v.version),
            gid: gid128(l.gid, l.ext_gid),
            peer_gid: gid128(l.peer_gid, l.peer_ext_gid),
            chid: l.chid,
            sndbuf_bytes: l.sndbuf_alloc,
            dmb_bytes: l.dmb_alloc,
            v2,
        }
    }
}

/// One SMC-R link group (`--json` element).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SmcrLinkGroup {
    /// Link group id.
    pub id: u32,
    /// `CLNT` or `SERV`.
    pub role: String,
    /// `NONE`, `SINGLE`, `SYM`, `ASYMP`, `ASYML`.
    pub lgr_type: String,
    /// VLAN id.
    pub vlan_id: u8,
    /// Connections.
    pub conns: u32,
    /// PNET id.
    pub pnet_id: String,
    /// 1, or the v2 version.
    pub version: u8,
    /// SMC-Rv2: peer reachable without a gateway.
    pub direct: Option<bool>,
    /// Send buffer bytes.
    pub sndbuf_bytes: Option<u64>,
    /// RMB bytes.
    pub rmb_bytes: Option<u64>,
    /// SMCv2 details.
    pub v2: Option<PeerV2>,
}

fn role_name(role: u8) -> String {
    if role != 0 { "SERV" } else { "CLNT" }.to_owned()
}

fn lgr_type_name(t: u8) -> String {
    match t {
        0 => "NONE".to_owned(),
        1 => "SINGLE".to_owned(),
        2 => "SYM".to_owned(),
        3 => "ASYMP".to_owned(),
        4 => "ASYML".to_owned(),
        x => format!("{}?", alt_hex(x.into())),
    }
}

fn link_state_name(s: u32) -> String {
    match s {
        0 => "LINK_UNUSED".to_owned(),
        1 => "LINK_INACTIVE".to_owned(),
        2 => "LINK_ACTIVATING".to_owned(),
        3 => "LINK_ACTIVE".to_owned(),
        x => format!("{}?", alt_hex(x.into())),
    }
}

impl SmcrLinkGroup {
    /// From the reply nest.
    pub fn from(l: &LgrSmcr) -> Self {
        let v2 = l.v2_common.as_ref().map(PeerV2::from);
        SmcrLinkGroup {
            id: l.id,
            role: role_name(l.role),
            lgr_type: lgr_type_name(l.lgr_type),
            vlan_id: l.vlan_id,
            conns: l.conns_num,
            pnet_id: l.pnetid.trim().to_owned(),
            version: v2.as_ref().map_or(1, |v| v.version),
            direct: l.v2.as_ref().map(|v| v.direct),
            sndbuf_bytes: l.sndbuf_alloc,
            rmb_bytes: l.rmb_alloc,
            v2,
        }
    }
}

/// One SMC-R link (`--json` element of `linkgroup links`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SmcrLink {
    /// Its link group.
    pub lgr_id: u32,
    /// Link group role.
    pub role: String,
    /// Link group type.
    pub lgr_type: String,
    /// Link id.
    pub link_id: u8,
    /// Net device name (or the ifindex when it has no name here; empty when 0).
    pub net_dev: String,
    /// `LINK_ACTIVE` ..
    pub state: String,
    /// Connections.
    pub conns: u32,
    /// Link user id, 8 hex digits.
    pub link_uid: String,
    /// Peer link user id, 8 hex digits.
    pub peer_uid: String,
    /// RDMA device.
    pub ib_dev: String,
    /// RDMA port.
    pub ib_port: u8,
    /// Local GID.
    pub gid: String,
    /// Peer GID.
    pub peer_gid: String,
}

/// The name of an interface index, read from sysfs (the netns of this process's mount).
fn ifname(index: u32) -> String {
    if index == 0 {
        return String::new();
    }
    if let Ok(dir) = std::fs::read_dir("/sys/class/net") {
        for e in dir.flatten() {
            let p = e.path().join("ifindex");
            if let Ok(s) = std::fs::read_to_string(&p)
                && s.trim().parse::<u32>().ok() == Some(index)
            {
                return e.file_name().to_string_lossy().into_owned();
            }
        }
    }
    index.to_string()
}

impl SmcrLink {
    fn from(lgr: &LgrSmcr, l: &LinkSmcr) -> Self {
        SmcrLink {
            lgr_id: lgr.id,
            role: role_name(lgr.role),
            lgr_type: lgr_type_name(lgr.lgr_type),
            link_id: l.id,
            net_dev: ifname(l.net_dev),
            state: link_state_name(l.state),
            conns: l.conn_cnt,
            // The kernel copies the 4 uid bytes as they are; smc-tools prints them in
            // network order.
            link_uid: format!("{:08x}", u32::from_be(l.uid)),
            peer_uid: format!("{:08x}", u32::from_be(l.peer_uid)),
            ib_dev: l.ib_dev.clone(),
            ib_port: l.ib_port,
            gid: l.gid.clone(),
            peer_gid: l.peer_gid.clone(),
        }
    }
}

/// `--json` of `linkgroup show --smcd`.
#[derive(Debug, Clone, Serialize)]
pub struct SmcdLinkGroups {
    /// `"smcd"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The link groups.
    pub linkgroups: Vec<SmcdLinkGroup>,
}

/// `--json` of `linkgroup show --smcr`.
#[derive(Debug, Clone, Serialize)]
pub struct SmcrLinkGroups {
    /// `"smcr"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The link groups.
    pub linkgroups: Vec<SmcrLinkGroup>,
}

/// `--json` of `linkgroup links`.
#[derive(Debug, Clone, Serialize)]
pub struct SmcrLinks {
    /// `"smcr"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The links.
    pub links: Vec<SmcrLink>,
}

fn bytes(v: Option<u64>) -> String {
    format!("{} B", v.unwrap_or(0))
}

fn v2_block(out: &mut String, version: u8, v2: Option<&PeerV2>) {
    kv(out, "Version", version);
    if let Some(v) = v2 {
        kv(out, "Peer-Rel", v.peer_release);
        kv(out, "Peer-Host", &v.peer_host);
        kv(out, "Peer-OS", &v.peer_os);
    }
}

/// The SMC-D table, or with `details` the blocks (`-dd` adds GIDs and CHID).
pub fn smcd_text(lgrs: &[SmcdLinkGroup], details: u8) -> String {
    if details == 0 {
        let rows: Vec<Vec<String>> = lgrs
            .iter()
            .map(|l| {
                vec![
                    format!("{:08x}", l.id),
                    vlan(l.vlan_id),
                    l.conns.to_string(),
                    l.pnet_id.clone(),
                ]
            })
            .collect();
        return table(
            &[
                ("LG-ID", Align::Left),
                ("VLAN", Align::Right),
                ("#Conns", Align::Right),
                ("PNET-ID", Align::Left),
            ],
            &rows,
        );
    }
    let mut out = String::new();
    for (i, l) in lgrs.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        kv(&mut out, "LG-ID", format!("{:08x}", l.id));
        kv(&mut out, "VLAN", alt_hex(l.vlan_id.into()));
        kv(&mut out, "PNET-ID", &l.pnet_id);
        v2_block(&mut out, l.version, l.v2.as_ref());
        if let Some(v) = &l.v2 {
            kv(&mut out, "EID", &v.eid);
        }
        kv(&mut out, "#Conns", l.conns);
        kv(&mut out, "Sndbuf", bytes(l.sndbuf_bytes));
        kv(&mut out, "DMB", bytes(l.dmb_bytes));
        if details >= 2 {
            kv(&mut out, "GID", &l.gid);
            kv(&mut out, "Peer-GID", &l.peer_gid);
            kv(&mut out, "CHID", format!("{:04x}", l.chid));
        }
    }
    out
}

/// The SMC-R table, or with `details` the blocks.
pub fn smcr_text(lgrs: &[SmcrLinkGroup], details: u8) -> String {
    if details == 0 {
        let rows: Vec<Vec<String>> = lgrs
            .iter()
            .map(|l| {
                vec![
                    format!("{:08x}", l.id),
                    l.role.clone(),
                    l.lgr_type.clone(),
                    vlan(l.vlan_id),
                    l.conns.to_string(),
                    l.pnet_id.clone(),
                ]
            })
            .collect();
        return table(
            &[
                ("LG-ID", Align::Left),
                ("LG-Role", Align::Left),
                ("LG-Type", Align::Left),
                ("VLAN", Align::Right),
                ("#Conns", Align::Right),
                ("PNET-ID", Align::Left),
            ],
            &rows,
        );
    }
    let mut out = String::new();
    for (i, l) in lgrs.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        kv(&mut out, "LG-ID", format!("{:08x}", l.id));
        kv(&mut out, "LG-Role", &l.role);
        kv(&mut out, "LG-Type", &l.lgr_type);
        kv(&mut out, "VLAN", alt_hex(l.vlan_id.into()));
        kv(&mut out, "PNET-ID", &l.pnet_id);
        v2_block(&mut out, l.version, l.v2.as_ref());
        if let Some(v) = &l.v2 {
            kv(&mut out, "Direct", yes_no(l.direct.unwrap_or(false)));
            kv(&mut out, "EID", &v.eid);
        }
        kv(&mut out, "#Conns", l.conns);
        kv(&mut out, "Sndbuf", bytes(l.sndbuf_bytes));
        kv(&mut out, "RMB", bytes(l.rmb_bytes));
    }
    out
}

/// The link table (`-d` adds uids and device, `-dd` the GIDs).
pub fn links_text(links: &[SmcrLink], details: u8) -> String {
    let mut cols = vec![
        ("LG-ID", Align::Left),
        ("LG-Role", Align::Left),
        ("LG-Type", Align::Left),
        ("Net-Dev", Align::Left),
        ("Link-State", Align::Left),
        ("#Conns", Align::Right),
    ];
    if details >= 1 {
        cols.extend([
            ("Link-UID", Align::Left),
            ("Peer-UID", Align::Left),
            ("IB-Dev", Align::Left),
            ("IB-P", Align::Right),
        ]);
    }
    if details >= 2 {
        cols.extend([("Local-GID", Align::Left), ("Peer-GID", Align::Left)]);
    }
    let rows: Vec<Vec<String>> = links
        .iter()
        .map(|l| {
            let mut r = vec![
                format!("{:08x}", l.lgr_id),
                l.role.clone(),
                l.lgr_type.clone(),
                l.net_dev.clone(),
                l.state.clone(),
                l.conns.to_string(),
            ];
            if details >= 1 {
                r.extend([
                    l.link_uid.clone(),
                    l.peer_uid.clone(),
                    l.ib_dev.clone(),
                    l.ib_port.to_string(),
                ]);
            }
            if details >= 2 {
                r.extend([l.gid.clone(), l.peer_gid.clone()]);
            }
            r
        })
        .collect();
    table(&cols, &rows)
}

/// Runs `linkgroup show`.
pub fn show(s: &mut Session, target: Option<&str>, smcr: bool) -> Result<String, Error> {
    let target = Target::parse(target)?;
    if smcr {
        let lgrs: Vec<SmcrLinkGroup> = s
            .gen_dump(SmcCmd::GetLgrSmcr)?
            .iter()
            .filter_map(|m| m.lgr_smcr())
            .filter(|l| match target {
                Target::All => true,
                Target::Id(id) => l.id & SMCR_LGR_ID_MASK == id & SMCR_LGR_ID_MASK,
            })
            .map(|l| SmcrLinkGroup::from(&l))
            .collect();
        return Ok(if s.json {
            json(&SmcrLinkGroups {
                kind: "smcr",
                linkgroups: lgrs,
            })
        } else {
            smcr_text(&lgrs, s.details)
        });
    }
    let lgrs: Vec<SmcdLinkGroup> = s
        .gen_dump(SmcCmd::GetLgrSmcd)?
        .iter()
        .filter_map(|m| m.lgr_smcd())
        .filter(|l| match target {
            Target::All => true,
            Target::Id(id) => l.id == id,
        })
        .map(|l| SmcdLinkGroup::from(&l))
        .collect();
    Ok(if s.json {
        json(&SmcdLinkGroups {
            kind: "smcd",
            linkgroups: lgrs,
        })
    } else {
        smcd_text(&lgrs, s.details)
    })
}

/// Pairs each link with the link group message before it (`GET_LINK_SMCR` sends a
/// `GET_LGR_SMCR` message per link group, then its links).
pub fn pair_links(msgs: &[smc_proto::netlink::smc::SmcGenlMessage]) -> Vec<SmcrLink> {
    let mut lgr: Option<LgrSmcr> = None;
    let mut out = Vec::new();
    for m in msgs {
        if let Some(l) = m.lgr_smcr() {
            lgr = Some(l);
        } else if let (Some(link), Some(g)) = (m.link_smcr(), lgr.as_ref()) {
            out.push(SmcrLink::from(g, &link));
        }
    }
    out
}

/// Runs `linkgroup links`.
pub fn links(s: &mut Session, target: Option<&str>) -> Result<String, Error> {
    let target = Target::parse(target)?;
    let msgs = s.gen_dump(SmcCmd::GetLinkSmcr)?;
    let links: Vec<SmcrLink> = pair_links(&msgs)
        .into_iter()
        .filter(|l| match target {
            Target::All => true,
            Target::Id(id) => l.lgr_id & SMCR_LGR_ID_MASK == id & SMCR_LGR_ID_MASK,
        })
        .collect();
    Ok(if s.json {
        json(&SmcrLinks {
            kind: "smcr",
            links,
        })
    } else {
        links_text(&links, s.details)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::testutil::roundtrip_smc;
    use smc_proto::netlink::smc::{LgrSmcrV2, SmcGenlMessage};

    fn smcd_lgr(id: u32, conns: u32, v2: bool) -> LgrSmcd {
        LgrSmcd {
            id,
            gid: 0x1122_3344_5566_7788,
            ext_gid: Some(0x99aa_bbcc_ddee_ff00),
            peer_gid: 0x1122_3344_5566_7788,
            peer_ext_gid: Some(0x99aa_bbcc_ddee_ff00),
            vlan_id: 0,
            conns_num: conns,
            chid: 0xffff,
            sndbuf_alloc: Some(0),
            dmb_alloc: Some(131072),
            pnetid: String::new(),
            v2_common: v2.then(|| LgrV2Common {
                ver: 2,
                rel: 1,
                os: 2,
                peer_host: "peer".into(),
                neg_eid: "SEID-X".into(),
                other: Vec::new(),
            }),
            other: Vec::new(),
        }
    }

    fn wire(l: &LgrSmcd) -> SmcdLinkGroup {
        SmcdLinkGroup::from(
            &roundtrip_smc(SmcGenlMessage::lgr_smcd_reply(l))
                .lgr_smcd()
                .unwrap(),
        )
    }

    #[test]
    fn smcd_table() {
        let lgrs = [
            wire(&smcd_lgr(0x100, 2, true)),
            wire(&smcd_lgr(0x200, 10, false)),
        ];
        assert_eq!(
            smcd_text(&lgrs, 0),
            "LG-ID     VLAN  #Conns  PNET-ID\n\
             00000100     0       2\n\
             00000200     0      10\n"
        );
    }

    #[test]
    fn smcd_detail_block() {
        let lgrs = [wire(&smcd_lgr(0x100, 2, true))];
        assert_eq!(
            smcd_text(&lgrs, 1),
            "LG-ID    : 00000100\n\
             VLAN     : 0\n\
             PNET-ID  : \n\
             Version  : 2\n\
             Peer-Rel : 1\n\
             Peer-Host: peer\n\
             Peer-OS  : LINUX\n\
             EID      : SEID-X\n\
             #Conns   : 2\n\
             Sndbuf   : 0 B\n\
             DMB      : 131072 B\n"
        );
        let dd = smcd_text(&lgrs, 2);
        assert!(
            dd.contains("GID      : 112233445566778899aabbccddeeff00\n"),
            "{dd}"
        );
        assert!(dd.contains("CHID     : ffff\n"));
        let v1 = smcd_text(&[wire(&smcd_lgr(0x200, 1, false))], 1);
        assert!(v1.contains("Version  : 1\n") && !v1.contains("Peer-Host"));
    }

    #[test]
    fn smcd_json() {
        let v = SmcdLinkGroups {
            kind: "smcd",
            linkgroups: vec![wire(&smcd_lgr(0x100, 2, true))],
        };
        let j: serde_json::Value = serde_json::from_str(&json(&v)).unwrap();
        assert_eq!(j["type"], "smcd");
        assert_eq!(j["linkgroups"][0]["id"], 0x100);
        assert_eq!(j["linkgroups"][0]["conns"], 2);
        assert_eq!(j["linkgroups"][0]["chid"], 0xffff);
        assert_eq!(j["linkgroups"][0]["v2"]["peer_os"], "LINUX");
        assert_eq!(j["linkgroups"][0]["dmb_bytes"], 131072);
    }

    #[test]
    fn smcr_tables_and_links() {
        let lgr = LgrSmcr {
            id: 0x0102_0300,
            conns_num: 3,
            role: 1,
            lgr_type: 2,
            vlan_id: 0x10,
            pnetid: "NET1".into(),
            v2: Some(LgrSmcrV2 {
                direct: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        let link = LinkSmcr {
            id: 1,
            state: 3,
            conn_cnt: 3,
            ib_port: 1,
            net_dev: 0,
            ib_dev: "mlx5_0".into(),
            uid: u32::from_be(0x0a0b_0c0d),
            peer_uid: u32::from_be(0x0102_0304),
            gid: "fe80::1".into(),
            peer_gid: "fe80::2".into(),
            ..Default::default()
        };
        let msgs = [
            roundtrip_smc(SmcGenlMessage::lgr_smcr_reply(&lgr)),
            roundtrip_smc(SmcGenlMessage::link_smcr_reply(&link)),
        ];
        let g = SmcrLinkGroup::from(&msgs[0].lgr_smcr().unwrap());
        assert_eq!(
            smcr_text(std::slice::from_ref(&g), 0),
            "LG-ID     LG-Role  LG-Type  VLAN  #Conns  PNET-ID\n\
             01020300  SERV     SYM      0x10       3  NET1\n"
        );
        let d = smcr_text(&[g], 1);
        assert!(
            d.contains("LG-Role  : SERV\n") && d.contains("RMB      : 0 B\n"),
            "{d}"
        );
        let links = pair_links(&msgs);
        assert_eq!(links.len(), 1);
        assert_eq!(links[0].link_uid, "0a0b0c0d");
        let t = links_text(&links, 2);
        assert!(t.starts_with(
            "LG-ID     LG-Role  LG-Type  Net-Dev  Link-State   #Conns  Link-UID  Peer-UID  IB-Dev  IB-P  Local-GID  Peer-GID\n"
        ), "{t}");
        assert!(t.contains("LINK_ACTIVE") && t.contains("mlx5_0"));
    }

    #[test]
    fn targets() {
        assert_eq!(Target::parse(None).unwrap(), Target::All);
        assert_eq!(Target::parse(Some("all")).unwrap(), Target::All);
        assert_eq!(Target::parse(Some("1a")).unwrap(), Target::Id(0x1a));
        assert_eq!(Target::parse(Some("xyz")).unwrap_err().code, 2);
    }
}
