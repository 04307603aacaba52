//! The shared harness of the multi-process tests (the integration tests of `smc-tools`, which
//! own the binaries): a real `smcd` per test ([`Smcd`]), `smcctl` runs ([`Bins::smcctl`],
//! [`Run`]), child processes that are the test binary re-executed with a role ([`Peer`],
//! [`Conns`], [`child_main`]), network namespaces ([`Netns`]), the byte pattern every transfer
//! is checked against ([`pattern`]), leak probes over `/proc` ([`dmb_resources`]), and what a
//! test does when a tool or privilege it needs is missing ([`skip_unless`]: fail under
//! `CI=true`, print `SKIPPED` and return otherwise).
//!
//! Cargo sets `CARGO_BIN_EXE_<name>` only while it compiles the integration tests of the
//! package that owns the binary, so this library cannot name the binaries itself: a test
//! expands [`bins!`] and hands the [`Bins`] to the harness.

use smcd_engine::settings::Settings;
use smcd_engine::{Engine, EngineConfig, SmcListener, SmcStream};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------------
// The binaries.

/// Paths of the workspace's binaries, as cargo built them for the tests of `smc-tools`.
#[derive(Debug, Clone, Copy)]
pub struct Bins {
    /// `smcd`.
    pub smcd: &'static str,
    /// `smcctl`.
    pub smcctl: &'static str,
    /// `smc-perf`.
    pub smc_perf: &'static str,
    /// `smc-cat`.
    pub smc_cat: &'static str,
}

/// The [`Bins`] of the test crate this is expanded in (an integration test of `smc-tools`):
/// `env!("CARGO_BIN_EXE_…")` is evaluated there, where cargo sets it.
#[macro_export]
macro_rules! bins {
    () => {
        $crate::Bins {
            smcd: env!("CARGO_BIN_EXE_smcd"),
            smcctl: env!("CARGO_BIN_EXE_smcctl"),
            smc_perf: env!("CARGO_BIN_EXE_smc-perf"),
            smc_cat: env!("CARGO_BIN_EXE_smc-cat"),
        }
    };
}

impl Bins {
    /// Runs smcctl with `args` (split on blanks) and the given socket (or none).
    pub fn smcctl(&self, socket: Option<&Path>, args: &str) -> Run {
        self.smcctl_args(socket, &args.split_whitespace().collect::<Vec<_>>())
    }

    /// Runs smcctl with exactly these arguments.
    pub fn smcctl_args(&self, socket: Option<&Path>, args: &[&str]) -> Run {
        let mut cmd = Command::new(self.smcctl);
        cmd.env_remove("SMCD_SOCKET").env("RUST_BACKTRACE", "1");
        if let Some(s) = socket {
            cmd.env("SMCD_SOCKET", s);
        }
        let out: Output = cmd.args(args).output().expect("run smcctl");
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

// ------------------------------------------------------------------------------------------
// The process.

/// Raises the soft descriptor limit to the hard one (1000 connections need thousands).
pub fn raise_nofile() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    if let Some(max) = lim.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(max),
                maximum: Some(max),
            },
        );
    }
}

/// Whether we run as root (namespaces, setns, admin commands).
/// The command prefix that runs a child as user and group nobody (65534) with no
/// supplementary groups ([`Peer::spawn_with`]); needs root and `setpriv`.
pub const AS_NOBODY: &[&str] = &[
    "setpriv",
    "--reuid",
    "65534",
    "--regid",
    "65534",
    "--clear-groups",
];

