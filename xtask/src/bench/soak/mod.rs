//! `cargo xtask soak`: issue 10's soak and load run, SMC beside TCP.
//!
//! It starts its own `smcd` (as the bench does), one `smc-perf server` per transport and real
//! client processes, and runs two phases against each server:
//!
//! * **churn**: `--clients` processes (`--parallel` at a time) that each make
//!   `--conns-per-client` short connections (`smc-perf client --test crr --count N`) and
//!   exit. Every client process is a new engine with a new GID, so on SMC each one is a new
//!   link group on the server, which must be freed when the process ends (smcd's
//!   `PEER_GONE`).
//! * **idle**: `--idle` connections from a few processes, held open and silent for
//!   `--idle-secs`, each checked with an echo before and after (`--test idle`).
//!
//! Beside the legitimate clients of each SMC phase, `smc-perf drip` announces itself through
//! smcd and drips CLC Proposals one byte at a time (its own connections are expected to be
//! closed, at `CLC_WAIT_TIME`). Throughout, once a second, it reads `/proc` of smcd and the
//! server (descriptors, `VmRSS`, `RssShmem`, `smc-dmb` memfds and mappings) and runs
//! `smcctl stats`, `smcctl ss -a` and `smcctl linkgroup show`, timing each.
//!
//! It fails when a legitimate connection errors (or an SMC one falls back with
//! `SMC_CLC_DECL_MEM`, the sign of exhausted buffers), a dump fails or takes more than 1 s,
//! descriptors, SMC-D buffers or link groups do not come back to their level before the
//! phase once the clients are gone (within a small constant; idle buffers an engine keeps for
//! reuse are bounded by `IDLE_DMB_BYTES_MAX`), resident memory still climbs in the last third
//! of a phase, or the attacker's connections are not closed at the whole-message deadline.
//! It writes `target/soak/latest.json` (every sample) and `latest.md` (the table).

mod sample;

use super::perf::{self, Env, last_lines, run_captured};
use super::{machine, procs};
use anyhow::{Context, bail};
use sample::{Dumper, Monitor, ProcStat, Sample};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `cargo xtask soak` options.
#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    /// Client processes of the churn phase (default 5000; --quick 40).
    #[arg(long)]
    clients: Option<usize>,
    /// Short connections each client process makes (default 20; --quick 5).
    #[arg(long)]
    conns_per_client: Option<u64>,
    /// Idle connections held open at once (default 10000; --quick 200).
    #[arg(long)]
    idle: Option<u64>,
    /// Seconds the idle connections are held (default 60; --quick 3).
    #[arg(long)]
    idle_secs: Option<f64>,
    /// Client processes running at a time in the churn phase.
    #[arg(long, default_value_t = 8)]
    parallel: usize,
    /// Drip-feeding attacker connections beside the SMC phases (default 20; --quick 4).
    #[arg(long)]
    attackers: Option<usize>,
    /// Transports, comma separated: smc, tcp (default both, SMC first).
    #[arg(long, value_delimiter = ',')]
    transport: Vec<String>,
    /// A small scale that finishes in well under a minute.
    #[arg(long)]
    quick: bool,
    /// Output directory (default: target/soak).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Use debug binaries instead of release (for tests of the soak itself).
    #[arg(long)]
    debug: bool,
}

/// The scale of a run.
#[derive(Debug, Clone, Serialize)]
struct Scale {
    clients: usize,
    conns_per_client: u64,
    idle: u64,
    idle_secs: f64,
    parallel: usize,
    attackers: usize,
}

/// Connections per idle client process.
const IDLE_PER_PROC: u64 = 1000;
/// Slowest dump allowed (issue 10).
const DUMP_LIMIT_MS: f64 = 1000.0;
/// Descriptors other than SMC-D buffers a process may hold more after a phase than before.
const FD_SLACK: usize = 16;
/// Link groups more after a phase than before.
const LGR_SLACK: usize = 2;
/// SMC-D buffer memory more after a phase than before, kB: what the server's engine may keep
/// for reuse (`smcd_engine::driver::lgr::IDLE_DMB_BYTES_MAX`, 32 MiB) and a little.
const DMB_SLACK_KB: u64 = 32 * 1024 + 1024;
/// How long the after-phase levels may take to come back (the freeing is asynchronous).
const SETTLE: Duration = Duration::from_secs(20);
/// `SMC_CLC_DECL_MEM` as `smc-perf` prints a fallback.
const DECL_MEM: &str = "0x01010000";

