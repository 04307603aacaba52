//! The tokio example runs end to end over SMC-D: `AsyncFd` (edge-triggered epoll, readiness
//! forgotten only on `WouldBlock`) on the readiness descriptors of non-blocking streams, of
//! the listener, and of non-blocking connects.
//!
//! The example (`smcd-engine/examples/tokio_echo.rs`) is compiled into this test and run in a
//! child process (this test binary re-executed), so no test has to build it with cargo, and
//! the child's process-wide engine uses this test's smcd.

mod common;

#[path = "../../smcd-engine/examples/tokio_echo.rs"]
#[allow(dead_code)] // the example's own `main`; the child calls `run`
mod tokio_echo;

use common::{BINS, Smcd};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
#[ignore = "child process entry, started by the test"]
fn tokio_echo_child() {
    let Ok(args) = std::env::var("SMC_TOKIO_ECHO_ARGS") else {
        return;
    };
    let a: Vec<&str> = args.split_whitespace().collect();
    let (clients, messages) = (a[0].parse().unwrap(), a[1].parse().unwrap());
    match a.get(2) {
        Some(&"mt") => tokio_echo::run_multi_thread(clients, messages),
        _ => tokio_echo::run(clients, messages),
    }
    .expect("the example");
}

/// Runs the example with `args` against a fresh smcd; its stdout. A child that does not end
/// within a generous bound is killed and fails the test (a lost wake-up hangs it).
fn run_example(args: &str) -> String {
    let smcd = Smcd::start(BINS);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "tokio_echo_child",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env("SMC_TOKIO_ECHO_ARGS", args)
        .env("SMCD_SOCKET", &smcd.socket)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the example");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let readers = (
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        }),
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        }),
    );
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (readers.0.join().unwrap(), readers.1.join().unwrap());
    match status {
        Some(st) => assert!(st.success(), "example failed ({st}): {stdout}\n{stderr}"),
        None => panic!("example did not finish in 240 s: {stdout}\n{stderr}"),
    }
    stdout
}

/// Asserts every one of `clients` clients went over SMC-D with all `messages` echoes, the
/// server saw SMC-D too, and the writers did find the ring full (so writable readiness was
/// waited for, not just assumed).
fn check(stdout: &str, clients: usize, messages: usize) {
    assert_eq!(
        stdout
            .matches(&format!(
                "client: {messages} echoes of {messages} over SMC-D"
            ))
            .count(),
        clients,
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "server: {clients} of {clients} connections over SMC-D"
        )),
        "{stdout}"
    );
    assert!(stdout.contains("all echoes matched"), "{stdout}");
    let writes_blocked: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("would block: "))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|w| w.strip_suffix(" writes"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no would-block line: {stdout}"));
    assert!(
        writes_blocked > 0,
        "messages larger than the DMB must have filled it: {stdout}"
    );
}

#[test]
fn tokio_echo_example_over_smcd_current_thread() {
    let out = run_example("6 300");
    check(&out, 6, 300);
}

#[test]
fn tokio_echo_example_over_smcd_multi_thread() {
    let out = run_example("6 300 mt");
    check(&out, 6, 300);
}

/// The obvious way to wait for a non-blocking connect with tokio: `AsyncFd` owning the
/// `SmcConnecting` (it is `AsFd`/`AsRawFd` for this), `try_finish` until the stream comes,
/// then drop the `AsyncFd`. Dropping it deregisters the descriptor it asks its inner value
/// for (`as_raw_fd`), so that must still work after the connect finished.
#[test]
fn async_fd_owning_smc_connecting_survives_the_finish() {
    use smcd_engine::SmcStream;
    use tokio::io::Interest;
    use tokio::io::unix::AsyncFd;
    let smcd = Smcd::start(BINS);
    let (se, ce) = (smcd.engine(), smcd.engine());
    let l = common::listen(&se);
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || l.accept().map(|(s, _)| s.is_smc()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stream = rt.block_on(async {
        let c = SmcStream::connect_nonblocking_with(&ce, addr)?;
        // SAFETY: what this test checks: the connect's descriptor stays open and the same
        // for as long as the `AsyncFd` owns the `SmcConnecting`.
        let mut afd =
            unsafe { AsyncFd::register_with_interest(c, Interest::READABLE | Interest::WRITABLE) }?;
        let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = afd.get_mut().try_finish()? {
                drop(afd);
                return std::io::Result::Ok(s);
            }
            let wants_read = afd.get_ref().wants_read();
            let ready = async {
                let mut g = if wants_read {
                    afd.readable().await?
                } else {
                    afd.writable().await?
                };
                g.clear_ready();
                std::io::Result::Ok(())
            };
            tokio::time::timeout_at(give_up, ready)
                .await
                .expect("the connect did not finish")?;
        }
    });
    let stream = stream.expect("connect");
    assert!(stream.is_smc(), "{}", stream.mode());
    assert!(server.join().unwrap().unwrap());
}
