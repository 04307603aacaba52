//! smcctl against a live `smcd` with real SMC-D connections open (so link groups, sockets
//! and counters are non-empty), table and JSON side by side, and in two network namespaces
//! for the per-namespace commands.
//!
//! Tests that need root (setns, admin commands, `ip netns`) or a tool (`ip`, `setpriv`) fail
//! without it under `CI=true`, and print `SKIPPED ...` otherwise.

mod common;

use common::{BINS, Conns, Netns, Smcd, skip_unless_root, skip_unless_tool, wait_for};
use serde_json::Value;

#[test]
#[ignore = "child process entry, started by the tests"]
fn child_entry() {
    common::child_main();
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The value after a `label` in the stats text (`  SMC connections   7 ...`).
fn stat_line(text: &str, label: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no {label} in\n{text}"));
    line.trim_start()[label.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number in {line}"))
}

#[test]
fn info_device_and_linkgroups() {
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    let _c = Conns::open(&smcd, None, 2, 0, 4096);

    let info = smcd.ctl("info");
    let t = info.ok();
    assert!(
        t.starts_with("Kernel Capabilities\nSMC Version:      "),
        "{t}"
    );
    for label in [
        "SMC Hostname:",
        "SMC-D Features:   v1",
        "SEID:",
        "ISM:",
        "RoCE:",
    ] {
        assert!(t.contains(label), "{label}: {t}");
    }
    let j = smcd.ctl("--json info").json();
    assert!(
        j["smcd_features"]
            .as_array()
            .unwrap()
            .contains(&"v1".into())
    );
    let version = j["smc_version"].as_str().unwrap_or("n/a").to_owned();
    assert!(t.contains(&format!("SMC Version:      {version}\n")));

    let dev = smcd.ctl("device");
    assert!(dev.ok().starts_with("FID   Type"), "{dev:#?}");
    let jd = smcd.ctl("--json device").json();
    assert_eq!(jd["type"], "smcd");
    let rows = dev.stdout.lines().count() - 1;
    assert_eq!(rows, jd["devices"].as_array().unwrap().len());

    // Link groups: the two connections live in at least one link group.
    let j = wait_for("link groups", || {
        let j = smcd.ctl("--json linkgroup").json();
        let total: u64 = j["linkgroups"]
            .as_array()?
            .iter()
            .map(|l| u(&l["conns"]))
            .sum();
        (total >= 2).then_some(j)
    });
    let table = smcd.ctl("linkgroup show");
    let t = table.ok();
    assert!(t.starts_with("LG-ID     VLAN  #Conns  PNET-ID\n"), "{t}");
    for l in j["linkgroups"].as_array().unwrap() {
        let id = format!("{:08x}", u(&l["id"]));
        let row = t
            .lines()
            .find(|r| r.starts_with(&id))
            .unwrap_or_else(|| panic!("{id} missing from\n{t}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cols[1],
            if u(&l["vlan_id"]) == 0 {
                "0".to_owned()
            } else {
                format!("{:#x}", u(&l["vlan_id"]))
            }
        );
        assert_eq!(cols[2], u(&l["conns"]).to_string(), "{row}");
        // One link group by id, abbreviated object and verb.
        let one = smcd.ctl(&format!("l s {id}"));
        assert_eq!(one.ok().lines().count(), 2, "{one:#?}");
    }
    let d = smcd.ctl("linkgroup show -d");
    let t = d.ok();
    assert!(
        t.contains("LG-ID    : ") && t.contains("#Conns   : ") && t.contains("DMB      : "),
        "{t}"
    );
    let dd = smcd.ctl("-dd linkgroup");
    assert!(dd.ok().contains("Peer-GID : "), "{dd:#?}");
    // smcd has no SMC-R: empty tables, not errors.
    assert_eq!(smcd.ctl("linkgroup --smcr").ok().lines().count(), 1);
    assert_eq!(
        smcd.ctl("--json device --smcr").json()["ports"],
        Value::Array(vec![])
    );
}

#[test]
fn stats_with_connections_and_fallbacks() {
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    let bytes = 100_000usize;
    let _c = Conns::open(&smcd, None, 2, 1, bytes);
    let j = wait_for("counters", || {
        let j = smcd.ctl("--json stats").json();
        (u(&j["connections"]["smc"]["total"]) >= 4 && u(&j["fallback"]["total"]) >= 1).then_some(j)
    });
    assert_eq!(j["technology"], "smcd");
    assert!(u(&j["connections"]["smc"]["client"]) >= 2);
    assert!(u(&j["connections"]["smc"]["server"]) >= 2);
    assert!(u(&j["rx"]["bytes"]) >= 4 * bytes as u64, "{j}");
    assert!(u(&j["tx"]["bytes"]) >= 4 * bytes as u64, "{j}");
    let reasons = j["fallback"]["server_reasons"].as_array().unwrap();
    assert!(
        reasons
            .iter()
            .any(|r| r["name"] == "PEER_NO_SMC" && u(&r["count"]) >= 1),
        "{j}"
    );

    let t = smcd.ctl("stats").ok().to_owned();
    assert!(t.starts_with("SMC-D Connections Summary\n"), "{t}");
    assert_eq!(
        stat_line(&t, "SMC connections"),
        u(&j["connections"]["smc"]["total"])
    );
    assert_eq!(stat_line(&t, "TCP fallback"), u(&j["fallback"]["total"]));
    assert_eq!(
        stat_line(&t, "Total connections handled"),
        u(&j["connections"]["total_handled"])
    );
    assert!(t.contains("    Server\n     PEER_NO_SMC"), "{t}");
    for section in [
        "RX Stats\n",
        "TX Stats\n",
        "Extras\n",
        ">512KB\n",
        "  Bufs ",
        "  Reqs ",
    ] {
        assert!(t.contains(section), "{section}: {t}");
    }
    // This smcd runs without the option program: every SMC connection was decided by
    // smcd's intents, none by the option.
    let p = &j["capability_path"];
    assert!(u(&p["intents"]["client"]) >= 2, "{j}");
    assert!(u(&p["intents"]["server"]) >= 2, "{j}");
    assert_eq!(u(&p["option"]["total"]), 0, "{j}");
    let d = smcd.ctl("stats -d");
    assert!(d.ok().contains("(client "), "{d:#?}");
    assert!(
        d.stdout.contains("Capability Path\n  TCP option "),
        "{d:#?}"
    );
    assert!(stat_line(&d.stdout, "Intents") >= 4, "{d:#?}");
    assert!(d.stdout.contains("    v2 "));
    // -a is accepted (smc-tools compatibility) and shows the same.
    assert_eq!(
        stat_line(smcd.ctl("stats -a").ok(), "SMC connections"),
        u(&j["connections"]["smc"]["total"])
    );

    // reset shows the values, then clears them (per namespace, in smcd; an admin command).
    if skip_unless_root("stats_with_connections_and_fallbacks (reset)") {
        return;
    }
    let r = smcd.ctl("stats reset");
    assert!(stat_line(r.ok(), "SMC connections") >= 4);
    let after = smcd.ctl("--json stats").json();
    assert_eq!(u(&after["connections"]["smc"]["total"]), 0, "{after}");
    assert_eq!(u(&after["fallback"]["total"]), 0, "{after}");
    assert_eq!(
        u(&after["capability_path"]["intents"]["total"]),
        0,
        "{after}"
    );
}

#[test]
fn sockets_like_smcss() {
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    let c = Conns::open(&smcd, None, 2, 1, 1000);
    let j = wait_for("sockets", || {
        let j = smcd.ctl("--json ss").json();
        let smc = j["sockets"]
            .as_array()?
            .iter()
            .filter(|s| s["mode"] == "SMCD")
            .count();
        (smc >= 4).then_some(j)
    });
    let socks = j["sockets"].as_array().unwrap();
    assert!(socks.iter().all(|s| s["state"] != "LISTEN"));
    assert!(
        socks.iter().any(|s| s["mode"] == "TCP"),
        "the plain client's fallback: {j}"
    );
    let t = smcd.ctl("ss").ok().to_owned();
    assert!(
        t.starts_with("State   UID    Inode    Local Address    Peer Address     Intf  Mode")
            || t.starts_with("State"),
        "{t}"
    );
    assert!(t.lines().next().unwrap().contains("Peer Address"));
    assert_eq!(t.lines().count() - 1, socks.len(), "{t}");
    let port = format!(":{}", c.port);
    assert!(
        t.lines().any(|l| l.contains(&port) && l.contains("SMCD")),
        "{t}"
    );
    assert!(t.lines().any(|l| l.contains("TCP 0x03010000")), "{t}");

    let l = smcd.ctl("ss -l");
    let lt = l.ok();
    assert!(lt.lines().skip(1).all(|r| r.starts_with("LISTEN")), "{lt}");
    assert!(lt.contains(&format!("127.0.0.1:{}", c.port)), "{lt}");
    let all = smcd.ctl("--json ss -a").json();
    assert!(all["sockets"].as_array().unwrap().len() > socks.len());

    let d = smcd.ctl("ss -D -d");
    let dt = d.ok();
    let head = dt.lines().next().unwrap();
    assert!(
        head.contains("Shutd") && head.contains("Peer-Token") && head.contains("Linkid"),
        "{head}"
    );
    assert!(dt.lines().skip(1).all(|r| r.contains("SMCD")), "{dt}");
    let jd = smcd.ctl("--json ss -D").json();
    for s in jd["sockets"].as_array().unwrap() {
        assert_eq!(s["mode"], "SMCD");
        assert!(s["smcd"]["gid"].as_str().unwrap().len() >= 16, "{s}");
        assert_eq!(s["pid"], c.pid, "{s}");
    }
}

#[test]
fn sysctl_get_set_and_range() {
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    let show = smcd.ctl("sysctl show");
    let t = show.ok();
    assert!(t.starts_with("Name"), "{t}");
    for k in [
        "wmem",
        "rmem",
        "autocorking_size",
        "limit_smc_hs",
        "tx_chunk",
    ] {
        assert!(t.lines().any(|l| l.starts_with(k)), "{k}: {t}");
    }
    let j = smcd.ctl("--json sysctl show").json();
    let wmem = j["sysctls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "wmem")
        .unwrap()
        .clone();
    assert_eq!(wmem["value"], 65536);
    assert_eq!(wmem["min"], 16384);
    assert_eq!(
        wmem["max"],
        (i32::MAX / 2) as u64,
        "INT_MAX / 2, as the kernel"
    );
    assert_eq!(smcd.ctl("sysctl get wmem").ok(), "wmem = 65536\n");
    assert_eq!(smcd.ctl("sy g net.smc.wmem").ok(), "wmem = 65536\n");
    let r = smcd.ctl("sysctl get nosuchknob");
    assert!(r.fails(1).contains("no sysctl named \"nosuchknob\""));
    // ENOENT for a namespace is told apart from ENOENT for a knob.
    let r = smcd.ctl("--netns smcctl-no-such-ns sysctl get wmem");
    assert!(
        r.fails(1)
            .contains("knows no network namespace smcctl-no-such-ns"),
        "{r:#?}"
    );
    let r = smcd.ctl(&format!(
        "--netns {} sysctl get nosuchknob",
        std::process::id()
    ));
    assert!(r.fails(1).contains("no sysctl named"), "{r:#?}");

    if skip_unless_root("sysctl_get_set_and_range (set)") {
        return;
    }
    let r = smcd.ctl("sysctl set wmem=100");
    let line = r.fails(1);
    assert!(line.contains("16384..1073741823"), "{line}");
    assert!(line.contains("stays 65536"), "{line}");
    assert_eq!(smcd.ctl("sysctl set wmem=131072").ok(), "wmem = 131072\n");
    assert_eq!(smcd.ctl("--json sysctl get wmem").json()["value"], 131072);
    let r = smcd.ctl("sysctl set wmem=lots");
    assert!(r.fails(2).contains("takes a number"));
}

#[test]
fn hs_limit_and_eids() {
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    assert_eq!(
        smcd.ctl("hs-limit").ok(),
        "Handshake limitation: disabled\n"
    );
    let seid = smcd.ctl("seid");
    assert!(
        seid.ok().ends_with("]\n") || seid.stdout == "n/a\n",
        "{seid:#?}"
    );
    assert!(smcd.ctl("--json seid").json()["enabled"].is_boolean());
    if skip_unless_root("hs_limit_and_eids (changes)") {
        return;
    }
    assert_eq!(smcd.ctl("hs-limit enable").ok(), "");
    assert_eq!(smcd.ctl("--json hs").json()["enabled"], true);
    assert_eq!(smcd.ctl("hs d").ok(), "");
    assert_eq!(
        smcd.ctl("hs-limit show").ok(),
        "Handshake limitation: disabled\n"
    );

    assert_eq!(smcd.ctl("ueid add SMCCTL-TEST.1").ok(), "");
    assert_eq!(smcd.ctl("ueid show").ok(), "SMCCTL-TEST.1\n");
    assert!(
        smcd.ctl("ueid add SMCCTL-TEST.1")
            .fails(1)
            .contains("already defined")
    );
    assert_eq!(
        smcd.ctl("--json ueid").json()["ueids"],
        serde_json::json!(["SMCCTL-TEST.1"])
    );
    assert_eq!(smcd.ctl("--json ueid del SMCCTL-TEST.1").json()["ok"], true);
    assert!(
        smcd.ctl("ueid del SMCCTL-TEST.1")
            .fails(1)
            .contains("not defined")
    );
    assert_eq!(smcd.ctl("u a SMCCTL-TEST.2").ok(), "");
    assert_eq!(smcd.ctl("u f").ok(), "");
    assert_eq!(smcd.ctl("ueid").ok(), "");
}

#[test]
fn admin_commands_need_root() {
    if skip_unless_root("admin_commands_need_root") {
        return;
    }
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    // The same smcctl as an unprivileged user.
    if skip_unless_tool("admin_commands_need_root", "setpriv") {
        return;
    }
    for args in [
        "hs-limit enable",
        "ueid add ABC",
        "sysctl set wmem=131072",
        "stats reset",
    ] {
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_smcctl"))
            .arg("--socket")
            .arg(&smcd.socket)
            .args(args.split_whitespace())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args}: {err}");
        assert_eq!(err.lines().count(), 1, "{args}: {err}");
        assert!(err.contains("needs root"), "{args}: {err}");
    }
    // Reads work unprivileged.
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_smcctl"))
        .arg("--socket")
        .arg(&smcd.socket)
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two namespaces: sysctls, sockets, link groups and counters are per namespace.
#[test]
fn two_namespaces() {
    if skip_unless_root("two_namespaces") {
        return;
    }
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    let Some(a) = Netns::create("two_namespaces") else {
        return;
    };
    let Some(b) = Netns::create("two_namespaces") else {
        return;
    };
    let (na, nb) = (format!("--netns {}", a.name), format!("--netns {}", b.name));

    // sysctl: set in a, b keeps the default.
    assert_eq!(
        smcd.ctl(&format!("{na} sysctl set wmem=262144")).ok(),
        "wmem = 262144\n"
    );
    assert_eq!(
        smcd.ctl(&format!("{na} sysctl get wmem")).ok(),
        "wmem = 262144\n"
    );
    assert_eq!(
        smcd.ctl(&format!("{nb} sysctl get wmem")).ok(),
        "wmem = 65536\n"
    );
    assert_eq!(smcd.ctl("sysctl get wmem").ok(), "wmem = 65536\n");
    let ia = smcd.ctl(&format!("{na} --json sysctl get wmem")).json()["netns_inode"].clone();
    let ib = smcd.ctl(&format!("{nb} --json sysctl get wmem")).json()["netns_inode"].clone();
    assert_ne!(ia, ib);

    // Connections in a only.
    let c = Conns::open(&smcd, Some(&a), 2, 0, 10_000);
    let ja = wait_for("sockets in a", || {
        let j = smcd.ctl(&format!("{na} --json ss")).json();
        (j["sockets"].as_array()?.len() >= 4).then_some(j)
    });
    for s in ja["sockets"].as_array().unwrap() {
        assert_eq!(s["netns_inode"], ia, "{s}");
        assert_eq!(s["pid"], c.pid);
    }
    assert_eq!(
        smcd.ctl(&format!("{nb} --json ss -a")).json()["sockets"],
        Value::Array(vec![])
    );
    assert_eq!(smcd.ctl(&format!("{nb} ss")).ok().lines().count(), 1);

    // Counters and link groups (SMC_GEN_NETLINK: smcctl enters the namespace).
    let sa = wait_for("counters in a", || {
        let j = smcd.ctl(&format!("{na} --json stats")).json();
        (u(&j["connections"]["smc"]["total"]) >= 4).then_some(j)
    });
    assert!(u(&sa["rx"]["bytes"]) >= 40_000);
    let sb = smcd.ctl(&format!("{nb} --json stats")).json();
    assert_eq!(u(&sb["connections"]["smc"]["total"]), 0, "{sb}");
    let la = smcd.ctl(&format!("{na} --json linkgroup")).json();
    assert!(!la["linkgroups"].as_array().unwrap().is_empty(), "{la}");
    let lb = smcd.ctl(&format!("{nb} linkgroup"));
    assert_eq!(lb.ok().lines().count(), 1, "{lb:#?}");

    // stats reset in b leaves a alone.
    smcd.ctl(&format!("{nb} stats reset")).ok();
    let sa2 = smcd.ctl(&format!("{na} --json stats")).json();
    assert!(u(&sa2["connections"]["smc"]["total"]) >= 4);

    // hs-limit is per namespace.
    smcd.ctl(&format!("{na} hs-limit enable")).ok();
    assert_eq!(smcd.ctl(&format!("{na} --json hs")).json()["enabled"], true);
    assert_eq!(
        smcd.ctl(&format!("{nb} --json hs")).json()["enabled"],
        false
    );

    // A pid names its namespace too.
    let by_pid = smcd.ctl(&format!("--netns {} sysctl get wmem", c.pid));
    assert_eq!(by_pid.ok(), "wmem = 262144\n");
    drop(c);
}

/// The harness itself (needs no control plane): children open real SMC-D connections, in
/// the root namespace and inside a fresh one.
#[test]
fn harness_opens_smc_connections() {
    let smcd = Smcd::start(BINS);
    let c = Conns::open(&smcd, None, 2, 1, 300_000);
    assert!(c.port > 0);
    drop(c);
    if skip_unless_root("harness_opens_smc_connections (namespace)") {
        return;
    }
    let Some(ns) = Netns::create("harness_opens_smc_connections") else {
        return;
    };
    let c = Conns::open(&smcd, Some(&ns), 1, 0, 1000);
    assert!(c.port > 0);
}

/// The harness itself: `Smcd::restart` stops smcd cleanly and starts a new one on the same
/// socket, which answers.
#[test]
fn harness_restarts_smcd() {
    let mut smcd = Smcd::start_with(BINS, &["--max-dmbs", "100"]);
    smcd.require_control_plane();
    let before = smcd.pid();
    assert!(smcd.restart(), "smcd exits 0 on SIGTERM");
    assert_ne!(smcd.pid(), before);
    smcd.require_control_plane();
    assert!(smcd.ctl("info").ok().starts_with("Kernel Capabilities\n"));
}
