//! Checks the crate's SMC netlink numbers against the installed `/usr/include/linux/smc.h`.
//!
//! Every `enum { .. }` in the header is parsed in declaration order (honouring `= N` and
//! `= NAME - 1` initializers) and every enumerator is looked up in the explicit table below,
//! so a renamed or renumbered constant fails here. The crate may know more enumerators than an
//! older header (newer kernels append to some enums); every one the header has must match.
//! The `__*_MAX` / `*_MAX` sentinels are skipped: they legitimately differ when the crate is
//! newer than the header. Without the header the test fails under `CI=true`; otherwise it says
//! why on stderr and passes.

mod common;

use std::collections::HashMap;

use smc_proto::netlink::smc::consts::*;

const HEADER: &str = "/usr/include/linux/smc.h";

/// Header name -> the crate's number for it.
fn table() -> HashMap<&'static str, i64> {
    macro_rules! t {
        ($($name:ident),* $(,)?) => {
            HashMap::from([$( (stringify!($name), i64::from($name)) ),*])
        };
    }
    t![
        SMC_PNETID_UNSPEC,
        SMC_PNETID_NAME,
        SMC_PNETID_ETHNAME,
        SMC_PNETID_IBNAME,
        SMC_PNETID_IBPORT,
        SMC_PNETID_GET,
        SMC_PNETID_ADD,
        SMC_PNETID_DEL,
        SMC_PNETID_FLUSH,
        SMC_NETLINK_GET_SYS_INFO,
        SMC_NETLINK_GET_LGR_SMCR,
        SMC_NETLINK_GET_LINK_SMCR,
        SMC_NETLINK_GET_LGR_SMCD,
        SMC_NETLINK_GET_DEV_SMCD,
        SMC_NETLINK_GET_DEV_SMCR,
        SMC_NETLINK_GET_STATS,
        SMC_NETLINK_GET_FBACK_STATS,
        SMC_NETLINK_DUMP_UEID,
        SMC_NETLINK_ADD_UEID,
        SMC_NETLINK_REMOVE_UEID,
        SMC_NETLINK_FLUSH_UEID,
        SMC_NETLINK_DUMP_SEID,
        SMC_NETLINK_ENABLE_SEID,
        SMC_NETLINK_DISABLE_SEID,
        SMC_NETLINK_DUMP_HS_LIMITATION,
        SMC_NETLINK_ENABLE_HS_LIMITATION,
        SMC_NETLINK_DISABLE_HS_LIMITATION,
        SMC_GEN_UNSPEC,
        SMC_GEN_SYS_INFO,
        SMC_GEN_LGR_SMCR,
        SMC_GEN_LINK_SMCR,
        SMC_GEN_LGR_SMCD,
        SMC_GEN_DEV_SMCD,
        SMC_GEN_DEV_SMCR,
        SMC_GEN_STATS,
        SMC_GEN_FBACK_STATS,
        SMC_NLA_SYS_UNSPEC,
        SMC_NLA_SYS_VER,
        SMC_NLA_SYS_REL,
        SMC_NLA_SYS_IS_ISM_V2,
        SMC_NLA_SYS_LOCAL_HOST,
        SMC_NLA_SYS_SEID,
        SMC_NLA_SYS_IS_SMCR_V2,
        SMC_NLA_LGR_V2_VER,
        SMC_NLA_LGR_V2_REL,
        SMC_NLA_LGR_V2_OS,
        SMC_NLA_LGR_V2_NEG_EID,
        SMC_NLA_LGR_V2_PEER_HOST,
        SMC_NLA_LGR_R_V2_UNSPEC,
        SMC_NLA_LGR_R_V2_DIRECT,
        SMC_NLA_LGR_R_V2_MAX_CONNS,
        SMC_NLA_LGR_R_V2_MAX_LINKS,
        SMC_NLA_LGR_R_UNSPEC,
        SMC_NLA_LGR_R_ID,
        SMC_NLA_LGR_R_ROLE,
        SMC_NLA_LGR_R_TYPE,
        SMC_NLA_LGR_R_PNETID,
        SMC_NLA_LGR_R_VLAN_ID,
        SMC_NLA_LGR_R_CONNS_NUM,
        SMC_NLA_LGR_R_V2_COMMON,
        SMC_NLA_LGR_R_V2,
        SMC_NLA_LGR_R_NET_COOKIE,
        SMC_NLA_LGR_R_PAD,
        SMC_NLA_LGR_R_BUF_TYPE,
        SMC_NLA_LGR_R_SNDBUF_ALLOC,
        SMC_NLA_LGR_R_RMB_ALLOC,
        SMC_NLA_LINK_UNSPEC,
        SMC_NLA_LINK_ID,
        SMC_NLA_LINK_IB_DEV,
        SMC_NLA_LINK_IB_PORT,
        SMC_NLA_LINK_GID,
        SMC_NLA_LINK_PEER_GID,
        SMC_NLA_LINK_CONN_CNT,
        SMC_NLA_LINK_NET_DEV,
        SMC_NLA_LINK_UID,
        SMC_NLA_LINK_PEER_UID,
        SMC_NLA_LINK_STATE,
        SMC_NLA_LGR_D_UNSPEC,
        SMC_NLA_LGR_D_ID,
        SMC_NLA_LGR_D_GID,
        SMC_NLA_LGR_D_PEER_GID,
        SMC_NLA_LGR_D_VLAN_ID,
        SMC_NLA_LGR_D_CONNS_NUM,
        SMC_NLA_LGR_D_PNETID,
        SMC_NLA_LGR_D_CHID,
        SMC_NLA_LGR_D_PAD,
        SMC_NLA_LGR_D_V2_COMMON,
        SMC_NLA_LGR_D_EXT_GID,
        SMC_NLA_LGR_D_PEER_EXT_GID,
        SMC_NLA_LGR_D_SNDBUF_ALLOC,
        SMC_NLA_LGR_D_DMB_ALLOC,
        SMC_NLA_DEV_PORT_UNSPEC,
        SMC_NLA_DEV_PORT_PNET_USR,
        SMC_NLA_DEV_PORT_PNETID,
        SMC_NLA_DEV_PORT_NETDEV,
        SMC_NLA_DEV_PORT_STATE,
        SMC_NLA_DEV_PORT_VALID,
        SMC_NLA_DEV_PORT_LNK_CNT,
        SMC_NLA_DEV_UNSPEC,
        SMC_NLA_DEV_USE_CNT,
        SMC_NLA_DEV_IS_CRIT,
        SMC_NLA_DEV_PCI_FID,
        SMC_NLA_DEV_PCI_CHID,
        SMC_NLA_DEV_PCI_VENDOR,
        SMC_NLA_DEV_PCI_DEVICE,
        SMC_NLA_DEV_PCI_ID,
        SMC_NLA_DEV_PORT,
        SMC_NLA_DEV_PORT2,
        SMC_NLA_DEV_IB_NAME,
        SMC_NLA_STATS_PLOAD_PAD,
        SMC_NLA_STATS_PLOAD_8K,
        SMC_NLA_STATS_PLOAD_16K,
        SMC_NLA_STATS_PLOAD_32K,
        SMC_NLA_STATS_PLOAD_64K,
        SMC_NLA_STATS_PLOAD_128K,
        SMC_NLA_STATS_PLOAD_256K,
        SMC_NLA_STATS_PLOAD_512K,
        SMC_NLA_STATS_PLOAD_1024K,
        SMC_NLA_STATS_PLOAD_G_1024K,
        SMC_NLA_STATS_RMB_PAD,
        SMC_NLA_STATS_RMB_SIZE_SM_PEER_CNT,
        SMC_NLA_STATS_RMB_SIZE_SM_CNT,
        SMC_NLA_STATS_RMB_FULL_PEER_CNT,
        SMC_NLA_STATS_RMB_FULL_CNT,
        SMC_NLA_STATS_RMB_REUSE_CNT,
        SMC_NLA_STATS_RMB_ALLOC_CNT,
        SMC_NLA_STATS_RMB_DGRADE_CNT,
        SMC_NLA_STATS_T_PAD,
        SMC_NLA_STATS_T_TX_RMB_SIZE,
        SMC_NLA_STATS_T_RX_RMB_SIZE,
        SMC_NLA_STATS_T_TXPLOAD_SIZE,
        SMC_NLA_STATS_T_RXPLOAD_SIZE,
        SMC_NLA_STATS_T_TX_RMB_STATS,
        SMC_NLA_STATS_T_RX_RMB_STATS,
        SMC_NLA_STATS_T_CLNT_V1_SUCC,
        SMC_NLA_STATS_T_CLNT_V2_SUCC,
        SMC_NLA_STATS_T_SRV_V1_SUCC,
        SMC_NLA_STATS_T_SRV_V2_SUCC,
        SMC_NLA_STATS_T_SENDPAGE_CNT,
        SMC_NLA_STATS_T_SPLICE_CNT,
        SMC_NLA_STATS_T_CORK_CNT,
        SMC_NLA_STATS_T_NDLY_CNT,
        SMC_NLA_STATS_T_URG_DATA_CNT,
        SMC_NLA_STATS_T_RX_BYTES,
        SMC_NLA_STATS_T_TX_BYTES,
        SMC_NLA_STATS_T_RX_CNT,
        SMC_NLA_STATS_T_TX_CNT,
        SMC_NLA_STATS_T_RX_RMB_USAGE,
        SMC_NLA_STATS_T_TX_RMB_USAGE,
        SMC_NLA_STATS_PAD,
        SMC_NLA_STATS_SMCD_TECH,
        SMC_NLA_STATS_SMCR_TECH,
        SMC_NLA_STATS_CLNT_HS_ERR_CNT,
        SMC_NLA_STATS_SRV_HS_ERR_CNT,
        SMC_NLA_FBACK_STATS_PAD,
        SMC_NLA_FBACK_STATS_TYPE,
        SMC_NLA_FBACK_STATS_SRV_CNT,
        SMC_NLA_FBACK_STATS_CLNT_CNT,
        SMC_NLA_FBACK_STATS_RSN_CODE,
        SMC_NLA_FBACK_STATS_RSN_CNT,
        SMC_NLA_EID_TABLE_UNSPEC,
        SMC_NLA_EID_TABLE_ENTRY,
        SMC_NLA_SEID_UNSPEC,
        SMC_NLA_SEID_ENTRY,
        SMC_NLA_SEID_ENABLED,
        SMC_NLA_HS_LIMITATION_UNSPEC,
        SMC_NLA_HS_LIMITATION_ENABLED,
    ]
}