/// This process's own cgroup under the cgroup2 mount `root` (made and entered once per test
/// binary, named `smc-test-{tag}-PID`; empty ones left by earlier runs are removed), or why
/// there is none. smcd's SMC option program attached there (`--bpf-cgroup`) covers this
/// process and the processes it starts, and nothing else on the host.
pub fn test_cgroup(root: Option<PathBuf>, tag: &str) -> &'static Result<PathBuf, String> {
    static CG: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    CG.get_or_init(|| {
        if !is_root() {
            return Err("needs root (BPF, cgroups)".into());
        }
        let root = root.ok_or("no cgroup2 mount")?;
        let prefix = format!("smc-test-{tag}-");
        if let Ok(dir) = std::fs::read_dir(&root) {
            for e in dir.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix)
                    && std::fs::read_to_string(e.path().join("cgroup.procs"))
                        .is_ok_and(|p| p.trim().is_empty())
                {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
        }
        let cg = root.join(format!("{prefix}{}", std::process::id()));
        std::fs::create_dir_all(&cg).map_err(|e| format!("mkdir {}: {e}", cg.display()))?;
        std::fs::write(cg.join("cgroup.procs"), std::process::id().to_string())
            .map_err(|e| format!("entering {}: {e}", cg.display()))?;
        Ok(cg)
    })
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Whether this is a CI run: `CI` is set to anything but empty, `0` or `false` (CI systems
/// set `CI=true`; `.ci/run` does too).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// `test` (or a part of it, named in `test`) cannot run here because of `why`: under CI that
/// fails the test (a missing tool or privilege must not pass as a success); otherwise it
/// prints `SKIPPED test: why` and the caller returns.
#[track_caller]
pub fn skip(test: &str, why: impl std::fmt::Display) {
    if in_ci() {
        panic!("{test}: {why}; under CI this fails instead of skipping (see .ci/run)");
    }
    // Straight to the descriptor: the test harness captures `eprintln!` of passing tests, and
    // a skip must be seen.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: {why} (under CI=true this fails)"
    );
}

/// Returns false when `met`; otherwise [`skip`]s `test` and returns true (the caller returns).
#[track_caller]
pub fn skip_unless(test: &str, met: bool, why: impl std::fmt::Display) -> bool {
    if !met {
        skip(test, why);
    }
    !met
}

/// [`skip_unless`] we run as root.
#[track_caller]
pub fn skip_unless_root(test: &str) -> bool {
    skip_unless(
        test,
        is_root(),
        "needs root (network namespaces, setns, admin commands)",
    )
}

