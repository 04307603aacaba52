//! What each suite measures: its tables, the variants compared (always TCP first, then one
//! or two SMC configurations), the message sizes or concurrencies, and which kernel
//! benchmark it mirrors.

use serde::{Deserialize, Serialize};

/// How much to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Depth {
    /// Every size, 2 s points.
    Full,
    /// Fewer sizes, 0.5 s points: the whole run in under 3 minutes on 2 cores.
    Quick,
    /// Two sizes or fewer per table, 0.2 s points: a check that everything runs.
    Smoke,
}

impl Depth {
    /// Measured seconds per run.
    pub fn time(self) -> f64 {
        match self {
            Depth::Full => 2.0,
            Depth::Quick => 0.5,
            Depth::Smoke => 0.2,
        }
    }
    /// Unmeasured seconds before measuring.
    pub fn warmup(self) -> f64 {
        match self {
            Depth::Full => 0.3,
            Depth::Quick => 0.1,
            Depth::Smoke => 0.05,
        }
    }
}

/// The smc-perf test a table runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Test {
    /// One-way stream.
    Bw,
    /// Ping-pong.
    Lat,
    /// Connect, request, response, close.
    Crr,
}

impl Test {
    /// The `--test` argument.
    pub fn arg(self) -> &'static str {
        match self {
            Test::Bw => "bw",
            Test::Lat => "lat",
            Test::Crr => "crr",
        }
    }
    /// The metrics a run of this test yields (medians are taken of each).
    pub fn metrics(self) -> &'static [&'static str] {
        match self {
            Test::Bw => &["mbps", "msgs_per_s"],
            Test::Lat => &["lat_us_mean", "lat_us_p50", "lat_us_p99", "msgs_per_s"],
            Test::Crr => &[
                "conns_per_s",
                "smc_share",
                "wakeups",
                "wakeups_client",
                "wakeups_server",
                "wakeups_smcd",
            ],
        }
    }
}

/// The unit of a metric.
pub fn unit(metric: &str) -> &'static str {
    match metric {
        "mbps" => "MB/s",
        "msgs_per_s" => "msg/s",
        "conns_per_s" => "conn/s",
        "smc_share" => "fraction of connections over SMC-D",
        m if m.starts_with("wakeups") => "wake-ups per connection",
        "conns_per_s_a" | "conns_per_s_b" => "conn/s",
        "first_contacts" => "link groups the client made (first contacts), warm-up included",
        "lgrs_a" | "lgrs_b" => "link groups the target's connections used, warm-up included",
        "setup_ms_a" | "setup_ms_b" => {
            "ms until every loop of the target had its first connection (link group setup)"
        }
        m if m.starts_with("lat_us") => "µs",
        _ => "",
    }
}

/// One configuration a point is measured in.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Variant {
    /// Key in the JSON (`tcp`, `smc`, `smc-split-on`, ...).
    pub name: String,
    /// Column header.
    pub label: String,
    /// In ratio headers (`on/off`, `SMC/TCP`).
    pub short: String,
    /// SMC (through the engine) or plain TCP on both ends.
    pub smc: bool,
    /// Sysctls set through `smcctl sysctl set` before the SMC server and client start.
    pub settings: Vec<(String, u64)>,
    /// Client and server run event loops (`smc-perf --events`: wrk against nginx) instead of
    /// a thread per connection.
    pub events: bool,
    /// Server and client in two network namespaces joined by a veth pair (two hosts), not
    /// both on 127.0.0.1.
    #[serde(default)]
    pub veth: bool,
    /// SMC-R over the soft RoCEv2 device (`smc-perf --smcr`); `settings` go to the endpoints
    /// as `--smcr-set`, not to smcd.
    #[serde(default)]
    pub smcr: bool,
    /// One client namespace and two server namespaces (the lgr-pending suite): the point's
    /// [`Scenario`] says which servers the client drives.
    #[serde(default)]
    pub fan: bool,
    /// The client holds one lock across every connect (`smc-perf --setup-lock`): the
    /// kernel's lgr-pending serialisation, as a control for the lgr-pending suite.
    #[serde(default)]
    pub setup_lock: bool,
}

