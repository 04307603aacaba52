//! `smcctl info`: smc-tools' `info.c` — the capability block built from `GET_SYS_INFO` and
//! the device counts of `GET_DEV_SMCD`/`GET_DEV_SMCR`; against smcd also how connections
//! learn that their peer speaks SMC (`SMCD_ENGINE` `INFO`: the SMC TCP option through BPF, or
//! smcd's intents).

use std::fmt::Write;

use serde::Serialize;
use smc_proto::netlink::engine::{EngineCmd, EngineMessage};
use smc_proto::netlink::smc::{DevInfo, SmcCmd, SysInfo};

use crate::error::Error;
use crate::fmt::json;
use crate::session::Session;

/// `--json` of `info`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Info {
    /// `"2.1"`: SMC version and release; `null` when not reported.
    pub smc_version: Option<String>,
    /// The host name the SMC layer announces.
    pub hostname: Option<String>,
    /// SMC-D protocol levels the stack speaks (`["v1","v2"]`).
    pub smcd_features: Vec<String>,
    /// SMC-R protocol levels.
    pub smcr_features: Vec<String>,
    /// The system EID, when the system is ISMv2 capable.
    pub seid: Option<String>,
    /// ISM levels usable with the devices present (empty: none, `n/a`).
    pub ism: Vec<String>,
    /// RoCE levels usable with the devices present.
    pub roce: Vec<String>,
    /// SMC-D devices counted.
    pub smcd_devices: usize,
    /// SMC-R devices counted.
    pub smcr_devices: usize,
    /// How SMC capability is signalled (smcd only; `null` with `--kernel`).
    pub syn_option: Option<SynOption>,
}

/// How connections learn that their peer speaks SMC.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SynOption {
    /// `"bpf"`: the kernel's TCP option, written and read by smcd's BPF program; `"intents"`:
    /// smcd's listener table and connect intents (same host only).
    pub path: String,
    /// The cgroup the program is attached to.
    pub cgroup: Option<String>,
    /// Why, in smcd's words.
    pub status: Option<String>,
}

/// PCI device ids of the RoCE Express generations (smc-tools' device table).
const ROCE_EXPRESS: u16 = 0x1004;
const ROCE_EXPRESS2: u16 = 0x1016;
const ROCE_EXPRESS3: u16 = 0x101e;

impl Info {
    /// Builds the view from the replies.
    pub fn build(sys: &SysInfo, smcd_devs: &[DevInfo], smcr_devs: &[DevInfo]) -> Self {
        let smc_version = (sys.ver != 0).then(|| format!("{}.{}", sys.ver, sys.rel));
        let mut smcd_features = vec!["v1".to_owned()];
        if sys.ver >= 2 {
            smcd_features.push("v2".to_owned());
        }
        let mut smcr_features = vec!["v1".to_owned()];
        if sys.is_smcr_v2 == Some(true) {
            smcr_features.push("v2".to_owned());
        }
        let mut ism = Vec::new();
        if !smcd_devs.is_empty() {
            ism.push("v1".to_owned());
            if sys.is_ism_v2 {
                ism.push("v2".to_owned());
            }
        }
        let generation = |d: &DevInfo| d.pci_device.unwrap_or(0);
        let roce_any = smcr_devs
            .iter()
            .any(|d| matches!(generation(d), ROCE_EXPRESS | ROCE_EXPRESS2 | ROCE_EXPRESS3));
        let roce_v2 = smcr_devs
            .iter()
            .any(|d| matches!(generation(d), ROCE_EXPRESS2 | ROCE_EXPRESS3));
        let mut roce = Vec::new();
        if roce_any {
            roce.push("v1".to_owned());
        }
        if roce_v2 {
            roce.push("v2".to_owned());
        }
        let nonempty = |s: &Option<String>| {
            s.as_ref()
                .map(|x| x.trim_end().to_owned())
                .filter(|x| !x.is_empty())
        };
        Info {
            smc_version,
            hostname: nonempty(&sys.local_host),
            smcd_features,
            smcr_features,
            seid: nonempty(&sys.seid),
            ism,
            roce,
            smcd_devices: smcd_devs.len(),
            smcr_devices: smcr_devs.len(),
            syn_option: None,
        }
    }

    /// smc-tools' text.
    pub fn text(&self) -> String {
        let na = |v: &Option<String>| v.clone().unwrap_or_else(|| "n/a".to_owned());
        let list = |v: &[String]| {
            if v.is_empty() {
                "n/a".to_owned()
            } else {
                v.join(" ")
            }
        };
        let mut s = String::new();
        let _ = writeln!(s, "Kernel Capabilities");
        let _ = writeln!(s, "SMC Version:      {}", na(&self.smc_version));
        let _ = writeln!(s, "SMC Hostname:     {}", na(&self.hostname));
        let _ = writeln!(s, "SMC-D Features:   {}", list(&self.smcd_features));
        let _ = writeln!(s, "SMC-R Features:   {}", list(&self.smcr_features));
        let _ = writeln!(s);
        let _ = writeln!(s, "Hardware Capabilities");
        let _ = writeln!(s, "SEID:             {}", na(&self.seid));
        let _ = writeln!(s, "ISM:              {}", list(&self.ism));
        let _ = writeln!(s, "RoCE:             {}", list(&self.roce));
        if let Some(o) = &self.syn_option {
            let _ = writeln!(s);
            let _ = writeln!(s, "Capability Signalling");
            let how = match (o.path.as_str(), &o.cgroup) {
                ("bpf", Some(cg)) => format!("TCP option (BPF, cgroup {cg})"),
                ("bpf", None) => "TCP option (BPF)".to_owned(),
                _ => "intents (same host)".to_owned(),
            };
            let _ = writeln!(s, "SMC Option:       {how}");
            if o.path != "bpf"
                && let Some(why) = &o.status
            {
                let _ = writeln!(s, "Option Status:    {why}");
            }
        }
        s
    }
}

