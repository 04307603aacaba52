//! `smcctl device`: smc-tools' `dev.c` — `GET_DEV_SMCD` (one row per device) and
//! `GET_DEV_SMCR` (one row per valid port).

use serde::Serialize;
use smc_proto::netlink::smc::{DevInfo, DevPort, SmcCmd};

use crate::error::Error;
use crate::fmt::{Align, alt_hex, json, table, yes_no};
use crate::session::Session;

/// smc-tools' device type names, by PCI device id.
pub fn dev_type(pci_device: u16) -> String {
    match pci_device {
        0x1004 => "RoCE_Express".to_owned(),
        0x1016 => "RoCE_Express2".to_owned(),
        0x101e => "RoCE_Express3".to_owned(),
        0x04ed => "ISM".to_owned(),
        x => alt_hex(x.into()),
    }
}

fn pnet(p: Option<&DevPort>) -> (String, bool) {
    p.map_or((String::new(), false), |p| {
        (p.pnetid.trim().to_owned(), p.pnet_usr)
    })
}

/// The PNET-ID column: `*` marks an id the user set.
fn pnet_column(id: &str, by_user: bool) -> String {
    if by_user {
        format!("*{id}")
    } else {
        id.to_owned()
    }
}

/// One SMC-D device (`--json` element).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SmcdDevice {
    /// PCI function id.
    pub fid: u32,
    /// Type name (`ISM`, or the PCI device id as `%#x`: `0` for loopback-ism).
    #[serde(rename = "type")]
    pub kind: String,
    /// PCI device id.
    pub pci_device: u16,
    /// PCI id string (`loopback-ism` for the loopback device).
    pub pci_id: String,
    /// Physical channel id (0xffff for loopback-ism).
    pub pchid: u16,
    /// In use by at least one link group.
    pub in_use: bool,
    /// Link groups on the device.
    pub lgr_count: u32,
    /// PNET id.
    pub pnet_id: String,
    /// Whether the user set the PNET id.
    pub pnet_id_by_user: bool,
}

impl SmcdDevice {
    /// From the reply nest.
    pub fn from(d: &DevInfo) -> Self {
        let (pnet_id, by_user) = pnet(d.port.as_ref());
        SmcdDevice {
            fid: d.pci_fid.unwrap_or(0),
            kind: dev_type(d.pci_device.unwrap_or(0)),
            pci_device: d.pci_device.unwrap_or(0),
            pci_id: d.pci_id.clone().unwrap_or_default(),
            pchid: d.pci_chid.unwrap_or(0),
            in_use: d.is_crit,
            lgr_count: d.use_cnt.unwrap_or(0),
            pnet_id,
            pnet_id_by_user: by_user,
        }
    }
}

/// One port of an SMC-R device (`--json` element).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SmcrPort {
    /// Net device of the port.
    pub net_dev: String,
    /// RDMA device.
    pub ib_dev: String,
    /// Port number (1 or 2).
    pub ib_port: u8,
    /// `ACTIVE` or `INACTIVE`.
    pub ib_state: String,
    /// Type name.
    #[serde(rename = "type")]
    pub kind: String,
    /// Critical (link groups without an alternative use it).
    pub critical: bool,
    /// PCI function id.
    pub fid: u32,
    /// PCI id.
    pub pci_id: String,
    /// PCHID.
    pub pchid: u16,
    /// Links on the port.
    pub link_count: u32,
    /// PNET id.
    pub pnet_id: String,
    /// Whether the user set it.
    pub pnet_id_by_user: bool,
}

fn port_state(s: u8) -> String {
    match s {
        0 => "INACTIVE".to_owned(),
        1 => "ACTIVE".to_owned(),
        x => format!("{}?", alt_hex(x.into())),
    }
}

