//! The epoll-driven example runs end to end over SMC-D: non-blocking streams whose readiness
//! descriptors drive a single-threaded event loop.

mod common;

use common::{BINS, Smcd};
use std::process::Command;

#[test]
fn epoll_echo_example_over_smcd() {
    let smcd = Smcd::start(BINS);
    // cargo test builds the examples next to the test binaries' directory.
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("examples").join("epoll_echo"))
        .unwrap();
    if !example.exists() {
        let st = Command::new(env!("CARGO"))
            .args(["build", "-p", "smcd-engine", "--example", "epoll_echo"])
            .status()
            .unwrap();
        assert!(st.success());
    }
    let out = Command::new(&example)
        .args(["6", "500"])
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
