//! The bench end to end in its smallest form: `cargo xtask bench --suite bw --smoke --debug`
//! builds the debug binaries, starts its own smcd and smc-perf servers, runs a TCP and an SMC
//! client at two sizes three times each, and writes JSON with a median for every point.
//! Checks structure and data integrity only, never timing.

mod common;
use common::processes_with_env;

use std::process::{Command, Stdio};

#[test]
fn bench_bw_smoke_writes_complete_json_and_leaves_nothing_running() {
    let out = std::env::temp_dir().join(format!("xtask-bench-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["bench", "--suite", "bw", "--smoke", "--debug", "--out"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run xtask");
    let bench_pid = child.id();
    let run = child.wait_with_output().expect("xtask output");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "bench failed\n{stdout}\n{stderr}");
    assert!(stdout.contains("SMC/TCP"), "no table\n{stdout}");

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("latest.json")).expect("latest"))
            .expect("JSON");
    assert_eq!(json["totals"]["complete"], true);
    assert_eq!(json["totals"]["data_errors"], 0);
    let table = &json["suites"][0]["tables"][0];
    assert_eq!(table["id"], "bw/stream");
    let points = table["points"].as_array().expect("points");
    assert_eq!(points.len(), 2);
    for p in points {
        let results = p["results"].as_array().expect("results");
        assert_eq!(results[0]["variant"], "tcp");
        assert_eq!(results[1]["variant"], "smc");
        for r in results {
            assert!(r["median"]["mbps"].as_f64().is_some_and(|v| v > 0.0), "{r}");
            let reps = r["reps"].as_array().expect("reps");
            assert_eq!(reps.len(), 3);
            for rep in reps {
                assert_eq!(rep["ok"], true, "{rep}");
                assert_eq!(rep["errors"], 0);
            }
        }
        // The SMC runs really ran over SMC-D.
        for rep in results[1]["reps"].as_array().expect("reps") {
            assert_eq!(rep["report"]["transport"], "smcd", "{rep}");
        }
    }
    assert!(out.join("latest-bw.svg").exists());

    // Nothing it started is still running: every child got SMCD_SOCKET pointing into the
    // bench's temporary directory (named after its pid), so look for that in /proc.
    let left = processes_with_env(&format!("smc-bench-{bench_pid}-"));
    assert!(left.is_empty(), "left running: {left:?}");
    let _ = std::fs::remove_dir_all(&out);
}
