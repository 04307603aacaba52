//! One run's loop: suites, tables, points, repetitions and variants (TCP first, then the SMC
//! variants, so TCP and SMC alternate), the settings before each SMC run, the counters after
//! each suite, and the progress line after each point.

use super::control::{Applied, Control};
use super::perf::{self, Env, PerfServer, Smcd};
use super::plan::{self, PointPlan, Scenario, SuitePlan, TablePlan, Test, Variant};
use super::report::{
    self, PointResult, RepResult, SuiteResult, TableResult, VariantInfo, VariantResult,
};
use super::{Cfg, machine, procs};
use anyhow::bail;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The processes and state of one run.
pub(super) struct Bench<'a> {
    env: &'a Env,
    cfg: &'a Cfg,
    pub(super) ctl: Control,
    smcd: Smcd,
    tcp: PerfServer,
    /// Started (again) whenever the settings changed, so its listener sees them.
    smc: Option<PerfServer>,
    progress: Progress,
    /// Counters at the end of the previous suite (smcd's are cumulative).
    counters_before: Option<BTreeMap<String, f64>>,
    /// Client runs so far.
    pub(super) runs: usize,
    /// The two namespaces of the SMC-R suite, made when its first variant runs.
    veth: Option<perf::Veth>,
    /// Servers in the first of them, by variant (each SMC-R variant has its settings).
    veth_servers: BTreeMap<String, PerfServer>,
    /// The three namespaces of the lgr-pending suite, made when its first point runs.
    fan: Option<perf::Fan>,
    /// Its servers (in A's and B's namespace), by variant.
    fan_servers: BTreeMap<String, [PerfServer; 2]>,
}

impl<'a> Bench<'a> {
    /// Starts smcd and the TCP server (the SMC server starts with the first SMC run).
    pub(super) fn start(env: &'a Env, cfg: &'a Cfg, plans: &[SuitePlan]) -> anyhow::Result<Self> {
        let smcd = perf::start_smcd(env)?;
        let tcp = perf::start_server(env, false, false)?;
        let mut ctl = Control::new(env);
        let counters_before = ctl.stats().ok().map(|(flat, _)| flat);
        Ok(Bench {
            env,
            cfg,
            ctl,
            smcd,
            tcp,
            smc: None,
            progress: Progress::new(plans, cfg),
            counters_before,
            runs: 0,
            veth: None,
            veth_servers: BTreeMap::new(),
            fan: None,
            fan_servers: BTreeMap::new(),
        })
    }

