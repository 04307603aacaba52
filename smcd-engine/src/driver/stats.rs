//! Per-connection counters with the kernel's semantics (`smc_stats.h`): one writer (the
//! connection's send or receive path, under its lock), so increments are a relaxed load and
//! store, never a locked read-modify-write on the data path.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Number of payload-size buckets (`SMC_BUF_MAX`): 8K, 16K, ... 1024K, >1024K.
pub const BUCKETS: usize = 9;

/// The bucket of a request of `len` bytes: `fls64((len - 1) >> 13)`, capped at 8.
pub fn bucket(len: u64) -> usize {
    debug_assert!(len > 0);
    let v = (len - 1) >> 13;
    let fls = (u64::BITS - v.leading_zeros()) as usize;
    fls.min(BUCKETS - 1)
}

/// Counters of one connection.
#[derive(Debug, Default)]
pub struct ConnStats {
    /// `sendmsg` calls.
    pub tx_cnt: AtomicU64,
    /// Bytes sent.
    pub tx_bytes: AtomicU64,
    /// Send requests by size bucket.
    pub tx_pd: [AtomicU64; BUCKETS],
    /// `recvmsg` calls that returned data.
    pub rx_cnt: AtomicU64,
    /// Bytes received.
    pub rx_bytes: AtomicU64,
    /// Receive returns by size bucket.
    pub rx_pd: [AtomicU64; BUCKETS],
    /// `TCP_CORK` cleared (a push).
    pub cork_cnt: AtomicU64,
    /// `TCP_NODELAY` set (a push).
    pub ndly_cnt: AtomicU64,
}

#[inline]
fn bump(c: &AtomicU64, by: u64) {
    c.store(c.load(Relaxed).wrapping_add(by), Relaxed);
}

impl ConnStats {
    /// One send of `requested` bytes that sent `sent`.
    #[inline]
    pub fn tx(&self, requested: usize, sent: usize) {
        bump(&self.tx_cnt, 1);
        if requested > 0 && sent > 0 {
            bump(&self.tx_pd[bucket(requested as u64)], 1);
            bump(&self.tx_bytes, sent as u64);
        }
    }

    /// One receive that returned `got` bytes.
    #[inline]
    pub fn rx(&self, got: usize) {
        bump(&self.rx_cnt, 1);
        if got > 0 {
            bump(&self.rx_pd[bucket(got as u64)], 1);
            bump(&self.rx_bytes, got as u64);
        }
    }

    /// `TCP_CORK` was cleared.
    pub fn cork(&self) {
        self.cork_cnt.fetch_add(1, Relaxed);
    }

    /// `TCP_NODELAY` was set.
    pub fn nodelay(&self) {
        self.ndly_cnt.fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_as_the_kernel() {
        assert_eq!(bucket(1), 0);
        assert_eq!(bucket(8192), 0);
        assert_eq!(bucket(8193), 1);
        assert_eq!(bucket(16384), 1);
        assert_eq!(bucket(16385), 2);
        assert_eq!(bucket(1 << 20), 7);
        assert_eq!(bucket((1 << 20) + 1), 8);
        assert_eq!(bucket(u64::MAX), 8);
    }

    #[test]
    fn counts_follow_the_kernel() {
        let s = ConnStats::default();
        s.tx(100, 100);
        s.tx(0, 0);
        s.rx(0);
        s.rx(20000);
        assert_eq!(s.tx_cnt.load(Relaxed), 2);
        assert_eq!(s.tx_bytes.load(Relaxed), 100);
        assert_eq!(s.tx_pd[0].load(Relaxed), 1);
        assert_eq!(s.rx_cnt.load(Relaxed), 2);
        assert_eq!(s.rx_pd[2].load(Relaxed), 1);
    }
}
