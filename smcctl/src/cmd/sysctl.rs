//! `smcctl sysctl`: the per-namespace knobs the kernel keeps under `/proc/sys/net/smc`,
//! served by smcd's `SMCD_ENGINE` family (`SYSCTL_LIST`, `SYSCTL_GET`, `SYSCTL_SET`).

use serde::Serialize;
use smc_proto::netlink::engine::{
    ENGINE_SYSCTL_F_READONLY, EngineCmd, EngineMessage, SysctlInfo, SysctlType, SysctlValue,
};

use crate::client::Failure;
use crate::error::{self, Error};
use crate::fmt::{Align, json, table};
use crate::session::Session;

/// One knob (`--json` element; `sysctl get`/`set` print one of these).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Knob {
    /// Name under `/proc/sys/net/smc`.
    pub name: String,
    /// `int`, `uint`, `string`, `seconds`, or `type N`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Current value: a number, or a string for string knobs.
    pub value: Value,
    /// Default.
    pub default: Option<Value>,
    /// Smallest accepted value.
    pub min: Option<u64>,
    /// Largest accepted value.
    pub max: Option<u64>,
    /// Unit (`bytes`, `seconds`, ..).
    pub unit: Option<String>,
    /// One line.
    pub description: Option<String>,
    /// Not settable.
    pub read_only: bool,
    /// The network namespace (inode of its netns file) the value belongs to.
    pub netns_inode: Option<u64>,
}

/// A sysctl value in JSON: a number or a string.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Value {
    /// Numeric knobs.
    Num(u64),
    /// String knobs.
    Str(String),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Num(n) => write!(f, "{n}"),
            Value::Str(s) => f.write_str(s),
        }
    }
}

fn value(v: &SysctlValue) -> Value {
    match v {
        SysctlValue::Num(n) => Value::Num(*n),
        SysctlValue::Str(s) => Value::Str(s.clone()),
    }
}

fn type_name(t: Option<SysctlType>) -> String {
    match t {
        Some(SysctlType::Int) | None => "int".to_owned(),
        Some(SysctlType::Uint) => "uint".to_owned(),
        Some(SysctlType::Str) => "string".to_owned(),
        Some(SysctlType::Seconds) => "seconds".to_owned(),
        Some(SysctlType::Unknown(x)) => format!("type {x}"),
    }
}

impl Knob {
    /// From a reply.
    pub fn from(info: &SysctlInfo, netns_inode: Option<u64>) -> Self {
        Knob {
            name: info.name.clone(),
            kind: type_name(info.kind),
            value: info.value.as_ref().map_or(Value::Str(String::new()), value),
            default: info.default.as_ref().map(value),
            min: info.min,
            max: info.max,
            unit: info.unit.clone().filter(|u| !u.is_empty()),
            description: info.description.clone().filter(|d| !d.is_empty()),
            read_only: info.flags.unwrap_or(0) & ENGINE_SYSCTL_F_READONLY != 0,
            netns_inode,
        }
    }

    fn range(&self) -> String {
        match (self.min, self.max) {
            (Some(a), Some(b)) => format!("{a}..{b}"),
            (Some(a), None) => format!("{a}.."),
            (None, Some(b)) => format!("..{b}"),
            (None, None) => String::new(),
        }
    }
}

/// `--json` of `sysctl show`.
#[derive(Debug, Clone, Serialize)]
pub struct Knobs {
    /// The namespace (inode), from the replies.
    pub netns_inode: Option<u64>,
    /// Every knob, in smcd's order.
    pub sysctls: Vec<Knob>,
}

/// The `sysctl show` table (`-d` adds the description).
pub fn list_text(knobs: &[Knob], details: u8) -> String {
    let mut cols = vec![
        ("Name", Align::Left),
        ("Value", Align::Right),
        ("Default", Align::Right),
        ("Range", Align::Left),
        ("Unit", Align::Left),
    ];
    if details > 0 {
        cols.push(("Description", Align::Left));
    }
    let rows: Vec<Vec<String>> = knobs
        .iter()
        .map(|k| {
            let mut r = vec![
                if k.read_only {
                    format!("{} (ro)", k.name)
                } else {
                    k.name.clone()
                },
                k.value.to_string(),
                k.default
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                k.range(),
                k.unit.clone().unwrap_or_default(),
            ];
            if details > 0 {
                r.push(k.description.clone().unwrap_or_default());
            }
            r
        })
        .collect();
    table(&cols, &rows)
}

