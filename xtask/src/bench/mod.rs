//! `cargo xtask bench`: the kernel SMC team's benchmarks, SMC beside TCP, in one command.
//!
//! It builds the workspace's binaries, starts its own `smcd` on a socket in a temporary
//! directory, and runs `smc-perf` servers (one SMC, one plain TCP) and clients as separate
//! processes pinned to different CPUs. Every point alternates TCP and SMC runs, repeats them
//! and reports medians; settings are changed with `smcctl sysctl set`, exactly as an operator
//! would. Everything it starts is stopped on exit, error or Ctrl-C ([`procs`]).

mod machine;
mod plan;
mod procs;
mod report;
mod svg;

use anyhow::{Context, bail};
use machine::Machine;
use plan::{Depth, PointPlan, SUITES, TOUCHED_DEFAULTS, TablePlan, Test, Variant};
use report::{
    PointResult, RepResult, RunConfig, RunResult, SuiteResult, TableResult, Totals, VariantInfo,
    VariantResult,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub use procs::{Guard, install_signal_handler, interrupted};

/// `cargo xtask bench` options.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Suites to run, comma separated: bw, lat, pp, crr, ablation (default: all).
    #[arg(long, value_delimiter = ',')]
    suite: Vec<String>,
    /// Fewer sizes and 0.5 s points: under 3 minutes on 2 cores once built.
    #[arg(long, conflicts_with = "smoke")]
    quick: bool,
    /// One or two sizes per table and 0.2 s points: checks that everything runs.
    #[arg(long)]
    smoke: bool,
    /// Repetitions per point (at least 3).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(3..))]
    reps: u32,
    /// Measured seconds per run (default: 2, --quick 0.5, --smoke 0.2).
    #[arg(long)]
    time: Option<f64>,
    /// Print each point's change against an earlier run's JSON.
    #[arg(long, value_name = "OLD.json")]
    compare: Option<PathBuf>,
    /// With --compare: compare this file instead of running the bench.
    #[arg(long, value_name = "NEW.json", requires = "compare")]
    against: Option<PathBuf>,
    /// Output directory (default: target/bench).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Use debug binaries instead of release (for tests of the bench itself).
    #[arg(long)]
    debug: bool,
}