/// The DMBs the soak's smcd holds at most (its default, the kernel's `SMC_LO_MAX_DMBS`).
const MAX_DMBS: usize = 5000;

/// How far below [`MAX_DMBS`] a peak still counts as a full device: a connection needs two
/// DMBs, and the once-a-second sample may miss the last few.
const DEVICE_FULL_SLACK: usize = 8;

/// One check of a phase.
#[derive(Debug, Clone, Serialize)]
struct Check {
    name: String,
    ok: bool,
    detail: String,
}

/// One phase against one transport.
#[derive(Debug, Serialize)]
struct PhaseResult {
    phase: String,
    transport: String,
    wall_s: f64,
    client_procs: usize,
    /// Client processes that exited without a report (crashed, hung, killed).
    client_proc_failures: usize,
    /// Connections expected and completed (idle: checked again after holding).
    expected: u64,
    connections: u64,
    smc_connections: u64,
    errors: u64,
    fallbacks: BTreeMap<String, u64>,
    connect_us_p50: Option<u64>,
    connect_us_p99: Option<u64>,
    connect_us_max: Option<u64>,
    dumps: usize,
    dump_failures: usize,
    dump_ms_p99: Option<f64>,
    dump_ms_max: Option<f64>,
    before: Sample,
    after: Sample,
    /// Seconds after the last client exited until the levels came back (or SETTLE).
    settle_s: f64,
    peak_smcd: ProcStat,
    peak_server: ProcStat,
    peak_ss_smc: Option<usize>,
    peak_lgr: Option<usize>,
    attacker: Option<Value>,
    client_errors: Vec<String>,
    checks: Vec<Check>,
    ok: bool,
    during: Vec<Sample>,
}

#[derive(Debug, Serialize)]
struct SoakResult {
    tool: &'static str,
    started: String,
    finished: String,
    machine: machine::Machine,
    revision: Option<String>,
    load_start: Option<[f64; 3]>,
    load_end: Option<[f64; 3]>,
    profile: String,
    command: String,
    scale: Scale,
    nofile: u64,
    phases: Vec<PhaseResult>,
    ok: bool,
}

