//! `smcctl stats`: smc-tools' `stats.c` layout over `GET_STATS` and `GET_FBACK_STATS`.
//!
//! Differences from smc-tools, on purpose: `stats reset` resets the counters in smcd
//! (`SMCD_ENGINE` `STATS_RESET`, per network namespace) instead of writing a snapshot file
//! that later runs subtract, so every value shown is absolute since the last reset and `-a`
//! changes nothing; the fallback reasons are listed without `-d` too (the top three per
//! side), and `-d` lists all of them.

use std::fmt::Write;

use serde::Serialize;
use smc_proto::clc::ReasonCode;
use smc_proto::netlink::engine::{
    ENGINE_STATS_SCOPE_COUNTERS, ENGINE_STATS_SCOPE_FBACK, EngineMessage, PathCounts,
};
use smc_proto::netlink::smc::{FbackStats, RmbStats, SizeBuckets, SmcCmd, StatsReply, StatsTech};

use crate::error::Error;
use crate::fmt::{Align, abbreviate, json, percent, table_min};
use crate::session::Session;

/// Totals with their client/server split.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Split {
    /// client + server.
    pub total: u64,
    /// Client side.
    pub client: u64,
    /// Server side.
    pub server: u64,
}

/// `Connections Summary` counts.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Connections {
    /// SMC connections + handshake errors + fallbacks.
    pub total_handled: u64,
    /// Successful SMC connections.
    pub smc: Split,
    /// Of those, SMCv1.
    pub v1: u64,
    /// Of those, SMCv2.
    pub v2: u64,
}

/// One fallback reason and how often it occurred.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Reason {
    /// The `SMC_CLC_DECL_*` code.
    pub code: u32,
    /// smc-tools' name (`PEER_NO_SMC`), or the code as `0x%08x` when it has none.
    pub name: String,
    /// Occurrences.
    pub count: u64,
}

/// TCP fallbacks.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Fallback {
    /// Totals.
    #[serde(flatten)]
    pub counts: Split,
    /// Server-side reasons, most frequent first.
    pub server_reasons: Vec<Reason>,
    /// Client-side reasons, most frequent first.
    pub client_reasons: Vec<Reason>,
}

/// The nine size buckets of the kernel; the table folds the last two into `>512KB`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Buckets {
    #[serde(rename = "8K")]
    k8: u64,
    #[serde(rename = "16K")]
    k16: u64,
    #[serde(rename = "32K")]
    k32: u64,
    #[serde(rename = "64K")]
    k64: u64,
    #[serde(rename = "128K")]
    k128: u64,
    #[serde(rename = "256K")]
    k256: u64,
    #[serde(rename = "512K")]
    k512: u64,
    #[serde(rename = "1024K")]
    k1024: u64,
    #[serde(rename = ">1024K")]
    over_1024k: u64,
}

impl Buckets {
    fn from(b: &SizeBuckets) -> Self {
        let b = b.0;
        Buckets {
            k8: b[0],
            k16: b[1],
            k32: b[2],
            k64: b[3],
            k128: b[4],
            k256: b[5],
            k512: b[6],
            k1024: b[7],
            over_1024k: b[8],
        }
    }

    /// The eight table columns: 8KB .. 512KB, and `>512KB` = 1024K + >1024K.
    fn columns(&self) -> [u64; 8] {
        [
            self.k8,
            self.k16,
            self.k32,
            self.k64,
            self.k128,
            self.k256,
            self.k512,
            self.k1024.saturating_add(self.over_1024k),
        ]
    }
}

/// One direction (`RX Stats` / `TX Stats`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Direction {
    /// Bytes moved.
    pub bytes: u64,
    /// recv/send calls.
    pub requests: u64,
    /// Bytes of buffers in use (newer kernels report it; `null` otherwise).
    pub buffer_usage: Option<u64>,
    /// Own buffer full.
    pub buffer_full: u64,
    /// ... in % of the requests.
    pub buffer_full_pct: f64,
    /// Peer buffer full.
    pub buffer_full_remote: u64,
    /// ... in %.
    pub buffer_full_remote_pct: f64,
    /// Own buffer too small.
    pub buffer_too_small: u64,
    /// ... in %.
    pub buffer_too_small_pct: f64,
    /// Peer buffer too small.
    pub buffer_too_small_remote: u64,
    /// ... in %.
    pub buffer_too_small_remote_pct: f64,
    /// Downgraded buffer allocations.
    pub buffer_downgrades: u64,
    /// Reused buffers.
    pub buffer_reuses: u64,
    /// Allocated buffers.
    pub buffer_allocs: u64,
    /// Buffers by size.
    pub buffer_sizes: Buckets,
    /// Requests by size.
    pub request_sizes: Buckets,
}