/// Runs the bench; `Ok(false)` when it ran but some point is missing or had errors.
pub fn run(args: BenchArgs) -> anyhow::Result<bool> {
    let root = workspace_root();
    if let (Some(old), Some(new)) = (&args.compare, &args.against) {
        print!("{}", report::compare(&load(old)?, &load(new)?));
        return Ok(true);
    }
    let old = args.compare.as_deref().map(load).transpose()?;
    let depth = if args.smoke {
        Depth::Smoke
    } else if args.quick {
        Depth::Quick
    } else {
        Depth::Full
    };
    let names: Vec<String> = if args.suite.is_empty() {
        SUITES.iter().map(|s| s.to_string()).collect()
    } else {
        args.suite.clone()
    };
    let mut plans = Vec::new();
    for n in &names {
        let n = n.trim();
        plans.push(
            plan::suite(n, depth)
                .with_context(|| format!("unknown suite {n:?} (known: {})", SUITES.join(", ")))?,
        );
    }
    let time = args.time.unwrap_or(depth.time());
    if !(time > 0.0 && time <= 600.0) {
        bail!("--time must be in (0, 600] seconds");
    }
    let cfg = Cfg {
        reps: args.reps as usize,
        time,
        warmup: depth.warmup(),
    };
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| target_dir(&root).join("bench"));
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;

    let profile = if args.debug { "debug" } else { "release" };
    build(&root, args.debug)?;
    let bin = target_dir(&root).join(profile);
    for b in ["smcd", "smc-perf", "smcctl"] {
        if !bin.join(b).exists() {
            bail!("{} was not built", bin.join(b).display());
        }
    }

    let machine = Machine::detect();
    let cpus = machine::allowed_cpus();
    let (client_cpu, server_cpu) = if cpus.len() >= 2 {
        (Some(cpus[0]), Some(cpus[1]))
    } else {
        (None, None)
    };
    let started = machine::now_iso();
    let stamp = machine::now_stamp();
    println!("bench: {} ({depth:?}, {} reps)", machine.line, cfg.reps);
    match (client_cpu, server_cpu) {
        (Some(c), Some(s)) => println!("bench: client on CPU {c}, servers on CPU {s}"),
        _ => println!("bench: one CPU: client and servers share it (not pinned)"),
    }

    let tmp = std::env::temp_dir().join(format!("smc-bench-{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    procs::remove_at_exit(tmp.clone());
    let logs = out_dir.join("logs");
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs)?;
    let env = Env {
        bin,
        sock: tmp.join("smcd.sock"),
        logs,
        client_cpu,
        server_cpu,
        ports: Ports::new(),
    };

    let mut smcd = start_smcd(&env)?;
    let mut tcp_server = start_server(&env, false)?;
    let mut ctl = Control::new(&env);
    let mut smc_server: Option<PerfServer> = None;

    let mut progress = Progress::new(&plans, &cfg);
    let mut suites = Vec::new();
    let mut totals = Totals::default();
    let mut before = ctl.stats().ok().map(|(flat, _)| flat);
    for sp in &plans {
        let t0 = Instant::now();
        println!("\n== {} ==", sp.name);
        let mut notes = Vec::new();
        if sp.name == "crr"
            && let Some((tw, range)) = machine::ephemeral_time_wait()
            && tw * 4 >= range
        {
            let n = format!(
                "{tw} of the {range} ephemeral ports are in TIME_WAIT before crr starts (other \
                 programs' connections): SMC connects pick their source port before connecting \
                 and may need several tries, or fall back to TCP"
            );
            eprintln!("bench: WARNING: {n}");
            notes.push(n);
        }
        let mut tables = Vec::new();
        for tp in &sp.tables {
            let mut points = Vec::new();
            for (pi, pp) in tp.points.iter().enumerate() {
                if procs::has_exited(&mut smcd.child) {
                    bail!(
                        "smcd exited; its log:\n{}",
                        tail(&env.logs.join("smcd.log"), 20)
                    );
                }
                let mut results: Vec<VariantResult> =
                    tp.variants.iter().map(new_variant_result).collect();
                for rep in 0..cfg.reps {
                    for (vi, v) in tp.variants.iter().enumerate() {
                        let (port, applied) = if v.smc {
                            let applied = ctl.apply(&v.settings);
                            let stale = smc_server.as_mut().is_none_or(|s| {
                                s.settings != ctl.current || procs::has_exited(&mut s.child)
                            });
                            if stale {
                                if let Some(mut old) = smc_server.take() {
                                    old.stop();
                                }
                                let mut s = start_server(&env, true)?;
                                s.settings = ctl.current.clone();
                                smc_server = Some(s);
                            }
                            (smc_server.as_ref().expect("started").port, applied)
                        } else {
                            if procs::has_exited(&mut tcp_server.child) {
                                eprintln!("bench: TCP server exited; restarting it");
                                tcp_server = start_server(&env, false)?;
                            }
                            (tcp_server.port, Applied::default())
                        };
                        let time = cfg.run_time(tp);
                        let r = run_client(&env, &cfg, time, tp.test, pp, v, port, rep);
                        progress.ran(r.wall_s, time + cfg.warmup);
                        totals.runs += 1;
                        let res = &mut results[vi];
                        if !applied.ok {
                            res.settings_applied = false;
                            res.settings_note = applied.note.clone();
                        }
                        res.reps.push(r);
                    }
                }
                for r in &mut results {
                    r.finish(tp.test.metrics());
                }
                let (id, label) = report::point_label(tp.test, pp.msg_size, pp.concurrency);
                let point = PointResult {
                    id,
                    label,
                    msg_size: pp.msg_size,
                    concurrency: pp.concurrency,
                    results,
                };
                eprintln!(
                    "  [{} {}/{}] {}  ({} left)",
                    tp.id,
                    pi + 1,
                    tp.points.len(),
                    point_line(tp, &point),
                    progress.left()
                );
                points.push(point);
            }
            let t = table_result(tp, cfg.run_time(tp), points);
            print!("{}", report::table(&t, &tp.shown, cfg.reps));
            tables.push(t);
        }
        // Counters: what changed during this suite.
        // What changed during this suite (smcd's counters are cumulative).
        let (counters, counters_snapshot, counters_note) = match ctl.stats() {
            Ok((after, raw)) => {
                let d = report::delta(before.as_ref().unwrap_or(&BTreeMap::new()), &after);
                before = Some(after);
                (Some(d), Some(raw), None)
            }
            Err(e) => (None, None, Some(format!("smcctl --json stats: {e:#}"))),
        };
        match (&counters, &counters_note) {
            (Some(c), _) => {
                let shown: Vec<String> = report::interesting(c)
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                println!(
                    "  counters during {}: {}",
                    sp.name,
                    if shown.is_empty() {
                        "(no cork/nodelay/fallback counters reported)".into()
                    } else {
                        shown.join(", ")
                    }
                );
            }
            (None, Some(n)) => println!("  counters: unavailable ({n})"),
            _ => {}
        }
        let summary: Vec<String> = tables.iter().flat_map(report::summary).collect();
        for s in &summary {
            println!("  summary {s}");
        }
        suites.push(SuiteResult {
            name: sp.name.into(),
            tables,
            counters,
            counters_snapshot,
            counters_note,
            notes,
            summary,
            wall_s: t0.elapsed().as_secs_f64(),
        });
    }

    // Orderly stop: servers, then smcd (which removes its socket).
    if let Some(mut s) = smc_server.take() {
        s.stop();
    }
    tcp_server.stop();
    let _ = procs::stop(&mut smcd.child, Duration::from_secs(3));

    finish_totals(&mut totals, &suites);
    let run = RunResult {
        schema: report::SCHEMA,
        tool: "cargo xtask bench".into(),
        started,
        finished: machine::now_iso(),
        depth,
        machine,
        revision: machine::git_revision(&root),
        config: RunConfig {
            reps: cfg.reps,
            time_s: cfg.time,
            warmup_s: cfg.warmup,
            client_cpu,
            server_cpu,
            profile: profile.into(),
        },
        settings_control: ctl.summary(),
        suites,
        totals: totals.clone(),
    };
    let files = write_outputs(&out_dir, &stamp, &run)?;
    println!("\nbench: {}", run.machine.line);
    if run.settings_control != "applied" {
        println!("bench: WARNING: {}", run.settings_control);
    }
    for f in files {
        println!("bench: wrote {}", f.display());
    }
    if let Some(old) = old {
        print!("{}", report::compare(&old, &serde_json::to_value(&run)?));
    }
    let ok = totals.complete
        && totals.data_errors == 0
        && totals.failed_runs == 0
        && totals.fallback_runs == 0;
    if ok {
        println!(
            "bench: OK: {} points, {} runs, a TCP and an SMC median at every point, 0 data errors",
            totals.points, totals.runs
        );
    } else {
        println!(
            "bench: FAILED: complete={} data_errors={} failed_runs={} smc_fallback_runs={} \
             (details per repetition in the JSON; logs in {})",
            totals.complete,
            totals.data_errors,
            totals.failed_runs,
            totals.fallback_runs,
            env.logs.display()
        );
    }
    Ok(ok)
}