/// Runs the soak; `Ok(false)` when it ran and a check failed.
pub fn run(args: SoakArgs) -> anyhow::Result<bool> {
    let root = super::workspace_root();
    let scale = Scale {
        clients: args.clients.unwrap_or(if args.quick { 40 } else { 5000 }),
        conns_per_client: args
            .conns_per_client
            .unwrap_or(if args.quick { 5 } else { 20 }),
        idle: args.idle.unwrap_or(if args.quick { 200 } else { 10_000 }),
        idle_secs: args
            .idle_secs
            .unwrap_or(if args.quick { 3.0 } else { 60.0 }),
        parallel: args.parallel.max(1),
        attackers: args.attackers.unwrap_or(if args.quick { 4 } else { 20 }),
    };
    if !(scale.idle_secs >= 0.0 && scale.idle_secs <= 3600.0) {
        bail!("--idle-secs must be in [0, 3600]");
    }
    let transports: Vec<bool> = if args.transport.is_empty() {
        vec![true, false]
    } else {
        args.transport
            .iter()
            .map(|t| match t.trim() {
                "smc" => Ok(true),
                "tcp" => Ok(false),
                o => bail!("unknown transport {o:?} (smc, tcp)"),
            })
            .collect::<anyhow::Result<_>>()?
    };
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| super::target_dir(&root).join("soak"));
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    let profile = if args.debug { "debug" } else { "release" };
    super::build(&root, args.debug)?;
    let bin = super::target_dir(&root).join(profile);
    // An idle SMC-D connection costs its server three descriptors (the TCP socket and the
    // readiness pair its event loop waits on), a client one or two (the TCP socket, the
    // server's bell once it rang it) and smcd two (both DMBs' memfds); the device holds at
    // most MAX_DMBS, and connections beyond fall back and cost one each.
    let smc_idle = scale.idle.min(MAX_DMBS as u64 / 2);
    let want = 3 * smc_idle + (scale.idle - smc_idle) + 2048;
    let nofile = raise_nofile(want);
    if nofile < want {
        eprintln!(
            "soak: WARNING: RLIMIT_NOFILE is {nofile}, and {} idle connections need about \
             {want} descriptors in smcd and in the server (run as root, or raise the hard limit)",
            scale.idle
        );
    }

    let machine = machine::Machine::detect();
    let (client_cpu, server_cpu) = machine::client_server_cpus();
    let started = machine::now_iso();
    let load_start = machine::load_average();
    let stamp = machine::now_stamp();
    println!("soak: {} ({profile}; RLIMIT_NOFILE {nofile})", machine.line);
    println!(
        "soak: churn {} client processes x {} connections ({} at a time), idle {} connections \
         for {} s, {} drip-feeding attacker connections beside SMC",
        scale.clients,
        scale.conns_per_client,
        scale.parallel,
        scale.idle,
        scale.idle_secs,
        scale.attackers
    );
    let tmp = std::env::temp_dir().join(format!("smc-soak-{}-{stamp}", std::process::id()));
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
        ports: perf::Ports::new(),
    };
    let mut smcd = perf::start_smcd(&env)?;
    let dumper = Arc::new(Dumper {
        smcctl: env.bin.join("smcctl"),
        sock: env.sock.clone(),
    });
    let mut phases = Vec::new();
    for &smc in &transports {
        let mut server = perf::start_server(&env, smc, false)?;
        let (smcd_pid, server_pid) = (smcd.child.id(), server.child.id());
        // smcd's and the server's first-time costs (code pages, allocator arenas, the first
        // dump's) before the first baseline.
        dumper.sample(0.0, smcd_pid, server_pid);
        std::thread::sleep(Duration::from_millis(500));
        for phase in ["churn", "idle"] {
            if procs::has_exited(&mut smcd.child) {
                bail!(
                    "smcd exited; its log:\n{}",
                    perf::tail(&env.logs.join("smcd.log"), 20)
                );
            }
            let p = run_phase(
                &env,
                &scale,
                &dumper,
                phase,
                smc,
                server.port,
                (smcd_pid, server_pid),
            )?;
            print_phase(&p);
            phases.push(p);
        }
        server.stop();
    }
    let _ = procs::stop(&mut smcd.child, Duration::from_secs(3));

    let ok = phases.iter().all(|p| p.ok);
    let command = std::iter::once("cargo xtask".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    let run = SoakResult {
        tool: "cargo xtask soak",
        started,
        finished: machine::now_iso(),
        revision: machine::git_revision(&root),
        load_start,
        load_end: machine::load_average(),
        machine,
        profile: profile.into(),
        command,
        scale,
        nofile,
        phases,
        ok,
    };
    let md = markdown(&run);
    println!("\n{md}");
    let json = serde_json::to_string_pretty(&run)?;
    for f in [format!("soak-{stamp}.json"), "latest.json".into()] {
        std::fs::write(out_dir.join(&f), &json)?;
        println!("soak: wrote {}", out_dir.join(f).display());
    }
    std::fs::write(out_dir.join("latest.md"), &md)?;
    println!("soak: wrote {}", out_dir.join("latest.md").display());
    if ok {
        println!("soak: OK: every check of every phase held");
    } else {
        for p in &run.phases {
            for c in p.checks.iter().filter(|c| !c.ok) {
                println!(
                    "soak: FAILED: {} {}: {}: {}",
                    p.transport, p.phase, c.name, c.detail
                );
            }
        }
        println!("soak: logs in {}", env.logs.display());
    }
    Ok(ok)
}

/// Raises RLIMIT_NOFILE (soft and, where allowed, hard) to at least `want`, for this process
/// and so for everything it starts; returns the soft limit in effect.
fn raise_nofile(want: u64) -> u64 {
    // SAFETY: rlimit is plain data that getrlimit fills and setrlimit reads.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        if r.rlim_max < want {
            let up = libc::rlimit {
                rlim_cur: want,
                rlim_max: want,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &up) == 0 {
                return want;
            }
        }
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur
    }
}

/// The attacker of one SMC phase: `smc-perf drip`, stopped by closing its stdin.
struct Attacker {
    child: std::process::Child,
    stdout: std::thread::JoinHandle<String>,
}

impl Attacker {
    fn start(env: &Env, port: u16, n: usize) -> anyhow::Result<Attacker> {
        let log = std::fs::File::create(env.logs.join("drip.log"))?;
        let mut cmd = Command::new(env.bin.join("smc-perf"));
        cmd.args(["drip", &format!("127.0.0.1:{port}")])
            .args(["--attackers", &n.to_string(), "--time", "86400"])
            .env("SMCD_SOCKET", &env.sock)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child = procs::spawn(&mut cmd)?;
        let mut out = child.stdout.take().expect("piped");
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        Ok(Attacker { child, stdout })
    }

