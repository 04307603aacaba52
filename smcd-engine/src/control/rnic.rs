//! The host's RDMA devices (RNICs, rxe) as `GET_DEV_SMCR` lists them: the kernel's
//! `smc_nl_prep_smcr_dev`, `smc_nl_handle_smcr_dev` and `smc_nl_handle_dev_port` in
//! `net/smc/smc_ib.c`, which list every device in `smc_ib_devices` whatever the caller's
//! namespace.
//!
//! smcd looks them up through libibverbs ([`smc_rdma::rnic::list`], feature `rnic` of this
//! crate) when it starts and again for each `GET_DEV_SMCR` dump ([`Rnics::refresh`]). No
//! libibverbs, no kernel verbs or no device is an empty list, never an error: the reason is
//! kept for the log ([`Rnics::why_none`]). Without the feature the list is always empty.
//!
//! What comes from where: the device name and its ports 1 and 2 (`SMC_MAX_PORTS`) from
//! libibverbs; a port's netdev is the one its GID table names (the kernel's `ndev_ifidx`,
//! there from `ib_device_get_netdev`), its ifindex looked up in smcd's namespace (0 when that
//! netdev is not there); the port state is `IB_PORT_ACTIVE` or not, as
//! `smc_ib_port_active`. The PCI attributes come from sysfs (`/sys/class/infiniband/NAME/device`,
//! its `vendor` and `device`, and on s390 its `function_id` and `pchid`; 0 elsewhere, as
//! `smc_set_pci_values` leaves them) and are left out when the device has no PCI parent (rxe).
//! No PNET table exists in smcd, so the PNET id is empty and not the user's. No link of an
//! engine runs over an RNIC yet, so `IS_CRIT` is 0 and each port's `LNK_CNT` 0; a device whose
//! name an engine published itself is listed once, as the engine published it.

use smc_proto::netlink::smc::{DevInfo, DevPort};
use smc_rdma::verbs::{DeviceInfo, PortState};

/// The PCI function behind a device (`struct smc_pci_dev`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pci {
    /// s390 function id (0 elsewhere).
    pub fid: u32,
    /// s390 physical channel id (0 elsewhere).
    pub pchid: u16,
    /// PCI vendor.
    pub vendor: u16,
    /// PCI device.
    pub device: u16,
    /// `pci_name()`: `0000:3b:00.0`.
    pub id: String,
}

/// One RDMA device as libibverbs and sysfs describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rnic {
    /// Name, ports, their netdevs and GID tables.
    pub info: DeviceInfo,
    /// Its PCI function, if it has one.
    pub pci: Option<Pci>,
}

/// The devices smcd lists, and why there are none when there are none.
#[derive(Debug, Default)]
pub struct Rnics {
    /// The devices found last.
    pub list: Vec<Rnic>,
    /// Why the last look-up found none (for the log).
    pub why_none: Option<String>,
}

impl Rnics {
    /// Looks the devices up (again).
    pub fn refresh(&mut self) {
        match enumerate() {
            Ok(list) => {
                self.why_none = list.is_empty().then(|| "no RDMA device".to_string());
                self.list = list;
            }
            Err(why) => {
                self.list.clear();
                self.why_none = Some(why);
            }
        }
    }
}

/// The host's RDMA devices; `Err` says why there are none.
#[cfg(feature = "rnic")]
fn enumerate() -> Result<Vec<Rnic>, String> {
    // A panic in a verbs binding must not end smcd: it is a device the dump leaves out.
    let found = std::panic::catch_unwind(smc_rdma::rnic::list)
        .map_err(|_| "listing the RDMA devices panicked".to_string())?;
    match found {
        Ok(list) => Ok(list
            .into_iter()
            .map(|info| {
                let pci = pci_of(&info.name);
                Rnic { info, pci }
            })
            .collect()),
        Err(e) => Err(e.to_string()),
    }
}

/// Without the feature there is nothing to look at.
#[cfg(not(feature = "rnic"))]
fn enumerate() -> Result<Vec<Rnic>, String> {
    Err("smcd was built without the feature `rnic`".to_string())
}