impl Direction {
    fn from(
        bytes: u64,
        requests: u64,
        usage: Option<u64>,
        rmb: &RmbStats,
        bufs: &SizeBuckets,
        reqs: &SizeBuckets,
    ) -> Self {
        Direction {
            bytes,
            requests,
            buffer_usage: usage,
            buffer_full: rmb.full_cnt,
            buffer_full_pct: percent(rmb.full_cnt, requests),
            buffer_full_remote: rmb.full_peer_cnt,
            buffer_full_remote_pct: percent(rmb.full_peer_cnt, requests),
            buffer_too_small: rmb.size_sm_cnt,
            buffer_too_small_pct: percent(rmb.size_sm_cnt, requests),
            buffer_too_small_remote: rmb.size_sm_peer_cnt,
            buffer_too_small_remote_pct: percent(rmb.size_sm_peer_cnt, requests),
            buffer_downgrades: rmb.dgrade_cnt,
            buffer_reuses: rmb.reuse_cnt,
            buffer_allocs: rmb.alloc_cnt,
            buffer_sizes: Buckets::from(bufs),
            request_sizes: Buckets::from(reqs),
        }
    }
}

/// `Extras`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Extras {
    /// Sum of the five below.
    pub special_socket_calls: u64,
    /// TCP_CORK uses.
    pub cork: u64,
    /// TCP_NODELAY uses.
    pub nodelay: u64,
    /// sendpage calls.
    pub sendpage: u64,
    /// splice calls.
    pub splice: u64,
    /// Urgent data sends.
    pub urgent_data: u64,
}

/// `--json` of `stats`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Stats {
    /// `"smcd"` or `"smcr"`.
    pub technology: &'static str,
    /// Connections Summary.
    pub connections: Connections,
    /// Handshake errors.
    pub handshake_errors: Split,
    /// (RX + TX requests) / SMC connections.
    pub avg_requests_per_conn: f64,
    /// TCP fallbacks and their reasons.
    pub fallback: Fallback,
    /// RX Stats.
    pub rx: Direction,
    /// TX Stats.
    pub tx: Direction,
    /// Extras.
    pub extras: Extras,
    /// Connections by how they learned that the peer speaks SMC (smcd only: `null` with
    /// `--kernel` or from an smcd that does not count them).
    pub capability_path: Option<CapabilityPath>,
}

/// Connections by capability path: the SMC TCP option (BPF) or smcd's intents (its listener
/// table and connect intents). Every SMC connection and every fallback decided by either is
/// counted once on its side.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct CapabilityPath {
    /// Decided by the SMC TCP option.
    pub option: Split,
    /// Decided by smcd's listener table or an intent.
    pub intents: Split,
}

impl CapabilityPath {
    fn from(c: &PathCounts) -> Self {
        let split = |client: u64, server: u64| Split {
            total: client.saturating_add(server),
            client,
            server,
        };
        CapabilityPath {
            option: split(c.option_client, c.option_server),
            intents: split(c.intent_client, c.intent_server),
        }
    }
}

fn reasons(slots: &[&FbackStats]) -> Vec<Reason> {
    let mut v: Vec<Reason> = slots
        .iter()
        .filter(|f| f.rsn_code != 0)
        .map(|f| Reason {
            code: f.rsn_code,
            name: ReasonCode(f.rsn_code)
                .smc_tools_name()
                .map_or_else(|| format!("0x{:08x}", f.rsn_code), str::to_owned),
            count: f.rsn_cnt.into(),
        })
        .collect();
    // Most frequent first; equal counts keep the kernel's slot order (stable sort).
    v.sort_by_key(|r| std::cmp::Reverse(r.count));
    v
}

