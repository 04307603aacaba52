//! `smc-perf --events` end to end: the event-loop crr client (connections in an epoll loop,
//! non-blocking SMC connects) against the event-loop server (accept and serve from one epoll
//! loop, the listener driving its handshakes), over SMC and over plain TCP, against a real
//! smcd; and a test that is not crr (lat) handed from the event server to a thread.
//!
//! Checks integrity and what the connections became, never timing: every response is checked
//! by the client against the sender's pattern (a wrong byte is an error), and the run must
//! have no error and only SMC-D connections.

mod common;

use common::{BINS, Smcd};
use std::process::{Child, Command};

/// An `smc-perf server --events` on a free port; its port.
fn server(smcd: &Smcd, tcp: bool) -> (Child, u16) {
    common::perf_server(smcd, tcp, &["--events"])
}

/// Runs an `smc-perf client` with `args` against `port`; its JSON report.
fn client(smcd: &Smcd, port: u16, tcp: bool, args: &[&str]) -> serde_json::Value {
    let mut cmd = Command::new(BINS.smc_perf);
    cmd.arg("client")
        .arg(format!("127.0.0.1:{port}"))
        .args(args)
        .env("SMCD_SOCKET", &smcd.socket);
    if tcp {
        cmd.arg("--tcp");
    }
    let out = cmd.output().expect("smc-perf client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client {args:?} tcp={tcp} failed\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).expect("one JSON report")
}

/// `"N of M connections SMC-D"` → (N, M).
fn share(mode: &str) -> (u64, u64) {
    let mut it = mode.split_whitespace();
    let n = it.next().and_then(|x| x.parse().ok()).expect("N");
    let m = it.nth(1).and_then(|x| x.parse().ok()).expect("M");
    (n, m)
}

#[test]
fn event_loop_crr_runs_with_no_error_over_smc_d_and_over_tcp() {
    let smcd = Smcd::start(BINS);
    for tcp in [false, true] {
        let (mut srv, port) = server(&smcd, tcp);
        let crr = [
            "--test",
            "crr",
            "--events",
            "--concurrency",
            "32",
            "--time",
            "1",
            "--warmup",
            "0.1",
        ];
        let r = client(&smcd, port, tcp, &crr);
        // A test that is not crr goes from the event loop to a thread of its own.
        let lat = client(
            &smcd,
            port,
            tcp,
            &["--test", "lat", "--time", "0.3", "--warmup", "0.05"],
        );
        let _ = srv.kill();
        let _ = srv.wait();
        assert_eq!(r["errors"], 0, "crr tcp={tcp}: {r}");
        let total = r["total_connections"].as_u64().expect("total_connections");
        assert!(total > 0, "crr tcp={tcp} made no connection: {r}");
        let (smc, done) = share(r["mode"].as_str().expect("mode"));
        assert!(done > 0, "crr tcp={tcp}: {r}");
        if tcp {
            assert_eq!(smc, 0, "plain TCP: {r}");
        } else {
            assert_eq!(smc, done, "every SMC connection SMC-D: {r}");
        }
        assert_eq!(lat["errors"], 0, "lat tcp={tcp}: {lat}");
        let want = if tcp { "tcp" } else { "smcd" };
        assert_eq!(lat["transport"], want, "lat tcp={tcp}: {lat}");
    }
}
