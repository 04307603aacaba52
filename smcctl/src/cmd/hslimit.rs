//! `smcctl hs-limit`: the handshake limitation flag (`DUMP_`, `ENABLE_`,
//! `DISABLE_HS_LIMITATION`; the kernel's per-namespace `limit_smc_hs`).

use serde::Serialize;
use smc_proto::netlink::smc::{SmcCmd, SmcGenlMessage};

use crate::error::Error;
use crate::fmt::json;
use crate::session::{Session, smc_op_name};

/// `--json` of every `hs-limit` verb: the state (after the change, for enable/disable).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct HsLimit {
    /// Whether new SMC listeners limit handshakes (fall back to TCP when congested).
    pub enabled: bool,
}

/// `hs-limit show` text.
pub fn text(h: &HsLimit) -> String {
    format!(
        "Handshake limitation: {}\n",
        if h.enabled { "enabled" } else { "disabled" }
    )
}

fn current(s: &mut Session) -> Result<HsLimit, Error> {
    let enabled = s
        .gen_dump(SmcCmd::DumpHsLimitation)?
        .iter()
        .find_map(|m| m.hs_limitation())
        .unwrap_or(false);
    Ok(HsLimit { enabled })
}

/// Runs `hs-limit show`.
pub fn show(s: &mut Session) -> Result<String, Error> {
    let h = current(s)?;
    Ok(if s.json { json(&h) } else { text(&h) })
}

/// Runs `hs-limit enable|disable`; prints nothing (text) or the new state (JSON).
pub fn set(s: &mut Session, enable: bool) -> Result<String, Error> {
    let cmd = if enable {
        SmcCmd::EnableHsLimitation
    } else {
        SmcCmd::DisableHsLimitation
    };
    let op = smc_op_name(cmd);
    s.gen_execute(SmcGenlMessage::request(cmd))
        .map_err(|f| s.refused(op, f))?;
    Ok(if s.json {
        json(&HsLimit { enabled: enable })
    } else {
        String::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::testutil::roundtrip_smc;

    #[test]
    fn show_forms() {
        let on = roundtrip_smc(SmcGenlMessage::hs_limitation_reply(true))
            .hs_limitation()
            .unwrap();
        assert_eq!(
            text(&HsLimit { enabled: on }),
            "Handshake limitation: enabled\n"
        );
        assert_eq!(
            text(&HsLimit { enabled: false }),
            "Handshake limitation: disabled\n"
        );
        assert_eq!(
            json(&HsLimit { enabled: true }),
            "{\n  \"enabled\": true\n}\n"
        );
    }
}
