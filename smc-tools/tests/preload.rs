//! `smc-run`: unmodified programs (Debian's python3 and curl) over SMC-D through the preload
//! library, with both ends preloaded and with one end plain TCP. Each run is confirmed by
//! smcd's statistics and checked byte for byte.

mod common;

use common::{BINS, Smcd, skip_unless_tool};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

const SMC_RUN: &str = env!("CARGO_BIN_EXE_smc-run");

/// The preload library, built for the profile these tests were built with (cargo builds a
/// cdylib-only package for nobody's tests, so it is built here: a no-op when it is fresh).
fn preload_lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let exe = Path::new(SMC_RUN);
        let profile_dir = exe.parent().expect("smc-run's directory");
        let target = profile_dir.parent().expect("the target directory");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--quiet", "-p", "smc-preload", "--target-dir"])
            .arg(target);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("run cargo build -p smc-preload");
        assert!(st.success(), "cargo build -p smc-preload failed");
        let lib = profile_dir.join("libsmc_preload.so");
        assert!(lib.is_file(), "{} missing after the build", lib.display());
        lib
    })
}

/// `smc-run PROGRAM ARGS...` against `smcd`.
fn smc_run(smcd: &Smcd, program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(SMC_RUN);
    c.arg(program)
        .args(args)
        .env("SMCD_SOCKET", &smcd.socket)
        .env("SMC_PRELOAD_LIB", preload_lib())
        .env("RUST_LOG", "error");
    c
}

/// Debian's python3 (not a pyenv shim, so the program is the packaged one).
fn python() -> &'static str {
    if Path::new("/usr/bin/python3").is_file() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// SMC connections and fallbacks smcd counted so far.
fn counts(smcd: &Smcd) -> (u64, u64) {
    let j = smcd.ctl("--json stats").json();
    (
        u(&j["connections"]["smc"]["total"]),
        u(&j["fallback"]["total"]),
    )
}

/// `python3 -m http.server` on a free port of 127.0.0.1 serving `dir`, optionally preloaded;
/// its port.
fn http_server(smcd: &Smcd, dir: &Path, preload: bool) -> (Server, u16) {
    let args = ["-u", "-m", "http.server", "0", "--bind", "127.0.0.1"];
    let mut cmd = if preload {
        smc_run(smcd, python(), &args)
    } else {
        let mut c = Command::new(python());
        c.args(args);
        c
    };
    let mut child = cmd
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start python3 -m http.server");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    // "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
    let port = line
        .split_whitespace()
        .skip_while(|w| *w != "port")
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line of http.server: {line:?}"));
    // Keep reading its log so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in out.lines() {});
    (Server::new(child), port)
}

/// A directory with a file of `len` pattern bytes; its path.
fn site(tag: &str, len: usize) -> (PathBuf, Vec<u8>) {
    let dir = std::env::temp_dir().join(common::unique(tag));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = common::Rng::new(len as u64);
    let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
    std::fs::write(dir.join("blob"), &data).unwrap();
    (dir, data)
}

/// curl fetching `urls` in one run (keep-alive between them), optionally preloaded; the bodies
/// concatenated.
fn curl(smcd: &Smcd, urls: &[String], preload: bool) -> Vec<u8> {
    let mut args = vec!["-s", "--fail", "--max-time", "60"];
    args.extend(urls.iter().map(String::as_str));
    let mut cmd = if preload {
        smc_run(smcd, "curl", &args)
    } else {
        let mut c = Command::new("curl");
        c.args(&args);
        c
    };
    let out = cmd.output().expect("run curl");
    assert!(
        out.status.success(),
        "curl failed: {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn kill(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// A server the test started, stopped as [`terminate`] does when dropped: a failing test
/// leaves no server running (they outlived failed runs before).
struct Server(Option<Child>);

impl Server {
    fn new(c: Child) -> Server {
        Server(Some(c))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            terminate(c);
        }
    }
}

/// Kills a process group when dropped (what a test started, if a check failed before it
/// ended; a group whose processes all exited is gone and the kill does nothing).
struct GroupGuard(i32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group our child leads.
        unsafe { libc::kill(-self.0, libc::SIGKILL) };
    }
}

/// Stops a server that has worker processes (nginx): SIGTERM, so its master stops them (a
/// killed master leaves its workers serving), then SIGKILL after 10 s.
fn terminate(mut c: Child) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < until {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(c);
}

