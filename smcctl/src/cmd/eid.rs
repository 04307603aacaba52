//! `smcctl ueid` and `smcctl seid`: smc-tools' `ueid.c` and `seid.c` over `DUMP_UEID`,
//! `ADD_UEID`, `REMOVE_UEID`, `FLUSH_UEID`, `DUMP_SEID`, `ENABLE_SEID`, `DISABLE_SEID`.

use serde::Serialize;
use smc_proto::netlink::smc::consts::SMC_MAX_UEID;
use smc_proto::netlink::smc::{SeidInfo, SmcCmd, SmcGenlMessage, Ueid, UeidError};

use crate::client::Failure;
use crate::error::{self, Error};
use crate::fmt::json;
use crate::session::{Session, smc_op_name};

/// `--json` of `ueid show`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Ueids {
    /// The user EIDs, without their blank padding.
    pub ueids: Vec<String>,
}

/// `--json` of a command that changes state and prints nothing on success.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Done {
    /// Always true (a failure exits 1 with a message instead).
    pub ok: bool,
    /// What was done (`ueid add`).
    pub command: String,
    /// The EID it was done to, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eid: Option<String>,
    /// A note smcd or the kernel gave with the success (EAGAIN on `ueid del`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// `--json` of `seid show`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Seid {
    /// The system EID, `null` when the system has none (not ISMv2 capable).
    pub seid: Option<String>,
    /// Whether it is used in CLC proposals.
    pub enabled: bool,
}

/// `seid show` text: `SEID [enabled]`, or `n/a`.
pub fn seid_text(s: &Seid) -> String {
    match &s.seid {
        Some(id) => format!(
            "{} [{}]\n",
            id,
            if s.enabled { "enabled" } else { "disabled" }
        ),
        None => "n/a\n".to_owned(),
    }
}

/// Validates a user EID as smc-tools does: the kernel's rules plus no `..`.
pub fn parse_ueid(s: &str) -> Result<Ueid, Error> {
    let bad = |why: String| Error::usage(format!("invalid User EID \"{s}\": {why}"));
    if s.contains("..") {
        return Err(bad("consecutive dots are not allowed".into()));
    }
    Ueid::new(s).map_err(|e| match e {
        UeidError::BadChar { ch, .. } => bad(format!(
            "unsupported character '{}'; supported are A-Z, 0-9, '.' and '-'",
            ch.escape_default()
        )),
        e => bad(e.to_string()),
    })
}

fn done(s: &Session, eid: Option<&Ueid>, note: Option<String>) -> String {
    if s.json {
        json(&Done {
            ok: true,
            command: s.command.clone(),
            eid: eid.map(|e| e.as_str().to_owned()),
            note,
        })
    } else {
        match note {
            Some(n) => format!("{n}\n"),
            None => String::new(),
        }
    }
}

/// Runs `ueid show`.
pub fn ueid_show(s: &mut Session) -> Result<String, Error> {
    let ueids: Vec<String> = s
        .gen_dump(SmcCmd::DumpUeid)?
        .iter()
        .filter_map(|m| m.eid_entry().map(|e| e.trim_end().to_owned()))
        .collect();
    Ok(if s.json {
        json(&Ueids { ueids })
    } else {
        ueids.iter().map(|u| format!("{u}\n")).collect()
    })
}

/// Runs `ueid add`.
pub fn ueid_add(s: &mut Session, eid: &str) -> Result<String, Error> {
    let u = parse_ueid(eid)?;
    let op = smc_op_name(SmcCmd::AddUeid);
    s.gen_execute(SmcGenlMessage::add_ueid(&u))
        .map_err(|f| match f {
            Failure::Errno(error::EEXIST) => {
                Error::failed(format!("User EID {} is already defined", u.as_str()))
            }
            Failure::Errno(error::ERANGE) => Error::failed(format!(
                "User EID {} was refused: the maximum of {SMC_MAX_UEID} User EIDs is reached",
                u.as_str()
            )),
            Failure::Errno(error::EINVAL) => Error::failed(format!(
                "User EID {} was rejected by {} (EINVAL)",
                u.as_str(),
                s.endpoint()
            )),
            f => s.refused(op, f),
        })?;
    Ok(done(s, Some(&u), None))
}