#[derive(Debug)]
struct Cfg {
    reps: usize,
    time: f64,
    warmup: f64,
}

impl Cfg {
    /// Measured seconds of one run of table `t`.
    fn run_time(&self, t: &TablePlan) -> f64 {
        t.max_time.map_or(self.time, |m| self.time.min(m))
    }
}

#[derive(Debug)]
struct Env {
    bin: PathBuf,
    sock: PathBuf,
    logs: PathBuf,
    client_cpu: Option<usize>,
    server_cpu: Option<usize>,
    ports: Ports,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { root.join(p) })
        .unwrap_or_else(|| root.join("target"))
}

fn load(p: &Path) -> anyhow::Result<Value> {
    let s = std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
    serde_json::from_str(&s).with_context(|| format!("{} is not JSON", p.display()))
}

/// `cargo build [--release] -p smcd-engine --bins -p smcctl`.
fn build(root: &Path, debug: bool) -> anyhow::Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root).arg("build");
    if !debug {
        cmd.arg("--release");
    }
    cmd.args(["-p", "smcd-engine", "--bins", "-p", "smcctl"]);
    eprintln!(
        "bench: cargo build{} -p smcd-engine --bins -p smcctl",
        if debug { "" } else { " --release" }
    );
    let mut child = procs::spawn_foreground(&mut cmd)?;
    let st = procs::wait_until(&mut child, None)?.expect("no deadline");
    if !st.success() {
        bail!("build failed ({st})");
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Processes.

struct Smcd {
    child: Child,
}

fn start_smcd(env: &Env) -> anyhow::Result<Smcd> {
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
    Ok(Smcd { child })
}

/// A running `smc-perf server`.
struct PerfServer {
    child: Child,
    port: u16,
    /// The sysctls in effect when it started (SMC server only).
    settings: BTreeMap<String, u64>,
}

impl PerfServer {
    fn stop(&mut self) {
        let _ = procs::stop(&mut self.child, Duration::from_secs(2));
    }
}

/// Starts `smc-perf server` on a free port of 127.0.0.1 and waits until it listens (it
/// prints the bound address). Its stderr goes to the log file.
///
/// The port is picked below the ephemeral range, not with `--port 0`: on a shared machine
/// other programs' TIME_WAIT sockets can fill the ephemeral range, and then bind(0) fails.
/// A port that is taken is skipped.
fn start_server(env: &Env, smc: bool) -> anyhow::Result<PerfServer> {
    let mut last = String::new();
    for _ in 0..64 {
        let port = env.ports.next();
        match start_server_on(env, smc, port)? {
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
fn start_server_on(env: &Env, smc: bool, port: u16) -> anyhow::Result<Result<PerfServer, String>> {
    let name = if smc {
        "server-smc.log"
    } else {
        "server-tcp.log"
    };
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(env.logs.join(name))?;
    let mut cmd = Command::new(env.bin.join("smc-perf"));
    cmd.args(["server", "--port", &port.to_string(), "--bind", "127.0.0.1"]);
    if !smc {
        cmd.arg("--tcp");
    }
    if let Some(c) = env.server_cpu {
        cmd.args(["--pin", &c.to_string()]);
    }
    cmd.env("SMCD_SOCKET", &env.sock)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = procs::spawn(&mut cmd)?;
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = mpsc::channel::<Result<u16, String>>();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        let mut first = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
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
struct Ports {
    low: u16,
    high: u16,
    next: std::cell::Cell<u16>,
}

impl Ports {
    fn new() -> Ports {
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
struct Captured {
    status: Option<std::process::ExitStatus>,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` registered, with a deadline; captures its output.
fn run_captured(cmd: &mut Command, timeout: Duration) -> anyhow::Result<Captured> {
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
fn run_client(
    env: &Env,
    cfg: &Cfg,
    time: f64,
    test: Test,
    p: &PointPlan,
    v: &Variant,
    port: u16,
    rep: usize,
) -> RepResult {
    let mut cmd = Command::new(env.bin.join("smc-perf"));
    cmd.arg("client")
        .arg(format!("127.0.0.1:{port}"))
        .args(["--test", test.arg()])
        .args(["--msg-size", &p.msg_size.to_string()])
        .args(["--time", &time.to_string()])
        .args(["--warmup", &cfg.warmup.to_string()])
        .env("SMCD_SOCKET", &env.sock);
    if !v.smc {
        cmd.arg("--tcp");
    }
    if let Some(c) = p.concurrency {
        cmd.args(["--concurrency", &c.to_string()]);
    }
    if let Some(c) = env.client_cpu {
        cmd.args(["--pin", &c.to_string()]);
    }
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
    r.fallback = v.smc && test != Test::Crr && json["transport"].as_str() != Some("smcd");
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

// ------------------------------------------------------------------------------------------
// Settings and counters through smcctl.

/// Whether a variant's settings were in effect.
#[derive(Debug, Clone)]
struct Applied {
    ok: bool,
    note: Option<String>,
}

impl Default for Applied {
    fn default() -> Self {
        Applied {
            ok: true,
            note: None,
        }
    }
}

/// `smcctl` as an operator uses it, and what the bench believes smcd's sysctls are.
struct Control {
    smcctl: PathBuf,
    sock: PathBuf,
    /// smcd's values of the touched sysctls (it starts with the defaults).
    current: BTreeMap<String, u64>,
    /// `key=value` that failed to set, with the reason (not retried).
    failed: BTreeMap<String, String>,
    warned: BTreeSet<String>,
    stats_warned: bool,
    /// Set when smcctl found smcd not answering: no further calls.
    unreachable: Option<String>,
}

impl Control {
    fn new(env: &Env) -> Control {
        Control {
            smcctl: env.bin.join("smcctl"),
            sock: env.sock.clone(),
            current: TOUCHED_DEFAULTS
                .iter()
                .map(|&(k, v)| (k.to_string(), v))
                .collect(),
            failed: BTreeMap::new(),
            warned: BTreeSet::new(),
            stats_warned: false,
            unreachable: None,
        }
    }

    /// Runs `smcctl --socket SOCK ARGS`. A call that takes seconds means smcd does not answer
    /// the control families (smcctl waits 10 s for a reply): later calls fail at once with
    /// the same reason instead of each waiting again.
    fn smcctl(&mut self, args: &[&str]) -> anyhow::Result<String> {
        if let Some(why) = &self.unreachable {
            bail!("{why}");
        }
        let mut cmd = Command::new(&self.smcctl);
        cmd.arg("--socket")
            .arg(&self.sock)
            .args(args)
            .env("SMCD_SOCKET", &self.sock);
        let t0 = Instant::now();
        let c = run_captured(&mut cmd, Duration::from_secs(20))?;
        let slow = t0.elapsed() >= Duration::from_secs(5);
        let r = match c.status {
            Some(st) if st.success() => return Ok(c.stdout),
            Some(st) => format!("{st}: {}", last_lines(&c.stderr, 2)),
            None => "timed out after 20 s".to_string(),
        };
        if slow {
            self.unreachable = Some(format!("control socket not answering ({r})"));
        }
        bail!("{r}")
    }

    /// Sets every touched sysctl to the variant's value or its default, through
    /// `smcctl sysctl set KEY=VALUE`, skipping those already in effect.
    fn apply(&mut self, want: &[(String, u64)]) -> Applied {
        let mut notes = Vec::new();
        for &(k, default) in &TOUCHED_DEFAULTS {
            let v = want
                .iter()
                .find(|(w, _)| w == k)
                .map_or(default, |&(_, v)| v);
            if self.current.get(k) == Some(&v) {
                continue;
            }
            let kv = format!("{k}={v}");
            let res = match self.failed.get(&kv) {
                Some(e) => Err(e.clone()),
                None => self
                    .smcctl(&["sysctl", "set", &kv])
                    .map_err(|e| format!("{e:#}")),
            };
            match res {
                Ok(_) => {
                    self.current.insert(k.into(), v);
                }
                Err(e) => {
                    if self.warned.insert(k.into()) {
                        eprintln!(
                            "bench: WARNING: `smcctl sysctl set {kv}` failed ({e}); points that \
                             need it are marked \"settings not applied\""
                        );
                    }
                    self.failed.insert(kv.clone(), e.clone());
                    notes.push(format!(
                        "smcctl sysctl set {kv} failed ({e}); ran with {k}={}",
                        self.current[k]
                    ));
                }
            }
        }
        Applied {
            ok: notes.is_empty(),
            note: (!notes.is_empty()).then(|| notes.join("; ")),
        }
    }

    /// `smcctl --json stats`: flattened, and as printed.
    fn stats(&mut self) -> anyhow::Result<(BTreeMap<String, f64>, Value)> {
        let r = self.smcctl(&["--json", "stats"]).and_then(|out| {
            let v: Value = serde_json::from_str(out.trim())
                .or_else(|_| serde_json::from_str(out.lines().last().unwrap_or_default()))
                .context("smcctl --json stats did not print JSON")?;
            let mut m = BTreeMap::new();
            report::flatten(&v, "", &mut m);
            Ok((m, v))
        });
        if let Err(e) = &r
            && !self.stats_warned
        {
            self.stats_warned = true;
            eprintln!("bench: WARNING: no counters: `smcctl --json stats` failed ({e:#})");
        }
        r
    }

    fn summary(&self) -> String {
        if self.failed.is_empty() {
            "applied".into()
        } else {
            let keys: Vec<&str> = self.failed.keys().map(String::as_str).collect();
            format!(
                "settings not applied: smcctl sysctl set failed for {} (first error: {}); \
                 those points ran with smcd's defaults",
                keys.join(", "),
                self.failed.values().next().map_or("", String::as_str)
            )
        }
    }
}

// ------------------------------------------------------------------------------------------
// Progress, results, outputs.

struct Progress {
    left_runs: usize,
    /// Measured plus warm-up seconds of the runs still to come.
    left_nominal: f64,
    overhead_sum: f64,
    done: usize,
}

impl Progress {
    fn new(plans: &[plan::SuitePlan], cfg: &Cfg) -> Progress {
        let (mut runs, mut nominal) = (0, 0.0);
        for t in plans.iter().flat_map(|s| &s.tables) {
            let n = t.points.len() * t.variants.len() * cfg.reps;
            runs += n;
            nominal += n as f64 * (cfg.run_time(t) + cfg.warmup);
        }
        Progress {
            left_runs: runs,
            left_nominal: nominal,
            overhead_sum: 0.0,
            done: 0,
        }
    }

    fn ran(&mut self, wall: f64, nominal: f64) {
        self.left_runs = self.left_runs.saturating_sub(1);
        self.left_nominal = (self.left_nominal - nominal).max(0.0);
        self.done += 1;
        self.overhead_sum += (wall - nominal).max(0.0);
    }

    fn left(&self) -> String {
        let overhead = if self.done == 0 {
            0.15
        } else {
            self.overhead_sum / self.done as f64
        };
        let secs = (self.left_nominal + self.left_runs as f64 * overhead).round() as u64;
        if secs >= 60 {
            format!("~{}m{:02}s", secs / 60, secs % 60)
        } else {
            format!("~{secs}s")
        }
    }
}

fn new_variant_result(v: &Variant) -> VariantResult {
    VariantResult {
        variant: v.name.clone(),
        transport: if v.smc { "smc" } else { "tcp" }.into(),
        settings: v.settings.iter().cloned().collect(),
        settings_applied: true,
        settings_note: None,
        reps: Vec::new(),
        median: BTreeMap::new(),
        min: BTreeMap::new(),
        max: BTreeMap::new(),
        units: BTreeMap::new(),
        errors: 0,
    }
}

fn point_line(tp: &TablePlan, p: &PointResult) -> String {
    let m = tp.primary;
    let vals: Vec<String> = tp
        .variants
        .iter()
        .zip(&p.results)
        .map(|(v, r)| {
            format!(
                "{} {}",
                v.label,
                r.median.get(m).map_or("–".into(), |&x| report::num(m, x))
            )
        })
        .collect();
    let n = p.results.len();
    let ratio = report::ratio(p, n - 1, 0, m)
        .map_or(String::new(), |r| format!(" ({:.0} % of TCP)", r * 100.0));
    format!("{}: {} {}{ratio}", p.label, vals.join(" · "), plan::unit(m))
}

fn table_result(tp: &TablePlan, time_s: f64, points: Vec<PointResult>) -> TableResult {
    TableResult {
        id: tp.id.clone(),
        time_s,
        title: tp.title.clone(),
        mirrors: tp.mirrors.clone(),
        test: tp.test,
        primary: tp.primary.into(),
        unit: plan::unit(tp.primary).into(),
        higher_is_better: tp.higher_is_better,
        variants: tp
            .variants
            .iter()
            .map(|v| VariantInfo {
                name: v.name.clone(),
                label: v.label.clone(),
                short: v.short.clone(),
                smc: v.smc,
                settings: v.settings.iter().cloned().collect(),
            })
            .collect(),
        points,
    }
}

fn finish_totals(t: &mut Totals, suites: &[SuiteResult]) {
    t.complete = true;
    for s in suites {
        for tb in &s.tables {
            for p in &tb.points {
                t.points += 1;
                let has_tcp = p
                    .results
                    .iter()
                    .any(|r| r.transport == "tcp" && r.median.contains_key(&tb.primary));
                let every_smc = p
                    .results
                    .iter()
                    .filter(|r| r.transport == "smc")
                    .all(|r| r.median.contains_key(&tb.primary));
                t.complete &= has_tcp && every_smc;
                for r in &p.results {
                    t.data_errors += r.errors;
                    t.failed_runs += r
                        .reps
                        .iter()
                        .filter(|x| !x.ok && x.errors == 0 && !x.fallback)
                        .count();
                    t.fallback_runs += r.reps.iter().filter(|x| x.fallback).count();
                    t.settings_not_applied += usize::from(!r.settings_applied);
                }
            }
        }
    }
}

/// Writes `<stamp>.json`, `latest.json` and the bw/lat plots; returns the paths written.
fn write_outputs(dir: &Path, stamp: &str, run: &RunResult) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let json = serde_json::to_string_pretty(run)?;
    let name = format!(
        "bench-{stamp}-{}.json",
        serde_json::to_value(run.depth)?.as_str().unwrap_or("run")
    );
    for f in [name.as_str(), "latest.json"] {
        let p = dir.join(f);
        std::fs::write(&p, &json).with_context(|| format!("cannot write {}", p.display()))?;
        files.push(p);
    }
    let subtitle = format!(
        "{}; {}; median of {}, {} s points",
        run.started, run.machine.line, run.config.reps, run.config.time_s
    );
    for s in &run.suites {
        for t in &s.tables {
            let kind = match t.id.as_str() {
                "bw/stream" => "bw",
                "lat/pingpong" => "lat",
                _ => continue,
            };
            if let Some(svg) = svg::plot(t, &subtitle) {
                for f in [
                    format!("bench-{stamp}-{kind}.svg"),
                    format!("latest-{kind}.svg"),
                ] {
                    let p = dir.join(f);
                    std::fs::write(&p, &svg)?;
                    files.push(p);
                }
            }
        }
    }
    Ok(files)
}

fn tail(p: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn last_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
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