/// One enumerator as declared.
#[derive(Debug)]
struct Enumerator {
    name: String,
    value: i64,
}

/// Strips `/* .. */` and `// ..` comments.
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    loop {
        let block = rest.find("/*");
        let line = rest.find("//");
        match (block, line) {
            (Some(b), l) if l.is_none_or(|l| b < l) => {
                out.push_str(&rest[..b]);
                match rest[b + 2..].find("*/") {
                    Some(e) => rest = &rest[b + 2 + e + 2..],
                    None => return out,
                }
            }
            (_, Some(l)) => {
                out.push_str(&rest[..l]);
                match rest[l..].find('\n') {
                    Some(e) => rest = &rest[l + e..],
                    None => return out,
                }
            }
            _ => {
                out.push_str(rest);
                return out;
            }
        }
    }
}

/// Evaluates an initializer: a number, a known name, or `NAME +/- number`.
fn eval(expr: &str, known: &HashMap<String, i64>) -> Option<i64> {
    let expr = expr.trim();
    let num = |s: &str| -> Option<i64> {
        let s = s.trim();
        if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
            i64::from_str_radix(h, 16).ok()
        } else {
            s.parse().ok()
        }
    };
    if let Some(v) = num(expr) {
        return Some(v);
    }
    for op in ['-', '+'] {
        if let Some((l, r)) = expr.split_once(op) {
            let base = known.get(l.trim()).copied().or_else(|| num(l))?;
            let off = num(r)?;
            return Some(if op == '-' { base - off } else { base + off });
        }
    }
    known.get(expr).copied()
}

