//! The soak end to end at its smallest scale: `cargo xtask soak --quick --debug` builds the
//! debug binaries, starts its own smcd, and runs the churn and idle phases against an SMC and
//! a TCP server with dumps every second and a drip-feeding attacker beside the SMC phases.
//!
//! What is asserted is the soak's own verdict and the report's structure: every phase of both
//! transports is there with its before/after samples, no legitimate connection errored, every
//! SMC connection was SMC-D, descriptors, buffers and link groups came back, and the
//! attacker's connections were never closed before `CLC_WAIT_TIME`. The only timing threshold
//! is the soak's own (a dump within 1 s), which holds by a wide margin at this scale, also in
//! debug beside two CPU hogs.

mod common;
use common::processes_with_env;

use std::process::{Command, Stdio};

#[test]
fn soak_quick_holds_and_reports_every_phase() {
    let out = std::env::temp_dir().join(format!("xtask-soak-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["soak", "--quick", "--debug", "--out"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run xtask");
    let soak_pid = child.id();
    let run = child.wait_with_output().expect("xtask output");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "soak failed\n{stdout}\n{stderr}");
    assert!(stdout.contains("| churn | SMC |"), "no table\n{stdout}");

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("latest.json")).expect("latest"))
            .expect("JSON");
    assert_eq!(json["ok"], true);
    let phases = json["phases"].as_array().expect("phases");
    let names: Vec<(String, String)> = phases
        .iter()
        .map(|p| {
            (
                p["transport"].as_str().unwrap().to_string(),
                p["phase"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("smc", "churn"),
            ("smc", "idle"),
            ("tcp", "churn"),
            ("tcp", "idle")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    for p in phases {
        let what = format!("{} {}", p["transport"], p["phase"]);
        assert_eq!(p["errors"], 0, "{what}");
        assert_eq!(p["client_proc_failures"], 0, "{what}");
        assert!(p["expected"].as_u64().unwrap() > 0, "{what}");
        assert_eq!(p["connections"], p["expected"], "{what}");
        assert!(p["connect_us_p99"].as_u64().is_some(), "{what}");
        assert_eq!(p["dump_failures"], 0, "{what}");
        assert!(p["dumps"].as_u64().unwrap() >= 3, "{what}");
        for s in ["before", "after"] {
            assert!(p[s]["smcd"]["fds"].as_u64().unwrap() > 0, "{what} {s}");
            assert!(p[s]["server"]["rss_kb"].as_u64().unwrap() > 0, "{what} {s}");
        }
        for c in p["checks"].as_array().unwrap() {
            assert_eq!(c["ok"], true, "{what}: {c}");
        }
        if p["transport"] == "smc" {
            assert_eq!(p["smc_connections"], p["expected"], "{what}: all SMC-D");
            let a = &p["attacker"];
            assert!(a["attempts"].as_u64().unwrap() > 0, "{what}: {a}");
            assert_eq!(a["closed_early"], 0, "{what}: {a}");
            assert_eq!(a["never_closed"], 0, "{what}: {a}");
        }
    }
    // The idle phase really held its connections at once: the server's descriptors peaked
    // above the number of idle connections.
    let idle = phases[1]["expected"].as_u64().unwrap();
    assert!(phases[1]["peak_server"]["fds"].as_u64().unwrap() > idle);
    assert!(out.join("latest.md").exists());

    // Nothing it started is still running: every child got SMCD_SOCKET pointing into the
    // soak's temporary directory (named after its pid).
    let left = processes_with_env(&format!("smc-soak-{soak_pid}-"));
    assert!(left.is_empty(), "left running: {left:?}");
    let _ = std::fs::remove_dir_all(&out);
}