/// Runs `info show`.
pub fn show(s: &mut Session) -> Result<String, Error> {
    let smcd_devs: Vec<DevInfo> = s
        .gen_dump(SmcCmd::GetDevSmcd)?
        .iter()
        .filter_map(|m| m.dev_smcd())
        .collect();
    let smcr_devs: Vec<DevInfo> = s
        .gen_dump(SmcCmd::GetDevSmcr)?
        .iter()
        .filter_map(|m| m.dev_smcr())
        .collect();
    let sys = s
        .gen_dump(SmcCmd::GetSysInfo)?
        .iter()
        .find_map(|m| m.sys_info())
        .unwrap_or_default();
    let mut info = Info::build(&sys, &smcd_devs, &smcr_devs);
    if !s.kernel {
        // An older smcd without INFO: the line is left out rather than the command failed.
        info.syn_option = s
            .engine_query(EngineMessage::new(EngineCmd::Info, vec![]))
            .ok()
            .and_then(|r| r.iter().find_map(EngineMessage::syn_option))
            .map(|(on, cgroup, status)| SynOption {
                path: if on { "bpf" } else { "intents" }.to_owned(),
                cgroup,
                status,
            });
    }
    Ok(if s.json { json(&info) } else { info.text() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::testutil::roundtrip_smc;
    use smc_proto::netlink::smc::{DevPort, SmcGenlMessage};

    fn sys() -> SysInfo {
        SysInfo {
            ver: 2,
            rel: 1,
            is_ism_v2: true,
            is_smcr_v2: Some(true),
            local_host: Some("host1".into()),
            seid: Some("SEID-1".into()),
            other: Vec::new(),
        }
    }

    fn loopback() -> DevInfo {
        DevInfo {
            use_cnt: Some(1),
            is_crit: true,
            pci_fid: Some(0),
            pci_chid: Some(0xffff),
            pci_vendor: Some(0),
            pci_device: Some(0),
            pci_id: Some("loopback-ism".into()),
            port: Some(DevPort::default()),
            ..Default::default()
        }
    }

    #[test]
    fn text_matches_smc_tools_layout() {
        let sys = roundtrip_smc(SmcGenlMessage::sys_info_reply(&sys()))
            .sys_info()
            .unwrap();
        let dev = roundtrip_smc(SmcGenlMessage::dev_smcd_reply(&loopback()))
            .dev_smcd()
            .unwrap();
        let info = Info::build(&sys, &[dev], &[]);
        assert_eq!(
            info.text(),
            "Kernel Capabilities\n\
             SMC Version:      2.1\n\
             SMC Hostname:     host1\n\
             SMC-D Features:   v1 v2\n\
             SMC-R Features:   v1 v2\n\
             \n\
             Hardware Capabilities\n\
             SEID:             SEID-1\n\
             ISM:              v1 v2\n\
             RoCE:             n/a\n"
        );
        let j: serde_json::Value = serde_json::from_str(&json(&info)).unwrap();
        assert_eq!(j["smc_version"], "2.1");
        assert_eq!(j["ism"], serde_json::json!(["v1", "v2"]));
        assert_eq!(j["roce"], serde_json::json!([]));
        assert_eq!(j["smcd_devices"], 1);
    }

    #[test]
    fn missing_fields_are_na() {
        let info = Info::build(&SysInfo::default(), &[], &[]);
        let t = info.text();
        assert!(t.contains("SMC Version:      n/a\n"));
        assert!(t.contains("SMC Hostname:     n/a\n"));
        assert!(t.contains("SMC-D Features:   v1\n"));
        assert!(t.contains("SEID:             n/a\n"));
        assert!(t.contains("ISM:              n/a\n"));
    }

    #[test]
    fn roce_generations() {
        let r1 = DevInfo {
            pci_device: Some(ROCE_EXPRESS),
            ..Default::default()
        };
        let r3 = DevInfo {
            pci_device: Some(ROCE_EXPRESS3),
            ..Default::default()
        };
        assert_eq!(
            Info::build(&sys(), &[], std::slice::from_ref(&r1)).roce,
            ["v1"]
        );
        assert_eq!(Info::build(&sys(), &[], &[r1, r3]).roce, ["v1", "v2"]);
    }
}
