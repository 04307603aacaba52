//! Tunables with the kernel's names and defaults (`net/smc/smc_sysctl.c`, facts §5) plus the
//! engine's own. A connection takes a snapshot when it is created, as the kernel copies sysctl
//! values into a new socket; the control plane (`smcd`) makes them per namespace and settable.

use smc_core::window::WndUpdateRule;
use std::time::Duration;

/// Settings that shape new connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `net.smc.autocorking_size`: autocork threshold in bytes (0 disables).
    pub autocorking_size: u32,
    /// `net.smc.wmem`: initial send buffer size.
    pub wmem: u32,
    /// `net.smc.rmem`: initial receive buffer (DMB) size.
    pub rmem: u32,
    /// `net.smc.smcr_max_conns_per_lgr`: connections per link group (also used for the
    /// loopback device's link groups).
    pub max_conns_per_lgr: u32,
    /// `net.smc.limit_smc_hs`: handshake limitation for listeners created afterwards.
    pub limit_smc_hs: bool,
    /// `net.smc.autosplit_size`: cut sends of at least 4/3 of this into chunks of it.
    pub autosplit_size: u32,
    /// Engine: how long a blocking call spins before it sleeps.
    pub spin: Duration,
    /// Engine: how long an unused link group lives (server side; the client adds 10 s, as the
    /// kernel's 600 s / 610 s).
    pub lgr_idle: Duration,
    /// Engine: window-update rule (only changed to show what the 2022 fix bought).
    pub wnd_update_rule: WndUpdateRule,
    /// Engine: a long write publishes its producer cursor at least every this many bytes, so
    /// the reader copies out while the writer copies in (autosplit's idea at shared-memory
    /// granularity, where a publication costs one store). 0 keeps only the kernel's publication
    /// points (autosplit cut, full ring, end of write).
    pub tx_chunk: u32,
    /// `net.smc.smcr_buf_type` of new SMC-R link groups (0 physically, 1 virtually
    /// contiguous, 2 mixed): user-space buffers are one virtual mapping each, so this is what
    /// the group reports (`SMC_NLA_LGR_R_BUF_TYPE`), not how it allocates.
    pub smcr_buf_type: u8,
    /// `net.smc.smcr_testlink_time`: TEST_LINK after this long without a received work
    /// request (zero: never).
    pub smcr_testlink_time: Duration,
    /// `net.smc.smcr_max_links_per_lgr`: `max_links` an SMC-R endpoint offers (1 or 2,
    /// whatever its ports: with one, the second link is an asymmetric one on the same port).
    pub max_links_per_lgr: u8,
    /// `net.smc.smcr_max_send_wr`: send slots of a new SMC-R link (its QP takes three work
    /// requests a slot: a CDC and up to two RDMA WRITEs).
    pub smcr_max_send_wr: u32,
    /// `net.smc.smcr_max_recv_wr`: receive buffers posted on a new SMC-R link.
    pub smcr_max_recv_wr: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            autocorking_size: 64 * 1024,
            wmem: 64 * 1024,
            rmem: 64 * 1024,
            max_conns_per_lgr: 255,
            limit_smc_hs: false,
            autosplit_size: 128 * 1024,
            spin: Duration::from_micros(50),
            lgr_idle: Duration::from_secs(600),
            wnd_update_rule: WndUpdateRule::Max,
            tx_chunk: 8 * 1024,
            smcr_buf_type: 0,
            smcr_testlink_time: Duration::from_secs(30),
            max_links_per_lgr: 2,
            smcr_max_send_wr: 16,
            smcr_max_recv_wr: 48,
        }
    }
}

impl Settings {
    /// The DMB size for a new connection: `rmem` through the kernel's compressed sizes
    /// (`smc_compress_bufsize`, SMC-D maximum 1 MiB).
    pub fn dmb_len(&self) -> usize {
        use smc_proto::clc::{SMCD_MAX_BUFSIZE_CODE, compress_bufsize, uncompress_bufsize};
        uncompress_bufsize(compress_bufsize(self.rmem as usize, SMCD_MAX_BUFSIZE_CODE))
    }

    /// The send buffer size: `wmem` through the same sizes. With DMB no-copy the bytes are
    /// written straight into the peer's DMB, so this is not memory of its own: it bounds how
    /// many bytes a connection may have written and not yet seen consumed (the amount the
    /// kernel's send buffer holds), whichever of it and the peer's ring is smaller.
    pub fn sndbuf_len(&self) -> usize {
        use smc_proto::clc::{SMCD_MAX_BUFSIZE_CODE, compress_bufsize, uncompress_bufsize};
        uncompress_bufsize(compress_bufsize(self.wmem as usize, SMCD_MAX_BUFSIZE_CODE))
    }
}