/// Whether an executable `tool` is on `PATH`.
pub fn have_tool(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(tool))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// [`skip_unless`] `tool` is on `PATH`.
#[track_caller]
pub fn skip_unless_tool(test: &str, tool: &str) -> bool {
    skip_unless(
        test,
        have_tool(tool),
        format_args!("`{tool}` is not installed (not on PATH)"),
    )
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A unique short name for this test process.
pub fn unique(tag: &str) -> String {
    format!(
        "smc-test-{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

// ------------------------------------------------------------------------------------------
// smcd.

/// A running `smcd` on a private socket; stopped with SIGTERM when dropped.
#[derive(Debug)]
pub struct Smcd {
    child: Option<Child>,
    /// Its socket.
    pub socket: PathBuf,
    dir: PathBuf,
    bins: Bins,
    args: Vec<String>,
    /// The network namespace it runs in (`ip netns exec`), or the test's.
    netns: Option<String>,
}

impl Smcd {
    /// Starts `smcd` and waits until its socket accepts connections.
    pub fn start(bins: Bins) -> Smcd {
        Self::start_with(bins, &[])
    }

    /// Starts `smcd` with extra arguments.
    pub fn start_with(bins: Bins, args: &[&str]) -> Smcd {
        let dir = std::env::temp_dir().join(unique("smcd"));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("smcd.sock");
        Self::spawn(bins, dir, socket, args)
    }

    /// Starts `smcd` on an existing socket path (a restart).
    pub fn start_at(bins: Bins, socket: &Path) -> Smcd {
        let dir = socket.parent().unwrap().to_path_buf();
        Self::spawn(bins, dir, socket.to_path_buf(), &[])
    }

    /// Starts `smcd` with extra arguments inside the named network namespace (of
    /// `/run/netns`), as a host of its own would run it; its socket is a file all can reach.
    pub fn start_in(bins: Bins, netns: &str, args: &[&str]) -> Smcd {
        let dir = std::env::temp_dir().join(unique("smcd"));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("smcd.sock");
        Self::spawn_in(bins, Some(netns), dir, socket, args)
    }

    /// Stops this smcd (SIGTERM) and starts it again on the same socket with the same
    /// arguments; returns whether it had exited cleanly.
    pub fn restart(&mut self) -> bool {
        let clean = self.stop();
        // A killed smcd leaves its socket behind; the new one must not be taken for ready.
        let _ = std::fs::remove_file(&self.socket);
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.child = Some(Self::launch_in(
            self.bins,
            self.netns.as_deref(),
            &self.socket,
            &args,
        ));
        clean
    }

    fn spawn(bins: Bins, dir: PathBuf, socket: PathBuf, args: &[&str]) -> Smcd {
        Self::spawn_in(bins, None, dir, socket, args)
    }

    fn spawn_in(
        bins: Bins,
        netns: Option<&str>,
        dir: PathBuf,
        socket: PathBuf,
        args: &[&str],
    ) -> Smcd {
        let child = Self::launch_in(bins, netns, &socket, args);
        Smcd {
            child: Some(child),
            socket,
            dir,
            bins,
            args: args.iter().map(|a| a.to_string()).collect(),
            netns: netns.map(str::to_string),
        }
    }

    /// Starts the process (in `netns`, when named) and waits for its socket.
    fn launch_in(bins: Bins, netns: Option<&str>, socket: &Path, args: &[&str]) -> Child {
        let mut cmd = Command::new(bins.smcd);
        if let Some(ns) = netns {
            // Only the network namespace (`ip netns exec` would also give it a mount
            // namespace with /sys remounted, without the cgroup2 mount the option program
            // attaches under).
            let f = std::fs::File::open(format!("/run/netns/{ns}")).expect("open the netns");
            // SAFETY: setns in the forked child before exec; `f` lives in the closure.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    rustix::thread::move_into_link_name_space(
                        std::os::fd::AsFd::as_fd(&f),
                        Some(rustix::thread::LinkNameSpaceType::Network),
                    )
                    .map_err(std::io::Error::from)
                });
            }
        }
        // SAFETY: prctl in the forked child before exec touches no shared state.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::KILL,
                ))
                .map_err(std::io::Error::from)
            });
        }
        // The SMC option program stays out of tests that do not ask for it with
        // `--bpf-cgroup` (it would attach to the host's cgroup2 root once per smcd).
        if !args
            .iter()
            .any(|a| a.starts_with("--bpf-cgroup") || *a == "--no-bpf")
        {
            cmd.arg("--no-bpf");
        }
        let child = cmd
            .arg("--socket")
            .arg(socket)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("start smcd");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "smcd did not create its socket");
            std::thread::sleep(Duration::from_millis(10));
        }
        child
    }

    /// An in-process engine using this smcd, with the namespace's knobs.
    pub fn engine(&self) -> Arc<Engine> {
        Engine::new(EngineConfig {
            socket: self.socket.clone(),
            ..EngineConfig::default()
        })
    }

    /// An in-process engine with `settings`.
    pub fn engine_with(&self, settings: Settings) -> Arc<Engine> {
        Engine::new(EngineConfig {
            socket: self.socket.clone(),
            settings: Some(settings),
            ueids: None,
        })
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// smcctl against this smcd.
    pub fn ctl(&self, args: &str) -> Run {
        self.bins.smcctl(Some(&self.socket), args)
    }

    /// Asserts that this smcd serves the netlink control plane (issue 4).
    pub fn require_control_plane(&self) {
        let r = self.ctl("hs-limit show");
        assert_eq!(r.code, 0, "smcd does not serve the control plane: {r:#?}");
    }

    /// Kills the daemon with SIGKILL and waits until it is gone (a crash: nothing of smcd's
    /// own clean-up runs).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the daemon (SIGTERM) and returns whether it exited cleanly.
    pub fn stop(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return true;
        };
        if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return st.success();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Smcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ------------------------------------------------------------------------------------------
// smcctl runs.

/// What one smcctl run gave.
#[derive(Debug)]
pub struct Run {
    /// Exit status code.
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    /// Parses stdout as JSON (panics with the output otherwise).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\nstderr: {}", self.stdout, self.stderr))
    }

    /// Asserts success and returns stdout.
    pub fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "smcctl failed: {self:#?}");
        &self.stdout
    }

    /// Asserts the failure contract: the given exit code, nothing on stdout, exactly one
    /// line on stderr starting with `smcctl: `, no panic text.
    pub fn fails(&self, code: i32) -> &str {
        assert_eq!(self.code, code, "{self:#?}");
        assert!(self.stdout.is_empty(), "{self:#?}");
        assert_eq!(
            self.stderr.lines().count(),
            1,
            "one line expected: {self:#?}"
        );
        assert!(self.stderr.starts_with("smcctl: "), "{self:#?}");
        assert!(!self.stderr.contains("panicked"), "{self:#?}");
        self.stderr.trim_end()
    }
}

