//! `smc-perf client --also`: crr to two servers from one process, the loops shared out
//! between them, each target's count in the report (what the bench's lgr-pending suite reads),
//! over plain TCP and over SMC-D against a real smcd. Checks what the report says, never
//! timing.

mod common;

use common::{BINS, Smcd};
use std::process::{Child, Command};

/// An `smc-perf server` on a free port; its port.
fn server(smcd: &Smcd, tcp: bool) -> (Child, u16) {
    common::perf_server(smcd, tcp, &[])
}

#[test]
fn crr_to_two_servers_reports_each_target() {
    let smcd = Smcd::start(BINS);
    for tcp in [true, false] {
        let (mut a, pa) = server(&smcd, tcp);
        let (mut b, pb) = server(&smcd, tcp);
        let mut cmd = Command::new(BINS.smc_perf);
        cmd.arg("client")
            .arg(format!("127.0.0.1:{pa}"))
            .args(["--also", &format!("127.0.0.1:{pb}")])
            .args(["--test", "crr", "--concurrency", "5"])
            .args(["--time", "0.4", "--warmup", "0.1"])
            .env("SMCD_SOCKET", &smcd.socket);
        if tcp {
            cmd.arg("--tcp");
        }
        let out = cmd.output().expect("smc-perf client");
        for s in [&mut a, &mut b] {
            let _ = s.kill();
            let _ = s.wait();
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "tcp={tcp}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON report");
        assert_eq!(r["errors"], 0, "tcp={tcp}: {r}");
        assert_eq!(r["concurrency"], 5, "tcp={tcp}: {r}");
        let t = r["targets"].as_array().expect("targets");
        assert_eq!(t.len(), 2, "tcp={tcp}: {r}");
        // Loop i drives target i mod 2: three loops for the first, two for the second.
        assert_eq!(t[0]["target"], format!("127.0.0.1:{pa}"));
        assert_eq!(t[1]["target"], format!("127.0.0.1:{pb}"));
        assert_eq!(
            (t[0]["concurrency"].as_u64(), t[1]["concurrency"].as_u64()),
            (Some(3), Some(2))
        );
        let total = r["total_connections"].as_u64().expect("total_connections");
        let mut in_window = 0;
        for x in t {
            let n = x["connections"].as_u64().expect("connections");
            assert!(n > 0, "tcp={tcp}: a target had no connection: {r}");
            assert!(x["conns_per_s"].as_f64().is_some_and(|c| c > 0.0), "{r}");
            assert_eq!(x["errors"], 0, "{r}");
            assert!(x["first_connect_ms_max"].as_f64().is_some(), "{r}");
            // Over SMC-D every connection is SMC; plain TCP has none.
            let smc = x["smc_connections"].as_u64().expect("smc_connections");
            assert_eq!(smc, if tcp { 0 } else { n }, "tcp={tcp}: {r}");
            // Link groups are SMC-R's only.
            assert!(x.get("link_groups").is_none(), "{r}");
            in_window += n;
        }
        assert!(in_window <= total, "tcp={tcp}: {r}");
        assert!(r.get("smcr_first_contacts").is_none(), "{r}");
    }
}

#[test]
fn also_is_for_timed_crr_only() {
    for args in [
        &["--test", "lat"][..],
        &["--test", "crr", "--count", "3"],
        &["--test", "crr", "--events"],
    ] {
        let out = Command::new(BINS.smc_perf)
            .args(["client", "127.0.0.1:9", "--also", "127.0.0.1:9", "--tcp"])
            .args(args)
            .output()
            .expect("smc-perf client");
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--also"),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