    /// Closes its stdin and returns its report.
    fn stop(mut self) -> Value {
        drop(self.child.stdin.take());
        let st = procs::wait_until(
            &mut self.child,
            Some(Instant::now() + Duration::from_secs(30)),
        );
        if !matches!(st, Ok(Some(_))) {
            let _ = procs::stop(&mut self.child, Duration::from_secs(1));
        }
        let out = self.stdout.join().unwrap_or_default();
        out.lines()
            .rev()
            .find_map(|l| serde_json::from_str(l.trim()).ok())
            .unwrap_or_else(|| serde_json::json!({"error": "no report", "stdout": out}))
    }
}

/// What the client processes of a phase reported.
#[derive(Default)]
struct Clients {
    procs: usize,
    failures: usize,
    connections: u64,
    smc: u64,
    errors: u64,
    connect_us: Vec<u64>,
    fallbacks: BTreeMap<String, u64>,
    notes: Vec<String>,
}

impl Clients {
    fn add(&mut self, cap: &perf::Captured) {
        self.procs += 1;
        let json: Option<Value> = cap
            .stdout
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l.trim()).ok());
        let Some(j) = json else {
            self.failures += 1;
            if self.notes.len() < 10 {
                self.notes.push(format!(
                    "{}: no report; stderr: {}",
                    cap.status
                        .map_or("timed out".to_string(), |s| s.to_string()),
                    last_lines(&cap.stderr, 3)
                ));
            }
            return;
        };
        self.connections += j["connections"].as_u64().unwrap_or(0);
        self.smc += j["smc_connections"].as_u64().unwrap_or(0);
        let e = j["errors"].as_u64().unwrap_or(0);
        self.errors += e;
        if e > 0 && self.notes.len() < 10 {
            self.notes.push(format!(
                "{e} errors; stderr: {}",
                last_lines(&cap.stderr, 3)
            ));
        }
        if let Some(v) = j["connect_us"].as_array() {
            self.connect_us.extend(v.iter().filter_map(Value::as_u64));
        }
        if let Some(m) = j["fallbacks"].as_object() {
            for (k, v) in m {
                *self.fallbacks.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
            }
        }
    }
}

/// The client processes of one phase (`procs` of them, `parallel` at a time); `args(i)` is
/// the arguments of the i-th after `client 127.0.0.1:PORT`.
fn run_clients(
    env: &Env,
    port: u16,
    procs_n: usize,
    parallel: usize,
    timeout: Duration,
    args: &(dyn Fn(usize) -> Vec<String> + Sync),
) -> Clients {
    let next = AtomicUsize::new(0);
    let all = Mutex::new(Clients::default());
    // What the workers need of `env` (its port counter is not for threads).
    let (smc_perf, sock, cpu) = (env.bin.join("smc-perf"), &env.sock, env.client_cpu);
    std::thread::scope(|s| {
        for _ in 0..parallel.min(procs_n) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= procs_n || procs::interrupted() {
                        break;
                    }
                    let mut cmd = Command::new(&smc_perf);
                    cmd.args(["client", &format!("127.0.0.1:{port}")])
                        .args(args(i))
                        .env("SMCD_SOCKET", sock);
                    if let Some(c) = cpu {
                        cmd.args(["--pin", &c.to_string()]);
                    }
                    let cap = match run_captured(&mut cmd, timeout) {
                        Ok(c) => c,
                        Err(e) => perf::Captured {
                            status: None,
                            stdout: String::new(),
                            stderr: format!("{e:#}"),
                        },
                    };
                    all.lock().unwrap_or_else(|e| e.into_inner()).add(&cap);
                }
            });
        }
    });
    all.into_inner().unwrap_or_else(|e| e.into_inner())
}