impl Variant {
    /// The same variant with event-loop client and server.
    fn events(mut self) -> Variant {
        self.events = true;
        self
    }
}

fn tcp() -> Variant {
    Variant {
        name: "tcp".into(),
        label: "TCP".into(),
        short: "TCP".into(),
        smc: false,
        settings: Vec::new(),
        events: false,
        veth: false,
        smcr: false,
        fan: false,
        setup_lock: false,
    }
}

fn tcp_veth() -> Variant {
    Variant {
        name: "tcp-veth".into(),
        label: "TCP (veth)".into(),
        veth: true,
        ..tcp()
    }
}

fn smcr(name: &str, label: &str, short: &str, settings: &[(&str, u64)]) -> Variant {
    Variant {
        veth: true,
        smcr: true,
        ..smc(name, label, short, settings)
    }
}

/// TCP from the client namespace to the two server namespaces.
fn tcp_fan() -> Variant {
    Variant {
        name: "tcp-fan".into(),
        fan: true,
        ..tcp()
    }
}

/// SMC-R from the client namespace's one endpoint to the two server namespaces.
fn smcr_fan(name: &str, label: &str, short: &str, settings: &[(&str, u64)]) -> Variant {
    Variant {
        fan: true,
        smcr: true,
        ..smc(name, label, short, settings)
    }
}

fn smc(name: &str, label: &str, short: &str, settings: &[(&str, u64)]) -> Variant {
    Variant {
        name: name.into(),
        label: label.into(),
        short: short.into(),
        smc: true,
        settings: settings.iter().map(|&(k, v)| (k.into(), v)).collect(),
        events: false,
        veth: false,
        smcr: false,
        fan: false,
        setup_lock: false,
    }
}

/// One table: a test over a list of sizes (or concurrencies) in two or three variants.
#[derive(Debug, Clone)]
pub struct TablePlan {
    /// `suite/table`.
    pub id: String,
    /// Heading.
    pub title: String,
    /// The kernel team's benchmark this reproduces.
    pub mirrors: String,
    pub test: Test,
    /// The metric of the ratios and the summary.
    pub primary: &'static str,
    /// Metrics shown per variant in the printed table.
    pub shown: Vec<&'static str>,
    pub higher_is_better: bool,
    /// TCP first; with three, the last is the feature on (or the engine's default) and the
    /// middle one the feature off.
    pub variants: Vec<Variant>,
    pub points: Vec<PointPlan>,
    /// Cap on the measured seconds of a run, for tables whose runs must stay short.
    pub max_time: Option<f64>,
}

/// One point of a table.
#[derive(Debug, Clone, Copy)]
pub struct PointPlan {
    pub msg_size: usize,
    /// crr only (in the lgr-pending suite: per target).
    pub concurrency: Option<usize>,
    /// The lgr-pending suite: which peers are driven, and whether B is slow.
    pub scenario: Option<Scenario>,
}

/// A point of the lgr-pending suite: crr to peer A alone or to A and B at once, from one
/// process (one SMC-R endpoint), with B at full speed or slowed by a delay on its link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scenario {
    /// B is driven too (`smc-perf --also`).
    pub with_b: bool,
    /// Every packet towards B waits [`super::perf::SLOW_B_DELAY`].
    pub slow_b: bool,
}

impl Scenario {
    /// `(id, label)` of the point.
    pub fn names(self) -> (&'static str, &'static str) {
        match (self.with_b, self.slow_b) {
            (false, false) => ("a", "A alone"),
            (true, false) => ("a+b", "A + B"),
            (false, true) => ("a/slow-b", "A alone, B slow"),
            (true, true) => ("a+slow-b", "A + slow B"),
        }
    }
}