/// Polls `f` until it returns `Some` or 10 s pass (counters reach smcd asynchronously).
pub fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ------------------------------------------------------------------------------------------
// Network namespaces.

/// A network namespace made with `ip netns add` (loopback up); deleted when dropped.
#[derive(Debug)]
pub struct Netns {
    /// Its name under /run/netns.
    pub name: String,
}

impl Netns {
    /// Creates it; when `ip` is missing or refuses, [`skip`]s `test` and returns `None`.
    #[track_caller]
    pub fn create(test: &str) -> Option<Netns> {
        if skip_unless_tool(test, "ip") {
            return None;
        }
        let name = unique("ns");
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .stdin(Stdio::null())
            .output()
            .expect("run ip");
        if skip_unless(
            test,
            out.status.success(),
            format_args!(
                "`ip netns add` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ) {
            return None;
        }
        let ns = Netns { name };
        let up = Command::new("ip")
            .args(["-n", &ns.name, "link", "set", "lo", "up"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(up, "cannot bring lo up in {}", ns.name);
        Some(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

// ------------------------------------------------------------------------------------------
// Child processes.

/// A child process: this test binary run with `role`, talking to `smcd`.
#[derive(Debug)]
pub struct Peer {
    /// The process.
    pub child: Child,
    out: BufReader<ChildStdout>,
}

impl Peer {
    /// Starts this test binary's ignored `child_entry` test with `role` and `args`.
    pub fn spawn(smcd: &Path, role: &str, args: &[String]) -> Peer {
        Self::spawn_in(None, smcd, role, args)
    }

    /// As [`Peer::spawn`], inside `netns` if given (`ip netns exec`, which keeps the pid).
    pub fn spawn_in(netns: Option<&Netns>, smcd: &Path, role: &str, args: &[String]) -> Peer {
        match netns {
            Some(ns) => Self::spawn_with(&["ip", "netns", "exec", &ns.name], smcd, role, args),
            None => Self::spawn_with(&[], smcd, role, args),
        }
    }

    /// As [`Peer::spawn`], run through the command `prefix` (`setpriv --reuid ...`, `ip netns
    /// exec NAME`) when it is not empty.
    pub fn spawn_with(prefix: &[&str], smcd: &Path, role: &str, args: &[String]) -> Peer {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let mut child = cmd
            .args([
                "--ignored",
                "--exact",
                "child_entry",
                "--nocapture",
                "--test-threads=1",
                "-q",
            ])
            .env("SMC_TEST_ROLE", role)
            .env("SMC_TEST_ARGS", args.join(" "))
            .env("SMCD_SOCKET", smcd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn child");
        let out = BufReader::new(child.stdout.take().unwrap());
        Peer { child, out }
    }

    /// The next line the child printed that starts with `key ` (its value).
    pub fn expect(&mut self, key: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(n > 0, "child ended before printing {key}");
            if let Some(v) = line.trim_end().strip_prefix(&format!("{key} ")) {
                return v.to_string();
            }
        }
    }

    /// Tells the child to go on (writes a line to its stdin).
    pub fn poke(&mut self) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }

    /// Waits for the child; panics if it does not end in `within`.
    pub fn wait(mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("child did not finish within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        let _ = self.child.wait();
    }
}

/// Blocks until the parent writes a line to our stdin (see [`Peer::poke`]).
pub fn wait_for_poke() {
    let mut l = String::new();
    let _ = std::io::stdin().read_line(&mut l);
}

/// The role arguments of a child.
pub fn child_args() -> Vec<String> {
    std::env::var("SMC_TEST_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Prints `key value` for the parent and flushes.
pub fn say(key: &str, value: impl std::fmt::Display) {
    println!("{key} {value}");
    std::io::stdout().flush().unwrap();
}

/// A child process (role `conns`) that opened SMC-D connections through the engine and
/// keeps them open until dropped.
#[derive(Debug)]
pub struct Conns {
    peer: Peer,
    /// The listener's port.
    pub port: u16,
    /// The child's pid.
    pub pid: u32,
}

impl Conns {
    /// Starts the child (inside `netns` if given) with `smc` SMC-D connections, `tcp`
    /// plain TCP clients of the same SMC listener (server-side fallbacks, PEERNOSMC), and
    /// `bytes` bytes sent each way on every SMC connection.
    pub fn open(smcd: &Smcd, netns: Option<&Netns>, smc: usize, tcp: usize, bytes: usize) -> Conns {
        let args = [smc, tcp, bytes].map(|n| n.to_string());
        let mut peer = Peer::spawn_in(netns, &smcd.socket, "conns", &args);
        let pid = peer.child.id();
        let port = peer.expect("READY").parse().unwrap();
        Conns { peer, port, pid }
    }
}

impl Drop for Conns {
    fn drop(&mut self) {
        let child = &mut self.peer.child;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(b"go\n");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

// ------------------------------------------------------------------------------------------
// Byte pattern and randomness.

const PERIOD: usize = 251;

fn pattern_table() -> &'static [u8] {
    static P: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        (0..PERIOD + (1 << 20))
            .map(|i| {
                ((i % PERIOD) as u8)
                    .wrapping_mul(31)
                    .wrapping_add(seed_byte())
            })
            .collect()
    })
}

fn seed_byte() -> u8 {
    7
}

/// The `len` pattern bytes at stream offset `off` (`len` ≤ 1 MiB).
pub fn pattern(off: u64, len: usize) -> &'static [u8] {
    let s = (off % PERIOD as u64) as usize;
    &pattern_table()[s..s + len]
}

/// A small xorshift generator; tests print their seed.
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    /// From a seed (0 is replaced).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// A seed from the clock.
    pub fn seed() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    }

    /// Next value.
    #[allow(clippy::should_implement_trait)] // an endless generator, not an iterator
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

/// Writes `total` pattern bytes in random-sized writes.
pub fn send_pattern(
    s: &SmcStream,
    total: u64,
    rng: &mut Rng,
    max_write: usize,
) -> std::io::Result<()> {
    let mut w = s;
    let mut off = 0u64;
    while off < total {
        let n = rng.range(1, max_write).min((total - off) as usize);
        w.write_all(pattern(off, n))?;
        off += n as u64;
    }
    Ok(())
}

/// Reads until end of stream with random-sized reads, checking every byte against the
/// pattern; returns the byte count.
pub fn recv_pattern(s: &SmcStream, rng: &mut Rng, max_read: usize) -> std::io::Result<u64> {
    let mut r = s;
    let mut buf = vec![0u8; max_read];
    let mut off = 0u64;
    loop {
        let want = rng.range(1, max_read);
        let n = r.read(&mut buf[..want])?;
        if n == 0 {
            return Ok(off);
        }
        if buf[..n] != *pattern(off, n) {
            return Err(std::io::Error::other(format!(
                "data mismatch at stream offset {off} ({n} bytes)"
            )));
        }
        off += n as u64;
    }
}
// ------------------------------------------------------------------------------------------
// Leak probes.

/// (memfd descriptors named smc-dmb, mappings of them) in process `pid`.
pub fn dmb_resources(pid: u32) -> (usize, usize) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter(|l| l.to_string_lossy().contains("smc-dmb"))
                .count()
        })
        .unwrap_or(0);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|m| m.lines().filter(|l| l.contains("smc-dmb")).count())
        .unwrap_or(0);
    (fds, maps)
}

/// Runs `f` on a thread and waits at most `within` for it: `None` means it hung (the thread
/// is left behind).
pub fn within<T: Send + 'static>(
    within: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(within).ok()
}