fn run_phase(
    env: &Env,
    scale: &Scale,
    dumper: &Arc<Dumper>,
    phase: &str,
    smc: bool,
    port: u16,
    (smcd_pid, server_pid): (u32, u32),
) -> anyhow::Result<PhaseResult> {
    let transport = if smc { "smc" } else { "tcp" };
    eprintln!("soak: {transport} {phase}: starting");
    let before = dumper.sample(0.0, smcd_pid, server_pid);
    let attacker = if smc && scale.attackers > 0 {
        Some(Attacker::start(env, port, scale.attackers)?)
    } else {
        None
    };
    let monitor = Monitor::start(Arc::clone(dumper), smcd_pid, server_pid);
    let t0 = Instant::now();
    let tcp_arg = |v: &mut Vec<String>| {
        if !smc {
            v.push("--tcp".into());
        }
    };
    let (clients, expected) = if phase == "churn" {
        let n = scale.conns_per_client;
        let c = run_clients(
            env,
            port,
            scale.clients,
            scale.parallel,
            Duration::from_secs(120),
            &|_| {
                let mut v: Vec<String> = ["--test", "crr", "--count", &n.to_string()]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                tcp_arg(&mut v);
                v
            },
        );
        (c, scale.clients as u64 * n)
    } else {
        let procs_n = scale.idle.div_ceil(IDLE_PER_PROC) as usize;
        let hold = scale.idle_secs;
        let c = run_clients(
            env,
            port,
            procs_n,
            procs_n,
            Duration::from_secs_f64(hold + 600.0),
            &|i| {
                let per = scale.idle / procs_n as u64
                    + u64::from((i as u64) < scale.idle % procs_n as u64);
                let mut v: Vec<String> = [
                    "--test",
                    "idle",
                    "--count",
                    &per.to_string(),
                    "--concurrency",
                    "4",
                    "--time",
                    &hold.to_string(),
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                tcp_arg(&mut v);
                v
            },
        );
        (c, scale.idle)
    };
    let wall_s = t0.elapsed().as_secs_f64();
    let attacker = attacker.map(Attacker::stop);
    let mut during = monitor.stop();
    // The levels after the phase: sampled once a second until they are back within the
    // bounds, or SETTLE has passed.
    let t1 = Instant::now();
    let after = loop {
        let s = dumper.sample(t0.elapsed().as_secs_f64(), smcd_pid, server_pid);
        if levels_back(&before, &s) || t1.elapsed() >= SETTLE {
            break s;
        }
        during.push(s);
        std::thread::sleep(Duration::from_secs(1));
    };
    let settle_s = t1.elapsed().as_secs_f64();
    let mut p = PhaseResult {
        phase: phase.into(),
        transport: transport.into(),
        wall_s,
        client_procs: clients.procs,
        client_proc_failures: clients.failures,
        expected,
        connections: clients.connections,
        smc_connections: clients.smc,
        errors: clients.errors,
        fallbacks: clients.fallbacks.clone(),
        connect_us_p50: quantile(&clients.connect_us, 0.50),
        connect_us_p99: quantile(&clients.connect_us, 0.99),
        connect_us_max: clients.connect_us.iter().copied().max(),
        dumps: 0,
        dump_failures: 0,
        dump_ms_p99: None,
        dump_ms_max: None,
        peak_smcd: peak(&before, &during, &after, |s| s.smcd),
        peak_server: peak(&before, &during, &after, |s| s.server),
        peak_ss_smc: samples(&before, &during, &after)
            .filter_map(|s| s.ss_smc)
            .max(),
        peak_lgr: samples(&before, &during, &after)
            .filter_map(|s| s.lgr_count)
            .max(),
        before,
        after,
        settle_s,
        attacker,
        client_errors: clients.notes,
        checks: Vec::new(),
        ok: false,
        during,
    };
    let mut ms: Vec<f64> = Vec::new();
    for s in samples(&p.before, &p.during, &p.after) {
        for d in s.dumps() {
            p.dumps += 1;
            if d.ok {
                ms.push(d.ms);
            } else {
                p.dump_failures += 1;
            }
        }
    }
    ms.sort_by(f64::total_cmp);
    p.dump_ms_max = ms.last().copied();
    p.dump_ms_p99 = (!ms.is_empty()).then(|| ms[(ms.len() * 99).div_ceil(100) - 1]);
    p.checks = checks(&p, smc);
    p.ok = p.checks.iter().all(|c| c.ok);
    Ok(p)
}

fn samples<'a>(
    before: &'a Sample,
    during: &'a [Sample],
    after: &'a Sample,
) -> impl Iterator<Item = &'a Sample> {
    std::iter::once(before)
        .chain(during)
        .chain(std::iter::once(after))
}

