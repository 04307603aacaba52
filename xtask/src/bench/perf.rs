//! The processes a run measures with: its own `smcd`, the `smc-perf` servers (SMC and plain
//! TCP, on ports below the ephemeral range) and one `smc-perf client` per run, all started
//! through [`procs`] so none outlives the bench.

use super::Cfg;
use super::plan::{PointPlan, Test, Variant};
use super::procs;
use super::report::RepResult;
use super::wire::Wire;
use anyhow::bail;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Where the binaries are, the run's smcd socket and logs, the CPUs, the server ports.
#[derive(Debug)]
pub(super) struct Env {
    pub(super) bin: PathBuf,
    pub(super) sock: PathBuf,
    pub(super) logs: PathBuf,
    pub(super) client_cpu: Option<usize>,
    pub(super) server_cpu: Option<usize>,
    pub(super) ports: Ports,
}

/// The run's own smcd.
pub(super) struct Smcd {
    pub(super) child: Child,
    log: PathBuf,
}

/// How many `rusage` lines a process printed, and the last one's `(voluntary, involuntary)`
/// context switches.
type RusageSeen = (usize, Option<(u64, u64)>);

/// The last `{tag}: rusage {...}` line in `text`: `(voluntary, involuntary)` context switches
/// (see `smcd_engine::sys::report_context_switches_on_sigusr1`), and how many there are.
fn last_rusage(text: &str, tag: &str) -> RusageSeen {
    let prefix = format!("{tag}: rusage ");
    let mut n = 0;
    let mut last = None;
    for l in text.lines() {
        if let Some(j) = l.find(&prefix).map(|i| &l[i + prefix.len()..]) {
            n += 1;
            last = serde_json::from_str::<Value>(j.trim())
                .ok()
                .and_then(|v| Some((v["voluntary"].as_u64()?, v["involuntary"].as_u64()?)));
        }
    }
    (n, last)
}