/// Polls `f` until it is true or `within` passes.
pub fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Binds an SMC listener on an ephemeral loopback port.
pub fn listen(engine: &Arc<Engine>) -> SmcListener {
    SmcListener::bind_with(engine, "127.0.0.1:0").expect("bind")
}

// ------------------------------------------------------------------------------------------
// Child roles. A test file declares
//     #[test] #[ignore = "entry point of child processes"] fn child_entry() { common::child_main() }
// and spawns roles with [`Peer::spawn`] (or [`Conns::open`]); children use the process-wide
// engine (SMCD_SOCKET), `conns` an engine of its own on the same socket.

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

fn mode_name(s: &SmcStream) -> &'static str {
    if s.is_smc() { "smcd" } else { "tcp" }
}

/// Runs the role named by `SMC_TEST_ROLE`.
pub fn child_main() {
    let Ok(role) = std::env::var("SMC_TEST_ROLE") else {
        return;
    };
    raise_nofile();
    let args = child_args();
    let arg = |i: usize| args[i].parse::<u64>().expect("numeric argument");
    match role.as_str() {
        // Accept one connection; send ARG0 pattern bytes while checking what arrives; report.
        "duplex-server" => {
            let l = SmcListener::bind("127.0.0.1:0").unwrap();
            say("PORT", l.local_addr().unwrap().port());
            let (s, _) = l.accept().unwrap();
            say("MODE", mode_name(&s));
            let total = arg(0);
            let seed = arg(1);
            let tx = s.try_clone().unwrap();
            let sender = std::thread::spawn(move || {
                let mut rng = Rng::new(seed ^ 0xabcdef);
                send_pattern(&tx, total, &mut rng, 256 * 1024)
                    .map(|()| tx.shutdown(std::net::Shutdown::Write))
            });
            let mut rng = Rng::new(seed ^ 0x123456);
            let got = recv_pattern(&s, &mut rng, 200 * 1024).expect("receive and check");
            sender.join().unwrap().unwrap().unwrap();
            say("RECEIVED", got);
        }
        // Accept ARG0 connections, keep them all, echo each until end of stream.
        "echo-server" => {
            let l = SmcListener::bind("127.0.0.1:0").unwrap();
            say("PORT", l.local_addr().unwrap().port());
            let n = arg(0);
            let mut threads = Vec::new();
            let mut smc = 0;
            for _ in 0..n {
                let (s, _) = l.accept().unwrap();
                if s.is_smc() {
                    smc += 1;
                }
                threads.push(std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    let mut r = &s;
                    loop {
                        match r.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(k) => {
                                if (&s).write_all(&buf[..k]).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                }));
            }
            for t in threads {
                t.join().unwrap();
            }
            say("SMC", smc);
        }
        // Accept one connection and write the pattern until that fails.
        "stream-server" => {
            let l = SmcListener::bind("127.0.0.1:0").unwrap();
            say("PORT", l.local_addr().unwrap().port());
            let (s, _) = l.accept().unwrap();
            say("MODE", mode_name(&s));
            let mut off = 0u64;
            let mut w = &s;
            loop {
                if let Err(e) = w.write_all(pattern(off, 4096)) {
                    say("ERROR", format!("{:?} {}", e.kind(), unix_ms()));
                    break;
                }
                off += 4096;
            }
            drop(s);
            drop(l);
            report_leaks();
        }
        // Accept one connection and read (checking) until that fails.
        "sink-server" => {
            let l = SmcListener::bind("127.0.0.1:0").unwrap();
            say("PORT", l.local_addr().unwrap().port());
            let (s, _) = l.accept().unwrap();
            say("MODE", mode_name(&s));
            let mut rng = Rng::new(1);
            match recv_pattern(&s, &mut rng, 65536) {
                Ok(n) => say("EOF", n),
                Err(e) => say("ERROR", format!("{:?} {}", e.kind(), unix_ms())),
            }
            drop(s);
            drop(l);
            report_leaks();
        }
        // Connect to 127.0.0.1:ARG0 and read (checking) until that fails.
        "sink-client" => {
            let s = SmcStream::connect(("127.0.0.1", arg(0) as u16)).unwrap();
            say("MODE", mode_name(&s));
            let mut rng = Rng::new(1);
            match recv_pattern(&s, &mut rng, 65536) {
                Ok(n) => say("EOF", n),
                Err(e) => say("ERROR", format!("{:?} {}", e.kind(), unix_ms())),
            }
            drop(s);
            report_leaks();
        }
        // Connect to 127.0.0.1:ARG0, send a line, read the answer to its end, report, exit: a
        // short-lived client process (a new engine, so a new link group on the server).
        "hello-client" => {
            let s = SmcStream::connect(("127.0.0.1", arg(0) as u16)).unwrap();
            let mut w = &s;
            w.write_all(b"hello\n").unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut got = Vec::new();
            (&s).read_to_end(&mut got).unwrap();
            assert_eq!(got, b"hello\n", "echoed");
            say("MODE", mode_name(&s));
        }
        // Connect to 127.0.0.1:ARG0 and write the pattern until that fails.
        "source-client" => {
            let s = SmcStream::connect(("127.0.0.1", arg(0) as u16)).unwrap();
            say("MODE", mode_name(&s));
            let mut off = 0u64;
            let mut w = &s;
            loop {
                if let Err(e) = w.write_all(pattern(off, 4096)) {
                    say("ERROR", format!("{:?} {}", e.kind(), unix_ms()));
                    break;
                }
                off += 4096;
            }
            drop(s);
            report_leaks();
        }
        // Accept two connections: read the first until it fails (report), echo the second.
        "scribble-target" => {
            let l = SmcListener::bind("127.0.0.1:0").unwrap();
            say("PORT", l.local_addr().unwrap().port());
            let (a, _) = l.accept().unwrap();
            let (b, _) = l.accept().unwrap();
            say("MODES", format!("{} {}", mode_name(&a), mode_name(&b)));
            let mut buf = [0u8; 4096];
            let mut r = &a;
            loop {
                match r.read(&mut buf) {
                    Ok(0) => {
                        say("A", "eof");
                        break;
                    }
                    Ok(_) => continue,
                    Err(e) => {
                        say("A", format!("{:?}", e.kind()));
                        break;
                    }
                }
            }
            let mut r = &b;
            loop {
                match r.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => (&b).write_all(&buf[..k]).unwrap(),
                }
            }
            say("B", "done");
        }
        // Open ARG0 SMC-D connections to our own listener, send ARG2 bytes each way on each,
        // accept ARG1 plain TCP clients; report READY <port>, hold everything until poked.
        "conns" => {
            let (smc, tcp, bytes) = (arg(0) as usize, arg(1) as usize, arg(2) as usize);
            let socket = PathBuf::from(std::env::var_os("SMCD_SOCKET").expect("SMCD_SOCKET"));
            let engine = Engine::new(EngineConfig {
                socket,
                ..EngineConfig::default()
            });
            let listener = SmcListener::bind_with(&engine, "127.0.0.1:0").expect("listen");
            let port = listener.local_addr().unwrap().port();
            let mut keep = Vec::new();
            let payload = vec![0x5au8; bytes];
            for _ in 0..smc {
                let c = SmcStream::connect_with(&engine, ("127.0.0.1", port)).expect("connect");
                let (s, _) = listener.accept().expect("accept");
                assert!(c.is_smc(), "client fell back: {:?}", c.mode());
                exchange(&c, &s, &payload);
                exchange(&s, &c, &payload);
                keep.push(c);
                keep.push(s);
            }
            let mut plain = Vec::new();
            for _ in 0..tcp {
                let t = std::net::TcpStream::connect(("127.0.0.1", port)).expect("tcp connect");
                let (s, _) = listener.accept().expect("accept tcp");
                plain.push((t, s));
            }
            say("READY", port);
            wait_for_poke();
            drop(plain);
            drop(keep);
            drop(listener);
        }
        other => panic!("unknown role {other}"),
    }
}

