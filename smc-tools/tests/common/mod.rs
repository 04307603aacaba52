//! Shared pieces of the multi-process tests: a real `smcd` per test, child processes (this
//! test binary re-executed with a role), the byte pattern every transfer is checked against,
//! and leak probes over `/proc`.
#![allow(dead_code)]

use smcd_engine::settings::Settings;
use smcd_engine::{Engine, EngineConfig, SmcListener, SmcStream};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

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

/// A running `smcd` on a private socket; stopped with SIGTERM when dropped.
pub struct Smcd {
    child: Option<Child>,
    /// Its socket.
    pub socket: PathBuf,
    dir: PathBuf,
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

impl Smcd {
    /// Starts `smcd` and waits until its socket accepts connections.
    pub fn start() -> Smcd {
        Self::start_with(&[])
    }

    /// Starts `smcd` with extra arguments.
    pub fn start_with(args: &[&str]) -> Smcd {
        let dir = std::env::temp_dir().join(format!(
            "smcd-test-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("smcd.sock");
        Self::spawn(dir, socket, args)
    }

    /// Starts `smcd` on an existing socket path (a restart).
    pub fn start_at(socket: &Path) -> Smcd {
        let dir = socket.parent().unwrap().to_path_buf();
        Self::spawn(dir, socket.to_path_buf(), &[])
    }

    fn spawn(dir: PathBuf, socket: PathBuf, args: &[&str]) -> Smcd {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_smcd"));
        // SAFETY: prctl in the forked child before exec touches no shared state.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::KILL,
                ))
                .map_err(std::io::Error::from)
            });
        }
        let child = cmd
            .arg("--socket")
            .arg(&socket)
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
        Smcd {
            child: Some(child),
            socket,
            dir,
        }
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

    /// Stops the daemon (SIGTERM) and returns whether it exited cleanly.
    pub fn stop(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return true;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status();
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

/// A child process: this test binary run with `role`, talking to `smcd`.
pub struct Peer {
    /// The process.
    pub child: Child,
    out: BufReader<ChildStdout>,
}

impl Peer {
    /// Starts this test binary's ignored `child_entry` test with `role` and `args`.
    pub fn spawn(smcd: &Path, role: &str, args: &[String]) -> Peer {
        let mut child = Command::new(std::env::current_exe().unwrap())
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
// and spawns roles with [`Peer::spawn`]; children use the process-wide engine (SMCD_SOCKET).

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
