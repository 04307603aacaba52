//! `cargo xtask bench --apps`: the kernel team's benchmarks with their own tools, unmodified
//! Debian programs, each run over plain TCP and under `smc-run` on both ends in the same run
//! (interleaved repetitions, medians, SMC/TCP ratios, and the share of connections smcd counted
//! as SMC-D). Installs the packages it needs (root); writes `apps.json` next to the other
//! suites' results.

use super::{procs, svg};
use anyhow::{Context, bail};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The programs and their Debian packages.
const PACKAGES: &[(&str, &str)] = &[
    ("qperf", "qperf"),
    ("sockperf", "sockperf"),
    ("redis-server", "redis-server"),
    ("redis-benchmark", "redis-tools"),
    ("nginx", "nginx-light"),
    ("wrk", "wrk"),
    ("taskset", "util-linux"),
];

fn have(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Installs the missing packages (apt-get, as root).
fn install() -> anyhow::Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(t, _)| !have(t))
        .map(|(_, p)| *p)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("bench: apt-get install {}", missing.join(" "));
    let ok = |c: &mut Command| {
        c.env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ok(Command::new("apt-get").args(["update", "-qq"]))
        || !ok(Command::new("apt-get")
            .args(["install", "-y", "-qq"])
            .args(&missing))
    {
        bail!(
            "could not install {} (needs root and a Debian package mirror)",
            missing.join(" ")
        );
    }
    Ok(())
}

/// One process pinned to `cpu`, preloaded or not.
struct Env {
    bin: PathBuf,
    sock: PathBuf,
    dir: PathBuf,
}

impl Env {
    fn cmd(&self, smc: bool, cpu: usize, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new("taskset");
        c.args(["-c", &cpu.to_string()]);
        if smc {
            c.arg(self.bin.join("smc-run"));
        }
        c.arg(program).args(args);
        c.env("SMCD_SOCKET", &self.sock)
            .env("SMC_PRELOAD_LIB", self.bin.join("libsmc_preload.so"))
            .env("RUST_LOG", "error")
            .stdin(Stdio::null());
        c
    }

    /// Sets smcd's knob `name` (the namespace's sysctl); its value before.
    fn sysctl(&self, name: &str, value: u64) -> anyhow::Result<u64> {
        let ctl = |args: &[&str]| {
            Command::new(self.bin.join("smcctl"))
                .args(args)
                .env("SMCD_SOCKET", &self.sock)
                .output()
        };
        let old = ctl(&["sysctl", "get", name])?;
        let old = String::from_utf8_lossy(&old.stdout);
        let old: u64 = old
            .rsplit('=')
            .next()
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("smcctl sysctl get {name}: {old}"))?;
        let st = ctl(&["sysctl", "set", &format!("{name}={value}")])?;
        if !st.status.success() {
            bail!(
                "smcctl sysctl set {name} {value}: {}",
                String::from_utf8_lossy(&st.stderr)
            );
        }
        Ok(old)
    }

    /// SMC-D and fallback connections smcd counted so far.
    fn counts(&self) -> (u64, u64) {
        let out = Command::new(self.bin.join("smcctl"))
            .args(["--json", "stats"])
            .env("SMCD_SOCKET", &self.sock)
            .output();
        let v: Value = out
            .ok()
            .and_then(|o| serde_json::from_slice(&o.stdout).ok())
            .unwrap_or(Value::Null);
        (
            v["connections"]["smc"]["total"].as_u64().unwrap_or(0),
            v["fallback"]["total"].as_u64().unwrap_or(0),
        )
    }
}

/// Runs `cmd` to its end within `limit`; stdout and stderr.
fn output(mut cmd: Command, limit: Duration) -> anyhow::Result<String> {
    let what = format!("{cmd:?}");
    let dir = std::env::temp_dir().join(format!("smc-apps-{}-{}", std::process::id(), rand_u32()));
    std::fs::create_dir_all(&dir)?;
    let (o, e) = (dir.join("out"), dir.join("err"));
    cmd.stdout(std::fs::File::create(&o)?)
        .stderr(std::fs::File::create(&e)?);
    let mut child = procs::spawn(&mut cmd)?;
    let st = procs::wait_until(&mut child, Some(Instant::now() + limit))?;
    let text = format!(
        "{}{}",
        std::fs::read_to_string(&o).unwrap_or_default(),
        std::fs::read_to_string(&e).unwrap_or_default()
    );
    let _ = std::fs::remove_dir_all(&dir);
    match st {
        Some(s) if s.success() => Ok(text),
        Some(s) => bail!("{what}: {s}\n{text}"),
        None => {
            let dump = hang_report(child.id());
            let _ = procs::stop(&mut child, Duration::from_secs(1));
            bail!("{what}: no answer within {limit:?}; {dump}")
        }
    }
}