/// How a knob's value is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A C `int` (`proc_dointvec_minmax`).
    Int,
    /// A C `unsigned int` (`proc_douintvec_minmax`).
    Uint,
    /// Seconds (the kernel keeps jiffies: `proc_dointvec_jiffies`).
    Seconds,
    /// A string.
    Str,
}

/// One knob: the kernel's name, range and default, or the engine's own.
#[derive(Debug, Clone, Copy)]
pub struct Knob {
    /// Name under `/proc/sys/net/smc` (engine knobs have no kernel counterpart).
    pub name: &'static str,
    /// Value type.
    pub kind: Kind,
    /// Smallest value.
    pub min: u64,
    /// Largest value.
    pub max: u64,
    /// Default (strings: empty).
    pub default: u64,
    /// One line of meaning.
    pub description: &'static str,
    /// Whether the kernel has it (false: the engine's own).
    pub kernel: bool,
}

const INT_MAX_HALF: u64 = (i32::MAX / 2) as u64;

/// Every knob, in the order of the values in the shared sysctl page.
pub const KNOBS: &[Knob] = &[
    Knob {
        name: "autocorking_size",
        kind: Kind::Uint,
        min: 0,
        max: u32::MAX as u64,
        default: 65536,
        description: "autocork threshold in bytes; 0 disables autocorking",
        kernel: true,
    },
    Knob {
        name: "smcr_buf_type",
        kind: Kind::Uint,
        min: 0,
        max: 2,
        default: 0,
        description: "SMC-R buffer type of new link groups: 0 physically, 1 virtually contiguous, 2 mixed (reported; user-space buffers are one virtual mapping each)",
        kernel: true,
    },
    Knob {
        name: "smcr_testlink_time",
        kind: Kind::Seconds,
        min: 0,
        max: (i32::MAX / 1000) as u64,
        default: 30,
        description: "SMC-R TEST_LINK interval in seconds for new link groups; 0 disables",
        kernel: true,
    },
    Knob {
        name: "wmem",
        kind: Kind::Int,
        min: 16384,
        max: INT_MAX_HALF,
        default: 65536,
        description: "send buffer size: bounds the bytes written and not yet consumed (with DMB no-copy they sit in the peer's DMB)",
        kernel: true,
    },
    Knob {
        name: "rmem",
        kind: Kind::Int,
        min: 16384,
        max: INT_MAX_HALF,
        default: 65536,
        description: "initial receive buffer (DMB) size, rounded up to 16 KiB..1 MiB powers of two",
        kernel: true,
    },
    Knob {
        name: "smcr_max_links_per_lgr",
        kind: Kind::Int,
        min: 1,
        max: 2,
        default: 2,
        description: "SMC-R links per link group an endpoint offers (no more than its ports)",
        kernel: true,
    },
    Knob {
        name: "smcr_max_conns_per_lgr",
        kind: Kind::Int,
        min: 16,
        max: 255,
        default: 255,
        description: "connections per link group (SMC-R, and the loopback device's link groups)",
        kernel: true,
    },
    Knob {
        name: "smcr_max_send_wr",
        kind: Kind::Int,
        min: 2,
        max: 2048,
        default: 16,
        description: "SMC-R send slots per new link (its QP takes three work requests a slot)",
        kernel: true,
    },
    Knob {
        name: "smcr_max_recv_wr",
        kind: Kind::Int,
        min: 2,
        max: 2048,
        default: 48,
        description: "SMC-R receive buffers posted per new link",
        kernel: true,
    },
    Knob {
        name: "limit_smc_hs",
        kind: Kind::Int,
        min: 0,
        max: 1,
        default: 0,
        description: "handshake limitation for listeners created afterwards",
        kernel: true,
    },
    Knob {
        name: "hs_ctrl",
        kind: Kind::Str,
        min: 0,
        max: 16,
        default: 0,
        description: "name of a BPF handshake-control profile (not supported in user space: must stay empty)",
        kernel: true,
    },
    Knob {
        name: "autosplit_size",
        kind: Kind::Uint,
        min: 32 * 1024,
        max: 512 * 1024 * 1024,
        default: 128 * 1024,
        description: "cut sends of at least 4/3 of this into chunks of it; 536870912 disables",
        kernel: true,
    },
    Knob {
        name: "busy_poll_us",
        kind: Kind::Uint,
        min: 0,
        max: 1_000_000,
        default: 50,
        description: "engine: microseconds a blocking call spins before it sleeps",
        kernel: false,
    },
    Knob {
        name: "lgr_idle_time",
        kind: Kind::Seconds,
        min: 1,
        max: 86400,
        default: 600,
        description: "engine: seconds an unused link group lives (the client side adds 10)",
        kernel: false,
    },
    Knob {
        name: "tx_chunk",
        kind: Kind::Uint,
        min: 0,
        max: 1024 * 1024,
        default: 8192,
        description: "engine: publish the producer cursor at least every this many bytes of a write; 0 only at the kernel's points",
        kernel: false,
    },
    Knob {
        name: "wnd_update_rule",
        kind: Kind::Uint,
        min: 0,
        max: 1,
        default: 0,
        description: "engine: window-update limit, 0 max(rmb/10,2304) (current kernels), 1 min() (before the 2022 fix)",
        kernel: false,
    },
];