/// The largest value of every field over the phase.
fn peak(
    before: &Sample,
    during: &[Sample],
    after: &Sample,
    of: impl Fn(&Sample) -> Option<ProcStat>,
) -> ProcStat {
    let mut m = ProcStat::default();
    for s in samples(before, during, after).filter_map(of) {
        m.fds = m.fds.max(s.fds);
        m.dmb_fds = m.dmb_fds.max(s.dmb_fds);
        m.dmb_fd_kb = m.dmb_fd_kb.max(s.dmb_fd_kb);
        m.dmb_maps = m.dmb_maps.max(s.dmb_maps);
        m.dmb_kb = m.dmb_kb.max(s.dmb_kb);
        m.rss_kb = m.rss_kb.max(s.rss_kb);
        m.shmem_kb = m.shmem_kb.max(s.shmem_kb);
        m.threads = m.threads.max(s.threads);
    }
    m
}

/// Nearest-rank quantile.
fn quantile(v: &[u64], q: f64) -> Option<u64> {
    let mut s = v.to_vec();
    s.sort_unstable();
    let i = ((s.len() as f64 * q).ceil() as usize).checked_sub(1)?;
    s.get(i).copied()
}

/// Descriptors, SMC-D buffers and link groups of `now` within the bounds of `before`.
fn levels_back(before: &Sample, now: &Sample) -> bool {
    level_failures(before, now).is_empty()
}

/// What is above its bound in `now` against `before`, one line each.
fn level_failures(before: &Sample, now: &Sample) -> Vec<String> {
    let mut out = Vec::new();
    for (who, b, n) in [
        ("smcd", before.smcd, now.smcd),
        ("server", before.server, now.server),
    ] {
        let (Some(b), Some(n)) = (b, n) else {
            out.push(format!("{who}: not running"));
            continue;
        };
        if n.other_fds() > b.other_fds() + FD_SLACK {
            out.push(format!(
                "{who}: {} descriptors besides SMC-D buffers, {} before (bound +{FD_SLACK})",
                n.other_fds(),
                b.other_fds()
            ));
        }
        if n.dmb_kb > b.dmb_kb + DMB_SLACK_KB {
            out.push(format!(
                "{who}: {} kB of SMC-D buffers mapped ({} mappings), {} kB before (bound \
                 +{DMB_SLACK_KB} kB)",
                n.dmb_kb, n.dmb_maps, b.dmb_kb
            ));
        }
        if n.dmb_fd_kb > b.dmb_fd_kb + DMB_SLACK_KB {
            out.push(format!(
                "{who}: {} kB of SMC-D buffers held as descriptors ({} memfds), {} kB before \
                 (bound +{DMB_SLACK_KB} kB)",
                n.dmb_fd_kb, n.dmb_fds, b.dmb_fd_kb
            ));
        }
    }
    match (before.lgr_count, now.lgr_count) {
        (Some(b), Some(n)) if n > b + LGR_SLACK => {
            out.push(format!("{n} link groups, {b} before (bound +{LGR_SLACK})"))
        }
        (Some(_), None) => out.push("linkgroup show did not answer".into()),
        _ => {}
    }
    out
}

/// Does resident memory still climb at the end of the phase? The largest `VmRSS` of the last
/// third of the samples against the middle third's, with 25 % and 16 MiB of slack.
fn climbing(during: &[Sample], of: impl Fn(&Sample) -> Option<ProcStat>) -> Option<String> {
    let rss: Vec<u64> = during.iter().filter_map(&of).map(|s| s.rss_kb).collect();
    let n = rss.len();
    let middle = rss[n / 3..2 * n / 3].iter().max()?;
    let last = rss[2 * n / 3..].iter().max()?;
    (*last > middle + middle / 4 + 16 * 1024).then(|| {
        format!("VmRSS {last} kB in the last third of the phase, {middle} kB in the middle third")
    })
}