/// Counters added up; a sum past `u64::MAX` (counters come from engines smcd does not
/// trust) stays there instead of wrapping to a small number.
fn sum(v: &[u64]) -> u64 {
    v.iter().fold(0u64, |a, &b| a.saturating_add(b))
}

impl Stats {
    /// Builds the view of one technology from the replies.
    pub fn build(reply: &StatsReply, fback: &[FbackStats], smcr: bool) -> Self {
        let t: &StatsTech = if smcr { &reply.smcr } else { &reply.smcd };
        let client = sum(&[t.clnt_v1_succ, t.clnt_v2_succ]);
        let server = sum(&[t.srv_v1_succ, t.srv_v2_succ]);
        let smc = client.saturating_add(server);
        let hs = Split {
            total: reply.clnt_hs_err_cnt.saturating_add(reply.srv_hs_err_cnt),
            client: reply.clnt_hs_err_cnt,
            server: reply.srv_hs_err_cnt,
        };
        // Only the first message of a dump carries the totals.
        let srv_fb = fback.iter().find_map(|f| f.srv_cnt).unwrap_or(0);
        let clnt_fb = fback.iter().find_map(|f| f.clnt_cnt).unwrap_or(0);
        let server_slots: Vec<&FbackStats> = fback.iter().filter(|f| f.is_server).collect();
        let client_slots: Vec<&FbackStats> = fback.iter().filter(|f| !f.is_server).collect();
        let fallback = Fallback {
            counts: Split {
                total: srv_fb.saturating_add(clnt_fb),
                client: clnt_fb,
                server: srv_fb,
            },
            server_reasons: reasons(&server_slots),
            client_reasons: reasons(&client_slots),
        };
        let requests = t.rx_cnt.saturating_add(t.tx_cnt);
        Stats {
            technology: if smcr { "smcr" } else { "smcd" },
            connections: Connections {
                total_handled: sum(&[smc, hs.total, fallback.counts.total]),
                smc: Split {
                    total: smc,
                    client,
                    server,
                },
                v1: t.clnt_v1_succ.saturating_add(t.srv_v1_succ),
                v2: t.clnt_v2_succ.saturating_add(t.srv_v2_succ),
            },
            handshake_errors: hs,
            avg_requests_per_conn: if smc == 0 {
                0.0
            } else {
                requests as f64 / smc as f64
            },
            fallback,
            rx: Direction::from(
                t.rx_bytes,
                t.rx_cnt,
                t.rx_rmb_usage,
                &t.rx_rmb_stats,
                &t.rx_rmb_size,
                &t.rx_pload,
            ),
            tx: Direction::from(
                t.tx_bytes,
                t.tx_cnt,
                t.tx_rmb_usage,
                &t.tx_rmb_stats,
                &t.tx_rmb_size,
                &t.tx_pload,
            ),
            extras: Extras {
                special_socket_calls: sum(&[
                    t.cork_cnt,
                    t.ndly_cnt,
                    t.sendpage_cnt,
                    t.splice_cnt,
                    t.urg_data_cnt,
                ]),
                cork: t.cork_cnt,
                nodelay: t.ndly_cnt,
                sendpage: t.sendpage_cnt,
                splice: t.splice_cnt,
                urgent_data: t.urg_data_cnt,
            },
            capability_path: None,
        }
    }