/// The valid ports of an SMC-R device, one entry each.
pub fn smcr_ports(d: &DevInfo, ifname: &dyn Fn(u32) -> String) -> Vec<SmcrPort> {
    [(1u8, d.port.as_ref()), (2, d.port2.as_ref())]
        .into_iter()
        .filter_map(|(n, p)| p.filter(|p| p.valid.unwrap_or(false)).map(|p| (n, p)))
        .map(|(n, p)| SmcrPort {
            net_dev: p.netdev.map(ifname).unwrap_or_default(),
            ib_dev: d.ib_name.clone().unwrap_or_default(),
            ib_port: n,
            ib_state: port_state(p.state.unwrap_or(0)),
            kind: dev_type(d.pci_device.unwrap_or(0)),
            critical: d.is_crit,
            fid: d.pci_fid.unwrap_or(0),
            pci_id: d.pci_id.clone().unwrap_or_default(),
            pchid: d.pci_chid.unwrap_or(0),
            link_count: p.lnk_cnt.unwrap_or(0),
            pnet_id: p.pnetid.trim().to_owned(),
            pnet_id_by_user: p.pnet_usr,
        })
        .collect()
}

/// `--json` of `device show --smcd`.
#[derive(Debug, Clone, Serialize)]
pub struct SmcdDevices {
    /// `"smcd"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The devices.
    pub devices: Vec<SmcdDevice>,
}

/// `--json` of `device show --smcr`.
#[derive(Debug, Clone, Serialize)]
pub struct SmcrDevices {
    /// `"smcr"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// One entry per valid port.
    pub ports: Vec<SmcrPort>,
}

/// The SMC-D table.
pub fn smcd_text(devs: &[SmcdDevice]) -> String {
    let rows: Vec<Vec<String>> = devs
        .iter()
        .map(|d| {
            vec![
                format!("{:04x}", d.fid),
                d.kind.clone(),
                d.pci_id.clone(),
                format!("{:04x}", d.pchid),
                yes_no(d.in_use).to_owned(),
                d.lgr_count.to_string(),
                pnet_column(&d.pnet_id, d.pnet_id_by_user),
            ]
        })
        .collect();
    table(
        &[
            ("FID", Align::Left),
            ("Type", Align::Left),
            ("PCI-ID", Align::Left),
            ("PCHID", Align::Left),
            ("InUse", Align::Left),
            ("#LGs", Align::Right),
            ("PNET-ID", Align::Left),
        ],
        &rows,
    )
}

/// The SMC-R table (`-d` adds FID, PCI-ID, PCHID).
pub fn smcr_text(ports: &[SmcrPort], details: u8) -> String {
    let mut cols = vec![
        ("Net-Dev", Align::Left),
        ("IB-Dev", Align::Left),
        ("IB-P", Align::Right),
        ("IB-State", Align::Left),
        ("Type", Align::Left),
        ("Crit", Align::Left),
    ];
    if details >= 1 {
        cols.extend([
            ("FID", Align::Left),
            ("PCI-ID", Align::Left),
            ("PCHID", Align::Left),
        ]);
    }
    cols.extend([("#Links", Align::Right), ("PNET-ID", Align::Left)]);
    let rows: Vec<Vec<String>> = ports
        .iter()
        .map(|p| {
            let mut r = vec![
                p.net_dev.clone(),
                p.ib_dev.clone(),
                p.ib_port.to_string(),
                p.ib_state.clone(),
                p.kind.clone(),
                yes_no(p.critical).to_owned(),
            ];
            if details >= 1 {
                r.extend([
                    format!("{:04x}", p.fid),
                    p.pci_id.clone(),
                    format!("{:04x}", p.pchid),
                ]);
            }
            r.extend([
                p.link_count.to_string(),
                pnet_column(&p.pnet_id, p.pnet_id_by_user),
            ]);
            r
        })
        .collect();
    table(&cols, &rows)
}