/// Both ends preloaded: python's http.server and curl talk over SMC-D (http.server speaks
/// HTTP/1.0, so every request is a connection of its own: five here, one curl run fetching
/// two); every byte arrives.
#[test]
fn python_http_server_and_curl_over_smc_d() {
    let test = "python_http_server_and_curl_over_smc_d";
    if skip_unless_tool(test, "curl") || skip_unless_tool(test, "python3") {
        return;
    }
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    let (dir, data) = site("preload-http", 3 * 1024 * 1024 + 123);
    let (server, port) = http_server(&smcd, &dir, true);
    let url = format!("http://127.0.0.1:{port}/blob");
    let before = counts(&smcd);
    for _ in 0..3 {
        assert!(
            curl(&smcd, std::slice::from_ref(&url), true) == data,
            "bytes differ"
        );
    }
    let two = curl(&smcd, &[url.clone(), url.clone()], true);
    assert!(
        two.len() == 2 * data.len()
            && two[..data.len()] == data[..]
            && two[data.len()..] == data[..]
    );
    let after = common::wait_for("smcd's counts", || {
        let c = counts(&smcd);
        (c.0 >= before.0 + 10).then_some(c)
    });
    // Five connections, each counted by both ends, and none fell back.
    assert_eq!(
        after.0 - before.0,
        10,
        "SMC connections: {before:?} -> {after:?}"
    );
    assert_eq!(after.1, before.1, "fallbacks: {before:?} -> {after:?}");
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

/// One end preloaded only: a plain curl against the preloaded server, and the preloaded curl
/// against a plain server, both get every byte over plain TCP; the preloaded server counts a
/// PEER_NO_SMC fallback, and no SMC connection is made.
#[test]
fn one_end_preloaded_is_plain_tcp() {
    let test = "one_end_preloaded_is_plain_tcp";
    if skip_unless_tool(test, "curl") || skip_unless_tool(test, "python3") {
        return;
    }
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    let (dir, data) = site("preload-one-end", 1024 * 1024 + 5);
    let before = counts(&smcd);
    let (server, port) = http_server(&smcd, &dir, true);
    let url = format!("http://127.0.0.1:{port}/blob");
    assert!(
        curl(&smcd, std::slice::from_ref(&url), false) == data,
        "plain curl: bytes differ"
    );
    drop(server);
    let (server, port) = http_server(&smcd, &dir, false);
    let url = format!("http://127.0.0.1:{port}/blob");
    assert!(
        curl(&smcd, std::slice::from_ref(&url), true) == data,
        "preloaded curl: bytes differ"
    );
    drop(server);
    let after = common::wait_for("smcd's counts", || {
        let c = counts(&smcd);
        (c.1 > before.1).then_some(c)
    });
    assert_eq!(
        after.0, before.0,
        "an SMC connection was made: {before:?} -> {after:?}"
    );
    let j = smcd.ctl("--json stats").json();
    let reasons = j["fallback"]["server_reasons"].to_string();
    assert!(
        reasons.contains("PEER_NO_SMC") || reasons.contains("0x03010000"),
        "{j}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Options a preloaded program sets before `connect` (buffer sizes, keepalive and its idle
/// time, `IP_TOS`) are the connection's: on a fallback to a plain server (blocking and
/// non-blocking connect) and on an SMC-D connection (its TCP options). Before, the engine
/// connected from a socket of its own and they were lost. Once with smcd's listener table
/// (intents) and once with the SMC option program.
#[test]
fn options_set_before_connect_are_the_connections() {
    let test = "options_set_before_connect_are_the_connections";
    if !need(test, &["python3"]) {
        return;
    }
    // The plain server: a Python outside smc-run that drains every connection it accepts.
    let mut server = std::process::Command::new(python())
        .args([
            "-c",
            "import socket, threading\n\
             ls = socket.socket(); ls.bind(('127.0.0.1', 0)); ls.listen(8)\n\
             print(ls.getsockname()[1], flush=True)\n\
             def drain(c):\n    while c.recv(65536): pass\n\
             while True:\n    c, _ = ls.accept(); threading.Thread(target=drain, args=(c,)).start()\n",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = server.stdout.take().unwrap();
    let _server = Server::new(server);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let port: u16 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("port: {line:?}"));
    {
        let smcd = Smcd::start(BINS);
        smcd.require_control_plane();
        connect_options(&smcd, port);
    }
    let Some(smcd) = option_smcd(test) else {
        return;
    };
    smcd.require_control_plane();
    connect_options(&smcd, port);
}

/// One run of [`options_set_before_connect_are_the_connections`] against the plain server
/// at `port`.
fn connect_options(smcd: &Smcd, port: u16) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload/connect_options.py");
    let before = counts(smcd);
    let out = run_ok(
        smc_run(
            smcd,
            python(),
            &[script.to_str().unwrap(), &port.to_string()],
        ),
        120,
    );
    assert!(out.contains("OK"), "{out}");
    // Counters reach smcd asynchronously (as in `assert_smc_since`; fallbacks are expected):
    // the script's five connections to its own listener are SMC-D, a bound one included
    // (each counted by both ends).
    common::wait_for("five SMC connections in smcd's counts", || {
        (counts(smcd).0 >= before.0 + 10).then_some(())
    });
}

/// `closefrom(3)` (the C library's closes through its internal `close_range`): the program's
/// SMC connections and listener close, the engine's descriptors survive, and a listener and
/// an SMC-D connection made afterwards carry 256 KiB exactly (before, the engine's
/// descriptors below its band, listener page, epoll sets, smcd channel, went with them, and
/// the debug build aborted on the double close, the release build refused the connection).
#[test]
fn closefrom_leaves_the_library_its_descriptors() {
    python_check(
        "closefrom_leaves_the_library_its_descriptors",
        "closefrom_check.py",
        "OK",
        4,
    );
}

/// A listening socket shared by fork with children that accept while the parent never does,
/// kept or closed by the parent (tests/preload/fork_listener.py: 24 clients answered byte for
/// byte over SMC-D; with the library before, the parent's engine took connections into a
/// queue nobody read and the clients hung). With the SMC option program: with intents only, a
/// client announced to the parent before a child's first `accept` still waits in the parent's
/// queue (docs/smc-run.md, "fork").
#[test]
fn a_listener_shared_by_fork_is_served_by_the_process_that_accepts() {
    // Both ends of each of the 24 connections.
    python_check_option(
        "a_listener_shared_by_fork_is_served_by_the_process_that_accepts",
        "fork_listener.py",
        "OK",
        48,
    );
}

/// A listener that was forked and that no process accepts from for longer than a client's
/// CLC wait (tests/preload/fork_unserved.py): the forked child's connect finishes and its
/// 64 KiB come back exactly once the parent accepts 8 s later, over plain TCP (the parent's
/// engine declined the Proposal of the unserved client and handed the connection to whoever
/// accepts); with the library before, the connect failed with `ETIMEDOUT` and the parent's
/// accept waited for ever. Then a client of the parent's own is SMC-D again.
#[test]
fn an_unserved_listener_hands_its_clients_on_as_tcp() {
    let test = "an_unserved_listener_hands_its_clients_on_as_tcp";
    if !need(test, &["python3"]) {
        return;
    }
    let Some(smcd) = option_smcd(test) else {
        return;
    };
    smcd.require_control_plane();
    let before = counts(&smcd);
    let (st, out, err) = python_script(&smcd, "fork_unserved.py");
    assert!(
        st.success(),
        "fork_unserved.py failed: {st:?}\n{out}\n{err}"
    );
    assert!(out.contains("OK"), "{out}");
    // Both ends of the parent's own connection over SMC-D; the child's fell back (counted by
    // both engines once they report).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let after = loop {
        let c = counts(&smcd);
        if (c.0 >= before.0 + 2 && c.1 > before.1) || std::time::Instant::now() > deadline {
            break c;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        after.0 >= before.0 + 2 && after.1 > before.1,
        "(SMC, fallback) connections {before:?} -> {after:?}: expected 2 more SMC and a fallback"
    );
}

/// A client that reads its answer and closes, then exits at once or sleeps: the server reads
/// the end of the stream, not `ECONNRESET` (tests/preload/close_after_read.py; with the
/// library before, the read's settle list kept the connection past the close and nothing
/// ended it: the server's read of the end hung or was reset).
#[test]
fn a_close_after_a_read_ends_the_connection() {
    python_check_option(
        "a_close_after_a_read_ends_the_connection",
        "close_after_read.py",
        "OK",
        8,
    );
}

/// A forked child's own non-blocking connect after its parent made one finishes, and its
/// connection sees its peer's end (tests/preload/fork_child_connects.py: the child used the
/// parent's connector and liveness watcher, whose threads it does not have).
#[test]
fn a_forked_child_connects_and_watches_with_threads_of_its_own() {
    python_check_option(
        "a_forked_child_connects_and_watches_with_threads_of_its_own",
        "fork_child_connects.py",
        "OK",
        4,
    );
}

/// A connection inherited by a forked child that exits without closing it, before or after
/// the parent's close: the peer reads the bytes and the connection's end, never waits for
/// ever (tests/preload/fork_exit.py).
#[test]
fn a_connection_ends_when_its_holders_end_without_closing_it() {
    python_check_option(
        "a_connection_ends_when_its_holders_end_without_closing_it",
        "fork_exit.py",
        "OK",
        4,
    );
}

/// A connection a parent and its forked child use one after the other and at the same time
/// (tests/preload/fork_share.py: writes in turn arrive in order, concurrent writers' bytes
/// each whole and in order, reads in turn and at the same time take every byte once; with the
/// library before, each process moved its own cursors and the peer read a child's bytes
/// overwritten by the parent's).
#[test]
fn a_connection_shared_by_fork_is_one_stream_for_both_processes() {
    python_check_option(
        "a_connection_shared_by_fork_is_one_stream_for_both_processes",
        "fork_share.py",
        "OK",
        2,
    );
}

/// [`python_check`] with smcd's SMC option program (a listener shared by fork is SMC-D only
/// there).
fn python_check_option(test: &str, name: &str, ok: &str, min_smc: u64) {
    if !need(test, &["python3"]) {
        return;
    }
    if let Some(smcd) = option_smcd(test) {
        python_check_with(&smcd, name, ok, min_smc);
    }
}

/// Runs `tests/preload/NAME` under smc-run with a fresh smcd: it exits 0 and prints `ok`, and
/// smcd counted at least `min_smc` SMC connection ends and no fallback.
fn python_check(test: &str, name: &str, ok: &str, min_smc: u64) {
    if need(test, &["python3"]) {
        python_check_with(&Smcd::start(BINS), name, ok, min_smc);
    }
}

/// [`python_check`] against `smcd`.
fn python_check_with(smcd: &Smcd, name: &str, ok: &str, min_smc: u64) {
    smcd.require_control_plane();
    let before = counts(smcd);
    let (st, out, err) = python_script(smcd, name);
    assert!(st.success(), "{name} failed: {st:?}\n{out}\n{err}");
    assert!(out.contains(ok), "{out}");
    assert_smc_since(smcd, before, min_smc);
}

/// Runs `tests/preload/NAME` under smc-run (up to 120 s): its status, stdout and stderr.
fn python_script(smcd: &Smcd, name: &str) -> (std::process::ExitStatus, String, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/preload")
        .join(name);
    let child = smc_run(smcd, python(), &[script.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    common::within(Duration::from_secs(120), move || {
        let out = child.wait_with_output().unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .unwrap_or_else(|| {
        // Not left running (a hung script kept a core busy for the tests after it).
        // SAFETY: kill(2) on our own child, which has not been waited for.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        panic!("{name} did not finish within 120 s")
    })
}

/// The socket API as Python's socket module calls it, both ends preloaded in one process
/// (tests/preload/api_check.py: peeks, waits for all, vectors, sendfile, select/poll/epoll
/// with edge triggering, FIONREAD/FIONBIO, fcntl, dup, options, names, shutdown, non-blocking
/// connect and accept, a socket duplicated before its connect); its connections ran over SMC-D.
#[test]
fn socket_api_under_python() {
    let test = "socket_api_under_python";
    if skip_unless_tool(test, "python3") {
        return;
    }
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    let before = counts(&smcd);
    let (st, out, err) = python_script(&smcd, "api_check.py");
    assert!(st.success(), "api_check.py failed: {st:?}\n{out}\n{err}");
    assert!(out.contains("OK 3 connections"), "{out}");
    let after = common::wait_for("smcd's counts", || {
        let c = counts(&smcd);
        (c.0 >= before.0 + 6).then_some(c)
    });
    assert_eq!(
        after.0 - before.0,
        6,
        "SMC connections: {before:?} -> {after:?}"
    );
    assert_eq!(after.1, before.1, "fallbacks: {before:?} -> {after:?}");
}

/// `epoll_wait` answered from shared memory while the program is busy
/// (`tests/preload/epoll_user.py`, `smc-preload/src/ep.rs`): exact reports under a busy loop,
/// other descriptors still reported, EPOLLOUT, RDHUP, deleted and closed descriptors, a set
/// changed through a duplicate, a set from before a fork.
#[test]
fn epoll_answered_in_user_space() {
    python_check(
        "epoll_answered_in_user_space",
        "epoll_user.py",
        "OK 5 connections",
        10,
    );
}

/// An event loop woken from its `epoll_wait` takes back its streams' announcements while it
/// is busy (`tests/preload/epoll_withdraw.py`, `smc-preload`'s `table::withdraw`): the peers'
/// writes ring nobody (the readiness sockets' queues stay empty), every arrival is still
/// reported, and threads that wait in the kernel meanwhile or afterwards are woken.
#[test]
fn a_woken_event_loop_has_its_peers_ring_nobody() {
    python_check(
        "a_woken_event_loop_has_its_peers_ring_nobody",
        "epoll_withdraw.py",
        "OK 8 connections",
        8,
    );
}

/// One ring per sleep (`tests/preload/epoll_tagged.py`, `smc-preload`'s `table::tag_sleep`):
/// an event loop asleep on 8 connections, the only waiter of its process, is rung once for
/// writes to all of them (it is stopped while they land; the readiness sockets' queues are
/// read through sock_diag), and rung for each when a second thread of its process waits in
/// the kernel; every arrival is reported.
#[test]
fn a_sleeping_event_loop_is_rung_once() {
    python_check(
        "a_sleeping_event_loop_is_rung_once",
        "epoll_tagged.py",
        "OK 8 connections",
        8,
    );
}

/// `recvmmsg` and `sendmmsg` on an SMC stream (`tests/preload/mmsg.py`): entries filled and
/// sent as the kernel does for a TCP socket (`MSG_WAITFORONE`, the timeout, `EAGAIN`, the end
/// of stream), and a socket of another kind passed through.
#[test]
fn recvmmsg_and_sendmmsg_on_a_connection() {
    python_check(
        "recvmmsg_and_sendmmsg_on_a_connection",
        "mmsg.py",
        "OK 1 connections",
        1,
    );
}

/// `splice` between an SMC stream and a pipe (`tests/preload/splice.py`): both ways in
/// order, a pipe that takes part of the bytes or none leaves the rest in the stream, a
/// non-blocking stream without room leaves them in the pipe, the end of stream, and the
/// kernel's errors for offsets and for two sockets.
#[test]
fn splice_between_a_connection_and_a_pipe() {
    python_check(
        "splice_between_a_connection_and_a_pipe",
        "splice.py",
        "OK 1 connections",
        1,
    );
}

/// Edge-triggered and one-shot registrations answered in user space
/// (`tests/preload/epoll_edge.py`, `smc-preload/src/ep.rs`): a stream registered as nginx
/// registers its connections is reported once at its registration, once per arrival (again
/// when more bytes arrive, never twice for one under a busy loop), for room after a full
/// buffer and at the end of stream; a pipe in the set is still reported; a one-shot stream is
/// not reported again until it is re-armed.
#[test]
fn epoll_edge_triggered_in_user_space() {
    python_check(
        "epoll_edge_triggered_in_user_space",
        "epoll_edge.py",
        "OK 5 connections",
        10,
    );
}

// ------------------------------------------------------------------------------------------
// Debian's servers and load generators, unmodified, with smc-run on both ends.

/// Runs `cmd` to its end (at most `secs`); its stdout and stderr, asserting success.
fn run_ok(mut cmd: Command, secs: u64) -> String {
    let what = format!("{cmd:?}");
    cmd.stdin(Stdio::null());
    let out = common::within(Duration::from_secs(secs), move || cmd.output())
        .unwrap_or_else(|| panic!("{what} did not finish within {secs} s"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed: {:?}\n{text}",
        out.status
    );
    text
}

/// A TCP port free on 127.0.0.1 just now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until something accepts TCP connections on `port` (the one plain connection that
/// succeeds is a fallback for a preloaded server: PEER_NO_SMC).
fn wait_listening(port: u16) {
    common::wait_for("the server to listen", || listening(port).then_some(()));
}

/// A socket listens on TCP `port` here: read from `/proc/net/tcp{,6}`, not found by
/// connecting, since a probe connection is a connection the server takes (iperf3 takes it
/// for a test's control connection and closes its listener when the probe goes away).
fn listening(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|row| {
                let f: Vec<&str> = row.split_whitespace().collect();
                // "sl local_address rem_address st ...": local is ADDR:PORT in hex, 0A LISTEN.
                f.len() > 3
                    && f[3] == "0A"
                    && f[1]
                        .rsplit(':')
                        .next()
                        .and_then(|p| u16::from_str_radix(p, 16).ok())
                        == Some(port)
            })
    })
}

/// `tools` are installed, or the test is skipped (and fails under CI).
fn need(test: &str, tools: &[&str]) -> bool {
    tools.iter().all(|t| !skip_unless_tool(test, t))
}

/// The SMC connections smcd counted since `before` are at least `min`, and none fell back.
fn assert_smc_since(smcd: &Smcd, before: (u64, u64), min: u64) {
    // Counters reach smcd asynchronously: poll for up to 10 s, then say what was counted.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let after = loop {
        let c = counts(smcd);
        if c.0 >= before.0 + min || std::time::Instant::now() > deadline {
            break c;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        after.0 >= before.0 + min && after.1 == before.1,
        "(SMC, fallback) connections {before:?} -> {after:?}: expected {min} more SMC and no fallback"
    );
}

/// redis-server with redis-cli and redis-benchmark (epoll, level-triggered, writev, 50
/// clients, pipelining): values round-trip exactly, a 1 MiB value included.
#[test]
fn redis_over_smc_d() {
    let test = "redis_over_smc_d";
    if !need(test, &["redis-server", "redis-cli", "redis-benchmark"]) {
        return;
    }
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    let dir = std::env::temp_dir().join(common::unique("preload-redis"));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port().to_string();
    let before = counts(&smcd);
    let server = Server::new(
        smc_run(
            &smcd,
            "redis-server",
            &[
                "--port",
                &port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
        )
        .current_dir(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    wait_listening(port.parse().unwrap());
    let cli = |args: &[&str]| {
        run_ok(
            smc_run(&smcd, "redis-cli", &[&["-p", &port], args].concat()),
            60,
        )
    };
    assert_eq!(cli(&["set", "k", "hello over smc"]).trim(), "OK");
    assert_eq!(cli(&["get", "k"]).trim(), "hello over smc");
    let mut rng = common::Rng::new(42);
    let big: String = (0..1 << 20)
        .map(|_| (b'a' + (rng.next() % 26) as u8) as char)
        .collect();
    let file = dir.join("big");
    std::fs::write(&file, &big).unwrap();
    let mut set = smc_run(&smcd, "redis-cli", &["-p", &port, "-x", "set", "big"]);
    set.stdin(std::fs::File::open(&file).unwrap());
    let out = set.output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
    assert_eq!(
        cli(&["get", "big"]).trim_end_matches('\n'),
        big,
        "the 1 MiB value differs"
    );
    let bench = run_ok(
        smc_run(
            &smcd,
            "redis-benchmark",
            &[
                "-p", &port, "-t", "set,get", "-n", "20000", "-P", "16", "-q",
            ],
        ),
        120,
    );
    assert!(
        bench.contains("SET: ") && bench.contains("GET: "),
        "{bench}"
    );
    assert!(!bench.to_lowercase().contains("error"), "{bench}");
    // BGSAVE forks with every connection and the listener live; the child closes the
    // listener and exits. The parent's listener and connections must not notice.
    let mut keep = smc_run(&smcd, "redis-cli", &["-p", &port]);
    let mut keep = keep
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut keep_in = keep.stdin.take().unwrap();
    let mut keep_out = BufReader::new(keep.stdout.take().unwrap());
    let mut ask = |cmd: &str| -> String {
        use std::io::Write;
        writeln!(keep_in, "{cmd}").unwrap();
        let mut l = String::new();
        keep_out.read_line(&mut l).unwrap();
        l.trim().to_string()
    };
    assert_eq!(ask("get k"), "hello over smc");
    // smcctl ss -p names the programs on both ends of the live connection.
    let ss = smcd.ctl("ss -p").ok().to_owned();
    let line = |comm: &str| {
        ss.lines()
            .find(|l| l.contains("SMCD") && l.contains(&format!("((\"{comm}\",pid=")))
            .map(str::to_owned)
    };
    assert!(
        line("redis-server").is_some() && line("redis-cli").is_some(),
        "{ss}"
    );
    assert!(cli(&["bgsave"]).contains("Background saving started"));
    common::wait_for("the background save", || {
        dir.join("dump.rdb").is_file().then_some(())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        ask("get k"),
        "hello over smc",
        "a connection that lived through BGSAVE"
    );
    assert_eq!(
        cli(&["get", "k"]).trim(),
        "hello over smc",
        "a connection after BGSAVE"
    );
    drop(keep_in);
    let _ = keep.wait();
    // redis-cli 9 times, the benchmark's 50 clients (and its probe), each counted by both ends.
    assert_smc_since(&smcd, before, 2 * 59);
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

/// nginx as it runs by default, a master that listens and workers it forks that accept
/// (two here, as user nobody; epoll edge-triggered with `EPOLLEXCLUSIVE` on the listener,
/// sendfile, TCP_CORK, accept4 non-blocking), with wrk (threads, non-blocking connect) over
/// keep-alive and `Connection: close`, and curl for the bytes. Each worker accepts with an
/// engine of its own (`hooks::local_listener`) and tells SMC clients apart by the SMC option,
/// so smcd runs the option program for this test's processes.
#[test]
fn nginx_and_wrk_over_smc_d() {
    let test = "nginx_and_wrk_over_smc_d";
    if !need(test, &["nginx", "wrk", "curl"]) {
        return;
    }
    let nginx = "nginx";
    let Some(smcd) = option_smcd(test) else {
        return;
    };
    smcd.require_control_plane();
    let (dir, data) = site("preload-nginx", 64 * 1024 + 3);
    std::fs::write(dir.join("4k.html"), &data[..4096]).unwrap();
    // The workers run as nobody: they must read the files.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let port = free_port();
    let conf = dir.join("nginx.conf");
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    std::fs::write(
        &conf,
        format!(
            "daemon off; worker_processes 2; user nobody nogroup; pid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\n\
             events {{ worker_connections 4096; use epoll; }}\n\
             http {{ access_log off; sendfile on; tcp_nopush on; keepalive_requests 1000000;\n\
             client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;\n\
             uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;\n\
             server {{ listen 127.0.0.1:{port}; root {d}; }} }}\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let before = counts(&smcd);
    let server = Server::new(
        smc_run(
            &smcd,
            nginx,
            &["-c", conf.to_str().unwrap(), "-p", dir.to_str().unwrap()],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    wait_listening(port);
    let url = format!("http://127.0.0.1:{port}/blob");
    assert!(
        curl(&smcd, std::slice::from_ref(&url), true) == data,
        "curl: bytes differ"
    );
    let small = format!("http://127.0.0.1:{port}/4k.html");
    for close in [false, true] {
        // A long per-request timeout: on a loaded machine a 2 s answer is slow, not an error.
        let mut args = vec!["-t", "2", "-c", "50", "-d", "2", "--timeout", "30s"];
        if close {
            args.extend(["-H", "Connection: close"]);
        }
        args.push(&small);
        // With SMC_DEBUG the library says what wrk's reads got when not data or EAGAIN
        // (an end of stream, an errno, a panic), so a "Socket errors" failure shows its cause.
        let mut w = smc_run(&smcd, "wrk", &args);
        w.env("SMC_DEBUG", "1");
        let out = run_ok(w, 60);
        let out: String = out
            .lines()
            .filter(|l| !l.contains("connect fd"))
            .map(|l| format!("{l}\n"))
            .collect();
        println!("wrk {args:?}:\n{out}");
        assert!(!out.contains("Socket errors"), "wrk saw errors: {out}");
        assert!(!out.contains("Non-2xx"), "{out}");
        assert!(out.contains("Requests/sec"), "{out}");
    }
    // curl, 50 keep-alive connections, then at least as many with Connection: close.
    assert_smc_since(&smcd, before, 2 * 101);
    drop(server);
    let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
    assert!(!log.contains("[alert]") && !log.contains("[crit]"), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// sockperf ping-pong and throughput (recvfrom/sendto with MSG_DONTWAIT|MSG_NOSIGNAL), and
/// iperf3 (select loop; reverse and four parallel streams).
#[test]
fn sockperf_and_iperf3_over_smc_d() {
    let test = "sockperf_and_iperf3_over_smc_d";
    if !need(test, &["sockperf", "iperf3"]) {
        return;
    }
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    let before = counts(&smcd);
    let port = free_port().to_string();
    let sr = Server::new(
        smc_run(
            &smcd,
            "sockperf",
            &["sr", "--tcp", "-i", "127.0.0.1", "-p", &port],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    wait_listening(port.parse().unwrap());
    for (mode, size) in [("pp", "14"), ("pp", "1400"), ("tp", "1400")] {
        let out = run_ok(
            smc_run(
                &smcd,
                "sockperf",
                &[
                    mode,
                    "--tcp",
                    "-i",
                    "127.0.0.1",
                    "-p",
                    &port,
                    "-t",
                    "1",
                    "-m",
                    size,
                    // (sockperf fails past its message rate, 600,000 a second by default)
                    "--mps",
                    "10000000",
                ],
            ),
            60,
        );
        assert!(out.contains("Summary:"), "{out}");
        assert!(!out.contains("ERROR"), "{out}");
    }
    drop(sr);
    let port = free_port().to_string();
    let s = Server::new(
        smc_run(&smcd, "iperf3", &["-s", "-p", &port])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_listening(port.parse().unwrap());
    for extra in [&[][..], &["-R"][..], &["-P", "4"][..]] {
        let out = run_ok(
            smc_run(
                &smcd,
                "iperf3",
                &[&["-c", "127.0.0.1", "-p", &port, "-t", "1"][..], extra].concat(),
            ),
            60,
        );
        assert!(out.contains("receiver"), "{out}");
    }
    drop(s);
    // sockperf: 3 runs; iperf3: a control and a data connection per stream, 1+1+4 streams.
    assert_smc_since(&smcd, before, 2 * (3 + 3 + 6));
}

/// qperf (its server forks a child per test that takes over the accepted control
/// connection and makes the data connection; SIGALRM without SA_RESTART ends each test):
/// tcp_lat and tcp_bw from 1 B to 64 KiB, five runs in a row with both ends preloaded, each
/// measuring something; then a plain qperf against the preloaded server, over plain TCP.
/// (A forked child once missed its peer's bell, which only the shared bell channel carried,
/// and timed out in about one run of five.)
#[test]
fn qperf_over_smc_d() {
    let test = "qperf_over_smc_d";
    if !need(test, &["qperf"]) {
        return;
    }
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    let before = counts(&smcd);
    let port = free_port().to_string();
    let server = Server::new(
        smc_run(&smcd, "qperf", &["--listen_port", &port])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_listening(port.parse().unwrap());
    let number = |out: &str, key: &str| -> f64 {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap_or_else(|| panic!("no {key} in {out}"));
        line.split('=')
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let runs = 5;
    for i in 0..runs {
        let size = ["1", "64", "1K", "16K", "64K"][i];
        let out = run_ok(
            smc_run(
                &smcd,
                "qperf",
                &[
                    "-lp",
                    &port,
                    "-t",
                    "1",
                    // qperf's own timeout for its exchanges (5 s) is short for a loaded
                    // machine: a late message is slow, a lost one still fails at 20 s.
                    "-to",
                    "20",
                    "-m",
                    size,
                    "127.0.0.1",
                    "tcp_lat",
                    "tcp_bw",
                ],
            ),
            60,
        );
        assert!(number(&out, "latency") > 0.0, "{out}");
        assert!(number(&out, "bw") > 0.0, "{out}");
    }
    // Per test a control and a data connection, counted at both ends.
    assert_smc_since(&smcd, before, (runs * 2 * 2 * 2) as u64);
    let mid = counts(&smcd);
    let mut plain = Command::new("qperf");
    plain.args(["-lp", &port, "-t", "1", "127.0.0.1", "tcp_lat"]);
    let out = run_ok(plain, 60);
    assert!(number(&out, "latency") > 0.0, "{out}");
    drop(server);
    let after = counts(&smcd);
    assert_eq!(after.0, mid.0, "a plain qperf made an SMC connection");
    assert!(
        after.1 >= mid.1 + 2,
        "the server's fallbacks: {mid:?} -> {after:?}"
    );
}

/// smcd with the SMC option program attached to this test's cgroup (its processes and the
/// programs it starts), or `None` after a skip.
fn option_smcd(test: &str) -> Option<Smcd> {
    let cg = match common::test_cgroup(smcd_engine::bpf::loader::default_cgroup(), "preload") {
        Ok(cg) => cg.clone(),
        Err(why) => {
            common::skip_unless(test, false, why);
            return None;
        }
    };
    Some(Smcd::start_with(
        BINS,
        &[&format!("--bpf-cgroup={}", cg.display())],
    ))
}

/// A non-blocking connect returns `EINPROGRESS` while the handshake runs (the program's
/// descriptor meanwhile neither readable nor writable, as TCP's in `SYN_SENT`). Here the
/// server is an SMC listener by the SYN option that answers the Proposal only after 300 ms,
/// with a Decline: the connection falls back to TCP after the program registered the
/// descriptor with epoll (the registration is moved to the TCP socket) or while it waits in
/// poll (which returns), and the program then talks plain TCP over it.
#[test]
fn nonblocking_connect_falls_back_after_einprogress() {
    use smc_proto::clc::{ClcMessage, Decline, ReasonCode, SMC_V2};
    use std::io::{Read, Write};
    let test = "nonblocking_connect_falls_back_after_einprogress";
    if !need(test, &["python3"]) {
        return;
    }
    let Some(smcd) = option_smcd(test) else {
        return;
    };
    smcd.require_control_plane();
    let e = smcd.engine();
    let Some(a) = e.attached() else {
        panic!("smcd is up: the engine attaches");
    };
    let Some(maps) = a.session.option_path() else {
        common::skip_unless(test, false, "smcd has no SMC option program here");
        return;
    };
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let _keys = maps.register_listening_socket(&l).unwrap();
    let port = l.local_addr().unwrap().port();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload/nb_connect.py");
    for how in ["epoll", "poll"] {
        let client = smc_run(
            &smcd,
            python(),
            &[script.to_str().unwrap(), &port.to_string(), how],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let proposal = common::read_clc(&s).unwrap().unwrap();
        assert!(matches!(proposal, ClcMessage::Proposal(_)), "{proposal:?}");
        std::thread::sleep(Duration::from_millis(300));
        s.write_all(&ClcMessage::Decline(Decline::new(ReasonCode::MEM, SMC_V2)).to_vec())
            .unwrap();
        let mut ping = [0u8; 4];
        s.read_exact(&mut ping).unwrap();
        assert_eq!(&ping, b"ping", "{how}: the client's bytes over TCP");
        s.write_all(b"pong").unwrap();
        let out = common::within(Duration::from_secs(30), move || client.wait_with_output())
            .expect("the client did not finish")
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{how}: {text}");
        let waited: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("PONG "))
            .unwrap_or_else(|| panic!("{how}: {text}"))
            .parse()
            .unwrap();
        // It waited for the Decline: the connect did not finish before returning.
        assert!(
            waited >= 200,
            "{how}: writable after {waited} ms, before the Decline"
        );
    }
}

/// A non-blocking connect still under way when the program forks behaves as TCP's: one socket
/// in both processes, finished by whichever uses it. The server is an SMC listener by the SYN
/// option in event-loop mode (its handshakes advance only in `accept`), which the test calls
/// only once the program said it forked: the Proposal is unanswered at the fork. The process
/// that started the connect answers the Accept with a Decline (an SMC connection made in one
/// process after the fork could not be used by the other), both ends fall back to TCP, and the
/// finisher (the child while the parent closed its copy, then the parent while the child
/// closed its own) sees its descriptor become writable, `SO_ERROR` 0, and 256 KiB go there and
/// back byte for byte.
#[test]
fn nonblocking_connect_in_flight_across_fork() {
    use smcd_engine::SmcListener;
    use std::io::{BufRead, Read, Write};
    let test = "nonblocking_connect_in_flight_across_fork";
    if !need(test, &["python3"]) {
        return;
    }
    let Some(smcd) = option_smcd(test) else {
        return;
    };
    smcd.require_control_plane();
    let e = smcd.engine();
    let Some(a) = e.attached() else {
        panic!("smcd is up: the engine attaches");
    };
    if a.session.option_path().is_none() {
        common::skip_unless(test, false, "smcd has no SMC option program here");
        return;
    }
    let l = SmcListener::bind_with(&e, "127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let ready = l.readiness_fd().unwrap().try_clone_to_owned().unwrap();
    let port = l.local_addr().unwrap().port();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload/fork_connect.py");
    const LEN: usize = 256 * 1024;
    for who in ["child", "parent"] {
        let mut client = smc_run(
            &smcd,
            python(),
            &[
                script.to_str().unwrap(),
                &port.to_string(),
                who,
                &LEN.to_string(),
            ],
        )
        .env("SMC_DEBUG", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        let mut out = BufReader::new(client.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "FORKED", "{who}: {line}");
        // Only now does the listener answer the Proposal (and then take the Decline).
        let mut s = common::wait_for("the connection from the listener", || {
            let mut pfd = [rustix::event::PollFd::new(
                &ready,
                rustix::event::PollFlags::IN,
            )];
            let t = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 100_000_000,
            };
            let _ = rustix::event::poll(&mut pfd, Some(&t));
            match l.accept() {
                Ok((s, _)) => Some(s),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
                Err(e) => panic!("{who}: accept: {e}"),
            }
        });
        assert!(
            !s.is_smc(),
            "{who}: the connect across the fork ends in TCP"
        );
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut buf = vec![0u8; 65536];
        let mut echoed = 0;
        while echoed < LEN {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "{who}: end of stream after {echoed} bytes");
            s.write_all(&buf[..n]).unwrap();
            echoed += n;
        }
        let rest = common::within(Duration::from_secs(60), move || {
            let mut rest = String::new();
            let _ = out.read_to_string(&mut rest);
            let mut err = String::new();
            let _ = client.stderr.take().unwrap().read_to_string(&mut err);
            (client.wait().unwrap(), rest, err)
        })
        .expect("the client did not finish");
        let (status, rest, err) = rest;
        assert!(status.success(), "{who}: {rest}{err}");
        assert!(rest.contains(&format!("OK {LEN}")), "{who}: {rest}{err}");
        if who == "child" {
            // The child took the TCP socket over from its copy of the connect.
            assert!(err.contains("TCP (finished by pid"), "{who}: {err}");
        }
        let mut end = [0u8; 1];
        assert_eq!(
            s.read(&mut end).unwrap(),
            0,
            "{who}: the finisher closed it"
        );
    }
}

/// `exec` with an SMC connection that is not close-on-exec, as inetd runs a service: a Python
/// server under smc-run accepts two SMC-D connections, fails to exec a program that does not
/// exist (the connection still works there after it), makes the first its stdin and stdout
/// and `os.execv`s a Python program that echoes stdin to stdout. The connection is handed to a
/// keeper process across the exec: 1 MiB goes there and back byte for byte, the end of stream
/// goes both ways (the program sees it after our shutdown, we see it when it exits). The
/// second connection and the listener were close-on-exec: they are gone in the new program,
/// and the second connection ends for us. Once with the new program preloaded as well, once
/// with `LD_PRELOAD` dropped from its environment (`execve`); then through the C library's
/// variadic `execl`, `execlp` (preloaded) and `execle` (not), called through ctypes, which the
/// library defines itself (the C library's call `execve` where no hook sees it); and once after
/// closing every number up to the descriptor limit one at a time (`closeloop`), which stops
/// below the engine's band because the program is told the limit below it (`limits`).
#[test]
fn exec_hands_an_inherited_connection_to_the_new_program() {
    let test = "exec_hands_an_inherited_connection_to_the_new_program";
    if !need(test, &["python3"]) {
        return;
    }
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    for how in [
        "preloaded",
        "plain",
        "execl",
        "execle",
        "execlp",
        "closeloop",
    ] {
        exec_inetd_style(&smcd, how);
    }
}

/// A Python server script of `tests/preload` under smc-run (with `SMC_DEBUG`), handing
/// connections to `exec_echo.py` as `how` says; it prints its port first.
fn script_server(
    smcd: &Smcd,
    script: &str,
    how: &str,
) -> (Child, BufReader<std::process::ChildStdout>, u16) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload");
    let mut server = smc_run(
        smcd,
        python(),
        &[
            dir.join(script).to_str().unwrap(),
            dir.join("exec_echo.py").to_str().unwrap(),
            how,
        ],
    )
    .env("SMC_DEBUG", "1")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let port: u16 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{script} port: {line:?}"));
    (server, out, port)
}

/// Writes `len` pattern bytes (seed `seed`) to `c`, shuts its write side, and reads
/// everything back (an echo program at the far end): what was sent and what came back.
fn echo_through(c: &smcd_engine::SmcStream, len: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    use std::io::{Read, Write};
    let mut rng = common::Rng::new(seed);
    let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let got = std::thread::scope(|sc| {
        let w = sc.spawn(|| {
            (&*c).write_all(&data).unwrap();
            c.shutdown(std::net::Shutdown::Write).unwrap();
        });
        let mut got = Vec::new();
        (&*c).read_to_end(&mut got).unwrap();
        w.join().unwrap();
        got
    });
    (data, got)
}

/// One run of [`exec_hands_an_inherited_connection_to_the_new_program`]: the new program
/// loads the library too (`preloaded`) or not (`plain`: `LD_PRELOAD` dropped from its
/// environment; the keeper needs nothing of it).
fn exec_inetd_style(smcd: &Smcd, how: &str) {
    use smcd_engine::SmcStream;
    use std::io::Read;
    let (mut server, mut out, port) = script_server(smcd, "exec_server.py", how);
    let mut line = String::new();
    let e = smcd.engine();
    let c = SmcStream::connect_with(&e, ("127.0.0.1", port)).unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ACCEPTED", "{how}");
    let mut d = SmcStream::connect_with(&e, ("127.0.0.1", port)).unwrap();
    assert!(c.is_smc() && d.is_smc(), "{how}: both SMC-D");
    // The close-on-exec one ends for us (its TCP connection closed with the exec).
    d.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    match d.read(&mut [0u8; 16]) {
        Ok(0) => {}
        Err(e)
            if !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        r => panic!("the close-on-exec connection: {r:?}"),
    }
    let mut hello = [0u8; 11];
    (&c).read_exact(&mut hello).unwrap();
    assert_eq!(&hello, b"still here\n", "after the failed exec");
    const LEN: usize = 1 << 20;
    let (data, got) = echo_through(&c, LEN, 13);
    assert!(
        got == data,
        "echo of {} bytes differs ({} back)",
        LEN,
        got.len()
    );
    let (status, err) = common::within(Duration::from_secs(60), move || {
        let mut err = String::new();
        let _ = server.stderr.take().unwrap().read_to_string(&mut err);
        (server.wait().unwrap(), err)
    })
    .expect("the exec'd program did not finish");
    assert!(status.success(), "{how}: {err}");
    assert!(err.contains(&format!("ECHOED {LEN}")), "{how}: {err}");
    assert!(err.contains("handed to a keeper"), "{how}: {err}");
    let loaded = if matches!(how, "plain" | "execle") {
        "no"
    } else {
        "yes"
    };
    assert!(err.contains(&format!("PRELOADED {loaded}")), "{how}: {err}");
}

/// A listening socket that is not close-on-exec goes on across `exec` as the socket itself
/// (nginx's binary upgrade, socket activation, inetd): a Python server listens under smc-run
/// and `os.execv`s a program that accepts on the inherited number. With the new program
/// preloaded, a preloaded client's connection is SMC-D (the new image made the socket an SMC
/// listener again); with `LD_PRELOAD` dropped from its environment it is plain TCP (the old
/// image withdrew the listener before the `exec`, so no Proposal reaches a program that would
/// take it for data); the bytes are exact both times, and the close-on-exec listener is gone.
/// Then a forked child execs the program and the server closes its listener after the exec
/// (the last holder here): the socket goes on listening there, SMC-D. Once with smcd's
/// listener table (intents) and once with the SMC option program.
#[test]
fn exec_passes_a_listener_to_the_new_program() {
    let test = "exec_passes_a_listener_to_the_new_program";
    if !need(test, &["python3"]) {
        return;
    }
    {
        let smcd = Smcd::start(BINS);
        smcd.require_control_plane();
        for how in ["preloaded", "plain", "forked"] {
            exec_listener(&smcd, how);
        }
    }
    let Some(smcd) = option_smcd(test) else {
        return;
    };
    smcd.require_control_plane();
    for how in ["preloaded", "plain", "forked"] {
        exec_listener(&smcd, how);
    }
}

/// One run of [`exec_passes_a_listener_to_the_new_program`].
fn exec_listener(smcd: &Smcd, how: &str) {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload/exec_listener.py");
    let script = script.to_str().unwrap();
    let mut server = smc_run(smcd, python(), &[script, "serve", how])
        .env("SMC_DEBUG", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    // A failed check leaves nothing serving ("forked": the exec'd program is the server's child).
    let _group = GroupGuard(server.id() as i32);
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let ports: Vec<u16> = line
        .split_whitespace()
        .map(|p| p.parse().unwrap_or_else(|_| panic!("ports: {line:?}")))
        .collect();
    let (port, gone) = (ports[0], ports[1]);
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "READY", "{how}: the new program did not start");
    // "forked": the server closes its copy of the close-on-exec listener once it has seen the
    // child's exec, which may be after the new program said READY.
    wait_long(&format!("{how}: the close-on-exec listener to go"), || {
        (!listening(gone)).then_some(())
    });
    let before = counts(smcd);
    const LEN: usize = 1 << 20;
    let client = run_ok(
        smc_run(
            smcd,
            python(),
            &[script, "client", &port.to_string(), &LEN.to_string()],
        ),
        120,
    );
    assert!(client.contains("OK"), "{how}: the client says {client}");
    let (status, err) = common::within(Duration::from_secs(60), move || {
        let mut err = String::new();
        let _ = server.stderr.take().unwrap().read_to_string(&mut err);
        (server.wait().unwrap(), err)
    })
    .expect("the exec'd program did not finish");
    assert!(status.success(), "{how}: {err}");
    assert!(err.contains(&format!("ECHOED {LEN}")), "{how}: {err}");
    assert!(
        err.contains("goes on as its listening socket"),
        "{how}: {err}"
    );
    if how == "plain" {
        assert!(err.contains("PRELOADED no"), "{how}: {err}");
        let after = counts(smcd);
        assert_eq!(
            after.0, before.0,
            "{how}: an SMC connection to a plain program\n{err}"
        );
    } else {
        assert!(err.contains("PRELOADED yes"), "{how}: {err}");
        assert!(err.contains("an inherited TCP listener"), "{how}: {err}");
        assert_smc_since(smcd, before, 1);
    }
}

/// `posix_spawn` runs its `execve` inside the C library, where no hook sees it: for the call,
/// the numbers of the connections the new program can see are an `AF_UNIX` socket whose other
/// end a keeper serves once the server lets go of the connection. A Python server accepts
/// two SMC-D connections and starts a Python echo with the first as its stdin and stdout, once
/// through file actions that `dup2` it there (`os.posix_spawn`) and once by making 0 and 1 the
/// connection before `os.posix_spawnp`. The server still holds the connection and talks over it
/// first (the connection's state is in the server's memory, so the keeper is forked only when
/// the server let go of it: none of the server's bytes go astray); after it closed them, 1 MiB
/// goes through the echo and back byte for byte, with end of stream both ways. The other
/// connection and the listener (close-on-exec) are not in the new program.
#[test]
fn posix_spawn_hands_a_connection_to_the_new_program() {
    let test = "posix_spawn_hands_a_connection_to_the_new_program";
    if !need(test, &["python3"]) {
        return;
    }
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    for how in ["dup2", "inherit"] {
        spawn_inetd_style(&smcd, how);
    }
}

/// One run of [`posix_spawn_hands_a_connection_to_the_new_program`].
fn spawn_inetd_style(smcd: &Smcd, how: &str) {
    use smcd_engine::SmcStream;
    use std::io::{Read, Write};
    let (mut server, mut out, port) = script_server(smcd, "spawn_server.py", how);
    let mut line = String::new();
    let mut err = BufReader::new(server.stderr.take().unwrap());
    let e = smcd.engine();
    let c = SmcStream::connect_with(&e, ("127.0.0.1", port)).unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ACCEPTED", "{how}");
    let d = SmcStream::connect_with(&e, ("127.0.0.1", port)).unwrap();
    assert!(c.is_smc() && d.is_smc(), "{how}: both SMC-D");
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut hello = [0u8; 12];
    (&c).read_exact(&mut hello).unwrap();
    assert_eq!(&hello, b"parent here\n", "{how}: the parent's line");
    (&c).write_all(b"for the parent\n").unwrap();
    let mut log = String::new();
    loop {
        let mut l = String::new();
        let n = err.read_line(&mut l).unwrap();
        assert!(n > 0, "{how}: the server ended before it closed\n{log}");
        log.push_str(&l);
        if l.trim() == "PARENT CLOSED" {
            break;
        }
    }
    const LEN: usize = 1 << 20;
    let (data, got) = echo_through(&c, LEN, 17);
    assert!(
        got == data,
        "{how}: echo of {} bytes differs ({} back, starting {:?})\n{log}",
        LEN,
        got.len(),
        String::from_utf8_lossy(&got[..got.len().min(40)])
    );
    let (status, rest) = common::within(Duration::from_secs(60), move || {
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
        (server.wait().unwrap(), rest)
    })
    .expect("the server did not finish");
    log.push_str(&rest);
    assert!(status.success(), "{how}: {log}");
    assert!(log.contains(&format!("ECHOED {LEN}")), "{how}: {log}");
    assert!(log.contains("PRELOADED yes"), "{how}: {log}");
    assert!(
        log.contains("go to the new program through a socket"),
        "{how}: {log}"
    );
    assert!(
        log.contains("a connection given to a spawned program: handed to a keeper"),
        "{how}: {log}"
    );
    drop(d);
}

/// `SO_LINGER` `{1, 0}` makes close an abort, as TCP's close then sends a reset: the peer's
/// next read fails with `ECONNRESET` (`peer_conn_abort`), where an ordinary close gives it the
/// bytes and then end of stream (`tests/preload/linger_reset.py`, both ends in one Python
/// process under smc-run, both connections SMC-D).
#[test]
fn so_linger_zero_close_is_an_abort() {
    let test = "so_linger_zero_close_is_an_abort";
    if !need(test, &["python3"]) {
        return;
    }
    let smcd = Smcd::start(BINS);
    smcd.require_control_plane();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload/linger_reset.py");
    let before = counts(&smcd);
    let out = run_ok(smc_run(&smcd, python(), &[script.to_str().unwrap()]), 120);
    assert!(out.contains("OK"), "{out}");
    assert_smc_since(&smcd, before, 2);
}

/// nginx's binary upgrade (`USR2`: the master forks and execs its binary again, passing its
/// listening sockets' numbers in `NGINX`; then `QUIT` to the old master) under smc-run, with
/// the SMC option program: the new master gets the listening socket and serves it, byte for
/// byte. nginx gives the new binary an environment of `TZ`, `NGINX` and its `env` lines only:
/// with `env LD_PRELOAD; env SMCD_SOCKET;` in the configuration the new master loads the
/// library and its connections are SMC-D again (after the old master quit, which leaves the
/// new master's registration alone); without them it is plain nginx, and its connections are
/// plain TCP (the listener was withdrawn at the `exec`).
#[test]
fn nginx_binary_upgrade_keeps_its_listener() {
    let test = "nginx_binary_upgrade_keeps_its_listener";
    if !need(test, &["nginx", "curl"]) {
        return;
    }
    let Some(smcd) = option_smcd(test) else {
        return;
    };
    smcd.require_control_plane();
    // The master execs its argv[0]: a path.
    let nginx = std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("nginx"))
                .find(|f| f.is_file())
        })
        .expect("nginx on PATH");
    for preload_new in [true, false] {
        nginx_upgrade(&smcd, &nginx, preload_new);
    }
}

/// Polls `f` until it returns `Some` (processes starting and stopping on a busy machine: the
/// bound only turns a hang into a failure).
fn wait_long<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops the daemonized masters left in a directory (a failed run leaves them serving) and
/// removes it.
struct StopNginx(PathBuf);

impl Drop for StopNginx {
    fn drop(&mut self) {
        for f in ["nginx.pid", "nginx.pid.oldbin"] {
            if let Some(pid) = pid_in(&self.0.join(f)) {
                // SAFETY: kill(2); TERM makes an nginx master stop its workers.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pid_in(file: &Path) -> Option<i32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// One run of [`nginx_binary_upgrade_keeps_its_listener`].
fn nginx_upgrade(smcd: &Smcd, nginx: &Path, preload_new: bool) {
    let (dir, data) = site("preload-nginx-upgrade", 64 * 1024 + 5);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    let port = free_port();
    let conf = dir.join("nginx.conf");
    let env = if preload_new {
        "env LD_PRELOAD; env SMCD_SOCKET;"
    } else {
        ""
    };
    std::fs::write(
        &conf,
        format!(
            "daemon on; worker_processes 1; user nobody nogroup; pid {d}/nginx.pid;\n\
             error_log {d}/error.log notice; {env}\n\
             events {{ worker_connections 256; use epoll; }}\n\
             http {{ access_log off; sendfile on;\n\
             client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;\n\
             uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;\n\
             server {{ listen 127.0.0.1:{port}; root {d}; }} }}\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let pidfile = dir.join("nginx.pid");
    let _stop = StopNginx(dir.clone());
    // Daemonized: nginx ignores USR2 in a master whose parent is still the one it started
    // with (the old binary must not be running the upgrade already).
    run_ok(
        smc_run(
            smcd,
            nginx.to_str().unwrap(),
            &["-c", conf.to_str().unwrap(), "-p", dir.to_str().unwrap()],
        ),
        60,
    );
    let old = wait_long("nginx's pid file", || pid_in(&pidfile));
    wait_listening(port);
    let url = format!("http://127.0.0.1:{port}/blob");
    let before = counts(smcd);
    assert!(
        curl(smcd, std::slice::from_ref(&url), true) == data,
        "curl before the upgrade"
    );
    assert_smc_since(smcd, before, 1);
    // SAFETY: kill(2) on the master we started.
    unsafe { libc::kill(old, libc::SIGUSR2) };
    let new = wait_long("the new master's pid file", || {
        pid_in(&pidfile).filter(|p| *p != old && alive(*p))
    });
    // The new master has started its worker when the old one's pid file is renamed and the
    // new one written; then the old master goes, gracefully.
    // SAFETY: as above.
    unsafe { libc::kill(old, libc::SIGQUIT) };
    wait_long("the old master to quit", || (!alive(old)).then_some(()));
    let maps = std::fs::read_to_string(format!("/proc/{new}/maps")).unwrap_or_default();
    assert_eq!(
        maps.contains("libsmc_preload"),
        preload_new,
        "the new master loads the library: {preload_new}"
    );
    let before = counts(smcd);
    for _ in 0..3 {
        assert!(
            curl(smcd, std::slice::from_ref(&url), true) == data,
            "curl after the upgrade (new binary preloaded: {preload_new})"
        );
    }
    if preload_new {
        assert_smc_since(smcd, before, 3);
    } else {
        let after = counts(smcd);
        assert_eq!(after.0, before.0, "SMC connections to a plain nginx");
    }
    // SAFETY: as above.
    unsafe { libc::kill(new, libc::SIGQUIT) };
    wait_long("the new master to quit", || (!alive(new)).then_some(()));
    let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
    assert!(!log.contains("[alert]") && !log.contains("[crit]"), "{log}");
}

/// CPython's `subprocess` under smc-run: its `vfork` (a `fork` while the process holds SMC
/// descriptors) child closes descriptors, `dup2`s and execs through the library's hooks, and
/// must change nothing of the parent's (before, its `close_range` emptied the parent's table
/// and aborted the child). The parent's SMC-D connection works after `subprocess.run` and its
/// listener takes another; a connection given to the child as its stdin and stdout carries
/// 1 MiB through `cat` and back (before, the child's copy was a dead socket and this hung).
#[test]
fn subprocess_keeps_the_parents_connections_and_gives_one_to_its_child() {
    python_check(
        "subprocess_keeps_the_parents_connections_and_gives_one_to_its_child",
        "subprocess_check.py",
        "OK",
        3,
    );
}