/// What a process that stopped answering was doing, kept for whoever reads the bench's
/// errors: every thread's stack (gdb), its descriptors and its TCP sockets. A hang seen once
/// in many runs is found from this or not at all. Returns where the report is.
fn hang_report(pid: u32) -> String {
    let path = std::env::temp_dir().join(format!("smc-apps-hang-{pid}.txt"));
    let mut text = String::new();
    let mut run = |title: &str, program: &str, args: &[&str]| {
        text.push_str(&format!("## {title}\n"));
        match Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
        {
            Ok(o) => {
                text.push_str(&String::from_utf8_lossy(&o.stdout));
                text.push_str(&String::from_utf8_lossy(&o.stderr));
            }
            Err(e) => text.push_str(&format!("{program}: {e}\n")),
        }
    };
    let p = pid.to_string();
    // taskset and smc-run exec the program, so the child's pid is the program's.
    run(
        "stacks",
        "gdb",
        &["-p", &p, "-batch", "-ex", "thread apply all bt"],
    );
    run("descriptors", "ls", &["-l", &format!("/proc/{p}/fd")]);
    run("tcp sockets", "ss", &["-tanpie"]);
    match std::fs::write(&path, text) {
        Ok(()) => format!("stacks and sockets in {}", path.display()),
        Err(e) => format!("no report ({}: {e})", path.display()),
    }
}

/// CPU time (user + system) of this process's children that were waited for.
fn children_cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given; a zeroed rusage is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_CHILDREN with a valid pointer to an rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn rand_u32() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(20000, |a| a.port())
}

fn wait_port(port: u16) -> bool {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A server for the duration of a measurement.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = procs::stop(&mut self.0, Duration::from_secs(2));
    }
}

