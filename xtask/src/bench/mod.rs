//! `cargo xtask bench`: the kernel SMC team's benchmarks, SMC beside TCP, in one command.
//!
//! It builds the workspace's binaries, starts its own `smcd` on a socket in a temporary
//! directory, and runs `smc-perf` servers (one SMC, one plain TCP) and clients as separate
//! processes pinned to different CPUs. Every point alternates TCP and SMC runs, repeats them
//! and reports medians; settings are changed with `smcctl sysctl set`, exactly as an operator
//! would. Everything it starts is stopped on exit, error or Ctrl-C ([`procs`]).

mod apps;
mod control;
mod machine;
mod perf;
mod plan;
mod procs;
mod report;
mod runner;
pub mod soak;
mod svg;
mod wire;

use anyhow::{Context, bail};
use machine::Machine;
use plan::{Depth, SUITES, TablePlan};
use report::{RunConfig, RunResult, SuiteResult, Totals};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

pub use procs::{Guard, install_signal_handler, interrupted};

/// `cargo xtask bench` options.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Suites to run, comma separated: bw, lat, pp, ablation, smcr, smcr-lgr, crr (default:
    /// all).
    #[arg(long, value_delimiter = ',')]
    suite: Vec<String>,
    /// The SMC-R suite (two network namespaces, the soft RoCEv2 device; needs root): alone,
    /// or beside the suites `--suite` names.
    #[arg(long)]
    smcr: bool,
    /// The kernel team's benchmarks with their own tools (qperf, sockperf, redis-benchmark,
    /// nginx + wrk), plain TCP beside smc-run in the same run; installs the Debian packages
    /// (root). Runs alone.
    #[arg(long, conflicts_with_all = ["suite", "smcr"])]
    apps: bool,
    /// With --apps: only the points whose table title or point name contains this text
    /// (case-insensitive), e.g. `--only "fallback cost"` or `--only nginx`.
    #[arg(long, requires = "apps")]
    only: Option<String>,
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
    if args.apps {
        build(&root, false)?;
        let out_dir = args
            .out
            .clone()
            .unwrap_or_else(|| target_dir(&root).join("bench"));
        std::fs::create_dir_all(&out_dir)?;
        let bin = target_dir(&root).join("release");
        return apps::run(
            &root,
            &bin,
            &out_dir,
            args.reps as usize,
            args.quick || args.smoke,
            args.only.as_deref(),
        );
    }
    let old = args.compare.as_deref().map(load).transpose()?;
    let depth = if args.smoke {
        Depth::Smoke
    } else if args.quick {
        Depth::Quick
    } else {
        Depth::Full
    };
    let mut names: Vec<String> = match (args.suite.is_empty(), args.smcr) {
        (true, true) => Vec::new(),
        (true, false) => SUITES
            .iter()
            .filter(|&&s| {
                // Network namespaces and veths: root only.
                let root = euid() == 0;
                if plan::needs_root(s) && !root {
                    eprintln!("bench: skipping suite {s} (needs root for its network namespaces)");
                }
                !plan::needs_root(s) || root
            })
            .map(|s| s.to_string())
            .collect(),
        (false, _) => args.suite.clone(),
    };
    if args.smcr && !names.iter().any(|n| n == "smcr") {
        names.push("smcr".into());
    }
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
    let (client_cpu, server_cpu) = machine::client_server_cpus();
    let started = machine::now_iso();
    let load_start = machine::load_average();
    if let Some([one, ..]) = load_start
        && one > machine.cores as f64
    {
        eprintln!(
            "bench: WARNING: load average {one:.1} on {} cores: other programs are running, \
             the figures will be noisy",
            machine.cores
        );
    }
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
    let env = perf::Env {
        bin,
        sock: tmp.join("smcd.sock"),
        logs,
        client_cpu,
        server_cpu,
        ports: perf::Ports::new(),
    };

    let mut bench = runner::Bench::start(&env, &cfg, &plans)?;
    let mut suites = Vec::new();
    for sp in &plans {
        suites.push(bench.suite(sp)?);
    }
    let mut totals = Totals {
        runs: bench.runs,
        ..Totals::default()
    };
    let settings_control = bench.ctl.summary();
    let sysctl_defaults = bench.ctl.defaults.clone();
    let sysctl_defaults_source = bench.ctl.defaults_source.clone();
    bench.stop();

    finish_totals(&mut totals, &suites);
    let run = RunResult {
        schema: report::SCHEMA,
        tool: "cargo xtask bench".into(),
        started,
        finished: machine::now_iso(),
        depth,
        machine,
        revision: machine::git_revision(&root),
        load_start,
        load_end: machine::load_average(),
        config: RunConfig {
            reps: cfg.reps,
            time_s: cfg.time,
            warmup_s: cfg.warmup,
            client_cpu,
            server_cpu,
            profile: profile.into(),
        },
        settings_control,
        sysctl_defaults,
        sysctl_defaults_source,
        suites,
        totals: totals.clone(),
    };
    let files = write_outputs(&out_dir, &stamp, &run)?;
    match (run.load_start, run.load_end) {
        (Some([a, ..]), Some([b, ..])) => println!(
            "\nbench: {}; load average {a:.1} at the start, {b:.1} at the end",
            run.machine.line
        ),
        _ => println!("\nbench: {}", run.machine.line),
    }
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

/// `cargo build [--release] -p smc-tools --bins` (smcd, smc-perf and smcctl are among them).
fn build(root: &Path, debug: bool) -> anyhow::Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root).arg("build");
    if !debug {
        cmd.arg("--release");
    }
    cmd.args(["-p", "smc-tools", "--bins"]);
    eprintln!(
        "bench: cargo build{} -p smc-tools --bins",
        if debug { "" } else { " --release" }
    );
    let mut child = procs::spawn_foreground(&mut cmd)?;
    let st = procs::wait_until(&mut child, None)?.expect("no deadline");
    if !st.success() {
        bail!("build failed ({st})");
    }
    Ok(())
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

/// The effective user id (`geteuid(2)`, which cannot fail).
fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and only returns a number.
    unsafe { libc::geteuid() }
}