/// After the engine has released what a finished connection held, report what is left.
fn report_leaks() {
    let pid = std::process::id();
    eventually(Duration::from_secs(5), || dmb_resources(pid) == (0, 0));
    let (fds, maps) = dmb_resources(pid);
    say("LEAKS", format!("{fds} {maps}"));
}

/// Sends `payload` from one end to the other; the writer runs in its own thread because a
/// payload larger than the receive buffer only fits while the other end reads.
fn exchange(from: &SmcStream, to: &SmcStream, payload: &[u8]) {
    let w = from.try_clone().expect("clone");
    let data = payload.to_vec();
    let writer = std::thread::spawn(move || (&w).write_all(&data));
    let mut r = to;
    let mut got = vec![0u8; payload.len()];
    r.read_exact(&mut got).expect("read");
    writer.join().expect("writer").expect("write");
    assert_eq!(got, payload);
}

/// A client socket of smcd's control socket at `path` (seqpacket, what smcctl opens), its
/// receives bounded by `timeout`. `Err` if smcd does not take the connection.
pub fn control_socket(path: &Path, timeout: Duration) -> std::io::Result<rustix::fd::OwnedFd> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let sock = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::connect(&sock, &SocketAddrUnix::new(path)?)?;
    rustix::net::sockopt::set_socket_timeout(
        &sock,
        rustix::net::sockopt::Timeout::Recv,
        Some(timeout),
    )?;
    Ok(sock)
}