/// Runs `ueid del`.
pub fn ueid_del(s: &mut Session, eid: &str) -> Result<String, Error> {
    let u = parse_ueid(eid)?;
    let op = smc_op_name(SmcCmd::RemoveUeid);
    match s.gen_execute(SmcGenlMessage::remove_ueid(&u)) {
        Ok(()) => Ok(done(s, Some(&u), None)),
        // s390: removing the last user EID re-enables the system EID and says so.
        Err(Failure::Errno(error::EAGAIN)) => Ok(done(
            s,
            Some(&u),
            Some("the System EID was activated because the last User EID was removed".into()),
        )),
        Err(Failure::Errno(error::ENOENT)) => Err(Error::failed(format!(
            "User EID {} is not defined",
            u.as_str()
        ))),
        Err(f) => Err(s.refused(op, f)),
    }
}

/// Runs `ueid flush`.
pub fn ueid_flush(s: &mut Session) -> Result<String, Error> {
    let op = smc_op_name(SmcCmd::FlushUeid);
    s.gen_execute(SmcGenlMessage::request(SmcCmd::FlushUeid))
        .map_err(|f| s.refused(op, f))?;
    Ok(done(s, None, None))
}

fn seid_info(s: &mut Session) -> Result<Option<SeidInfo>, Error> {
    Ok(s.gen_dump(SmcCmd::DumpSeid)?.iter().find_map(|m| m.seid()))
}

/// Runs `seid show`.
pub fn seid_show(s: &mut Session) -> Result<String, Error> {
    let info = seid_info(s)?;
    let v = Seid {
        seid: info.as_ref().map(|i| i.seid.trim_end().to_owned()),
        enabled: info.is_some_and(|i| i.enabled),
    };
    Ok(if s.json { json(&v) } else { seid_text(&v) })
}

/// Runs `seid enable` / `seid disable`.
pub fn seid_set(s: &mut Session, enable: bool) -> Result<String, Error> {
    if seid_info(s)?.is_none() {
        return Err(Error::failed(format!(
            "System EID not available ({} reports none)",
            s.endpoint()
        )));
    }
    let cmd = if enable {
        SmcCmd::EnableSeid
    } else {
        SmcCmd::DisableSeid
    };
    let op = smc_op_name(cmd);
    s.gen_execute(SmcGenlMessage::request(cmd))
        .map_err(|f| match f {
            Failure::Errno(error::ENOENT) if !enable => Error::failed(
                "System EID cannot be disabled because no User EID is defined \
                 (add one with `smcctl ueid add`)",
            ),
            f => s.refused(op, f),
        })?;
    Ok(done(s, None, None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::testutil::roundtrip_smc;

    #[test]
    fn ueid_validation() {
        assert_eq!(parse_ueid("SMC-EID.1").unwrap().as_str(), "SMC-EID.1");
        for bad in ["", "lower", "-X", "A..B", "A B", &"A".repeat(33)] {
            let e = parse_ueid(bad).unwrap_err();
            assert_eq!(e.code, 2, "{bad}");
            assert!(e.message.starts_with("invalid User EID"), "{}", e.message);
        }
        assert!(
            parse_ueid("A..B")
                .unwrap_err()
                .message
                .contains("consecutive dots")
        );
        assert!(parse_ueid("Ab").unwrap_err().message.contains("'b'"));
    }

    #[test]
    fn ueid_entries_round_trip() {
        let u = parse_ueid("ABC").unwrap();
        let m = roundtrip_smc(SmcGenlMessage::ueid_reply(&u));
        assert_eq!(m.eid_entry().unwrap().trim_end(), "ABC");
        let add = roundtrip_smc(SmcGenlMessage::add_ueid(&u));
        assert_eq!(add.ueid().unwrap().unwrap(), u);
    }

    #[test]
    fn seid_forms() {
        let m = roundtrip_smc(SmcGenlMessage::seid_reply(Some(&SeidInfo {
            seid: "SEID-1".into(),
            enabled: true,
        })));
        let i = m.seid().unwrap();
        let v = Seid {
            seid: Some(i.seid),
            enabled: i.enabled,
        };
        assert_eq!(seid_text(&v), "SEID-1 [enabled]\n");
        let j: serde_json::Value = serde_json::from_str(&json(&v)).unwrap();
        assert_eq!(j["seid"], "SEID-1");
        assert_eq!(j["enabled"], true);
        let none = roundtrip_smc(SmcGenlMessage::seid_reply(None));
        assert!(none.seid().is_none());
        assert_eq!(
            seid_text(&Seid {
                seid: None,
                enabled: false
            }),
            "n/a\n"
        );
    }
}