fn checks(p: &PhaseResult, smc: bool) -> Vec<Check> {
    let mut c = Vec::new();
    let mut add = |name: &str, ok: bool, detail: String| {
        c.push(Check {
            name: name.into(),
            ok,
            detail,
        })
    };
    add(
        "legitimate connections",
        p.errors == 0 && p.client_proc_failures == 0 && p.connections == p.expected,
        format!(
            "{} of {} completed, {} errors, {} of {} client processes without a report{}",
            p.connections,
            p.expected,
            p.errors,
            p.client_proc_failures,
            p.client_procs,
            p.client_errors
                .first()
                .map_or(String::new(), |e| format!("; first: {e}"))
        ),
    );
    if smc {
        let mem: u64 = p
            .fallbacks
            .iter()
            .filter(|(k, _)| k.contains(DECL_MEM))
            .map(|(_, v)| v)
            .sum();
        // Connections held open may fill the device: the kernel's loopback-ism holds at most
        // SMC_LO_MAX_DMBS (5,000) DMBs, two per connection, and beyond that connections fall
        // back with DECL_MEM, as here. That is a fallback only while the device is really
        // full of live buffers; one at any other time means buffers were kept that should
        // not have been (issue 10, item 1).
        let device_full = p.peak_smcd.dmb_fds + DEVICE_FULL_SLACK >= MAX_DMBS;
        add(
            "no fallback for lack of buffers (SMC_CLC_DECL_MEM) below the device's limit",
            mem == 0 || (p.phase == "idle" && device_full),
            format!(
                "{mem} DECL_MEM fallbacks, smcd's DMBs peaked at {} of {MAX_DMBS}; all \
                 fallbacks: {:?}; {} of {} SMC-D",
                p.peak_smcd.dmb_fds, p.fallbacks, p.smc_connections, p.connections
            ),
        );
    }
    add(
        "dumps answer within 1 s",
        p.dump_failures == 0 && p.dump_ms_max.is_some_and(|m| m <= DUMP_LIMIT_MS),
        format!(
            "{} dumps, {} failed, slowest {:.0} ms{}",
            p.dumps,
            p.dump_failures,
            p.dump_ms_max.unwrap_or(f64::NAN),
            samples(&p.before, &p.during, &p.after)
                .flat_map(|s| s.dumps())
                .find_map(|d| d.error.clone())
                .map_or(String::new(), |e| format!("; first failure: {e}"))
        ),
    );
    let left = level_failures(&p.before, &p.after);
    add(
        "descriptors, SMC-D buffers and link groups come back",
        left.is_empty(),
        if left.is_empty() {
            format!("within bounds {:.0} s after the last client", p.settle_s)
        } else {
            format!(
                "{:.0} s after the last client: {}",
                p.settle_s,
                left.join("; ")
            )
        },
    );
    let n = p.during.len();
    if n >= 9 {
        let climb: Vec<String> = [
            ("smcd", climbing(&p.during, |s| s.smcd)),
            ("server", climbing(&p.during, |s| s.server)),
        ]
        .into_iter()
        .filter_map(|(w, x)| x.map(|x| format!("{w}: {x}")))
        .collect();
        add(
            "resident memory levels off",
            climb.is_empty(),
            if climb.is_empty() {
                format!("{n} samples: the last third no higher than the middle third")
            } else {
                climb.join("; ")
            },
        );
    } else {
        add(
            "resident memory levels off",
            true,
            format!("not judged: {n} samples (needs 9)"),
        );
    }
    if let Some(a) = &p.attacker {
        let g = |k: &str| a[k].as_u64();
        let ok = g("attempts").is_some_and(|n| n > 0)
            && g("closed_early") == Some(0)
            && g("never_closed") == Some(0)
            && g("not_smc") == Some(0);
        add(
            "attacker held to the whole-message deadline",
            ok,
            format!(
                "{} connections, {} closed by the listener{}, {} before CLC_WAIT_TIME, {} \
                 whole Proposals dripped in unclosed, {} not announced",
                g("attempts").unwrap_or(0),
                g("closed").unwrap_or(0),
                closed_range(a),
                g("closed_early").unwrap_or(0),
                g("never_closed").unwrap_or(0),
                g("not_smc").unwrap_or(0),
            ),
        );
    }
    c
}

/// " after 6.0–6.1 s", or what the phase was too short for.
fn closed_range(a: &Value) -> String {
    match (a["closed_s_min"].as_f64(), a["closed_s_max"].as_f64()) {
        (Some(lo), Some(hi)) => format!(" after {lo:.1}–{hi:.1} s"),
        _ => " (the phase ended before CLC_WAIT_TIME)".into(),
    }
}

fn print_phase(p: &PhaseResult) {
    println!(
        "soak: {} {}: {} of {} connections in {:.1} s ({} SMC-D), {} errors, connect p99 {}, \
         slowest dump {:.0} ms",
        p.transport,
        p.phase,
        p.connections,
        p.expected,
        p.wall_s,
        p.smc_connections,
        p.errors,
        p.connect_us_p99.map_or("–".into(), ms_of_us),
        p.dump_ms_max.unwrap_or(f64::NAN)
    );
    for c in &p.checks {
        println!(
            "  [{}] {}: {}",
            if c.ok { "ok" } else { "FAIL" },
            c.name,
            c.detail
        );
    }
}

