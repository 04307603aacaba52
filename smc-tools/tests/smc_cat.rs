//! `smc-cat` as an operator runs it, over a real smcd.

mod common;

use common::{BINS, Smcd, eventually};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Issue 10, item 6: `smc-cat -k -l` exited when one SMC client died (its reset ended the
/// server with an error), where `nc -k` and `smc-cat --tcp -k` keep listening. A client that
/// is SIGKILLed mid-stream is reported; the next client is served.
#[test]
fn keep_open_listener_survives_a_killed_client() {
    let smcd = Smcd::start(BINS);
    let mut server = Command::new(BINS.smc_cat)
        .args(["-k", "-l", "-v", "127.0.0.1:0"])
        .env("SMCD_SOCKET", &smcd.socket)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    log.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("smc-cat: listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_string();
    let client = |stdin: Stdio| {
        Command::new(BINS.smc_cat)
            .args(["-v", &addr])
            .env("SMCD_SOCKET", &smcd.socket)
            .env("RUST_LOG", "error")
            .stdin(stdin)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // The first client sends a little, then dies without closing; it holds back nothing
    // unread on the server (so the server sees a reset, not an orderly close).
    let mut first = client(Stdio::piped());
    let mut first_log = BufReader::new(first.stderr.take().unwrap());
    let mut l1 = String::new();
    first_log.read_line(&mut l1).unwrap();
    assert!(
        l1.contains("SMC-D"),
        "the first client is not on SMC-D: {l1}"
    );
    first.stdin.as_mut().unwrap().write_all(b"first\n").unwrap();
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let mut got = String::new();
    out.read_line(&mut got).unwrap();
    assert_eq!(got, "first\n");
    first.kill().unwrap();
    let _ = first.wait();
    // The server says what happened to it and serves the next one.
    let mut seen = Vec::new();
    assert!(
        eventually(Duration::from_secs(20), || {
            let mut l = String::new();
            if log.read_line(&mut l).is_ok_and(|n| n > 0) {
                seen.push(l.clone());
            }
            l.contains("reading from the connection") || l.contains("end of stream")
        }),
        "the server did not report the first client's end: {seen:?}"
    );
    assert!(
        server.try_wait().unwrap().is_none(),
        "smc-cat -k exited after a client died: {seen:?}"
    );
    let mut second = client(Stdio::piped());
    second.stdin.take().unwrap().write_all(b"second\n").unwrap();
    let mut got = String::new();
    out.read_line(&mut got).unwrap();
    assert_eq!(got, "second\n");
    assert!(second.wait().unwrap().success());
    let _ = server.kill();
    let _ = server.wait();
    let mut rest = String::new();
    let _ = out.read_to_string(&mut rest);
}