fn server(env: &Env, smc: bool, program: &str, args: &[&str], port: u16) -> anyhow::Result<Server> {
    let mut c = env.cmd(smc, 0, program, args);
    c.current_dir(&env.dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let s = Server(procs::spawn(&mut c)?);
    if !wait_port(port) {
        bail!("{program} did not listen on {port}");
    }
    Ok(s)
}

/// The number after `key` in `text` (`latency = 12.3 us`, `Requests/sec: 4567.8`), scaled to
/// the unit that follows it for qperf's figures.
fn number_after(text: &str, key: &str) -> Option<f64> {
    let rest = &text[text.find(key)? + key.len()..];
    let rest = rest.trim_start_matches([' ', '=', ':']);
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let v: f64 = rest[..end].parse().ok()?;
    let unit = rest[end..].trim_start();
    Some(
        v * match unit.split_whitespace().next().unwrap_or("") {
            "ns" => 1e-3,
            "ms" => 1e3,
            "sec" | "s" => 1e6,
            "KB/sec" => 1e-3,
            "GB/sec" => 1e3,
            _ => 1.0,
        },
    )
}

/// Measures a point once, over TCP (`false`) or SMC (`true`).
type Measure = Box<dyn Fn(&Env, bool) -> anyhow::Result<f64>>;

/// One point: how to measure it once (returns the figure), and which way is better.
struct Point {
    table: String,
    name: String,
    unit: &'static str,
    lower_is_better: bool,
    /// smcd's knobs for the SMC runs of this point (set before each, put back after).
    sysctls: Vec<(&'static str, u64)>,
    /// The SMC column preloads the client only, against a plain server (what a program that
    /// falls back pays for the library).
    client_only: bool,
    run: Measure,
}

impl Point {
    fn new(
        table: &str,
        name: String,
        unit: &'static str,
        lower_is_better: bool,
        run: Measure,
    ) -> Self {
        Point {
            table: table.to_string(),
            name,
            unit,
            lower_is_better,
            sysctls: Vec::new(),
            client_only: false,
            run,
        }
    }

    fn with(mut self, table: &str, sysctls: &[(&'static str, u64)]) -> Self {
        self.table = table.to_string();
        self.sysctls = sysctls.to_vec();
        self
    }
}

fn qperf_point(test: &'static str, size: usize, secs: u32) -> Point {
    let lat = test == "tcp_lat";
    Point::new(
        if lat {
            "qperf tcp_lat (autocorking series)"
        } else {
            "qperf tcp_bw (autocorking series)"
        },
        format!("{size} B"),
        if lat { "us" } else { "MB/s" },
        lat,
        Box::new(move |env, smc| {
            let port = free_port();
            let p = port.to_string();
            let _s = server(env, smc, "qperf", &["-lp", &p], port)?;
            let out = output(
                env.cmd(
                    smc,
                    1,
                    "qperf",
                    &[
                        "127.0.0.1",
                        "-lp",
                        &p,
                        "-t",
                        &secs.to_string(),
                        "-m",
                        &size.to_string(),
                        test,
                    ],
                ),
                Duration::from_secs(u64::from(secs) + 30),
            )?;
            // "    latency  =  12.3 us", "    bw  =  1.5 GB/sec" (the name line is "tcp_bw:").
            number_after(&out, if lat { " latency " } else { " bw " })
                .with_context(|| format!("qperf said: {out}"))
        }),
    )
}

/// sockperf's largest message (its server must be told: `-m`).
const SOCKPERF_MAX: usize = 1_048_575;

fn sockperf_point(size: usize, secs: u32) -> Point {
    Point::new(
        "sockperf pp p50 (loopback-ism series)",
        format!("{size} B"),
        "us",
        true,
        Box::new(move |env, smc| {
            let port = free_port();
            let p = port.to_string();
            let max = SOCKPERF_MAX.to_string();
            let _s = server(
                env,
                smc,
                "sockperf",
                &["sr", "--tcp", "-i", "127.0.0.1", "-p", &p, "-m", &max],
                port,
            )?;
            let out = output(
                env.cmd(
                    smc,
                    1,
                    "sockperf",
                    &[
                        "pp",
                        "--tcp",
                        "-i",
                        "127.0.0.1",
                        "-p",
                        &p,
                        "-t",
                        &secs.to_string(),
                        "-m",
                        &size.to_string(),
                        // sockperf sizes its table of sent messages by this rate (600,000 a
                        // second by default) and fails ("_seqN > m_maxSequenceNo") beyond it:
                        // SMC-D ping-pong goes past 3 million.
                        "--mps",
                        "10000000",
                    ],
                ),
                Duration::from_secs(u64::from(secs) + 30),
            )?;
            number_after(&out, "percentile 50.000 =")
                .with_context(|| format!("sockperf said: {out}"))
        }),
    )
}

/// What a redis point reports.
#[derive(Clone, Copy, PartialEq)]
enum RedisFigure {
    /// Requests per second, as redis-benchmark says.
    Rate,
    /// The client's CPU time (user + system) per request, in ns: what a program that falls back
    /// pays for the library, independent of what else the machine runs (its rate is not).
    ClientCpu,
}

fn redis_point(test: &'static str, requests: u32, client_only: bool, figure: RedisFigure) -> Point {
    let (table, unit) = match (client_only, figure) {
        (false, _) => (
            "redis-benchmark -P 16, 50 clients (loopback-ism series)",
            "req/s",
        ),
        (true, RedisFigure::Rate) => (
            "fallback cost: redis-benchmark -P 16, 50 clients, against a plain redis-server (SMC column: client under smc-run)",
            "req/s",
        ),
        (true, RedisFigure::ClientCpu) => (
            "fallback cost: redis-benchmark's CPU time per request, same runs' set-up (SMC column: client under smc-run)",
            "ns/req",
        ),
    };
    let mut p = Point::new(
        table,
        test.to_uppercase(),
        unit,
        figure == RedisFigure::ClientCpu,
        Box::new(move |env, smc| {
            let port = free_port();
            let p = port.to_string();
            let _s = server(
                env,
                smc && !client_only,
                "redis-server",
                &[
                    "--port",
                    &p,
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ],
                port,
            )?;
            let cpu_before = children_cpu();
            let out = output(
                env.cmd(
                    smc,
                    1,
                    "redis-benchmark",
                    &[
                        "-p",
                        &p,
                        "-t",
                        test,
                        "-n",
                        &requests.to_string(),
                        "-P",
                        "16",
                        "-c",
                        "50",
                        "-q",
                    ],
                ),
                Duration::from_secs(120),
            )?;
            let cpu = children_cpu().saturating_sub(cpu_before);
            let key = format!("{}: ", test.to_uppercase());
            let line = out
                .rsplit(['\r', '\n'])
                .find(|l| l.contains(&key) && l.contains("requests per second"));
            let rate = line
                .and_then(|l| number_after(l, &key))
                .with_context(|| format!("redis-benchmark said: {out}"))?;
            Ok(match figure {
                RedisFigure::Rate => rate,
                RedisFigure::ClientCpu => cpu.as_secs_f64() * 1e9 / f64::from(requests),
            })
        }),
    );
    p.client_only = client_only;
    p
}

fn nginx_conf(dir: &Path, port: u16) -> anyhow::Result<PathBuf> {
    let d = dir.display();
    std::fs::create_dir_all(dir.join("tmp"))?;
    std::fs::write(dir.join("4k.html"), vec![b'x'; 4096])?;
    let conf = dir.join(format!("nginx-{port}.conf"));
    std::fs::write(
        &conf,
        format!(
            "daemon off; master_process off; worker_processes 1; pid {d}/nginx-{port}.pid;\n\
             error_log {d}/error.log crit;\n\
             events {{ worker_connections 16384; use epoll; }}\n\
             http {{ access_log off; sendfile on; tcp_nopush on; keepalive_requests 100000000;\n\
             client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;\n\
             uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;\n\
             server {{ listen 127.0.0.1:{port} backlog=4096; root {d}; }} }}\n"
        ),
    )?;
    Ok(conf)
}

fn nginx_point(conns: u32, close: bool, secs: u32) -> Point {
    Point::new(
        if close {
            "nginx + wrk, Connection: close, handshake limitation off (short-lived and lgr-pending series)"
        } else {
            "nginx + wrk, keep-alive (loopback-ism series)"
        },
        format!("{conns} connections"),
        "req/s",
        false,
        Box::new(move |env, smc| {
            let port = free_port();
            let conf = nginx_conf(&env.dir, port)?;
            let _s = server(
                env,
                smc,
                "nginx",
                &[
                    "-c",
                    conf.to_str().unwrap_or(""),
                    "-p",
                    env.dir.to_str().unwrap_or(""),
                ],
                port,
            )?;
            let mut args = vec!["-t", "1", "-c"];
            let c = conns.to_string();
            let d = secs.to_string();
            args.extend([c.as_str(), "-d", d.as_str()]);
            if close {
                args.extend(["-H", "Connection: close"]);
            }
            let url = format!("http://127.0.0.1:{port}/4k.html");
            args.push(&url);
            let out = output(
                env.cmd(smc, 1, "wrk", &args),
                Duration::from_secs(u64::from(secs) + 30),
            )?;
            if out.contains("Socket errors") || out.contains("Non-2xx") {
                bail!("wrk saw errors: {out}");
            }
            number_after(&out, "Requests/sec:").with_context(|| format!("wrk said: {out}"))
        }),
    )
}

/// The SMC/TCP ratio of each repetition whose two runs both gave a figure, in run order. The
/// two ran back to back, so the machine's slow and fast spells (seconds to minutes on this
/// shared virtual machine, hitting SMC's cross-core traffic and TCP differently) mostly fall
/// on both: their spread says how far the ratio of the medians can be trusted.
fn pair_ratios(reps: &[(Option<f64>, Option<f64>)]) -> Vec<f64> {
    reps.iter()
        .filter_map(|&(t, s)| Some(s? / t?))
        .filter(|r| r.is_finite())
        .collect()
}

/// The lowest and highest of at least two ratios.
fn spread(ratios: &[f64]) -> Option<(f64, f64)> {
    if ratios.len() < 2 {
        return None;
    }
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((lo, hi))
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// Runs the apps suite; `Ok(false)` when some point failed.
pub fn run(
    root: &Path,
    bin: &Path,
    out_dir: &Path,
    reps: usize,
    quick: bool,
    only: Option<&str>,
) -> anyhow::Result<bool> {
    install()?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let st = Command::new(cargo)
        .current_dir(root)
        .args(["build", "--release", "-p", "smc-preload"])
        .status()?;
    if !st.success() {
        bail!("cargo build --release -p smc-preload failed");
    }
    let dir = std::env::temp_dir().join(format!("smc-apps-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    procs::remove_at_exit(dir.clone());
    let sock = dir.join("smcd.sock");
    let mut smcd = procs::spawn(
        Command::new(bin.join("smcd"))
            .arg("--socket")
            .arg(&sock)
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )?;
    let until = Instant::now() + Duration::from_secs(10);
    while !sock.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let env = Env {
        bin: bin.to_path_buf(),
        sock,
        dir,
    };
    let secs = if quick { 1 } else { 3 };
    let sizes: Vec<usize> = if quick {
        vec![1, 64, 1024, 16384, 65536]
    } else {
        (0..=16).map(|i| 1usize << i).collect()
    };
    let mut points = Vec::new();
    for s in &sizes {
        points.push(qperf_point("tcp_lat", *s, secs));
    }
    for s in &sizes {
        points.push(qperf_point("tcp_bw", *s, secs));
    }
    // SMC-D never corks (as the kernel's SMC-D: a CDC completes when it is stored), so the
    // autocorking ablation must show no change there; SMC-R's is in `--smcr`.
    let few: &[usize] = if quick {
        &[1, 64, 1024]
    } else {
        &[1, 16, 256, 4096, 65536]
    };
    for s in few {
        points.push(qperf_point("tcp_bw", *s, secs).with(
            "qperf tcp_bw, SMC with autocorking off (autocorking_size 0)",
            &[("autocorking_size", 0)],
        ));
    }
    for s in [14, 1400, 16384, 65000] {
        points.push(sockperf_point(s, secs));
    }
    // The autosplit series: wmem = rmem = 512 KiB, autosplit on (128 KiB) and off.
    let big = [128 * 1024, 256 * 1024, 512 * 1024, SOCKPERF_MAX];
    for (title, split) in [
        (
            "sockperf pp p50, 512 KiB buffers, autosplit on (autosplit series)",
            131_072,
        ),
        (
            "sockperf pp p50, 512 KiB buffers, autosplit off",
            536_870_912,
        ),
    ] {
        for s in big {
            points.push(sockperf_point(s, secs).with(
                title,
                &[
                    ("wmem", 524_288),
                    ("rmem", 524_288),
                    ("autosplit_size", split),
                ],
            ));
        }
    }
    let n = if quick { 100_000 } else { 1_000_000 };
    points.push(redis_point("set", n, false, RedisFigure::Rate));
    points.push(redis_point("get", n, false, RedisFigure::Rate));
    points.push(nginx_point(100, false, secs));
    let closes: &[u32] = if quick { &[8, 64] } else { &[8, 64, 512, 2048] };
    for c in closes {
        points.push(nginx_point(*c, true, secs));
    }
    for c in closes {
        points.push(nginx_point(*c, true, secs).with(
            "nginx + wrk, Connection: close, handshake limitation on (limit_smc_hs 1)",
            &[("limit_smc_hs", 1)],
        ));
    }
    // A fallback costs the library's hooks per call and its start: 100,000 requests end in
    // 0.1 s, too short for either (the rate is quantized to the millisecond and moves with
    // whatever else runs), so these points always make a million.
    for figure in [RedisFigure::Rate, RedisFigure::ClientCpu] {
        for test in ["set", "get"] {
            points.push(redis_point(test, 1_000_000, true, figure));
        }
    }
    if let Some(only) = only {
        let only = only.to_lowercase();
        points.retain(|p| {
            p.table.to_lowercase().contains(&only) || p.name.to_lowercase().contains(&only)
        });
        if points.is_empty() {
            bail!("no point's table or name contains {only:?}");
        }
    }
    let mut ok = true;
    let mut rows = Vec::new();
    let mut table = String::new();
    let mut last_table = String::new();
    for p in &points {
        if p.table != last_table {
            table.push_str(&format!(
                "\n{}\n{:<18} {:>12} {:>12} {:>8} {:>8} {:>12}\n",
                p.table,
                "point",
                format!("TCP {}", p.unit),
                format!("SMC {}", p.unit),
                "SMC/TCP",
                "SMC-D",
                "pairs"
            ));
            last_table.clone_from(&p.table);
        }
        let (mut tcp, mut smc) = (Vec::new(), Vec::new());
        let mut pairs = Vec::new();
        let mut errors = Vec::new();
        let before = env.counts();
        for _ in 0..reps {
            let (t0, s0) = (tcp.len(), smc.len());
            for (mode, v) in [(false, &mut tcp), (true, &mut smc)] {
                let mut old = Vec::new();
                if mode {
                    for (k, val) in &p.sysctls {
                        match env.sysctl(k, *val) {
                            Ok(o) => old.push((*k, o)),
                            Err(e) => errors.push(format!("SMC: {e:#}")),
                        }
                    }
                }
                match (p.run)(&env, mode) {
                    Ok(x) => v.push(x),
                    Err(e) => errors.push(format!("{}: {e:#}", if mode { "SMC" } else { "TCP" })),
                }
                for (k, o) in old.into_iter().rev() {
                    if let Err(e) = env.sysctl(k, o) {
                        errors.push(format!("SMC: {e:#}"));
                    }
                }
            }
            pairs.push((tcp.get(t0).copied(), smc.get(s0).copied()));
        }
        let pairs = pair_ratios(&pairs);
        let after = env.counts();
        let (ds, df) = (after.0 - before.0, after.1 - before.1);
        // The fallbacks the readiness probes make (one plain connection per server start).
        let probes = 2 * reps as u64;
        let share = (ds + df.saturating_sub(probes)).max(1);
        // Client-only points measure fallbacks: their share of SMC-D is expected to be 0.
        let share = ds as f64 / share as f64;
        let (t, s) = (median(&mut tcp), median(&mut smc));
        let ratio = t.zip(s).map(|(t, s)| s / t);
        if !errors.is_empty() {
            ok = false;
        }
        let f = |x: Option<f64>| x.map_or_else(|| "-".to_string(), |x| format!("{x:.1}"));
        table.push_str(&format!(
            "{:<18} {:>12} {:>12} {:>8} {:>7.0}% {:>12}\n",
            p.name,
            f(t),
            f(s),
            ratio.map_or_else(|| "-".into(), |r| format!("{r:.2}x")),
            100.0 * share,
            spread(&pairs).map_or_else(|| "-".into(), |(lo, hi)| format!("{lo:.2}-{hi:.2}"))
        ));
        for e in &errors {
            let first = e.lines().next().unwrap_or("");
            table.push_str(&format!("    error: {first}\n"));
        }
        eprint!(
            "{}",
            table
                .lines()
                .last()
                .map(|l| format!("{l}\n"))
                .unwrap_or_default()
        );
        rows.push(json!({
            "table": p.table, "point": p.name, "unit": p.unit,
            "lower_is_better": p.lower_is_better,
            "tcp": tcp, "smc": smc, "tcp_median": t, "smc_median": s, "ratio": ratio,
            "pair_ratios": pairs,
            "smcd_share": share, "errors": errors,
        }));
    }
    let _ = procs::stop(&mut smcd, Duration::from_secs(2));
    println!("{table}");
    // A partial run (--only) does not replace the full run's files.
    let stem = if only.is_some() { "apps-only" } else { "apps" };
    let path = out_dir.join(format!("{stem}.json"));
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&json!({ "reps": reps, "seconds": secs, "points": rows }))?,
    )?;
    println!("bench: wrote {}", path.display());
    let bars: Vec<svg::Bar> = rows
        .iter()
        .filter_map(|r| {
            let (t, s) = (r["tcp_median"].as_f64()?, r["smc_median"].as_f64()?);
            let lower = r["lower_is_better"].as_bool().unwrap_or(false);
            Some(svg::Bar {
                table: r["table"].as_str()?.to_string(),
                point: r["point"].as_str()?.to_string(),
                advantage: if lower { t / s } else { s / t },
            })
        })
        .collect();
    let subtitle = format!(
        "smc-run beside plain TCP in one run, medians of {reps}; latencies as TCP/SMC, rates as SMC/TCP"
    );
    if let Some(chart) = svg::advantage(&bars, "cargo xtask bench --apps", &subtitle) {
        let path = out_dir.join(format!("{stem}.svg"));
        std::fs::write(&path, chart)?;
        println!("bench: wrote {}", path.display());
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_taken_per_repetition_and_skip_failed_runs() {
        let reps = [
            (Some(100.0), Some(200.0)),
            (None, Some(300.0)),
            (Some(50.0), None),
            (Some(0.0), Some(10.0)),
            (Some(80.0), Some(120.0)),
        ];
        assert_eq!(pair_ratios(&reps), vec![2.0, 1.5]);
        assert_eq!(spread(&pair_ratios(&reps)), Some((1.5, 2.0)));
        assert_eq!(spread(&[1.2]), None);
        assert_eq!(spread(&[]), None);
    }
}