    /// smc-tools' report. `details`: client/server splits, v1/v2, every fallback reason,
    /// buffer downgrades and reuses, the special socket calls one by one.
    pub fn text(&self, details: u8) -> String {
        let d = details > 0;
        let mut s = String::new();
        let w = &mut s;
        let tech = if self.technology == "smcr" {
            "SMC-R"
        } else {
            "SMC-D"
        };
        let c = &self.connections;
        let _ = writeln!(w, "{tech} Connections Summary");
        let _ = writeln!(w, "  Total connections handled  {:>12}", c.total_handled);
        if d {
            let _ = writeln!(
                w,
                "  SMC connections            {:>12} (client {}, server {})",
                c.smc.total, c.smc.client, c.smc.server
            );
            let _ = writeln!(w, "    v1                       {:>12}", c.v1);
            let _ = writeln!(w, "    v2                       {:>12}", c.v2);
            let h = &self.handshake_errors;
            let _ = writeln!(
                w,
                "  Handshake errors           {:>12} (client {}, server {})",
                h.total, h.client, h.server
            );
        } else {
            let _ = writeln!(w, "  SMC connections            {:>12}", c.smc.total);
            let _ = writeln!(
                w,
                "  Handshake errors           {:>12}",
                self.handshake_errors.total
            );
        }
        let _ = writeln!(
            w,
            "  Avg requests per SMC conn  {:>14.1}",
            self.avg_requests_per_conn
        );
        let f = &self.fallback;
        if d {
            let _ = writeln!(
                w,
                "  TCP fallback               {:>12} (client {}, server {})",
                f.counts.total, f.counts.client, f.counts.server
            );
        } else {
            let _ = writeln!(w, "  TCP fallback               {:>12}", f.counts.total);
        }
        let limit = if d { usize::MAX } else { 3 };
        for (label, list) in [("Server", &f.server_reasons), ("Client", &f.client_reasons)] {
            if list.is_empty() {
                continue;
            }
            let _ = writeln!(w, "    {label}");
            for r in list.iter().take(limit) {
                let _ = writeln!(w, "     {:<12}            {:>12}", r.name, r.count);
            }
        }
        let _ = writeln!(w);
        direction_text(w, "RX Stats", &self.rx, false, d);
        let _ = writeln!(w);
        direction_text(w, "TX Stats", &self.tx, true, d);
        let _ = writeln!(w);
        let e = &self.extras;
        let _ = writeln!(w, "Extras");
        let _ = writeln!(
            w,
            "  Special socket calls       {:>12}",
            e.special_socket_calls
        );
        if d {
            let _ = writeln!(w, "    cork                     {:>12}", e.cork);
            let _ = writeln!(w, "    nodelay                  {:>12}", e.nodelay);
            let _ = writeln!(w, "    sendpage                 {:>12}", e.sendpage);
            let _ = writeln!(w, "    splice                   {:>12}", e.splice);
            let _ = writeln!(w, "    urgent data              {:>12}", e.urgent_data);
        }
        if d && let Some(p) = &self.capability_path {
            let _ = writeln!(w);
            let _ = writeln!(w, "Capability Path");
            for (label, x) in [("TCP option", &p.option), ("Intents", &p.intents)] {
                let _ = writeln!(
                    w,
                    "  {label:<27}{:>12} (client {}, server {})",
                    x.total, x.client, x.server
                );
            }
        }
        s
    }
}

fn direction_text(w: &mut String, title: &str, x: &Direction, tx: bool, d: bool) {
    let _ = writeln!(w, "{title}");
    let _ = writeln!(
        w,
        "  Data transmitted (Bytes) {:>14} ({})",
        x.bytes,
        abbreviate(x.bytes)
    );
    let _ = writeln!(w, "  Total requests             {:>12}", x.requests);
    if let Some(u) = x.buffer_usage {
        let _ = writeln!(
            w,
            "  Buffer usage   (Bytes)   {:>14} ({})",
            u,
            abbreviate(u)
        );
    }
    let _ = writeln!(
        w,
        "  Buffer full                {:>12} ({:.2}%)",
        x.buffer_full, x.buffer_full_pct
    );
    if tx {
        let _ = writeln!(
            w,
            "  Buffer full (remote)       {:>12} ({:.2}%)",
            x.buffer_full_remote, x.buffer_full_remote_pct
        );
        let _ = writeln!(
            w,
            "  Buffer too small           {:>12} ({:.2}%)",
            x.buffer_too_small, x.buffer_too_small_pct
        );
        let _ = writeln!(
            w,
            "  Buffer too small (remote)  {:>12} ({:.2}%)",
            x.buffer_too_small_remote, x.buffer_too_small_remote_pct
        );
    }
    if d {
        let _ = writeln!(
            w,
            "  Buffer downgrades          {:>12}",
            x.buffer_downgrades
        );
        let _ = writeln!(w, "  Buffer reuses              {:>12}", x.buffer_reuses);
    }
    let row = |label: &str, b: &Buckets| -> Vec<String> {
        std::iter::once(label.to_owned())
            .chain(b.columns().iter().map(|v| abbreviate(*v)))
            .collect()
    };
    let t = table_min(
        &[
            ("", Align::Left),
            ("8KB", Align::Right),
            ("16KB", Align::Right),
            ("32KB", Align::Right),
            ("64KB", Align::Right),
            ("128KB", Align::Right),
            ("256KB", Align::Right),
            ("512KB", Align::Right),
            (">512KB", Align::Right),
        ],
        &[row("Bufs", &x.buffer_sizes), row("Reqs", &x.request_sizes)],
        6,
    );
    for line in t.lines() {
        let _ = writeln!(w, "  {line}");
    }
}

