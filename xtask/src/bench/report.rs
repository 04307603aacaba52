//! Results: the JSON a run writes, the tables and summary lines it prints, the counters it
//! shows, and `--compare` against an earlier run.

use super::machine::Machine;
use super::plan::{Depth, Scenario, Test, human_size, unit};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Bumped when a field changes meaning.
pub const SCHEMA: u32 = 1;

/// One run of `cargo xtask bench`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub schema: u32,
    pub tool: String,
    pub started: String,
    pub finished: String,
    pub depth: Depth,
    pub machine: Machine,
    /// The workspace's git revision.
    pub revision: Option<String>,
    pub config: RunConfig,
    /// Load averages (1, 5, 15 min) when the run started and ended: other work on the machine
    /// moves the figures.
    #[serde(default)]
    pub load_start: Option<[f64; 3]>,
    #[serde(default)]
    pub load_end: Option<[f64; 3]>,
    /// "applied" when every requested sysctl was set, else what failed.
    pub settings_control: String,
    /// The values a variant runs with for the sysctls it does not name, and their source.
    #[serde(default)]
    pub sysctl_defaults: BTreeMap<String, u64>,
    #[serde(default)]
    pub sysctl_defaults_source: String,
    pub suites: Vec<SuiteResult>,
    pub totals: Totals,
}

/// How the runs were made.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunConfig {
    pub reps: usize,
    pub time_s: f64,
    pub warmup_s: f64,
    pub client_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    pub profile: String,
}

/// Counts over the whole run; `complete` and zero errors make a good run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Totals {
    pub points: usize,
    pub runs: usize,
    /// Every point has a TCP median and an SMC median for each SMC variant.
    pub complete: bool,
    /// Data errors reported by smc-perf (wrong bytes, short streams, failed connections).
    pub data_errors: u64,
    /// Runs that produced no result (crash, timeout, nothing measured) without data errors.
    pub failed_runs: usize,
    /// SMC runs of bw/lat that ran over TCP fallback instead of SMC-D.
    pub fallback_runs: usize,
    /// Variant results measured without their requested settings.
    pub settings_not_applied: usize,
}

/// One suite (`--suite` name).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SuiteResult {
    pub name: String,
    pub tables: Vec<TableResult>,
    /// Counter changes during the suite (`smcctl --json stats`, flattened), if available.
    pub counters: Option<BTreeMap<String, f64>>,
    /// `smcctl --json stats` after the suite, as printed (cumulative since smcd started).
    #[serde(default)]
    pub counters_snapshot: Option<Value>,
    /// Why the counters are missing.
    pub counters_note: Option<String>,
    /// Conditions that may explain failures (e.g. ports in TIME_WAIT).
    #[serde(default)]
    pub notes: Vec<String>,
    pub summary: Vec<String>,
    pub wall_s: f64,
}

/// One table of a suite.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TableResult {
    pub id: String,
    /// Measured seconds per run.
    #[serde(default)]
    pub time_s: f64,
    pub title: String,
    pub mirrors: String,
    pub test: Test,
    /// The metric of ratios, plots, summary and compare.
    pub primary: String,
    pub unit: String,
    pub higher_is_better: bool,
    pub variants: Vec<VariantInfo>,
    pub points: Vec<PointResult>,
}

/// A variant as described in the JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VariantInfo {
    pub name: String,
    pub label: String,
    #[serde(default)]
    pub short: String,
    pub smc: bool,
    pub settings: BTreeMap<String, u64>,
}

/// One point: all variants, all repetitions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PointResult {
    /// Unique within the table: `1024` or `c64`.
    pub id: String,
    pub label: String,
    pub msg_size: usize,
    pub concurrency: Option<usize>,
    /// The lgr-pending suite: which peers were driven, and whether B was slow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<Scenario>,
    pub results: Vec<VariantResult>,
}

/// One variant at one point.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VariantResult {
    pub variant: String,
    /// "tcp" or "smc": what the variant asked for (each repetition says what it got).
    pub transport: String,
    pub settings: BTreeMap<String, u64>,
    /// All requested sysctls were in effect for every repetition.
    pub settings_applied: bool,
    /// What was not applied, and what ran instead.
    pub settings_note: Option<String>,
    /// The touched sysctls as in effect for the repetitions (SMC variants).
    #[serde(default)]
    pub effective_settings: BTreeMap<String, u64>,
    pub reps: Vec<RepResult>,
    /// Median over the good repetitions, per metric.
    pub median: BTreeMap<String, f64>,
    pub min: BTreeMap<String, f64>,
    pub max: BTreeMap<String, f64>,
    pub units: BTreeMap<String, String>,
    pub errors: u64,
}

