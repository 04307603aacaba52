//! The shared harness (the `smc-tests` library) with this package's binaries filled in:
//! cargo sets `CARGO_BIN_EXE_<name>` only for the integration tests of the package that owns
//! the binaries, so the paths are expanded here, in each test crate, and handed to the harness.
#![allow(dead_code, unused_imports)]

pub use smc_tests::*;
use std::path::Path;

/// smcd, smcctl, smc-perf and smc-cat as cargo built them for these tests.
pub const BINS: Bins = smc_tests::bins!();

/// Runs smcctl with `args` (split on blanks) and the given socket (or none).
pub fn smcctl(socket: Option<&Path>, args: &str) -> Run {
    BINS.smcctl(socket, args)
}

/// Runs smcctl with exactly these arguments.
pub fn smcctl_args(socket: Option<&Path>, args: &[&str]) -> Run {
    BINS.smcctl_args(socket, args)
}

/// An `smc-perf server` (with `extra` options, and `--tcp` when `tcp`) on a free port of
/// 127.0.0.1 against `smcd`; its port. The rest of its stderr (errors it reports) goes to ours.
pub fn perf_server(smcd: &Smcd, tcp: bool, extra: &[&str]) -> (std::process::Child, u16) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(BINS.smc_perf);
    cmd.arg("server")
        .args(extra)
        .args(["--port", "0", "--bind", "127.0.0.1"]);
    if tcp {
        cmd.arg("--tcp");
    }
    let mut child = cmd
        .env("SMCD_SOCKET", &smcd.socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("smc-perf server");
    let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
    let port = loop {
        let line = lines
            .next()
            .expect("the server ended before it listened")
            .expect("its stderr");
        if let Some(rest) = line.strip_prefix("smc-perf: serving ") {
            break rest
                .rsplit(':')
                .next()
                .and_then(|p| p.trim().parse().ok())
                .expect("a port");
        }
    };
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            eprintln!("server: {l}");
        }
    });
    (child, port)
}