/// The lgr-pending suite's four points at `concurrency` loops per target: A alone and with
/// B, then the same with B slow (A alone is measured again there, beside its pair).
fn fan_points(concurrency: usize) -> Vec<PointPlan> {
    [(false, false), (true, false), (false, true), (true, true)]
        .into_iter()
        .map(|(with_b, slow_b)| PointPlan {
            msg_size: 64,
            concurrency: Some(concurrency),
            scenario: Some(Scenario { with_b, slow_b }),
        })
        .collect()
}

/// A suite: the unit of `--suite` and of the counters snapshot.
#[derive(Debug, Clone)]
pub struct SuitePlan {
    pub name: &'static str,
    pub tables: Vec<TablePlan>,
}

/// Suite names in run order.
/// crr runs last: its connection churn leaves tens of thousands of sockets in TIME_WAIT for a
/// minute, which should not be around while the other suites measure.
/// smcr runs in two network namespaces of its own, smcr-lgr in three (both need root, `ip`,
/// and for smcr-lgr `/dev/net/tun`).
pub const SUITES: [&str; 7] = ["bw", "lat", "pp", "ablation", "smcr", "smcr-lgr", "crr"];

/// Suites that make network namespaces: skipped in the default run without root.
pub fn needs_root(suite: &str) -> bool {
    matches!(suite, "smcr" | "smcr-lgr")
}

/// The metrics of a point of the lgr-pending suite (medians are taken of each).
pub const FAN_METRICS: [&str; 9] = [
    "conns_per_s_a",
    "conns_per_s_b",
    "conns_per_s",
    "smc_share",
    "first_contacts",
    "lgrs_a",
    "lgrs_b",
    "setup_ms_a",
    "setup_ms_b",
];

const KIB: usize = 1024;

fn doubling(from: usize, to: usize) -> Vec<usize> {
    std::iter::successors(Some(from), |&s| (s < to).then_some(s * 2)).collect()
}

fn crr_points(concurrency: Vec<usize>) -> Vec<PointPlan> {
    concurrency
        .into_iter()
        .map(|c| PointPlan {
            msg_size: 64,
            concurrency: Some(c),
            scenario: None,
        })
        .collect()
}

fn sizes(v: Vec<usize>) -> Vec<PointPlan> {
    v.into_iter()
        .map(|msg_size| PointPlan {
            msg_size,
            concurrency: None,
            scenario: None,
        })
        .collect()
}

fn pick<T: Clone>(depth: Depth, full: T, quick: T, smoke: T) -> T {
    match depth {
        Depth::Full => full,
        Depth::Quick => quick,
        Depth::Smoke => smoke,
    }
}