/// The index of knob `name` in [`KNOBS`].
pub fn knob_index(name: &str) -> Option<usize> {
    KNOBS.iter().position(|k| k.name == name)
}

/// Why a value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KnobError {
    /// No such knob.
    #[error("unknown sysctl {0}")]
    Unknown(String),
    /// Out of range.
    #[error("{name} must be between {min} and {max}")]
    Range {
        /// The knob.
        name: &'static str,
        /// Smallest allowed.
        min: u64,
        /// Largest allowed.
        max: u64,
    },
    /// `tx_chunk` must be 0 or at least 4096.
    #[error("tx_chunk must be 0 or between 4096 and 1048576")]
    TxChunk,
    /// A string knob that this implementation cannot honour.
    #[error("{0} is not supported here (no BPF in user space); it must stay empty")]
    Unsupported(&'static str),
}

impl Knob {
    /// Checks a numeric value against the knob's range.
    pub fn check(&self, v: u64) -> Result<u64, KnobError> {
        if v < self.min || v > self.max {
            return Err(KnobError::Range {
                name: self.name,
                min: self.min,
                max: self.max,
            });
        }
        if self.name == "tx_chunk" && v != 0 && v < 4096 {
            return Err(KnobError::TxChunk);
        }
        Ok(v)
    }
}

impl Settings {
    /// The settings a value vector (in [`KNOBS`] order) describes; missing or bad values keep
    /// the default (the vector comes from shared memory).
    pub fn from_values(values: &[u64]) -> Settings {
        let get = |name: &str| {
            let i = knob_index(name).expect("known knob");
            let k = &KNOBS[i];
            values
                .get(i)
                .copied()
                .filter(|v| k.check(*v).is_ok())
                .unwrap_or(k.default)
        };
        Settings {
            autocorking_size: get("autocorking_size") as u32,
            wmem: get("wmem") as u32,
            rmem: get("rmem") as u32,
            max_conns_per_lgr: get("smcr_max_conns_per_lgr") as u32,
            limit_smc_hs: get("limit_smc_hs") != 0,
            autosplit_size: get("autosplit_size") as u32,
            spin: Duration::from_micros(get("busy_poll_us")),
            lgr_idle: Duration::from_secs(get("lgr_idle_time")),
            wnd_update_rule: if get("wnd_update_rule") == 1 {
                WndUpdateRule::Min
            } else {
                WndUpdateRule::Max
            },
            tx_chunk: get("tx_chunk") as u32,
            smcr_buf_type: get("smcr_buf_type") as u8,
            smcr_testlink_time: Duration::from_secs(get("smcr_testlink_time")),
            max_links_per_lgr: get("smcr_max_links_per_lgr") as u8,
            smcr_max_send_wr: get("smcr_max_send_wr") as u32,
            smcr_max_recv_wr: get("smcr_max_recv_wr") as u32,
        }
    }

    /// The default value vector.
    pub fn default_values() -> Vec<u64> {
        KNOBS.iter().map(|k| k.default).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_agree() {
        assert_eq!(
            Settings::from_values(&Settings::default_values()),
            Settings::default()
        );
        assert_eq!(Settings::from_values(&[]), Settings::default());
    }

    #[test]
    fn ranges_as_the_kernel() {
        let rmem = &KNOBS[knob_index("rmem").unwrap()];
        assert!(rmem.check(16383).is_err());
        assert!(rmem.check(16384).is_ok());
        let c = &KNOBS[knob_index("smcr_max_conns_per_lgr").unwrap()];
        assert_eq!(
            c.check(15).unwrap_err().to_string(),
            "smcr_max_conns_per_lgr must be between 16 and 255"
        );
        let t = &KNOBS[knob_index("tx_chunk").unwrap()];
        assert!(t.check(0).is_ok() && t.check(100).is_err() && t.check(4096).is_ok());
        let mut v = Settings::default_values();
        v[knob_index("rmem").unwrap()] = 5; // out of range in shared memory: default kept
        assert_eq!(Settings::from_values(&v).rmem, 65536);
    }

    #[test]
    fn dmb_sizes_follow_rmem() {
        let mut s = Settings::default();
        for (rmem, dmb) in [
            (16384, 16384),
            (65536, 65536),
            (65537, 131072),
            (512 * 1024, 512 * 1024),
            (1 << 30, 1 << 20),
        ] {
            s.rmem = rmem;
            assert_eq!(s.dmb_len(), dmb, "rmem {rmem}");
        }
    }
}