/// `net.smc.wmem` and `wmem` name the same knob.
fn knob_name(key: &str) -> &str {
    key.strip_prefix("net.smc.")
        .or_else(|| key.strip_prefix("net/smc/"))
        .unwrap_or(key)
}

/// Runs `sysctl show`.
pub fn show(s: &mut Session) -> Result<String, Error> {
    let sel = s.selector();
    let replies = s
        .engine_dump(EngineMessage::sysctl_list(sel.as_ref()))
        .map_err(|f| s.refused("SMCD_ENGINE SYSCTL_LIST", f))?;
    let netns_inode = replies.iter().find_map(EngineMessage::netns_inode);
    let knobs: Vec<Knob> = replies
        .iter()
        .filter_map(|m| m.sysctl().map(|i| Knob::from(&i, m.netns_inode())))
        .collect();
    Ok(if s.json {
        json(&Knobs {
            netns_inode,
            sysctls: knobs,
        })
    } else {
        list_text(&knobs, s.details)
    })
}

fn get_knob(s: &mut Session, name: &str) -> Result<Knob, Error> {
    let sel = s.selector();
    let replies = s
        .engine_query(EngineMessage::sysctl_get(sel.as_ref(), name))
        .map_err(|f| match f {
            Failure::Errno(error::ENOENT) => no_such_knob(s, name),
            f => s.refused("SMCD_ENGINE SYSCTL_GET", f),
        })?;
    replies
        .iter()
        .find_map(|m| m.sysctl().map(|i| Knob::from(&i, m.netns_inode())))
        .ok_or_else(|| {
            Error::failed(format!(
                "{} answered SYSCTL_GET {name} without the sysctl",
                s.endpoint()
            ))
        })
}

/// `ENOENT` for a knob: an unknown name, or (with `--netns`) a namespace smcd cannot find.
/// Listing the namespace's knobs tells which.
fn no_such_knob(s: &mut Session, name: &str) -> Error {
    if s.netns.is_some() {
        let sel = s.selector();
        if let Err(f) = s.engine_dump(EngineMessage::sysctl_list(sel.as_ref())) {
            return s.refused("SMCD_ENGINE SYSCTL_LIST", f);
        }
    }
    Error::failed(format!(
        "no sysctl named \"{name}\" (`smcctl sysctl show` lists them)"
    ))
}

/// `name = value`, as sysctl(8) prints.
fn one_line(k: &Knob) -> String {
    format!("{} = {}\n", k.name, k.value)
}

/// Runs `sysctl get KEY`.
pub fn get(s: &mut Session, key: &str) -> Result<String, Error> {
    let k = get_knob(s, knob_name(key))?;
    Ok(if s.json { json(&k) } else { one_line(&k) })
}

/// What to say when smcd refuses a value (`EINVAL`, old value kept).
pub fn invalid_value(k: &Knob, given: &str) -> Error {
    let range = k.range();
    let unit = k
        .unit
        .as_deref()
        .map(|u| format!(" {u}"))
        .unwrap_or_default();
    let allowed = if range.is_empty() {
        String::new()
    } else {
        format!("; allowed range {range}{unit}")
    };
    Error::failed(format!(
        "sysctl {}: value {given} was refused (EINVAL){allowed}; the value stays {}",
        k.name, k.value
    ))
}