/// Parses every `enum { .. }` body, in order.
fn parse_enums(src: &str) -> Vec<Vec<Enumerator>> {
    let src = strip_comments(src);
    let mut enums = Vec::new();
    let mut rest = src.as_str();
    while let Some(pos) = rest.find("enum") {
        rest = &rest[pos + 4..];
        let Some(open) = rest.find('{') else { break };
        // `enum name {` or `enum {`: only whitespace or an identifier in between.
        if !rest[..open]
            .trim()
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            continue;
        }
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        let body = &rest[open + 1..open + close];
        rest = &rest[open + close + 1..];
        let mut known = HashMap::new();
        let mut next = 0i64;
        let mut list = Vec::new();
        for item in body.split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let (name, value) = match item.split_once('=') {
                Some((n, e)) => (
                    n.trim(),
                    eval(e, &known).unwrap_or_else(|| panic!("cannot evaluate {item:?}")),
                ),
                None => (item, next),
            };
            known.insert(name.to_owned(), value);
            next = value + 1;
            list.push(Enumerator {
                name: name.to_owned(),
                value,
            });
        }
        enums.push(list);
    }
    enums
}

fn is_sentinel(name: &str) -> bool {
    name.starts_with("__") || name.ends_with("_MAX")
}

#[test]
fn installed_header_matches_crate_numbers() {
    let src = match std::fs::read_to_string(HEADER) {
        Ok(s) => s,
        Err(e) => {
            common::skip(
                "installed_header_matches_crate_numbers",
                format_args!(
                    "cannot read {HEADER}: {e} (install the Linux uapi headers, linux-libc-dev, to run this check)"
                ),
            );
            return;
        }
    };
    let enums = parse_enums(&src);
    assert!(
        enums.len() >= 10,
        "found only {} enums in {HEADER}; the parser or the header is off",
        enums.len()
    );
    let table = table();
    let mut checked = 0;
    let mut problems = Vec::new();
    for e in enums.iter().flatten() {
        if is_sentinel(&e.name) {
            continue;
        }
        match table.get(e.name.as_str()) {
            None => problems.push(format!(
                "{} = {} is not in the crate's table",
                e.name, e.value
            )),
            Some(&v) if v != e.value => problems.push(format!(
                "{}: header says {}, crate says {v}",
                e.name, e.value
            )),
            Some(_) => checked += 1,
        }
    }
    assert!(problems.is_empty(), "mismatches:\n{}", problems.join("\n"));
    eprintln!("checked {checked} enumerators of {HEADER}");
}

#[test]
fn parser_understands_initializers() {
    let src = "/* x */ enum { A = 1, B, /* c */ C, // d\n __M, M = __M - 1 };\nenum named { Z, Y = 0x10 };";
    let e = parse_enums(src);
    assert_eq!(e.len(), 2);
    let v: Vec<_> = e[0].iter().map(|x| (x.name.as_str(), x.value)).collect();
    assert_eq!(v, [("A", 1), ("B", 2), ("C", 3), ("__M", 4), ("M", 3)]);
    assert_eq!(e[1][1].value, 16);
}

#[test]
fn crate_table_is_complete_for_newest_kernel() {
    // Spot checks of the quirks the header makes easy to get wrong.
    assert_eq!(SMC_NLA_LGR_V2_VER, 0);
    assert_eq!(SMC_NLA_LGR_V2_PEER_HOST, 4);
    assert_eq!(SMC_NLA_LGR_D_DMB_ALLOC, 13);
    assert_eq!(SMC_NLA_LGR_R_RMB_ALLOC, 13);
    assert_eq!(SMC_NLA_STATS_T_TX_RMB_USAGE, 21);
    assert_eq!(SMC_NETLINK_DISABLE_HS_LIMITATION, 18);
    assert_eq!(table().len(), 167);
}