/// Asks process `pid` for its context switches (`SIGUSR1`) and waits up to 2 s for the line
/// `read()` then shows (one more than `before` of them).
fn ask_rusage(
    pid: u32,
    mut read: impl FnMut() -> (usize, Option<(u64, u64)>),
) -> Option<(u64, u64)> {
    let (before, _) = read();
    let pid = i32::try_from(pid).ok().filter(|&p| p > 0)?;
    // SAFETY: kill with a positive pid of our own child and a valid signal number.
    if unsafe { libc::kill(pid, libc::SIGUSR1) } != 0 {
        return None;
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        match read() {
            (n, last) if n > before => return last,
            _ => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    None
}

impl Smcd {
    /// smcd's context switches so far, `None` if it did not answer.
    pub(super) fn context_switches(&self) -> Option<(u64, u64)> {
        let log = self.log.clone();
        ask_rusage(self.child.id(), || {
            last_rusage(&std::fs::read_to_string(&log).unwrap_or_default(), "smcd")
        })
    }
}

pub(super) fn start_smcd(env: &Env) -> anyhow::Result<Smcd> {
    let log = std::fs::File::create(env.logs.join("smcd.log"))?;
    let mut cmd = Command::new(env.bin.join("smcd"));
    cmd.arg("--socket")
        .arg(&env.sock)
        .env("SMCD_SOCKET", &env.sock)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let mut child = procs::spawn(&mut cmd)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !env.sock.exists() {
        if procs::has_exited(&mut child) || Instant::now() >= deadline {
            let _ = procs::stop(&mut child, Duration::from_secs(1));
            bail!(
                "smcd did not come up on {}; its log:\n{}",
                env.sock.display(),
                tail(&env.logs.join("smcd.log"), 20)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(Smcd {
        child,
        log: env.logs.join("smcd.log"),
    })
}

/// A running `smc-perf server`.
pub(super) struct PerfServer {
    pub(super) child: Child,
    pub(super) port: u16,
    /// The sysctls in effect when it started (SMC server only).
    pub(super) settings: BTreeMap<String, u64>,
    /// Whether it serves from one event loop (`--events`) rather than a thread each.
    pub(super) events: bool,
    /// Its `rusage` lines as they arrive, and how many so far.
    rusage: Arc<Mutex<RusageSeen>>,
}

impl PerfServer {
    /// The server's context switches so far, `None` if it did not answer.
    pub(super) fn context_switches(&self) -> Option<(u64, u64)> {
        let r = Arc::clone(&self.rusage);
        ask_rusage(self.child.id(), || {
            *r.lock().unwrap_or_else(|e| e.into_inner())
        })
    }

    pub(super) fn stop(&mut self) {
        let _ = procs::stop(&mut self.child, Duration::from_secs(2));
    }
}

/// Starts `smc-perf server` on a free port of 127.0.0.1 and waits until it listens (it
/// prints the bound address). Its stderr goes to the log file.
///
/// The port is picked below the ephemeral range, not with `--port 0`: on a shared machine
/// other programs' TIME_WAIT sockets can fill the ephemeral range, and then bind(0) fails.
/// A port that is taken is skipped.
/// Two network namespaces joined by a veth pair (MTU 9000, as RoCE fabrics run jumbo
/// frames): the two hosts of the SMC-R suite. Deleted when dropped, and by [`procs::cleanup`]
/// on a signal.
#[derive(Debug)]
pub(super) struct Veth {
    pub(super) a: String,
    pub(super) b: String,
    pub(super) addr_a: std::net::Ipv4Addr,
    pub(super) addr_b: std::net::Ipv4Addr,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A new network namespace `ns` with its loopback up (one left over from a killed run is
/// replaced), deleted at cleanup.
fn netns_add(ns: &str) -> anyhow::Result<()> {
    let _ = ip(&["netns", "del", ns]);
    procs::delete_netns_at_exit(ns);
    ip(&["netns", "add", ns])?;
    ip(&["-n", ns, "link", "set", "lo", "up"])
}

/// A veth pair between namespaces `(ns, dev, address)` on a /24, MTU 9000.
fn veth_pair(
    (ns_a, dev_a, addr_a): (&str, &str, std::net::Ipv4Addr),
    (ns_b, dev_b, addr_b): (&str, &str, std::net::Ipv4Addr),
) -> anyhow::Result<()> {
    ip(&[
        "link", "add", dev_a, "netns", ns_a, "type", "veth", "peer", "name", dev_b, "netns", ns_b,
    ])?;
    for (ns, dev, addr) in [(ns_a, dev_a, addr_a), (ns_b, dev_b, addr_b)] {
        ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
        ip(&["-n", ns, "link", "set", dev, "mtu", "9000", "up"])?;
    }
    Ok(())
}

/// An interface name of at most 15 bytes.
fn ifname(s: String) -> String {
    s[..s.len().min(15)].to_string()
}

/// `ip netns exec NS PROGRAM`: the program runs in `ns` under the same pid.
fn netns_exec(ns: &str, program: &Path) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    c
}

impl Veth {
    pub(super) fn create() -> anyhow::Result<Veth> {
        let pid = std::process::id();
        let v = Veth {
            a: format!("smcbench-a-{pid}"),
            b: format!("smcbench-b-{pid}"),
            addr_a: std::net::Ipv4Addr::new(10, 77, 0, 1),
            addr_b: std::net::Ipv4Addr::new(10, 77, 0, 2),
        };
        for ns in [&v.a, &v.b] {
            netns_add(ns)?;
        }
        let (da, db) = (
            ifname(format!("vbench{pid}a")),
            ifname(format!("vbench{pid}b")),
        );
        veth_pair((&v.a, &da, v.addr_a), (&v.b, &db, v.addr_b))?;
        Ok(v)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        procs::delete_netns(&self.a);
        procs::delete_netns(&self.b);
    }
}

/// One client namespace and two server namespaces, each server joined to the client by a
/// veth pair of its own (MTU 9000) on a subnet of its own: the SMC-R lgr-pending suite's
/// hosts. B has a second path to the client, a [`Wire`] (two TAP devices the bench joins in
/// user space, on a third subnet) whose delay makes B slow, since the kernels this runs on
/// have no netem; while B is slow, both ends route B's traffic over it (the client a /32 to
/// B's address, B its default route), otherwise over the veth, so a fast B costs no
/// forwarding. The client's SMC-R endpoint is on its address towards A (`client`); B reaches
/// it through its default route, so one RoCE device and one table of link groups serve both
/// peers. Deleted when dropped, and by [`procs::cleanup`] on a signal.
#[derive(Debug)]
pub(super) struct Fan {
    pub(super) client_ns: String,
    /// The two servers: namespace and address.
    pub(super) servers: [(String, std::net::Ipv4Addr); 2],
    /// The client's address towards A (its SMC-R device's).
    pub(super) client: std::net::Ipv4Addr,
    /// B's slow path (held for its devices and threads), and whether B's traffic takes it
    /// now.
    _wire: Wire,
    wire_devs: (String, String),
    slow: std::cell::Cell<bool>,
}

/// The client's end of each server's veth (`10.78.1.1`, `10.78.2.1`), and of B's wire
/// (`10.78.3.1`; B's end is `10.78.3.2`).
fn fan_near(i: u8) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(10, 78, i + 1, 1)
}

impl Fan {
    pub(super) fn create() -> anyhow::Result<Fan> {
        use std::net::Ipv4Addr;
        let pid = std::process::id();
        let client_ns = format!("smclgr-c-{pid}");
        let servers = [
            (format!("smclgr-a-{pid}"), Ipv4Addr::new(10, 78, 1, 2)),
            (format!("smclgr-b-{pid}"), Ipv4Addr::new(10, 78, 2, 2)),
        ];
        for ns in [&client_ns, &servers[0].0, &servers[1].0] {
            netns_add(ns)?;
        }
        for (i, side) in ["a", "b"].iter().enumerate() {
            let (ns, addr) = &servers[i];
            veth_pair(
                (
                    &client_ns,
                    &ifname(format!("vlgr{pid}c{side}")),
                    fan_near(i as u8),
                ),
                (ns, &ifname(format!("vlgr{pid}s{side}")), *addr),
            )?;
            // Replies to the client's device address (on A's subnet) go back the way they came.
            ip(&[
                "-n",
                ns,
                "route",
                "add",
                "default",
                "via",
                &fan_near(i as u8).to_string(),
            ])?;
        }
        let (cw, sw) = (
            ifname(format!("vlgr{pid}cw")),
            ifname(format!("vlgr{pid}sw")),
        );
        let wire = Wire::create(&cw, &sw)?;
        for (ns, dev, addr) in [
            (&client_ns, &cw, fan_near(2)),
            (&servers[1].0, &sw, Ipv4Addr::new(10, 78, 3, 2)),
        ] {
            ip(&["link", "set", dev, "netns", ns])?;
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "mtu", "9000", "up"])?;
        }
        wire.set_delay(SLOW_B_DELAY);
        Ok(Fan {
            client_ns,
            servers,
            client: fan_near(0),
            _wire: wire,
            wire_devs: (cw, sw),
            slow: std::cell::Cell::new(false),
        })
    }

    /// Makes B slow (its traffic both ways over the wire, every frame from the client towards
    /// B delayed [`SLOW_B_DELAY`], so every round trip with B takes that much longer) or fast
    /// again (over its veth).
    pub(super) fn set_slow_b(&self, slow: bool) -> anyhow::Result<()> {
        if slow == self.slow.get() {
            return Ok(());
        }
        let (b_ns, b_addr) = &self.servers[1];
        let b_host = format!("{b_addr}/32");
        let (cw, sw) = &self.wire_devs;
        if slow {
            ip(&[
                "-n",
                &self.client_ns,
                "route",
                "replace",
                &b_host,
                "via",
                "10.78.3.2",
                "dev",
                cw,
            ])?;
            ip(&[
                "-n",
                b_ns,
                "route",
                "replace",
                "default",
                "via",
                &fan_near(2).to_string(),
                "dev",
                sw,
            ])?;
        } else {
            ip(&["-n", &self.client_ns, "route", "del", &b_host])?;
            ip(&[
                "-n",
                b_ns,
                "route",
                "replace",
                "default",
                "via",
                &fan_near(1).to_string(),
            ])?;
        }
        self.slow.set(slow);
        Ok(())
    }
}

/// The delay that makes peer B slow in the lgr-pending suite: on what the client sends
/// towards B, so every round trip with B takes this much longer.
pub(super) const SLOW_B_DELAY: Duration = Duration::from_millis(20);

impl Drop for Fan {
    fn drop(&mut self) {
        procs::delete_netns(&self.client_ns);
        for (ns, _) in &self.servers {
            procs::delete_netns(ns);
        }
    }
}

/// The `--smcr-set` arguments of an SMC-R variant.
fn smcr_args(cmd: &mut Command, v: &Variant, local: std::net::Ipv4Addr) {
    cmd.args(["--smcr", &local.to_string()]);
    for (k, val) in &v.settings {
        cmd.args(["--smcr-set", &format!("{k}={val}")]);
    }
}

/// The server of a variant between the namespaces (TCP or SMC-R) in namespace `a`.
pub(super) fn start_veth_server(env: &Env, veth: &Veth, v: &Variant) -> anyhow::Result<PerfServer> {
    let log = if v.smcr {
        "server-smcr.log"
    } else {
        "server-tcp-veth.log"
    };
    start_ns_server(env, &veth.a, veth.addr_a, v, log)
}

/// The server of a variant (TCP or SMC-R) in namespace `ns`, on `addr` (its SMC-R device's
/// too); its stderr goes to `log`.
pub(super) fn start_ns_server(
    env: &Env,
    ns: &str,
    addr: std::net::Ipv4Addr,
    v: &Variant,
    log: &str,
) -> anyhow::Result<PerfServer> {
    let mut last = String::new();
    for _ in 0..64 {
        let port = env.ports.next();
        let mut cmd = netns_exec(ns, &env.bin.join("smc-perf"));
        cmd.args(["server", "--port", &port.to_string(), "--bind"])
            .arg(addr.to_string());
        if v.smcr {
            smcr_args(&mut cmd, v, addr);
        } else {
            cmd.arg("--tcp");
        }
        if let Some(c) = env.server_cpu {
            cmd.args(["--pin", &c.to_string()]);
        }
        match spawn_server(env, cmd, log, false)? {
            Ok(s) => return Ok(s),
            Err(why) if why.contains("Address already in use") => last = why,
            Err(why) => bail!("smc-perf server ({}) did not start: {why}", v.name),
        }
    }
    bail!("no free port for smc-perf server: {last}")
}

pub(super) fn start_server(env: &Env, smc: bool, events: bool) -> anyhow::Result<PerfServer> {
    let mut last = String::new();
    for _ in 0..64 {
        let port = env.ports.next();
        match start_server_on(env, smc, events, port)? {
            Ok(s) => return Ok(s),
            Err(why) if why.contains("Address already in use") => last = why,
            Err(why) => bail!(
                "smc-perf server ({}) did not start: {why}",
                if smc { "smc" } else { "tcp" }
            ),
        }
    }
    bail!("no free port for smc-perf server: {last}")
}

/// One attempt: `Ok(Err(why))` when the server exited or never said it listens.
fn start_server_on(
    env: &Env,
    smc: bool,
    events: bool,
    port: u16,
) -> anyhow::Result<Result<PerfServer, String>> {
    let name = if smc {
        "server-smc.log"
    } else {
        "server-tcp.log"
    };
    let mut cmd = Command::new(env.bin.join("smc-perf"));
    cmd.args(["server", "--port", &port.to_string(), "--bind", "127.0.0.1"]);
    if !smc {
        cmd.arg("--tcp");
    }
    if events {
        cmd.arg("--events");
    }
    if let Some(c) = env.server_cpu {
        cmd.args(["--pin", &c.to_string()]);
    }
    spawn_server(env, cmd, name, events)
}

/// Starts a server command and waits until it says where it listens.
fn spawn_server(
    env: &Env,
    mut cmd: Command,
    name: &str,
    events: bool,
) -> anyhow::Result<Result<PerfServer, String>> {
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(env.logs.join(name))?;
    cmd.env("SMCD_SOCKET", &env.sock)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = procs::spawn(&mut cmd)?;
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = mpsc::channel::<Result<u16, String>>();
    let rusage = Arc::new(Mutex::new((0, None)));
    let seen = Arc::clone(&rusage);
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        let mut first = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let (1, r) = last_rusage(&line, "smc-perf") {
                let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
                *s = (s.0 + 1, r);
                continue;
            }
            let _ = writeln!(log, "{line}");
            if first.len() < 3 {
                first.push(line.clone());
            }
            if let Some(port) = line
                .strip_prefix("smc-perf: serving ")
                .and_then(|r| r.rsplit(':').next())
                .and_then(|p| p.trim().parse::<u16>().ok())
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(Ok(port));
            }
        }
        if let Some(tx) = tx {
            let _ = tx.send(Err(first.join(" | ")));
        }
    });
    let why = match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(port)) => {
            return Ok(Ok(PerfServer {
                child,
                port,
                settings: BTreeMap::new(),
                events,
                rusage,
            }));
        }
        Ok(Err(why)) => why,
        Err(_) => "did not say it listens within 10 s".to_string(),
    };
    let _ = procs::stop(&mut child, Duration::from_secs(1));
    Ok(Err(why))
}