/// Runs `sysctl set KEY=VALUE`: reads the knob first (its type decides how the value is
/// sent and its range words the refusal), then sets it and prints what it now is.
pub fn set(s: &mut Session, assignment: &str) -> Result<String, Error> {
    let Some((key, val)) = assignment.split_once('=') else {
        return Err(Error::usage(format!(
            "sysctl set takes KEY=VALUE, got \"{assignment}\""
        )));
    };
    let (key, val) = (knob_name(key.trim()), val.trim());
    if key.is_empty() {
        return Err(Error::usage("sysctl set: the KEY of KEY=VALUE is empty"));
    }
    let before = get_knob(s, key)?;
    if before.read_only {
        return Err(Error::failed(format!("sysctl {key} is read-only")));
    }
    let new = match (&before.value, before.kind.as_str()) {
        (Value::Str(_), _) | (_, "string") => SysctlValue::Str(val.to_owned()),
        _ => match parse_number(val) {
            Some(n) => SysctlValue::Num(n),
            None => {
                let range = before.range();
                return Err(Error::usage(format!(
                    "sysctl {key} takes a number{}, got \"{val}\"",
                    if range.is_empty() {
                        String::new()
                    } else {
                        format!(" ({range})")
                    }
                )));
            }
        },
    };
    let sel = s.selector();
    let replies = s
        .engine_query(EngineMessage::sysctl_set(sel.as_ref(), key, new))
        .map_err(|f| match f {
            Failure::Errno(error::EINVAL) | Failure::Errno(error::ERANGE) => {
                invalid_value(&before, val)
            }
            Failure::Errno(error::ENOENT) => no_such_knob(s, key),
            f => s.refused("SMCD_ENGINE SYSCTL_SET", f),
        })?;
    let after = replies
        .iter()
        .find(|m| m.cmd == EngineCmd::SysctlSet || m.sysctl().is_some())
        .and_then(|m| m.sysctl().map(|i| Knob::from(&i, m.netns_inode())));
    let after = match after {
        Some(k) => k,
        None => get_knob(s, key)?,
    };
    Ok(if s.json {
        json(&after)
    } else {
        one_line(&after)
    })
}

/// Decimal, or hexadecimal with `0x`.
fn parse_number(s: &str) -> Option<u64> {
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::testutil::roundtrip_engine;

    fn wmem(value: u64) -> SysctlInfo {
        SysctlInfo {
            name: "wmem".into(),
            kind: Some(SysctlType::Int),
            value: Some(SysctlValue::Num(value)),
            min: Some(16384),
            max: Some(1_073_741_823),
            default: Some(SysctlValue::Num(65536)),
            description: Some("send buffer size of new connections".into()),
            unit: Some("bytes".into()),
            flags: Some(0),
            other: Vec::new(),
        }
    }

    fn hs_ctrl() -> SysctlInfo {
        SysctlInfo {
            name: "hs_ctrl".into(),
            kind: Some(SysctlType::Str),
            value: Some(SysctlValue::Str(String::new())),
            default: Some(SysctlValue::Str(String::new())),
            ..Default::default()
        }
    }

    fn wire(i: &SysctlInfo) -> Knob {
        let m = roundtrip_engine(EngineMessage::sysctl_reply(
            EngineCmd::SysctlList,
            4026531840,
            i,
        ));
        Knob::from(&m.sysctl().unwrap(), m.netns_inode())
    }

    #[test]
    fn table_and_json() {
        let knobs = [wire(&wmem(131072)), wire(&hs_ctrl())];
        assert_eq!(
            list_text(&knobs, 0),
            "Name      Value  Default  Range              Unit\n\
             wmem     131072    65536  16384..1073741823  bytes\n\
             hs_ctrl\n"
        );
        assert!(list_text(&knobs, 1).contains("send buffer size of new connections"));
        let j: serde_json::Value = serde_json::from_str(&json(&Knobs {
            netns_inode: Some(4026531840),
            sysctls: knobs.to_vec(),
        }))
        .unwrap();
        assert_eq!(j["sysctls"][0]["value"], 131072);
        assert_eq!(j["sysctls"][0]["min"], 16384);
        assert_eq!(j["sysctls"][0]["type"], "int");
        assert_eq!(j["sysctls"][1]["value"], "");
        assert_eq!(j["sysctls"][1]["type"], "string");
        assert_eq!(j["netns_inode"], 4026531840u64);
    }

    #[test]
    fn einval_names_the_range() {
        let e = invalid_value(&wire(&wmem(65536)), "5");
        assert_eq!(
            e.message,
            "sysctl wmem: value 5 was refused (EINVAL); allowed range 16384..1073741823 bytes; \
             the value stays 65536"
        );
        assert_eq!(e.code, 1);
    }

    #[test]
    fn names_and_numbers() {
        assert_eq!(knob_name("net.smc.wmem"), "wmem");
        assert_eq!(knob_name("wmem"), "wmem");
        assert_eq!(parse_number("0x10"), Some(16));
        assert_eq!(parse_number("12"), Some(12));
        assert_eq!(parse_number("-1"), None);
        assert_eq!(one_line(&wire(&wmem(1))), "wmem = 1\n");
    }
}
