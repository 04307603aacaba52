//! Settings and counters through `smcctl`, exactly as an operator changes and reads them:
//! `smcctl --socket SOCK sysctl set KEY=VALUE` and `smcctl --socket SOCK --json stats`.

use super::perf::{Env, last_lines, run_captured};
use super::plan::TOUCHED_DEFAULTS;
use super::report;
use anyhow::{Context, bail};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Whether a variant's settings were in effect.
#[derive(Debug, Clone)]
pub(super) struct Applied {
    pub(super) ok: bool,
    pub(super) note: Option<String>,
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
pub(super) struct Control {
    smcctl: PathBuf,
    sock: PathBuf,
    /// smcd's values of the touched sysctls.
    pub(super) current: BTreeMap<String, u64>,
    /// smcd's defaults of the touched sysctls: what a variant that does not name one runs with.
    pub(super) defaults: BTreeMap<String, u64>,
    /// Where `current` and `defaults` came from.
    pub(super) defaults_source: String,
    /// `key=value` that failed to set, with the reason (not retried).
    failed: BTreeMap<String, String>,
    warned: BTreeSet<String>,
    stats_warned: bool,
    /// Set when smcctl found smcd not answering: no further calls.
    unreachable: Option<String>,
}

impl Control {
    /// Reads smcd's values and defaults of the touched sysctls (`smcctl --json sysctl show`);
    /// if that fails, assumes a fresh smcd with the documented defaults.
    pub(super) fn new(env: &Env) -> Control {
        let built_in: BTreeMap<String, u64> = TOUCHED_DEFAULTS
            .iter()
            .map(|&(k, v)| (k.to_string(), v))
            .collect();
        let mut c = Control {
            smcctl: env.bin.join("smcctl"),
            sock: env.sock.clone(),
            current: built_in.clone(),
            defaults: built_in,
            defaults_source: String::new(),
            failed: BTreeMap::new(),
            warned: BTreeSet::new(),
            stats_warned: false,
            unreachable: None,
        };
        c.defaults_source = match c.read_sysctls() {
            Ok(()) => "smcd (smcctl --json sysctl show)".into(),
            Err(e) => format!("built in: smcctl --json sysctl show failed ({e:#})"),
        };
        c
    }

    /// Takes `value` and `default` of every touched sysctl from `smcctl --json sysctl show`.
    fn read_sysctls(&mut self) -> anyhow::Result<()> {
        let out = self.smcctl(&["--json", "sysctl", "show"])?;
        let v: Value = serde_json::from_str(out.trim()).context("not JSON")?;
        let list = v["sysctls"].as_array().context("no \"sysctls\" list")?;
        let mut found = 0;
        for k in list {
            let (Some(name), Some(value), Some(default)) = (
                k["name"].as_str(),
                k["value"].as_u64(),
                k["default"].as_u64(),
            ) else {
                continue;
            };
            if self.defaults.contains_key(name) {
                self.defaults.insert(name.into(), default);
                self.current.insert(name.into(), value);
                found += 1;
            }
        }
        if found < TOUCHED_DEFAULTS.len() {
            bail!(
                "only {found} of the {} sysctls the bench sets",
                TOUCHED_DEFAULTS.len()
            );
        }
        Ok(())
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
    pub(super) fn apply(&mut self, want: &[(String, u64)]) -> Applied {
        let mut notes = Vec::new();
        for (k, &default) in &self.defaults.clone() {
            let k = k.as_str();
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
    pub(super) fn stats(&mut self) -> anyhow::Result<(BTreeMap<String, f64>, Value)> {
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

    pub(super) fn summary(&self) -> String {
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