/// The PCI function of the RDMA device `name`, from sysfs.
#[cfg_attr(not(feature = "rnic"), allow(dead_code))]
fn pci_of(name: &str) -> Option<Pci> {
    let dev = std::fs::canonicalize(format!("/sys/class/infiniband/{name}/device")).ok()?;
    let subsystem = std::fs::read_link(dev.join("subsystem")).ok()?;
    if subsystem.file_name()? != "pci" {
        return None;
    }
    let read = |f: &str| std::fs::read_to_string(dev.join(f)).ok();
    let hex = |f: &str| {
        read(f).and_then(|s| u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
    };
    Some(Pci {
        fid: hex("function_id").unwrap_or(0),
        pchid: hex("pchid")
            .and_then(|v| u16::try_from(v).ok())
            .unwrap_or(0),
        vendor: hex("vendor").and_then(|v| u16::try_from(v).ok())?,
        device: hex("device").and_then(|v| u16::try_from(v).ok())?,
        id: dev.file_name()?.to_string_lossy().into_owned(),
    })
}

/// The ifindex of netdev `name` in smcd's namespace, 0 if there is none.
pub fn ifindex(name: &str) -> u32 {
    let Ok(c) = std::ffi::CString::new(name) else {
        return 0;
    };
    if name.is_empty() {
        return 0;
    }
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    unsafe { libc::if_nametoindex(c.as_ptr()) }
}

/// `smc_nl_handle_smcr_dev` for `r` (ports 1 and 2: `SMC_MAX_PORTS`): `IS_CRIT` 0 (no link on it), the PCI attributes if it has
/// a PCI parent, its name, and ports 1 and 2 (`smc_nl_handle_dev_port`: PNET id empty and not
/// the user's, the netdev's ifindex by `ifindex`, valid, active or not, no links).
pub fn dev_smcr(r: &Rnic, ifindex: &dyn Fn(&str) -> u32) -> DevInfo {
    let port = |n: u8| {
        r.info.ports.iter().find(|p| p.port == n).map(|p| DevPort {
            pnet_usr: false,
            pnetid: String::new(),
            netdev: Some(ifindex(&p.netdev)),
            valid: Some(true),
            state: Some(u8::from(p.state == PortState::Active)),
            lnk_cnt: Some(0),
            other: Vec::new(),
        })
    };
    let pci = r.pci.as_ref();
    DevInfo {
        use_cnt: None,
        is_crit: false,
        pci_fid: pci.map(|p| p.fid),
        pci_chid: pci.map(|p| p.pchid),
        pci_vendor: pci.map(|p| p.vendor),
        pci_device: pci.map(|p| p.device),
        pci_id: pci.map(|p| p.id.clone()),
        ib_name: Some(r.info.name.clone()),
        port: port(1),
        port2: port(2),
        other: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smc_proto::netlink::smc::{DevAttr, SmcGenlMessage};
    use smc_rdma::verbs::{Gid, GidType, Mtu, PortInfo};
    use std::net::Ipv4Addr;

    fn port(n: u8, state: PortState, netdev: &str) -> PortInfo {
        PortInfo {
            port: n,
            state,
            active_mtu: Mtu::M1024,
            netdev: netdev.to_string(),
            mac: [2, 0, 0, 0, 0, n],
            gids: vec![(
                1,
                Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, n)),
                GidType::RoceV2,
            )],
        }
    }

    fn names(n: &str) -> u32 {
        match n {
            "ens1f0" => 7,
            "ens1f1" => 8,
            _ => 0,
        }
    }

    /// A two-port ConnectX on PCI, first port up, second down: the kernel's attributes in its
    /// order, through the netlink encoding and back.
    #[test]
    fn a_pci_rnic_with_two_ports() {
        let r = Rnic {
            info: DeviceInfo {
                name: "mlx5_0".into(),
                ports: vec![
                    port(1, PortState::Active, "ens1f0"),
                    port(2, PortState::Down, "ens1f1"),
                ],
            },
            pci: Some(Pci {
                fid: 0,
                pchid: 0,
                vendor: 0x15b3,
                device: 0x1017,
                id: "0000:3b:00.0".into(),
            }),
        };
        let d = dev_smcr(&r, &names);
        let attrs = d.to_attrs();
        let kinds: Vec<&str> = attrs
            .iter()
            .map(|a| match a {
                DevAttr::IsCrit(_) => "IS_CRIT",
                DevAttr::PciFid(_) => "PCI_FID",
                DevAttr::PciChid(_) => "PCI_CHID",
                DevAttr::PciVendor(_) => "PCI_VENDOR",
                DevAttr::PciDevice(_) => "PCI_DEVICE",
                DevAttr::PciId(_) => "PCI_ID",
                DevAttr::IbName(_) => "IB_NAME",
                DevAttr::Port(_) => "PORT",
                DevAttr::Port2(_) => "PORT2",
                _ => "other",
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "IS_CRIT",
                "PCI_FID",
                "PCI_CHID",
                "PCI_VENDOR",
                "PCI_DEVICE",
                "PCI_ID",
                "IB_NAME",
                "PORT",
                "PORT2"
            ]
        );
        let back = SmcGenlMessage::dev_smcr_reply(&d).dev_smcr().unwrap();
        assert_eq!(back, d);
        assert_eq!(back.ib_name.as_deref(), Some("mlx5_0"));
        assert_eq!(back.pci_vendor, Some(0x15b3));
        assert_eq!(back.pci_device, Some(0x1017));
        assert_eq!(back.pci_id.as_deref(), Some("0000:3b:00.0"));
        assert!(!back.is_crit);
        assert_eq!(back.use_cnt, None, "SMC-D only");
        let p1 = back.port.unwrap();
        assert_eq!(
            (p1.netdev, p1.valid, p1.state, p1.lnk_cnt),
            (Some(7), Some(true), Some(1), Some(0))
        );
        assert_eq!((p1.pnet_usr, p1.pnetid.as_str()), (false, ""));
        let p2 = back.port2.unwrap();
        assert_eq!((p2.netdev, p2.state), (Some(8), Some(0)));
    }

    /// rxe: no PCI parent (no PCI attributes, as the kernel leaves them out), one port; a
    /// netdev smcd cannot see (another namespace, or none in the GID table) is ifindex 0;
    /// ports beyond the kernel's two are not listed.
    #[test]
    fn rxe_without_pci_and_a_netdev_elsewhere() {
        let r = Rnic {
            info: DeviceInfo {
                name: "rxe0".into(),
                ports: vec![port(1, PortState::Active, "veth-elsewhere")],
            },
            pci: None,
        };
        let d = dev_smcr(&r, &names);
        assert_eq!(d.pci_fid, None);
        assert_eq!(d.pci_id, None);
        assert!(
            !d.to_attrs()
                .iter()
                .any(|a| matches!(a, DevAttr::PciId(_) | DevAttr::PciVendor(_)))
        );
        assert_eq!(d.port.as_ref().unwrap().netdev, Some(0));
        assert_eq!(d.port2, None);
        let three = Rnic {
            info: DeviceInfo {
                name: "mlx4_0".into(),
                ports: vec![
                    port(2, PortState::Active, "ens1f1"),
                    port(3, PortState::Active, "ens1f0"),
                ],
            },
            pci: None,
        };
        let d = dev_smcr(&three, &names);
        assert_eq!(d.port, None, "port 1 did not answer");
        assert_eq!(d.port2.unwrap().netdev, Some(8));
    }

    /// The lookup itself: here (no RDMA in this kernel, or no libibverbs, or a build without
    /// the feature) it finds nothing and says why, and never fails.
    #[test]
    fn refresh_never_fails() {
        let mut r = Rnics::default();
        r.refresh();
        assert!(r.list.is_empty() == r.why_none.is_some(), "{r:?}");
        assert_eq!(ifindex(""), 0);
        assert_eq!(ifindex("lo"), 1);
        assert_eq!(ifindex("no-such-netdev"), 0);
    }
}
