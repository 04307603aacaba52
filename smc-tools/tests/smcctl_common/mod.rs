//! Shared pieces of smcctl's tests: the smcctl binary, a real `smcd` (spawned on a private
//! socket), child processes that open real SMC-D
//! connections through the engine (this test binary re-executed with a role, optionally
//! inside a network namespace), and network namespaces.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use smcd_engine::{Engine, EngineConfig, SmcListener, SmcStream};

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

/// Runs smcctl with `args` (split on blanks) and the given socket (or none).
pub fn smcctl(socket: Option<&Path>, args: &str) -> Run {
    smcctl_args(socket, &args.split_whitespace().collect::<Vec<_>>())
}

/// Runs smcctl with exactly these arguments.
pub fn smcctl_args(socket: Option<&Path>, args: &[&str]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_smcctl"));
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

/// Whether we run as root (namespaces, setns, admin commands).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Prints why a test does nothing and returns true when not root.
pub fn skip_unless_root(test: &str) -> bool {
    if is_root() {
        return false;
    }
    eprintln!("SKIPPED {test}: needs root (network namespaces, setns, admin commands)");
    true
}

/// The `smcd` binary of this workspace (cargo builds it before the tests of its package).
pub fn smcd_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_smcd"))
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A unique short name for this test process.
pub fn unique(tag: &str) -> String {
    format!(
        "smcctl-{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A running `smcd` on a private socket; SIGTERM when dropped.
pub struct Smcd {
    child: Option<Child>,
    /// Its socket.
    pub socket: PathBuf,
    dir: PathBuf,
}

impl Smcd {
    /// Starts smcd and waits for its socket.
    pub fn start() -> Smcd {
        let dir = std::env::temp_dir().join(unique("smcd"));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("smcd.sock");
        let child = Command::new(smcd_binary())
            .arg("--socket")
            .arg(&socket)
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

    /// smcctl against this smcd.
    pub fn ctl(&self, args: &str) -> Run {
        smcctl(Some(&self.socket), args)
    }

    /// Asserts that this smcd serves the netlink control plane (issue 4).
    pub fn require_control_plane(&self) {
        let r = self.ctl("hs-limit show");
        assert_eq!(r.code, 0, "smcd does not serve the control plane: {r:#?}");
    }
}

impl Drop for Smcd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A network namespace made with `ip netns add` (loopback up); deleted when dropped.
pub struct Netns {
    /// Its name under /run/netns.
    pub name: String,
}

impl Netns {
    /// Creates it; `None` (with a printed reason) when `ip` is missing or refuses.
    pub fn create(test: &str) -> Option<Netns> {
        let name = unique("ns");
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("SKIPPED {test}: `ip netns add` failed (iproute2 missing?)");
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

/// A child process (this test binary's ignored `child_entry` test) that opened SMC-D
/// connections through the engine and keeps them open until dropped.
pub struct Conns {
    child: Child,
    out: BufReader<ChildStdout>,
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
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns.name]).arg(&exe);
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
            .env("SMCCTL_TEST_CHILD", format!("{smc} {tcp} {bytes}"))
            .env("SMCD_SOCKET", &smcd.socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn child");
        let pid = child.id();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let port = loop {
            line.clear();
            let n = out.read_line(&mut line).unwrap();
            assert!(n > 0, "child ended before it was ready");
            if let Some(p) = line.trim().strip_prefix("ready ") {
                break p.parse().unwrap();
            }
        };
        Conns {
            child,
            out,
            port,
            pid,
        }
    }
}

impl Drop for Conns {
    fn drop(&mut self) {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.write_all(b"go\n");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The child's body (called from each test file's `child_entry`). Does nothing when not
/// started as a child.
pub fn child_main() {
    let Ok(spec) = std::env::var("SMCCTL_TEST_CHILD") else {
        return;
    };
    let v: Vec<usize> = spec
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    let (smc, tcp, bytes) = (v[0], v[1], v[2]);
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
    println!("ready {port}");
    std::io::stdout().flush().unwrap();
    let mut l = String::new();
    let _ = std::io::stdin().read_line(&mut l);
    drop(plain);
    drop(keep);
    drop(listener);
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

/// Polls `f` until it returns `Some` or 10 s pass (counters reach smcd asynchronously).
pub fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