/// The plan of one suite.
pub fn suite(name: &str, depth: Depth) -> Option<SuitePlan> {
    let lat_shown = vec!["lat_us_mean", "lat_us_p50", "lat_us_p99"];
    let tables = match name {
        "bw" => vec![TablePlan {
            id: "bw/stream".into(),
            title: "bw: one-way stream throughput, MB/s".into(),
            mirrors: "qperf tcp_bw (loopback-ism cover letter)".into(),
            test: Test::Bw,
            primary: "mbps",
            shown: vec!["mbps"],
            higher_is_better: true,
            variants: vec![tcp(), smc("smc", "SMC", "SMC", &[])],
            points: sizes(pick(
                depth,
                doubling(1, 64 * KIB),
                vec![1, 64, KIB, 16 * KIB, 64 * KIB],
                vec![64, 64 * KIB],
            )),
            max_time: None,
        }],
        "lat" => vec![TablePlan {
            id: "lat/pingpong".into(),
            title: "lat: ping-pong one-way latency, µs (mean / p50 / p99)".into(),
            mirrors: "qperf tcp_lat (loopback-ism cover letter)".into(),
            test: Test::Lat,
            primary: "lat_us_p50",
            shown: lat_shown.clone(),
            higher_is_better: false,
            variants: vec![tcp(), smc("smc", "SMC", "SMC", &[])],
            points: sizes(pick(
                depth,
                doubling(1, 64 * KIB),
                vec![1, 64, KIB, 16 * KIB, 64 * KIB],
                vec![64, 64 * KIB],
            )),
            max_time: None,
        }],
        "pp" => {
            let buf = [("wmem", 512 * KIB as u64), ("rmem", 512 * KIB as u64)];
            let off = [buf[0], buf[1], ("autosplit_size", 536_870_912)];
            let on = [buf[0], buf[1], ("autosplit_size", 131_072)];
            vec![TablePlan {
                id: "pp/autosplit".into(),
                title: "pp: large-message ping-pong, one-way µs, wmem=rmem=512 KiB".into(),
                mirrors: "sockperf ping-pong, autosplit patch (Jul 2024)".into(),
                test: Test::Lat,
                primary: "lat_us_p50",
                shown: lat_shown.clone(),
                higher_is_better: false,
                variants: vec![
                    tcp(),
                    smc("smc-split-off", "SMC split off", "off", &off),
                    smc("smc-split-on", "SMC split on", "on", &on),
                ],
                points: sizes(pick(
                    depth,
                    vec![128 * KIB, 256 * KIB, 512 * KIB, 1024 * KIB],
                    vec![128 * KIB, 1024 * KIB],
                    vec![256 * KIB],
                )),
                max_time: None,
            }]
        }
        "crr" => vec![
            TablePlan {
                id: "crr/close".into(),
                title: "crr: connect, 64 B request/response, close; conn/s by concurrency (hs-limit = limit_smc_hs)"
                    .into(),
                mirrors: "wrk with Connection: close (handshake limitation patches)".into(),
                test: Test::Crr,
                primary: "conns_per_s",
                shown: vec!["conns_per_s", "smc_share"],
                higher_is_better: true,
                variants: vec![
                    tcp(),
                    smc("smc-hs-off", "SMC hs-limit off", "off", &[("limit_smc_hs", 0)]),
                    smc("smc-hs-on", "SMC hs-limit on", "on", &[("limit_smc_hs", 1)]),
                ],
                points: crr_points(pick(depth, vec![8, 64, 512, 2048], vec![8, 512], vec![8])),
                max_time: None,
            },
            TablePlan {
                id: "crr/events".into(),
                title: "crr from event loops (smc-perf --events: one epoll loop each side); conn/s by concurrency"
                    .into(),
                mirrors: "wrk -c N -H 'Connection: close' against nginx (short-lived series, -c 10000)"
                    .into(),
                test: Test::Crr,
                primary: "conns_per_s",
                shown: vec!["conns_per_s", "smc_share"],
                higher_is_better: true,
                variants: vec![
                    tcp().events(),
                    smc("smc-ev-hs-off", "SMC hs-limit off", "off", &[("limit_smc_hs", 0)]).events(),
                    smc("smc-ev-hs-on", "SMC hs-limit on", "on", &[("limit_smc_hs", 1)]).events(),
                ],
                points: crr_points(pick(depth, vec![8, 512, 2048, 10_000], vec![8, 2048], vec![8])),
                max_time: None,
            },
        ],
        "ablation" => vec![
            TablePlan {
                id: "ablation/autocork".into(),
                title: "ablation: autocorking off/on, small-message stream, MB/s".into(),
                mirrors: "autocorking patch (net/smc: add autocorking support, 2022), qperf tcp_bw"
                    .into(),
                test: Test::Bw,
                primary: "mbps",
                shown: vec!["mbps"],
                higher_is_better: true,
                variants: vec![
                    tcp(),
                    smc("smc-cork-off", "SMC cork off", "off", &[("autocorking_size", 0)]),
                    smc("smc-cork-on", "SMC cork on", "on", &[("autocorking_size", 65536)]),
                ],
                points: sizes(pick(depth, doubling(1, 256), vec![1, 16, 256], vec![16])),
                max_time: None,
            },
            TablePlan {
                id: "ablation/wnd".into(),
                title: "ablation: window-update rule min() (old) vs max() (2022 fix), MB/s".into(),
                mirrors:
                    "net/smc: correct settings of RMB window update limit (2022), qperf tcp_bw"
                        .into(),
                test: Test::Bw,
                primary: "mbps",
                shown: vec!["mbps"],
                higher_is_better: true,
                variants: vec![
                    tcp(),
                    smc("smc-wnd-min", "SMC min() rule", "min", &[("wnd_update_rule", 1)]),
                    smc("smc-wnd-max", "SMC max() rule", "max", &[("wnd_update_rule", 0)]),
                ],
                points: sizes(pick(
                    depth,
                    doubling(KIB, 16 * KIB),
                    vec![2 * KIB, 8 * KIB],
                    vec![4 * KIB],
                )),
                max_time: None,
            },
            TablePlan {
                id: "ablation/tx_chunk-bw".into(),
                title: "ablation: engine pipeline chunk tx_chunk 0 vs 8192, stream MB/s".into(),
                mirrors: "engine only (autosplit's idea at shared-memory granularity)".into(),
                test: Test::Bw,
                primary: "mbps",
                shown: vec!["mbps"],
                higher_is_better: true,
                variants: vec![
                    tcp(),
                    smc("smc-chunk-0", "SMC tx_chunk=0", "0", &[("tx_chunk", 0)]),
                    smc("smc-chunk-8k", "SMC tx_chunk=8192", "8k", &[("tx_chunk", 8192)]),
                ],
                points: sizes(pick(
                    depth,
                    vec![16 * KIB, 64 * KIB],
                    vec![64 * KIB],
                    vec![64 * KIB],
                )),
                max_time: None,
            },
            TablePlan {
                id: "ablation/tx_chunk-lat".into(),
                title: "ablation: engine pipeline chunk tx_chunk 0 vs 8192, ping-pong µs".into(),
                mirrors: "engine only (autosplit's idea at shared-memory granularity)".into(),
                test: Test::Lat,
                primary: "lat_us_p50",
                shown: lat_shown,
                higher_is_better: false,
                variants: vec![
                    tcp(),
                    smc("smc-chunk-0", "SMC tx_chunk=0", "0", &[("tx_chunk", 0)]),
                    smc("smc-chunk-8k", "SMC tx_chunk=8192", "8k", &[("tx_chunk", 8192)]),
                ],
                points: sizes(pick(
                    depth,
                    vec![256 * KIB, 1024 * KIB],
                    vec![256 * KIB],
                    vec![256 * KIB],
                )),
                max_time: None,
            },
        ],
        "smcr" => vec![
            TablePlan {
                id: "smcr/bw".into(),
                title: "smcr: one-way stream between two namespaces over a veth, MB/s".into(),
                mirrors: "qperf tcp_bw over RoCE (SMC-R), soft RoCEv2 device".into(),
                test: Test::Bw,
                primary: "mbps",
                shown: vec!["mbps"],
                higher_is_better: true,
                variants: vec![tcp_veth(), smcr("smcr", "SMC-R", "SMC-R", &[])],
                points: sizes(pick(
                    depth,
                    vec![64, KIB, 16 * KIB, 64 * KIB],
                    vec![KIB, 64 * KIB],
                    vec![64 * KIB],
                )),
                max_time: None,
            },
            TablePlan {
                id: "smcr/lat".into(),
                title: "smcr: ping-pong between two namespaces over a veth, one-way µs (mean / p50 / p99)"
                    .into(),
                mirrors: "qperf tcp_lat over RoCE (SMC-R), soft RoCEv2 device".into(),
                test: Test::Lat,
                primary: "lat_us_p50",
                shown: lat_shown.clone(),
                higher_is_better: false,
                variants: vec![tcp_veth(), smcr("smcr", "SMC-R", "SMC-R", &[])],
                points: sizes(pick(
                    depth,
                    vec![1, 64, KIB, 16 * KIB],
                    vec![64, KIB],
                    vec![64],
                )),
                max_time: None,
            },
            TablePlan {
                id: "smcr/autocork".into(),
                title: "smcr: autocorking off/on, small-message stream over RoCEv2, MB/s".into(),
                mirrors: "autocorking patch (every CDC is a work request on SMC-R), qperf tcp_bw"
                    .into(),
                test: Test::Bw,
                primary: "mbps",
                shown: vec!["mbps"],
                higher_is_better: true,
                variants: vec![
                    tcp_veth(),
                    smcr("smcr-cork-off", "SMC-R cork off", "off", &[("autocorking_size", 0)]),
                    smcr("smcr-cork-on", "SMC-R cork on", "on", &[("autocorking_size", 65536)]),
                ],
                points: sizes(pick(depth, vec![1, 16, 256], vec![16, 256], vec![16])),
                max_time: None,
            },
            TablePlan {
                id: "smcr/inline".into(),
                title: "smcr: inline sends off/on, small-message ping-pong over RoCEv2, one-way µs"
                    .into(),
                mirrors: "send and write inline optimization (CDCs and small RDMA WRITEs inline)"
                    .into(),
                test: Test::Lat,
                primary: "lat_us_p50",
                shown: lat_shown.clone(),
                higher_is_better: false,
                variants: vec![
                    tcp_veth(),
                    smcr("smcr-inline-off", "SMC-R inline off", "off", &[("inline", 0)]),
                    smcr("smcr-inline-on", "SMC-R inline on", "on", &[("inline", 1)]),
                ],
                points: sizes(pick(depth, vec![1, 64, KIB], vec![1, 64], vec![64])),
                max_time: None,
            },
            TablePlan {
                id: "smcr/autosplit".into(),
                title: "smcr: large-message ping-pong over RoCEv2, autosplit off/on, one-way µs, 512 KiB RMB"
                    .into(),
                mirrors: "sockperf ping-pong, autosplit patch (Jul 2024), over SMC-R".into(),
                test: Test::Lat,
                primary: "lat_us_p50",
                shown: lat_shown.clone(),
                higher_is_better: false,
                variants: vec![
                    tcp_veth(),
                    smcr(
                        "smcr-split-off",
                        "SMC-R split off",
                        "off",
                        &[("rmem", 512 * KIB as u64), ("autosplit_size", 536_870_912)],
                    ),
                    smcr(
                        "smcr-split-on",
                        "SMC-R split on",
                        "on",
                        &[("rmem", 512 * KIB as u64), ("autosplit_size", 131_072)],
                    ),
                ],
                points: sizes(pick(
                    depth,
                    vec![128 * KIB, 1024 * KIB],
                    vec![256 * KIB],
                    vec![256 * KIB],
                )),
                max_time: None,
            },
        ],
        "smcr-lgr" => vec![TablePlan {
            id: "smcr-lgr/crr".into(),
            title: "smcr-lgr: crr to peer A, alone and while peer B is driven from the same process, conn/s \
                    (SMC-R+lock: one lock held across every connect, the kernel's serialisation, as a control)"
                .into(),
            mirrors: "the lgr-pending lock series (smc_client_lgr_pending / smc_server_lgr_pending)"
                .into(),
            test: Test::Crr,
            primary: "conns_per_s_a",
            shown: vec!["conns_per_s_a", "conns_per_s_b", "setup_ms_a", "lgrs_a"],
            higher_is_better: true,
            variants: vec![
                tcp_fan(),
                smcr_fan("smcr-fan", "SMC-R", "SMC-R", &[]),
                Variant {
                    setup_lock: true,
                    ..smcr_fan("smcr-fan-lock", "SMC-R+lock", "lock", &[])
                },
            ],
            points: fan_points(8),
            max_time: None,
        }],
        _ => return None,
    };
    Some(SuitePlan {
        name: SUITES.iter().find(|&&s| s == name)?,
        tables,
    })
}