/// One run of smc-perf client.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RepResult {
    pub rep: usize,
    /// A result with zero errors over the transport asked for.
    pub ok: bool,
    pub metrics: BTreeMap<String, f64>,
    pub errors: u64,
    /// smc-perf's mode (`smcd`, `tcp`, `tcp-fallback 0x...`, `N of M connections SMC-D`).
    pub mode: Option<String>,
    /// An SMC bw/lat run that fell back to TCP.
    pub fallback: bool,
    pub wall_s: f64,
    /// smc-perf's JSON as printed.
    pub report: Option<Value>,
    /// Why there is no result (last lines of the client's stderr).
    pub error: Option<String>,
}

impl VariantResult {
    /// Computes median/min/max per metric over the good repetitions.
    pub fn finish(&mut self, metrics: &[&str]) {
        for &m in metrics {
            let mut vals: Vec<f64> = self
                .reps
                .iter()
                .filter(|r| r.ok)
                .filter_map(|r| r.metrics.get(m).copied())
                .filter(|v| v.is_finite())
                .collect();
            if vals.is_empty() {
                continue;
            }
            vals.sort_by(f64::total_cmp);
            self.median.insert(m.into(), median(&vals));
            self.min.insert(m.into(), vals[0]);
            self.max.insert(m.into(), vals[vals.len() - 1]);
            self.units.insert(m.into(), unit(m).into());
        }
        self.errors = self.reps.iter().map(|r| r.errors).sum();
    }
}

