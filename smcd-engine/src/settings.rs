//! Tunables with the kernel's names and defaults (`net/smc/smc_sysctl.c`, facts §5) plus the
//! engine's own. A connection takes a snapshot when it is created, as the kernel copies sysctl
//! values into a new socket; the control plane (`smcd`) makes them per namespace and settable.

use crate::core::window::WndUpdateRule;
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
}