/// The sysctls the bench touches and smcd's documented defaults for them. Every SMC run sets
/// each of them to its variant's value or smcd's default (read with `smcctl --json sysctl
/// show`; these values only when that fails), so no run inherits the previous one's.
pub const TOUCHED_DEFAULTS: [(&str, u64); 7] = [
    ("autocorking_size", 65536),
    ("wmem", 65536),
    ("rmem", 65536),
    ("limit_smc_hs", 0),
    ("autosplit_size", 131_072),
    ("wnd_update_rule", 0),
    ("tx_chunk", 8192),
];

/// A human size: `1 B`, `64 KiB`, `1 MiB`.
pub fn human_size(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The settings an SMC-R variant may name: what `smc-perf --smcr-set` takes (they go to
    /// the two endpoints, not to smcd).
    const SMCR_SETTINGS: [&str; 6] = [
        "autocorking_size",
        "autosplit_size",
        "tx_chunk",
        "rmem",
        "inline",
        "smcr_max_conns_per_lgr",
    ];

    #[test]
    fn every_table_starts_with_tcp_and_has_smc() {
        for depth in [Depth::Full, Depth::Quick, Depth::Smoke] {
            for name in SUITES {
                let s = suite(name, depth).expect("known suite");
                for t in &s.tables {
                    let base = &t.variants[0];
                    assert!(base.name.starts_with("tcp") && !base.smc, "{}", t.id);
                    assert!(t.variants[1..].iter().all(|v| v.smc), "{}", t.id);
                    // TCP runs where the SMC variants do: on the veth beside SMC-R, between
                    // the three namespaces beside SMC-R there.
                    assert!(t.variants.iter().all(|v| v.veth == base.veth), "{}", t.id);
                    assert!(t.variants.iter().all(|v| v.fan == base.fan), "{}", t.id);
                    assert_eq!(
                        base.fan,
                        t.points.iter().all(|p| p.scenario.is_some()),
                        "{}: scenarios where the variants are fan variants",
                        t.id
                    );
                    assert!(!t.points.is_empty(), "{}", t.id);
                    for v in &t.variants {
                        for (k, _) in &v.settings {
                            if v.smcr {
                                assert!(SMCR_SETTINGS.contains(&k.as_str()), "{k}: no --smcr-set");
                                continue;
                            }
                            assert!(
                                TOUCHED_DEFAULTS.iter().any(|(d, _)| d == k),
                                "{k} missing from TOUCHED_DEFAULTS"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_lgr_pending_suite_pairs_a_alone_with_a_beside_b() {
        assert!(SUITES.contains(&"smcr-lgr"));
        assert!(needs_root("smcr-lgr") && needs_root("smcr") && !needs_root("crr"));
        for depth in [Depth::Full, Depth::Quick, Depth::Smoke] {
            let s = suite("smcr-lgr", depth).expect("smcr-lgr");
            for t in &s.tables {
                assert_eq!(t.test, Test::Crr, "{}", t.id);
                assert!(FAN_METRICS.contains(&t.primary), "{}", t.id);
                assert!(t.shown.iter().all(|m| FAN_METRICS.contains(m)), "{}", t.id);
                assert!(
                    t.variants.iter().any(|v| v.smcr),
                    "{}: SMC-R beside TCP",
                    t.id
                );
                // The control: what the table shows with a lock across setup.
                assert!(
                    t.variants.iter().any(|v| v.smcr && v.setup_lock),
                    "{}: a locked control",
                    t.id
                );
                let sc: Vec<Scenario> = t.points.iter().filter_map(|p| p.scenario).collect();
                // Every ratio the table prints has both of its points, B slow or not.
                for slow_b in [false, true] {
                    for with_b in [false, true] {
                        assert!(sc.contains(&Scenario { with_b, slow_b }), "{}", t.id);
                    }
                }
                let ids: std::collections::BTreeSet<_> = sc.iter().map(|s| s.names().0).collect();
                assert_eq!(ids.len(), sc.len(), "{}: point ids unique", t.id);
            }
        }
    }

    #[test]
    fn full_sizes_double_from_1_to_64k() {
        let s = suite("bw", Depth::Full).expect("bw");
        let sizes: Vec<_> = s.tables[0].points.iter().map(|p| p.msg_size).collect();
        assert_eq!(sizes.len(), 17);
        assert_eq!((sizes[0], sizes[16]), (1, 65536));
        assert_eq!(human_size(65536), "64 KiB");
        assert_eq!(human_size(1 << 20), "1 MiB");
        assert_eq!(human_size(3), "3 B");
    }
}