/// Median of sorted values (mean of the middle two for an even count).
pub fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// A value for a table cell.
pub fn num(metric: &str, v: f64) -> String {
    if metric == "smc_share" {
        return format!("{:.0}%", v * 100.0);
    }
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn pct(r: f64) -> String {
    if r >= 0.1 {
        format!("{:.0} %", r * 100.0)
    } else {
        format!("{:.1} %", r * 100.0)
    }
}

fn short_metric(m: &str) -> &str {
    match m {
        "lat_us_mean" => "mean",
        "lat_us_p50" => "p50",
        "lat_us_p99" => "p99",
        "smc_share" => "SMC-D",
        "mbps" => "MB/s",
        "conns_per_s" => "conn/s",
        other => other,
    }
}

/// The columns shown for each variant: all of the table's metrics with two variants, the
/// primary metric (and crr's SMC share) with three.
fn columns(t: &TableResult, shown: &[&str]) -> Vec<(usize, String)> {
    let mut cols = Vec::new();
    for (vi, v) in t.variants.iter().enumerate() {
        for &m in shown {
            if m == "smc_share" && !v.smc {
                continue;
            }
            if t.variants.len() > 2 && m != t.primary && m != "smc_share" {
                continue;
            }
            cols.push((vi, m.to_string()));
        }
    }
    cols
}

/// Prints a table: size (or concurrency), each variant's medians, then ratios.
pub fn table(t: &TableResult, shown: &[&str], reps: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{}  [median of {reps}; mirrors {}]",
        t.title, t.mirrors
    );
    let cols = columns(t, shown);
    let n = t.variants.len();
    let last = &t.variants[n - 1];
    let mut ratios = vec![(n - 1, 0)];
    if n > 2 {
        ratios.push((n - 1, n - 2));
    }
    let first_col = if t.test == Test::Crr {
        "concurrency"
    } else {
        "msg size"
    };
    // A variant's first column carries its label (with the metric when it has several
    // metrics); its further columns only the metric.
    let mut header = vec![first_col.to_string()];
    for (ci, (vi, m)) in cols.iter().enumerate() {
        let v = &t.variants[*vi];
        let first = ci == 0 || cols[ci - 1].0 != *vi;
        let several = cols
            .iter()
            .filter(|(i, x)| i == vi && x != "smc_share")
            .count()
            > 1;
        header.push(match (first, several) {
            (true, true) => format!("{} {}", v.label, short_metric(m)),
            (true, false) => v.label.clone(),
            (false, _) => short_metric(m).to_string(),
        });
    }
    for &(a, b) in &ratios {
        header.push(format!("{}/{}", t.variants[a].short, t.variants[b].short));
    }
    let mut rows = vec![header];
    let mut any_unapplied = false;
    let mut any_noisy = false;
    for p in &t.points {
        let mut row = vec![p.label.clone()];
        for (vi, m) in &cols {
            let r = &p.results[*vi];
            let mut cell = r.median.get(m).map_or("–".into(), |&v| num(m, v));
            if noisy(r, m) {
                cell.push('~');
                any_noisy = true;
            }
            if !r.settings_applied {
                cell.push('*');
                any_unapplied = true;
            }
            row.push(cell);
        }
        for &(a, b) in &ratios {
            row.push(ratio(p, a, b, &t.primary).map_or("–".into(), pct));
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for (i, r) in rows.iter().enumerate() {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, &w)| format!("{c:>w$}"))
            .collect();
        let _ = writeln!(out, "  {}", line.join("  "));
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
            let _ = writeln!(out, "  {}", rule.join("  "));
        }
    }
    if any_noisy {
        let _ = writeln!(
            out,
            "  ~ the repetitions' largest and smallest value differ by more than 1.5x: a noisy \
             point (all repetitions are in the JSON)"
        );
    }
    if any_unapplied {
        let _ = writeln!(
            out,
            "  * settings not applied (smcctl sysctl set failed): measured with smcd's current \
             values, see settings_note in the JSON"
        );
    }
    // crr: where the wake-ups of a connection happen (medians; client + server + smcd).
    if t.points
        .iter()
        .any(|p| p.results.iter().any(|r| r.median.contains_key("wakeups")))
    {
        let _ = writeln!(
            out,
            "  wake-ups per connection (voluntary context switches, median): client + server + smcd"
        );
        for p in &t.points {
            let cells: Vec<String> = p
                .results
                .iter()
                .zip(&t.variants)
                .filter_map(|(r, v)| {
                    let g = |m: &str| r.median.get(m).copied();
                    Some(format!(
                        "{} {:.1} ({:.1} + {:.1} + {:.2})",
                        v.label,
                        g("wakeups")?,
                        g("wakeups_client").unwrap_or(f64::NAN),
                        g("wakeups_server").unwrap_or(f64::NAN),
                        g("wakeups_smcd").unwrap_or(f64::NAN)
                    ))
                })
                .collect();
            let _ = writeln!(out, "    {:>11}: {}", p.label, cells.join(" · "));
        }
    }
    let _ = writeln!(
        out,
        "  (ratios of {} medians, {}: {})",
        short_metric(&t.primary),
        last.label,
        if t.higher_is_better {
            "above 100 % is better"
        } else {
            "below 100 % is better"
        }
    );
    out
}

/// The repetitions of `metric` spread by more than 1.5x (largest / smallest).
fn noisy(r: &VariantResult, metric: &str) -> bool {
    match (r.min.get(metric), r.max.get(metric)) {
        (Some(&lo), Some(&hi)) if lo > 0.0 => hi / lo > 1.5,
        _ => false,
    }
}

/// Median of variant `a` over median of variant `b` at point `p`.
pub fn ratio(p: &PointResult, a: usize, b: usize, metric: &str) -> Option<f64> {
    let x = *p.results.get(a)?.median.get(metric)?;
    let y = *p.results.get(b)?.median.get(metric)?;
    (y > 0.0 && x > 0.0).then(|| x / y)
}

/// Geometric mean of the ratios a/b over the table, and the points with the lowest and
/// highest ratio.
/// A ratio and the point it belongs to.
type At = (f64, String);

fn ratio_stats(t: &TableResult, a: usize, b: usize) -> Option<(f64, At, At)> {
    let rs: Vec<At> = t
        .points
        .iter()
        .filter_map(|p| ratio(p, a, b, &t.primary).map(|r| (r, p.label.clone())))
        .collect();
    if rs.is_empty() {
        return None;
    }
    let geo = (rs.iter().map(|(r, _)| r.ln()).sum::<f64>() / rs.len() as f64).exp();
    let lo = rs.iter().min_by(|x, y| x.0.total_cmp(&y.0))?.clone();
    let hi = rs.iter().max_by(|x, y| x.0.total_cmp(&y.0))?.clone();
    Some((geo, lo, hi))
}