/// Fetches and shows; with `reset`, then resets the namespace's counters (STATS_RESET).
pub fn run(s: &mut Session, smcr: bool, reset: bool) -> Result<String, Error> {
    let fback: Vec<FbackStats> = s
        .gen_dump(SmcCmd::GetFbackStats)?
        .iter()
        .filter_map(|m| m.fback_stats())
        .collect();
    let reply = s
        .gen_dump(SmcCmd::GetStats)?
        .iter()
        .find_map(|m| m.stats())
        .unwrap_or_default();
    let mut stats = Stats::build(&reply, &fback, smcr);
    if !s.kernel && !smcr {
        // Read before a reset; an older smcd without the counts leaves the block out.
        let sel = s.selector();
        stats.capability_path = s
            .engine_query(EngineMessage::info(sel.as_ref()))
            .ok()
            .and_then(|r| r.iter().find_map(EngineMessage::path_counts))
            .map(|c| CapabilityPath::from(&c));
    }
    if reset {
        let sel = s.selector();
        let msg = EngineMessage::stats_reset(
            sel.as_ref(),
            Some(ENGINE_STATS_SCOPE_COUNTERS | ENGINE_STATS_SCOPE_FBACK),
        );
        s.engine_execute(msg)
            .map_err(|f| s.refused("SMCD_ENGINE STATS_RESET", f))?;
    }
    Ok(if s.json {
        json(&stats)
    } else {
        stats.text(s.details)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::testutil::roundtrip_smc;
    use smc_proto::netlink::smc::SmcGenlMessage;

    fn sample() -> (StatsReply, Vec<FbackStats>) {
        let mut smcd = StatsTech {
            clnt_v2_succ: 3,
            srv_v2_succ: 3,
            clnt_v1_succ: 1,
            rx_bytes: 123_456_789,
            tx_bytes: 2048,
            rx_cnt: 40,
            tx_cnt: 30,
            ndly_cnt: 2,
            cork_cnt: 1,
            tx_rmb_usage: Some(65536),
            ..Default::default()
        };
        smcd.tx_rmb_stats.full_cnt = 3;
        smcd.tx_rmb_stats.full_peer_cnt = 6;
        smcd.rx_rmb_stats.full_cnt = 4;
        smcd.rx_rmb_stats.reuse_cnt = 5;
        smcd.tx_rmb_size.0 = [0, 0, 0, 7, 0, 0, 0, 1, 2];
        smcd.rx_pload.0 = [1500, 0, 0, 0, 0, 0, 0, 0, 1];
        let reply = StatsReply {
            smcd,
            clnt_hs_err_cnt: 1,
            srv_hs_err_cnt: 2,
            ..Default::default()
        };
        let mk = |server: bool, code: u32, cnt: u16, totals: bool| FbackStats {
            is_server: server,
            srv_cnt: totals.then_some(9),
            clnt_cnt: totals.then_some(4),
            rsn_code: code,
            rsn_cnt: cnt,
            other: Vec::new(),
        };
        let fback = [
            mk(true, 0x0301_0000, 5, true),
            mk(true, 0x0303_0001, 1, false),
            mk(true, 0x0307_0000, 2, false),
            mk(true, 0x0505_0505, 1, false),
            mk(false, 0x0303_0000, 4, false),
        ];
        // Through the wire, as a client sees them.
        let reply = roundtrip_smc(SmcGenlMessage::stats_reply(&reply))
            .stats()
            .unwrap();
        let fback = fback
            .iter()
            .map(|f| {
                roundtrip_smc(SmcGenlMessage::fback_stats_reply(f))
                    .fback_stats()
                    .unwrap()
            })
            .collect();
        (reply, fback)
    }

    #[test]
    fn summary_layout() {
        let (reply, fback) = sample();
        let st = Stats::build(&reply, &fback, false);
        let t = st.text(0);
        let expect_head = "SMC-D Connections Summary\n\
              \x20 Total connections handled            23\n\
              \x20 SMC connections                       7\n\
              \x20 Handshake errors                      3\n\
              \x20 Avg requests per SMC conn            10.0\n\
              \x20 TCP fallback                         13\n\
              \x20   Server\n\
              \x20    PEER_NO_SMC                        5\n\
              \x20    DIFFPREFIX                         2\n\
              \x20    NOSMCDDEV                          1\n\
              \x20   Client\n\
              \x20    NOSMCDEV                           4\n\
              \n\
              RX Stats\n\
              \x20 Data transmitted (Bytes)      123456789 (123.5M)\n\
              \x20 Total requests                       40\n\
              \x20 Buffer full                           4 (10.00%)\n";
        assert!(t.starts_with(expect_head), "{t}");
        assert!(
            t.contains(
                "           8KB    16KB    32KB    64KB   128KB   256KB   512KB  >512KB\n  \
             Bufs       0       0       0       0       0       0       0       0\n  \
             Reqs  1.500K       0       0       0       0       0       0       1\n"
            ),
            "{t}"
        );
        assert!(
            t.contains("  Buffer usage   (Bytes)            65536 (65.54K)\n"),
            "{t}"
        );
        assert!(
            t.contains("  Buffer full (remote)                  6 (20.00%)\n"),
            "{t}"
        );
        // >512KB folds the 1024K and >1024K buckets.
        assert!(
            t.contains("  Bufs       0       0       0       7       0       0       0       3\n"),
            "{t}"
        );
        assert!(
            t.ends_with("Extras\n  Special socket calls                  3\n"),
            "{t}"
        );
    }

    #[test]
    fn details_list_every_reason_and_split() {
        let (reply, fback) = sample();
        let t = Stats::build(&reply, &fback, false).text(1);
        assert!(
            t.contains("  SMC connections                       7 (client 4, server 3)\n"),
            "{t}"
        );
        assert!(t.contains("    v1                                  1\n"));
        assert!(t.contains("    v2                                  6\n"));
        assert!(t.contains("  Handshake errors                      3 (client 1, server 2)\n"));
        assert!(t.contains("  TCP fallback                         13 (client 4, server 9)\n"));
        // The fourth server reason has no smc-tools name: its code instead.
        assert!(
            t.contains("     0x05050505                         1\n"),
            "{t}"
        );
        assert!(t.contains("  Buffer reuses                         5\n"));
        assert!(t.contains("    nodelay                             2\n"));
    }

    #[test]
    fn json_schema() {
        let (reply, fback) = sample();
        let st = Stats::build(&reply, &fback, false);
        let j: serde_json::Value = serde_json::from_str(&json(&st)).unwrap();
        assert_eq!(j["technology"], "smcd");
        assert_eq!(j["connections"]["total_handled"], 23);
        assert_eq!(j["connections"]["smc"]["client"], 4);
        assert_eq!(j["handshake_errors"]["server"], 2);
        assert_eq!(j["avg_requests_per_conn"], 10.0);
        assert_eq!(j["fallback"]["total"], 13);
        assert_eq!(j["fallback"]["server_reasons"][0]["name"], "PEER_NO_SMC");
        assert_eq!(j["fallback"]["server_reasons"][0]["code"], 0x0301_0000);
        assert_eq!(j["fallback"]["server_reasons"].as_array().unwrap().len(), 4);
        assert_eq!(j["rx"]["bytes"], 123_456_789);
        assert_eq!(j["tx"]["buffer_sizes"]["1024K"], 1);
        assert_eq!(j["tx"]["buffer_sizes"][">1024K"], 2);
        assert_eq!(j["tx"]["buffer_usage"], 65536);
        assert_eq!(j["rx"]["buffer_usage"], serde_json::Value::Null);
        assert_eq!(j["extras"]["special_socket_calls"], 3);
    }

    #[test]
    fn empty_counters() {
        let st = Stats::build(&StatsReply::default(), &[], true);
        let t = st.text(0);
        assert!(t.starts_with("SMC-R Connections Summary\n"));
        assert!(t.contains("  Avg requests per SMC conn             0.0\n"));
        assert!(!t.contains("Server\n"));
    }
}