/// Server ports below the ephemeral range, handed out round robin from a per-run start.
#[derive(Debug)]
pub(super) struct Ports {
    low: u16,
    high: u16,
    next: std::cell::Cell<u16>,
}

impl Ports {
    pub(super) fn new() -> Ports {
        let eph_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
            .unwrap_or(32768);
        let (low, high) = if eph_low > 12000 {
            (10000, eph_low - 1)
        } else {
            // An unusual range: use the ports above it instead.
            (61000, 65000)
        };
        let span = u32::from(high - low);
        let start = low + (std::process::id().wrapping_mul(7919) % span) as u16;
        Ports {
            low,
            high,
            next: std::cell::Cell::new(start),
        }
    }

    fn next(&self) -> u16 {
        let p = self.next.get();
        self.next.set(if p >= self.high { self.low } else { p + 1 });
        p
    }
}

/// Output of a finished (or timed out) child.
pub(super) struct Captured {
    pub(super) status: Option<std::process::ExitStatus>,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

/// Runs `cmd` registered, with a deadline; captures its output.
pub(super) fn run_captured(cmd: &mut Command, timeout: Duration) -> anyhow::Result<Captured> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = procs::spawn(cmd)?;
    let reader = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let out = reader(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = reader(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let status = match procs::wait_until(&mut child, Some(Instant::now() + timeout))? {
        Some(st) => Some(st),
        None => {
            procs::stop(&mut child, Duration::from_millis(500))?;
            None
        }
    };
    Ok(Captured {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// One `smc-perf client` run.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_client(
    env: &Env,
    cfg: &Cfg,
    time: f64,
    test: Test,
    p: &PointPlan,
    v: &Variant,
    port: u16,
    rep: usize,
    veth: Option<&Veth>,
) -> RepResult {
    let (mut cmd, host) = match veth.filter(|_| v.veth) {
        Some(n) => (
            netns_exec(&n.b, &env.bin.join("smc-perf")),
            n.addr_a.to_string(),
        ),
        None => (Command::new(env.bin.join("smc-perf")), "127.0.0.1".into()),
    };
    cmd.arg("client")
        .arg(format!("{host}:{port}"))
        .args(["--test", test.arg()])
        .args(["--msg-size", &p.msg_size.to_string()])
        .args(["--time", &time.to_string()])
        .args(["--warmup", &cfg.warmup.to_string()])
        .env("SMCD_SOCKET", &env.sock);
    if !v.smc {
        cmd.arg("--tcp");
    } else if let (true, Some(n)) = (v.smcr, veth) {
        smcr_args(&mut cmd, v, n.addr_b);
    }
    if v.events {
        cmd.arg("--events");
    }
    if let Some(c) = p.concurrency {
        cmd.args(["--concurrency", &c.to_string()]);
    }
    if let Some(c) = env.client_cpu {
        cmd.args(["--pin", &c.to_string()]);
    }
    run_and_read(cmd, cfg, time, test, p, v, rep)
}

/// One `smc-perf client` run against the two servers of the lgr-pending suite, from the
/// client namespace: A alone (`ports[1]` is `None`) or A and B at once (`--also`), with
/// `concurrency` loops per target. Its metrics add each target's rate, how long its loops'
/// first connections took (link group setup), the link groups each target's connections
/// used, and the link groups the client made.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_fan_client(
    env: &Env,
    cfg: &Cfg,
    time: f64,
    p: &PointPlan,
    v: &Variant,
    fan: &Fan,
    ports: [Option<u16>; 2],
    rep: usize,
) -> RepResult {
    let mut cmd = netns_exec(&fan.client_ns, &env.bin.join("smc-perf"));
    let targets: Vec<String> = fan
        .servers
        .iter()
        .zip(ports)
        .filter_map(|((_, addr), port)| Some(format!("{addr}:{}", port?)))
        .collect();
    let per_target = p.concurrency.unwrap_or(1);
    cmd.arg("client").arg(&targets[0]);
    for t in &targets[1..] {
        cmd.args(["--also", t]);
    }
    cmd.args(["--test", "crr"])
        .args(["--msg-size", &p.msg_size.to_string()])
        .args(["--time", &time.to_string()])
        .args(["--warmup", &cfg.warmup.to_string()])
        .args(["--concurrency", &(per_target * targets.len()).to_string()]);
    if v.smcr {
        smcr_args(&mut cmd, v, fan.client);
    } else {
        cmd.arg("--tcp");
    }
    if v.setup_lock {
        cmd.arg("--setup-lock");
    }
    if let Some(c) = env.client_cpu {
        cmd.args(["--pin", &c.to_string()]);
    }
    let mut r = run_and_read(cmd, cfg, time, Test::Crr, p, v, rep);
    if let Some(json) = &r.report {
        for (i, side) in ["a", "b"].iter().enumerate() {
            let t = &json["targets"][i];
            if let Some(x) = t["conns_per_s"].as_f64() {
                r.metrics.insert(format!("conns_per_s_{side}"), x);
            }
            if let Some(x) = t["link_groups"].as_f64() {
                r.metrics.insert(format!("lgrs_{side}"), x);
            }
            if let Some(x) = t["first_connect_ms_max"].as_f64() {
                r.metrics.insert(format!("setup_ms_{side}"), x);
            }
        }
        if let Some(x) = json["smcr_first_contacts"].as_f64() {
            r.metrics.insert("first_contacts".into(), x);
        }
        // Connections that fail cost the rate only the time they held a loop inside the
        // window: a run whose errors cost every target less than 1 % of its loops' time there
        // still measured its rates. It is kept, its errors stay counted (the bench fails on
        // them) and the table marks it.
        if !r.ok && r.errors > 0 && !r.fallback && r.metrics.contains_key("conns_per_s_a") {
            let targets = json["targets"].as_array().cloned().unwrap_or_default();
            let cost: Vec<f64> = targets
                .iter()
                .map(|t| {
                    let loops = t["concurrency"].as_f64().unwrap_or(1.0).max(1.0);
                    t["error_s_in_window"].as_f64().unwrap_or(f64::INFINITY) / (loops * time)
                })
                .collect();
            if !cost.is_empty() && cost.iter().all(|&c| c < 0.01) {
                r.ok = true;
                r.metrics.insert("kept_errors".into(), r.errors as f64);
                r.error = Some(format!(
                    "kept: {} failed connections cost at most {:.2} % of a target's loop time \
                     in the window; {}",
                    r.errors,
                    cost.iter().fold(0.0f64, |a, &b| a.max(b)) * 100.0,
                    r.error.take().unwrap_or_default()
                ));
            }
        }
        // A run that says nothing of A measured nothing.
        if r.ok && !r.metrics.contains_key("conns_per_s_a") {
            r.ok = false;
            r.error = Some("no per-target rate in the report (smc-perf too old?)".into());
        }
    }
    r
}

/// Runs a client command and reads its JSON report into a repetition's result.
fn run_and_read(
    mut cmd: Command,
    cfg: &Cfg,
    time: f64,
    test: Test,
    p: &PointPlan,
    v: &Variant,
    rep: usize,
) -> RepResult {
    let t0 = Instant::now();
    let timeout = Duration::from_secs_f64(cfg.warmup + time + 60.0);
    let mut r = RepResult {
        rep,
        ok: false,
        metrics: BTreeMap::new(),
        errors: 0,
        mode: None,
        fallback: false,
        wall_s: 0.0,
        report: None,
        error: None,
    };
    let cap = match run_captured(&mut cmd, timeout) {
        Ok(c) => c,
        Err(e) => {
            r.error = Some(format!("{e:#}"));
            return r;
        }
    };
    r.wall_s = t0.elapsed().as_secs_f64();
    let json: Option<Value> = cap
        .stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l.trim()).ok());
    let Some(json) = json else {
        r.error = Some(match cap.status {
            None => format!(
                "timed out after {timeout:?}; stderr: {}",
                last_lines(&cap.stderr, 5)
            ),
            Some(st) => format!("{st}, no result; stderr: {}", last_lines(&cap.stderr, 5)),
        });
        if !procs::interrupted() {
            eprintln!(
                "bench: {} {} B {}: {}",
                test.arg(),
                p.msg_size,
                v.name,
                r.error.as_deref().unwrap_or_default()
            );
        }
        return r;
    };
    r.errors = json["errors"].as_u64().unwrap_or(0);
    let mode = json["mode"].as_str().unwrap_or_default().to_string();
    for &m in test.metrics() {
        if let Some(x) = json[m].as_f64() {
            r.metrics.insert(m.into(), x);
        }
    }
    if test == Test::Crr
        && let Some(share) = crr_share(&mode)
    {
        r.metrics.insert("smc_share".into(), share);
    }
    let want = if v.smcr { "smcr" } else { "smcd" };
    r.fallback = v.smc && test != Test::Crr && json["transport"].as_str() != Some(want);
    // A run that measured nothing (no message or connection in the window) is no result.
    let rate = match test {
        Test::Bw => "mbps",
        Test::Lat => "msgs_per_s",
        Test::Crr => "conns_per_s",
    };
    let measured = r.metrics.get(rate).is_some_and(|&x| x > 0.0)
        || json[rate].as_f64().is_some_and(|x| x > 0.0);
    r.ok = r.errors == 0 && !r.fallback && measured && cap.status.is_some_and(|s| s.success());
    if !r.ok {
        r.error = Some(format!(
            "errors={} mode={mode}{}; stderr: {}",
            r.errors,
            if measured { "" } else { ", nothing measured" },
            last_lines(&cap.stderr, 5)
        ));
    }
    if !r.ok && !procs::interrupted() {
        eprintln!(
            "bench: {} {} B {}: {}",
            test.arg(),
            p.msg_size,
            v.name,
            r.error.as_deref().unwrap_or_default()
        );
    }
    r.mode = Some(mode);
    r.report = Some(json);
    r
}

/// `"12 of 40 connections SMC-D"` → 0.3.
fn crr_share(mode: &str) -> Option<f64> {
    let mut w = mode.split_whitespace();
    let smc: f64 = w.next()?.parse().ok()?;
    let _of = w.next()?;
    let total: f64 = w.next()?.parse().ok()?;
    Some(if total > 0.0 { smc / total } else { 0.0 })
}

pub(super) fn tail(p: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

pub(super) fn last_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    let tail = lines[lines.len().saturating_sub(n)..].join(" | ");
    // A backtrace would push the message itself out of the tail: keep the error's first line.
    match lines
        .iter()
        .find(|l| l.starts_with("Error: ") || l.starts_with("thread '"))
    {
        Some(first) if !tail.contains(*first) => format!("{first} | … | {tail}"),
        _ => tail,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn crr_share_parses_the_mode() {
        assert_eq!(super::crr_share("12 of 48 connections SMC-D"), Some(0.25));
        assert_eq!(super::crr_share("0 of 0 connections SMC-D"), Some(0.0));
        assert_eq!(super::crr_share("smcd"), None);
    }
}
