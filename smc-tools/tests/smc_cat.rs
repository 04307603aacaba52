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
    let (mut server, mut log, addr) = listener(&smcd, &["-k"], Stdio::null(), Stdio::piped());
    let client = |stdin: Stdio| smc_cat(&smcd, &["-v", &addr], stdin);
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

/// `smc-cat ARGS` against `smcd`, its output thrown away, its log piped.
fn smc_cat(smcd: &Smcd, args: &[&str], stdin: Stdio) -> std::process::Child {
    Command::new(BINS.smc_cat)
        .args(args)
        .env("SMCD_SOCKET", &smcd.socket)
        .env("RUST_LOG", "error")
        .stdin(stdin)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `smc-cat -l -v 127.0.0.1:0` with `extra` options: the process, its log past the first
/// line, and the address that line names.
fn listener(
    smcd: &Smcd,
    extra: &[&str],
    stdin: Stdio,
    stdout: Stdio,
) -> (
    std::process::Child,
    BufReader<std::process::ChildStderr>,
    String,
) {
    let mut server = Command::new(BINS.smc_cat)
        .args(extra)
        .args(["-l", "-v", "127.0.0.1:0"])
        .env("SMCD_SOCKET", &smcd.socket)
        .env("RUST_LOG", "error")
        .stdin(stdin)
        .stdout(stdout)
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
    (server, log, addr)
}

/// Voluntary context switches of the thread named `name` in process `pid`.
fn wakeups(pid: u32, name: &str) -> u64 {
    let mut n = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        n += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    n
}

/// An engine whose peer has closed its end of the group's bell channel (the peer's process
/// ended after an orderly close; the group lives on until it expires) does not wake for that
/// channel again: its end of file made the channel readable for good, and the housekeeping thread
/// woke every 20 ms to drain it until the group was freed (an idle server used about 1 % of
/// a CPU). Counted, not timed: fewer than 20 wake-ups in 2 s where there were about 100.
#[test]
fn a_closed_bell_channel_does_not_wake_the_housekeeping_thread() {
    let smcd = Smcd::start(BINS);
    let (mut server, _log, addr) = listener(&smcd, &[], Stdio::piped(), Stdio::null());
    let mut client = smc_cat(&smcd, &["-v", &addr], Stdio::piped());
    let mut clog = BufReader::new(client.stderr.take().unwrap());
    let mut l = String::new();
    clog.read_line(&mut l).unwrap();
    assert!(l.contains("SMC-D"), "not on SMC-D: {l}");
    // An event loop's bells go through the channel until each side knows the other takes
    // them itself; a line each way is enough to make the channel carry something.
    client.stdin.as_mut().unwrap().write_all(b"hi\n").unwrap();
    server.stdin.as_mut().unwrap().write_all(b"ho\n").unwrap();
    // The client closes its sending side (end of its input), then its process ends: the
    // server's group outlives it (its listener keeps the process; the group waits for
    // lgr_idle_time).
    drop(client.stdin.take());
    std::thread::sleep(Duration::from_millis(300));
    client.kill().unwrap();
    let _ = client.wait();
    let pid = server.id();
    assert!(
        eventually(Duration::from_secs(20), || wakeups(pid, "smc-lgr-sweep")
            > 0),
        "no housekeeping thread in the server"
    );
    std::thread::sleep(Duration::from_millis(500));
    let before = wakeups(pid, "smc-lgr-sweep");
    std::thread::sleep(Duration::from_secs(2));
    let woke = wakeups(pid, "smc-lgr-sweep") - before;
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        woke < 20,
        "the housekeeping thread woke {woke} times in 2 s"
    );
}