fn ms_of_us(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

/// before / peak / after of one field.
fn bpa(
    p: &PhaseResult,
    who: fn(&Sample) -> Option<ProcStat>,
    peak: &ProcStat,
    f: fn(&ProcStat) -> u64,
    div: u64,
) -> String {
    let v = |s: Option<ProcStat>| s.map_or("–".into(), |s| (f(&s) / div).to_string());
    format!(
        "{} / {} / {}",
        v(who(&p.before)),
        f(peak) / div,
        v(who(&p.after))
    )
}

/// The run's table, as in docs/benchmarks.md.
fn markdown(r: &SoakResult) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "`{}` ({} binaries), {}, {}; {}, revision {}\n\n",
        r.command,
        r.profile,
        r.started,
        r.machine.line,
        match (r.load_start, r.load_end) {
            (Some([a, ..]), Some([b, ..])) =>
                format!("load average {a:.1} at the start, {b:.1} at the end"),
            _ => "load average unknown".into(),
        },
        r.revision.as_deref().unwrap_or("unknown")
    ));
    s.push_str(
        "| phase | transport | connections | errors | SMC-D / fallbacks | connect p50 / p99 | \
         dumps: slowest | smcd fds | smcd RSS MiB | smcd DMBs | server fds | server RSS MiB \
         | server shm MiB | server DMB maps | link groups | checks |\n",
    );
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for p in &r.phases {
        let smcd = |x: &Sample| x.smcd;
        let server = |x: &Sample| x.server;
        let fb: u64 = p.fallbacks.values().sum();
        let count = |n: Option<usize>| n.map_or("–".into(), |n| n.to_string());
        let lgrs = format!(
            "{} / {} / {}",
            count(p.before.lgr_count),
            count(p.peak_lgr),
            count(p.after.lgr_count)
        );
        let failed: Vec<&str> = p
            .checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| c.name.as_str())
            .collect();
        s.push_str(&format!(
            "| {} | {} | {} of {} | {} | {} | {} / {} | {} of {} | {} | {} | {} | {} | {} | {} \
             | {} | {} | {} |\n",
            p.phase,
            p.transport.to_uppercase(),
            p.connections,
            p.expected,
            p.errors + p.client_proc_failures as u64,
            if p.transport == "smc" {
                format!("{} / {fb}", p.smc_connections)
            } else {
                "–".into()
            },
            p.connect_us_p50.map_or("–".into(), ms_of_us),
            p.connect_us_p99.map_or("–".into(), ms_of_us),
            p.dump_ms_max.map_or("–".into(), |m| format!("{m:.0} ms")),
            p.dumps,
            bpa(p, smcd, &p.peak_smcd, |x| x.fds as u64, 1),
            bpa(p, smcd, &p.peak_smcd, |x| x.rss_kb, 1024),
            bpa(p, smcd, &p.peak_smcd, |x| x.dmb_fds as u64, 1),
            bpa(p, server, &p.peak_server, |x| x.fds as u64, 1),
            bpa(p, server, &p.peak_server, |x| x.rss_kb, 1024),
            bpa(p, server, &p.peak_server, |x| x.shmem_kb, 1024),
            bpa(p, server, &p.peak_server, |x| x.dmb_maps as u64, 1),
            lgrs,
            if failed.is_empty() {
                "all ok".to_string()
            } else {
                format!("FAILED: {}", failed.join(", "))
            }
        ));
    }
    s.push_str(
        "\nfds, RSS, shm (`RssShmem`), DMBs (smcd: `smc-dmb` memfds; server: `smc-dmb` \
         mappings) and link groups (`smcctl linkgroup show`): before the phase / peak during \
         it / after it, once the clients are gone. Dumps: `smcctl stats`, `ss -a` and `linkgroup show` once a second each, timed \
         from the start of the smcctl process to its exit.\n",
    );
    for p in &r.phases {
        if let Some(a) = &p.attacker {
            s.push_str(&format!(
                "\n{} {} attacker: {} drip-fed connections, {} closed by the listener{} \
                 (CLC_WAIT_TIME {} s), {} early, {} never closed.",
                p.transport.to_uppercase(),
                p.phase,
                a["attempts"],
                a["closed"],
                closed_range(a),
                a["clc_wait_time_s"],
                a["closed_early"],
                a["never_closed"],
            ));
        }
    }
    s.push('\n');
    s
}
