//! What the soak measures, once a second: descriptors, resident and shared memory and the
//! SMC-D buffers (`smc-dmb` memfds and mappings) of `smcd` and of the server, from `/proc`;
//! and the three dumps an operator runs (`smcctl stats`, `ss -a`, `linkgroup show`), each
//! timed from the start of the `smcctl` process to its exit.

use super::super::perf::{last_lines, run_captured};
use serde::Serialize;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// One process at one moment.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(super) struct ProcStat {
    /// Entries of `/proc/PID/fd`.
    pub(super) fds: usize,
    /// Of those, `smc-dmb` memfds, and their sizes, kB (smcd holds every DMB's memfd; an
    /// engine maps its buffers and closes the descriptors).
    pub(super) dmb_fds: usize,
    pub(super) dmb_fd_kb: u64,
    /// `smc-dmb` mappings in `/proc/PID/maps`, and the bytes they span.
    pub(super) dmb_maps: usize,
    pub(super) dmb_kb: u64,
    /// `VmRSS` and `RssShmem` of `/proc/PID/status`, kB.
    pub(super) rss_kb: u64,
    pub(super) shmem_kb: u64,
    pub(super) threads: u64,
}

impl ProcStat {
    /// Reads `/proc/PID`; `None` when the process is gone.
    pub(super) fn read(pid: u32) -> Option<ProcStat> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kb = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim_start_matches(':').split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let mut s = ProcStat {
            rss_kb: kb("VmRSS"),
            shmem_kb: kb("RssShmem"),
            threads: kb("Threads"),
            ..ProcStat::default()
        };
        for e in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
            s.fds += 1;
            if std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("smc-dmb")) {
                s.dmb_fds += 1;
                // The link's target is the memfd itself: its size is the buffer's.
                s.dmb_fd_kb += std::fs::metadata(e.path()).map_or(0, |m| m.len() / 1024);
            }
        }
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        for l in maps.lines().filter(|l| l.contains("smc-dmb")) {
            s.dmb_maps += 1;
            if let Some((a, b)) = l.split_whitespace().next().and_then(|r| r.split_once('-'))
                && let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
            {
                s.dmb_kb += b.saturating_sub(a) / 1024;
            }
        }
        Some(s)
    }

    /// Descriptors that are not SMC-D buffers (sockets, eventfds, status areas, ...).
    pub(super) fn other_fds(&self) -> usize {
        self.fds - self.dmb_fds
    }
}

/// One dump: how long `smcctl` took, and whether it answered.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Dump {
    pub(super) ms: f64,
    pub(super) ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) error: Option<String>,
}

/// Once a second during a phase.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Sample {
    /// Seconds since the phase started.
    pub(super) t: f64,
    pub(super) smcd: Option<ProcStat>,
    pub(super) server: Option<ProcStat>,
    pub(super) stats: Dump,
    pub(super) ss: Dump,
    pub(super) linkgroups: Dump,
    /// SMC-D sockets in `ss -a` and link groups in `linkgroup show`.
    pub(super) ss_smc: Option<usize>,
    pub(super) lgr_count: Option<usize>,
}

impl Sample {
    pub(super) fn dumps(&self) -> [&Dump; 3] {
        [&self.stats, &self.ss, &self.linkgroups]
    }
}

/// Runs `smcctl` the way an operator does.
pub(super) struct Dumper {
    pub(super) smcctl: PathBuf,
    pub(super) sock: PathBuf,
}

impl Dumper {
    fn run(&self, args: &[&str]) -> (Dump, Option<Value>) {
        let mut cmd = Command::new(&self.smcctl);
        cmd.arg("--socket")
            .arg(&self.sock)
            .arg("--json")
            .args(args)
            .env("SMCD_SOCKET", &self.sock);
        let t0 = Instant::now();
        let r = run_captured(&mut cmd, Duration::from_secs(30));
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let fail = |e: String| {
            (
                Dump {
                    ms,
                    ok: false,
                    error: Some(e),
                },
                None,
            )
        };
        let c = match r {
            Ok(c) => c,
            Err(e) => return fail(format!("{e:#}")),
        };
        match c.status {
            Some(st) if st.success() => {}
            Some(st) => return fail(format!("{st}: {}", last_lines(&c.stderr, 2))),
            None => return fail("timed out after 30 s".into()),
        }
        match serde_json::from_str::<Value>(c.stdout.trim()) {
            Ok(v) => (
                Dump {
                    ms,
                    ok: true,
                    error: None,
                },
                Some(v),
            ),
            Err(e) => fail(format!("not JSON: {e}")),
        }
    }

    /// One sample: /proc of both processes, then the three dumps.
    pub(super) fn sample(&self, t: f64, smcd: u32, server: u32) -> Sample {
        let (smcd_s, server_s) = (ProcStat::read(smcd), ProcStat::read(server));
        let (stats, _) = self.run(&["stats"]);
        let (ss, ss_v) = self.run(&["ss", "-a"]);
        let (linkgroups, lg_v) = self.run(&["linkgroup", "show"]);
        Sample {
            t,
            smcd: smcd_s,
            server: server_s,
            stats,
            ss,
            linkgroups,
            ss_smc: ss_v.and_then(|v| {
                Some(
                    v["sockets"]
                        .as_array()?
                        .iter()
                        .filter(|s| s["mode"] == "SMCD")
                        .count(),
                )
            }),
            lgr_count: lg_v.and_then(|v| Some(v["linkgroups"].as_array()?.len())),
        }
    }
}

/// Samples once a second on a thread until stopped.
pub(super) struct Monitor {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<Sample>>>,
}

impl Monitor {
    pub(super) fn start(dumper: Arc<Dumper>, smcd: u32, server: u32) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut out = Vec::new();
            let mut next = t0;
            while !s.load(Ordering::Relaxed) {
                let now = Instant::now();
                if now < next {
                    std::thread::sleep((next - now).min(Duration::from_millis(50)));
                    continue;
                }
                out.push(dumper.sample(t0.elapsed().as_secs_f64(), smcd, server));
                // Every second; a sample that took longer than that is followed at once.
                next += Duration::from_secs(1);
                if next < Instant::now() {
                    next = Instant::now();
                }
            }
            out
        });
        Monitor {
            stop,
            thread: Some(thread),
        }
    }

    pub(super) fn stop(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}