/// The point of `t` measured in scenario `sc`.
fn at(t: &TableResult, sc: Scenario) -> Option<&PointResult> {
    t.points.iter().find(|p| p.scenario == Some(sc))
}

/// Metric `m` of A beside B over the same alone, for variant `vi`, B fast or slow.
fn fan_ratio(t: &TableResult, vi: usize, slow_b: bool, m: &str) -> Option<f64> {
    let get = |with_b| {
        let p = at(t, Scenario { with_b, slow_b })?;
        p.results.get(vi)?.median.get(m).copied()
    };
    let (alone, beside) = (get(false)?, get(true)?);
    (alone > 0.0 && beside > 0.0).then(|| beside / alone)
}

/// Is this a table of the lgr-pending suite (its points are scenarios)?
pub fn is_fan(t: &TableResult) -> bool {
    !t.points.is_empty() && t.points.iter().all(|p| p.scenario.is_some())
}

/// The lgr-pending suite's table: per scenario, each variant's rate to A and to B, how long
/// the first connections to A and to B took (every loop starts at once: over SMC-R that is
/// the link groups' setup) and, for SMC-R, the link groups the connections to A and to B used
/// (warm-up included); then, B fast and B slow, A beside B over A alone.
pub fn fan_table(t: &TableResult, reps: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{}  [median of {reps}; mirrors {}]",
        t.title, t.mirrors
    );
    let mut header = vec!["scenario".to_string()];
    for v in &t.variants {
        header.push(format!("{} A", v.label));
        header.push(format!("{} B", v.label));
        header.push(format!("{} setup ms A/B", v.label));
        if v.smc {
            header.push(format!("{} groups A/B", v.label));
        }
    }
    let mut rows = vec![header];
    let mut any_noisy = false;
    let mut any_kept = false;
    for p in &t.points {
        let mut row = vec![p.label.clone()];
        for (v, r) in t.variants.iter().zip(&p.results) {
            let kept = r.reps.iter().any(|x| x.ok && x.errors > 0);
            for m in ["conns_per_s_a", "conns_per_s_b"] {
                let mut cell = r.median.get(m).map_or("–".into(), |&x| num(m, x));
                if noisy(r, m) {
                    cell.push('~');
                    any_noisy = true;
                }
                if kept {
                    cell.push('!');
                    any_kept = true;
                }
                row.push(cell);
            }
            let g = |m: &str| r.median.get(m).map_or("–".into(), |&x| num(m, x));
            row.push(format!("{}/{}", g("setup_ms_a"), g("setup_ms_b")));
            if v.smc {
                let g = |m: &str| r.median.get(m).map_or("–".into(), |x| format!("{x:.0}"));
                row.push(format!("{}/{}", g("lgrs_a"), g("lgrs_b")));
            }
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for (i, r) in rows.iter().enumerate() {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (x, &w))| {
                if c == 0 {
                    format!("{x:<w$}")
                } else {
                    format!("{x:>w$}")
                }
            })
            .collect();
        let _ = writeln!(out, "  {}", line.join("  "));
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
            let _ = writeln!(out, "  {}", rule.join("  "));
        }
    }
    for (slow_b, what) in [
        (false, "A beside B / A alone"),
        (true, "A beside slow B / A alone"),
    ] {
        let cells = |m: &str| {
            t.variants
                .iter()
                .enumerate()
                .map(|(vi, v)| {
                    format!(
                        "{} {}",
                        v.label,
                        fan_ratio(t, vi, slow_b, m).map_or("–".into(), pct)
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "  {what:<26} conn/s: {}; setup: {}",
            cells(&t.primary),
            cells("setup_ms_a")
        );
    }
    if any_noisy {
        let _ = writeln!(
            out,
            "  ~ the repetitions' largest and smallest value differ by more than 1.5x: a noisy \
             point (all repetitions are in the JSON)"
        );
    }
    if any_kept {
        let reps: Vec<&RepResult> = t
            .points
            .iter()
            .flat_map(|p| &p.results)
            .flat_map(|r| &r.reps)
            .collect();
        let kept = reps.iter().filter(|x| x.ok && x.errors > 0).count();
        let errors: u64 = reps
            .iter()
            .filter(|x| x.ok && x.errors > 0)
            .map(|x| x.errors)
            .sum();
        let _ = writeln!(
            out,
            "  ! among the medians' runs, {kept} had failed connections ({errors} in all) that \
             cost every peer less than 1 % of its loops' time in the window; they count as \
             data errors (see error in the JSON)"
        );
    }
    let _ = writeln!(
        out,
        "  (conn/s to each peer in the same window; setup = until every loop of a peer had its \
         first connection. A lock held across setup would bring A's rate down towards B's and \
         A's setup up to B's when B is slow: conn/s near 100 % and setup near 100 % say A's \
         setups do not wait for B's)"
    );
    out
}

/// One summary line per table: geometric mean of the SMC/TCP ratio (and, with three
/// variants, of feature-on/feature-off) with its range; for the lgr-pending suite, A's rate
/// beside B over A's rate alone per variant.
pub fn summary(t: &TableResult) -> Vec<String> {
    if is_fan(t) {
        let part = |slow_b| {
            t.variants
                .iter()
                .enumerate()
                .map(|(vi, v)| {
                    format!(
                        "{} {}",
                        v.label,
                        fan_ratio(t, vi, slow_b, &t.primary).map_or("–".into(), pct)
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        return vec![format!(
            "{} [conn/s to A, higher is better]: A beside slow B / A alone: {}; A beside B / A \
             alone: {}",
            t.id,
            part(true),
            part(false)
        )];
    }
    let n = t.variants.len();
    let mut pairs = vec![(n - 1, 0)];
    if n > 2 {
        pairs.push((n - 1, n - 2));
    }
    let what = if short_metric(&t.primary) == unit(&t.primary) {
        unit(&t.primary).to_string()
    } else {
        format!("{} {}", short_metric(&t.primary), unit(&t.primary))
    };
    let better = if t.higher_is_better {
        "higher is better"
    } else {
        "lower is better"
    };
    let mut parts = Vec::new();
    for (a, b) in pairs {
        if let Some((geo, lo, hi)) = ratio_stats(t, a, b) {
            parts.push(format!(
                "{} vs {}: {} (geo mean over {}; {} at {} .. {} at {})",
                t.variants[a].label,
                t.variants[b].label,
                pct(geo),
                t.points.len(),
                pct(lo.0),
                lo.1,
                pct(hi.0),
                hi.1
            ));
        }
    }
    if parts.is_empty() {
        return vec![format!("{}: no complete point", t.id)];
    }
    vec![format!("{} [{what}, {better}]: {}", t.id, parts.join("; "))]
}

/// The point label: message size, or concurrency for crr.
pub fn point_label(test: Test, msg_size: usize, concurrency: Option<usize>) -> (String, String) {
    match (test, concurrency) {
        (Test::Crr, Some(c)) => (format!("c{c}"), c.to_string()),
        _ => (msg_size.to_string(), human_size(msg_size)),
    }
}

// ------------------------------------------------------------------------------------------
// Counters.

/// Flattens the numeric leaves of a JSON value (objects only) into `a.b.c → number`.
pub fn flatten(v: &Value, prefix: &str, out: &mut BTreeMap<String, f64>) {
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64() {
                out.insert(prefix.to_string(), f);
            }
        }
        Value::Bool(b) => {
            out.insert(prefix.to_string(), f64::from(u8::from(*b)));
        }
        Value::Object(m) => {
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(x, &p, out);
            }
        }
        // Lists (fallback reasons, most frequent first) change order between snapshots, so a
        // difference by position means nothing; they stay in the raw snapshot.
        _ => {}
    }
}

/// after − before, per counter (counters new in `after` count from 0).
pub fn delta(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, &v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .collect()
}

/// The counters that explain the figures: corking, nodelay, fallbacks, handshake errors.
pub fn interesting(counters: &BTreeMap<String, f64>) -> Vec<(String, f64)> {
    const WORDS: [&str; 7] = [
        "cork",
        "nodelay",
        "fback",
        "fallback",
        "hs_err",
        "handshake",
        "connections",
    ];
    counters
        .iter()
        .filter(|(k, _)| {
            let k = k.to_ascii_lowercase();
            WORDS.iter().any(|w| k.contains(w))
        })
        .map(|(k, &v)| (k.clone(), v))
        .collect()
}

// ------------------------------------------------------------------------------------------
// Compare.

struct Old {
    median: f64,
    higher: bool,
}

fn index(run: &Value) -> BTreeMap<(String, String, String), Old> {
    let mut map = BTreeMap::new();
    let empty = Vec::new();
    for s in run["suites"].as_array().unwrap_or(&empty) {
        for t in s["tables"].as_array().unwrap_or(&empty) {
            let (Some(tid), Some(primary)) = (t["id"].as_str(), t["primary"].as_str()) else {
                continue;
            };
            let higher = t["higher_is_better"].as_bool().unwrap_or(true);
            for p in t["points"].as_array().unwrap_or(&empty) {
                let pid = p["id"].as_str().unwrap_or_default();
                for r in p["results"].as_array().unwrap_or(&empty) {
                    let v = r["variant"].as_str().unwrap_or_default();
                    if let Some(m) = r["median"][primary].as_f64() {
                        map.insert(
                            (tid.to_string(), pid.to_string(), v.to_string()),
                            Old { median: m, higher },
                        );
                    }
                }
            }
        }
    }
    map
}

/// Each point's change from `old` to `new` (primary metric medians), as a printable table.
/// Changes under 5 % are shown but not called better or worse.
pub fn compare(old: &Value, new: &Value) -> String {
    let before = index(old);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\ncompare: {} ({}) -> {} ({})",
        old["started"].as_str().unwrap_or("?"),
        old["machine"]["line"].as_str().unwrap_or("?"),
        new["started"].as_str().unwrap_or("?"),
        new["machine"]["line"].as_str().unwrap_or("?"),
    );
    let mut rows = vec![vec![
        "table".to_string(),
        "point".into(),
        "variant".into(),
        "old".into(),
        "new".into(),
        "change".into(),
        String::new(),
    ]];
    let (mut better, mut worse, mut same, mut missing) = (0, 0, 0, 0);
    let empty = Vec::new();
    for s in new["suites"].as_array().unwrap_or(&empty) {
        for t in s["tables"].as_array().unwrap_or(&empty) {
            let tid = t["id"].as_str().unwrap_or_default();
            let primary = t["primary"].as_str().unwrap_or_default();
            for p in t["points"].as_array().unwrap_or(&empty) {
                let pid = p["id"].as_str().unwrap_or_default();
                let label = p["label"].as_str().unwrap_or(pid);
                for r in p["results"].as_array().unwrap_or(&empty) {
                    let v = r["variant"].as_str().unwrap_or_default();
                    let Some(now) = r["median"][primary].as_f64() else {
                        continue;
                    };
                    let key = (tid.to_string(), pid.to_string(), v.to_string());
                    let Some(o) = before.get(&key) else {
                        missing += 1;
                        continue;
                    };
                    let change = (now - o.median) / o.median;
                    let verdict = if change.abs() < 0.05 {
                        same += 1;
                        ""
                    } else if (change > 0.0) == o.higher {
                        better += 1;
                        "better"
                    } else {
                        worse += 1;
                        "worse"
                    };
                    rows.push(vec![
                        tid.to_string(),
                        label.to_string(),
                        v.to_string(),
                        num(primary, o.median),
                        num(primary, now),
                        format!("{:+.1} %", change * 100.0),
                        verdict.to_string(),
                    ]);
                }
            }
        }
    }
    let widths: Vec<usize> = (0..7)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, &w))| {
                if i < 3 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        let _ = writeln!(out, "  {}", line.join("  ").trim_end());
    }
    let _ = writeln!(
        out,
        "  {better} better, {worse} worse, {same} within 5 %, {missing} not in the old run"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vr(name: &str, median: f64) -> VariantResult {
        VariantResult {
            variant: name.into(),
            transport: "tcp".into(),
            settings: BTreeMap::new(),
            settings_applied: true,
            settings_note: None,
            effective_settings: BTreeMap::new(),
            reps: Vec::new(),
            median: [("mbps".to_string(), median)].into(),
            min: BTreeMap::new(),
            max: BTreeMap::new(),
            units: BTreeMap::new(),
            errors: 0,
        }
    }

    fn table_with(points: &[(usize, f64, f64)]) -> TableResult {
        TableResult {
            id: "bw/stream".into(),
            time_s: 0.5,
            title: "bw".into(),
            mirrors: "qperf".into(),
            test: Test::Bw,
            primary: "mbps".into(),
            unit: "MB/s".into(),
            higher_is_better: true,
            variants: vec![
                VariantInfo {
                    name: "tcp".into(),
                    label: "TCP".into(),
                    short: "TCP".into(),
                    smc: false,
                    settings: BTreeMap::new(),
                },
                VariantInfo {
                    name: "smc".into(),
                    label: "SMC".into(),
                    short: "SMC".into(),
                    smc: true,
                    settings: BTreeMap::new(),
                },
            ],
            points: points
                .iter()
                .map(|&(s, t, m)| PointResult {
                    id: s.to_string(),
                    label: human_size(s),
                    msg_size: s,
                    concurrency: None,
                    scenario: None,
                    results: vec![vr("tcp", t), vr("smc", m)],
                })
                .collect(),
        }
    }

    #[test]
    fn median_odd_and_even() {
        assert_eq!(median(&[1.0, 2.0, 9.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 4.0, 9.0]), 3.0);
    }

    #[test]
    fn finish_ignores_bad_reps() {
        let mut r = vr("smc", 0.0);
        r.median.clear();
        for (i, (v, ok)) in [(5.0, true), (100.0, false), (7.0, true), (6.0, true)]
            .into_iter()
            .enumerate()
        {
            r.reps.push(RepResult {
                rep: i,
                ok,
                metrics: [("mbps".to_string(), v)].into(),
                errors: u64::from(!ok),
                mode: None,
                fallback: false,
                wall_s: 0.0,
                report: None,
                error: None,
            });
        }
        r.finish(&["mbps"]);
        assert_eq!(r.median["mbps"], 6.0);
        assert_eq!((r.min["mbps"], r.max["mbps"]), (5.0, 7.0));
        assert_eq!(r.errors, 1);
    }

    #[test]
    fn table_and_summary_show_ratios() {
        let t = table_with(&[(1, 1.0, 30.0), (1024, 900.0, 5400.0)]);
        let s = table(&t, &["mbps"], 3);
        assert!(s.contains("SMC/TCP"), "{s}");
        assert!(s.contains("3000 %"), "{s}");
        assert!(s.contains("600 %"), "{s}");
        let line = &summary(&t)[0];
        // geo mean of 30 and 6 = 13.4
        assert!(line.contains("1342 %"), "{line}");
    }

    #[test]
    fn noisy_points_are_marked() {
        let mut t = table_with(&[(64, 10.0, 100.0)]);
        let r = &mut t.points[0].results[1];
        r.min.insert("mbps".into(), 50.0);
        r.max.insert("mbps".into(), 100.0);
        let s = table(&t, &["mbps"], 3);
        assert!(s.contains("100~"), "{s}");
        assert!(s.contains("noisy point"), "{s}");
    }

    #[test]
    fn compare_reports_changes() {
        let old = serde_json::json!({"suites": [{"tables": [serde_json::to_value(
            table_with(&[(64, 10.0, 100.0)])).expect("json")]}]});
        let new = serde_json::json!({"suites": [{"tables": [serde_json::to_value(
            table_with(&[(64, 10.2, 50.0)])).expect("json")]}]});
        let s = compare(&old, &new);
        assert!(s.contains("-50.0 %"), "{s}");
        assert!(s.contains("worse"), "{s}");
        assert!(s.contains("0 better, 1 worse, 1 within 5 %"), "{s}");
    }

    #[test]
    fn counters_flatten_and_delta() {
        let mut a = BTreeMap::new();
        let mut b = BTreeMap::new();
        let before = serde_json::json!({"extras": {"cork": 1, "nodelay": 2},
            "fallback": {"total": 1, "server_reasons": [{"code": 1, "count": 1}]}});
        let after = serde_json::json!({"extras": {"cork": 5, "nodelay": 2},
            "fallback": {"total": 4, "server_reasons": [{"code": 7, "count": 3}]},
            "rx": {"bytes": 10}});
        flatten(&before, "", &mut a);
        flatten(&after, "", &mut b);
        let d = delta(&a, &b);
        assert_eq!(d["extras.cork"], 4.0);
        assert_eq!(d["rx.bytes"], 10.0);
        assert!(!d.keys().any(|k| k.contains("reasons")));
        let i = interesting(&d);
        let keys: Vec<&str> = i.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["extras.cork", "extras.nodelay", "fallback.total"]);
    }
}