/// What an engine does before it connects to `to` as an SMC client, by hand: a TCP socket
/// bound to 127.0.0.1 and announced to smcd through `session`. Returns the socket (not yet
/// connected), its address and smcd's verdict.
pub fn announced_socket(
    session: &smcd_engine::ipc::SmcdSession,
    to: std::net::SocketAddr,
) -> (
    rustix::fd::OwnedFd,
    std::net::SocketAddr,
    smcd_engine::ipc::ConnectVerdict,
) {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let s = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::net::bind(&s, &std::net::SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let local = std::net::SocketAddr::try_from(rustix::net::getsockname(&s).unwrap()).unwrap();
    let v = session.connect_intent(local, to).unwrap();
    (s, local, v)
}

/// Reads one CLC message from `s` (blocking): the message, or the decoder's error for bytes
/// that are not one; an I/O error (`UnexpectedEof` at the end of the stream) otherwise.
pub fn read_clc(
    s: &std::net::TcpStream,
) -> std::io::Result<Result<smc_proto::clc::ClcMessage, smc_proto::clc::ClcError>> {
    use std::io::Read;
    let mut r = smc_core::handshake::ClcReader::new();
    let mut buf = [0u8; 1024];
    loop {
        let want = r.wants().min(buf.len());
        let mut s = s;
        let n = s.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if let Some(m) = r.push(&buf[..n]) {
            return Ok(m);
        }
    }
}

/// Runs a set-up that a busy machine can spoil (`f` returns `None`: the attempt proves
/// nothing) until one attempt holds, at most `attempts` times; panics with `what` when none
/// did.
#[track_caller]
pub fn retry_set_up<T>(attempts: usize, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..attempts {
        if let Some(x) = f() {
            return x;
        }
    }
    panic!("{what} (in {attempts} attempts)");
}

/// An SMC listener on 127.0.0.1 (a free port) of `engine` with this backlog and handshake
/// limitation.
pub fn local_listener(engine: &Arc<Engine>, backlog: u32, limit_hs: bool) -> SmcListener {
    SmcListener::bind_with_options(
        engine,
        "127.0.0.1:0",
        smcd_engine::driver::listener::ListenOptions {
            backlog,
            limit_hs: Some(limit_hs),
        },
    )
    .expect("an SMC listener on 127.0.0.1")
}

/// Accepts from `l` until the connection from `peer` comes (others queued before it are
/// dropped); `check` sees every accepted connection, that one included.
pub fn accept_from(
    l: &SmcListener,
    peer: std::net::SocketAddr,
    mut check: impl FnMut(&SmcStream),
) -> SmcStream {
    loop {
        let (s, from) = l.accept().unwrap();
        check(&s);
        if from == peer {
            return s;
        }
    }
}