/// Runs `device show`.
pub fn show(s: &mut Session, smcr: bool) -> Result<String, Error> {
    if smcr {
        let ports: Vec<SmcrPort> = s
            .gen_dump(SmcCmd::GetDevSmcr)?
            .iter()
            .filter_map(|m| m.dev_smcr())
            .flat_map(|d| smcr_ports(&d, &|i| i.to_string()))
            .collect();
        return Ok(if s.json {
            json(&SmcrDevices {
                kind: "smcr",
                ports,
            })
        } else {
            smcr_text(&ports, s.details)
        });
    }
    let devices: Vec<SmcdDevice> = s
        .gen_dump(SmcCmd::GetDevSmcd)?
        .iter()
        .filter_map(|m| m.dev_smcd())
        .map(|d| SmcdDevice::from(&d))
        .collect();
    Ok(if s.json {
        json(&SmcdDevices {
            kind: "smcd",
            devices,
        })
    } else {
        smcd_text(&devices)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::testutil::roundtrip_smc;
    use smc_proto::netlink::smc::SmcGenlMessage;

    #[test]
    fn loopback_row_as_in_the_kernel_series() {
        // The loopback-ism example of the kernel patch series: FID 0000, Type 0, PCI-ID
        // loopback-ism, PCHID ffff, InUse No, #LGs 0.
        let d = DevInfo {
            use_cnt: Some(0),
            is_crit: false,
            pci_fid: Some(0),
            pci_chid: Some(0xffff),
            pci_vendor: Some(0),
            pci_device: Some(0),
            pci_id: Some("loopback-ism".into()),
            port: Some(DevPort {
                pnet_usr: false,
                pnetid: String::new(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let d = roundtrip_smc(SmcGenlMessage::dev_smcd_reply(&d))
            .dev_smcd()
            .unwrap();
        let dev = SmcdDevice::from(&d);
        assert_eq!(
            smcd_text(std::slice::from_ref(&dev)),
            "FID   Type  PCI-ID        PCHID  InUse  #LGs  PNET-ID\n\
             0000  0     loopback-ism  ffff   No        0\n"
        );
        let j: serde_json::Value = serde_json::from_str(&json(&SmcdDevices {
            kind: "smcd",
            devices: vec![dev],
        }))
        .unwrap();
        assert_eq!(j["devices"][0]["pci_id"], "loopback-ism");
        assert_eq!(j["devices"][0]["pchid"], 0xffff);
        assert_eq!(j["devices"][0]["in_use"], false);
    }

    #[test]
    fn ism_with_user_pnetid() {
        let d = DevInfo {
            use_cnt: Some(2),
            is_crit: true,
            pci_fid: Some(0x1234),
            pci_chid: Some(0x7c0),
            pci_device: Some(0x04ed),
            pci_id: Some("0000:00:00.0".into()),
            port: Some(DevPort {
                pnet_usr: true,
                pnetid: "NET1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let t = smcd_text(&[SmcdDevice::from(&d)]);
        assert!(
            t.ends_with("1234  ISM   0000:00:00.0  07c0   Yes       2  *NET1\n"),
            "{t}"
        );
    }

    #[test]
    fn smcr_rows_per_valid_port() {
        let port = |valid, state| DevPort {
            pnet_usr: false,
            pnetid: "P".into(),
            netdev: Some(3),
            valid: Some(valid),
            state: Some(state),
            lnk_cnt: Some(4),
            ..Default::default()
        };
        let d = DevInfo {
            is_crit: true,
            pci_fid: Some(0x10),
            pci_chid: Some(0x20),
            pci_device: Some(0x1016),
            pci_id: Some("0000:01:00.0".into()),
            ib_name: Some("mlx5_0".into()),
            port: Some(port(true, 1)),
            port2: Some(port(false, 0)),
            ..Default::default()
        };
        let d = roundtrip_smc(SmcGenlMessage::dev_smcr_reply(&d))
            .dev_smcr()
            .unwrap();
        let ports = smcr_ports(&d, &|i| format!("eth{i}"));
        assert_eq!(ports.len(), 1);
        assert_eq!(
            smcr_text(&ports, 0),
            "Net-Dev  IB-Dev  IB-P  IB-State  Type           Crit  #Links  PNET-ID\n\
             eth3     mlx5_0     1  ACTIVE    RoCE_Express2  Yes        4  P\n"
        );
        assert!(smcr_text(&ports, 1).contains("0010  0000:01:00.0  0020"));
    }
}
