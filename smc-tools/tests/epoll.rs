//! The epoll-driven example runs end to end over SMC-D: non-blocking streams whose readiness
//! descriptors drive a single-threaded event loop.
//!
//! The example (`smcd-engine/examples/epoll_echo.rs`) is compiled into this test and run in a
//! child process (this test binary re-executed), so no test has to build it with cargo.

mod common;

#[path = "../../smcd-engine/examples/epoll_echo.rs"]
#[allow(dead_code)] // the example's own `main`; the child calls `run`
mod epoll_echo;

use common::{BINS, Smcd};
use std::process::Command;

#[test]
#[ignore = "child process entry, started by the test"]
fn epoll_echo_child() {
    let Ok(args) = std::env::var("SMC_EPOLL_ECHO_ARGS") else {
        return;
    };
    let n: Vec<usize> = args
        .split_whitespace()
        .map(|a| a.parse().unwrap())
        .collect();
    epoll_echo::run(n[0], n[1]).expect("the example");
}

#[test]
fn epoll_echo_example_over_smcd() {
    let smcd = Smcd::start(BINS);
    // The example with arguments `6 500`.
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "epoll_echo_child",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env("SMC_EPOLL_ECHO_ARGS", "6 500")
        .env("SMCD_SOCKET", &smcd.socket)
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "example failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.matches("500 echoes of 500 over SMC-D").count(),
        6,
        "{stdout}"
    );
    assert!(stdout.contains("all echoes matched"));
}