    /// Runs one suite, prints its tables, counters and summary.
    pub(super) fn suite(&mut self, sp: &SuitePlan) -> anyhow::Result<SuiteResult> {
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
            let t = self.table(tp)?;
            if report::is_fan(&t) {
                print!("{}", report::fan_table(&t, self.cfg.reps));
            } else {
                print!("{}", report::table(&t, &tp.shown, self.cfg.reps));
            }
            tables.push(t);
        }
        let (counters, counters_snapshot, counters_note) = self.counters();
        match (&counters, &counters_note) {
            (Some(c), _) => {
                let all = report::interesting(c);
                let shown: Vec<String> = all
                    .iter()
                    .filter(|(_, v)| *v != 0.0)
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                println!(
                    "  counters during {}: {}",
                    sp.name,
                    match (all.is_empty(), shown.is_empty()) {
                        (true, _) => "(smcctl reported no cork/nodelay/fallback counters)".into(),
                        (false, true) =>
                            "cork, nodelay, fallback and handshake counters all 0".to_string(),
                        (false, false) => shown.join(", "),
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
        Ok(SuiteResult {
            name: sp.name.into(),
            tables,
            counters,
            counters_snapshot,
            counters_note,
            notes,
            summary,
            wall_s: t0.elapsed().as_secs_f64(),
        })
    }

    fn table(&mut self, tp: &TablePlan) -> anyhow::Result<TableResult> {
        let mut points = Vec::new();
        for (pi, pp) in tp.points.iter().enumerate() {
            let point = self.point(tp, pp)?;
            eprintln!(
                "  [{} {}/{}] {}  ({} left)",
                tp.id,
                pi + 1,
                tp.points.len(),
                point_line(tp, &point),
                self.progress.left()
            );
            points.push(point);
        }
        Ok(table_result(tp, self.cfg.run_time(tp), points))
    }

    /// All repetitions of all variants at one point, alternating variants within each
    /// repetition.
    fn point(&mut self, tp: &TablePlan, pp: &PointPlan) -> anyhow::Result<PointResult> {
        if procs::has_exited(&mut self.smcd.child) {
            bail!(
                "smcd exited; its log:\n{}",
                perf::tail(&self.env.logs.join("smcd.log"), 20)
            );
        }
        if let Some(sc) = pp.scenario {
            return self.fan_point(tp, pp, sc);
        }
        let mut results: Vec<VariantResult> = tp.variants.iter().map(new_variant_result).collect();
        let time = self.cfg.run_time(tp);
        for rep in 0..self.cfg.reps {
            for (v, res) in tp.variants.iter().zip(&mut results) {
                let (port, applied) = self.server_for(v)?;
                let before = (tp.test == Test::Crr).then(|| self.context_switches(v));
                let mut r = perf::run_client(
                    self.env,
                    self.cfg,
                    time,
                    tp.test,
                    pp,
                    v,
                    port,
                    rep,
                    self.veth.as_ref(),
                );
                if let Some(before) = before {
                    let after = self.context_switches(v);
                    wakeups(&mut r, before, after);
                }
                self.progress.ran(r.wall_s, time + self.cfg.warmup);
                self.runs += 1;
                if !applied.ok {
                    res.settings_applied = false;
                    res.settings_note = applied.note;
                }
                if v.smcr {
                    res.effective_settings = v.settings.iter().cloned().collect();
                } else if v.smc {
                    res.effective_settings = self.ctl.current.clone();
                }
                res.reps.push(r);
            }
        }
        for r in &mut results {
            r.finish(tp.test.metrics());
        }
        let (id, label) = report::point_label(tp.test, pp.msg_size, pp.concurrency);
        Ok(PointResult {
            id,
            label,
            msg_size: pp.msg_size,
            concurrency: pp.concurrency,
            scenario: None,
            results,
        })
    }

    /// A point of the lgr-pending suite: B made slow or fast, then every repetition of every
    /// variant, each client driving A alone or A and B.
    fn fan_point(
        &mut self,
        tp: &TablePlan,
        pp: &PointPlan,
        sc: Scenario,
    ) -> anyhow::Result<PointResult> {
        if self.fan.is_none() {
            self.fan = Some(perf::Fan::create()?);
        }
        self.fan.as_ref().expect("made").set_slow_b(sc.slow_b)?;
        let mut results: Vec<VariantResult> = tp.variants.iter().map(new_variant_result).collect();
        let time = self.cfg.run_time(tp);
        for rep in 0..self.cfg.reps {
            for (v, res) in tp.variants.iter().zip(&mut results) {
                if v.smcr {
                    // Fresh SMC-R servers for every run: each client is a new process whose
                    // first connections find no link group, and so do the servers' (a server
                    // kept from the previous run would still have groups with the client
                    // process that ended, their QPs retrying towards its address).
                    for mut s in self.fan_servers.remove(&v.name).into_iter().flatten() {
                        s.stop();
                    }
                }
                let [a, b] = self.fan_servers_for(v)?;
                let fan = self.fan.as_ref().expect("made");
                let r = perf::run_fan_client(
                    self.env,
                    self.cfg,
                    time,
                    pp,
                    v,
                    fan,
                    [Some(a), sc.with_b.then_some(b)],
                    rep,
                );
                self.progress.ran(r.wall_s, time + self.cfg.warmup);
                self.runs += 1;
                res.effective_settings = v.settings.iter().cloned().collect();
                res.reps.push(r);
            }
        }
        for r in &mut results {
            r.finish(&plan::FAN_METRICS);
        }
        let (id, label) = sc.names();
        Ok(PointResult {
            id: id.into(),
            label: label.into(),
            msg_size: pp.msg_size,
            concurrency: pp.concurrency,
            scenario: Some(sc),
            results,
        })
    }

    /// The ports of variant `v`'s servers in A's and B's namespace, started (again) if they
    /// are not running. An SMC-R variant's servers replace another SMC-R variant's: one soft
    /// RoCE device per address.
    fn fan_servers_for(&mut self, v: &Variant) -> anyhow::Result<[u16; 2]> {
        let running = self
            .fan_servers
            .get_mut(&v.name)
            .is_some_and(|s| s.iter_mut().all(|s| !procs::has_exited(&mut s.child)));
        if !running {
            let mut stale: Vec<String> = Vec::new();
            if v.smcr {
                stale.extend(
                    self.fan_servers
                        .keys()
                        .filter(|k| **k != v.name && k.starts_with("smcr"))
                        .cloned(),
                );
            }
            if self.fan_servers.contains_key(&v.name) {
                eprintln!("bench: a {} server exited; restarting both", v.name);
                stale.push(v.name.clone());
            }
            for k in stale {
                for mut s in self.fan_servers.remove(&k).into_iter().flatten() {
                    s.stop();
                }
            }
            let fan = self.fan.as_ref().expect("made");
            let start = |i: usize| {
                let (ns, addr) = &fan.servers[i];
                let log = format!("server-{}-{}.log", v.name, ["a", "b"][i]);
                perf::start_ns_server(self.env, ns, *addr, v, &log)
            };
            let servers = [start(0)?, start(1)?];
            self.fan_servers.insert(v.name.clone(), servers);
        }
        let s = &self.fan_servers[&v.name];
        Ok([s[0].port, s[1].port])
    }

    /// Voluntary context switches so far of the server variant `v` runs against and of
    /// smcd (for wake-ups per connection).
    fn context_switches(&self, v: &Variant) -> (Option<u64>, Option<u64>) {
        let server = if v.smc {
            self.smc.as_ref().and_then(|s| s.context_switches())
        } else {
            self.tcp.context_switches()
        };
        (
            server.map(|x| x.0),
            self.smcd.context_switches().map(|x| x.0),
        )
    }

    /// The port to run variant `v` against: for SMC, after setting its sysctls and (re)starting
    /// the SMC server if they changed; for TCP, the TCP server (restarted if it died).
    fn server_for(&mut self, v: &Variant) -> anyhow::Result<(u16, Applied)> {
        if v.veth {
            if self.veth.is_none() {
                self.veth = Some(perf::Veth::create()?);
            }
            let veth = self.veth.as_ref().expect("made");
            let running = self
                .veth_servers
                .get_mut(&v.name)
                .is_some_and(|s| !procs::has_exited(&mut s.child));
            if !running {
                if v.smcr {
                    // One soft RoCE device per address and host: another SMC-R server (other
                    // settings) gives the address up first.
                    let others: Vec<String> = self
                        .veth_servers
                        .keys()
                        .filter(|k| k.starts_with("smcr") && **k != v.name)
                        .cloned()
                        .collect();
                    for k in others {
                        if let Some(mut s) = self.veth_servers.remove(&k) {
                            s.stop();
                        }
                    }
                }
                if let Some(mut old) = self.veth_servers.remove(&v.name) {
                    eprintln!("bench: {} server exited; restarting it", v.name);
                    old.stop();
                }
                let s = perf::start_veth_server(self.env, veth, v)?;
                self.veth_servers.insert(v.name.clone(), s);
            }
            return Ok((self.veth_servers[&v.name].port, Applied::default()));
        }
        if !v.smc {
            let exited = procs::has_exited(&mut self.tcp.child);
            if exited || self.tcp.events != v.events {
                if exited {
                    eprintln!("bench: TCP server exited; restarting it");
                }
                self.tcp.stop();
                self.tcp = perf::start_server(self.env, false, v.events)?;
            }
            return Ok((self.tcp.port, Applied::default()));
        }
        let applied = self.ctl.apply(&v.settings);
        let current = &self.ctl.current;
        let stale = self.smc.as_mut().is_none_or(|s| {
            &s.settings != current || s.events != v.events || procs::has_exited(&mut s.child)
        });
        if stale {
            if let Some(mut old) = self.smc.take() {
                if procs::has_exited(&mut old.child) {
                    eprintln!("bench: SMC server exited; restarting it");
                }
                old.stop();
            }
            let mut s = perf::start_server(self.env, true, v.events)?;
            s.settings = self.ctl.current.clone();
            self.smc = Some(s);
        }
        Ok((self.smc.as_ref().expect("started").port, applied))
    }

    /// What changed in smcd's counters during the suite, the raw snapshot, or why not.
    fn counters(&mut self) -> (Option<BTreeMap<String, f64>>, Option<Value>, Option<String>) {
        match self.ctl.stats() {
            Ok((after, raw)) => {
                let empty = BTreeMap::new();
                let d = report::delta(self.counters_before.as_ref().unwrap_or(&empty), &after);
                self.counters_before = Some(after);
                (Some(d), Some(raw), None)
            }
            Err(e) => (None, None, Some(format!("smcctl --json stats: {e:#}"))),
        }
    }

    /// Stops the servers, then smcd (which removes its socket).
    pub(super) fn stop(mut self) {
        for (_, mut s) in std::mem::take(&mut self.veth_servers) {
            s.stop();
        }
        self.veth = None;
        for mut s in std::mem::take(&mut self.fan_servers)
            .into_values()
            .flatten()
        {
            s.stop();
        }
        self.fan = None;
        if let Some(mut s) = self.smc.take() {
            s.stop();
        }
        self.tcp.stop();
        let _ = procs::stop(&mut self.smcd.child, Duration::from_secs(3));
    }
}

/// Runs left and an estimate of the time they take.
struct Progress {
    left_runs: usize,
    /// Measured plus warm-up seconds of the runs still to come.
    left_nominal: f64,
    overhead_sum: f64,
    done: usize,
}

impl Progress {
    fn new(plans: &[SuitePlan], cfg: &Cfg) -> Progress {
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
        transport: if v.smcr {
            "smcr"
        } else if v.smc {
            "smc"
        } else {
            "tcp"
        }
        .into(),
        settings: v.settings.iter().cloned().collect(),
        settings_applied: true,
        settings_note: None,
        effective_settings: BTreeMap::new(),
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

/// crr: wake-ups (voluntary context switches) per connection of the client, the server and
/// smcd over the run, warm-up included, into the repetition's metrics.
fn wakeups(
    r: &mut RepResult,
    before: (Option<u64>, Option<u64>),
    after: (Option<u64>, Option<u64>),
) {
    let Some(json) = &r.report else { return };
    let Some(conns) = json["total_connections"].as_u64().filter(|&n| n > 0) else {
        return;
    };
    let per = |x: u64| x as f64 / conns as f64;
    let mut total = 0.0;
    let mut put = |name: &str, v: Option<f64>| {
        if let Some(v) = v {
            total += v;
            r.metrics.insert(name.into(), v);
        }
    };
    put("wakeups_client", json["csw_voluntary"].as_u64().map(per));
    let d = |b: Option<u64>, a: Option<u64>| Some(per(a?.checked_sub(b?)?));
    put("wakeups_server", d(before.0, after.0));
    put("wakeups_smcd", d(before.1, after.1));
    r.metrics.insert("wakeups".into(), total);
}
